//! The cluster token: checked on every gRPC call (an interceptor) and on
//! every bulk connection.

use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

/// The gRPC header carrying the token.
pub const HEADER: &str = "x-ferroplasma-token";

/// Compares in time independent of where the inputs differ.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

const REFUSAL: &str =
    "wrong or missing cluster token (every member needs the same --cluster-token)";

/// True at most once every 10 s: a refusal repeated by every heartbeat is
/// logged once, not ten times a second.
pub fn quiet_period() -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    now >= last + 10
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// Refuses calls without the right token.
#[derive(Debug, Clone)]
pub struct Check(pub std::sync::Arc<str>);

impl tonic::service::Interceptor for Check {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        match req.metadata().get(HEADER) {
            Some(v) if same(v.as_bytes(), self.0.as_bytes()) => Ok(req),
            _ => {
                if !quiet_period() {
                    return Err(Status::unauthenticated(REFUSAL));
                }
                tracing::warn!(
                    peer = ?req.remote_addr(),
                    "cluster call refused: missing or wrong --cluster-token"
                );
                Err(Status::unauthenticated(REFUSAL))
            }
        }
    }
}

/// Adds the token to outgoing calls.
#[derive(Debug, Clone)]
pub struct Attach(pub MetadataValue<tonic::metadata::Ascii>);

impl tonic::service::Interceptor for Attach {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        req.metadata_mut().insert(HEADER, self.0.clone());
        Ok(req)
    }
}

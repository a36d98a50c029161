//! The cluster token: checked on every gRPC call (an interceptor) and on
//! every bulk connection; refusals are logged at most once per 10 s.

use crate::net::rate_log::RateLimited;
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

/// Refused gRPC calls: logged at most once per 10 s (every heartbeat of a
/// misconfigured member is refused, ten times a second).
static REFUSED_CALLS: RateLimited = RateLimited::new();

/// Refused bulk connections, likewise.
static REFUSED_BULK: RateLimited = RateLimited::new();

/// This member's heartbeats refused by others, likewise.
static REFUSED_HEARTBEATS: RateLimited = RateLimited::new();

/// Logs (rate-limited) a heartbeat to `member` refused for the token.
pub fn refused_heartbeat(member: &str) {
    if let Some(suppressed) = REFUSED_HEARTBEATS.admit() {
        tracing::warn!(
            member,
            suppressed,
            "heartbeat refused: the member has another --cluster-token"
        );
    }
}

/// Logs (rate-limited) a bulk connection from `peer` refused for its token.
pub fn refused_bulk(peer: Option<std::net::SocketAddr>) {
    if let Some(suppressed) = REFUSED_BULK.admit() {
        tracing::warn!(
            ?peer,
            suppressed,
            "bulk connection refused: wrong cluster token"
        );
    }
}

/// Refuses calls without the right token.
#[derive(Debug, Clone)]
pub struct Check(pub std::sync::Arc<str>);

impl tonic::service::Interceptor for Check {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        match req.metadata().get(HEADER) {
            Some(v) if same(v.as_bytes(), self.0.as_bytes()) => Ok(req),
            _ => {
                if let Some(suppressed) = REFUSED_CALLS.admit() {
                    tracing::warn!(
                        peer = ?req.remote_addr(),
                        suppressed,
                        "cluster call refused: missing or wrong --cluster-token"
                    );
                }
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

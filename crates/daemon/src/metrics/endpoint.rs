//! The HTTP endpoint: `GET /metrics` in Prometheus' text format, nothing
//! else, its connections capped and given deadlines (`ferroplasma_cluster::net::guard`).

use crate::DaemonError;
use ferroplasma_cluster::net::guard;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// Binds the metrics endpoint (a clear error when the address is taken).
pub async fn bind(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener, DaemonError> {
    tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        DaemonError::io(
            format!(
                "binding --metrics-listen {addr} (another program may use it: pick another port)"
            ),
            e,
        )
    })
}

/// How long a scraper's connection may move no byte once it has sent a
/// request (scrapers keeping it alive between scrapes connect again).
const IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves `GET /metrics` on `listener` until the store stops; any other
/// method or path gets 405 or 404. At most `cap` connections at once;
/// one that sends nothing within [`guard::HELLO`], or nothing for
/// [`IDLE`] after that, is closed.
pub async fn serve(listener: tokio::net::TcpListener, cap: usize, registry: Registry) {
    use axum::http::{header, StatusCode};
    use axum::routing::get;
    let registry = Arc::new(registry);
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    let mut body = String::new();
                    match prometheus_client::encoding::text::encode(&mut body, &registry) {
                        Ok(()) => (
                            StatusCode::OK,
                            [(
                                header::CONTENT_TYPE,
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            )],
                            body,
                        ),
                        Err(_) => (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                            "could not encode the metrics".to_string(),
                        ),
                    }
                }
            }),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "only GET /metrics is served here\n") });
    let guard = guard::Guard::new("metrics", cap, guard::HELLO, IDLE);
    if let Err(e) = axum::serve(guard.incoming(listener), app).await {
        tracing::warn!("the metrics endpoint stopped: {e}");
    }
}

//! Network concerns shared by the cluster's ports and the daemon's
//! metrics endpoint.
//!
//! - [`guard`] — the network ports' cap on connections and their deadlines
//!   (cluster gRPC, bulk, metrics).
//! - [`rate_log`] — log lines strangers can cause, at most one per 10 s.

pub mod guard;
pub mod rate_log;

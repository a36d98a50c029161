//! Talking to other members over gRPC: the channels and calls, the
//! service they call here, heartbeats, the token, retries.
//!
//! - [`client`] — channels to other members, token and deadlines attached.
//! - [`service`] — the gRPC `Peer` service other members call.
//! - [`heartbeat`] — the heartbeat/gossip loop that drives membership.
//! - [`token`] — the shared secret on every gRPC call and bulk connection.
//! - [`retry`] — pauses between retries (exponential, jittered).

pub mod client;
pub mod heartbeat;
pub mod retry;
pub mod service;
pub mod token;

//! Objects between members: remote gets, the bulk transport that carries
//! them, where they land and what is served.
//!
//! - [`fetch`] — remote gets, batched: one lookup per owner, one pull per
//!   holder, all at once.
//! - [`landing`] — where pulled objects land in the local store (small ones
//!   staged, then created sealed), sealed as cached copies.
//! - [`copies`] — which local objects are copies pulled from others.
//! - [`source`] — this member's objects pinned (small ones copied out)
//!   while others pull them.
//! - [`transport`] — the bulk transport's interface (pull, land, serve).
//! - [`codec`] — the bulk transport's wire format.
//! - [`client`] — the TCP transport's pulling side (pooled connections).
//! - [`server`] — the TCP transport's serving side.

pub mod client;
pub mod codec;
pub mod copies;
pub mod fetch;
pub mod landing;
pub mod server;
pub mod source;
pub mod transport;

#[cfg(test)]
mod tcp_tests;

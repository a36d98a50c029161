//! The ferroplasma store daemon: owns the shared memory and the object table
//! and serves clients over a Unix socket. The binary `ferroplasma` wraps it;
//! the Python package links it so `pip install` alone can start a store.
//!
//! Module map:
//! - [`server`] — [`run`] / [`serve`]: arena, socket, accept loop, signals.
//! - [`cli`] — the `ferroplasma` command line (binary and Python console script).
//! - [`config`] — [`StoreConfig`], the `ferroplasma store` flags and defaults.
//! - `connection` — one client: handshake, requests, parked gets, events.
//! - `shared` — the state machine behind a mutex plus per-client notice
//!   queues; `shared/spilling.rs`: when to spill and restore, and the
//!   threads that do it.
//! - [`arena`] — the memfd/file-backed mapping handed to clients.
//! - `fast_table` — the object table published in shared memory (reads
//!   without a round trip) and every client's holds.
//! - `listener` — socket creation, stale-socket and live-store detection.
//! - `fdpass` — SCM_RIGHTS on a tokio socket.
//! - `spill` — the spill directory's segment files (write, read back, remove).
//! - `convert` — state machine types to wire messages.
//! - `instruments` — what the connections count as they answer.
//! - `metrics` — Prometheus metrics: read at each scrape (`metrics/collect.rs`)
//!   and served (`metrics/endpoint.rs`, `--metrics-listen`).
//! - `guard` — the network ports' cap on connections and their deadlines
//!   (cluster gRPC, bulk, metrics).
//! - `descriptors` — the descriptor limit raised at start and split
//!   between local clients and the network ports.
//! - `rate_log` — log lines strangers can cause, at most one per 10 s.
//! - `watch` — `ferroplasma stats --watch`: a live view with rates.
//! - [`cluster`] — many stores, one namespace: membership, the partitioned
//!   directory, remote gets over the bulk transport (docs/cluster.md).
//! - [`error`] — [`DaemonError`].

pub mod arena;
pub mod cli;
pub mod cluster;
pub mod config;
mod connection;
mod convert;
mod descriptors;
pub mod error;
mod fast_table;
mod fdpass;
mod guard;
mod instruments;
mod listener;
mod metrics;
mod rate_log;
pub mod server;
mod shared;
mod spill;
mod watch;

pub use config::StoreConfig;
pub use error::DaemonError;
pub use server::{run, serve};

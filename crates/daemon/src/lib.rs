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
//!   threads that do it; `shared/handed.rs`: ids the store hands out for
//!   new objects (`NewIds`: claimed ahead on a cluster member, so that
//!   creating one asks no other member) and which each connection holds.
//! - [`arena`] — the memfd/file-backed mapping handed to clients.
//! - `shared_table` — the shared table: the object table published in shared memory (reads
//!   without a round trip) and every client's holds; rebuilt larger or smaller as the
//!   object count changes (`table`: one table's memory; `scan`: the scan of holds).
//! - `fast_writes` — writes without a round trip, the store's side: the
//!   area of claims, each client's ring, taking records in at each lock.
//! - `listener` — socket creation, stale-socket and live-store detection.
//! - `fdpass` — SCM_RIGHTS on a tokio socket.
//! - `spill` — the spill directory's segment files (write, read back, remove).
//! - `spin` — the store's thread kept awake for a moment after each request
//!   (`--spin-us`).
//! - `convert` — state machine types to wire messages.
//! - `instruments` — what the connections count as they answer.
//! - `metrics` — Prometheus metrics: read at each scrape (`metrics/collect.rs`)
//!   and served (`metrics/endpoint.rs`, `--metrics-listen`).
//! - `descriptors` — the descriptor limit raised at start and split
//!   between local clients and the network ports.
//! - `watch` — `ferroplasma stats --watch`: a live view with rates.
//! - `cluster_store` — the store as the cluster sees it (the cluster
//!   crate's `LocalStore`, implemented over `shared`).
//! - [`cluster`] — the `ferroplasma-cluster` crate, re-exported: many
//!   stores, one namespace (docs/cluster.md). Its `net` module has the
//!   network ports' guard and rate-limited logs the daemon uses too.
//! - [`error`] — [`DaemonError`].

pub mod arena;
pub mod cli;
mod cluster_store;
pub mod config;
mod connection;
mod convert;
mod descriptors;
pub mod error;
mod fast_writes;
mod fdpass;
mod instruments;
mod listener;
mod metrics;
pub mod server;
mod shared;
mod shared_table;
mod spill;
mod spin;
mod watch;

pub use config::StoreConfig;
pub use error::DaemonError;
pub use ferroplasma_cluster as cluster;
pub use server::{run, run_until, serve, serve_until};

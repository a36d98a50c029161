//! The data path of columnar scans (`ferroplasma.scan`): Arrow record
//! batches cross a socket as their own buffers, gathered into one send on
//! one side and scattered into 64-byte-aligned memory on the other, with no
//! Python per batch or per buffer. The control frames (HELLO, INIT_SCAN, ...)
//! stay in Python (`python/ferroplasma/scan/`); this crate owns what moves
//! the bytes. It follows "Thallus: An RDMA-based Columnar Data Transport
//! Protocol" (Chakraborty et al., 2024), over TCP.
//!
//! Module map:
//! - [`frame`] — the scan protocol's frame head and the JSON fields of the
//!   frames this crate sends and reads (BATCH, ITERATE, DONE, ERROR, ...).
//! - [`layout`] — a record batch as a flat descriptor plus its buffers, and
//!   back (the same descriptor as `ferroplasma.arrow_layout`).
//! - [`validate`] — full validation of a received array, with a fast
//!   check of string and binary offsets.
//! - [`io`] — gather sends and scatter receives on a socket descriptor.
//! - [`region`] — the aligned regions batches land in, and the pool that
//!   keeps them for the next batches.
//! - [`source`] — the server side: a DuckDB result (any Arrow C stream) read
//!   one batch ahead by a producer thread while the previous one is sent.
//! - [`receiver`] — the client side: a thread that asks for batches, lands
//!   them in aligned memory (or in store objects) and hands them on through
//!   a bounded queue, so the consumer reads batch i while batch i+1 arrives.
//! - [`store_object`] — a batch as a store object (the layout Python's
//!   `ferroplasma.serialization` reads), and the sink that creates them.
//! - [`error`] — the crate's one error type.

pub mod error;
pub mod frame;
pub mod io;
pub mod layout;
pub mod receiver;
pub mod region;
pub mod source;
pub mod store_object;
pub mod validate;

pub use error::{Error, Result};

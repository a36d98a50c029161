//! Prometheus metrics of a store (`ferroplasma store --metrics-listen`).
//!
//! - crate::instruments — counted by the connections as they answer.
//! - [`collect`] — read at each scrape: requests (with those answered from
//!   the shared table) and the store's and the cluster's figures.
//! - [`endpoint`] — the HTTP endpoint.
//!
//! Names and meanings: docs/operations.md.

mod collect;
mod endpoint;

pub use endpoint::{bind, serve};

use crate::instruments::Instruments;
use crate::shared::SharedRef;
use collect::{RequestsCollector, StoreCollector};
use ferroplasma_cluster::Cluster;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;

/// The registry a store's endpoint serves: `instruments` and the store's
/// own figures, every name prefixed `ferroplasma_`.
pub fn registry(
    instruments: &Instruments,
    shared: SharedRef,
    cluster: Option<Arc<Cluster>>,
) -> Registry {
    let mut r = Registry::with_prefix("ferroplasma");
    let (table, rings) = {
        let sh = shared.lock();
        (sh.table.clone(), sh.fast.is_some())
    };
    r.register_collector(Box::new(RequestsCollector {
        requests: instruments.requests.clone(),
        from_table: Family::default(),
        table,
        through_rings: rings.then(|| instruments.through_rings.clone()),
    }));
    r.register_with_unit(
        "answer",
        "Time the store took to answer a get or create it could answer at once",
        Unit::Seconds,
        instruments.seconds.clone(),
    );
    r.register_collector(Box::new(StoreCollector { shared, cluster }));
    r
}

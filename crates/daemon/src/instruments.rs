//! What the connections count as they answer, for the metrics endpoint
//! (crate::metrics): requests by kind and the store's answer times.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

/// The requests a client can make, as a label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Op {
    create,
    create_and_seal,
    seal,
    abort,
    get,
    release,
    contains,
    delete,
    evict,
    list,
    stats,
    subscribe,
    cluster_status,
    lease,
    settle,
    new_ids,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: Op,
}

/// What the connections count as they answer: requests by kind, and how
/// long the store took to answer the gets and creates it answered at once.
#[derive(Debug)]
pub struct Instruments {
    pub(crate) requests: Family<OpLabel, Counter>,
    /// Creates, seals and aborts clients made through their rings (writes
    /// without a round trip), counted in `requests` too.
    pub(crate) through_rings: Family<OpLabel, Counter>,
    pub(crate) seconds: Family<OpLabel, Histogram>,
}

impl Default for Instruments {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            through_rings: Family::default(),
            // 1 µs … 1 s, four buckets per decade.
            seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1e-6, 10f64.powf(0.25), 25))
            }),
        }
    }
}

impl Instruments {
    /// `n` records of kind `op` taken in from clients' rings.
    pub fn through_ring(&self, op: Op, n: u64) {
        self.requests.get_or_create(&OpLabel { op }).inc_by(n);
        self.through_rings.get_or_create(&OpLabel { op }).inc_by(n);
    }

    /// One request of kind `op`.
    pub fn request(&self, op: Op) {
        self.requests.get_or_create(&OpLabel { op }).inc();
    }

    /// A get or create answered in `seconds` (without waiting).
    pub fn answered(&self, op: Op, seconds: f64) {
        self.seconds.get_or_create(&OpLabel { op }).observe(seconds);
    }
}

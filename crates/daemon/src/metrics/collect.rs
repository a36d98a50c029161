//! The figures read at each scrape: requests (those clients answered from
//! the shared table added from their own counts) and the store's and the
//! cluster's state.

use crate::instruments::{Op, OpLabel};
use crate::shared::SharedRef;
use crate::shared_table::SharedTable;
use ferroplasma_cluster::Cluster;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;
use std::sync::Arc;

/// Requests by kind, those clients answered from the shared table included:
/// at each scrape it adds what the clients counted in their holds regions
/// since the last one (gets and contains to `requests`, and each kind,
/// releases of objects too, to `table_requests`). Nothing is counted on the
/// store's side of the read path.
#[derive(Debug)]
pub(super) struct RequestsCollector {
    pub(super) requests: Family<OpLabel, Counter>,
    pub(super) from_table: Family<OpLabel, Counter>,
    pub(super) table: Option<Arc<SharedTable>>,
    /// Creates, seals and aborts made through clients' rings, when the
    /// store offers writes without a round trip.
    pub(super) through_rings: Option<Family<OpLabel, Counter>>,
}

impl Collector for RequestsCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        if let Some(table) = &self.table {
            let a = table.take_answered();
            for (op, n, request) in [
                (Op::get, a.gets, true),
                (Op::contains, a.contains, true),
                (Op::release, a.releases, false),
            ] {
                if request {
                    self.requests.get_or_create(&OpLabel { op }).inc_by(n);
                }
                self.from_table.get_or_create(&OpLabel { op }).inc_by(n);
            }
        }
        self.requests.encode(e.encode_descriptor(
            "requests",
            "Requests answered, by kind (gets and contains clients answered \
             from the shared table included)",
            None,
            self.requests.metric_type(),
        )?)?;
        if self.table.is_some() {
            self.from_table.encode(e.encode_descriptor(
                "table_requests",
                "Requests clients answered from the shared table without \
                 asking the store (release: objects given back)",
                None,
                self.from_table.metric_type(),
            )?)?;
        }
        if let Some(rings) = &self.through_rings {
            rings.encode(e.encode_descriptor(
                "ring_requests",
                "Creates, seals and aborts clients made through their rings, \
                 without a round trip (counted in requests too)",
                None,
                rings.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// The store's and the cluster's figures, read at each scrape.
#[derive(Debug)]
pub(super) struct StoreCollector {
    pub(super) shared: SharedRef,
    pub(super) cluster: Option<Arc<Cluster>>,
}

fn gauge(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: i64,
) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, unit, g.metric_type())?)
}

fn counter(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    v: u64,
) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, unit, c.metric_type())?)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabel {
    peer: String,
    health: &'static str,
}

impl Collector for StoreCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let (s, waiting_creates, create_retries) = {
            let sh = self.shared.lock();
            (sh.store.stats(), sh.waiting_creates, sh.create_retries)
        };
        let b = Some(&Unit::Bytes);
        gauge(
            &mut e,
            "capacity",
            "Bytes of shared memory the store manages",
            b,
            s.capacity as i64,
        )?;
        gauge(
            &mut e,
            "used",
            "Bytes allocated to objects",
            b,
            s.used as i64,
        )?;
        gauge(
            &mut e,
            "evictable",
            "Bytes of sealed objects nobody references (evicted first)",
            b,
            s.evictable_bytes as i64,
        )?;
        {
            let objects = Family::<StateLabel, prometheus_client::metrics::gauge::Gauge>::default();
            let unsealed = s.objects.saturating_sub(s.sealed_objects);
            for (state, n) in [
                ("sealed", s.sealed_objects),
                ("unsealed", unsealed),
                ("spilled", s.spilled_objects),
            ] {
                objects.get_or_create(&StateLabel { state }).set(n as i64);
            }
            objects.encode(e.encode_descriptor(
                "objects",
                "Objects in the store by state",
                None,
                objects.metric_type(),
            )?)?;
        }
        gauge(
            &mut e,
            "referenced_objects",
            "Objects some client references through the socket",
            None,
            s.referenced_objects as i64,
        )?;
        gauge(
            &mut e,
            "clients",
            "Connected clients",
            None,
            s.clients as i64,
        )?;
        gauge(
            &mut e,
            "awaited_objects",
            "Objects that waiting gets wait for",
            None,
            s.awaited_objects as i64,
        )?;
        gauge(
            &mut e,
            "waiting_creates",
            "Creates parked until space is freed",
            None,
            waiting_creates as i64,
        )?;
        counter(
            &mut e,
            "create_retries",
            "Parked creates tried again",
            None,
            create_retries,
        )?;
        counter(
            &mut e,
            "evictions",
            "Objects evicted to make room",
            None,
            s.evictions,
        )?;
        counter(
            &mut e,
            "evicted",
            "Bytes evicted to make room",
            b,
            s.evicted_bytes,
        )?;
        counter(
            &mut e,
            "spills",
            "Objects written to the spill directory",
            None,
            s.spills,
        )?;
        counter(
            &mut e,
            "restores",
            "Spilled objects read back",
            None,
            s.restores,
        )?;
        gauge(
            &mut e,
            "spilled",
            "Bytes of objects in the spill directory",
            b,
            s.spilled_bytes as i64,
        )?;
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        let st = cluster.status();
        let peers = Family::<
            PeerLabel,
            prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64>,
        >::default();
        for m in &st.members {
            let health = crate::convert::health_name(m.health);
            peers
                .get_or_create(&PeerLabel {
                    peer: m.addr.clone(),
                    health,
                })
                .set(m.last_seen_ms as f64 / 1000.0);
        }
        peers.encode(e.encode_descriptor(
            "cluster_peer_last_seen",
            "Seconds since each member's last heartbeat (0 for this store), labelled with its health",
            Some(&Unit::Seconds),
            peers.metric_type(),
        )?)?;
        let every = cluster.heartbeat_interval().as_secs_f64().max(1e-3);
        let missed = Family::<PeerLabel, prometheus_client::metrics::gauge::Gauge>::default();
        for m in st.members.iter().filter(|m| m.addr != st.members[0].addr) {
            let health = crate::convert::health_name(m.health);
            let n = (m.last_seen_ms as f64 / 1000.0 / every).floor() as i64;
            missed
                .get_or_create(&PeerLabel {
                    peer: m.addr.clone(),
                    health,
                })
                .set(n);
        }
        missed.encode(e.encode_descriptor(
            "cluster_peer_heartbeats_missed",
            "Heartbeat intervals since each other member was last heard from (0 or 1: healthy)",
            None,
            missed.metric_type(),
        )?)?;
        counter(
            &mut e,
            "cluster_fetches",
            "Objects pulled from other members",
            None,
            st.fetches,
        )?;
        counter(
            &mut e,
            "cluster_fetched",
            "Bytes pulled from other members",
            b,
            st.fetched_bytes,
        )?;
        counter(
            &mut e,
            "cluster_served",
            "Objects served to other members",
            None,
            st.served,
        )?;
        counter(
            &mut e,
            "cluster_served",
            "Bytes served to other members",
            b,
            st.served_bytes,
        )?;
        counter(
            &mut e,
            "cluster_pulls",
            "Pull requests sent to other members (each carries many objects)",
            None,
            st.pulls,
        )?;
        counter(
            &mut e,
            "cluster_lookups",
            "Directory lookups made",
            None,
            st.lookups,
        )?;
        counter(
            &mut e,
            "cluster_claims",
            "Ids claimed in the directory",
            None,
            st.claims,
        )?;
        counter(
            &mut e,
            "cluster_updates",
            "Directory update requests delivered to other members",
            None,
            st.updates,
        )?;
        gauge(
            &mut e,
            "cluster_directory_entries",
            "Directory entries this store keeps",
            None,
            st.directory_entries as i64,
        )?;
        gauge(
            &mut e,
            "cluster_ids_claimed_ahead",
            "Ids claimed cluster-wide ahead and not handed out yet",
            None,
            st.ids_claimed_ahead as i64,
        )?;
        gauge(
            &mut e,
            "cluster_updates_pending",
            "Objects whose news the directory has not had yet",
            None,
            st.updates_pending as i64,
        )?;
        Ok(())
    }
}

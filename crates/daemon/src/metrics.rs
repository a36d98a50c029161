//! Prometheus metrics of a store (`ferroplasma store --metrics-listen`):
//! counters the connections bump as they answer ([`Instruments`]), the
//! requests clients answered from the shared table (`RequestsCollector`:
//! their own counts, read at each scrape), the
//! store's own figures read at each scrape ([`StoreCollector`]: O(1), the
//! counters `Store::stats` keeps), and the HTTP endpoint that serves them in
//! Prometheus' text format (`GET /metrics`, nothing else), its connections
//! capped and given deadlines (`ferroplasma_cluster::net::guard`). Names and
//! meanings:
//! docs/operations.md.

use crate::fast_table::FastTable;
use crate::shared::SharedRef;
use crate::DaemonError;
use ferroplasma_cluster::net::guard;
use ferroplasma_cluster::Cluster;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::Arc;

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
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: Op,
}

/// What the connections count as they answer: requests by kind, and how
/// long the store took to answer the gets and creates it answered at once.
#[derive(Debug)]
pub struct Instruments {
    requests: Family<OpLabel, Counter>,
    seconds: Family<OpLabel, Histogram>,
}

impl Default for Instruments {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            // 1 µs … 1 s, four buckets per decade.
            seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1e-6, 10f64.powf(0.25), 25))
            }),
        }
    }
}

impl Instruments {
    /// One request of kind `op`.
    pub fn request(&self, op: Op) {
        self.requests.get_or_create(&OpLabel { op }).inc();
    }

    /// A get or create answered in `seconds` (without waiting).
    pub fn answered(&self, op: Op, seconds: f64) {
        self.seconds.get_or_create(&OpLabel { op }).observe(seconds);
    }
}

/// Requests by kind, those clients answered from the shared table included:
/// at each scrape it adds what the clients counted in their holds regions
/// since the last one (gets and contains to `requests`, and each kind,
/// releases of objects too, to `table_requests`). Nothing is counted on the
/// store's side of the read path.
#[derive(Debug)]
struct RequestsCollector {
    requests: Family<OpLabel, Counter>,
    from_table: Family<OpLabel, Counter>,
    fast: Option<Arc<FastTable>>,
}

impl Collector for RequestsCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        if let Some(fast) = &self.fast {
            let a = fast.take_answered();
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
        if self.fast.is_some() {
            self.from_table.encode(e.encode_descriptor(
                "table_requests",
                "Requests clients answered from the shared table without \
                 asking the store (release: objects given back)",
                None,
                self.from_table.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// The store's and the cluster's figures, read at each scrape.
#[derive(Debug)]
pub struct StoreCollector {
    shared: SharedRef,
    cluster: Option<Arc<Cluster>>,
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
            "cluster_updates_pending",
            "Objects whose news the directory has not had yet",
            None,
            st.updates_pending as i64,
        )?;
        Ok(())
    }
}

/// The registry a store's endpoint serves: `instruments` and the store's
/// own figures, every name prefixed `ferroplasma_`.
pub fn registry(
    instruments: &Instruments,
    shared: SharedRef,
    cluster: Option<Arc<Cluster>>,
) -> Registry {
    let mut r = Registry::with_prefix("ferroplasma");
    let fast = shared.lock().fast.clone();
    r.register_collector(Box::new(RequestsCollector {
        requests: instruments.requests.clone(),
        from_table: Family::default(),
        fast,
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

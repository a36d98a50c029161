//! Many stores, one namespace: membership, the partitioned object
//! directory, and pulling objects between members.
//!
//! Module map:
//! - [`ring`] — consistent hashing of ids onto members (owner and backup).
//! - [`directory`] — the directory entries this member keeps (pure state).
//! - [`membership`] — the member table and failure detector (pure state).
//! - `service` — the gRPC `Peer` service other members call.
//! - `heartbeat` — the heartbeat/gossip loop that drives membership.
//! - `agent` — turns local seals and deletions into directory updates, and
//!   re-registers everything held after a membership change.
//! - `fetch` — remote gets, batched: one lookup per owner, one pull per
//!   holder, all at once.
//! - `landing` — where pulled objects land in the local store (small ones
//!   staged, then created sealed), sealed as cached copies.
//! - `copies` — which local objects are copies pulled from others.
//! - `source` — this member's objects pinned (small ones copied out) while
//!   others pull them.
//! - [`transport`] — the bulk transport interface and its TCP implementation.
//! - `retry` — pauses between retries (exponential, jittered).
//! - `token` — the shared secret on every gRPC call and bulk connection.
//! - `peers` — gRPC channels to other members, token and deadlines attached.
//! - `ops` — cluster-wide claim, update, lookup, contains, delete and list,
//!   routed to each id's owner and backup.
//!
//! Every directory entry lives on two members (the id's owner and backup
//! on the ring), so the loss of any one member loses no entry: its ids fall
//! to their backups, who know where every copy is and which are now lost.

mod agent;
mod copies;
pub mod directory;
mod fetch;
mod heartbeat;
mod landing;
pub mod membership;
mod ops;
mod peers;
mod retry;
pub mod ring;
mod service;
mod source;
mod token;
pub mod transport;

#[cfg(test)]
mod thread_tests;

/// Generated gRPC code for `proto/ferroplasma/cluster/v1/cluster.proto`.
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod pb {
    tonic::include_proto!("ferroplasma.cluster.v1");
}

use crate::shared::SharedRef;
use crate::DaemonError;
use directory::Directory;
use ferroplasma_protocol::pb as wire;
use ferroplasma_protocol::{IdHasher, ObjectId};
use ferroplasma_store::ClientId;
use membership::{Changes, MemberInfo, Membership};
use ring::Ring;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};
use transport::Transport;

/// How a store joins a cluster (from `ferroplasma store` flags).
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Where the gRPC service listens.
    pub listen: SocketAddr,
    /// The address other members reach it at (its name).
    pub advertise: String,
    /// Where the bulk transport listens (port 0: any free port).
    pub data_listen: SocketAddr,
    /// Members to contact at start.
    pub peers: Vec<String>,
    /// The shared secret.
    pub token: String,
    /// Time between heartbeats.
    pub heartbeat: Duration,
    /// Silence after which a member is declared dead.
    pub peer_timeout: Duration,
    /// Most connections at once on the gRPC port.
    pub grpc_connections: usize,
    /// Most connections at once on the bulk port.
    pub bulk_connections: usize,
}

/// Something a cluster operation finished, for the connection that asked.
#[derive(Debug)]
pub enum Completion {
    /// The reply to a request.
    Reply {
        /// The request.
        request_id: u64,
        /// Its answer.
        body: Result<wire::reply::Body, wire::Error>,
    },
    /// A create's id was claimed cluster-wide (or refused).
    Claimed {
        /// The request.
        request_id: u64,
        /// The original Create or CreateAndSeal.
        request: wire::request::Body,
        /// Ok when the id is now reserved for this member.
        result: Result<(), wire::Error>,
    },
    /// A remote get of this id failed for good (lost, or no room here).
    FetchFailed {
        /// The object.
        id: ObjectId,
        /// Why.
        error: wire::Error,
    },
}

/// The sender half connections hand to cluster operations.
pub type Completions = mpsc::UnboundedSender<Completion>;

/// Transfer and directory counters (shown by `ferroplasma cluster status`).
#[derive(Debug, Default)]
pub struct Counters {
    /// Objects pulled from other members.
    pub fetches: AtomicU64,
    /// Pull requests sent (each carries all the objects asked of one holder).
    pub pulls: AtomicU64,
    /// Data bytes pulled.
    pub fetched_bytes: AtomicU64,
    /// Objects sent to other members.
    pub served: AtomicU64,
    /// Data bytes sent.
    pub served_bytes: AtomicU64,
    /// Directory lookups sent.
    pub lookups: AtomicU64,
    /// Ids claimed for creates.
    pub claims: AtomicU64,
    /// Directory update requests delivered to other members (each may
    /// carry the news of many objects).
    pub updates: AtomicU64,
}

/// A fetch in progress and the connections waiting on it.
#[derive(Debug)]
struct Inflight {
    /// Latest deadline of any waiter (`None`: one waits forever).
    deadline: Option<tokio::time::Instant>,
    waiters: Vec<Completions>,
}

/// This member's view of the cluster.
#[derive(Debug)]
pub struct Cluster {
    me: String,
    data_addr: String,
    incarnation: u64,
    token: Arc<str>,
    heartbeat: Duration,
    shared: SharedRef,
    /// The store client the cluster acts as: it subscribes to seals and
    /// deletions, holds pins on objects being sent and creates landings.
    agent: ClientId,
    membership: Mutex<Membership>,
    ring: Mutex<Ring>,
    directory: Mutex<Directory>,
    /// Woken on every directory change (for lookups that wait).
    directory_changed: Notify,
    /// Woken when the live members changed (the agent re-registers).
    rejoin: Notify,
    /// Woken when the agent has sent a batch of updates.
    updates_sent: Notify,
    /// When this member started, and the peer timeout: until every member
    /// named at start has answered or that long has passed, this member
    /// does not know the ring and grants no claim.
    started: std::time::Instant,
    peer_timeout: Duration,
    /// Bumped each time this member forgets its directory.
    directory_epoch: AtomicU64,
    /// Ids claimed for creates that may not be in the store yet (a create
    /// waiting for room): a re-registration re-claims them with the new
    /// owners. Pruned there once in the store, and on abort.
    granted: Mutex<HashSet<ObjectId, IdHasher>>,
    /// Local objects that are cached copies pulled from elsewhere.
    cached: Mutex<copies::Copies>,
    inflight: Mutex<HashMap<ObjectId, Inflight, IdHasher>>,
    peers: peers::Peers,
    transport: Box<dyn Transport>,
    /// The cluster's own runtime (on its own thread): every cluster task
    /// runs there.
    rt: tokio::runtime::Handle,
    /// Counters.
    pub counters: Counters,
}

/// A current-thread runtime for the cluster's unit tests.
#[cfg(test)]
fn test_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a test runtime")
}

/// A member on its own store (4 MiB), listening on loopback, started on
/// `rt`, for the cluster's unit tests.
#[cfg(test)]
fn test_member(
    rt: &tokio::runtime::Runtime,
    peers: Vec<String>,
    heartbeat: Duration,
    peer_timeout: Duration,
) -> Arc<Cluster> {
    let arena = crate::arena::Arena::create(4 << 20, None, false).expect("arena");
    let shared = SharedRef::new(ferroplasma_store::Store::new(4 << 20), arena, None, None);
    let cfg = ClusterConfig {
        listen: "127.0.0.1:0".parse().expect("an address"),
        advertise: "127.0.0.1:0".into(),
        data_listen: "127.0.0.1:0".parse().expect("an address"),
        peers,
        token: "unit-test".into(),
        heartbeat,
        peer_timeout,
        grpc_connections: 64,
        bulk_connections: 64,
    };
    rt.block_on(Cluster::start(cfg, shared)).expect("cluster")
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cluster {
    /// Binds the gRPC and bulk listeners, registers the cluster's store
    /// client and starts the service, heartbeat and agent tasks on the
    /// cluster's own thread: nothing the store's thread does (a long
    /// batched get, a list of every object, a restore) can hold up
    /// heartbeats or the answers other members wait for.
    pub async fn start(
        mut cfg: ClusterConfig,
        shared: SharedRef,
    ) -> Result<Arc<Self>, DaemonError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| DaemonError::io("starting the cluster's runtime", e))?;
        let handle = rt.handle().clone();
        std::thread::Builder::new()
            .name("fp-cluster".into())
            .spawn(move || rt.block_on(std::future::pending::<()>()))
            .map_err(|e| DaemonError::io("starting the cluster's thread", e))?;
        // Sockets belong to the runtime they are registered with: the
        // cluster's.
        let _in_cluster_rt = handle.enter();
        let bind = |addr: SocketAddr, what: String| {
            std::net::TcpListener::bind(addr)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .and_then(tokio::net::TcpListener::from_std)
                .map_err(|e| DaemonError::io(what, e))
        };
        let grpc = bind(
            cfg.listen,
            format!("binding --cluster-listen {}", cfg.listen),
        )?;
        // `--cluster-listen HOST:0`: the system picks the port, and the
        // member advertises the one it got (tests use this: no port is
        // chosen, freed and bound again, with a race in between).
        if cfg.listen.port() == 0 {
            let port = grpc
                .local_addr()
                .map_err(|e| DaemonError::io("cluster port", e))?
                .port();
            if let Some(host) = cfg.advertise.strip_suffix(":0") {
                cfg.advertise = format!("{host}:{port}");
            }
        }
        let bulk = bind(
            cfg.data_listen,
            format!("binding the data port {}", cfg.data_listen),
        )?;
        let bulk_port = bulk
            .local_addr()
            .map_err(|e| DaemonError::io("data port address", e))?
            .port();
        let host = cfg
            .advertise
            .rsplit_once(':')
            .map_or(cfg.advertise.as_str(), |(h, _)| h);
        let data_addr = format!("{host}:{bulk_port}");
        let (agent, events) = shared.lock().register_agent();
        let mut inc = [0u8; 8];
        getrandom::fill(&mut inc).map_err(|e| {
            DaemonError::io("random incarnation", std::io::Error::other(e.to_string()))
        })?;
        let token: Arc<str> = cfg.token.as_str().into();
        let mut membership = Membership::new(&cfg.advertise, cfg.peer_timeout);
        membership.learn(cfg.peers.iter().map(String::as_str));
        let cluster = Arc::new(Self {
            me: cfg.advertise.clone(),
            data_addr,
            incarnation: u64::from_le_bytes(inc) | 1,
            token: token.clone(),
            heartbeat: cfg.heartbeat,
            shared,
            agent,
            ring: Mutex::new(Ring::new([cfg.advertise.clone()])),
            membership: Mutex::new(membership),
            directory: Mutex::new(Directory::new()),
            directory_changed: Notify::new(),
            rejoin: Notify::new(),
            updates_sent: Notify::new(),
            started: std::time::Instant::now(),
            peer_timeout: cfg.peer_timeout,
            directory_epoch: AtomicU64::new(0),
            granted: Mutex::new(HashSet::default()),
            cached: Mutex::new(copies::Copies::default()),
            inflight: Mutex::new(HashMap::default()),
            peers: peers::Peers::new(&token, cfg.peer_timeout, handle.clone())?,
            rt: handle.clone(),
            transport: Box::new(transport::TcpTransport::new(
                token.clone(),
                cfg.peer_timeout,
            )),
            counters: Counters::default(),
        });
        {
            // Alone in its ring, and with an empty store: complete for it.
            let me = [cluster.me.clone()];
            let fingerprint = cluster.fingerprint(&me);
            let mut d = lock(&cluster.directory);
            d.set_ring(fingerprint, me.to_vec());
            d.synced(&cluster.me, fingerprint);
        }
        let grpc = service::guard(cfg.grpc_connections, cfg.peer_timeout).incoming(grpc);
        handle.spawn(service::serve(cluster.clone(), grpc));
        handle.spawn(transport::serve_tcp(
            bulk,
            cfg.bulk_connections,
            token,
            Arc::new(source::StoreSource(cluster.clone())),
            cfg.peer_timeout,
        ));
        handle.spawn(agent::run(cluster.clone(), events));
        handle.spawn(heartbeat::run(cluster.clone()));
        tracing::info!(
            me = %cluster.me, data = %cluster.data_addr, peers = ?cfg.peers,
            heartbeat_ms = cfg.heartbeat.as_millis() as u64,
            peer_timeout_ms = cfg.peer_timeout.as_millis() as u64,
            "cluster member ready"
        );
        Ok(cluster)
    }

    /// Whether this member knows the ring: every member named to it has
    /// answered, or the peer timeout has passed since it started.
    fn settled(&self) -> bool {
        self.started.elapsed() > self.peer_timeout || !lock(&self.membership).has_unknown()
    }

    /// This member's name (its advertised cluster address).
    pub fn me(&self) -> &str {
        &self.me
    }

    /// What this member says about itself in heartbeats (O(1): a full
    /// `stats()` asks the shared table about every object, and ran every
    /// heartbeat under the store's lock).
    fn my_info(&self) -> MemberInfo {
        let s = self.shared.lock().store.usage();
        MemberInfo {
            addr: self.me.clone(),
            data_addr: self.data_addr.clone(),
            incarnation: self.incarnation,
            capacity: s.capacity,
            used: s.used,
            objects: s.objects,
            directory_epoch: self.directory_epoch.load(Ordering::Relaxed),
        }
    }

    /// The fingerprint of a ring of `members`: their names, incarnations
    /// and directory epochs as this member knows them. Two members agree
    /// on the ring when their fingerprints are equal.
    fn fingerprint(&self, members: &[String]) -> u64 {
        let m = lock(&self.membership);
        let named = members.iter().map(|addr| {
            if *addr == self.me {
                (
                    addr.as_str(),
                    self.incarnation,
                    self.directory_epoch.load(Ordering::Relaxed),
                )
            } else {
                let (inc, epoch) = m
                    .get(addr)
                    .map_or((0, 0), |x| (x.info.incarnation, x.info.directory_epoch));
                (addr.as_str(), inc, epoch)
            }
        });
        ring::fingerprint(named)
    }

    /// The owner and backup of `id` in the current ring.
    fn targets(&self, id: &ObjectId) -> Vec<String> {
        lock(&self.ring)
            .owners(id, 2)
            .into_iter()
            .map(String::from)
            .collect()
    }

    /// Records what a heartbeat told about a member and the members it knows.
    fn heard(&self, info: MemberInfo, known: &[String]) {
        let changes = {
            let mut m = lock(&self.membership);
            m.learn(known.iter().map(String::as_str));
            m.heard(info, tokio::time::Instant::now().into_std())
        };
        self.apply(changes);
    }

    /// Acts on members joining or dying: directory clean-up, the new ring,
    /// re-registration.
    fn apply(&self, ch: Changes) {
        if !ch.ring_changed() {
            return;
        }
        for d in &ch.died {
            let lost = lock(&self.directory).member_died(d);
            let data = lock(&self.membership)
                .get(d)
                .map(|m| m.info.data_addr.clone());
            if let Some(data) = data {
                self.transport.forget(&data);
            }
            tracing::warn!(member = %d, objects_lost = lost, "cluster member is gone");
        }
        for r in &ch.restarted {
            lock(&self.directory).member_restarted(r);
        }
        for j in &ch.joined {
            if !ch.restarted.contains(j) {
                // Back from a pause or a cut, with what it held.
                lock(&self.directory).member_back(j);
            }
            tracing::info!(member = %j, "cluster member joined");
        }
        let alive = lock(&self.membership).alive();
        let ring = Ring::new(alive.clone());
        let cleared = alive.len() == 1 && !ch.died.is_empty();
        if cleared {
            // Everyone else died at once: this member was most likely cut off
            // or paused. What its directory says is out of date by the time
            // it is back; it forgets it and says so in its heartbeats (a new
            // directory epoch), and everyone re-registers with it.
            self.directory_epoch.fetch_add(1, Ordering::Relaxed);
        }
        let fingerprint = self.fingerprint(ring.members());
        {
            // One step for claims: the entries, the ring and what the
            // directory is complete for change together.
            let mut d = lock(&self.directory);
            if cleared {
                d.clear();
            } else {
                let me = self.me.as_str();
                let dropped = d.retain_owned(|id| ring.owners(id, 2).contains(&me));
                if dropped > 0 {
                    tracing::debug!(
                        entries = dropped,
                        "directory entries handed over to their new owners"
                    );
                }
            }
            d.set_ring(fingerprint, ring.members().to_vec());
            tracing::debug!(members = ?ring.members(), ring = fingerprint, "new ring");
            *lock(&self.ring) = ring;
        }
        self.directory_changed.notify_waiters();
        self.rejoin.notify_one();
    }

    /// The status for `ferroplasma cluster status`.
    /// How often members send heartbeats (`--heartbeat-interval`).
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat
    }

    pub fn status(&self) -> wire::ClusterStatusReply {
        let now = std::time::Instant::now();
        let me = self.my_info();
        let mut members = vec![wire::MemberStatus {
            addr: me.addr,
            data_addr: me.data_addr,
            health: wire::MemberHealth::ThisMember as i32,
            capacity: me.capacity,
            used: me.used,
            objects: me.objects,
            last_seen_ms: 0,
        }];
        for m in lock(&self.membership).members() {
            members.push(wire::MemberStatus {
                addr: m.info.addr.clone(),
                data_addr: m.info.data_addr.clone(),
                health: match m.health {
                    membership::Health::Alive => wire::MemberHealth::Alive,
                    membership::Health::Dead => wire::MemberHealth::Dead,
                    membership::Health::Unknown => wire::MemberHealth::Unknown,
                    membership::Health::Refused => wire::MemberHealth::Refused,
                } as i32,
                capacity: m.info.capacity,
                used: m.info.used,
                objects: m.info.objects,
                last_seen_ms: m
                    .last_seen
                    .map_or(0, |t| now.duration_since(t).as_millis() as u64),
            });
        }
        let c = &self.counters;
        wire::ClusterStatusReply {
            enabled: true,
            members,
            fetches: c.fetches.load(Ordering::Relaxed),
            pulls: c.pulls.load(Ordering::Relaxed),
            fetched_bytes: c.fetched_bytes.load(Ordering::Relaxed),
            served: c.served.load(Ordering::Relaxed),
            served_bytes: c.served_bytes.load(Ordering::Relaxed),
            lookups: c.lookups.load(Ordering::Relaxed),
            claims: c.claims.load(Ordering::Relaxed),
            directory_entries: lock(&self.directory).len() as u64,
            updates_pending: self.shared.lock().agent_pending.len() as u64,
            updates: c.updates.load(Ordering::Relaxed),
        }
    }

    /// Whether `id` is a cached copy pulled from another member.
    pub fn is_cached(&self, id: &ObjectId) -> bool {
        lock(&self.cached).contains(id)
    }
}

/// An error reply for the Python/Rust clients.
pub(crate) fn wire_error(
    code: wire::ErrorCode,
    message: String,
    id: Option<ObjectId>,
) -> wire::Error {
    wire::Error {
        code: code as i32,
        message,
        object_id: id.map(|i| i.0.to_vec()).unwrap_or_default(),
    }
}

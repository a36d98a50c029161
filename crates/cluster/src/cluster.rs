//! This member's view of the cluster: the [`Cluster`] every task and
//! request shares, what it says about itself, and how it takes members
//! joining and dying (a new ring, the directory handed over).

use crate::directory::membership::{self, Changes, MemberInfo, Membership};
use crate::directory::ring::{self, Ring};
use crate::directory::table::Directory;
use crate::local::LocalStore;
use crate::peers::client::Peers;
use crate::sync::lock;
use crate::transfer::copies::Copies;
use crate::transfer::transport::Transport;
use ferroplasma_protocol::pb as wire;
use ferroplasma_protocol::{IdHasher, ObjectId};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

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

/// Most directory entries gone through under one hold of its lock when
/// the live members change.
pub(crate) const CHUNK: usize = 16_384;

/// A fetch in progress and the connections waiting on it.
#[derive(Debug)]
pub(crate) struct Inflight {
    /// Latest deadline of any waiter (`None`: one waits forever).
    pub(crate) deadline: Option<tokio::time::Instant>,
    pub(crate) waiters: Vec<Completions>,
}

/// This member's view of the cluster.
#[derive(Debug)]
pub struct Cluster {
    pub(crate) me: String,
    pub(crate) data_addr: String,
    pub(crate) incarnation: u64,
    pub(crate) token: Arc<str>,
    pub(crate) heartbeat: Duration,
    /// The local store (its own store client subscribes to seals and
    /// deletions, holds pins on objects being sent and creates landings).
    pub(crate) store: Arc<dyn LocalStore>,
    pub(crate) membership: Mutex<Membership>,
    pub(crate) ring: Mutex<Ring>,
    pub(crate) directory: Mutex<Directory>,
    /// Woken on every directory change (for lookups that wait).
    pub(crate) directory_changed: Notify,
    /// Woken when the live members changed (the agent re-registers).
    pub(crate) rejoin: Notify,
    /// Woken when the agent has sent a batch of updates.
    pub(crate) updates_sent: Notify,
    /// When this member started, and the peer timeout: until every member
    /// named at start has answered or that long has passed, this member
    /// does not know the ring and grants no claim.
    pub(crate) started: std::time::Instant,
    pub(crate) peer_timeout: Duration,
    /// Bumped each time this member forgets its directory.
    pub(crate) directory_epoch: AtomicU64,
    /// Ids claimed for creates that may not be in the store yet (a create
    /// waiting for room): a re-registration re-claims them with the new
    /// owners. Pruned there once in the store, and on abort.
    pub(crate) granted: Mutex<HashSet<ObjectId, IdHasher>>,
    /// Ids claimed ahead, not handed out yet (`ops::fresh`); each is also
    /// in `granted`.
    pub(crate) fresh: Mutex<Vec<ObjectId>>,
    /// A task is topping `fresh` up.
    pub(crate) refilling: std::sync::atomic::AtomicBool,
    /// Local objects that are cached copies pulled from elsewhere.
    pub(crate) cached: Mutex<Copies>,
    pub(crate) inflight: Mutex<HashMap<ObjectId, Inflight, IdHasher>>,
    pub(crate) peers: Peers,
    /// Channels for heartbeats alone, on the heartbeat thread: their own
    /// connections, so that a heartbeat never waits behind a large update.
    pub(crate) hb_peers: Peers,
    /// Changes of the live members, for [`Cluster::apply`] (in order).
    pub(crate) ring_changes: mpsc::UnboundedSender<Changes>,
    /// What this member says about itself in heartbeats ([`Cluster::info`]).
    pub(crate) info: Mutex<MemberInfo>,
    pub(crate) transport: Box<dyn Transport>,
    /// The cluster's own runtime (on its own thread): every cluster task
    /// runs there.
    pub(crate) rt: tokio::runtime::Handle,
    /// Counters.
    pub counters: Counters,
}

impl Cluster {
    /// Whether this member knows the ring: every member named to it has
    /// answered, or the peer timeout has passed since it started.
    pub(crate) fn settled(&self) -> bool {
        self.started.elapsed() > self.peer_timeout || !lock(&self.membership).has_unknown()
    }

    /// This member's name (its advertised cluster address).
    pub fn me(&self) -> &str {
        &self.me
    }

    /// What this member says about itself in heartbeats (O(1): a full
    /// `stats()` asks the shared table about every object, and ran every
    /// heartbeat under the store's lock).
    pub(crate) fn my_info(&self) -> MemberInfo {
        let s = self.store.usage();
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
    pub(crate) fn fingerprint(&self, members: &[String]) -> u64 {
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
    pub(crate) fn targets(&self, id: &ObjectId) -> Vec<String> {
        lock(&self.ring)
            .owners(id, 2)
            .into_iter()
            .map(String::from)
            .collect()
    }

    /// Records what a heartbeat told about a member and the members it
    /// knows (on the heartbeat thread: cheap; what a change of the live
    /// members means for the directory is done by [`Cluster::apply`], on
    /// the cluster's thread).
    pub(crate) fn heard(&self, info: MemberInfo, known: &[String]) {
        let changes = {
            let mut m = lock(&self.membership);
            m.learn(known.iter().map(String::as_str));
            m.heard(info, tokio::time::Instant::now().into_std())
        };
        self.changed(changes);
    }

    /// Hands a change of the live members to [`Cluster::apply`], in order.
    pub(crate) fn changed(&self, ch: Changes) {
        if ch.ring_changed() {
            let _ = self.ring_changes.send(ch);
        }
    }

    /// Acts on members joining or dying: directory clean-up, the new ring,
    /// re-registration. The directory is gone through [`CHUNK`] entries at
    /// a time, its lock given back and other tasks let run in between, so
    /// that a million entries delay no claim, update or lookup for long.
    pub(crate) async fn apply(&self, ch: Changes) {
        if !ch.ring_changed() {
            return;
        }
        let back: Vec<&String> = (ch.joined.iter())
            .filter(|j| !ch.restarted.contains(j))
            .collect();
        let ids = if ch.died.is_empty() && ch.restarted.is_empty() && back.is_empty() {
            Vec::new()
        } else {
            lock(&self.directory).ids()
        };
        for d in &ch.died {
            let mut lost = 0;
            for piece in ids.chunks(CHUNK) {
                lost += lock(&self.directory).member_died_in(d, piece);
                tokio::task::yield_now().await;
            }
            let data = lock(&self.membership)
                .get(d)
                .map(|m| m.info.data_addr.clone());
            if let Some(data) = data {
                self.transport.forget(&data);
            }
            tracing::warn!(member = %d, objects_lost = lost, "cluster member is gone");
        }
        for r in &ch.restarted {
            for piece in ids.chunks(CHUNK) {
                lock(&self.directory).member_restarted_in(r, piece);
                tokio::task::yield_now().await;
            }
        }
        for j in &ch.joined {
            if back.contains(&j) {
                // Back from a pause or a cut, with what it held.
                for piece in ids.chunks(CHUNK) {
                    lock(&self.directory).member_back_in(j, piece);
                    tokio::task::yield_now().await;
                }
            }
            tracing::info!(member = %j, "cluster member joined");
        }
        drop(ids);
        let alive = lock(&self.membership).alive();
        let ring = Ring::new(alive.clone());
        if ch.stalled {
            tracing::warn!(
                "this member was stopped for longer than the peer timeout (paused, or \
                 starved of the CPU): it forgets its directory, and every member \
                 re-registers with it"
            );
        }
        let cleared = ch.stalled || (alive.len() == 1 && !ch.died.is_empty());
        if cleared {
            // This member stalled, or everyone else died at once (it was
            // most likely cut off). What its directory says is out of date by the time
            // it is back; it forgets it and says so in its heartbeats (a new
            // directory epoch), and everyone re-registers with it.
            // (Its heartbeats name the new epoch only once the directory
            // is cleared, below: a member re-registering for it meanwhile
            // would see its entries cleared and its mark kept.)
            self.directory_epoch.fetch_add(1, Ordering::Relaxed);
        }
        let fingerprint = self.fingerprint(ring.members());
        let (forgotten, kept) = {
            // One step for claims: the ring and what the directory is
            // complete for change together (it is complete for the new
            // ring only once every member has re-registered for it, so no
            // claim is granted meanwhile). The entries of ids this member
            // no longer answers for go below, a piece at a time: until
            // then they only refuse what their objects would refuse.
            let mut d = lock(&self.directory);
            let forgotten = cleared.then(|| d.clear());
            d.set_ring(fingerprint, ring.members().to_vec());
            tracing::debug!(members = ?ring.members(), ring = fingerprint, "new ring");
            *lock(&self.ring) = ring.clone();
            (forgotten, (!cleared).then(|| d.ids()))
        };
        drop(forgotten);
        if cleared {
            self.refresh_info();
        }
        self.directory_changed.notify_waiters();
        self.rejoin.notify_one();
        let me = self.me.as_str();
        let mut dropped = 0;
        for piece in kept.iter().flat_map(|ids| ids.chunks(CHUNK)) {
            dropped +=
                lock(&self.directory).retain_owned_in(piece, |id| ring.owners(id, 2).contains(&me));
            tokio::task::yield_now().await;
        }
        if dropped > 0 {
            tracing::debug!(
                entries = dropped,
                "directory entries handed over to their new owners"
            );
        }
    }

    /// What this member says about itself in heartbeats, as last refreshed.
    pub(crate) fn info(&self) -> MemberInfo {
        lock(&self.info).clone()
    }

    /// Refreshes [`Cluster::info`] (on the cluster's thread: it asks the
    /// store, whose lock a busy store may hold for a while; the heartbeat
    /// thread never waits for it).
    pub(crate) fn refresh_info(&self) {
        let info = self.my_info();
        *lock(&self.info) = info;
    }

    /// How often members send heartbeats (`--heartbeat-interval`).
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat
    }

    /// The status for `ferroplasma cluster status`.
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
        // Each taken on its own: a guard in the literal below would hold the
        // directory while `updates_pending` takes the store's lock.
        let directory_entries = lock(&self.directory).len() as u64;
        let updates_pending = self.store.updates_pending() as u64;
        let ids_claimed_ahead = lock(&self.fresh).len() as u64;
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
            directory_entries,
            updates_pending,
            updates: c.updates.load(Ordering::Relaxed),
            ids_claimed_ahead,
        }
    }

    /// Whether `id` is a cached copy pulled from another member.
    pub fn is_cached(&self, id: &ObjectId) -> bool {
        lock(&self.cached).contains(id)
    }
}

//! The directory agent: the cluster's subscription to this store's seal and
//! delete events (and aborted creates), turned into `Update`s for each id's
//! owner and backup, in order, in batches. After a membership change it
//! re-registers everything this store holds with the (new) owners.
//!
//! No update is dropped: the store queues the agent's notices without
//! bound, updates go out in pieces of at most [`MAX_OPS`] operations, and
//! one an owner did not take is retried (exponential backoff with jitter)
//! for as long as that owner is alive; once it is declared dead, the
//! re-registration with the new owners covers what it missed.

use crate::cluster::Cluster;
use crate::directory::ring::Ring;
use crate::pb;
use crate::peers::retry;
use crate::sync::lock;
use crate::transfer::copies::Copies;
use crate::wire::MAX_OPS;
use backon::Retryable;
use ferroplasma_protocol::ObjectId;
use ferroplasma_store::{EventKind, Notice};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Most events folded into one round of updates.
const BATCH: usize = 4096;

/// How long after one update the next may go out when it only announces
/// cached copies. A reader that pulls objects one at a time (each get a
/// batch of one) would otherwise send the ids' owners an update per get,
/// and each update's work (gRPC on both members) would land right when its
/// next get wants the cores; held back, a stream of gets announces its
/// copies in one update per [`LINGER`] (2–3 ms: tokio's timers tick each
/// millisecond). An update that is not about cached copies alone (a new
/// object, a deletion, an abort) goes out at once, and takes the held-back
/// announcements with it; so does the first after a quiet spell. Nothing
/// waits on the announcement of a copy: until it arrives, other members
/// pull from the copies the directory already knows. A delete meanwhile
/// does not know of the copy; the late announcement finds the entry gone
/// (or deleted) and the copy is refused and dropped (docs/cluster.md, and
/// its limits for an id created again within that window).
pub const LINGER: Duration = Duration::from_millis(2);

/// Runs until the store drops the subscription.
pub async fn run(cluster: Arc<Cluster>, mut events: mpsc::UnboundedReceiver<Notice>) {
    // When the last update went out (for the linger of cached copies).
    let mut last_sent: Option<Instant> = None;
    loop {
        let first = tokio::select! {
            n = events.recv() => match n {
                Some(n) => n,
                None => return,
            },
            _ = cluster.rejoin.notified() => {
                reregister(&cluster).await;
                continue;
            }
        };
        let mut batch = vec![first];
        take_waiting(&mut events, &mut batch);
        if let Some(at) = last_sent {
            if only_cached_copies(&cluster.cached, &batch) {
                linger(&cluster.cached, &mut events, &mut batch, at + LINGER).await;
            }
        }
        let (ops, ids) = plan(&cluster, batch);
        if !ops.is_empty() {
            last_sent = Some(Instant::now());
        }
        send(&cluster, ops, None).await;
        // Sent (or their owner died): claims of these ids may go on.
        cluster.store.updates_sent(&ids);
        cluster.updates_sent.notify_waiters();
    }
}

/// Adds the notices already queued to `batch`, up to [`BATCH`].
fn take_waiting(events: &mut mpsc::UnboundedReceiver<Notice>, batch: &mut Vec<Notice>) {
    while batch.len() < BATCH {
        match events.try_recv() {
            Ok(n) => batch.push(n),
            Err(_) => break,
        }
    }
}

/// Whether `n` is the seal of a copy this member pulled from another.
fn is_cached_seal(cached: &Copies, n: &Notice) -> bool {
    matches!(n, Notice::Event(e) if e.kind == EventKind::Sealed && cached.contains(&e.id))
}

/// Whether every notice of `batch` is the seal of a cached copy (or needs
/// no update at all).
fn only_cached_copies(cached: &Mutex<Copies>, batch: &[Notice]) -> bool {
    let cached = lock(cached);
    batch
        .iter()
        .all(|n| is_cached_seal(&cached, n) || matches!(n, Notice::Sealed(_) | Notice::Restored(_)))
}

/// Adds to `batch` what comes until `until`, or until a notice comes that
/// is not a cached copy's seal, or the batch is full.
async fn linger(
    cached: &Mutex<Copies>,
    events: &mut mpsc::UnboundedReceiver<Notice>,
    batch: &mut Vec<Notice>,
    until: Instant,
) {
    while batch.len() < BATCH {
        let Ok(Some(n)) = tokio::time::timeout_at(until, events.recv()).await else {
            // Time is up, or the store is gone (the next `recv` ends the
            // agent once this batch is sent).
            return;
        };
        let from = batch.len();
        batch.push(n);
        take_waiting(events, batch);
        if !only_cached_copies(cached, &batch[from..]) {
            return;
        }
    }
}

/// The updates a batch of notices makes, by member (each op goes to its
/// id's owner and backup), and the ids they are about. The shared books
/// (cached copies, claims, seal times, the ring) are each taken once for
/// the whole batch, and nothing is allocated per notice but its ops.
fn plan(cluster: &Cluster, batch: Vec<Notice>) -> (BTreeMap<String, Vec<pb::Op>>, Vec<ObjectId>) {
    let mut ops: Vec<(ObjectId, pb::Op)> = Vec::with_capacity(batch.len());
    let mut unclaimed: Vec<ObjectId> = Vec::new();
    {
        let mut cached = lock(&cluster.cached);
        for n in batch {
            let cached_seal = is_cached_seal(&cached, &n);
            let (kind, id, data_size, metadata_size) = match n {
                Notice::Event(e) => {
                    let kind = match e.kind {
                        EventKind::Sealed if cached_seal => pb::OpKind::SealedCached,
                        EventKind::Sealed => {
                            // Its claim is now the sealed object's.
                            unclaimed.push(e.id);
                            pb::OpKind::SealedPrimary
                        }
                        EventKind::Deleted => {
                            cached.dropped(&e.id);
                            pb::OpKind::Dropped
                        }
                    };
                    (kind, e.id, e.data_size, e.metadata_size)
                }
                Notice::Aborted(id) => {
                    unclaimed.push(id);
                    (pb::OpKind::Aborted, id, 0, 0)
                }
                Notice::Sealed(_) | Notice::Restored(_) => continue,
            };
            let op = pb::Op {
                kind: kind as i32,
                object_id: id.0.to_vec(),
                data_size,
                metadata_size,
                version: 0,
            };
            ops.push((id, op));
        }
    }
    if !unclaimed.is_empty() {
        let mut granted = lock(&cluster.granted);
        for id in &unclaimed {
            granted.remove(id);
        }
    }
    let primary = |op: &pb::Op| op.kind == pb::OpKind::SealedPrimary as i32;
    if ops.iter().any(|(_, op)| primary(op)) {
        // A primary copy's version: when it was sealed (0 if gone).
        let asked: Vec<ObjectId> = (ops.iter())
            .filter(|(_, op)| primary(op))
            .map(|(id, _)| *id)
            .collect();
        let mut sealed = cluster.store.sealed_at(&asked).into_iter();
        for (_, op) in ops.iter_mut().filter(|(_, op)| primary(op)) {
            op.version = sealed.next().flatten().map_or(0, |t| t.max(0) as u64);
        }
    }
    let ids = ops.iter().map(|(id, _)| *id).collect();
    let ring = lock(&cluster.ring);
    let mut by_member = BTreeMap::new();
    for (id, op) in ops {
        route(&mut by_member, &ring, &id, op);
    }
    (by_member, ids)
}

/// Adds `op` to the updates of `id`'s owner and backup in `ring`.
fn route(ops: &mut BTreeMap<String, Vec<pb::Op>>, ring: &Ring, id: &ObjectId, op: pb::Op) {
    let owners = ring.owners(id, 2);
    let Some((last, rest)) = owners.split_last() else {
        return;
    };
    let mut add = |member: &str, op: pb::Op| match ops.get_mut(member) {
        Some(v) => v.push(op),
        None => {
            ops.insert(member.to_string(), vec![op]);
        }
    };
    for member in rest {
        add(member, op.clone());
    }
    add(last, op);
}

/// Sends each member its ops (all members at once) and drops the local
/// copies the directory refused (deleted while they were being pulled).
/// A re-registration (`rejoin`: the ring's fingerprint) ends, for each
/// member, with an update saying that this member has now sent it all it
/// holds for that ring (an empty one for a member it has nothing for).
async fn send(cluster: &Arc<Cluster>, ops: BTreeMap<String, Vec<pb::Op>>, rejoin: Option<u64>) {
    let mut tasks = tokio::task::JoinSet::new();
    for (target, ops) in ops {
        let c = cluster.clone();
        tasks.spawn(async move {
            let mut refused = Vec::new();
            let pieces: Vec<&[pb::Op]> = if ops.is_empty() {
                vec![&[]]
            } else {
                ops.chunks(MAX_OPS).collect()
            };
            let last = pieces.len() - 1;
            for (i, piece) in pieces.into_iter().enumerate() {
                let synced = if i == last { rejoin.unwrap_or(0) } else { 0 };
                match deliver(&c, &target, piece, rejoin.is_some(), synced).await {
                    Ok(ids) => refused.extend(ids),
                    Err(e) => return (target, Err(e)),
                }
            }
            (target, Ok(refused))
        });
    }
    let mut refused: Vec<ObjectId> = Vec::new();
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok((_, Ok(ids))) => refused.extend(ids),
            Ok((target, Err(e))) => {
                tracing::debug!(member = %target, error = %e, "directory update not delivered")
            }
            Err(e) => tracing::error!(error = %e, "directory update task failed"),
        }
    }
    if !refused.is_empty() {
        tracing::debug!(
            n = refused.len(),
            "dropping cached copies of deleted objects"
        );
        cluster.drop_local(&refused);
    }
}

/// Sends one update to `target`, retrying while it is alive.
async fn deliver(
    c: &Arc<Cluster>,
    target: &str,
    ops: &[pb::Op],
    rejoin: bool,
    synced_ring: u64,
) -> Result<Vec<ObjectId>, tonic::Status> {
    if target == c.me {
        // This member's own directory: applied in place (no copy of the
        // ops, nothing to retry).
        return Ok(c.apply_update(&c.me, ops, rejoin, synced_ring));
    }
    let backoff = retry::builder(Duration::from_millis(20), Duration::from_secs(1));
    let refused = (|| c.update_at(target, &c.me, ops.to_vec(), rejoin, synced_ring))
        .retry(backoff)
        .when(|e| {
            let alive = target == c.me || lock(&c.membership).is_alive(target);
            if alive {
                tracing::debug!(member = %target, error = %e, "directory update not taken; retrying");
            }
            alive
        })
        .await?;
    c.counters.updates.fetch_add(1, Ordering::Relaxed);
    Ok(refused)
}

/// Re-registration pieces in flight at once, per member of the ring.
const IN_FLIGHT: usize = 4;

/// Tells the current owners of every local object (and unsealed claim)
/// that this member holds it, then tells every member that it has: until
/// each member has, a directory grants no new claim.
///
/// The objects go a piece of [`MAX_OPS`] at a time, up to [`IN_FLIGHT`]
/// pieces per member at once: the ops of a million objects are never all
/// in memory, no lock is held across pieces, and the cluster's thread runs
/// its other tasks between them.
async fn reregister(cluster: &Arc<Cluster>) {
    // The ring to register for, fixed for the whole round: if it changes
    // meanwhile, another round follows (the agent was notified again).
    let (ring, fingerprint) = {
        let d = lock(&cluster.directory);
        (lock(&cluster.ring).clone(), d.ring())
    };
    let (list, mut claims) = {
        // Under the store's lock, so that a create that lands now is either
        // in the list or still a granted claim (re-claimed below).
        let mut granted = lock(&cluster.granted);
        let list = cluster.store.list(Some(&mut granted));
        (list, granted.iter().copied().collect::<Vec<_>>())
    };
    claims.extend(
        (list.iter())
            .filter(|o| {
                !o.delete_pending
                    && matches!(o.state, ferroplasma_store::ObjectState::Created { .. })
            })
            .map(|o| o.id),
    );
    tracing::debug!(
        objects = list.len(),
        claims = claims.len(),
        ring = fingerprint,
        "re-registering with the directory"
    );
    for id in claims {
        if let Err(e) = cluster.claim_unordered(id, true).await {
            tracing::debug!(%id, error = %e.message, "re-claim failed");
        }
    }
    let mut pieces = tokio::task::JoinSet::new();
    let mut failed: Vec<String> = Vec::new();
    let mut refused: Vec<ObjectId> = Vec::new();
    let window = IN_FLIGHT * ring.members().len().max(1);
    for chunk in list.chunks(MAX_OPS) {
        let mut ops: BTreeMap<String, Vec<pb::Op>> = BTreeMap::new();
        {
            let cached = lock(&cluster.cached);
            for o in chunk {
                if o.delete_pending
                    || matches!(o.state, ferroplasma_store::ObjectState::Created { .. })
                {
                    continue;
                }
                let kind = if cached.contains(&o.id) {
                    pb::OpKind::SealedCached
                } else {
                    pb::OpKind::SealedPrimary
                };
                let sealed = o.create_time_us + o.construct_duration_us.unwrap_or(0);
                let op = pb::Op {
                    kind: kind as i32,
                    object_id: o.id.0.to_vec(),
                    data_size: o.location.data_size,
                    metadata_size: o.location.metadata_size,
                    version: sealed.max(0) as u64,
                };
                route(&mut ops, &ring, &o.id, op);
            }
        }
        for (target, ops) in ops {
            if failed.contains(&target) {
                continue;
            }
            let c = cluster.clone();
            pieces.spawn(async move {
                let r = deliver(&c, &target, &ops, true, 0).await;
                (target, r)
            });
        }
        while pieces.len() >= window {
            take_piece(&mut pieces, &mut refused, &mut failed).await;
        }
        tokio::task::yield_now().await;
    }
    drop(list);
    while !pieces.is_empty() {
        take_piece(&mut pieces, &mut refused, &mut failed).await;
    }
    // Every piece taken: the marks, to every member (an empty update for
    // one this member holds nothing for).
    let marks: BTreeMap<String, Vec<pb::Op>> = (ring.members().iter())
        .filter(|m| !failed.contains(m))
        .map(|m| (m.clone(), Vec::new()))
        .collect();
    send(cluster, marks, Some(fingerprint)).await;
    if !refused.is_empty() {
        tracing::debug!(
            n = refused.len(),
            "dropping cached copies of deleted objects"
        );
        cluster.drop_local(&refused);
    }
}

/// Waits for one re-registration piece: its refused ids, or its member
/// (which died meanwhile) among the failed ones.
async fn take_piece(
    pieces: &mut tokio::task::JoinSet<(String, Result<Vec<ObjectId>, tonic::Status>)>,
    refused: &mut Vec<ObjectId>,
    failed: &mut Vec<String>,
) {
    match pieces.join_next().await {
        Some(Ok((_, Ok(ids)))) => refused.extend(ids),
        Some(Ok((target, Err(e)))) => {
            tracing::debug!(member = %target, error = %e, "re-registration not delivered");
            if !failed.contains(&target) {
                failed.push(target);
            }
        }
        Some(Err(e)) => tracing::error!(error = %e, "re-registration task failed"),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, id: ObjectId) -> Notice {
        Notice::Event(ferroplasma_store::Event {
            kind,
            id,
            data_size: 1000,
            metadata_size: 0,
        })
    }

    /// Cached copies' seals wait out the linger together; any other news
    /// ends it at once, taking them along, in order. (Tokio's timers tick
    /// each millisecond, so the test's steps are whole milliseconds and
    /// its linger longer than [`LINGER`].)
    #[tokio::test(start_paused = true)]
    async fn a_linger_gathers_cached_seals_and_ends_at_other_news() {
        let ms = Duration::from_millis;
        let ids: Vec<ObjectId> = (0..4).map(|_| ObjectId::random()).collect();
        let mut copies = Copies::default();
        copies.landed(ids[..3].iter().copied());
        let cached = Mutex::new(copies);
        let (tx, mut rx) = mpsc::unbounded_channel();

        // Only copies: all gathered, until the linger is over.
        let started = Instant::now();
        let feed = tx.clone();
        let copies = [ids[1], ids[2]];
        tokio::spawn(async move {
            for id in copies {
                tokio::time::sleep(ms(1)).await;
                let _ = feed.send(event(EventKind::Sealed, id));
            }
        });
        let mut batch = vec![event(EventKind::Sealed, ids[0])];
        assert!(only_cached_copies(&cached, &batch));
        linger(&cached, &mut rx, &mut batch, started + ms(5)).await;
        assert_eq!(started.elapsed(), ms(5), "held for the whole linger");
        assert_eq!(batch.len(), 3, "every copy gathered");

        // A new object's seal, a deletion or an abort ends it at once.
        for urgent in [
            event(EventKind::Sealed, ids[3]),
            event(EventKind::Deleted, ids[0]),
            Notice::Aborted(ids[3]),
        ] {
            let started = Instant::now();
            let feed = tx.clone();
            let copy = ids[1];
            tokio::spawn(async move {
                tokio::time::sleep(ms(1)).await;
                let _ = feed.send(event(EventKind::Sealed, copy));
                tokio::time::sleep(ms(1)).await;
                let _ = feed.send(urgent);
            });
            let mut batch = vec![event(EventKind::Sealed, ids[2])];
            linger(&cached, &mut rx, &mut batch, started + ms(5)).await;
            assert_eq!(
                started.elapsed(),
                ms(2),
                "ended by the news that is not a copy's"
            );
            assert_eq!(batch.len(), 3, "the copies go with it");
            assert!(!only_cached_copies(&cached, &batch));
        }

        // The store gone: the linger ends with what it has.
        drop(tx);
        let started = Instant::now();
        let mut batch = vec![event(EventKind::Sealed, ids[0])];
        linger(&cached, &mut rx, &mut batch, started + ms(5)).await;
        assert_eq!(started.elapsed(), ms(0));
        assert_eq!(batch.len(), 1);
    }

    /// The kinds of the ops `plan` makes of `batch` for the lone member.
    fn kinds(c: &Cluster, batch: Vec<Notice>) -> Vec<pb::OpKind> {
        let (ops, _) = plan(c, batch);
        (ops.values().flatten())
            .map(|op| pb::OpKind::try_from(op.kind).expect("a kind"))
            .collect()
    }

    /// A copy evicted and pulled again before the agent has heard of the
    /// eviction is still a copy when its new seal is announced (it was
    /// announced as a new object, a primary, which would have made the
    /// directory take the real holders for stale); an object created
    /// here once the copy's deletion is handled is a primary.
    #[test]
    fn a_copy_pulled_again_before_its_eviction_is_heard_stays_a_copy() {
        let rt = crate::testkit::runtime();
        let c = crate::testkit::member(
            &rt,
            vec![],
            Duration::from_millis(50),
            Duration::from_secs(2),
        );
        let x = ObjectId::random();
        let land = |c: &Cluster| lock(&c.cached).landed([x]);
        land(&c);
        assert_eq!(
            kinds(&c, vec![event(EventKind::Sealed, x)]),
            [pb::OpKind::SealedCached]
        );
        // Evicted, then pulled again: both before the agent plans the eviction.
        land(&c);
        assert_eq!(
            kinds(
                &c,
                vec![event(EventKind::Deleted, x), event(EventKind::Sealed, x)]
            ),
            [pb::OpKind::Dropped, pb::OpKind::SealedCached]
        );
        assert_eq!(
            kinds(&c, vec![event(EventKind::Deleted, x)]),
            [pb::OpKind::Dropped]
        );
        assert!(!c.is_cached(&x));
        assert_eq!(
            kinds(&c, vec![event(EventKind::Sealed, x)]),
            [pb::OpKind::SealedPrimary]
        );
    }

    fn op(id: &ObjectId) -> pb::Op {
        pb::Op {
            kind: pb::OpKind::SealedCached as i32,
            object_id: id.0.to_vec(),
            data_size: 1000,
            ..Default::default()
        }
    }

    #[test]
    fn each_op_goes_to_its_owner_and_backup_in_order() {
        let ring = Ring::new(["a:1", "b:1", "c:1"]);
        let ids: Vec<ObjectId> = (0..3000).map(|_| ObjectId::random()).collect();
        let mut ops = BTreeMap::new();
        for id in &ids {
            route(&mut ops, &ring, id, op(id));
        }
        for member in ring.members() {
            let want: Vec<Vec<u8>> = (ids.iter())
                .filter(|id| ring.owners(id, 2).contains(&member.as_str()))
                .map(|id| id.0.to_vec())
                .collect();
            let got: Vec<Vec<u8>> = ops[member].iter().map(|o| o.object_id.clone()).collect();
            assert_eq!(got, want, "{member}'s updates");
        }
        let sent: usize = ops.values().map(Vec::len).sum();
        assert_eq!(sent, 2 * ids.len());
    }

    #[test]
    fn routing_a_batch_allocates_only_the_ops_it_sends() {
        // A batch of seals (a remote get lands thousands at once) is routed
        // to owners and backups without allocating per id: no member name,
        // no list of owners. What is left is the id each op carries and the
        // growth of each member's list.
        let ring = Ring::new(["a:1", "b:1", "c:1"]);
        let n = 10_000u64;
        let batch: Vec<(ObjectId, pb::Op)> = (0..n)
            .map(|_| {
                let id = ObjectId::random();
                (id, op(&id))
            })
            .collect();
        let mut ops = BTreeMap::new();
        let counted = allocation_counter::measure(|| {
            for (id, op) in batch {
                route(&mut ops, &ring, &id, op);
            }
        });
        // One op per id was given; the second copy of each is the only
        // allocation per id (log-many more for the lists and one name per
        // member).
        let per_member = 64 - n.leading_zeros() as u64;
        let most = n + 3 * (per_member + 2);
        assert!(
            counted.count_total <= most,
            "{} allocations routing {n} ops (at most {most})",
            counted.count_total
        );
        assert_eq!(ops.values().map(Vec::len).sum::<usize>(), 2 * n as usize);
    }
}

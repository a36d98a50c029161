//! [`Session`]: one connection to a store, shared by a client's clones and
//! every buffer it handed out: the mapped arena, the reply multiplexer that
//! lets threads have requests in flight at once, and the writing of
//! releases (booked in `releases`).

use crate::connection::Conn;
use crate::creators::CreatorRelease;
use crate::error::{ClientError, Result};
use crate::mapping::Mapping;
use crate::releases::{Releases, RELEASE_DELAY};
use crate::shared_table::{TableView, Tables};
use crate::trust::Trust;
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::ObjectId;
use memmap2::MmapOptions;
use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// Shared by a client and every buffer it handed out.
#[derive(Debug)]
pub(crate) struct Session {
    /// The socket's read side; held by the one thread reading replies.
    conn: Mutex<Conn>,
    /// Replies read by one thread for another (see `call`).
    replies: Mutex<Replies>,
    replies_ready: Condvar,
    pub(crate) mapping: Mapping,
    pid: u32,
    fork_generation: u64,
    pub(crate) capacity: u64,
    pub(crate) max_inline: u64,
    pub(crate) socket: PathBuf,
    /// The store owners this client accepts (for its subscriptions too).
    pub(crate) trust: Trust,
    /// This client's user may only read: the arena is mapped read-only.
    pub(crate) read_only: bool,
    /// The socket's write side: requests and releases. Held only while
    /// writing, so a release never waits behind a blocking get.
    writer: Mutex<UnixStream>,
    /// References held and releases not sent yet.
    pub(crate) releases: Releases,
    /// The store's object table in shared memory (gets without a round
    /// trip), if it publishes one.
    pub(crate) table: Option<Tables>,
    /// Writes without a round trip: set up at the first small create
    /// (`None` inside when the store does not offer them).
    fast: std::sync::OnceLock<Option<crate::fast_writes::FastWriter>>,
    /// The store is a cluster member: only ids it handed out
    /// ([`crate::Client::new_id`]) are created through the ring.
    pub(crate) cluster_member: bool,
    /// Ids the store handed out (on a cluster member).
    pub(crate) fresh: Mutex<FreshIds>,
}

/// Ids for new objects this client holds (`Client::new_id`): drawn ahead
/// at random on a lone store, handed out by the store on a cluster member.
#[derive(Debug, Default)]
pub(crate) struct FreshIds {
    /// Not given out yet.
    pub(crate) stock: Vec<ObjectId>,
    /// A cluster member's, given out by `new_id` and not created yet.
    pub(crate) issued: std::collections::HashSet<ObjectId, ferroplasma_protocol::IdHasher>,
}

/// Replies in flight between threads sharing one session.
#[derive(Debug, Default)]
struct Replies {
    next_id: u64,
    /// Replies read by another thread, by request id.
    done: HashMap<u64, pb::Reply>,
    /// A thread is reading the socket now.
    reading: bool,
    /// Threads waiting for another to read their reply.
    waiting: usize,
    /// The connection broke: every waiter gets this error.
    broken: Option<(std::io::ErrorKind, String)>,
    /// Calls abandoned after a signal: their replies are dropped when they
    /// come (with the ids a get asked for, whose references go back).
    abandoned: HashMap<u64, Option<Vec<u8>>>,
}

impl Session {
    /// Connects to the store at `path`, handshakes and maps its memory.
    pub(crate) fn open(path: PathBuf, trust: Trust) -> Result<Self> {
        let name = format!("rust pid {}", std::process::id());
        let hs = Conn::open(&path, &name, &trust)?;
        let arena = hs
            .reply
            .arenas
            .first()
            .ok_or_else(|| ClientError::Protocol("the store announced no arena".into()))?;
        let mut fds = hs.fds.into_iter();
        let fd = fds
            .next()
            .ok_or_else(|| ClientError::Protocol("the store sent no arena descriptor".into()))?;
        let table = match (hs.reply.table_slots, fds.next(), fds.next()) {
            // A table that cannot be mapped is not fatal: every operation
            // then asks the store.
            (n, Some(table), Some(holds)) if n > 0 => TableView::map(table, holds, n)
                .ok()
                .map(|v| Tables::new(v, hs.reply.client_id, hs.reply.table_token.clone())),
            _ => None,
        };
        let file = File::from(fd);
        // The descriptor is a memfd or an unlinked file owned by the store; it
        // is never truncated while the store runs, so the mapped range stays
        // backed (see the Safety notes in `buffer`).
        let read_only = hs.reply.read_only;
        let mut options = MmapOptions::new();
        options.len(arena.size as usize);
        let map = if read_only {
            options.map_raw_read_only(&file)
        } else {
            options.map_raw(&file)
        }
        .map_err(|e| ClientError::Protocol(format!("cannot map the store's memory: {e}")))?;
        // 2 MiB pages where the kernel allows them for shared memory (see
        // the store's arena): fewer page faults on large objects. Only a hint.
        let _ = map.advise(memmap2::Advice::HugePage);
        let writer = hs
            .conn
            .stream()
            .try_clone()
            .map_err(ClientError::Disconnected)?;
        Ok(Self {
            writer: Mutex::new(writer),
            conn: Mutex::new(hs.conn),
            replies: Mutex::new(Replies::default()),
            replies_ready: Condvar::new(),
            mapping: Mapping::new(map),
            pid: std::process::id(),
            fork_generation: crate::fork::generation(),
            capacity: hs.reply.capacity,
            max_inline: hs.reply.max_inline_size,
            socket: path,
            trust,
            read_only,
            releases: Releases::default(),
            table,
            fast: std::sync::OnceLock::new(),
            cluster_member: hs.reply.cluster_member,
            fresh: Mutex::default(),
        })
    }

    /// The socket this session is connected to.
    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends a request (after any deferred releases, in the same write) and
    /// waits for its reply.
    ///
    /// Threads sharing the session may have requests in flight at once (the
    /// store answers a later request while an earlier get waits): whichever
    /// waiting thread finds nobody reading reads the next reply and hands it
    /// to its owner, so a thread blocked in a long get holds up no other.
    pub(crate) fn call(&self, body: request::Body) -> Result<reply::Body> {
        self.check_pid()?;
        let id = {
            let mut r = self.lock_replies();
            r.next_id += 1;
            r.next_id
        };
        let asked = match &body {
            request::Body::Get(g) => Some(g.object_ids.clone()),
            _ => None,
        };
        // Requests the store answers at once are waited for by looking at
        // the socket first (`crate::spin`); one that may wait is not.
        let spin = match &body {
            request::Body::Get(g) if g.timeout_ms != 0 => Duration::ZERO,
            request::Body::Create(c) if c.wait_ms != 0 => Duration::ZERO,
            _ => crate::spin::configured(),
        };
        let frame = ferroplasma_protocol::frame::encode_frame(&pb::Request {
            request_id: id,
            body: Some(body),
        });
        self.write_frames(&frame)?;
        let mut r = self.lock_replies();
        loop {
            if let Some(reply) = r.done.remove(&id) {
                return unwrap_reply(reply);
            }
            if let Some((kind, msg)) = &r.broken {
                return Err(ClientError::Disconnected(std::io::Error::new(
                    *kind,
                    msg.clone(),
                )));
            }
            if r.reading {
                r.waiting += 1;
                r = self
                    .replies_ready
                    .wait(r)
                    .unwrap_or_else(|p| p.into_inner());
                r.waiting -= 1;
                continue;
            }
            r.reading = true;
            drop(r);
            let read = self.lock_conn().read_reply(spin);
            r = self.lock_replies();
            r.reading = false;
            if r.waiting > 0 {
                self.replies_ready.notify_all();
            }
            match read {
                Ok(reply) if reply.request_id == id => return unwrap_reply(reply),
                Ok(reply) if reply.request_id == 0 => {
                    // Not an answer to anyone: an error about the stream
                    // itself, sent before the store closes the connection.
                    let msg = match reply.body {
                        Some(reply::Body::Error(e)) => e.message,
                        _ => "unexpected frame from the store".into(),
                    };
                    r.broken = Some((std::io::ErrorKind::InvalidData, msg.clone()));
                    return Err(ClientError::Protocol(msg));
                }
                Ok(reply) => match r.abandoned.remove(&reply.request_id) {
                    Some(asked) => self.drop_abandoned(reply, asked),
                    None => {
                        r.done.insert(reply.request_id, reply);
                    }
                },
                Err(e) if e.is_signal() => {
                    if crate::interrupt::abandon() {
                        r.abandoned.insert(id, asked);
                        return Err(ClientError::Interrupted);
                    }
                }
                Err(e) => {
                    r.broken = Some((std::io::ErrorKind::BrokenPipe, e.to_string()));
                    return Err(e);
                }
            }
        }
    }

    /// The late reply of an abandoned call: the references a get reply
    /// carries go back with the next request.
    fn drop_abandoned(&self, reply: pb::Reply, asked: Option<Vec<u8>>) {
        let (Some(reply::Body::Get(g)), Some(asked)) = (reply.body, asked) else {
            return;
        };
        let ids = ferroplasma_protocol::unpack_ids(&asked).unwrap_or_default();
        let found: Vec<ObjectId> = ids
            .into_iter()
            .zip(g.results)
            .filter(|(_, r)| r.location.is_some())
            .map(|(id, _)| id)
            .collect();
        if self.releases.defer(found) {
            // No flusher here: they go with the next request.
            self.releases.flusher_not_started();
        }
    }

    /// Writes any deferred releases, then `frames`, in one write.
    pub(crate) fn write_frames(&self, frames: &[u8]) -> Result<()> {
        let ids = self.releases.take_deferred();
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let r = if ids.is_empty() {
            if frames.is_empty() {
                return Ok(());
            }
            w.write_all(frames)
        } else {
            // One Release per MAX_IDS_PER_REQUEST ids (the store's limit).
            let mut out = Vec::new();
            for chunk in ids.chunks(ferroplasma_protocol::frame::MAX_IDS_PER_REQUEST) {
                out.extend(ferroplasma_protocol::frame::encode_frame(&pb::Request {
                    request_id: 0,
                    body: Some(request::Body::Release(pb::Release {
                        object_ids: ferroplasma_protocol::pack_ids(chunk),
                    })),
                }));
            }
            out.extend_from_slice(frames);
            w.write_all(&out)
        };
        r.map_err(ClientError::Disconnected)
    }

    /// Writes without a round trip, if this client may create and the
    /// store offers them (asked once, at the first small create).
    pub(crate) fn fast_writer(&self) -> Option<&crate::fast_writes::FastWriter> {
        if self.read_only || self.table.is_none() {
            return None;
        }
        self.fast
            .get_or_init(|| crate::fast_writes::FastWriter::open(self))
            .as_ref()
    }

    /// The fast writer, if it was set up (for buffers created through it).
    pub(crate) fn fast_writer_if_open(&self) -> Option<&crate::fast_writes::FastWriter> {
        self.fast.get().and_then(Option::as_ref)
    }

    /// `Forked` when used in a child process after `fork()`.
    pub(crate) fn check_pid(&self) -> Result<()> {
        if crate::fork::generation() != self.fork_generation {
            return Err(ClientError::Forked { parent: self.pid });
        }
        Ok(())
    }

    /// A pointer to `[offset, offset + len)` of the arena, checked.
    pub(crate) fn checked_ptr(&self, offset: u64, len: u64) -> Result<*mut u8> {
        self.mapping.ptr(offset, len).ok_or_else(|| {
            ClientError::Protocol(format!(
                "the store pointed at bytes {offset}..{} outside its {}-byte arena",
                offset.saturating_add(len),
                self.mapping.len()
            ))
        })
    }

    fn lock_replies(&self) -> MutexGuard<'_, Replies> {
        self.replies.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_conn(&self) -> MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl crate::fast_writes::Link for Session {
    fn call(&self, body: request::Body) -> Result<reply::Body> {
        Session::call(self, body)
    }

    fn checked_ptr(&self, offset: u64, len: u64) -> Result<*mut u8> {
        Session::checked_ptr(self, offset, len)
    }

    /// An empty `Release`, not answered: the store takes the rings in
    /// whenever it takes its lock.
    fn ring_doorbell(&self) -> Result<()> {
        let frame = ferroplasma_protocol::frame::encode_frame(&pb::Request {
            request_id: 0,
            body: Some(request::Body::Release(pb::Release {
                object_ids: Vec::new(),
            })),
        });
        self.write_frames(&frame)
    }
}

fn unwrap_reply(reply: pb::Reply) -> Result<reply::Body> {
    match reply.body {
        Some(reply::Body::Error(e)) => Err(e.into()),
        Some(b) => Ok(b),
        None => Err(ClientError::Protocol("empty reply".into())),
    }
}

impl Session {
    /// An explicit release of `id` (`Client::release`). Every reference
    /// this client holds belongs to a live buffer, which gives it back when
    /// dropped; ending one now would let the store reuse memory that buffer
    /// still reads. So this only checks that the client holds `id` (or
    /// created it).
    pub(crate) fn release_explicitly(self: &Arc<Self>, id: ObjectId) -> Result<()> {
        self.check_pid()?;
        match self.releases.creators().release(id) {
            CreatorRelease::BufferAlive | CreatorRelease::AlreadyEnded => Ok(()),
            CreatorRelease::NotCreator
                if self.releases.holds(id)
                    || self.table.as_ref().is_some_and(|f| f.holds_id(&id)) =>
            {
                Ok(())
            }
            CreatorRelease::NotCreator => Err(ClientError::NotHeld(id)),
        }
    }

    /// Releases these references now, in one message.
    pub(crate) fn release_now(self: &Arc<Self>, ids: Vec<ObjectId>) -> Result<()> {
        self.check_pid()?;
        let ids = self.releases.take_held_all(ids);
        self.defer_releases(ids);
        self.write_frames(&[])
    }

    /// From a buffer's drop: errors are dropped (after a fork, or when the
    /// store is gone, there is nobody to tell).
    pub(crate) fn release_quietly(self: &Arc<Self>, id: ObjectId) {
        if self.check_pid().is_ok() && self.releases.take_held(id) {
            self.defer_releases(vec![id]);
        }
    }

    /// From the drop of a buffer read through the shared table: gives its
    /// hold on `slot` back (and, if the store had adopted it, the reference
    /// over the socket).
    pub(crate) fn give_back_hold(self: &Arc<Self>, id: ObjectId, table: &TableView, slot: usize) {
        if self.check_pid().is_err() {
            return;
        }
        if table.give_back(slot) {
            self.defer_releases(vec![id]);
        }
    }

    /// The table that replaced `t` (the store rebuilt it for its object
    /// count), asked for on a second connection; `None` if `t` is in use.
    pub(crate) fn table_after(&self, t: &Arc<TableView>) -> Option<Arc<TableView>> {
        self.table.as_ref()?.replacement(t, |client, token| {
            Conn::attach_table(&self.socket, &self.trust, client, token)
        })
    }

    /// The store adopted a hold this client took and gave back at once:
    /// release the reference it became.
    pub(crate) fn release_adopted(self: &Arc<Self>, id: ObjectId) {
        self.defer_releases(vec![id]);
    }

    /// From the drop of the buffer of create `token`: gives the creator's
    /// reference back unless it already went (explicit release, abort) or
    /// belongs to a later object with the same id.
    pub(crate) fn release_creator(self: &Arc<Self>, id: ObjectId, token: u64) {
        if self.check_pid().is_ok() && self.releases.creators().buffer_dropped(id, token) {
            self.release_quietly(id);
        }
    }

    /// Queues releases for the next write; makes sure the flusher will send
    /// them within [`RELEASE_DELAY`] if no request comes first.
    fn defer_releases(self: &Arc<Self>, ids: Vec<ObjectId>) {
        if !self.releases.defer(ids) {
            return;
        }
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("ferroplasma-release".into())
            .spawn(move || flusher(weak));
        if spawned.is_err() {
            // No thread: send now instead.
            self.releases.flusher_not_started();
            let _ = self.write_frames(&[]);
        }
    }
}

/// Sends deferred releases that no request took along, at most
/// [`RELEASE_DELAY`] after they were deferred. Sleeps while there are none;
/// ends when the session is gone.
fn flusher(weak: Weak<Session>) {
    loop {
        let Some(session) = weak.upgrade() else {
            return;
        };
        while !session
            .releases
            .wait_for_deferred(Duration::from_millis(200))
        {
            if Arc::strong_count(&session) == 1 {
                return; // only this thread still knows the session
            }
        }
        drop(session);
        std::thread::sleep(RELEASE_DELAY);
        let Some(session) = weak.upgrade() else {
            return;
        };
        if session.check_pid().is_err() || session.write_frames(&[]).is_err() {
            return;
        }
    }
}

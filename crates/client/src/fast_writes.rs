//! Writes without a round trip, the client's side (docs/protocol.md,
//! "Writes without a round trip"; the protocol is
//! `ferroplasma_protocol::fast_writes`): small objects are allocated in a
//! range of the arena the store leased this client, and their create, seal
//! and abort are records in this client's ring that the store takes in the
//! next time it takes its lock. No message is sent unless the store must
//! decide (a bucket claimed, the store busy, an id the table cannot rule
//! out), a lease or the ring runs out, or someone waits for a seal (the
//! doorbell: one message, not waited for).

use crate::error::{ClientError, Result};
use ferroplasma_protocol::fast_writes::{
    self as fw, Area, Entry, Record, RingHeader, AREA_HEADER_BYTES, BUCKETS, LEASE_BYTES,
    MAX_FAST_OBJECT, RING_BYTES, RING_HEADER_BYTES, RING_RECORDS,
};
use ferroplasma_protocol::layout::{align_up, allocation_size};
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::ObjectId;
use std::sync::atomic::AtomicU32;
use std::sync::Mutex;

/// What the fast path needs of the connection (the session implements it).
pub(crate) trait Link {
    /// A request and its reply.
    fn call(&self, body: request::Body) -> Result<reply::Body>;
    /// A pointer to `[offset, offset + len)` of the arena, checked.
    fn checked_ptr(&self, offset: u64, len: u64) -> Result<*mut u8>;
    /// Tells the store to take the rings in now, without waiting.
    fn ring_doorbell(&self) -> Result<()>;
}

/// This client's ring, the store's area, and its leases.
#[derive(Debug)]
pub(crate) struct FastWriter {
    area: *const Area,
    buckets: *const AtomicU32,
    ring: *const RingHeader,
    records: *const Record,
    tag: u32,
    state: Mutex<Leases>,
}

// Safety: the pointers refer to the arena mapping, which the session that
// owns this writer keeps mapped; everything behind them is atomics.
unsafe impl Send for FastWriter {}
// Safety: as above; the mutable state is behind the mutex.
unsafe impl Sync for FastWriter {}

/// The leases this client allocates in.
#[derive(Debug, Default)]
struct Leases {
    /// The lease objects are allocated in now.
    current: Option<Lease>,
    /// Full leases with objects still being written.
    full: Vec<Lease>,
    /// Full leases with nothing being written: ended with the next request
    /// for a lease.
    done: Vec<u64>,
    /// When the store last had no room for a lease: creates go the slow
    /// way (which makes room, or says why) for a while.
    refused: Option<std::time::Instant>,
}

/// How long creates go the slow way after the store had no room for a lease.
const LEASE_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

#[derive(Debug)]
struct Lease {
    start: u64,
    end: u64,
    next: u64,
    /// Objects created in it and not yet sealed or given up.
    writing: u32,
}

/// A create made on the fast path: where its data lies, and the lease it
/// was allocated in (given back to [`FastWriter::finished`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FastCreate {
    pub offset: u64,
    pub lease: u64,
}

impl FastWriter {
    /// Asks the store for a ring and a first lease; `None` when it does not
    /// offer writes without a round trip.
    pub(crate) fn open(session: &impl Link) -> Option<Self> {
        let g = lease(session, 0, Vec::new()).ok()?;
        let area = session
            .checked_ptr(g.area_offset, (AREA_HEADER_BYTES + 4 * BUCKETS) as u64)
            .ok()?;
        let ring = session.checked_ptr(g.ring_offset, RING_BYTES as u64).ok()?;
        if g.area_offset % 64 != 0 || g.ring_offset % 64 != 0 || g.tag == 0 {
            return None;
        }
        let current =
            (g.size > 0 && session.checked_ptr(g.offset, g.size).is_ok()).then_some(Lease {
                start: g.offset,
                end: g.offset + g.size,
                next: g.offset,
                writing: 0,
            });
        // Safety: the whole area was checked to lie inside the mapping
        // above, so the claims after its header do too.
        let buckets = unsafe { area.add(AREA_HEADER_BYTES) } as *const AtomicU32;
        // Safety: as above, for the ring and its records.
        let records = unsafe { ring.add(RING_HEADER_BYTES) } as *const Record;
        Some(Self {
            area: area as *const Area,
            buckets,
            ring: ring as *const RingHeader,
            records,
            tag: g.tag,
            state: Mutex::new(Leases {
                current,
                ..Leases::default()
            }),
        })
    }

    fn area(&self) -> &Area {
        // Safety: checked inside the arena mapping at `open` (kept alive by
        // the session that owns `self`); a `repr(C)` block of atomics.
        unsafe { &*self.area }
    }

    fn bucket(&self, id: &ObjectId) -> (usize, &AtomicU32) {
        let b = fw::bucket_of(id);
        // Safety: `BUCKETS` claims lie after the area's header (checked at
        // `open`); `b < BUCKETS`.
        (b, unsafe { &*self.buckets.add(b) })
    }

    fn ring(&self) -> (&RingHeader, &[Record]) {
        // Safety: the ring's `RING_BYTES` were checked inside the mapping at
        // `open`; header and records are `repr(C)` blocks of atomics.
        unsafe {
            (
                &*self.ring,
                std::slice::from_raw_parts(self.records, RING_RECORDS),
            )
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Leases> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Creates `id` without a round trip if it can: `Ok(None)` when it must
    /// go the slow way (too large, the bucket claimed, no room in a lease);
    /// `Err(ObjectExists)` when the store, asked, found the id taken.
    pub(crate) fn create(
        &self,
        session: &impl Link,
        id: ObjectId,
        data_size: u64,
        metadata_size: u64,
        in_table: impl FnOnce() -> Option<bool>,
    ) -> Result<Option<FastCreate>> {
        let need = align_up(allocation_size(data_size, metadata_size)).max(64);
        if need > MAX_FAST_OBJECT {
            return Ok(None);
        }
        let mut st = self.lock();
        let (ring, records) = self.ring();
        let mut closed = false;
        let offset = loop {
            if st.current.as_ref().is_none_or(|l| l.end - l.next < need) {
                if st.refused.is_some_and(|t| t.elapsed() < LEASE_BACKOFF) {
                    return Ok(None);
                }
                if let Some(old) = st.current.take() {
                    retire(&mut st, old);
                }
                let done = std::mem::take(&mut st.done);
                match lease(session, LEASE_BYTES, done) {
                    Ok(g) if g.size > 0 && session.checked_ptr(g.offset, g.size).is_ok() => {
                        st.current = Some(Lease {
                            start: g.offset,
                            end: g.offset + g.size,
                            next: g.offset,
                            writing: 0,
                        });
                        st.refused = None;
                    }
                    // No room for a lease: the slow way makes room, or says why.
                    _ => {
                        st.refused = Some(std::time::Instant::now());
                        return Ok(None);
                    }
                }
            }
            let lease = st.current.as_mut().expect("leased above");
            // Allocated where the store can see it: it may close the lease
            // to take its rest back (it needed the room), and then nothing
            // more goes in it.
            if fw::bump(ring, lease.next, need) {
                let at = lease.next;
                lease.next += need;
                break at;
            }
            let old = st.current.take().expect("leased above");
            retire(&mut st, old);
            if std::mem::replace(&mut closed, true) {
                return Ok(None);
            }
        };
        let (index, bucket) = self.bucket(&id);
        if !fw::claim(bucket, ring, index, self.tag) {
            // Its room stays unused until the lease ends.
            return Ok(None);
        }
        let lease = st.current.as_mut().expect("leased above");
        let e = Entry {
            kind: fw::CREATE,
            id,
            offset,
            data_size,
            metadata_size,
            time_us: fw::now_us(),
        };
        if !push(session, ring, records, &e) {
            fw::unclaim(bucket, ring, self.tag);
            return Ok(None);
        }
        lease.writing += 1;
        let start = lease.start;
        drop(st);
        fw::mark_dirty(self.area());
        if !fw::settled_alone(self.area(), in_table) {
            if let Err(e) = settle(session, id) {
                self.finished(start);
                return Err(e);
            }
        }
        Ok(Some(FastCreate {
            offset,
            lease: start,
        }))
    }

    /// Seals (`SEAL`) or gives up (`ABORT`) an object created with
    /// [`FastWriter::create`]; rings the doorbell if the store waits for
    /// seals.
    pub(crate) fn end(
        &self,
        session: &impl Link,
        id: ObjectId,
        kind: u64,
        lease: u64,
    ) -> Result<()> {
        let (ring, records) = self.ring();
        let e = Entry {
            kind,
            id,
            offset: 0,
            data_size: 0,
            metadata_size: 0,
            time_us: fw::now_us(),
        };
        {
            let _st = self.lock();
            if !push(session, ring, records, &e) {
                return Err(ClientError::Protocol(
                    "the store does not take in this client's ring".into(),
                ));
            }
        }
        self.finished(lease);
        fw::mark_dirty(self.area());
        if fw::should_ring(self.area()) {
            session.ring_doorbell()?;
        }
        Ok(())
    }

    /// An object of lease `start` is no longer being written (sealed,
    /// aborted, or its buffer dropped).
    pub(crate) fn finished(&self, start: u64) {
        let mut st = self.lock();
        if let Some(l) = st.current.as_mut().filter(|l| l.start == start) {
            l.writing = l.writing.saturating_sub(1);
            return;
        }
        if let Some(i) = st.full.iter().position(|l| l.start == start) {
            let l = &mut st.full[i];
            l.writing = l.writing.saturating_sub(1);
            if l.writing == 0 {
                let l = st.full.swap_remove(i);
                st.done.push(l.start);
            }
        }
    }
}

fn retire(st: &mut Leases, old: Lease) {
    if old.writing == 0 {
        st.done.push(old.start);
    } else {
        st.full.push(old);
    }
}

/// Pushes `e`; when the ring is full, asks the store to take it in (an
/// empty `Lease`: the store drains every ring when it takes its lock) and
/// tries once more.
fn push(session: &impl Link, ring: &RingHeader, records: &[Record], e: &Entry) -> bool {
    if fw::push(ring, records, e) {
        return true;
    }
    lease(session, 0, Vec::new()).is_ok() && fw::push(ring, records, e)
}

/// What a `Lease` request got.
struct Granted {
    offset: u64,
    size: u64,
    area_offset: u64,
    ring_offset: u64,
    tag: u32,
}

fn lease(session: &impl Link, size: u64, ended: Vec<u64>) -> Result<Granted> {
    let body = session.call(request::Body::Lease(pb::Lease {
        size,
        ended,
        // Allocations move the ring's lease_top (`FastWriter::create`).
        bumps_top: true,
    }))?;
    match body {
        reply::Body::Lease(l) => Ok(Granted {
            offset: l.offset,
            size: l.size,
            area_offset: l.area_offset,
            ring_offset: l.ring_offset,
            tag: l.tag,
        }),
        other => Err(ClientError::Protocol(format!(
            "unexpected reply to Lease: {other:?}"
        ))),
    }
}

fn settle(session: &impl Link, id: ObjectId) -> Result<()> {
    session
        .call(request::Body::Settle(pb::Settle {
            object_id: id.0.to_vec(),
        }))
        .map(drop)
}

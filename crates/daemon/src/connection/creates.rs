//! Creates: allocating (spilling to make room when a spill directory is
//! set), writing inline metadata and data, and creates that wait for space.

use super::{refuse, store_refusal, Connection, Refusal, Waitable};
use crate::convert;
use crate::shared::now_us;
use ferroplasma_protocol::frame::MAX_INLINE_SIZE;
use ferroplasma_protocol::pb::{self, reply};
use ferroplasma_protocol::ObjectId;
use ferroplasma_store::StoreError;
use std::time::Duration;
use tokio::time::Instant;

/// Creates one connection may have waiting for space at once.
pub const MAX_PARKED_CREATES: usize = 256;

/// What a parked create does once it has room.
#[derive(Debug)]
enum Then {
    /// Reply with the location (`Create`); `metadata` is written by the
    /// store, or `metadata_size` bytes by the creator.
    Locate {
        metadata: Vec<u8>,
        metadata_size: u64,
    },
    /// Write the data and metadata, seal, and keep no reference
    /// (`CreateAndSeal`).
    Seal { data: Vec<u8>, metadata: Vec<u8> },
}

/// A create waiting for space: asked to (`Create.wait_ms != 0`), or while
/// the store spills to make room for it.
#[derive(Debug)]
pub(super) struct PendingCreate {
    request_id: u64,
    pub(super) id: ObjectId,
    data_size: u64,
    then: Then,
    pub(super) deadline: Option<Instant>,
    /// Waits only while spills are under way (`wait_ms == 0`).
    only_for_spills: bool,
    /// The id is claimed cluster-wide: release the claim if the create fails.
    pub(super) claimed: bool,
}

impl PendingCreate {
    fn metadata_size(&self) -> u64 {
        match &self.then {
            Then::Locate { metadata_size, .. } => *metadata_size,
            Then::Seal { metadata, .. } => metadata.len() as u64,
        }
    }
}

impl Connection {
    /// A Create: allocates (waiting for space when asked, or while the
    /// store spills to make room).
    pub(super) fn create(
        &mut self,
        rid: u64,
        id: ObjectId,
        c: pb::Create,
        claimed: bool,
    ) -> Result<Option<reply::Body>, Refusal> {
        let p = PendingCreate {
            request_id: rid,
            id,
            data_size: c.data_size,
            then: Then::Locate {
                metadata: c.metadata,
                metadata_size: c.metadata_size,
            },
            deadline: (c.wait_ms > 0)
                .then(|| Instant::now() + Duration::from_millis(c.wait_ms as u64)),
            only_for_spills: c.wait_ms == 0,
            claimed,
        };
        self.create_or_park(p)
    }

    /// A CreateAndSeal: create, copy, seal, keep no reference.
    pub(super) fn create_and_seal(
        &mut self,
        rid: u64,
        id: ObjectId,
        c: pb::CreateAndSeal,
        claimed: bool,
    ) -> Result<Option<reply::Body>, Refusal> {
        let p = PendingCreate {
            request_id: rid,
            id,
            data_size: c.data.len() as u64,
            then: Then::Seal {
                data: c.data,
                metadata: c.metadata,
            },
            deadline: None,
            only_for_spills: true,
            claimed,
        };
        self.create_or_park(p)
    }

    fn create_or_park(&mut self, p: PendingCreate) -> Result<Option<reply::Body>, Refusal> {
        let mark = self.room_mark();
        let before = mark.1;
        match self.try_create(&p) {
            Ok(r) => r.map(Some),
            Err(Waitable(e)) if p.only_for_spills && !self.room_coming(before) => Err(Refusal(e)),
            Err(Waitable(_)) if self.creates.len() >= MAX_PARKED_CREATES => Err(refuse(
                pb::ErrorCode::TooManyWaiting,
                format!(
                    "{MAX_PARKED_CREATES} creates already wait for space on this connection \
                     (the limit): wait for some to finish"
                ),
            )),
            Err(Waitable(e)) => {
                tracing::debug!(client = self.client, id = %p.id, "create waits for space: {}", e.message);
                if self.creates.is_empty() {
                    // Room made from here on wakes it (creates parked
                    // before keep their older mark).
                    self.room_seen = mark;
                }
                self.creates.push(p);
                self.shared.lock().waiting_creates += 1;
                Ok(None)
            }
        }
    }

    fn spills_finished(&self) -> u64 {
        self.shared.lock().spills_finished
    }

    /// What changes when room may have come: memory freed or made
    /// evictable, and spill writes finished.
    fn room_mark(&self) -> (u64, u64) {
        let sh = self.shared.lock();
        (sh.store.room_made(), sh.spills_finished)
    }

    /// Whether room may come for a create that found none: spill segments
    /// are being written, or one was finished since `before` (the create
    /// then tries again on the loop's next turn).
    fn room_coming(&self, before: u64) -> bool {
        let sh = self.shared.lock();
        sh.spills_in_flight > 0 || sh.spills_finished != before
    }

    /// Creates an object (spilling others to make room, in the background).
    /// `Err(Waitable)` is a store-full refusal that waiting could cure;
    /// `Ok(Err)` any other refusal.
    fn try_create(&mut self, p: &PendingCreate) -> Result<Result<reply::Body, Refusal>, Waitable> {
        let (client, id, data_size, meta) = (self.client, p.id, p.data_size, p.metadata_size());
        let shared = self.shared.clone();
        let mut sh = self.shared.lock();
        let fits_at_all = data_size.saturating_add(meta) <= sh.store.capacity();
        // Spill only for a create that can succeed (not for a taken id).
        let room = if sh.store.exists(&id) {
            Ok(false)
        } else {
            sh.start_spill(&shared, data_size, meta)
        };
        let now = now_us();
        let created = room.and_then(|_| sh.store.create(client, id, data_size, meta, now));
        let (loc, mut fx) = match created {
            Ok(v) => v,
            Err(e @ (StoreError::StoreFull { .. } | StoreError::SpillFull { .. }))
                if fits_at_all =>
            {
                return Err(Waitable(convert::error(&e)));
            }
            Err(e) => return Ok(Err(store_refusal(e))),
        };
        let body = match &p.then {
            Then::Locate { metadata, .. } => {
                sh.arena.write(loc.metadata_offset(), metadata);
                reply::Body::Create(pb::CreateReply {
                    location: Some(convert::location(loc)),
                })
            }
            Then::Seal { data, metadata } => {
                sh.arena.write(loc.offset, data);
                sh.arena.write(loc.metadata_offset(), metadata);
                let sealed = sh.store.seal(client, id, now).and_then(|f| {
                    fx.extend(f);
                    sh.store.release(client, id)
                });
                match sealed {
                    Ok(f) => fx.extend(f),
                    Err(e) => {
                        sh.deliver(fx);
                        return Ok(Err(store_refusal(e)));
                    }
                }
                reply::Body::Ok(pb::Ok {})
            }
        };
        sh.deliver(fx);
        Ok(Ok(body))
    }

    /// Retries the creates waiting for space, in order; with `now`, also
    /// answers those whose wait ran out.
    /// Tries the parked creates again when room may have come since they
    /// last tried (`now` is `None`), or at a deadline (`now`): those whose
    /// deadline passed get their error.
    pub(super) fn retry_creates(&mut self, now: Option<Instant>) {
        if self.creates.is_empty() {
            return;
        }
        let mark = self.room_mark();
        if now.is_none() && mark == self.room_seen {
            return; // nothing freed: every one of them would fail again
        }
        self.room_seen = mark;
        let parked = std::mem::take(&mut self.creates);
        let before_len = parked.len();
        self.shared.lock().create_retries += before_len as u64;
        for p in parked {
            let before = self.spills_finished();
            match self.try_create(&p) {
                Ok(Ok(body)) => self.push_reply(p.request_id, body),
                Ok(Err(Refusal(e))) => {
                    if p.claimed {
                        self.unclaim(p.id);
                    }
                    self.push_reply(p.request_id, reply::Body::Error(e))
                }
                Err(Waitable(mut e)) => {
                    let timed_out = now.is_some_and(|n| p.deadline.is_some_and(|d| d <= n));
                    let no_more_room_coming = p.only_for_spills && !self.room_coming(before);
                    if timed_out || no_more_room_coming {
                        if p.claimed {
                            self.unclaim(p.id);
                        }
                        if timed_out {
                            e.message = format!("waited for space in vain: {}", e.message);
                        }
                        self.push_reply(p.request_id, reply::Body::Error(e));
                    } else {
                        self.creates.push(p);
                    }
                }
            }
        }
        self.shared.lock().waiting_creates -= before_len - self.creates.len();
    }
}

pub(super) fn check_inline(what: &str, len: usize) -> Result<(), Refusal> {
    if len as u64 > MAX_INLINE_SIZE {
        return Err(refuse(
            pb::ErrorCode::TooLarge,
            format!(
                "{what} of {len} bytes exceeds the inline limit of {MAX_INLINE_SIZE}; \
                 use Create + Seal for large objects"
            ),
        ));
    }
    Ok(())
}

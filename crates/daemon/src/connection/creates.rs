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

/// A create waiting for space (`Create.wait_ms != 0`).
#[derive(Debug)]
pub(super) struct PendingCreate {
    request_id: u64,
    id: ObjectId,
    data_size: u64,
    /// Metadata bytes the store writes (empty when the creator writes them).
    metadata: Vec<u8>,
    metadata_size: u64,
    pub(super) deadline: Option<Instant>,
    /// The id is claimed cluster-wide: release the claim if the create fails.
    claimed: bool,
}

impl Connection {
    /// A Create: allocates (waiting for space when asked).
    pub(super) fn create(
        &mut self,
        rid: u64,
        id: ObjectId,
        c: pb::Create,
        claimed: bool,
    ) -> Result<Option<reply::Body>, Refusal> {
        match self.try_create(id, c.data_size, c.metadata_size, &c.metadata) {
            Err(Waitable(_)) if c.wait_ms != 0 && self.creates.len() >= MAX_PARKED_CREATES => {
                Err(refuse(
                    pb::ErrorCode::TooLarge,
                    format!(
                        "{MAX_PARKED_CREATES} creates already wait for space on this connection \
                         (the limit): wait for some to finish"
                    ),
                ))
            }
            Err(Waitable(e)) if c.wait_ms != 0 => {
                tracing::debug!(client = self.client, %id, wait_ms = c.wait_ms, "create waits for space: {}", e.message);
                self.creates.push(PendingCreate {
                    request_id: rid,
                    id,
                    data_size: c.data_size,
                    metadata: c.metadata,
                    metadata_size: c.metadata_size,
                    deadline: (c.wait_ms > 0)
                        .then(|| Instant::now() + Duration::from_millis(c.wait_ms as u64)),
                    claimed,
                });
                Ok(None)
            }
            Err(Waitable(e)) => Err(Refusal(e)),
            Ok(r) => r.map(Some),
        }
    }

    /// A CreateAndSeal: a small object in one message.
    pub(super) fn create_and_seal(
        &mut self,
        id: ObjectId,
        c: pb::CreateAndSeal,
    ) -> Result<Option<reply::Body>, Refusal> {
        let client = self.client;
        let mut sh = self.shared.lock();
        let now = now_us();
        if !sh.store.exists(&id) {
            sh.spill_for(c.data.len() as u64, c.metadata.len() as u64)
                .map_err(store_refusal)?;
        }
        let (loc, mut fx) = sh
            .store
            .create(
                client,
                id,
                c.data.len() as u64,
                c.metadata.len() as u64,
                now,
            )
            .map_err(store_refusal)?;
        sh.arena.write(loc.offset, &c.data);
        sh.arena.write(loc.metadata_offset(), &c.metadata);
        fx.extend(sh.store.seal(client, id, now).map_err(store_refusal)?);
        fx.extend(sh.store.release(client, id).map_err(store_refusal)?);
        sh.deliver(fx);
        Ok(Some(reply::Body::Ok(pb::Ok {})))
    }

    /// Creates an object. `Err(Waitable)` is a store-full refusal that
    /// waiting could cure; `Ok(Err)` any other refusal.
    /// `metadata` is written when given; `meta` is its size (or the size of
    /// the metadata the creator writes itself).
    pub(super) fn try_create(
        &mut self,
        id: ObjectId,
        data_size: u64,
        meta: u64,
        metadata: &[u8],
    ) -> Result<Result<reply::Body, Refusal>, Waitable> {
        let mut sh = self.shared.lock();
        let fits_at_all = data_size.saturating_add(meta) <= sh.store.capacity();
        // Spill only for a create that can succeed (not for a taken id).
        let room = if sh.store.exists(&id) {
            Ok(())
        } else {
            sh.spill_for(data_size, meta)
        };
        let created =
            room.and_then(|()| sh.store.create(self.client, id, data_size, meta, now_us()));
        match created {
            Ok((loc, fx)) => {
                sh.arena.write(loc.metadata_offset(), metadata);
                sh.deliver(fx);
                Ok(Ok(reply::Body::Create(pb::CreateReply {
                    location: Some(convert::location(loc)),
                })))
            }
            Err(e @ (StoreError::StoreFull { .. } | StoreError::SpillFull { .. }))
                if fits_at_all =>
            {
                Err(Waitable(convert::error(&e)))
            }
            Err(e) => Ok(Err(store_refusal(e))),
        }
    }

    /// Retries the creates waiting for space, in order; with `now`, also
    /// answers those whose wait ran out.
    pub(super) fn retry_creates(&mut self, now: Option<Instant>) {
        for p in std::mem::take(&mut self.creates) {
            match self.try_create(p.id, p.data_size, p.metadata_size, &p.metadata) {
                Ok(Ok(body)) => self.push_reply(p.request_id, body),
                Ok(Err(Refusal(e))) => {
                    if p.claimed {
                        self.unclaim(p.id);
                    }
                    self.push_reply(p.request_id, reply::Body::Error(e))
                }
                Err(Waitable(mut e)) => {
                    if now.is_some_and(|n| p.deadline.is_some_and(|d| d <= n)) {
                        if p.claimed {
                            self.unclaim(p.id);
                        }
                        e.message = format!("waited for space in vain: {}", e.message);
                        self.push_reply(p.request_id, reply::Body::Error(e));
                    } else {
                        self.creates.push(p);
                    }
                }
            }
        }
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

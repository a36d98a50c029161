//! Where pulled objects land: allocations in the local store, made by the
//! cluster's store client a frame at a time (one lock per frame, not per
//! object), sealed as cached copies once their bytes are in.

use super::transport::{Absent, Arrival, Landing};
use super::{lock, pb, Cluster};
use crate::arena::Arena;
use crate::shared::now_us;
use ferroplasma_protocol::pb as wire;
use ferroplasma_protocol::ObjectId;
use ferroplasma_store::{Location, StoreError};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What became of one id of a pull.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Not received (the pull failed before it came).
    Pending,
    /// Here now (pulled, or made here meanwhile).
    Here,
    /// The holder does not have it.
    NotThere,
    /// The id's owner does not have it, and says where it is (a lookup).
    Entry(pb::Entry),
    /// This store cannot take it (no room): the fetch fails with this.
    Refused(wire::Error),
}

/// The local allocations of one pull. Dropped with objects allocated and
/// not yet received, it aborts them.
pub struct StoreLanding<'a> {
    cluster: &'a Cluster,
    arena: Arc<Arena>,
    ids: &'a [ObjectId],
    outcomes: Vec<Outcome>,
    /// The current frame's allocations: (index in `ids`, where).
    frame: Vec<(usize, Location)>,
}

impl<'a> StoreLanding<'a> {
    /// A landing for a pull of `ids`.
    pub fn new(cluster: &'a Cluster, arena: Arc<Arena>, ids: &'a [ObjectId]) -> Self {
        Self {
            cluster,
            arena,
            ids,
            outcomes: vec![Outcome::Pending; ids.len()],
            frame: Vec::new(),
        }
    }

    /// What became of each id.
    pub fn into_outcomes(mut self) -> Vec<Outcome> {
        self.abort_frame();
        std::mem::take(&mut self.outcomes)
    }

    /// Aborts the allocations of a frame that did not arrive whole.
    fn abort_frame(&mut self) {
        if self.frame.is_empty() {
            return;
        }
        let c = self.cluster;
        let mut sh = c.shared.lock();
        for (i, _) in self.frame.drain(..) {
            if let Ok(fx) = sh.store.abort(c.agent, self.ids[i]) {
                sh.deliver(fx);
            }
        }
    }
}

impl Landing for StoreLanding<'_> {
    fn allocate<'s>(&'s mut self, objects: &[Arrival<'_>]) -> Vec<Option<&'s mut [u8]>> {
        self.abort_frame();
        let c = self.cluster;
        let mut places: Vec<Option<Location>> = Vec::with_capacity(objects.len());
        {
            let mut sh = c.shared.lock();
            for a in objects {
                let id = self.ids[a.index];
                let meta = a.metadata.len() as u64;
                let (guard, created) = c.shared.with_room(sh, |sh| {
                    if sh.store.exists(&id) {
                        Err(StoreError::ObjectExists(id))
                    } else {
                        sh.spill_for(a.data_size, meta).and_then(|()| {
                            sh.store.create(c.agent, id, a.data_size, meta, now_us())
                        })
                    }
                });
                sh = guard;
                match created {
                    Ok((loc, fx)) => {
                        sh.arena.write(loc.metadata_offset(), a.metadata);
                        sh.deliver(fx);
                        self.frame.push((a.index, loc));
                        places.push(Some(loc));
                    }
                    // Made here meanwhile (another pull, a local create):
                    // the gets take that one.
                    Err(StoreError::ObjectExists(_)) => {
                        self.outcomes[a.index] = Outcome::Here;
                        places.push(None);
                    }
                    Err(e) => {
                        let mut refusal = crate::convert::error(&e);
                        refusal.message = format!("no room here for a copy of {id}: {e}");
                        self.outcomes[a.index] = Outcome::Refused(refusal);
                        places.push(None);
                    }
                }
            }
        }
        let this: &'s Self = self;
        let arena = &this.arena;
        places
            .into_iter()
            .zip(objects)
            .map(|(loc, a)| {
                // Safety: each is a fresh unsealed allocation made just now by
                // the cluster's own store client, disjoint from the others:
                // no client has been told of it, nothing else writes it, and
                // it is neither freed nor moved until `arrived` seals it or
                // `abort_frame` aborts it, both of which need `&mut self`,
                // which the returned borrows keep.
                loc.map(|l| unsafe { arena.region_mut(l.offset, a.data_size) })
            })
            .collect()
    }

    fn arrived(&mut self) {
        if self.frame.is_empty() {
            return;
        }
        let c = self.cluster;
        {
            let mut cached = lock(&c.cached);
            for (i, _) in &self.frame {
                cached.insert(self.ids[*i]);
            }
        }
        let (objects, mut bytes) = (self.frame.len() as u64, 0u64);
        {
            let mut sh = c.shared.lock();
            if let Some(table) = sh.fast.clone() {
                let ids: Vec<ObjectId> = self.frame.iter().map(|(i, _)| self.ids[*i]).collect();
                table.prefetch(&ids);
            }
            let now = now_us();
            for (i, loc) in self.frame.drain(..) {
                let id = self.ids[i];
                bytes += loc.data_size;
                let mut fx = sh.store.seal(c.agent, id, now).unwrap_or_default();
                fx.extend(sh.store.release(c.agent, id).unwrap_or_default());
                sh.deliver(fx);
                self.outcomes[i] = Outcome::Here;
            }
        }
        c.counters.fetches.fetch_add(objects, Ordering::Relaxed);
        c.counters.fetched_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn not_there(&mut self, index: usize, why: Absent<'_>) {
        self.outcomes[index] = match why {
            Absent::NotHere => Outcome::NotThere,
            Absent::Entry(bytes) => match <pb::Entry as prost::Message>::decode(bytes) {
                Ok(e) => Outcome::Entry(e),
                // Not an entry: ask the directory the usual way.
                Err(_) => Outcome::Pending,
            },
            Absent::Unsendable => Outcome::Refused(wire::Error {
                code: wire::ErrorCode::TooLarge as i32,
                message: format!(
                    "object {} cannot be pulled from another member: its metadata is over \
                     {} bytes; read it on the member that holds it",
                    self.ids[index],
                    ferroplasma_protocol::frame::MAX_INLINE_SIZE
                ),
                object_id: self.ids[index].0.to_vec(),
            }),
        };
    }
}

impl Drop for StoreLanding<'_> {
    fn drop(&mut self) {
        self.abort_frame();
    }
}

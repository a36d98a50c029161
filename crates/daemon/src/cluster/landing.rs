//! Where pulled objects land: allocations in the local store, made by the
//! cluster's store client a frame at a time (one lock per frame, not per
//! object), sealed as cached copies once their bytes are in. Small objects
//! land in a staging buffer first and are then created sealed in one step
//! each, their bytes copied in (a copy of a few kB costs less than an
//! unsealed object's bookkeeping: created, referenced, sealed, released).

use super::transport::{Absent, Arrival, Landing};
use super::{lock, pb, Cluster};
use crate::arena::Arena;
use crate::shared::{now_us, Shared};
use ferroplasma_protocol::pb as wire;
use ferroplasma_protocol::ObjectId;
use ferroplasma_store::{Effects, Location, StoreError};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

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

/// Objects (data and metadata) at most this large are staged.
const STAGE_AT_MOST: u64 = 64 << 10;

/// Most bytes one frame stages.
const STAGE_BUDGET: u64 = 1 << 20;

/// An object of the current frame received into the staging buffer.
#[derive(Debug, Clone, Copy)]
struct Staged {
    /// Its index in `ids`.
    index: usize,
    /// Where its metadata starts in the staging buffer (its data follows).
    at: usize,
    metadata_size: u64,
    data_size: u64,
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
    /// The current frame's staged objects, and their bytes.
    staged: Vec<Staged>,
    staging: Vec<u8>,
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
            staged: Vec::new(),
            staging: Vec::new(),
        }
    }

    /// What became of each id.
    pub fn into_outcomes(mut self) -> Vec<Outcome> {
        self.abort_frame();
        std::mem::take(&mut self.outcomes)
    }

    /// Aborts the allocations of a frame that did not arrive whole.
    fn abort_frame(&mut self) {
        self.staged.clear();
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

    /// Creates the staged objects of the frame, sealed, with their bytes.
    /// Returns the ids created (not those here already) and their bytes.
    fn land_staged<'g>(
        &mut self,
        mut sh: MutexGuard<'g, Shared>,
        now: i64,
        fx: &mut Effects,
    ) -> (MutexGuard<'g, Shared>, Vec<ObjectId>, u64)
    where
        'a: 'g,
    {
        let c = self.cluster;
        let (mut landed, mut bytes) = (Vec::with_capacity(self.staged.len()), 0);
        for st in std::mem::take(&mut self.staged) {
            let id = self.ids[st.index];
            let meta_end = st.at + st.metadata_size as usize;
            let metadata = &self.staging[st.at..meta_end];
            let data = &self.staging[meta_end..meta_end + st.data_size as usize];
            let arena = &self.arena;
            let (guard, created) = c.shared.with_room(sh, |sh| {
                sh.spill_for(st.data_size, st.metadata_size).and_then(|()| {
                    sh.store
                        .create_sealed(id, st.data_size, st.metadata_size, now, |loc| {
                            arena.write(loc.metadata_offset(), metadata);
                            arena.write(loc.offset, data);
                        })
                })
            });
            sh = guard;
            self.outcomes[st.index] = match created {
                Ok(f) => {
                    fx.extend(f);
                    landed.push(id);
                    bytes += st.data_size;
                    Outcome::Here
                }
                // Made here meanwhile (another pull, a local create): the
                // gets take that one.
                Err(StoreError::ObjectExists(_)) => Outcome::Here,
                Err(e) => refusal(id, &e),
            };
        }
        (sh, landed, bytes)
    }
}

/// The error the gets of `id` hear when this store has no room for it.
fn refusal(id: ObjectId, e: &StoreError) -> Outcome {
    let mut refusal = crate::convert::error(e);
    refusal.message = format!("no room here for a copy of {id}: {e}");
    Outcome::Refused(refusal)
}

impl Landing for StoreLanding<'_> {
    fn allocate<'s>(&'s mut self, objects: &[Arrival<'_>]) -> Vec<Option<&'s mut [u8]>> {
        self.abort_frame();
        let c = self.cluster;
        // Which objects are staged: small ones, up to the budget.
        let mut staged_bytes = 0u64;
        let mut stage = Vec::with_capacity(objects.len());
        self.staging.clear();
        for a in objects {
            let size = a.data_size + a.metadata.len() as u64;
            let small = size <= STAGE_AT_MOST && staged_bytes + size <= STAGE_BUDGET;
            if small {
                staged_bytes += size;
                self.staged.push(Staged {
                    index: a.index,
                    at: self.staging.len(),
                    metadata_size: a.metadata.len() as u64,
                    data_size: a.data_size,
                });
                self.staging.extend_from_slice(a.metadata);
                self.staging
                    .resize(self.staging.len() + a.data_size as usize, 0);
            }
            stage.push(small);
        }
        let mut places: Vec<Option<Location>> = Vec::with_capacity(objects.len());
        if stage.iter().any(|s| !s) {
            let mut sh = c.shared.lock();
            let mut effects = Effects::default();
            for (a, _) in objects.iter().zip(&stage).filter(|(_, s)| !**s) {
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
                        effects.extend(fx);
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
                        self.outcomes[a.index] = refusal(id, &e);
                        places.push(None);
                    }
                }
            }
            sh.deliver(effects);
        }
        let Self {
            arena,
            staging,
            staged,
            ..
        } = self;
        let (arena, mut rest): (&'s Arc<Arena>, &'s mut [u8]) = (arena, staging.as_mut_slice());
        let mut staged = staged.iter();
        let mut places = places.into_iter();
        objects
            .iter()
            .zip(stage)
            .map(|(a, small)| {
                if small {
                    let st = staged.next().expect("one per staged object");
                    let (_, after) =
                        std::mem::take(&mut rest).split_at_mut(st.metadata_size as usize);
                    let (data, after) = after.split_at_mut(st.data_size as usize);
                    rest = after;
                    return Some(data);
                }
                // Safety: each is a fresh unsealed allocation made just now
                // by the cluster's own store client, disjoint from the
                // others: no client has been told of it, nothing else writes
                // it, and it is neither freed nor moved until `arrived`
                // seals it or `abort_frame` aborts it, both of which need
                // `&mut self`, which the returned borrows keep.
                places
                    .next()
                    .flatten()
                    .map(|l| unsafe { arena.region_mut(l.offset, a.data_size) })
            })
            .collect()
    }

    fn arrived(&mut self) {
        if self.frame.is_empty() && self.staged.is_empty() {
            return;
        }
        let c = self.cluster;
        let mut objects = 0u64;
        let mut bytes = 0u64;
        {
            let sh = c.shared.lock();
            if let Some(table) = sh.fast.clone() {
                let ids: Vec<ObjectId> = (self.frame.iter().map(|(i, _)| *i))
                    .chain(self.staged.iter().map(|s| s.index))
                    .map(|i| self.ids[i])
                    .collect();
                table.prefetch(&ids);
            }
            let now = now_us();
            let mut fx = Effects::default();
            let (mut sh, mut landed, staged_bytes) = self.land_staged(sh, now, &mut fx);
            bytes += staged_bytes;
            for (i, loc) in self.frame.drain(..) {
                let id = self.ids[i];
                if let Ok(sealed) = sh.store.seal(c.agent, id, now) {
                    fx.extend(sealed);
                    landed.push(id);
                    bytes += loc.data_size;
                }
                fx.extend(sh.store.release(c.agent, id).unwrap_or_default());
                self.outcomes[i] = Outcome::Here;
            }
            objects += landed.len() as u64;
            // Copies, for the agent that hears of their seals (an id made
            // here meanwhile is not one): recorded before the seals are
            // delivered to it, below.
            lock(&c.cached).landed(landed);
            // One delivery for the frame: the notices go out together.
            sh.deliver(fx);
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

//! Where pulled objects land: allocations in the local store, made by the
//! cluster's store client a frame at a time (one lock per frame, not per
//! object), sealed as cached copies once their bytes are in. Small objects
//! land in a staging buffer first and are then created sealed in one step
//! each, their bytes copied in (a copy of a few kB costs less than an
//! unsealed object's bookkeeping: created, referenced, sealed, released).

use crate::cluster::Cluster;
use crate::local::{Memory, NewObject, Received};
use crate::pb;
use crate::sync::lock;
use crate::transfer::codec::{Absent, Arrival};
use crate::transfer::transport::Landing;
use crate::wire::store_error;
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
#[derive(Debug)]
pub struct StoreLanding<'a> {
    cluster: &'a Cluster,
    memory: Arc<dyn Memory>,
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
    pub fn new(cluster: &'a Cluster, ids: &'a [ObjectId]) -> Self {
        Self {
            cluster,
            memory: cluster.store.memory(),
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
        let ids: Vec<ObjectId> = self.frame.drain(..).map(|(i, _)| self.ids[i]).collect();
        self.cluster.store.abort(&ids);
    }
}

/// The error the gets of `id` hear when this store has no room for it.
fn refusal(id: ObjectId, e: &StoreError) -> Outcome {
    let mut refusal = store_error(e);
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
        let unstaged: Vec<(&Arrival<'_>, NewObject<'_>)> = (objects.iter().zip(&stage))
            .filter(|(_, s)| !**s)
            .map(|(a, _)| {
                let new = NewObject {
                    id: self.ids[a.index],
                    data_size: a.data_size,
                    metadata: a.metadata,
                };
                (a, new)
            })
            .collect();
        if !unstaged.is_empty() {
            let new: Vec<NewObject<'_>> = unstaged.iter().map(|(_, n)| *n).collect();
            let created = c.store.allocate(&new);
            for ((a, n), created) in unstaged.iter().zip(created) {
                match created {
                    Ok(loc) => {
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
                        self.outcomes[a.index] = refusal(n.id, &e);
                        places.push(None);
                    }
                }
            }
        }
        let Self {
            memory,
            staging,
            staged,
            ..
        } = self;
        let (memory, mut rest): (&'s Arc<dyn Memory>, &'s mut [u8]) =
            (memory, staging.as_mut_slice());
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
                    .map(|l| unsafe { memory.region_mut(l.offset, a.data_size) })
            })
            .collect()
    }

    fn arrived(&mut self) {
        if self.frame.is_empty() && self.staged.is_empty() {
            return;
        }
        let c = self.cluster;
        let staged = std::mem::take(&mut self.staged);
        let received: Vec<Received<'_>> = staged
            .iter()
            .map(|st| {
                let meta_end = st.at + st.metadata_size as usize;
                Received {
                    id: self.ids[st.index],
                    metadata: &self.staging[st.at..meta_end],
                    data: &self.staging[meta_end..meta_end + st.data_size as usize],
                }
            })
            .collect();
        let frame: Vec<(usize, Location)> = self.frame.drain(..).collect();
        let allocated: Vec<ObjectId> = frame.iter().map(|(i, _)| self.ids[*i]).collect();
        // Copies, for the agent that hears of their seals (an id made here
        // meanwhile is not one): recorded before the seals are delivered to
        // it.
        let mut objects = 0u64;
        let (created, sealed) = c.store.land(&received, &allocated, &mut |landed| {
            objects += landed.len() as u64;
            lock(&c.cached).landed(landed.iter().copied());
        });
        let mut bytes = 0u64;
        for (st, created) in staged.iter().zip(created) {
            self.outcomes[st.index] = match created {
                Ok(()) => {
                    bytes += st.data_size;
                    Outcome::Here
                }
                // Made here meanwhile (another pull, a local create): the
                // gets take that one.
                Err(StoreError::ObjectExists(_)) => Outcome::Here,
                Err(e) => refusal(self.ids[st.index], &e),
            };
        }
        for ((i, loc), sealed) in frame.into_iter().zip(sealed) {
            if sealed {
                bytes += loc.data_size;
            }
            self.outcomes[i] = Outcome::Here;
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

//! Ids the store hands out for new objects (`NewIds`; docs/cluster.md,
//! "Ids the store hands out"): which ids each connection was handed and
//! has not created yet.
//!
//! On a cluster member each handed id is claimed cluster-wide already (the
//! cluster's pool, `ferroplasma_cluster::ops::fresh`): creating it, over
//! the socket or through the client's ring, asks no other member. A
//! member's rings take in creates of handed ids only; any other id costs a
//! claim, which only the socket's `Create` makes. Ids a connection leaves
//! without creating give their claims back.

use super::Shared;
use ferroplasma_protocol::{IdHasher, ObjectId};
use ferroplasma_store::{ClientId, Effects};
use std::collections::{HashMap, HashSet};

/// The most ids a connection holds uncreated: a client cannot make the
/// cluster hold claims without end.
pub const MAX_HELD: usize = 4096;

/// Each connection's handed ids, not created yet.
#[derive(Debug, Default)]
pub struct Handed(HashMap<ClientId, HashSet<ObjectId, IdHasher>>);

impl Shared {
    /// How many ids `client` holds uncreated.
    pub fn held(&self, client: ClientId) -> usize {
        self.handed.0.get(&client).map_or(0, HashSet::len)
    }

    /// Records as handed to `client` as many of `ids` as it may hold
    /// ([`MAX_HELD`] in all) and returns them; the rest, or all of them when
    /// the connection has ended meanwhile, have their claims given back.
    pub fn hand(&mut self, client: ClientId, mut ids: Vec<ObjectId>) -> Vec<ObjectId> {
        let room = match self.is_connected(client) {
            true => MAX_HELD.saturating_sub(self.held(client)),
            false => 0,
        };
        let extra = ids.split_off(room.min(ids.len()));
        self.give_back_ids(extra);
        if !ids.is_empty() {
            self.handed.0.entry(client).or_default().extend(&ids);
        }
        ids
    }

    /// Whether `client` was handed `id` and had not created it; from now
    /// on it no longer holds it (the create takes the claim over).
    pub fn take_handed(&mut self, client: ClientId, id: &ObjectId) -> bool {
        self.handed
            .0
            .get_mut(&client)
            .is_some_and(|held| held.remove(id))
    }

    /// Gives back the claims of `ids` (each unless an object of that id is
    /// in the store).
    pub fn give_back_ids(&mut self, ids: impl IntoIterator<Item = ObjectId>) {
        let aborted: Vec<ObjectId> = ids
            .into_iter()
            .filter(|id| !self.store.exists(id))
            .collect();
        if !aborted.is_empty() {
            self.deliver(Effects {
                aborted,
                ..Default::default()
            });
        }
    }

    /// A connection ends: the ids it never created go back.
    pub(crate) fn forget_handed(&mut self, client: ClientId) {
        if let Some(held) = self.handed.0.remove(&client) {
            self.give_back_ids(held);
        }
    }
}

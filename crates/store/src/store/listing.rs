//! Listings that page: a snapshot of every id ([`Store::object_ids`]),
//! then each page's rows read when the page is asked for
//! ([`Store::list_rows`]). An object that exists for the whole listing is
//! in the snapshot once and still there when its page is read, so it
//! appears exactly once; one deleted meanwhile is skipped; one created
//! after the snapshot is not listed. The snapshot costs 20 B per object
//! and one pass over the table; the rows cost O(page).

use super::Store;
use crate::object::ObjectInfo;
use ferroplasma_protocol::ObjectId;

impl Store {
    /// The id of every object, sealed or not, spilled ones included, each
    /// once, in no particular order.
    pub fn object_ids(&self) -> Vec<ObjectId> {
        self.object_ids_with(0, |_| {})
    }

    /// [`Store::object_ids`], handing the first `first` of them to `early`
    /// as soon as they are read, before the rest (when there are more than
    /// `first`): a first page can be on its way while a snapshot of
    /// millions is taken.
    pub fn object_ids_with(&self, first: usize, early: impl FnOnce(&[ObjectId])) -> Vec<ObjectId> {
        let spilled = self.spill.iter().flat_map(|t| t.objects.keys());
        // An object being restored is in both tables for a while.
        let spilled = spilled.filter(|id| !self.objects.contains_key(id));
        let mut all = self.objects.iter().map(|e| &e.id).chain(spilled).copied();
        let mut ids = Vec::with_capacity(self.object_count());
        ids.extend(all.by_ref().take(first));
        let mut rest = all.peekable();
        if first > 0 && rest.peek().is_some() {
            early(&ids);
        }
        ids.extend(rest);
        ids
    }

    /// Objects in memory and spilled: what [`Store::object_ids`] returns
    /// (or a few more, while objects are being restored). O(1).
    pub fn object_count(&self) -> usize {
        self.objects.len() + self.spill.as_ref().map_or(0, |t| t.objects.len())
    }

    /// The rows of those of `ids` that exist now, in the order given (ids
    /// gone since are skipped): what [`Store::list`] says of each.
    pub fn list_rows(&self, ids: &[ObjectId]) -> Vec<ObjectInfo> {
        let held = match &self.readers {
            Some(r) => r.held_among(ids),
            None => vec![0; ids.len()],
        };
        ids.iter()
            .zip(held)
            .filter_map(|(id, held)| self.row(id, held))
            .collect()
    }

    fn row(&self, id: &ObjectId, held: u64) -> Option<ObjectInfo> {
        if let Some(e) = self.objects.get(id) {
            return Some(super::queries::row(e, held));
        }
        let s = self.spill.as_ref()?.objects.get(id)?;
        Some(super::queries::spilled_row(id, s))
    }
}

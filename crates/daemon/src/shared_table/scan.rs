//! A scan of every client's holds, made off the store's thread (`stats`
//! counts objects held through the table as referenced).

use super::SharedTable;
use ferroplasma_protocol::shared_table;
use memmap2::MmapRaw;
use std::sync::Arc;

/// The holds regions of the clients connected when it was taken (a region
/// stays mapped while a scan has it, even if its client has gone).
#[derive(Debug)]
pub struct HoldScan {
    pub(super) regions: Vec<Arc<MmapRaw>>,
    pub(super) slots: usize,
    pub(super) generation: u64,
}

impl HoldScan {
    /// The slots at least one client holds: one pass over each region,
    /// O(clients × slots), without any lock. A moment's view: holds taken
    /// or released meanwhile may or may not be seen.
    pub fn held_slots(&self) -> Vec<usize> {
        let mut held = vec![false; self.slots];
        for region in &self.regions {
            for (i, h) in SharedTable::holds_of(region, self.slots).iter().enumerate() {
                if shared_table::held(h) > 0 {
                    held[i] = true;
                }
            }
        }
        held.iter()
            .enumerate()
            .filter_map(|(i, &h)| h.then_some(i))
            .collect()
    }
}

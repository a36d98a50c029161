//! [`Mapping`]: the store's arena as mapped into this process.

use memmap2::MmapRaw;

/// The arena as mapped into this process. Kept alive by every buffer.
#[derive(Debug)]
pub struct Mapping {
    map: MmapRaw,
}

impl Mapping {
    pub(crate) fn new(map: MmapRaw) -> Self {
        Self { map }
    }

    /// Bytes mapped.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// True for an empty mapping.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// A pointer to `offset`, after checking `[offset, offset+len)` is mapped.
    pub(crate) fn ptr(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len() {
            return None;
        }
        // Safety: offset <= end <= mapping length, so the result stays within
        // (or one past the end of) the mapped region.
        Some(unsafe { self.map.as_mut_ptr().add(offset as usize) })
    }
}

//! Where an object's bytes lie inside its allocation.
//!
//! An allocation holds the data first and the metadata after it, each starting
//! on a 64-byte boundary: `[data | pad | metadata | pad]`.

/// Alignment of every allocation and of the metadata inside it.
pub const ALIGNMENT: u64 = 64;

/// Rounds `n` up to a multiple of [`ALIGNMENT`] (saturating near `u64::MAX`).
pub const fn align_up(n: u64) -> u64 {
    match n.checked_add(ALIGNMENT - 1) {
        Some(v) => v & !(ALIGNMENT - 1),
        None => !(ALIGNMENT - 1),
    }
}

/// Offset of the metadata from the start of the allocation.
pub const fn metadata_offset(data_size: u64) -> u64 {
    align_up(data_size)
}

/// Bytes to allocate for an object (at least one alignment unit).
pub fn allocation_size(data_size: u64, metadata_size: u64) -> u64 {
    let total = align_up(data_size).saturating_add(align_up(metadata_size));
    total.max(ALIGNMENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(align_up(0), 0);
        assert_eq!(align_up(1), 64);
        assert_eq!(align_up(64), 64);
        assert_eq!(align_up(65), 128);
        assert_eq!(allocation_size(0, 0), 64);
        assert_eq!(allocation_size(1, 1), 128);
        assert_eq!(metadata_offset(100), 128);
        assert_eq!(align_up(u64::MAX) % 64, 0);
    }
}

//! A slot of the shared object table is ten 32-bit words: what it holds
//! reads back exactly up to its limits, and what does not fit is refused
//! with the slot left as it was (the store then serves that object
//! through the socket).
#![cfg(not(ferroplasma_loom))]

use ferroplasma_protocol::shared_table::{
    fits, id_of_words, id_words, Slot, EMPTY, SEALED, SLOT_BYTES,
};
use ferroplasma_protocol::ObjectId;

const TIB: u64 = 1 << 40;

#[test]
fn a_slot_is_forty_bytes_and_reads_back_what_was_published_up_to_its_limits() {
    assert_eq!(std::mem::size_of::<Slot>(), SLOT_BYTES);
    assert_eq!(SLOT_BYTES, 40);
    let id = ObjectId(std::array::from_fn(|k| 0xa0 ^ (k as u8).wrapping_mul(37)));
    let cases = [
        (0, 0, 0),
        (64, 1, 1),
        (16 * TIB - 64, TIB - 1, (256 << 10) - 1),
        (0x0012_3456_7840, 0x00ab_cdef_0123, 0x0002_abcd),
    ];
    for (offset, data, meta) in cases {
        let slot = Slot::new();
        assert!(slot.publish(&id_words(&id), offset, data, meta));
        let v = slot.read().expect("a quiet slot");
        assert_eq!(
            (v.offset, v.data_size, v.metadata_size, v.state),
            (offset, data, meta, SEALED),
            "published at {offset} with {data} + {meta} bytes"
        );
        assert_eq!(id_of_words(&v.id), id);
        assert_eq!(v.seq % 2, 0);
        slot.set_reach(128);
        let v = slot.read().expect("a quiet slot");
        assert_eq!((v.reach, v.state, v.data_size), (128, SEALED, data));
    }
}

#[test]
fn what_does_not_fit_a_slot_is_refused_and_leaves_it_untouched() {
    let too_far = [
        (16 * TIB, 1, 0),
        (100, 1, 0),
        (0, TIB, 0),
        (0, 1, 256 << 10),
        (!63, u64::MAX, u64::MAX),
    ];
    for (offset, data, meta) in too_far {
        assert!(!fits(offset, data, meta));
        let slot = Slot::new();
        assert!(!slot.publish(&id_words(&ObjectId([1; 20])), offset, data, meta));
        let v = slot.read().expect("a quiet slot");
        assert_eq!((v.seq, v.state), (0, EMPTY), "untouched");
    }
}

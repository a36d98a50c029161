use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

#[derive(Debug, Clone)]
struct E {
    id: ObjectId,
    links: Links,
    weight: u64,
}

impl Keyed for E {
    fn id(&self) -> &ObjectId {
        &self.id
    }
    fn links(&self) -> Links {
        self.links
    }
    fn links_mut(&mut self) -> &mut Links {
        &mut self.links
    }
    fn weight(&self) -> u64 {
        self.weight
    }
}

fn id(k: u16) -> ObjectId {
    let mut b = [0u8; 20];
    b[..2].copy_from_slice(&k.to_le_bytes());
    ObjectId(b)
}

fn e(k: u16, weight: u64) -> E {
    E {
        id: id(k),
        links: Links::OUT,
        weight,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Insert(u16, u64),
    Remove(u16),
    /// Looked up, then removed by position (as `Store::delete` does).
    RemoveAt(u16),
    PushBack(u16),
    Unlink(u16),
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0u16..40;
    prop_oneof![
        (k.clone(), 0u64..1000).prop_map(|(k, w)| Op::Insert(k, w)),
        k.clone().prop_map(Op::Remove),
        k.clone().prop_map(Op::RemoveAt),
        k.clone().prop_map(Op::PushBack),
        k.prop_map(Op::Unlink),
    ]
}

proptest! {
    /// Against a HashMap and a Vec as the list: the same entries, the same
    /// list order and weight, whatever moves (chunks of 8 under test, so
    /// entries cross chunks and chunks come and go).
    #[test]
    fn behaves_like_a_map_and_a_list(ops in proptest::collection::vec(op(), 1..400)) {
        let mut t = DenseTable::<E>::default();
        let mut map: HashMap<ObjectId, u64> = HashMap::new();
        let mut list: Vec<ObjectId> = Vec::new();
        for op in ops {
            match op {
                Op::Insert(k, w) => {
                    t.insert(e(k, w));
                    map.insert(id(k), w);
                    list.retain(|x| *x != id(k));
                }
                Op::Remove(k) => {
                    let got = t.remove(&id(k)).map(|x| (x.id, x.weight));
                    prop_assert_eq!(got, map.remove(&id(k)).map(|w| (id(k), w)));
                    list.retain(|x| *x != id(k));
                }
                Op::RemoveAt(k) => {
                    let got = t.position(&id(k)).map(|p| t.remove_at(p)).map(|x| (x.id, x.weight));
                    prop_assert_eq!(got, map.remove(&id(k)).map(|w| (id(k), w)));
                    list.retain(|x| *x != id(k));
                }
                Op::PushBack(k) => {
                    prop_assert_eq!(t.push_back(&id(k)), map.contains_key(&id(k)));
                    if map.contains_key(&id(k)) {
                        list.retain(|x| *x != id(k));
                        list.push(id(k));
                    }
                }
                Op::Unlink(k) => {
                    prop_assert_eq!(t.unlink_id(&id(k)), list.contains(&id(k)));
                    list.retain(|x| *x != id(k));
                }
            }
            prop_assert_eq!(t.len(), map.len());
            for k in 0..40 {
                prop_assert_eq!(t.get(&id(k)).map(|x| x.weight), map.get(&id(k)).copied());
                if let Some(p) = t.position(&id(k)) {
                    prop_assert_eq!(t.at(p).id, id(k));
                }
            }
            let mut ids: Vec<ObjectId> = t.iter().map(|x| x.id).collect();
            ids.sort();
            let mut want: Vec<ObjectId> = map.keys().copied().collect();
            want.sort();
            prop_assert_eq!(ids, want);
            prop_assert_eq!(t.list().map(|x| x.id).collect::<Vec<_>>(), list.clone());
            prop_assert_eq!(t.listed(), list.len());
            prop_assert_eq!(t.list_weight(), list.iter().map(|x| map[x]).sum::<u64>());
        }
    }
}

/// Filled and emptied again, the table holds about what an empty one
/// does: chunks beyond one spare are freed and the index shrinks.
#[test]
fn emptied_it_gives_its_memory_back() {
    let mut t = DenseTable::<E>::default();
    let empty = t.heap_bytes();
    for k in 0..60_000u32 {
        let mut b = [0u8; 20];
        b[..4].copy_from_slice(&k.to_le_bytes());
        let p = t.insert(E {
            id: ObjectId(b),
            links: Links::OUT,
            weight: 1,
        });
        t.push_back_at(p);
    }
    let full = t.heap_bytes();
    assert!(full > empty + 60_000 * std::mem::size_of::<E>());
    assert_eq!(t.list_weight(), 60_000);
    // Out in an order unlike the one they came in: entries move.
    for k in (0..60_000u32)
        .rev()
        .step_by(2)
        .chain((0..60_000u32).step_by(2))
    {
        let mut b = [0u8; 20];
        b[..4].copy_from_slice(&k.to_le_bytes());
        assert_eq!(t.remove(&ObjectId(b)).map(|x| x.id), Some(ObjectId(b)));
    }
    assert_eq!((t.len(), t.listed(), t.list_weight()), (0, 0, 0));
    let left = t.heap_bytes() - empty;
    let small_shards = SHARDS * (SHRINK_ABOVE * 8 / 7 * 5 + 32);
    assert!(
        left <= CHUNK * std::mem::size_of::<E>() + small_shards + 1024,
        "{left} bytes left of {full}"
    );
}

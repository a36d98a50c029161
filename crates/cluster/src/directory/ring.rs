//! Consistent hashing of object ids onto cluster members.
//!
//! Each member owns [`POINTS_PER_MEMBER`] points on a 64-bit ring; an id
//! belongs to the first points clockwise from its hash. The first distinct
//! member found is the id's directory owner, the next its backup. When a
//! member leaves, only the ids it owned move (to the members that were their
//! backups); when one joins, it takes about `1/N` of the ids.
//!
//! The hash is XXH3 (stable across builds and platforms), so every member
//! running any build of the same release places every id identically.

use ferroplasma_protocol::ObjectId;
use smallvec::SmallVec;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Points each member places on the ring (more points: a more even split).
pub const POINTS_PER_MEMBER: u64 = 64;

/// An id's owners, owner first (inline up to owner and backup).
pub type Owners<'a> = SmallVec<[&'a str; 2]>;

/// The ring for one view of the live members.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ring {
    /// `(point, member index)`, sorted by point.
    points: Vec<(u64, usize)>,
    members: Vec<String>,
}

/// A fingerprint of a ring's members (name, incarnation, directory epoch),
/// the same on every member that knows the same: FNV-1a, written out here
/// because it must not change between builds or platforms (std's hasher
/// may). Never 0 (0 means "no ring" on the wire).
pub fn fingerprint<'a>(members: impl IntoIterator<Item = (&'a str, u64, u64)>) -> u64 {
    let mut sorted: Vec<_> = members.into_iter().collect();
    sorted.sort_unstable();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (name, incarnation, epoch) in sorted {
        eat(&(name.len() as u64).to_le_bytes());
        eat(name.as_bytes());
        eat(&incarnation.to_le_bytes());
        eat(&epoch.to_le_bytes());
    }
    h | 1
}

impl Ring {
    /// A ring of these members (names are their cluster addresses).
    pub fn new<I, S>(members: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut members: Vec<String> = members.into_iter().map(Into::into).collect();
        members.sort();
        members.dedup();
        let mut points = Vec::with_capacity(members.len() * POINTS_PER_MEMBER as usize);
        for (i, m) in members.iter().enumerate() {
            for p in 0..POINTS_PER_MEMBER {
                points.push((xxh3_64_with_seed(m.as_bytes(), p), i));
            }
        }
        points.sort_unstable();
        Self { points, members }
    }

    /// The members, sorted.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// Up to `n` distinct members for `id`, owner first. Owner and backup
    /// (`n` ≤ 2) come without an allocation: every batch routes each of
    /// its ids through here.
    pub fn owners(&self, id: &ObjectId, n: usize) -> Owners<'_> {
        let mut out = Owners::new();
        if self.points.is_empty() {
            return out;
        }
        let h = xxh3_64(id.as_bytes());
        let start = self.points.partition_point(|(p, _)| *p < h);
        for k in 0..self.points.len() {
            let (_, m) = self.points[(start + k) % self.points.len()];
            let name = self.members[m].as_str();
            if !out.contains(&name) {
                out.push(name);
                if out.len() == n {
                    break;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<ObjectId> {
        (0..n).map(|_| ObjectId::random()).collect()
    }

    #[test]
    fn owner_and_backup_are_distinct_members() {
        let r = Ring::new(["a:1", "b:1", "c:1"]);
        for id in ids(1000) {
            let o = r.owners(&id, 2);
            assert_eq!(o.len(), 2);
            assert_ne!(o[0], o[1]);
        }
        assert_eq!(
            Ring::new(["a:1"]).owners(&ObjectId::random(), 2).as_slice(),
            ["a:1"]
        );
        assert!(Ring::default().owners(&ObjectId::random(), 2).is_empty());
    }

    #[test]
    fn the_split_is_roughly_even() {
        let r = Ring::new(["a:1", "b:1", "c:1", "d:1"]);
        let mut count = std::collections::HashMap::new();
        for id in ids(40_000) {
            *count.entry(r.owners(&id, 1)[0].to_string()).or_insert(0) += 1;
        }
        for (m, c) in count {
            assert!((5_000..15_000).contains(&c), "{m} owns {c} of 40000");
        }
    }

    #[test]
    fn a_leaving_member_hands_its_ids_to_their_backups() {
        let full = Ring::new(["a:1", "b:1", "c:1", "d:1"]);
        let without_c = Ring::new(["a:1", "b:1", "d:1"]);
        for id in ids(5000) {
            let before = full.owners(&id, 2);
            let after = without_c.owners(&id, 1)[0];
            if before[0] == "c:1" {
                assert_eq!(after, before[1], "the backup takes over");
            } else {
                assert_eq!(after, before[0], "other ids stay put");
            }
        }
    }

    #[test]
    fn placement_does_not_depend_on_order_or_process() {
        let a = Ring::new(["x:9", "y:9", "z:9"]);
        let b = Ring::new(vec![
            "z:9".to_string(),
            "x:9".into(),
            "y:9".into(),
            "x:9".into(),
        ]);
        assert_eq!(a, b);
        // A fixed id lands on a fixed member in every build.
        let id = ObjectId::from_slice(&[7u8; 20]).unwrap();
        assert_eq!(a.owners(&id, 3).len(), 3);
        assert_eq!(a.owners(&id, 3), b.owners(&id, 3));
    }
}

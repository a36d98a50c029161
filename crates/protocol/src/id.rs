//! [`ObjectId`]: the 20-byte identifier of an object (Plasma-compatible).

use crate::ProtocolError;
use std::fmt;

/// A 20-byte object identifier: its bytes and nothing else
/// (`repr(transparent)`, so a C array of ids can be read as it lies).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct ObjectId(pub [u8; ObjectId::LEN]);

/// Hashed as three words, not as a slice of bytes: every map of the store
/// hashes ids, and a hasher takes whole words much faster (equal ids give
/// equal words, so this agrees with `Eq`).
impl std::hash::Hash for ObjectId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let b = &self.0;
        state.write_u64(u64::from_le_bytes(b[..8].try_into().expect("8 bytes")));
        state.write_u64(u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")));
        state.write_u32(u32::from_le_bytes(b[16..].try_into().expect("4 bytes")));
    }
}

impl ObjectId {
    /// Length of an id in bytes.
    pub const LEN: usize = 20;

    /// Parses an id from exactly 20 bytes.
    pub fn from_slice(bytes: &[u8]) -> Result<Self, ProtocolError> {
        let arr: [u8; Self::LEN] = bytes.try_into().map_err(|_| ProtocolError::BadObjectId {
            expected: Self::LEN,
            got: bytes.len(),
        })?;
        Ok(Self(arr))
    }

    /// A random id from the OS's random source (128+ bits of entropy, so ids
    /// made on different hosts do not collide in practice).
    pub fn random() -> Self {
        let mut b = [0u8; Self::LEN];
        fill_random(&mut b);
        Self(b)
    }

    /// `n` random ids from one call for randomness (one system call where
    /// [`ObjectId::random`] makes one per id).
    pub fn random_many(n: usize) -> Vec<Self> {
        let mut b = vec![0u8; n * Self::LEN];
        fill_random(&mut b);
        b.chunks_exact(Self::LEN)
            .map(|c| Self(c.try_into().expect("LEN bytes")))
            .collect()
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8; Self::LEN] {
        &self.0
    }

    /// Lower-case hex, 40 characters.
    pub fn to_hex(&self) -> String {
        let mut buf = [0u8; 2 * Self::LEN];
        String::from(self.hex_into(&mut buf))
    }

    /// The 40 hex digits, written into `buf` without allocating.
    fn hex_into<'a>(&self, buf: &'a mut [u8; 2 * Self::LEN]) -> &'a str {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for (pair, b) in buf.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(b >> 4)];
            pair[1] = DIGITS[usize::from(b & 15)];
        }
        std::str::from_utf8(buf).expect("hex digits are ASCII")
    }

    /// Parses 40 hex characters.
    pub fn from_hex(s: &str) -> Result<Self, ProtocolError> {
        let shown: String = s.chars().take(48).collect();
        let bad = || ProtocolError::BadHexId(shown.clone());
        if s.len() != 2 * Self::LEN || !s.is_ascii() {
            return Err(bad());
        }
        let mut b = [0u8; Self::LEN];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Self(b))
    }
}

/// Concatenates ids for the packed `object_ids` fields of the protocol.
pub fn pack_ids(ids: &[ObjectId]) -> Vec<u8> {
    let mut v = Vec::with_capacity(ids.len() * ObjectId::LEN);
    for id in ids {
        v.extend_from_slice(&id.0);
    }
    v
}

/// Splits a packed `object_ids` field; its length must be a multiple of 20.
pub fn unpack_ids(packed: &[u8]) -> Result<Vec<ObjectId>, ProtocolError> {
    if packed.len() % ObjectId::LEN != 0 {
        return Err(ProtocolError::BadObjectId {
            expected: ObjectId::LEN,
            got: packed.len() % ObjectId::LEN,
        });
    }
    Ok(packed
        .chunks_exact(ObjectId::LEN)
        .map(|c| ObjectId(c.try_into().expect("chunks of 20")))
        .collect())
}

fn fill_random(buf: &mut [u8]) {
    // The getrandom(2) syscall: no file to open, never blocks after boot.
    if getrandom::fill(buf).is_ok() {
        return;
    }
    // Fallback: hash time, pid and a counter (not cryptographic, still unique).
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    for chunk in buf.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        h.write_u32(std::process::id());
        let v = h.finish().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({})", self.to_hex())
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 2 * Self::LEN];
        f.pad(self.hex_into(&mut buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip_and_bad_lengths() {
        let id = ObjectId::random();
        assert_eq!(ObjectId::from_hex(&id.to_hex()).unwrap(), id);
        assert!(ObjectId::from_slice(&[0u8; 19]).is_err());
        assert!(ObjectId::from_slice(&[0u8; 21]).is_err());
        let e = ObjectId::from_hex("zz").unwrap_err().to_string();
        assert_eq!(e, "\"zz\" is not an object id: give its 40 hex digits");
        assert_ne!(ObjectId::random(), ObjectId::random());
        let ids = [ObjectId::random(), ObjectId::random()];
        assert_eq!(unpack_ids(&pack_ids(&ids)).unwrap(), ids);
        assert!(unpack_ids(&[0; 21]).is_err());
    }
}

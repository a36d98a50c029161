//! [`DenseTable`]: the compact id-keyed table behind the object table and
//! [`Lru`](crate::lru::Lru), with an intrusive list through it.
//!
//! A store of millions holds millions of entries, so each costs what it
//! holds and little more:
//!
//! - The entries lie densely, each carrying its own id, in chunks of
//!   [`CHUNK`] entries: the table grows by one chunk at a time (never a
//!   copy of all entries, never twice the room it needs), and removing an
//!   entry moves the last one into its place, so the entries stay dense and
//!   a chunk left empty at the end is freed (one is kept spare).
//! - The index maps an id's hash to the entry's position: a `u32` in a
//!   `hashbrown` table, 5 bytes a bucket with its control byte. It is split
//!   by hash into [`SHARDS`] tables that grow and shrink on their own, so
//!   a resize rehashes (reading the entries' ids) a 256th of the entries,
//!   not all of them while one request waits. A shard shrinks when it is
//!   less than a quarter full.
//! - A doubly linked list runs through the positions (`prev`/`next` in
//!   each entry, [`Links`]), fixed up when an entry moves: the order of
//!   the evictable objects (least recently released first) in O(1) per
//!   change without a second copy of their ids.
//!
//! Memory the table frees is given back to the operating system
//! ([`crate::trim`]) once enough of it has been freed.

use ferroplasma_protocol::{IdHasher, ObjectId};
use hashbrown::hash_table::Entry as Slot;
use hashbrown::HashTable;
use std::hash::BuildHasher;

/// Entries per chunk (small under test, so that tests cross chunks).
const CHUNK_BITS: u32 = if cfg!(test) { 3 } else { 13 };
/// Entries per chunk: 8,192 (720 KiB of object entries).
pub(crate) const CHUNK: usize = 1 << CHUNK_BITS;
/// Index tables, chosen by bits 32..40 of the hash (hashbrown uses the low
/// bits for the bucket and the top 7 for its tag, so both stay random
/// within a shard).
pub(crate) const SHARDS: usize = 256;
/// A position that is no entry: the end of the list.
const NIL: u32 = u32::MAX;
/// `prev` of an entry that is not in the list.
const OUT: u32 = u32::MAX - 1;
/// Most entries a table holds: positions are `u32`s below the two markers.
pub(crate) const MAX_ENTRIES: usize = OUT as usize;
/// Freed bytes after which the allocator is asked to give memory back.
const TRIM_AFTER: usize = 16 << 20;
/// Index tables this small are not shrunk (a few hundred bytes each).
const SHRINK_ABOVE: usize = 64;

/// An entry's place in the table's list: the positions before and after
/// it, or [`Links::OUT`] when it is not in the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Links {
    prev: u32,
    next: u32,
}

impl Links {
    /// Not in the list.
    pub const OUT: Links = Links {
        prev: OUT,
        next: OUT,
    };

    pub fn is_linked(&self) -> bool {
        self.prev != OUT
    }
}

/// What a [`DenseTable`] keeps: an entry that carries its id and links.
pub(crate) trait Keyed {
    fn id(&self) -> &ObjectId;
    fn links(&self) -> Links;
    fn links_mut(&mut self) -> &mut Links;
    /// What the entry adds to [`DenseTable::list_weight`] while listed;
    /// must not change while it is.
    fn weight(&self) -> u64;
}

/// The entries, densely, in chunks of [`CHUNK`].
struct Chunks<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Chunks<T> {
    fn at(&self, pos: u32) -> &T {
        let p = pos as usize;
        &self.chunks[p >> CHUNK_BITS][p & (CHUNK - 1)]
    }

    fn at_mut(&mut self, pos: u32) -> &mut T {
        let p = pos as usize;
        &mut self.chunks[p >> CHUNK_BITS][p & (CHUNK - 1)]
    }

    fn push(&mut self, value: T) -> u32 {
        let c = self.len >> CHUNK_BITS;
        if c == self.chunks.len() {
            self.chunks.push(Vec::with_capacity(CHUNK));
        }
        self.chunks[c].push(value);
        self.len += 1;
        (self.len - 1) as u32
    }

    /// Takes the last entry off; frees chunks beyond one spare. Returns
    /// the entry and the bytes freed.
    fn pop(&mut self) -> Option<(T, usize)> {
        let last = self.len.checked_sub(1)?;
        let value = self.chunks[last >> CHUNK_BITS].pop()?;
        self.len = last;
        let mut freed = 0;
        while self.chunks.len() > self.len.div_ceil(CHUNK) + 1 {
            self.chunks.pop();
            freed += CHUNK * std::mem::size_of::<T>();
        }
        if self.chunks.capacity() > 4 * self.chunks.len().max(16) {
            self.chunks.shrink_to(2 * self.chunks.len());
        }
        Some((value, freed))
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }

    fn heap_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Vec<T>>()
            + self
                .chunks
                .iter()
                .map(|c| c.capacity() * std::mem::size_of::<T>())
                .sum::<usize>()
    }
}

/// Id-keyed entries, densely, with a hash index of their positions and a
/// list through them (see the module's text).
pub(crate) struct DenseTable<T> {
    items: Chunks<T>,
    index: Box<[HashTable<u32>]>,
    hasher: IdHasher,
    /// First and last listed positions ([`NIL`] when the list is empty).
    head: u32,
    tail: u32,
    listed: usize,
    list_weight: u64,
    /// Bytes freed since the allocator was last asked to give memory back.
    freed: usize,
}

impl<T> std::fmt::Debug for DenseTable<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenseTable")
            .field("len", &self.items.len)
            .field("listed", &self.listed)
            .field("heap_bytes", &self.heap_bytes())
            .finish()
    }
}

impl<T> Default for DenseTable<T> {
    fn default() -> Self {
        Self {
            items: Chunks {
                chunks: Vec::new(),
                len: 0,
            },
            index: (0..SHARDS).map(|_| HashTable::new()).collect(),
            hasher: IdHasher::default(),
            head: NIL,
            tail: NIL,
            listed: 0,
            list_weight: 0,
            freed: 0,
        }
    }
}

fn shard(hash: u64) -> usize {
    (hash >> 32) as usize & (SHARDS - 1)
}

impl<T: Keyed> DenseTable<T> {
    fn hash(&self, id: &ObjectId) -> u64 {
        self.hasher.hash_one(id)
    }

    /// Where `id`'s entry lies.
    pub fn position(&self, id: &ObjectId) -> Option<u32> {
        if self.items.len == 0 {
            return None; // not even a hash to compute
        }
        let h = self.hash(id);
        let items = &self.items;
        self.index[shard(h)]
            .find(h, |&p| items.at(p).id() == id)
            .copied()
    }

    pub fn get(&self, id: &ObjectId) -> Option<&T> {
        self.position(id).map(|p| self.items.at(p))
    }

    pub fn get_mut(&mut self, id: &ObjectId) -> Option<&mut T> {
        let p = self.position(id)?;
        Some(self.items.at_mut(p))
    }

    /// The entry at a position given by [`DenseTable::position`] (valid
    /// until the next insert or remove).
    pub fn at(&self, pos: u32) -> &T {
        self.items.at(pos)
    }

    /// [`DenseTable::at`], to change (not its id, nor its weight while
    /// listed).
    pub fn at_mut(&mut self, pos: u32) -> &mut T {
        self.items.at_mut(pos)
    }

    pub fn contains_key(&self, id: &ObjectId) -> bool {
        self.position(id).is_some()
    }

    pub fn len(&self) -> usize {
        self.items.len
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter()
    }

    /// Adds `value`, unlisted, replacing an entry with the same id; its
    /// position.
    ///
    /// # Panics
    /// When the table holds [`MAX_ENTRIES`] already (the store refuses
    /// objects before that).
    pub fn insert(&mut self, mut value: T) -> u32 {
        *value.links_mut() = Links::OUT;
        let h = self.hash(value.id());
        let Self {
            items,
            index,
            hasher,
            ..
        } = self;
        let slot = index[shard(h)].entry(
            h,
            |&p| items.at(p).id() == value.id(),
            |&p| hasher.hash_one(items.at(p).id()),
        );
        match slot {
            Slot::Occupied(o) => {
                let p = *o.get();
                self.unlink(p);
                *self.items.at_mut(p) = value;
                p
            }
            Slot::Vacant(v) => {
                assert!(
                    items.len < MAX_ENTRIES,
                    "a table holds {MAX_ENTRIES} entries at most"
                );
                let p = items.push(value);
                v.insert(p);
                p
            }
        }
    }

    /// Takes `id`'s entry out (out of the list too); the last entry moves
    /// into its place.
    pub fn remove(&mut self, id: &ObjectId) -> Option<T> {
        let h = self.hash(id);
        let s = shard(h);
        let items = &self.items;
        let pos = match self.index[s].find_entry(h, |&p| items.at(p).id() == id) {
            Ok(o) => o.remove().0,
            Err(_) => return None,
        };
        Some(self.take_out(s, pos))
    }

    /// Removes the entry at a position given by [`DenseTable::position`]
    /// (for a caller that has looked it up already: its index bucket is
    /// found by position, without comparing ids).
    pub fn remove_at(&mut self, pos: u32) -> T {
        let h = self.hash(self.items.at(pos).id());
        let s = shard(h);
        if let Ok(o) = self.index[s].find_entry(h, |&p| p == pos) {
            o.remove();
        }
        self.take_out(s, pos)
    }

    /// The rest of a removal, once `pos` is out of shard `s`'s index:
    /// unlinks it, moves the last entry into its place, returns it.
    fn take_out(&mut self, s: usize, pos: u32) -> T {
        self.unlink(pos);
        self.shrink_shard(s);
        let last = (self.items.len - 1) as u32;
        if pos != last {
            self.renumber(last, pos);
        }
        let (moved, freed) = self.items.pop().expect("the table holds `pos`");
        self.freed(freed);
        if pos == last {
            moved
        } else {
            std::mem::replace(self.items.at_mut(pos), moved)
        }
    }

    /// Points the index and the list at `to` for the entry at `from` (the
    /// last one, about to move there).
    fn renumber(&mut self, from: u32, to: u32) {
        let h = self.hash(self.items.at(from).id());
        if let Some(p) = self.index[shard(h)].find_mut(h, |&p| p == from) {
            *p = to;
        }
        let l = self.items.at(from).links();
        if l.is_linked() {
            match l.prev {
                NIL => self.head = to,
                p => self.items.at_mut(p).links_mut().next = to,
            }
            match l.next {
                NIL => self.tail = to,
                n => self.items.at_mut(n).links_mut().prev = to,
            }
        }
    }

    fn shrink_shard(&mut self, s: usize) {
        let t = &mut self.index[s];
        if t.capacity() <= SHRINK_ABOVE || t.len() * 4 >= t.capacity() {
            return;
        }
        let before = t.allocation_size();
        let (items, hasher) = (&self.items, &self.hasher);
        t.shrink_to(t.len() * 2, |&p| hasher.hash_one(items.at(p).id()));
        let after = t.allocation_size();
        self.freed(before.saturating_sub(after));
    }

    /// Counts freed memory; asks for it to be given back after
    /// [`TRIM_AFTER`] bytes, or when the table is empty.
    fn freed(&mut self, bytes: usize) {
        self.freed += bytes;
        if self.freed >= TRIM_AFTER || (self.freed > 0 && self.items.len == 0) {
            self.freed = 0;
            crate::trim::give_back();
        }
    }

    // ------------------------------------------------------------ the list

    /// Puts the entry at `pos` at the back of the list (moving it there
    /// if listed already).
    pub fn push_back_at(&mut self, pos: u32) {
        self.unlink(pos);
        let tail = self.tail;
        let e = self.items.at_mut(pos);
        *e.links_mut() = Links {
            prev: tail,
            next: NIL,
        };
        self.list_weight += e.weight();
        self.listed += 1;
        match tail {
            NIL => self.head = pos,
            t => self.items.at_mut(t).links_mut().next = pos,
        }
        self.tail = pos;
    }

    /// [`DenseTable::push_back_at`] by id; false when absent.
    #[cfg(test)]
    pub fn push_back(&mut self, id: &ObjectId) -> bool {
        let Some(p) = self.position(id) else {
            return false;
        };
        self.push_back_at(p);
        true
    }

    /// Takes the entry at `pos` out of the list; false if it was not in it.
    pub fn unlink(&mut self, pos: u32) -> bool {
        let e = self.items.at_mut(pos);
        let l = e.links();
        if !l.is_linked() {
            return false;
        }
        *e.links_mut() = Links::OUT;
        self.list_weight -= e.weight();
        self.listed -= 1;
        match l.prev {
            NIL => self.head = l.next,
            p => self.items.at_mut(p).links_mut().next = l.next,
        }
        match l.next {
            NIL => self.tail = l.prev,
            n => self.items.at_mut(n).links_mut().prev = l.prev,
        }
        true
    }

    /// [`DenseTable::unlink`] by id.
    #[cfg(test)]
    pub fn unlink_id(&mut self, id: &ObjectId) -> bool {
        self.position(id).is_some_and(|p| self.unlink(p))
    }

    /// The listed entries, front first.
    pub fn list(&self) -> impl Iterator<Item = &T> + '_ {
        let mut at = self.head;
        std::iter::from_fn(move || {
            if at == NIL {
                return None;
            }
            let e = self.items.at(at);
            at = e.links().next;
            Some(e)
        })
    }

    /// Listed entries.
    #[cfg(test)]
    pub fn listed(&self) -> usize {
        self.listed
    }

    /// The weights of the listed entries, summed.
    pub fn list_weight(&self) -> u64 {
        self.list_weight
    }
}

impl<T> DenseTable<T> {
    /// Bytes this table holds on the heap: entries, chunk table and index.
    pub fn heap_bytes(&self) -> usize {
        self.items.heap_bytes()
            + self.index.len() * std::mem::size_of::<HashTable<u32>>()
            + self
                .index
                .iter()
                .map(HashTable::allocation_size)
                .sum::<usize>()
    }
}

#[cfg(test)]
#[path = "dense_tests.rs"]
mod tests;

//! The client's side of the object table in shared memory
//! (`ferroplasma_protocol::shared_table`): gets, contains and releases of sealed,
//! local objects without a round trip to the store.

use crate::aligned_map::{AlignedMap, HUGE_PAGE};
use crate::error::{ClientError, Result};
use ferroplasma_protocol::shared_table::{self, table_len, Header, Slot, Take, HEADER_BYTES};
use ferroplasma_protocol::ObjectId;
use memmap2::MmapMut;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

/// The table (mapped read-only) and this client's holds (read-write).
#[derive(Debug)]
pub(crate) struct TableView {
    /// At a 2 MiB boundary, as the holds: [`warm`] puts a large table's
    /// pages in 2 MiB pages.
    table: AlignedMap,
    holds: AlignedMap,
    /// Per slot, a tag of the id this process holds there (this process
    /// only; anonymous memory, zero until touched). It answers "does this
    /// client hold `id`" (Plasma's `release` check) without a map of held
    /// ids, which cost a third of a batched get.
    tags: MmapMut,
    slots: usize,
    key: u64,
    /// Whether the store keeps the homes' reach (`shared_table::FEATURE_REACH`).
    reach: bool,
    /// Whether the holds region has room for counts
    /// (`shared_table::FEATURE_COUNTS`).
    counts: bool,
    /// Whether the store may replace the table
    /// (`shared_table::FEATURE_REPLACED`).
    replaceable: bool,
}

impl TableView {
    /// Maps the table and the holds the store sent with the handshake.
    pub fn map(table: OwnedFd, holds: OwnedFd, slots: u64) -> Result<Self> {
        let bad = |what: String| ClientError::Protocol(format!("the store's object table: {what}"));
        let slots = usize::try_from(slots).map_err(|_| bad("too many slots".into()))?;
        let table = AlignedMap::map(table.as_fd(), table_len(slots), false)
            .map_err(|e| bad(format!("cannot map it: {e}")))?;
        let holds = AlignedMap::map(holds.as_fd(), shared_table::holds_region_len(slots), true)
            .map_err(|e| bad(format!("cannot map the holds: {e}")))?;
        let tags = MmapMut::map_anon(slots.max(1) * 8)
            .map_err(|e| bad(format!("cannot map the tags: {e}")))?;
        if slots >= WARM_FROM {
            // A large table's tags are mapped in ahead too ([`warm`]), in
            // 2 MiB pages where the kernel gives them (private memory:
            // `transparent_hugepage/enabled` `madvise` or `always`). Not a
            // small table's: the first take would wait for a 2 MiB page to
            // be cleared (9–16 ms on a VM whose host backs it then).
            let _ = tags.advise(memmap2::Advice::HugePage);
        }
        let mut v = Self {
            table,
            holds,
            tags,
            slots,
            key: 0,
            reach: false,
            counts: false,
            replaceable: false,
        };
        let h = v.header();
        if h.magic.load(Ordering::Acquire) != shared_table::MAGIC
            || h.slots.load(Ordering::Relaxed) != slots as u64
        {
            return Err(bad("unknown layout".into()));
        }
        let (key, features) = (
            h.key.load(Ordering::Relaxed),
            h.features.load(Ordering::Relaxed),
        );
        v.key = key;
        v.reach = features & shared_table::FEATURE_REACH != 0;
        v.counts = features & shared_table::FEATURE_COUNTS != 0;
        v.replaceable = features & shared_table::FEATURE_REPLACED != 0;
        Ok(v)
    }

    /// Whether the store moved every object of this table into another
    /// (it grew or shrank with the store's object count).
    pub fn replaced(&self) -> bool {
        self.replaceable && self.header().replaced.load(Ordering::Acquire) != 0
    }

    fn header(&self) -> &Header {
        // Safety: the mapping is page-aligned and holds the header first;
        // `Header` is a `repr(C)` block of atomics, valid for any bytes; the
        // mapping lives as long as `self`. Read-only mapping: only loads.
        unsafe { &*(self.table.as_ptr() as *const Header) }
    }

    fn slots(&self) -> &[Slot] {
        // Safety: `slots` slots follow the header inside the mapping (mapped
        // at `table_len(slots)` above, 4-byte aligned); `Slot` is a `repr(C)` block
        // of atomics valid for any bytes; only loads are made through it
        // (the mapping is read-only, the store writes).
        unsafe {
            std::slice::from_raw_parts(
                self.table.as_ptr().add(HEADER_BYTES) as *const Slot,
                self.slots,
            )
        }
    }

    fn holds(&self) -> &[AtomicU32] {
        // Safety: the holds region is `slots` u32s, mapped read-write,
        // page-aligned; `AtomicU32` is valid for any bytes; the store reads
        // it concurrently, which atomics allow.
        unsafe { std::slice::from_raw_parts(self.holds.as_ptr() as *const AtomicU32, self.slots) }
    }

    /// Counts one more request of kind `which` (`shared_table::COUNT_GET`,
    /// `shared_table::COUNT_CONTAINS`) answered from the table, for the store's
    /// metrics.
    pub fn count(&self, which: usize) {
        if !self.counts {
            return; // an older store: its regions end after the ring
        }
        // Safety: `COUNTS` u64s at `counts_offset` (64-byte aligned) lie
        // inside the holds mapping (`holds_region_len`); atomics are valid
        // for any bytes, and the store reads them concurrently.
        let counts = unsafe {
            std::slice::from_raw_parts(
                self.holds
                    .as_ptr()
                    .add(shared_table::counts_offset(self.slots))
                    as *const AtomicU64,
                shared_table::COUNTS,
            )
        };
        shared_table::count(counts, which);
    }

    fn tags(&self) -> &[AtomicU64] {
        // Safety: `slots` u64s of private anonymous memory, page-aligned,
        // alive as long as `self`; `AtomicU64` is valid for any bytes.
        unsafe { std::slice::from_raw_parts(self.tags.as_ptr() as *const AtomicU64, self.slots) }
    }

    /// A 64-bit tag of `id`, never 0 (a keyed hash unlike the slot's).
    fn tag(&self, words: &[u64; 3]) -> u64 {
        shared_table::home(words, !self.key, usize::MAX) as u64 | 1
    }

    /// Asks the CPU to start loading what taking a hold on `id` will touch
    /// (its home slot, its hold and its tag). A take is a chain of atomic
    /// operations whose locked instructions wait for each cache miss in
    /// turn; a batched get asks for every object's lines before its first
    /// take, so that the misses overlap and it waits for memory once
    /// instead of three times per object. (Asking a few ids ahead of each
    /// take instead was slower: 419 µs against 328 µs a batch of 1,000
    /// among 10^7 objects.)
    pub fn prefetch(&self, id: &ObjectId) {
        let i = shared_table::home(&shared_table::id_words(id), self.key, self.slots);
        self.slots()[i].prefetch();
        shared_table::prefetch(self.holds()[i].as_ptr());
        shared_table::prefetch(self.tags()[i].as_ptr());
    }

    /// Takes a hold on the sealed object `id`.
    pub fn take(&self, id: &ObjectId) -> Take {
        let took = shared_table::take(self.slots(), self.holds(), self.key, id, self.reach);
        if let Take::Held(slot, _) = took {
            // A slot is taken again only once the store has stopped adopting
            // holds on it, so while any hold of this process is on it, it
            // is for this id.
            self.tags()[slot].store(self.tag(&shared_table::id_words(id)), Ordering::Relaxed);
        }
        took
    }

    /// Whether this process holds `id` through the table (a buffer of it is
    /// alive), even if it was deleted or its slot reused since.
    pub fn holds_id(&self, id: &ObjectId) -> bool {
        let words = shared_table::id_words(id);
        let tag = self.tag(&words);
        let (holds, tags) = (self.holds(), self.tags());
        let home = shared_table::home(&words, self.key, self.slots);
        let len = if self.reach {
            shared_table::MAX_REACH
        } else {
            shared_table::PROBES
        };
        shared_table::window_of(home, self.slots, len).any(|i| {
            tags[i].load(Ordering::Relaxed) == tag
                && holds[i].load(Ordering::Relaxed) & !shared_table::ADOPTED != 0
        })
    }

    /// Gives back a hold taken on `slot`: true when the store had adopted
    /// it (release one reference over the socket). Recorded in the ring of
    /// recent releases (for the store's eviction order).
    pub fn give_back(&self, slot: usize) -> bool {
        let adopted = self.holds().get(slot).is_some_and(shared_table::give_back);
        let at = shared_table::ring_offset(self.slots);
        // Safety: the head (8 bytes, 64-byte aligned) and `RING` u32s lie
        // inside the holds mapping (`holds_region_len`); atomics are valid
        // for any bytes, and the store reads them concurrently.
        let (head, ring) = unsafe {
            let base = self.holds.as_ptr().add(at);
            (
                &*(base as *const AtomicU64),
                std::slice::from_raw_parts(base.add(8) as *const AtomicU32, shared_table::RING),
            )
        };
        shared_table::record_release(head, ring, slot);
        adopted
    }

    /// Whether the table shows `id` now: `Some(true)` published,
    /// `Some(false)` not, `None` when it cannot tell (a slot being
    /// written, or the table replaced by a larger one).
    pub fn lookup(&self, id: &ObjectId) -> Option<bool> {
        if self.replaced() {
            return None;
        }
        shared_table::find(
            self.slots(),
            self.key,
            &shared_table::id_words(id),
            self.reach,
        )
        .ok()
        .map(|found| found.is_some())
    }

    /// Whether `id` is sealed in this store's memory now (`false`: not in
    /// the table; it may still be being created, spilled or elsewhere).
    pub fn contains(&self, id: &ObjectId) -> bool {
        matches!(
            shared_table::find(
                self.slots(),
                self.key,
                &shared_table::id_words(id),
                self.reach
            ),
            Ok(Some(_))
        )
    }
}

/// The table in use, and how to get the one that replaces it when the
/// store rebuilds it for its object count (docs/protocol.md, "A table that
/// grows"). Buffers read through a table keep it (an `Arc`): a replaced
/// table stays mapped while any of its holds is alive.
#[derive(Debug)]
pub(crate) struct Tables {
    current: RwLock<Arc<TableView>>,
    /// Replaced tables, while buffers of theirs are alive (`holds_id`).
    old: Mutex<Vec<Weak<TableView>>>,
    /// This connection's id and secret, for `AttachTable`.
    client_id: u64,
    token: Vec<u8>,
    /// When asking for the new table last failed (a store at its
    /// `--max-clients`, say): not asked again for a second, so that misses
    /// meanwhile cost no connection each.
    failed_at: Mutex<Option<std::time::Instant>>,
}

/// Tables of at least this many slots are mapped in ahead of use
/// ([`warm`]).
const WARM_FROM: usize = 524_288;
/// How much [`warm`] maps in at a time.
const WARM_CHUNK: usize = 32 << 20;

/// Maps the whole of a large table, of this client's holds and of its
/// tags into this process, on a thread of its own, 32 MiB at a time while
/// the view lives (`MADV_POPULATE_READ` and `_WRITE`): otherwise the first
/// touch of each page costs a page fault (the table's one per 64 KiB; the
/// holds' and tags', which allocate the page, one per 4 KiB or 2 MiB), and
/// on a table of millions of slots nearly every get of a random object
/// touches pages of its own for a long while: at 3 million objects, 9.3 µs
/// a get on a fresh connection against 1.2 µs warm before this, 1.16 µs
/// against 0.83 µs after (bench/cold_gets.py). A table replaced meanwhile
/// is not warmed further. The holds then take 4 B per slot of memory from the start
/// and the tags 8 B, what a reader of random objects reaches anyway (and
/// the store's scans of the holds touch all of them). The connection does
/// not wait; gets meanwhile fault as before.
///
/// The table and the holds are then put in 2 MiB pages
/// ([`AlignedMap::collapse`]; the tags, private memory, get them from
/// `MADV_HUGEPAGE`): a get of a random object among millions otherwise
/// waits for a page walk per region it touches, on top of the cache misses.
/// The first client to warm a table copies it (about 2.5 ms per 2 MiB on a
/// virtual machine, on this thread); later ones find it done.
fn warm(view: &Arc<TableView>) {
    if view.slots < WARM_FROM {
        return;
    }
    let table = view.table.len();
    let (holds, tags) = (view.holds.len(), view.tags.len());
    let weak = Arc::downgrade(view);
    let _ = std::thread::Builder::new()
        .name("fp-table-warm".into())
        .spawn(move || {
            let of = |which: u8, len: usize| {
                (0..len).step_by(WARM_CHUNK).map(move |at| (which, at, len))
            };
            let mut collapse = true;
            for (which, at, len) in of(0, holds).chain(of(1, tags)).chain(of(2, table)) {
                let Some(v) = weak.upgrade().filter(|v| !v.replaced()) else {
                    return;
                };
                let n = WARM_CHUNK.min(len - at);
                let shared = match which {
                    0 => Some((&v.holds, true)),
                    1 => None,
                    _ => Some((&v.table, false)),
                };
                let done = match shared {
                    Some((m, write)) => m.populate(at, n, write),
                    None => v.tags.advise_range(memmap2::Advice::PopulateWrite, at, n),
                };
                if done.is_err() {
                    return; // a kernel before 5.14: pages fault in as before
                }
                // Whole 2 MiB pages only (`at` is a multiple of them).
                let whole = n / HUGE_PAGE * HUGE_PAGE;
                if let (Some((m, _)), true, true) = (shared, collapse, whole > 0) {
                    if let Err(e) = m.collapse(at, whole) {
                        // EINVAL: a kernel before 6.1, or huge pages denied.
                        // Otherwise (no free huge page now, a page busy)
                        // the next chunk may still go.
                        collapse = e.raw_os_error() != Some(libc::EINVAL);
                    }
                }
            }
        });
}

impl Tables {
    pub fn new(view: TableView, client_id: u64, token: Vec<u8>) -> Self {
        let view = Arc::new(view);
        warm(&view);
        Self {
            current: RwLock::new(view),
            old: Mutex::new(Vec::new()),
            client_id,
            token,
            failed_at: Mutex::new(None),
        }
    }

    /// The table in use.
    pub fn current(&self) -> Arc<TableView> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The table that replaced `t`, if the store replaced it: asked for
    /// once (on a second connection, `attach`), then used by every thread.
    /// `None` when `t` is still in use or the store would not say (every
    /// read then asks the store, as without a table).
    pub fn replacement(
        &self,
        t: &Arc<TableView>,
        attach: impl FnOnce(u64, &[u8]) -> Result<(u64, OwnedFd, OwnedFd)>,
    ) -> Option<Arc<TableView>> {
        if !t.replaced() {
            return None;
        }
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        if !Arc::ptr_eq(&cur, t) {
            return Some(cur.clone()); // another thread got it first
        }
        let mut failed_at = self.failed_at.lock().unwrap_or_else(|p| p.into_inner());
        if failed_at.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1)) {
            return None;
        }
        let attached = attach(self.client_id, &self.token)
            .and_then(|(slots, table, holds)| TableView::map(table, holds, slots));
        let Ok(view) = attached else {
            *failed_at = Some(std::time::Instant::now());
            return None;
        };
        *failed_at = None;
        let next = Arc::new(view);
        warm(&next);
        let was = std::mem::replace(&mut *cur, next.clone());
        let mut old = self.old.lock().unwrap_or_else(|p| p.into_inner());
        old.retain(|w| w.strong_count() > 0);
        old.push(Arc::downgrade(&was));
        Some(next)
    }

    /// Whether this process holds `id` through any table it read from.
    pub fn holds_id(&self, id: &ObjectId) -> bool {
        if self.current().holds_id(id) {
            return true;
        }
        let old = self.old.lock().unwrap_or_else(|p| p.into_inner());
        old.iter().filter_map(Weak::upgrade).any(|t| t.holds_id(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn memfd(len: usize) -> std::fs::File {
        use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
        let f = std::fs::File::from(memfd_create(c"table-test", MemFdCreateFlag::empty()).unwrap());
        f.set_len(len as u64).unwrap();
        f
    }

    #[test]
    fn a_large_tables_view_is_mapped_in_2_mib_pages_once_warmed() {
        if !crate::aligned_map::kernel_collapses() {
            eprintln!("skipped: this kernel does not collapse shared memory into 2 MiB pages");
            return;
        }
        let slots = WARM_FROM;
        let table = memfd(table_len(slots));
        {
            let m = AlignedMap::map(table.as_fd(), table_len(slots), true).unwrap();
            // Safety: the header lies at the start of the mapping, which is
            // page-aligned and longer than it; atomics are valid for any bytes.
            let h = unsafe { &*(m.as_ptr() as *const Header) };
            h.slots.store(slots as u64, Ordering::Relaxed);
            h.key.store(7, Ordering::Relaxed);
            h.magic.store(shared_table::MAGIC, Ordering::Release);
        }
        let holds = memfd(shared_table::holds_region_len(slots));
        let view = TableView::map(table.into(), holds.into(), slots as u64).unwrap();
        let tables = Tables::new(view, 1, Vec::new());
        let view = tables.current();
        let whole = |len: usize| (len / HUGE_PAGE * HUGE_PAGE / 1024) as u64;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (t, h) = (
                view.table.huge_bytes() / 1024,
                view.holds.huge_bytes() / 1024,
            );
            if t == whole(view.table.len()) && h == whole(view.holds.len()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "after 60 s, {t} kB of the table and {h} kB of the holds are in 2 MiB pages"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

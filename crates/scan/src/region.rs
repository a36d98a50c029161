//! Where received batches land: 64-byte-aligned regions, one per batch,
//! shared by the batch's buffers and given back to a pool when the last of
//! them goes. A batch then lands in memory whose pages are already there.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use arrow_buffer::Buffer;

use crate::error::{Error, Result};
use crate::layout::{place, ALIGN};

const HUGE_PAGE: usize = 2 << 20;

/// One 64-byte-aligned allocation.
#[derive(Debug)]
struct RawRegion {
    ptr: NonNull<u8>,
    layout: Layout,
}

// Safety: the region is plain bytes owned by this value alone, freed only in
// `drop`; the bytes are shared read-only once received.
unsafe impl Send for RawRegion {}
// Safety: as above; `&RawRegion` gives no access to the bytes at all.
unsafe impl Sync for RawRegion {}

impl RawRegion {
    fn alloc(size: usize) -> Result<RawRegion> {
        let layout = Layout::from_size_align(size.max(1), ALIGN)
            .map_err(|_| Error::Layout(format!("a batch of {size} bytes cannot be allocated")))?;
        // Safety: the layout's size is at least 1.
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) })
            .ok_or_else(|| Error::Layout(format!("no memory for a batch of {size} bytes")))?;
        if size >= 2 * HUGE_PAGE {
            // Transparent huge pages where the system allows them on request:
            // one fault per 2 MiB instead of per 4 KiB as the batch arrives.
            let start = (ptr.as_ptr() as usize).next_multiple_of(HUGE_PAGE);
            let end = (ptr.as_ptr() as usize + size) & !(HUGE_PAGE - 1);
            // Safety: `start..end` lies inside this allocation; the advice
            // changes how its pages are backed, never their contents. Its
            // failure (no THP on this system) changes nothing.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
        Ok(RawRegion { ptr, layout })
    }
}

impl Drop for RawRegion {
    fn drop(&mut self) {
        // Safety: `ptr` came from `alloc` with this very layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Regions of batches the consumer let go, kept for the next batches: a
/// large batch then lands in memory whose pages are already there, instead
/// of faulting in (and zeroing) fresh ones; the allocator maps anything over
/// 32 MiB anew each time. This is what pyarrow's allocator does for the
/// memory it hands out; [`RegionPool::shared`] is the process's pool, kept
/// across scans. It holds at most [`RegionPool::KEEP`] regions and
/// [`RegionPool::KEEP_BYTES`] bytes, and frees a region left unused for
/// [`RegionPool::IDLE`] the next time a scan takes or gives one.
#[derive(Debug, Default)]
pub struct RegionPool {
    free: Mutex<Vec<(RawRegion, Instant)>>,
}

impl RegionPool {
    /// Regions kept at most.
    pub const KEEP: usize = 6;
    /// Bytes kept at most.
    pub const KEEP_BYTES: usize = 768 << 20;
    /// A region unused for this long is freed.
    pub const IDLE: Duration = Duration::from_secs(10);

    /// The process's pool.
    pub fn shared() -> Arc<RegionPool> {
        static SHARED: OnceLock<Arc<RegionPool>> = OnceLock::new();
        SHARED.get_or_init(Arc::default).clone()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(RawRegion, Instant)>> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        free.retain(|(_, since)| now.duration_since(*since) < Self::IDLE);
        free
    }

    /// What a new region for a batch of `size` bytes allocates: from 1 MiB
    /// up, 1/16 more, in whole huge pages. Batches of one result differ by
    /// a few percent (strings); allocated to the byte, a slightly larger
    /// batch would find no region to reuse and fault in fresh pages.
    pub fn room(size: usize) -> usize {
        if size < (1 << 20) {
            return size;
        }
        size.saturating_add(size / 16)
            .checked_next_multiple_of(HUGE_PAGE)
            .unwrap_or(size)
    }

    /// A region of at least `size` bytes: the smallest free one that is not
    /// more than twice as large, else a new one (of [`RegionPool::room`]).
    fn take(&self, size: usize) -> Result<RawRegion> {
        let mut free = self.lock();
        let fits = free
            .iter()
            .enumerate()
            .filter(|(_, (r, _))| r.layout.size() >= size && r.layout.size() / 2 <= size.max(1))
            .min_by_key(|(_, (r, _))| r.layout.size())
            .map(|(i, _)| i);
        match fits {
            Some(i) => Ok(free.swap_remove(i).0),
            None => {
                drop(free);
                RawRegion::alloc(Self::room(size))
            }
        }
    }

    fn give_back(&self, region: RawRegion) {
        let size = region.layout.size();
        if size > Self::KEEP_BYTES {
            return;
        }
        let mut free = self.lock();
        // Make room by letting the smallest go: large regions are the costly
        // ones to fault in.
        loop {
            let kept: usize = free.iter().map(|(r, _)| r.layout.size()).sum();
            if free.len() < Self::KEEP && kept + size <= Self::KEEP_BYTES {
                break;
            }
            let smallest = (0..free.len()).min_by_key(|&i| free[i].0.layout.size());
            match smallest {
                Some(i) if free[i].0.layout.size() <= size => {
                    free.swap_remove(i);
                }
                _ => return,
            }
        }
        free.push((region, Instant::now()));
    }

    /// Bytes kept for reuse.
    pub fn kept_bytes(&self) -> usize {
        self.lock().iter().map(|(r, _)| r.layout.size()).sum()
    }
}

/// A region that buffers share; it goes back to its pool (if that still
/// exists) when the last buffer goes.
#[derive(Debug)]
struct Region {
    raw: Option<RawRegion>,
    home: Weak<RegionPool>,
}

impl Region {
    fn ptr(&self) -> *mut u8 {
        self.raw
            .as_ref()
            .map_or(std::ptr::null_mut(), |r| r.ptr.as_ptr())
    }
}

impl std::panic::RefUnwindSafe for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        if let (Some(raw), Some(pool)) = (self.raw.take(), self.home.upgrade()) {
            pool.give_back(raw);
        }
    }
}

/// Memory for one received batch: buffers of `sizes` placed 64-byte
/// aligned in one region, the bytes between them zeroed.
#[derive(Debug)]
pub struct Landing {
    region: Arc<Region>,
    offsets: Vec<usize>,
    sizes: Vec<usize>,
}

impl Landing {
    /// Takes the room from `pool` (or allocates it); an error (not an
    /// abort) if there is none.
    pub fn new(sizes: Vec<usize>, pool: &Arc<RegionPool>) -> Result<Landing> {
        let (offsets, end) =
            place(&sizes).ok_or_else(|| Error::Layout("a batch's buffers overflow".into()))?;
        let raw = pool.take(end)?;
        let region = Region {
            raw: Some(raw),
            home: Arc::downgrade(pool),
        };
        let mut at = 0;
        for (&o, &s) in offsets.iter().zip(&sizes).chain([(&end, &0)]) {
            // Safety: `at..o` lies inside the region (offsets grow and end
            // within its size), and is not a buffer's place.
            unsafe { region.ptr().add(at).write_bytes(0, o - at) };
            at = o + s;
        }
        Ok(Landing {
            region: Arc::new(region),
            offsets,
            sizes,
        })
    }

    /// Where each buffer goes, for [`crate::io::recv_places`].
    pub fn places(&self) -> Vec<crate::io::Place> {
        self.offsets
            .iter()
            .zip(&self.sizes)
            .map(|(&o, &len)| crate::io::Place {
                // Safety: `o + len` is within the region.
                ptr: unsafe { self.region.ptr().add(o) },
                len,
            })
            .collect()
    }

    /// The buffers, once every place was filled.
    ///
    /// # Safety
    /// Every place of [`Landing::places`] must have been written in full.
    pub unsafe fn buffers(self) -> Vec<Buffer> {
        let owner: Arc<dyn arrow_buffer::alloc::Allocation> = self.region.clone();
        self.offsets
            .iter()
            .zip(&self.sizes)
            .map(|(&o, &len)| {
                // Safety: `o..o + len` is initialized memory of the region
                // (the caller filled it), which `owner` keeps alive and
                // nobody writes any more until the last buffer is gone.
                let ptr = unsafe { NonNull::new_unchecked(self.region.ptr().add(o)) };
                // Safety: as above.
                unsafe { Buffer::from_custom_allocation(ptr, len, owner.clone()) }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_the_consumer_let_go_takes_the_next_batch() {
        let pool = Arc::new(RegionPool::default());
        let first = Landing::new(vec![40 << 20], &pool).unwrap();
        let at = first.places()[0].ptr as usize;
        // Safety: filled with zeros (a test of placement only).
        unsafe { first.places()[0].ptr.write_bytes(0, 40 << 20) };
        // Safety: filled above.
        drop(unsafe { first.buffers() });
        let second = Landing::new(vec![39 << 20], &pool).unwrap();
        assert_eq!(second.places()[0].ptr as usize, at);
        // One much smaller does not pin the large region.
        let small = Landing::new(vec![1000], &pool).unwrap();
        assert_ne!(small.places()[0].ptr as usize, at);
        drop(second);
        assert_eq!(pool.kept_bytes(), RegionPool::room(40 << 20));
        // Past the byte cap, the smallest regions go first.
        let big: Vec<Landing> = (0..4)
            .map(|_| Landing::new(vec![300 << 20], &pool).unwrap())
            .collect();
        for l in big {
            // Safety: filled with zeros (a test of placement only).
            unsafe { l.places()[0].ptr.write_bytes(0, 300 << 20) };
            // Safety: filled above.
            drop(unsafe { l.buffers() });
        }
        assert_eq!(pool.kept_bytes(), 2 * RegionPool::room(300 << 20));
    }

    #[test]
    fn a_slightly_larger_batch_reuses_the_last_region() {
        let pool = Arc::new(RegionPool::default());
        let sizes = vec![20 << 20, 1 << 20];
        let first = Landing::new(sizes.clone(), &pool).unwrap();
        let at = first.places()[0].ptr as usize;
        drop(first);
        // A few percent more bytes (longer strings in the next batch).
        let second = Landing::new(vec![(20 << 20) + (1 << 20), 1 << 20], &pool).unwrap();
        assert_eq!(second.places()[0].ptr as usize, at);
    }
}

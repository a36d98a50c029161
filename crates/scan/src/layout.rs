//! A record batch as a flat descriptor plus the list of its buffers, and
//! back, without copying column data. The descriptor is the one
//! `ferroplasma.arrow_layout` writes and reads (a batch one side flattens,
//! the other side rebuilds, in either language): one entry per array node,
//! depth first (a column, its children, then its dictionary),
//!
//! ```text
//! length, null_count, offset, n_buffers, n_children, has_dictionary,
//! size of buffer 0, ..., size of buffer n_buffers-1   (-1: absent)
//! ```
//!
//! A node's buffers are its validity bitmap (or an absent slot, for types
//! without one), then its other buffers, as pyarrow's `Array.buffers()` and
//! the Arrow C data interface order them.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use arrow_array::{make_array, RecordBatch, RecordBatchOptions};
use arrow_buffer::{Buffer, MutableBuffer};
use arrow_data::ArrayData;
use arrow_schema::{DataType, SchemaRef};

use crate::error::{Error, Result};

/// Every received buffer starts on a multiple of this.
pub const ALIGN: usize = 64;
const HUGE_PAGE: usize = 2 << 20;
const NODE_HEAD: usize = 6;

/// The descriptor and the buffers (shared, not copied) of `batch`.
pub fn flatten(batch: &RecordBatch) -> (Vec<i64>, Vec<Buffer>) {
    let mut desc = Vec::new();
    let mut bufs = Vec::new();
    for col in batch.columns() {
        walk(&col.to_data(), &mut desc, &mut bufs);
    }
    (desc, bufs)
}

fn walk(data: &ArrayData, desc: &mut Vec<i64>, bufs: &mut Vec<Buffer>) {
    let is_dict = matches!(data.data_type(), DataType::Dictionary(..));
    let children: &[ArrayData] = if is_dict { &[] } else { data.child_data() };
    desc.extend([
        data.len() as i64,
        data.null_count() as i64,
        data.offset() as i64,
        1 + data.buffers().len() as i64,
        children.len() as i64,
        i64::from(is_dict),
    ]);
    match validity(data) {
        Some(b) => {
            desc.push(b.len() as i64);
            bufs.push(b);
        }
        None => desc.push(-1),
    }
    for b in data.buffers() {
        desc.push(b.len() as i64);
        bufs.push(b.clone());
    }
    for c in children {
        walk(c, desc, bufs);
    }
    if is_dict {
        if let Some(values) = data.child_data().first() {
            walk(values, desc, bufs);
        }
    }
}

/// The validity bitmap as it travels: bit `offset + i` for row `i`, where
/// `offset` is the array's. A bitmap kept at another bit offset (possible
/// after slicing in Rust, never from the C data interface) is redrawn.
fn validity(data: &ArrayData) -> Option<Buffer> {
    let nulls = data.nulls()?;
    if nulls.offset() == data.offset() {
        return Some(nulls.buffer().clone());
    }
    let bits = data.offset() + data.len();
    let mut out = MutableBuffer::from_len_zeroed(bits.div_ceil(8));
    for i in 0..data.len() {
        if nulls.is_valid(i) {
            arrow_buffer::bit_util::set_bit(out.as_slice_mut(), data.offset() + i);
        }
    }
    Some(out.into())
}

/// The sizes of the buffers that travel, in order; an error for a
/// descriptor that is not well formed.
pub fn sizes(desc: &[i64]) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < desc.len() {
        let bad = || Error::Layout(format!("malformed Arrow layout descriptor at entry {i}"));
        if i + NODE_HEAD > desc.len() {
            return Err(bad());
        }
        let nbuf = usize::try_from(desc[i + 3]).map_err(|_| bad())?;
        let end = i
            .checked_add(NODE_HEAD)
            .and_then(|x| x.checked_add(nbuf))
            .filter(|&e| e <= desc.len())
            .ok_or_else(bad)?;
        if desc[i] < 0 || desc[i + 1] < -1 || desc[i + 2] < 0 {
            return Err(bad());
        }
        for &s in &desc[i + NODE_HEAD..end] {
            if s >= 0 {
                out.push(s as usize);
            } else if s != -1 {
                return Err(bad());
            }
        }
        i = end;
    }
    Ok(out)
}

/// Offsets that put every buffer on a 64-byte boundary, and the end of the
/// last one (`None` if that overflows).
pub fn place(sizes: &[usize]) -> Option<(Vec<usize>, usize)> {
    let mut offsets = Vec::with_capacity(sizes.len());
    let mut at = 0usize;
    for &s in sizes {
        at = at.checked_add(ALIGN - 1)? & !(ALIGN - 1);
        offsets.push(at);
        at = at.checked_add(s)?;
    }
    Some((offsets, at))
}

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

    /// A region of at least `size` bytes: the smallest free one that is not
    /// more than twice as large, else a new one.
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
                RawRegion::alloc(size)
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

struct Cursor<'a> {
    desc: &'a [i64],
    at: usize,
    bufs: std::vec::IntoIter<Buffer>,
}

fn child_types(dt: &DataType) -> Vec<&DataType> {
    match dt {
        DataType::Struct(fields) => fields.iter().map(|f| f.data_type()).collect(),
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => vec![f.data_type()],
        DataType::Union(fields, _) => fields.iter().map(|(_, f)| f.data_type()).collect(),
        DataType::RunEndEncoded(r, v) => vec![r.data_type(), v.data_type()],
        _ => vec![],
    }
}

impl Cursor<'_> {
    fn node(&mut self, dt: &DataType) -> Result<ArrayData> {
        let d = self.desc;
        if self.at + NODE_HEAD > d.len() {
            return Err(Error::Layout(
                "Arrow layout descriptor is shorter than the schema".into(),
            ));
        }
        let head = &d[self.at..self.at + NODE_HEAD];
        let (len, nulls, offset) = (head[0] as usize, head[1], head[2] as usize);
        let (nbuf, nchild, has_dict) = (head[3] as usize, head[4] as usize, head[5] != 0);
        let sizes = &d[self.at + NODE_HEAD..self.at + NODE_HEAD + nbuf];
        self.at += NODE_HEAD + nbuf;
        let mut own = Vec::with_capacity(nbuf);
        for &s in sizes {
            own.push(if s < 0 {
                None
            } else {
                Some(self.bufs.next().ok_or_else(|| {
                    Error::Layout("fewer Arrow buffers than the descriptor lists".into())
                })?)
            });
        }
        let is_dict = matches!(dt, DataType::Dictionary(..));
        if has_dict != is_dict {
            return Err(Error::Layout(format!(
                "descriptor and schema disagree about {dt}"
            )));
        }
        let mut own = own.into_iter();
        let validity = own.next().flatten();
        // arrow-rs asserts (panics) on a bitmap too short for its rows,
        // before it validates anything: refuse it here.
        if let Some(v) = &validity {
            let bits = offset
                .checked_add(len)
                .filter(|&b| b <= v.len().saturating_mul(8));
            if bits.is_none() {
                return Err(Error::Layout(format!(
                    "a {dt} validity bitmap of {} bytes for {len} rows at offset {offset}",
                    v.len()
                )));
            }
        }
        let mut b = ArrayData::builder(dt.clone())
            .len(len)
            .offset(offset)
            .null_bit_buffer(validity)
            .buffers(own.map(Option::unwrap_or_default).collect());
        if nulls >= 0 {
            b = b.null_count(nulls as usize);
        }
        if let DataType::Dictionary(_, values) = dt {
            if nchild != 0 {
                return Err(Error::Layout(format!("{dt} has no children, not {nchild}")));
            }
            b = b.add_child_data(self.node(values)?);
        } else {
            let types = child_types(dt);
            if types.len() != nchild {
                return Err(Error::Layout(format!(
                    "{dt} has {} children, not {nchild}",
                    types.len()
                )));
            }
            for t in types {
                b = b.add_child_data(self.node(t)?);
            }
        }
        // Full validation: offsets in bounds, UTF-8, dictionary keys, so
        // that a peer's bytes can never make a reader step outside them.
        b.build()
            .map_err(|e| Error::Layout(format!("buffers do not make a valid {dt} array: {e}")))
    }
}

/// A `RecordBatch` of `schema` around `bufs` (not copied), as `desc` says.
/// Every error is a [`Error::Layout`], even one arrow-rs would report by
/// panicking: bytes from a peer never end the process.
pub fn rebuild(
    schema: &SchemaRef,
    rows: usize,
    desc: &[i64],
    bufs: Vec<Buffer>,
) -> Result<RecordBatch> {
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rebuild_checked(schema, rows, desc, bufs)
    }));
    built.unwrap_or_else(|_| {
        Err(Error::Layout(
            "buffers that do not make the arrays the schema says".into(),
        ))
    })
}

fn rebuild_checked(
    schema: &SchemaRef,
    rows: usize,
    desc: &[i64],
    bufs: Vec<Buffer>,
) -> Result<RecordBatch> {
    sizes(desc)?;
    let mut cur = Cursor {
        desc,
        at: 0,
        bufs: bufs.into_iter(),
    };
    let mut cols = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        cols.push(make_array(cur.node(f.data_type())?));
    }
    if cur.at != desc.len() {
        return Err(Error::Layout(
            "Arrow layout descriptor is longer than the schema".into(),
        ));
    }
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        cols,
        &options,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{
        builder::{ListBuilder, StringBuilder, StringDictionaryBuilder},
        types::Int32Type,
        Array, ArrayRef, Int64Array, StructArray,
    };
    use arrow_schema::{Field, Schema};

    fn round_trip(batch: &RecordBatch) -> RecordBatch {
        let (desc, bufs) = flatten(batch);
        let sizes = sizes(&desc).unwrap();
        assert_eq!(sizes, bufs.iter().map(Buffer::len).collect::<Vec<_>>());
        let landing = Landing::new(sizes, &Arc::new(RegionPool::default())).unwrap();
        for (p, b) in landing.places().iter().zip(&bufs) {
            assert_eq!(p.ptr as usize % ALIGN, 0);
            // Safety: `p` is a place of `landing`, `b` has `p.len` bytes.
            unsafe { p.ptr.copy_from_nonoverlapping(b.as_ptr(), p.len) };
        }
        // Safety: every place was just filled.
        let got = unsafe { landing.buffers() };
        rebuild(&batch.schema(), batch.num_rows(), &desc, got).unwrap()
    }

    #[test]
    fn nested_dictionary_and_sliced_columns_round_trip() {
        let ints: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None, Some(3), Some(4)]));
        let mut strs = StringBuilder::new();
        for s in [Some("a"), None, Some("ccc"), Some("")] {
            strs.append_option(s);
        }
        let strs: ArrayRef = Arc::new(strs.finish());
        let mut lists = ListBuilder::new(StringBuilder::new());
        lists.values().append_value("x");
        lists.append(true);
        lists.append(false);
        lists.values().append_value("y");
        lists.values().append_value("z");
        lists.append(true);
        lists.append(true);
        let lists: ArrayRef = Arc::new(lists.finish());
        let mut dict = StringDictionaryBuilder::<Int32Type>::new();
        for s in [Some("p"), Some("q"), None, Some("p")] {
            dict.append_option(s);
        }
        let dict: ArrayRef = Arc::new(dict.finish());
        let st: ArrayRef = Arc::new(StructArray::from(vec![
            (
                Arc::new(Field::new("i", DataType::Int64, true)),
                ints.clone(),
            ),
            (
                Arc::new(Field::new("s", DataType::Utf8, true)),
                strs.clone(),
            ),
        ]));
        let cols = vec![ints, strs, lists, dict, st];
        let schema = Arc::new(Schema::new(
            cols.iter()
                .enumerate()
                .map(|(i, c)| Field::new(format!("c{i}"), c.data_type().clone(), true))
                .collect::<Vec<_>>(),
        ));
        let batch = RecordBatch::try_new(schema, cols).unwrap();
        assert_eq!(round_trip(&batch), batch);
        let sliced = batch.slice(1, 3);
        assert_eq!(round_trip(&sliced), sliced);
        assert_eq!(round_trip(&batch.slice(4, 0)), batch.slice(4, 0));
    }

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
        assert_eq!(pool.kept_bytes(), 40 << 20);
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
        assert_eq!(pool.kept_bytes(), 600 << 20);
    }

    #[test]
    fn descriptors_that_lie_are_errors_not_crashes() {
        let batch = RecordBatch::try_from_iter([(
            "s",
            Arc::new(arrow_array::StringArray::from(vec!["ab", "c"])) as ArrayRef,
        )])
        .unwrap();
        let (desc, bufs) = flatten(&batch);
        // Offsets that point past the data.
        let mut offsets = bufs[0].as_slice().to_vec();
        offsets[8..12].copy_from_slice(&1000i32.to_le_bytes());
        let bad = vec![Buffer::from(offsets), bufs[1].clone()];
        assert!(rebuild(&batch.schema(), 2, &desc, bad).is_err());
        let mut longer = desc.clone();
        longer[0] = 50;
        assert!(rebuild(&batch.schema(), 50, &longer, bufs.clone()).is_err());
        assert!(rebuild(&batch.schema(), 2, &desc[..5], bufs.clone()).is_err());
        assert!(sizes(&[1, 0, 0, -5, 0, 0]).is_err());
        assert!(sizes(&[1, 0, 0, 1 << 40, 0, 0]).is_err());
        // A validity bitmap too short for its rows (arrow-rs would panic).
        let nulls = RecordBatch::try_from_iter([(
            "i",
            Arc::new(Int64Array::from(vec![Some(1), None, Some(3)])) as ArrayRef,
        )])
        .unwrap();
        let (mut d, b) = flatten(&nulls);
        d[0] = 4000;
        assert!(rebuild(&nulls.schema(), 4000, &d, b.clone()).is_err());
        d[0] = 3;
        d[2] = 1 << 40;
        assert!(rebuild(&nulls.schema(), 3, &d, b).is_err());
    }
}

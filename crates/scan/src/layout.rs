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

use arrow_array::{make_array, RecordBatch, RecordBatchOptions};
use arrow_buffer::{Buffer, MutableBuffer};
use arrow_data::ArrayData;
use arrow_schema::{DataType, SchemaRef};

use crate::error::{Error, Result};

/// Every received buffer starts on a multiple of this.
pub const ALIGN: usize = 64;
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
        // that a peer's bytes can never make a reader step outside them
        // (`validate::node`, right below; the children were validated as
        // they were built).
        // Safety: validation is not skipped but done by `validate::node`
        // before the array is used or returned.
        let data = unsafe { b.skip_validation(true) }
            .build()
            .map_err(|e| Error::Layout(format!("buffers do not make a valid {dt} array: {e}")))?;
        crate::validate::node(&data)?;
        Ok(data)
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
    use crate::region::{Landing, RegionPool};
    use arrow_array::{
        builder::{ListBuilder, StringBuilder, StringDictionaryBuilder},
        types::Int32Type,
        Array, ArrayRef, Int64Array, StructArray,
    };
    use arrow_schema::{Field, Schema};
    use std::sync::Arc;

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

//! The table of spilled objects: sealed objects whose bytes were moved out
//! of shared memory into segment files of the spill directory.
//!
//! The state machine only keeps the books (which object lies in which
//! segment at which offset, how full the directory is); the daemon does the
//! file I/O. Objects are spilled in batches, one segment file per batch, so
//! a thousand 1 kB objects make one file, not a thousand. A segment's file
//! can go when none of its objects is left in it.

use ferroplasma_protocol::{IdHasher, ObjectId};
use std::collections::HashMap;

/// Where a spilled object's bytes lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpillRef {
    /// Segment file number.
    pub segment: u64,
    /// Offset of the object's allocation in the segment file.
    pub offset: u64,
    /// Bytes of the allocation in the file (data, padding, metadata).
    pub len: u64,
}

/// A spilled object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spilled {
    pub at: SpillRef,
    pub data_size: u64,
    pub metadata_size: u64,
    pub create_time_us: i64,
    pub construct_us: Option<i64>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Segment {
    live_objects: u64,
    bytes: u64,
}

/// Spilled objects and the spill directory's accounting.
#[derive(Debug)]
pub(crate) struct SpillTable {
    /// Bytes the spill directory may hold.
    pub limit: u64,
    /// Bytes held by segment files still on disk.
    pub used: u64,
    /// Bytes of segments being written.
    pub reserved: u64,
    pub objects: HashMap<ObjectId, Spilled, IdHasher>,
    segments: HashMap<u64, Segment>,
    next_segment: u64,
    /// Objects spilled and restored since start.
    pub spilled_total: u64,
    pub restored_total: u64,
}

impl SpillTable {
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            used: 0,
            reserved: 0,
            objects: HashMap::default(),
            segments: HashMap::new(),
            next_segment: 1,
            spilled_total: 0,
            restored_total: 0,
        }
    }

    /// Reserves a segment number and room for a batch of `bytes`; `None`
    /// when the directory's limit would be passed.
    pub fn reserve(&mut self, bytes: u64) -> Option<u64> {
        if self
            .used
            .saturating_add(self.reserved)
            .saturating_add(bytes)
            > self.limit
        {
            return None;
        }
        self.reserved += bytes;
        let n = self.next_segment;
        self.next_segment += 1;
        Some(n)
    }

    /// Gives back the room of a segment that was not written.
    pub fn cancel(&mut self, bytes: u64) {
        self.reserved -= bytes;
    }

    /// Records a written segment and its objects; false (and nothing
    /// recorded) when none of them was left to spill: the file can go.
    pub fn add_segment(
        &mut self,
        segment: u64,
        bytes: u64,
        objects: Vec<(ObjectId, Spilled)>,
    ) -> bool {
        self.reserved -= bytes;
        if objects.is_empty() {
            return false;
        }
        self.used += bytes;
        self.segments.insert(
            segment,
            Segment {
                live_objects: objects.len() as u64,
                bytes,
            },
        );
        self.spilled_total += objects.len() as u64;
        self.objects.extend(objects);
        true
    }

    /// Forgets a spilled object (restored or deleted). Returns the object and,
    /// when its segment has no object left, the segment to remove.
    pub fn take(&mut self, id: &ObjectId) -> Option<(Spilled, Option<u64>)> {
        let s = self.objects.remove(id)?;
        let seg = self
            .segments
            .get_mut(&s.at.segment)
            .expect("segment of a spilled object");
        seg.live_objects -= 1;
        let dead = if seg.live_objects == 0 {
            self.used -= seg.bytes;
            self.segments.remove(&s.at.segment);
            Some(s.at.segment)
        } else {
            None
        };
        Some((s, dead))
    }

    /// Bytes of objects still spilled (not counting holes left by restores).
    pub fn live_bytes(&self) -> u64 {
        self.objects.values().map(|s| s.at.len).sum()
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}

//! The bulk transport's wire format: object bytes between members, straight from one arena to
//! another with no staging copy on either side, many objects per request.
//!
//! TCP wire format (all integers little-endian):
//! - on connect, the puller sends `FPB2`, a u16 token length and the token;
//!   a wrong token closes the connection;
//! - then, any number of times, a request: u8 kind ([`PULL`], or
//!   [`LOOKUP`] to the ids' directory owner), u32 `n` (1 to
//!   [`MAX_PULL_IDS`]) and `n` 20-byte ids. The member answers the ids in
//!   order, in frames: u32 `k` (objects in this frame), u32 header length,
//!   then the header block, per object u8 status (`0`: not here, `1`: here,
//!   `2`: not here, and its directory entry follows, `3`: here but not
//!   sendable: its metadata is over [`MAX_INLINE_SIZE`]), u64 data size, u32
//!   length of what follows and that: the metadata (`1`) or the entry, a
//!   protobuf `ferroplasma.cluster.v1.Entry` (`2`); then the data block,
//!   the data of the frame's objects that are here, one after another.
//!
//! A [`LOOKUP`] is a directory lookup and a pull in one round trip: the
//! owner of an id sends the object when it holds it and says where it is
//! otherwise, so a get of an object its owner holds costs one round trip.
//!
//! A frame holds at most [`FRAME_OBJECTS`] objects and, past its first
//! object, at most [`FRAME_BYTES`] of data, so the holder pins a bounded
//! amount at a time while the stream never pauses between frames. The
//! holder sends a frame with one gathering `writev` from its arena; the
//! puller allocates the frame's objects once their sizes are known and
//! receives the data block with scattering `readv`s straight into those
//! allocations: a thousand 1 kB objects are one request, one frame and a
//! few system calls on each side.
//!
//! Idle connections are pooled per member and reused by later pulls. The
//! serving side caps its connections and closes those that send no hello
//! in time or stay idle (crate::net::guard; docs/cluster.md, "Network ports").

use ferroplasma_protocol::frame::MAX_INLINE_SIZE;

/// The hello that opens a connection (and names the format's version).
pub const MAGIC: &[u8; 4] = b"FPB2";
/// Request kind: send what is here.
pub const PULL: u8 = 1;
/// Request kind: send what is here, and the directory entry of the rest.
pub const LOOKUP: u8 = 2;
/// Most ids in one pull request.
pub const MAX_PULL_IDS: usize = 1 << 16;
/// Most objects in one frame of an answer.
pub const FRAME_OBJECTS: usize = 256;
/// Most data bytes in one frame, past its first object.
pub const FRAME_BYTES: u64 = 16 << 20;
/// Header bytes after which a frame takes no further object.
pub const FRAME_HEADER: usize = 256 << 10;
/// The longest header block a puller accepts: a full frame plus one
/// object with the largest metadata.
pub const MAX_HEADER: usize = FRAME_HEADER + OBJECT_HEAD + MAX_INLINE_SIZE as usize;
/// Status, data size and metadata size of one object in a header block.
pub const OBJECT_HEAD: usize = 13;
/// Most buffers handed to one `writev`/`readv` (Linux's IOV_MAX).
pub const IOV_MAX: usize = 1024;

/// One object of a frame, as the holder announced it.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'m> {
    /// Its position in the pull request.
    pub index: usize,
    /// Data bytes to come.
    pub data_size: u64,
    /// Its metadata (already received).
    pub metadata: &'m [u8],
}

/// Why an object of a request did not come.
#[derive(Debug, Clone, Copy)]
pub enum Absent<'e> {
    /// The member does not have it.
    NotHere,
    /// The member does not have it; its directory entry (protobuf), for a
    /// [`LOOKUP`].
    Entry(&'e [u8]),
    /// The member has it, but it cannot be sent (metadata over
    /// [`MAX_INLINE_SIZE`]).
    Unsendable,
}

/// What a header block says of the objects that do not come: their
/// indices, and why.
pub type Missing<'b> = Vec<(usize, Absent<'b>)>;

/// Splits a header block into the objects here and those that are not.
pub fn parse_header(
    block: &[u8],
    first: usize,
    k: usize,
) -> Result<(Vec<Arrival<'_>>, Missing<'_>), String> {
    let mut arrivals = Vec::with_capacity(k);
    let mut missing = Vec::new();
    let mut at = 0usize;
    for index in first..first + k {
        let head = block
            .get(at..at + OBJECT_HEAD)
            .ok_or("a header block too short for its objects")?;
        let data_size = u64::from_le_bytes(head[1..9].try_into().expect("8 bytes"));
        let meta = u32::from_le_bytes(head[9..13].try_into().expect("4 bytes")) as usize;
        at += OBJECT_HEAD;
        if meta as u64 > MAX_INLINE_SIZE {
            return Err(format!("metadata or entry of {meta} bytes"));
        }
        let extra = block
            .get(at..at + meta)
            .ok_or("a header block too short for its metadata")?;
        at += meta;
        match head[0] {
            0 => missing.push((index, Absent::NotHere)),
            1 => arrivals.push(Arrival {
                index,
                data_size,
                metadata: extra,
            }),
            2 => missing.push((index, Absent::Entry(extra))),
            3 => missing.push((index, Absent::Unsendable)),
            other => return Err(format!("status byte {other}")),
        }
    }
    if at != block.len() {
        return Err("a header block longer than its objects".into());
    }
    Ok((arrivals, missing))
}

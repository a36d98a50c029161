//! Length-prefixed framing, the one codec every side uses.
//!
//! A frame is a little-endian length and that many bytes of one protobuf
//! message: `[u32 length][Request or Reply]` on every connection, and
//! `[u64 length][Event]` on a subscription that asked for Plasma's framing.
//! [`FrameCodec`] splits frames off a buffer and encodes them; the store
//! feeds it from its async reads, and [`FrameReader`] from blocking ones
//! (clients, subscriptions, tests). Bytes of a frame that is not complete
//! yet stay in the buffer, so a read that times out loses nothing.

use crate::ProtocolError;
use bytes::{Buf, BytesMut};
use prost::Message;
use std::io::{Read, Write};

/// Bytes of the length prefix of requests and replies.
pub const HEADER_LEN: usize = 4;

/// Largest request frame the store accepts by default (16 MiB). A frame
/// announcing more closes the connection: the stream can no longer be trusted.
pub const MAX_REQUEST_FRAME: u64 = 16 << 20;

/// Largest reply a client accepts (1 GiB: a `List` of millions of objects).
pub const MAX_REPLY_FRAME: u64 = 1 << 30;

/// Largest data or metadata carried inside a message (`CreateAndSeal`,
/// `Create.metadata`), 8 MiB; bigger objects go through `Create` + `Seal`.
pub const MAX_INLINE_SIZE: u64 = 8 << 20;

/// Largest number of ids in one batched request.
pub const MAX_IDS_PER_REQUEST: usize = 100_000;

/// Most objects in one `ListPage` (a larger `List.page_size` is capped).
pub const MAX_LIST_PAGE: usize = 100_000;

/// How frames are delimited on one stream, and how large they may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameCodec {
    header: usize,
    limit: u64,
}

impl FrameCodec {
    /// Requests, as the store reads them: u32 length, at most 16 MiB.
    pub const REQUESTS: Self = Self::new(4, MAX_REQUEST_FRAME);
    /// Replies (events included), as clients read them: u32 length, at most 1 GiB.
    pub const REPLIES: Self = Self::new(4, MAX_REPLY_FRAME);
    /// Events of a Plasma-framed subscription: u64 length, then an `Event`.
    pub const PLASMA_EVENTS: Self = Self::new(8, MAX_REPLY_FRAME);

    /// A codec with a `header`-byte (4 or 8) length and a size limit.
    pub const fn new(header: usize, limit: u64) -> Self {
        assert!(header == 4 || header == 8);
        Self { header, limit }
    }

    /// Bytes of the length prefix.
    pub const fn header_len(&self) -> usize {
        self.header
    }

    /// The body length a header announces, checked against the limit (a
    /// frame over it is refused before anything is allocated for it).
    pub fn body_len(&self, header: &[u8]) -> Result<usize, ProtocolError> {
        let size = match self.header {
            4 => u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as u64,
            _ => u64::from_le_bytes(header[..8].try_into().expect("8 bytes")),
        };
        if size > self.limit {
            return Err(ProtocolError::FrameTooLarge {
                size,
                limit: self.limit,
            });
        }
        Ok(size as usize)
    }

    /// Bytes `buf` must hold for its first frame to be complete (at least
    /// the header).
    pub fn needed(&self, buf: &[u8]) -> Result<usize, ProtocolError> {
        if buf.len() < self.header {
            return Ok(self.header);
        }
        Ok(self.header + self.body_len(&buf[..self.header])?)
    }

    /// Splits the first complete frame's body off the front of `buf`;
    /// `None` (and room reserved for the rest) when it is not complete yet.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<BytesMut>, ProtocolError> {
        let need = self.needed(buf)?;
        if buf.len() < need {
            // Room for the rest as it arrives, in steps: a peer announcing a
            // large frame gets no large allocation before sending it.
            buf.reserve((need - buf.len()).min(RESERVE_STEP));
            return Ok(None);
        }
        buf.advance(self.header);
        Ok(Some(buf.split_to(need - self.header)))
    }

    /// Decodes the first complete frame of `buf` as an `M`.
    pub fn decode_message<M: Message + Default>(
        &self,
        buf: &mut BytesMut,
    ) -> Result<Option<M>, ProtocolError> {
        match self.decode(buf)? {
            Some(body) => Ok(Some(M::decode(body)?)),
            None => Ok(None),
        }
    }

    /// Appends `msg` as one frame to `out`.
    pub fn encode<M: Message>(&self, msg: &M, out: &mut Vec<u8>) {
        let len = msg.encoded_len();
        out.reserve(self.header + len);
        match self.header {
            4 => out.extend_from_slice(&(len as u32).to_le_bytes()),
            _ => out.extend_from_slice(&(len as u64).to_le_bytes()),
        }
        msg.encode(out)
            .expect("a Vec grows as needed, so encoding cannot run out of space");
    }
}

/// Encodes `msg` as one request or reply frame, ready for a single write.
pub fn encode_frame<M: Message>(msg: &M) -> Vec<u8> {
    let mut out = Vec::new();
    FrameCodec::REPLIES.encode(msg, &mut out);
    out
}

/// Reads frames from a blocking stream through a buffer that survives
/// errors: a read that times out (or is interrupted) mid-frame keeps what
/// arrived, and the next call continues the same frame.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    /// `buf[start..end]` holds bytes read and not handed out yet; the rest
    /// of `buf` is zeroed room, grown in steps as frames need it.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    codec: FrameCodec,
    /// Read no byte past the current frame (for a stream that someone else
    /// may read next, such as a socket handed to the application).
    exact: bool,
}

/// How much a blocking reader's buffer grows at most per read: a frame that
/// announces a gigabyte gets room as its bytes arrive, not all at once.
const GROW_STEP: usize = 16 << 20;

/// How much room `FrameCodec::decode` reserves at most for an incomplete
/// frame (the store holds one buffer per connection).
const RESERVE_STEP: usize = 1 << 20;

impl<R: Read> FrameReader<R> {
    /// A reader that reads ahead, as much as the kernel has.
    pub fn new(inner: R, codec: FrameCodec) -> Self {
        Self {
            inner,
            buf: vec![0; 64 * 1024],
            start: 0,
            end: 0,
            codec,
            exact: false,
        }
    }

    /// A reader that never reads past the frame it returns.
    pub fn exact(inner: R, codec: FrameCodec) -> Self {
        Self {
            exact: true,
            ..Self::new(inner, codec)
        }
    }

    /// Starts the bytes already read (e.g. with the handshake) into this
    /// reader's buffer.
    pub fn with_buffered(mut self, bytes: &[u8]) -> Self {
        self.make_room(bytes.len());
        self.buf[self.end..self.end + bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
        self
    }

    /// From now on, frames are split with `codec` (bytes already buffered
    /// included).
    pub fn set_codec(&mut self, codec: FrameCodec, exact: bool) {
        self.codec = codec;
        self.exact = exact;
    }

    /// Bytes read and not handed out yet.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// The stream.
    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Moves the unread bytes to the front and makes room for `more` after
    /// them (zeroing only what is new).
    fn make_room(&mut self, more: usize) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() < self.end + more {
            self.buf.resize(self.end + more, 0);
        }
    }

    /// The next frame's body. `Closed` when the peer closed the stream
    /// cleanly between frames; an I/O error (a timeout, say) leaves the
    /// partial frame buffered.
    pub fn read_frame(&mut self) -> Result<BytesMut, ProtocolError> {
        loop {
            let avail = &self.buf[self.start..self.end];
            let need = self.codec.needed(avail)?;
            if avail.len() >= need {
                let body = BytesMut::from(&avail[self.codec.header..need]);
                self.start += need;
                if self.start == self.end {
                    (self.start, self.end) = (0, 0);
                }
                return Ok(body);
            }
            let missing = need - avail.len();
            let want = if self.exact {
                missing.min(GROW_STEP)
            } else {
                missing.clamp(16 * 1024, GROW_STEP)
            };
            if self.buf.len() - self.end < want {
                self.make_room(want);
            }
            let limit = if self.exact {
                self.end + want
            } else {
                self.buf.len()
            };
            let n = self.inner.read(&mut self.buf[self.end..limit])?;
            if n == 0 {
                return Err(if self.start == self.end {
                    ProtocolError::Closed
                } else {
                    ProtocolError::Io(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the stream ended inside a frame",
                    ))
                });
            }
            self.end += n;
        }
    }

    /// The next frame, decoded as an `M`.
    pub fn read_message<M: Message + Default>(&mut self) -> Result<M, ProtocolError> {
        Ok(M::decode(self.read_frame()?)?)
    }
}

/// Reads exactly one frame from `r` (nothing past it) and decodes it: for
/// tests and one-off exchanges on a stream that is read again later.
pub fn read_message<M: Message + Default, R: Read>(
    r: &mut R,
    limit: u64,
) -> Result<M, ProtocolError> {
    FrameReader::exact(r, FrameCodec::new(HEADER_LEN, limit)).read_message()
}

/// Reads exactly one frame body from `r` (nothing past it).
pub fn read_frame<R: Read>(r: &mut R, limit: u64) -> Result<Vec<u8>, ProtocolError> {
    Ok(FrameReader::exact(r, FrameCodec::new(HEADER_LEN, limit))
        .read_frame()?
        .to_vec())
}

/// Encodes and writes one message (blocking), in a single `write_all`.
pub fn write_message<M: Message, W: Write>(w: &mut W, msg: &M) -> Result<(), ProtocolError> {
    w.write_all(&encode_frame(msg))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;
    use proptest::prelude::*;

    fn request() -> pb::Request {
        pb::Request {
            request_id: 7,
            body: Some(pb::request::Body::Get(pb::Get {
                object_ids: [[1u8; 20], [2u8; 20]].concat(),
                timeout_ms: -1,
            })),
        }
    }

    #[test]
    fn round_trip() {
        let frame = encode_frame(&request());
        let back: pb::Request = read_message(&mut frame.as_slice(), MAX_REQUEST_FRAME).unwrap();
        assert_eq!(back, request());
        let mut out = Vec::new();
        FrameCodec::PLASMA_EVENTS.encode(&request(), &mut out);
        assert_eq!(&out[..8], &(request().encoded_len() as u64).to_le_bytes());
        let mut buf = BytesMut::from(&out[..]);
        let back: pb::Request = FrameCodec::PLASMA_EVENTS
            .decode_message(&mut buf)
            .unwrap()
            .unwrap();
        assert_eq!((back, buf.len()), (request(), 0));
    }

    #[test]
    fn oversized_and_truncated_frames_are_errors() {
        let mut big = (MAX_REQUEST_FRAME as u32 + 1).to_le_bytes().to_vec();
        big.extend_from_slice(&[0; 8]);
        assert!(matches!(
            read_frame(&mut big.as_slice(), MAX_REQUEST_FRAME),
            Err(ProtocolError::FrameTooLarge { .. })
        ));
        let mut short = 10u32.to_le_bytes().to_vec();
        short.extend_from_slice(&[0; 3]);
        assert!(matches!(
            read_frame(&mut short.as_slice(), MAX_REQUEST_FRAME),
            Err(ProtocolError::Io(_))
        ));
        assert!(matches!(
            read_frame(&mut [].as_slice(), MAX_REQUEST_FRAME),
            Err(ProtocolError::Closed)
        ));
    }

    /// A stream that hands out `chunks`, failing with a timeout between them.
    struct Stuttering(Vec<Vec<u8>>);

    impl Read for Stuttering {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            match self.0.first_mut() {
                None => Ok(0),
                Some(c) if c.is_empty() => {
                    self.0.remove(0);
                    Err(std::io::ErrorKind::WouldBlock.into())
                }
                Some(c) => {
                    let n = out.len().min(c.len());
                    out[..n].copy_from_slice(&c[..n]);
                    c.drain(..n);
                    Ok(n)
                }
            }
        }
    }

    #[test]
    fn a_timeout_mid_frame_loses_nothing() {
        let frame = encode_frame(&request());
        let two = [frame.clone(), frame.clone()].concat();
        // Cut inside the header, inside the body, and between frames, with
        // a timeout at each cut.
        let chunks = vec![
            two[..2].to_vec(),
            vec![],
            two[2..9].to_vec(),
            vec![],
            two[9..frame.len() + 1].to_vec(),
            vec![],
            two[frame.len() + 1..].to_vec(),
        ];
        let mut r = FrameReader::new(Stuttering(chunks), FrameCodec::REQUESTS);
        let mut got = Vec::new();
        while got.len() < 2 {
            match r.read_message::<pb::Request>() {
                Ok(m) => got.push(m),
                Err(ProtocolError::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, vec![request(), request()]);
    }

    #[test]
    fn an_exact_reader_reads_nothing_past_its_frame() {
        let frame = encode_frame(&request());
        let two = [frame.clone(), b"next".to_vec()].concat();
        let mut src = two.as_slice();
        let _: pb::Request = read_message(&mut src, MAX_REQUEST_FRAME).unwrap();
        assert_eq!(src, b"next");
    }

    proptest! {
        // Arbitrary bytes never panic the decoder: they decode or give an error.
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = read_message::<pb::Request, _>(&mut bytes.as_slice(), MAX_REQUEST_FRAME);
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(_)) = FrameCodec::REQUESTS.decode(&mut buf) {}
        }
    }
}

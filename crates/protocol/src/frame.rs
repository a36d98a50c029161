//! Length-prefixed framing: `[u32 little-endian length][protobuf message]`.
//!
//! The store reads client frames with its own async reader; these helpers
//! serve blocking clients and tests, and fix the limits both sides agree on.

use crate::ProtocolError;
use prost::Message;
use std::io::{Read, Write};

/// Bytes of the length prefix.
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

/// Encodes `msg` as one frame (prefix included), ready for a single write.
pub fn encode_frame<M: Message>(msg: &M) -> Vec<u8> {
    let len = msg.encoded_len();
    let mut buf = Vec::with_capacity(HEADER_LEN + len);
    buf.extend_from_slice(&(len as u32).to_le_bytes());
    msg.encode(&mut buf)
        .expect("a Vec grows as needed, so encoding cannot run out of space");
    buf
}

/// Parses the length prefix and checks it against `limit`.
pub fn frame_len(header: [u8; HEADER_LEN], limit: u64) -> Result<usize, ProtocolError> {
    let size = u32::from_le_bytes(header) as u64;
    if size > limit {
        return Err(ProtocolError::FrameTooLarge { size, limit });
    }
    Ok(size as usize)
}

/// Reads one frame body (blocking). `Closed` when the peer closed cleanly
/// before the first byte of the frame.
pub fn read_frame<R: Read>(r: &mut R, limit: u64) -> Result<Vec<u8>, ProtocolError> {
    let mut header = [0u8; HEADER_LEN];
    match r.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(ProtocolError::Closed)
        }
        Err(e) => return Err(e.into()),
    }
    let len = frame_len(header, limit)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            ProtocolError::Closed
        } else {
            e.into()
        }
    })?;
    Ok(body)
}

/// Reads and decodes one message (blocking).
pub fn read_message<M: Message + Default, R: Read>(
    r: &mut R,
    limit: u64,
) -> Result<M, ProtocolError> {
    let body = read_frame(r, limit)?;
    Ok(M::decode(body.as_slice())?)
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

    #[test]
    fn round_trip() {
        let req = pb::Request {
            request_id: 7,
            body: Some(pb::request::Body::Get(pb::Get {
                object_ids: [[1u8; 20], [2u8; 20]].concat(),
                timeout_ms: -1,
            })),
        };
        let frame = encode_frame(&req);
        let back: pb::Request = read_message(&mut frame.as_slice(), MAX_REQUEST_FRAME).unwrap();
        assert_eq!(back, req);
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
            Err(ProtocolError::Closed)
        ));
    }

    proptest! {
        // Arbitrary bytes never panic the decoder: they decode or give an error.
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = read_message::<pb::Request, _>(&mut bytes.as_slice(), MAX_REQUEST_FRAME);
        }
    }
}

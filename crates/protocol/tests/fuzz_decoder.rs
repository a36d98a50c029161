//! A proptest-driven fuzz harness for the store's frame splitting: the
//! codec the store's connection loop runs ([`FrameCodec::REQUESTS`]) on
//! random streams, valid requests with flipped bits, and truncated frames.
//! Nothing may panic, every frame either decodes or is refused with an
//! error, and lengths over the limit are refused before any allocation.
//! (What the store then does with each request is fuzzed in the daemon
//! crate, against a real connection: `connection::fuzz_tests`.) `FP_FUZZ_CASES`
//! sets the number of cases (default 20000).

use bytes::BytesMut;
use ferroplasma_protocol::frame::{encode_frame, FrameCodec, HEADER_LEN, MAX_REQUEST_FRAME};
use ferroplasma_protocol::pb::{self, request};
use ferroplasma_protocol::{pack_ids, unpack_ids, ObjectId};
use proptest::prelude::*;
use prost::Message;

/// Runs the store's splitting over `input`; returns (frames decoded,
/// frames refused) and stops at the first fatal refusal.
fn consume(input: &[u8]) -> (usize, usize) {
    let mut buf = BytesMut::from(input);
    let mut ok = 0;
    loop {
        match FrameCodec::REQUESTS.decode(&mut buf) {
            Ok(Some(body)) => {
                assert!(body.len() as u64 <= MAX_REQUEST_FRAME);
                match pb::Request::decode(body) {
                    Ok(req) => {
                        ok += 1;
                        touch(&req);
                    }
                    Err(_) => return (ok, 1),
                }
            }
            Ok(None) => return (ok, 0), // truncated: the store waits for more bytes
            Err(_) => return (ok, 1),
        }
    }
}

/// Looks at every field the store reads, as the store does.
fn touch(req: &pb::Request) {
    use request::Body as B;
    let ids = match &req.body {
        Some(B::Get(g)) => Some(&g.object_ids),
        Some(B::Contains(c)) => Some(&c.object_ids),
        Some(B::Delete(d)) => Some(&d.object_ids),
        Some(B::Release(r)) => Some(&r.object_ids),
        Some(B::Create(c)) => {
            let _ = ObjectId::from_slice(&c.object_id);
            None
        }
        _ => None,
    };
    if let Some(packed) = ids {
        if let Ok(v) = unpack_ids(packed) {
            assert_eq!(v.len() * ObjectId::LEN, packed.len());
        }
    }
}

fn sample_requests() -> Vec<Vec<u8>> {
    let ids: Vec<ObjectId> = (0..3).map(|_| ObjectId::random()).collect();
    let bodies = vec![
        request::Body::Create(pb::Create {
            object_id: ids[0].0.to_vec(),
            data_size: 1 << 20,
            metadata: b"meta".to_vec(),
            wait_ms: 5,
            metadata_size: 0,
        }),
        request::Body::Get(pb::Get {
            object_ids: pack_ids(&ids),
            timeout_ms: -1,
        }),
        request::Body::Delete(pb::Delete {
            object_ids: pack_ids(&ids),
        }),
        request::Body::CreateAndSeal(pb::CreateAndSeal {
            object_id: ids[1].0.to_vec(),
            data: vec![7; 100],
            metadata: vec![],
        }),
    ];
    bodies
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            encode_frame(&pb::Request {
                request_id: i as u64,
                body: Some(b),
            })
        })
        .collect()
}

fn cases() -> u32 {
    std::env::var("FP_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_streams_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        consume(&bytes);
    }

    #[test]
    fn mutated_requests_never_panic(
        which in 0usize..4,
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        cut in any::<usize>(),
    ) {
        let mut frame = sample_requests().swap_remove(which);
        for (pos, bits) in flips {
            let i = HEADER_LEN + pos % (frame.len() - HEADER_LEN);
            frame[i] ^= bits;
        }
        let keep = cut % (frame.len() + 1);
        consume(&frame[..keep]);
        consume(&frame);
    }

    #[test]
    fn oversized_lengths_are_refused_before_reading(len in (MAX_REQUEST_FRAME + 1)..=u32::MAX as u64) {
        let mut buf = BytesMut::from(&(len as u32).to_le_bytes()[..]);
        prop_assert!(FrameCodec::REQUESTS.decode(&mut buf).is_err());
        prop_assert!(buf.capacity() < 1 << 20, "nothing allocated for the refused frame");
    }
}

#[test]
fn valid_streams_decode_completely() {
    let stream: Vec<u8> = sample_requests().concat();
    assert_eq!(consume(&stream), (4, 0));
    println!("fuzz harness: {} cases per property", cases());
}

//! Regression tests of the connection loop's waits, against a real
//! [`Connection`] on a socket pair.

use super::Connection;
use crate::arena::Arena;
use crate::shared::SharedRef;
use bytes::BytesMut;
use ferroplasma_protocol::frame::{encode_frame, FrameCodec, FrameReader};
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::{pack_ids, ObjectId};
use ferroplasma_store::Store;
use std::time::Duration;

/// Space freed while the connection is busy writing (its peer is slow to
/// read) still wakes a create that waits for space: the wake-up is not lost
/// between the flush and the wait.
#[test]
fn space_freed_during_a_flush_wakes_a_waiting_create() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let arena = Arena::create(1 << 20, None, false).unwrap();
    let shared = SharedRef::new(Store::new(1 << 20), arena, None);
    // Another client fills the store with an object it holds.
    let (holder, _holder_rx) = shared.lock().register();
    let big = ObjectId::random();
    shared
        .lock()
        .store
        .create(holder, big, 1 << 20, 0, 0)
        .unwrap();
    // The client asks for many large replies (more than a socket buffer
    // holds, so the flush waits for it to read), then for a create that has
    // to wait for space.
    let ids: Vec<ObjectId> = (0..100_000).map(|_| ObjectId::random()).collect();
    let mut input = Vec::new();
    for rid in 1..=20 {
        input.extend(encode_frame(&pb::Request {
            request_id: rid,
            body: Some(request::Body::Contains(pb::Contains {
                object_ids: pack_ids(&ids),
                cluster: false,
            })),
        }));
    }
    input.extend(encode_frame(&pb::Request {
        request_id: 99,
        body: Some(request::Body::Create(pb::Create {
            object_id: ObjectId::random().0.to_vec(),
            data_size: 4096,
            metadata: vec![],
            wait_ms: -1,
            metadata_size: 0,
        })),
    }));
    let (client, rx) = shared.lock().register();
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    let got = rt.block_on(async {
        let ours = tokio::net::UnixStream::from_std(ours).unwrap();
        let mut conn = Connection::new(
            client,
            rx,
            shared.clone(),
            None,
            ours,
            BytesMut::from(&input[..]),
        );
        let task = tokio::spawn(async move { conn.run().await });
        // Let the connection handle everything and block in its flush.
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Now the holder gives the space back: the waiting create can go on.
        {
            let mut sh = shared.lock();
            let fx = sh.store.abort(holder, big).unwrap();
            sh.deliver(fx);
        }
        // The client reads everything; the create's reply must come.
        let reader = tokio::task::spawn_blocking(move || {
            theirs
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut r = FrameReader::new(theirs, FrameCodec::REPLIES);
            loop {
                match r.read_message::<pb::Reply>() {
                    Ok(reply) if reply.request_id == 99 => return Some(reply),
                    Ok(_) => {}
                    Err(_) => return None,
                }
            }
        });
        let got = reader.await.unwrap();
        task.abort();
        got
    });
    let reply = got.expect("the waiting create was never answered: its wake-up was lost");
    assert!(
        matches!(reply.body, Some(reply::Body::Create(_))),
        "{reply:?}"
    );
}

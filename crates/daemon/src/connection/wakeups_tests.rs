//! Regression tests of the connection loop's waits, against a real
//! [`Connection`] on a socket pair.

use super::{testkit, Connection};
use crate::arena::Arena;
use crate::shared::SharedRef;
use bytes::BytesMut;
use ferroplasma_protocol::frame::{encode_frame, FrameCodec, FrameReader};
use ferroplasma_protocol::pb::{self, reply, request};
use ferroplasma_protocol::{pack_ids, ObjectId};
use ferroplasma_store::Store;
use std::time::Duration;

/// A store of 1 MiB that another client fills with an unsealed object it
/// holds: the holder, the object, and the holder's notices (kept open).
fn full_store() -> (
    SharedRef,
    ferroplasma_store::ClientId,
    ObjectId,
    tokio::sync::mpsc::Receiver<ferroplasma_store::Notice>,
) {
    let shared = testkit::store(1 << 20);
    let (holder, rx) = shared.lock().register(super::NOTICE_QUEUE);
    let big = ObjectId::random();
    {
        let mut sh = shared.lock();
        let (_, fx) = sh.store.create(holder, big, 1 << 20, 0, 0).unwrap();
        sh.deliver(fx);
    }
    (shared, holder, big, rx)
}

/// Space freed while the connection is busy writing (its peer is slow to
/// read) still wakes a create that waits for space: the wake-up is not lost
/// between the flush and the wait.
#[test]
fn space_freed_during_a_flush_wakes_a_waiting_create() {
    let rt = testkit::runtime();
    let (shared, holder, big, _holder_rx) = full_store();
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
                deleting: false,
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
    let (mut conn, theirs) = testkit::connection(&rt, &shared, &input);
    let got = rt.block_on(async {
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

/// A store with a spill directory of its own, and a connection of a new
/// client on it (its peer end discarded).
struct Spilling {
    rt: tokio::runtime::Runtime,
    shared: SharedRef,
    _dir: tempdir::Dir,
}

mod tempdir {
    /// A directory removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Spilling {
    fn new(capacity: u64) -> Self {
        let dir = std::env::temp_dir().join(format!("fp-spill-{}", ObjectId::random().to_hex()));
        std::fs::create_dir_all(&dir).unwrap();
        let spill = crate::spill::SpillDir::create(&dir).unwrap();
        let arena = Arena::create(capacity, None, false).unwrap();
        let shared = SharedRef::new(
            Store::with_spill(capacity, 1 << 30),
            arena,
            Some(spill),
            None,
        );
        Self {
            rt: testkit::runtime(),
            shared,
            _dir: tempdir::Dir(dir),
        }
    }

    /// Creates and seals an object of `size` bytes (spilling others to make
    /// room), holding no reference to it.
    fn put(&self, size: u64) -> ObjectId {
        self.put_filled(size, 0)
    }

    /// [`Spilling::put`] of an object whose bytes are all `byte`.
    fn put_filled(&self, size: u64, byte: u8) -> ObjectId {
        let mut sh = self.shared.lock();
        let (c, _rx) = sh.register(super::NOTICE_QUEUE);
        let id = ObjectId::random();
        sh.spill_for(size, 0).unwrap();
        let (loc, fx) = sh.store.create(c, id, size, 0, 0).unwrap();
        sh.arena.write(loc.offset, &vec![byte; size as usize]);
        sh.deliver(fx);
        let fx = sh.store.seal(c, id, 0).unwrap();
        sh.deliver(fx);
        let fx = sh.store.release(c, id).unwrap();
        sh.deliver(fx);
        sh.disconnect(c);
        id
    }

    fn connection(&self) -> Connection {
        testkit::connection(&self.rt, &self.shared, &[]).0
    }

    /// `conn` parks a get of a new object x; another client seals x; then,
    /// before `conn` handles the notice, a large put spills x. Returns x and
    /// the large object.
    fn seal_while_parked_then_spill(&self, conn: &mut Connection) -> (ObjectId, ObjectId) {
        let x = ObjectId::random();
        let parked = conn.get(
            1,
            pb::Get {
                object_ids: pack_ids(&[x]),
                timeout_ms: -1,
            },
        );
        assert!(matches!(parked, Ok(None)), "parked");
        {
            let mut sh = self.shared.lock();
            let (c, _rx) = sh.register(super::NOTICE_QUEUE);
            let (_, fx) = sh.store.create(c, x, 400 << 10, 0, 0).unwrap();
            sh.deliver(fx);
            let fx = sh.store.seal(c, x, 0).unwrap();
            sh.deliver(fx);
            let fx = sh.store.release(c, x).unwrap();
            sh.deliver(fx);
            sh.disconnect(c);
        }
        let big = self.put(900 << 10); // needs x's room
        assert!(self.shared.lock().store.is_spilled(&x));
        (x, big)
    }
}

fn replies(conn: &Connection) -> Vec<pb::Reply> {
    let mut out = BytesMut::from(&conn.out[..]);
    let mut got = Vec::new();
    while let Some(r) = FrameCodec::REPLIES
        .decode_message::<pb::Reply>(&mut out)
        .unwrap()
    {
        got.push(r);
    }
    got
}

/// A batched get of spilled objects that cannot all be in memory at once
/// is answered (with an error), not parked forever: restoring the second
/// object used to spill the first again, and the get then waited for a seal
/// that never comes.
#[test]
fn a_batched_get_of_spilled_objects_never_waits_for_itself() {
    let s = Spilling::new(1 << 20);
    let a = s.put(600 << 10);
    let b = s.put(600 << 10); // spills a
    assert!(s.shared.lock().store.is_spilled(&a));
    let mut conn = s.connection();
    let got = conn.get(
        1,
        pb::Get {
            object_ids: pack_ids(&[a, b]),
            timeout_ms: -1,
        },
    );
    match got {
        Ok(Some(reply::Body::Get(g))) => {
            assert!(g.results.iter().all(|r| r.location.is_some()));
        }
        Err(super::Refusal(e)) => assert_eq!(e.code, pb::ErrorCode::StoreFull as i32, "{e:?}"),
        Ok(other) => panic!("the get was parked waiting for its own objects: {other:?}"),
    }
    // Nothing is left referenced by the refused get.
    drop(conn);
    assert_eq!(s.shared.lock().store.stats().referenced_objects, 0);
}

/// An object spilled between its seal and the notice to a waiting get is
/// brought back and handed over.
#[test]
fn an_object_spilled_before_its_waiter_heard_of_the_seal_is_delivered() {
    let s = Spilling::new(1 << 20);
    let mut conn = s.connection();
    s.seal_while_parked_then_spill(&mut conn);
    let notice = conn.rx.try_recv().expect("the seal notice");
    conn.on_notices(notice);
    let got = replies(&conn);
    assert_eq!(got.len(), 1, "the get is answered");
    let Some(reply::Body::Get(g)) = &got[0].body else {
        panic!("{got:?}")
    };
    assert!(g.results[0].location.is_some(), "with the object");
}

/// The budgets of one connection: parked gets and the objects they wait
/// for are capped, with an error that names the limit.
#[test]
fn parked_gets_are_capped_per_connection() {
    let s = Spilling::new(1 << 20);
    let mut conn = s.connection();
    let park = |conn: &mut Connection, rid: u64, n: usize| {
        let ids: Vec<ObjectId> = (0..n).map(|_| ObjectId::random()).collect();
        conn.get(
            rid,
            pb::Get {
                object_ids: pack_ids(&ids),
                timeout_ms: -1,
            },
        )
    };
    for rid in 0..super::gets::MAX_PARKED_GETS as u64 {
        assert!(matches!(park(&mut conn, rid, 1), Ok(None)));
    }
    match park(&mut conn, 1 << 40, 1) {
        Err(super::Refusal(e)) => {
            assert_eq!(e.code, pb::ErrorCode::TooManyWaiting as i32);
            assert!(
                e.message.contains("4096 gets already wait"),
                "{}",
                e.message
            );
        }
        _ => panic!("over the limit"),
    }
    // A get that does not wait is still answered.
    assert!(matches!(
        conn.get(
            7,
            pb::Get {
                object_ids: pack_ids(&[ObjectId::random()]),
                timeout_ms: 0
            }
        ),
        Ok(Some(_))
    ));
    let mut fresh = s.connection();
    for rid in 0..10 {
        assert!(matches!(park(&mut fresh, rid, 100_000), Ok(None)));
    }
    match park(&mut fresh, 11, 1) {
        Err(super::Refusal(e)) => assert!(e.message.contains("1000000 objects"), "{}", e.message),
        _ => panic!("over the objects limit"),
    }
}

/// When the object a get waits for was spilled before the get heard of
/// its seal and cannot be brought back (memory is full of objects in use),
/// the get is answered with the error, not left waiting for a notice that
/// never comes.
#[test]
fn a_waiter_whose_object_cannot_come_back_is_told_why() {
    let s = Spilling::new(1 << 20);
    let mut conn = s.connection();
    let (_, big) = s.seal_while_parked_then_spill(&mut conn);
    let (holder, _rx) = s.shared.lock().register(super::NOTICE_QUEUE);
    assert!(s.shared.lock().store.get(holder, big).is_some(), "in use");
    let notice = conn.rx.try_recv().expect("the seal notice");
    conn.on_notices(notice);
    let got = replies(&conn);
    assert_eq!(got.len(), 1, "the get is answered");
    let Some(reply::Body::Error(e)) = &got[0].body else {
        panic!("{got:?}")
    };
    assert_eq!(e.code, pb::ErrorCode::StoreFull as i32, "{e:?}");
}

/// A get of a spilled object does not read it back on the store's event
/// loop: the get waits while a blocking thread reads the bytes (the store
/// answers others meanwhile), and the object then arrives, byte-exact,
/// holding exactly the get's reference. For gets with and without a
/// timeout.
#[test]
fn a_spilled_object_is_read_back_off_the_event_loop() {
    let s = Spilling::new(1 << 20);
    let a = s.put_filled(600 << 10, 0xA5);
    s.put(600 << 10); // spills a
    let _rt = s.rt.enter();
    let mut conn = s.connection();
    let mut other = s.connection();
    for timeout_ms in [-1, 0] {
        assert!(s.shared.lock().store.is_spilled(&a));
        let get = |ids: &[ObjectId]| pb::Get {
            object_ids: pack_ids(ids),
            timeout_ms,
        };
        let parked = conn.get(1, get(&[a]));
        assert!(
            matches!(parked, Ok(None)),
            "answered before the bytes were read back (timeout {timeout_ms}): {:?}",
            parked.ok()
        );
        // Meanwhile the store answers everyone else.
        let absent = pb::Get {
            object_ids: pack_ids(&[ObjectId::random()]),
            timeout_ms: 0,
        };
        assert!(matches!(other.get(2, absent), Ok(Some(_))));
        let notice = s
            .rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), conn.rx.recv()).await })
            .expect("the restore finished")
            .expect("notice");
        conn.on_notices(notice);
        let got = replies(&conn);
        let Some(reply::Body::Get(g)) = &got.last().unwrap().body else {
            panic!("{got:?}")
        };
        let loc = g.results[0].location.expect("restored");
        let mut sh = s.shared.lock();
        assert!(sh
            .arena
            .bytes(loc.offset, loc.data_size)
            .iter()
            .all(|&x| x == 0xA5));
        assert_eq!(sh.store.stats().referenced_objects, 1);
        let fx = sh.store.release(conn.client, a).unwrap();
        sh.deliver(fx);
        assert!(sh.store.release(conn.client, a).is_err(), "one reference");
        drop(sh);
        conn.out.clear();
        // Spill it again for the next round.
        let filler = s.put(600 << 10);
        let mut sh = s.shared.lock();
        let fx = sh.store.delete(filler).1;
        sh.deliver(fx);
    }
}

/// A get that does not wait, of a spilled object whose restore waits for
/// room (a spill under way), is answered without it when the object is
/// deleted before the room comes: it used to wait forever for a restore
/// that never starts (the stress test with spilling hung on it).
#[test]
fn a_get_that_does_not_wait_is_answered_when_its_spilled_object_is_deleted() {
    let s = Spilling::new(1 << 20);
    let _rt = s.rt.enter();
    let mut hit = 0;
    for _ in 0..20 {
        let a = s.put(600 << 10);
        let filler = s.put(600 << 10); // spills a
        assert!(s.shared.lock().store.is_spilled(&a));
        let mut conn = s.connection();
        let get = pb::Get {
            object_ids: pack_ids(&[a]),
            timeout_ms: 0,
        };
        // Bringing a back needs the filler spilled first: the restore
        // waits for that write.
        assert!(
            matches!(conn.get(1, get), Ok(None)),
            "parked for the restore"
        );
        {
            let mut sh = s.shared.lock();
            if sh.spills_in_flight > 0 && sh.store.is_spilled(&a) {
                hit += 1;
                let fx = sh.store.delete(a).1;
                sh.deliver(fx);
            }
        }
        let got = answered(&s.rt, &mut conn);
        assert_eq!(got.len(), 1, "the get is answered: {got:?}");
        let Some(reply::Body::Get(g)) = &got[0].body else {
            panic!("{got:?}")
        };
        let mut sh = s.shared.lock();
        if let Some(loc) = g.results[0].location {
            // Restored before the delete could come: the usual case.
            assert_eq!(loc.data_size, 600 << 10);
            let fx = sh.store.release(conn.client, a).unwrap();
            sh.deliver(fx);
        }
        for id in [a, filler] {
            let fx = sh.store.delete(id).1;
            sh.deliver(fx);
        }
        drop(sh);
        if hit > 0 {
            break;
        }
    }
    assert!(hit > 0, "the delete never came while the restore waited");
}

/// Drives `conn`'s notices until it has answered something (or 10 s pass).
fn answered(rt: &tokio::runtime::Runtime, conn: &mut Connection) -> Vec<pb::Reply> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while conn.out.is_empty() && std::time::Instant::now() < deadline {
        let next = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(100), conn.rx.recv()).await
        });
        if let Ok(Some(n)) = next {
            conn.on_notices(n);
        }
    }
    replies(conn)
}

/// Off the event loop too, a batched get of spilled objects that cannot all
/// be in memory at once is answered, and two clients each restoring an
/// object the other's restore would spill both get an answer (an object
/// handed over by its restore is theirs before anyone can spill it again).
#[test]
fn restores_off_the_event_loop_never_wait_for_each_other() {
    let s = Spilling::new(1 << 20);
    let a = s.put(600 << 10);
    let b = s.put(600 << 10); // spills a
    let _rt = s.rt.enter();
    let get = |ids: &[ObjectId]| pb::Get {
        object_ids: pack_ids(ids),
        timeout_ms: -1,
    };
    let mut conn = s.connection();
    let first = conn.get(1, get(&[a, b]));
    let got = match first {
        Ok(Some(body)) => vec![body],
        Ok(None) => answered(&s.rt, &mut conn)
            .into_iter()
            .filter_map(|r| r.body)
            .collect(),
        Err(super::Refusal(e)) => vec![reply::Body::Error(e)],
    };
    match &got[..] {
        [reply::Body::Error(e)] => assert_eq!(e.code, pb::ErrorCode::StoreFull as i32, "{e:?}"),
        other => panic!("both cannot be in memory at once: {other:?}"),
    }
    drop(conn);
    assert_eq!(s.shared.lock().store.stats().referenced_objects, 0);
    // Two clients, one object each, room for one at a time.
    let (mut one, mut two) = (s.connection(), s.connection());
    assert!(matches!(one.get(1, get(&[a])), Ok(None)));
    // Whichever restore wins the room, each client is answered: with its
    // object, or told there is no room (never left waiting).
    let second = two.get(1, get(&[b]));
    let r1 = answered(&s.rt, &mut one);
    assert_eq!(r1.len(), 1, "the first client is answered: {r1:?}");
    if let Some(reply::Body::Get(_)) = r1[0].body {
        let mut sh = s.shared.lock();
        let fx = sh.store.release(one.client, a).unwrap();
        sh.deliver(fx);
    }
    if let Ok(None) = second {
        let r2 = answered(&s.rt, &mut two);
        assert_eq!(r2.len(), 1, "the second client is answered: {r2:?}");
    }
}

/// A create parked for space is tried again when room may have come (memory
/// freed, an object became evictable), not on every turn of the loop: a
/// client with creates parked that sends other requests cost the store a
/// failed allocation per parked create per request.
#[test]
fn parked_creates_are_retried_only_when_room_may_have_come() {
    let rt = testkit::runtime();
    let (shared, holder, big, _holder_rx) = full_store();
    let create = |rid| {
        encode_frame(&pb::Request {
            request_id: rid,
            body: Some(request::Body::Create(pb::Create {
                object_id: ObjectId::random().0.to_vec(),
                data_size: 4096,
                metadata: vec![],
                wait_ms: -1,
                metadata_size: 0,
            })),
        })
    };
    let mut input = Vec::new();
    for rid in 1..=8 {
        input.extend(create(rid));
    }
    let (mut conn, theirs) = testkit::connection(&rt, &shared, &input);
    let shared2 = shared.clone();
    let replies = rt.block_on(async move {
        let task = tokio::spawn(async move { conn.run().await });
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            theirs
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut w = theirs.try_clone().unwrap();
            let mut r = FrameReader::new(theirs, FrameCodec::REPLIES);
            // 200 requests that make no room, each answered before the next.
            for rid in 100..300 {
                w.write_all(&encode_frame(&pb::Request {
                    request_id: rid,
                    body: Some(request::Body::Contains(pb::Contains {
                        object_ids: pack_ids(&[big]),
                        cluster: false,
                        deleting: false,
                    })),
                }))
                .unwrap();
                let reply = r.read_message::<pb::Reply>().unwrap();
                assert_eq!(reply.request_id, rid);
            }
            assert_eq!(shared2.lock().waiting_creates, 8);
            let retries = shared2.lock().create_retries;
            assert!(
                retries <= 8,
                "{retries} retries of 8 parked creates while no room came"
            );
            // Now room comes: every parked create is answered.
            {
                let mut sh = shared2.lock();
                let fx = sh.store.abort(holder, big).unwrap();
                sh.deliver(fx);
            }
            let mut created = 0;
            while created < 8 {
                let reply = r.read_message::<pb::Reply>().unwrap();
                assert!(
                    matches!(reply.body, Some(reply::Body::Create(_))),
                    "{reply:?}"
                );
                created += 1;
            }
            created
        })
        .await
        .inspect(|_| task.abort())
    });
    assert_eq!(replies.unwrap(), 8);
    assert_eq!(shared.lock().waiting_creates, 0);
}

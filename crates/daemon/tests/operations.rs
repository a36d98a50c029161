//! Every store operation through the Rust client against a real daemon.

mod common;

use common::TestStore;
use ferroplasma_client::{Client, ClientError, DeleteStatus, EventKind, ObjectId};
use std::time::{Duration, Instant};

#[test]
fn create_write_seal_get_release() {
    let store = TestStore::start("64MiB");
    let a = store.client();
    let b = store.client();
    assert_eq!(a.capacity(), 64 << 20);
    let id = ObjectId::random();
    let mut buf = a.create(id, 1000, b"meta").unwrap();
    assert_eq!(buf.as_mut_ptr() as usize % 64, 0, "data is 64-byte aligned");
    buf.as_mut_slice()
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = i as u8);
    assert_eq!(
        b.contains(&[id]).unwrap(),
        vec![false],
        "unsealed is invisible"
    );
    assert!(b.get(&[id], Some(Duration::ZERO)).unwrap()[0].is_none());
    let sealed = a.seal(buf).unwrap();
    assert!(matches!(
        a.release(ObjectId::random()),
        Err(ClientError::NotHeld(_))
    ));
    drop(sealed); // gives the creator's reference back
    let got = b.get(&[id], None).unwrap();
    let obj = got[0].as_ref().unwrap();
    assert_eq!(obj.data().len(), 1000);
    assert!(obj.data().iter().enumerate().all(|(i, &x)| x == i as u8));
    assert_eq!(obj.metadata(), b"meta");
    assert_eq!(
        obj.metadata().as_ptr() as usize % 64,
        0,
        "metadata is 64-byte aligned"
    );
    let listed = a.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].ref_count, listed[0].sealed), (1, true));
    assert!(listed[0].construct_duration_us.unwrap() >= 0);
    drop(got);
    store.eventually("the dropped buffer is released", || {
        a.list().unwrap()[0].ref_count == 0
    });
}

#[test]
fn zero_copy_the_same_bytes_in_two_clients() {
    let store = TestStore::start("16MiB");
    let (a, b) = (store.client(), store.client());
    let id = ObjectId::random();
    a.put(id, &vec![7u8; 200_000], b"").unwrap();
    let x = a.get(&[id], None).unwrap().pop().unwrap().unwrap();
    let y = b.get(&[id], None).unwrap().pop().unwrap().unwrap();
    // Two mappings of one arena: same offset from each mapping's base.
    assert_eq!(x.data(), y.data());
    assert_eq!(a.stats().unwrap().used, 200_000u64.div_ceil(64) * 64);
}

#[test]
fn create_and_seal_small_objects_and_errors() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let id = ObjectId::random();
    c.create_and_seal(id, b"tiny", b"m").unwrap();
    let got = c.get(&[id], Some(Duration::ZERO)).unwrap();
    assert_eq!(got[0].as_ref().unwrap().data(), b"tiny");
    assert!(matches!(
        c.create_and_seal(id, b"again", b""),
        Err(ClientError::ObjectExists { .. })
    ));
    assert!(matches!(
        c.create(id, 10, b""),
        Err(ClientError::ObjectExists { .. })
    ));
    // Over the inline limit, create_and_seal takes the create path.
    let big = vec![0u8; 9 << 20];
    let big_sealed = ObjectId::random();
    c.create_and_seal(big_sealed, &big, b"m").unwrap();
    let got = c.get(&[big_sealed], None).unwrap().pop().unwrap().unwrap();
    assert!(got.data().len() == big.len() && got.metadata() == b"m");
    // put() takes the create path for large data.
    let big_id = ObjectId::random();
    c.put(big_id, &big[..(5 << 20)], b"x").unwrap();
    assert_eq!(c.contains(&[big_id, id]).unwrap(), vec![true, true]);
}

#[test]
fn abort_frees_the_object_and_its_id() {
    // (That only the creator may seal or abort is checked at the protocol
    // level in robustness.rs: through this API only the creator holds the
    // buffer that seal and abort take.)
    let store = TestStore::start("16MiB");
    let a = store.client();
    let id = ObjectId::random();
    let buf = a.create(id, 4096, b"").unwrap();
    a.abort(buf).unwrap();
    let s = a.stats().unwrap();
    assert_eq!((s.used, s.objects), (0, 0));
    let buf = a.create(id, 10, b"").unwrap();
    let sealed = a.seal(buf).unwrap();
    assert_eq!((sealed.id(), sealed.data().len()), (id, 10));
}

#[test]
fn blocking_get_is_woken_by_a_seal_from_another_client() {
    let store = TestStore::start("16MiB");
    let waiter = store.client();
    let maker = store.client();
    let id = ObjectId::random();
    let t = std::thread::spawn(move || {
        let got = waiter.get(&[id], None).unwrap();
        got[0].as_ref().map(|b| b.data().to_vec())
    });
    // Seal only once the get waits, so that the wake-up path is what runs.
    store.eventually("the get is parked", || {
        maker.stats().unwrap().awaited_objects == 1
    });
    maker.put(id, b"wake up", b"").unwrap();
    assert_eq!(t.join().unwrap().as_deref(), Some(&b"wake up"[..]));
}

#[test]
fn a_waiting_get_holds_up_no_other_client() {
    let store = TestStore::start("16MiB");
    let waiter = store.client();
    let missing = ObjectId::random();
    let t = std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = waiter
            .get(&[missing], Some(Duration::from_millis(1500)))
            .unwrap();
        (r[0].is_none(), t0.elapsed())
    });
    let other = store.client();
    store.eventually("the get is parked", || {
        other.stats().unwrap().awaited_objects == 1
    });
    let t0 = Instant::now();
    for _ in 0..100 {
        let id = ObjectId::random();
        other.put(id, b"x", b"").unwrap();
        assert!(other.get(&[id], None).unwrap()[0].is_some());
    }
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "other clients were held up"
    );
    let (timed_out, waited) = t.join().unwrap();
    assert!(timed_out && waited >= Duration::from_millis(1500));
}

#[test]
fn get_timeouts_return_partial_results() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let have = ObjectId::random();
    let never = ObjectId::random();
    c.put(have, b"here", b"").unwrap();
    let t0 = Instant::now();
    let got = c
        .get(&[have, never], Some(Duration::from_millis(200)))
        .unwrap();
    let waited = t0.elapsed();
    assert!(got[0].is_some() && got[1].is_none());
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    let t0 = Instant::now();
    let got = c.get(&[never], Some(Duration::ZERO)).unwrap();
    assert!(got[0].is_none() && t0.elapsed() < Duration::from_millis(100));
    // Timed-out entries hold no reference; found ones do.
    drop(got);
    let info = c.list().unwrap();
    assert_eq!(info.iter().find(|o| o.id == have).unwrap().ref_count, 1);
}

#[test]
fn batched_get_of_many_objects() {
    let store = TestStore::start("64MiB");
    let c = store.client();
    let ids: Vec<_> = (0..1000).map(|_| ObjectId::random()).collect();
    for (i, id) in ids.iter().enumerate() {
        c.put(*id, &(i as u32).to_le_bytes(), b"").unwrap();
    }
    let got = c.get(&ids, Some(Duration::ZERO)).unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.as_ref().unwrap().data(), (i as u32).to_le_bytes());
    }
    assert_eq!(c.stats().unwrap().referenced_objects, 1000);
    drop(got);
    store.eventually("all released", || {
        c.stats().unwrap().referenced_objects == 0
    });
}

#[test]
fn eviction_is_least_recently_released_first_and_minimal() {
    // 10 objects of 100 KiB fill a 1000 KiB store exactly.
    let store = TestStore::start("1000KiB");
    let c = store.client();
    let ids: Vec<_> = (0..10).map(|_| ObjectId::random()).collect();
    for id in &ids {
        c.put(*id, &vec![1u8; 100 << 10], b"").unwrap();
    }
    // Reading object 0 makes it the most recently released.
    // (The release travels in front of the next request.)
    drop(c.get(&ids[..1], None).unwrap());
    c.put(ObjectId::random(), &vec![2u8; 100 << 10], b"")
        .unwrap();
    let present = c.contains(&ids).unwrap();
    assert!(!present[1], "the least recently released object goes first");
    assert_eq!(
        present.iter().filter(|p| !**p).count(),
        1,
        "only what was needed"
    );
    let (freed, n) = c.evict(150 << 10).unwrap();
    assert_eq!((freed, n), (200 << 10, 2));
    assert_eq!(c.contains(&ids[2..4]).unwrap(), vec![false, false]);
    assert_eq!(c.stats().unwrap().evictions, 3);
}

#[test]
fn store_full_when_everything_is_referenced() {
    let store = TestStore::start("1MiB");
    let c = store.client();
    let held = ObjectId::random();
    c.put(held, &vec![0u8; 600 << 10], b"").unwrap();
    let _keep = c.get(&[held], None).unwrap();
    let err = c.create(ObjectId::random(), 600 << 10, b"").unwrap_err();
    assert!(matches!(err, ClientError::StoreFull(_)), "{err}");
    assert!(
        err.to_string().contains("--memory"),
        "the message says what to do: {err}"
    );
    // Unsealed objects are not evicted either.
    let pending = ObjectId::random();
    c.create(pending, 300 << 10, b"").unwrap();
    assert!(matches!(
        c.create(ObjectId::random(), 300 << 10, b""),
        Err(ClientError::StoreFull(_))
    ));
    // An object larger than the store never fits.
    assert!(matches!(
        c.create(ObjectId::random(), 2 << 20, b""),
        Err(ClientError::StoreFull(_))
    ));
    assert!(c.contains(&[held]).unwrap()[0]);
}

#[test]
fn an_object_the_size_of_the_store_fits() {
    let store = TestStore::start("1MiB");
    let c = store.client();
    let id = ObjectId::random();
    let mut b = c.create(id, 1 << 20, b"").unwrap();
    b.as_mut_slice()[(1 << 20) - 1] = 9;
    assert_eq!(c.seal(b).unwrap().data()[(1 << 20) - 1], 9);
}

#[test]
fn delete_is_deferred_while_referenced_or_unsealed() {
    let store = TestStore::start("16MiB");
    let (a, b) = (store.client(), store.client());
    let sealed = ObjectId::random();
    let unsealed = ObjectId::random();
    a.put(sealed, b"data", b"").unwrap();
    let view = b.get(&[sealed], None).unwrap();
    let buf = a.create(unsealed, 10, b"").unwrap();
    let st = a.delete(&[sealed, unsealed, ObjectId::random()]).unwrap();
    assert_eq!(
        st,
        vec![
            DeleteStatus::Deferred,
            DeleteStatus::Deferred,
            DeleteStatus::NotFound
        ]
    );
    assert_eq!(
        a.contains(&[sealed]).unwrap(),
        vec![false],
        "a deleted object is gone for new gets"
    );
    assert_eq!(
        view[0].as_ref().unwrap().data(),
        b"data",
        "existing views stay valid"
    );
    drop(view);
    store.eventually("deferred delete completes", || {
        a.stats().unwrap().objects == 1
    });
    let sealed = a.seal(buf).unwrap();
    a.release(unsealed).unwrap();
    drop(sealed);
    store.eventually("unsealed one goes after seal+release", || {
        a.stats().unwrap().objects == 0
    });
    let id = ObjectId::random();
    a.put(id, b"x", b"").unwrap();
    assert_eq!(a.delete(&[id]).unwrap(), vec![DeleteStatus::Deleted]);
}

#[test]
fn subscribe_sees_seals_and_deletes() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let mut sub = c.subscribe().unwrap();
    let id = ObjectId::random();
    c.put(id, b"12345", b"ab").unwrap();
    let e = sub.next_timeout(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(
        (e.kind, e.id, e.data_size, e.metadata_size),
        (EventKind::Sealed, id, 5, 2)
    );
    c.delete(&[id]).unwrap();
    let e = sub.next_timeout(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!((e.kind, e.id), (EventKind::Deleted, id));
    assert!(sub
        .next_timeout(Duration::from_millis(50))
        .unwrap()
        .is_none());
}

#[test]
fn stats_report_capacity_use_clients_and_fragmentation() {
    let store = TestStore::start("1MiB");
    let c = store.client();
    let _d = store.client();
    let ids: Vec<_> = (0..4).map(|_| ObjectId::random()).collect();
    for id in &ids {
        c.put(*id, &vec![0u8; 100 << 10], b"").unwrap();
    }
    c.delete(&[ids[1]]).unwrap();
    let s = c.stats().unwrap();
    assert_eq!(s.capacity, 1 << 20);
    assert_eq!(s.used, 3 * (100 << 10));
    assert_eq!((s.objects, s.clients, s.free_blocks), (3, 2, 2));
    assert_eq!(s.largest_free_block, (1 << 20) - 4 * (100 << 10));
    assert!(s.fragmentation > 0.0 && s.fragmentation < 1.0);
}

#[test]
fn a_client_is_shared_by_threads() {
    let store = TestStore::start("64MiB");
    let c = store.client();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in 0..200u32 {
                    let id = ObjectId::random();
                    let v = (t * 1000 + i).to_le_bytes();
                    c.put(id, &v, b"").unwrap();
                    let got = c.get(&[id], Some(Duration::from_secs(5))).unwrap();
                    assert_eq!(got[0].as_ref().unwrap().data(), v);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    store.eventually("all references released", || {
        c.stats().unwrap().referenced_objects == 0
    });
    assert_eq!(c.stats().unwrap().objects, 800);
}

#[test]
fn buffers_outlive_the_client_handle() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let id = ObjectId::random();
    c.put(id, b"still here", b"").unwrap();
    let got = c.get(&[id], None).unwrap();
    drop(c);
    assert_eq!(got[0].as_ref().unwrap().data(), b"still here");
}

#[test]
fn release_buffers_gives_back_a_whole_batch() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let ids: Vec<_> = (0..50).map(|_| ObjectId::random()).collect();
    for id in &ids {
        c.put(*id, b"v", b"").unwrap();
    }
    let got = c.get(&ids, None).unwrap();
    assert_eq!(c.stats().unwrap().referenced_objects, 50);
    c.release_buffers(got.into_iter().flatten()).unwrap();
    assert_eq!(c.stats().unwrap().referenced_objects, 0);
    assert!(matches!(c.release(ids[0]), Err(ClientError::NotHeld(_))));
}

#[test]
fn a_forked_child_gets_a_clear_error_and_can_reconnect() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let id = ObjectId::random();
    c.put(id, b"parent's", b"").unwrap();
    let view = c.get(&[id], None).unwrap();
    // Safety: the child only calls async-signal-safe-enough code paths of
    // this test (no locks held by other threads are taken) and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let forked = matches!(c.stats(), Err(ClientError::Forked { .. }));
        drop(view); // must not send anything on the parent's socket
        let fresh = Client::connect(Some(store.path())).map(|n| n.contains(&[id]).unwrap()[0]);
        let code = if forked && fresh.unwrap_or(false) {
            0
        } else {
            1
        };
        // Safety: leaving the child without running the test harness's exit path.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // Safety: waiting for the child we just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child saw {status}"
    );
    // The parent's connection is intact and still holds its reference.
    assert_eq!(view[0].as_ref().unwrap().data(), b"parent's");
    assert_eq!(c.list().unwrap()[0].ref_count, 1);
}

#[test]
fn a_thread_blocked_in_get_holds_up_no_other_thread_of_the_same_client() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let missing = ObjectId::random();
    let waiter = {
        let c = c.clone();
        std::thread::spawn(move || {
            let got = c.get(&[missing], None).unwrap();
            got[0].as_ref().map(|b| b.data().to_vec())
        })
    };
    store.eventually("the get is parked", || {
        c.stats().unwrap().awaited_objects == 1
    });
    let t0 = Instant::now();
    for _ in 0..50 {
        let id = ObjectId::random();
        c.put(id, b"meanwhile", b"").unwrap();
        assert_eq!(
            c.get(&[id], None).unwrap()[0].as_ref().unwrap().data(),
            b"meanwhile"
        );
        assert!(c.contains(&[id]).unwrap()[0]);
    }
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "requests waited behind the blocked get"
    );
    c.put(missing, b"finally", b"").unwrap();
    assert_eq!(waiter.join().unwrap().as_deref(), Some(&b"finally"[..]));
}

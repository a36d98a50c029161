//! Behaviours Plasma's own test suite pins down, through the Rust client
//! against a real daemon: the creator's reference ends with its buffer,
//! create_and_seal takes objects of any size, evict counts object bytes,
//! notifications can be framed as Plasma's socket framed them, a regular
//! file at the socket path is replaced only when asked, and tiny stores run.

mod common;

use common::{content, run_store_once, temp_dir, TestStore};
use ferroplasma_client::{ClientError, DeleteStatus, EventFraming, EventKind, ObjectId};
use std::io::Read;
use std::time::Duration;

fn ref_count(c: &ferroplasma_client::Client, id: ObjectId) -> u64 {
    c.list()
        .unwrap()
        .into_iter()
        .find(|o| o.id == id)
        .map(|o| o.ref_count)
        .expect("object listed")
}

#[test]
fn dropping_the_created_buffer_ends_the_creators_reference() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let id = ObjectId::random();
    let mut buf = c.create(id, 1000, b"").unwrap();
    buf.as_mut_slice().fill(3);
    let sealed = c.seal(buf).unwrap();
    assert_eq!(sealed.data(), &[3u8; 1000][..]);
    assert_eq!(
        ref_count(&c, id),
        1,
        "the sealed buffer holds the creator's reference"
    );
    assert_eq!(c.evict(1).unwrap(), (0, 0), "held objects are not evicted");
    drop(sealed);
    // The release travels with the next request, so this list sees it.
    assert_eq!(ref_count(&c, id), 0);
    assert_eq!(c.evict(1).unwrap(), (1000, 1));
    assert_eq!(c.contains(&[id]).unwrap(), vec![false]);
}

#[test]
fn a_buffer_dropped_unsealed_leaves_the_object_until_its_client_goes() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let id = ObjectId::random();
    c.create(id, 64, b"").unwrap().as_mut_slice().fill(9);
    assert_eq!(ref_count(&c, id), 0, "the creator's reference went");
    assert_eq!(
        c.evict(u64::MAX).unwrap(),
        (0, 0),
        "unsealed: never evicted"
    );
    assert!(c.get(&[id], Some(Duration::ZERO)).unwrap()[0].is_none());
    drop(c);
    let other = store.client();
    store.eventually("the departed creator's unsealed object is aborted", || {
        other.stats().unwrap().objects == 0
    });
}

#[test]
fn an_explicit_release_is_not_counted_twice() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let id = ObjectId::random();
    let buf = c.create(id, 100, b"").unwrap();
    let sealed = c.seal(buf).unwrap();
    let view = c.get(&[id], None).unwrap().pop().unwrap().unwrap();
    assert_eq!(ref_count(&c, id), 2);
    c.release(id).unwrap();
    drop(sealed);
    // Only the creator's reference went: the get's is still held.
    assert_eq!(ref_count(&c, id), 1);
    assert_eq!(c.evict(u64::MAX).unwrap(), (0, 0));
    drop(view);
    assert_eq!(ref_count(&c, id), 0);
    // Once: the creator's release is remembered as done; then nothing is held.
    c.release(id).unwrap();
    assert!(matches!(c.release(id), Err(ClientError::NotHeld(_))));
}

#[test]
fn a_release_after_the_buffer_gave_the_reference_back_does_nothing() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let id = ObjectId::random();
    let buf = c.create(id, 100, b"").unwrap();
    let sealed = c.seal(buf).unwrap();
    let view = c.get(&[id], None).unwrap().pop().unwrap().unwrap();
    drop(sealed);
    // Code written as create, write, seal, release keeps working...
    c.release(id).unwrap();
    // ...and the release takes nothing from the get's reference.
    assert_eq!(ref_count(&c, id), 1);
    drop(view);
    assert_eq!(ref_count(&c, id), 0);
}

#[test]
fn an_explicit_release_never_frees_memory_a_live_buffer_reads() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let id = ObjectId::random();
    let mut buf = c.create(id, 10, b"").unwrap();
    buf.as_mut_slice().fill(4);
    let sealed = c.seal(buf).unwrap();
    c.release(id).unwrap();
    assert_eq!(ref_count(&c, id), 1, "the sealed buffer still holds it");
    assert_eq!(c.evict(u64::MAX).unwrap(), (0, 0));
    assert_eq!(c.delete(&[id]).unwrap(), vec![DeleteStatus::Deferred]);
    let other = store.client();
    other.put(ObjectId::random(), &[9u8; 4096], b"").unwrap();
    assert_eq!(sealed.data(), &[4u8; 10][..], "its bytes were not reused");
    drop(sealed);
    assert_eq!(c.stats().unwrap().objects, 1, "the deferred delete ran");
}

#[test]
fn create_and_seal_stores_objects_of_any_size() {
    let store = TestStore::start("64MiB");
    let c = store.client();
    // 10 MB of data and 9 MiB of metadata: both over the 8 MiB inline limit.
    let (id, small) = (ObjectId::random(), ObjectId::random());
    let data = content(id, 10_000_000);
    let meta = content(small, 9 << 20);
    c.create_and_seal(id, &data, &meta).unwrap();
    c.create_and_seal(small, b"a", b"b").unwrap();
    let got = c.get(&[id, small], None).unwrap();
    let big = got[0].as_ref().unwrap();
    assert!(big.data() == &data[..] && big.metadata() == &meta[..]);
    assert_eq!(got[1].as_ref().unwrap().metadata(), b"b");
    drop(got);
    assert_eq!(ref_count(&c, id), 0, "create_and_seal keeps no reference");
    assert!(matches!(
        c.create_and_seal(id, &data, b""),
        Err(ClientError::ObjectExists { .. })
    ));
    // A create with metadata over the inline limit writes it itself.
    let id2 = ObjectId::random();
    let mut buf = c.create(id2, 5, &meta).unwrap();
    buf.as_mut_slice().copy_from_slice(b"hello");
    let sealed = c.seal(buf).unwrap();
    assert!(sealed.data() == b"hello" && sealed.metadata() == &meta[..]);
    let got = c.get(&[id2], None).unwrap().pop().unwrap().unwrap();
    assert!(got.data() == b"hello" && got.metadata() == &meta[..]);
}

#[test]
fn evict_reports_the_bytes_of_the_objects() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let (a, b) = (ObjectId::random(), ObjectId::random());
    c.put(a, &[1u8; 1000], b"0123456789").unwrap();
    c.put(b, &[2u8; 77], b"").unwrap();
    // Allocations are 64-byte multiples; evict counts data + metadata.
    assert_eq!(c.evict(1).unwrap(), (1010, 1));
    assert_eq!(c.evict(1).unwrap(), (77, 1));
    assert_eq!(c.evict(1).unwrap(), (0, 0));
}

#[test]
fn plasma_framed_notifications_are_read_from_the_socket_itself() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let sub = c.subscribe_with(EventFraming::PlasmaFrames, false).unwrap();
    let ids: Vec<ObjectId> = (0..5).map(|_| ObjectId::random()).collect();
    for (i, id) in ids.iter().enumerate() {
        c.put(*id, &vec![0u8; 10 * i], &vec![1u8; i]).unwrap();
    }
    c.delete(&ids[..1]).unwrap();
    // Read the raw socket, as pyarrow.plasma's users did: 8-byte length,
    // then one notification.
    // Safety: the subscription owns the descriptor and outlives this borrow,
    // which is only duplicated.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(sub.as_raw_fd()) };
    let mut sock = std::os::unix::net::UnixStream::from(fd.try_clone_to_owned().unwrap());
    let mut next = || {
        let mut len = [0u8; 8];
        sock.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u64::from_le_bytes(len) as usize];
        sock.read_exact(&mut body).unwrap();
        ferroplasma_client::decode_plasma_event(&body).unwrap()
    };
    for (i, id) in ids.iter().enumerate() {
        let e = next();
        assert_eq!((e.kind, e.id), (EventKind::Sealed, *id));
        assert_eq!((e.data_size, e.metadata_size), (10 * i as u64, i as u64));
    }
    let e = next();
    assert_eq!((e.kind, e.id), (EventKind::Deleted, ids[0]));
}

#[test]
fn a_subscriber_that_asks_is_told_of_the_objects_already_sealed() {
    let store = TestStore::start("16MiB");
    let c = store.client();
    let before: Vec<ObjectId> = (0..3).map(|_| ObjectId::random()).collect();
    for (i, id) in before.iter().enumerate() {
        c.put(*id, &vec![1u8; 10 + i], b"m").unwrap();
    }
    let unsealed = c.create(ObjectId::random(), 5, b"").unwrap();
    let gone = ObjectId::random();
    c.put(gone, b"x", b"").unwrap();
    c.delete(&[gone]).unwrap();
    let mut sub = c.subscribe_with(EventFraming::ReplyFrames, true).unwrap();
    let mut late = c.subscribe().unwrap();
    let after = ObjectId::random();
    c.put(after, b"later", b"").unwrap();
    // Oldest seal first, then what happened after the subscription.
    for (i, id) in before.iter().enumerate() {
        let e = sub.next_timeout(Duration::from_secs(5)).unwrap().unwrap();
        assert_eq!(
            (e.kind, e.id, e.data_size),
            (EventKind::Sealed, *id, 10 + i as u64)
        );
    }
    let e = sub.next_timeout(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(
        (e.kind, e.id),
        (EventKind::Sealed, after),
        "no unsealed or deleted object"
    );
    // Without asking, only what comes after.
    let e = late.next_timeout(Duration::from_secs(5)).unwrap().unwrap();
    assert_eq!(e.id, after);
    drop(unsealed);
}

#[test]
fn a_regular_file_at_the_socket_path_is_replaced_only_when_asked() {
    let dir = temp_dir("replace-file");
    let path = dir.join("plasma.sock");
    std::fs::write(&path, b"a NamedTemporaryFile").unwrap();
    let out = run_store_once(&path, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("is not a socket") && err.contains("--replace-file"),
        "the refusal says why and what to do: {err}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"a NamedTemporaryFile");
    // A directory is never replaced, even when asked.
    let sub = dir.join("a-directory");
    std::fs::create_dir(&sub).unwrap();
    let out = run_store_once(&sub, &["--replace-file"]);
    assert!(!out.status.success() && sub.is_dir());
    // Asked: the file gives way to a live store.
    let mut store = TestStore {
        child: None,
        dir: dir.clone(),
        socket: path.clone(),
    };
    store.child = Some(
        std::process::Command::new(common::bin())
            .args(["store", "--memory", "8MiB", "--replace-file", "--socket"])
            .arg(&path)
            .env("FERROPLASMA_LOG", "warn")
            .spawn()
            .unwrap(),
    );
    store.wait_ready();
    store.client().put(ObjectId::random(), b"x", b"").unwrap();
    // A live store's socket is never replaced.
    let out = run_store_once(&path, &["--replace-file"]);
    assert!(!out.status.success());
    assert!(store.alive());
    store.client().stats().unwrap();
}

#[test]
fn a_store_smaller_than_a_page_runs() {
    let store = TestStore::start("4000");
    let c = store.client();
    assert_eq!(c.capacity(), 4000);
    c.put(ObjectId::random(), &[5u8; 3000], b"").unwrap();
    let err = c.create(ObjectId::random(), 4001, b"").unwrap_err();
    assert!(matches!(err, ClientError::StoreFull(_)), "{err:?}");
}

//! The store survives what clients and operators throw at it: garbage bytes,
//! protocol violations, clients killed mid-operation, a second store on the
//! same socket, signals.

mod common;

use common::{bin, run_store_once, temp_dir, TestStore};
use ferroplasma_client::{Client, ClientError, ObjectId};
use ferroplasma_protocol::frame::{encode_frame, read_message, MAX_REPLY_FRAME};
use ferroplasma_protocol::pb::{self, reply, request};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::Duration;

fn raw(store: &TestStore) -> UnixStream {
    let s = UnixStream::connect(store.path()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn send(s: &mut UnixStream, id: u64, body: request::Body) {
    let _ = s.write_all(&encode_frame(&pb::Request {
        request_id: id,
        body: Some(body),
    }));
}

fn recv(s: &mut UnixStream) -> Option<pb::Reply> {
    read_message(s, MAX_REPLY_FRAME).ok()
}

fn send_connect(s: &mut UnixStream, protocol_version: u32) {
    send(
        s,
        1,
        request::Body::Connect(pb::Connect {
            protocol_version,
            client_name: "raw test".into(),
        }),
    );
}

fn handshake(s: &mut UnixStream) {
    send_connect(s, ferroplasma_protocol::PROTOCOL_VERSION);
    assert!(matches!(
        recv(s).unwrap().body,
        Some(reply::Body::Connect(_))
    ));
}

fn error_code(r: Option<pb::Reply>) -> Option<pb::ErrorCode> {
    match r?.body? {
        reply::Body::Error(e) => pb::ErrorCode::try_from(e.code).ok(),
        _ => None,
    }
}

/// The connection was closed by the store.
fn closed(s: &mut UnixStream) -> bool {
    let mut b = [0u8; 1];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue, // a final error frame may precede the close
            Err(_) => return false,
        }
    }
}

/// A tiny deterministic generator (no rand crate needed for noise).
struct Noise(u64);
impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn assert_serves(store: &TestStore) {
    let c = store.client();
    let id = ObjectId::random();
    c.put(id, b"still serving", b"").unwrap();
    assert_eq!(
        c.get(&[id], None).unwrap()[0].as_ref().unwrap().data(),
        b"still serving"
    );
}

/// One hostile connection: noise, lies about lengths, truncated or
/// bit-flipped frames, with or without a handshake first.
fn hostile_round(store: &TestStore, noise: &mut Noise, round: u64, keep: ObjectId) {
    let mut s = raw(store);
    if round % 2 == 1 {
        handshake(&mut s);
    }
    match round % 5 {
        // Pure noise.
        0 => {
            let n = (noise.next() % 300) as usize;
            let _ = s.write_all(&noise.bytes(n));
        }
        // A plausible length, then noise of that length.
        1 => {
            let n = (noise.next() % 200) as u32;
            let _ = s.write_all(&n.to_le_bytes());
            let _ = s.write_all(&noise.bytes(n as usize));
        }
        // A huge announced length.
        2 => {
            let _ = s.write_all(&u32::MAX.to_le_bytes());
        }
        // A truncated valid frame.
        3 => {
            let f = encode_frame(&pb::Request {
                request_id: 9,
                body: Some(request::Body::Stats(pb::Stats {})),
            });
            let cut = (noise.next() as usize) % f.len();
            let _ = s.write_all(&f[..cut]);
        }
        // A valid frame with flipped bits.
        _ => {
            let mut f = encode_frame(&pb::Request {
                request_id: 9,
                body: Some(request::Body::Get(pb::Get {
                    object_ids: keep.0.to_vec(),
                    timeout_ms: 0,
                })),
            });
            let i = 4 + (noise.next() as usize) % (f.len() - 4);
            f[i] ^= 1 << (noise.next() % 8);
            let _ = s.write_all(&f);
        }
    }
}

/// Hostile connections from several threads at once while a well-behaved
/// client keeps working; `FP_STRESS_SCALE` multiplies the count.
#[test]
fn garbage_from_many_connections_leaves_the_store_serving() {
    let mut store = TestStore::start("16MiB");
    let good = store.client();
    let keep = ObjectId::random();
    good.put(keep, b"precious", b"").unwrap();
    let scale: u64 = std::env::var("FP_STRESS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let (threads, rounds) = (4u64, 150 * scale);
    let done = std::sync::atomic::AtomicBool::new(false);
    let served = std::thread::scope(|sc| {
        let store = &store;
        let hostile: Vec<_> = (0..threads)
            .map(|t| {
                sc.spawn(move || {
                    let mut noise = Noise(0x9e3779b97f4a7c15 ^ (t + 1));
                    for round in 0..rounds {
                        hostile_round(store, &mut noise, round, keep);
                    }
                })
            })
            .collect();
        // The well-behaved client, throughout.
        let checker = sc.spawn(|| {
            let mut n = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                assert_serves(store);
                n += 1;
            }
            n
        });
        for h in hostile {
            h.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        checker.join().unwrap()
    });
    let frames = threads * rounds;
    assert!(
        store.alive(),
        "the store died after {frames} hostile frames"
    );
    assert!(served > 0);
    assert_eq!(
        good.get(&[keep], None).unwrap()[0].as_ref().unwrap().data(),
        b"precious"
    );
    store.eventually("hostile connections are cleaned up", || {
        good.stats().unwrap().clients == 1 && good.stats().unwrap().referenced_objects == 0
    });
    println!(
        "{frames} hostile frames on as many connections from {threads} threads; \
         a well-behaved client was served {served} times meanwhile"
    );
}

#[test]
fn only_the_creator_may_seal_or_abort() {
    let store = TestStore::start("16MiB");
    let (mut a, mut b) = (raw(&store), raw(&store));
    handshake(&mut a);
    handshake(&mut b);
    let id = ObjectId::random();
    send(
        &mut a,
        2,
        request::Body::Create(pb::Create {
            object_id: id.0.to_vec(),
            data_size: 4096,
            metadata: vec![],
            wait_ms: 0,
            metadata_size: 0,
        }),
    );
    assert!(matches!(
        recv(&mut a).unwrap().body,
        Some(reply::Body::Create(_))
    ));
    let oid = || id.0.to_vec();
    send(
        &mut b,
        2,
        request::Body::Seal(pb::Seal { object_id: oid() }),
    );
    assert_eq!(error_code(recv(&mut b)), Some(pb::ErrorCode::NotCreator));
    send(
        &mut b,
        3,
        request::Body::Abort(pb::Abort { object_id: oid() }),
    );
    assert_eq!(error_code(recv(&mut b)), Some(pb::ErrorCode::NotCreator));
    let unknown = ObjectId::random().0.to_vec();
    send(
        &mut b,
        4,
        request::Body::Seal(pb::Seal { object_id: unknown }),
    );
    assert_eq!(
        error_code(recv(&mut b)),
        Some(pb::ErrorCode::ObjectNotFound)
    );
    send(
        &mut a,
        3,
        request::Body::Seal(pb::Seal { object_id: oid() }),
    );
    assert!(matches!(
        recv(&mut a).unwrap().body,
        Some(reply::Body::Ok(_))
    ));
    send(
        &mut a,
        4,
        request::Body::Seal(pb::Seal { object_id: oid() }),
    );
    assert_eq!(error_code(recv(&mut a)), Some(pb::ErrorCode::AlreadySealed));
}

#[test]
fn protocol_violations_get_typed_errors_or_a_closed_connection() {
    let mut store = TestStore::start("16MiB");
    // A request before Connect.
    let mut s = raw(&store);
    send(&mut s, 3, request::Body::Stats(pb::Stats {}));
    assert_eq!(
        error_code(recv(&mut s)),
        Some(pb::ErrorCode::ProtocolViolation)
    );
    assert!(closed(&mut s));
    // A wrong protocol version.
    let mut s = raw(&store);
    send_connect(&mut s, 999);
    assert_eq!(
        error_code(recv(&mut s)),
        Some(pb::ErrorCode::VersionMismatch)
    );
    assert!(closed(&mut s));
    // Bad ids and oversized batches are refused; the connection stays usable.
    let mut s = raw(&store);
    handshake(&mut s);
    send(
        &mut s,
        2,
        request::Body::Seal(pb::Seal {
            object_id: vec![1, 2, 3],
        }),
    );
    assert_eq!(
        error_code(recv(&mut s)),
        Some(pb::ErrorCode::InvalidRequest)
    );
    send(
        &mut s,
        2,
        request::Body::Contains(pb::Contains {
            object_ids: vec![1; 25],
            cluster: false,
            deleting: false,
        }),
    );
    assert_eq!(
        error_code(recv(&mut s)),
        Some(pb::ErrorCode::InvalidRequest)
    );
    send(
        &mut s,
        3,
        request::Body::Contains(pb::Contains {
            object_ids: vec![0; 20 * 100_001],
            cluster: false,
            deleting: false,
        }),
    );
    assert_eq!(error_code(recv(&mut s)), Some(pb::ErrorCode::TooLarge));
    send(
        &mut s,
        4,
        request::Body::Create(pb::Create {
            object_id: vec![5; 20],
            data_size: u64::MAX,
            metadata: vec![],
            wait_ms: -1, // too big to ever fit: refused at once, no wait
            metadata_size: 0,
        }),
    );
    assert_eq!(error_code(recv(&mut s)), Some(pb::ErrorCode::StoreFull));
    // Metadata the client would write itself, of an absurd size.
    send(
        &mut s,
        4,
        request::Body::Create(pb::Create {
            object_id: vec![5; 20],
            data_size: 10,
            metadata: vec![],
            wait_ms: 0,
            metadata_size: u64::MAX,
        }),
    );
    // (Over the 128 MiB an object's metadata may have: too large, whatever
    // the store's size.)
    assert_eq!(error_code(recv(&mut s)), Some(pb::ErrorCode::TooLarge));
    // Both the metadata and a size for it: which is meant?
    send(
        &mut s,
        4,
        request::Body::Create(pb::Create {
            object_id: vec![5; 20],
            data_size: 10,
            metadata: vec![1; 4],
            wait_ms: 0,
            metadata_size: 4,
        }),
    );
    assert_eq!(
        error_code(recv(&mut s)),
        Some(pb::ErrorCode::InvalidRequest)
    );
    // An empty request body (an unknown type from a newer client).
    let _ = s.write_all(&encode_frame(&pb::Request {
        request_id: 5,
        body: None,
    }));
    assert_eq!(
        error_code(recv(&mut s)),
        Some(pb::ErrorCode::InvalidRequest)
    );
    send(&mut s, 6, request::Body::Stats(pb::Stats {}));
    assert!(matches!(
        recv(&mut s).unwrap().body,
        Some(reply::Body::Stats(_))
    ));
    // Releasing what it does not hold costs the client its connection.
    send(
        &mut s,
        7,
        request::Body::Release(pb::Release {
            object_ids: vec![7; 20],
        }),
    );
    assert!(closed(&mut s));
    // A second Connect is refused.
    let mut s = raw(&store);
    handshake(&mut s);
    send_connect(&mut s, ferroplasma_protocol::PROTOCOL_VERSION);
    assert_eq!(
        error_code(recv(&mut s)),
        Some(pb::ErrorCode::ProtocolViolation)
    );
    assert!(store.alive());
    assert_serves(&store);
}

// ------------------------------------------------------------ killed clients

/// Re-run of this test binary as a child client (see `kill_*` tests).
#[test]
#[ignore = "helper: runs only as a child process of the kill tests"]
fn child_client() {
    let Ok(role) = std::env::var("FP_CHILD_ROLE") else {
        return;
    };
    let socket = std::env::var("FP_CHILD_SOCKET").unwrap();
    let c = Client::connect(Some(socket.as_ref())).unwrap();
    let mut held = Vec::new();
    match role.as_str() {
        "mid-create" => {
            let mut b = c.create(ObjectId::random(), 4 << 20, b"m").unwrap();
            b.as_mut_slice()[..1 << 20].fill(0xab);
            // A second, smaller unsealed object, half written.
            let mut b2 = c.create(ObjectId::random(), 12345, b"").unwrap();
            b2.as_mut_slice()[0] = 1;
        }
        "holding" => {
            let ids: Vec<ObjectId> = std::env::var("FP_CHILD_IDS")
                .unwrap()
                .split(',')
                .map(|h| ObjectId::from_hex(h).unwrap())
                .collect();
            held = c.get(&ids, None).unwrap();
            assert!(held.iter().all(Option::is_some));
        }
        "blocked-get" => {
            println!("READY");
            std::io::stdout().flush().unwrap();
            let _ = c.get(&[ObjectId::random()], None);
        }
        _ => panic!("unknown role"),
    }
    println!("READY");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
    drop(held);
}

fn spawn_child(store: &TestStore, role: &str, ids: &[ObjectId]) -> std::process::Child {
    let hex: Vec<String> = ids.iter().map(|i| i.to_hex()).collect();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_client",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FP_CHILD_ROLE", role)
        .env("FP_CHILD_SOCKET", store.path())
        .env("FP_CHILD_IDS", hex.join(","))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let line = lines.next().expect("child exited before READY").unwrap();
        if line.contains("READY") {
            break;
        }
    }
    child
}

#[test]
fn a_client_killed_mid_create_leaves_no_bytes_used() {
    let store = TestStore::start("64MiB");
    let c = store.client();
    let keep = ObjectId::random();
    c.put(keep, &[1u8; 1000], b"").unwrap();
    let before = c.stats().unwrap().used;
    for _ in 0..3 {
        let mut child = spawn_child(&store, "mid-create", &[]);
        assert!(c.stats().unwrap().used > before + (4 << 20));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        store.eventually("the dead client's objects are aborted", || {
            let s = c.stats().unwrap();
            s.used == before && s.objects == 1 && s.clients == 1
        });
    }
}

#[test]
fn a_client_killed_holding_references_or_blocked_in_get_releases_everything() {
    let mut store = TestStore::start("64MiB");
    let c = store.client();
    let ids: Vec<_> = (0..20).map(|_| ObjectId::random()).collect();
    for id in &ids {
        c.put(*id, &[3u8; 5000], b"").unwrap();
    }
    let mut holder = spawn_child(&store, "holding", &ids);
    let mut blocked = spawn_child(&store, "blocked-get", &[]);
    assert_eq!(c.stats().unwrap().referenced_objects, 20);
    // Held objects are not evictable ...
    assert_eq!(c.evict(u64::MAX).unwrap().1, 0);
    holder.kill().unwrap();
    blocked.kill().unwrap();
    holder.wait().unwrap();
    blocked.wait().unwrap();
    store.eventually("references of the dead clients are dropped", || {
        let s = c.stats().unwrap();
        s.referenced_objects == 0 && s.clients == 1
    });
    // ... and now they are.
    assert_eq!(c.evict(u64::MAX).unwrap().1, 20);
    assert_eq!(c.stats().unwrap().used, 0);
    assert!(store.alive());
}

// ------------------------------------------------------------ the socket

#[test]
fn a_second_store_on_a_live_socket_refuses_and_a_stale_socket_is_replaced() {
    let mut first = TestStore::start("8MiB");
    let out = run_store_once(first.path(), &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already running"), "{err}");
    assert!(first.alive());
    assert_serves(&first);
    // Kill the first store hard: its socket file stays behind, stale.
    let mut child = first.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(first.path().exists());
    let second = Command::new(bin())
        .args(["store", "--memory", "8MiB", "--socket"])
        .arg(first.path())
        .spawn()
        .unwrap();
    first.child = Some(second);
    first.wait_ready();
    assert_serves(&first);
}

#[test]
fn the_socket_is_private_by_default_and_refuses_to_replace_other_files() {
    let store = TestStore::start("8MiB");
    let mode = std::fs::metadata(store.path())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let wide = TestStore::start_with("8MiB", &["--socket-mode", "660"]);
    let mode = std::fs::metadata(wide.path()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    let dir = temp_dir("notsock");
    let file = dir.join("plain-file");
    std::fs::write(&file, b"do not delete").unwrap();
    let out = run_store_once(&file, &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a socket"));
    assert_eq!(std::fs::read(&file).unwrap(), b"do not delete");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sigterm_and_sigint_exit_zero_and_remove_the_socket() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut store = TestStore::start("8MiB");
        let c = store.client();
        let _view = {
            let id = ObjectId::random();
            c.put(id, b"x", b"").unwrap();
            c.get(&[id], None).unwrap()
        };
        let mut child = store.child.take().unwrap();
        // Safety: sending a signal to our own child process by its pid.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "signal {sig}");
        assert!(!store.path().exists(), "socket removed after signal {sig}");
    }
}

// ------------------------------------------------------------ backing options

#[test]
fn dir_backing_leaves_no_file_and_prefault_works() {
    let dir = temp_dir("backing");
    let store = TestStore::start_with("8MiB", &["--dir", dir.to_str().unwrap(), "--prefault"]);
    assert_serves(&store);
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "the arena file is unlinked"
    );
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn default_memory_is_half_of_dev_shm_capped_and_said_at_start() {
    let dir = temp_dir("default-mem");
    let socket = dir.join("s.sock");
    let mut child = Command::new(bin())
        .args(["store", "--socket"])
        .arg(&socket)
        .env("FERROPLASMA_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let ready = lines
        .find(|l| l.as_ref().is_ok_and(|l| l.contains("ready")))
        .unwrap()
        .unwrap();
    assert!(ready.contains("half of"), "{ready}");
    let c = Client::connect(Some(&socket)).unwrap();
    let st = nix::sys::statvfs::statvfs("/dev/shm").unwrap();
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    let expect = (free / 2).min(8 << 30);
    let cap = c.capacity();
    assert!(cap <= 8 << 30);
    assert!(
        cap.abs_diff(expect) < expect / 10 + (1 << 20),
        "{cap} vs {expect}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn hugepages_without_reserved_pages_fail_with_a_hint() {
    let reserved: u64 = std::fs::read_to_string("/proc/sys/vm/nr_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if reserved > 0 {
        let store = TestStore::start_with("4MiB", &["--hugepages"]);
        assert_serves(&store);
        return;
    }
    let dir = temp_dir("huge");
    let out = run_store_once(&dir.join("s.sock"), &["--hugepages"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nr_hugepages"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn clients_over_the_maximum_are_told_the_store_is_busy() {
    let store = TestStore::start_with("8MiB", &["--max-clients", "2"]);
    let mut held = Vec::new();
    store.eventually("two clients connected", || {
        if let Ok(c) = Client::connect(Some(store.path())) {
            held.push(c);
        }
        held.len() == 2
    });
    let err = Client::connect(Some(store.path())).unwrap_err();
    assert!(err.to_string().contains("--max-clients"), "{err}");
    // Its own error, not "too large" (Python: StoreBusy, a StoreUnavailable).
    assert!(matches!(err, ClientError::StoreBusy(_)), "{err:?}");
    held[1].stats().unwrap();
    held.pop();
    store.eventually("a place frees up when a client leaves", || {
        Client::connect(Some(store.path())).is_ok()
    });
    held[0].stats().unwrap();
}

/// `AttachTable` (a client asking for the table that replaced its own)
/// answers only the client it names, with that client's token: a stranger
/// who guesses client ids gets INVALID_REQUEST and nothing else; sent on a
/// connection already handshaken, it is a protocol violation.
#[test]
fn an_attach_table_without_the_clients_token_is_refused() {
    let store = TestStore::start("16MiB");
    let mut owner = raw(&store);
    handshake(&mut owner);
    for client_id in [0, 1, 2, u64::MAX] {
        for token in [vec![], vec![0u8; 16], vec![7u8; 1000]] {
            let mut s = raw(&store);
            send(
                &mut s,
                1,
                request::Body::AttachTable(pb::AttachTable {
                    protocol_version: ferroplasma_protocol::PROTOCOL_VERSION,
                    client_id,
                    token,
                }),
            );
            assert_eq!(
                error_code(recv(&mut s)),
                Some(pb::ErrorCode::InvalidRequest)
            );
            assert!(closed(&mut s));
        }
    }
    send(
        &mut owner,
        2,
        request::Body::AttachTable(pb::AttachTable::default()),
    );
    assert_eq!(
        error_code(recv(&mut owner)),
        Some(pb::ErrorCode::ProtocolViolation)
    );
    assert_serves(&store);
}

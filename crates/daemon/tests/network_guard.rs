//! Strangers on the network cannot stop local clients: idle connections to
//! the cluster (gRPC), bulk and metrics ports are capped and closed after
//! their deadline, never take the descriptors local clients need, and
//! refusals are logged at a bounded rate (docs/cluster.md, "Network
//! ports"). Each test runs a real store on 127.0.0.1 ports the system
//! picked.

mod common;

use common::{content, temp_dir, TestStore};
use ferroplasma_client::{Client, ObjectId};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Idle connections the tests open to each port.
const IDLE: usize = 1200;
/// The store's descriptor limit (soft and hard) in the first test.
const STORE_NOFILE: u64 = 1024;
/// How long a connection may stay without sending anything (docs/cluster.md).
const HELLO: Duration = Duration::from_secs(3);

/// Raises this process's soft descriptor limit to its hard one; false when
/// that leaves too few for the test.
fn raise_own_nofile(need: u64) -> bool {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return false;
        }
        r.rlim_cur = r.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
            return false;
        }
    }
    r.rlim_cur >= need
}

/// A cluster member with metrics, alone, its log (info) in a file; with
/// `nofile`, started under that descriptor limit (soft, hard).
fn start(tag: &str, nofile: Option<(u64, u64)>) -> (TestStore, PathBuf) {
    let dir = temp_dir(tag);
    let socket = dir.join("store.sock");
    let log = dir.join("store.log");
    let mut cmd = Command::new(common::bin());
    cmd.args(["store", "--memory", "16MiB", "--socket"])
        .arg(&socket)
        .args([
            "--cluster-listen",
            "127.0.0.1:0",
            "--cluster-token",
            "guard-test",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .env("FERROPLASMA_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    if let Some((soft, hard)) = nofile {
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only setrlimit, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                let r = libc::rlimit {
                    rlim_cur: soft as libc::rlim_t,
                    rlim_max: hard as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let store = TestStore {
        child: Some(cmd.spawn().expect("spawn ferroplasma store")),
        dir,
        socket,
    };
    store.wait_ready();
    (store, log)
}

/// The address after `key=` on the first log line containing `line`.
fn logged_addr(log: &Path, line: &str, key: &str) -> SocketAddr {
    let text = std::fs::read_to_string(log).unwrap();
    let l = text
        .lines()
        .find(|l| l.contains(line))
        .unwrap_or_else(|| panic!("no {line:?} in the log:\n{text}"));
    let at = l.find(&format!("{key}=")).expect("the field") + key.len() + 1;
    l[at..].split_whitespace().next().unwrap().parse().unwrap()
}

/// Opens `n` connections to each of `ports` that send nothing, from 8
/// threads at once (a connect whose SYN found the backlog full waits 1 s
/// to try again: they wait together); a thread stops after three failed
/// connects in a row (a backlog full of unaccepted connections).
fn open_idle(ports: &[SocketAddr], n: usize) -> Vec<Vec<TcpStream>> {
    const THREADS: usize = 8;
    let k = ports.len();
    let per_thread: Vec<Vec<Vec<TcpStream>>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(move || {
                    let mut v: Vec<Vec<TcpStream>> = (0..k).map(|_| Vec::new()).collect();
                    let mut failed = 0;
                    for i in 0..k * n / THREADS {
                        if failed >= 3 {
                            break;
                        }
                        // A SYN dropped while the listen queue is full is
                        // sent again after 1 s, then 2 s: a connect that
                        // times out once on a loaded machine is tried again.
                        let connect =
                            || TcpStream::connect_timeout(&ports[i % k], Duration::from_secs(4));
                        match connect().or_else(|_| connect()) {
                            Ok(c) => {
                                c.set_nonblocking(true).unwrap();
                                v[i % k].push(c);
                                failed = 0;
                            }
                            Err(_) => failed += 1,
                        }
                    }
                    v
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all: Vec<Vec<TcpStream>> = (0..k).map(|_| Vec::new()).collect();
    for v in per_thread {
        for (a, b) in all.iter_mut().zip(v) {
            a.extend(b);
        }
    }
    all
}

/// Whether the store closed `s` (what it sent before is read and dropped).
fn closed(mut s: &TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true,
        }
    }
}

fn still_open(v: &[TcpStream]) -> usize {
    v.iter().filter(|s| !closed(s)).count()
}

/// Connects to the store and puts and gets one object, in a thread: its
/// time, or `None` when that took longer than `bound`.
fn local_round(socket: &Path, bound: Duration) -> Option<Duration> {
    let socket = socket.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = Instant::now();
    std::thread::spawn(move || {
        let c = Client::connect(Some(&socket)).expect("connect");
        let id = ObjectId::random();
        c.put(id, &content(id, 1000), b"m").expect("put");
        let b = c.get(&[id], Some(Duration::ZERO)).expect("get").remove(0);
        assert_eq!(b.expect("the object").data(), &content(id, 1000)[..]);
        let _ = tx.send(t.elapsed());
    });
    rx.recv_timeout(bound).ok()
}

/// `GET /metrics` answered 200.
fn scrape(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

/// The log's warnings and errors.
fn complaints(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .map(String::from)
        .collect()
}

#[test]
fn idle_network_connections_leave_local_clients_their_descriptors() {
    if !raise_own_nofile(4 * IDLE as u64) {
        eprintln!("skipped: this process cannot have {} descriptors", 4 * IDLE);
        return;
    }
    let (mut store, log) = start("guard-idle", Some((STORE_NOFILE, STORE_NOFILE)));
    let ports = [
        logged_addr(&log, "cluster member ready", "me"),
        logged_addr(&log, "cluster member ready", "data"),
        logged_addr(&log, "metrics at", "addr"),
    ];
    let names = ["gRPC", "bulk", "metrics"];
    let t = Instant::now();
    let idle = open_idle(&ports, IDLE);
    let opened = t.elapsed();
    let counts: Vec<usize> = idle.iter().map(Vec::len).collect();
    eprintln!("opened {counts:?} idle connections to {names:?} at {ports:?} in {opened:?}");
    // Let the store take them in (or fail to).
    std::thread::sleep(Duration::from_millis(300));
    let round = local_round(&store.socket, Duration::from_secs(5));
    eprintln!("local connect + put + get with them open: {round:?}");
    let held: Vec<usize> = idle.iter().map(|v| still_open(v)).collect();
    eprintln!(
        "{:?} after the first connect, still open: {held:?}",
        t.elapsed()
    );
    assert!(
        round.is_some_and(|r| r < Duration::from_secs(2)),
        "a local client waited {round:?} (bound 2 s) behind {counts:?} idle network connections"
    );
    assert_eq!(counts, [IDLE; 3], "every connect went through");
    assert!(
        held.iter().sum::<usize>() as u64 <= STORE_NOFILE / 2,
        "the network holds {held:?} of the store's {STORE_NOFILE} descriptors"
    );
    // The store closes each within its deadline of being accepted.
    let deadline = t + opened + HELLO + Duration::from_secs(3);
    let mut open = held;
    while open.iter().any(|&n| n > 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        open = idle.iter().map(|v| still_open(v)).collect();
    }
    eprintln!(
        "{:?} after the first connect, still open: {open:?}",
        t.elapsed()
    );
    assert_eq!(open, [0; 3], "idle connections outlive their deadline");
    assert!(scrape(ports[2]), "the metrics port serves after the flood");
    assert!(local_round(&store.socket, Duration::from_secs(2)).is_some());
    assert!(store.alive());
    let took = t.elapsed();
    drop(store.child.take().map(|mut c| (c.kill(), c.wait())));
    let lines = complaints(&log);
    eprintln!(
        "{} warnings in {took:?}:\n{}",
        lines.len(),
        lines.join("\n")
    );
    // Per port: over the cap, and no hello within the deadline; one line
    // per kind per 10 s.
    let periods = 1 + took.as_secs() as usize / 10;
    assert!(
        lines.len() <= 3 * 2 * periods,
        "{} warnings for {} connections in {took:?}",
        lines.len(),
        3 * IDLE
    );
}

#[test]
fn the_store_raises_its_descriptor_limit_to_the_hard_one() {
    let (store, _log) = start("guard-nofile", Some((256, 2048)));
    let pid = store.child.as_ref().unwrap().id();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let v: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&v[3..5], ["2048", "2048"], "{line}");
}

/// Presents a wrong token on the bulk port; true when the store closed
/// the connection.
fn wrong_bulk_token(addr: SocketAddr) -> bool {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut hello = b"FPB2".to_vec();
    hello.extend_from_slice(&5u16.to_le_bytes());
    hello.extend_from_slice(b"wrong");
    s.write_all(&hello).unwrap();
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(0) | Err(_))
}

/// Lines of the log containing `what`, once there are at least `n` (2 s at most).
fn lines_with(log: &Path, what: &str, n: usize) -> Vec<String> {
    let t = Instant::now();
    loop {
        let v: Vec<String> = std::fs::read_to_string(log)
            .unwrap()
            .lines()
            .filter(|l| l.contains(what))
            .map(String::from)
            .collect();
        if v.len() >= n || t.elapsed() > Duration::from_secs(2) {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn refused_tokens_are_logged_once_per_10_s_with_the_number_suppressed() {
    use ferroplasma_daemon::cluster::pb::{peer_client::PeerClient, HeartbeatRequest};
    let (mut store, log) = start("guard-token", None);
    let grpc = logged_addr(&log, "cluster member ready", "me");
    let bulk = logged_addr(&log, "cluster member ready", "data");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut peer = rt
        .block_on(PeerClient::connect(format!("http://{grpc}")))
        .unwrap();
    let mut grpc_refusal = || {
        let e = rt
            .block_on(peer.heartbeat(HeartbeatRequest::default()))
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
    };
    let t = Instant::now();
    for _ in 0..200 {
        assert!(wrong_bulk_token(bulk), "a wrong token is refused");
        grpc_refusal();
    }
    eprintln!("200 refusals on each port in {:?}", t.elapsed());
    let first_bulk = lines_with(&log, "bulk connection refused", 1);
    let first_grpc = lines_with(&log, "cluster call refused", 1);
    assert_eq!(first_bulk.len(), 1, "{first_bulk:#?}");
    assert_eq!(first_grpc.len(), 1, "{first_grpc:#?}");
    // Past the 10 s, the next refusal is logged with the count of those
    // that were not.
    std::thread::sleep(
        (t + Duration::from_millis(10_300)).saturating_duration_since(Instant::now()),
    );
    assert!(wrong_bulk_token(bulk));
    grpc_refusal();
    let bulk_lines = lines_with(&log, "bulk connection refused", 2);
    let grpc_lines = lines_with(&log, "cluster call refused", 2);
    eprintln!("{}\n{}", bulk_lines.join("\n"), grpc_lines.join("\n"));
    assert_eq!(bulk_lines.len(), 2, "{bulk_lines:#?}");
    assert_eq!(grpc_lines.len(), 2, "{grpc_lines:#?}");
    assert!(
        bulk_lines[1].contains("suppressed=199"),
        "{}",
        bulk_lines[1]
    );
    assert!(
        grpc_lines[1].contains("suppressed=199"),
        "{}",
        grpc_lines[1]
    );
    assert!(store.alive());
}

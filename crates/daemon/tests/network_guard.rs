//! What strangers on the network can make a store do: refusals are
//! logged at a bounded rate (docs/cluster.md, "Network ports"). Each test
//! runs a real store on 127.0.0.1 ports the system picked.

mod common;

use common::{temp_dir, TestStore};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A cluster member with metrics, alone, its log (info) in a file.
fn start(tag: &str) -> (TestStore, PathBuf) {
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
    let (mut store, log) = start("guard-token");
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

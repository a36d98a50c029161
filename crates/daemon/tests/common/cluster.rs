//! Cluster members for tests: real stores joined over loopback TCP (or in
//! network namespaces), and helpers to put and check objects.

use super::{content, TestStore};
use ferroplasma_client::{Client, MemberHealth, ObjectId};
use std::time::{Duration, Instant};

pub const TOKEN: &str = "test-token-1";

pub struct Member {
    pub store: TestStore,
    pub addr: String,
}

impl Member {
    pub fn start(addr: &str, peers: &[&str], token: &str) -> Self {
        Self::start_in(None, addr, peers, token)
    }

    pub fn start_in(netns: Option<&str>, addr: &str, peers: &[&str], token: &str) -> Self {
        Self::start_sized(netns, addr, peers, token, "64MiB")
    }

    /// [`Member::start_in`] with `memory` for its store.
    pub fn start_sized(
        netns: Option<&str>,
        addr: &str,
        peers: &[&str],
        token: &str,
        memory: &str,
    ) -> Self {
        Self::start_timed(netns, addr, peers, token, memory, "2s")
    }

    /// [`Member::start_sized`] with `peer_timeout` (heartbeats every 100 ms).
    pub fn start_timed(
        netns: Option<&str>,
        addr: &str,
        peers: &[&str],
        token: &str,
        memory: &str,
        peer_timeout: &str,
    ) -> Self {
        let mut args = vec![
            "--cluster-listen",
            addr,
            "--cluster-token",
            token,
            "--heartbeat-interval",
            "100ms",
            "--peer-timeout",
            peer_timeout,
        ];
        let joined = peers.join(",");
        if !peers.is_empty() {
            args.extend(["--peers", &joined]);
        }
        let store = TestStore::start_in(netns, memory, &args);
        // With port 0 the store picked its port: ask it which.
        let addr = if addr.ends_with(":0") {
            let status = store.client().cluster_status().unwrap();
            status
                .members
                .iter()
                .find(|m| m.health == MemberHealth::ThisMember as i32)
                .expect("this member")
                .addr
                .clone()
        } else {
            addr.into()
        };
        Member { store, addr }
    }

    pub fn client(&self) -> Client {
        self.store.client()
    }

    pub fn alive_members(&self) -> usize {
        let s = self.client().cluster_status().unwrap();
        s.members
            .iter()
            .filter(|m| {
                m.health == MemberHealth::Alive as i32
                    || m.health == MemberHealth::ThisMember as i32
            })
            .count()
    }

    pub fn fetches(&self) -> u64 {
        self.client().cluster_status().unwrap().fetches
    }
}

pub fn eventually(what: &str, within: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while t.elapsed() < within {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out waiting for: {what}");
}

/// `n` members on loopback, each on a port the system picked; the first is
/// started alone, the others are given it and learn the rest by gossip.
pub fn cluster(n: usize) -> Vec<Member> {
    cluster_sized(n, "64MiB")
}

/// [`cluster`] with `memory` for each store.
pub fn cluster_sized(n: usize, memory: &str) -> Vec<Member> {
    let first = Member::start_sized(None, "127.0.0.1:0", &[], TOKEN, memory);
    let seed = first.addr.clone();
    let mut members = vec![first];
    for _ in 1..n {
        members.push(Member::start_sized(
            None,
            "127.0.0.1:0",
            &[seed.as_str()],
            TOKEN,
            memory,
        ));
    }
    for m in &members {
        eventually(
            "every member sees every other",
            Duration::from_secs(15),
            || m.alive_members() == n,
        );
    }
    members
}

/// Puts `id`; retried while the cluster answers "retry shortly" (a member
/// that just joined: claims wait until every member has re-registered its
/// objects for the new ring), as a program would.
pub fn put(c: &Client, id: ObjectId, len: usize) {
    let t = Instant::now();
    loop {
        match c.put(id, &content(id, len), &content(id, 9)[..5]) {
            Err(ferroplasma_client::ClientError::ClusterUnavailable(_))
                if t.elapsed() < Duration::from_secs(15) =>
            {
                std::thread::sleep(Duration::from_millis(50))
            }
            r => return r.unwrap(),
        }
    }
}

pub fn check(c: &Client, id: ObjectId, len: usize, timeout: Duration) {
    let b = c
        .get(&[id], Some(timeout))
        .unwrap()
        .remove(0)
        .unwrap_or_else(|| panic!("{id} not found within {timeout:?}"));
    assert_eq!(b.data().len(), len);
    assert!(b.data() == &content(id, len)[..], "data of {id} differs");
    assert_eq!(b.metadata(), &content(id, 9)[..5]);
    // Given back now, not within the client's release delay: a delete
    // right after this finds nobody reading it.
    c.release_buffers([b]).unwrap();
}

/// Sends `sig` (`-STOP`, `-CONT`, `-KILL`...) to the member's store.
pub fn signal(m: &Member, sig: &str) {
    let pid = m.store.child.as_ref().unwrap().id().to_string();
    let ok = std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig}");
}

//! A member joining another that holds many objects, with two CPU-bound
//! processes running beside them (issue 38): no member is ever declared
//! dead, and a reader on the joining member finds every object it asks for
//! while its holder lives.
//!
//! `make test` runs it at 200,000 objects, enough for main to declare a
//! healthy member dead under the hogs (before the fix); `make scale`
//! runs it at 1,000,000 (`FP_SCALE_OBJECTS`), and prints how long the join
//! took and the first member's RSS before and after.

mod common;

use common::cluster::{eventually, Member, TOKEN};
use ferroplasma_client::{Client, ClientError, MemberHealth, ObjectId};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// CPU-bound processes (`yes > /dev/null`), killed on drop.
struct Hogs(Vec<Child>);

impl Hogs {
    fn start(n: usize) -> Self {
        Hogs(
            (0..n)
                .map(|_| {
                    Command::new("yes")
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("start a CPU hog (yes)")
                })
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The members' `--peer-timeout` (heartbeats every 100 ms).
const PEER_TIMEOUT: &str = "1s";

fn id(i: u64) -> ObjectId {
    let mut b = [3u8; 20];
    b[..8].copy_from_slice(&i.to_le_bytes());
    ObjectId(b)
}

/// Members a status names dead, with the time it was taken.
fn dead_members(c: &Client) -> Vec<String> {
    match c.cluster_status() {
        Ok(s) => s
            .members
            .iter()
            .filter(|m| m.health == MemberHealth::Dead as i32)
            .map(|m| m.addr.clone())
            .collect(),
        Err(e) => vec![format!("(no status: {e})")],
    }
}

fn rss_kib(m: &Member) -> u64 {
    let pid = m.store.child.as_ref().unwrap().id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_join_beside_many_objects_under_cpu_hogs_declares_no_member_dead() {
    let n: u64 = std::env::var("FP_SCALE_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    // Objects of 8 bytes take 64 each in the arena.
    let memory = format!("{}MiB", ((n * 64 * 2) >> 20).max(64));
    let timeout = std::env::var("FP_SCALE_PEER_TIMEOUT").unwrap_or_else(|_| PEER_TIMEOUT.into());
    let start =
        |peers: &[&str]| Member::start_timed(None, "127.0.0.1:0", peers, TOKEN, &memory, &timeout);
    let a = start(&[]);
    std::thread::scope(|s| {
        for t in 0..4 {
            let c = a.client();
            s.spawn(move || {
                for i in (t..n).step_by(4) {
                    c.put(id(i), &i.to_le_bytes(), b"").unwrap();
                }
            });
        }
    });
    let rss_before = rss_kib(&a);
    let _hogs = Hogs::start(2);
    let t0 = Instant::now();
    let b = start(&[a.addr.as_str()]);
    let b_rss_before = rss_kib(&b);

    // Status of both members, sampled throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let deaths = Arc::new(Mutex::new(Vec::<String>::new()));
    let samplers: Vec<_> = [(a.client(), "A"), (b.client(), "B")]
        .into_iter()
        .map(|(c, name)| {
            let (stop, deaths) = (stop.clone(), deaths.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for d in dead_members(&c) {
                        let t = t0.elapsed().as_secs_f64();
                        deaths
                            .lock()
                            .unwrap()
                            .push(format!("{name} at {t:.1} s: {d}"));
                    }
                    std::thread::sleep(Duration::from_millis(25));
                }
            })
        })
        .collect();

    eventually("B sees A", Duration::from_secs(30), || {
        b.alive_members() == 2
    });
    // A reader on B: each get asks for an object it has not read yet (a
    // remote get), one after another, for as long as the join goes on and
    // a while after. A live holder's object is never missing nor lost.
    let reader = {
        let (c, stop) = (b.client(), stop.clone());
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            let mut read = 0u64;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) && failures.len() < 5 {
                let k = i * 7919 % n;
                let oid = id(k);
                i += 1;
                match c.get(&[oid], Some(Duration::from_secs(20))) {
                    Ok(mut got) => match got.remove(0) {
                        Some(buf) => {
                            assert_eq!(buf.data(), &k.to_le_bytes()[..]);
                            read += 1;
                        }
                        None => failures.push(format!("{oid}: not available")),
                    },
                    Err(ClientError::ObjectLost { .. }) => failures.push(format!("{oid}: lost")),
                    Err(e) => failures.push(format!("{oid}: {e}")),
                }
            }
            (read, failures)
        })
    };
    let bc = b.client();
    let ids: Vec<ObjectId> = (0..n).map(id).collect();
    eventually("B sees every object of A", Duration::from_secs(300), || {
        ids.chunks(50_000)
            .all(|ch| bc.contains_in(ch, true).unwrap().iter().all(|&p| p))
    });
    let joined = t0.elapsed();
    // Heartbeats go on while A's directory settles: a few peer timeouts more.
    std::thread::sleep(Duration::from_secs(6));
    stop.store(true, Ordering::Relaxed);
    let (read, failures) = reader.join().unwrap();
    for s in samplers {
        s.join().unwrap();
    }
    let rss_after = rss_kib(&a);
    let b_rss_after = rss_kib(&b);
    println!(
        "{n} objects: B saw them all {:.2} s after it started; A's RSS {} -> {} MiB, \
         B's {} -> {} MiB ({} B per directory entry); {read} read on B",
        joined.as_secs_f64(),
        rss_before >> 10,
        rss_after >> 10,
        b_rss_before >> 10,
        b_rss_after >> 10,
        (b_rss_after.saturating_sub(b_rss_before) << 10) / n
    );
    let deaths = deaths.lock().unwrap();
    assert!(
        deaths.is_empty(),
        "a healthy member was declared dead: {:?}",
        &deaths[..deaths.len().min(10)]
    );
    assert!(failures.is_empty(), "reads on B failed: {failures:?}");
    assert!(read > 0, "the reader read nothing");
}

//! Many processes at once: clients killed with SIGKILL at random points, and
//! a stress run where several processes create, read, check and delete
//! objects in a store small enough that eviction or spilling never stops.
//!
//! Sizes scale with `FP_STRESS_SCALE` (default 1, `make stress` uses 20);
//! each test prints its counts (`cargo test -- --nocapture` shows them).

mod common;

use common::{temp_dir, TestStore};
use ferroplasma_client::{Client, ClientError, ObjectId};
use ferroplasma_protocol::layout::allocation_size;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

fn scale() -> u64 {
    std::env::var("FP_STRESS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

/// xorshift64: deterministic noise without a rand dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The id of object `seq` of worker `w`: every process can name it.
fn object_id(w: u64, seq: u64) -> ObjectId {
    let mut b = [0u8; 20];
    b[..8].copy_from_slice(&w.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..].copy_from_slice(b"fpst");
    ObjectId(b)
}

/// The bytes object `id` must hold (its length comes from the id too).
fn content(id: ObjectId) -> Vec<u8> {
    let mut r = Rng(u64::from_le_bytes(id.0[..8].try_into().unwrap()) * 31
        + u64::from_le_bytes(id.0[8..16].try_into().unwrap())
        + 7);
    let len = 1 + r.below(48 * 1024) as usize;
    (0..len).map(|_| r.next() as u8).collect()
}

fn checksum(data: &[u8]) -> [u8; 8] {
    // FNV-1a, 64 bit.
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h.to_le_bytes()
}

fn spawn_self(test: &str, envs: &[(&str, String)], stderr: Stdio) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        test,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .stdout(Stdio::piped())
    .stderr(stderr);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

// ------------------------------------------------------------------ kills

/// Child: random operations forever, until killed.
#[test]
#[ignore = "helper: runs only as a child process of the kill test"]
fn chaos_child() {
    let Ok(socket) = std::env::var("FP_CHAOS_SOCKET") else {
        return;
    };
    let seed: u64 = std::env::var("FP_CHAOS_SEED").unwrap().parse().unwrap();
    let mut r = Rng(seed | 1);
    let c = Client::connect(Some(socket.as_ref())).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut held = Vec::new();
    let mut writing = Vec::new();
    let mut mine = Vec::new();
    loop {
        match r.below(8) {
            0 | 1 => {
                // create + write + seal (+ release), or leave it mid-write
                let id = ObjectId::random();
                let size = 1 + r.below(200_000);
                if let Ok(mut b) = c.create(id, size, b"meta") {
                    let n = b.as_mut_slice().len();
                    b.as_mut_slice()[..n / 2].fill(0x5a);
                    if r.below(4) == 0 {
                        writing.push(b); // never sealed
                    } else {
                        b.as_mut_slice()[n / 2..].fill(0xa5);
                        // The sealed buffer's drop releases the reference.
                        if c.seal(b).is_ok() {
                            mine.push(id);
                        }
                    }
                }
            }
            2 | 3 => {
                // take references and keep them
                if let Some(&id) = mine.get(r.below(mine.len().max(1) as u64) as usize) {
                    if let Ok(mut v) = c.get(&[id], Some(Duration::ZERO)) {
                        held.extend(v.pop().flatten());
                    }
                }
            }
            4 => {
                // block in a get of an object that never comes
                let _ = c.get(&[ObjectId::random()], Some(Duration::from_millis(20)));
            }
            5 => {
                if let Some(id) = mine.pop() {
                    let _ = c.delete(&[id]);
                }
            }
            6 => {
                if held.len() > 30 {
                    held.clear();
                }
            }
            _ => {
                let _ = c.put(ObjectId::random(), &[1u8; 3000], b"");
            }
        }
    }
}

#[test]
fn clients_killed_at_random_points_leave_exact_accounting() {
    let store = TestStore::start("64MiB");
    let c = store.client();
    let kills = 24 * scale();
    let mut r = Rng(0x9e3779b97f4a7c15);
    let mut alive: Vec<std::process::Child> = Vec::new();
    for k in 0..kills {
        let mut child = spawn_self(
            "chaos_child",
            &[
                ("FP_CHAOS_SOCKET", store.path().display().to_string()),
                ("FP_CHAOS_SEED", (k + 1).to_string()),
            ],
            Stdio::null(),
        );
        // Wait for READY half of the time; kill the rest wherever they are
        // (connecting, handshaking, or at work).
        if r.below(2) == 0 {
            let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
            let _ = lines.next();
        }
        alive.push(child);
        std::thread::sleep(Duration::from_millis(r.below(40)));
        // Keep up to three running at once; kill one at random.
        if alive.len() >= 3 || k + 1 == kills {
            while !alive.is_empty() {
                let i = r.below(alive.len() as u64) as usize;
                let mut ch = alive.swap_remove(i);
                ch.kill().unwrap(); // SIGKILL
                ch.wait().unwrap();
                if alive.len() < 2 && k + 1 != kills {
                    break;
                }
            }
        }
    }
    store.eventually("every killed client is gone", || {
        c.stats().unwrap().clients == 1
    });
    let s = c.stats().unwrap();
    let objects = c.list().unwrap();
    assert!(
        objects.iter().all(|o| o.sealed),
        "an unsealed object outlived its creator"
    );
    assert!(
        objects.iter().all(|o| o.ref_count == 0),
        "a dead client's reference survived"
    );
    let accounted: u64 = objects
        .iter()
        .map(|o| allocation_size(o.data_size, o.metadata_size))
        .sum();
    assert_eq!(
        s.used, accounted,
        "used bytes differ from what sealed objects account for"
    );
    println!(
        "kill test: {kills} clients killed with SIGKILL; {} objects left, {} bytes used = accounted",
        objects.len(),
        s.used
    );
}

// ------------------------------------------------------------------ stress

/// Child: `FP_STRESS_OPS` random operations as worker `FP_STRESS_WORKER` of
/// `FP_STRESS_WORKERS`, checking every object it reads; prints its counts.
#[test]
#[ignore = "helper: runs only as a child process of the stress tests"]
fn stress_worker() {
    let Ok(socket) = std::env::var("FP_STRESS_SOCKET") else {
        return;
    };
    let env = |k: &str| -> u64 { std::env::var(k).unwrap().parse().unwrap() };
    let (w, workers, ops) = (
        env("FP_STRESS_WORKER"),
        env("FP_STRESS_WORKERS"),
        env("FP_STRESS_OPS"),
    );
    let c = Client::connect(Some(socket.as_ref())).unwrap();
    let mut r = Rng((w + 1) * 0x2545f4914f6cdd1d);
    let (mut next, mut reads, mut verified, mut absent, mut full, mut corrupt) = (0, 0, 0, 0, 0, 0);
    // Objects oldest..next of this worker may be live; at most LIVE of them
    // (about 50 MB per worker), so the working set is bounded yet far larger
    // than the store.
    const LIVE: u64 = 2000;
    let (mut oldest, mut deleted) = (0u64, 0u64);
    for _ in 0..ops {
        let pick = r.below(10);
        if pick < 4 && next - oldest < LIVE {
            let id = object_id(w, next);
            next += 1;
            let data = content(id);
            match c.put(id, &data, &checksum(&data)) {
                Ok(()) => {}
                Err(ClientError::StoreFull(_)) => full += 1,
                Err(e) => panic!("put: {e}"),
            }
        } else if pick < 9 {
            // Read a recent object of any worker; it may not exist (yet).
            let ow = r.below(workers);
            let seq = oldest + r.below(next - oldest + 5);
            let id = object_id(ow, seq);
            reads += 1;
            match c.get(&[id], Some(Duration::ZERO)) {
                Ok(mut v) => match v.remove(0) {
                    None => absent += 1,
                    Some(b) => {
                        let want = content(id);
                        if b.data() != &want[..] || b.metadata() != checksum(&want) {
                            corrupt += 1;
                        } else {
                            verified += 1;
                        }
                    }
                },
                // Memory and spill directory both full: no room to restore.
                Err(ClientError::StoreFull(_)) => full += 1,
                Err(e) => panic!("get: {e}"),
            }
        } else if oldest < next {
            c.delete(&[object_id(w, oldest)]).unwrap();
            oldest += 1;
            deleted += 1;
        }
    }
    println!(
        "COUNTS {ops} {} {reads} {verified} {absent} {full} {corrupt} {deleted}",
        next
    );
}

struct Totals {
    ops: u64,
    puts: u64,
    reads: u64,
    verified: u64,
    absent: u64,
    full: u64,
    corrupt: u64,
}

fn stress(extra: &[&str]) -> (Totals, ferroplasma_client::Stats) {
    let store = TestStore::start_with("4MiB", extra);
    let workers = 4u64;
    let ops = 1500 * scale();
    let children: Vec<_> = (0..workers)
        .map(|w| {
            spawn_self(
                "stress_worker",
                &[
                    ("FP_STRESS_SOCKET", store.path().display().to_string()),
                    ("FP_STRESS_WORKER", w.to_string()),
                    ("FP_STRESS_WORKERS", workers.to_string()),
                    ("FP_STRESS_OPS", ops.to_string()),
                ],
                Stdio::piped(),
            )
        })
        .collect();
    let mut t = Totals {
        ops: 0,
        puts: 0,
        reads: 0,
        verified: 0,
        absent: 0,
        full: 0,
        corrupt: 0,
    };
    for ch in children {
        let out = ch.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find_map(|l| l.split_once("COUNTS ").map(|(_, rest)| rest))
            .unwrap_or_else(|| {
                let err = String::from_utf8_lossy(&out.stderr);
                panic!("a stress worker failed: {text}\n{err}")
            });
        let v: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        t.ops += v[0];
        t.puts += v[1];
        t.reads += v[2];
        t.verified += v[3];
        t.absent += v[4];
        t.full += v[5];
        t.corrupt += v[6];
    }
    let stats = store.client().stats().unwrap();
    (t, stats)
}

#[test]
fn stress_with_eviction_never_returns_wrong_bytes() {
    let (t, s) = stress(&[]);
    println!(
        "stress (eviction): {} operations by 4 processes, {} reads of which {} verified, {} absent, \
         {} puts refused as full, {} evictions, {} corrupt",
        t.ops, t.reads, t.verified, t.absent, t.full, s.evictions, t.corrupt
    );
    assert_eq!(t.corrupt, 0);
    assert!(
        s.evictions > 0,
        "the store never had to evict; make it smaller"
    );
    assert!(t.verified > 0);
}

#[test]
fn stress_with_spilling_never_returns_wrong_bytes() {
    let spill = temp_dir("stress-spill");
    let (t, s) = stress(&[
        "--spill-dir",
        spill.to_str().unwrap(),
        "--spill-limit",
        "1GiB",
    ]);
    println!(
        "stress (spilling): {} operations by 4 processes, {} reads of which {} verified, {} absent, \
         {} spills, {} restores, {} evictions, {} corrupt",
        t.ops, t.reads, t.verified, t.absent, s.spills, s.restores, s.evictions, t.corrupt
    );
    let _ = std::fs::remove_dir_all(&spill);
    assert_eq!(t.corrupt, 0);
    assert_eq!(s.evictions, 0, "with a spill directory nothing is dropped");
    assert_eq!(t.full, 0, "the spill directory had room");
    assert!(
        s.spills > 0 && s.restores > 0,
        "spilling did not run: {s:?}"
    );
    let _ = t.puts;
}

//! Fault injection for the cluster, in the spirit of Jepsen: three members;
//! a client on each doing random puts (of a small pool of shared ids, so
//! that creates race), gets (local and remote), deletes and aborted
//! creates, each recorded with its outcome; a nemesis that, at random and
//! reproducibly from a seed, SIGKILLs and restarts members, pauses them
//! (SIGSTOP) and resumes them, and (as root, members in network namespaces)
//! cuts and heals their links. A checker then runs over the history:
//!
//! Some puts use ids a member hands out (`Client::new_id`), which later
//! gets of every client also ask for.
//!
//! - no id is sealed with two different contents (unless it was deleted,
//!   or its creator was hit by a fault, in between);
//! - every get that returned bytes returned the bytes of a put of that id;
//! - no handed id is refused as taken (`ObjectExists`) or put twice;
//! - every get ended within its timeout (plus the peer timeout), unless a
//!   fault hit its own member meanwhile;
//! - `ObjectLost` only for objects whose creator was hit by a fault;
//! - after the faults heal, every store's used bytes equal its objects'.
//!
//! `FP_CHAOS_SEED` (default 1) and `FP_CHAOS_SECONDS` (default 40) set the
//! run; `FP_CHAOS_FAULTS` the faults: 0 (default) kills and restarts, 1
//! also pauses, 2 also link cuts (as root). `make chaos SEED=... MINUTES=...`
//! runs a long one with all three. The test prints the history's counts and
//! the seed. `make test` runs it with kills only (pauses and cuts need
//! root and minutes: `make chaos`; figures in docs/reliability.md).

mod common;

use common::{Namespaces, TestStore};
use ferroplasma_client::{Client, ClientError, DeleteStatus, MemberHealth, ObjectId};
use ferroplasma_protocol::layout::allocation_size;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TOKEN: &str = "nemesis-token";
const MEMBERS: usize = 3;
const POOL: u64 = 64;
/// Clients per member.
const CLIENTS: usize = 2;
const PEER_TIMEOUT: Duration = Duration::from_secs(1);

/// xorshift64*: reproducible from the seed.
#[derive(Clone)]
struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn pool_id(run: u64, k: u64) -> ObjectId {
    let mut b = [0u8; 20];
    b[..8].copy_from_slice(&k.to_le_bytes());
    b[8..16].copy_from_slice(&run.to_le_bytes());
    b[16..].copy_from_slice(b"nmss");
    ObjectId(b)
}

/// FNV-1a.
fn checksum(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The bytes a put writes: different for every put.
fn payload(rng: &mut Rng) -> Vec<u8> {
    let len = 1 + rng.below(32 * 1024) as usize;
    (0..len).map(|_| rng.next() as u8).collect()
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Ok,
    Exists,
    Bytes(u64),
    Missing,
    Lost,
    Deleted(DeleteStatus),
    /// The outcome is unknown (the member died or the call failed).
    Failed(String),
}

#[derive(Debug, Clone)]
enum Op {
    Put {
        sum: u64,
    },
    /// A put with an id the member handed out (`Client::new_id`).
    PutNew {
        sum: u64,
    },
    Get {
        timeout: Duration,
    },
    Delete,
    Abort,
}

#[derive(Debug, Clone)]
struct Event {
    member: usize,
    id: ObjectId,
    op: Op,
    start: Instant,
    end: Instant,
    outcome: Outcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum FaultKind {
    Kill,
    Pause,
    Cut,
}

#[derive(Debug, Clone)]
struct Fault {
    kind: FaultKind,
    member: usize,
    start: Instant,
    end: Instant,
}

struct Slot {
    addr: String,
    netns: Option<String>,
    store: Mutex<Option<TestStore>>,
    socket: Mutex<std::path::PathBuf>,
}

struct Cluster {
    slots: Vec<Slot>,
    net: Option<Namespaces>,
}

fn start(netns: Option<&str>, addr: &str, peers: &[String]) -> TestStore {
    let joined = peers.join(",");
    let mut args = vec![
        "--cluster-listen",
        addr,
        "--cluster-token",
        TOKEN,
        "--heartbeat-interval",
        "100ms",
        "--peer-timeout",
        "1s",
    ];
    if !peers.is_empty() {
        args.extend(["--peers", &joined]);
    }
    TestStore::start_in(netns, "256MiB", &args)
}

fn this_addr(store: &TestStore) -> String {
    let st = store.client().cluster_status().unwrap();
    st.members
        .iter()
        .find(|m| m.health == MemberHealth::ThisMember as i32)
        .unwrap()
        .addr
        .clone()
}

impl Cluster {
    fn start() -> Self {
        let net = Namespaces::create(MEMBERS);
        let mut slots: Vec<Slot> = Vec::new();
        for i in 0..MEMBERS {
            let netns = net.as_ref().map(|n| n.names[i].clone());
            let addr = net
                .as_ref()
                .map_or("127.0.0.1:0".to_string(), |n| n.addr(i));
            let peers: Vec<String> = slots.iter().map(|s| s.addr.clone()).collect();
            let store = start(netns.as_deref(), &addr, &peers);
            let addr = this_addr(&store);
            slots.push(Slot {
                addr,
                netns,
                socket: Mutex::new(store.socket.clone()),
                store: Mutex::new(Some(store)),
            });
        }
        let c = Cluster { slots, net };
        c.wait_all_alive(Duration::from_secs(20));
        c
    }

    fn client(&self, i: usize) -> Option<Client> {
        let socket = self.slots[i].socket.lock().unwrap().clone();
        Client::connect(Some(&socket)).ok()
    }

    fn pid(&self, i: usize) -> Option<u32> {
        let g = self.slots[i].store.lock().unwrap();
        g.as_ref()
            .and_then(|s| s.child.as_ref())
            .map(std::process::Child::id)
    }

    fn signal(&self, i: usize, sig: &str) {
        if let Some(pid) = self.pid(i) {
            let _ = std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status();
        }
    }

    fn kill(&self, i: usize) {
        let old = self.slots[i].store.lock().unwrap().take();
        drop(old); // SIGKILL, wait, remove its directory
    }

    fn restart(&self, i: usize) {
        let peers: Vec<String> = (0..MEMBERS)
            .filter(|&j| j != i)
            .map(|j| self.slots[j].addr.clone())
            .collect();
        let s = start(self.slots[i].netns.as_deref(), &self.slots[i].addr, &peers);
        *self.slots[i].socket.lock().unwrap() = s.socket.clone();
        *self.slots[i].store.lock().unwrap() = Some(s);
    }

    fn wait_all_alive(&self, within: Duration) {
        let t = Instant::now();
        loop {
            let ok = (0..MEMBERS).all(|i| {
                self.client(i)
                    .and_then(|c| c.cluster_status().ok())
                    .is_some_and(|st| {
                        st.members
                            .iter()
                            .filter(|m| {
                                m.health == MemberHealth::Alive as i32
                                    || m.health == MemberHealth::ThisMember as i32
                            })
                            .count()
                            == MEMBERS
                    })
            });
            if ok {
                return;
            }
            assert!(t.elapsed() < within, "members did not all see each other");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// One client's random workload on member `m` until `stop`.
fn workload(
    cluster: &Cluster,
    m: usize,
    run: u64,
    mut rng: Rng,
    stop: &AtomicBool,
    history: &Mutex<Vec<Event>>,
    handed: &Mutex<Vec<ObjectId>>,
) {
    let mut client: Option<Client> = None;
    while !stop.load(Ordering::Relaxed) {
        let Some(c) = client.as_ref() else {
            client = cluster.client(m);
            if client.is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            continue;
        };
        let mut id = pool_id(run, rng.below(POOL));
        let roll = rng.below(100);
        if (35..80).contains(&roll) && rng.below(4) == 0 {
            // A get of an id some member handed out.
            let h = handed.lock().unwrap();
            if !h.is_empty() {
                id = h[rng.below(h.len() as u64) as usize];
            }
        }
        let start = Instant::now();
        let (op, outcome) = if roll < 10 {
            let data = payload(&mut rng);
            let sum = checksum(&data);
            let outcome = match c.new_id() {
                Ok(new) => {
                    id = new;
                    let mut h = handed.lock().unwrap();
                    if h.len() >= 256 {
                        let at = rng.below(256) as usize;
                        h[at] = new;
                    } else {
                        h.push(new);
                    }
                    drop(h);
                    match c.put(id, &data, b"") {
                        Ok(()) => Outcome::Ok,
                        Err(ClientError::ObjectExists { .. }) => Outcome::Exists,
                        Err(e) => Outcome::Failed(e.to_string()),
                    }
                }
                Err(e) => Outcome::Failed(e.to_string()),
            };
            (Op::PutNew { sum }, outcome)
        } else if roll < 35 {
            let data = payload(&mut rng);
            let sum = checksum(&data);
            let outcome = match c.put(id, &data, b"") {
                Ok(()) => Outcome::Ok,
                Err(ClientError::ObjectExists { .. }) => Outcome::Exists,
                Err(e) => Outcome::Failed(e.to_string()),
            };
            (Op::Put { sum }, outcome)
        } else if roll < 80 {
            let timeout = Duration::from_millis(100 + rng.below(900));
            let outcome = match c.get(&[id], Some(timeout)) {
                Ok(mut v) => match v.remove(0) {
                    Some(b) => Outcome::Bytes(checksum(b.data())),
                    None => Outcome::Missing,
                },
                Err(ClientError::ObjectLost { .. }) => Outcome::Lost,
                Err(e) => Outcome::Failed(e.to_string()),
            };
            (Op::Get { timeout }, outcome)
        } else if roll < 92 {
            let outcome = match c.delete(&[id]) {
                Ok(s) => Outcome::Deleted(s[0]),
                Err(e) => Outcome::Failed(e.to_string()),
            };
            (Op::Delete, outcome)
        } else {
            let outcome = match c.create(id, 1 + rng.below(4096), b"") {
                Ok(buf) => match c.abort(buf) {
                    Ok(()) => Outcome::Ok,
                    Err(e) => Outcome::Failed(e.to_string()),
                },
                Err(ClientError::ObjectExists { .. }) => Outcome::Exists,
                Err(e) => Outcome::Failed(e.to_string()),
            };
            (Op::Abort, outcome)
        };
        let failed = matches!(outcome, Outcome::Failed(_));
        history.lock().unwrap().push(Event {
            member: m,
            id,
            op,
            start,
            end: Instant::now(),
            outcome,
        });
        if failed {
            client = None; // reconnect (the member may have restarted)
        }
    }
}

/// The nemesis: a fault every 1–3 s, healed after 0.5–3 s.
fn nemesis(cluster: &Cluster, mut rng: Rng, until: Instant, faults: &Mutex<Vec<Fault>>) {
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1000 + rng.below(2000)));
        let member = rng.below(MEMBERS as u64) as usize;
        // FP_CHAOS_FAULTS: 0 kills only, 1 kills and pauses, 2 and link cuts.
        let level = env_u64("FP_CHAOS_FAULTS", 0);
        let kinds: &[FaultKind] = match level {
            0 => &[FaultKind::Kill],
            1 => &[FaultKind::Kill, FaultKind::Pause],
            _ if cluster.net.is_some() => &[FaultKind::Kill, FaultKind::Pause, FaultKind::Cut],
            _ => &[FaultKind::Kill, FaultKind::Pause],
        };
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let hold = Duration::from_millis(500 + rng.below(2500));
        let start = Instant::now();
        match kind {
            FaultKind::Kill => {
                cluster.kill(member);
                std::thread::sleep(hold);
                cluster.restart(member);
            }
            FaultKind::Pause => {
                cluster.signal(member, "-STOP");
                std::thread::sleep(hold);
                cluster.signal(member, "-CONT");
            }
            FaultKind::Cut => {
                let net = cluster.net.as_ref().expect("namespaces");
                net.link(member, false);
                std::thread::sleep(hold);
                net.link(member, true);
            }
        }
        faults.lock().unwrap().push(Fault {
            kind,
            member,
            start,
            end: Instant::now(),
        });
    }
}

/// What the checker found.
#[derive(Debug, Default)]
struct Verdict {
    violations: Vec<String>,
    /// The ids concerned, in order.
    ids: Vec<ObjectId>,
}

fn check(history: &[Event], faults: &[Fault]) -> Verdict {
    let mut v = Verdict::default();
    let hit = |member: usize, from: Instant, to: Instant| {
        faults
            .iter()
            .any(|f| f.member == member && f.start <= to && f.end >= from)
    };
    let mut by_id: HashMap<ObjectId, Vec<&Event>> = HashMap::new();
    for e in history {
        by_id.entry(e.id).or_default().push(e);
    }
    for (id, events) in &by_id {
        let puts: Vec<&&Event> = events
            .iter()
            .filter(|e| {
                matches!(e.op, Op::Put { .. } | Op::PutNew { .. }) && e.outcome == Outcome::Ok
            })
            .collect();
        let sums = |ok_only: bool| -> Vec<u64> {
            events
                .iter()
                .filter(|e| {
                    e.outcome == Outcome::Ok
                        || (!ok_only && matches!(e.outcome, Outcome::Failed(_)))
                })
                .filter_map(|e| match e.op {
                    Op::Put { sum } | Op::PutNew { sum } => Some(sum),
                    _ => None,
                })
                .collect()
        };
        let written = sums(false);
        // One id, one object: two successful puts need a delete of the id
        // or a fault on the first's member in between.
        for (i, p) in puts.iter().enumerate() {
            for q in &puts[i + 1..] {
                let (a, b) = if p.end <= q.end { (p, q) } else { (q, p) };
                let deleted = events.iter().any(|d| {
                    matches!(d.op, Op::Delete)
                        && matches!(d.outcome, Outcome::Deleted(_) | Outcome::Failed(_))
                        && d.end >= a.start
                        && d.start <= b.end
                });
                let faulted = hit(a.member, a.start, b.end);
                if !deleted && !faulted {
                    v.ids.push(*id);
                    v.violations.push(format!(
                        "{id}: sealed twice with different contents (members {} and {}) with no delete or fault in between",
                        a.member, b.member
                    ));
                }
            }
        }
        let new_puts = events
            .iter()
            .filter(|e| matches!(e.op, Op::PutNew { .. }))
            .count();
        if new_puts > 1 {
            v.ids.push(*id);
            v.violations
                .push(format!("{id}: a handed id was handed out {new_puts} times"));
        }
        for e in events {
            if matches!(e.op, Op::PutNew { .. }) && e.outcome == Outcome::Exists {
                v.ids.push(*id);
                v.violations.push(format!(
                    "{id}: a put with an id member {} handed out found it taken",
                    e.member
                ));
            }
        }
        for e in events {
            let Op::Get { timeout } = e.op else { continue };
            match &e.outcome {
                Outcome::Bytes(sum) if !written.contains(sum) => {
                    v.ids.push(*id);
                    v.violations.push(format!(
                        "{id}: a get on member {} returned bytes no put wrote",
                        e.member
                    ))
                }
                Outcome::Lost => {
                    // Lost is right only if the object's creator (a put
                    // not deleted since) was hit by a fault.
                    let deleted_between = |p: &Event| {
                        events.iter().any(|d| {
                            matches!(
                                d.outcome,
                                Outcome::Deleted(DeleteStatus::Deleted | DeleteStatus::Deferred)
                            ) && d.end >= p.start
                                && d.start <= e.start
                        })
                    };
                    // (A getter cut off or paused sees everyone else die.)
                    let healthy_creator = !hit(e.member, e.start - PEER_TIMEOUT * 3, e.end)
                        && puts.iter().any(|p| {
                            p.end <= e.start
                                && !deleted_between(p)
                                && !hit(p.member, p.start, e.end)
                        });
                    if healthy_creator {
                        v.ids.push(*id);
                        v.violations.push(format!(
                            "{id}: ObjectLost on member {} while its creator was never hit",
                            e.member
                        ));
                    }
                }
                _ => {}
            }
            let took = e.end - e.start;
            if took > timeout + PEER_TIMEOUT * 3 && !hit(e.member, e.start, e.end) {
                v.ids.push(*id);
                v.violations.push(format!(
                    "{id}: a get on member {} with timeout {timeout:?} took {took:?}",
                    e.member
                ));
            }
        }
    }
    v
}

/// The history of one id and the faults, in time order, for a report.
fn story(id: ObjectId, history: &[Event], faults: &[Fault], t0: Instant) -> String {
    let ms = |t: Instant| t.duration_since(t0).as_millis();
    let mut lines: Vec<(u128, String)> = history
        .iter()
        .filter(|e| e.id == id)
        .map(|e| {
            (
                ms(e.start),
                format!(
                    "{:>6}-{:>6} ms member {} {:?} -> {:?}",
                    ms(e.start),
                    ms(e.end),
                    e.member,
                    e.op,
                    e.outcome
                ),
            )
        })
        .collect();
    lines.extend(faults.iter().map(|f| {
        (
            ms(f.start),
            format!(
                "{:>6}-{:>6} ms FAULT {:?} member {}",
                ms(f.start),
                ms(f.end),
                f.kind,
                f.member
            ),
        )
    }));
    lines.sort();
    lines
        .into_iter()
        .map(|(_, l)| l)
        .collect::<Vec<_>>()
        .join("\n")
}

fn counts(history: &[Event], faults: &[Fault]) -> String {
    let mut ops: BTreeMap<String, usize> = BTreeMap::new();
    for e in history {
        let op = match e.op {
            Op::Put { .. } => "put",
            Op::PutNew { .. } => "put (handed id)",
            Op::Get { .. } => "get",
            Op::Delete => "delete",
            Op::Abort => "abort",
        };
        let out = match &e.outcome {
            Outcome::Ok => "ok",
            Outcome::Exists => "exists",
            Outcome::Bytes(_) => "bytes",
            Outcome::Missing => "missing",
            Outcome::Lost => "lost",
            Outcome::Deleted(_) => "answered",
            Outcome::Failed(_) => "failed",
        };
        *ops.entry(format!("{op}:{out}")).or_default() += 1;
    }
    let mut fk: BTreeMap<String, usize> = BTreeMap::new();
    for f in faults {
        *fk.entry(format!("{:?}", f.kind)).or_default() += 1;
    }
    format!("{} operations {ops:?}; faults {fk:?}", history.len())
}

#[test]
fn the_cluster_keeps_its_invariants_under_kills_pauses_and_cuts() {
    let seed = env_u64("FP_CHAOS_SEED", 1);
    let seconds = env_u64("FP_CHAOS_SECONDS", 40);
    let cluster = Arc::new(Cluster::start());
    let run = Rng::new(seed ^ std::process::id() as u64).next();
    let history = Arc::new(Mutex::new(Vec::new()));
    let faults = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let handed = Arc::new(Mutex::new(Vec::new()));
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(seconds);
    let workers: Vec<_> = (0..MEMBERS * CLIENTS)
        .map(|w| {
            let (c, h, s) = (cluster.clone(), history.clone(), stop.clone());
            let handed = handed.clone();
            let rng = Rng::new(seed.wrapping_add(w as u64 + 1));
            std::thread::spawn(move || workload(&c, w % MEMBERS, run, rng, &s, &h, &handed))
        })
        .collect();
    nemesis(&cluster, Rng::new(seed), until, &faults);
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let history = history.lock().unwrap().clone();
    let faults = faults.lock().unwrap().clone();
    let summary = counts(&history, &faults);
    eprintln!("nemesis (seed {seed}, {seconds} s): {summary}");
    let verdict = check(&history, &faults);
    // Healed: every member sees every other, and each store's used bytes
    // equal what its objects account for.
    cluster.wait_all_alive(Duration::from_secs(30));
    for i in 0..MEMBERS {
        let c = cluster.client(i).expect("member up");
        let t = Instant::now();
        loop {
            let s = c.stats().unwrap();
            let accounted: u64 = c
                .list()
                .unwrap()
                .iter()
                .filter(|o| !o.spilled)
                .map(|o| allocation_size(o.data_size, o.metadata_size))
                .sum();
            if s.used == accounted {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "member {i}: {} bytes used, objects account for {accounted}",
                s.used
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    assert!(
        verdict.violations.is_empty(),
        "seed {seed}: {} violations (first 20):\n{}\n{summary}\nthe first one's history:\n{}",
        verdict.violations.len(),
        verdict.violations[..verdict.violations.len().min(20)].join("\n"),
        story(verdict.ids[0], &history, &faults, t0)
    );
}

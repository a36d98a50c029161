//! `ferroplasma-bench`: per-operation latency of a real store, side by side
//! with a 1-byte Unix-socket round trip measured in the same run, as ratios.
//!
//! The store and the echo peer are separate processes, so both figures pay
//! the same cross-process wake-ups. Targets are checked and printed here,
//! never in tests.

use anyhow::{bail, Context};
use clap::Parser;
use ferroplasma_client::{Client, ObjectId};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Measure the store's per-operation latency against a socket round trip.
#[derive(Debug, Parser)]
struct Args {
    /// Iterations per single-object operation.
    #[arg(long, default_value_t = 20_000)]
    iters: usize,
    /// Iterations of the 1000-object batched get.
    #[arg(long, default_value_t = 300)]
    batch_iters: usize,
    /// The `ferroplasma` binary to start (default: next to this one).
    #[arg(long)]
    store_bin: Option<PathBuf>,
    /// Measure the store already running on this socket instead of starting one.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Print the results as JSON too.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Internal: run as the echo peer on this socket.
    #[arg(long, hide = true)]
    echo_server: Option<PathBuf>,
}

struct Row {
    name: &'static str,
    samples: Vec<Duration>,
    /// Round trips measured in the rounds interleaved with this operation.
    rt: Vec<Duration>,
    target_rt: Option<f64>,
    target_abs: Option<Duration>,
}

fn pct(v: &[Duration], p: f64) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    s[((s.len() - 1) as f64 * p).round() as usize]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(p) = args.echo_server {
        return echo_server(p);
    }
    let dir = std::env::temp_dir().join(format!("fp-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run(&args, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run(args: &Args, dir: &std::path::Path) -> anyhow::Result<()> {
    let store_bin = match &args.store_bin {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("ferroplasma"),
    };
    if args.socket.is_none() && !store_bin.exists() {
        bail!(
            "{} not found; build it (cargo build --release) or pass --store-bin",
            store_bin.display()
        );
    }
    let (socket, _store) = match &args.socket {
        Some(s) => (s.clone(), None),
        None => {
            let socket = dir.join("store.sock");
            let child = Command::new(&store_bin)
                .args(["store", "--memory", "1GiB", "--prefault", "--socket"])
                .arg(&socket)
                .env("FERROPLASMA_LOG", "warn")
                .spawn()
                .context("starting the store")?;
            (socket, Some(Guard(child)))
        }
    };
    let echo_sock = dir.join("echo.sock");
    let _echo = Guard(
        Command::new(std::env::current_exe()?)
            .arg("--echo-server")
            .arg(&echo_sock)
            .stdout(Stdio::null())
            .spawn()?,
    );
    let client = wait_connect(&socket)?;
    let echo = wait_echo(&echo_sock)?;

    let n = args.iters;
    let mut b = Bench {
        echo,
        rt: Vec::new(),
        rounds: 10,
        rows: Vec::new(),
    };
    let payload = vec![7u8; 1024];

    b.measure(
        "create+write+seal+release 1 KiB",
        n,
        Some(2.5),
        None,
        |out| {
            let id = ObjectId::random();
            let t = Instant::now();
            let mut buf = client.create(id, 1024, b"")?;
            buf.as_mut_slice().copy_from_slice(&payload);
            drop(client.seal(buf)?); // the sealed buffer's drop releases it
            out.push(t.elapsed());
            client.delete(&[id])?;
            Ok(())
        },
    )?;
    b.measure("create_and_seal 1 KiB (inline)", n, None, None, |out| {
        let id = ObjectId::random();
        let t = Instant::now();
        client.create_and_seal(id, &payload, b"")?;
        out.push(t.elapsed());
        client.delete(&[id])?;
        Ok(())
    })?;
    let id = ObjectId::random();
    client.put(id, &payload, b"")?;
    // Issue 20's goals: a get and a release of a sealed local object take
    // no round trip (the shared object table): ≤ 0.5 µs and ≤ 1 µs.
    b.measure(
        "get 1 sealed object",
        n,
        None,
        Some(Duration::from_nanos(500)),
        |out| {
            let t = Instant::now();
            let got = client.get(&[id], None)?;
            out.push(t.elapsed());
            drop(got);
            Ok(())
        },
    )?;
    b.measure(
        "release (buffer drop; no reply)",
        n,
        None,
        Some(Duration::from_micros(1)),
        |out| {
            let got = client.get(&[id], None)?;
            let t = Instant::now();
            drop(got);
            out.push(t.elapsed());
            Ok(())
        },
    )?;
    b.measure("contains", n, None, None, |out| {
        let t = Instant::now();
        client.contains(&[id])?;
        out.push(t.elapsed());
        Ok(())
    })?;
    let ids: Vec<ObjectId> = (0..1000).map(|_| ObjectId::random()).collect();
    for i in &ids {
        client.create_and_seal(*i, &payload[..64], b"")?;
    }
    let target = Some(Duration::from_micros(500));
    b.measure(
        "batched get of 1000 objects",
        args.batch_iters,
        None,
        target,
        |out| {
            let t = Instant::now();
            let got = client.get(&ids, None)?;
            out.push(t.elapsed());
            client.release_buffers(got.into_iter().flatten())?;
            Ok(())
        },
    )?;
    b.measure(
        "batched release of 1000 objects",
        args.batch_iters,
        None,
        None,
        |out| {
            let got = client.get(&ids, None)?;
            let t = Instant::now();
            client.release_buffers(got.into_iter().flatten())?;
            out.push(t.elapsed());
            Ok(())
        },
    )?;
    // Ids this store does not have (a batch held on other members, or not
    // created yet): the client's table pass finds none of them, and one
    // request asks the store, which finds none either.
    let absent: Vec<ObjectId> = (0..1000).map(|_| ObjectId::random()).collect();
    b.measure(
        "batched get of 1000 absent ids (no wait)",
        args.batch_iters,
        None,
        None,
        |out| {
            let t = Instant::now();
            let got = client.get(&absent, Some(Duration::ZERO))?;
            out.push(t.elapsed());
            anyhow::ensure!(got.iter().all(Option::is_none), "an absent id was found");
            Ok(())
        },
    )?;
    let rt = Row {
        name: "1-byte Unix socket round trip",
        samples: b.rt.clone(),
        rt: b.rt,
        target_rt: None,
        target_abs: None,
    };
    let mut rows = vec![rt];
    rows.extend(b.rows);
    report(&rows, args.json.as_deref())
}

/// Runs each operation in rounds that alternate with blocks of socket round
/// trips, so that both figures see the same state of a noisy machine.
struct Bench {
    echo: UnixStream,
    rt: Vec<Duration>,
    rounds: usize,
    rows: Vec<Row>,
}

impl Bench {
    fn measure(
        &mut self,
        name: &'static str,
        n: usize,
        target_rt: Option<f64>,
        target_abs: Option<Duration>,
        mut op: impl FnMut(&mut Vec<Duration>) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let per_round = n.div_ceil(self.rounds).max(1);
        let mut samples = Vec::with_capacity(n);
        // Warm-up, not recorded.
        let mut sink = Vec::new();
        let mut rt = Vec::new();
        for _ in 0..per_round.min(100) {
            op(&mut sink)?;
        }
        for _ in 0..self.rounds {
            rt.extend(ping(&mut self.echo, per_round.clamp(200, 2000))?);
            for _ in 0..per_round {
                op(&mut samples)?;
            }
        }
        self.rt.extend_from_slice(&rt);
        self.rows.push(Row {
            name,
            samples,
            rt,
            target_rt,
            target_abs,
        });
        Ok(())
    }
}

fn report(rows: &[Row], json: Option<&std::path::Path>) -> anyhow::Result<()> {
    println!(
        "ferroplasma latency: store and echo peer in separate processes, {} cores; \
         operations interleaved with round trips",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "{:<36} {:>10} {:>10} {:>12}  target",
        "operation", "p50 µs", "p99 µs", "p50 / RT"
    );
    println!("(each ratio is to the round trips measured in the rounds interleaved with that row)");
    let mut ok_all = true;
    let mut out = Vec::new();
    for r in rows {
        let (p50, p99) = (pct(&r.samples, 0.5), pct(&r.samples, 0.99));
        let ratio = us(p50) / us(pct(&r.rt, 0.5));
        let verdict = match (r.target_rt, r.target_abs) {
            (Some(t), _) => {
                let ok = ratio <= t;
                ok_all &= ok;
                format!("≤ {t} RT: {}", if ok { "met" } else { "MISSED" })
            }
            (_, Some(t)) => {
                let ok = p50 <= t;
                ok_all &= ok;
                format!("≤ {} µs: {}", us(t), if ok { "met" } else { "MISSED" })
            }
            _ => String::new(),
        };
        println!(
            "{:<36} {:>10.1} {:>10.1} {:>12.2}  {}",
            r.name,
            us(p50),
            us(p99),
            ratio,
            verdict
        );
        out.push(format!(
            "{{\"op\":\"{}\",\"p50_us\":{:.3},\"p99_us\":{:.3},\"ratio_to_rt\":{:.4},\"n\":{}}}",
            r.name,
            us(p50),
            us(p99),
            ratio,
            r.samples.len()
        ));
    }
    println!(
        "{}",
        if ok_all {
            "all targets met"
        } else {
            "some targets missed"
        }
    );
    if let Some(p) = json {
        std::fs::write(p, format!("[{}]\n", out.join(",\n")))?;
    }
    Ok(())
}

fn ping(s: &mut UnixStream, n: usize) -> anyhow::Result<Vec<Duration>> {
    let mut b = [0u8; 1];
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&b)?;
        s.read_exact(&mut b)?;
        v.push(t.elapsed());
    }
    Ok(v)
}

fn echo_server(path: PathBuf) -> anyhow::Result<()> {
    let l = UnixListener::bind(&path)?;
    let (mut s, _) = l.accept()?;
    let mut b = [0u8; 1];
    while s.read_exact(&mut b).is_ok() {
        s.write_all(&b)?;
    }
    Ok(())
}

fn wait_connect(p: &std::path::Path) -> anyhow::Result<Client> {
    let t = Instant::now();
    loop {
        match Client::connect(Some(p)) {
            Ok(c) => return Ok(c),
            Err(e) if t.elapsed() > Duration::from_secs(30) => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn wait_echo(p: &std::path::Path) -> anyhow::Result<UnixStream> {
    let t = Instant::now();
    loop {
        match UnixStream::connect(p) {
            Ok(s) => return Ok(s),
            Err(e) if t.elapsed() > Duration::from_secs(10) => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

struct Guard(Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

//! `ferroplasma-bench-metrics`: does serving metrics slow the store? Two
//! stores in one run, one plain and one with `--metrics-listen` scraped
//! every `--scrape-ms` by a thread of this process; the same socket
//! operations (create_and_seal + delete of 1 KiB, a get the store answers)
//! on each, in interleaved rounds; p50 and p99 of both and their ratio.
//! A benchmark, not a test: it prints figures, it asserts nothing.

use anyhow::{bail, Context};
use clap::Parser;
use ferroplasma_client::{Client, ObjectId};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Latency of a store with and without its metrics endpoint scraped.
#[derive(Debug, Parser)]
struct Args {
    /// Operations per round and store.
    #[arg(long, default_value_t = 2_000)]
    iters: usize,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Milliseconds between scrapes of the metrics endpoint.
    #[arg(long, default_value_t = 100)]
    scrape_ms: u64,
    /// The `ferroplasma` binary (default: next to this one).
    #[arg(long)]
    store_bin: Option<PathBuf>,
}

struct Store {
    child: Child,
    client: Client,
    metrics: Option<String>,
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(bin: &Path, socket: &Path, metrics: bool) -> anyhow::Result<Store> {
    let mut cmd = Command::new(bin);
    cmd.args(["store", "--memory", "256MiB", "--socket"])
        .arg(socket);
    cmd.args(["--table-slots", "0"]); // every get is a request the store answers
    if metrics {
        cmd.args(["--metrics-listen", "127.0.0.1:0"]);
    }
    let mut child = cmd
        .env("FERROPLASMA_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .context("starting a store")?;
    let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let mut addr = None;
    for line in lines.by_ref() {
        let line = line?;
        if let Some(at) = line.find("metrics at http://") {
            let rest = &line[at + "metrics at http://".len()..];
            addr = rest.split('/').next().map(str::to_string);
        }
        if line.contains("ready") {
            break;
        }
    }
    // Keep draining its log so that it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    if metrics && addr.is_none() {
        bail!("the store did not say where its metrics are");
    }
    let client = Client::connect(Some(socket))?;
    Ok(Store {
        child,
        client,
        metrics: addr,
    })
}

fn scrape(addr: &str) -> anyhow::Result<usize> {
    let mut s = TcpStream::connect(addr)?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut body = Vec::new();
    s.read_to_end(&mut body)?;
    Ok(body.len())
}

fn round(c: &Client, n: usize, payload: &[u8], out: &mut Vec<Duration>) -> anyhow::Result<()> {
    for _ in 0..n {
        let id = ObjectId::random();
        let t = Instant::now();
        c.create_and_seal(id, payload, b"")?;
        let got = c.get(&[id], None)?;
        drop(got);
        c.delete(&[id])?;
        out.push(t.elapsed());
    }
    Ok(())
}

fn pct(v: &[Duration], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort();
    s[((s.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e6
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin = match args.store_bin {
        Some(b) => b,
        None => std::env::current_exe()?.with_file_name("ferroplasma"),
    };
    let dir = std::env::temp_dir().join(format!("fp-bench-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let plain = start(&bin, &dir.join("plain.sock"), false)?;
    let scraped = start(&bin, &dir.join("scraped.sock"), true)?;
    let addr = scraped.metrics.clone().expect("checked");
    let stop = Arc::new(AtomicBool::new(false));
    let scrapes = Arc::new(AtomicU64::new(0));
    let scrape_us = Arc::new(AtomicU64::new(0));
    let scraper = {
        let (stop, scrapes, scrape_us) = (stop.clone(), scrapes.clone(), scrape_us.clone());
        let every = Duration::from_millis(args.scrape_ms);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                if scrape(&addr).is_ok() {
                    scrapes.fetch_add(1, Ordering::Relaxed);
                    scrape_us.fetch_add(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                }
                std::thread::sleep(every);
            }
        })
    };
    let payload = vec![7u8; 1024];
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for r in 0..args.rounds {
        // Alternate which store goes first.
        if r % 2 == 0 {
            round(&plain.client, args.iters, &payload, &mut a)?;
            round(&scraped.client, args.iters, &payload, &mut b)?;
        } else {
            round(&scraped.client, args.iters, &payload, &mut b)?;
            round(&plain.client, args.iters, &payload, &mut a)?;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = scraper.join();
    let n = scrapes.load(Ordering::Relaxed).max(1);
    println!(
        "create_and_seal + get + delete of 1 KiB, {} x {} per store, interleaved",
        args.rounds, args.iters
    );
    println!("{:<34}{:>10}{:>10}", "", "p50 µs", "p99 µs");
    println!(
        "{:<34}{:>10.1}{:>10.1}",
        "store",
        pct(&a, 0.5),
        pct(&a, 0.99)
    );
    println!(
        "{:<34}{:>10.1}{:>10.1}",
        format!("store scraped every {} ms", args.scrape_ms),
        pct(&b, 0.5),
        pct(&b, 0.99)
    );
    println!(
        "ratio (scraped / plain): p50 {:.3}, p99 {:.3}; {} scrapes, {:.0} µs each",
        pct(&b, 0.5) / pct(&a, 0.5),
        pct(&b, 0.99) / pct(&a, 0.99),
        n,
        scrape_us.load(Ordering::Relaxed) as f64 / n as f64
    );
    drop((plain, scraped));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

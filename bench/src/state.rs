//! `ferroplasma-bench-state`: what the store's state machine costs per
//! object, alone (no socket, no shared memory, no cluster): a get of an id
//! it does not have, the watch a waiting get then leaves, an object created
//! sealed (as a pulled copy lands: one client waits for it), and a get of
//! a sealed object. A remote batched get pays each of these once per
//! object, so their sum bounds how fast one can land (docs/benchmarks.md).
//! Batches of 1000 ids; the best batch of `--rounds` is reported, as the
//! least disturbed by the rest of the machine.
//!
//! With `--fill N` the store first holds N sealed objects of 64 bytes
//! (issue 38, a store of millions): it prints the mean cost of a put (a
//! create sealed) at each tenth of the way, the slowest single put (a
//! table growing), and the process's private memory per object
//! (`RssAnon` of /proc/self/status, the ids aside); then it deletes them
//! all and prints what memory is left; the figures above are then measured
//! with the N objects in the store.

use clap::Parser;
use ferroplasma_client::ObjectId;
use ferroplasma_store::Store;
use std::time::Instant;

/// The store's state machine alone, per object.
#[derive(Debug, Parser)]
struct Args {
    /// Batches of 1000 ids measured (the best is reported).
    #[arg(long, default_value_t = 200)]
    rounds: usize,
    /// Objects (64 bytes, sealed) in the store while measuring.
    #[arg(long, default_value_t = 0)]
    fill: usize,
}

/// This process's private resident memory, bytes.
fn rss_anon() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Fills `s` with `n` objects of 64 bytes, printing what a put costs on
/// the way and the memory they take; then deletes a copy's worth to show
/// the memory comes back, and fills again. Returns the ids.
fn fill(s: &mut Store, n: usize) -> Vec<ObjectId> {
    let ids: Vec<ObjectId> = (0..n).map(|_| ObjectId::random()).collect();
    let put = |s: &mut Store, ids: &[ObjectId]| {
        let tenth = n.div_ceil(10).max(1);
        let mut worst = (0f64, 0usize);
        let mut marks = Vec::new();
        let start = Instant::now();
        for (chunk_no, chunk) in ids.chunks(tenth).enumerate() {
            let t = Instant::now();
            for (k, id) in chunk.iter().enumerate() {
                let one = Instant::now();
                let fx = s.create_sealed(*id, 64, 0, 0, |_| {});
                let _effects = std::hint::black_box(fx.expect("room for every object"));
                let took = one.elapsed().as_secs_f64();
                if took > worst.0 {
                    worst = (took, chunk_no * tenth + k);
                }
            }
            marks.push(t.elapsed().as_secs_f64() / chunk.len() as f64);
        }
        (start.elapsed().as_secs_f64(), marks, worst)
    };
    let before = rss_anon();
    let (took, marks, worst) = put(s, &ids);
    let full = rss_anon();
    println!(
        "{n} puts (create sealed, 64 B) in {took:.1} s; mean ns per put by tenth of the fill:"
    );
    let shown: Vec<String> = marks.iter().map(|m| format!("{:.0}", m * 1e9)).collect();
    println!("  {}", shown.join(" "));
    println!(
        "  slowest put: {:.2} ms (put {} of {n})",
        worst.0 * 1e3,
        worst.1 + 1
    );
    println!(
        "private memory: {:.1} B per object ({:.1} MiB for {n})",
        (full.saturating_sub(before)) as f64 / n as f64,
        (full.saturating_sub(before)) as f64 / 1048576.0
    );
    for id in &ids {
        let _ = s.delete(*id);
    }
    let empty = rss_anon();
    println!(
        "after deleting them all: {:.1} MiB more than before the puts",
        empty.saturating_sub(before) as f64 / 1048576.0
    );
    let _ = put(s, &ids);
    ids
}

fn main() {
    let args = Args::parse();
    let mut s = Store::new((1 << 30) + 64 * args.fill as u64);
    let _held = fill(&mut s, args.fill);
    let (waiter, reader) = (s.connect(), s.connect());
    let names = [
        "get of an absent id",
        "watch + exists (a get that waits)",
        "create sealed (one waiter woken)",
        "get of a sealed object",
    ];
    let mut best = [f64::MAX; 4];
    for _ in 0..args.rounds {
        let ids: Vec<ObjectId> = (0..1000).map(|_| ObjectId::random()).collect();
        let mut took = [0f64; 4];
        let t = Instant::now();
        for id in &ids {
            std::hint::black_box(s.get(waiter, *id));
        }
        took[0] = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for id in &ids {
            s.watch(waiter, *id);
            std::hint::black_box(s.exists(id));
        }
        took[1] = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for id in &ids {
            let fx = s.create_sealed(*id, 1000, 0, 0, |_| {});
            let _effects = std::hint::black_box(fx.expect("room for 1000 objects of 1 kB"));
        }
        took[2] = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for id in &ids {
            std::hint::black_box(s.get(reader, *id));
        }
        took[3] = t.elapsed().as_secs_f64();
        for id in &ids {
            let _ = s.release(reader, *id);
            let _ = s.delete(*id);
        }
        for (b, t) in best.iter_mut().zip(took) {
            *b = b.min(t);
        }
    }
    println!(
        "the store's state machine, per object (best of {} batches of 1000, {} objects held):",
        args.rounds, args.fill
    );
    for (name, b) in names.iter().zip(best) {
        println!("  {name:<36} {:>6.0} ns", b * 1e6);
    }
}

//! `ferroplasma-bench-state`: what the store's state machine costs per
//! object, alone (no socket, no shared memory, no cluster): a get of an id
//! it does not have, the watch a waiting get then leaves, an object created
//! sealed (as a pulled copy lands: one client waits for it), and a get of
//! a sealed object. A remote batched get pays each of these once per
//! object, so their sum bounds how fast one can land (docs/benchmarks.md).
//! Batches of 1000 ids; the best batch of `--rounds` is reported, as the
//! least disturbed by the rest of the machine.

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
}

fn main() {
    let args = Args::parse();
    let mut s = Store::new(1 << 30);
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
        "the store's state machine, per object (best of {} batches of 1000):",
        args.rounds
    );
    for (name, b) in names.iter().zip(best) {
        println!("  {name:<36} {:>6.0} ns", b * 1e6);
    }
}

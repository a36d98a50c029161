//! `ferroplasma-bench-calls SOCKET`: the per-call cost of the Rust client,
//! the same measures in every language (bench/calls.py runs it, beside the
//! C, C++, Go, Java and Python clients and Plasma's C++ client): a get of
//! one sealed 64-byte object and its release, a contains, a create, one
//! byte written and a seal (creator's reference given back), each the
//! median of 200 blocks of 100 calls; and a batched get of 1,000 objects
//! with their release, the median of 50. Prints one JSON line:
//! `{"get_ns":..,"contains_ns":..,"create_seal_ns":..,"batch_us":..}`.

use anyhow::{Context, Result};
use ferroplasma_client::{Client, ObjectId};
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const BLOCKS: usize = 200;
const PER_BLOCK: usize = 100;
const BATCH: usize = 1000;
const BATCH_REPS: usize = 50;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median over blocks of `PER_BLOCK` calls of `op`, in ns per call.
fn per_call(mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut t = Vec::with_capacity(BLOCKS);
    for _ in 0..BLOCKS {
        let t0 = Instant::now();
        for _ in 0..PER_BLOCK {
            op()?;
        }
        t.push(t0.elapsed().as_nanos() as f64 / PER_BLOCK as f64);
    }
    Ok(median(t))
}

fn main() -> Result<()> {
    let socket = PathBuf::from(
        std::env::args()
            .nth(1)
            .context("usage: ferroplasma-bench-calls SOCKET")?,
    );
    let c = Client::connect(Some(&socket))?;
    let payload = [1u8; 64];
    let single = ObjectId::random();
    c.put(single, &payload, &[])?;
    let batch: Vec<ObjectId> = (0..BATCH).map(|_| ObjectId::random()).collect();
    for id in &batch {
        c.put(*id, &payload, &[])?;
    }
    let zero = Some(Duration::ZERO);

    let get_ns = per_call(|| {
        let got = c.get(&[single], zero)?;
        black_box(got[0].as_ref().context("not sealed")?.data()[0]);
        Ok(())
    })?;
    let contains_ns = per_call(|| {
        black_box(c.contains(&[single])?);
        Ok(())
    })?;

    let mut t = Vec::with_capacity(BLOCKS);
    for _ in 0..BLOCKS {
        let fresh: Vec<ObjectId> = (0..PER_BLOCK).map(|_| ObjectId::random()).collect();
        let t0 = Instant::now();
        for id in &fresh {
            let mut m = c.create(*id, 64, &[])?;
            m.as_mut_slice()[0] = 1;
            drop(c.seal(m)?);
        }
        t.push(t0.elapsed().as_nanos() as f64 / PER_BLOCK as f64);
        c.delete(&fresh)?;
    }
    let create_seal_ns = median(t);

    let mut tb = Vec::with_capacity(BATCH_REPS);
    for _ in 0..BATCH_REPS {
        let t0 = Instant::now();
        let got = c.get(&batch, zero)?;
        for b in got.iter().flatten() {
            black_box(b.data()[0]);
        }
        drop(got);
        tb.push(t0.elapsed().as_nanos() as f64 / 1e3);
    }
    let batch_us = median(tb);

    c.delete(&batch)?;
    c.delete(&[single])?;
    println!(
        "{}",
        serde_json::json!({
            "get_ns": get_ns,
            "contains_ns": contains_ns,
            "create_seal_ns": create_seal_ns,
            "batch_us": batch_us,
        })
    );
    Ok(())
}

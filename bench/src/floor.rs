//! `ferroplasma-bench-floor`: what one random read of a 64-byte line costs
//! in shared memory of a given size, on this machine: the floor under any
//! lookup in a table that size. A get or contains through the store's
//! object table reads at least one random slot (64 bytes) of a table that
//! grows with the object count (about 64–128 bytes per object), so once the
//! table outgrows the CPU's caches and its TLB, each lookup waits for main
//! memory and a page walk, whatever the code around it does.
//!
//! For each `--objects N` it maps a memfd the size of the store's table for
//! N objects (shared, 4 KiB pages, as the store maps its table when the
//! kernel gives shared memory no huge pages: 128 bytes per object, at least
//! the default table's 16 MiB), picks N of its lines at random (the
//! objects' slots), links them into one random cycle and follows it: each
//! read depends on the one before, so the time per step is the latency of
//! one random read among N slots, not the bandwidth. Then it times batches
//! of 1,000 independent reads of random slots among the N, which the CPU
//! overlaps as it can (a batched get's lookups). One JSON object a line:
//! `{"objects": N, "bytes": B, "ns_per_read": X, "ns_per_batch": Y}`.
//!
//!     ferroplasma-bench-floor --objects 10000 --objects 10000000

use anyhow::{Context, Result};
use clap::Parser;
use std::time::Instant;

const LINE: usize = 64;
/// The table's bytes per object at most: it is rebuilt for 1.6 times its
/// objects, in slots of 40 bytes, so it holds 53 to 64 bytes per object.
const PER_OBJECT: u64 = 64;
/// The default table: 262,144 slots of 40 bytes.
const MIN_TABLE: u64 = 262_144 * 40;

/// The latency of one random 64-byte read in shared memory of each size.
#[derive(Debug, Parser)]
struct Args {
    /// Objects (lines read) whose table is measured (repeat for several).
    #[arg(long, required = true, value_parser = clap::value_parser!(u64).range(1..=(1u64 << 28)))]
    objects: Vec<u64>,
    /// Reads timed per size (after as many untimed).
    #[arg(long, default_value_t = 2_000_000, value_parser = clap::value_parser!(u64).range(1000..))]
    reads: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let available = mem_available();
    for &objects in &args.objects {
        let bytes = (objects * PER_OBJECT).max(MIN_TABLE);
        if let Some(avail) = available {
            anyhow::ensure!(
                bytes <= avail / 2,
                "--objects {objects} needs a region of {bytes} bytes, more than half of the \
                 {avail} bytes this machine has available; ask for fewer objects"
            );
        }
        let (read, batch) = floor(bytes as usize, objects as usize, args.reads)?;
        println!(
            "{{\"objects\": {objects}, \"bytes\": {bytes}, \"ns_per_read\": {read:.1}, \
             \"ns_per_batch\": {batch:.0}}}"
        );
    }
    Ok(())
}

/// One step of a xorshift generator (a fixed seed: every run reads the same
/// lines).
fn next(rng: &mut u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng
}

/// `used` distinct lines of `lines`, in random order (a partial
/// Fisher–Yates shuffle).
fn chosen(lines: usize, used: usize, rng: &mut u64) -> Vec<u32> {
    let mut order: Vec<u32> = (0..lines as u32).collect();
    for i in 0..used {
        let j = i + (next(rng) % (lines - i) as u64) as usize;
        order.swap(i, j);
    }
    order.truncate(used);
    order
}

/// MemAvailable of /proc/meminfo, in bytes (None where it cannot be read).
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Reads in one batch of independent reads.
const BATCH: usize = 1000;

/// Nanoseconds per dependent random read among `used` random lines of a
/// `bytes` region, and per batch of [`BATCH`] independent ones (the mean).
fn floor(bytes: usize, used: usize, reads: u64) -> Result<(f64, f64)> {
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    let fd =
        memfd_create(c"ferroplasma-floor", MemFdCreateFlag::MFD_CLOEXEC).context("memfd_create")?;
    let file = std::fs::File::from(fd);
    file.set_len(bytes as u64).context("sizing the memfd")?;
    // Safety: a fresh memfd that only this process knows; nothing else
    // resizes or writes it while it is mapped.
    let mut map = unsafe { memmap2::MmapMut::map_mut(&file) }.context("mapping the memfd")?;
    let lines = bytes / LINE;
    let used = used.min(lines);
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    // Linked into one cycle in this order: each line holds the index of the
    // line read after it.
    let order = chosen(lines, used, &mut rng);
    let words = map.as_mut_ptr() as *mut u64;
    for k in 0..used {
        let (from, to) = (order[k] as usize, order[(k + 1) % used] as usize);
        // Safety: `from < lines`, so the word at `from * 8` lies inside the
        // mapping of `lines * 64` bytes; the mapping is 8-byte aligned.
        unsafe { words.add(from * (LINE / 8)).write(to as u64) };
    }
    let chase = |n: u64, mut at: usize| {
        for _ in 0..n {
            // Safety: every stored index is below `lines` (written above).
            at = unsafe { words.add(at * (LINE / 8)).read_volatile() } as usize;
        }
        at
    };
    let at = chase(reads, order[0] as usize);
    let t = Instant::now();
    let end = chase(reads, at);
    let per_read = t.elapsed().as_nanos() as f64 / reads as f64;
    std::hint::black_box(end);
    // Batches of independent reads: the lines to read are drawn before
    // the clock starts, as a batched get has its ids.
    let batches = (reads as usize / BATCH).max(1);
    let mut lines_of = vec![0usize; BATCH];
    let (mut spent, mut sum) = (0u128, 0u64);
    for _ in 0..batches {
        for l in lines_of.iter_mut() {
            *l = order[(next(&mut rng) % used as u64) as usize] as usize;
        }
        let t = Instant::now();
        for &l in &lines_of {
            // Safety: every line in `order` is below `lines`.
            sum = sum.wrapping_add(unsafe { words.add(l * (LINE / 8)).read_volatile() });
        }
        spent += t.elapsed().as_nanos();
    }
    std::hint::black_box(sum);
    Ok((per_read, spent as f64 / batches as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chase must visit every chosen line once per lap (one cycle, not
    /// several short ones that would stay in the cache), and both figures
    /// come out as times.
    #[test]
    fn the_lines_form_one_cycle_and_both_figures_are_times() {
        let (read, batch) = floor(1 << 20, 1000, 5000).unwrap();
        assert!(read > 0.0 && read.is_finite(), "{read}");
        assert!(batch > 0.0 && batch.is_finite(), "{batch}");
        let order = chosen(1 << 14, 1000, &mut 7);
        let mut seen = order.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 1000, "the chosen lines are distinct");
        assert!(order.iter().all(|&l| (l as usize) < (1 << 14)));
    }
}

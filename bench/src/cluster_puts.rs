//! Small puts on a cluster member against the same puts on a lone store,
//! alternating in one run (a producer that moves from one host to several
//! should not slow down): 1 kB puts with ids the store hands out
//! (`Client::new_id`), and, for reference, with ids the caller chose,
//! which cost a claim at their directory members.

use ferroplasma_client::{Client, ObjectId};
use std::time::Instant;

/// Puts per client per round.
const PER_ROUND: usize = 200;

/// Median times of one 1 kB put (new id included), in seconds.
pub struct Puts {
    pub lone: f64,
    pub member: f64,
    pub member_chosen_id: f64,
}

fn timed(
    c: &Client,
    chosen: bool,
    out: &mut Vec<f64>,
    made: &mut Vec<ObjectId>,
) -> anyhow::Result<()> {
    let data = [7u8; 1000];
    for _ in 0..PER_ROUND {
        let t = Instant::now();
        let id = if chosen {
            ObjectId::random()
        } else {
            c.new_id()?
        };
        c.put(id, &data, b"")?;
        out.push(t.elapsed().as_secs_f64());
        made.push(id);
    }
    Ok(())
}

/// `rounds` rounds, each of [`PER_ROUND`] puts on `lone`, on `member` with
/// handed ids, and on `member` with chosen ids, after a warm-up of each.
pub fn measure(member: &Client, lone: &Client, rounds: usize) -> anyhow::Result<Puts> {
    let (mut l, mut m, mut mc) = (Vec::new(), Vec::new(), Vec::new());
    let mut made = (Vec::new(), Vec::new());
    for round in 0..=rounds {
        let (mut l1, mut m1, mut mc1) = (Vec::new(), Vec::new(), Vec::new());
        timed(lone, false, &mut l1, &mut made.0)?;
        timed(member, false, &mut m1, &mut made.1)?;
        timed(member, true, &mut mc1, &mut made.1)?;
        if round > 0 {
            // Round 0 warms up: leases, rings, the first ids asked for.
            l.extend(l1);
            m.extend(m1);
            mc.extend(mc1);
        }
        lone.delete(&std::mem::take(&mut made.0))?;
        member.delete(&std::mem::take(&mut made.1))?;
    }
    Ok(Puts {
        lone: super::median(l),
        member: super::median(m),
        member_chosen_id: super::median(mc),
    })
}

//! `ferroplasma stats --watch`: a store's figures every few seconds, with
//! rates (per second, over the last interval) next to the totals. On a
//! terminal the view is redrawn in place; elsewhere (a pipe, a log) each
//! look is one line of `key=value` pairs, so that it can be read by tools.

use crate::config::human;
use ferroplasma_client::Client;
use ferroplasma_protocol::pb;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One look at the store (and at its cluster, with `--cluster`).
struct Look {
    at: Instant,
    stats: pb::StatsReply,
    cluster: Option<pb::ClusterStatusReply>,
}

impl Look {
    fn take(c: &Client, cluster: bool) -> Result<Self, Error> {
        Ok(Self {
            at: Instant::now(),
            stats: c.stats()?,
            cluster: if cluster {
                Some(c.cluster_status()?)
            } else {
                None
            },
        })
    }
}

/// A rate per second between two counts.
fn rate(now: u64, before: u64, seconds: f64) -> f64 {
    now.saturating_sub(before) as f64 / seconds.max(1e-9)
}

/// Watches the store every `every` until interrupted (or the store goes).
pub fn watch(c: &Client, every: Duration, cluster: bool) -> Result<(), Error> {
    let tty = std::io::stdout().is_terminal();
    let mut before = Look::take(c, cluster)?;
    loop {
        std::thread::sleep(every);
        let now =
            Look::take(c, cluster).map_err(|e| format!("the store stopped answering: {e}"))?;
        let text = if tty {
            screen(c, &before, &now)
        } else {
            line(&before, &now)
        };
        let mut out = std::io::stdout().lock();
        if tty {
            write!(out, "\x1b[2J\x1b[H")?; // clear, cursor home
        }
        writeln!(out, "{text}")?;
        out.flush()?;
        before = now;
    }
}

struct Rates {
    objects: f64,
    used: f64,
    evictions: f64,
    spills: f64,
    restores: f64,
    fetches: f64,
    fetched: f64,
    served: f64,
    served_bytes: f64,
    lookups: f64,
}

fn rates(a: &Look, b: &Look) -> Rates {
    let dt = b.at.duration_since(a.at).as_secs_f64();
    let (x, y) = (&a.stats, &b.stats);
    let signed = |now: u64, before: u64| (now as f64 - before as f64) / dt.max(1e-9);
    let (ca, cb) = (
        a.cluster.clone().unwrap_or_default(),
        b.cluster.clone().unwrap_or_default(),
    );
    Rates {
        objects: signed(y.objects, x.objects),
        used: signed(y.used, x.used),
        evictions: rate(y.evictions, x.evictions, dt),
        spills: rate(y.spills, x.spills, dt),
        restores: rate(y.restores, x.restores, dt),
        fetches: rate(cb.fetches, ca.fetches, dt),
        fetched: rate(cb.fetched_bytes, ca.fetched_bytes, dt),
        served: rate(cb.served, ca.served, dt),
        served_bytes: rate(cb.served_bytes, ca.served_bytes, dt),
        lookups: rate(cb.lookups, ca.lookups, dt),
    }
}

fn line(a: &Look, b: &Look) -> String {
    let r = rates(a, b);
    let s = &b.stats;
    let mut out = format!(
        "used={} capacity={} objects={} objects_per_s={:.1} used_bytes_per_s={:.0} clients={} \
         awaited={} waiting_creates={} evictions={} evictions_per_s={:.1} spills={} \
         spills_per_s={:.1} restores={} restores_per_s={:.1}",
        s.used,
        s.capacity,
        s.objects,
        r.objects,
        r.used,
        s.clients,
        s.awaited_objects,
        s.waiting_creates,
        s.evictions,
        r.evictions,
        s.spills,
        r.spills,
        s.restores,
        r.restores
    );
    if let Some(c) = &b.cluster {
        let alive = c.members.iter().filter(|m| is_up(m.health)).count();
        out += &format!(
            " members={} members_up={} fetches={} fetches_per_s={:.1} fetched_bytes_per_s={:.0} \
             served={} served_per_s={:.1} served_bytes_per_s={:.0} lookups_per_s={:.1}",
            c.members.len(),
            alive,
            c.fetches,
            r.fetches,
            r.fetched,
            c.served,
            r.served,
            r.served_bytes,
            r.lookups
        );
    }
    out
}

fn is_up(health: i32) -> bool {
    matches!(
        pb::MemberHealth::try_from(health),
        Ok(pb::MemberHealth::ThisMember | pb::MemberHealth::Alive)
    )
}

fn screen(c: &Client, a: &Look, b: &Look) -> String {
    let r = rates(a, b);
    let s = &b.stats;
    let per_s = |v: f64| format!("{}/s", human(v.max(0.0) as u64));
    let mut out = format!(
        "ferroplasma store at {} (every {:.1} s; Ctrl-C to stop)\n\n\
         {:<18}{:>14}  {:>14}\n\
         {:<18}{:>14}  {:>14}\n\
         {:<18}{:>14}  {:>+12.1}/s\n\
         {:<18}{:>14}\n\
         {:<18}{:>14}\n\
         {:<18}{:>14}\n\
         {:<18}{:>14}  {:>12.1}/s\n\
         {:<18}{:>14}  {:>12.1}/s\n\
         {:<18}{:>14}  {:>12.1}/s\n",
        c.socket().display(),
        b.at.duration_since(a.at).as_secs_f64(),
        "",
        "now",
        "rate",
        "used",
        format!("{} / {}", human(s.used), human(s.capacity)),
        if r.used >= 0.0 {
            format!("+{}", per_s(r.used))
        } else {
            format!("-{}", per_s(-r.used))
        },
        "objects",
        s.objects,
        r.objects,
        "clients",
        s.clients,
        "awaited objects",
        s.awaited_objects,
        "waiting creates",
        s.waiting_creates,
        "evictions",
        s.evictions,
        r.evictions,
        "spills",
        s.spills,
        r.spills,
        "restores",
        s.restores,
        r.restores,
    );
    if let Some(cl) = &b.cluster {
        let up = cl.members.iter().filter(|m| is_up(m.health)).count();
        out += &format!(
            "\ncluster: {} of {} members up\n\
             {:<18}{:>14}  {:>12.1}/s  {}\n\
             {:<18}{:>14}  {:>12.1}/s  {}\n\
             {:<18}{:>14}  {:>12.1}/s\n",
            up,
            cl.members.len(),
            "pulled",
            cl.fetches,
            r.fetches,
            per_s(r.fetched),
            "served",
            cl.served,
            r.served,
            per_s(r.served_bytes),
            "lookups",
            cl.lookups,
            r.lookups,
        );
    }
    out
}

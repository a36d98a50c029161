//! Who is in the cluster and who is alive: the failure detector's state.
//! Pure: the heartbeat loop feeds it what it heard and the time.
//!
//! A member silent for longer than the timeout is first only *suspected*;
//! it is declared dead at a later sweep, at least the grace (one heartbeat
//! interval) after, if nothing was heard from it meanwhile. A sweep that
//! runs late (its thread was not scheduled: other processes load the
//! machine) therefore never declares a member dead on the strength of
//! heartbeats that arrived and were not read yet: they are read before the
//! next sweep, and clear the suspicion. A sweep that comes more than the
//! timeout after the previous one, though, means this member itself was
//! stopped (paused, or starved of the CPU for that long): the others may
//! have declared it dead meanwhile, and what its directory knows may be
//! out of date (deletes, new objects, copies re-registered elsewhere). It
//! declares nobody dead for that (the others' heartbeats wait unread, as
//! after a late sweep); it forgets its directory and starts a new
//! directory epoch instead, so that every member re-registers with it,
//! as with a member that comes back after being cut off.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What a member says about itself in heartbeats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberInfo {
    /// gRPC address; the member's name.
    pub addr: String,
    /// Bulk transport address.
    pub data_addr: String,
    /// Random per start.
    pub incarnation: u64,
    /// Arena capacity in bytes.
    pub capacity: u64,
    /// Bytes in use.
    pub used: u64,
    /// Objects held.
    pub objects: u64,
    /// Bumped when the member forgets its directory.
    pub directory_epoch: u64,
}

/// How a member is doing, as far as this member can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Heard from within the peer timeout.
    Alive,
    /// Not heard from for longer than the peer timeout.
    Dead,
    /// Known by name only (from flags or gossip).
    Unknown,
    /// Answers, but refused our heartbeat (another `--cluster-token`).
    Refused,
}

/// One other member.
#[derive(Debug, Clone)]
pub struct Member {
    /// Its last self-description (only the address before first contact).
    pub info: MemberInfo,
    /// Its health.
    pub health: Health,
    /// When it was last heard from.
    pub last_seen: Option<Instant>,
    /// When a sweep first found it silent for longer than the timeout
    /// (cleared by any heartbeat).
    pub suspected: Option<Instant>,
}

/// What a heartbeat changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Members that became alive (new, back, or restarted).
    pub joined: Vec<String>,
    /// Members declared dead (or restarted: their old copies are gone).
    pub died: Vec<String>,
    /// Members heard from with a new incarnation: they hold nothing of
    /// what they held before.
    pub restarted: Vec<String>,
    /// This member was stopped for longer than the timeout (no sweep ran):
    /// its directory is out of date, it forgets it.
    pub stalled: bool,
}

impl Changes {
    /// True when the ring changes: the set of live members, or this
    /// member's directory epoch (after a stall).
    pub fn ring_changed(&self) -> bool {
        !self.joined.is_empty() || !self.died.is_empty() || self.stalled
    }
}

/// The member table.
#[derive(Debug)]
pub struct Membership {
    me: String,
    members: BTreeMap<String, Member>,
    timeout: Duration,
    grace: Duration,
    last_sweep: Option<Instant>,
}

impl Membership {
    /// A table for member `me`, declaring members dead after `timeout` of
    /// silence, and a suspicion that lasted until a later sweep.
    pub fn new(me: &str, timeout: Duration) -> Self {
        Self {
            me: me.into(),
            members: BTreeMap::new(),
            timeout,
            grace: Duration::ZERO,
            last_sweep: None,
        }
    }

    /// How long a member stays suspected, at least, before it is declared
    /// dead (the heartbeat interval).
    pub fn with_grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// This member's name.
    pub fn me(&self) -> &str {
        &self.me
    }

    /// Adds members known by address only (from flags or gossip).
    pub fn learn<'a>(&mut self, addrs: impl IntoIterator<Item = &'a str>) {
        for a in addrs {
            if a != self.me && !a.is_empty() {
                self.members.entry(a.into()).or_insert_with(|| Member {
                    info: MemberInfo {
                        addr: a.into(),
                        ..MemberInfo::default()
                    },
                    health: Health::Unknown,
                    last_seen: None,
                    suspected: None,
                });
            }
        }
    }

    /// Records a heartbeat (sent or answered) by `info.addr` at `now`.
    pub fn heard(&mut self, info: MemberInfo, now: Instant) -> Changes {
        let mut ch = Changes::default();
        if info.addr == self.me || info.addr.is_empty() {
            return ch;
        }
        let addr = info.addr.clone();
        match self.members.get_mut(&addr) {
            Some(m) => {
                let restarted = m.info.incarnation != 0 && m.info.incarnation != info.incarnation;
                if restarted && m.health == Health::Alive {
                    ch.died.push(addr.clone());
                }
                if restarted {
                    ch.restarted.push(addr.clone());
                }
                let forgot = !restarted
                    && m.health == Health::Alive
                    && m.info.directory_epoch != info.directory_epoch;
                if m.health != Health::Alive || restarted || forgot {
                    // (One that forgot its directory is treated as joining
                    // again: everyone re-registers with it.)
                    ch.joined.push(addr.clone());
                }
                m.info = info;
                m.health = Health::Alive;
                m.last_seen = Some(now);
                m.suspected = None;
            }
            None => {
                ch.joined.push(addr.clone());
                self.members.insert(
                    addr,
                    Member {
                        info,
                        health: Health::Alive,
                        last_seen: Some(now),
                        suspected: None,
                    },
                );
            }
        }
        ch
    }

    /// Records that `addr` refused a heartbeat (it has another token). A
    /// live member is left to the timeout, like any member gone silent.
    pub fn refused(&mut self, addr: &str) {
        if let Some(m) = self.members.get_mut(addr) {
            if m.health != Health::Alive {
                m.health = Health::Refused;
            }
        }
    }

    /// Suspects the live members silent for longer than the timeout, and
    /// declares dead those still silent that were suspected at an earlier
    /// sweep, at least the grace before.
    pub fn sweep(&mut self, now: Instant) -> Changes {
        let stalled = (self.last_sweep.replace(now))
            .is_some_and(|t| now.saturating_duration_since(t) > self.timeout);
        let mut ch = Changes {
            stalled,
            ..Changes::default()
        };
        for (addr, m) in &mut self.members {
            let silent = m
                .last_seen
                .is_none_or(|t| now.saturating_duration_since(t) > self.timeout);
            if m.health != Health::Alive || !silent {
                m.suspected = None;
                continue;
            }
            if ch.stalled {
                // Stopped itself: what the others sent waits unread.
                m.suspected = Some(now);
                continue;
            }
            match m.suspected {
                None => {
                    m.suspected = Some(now);
                    tracing::debug!(member = %addr, "cluster member suspected (silent)");
                }
                Some(t) if now.saturating_duration_since(t) >= self.grace && now > t => {
                    m.health = Health::Dead;
                    m.suspected = None;
                    ch.died.push(addr.clone());
                }
                Some(_) => {}
            }
        }
        ch
    }

    /// Live members, this one included, sorted.
    pub fn alive(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| m.health == Health::Alive)
            .map(|(a, _)| a.clone())
            .chain(std::iter::once(self.me.clone()))
            .collect();
        v.sort();
        v
    }

    /// True for this member and live others.
    pub fn is_alive(&self, addr: &str) -> bool {
        addr == self.me
            || self
                .members
                .get(addr)
                .is_some_and(|m| m.health == Health::Alive)
    }

    /// Whether this member has heard, within the peer timeout before `now`,
    /// from a strict majority of the members ever heard from (itself
    /// included): only then may ids be claimed, so that the two sides of a
    /// network partition never both create one id. Judged on the time of
    /// the last heartbeat, not on the last sweep, so that a member that was
    /// paused does not act on what it knew before the pause.
    pub fn has_quorum(&self, now: Instant) -> bool {
        let heard = self
            .members
            .values()
            .filter(|m| m.health != Health::Unknown && m.health != Health::Refused)
            .count()
            + 1;
        let fresh = self
            .members
            .values()
            .filter(|m| {
                m.health == Health::Alive
                    && m.last_seen
                        .is_some_and(|t| now.saturating_duration_since(t) <= self.timeout)
            })
            .count()
            + 1;
        2 * fresh > heard
    }

    /// Whether some member is known by name only (never heard from, never
    /// declared dead): the ring may still be missing it.
    pub fn has_unknown(&self) -> bool {
        self.members.values().any(|m| m.health == Health::Unknown)
    }

    /// Every other member's address (to heartbeat and gossip).
    pub fn known(&self) -> Vec<String> {
        self.members.keys().cloned().collect()
    }

    /// A member's entry.
    pub fn get(&self, addr: &str) -> Option<&Member> {
        self.members.get(addr)
    }

    /// Every other member.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_marks_only_members_not_alive() {
        let t = Instant::now();
        let mut m = Membership::new("me", Duration::from_secs(1));
        m.learn(["a", "b"]);
        m.heard(info("b", 1), t);
        m.refused("a");
        m.refused("b");
        m.refused("nobody");
        assert_eq!(m.get("a").unwrap().health, Health::Refused);
        assert_eq!(m.get("b").unwrap().health, Health::Alive);
        assert!(m.get("nobody").is_none());
        // An answer after all (the member restarted with our token).
        m.heard(info("a", 2), t);
        assert_eq!(m.get("a").unwrap().health, Health::Alive);
    }

    fn info(addr: &str, inc: u64) -> MemberInfo {
        MemberInfo {
            addr: addr.into(),
            incarnation: inc,
            ..MemberInfo::default()
        }
    }

    #[test]
    fn members_join_when_heard_and_die_when_silent() {
        let t0 = Instant::now();
        let mut m = Membership::new("a", Duration::from_secs(3));
        m.learn(["b", "c", "a"]);
        assert_eq!(m.alive(), ["a"], "known is not alive");
        assert_eq!(m.heard(info("b", 1), t0).joined, ["b"]);
        assert!(!m.heard(info("b", 1), t0).ring_changed());
        assert_eq!(m.alive(), ["a", "b"]);
        assert!(!m.sweep(t0 + Duration::from_secs(2)).ring_changed());
        // Silent too long: suspected first, dead at the next sweep.
        assert!(!m.sweep(t0 + Duration::from_secs(4)).ring_changed());
        assert!(m.is_alive("b"));
        assert_eq!(m.sweep(t0 + Duration::from_millis(4001)).died, ["b"]);
        assert!(!m.is_alive("b"));
        assert_eq!(m.get("c").unwrap().health, Health::Unknown);
        // It comes back.
        assert_eq!(
            m.heard(info("b", 1), t0 + Duration::from_secs(5)).joined,
            ["b"]
        );
        assert!(m.is_alive("b"));
    }

    #[test]
    fn a_restart_is_a_death_and_a_join() {
        let t0 = Instant::now();
        let mut m = Membership::new("a", Duration::from_secs(3));
        m.heard(info("b", 1), t0);
        let ch = m.heard(info("b", 2), t0);
        assert_eq!(ch.died, ["b"]);
        assert_eq!(ch.joined, ["b"]);
    }

    /// A sweep that runs late (its thread was not scheduled) finds every
    /// member silent; heartbeats read before the next sweep clear the
    /// suspicion, and nobody is declared dead.
    #[test]
    fn a_late_sweep_only_suspects_and_a_heartbeat_clears_it() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let grace = Duration::from_millis(500);
        let mut m = Membership::new("a", s(3)).with_grace(grace);
        m.heard(info("b", 1), t0);
        // The sweep ran 5 s late; B's heartbeats wait unread.
        assert!(!m.sweep(t0 + s(5)).ring_changed());
        assert!(m.get("b").unwrap().suspected.is_some());
        // Before the grace is over, still only suspected.
        assert!(!m.sweep(t0 + s(5) + grace / 2).ring_changed());
        // Read now: the suspicion is gone, and it starts anew if silent.
        m.heard(info("b", 1), t0 + s(5) + grace / 2);
        assert!(m.get("b").unwrap().suspected.is_none());
        assert!(!m.sweep(t0 + s(6)).ring_changed());
        assert!(m.is_alive("b"));
        // Really silent: suspected, then dead a grace later.
        assert!(!m.sweep(t0 + s(9)).ring_changed());
        assert!(!m.sweep(t0 + s(9) + grace / 2).ring_changed());
        assert_eq!(m.sweep(t0 + s(9) + grace).died, ["b"]);
        // This member itself stopped for longer than the timeout (no sweep
        // meanwhile): it declares nobody dead (B's heartbeats wait
        // unread), and says it stalled (it forgets its directory).
        m.heard(info("b", 1), t0 + s(10));
        assert!(!m.sweep(t0 + s(10)).ring_changed());
        let ch = m.sweep(t0 + s(14));
        assert!(ch.stalled && ch.died.is_empty() && ch.ring_changed());
        assert!(m.is_alive("b"));
        m.heard(info("b", 1), t0 + s(14) + grace / 2);
        assert!(!m.sweep(t0 + s(14) + grace).ring_changed());
        assert!(m.is_alive("b"));
    }

    #[test]
    fn heartbeats_from_oneself_are_ignored() {
        let mut m = Membership::new("a", Duration::from_secs(3));
        assert!(!m.heard(info("a", 1), Instant::now()).ring_changed());
        assert!(m.known().is_empty());
    }
}

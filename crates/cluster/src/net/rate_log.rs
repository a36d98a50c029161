//! Log lines that strangers can cause, at a bounded rate: at most one line
//! per kind every [`EVERY`], saying how many were left out since the
//! previous one (docs/cluster.md, "Network ports").
//!
//! ```ignore
//! static REFUSED: RateLimited = RateLimited::new();
//! if let Some(suppressed) = REFUSED.admit() {
//!     tracing::warn!(suppressed, "connection refused: ...");
//! }
//! ```

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest time between two lines of one kind.
pub const EVERY: Duration = Duration::from_secs(10);

/// One kind of line: whether it may be written now, and how many were not.
#[derive(Debug)]
pub struct RateLimited {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// When the last line was written (none yet: `None`).
    last: Option<Instant>,
    /// Lines left out since then.
    suppressed: u64,
}

impl Default for RateLimited {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimited {
    /// A kind of line none of which has been written yet.
    pub const fn new() -> Self {
        Self {
            state: Mutex::new(State {
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// `Some(n)` when a line may be written now, `n` being the lines left
    /// out since the previous one; `None` (counted) otherwise.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match s.last {
            Some(last) if now.saturating_duration_since(last) < EVERY => {
                s.suppressed += 1;
                None
            }
            _ => {
                s.last = Some(now);
                Some(std::mem::take(&mut s.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_period_with_the_count_left_out() {
        let r = RateLimited::new();
        let t0 = Instant::now();
        assert_eq!(r.admit_at(t0), Some(0), "the first one is written");
        for i in 1..200 {
            assert_eq!(r.admit_at(t0 + Duration::from_millis(i * 10)), None);
        }
        let just_before = t0 + EVERY - Duration::from_millis(1);
        assert_eq!(r.admit_at(just_before), None);
        assert_eq!(r.admit_at(t0 + EVERY), Some(200), "199 + 1 left out");
        assert_eq!(r.admit_at(t0 + EVERY + Duration::from_secs(1)), None);
        // After a quiet spell, the next is written at once, counting the one.
        assert_eq!(r.admit_at(t0 + 5 * EVERY), Some(1));
        assert_eq!(r.admit_at(t0 + 7 * EVERY), Some(0));
    }

    #[test]
    fn kinds_are_counted_apart_and_threads_share_one() {
        let (a, b) = (RateLimited::new(), RateLimited::new());
        assert_eq!(a.admit(), Some(0));
        assert_eq!(b.admit(), Some(0), "another kind has its own period");
        let written: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| s.spawn(|| (0..100).filter(|_| a.admit().is_some()).count() as u64))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(written, 0, "within the period nothing more is written");
        let later = Instant::now() + EVERY;
        assert_eq!(a.admit_at(later), Some(400));
    }
}

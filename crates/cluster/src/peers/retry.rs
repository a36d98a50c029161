//! Pauses between retries: exponential with jitter (backon), each sequence
//! seeded at random so that many retries started together do not run in
//! lockstep (backon's jitter alone repeats the same sequence every time).

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use std::time::Duration;

/// A never-ending backoff from `min` to `max` (each pause up to twice that
/// with jitter).
pub fn backoff(min: Duration, max: Duration) -> ExponentialBackoff {
    builder(min, max).build()
}

/// [`backoff`] as a builder, for `backon::Retryable::retry`.
pub fn builder(min: Duration, max: Duration) -> ExponentialBuilder {
    // fastrand's generator is per thread, seeded once: no system call per
    // sequence (one is built for every directory update sent).
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_jitter()
        .with_jitter_seed(fastrand::u64(..))
        .without_max_times()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_with_jitter_up_to_a_cap() {
        let (min, max) = (Duration::from_millis(10), Duration::from_secs(1));
        let a: Vec<Duration> = backoff(min, max).take(20).collect();
        let b: Vec<Duration> = backoff(min, max).take(20).collect();
        assert!(a[0] >= min && a[0] < 3 * min, "{a:?}");
        assert!(a[8] > a[1], "grows: {a:?}");
        assert!(a.iter().all(|d| *d <= 2 * max), "capped: {a:?}");
        assert_ne!(a, b, "jittered: two sequences do not retry in lockstep");
    }
}

//! The one backoff every retry here uses: capped exponential (the base, doubling with each
//! attempt, at most the cap) and, where many callers would otherwise retry together, "equal
//! jitter" (a random point in the upper half of the delay).
//!
//! Integer arithmetic on purpose: the EC2 answer cache rounds each retry up to a multiple of
//! its backoff on a clock shared by every instance, so that instances that failed at different
//! moments retry in one call; that needs each level to be exactly twice the one below.
//! `backon`'s `ExponentialBuilder` (which kube's watcher uses) multiplies in `f32` seconds, so
//! `200ms` doubles to `400.000005ms` and the ticks drift apart.
//!
//! Owns: delay arithmetic. Never sleeps and never counts attempts (callers keep their counts).

use std::time::Duration;

/// Doublings after which every delay is at its cap for any base of a nanosecond or more and
/// any cap a `Duration` holds in practice (2^40 ns is 18 minutes); keeps the shift in range.
const MAX_DOUBLINGS: u32 = 40;

/// The delay before attempt `attempt` (1: the first retry; 0 counts as 1): `base × 2^(attempt
/// − 1)`, at most `cap`.
pub fn capped(base: Duration, attempt: u32, cap: Duration) -> Duration {
    let doublings = attempt.saturating_sub(1).min(MAX_DOUBLINGS);
    let nanos = base.as_nanos().saturating_mul(1u128 << doublings);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)).min(cap)
}

/// A random delay in `[d/2, d]`: callers that failed together spread out, and each still
/// waits at least half.
pub fn equal_jitter(d: Duration) -> Duration {
    d / 2 + d.mul_f64(fastrand::f64() / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn each_attempt_doubles_the_delay_exactly_up_to_the_cap() {
        let base = 200 * MS;
        let cap = 10 * base;
        let delays: Vec<Duration> = (1..=6).map(|a| capped(base, a, cap)).collect();
        assert_eq!(
            delays,
            [
                200 * MS,
                400 * MS,
                800 * MS,
                1600 * MS,
                2000 * MS,
                2000 * MS
            ]
        );
        assert_eq!(capped(base, 0, cap), base, "attempt 0 is the first");
        for a in 1..5 {
            assert_eq!(
                capped(base, a + 1, Duration::MAX),
                2 * capped(base, a, Duration::MAX),
                "exactly twice the level below"
            );
        }
    }

    #[test]
    fn huge_attempt_counts_and_bases_stay_at_the_cap() {
        let cap = Duration::from_secs(30 * 86_400);
        assert_eq!(capped(Duration::from_secs(1), u32::MAX, cap), cap);
        assert_eq!(capped(Duration::from_secs(3600), 64, cap), cap);
        assert_eq!(
            capped(Duration::from_secs(600), 1, Duration::from_secs(300)),
            Duration::from_secs(300),
            "a base above the cap is the cap"
        );
    }

    #[test]
    fn equal_jitter_waits_at_least_half_and_at_most_the_whole() {
        let d = Duration::from_secs(8);
        for _ in 0..1000 {
            let j = equal_jitter(d);
            assert!(j >= d / 2 && j <= d, "{j:?}");
        }
    }
}

//! The accepted range of every duration and count flag, checked when the command line (or the
//! environment) is parsed: an absurd value is refused at start with a message naming the flag
//! and its range, never met at run time as an overflow. The same table writes the ranges into
//! docs/configuration.md and the chart's values.schema.json.
//!
//! Owns: the ranges and their value parsers. Never does I/O.

use std::time::Duration;

use crate::duration::HumanDuration;

/// What a flag accepts, inclusive at both ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Range {
    Duration {
        min: Duration,
        max: Duration,
    },
    /// A whole number.
    Count {
        min: u64,
        max: u64,
    },
    /// A number with a fraction allowed.
    Number {
        min: f64,
        max: f64,
    },
}

/// One flag (its long name) and its range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    pub flag: &'static str,
    pub range: Range,
}

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

const DAY: u64 = 24 * 3600;

const fn duration(flag: &'static str, min: Duration, max: Duration) -> Bound {
    Bound {
        flag,
        range: Range::Duration { min, max },
    }
}

const fn count(flag: &'static str, min: u64, max: u64) -> Bound {
    Bound {
        flag,
        range: Range::Count { min, max },
    }
}

const fn number(flag: &'static str, min: f64, max: f64) -> Bound {
    Bound {
        flag,
        range: Range::Number { min, max },
    }
}

/// Every bounded flag. The longest durations are 30 days: far beyond any sensible setting, far
/// below where `Instant` arithmetic could overflow.
pub const BOUNDS: &[Bound] = &[
    duration("publish-interval", millis(100), secs(3600)),
    duration("leader-election-lease-duration", secs(1), secs(3600)),
    duration("leader-election-renew-grace", secs(1), secs(3600)),
    duration("batch-window", millis(1), secs(60)),
    duration("batch-max-wait", millis(1), secs(600)),
    duration("cache-ttl", secs(1), secs(30 * DAY)),
    duration("not-described-retry", millis(100), secs(DAY)),
    duration("not-described-ttl", secs(1), secs(30 * DAY)),
    duration("ec2-timeout", millis(100), secs(600)),
    duration("ec2-throttle-backoff-max", millis(100), secs(3600)),
    duration("wait-for-lease", secs(0), secs(3600)),
    duration("rollout-timeout", secs(0), secs(3600)),
    duration("startup-taint-timeout", secs(1), secs(30 * DAY)),
    duration("resync-period", secs(1), secs(30 * DAY)),
    duration("reservations-interval", secs(10), secs(DAY)),
    duration("ultraserver-health-interval", secs(10), secs(3600)),
    duration("ultraserver-shape-interval", secs(10), secs(DAY)),
    duration("reservation-idle-after", secs(10), secs(30 * DAY)),
    duration("conflict-backoff", secs(1), secs(3600)),
    duration("conflict-window", secs(1), secs(30 * DAY)),
    duration("kube-connect-timeout", secs(1), secs(300)),
    duration("kube-request-timeout", secs(1), secs(600)),
    duration("watch-unhealthy-after", secs(10), secs(3600)),
    duration("watch-timeout", secs(5), secs(3600)),
    count("concurrency", 1, 4096),
    count("write-concurrency", 1, 1024),
    count("min-labelled", 0, 10_000_000),
    count("pods", 1, 1_000_000),
    count("misses", 0, 100_000),
    count("uniform-depth", 1, 16),
    number("ec2-rate", 0.01, 1000.0),
    number("ec2-burst", 1.0, 10_000.0),
    number("kube-qps", 1.0, 100_000.0),
    number("kube-burst", 1.0, 100_000.0),
];

/// The range of `flag` (a long name in [`BOUNDS`]).
pub fn of(flag: &str) -> Option<Range> {
    BOUNDS.iter().find(|b| b.flag == flag).map(|b| b.range)
}

impl Range {
    /// The range in words, as the docs and the error messages give it.
    pub fn describe(&self) -> String {
        match self {
            Range::Duration { min, max } => {
                format!("{} to {}", HumanDuration(*min), HumanDuration(*max))
            }
            Range::Count { min, max } => format!("{min} to {max}"),
            Range::Number { min, max } => format!("{min} to {max}"),
        }
    }
}

fn outside(flag: &str, value: &str) -> String {
    let range = of(flag).map(|r| r.describe()).unwrap_or_default();
    format!("{value:?} is out of range for --{flag}: {range}")
}

/// The value parser of a duration flag in [`BOUNDS`] (an unlisted flag takes any duration).
pub fn duration_flag(
    flag: &'static str,
) -> impl Fn(&str) -> Result<HumanDuration, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let d: HumanDuration = s.parse()?;
        match of(flag) {
            Some(Range::Duration { min, max }) if d.0 < min || d.0 > max => Err(outside(flag, s)),
            _ => Ok(d),
        }
    }
}

/// The value parser of a whole-number flag in [`BOUNDS`] (of any integer type its range fits).
pub fn count_flag<T>(
    flag: &'static str,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
{
    move |s: &str| {
        let n: u64 = s
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not a whole number"))?;
        if let Some(Range::Count { min, max }) = of(flag)
            && (n < min || n > max)
        {
            return Err(outside(flag, s));
        }
        T::try_from(n).map_err(|_| outside(flag, s))
    }
}

/// The value parser of a number flag in [`BOUNDS`] (a fraction allowed; never NaN or infinite).
pub fn number_flag(
    flag: &'static str,
) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let n: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("{s:?} is not a number"))?;
        if !n.is_finite() {
            return Err(outside(flag, s));
        }
        match of(flag) {
            Some(Range::Number { min, max }) if n < min || n > max => Err(outside(flag, s)),
            _ => Ok(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_inside_the_range_are_taken_and_outside_refused_with_the_range() {
        let p = duration_flag("cache-ttl");
        assert_eq!(p("6h"), Ok(HumanDuration(secs(6 * 3600))));
        assert_eq!(p("1s"), Ok(HumanDuration(secs(1))));
        assert_eq!(p("30days"), Ok(HumanDuration(secs(30 * DAY))));
        let err = p("31days").expect_err("over");
        assert!(
            err.contains("--cache-ttl") && err.contains("1s to 30days"),
            "{err}"
        );
        assert!(p("500ms").is_err());
        // Far beyond anything `Instant` can add.
        assert!(p("100000000years").is_err());
        assert!(p("soon").is_err());
    }

    #[test]
    fn counts_and_numbers_are_checked_and_never_nan() {
        let c = count_flag::<u16>("concurrency");
        assert_eq!(c("512"), Ok(512));
        assert!(c("0").is_err());
        assert!(c("4097").is_err());
        assert!(c("-1").is_err());
        assert!(c("70000").is_err(), "over u16 and over the range");
        let r = number_flag("ec2-rate");
        assert_eq!(r("5"), Ok(5.0));
        assert_eq!(r("0.5"), Ok(0.5));
        for bad in ["0", "-1", "NaN", "inf", "1e9", "five"] {
            assert!(r(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_range_is_ordered_and_every_flag_listed_once() {
        let mut seen = std::collections::HashSet::new();
        for b in BOUNDS {
            assert!(seen.insert(b.flag), "{} twice", b.flag);
            let ordered = match b.range {
                Range::Duration { min, max } => min <= max,
                Range::Count { min, max } => min <= max,
                Range::Number { min, max } => min <= max && min.is_finite() && max.is_finite(),
            };
            assert!(ordered, "{}", b.flag);
        }
    }

    /// Random strings never panic a parser, and whatever one takes is inside its range.
    #[test]
    fn parsers_take_only_values_in_range_for_any_input() {
        let mut rng = fastrand::Rng::with_seed(42);
        let pieces = [
            "0",
            "1",
            "9",
            "99999999999999999999",
            ".",
            "5",
            "ms",
            "s",
            "h",
            "d",
            "days",
            "y",
            "-",
            " ",
            "e",
            "NaN",
            "inf",
            "m",
            "w",
        ];
        for _ in 0..20_000 {
            let s: String = (0..rng.usize(1..6))
                .map(|_| pieces[rng.usize(..pieces.len())])
                .collect();
            for b in BOUNDS {
                match b.range {
                    Range::Duration { min, max } => {
                        if let Ok(d) = duration_flag(b.flag)(&s) {
                            assert!(d.0 >= min && d.0 <= max, "{} {s:?}", b.flag);
                        }
                    }
                    Range::Count { min, max } => {
                        if let Ok(n) = count_flag::<u64>(b.flag)(&s) {
                            assert!(n >= min && n <= max, "{} {s:?}", b.flag);
                        }
                    }
                    Range::Number { min, max } => {
                        if let Ok(n) = number_flag(b.flag)(&s) {
                            assert!(n >= min && n <= max, "{} {s:?}", b.flag);
                        }
                    }
                }
            }
        }
    }
}

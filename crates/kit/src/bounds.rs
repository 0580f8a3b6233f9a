//! What a bounded flag accepts, and its value parsers: each duration, count and number flag
//! declares its range beside itself (`const CACHE_TTL_RANGE: Bound = Bound::duration(...)`,
//! `value_parser = CACHE_TTL_RANGE.durations()`), checked when the command line (or the
//! environment) is parsed: an absurd value is refused at start with a message naming the flag
//! and its range, never met at run time as an overflow. The command line lists every range
//! (`cmd::BOUNDS`) for docs/configuration.md and the chart's values.schema.json.
//!
//! Owns: the range type and its value parsers. Never does I/O.

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

/// `s` seconds, for a range.
pub const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// `ms` milliseconds, for a range.
pub const fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// A day in seconds. The longest durations are 30 days: far beyond any sensible setting, far
/// below where `Instant` arithmetic could overflow.
pub const DAY: u64 = 24 * 3600;

impl Bound {
    /// A duration flag's range.
    pub const fn duration(flag: &'static str, min: Duration, max: Duration) -> Bound {
        Bound {
            flag,
            range: Range::Duration { min, max },
        }
    }

    /// A whole-number flag's range.
    pub const fn count(flag: &'static str, min: u64, max: u64) -> Bound {
        Bound {
            flag,
            range: Range::Count { min, max },
        }
    }

    /// A number flag's range (a fraction allowed).
    pub const fn number(flag: &'static str, min: f64, max: f64) -> Bound {
        Bound {
            flag,
            range: Range::Number { min, max },
        }
    }

    fn outside(&self, value: &str) -> String {
        format!(
            "{value:?} is out of range for --{}: {}",
            self.flag,
            self.range.describe()
        )
    }

    /// The value parser of a duration flag with this range.
    pub fn durations(
        self,
    ) -> impl Fn(&str) -> Result<HumanDuration, String> + Clone + Send + Sync + 'static {
        move |s: &str| {
            let d: HumanDuration = s.parse()?;
            match self.range {
                Range::Duration { min, max } if d.0 < min || d.0 > max => Err(self.outside(s)),
                _ => Ok(d),
            }
        }
    }

    /// The value parser of a whole-number flag with this range (of any integer type the range
    /// fits).
    pub fn counts<T>(self) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
    where
        T: TryFrom<u64> + Clone + Send + Sync + 'static,
    {
        move |s: &str| {
            let n: u64 = s
                .trim()
                .parse()
                .map_err(|_| format!("{s:?} is not a whole number"))?;
            if let Range::Count { min, max } = self.range
                && (n < min || n > max)
            {
                return Err(self.outside(s));
            }
            T::try_from(n).map_err(|_| self.outside(s))
        }
    }

    /// The value parser of a number flag with this range (never NaN or infinite).
    pub fn numbers(self) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
        move |s: &str| {
            let n: f64 = s
                .trim()
                .parse()
                .map_err(|_| format!("{s:?} is not a number"))?;
            if !n.is_finite() {
                return Err(self.outside(s));
            }
            match self.range {
                Range::Number { min, max } if n < min || n > max => Err(self.outside(s)),
                _ => Ok(n),
            }
        }
    }

    /// Whether the range is ordered (min at most max, numbers finite).
    pub fn is_ordered(&self) -> bool {
        match self.range {
            Range::Duration { min, max } => min <= max,
            Range::Count { min, max } => min <= max,
            Range::Number { min, max } => min <= max && min.is_finite() && max.is_finite(),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Bound = Bound::duration("cache-ttl", secs(1), secs(30 * DAY));
    const CONCURRENCY: Bound = Bound::count("concurrency", 1, 4096);
    const RATE: Bound = Bound::number("ec2-rate", 0.01, 1000.0);

    #[test]
    fn durations_inside_the_range_are_taken_and_outside_refused_with_the_range() {
        let p = TTL.durations();
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
        let c = CONCURRENCY.counts::<u16>();
        assert_eq!(c("512"), Ok(512));
        assert!(c("0").is_err());
        assert!(c("4097").is_err());
        assert!(c("-1").is_err());
        assert!(c("70000").is_err(), "over u16 and over the range");
        let narrow = Bound::count("narrow", 0, 100_000).counts::<u8>();
        assert!(
            narrow("300")
                .unwrap_err()
                .contains("out of range for --narrow")
        );
        let r = RATE.numbers();
        assert_eq!(r("5"), Ok(5.0));
        assert_eq!(r("0.5"), Ok(0.5));
        for bad in ["0", "-1", "NaN", "inf", "1e9", "five"] {
            assert!(r(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_unordered_range_is_told() {
        assert!(TTL.is_ordered() && CONCURRENCY.is_ordered() && RATE.is_ordered());
        assert!(!Bound::count("backwards", 2, 1).is_ordered());
        assert!(!Bound::number("endless", 1.0, f64::INFINITY).is_ordered());
    }
}

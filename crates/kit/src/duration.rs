//! Durations written the human way on the command line, in the environment and in the chart's
//! values (`200ms`, `15s`, `1h30m`).
//!
//! Owns: parsing and printing durations. Never does I/O.

use std::{fmt, str::FromStr, time::Duration};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A duration written the human way: `200ms`, `15s`, `1h`, `1h30m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s)
            .map(HumanDuration)
            .map_err(|e| format!("{s:?} is not a duration like 200ms, 15s or 1h: {e}"))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What [`humantime::parse_duration`] accepts: numbers (a fraction of up to 6 digits allowed)
/// each followed by one of its units, for the chart's schema (a test checks the two agree; the
/// binary also takes longer fractions, which the chart's range checks could not add up exactly).
pub const PATTERN: &str = "^ *([0-9]+(\\.[0-9]{1,6})? *(nanos|nsec|ns|usec|us|µs|millis|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m|hours|hour|hrs|hr|h|days|day|d|weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y) *)+$";

impl JsonSchema for HumanDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": PATTERN,
            "description": "A duration such as 200ms, 15s, 1h or 1h30m"
        })
    }
}

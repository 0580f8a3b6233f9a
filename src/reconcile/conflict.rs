//! Not flapping when someone else fights over our labels.
//!
//! If another writer keeps setting one of our keys to another value, restoring it at once every
//! time would turn two controllers into a write loop on the API server. After a few corrections
//! in a short window the guard holds further writes to that node for a growing pause (doubling,
//! up to [`BACKOFF_MAX_FACTOR`] times the first), so the writes stay bounded; when a pause ends
//! the label is corrected again: a writer that keeps at it never wins, it only slows our
//! corrections down to a few per pause. The reconciler reports the conflict (naming the other
//! field managers) once per hold. A new boot of the node starts afresh. Pure: time is passed in. Every write after the
//! first in a boot counts as a correction (a late EC2 field too): more than 3 within the window
//! (1 h by default) is a hold, which such fields alone do not reach.
//!
//! Owns: the hold decision, per node (kept in its record). Never does I/O.

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardConfig {
    /// Corrections tolerated within `window`…
    pub(crate) max_corrections: usize,
    pub window: Duration,
    /// …then writes are held this long, doubling per repeated hold, up to `backoff_max`.
    pub backoff: Duration,
    pub(crate) backoff_max: Duration,
}

/// The longest pause, as a multiple of the first: a persistent writer's value never stays more
/// than this long (5 minutes with the default 30 s).
pub(crate) const BACKOFF_MAX_FACTOR: u32 = 10;

impl GuardConfig {
    /// Pauses starting at `backoff`, doubling up to [`BACKOFF_MAX_FACTOR`] times it, counted in
    /// `window`.
    pub fn new(backoff: Duration, window: Duration) -> Self {
        Self {
            max_corrections: 3,
            window,
            backoff,
            backoff_max: backoff.saturating_mul(BACKOFF_MAX_FACTOR),
        }
    }
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self::new(Duration::from_secs(30), Duration::from_secs(3600))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Write,
    /// Do not write before `until`. `first` is set on the reconcile that starts the hold (report
    /// the conflict then, not on every retry).
    Hold {
        until: Instant,
        first: bool,
    },
}

/// One node's history of corrections, kept in its record (see `super::nodes`).
/// 24 bytes for a node nobody fights over (nearly all of them; a record is kept for every node):
/// what a fight needs is boxed.
#[derive(Debug, Default, Clone)]
pub struct History {
    /// Hash of the boot ID the history is about (a hash, not the 36-byte ID: one per node; its
    /// lowest bit set, so never 0 and kept in 8 bytes).
    boot: Option<std::num::NonZeroU64>,
    wrote: bool,
    /// Made at the first correction in a boot.
    fight: Option<Box<Fight>>,
}

/// The corrections of one boot, and the holds they led to.
#[derive(Debug, Default, Clone)]
struct Fight {
    corrections: VecDeque<Instant>,
    held_until: Option<Instant>,
    holds: u32,
}

impl History {
    /// Are writes to this node held at `now`?
    pub fn holding(&self, now: Instant) -> bool {
        self.fight
            .as_ref()
            .and_then(|f| f.held_until)
            .is_some_and(|until| now < until)
    }

    /// May we write this node's labels now?
    pub(crate) fn before_write(
        &mut self,
        cfg: &GuardConfig,
        boot_id: Option<&str>,
        now: Instant,
    ) -> Verdict {
        let boot = boot_id.map(|b| {
            use std::hash::{DefaultHasher, Hash, Hasher};
            let mut h = DefaultHasher::new();
            b.hash(&mut h);
            std::num::NonZeroU64::MIN | h.finish()
        });
        if boot.is_some() && self.boot != boot {
            // A new boot: the node may legitimately need new labels.
            *self = History {
                boot,
                ..History::default()
            };
        }
        if let Some(fight) = self.fight.as_mut()
            && let Some(until) = fight.held_until
        {
            if now < until {
                return Verdict::Hold {
                    until,
                    first: false,
                };
            }
            fight.held_until = None;
        }
        if !self.wrote {
            return Verdict::Write;
        }
        // We labelled this node during this boot already: this write corrects someone.
        let fight = self.fight.get_or_insert_with(Box::default);
        fight.corrections.push_back(now);
        while fight
            .corrections
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) > cfg.window)
        {
            fight.corrections.pop_front();
        }
        if fight.corrections.len() > cfg.max_corrections {
            fight.holds = fight.holds.saturating_add(1);
            let pause = crate::backoff::capped(cfg.backoff, fight.holds, cfg.backoff_max);
            let until = now + pause;
            fight.held_until = Some(until);
            fight.corrections.clear();
            return Verdict::Hold { until, first: true };
        }
        Verdict::Write
    }

    /// We wrote this node's labels.
    pub fn written(&mut self) {
        self.wrote = true;
    }
}

/// Field managers other than `ours` that own any of `keys` in a Node's labels, from its
/// `metadata.managedFields`.
pub(crate) fn other_owners(
    managed: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry],
    keys: &[&String],
    ours: &str,
) -> Vec<String> {
    let mut out: Vec<String> = managed
        .iter()
        .filter(|m| m.manager.as_deref() != Some(ours))
        .filter(|m| {
            m.fields_v1.as_ref().is_some_and(|f| {
                let labels = f.0.pointer("/f:metadata/f:labels");
                keys.iter()
                    .any(|k| labels.and_then(|l| l.get(format!("f:{k}"))).is_some())
            })
        })
        .filter_map(|m| m.manager.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The histories of a few nodes, as the node records keep them.
    struct Guard(GuardConfig, std::collections::HashMap<String, History>);

    impl Guard {
        fn before_write(&mut self, node: &str, boot: Option<&str>, now: Instant) -> Verdict {
            let cfg = self.0;
            self.1
                .entry(node.into())
                .or_default()
                .before_write(&cfg, boot, now)
        }

        fn written(&mut self, node: &str) {
            self.1.entry(node.into()).or_default().written();
        }
    }

    fn guard() -> Guard {
        Guard(
            GuardConfig {
                max_corrections: 3,
                window: Duration::from_secs(600),
                backoff: Duration::from_secs(60),
                backoff_max: Duration::from_secs(240),
            },
            Default::default(),
        )
    }

    #[test]
    fn first_labelling_and_a_few_corrections_are_written() {
        let mut g = guard();
        let t = Instant::now();
        assert_eq!(g.before_write("n", Some("b"), t), Verdict::Write);
        g.written("n");
        for i in 1..=3 {
            assert_eq!(
                g.before_write("n", Some("b"), t + Duration::from_secs(i)),
                Verdict::Write
            );
            g.written("n");
        }
    }

    #[test]
    fn a_fight_is_held_with_growing_pauses_and_reported_once_per_hold() {
        let mut g = guard();
        let t = Instant::now();
        g.before_write("n", Some("b"), t);
        g.written("n");
        let mut writes = 0;
        let mut firsts = 0;
        // Someone resets our label every second for 10 minutes.
        for s in 1..600u64 {
            match g.before_write("n", Some("b"), t + Duration::from_secs(s)) {
                Verdict::Write => {
                    writes += 1;
                    g.written("n");
                }
                Verdict::Hold { first, .. } => firsts += usize::from(first),
            }
        }
        assert!(writes <= 15, "{writes} writes in 10 minutes of fighting");
        assert!(firsts >= 2, "each hold is reported once ({firsts})");
        // Holds grow: 60, 120, 240 (capped).
        let mut g = guard();
        g.before_write("m", Some("b"), t);
        g.written("m");
        let mut pauses = Vec::new();
        let mut now = t;
        while pauses.len() < 4 {
            now += Duration::from_secs(1);
            match g.before_write("m", Some("b"), now) {
                Verdict::Write => g.written("m"),
                Verdict::Hold { until, first: true } => {
                    pauses.push((until - now).as_secs());
                    now = until;
                }
                Verdict::Hold { .. } => {}
            }
        }
        assert_eq!(pauses, vec![60, 120, 240, 240]);
    }

    /// Issue 26 (the cloud controller's label reconciliation): a writer that puts its stale
    /// value back every 5 minutes, its node status period, is held after its 4th revert with
    /// the default window, rather than corrected every period for as long as it is stale.
    #[test]
    fn a_writer_reverting_every_five_minutes_is_held() {
        let mut g = Guard(GuardConfig::default(), Default::default());
        let t = Instant::now();
        g.before_write("n", Some("b"), t);
        g.written("n");
        let mut held_at = None;
        for k in 1..=12u64 {
            match g.before_write("n", Some("b"), t + Duration::from_secs(300 * k)) {
                Verdict::Write => g.written("n"),
                Verdict::Hold { first: true, .. } => {
                    held_at = Some(k);
                    break;
                }
                Verdict::Hold { .. } => {}
            }
        }
        assert_eq!(held_at, Some(4), "held at the 4th revert, 20 minutes in");
    }

    /// Issue 55.3: a writer that rewrites our label every second for two hours never keeps its
    /// value longer than the longest pause (5 minutes by default): we correct it again after
    /// each hold, with few writes.
    #[test]
    fn a_persistent_writer_never_wins() {
        let cfg = GuardConfig::default();
        let mut g = Guard(cfg, Default::default());
        let t = Instant::now();
        g.before_write("n", Some("b"), t);
        g.written("n");
        let mut last_write = t;
        let mut longest = Duration::ZERO;
        let mut writes = 0u32;
        for s in 1..7200u64 {
            let now = t + Duration::from_secs(s);
            if g.before_write("n", Some("b"), now) == Verdict::Write {
                g.written("n");
                writes += 1;
                longest = longest.max(now - last_write);
                last_write = now;
            }
        }
        assert!(
            longest <= cfg.backoff_max + Duration::from_secs(1),
            "the other writer's value stood {longest:?}"
        );
        assert_eq!(cfg.backoff_max, Duration::from_secs(300));
        assert!(writes <= 120, "{writes} writes in two hours of fighting");
        assert!(writes >= 24, "corrected at every pause's end ({writes})");
    }

    #[test]
    fn a_new_boot_starts_afresh() {
        let mut g = guard();
        let t = Instant::now();
        g.before_write("n", Some("b1"), t);
        g.written("n");
        for i in 1..=4 {
            let _ = g.before_write("n", Some("b1"), t + Duration::from_secs(i));
            g.written("n");
        }
        assert!(matches!(
            g.before_write("n", Some("b1"), t + Duration::from_secs(5)),
            Verdict::Hold { .. }
        ));
        assert_eq!(
            g.before_write("n", Some("b2"), t + Duration::from_secs(6)),
            Verdict::Write
        );
    }

    #[test]
    fn other_owners_are_read_from_managed_fields() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
        let entry = |m: &str, key: &str| ManagedFieldsEntry {
            manager: Some(m.into()),
            fields_v1: Some(FieldsV1(
                serde_json::json!({"f:metadata": {"f:labels": {format!("f:{key}"): {}}}}),
            )),
            ..Default::default()
        };
        let k = "topology.k8s.aws/network-node-layer-1".to_string();
        let managed = vec![
            entry("ec2-topology-labeler", &k),
            entry("fighter", &k),
            entry("kubelet", "other"),
        ];
        assert_eq!(
            other_owners(&managed, &[&k], "ec2-topology-labeler"),
            vec!["fighter"]
        );
    }
}

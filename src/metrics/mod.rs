//! Prometheus metrics (`prometheus-client`), all prefixed `ec2_topology_labeler_`.
//!
//! Owns: the metric families and their encoding. Never holds per-node state (node records do).

use std::{sync::atomic::AtomicI64, time::Duration};

use prometheus_client::{
    encoding::{
        EncodeLabelSet,
        text::{encode_eof, encode_registry},
    },
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram, info::Info},
    registry::Registry,
};

use crate::{state::NodeState, topology::Ec2Error};

pub(crate) mod process;
mod register;

/// The supervised tasks' names ([`crate::tasks`]): their `task_restarts_total` series exist
/// from the start, at 0.
pub(crate) const TASKS: [&str; 10] = [
    "retire at start",
    "verification ledger",
    "retire condition at start",
    "warm-up",
    "coverage",
    "reservations",
    "ultraserver-health",
    "ultraserver-shape",
    "housekeeping",
    "election sweep",
];

/// The reasons `watch_errors` counts (see [`crate::node::watch::error_reason`]).
pub(crate) const WATCH_ERROR_REASONS: [&str; 7] = [
    "forbidden",
    "not_found",
    "timeout",
    "connect",
    "api",
    "decode",
    "other",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ErrorLabels {
    pub category: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ManagerLabels {
    /// The other field manager, as the Node's managed fields name it (`unknown` when none did).
    pub manager: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct WriteLabels {
    /// `apply` (server-side apply of our labels) or `remove` (explicit removal of stale keys
    /// another manager also owned).
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StateLabels {
    pub state: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub reason: String,
}

/// The `state` and `reason` labels of a node's state.
fn state_labels(state: &NodeState) -> StateLabels {
    StateLabels {
        state: state.name().to_string(),
        reason: state.reason().to_string(),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TaskLabels {
    pub task: String,
}

pub struct Metrics {
    api_calls_cut: Family<ReasonLabels, Counter>,
    watch_errors: Family<ReasonLabels, Counter>,
    watch_unhealthy_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    task_restarts: Family<TaskLabels, Counter>,
    /// This replica's own work (every replica exports it).
    registry: Registry,
    /// The state of the whole fleet and of the objects published for it: exported by the leader
    /// only, so that `sum()` over replicas counts every node once.
    fleet: Registry,
    /// Whether this replica leads (then [`Metrics::render`] includes `fleet`).
    leading: std::sync::atomic::AtomicBool,
    reconciles: Counter,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: Histogram,
    ec2_calls: Family<OutcomeLabels, Counter>,
    ec2_duration: Histogram,
    ec2_instances_per_call: Histogram,
    cache_hits: Counter,
    cache_misses: Counter,
    reverified_early: Counter,
    label_writes: Family<WriteLabels, Counter>,
    skips: Family<ReasonLabels, Counter>,
    nodes: Family<StateLabels, Gauge>,
    leader: Gauge<i64, AtomicI64>,
    publish_errors: Family<PublisherLabels, Counter>,
    hypernodes: Gauge<i64, AtomicI64>,
    hypernode_writes: Family<WriteLabels, Counter>,
    hypernode_conflicts: Gauge<i64, AtomicI64>,
    clique_mismatches: Family<WriteLabels, Gauge>,
    unpublished_nodes: Family<ReasonLabels, Gauge>,
    publish_halted: Gauge<i64, AtomicI64>,
    slurm_topology_problems: Gauge<i64, AtomicI64>,
    kueue_mismatch: Family<TopologyLabels, Gauge>,
    kai_mismatch: Family<TopologyLabels, Gauge>,
    coverage_nodes: Family<CellLabels, Gauge>,
    reserved_instances: Family<ReservedLabels, Gauge>,
    reserved_joined: Family<ReservedLabels, Gauge>,
    interconnect: Family<InterconnectLabels, Gauge>,
    interconnect_polls: Family<OutcomeLabels, Counter>,
    coverage_full: Family<CellLabels, Gauge>,
    coverage_layer: Family<CellLayerLabels, Gauge>,
    label_conflicts: Counter,
    label_conflict_writers: Family<ManagerLabels, Counter>,
    /// The field managers with a `label_conflict_writers` series of their own.
    conflict_managers: std::sync::Mutex<std::collections::HashSet<String>>,
    events: Family<OutcomeLabels, Counter>,
    taint_releases: Family<ReasonLabels, Counter>,
    verification_records: Family<OutcomeLabels, Counter>,
    ledger_shards: Family<OutcomeLabels, Counter>,
    first_label_latency: Histogram,
    taint_release_latency: Histogram,
    takeover: Histogram,
    /// When this replica last became leader, until its first decision as leader.
    took_lease_at: std::sync::Mutex<Option<std::time::Instant>>,
    /// Set with `took_lease_at`: the hot path reads one atomic until the first decision.
    awaiting_first_decision: std::sync::atomic::AtomicBool,
}

/// Field managers named in `label_conflict_writers` (the rest are `other`).
pub(crate) const MAX_MANAGERS: usize = 16;

/// Buckets for "node creation to …" (creationTimestamp has one-second resolution).
const JOIN_BUCKETS: [f64; 14] = [
    0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PublisherLabels {
    pub publisher: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TopologyLabels {
    pub topology: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReservedLabels {
    pub network_node: String,
    pub reservation: String,
    pub instance_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct InterconnectLabels {
    pub capacity_block: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CellLabels {
    pub instance_type: String,
    pub zone: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CellLayerLabels {
    pub instance_type: String,
    pub zone: String,
    pub layer: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn ec2_outcome(error: Option<&Ec2Error>) -> String {
    error.map_or("ok", Ec2Error::category).to_string()
}

impl Metrics {
    /// A verification ledger shard read, refused, written, not written.
    pub(crate) fn ledger_shard(&self, outcome: &str) {
        self.ledger_shards
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// What became of a node's verification record at its instance's first lookup: `trusted`,
    /// or why not.
    pub(crate) fn verification_record(&self, outcome: &str) {
        self.verification_records
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// A startup taint was removed `age` after the node's creation.
    pub(crate) fn taint_released(&self, reason: &str, age: Duration) {
        self.taint_releases
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
        self.taint_release_latency.observe(age.as_secs_f64());
    }

    /// A node got its topology labels for the first time, `age` after its creation.
    pub(crate) fn first_labelled(&self, age: Duration) {
        self.first_label_latency.observe(age.as_secs_f64());
    }

    /// The text exposition format: this replica's metrics, and the fleet's while it leads.
    pub fn render(&self) -> String {
        self.render_with(crate::metrics::process::encode)
    }

    /// [`Metrics::render`] with the process series from `process`.
    fn render_with(&self, process: fn(&mut String) -> std::fmt::Result) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode_registry(&mut out, &self.registry);
        if self.leading.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = encode_registry(&mut out, &self.fleet);
        }
        let _ = process(&mut out);
        let _ = encode_eof(&mut out);
        out
    }

    pub fn reconciled(&self, took: Duration) {
        self.reconciles.inc();
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    pub(crate) fn reconcile_failed(&self, category: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                category: category.to_string(),
            })
            .inc();
    }

    /// A Kubernetes API call cut short (see [`crate::client::Cut`]).
    pub(crate) fn api_call_cut(&self, reason: &str) {
        self.api_calls_cut
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// An error of the Node watch.
    pub(crate) fn watch_error(&self, reason: &str) {
        self.watch_errors
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// How long the Node watch has been failing (0: healthy).
    pub(crate) fn set_watch_unhealthy(&self, for_: std::time::Duration) {
        self.watch_unhealthy_seconds.set(for_.as_secs_f64());
    }

    /// A background task restarted.
    pub(crate) fn task_restart(&self, task: &str) {
        self.task_restarts
            .get_or_create(&TaskLabels {
                task: task.to_string(),
            })
            .inc();
    }

    pub(crate) fn label_write(&self, kind: &str) {
        self.label_writes
            .get_or_create(&WriteLabels {
                kind: kind.to_string(),
            })
            .inc();
    }

    pub fn event(&self, outcome: &str) {
        self.events
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// `publisher` runs: its error counter exists (at 0) from now on.
    pub(crate) fn publisher_enabled(&self, publisher: &str) {
        self.publish_errors
            .get_or_create(&PublisherLabels {
                publisher: publisher.to_string(),
            })
            .get();
    }

    pub(crate) fn publish_failed(&self, publisher: &str) {
        self.publish_errors
            .get_or_create(&PublisherLabels {
                publisher: publisher.to_string(),
            })
            .inc();
    }

    pub fn hypernodes(&self, total: usize, applied: usize, deleted: usize) {
        self.hypernodes.set(total as i64);
        for (kind, n) in [("apply", applied), ("delete", deleted)] {
            if n > 0 {
                self.hypernode_writes
                    .get_or_create(&WriteLabels { kind: kind.into() })
                    .inc_by(n as u64);
            }
        }
    }

    /// Nodes carrying our label keys that the publishers left out, by why (every reason set,
    /// at 0 when none).
    pub fn unpublished_nodes(&self, by_reason: &[(&'static str, usize)]) {
        for (reason, n) in by_reason {
            self.unpublished_nodes
                .get_or_create(&ReasonLabels {
                    reason: (*reason).to_string(),
                })
                .set(*n as i64);
        }
    }

    /// Whether the publishers hold back this round because the view is implausible.
    pub(crate) fn publish_halted(&self, halted: bool) {
        self.publish_halted.set(i64::from(halted));
    }

    pub(crate) fn hypernode_conflicts(&self, n: usize) {
        self.hypernode_conflicts.set(n as i64);
    }

    /// Capacity blocks holding more than one NVLink clique, and cliques spanning capacity
    /// blocks.
    pub(crate) fn clique_mismatches(
        &self,
        blocks_holding_cliques: usize,
        cliques_spanning_blocks: usize,
    ) {
        for (kind, n) in [
            ("block_holds_cliques", blocks_holding_cliques),
            ("clique_spans_blocks", cliques_spanning_blocks),
        ] {
            self.clique_mismatches
                .get_or_create(&WriteLabels { kind: kind.into() })
                .set(n as i64);
        }
    }

    pub(crate) fn slurm_topology_problems(&self, n: usize) {
        self.slurm_topology_problems.set(n as i64);
    }

    pub(crate) fn kueue_topology_mismatch(&self, topology: &str, mismatch: bool) {
        self.kueue_mismatch
            .get_or_create(&TopologyLabels {
                topology: topology.to_string(),
            })
            .set(i64::from(mismatch));
    }

    pub(crate) fn kai_topology_mismatch(&self, topology: &str, mismatch: bool) {
        self.kai_mismatch
            .get_or_create(&TopologyLabels {
                topology: topology.to_string(),
            })
            .set(i64::from(mismatch));
    }

    /// Replace the reserved-capacity gauges with `series` (those of reservations gone or no
    /// longer live disappear).
    pub(crate) fn set_reserved(&self, series: &[crate::reservations::Series]) {
        self.reserved_instances.clear();
        self.reserved_joined.clear();
        for s in series {
            let labels = ReservedLabels {
                network_node: s.network_node.clone(),
                reservation: s.reservation.clone(),
                instance_type: s.instance_type.clone(),
            };
            self.reserved_instances
                .get_or_create(&labels)
                .set(i64::from(s.reserved));
            self.reserved_joined
                .get_or_create(&labels)
                .set(i64::from(s.joined));
        }
    }

    /// Replace the interconnect gauges with `statuses` (capacity block, what EC2 last said of
    /// its interconnect): 1 on that status; blocks no node is in any longer disappear. A block
    /// EC2 could not be asked about keeps its last series (`keep`).
    pub(crate) fn set_interconnects<'a>(
        &self,
        statuses: impl IntoIterator<Item = (&'a str, &'static str)>,
        keep: &[String],
    ) {
        let kept: Vec<(InterconnectLabels, i64)> = ["ok", "impaired", "insufficient-data"]
            .iter()
            .flat_map(|status| {
                keep.iter().map(move |block| InterconnectLabels {
                    capacity_block: block.clone(),
                    status: (*status).to_string(),
                })
            })
            .filter_map(|l| self.interconnect.get(&l).map(|g| (l.clone(), g.get())))
            .collect();
        self.interconnect.clear();
        for (l, v) in kept {
            self.interconnect.get_or_create(&l).set(v);
        }
        for (block, status) in statuses {
            self.interconnect
                .get_or_create(&InterconnectLabels {
                    capacity_block: block.to_string(),
                    status: status.to_string(),
                })
                .set(1);
        }
    }

    /// One round of asking EC2 about the interconnects: `ok` or `failed`.
    pub(crate) fn interconnect_poll(&self, outcome: &str) {
        self.interconnect_polls
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Replace the coverage gauges with `cells` (series of cells that emptied disappear).
    pub(crate) fn set_coverage(
        &self,
        cells: &std::collections::BTreeMap<(String, String), crate::coverage::Group>,
    ) {
        self.coverage_nodes.clear();
        self.coverage_full.clear();
        self.coverage_layer.clear();
        for ((t, z), g) in cells {
            let cell = CellLabels {
                instance_type: t.clone(),
                zone: z.clone(),
            };
            self.coverage_nodes.get_or_create(&cell).set(g.nodes as i64);
            self.coverage_full.get_or_create(&cell).set(g.full as i64);
            for (i, n) in g.with_layer.iter().enumerate() {
                self.coverage_layer
                    .get_or_create(&CellLayerLabels {
                        instance_type: t.clone(),
                        zone: z.clone(),
                        layer: (i + 1).to_string(),
                    })
                    .set(*n as i64);
            }
        }
    }

    /// A hold began because `managers` (the other field managers of the keys; none known:
    /// `unknown`) kept changing our labels.
    /// A conflict with `managers` (the other field managers owning the keys). Field manager
    /// names are chosen by whoever writes: the first [`MAX_MANAGERS`] seen are series of their
    /// own (names cut to 64 characters), every later one counts as `other`.
    pub(crate) fn label_conflict(&self, managers: &[String]) {
        self.label_conflicts.inc();
        let unknown = ["unknown".to_string()];
        let named = if managers.is_empty() {
            &unknown[..]
        } else {
            managers
        };
        let mut seen = self
            .conflict_managers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for m in named {
            let m: String = m.chars().take(64).collect();
            let manager = if seen.contains(&m) || seen.len() < MAX_MANAGERS {
                seen.insert(m.clone());
                m
            } else {
                "other".to_string()
            };
            self.label_conflict_writers
                .get_or_create(&ManagerLabels { manager })
                .inc();
        }
    }

    pub(crate) fn set_leader(&self, leader: bool) {
        use std::sync::atomic::Ordering;
        self.leader.set(i64::from(leader));
        let was = self.leading.swap(leader, Ordering::Relaxed);
        if leader && !was {
            *self.took_lease_at.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(std::time::Instant::now());
            self.awaiting_first_decision.store(true, Ordering::Release);
        } else if !leader {
            self.awaiting_first_decision.store(false, Ordering::Release);
        }
    }

    /// Node reconciles run as leader so far.
    pub(crate) fn reconciles_run(&self) -> u64 {
        self.reconciles.get()
    }

    /// A reconcile decided as leader. The first since taking the lease is observed in
    /// `leader_first_decision_seconds` and its delay returned (once per term).
    pub(crate) fn decided_as_leader(&self) -> Option<Duration> {
        use std::sync::atomic::Ordering;
        if !self.awaiting_first_decision.load(Ordering::Acquire)
            || !self.awaiting_first_decision.swap(false, Ordering::AcqRel)
        {
            return None;
        }
        let took = self
            .took_lease_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()?
            .elapsed();
        self.takeover.observe(took.as_secs_f64());
        Some(took)
    }

    /// A node went from one state to another (`None`: unknown, or forgotten). The states
    /// themselves live in each node's record (`reconcile::nodes`).
    pub(crate) fn node_state_changed(&self, from: Option<&NodeState>, to: Option<&NodeState>) {
        if from == to {
            return;
        }
        if let Some(p) = from {
            self.nodes.get_or_create(&state_labels(p)).dec();
        }
        if let Some(state) = to {
            self.nodes.get_or_create(&state_labels(state)).inc();
            if let NodeState::Skipped(reason) = state {
                self.skips
                    .get_or_create(&ReasonLabels {
                        reason: reason.to_string(),
                    })
                    .inc();
            }
        }
    }
}

/// What the EC2 lookup reports (its own crate, `ec2_topology_lookup`), counted here.
impl ec2_topology_lookup::Observer for Metrics {
    fn ec2_call(&self, _region: &str, ids: usize, took: Duration, error: Option<&Ec2Error>) {
        self.ec2_calls
            .get_or_create(&OutcomeLabels {
                outcome: ec2_outcome(error),
            })
            .inc();
        self.ec2_duration.observe(took.as_secs_f64());
        self.ec2_instances_per_call.observe(ids as f64);
    }

    fn cache_hit(&self) {
        self.cache_hits.inc();
    }

    fn cache_miss(&self) {
        self.cache_misses.inc();
    }

    fn reverified_early(&self, n: usize) {
        self.reverified_early.inc_by(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::NotDescribed;
    use ec2_topology_lookup::Observer;

    #[test]
    fn the_first_decision_of_each_term_is_timed_once() {
        let m = Metrics::new();
        assert_eq!(m.decided_as_leader(), None, "a follower times nothing");
        m.set_leader(true);
        std::thread::sleep(Duration::from_millis(20));
        let took = m.decided_as_leader().expect("the term's first decision");
        assert!(took >= Duration::from_millis(20), "{took:?}");
        assert_eq!(m.decided_as_leader(), None, "only the first of the term");
        // A renewal (leader again while leading) starts no new term.
        m.set_leader(true);
        assert_eq!(m.decided_as_leader(), None);
        m.set_leader(false);
        m.set_leader(true);
        assert!(m.decided_as_leader().is_some(), "a new term");
        let text = m.render();
        assert!(
            text.contains("ec2_topology_labeler_leader_first_decision_seconds_count 2"),
            "{text}"
        );
    }

    #[test]
    fn node_state_gauge_follows_transitions_with_the_reason_apart() {
        let m = Metrics::new();
        m.set_leader(true);
        let (pending, labelled, fargate, unsupported) = (
            NodeState::Pending,
            NodeState::Labelled,
            NodeState::Skipped("fargate"),
            NodeState::NotDescribed(NotDescribed::of(Some("m7i.large"))),
        );
        m.node_state_changed(None, Some(&pending));
        m.node_state_changed(None, Some(&pending));
        m.node_state_changed(None, Some(&pending));
        m.node_state_changed(Some(&pending), Some(&labelled));
        m.node_state_changed(Some(&pending), Some(&fargate));
        m.node_state_changed(Some(&fargate), Some(&fargate));
        m.node_state_changed(Some(&pending), Some(&unsupported));
        let text = m.render();
        assert!(
            text.contains(r#"ec2_topology_labeler_nodes{state="labelled",reason=""} 1"#),
            "{text}"
        );
        assert!(text.contains(r#"ec2_topology_labeler_nodes{state="pending",reason=""} 0"#));
        assert!(text.contains(r#"ec2_topology_labeler_nodes{state="skipped",reason="fargate"} 1"#));
        assert!(text.contains(
            r#"ec2_topology_labeler_nodes{state="not_described",reason="unsupported_instance_type"} 1"#
        ));
        assert!(text.contains(r#"ec2_topology_labeler_skipped_nodes_total{reason="fargate"} 1"#));
        m.node_state_changed(Some(&labelled), None);
        assert!(
            m.render()
                .contains(r#"ec2_topology_labeler_nodes{state="labelled",reason=""} 0"#)
        );
    }

    #[test]
    fn fleet_gauges_are_exported_by_the_leader_only() {
        let m = Metrics::new();
        m.node_state_changed(None, Some(&NodeState::Labelled));
        m.set_coverage(
            &[(
                ("p5.48xlarge".to_string(), "us-east-1a".to_string()),
                crate::coverage::Group {
                    nodes: 1,
                    with_layer: vec![1, 1, 1],
                    depth: 3,
                    full: 1,
                },
            )]
            .into(),
        );
        let follower = m.render();
        assert!(
            !follower.contains("ec2_topology_labeler_nodes{"),
            "{follower}"
        );
        assert!(!follower.contains("ec2_topology_labeler_coverage_nodes{"));
        assert!(follower.contains("ec2_topology_labeler_leader 0"));
        assert!(
            follower.trim_end().ends_with("# EOF"),
            "one exposition: {follower}"
        );
        m.set_leader(true);
        let leader = m.render();
        assert!(leader.contains("ec2_topology_labeler_nodes{"), "{leader}");
        assert!(leader.contains("ec2_topology_labeler_coverage_nodes{"));
        assert_eq!(leader.matches("# EOF").count(), 1);
        m.set_leader(false);
        assert!(!m.render().contains("ec2_topology_labeler_nodes{"));
    }

    #[test]
    fn not_described_tells_an_unsupported_type_from_one_not_known_yet() {
        assert_eq!(
            NotDescribed::of(Some("m7i.large")),
            NotDescribed::UnsupportedType
        );
        assert_eq!(NotDescribed::of(Some("p5.48xlarge")), NotDescribed::NotYet);
        assert_eq!(
            NotDescribed::of(None),
            NotDescribed::NotYet,
            "no instance-type label yet (the cloud controller has not set it) is not unsupported"
        );
        assert_eq!(NotDescribed::of(Some("")), NotDescribed::NotYet);
    }

    /// Series names a scrape can show, from the TYPE lines of the exposition.
    fn series_names(text: &str) -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            if (parts.next(), parts.next()) != (Some("#"), Some("TYPE")) {
                continue;
            }
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            for s in suffixes {
                out.insert(format!("{name}{s}"));
            }
        }
        out
    }

    #[test]
    fn coverage_gauges_follow_the_cells_and_drop_emptied_ones() {
        let m = Metrics::new();
        m.set_leader(true);
        let cell = |t: &str, nodes, full, layers: Vec<usize>| {
            (
                (t.to_string(), "us-east-1a".to_string()),
                crate::coverage::Group {
                    nodes,
                    with_layer: layers,
                    depth: 3,
                    full,
                },
            )
        };
        m.set_coverage(
            &[
                cell("p5.48xlarge", 50, 49, vec![49, 49, 49]),
                cell("gone", 1, 1, vec![1, 1, 1]),
            ]
            .into(),
        );
        let text = m.render();
        assert!(text.contains(r#"ec2_topology_labeler_coverage_nodes{instance_type="p5.48xlarge",zone="us-east-1a"} 50"#), "{text}");
        assert!(text.contains(r#"ec2_topology_labeler_coverage_full_nodes{instance_type="p5.48xlarge",zone="us-east-1a"} 49"#));
        assert!(text.contains(r#"ec2_topology_labeler_coverage_layer_nodes{instance_type="p5.48xlarge",zone="us-east-1a",layer="3"} 49"#));
        m.set_coverage(&[cell("p5.48xlarge", 50, 50, vec![50, 50, 50])].into());
        let text = m.render();
        assert!(
            !text.contains(r#"instance_type="gone""#),
            "an emptied cell's series go"
        );
        assert!(text.contains(r#"ec2_topology_labeler_coverage_full_nodes{instance_type="p5.48xlarge",zone="us-east-1a"} 50"#));
    }

    #[test]
    fn the_grafana_dashboard_only_uses_series_we_export() {
        let dashboard =
            include_str!("../../charts/ec2-topology-labeler/dashboards/ec2-topology-labeler.json");
        // Families appear in a scrape once they have a series: give each one.
        let exported = series_names(&every_family());
        let mut used = 0;
        for (i, _) in dashboard.match_indices("ec2_topology_labeler_") {
            let name: String = dashboard[i..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                exported.contains(&name),
                "dashboard uses {name}, not exported ({exported:?})"
            );
            used += 1;
        }
        assert!(used >= 10);
        // And every family has a panel.
        for name in &exported {
            let family = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            assert!(
                dashboard.contains(family),
                "the dashboard has no panel for {family}"
            );
        }
    }

    /// A scrape in which every family has a series (a family with none shows no sample line).
    pub(crate) fn every_family() -> String {
        let m = Metrics::new();
        m.set_leader(true);
        m.reconciled(Duration::from_millis(1));
        m.reconcile_failed("ec2_throttled");
        m.ec2_call("r", 1, Duration::from_millis(1), None);
        m.cache_hit();
        m.cache_miss();
        m.label_write("apply");
        m.node_state_changed(None, Some(&NodeState::Skipped("fargate")));
        m.publish_failed("volcano");
        m.hypernodes(1, 1, 0);
        m.hypernode_conflicts(0);
        m.clique_mismatches(0, 0);
        m.unpublished_nodes(&[("labels_disagree", 0)]);
        m.publish_halted(false);
        m.kueue_topology_mismatch("aws-network", false);
        m.kai_topology_mismatch("aws-network", false);
        m.set_coverage(
            &[(
                ("p5.48xlarge".to_string(), "us-east-1a".to_string()),
                crate::coverage::Group {
                    nodes: 1,
                    with_layer: vec![1, 1, 1],
                    depth: 3,
                    full: 1,
                },
            )]
            .into(),
        );
        m.label_conflict(&["cloud-controller-manager".to_string()]);
        m.event("sent");
        m.taint_released("labelled", Duration::from_secs(1));
        m.first_labelled(Duration::from_secs(1));
        m.slurm_topology_problems(0);
        m.set_reserved(&[crate::reservations::Series {
            network_node: "nn-leaf".into(),
            reservation: "cr-0123456789abcdef0".into(),
            instance_type: "p5.48xlarge".into(),
            reserved: 2,
            joined: 1,
        }]);
        m.set_interconnects([("cb-0123456789abcdef0", "ok")], &[]);
        m.interconnect_poll("ok");
        // Every process series, whatever this machine has (a cgroup memory limit or not).
        m.render_with(|out| {
            crate::metrics::process::encode_values(out, Some(1), Some(1.0), Some(1))
        })
    }

    /// Field manager names are whatever writers choose: at most 16 series of their own (plus
    /// `unknown` and `other`), each name cut to 64 characters.
    #[test]
    fn conflict_writers_have_bounded_cardinality() {
        let m = Metrics::new();
        for k in 0..100 {
            m.label_conflict(&[format!("script-{k}-{}", "x".repeat(200))]);
        }
        m.label_conflict(&[format!("script-3-{}", "x".repeat(200))]);
        let text = m.render();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("ec2_topology_labeler_label_conflict_writers_total{"))
            .collect();
        assert_eq!(series.len(), MAX_MANAGERS + 2, "{series:#?}");
        assert!(series.iter().all(|l| l.len() < 150), "{series:#?}");
        assert!(
            series
                .iter()
                .any(|l| l.contains("manager=\"other\"") && l.ends_with(" 84")),
            "{series:#?}"
        );
        assert!(
            series
                .iter()
                .any(|l| l.contains("script-3-") && l.ends_with(" 2")),
            "a manager seen before keeps its series: {series:#?}"
        );
    }

    #[test]
    fn docs_metrics_table_is_generated_from_the_code() {
        use std::collections::BTreeMap;
        let text = every_family();
        // name -> (type, help, label names)
        let mut families: BTreeMap<String, (String, String, Vec<String>)> = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                families.entry(name.to_string()).or_default().1 = help.to_string();
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
                families.entry(name.to_string()).or_default().0 = kind.to_string();
            }
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, _)) = line.split_once('{') else {
                continue;
            };
            let family = families
                .keys()
                .filter(|f| series.starts_with(f.as_str()))
                .max_by_key(|f| f.len())
                .cloned();
            let Some(family) = family else { continue };
            let labels: Vec<String> = line[series.len() + 1..]
                .split(['}'])
                .next()
                .unwrap_or_default()
                .split(',')
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_string()))
                .filter(|k| k != "le")
                .collect();
            let entry = &mut families.get_mut(&family).expect("family").2;
            for l in labels {
                if !entry.contains(&l) {
                    entry.push(l);
                }
            }
        }
        let mut t = String::from("| Metric | Type | Labels | What |\n| --- | --- | --- | --- |\n");
        for (name, (kind, help, labels)) in &families {
            let shown = match kind.as_str() {
                "counter" => format!("{name}_total"),
                "info" => format!("{name}_info"),
                _ => name.clone(),
            };
            let labels = labels
                .iter()
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join(", ");
            t.push_str(&format!(
                "| `{shown}` | {kind} | {labels} | {} |\n",
                crate::testing::docs::cell(help)
            ));
        }
        crate::testing::docs::check_generated("docs/operations.md", "metrics", &t);
    }

    #[test]
    fn ec2_calls_are_counted_by_outcome() {
        let m = Metrics::new();
        m.ec2_call("r", 100, Duration::from_millis(50), None);
        let throttled = Ec2Error::from_code("RequestLimitExceeded", "");
        m.ec2_call("r", 7, Duration::from_millis(50), Some(&throttled));
        let text = m.render();
        assert!(text.contains("ec2_topology_labeler_ec2_calls_total{outcome=\"ok\"} 1"));
        assert!(text.contains("ec2_topology_labeler_ec2_calls_total{outcome=\"throttled\"} 1"));
        assert!(text.contains("ec2_topology_labeler_ec2_instances_per_call_sum 107.0"));
    }
}

//! Every series the controller exports, registered once at start (`Metrics::new`): names,
//! help texts, buckets, and the label values created up front so that dashboards and alerts see
//! zeros rather than absent series.

use super::*;

impl Metrics {
    pub fn new() -> Self {
        crate::metrics::process::started();
        let mut registry = Registry::with_prefix("ec2_topology_labeler");
        let reconciles = Counter::default();
        registry.register("reconciles", "Node reconciles run", reconciles.clone());
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Node reconciles that failed, by error category",
            reconcile_errors.clone(),
        );
        let reconcile_duration = Histogram::new([
            0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ]);
        registry.register(
            "reconcile_duration_seconds",
            "Time per node reconcile, including waiting for EC2",
            reconcile_duration.clone(),
        );
        let ec2_calls = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "ec2_calls",
            "DescribeInstanceTopology calls, by outcome (ok, throttled, or an error category)",
            ec2_calls.clone(),
        );
        let ec2_duration =
            Histogram::new([0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]);
        registry.register(
            "ec2_call_duration_seconds",
            "DescribeInstanceTopology latency",
            ec2_duration.clone(),
        );
        let ec2_instances_per_call =
            Histogram::new([1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 75.0, 99.0, 100.0]);
        registry.register(
            "ec2_instances_per_call",
            "Instance IDs per DescribeInstanceTopology call",
            ec2_instances_per_call.clone(),
        );
        let cache_hits = Counter::default();
        registry.register(
            "cache_hits",
            "Topology lookups answered from the cache",
            cache_hits.clone(),
        );
        let cache_misses = Counter::default();
        registry.register(
            "cache_misses",
            "Topology lookups that needed EC2",
            cache_misses.clone(),
        );
        let reverified_early = Counter::default();
        registry.register(
            "reverified_early",
            "Answers re-verified ahead of their time, in the call of another that came due (so a fleet is re-verified in full calls)",
            reverified_early.clone(),
        );
        let label_writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "label_writes",
            "Node PATCH requests sent, by kind",
            label_writes.clone(),
        );
        let skips = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "skipped_nodes",
            "Times a node was found not to be an EC2 instance we can look up, by reason (counted when its reason changes)",
            skips.clone(),
        );
        let mut fleet = Registry::with_prefix("ec2_topology_labeler");
        let nodes = Family::<StateLabels, Gauge>::default();
        fleet.register(
            "nodes",
            "Nodes by labelling state and reason (leader only)",
            nodes.clone(),
        );
        let leader = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "leader",
            "1 while this replica holds the lease and writes",
            leader.clone(),
        );
        let publish_errors = Family::<PublisherLabels, Counter>::default();
        registry.register(
            "publish_errors",
            "Failed publisher runs (kueue, kai, volcano, slurm)",
            publish_errors.clone(),
        );
        let hypernodes = Gauge::<i64, AtomicI64>::default();
        fleet.register(
            "hypernodes",
            "Volcano HyperNodes we publish",
            hypernodes.clone(),
        );
        let hypernode_writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "hypernode_writes",
            "HyperNode writes, by kind (apply, delete)",
            hypernode_writes.clone(),
        );
        let hypernode_conflicts = Gauge::<i64, AtomicI64>::default();
        fleet.register(
            "hypernode_conflicts",
            "Network nodes seen under more than one parent (HyperNodes are not published then)",
            hypernode_conflicts.clone(),
        );
        let clique_mismatches = Family::<WriteLabels, Gauge>::default();
        fleet.register(
            "ultraserver_clique_mismatches",
            "Where the capacity blocks (UltraServers, as EC2 names them) and GPU Feature Discovery's NVLink cliques (nvidia.com/gpu.clique) disagree, by kind: block_holds_cliques (capacity blocks holding more than one clique), clique_spans_blocks (cliques over more than one capacity block); published nodes with both labels only",
            clique_mismatches.clone(),
        );
        let interconnect = Family::<InterconnectLabels, Gauge>::default();
        fleet.register(
            "ultraserver_interconnect",
            "What EC2 last said of the accelerator interconnect of each capacity block (UltraServer) a verified node is in (DescribeCapacityBlockStatus; --ultraserver-health): 1 on its status, ok, impaired or insufficient-data",
            interconnect.clone(),
        );
        let interconnect_polls = Family::<OutcomeLabels, Counter>::default();
        fleet.register(
            "ultraserver_interconnect_polls",
            "Rounds of asking EC2 about the capacity blocks' interconnects (--ultraserver-health), by outcome: ok, failed (EC2 unreachable, refusing or throttling: nothing changes on the nodes)",
            interconnect_polls.clone(),
        );
        let unpublished_nodes = Family::<ReasonLabels, Gauge>::default();
        fleet.register(
            "unpublished_nodes",
            "Nodes carrying our topology label keys that are left out of what we publish for schedulers (Kueue, KAI, Volcano, Slurm), by reason: labels_disagree (not what EC2 says of the instance), not_ec2 (no EC2 instance we verify: Hybrid, Fargate, another cloud, a malformed providerID), not_described (EC2 does not describe the instance or refuses its ID), unverified (no answer from EC2 yet), inconsistent (its path disagrees with the other nodes')",
            unpublished_nodes.clone(),
        );
        let publish_halted = Gauge::<i64, AtomicI64>::default();
        fleet.register(
            "publish_halted",
            "1 while nothing is published because more than a tenth (and more than 2) of the verified nodes disagree with the rest on where a network node sits; what was published stays",
            publish_halted.clone(),
        );
        let slurm_topology_problems = Gauge::<i64, AtomicI64>::default();
        fleet.register(
            "slurm_topology_problems",
            "Reasons the labels give no Slurm topology slurmctld would load (the ConfigMap is left as it was then)",
            slurm_topology_problems.clone(),
        );
        let kueue_mismatch = Family::<TopologyLabels, Gauge>::default();
        fleet.register(
            "kueue_topology_mismatch",
            "1 when a Kueue Topology of our name exists with other levels (left alone)",
            kueue_mismatch.clone(),
        );
        let kai_mismatch = Family::<TopologyLabels, Gauge>::default();
        fleet.register(
            "kai_topology_mismatch",
            "1 when a KAI Topology of our name exists with other levels (left alone)",
            kai_mismatch.clone(),
        );
        let reserved_instances = Family::<ReservedLabels, Gauge>::default();
        fleet.register(
            "reserved_instances",
            "Instances a live (active or pending) Capacity Reservation holds, by the deepest network node EC2 places it under (empty: not placed) (--capacity-reservations)",
            reserved_instances.clone(),
        );
        let reserved_joined = Family::<ReservedLabels, Gauge>::default();
        fleet.register(
            "reserved_instances_joined",
            "Nodes of this cluster joined from that reservation (Karpenter's karpenter.k8s.aws/capacity-reservation-id label) (--capacity-reservations)",
            reserved_joined.clone(),
        );
        let coverage_nodes = Family::<CellLabels, Gauge>::default();
        fleet.register(
            "coverage_nodes",
            "EC2 nodes per instance type and zone (the denominator of the coverage gauges)",
            coverage_nodes.clone(),
        );
        let coverage_full = Family::<CellLabels, Gauge>::default();
        fleet.register(
            "coverage_full_nodes",
            "Nodes carrying every layer their instance type has (its deepest node's depth)",
            coverage_full.clone(),
        );
        let coverage_layer = Family::<CellLayerLabels, Gauge>::default();
        fleet.register(
            "coverage_layer_nodes",
            "Nodes carrying layer labels 1 to `layer` (what a scheduler topology of that many levels sees)",
            coverage_layer.clone(),
        );
        let events = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "events",
            "Kubernetes Events by outcome: sent, failed, dropped_rate_limited (beyond the budget of 100 back to back and 5/s per type), dropped_queue_full",
            events.clone(),
        );
        let label_conflicts = Counter::default();
        registry.register(
            "label_conflicts",
            "Times another writer kept changing our labels on a node and writes were held",
            label_conflicts.clone(),
        );
        let label_conflict_writers = Family::<ManagerLabels, Counter>::default();
        registry.register(
            "label_conflict_writers",
            "Label conflicts by the other field manager that kept changing our labels (the cloud controller, a script): one per manager per hold; the first 16 managers by name, any later one as other",
            label_conflict_writers.clone(),
        );
        // Exported from the start (at 0), so a query on it matches something.
        label_conflict_writers
            .get_or_create(&ManagerLabels {
                manager: "unknown".into(),
            })
            .get();
        let taint_releases = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "startup_taint_releases",
            "Startup taints removed, by reason (labelled, unsupported, timeout)",
            taint_releases.clone(),
        );
        let verification_records = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "verification_records",
            "Nodes' verification records at their instance's first lookup in this process: trusted (no EC2 call), or why not (missing, unreadable, other_version, tampered, other_key, no_key, other_instance, other_boot, labels_changed, incomplete)",
            verification_records.clone(),
        );
        let ledger_shards = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "ledger_shards",
            "Verification ledger shards (ConfigMaps in the controller's namespace) by outcome: read, refused (its seal did not open: its nodes are asked about), written, write_failed (written at the next flush), too_large (not written)",
            ledger_shards.clone(),
        );
        let first_label_latency = Histogram::new(JOIN_BUCKETS);
        registry.register(
            "node_first_label_seconds",
            "From a node's creation (creationTimestamp, whole seconds) to our first write of its topology labels",
            first_label_latency.clone(),
        );
        let taint_release_latency = Histogram::new(JOIN_BUCKETS);
        registry.register(
            "startup_taint_release_seconds",
            "From a node's creation (creationTimestamp, whole seconds) to the removal of its startup taint",
            taint_release_latency.clone(),
        );
        let takeover = Histogram::new([
            0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ]);
        registry.register(
            "leader_first_decision_seconds",
            "From this replica taking the lease (or starting, without leader election) to its first reconcile decision as leader",
            takeover.clone(),
        );
        registry.register(
            "build",
            "Build information",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        // The bounded label sets start at 0, so every series a dashboard or an alert asks for
        // exists before the first occurrence (Prometheus' advice for counters with labels).
        for category in crate::Error::CATEGORIES {
            reconcile_errors
                .get_or_create(&ErrorLabels {
                    category: category.to_string(),
                })
                .get();
        }
        for outcome in [
            "ok",
            "throttled",
            "unauthorized",
            "service",
            "timeout",
            "transport",
        ] {
            ec2_calls
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.to_string(),
                })
                .get();
        }
        for kind in [
            "apply",
            "remove",
            "retire",
            "taint",
            "condition",
            "interconnect",
            "shape",
        ] {
            label_writes
                .get_or_create(&WriteLabels {
                    kind: kind.to_string(),
                })
                .get();
        }
        for kind in ["apply", "delete"] {
            hypernode_writes
                .get_or_create(&WriteLabels {
                    kind: kind.to_string(),
                })
                .get();
        }
        for reason in crate::provider_id::SkipReason::ALL {
            skips
                .get_or_create(&ReasonLabels {
                    reason: reason.as_str().to_string(),
                })
                .get();
        }
        for reason in ["labelled", "unsupported", "timeout"] {
            taint_releases
                .get_or_create(&ReasonLabels {
                    reason: reason.to_string(),
                })
                .get();
        }
        for outcome in
            std::iter::once("trusted").chain(crate::state::Distrust::ALL.iter().map(|d| d.as_str()))
        {
            verification_records
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.to_string(),
                })
                .get();
        }
        for outcome in ["read", "refused", "written", "write_failed", "too_large"] {
            ledger_shards
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.to_string(),
                })
                .get();
        }
        for outcome in [
            "sent",
            "failed",
            "dropped_rate_limited",
            "dropped_queue_full",
        ] {
            events
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.to_string(),
                })
                .get();
        }
        let api_calls_cut = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "api_calls_cut",
            "Kubernetes API calls cut short by the controller: fenced (a write not sent, or cancelled, because this replica no longer leads) or timeout (--kube-request-timeout, or a write's renew deadline)",
            api_calls_cut.clone(),
        );
        for reason in ["fenced", "timeout"] {
            api_calls_cut
                .get_or_create(&ReasonLabels {
                    reason: reason.to_string(),
                })
                .get();
        }
        let watch_errors = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "watch_errors",
            "Errors of the Node watch, by reason (forbidden, not_found, timeout, connect, api, decode, other); the watcher restarts after each, with backoff",
            watch_errors.clone(),
        );
        for reason in super::WATCH_ERROR_REASONS {
            watch_errors
                .get_or_create(&ReasonLabels {
                    reason: reason.to_string(),
                })
                .get();
        }
        let watch_unhealthy_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "node_watch_unhealthy_seconds",
            "How long the Node watch has been failing without a successful event since (0 while it works); readiness fails once it exceeds --watch-unhealthy-after",
            watch_unhealthy_seconds.clone(),
        );
        let task_restarts = Family::<TaskLabels, Counter>::default();
        registry.register(
            "task_restarts",
            "Restarts of a background task after it panicked or ended (it restarts with backoff)",
            task_restarts.clone(),
        );
        for task in super::TASKS {
            task_restarts
                .get_or_create(&TaskLabels {
                    task: task.to_string(),
                })
                .get();
        }
        Self {
            api_calls_cut,
            watch_errors,
            watch_unhealthy_seconds,
            task_restarts,
            registry,
            fleet,
            leading: std::sync::atomic::AtomicBool::new(false),
            reconciles,
            reconcile_errors,
            reconcile_duration,
            ec2_calls,
            ec2_duration,
            ec2_instances_per_call,
            cache_hits,
            cache_misses,
            reverified_early,
            label_writes,
            skips,
            nodes,
            leader,
            publish_errors,
            hypernodes,
            hypernode_writes,
            hypernode_conflicts,
            clique_mismatches,
            unpublished_nodes,
            publish_halted,
            slurm_topology_problems,
            kueue_mismatch,
            kai_mismatch,
            coverage_nodes,
            reserved_instances,
            reserved_joined,
            interconnect,
            interconnect_polls,
            coverage_full,
            coverage_layer,
            label_conflicts,
            label_conflict_writers,
            conflict_managers: std::sync::Mutex::default(),
            events,
            taint_releases,
            verification_records,
            ledger_shards,
            first_label_latency,
            taint_release_latency,
            takeover,
            took_lease_at: std::sync::Mutex::new(None),
            awaiting_first_decision: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
//! Properties of the pure logic, over generated inputs (proptest): whatever EC2 or a node says,
//! what we would write is valid for Kubernetes, deterministic, idempotent, and independent of
//! the order things arrive in.

use std::collections::BTreeMap;

use ec2_topology_labeler::{
    consistent,
    labels::{
        self, LabelScheme, LayerNumbering, is_valid_label_key, is_valid_label_value,
        sanitize_label_value,
    },
    provider_id,
    publish::volcano,
    topology::InstanceTopology,
    tree::{Forest, NodeView},
};
use proptest::prelude::*;

fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9-]{0,70}",
        ".{0,300}",
        "nn-[0-9a-f]{17}",
        "[ -~]{0,80}",
    ]
}

fn topology() -> impl Strategy<Value = InstanceTopology> {
    (
        prop::collection::vec(any_text(), 0..8),
        prop::option::of(any_text()),
        prop::option::of(any_text()),
        prop::option::of(any_text()),
    )
        .prop_map(
            |(network_nodes, zone_id, capacity_block_id, group_name)| InstanceTopology {
                instance_id: "i-0123456789abcdef0".into(),
                instance_type: Some("p5.48xlarge".into()),
                availability_zone: Some("us-west-2a".into()),
                zone_id,
                network_nodes,
                group_name,
                capacity_block_id,
            },
        )
}

fn scheme() -> impl Strategy<Value = LabelScheme> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(leaf, z, c, p)| {
        LabelScheme {
            numbering: if leaf {
                LayerNumbering::LeafFirst
            } else {
                LayerNumbering::TopFirst
            },
            zone_id_key: z.then(|| labels::EKS_ZONE_ID_KEY.to_string()),
            capacity_block_key: c.then(|| labels::CAPACITY_BLOCK_KEY.to_string()),
            placement_group_key: p.then(|| labels::PLACEMENT_GROUP_KEY.to_string()),
            ..LabelScheme::default()
        }
    })
}

fn apply(labels: &mut BTreeMap<String, String>, diff: &labels::MapDiff) {
    for k in diff.remove.keys() {
        labels.remove(k);
    }
    for (k, v) in &diff.add {
        labels.insert(k.clone(), v.clone());
    }
    for (k, (_, v)) in &diff.change {
        labels.insert(k.clone(), v.clone());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn derived_labels_are_always_valid_kubernetes_labels(s in scheme(), t in topology()) {
        if let Ok(d) = labels::desired(&s, &t) {
            for (k, v) in &d.labels {
                prop_assert!(is_valid_label_key(k), "key {k:?}");
                prop_assert!(is_valid_label_value(v), "value {v:?} of {k}");
            }
            prop_assert!(d.labels.keys().all(|k| s.is_family_label(k)));
        }
    }

    #[test]
    fn derivation_is_deterministic_and_applying_it_twice_changes_nothing(
        s in scheme(),
        t in topology(),
        current in prop::collection::btree_map("topology\\.k8s\\.aws/network-node-layer-[0-9]{1,2}|[a-z./-]{1,20}", "[a-z0-9-]{1,10}", 0..8),
    ) {
        let once = labels::desired(&s, &t);
        prop_assert_eq!(&once, &labels::desired(&s, &t));
        if let Ok(d) = once {
            let mut node = current.clone();
            let diff = labels::diff(&s, &node, &BTreeMap::new(), &d);
            apply(&mut node, &diff.labels);
            let again = labels::diff(&s, &node, &BTreeMap::new(), &d);
            prop_assert!(again.labels.is_empty(), "second diff {again:?}");
            // Keys outside the family are exactly as they were.
            for (k, v) in &current {
                if !s.is_family_label(k) {
                    prop_assert_eq!(node.get(k), Some(v));
                }
            }
        }
    }

    #[test]
    fn the_final_labels_depend_only_on_the_last_answer(
        s in scheme(),
        answers in prop::collection::vec(topology(), 1..5),
    ) {
        // Whatever answers came before, the node ends with what the last answer says.
        let mut node = BTreeMap::new();
        let mut last_good = None;
        for t in &answers {
            if let Ok(d) = labels::desired(&s, t) {
                let diff = labels::diff(&s, &node, &BTreeMap::new(), &d);
                apply(&mut node, &diff.labels);
                last_good = Some(d);
            }
        }
        if let Some(d) = last_good {
            let fresh = {
                let mut n = BTreeMap::new();
                let diff = labels::diff(&s, &n, &BTreeMap::new(), &d);
                apply(&mut n, &diff.labels);
                n
            };
            // Keys the last answer said nothing about (a missing zone ID) may remain from before.
            let mut comparable = node.clone();
            for k in &d.keep {
                comparable.remove(k);
            }
            prop_assert_eq!(comparable, fresh);
        }
    }

    #[test]
    fn provider_id_parsing_is_total_and_only_yields_valid_instances(pid in any_text()) {
        if let Ok(i) = provider_id::parse(&pid) {
            prop_assert!(provider_id::is_instance_id(&i.instance_id));
        }
        let _ = provider_id::region_of_zone(&pid);
        prop_assert!(provider_id::for_log(&pid).len() < 400);
    }

    #[test]
    fn sanitised_values_are_valid_stable_and_keep_valid_names(raw in any_text()) {
        let v = sanitize_label_value(&raw);
        prop_assert!(is_valid_label_value(&v), "{raw:?} -> {v:?}");
        prop_assert_eq!(&v, &sanitize_label_value(&raw));
        if is_valid_label_value(&raw) {
            prop_assert_eq!(v, raw);
        }
    }

    #[test]
    fn distinct_invalid_names_stay_distinct(a in ".{1,60}", b in ".{1,60}") {
        prop_assume!(a != b);
        prop_assert_ne!(sanitize_label_value(&a), sanitize_label_value(&b));
    }

    #[test]
    fn trees_and_hypernodes_do_not_depend_on_node_order(
        paths in prop::collection::vec(prop::collection::vec("nn-[a-c][0-3]", 3..5), 1..30),
        seed in any::<u64>(),
    ) {
        let s = LabelScheme::default();
        let views: Vec<NodeView> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut v = NodeView {
                    ready: Some(i % 3 != 0),
                    ..NodeView::labelled(&format!("node-{i}"), &s, &p.iter().map(String::as_str).collect::<Vec<_>>())
                };
                // Some in UltraServers (a capacity block may span leaves).
                if let (Some(k), true) = (&s.capacity_block_key, i % 4 == 0) {
                    v.labels.insert(k.clone(), format!("cr-{}", i % 3));
                }
                v
            })
            .collect();
        let mut shuffled = views.clone();
        fastrand::Rng::with_seed(seed).shuffle(&mut shuffled);
        let (a, b) = (Forest::build(&s, &views), Forest::build(&s, &shuffled));
        let norm = |f: &Forest| {
            f.roots.iter().map(|(k, d)| (k.clone(), sorted(d.clone()))).collect::<BTreeMap<_, _>>()
        };
        prop_assert_eq!(norm(&a), norm(&b));
        prop_assert_eq!(&a.conflicts, &b.conflicts);
        prop_assert_eq!(volcano::desired(&s, &views, "p", volcano::Tier0::UltraServers), volcano::desired(&s, &shuffled, "p", volcano::Tier0::UltraServers));
        let names = |r: Result<Vec<volcano::HyperNode>, _>| r.map(|hs| hs.into_iter().map(|h| h.name).collect::<Vec<_>>());
        if let Ok(hs) = names(volcano::desired(&s, &views, "p", volcano::Tier0::UltraServers)) {
            for n in hs {
                prop_assert!(n.len() <= 63 && n.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever paths the nodes carry (few names, so that they collide: network nodes under
    /// two parents, at two layers, mixed depths), what `consistent` keeps makes a tree with no
    /// conflict, HyperNodes Volcano takes and Slurm files slurmctld would load; it leaves out
    /// only nodes it names, and the same ones whatever order the nodes came in.
    #[test]
    fn what_consistent_keeps_always_publishes(
        paths in prop::collection::vec(prop::collection::vec("nn-[a-c][0-2]", 1..5), 1..40),
        seed in any::<u64>(),
    ) {
        let s = LabelScheme::default();
        let views: Vec<NodeView> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| NodeView::labelled(&format!("node-{i}"), &s, &p.iter().map(String::as_str).collect::<Vec<_>>()))
            .collect();
        let (kept, out) = consistent::consistent(&s, views.clone());
        prop_assert_eq!(kept.len() + out.len(), views.len());
        prop_assert!(Forest::build(&s, &kept).conflicts.is_empty());
        prop_assert!(volcano::desired(&s, &kept, "p", volcano::Tier0::UltraServers).is_ok());
        if !kept.is_empty() {
            let files = ec2_topology_labeler::slurm::Files { tree_topology: "topo-switch".into(), switches_only: false };
            let problems = ec2_topology_labeler::slurm::data(&s, &files, &kept).err().unwrap_or_default();
            prop_assert!(
                problems.iter().all(|p| !matches!(p, ec2_topology_labeler::slurm::Problem::TwoParents(_) | ec2_topology_labeler::slurm::Problem::DefinedTwice(_))),
                "{:?}", problems
            );
        }
        let mut shuffled = views;
        fastrand::Rng::with_seed(seed).shuffle(&mut shuffled);
        let (kept2, _) = consistent::consistent(&s, shuffled);
        let names = |k: &[NodeView]| k.iter().map(|n| n.name.clone()).collect::<std::collections::BTreeSet<_>>();
        prop_assert_eq!(names(&kept), names(&kept2));
    }
}

/// A domain with its node lists sorted (order of nodes under one switch is not meaningful).
fn sorted(mut d: ec2_topology_labeler::tree::Domain) -> ec2_topology_labeler::tree::Domain {
    d.nodes.sort_by(|a, b| a.name.cmp(&b.name));
    d.children = d
        .children
        .into_iter()
        .map(|(k, c)| (k, sorted(c)))
        .collect();
    d
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever lease duration and renew grace an operator gives, a setting `run` accepts keeps
    /// three renewal attempts, each with a retry period to finish, inside the renew deadline, and
    /// at least a second between the
    /// deadline (when a leader stops writing) and the lease's expiry (when another may start).
    #[test]
    fn every_accepted_lease_setting_keeps_renewals_inside_the_deadline(
        duration_ms in prop_oneof![(0u64..3_700).prop_map(|s| s * 1000), 0u64..3_700_000],
        grace_ms in prop_oneof![(0u64..3_700).prop_map(|s| s * 1000), 0u64..3_700_000],
    ) {
        use clap::Parser;
        use ec2_topology_labeler::{cmd::{Cli, Command}, leader::{RENEWALS_PER_DEADLINE, Timings}};
        let (d, g) = (format!("{duration_ms}ms"), format!("{grace_ms}ms"));
        let Ok(cli) = Cli::try_parse_from([
            "ec2-topology-labeler", "run",
            "--leader-election-lease-duration", d.as_str(),
            "--leader-election-renew-grace", g.as_str(),
        ]) else {
            // Refused by a flag's own range.
            return Ok(());
        };
        let accepted = cli.check().is_ok();
        let Command::Run(args) = cli.command else { panic!("parsed as run") };
        let timings = Timings::from_args(&args.leader);
        prop_assert_eq!(accepted, timings.is_ok());
        if let Ok(t) = timings {
            prop_assert!(t.retry_period * (RENEWALS_PER_DEADLINE + 1) <= t.renew_deadline, "{t:?}");
            prop_assert!(t.renew_deadline + std::time::Duration::from_secs(1) <= t.lease_duration, "{t:?}");
        }
    }
}

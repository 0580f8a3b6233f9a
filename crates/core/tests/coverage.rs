#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
//! Coverage by instance type and zone, from the nodes' labels.

use ec2_topology_core::{
    coverage::{Coverage, INSTANCE_TYPE_LABEL, ZONE_LABEL, cells, depth_of, short_of},
    labels::LabelScheme,
    tree::NodeView,
};

fn node(name: &str, ty: &str, zone: &str, path: &[&str]) -> NodeView {
    let s = LabelScheme::default();
    let mut n = NodeView::labelled(name, &s, path);
    n.labels.insert(INSTANCE_TYPE_LABEL.into(), ty.into());
    n.labels.insert(ZONE_LABEL.into(), zone.into());
    n
}

#[test]
fn each_type_is_judged_by_its_own_depth_and_unlabelled_types_show_no_percentage() {
    let mut nodes: Vec<NodeView> = (0..49)
        .map(|k| {
            node(
                &format!("p5-{k}"),
                "p5.48xlarge",
                "us-east-1a",
                &["a", "b", "c"],
            )
        })
        .collect();
    // One p5 still waiting for its labels.
    nodes.push(node("p5-new", "p5.48xlarge", "us-east-1a", &[]));
    // Four-layer type: one node carries only three layers (a stale label set).
    nodes.push(node(
        "b200-0",
        "p6-b200.48xlarge",
        "us-east-1b",
        &["a", "b", "c", "d"],
    ));
    nodes.push(node(
        "b200-1",
        "p6-b200.48xlarge",
        "us-east-1b",
        &["a", "b", "c"],
    ));
    // A type EC2 does not describe.
    nodes.push(node("m5-0", "m5.large", "us-east-1b", &[]));

    let cov = Coverage::build(&LabelScheme::default(), &nodes);
    let p5 = &cov.by_instance_type["p5.48xlarge"];
    assert_eq!((p5.nodes, p5.depth, p5.full), (50, 3, 49));
    assert_eq!(p5.with_layer, vec![49, 49, 49]);
    assert!((p5.percent_full() - 98.0).abs() < 1e-9);
    let b200 = &cov.by_instance_type["p6-b200.48xlarge"];
    assert_eq!((b200.depth, b200.full), (4, 1), "judged against 4 layers");
    assert_eq!(b200.with_layer, vec![2, 2, 2, 1]);
    let m5 = &cov.by_instance_type["m5.large"];
    assert_eq!((m5.nodes, m5.depth, m5.full), (1, 0, 0));
    assert_eq!(cov.by_zone["us-east-1b"].nodes, 3);

    let text = cov.render();
    let p5_row = text
        .lines()
        .find(|l| l.contains("p5.48xlarge"))
        .expect("p5 row");
    assert!(p5_row.trim_end().ends_with("98%"), "{p5_row}");
    let m5_row = text
        .lines()
        .find(|l| l.contains("m5.large"))
        .expect("m5 row");
    assert!(m5_row.trim_end().ends_with('-'), "{m5_row}");
}

#[test]
fn nodes_without_the_well_known_labels_are_grouped_as_none() {
    let s = LabelScheme::default();
    let cov = Coverage::build(&s, &[NodeView::labelled("a", &s, &["x", "y", "z"])]);
    assert_eq!(cov.by_instance_type["(none)"].full, 1);
    assert_eq!(cov.by_zone["(none)"].nodes, 1);
}

/// The metric's cells: per (type, zone), each node judged against its type's depth in any zone,
/// and a padded node (uniform depth) counted at its real depth.
#[test]
fn cells_judge_each_zone_against_the_types_depth() {
    let s = LabelScheme::default();
    let t = |x: &str| Some(x.to_string());
    let cells = cells([
        (t("p6-b200.48xlarge"), t("us-east-1a"), 4),
        (t("p6-b200.48xlarge"), t("us-east-1b"), 3),
        (t("p6-b200.48xlarge"), t("us-east-1b"), 4),
        (t("p5.48xlarge"), t("us-east-1a"), 3),
        (t("p5.48xlarge"), None, 0),
    ]);
    let b = &cells[&("p6-b200.48xlarge".into(), "us-east-1b".into())];
    assert_eq!((b.nodes, b.depth, b.full), (2, 4, 1));
    assert_eq!(b.with_layer, vec![2, 2, 2, 1]);
    let none = &cells[&("p5.48xlarge".into(), "(none)".into())];
    assert_eq!((none.nodes, none.depth, none.full), (1, 3, 0));
    let padded = NodeView::labelled("n", &s, &["a", "b", "c", "c"]);
    assert_eq!(depth_of(&s, |k| padded.labels.get(k).cloned()), 3);
    let two = NodeView::labelled("g", &s, &["a", "b"]);
    assert_eq!(depth_of(&s, |k| two.labels.get(k).cloned()), 2);
    assert_eq!(depth_of(&s, |_| None), 0);
}

/// Issue 26.11: a zone of 3- and 4-layer types, every node fully labelled, is 100 % "all"
/// (`make demo` printed 14 %: each node was judged against the deepest type in the zone).
#[test]
fn a_zone_judges_each_node_against_its_own_types_depth() {
    let nodes = [
        node("p5-0", "p5.48xlarge", "us-east-1a", &["a", "b", "c"]),
        node("p5-1", "p5.48xlarge", "us-east-1a", &["a", "b", "d"]),
        node(
            "b200-0",
            "p6-b200.48xlarge",
            "us-east-1a",
            &["a", "e", "f", "g"],
        ),
        // One short node: counted as not full in its type and its zone alike.
        node("b200-1", "p6-b200.48xlarge", "us-east-1a", &["a", "e", "f"]),
    ];
    let cov = Coverage::build(&LabelScheme::default(), &nodes);
    let zone = &cov.by_zone["us-east-1a"];
    assert_eq!((zone.nodes, zone.depth, zone.full), (4, 4, 3));
    assert!((zone.percent_full() - 75.0).abs() < 1e-9);
    assert_eq!(cov.by_instance_type["p5.48xlarge"].full, 2);
    assert_eq!(cov.by_instance_type["p6-b200.48xlarge"].full, 1);
}

/// Issue 26.4: with `--uniform-depth 4` a 3-layer node padded to four labels is in a 4-level
/// Kueue Topology: not short of it (its path depth, 3, made a false Warning per padded node).
#[test]
fn a_padded_node_is_not_short_of_a_uniform_topology() {
    let s = LabelScheme {
        uniform_depth: Some(4),
        ..LabelScheme::default()
    };
    let padded = NodeView::labelled("n", &s, &["a", "b", "c", "c"]);
    let label = |k: &str| padded.labels.get(k).cloned();
    assert_eq!(depth_of(&s, label), 3, "its real depth");
    assert_eq!(short_of(&s, 4, label), None, "but all four levels carried");
    let two = NodeView::labelled("g", &s, &["a", "b"]);
    assert_eq!(short_of(&s, 4, |k| two.labels.get(k).cloned()), Some(2));
    assert_eq!(short_of(&s, 4, |_| None), None, "not labelled: not short");
}

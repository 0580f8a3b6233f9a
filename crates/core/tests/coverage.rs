//! Coverage by instance type and zone, from the nodes' labels.

use ec2_topology_core::{
    coverage::{Coverage, INSTANCE_TYPE_LABEL, ZONE_LABEL},
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

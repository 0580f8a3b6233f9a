//! Slurm's topology files from the pure tree, against golden files (`UPDATE_GOLDEN=1` rewrites
//! them; read the diff before committing).

use ec2_topology_core::{
    labels::LabelScheme,
    slurm,
    tree::{Forest, NodeView},
};

fn check(name: &str, got: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, got).expect("write golden file");
    }
    let want = std::fs::read_to_string(&path).expect("golden file");
    assert_eq!(got, want, "{name} differs from its golden file");
}

/// Two top-level network nodes; 3-layer p5s and 4-layer p6e-gb200s; one node not labelled yet.
fn mixed() -> Forest {
    let s = LabelScheme::default();
    let mut nodes = vec![
        NodeView::labelled("p5-a", &s, &["nn-top1", "nn-mid1", "nn-leaf1"]),
        NodeView::labelled("p5-b", &s, &["nn-top1", "nn-mid1", "nn-leaf1"]),
        NodeView::labelled("p5-c", &s, &["nn-top1", "nn-mid1", "nn-leaf2"]),
        NodeView::labelled(
            "gb200-a",
            &s,
            &["nn-top2", "nn-mid2", "nn-spine2", "nn-leaf3"],
        ),
        NodeView::labelled(
            "gb200-b",
            &s,
            &["nn-top2", "nn-mid2", "nn-spine2", "nn-leaf3"],
        ),
    ];
    let mut pending = NodeView::labelled("new-node", &s, &[]);
    pending.labels.clear();
    nodes.push(pending);
    Forest::build(&s, &nodes)
}

#[test]
fn topology_conf_names_every_switch_once_with_its_children() {
    let conf = slurm::topology_conf(&mixed());
    check("mixed.topology.conf", &conf);
    // Every network node once, as a SwitchName.
    for sw in [
        "nn-top1",
        "nn-mid1",
        "nn-leaf1",
        "nn-leaf2",
        "nn-top2",
        "nn-mid2",
        "nn-spine2",
        "nn-leaf3",
        "root",
        "unlabelled",
    ] {
        let n = conf
            .lines()
            .filter(|l| l.starts_with(&format!("SwitchName={sw} ")))
            .count();
        assert_eq!(n, 1, "{sw} once in\n{conf}");
    }
    assert!(conf.contains("SwitchName=nn-leaf1 Nodes=p5-a,p5-b\n"));
    assert!(conf.contains("SwitchName=root Switches=nn-top1,nn-top2,unlabelled\n"));
    assert!(conf.contains("SwitchName=unlabelled Nodes=new-node\n"));
}

#[test]
fn topology_yaml_is_one_default_tree_topology() {
    let yaml = slurm::topology_yaml(&mixed(), "topo-switch");
    check("mixed.topology.yaml", &yaml);
    assert!(
        yaml.contains("- topology: topo-switch\n  cluster_default: true\n  tree:\n    switches:\n")
    );
    assert!(yaml.contains("      - switch: nn-leaf3\n        nodes: gb200-a,gb200-b\n"));
    assert!(yaml.contains("      - switch: nn-spine2\n        children: nn-leaf3\n"));
}

#[test]
fn one_top_level_network_node_needs_no_root_and_an_empty_cluster_no_switches() {
    let s = LabelScheme::default();
    let one = Forest::build(&s, &[NodeView::labelled("a", &s, &["t", "m", "l"])]);
    let conf = slurm::topology_conf(&one);
    assert!(!conf.contains("SwitchName=root"), "{conf}");
    assert_eq!(
        conf.lines()
            .filter(|l| l.starts_with("SwitchName="))
            .count(),
        3
    );
    let empty = slurm::topology_yaml(&Forest::default(), "t");
    assert!(empty.ends_with("    switches: []\n"), "{empty}");
}

#[test]
fn names_yaml_would_misread_are_quoted() {
    let s = LabelScheme::default();
    let forest = Forest::build(&s, &[NodeView::labelled("yes", &s, &["t", "m", "1e3"])]);
    let yaml = slurm::topology_yaml(&forest, "on");
    assert!(yaml.contains("- topology: \"on\"\n"), "{yaml}");
    assert!(
        yaml.contains("- switch: \"1e3\"\n        nodes: \"yes\"\n"),
        "{yaml}"
    );
}

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

/// What slurmctld 22.05 refuses in `topology.conf` (each is `fatal`, at start and on `scontrol
/// reconfigure`): a switch with both `Switches=` and `Nodes=`, one with neither, and a switch
/// name defined twice. Returns the refusals found.
fn slurmctld_refusals(conf: &str) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for line in conf.lines().filter(|l| !l.starts_with('#')) {
        let name = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("SwitchName="))
            .unwrap_or_default();
        let has = |k: &str| line.split_whitespace().any(|w| w.starts_with(k));
        match (has("Switches="), has("Nodes=")) {
            (true, true) => out.push(format!("{name}: both child switches and nodes")),
            (false, false) => out.push(format!("{name}: neither child switches nor nodes")),
            _ => {}
        }
        if !seen.insert(name.to_string()) {
            out.push(format!("{name}: defined twice"));
        }
    }
    out
}

#[test]
fn a_network_node_that_is_a_leaf_and_a_parent_gives_a_file_slurmctld_loads() {
    let s = LabelScheme::default();
    // nn-c is the switch of two 3-layer instances and the parent of a 4-layer one's switch.
    let nodes = [
        NodeView::labelled("p5-a", &s, &["nn-a", "nn-b", "nn-c"]),
        NodeView::labelled("p5-b", &s, &["nn-a", "nn-b", "nn-c"]),
        NodeView::labelled("b200-a", &s, &["nn-a", "nn-b", "nn-c", "nn-d"]),
    ];
    let conf = slurm::topology_conf(&Forest::build(&s, &nodes));
    assert_eq!(slurmctld_refusals(&conf), Vec::<String>::new(), "{conf}");
}

#[test]
fn a_network_node_named_at_two_layers_gives_a_file_slurmctld_loads() {
    let s = LabelScheme::default();
    // Labels that disagree: nn-x is a layer-2 node in one path, layer 3 in another.
    let nodes = [
        NodeView::labelled("a", &s, &["nn-t", "nn-x", "nn-l"]),
        NodeView::labelled("b", &s, &["nn-t", "nn-m", "nn-x"]),
    ];
    let conf = slurm::topology_conf(&Forest::build(&s, &nodes));
    assert_eq!(slurmctld_refusals(&conf), Vec::<String>::new(), "{conf}");
}

#[test]
fn a_network_node_under_two_parents_gives_a_file_slurmctld_loads() {
    let s = LabelScheme::default();
    let nodes = [
        NodeView::labelled("a", &s, &["nn-t", "nn-m1", "nn-l"]),
        NodeView::labelled("b", &s, &["nn-t", "nn-m2", "nn-l"]),
    ];
    let conf = slurm::topology_conf(&Forest::build(&s, &nodes));
    assert_eq!(slurmctld_refusals(&conf), Vec::<String>::new(), "{conf}");
}

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
//! Slurm's topology files from the pure tree, against golden files (`UPDATE_GOLDEN=1` rewrites
//! them; read the diff before committing).

use ec2_topology_core::{
    labels::LabelScheme,
    slurm::{self, Blocks, Options, Problem},
    tree::{Conflict, Forest, NodeView},
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
    let conf = slurm::topology_conf(&mixed()).unwrap();
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
    let yaml = slurm::topology_yaml(&mixed(), "topo-switch", &Options::default()).unwrap();
    check("mixed.topology.yaml", &yaml);
    assert!(
        yaml.contains("- topology: topo-switch\n  cluster_default: true\n  tree:\n    switches:\n")
    );
    assert!(yaml.contains("      - switch: nn-leaf3\n        nodes: gb200-a,gb200-b\n"));
    assert!(yaml.contains("      - switch: nn-spine2\n        children: nn-leaf3\n"));
}

#[test]
fn one_top_level_network_node_needs_no_root() {
    let s = LabelScheme::default();
    let one = Forest::build(&s, &[NodeView::labelled("a", &s, &["t", "m", "l"])]);
    let conf = slurm::topology_conf(&one).unwrap();
    assert!(!conf.contains("SwitchName=root"), "{conf}");
    assert_eq!(
        conf.lines()
            .filter(|l| l.starts_with("SwitchName="))
            .count(),
        3
    );
}

#[test]
fn an_empty_fleet_gets_one_switch_in_topology_yaml_and_no_topology_conf() {
    // slurmctld refuses a tree without switches (26.05: fatal in both files); 22.05 refuses a
    // topology.conf switch with neither children nor nodes, 26.05 takes one in topology.yaml.
    let empty = slurm::topology_yaml(&Forest::default(), "t", &Options::default()).unwrap();
    assert!(
        empty.ends_with("    switches:\n      - switch: root\n"),
        "{empty}"
    );
    assert_eq!(
        slurm::topology_conf(&Forest::default()),
        Err(vec![Problem::NoSwitch])
    );
}

#[test]
fn names_yaml_would_misread_are_quoted() {
    let s = LabelScheme::default();
    let forest = Forest::build(&s, &[NodeView::labelled("yes", &s, &["t", "m", "1e3"])]);
    let yaml = slurm::topology_yaml(&forest, "on", &Options::default()).unwrap();
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
    let conf = slurm::topology_conf(&Forest::build(&s, &nodes)).unwrap();
    assert_eq!(slurmctld_refusals(&conf), Vec::<String>::new(), "{conf}");
    // Each node in the switch named after its deepest network node; nn-c+ stands for nn-c as
    // the parent of nn-d.
    assert!(conf.contains("SwitchName=nn-c Nodes=p5-a,p5-b\n"), "{conf}");
    assert!(conf.contains("SwitchName=nn-d Nodes=b200-a\n"), "{conf}");
    assert!(
        conf.contains("SwitchName=nn-c+ Switches=nn-c,nn-d\n"),
        "{conf}"
    );
    assert!(conf.contains("SwitchName=nn-b Switches=nn-c+\n"), "{conf}");
    check("leaf-and-parent.topology.conf", &conf);
}

#[test]
fn leaf_and_parent_nests_at_every_layer() {
    let s = LabelScheme::default();
    let nodes = [
        NodeView::labelled("two", &s, &["nn-a", "nn-b"]),
        NodeView::labelled("three", &s, &["nn-a", "nn-b", "nn-c"]),
        NodeView::labelled("four", &s, &["nn-a", "nn-b", "nn-c", "nn-d"]),
    ];
    let conf = slurm::topology_conf(&Forest::build(&s, &nodes)).unwrap();
    assert_eq!(slurmctld_refusals(&conf), Vec::<String>::new(), "{conf}");
    assert!(
        conf.contains("SwitchName=nn-b+ Switches=nn-b,nn-c+\n"),
        "{conf}"
    );
    assert!(conf.contains("SwitchName=nn-a Switches=nn-b+\n"), "{conf}");
}

#[test]
fn a_network_node_named_at_two_layers_gives_no_file() {
    let s = LabelScheme::default();
    // Labels that disagree: nn-x is a layer-2 node in one path, layer 3 in another.
    let nodes = [
        NodeView::labelled("a", &s, &["nn-t", "nn-x", "nn-l"]),
        NodeView::labelled("b", &s, &["nn-t", "nn-m", "nn-x"]),
    ];
    let forest = Forest::build(&s, &nodes);
    let want = Err(vec![Problem::DefinedTwice("nn-x".into())]);
    assert_eq!(slurm::topology_conf(&forest), want);
    assert_eq!(
        slurm::topology_yaml(&forest, "t", &Options::default()),
        want
    );
}

#[test]
fn a_network_node_under_two_parents_gives_no_file() {
    let s = LabelScheme::default();
    let nodes = [
        NodeView::labelled("a", &s, &["nn-t", "nn-m1", "nn-l"]),
        NodeView::labelled("b", &s, &["nn-t", "nn-m2", "nn-l"]),
    ];
    let forest = Forest::build(&s, &nodes);
    assert_eq!(
        slurm::topology_conf(&forest),
        Err(vec![Problem::TwoParents(Conflict {
            network_node: "nn-l".into(),
            layer: 3,
            parents: vec!["nn-m1".into(), "nn-m2".into()],
        })])
    );
}

#[test]
fn a_network_node_named_like_our_switches_or_empty_gives_no_file() {
    let s = LabelScheme::default();
    let nodes = [
        NodeView::labelled("a", &s, &["root", "nn-m", "nn-l"]),
        NodeView::labelled("b", &s, &["nn-t2", "nn-m2", "nn-l2"]),
        NodeView::labelled("c", &s, &["nn-t3", "", "nn-l3"]),
    ];
    assert_eq!(
        slurm::topology_conf(&Forest::build(&s, &nodes)),
        Err(vec![
            Problem::DefinedTwice("root".into()),
            Problem::BadName(String::new())
        ])
    );
}

#[test]
fn every_file_slurmctld_would_load_for_the_shapes_we_produce() {
    let s = LabelScheme::default();
    let eks = |i: u32| format!("ip-10-0-{}-{}.us-west-2.compute.internal", i / 200, i % 200);
    let shapes: Vec<Vec<NodeView>> = vec![
        vec![],
        vec![
            NodeView::labelled("x", &s, &[]),
            NodeView::labelled("y", &s, &[]),
        ],
        (0..300)
            .map(|i| NodeView::labelled(&eks(i), &s, &["nn-t", "nn-m", &format!("nn-l{}", i % 7)]))
            .collect(),
    ];
    for nodes in shapes {
        let forest = Forest::build(&s, &nodes);
        if let Ok(conf) = slurm::topology_conf(&forest) {
            assert_eq!(slurmctld_refusals(&conf), Vec::<String>::new(), "{conf}");
        }
        let yaml = slurm::topology_yaml(&forest, "t", &Options::default()).unwrap();
        assert!(yaml.contains("      - switch: "), "{yaml}");
    }
}

#[test]
fn switches_only_leaves_node_names_out_and_keeps_every_leaf_name() {
    let s = LabelScheme::default();
    let mut cb = NodeView::labelled("gb-a", &s, &["nn-a", "nn-b", "nn-c", "nn-d"]);
    cb.labels.insert(
        "ec2-topology-labeler.io/capacity-block-id".into(),
        "cr-1".into(),
    );
    let nodes = [
        NodeView::labelled("p5-a", &s, &["nn-a", "nn-b", "nn-c"]),
        cb,
        NodeView {
            labels: Default::default(),
            ..NodeView::labelled("bare", &s, &[])
        },
    ];
    let forest = Forest::build(&s, &nodes);
    let opts = Options {
        switches_only: true,
        blocks: Some(Blocks::of(&s, &nodes, "topo-block")),
    };
    let yaml = slurm::topology_yaml(&forest, "topo-switch", &opts).unwrap();
    check("switches-only.topology.yaml", &yaml);
    assert!(!yaml.contains("nodes:"), "{yaml}");
    assert!(!yaml.contains("unlabelled"), "{yaml}");
    // The leaves, without children or nodes; nn-c as a parent above them.
    assert!(
        yaml.contains("      - switch: nn-d\n      - switch: nn-c\n      - switch: \"nn-c+\"\n"),
        "{yaml}"
    );
    assert!(
        yaml.contains("    block_sizes: [1]\n    blocks:\n      - block: cr-1\n"),
        "{yaml}"
    );
    // With `--ultraserver-shape`, the block's size as EC2 counts it, not the nodes that joined.
    let mut sized = nodes.clone();
    sized[1].labels.insert(
        "ec2-topology-labeler.io/capacity-block-size".into(),
        "18".into(),
    );
    let sized_opts = Options {
        switches_only: true,
        blocks: Some(Blocks::of(&s, &sized, "topo-block")),
    };
    let yaml18 =
        slurm::topology_yaml(&Forest::build(&s, &sized), "topo-switch", &sized_opts).unwrap();
    assert!(yaml18.contains("    block_sizes: [18]\n"), "{yaml18}");
    let with_nodes = Options {
        switches_only: false,
        ..opts
    };
    let yaml = slurm::topology_yaml(&forest, "topo-switch", &with_nodes).unwrap();
    assert!(
        yaml.contains("- topology: topo-block\n  block:\n    blocks:\n      - block: cr-1\n        nodes: gb-a\n"),
        "{yaml}"
    );
}

#[test]
fn every_name_of_the_slinky_annotation_is_a_leaf_or_block_of_topology_yaml() {
    use ec2_topology_core::labels::{CAPACITY_BLOCK_KEY, SlinkySpec, slinky_spec};
    let s = LabelScheme {
        slinky: Some(SlinkySpec {
            tree_topology: "topo-switch".into(),
            block_topology: Some("topo-block".into()),
        }),
        ..LabelScheme::default()
    };
    let mut nodes = vec![
        NodeView::labelled("p5-a", &s, &["nn-a", "nn-b", "nn-c"]),
        NodeView::labelled("b200-a", &s, &["nn-a", "nn-b", "nn-c", "nn-d"]),
        NodeView::labelled("two", &s, &["nn-a", "nn-b"]),
        NodeView::labelled("gb-a", &s, &["nn-x", "nn-y", "nn-z", "nn-w"]),
    ];
    nodes[3]
        .labels
        .insert(CAPACITY_BLOCK_KEY.into(), "cr-1".into());
    let forest = Forest::build(&s, &nodes);
    for switches_only in [false, true] {
        let opts = Options {
            switches_only,
            blocks: Some(Blocks::of(&s, &nodes, "topo-block")),
        };
        let all = slurm::switches(&forest, &opts).unwrap();
        let yaml = slurm::topology_yaml(&forest, "topo-switch", &opts).unwrap();
        let Some(slinky) = &s.slinky else {
            unreachable!()
        };
        for n in &nodes {
            let spec = slinky_spec(&s, slinky, &n.labels).unwrap();
            for pair in spec.split(',') {
                let (topology, name) = pair.split_once(':').unwrap();
                if topology == "topo-block" {
                    assert!(yaml.contains(&format!("      - block: {name}\n")), "{yaml}");
                    continue;
                }
                // Slurm places a dynamic node only in a leaf switch.
                let leaf = all.iter().find(|sw| sw.name == name);
                assert!(
                    leaf.is_some_and(|sw| sw.switches.is_empty()),
                    "{pair}: not a leaf in {all:?}"
                );
            }
        }
    }
}

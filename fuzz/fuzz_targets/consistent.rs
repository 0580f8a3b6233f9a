//! Any label maps: what `consistent` keeps builds a tree without conflicts and Slurm files with
//! no switch under two parents or defined twice; it keeps or leaves out every node, and never
//! panics.
#![no_main]
use std::collections::BTreeMap;

use ec2_topology_core::{
    consistent::consistent,
    labels::LabelScheme,
    slurm::{self, Files, Problem},
    tree::{Forest, NodeView},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let scheme = LabelScheme::default();
    // Nodes separated by 0xff; each a list of `key=value` labels separated by 0xfe, where a
    // key of one byte `n` is the layer label n % 6 (so that layers collide).
    let nodes: Vec<NodeView> = data
        .split(|b| *b == 0xff)
        .enumerate()
        .map(|(i, node)| {
            let labels: BTreeMap<String, String> = node
                .split(|b| *b == 0xfe)
                .filter_map(|kv| {
                    let (k, v) = kv.split_first()?;
                    let key = scheme.layer_key(usize::from(*k % 6));
                    Some((key, String::from_utf8_lossy(v).into_owned()))
                })
                .collect();
            NodeView {
                name: format!("node-{i}"),
                ready: Some(true),
                labels,
                note: None,
                tainted: false,
            }
        })
        .collect();
    let total = nodes.len();
    let (kept, out) = consistent(&scheme, nodes);
    assert_eq!(kept.len() + out.len(), total);
    assert!(Forest::build(&scheme, &kept).conflicts.is_empty());
    let files = Files {
        tree_topology: "topo-switch".into(),
        switches_only: false,
    };
    if let Err(problems) = slurm::data(&scheme, &files, &kept) {
        for p in problems {
            assert!(
                !matches!(p, Problem::TwoParents(_)),
                "a switch under two parents: {p:?}"
            );
        }
    }
});

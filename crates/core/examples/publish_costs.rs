#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
//! What the publishers' pure work costs per tick at fleet sizes up to EKS's 100,000 nodes, and
//! how big Slurm's files get (a ConfigMap holds 1 MiB): prints one row per size.
//!
//! `cargo run --release -p ec2-topology-core --example publish_costs [SIZES]`
//! (SIZES: comma-separated node counts, default 1000,10000,100000).

use std::time::Instant;

use ec2_topology_core::{
    coverage::{self, Coverage, INSTANCE_TYPE_LABEL, ZONE_LABEL},
    labels::LabelScheme,
    slurm,
    tree::{Forest, NodeView},
};

/// A fleet shaped like EC2's answers: 64 nodes per leaf switch, 16 leaves per aggregation
/// node, 8 aggregation nodes per spine; one node in ten of a 4-layer type; EKS node names.
fn fleet(n: usize) -> Vec<NodeView> {
    let s = LabelScheme::default();
    (0..n)
        .map(|i| {
            let (leaf, agg, spine) = (i / 64, i / (64 * 16), i / (64 * 16 * 8));
            let name = format!(
                "ip-10-{}-{}-{}.us-west-2.compute.internal",
                i / 65536,
                (i / 256) % 256,
                i % 256
            );
            let (spine, agg, leaf) = (
                format!("nn-s{spine:016x}"),
                format!("nn-a{agg:016x}"),
                format!("nn-l{leaf:016x}"),
            );
            let four = i % 10 == 0;
            let mid = format!("nn-m{:016x}", i / 640);
            let path: Vec<&str> = if four {
                vec![&spine, &agg, &mid, &leaf]
            } else {
                vec![&spine, &agg, &leaf]
            };
            let mut v = NodeView::labelled(&name, &s, &path);
            let ty = if four {
                "p6-b200.48xlarge"
            } else {
                "p5.48xlarge"
            };
            v.labels.insert(INSTANCE_TYPE_LABEL.into(), ty.into());
            v.labels.insert(
                ZONE_LABEL.into(),
                format!("us-west-2{}", ['a', 'b', 'c'][i % 3]),
            );
            v
        })
        .collect()
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "1000,10000,100000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let s = LabelScheme::default();
    println!(
        "| nodes | coverage cells ms | coverage table ms | forest ms | topology.yaml KiB | topology.conf KiB | both ms | a ConfigMap (1 MiB) holds |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    for n in sizes {
        let nodes = fleet(n);
        let t = Instant::now();
        let cells = coverage::cells(nodes.iter().map(|v| {
            let depth = coverage::depth_of(&s, |k| v.labels.get(k).cloned());
            (
                v.labels.get(INSTANCE_TYPE_LABEL).cloned(),
                v.labels.get(ZONE_LABEL).cloned(),
                depth,
            )
        }));
        let cells_ms = ms(t);
        let full: usize = cells.values().map(|g| g.full).sum();
        let t = Instant::now();
        let cov = Coverage::build(&s, &nodes);
        let table_ms = ms(t);
        let t = Instant::now();
        let forest = Forest::build(&s, &nodes);
        let forest_ms = ms(t);
        let t = Instant::now();
        let yaml = slurm::topology_yaml(&forest, "topo-switch", &Default::default())
            .expect("a consistent fleet");
        let conf = slurm::topology_conf(&forest).expect("a consistent fleet");
        let files_ms = ms(t);
        let bytes = yaml.len() + conf.len();
        assert_eq!(full, n, "every node fully labelled");
        assert_eq!(cov.by_instance_type.len(), 2);
        println!(
            "| {n} | {cells_ms:.1} | {table_ms:.1} | {forest_ms:.1} | {:.0} | {:.0} | {files_ms:.1} | {} |",
            yaml.len() as f64 / 1024.0,
            conf.len() as f64 / 1024.0,
            if bytes <= 1_000_000 {
                "both files"
            } else if yaml.len() <= 1_000_000 {
                "topology.yaml only"
            } else {
                "no"
            }
        );
    }
}

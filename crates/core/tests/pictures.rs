#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
//! `tree -o dot` and `tree -o mermaid` judged by the real tools: Graphviz's `dot` draws ours
//! (Debian's package: `e2e/tools/graphviz.sh`), and the real Mermaid parser accepts ours
//! (`e2e/tools/mermaid.sh`, npm, in jsdom). Both run by `make test` (its `pictures` step).
//!
//! The fleet mixes what a picture must survive: four-layer and three-layer paths, a box folded
//! into "+N more", NotReady, unknown and tainted nodes, unlabelled nodes with notes, and labels
//! that do not form one tree.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use ec2_topology_core::{
    labels::LabelScheme,
    picture,
    tree::{Forest, NodeView},
};

fn fleet() -> Forest {
    let s = LabelScheme::default();
    let mut nodes = Vec::new();
    for i in 0..40 {
        let leaf = format!("nn-leaf-{}", i % 3);
        let mut n = NodeView::labelled(
            &format!("ip-10-0-{i}-1.us-west-2.compute.internal"),
            &s,
            &["nn-spine-0123456789abcdef0", "nn-agg-a", &leaf],
        );
        n.ready = match i % 11 {
            0 => Some(false),
            5 => None,
            _ => Some(true),
        };
        n.tainted = i % 7 == 0;
        if n.tainted {
            n.note = Some(
                "startup taint ec2-topology-labeler.io/topology-pending, TopologyLabeled=False NotDescribed"
                    .into(),
            );
        }
        nodes.push(n);
    }
    nodes.push(NodeView::labelled(
        "gb200-0",
        &s,
        &["nn-top", "nn-mid", "nn-low", "nn-rack"],
    ));
    // One network node under two parents: inconsistent labels.
    nodes.push(NodeView::labelled(
        "odd-1",
        &s,
        &["nn-top", "nn-mid-2", "nn-low"],
    ));
    nodes.push(NodeView {
        labels: Default::default(),
        note: Some("TopologyLabeled=False Skipped".into()),
        tainted: true,
        ..NodeView::labelled("fargate-ip-10-1-1-1", &s, &[])
    });
    let forest = Forest::build(&s, &nodes);
    assert!(
        !forest.conflicts.is_empty(),
        "the fleet has a conflict to draw"
    );
    forest
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn write(name: &str, text: &str) -> (tempdir::Dir, PathBuf) {
    let dir = tempdir::Dir::new();
    let path = dir.0.join(name);
    std::fs::write(&path, text).expect("write the picture");
    (dir, path)
}

/// A directory removed when dropped (no crate for this alone).
mod tempdir {
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Self {
            let p = std::env::temp_dir().join(format!(
                "ec2tl-pictures-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0)
            ));
            std::fs::create_dir_all(&p).expect("a temp dir");
            Self(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// `dot -Tsvg` on `text`: the SVG, with Graphviz's hyphen entity decoded.
fn graphviz(text: &str) -> String {
    let (_dir, path) = write("topology.dot", text);
    let out = Command::new("dot")
        .arg("-Tsvg")
        .arg(&path)
        .output()
        .expect("Graphviz's dot on PATH: run e2e/tools/graphviz.sh (make pictures)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "dot refuses or warns: {stderr}\n{text}"
    );
    String::from_utf8_lossy(&out.stdout).replace("&#45;", "-")
}

/// Whether the real Mermaid parser accepts `text` (its message when not).
fn mermaid_accepts(text: &str) -> Result<String, String> {
    let tool = Command::new(repo().join("e2e/tools/mermaid.sh"))
        .output()
        .expect("run e2e/tools/mermaid.sh");
    assert!(
        tool.status.success(),
        "e2e/tools/mermaid.sh: {}",
        String::from_utf8_lossy(&tool.stderr)
    );
    let dir = PathBuf::from(String::from_utf8_lossy(&tool.stdout).trim());
    let (_dir, path) = write("topology.mmd", text);
    let out = Command::new("node")
        .arg(dir.join("check.mjs"))
        .arg(&path)
        .output()
        .expect("node on PATH");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn an_empty_cluster_draws_in_both() {
    let empty = Forest::default();
    assert!(graphviz(&picture::dot(&empty)).contains("0 top-level network nodes"));
    let parsed = mermaid_accepts(&picture::mermaid(&empty));
    assert!(parsed.is_ok(), "{parsed:?}");
}

#[test]
fn graphviz_draws_the_dot_picture() {
    let text = picture::dot(&fleet());
    let svg = graphviz(&text);
    for drawn in [
        "nn-spine-0123456789abcdef0",
        "nn-rack",
        "gb200-0",
        "+",
        "more",
        "without topology labels",
        "inconsistent labels",
        "fargate-ip-10-1-1-1",
    ] {
        assert!(svg.contains(drawn), "the SVG lacks {drawn:?}");
    }
    // Every box the picture names is a cluster Graphviz drew.
    let clusters = text.matches("subgraph cluster_").count();
    assert_eq!(
        svg.matches("class=\"cluster\"").count(),
        clusters,
        "every nested box is drawn"
    );
}

#[test]
fn mermaid_parses_the_mermaid_picture() {
    let text = picture::mermaid(&fleet());
    let parsed = mermaid_accepts(&text);
    assert!(
        parsed.as_ref().is_ok_and(|out| out.contains("flowchart")),
        "Mermaid refuses the picture, or not as a flowchart: {parsed:?}\n{text}"
    );
    // And a broken one is refused (the check is not a rubber stamp).
    let broken = text
        .replacen("end\n", "", 1)
        .replacen("[\"", "[\"unclosed ", 1)
        .replacen("\"]", "", 1);
    assert!(
        mermaid_accepts(&broken).is_err(),
        "a broken picture is refused"
    );
}

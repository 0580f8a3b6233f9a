//! Pure topology trees, read back from node labels: what `tree` prints and what the Volcano
//! HyperNodes are built from. Nothing here does I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::labels::{LabelScheme, LayerNumbering};

/// What the tree needs of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    /// `Some(true)` when its Ready condition is True; `None` when unknown.
    pub ready: Option<bool>,
    pub labels: BTreeMap<String, String>,
    /// What else to say about the node (its startup taint, its `TopologyLabeled` condition).
    pub note: Option<String>,
    /// It carries the startup taint (schedulers keep pods off it until it is released).
    pub tainted: bool,
}

impl NodeView {
    /// A Ready node carrying `path` (top first) as its layer labels in `scheme`'s keys.
    pub fn labelled(name: &str, scheme: &LabelScheme, path: &[&str]) -> Self {
        let depth = path.len();
        let labels = path
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let layer = match scheme.numbering {
                    LayerNumbering::TopFirst => i + 1,
                    LayerNumbering::LeafFirst => depth - i,
                };
                (scheme.layer_key(layer), v.to_string())
            })
            .collect();
        Self {
            name: name.to_string(),
            ready: Some(true),
            labels,
            note: None,
            tainted: false,
        }
    }
}

pub use crate::labels::path_of;

/// One network node and what hangs under it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Domain {
    pub id: String,
    /// Depth from the top: 1 for a top-level network node.
    pub layer: usize,
    pub nodes_total: usize,
    pub nodes_ready: usize,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub children: BTreeMap<String, Domain>,
    /// Kubernetes nodes directly under this (the switch their instance hangs off).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<TreeNode>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TreeNode {
    pub name: String,
    pub ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub tainted: bool,
    /// Its UltraServer (the capacity block's label), if it is in one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ultraserver: Option<String>,
}

/// The whole cluster's topology as its labels describe it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Forest {
    pub roots: BTreeMap<String, Domain>,
    /// Nodes without (complete) topology labels.
    pub missing: Vec<String>,
    /// Notes on those nodes (a startup taint still on, the condition's reason).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub missing_notes: BTreeMap<String, String>,
    /// Those of them still carrying the startup taint.
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    pub missing_tainted: BTreeSet<String>,
    /// A network node seen under two different parents: the labels are inconsistent.
    pub conflicts: Vec<Conflict>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct Conflict {
    pub network_node: String,
    pub layer: usize,
    pub parents: Vec<String>,
}

impl Forest {
    pub fn build(scheme: &LabelScheme, nodes: &[NodeView]) -> Self {
        let mut forest = Forest::default();
        // (layer, id) → parents seen (None for a top-level node).
        let mut parents: BTreeMap<(usize, &str), BTreeSet<Option<&str>>> = BTreeMap::new();
        let paths: Vec<(&NodeView, Option<Vec<String>>)> = nodes
            .iter()
            .map(|n| (n, path_of(scheme, &n.labels)))
            .collect();
        for (node, path) in &paths {
            let Some(path) = path else {
                forest.missing.push(node.name.clone());
                if let Some(note) = &node.note {
                    forest.missing_notes.insert(node.name.clone(), note.clone());
                }
                if node.tainted {
                    forest.missing_tainted.insert(node.name.clone());
                }
                continue;
            };
            for (i, id) in path.iter().enumerate() {
                let parent = i
                    .checked_sub(1)
                    .and_then(|p| path.get(p))
                    .map(String::as_str);
                parents
                    .entry((i + 1, id.as_str()))
                    .or_default()
                    .insert(parent);
            }
            let mut level = &mut forest.roots;
            for (i, id) in path.iter().enumerate() {
                let d = level.entry(id.clone()).or_insert_with(|| Domain {
                    id: id.clone(),
                    layer: i + 1,
                    ..Domain::default()
                });
                d.nodes_total += 1;
                d.nodes_ready += usize::from(node.ready == Some(true));
                if i + 1 == path.len() {
                    d.nodes.push(TreeNode {
                        name: node.name.clone(),
                        ready: node.ready,
                        note: node.note.clone(),
                        tainted: node.tainted,
                        ultraserver: scheme
                            .capacity_block_key
                            .as_ref()
                            .and_then(|k| node.labels.get(k))
                            .filter(|b| !b.is_empty())
                            .cloned(),
                    });
                }
                level = &mut d.children;
            }
        }
        for ((layer, id), ps) in parents {
            if ps.len() > 1 {
                forest.conflicts.push(Conflict {
                    network_node: id.to_string(),
                    layer,
                    parents: ps
                        .into_iter()
                        .map(|p| p.unwrap_or("(top)").to_string())
                        .collect(),
                });
            }
        }
        forest.missing.sort();
        forest
    }

    pub fn nodes_labelled(&self) -> usize {
        self.roots.values().map(|d| d.nodes_total).sum()
    }

    /// The tree as text, `tree`-style.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "{} top-level network nodes, {} nodes labelled, {} without topology labels\n",
            self.roots.len(),
            self.nodes_labelled(),
            self.missing.len()
        ));
        let roots: Vec<&Domain> = self.roots.values().collect();
        for (i, d) in roots.iter().enumerate() {
            render_domain(&mut out, d, "", i + 1 == roots.len(), true);
        }
        if !self.missing.is_empty() {
            out.push_str(&format!(
                "\nwithout topology labels ({}):\n",
                self.missing.len()
            ));
            for m in &self.missing {
                match self.missing_notes.get(m) {
                    Some(note) => out.push_str(&format!("  {m} ({note})\n")),
                    None => out.push_str(&format!("  {m}\n")),
                }
            }
        }
        if !self.conflicts.is_empty() {
            out.push_str("\ninconsistent labels (a network node under more than one parent):\n");
            for c in &self.conflicts {
                out.push_str(&format!(
                    "  {} (layer {}) under {}\n",
                    c.network_node,
                    c.layer,
                    c.parents.join(", ")
                ));
            }
        }
        out
    }
}

fn render_domain(out: &mut String, d: &Domain, prefix: &str, last: bool, root: bool) {
    let (branch, next) = match (root, last) {
        (true, _) => ("", ""),
        (false, true) => ("└── ", "    "),
        (false, false) => ("├── ", "│   "),
    };
    out.push_str(&format!(
        "{prefix}{branch}{} [layer {}: {} nodes, {} ready]\n",
        d.id, d.layer, d.nodes_total, d.nodes_ready
    ));
    let child_prefix = format!("{prefix}{next}");
    // The nodes in an UltraServer under it (one NVLink domain), the others directly.
    let mut ultraservers: BTreeMap<&str, Vec<&TreeNode>> = BTreeMap::new();
    let mut direct = Vec::new();
    for n in &d.nodes {
        match &n.ultraserver {
            Some(u) => ultraservers.entry(u).or_default().push(n),
            None => direct.push(n),
        }
    }
    let total = d.children.len() + ultraservers.len() + direct.len();
    let mut i = 0;
    for c in d.children.values() {
        i += 1;
        render_domain(out, c, &child_prefix, i == total, false);
    }
    for (id, nodes) in &ultraservers {
        i += 1;
        let (branch, next) = if i == total {
            ("└── ", "    ")
        } else {
            ("├── ", "│   ")
        };
        let ready = nodes.iter().filter(|n| n.ready == Some(true)).count();
        out.push_str(&format!(
            "{child_prefix}{branch}UltraServer {id} [{} nodes, {ready} ready]\n",
            nodes.len()
        ));
        let inner = format!("{child_prefix}{next}");
        for (j, n) in nodes.iter().enumerate() {
            render_node(out, n, &inner, j + 1 == nodes.len());
        }
    }
    for n in direct {
        i += 1;
        render_node(out, n, &child_prefix, i == total);
    }
}

fn render_node(out: &mut String, n: &TreeNode, prefix: &str, last: bool) {
    let branch = if last { "└── " } else { "├── " };
    let state = match n.ready {
        Some(true) => "Ready",
        Some(false) => "NotReady",
        None => "Unknown",
    };
    match &n.note {
        Some(note) => out.push_str(&format!("{prefix}{branch}{} ({state}, {note})\n", n.name)),
        None => out.push_str(&format!("{prefix}{branch}{} ({state})\n", n.name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &str, ready: bool, path: &[&str]) -> NodeView {
        NodeView {
            ready: Some(ready),
            ..NodeView::labelled(name, &LabelScheme::default(), path)
        }
    }

    #[test]
    fn paths_come_back_from_labels_in_either_numbering() {
        let s = LabelScheme::default();
        let v = view("n", true, &["a", "b", "c"]);
        assert_eq!(
            path_of(&s, &v.labels),
            Some(vec!["a".into(), "b".into(), "c".into()])
        );
        let leaf_first = LabelScheme {
            numbering: LayerNumbering::LeafFirst,
            ..LabelScheme::default()
        };
        assert_eq!(
            path_of(&leaf_first, &v.labels),
            Some(vec!["c".into(), "b".into(), "a".into()])
        );
        let mut gap = v.labels.clone();
        gap.remove("topology.k8s.aws/network-node-layer-2");
        assert_eq!(path_of(&s, &gap), None, "a gap is not a path");
        assert_eq!(path_of(&s, &BTreeMap::new()), None);
    }

    #[test]
    fn forest_counts_nodes_and_readiness_per_domain() {
        let nodes = vec![
            view("n1", true, &["s1", "a1", "l1"]),
            view("n2", false, &["s1", "a1", "l1"]),
            view("n3", true, &["s1", "a2", "l2"]),
            view("n4", true, &["s2", "a3", "r3", "l3"]),
            NodeView {
                name: "fargate-1".into(),
                ready: Some(true),
                labels: BTreeMap::new(),
                note: Some("startup taint".into()),
                tainted: true,
            },
        ];
        let f = Forest::build(&LabelScheme::default(), &nodes);
        assert_eq!(f.roots.len(), 2);
        let s1 = &f.roots["s1"];
        assert_eq!((s1.nodes_total, s1.nodes_ready), (3, 2));
        assert_eq!(s1.children["a1"].children["l1"].nodes.len(), 2);
        assert_eq!(
            f.roots["s2"].children["a3"].children["r3"].children["l3"].layer,
            4
        );
        assert_eq!(f.missing, vec!["fargate-1"]);
        assert!(
            f.render().contains("  fargate-1 (startup taint)\n"),
            "{}",
            f.render()
        );
        assert!(f.conflicts.is_empty());
        let text = f.render();
        assert!(
            text.contains("2 top-level network nodes, 4 nodes labelled, 1 without topology labels")
        );
        assert!(text.contains("l1 [layer 3: 2 nodes, 1 ready]"), "{text}");
        assert!(text.contains("n2 (NotReady)"));
    }

    #[test]
    fn ultraserver_members_are_drawn_under_their_ultraserver() {
        let s = LabelScheme::default();
        let key = s.capacity_block_key.clone().unwrap();
        let member = |name: &str, block: &str| {
            let mut v = view(name, true, &["a", "b", "c"]);
            v.labels.insert(key.clone(), block.into());
            v
        };
        let forest = Forest::build(
            &s,
            &[
                member("n1", "cr-1"),
                member("n2", "cr-1"),
                member("n3", "cr-2"),
                view("n4", false, &["a", "b", "c"]),
            ],
        );
        let text = forest.render();
        assert!(
            text.contains(
                "        ├── UltraServer cr-1 [2 nodes, 2 ready]\n        │   ├── n1 (Ready)\n        │   └── n2 (Ready)\n        ├── UltraServer cr-2 [1 nodes, 1 ready]\n        │   └── n3 (Ready)\n        └── n4 (NotReady)\n"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&forest).unwrap();
        let leaf = &json["roots"]["a"]["children"]["b"]["children"]["c"];
        assert_eq!(leaf["nodes"][0]["ultraserver"], "cr-1");
        assert!(leaf["nodes"][3].get("ultraserver").is_none());
    }

    #[test]
    fn a_network_node_under_two_parents_is_a_conflict() {
        let nodes = vec![
            view("n1", true, &["s1", "a1", "l1"]),
            view("n2", true, &["s1", "a2", "l1"]),
        ];
        let f = Forest::build(&LabelScheme::default(), &nodes);
        assert_eq!(
            f.conflicts,
            vec![Conflict {
                network_node: "l1".into(),
                layer: 3,
                parents: vec!["a1".into(), "a2".into()]
            }]
        );
    }
}

//! Keep the nodes whose paths agree with one another, and set apart the few that do not, so
//! that one inconsistent node never stops a scheduler's objects from being published.
//!
//! EC2 names every network node once, at one layer, under one parent. A set of paths breaks that
//! when a network node sits under two parents (Volcano refuses the second parent, slurmctld a
//! switch defined twice) or at two layers. [`consistent`] settles each such network node by
//! its majority: the parent (or layer) most nodes give it stays, the nodes giving it another are
//! left out, each named with what it disagreed on. Ties go to the smallest name, so the result
//! does not depend on the order the nodes came in. Nodes are only ever removed, and removing a
//! node never makes a new disagreement, so one pass over the layers, top first, ends with a set
//! that agrees. Tiers are checked twice: counted from the top (how `tree` and Slurm key them)
//! and from the bottom (how Volcano's HyperNode tiers are counted), so that a mixed-depth fleet
//! agrees under both.
//!
//! Owns: which nodes a publisher may draw together. Pure; never decides what is verified.

use std::collections::BTreeMap;

use crate::labels::{LabelScheme, MAX_LAYERS, path_of};
use crate::tree::NodeView;

/// A node left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excluded {
    pub node: NodeView,
    pub why: Disagreement,
}

/// What a node's path disagreed with the other nodes on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Disagreement {
    /// Its layer labels are not a contiguous run from layer 1 (a layer missing in the middle).
    Gap,
    /// It puts `network_node` at `layer` (from the top), where most nodes put it at `kept`.
    Layer {
        network_node: String,
        layer: usize,
        kept: usize,
    },
    /// It puts `network_node` under `parent`, where most nodes put it under `kept` (`None`: at
    /// the top).
    Parent {
        network_node: String,
        parent: Option<String>,
        kept: Option<String>,
    },
}

impl std::fmt::Display for Disagreement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let top = |p: &Option<String>| p.clone().unwrap_or_else(|| "(top)".into());
        match self {
            Disagreement::Gap => write!(f, "its layer labels skip a layer"),
            Disagreement::Layer {
                network_node,
                layer,
                kept,
            } => write!(
                f,
                "it puts network node {network_node} at layer {layer}, the other nodes at layer {kept}"
            ),
            Disagreement::Parent {
                network_node,
                parent,
                kept,
            } => write!(
                f,
                "it puts network node {network_node} under {}, the other nodes under {}",
                top(parent),
                top(kept)
            ),
        }
    }
}

/// The nodes of `nodes` whose paths agree (in their order), and those left out. A node without
/// any layer label is kept as it is (publishers list it as unlabelled).
pub fn consistent(scheme: &LabelScheme, nodes: Vec<NodeView>) -> (Vec<NodeView>, Vec<Excluded>) {
    let mut excluded: BTreeMap<usize, Disagreement> = BTreeMap::new();
    let paths: Vec<Option<Vec<String>>> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let path = path_of(scheme, &n.labels);
            if path.is_none() && n.labels.keys().any(|k| scheme.layer_index(k).is_some()) {
                excluded.insert(i, Disagreement::Gap);
            }
            path
        })
        .collect();
    // The paths still in, by reference (nothing is copied per level).
    let live = |excluded: &BTreeMap<usize, Disagreement>| -> Vec<(usize, &[String])> {
        paths
            .iter()
            .enumerate()
            .filter(|(i, _)| !excluded.contains_key(i))
            .filter_map(|(i, p)| Some((i, p.as_deref()?)))
            .collect()
    };
    // One layer per network node.
    let mut layers: BTreeMap<&str, BTreeMap<usize, usize>> = BTreeMap::new();
    for (_, path) in live(&excluded) {
        for (j, id) in path.iter().enumerate() {
            *layers.entry(id).or_default().entry(j + 1).or_default() += 1;
        }
    }
    let kept_layer: BTreeMap<&str, usize> = layers
        .into_iter()
        .filter(|(_, by)| by.len() > 1)
        .filter_map(|(id, by)| Some((id, majority(&by)?)))
        .collect();
    if !kept_layer.is_empty() {
        for (i, path) in live(&excluded) {
            if let Some((j, id, kept)) = path.iter().enumerate().find_map(|(j, id)| {
                let kept = *kept_layer.get(id.as_str())?;
                (kept != j + 1).then_some((j, id, kept))
            }) {
                excluded.insert(
                    i,
                    Disagreement::Layer {
                        network_node: id.clone(),
                        layer: j + 1,
                        kept,
                    },
                );
            }
        }
    }
    // One parent per network node: tiers counted from the top, then from the bottom.
    let deepest = paths.iter().flatten().map(Vec::len).max().unwrap_or(0);
    for from_bottom in [false, true] {
        for level in 1..=deepest.min(MAX_LAYERS) {
            // The network node at this level of `path`, and its parent (`None`: at the top).
            let at = |path: &'_ [String]| -> Option<(usize, Option<usize>)> {
                let j = if from_bottom {
                    // Tier `level` counted from the deepest network node.
                    path.len().checked_sub(level)?
                } else {
                    level - 1
                };
                path.get(j)?;
                Some((j, j.checked_sub(1)))
            };
            let now = live(&excluded);
            // Network node → its parent → nodes saying so, at this level.
            let mut parents: BTreeMap<&str, BTreeMap<Option<&str>, usize>> = BTreeMap::new();
            for (_, path) in &now {
                if let Some((j, p)) = at(path)
                    && let Some(id) = path.get(j)
                {
                    let parent = p.and_then(|p| path.get(p)).map(String::as_str);
                    *parents.entry(id).or_default().entry(parent).or_default() += 1;
                }
            }
            let kept: BTreeMap<&str, Option<&str>> = parents
                .into_iter()
                .filter(|(_, by)| by.len() > 1)
                .filter_map(|(id, by)| Some((id, majority(&by)?)))
                .collect();
            if kept.is_empty() {
                continue;
            }
            for (i, path) in now {
                if let Some((j, p)) = at(path)
                    && let Some(id) = path.get(j)
                    && let Some(k) = kept.get(id.as_str())
                {
                    let parent = p.and_then(|p| path.get(p)).map(String::as_str);
                    if *k != parent {
                        excluded.insert(
                            i,
                            Disagreement::Parent {
                                network_node: id.clone(),
                                parent: parent.map(String::from),
                                kept: k.map(String::from),
                            },
                        );
                    }
                }
            }
        }
    }
    let mut kept = Vec::with_capacity(nodes.len() - excluded.len().min(nodes.len()));
    let mut out = Vec::with_capacity(excluded.len());
    for (i, node) in nodes.into_iter().enumerate() {
        match excluded.remove(&i) {
            Some(why) => out.push(Excluded { node, why }),
            None => kept.push(node),
        }
    }
    (kept, out)
}

/// The value most counted (the smallest of those tied).
fn majority<K: Ord + Clone>(counts: &BTreeMap<K, usize>) -> Option<K> {
    // Ascending keys: a later key replaces the best only with a strictly larger count.
    let mut best: Option<(&K, usize)> = None;
    for (k, n) in counts {
        if best.is_none_or(|(_, b)| *n > b) {
            best = Some((k, *n));
        }
    }
    best.map(|(k, _)| k.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Forest;

    fn view(name: &str, path: &[&str]) -> NodeView {
        NodeView::labelled(name, &LabelScheme::default(), path)
    }

    fn kept_names(kept: &[NodeView]) -> Vec<&str> {
        kept.iter().map(|n| n.name.as_str()).collect()
    }

    /// One forged node giving a leaf a second parent is left out; the fifty real nodes under
    /// that leaf, and everyone else, stay, and the tree they make has no conflict.
    #[test]
    fn one_node_giving_a_second_parent_is_left_out_not_the_tree() {
        let mut nodes: Vec<NodeView> = (0..50)
            .map(|k| view(&format!("n{k}"), &["s1", "a1", "l1"]))
            .collect();
        nodes.push(view("other", &["s1", "a2", "l2"]));
        nodes.push(view("forged", &["s1", "a2", "l1"]));
        let (kept, out) = consistent(&LabelScheme::default(), nodes);
        assert_eq!(kept.len(), 51);
        assert!(!kept_names(&kept).contains(&"forged"));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].node.name, "forged");
        assert_eq!(
            out[0].why,
            Disagreement::Parent {
                network_node: "l1".into(),
                parent: Some("a2".into()),
                kept: Some("a1".into()),
            }
        );
        assert!(
            Forest::build(&LabelScheme::default(), &kept)
                .conflicts
                .is_empty()
        );
        assert_eq!(
            out[0].why.to_string(),
            "it puts network node l1 under a2, the other nodes under a1"
        );
    }

    /// Disagreement high up leaves out only the nodes on the minority side, and what they would
    /// have said further down does not count against the majority.
    #[test]
    fn a_disagreement_higher_up_settles_before_the_ones_below() {
        let nodes = vec![
            view("a", &["s1", "a1", "l1"]),
            view("b", &["s1", "a1", "l2"]),
            // a1 under s2 (minority) and, below it, l1 under a1 as well: one node, one reason.
            view("c", &["s2", "a1", "l1"]),
        ];
        let (kept, out) = consistent(&LabelScheme::default(), nodes);
        assert_eq!(kept_names(&kept), ["a", "b"]);
        assert_eq!(out.len(), 1);
        assert!(matches!(
            &out[0].why,
            Disagreement::Parent { network_node, .. } if network_node == "a1"
        ));
    }

    /// Even numbers: the smallest parent wins, whatever order the nodes came in.
    #[test]
    fn ties_go_the_same_way_in_any_order() {
        let a = view("x", &["s1", "a1", "l1"]);
        let b = view("y", &["s1", "a2", "l1"]);
        let (k1, _) = consistent(&LabelScheme::default(), vec![a.clone(), b.clone()]);
        let (k2, _) = consistent(&LabelScheme::default(), vec![b, a]);
        assert_eq!(kept_names(&k1), ["x"]);
        assert_eq!(kept_names(&k2), ["x"]);
    }

    /// A network node named at two layers: the layer most nodes give it stays.
    #[test]
    fn a_network_node_at_two_layers_keeps_the_majority_layer() {
        let nodes = vec![
            view("a", &["s1", "a1", "l1"]),
            view("b", &["s1", "a1", "l1"]),
            view("c", &["s1", "l1", "x1"]),
        ];
        let (kept, out) = consistent(&LabelScheme::default(), nodes);
        assert_eq!(kept_names(&kept), ["a", "b"]);
        assert_eq!(
            out[0].why,
            Disagreement::Layer {
                network_node: "l1".into(),
                layer: 2,
                kept: 3
            }
        );
    }

    /// A layer missing in the middle is left out; a node with no layer label at all is kept (it
    /// is unlabelled, not inconsistent).
    #[test]
    fn gaps_are_left_out_and_unlabelled_nodes_kept() {
        let s = LabelScheme::default();
        let mut gap = view("gap", &["s1", "a1", "l1"]);
        gap.labels.remove(&s.layer_key(2));
        let mut bare = view("bare", &[]);
        bare.labels.clear();
        let (kept, out) = consistent(&s, vec![view("a", &["s1", "a1", "l1"]), gap, bare]);
        assert_eq!(kept_names(&kept), ["a", "bare"]);
        assert_eq!(out[0].why, Disagreement::Gap);
    }

    /// A mixed-depth fleet EC2 could give (a 4-layer type's layer 3 is a 3-layer type's leaf)
    /// is consistent: nothing is left out.
    #[test]
    fn a_mixed_depth_fleet_agrees() {
        let nodes = vec![
            view("three", &["s1", "a1", "l1"]),
            view("four", &["s1", "a1", "l1", "x1"]),
            view("four-b", &["s1", "a1", "l2", "x2"]),
        ];
        let (kept, out) = consistent(&LabelScheme::default(), nodes);
        assert_eq!(kept.len(), 3, "{out:?}");
    }

    /// Counted from the bottom, as Volcano counts tiers: the same network node at one tier
    /// under two parents is settled too.
    #[test]
    fn tiers_from_the_bottom_agree_as_well() {
        let nodes = vec![
            view("a", &["s1", "a1", "l1"]),
            view("b", &["s1", "a1", "l1"]),
            // a1 at layer 3 here: tier 2 from the bottom, under a9 (layer check settles it).
            view("c", &["t1", "a9", "a1", "l3"]),
        ];
        let (kept, out) = consistent(&LabelScheme::default(), nodes);
        assert_eq!(kept_names(&kept), ["a", "b"]);
        assert_eq!(out.len(), 1);
    }
}

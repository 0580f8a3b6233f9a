//! The HyperNodes the labelled nodes make, pure: tiers counted from the nodes up, names of
//! bounded length, a network node under two parents refused ([`desired`]).
//!
//! Owns: the shape of the tree. Never talks to the API server.

use std::{
    collections::{BTreeMap, BTreeSet},
    hash::Hash,
};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{MANAGED_BY, OWNER};
use crate::{
    labels::{LabelScheme, LayerNumbering, MAX_LAYERS},
    publish::cliques::CLIQUE_LABEL,
    tree::{Conflict, NodeView, path_of},
};

/// One HyperNode to publish.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HyperNode {
    pub name: String,
    pub tier: usize,
    pub(crate) tier_name: String,
    pub members: Vec<Member>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Member {
    /// Nodes whose labels match, and lack each of `absent` (keeps a 3-layer leaf from also
    /// selecting 4-layer nodes whose third layer has the same value).
    Nodes {
        labels: BTreeMap<String, String>,
        absent: Vec<String>,
    },
    HyperNode(String),
}

impl HyperNode {
    /// The object to server-side apply, annotated as the installation `owner`'s.
    pub(crate) fn to_object(&self, owner: &str) -> Value {
        let members: Vec<Value> = self
            .members
            .iter()
            .map(|m| match m {
                Member::Nodes { labels, absent } => {
                    let mut selector = serde_json::Map::new();
                    selector.insert("matchLabels".into(), json!(labels));
                    if !absent.is_empty() {
                        selector.insert(
                            "matchExpressions".into(),
                            absent
                                .iter()
                                .map(|k| json!({ "key": k, "operator": "DoesNotExist" }))
                                .collect(),
                        );
                    }
                    json!({ "type": "Node", "selector": { "labelMatch": selector } })
                }
                Member::HyperNode(name) => {
                    json!({ "type": "HyperNode", "selector": { "exactMatch": { "name": name } } })
                }
            })
            .collect();
        json!({
            "apiVersion": "topology.volcano.sh/v1alpha1",
            "kind": "HyperNode",
            "metadata": {
                "name": self.name,
                "labels": { MANAGED_BY.0: MANAGED_BY.1 },
                "annotations": { OWNER: owner },
            },
            "spec": { "tier": self.tier, "tierName": self.tier_name, "members": members }
        })
    }
}

/// A DNS-1123 label from `prefix`, the tier and a network node ID: lowercase, at most 63
/// characters, and unique per (tier, ID) (a hash is appended when the ID had to change).
pub(crate) fn hypernode_name(prefix: &str, tier: usize, id: &str) -> String {
    let head = format!("{prefix}-t{tier}-");
    let mut body = String::new();
    for c in id.chars() {
        let c = c.to_ascii_lowercase();
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() {
            c
        } else {
            '-'
        };
        if !(c == '-' && (body.is_empty() || body.ends_with('-'))) {
            body.push(c);
        }
    }
    let body = body.trim_end_matches('-').to_string();
    let exact = body == id && head.len() + body.len() <= 63;
    if exact {
        return format!("{head}{body}");
    }
    let digest = Sha256::digest(id.as_bytes());
    let hash: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    let room = 63usize.saturating_sub(head.len() + 1 + hash.len());
    let body: String = body.chars().take(room).collect();
    let body = body.trim_end_matches('-');
    if body.is_empty() {
        format!("{head}{hash}")
    } else {
        format!("{head}{body}-{hash}")
    }
}

/// What tier 0, below the leaves, holds: the NVLink domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier0 {
    /// Nothing (`--ultraserver-level=never`): the leaves are the lowest tier.
    Off,
    /// One HyperNode per (leaf, capacity block): an UltraServer, one NVLink domain to EC2.
    UltraServers,
    /// One per (leaf, capacity block, NVLink clique) (`--nvlink-clique-level`): the NVLink domain
    /// as GPU Feature Discovery reports it (`nvidia.com/gpu.clique`), so that a capacity block
    /// holding two cliques (an x72 as two x36) is two. Volcano's tiers start at 0 and a job names
    /// them by number, so the clique takes the UltraServer's place rather than a tier below it.
    Cliques,
}

/// The HyperNodes for these nodes, or the conflicts that forbid publishing any (a HyperNode
/// with two parents would break Volcano's tree).
///
/// With [`Tier0::UltraServers`], the nodes of one capacity block (one UltraServer, one NVLink
/// domain) under one leaf are a HyperNode of tier 0 below that leaf, named by both: an
/// UltraServer split across two leaves is two of them, each under its own leaf, and every other
/// tier keeps its number (a job's `highestTierAllowed` means what it meant). The leaf then
/// selects its other nodes by its layer label without the capacity block's label. With
/// [`Tier0::Cliques`], tier 0 is one HyperNode per (leaf, capacity block, clique); a member of a
/// capacity block without the clique label (GPU Feature Discovery not running, the fabric not
/// complete yet) is selected by its leaf and is in no tier-0 HyperNode.
pub fn desired(
    scheme: &LabelScheme,
    nodes: &[NodeView],
    prefix: &str,
    tier0: Tier0,
) -> Result<Vec<HyperNode>, Vec<Conflict>> {
    // (tier, id) → (layer key, parents, children)
    #[derive(Default)]
    struct Entry {
        key: String,
        parents: BTreeSet<Option<(usize, String)>>,
        children: BTreeSet<(usize, String)>,
        leaf_selector: Option<(String, Option<String>)>,
        /// A leaf's capacity blocks and, with [`Tier0::Cliques`], the NVLink cliques of their
        /// nodes (`None`: without the clique label): each a tier-0 HyperNode below it, but a
        /// block's nodes without the clique label under [`Tier0::Cliques`].
        blocks: BTreeSet<(String, Option<String>)>,
    }
    let block_key = scheme
        .capacity_block_key
        .as_ref()
        .filter(|_| tier0 != Tier0::Off);
    let clique_of = |node: &NodeView| {
        node.labels
            .get(CLIQUE_LABEL)
            .filter(|c| tier0 == Tier0::Cliques && !c.is_empty())
            .cloned()
    };
    let mut entries: BTreeMap<(usize, String), Entry> = BTreeMap::new();
    for node in nodes {
        let Some(path) = path_of(scheme, &node.labels) else {
            continue;
        };
        let depth = path.len();
        // Layer labels the node carries: more than its path when `--uniform-depth` repeated its
        // deepest network node; the leaf selects nodes by the deepest of them.
        let label_depth = (1..=MAX_LAYERS)
            .take_while(|n| node.labels.contains_key(&scheme.layer_key(*n)))
            .count()
            .max(depth);
        for (j, id) in path.iter().enumerate() {
            let tier = depth - j;
            // The label key holding this layer's value on this node.
            let layer = match scheme.numbering {
                LayerNumbering::TopFirst => j + 1,
                LayerNumbering::LeafFirst => depth - j,
            };
            let e = entries.entry((tier, id.clone())).or_default();
            e.key = scheme.layer_key(layer);
            e.parents.insert(
                j.checked_sub(1)
                    .and_then(|p| Some((tier + 1, path.get(p)?.clone()))),
            );
            if let Some(child) = path.get(j + 1) {
                e.children.insert((tier - 1, child.clone()));
            } else {
                if let Some(block) = block_key
                    .and_then(|k| node.labels.get(k))
                    .filter(|b| !b.is_empty())
                {
                    e.blocks.insert((block.clone(), clique_of(node)));
                }
                let (key, absent) = match scheme.numbering {
                    LayerNumbering::TopFirst => (
                        scheme.layer_key(label_depth),
                        Some(scheme.layer_key(label_depth + 1)),
                    ),
                    LayerNumbering::LeafFirst => (scheme.layer_key(layer), None),
                };
                // Nodes of one leaf carrying different numbers of labels (a change of
                // `--uniform-depth` rolling out): the deepest wins, whichever node came first.
                if e.leaf_selector.as_ref().is_none_or(|(k, _)| {
                    scheme.layer_index(k).unwrap_or(0) < scheme.layer_index(&key).unwrap_or(0)
                }) {
                    e.leaf_selector = Some((key, absent));
                }
            }
        }
    }
    let conflicts: Vec<Conflict> = entries
        .iter()
        .filter(|(_, e)| e.parents.len() > 1)
        .map(|((tier, id), e)| Conflict {
            network_node: id.clone(),
            layer: *tier,
            parents: e
                .parents
                .iter()
                .map(|p| p.as_ref().map_or("(top)".into(), |(_, id)| id.clone()))
                .collect(),
        })
        .collect();
    if !conflicts.is_empty() {
        return Err(conflicts);
    }
    let mut out: Vec<HyperNode> = Vec::new();
    for ((tier, id), e) in &entries {
        let mut members: Vec<Member> = e
            .children
            .iter()
            .map(|(t, c)| Member::HyperNode(hypernode_name(prefix, *t, c)))
            .collect();
        if let Some((key, absent)) = &e.leaf_selector {
            let deeper: Vec<String> = absent.iter().cloned().collect();
            let mut absent = deeper.clone();
            if let Some(k) = block_key.filter(|_| !e.blocks.is_empty()) {
                // Tier 0 below this leaf: the nodes of its selector that carry the block (and
                // the clique), one HyperNode each; a block's nodes without the clique label
                // under [`Tier0::Cliques`] stay with the leaf.
                for (b, clique) in &e.blocks {
                    let mut labels =
                        BTreeMap::from([(key.clone(), id.clone()), (k.clone(), b.clone())]);
                    let (name, tier_name) = match clique {
                        Some(c) => {
                            labels.insert(CLIQUE_LABEL.to_string(), c.clone());
                            (clique_name(prefix, c, b, id), CLIQUE_LABEL.to_string())
                        }
                        None if tier0 == Tier0::Cliques => {
                            members.push(Member::Nodes {
                                labels,
                                absent: deeper
                                    .iter()
                                    .cloned()
                                    .chain([CLIQUE_LABEL.to_string()])
                                    .collect(),
                            });
                            continue;
                        }
                        None => (ultraserver_name(prefix, b, id), k.clone()),
                    };
                    members.push(Member::HyperNode(name.clone()));
                    out.push(HyperNode {
                        name,
                        tier: 0,
                        tier_name,
                        members: vec![Member::Nodes {
                            labels,
                            absent: deeper.clone(),
                        }],
                    });
                }
                absent.push(k.clone());
            }
            members.push(Member::Nodes {
                labels: BTreeMap::from([(key.clone(), id.clone())]),
                absent,
            });
        }
        out.push(HyperNode {
            name: hypernode_name(prefix, *tier, id),
            tier: *tier,
            tier_name: e.key.clone(),
            members,
        });
    }
    out.sort_by(|a, b| (a.tier, &a.name).cmp(&(b.tier, &b.name)));
    Ok(out)
}

/// The tier-0 HyperNode of capacity block `block` under leaf `leaf`.
fn ultraserver_name(prefix: &str, block: &str, leaf: &str) -> String {
    hypernode_name(prefix, 0, &format!("{block}-{leaf}"))
}

/// The tier-0 HyperNode of NVLink clique `clique` of capacity block `block` under leaf `leaf`
/// ([`Tier0::Cliques`]).
fn clique_name(prefix: &str, clique: &str, block: &str, leaf: &str) -> String {
    hypernode_name(prefix, 0, &format!("{clique}-{block}-{leaf}"))
}

/// Whether HyperNode `name` is one this installation made: our `managed-by` label alone is not
/// enough (two installations in one cluster carry the same one), so the name must also be
/// `<prefix>-t<tier>-…`, as [`hypernode_name`] makes them.
pub(crate) fn owned_by(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix("-t"))
        .and_then(|rest| rest.split_once('-'))
        .is_some_and(|(tier, _)| !tier.is_empty() && tier.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::NodeView;

    fn view(name: &str, path: &[&str]) -> NodeView {
        NodeView::labelled(name, &LabelScheme::default(), path)
    }

    /// Two installations in one cluster (prefixes `ec2tl` and `ec2tl2`, both labelled
    /// managed-by us): each owns only its own names, so neither deletes the other's HyperNodes.
    #[test]
    fn hypernodes_are_ours_by_label_and_name_prefix() {
        let ours = hypernode_name("ec2tl", 2, "nn-a1");
        assert!(owned_by("ec2tl", &ours), "{ours}");
        for theirs in [
            hypernode_name("ec2tl2", 2, "nn-a1"),
            hypernode_name("other", 1, "nn-s1"),
            "ec2tl-tx-nn".to_string(),
            "ec2tl".to_string(),
            "ec2tl-t-nn".to_string(),
        ] {
            assert!(!owned_by("ec2tl", &theirs), "{theirs}");
        }
        assert!(owned_by("ec2tl2", &hypernode_name("ec2tl2", 10, "nn-x")));
    }

    /// UltraServers are tier 0 below their leaf, one per (leaf, capacity block): A whole under
    /// leaf l1, C split across l1 and l2 (two, each selected by its leaf's label too); the
    /// leaves select their other nodes without the block's label, and keep tier 1. Without
    /// `ultraservers` (or on a fleet with no block) the tree is as before.
    #[test]
    fn ultraservers_are_tier_zero_under_their_leaf() {
        let s = LabelScheme::default();
        let block = s.capacity_block_key.clone().expect("a capacity block key");
        let l3 = s.layer_key(3);
        let in_block = |name: &str, leaf: &str, b: &str| {
            let mut v = view(name, &["nn-s1", "nn-a1", leaf]);
            v.labels.insert(block.clone(), b.into());
            v
        };
        let nodes = vec![
            in_block("a1", "nn-l1", "cr-a"),
            in_block("a2", "nn-l1", "cr-a"),
            in_block("c1", "nn-l1", "cr-c"),
            in_block("c2", "nn-l2", "cr-c"),
            view("plain", &["nn-s1", "nn-a1", "nn-l2"]),
        ];
        let hns = desired(&s, &nodes, "ec2tl", Tier0::UltraServers).unwrap();
        let zero: Vec<&HyperNode> = hns.iter().filter(|h| h.tier == 0).collect();
        let selects = |h: &HyperNode| -> Vec<(BTreeMap<String, String>, Vec<String>)> {
            h.members
                .iter()
                .filter_map(|m| match m {
                    Member::Nodes { labels, absent } => Some((labels.clone(), absent.clone())),
                    Member::HyperNode(_) => None,
                })
                .collect()
        };
        let by_name = |n: &str| hns.iter().find(|h| h.name == n).expect(n);
        let us = |b: &str, l: &str| by_name(&ultraserver_name("ec2tl", b, l));
        assert_eq!(zero.len(), 3, "{zero:#?}");
        for (b, l) in [("cr-a", "nn-l1"), ("cr-c", "nn-l1"), ("cr-c", "nn-l2")] {
            let h = us(b, l);
            assert_eq!(h.tier_name, block);
            assert_eq!(
                selects(h),
                vec![(
                    BTreeMap::from([(l3.clone(), l.into()), (block.clone(), b.into())]),
                    vec![s.layer_key(4)]
                )]
            );
        }
        let leaf = by_name(&hypernode_name("ec2tl", 1, "nn-l1"));
        assert_eq!(leaf.tier, 1);
        assert!(leaf.members.contains(&Member::HyperNode(ultraserver_name(
            "ec2tl", "cr-a", "nn-l1"
        ))));
        assert!(leaf.members.contains(&Member::HyperNode(ultraserver_name(
            "ec2tl", "cr-c", "nn-l1"
        ))));
        assert_eq!(
            selects(leaf),
            vec![(
                BTreeMap::from([(l3.clone(), "nn-l1".into())]),
                vec![s.layer_key(4), block.clone()]
            )]
        );
        assert_eq!(
            hns.iter().filter(|h| h.tier >= 1).map(|h| h.tier).max(),
            Some(3),
            "the other tiers keep their numbers"
        );
        // Off, or no node in a block: no tier 0, and leaves select as before.
        let off = desired(&s, &nodes, "ec2tl", Tier0::Off).unwrap();
        assert!(off.iter().all(|h| h.tier >= 1));
        let plain: Vec<NodeView> = ["n1", "n2"]
            .iter()
            .map(|n| view(n, &["nn-s1", "nn-a1", "nn-l1"]))
            .collect();
        assert_eq!(
            desired(&s, &plain, "ec2tl", Tier0::UltraServers),
            desired(&s, &plain, "ec2tl", Tier0::Off)
        );
    }

    /// With [`Tier0::Cliques`], tier 0 is one HyperNode per (leaf, block, clique): block A holds
    /// two cliques under leaf l1 (an x72 as two x36: two tier-0 HyperNodes, each selecting its
    /// clique's nodes), block C one clique split across l1 and l2 (one per leaf). A member of A
    /// without the clique label is selected by its leaf (by the block's label and the clique's
    /// absence) and is in no tier-0 HyperNode; the leaf's other nodes are selected as before. Every
    /// node is selected exactly once.
    #[test]
    fn cliques_take_tier_zero_with_the_clique_level() {
        let s = LabelScheme::default();
        let block = s.capacity_block_key.clone().expect("a capacity block key");
        let l3 = s.layer_key(3);
        let node = |name: &str, leaf: &str, b: Option<&str>, c: Option<&str>| {
            let mut v = view(name, &["nn-s1", "nn-a1", leaf]);
            if let Some(b) = b {
                v.labels.insert(block.clone(), b.into());
            }
            if let Some(c) = c {
                v.labels.insert(CLIQUE_LABEL.into(), c.into());
            }
            v
        };
        let nodes = vec![
            node("a1", "nn-l1", Some("cr-a"), Some("u.1")),
            node("a2", "nn-l1", Some("cr-a"), Some("u.1")),
            node("a3", "nn-l1", Some("cr-a"), Some("u.2")),
            node("a4", "nn-l1", Some("cr-a"), None),
            node("c1", "nn-l1", Some("cr-c"), Some("v.1")),
            node("c2", "nn-l2", Some("cr-c"), Some("v.1")),
            node("plain", "nn-l2", None, None),
        ];
        let hns = desired(&s, &nodes, "ec2tl", Tier0::Cliques).unwrap();
        let zero: Vec<&HyperNode> = hns.iter().filter(|h| h.tier == 0).collect();
        let mut zero_names: Vec<String> = zero.iter().map(|h| h.name.clone()).collect();
        zero_names.sort();
        let mut want: Vec<String> = [
            ("u.1", "cr-a", "nn-l1"),
            ("u.2", "cr-a", "nn-l1"),
            ("v.1", "cr-c", "nn-l1"),
            ("v.1", "cr-c", "nn-l2"),
        ]
        .iter()
        .map(|(c, b, l)| clique_name("ec2tl", c, b, l))
        .collect();
        want.sort();
        assert_eq!(zero_names, want, "{zero:#?}");
        assert!(zero.iter().all(|h| h.tier_name == CLIQUE_LABEL));
        let clique = hns
            .iter()
            .find(|h| h.name == clique_name("ec2tl", "u.2", "cr-a", "nn-l1"))
            .expect("clique u.2");
        assert_eq!(
            clique.members,
            vec![Member::Nodes {
                labels: BTreeMap::from([
                    (l3.clone(), "nn-l1".into()),
                    (block.clone(), "cr-a".into()),
                    (CLIQUE_LABEL.into(), "u.2".into()),
                ]),
                absent: vec![s.layer_key(4)],
            }]
        );
        let leaf = hns
            .iter()
            .find(|h| h.name == hypernode_name("ec2tl", 1, "nn-l1"))
            .expect("leaf l1");
        assert!(leaf.members.contains(&Member::Nodes {
            labels: BTreeMap::from([(l3.clone(), "nn-l1".into()), (block.clone(), "cr-a".into())]),
            absent: vec![s.layer_key(4), CLIQUE_LABEL.into()],
        }));
        assert!(leaf.members.contains(&Member::Nodes {
            labels: BTreeMap::from([(l3.clone(), "nn-l1".into())]),
            absent: vec![s.layer_key(4), block.clone()],
        }));
        assert!(
            !hns.iter()
                .any(|h| h.name == ultraserver_name("ec2tl", "cr-a", "nn-l1")),
            "no UltraServer HyperNode beside the cliques"
        );
        // Each node is selected by exactly one Node member of the whole tree.
        let matches = |labels: &BTreeMap<String, String>, absent: &[String], v: &NodeView| {
            labels.iter().all(|(k, val)| v.labels.get(k) == Some(val))
                && absent.iter().all(|k| !v.labels.contains_key(k))
        };
        for v in &nodes {
            let n = hns
                .iter()
                .flat_map(|h| &h.members)
                .filter(|m| match m {
                    Member::Nodes { labels, absent } => matches(labels, absent, v),
                    Member::HyperNode(_) => false,
                })
                .count();
            assert_eq!(n, 1, "{} is selected {n} times", v.name);
        }
        // Without the option the same nodes make UltraServers, one per (leaf, block).
        let us = desired(&s, &nodes, "ec2tl", Tier0::UltraServers).unwrap();
        assert_eq!(us.iter().filter(|h| h.tier == 0).count(), 3);
    }

    #[test]
    fn tiers_count_from_the_nodes_up_with_label_selected_leaves() {
        let nodes = vec![
            view("n1", &["nn-s1", "nn-a1", "nn-l1"]),
            view("n2", &["nn-s1", "nn-a1", "nn-l2"]),
            view("n3", &["nn-s1", "nn-a1", "nn-l2"]),
        ];
        let hns = desired(
            &LabelScheme::default(),
            &nodes,
            "ec2tl",
            Tier0::UltraServers,
        )
        .unwrap();
        let names: Vec<(&str, usize)> = hns.iter().map(|h| (h.name.as_str(), h.tier)).collect();
        assert_eq!(
            names,
            vec![
                ("ec2tl-t1-nn-l1", 1),
                ("ec2tl-t1-nn-l2", 1),
                ("ec2tl-t2-nn-a1", 2),
                ("ec2tl-t3-nn-s1", 3)
            ]
        );
        let leaf = &hns[0];
        assert_eq!(leaf.tier_name, "topology.k8s.aws/network-node-layer-3");
        assert_eq!(
            leaf.members,
            vec![Member::Nodes {
                labels: BTreeMap::from([(
                    "topology.k8s.aws/network-node-layer-3".into(),
                    "nn-l1".into()
                )]),
                absent: vec!["topology.k8s.aws/network-node-layer-4".into()],
            }]
        );
        assert_eq!(
            hns[2].members,
            vec![
                Member::HyperNode("ec2tl-t1-nn-l1".into()),
                Member::HyperNode("ec2tl-t1-nn-l2".into())
            ]
        );
        assert_eq!(
            hns[3].members,
            vec![Member::HyperNode("ec2tl-t2-nn-a1".into())]
        );
        let obj = leaf.to_object("ns/lease");
        assert_eq!(
            obj["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "ec2-topology-labeler"
        );
        assert!(
            obj["metadata"]["labels"]
                .get("volcano.sh/network-topology-source")
                .is_none()
        );
        assert_eq!(
            obj["spec"]["members"][0]["selector"]["labelMatch"]["matchExpressions"][0]["operator"],
            "DoesNotExist"
        );
    }

    /// `--uniform-depth=4`: a 3-layer node carries its switch as layers 3 and 4. The switch is
    /// one tier-1 HyperNode selecting by layer 4 (the deepest label the node carries), not two.
    #[test]
    fn padded_nodes_make_no_extra_tier_and_are_selected_by_their_deepest_label() {
        let s = LabelScheme {
            uniform_depth: Some(4),
            ..LabelScheme::default()
        };
        let nodes = vec![
            NodeView::labelled("n1", &s, &["s", "a", "m", "m"]),
            NodeView::labelled("n2", &s, &["s", "b", "r", "l"]),
        ];
        let hns = desired(&s, &nodes, "ec2tl", Tier0::UltraServers).unwrap();
        let by_name: BTreeMap<&str, &HyperNode> =
            hns.iter().map(|h| (h.name.as_str(), h)).collect();
        assert!(!by_name.contains_key("ec2tl-t2-m"), "{:?}", by_name.keys());
        assert_eq!(
            by_name["ec2tl-t3-s"].tier, 3,
            "the 3-layer path keeps its tiers"
        );
        assert_eq!(
            by_name["ec2tl-t1-m"].members,
            vec![Member::Nodes {
                labels: BTreeMap::from([(
                    "topology.k8s.aws/network-node-layer-4".to_string(),
                    "m".to_string()
                )]),
                absent: vec!["topology.k8s.aws/network-node-layer-5".to_string()],
            }]
        );
    }

    #[test]
    fn four_layer_nodes_put_their_top_at_tier_four() {
        let nodes = vec![
            view("n1", &["s", "a", "r", "l"]),
            view("n2", &["s", "b", "m"]),
        ];
        let hns = desired(
            &LabelScheme::default(),
            &nodes,
            "ec2tl",
            Tier0::UltraServers,
        )
        .unwrap();
        let tiers: BTreeMap<&str, usize> = hns.iter().map(|h| (h.name.as_str(), h.tier)).collect();
        assert_eq!(tiers["ec2tl-t4-s"], 4);
        assert_eq!(
            tiers["ec2tl-t3-s"], 3,
            "the spine of 3-layer nodes is its own tier-3 HyperNode"
        );
        assert_eq!(tiers["ec2tl-t1-l"], 1);
        assert_eq!(tiers["ec2tl-t1-m"], 1);
    }

    #[test]
    fn two_parents_for_one_child_are_refused() {
        let nodes = vec![view("n1", &["s", "a1", "l"]), view("n2", &["s", "a2", "l"])];
        let err = desired(
            &LabelScheme::default(),
            &nodes,
            "ec2tl",
            Tier0::UltraServers,
        )
        .unwrap_err();
        assert_eq!(err.len(), 1);
        assert_eq!(err[0].network_node, "l");
        assert_eq!(err[0].parents, vec!["a1", "a2"]);
    }

    #[test]
    fn names_are_valid_bounded_and_distinct() {
        assert_eq!(
            hypernode_name("ec2tl", 1, "nn-e50490a237cb0f01a"),
            "ec2tl-t1-nn-e50490a237cb0f01a"
        );
        for id in ["NN-UPPER", "nn_under.score", &"n".repeat(100), "ünï", "---"] {
            let n = hypernode_name("ec2tl", 2, id);
            assert!(n.len() <= 63, "{n}");
            assert!(
                n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'),
                "{n}"
            );
            assert!(n.ends_with(|c: char| c.is_ascii_alphanumeric()), "{n}");
        }
        assert_ne!(
            hypernode_name("p", 1, "NN-A"),
            hypernode_name("p", 1, "nn-a")
        );
    }

    #[test]
    fn nodes_without_labels_contribute_nothing_and_empty_input_gives_nothing() {
        let mut v = view("n", &[]);
        v.labels.insert("other".into(), "x".into());
        assert_eq!(
            desired(&LabelScheme::default(), &[v], "ec2tl", Tier0::UltraServers),
            Ok(vec![])
        );
    }
}

//! Coverage: of the nodes of each instance type and each zone, how many carry each layer label
//! and how many carry every layer their type has, so an operator sees "98 % of p5 nodes carry
//! all levels" at a glance. Pure: built from the nodes' labels.
//!
//! A type's depth is the deepest path seen among its nodes (EC2 gives 3 layers for most types,
//! 4 for some); a node is fully labelled when its path has that depth. A scheduler topology with
//! more levels than a node carries leaves that node out (Kueue, KAI): the per-layer columns say
//! how many would be left out at each depth.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    labels::{LabelScheme, MAX_LAYERS},
    tree::{NodeView, path_of},
};

/// The well-known label naming a node's instance type.
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
/// The well-known label naming a node's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// One group of nodes (an instance type, or a zone).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    pub nodes: usize,
    /// `with_layer[i]`: nodes carrying a contiguous path of at least `i + 1` layers.
    pub with_layer: Vec<usize>,
    /// The deepest path among the group's nodes (0: none labelled).
    pub depth: usize,
    /// Nodes whose path has `depth` layers.
    pub full: usize,
}

impl Group {
    fn add(&mut self, depth: usize) {
        self.nodes += 1;
        if self.with_layer.len() < depth {
            self.with_layer.resize(depth, 0);
        }
        for c in self.with_layer.iter_mut().take(depth) {
            *c += 1;
        }
    }

    /// Percentage of the group's nodes fully labelled (100 for an empty group).
    pub fn percent_full(&self) -> f64 {
        if self.nodes == 0 {
            100.0
        } else {
            self.full as f64 * 100.0 / self.nodes as f64
        }
    }
}

/// Coverage by instance type and by zone (`(none)` when a node lacks the label).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Coverage {
    pub by_instance_type: BTreeMap<String, Group>,
    pub by_zone: BTreeMap<String, Group>,
}

const NONE: &str = "(none)";

/// A node's depth as coverage counts it (its path's layers, padding counted once), read through
/// `label` (a node's label by key): no map of its labels needs to be built.
pub fn depth_of(scheme: &LabelScheme, label: impl Fn(&str) -> Option<String>) -> usize {
    let mut labels = BTreeMap::new();
    for n in 1..=MAX_LAYERS {
        let key = scheme.layer_key(n);
        match label(&key) {
            Some(v) => {
                labels.insert(key, v);
            }
            None => break,
        }
    }
    path_of(scheme, &labels).map_or(0, |p| p.len())
}

/// How many layer labels a node carries, from layer 1 on without a gap, padding included: a
/// scheduler Topology with that many levels (Kueue's, KAI's) takes the node in. Unlike
/// [`depth_of`], a node padded to `--uniform-depth` carries every level of it.
pub fn layer_labels_of(scheme: &LabelScheme, label: impl Fn(&str) -> Option<String>) -> usize {
    (1..=MAX_LAYERS)
        .take_while(|n| label(&scheme.layer_key(*n)).is_some())
        .count()
}

/// The layer labels a node carries when a scheduler Topology of `levels` layer levels leaves it
/// out: it has some, but fewer (`None`: it carries them all, or none at all — a node not
/// labelled yet, or one EC2 does not describe, is reported elsewhere).
pub fn short_of(
    scheme: &LabelScheme,
    levels: usize,
    label: impl Fn(&str) -> Option<String>,
) -> Option<usize> {
    let carried = layer_labels_of(scheme, label);
    (carried > 0 && carried < levels).then_some(carried)
}

/// Coverage per (instance type, zone) cell, from each node's type, zone and depth; a cell's
/// `full` counts nodes as deep as the deepest node of their type in any zone.
pub fn cells(
    nodes: impl IntoIterator<Item = (Option<String>, Option<String>, usize)>,
) -> BTreeMap<(String, String), Group> {
    let mut by_cell: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    let mut type_depth: BTreeMap<String, usize> = BTreeMap::new();
    for (t, z, depth) in nodes {
        let t = t.unwrap_or_else(|| NONE.into());
        let d = type_depth.entry(t.clone()).or_default();
        *d = (*d).max(depth);
        by_cell
            .entry((t, z.unwrap_or_else(|| NONE.into())))
            .or_default()
            .push(depth);
    }
    by_cell
        .into_iter()
        .map(|((t, z), depths)| {
            let mut g = Group::default();
            for d in &depths {
                g.add(*d);
            }
            g.depth = type_depth.get(&t).copied().unwrap_or(0);
            g.full = if g.depth == 0 {
                0
            } else {
                depths.iter().filter(|d| **d == g.depth).count()
            };
            g.with_layer.resize(g.depth, 0);
            ((t, z), g)
        })
        .collect()
}

impl Coverage {
    pub fn build(scheme: &LabelScheme, nodes: &[NodeView]) -> Self {
        let mut cov = Coverage::default();
        // (group, (type, depth) of each node) first: a type's depth is known only once all its
        // nodes are seen, and each node is judged against its own type's depth, in a zone too
        // (a zone of 3- and 4-layer types is not judged against 4 layers throughout).
        let mut types: BTreeMap<String, Vec<(String, usize)>> = BTreeMap::new();
        let mut zones: BTreeMap<String, Vec<(String, usize)>> = BTreeMap::new();
        for n in nodes {
            let depth = path_of(scheme, &n.labels).map_or(0, |p| p.len().min(MAX_LAYERS));
            let of = |key: &str| n.labels.get(key).cloned().unwrap_or_else(|| NONE.into());
            let ty = of(INSTANCE_TYPE_LABEL);
            types
                .entry(ty.clone())
                .or_default()
                .push((ty.clone(), depth));
            zones.entry(of(ZONE_LABEL)).or_default().push((ty, depth));
        }
        let type_depth: BTreeMap<String, usize> = types
            .iter()
            .map(|(t, ds)| (t.clone(), ds.iter().map(|(_, d)| *d).max().unwrap_or(0)))
            .collect();
        let fold = |nodes: Vec<(String, usize)>| {
            let mut g = Group::default();
            for (_, d) in &nodes {
                g.add(*d);
            }
            g.depth = nodes.iter().map(|(_, d)| *d).max().unwrap_or(0);
            g.full = nodes
                .iter()
                .filter(|(t, d)| *d > 0 && type_depth.get(t) == Some(d))
                .count();
            g.with_layer.resize(g.depth, 0);
            g
        };
        cov.by_instance_type = types.into_iter().map(|(k, v)| (k, fold(v))).collect();
        cov.by_zone = zones.into_iter().map(|(k, v)| (k, fold(v))).collect();
        cov
    }

    /// The coverage as a text table: one row per instance type, then per zone.
    pub fn render(&self) -> String {
        let width = self
            .by_instance_type
            .values()
            .chain(self.by_zone.values())
            .map(|g| g.depth)
            .max()
            .unwrap_or(0);
        let mut out =
            String::from("coverage: nodes carrying each layer, and every layer their type has\n");
        let mut header = format!("  {:<28} {:>7}", "", "nodes");
        for l in 1..=width {
            header.push_str(&format!(" {:>8}", format!("layer-{l}")));
        }
        header.push_str(&format!(" {:>8}\n", "all"));
        for (title, groups) in [
            ("instance type", &self.by_instance_type),
            ("zone", &self.by_zone),
        ] {
            out.push_str(&header.replacen(&format!("  {:<28}", ""), &format!("  {title:<28}"), 1));
            for (name, g) in groups {
                let mut row = format!("  {name:<28} {:>7}", g.nodes);
                for l in 0..width {
                    match g.with_layer.get(l) {
                        Some(c) => row.push_str(&format!(" {c:>8}")),
                        None => row.push_str(&format!(" {:>8}", "-")),
                    }
                }
                if g.depth == 0 {
                    // No node of the group has topology labels (a type EC2 does not describe).
                    row.push_str(&format!(" {:>8}\n", "-"));
                } else {
                    row.push_str(&format!(" {:>7.0}%\n", g.percent_full()));
                }
                out.push_str(&row);
            }
        }
        out
    }
}

//! Slurm's view of the tree: `topology.conf` for the tree plugin, the newer `topology.yaml`
//! (Slurm 25.05 and later; it wins when both exist). Pure: built from a [`Forest`], nothing
//! here does I/O.
//!
//! Slurm names its nodes itself: these files use the Kubernetes node names, which is right when
//! the Slurm node names are the Kubernetes node names (plain Slurm on the instances). Slinky runs
//! `slurmd` in pods named otherwise; for it, [`Options::switches_only`] gives the switches alone
//! and each node joins its leaf through the `topology.slinky.slurm.net/spec` annotation.
//!
//! What slurmctld refuses decides the shape (seen with Debian's 22.05 and 26.05, each `fatal`
//! at start and on `scontrol reconfigure`, which stops a running slurmctld):
//! - a switch with both `Switches=` and `Nodes=` (26.05's `topology.yaml` only drops the
//!   children, silently). A network node that is the switch of some instances and the parent
//!   of other network nodes (a 3-layer type under a 4-layer one's layer 3) keeps its name for
//!   its own instances, and a switch named `<network node>`[`ABOVE`] stands for it as the parent:
//!   every node sits in the switch named after its deepest network node, and Slinky's annotation
//!   names a leaf (a dynamic node naming a non-leaf switch is refused);
//! - a switch name defined twice: labels that put a network node under two parents, or at two
//!   layers, give no valid file ([`Problem`]); publish nothing then;
//! - no switch at all (`topology.conf` in 26.05, `topology.yaml`), or a switch with neither
//!   children nor nodes (`topology.conf` in 22.05). [`data`] therefore gives no files for an
//!   empty fleet ([`Problem::NoSwitch`]: the publisher keeps what it wrote last); only
//!   [`topology_yaml`] alone makes one for it, with the one switch [`ROOT`], which 26.05 loads.
//!
//! Slurm wants every node under some switch, and lets a job span only switches joined by a
//! common ancestor. So when the fleet has more than one top-level network node, a switch named
//! [`ROOT`] joins them (EC2's top-level network nodes of one region are connected, only further
//! apart); nodes without topology labels hang off a switch of their own, [`UNLABELLED`], under
//! that root, so Slurm neither drops them nor takes them for neighbours of anyone labelled.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use crate::labels::LabelScheme;
use crate::tree::{Conflict, Domain, Forest, NodeView, path_of};

/// The switch joining the top-level network nodes, when there is more than one.
pub const ROOT: &str = "root";
/// The switch the nodes without topology labels hang off.
pub const UNLABELLED: &str = "unlabelled";
/// Appended to a network node's name for the switch that stands for it as a parent, when
/// instances also hang off it directly (`+` is never in a label value, so no network node
/// can be named so).
pub const ABOVE: &str = "+";
/// Longest switch name Slurm takes (`topology.yaml(5)`, 26.05).
pub const MAX_NAME: usize = 64;

/// Why the labels give no file slurmctld would load.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Problem {
    /// A network node under more than one parent (labels disagree).
    TwoParents(Conflict),
    /// One switch name for two places in the tree (a network node at two layers, or a network
    /// node named like a switch of ours).
    DefinedTwice(String),
    /// A name Slurm cannot take as a switch (empty, too long, or with characters its hostlist
    /// parser reads).
    BadName(String),
    /// No switch at all: no node in the fleet (`topology.conf` only).
    NoSwitch,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::TwoParents(c) => write!(
                f,
                "network node {} (layer {}) is under more than one parent: {}",
                c.network_node,
                c.layer,
                c.parents.join(", ")
            ),
            Problem::DefinedTwice(name) => write!(
                f,
                "switch name {name:?} would be defined twice (a network node at two layers, or named like a switch ec2-topology-labeler adds)"
            ),
            Problem::BadName(name) => write!(f, "{name:?} is not a switch name Slurm takes"),
            Problem::NoSwitch => f.write_str("no node at all: topology.conf needs a switch"),
        }
    }
}

/// How the files are drawn.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    /// Leave node names out (Slinky: its Slurm nodes are pods, which join their leaf switch
    /// through the annotation); `topology.yaml` only, as `topology.conf` refuses a switch with
    /// neither children nor nodes.
    pub switches_only: bool,
    /// A block topology of this name too (`topology.yaml` only): one block per capacity block.
    pub blocks: Option<Blocks>,
}

/// A block topology: its name and, per block (capacity block), its nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Blocks {
    pub topology: String,
    pub blocks: BTreeMap<String, Vec<String>>,
    /// Per block, its instances as EC2 counts them (the `capacity-block-size` label of
    /// `--ultraserver-shape`), where its nodes carry one.
    pub sizes: BTreeMap<String, usize>,
}

/// One switch: its name and either its child switches or its nodes (in switches-only mode a
/// leaf has neither).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    pub name: String,
    pub switches: Vec<String>,
    pub nodes: Vec<String>,
}

impl Blocks {
    /// The block topology `topology` of these nodes: a block per capacity block, holding the
    /// nodes that carry its label and topology labels (those Slinky's annotation names it for).
    pub fn of(scheme: &LabelScheme, nodes: &[NodeView], topology: &str) -> Self {
        let mut blocks: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut sizes = BTreeMap::new();
        if let Some(key) = &scheme.capacity_block_key {
            for n in nodes {
                if let Some(cb) = n.labels.get(key)
                    && path_of(scheme, &n.labels).is_some()
                {
                    blocks.entry(cb.clone()).or_default().push(n.name.clone());
                    if let Some(size) = n
                        .labels
                        .get(crate::labels::CAPACITY_BLOCK_SIZE_KEY)
                        .and_then(|s| s.parse::<usize>().ok())
                        .filter(|s| *s > 0)
                    {
                        // Members agree (one block, one answer); the largest if they do not.
                        let at = sizes.entry(cb.clone()).or_insert(size);
                        *at = (*at).max(size);
                    }
                }
            }
        }
        for v in blocks.values_mut() {
            v.sort();
        }
        Self {
            topology: topology.to_string(),
            blocks,
            sizes,
        }
    }

    /// The base block size of switches-only mode (no nodes listed: Slinky's pods join their
    /// block as they come): the smallest block's size, each block's being its instances as EC2
    /// counts them where known, else the nodes labelled in it.
    pub fn base_size(&self) -> usize {
        self.blocks
            .iter()
            .map(|(b, nodes)| self.sizes.get(b).copied().unwrap_or(nodes.len()))
            .min()
            .unwrap_or(1)
            .max(1)
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+'))
}

/// Every switch of the forest, leaves first within each subtree, then the unlabelled switch and
/// the root; or why there is no valid set.
pub fn switches(forest: &Forest, opts: &Options) -> Result<Vec<Switch>, Vec<Problem>> {
    /// Adds `d`'s switches; returns the name its parent lists it by.
    fn walk(d: &Domain, opts: &Options, out: &mut Vec<Switch>) -> String {
        let children: Vec<String> = d.children.values().map(|c| walk(c, opts, out)).collect();
        let nodes: Vec<String> = if opts.switches_only {
            Vec::new()
        } else {
            d.nodes.iter().map(|n| n.name.clone()).collect()
        };
        if children.is_empty() || d.nodes.is_empty() {
            out.push(Switch {
                name: d.id.clone(),
                switches: children,
                nodes,
            });
            return d.id.clone();
        }
        // Instances hang off this network node and deeper network nodes too: the node keeps its
        // name as the leaf of its own instances, and a switch above stands for it as the parent.
        out.push(Switch {
            name: d.id.clone(),
            switches: Vec::new(),
            nodes,
        });
        let above = format!("{}{ABOVE}", d.id);
        out.push(Switch {
            name: above.clone(),
            switches: std::iter::once(d.id.clone()).chain(children).collect(),
            nodes: Vec::new(),
        });
        above
    }
    let mut problems: Vec<Problem> = forest
        .conflicts
        .iter()
        .cloned()
        .map(Problem::TwoParents)
        .collect();
    let mut out = Vec::new();
    let mut tops: Vec<String> = forest
        .roots
        .values()
        .map(|d| walk(d, opts, &mut out))
        .collect();
    if !forest.missing.is_empty() && !opts.switches_only {
        out.push(Switch {
            name: UNLABELLED.into(),
            switches: Vec::new(),
            nodes: forest.missing.clone(),
        });
        tops.push(UNLABELLED.into());
    }
    if tops.len() > 1 {
        out.push(Switch {
            name: ROOT.into(),
            switches: tops,
            nodes: Vec::new(),
        });
    }
    let conflicted: BTreeSet<&str> = forest
        .conflicts
        .iter()
        .map(|c| c.network_node.as_str())
        .collect();
    let mut seen = BTreeSet::new();
    for s in &out {
        if !valid_name(&s.name) {
            problems.push(Problem::BadName(s.name.clone()));
        } else if !seen.insert(s.name.as_str()) && !conflicted.contains(s.name.as_str()) {
            problems.push(Problem::DefinedTwice(s.name.clone()));
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        problems.sort();
        problems.dedup();
        Err(problems)
    }
}

const HEADER: &str = "# Generated by ec2-topology-labeler from the nodes' topology labels \
                      (EC2 DescribeInstanceTopology); edits are overwritten.";

/// Slurm's `topology.conf` for the tree plugin (`TopologyPlugin=topology/tree`): one line per
/// switch, `SwitchName=<network node> Switches=<children>` or `Nodes=<nodes>`.
pub fn topology_conf(forest: &Forest) -> Result<String, Vec<Problem>> {
    let all = switches(forest, &Options::default())?;
    if all.is_empty() {
        return Err(vec![Problem::NoSwitch]);
    }
    let mut out = String::new();
    let _ = writeln!(out, "{HEADER}");
    for s in all {
        let _ = write!(out, "SwitchName={}", s.name);
        if !s.switches.is_empty() {
            let _ = write!(out, " Switches={}", s.switches.join(","));
        }
        if !s.nodes.is_empty() {
            let _ = write!(out, " Nodes={}", s.nodes.join(","));
        }
        out.push('\n');
    }
    Ok(out)
}

/// Slurm's `topology.yaml`: a tree topology called `name` (the cluster default), and the block
/// topology of [`Options::blocks`] when set.
pub fn topology_yaml(forest: &Forest, name: &str, opts: &Options) -> Result<String, Vec<Problem>> {
    let mut all = switches(forest, opts)?;
    if all.is_empty() {
        // Slurm refuses a tree without switches; one without nodes it takes.
        all.push(Switch {
            name: ROOT.into(),
            switches: Vec::new(),
            nodes: Vec::new(),
        });
    }
    let mut out = String::new();
    let _ = writeln!(out, "{HEADER}");
    out.push_str("---\n");
    let _ = writeln!(out, "- topology: {}", yaml_scalar(name));
    out.push_str("  cluster_default: true\n  tree:\n    switches:\n");
    for s in all {
        let _ = writeln!(out, "      - switch: {}", yaml_scalar(&s.name));
        if !s.switches.is_empty() {
            let _ = writeln!(
                out,
                "        children: {}",
                yaml_scalar(&s.switches.join(","))
            );
        }
        if !s.nodes.is_empty() {
            let _ = writeln!(out, "        nodes: {}", yaml_scalar(&s.nodes.join(",")));
        }
    }
    if let Some(b) = opts.blocks.as_ref().filter(|b| !b.blocks.is_empty()) {
        let _ = writeln!(out, "- topology: {}\n  block:", yaml_scalar(&b.topology));
        if opts.switches_only {
            // Blocks without nodes need a base block size (slurmctld 26.05: fatal otherwise):
            // the smallest block's size, so that every block can hold a job of it.
            let base = b.base_size();
            let _ = writeln!(out, "    block_sizes: [{base}]");
        }
        out.push_str("    blocks:\n");
        for (block, nodes) in &b.blocks {
            let _ = writeln!(out, "      - block: {}", yaml_scalar(block));
            if !opts.switches_only {
                let _ = writeln!(out, "        nodes: {}", yaml_scalar(&nodes.join(",")));
            }
        }
    }
    Ok(out)
}

/// How the Slurm files are drawn: the tree topology's name and switches only (Slinky). The
/// block topology, if any, is the one the scheme's Slinky annotation names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Files {
    pub tree_topology: String,
    pub switches_only: bool,
}

/// The ConfigMap's data for these nodes: `topology.yaml`, then `topology.conf` (not in
/// switches-only mode); or why the labels give no file slurmctld would load.
pub fn data(
    scheme: &LabelScheme,
    files: &Files,
    nodes: &[NodeView],
) -> Result<Vec<(String, String)>, Vec<Problem>> {
    let forest = Forest::build(scheme, nodes);
    let block = scheme
        .slinky
        .as_ref()
        .and_then(|s| s.block_topology.as_deref());
    let opts = Options {
        switches_only: files.switches_only,
        blocks: block.map(|b| Blocks::of(scheme, nodes, b)),
    };
    let mut out = vec![(
        "topology.yaml".to_string(),
        topology_yaml(&forest, &files.tree_topology, &opts)?,
    )];
    if !files.switches_only {
        out.push(("topology.conf".into(), topology_conf(&forest)?));
    }
    Ok(out)
}

/// A YAML plain scalar when that reads back as the same string, else a double-quoted one.
fn yaml_scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ',' | '/'))
        && !s.starts_with(['-', '.', ','])
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "yes" | "no" | "on" | "off" | "null" | "~"
        )
        && s.parse::<f64>().is_err();
    if plain {
        return s.to_string();
    }
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(q, "\\u{:04x}", u32::from(c));
            }
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

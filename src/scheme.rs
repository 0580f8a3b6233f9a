//! Which labels to write: the flags, turned into the core's [`LabelScheme`]. (The core crate
//! stays free of the command line: its types are mirrored here where clap needs them.)
//!
//! Owns: the label flags. Never does I/O.

use clap::{Args, ValueEnum};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::labels::{
    CAPACITY_BLOCK_KEY, EKS_LAYER_PREFIX, EKS_ZONE_ID_KEY, LabelScheme, LayerNumbering,
    PLACEMENT_GROUP_KEY, SLURM_TREE_TOPOLOGY, SlinkySpec,
};

/// How layer labels are numbered (the flag's values; see [`LayerNumbering`]).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ValueEnum, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum LayerNumberingArg {
    /// `…-1` is the top of the hierarchy, `…-<depth>` the switch above the instance (EKS's scheme).
    #[default]
    TopFirst,
    /// `…-1` is the switch above the instance, counting upwards.
    LeafFirst,
}

impl From<LayerNumberingArg> for LayerNumbering {
    fn from(a: LayerNumberingArg) -> Self {
        match a {
            LayerNumberingArg::TopFirst => LayerNumbering::TopFirst,
            LayerNumberingArg::LeafFirst => LayerNumbering::LeafFirst,
        }
    }
}

/// Which labels to write.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LabelArgs {
    /// Prefix of the per-layer label keys; the layer number is appended. The default is the key
    /// family EKS itself writes.
    #[arg(long, env = "LABELER_LAYER_LABEL_PREFIX", default_value = EKS_LAYER_PREFIX)]
    pub layer_label_prefix: String,
    /// top-first: layer 1 is the top of the hierarchy (EKS). leaf-first: layer 1 is the switch
    /// above the instance.
    #[arg(long, env = "LABELER_LAYER_NUMBERING", value_enum, default_value_t)]
    pub layer_numbering: LayerNumberingArg,
    /// Write the zone ID label.
    #[arg(long, env = "LABELER_ZONE_ID_LABEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub zone_id_label: bool,
    /// Key of the zone ID label.
    #[arg(long, env = "LABELER_ZONE_ID_LABEL_KEY", default_value = EKS_ZONE_ID_KEY)]
    pub zone_id_label_key: String,
    /// Write the capacity block (UltraServer domain) label when EC2 reports one.
    #[arg(long, env = "LABELER_CAPACITY_BLOCK_LABEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub capacity_block_label: bool,
    /// Key of the capacity block label.
    #[arg(long, env = "LABELER_CAPACITY_BLOCK_LABEL_KEY", default_value = CAPACITY_BLOCK_KEY)]
    pub capacity_block_label_key: String,
    /// Write the placement group label (sanitised) and annotation (raw name).
    #[arg(long, env = "LABELER_PLACEMENT_GROUP_LABEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub placement_group_label: bool,
    /// Key of the placement group label and annotation.
    #[arg(long, env = "LABELER_PLACEMENT_GROUP_LABEL_KEY", default_value = PLACEMENT_GROUP_KEY)]
    pub placement_group_label_key: String,
    /// Give every node this many layer labels: a node whose type has fewer gets its deepest
    /// network node repeated down to this layer, so one Kueue Topology of this many levels
    /// covers a fleet of 3- and 4-layer types (top-first numbering only; see
    /// docs/schedulers.md for the trade-off).
    #[arg(long, env = "LABELER_UNIFORM_DEPTH", value_parser = clap::value_parser!(u8).range(1..=16))]
    #[schemars(range(min = 1, max = 16))]
    pub uniform_depth: Option<u8>,
    /// Write Slinky's `topology.slinky.slurm.net/spec` annotation on each node
    /// (`<tree topology>:<deepest network node>`), for a NodeSet with `syncTopology`.
    #[arg(long, env = "LABELER_SLINKY_ANNOTATION", default_value_t = false, action = clap::ArgAction::Set)]
    pub slinky_annotation: bool,
    /// Name of the Slurm tree topology: in `tree -o slurm-yaml`, the Slurm ConfigMap and the
    /// Slinky annotation (partitions select it by this name).
    #[arg(long, env = "LABELER_SLURM_TOPOLOGY_NAME", default_value = SLURM_TREE_TOPOLOGY)]
    pub slurm_topology_name: String,
    /// Also name a block topology in the Slinky annotation, the node's capacity block its
    /// block (`,<name>:<capacity block>`); the Slurm ConfigMap's `topology.yaml` defines it.
    #[arg(long, env = "LABELER_SLINKY_BLOCK_TOPOLOGY")]
    pub slinky_block_topology: Option<String>,
    /// Slurm's `topology.yaml` (`tree -o slurm-yaml`, the Slurm ConfigMap) with switches and
    /// blocks only, no node names: for Slinky, whose Slurm nodes are pods that join their leaf
    /// switch through the annotation (Slurm 25.05 and later; no `topology.conf` then).
    #[arg(long, env = "LABELER_SLURM_SWITCHES_ONLY", default_value_t = false, action = clap::ArgAction::Set)]
    pub slurm_switches_only: bool,
}

impl LabelArgs {
    pub fn scheme(&self) -> Result<LabelScheme, String> {
        let scheme = LabelScheme {
            layer_prefix: self.layer_label_prefix.clone(),
            numbering: self.layer_numbering.into(),
            zone_id_key: self.zone_id_label.then(|| self.zone_id_label_key.clone()),
            capacity_block_key: self
                .capacity_block_label
                .then(|| self.capacity_block_label_key.clone()),
            placement_group_key: self
                .placement_group_label
                .then(|| self.placement_group_label_key.clone()),
            uniform_depth: self.uniform_depth.map(usize::from),
            slinky: self.slinky_annotation.then(|| SlinkySpec {
                tree_topology: self.slurm_topology_name.clone(),
                block_topology: self.slinky_block_topology.clone(),
            }),
        };
        scheme.validate()?;
        Ok(scheme)
    }
}

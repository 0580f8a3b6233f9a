//! Which labels to write: the flags, turned into the core's [`LabelScheme`]. (The core crate
//! stays free of the command line: its types are mirrored here where clap needs them.)
//!
//! Owns: the label flags. Never does I/O.

use crate::bounds::Bound;
use clap::{Args, ValueEnum};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::labels::{
    CAPACITY_BLOCK_KEY, EKS_LAYER_PREFIX, EKS_ZONE_ID_KEY, HYPERPOD_ULTRASERVER_KEY, LabelScheme,
    LayerNumbering, PLACEMENT_GROUP_KEY, SLURM_TREE_TOPOLOGY, SlinkySpec, TOPOGRAPH_DOMAIN_KEY,
    TOPOGRAPH_TIER_PREFIX,
};

/// Whose label keys to write: so that node selectors, Kueue/KAI Topologies and Volcano
/// HyperNodes written for another labeller keep working (docs/migrating-from-hyperpod.md,
/// docs/migrating-from-topograph.md).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ValueEnum, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum LabelPreset {
    /// EKS's own keys: `topology.k8s.aws/network-node-layer-N` (1 = top) and `zone-id`, plus
    /// our capacity-block and placement-group keys.
    #[default]
    Eks,
    /// SageMaker HyperPod's: EKS's layer keys, and the capacity block (UltraServer) as
    /// `topology.k8s.aws/ultraserver-id`.
    Hyperpod,
    /// NVIDIA topograph's: `fabric.topograph.run/tier-N` (tier-0 = the switch above the
    /// instance, counting upwards) and the capacity block as `accelerator.topograph.run/domain`.
    Topograph,
}

/// How layer labels are numbered (the flag's values; see [`LayerNumbering`]).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ValueEnum, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum LayerNumberingArg {
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

/// `--uniform-depth`'s range.
pub(crate) const UNIFORM_DEPTH_RANGE: Bound = Bound::count("uniform-depth", 1, 16);

/// Which labels to write.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LabelArgs {
    /// Whose label keys to write (eks, hyperpod, topograph). A preset sets the layer keys, their
    /// numbering and the capacity block's key; `--layer-label-prefix` and
    /// `--capacity-block-label-key`, when given other values than their defaults, still win.
    #[arg(long, env = "LABELER_LABEL_PRESET", value_enum, default_value_t)]
    #[serde(default)]
    pub(crate) label_preset: LabelPreset,
    /// Prefix of the per-layer label keys; the layer number is appended. The default is the key
    /// family EKS itself writes.
    #[arg(long, env = "LABELER_LAYER_LABEL_PREFIX", default_value = EKS_LAYER_PREFIX)]
    pub(crate) layer_label_prefix: String,
    /// top-first: layer 1 is the top of the hierarchy (EKS). leaf-first: layer 1 is the switch
    /// above the instance.
    #[arg(long, env = "LABELER_LAYER_NUMBERING", value_enum, default_value_t)]
    pub(crate) layer_numbering: LayerNumberingArg,
    /// Write the zone ID label.
    #[arg(long, env = "LABELER_ZONE_ID_LABEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) zone_id_label: bool,
    /// Key of the zone ID label.
    #[arg(long, env = "LABELER_ZONE_ID_LABEL_KEY", default_value = EKS_ZONE_ID_KEY)]
    pub(crate) zone_id_label_key: String,
    /// Write the capacity block (UltraServer domain) label when EC2 reports one.
    #[arg(long, env = "LABELER_CAPACITY_BLOCK_LABEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) capacity_block_label: bool,
    /// Key of the capacity block label.
    #[arg(long, env = "LABELER_CAPACITY_BLOCK_LABEL_KEY", default_value = CAPACITY_BLOCK_KEY)]
    pub(crate) capacity_block_label_key: String,
    /// Write the placement group label (sanitised) and annotation (raw name).
    #[arg(long, env = "LABELER_PLACEMENT_GROUP_LABEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) placement_group_label: bool,
    /// Key of the placement group label and annotation.
    #[arg(long, env = "LABELER_PLACEMENT_GROUP_LABEL_KEY", default_value = PLACEMENT_GROUP_KEY)]
    pub(crate) placement_group_label_key: String,
    /// Give every node this many layer labels: a node whose type has fewer gets its deepest
    /// network node repeated down to this layer, so one Kueue Topology of this many levels
    /// covers a fleet of 3- and 4-layer types (top-first numbering only; see
    /// docs/schedulers.md for the trade-off).
    #[arg(long, env = "LABELER_UNIFORM_DEPTH", value_parser = UNIFORM_DEPTH_RANGE.counts::<u8>())]
    pub(crate) uniform_depth: Option<u8>,
    /// Write Slinky's `topology.slinky.slurm.net/spec` annotation on each node
    /// (`<tree topology>:<deepest network node>`), for a NodeSet with `syncTopology`.
    #[arg(long, env = "LABELER_SLINKY_ANNOTATION", default_value_t = false, action = clap::ArgAction::Set)]
    pub(crate) slinky_annotation: bool,
    /// Name of the Slurm tree topology: in `tree -o slurm-yaml`, the Slurm ConfigMap and the
    /// Slinky annotation (partitions select it by this name).
    #[arg(long, env = "LABELER_SLURM_TOPOLOGY_NAME", default_value = SLURM_TREE_TOPOLOGY)]
    pub(crate) slurm_topology_name: String,
    /// Also name a block topology in the Slinky annotation, the node's capacity block its
    /// block (`,<name>:<capacity block>`); the Slurm ConfigMap's `topology.yaml` defines it.
    #[arg(long, env = "LABELER_SLINKY_BLOCK_TOPOLOGY")]
    pub(crate) slinky_block_topology: Option<String>,
    /// Slurm's `topology.yaml` (`tree -o slurm-yaml`, the Slurm ConfigMap) with switches and
    /// blocks only, no node names: for Slinky, whose Slurm nodes are pods that join their leaf
    /// switch through the annotation (Slurm 25.05 and later; no `topology.conf` then).
    #[arg(long, env = "LABELER_SLURM_SWITCHES_ONLY", default_value_t = false, action = clap::ArgAction::Set)]
    pub(crate) slurm_switches_only: bool,
}

impl LabelArgs {
    pub fn scheme(&self) -> Result<LabelScheme, String> {
        // A key flag left at its default takes the preset's key.
        let given = |value: &String, default: &str, preset: &str| {
            if value == default {
                preset.to_string()
            } else {
                value.clone()
            }
        };
        let (layer_prefix, numbering, first_layer, capacity_block) = match self.label_preset {
            LabelPreset::Eks => (
                self.layer_label_prefix.clone(),
                self.layer_numbering.into(),
                1,
                self.capacity_block_label_key.clone(),
            ),
            LabelPreset::Hyperpod => (
                self.layer_label_prefix.clone(),
                self.layer_numbering.into(),
                1,
                given(
                    &self.capacity_block_label_key,
                    CAPACITY_BLOCK_KEY,
                    HYPERPOD_ULTRASERVER_KEY,
                ),
            ),
            // Leaf-first from tier 0 is what the preset is (a custom prefix under it too).
            LabelPreset::Topograph => (
                given(
                    &self.layer_label_prefix,
                    EKS_LAYER_PREFIX,
                    TOPOGRAPH_TIER_PREFIX,
                ),
                LayerNumbering::LeafFirst,
                0,
                given(
                    &self.capacity_block_label_key,
                    CAPACITY_BLOCK_KEY,
                    TOPOGRAPH_DOMAIN_KEY,
                ),
            ),
        };
        let scheme = LabelScheme {
            layer_prefix,
            numbering,
            first_layer,
            zone_id_key: self.zone_id_label.then(|| self.zone_id_label_key.clone()),
            capacity_block_key: self.capacity_block_label.then_some(capacity_block),
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use clap::Parser;

    use super::*;
    use crate::{
        cmd::{Cli, Command},
        labels::desired,
        publish::kueue,
        topology::InstanceTopology,
    };

    fn scheme_of(flags: &[&str]) -> LabelScheme {
        let cli = Cli::try_parse_from(["ec2-topology-labeler", "run"].iter().chain(flags))
            .expect("flags parse");
        let Command::Run(run) = cli.command else {
            panic!("run")
        };
        run.labels.scheme().expect("a valid scheme")
    }

    /// A GB200 NVL72 instance as EC2 describes it: three network nodes, an UltraServer.
    fn gb200() -> InstanceTopology {
        InstanceTopology {
            instance_id: "i-0123456789abcdef0".into(),
            instance_type: Some("p6e-gb200.36xlarge".into()),
            availability_zone: Some("us-east-1a".into()),
            zone_id: Some("use1-az4".into()),
            network_nodes: vec![
                "nn-1111111111111111a".into(),
                "nn-2222222222222222b".into(),
                "nn-3333333333333333c".into(),
            ],
            group_name: None,
            capacity_block_id: Some("cr-0123456789abcdef0".into()),
        }
    }

    fn labels(scheme: &LabelScheme) -> BTreeMap<String, String> {
        desired(scheme, &gb200()).expect("labels").labels
    }

    #[test]
    fn the_eks_preset_is_todays_keys() {
        assert_eq!(scheme_of(&[]), LabelScheme::default());
        assert_eq!(
            scheme_of(&["--label-preset", "eks"]),
            LabelScheme::default()
        );
    }

    #[test]
    fn hyperpod_writes_the_ultraserver_id_from_the_capacity_block() {
        let l = labels(&scheme_of(&["--label-preset", "hyperpod"]));
        assert_eq!(l["topology.k8s.aws/ultraserver-id"], "cr-0123456789abcdef0");
        assert_eq!(
            l["topology.k8s.aws/network-node-layer-1"],
            "nn-1111111111111111a"
        );
        assert_eq!(
            l["topology.k8s.aws/network-node-layer-3"],
            "nn-3333333333333333c"
        );
        assert!(
            !l.contains_key(CAPACITY_BLOCK_KEY),
            "one key for the block: {l:?}"
        );
    }

    #[test]
    fn topograph_writes_tiers_from_the_leaf_at_zero_and_the_domain() {
        let s = scheme_of(&["--label-preset", "topograph"]);
        let l = labels(&s);
        assert_eq!(
            l["fabric.topograph.run/tier-0"], "nn-3333333333333333c",
            "tier 0 is the leaf"
        );
        assert_eq!(l["fabric.topograph.run/tier-1"], "nn-2222222222222222b");
        assert_eq!(l["fabric.topograph.run/tier-2"], "nn-1111111111111111a");
        assert!(!l.contains_key("fabric.topograph.run/tier-3"));
        assert_eq!(
            l["accelerator.topograph.run/domain"],
            "cr-0123456789abcdef0"
        );
        assert!(!l.keys().any(|k| k.starts_with(EKS_LAYER_PREFIX)), "{l:?}");
        // Read back: tier-0 is the first layer from the leaf; tier-16 is beyond the family.
        assert_eq!(s.layer_index("fabric.topograph.run/tier-0"), Some(1));
        assert_eq!(s.layer_index("fabric.topograph.run/tier-15"), Some(16));
        assert_eq!(s.layer_index("fabric.topograph.run/tier-16"), None);
        // Any number a node's label may carry reads without overflow.
        let huge = format!("fabric.topograph.run/tier-{}", usize::MAX);
        assert_eq!(s.layer_index(&huge), None);
        let huge = format!("{EKS_LAYER_PREFIX}{}", usize::MAX);
        assert_eq!(LabelScheme::default().layer_index(&huge), None);
        // The scheduler objects follow: Kueue's levels coarsest first.
        assert_eq!(
            kueue::levels(&s, 3, true),
            [
                "fabric.topograph.run/tier-2",
                "fabric.topograph.run/tier-1",
                "fabric.topograph.run/tier-0",
                "kubernetes.io/hostname"
            ]
        );
    }

    #[test]
    fn a_key_flag_given_another_value_wins_over_the_preset() {
        let s = scheme_of(&[
            "--label-preset",
            "topograph",
            "--capacity-block-label-key",
            "example.com/domain",
        ]);
        assert_eq!(s.capacity_block_key.as_deref(), Some("example.com/domain"));
        assert_eq!(s.layer_prefix, TOPOGRAPH_TIER_PREFIX);
        let off = scheme_of(&["--label-preset", "hyperpod", "--capacity-block-label=false"]);
        assert_eq!(off.capacity_block_key, None);
        // topograph is leaf-first: uniform depth (top-first padding) is refused with it.
        let cli = Cli::try_parse_from([
            "ec2-topology-labeler",
            "run",
            "--label-preset",
            "topograph",
            "--uniform-depth",
            "4",
        ])
        .expect("flags parse");
        let Command::Run(run) = cli.command else {
            panic!("run")
        };
        assert!(run.labels.scheme().is_err());
    }

    /// What `docs/migrating-from-*.md` show for the preset: the labels on a GB200 node and
    /// Kueue's Topology levels.
    fn worked_example(preset: &str) -> String {
        let s = scheme_of(&["--label-preset", preset]);
        let mut out = format!(
            "```yaml\n# A p6e-gb200.36xlarge node, labelled by ec2-topology-labeler --label-preset {preset}\nmetadata:\n  labels:\n"
        );
        for (k, v) in labels(&s) {
            out.push_str(&format!("    {k}: {v}\n"));
        }
        out.push_str(
            "---\n# The Kueue Topology it publishes (--kueue-topology)\napiVersion: kueue.x-k8s.io/v1beta2\nkind: Topology\nmetadata:\n  name: aws-network\nspec:\n  levels:\n",
        );
        for level in kueue::levels(&s, 3, true) {
            out.push_str(&format!("  - nodeLabel: {level}\n"));
        }
        out.push_str("```\n");
        out
    }

    #[test]
    fn migration_docs_show_what_each_preset_writes() {
        crate::testing::docs::check_generated(
            "docs/migrating-from-hyperpod.md",
            "hyperpod-example",
            &worked_example("hyperpod"),
        );
        crate::testing::docs::check_generated(
            "docs/migrating-from-topograph.md",
            "topograph-example",
            &worked_example("topograph"),
        );
    }
}

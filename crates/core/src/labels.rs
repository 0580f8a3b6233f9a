//! Pure label logic: from an instance's topology to the labels (and annotation) its node should
//! carry, and from a node's current labels to the change that gets it there.
//!
//! Nothing here does I/O; the reconciler and `plan` call it with what they read.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::topology::InstanceTopology;

/// The well-known label with the node's instance type (set by the kubelet / cloud provider).
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";

/// GPU Feature Discovery's label for the node's NVLink clique.
pub const CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";

/// The layer-key prefix EKS itself writes; `…layer-1` is the top of the hierarchy.
pub const EKS_LAYER_PREFIX: &str = "topology.k8s.aws/network-node-layer-";
pub const EKS_ZONE_ID_KEY: &str = "topology.k8s.aws/zone-id";
pub const CAPACITY_BLOCK_KEY: &str = "ec2-topology-labeler.io/capacity-block-id";
pub const PLACEMENT_GROUP_KEY: &str = "ec2-topology-labeler.io/placement-group";
/// `--ultraserver-shape`: the UltraServer type of the node's capacity block.
pub const ULTRASERVER_TYPE_KEY: &str = "ec2-topology-labeler.io/ultraserver-type";
/// `--ultraserver-shape`: the instances of the node's capacity block (Slurm's base block size).
pub const CAPACITY_BLOCK_SIZE_KEY: &str = "ec2-topology-labeler.io/capacity-block-size";
/// `--ultraserver-shape`: when the node's capacity block ends (an annotation, RFC 3339).
pub const CAPACITY_BLOCK_END_KEY: &str = "ec2-topology-labeler.io/capacity-block-end";
/// The annotation Slinky's slurm-operator reads to place a node in Slurm's topology
/// (`<topology>:<switch or block>[,<topology>:<switch or block>]`).
pub const SLINKY_SPEC_KEY: &str = "topology.slinky.slurm.net/spec";
/// The name Slinky's docs give the tree topology (and `tree -o slurm-yaml` its default).
pub const SLURM_TREE_TOPOLOGY: &str = "topo-switch";

/// SageMaker HyperPod's UltraServer key (`--label-preset hyperpod` writes the capacity block
/// there).
pub const HYPERPOD_ULTRASERVER_KEY: &str = "topology.k8s.aws/ultraserver-id";
/// NVIDIA topograph's tier keys: `…tier-0` is the switch above the instance, counting upwards.
pub const TOPOGRAPH_TIER_PREFIX: &str = "fabric.topograph.run/tier-";
/// NVIDIA topograph's accelerator (NVLink) domain key: the capacity block on AWS.
pub const TOPOGRAPH_DOMAIN_KEY: &str = "accelerator.topograph.run/domain";

/// Deepest hierarchy we label (Kueue allows at most 16 levels).
pub const MAX_LAYERS: usize = 16;

/// How layer labels are numbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayerNumbering {
    /// `…-1` is the top of the hierarchy, `…-<depth>` the switch above the instance (EKS's scheme).
    #[default]
    TopFirst,
    /// `…-1` is the switch above the instance, counting upwards.
    LeafFirst,
}

/// Which keys we manage. An extra switched off (`None`) is out of the family: a reconcile never
/// writes or removes it (the controller gives up, once at start-up, the keys of it that it wrote
/// itself, from the managed fields; see the controller's `retire` module).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelScheme {
    pub layer_prefix: String,
    pub numbering: LayerNumbering,
    /// The number the first layer key carries: 1 (EKS), or 0 (topograph's `tier-0`).
    pub first_layer: usize,
    pub zone_id_key: Option<String>,
    pub capacity_block_key: Option<String>,
    /// Used both as a label (sanitised value) and an annotation (raw name).
    pub placement_group_key: Option<String>,
    /// Pad every node's layers to this many, repeating its deepest network node (top-first
    /// numbering only), so one scheduler topology of this many levels covers a mixed fleet.
    pub uniform_depth: Option<usize>,
    /// Write Slinky's per-node topology annotation ([`SLINKY_SPEC_KEY`]).
    pub slinky: Option<SlinkySpec>,
}

/// What Slinky's annotation names: the tree topology (its leaf switch is the node's deepest
/// network node) and, optionally, a block topology (its block is the node's capacity block).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlinkySpec {
    pub tree_topology: String,
    pub block_topology: Option<String>,
}

impl Default for LabelScheme {
    fn default() -> Self {
        Self {
            layer_prefix: EKS_LAYER_PREFIX.into(),
            numbering: LayerNumbering::TopFirst,
            first_layer: 1,
            zone_id_key: Some(EKS_ZONE_ID_KEY.into()),
            capacity_block_key: Some(CAPACITY_BLOCK_KEY.into()),
            placement_group_key: Some(PLACEMENT_GROUP_KEY.into()),
            uniform_depth: None,
            slinky: None,
        }
    }
}

impl LabelScheme {
    /// Check every key this scheme can produce is a valid Kubernetes label key.
    pub fn validate(&self) -> Result<(), String> {
        if self.first_layer > 1 {
            return Err(format!(
                "the first layer key is numbered 0 or 1, not {}",
                self.first_layer
            ));
        }
        let widest_layer = self.layer_key(MAX_LAYERS);
        for key in std::iter::once(&widest_layer)
            .chain(self.zone_id_key.iter())
            .chain(self.capacity_block_key.iter())
            .chain(self.placement_group_key.iter())
        {
            if !is_valid_label_key(key) {
                return Err(format!("{key:?} is not a valid label key"));
            }
        }
        let extras: Vec<&String> = self
            .zone_id_key
            .iter()
            .chain(self.capacity_block_key.iter())
            .chain(self.placement_group_key.iter())
            .collect();
        for (i, a) in extras.iter().enumerate() {
            if self.layer_index(a).is_some() || extras.iter().skip(i + 1).any(|b| b == a) {
                return Err(format!("label key {a:?} is used twice"));
            }
        }
        if let Some(n) = self.uniform_depth {
            if !(1..=MAX_LAYERS).contains(&n) {
                return Err(format!(
                    "uniform depth {n} is out of range (1 to {MAX_LAYERS})"
                ));
            }
            if self.numbering != LayerNumbering::TopFirst {
                return Err(
                    "uniform depth needs top-first layer numbering (with leaf-first, \
                    layer 1 is already the switch above every node)"
                        .into(),
                );
            }
        }
        if let Some(s) = &self.slinky {
            for name in std::iter::once(&s.tree_topology).chain(s.block_topology.iter()) {
                if name.is_empty() || name.contains([':', ',', ' ']) {
                    return Err(format!(
                        "Slurm topology name {name:?} must be non-empty, without ':', ',' or spaces"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The key of layer `n` (1-based, in this scheme's numbering).
    pub fn layer_key(&self, n: usize) -> String {
        use std::fmt::Write;
        // Sized for the number at once (`format!` grows its buffer as it writes).
        let mut key = String::with_capacity(self.layer_prefix.len() + 2);
        key.push_str(&self.layer_prefix);
        let _ = write!(key, "{}", (n + self.first_layer).saturating_sub(1));
        key
    }

    /// `Some(n)` (1-based, as [`LabelScheme::layer_key`] takes it) when `key` is one of our
    /// layer keys.
    pub fn layer_index(&self, key: &str) -> Option<usize> {
        let n = key.strip_prefix(&self.layer_prefix)?;
        // Only canonical spellings (`3`, not `03` or `+3`) belong to the family: digits alone,
        // no leading zero but `0` itself.
        let canonical = !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
            && (n == "0" || !n.starts_with('0'));
        if !canonical {
            return None;
        }
        let parsed: usize = n.parse().ok()?;
        let index = parsed.checked_add(1)?.checked_sub(self.first_layer)?;
        (1..=MAX_LAYERS).contains(&index).then_some(index)
    }

    /// Whether we manage this label key.
    pub fn is_family_label(&self, key: &str) -> bool {
        self.layer_index(key).is_some()
            || self.zone_id_key.as_deref() == Some(key)
            || self.capacity_block_key.as_deref() == Some(key)
            || self.placement_group_key.as_deref() == Some(key)
    }

    /// Whether we manage this annotation key (the verification record always).
    pub fn is_family_annotation(&self, key: &str) -> bool {
        key == crate::verified::VERIFIED_KEY
            || self.placement_group_key.as_deref() == Some(key)
            || (self.slinky.is_some() && key == SLINKY_SPEC_KEY)
    }
}

/// What a node should carry, from one topology answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Desired {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Family keys this answer says nothing about (for example no zone ID in it): left as they are.
    #[serde(skip)]
    pub keep: BTreeSet<String>,
}

/// Why an answer cannot be turned into labels. The node is left untouched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeriveError {
    #[error("EC2 returned no network nodes")]
    NoNetworkNodes,
    #[error("EC2 returned {0} network layers; at most {MAX_LAYERS} are labelled")]
    TooDeep(usize),
    #[error("EC2 returned a {what} that is not a valid label value: {value:?}")]
    InvalidValue { what: &'static str, value: String },
}

/// The labels and annotation a node should carry for this topology.
pub fn desired(scheme: &LabelScheme, t: &InstanceTopology) -> Result<Desired, DeriveError> {
    let depth = t.network_nodes.len();
    if depth == 0 {
        return Err(DeriveError::NoNetworkNodes);
    }
    if depth > MAX_LAYERS {
        return Err(DeriveError::TooDeep(depth));
    }
    let mut out = Desired::default();
    for (i, node) in t.network_nodes.iter().enumerate() {
        if !is_valid_label_value(node) {
            return Err(invalid("network node ID", node));
        }
        let n = match scheme.numbering {
            LayerNumbering::TopFirst => i + 1,
            LayerNumbering::LeafFirst => depth - i,
        };
        out.labels.insert(scheme.layer_key(n), node.clone());
    }
    // Uniform depth: the deepest network node stands for every missing layer below it, so a
    // scheduler level the node's type lacks still names the switch right above it.
    if let (Some(n), LayerNumbering::TopFirst, Some(deepest)) = (
        scheme.uniform_depth,
        scheme.numbering,
        t.network_nodes.last(),
    ) {
        for layer in depth + 1..=n {
            out.labels.insert(scheme.layer_key(layer), deepest.clone());
        }
    }
    if let Some(key) = &scheme.zone_id_key {
        match t.zone_id.as_deref().filter(|z| !z.is_empty()) {
            Some(z) if is_valid_label_value(z) => {
                out.labels.insert(key.clone(), z.to_string());
            }
            Some(z) => return Err(invalid("zone ID", z)),
            None => {
                out.keep.insert(key.clone());
            }
        }
    }
    if let Some(key) = &scheme.capacity_block_key {
        match t.capacity_block_id.as_deref().filter(|c| !c.is_empty()) {
            Some(cb) if is_valid_label_value(cb) => {
                out.labels.insert(key.clone(), cb.to_string());
            }
            Some(cb) => return Err(invalid("capacity block ID", cb)),
            // Missing is not "none": EC2 can leave the capacity block out of its first answers
            // after launch (eventual consistency, documented for DescribeInstanceTopology). A
            // label already there stays; the lookup asks again soon.
            None => {
                out.keep.insert(key.clone());
            }
        }
    }
    if let Some(key) = &scheme.placement_group_key
        && let Some(pg) = t.group_name.as_deref().filter(|g| !g.is_empty())
    {
        out.labels.insert(key.clone(), sanitize_label_value(pg));
        out.annotations.insert(key.clone(), pg.to_string());
    }
    Ok(out)
}

/// Fill in what is derived from the labels the node will carry once `desired` is applied to
/// `current` (kept keys stay as they are): Slinky's topology annotation, whose block comes from
/// the capacity-block label even when this answer left the capacity block out.
pub fn settle(scheme: &LabelScheme, current: &BTreeMap<String, String>, desired: &mut Desired) {
    settle_with(scheme, |k| current.get(k).map(String::as_str), desired);
}

/// As [`settle`], the node's current labels read through `current` (a label's value by key).
pub fn settle_with<'a>(
    scheme: &LabelScheme,
    current: impl Fn(&str) -> Option<&'a str>,
    desired: &mut Desired,
) {
    let Some(slinky) = &scheme.slinky else {
        return;
    };
    let mut will_carry = desired.labels.clone();
    for key in &desired.keep {
        if let Some(v) = current(key) {
            will_carry.insert(key.clone(), v.to_owned());
        }
    }
    if let Some(spec) = slinky_spec(scheme, slinky, &will_carry) {
        desired.annotations.insert(SLINKY_SPEC_KEY.into(), spec);
    }
}

/// One number for the family labels among `labels` (keys and values, in key order; every other
/// label ignored): equal for two label sets exactly when they carry the same family labels.
/// Keyed at random once per process (a label writer cannot aim at a value), in-process only.
pub fn family_fingerprint<'a>(
    scheme: &LabelScheme,
    labels: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    static KEY: std::sync::LazyLock<std::hash::RandomState> =
        std::sync::LazyLock::new(std::hash::RandomState::new);
    let mut h = KEY.build_hasher();
    for (k, v) in labels {
        if scheme.is_family_label(k) {
            (k, v).hash(&mut h);
        }
    }
    // Never 0 (the lowest bit set), so that a per-node record keeps it in 8 bytes as a
    // `NonZeroU64`.
    h.finish() | 1
}

/// [`family_fingerprint`] of what `desired` vouches for: its labels, and none of the keys the
/// answer says nothing about. A node carrying a value for such a key (a capacity block EC2 has
/// not confirmed in this boot, or one somebody wrote) does not have it: no answer vouches for it.
pub fn vouched_fingerprint(scheme: &LabelScheme, desired: &Desired) -> u64 {
    family_fingerprint(scheme, &desired.labels)
}

/// The network path of a node, top of the hierarchy first, read from its layer labels (a deepest
/// network node repeated by `--uniform-depth` counted once); `None` when it has none, or they do
/// not form a contiguous run from layer 1.
pub fn path_of(scheme: &LabelScheme, labels: &BTreeMap<String, String>) -> Option<Vec<String>> {
    let mut by_layer: BTreeMap<usize, &String> = BTreeMap::new();
    for (k, v) in labels {
        if let Some(n) = scheme.layer_index(k) {
            by_layer.insert(n, v);
        }
    }
    let depth = by_layer.len();
    if depth == 0 || depth > MAX_LAYERS || by_layer.keys().copied().ne(1..=depth) {
        return None;
    }
    let mut path: Vec<String> = by_layer.into_values().cloned().collect();
    if scheme.numbering == LayerNumbering::LeafFirst {
        path.reverse();
    }
    // A network node repeated at the bottom is uniform-depth padding (EC2 never names one
    // switch at two layers): the node hangs under it once.
    while let [.., above, last] = path.as_slice()
        && above == last
    {
        path.pop();
    }
    Some(path)
}

/// `<tree topology>:<deepest network node>[,<block topology>:<capacity block>]` for a node
/// with these labels; `None` when they hold no layers.
pub fn slinky_spec(
    scheme: &LabelScheme,
    slinky: &SlinkySpec,
    labels: &BTreeMap<String, String>,
) -> Option<String> {
    let leaf = path_of(scheme, labels)?.pop()?;
    let mut spec = format!("{}:{leaf}", slinky.tree_topology);
    if let (Some(block), Some(key)) = (&slinky.block_topology, &scheme.capacity_block_key)
        && let Some(cb) = labels.get(key)
    {
        spec.push_str(&format!(",{block}:{cb}"));
    }
    Some(spec)
}

fn invalid(what: &'static str, value: &str) -> DeriveError {
    let shown: String = value.chars().take(80).collect();
    DeriveError::InvalidValue { what, value: shown }
}

/// Changes to one map (labels or annotations).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MapDiff {
    pub add: BTreeMap<String, String>,
    /// key → (from, to)
    pub change: BTreeMap<String, (String, String)>,
    /// key → value being removed
    pub remove: BTreeMap<String, String>,
}

impl MapDiff {
    pub fn is_empty(&self) -> bool {
        self.add.is_empty() && self.change.is_empty() && self.remove.is_empty()
    }

    /// Each change as a person reads it: `+KEY=VALUE` added, `~KEY=FROM->TO` changed, `-KEY`
    /// removed (in that order, each by key).
    pub fn lines(&self) -> Vec<String> {
        let added = self.add.iter().map(|(k, v)| format!("+{k}={v}"));
        let changed = (self.change.iter()).map(|(k, (from, to))| format!("~{k}={from}->{to}"));
        let removed = self.remove.keys().map(|k| format!("-{k}"));
        added.chain(changed).chain(removed).collect()
    }

    /// `current`: the node's keys of the family (each once), walked twice; nothing is
    /// allocated when nothing differs.
    fn compute<'a>(
        current: impl Iterator<Item = (&'a str, &'a str)> + Clone,
        desired: &BTreeMap<String, String>,
        keep: &BTreeSet<String>,
    ) -> Self {
        let mut diff = MapDiff::default();
        for (k, v) in current.clone() {
            match desired.get(k) {
                Some(want) if want == v => {}
                Some(want) => {
                    diff.change
                        .insert(k.to_owned(), (v.to_owned(), want.clone()));
                }
                None if keep.contains(k) => {}
                None => {
                    diff.remove.insert(k.to_owned(), v.to_owned());
                }
            }
        }
        for (k, v) in desired {
            if !current.clone().any(|(c, _)| c == k) {
                diff.add.insert(k.clone(), v.clone());
            }
        }
        diff
    }
}

/// What must change on a node to match `desired`. Only family keys are ever considered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NodeDiff {
    pub labels: MapDiff,
    pub annotations: MapDiff,
}

impl NodeDiff {
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }

    /// Label keys to remove (stale family keys).
    pub fn stale_label_keys(&self) -> impl Iterator<Item = &String> {
        self.labels.remove.keys()
    }

    /// `k=a→b, k2=+c, k3=-d` for a log line.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        for (k, v) in &self.labels.add {
            parts.push(format!("{k}: +{v}"));
        }
        for (k, (a, b)) in &self.labels.change {
            parts.push(format!("{k}: {a} -> {b}"));
        }
        for (k, v) in &self.labels.remove {
            parts.push(format!("{k}: -{v}"));
        }
        let ann = self.annotations.add.len()
            + self.annotations.change.len()
            + self.annotations.remove.len();
        if ann > 0 {
            parts.push(format!("{ann} annotation change(s)"));
        }
        parts.join(", ")
    }
}

pub fn diff<'a>(
    scheme: &LabelScheme,
    labels: &'a BTreeMap<String, String>,
    annotations: &'a BTreeMap<String, String>,
    desired: &Desired,
) -> NodeDiff {
    let as_str = |(k, v): (&'a String, &'a String)| (k.as_str(), v.as_str());
    diff_pairs(
        scheme,
        labels.iter().map(as_str),
        annotations.iter().map(as_str),
        desired,
    )
}

/// As [`diff`], the node's labels and annotations as (key, value) pairs, each key once (read
/// in place: a reconcile that changes nothing allocates nothing here).
pub fn diff_pairs<'a>(
    scheme: &LabelScheme,
    labels: impl Iterator<Item = (&'a str, &'a str)> + Clone,
    annotations: impl Iterator<Item = (&'a str, &'a str)> + Clone,
    desired: &Desired,
) -> NodeDiff {
    NodeDiff {
        labels: MapDiff::compute(
            labels.filter(|(k, _)| scheme.is_family_label(k)),
            &desired.labels,
            &desired.keep,
        ),
        // The verification record an earlier version kept on the node is no reason to write:
        // it lives in the controller's ledger now, and goes with the next apply that happens
        // anyway (an apply carries only what `desired` holds).
        annotations: MapDiff::compute(
            annotations.filter(|(k, _)| {
                scheme.is_family_annotation(k) && *k != crate::verified::VERIFIED_KEY
            }),
            &desired.annotations,
            &desired.keep,
        ),
    }
}

/// A label value: at most 63 characters, alphanumeric at both ends, `-_.` inside. Empty is valid
/// for Kubernetes but never something we write.
pub fn is_valid_label_value(v: &str) -> bool {
    let b = v.as_bytes();
    b.len() <= 63
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A label key: optional DNS-subdomain prefix (≤ 253) and `/`, then a name that is a valid
/// non-empty label value.
pub fn is_valid_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|part| {
                let b = part.as_bytes();
                let lower_or_digit = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
                b.len() <= 63
                    && b.first().is_some_and(lower_or_digit)
                    && b.last().is_some_and(lower_or_digit)
                    && b.iter()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            })
    });
    prefix_ok && is_valid_label_value(name)
}

/// A valid label value for any string: the string itself when valid, otherwise a readable,
/// sanitised form ending in `-` and 8 hex digits of its SHA-256 (stable, and distinct for names
/// that sanitise alike).
pub fn sanitize_label_value(raw: &str) -> String {
    if is_valid_label_value(raw) {
        return raw.to_string();
    }
    const HASH_LEN: usize = 8;
    let digest = Sha256::digest(raw.as_bytes());
    let hash: String = digest
        .iter()
        .take(HASH_LEN / 2)
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut body = String::with_capacity(raw.len().min(63));
    for c in raw.chars() {
        let ok = c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        let c = if ok { c } else { '-' };
        // One dash for each run of characters we could not keep.
        if !(c == '-' && body.ends_with('-')) {
            body.push(c);
        }
        if body.len() >= 63 {
            break;
        }
    }
    body.truncate(63 - HASH_LEN - 1);
    let body = body.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if body.is_empty() {
        hash
    } else {
        format!("{body}-{hash}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_canonical_layer_numbers_are_layer_keys() {
        let eks = LabelScheme::default();
        let key = |n: &str| format!("{EKS_LAYER_PREFIX}{n}");
        assert_eq!(eks.layer_index(&key("1")), Some(1));
        assert_eq!(eks.layer_index(&key("4")), Some(4));
        assert_eq!(eks.layer_index(&key("16")), Some(MAX_LAYERS));
        for not_ours in [
            "01",
            "+1",
            "-1",
            "",
            "1a",
            " 1",
            "0",
            "17",
            "99999999999999999999999",
        ] {
            assert_eq!(eks.layer_index(&key(not_ours)), None, "{not_ours:?}");
        }
        // Topograph's numbering starts at 0: `tier-0` is its first layer, `tier-00` none.
        let tiers = LabelScheme {
            layer_prefix: "tier-".into(),
            first_layer: 0,
            ..LabelScheme::default()
        };
        assert_eq!(tiers.layer_index("tier-0"), Some(1));
        assert_eq!(tiers.layer_index("tier-3"), Some(4));
        assert_eq!(tiers.layer_index("tier-00"), None);
        assert_eq!(tiers.layer_index("tier-16"), None);
    }

    #[test]
    fn a_diff_reads_as_added_changed_removed() {
        let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let diff = MapDiff {
            add: map(&[("b", "2"), ("a", "1")]),
            change: [("c".to_string(), ("old".to_string(), "new".to_string()))].into(),
            remove: map(&[("d", "4")]),
        };
        assert_eq!(diff.lines(), ["+a=1", "+b=2", "~c=old->new", "-d"]);
        assert!(MapDiff::default().lines().is_empty());
    }

    fn topo(nodes: &[&str]) -> InstanceTopology {
        InstanceTopology {
            instance_id: "i-0123456789abcdef0".into(),
            instance_type: Some("p5.48xlarge".into()),
            availability_zone: Some("us-west-2a".into()),
            zone_id: Some("usw2-az1".into()),
            network_nodes: nodes.iter().map(|s| s.to_string()).collect(),
            group_name: None,
            capacity_block_id: None,
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The fingerprint of what an answer vouches for equals the node's once it carries that
    /// (other labels aside), and differs when any family label differs, is missing or is extra;
    /// a key the answer says nothing about is vouched for by no answer: a node carrying a value
    /// for it (a capacity block written by somebody else) does not match.
    #[test]
    fn fingerprints_tell_family_labels_apart_and_nothing_else() {
        let s = LabelScheme::default();
        let t = topo(&["nn-a", "nn-b", "nn-c"]);
        let d = desired(&s, &t).unwrap();
        assert!(
            d.keep.contains(CAPACITY_BLOCK_KEY),
            "no capacity block in the answer"
        );
        let mut node = d.labels.clone();
        node.insert("kubernetes.io/hostname".into(), "h".into());
        let want = vouched_fingerprint(&s, &d);
        assert_eq!(family_fingerprint(&s, &node), want);
        for change in [
            ("topology.k8s.aws/network-node-layer-3", Some("nn-x")),
            ("topology.k8s.aws/network-node-layer-4", Some("nn-d")),
            ("topology.k8s.aws/network-node-layer-1", None),
            (CAPACITY_BLOCK_KEY, Some("cr-forged")),
        ] {
            let mut other = node.clone();
            match change.1 {
                Some(v) => other.insert(change.0.into(), v.into()),
                None => other.remove(change.0),
            };
            assert_ne!(family_fingerprint(&s, &other), want, "{change:?}");
        }
        node.insert("example.com/other".into(), "x".into());
        assert_eq!(family_fingerprint(&s, &node), want, "not a family label");
    }

    #[test]
    fn three_layers_top_first_match_eks_keys() {
        let d = desired(&LabelScheme::default(), &topo(&["nn-a", "nn-b", "nn-c"])).unwrap();
        assert_eq!(
            d.labels,
            map(&[
                ("topology.k8s.aws/network-node-layer-1", "nn-a"),
                ("topology.k8s.aws/network-node-layer-2", "nn-b"),
                ("topology.k8s.aws/network-node-layer-3", "nn-c"),
                ("topology.k8s.aws/zone-id", "usw2-az1"),
            ])
        );
        assert!(d.annotations.is_empty());
    }

    #[test]
    fn four_layers_and_leaf_first_numbering() {
        let t = topo(&["nn-a", "nn-b", "nn-c", "nn-d"]);
        let d = desired(&LabelScheme::default(), &t).unwrap();
        assert_eq!(d.labels["topology.k8s.aws/network-node-layer-4"], "nn-d");
        let scheme = LabelScheme {
            layer_prefix: "example.com/tier-".into(),
            numbering: LayerNumbering::LeafFirst,
            ..LabelScheme::default()
        };
        let d = desired(&scheme, &t).unwrap();
        assert_eq!(d.labels["example.com/tier-1"], "nn-d", "leaf first");
        assert_eq!(d.labels["example.com/tier-4"], "nn-a");
        assert!(
            !d.labels
                .contains_key("topology.k8s.aws/network-node-layer-1")
        );
    }

    #[test]
    fn capacity_block_and_placement_group_extras() {
        let mut t = topo(&["nn-a", "nn-b", "nn-c"]);
        t.capacity_block_id = Some("cr-0123456789abcdef0".into());
        t.group_name = Some("training-pg".into());
        let d = desired(&LabelScheme::default(), &t).unwrap();
        assert_eq!(d.labels[CAPACITY_BLOCK_KEY], "cr-0123456789abcdef0");
        assert_eq!(d.labels[PLACEMENT_GROUP_KEY], "training-pg");
        assert_eq!(d.annotations[PLACEMENT_GROUP_KEY], "training-pg");
    }

    #[test]
    fn extras_can_be_switched_off() {
        let mut t = topo(&["nn-a", "nn-b", "nn-c"]);
        t.capacity_block_id = Some("cr-1".into());
        t.group_name = Some("pg".into());
        let scheme = LabelScheme {
            zone_id_key: None,
            capacity_block_key: None,
            placement_group_key: None,
            ..LabelScheme::default()
        };
        let d = desired(&scheme, &t).unwrap();
        assert_eq!(d.labels.len(), 3);
        assert!(d.annotations.is_empty());
        // A switched-off key is out of the family: a reconcile does not remove it (retiring the
        // keys we wrote is a start-up step, by managed fields).
        let current = map(&[
            (CAPACITY_BLOCK_KEY, "cr-1"),
            ("topology.k8s.aws/zone-id", "x"),
        ]);
        let diff = diff(&scheme, &current, &BTreeMap::new(), &d);
        assert!(diff.labels.remove.is_empty());
    }

    #[test]
    fn hostile_placement_group_names_become_valid_stable_values() {
        let long = "a".repeat(255);
        let spaces = "my training group (prod)";
        let unicode = "训练-группа-🚀";
        for raw in [
            long.as_str(),
            spaces,
            unicode,
            "-leading",
            "trailing.",
            "",
            "***",
        ] {
            let v = sanitize_label_value(raw);
            assert!(is_valid_label_value(&v), "{raw:?} -> {v:?}");
            assert_eq!(v, sanitize_label_value(raw), "stable");
        }
        assert_eq!(sanitize_label_value("ok-name_1.2"), "ok-name_1.2");
        let s = sanitize_label_value(spaces);
        assert!(s.starts_with("my-training-group-prod-"), "{s}");
        assert_ne!(
            sanitize_label_value("a b"),
            sanitize_label_value("a/b"),
            "names that sanitise alike stay distinct"
        );
        let mut t = topo(&["nn-a"]);
        t.group_name = Some(unicode.into());
        let d = desired(&LabelScheme::default(), &t).unwrap();
        assert_eq!(d.annotations[PLACEMENT_GROUP_KEY], unicode, "raw name kept");
    }

    #[test]
    fn invalid_or_missing_answers_are_refused_not_guessed() {
        let s = LabelScheme::default();
        assert_eq!(desired(&s, &topo(&[])), Err(DeriveError::NoNetworkNodes));
        let deep: Vec<String> = (0..17).map(|i| format!("nn-{i}")).collect();
        let deep: Vec<&str> = deep.iter().map(String::as_str).collect();
        assert_eq!(desired(&s, &topo(&deep)), Err(DeriveError::TooDeep(17)));
        let long = "n".repeat(64);
        assert!(matches!(
            desired(&s, &topo(&["nn-a", &long])),
            Err(DeriveError::InvalidValue { .. })
        ));
        assert!(matches!(
            desired(&s, &topo(&["nn-a", "bad value"])),
            Err(DeriveError::InvalidValue { .. })
        ));
        let five = desired(&s, &topo(&["a", "b", "c", "d", "e"])).unwrap();
        assert_eq!(five.labels["topology.k8s.aws/network-node-layer-5"], "e");
    }

    #[test]
    fn diff_adds_changes_and_removes_only_family_keys() {
        let s = LabelScheme::default();
        let d = desired(&s, &topo(&["nn-a", "nn-b", "nn-x"])).unwrap();
        let current = map(&[
            ("topology.k8s.aws/network-node-layer-1", "nn-a"),
            ("topology.k8s.aws/network-node-layer-3", "nn-c"),
            ("topology.k8s.aws/network-node-layer-4", "nn-d"),
            ("topology.kubernetes.io/zone", "us-west-2a"),
            ("kubernetes.io/hostname", "ip-10-0-0-1"),
            ("topology.k8s.aws/network-node-layer-04", "not ours"),
        ]);
        let diff = diff(&s, &current, &BTreeMap::new(), &d);
        assert_eq!(
            diff.labels.add,
            map(&[
                ("topology.k8s.aws/network-node-layer-2", "nn-b"),
                ("topology.k8s.aws/zone-id", "usw2-az1")
            ])
        );
        assert_eq!(
            diff.labels.change["topology.k8s.aws/network-node-layer-3"],
            ("nn-c".to_string(), "nn-x".to_string())
        );
        assert_eq!(
            diff.labels.remove,
            map(&[("topology.k8s.aws/network-node-layer-4", "nn-d")]),
            "stale 4th layer removed; kubelet's and foreign labels untouched"
        );
    }

    /// EC2 can leave `capacityBlockId` out of an answer right after launch: an answer without
    /// it says nothing about the capacity block, so the label stays (a placement group the
    /// instance left is another matter: its label and annotation go).
    #[test]
    fn a_missing_capacity_block_keeps_the_label_and_a_stale_placement_group_goes() {
        let s = LabelScheme::default();
        let d = desired(&s, &topo(&["nn-a", "nn-b", "nn-c"])).unwrap();
        assert!(d.keep.contains(CAPACITY_BLOCK_KEY));
        let labels = map(&[
            ("topology.k8s.aws/network-node-layer-1", "nn-a"),
            ("topology.k8s.aws/network-node-layer-2", "nn-b"),
            ("topology.k8s.aws/network-node-layer-3", "nn-c"),
            ("topology.k8s.aws/zone-id", "usw2-az1"),
            (CAPACITY_BLOCK_KEY, "cr-1"),
            (PLACEMENT_GROUP_KEY, "pg"),
        ]);
        let annotations = map(&[(PLACEMENT_GROUP_KEY, "pg"), ("other/annotation", "x")]);
        let diff = diff(&s, &labels, &annotations, &d);
        assert_eq!(
            diff.stale_label_keys().cloned().collect::<Vec<_>>(),
            vec![PLACEMENT_GROUP_KEY.to_string()]
        );
        assert_eq!(diff.annotations.remove, map(&[(PLACEMENT_GROUP_KEY, "pg")]));
        assert!(diff.labels.add.is_empty() && diff.labels.change.is_empty());
    }

    #[test]
    fn matching_labels_give_an_empty_diff() {
        let s = LabelScheme::default();
        let d = desired(&s, &topo(&["nn-a", "nn-b", "nn-c"])).unwrap();
        let mut labels = d.labels.clone();
        labels.insert("unrelated".into(), "x".into());
        assert!(diff(&s, &labels, &BTreeMap::new(), &d).is_empty());
    }

    #[test]
    fn missing_zone_id_keeps_the_current_one() {
        let s = LabelScheme::default();
        let mut t = topo(&["nn-a"]);
        t.zone_id = None;
        let d = desired(&s, &t).unwrap();
        let labels = map(&[
            ("topology.k8s.aws/network-node-layer-1", "nn-a"),
            ("topology.k8s.aws/zone-id", "usw2-az1"),
        ]);
        assert!(diff(&s, &labels, &BTreeMap::new(), &d).is_empty());
    }

    #[test]
    fn uniform_depth_repeats_the_deepest_network_node_and_never_cuts() {
        let s = LabelScheme {
            uniform_depth: Some(4),
            ..LabelScheme::default()
        };
        let three = desired(&s, &topo(&["nn-a", "nn-b", "nn-c"])).unwrap();
        assert_eq!(
            three.labels["topology.k8s.aws/network-node-layer-3"],
            "nn-c"
        );
        assert_eq!(
            three.labels["topology.k8s.aws/network-node-layer-4"], "nn-c",
            "layer 4 names the switch right above the node"
        );
        let four = desired(&s, &topo(&["nn-a", "nn-b", "nn-c", "nn-d"])).unwrap();
        assert_eq!(four.labels["topology.k8s.aws/network-node-layer-4"], "nn-d");
        let five = desired(&s, &topo(&["a", "b", "c", "d", "e"])).unwrap();
        assert_eq!(
            five.labels["topology.k8s.aws/network-node-layer-5"], "e",
            "deeper kept"
        );
        // The tree reads the padding back as the node's real path.
        assert_eq!(
            crate::tree::path_of(&s, &three.labels),
            Some(vec!["nn-a".into(), "nn-b".into(), "nn-c".into()])
        );
        // Turned off again, the padded layer is stale and goes.
        let plain = desired(&LabelScheme::default(), &topo(&["nn-a", "nn-b", "nn-c"])).unwrap();
        let d = diff(
            &LabelScheme::default(),
            &three.labels,
            &BTreeMap::new(),
            &plain,
        );
        assert_eq!(
            d.labels.remove,
            map(&[("topology.k8s.aws/network-node-layer-4", "nn-c")])
        );
        assert!(d.labels.add.is_empty() && d.labels.change.is_empty());
    }

    #[test]
    fn uniform_depth_is_refused_with_leaf_first_numbering_or_out_of_range() {
        let leaf_first = LabelScheme {
            uniform_depth: Some(4),
            numbering: LayerNumbering::LeafFirst,
            ..LabelScheme::default()
        };
        assert!(leaf_first.validate().unwrap_err().contains("top-first"));
        for n in [0, 17] {
            let s = LabelScheme {
                uniform_depth: Some(n),
                ..LabelScheme::default()
            };
            assert!(s.validate().is_err(), "{n}");
        }
    }

    fn slinky(block: Option<&str>) -> LabelScheme {
        LabelScheme {
            slinky: Some(SlinkySpec {
                tree_topology: SLURM_TREE_TOPOLOGY.into(),
                block_topology: block.map(String::from),
            }),
            ..LabelScheme::default()
        }
    }

    #[test]
    fn slinky_annotation_names_the_leaf_switch_and_the_capacity_block() {
        let s = slinky(Some("topo-block"));
        let mut t = topo(&["nn-a", "nn-b", "nn-c"]);
        t.capacity_block_id = Some("cr-1".into());
        let mut d = desired(&s, &t).unwrap();
        settle(&s, &BTreeMap::new(), &mut d);
        assert_eq!(
            d.annotations[SLINKY_SPEC_KEY],
            "topo-switch:nn-c,topo-block:cr-1"
        );
        // Without a block topology only the tree is named.
        let s = slinky(None);
        let mut d = desired(&s, &t).unwrap();
        settle(&s, &BTreeMap::new(), &mut d);
        assert_eq!(d.annotations[SLINKY_SPEC_KEY], "topo-switch:nn-c");
        // Off: no annotation, and a stale one is not ours to touch.
        let off = LabelScheme::default();
        let mut d = desired(&off, &t).unwrap();
        settle(&off, &BTreeMap::new(), &mut d);
        assert!(!d.annotations.contains_key(SLINKY_SPEC_KEY));
        assert!(!off.is_family_annotation(SLINKY_SPEC_KEY));
        assert!(slinky(None).is_family_annotation(SLINKY_SPEC_KEY));
    }

    /// An answer without the capacity block keeps the label (EC2 fills it in late), so the
    /// annotation keeps naming the block too, instead of flapping.
    #[test]
    fn slinky_annotation_follows_a_kept_capacity_block_and_the_padded_leaf() {
        let s = LabelScheme {
            uniform_depth: Some(4),
            ..slinky(Some("topo-block"))
        };
        let t = topo(&["nn-a", "nn-b", "nn-c"]);
        let current = map(&[(CAPACITY_BLOCK_KEY, "cr-9")]);
        let mut d = desired(&s, &t).unwrap();
        settle(&s, &current, &mut d);
        assert_eq!(
            d.annotations[SLINKY_SPEC_KEY],
            "topo-switch:nn-c,topo-block:cr-9"
        );
        let mut annotations = BTreeMap::new();
        annotations.insert(
            SLINKY_SPEC_KEY.to_string(),
            "topo-switch:nn-old".to_string(),
        );
        let diff = diff(&s, &current, &annotations, &d);
        assert_eq!(
            diff.annotations.change[SLINKY_SPEC_KEY].1,
            "topo-switch:nn-c,topo-block:cr-9"
        );
    }

    #[test]
    fn slurm_topology_names_that_would_break_the_annotation_are_refused() {
        for bad in ["", "a:b", "a,b", "a b"] {
            let s = LabelScheme {
                slinky: Some(SlinkySpec {
                    tree_topology: bad.into(),
                    block_topology: None,
                }),
                ..LabelScheme::default()
            };
            assert!(s.validate().is_err(), "{bad:?}");
        }
        assert!(slinky(Some("topo-block")).validate().is_ok());
    }

    #[test]
    fn scheme_validation_catches_bad_keys() {
        assert!(LabelScheme::default().validate().is_ok());
        let bad = LabelScheme {
            layer_prefix: "Bad Prefix/layer-".into(),
            ..LabelScheme::default()
        };
        assert!(bad.validate().is_err());
        let dup = LabelScheme {
            capacity_block_key: Some(PLACEMENT_GROUP_KEY.into()),
            ..LabelScheme::default()
        };
        assert!(dup.validate().is_err());
    }

    #[test]
    fn label_value_and_key_rules() {
        assert!(is_valid_label_value("nn-e50490a237cb0f01a"));
        assert!(!is_valid_label_value(&"a".repeat(64)));
        assert!(!is_valid_label_value("-a"));
        assert!(!is_valid_label_value("a b"));
        assert!(is_valid_label_key("topology.k8s.aws/network-node-layer-1"));
        assert!(is_valid_label_key("plain-key"));
        assert!(!is_valid_label_key("UPPER.example/x"));
        assert!(!is_valid_label_key("example.com/"));
    }
}

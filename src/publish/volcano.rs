//! Volcano `HyperNode`s (`topology.volcano.sh/v1alpha1`) kept in step with the labelled nodes.
//!
//! Tiers count from the nodes up: tier 1 is the switch an instance hangs off, selecting its
//! Nodes by label (so nodes coming and going need no HyperNode update); each tier above lists
//! the HyperNodes below by exact name. On 4-layer instance types the top layer is therefore
//! tier 4, on 3-layer types tier 3: `highestTierAllowed: N` always means "within N hops of the
//! nodes". [`desired`] is pure; [`HyperNodeSync`] applies the difference.
//!
//! Owns: HyperNodes ours by label, name prefix and owner annotation. Never touches any other, not
//! even one of our label and prefix without the annotation (the chart's admission policy refuses
//! our ServiceAccount any change to a HyperNode not annotated as this installation's).

use std::{
    collections::{BTreeMap, BTreeSet},
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
};

use kube::{
    Api, Client, ResourceExt,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    },
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::{
    FIELD_MANAGER,
    labels::{LabelScheme, LayerNumbering, MAX_LAYERS},
    metrics::Metrics,
    tree::{Conflict, NodeView, path_of},
};

use super::owner::{Claim, MANAGED_BY, OWNER, claim};

/// A HyperNode this installation would publish that another installation holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub name: String,
    /// The other installation's Lease; `None`: our label and prefix, but no owner annotation.
    pub owner: Option<String>,
}

/// Why a sync wrote nothing, or stopped.
#[derive(Debug)]
pub enum SyncError {
    Api(kube::Error),
    /// HyperNodes we would publish are another installation's (both use one name prefix):
    /// nothing is written, since a part of the tree would be wrong for Volcano.
    Taken(Vec<Taken>),
}

impl From<kube::Error> for SyncError {
    fn from(e: kube::Error) -> Self {
        SyncError::Api(e)
    }
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncError::Api(e) => e.fmt(f),
            SyncError::Taken(t) => {
                let owners: BTreeSet<&str> = t.iter().filter_map(|t| t.owner.as_deref()).collect();
                let unclaimed: Vec<&str> = t
                    .iter()
                    .filter(|t| t.owner.is_none())
                    .map(|t| t.name.as_str())
                    .collect();
                let mut said = false;
                if let Some(first) = t.iter().find(|t| t.owner.is_some()) {
                    write!(
                        f,
                        "{} HyperNodes this installation would publish (such as {}) belong to another installation ({}) using the same name prefix; give each installation its own --volcano-hypernode-prefix",
                        t.len() - unclaimed.len(),
                        first.name,
                        owners.into_iter().collect::<Vec<_>>().join(", ")
                    )?;
                    said = true;
                }
                if let Some(first) = unclaimed.first() {
                    write!(
                        f,
                        "{}{} HyperNodes this installation would publish (such as {first}) exist with our label but without the annotation {OWNER}: not ours to change; annotate them with this installation's Lease to make them ours, or delete them",
                        if said { "; " } else { "" },
                        unclaimed.len(),
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// One HyperNode to publish.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HyperNode {
    pub name: String,
    pub tier: usize,
    pub tier_name: String,
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
    pub fn to_object(&self, owner: &str) -> Value {
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
pub fn hypernode_name(prefix: &str, tier: usize, id: &str) -> String {
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

/// The HyperNodes for these nodes, or the conflicts that forbid publishing any (a HyperNode
/// with two parents would break Volcano's tree).
pub fn desired(
    scheme: &LabelScheme,
    nodes: &[NodeView],
    prefix: &str,
) -> Result<Vec<HyperNode>, Vec<Conflict>> {
    // (tier, id) → (layer key, parents, children)
    #[derive(Default)]
    struct Entry {
        key: String,
        parents: BTreeSet<Option<(usize, String)>>,
        children: BTreeSet<(usize, String)>,
        leaf_selector: Option<(String, Option<String>)>,
    }
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
    let mut out: Vec<HyperNode> = entries
        .iter()
        .map(|((tier, id), e)| {
            let mut members: Vec<Member> = e
                .children
                .iter()
                .map(|(t, c)| Member::HyperNode(hypernode_name(prefix, *t, c)))
                .collect();
            if let Some((key, absent)) = &e.leaf_selector {
                members.push(Member::Nodes {
                    labels: BTreeMap::from([(key.clone(), id.clone())]),
                    absent: absent.iter().cloned().collect(),
                });
            }
            HyperNode {
                name: hypernode_name(prefix, *tier, id),
                tier: *tier,
                tier_name: e.key.clone(),
                members,
            }
        })
        .collect();
    out.sort_by(|a, b| (a.tier, &a.name).cmp(&(b.tier, &b.name)));
    Ok(out)
}

/// What one sync did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncStats {
    pub applied: usize,
    pub deleted: usize,
    pub unchanged: usize,
}

/// Whether HyperNode `name` is one this installation made: our `managed-by` label alone is not
/// enough (two installations in one cluster carry the same one), so the name must also be
/// `<prefix>-t<tier>-…`, as [`hypernode_name`] makes them.
pub fn owned_by(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix("-t"))
        .and_then(|rest| rest.split_once('-'))
        .is_some_and(|(tier, _)| !tier.is_empty() && tier.bytes().all(|b| b.is_ascii_digit()))
}

/// Applies the difference between the desired HyperNodes and those we own.
pub struct HyperNodeSync {
    api: Api<DynamicObject>,
    prefix: String,
    owner: String,
    leader: crate::leader::Leadership,
    /// What the last successful sync applied, and when it listed.
    last: Option<(u64, tokio::time::Instant)>,
    /// A tree that stays the same is listed again this often (a HyperNode deleted by hand, or
    /// taken by another installation, is seen then).
    recheck: std::time::Duration,
}

pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("topology.volcano.sh", "v1alpha1", "HyperNode"),
        "hypernodes",
    )
}

impl HyperNodeSync {
    /// `prefix`: this installation's HyperNode name prefix; `owner`: its Lease
    /// (`<namespace>/<name>`, see [`OWNER`]); `recheck`: how often an unchanged tree is compared
    /// with the cluster again; `leader`: checked again right before every write and delete.
    pub fn new(
        client: Client,
        prefix: &str,
        owner: &str,
        recheck: std::time::Duration,
        leader: crate::leader::Leadership,
    ) -> Self {
        Self {
            api: Api::all_with(client, &api_resource()),
            prefix: prefix.to_string(),
            owner: owner.to_string(),
            leader,
            last: None,
            recheck,
        }
    }

    /// Bring the cluster's HyperNodes to `desired`. Nothing is sent when `desired` is what the
    /// last successful sync applied, less than `recheck` ago. Another installation's HyperNodes are never written or
    /// deleted; when one of them has a name we would publish, nothing is written.
    pub async fn sync(&mut self, desired: &[HyperNode]) -> Result<SyncStats, SyncError> {
        let mut h = DefaultHasher::new();
        desired.hash(&mut h);
        let hash = h.finish();
        if self
            .last
            .is_some_and(|(h, at)| h == hash && at.elapsed() < self.recheck)
        {
            return Ok(SyncStats::default());
        }
        let listed = tokio::time::Instant::now();
        let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
        let mut existing: BTreeMap<String, DynamicObject> = BTreeMap::new();
        let mut others: BTreeMap<String, Option<String>> = BTreeMap::new();
        for o in self
            .api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
        {
            let name = o.name_any();
            if !owned_by(&self.prefix, &name) {
                continue;
            }
            match claim(&o, &self.owner) {
                Claim::Other(owner) => {
                    others.insert(name, Some(owner));
                }
                Claim::Unclaimed => {
                    others.insert(name, None);
                }
                Claim::Ours => {
                    existing.insert(name, o);
                }
            }
        }
        let taken: Vec<Taken> = desired
            .iter()
            .filter_map(|h| {
                others.get(&h.name).map(|owner| Taken {
                    name: h.name.clone(),
                    owner: owner.clone(),
                })
            })
            .collect();
        if !taken.is_empty() {
            return Err(SyncError::Taken(taken));
        }
        let mut stats = SyncStats::default();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for hn in desired {
            let object = hn.to_object(&self.owner);
            let same = existing
                .get(&hn.name)
                .is_some_and(|live| live.data.get("spec") == object.get("spec"));
            if same {
                stats.unchanged += 1;
                continue;
            }
            if !self.leader.is_leader() {
                return Ok(stats);
            }
            self.api
                .patch(&hn.name, &params, &Patch::Apply(object))
                .await?;
            stats.applied += 1;
        }
        let wanted: BTreeSet<&str> = desired.iter().map(|h| h.name.as_str()).collect();
        for name in existing.keys().filter(|n| !wanted.contains(n.as_str())) {
            // The list may be seconds old under load; a replica that lost the lease meanwhile
            // must not delete what the new leader just made.
            if !self.leader.is_leader() {
                return Ok(stats);
            }
            match self.api.delete(name, &DeleteParams::default()).await {
                Ok(_) => stats.deleted += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
        if stats.applied + stats.deleted > 0 {
            info!(
                applied = stats.applied,
                deleted = stats.deleted,
                total = desired.len(),
                "HyperNodes updated"
            );
        }
        self.last = Some((hash, listed));
        Ok(stats)
    }

    /// Whether the last successful sync listed less than `recheck` ago (the same tree would
    /// send nothing).
    pub fn fresh(&self) -> bool {
        self.last.is_some_and(|(_, at)| at.elapsed() < self.recheck)
    }

    /// Forget what was applied (after losing leadership, or an error): the next sync compares
    /// against the cluster again.
    pub fn reset(&mut self) {
        self.last = None;
    }
}

/// Log conflicts once per distinct set.
pub fn report_conflicts(conflicts: &[Conflict]) {
    for c in conflicts.iter().take(10) {
        warn!(
            network_node = %c.network_node,
            tier = c.layer,
            parents = ?c.parents,
            "not publishing HyperNodes: a network node would have two parents (inconsistent labels)"
        );
    }
}

/// Keeps the HyperNode tree in step with the labelled nodes; publishes nothing while the labels
/// put a network node under two parents (reported once per distinct set).
pub struct VolcanoPublisher {
    sync: HyperNodeSync,
    prefix: String,
    scheme: LabelScheme,
    metrics: Arc<Metrics>,
    events: crate::events::Events,
    last_conflicts: Vec<Conflict>,
    /// The last error logged (each distinct one is logged once).
    last_error: Option<String>,
}

impl VolcanoPublisher {
    /// `owner`: this installation's Lease, `<namespace>/<name>` (see [`OWNER`]); `recheck`: how
    /// often an unchanged tree is compared with the cluster again.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        prefix: &str,
        owner: &str,
        recheck: std::time::Duration,
        scheme: LabelScheme,
        metrics: Arc<Metrics>,
        events: crate::events::Events,
        leader: crate::leader::Leadership,
    ) -> Self {
        Self {
            sync: HyperNodeSync::new(client, prefix, owner, recheck, leader),
            prefix: prefix.to_string(),
            scheme,
            metrics,
            events,
            last_conflicts: Vec::new(),
            last_error: None,
        }
    }

    async fn publish_views(&mut self, views: &[NodeView]) {
        match desired(&self.scheme, views, &self.prefix) {
            Ok(desired) => {
                self.last_conflicts.clear();
                self.metrics.hypernode_conflicts(0);
                match self.sync.sync(&desired).await {
                    Ok(stats) => {
                        self.metrics
                            .hypernodes(desired.len(), stats.applied, stats.deleted);
                        self.last_error = None;
                    }
                    Err(e) => {
                        self.sync.reset();
                        self.metrics.publish_failed("volcano");
                        // Once per distinct error, not once per interval.
                        let text = e.to_string();
                        if self.last_error.replace(text.clone()) != Some(text) {
                            warn!(error = %e, "cannot sync Volcano HyperNodes; trying again every interval");
                            if let SyncError::Taken(taken) = &e {
                                self.report_taken(taken);
                            }
                        }
                    }
                }
            }
            Err(conflicts) => {
                self.metrics.hypernode_conflicts(conflicts.len());
                if conflicts != self.last_conflicts {
                    report_conflicts(&conflicts);
                    self.last_conflicts = conflicts;
                }
            }
        }
    }
}

impl VolcanoPublisher {
    /// A Warning Event on each of the first HyperNodes another installation holds.
    fn report_taken(&self, taken: &[Taken]) {
        for t in taken.iter().take(10) {
            self.events.publish(
                crate::events::Reason::HyperNodeOwnedByAnother,
                "PublishHyperNodes",
                &match &t.owner {
                    None => format!(
                        "this HyperNode has our label and name prefix but no annotation {OWNER}: not ours to change, so the installation using this prefix publishes no HyperNode; annotate it with that installation's Lease (<namespace>/<name>) to make it theirs, or delete it"
                    ),
                    Some(owner) => format!(
                        "this HyperNode belongs to the installation with Lease {owner} (annotation {OWNER}); the installation using the same prefix publishes no HyperNode until each has its own --volcano-hypernode-prefix (if that Lease was this installation's own before a rename, annotate it with the new Lease)"
                    ),
                },
                k8s_openapi::api::core::v1::ObjectReference {
                    api_version: Some("topology.volcano.sh/v1alpha1".into()),
                    kind: Some("HyperNode".into()),
                    name: Some(t.name.clone()),
                    ..Default::default()
                },
            );
        }
    }
}

impl super::Publisher for VolcanoPublisher {
    fn name(&self) -> &'static str {
        "volcano"
    }

    fn needs_nodes(&self) -> bool {
        true
    }

    fn publish<'a>(&'a mut self, nodes: &'a [NodeView]) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(self.publish_views(nodes))
    }

    fn fresh(&self) -> bool {
        self.sync.fresh()
    }

    fn reset(&mut self) {
        self.sync.reset();
    }
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

    #[test]
    fn tiers_count_from_the_nodes_up_with_label_selected_leaves() {
        let nodes = vec![
            view("n1", &["nn-s1", "nn-a1", "nn-l1"]),
            view("n2", &["nn-s1", "nn-a1", "nn-l2"]),
            view("n3", &["nn-s1", "nn-a1", "nn-l2"]),
        ];
        let hns = desired(&LabelScheme::default(), &nodes, "ec2tl").unwrap();
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
        let hns = desired(&s, &nodes, "ec2tl").unwrap();
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
        let hns = desired(&LabelScheme::default(), &nodes, "ec2tl").unwrap();
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
        let err = desired(&LabelScheme::default(), &nodes, "ec2tl").unwrap_err();
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
        assert_eq!(desired(&LabelScheme::default(), &[v], "ec2tl"), Ok(vec![]));
    }
}

/// The sync against a fake API server: what it sends when HyperNodes of our label and prefix
/// already exist, some written by another installation with the same prefix.
#[cfg(test)]
mod sync_tests {
    use std::time::Duration;

    use http::{Method, Request, Response};
    use kube::client::Body;
    use serde_json::{Value, json};

    use super::*;

    const ME: &str = "ec2tl-a/ec2-topology-labeler";
    const OTHER: &str = "ec2tl-b/ec2-topology-labeler";

    /// A HyperNode as the API server lists it: our label, and `owner` in the annotation.
    fn live(name: &str, owner: Option<&str>, spec: Value) -> Value {
        let mut meta = json!({ "name": name, "labels": { MANAGED_BY.0: MANAGED_BY.1 } });
        if let Some(o) = owner {
            meta["annotations"] = json!({ OWNER: o });
        }
        json!({ "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
            "metadata": meta, "spec": spec })
    }

    fn ok(body: &Value) -> Response<Body> {
        Response::builder()
            .status(200)
            .body(Body::from(serde_json::to_vec(body).expect("json")))
            .expect("response")
    }

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    /// This installation's sync (prefix `ec2tl`, owner [`ME`], recheck 60 s, leading) against a
    /// fake API server.
    fn mock_sync() -> (HyperNodeSync, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let sync = HyperNodeSync::new(
            Client::new(service, "default"),
            "ec2tl",
            ME,
            Duration::from_secs(60),
            crate::leader::Leadership::leading_until_stepped_down(),
        );
        (sync, handle)
    }

    /// Run one sync of `desired` against a server listing `existing`; every request after the
    /// list is answered 200. Returns the sync's result and the (method, name, body) of each
    /// write and delete.
    async fn sync_against(
        desired: &[HyperNode],
        existing: Vec<Value>,
    ) -> (Result<SyncStats, SyncError>, Vec<(Method, String, Value)>) {
        let (mut sync, mut handle) = mock_sync();
        let api = async move {
            let mut seen = Vec::new();
            let (list, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
                .await
                .expect("the list within 5 s")
                .expect("the list");
            assert_eq!(list.method(), Method::GET);
            send.send_response(ok(&json!({
                "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNodeList",
                "metadata": {}, "items": existing })));
            // Bounded: the sync is done when no request comes for a second.
            while let Ok(Some((req, send))) =
                tokio::time::timeout(Duration::from_secs(1), handle.next_request()).await
            {
                let method = req.method().clone();
                let name = req
                    .uri()
                    .path()
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let bytes = req
                    .into_body()
                    .collect_bytes()
                    .await
                    .expect("the request body");
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let answer = if method == Method::DELETE {
                    json!({"apiVersion": "v1", "kind": "Status", "status": "Success"})
                } else {
                    body.clone()
                };
                send.send_response(ok(&answer));
                seen.push((method, name, body));
            }
            seen
        };
        let (result, seen) = tokio::join!(sync.sync(desired), api);
        (result, seen)
    }

    fn tree() -> Vec<HyperNode> {
        let s = LabelScheme::default();
        desired(
            &s,
            &[NodeView::labelled("n1", &s, &["s", "a", "m"])],
            "ec2tl",
        )
        .expect("a tree")
    }

    /// Two installations with the default prefix: ours deletes none of the other's HyperNodes
    /// (not even those it would not publish), and marks its own as its.
    #[tokio::test]
    async fn another_installations_hypernodes_are_never_deleted() {
        let (result, seen) = sync_against(
            &tree(),
            vec![live("ec2tl-t1-theirs", Some(OTHER), json!({"tier": 1}))],
        )
        .await;
        assert!(result.is_ok(), "{:?}", result.err().map(|e| e.to_string()));
        assert!(
            seen.iter().all(|(m, _, _)| m == Method::PATCH),
            "only our three applies, no delete: {seen:?}"
        );
        assert_eq!(seen.len(), 3, "{seen:?}");
        for (_, name, body) in &seen {
            assert_eq!(body["metadata"]["annotations"][OWNER], ME, "{name}");
        }
    }

    /// A HyperNode we would publish is the other installation's: we write nothing (neither it,
    /// nor the rest of a tree it belongs to), and say whose it is.
    #[tokio::test]
    async fn a_name_another_installation_holds_stops_our_writes() {
        let (result, seen) = sync_against(
            &tree(),
            vec![live("ec2tl-t1-m", Some(OTHER), json!({"tier": 1}))],
        )
        .await;
        assert!(seen.is_empty(), "no write: {seen:?}");
        let (taken, text) = taken(result);
        assert_eq!(
            taken,
            vec![Taken {
                name: "ec2tl-t1-m".into(),
                owner: Some(OTHER.into())
            }]
        );
        assert!(text.contains(OTHER), "{text}");
    }

    /// The HyperNodes a sync found taken, and its error's text; panics on any other outcome.
    fn taken(result: Result<SyncStats, SyncError>) -> (Vec<Taken>, String) {
        match result {
            Err(e @ SyncError::Taken(_)) => {
                let text = e.to_string();
                let SyncError::Taken(taken) = e else {
                    unreachable!()
                };
                (taken, text)
            }
            other => panic!("expected Taken, got {:?}", other.map_err(|e| e.to_string())),
        }
    }

    /// A HyperNode of our label and prefix without the owner annotation is not ours (the
    /// admission policy would refuse the write anyway): one we would publish stops the sync with
    /// what to do, one we would not is left alone, and nothing is written.
    #[tokio::test]
    async fn unannotated_hypernodes_of_our_prefix_are_left_alone() {
        let want = tree();
        let top = want
            .iter()
            .find(|h| h.name == "ec2tl-t3-s")
            .expect("the top")
            .to_object(ME);
        let (result, seen) = sync_against(
            &want,
            vec![
                live("ec2tl-t3-s", None, top["spec"].clone()),
                live("ec2tl-t1-gone", None, json!({"tier": 1})),
            ],
        )
        .await;
        assert!(seen.is_empty(), "no write: {seen:?}");
        let (taken, text) = taken(result);
        assert_eq!(
            taken,
            vec![Taken {
                name: "ec2tl-t3-s".into(),
                owner: None
            }]
        );
        assert!(
            text.contains("without the annotation ec2-topology-labeler.io/owner")
                && text.contains("ec2tl-t3-s")
                && !text.contains("another installation"),
            "{text}"
        );
    }

    /// An unchanged tree sends nothing at the next interval, but is listed again at the recheck:
    /// a HyperNode deleted by hand meanwhile is put back.
    #[tokio::test(start_paused = true)]
    async fn an_unchanged_tree_is_compared_again_at_the_recheck() {
        let (mut sync, mut handle) = mock_sync();
        let want = tree();
        let empty = json!({ "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNodeList",
            "metadata": {}, "items": [] });
        // Answer every request: the list empty, each apply with its body. Returns the methods.
        async fn serve(
            handle: &mut tower_test::mock::Handle<Request<Body>, Response<Body>>,
            list: &Value,
        ) -> Vec<Method> {
            let mut seen = Vec::new();
            while let Ok(Some((req, send))) =
                tokio::time::timeout(Duration::from_millis(100), handle.next_request()).await
            {
                seen.push(req.method().clone());
                let body = if req.method() == Method::GET {
                    list.clone()
                } else {
                    let bytes = req.into_body().collect_bytes().await.expect("the body");
                    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
                };
                send.send_response(ok(&body));
            }
            seen
        }
        let (first, seen) = tokio::join!(sync.sync(&want), serve(&mut handle, &empty));
        assert!(first.is_ok());
        assert_eq!(seen.len(), 4, "a list and three applies: {seen:?}");
        let (second, seen) = tokio::join!(sync.sync(&want), serve(&mut handle, &empty));
        assert!(second.is_ok());
        assert!(seen.is_empty(), "nothing sent within the recheck: {seen:?}");
        tokio::time::advance(Duration::from_secs(61)).await;
        let (third, seen) = tokio::join!(sync.sync(&want), serve(&mut handle, &empty));
        assert!(third.is_ok());
        assert_eq!(
            seen,
            vec![Method::GET, Method::PATCH, Method::PATCH, Method::PATCH],
            "listed again, and the missing HyperNodes applied"
        );
    }
}

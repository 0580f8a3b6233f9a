//! A clean way out: what we wrote, found and removed — when a feature is turned off (what it
//! left on Nodes by the leader at start-up; what it published by `retire`, the chart's
//! post-upgrade hook, only what cannot hurt a running workload) and by `uninstall` (everything
//! we own, labels only when asked).
//!
//! What is ours: our `TopologyLabeled` and `UltraServerInterconnectImpaired` conditions, our
//! interconnect taint and the UltraServer shape keys on Nodes; objects carrying our
//! `app.kubernetes.io/managed-by` label (HyperNodes also under this installation's name prefix);
//! the Lease; the label and annotation keys our field manager owns on Nodes.
//!
//! "Cannot hurt" decides what turning a feature off removes: on Nodes at start-up, a condition
//! nothing else should gate on any more, the interconnect taint (nothing would ever take it off
//! again) and the shape keys (nothing would keep them true); by `retire`, HyperNodes (Volcano
//! re-plans from what exists) and the Kueue Topologies no ResourceFlavor names. KAI Topologies
//! (a workload's annotation may name them), a Kueue Topology a ResourceFlavor names and the
//! Slurm ConfigMap (a slurmctld may mount it) are kept then; `uninstall` removes them, except a
//! Kueue Topology a ResourceFlavor still names (reported, kept unless `--force`).
//!
//! Each publisher finds and removes its own objects ([`crate::publish::plugin::Plugin`]); this
//! module asks every one, and removes the rest (the condition, the Lease, our keys on Nodes).
//!
//! Owns: removals. Each is a read and a write at most (retried on a conflict), made only while
//! this replica leads (start-up) or by the operator's own command.

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::json;
use std::{
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};
use tracing::{info, warn};

use crate::{
    FIELD_MANAGER,
    node::{CONDITION_TYPE, INTERCONNECT_CONDITION_TYPE},
    publish::{PLUGINS, plugin::Purpose},
    reconcile::Context,
};

pub(crate) use crate::publish::plugin::{Item, Removed, Scope};

/// What of ours a Node carries besides labels and annotations, by the kind an [`Item`] names
/// it with (its name is the node's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnNode {
    /// The `TopologyLabeled` condition (`--node-condition`).
    Condition,
    /// The `UltraServerInterconnectImpaired` condition (`--ultraserver-health`).
    Interconnect,
    /// The interconnect taint (`--ultraserver-health-taint`).
    InterconnectTaint,
    /// The UltraServer shape labels and annotation (`--ultraserver-shape`).
    Shape,
}

impl OnNode {
    pub(crate) const ALL: [OnNode; 4] = [
        OnNode::Condition,
        OnNode::Interconnect,
        OnNode::InterconnectTaint,
        OnNode::Shape,
    ];

    /// The kind of its [`Item`]s.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            OnNode::Condition => "condition",
            OnNode::Interconnect => "interconnect",
            OnNode::InterconnectTaint => "impaired-taint",
            OnNode::Shape => "shape",
        }
    }

    fn of(kind: &str) -> Option<OnNode> {
        OnNode::ALL.into_iter().find(|o| o.kind() == kind)
    }

    /// Whether `node` carries it.
    pub(crate) fn on(self, node: &crate::node::LiteNode) -> bool {
        match self {
            OnNode::Condition => node.topology_condition().is_some(),
            OnNode::Interconnect => node.interconnect_condition().is_some(),
            OnNode::InterconnectTaint => crate::publish::interconnect::taint().on(node),
            OnNode::Shape => {
                use crate::publish::shape::{END_KEY, SIZE_KEY, TYPE_KEY};
                node.label(TYPE_KEY).is_some()
                    || node.label(SIZE_KEY).is_some()
                    || node.annotation(END_KEY).is_some()
            }
        }
    }

    /// The flag that writes it (off: it is removed at start-up).
    pub(crate) fn flag(self) -> &'static str {
        match self {
            OnNode::Condition => "--node-condition",
            OnNode::Interconnect => "--ultraserver-health",
            OnNode::InterconnectTaint => "--ultraserver-health-taint",
            OnNode::Shape => "--ultraserver-shape",
        }
    }

    /// What it is, for a person.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            OnNode::Condition => "our TopologyLabeled condition",
            OnNode::Interconnect => "our UltraServerInterconnectImpaired condition",
            OnNode::InterconnectTaint => {
                "our interconnect taint (ec2-topology-labeler.io/interconnect-impaired:NoSchedule)"
            }
            OnNode::Shape => "our UltraServer shape labels and annotation",
        }
    }
}

/// One item per node of `nodes` (the node cache, or a fresh list) and per thing of `what` it
/// carries.
pub(crate) fn on_nodes<N: std::borrow::Borrow<crate::node::LiteNode>>(
    nodes: impl IntoIterator<Item = N>,
    what: &[OnNode],
) -> Vec<Item> {
    let mut items = Vec::new();
    for n in nodes {
        let n = n.borrow();
        for w in what.iter().filter(|w| w.on(n)) {
            items.push(Item {
                kind: w.kind(),
                name: n.name_any(),
                kept: None,
            });
        }
    }
    items
}

/// Remove the condition of type `type_` from node `name` (a strategic merge patch of its status
/// deleting the entry of that type: other conditions are untouched).
pub(crate) async fn remove_condition(
    client: &Client,
    name: &str,
    type_: &str,
) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let patch = json!({ "status": { "conditions": [ { "type": type_, "$patch": "delete" } ] } });
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// What every plug-in left in the cluster, for `purpose`, as `scope` takes it.
pub(crate) async fn leftovers(
    client: &Client,
    scope: Scope<'_>,
    purpose: Purpose<'_>,
) -> Result<Vec<Item>, kube::Error> {
    let mut items = Vec::new();
    for p in PLUGINS {
        items.extend(p.leftovers(client, scope, purpose).await?);
    }
    Ok(items)
}

/// A removal command's end: an error when `failed` removals failed (the report said which).
pub(crate) fn outcome(failed: usize) -> crate::Result<()> {
    if failed == 0 {
        Ok(())
    } else {
        Err(crate::Error::Config(format!(
            "{failed} removal(s) failed (see above)"
        )))
    }
}

/// `items` and what became of them, for a person (one line each; `empty` when there are none)
/// or as JSON (`dryRun`, `items`, `failed`, and the fields of `extra`).
pub(crate) fn report(
    items: &[Item],
    applied: &Applied,
    dry_run: bool,
    output: crate::flags::OutputFormat,
    empty: &str,
    extra: serde_json::Value,
) -> crate::Result<String> {
    let mut out = String::new();
    let Applied { failed, held } = applied;
    match output {
        crate::flags::OutputFormat::Json => {
            let failed: Vec<_> = failed
                .iter()
                .map(|(i, e)| serde_json::json!({ "kind": i.kind, "name": i.name, "error": e.to_string() }))
                .collect();
            let held: Vec<_> = held
                .iter()
                .map(
                    |(i, f)| serde_json::json!({ "kind": i.kind, "name": i.name, "finalizers": f }),
                )
                .collect();
            let mut doc = serde_json::json!({
                "dryRun": dry_run,
                "items": items,
                "failed": failed,
                "heldByFinalizers": held,
            });
            if let (Some(doc), serde_json::Value::Object(extra)) = (doc.as_object_mut(), extra) {
                doc.extend(extra);
            }
            out = serde_json::to_string_pretty(&doc)
                .map_err(|e| crate::Error::Config(format!("cannot render JSON: {e}")))?;
            out.push('\n');
        }
        crate::flags::OutputFormat::Table => {
            let verb = if dry_run { "would remove" } else { "removed" };
            for i in items {
                let failure = failed.iter().find(|(f, _)| f == i).map(|(_, e)| e);
                let finalizers = held.iter().find(|(h, _)| h == i).map(|(_, f)| f);
                let what = match (&i.kept, failure, finalizers) {
                    (Some(why), _, _) => format!("kept: {why}"),
                    (None, Some(e), _) => format!("FAILED: {e}"),
                    (None, None, Some(f)) => format!(
                        "deleted, held by finalizer(s) {}: the controller that put them there removes them when it runs",
                        f.join(", ")
                    ),
                    (None, None, None) => verb.to_string(),
                };
                out.push_str(&format!("{:<16}{:<48}{what}\n", i.kind, i.name));
            }
            if items.is_empty() {
                out.push_str(empty);
            }
        }
    }
    Ok(out)
}

/// What [`apply`] came to, beyond the removals that went through.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    /// Removals the API server refused or that failed.
    pub failed: Vec<(Item, kube::Error)>,
    /// Deleted, but kept by the API server until these finalizers are taken off (Kueue's on a
    /// Topology, while Kueue is stopped or a ResourceFlavor still names it).
    pub held: Vec<(Item, Vec<String>)>,
}

/// Carry out the removals in `items` (kept ones are skipped).
pub(crate) async fn apply(
    client: &Client,
    items: &[Item],
    leader: &crate::leader::Leadership,
) -> Applied {
    let mut applied = Applied::default();
    for item in items.iter().filter(|i| i.kept.is_none()) {
        if !leader.is_leader() {
            break;
        }
        match remove(client, item, leader).await {
            Ok(Removed::Gone) => {}
            Ok(Removed::Held(finalizers)) => applied.held.push((item.clone(), finalizers)),
            Err(e) => applied.failed.push((item.clone(), e)),
        }
    }
    applied
}

async fn remove(
    client: &Client,
    item: &Item,
    leader: &crate::leader::Leadership,
) -> Result<Removed, kube::Error> {
    if let Some(p) = PLUGINS.iter().find(|p| p.kind() == item.kind) {
        return p.remove(client, &item.name).await;
    }
    match OnNode::of(item.kind) {
        Some(OnNode::Condition) => {
            return remove_condition(client, &item.name, CONDITION_TYPE)
                .await
                .map(|()| Removed::Gone);
        }
        Some(OnNode::Interconnect) => {
            return remove_condition(client, &item.name, INTERCONNECT_CONDITION_TYPE)
                .await
                .map(|()| Removed::Gone);
        }
        Some(OnNode::InterconnectTaint) => {
            let api = Api::all(client.clone());
            let taint = crate::publish::interconnect::taint();
            return crate::reconcile::write::set_taint(&api, &item.name, &taint, false, leader)
                .await
                .map(|_| Removed::Gone);
        }
        Some(OnNode::Shape) => {
            return give_up_keys(client, &item.name, crate::publish::shape::MANAGER)
                .await
                .map(|()| Removed::Gone);
        }
        None => {}
    }
    match item.kind {
        "lease" => {
            let (ns, name) = item.name.split_once('/').unwrap_or(("default", &item.name));
            Removed::of(
                Api::<Lease>::namespaced(client.clone(), ns)
                    .delete(name, &DeleteParams::default())
                    .await,
            )
        }
        "ledger" => {
            let (ns, name) = item.name.split_once('/').unwrap_or(("default", &item.name));
            Removed::of(
                Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns)
                    .delete(name, &DeleteParams::default())
                    .await,
            )
        }
        "labels" => give_up_keys(client, &item.name, FIELD_MANAGER)
            .await
            .map(|()| Removed::Gone),
        _ => Ok(Removed::Gone),
    }
}

/// Give up every label and annotation key field manager `manager` owns on node `name`: one
/// server-side apply of an empty set. Keys only we own go; keys another manager co-owns (EKS's
/// cloud controller writes the same layer keys) stay, theirs. The apply names the node's UID: a
/// node deleted meanwhile (a scale-down) is not created again as an empty Node of that name (the
/// API server refuses a UID it does not have), and one deleted and recreated is not touched.
async fn give_up_keys(client: &Client, name: &str, manager: &str) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let Some(meta) = api.get_metadata_opt(name).await? else {
        return Ok(());
    };
    let body = json!({ "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name, "uid": meta.metadata.uid } });
    match api
        .patch(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(body),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Gone, or gone and recreated (the UID no longer matches): nothing of ours to give up.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Nodes on which our field manager owns label or annotation keys.
pub(crate) async fn nodes_with_our_keys(client: &Client) -> Result<Vec<Item>, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let mut out = Vec::new();
    let api = &api;
    crate::client::pages::each_page(
        ListParams::default(),
        crate::client::pages::PAGE,
        |p| async move { api.list_metadata(&p).await },
        |items| {
            for meta in &items {
                let (labels, annotations) = crate::reconcile::retire::owned_keys(
                    meta.metadata.managed_fields.as_deref().unwrap_or_default(),
                    FIELD_MANAGER,
                );
                if !labels.is_empty() || !annotations.is_empty() {
                    out.push(Item::remove("labels", meta.name_any()));
                }
            }
        },
    )
    .await?;
    Ok(out)
}

/// Once leading with a synced cache: remove what the features turned off left on Nodes
/// (`what`): our `TopologyLabeled` condition with `--node-condition` off (a stale `False` would
/// hold back whatever gates on it), our `UltraServerInterconnectImpaired` condition with
/// `--ultraserver-health` off (nothing would keep it true any more), our interconnect taint with
/// `--ultraserver-health-taint` off (nothing would ever take it off), the UltraServer shape
/// labels and annotation with `--ultraserver-shape` off (nothing would keep them true). One pass; a failure is
/// logged with what to do.
///
/// What a scheduler feature now turned off published is not the controller's to remove: its
/// ClusterRole holds no rights on the kinds of features turned off. `ec2-topology-labeler
/// retire` does that (the chart's post-upgrade hook runs it; see [`crate::cmd::retire`]).
pub(crate) async fn retire_from_nodes_at_start(
    client: Client,
    reader: crate::node::store::NodeCache,
    ctx: Arc<Context>,
    synced: Arc<AtomicBool>,
    what: Vec<OnNode>,
) {
    let leader = ctx.leader.clone();
    leader
        .leading_with(&synced, Duration::from_millis(500))
        .await;
    // One pass over the cache, each node expanded in turn (never the whole fleet at once).
    let found = on_nodes(reader.state().iter().map(|n| n.expand()), &what);
    for w in what {
        let items: Vec<_> = found
            .iter()
            .filter(|i| i.kind == w.kind())
            .cloned()
            .collect();
        if items.is_empty() {
            continue;
        }
        let failed = apply(&client, &items, &leader).await.failed;
        let removed = items.len() - failed.len();
        let (what, flag) = (w.describe(), w.flag());
        if removed > 0 {
            info!(removed, "removed {what} from nodes ({flag} is off)");
        }
        if let Some((item, e)) = failed.first() {
            warn!(failed = failed.len(), name = %item.name, error = %e, "cannot remove {what} ({flag} is off); grant the controller patch on nodes and nodes/status (the chart does) or run `ec2-topology-labeler uninstall`");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::LiteNode;

    fn node(name: &str, conditions: &[&str], taints: &[(&str, &str)]) -> LiteNode {
        let mut n = crate::testing::nodes::node(name);
        for t in conditions {
            n = n.condition(crate::node::LiteCondition {
                type_: t.to_string(),
                status: "True".into(),
                reason: Some("R".into()),
                ..crate::node::LiteCondition::default()
            });
        }
        for (key, effect) in taints {
            n = n.taint(key, effect);
        }
        n.build()
    }

    #[test]
    fn finds_each_thing_of_ours_on_each_node_and_nothing_else() {
        let nodes = [
            node(
                "all",
                &[
                    "TopologyLabeled",
                    "UltraServerInterconnectImpaired",
                    "Ready",
                ],
                &[
                    (
                        "ec2-topology-labeler.io/interconnect-impaired",
                        "NoSchedule",
                    ),
                    ("example.com/theirs", "NoSchedule"),
                ],
            ),
            node("condition-only", &["TopologyLabeled"], &[]),
            // Our key with another effect is not our taint; the kubelet's conditions are not ours.
            node(
                "not-ours",
                &["Ready"],
                &[("ec2-topology-labeler.io/interconnect-impaired", "NoExecute")],
            ),
        ];
        let found = |what: &[OnNode]| -> Vec<(String, &'static str)> {
            on_nodes(nodes.iter(), what)
                .into_iter()
                .map(|i| (i.name, i.kind))
                .collect()
        };
        assert_eq!(
            found(&OnNode::ALL),
            [
                ("all".to_string(), "condition"),
                ("all".to_string(), "interconnect"),
                ("all".to_string(), "impaired-taint"),
                ("condition-only".to_string(), "condition"),
            ]
        );
        // Only what is asked for (a feature turned off retires its own things alone).
        assert_eq!(
            found(&[OnNode::InterconnectTaint]),
            [("all".to_string(), "impaired-taint")]
        );
        assert!(OnNode::ALL.iter().all(|o| OnNode::of(o.kind()) == Some(*o)));
    }
}

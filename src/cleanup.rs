//! A clean way out: what we wrote, found and removed — when a feature is turned off (by the
//! leader at start-up, only what cannot hurt a running workload) and by `uninstall` (everything
//! we own, labels only when asked).
//!
//! What is ours: our `TopologyLabeled` condition on Nodes; objects carrying our
//! `app.kubernetes.io/managed-by` label (HyperNodes also under this installation's name prefix);
//! the Lease; the label and annotation keys our field manager owns on Nodes.
//!
//! "Cannot hurt" decides what turning a feature off removes at start-up: a condition nothing
//! else should gate on any more, and HyperNodes (Volcano re-plans from what exists). Kueue and
//! KAI Topologies (a ResourceFlavor or a workload's annotation may name them) and the Slurm
//! ConfigMap (a slurmctld may mount it) are left in place then; `uninstall` removes them, except
//! a Kueue Topology a ResourceFlavor still names (reported, kept unless `--force`).
//!
//! Owns: removals. Each is one API call, made only while this replica leads (start-up) or by the
//! operator's own command.

use std::collections::BTreeSet;

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node},
};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams},
};
use serde::Serialize;
use serde_json::json;

use crate::{
    FIELD_MANAGER,
    node::CONDITION_TYPE,
    publish::{kai, kueue, owner, topology, volcano},
};

/// One thing of ours, and what happens to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Item {
    /// `condition`, `hypernode`, `kueue-topology`, `kai-topology`, `configmap`, `lease`,
    /// `labels`.
    pub kind: &'static str,
    /// `NAME` or `NAMESPACE/NAME` (for `condition` and `labels`: the node).
    pub name: String,
    /// Kept, and why (`None`: removed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
}

impl Item {
    fn remove(kind: &'static str, name: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
            kept: None,
        }
    }

    fn keep(kind: &'static str, name: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            kind,
            name: name.into(),
            kept: Some(why.into()),
        }
    }
}

fn selector() -> String {
    owner::selector()
}

/// Objects of `ar` (cluster-scoped) with our managed-by label; none when the API is not served.
async fn ours(client: &Client, ar: &ApiResource) -> Result<Vec<DynamicObject>, kube::Error> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    match api.list(&ListParams::default().labels(&selector())).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Names of nodes carrying our condition, among `nodes` (the node cache, or a fresh list).
pub fn with_condition<N: std::borrow::Borrow<crate::node::LiteNode>>(
    nodes: impl IntoIterator<Item = N>,
) -> Vec<String> {
    nodes
        .into_iter()
        .filter(|n| n.borrow().topology_condition().is_some())
        .map(|n| n.borrow().name_any())
        .collect()
}

/// Remove our condition from node `name` (a strategic merge patch of its status deleting the
/// entry of our type: other conditions are untouched).
pub async fn remove_condition(client: &Client, name: &str) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let patch =
        json!({ "status": { "conditions": [ { "type": CONDITION_TYPE, "$patch": "delete" } ] } });
    match api
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Which of the scheduler objects of our label a cleanup takes as its own.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// The running controller: only those annotated as this installation's (its Lease,
    /// `<namespace>/<name>`; the chart's admission policy refuses its ServiceAccount any other).
    Annotated(&'a str),
    /// `uninstall`, under its own ServiceAccount: also those without the annotation (written by
    /// hand or by a build before it), never another installation's.
    Labelled(&'a str),
}

impl Scope<'_> {
    /// Whether `o` is ours in this scope: `Ok` when it is, `Err(Some(why))` when it is kept
    /// and listed (`uninstall` lists another installation's), `Err(None)` when it is not ours
    /// to list (the controller leaves anything not annotated as its own out).
    fn ours(&self, o: &DynamicObject) -> Result<(), Option<String>> {
        match (self, owner::claim(o, self.installation())) {
            (_, owner::Claim::Ours) | (Scope::Labelled(_), owner::Claim::Unclaimed) => Ok(()),
            (Scope::Annotated(_), _) => Err(None),
            (Scope::Labelled(_), owner::Claim::Other(owner)) => Err(Some(format!(
                "another installation's ({owner}, annotation {}): if it is this installation's under an older Lease, pass that Lease's --leader-election-lease-name and --leader-election-namespace",
                owner::OWNER
            ))),
        }
    }

    fn installation(&self) -> &str {
        let (Scope::Annotated(me) | Scope::Labelled(me)) = *self;
        me
    }

    /// `o` as an item of `kind`: removed, or kept with why; `None` when not ours to list.
    fn item(&self, kind: &'static str, o: &DynamicObject) -> Option<Item> {
        match self.ours(o) {
            Ok(()) => Some(Item::remove(kind, o.name_any())),
            Err(Some(why)) => Some(Item::keep(kind, o.name_any(), why)),
            Err(None) => None,
        }
    }
}

/// Our HyperNodes: this installation's prefix and, by the owner annotation, as `scope` says
/// (another installation's of that prefix are listed as kept by `uninstall`, with why).
pub async fn hypernodes(
    client: &Client,
    prefix: &str,
    scope: Scope<'_>,
) -> Result<Vec<Item>, kube::Error> {
    Ok(ours(client, &volcano::api_resource())
        .await?
        .into_iter()
        .filter(|o| volcano::owned_by(prefix, &o.name_any()))
        .filter_map(|o| scope.item("hypernode", &o))
        .collect())
}

/// Our Kueue Topologies (by the owner annotation, as `scope` says): removed unless a
/// ResourceFlavor names one (then kept, with the flavors), or `force`.
pub async fn kueue_topologies(
    client: &Client,
    force: bool,
    scope: Scope<'_>,
) -> Result<Vec<Item>, kube::Error> {
    let Some(ar) = kueue::topology_resource(client).await? else {
        return Ok(Vec::new());
    };
    // Each with its verdict (ours, or kept and why), those not ours to list left out.
    let topologies: Vec<(DynamicObject, Option<String>)> = ours(client, &ar)
        .await?
        .into_iter()
        .filter_map(|t| match scope.ours(&t) {
            Ok(()) => Some((t, None)),
            Err(Some(why)) => Some((t, Some(why))),
            Err(None) => None,
        })
        .collect();
    if topologies.is_empty() {
        return Ok(Vec::new());
    }
    let flavors = match topology::served_resource(
        client,
        kueue::GROUP,
        &["v1beta2", "v1beta1"],
        "ResourceFlavor",
    )
    .await?
    {
        Some(far) => {
            Api::<DynamicObject>::all_with(client.clone(), &far)
                .list(&ListParams::default())
                .await?
                .items
        }
        None => Vec::new(),
    };
    Ok(topologies
        .into_iter()
        .map(|(t, kept)| {
            let name = t.name_any();
            if let Some(why) = kept {
                return Item::keep("kueue-topology", name, why);
            }
            let users: BTreeSet<String> = flavors
                .iter()
                .filter(|f| f.data.pointer("/spec/topologyName").and_then(|v| v.as_str()) == Some(name.as_str()))
                .map(|f| f.name_any())
                .collect();
            if users.is_empty() || force {
                Item::remove("kueue-topology", name)
            } else {
                Item::keep(
                    "kueue-topology",
                    name,
                    format!(
                        "ResourceFlavor(s) {} name it: deleting it would stop topology-aware admission; move them to another Topology first",
                        users.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                )
            }
        })
        .collect())
}

/// Our KAI Topologies (by the owner annotation, as `scope` says).
pub async fn kai_topologies(client: &Client, scope: Scope<'_>) -> Result<Vec<Item>, kube::Error> {
    let Some(ar) = topology::served_resource(client, kai::GROUP, &["v1alpha1"], "Topology").await?
    else {
        return Ok(Vec::new());
    };
    Ok(ours(client, &ar)
        .await?
        .into_iter()
        .filter_map(|t| scope.item("kai-topology", &t))
        .collect())
}

/// Our Slurm ConfigMaps, in any namespace (`uninstall` removes them all).
pub async fn configmaps(client: &Client) -> Result<Vec<Item>, kube::Error> {
    let api: Api<ConfigMap> = Api::all(client.clone());
    Ok(api
        .list(&ListParams::default().labels(&selector()))
        .await?
        .items
        .into_iter()
        .map(|c| {
            Item::remove(
                "configmap",
                format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()),
            )
        })
        .collect())
}

/// The Slurm ConfigMap `ns/name`, if it is ours (carries our managed-by label).
pub async fn configmap(client: &Client, ns: &str, name: &str) -> Result<Vec<Item>, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    Ok(api
        .get_opt(name)
        .await?
        .filter(|c| {
            c.labels().get(owner::MANAGED_BY.0).map(String::as_str) == Some(owner::MANAGED_BY.1)
        })
        .map(|_| Item::remove("configmap", format!("{ns}/{name}")))
        .into_iter()
        .collect())
}

/// `items` and what became of them, for a person (one line each; `empty` when there are none)
/// or as JSON (`dryRun`, `items`, `failed`, and the fields of `extra`).
pub fn report(
    items: &[Item],
    failed: &[(Item, kube::Error)],
    dry_run: bool,
    output: crate::config::OutputFormat,
    empty: &str,
    extra: serde_json::Value,
) -> crate::Result<String> {
    let mut out = String::new();
    match output {
        crate::config::OutputFormat::Json => {
            let failed: Vec<_> = failed
                .iter()
                .map(|(i, e)| serde_json::json!({ "kind": i.kind, "name": i.name, "error": e.to_string() }))
                .collect();
            let mut doc = serde_json::json!({
                "dryRun": dry_run,
                "items": items,
                "failed": failed,
            });
            if let (Some(doc), serde_json::Value::Object(extra)) = (doc.as_object_mut(), extra) {
                doc.extend(extra);
            }
            out = serde_json::to_string_pretty(&doc)
                .map_err(|e| crate::Error::Config(format!("cannot render JSON: {e}")))?;
            out.push('\n');
        }
        crate::config::OutputFormat::Table => {
            let verb = if dry_run { "would remove" } else { "removed" };
            for i in items {
                let failure = failed.iter().find(|(f, _)| f == i).map(|(_, e)| e);
                let what = match (&i.kept, failure) {
                    (Some(why), _) => format!("kept: {why}"),
                    (None, Some(e)) => format!("FAILED: {e}"),
                    (None, None) => verb.to_string(),
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

/// Carry out the removals in `items` (kept ones are skipped); returns the failures.
pub async fn apply(
    client: &Client,
    items: &[Item],
    leader: &crate::leader::Leadership,
) -> Vec<(Item, kube::Error)> {
    let mut failed = Vec::new();
    for item in items.iter().filter(|i| i.kept.is_none()) {
        if !leader.is_leader() {
            break;
        }
        if let Err(e) = remove(client, item).await {
            failed.push((item.clone(), e));
        }
    }
    failed
}

async fn remove(client: &Client, item: &Item) -> Result<(), kube::Error> {
    let gone = |r: Result<(), kube::Error>| match r {
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other,
    };
    let dp = DeleteParams::default();
    match item.kind {
        "condition" => remove_condition(client, &item.name).await,
        "hypernode" => gone(
            Api::<DynamicObject>::all_with(client.clone(), &volcano::api_resource())
                .delete(&item.name, &dp)
                .await
                .map(drop),
        ),
        "kueue-topology" | "kai-topology" => {
            let ar = if item.kind == "kueue-topology" {
                kueue::topology_resource(client).await?
            } else {
                topology::served_resource(client, kai::GROUP, &["v1alpha1"], "Topology").await?
            };
            match ar {
                Some(ar) => gone(
                    Api::<DynamicObject>::all_with(client.clone(), &ar)
                        .delete(&item.name, &dp)
                        .await
                        .map(drop),
                ),
                None => Ok(()),
            }
        }
        "configmap" | "lease" => {
            let (ns, name) = item.name.split_once('/').unwrap_or(("default", &item.name));
            if item.kind == "configmap" {
                gone(
                    Api::<ConfigMap>::namespaced(client.clone(), ns)
                        .delete(name, &dp)
                        .await
                        .map(drop),
                )
            } else {
                gone(
                    Api::<Lease>::namespaced(client.clone(), ns)
                        .delete(name, &dp)
                        .await
                        .map(drop),
                )
            }
        }
        "labels" => give_up_keys(client, &item.name).await,
        _ => Ok(()),
    }
}

/// Give up every label and annotation key our field manager owns on node `name`: one
/// server-side apply of an empty set. Keys only we own go; keys another manager co-owns (EKS's
/// cloud controller writes the same layer keys) stay, theirs. The apply names the node's UID: a
/// node deleted meanwhile (a scale-down) is not created again as an empty Node of that name (the
/// API server refuses a UID it does not have), and one deleted and recreated is not touched.
async fn give_up_keys(client: &Client, name: &str) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let Some(meta) = api.get_metadata_opt(name).await? else {
        return Ok(());
    };
    let body = json!({ "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name, "uid": meta.metadata.uid } });
    match api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
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
pub async fn nodes_with_our_keys(client: &Client) -> Result<Vec<Item>, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let mut out = Vec::new();
    let api = &api;
    crate::pages::each_page(
        ListParams::default(),
        crate::pages::PAGE,
        |p| async move { api.list_metadata(&p).await },
        |items| {
            for meta in &items {
                let (labels, annotations) = crate::retire::owned_keys(
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

//! Kubernetes helpers for tests: apply manifests, create nodes, wait for labels, read the API
//! server's own request counters.

use std::{
    collections::BTreeMap,
    future::Future,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    discovery,
};
use serde_json::json;

/// Server-side apply every document of a multi-document YAML manifest.
pub async fn apply_yaml(client: &Client, yaml: &str, manager: &str) -> anyhow::Result<Vec<String>> {
    apply_kinds(client, yaml, None, manager).await
}

/// The RBAC objects of the rendered chart (`deploy/`): what the controller may do.
pub const RBAC_KINDS: &[&str] = &[
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

/// Server-side apply the documents of a manifest whose `kind` is in `kinds` (all when `None`).
pub async fn apply_kinds(
    client: &Client,
    yaml: &str,
    kinds: Option<&[&str]>,
    manager: &str,
) -> anyhow::Result<Vec<String>> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(yaml).context("parsing manifests")?;
    let mut applied = Vec::new();
    let wanted = |d: &serde_json::Value| {
        kinds.is_none_or(|ks| d["kind"].as_str().is_some_and(|k| ks.contains(&k)))
    };
    for doc in docs.into_iter().filter(|d| d.is_object() && wanted(d)) {
        let obj: DynamicObject = serde_json::from_value(doc.clone())?;
        let types = obj
            .types
            .clone()
            .context("manifest without apiVersion/kind")?;
        let gvk = GroupVersionKind::try_from(&types)?;
        let (resource, caps) = discovery::pinned_kind(client, &gvk).await?;
        let name = obj.name_any();
        let api: Api<DynamicObject> = match caps.scope {
            discovery::Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.namespace().as_deref().unwrap_or("default"),
                &resource,
            ),
            discovery::Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        api.patch(
            &name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(doc),
        )
        .await
        .with_context(|| format!("applying {} {name}", types.kind))?;
        applied.push(format!("{}/{name}", types.kind));
    }
    Ok(applied)
}

/// Ensure a namespace exists.
pub async fn ensure_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let doc = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n");
    apply_yaml(client, &doc, "e2e").await.map(drop)
}

/// Create nodes, 32 at a time.
pub async fn create_nodes(client: &Client, nodes: Vec<Node>) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let results: Vec<anyhow::Result<()>> = stream::iter(nodes)
        .map(|n| {
            let api = api.clone();
            async move {
                let name = n.name_any();
                api.create(&PostParams::default(), &n)
                    .await
                    .map(drop)
                    .with_context(|| format!("creating node {name}"))
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect()
}

pub async fn delete_node(client: &Client, name: &str) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    api.delete(name, &Default::default()).await?;
    Ok(())
}

pub async fn labels(client: &Client, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let api: Api<Node> = Api::all(client.clone());
    Ok(api.get(name).await?.labels().clone())
}

/// Labels in our family (`topology.k8s.aws/network-node-layer-*`, zone ID, our own keys).
pub fn topology_labels(all: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    all.iter()
        .filter(|(k, _)| {
            k.starts_with("topology.k8s.aws/") || k.starts_with("ec2-topology-labeler.io/")
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Poll `check` every 100 ms until it returns `Some`, or fail after `timeout` with `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last = format!(" (last error: {e:#})"),
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}{last}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait until node `name`'s topology labels equal `want` exactly.
pub async fn wait_for_topology(
    client: &Client,
    name: &str,
    want: &BTreeMap<String, String>,
    timeout: Duration,
) -> anyhow::Result<()> {
    let seen = std::cell::RefCell::new(BTreeMap::new());
    let result = eventually(&format!("labels on {name}"), timeout, || async {
        let now = topology_labels(&labels(client, name).await?);
        let done = &now == want;
        *seen.borrow_mut() = now;
        Ok(done.then_some(()))
    })
    .await;
    result.with_context(|| format!("want {want:?}, have {:?}", seen.borrow()))
}

/// Set a node's bootID (as a kubelet does after the instance reboots or is stopped and started).
pub async fn set_boot_id(client: &Client, name: &str, boot_id: &str) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "nodeInfo": { "bootID": boot_id } } })),
    )
    .await?;
    Ok(())
}

/// Set a node's providerID (as the cloud controller does after registration).
pub async fn set_provider_id(client: &Client, name: &str, provider_id: &str) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "providerID": provider_id } })),
    )
    .await?;
    Ok(())
}

/// The API server's `/metrics`.
pub async fn apiserver_metrics(client: &Client) -> anyhow::Result<String> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    Ok(client.request_text(req).await?)
}

/// Writes (PATCH, APPLY, CREATE, UPDATE, DELETE) the API server has served for `resource`.
pub async fn writes_to(client: &Client, resource: &str) -> anyhow::Result<f64> {
    let text = apiserver_metrics(client).await?;
    let res = format!("resource=\"{resource}\"");
    Ok(["PATCH", "APPLY", "CREATE", "UPDATE", "DELETE"]
        .iter()
        .map(|verb| {
            crate::labeler::metric_sum(
                &text,
                "apiserver_request_total",
                &[&res, &format!("verb=\"{verb}\"")],
            )
        })
        .sum())
}

/// Node label writes the API server has served: `apiserver_request_total` for `nodes` (not the
/// status subresource) with verb PATCH (merge/strategic patches) or APPLY (server-side apply).
pub async fn node_writes(client: &Client) -> anyhow::Result<f64> {
    let text = apiserver_metrics(client).await?;
    let count = |verb: &str| {
        crate::labeler::metric_sum(
            &text,
            "apiserver_request_total",
            &[
                "resource=\"nodes\"",
                "subresource=\"\"",
                &format!("verb=\"{verb}\""),
            ],
        )
    };
    Ok(count("PATCH") + count("APPLY"))
}

/// The latest time any Node's managed fields record a write by `manager` (1 s resolution).
pub async fn last_write_by(client: &Client, manager: &str) -> anyhow::Result<Option<String>> {
    let api: Api<Node> = Api::all(client.clone());
    let nodes = api.list(&Default::default()).await?;
    Ok(nodes
        .items
        .iter()
        .flat_map(|n| n.metadata.managed_fields.iter().flatten())
        .filter(|m| m.manager.as_deref() == Some(manager))
        .filter_map(|m| m.time.as_ref().map(|t| t.0.to_string()))
        .max())
}

/// Whether `node` is an EC2 instance (its providerID is `aws:///…`): what the controller looks up.
pub fn is_ec2(node: &k8s_openapi::api::core::v1::Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .is_some_and(|p| p.starts_with("aws:///"))
}

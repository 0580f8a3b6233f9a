//! What the real schedulers' scenarios share: a fleet of nodes whose network paths the test
//! knows, nodes made busy by pods already bound to them, where a gang's pods landed, and the
//! objects docs/schedulers.md shows.
//!
//! No kubelet runs on the bare control plane: a scheduler binding a pod sets `spec.nodeName`,
//! which is all a placement needs; a bound pod never runs, so it keeps its node's resources
//! until it is deleted (by force: no kubelet confirms a graceful deletion).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, ensure};
use e2e::{
    env::{Env, WAIT, label_and_wait},
    fixtures::NodeSpec,
    kube_util::{self, eventually},
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use mock_ec2::Instance;
use serde_json::json;

/// Label that keeps a scenario's pods on its own fleet (the cluster holds every scenario's nodes).
pub const POOL: &str = "e2e.ec2-topology-labeler.io/pool";

/// CPUs one pod asks for: each test node (191.45 allocatable) fits exactly one.
pub const POD_CPU: &str = "100";

/// Nodes created for one scenario, each with its network path (top first).
pub struct Fleet {
    pub pool: String,
    pub nodes: Vec<(NodeSpec, Vec<String>)>,
    /// Each node's capacity block (UltraServer), as EC2 answers for it.
    blocks: Vec<Option<String>>,
}

impl Fleet {
    /// Create `groups` (instance type, network path, node count), label them through the
    /// controller and mock-ec2, put them in `pool`, and clear the taint the API server puts on
    /// new Nodes (no node lifecycle controller runs here to lift it).
    pub async fn create(
        env: &Env,
        c: &Client,
        pool: &str,
        prefix: u32,
        groups: &[(&str, &[&str], u32)],
    ) -> anyhow::Result<Self> {
        let groups: Vec<_> = groups.iter().map(|(t, p, n)| (*t, *p, *n, None)).collect();
        Self::create_in_blocks(env, c, pool, prefix, &groups).await
    }

    /// [`Fleet::create`] with each group's instances in a capacity block (an UltraServer) or
    /// none, as EC2 answers.
    pub async fn create_in_blocks(
        env: &Env,
        c: &Client,
        pool: &str,
        prefix: u32,
        groups: &[(&str, &[&str], u32, Option<&str>)],
    ) -> anyhow::Result<Self> {
        let mut nodes = Vec::new();
        let mut blocks = Vec::new();
        let mut k = 0;
        for (instance_type, path, count, block) in groups {
            for _ in 0..*count {
                k += 1;
                nodes.push((
                    NodeSpec::ec2(prefix, k, instance_type),
                    path.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                ));
                blocks.push(block.map(str::to_string));
            }
        }
        let pairs: Vec<(NodeSpec, Instance)> = nodes
            .iter()
            .zip(&blocks)
            .map(|((s, p), block)| {
                let p: Vec<&str> = p.iter().map(String::as_str).collect();
                let mut i = s.instance(&p);
                i.capacity_block_id = block.clone();
                (s.clone(), i)
            })
            .collect();
        label_and_wait(env, c, &pairs).await?;
        let api: Api<Node> = Api::all(c.clone());
        for (s, _) in &nodes {
            api.patch(
                &s.name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {POOL: pool}}, "spec": {"taints": null}}),
                ),
            )
            .await?;
        }
        Ok(Self {
            pool: pool.to_string(),
            nodes,
            blocks,
        })
    }

    /// The capacity block of the fleet's node `name`, if it is in one.
    pub fn block(&self, name: &str) -> Option<&str> {
        let i = self.nodes.iter().position(|(s, _)| s.name == name)?;
        self.blocks.get(i)?.as_deref()
    }

    /// The one capacity block all of `nodes` are in; an error when they are in several, or
    /// one of them in none.
    pub fn one_block(&self, nodes: &BTreeSet<String>) -> anyhow::Result<&str> {
        let blocks: BTreeSet<Option<&str>> = nodes.iter().map(|n| self.block(n)).collect();
        match blocks.iter().collect::<Vec<_>>()[..] {
            [Some(b)] => Ok(b),
            _ => anyhow::bail!("not in one UltraServer: {blocks:?} ({nodes:?})"),
        }
    }

    pub fn names(&self) -> BTreeSet<String> {
        self.nodes.iter().map(|(s, _)| s.name.clone()).collect()
    }

    /// The network node `tier` hops above `node` (1: the switch it hangs off).
    pub fn domain(&self, node: &str, tier: usize) -> Option<&str> {
        let (_, path) = self.nodes.iter().find(|(s, _)| s.name == node)?;
        path.len()
            .checked_sub(tier)
            .and_then(|i| path.get(i))
            .map(String::as_str)
    }

    /// The nodes under network node `id` (at any depth of their path).
    pub fn under(&self, id: &str) -> BTreeSet<String> {
        self.nodes
            .iter()
            .filter(|(_, p)| p.iter().any(|n| n == id))
            .map(|(s, _)| s.name.clone())
            .collect()
    }

    /// The one network node `tier` hops above every node of `placed`, or why there is none.
    pub fn common_domain<'a>(
        &self,
        placed: impl IntoIterator<Item = &'a String>,
        tier: usize,
    ) -> anyhow::Result<String> {
        let domains: BTreeSet<Option<&str>> =
            placed.into_iter().map(|n| self.domain(n, tier)).collect();
        match domains.iter().collect::<Vec<_>>()[..] {
            [Some(d)] => Ok(d.to_string()),
            _ => anyhow::bail!("the pods span tier-{tier} domains {domains:?}"),
        }
    }

    /// Short names for a report: the host part of each node name.
    pub fn short(nodes: &BTreeSet<String>) -> Vec<&str> {
        nodes
            .iter()
            .map(|n| n.split('.').next().unwrap_or(n))
            .collect()
    }

    pub async fn delete(&self, c: &Client) -> anyhow::Result<()> {
        for (s, _) in &self.nodes {
            kube_util::delete_node(c, &s.name).await?;
        }
        Ok(())
    }
}

/// A namespace for workloads, with what kube-controller-manager (not run here) puts in every
/// namespace: the `default` ServiceAccount pods are admitted with, and the `kube-root-ca.crt`
/// ConfigMap their token volume projects (KAI refuses a pod whose ConfigMaps are missing).
pub async fn workload_namespace(env: &Env, c: &Client, ns: &str) -> anyhow::Result<()> {
    kube_util::ensure_namespace(c, ns).await?;
    let ca = match &env.cluster.local {
        Some(cp) => std::fs::read_to_string(cp.dir.join("certs/apiserver.crt"))?,
        None => String::new(),
    };
    let objects = [
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": "default", "namespace": ns}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kube-root-ca.crt", "namespace": ns}, "data": {"ca.crt": ca}}),
    ];
    for o in objects {
        kube_util::apply_yaml(c, &serde_json::to_string(&o)?, "e2e").await?;
    }
    Ok(())
}

/// Make `node` busy: a pod already bound to it takes the room of one gang pod.
pub async fn busy(c: &Client, ns: &str, node: &str) -> anyhow::Result<()> {
    let name = format!("busy-{}", node.split('.').next().unwrap_or(node));
    kube_util::apply_yaml(
        c,
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{ name: {name}, namespace: {ns}, labels: {{ e2e-busy: \"true\" }} }}\nspec:\n  nodeName: {node}\n  containers:\n    - name: w\n      image: registry.k8s.io/pause:3.10\n      resources: {{ requests: {{ cpu: \"{POD_CPU}\" }} }}\n"
        ),
        "e2e",
    )
    .await
    .map(drop)
}

/// Pods matching `selector` in `ns`: name → node (`None` while unbound).
pub async fn bindings(
    c: &Client,
    ns: &str,
    selector: &str,
) -> anyhow::Result<BTreeMap<String, Option<String>>> {
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    Ok(pods
        .list(&ListParams::default().labels(selector))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            (
                p.metadata.name.unwrap_or_default(),
                p.spec.and_then(|s| s.node_name),
            )
        })
        .collect())
}

/// Wait until `count` pods match `selector` and each is bound; returns the nodes they are on.
pub async fn wait_bound(
    c: &Client,
    ns: &str,
    selector: &str,
    count: usize,
    timeout: std::time::Duration,
) -> anyhow::Result<BTreeSet<String>> {
    let placed = eventually(
        &format!("{count} pods {selector} bound"),
        timeout,
        || async {
            let b = bindings(c, ns, selector).await?;
            let nodes: Vec<String> = b.values().flatten().cloned().collect();
            Ok((b.len() == count && nodes.len() == count).then_some(nodes))
        },
    )
    .await?;
    let distinct: BTreeSet<String> = placed.iter().cloned().collect();
    ensure!(
        distinct.len() == placed.len(),
        "two pods on one node: {placed:?}"
    );
    Ok(distinct)
}

/// No pod matching `selector` is bound (there may be none yet).
pub async fn none_bound(c: &Client, ns: &str, selector: &str) -> anyhow::Result<()> {
    let b = bindings(c, ns, selector).await?;
    let bound: Vec<_> = b.iter().filter(|(_, n)| n.is_some()).collect();
    ensure!(bound.is_empty(), "pods bound: {bound:?}");
    Ok(())
}

/// Delete the pods matching `selector` at once (no kubelet would confirm a graceful deletion).
pub async fn force_delete_pods(c: &Client, ns: &str, selector: &str) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default().labels(selector),
    )
    .await?;
    eventually("pods deleted", WAIT, || async {
        Ok(pods
            .list(&ListParams::default().labels(selector))
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await
}

/// Every YAML document of the YAML blocks of docs/schedulers.md, in order.
pub fn doc_yaml() -> anyhow::Result<Vec<serde_json::Value>> {
    let doc = std::fs::read_to_string(e2e::repo_root().join("docs/schedulers.md"))?;
    let mut out = Vec::new();
    let mut rest = doc.as_str();
    while let Some(start) = rest.find("```yaml\n") {
        let body = &rest[start + 8..];
        let end = body.find("```").context("an unterminated yaml block")?;
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&body[..end])
            .with_context(|| format!("a yaml block of docs/schedulers.md:\n{}", &body[..end]))?;
        out.extend(docs);
        rest = &body[end..];
    }
    Ok(out)
}

/// Every object (kind and `metadata.name` set) of the YAML blocks of docs/schedulers.md.
pub fn doc_objects() -> anyhow::Result<Vec<serde_json::Value>> {
    Ok(doc_yaml()?
        .into_iter()
        .filter(|d| d["kind"].is_string() && d["metadata"]["name"].is_string())
        .collect())
}

/// The objects of docs/schedulers.md of this kind and name, in the order the doc shows them.
pub fn doc_objects_named(kind: &str, name: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let found: Vec<serde_json::Value> = doc_objects()?
        .into_iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    ensure!(
        !found.is_empty(),
        "docs/schedulers.md shows no {kind} {name}"
    );
    Ok(found)
}

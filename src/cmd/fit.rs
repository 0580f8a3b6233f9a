//! `fit`: where a gang of pods fits now, by topology domain (reads Nodes and Pods, writes
//! nothing). The counting is [`crate::fit`]'s; this file reads the cluster into it.
//!
//! Owns: the `fit` output. Never writes to the cluster.

use crate::bounds::Bound;
use std::{collections::BTreeMap, io::Write};

use clap::Args;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client, ResourceExt, api::ListParams};

use crate::{
    Error, Result,
    fit::{Capacity, Gang, Milli, PODS, Taint, Toleration, fit, milli},
    flags::{LabelArgs, Output, OutputFormat},
    labels::{LabelScheme, path_of},
    publish::cliques::CLIQUE_LABEL,
};

/// `--pods`'s range.
pub(crate) const PODS_RANGE: Bound = Bound::count("pods", 1, 1_000_000);
/// `--misses`'s range.
pub(crate) const MISSES_RANGE: Bound = Bound::count("misses", 0, 100_000);

#[derive(Debug, Clone, Args)]
pub struct FitArgs {
    /// A Kueue Workload (`NAMESPACE/NAME`, usually a pending one) instead of `--pods`,
    /// `--requests` and `--level`: each of its pod sets with a topology request, on each
    /// topology-aware flavor of its ClusterQueue (the flavor's node labels and tolerations
    /// added to the pod template's).
    #[arg(long, value_parser = parse_workload, env = "LABELER_FIT_WORKLOAD", conflicts_with_all = ["pods", "requests", "level", "node_selector", "tolerations"])]
    pub workload: Option<(String, String)>,
    /// Pods in the gang.
    #[arg(long, value_parser = PODS_RANGE.counts::<u64>(), env = "LABELER_FIT_PODS", required_unless_present = "workload")]
    pub pods: Option<u64>,
    /// What each pod requests, `RESOURCE=QUANTITY` separated by commas
    /// (`nvidia.com/gpu=8,cpu=90,memory=1000Gi`). Every pod also takes a pod slot.
    #[arg(long, value_parser = parse_requests, env = "LABELER_FIT_REQUESTS", default_value = "")]
    pub requests: Requests,
    /// The node label whose values are the domains the whole gang must share
    /// (`topology.k8s.aws/network-node-layer-3` for one leaf switch).
    #[arg(long, value_parser = parse_label_key, env = "LABELER_FIT_LEVEL", required_unless_present = "workload")]
    pub level: Option<String>,
    /// Node labels every pod requires (its `nodeSelector`), `KEY=VALUE` separated by commas:
    /// other nodes are in no domain.
    #[arg(long, value_parser = parse_node_selector, env = "LABELER_FIT_NODE_SELECTOR", default_value = "")]
    pub(crate) node_selector: NodeSelector,
    /// Taints the pods tolerate, `KEY[=VALUE][:EFFECT]` separated by commas (no value: any
    /// value; no effect: any effect). Nodes with a `NoSchedule` or `NoExecute` taint not
    /// tolerated take no pod.
    #[arg(long, value_parser = parse_toleration, value_delimiter = ',', env = "LABELER_FIT_TOLERATIONS")]
    pub tolerations: Vec<crate::fit::Toleration>,
    /// Domains that do not fit to show, nearest first.
    #[arg(long, value_parser = MISSES_RANGE.counts::<usize>(), env = "LABELER_FIT_MISSES", default_value_t = 5)]
    pub misses: usize,
    /// The label keys, as `run` has them: they say which level is the capacity block (an
    /// UltraServer, named by its leaf switch too) and which are the network layers.
    #[command(flatten)]
    pub labels: LabelArgs,
    #[command(flatten)]
    pub output: Output,
}

/// Per-pod requests, in thousandths of each resource's unit.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Requests(pub std::collections::BTreeMap<String, crate::fit::Milli>);

/// `nvidia.com/gpu=8,cpu=500m`: each resource once, a name Kubernetes accepts, a quantity of
/// at least 0.
fn parse_requests(text: &str) -> std::result::Result<Requests, String> {
    let mut out = std::collections::BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, quantity) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected RESOURCE=QUANTITY"))?;
        let name = parse_label_key(name.trim())
            .map_err(|e| format!("{part:?}: not a resource name: {e}"))?;
        let amount = crate::fit::milli(quantity.trim()).map_err(|e| e.to_string())?;
        if amount < 0 {
            return Err(format!("{part:?}: a request is not negative"));
        }
        if name == crate::fit::PODS {
            return Err("pods: every pod takes one pod slot; not a request".into());
        }
        if out.insert(name.clone(), amount).is_some() {
            return Err(format!("{name} given twice"));
        }
    }
    Ok(Requests(out))
}

/// `NAMESPACE/NAME`.
fn parse_workload(text: &str) -> std::result::Result<(String, String), String> {
    let (ns, name) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?}: expected NAMESPACE/NAME"))?;
    let dns_label = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && crate::labels::is_valid_label_key(s)
            && !s.contains('/')
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    if !dns_label(ns) || !dns_label(name) {
        return Err(format!(
            "{text:?}: expected NAMESPACE/NAME (lowercase DNS names)"
        ));
    }
    Ok((ns.to_string(), name.to_string()))
}

/// Required node labels.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct NodeSelector(pub std::collections::BTreeMap<String, String>);

/// `pool=a,zone=b`: valid label keys and values, each key once.
fn parse_node_selector(text: &str) -> std::result::Result<NodeSelector, String> {
    let mut out = std::collections::BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected KEY=VALUE"))?;
        let key = parse_label_key(key)?;
        if !value.is_empty() && !crate::labels::is_valid_label_value(value) {
            return Err(format!("{part:?}: {value:?} is not a label value"));
        }
        if out.insert(key.clone(), value.to_string()).is_some() {
            return Err(format!("{key} given twice"));
        }
    }
    Ok(NodeSelector(out))
}

/// `KEY[=VALUE][:EFFECT]`: `Equal` with a value, `Exists` without; an empty key (`:NoSchedule`)
/// with no value tolerates every key.
fn parse_toleration(text: &str) -> std::result::Result<crate::fit::Toleration, String> {
    let (rest, effect) = match text.rsplit_once(':') {
        Some((rest, effect)) => (rest, Some(effect)),
        None => (text, None),
    };
    if let Some(e) = effect
        && !matches!(e, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
    {
        return Err(format!(
            "{text:?}: the effect is NoSchedule, PreferNoSchedule or NoExecute, not {e:?}"
        ));
    }
    let (key, value) = match rest.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (rest, None),
    };
    if !key.is_empty() {
        parse_label_key(key)?;
    } else if value.is_some() {
        return Err(format!("{text:?}: a value needs a key"));
    }
    Ok(crate::fit::Toleration {
        key: (!key.is_empty()).then(|| key.to_string()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.into()),
        value: value.map(str::to_string),
        effect: effect.map(str::to_string),
    })
}

/// A label key (or resource name) as Kubernetes accepts it: an optional DNS-subdomain prefix
/// and `/`, then a name of at most 63 characters.
fn parse_label_key(text: &str) -> std::result::Result<String, String> {
    if crate::labels::is_valid_label_key(text) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?} is not a label key (an optional DNS-subdomain prefix and `/`, then 1-63 letters, digits, `-`, `_`, `.`)"
        ))
    }
}

/// Quantities as thousandths; one Kubernetes would not write is left out.
fn amounts(
    list: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> BTreeMap<String, Milli> {
    list.into_iter()
        .flatten()
        .filter_map(|(k, q)| Some((k.clone(), milli(&q.0).ok()?)))
        .collect()
}

fn add(into: &mut BTreeMap<String, Milli>, from: &BTreeMap<String, Milli>) {
    for (k, v) in from {
        *into.entry(k.clone()).or_default() += v;
    }
}

fn max(into: &mut BTreeMap<String, Milli>, from: &BTreeMap<String, Milli>) {
    for (k, v) in from {
        let e = into.entry(k.clone()).or_default();
        *e = (*e).max(*v);
    }
}

/// What a pod takes from its node, as the scheduler counts it: its containers' requests and
/// its sidecars' (init containers that keep running), or the largest init container's with the
/// sidecars started before it, whichever is more, plus the pod's overhead; and one pod slot.
pub(crate) fn pod_requests(pod: &Pod) -> BTreeMap<String, Milli> {
    let Some(spec) = &pod.spec else {
        return BTreeMap::new();
    };
    let requests = |c: &k8s_openapi::api::core::v1::Container| {
        amounts(c.resources.as_ref().and_then(|r| r.requests.as_ref()))
    };
    let mut sidecars = BTreeMap::new();
    let mut init_peak = BTreeMap::new();
    for c in spec.init_containers.iter().flatten() {
        let r = requests(c);
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut sidecars, &r);
        } else {
            let mut with = r;
            add(&mut with, &sidecars);
            max(&mut init_peak, &with);
        }
    }
    let mut total = sidecars;
    for c in &spec.containers {
        add(&mut total, &requests(c));
    }
    max(&mut total, &init_peak);
    add(&mut total, &amounts(spec.overhead.as_ref()));
    *total.entry(PODS.to_string()).or_default() += 1000;
    total
}

/// Ready and not cordoned.
pub fn schedulable(node: &Node) -> bool {
    let cordoned = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ready && !cordoned
}

fn taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .map(|t| Taint {
            key: t.key.clone(),
            value: t.value.clone(),
            effect: t.effect.clone(),
        })
        .collect()
}

/// A pod spec's tolerations, for [`Gang::tolerations`].
pub fn tolerations(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<Toleration> {
    spec.tolerations
        .iter()
        .flatten()
        .map(|t| Toleration {
            key: t.key.clone(),
            operator: t.operator.clone(),
            value: t.value.clone(),
            effect: t.effect.clone(),
        })
        .collect()
}

/// Every object of `api`, page by page.
async fn list_all<K>(api: &Api<K>, params: ListParams) -> Result<Vec<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut all = Vec::new();
    crate::client::pages::each_page(
        params,
        crate::client::pages::PAGE,
        |p| async move { api.list(&p).await },
        |items| all.extend(items),
    )
    .await?;
    Ok(all)
}

/// A node's domain at `level`, as the Kueue and KAI Topologies we publish name it: a network
/// node by its ID (IDs are unique and nest, so the layers above add nothing); an UltraServer
/// (the capacity block) by the leaf switch above it too, and a GPU clique by its leaf and
/// capacity block, so that a capacity block split across two leaf switches is two domains, as
/// it is to the schedulers (a gang that needs one UltraServer never spans two leaves). Other
/// labels (hostname, zone, anything) by their value. `None`: in no domain.
pub fn domain(
    scheme: &LabelScheme,
    level: &str,
    labels: &BTreeMap<String, String>,
) -> Option<String> {
    let value = labels.get(level)?;
    let block_key = scheme.capacity_block_key.as_deref();
    let parents: Vec<&str> = if block_key == Some(level) {
        Vec::new()
    } else if level == CLIQUE_LABEL {
        block_key
            .and_then(|k| labels.get(k))
            .map(String::as_str)
            .into_iter()
            .collect()
    } else {
        return Some(value.clone());
    };
    let path = path_of(scheme, labels).unwrap_or_default();
    let leaf = path.last().map(String::as_str);
    let mut name: Vec<&str> = leaf.into_iter().chain(parents).collect();
    name.push(value);
    Some(name.join("/"))
}

/// The nodes as [`crate::fit`] counts them: each one's domain at `level` ([`domain`]),
/// allocatable, and what the pods bound to it (and not finished) request.
pub(crate) fn capacities(
    nodes: &[Node],
    pods: &[Pod],
    level: &str,
    scheme: &LabelScheme,
) -> Vec<Capacity> {
    let mut used: BTreeMap<&str, BTreeMap<String, Milli>> = BTreeMap::new();
    for pod in pods {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            add(used.entry(node).or_default(), &pod_requests(pod));
        }
    }
    nodes
        .iter()
        .map(|n| {
            let name = n.name_any();
            Capacity {
                domain: domain(scheme, level, n.labels()),
                allocatable: amounts(n.status.as_ref().and_then(|s| s.allocatable.as_ref())),
                requested: used.remove(name.as_str()).unwrap_or_default(),
                schedulable: schedulable(n),
                taints: taints(n),
                labels: n.labels().clone(),
                name,
            }
        })
        .collect()
}

/// Nodes and the pods bound to them (and not finished), as the cluster has them now.
async fn cluster(client: &Client) -> Result<(Vec<Node>, Vec<Pod>)> {
    let nodes = list_all(&Api::<Node>::all(client.clone()), ListParams::default()).await?;
    // Bound pods that still hold their requests; the phase is filtered again when counting.
    let pods = list_all(
        &Api::<Pod>::all(client.clone()),
        ListParams::default()
            .fields("spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"),
    )
    .await?;
    Ok((nodes, pods))
}

fn json_text<T: serde::Serialize>(v: &T) -> Result<String> {
    let mut s = serde_json::to_string_pretty(v).map_err(|e| Error::Config(e.to_string()))?;
    s.push('\n');
    Ok(s)
}

pub async fn run(args: FitArgs) -> Result<()> {
    let client = crate::client::connect_default().await?;
    if let Some((ns, name)) = &args.workload {
        return workload::run(&client, ns, name, &args).await;
    }
    let (Some(pods), Some(level)) = (args.pods, args.level.clone()) else {
        return Err(Error::Config(
            "fit needs --pods and --level, or --workload".into(),
        ));
    };
    let scheme = args.labels.scheme().map_err(Error::Config)?;
    let (nodes, bound) = cluster(&client).await?;
    let gang = Gang {
        node_selector: args.node_selector.0.clone(),
        tolerations: args.tolerations.clone(),
        ..Gang::new(pods, args.requests.0.clone())
    };
    let answer = fit(&capacities(&nodes, &bound, &level, &scheme), &gang);
    let text = match args.output.format {
        OutputFormat::Table => answer.render(&level, args.misses),
        OutputFormat::Json => {
            let mut v = serde_json::to_value(&answer).map_err(|e| Error::Config(e.to_string()))?;
            if let Some(o) = v.as_object_mut() {
                o.insert("level".into(), level.clone().into());
                if let Some(m) = o.get_mut("misses").and_then(|m| m.as_array_mut()) {
                    m.truncate(args.misses);
                }
            }
            json_text(&v)?
        }
    };
    std::io::stdout().write_all(text.as_bytes())?;
    if answer.fits.is_empty() {
        return Err(Error::Config(format!(
            "no domain at {level} takes all {pods} pod(s) now"
        )));
    }
    Ok(())
}

/// `fit --workload`: a Kueue Workload's pod sets, on its ClusterQueue's topology-aware flavors.
pub mod workload {
    use serde_json::Value;

    use super::*;

    /// The value at a JSON pointer (`/spec/queueName`); null where there is none.
    fn at<'a>(v: &'a Value, pointer: &str) -> &'a Value {
        v.pointer(pointer).unwrap_or(&Value::Null)
    }

    /// Kueue's API versions, newest first.
    const VERSIONS: [&str; 2] = ["v1beta2", "v1beta1"];

    /// A Kueue object, from the newest API version the cluster serves.
    async fn get(
        client: &Client,
        kind: &str,
        plural: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Result<Value> {
        let mut last = None;
        for version in VERSIONS {
            let ar = kube::api::ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk("kueue.x-k8s.io", version, kind),
                plural,
            );
            let api: Api<kube::api::DynamicObject> = match ns {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
                None => Api::all_with(client.clone(), &ar),
            };
            match api.get(name).await {
                Ok(o) => return serde_json::to_value(o).map_err(|e| Error::Config(e.to_string())),
                // This version not served (or the object not found in it): the next.
                Err(kube::Error::Api(e)) if e.code == 404 => last = Some(kube::Error::Api(e)),
                Err(e) => return Err(e.into()),
            }
        }
        Err(last.map_or_else(
            || Error::Config(format!("{kind} {name} not found")),
            Error::from,
        ))
    }

    /// A topology-aware flavor: its name, node labels and tolerations.
    #[derive(Debug, Clone, PartialEq, Eq, Default)]
    pub struct Flavor {
        pub name: String,
        pub(crate) node_labels: BTreeMap<String, String>,
        pub tolerations: Vec<Toleration>,
    }

    impl Flavor {
        /// From a ResourceFlavor; `None` unless it names a Topology.
        pub fn of(flavor: &Value) -> Option<Flavor> {
            let spec = at(flavor, "/spec");
            at(spec, "/topologyName")
                .as_str()
                .filter(|t| !t.is_empty())?;
            let spec_obj: k8s_openapi::api::core::v1::PodSpec = serde_json::from_value(
                serde_json::json!({"containers": [], "tolerations": at(spec, "/tolerations").clone()}),
            )
            .unwrap_or_default();
            Some(Flavor {
                name: at(flavor, "/metadata/name")
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                node_labels: serde_json::from_value(at(spec, "/nodeLabels").clone())
                    .unwrap_or_default(),
                tolerations: tolerations(&spec_obj),
            })
        }
    }

    /// The topology-aware flavors of the ClusterQueue behind `workload`'s queue, in the
    /// ClusterQueue's order; why none, when none.
    async fn flavors(
        client: &Client,
        ns: &str,
        workload: &Value,
    ) -> std::result::Result<Vec<Flavor>, String> {
        let queue = at(workload, "/spec/queueName")
            .as_str()
            .ok_or("the Workload names no queue")?;
        let local = get(client, "LocalQueue", "localqueues", Some(ns), queue)
            .await
            .map_err(|e| format!("LocalQueue {ns}/{queue}: {e}"))?;
        let cq = at(&local, "/spec/clusterQueue")
            .as_str()
            .ok_or_else(|| format!("LocalQueue {ns}/{queue} names no ClusterQueue"))?;
        let cluster_queue = get(client, "ClusterQueue", "clusterqueues", None, cq)
            .await
            .map_err(|e| format!("ClusterQueue {cq}: {e}"))?;
        let mut names: Vec<&str> = Vec::new();
        for group in at(&cluster_queue, "/spec/resourceGroups")
            .as_array()
            .into_iter()
            .flatten()
        {
            for f in at(group, "/flavors").as_array().into_iter().flatten() {
                if let Some(n) = at(f, "/name").as_str()
                    && !names.contains(&n)
                {
                    names.push(n);
                }
            }
        }
        let mut out = Vec::new();
        for name in names {
            let f = get(client, "ResourceFlavor", "resourceflavors", None, name)
                .await
                .map_err(|e| format!("ResourceFlavor {name}: {e}"))?;
            out.extend(Flavor::of(&f));
        }
        if out.is_empty() {
            return Err(format!(
                "ClusterQueue {cq} has no flavor with a topologyName"
            ));
        }
        Ok(out)
    }

    /// One pod set's gang on one flavor.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct PodSetGang {
        pub(crate) pod_set: String,
        pub flavor: Option<String>,
        pub level: String,
        /// `required` (else `preferred`: Kueue admits it across domains too).
        pub required: bool,
        pub gang: Gang,
    }

    /// Each pod set of `workload` with a topology request, on each of `flavors` (none known:
    /// the pod template alone); and a note for each pod set left out.
    pub fn gangs(workload: &Value, flavors: &[Flavor]) -> (Vec<PodSetGang>, Vec<String>) {
        let mut out = Vec::new();
        let mut notes = Vec::new();
        for ps in at(workload, "/spec/podSets")
            .as_array()
            .into_iter()
            .flatten()
        {
            let name = at(ps, "/name").as_str().unwrap_or("main").to_string();
            let count = at(ps, "/count").as_u64().unwrap_or(0);
            let request = at(ps, "/topologyRequest");
            let (level, required) = match (
                at(request, "/required").as_str(),
                at(request, "/preferred").as_str(),
            ) {
                (Some(l), _) => (l.to_string(), true),
                (None, Some(l)) => (l.to_string(), false),
                (None, None) => {
                    notes.push(format!(
                        "pod set {name}: no topology request (Kueue places it without one)"
                    ));
                    continue;
                }
            };
            let spec: k8s_openapi::api::core::v1::PodSpec =
                match serde_json::from_value(at(ps, "/template/spec").clone()) {
                    Ok(s) => s,
                    Err(e) => {
                        notes.push(format!(
                            "pod set {name}: its pod template does not read: {e}"
                        ));
                        continue;
                    }
                };
            let pod = Pod {
                spec: Some(spec.clone()),
                ..Pod::default()
            };
            let mut requests = pod_requests(&pod);
            requests.remove(PODS);
            let base = Gang {
                node_selector: spec.node_selector.clone().unwrap_or_default(),
                tolerations: tolerations(&spec),
                ..Gang::new(count, requests)
            };
            if flavors.is_empty() {
                out.push(PodSetGang {
                    pod_set: name.clone(),
                    flavor: None,
                    level: level.clone(),
                    required,
                    gang: base.clone(),
                });
            }
            for f in flavors {
                let mut gang = base.clone();
                gang.node_selector
                    .extend(f.node_labels.iter().map(|(k, v)| (k.clone(), v.clone())));
                gang.tolerations.extend(f.tolerations.iter().cloned());
                out.push(PodSetGang {
                    pod_set: name.clone(),
                    flavor: Some(f.name.clone()),
                    level: level.clone(),
                    required,
                    gang,
                });
            }
        }
        (out, notes)
    }

    pub async fn run(client: &Client, ns: &str, name: &str, args: &FitArgs) -> Result<()> {
        let workload = get(client, "Workload", "workloads", Some(ns), name).await?;
        let mut notes = Vec::new();
        let flavors = match flavors(client, ns, &workload).await {
            Ok(f) => f,
            Err(why) => {
                notes.push(format!("{why}: the pod templates alone are counted"));
                Vec::new()
            }
        };
        let (gangs, more) = gangs(&workload, &flavors);
        notes.extend(more);
        let scheme = args.labels.scheme().map_err(Error::Config)?;
        let (nodes, bound) = cluster(client).await?;
        let mut text = String::new();
        let mut json = Vec::new();
        let mut nowhere = Vec::new();
        for g in &gangs {
            let answer = fit(&capacities(&nodes, &bound, &g.level, &scheme), &g.gang);
            let on = g
                .flavor
                .as_deref()
                .map(|f| format!(" on flavor {f}"))
                .unwrap_or_default();
            let want = if g.required { "requires" } else { "prefers" };
            text.push_str(&format!(
                "workload {ns}/{name}, pod set {}{on}: {want} one {}\n",
                g.pod_set, g.level
            ));
            text.push_str(&answer.render(&g.level, args.misses));
            if g.required && answer.fits.is_empty() {
                nowhere.push(format!("{}{on}", g.pod_set));
            }
            let mut v = serde_json::to_value(&answer).map_err(|e| Error::Config(e.to_string()))?;
            if let Some(o) = v.as_object_mut() {
                o.insert("podSet".into(), g.pod_set.clone().into());
                o.insert("flavor".into(), g.flavor.clone().into());
                o.insert("level".into(), g.level.clone().into());
                o.insert("required".into(), g.required.into());
                if let Some(m) = o.get_mut("misses").and_then(|m| m.as_array_mut()) {
                    m.truncate(args.misses);
                }
            }
            json.push(v);
        }
        for n in &notes {
            text.push_str(&format!("note: {n}\n"));
        }
        let out = match args.output.format {
            OutputFormat::Table => text,
            OutputFormat::Json => json_text(&serde_json::json!({
                "workload": format!("{ns}/{name}"),
                "podSets": json,
                "notes": notes,
            }))?,
        };
        std::io::stdout().write_all(out.as_bytes())?;
        if gangs.is_empty() {
            return Err(Error::Config(format!(
                "workload {ns}/{name} has no pod set with a topology request"
            )));
        }
        if !nowhere.is_empty() {
            return Err(Error::Config(format!(
                "workload {ns}/{name}: no domain takes pod set {} whole now",
                nowhere.join(", ")
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fit_reads_requests_selectors_and_tolerations_and_refuses_bad_ones() {
        use crate::cmd::{Cli, Command};
        use clap::Parser;
        let cli = Cli::try_parse_from([
            "x",
            "fit",
            "--pods",
            "4",
            "--requests",
            "nvidia.com/gpu=8, cpu=500m",
            "--level",
            "topology.k8s.aws/network-node-layer-3",
            "--node-selector",
            "pool=gpu",
            "--tolerations",
            "nvidia.com/gpu:NoSchedule,dedicated=train,:NoExecute",
        ]);
        let Ok(Cli {
            command: Command::Fit(f),
            ..
        }) = cli
        else {
            panic!("not parsed: {cli:?}");
        };
        assert_eq!(f.requests.0.get("nvidia.com/gpu"), Some(&8_000));
        assert_eq!(f.requests.0.get("cpu"), Some(&500));
        assert_eq!(
            f.node_selector.0.get("pool").map(String::as_str),
            Some("gpu")
        );
        assert_eq!(f.tolerations.len(), 3);
        assert_eq!(f.tolerations[0].operator.as_deref(), Some("Exists"));
        assert_eq!(f.tolerations[1].value.as_deref(), Some("train"));
        assert_eq!(f.tolerations[2].key, None);
        assert_eq!(f.misses, 5);
        assert_eq!(f.pods, Some(4));
        let w = Cli::try_parse_from(["x", "fit", "--workload", "ml/train-1"]);
        assert!(
            matches!(&w, Ok(Cli { command: Command::Fit(f), .. }) if f.workload == Some(("ml".into(), "train-1".into()))),
            "{w:?}"
        );
        for refused in [
            vec!["x", "fit", "--workload", "ml/train-1", "--pods", "2"],
            vec!["x", "fit", "--workload", "train-1"],
            vec!["x", "fit", "--pods", "2"],
        ] {
            assert!(Cli::try_parse_from(&refused).is_err(), "{refused:?}");
        }
        for (flag, value, says) in [
            (
                "--requests",
                "nvidia.com/gpu=eight",
                "not a Kubernetes quantity",
            ),
            ("--requests", "cpu=-1", "not negative"),
            ("--requests", "cpu=1,cpu=2", "given twice"),
            ("--requests", "pods=1", "pod slot"),
            ("--requests", "cpu", "RESOURCE=QUANTITY"),
            ("--level", "Not A Label", "not a label key"),
            ("--node-selector", "pool", "KEY=VALUE"),
            ("--tolerations", "gpu:NoWay", "the effect is"),
            ("--tolerations", "=v", "a value needs a key"),
            ("--pods", "0", "out of range"),
        ] {
            let mut args = vec!["x", "fit"];
            for (f, v) in [
                ("--pods", "1"),
                ("--level", "topology.k8s.aws/network-node-layer-3"),
            ] {
                if f != flag {
                    args.extend([f, v]);
                }
            }
            args.extend([flag, value]);
            let err = Cli::try_parse_from(args).map(drop).unwrap_err().to_string();
            assert!(err.contains(says), "{flag} {value}: {err}");
        }
    }

    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": spec,
        }))
        .unwrap_or_default()
    }

    fn c(name: &str, cpu: &str, gpu: &str) -> serde_json::Value {
        serde_json::json!({"name": name, "resources": {"requests": {"cpu": cpu, "nvidia.com/gpu": gpu}}})
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn an_ultraserver_split_across_two_leaves_is_two_domains_and_a_network_node_is_its_id() {
        let scheme = LabelScheme::default();
        let block = crate::labels::CAPACITY_BLOCK_KEY;
        let layer = |n| scheme.layer_key(n);
        let on = |leaf: &str, clique: &str| {
            labels(&[
                (&layer(1), "nn-top"),
                (&layer(2), "nn-spine"),
                (&layer(3), leaf),
                (block, "cb-1"),
                (CLIQUE_LABEL, clique),
            ])
        };
        let (a, b) = (on("nn-leaf-a", "uuid.1"), on("nn-leaf-b", "uuid.1"));
        // The capacity block under each leaf: two domains, each named by its leaf.
        assert_eq!(
            domain(&scheme, block, &a).as_deref(),
            Some("nn-leaf-a/cb-1")
        );
        assert_eq!(
            domain(&scheme, block, &b).as_deref(),
            Some("nn-leaf-b/cb-1")
        );
        // The clique by its leaf and capacity block.
        assert_eq!(
            domain(&scheme, CLIQUE_LABEL, &a).as_deref(),
            Some("nn-leaf-a/cb-1/uuid.1")
        );
        // A network node is its ID, whatever is above it; a key it lacks, no domain.
        assert_eq!(domain(&scheme, &layer(3), &a).as_deref(), Some("nn-leaf-a"));
        assert_eq!(domain(&scheme, &layer(4), &a), None);
        // Without network labels, the capacity block alone.
        assert_eq!(
            domain(&scheme, block, &labels(&[(block, "cb-1")])).as_deref(),
            Some("cb-1")
        );
        // The HyperPod preset's block key.
        let hyperpod = crate::flags::LabelArgs {
            label_preset: crate::flags::scheme::LabelPreset::Hyperpod,
            ..default_label_args()
        }
        .scheme()
        .unwrap_or_else(|e| panic!("the HyperPod preset's scheme: {e}"));
        if let Some(key) = hyperpod.capacity_block_key.clone() {
            let mut c = a.clone();
            c.remove(block);
            c.insert(key.clone(), "us-1".into());
            assert_eq!(
                domain(&hyperpod, &key, &c).as_deref(),
                Some("nn-leaf-a/us-1")
            );
        } else {
            panic!("the HyperPod preset has no capacity block key");
        }
    }

    #[test]
    fn a_gang_that_fits_only_across_a_split_ultraserver_does_not_fit_in_one() {
        let scheme = LabelScheme::default();
        let block = crate::labels::CAPACITY_BLOCK_KEY;
        let node = |name: &str, leaf: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {
                    scheme.layer_key(1): "nn-top", scheme.layer_key(2): "nn-spine",
                    scheme.layer_key(3): leaf, block: "cb-1",
                }},
                "status": {
                    "allocatable": {"nvidia.com/gpu": "4", "pods": "110"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }))
            .unwrap_or_default()
        };
        // Two nodes of cb-1 under each of two leaves: 8 GPUs a leaf, 16 in the block.
        let nodes = [
            node("a1", "nn-leaf-a"),
            node("a2", "nn-leaf-a"),
            node("b1", "nn-leaf-b"),
            node("b2", "nn-leaf-b"),
        ];
        let gpus = |n: u64| Gang::new(n, BTreeMap::from([("nvidia.com/gpu".into(), 4_000)]));
        let caps = capacities(&nodes, &[], block, &scheme);
        assert!(
            fit(&caps, &gpus(4)).fits.is_empty(),
            "4 pods of 4 GPUs span both leaves"
        );
        assert!(
            !fit(&caps, &gpus(2)).fits.is_empty(),
            "2 pods fit under one leaf"
        );
    }

    pub(super) fn default_label_args() -> crate::flags::LabelArgs {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            labels: crate::flags::LabelArgs,
        }
        <Only as clap::Parser>::try_parse_from(["x"])
            .map(|o| o.labels)
            .unwrap_or_else(|e| panic!("the label flags' defaults parse: {e}"))
    }

    #[test]
    fn a_pod_takes_its_containers_or_its_largest_init_container_and_its_sidecars() {
        let p = pod(serde_json::json!({
            "nodeName": "n1",
            "containers": [c("a", "1", "4"), c("b", "500m", "4")],
            "initContainers": [
                c("setup", "4", "0"),
                {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}},
                c("late", "1", "1"),
            ],
            "overhead": {"cpu": "100m"},
        }));
        let r = pod_requests(&p);
        // cpu: max(1.5 + 0.25 sidecar, 4 setup, 1 + 0.25 late) + 0.1 overhead.
        assert_eq!(r.get("cpu"), Some(&4_100));
        assert_eq!(r.get("nvidia.com/gpu"), Some(&8_000));
        assert_eq!(r.get(PODS), Some(&1_000));
    }

    fn node(json: serde_json::Value) -> Node {
        serde_json::from_value(json).unwrap_or_default()
    }

    #[test]
    fn only_ready_uncordoned_nodes_take_pods() {
        let ready = serde_json::json!({"conditions": [{"type": "Ready", "status": "True"}]});
        let not_ready = serde_json::json!({"conditions": [{"type": "Ready", "status": "False"}]});
        let base = |spec: serde_json::Value, status: serde_json::Value| {
            node(serde_json::json!({"metadata": {"name": "n"}, "spec": spec, "status": status}))
        };
        assert!(schedulable(&base(serde_json::json!({}), ready.clone())));
        assert!(!schedulable(&base(serde_json::json!({}), not_ready)));
        assert!(!schedulable(&base(
            serde_json::json!({}),
            serde_json::json!({})
        )));
        assert!(!schedulable(&base(
            serde_json::json!({"unschedulable": true}),
            ready.clone()
        )));
        let tainted = base(
            serde_json::json!({"taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]}),
            ready,
        );
        assert!(schedulable(&tainted), "taints are the gang's to tolerate");
        assert_eq!(
            taints(&tainted),
            [Taint {
                key: "k".into(),
                value: Some("v".into()),
                effect: "NoSchedule".into()
            }]
        );
    }

    #[test]
    fn finished_pods_free_their_node_and_unbound_pods_take_nothing() {
        let n = node(serde_json::json!({
            "metadata": {"name": "n1", "labels": {"level": "d1"}},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }));
        let mut done = pod(serde_json::json!({"nodeName": "n1", "containers": [c("a", "1", "8")]}));
        done.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        let running = pod(serde_json::json!({"nodeName": "n1", "containers": [c("a", "1", "2")]}));
        let pending = pod(serde_json::json!({"containers": [c("a", "1", "8")]}));
        let caps = capacities(
            &[n],
            &[done, running, pending],
            "level",
            &LabelScheme::default(),
        );
        assert_eq!(caps[0].domain.as_deref(), Some("d1"));
        assert_eq!(caps[0].free("nvidia.com/gpu"), 6_000);
        assert_eq!(caps[0].free(PODS), 109_000);
    }

    #[test]
    fn a_workloads_pod_sets_become_gangs_on_each_topology_aware_flavor() {
        let flavor = workload::Flavor::of(&serde_json::json!({
            "metadata": {"name": "p5"},
            "spec": {
                "topologyName": "aws-network",
                "nodeLabels": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            },
        }));
        assert!(
            workload::Flavor::of(&serde_json::json!({"metadata": {"name": "plain"}, "spec": {}}))
                .is_none(),
            "a flavor without a Topology is not topology-aware"
        );
        let flavor = flavor.expect("topology-aware");
        let wl = serde_json::json!({"spec": {"podSets": [
            {"name": "workers", "count": 16,
             "topologyRequest": {"required": "topology.k8s.aws/network-node-layer-3"},
             "template": {"spec": {
                 "nodeSelector": {"pool": "train"},
                 "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
                 "containers": [{"name": "w", "resources": {"requests": {"nvidia.com/gpu": "8", "cpu": "90"}}}]}}},
            {"name": "launcher", "count": 1,
             "topologyRequest": {"preferred": "topology.k8s.aws/network-node-layer-2"},
             "template": {"spec": {"containers": [{"name": "l", "resources": {"requests": {"cpu": "1"}}}]}}},
            {"name": "free", "count": 2,
             "template": {"spec": {"containers": [{"name": "f"}]}}},
        ]}});
        let (gangs, notes) = workload::gangs(&wl, std::slice::from_ref(&flavor));
        assert_eq!(gangs.len(), 2);
        let w = &gangs[0];
        assert_eq!(
            (w.pod_set.as_str(), w.flavor.as_deref(), w.required),
            ("workers", Some("p5"), true)
        );
        assert_eq!(w.level, "topology.k8s.aws/network-node-layer-3");
        assert_eq!(w.gang.pods, 16);
        assert_eq!(w.gang.requests.get("nvidia.com/gpu"), Some(&8_000));
        assert_eq!(
            w.gang.requests.get(PODS),
            None,
            "a pod slot is not a request"
        );
        assert_eq!(
            w.gang.node_selector,
            BTreeMap::from([
                (
                    "node.kubernetes.io/instance-type".to_string(),
                    "p5.48xlarge".to_string()
                ),
                ("pool".to_string(), "train".to_string()),
            ]),
            "the template's selector and the flavor's node labels"
        );
        assert_eq!(
            w.gang.tolerations.len(),
            2,
            "the template's and the flavor's"
        );
        assert!(!gangs[1].required, "preferred");
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].contains("pod set free: no topology request"),
            "{notes:?}"
        );
        let (alone, _) = workload::gangs(&wl, &[]);
        assert_eq!(alone[0].flavor, None);
        assert_eq!(alone[0].gang.node_selector.len(), 1, "the template's alone");
    }
}

//! Volcano's own scheduler and controllers (v1.14.1, built from `volcano.sh/volcano`) place
//! gangs with `networkTopology: {mode: hard, highestTierAllowed: N}` on HyperNodes that come
//! from our labels — ours (`--volcano-hypernodes`), or Volcano's label discovery configured from
//! docs/schedulers.md with ours off — and what each way makes of a mixed 3-/4-layer fleet.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use anyhow::{Context, ensure};
use e2e::{
    env::{Env, WAIT},
    kube_util::{self, eventually},
    schedulers::{VOLCANO_NAMESPACE, Volcano},
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    },
};
use serde_json::Value;

use super::gangs::{self, Fleet, POD_CPU, POOL};

const JOB_LABEL: &str = "volcano.sh/job-name";
const SOURCE_LABEL: &str = "volcano.sh/network-topology-source";
const OURS_LABEL: &str = "app.kubernetes.io/managed-by=ec2-topology-labeler";
/// How long a gang that cannot be placed is watched after Volcano reported it unschedulable:
/// several scheduling periods (1 s here).
const PENDING_WATCH: Duration = Duration::from_secs(5);

fn api(
    c: &Client,
    ns: Option<&str>,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    match ns {
        Some(ns) => Api::namespaced_with(c.clone(), ns, &ar),
        None => Api::all_with(c.clone(), &ar),
    }
}

fn hypernodes(c: &Client) -> Api<DynamicObject> {
    api(
        c,
        None,
        "topology.volcano.sh",
        "v1alpha1",
        "HyperNode",
        "hypernodes",
    )
}

/// The value under `key` of the ConfigMap `name` as docs/schedulers.md shows it (the first one).
fn doc_configmap(name: &str) -> anyhow::Result<Value> {
    gangs::doc_objects_named("ConfigMap", name)?
        .into_iter()
        .next()
        .context("no ConfigMap")
}

/// Volcano started with the scheduler configuration of docs/schedulers.md.
async fn start_volcano(env: &Env, c: &Client, name: &str) -> anyhow::Result<Volcano> {
    let conf = doc_configmap("volcano-scheduler-configmap")?;
    let conf = conf["data"]["volcano-scheduler.conf"]
        .as_str()
        .context("volcano-scheduler.conf in the doc's ConfigMap")?;
    ensure!(
        conf.contains("network-topology-aware"),
        "the doc's scheduler configuration enables the network-topology-aware plugin"
    );
    let bin = e2e::schedulers::volcano_artifacts()?;
    Volcano::start(
        &bin,
        &env.cluster.admin_kubeconfig,
        &env.dir.join(name),
        c,
        conf,
    )
    .await
}

/// A Volcano Job of `replicas` pods of one node each, on `pool`, requiring one domain of tier
/// `tier` or lower. Fields Volcano's admission webhook would default (queue, task minAvailable)
/// are set here: no webhook runs.
fn job(ns: &str, name: &str, pool: &str, replicas: u32, tier: u32) -> String {
    format!(
        r#"apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {{ name: {name}, namespace: {ns} }}
spec:
  schedulerName: volcano
  queue: default
  minAvailable: {replicas}
  networkTopology: {{ mode: hard, highestTierAllowed: {tier} }}
  tasks:
    - name: worker
      replicas: {replicas}
      minAvailable: {replicas}
      template:
        spec:
          restartPolicy: Never
          nodeSelector: {{ {POOL}: {pool} }}
          containers:
            - name: w
              image: registry.k8s.io/pause:3.10
              resources: {{ requests: {{ cpu: "{POD_CPU}" }} }}
"#
    )
}

/// The PodGroup Volcano's job controller made for job `name`.
async fn podgroup_of(c: &Client, ns: &str, name: &str) -> anyhow::Result<Option<DynamicObject>> {
    let pgs = api(
        c,
        Some(ns),
        "scheduling.volcano.sh",
        "v1beta1",
        "PodGroup",
        "podgroups",
    );
    Ok(pgs
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .find(|pg| {
            pg.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "Job" && o.name == name)
        }))
}

/// Stop Volcano and hand back `result`, an error with `context` (if any) and the tails of
/// Volcano's logs.
fn stopped<T>(mut volcano: Volcano, result: anyhow::Result<T>, context: &str) -> anyhow::Result<T> {
    volcano.stop();
    result.map_err(|e| {
        let context = if context.is_empty() {
            String::new()
        } else {
            format!("{context}\n")
        };
        anyhow::anyhow!("{e:#}\n{context}{}", volcano.log_tails(20))
    })
}

/// Submit job `name` and wait until all its pods are bound; returns their nodes.
async fn placed(
    c: &Client,
    ns: &str,
    name: &str,
    pool: &str,
    replicas: u32,
    tier: u32,
) -> anyhow::Result<BTreeSet<String>> {
    kube_util::apply_yaml(c, &job(ns, name, pool, replicas, tier), "e2e").await?;
    gangs::wait_bound(
        c,
        ns,
        &format!("{JOB_LABEL}={name}"),
        replicas as usize,
        Duration::from_secs(60),
    )
    .await
    .with_context(|| format!("Volcano places job {name}"))
}

/// Submit job `name`, wait until Volcano says it cannot be placed (the PodGroup's Unschedulable
/// condition), check that no pod of it gets a node over several more scheduling periods, then
/// delete it. Returns Volcano's message.
async fn stays_pending(
    c: &Client,
    ns: &str,
    name: &str,
    pool: &str,
    replicas: u32,
    tier: u32,
) -> anyhow::Result<String> {
    kube_util::apply_yaml(c, &job(ns, name, pool, replicas, tier), "e2e").await?;
    let selector = format!("{JOB_LABEL}={name}");
    let message = eventually(
        &format!("Volcano reports job {name} unschedulable"),
        Duration::from_secs(60),
        || async {
            gangs::none_bound(c, ns, &selector).await?;
            let Some(pg) = podgroup_of(c, ns, name).await? else {
                return Ok(None);
            };
            Ok(pg.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|cond| cond["type"] == "Unschedulable" && cond["status"] == "True")
                .map(|cond| cond["message"].as_str().unwrap_or_default().to_string()))
        },
    )
    .await?;
    tokio::time::sleep(PENDING_WATCH).await;
    gangs::none_bound(c, ns, &selector)
        .await
        .with_context(|| format!("job {name} spread"))?;
    delete_job(c, ns, name).await?;
    Ok(message)
}

/// Delete job `name`, its PodGroup and its pods (no garbage collector runs here).
async fn delete_job(c: &Client, ns: &str, name: &str) -> anyhow::Result<()> {
    let jobs = api(c, Some(ns), "batch.volcano.sh", "v1alpha1", "Job", "jobs");
    jobs.delete(name, &DeleteParams::default()).await?;
    if let Some(pg) = podgroup_of(c, ns, name).await? {
        let pgs = api(
            c,
            Some(ns),
            "scheduling.volcano.sh",
            "v1beta1",
            "PodGroup",
            "podgroups",
        );
        pgs.delete(
            &pg.metadata.name.unwrap_or_default(),
            &DeleteParams::default(),
        )
        .await?;
    }
    gangs::force_delete_pods(c, ns, &format!("{JOB_LABEL}={name}")).await
}

/// Free nodes of `fleet` now: not holding a bound pod of `ns`.
async fn free_nodes(c: &Client, ns: &str, fleet: &Fleet) -> anyhow::Result<BTreeSet<String>> {
    let used: BTreeSet<String> = gangs::bindings(c, ns, "")
        .await?
        .into_values()
        .flatten()
        .collect();
    Ok(fleet.names().difference(&used).cloned().collect())
}

/// The 3-layer fleet both ways are tried on. Under spine `s`: block `a1` with switch `l11`
/// (4 nodes, 2 of them busy) and `l12` (2 nodes); block `a2` with `l21` (3 nodes) and `l22`
/// (1 node). Free: 2 + 2 under `a1`, 3 + 1 under `a2`.
async fn three_layer_fleet(
    env: &Env,
    c: &Client,
    tag: &str,
    prefix: u32,
    ns: &str,
) -> anyhow::Result<Fleet> {
    let id = |n: &str| format!("nn-{tag}-{n}");
    let (s, a1, a2) = (id("s"), id("a1"), id("a2"));
    let (l11, l12, l21, l22) = (id("l11"), id("l12"), id("l21"), id("l22"));
    let fleet = Fleet::create(
        env,
        c,
        ns,
        prefix,
        &[
            ("p5.48xlarge", &[&s, &a1, &l11], 4),
            ("p5.48xlarge", &[&s, &a1, &l12], 2),
            ("p5.48xlarge", &[&s, &a2, &l21], 3),
            ("p5.48xlarge", &[&s, &a2, &l22], 1),
        ],
    )
    .await?;
    gangs::workload_namespace(env, c, ns).await?;
    for node in fleet.under(&l11).iter().take(2) {
        gangs::busy(c, ns, node).await?;
    }
    Ok(fleet)
}

/// The gangs both ways must place alike on [`three_layer_fleet`]; returns what happened, for
/// the log.
async fn gangs_keep_to_one_domain(
    c: &Client,
    ns: &str,
    tag: &str,
    fleet: &Fleet,
) -> anyhow::Result<Vec<String>> {
    let mut seen = Vec::new();
    let pool = &fleet.pool;
    // Tier 1, 3 pods: 6 free nodes on four switches, but only l21 has 3.
    let free = free_nodes(c, ns, fleet).await?;
    ensure!(
        free.len() == 8,
        "8 free nodes before the first gang: {free:?}"
    );
    let nodes = placed(c, ns, "one-switch", pool, 3, 1).await?;
    let switch = fleet.common_domain(&nodes, 1)?;
    ensure!(
        switch == format!("nn-{tag}-l21"),
        "3 pods under {switch}, not the only switch with room"
    );
    seen.push(format!(
        "3 pods, tier 1 -> all under {switch}: {:?}",
        Fleet::short(&nodes)
    ));
    // Tier 1, 3 more pods: 5 free nodes (2 + 2 + 1) but no switch with 3.
    let free = free_nodes(c, ns, fleet).await?;
    ensure!(free.len() == 5, "5 free nodes: {free:?}");
    let why = stays_pending(c, ns, "no-switch", pool, 3, 1).await?;
    seen.push(format!(
        "3 more pods, tier 1, 5 nodes free on 3 switches -> pending: {why}"
    ));
    // Tier 2, 5 pods: 5 free nodes, 4 under a1 and 1 under a2.
    let why = stays_pending(c, ns, "no-block", pool, 5, 2).await?;
    seen.push(format!(
        "5 pods, tier 2, 4 + 1 free under two layer-2 nodes -> pending: {why}"
    ));
    // Tier 2, 4 pods: exactly the free nodes under a1, across its two switches.
    let nodes = placed(c, ns, "one-block", pool, 4, 2).await?;
    let block = fleet.common_domain(&nodes, 2)?;
    ensure!(block == format!("nn-{tag}-a1"), "4 pods under {block}");
    ensure!(
        nodes
            .iter()
            .map(|n| fleet.domain(n, 1))
            .collect::<BTreeSet<_>>()
            .len()
            == 2,
        "the tier-2 gang uses both switches of {block}: {nodes:?}"
    );
    seen.push(format!(
        "4 pods, tier 2 -> all under {block} (two switches): {:?}",
        Fleet::short(&nodes)
    ));
    for name in ["one-switch", "one-block"] {
        delete_job(c, ns, name).await?;
    }
    gangs::force_delete_pods(c, ns, "e2e-busy=true").await?;
    Ok(seen)
}

/// Way 1: our HyperNodes (the e2e controller runs with `--volcano-hypernodes=true`).
pub async fn volcano_places_gangs_on_our_hypernodes(env: &Env) -> anyhow::Result<()> {
    const NS: &str = "volcano-ours";
    let c = env.admin().await?;
    let fleet = three_layer_fleet(env, &c, "vo", 0x120, NS).await?;
    // Our tree for this fleet, before Volcano looks at it.
    eventually("our HyperNodes for the fleet", WAIT, || async {
        let names: BTreeSet<String> = hypernodes(&c)
            .list(&ListParams::default().labels(OURS_LABEL))
            .await?
            .items
            .into_iter()
            .filter_map(|h| h.metadata.name)
            .collect();
        let want = [
            "ec2tl-t1-nn-vo-l11",
            "ec2tl-t1-nn-vo-l21",
            "ec2tl-t2-nn-vo-a1",
            "ec2tl-t2-nn-vo-a2",
            "ec2tl-t3-nn-vo-s",
        ];
        Ok(want.iter().all(|w| names.contains(*w)).then_some(()))
    })
    .await?;
    let volcano = start_volcano(env, &c, "volcano-ours").await?;
    let result = gangs_keep_to_one_domain(&c, NS, "vo", &fleet).await;
    let seen = stopped(volcano, result, "")?;
    for line in seen {
        eprintln!("    our HyperNodes: {line}");
    }
    fleet.delete(&c).await
}

/// HyperNodes Volcano's label discovery made (by its source label).
async fn discovered(c: &Client) -> anyhow::Result<Vec<DynamicObject>> {
    Ok(hypernodes(c)
        .list(&ListParams::default().labels(&format!("{SOURCE_LABEL}=label")))
        .await?
        .items)
}

/// Volcano v1.14.1's label discovery can make two HyperNodes for one label value: a second
/// discovery pass right after the first (node events at start, a configuration change) names
/// HyperNodes from an informer cache that has not seen the first pass's yet. Both list the same
/// children, the scheduler refuses the second parent ("already has a parent") and places no gang
/// with a `networkTopology` until the next rediscovery, which only a node's labels changing or a
/// HyperNode being deleted starts. Wait until each label value has one HyperNode; if a duplicate
/// lasts 3 s, delete the newer one (as an operator would; its deletion starts a rediscovery).
/// Returns the HyperNodes deleted so.
async fn settle_discovery(c: &Client) -> anyhow::Result<Vec<String>> {
    let mut deleted = Vec::new();
    let mut duplicate_since: Option<std::time::Instant> = None;
    // When deleting the newer duplicates keeps starting rediscoveries that race again (a few
    // hundred nodes in the cluster), start over: every discovered HyperNode deleted at once,
    // so the next pass starts from an empty cache.
    let mut racing_since: Option<std::time::Instant> = None;
    let mut clean_checks = 0;
    // A rediscovery of a few hundred nodes can race itself again: give it time to settle.
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let mut by_value: BTreeMap<(i64, BTreeMap<String, String>), Vec<DynamicObject>> =
            BTreeMap::new();
        for h in discovered(c).await? {
            let mut labels = h.metadata.labels.clone().unwrap_or_default();
            labels.remove(SOURCE_LABEL);
            let tier = h.data["spec"]["tier"].as_i64().unwrap_or(0);
            by_value
                .entry((tier, labels.into_iter().collect()))
                .or_default()
                .push(h);
        }
        let mut duplicates: Vec<Vec<DynamicObject>> =
            by_value.into_values().filter(|hs| hs.len() > 1).collect();
        if duplicates.is_empty() {
            duplicate_since = None;
            racing_since = None;
            clean_checks += 1;
            if clean_checks >= 3 {
                return Ok(deleted);
            }
        } else {
            clean_checks = 0;
            let racing = *racing_since.get_or_insert_with(std::time::Instant::now);
            if racing.elapsed() >= Duration::from_secs(45) {
                hypernodes(c)
                    .delete_collection(
                        &DeleteParams::default(),
                        &ListParams::default().labels(&format!("{SOURCE_LABEL}=label")),
                    )
                    .await?;
                deleted.push("(every discovered HyperNode)".to_string());
                racing_since = None;
                duplicate_since = None;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            let since = *duplicate_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() >= Duration::from_secs(3) {
                for hs in &mut duplicates {
                    hs.sort_by_key(|h| h.metadata.creation_timestamp.clone().map(|t| t.0));
                    for h in hs.iter().skip(1) {
                        let name = h.metadata.name.clone().unwrap_or_default();
                        // Volcano's own rediscovery may have removed it meanwhile.
                        match hypernodes(c).delete(&name, &DeleteParams::default()).await {
                            Ok(_) => deleted.push(name),
                            Err(kube::Error::Api(e)) if e.code == 404 => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
                duplicate_since = None;
            }
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "Volcano's discovered HyperNodes did not settle: duplicates {:?}",
            duplicates
                .iter()
                .map(|hs| hs
                    .iter()
                    .filter_map(|h| h.metadata.name.clone())
                    .collect::<Vec<_>>())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Switch to Volcano's label discovery: our HyperNodes off and deleted, the doc's controller
/// ConfigMap applied as written (with `conf` replacing its configuration when given).
async fn use_label_discovery(env: &Env, c: &Client, conf: Option<&str>) -> anyhow::Result<()> {
    e2e::env::restart_labeler_with(env, &["--volcano-hypernodes=false"]).await?;
    hypernodes(c)
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(OURS_LABEL),
        )
        .await?;
    kube_util::ensure_namespace(c, VOLCANO_NAMESPACE).await?;
    let mut cm = doc_configmap("volcano-controller-configmap")?;
    if let Some(conf) = conf {
        cm["data"]["volcano-controller.conf"] = conf.into();
    }
    kube_util::apply_yaml(c, &serde_json::to_string(&cm)?, "e2e").await?;
    Ok(())
}

/// Back to the usual set-up: the controller ConfigMap and the discovered HyperNodes gone, our
/// HyperNodes on again.
async fn stop_label_discovery(env: &Env, c: &Client) -> anyhow::Result<()> {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(c.clone(), VOLCANO_NAMESPACE);
    if cms.get_opt("volcano-controller-configmap").await?.is_some() {
        cms.delete("volcano-controller-configmap", &DeleteParams::default())
            .await?;
    }
    hypernodes(c)
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("{SOURCE_LABEL}=label")),
        )
        .await?;
    e2e::env::restart_labeler_with(env, &[]).await
}

/// The doc's values for Volcano's Helm chart, rendered by that chart (the pinned module's),
/// give the same configurations as the doc's two ConfigMaps.
fn doc_helm_values_render_the_doc_configmaps(env: &Env) -> anyhow::Result<()> {
    let values = gangs::doc_yaml()?
        .into_iter()
        .find(|d| d["custom"]["controller_config_override"].is_object())
        .context("docs/schedulers.md shows Volcano's Helm values")?;
    let file = env.dir.join("volcano-values.yaml");
    std::fs::write(&file, serde_json::to_string(&values)?)?;
    let chart = e2e::schedulers::volcano_artifacts()?.join("chart");
    let rendered = e2e::helm::helm(
        None,
        &[
            "template",
            "volcano",
            chart.to_str().unwrap_or_default(),
            "--namespace",
            VOLCANO_NAMESPACE,
            "-f",
            file.to_str().unwrap_or_default(),
        ],
    )?;
    let rendered: Vec<Value> = serde_saphyr::from_multiple(&rendered)?;
    for (name, key) in [
        ("volcano-scheduler-configmap", "volcano-scheduler.conf"),
        ("volcano-controller-configmap", "volcano-controller.conf"),
    ] {
        let conf = |cm: &Value| -> anyhow::Result<Value> {
            let text = cm["data"][key]
                .as_str()
                .with_context(|| format!("{name} has {key}"))?;
            serde_saphyr::from_str(text).with_context(|| format!("{key} of {name} parses:\n{text}"))
        };
        let chart_cm = rendered
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == name)
            .with_context(|| format!("the chart renders {name}"))?;
        let (from_chart, from_doc) = (conf(chart_cm)?, conf(&doc_configmap(name)?)?);
        ensure!(
            from_chart == from_doc,
            "{name}: the chart renders {from_chart} from the doc's values, the doc's ConfigMap says {from_doc}"
        );
    }
    Ok(())
}

/// Way 2: Volcano's label discovery, configured from the doc, our HyperNodes off.
pub async fn volcano_places_gangs_by_its_label_discovery(env: &Env) -> anyhow::Result<()> {
    const NS: &str = "volcano-labels";
    doc_helm_values_render_the_doc_configmaps(env)?;
    let c = env.admin().await?;
    let fleet = three_layer_fleet(env, &c, "vl", 0x121, NS).await?;
    use_label_discovery(env, &c, None).await?;
    let result = async {
        let volcano = start_volcano(env, &c, "volcano-labels").await?;
        let result = async {
            // Discovery's tier 1 for this fleet: one HyperNode per switch, listing its nodes.
            let switch_names = || async {
                let found: BTreeMap<String, Vec<String>> =
                    discovered(&c)
                        .await?
                        .into_iter()
                        .fold(BTreeMap::new(), |mut m, h| {
                            let value = h
                                .metadata
                                .labels
                                .as_ref()
                                .and_then(|l| l.get(&format!("{}3", e2e::env::L)).cloned());
                            if let (Some(v), Some(n)) = (value, h.metadata.name.clone()) {
                                m.entry(v).or_insert_with(Vec::new).push(n);
                            }
                            m
                        });
                anyhow::Ok(found)
            };
            let want = ["l11", "l12", "l21", "l22"].map(|l| format!("nn-vl-{l}"));
            eventually(
                "Volcano's HyperNodes for the fleet's switches",
                WAIT,
                || async {
                    let found = switch_names().await?;
                    Ok(want.iter().all(|w| found.contains_key(w)).then_some(()))
                },
            )
            .await?;
            let repaired = settle_discovery(&c).await?;
            let switches: BTreeMap<String, Vec<String>> = switch_names()
                .await?
                .into_iter()
                .filter(|(v, _)| want.contains(v))
                .collect();
            ensure!(
                want.iter()
                    .all(|w| switches.get(w).is_some_and(|n| n.len() == 1)),
                "one HyperNode per switch: {switches:?}"
            );
            ensure!(
                !hypernodes(&c)
                    .list(&ListParams::default().labels(OURS_LABEL))
                    .await?
                    .items
                    .iter()
                    .any(|h| {
                        h.metadata
                            .name
                            .as_deref()
                            .is_some_and(|n| n.contains("nn-vl"))
                    }),
                "our HyperNodes are off"
            );
            let seen = gangs_keep_to_one_domain(&c, NS, "vl", &fleet).await?;
            anyhow::Ok((switches, repaired, seen))
        }
        .await;
        stopped(volcano, result, "")
    }
    .await;
    stop_label_discovery(env, &c).await?;
    let (switches, repaired, seen) = result?;
    eprintln!("    label discovery named the switches: {switches:?}");
    if !repaired.is_empty() {
        eprintln!(
            "    Volcano's discovery made duplicate HyperNodes (a race in v1.14.1); deleted {repaired:?}"
        );
    }
    for line in seen {
        eprintln!("    label discovery: {line}");
    }
    fleet.delete(&c).await
}

/// Nodes under each HyperNode (resolving `exactMatch` and `labelMatch` node members and
/// HyperNode members), with its tier.
async fn resolved(
    c: &Client,
    hns: &[DynamicObject],
) -> anyhow::Result<BTreeMap<String, (i64, BTreeSet<String>)>> {
    let nodes: Vec<Node> = Api::<Node>::all(c.clone())
        .list(&Default::default())
        .await?
        .items;
    let by_name: BTreeMap<&str, &Value> = hns
        .iter()
        .filter_map(|h| Some((h.metadata.name.as_deref()?, &h.data["spec"])))
        .collect();
    fn members(
        name: &str,
        by_name: &BTreeMap<&str, &Value>,
        nodes: &[Node],
        depth: usize,
    ) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let Some(spec) = by_name.get(name) else {
            return out;
        };
        for m in spec["members"].as_array().into_iter().flatten() {
            let sel = &m["selector"];
            if m["type"] == "HyperNode" {
                if let Some(child) = sel["exactMatch"]["name"].as_str()
                    && depth < 16
                {
                    out.extend(members(child, by_name, nodes, depth + 1));
                }
                continue;
            }
            if let Some(n) = sel["exactMatch"]["name"].as_str() {
                out.insert(n.to_string());
            }
            let lm = &sel["labelMatch"];
            if lm.is_object() {
                for node in nodes {
                    let labels = node.metadata.labels.clone().unwrap_or_default();
                    let labels_ok = lm["matchLabels"]
                        .as_object()
                        .into_iter()
                        .flatten()
                        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
                    let absent_ok =
                        lm["matchExpressions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .all(|e| {
                                e["operator"] == "DoesNotExist"
                                    && !labels.contains_key(e["key"].as_str().unwrap_or_default())
                            });
                    if labels_ok && absent_ok {
                        out.insert(node.metadata.name.clone().unwrap_or_default());
                    }
                }
            }
        }
        out
    }
    Ok(by_name
        .iter()
        .map(|(name, spec)| {
            (
                name.to_string(),
                (
                    spec["tier"].as_i64().unwrap_or(0),
                    members(name, &by_name, &nodes, 0),
                ),
            )
        })
        .collect())
}

/// One way of making HyperNodes, as seen on the mixed fleet.
struct WayReport {
    way: &'static str,
    /// Fleet nodes under no HyperNode (Volcano's hard mode never uses them).
    left_out: BTreeSet<String>,
    /// Per tier: each HyperNode covering fleet nodes, as the network node it stands for.
    tiers: BTreeMap<i64, Vec<String>>,
    /// A HyperNode covering every fleet node (below Volcano's cluster-wide root), if any.
    whole_spine: Option<(i64, String)>,
    names: Vec<String>,
    tier_names: BTreeSet<String>,
    gangs: Vec<String>,
    /// Duplicate HyperNodes of Volcano's discovery deleted (see [`settle_discovery`]).
    repaired: Vec<String>,
}

/// Read the HyperNodes that cover `fleet`: what each stands for in our network terms.
async fn survey(
    c: &Client,
    way: &'static str,
    selector: &str,
    fleet: &Fleet,
) -> anyhow::Result<WayReport> {
    let hns: Vec<DynamicObject> = hypernodes(c)
        .list(&ListParams::default().labels(selector))
        .await?
        .items;
    let resolved = resolved(c, &hns).await?;
    let all = fleet.names();
    let mut report = WayReport {
        way,
        left_out: all.clone(),
        tiers: BTreeMap::new(),
        whole_spine: None,
        names: Vec::new(),
        tier_names: BTreeSet::new(),
        gangs: Vec::new(),
        repaired: Vec::new(),
    };
    for h in &hns {
        let name = h.metadata.name.clone().unwrap_or_default();
        let (tier, nodes) = &resolved[&name];
        let ours: BTreeSet<String> = nodes.intersection(&all).cloned().collect();
        if ours.is_empty() {
            continue;
        }
        for n in &ours {
            report.left_out.remove(n);
        }
        // The network node it stands for: the value its nodes share of the label its tierName
        // names (a node padded by --uniform-depth repeats its deepest network node).
        let key = h.data["spec"]["tierName"].as_str().unwrap_or_default();
        let layer: usize = key
            .strip_prefix(e2e::env::L)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let mut values = BTreeSet::new();
        let mut depths = BTreeSet::new();
        for (_, path) in fleet.nodes.iter().filter(|(s, _)| ours.contains(&s.name)) {
            values.insert(
                layer
                    .checked_sub(1)
                    .and_then(|i| path.get(i).or(path.last())),
            );
            depths.insert(path.len());
        }
        let stands_for = match values.iter().collect::<Vec<_>>()[..] {
            [Some(v)] => format!(
                "{v} (layer {layer} of {depths:?}-layer nodes, {} nodes)",
                ours.len()
            ),
            _ => format!("{key}: {values:?}"),
        };
        report.tiers.entry(*tier).or_default().push(stands_for);
        if ours == all {
            report.whole_spine = report
                .whole_spine
                .clone()
                .filter(|(t, _)| t <= tier)
                .or(Some((*tier, name.clone())));
        }
        report.names.push(name);
        if let Some(t) = h.data["spec"]["tierName"].as_str() {
            report.tier_names.insert(t.to_string());
        }
    }
    for v in report.tiers.values_mut() {
        v.sort();
    }
    report.names.sort();
    Ok(report)
}

/// What a gang on the mixed fleet must do.
enum Expect {
    Pending,
    /// Placed on nodes of exactly these depths, under this many switches (if given).
    Placed {
        depths: &'static [usize],
        switches: Option<usize>,
    },
}

/// Survey the HyperNodes of Volcano's label discovery once `ready` holds of them and any
/// duplicates are gone.
async fn survey_discovery(
    c: &Client,
    way: &'static str,
    fleet: &Fleet,
    ready: impl Fn(&WayReport) -> bool,
) -> anyhow::Result<WayReport> {
    let selector = format!("{SOURCE_LABEL}=label");
    let mut repaired = Vec::new();
    // Settling may start a rediscovery from scratch: survey again until it holds.
    for round in 0..3 {
        let seen = eventually(
            &format!("{way}: HyperNodes for the fleet"),
            WAIT,
            || async { Ok(ready(&survey(c, way, &selector, fleet).await?).then_some(())) },
        )
        .await;
        if let Err(e) = seen {
            // Volcano v1.14.1's discovery creates from a lister that can lag its own creates
            // (seen: "Failed to create HyperNode … already exists" while two rebuilds overlap,
            // the HyperNode left as the earlier rebuild made it) and does not retry: it rebuilds
            // only when a node's topology labels change or one of its HyperNodes is deleted.
            // Delete one to have it rebuild from the labels as they are; a wrong label fails
            // again.
            let first = discovered(c)
                .await?
                .into_iter()
                .find_map(|h| h.metadata.name);
            match first {
                Some(name) if round < 2 => {
                    eprintln!("    {e:#}; deleting {name} to have Volcano rebuild");
                    hypernodes(c)
                        .delete(&name, &DeleteParams::default())
                        .await?;
                    repaired.push(name);
                    continue;
                }
                _ => return Err(e),
            }
        }
        repaired.extend(settle_discovery(c).await?);
        let mut r = survey(c, way, &selector, fleet).await?;
        if ready(&r) {
            r.repaired = repaired;
            return Ok(r);
        }
    }
    let r = survey(c, way, &selector, fleet).await?;
    anyhow::bail!(
        "{way}: after settling, tiers {:?}, left out {:?}, the HyperNode over all {:?}",
        r.tiers,
        r.left_out,
        r.whole_spine
    )
}

/// Try a gang on the mixed fleet: where it lands, or that it stays pending.
async fn try_gang(
    c: &Client,
    ns: &str,
    fleet: &Fleet,
    (name, replicas, tier): (&str, u32, u32),
    expect: Expect,
) -> anyhow::Result<String> {
    let (want_depths, want_switches) = match expect {
        Expect::Pending => {
            let why = stays_pending(c, ns, name, &fleet.pool, replicas, tier).await?;
            return Ok(format!(
                "{replicas} pods, tier {tier}: pending ({})",
                why.chars().take(120).collect::<String>()
            ));
        }
        Expect::Placed { depths, switches } => (depths, switches),
    };
    let nodes = placed(c, ns, name, &fleet.pool, replicas, tier).await?;
    let switches: BTreeSet<&str> = nodes.iter().filter_map(|n| fleet.domain(n, 1)).collect();
    let depths: BTreeSet<usize> = fleet
        .nodes
        .iter()
        .filter(|(s, _)| nodes.contains(&s.name))
        .map(|(_, p)| p.len())
        .collect();
    let text = format!(
        "{replicas} pods, tier {tier}: placed on {} nodes of {depths:?}-layer types under switches {switches:?}",
        nodes.len()
    );
    ensure!(
        depths.iter().copied().eq(want_depths.iter().copied())
            && want_switches.is_none_or(|n| n == switches.len()),
        "{name}: {text}"
    );
    delete_job(c, ns, name).await?;
    Ok(text)
}

/// Both ways on a fleet of 3- and 4-layer nodes under one spine: which nodes each leaves out,
/// what a tier stands for, the names, and where gangs land. Spine `s`: 3-layer nodes under
/// `a3` (switch `l3a`: 2 nodes, `l3b`: 1); 4-layer nodes under `a4` / `r4` (switches `l4a`,
/// `l4b`: 2 nodes each).
pub async fn volcano_on_a_mixed_fleet_both_ways(env: &Env) -> anyhow::Result<()> {
    mixed_fleet(env, false).await
}

/// Volcano's label discovery on the same mixed fleet (the other half of the comparison in
/// docs/schedulers.md). Run last: Volcano v1.14.1's discovery races itself over the few hundred
/// nodes the rest of the suite leaves (one run created over 5,000 HyperNodes and never
/// settled), so the Nodes left by the other scenarios are deleted first and discovery sees the
/// mixed fleet alone, as in a cluster of those 7 nodes.
pub async fn volcano_label_discovery_on_a_mixed_fleet(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let nodes: Api<Node> = Api::all(c.clone());
    let left = nodes.list_metadata(&Default::default()).await?.items.len();
    nodes
        .delete_collection(&Default::default(), &Default::default())
        .await?;
    eventually("the suite's Nodes gone", WAIT, || async {
        Ok(nodes
            .list_metadata(&Default::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    eprintln!("    deleted the {left} Nodes the other scenarios left");
    mixed_fleet(env, true).await
}

async fn mixed_fleet(env: &Env, discovery: bool) -> anyhow::Result<()> {
    const NS: &str = "volcano-mixed";
    let c = env.admin().await?;
    let fleet = Fleet::create(
        env,
        &c,
        NS,
        0x122,
        &[
            ("p5.48xlarge", &["nn-vm-s", "nn-vm-a3", "nn-vm-l3a"], 2),
            ("p5.48xlarge", &["nn-vm-s", "nn-vm-a3", "nn-vm-l3b"], 1),
            (
                "p6-b200.48xlarge",
                &["nn-vm-s", "nn-vm-a4", "nn-vm-r4", "nn-vm-l4a"],
                2,
            ),
            (
                "p6-b200.48xlarge",
                &["nn-vm-s", "nn-vm-a4", "nn-vm-r4", "nn-vm-l4b"],
                2,
            ),
        ],
    )
    .await?;
    gangs::workload_namespace(env, &c, NS).await?;
    let volcano = start_volcano(env, &c, "volcano-mixed").await?;
    let result = mixed_ways(env, &c, NS, &fleet, discovery).await;
    let result = stopped(volcano, result, "");
    let teardown = stop_label_discovery(env, &c).await;
    let reports = result?;
    teardown?;
    for r in &reports {
        eprintln!("    {}:", r.way);
        eprintln!("      left out: {:?}", Fleet::short(&r.left_out));
        for (tier, hns) in &r.tiers {
            eprintln!("      tier {tier}: {}", hns.join("; "));
        }
        eprintln!(
            "      one HyperNode for the whole spine: {:?}",
            r.whole_spine
        );
        eprintln!("      names: {:?}", r.names);
        eprintln!("      tierName: {:?}", r.tier_names);
        for g in &r.gangs {
            eprintln!("      {g}");
        }
        if !r.repaired.is_empty() {
            eprintln!(
                "      duplicate HyperNodes of Volcano's discovery deleted: {:?}",
                r.repaired
            );
        }
    }
    fleet.delete(&c).await
}

async fn mixed_ways(
    env: &Env,
    c: &Client,
    ns: &str,
    fleet: &Fleet,
    discovery: bool,
) -> anyhow::Result<Vec<WayReport>> {
    let three: BTreeSet<String> = fleet
        .nodes
        .iter()
        .filter(|(_, p)| p.len() == 3)
        .map(|(s, _)| s.name.clone())
        .collect();
    let switches = |r: &WayReport| {
        r.tiers
            .get(&1)
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|d| d.split(' ').next().unwrap_or_default().to_string())
            .collect::<BTreeSet<_>>()
    };
    let set = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let mut reports = Vec::new();

    // Ours: tiers count from the nodes up, so the spine is tier 3 above 3-layer nodes and
    // tier 4 above 4-layer ones: two HyperNodes, no domain below the cluster root holds both.
    let mut r = eventually("our HyperNodes cover the mixed fleet", WAIT, || async {
        let r = survey(c, "ours (--volcano-hypernodes)", OURS_LABEL, fleet).await?;
        Ok((r.left_out.is_empty() && r.tiers.len() == 4).then_some(r))
    })
    .await?;
    ensure!(
        switches(&r) == set(&["nn-vm-l3a", "nn-vm-l3b", "nn-vm-l4a", "nn-vm-l4b"]),
        "ours, tier 1: {:?}",
        r.tiers
    );
    ensure!(
        r.whole_spine.is_none(),
        "ours joined the spine: {:?}",
        r.whole_spine
    );
    r.gangs
        .push(try_gang(c, ns, fleet, ("ours-t1", 4, 1), Expect::Pending).await?);
    r.gangs
        .push(try_gang(c, ns, fleet, ("ours-t3", 5, 3), Expect::Pending).await?);
    r.gangs
        .push(try_gang(c, ns, fleet, ("ours-t4", 5, 4), Expect::Pending).await?);
    reports.push(r);

    // Label discovery: in its own scenario, run last (see volcano_label_discovery_on_a_mixed_fleet).
    if !discovery {
        eprintln!(
            "    label discovery on the mixed fleet: volcano_label_discovery_on_a_mixed_fleet"
        );
        return Ok(reports);
    }

    // Label discovery as the doc configures it (three layers): tier 1 is layer 3, which on a
    // 4-layer node is the network node above its switch.
    use_label_discovery(env, c, None).await?;
    // Volcano builds the tiers one after another: the survey waits for the spine too.
    let mut r = survey_discovery(c, "label discovery, the doc's 3 levels", fleet, |r| {
        r.left_out.is_empty()
            && switches(r) == set(&["nn-vm-l3a", "nn-vm-l3b", "nn-vm-r4"])
            && r.whole_spine.as_ref().is_some_and(|(t, _)| *t == 3)
    })
    .await?;
    ensure!(
        r.whole_spine.as_ref().is_some_and(|(t, _)| *t == 3),
        "the spine at tier 3: {:?}",
        r.whole_spine
    );
    r.gangs.push(
        try_gang(
            c,
            ns,
            fleet,
            ("labels3-t1", 4, 1),
            Expect::Placed {
                depths: &[4],
                switches: Some(2),
            },
        )
        .await?,
    );
    r.gangs.push(
        try_gang(
            c,
            ns,
            fleet,
            ("labels3-t3", 5, 3),
            Expect::Placed {
                depths: &[3, 4],
                switches: None,
            },
        )
        .await?,
    );
    reports.push(r);

    // Four levels: the walk up from a node stops at its first missing label, so 3-layer nodes
    // get no HyperNode at all.
    // The doc's configuration with layer 4 added before the hostname (JSON is YAML too).
    let doc_conf: Value = serde_saphyr::from_str(
        doc_configmap("volcano-controller-configmap")?["data"]["volcano-controller.conf"]
            .as_str()
            .unwrap_or_default(),
    )?;
    let mut four = doc_conf.clone();
    let levels =
        four["networkTopologyDiscovery"][0]["config"]["networkTopologyTypes"]["aws-network"]
            .as_array_mut()
            .context("the doc's aws-network levels")?;
    let hostname = levels.len().saturating_sub(1);
    levels.insert(
        hostname,
        serde_json::json!({ "nodeLabel": format!("{}4", e2e::env::L) }),
    );
    ensure!(
        four != doc_conf,
        "the 4-level configuration differs from the doc's"
    );
    let four_conf = serde_json::to_string(&four)?;
    use_label_discovery(env, c, Some(&four_conf)).await?;
    let r = survey_discovery(c, "label discovery, 4 levels", fleet, |r| {
        switches(r) == set(&["nn-vm-l4a", "nn-vm-l4b"]) && r.left_out == three
    })
    .await?;
    reports.push(r);

    // Four levels over nodes all padded to four layers (--uniform-depth=4): every node is in,
    // tier 1 is the switch, and the spine is one tier-4 HyperNode over both types.
    e2e::env::restart_labeler_with(env, &["--volcano-hypernodes=false", "--uniform-depth=4"])
        .await?;
    let mut r = survey_discovery(
        c,
        "label discovery, 4 levels + --uniform-depth=4",
        fleet,
        |r| {
            r.left_out.is_empty()
                && switches(r) == set(&["nn-vm-l3a", "nn-vm-l3b", "nn-vm-l4a", "nn-vm-l4b"])
                && r.whole_spine.as_ref().is_some_and(|(t, _)| *t == 4)
        },
    )
    .await?;
    ensure!(
        r.whole_spine.as_ref().is_some_and(|(t, _)| *t == 4),
        "the spine at tier 4: {:?}",
        r.whole_spine
    );
    r.gangs
        .push(try_gang(c, ns, fleet, ("uniform-t1", 4, 1), Expect::Pending).await?);
    r.gangs.push(
        try_gang(
            c,
            ns,
            fleet,
            ("uniform-t4", 5, 4),
            Expect::Placed {
                depths: &[3, 4],
                switches: None,
            },
        )
        .await?,
    );
    reports.push(r);
    Ok(reports)
}

/// `--nvlink-clique-level`: tier 0 of our HyperNodes is the NVLink clique. One UltraServer of four
/// nodes under one leaf holds two cliques of two (an x72 running as two x36: GPU Feature
/// Discovery's `nvidia.com/gpu.clique`, set here as it would). Tier 0 is one HyperNode per clique
/// (none for the UltraServer). Real Volcano keeps a gang of 3 at `highestTierAllowed: 0` pending
/// (no clique has 3 nodes; without the option it would fit the UltraServer), places two gangs of
/// 2 one per clique, each inside one; the labeler goes back to the usual flags after.
pub async fn volcano_places_gangs_inside_one_clique(env: &Env) -> anyhow::Result<()> {
    const NS: &str = "volcano-clique";
    const CLIQUE: &str = "nvidia.com/gpu.clique";
    let c = env.admin().await?;
    let block = "cr-0d00000000000170d";
    let path = ["nn-vq-s", "nn-vq-a", "nn-vq-l1"];
    e2e::env::restart_labeler_with(env, &["--nvlink-clique-level=true"]).await?;
    let result = async {
        let fleet = Fleet::create_in_blocks(
            env,
            &c,
            NS,
            0x170,
            &[("p6e-gb200-e2e.36xlarge", &path[..], 4, Some(block))],
        )
        .await?;
        let cliques = ["e2e-fabric-0170.1", "e2e-fabric-0170.2"];
        let clique_of: BTreeMap<String, &str> = fleet
            .nodes
            .iter()
            .enumerate()
            .map(|(i, (s, _))| (s.name.clone(), cliques[i / 2]))
            .collect();
        let nodes: Api<Node> = Api::all(c.clone());
        for (name, clique) in &clique_of {
            nodes
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"labels": {CLIQUE: clique}}})),
                )
                .await?;
        }
        gangs::workload_namespace(env, &c, NS).await?;
        let zero = eventually("our tier-0 HyperNodes, one per clique", WAIT, || async {
            let have: BTreeMap<String, Value> = hypernodes(&c)
                .list(&ListParams::default().labels(OURS_LABEL))
                .await?
                .items
                .into_iter()
                .filter(|h| h.data["spec"]["tier"] == 0)
                .filter_map(|h| Some((h.metadata.name.clone()?, h.data["spec"].clone())))
                // Names are shortened with a hash past 63 characters: by what they select.
                .filter(|(_, spec)| spec["members"].to_string().contains("nn-vq-l1"))
                .collect();
            Ok(
                (have.len() == 2 && have.values().all(|spec| spec["tierName"] == CLIQUE))
                    .then_some(have),
            )
        })
        .await?;
        for clique in cliques {
            ensure!(
                zero.values()
                    .any(|spec| spec["members"].to_string().contains(clique)),
                "no tier-0 HyperNode selects clique {clique}: {zero:#?}"
            );
        }
        let volcano = start_volcano(env, &c, "volcano-clique").await?;
        let placing = async {
            let pool = &fleet.pool;
            let mut seen = Vec::new();
            let why = stays_pending(&c, NS, "clique-3", pool, 3, 0).await?;
            seen.push(format!(
                "3 pods, tier 0, cliques of 2 in an UltraServer of 4 -> pending: {why}"
            ));
            let mut taken = BTreeSet::new();
            for name in ["clique-a", "clique-b"] {
                let placed = placed(&c, NS, name, pool, 2, 0).await?;
                let of: BTreeSet<&str> = placed
                    .iter()
                    .map(|n| clique_of.get(n).copied().unwrap_or("(none)"))
                    .collect();
                ensure!(
                    of.len() == 1,
                    "gang {name} spans cliques: {of:?} ({placed:?})"
                );
                taken.extend(of.iter().map(|c| c.to_string()));
                seen.push(format!(
                    "2 pods, tier 0 -> clique {of:?}: {:?}",
                    Fleet::short(&placed)
                ));
            }
            ensure!(taken.len() == 2, "both gangs in one clique: {taken:?}");
            for name in ["clique-a", "clique-b"] {
                delete_job(&c, NS, name).await?;
            }
            anyhow::Ok(seen)
        }
        .await;
        let seen = stopped(
            volcano,
            placing,
            &format!("tier-0 HyperNodes: {:?}", zero.keys().collect::<Vec<_>>()),
        )?;
        for line in seen {
            eprintln!("    cliques: {line}");
        }
        fleet.delete(&c).await
    }
    .await;
    let restored = e2e::env::restart_labeler_with(env, &[]).await;
    result.and(restored)
}

/// UltraServers as tier 0 of our HyperNodes: three UltraServers of two nodes under two leaves
/// (A whole under l1, B whole under l2, C split one node under each). Real Volcano places two
/// gangs of 2 with `highestTierAllowed: 0` inside A and inside B, keeps a third pending (C's two
/// free nodes are two tier-0 HyperNodes, one under each leaf), and places it with tier 2 (the
/// tiers above keep their numbers).
pub async fn volcano_places_gangs_inside_one_ultraserver(env: &Env) -> anyhow::Result<()> {
    const NS: &str = "volcano-ultraserver";
    let c = env.admin().await?;
    let (a, b, cc) = (
        "cr-0a00000000000150a",
        "cr-0b00000000000150b",
        "cr-0c00000000000150c",
    );
    let t = "p6e-gb200-e2e.36xlarge";
    let path = |leaf: &'static str| -> [&'static str; 3] { ["nn-vu-s", "nn-vu-a", leaf] };
    let (l1, l2) = (path("nn-vu-l1"), path("nn-vu-l2"));
    let fleet = Fleet::create_in_blocks(
        env,
        &c,
        NS,
        0x150,
        &[
            (t, &l1[..], 2, Some(a)),
            (t, &l2[..], 2, Some(b)),
            (t, &l1[..], 1, Some(cc)),
            (t, &l2[..], 1, Some(cc)),
        ],
    )
    .await?;
    gangs::workload_namespace(env, &c, NS).await?;
    // Tier 0 under each leaf, one per (leaf, capacity block): C twice.
    let want: BTreeSet<String> = [
        format!("ec2tl-t0-{a}-nn-vu-l1"),
        format!("ec2tl-t0-{b}-nn-vu-l2"),
        format!("ec2tl-t0-{cc}-nn-vu-l1"),
        format!("ec2tl-t0-{cc}-nn-vu-l2"),
    ]
    .into();
    let zero = eventually(
        "our tier-0 HyperNodes for the UltraServers",
        WAIT,
        || async {
            let have: BTreeMap<String, DynamicObject> = hypernodes(&c)
                .list(&ListParams::default().labels(OURS_LABEL))
                .await?
                .items
                .into_iter()
                .filter(|h| h.data["spec"]["tier"] == 0)
                .filter_map(|h| Some((h.metadata.name.clone()?, h)))
                .filter(|(n, _)| n.contains("-nn-vu-"))
                .collect();
            Ok((have.keys().cloned().collect::<BTreeSet<_>>() == want).then_some(have))
        },
    )
    .await?;
    let leaf = hypernodes(&c).get("ec2tl-t1-nn-vu-l1").await?;
    let members = leaf.data["spec"]["members"].to_string();
    ensure!(
        members.contains(&format!("ec2tl-t0-{a}-nn-vu-l1"))
            && members.contains(&format!("ec2tl-t0-{cc}-nn-vu-l1"))
            && members.contains("DoesNotExist"),
        "leaf l1 holds its UltraServers and selects its other nodes without a block: {members}"
    );
    let volcano = start_volcano(env, &c, "volcano-ultraserver").await?;
    let result = async {
        let pool = &fleet.pool;
        let mut seen = Vec::new();
        let mut blocks = BTreeSet::new();
        for name in ["us-1", "us-2"] {
            let nodes = placed(&c, NS, name, pool, 2, 0).await?;
            let block = fleet
                .one_block(&nodes)
                .with_context(|| format!("gang {name}"))?;
            ensure!(
                block == a || block == b,
                "gang {name} in {block}, not a whole UltraServer"
            );
            blocks.insert(block.to_string());
            seen.push(format!(
                "2 pods, tier 0 -> {block}: {:?}",
                Fleet::short(&nodes)
            ));
        }
        ensure!(
            blocks.len() == 2,
            "both gangs in one UltraServer: {blocks:?}"
        );
        let why = stays_pending(&c, NS, "us-split", pool, 2, 0).await?;
        seen.push(format!(
            "2 more pods, tier 0, C's two nodes under two leaves -> pending: {why}"
        ));
        let nodes = placed(&c, NS, "us-spine", pool, 2, 2).await?;
        ensure!(
            nodes.iter().all(|n| fleet.block(n) == Some(cc)),
            "the tier-2 gang takes C's two free nodes: {nodes:?}"
        );
        seen.push(format!(
            "the same, tier 2 -> C's nodes: {:?}",
            Fleet::short(&nodes)
        ));
        for name in ["us-1", "us-2", "us-spine"] {
            delete_job(&c, NS, name).await?;
        }
        anyhow::Ok(seen)
    }
    .await;
    let seen = stopped(
        volcano,
        result,
        &format!("tier-0 HyperNodes: {:?}", zero.keys().collect::<Vec<_>>()),
    )?;
    for line in seen {
        eprintln!("    UltraServers: {line}");
    }
    fleet.delete(&c).await
}

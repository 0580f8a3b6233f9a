//! The KAI Scheduler (scheduler, binder and pod grouper built from KAI's source at the pinned
//! commit, e2e/schedulers/kai/source.sh) places gangs annotated `kai.scheduler/topology` +
//! `kai.scheduler/topology-required-placement` on the Topology our controller publishes.
//!
//! The gang is a Kubeflow PyTorchJob (KAI groups its pods into one PodGroup of all its
//! replicas). No training operator runs here: the test creates the job's pods as the operator
//! does (owned by the PyTorchJob, its replica labels, the template's spec); everything from
//! there on — PodGroup, placement, binding — is KAI's own.

use std::{collections::BTreeSet, time::Duration};

use anyhow::{Context, ensure};
use e2e::{
    env::{Env, L, WAIT},
    kube_util::{self, eventually},
    schedulers::Kai,
};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams},
};
use serde_json::{Value, json};

use super::gangs::{self, Fleet, POD_CPU, POOL};

const JOB_LABEL: &str = "training.kubeflow.org/job-name";
/// How long a gang KAI reported unschedulable is watched for a placement.
const PENDING_WATCH: Duration = Duration::from_secs(5);
/// The name the scenario gives the controller's KAI Topology (the doc's).
const TOPOLOGY: &str = "aws-network";

fn api(
    c: &Client,
    ns: &str,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::namespaced_with(c.clone(), ns, &ar)
}

fn pytorchjobs(c: &Client, ns: &str) -> Api<DynamicObject> {
    api(c, ns, "kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
}

fn podgroups(c: &Client, ns: &str) -> Api<DynamicObject> {
    api(
        c,
        ns,
        "scheduling.run.ai",
        "v2alpha2",
        "PodGroup",
        "podgroups",
    )
}

/// Submit a PyTorchJob of `workers` pods (one node each, on the fleet's pool) requiring one
/// domain of the layer label `level`, and create its pods as the training operator would.
async fn submit(
    c: &Client,
    ns: &str,
    pool: &str,
    name: &str,
    workers: u32,
    constraint: (&str, &str),
) -> anyhow::Result<()> {
    submit_with(c, ns, pool, name, workers, constraint, json!({})).await
}

/// [`submit`] with `annotations` on the Worker template (and so on its pods, as the training
/// operator copies them): KAI's segments (`kai.scheduler/segment-size`,
/// `kai.scheduler/segment-topology-required-placement`) are read there.
async fn submit_with(
    c: &Client,
    ns: &str,
    pool: &str,
    name: &str,
    workers: u32,
    (topology, level): (&str, &str),
    annotations: Value,
) -> anyhow::Result<()> {
    let template = json!({
        "metadata": { "annotations": annotations },
        "spec": {
            "schedulerName": "kai-scheduler",
            "restartPolicy": "Never",
            "nodeSelector": { POOL: pool },
            "containers": [{
                "name": "pytorch",
                "image": "registry.k8s.io/pause:3.10",
                "resources": { "requests": { "cpu": POD_CPU } }
            }]
        }
    });
    // The job-level constraint, where given (its parts left empty are not written).
    let job_annotations: serde_json::Map<String, Value> = [
        ("kai.scheduler/topology", topology),
        ("kai.scheduler/topology-required-placement", level),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .map(|(k, v)| (k.to_string(), Value::from(v)))
    .collect();
    let job = json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": { "kai.scheduler/queue": "training" },
            "annotations": job_annotations
        },
        "spec": {
            "pytorchReplicaSpecs": {
                "Worker": { "replicas": workers, "restartPolicy": "Never", "template": template }
            }
        }
    });
    let job: DynamicObject = serde_json::from_value(job)?;
    let job = pytorchjobs(c, ns)
        .create(&PostParams::default(), &job)
        .await?;
    let uid = job.metadata.uid.clone().context("the PyTorchJob's uid")?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.clone(), ns);
    for i in 0..workers {
        let mut pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": format!("{name}-worker-{i}"),
                "namespace": ns,
                "labels": {
                    JOB_LABEL: name,
                    "training.kubeflow.org/replica-type": "worker",
                    "training.kubeflow.org/replica-index": i.to_string()
                },
                "annotations": template["metadata"]["annotations"].clone(),
                "ownerReferences": [{
                    "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name, "uid": uid,
                    "controller": true, "blockOwnerDeletion": true
                }]
            }
        });
        pod["spec"] = template["spec"].clone();
        pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
            .await?;
    }
    Ok(())
}

/// The PodGroup KAI's pod grouper made for `job` (by its owner).
async fn podgroup_of(c: &Client, ns: &str, job: &str) -> anyhow::Result<Option<DynamicObject>> {
    Ok(podgroups(c, ns)
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .find(|pg| {
            pg.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.name == job)
        }))
}

/// Submit gang `name` and wait until all its pods are bound; returns their nodes and the
/// PodGroup's topology constraint.
async fn placed(
    c: &Client,
    ns: &str,
    pool: &str,
    name: &str,
    workers: u32,
    level: &str,
) -> anyhow::Result<(BTreeSet<String>, Value)> {
    placed_on(c, ns, pool, name, workers, (TOPOLOGY, level)).await
}

/// [`placed`] on any Topology of ours.
async fn placed_on(
    c: &Client,
    ns: &str,
    pool: &str,
    name: &str,
    workers: u32,
    constraint: (&str, &str),
) -> anyhow::Result<(BTreeSet<String>, Value)> {
    submit(c, ns, pool, name, workers, constraint).await?;
    let bound = gangs::wait_bound(
        c,
        ns,
        &format!("{JOB_LABEL}={name}"),
        workers as usize,
        Duration::from_secs(90),
    )
    .await;
    let pg = podgroup_of(c, ns, name)
        .await?
        .context("a PodGroup for the job")?;
    let nodes = bound.with_context(|| format!("KAI places {name}; its PodGroup: {}", pg.data))?;
    Ok((nodes, pg.data["spec"].clone()))
}

/// Submit gang `name`, wait until KAI reports it unschedulable, check that none of its pods
/// gets a node meanwhile and for several scheduling periods after, then delete it. Returns
/// KAI's message.
async fn stays_pending(
    c: &Client,
    ns: &str,
    pool: &str,
    name: &str,
    workers: u32,
    constraint: (&str, &str),
) -> anyhow::Result<String> {
    submit(c, ns, pool, name, workers, constraint).await?;
    let selector = format!("{JOB_LABEL}={name}");
    let message = eventually(
        &format!("KAI reports {name} unschedulable"),
        Duration::from_secs(90),
        || async {
            gangs::none_bound(c, ns, &selector).await?;
            let Some(pg) = podgroup_of(c, ns, name).await? else {
                return Ok(None);
            };
            Ok(pg.data["status"]["schedulingConditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|cond| cond["type"] == "UnschedulableOnNodePool")
                .map(|cond| cond["message"].as_str().unwrap_or_default().to_string()))
        },
    )
    .await?;
    tokio::time::sleep(PENDING_WATCH).await;
    gangs::none_bound(c, ns, &selector)
        .await
        .with_context(|| format!("gang {name} spread"))?;
    delete_job(c, ns, name).await?;
    Ok(message)
}

/// Delete the job, its PodGroup and its pods (no garbage collector runs here).
async fn delete_job(c: &Client, ns: &str, name: &str) -> anyhow::Result<()> {
    pytorchjobs(c, ns)
        .delete(name, &DeleteParams::default())
        .await?;
    if let Some(pg) = podgroup_of(c, ns, name).await? {
        podgroups(c, ns)
            .delete(
                &pg.metadata.name.unwrap_or_default(),
                &DeleteParams::default(),
            )
            .await?;
    }
    gangs::force_delete_pods(c, ns, &format!("{JOB_LABEL}={name}")).await
}

/// KAI places PyTorchJob gangs with `kai.scheduler/topology-required-placement` on the
/// Topology our controller publishes: on a fleet where busy nodes leave one switch with room
/// for 3 pods and free nodes elsewhere, 3 pods requiring layer 3 land on that switch, 3 more
/// stay pending although the cluster has room for them split, and 4 requiring layer 2 land
/// under the one layer-2 node with 4 free. With a 4-layer node labelled too, the 3-level
/// Topology is still there, and the 4-level one has no place for 3-layer nodes; a `batch/v1`
/// Job with the same annotations is no gang.
pub async fn kai_places_gangs_on_our_topology(env: &Env) -> anyhow::Result<()> {
    const NS: &str = "kai-gangs";
    let c = env.admin().await?;
    e2e::env::restart_labeler_with(
        env,
        &[
            "--kai-topology=true",
            &format!("--kai-topology-name={TOPOLOGY}"),
        ],
    )
    .await?;
    let result = async {
        let fleet = Fleet::create(
            env,
            &c,
            NS,
            0x123,
            &[
                ("p5.48xlarge", &["nn-ka-s", "nn-ka-a1", "nn-ka-l11"], 4),
                ("p5.48xlarge", &["nn-ka-s", "nn-ka-a1", "nn-ka-l12"], 2),
                ("p5.48xlarge", &["nn-ka-s", "nn-ka-a2", "nn-ka-l21"], 3),
                ("p5.48xlarge", &["nn-ka-s", "nn-ka-a2", "nn-ka-l22"], 1),
            ],
        )
        .await?;
        // One 4-layer node (in a pool of its own): the fleet is mixed, as with p5 and p6-b200.
        let deeper = Fleet::create(
            env,
            &c,
            "kai-four",
            0x124,
            &[(
                "p6-b200.48xlarge",
                &["nn-kb-s", "nn-kb-a", "nn-kb-r", "nn-kb-l"],
                1,
            )],
        )
        .await?;
        // Three UltraServers of two nodes (a pool of their own): A and B under one leaf each, C
        // split across both.
        let ultra = Fleet::create_in_blocks(
            env,
            &c,
            "kai-ultra",
            0x141,
            &[
                (
                    "p6e-gb200.36xlarge",
                    &["nn-ku-s", "nn-ku-a", "nn-ku-l1"],
                    2,
                    Some(BLOCK_A),
                ),
                (
                    "p6e-gb200.36xlarge",
                    &["nn-ku-s", "nn-ku-a", "nn-ku-l2"],
                    2,
                    Some(BLOCK_B),
                ),
                (
                    "p6e-gb200.36xlarge",
                    &["nn-ku-s", "nn-ku-a", "nn-ku-l1"],
                    1,
                    Some(BLOCK_C),
                ),
                (
                    "p6e-gb200.36xlarge",
                    &["nn-ku-s", "nn-ku-a", "nn-ku-l2"],
                    1,
                    Some(BLOCK_C),
                ),
            ],
        )
        .await?;
        gangs::workload_namespace(env, &c, NS).await?;
        for node in fleet.under("nn-ka-l11").iter().take(2) {
            gangs::busy(&c, NS, node).await?;
        }
        // The Topology our controller publishes for these 3-layer nodes.
        let topologies = Api::<DynamicObject>::all_with(
            c.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("kai.scheduler", "v1alpha1", "Topology"),
                "topologies",
            ),
        );
        let levels = eventually(&format!("KAI Topology {TOPOLOGY}"), WAIT, || async {
            Ok(topologies
                .get_opt(TOPOLOGY)
                .await?
                .map(|t| t.data["spec"]["levels"].clone()))
        })
        .await?;
        ensure!(
            levels.as_array().map(Vec::len) == Some(4) && levels[2]["nodeLabel"] == format!("{L}3"),
            "levels of {TOPOLOGY}: {levels}"
        );
        // The 4-layer node has its Topology beside it.
        eventually(
            &format!("KAI Topology {TOPOLOGY}-4-layer"),
            WAIT,
            || async { Ok(topologies.get_opt(&format!("{TOPOLOGY}-4-layer")).await?) },
        )
        .await?;
        // UltraServer members have their Topology beside it, the capacity block a level.
        let ultra_levels = eventually(&format!("KAI Topology {ULTRA}"), WAIT, || async {
            Ok(topologies
                .get_opt(ULTRA)
                .await?
                .map(|t| t.data["spec"]["levels"].clone()))
        })
        .await?;
        ensure!(
            ultra_levels.as_array().map(Vec::len) == Some(5)
                && ultra_levels[3]["nodeLabel"] == BLOCK
                && ultra_levels[4]["nodeLabel"] == "kubernetes.io/hostname",
            "levels of {ULTRA}: {ultra_levels}"
        );
        // EC2 may leave the capacity block out of its first answers after launch: every
        // UltraServer node carries it before the gangs come.
        for (s, _) in &ultra.nodes {
            eventually(&format!("{} in its UltraServer", s.name), WAIT, || async {
                Ok(kube_util::labels(&c, &s.name)
                    .await?
                    .contains_key(BLOCK)
                    .then_some(()))
            })
            .await?;
        }
        for q in gangs::doc_objects()?
            .into_iter()
            .filter(|d| d["kind"] == "Queue")
        {
            kube_util::apply_yaml(&c, &serde_json::to_string(&q)?, "e2e").await?;
        }
        let bin = e2e::schedulers::kai_artifacts()?;
        let mut kai = Kai::start(
            &bin,
            &env.cluster.admin_kubeconfig,
            &env.dir.join("kai"),
            &c,
        )
        .await?;
        let seen = match kai_gangs(&c, NS, &fleet).await {
            Ok(mut seen) => kai_ultraserver_gangs(&c, NS, &ultra).await.map(|more| {
                seen.extend(more);
                seen
            }),
            Err(e) => Err(e),
        };
        kai.stop();
        let seen = seen.map_err(|e| anyhow::anyhow!("{e:#}\n{}", kai.log_tails(20)))?;
        for line in seen {
            eprintln!("    KAI: {line}");
        }
        deeper.delete(&c).await?;
        ultra.delete(&c).await?;
        fleet.delete(&c).await
    }
    .await;
    e2e::env::restart_labeler_with(env, &[]).await?;
    result
}

const ULTRA: &str = "aws-network-ultraserver";
const BLOCK: &str = "ec2-topology-labeler.io/capacity-block-id";
const BLOCK_A: &str = "cr-0a000000000000ka1";
const BLOCK_B: &str = "cr-0b000000000000kb2";
const BLOCK_C: &str = "cr-0c000000000000kc3";

/// KAI places gangs requiring one UltraServer (the capacity block, a level of our
/// `aws-network-ultraserver`): two gangs of 2 land in UltraServers A and B, each inside one
/// (not in C, whose halves sit under two leaves). (A gang kept pending by C's split is not
/// asserted: a control gang requiring only the spine did not place on C's two free nodes
/// either at the pinned KAI commit, so such a pending gang would prove nothing.)
async fn kai_ultraserver_gangs(c: &Client, ns: &str, fleet: &Fleet) -> anyhow::Result<Vec<String>> {
    let pool = &fleet.pool;
    let mut seen = Vec::new();
    let mut used = BTreeSet::new();
    for name in ["ultra-pair-1", "ultra-pair-2"] {
        let (nodes, _) = placed_on(c, ns, pool, name, 2, (ULTRA, BLOCK)).await?;
        let block = fleet.one_block(&nodes).context(name)?;
        ensure!(
            block == BLOCK_A || block == BLOCK_B,
            "{name}: 2 pods requiring one UltraServer landed in {block}"
        );
        used.insert(block);
        seen.push(format!(
            "2 pods requiring the capacity block -> {block}: {:?}",
            Fleet::short(&nodes)
        ));
    }
    ensure!(
        used.len() == 2,
        "the two gangs share an UltraServer: {used:?}"
    );
    for name in ["ultra-pair-1", "ultra-pair-2"] {
        delete_job(c, ns, name).await?;
    }
    seen.push(kai_segments_per_ultraserver(c, ns, fleet).await?);
    Ok(seen)
}

/// KAI's segments: one PyTorchJob of 4 workers in segments of 2, each requiring
/// one UltraServer (`kai.scheduler/segment-size: "2"`,
/// `kai.scheduler/segment-topology-required-placement` the capacity block): workers 0-1 land in
/// one UltraServer, 2-3 in the other whole one (not in C's halves under two leaves).
async fn kai_segments_per_ultraserver(
    c: &Client,
    ns: &str,
    fleet: &Fleet,
) -> anyhow::Result<String> {
    const NAME: &str = "ultra-segments";
    submit_with(
        c,
        ns,
        &fleet.pool,
        NAME,
        4,
        // The job as a whole is held by nothing (KAI, at the pinned commit, places no gang of
        // this Topology that requires only its top level, and refuses a job-level Topology
        // without a level): the Topology goes with the segments, on the Worker template.
        ("", ""),
        json!({
            "kai.scheduler/topology": ULTRA,
            "kai.scheduler/segment-size": "2",
            "kai.scheduler/segment-topology-required-placement": BLOCK
        }),
    )
    .await?;
    let selector = format!("{JOB_LABEL}={NAME}");
    let bound = gangs::wait_bound(c, ns, &selector, 4, Duration::from_secs(90)).await;
    let pg = podgroup_of(c, ns, NAME)
        .await?
        .context("a PodGroup for the segmented job")?;
    bound.with_context(|| format!("KAI places {NAME}; its PodGroup: {}", pg.data))?;
    let segments: Vec<&Value> = pg.data["spec"]["subGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| g["topologyConstraint"]["requiredTopologyLevel"] == BLOCK)
        .collect();
    ensure!(
        segments.len() == 2 && segments.iter().all(|g| g["minMember"] == 2),
        "the pod grouper made two segments of 2 requiring the capacity block: {}",
        pg.data["spec"]
    );
    let on = gangs::bindings(c, ns, &selector).await?;
    let node_of = |i: u32| -> anyhow::Result<String> {
        on.get(&format!("{NAME}-worker-{i}"))
            .cloned()
            .flatten()
            .with_context(|| format!("worker {i} unbound: {on:?}"))
    };
    let mut blocks = Vec::new();
    for segment in [[0, 1], [2, 3]] {
        let nodes: BTreeSet<String> = segment
            .iter()
            .map(|i| node_of(*i))
            .collect::<anyhow::Result<_>>()?;
        let block = fleet
            .one_block(&nodes)
            .with_context(|| format!("segment {segment:?}"))?;
        ensure!(
            block == BLOCK_A || block == BLOCK_B,
            "segment {segment:?} landed in {block} (C is split over two leaves)"
        );
        blocks.push(block.to_string());
    }
    ensure!(
        blocks[0] != blocks[1],
        "both segments in one UltraServer of two nodes: {blocks:?}"
    );
    delete_job(c, ns, NAME).await?;
    Ok(format!(
        "4 workers in segments of 2 requiring the capacity block -> workers 0-1 in {}, 2-3 in {}",
        blocks[0], blocks[1]
    ))
}

async fn kai_gangs(c: &Client, ns: &str, fleet: &Fleet) -> anyhow::Result<Vec<String>> {
    let mut seen = Vec::new();
    let pool = &fleet.pool;
    let layer = |n: u32| format!("{L}{n}");
    let (nodes, spec) = placed(c, ns, pool, "one-switch", 3, &layer(3)).await?;
    ensure!(
        spec["minMember"] == 3 && spec["topologyConstraint"]["requiredTopologyLevel"] == layer(3),
        "the pod grouper made one gang of 3 with the job's constraint: {spec}"
    );
    let switch = fleet.common_domain(&nodes, 1)?;
    ensure!(
        switch == "nn-ka-l21",
        "3 pods under {switch}, not the only switch with room"
    );
    seen.push(format!("PodGroup {spec}"));
    seen.push(format!(
        "3 pods requiring layer 3 -> all under {switch}: {:?}",
        Fleet::short(&nodes)
    ));
    let why = stays_pending(c, ns, pool, "no-switch", 3, (TOPOLOGY, &layer(3))).await?;
    seen.push(format!(
        "3 more pods requiring layer 3, 5 nodes free on 3 switches -> pending: {why}"
    ));
    // The 4-level Topology: KAI leaves out every node that lacks one of its levels, so 2 pods
    // find no room on these 3-layer nodes, even at layer 1.
    let four = format!("{TOPOLOGY}-4-layer");
    let why = stays_pending(c, ns, pool, "three-layer-under-four", 2, (&four, &layer(1))).await?;
    seen.push(format!(
        "2 pods requiring layer 1 of {four} on 3-layer nodes -> pending: {why}"
    ));
    let (nodes, _) = placed(c, ns, pool, "one-block", 4, &layer(2)).await?;
    let block = fleet.common_domain(&nodes, 2)?;
    ensure!(block == "nn-ka-a1", "4 pods under {block}");
    seen.push(format!(
        "4 pods requiring layer 2 -> all under {block}: {:?}",
        Fleet::short(&nodes)
    ));
    for name in ["one-switch", "one-block"] {
        delete_job(c, ns, name).await?;
    }
    gangs::force_delete_pods(c, ns, "e2e-busy=true").await?;
    seen.push(batch_job_pods_are_grouped_one_by_one(c, ns, pool).await?);
    Ok(seen)
}

/// A `batch/v1` Job with the same annotations is no gang for KAI: its pod grouper gives each
/// pod its own PodGroup of one (the pods are created as the Job controller would: none runs).
async fn batch_job_pods_are_grouped_one_by_one(
    c: &Client,
    ns: &str,
    pool: &str,
) -> anyhow::Result<String> {
    const NAME: &str = "batch-job";
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(c.clone(), ns);
    let job = serde_json::from_value(json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": NAME,
            "namespace": ns,
            "labels": { "kai.scheduler/queue": "training" },
            "annotations": {
                "kai.scheduler/topology": TOPOLOGY,
                "kai.scheduler/topology-required-placement": format!("{L}3")
            }
        },
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "template": { "spec": {
                "schedulerName": "kai-scheduler",
                "restartPolicy": "Never",
                "nodeSelector": { POOL: pool },
                "containers": [{ "name": "w", "image": "registry.k8s.io/pause:3.10" }]
            } }
        }
    }))?;
    let job = jobs.create(&PostParams::default(), &job).await?;
    let uid = job.metadata.uid.clone().context("the Job's uid")?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.clone(), ns);
    for i in 0..2 {
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": format!("{NAME}-{i}"),
                "namespace": ns,
                "labels": { "batch.kubernetes.io/job-name": NAME },
                "ownerReferences": [{
                    "apiVersion": "batch/v1", "kind": "Job", "name": NAME, "uid": uid,
                    "controller": true, "blockOwnerDeletion": true
                }]
            },
            "spec": {
                "schedulerName": "kai-scheduler",
                "restartPolicy": "Never",
                "nodeSelector": { POOL: pool },
                "containers": [{ "name": "w", "image": "registry.k8s.io/pause:3.10" }]
            }
        });
        pods.create(&PostParams::default(), &serde_json::from_value(pod)?)
            .await?;
    }
    let groups = eventually(
        "PodGroups for the batch Job's pods",
        Duration::from_secs(60),
        || async {
            let groups: Vec<DynamicObject> = podgroups(c, ns)
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .filter(|pg| {
                    pg.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.name == NAME)
                })
                .collect();
            Ok((groups.len() >= 2).then_some(groups))
        },
    )
    .await?;
    let min_members: Vec<Option<i64>> = groups
        .iter()
        .map(|g| g.data["spec"]["minMember"].as_i64())
        .collect();
    ensure!(
        groups.len() == 2 && min_members.iter().all(|m| *m == Some(1)),
        "one PodGroup of one per pod: {min_members:?}"
    );
    jobs.delete(NAME, &DeleteParams::default()).await?;
    for g in &groups {
        podgroups(c, ns)
            .delete(
                &g.metadata.name.clone().unwrap_or_default(),
                &DeleteParams::default(),
            )
            .await?;
    }
    gangs::force_delete_pods(c, ns, &format!("batch.kubernetes.io/job-name={NAME}")).await?;
    Ok(format!(
        "a batch/v1 Job of 2 pods with the same annotations -> {} PodGroups, minMember {min_members:?}",
        groups.len()
    ))
}

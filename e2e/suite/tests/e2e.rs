//! End-to-end: the controller binary, running as its ServiceAccount under the chart's RBAC,
//! against a real kube-apiserver + etcd and mock-ec2.
//!
//! Locally (CI) the harness starts everything itself. Against another cluster (kind):
//! `E2E_KUBECONFIG` (admin), `E2E_MOCK_EC2_URL` (mock-ec2's address as the test reaches it) and
//! the chart already installed; scenarios that stop processes are skipped there.
//!
//! Scenarios run one at a time, in order (some inject faults into the shared EC2 mock), in
//! lanes that run side by side on environments of their own (`LANE_STARTS`).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};
use e2e::{
    env::{
        Env, L, LEASE, RESYNC, ScenarioFn, WAIT, expected, expected_of, label_and_wait,
        start_labeler, wait_leader,
    },
    fixtures::NodeSpec,
    kube_util::{self, eventually, wait_for_topology},
    labeler::metric_sum,
    scenario,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use mock_ec2::{Faults, Instance};
use serde_json::json;

#[path = "e2e/slurm.rs"]
mod slurm;
use slurm::slurm_leaves_out_a_disagreeing_node;
#[path = "e2e/gangs.rs"]
mod gangs;
#[path = "e2e/trust.rs"]
mod trust;
use trust::forged_labels_never_reach_a_scheduler;
#[path = "e2e/kai.rs"]
mod kai;
#[path = "e2e/volcano.rs"]
mod volcano;
use kai::kai_places_gangs_on_our_topology;
use volcano::{
    volcano_label_discovery_on_a_mixed_fleet, volcano_on_a_mixed_fleet_both_ways,
    volcano_places_gangs_by_its_label_discovery, volcano_places_gangs_inside_one_clique,
    volcano_places_gangs_inside_one_ultraserver, volcano_places_gangs_on_our_hypernodes,
};
#[path = "e2e/admission.rs"]
mod admission;
#[path = "e2e/fit.rs"]
mod fit;
#[path = "e2e/manifests.rs"]
mod manifests;
use admission::{
    admission_policy_holds_the_controller_to_its_scheduler_objects,
    admission_policy_holds_the_controller_to_its_slurm_configmap,
    admission_policy_limits_the_controllers_node_writes, exclusive_keys_refuse_every_other_writer,
};
use fit::{fit_agrees_with_kueue, fit_names_the_domains_that_take_the_gang};
use manifests::{
    deploy_manifests_apply_cleanly, reserved_capacity_metrics_follow_the_reservations,
    tree_min_labelled_checks_the_labels, tree_reservations_show_capacity_by_network_node,
};
#[path = "e2e/dashboard.rs"]
mod dashboard;
use dashboard::dashboard_queries_match_live_metrics;
#[path = "e2e/uninstall.rs"]
mod uninstall;
use uninstall::{turned_off_features_are_retired, uninstall_leaves_only_labels};
#[path = "e2e/whynot.rs"]
mod whynot;
use whynot::{
    every_reason_says_why_once, nvlink_cliques_are_checked_against_ultraservers,
    ultraserver_interconnect_health, ultraserver_shape_labels,
};
#[path = "e2e/stalls.rs"]
mod stalls;
use stalls::{
    a_panicking_background_task_restarts, a_revoked_node_watch_fails_readiness_until_restored,
};
#[path = "e2e/kueue.rs"]
mod kueue;
use kueue::*;
#[path = "e2e/startup.rs"]
mod startup;
use startup::*;
#[path = "e2e/credentials.rs"]
mod credentials;
use credentials::{
    expired_and_refused_credentials_are_answered_as_aws_does,
    irsa_credentials_rotate_while_nodes_join, pod_identity_credentials_rotate_while_nodes_join,
};

// ---------------------------------------------------------------------------------------------
// Scenarios

async fn three_layer_node(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x101, 1, "p5.48xlarge");
    let i = s.instance(&["nn-spine-a", "nn-agg-a1", "nn-leaf-a11"]);
    label_and_wait(env, &c, &[(s.clone(), i)]).await?;
    let labels = kube_util::labels(&c, &s.name).await?;
    ensure!(
        labels.contains_key("kubernetes.io/hostname")
            && labels
                .get("eks.amazonaws.com/nodegroup")
                .map(String::as_str)
                == Some("gpu-training"),
        "other labels are untouched: {labels:?}"
    );
    Ok(())
}

async fn four_layer_node(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x102, 1, "p6-b200.48xlarge");
    let i = s.instance(&["nn-spine-b", "nn-agg-b1", "nn-rack-b11", "nn-leaf-b111"]);
    label_and_wait(env, &c, &[(s, i)]).await
}

async fn ultraserver_capacity_block(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x103, 1, "p6e-gb200.36xlarge");
    let mut i = s.instance(&["nn-spine-u", "nn-agg-u1", "nn-leaf-u11"]);
    i.capacity_block_id = Some("cr-0a1b2c3d4e5f60718".into());
    label_and_wait(env, &c, &[(s, i)]).await
}

async fn odd_placement_group_name(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x104, 1, "p5en.48xlarge");
    let i = s.instance(&["nn-spine-p", "nn-agg-p1", "nn-leaf-p11"]);
    let raw = format!("Training Group ✨ (prod) {}", "x".repeat(200));
    let (label, annotation) = e2e::env::placement_group_of(env, &c, &s, i, &raw).await?;
    ensure!(
        label.len() <= 63 && label.starts_with("Training-Group-prod-x"),
        "{label}"
    );
    ensure!(annotation == raw, "the raw name is kept in the annotation");
    Ok(())
}

async fn not_ec2_nodes_are_skipped(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let before = env.mock_admin.stats().await?.ids_requested;
    let specs = [
        NodeSpec::ec2(0x105, 1, "p5.48xlarge")
            .with_provider_id("aws:///us-west-2a/0123456789abcdef0123456789abcdef/fargate-ip-10-1-2-3.us-west-2.compute.internal"),
        NodeSpec::ec2(0x105, 2, "p5.48xlarge")
            .with_provider_id("eks-hybrid:///us-west-2/my-cluster/mi-0123456789abcdef0"),
        NodeSpec::ec2(0x105, 3, "p5.48xlarge")
            .with_provider_id("gce://my-project/us-central1-a/gpu-node-1"),
    ];
    kube_util::create_nodes(&c, specs.iter().map(NodeSpec::node).collect()).await?;
    tokio::time::sleep(RESYNC + Duration::from_secs(1)).await;
    for s in &specs {
        let t = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
        ensure!(t.is_empty(), "{} got labels {t:?}", s.name);
    }
    let after = env.mock_admin.stats().await?.ids_requested;
    ensure!(
        after == before,
        "no EC2 lookups for non-EC2 nodes ({before} -> {after})"
    );
    Ok(())
}

async fn unsupported_instance_type(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    // One instance EC2 returns without network nodes, one it leaves out entirely.
    let empty = NodeSpec::ec2(0x106, 1, "m7i.large");
    let absent = NodeSpec::ec2(0x106, 2, "c7i.large");
    env.mock_admin.upsert(&empty.instance(&[])).await?;
    let calls_before = env.mock_admin.stats().await?.calls;
    kube_util::create_nodes(&c, vec![empty.node(), absent.node()]).await?;
    // Several resync periods: the answer is remembered and retried with backoff, not per reconcile.
    tokio::time::sleep(RESYNC * 3).await;
    for s in [&empty, &absent] {
        let t = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
        ensure!(t.is_empty(), "{} got labels {t:?}", s.name);
    }
    let calls = env.mock_admin.stats().await?.calls - calls_before;
    // Backoff 2s, 4s, 8s, 10s (cap) over 15s: at most 4 lookups, coalesced for both nodes.
    ensure!(
        calls <= 5,
        "{calls} EC2 calls for two unsupported nodes in 15s"
    );
    for s in [&empty, &absent] {
        kube_util::delete_node(&c, &s.name).await?;
    }
    Ok(())
}

async fn provider_id_set_later(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x107, 1, "trn2.48xlarge");
    let real_pid = s.provider_id.clone();
    env.mock_admin
        .upsert(&s.instance(&["nn-spine-t", "nn-agg-t1", "nn-leaf-t11"]))
        .await?;
    kube_util::create_nodes(&c, vec![s.clone().with_provider_id("").node()]).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ensure!(kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?).is_empty());
    kube_util::set_provider_id(&c, &s.name, &real_pid).await?;
    wait_for_topology(
        &c,
        &s.name,
        &expected(&["nn-spine-t", "nn-agg-t1", "nn-leaf-t11"], &[]),
        WAIT,
    )
    .await
}

async fn reboot_and_move(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x108, 1, "p5.48xlarge");
    label_and_wait(
        env,
        &c,
        &[(s.clone(), s.instance(&["nn-s1", "nn-a1", "nn-l1"]))],
    )
    .await?;
    // Stop/start: EC2 places the instance elsewhere and the kubelet reports a new boot ID.
    env.mock_admin
        .upsert(&s.instance(&["nn-s1", "nn-a2", "nn-l7"]))
        .await?;
    kube_util::set_boot_id(&c, &s.name, &e2e::fixtures::boot_id(99)).await?;
    wait_for_topology(
        &c,
        &s.name,
        &expected(&["nn-s1", "nn-a2", "nn-l7"], &[]),
        WAIT,
    )
    .await
}

async fn four_to_three_layers(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    // (a) We labelled 4 layers, another manager (EKS's cloud controller) co-owns layer-4.
    let a = NodeSpec::ec2(0x109, 1, "p6-b200.48xlarge");
    let four = ["nn-s", "nn-a", "nn-r", "nn-l"];
    label_and_wait(env, &c, &[(a.clone(), a.instance(&four))]).await?;
    let ccm = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": a.name, "labels": {format!("{L}4"): "nn-l"}}});
    api.patch(
        &a.name,
        &PatchParams::apply("cloud-controller-manager").force(),
        &Patch::Apply(ccm),
    )
    .await?;
    // (b) EKS labelled 4 layers at registration; we never owned layer-4.
    let b = NodeSpec::ec2(0x109, 2, "p6-b200.48xlarge");
    let mut node_b = b.node();
    let labels = node_b.metadata.labels.get_or_insert_default();
    for (n, v) in four.iter().enumerate() {
        labels.insert(format!("{L}{}", n + 1), v.to_string());
    }
    env.mock_admin
        .upsert(&b.instance(&["nn-s", "nn-a", "nn-l"]))
        .await?;
    kube_util::create_nodes(&c, vec![node_b]).await?;

    env.mock_admin
        .upsert(&a.instance(&["nn-s", "nn-a", "nn-l"]))
        .await?;
    kube_util::set_boot_id(&c, &a.name, &e2e::fixtures::boot_id(77)).await?;
    let three = expected(&["nn-s", "nn-a", "nn-l"], &[]);
    wait_for_topology(&c, &a.name, &three, WAIT)
        .await
        .context("co-owned layer-4")?;
    wait_for_topology(&c, &b.name, &three, WAIT)
        .await
        .context("foreign layer-4")?;
    Ok(())
}

async fn burst_is_batched(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let n = 250u32;
    let pairs: Vec<(NodeSpec, Instance)> = (0..n)
        .map(|k| {
            let s = NodeSpec::ec2(0x10a, k, "p5.48xlarge");
            let i = s.instance(&[
                "nn-spine-z",
                &format!("nn-agg-z{}", k / 50),
                &format!("nn-leaf-z{}", k / 10),
            ]);
            (s, i)
        })
        .collect();
    env.mock_admin
        .upsert_all(&pairs.iter().map(|(_, i)| i.clone()).collect::<Vec<_>>())
        .await?;
    env.mock_admin.reset_stats().await?;
    let started = Instant::now();
    kube_util::create_nodes(&c, pairs.iter().map(|(s, _)| s.node()).collect()).await?;
    let created_in = started.elapsed();
    for (s, i) in &pairs {
        let want = expected_of(i);
        wait_for_topology(&c, &s.name, &want, WAIT).await?;
    }
    let stats = env.mock_admin.stats().await?;
    // The documented contract: a call goes out at 100 IDs, when no new ID joined for the batch
    // window, or when its oldest ID has waited the max wait. Locally the controller sees the
    // burst as it is created: ceil(n/100) calls, plus one per max wait (3 s here) the creation
    // spanned. On kind the controller runs in the cluster on the same two shared cores and its
    // watch has been seen to deliver a burst created in 1.6 s in clumps over 13 s ([100, 100,
    // 25, 25]): each clump rightly goes out when the window passes, so there only batching
    // itself is asserted (below). Locally the suite's lanes and the oldest pass run beside this
    // one on the same two cores (make test), and one stall of the creation or the watch longer
    // than the batch window (500 ms here) is, by the same contract, one more call: one is allowed.
    let spans = (created_in.as_secs_f64() / 3.0).floor() as u64;
    let bound = if env.local() {
        n.div_ceil(100) as u64 + stats.throttled + spans + 1
    } else {
        u64::from(n) / 25
    };
    eprintln!(
        "    {n} nodes created in {:.1}s, labelled in {:.1}s with {} EC2 calls (IDs per call {:?}; bound {bound})",
        created_in.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        stats.calls,
        stats.ids_per_call
    );
    ensure!(
        stats.calls <= bound,
        "{} calls for {n} new nodes created in {:.1}s; at most {bound} allowed",
        stats.calls,
        created_in.as_secs_f64()
    );
    // Batched however slowly they came: never fewer than 25 IDs a call on average.
    ensure!(
        stats.calls * 25 <= u64::from(n),
        "{} calls for {n} nodes: not batched",
        stats.calls
    );
    ensure!(stats.ids_per_call.iter().all(|k| *k <= 100));
    Ok(())
}

async fn steady_state_is_silent(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    // Let anything in flight settle, then watch two full resync periods.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let window = RESYNC * 2 + Duration::from_secs(2);
    let calls_before = env.mock_admin.stats().await?.calls;
    if env.local() {
        // Nothing else writes Nodes here: the API server's own request count is exact.
        let published = || async {
            anyhow::Ok(
                kube_util::writes_to(&c, "hypernodes").await?
                    + kube_util::writes_to(&c, "topologies").await?,
            )
        };
        let writes_before = kube_util::node_writes(&c).await?;
        let published_before = published().await?;
        tokio::time::sleep(window).await;
        let writes = kube_util::node_writes(&c).await? - writes_before;
        let published = published().await? - published_before;
        eprintln!(
            "    steady state over {}s: {writes} node writes, {published} HyperNode/Topology writes (API server count)",
            window.as_secs()
        );
        ensure!(
            published == 0.0,
            "{published} HyperNode/Topology writes at steady state"
        );
        ensure!(
            writes == 0.0,
            "{writes} node PATCH/APPLY requests at steady state (API server's count)"
        );
    } else {
        // On a real cluster other controllers write Nodes too: read our field manager's own
        // write times from the API server instead.
        let last_before = kube_util::last_write_by(&c, "ec2-topology-labeler").await?;
        tokio::time::sleep(window).await;
        let last_after = kube_util::last_write_by(&c, "ec2-topology-labeler").await?;
        ensure!(
            last_before == last_after,
            "our field manager wrote at steady state ({last_before:?} -> {last_after:?})"
        );
    }
    let calls = env.mock_admin.stats().await?.calls - calls_before;
    eprintln!("    steady state: {calls} EC2 calls");
    ensure!(calls == 0, "{calls} EC2 calls at steady state");
    if let Some(l) = env.labeler.lock().await.as_ref() {
        let m = l.metrics().await?;
        let reconciles = metric_sum(&m, "ec2_topology_labeler_reconciles_total", &[]);
        ensure!(
            reconciles > 0.0,
            "the controller kept reconciling (resyncs) meanwhile"
        );
    }
    Ok(())
}

/// Whoever may patch a Node (a compromised kubelet patches its own) may write its labels and a
/// verification record to match; whoever may edit ConfigMaps in the controller's namespace may
/// edit its ledger. While no controller runs, two nodes are moved to a leaf EC2 never named: one
/// with a record on the node sealed with a key of the forger's own, the other with a record on
/// the node in format 1 (whose unkeyed sum anyone can recompute) and its ledger shard edited to
/// match (the shard's seal no longer opens). The next leader trusts neither (the ledger's
/// record, which the first node's labels no longer match, or the annotation, sealed with another
/// key; the edited shard refused, and format 1), asks EC2, and puts the labels back as EC2
/// answers.
async fn a_forged_record_is_re_verified(env: &Env) -> anyhow::Result<()> {
    use ec2_topology_labeler::{
        ledger,
        topology::InstanceTopology,
        verified::{RecordKey, VERIFIED_KEY, Verified},
    };
    let c = env.admin().await?;
    let (a, b) = (
        NodeSpec::ec2(0x1b0, 1, "p5.48xlarge"),
        NodeSpec::ec2(0x1b0, 2, "p5.48xlarge"),
    );
    let truth = ["nn-fr-s", "nn-fr-a", "nn-fr-l"];
    label_and_wait(
        env,
        &c,
        &[
            (a.clone(), a.instance(&truth)),
            (b.clone(), b.instance(&truth)),
        ],
    )
    .await?;
    let ns = e2e::cluster::NAMESPACE;
    wait_for_ledger(&c, ns, &[&a.name, &b.name], Duration::from_secs(30)).await?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    let forged = ["nn-fr-s", "nn-fr-a", "nn-fr-forged"];
    // The forger's labels: ours, moved to the forged leaf.
    let forged_labels =
        |s: &NodeSpec| -> BTreeMap<String, String> { expected_of(&s.instance(&forged)) };
    let record = |s: &NodeSpec, boot: &str| Verified {
        topology: InstanceTopology {
            instance_id: s.instance_id.clone(),
            instance_type: Some(s.instance_type.clone()),
            availability_zone: Some(s.zone.clone()),
            zone_id: Some("usw2-az1".into()),
            network_nodes: forged.iter().map(|n| n.to_string()).collect(),
            group_name: None,
            capacity_block_id: None,
        },
        boot_id: Some(boot.to_string()),
        at: 1_796_300_000,
    };
    let boot_of = |n: &k8s_openapi::api::core::v1::Node| {
        n.status
            .as_ref()
            .and_then(|s| s.node_info.as_ref())
            .map(|i| i.boot_id.clone())
            .unwrap_or_default()
    };
    // No controller runs while the nodes are rewritten (it would put the labels back at once).
    if let Some(mut l) = env.labeler.lock().await.take() {
        l.stop();
    }
    let theirs =
        RecordKey::new(b"the forger's own key, long enough to pass").map_err(anyhow::Error::msg)?;
    let with_their_key = record(&a, &boot_of(&nodes.get(&a.name).await?)).encode(&theirs);
    let v1 = {
        let r = record(&b, &boot_of(&nodes.get(&b.name).await?));
        let t = &r.topology;
        let mut line = json!({"v": 1, "instanceId": t.instance_id, "bootId": r.boot_id, "at": r.at,
            "instanceType": t.instance_type, "availabilityZone": t.availability_zone,
            "zoneId": t.zone_id, "networkNodes": t.network_nodes});
        let sum = {
            use sha2::Digest;
            let digest = sha2::Sha256::digest(line.to_string().as_bytes());
            digest
                .iter()
                .take(8)
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        line["sum"] = json!(sum);
        line.to_string()
    };
    for (s, text) in [(&a, &with_their_key), (&b, &v1)] {
        let patch =
            json!({"metadata": {"labels": forged_labels(s), "annotations": {VERIFIED_KEY: text}}});
        nodes
            .patch(&s.name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
    }
    // The second node's shard, edited to say the forged leaf (its seal left as it was).
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(c.clone(), ns);
    let shard = ledger::shard_name("ec2-topology-labeler", ledger::shard_of(&b.name));
    let cm = configmaps.get(&shard).await?;
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(ledger::RECORDS_KEY))
        .cloned()
        .unwrap_or_default();
    ensure!(
        text.contains("nn-fr-l"),
        "the shard holds the truth: {text}"
    );
    let edited = text.replace("nn-fr-l", "nn-fr-forged");
    configmaps
        .patch(
            &shard,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {ledger::RECORDS_KEY: edited}})),
        )
        .await?;
    e2e::env::restart_labeler_with(env, &[]).await?;
    for s in [&a, &b] {
        wait_for_topology(&c, &s.name, &expected(&truth, &[]), WAIT)
            .await
            .with_context(|| format!("{}: the forged labels stayed", s.name))?;
    }
    let m = match env.labeler.lock().await.as_ref() {
        Some(l) => l.metrics().await?,
        None => String::new(),
    };
    let outcome = |o: &str| {
        metric_sum(
            &m,
            "ec2_topology_labeler_verification_records_total",
            &[&format!("outcome=\"{o}\"")],
        )
    };
    let refused = metric_sum(
        &m,
        "ec2_topology_labeler_ledger_shards_total",
        &[r#"outcome="refused""#],
    );
    // The first node is judged by the ledger's record (labels_changed), or, when both nodes
    // share the refused shard, by its annotation (other_key).
    ensure!(
        refused >= 1.0
            && outcome("other_version") >= 1.0
            && outcome("labels_changed") + outcome("other_key") >= 1.0,
        "the forgeries were not judged as such: shards refused {refused}, other_version {}, labels_changed {}, other_key {}",
        outcome("other_version"),
        outcome("labels_changed"),
        outcome("other_key")
    );
    // The refused shard is written anew (a second after the nodes' news): the truth again.
    eventually("the ledger says the truth again", WAIT, || async {
        let records = ledger_records(&c, ns).await?;
        Ok([&a, &b]
            .iter()
            .all(|s| {
                records
                    .get(&s.name)
                    .is_some_and(|r| r.topology.network_nodes == truth)
            })
            .then_some(()))
    })
    .await?;
    eprintln!(
        "    forged: shards refused {refused}, records other_version {}, labels_changed {}, other_key {}, trusted {}; labels put back as EC2 answers, the ledger written anew",
        outcome("other_version"),
        outcome("labels_changed"),
        outcome("other_key"),
        outcome("trusted")
    );
    Ok(())
}

/// Quiet forever (issue 42): with nothing changing, a controller whose answers come due every
/// 20 s asks EC2 again at each TTL, in full calls (at most ceil(N/100) + 1 a TTL), and writes
/// no Node over three TTLs: a re-verification that finds the same answer leaves the node's
/// record as it is. It starts as a new leader, taking the nodes' records on trust.
async fn quiet_over_three_ttls(env: &Env) -> anyhow::Result<()> {
    const TTL: Duration = Duration::from_secs(20);
    let c = env.admin().await?;
    let ttl_flag = format!("--cache-ttl={}s", TTL.as_secs());
    e2e::env::restart_labeler_with(env, &[&ttl_flag]).await?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    let all = nodes.list(&Default::default()).await?.items;
    let verified = ledger_records(&c, e2e::cluster::NAMESPACE).await?.len();
    ensure!(verified > 0, "the ledger holds no verification record");
    // None written by us on a Node (a scenario's forger's may be there, theirs).
    let ours = all
        .iter()
        .filter(|n| {
            n.metadata.managed_fields.iter().flatten().any(|m| {
                m.manager.as_deref() == Some("ec2-topology-labeler")
                    && m.fields_v1.as_ref().is_some_and(|f| {
                        f.0.to_string()
                            .contains("f:ec2-topology-labeler.io/verified")
                    })
            })
        })
        .count();
    ensure!(
        ours == 0,
        "{ours} node(s) carry a verification record of ours: they live in the ledger"
    );
    // Every EC2 node is looked up (those without a record too): N for the bound.
    let ec2_nodes = all.iter().filter(|n| kube_util::is_ec2(n)).count();
    // The start's own lookups (nodes without a record) settle first.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes_before = kube_util::node_writes(&c).await?;
    let stats_before = env.mock_admin.stats().await?;
    tokio::time::sleep(TTL * 3).await;
    let writes = kube_util::node_writes(&c).await? - writes_before;
    let stats = env.mock_admin.stats().await?;
    let calls = stats.calls - stats_before.calls;
    let sizes = &stats.ids_per_call[stats_before.ids_per_call.len()..];
    let per_ttl = ec2_nodes.div_ceil(100) as u64 + 1;
    eprintln!(
        "    {ec2_nodes} EC2 nodes ({verified} with a record), TTL {}s, over three TTLs: {writes} node writes, {calls} EC2 calls (IDs per call {sizes:?}; at most {per_ttl} a TTL)",
        TTL.as_secs()
    );
    let early = match env.labeler.lock().await.as_ref() {
        Some(l) => metric_sum(
            &l.metrics().await?,
            "ec2_topology_labeler_reverified_early_total",
            &[],
        ),
        None => 0.0,
    };
    e2e::env::restart_labeler_with(env, &[]).await?;
    ensure!(writes == 0.0, "{writes} node writes over three quiet TTLs");
    ensure!(
        calls >= 2,
        "EC2 was not asked again ({calls} calls in three TTLs)"
    );
    ensure!(
        calls <= 3 * per_ttl,
        "{calls} EC2 calls over three TTLs for {ec2_nodes} nodes; at most {per_ttl} a TTL"
    );
    ensure!(
        stats.ids_requested - stats_before.ids_requested >= 2 * verified as u64,
        "every answer re-verified at least twice in three TTLs"
    );
    ensure!(early > 0.0, "answers were taken along ({early})");
    Ok(())
}

async fn plan_shows_changes_and_writes_nothing(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let writes_before = kube_util::node_writes(&c).await?;
    let run = |extra: &[&str]| e2e::env::plan_json(env, extra);
    // With the controller's own scheme, every labelled node is up to date.
    let same = run(&[])?;
    let nodes = same.as_array().context("a JSON array")?;
    let status = |n: &serde_json::Value| n["status"].as_str().unwrap_or_default().to_string();
    ensure!(nodes.iter().any(|n| status(n) == "up-to-date"));
    ensure!(
        nodes
            .iter()
            .any(|n| status(n) == "skipped" && n["reason"] == "fargate")
    );
    ensure!(
        !nodes.iter().any(|n| status(n) == "change"),
        "nothing left to change: {:?}",
        nodes
            .iter()
            .filter(|n| status(n) == "change")
            .take(3)
            .collect::<Vec<_>>()
    );
    // With another scheme, plan shows what it would add, and still writes nothing.
    let other = run(&[
        "--layer-label-prefix=example.com/tier-",
        "--layer-numbering=leaf-first",
    ])?;
    let change = other
        .as_array()
        .and_then(|a| a.iter().find(|n| status(n) == "change"))
        .context("a node to change")?;
    ensure!(
        change["labels"]["add"]["example.com/tier-1"].is_string(),
        "{change}"
    );
    let writes = kube_util::node_writes(&c).await? - writes_before;
    ensure!(writes == 0.0, "plan wrote {writes} times");
    Ok(())
}

/// EC2 leaves `capacityBlockId` out of its first answers after launch (documented eventual
/// consistency): the node is labelled with its layers at once, and gets its capacity-block
/// label when EC2 has it, seconds later, without waiting for the cache TTL (6 h).
async fn capacity_block_arrives_late(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x113, 1, "p6e-gb200.36xlarge");
    let nodes = ["nn-spine-g", "nn-agg-g1", "nn-leaf-g11"];
    let mut i = s.instance(&nodes);
    label_and_wait(env, &c, &[(s.clone(), i.clone())]).await?;
    let arrived = Instant::now();
    i.capacity_block_id = Some("cr-0c0ffee0c0ffee0c0".into());
    env.mock_admin.upsert(&i).await?;
    let want = expected(
        &nodes,
        &[(
            "ec2-topology-labeler.io/capacity-block-id",
            "cr-0c0ffee0c0ffee0c0",
        )],
    );
    wait_for_topology(&c, &s.name, &want, Duration::from_secs(20))
        .await
        .context("the capacity block EC2 reported late never became a label")?;
    eprintln!(
        "    capacity block labelled {:.1}s after EC2 first reported it",
        arrived.elapsed().as_secs_f64()
    );
    // EC2 leaves it out again (a lagging replica): the label stays.
    let with_block = i.clone();
    i.capacity_block_id = None;
    env.mock_admin.upsert(&i).await?;
    tokio::time::sleep(RESYNC * 2).await;
    let kept = wait_for_topology(&c, &s.name, &want, Duration::from_secs(1)).await;
    // EC2 consistent again (an instance left without its block would rightly be asked about
    // again and again by a controller started later).
    env.mock_admin.upsert(&with_block).await?;
    kept.context("an answer without the capacity block removed its label")
}

/// Turning an extra off (`--capacity-block-label=false`) removes the labels we wrote for it, at
/// start-up, not silently at some later write; `plan` shows it beforehand; keys we never wrote
/// stay.
async fn turned_off_extras_are_removed_at_start_up(env: &Env) -> anyhow::Result<()> {
    const CB: &str = "ec2-topology-labeler.io/capacity-block-id";
    const OTHERS: &str = "example.com/capacity-block-id";
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x114, 1, "p6e-gb200.36xlarge");
    let nodes = ["nn-spine-o", "nn-agg-o1", "nn-leaf-o11"];
    let mut i = s.instance(&nodes);
    i.capacity_block_id = Some("cr-0fee1dead0fee1de".into());
    label_and_wait(env, &c, &[(s.clone(), i)]).await?;
    // Someone else's label with a similar key: never ours to remove.
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    api.patch(
        &s.name,
        &PatchParams::apply("someone-else"),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": s.name, "labels": {OTHERS: "x"}}})),
    )
    .await?;
    let plan = e2e::env::plan_json(env, &["--capacity-block-label=false"])?;
    let entry = plan
        .as_array()
        .and_then(|a| a.iter().find(|n| n["node"] == s.name.as_str()))
        .context("the node in the plan")?;
    ensure!(
        entry["labels"]["remove"][CB] == "cr-0fee1dead0fee1de"
            && entry["reason"]
                .as_str()
                .is_some_and(|r| r.contains("no longer configured")),
        "plan does not show the removal: {entry}"
    );
    let restarted = Instant::now();
    e2e::env::restart_labeler_with(env, &["--capacity-block-label=false"]).await?;
    let result = wait_for_topology(&c, &s.name, &expected(&nodes, &[]), WAIT).await;
    let took = restarted.elapsed();
    let others_kept = kube_util::labels(&c, &s.name).await?.get(OTHERS).cloned();
    // Back to the usual controller for the scenarios after this one.
    e2e::env::restart_labeler_with(env, &[]).await?;
    result.context("the capacity-block label we wrote is still there")?;
    ensure!(
        others_kept.as_deref() == Some("x"),
        "another manager's label was removed"
    );
    eprintln!(
        "    retired label removed {:.1}s after the restart",
        took.as_secs_f64()
    );
    Ok(())
}

async fn throttled_half_the_time(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    env.mock_admin
        .set_faults(&Faults {
            throttle_fraction: 0.5,
            ..Faults::default()
        })
        .await?;
    let before = env.mock_admin.stats().await?;
    let started = Instant::now();
    // Three waves of 50 new nodes: several calls, every second one refused.
    let mut result = Ok(());
    for wave in 0..3u32 {
        let pairs: Vec<(NodeSpec, Instance)> = (0..50)
            .map(|k| {
                let s = NodeSpec::ec2(0x10b, wave * 50 + k, "p5.48xlarge");
                let i = s.instance(&["nn-spine-q", "nn-agg-q", &format!("nn-leaf-q{wave}")]);
                (s, i)
            })
            .collect();
        result = label_and_wait(env, &c, &pairs).await;
        if result.is_err() {
            break;
        }
    }
    let stats = env.mock_admin.stats().await?;
    env.mock_admin.set_faults(&Faults::default()).await?;
    result?;
    let throttled = stats.throttled - before.throttled;
    eprintln!(
        "    150 nodes converged in {:.1}s under 50% throttling: {} calls, {throttled} throttled",
        started.elapsed().as_secs_f64(),
        stats.calls - before.calls
    );
    ensure!(
        throttled >= 1,
        "the scenario must actually have been throttled"
    );
    Ok(())
}

async fn ec2_down_removes_nothing(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let a = NodeSpec::ec2(0x10c, 1, "p5.48xlarge");
    let b = NodeSpec::ec2(0x10c, 2, "p5.48xlarge");
    let old = ["nn-s-d", "nn-a-d", "nn-l-d"];
    label_and_wait(
        env,
        &c,
        &[(a.clone(), a.instance(&old)), (b.clone(), b.instance(&old))],
    )
    .await?;

    let mut guard = env.mock.lock().await;
    let mock = guard.as_mut().context("local mock")?;
    let mut scenario = mock.down().await?;
    // EC2 is unreachable. A reboot forces a fresh lookup for node a; node b just resyncs.
    kube_util::set_boot_id(&c, &a.name, &e2e::fixtures::boot_id(55)).await?;
    tokio::time::sleep(RESYNC * 2).await;
    for s in [&a, &b] {
        let t = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
        ensure!(
            t == expected(&old, &[]),
            "{} lost or changed labels while EC2 was down: {t:?}",
            s.name
        );
    }
    // EC2 returns; node a had moved meanwhile.
    let moved = a.instance(&["nn-s-d", "nn-a-d", "nn-l-new"]);
    scenario
        .instances
        .retain(|i| i.instance_id != moved.instance_id);
    scenario.instances.push(moved);
    mock.up(&scenario).await?;
    drop(guard);
    let started = Instant::now();
    wait_for_topology(
        &c,
        &a.name,
        &expected(&["nn-s-d", "nn-a-d", "nn-l-new"], &[]),
        Duration::from_secs(60),
    )
    .await?;
    eprintln!(
        "    converged {:.1}s after EC2 came back",
        started.elapsed().as_secs_f64()
    );
    wait_for_topology(&c, &b.name, &expected(&old, &[]), WAIT).await
}

async fn metrics_match_what_happened(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let guard = env.labeler.lock().await;
    let l = guard.as_ref().context("local controller")?;
    let calls = |m: &str| metric_sum(m, "ec2_topology_labeler_ec2_calls_total", &[]);
    let writes = |m: &str| metric_sum(m, "ec2_topology_labeler_label_writes_total", &[]);
    // The three counts at one moment: the controller's are read before and after the others,
    // and taken only when nothing it counts happened in between (a straggler of an earlier
    // scenario, served by the API server but not yet counted by the controller, would be
    // counted on one side only).
    let snapshot = async || -> anyhow::Result<_> {
        for _ in 0..20 {
            let before = l.metrics().await?;
            let (stats, served) = (
                env.mock_admin.stats().await?,
                kube_util::node_writes(&c).await?,
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
            let after = l.metrics().await?;
            if calls(&before) == calls(&after) && writes(&before) == writes(&after) {
                return Ok((after, stats, served));
            }
        }
        anyhow::bail!("the controller kept writing or calling EC2 for 20 snapshots")
    };
    let (m0, s0, w0) = snapshot().await?;
    let pairs: Vec<(NodeSpec, Instance)> = (0..30)
        .map(|k| {
            let s = NodeSpec::ec2(0x10d, k, "p5.48xlarge");
            let i = s.instance(&["nn-s-m", "nn-a-m", &format!("nn-l-m{}", k / 8)]);
            (s, i)
        })
        .collect();
    label_and_wait(env, &c, &pairs).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (m1, s1, w1) = snapshot().await?;
    let (ours, mocks) = (calls(&m1) - calls(&m0), (s1.calls - s0.calls) as f64);
    ensure!(
        ours == mocks && ours >= 1.0,
        "controller counted {ours} EC2 calls, mock-ec2 saw {mocks}"
    );
    let (ours, apiserver) = (writes(&m1) - writes(&m0), w1 - w0);
    ensure!(
        ours == apiserver && ours >= 30.0,
        "controller counted {ours} writes, the API server served {apiserver}"
    );
    for series in [
        "ec2_topology_labeler_reconcile_duration_seconds_bucket",
        "ec2_topology_labeler_ec2_call_duration_seconds_bucket",
        "ec2_topology_labeler_ec2_instances_per_call_bucket",
        "ec2_topology_labeler_cache_hits_total",
        "ec2_topology_labeler_cache_misses_total",
        "ec2_topology_labeler_nodes{state=\"labelled\",reason=\"\"}",
        "ec2_topology_labeler_skipped_nodes_total{reason=\"fargate\"}",
        "ec2_topology_labeler_leader 1",
        "ec2_topology_labeler_build_info",
    ] {
        ensure!(m1.contains(series), "/metrics lacks {series}");
    }
    eprintln!(
        "    EC2 calls: controller {} = mock {}; writes: controller {} = API server {}",
        calls(&m1) - calls(&m0),
        s1.calls - s0.calls,
        writes(&m1) - writes(&m0),
        w1 - w0
    );
    Ok(())
}

async fn missing_rbac_verb_fails_clearly(env: &Env) -> anyhow::Result<()> {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let c = env.admin().await?;
    let roles: Api<ClusterRole> = Api::all(c.clone());
    let original = roles.get("ec2-topology-labeler").await?;
    let log_start = {
        let guard = env.labeler.lock().await;
        guard.as_ref().context("local controller")?.log_text().len()
    };
    let mut cut = original.clone();
    for rule in cut.rules.iter_mut().flatten() {
        if rule.resources.iter().flatten().any(|r| r == "nodes") {
            rule.verbs.retain(|v| v != "patch");
        }
    }
    cut.metadata.managed_fields = None;
    roles
        .replace("ec2-topology-labeler", &Default::default(), &cut)
        .await?;
    let s = NodeSpec::ec2(0x10e, 1, "p5.48xlarge");
    let inst = s.instance(&["nn-s-r", "nn-a-r", "nn-l-r"]);
    env.mock_admin.upsert(&inst).await?;
    kube_util::create_nodes(&c, vec![s.node()]).await?;
    let guard = env.labeler.lock().await;
    let l = guard.as_ref().context("local controller")?;
    // The first refused write logs it (once a minute for the fleet): any node's, from now on.
    let found = eventually("a forbidden error in the controller log", WAIT, || async {
        let log = l.log_text();
        Ok(log
            .get(log_start.min(log.len())..)
            .unwrap_or_default()
            .lines()
            .find(|line| line.contains("cannot patch resource \"nodes\""))
            .map(str::to_string))
    })
    .await;
    // Put the role back whatever happened, then the node gets its labels.
    let mut restore = roles.get("ec2-topology-labeler").await?;
    restore.rules = original.rules.clone();
    roles
        .replace("ec2-topology-labeler", &Default::default(), &restore)
        .await?;
    let line = found?;
    ensure!(
        line.contains("ERROR") && line.contains("forbidden"),
        "clear error line: {line}"
    );
    eprintln!(
        "    controller log: {}",
        line.chars().take(300).collect::<String>()
    );
    drop(guard);
    wait_for_topology(
        &c,
        &s.name,
        &expected(&["nn-s-r", "nn-a-r", "nn-l-r"], &[]),
        Duration::from_secs(60),
    )
    .await
}

async fn leader_failover(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let kc = env
        .cluster
        .controller_kubeconfig
        .clone()
        .context("local control plane")?;
    let mut follower = start_labeler(&kc, &env.ec2_url, &env.dir, "controller-2")?;
    follower.wait_ready(Duration::from_secs(30)).await?;
    wait_leader(&follower, false).await?;
    let writes = |m: &str| metric_sum(m, "ec2_topology_labeler_label_writes_total", &[]);
    let mut guard = env.labeler.lock().await;
    let leader = guard.as_mut().context("local controller")?;
    // While both run, only the leader writes: the API server's count equals the leader's own.
    let (lw0, fw0, aw0) = (
        writes(&leader.metrics().await?),
        writes(&follower.metrics().await?),
        kube_util::node_writes(&c).await?,
    );
    let a = NodeSpec::ec2(0x10f, 1, "p5.48xlarge");
    label_and_wait(
        env,
        &c,
        &[(a.clone(), a.instance(&["nn-s-f", "nn-a-f", "nn-l-f1"]))],
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (lw1, fw1, aw1) = (
        writes(&leader.metrics().await?),
        writes(&follower.metrics().await?),
        kube_util::node_writes(&c).await?,
    );
    ensure!(
        fw1 == fw0 && fw1 == 0.0,
        "the follower wrote ({fw0} -> {fw1})"
    );
    ensure!(
        aw1 - aw0 == lw1 - lw0,
        "API server served {} writes, the leader made {}",
        aw1 - aw0,
        lw1 - lw0
    );
    // The leader dies without releasing its lease.
    leader.kill();
    let killed = Instant::now();
    let b = NodeSpec::ec2(0x10f, 2, "p5.48xlarge");
    let inst = b.instance(&["nn-s-f", "nn-a-f", "nn-l-f2"]);
    env.mock_admin.upsert(&inst).await?;
    kube_util::create_nodes(&c, vec![b.node()]).await?;
    let bound = LEASE + Duration::from_secs(5);
    wait_for_topology(
        &c,
        &b.name,
        &expected(&["nn-s-f", "nn-a-f", "nn-l-f2"], &[]),
        bound,
    )
    .await
    .with_context(|| {
        format!("the follower did not label a new node within lease duration + 5s = {bound:?}")
    })?;
    eprintln!(
        "    new leader labelled a new node {:.1}s after the old leader was killed (lease {}s)",
        killed.elapsed().as_secs_f64(),
        LEASE.as_secs()
    );
    wait_leader(&follower, true).await?;
    // The new leader carries on for the remaining scenarios.
    *guard = Some(follower);
    Ok(())
}

fn hypernodes_api(c: &Client) -> Api<kube::api::DynamicObject> {
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("topology.volcano.sh", "v1alpha1", "HyperNode"),
        "hypernodes",
    );
    Api::all_with(c.clone(), &ar)
}

/// HyperNode name → (tier, member names or label selectors as text).
async fn hypernodes(c: &Client) -> anyhow::Result<BTreeMap<String, (i64, Vec<String>)>> {
    Ok(hypernodes_api(c)
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|h| {
            let spec = &h.data["spec"];
            let members = spec["members"]
                .as_array()
                .map(|ms| {
                    ms.iter()
                        .map(|m| match m["selector"]["exactMatch"]["name"].as_str() {
                            Some(n) => n.to_string(),
                            None => m["selector"]["labelMatch"]["matchLabels"].to_string(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            (
                h.metadata.name.clone().unwrap_or_default(),
                (spec["tier"].as_i64().unwrap_or(0), members),
            )
        })
        .collect())
}

async fn hypernodes_follow_nodes(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let specs: Vec<NodeSpec> = (0..3)
        .map(|k| NodeSpec::ec2(0x110, k, "p5.48xlarge"))
        .collect();
    let paths = [
        ["nn-hs", "nn-ha", "nn-hl1"],
        ["nn-hs", "nn-ha", "nn-hl1"],
        ["nn-hs", "nn-ha", "nn-hl2"],
    ];
    let pairs: Vec<(NodeSpec, Instance)> = specs
        .iter()
        .zip(paths)
        .map(|(s, p)| (s.clone(), s.instance(&p)))
        .collect();
    label_and_wait(env, &c, &pairs).await?;
    let want = |hn: &BTreeMap<String, (i64, Vec<String>)>| {
        hn.get("ec2tl-t1-nn-hl1")
            .is_some_and(|(t, m)| *t == 1 && m[0].contains("nn-hl1"))
            && hn.get("ec2tl-t1-nn-hl2").is_some_and(|(t, _)| *t == 1)
            && hn
                .get("ec2tl-t2-nn-ha")
                .is_some_and(|(t, m)| *t == 2 && m == &["ec2tl-t1-nn-hl1", "ec2tl-t1-nn-hl2"])
            && hn
                .get("ec2tl-t3-nn-hs")
                .is_some_and(|(t, m)| *t == 3 && m == &["ec2tl-t2-nn-ha"])
    };
    eventually("the HyperNode tree for three nodes", WAIT, || async {
        Ok(want(&hypernodes(&c).await?).then_some(()))
    })
    .await?;
    // The node under nn-hl2 moves under a new leaf: nn-hl2 empties and is collected.
    env.mock_admin
        .upsert(&specs[2].instance(&["nn-hs", "nn-ha", "nn-hl3"]))
        .await?;
    kube_util::set_boot_id(&c, &specs[2].name, &e2e::fixtures::boot_id(33)).await?;
    eventually("nn-hl3 in, nn-hl2 collected", WAIT, || async {
        let hn = hypernodes(&c).await?;
        Ok((hn.contains_key("ec2tl-t1-nn-hl3")
            && !hn.contains_key("ec2tl-t1-nn-hl2")
            && hn["ec2tl-t2-nn-ha"].1 == ["ec2tl-t1-nn-hl1", "ec2tl-t1-nn-hl3"])
        .then_some(()))
    })
    .await?;
    // A node that is no EC2 instance, whose labels put nn-hl1 under another parent (nn-hb):
    // left out of what is published (no HyperNode nn-hb, no conflict), and the rest is still
    // published meanwhile (the deleted node's leaf is collected).
    let rogue = NodeSpec::ec2(0x110, 9, "p5.48xlarge").with_provider_id("gce://p/z/rogue");
    let mut node = rogue.node();
    let labels = node.metadata.labels.get_or_insert_default();
    for (i, v) in ["nn-hs", "nn-hb", "nn-hl1"].iter().enumerate() {
        labels.insert(format!("{L}{}", i + 1), v.to_string());
    }
    kube_util::create_nodes(&c, vec![node]).await?;
    kube_util::delete_node(&c, &specs[2].name).await?;
    eventually(
        "nn-hl3 collected while the rogue node is there",
        WAIT,
        || async {
            let hn = hypernodes(&c).await?;
            Ok((!hn.contains_key("ec2tl-t1-nn-hl3")
                && hn["ec2tl-t2-nn-ha"].1 == ["ec2tl-t1-nn-hl1"])
            .then_some(()))
        },
    )
    .await?;
    let hn = hypernodes(&c).await?;
    ensure!(
        !hn.contains_key("ec2tl-t2-nn-hb") && hn["ec2tl-t3-nn-hs"].1 == ["ec2tl-t2-nn-ha"],
        "the rogue node's labels reached the HyperNodes: {hn:?}"
    );
    if let Some(l) = env.labeler.lock().await.as_ref() {
        let m = l.metrics().await?;
        ensure!(
            metric_sum(&m, "ec2_topology_labeler_hypernode_conflicts", &[]) == 0.0,
            "no conflict: the rogue node is not in the view"
        );
        ensure!(
            metric_sum(
                &m,
                "ec2_topology_labeler_unpublished_nodes",
                &[r#"reason="not_ec2""#]
            ) >= 1.0,
            "the rogue node counted as left out"
        );
    }
    eventually(
        "a TopologyNotPublished Event on the rogue node",
        WAIT,
        || async {
            Ok((event_count(&c, &rogue.name, "TopologyNotPublished").await? == 1).then_some(()))
        },
    )
    .await?;
    kube_util::delete_node(&c, &rogue.name).await?;
    let all = hypernodes(&c).await?;
    eprintln!(
        "    {} HyperNodes for the cluster; tiers 1-4 present: {:?}",
        all.len(),
        all.values()
            .map(|(t, _)| *t)
            .collect::<std::collections::BTreeSet<_>>()
    );
    Ok(())
}

fn kai_topologies(c: &Client) -> Api<kube::api::DynamicObject> {
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("kai.scheduler", "v1alpha1", "Topology"),
        "topologies",
    );
    Api::all_with(c.clone(), &ar)
}

/// Events about an object of any kind in `default` (where cluster-scoped objects' go).
async fn events_about(c: &Client, kind: &str, name: &str, reason: &str) -> anyhow::Result<usize> {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.clone(), "default");
    Ok(events
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                })
        })
        .count())
}

/// `--kai-topology`: a 3-level KAI Topology for a 3-layer fleet. When a 4-layer node joins, a
/// 4-level Topology is created beside it (and an Event says so; KAI leaves a node out of a
/// Topology lacking one of its levels), the first stays as it was, and KAI's CRD refuses any
/// change of levels in place. Runs before any 4-layer node.
async fn kai_topology_follows_the_depth(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let kai = kai_topologies(&c);
    let level = |n: usize| -> Vec<String> {
        (1..=n)
            .map(|i| format!("{L}{i}"))
            .chain(["kubernetes.io/hostname".to_string()])
            .collect()
    };
    e2e::env::restart_labeler_with(env, &["--kai-topology=true", "--kai-topology-name=kai-e2e"])
        .await?;
    let result = async {
        let s3 = NodeSpec::ec2(0x116, 1, "p5.48xlarge");
        label_and_wait(env, &c, &[(s3.clone(), s3.instance(&["nn-kai-s", "nn-kai-a3", "nn-kai-l3"]))])
            .await?;
        let three = eventually("KAI Topology kai-e2e", WAIT, || async {
            Ok(kai.get_opt("kai-e2e").await?)
        })
        .await?;
        ensure!(levels(&three) == level(3), "levels: {:?}", levels(&three));
        ensure!(
            kai.get_opt("kai-e2e-4-layer").await?.is_none(),
            "no 4-level Topology before a 4-layer node"
        );
        // KAI's rule holds on this API server: the levels cannot be changed in place.
        let changed = kai
            .patch(
                "kai-e2e",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"levels": [{"nodeLabel": format!("{L}1")}]}})),
            )
            .await;
        ensure!(
            matches!(&changed, Err(kube::Error::Api(e)) if e.message.contains("immutable")),
            "levels changed in place: {changed:?}"
        );
        let s4 = NodeSpec::ec2(0x116, 2, "p6-b200.48xlarge");
        label_and_wait(
            env,
            &c,
            &[(s4.clone(), s4.instance(&["nn-kai-s", "nn-kai-a4", "nn-kai-b4", "nn-kai-l4"]))],
        )
        .await?;
        let four = eventually("KAI Topology kai-e2e-4-layer", WAIT, || async {
            Ok(kai.get_opt("kai-e2e-4-layer").await?)
        })
        .await?;
        ensure!(levels(&four) == level(4), "levels: {:?}", levels(&four));
        let kept = kai.get("kai-e2e").await?;
        ensure!(levels(&kept) == level(3), "the first Topology kept its levels");
        eventually("an Event saying the Topology was replaced", WAIT, || async {
            let n = events_about(&c, "Topology", "kai-e2e-4-layer", "TopologyLevelsChanged").await?;
            Ok((n > 0).then_some(()))
        })
        .await?;
        eprintln!(
            "    3-layer fleet: kai-e2e {:?}; a 4-layer node joined: kai-e2e-4-layer {:?}, kai-e2e kept",
            levels(&kept),
            levels(&four)
        );
        anyhow::Ok(())
    }
    .await;
    e2e::env::restart_labeler_with(env, &[]).await?;
    result
}

/// `--slurm-topology-configmap` and `--slinky-annotation`: a ConfigMap of that name that is not
/// ours is left alone; once it is gone ours is created with Slurm's files, and both it and the
/// per-node annotation follow a node that moves; turned off, the annotation we wrote is removed.
async fn slurm_configmap_and_slinky_annotation(env: &Env) -> anyhow::Result<()> {
    const SPEC: &str = "topology.slinky.slurm.net/spec";
    let c = env.admin().await?;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(c.clone(), "slurm");
    let theirs = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "slurm-topology", "namespace": "slurm"}, "data": {"topology.yaml": "theirs"}});
    cms.patch(
        "slurm-topology",
        &PatchParams::apply("someone-else"),
        &Patch::Apply(theirs),
    )
    .await?;
    e2e::env::restart_labeler_with(
        env,
        &[
            "--slurm-topology-configmap=slurm/slurm-topology",
            "--slinky-annotation=true",
            "--slinky-block-topology=topo-block",
        ],
    )
    .await?;
    let result = async {
        let s = NodeSpec::ec2(0x117, 1, "p6e-gb200.36xlarge");
        let mut i = s.instance(&["nn-ss1", "nn-sa1", "nn-sl1"]);
        i.capacity_block_id = Some("cr-0511e0bb10c0ffee0".into());
        label_and_wait(env, &c, &[(s.clone(), i.clone())]).await?;
        let annotation = || async {
            let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
            let n = api.get(&s.name).await?;
            anyhow::Ok(n.metadata.annotations.unwrap_or_default().get(SPEC).cloned())
        };
        eventually("the Slinky annotation", WAIT, || async {
            Ok((annotation().await?.as_deref() == Some("topo-switch:nn-sl1,topo-block:cr-0511e0bb10c0ffee0")).then_some(()))
        })
        .await?;
        // Theirs: never written, reported.
        eventually("the foreign ConfigMap reported", WAIT, || async {
            let guard = env.labeler.lock().await;
            let Some(l) = guard.as_ref() else {
                anyhow::bail!("no local controller");
            };
            let m = l.metrics().await?;
            Ok((metric_sum(&m, "ec2_topology_labeler_publish_errors_total", &["publisher=\"slurm\""]) > 0.0).then_some(()))
        })
        .await?;
        let live = cms.get("slurm-topology").await?;
        ensure!(
            live.data.unwrap_or_default().get("topology.yaml").map(String::as_str) == Some("theirs"),
            "a ConfigMap that is not ours was changed"
        );
        // Gone: ours is created, with both files naming the node under its leaf switch.
        cms.delete("slurm-topology", &Default::default()).await?;
        let data = eventually("our Slurm ConfigMap", WAIT, || async {
            let Some(cm) = cms.get_opt("slurm-topology").await? else {
                return Ok(None);
            };
            Ok(cm.data.filter(|d| d.get("topology.yaml").is_some_and(|y| y.contains(&s.name))))
        })
        .await?;
        let (yaml, conf) = (&data["topology.yaml"], &data["topology.conf"]);
        ensure!(yaml.contains("- topology: topo-switch") && yaml.contains("switch: nn-sl1"), "{yaml}");
        ensure!(conf.lines().any(|l| l.starts_with("SwitchName=nn-sl1 ") && l.contains(&s.name)), "{conf}");
        // The instance moves (stop/start): annotation and ConfigMap follow.
        env.mock_admin
            .upsert(&{
                let mut moved = i.clone();
                moved.network_nodes = vec!["nn-ss1".into(), "nn-sa1".into(), "nn-sl2".into()];
                moved
            })
            .await?;
        kube_util::set_boot_id(&c, &s.name, &e2e::fixtures::boot_id(117)).await?;
        eventually("the annotation follows the move", WAIT, || async {
            Ok((annotation().await?.as_deref() == Some("topo-switch:nn-sl2,topo-block:cr-0511e0bb10c0ffee0")).then_some(()))
        })
        .await?;
        eventually("the ConfigMap follows the move", WAIT, || async {
            let cm = cms.get("slurm-topology").await?;
            Ok(cm.data.unwrap_or_default().get("topology.conf").is_some_and(|c| {
                c.lines().any(|l| l.starts_with("SwitchName=nn-sl2 ") && l.contains(&s.name))
            }).then_some(()))
        })
        .await?;
        eprintln!("    annotation and ConfigMap followed the node from nn-sl1 to nn-sl2; a foreign ConfigMap was left alone");
        anyhow::Ok(s)
    }
    .await;
    e2e::env::restart_labeler_with(env, &[]).await?;
    let s = result?;
    eventually("the annotation retired once turned off", WAIT, || async {
        let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
        let n = api.get(&s.name).await?;
        Ok((!n
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(SPEC))
        .then_some(()))
    })
    .await?;
    ensure!(
        cms.get_opt("slurm-topology").await?.is_some(),
        "the ConfigMap is never deleted"
    );
    Ok(())
}

/// Every recipe in docs/schedulers.md, read from the doc: the objects whose API this server
/// serves (Kueue's, KAI's, core) are accepted by a server-side dry-run apply; each Topology has
/// the levels the controller would publish; the Node example carries the Slinky annotation the
/// controller would write for its labels.
async fn schedulers_doc_recipes_are_accepted(env: &Env) -> anyhow::Result<()> {
    use ec2_topology_labeler::{
        labels::{LabelScheme, SlinkySpec, slinky_spec},
        publish::kueue,
    };
    let c = env.admin().await?;
    kube_util::ensure_namespace(&c, "ml").await?;
    kube_util::ensure_namespace(&c, e2e::schedulers::VOLCANO_NAMESPACE).await?;
    // The scheduler recipes, and the startup taint's (Karpenter NodePools).
    let doc = ["docs/schedulers.md", "docs/startup-taint.md"]
        .iter()
        .map(|d| std::fs::read_to_string(e2e::repo_root().join(d)))
        .collect::<Result<Vec<_>, _>>()?
        .join("\n");
    let mut blocks = Vec::new();
    let mut rest = doc.as_str();
    while let Some(start) = rest.find("```yaml\n") {
        let body = &rest[start + 8..];
        let end = body.find("```").context("an unterminated yaml block")?;
        blocks.push(&body[..end]);
        rest = &body[end..];
    }
    let (mut accepted, mut skipped, mut checked) = (Vec::new(), Vec::new(), 0);
    for block in &blocks {
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(block)
            .with_context(|| format!("a yaml block of docs/schedulers.md parses:\n{block}"))?;
        for d in docs
            .into_iter()
            .filter(|d| d["kind"].is_string() && d["metadata"]["name"].is_string())
        {
            let kind = d["kind"].as_str().unwrap_or_default().to_string();
            let name = d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if kind == "Topology" {
                let levels: Vec<String> = d["spec"]["levels"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|l| l["nodeLabel"].as_str().map(String::from))
                    .collect();
                let scheme = LabelScheme::default();
                let ultraserver = scheme
                    .capacity_block_key
                    .as_ref()
                    .is_some_and(|k| levels.contains(k));
                let clique = levels.iter().any(|l| l == "nvidia.com/gpu.clique");
                let depth = levels
                    .len()
                    .saturating_sub(1 + usize::from(ultraserver) + usize::from(clique));
                let published = if ultraserver {
                    ec2_topology_labeler::publish::topology::ultraserver_levels(
                        &scheme, depth, true, clique,
                    )
                    .unwrap_or_default()
                } else {
                    kueue::levels(&scheme, depth, true)
                };
                ensure!(
                    levels == published,
                    "{kind} {name} in the doc has levels the controller would not publish: {levels:?}"
                );
                checked += 1;
            }
            if kind == "Node" {
                let labels: BTreeMap<String, String> =
                    serde_json::from_value(d["metadata"]["labels"].clone())?;
                let scheme = LabelScheme::default();
                let spec = SlinkySpec {
                    tree_topology: "topo-switch".into(),
                    block_topology: Some("topo-block".into()),
                };
                let want = slinky_spec(&scheme, &spec, &labels);
                ensure!(
                    d["metadata"]["annotations"]["topology.slinky.slurm.net/spec"].as_str()
                        == want.as_deref(),
                    "the doc's Slinky annotation is not what the controller writes: {want:?}"
                );
                checked += 1;
                continue;
            }
            let obj: kube::api::DynamicObject = serde_json::from_value(d.clone())?;
            let gvk = kube::api::GroupVersionKind::try_from(
                obj.types.as_ref().context("apiVersion and kind")?,
            )?;
            let Ok((ar, caps)) = kube::discovery::pinned_kind(&c, &gvk).await else {
                skipped.push(format!("{} {kind}/{name}", gvk.group));
                continue;
            };
            let api: Api<kube::api::DynamicObject> = match caps.scope {
                kube::discovery::Scope::Namespaced => Api::namespaced_with(
                    c.clone(),
                    d["metadata"]["namespace"].as_str().unwrap_or("default"),
                    &ar,
                ),
                kube::discovery::Scope::Cluster => Api::all_with(c.clone(), &ar),
            };
            // Forced: the objects may exist already (the Kueue scenarios made some), with fields
            // Kueue's own manager set; a dry run changes nothing either way.
            api.patch(
                &name,
                &PatchParams::apply("e2e-docs").force().dry_run(),
                &Patch::Apply(d),
            )
            .await
            .with_context(|| format!("the doc's {kind} {name} is refused by the API server"))?;
            accepted.push(format!("{kind}/{name}"));
        }
    }
    eprintln!(
        "    {} yaml blocks: accepted (dry run) {accepted:?}; checked {checked} against the controller; not served here {skipped:?}",
        blocks.len()
    );
    for want in [
        "Topology/aws-network-uniform",
        "Topology/aws-network-ultraserver",
        "ResourceFlavor/gb200",
        "Job/nvl72-slices",
        "ResourceFlavor/gpu",
        "PyTorchJob/allreduce-kai",
        "Queue/training",
        "ClusterQueue/training",
        "Job/allreduce-volcano",
        "ConfigMap/volcano-controller-configmap",
        "NodePool/gpu-training",
        "NodePool/existing-gpu-pool",
    ] {
        ensure!(accepted.iter().any(|a| a == want), "{want} not exercised");
    }
    ensure!(checked >= 4, "the Topologies and the Node example checked");
    Ok(())
}

/// Coverage gauges per instance type and zone (the zone the nodes' label names, issue 26.5); a node
/// we label with fewer layers than the Kueue Topology has gets one `NotInSchedulerTopology`
/// Warning Event.
async fn coverage_is_counted_and_short_nodes_reported(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    // EC2 is documented to give 3 or 4 layers; an answer of 2 is labelled as it is, and Kueue's
    // 3-level Topology would leave the node out.
    let s = NodeSpec::ec2(0x118, 1, "cov-e2e.48xlarge");
    let ok: Vec<NodeSpec> = (2..5)
        .map(|k| NodeSpec::ec2(0x118, k, "cov-e2e.48xlarge"))
        .collect();
    let mut pairs = vec![(s.clone(), s.instance(&["nn-cov-s", "nn-cov-a"]))];
    pairs.extend(
        ok.iter()
            .map(|o| (o.clone(), o.instance(&["nn-cov-s", "nn-cov-a", "nn-cov-l"]))),
    );
    label_and_wait(env, &c, &pairs).await?;
    // The cell is the instance type in the nodes' zone (their topology.kubernetes.io/zone).
    let cell = r#"instance_type="cov-e2e.48xlarge",zone="us-west-2a""#;
    let counts = eventually("coverage gauges for cov-e2e", WAIT, || async {
        let guard = env.labeler.lock().await;
        let Some(l) = guard.as_ref() else {
            anyhow::bail!("no local controller");
        };
        let m = l.metrics().await?;
        let get = |name: &str, extra: &[&str]| {
            let mut labels = vec![cell];
            labels.extend_from_slice(extra);
            metric_sum(&m, name, &labels)
        };
        let counts = (
            get("ec2_topology_labeler_coverage_nodes", &[]),
            get("ec2_topology_labeler_coverage_full_nodes", &[]),
            get(
                "ec2_topology_labeler_coverage_layer_nodes",
                &[r#"layer="3""#],
            ),
        );
        Ok((counts.0 == 4.0).then_some(counts))
    })
    .await?;
    ensure!(
        counts == (4.0, 3.0, 3.0),
        "nodes, full, with layer 3: {counts:?}"
    );
    eventually(
        "a NotInSchedulerTopology Event on the 2-layer node",
        WAIT,
        || async {
            Ok((event_count(&c, &s.name, "NotInSchedulerTopology").await? == 1).then_some(()))
        },
    )
    .await?;
    for o in &ok {
        ensure!(
            event_count(&c, &o.name, "NotInSchedulerTopology").await? == 0,
            "{} reported",
            o.name
        );
    }
    tokio::time::sleep(Duration::from_secs(13)).await;
    ensure!(
        event_count(&c, &s.name, "NotInSchedulerTopology").await? == 1,
        "reported once, not at every count"
    );
    eprintln!(
        "    cov-e2e: 4 nodes, 3 fully labelled, 3 with layer 3; the 2-layer node reported once"
    );
    Ok(())
}

/// The values of the lowest level of a Kueue v1beta2 topology assignment, one per domain:
/// each slice lists, per level, either one value shared by its domains (`universal`) or one per
/// domain (`individual`: `prefix` + each of `roots` + `suffix`).
fn decode_assignment(ta: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for slice in ta["slices"].as_array().into_iter().flatten() {
        let count = slice["domainCount"].as_u64().unwrap_or(0) as usize;
        let Some(lowest) = slice["valuesPerLevel"].as_array().and_then(|v| v.last()) else {
            continue;
        };
        if let Some(u) = lowest["universal"].as_str() {
            out.extend(std::iter::repeat_n(u.to_string(), count));
        } else {
            let ind = &lowest["individual"];
            let (prefix, suffix) = (
                ind["prefix"].as_str().unwrap_or(""),
                ind["suffix"].as_str().unwrap_or(""),
            );
            for root in ind["roots"].as_array().into_iter().flatten() {
                out.push(format!("{prefix}{}{suffix}", root.as_str().unwrap_or("")));
            }
        }
    }
    out
}

async fn controller_is_healthy(env: &Env) -> anyhow::Result<()> {
    let mut guard = env.labeler.lock().await;
    let Some(l) = guard.as_mut() else {
        return Ok(());
    };
    ensure!(l.alive(), "controller still running");
    let log = l.log_text();
    ensure!(!log.contains("panicked"), "no panic in the controller log");
    ensure!(
        !log.contains("AKIDEXAMPLE") && !log.contains("e2e-not-a-secret"),
        "no credentials in logs"
    );
    Ok(())
}

/// Issue 26.12: `make demo` stopped by SIGTERM (a `timeout`, a process manager) instead of Ctrl-C
/// stops every process it started: no kube-apiserver, etcd or mock-ec2 is left running.
async fn demo_stops_everything_on_sigterm(env: &Env) -> anyhow::Result<()> {
    use std::io::{BufRead, BufReader};
    let dir = env.dir.join("demo-sigterm");
    std::fs::create_dir_all(&dir)?;
    let mut demo = std::process::Command::new(e2e::bin_dir().join("e2e-cluster"))
        .arg("--dir")
        .arg(&dir)
        .arg("demo")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let stdout = demo.stdout.take().context("demo stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.contains("press Ctrl-C") {
                let _ = tx.send(());
            }
        }
    });
    let started = rx.recv_timeout(Duration::from_secs(180));
    // Every process whose command line names the demo's directory: what it started.
    let needle = dir.to_string_lossy().to_string();
    let demo_pid = demo.id();
    let theirs = || -> Vec<(u32, String)> {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                (pid != demo_pid && cmd.contains(&needle)).then_some((pid, cmd))
            })
            .collect()
    };
    let before = theirs();
    // SAFETY: kill(2) on the demo's own pid, a child of this process.
    unsafe {
        libc::kill(demo_pid as i32, libc::SIGTERM);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = demo.try_wait()? {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            let _ = demo.kill();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let left = theirs();
    for (pid, _) in &left {
        // SAFETY: kill(2) on a leftover of the failed check, so it does not outlive the test.
        unsafe {
            libc::kill(*pid as i32, libc::SIGKILL);
        }
    }
    started.map_err(|_| anyhow::anyhow!("the demo never said it was running"))?;
    ensure!(
        before.len() >= 3,
        "the demo's processes were not found: {before:?}"
    );
    ensure!(status.is_some(), "the demo did not exit on SIGTERM");
    ensure!(
        left.is_empty(),
        "left running after SIGTERM: {:?}",
        left.iter()
            .map(|(p, c)| format!("{p}: {}", &c[..c.len().min(80)]))
            .collect::<Vec<_>>()
    );
    eprintln!(
        "    SIGTERM stopped the demo and its {} processes",
        before.len()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------

fn scenarios() -> Vec<(&'static str, ScenarioFn, bool)> {
    vec![
        scenario!(three_layer_node, false),
        scenario!(kai_topology_follows_the_depth, true),
        scenario!(four_layer_node, false),
        scenario!(ultraserver_capacity_block, false),
        scenario!(odd_placement_group_name, false),
        scenario!(not_ec2_nodes_are_skipped, false),
        scenario!(unsupported_instance_type, false),
        scenario!(provider_id_set_later, false),
        scenario!(reboot_and_move, false),
        scenario!(four_to_three_layers, false),
        scenario!(capacity_block_arrives_late, false),
        scenario!(burst_is_batched, false),
        scenario!(throttled_half_the_time, false),
        scenario!(ec2_down_removes_nothing, true),
        scenario!(metrics_match_what_happened, true),
        scenario!(every_reason_says_why_once, true),
        scenario!(nvlink_cliques_are_checked_against_ultraservers, true),
        scenario!(ultraserver_interconnect_health, true),
        scenario!(ultraserver_shape_labels, true),
        scenario!(missing_rbac_verb_fails_clearly, true),
        scenario!(a_revoked_node_watch_fails_readiness_until_restored, true),
        scenario!(a_panicking_background_task_restarts, true),
        scenario!(leader_failover, true),
        scenario!(plan_shows_changes_and_writes_nothing, true),
        scenario!(turned_off_extras_are_removed_at_start_up, true),
        scenario!(turned_off_features_are_retired, true),
        scenario!(admission_policy_limits_the_controllers_node_writes, true),
        scenario!(exclusive_keys_refuse_every_other_writer, true),
        scenario!(
            admission_policy_holds_the_controller_to_its_scheduler_objects,
            true
        ),
        scenario!(
            admission_policy_holds_the_controller_to_its_slurm_configmap,
            true
        ),
        scenario!(deploy_manifests_apply_cleanly, false),
        scenario!(tree_min_labelled_checks_the_labels, false),
        scenario!(tree_reservations_show_capacity_by_network_node, false),
        scenario!(fit_names_the_domains_that_take_the_gang, true),
        scenario!(reserved_capacity_metrics_follow_the_reservations, true),
        scenario!(startup_taint_and_condition, true),
        scenario!(hypernodes_follow_nodes, true),
        scenario!(forged_labels_never_reach_a_scheduler, true),
        scenario!(kueue_topology_published_and_never_changed, true),
        scenario!(kueue_admits_into_one_layer3_domain, true),
        scenario!(kueue_one_topology_for_a_mixed_fleet, true),
        scenario!(kueue_places_slices_inside_one_ultraserver, true),
        scenario!(kueue_places_gangs_inside_one_clique, true),
        scenario!(fit_agrees_with_kueue, true),
        scenario!(volcano_places_gangs_on_our_hypernodes, true),
        scenario!(volcano_places_gangs_inside_one_ultraserver, true),
        scenario!(volcano_places_gangs_inside_one_clique, true),
        scenario!(volcano_places_gangs_by_its_label_discovery, true),
        scenario!(volcano_on_a_mixed_fleet_both_ways, true),
        scenario!(kai_places_gangs_on_our_topology, true),
        scenario!(slurm_configmap_and_slinky_annotation, true),
        scenario!(slurm_leaves_out_a_disagreeing_node, true),
        scenario!(schedulers_doc_recipes_are_accepted, true),
        scenario!(coverage_is_counted_and_short_nodes_reported, true),
        scenario!(dashboard_queries_match_live_metrics, true),
        scenario!(steady_state_is_silent, false),
        scenario!(a_forged_record_is_re_verified, true),
        scenario!(quiet_over_three_ttls, true),
        scenario!(uninstall_leaves_only_labels, true),
        scenario!(controller_is_healthy, false),
        scenario!(demo_stops_everything_on_sigterm, false),
        scenario!(irsa_credentials_rotate_while_nodes_join, true),
        scenario!(pod_identity_credentials_rotate_while_nodes_join, true),
        scenario!(
            expired_and_refused_credentials_are_answered_as_aws_does,
            true
        ),
        // Relabels every node three times over: after the scenarios that read Volcano's label
        // discovery settled (the churn sets its rebuilds racing), before the one that starts it
        // from scratch.
        scenario!(label_presets_rewrite_the_keys, true),
        // Last: it deletes every Node the others left (see its doc).
        scenario!(volcano_label_discovery_on_a_mixed_fleet, true),
    ]
}

/// make test's second pass, at the oldest Kubernetes the chart accepts (`E2E_AT_THE_OLDEST=1`
/// with the oldest control plane): the scenarios whose outcome rests on what the API server does
/// and has changed between minors, not on our own logic or mock-ec2, which the first pass covers
/// the same at any version. KAI's placement is not here: KAI's scheduler (pinned commit) lists
/// `resource.k8s.io/v1`, GA in 1.34; our KAI Topologies are (`kai_topology_follows_the_depth`).
const AT_THE_OLDEST: &[&str] = &[
    // Server-side apply of labels and annotations: set, changed, given up, field ownership.
    "three_layer_node",
    "four_layer_node",
    "ultraserver_capacity_block",
    "reboot_and_move",
    "four_to_three_layers",
    "turned_off_extras_are_removed_at_start_up",
    "turned_off_features_are_retired",
    // The status subresource, taints and the node condition.
    "startup_taint_and_condition",
    // Leases, watches (bookmarks, resourceVersions), RBAC answers, Events.
    "leader_failover",
    "a_revoked_node_watch_fails_readiness_until_restored",
    "missing_rbac_verb_fails_clearly",
    "steady_state_is_silent",
    "every_reason_says_why_once",
    // ValidatingAdmissionPolicy (CEL functions and optional fields as 1.30 has them).
    "admission_policy_limits_the_controllers_node_writes",
    "exclusive_keys_refuse_every_other_writer",
    "admission_policy_holds_the_controller_to_its_scheduler_objects",
    "admission_policy_holds_the_controller_to_its_slurm_configmap",
    // CRDs and the schedulers reading them, ConfigMaps, Pods.
    "hypernodes_follow_nodes",
    "volcano_places_gangs_on_our_hypernodes",
    "kueue_topology_published_and_never_changed",
    "kueue_admits_into_one_layer3_domain",
    "kai_topology_follows_the_depth",
    "forged_labels_never_reach_a_scheduler",
    "schedulers_doc_recipes_are_accepted",
    "slurm_configmap_and_slinky_annotation",
    "fit_names_the_domains_that_take_the_gang",
    // The install paths: plain manifests, Helm's hooks.
    "deploy_manifests_apply_cleanly",
    "uninstall_leaves_only_labels",
];

fn scenarios_at_the_oldest() -> Vec<(&'static str, ScenarioFn, bool)> {
    let all = scenarios();
    for name in AT_THE_OLDEST {
        assert!(
            all.iter().any(|(n, _, _)| n == name),
            "AT_THE_OLDEST names {name}, which is no scenario"
        );
    }
    all.into_iter()
        .filter(|(n, _, _)| AT_THE_OLDEST.contains(n))
        .collect()
}

/// Where the suite is cut into lanes that run side by side, each on an environment of its own
/// (`e2e::env::run_in_lanes`): each names the first scenario of a lane. Chosen so the lanes take
/// about the same time (CI's log prints each scenario's), with what must run in order in one
/// lane: the Volcano scenarios, then the relabelling and the one that deletes every Node.
const LANE_STARTS: &[&str] = &["volcano_places_gangs_on_our_hypernodes"];

fn main() {
    if std::env::var_os("E2E_AT_THE_OLDEST").is_some_and(|v| v == "1") {
        e2e::env::run("ec2tl-e2e", scenarios_at_the_oldest)
    } else {
        e2e::env::run_in_lanes("ec2tl-e2e", scenarios, LANE_STARTS)
    }
}

/// The verification ledger's records in `namespace` (every shard the controller wrote, by its
/// label), read without the key: node name → record.
async fn ledger_records(
    client: &Client,
    namespace: &str,
) -> anyhow::Result<BTreeMap<String, ec2_topology_labeler::verified::Verified>> {
    use ec2_topology_labeler::ledger;
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), namespace);
    let shards = api
        .list(&kube::api::ListParams::default().labels(ledger::LEDGER_LABEL))
        .await?;
    let mut all = BTreeMap::new();
    for cm in shards.items {
        let records = ledger::read_unchecked(&cm.data.clone().unwrap_or_default())
            .map_err(|e| anyhow::anyhow!("shard {}: {e}", kube::ResourceExt::name_any(&cm)))?;
        all.extend(records);
    }
    Ok(all)
}

/// Waits until the ledger in `namespace` holds a record for each of `nodes` (it is written
/// every 10 s while there is news).
async fn wait_for_ledger(
    client: &Client,
    namespace: &str,
    nodes: &[&str],
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let records = ledger_records(client, namespace).await?;
        let missing: Vec<&&str> = nodes
            .iter()
            .filter(|n| !records.contains_key(**n))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!("the ledger holds no record of {missing:?} after {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

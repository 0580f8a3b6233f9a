//! The fault suite: every failure path is a scenario with a figure. EC2 throttled, down, slow,
//! erroring, lying; the API server restarted; nodes deleted mid-lookup; another writer fighting
//! over our labels; the controller killed mid-batch; hostile providerIDs. Each asserts that no
//! correct label was removed or changed, and reports how long convergence took after the fault
//! cleared. The table in `docs/reliability.md` is written from this run.
//!
//! `make test-faults` (CI runs it after `make test`).

use std::{
    collections::BTreeMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};
use e2e::{
    env::{Env, L, ScenarioFn, expected, expected_of, label_and_wait, start_labeler},
    fixtures::NodeSpec,
    kube_util::{self, wait_for_topology},
    labeler::metric_sum,
    scenario,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use mock_ec2::{Faults, Instance};
use serde_json::json;

/// One row of docs/reliability.md.
struct Row {
    scenario: &'static str,
    fault: String,
    outcome: String,
    convergence: Option<f64>,
}

static REPORT: Mutex<Vec<Row>> = Mutex::new(Vec::new());

fn report(scenario: &'static str, fault: &str, outcome: &str, convergence: Option<Duration>) {
    REPORT.lock().unwrap_or_else(|e| e.into_inner()).push(Row {
        scenario,
        fault: fault.into(),
        outcome: outcome.into(),
        convergence: convergence.map(|d| d.as_secs_f64()),
    });
}

/// The fault window of the long EC2 faults (the issue asks for 60 s).
fn fault_window() -> Duration {
    std::env::var("FAULT_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(60))
}

/// A labelled fleet for one scenario: `n` nodes under prefix `p`.
fn fleet(p: u32, n: u32) -> Vec<(NodeSpec, Instance)> {
    (0..n)
        .map(|k| {
            let s = NodeSpec::ec2(p, k, "p5.48xlarge");
            let i = s.instance(&[
                &format!("nn-s-{p:x}"),
                &format!("nn-a-{p:x}"),
                &format!("nn-l-{p:x}-{}", k / 4),
            ]);
            (s, i)
        })
        .collect()
}

/// Every node of `pairs` carries exactly the labels of either its instance as it was, or as
/// it is now (a move EC2 did report): never fewer, never something else.
async fn nothing_lost(
    c: &Client,
    pairs: &[(NodeSpec, Instance)],
    moved: &BTreeMap<String, Instance>,
) -> anyhow::Result<()> {
    for (s, i) in pairs {
        let have = kube_util::topology_labels(&kube_util::labels(c, &s.name).await?);
        let before = expected_of(i);
        let after = moved.get(&s.name).map(expected_of);
        ensure!(
            have == before || Some(&have) == after.as_ref(),
            "{} lost or changed labels during the fault: {have:?}",
            s.name
        );
    }
    Ok(())
}

/// Label a fleet, apply `fault` for `window` while a quarter of the fleet reboots (half of those
/// moved), assert nothing correct was lost, clear the fault and time convergence.
async fn ec2_fault(
    env: &Env,
    name: &'static str,
    p: u32,
    window: Duration,
    fault: Faults,
    down: bool,
) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let pairs = fleet(p, 24);
    label_and_wait(env, &c, &pairs).await?;
    let mut moved = BTreeMap::new();
    for (k, (s, i)) in pairs.iter().enumerate().filter(|(k, _)| k % 4 == 0) {
        if k % 8 == 0 {
            let mut m = i.clone();
            m.network_nodes[2] = format!("{}-moved", m.network_nodes[2]);
            moved.insert(s.name.clone(), m);
        }
    }
    env.mock_admin
        .upsert_all(&moved.values().cloned().collect::<Vec<_>>())
        .await?;
    let mut scenario = None;
    if down {
        let mut guard = env.mock.lock().await;
        scenario = Some(guard.as_mut().context("local mock")?.down().await?);
    } else {
        env.mock_admin.set_faults(&fault).await?;
    }
    for (k, (s, _)) in pairs.iter().enumerate().filter(|(k, _)| k % 4 == 0) {
        kube_util::set_boot_id(&c, &s.name, &e2e::fixtures::boot_id(9_000 + k as u32)).await?;
    }
    let fault_started = Instant::now();
    let want_now = |s: &NodeSpec, i: &Instance| {
        let now = moved.get(&s.name).unwrap_or(i);
        expected_of(now)
    };
    // Check repeatedly during the fault, not only at its end. While EC2 still answers part of
    // the calls (partial throttling), the moved nodes must be relabelled during the fault.
    let partial = !down && fault.throttle_fraction > 0.0 && fault.throttle_fraction < 1.0;
    let mut relabelled_during: Option<Duration> = None;
    while fault_started.elapsed() < window {
        nothing_lost(&c, &pairs, &moved).await?;
        if partial && relabelled_during.is_none() {
            let mut all = true;
            for (s, i) in pairs.iter().filter(|(s, _)| moved.contains_key(&s.name)) {
                all &= kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?)
                    == want_now(s, i);
            }
            if all {
                relabelled_during = Some(fault_started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(if partial { 250 } else { 2_000 })).await;
    }
    if partial {
        let took = relabelled_during.context("moved nodes not relabelled during the fault")?;
        eprintln!(
            "    {} moved nodes relabelled {:.1}s into the fault",
            moved.len(),
            took.as_secs_f64()
        );
        ensure!(
            took <= Duration::from_secs(20),
            "moved nodes took {took:?} to be relabelled under {:.0}% throttling (goal: 20 s)",
            fault.throttle_fraction * 100.0
        );
    }
    if let Some(s) = scenario {
        env.mock
            .lock()
            .await
            .as_mut()
            .context("local mock")?
            .up(&s)
            .await?;
    } else {
        env.mock_admin.set_faults(&Faults::default()).await?;
    }
    let cleared = Instant::now();
    for (s, i) in &pairs {
        wait_for_topology(&c, &s.name, &want_now(s, i), Duration::from_secs(120)).await?;
    }
    let took = cleared.elapsed();
    let outcome = match relabelled_during {
        Some(d) => format!(
            "no label removed or changed; moved nodes relabelled {:.1}s into the fault",
            d.as_secs_f64()
        ),
        None => "no label removed or changed; moved nodes relabelled after".into(),
    };
    report(name, &describe(&fault, down, window), &outcome, Some(took));
    eprintln!(
        "    converged {:.1}s after the fault cleared",
        took.as_secs_f64()
    );
    // Waiting nodes are re-checked as soon as EC2 answers again (the batcher probes while it
    // fails): convergence is a matter of seconds, not of where each node's backoff stands.
    ensure!(
        took <= Duration::from_secs(10),
        "took {took:?} to converge after the fault cleared (goal: a few seconds)"
    );
    Ok(())
}

fn describe(f: &Faults, down: bool, window: Duration) -> String {
    let w = window.as_secs();
    if down {
        return format!("EC2 unreachable (connection refused) for {w}s");
    }
    if f.throttle_fraction > 0.0 {
        return format!(
            "{:.0}% of calls `RequestLimitExceeded` for {w}s",
            f.throttle_fraction * 100.0
        );
    }
    if f.latency_ms > 0 {
        return format!("{} ms per call for {w}s", f.latency_ms);
    }
    if f.error_5xx_fraction > 0.0 {
        return format!(
            "HTTP 500 `InternalError` on {:.0}% of calls for {w}s",
            f.error_5xx_fraction * 100.0
        );
    }
    if f.malformed_fraction > 0.0 || f.truncated_fraction > 0.0 {
        return format!("malformed / truncated XML bodies for {w}s");
    }
    format!("{f:?}")
}

async fn throttled_50_percent(env: &Env) -> anyhow::Result<()> {
    ec2_fault(
        env,
        "throttled_50_percent",
        0x201,
        fault_window(),
        Faults {
            throttle_fraction: 0.5,
            ..Faults::default()
        },
        false,
    )
    .await
}

async fn throttled_100_percent(env: &Env) -> anyhow::Result<()> {
    ec2_fault(
        env,
        "throttled_100_percent",
        0x202,
        fault_window(),
        Faults {
            throttle_fraction: 1.0,
            ..Faults::default()
        },
        false,
    )
    .await
}

async fn ec2_outage(env: &Env) -> anyhow::Result<()> {
    ec2_fault(
        env,
        "ec2_outage",
        0x203,
        fault_window(),
        Faults::default(),
        true,
    )
    .await
}

async fn ec2_slow_5s(env: &Env) -> anyhow::Result<()> {
    ec2_fault(
        env,
        "ec2_slow_5s",
        0x204,
        Duration::from_secs(20),
        Faults {
            latency_ms: 5_000,
            ..Faults::default()
        },
        false,
    )
    .await
}

async fn ec2_http_500(env: &Env) -> anyhow::Result<()> {
    ec2_fault(
        env,
        "ec2_http_500",
        0x205,
        Duration::from_secs(15),
        Faults {
            error_5xx_fraction: 1.0,
            ..Faults::default()
        },
        false,
    )
    .await
}

async fn ec2_broken_xml(env: &Env) -> anyhow::Result<()> {
    ec2_fault(
        env,
        "ec2_broken_xml",
        0x206,
        Duration::from_secs(15),
        Faults {
            malformed_fraction: 0.5,
            truncated_fraction: 0.5,
            ..Faults::default()
        },
        false,
    )
    .await
}

/// A label-level lie of EC2's: the node keeps its labels, and nothing invalid is written.
async fn ec2_lies(
    env: &Env,
    name: &'static str,
    p: u32,
    what: &str,
    lie: impl Fn(&mut Instance),
) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let pairs = fleet(p, 2);
    label_and_wait(env, &c, &pairs).await?;
    let (s, i) = &pairs[0];
    let mut bad = i.clone();
    lie(&mut bad);
    env.mock_admin.upsert(&bad).await?;
    kube_util::set_boot_id(&c, &s.name, &e2e::fixtures::boot_id(7_000 + p)).await?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    nothing_lost(&c, &pairs, &BTreeMap::new()).await?;
    // The truth again: converges (the not-described or invalid answer is asked again later).
    env.mock_admin.upsert(i).await?;
    let cleared = Instant::now();
    let want = expected_of(i);
    wait_for_topology(&c, &s.name, &want, Duration::from_secs(60)).await?;
    report(
        name,
        what,
        "labels kept as they were; nothing invalid written",
        Some(cleared.elapsed()),
    );
    Ok(())
}

async fn answer_missing_an_instance(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let pairs = fleet(0x207, 4);
    label_and_wait(env, &c, &pairs).await?;
    let omit = pairs[0].1.instance_id.clone();
    env.mock_admin
        .set_faults(&Faults {
            omit_instances: vec![omit],
            ..Faults::default()
        })
        .await?;
    for (k, (s, _)) in pairs.iter().enumerate() {
        kube_util::set_boot_id(&c, &s.name, &e2e::fixtures::boot_id(7_100 + k as u32)).await?;
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    nothing_lost(&c, &pairs, &BTreeMap::new()).await?;
    env.mock_admin.set_faults(&Faults::default()).await?;
    report(
        "answer_missing_an_instance",
        "EC2's answer leaves out one of the requested instances",
        "its node keeps its labels; the others are answered",
        None,
    );
    Ok(())
}

async fn duplicate_items(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    env.mock_admin
        .set_faults(&Faults {
            duplicate_items: true,
            ..Faults::default()
        })
        .await?;
    let result = label_and_wait(env, &c, &fleet(0x208, 4)).await;
    env.mock_admin.set_faults(&Faults::default()).await?;
    result?;
    report(
        "duplicate_items",
        "every item of EC2's answer twice",
        "labelled normally",
        None,
    );
    Ok(())
}

async fn five_network_nodes(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x209, 1, "p7.future");
    let i = s.instance(&["nn-5a", "nn-5b", "nn-5c", "nn-5d", "nn-5e"]);
    label_and_wait(env, &c, &[(s, i)]).await?;
    report(
        "five_network_nodes",
        "5 network nodes (a deeper hierarchy than any type today)",
        "layers 1-5 written, read from the data",
        None,
    );
    Ok(())
}

async fn empty_network_nodes(env: &Env) -> anyhow::Result<()> {
    ec2_lies(
        env,
        "empty_network_nodes",
        0x20a,
        "a supported type answered with no network nodes",
        |i| i.network_nodes.clear(),
    )
    .await
}

async fn invalid_network_node_ids(env: &Env) -> anyhow::Result<()> {
    ec2_lies(
        env,
        "invalid_network_node_ids",
        0x20b,
        "a 64-character network node ID",
        |i| i.network_nodes[1] = "n".repeat(64),
    )
    .await?;
    ec2_lies(
        env,
        "invalid_network_node_ids",
        0x20c,
        "a network node ID with spaces",
        |i| i.network_nodes[2] = "nn bad id".into(),
    )
    .await
}

async fn hostile_placement_group(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x20d, 1, "p5.48xlarge");
    let i = s.instance(&["nn-pg-s", "nn-pg-a", "nn-pg-l"]);
    let raw: String = format!("GPU pool ✨ für Trainings / {}", "ü".repeat(100))
        .chars()
        .take(255)
        .collect();
    let (label, ann) = e2e::env::placement_group_of(env, &c, &s, i, &raw).await?;
    ensure!(label.len() <= 63 && ann == raw, "{label} / {ann}");
    report(
        "hostile_placement_group",
        "a 255-character placement group name with spaces and unicode",
        &format!("label `{label}`, raw name in the annotation"),
        None,
    );
    Ok(())
}

async fn apiserver_restarted(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let cp = env.cluster.local.as_ref().context("local control plane")?;
    let before = fleet(0x20e, 20);
    label_and_wait(env, &c, &before).await?;
    let after = fleet(0x20f, 40);
    env.mock_admin
        .upsert_all(&after.iter().map(|(_, i)| i.clone()).collect::<Vec<_>>())
        .await?;
    let creating = kube_util::create_nodes(&c, after.iter().map(|(s, _)| s.node()).collect());
    let restart = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        cp.restart_apiserver().await
    };
    let (created, restarted) = tokio::join!(creating, restart);
    restarted?;
    let restarted_at = Instant::now();
    // Creates that met the API server down failed: create what is missing (as a kubelet
    // retries its registration).
    if let Err(e) = created {
        eprintln!("    some creates failed during the restart ({e:#}); creating the missing nodes");
    }
    let c = env.admin().await?;
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    for (s, _) in &after {
        if api.get_opt(&s.name).await?.is_none() {
            kube_util::create_nodes(&c, vec![s.node()]).await?;
        }
    }
    let c = env.admin().await?;
    for (s, i) in before.iter().chain(&after) {
        let want = expected_of(i);
        wait_for_topology(&c, &s.name, &want, Duration::from_secs(90)).await?;
    }
    let mut guard = env.labeler.lock().await;
    ensure!(
        guard.as_mut().is_some_and(|l| l.alive()),
        "the controller survived the restart"
    );
    report(
        "apiserver_restarted",
        "kube-apiserver stopped and started during a burst of 40 new nodes (every watch dropped)",
        "watch resumed; all labelled; nothing lost",
        Some(restarted_at.elapsed()),
    );
    Ok(())
}

async fn node_deleted_mid_lookup(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    env.mock_admin
        .set_faults(&Faults {
            latency_ms: 3_000,
            ..Faults::default()
        })
        .await?;
    const RECHECK: &str = "the API server accepts writes again";
    let rechecks = |env: &Env| {
        let log = env
            .labeler
            .try_lock()
            .map(|l| l.as_ref().map(|l| l.log_text()).unwrap_or_default())
            .unwrap_or_default();
        log.matches(RECHECK).count()
    };
    let rechecks_before = rechecks(env);
    let specs: Vec<NodeSpec> = (1..=10)
        .map(|k| NodeSpec::ec2(0x210, k, "p5.48xlarge"))
        .collect();
    env.mock_admin
        .upsert_all(
            &specs
                .iter()
                .map(|s| s.instance(&["nn-d-s", "nn-d-a", "nn-d-l"]))
                .collect::<Vec<_>>(),
        )
        .await?;
    kube_util::create_nodes(&c, specs.iter().map(NodeSpec::node).collect()).await?;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for s in &specs {
        kube_util::delete_node(&c, &s.name).await?;
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    env.mock_admin.set_faults(&Faults::default()).await?;
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    for s in &specs {
        ensure!(
            api.get_opt(&s.name).await?.is_none(),
            "the deleted node {} was re-created by the apply",
            s.name
        );
    }
    // The next node is written normally; the refused writes of deleted nodes said nothing about
    // the API server, so that write must not re-check the whole fleet.
    let next = NodeSpec::ec2(0x210, 11, "p5.48xlarge");
    label_and_wait(
        env,
        &c,
        &[(next.clone(), next.instance(&["nn-d-s", "nn-d-a", "nn-d-l"]))],
    )
    .await?;
    let fleet_rechecks = rechecks(env) - rechecks_before;
    ensure!(
        fleet_rechecks == 0,
        "writes refused for deleted nodes made the controller re-check every node {fleet_rechecks} time(s)"
    );
    report(
        "node_deleted_mid_lookup",
        "10 nodes deleted while their EC2 lookup (3 s) was in flight",
        "none re-created (the apply carries the UID and fails with 409); no re-check of the fleet after those 409s",
        None,
    );
    Ok(())
}

async fn label_fight(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let pairs = fleet(0x211, 1);
    label_and_wait(env, &c, &pairs).await?;
    let (s, i) = &pairs[0];
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    let guard = env.labeler.lock().await;
    let l = guard.as_ref().context("local controller")?;
    let writes = |m: &str| metric_sum(m, "ec2_topology_labeler_label_writes_total", &[]);
    let w0 = writes(&l.metrics().await?);
    // Another writer sets layer-1 to something else every 500 ms for 20 s.
    let fight = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": s.name, "labels": {format!("{L}1"): "nn-fighter"}}});
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        api.patch(
            &s.name,
            &PatchParams::apply("fighter").force(),
            &Patch::Apply(&fight),
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let ours = writes(&l.metrics().await?) - w0;
    let log = l.log_text();
    ensure!(ours <= 8.0, "{ours} writes in a 20 s fight: not bounded");
    ensure!(
        log.contains("label conflict") && log.contains("fighter"),
        "the conflict is reported naming the other writer"
    );
    drop(guard);
    // The fight stops: our label comes back after the hold.
    api.patch(
        &s.name,
        &PatchParams::apply("fighter").force(),
        &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": s.name}})),
    )
    .await?;
    let stopped = Instant::now();
    let want = expected_of(i);
    wait_for_topology(&c, &s.name, &want, Duration::from_secs(60)).await?;
    report(
        "label_fight",
        "another field manager resets one of our labels every 500 ms for 20 s",
        &format!(
            "{ours} writes of ours (bounded), conflict reported naming `fighter`; restored after the hold"
        ),
        Some(stopped.elapsed()),
    );
    Ok(())
}

/// The field manager of EKS's cloud controller (its node controller writes as the binary).
const CCM: &str = "aws-cloud-controller-manager";

/// Kubernetes' proposed `CloudNodeAdditionalLabelsReconciliation` (kubernetes#141616), as
/// documented: the cloud node controller re-applies its additional labels (our layer keys and
/// `zone-id`) periodically, as its own field manager, add-only (it sets its keys, never removes
/// one), from its own per-node `DescribeInstanceTopology` cached for up to 24 h. Here its period
/// is 2 s and its cache is the fleet at registration.
///
/// While it agrees with EC2 it costs us no write. After a stop/start moves one instance, its cache
/// is stale: it puts the old values back every period, and we correct them only until the
/// conflict guard holds (writes bounded, an Event and a metric naming it); the nodes it agrees on
/// are never touched. Once its cache is refreshed, the moved node carries the new values again.
async fn cloud_controller_reconciles_labels(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let pairs = fleet(0x216, 4);
    label_and_wait(env, &c, &pairs).await?;
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    // The cloud controller's per-node cache, filled at registration.
    let cache = std::sync::Arc::new(Mutex::new(
        pairs
            .iter()
            .map(|(s, i)| (s.name.clone(), expected_of(i)))
            .collect::<BTreeMap<_, _>>(),
    ));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    /// Stops the fake cloud controller however the scenario ends (a failed step included), so
    /// it never writes into the scenarios after this one.
    struct AbortOnDrop(tokio::task::AbortHandle);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let ccm = {
        let (api, cache, stop) = (api.clone(), cache.clone(), stop.clone());
        tokio::spawn(async move {
            let params = PatchParams {
                field_manager: Some(CCM.into()),
                ..PatchParams::default()
            };
            let mut rounds = 0u32;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let view = cache.lock().unwrap_or_else(|e| e.into_inner()).clone();
                for (name, labels) in view {
                    // Add-only: its keys with its values; nothing removed.
                    let patch = json!({"metadata": {"labels": labels}});
                    let _ = api.patch(&name, &params, &Patch::Merge(&patch)).await;
                }
                rounds += 1;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            rounds
        })
    };
    let _stop_ccm = AbortOnDrop(ccm.abort_handle());
    let writes = |m: &str| metric_sum(m, "ec2_topology_labeler_label_writes_total", &[]);
    let scrape = || async {
        let guard = env.labeler.lock().await;
        guard.as_ref().context("local controller")?.metrics().await
    };
    // Agreeing with EC2, the cloud controller's periodic writes cost us nothing.
    let w0 = writes(&scrape().await?);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let agreeing = writes(&scrape().await?) - w0;
    // A stop/start: EC2 now places the first instance elsewhere, and it boots anew.
    let (s0, i0) = &pairs[0];
    let mut moved = i0.clone();
    moved.network_nodes[2] = format!("{}-moved", moved.network_nodes[2]);
    env.mock_admin
        .upsert_all(std::slice::from_ref(&moved))
        .await?;
    kube_util::set_boot_id(&c, &s0.name, &e2e::fixtures::boot_id(9_216)).await?;
    let holds = |m: &str| metric_sum(m, "ec2_topology_labeler_label_conflicts_total", &[]);
    let m1 = scrape().await?;
    let (w1, h1) = (writes(&m1), holds(&m1));
    let stale_for = Duration::from_secs(24);
    let started = Instant::now();
    let mut others_changed = Vec::new();
    while started.elapsed() < stale_for {
        for (s, i) in &pairs[1..] {
            let have = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
            if have != expected_of(i) {
                others_changed.push(s.name.clone());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let m = scrape().await?;
    let fighting = writes(&m) - w1;
    let held = holds(&m) - h1;
    let named = metric_sum(
        &m,
        "ec2_topology_labeler_label_conflict_writers_total",
        &[&format!("manager=\"{CCM}\"")],
    );
    let log = {
        let guard = env.labeler.lock().await;
        guard.as_ref().context("local controller")?.log_text()
    };
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.clone(), "default");
    let event = events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .find(|e| {
            e.reason.as_deref() == Some("TopologyLabelConflict")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(s0.name.as_str())
                && e.note.as_deref().is_some_and(|n| n.contains(CCM))
        });
    // Its cache is refreshed (it describes the instance again): it now agrees with EC2.
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(s0.name.clone(), expected_of(&moved));
    let converged =
        wait_for_topology(&c, &s0.name, &expected_of(&moved), Duration::from_secs(90)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let rounds = ccm.await.unwrap_or(0);
    converged?;
    ensure!(
        agreeing == 0.0,
        "{agreeing} writes of ours while the cloud controller agreed with EC2"
    );
    ensure!(
        others_changed.is_empty(),
        "nodes the cloud controller agrees on changed: {others_changed:?}"
    );
    // The guard's bound: the relabel after the move, then at most 3 corrections before each
    // hold and after the last; holds of 10 s doubling (the suite's --conflict-backoff) start at
    // most twice in 24 s.
    ensure!(
        (1.0..=2.0).contains(&held),
        "{held} holds in {}s (10 s, then 20 s)",
        stale_for.as_secs()
    );
    ensure!(
        // (+1: a removal patch beside an apply.)
        fighting >= 1.0 && fighting <= 2.0 + 3.0 * (held + 1.0),
        "{fighting} writes of ours in {}s against a stale cloud controller, {held} holds: beyond the guard's bound",
        stale_for.as_secs()
    );
    ensure!(
        named >= 1.0,
        "no label_conflict_writers_total{{manager=\"{CCM}\"}}"
    );
    ensure!(
        log.contains("label conflict") && log.contains(CCM),
        "the conflict is logged naming the cloud controller"
    );
    ensure!(
        event.is_some(),
        "no TopologyLabelConflict Event on {} naming {CCM}",
        s0.name
    );
    report(
        "cloud_controller_reconciles_labels",
        "the cloud controller re-applies its additional labels every 2 s (kubernetes#141616), stale for one node after a stop/start for 24 s",
        &format!(
            "0 writes of ours while it agreed; {fighting} while stale in {held} holds (bounded), Event and metric name `{CCM}`; the other nodes untouched; {rounds} rounds of its writes; the moved node carries the new values once its cache is refreshed"
        ),
        None,
    );
    Ok(())
}

async fn hand_edited_label(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let pairs = fleet(0x212, 1);
    label_and_wait(env, &c, &pairs).await?;
    let (s, i) = &pairs[0];
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    api.patch(&s.name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {format!("{L}2"): "edited-by-hand", format!("{L}3"): null}}}))).await?;
    let edited = Instant::now();
    let want = expected_of(i);
    wait_for_topology(&c, &s.name, &want, Duration::from_secs(30)).await?;
    report(
        "hand_edited_label",
        "one label changed and one removed by hand (kubectl label)",
        "restored",
        Some(edited.elapsed()),
    );
    Ok(())
}

async fn killed_mid_batch(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    env.mock_admin
        .set_faults(&Faults {
            latency_ms: 2_000,
            ..Faults::default()
        })
        .await?;
    let pairs = fleet(0x213, 150);
    env.mock_admin
        .upsert_all(&pairs.iter().map(|(_, i)| i.clone()).collect::<Vec<_>>())
        .await?;
    let calls0 = env.mock_admin.stats().await?.calls;
    kube_util::create_nodes(&c, pairs.iter().map(|(s, _)| s.node()).collect()).await?;
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let mut guard = env.labeler.lock().await;
    let l = guard.as_mut().context("local controller")?;
    l.kill();
    let kc = env.cluster.controller_kubeconfig.clone().context("local")?;
    let mut fresh = start_labeler(&kc, &env.ec2_url, &env.dir, "controller-after-kill")?;
    fresh.wait_ready(Duration::from_secs(30)).await?;
    let restarted = Instant::now();
    env.mock_admin.set_faults(&Faults::default()).await?;
    for (s, i) in &pairs {
        let want = expected_of(i);
        wait_for_topology(&c, &s.name, &want, Duration::from_secs(90)).await?;
    }
    let calls = env.mock_admin.stats().await?.calls - calls0;
    *guard = Some(fresh);
    // 150 instances: 2 calls; a killed batch costs at most its calls again, plus lookups of every
    // node in the cluster (the new process starts with an empty cache): full calls of 100.
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    let ec2_nodes = api
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|n| kube_util::is_ec2(n))
        .count() as u64;
    let allowed = 2 + ec2_nodes.div_ceil(100) + 2;
    ensure!(
        calls <= allowed,
        "{calls} EC2 calls for 150 nodes across a kill ({ec2_nodes} EC2 nodes in the cluster; at most {allowed})"
    );
    report(
        "killed_mid_batch",
        "controller SIGKILLed while its first EC2 batch (2 s) was in flight, restarted",
        &format!(
            "{calls} EC2 calls in all for 150 nodes (and the restarted controller's look at all {ec2_nodes} EC2 nodes of the cluster); all labelled"
        ),
        Some(restarted.elapsed()),
    );
    Ok(())
}

/// One node whose instance ID EC2 does not know (`InvalidInstanceID.NotFound`, which fails the
/// whole call it is in) among 100 joining at once: the 99 others are labelled in the same pass
/// at the cost of one more call; the unknown one gets a Warning Event and is kept out of later
/// calls, asked about alone with backoff.
async fn one_unknown_instance_in_a_full_batch(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let pairs = fleet(0x230, 100);
    let bad = pairs[37].0.clone();
    env.mock_admin
        .upsert_all(&pairs.iter().map(|(_, i)| i.clone()).collect::<Vec<_>>())
        .await?;
    env.mock_admin
        .set_faults(&Faults {
            not_found_instances: vec![bad.instance_id.clone()],
            ..Faults::default()
        })
        .await?;
    let before = env.mock_admin.stats().await?;
    let started = Instant::now();
    kube_util::create_nodes(&c, pairs.iter().map(|(s, _)| s.node()).collect()).await?;
    for (s, i) in pairs.iter().filter(|(s, _)| s.name != bad.name) {
        let want = expected_of(i);
        wait_for_topology(&c, &s.name, &want, Duration::from_secs(30)).await?;
    }
    let took = started.elapsed();
    let after = env.mock_admin.stats().await?;
    let calls = after.calls - before.calls;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.clone(), "default");
    let warned = kube_util::eventually(
        "a Warning Event on the refused node",
        Duration::from_secs(10),
        || async {
            Ok(events
                .list(&Default::default())
                .await?
                .items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("InstanceIdRejected")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some(bad.name.as_str())
                })
                .then_some(()))
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let bad_asked = env
        .mock_admin
        .stats()
        .await?
        .asked
        .get(&bad.instance_id)
        .copied()
        .unwrap_or(0)
        - before.asked.get(&bad.instance_id).copied().unwrap_or(0);
    env.mock_admin.set_faults(&Faults::default()).await?;
    warned?;
    let t = kube_util::topology_labels(&kube_util::labels(&c, &bad.name).await?);
    ensure!(t.is_empty(), "the refused node got labels: {t:?}");
    // 100 nodes: one call refused for the unknown ID, the 99 others sent again (a burst can
    // also arrive in two calls).
    ensure!(
        calls <= 4,
        "{calls} EC2 calls to label 99 nodes beside one unknown ID"
    );
    // Backoff 2, 4, 8 s (capped at 10 s) over ~12 s, asked alone: a few asks, not one per call.
    ensure!(
        bad_asked <= 5,
        "the unknown ID was asked about {bad_asked} times in ~12 s"
    );
    report(
        "one_unknown_instance_in_a_full_batch",
        "one of 100 new nodes has an instance ID EC2 does not know (`InvalidInstanceID.NotFound` fails the whole call)",
        &format!(
            "the 99 others labelled in {:.1}s with {calls} calls; the unknown one: Warning Event, asked {bad_asked} times alone in ~12 s",
            took.as_secs_f64()
        ),
        None,
    );
    Ok(())
}

/// 20 nodes of a type EC2 does not describe, joining over 10 s: their first asks are separate
/// calls, but every retry round after that is one call for all of them (their retry times sit
/// on one shared grid), however they joined.
async fn unsupported_instances_share_retries(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let specs: Vec<NodeSpec> = (0..20)
        .map(|k| NodeSpec::ec2(0x231, k, "m7i.large"))
        .collect();
    env.mock_admin
        .upsert_all(&specs.iter().map(|s| s.instance(&[])).collect::<Vec<_>>())
        .await?;
    for s in &specs {
        kube_util::create_nodes(&c, vec![s.node()]).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Past the first asks and the short backoffs (2, 4, 8 s, capped at 10 s): the steady rounds.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let ours = |st: &mock_ec2::Stats| -> u64 {
        specs
            .iter()
            .map(|s| st.asked.get(&s.instance_id).copied().unwrap_or(0))
            .sum()
    };
    let before = env.mock_admin.stats().await?;
    let window = Duration::from_secs(30);
    tokio::time::sleep(window).await;
    let after = env.mock_admin.stats().await?;
    let (calls, asks) = (after.calls - before.calls, ours(&after) - ours(&before));
    for s in &specs {
        let t = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
        ensure!(t.is_empty(), "{} got labels: {t:?}", s.name);
        kube_util::delete_node(&c, &s.name).await?;
    }
    ensure!(
        asks >= 20,
        "the 20 instances were not asked about again ({asks} asks)"
    );
    // Rounds every 10 s (the cap): 3 or 4 calls in 30 s, whatever else is due shares them.
    ensure!(
        calls <= 4,
        "{calls} EC2 calls in {}s for 20 unsupported instances ({asks} asks): their retries do not share calls",
        window.as_secs()
    );
    report(
        "unsupported_instances_share_retries",
        "20 nodes of a type EC2 does not describe, joining over 10 s",
        &format!(
            "retried in shared rounds: {calls} calls for {asks} asks in {}s",
            window.as_secs()
        ),
        None,
    );
    Ok(())
}

/// With `--startup-taint` and a timeout, EC2 goes down during a join wave: no node is released
/// before its timeout (its labels are not there), none stays held past it, and once EC2 is back
/// every node gets its labels and `TopologyLabeled=True`.
async fn outage_during_a_join_wave_with_startup_taint(env: &Env) -> anyhow::Result<()> {
    const TIMEOUT: Duration = Duration::from_secs(20);
    const PENDING: &str = "ec2-topology-labeler.io/topology-pending";
    let c = env.admin().await?;
    let taint_flag = format!("--startup-taint={PENDING}:NoSchedule");
    let timeout_flag = format!("--startup-taint-timeout={}s", TIMEOUT.as_secs());
    e2e::env::restart_labeler_with(env, &[&taint_flag, &timeout_flag, "--node-condition=true"])
        .await?;
    let pairs = fleet(0x240, 30);
    env.mock_admin
        .upsert_all(&pairs.iter().map(|(_, i)| i.clone()).collect::<Vec<_>>())
        .await?;
    let result = async {
        let mut guard = env.mock.lock().await;
        let mock = guard.as_mut().context("local mock")?;
        let scenario = mock.down().await?;
        let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
        let mut created: BTreeMap<String, Instant> = BTreeMap::new();
        let mut released: BTreeMap<String, Instant> = BTreeMap::new();
        let tainted = |n: &k8s_openapi::api::core::v1::Node| {
            n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.key == PENDING))
        };
        let wave = Instant::now();
        let mut next = 0;
        // The wave: 3 nodes a second for 10 s; EC2 down from before the first until 30 s in.
        while wave.elapsed() < Duration::from_secs(30) || released.len() < pairs.len() {
            if wave.elapsed() > Duration::from_secs(60) {
                break;
            }
            while next < pairs.len() && wave.elapsed() >= Duration::from_millis(333 * next as u64) {
                let (s, _) = &pairs[next];
                let mut n = s.node();
                n.spec.get_or_insert_default().taints.get_or_insert_default().push(
                    k8s_openapi::api::core::v1::Taint {
                        key: PENDING.into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    },
                );
                kube_util::create_nodes(&c, vec![n]).await?;
                created.insert(s.name.clone(), Instant::now());
                next += 1;
            }
            for (s, _) in &pairs[..next] {
                if released.contains_key(&s.name) {
                    continue;
                }
                if !tainted(&api.get(&s.name).await?) {
                    released.insert(s.name.clone(), Instant::now());
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let held_for: Vec<Duration> = released
            .iter()
            .filter_map(|(name, at)| Some(at.duration_since(*created.get(name)?)))
            .collect();
        let (min, max) = (
            held_for.iter().min().copied().unwrap_or_default(),
            held_for.iter().max().copied().unwrap_or_default(),
        );
        ensure!(
            released.len() == pairs.len(),
            "{} of {} nodes still held {}s into the outage",
            pairs.len() - released.len(),
            pairs.len(),
            wave.elapsed().as_secs()
        );
        // creationTimestamp has whole seconds: a release can come up to 1 s early by our clock;
        // our poll sees it up to ~0.5 s late (every 200 ms, one GET per node).
        ensure!(
            min + Duration::from_secs(1) >= TIMEOUT,
            "a node was released {min:?} after it joined, before the {TIMEOUT:?} timeout, while EC2 was down"
        );
        ensure!(
            max <= TIMEOUT + Duration::from_secs(3),
            "a node was held {max:?}, past the {TIMEOUT:?} timeout"
        );
        mock.up(&scenario).await?;
        drop(guard);
        let back = Instant::now();
        for (s, i) in &pairs {
            let want = expected_of(i);
            wait_for_topology(&c, &s.name, &want, Duration::from_secs(60)).await?;
        }
        let labelled_in = back.elapsed();
        for (s, _) in &pairs {
            let n = api.get(&s.name).await?;
            let cond = n
                .status
                .and_then(|st| st.conditions)
                .and_then(|cs| cs.into_iter().find(|c| c.type_ == "TopologyLabeled"));
            ensure!(
                cond.as_ref().is_some_and(|c| c.status == "True"),
                "{}: TopologyLabeled is {cond:?} after its labels came",
                s.name
            );
        }
        report(
            "outage_during_a_join_wave_with_startup_taint",
            &format!(
                "EC2 down for 30 s while 30 nodes with the startup taint joined (3/s); `--startup-taint-timeout={}s`",
                TIMEOUT.as_secs()
            ),
            &format!(
                "none released early, none held past the timeout: released {:.1}-{:.1}s after joining; all labelled, TopologyLabeled=True",
                min.as_secs_f64(),
                max.as_secs_f64()
            ),
            Some(labelled_in),
        );
        anyhow::Ok(())
    }
    .await;
    e2e::env::restart_labeler_with(env, &[]).await?;
    for (s, _) in &pairs {
        let _ = kube_util::delete_node(&c, &s.name).await;
    }
    result
}

/// The leader loses access to its Lease (RBAC revoked: 403 on every Lease call) and keeps
/// running. It must stop writing within its renew deadline (lease duration − grace), before its
/// lease can expire; the other replica takes over after that and labels new nodes. Never two
/// writers at once.
async fn leader_cut_off_from_its_lease(env: &Env) -> anyhow::Result<()> {
    use k8s_openapi::api::rbac::v1::RoleBinding;
    let c = env.admin().await?;
    let ns = e2e::cluster::NAMESPACE;
    let mut b = start_replica_b(env, &c, "replica-b", &[]).await?;
    let mut guard = env.labeler.lock().await;
    let a = guard.as_mut().context("local controller")?;
    e2e::env::wait_leader(a, true).await?;
    let leader = |m: &str| metric_sum(m, "ec2_topology_labeler_leader", &[]);
    let writes = |m: &str| metric_sum(m, "ec2_topology_labeler_label_writes_total", &[]);

    // Cut A off: the chart's Lease RoleBinding no longer names it.
    let rbs: Api<RoleBinding> = Api::namespaced(c.clone(), ns);
    let lease_binding = "ec2-topology-labeler-leader-election";
    let original = rbs.get(lease_binding).await?;
    rbs.patch(
        lease_binding,
        &PatchParams::default(),
        &Patch::Merge(json!({ "subjects": [] })),
    )
    .await?;
    let cut = Instant::now();
    // New nodes keep arriving: a leader that kept acting would write them.
    let mut k = 0u32;
    let (mut a_stopped, mut b_started, mut a_writes_at_stop) = (None, None, 0.0);
    let mut a_writes_after_stop = 0.0;
    let deadline = LEASE_SECS * 4;
    while b_started.is_none_or(|t: Duration| cut.elapsed() < t + Duration::from_secs(3)) {
        ensure!(
            cut.elapsed() < Duration::from_secs(deadline),
            "no hand-over within {deadline}s"
        );
        if k < 40 && cut.elapsed() >= Duration::from_millis(250 * u64::from(k)) {
            let s = NodeSpec::ec2(0x232, k, "p5.48xlarge");
            env.mock_admin
                .upsert(&s.instance(&["nn-c-s", "nn-c-a", &format!("nn-c-l{}", k % 4)]))
                .await?;
            kube_util::create_nodes(&c, vec![s.node()]).await?;
            k += 1;
        }
        let (ma, mb) = (a.metrics().await?, b.metrics().await?);
        if a_stopped.is_none() && leader(&ma) == 0.0 {
            a_stopped = Some(cut.elapsed());
            a_writes_at_stop = writes(&ma);
        }
        if a_stopped.is_some() {
            a_writes_after_stop = writes(&ma) - a_writes_at_stop;
        }
        if b_started.is_none() && leader(&mb) == 1.0 {
            b_started = Some(cut.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Every node that arrived is labelled, by B.
    for n in 0..k {
        let s = NodeSpec::ec2(0x232, n, "p5.48xlarge");
        let want = expected(&["nn-c-s", "nn-c-a", &format!("nn-c-l{}", n % 4)], &[]);
        wait_for_topology(&c, &s.name, &want, Duration::from_secs(30)).await?;
    }
    // Restore: A may use the Lease again; B leaves (releasing it), A leads again.
    rbs.patch(
        lease_binding,
        &PatchParams::default(),
        &Patch::Merge(json!({ "subjects": original.subjects })),
    )
    .await?;
    b.stop();
    e2e::env::wait_leader(a, true).await?;
    drop(guard);
    let a_stopped = a_stopped.context("the cut-off leader never stopped acting as leader")?;
    let b_started = b_started.context("the other replica never took over")?;
    let renew_deadline = Duration::from_secs(LEASE_SECS - 2);
    ensure!(
        a_stopped <= renew_deadline + Duration::from_millis(1_500),
        "the cut-off leader acted for {a_stopped:?} (renew deadline {renew_deadline:?})"
    );
    ensure!(
        a_stopped < b_started,
        "two leaders: B led at {b_started:?}, A stopped at {a_stopped:?}"
    );
    ensure!(
        a_writes_after_stop == 0.0,
        "the cut-off leader wrote {a_writes_after_stop} times after it stopped leading"
    );
    ensure!(
        b_started <= Duration::from_secs(LEASE_SECS + 5),
        "B took over {b_started:?} after the cut (lease {LEASE_SECS}s)"
    );
    report(
        "leader_cut_off_from_its_lease",
        "the leader's RBAC for its Lease revoked (403 on every renewal) while it keeps running; nodes keep arriving",
        &format!(
            "it stopped acting {:.1}s after the cut (renew deadline {}s), the other replica led at {:.1}s (lease {LEASE_SECS}s) and labelled all {k} new nodes; no write by the old leader after it stopped",
            a_stopped.as_secs_f64(),
            renew_deadline.as_secs(),
            b_started.as_secs_f64()
        ),
        Some(b_started),
    );
    Ok(())
}

/// The e2e lease duration (e2e::env::LEASE), in seconds.
const LEASE_SECS: u64 = 6;

/// Replica B beside the suite's controller: its own ServiceAccount, bound to the chart's
/// roles, with `extra` flags; ready and following.
async fn start_replica_b(
    env: &Env,
    c: &Client,
    name: &str,
    extra: &[&str],
) -> anyhow::Result<e2e::labeler::Labeler> {
    let cp = env.cluster.local.as_ref().context("local control plane")?;
    let ns = e2e::cluster::NAMESPACE;
    let b_sa = e2e::cluster::SECOND_SERVICE_ACCOUNT;
    let bindings = format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{ name: e2e-replica-b }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ec2-topology-labeler }}
subjects: [{{ kind: ServiceAccount, name: {b_sa}, namespace: {ns} }}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: e2e-replica-b, namespace: {ns} }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: ec2-topology-labeler-leader-election }}
subjects: [{{ kind: ServiceAccount, name: {b_sa}, namespace: {ns} }}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{ name: e2e-replica-b-ledger, namespace: {ns} }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: Role, name: ec2-topology-labeler-ledger }}
subjects: [{{ kind: ServiceAccount, name: {b_sa}, namespace: {ns} }}]
"#
    );
    kube_util::apply_yaml(c, &bindings, "e2e").await?;
    let mut b = e2e::env::start_labeler_with(
        &cp.second_controller_kubeconfig,
        &env.ec2_url,
        &env.dir,
        name,
        extra,
    )?;
    b.wait_ready(Duration::from_secs(30)).await?;
    e2e::env::wait_leader(&b, false).await?;
    Ok(b)
}

/// The leader SIGKILLed while nodes join at 10/s, over a fleet of 5,000 verified nodes. The
/// follower's node cache is synced while it follows; when the lease expires and it leads, each
/// joiner is labelled within 2 s of that moment (or of its creation, if later), and it asks EC2
/// nothing about the 5,000 whose verification records it trusts.
async fn leader_killed_during_a_join_wave(env: &Env) -> anyhow::Result<()> {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Node;
    use kube::{
        core::PartialObjectMeta,
        runtime::{WatchStreamExt, watcher},
    };
    const FLEET: u32 = 5_000;
    const JOINERS: u32 = 100;
    const SCENARIO: &str = "e2e.ec2tl.io/scenario";
    let (p_fleet, p_join) = (0x2a0, 0x2a1);
    let layer3 = "topology.k8s.aws/network-node-layer-3";
    let spec_of = |p: u32, k: u32| {
        let s = NodeSpec::ec2(p, k, "p5.48xlarge");
        let i = s.instance(&[
            &format!("nn-s-{p:x}"),
            &format!("nn-a-{p:x}-{}", k % 5),
            &format!("nn-l-{p:x}-{}", k % 50),
        ]);
        (s, i)
    };
    let node_of = |s: &NodeSpec| {
        let mut n = s.node();
        n.metadata
            .labels
            .get_or_insert_default()
            .insert(SCENARIO.into(), "leader-killed".into());
        n
    };
    let fleet: Vec<_> = (0..FLEET).map(|k| spec_of(p_fleet, k)).collect();
    let joiners: Vec<_> = (0..JOINERS).map(|k| spec_of(p_join, k)).collect();
    let want: BTreeMap<String, String> = fleet
        .iter()
        .chain(&joiners)
        .map(|(s, i)| (s.name.clone(), expected_of(i)[layer3].clone()))
        .collect();
    let c = env.admin().await?;
    env.mock_admin
        .upsert_all(
            &fleet
                .iter()
                .chain(&joiners)
                .map(|(_, i)| i.clone())
                .collect::<Vec<_>>(),
        )
        .await?;

    // One watch over the scenario's nodes: when each first carries its layer-3 label, and
    // whether any lost it afterwards.
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<(String, bool)>();
    let api: Api<Node> = Api::all(c.clone());
    let watch = tokio::spawn({
        let client = c.clone();
        let want = want.clone();
        async move {
            let cfg = watcher::Config::default().labels(&format!("{SCENARIO}=leader-killed"));
            // Labels only: metadata, resumed with backoff after an error.
            let meta: Api<PartialObjectMeta<Node>> = Api::all(client);
            let mut stream = std::pin::pin!(watcher(meta, cfg).default_backoff());
            while let Some(event) = stream.next().await {
                let Ok(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) = event else {
                    continue;
                };
                let name = n.metadata.name.clone().unwrap_or_default();
                let right = n
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(layer3))
                    .is_some_and(|v| want.get(&name) == Some(v));
                if seen_tx.send((name, right)).is_err() {
                    return;
                }
            }
        }
    });
    let mut labelled: BTreeMap<String, Instant> = BTreeMap::new();
    let mut lost: Vec<String> = Vec::new();
    let mut drain = |labelled: &mut BTreeMap<String, Instant>, lost: &mut Vec<String>| {
        while let Ok((name, right)) = seen_rx.try_recv() {
            match (right, labelled.contains_key(&name)) {
                (true, false) => {
                    labelled.insert(name, Instant::now());
                }
                (false, true) => lost.push(name),
                _ => {}
            }
        }
    };

    let result = async {
        // The default batch window (the suite's 500 ms is for full calls on a stalling CI
        // machine): a joiner's lookup goes out within two windows.
        let mut b = start_replica_b(env, &c, "replica-b-join-wave", &["--batch-window=200ms"]).await?;
        let outcome = async {
            let t0 = Instant::now();
            kube_util::create_nodes(&c, fleet.iter().map(|(s, _)| node_of(s)).collect()).await?;
            let created_in = t0.elapsed();
            while fleet.iter().any(|(s, _)| !labelled.contains_key(&s.name)) {
                ensure!(
                    t0.elapsed() < Duration::from_secs(300),
                    "{} of {FLEET} fleet nodes labelled after 300 s",
                    labelled.len()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                drain(&mut labelled, &mut lost);
            }
            let fleet_in = t0.elapsed();
            // The follower has the fleet, records and all, in its cache before the wave.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let asked_before = env.mock_admin.stats().await?.asked;

            let mut guard = env.labeler.lock().await;
            let a = guard.as_mut().context("local controller")?;
            let wave = Instant::now();
            let mut created: BTreeMap<String, Instant> = BTreeMap::new();
            let (mut killed, mut b_led) = (None, None);
            let mut calls_at_lead = 0;
            let mut next = 0usize;
            while created.len() < joiners.len()
                || joiners.iter().any(|(s, _)| !labelled.contains_key(&s.name))
            {
                ensure!(
                    wave.elapsed() < Duration::from_secs(60),
                    "{} of {JOINERS} joiners labelled 60 s into the wave (killed {killed:?}, B led {b_led:?})",
                    joiners.iter().filter(|(s, _)| labelled.contains_key(&s.name)).count()
                );
                while next < joiners.len() && wave.elapsed() >= Duration::from_millis(100 * next as u64) {
                    let (s, _) = &joiners[next];
                    kube_util::create_nodes(&c, vec![node_of(s)]).await?;
                    created.insert(s.name.clone(), Instant::now());
                    next += 1;
                }
                if killed.is_none() && wave.elapsed() >= Duration::from_secs(3) {
                    a.kill();
                    killed = Some(Instant::now());
                }
                if killed.is_some() && b_led.is_none() {
                    let m = b.metrics().await?;
                    if metric_sum(&m, "ec2_topology_labeler_leader", &[]) == 1.0 {
                        b_led = Some(Instant::now());
                        calls_at_lead = env.mock_admin.stats().await?.calls;
                    }
                }
                drain(&mut labelled, &mut lost);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let killed = killed.context("the leader was never killed")?;
            let b_led = b_led.context("the follower never led")?;
            let stats = env.mock_admin.stats().await?;
            let m = b.metrics().await?;
            let first_decision = metric_sum(&m, "ec2_topology_labeler_leader_first_decision_seconds_sum", &[]);
            let terms = metric_sum(&m, "ec2_topology_labeler_leader_first_decision_seconds_count", &[]);
            b.stop();
            drop(guard);
            ensure!(terms == 1.0, "B timed {terms} first decisions for its one term");

            // Each joiner from when it could be labelled: the new leader's start, or its creation.
            let mut late: Vec<(f64, &str)> = joiners
                .iter()
                .filter_map(|(s, _)| {
                    let from = (*created.get(&s.name)?).max(b_led);
                    let at = *labelled.get(&s.name)?;
                    Some((at.saturating_duration_since(from).as_secs_f64(), s.name.as_str()))
                })
                .collect();
            late.sort_by(|x, y| x.0.total_cmp(&y.0));
            let worst = late.last().map(|l| l.0).unwrap_or_default();
            let p50 = late.get(late.len() / 2).map(|l| l.0).unwrap_or_default();
            let waited = joiners
                .iter()
                .filter(|(s, _)| created.get(&s.name).is_some_and(|t| *t < b_led))
                .filter(|(s, _)| labelled.get(&s.name).is_some_and(|t| *t > killed))
                .count();
            let reasked: Vec<&String> = fleet
                .iter()
                .map(|(_, i)| &i.instance_id)
                .filter(|id| stats.asked.get(*id) != asked_before.get(*id))
                .collect();
            ensure!(lost.is_empty(), "labels lost or changed on {:?}", &lost[..lost.len().min(5)]);
            ensure!(
                worst <= 2.0,
                "a joiner waited {worst:.2}s after it could be labelled ({late:?})"
            );
            ensure!(
                reasked.is_empty(),
                "the new leader asked EC2 again about {} verified fleet instances (first {:?})",
                reasked.len(),
                &reasked[..reasked.len().min(3)]
            );
            report(
                "leader_killed_during_a_join_wave",
                &format!(
                    "the leader SIGKILLed 3 s into a wave of {JOINERS} nodes joining at 10/s, over {FLEET} verified nodes (created in {:.0} s, labelled in {:.0} s); a follower synced beside it (the default 200 ms batch window)",
                    created_in.as_secs_f64(),
                    fleet_in.as_secs_f64()
                ),
                &format!(
                    "the follower led {:.1} s after the kill (lease {LEASE_SECS} s), first decision {:.0} ms after taking the lease; joiners labelled p50 {p50:.2} s, max {worst:.2} s after they could be ({waited} waited for the new leader); {} EC2 calls after it led, none about the {FLEET} verified nodes",
                    b_led.duration_since(killed).as_secs_f64(),
                    first_decision * 1e3,
                    stats.calls - calls_at_lead
                ),
                Some(b_led.duration_since(killed)),
            );
            anyhow::Ok(())
        }
        .await;
        b.stop();
        outcome
    }
    .await;
    watch.abort();
    // The scenario's nodes go before the suite's controller starts again (the scenarios after
    // this one count the cluster's nodes, and time what they do).
    let selector = kube::api::ListParams::default().labels(&format!("{SCENARIO}=leader-killed"));
    let cleaned = async {
        api.delete_collection(&Default::default(), &selector)
            .await?;
        kube_util::eventually(
            "the scenario's nodes deleted",
            Duration::from_secs(60),
            || {
                let (api, selector) = (api.clone(), selector.clone().limit(1));
                async move {
                    Ok(api
                        .list_metadata(&selector)
                        .await?
                        .items
                        .is_empty()
                        .then_some(()))
                }
            },
        )
        .await
    }
    .await;
    // The killed controller is replaced; the scenarios after this one need it leading.
    let restarted = e2e::env::restart_labeler_with(env, &[]).await;
    result.and(cleaned).and(restarted)
}

async fn hostile_provider_ids(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let ids = vec![
        String::new(),
        "aws:///".into(),
        "aws:///us-west-2a/".into(),
        "aws:////i-0123456789abcdef0".into(),
        "aws:///us-west-2a/i-xyz".into(),
        // Hex, but of a length EC2 refuses (8 or 17 digits only): one such ID in a call would
        // fail the whole call (InvalidInstanceID.Malformed).
        "aws:///us-west-2a/i-0123456789abcdef".into(),
        "aws:///us-west-2a/i-012345678".into(),
        "aws:///ünïcødé/i-0123456789abcdef0".into(),
        format!("aws:///us-west-2a/i-{}", "a".repeat(10_000)),
        "aws:///us-west-2a/0123456789abcdef0123456789abcdef/fargate-ip-1".into(),
        "eks-hybrid:///us-west-2/c/mi-0123456789abcdef0".into(),
        "azure:///subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/virtualMachines/vm"
            .into(),
    ];
    // Every ID-like string among them (the one well-formed one has no zone, so no region).
    let asked = |st: &mock_ec2::Stats| {
        ["i-0123456789abcdef0", "i-0123456789abcdef", "i-012345678"]
            .iter()
            .map(|id| st.asked.get(*id).copied().unwrap_or(0))
            .sum::<u64>()
    };
    let before = asked(&env.mock_admin.stats().await?);
    let nodes = ids
        .iter()
        .enumerate()
        .map(|(k, id)| {
            NodeSpec::ec2(0x214, k as u32, "p5.48xlarge")
                .with_provider_id(id)
                .node()
        })
        .collect();
    kube_util::create_nodes(&c, nodes).await?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    // aws:////i-… has an empty zone: with no region it cannot be looked up, and is not labelled.
    for k in 0..ids.len() as u32 {
        let s = NodeSpec::ec2(0x214, k, "p5.48xlarge");
        let t = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
        ensure!(t.is_empty(), "{} got labels: {t:?}", s.name);
    }
    let asked = asked(&env.mock_admin.stats().await?) - before;
    let mut guard = env.labeler.lock().await;
    ensure!(
        guard.as_mut().is_some_and(|l| l.alive()),
        "controller alive"
    );
    ensure!(asked == 0, "{asked} EC2 lookups for hostile providerIDs");
    report(
        "hostile_provider_ids",
        "empty, `aws:///`, `aws:///zone/`, `aws:////i-…`, `i-` without hex, 16 and 9 hex digits, unicode, 10 kB, Fargate, hybrid, another cloud",
        "all skipped with a reason, no EC2 lookup, controller healthy",
        None,
    );
    Ok(())
}

async fn no_secrets_in_debug_logs(env: &Env) -> anyhow::Result<()> {
    // A second controller with everything at trace level, as a follower, for a short while.
    let kc = env.cluster.controller_kubeconfig.clone().context("local")?;
    let token = std::fs::read_to_string(&kc)?
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: ").map(str::to_string))
        .context("token in the kubeconfig")?;
    let mut l = e2e::labeler::Labeler::start(e2e::labeler::LabelerOptions {
        kubeconfig: &kc,
        ec2_url: &env.ec2_url,
        dir: &env.dir,
        args: vec!["--leader-election=false".into()],
        log_filter: "trace",
        log_name: "controller-trace.log",
        env: vec![],
        bin: None,
    })?;
    l.wait_ready(Duration::from_secs(30)).await?;
    // Make it call EC2 and write: a node of its own.
    let pairs = fleet(0x215, 1);
    label_and_wait(env, &env.admin().await?, &pairs).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    l.stop();
    let log = l.log_text();
    ensure!(log.len() > 10_000, "trace logging produced output");
    for secret in ["e2e-not-a-secret", token.as_str()] {
        ensure!(
            !log.contains(secret),
            "a credential appears in the trace log"
        );
    }
    report(
        "no_secrets_in_debug_logs",
        "a run at RUST_LOG=trace",
        "neither the AWS secret key nor the Kubernetes token appears in the logs",
        None,
    );
    Ok(())
}

fn scenarios() -> Vec<(&'static str, ScenarioFn, bool)> {
    vec![
        scenario!(throttled_50_percent, true),
        scenario!(throttled_100_percent, true),
        scenario!(ec2_outage, true),
        scenario!(ec2_slow_5s, true),
        scenario!(ec2_http_500, true),
        scenario!(ec2_broken_xml, true),
        scenario!(answer_missing_an_instance, true),
        scenario!(duplicate_items, true),
        scenario!(five_network_nodes, true),
        scenario!(empty_network_nodes, true),
        scenario!(invalid_network_node_ids, true),
        scenario!(hostile_placement_group, true),
        scenario!(hostile_provider_ids, true),
        scenario!(one_unknown_instance_in_a_full_batch, true),
        scenario!(unsupported_instances_share_retries, true),
        scenario!(leader_cut_off_from_its_lease, true),
        scenario!(leader_killed_during_a_join_wave, true),
        scenario!(outage_during_a_join_wave_with_startup_taint, true),
        scenario!(hand_edited_label, true),
        scenario!(label_fight, true),
        scenario!(cloud_controller_reconciles_labels, true),
        scenario!(node_deleted_mid_lookup, true),
        scenario!(apiserver_restarted, true),
        scenario!(killed_mid_batch, true),
        scenario!(no_secrets_in_debug_logs, true),
    ]
}

fn main() {
    let conclusion = e2e::env::run_trials("ec2tl-faults", scenarios);
    let rows = REPORT.lock().unwrap_or_else(|e| e.into_inner());
    if let Ok(path) = std::env::var("RELIABILITY_REPORT") {
        // What the e2e suite shows about trust, kept in the generated page.
        const TRUST: &str = include_str!("faults/trust.md");
        // What the e2e suite and the unit tests show about late writes and stalls.
        const STALLS: &str = include_str!("faults/stalls.md");
        let mut md = String::from(
            "# Reliability\n\nEvery failure path is a scenario (`e2e/suite/tests/faults.rs`, `make test-faults`, run by CI) against the real kube-apiserver, mock-ec2 and the controller running as its ServiceAccount. Each asserts that no correct label was removed or changed during the fault; convergence is the time from the fault clearing until every node carries the right labels. Generated from the last run.\n\n| scenario | fault | outcome | convergence after the fault (s) |\n| --- | --- | --- | ---: |\n",
        );
        for r in rows.iter() {
            let conv = r
                .convergence
                .map(|c| format!("{c:.1}"))
                .unwrap_or_else(|| "-".into());
            md.push_str(&format!(
                "| {} | {} | {} | {conv} |\n",
                r.scenario, r.fault, r.outcome
            ));
        }
        md.push_str(&format!(
            "\n{} of {} scenarios passed{}.\n\nAlso covered elsewhere: leader failover (`e2e.rs`, `leader_failover`), a missing RBAC verb (`missing_rbac_verb_fails_clearly`), property tests of the pure logic (`tests/properties.rs`) and fuzzing (`fuzz/`, `make fuzz`).\n{TRUST}{STALLS}",
            conclusion.num_passed,
            conclusion.num_passed + conclusion.num_failed,
            if conclusion.num_failed == 0 { "" } else { " — see the CI log for the failures" }
        ));
        if let Err(e) = std::fs::write(&path, md) {
            eprintln!("cannot write {path}: {e}");
        }
    }
    drop(rows);
    conclusion.exit();
}

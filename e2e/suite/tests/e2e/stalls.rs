//! No silent stalls, on the real API server: a Node watch whose rights are revoked shows in
//! the metric and fails readiness within its bound, and both recover once the rights are back;
//! a background task that panics is restarted and counted, and the process stays live.
//!
//! Each starts a replica of its own beside the shared controller (a follower: the watch and the
//! background tasks run on every replica).

use std::time::Duration;

use anyhow::{Context, ensure};
use e2e::{
    env::{Env, expected, start_labeler_with, start_labeler_with_env},
    fixtures::NodeSpec,
    kube_util::{self, eventually, wait_for_topology},
    labeler::{Labeler, metric_sum},
    mock::MockAdmin,
};
use k8s_openapi::api::{core::v1::Node, rbac::v1::ClusterRole};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;

/// What `/readyz` answers: `Ok(())` when ready, else the reason it gives.
async fn readiness(l: &Labeler) -> Result<(), String> {
    match MockAdmin::new(&l.metrics_url).get_text("/readyz").await {
        Ok(body) if body.trim() == "ok" => Ok(()),
        Ok(body) => Err(body),
        Err(e) => Err(e.to_string()),
    }
}

/// Revoke `list` and `watch` on Nodes from the controller's ClusterRole: the replica's watch
/// (renewed every 5 s here) is refused; `watch_errors_total{reason="forbidden"}` rises and
/// `/readyz` fails once the watch has failed for `--watch-unhealthy-after` (10 s). Rights back:
/// the next event makes it ready again, the gauge back at 0.
pub async fn a_revoked_node_watch_fails_readiness_until_restored(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let kc = env
        .cluster
        .controller_kubeconfig
        .clone()
        .context("local control plane")?;
    let mut replica = start_labeler_with(
        &kc,
        &env.ec2_url,
        &env.dir,
        "controller-watch",
        &["--watch-timeout=5s", "--watch-unhealthy-after=10s"],
    )?;
    replica.wait_ready(Duration::from_secs(30)).await?;
    let roles: Api<ClusterRole> = Api::all(c.clone());
    let original = roles.get("ec2-topology-labeler").await?;
    let mut cut = original.clone();
    for rule in cut.rules.iter_mut().flatten() {
        if rule.resources.iter().flatten().any(|r| r == "nodes") {
            rule.verbs.retain(|v| v != "list" && v != "watch");
        }
    }
    cut.metadata.managed_fields = None;
    roles
        .replace("ec2-topology-labeler", &Default::default(), &cut)
        .await?;
    let revoked = std::time::Instant::now();
    // Within the watch's renewal (5 s), the bound (10 s) and a backoff step or two.
    let refused = eventually(
        "readiness failing on the refused watch",
        Duration::from_secs(45),
        || async {
            let metrics = replica.metrics().await?;
            let forbidden = metric_sum(
                &metrics,
                "ec2_topology_labeler_watch_errors_total",
                &["reason=\"forbidden\""],
            );
            Ok(match readiness(&replica).await {
                Err(why) if forbidden > 0.0 && why.contains("the Node watch has been failing") => {
                    Some((forbidden, why))
                }
                _ => None,
            })
        },
    )
    .await;
    let took = revoked.elapsed();
    // Rights back, whatever happened.
    let mut restore = roles.get("ec2-topology-labeler").await?;
    restore.rules = original.rules.clone();
    roles
        .replace("ec2-topology-labeler", &Default::default(), &restore)
        .await?;
    let (forbidden, why) = refused?;
    eprintln!(
        "    refused watch: not ready after {:.1}s ({forbidden} forbidden errors): {}",
        took.as_secs_f64(),
        why.chars().take(160).collect::<String>()
    );
    ensure!(
        replica.alive(),
        "the replica stays up (not ready is not dead)"
    );
    // A change to a Node is an event on the renewed watch: a node of this scenario's, labelled
    // once the rights are back.
    let s = NodeSpec::ec2(0x3d0, 1, "p5.48xlarge");
    env.mock_admin
        .upsert(&s.instance(&["nn-s-w", "nn-a-w", "nn-l-w"]))
        .await?;
    kube_util::create_nodes(&c, vec![s.node()]).await?;
    let nodes: Api<Node> = Api::all(c.clone());
    let some = s.name.clone();
    let touch = |n: u32| json!({ "metadata": { "annotations": { "e2e.ec2-topology-labeler.io/touched": n.to_string() } } });
    let mut n = 0;
    eventually(
        "ready again with the watch healthy",
        Duration::from_secs(60),
        || {
            n += 1;
            let (nodes, some, patch) = (nodes.clone(), some.clone(), touch(n));
            let replica = &replica;
            async move {
                nodes
                    .patch(&some, &PatchParams::default(), &Patch::Merge(patch))
                    .await?;
                let healthy = metric_sum(
                    &replica.metrics().await?,
                    "ec2_topology_labeler_node_watch_unhealthy_seconds",
                    &[],
                ) == 0.0;
                Ok((healthy && readiness(replica).await.is_ok()).then_some(()))
            }
        },
    )
    .await?;
    replica.stop();
    wait_for_topology(
        &c,
        &s.name,
        &expected(&["nn-s-w", "nn-a-w", "nn-l-w"], &[]),
        Duration::from_secs(60),
    )
    .await
}

/// A background task (housekeeping, by the test hook) panics on its first run: it is restarted,
/// `task_restarts_total{task="housekeeping"}` counts it, the log says so, and the replica stays
/// live and ready.
pub async fn a_panicking_background_task_restarts(env: &Env) -> anyhow::Result<()> {
    let kc = env
        .cluster
        .controller_kubeconfig
        .clone()
        .context("local control plane")?;
    let mut replica = start_labeler_with_env(
        &kc,
        &env.ec2_url,
        &env.dir,
        "controller-panics",
        &[],
        &[("LABELER_TEST_PANIC_ONCE", "housekeeping")],
    )?;
    replica.wait_ready(Duration::from_secs(30)).await?;
    eventually(
        "the task restarted and counted",
        Duration::from_secs(30),
        || async {
            let restarts = metric_sum(
                &replica.metrics().await?,
                "ec2_topology_labeler_task_restarts_total",
                &["task=\"housekeeping\""],
            );
            Ok((restarts == 1.0).then_some(()))
        },
    )
    .await?;
    let log = replica.log_text();
    ensure!(
        log.lines()
            .any(|l| l.contains("a background task panicked") && l.contains("housekeeping")),
        "the panic is logged with the task: {}",
        replica.log_tail(20)
    );
    let live = MockAdmin::new(&replica.metrics_url)
        .get_text("/livez")
        .await?;
    ensure!(live.trim() == "ok", "live after the restart: {live}");
    ensure!(readiness(&replica).await.is_ok(), "ready after the restart");
    replica.stop();
    Ok(())
}

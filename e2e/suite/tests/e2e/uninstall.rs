//! `ec2-topology-labeler uninstall` against everything the controller wrote: it refuses while a
//! controller holds the Lease, then leaves nothing of ours but the labels (and a Kueue Topology a
//! ResourceFlavor still names, reported).

use anyhow::{Context, ensure};
use e2e::{
    cluster::NAMESPACE,
    env::{Env, WAIT, label_and_wait},
    fixtures::NodeSpec,
    kube_util::{self, eventually},
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node},
};
use kube::{Api, Client, api::ListParams};

const OURS: &str = "app.kubernetes.io/managed-by=ec2-topology-labeler";

fn uninstall(env: &Env, extra: &[&str]) -> anyhow::Result<std::process::Output> {
    Ok(
        std::process::Command::new(e2e::bin_dir().join("ec2-topology-labeler"))
            .arg("uninstall")
            .arg(format!("--leader-election-namespace={NAMESPACE}"))
            .args(["-o", "json"])
            .args(extra)
            .env("KUBECONFIG", &env.cluster.admin_kubeconfig)
            .env("RUST_LOG", "warn")
            .output()?,
    )
}

async fn ours(api: &Api<kube::api::DynamicObject>) -> anyhow::Result<Vec<String>> {
    Ok(api
        .list(&ListParams::default().labels(OURS))
        .await?
        .items
        .into_iter()
        .filter_map(|o| o.metadata.name)
        .collect())
}

async fn with_condition(c: &Client) -> anyhow::Result<Vec<String>> {
    let nodes: Api<Node> = Api::all(c.clone());
    Ok(nodes
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "TopologyLabeled"))
        })
        .filter_map(|n| n.metadata.name)
        .collect())
}

/// With every publisher and the condition on, `uninstall` first refuses (a controller holds the
/// Lease); once the controller is gone it removes the condition, our HyperNodes, KAI Topologies,
/// Slurm ConfigMap and the Lease, keeps the Kueue Topology a ResourceFlavor names (saying so), and
/// leaves every label in place.
pub async fn uninstall_leaves_only_labels(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    e2e::env::restart_labeler_with(
        env,
        &[
            "--kai-topology=true",
            "--slurm-topology-configmap=slurm/slurm-topology",
            "--node-condition=true",
        ],
    )
    .await?;
    let s = NodeSpec::ec2(0x131, 1, "p5.48xlarge");
    label_and_wait(
        env,
        &c,
        &[(s.clone(), s.instance(&["nn-un-s", "nn-un-a", "nn-un-l"]))],
    )
    .await?;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "slurm");
    eventually("everything published", WAIT, || async {
        let ready = !with_condition(&c).await?.is_empty()
            && cms.get_opt("slurm-topology").await?.is_some()
            && !ours(&crate::hypernodes_api(&c)).await?.is_empty()
            && !ours(&crate::kai_topologies(&c)).await?.is_empty();
        Ok(ready.then_some(()))
    })
    .await?;
    let labels_before = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);

    let refused = uninstall(env, &[])?;
    ensure!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("holds the Lease"),
        "uninstall ran beside a running controller: {}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let result = async {
        {
            let mut guard = env.labeler.lock().await;
            if let Some(mut l) = guard.take() {
                l.stop();
            }
        }
        let out = uninstall(env, &["--wait-for-lease=30s"])?;
        ensure!(
            out.status.success(),
            "uninstall failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let items = report["items"].as_array().context("items")?;
        let kept: Vec<&serde_json::Value> =
            items.iter().filter(|i| i["kept"].is_string()).collect();
        ensure!(
            kept.iter().all(|i| i["kind"] == "kueue-topology"
                && i["kept"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("ResourceFlavor")),
            "only Kueue Topologies a ResourceFlavor names are kept: {kept:?}"
        );
        ensure!(
            with_condition(&c).await?.is_empty(),
            "a TopologyLabeled condition is left"
        );
        let hypernodes = ours(&crate::hypernodes_api(&c)).await?;
        ensure!(hypernodes.is_empty(), "HyperNodes left: {hypernodes:?}");
        let kai = ours(&crate::kai_topologies(&c)).await?;
        ensure!(kai.is_empty(), "KAI Topologies left: {kai:?}");
        ensure!(
            cms.get_opt("slurm-topology").await?.is_none(),
            "the Slurm ConfigMap is left"
        );
        let leases: Api<Lease> = Api::namespaced(c.clone(), NAMESPACE);
        ensure!(
            leases.get_opt("ec2-topology-labeler").await?.is_none(),
            "the Lease is left"
        );
        let kueue = ours(&crate::topology_api(&c)).await?;
        ensure!(
            kueue.iter().all(|t| kept.iter().any(|k| k["name"] == *t)),
            "Kueue Topologies left that were not reported kept: {kueue:?}"
        );
        let labels_after = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
        ensure!(
            labels_after == labels_before && !labels_after.is_empty(),
            "labels changed: {labels_before:?} -> {labels_after:?}"
        );
        eprintln!(
            "    uninstall removed {} object(s), kept {:?}; labels left in place",
            items.len() - kept.len(),
            kept.iter().map(|k| &k["name"]).collect::<Vec<_>>()
        );
        anyhow::Ok(())
    }
    .await;
    e2e::env::restart_labeler_with(env, &[]).await?;
    result
}

/// Turning `--node-condition` and `--volcano-hypernodes` off removes, at the next start, our
/// condition from every node and our HyperNodes; the labels and the Kueue Topology stay.
pub async fn turned_off_features_are_retired_at_start_up(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    e2e::env::restart_labeler_with(env, &["--node-condition=true"]).await?;
    let s = NodeSpec::ec2(0x132, 1, "p5.48xlarge");
    label_and_wait(
        env,
        &c,
        &[(s.clone(), s.instance(&["nn-ret-s", "nn-ret-a", "nn-ret-l"]))],
    )
    .await?;
    eventually("the condition and our HyperNodes", WAIT, || async {
        let ready = with_condition(&c).await?.contains(&s.name)
            && !ours(&crate::hypernodes_api(&c)).await?.is_empty();
        Ok(ready.then_some(()))
    })
    .await?;
    let labels_before = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
    let kueue_before = ours(&crate::topology_api(&c)).await?;
    e2e::env::restart_labeler_with(
        env,
        &["--node-condition=false", "--volcano-hypernodes=false"],
    )
    .await?;
    let result = eventually("the condition and our HyperNodes gone", WAIT, || async {
        let gone = with_condition(&c).await?.is_empty()
            && ours(&crate::hypernodes_api(&c)).await?.is_empty();
        Ok(gone.then_some(()))
    })
    .await;
    let labels_after = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
    let kueue_after = ours(&crate::topology_api(&c)).await?;
    e2e::env::restart_labeler_with(env, &[]).await?;
    result?;
    ensure!(labels_after == labels_before, "labels changed");
    ensure!(kueue_after == kueue_before, "the Kueue Topology is kept");
    kube_util::delete_node(&c, &s.name).await?;
    Ok(())
}

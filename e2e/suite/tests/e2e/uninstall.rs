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

/// Turning features off retires, at the next start, what they published where that cannot hurt
/// a running workload, and reports what may still be in use:
/// - `--node-condition` off: our TopologyLabeled condition goes;
/// - `--volcano-hypernodes` off: our HyperNodes go;
/// - `--kueue-topology` off: our Kueue Topologies of the configured names that no ResourceFlavor
///   names go; one a flavor names is kept, and the leader says so (a WARN line naming it and the
///   flavor); one of another name (another installation's) is left alone;
/// - `--kai-topology` off: our KAI Topologies of the configured name are kept and reported
///   (workloads may name them);
///
/// and no label changes.
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
    // Two Kueue Topologies of ours an earlier configuration might have left, one of them named by a
    // ResourceFlavor, and a KAI Topology of ours (marked as this installation's, as the controller
    // marks what it publishes: the admission policy lets it delete nothing else).
    let ours_label = serde_json::json!({ "app.kubernetes.io/managed-by": "ec2-topology-labeler" });
    let this_installation = serde_json::json!({ "ec2-topology-labeler.io/owner": "ec2-topology-labeler/ec2-topology-labeler" });
    let levels = serde_json::json!([
        { "nodeLabel": "topology.k8s.aws/network-node-layer-1" },
        { "nodeLabel": "kubernetes.io/hostname" }
    ]);
    let pp = kube::api::PatchParams::apply("e2e-retire");
    for name in ["ret-unnamed", "ret-named", "ret-other"] {
        let t = serde_json::json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology",
            "metadata": {"name": name, "labels": ours_label, "annotations": this_installation},
            "spec": {"levels": levels}});
        crate::topology_api(&c)
            .patch(name, &pp, &kube::api::Patch::Apply(&t))
            .await?;
    }
    let flavors = crate::resource_flavors(&c);
    let f = serde_json::json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": "ret-flavor"},
        "spec": {"nodeLabels": {"e2e-retire": "yes"}, "topologyName": "ret-named"}});
    flavors
        .patch("ret-flavor", &pp, &kube::api::Patch::Apply(&f))
        .await?;
    let k = serde_json::json!({"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology",
        "metadata": {"name": "ret-kai", "labels": ours_label, "annotations": this_installation},
        "spec": {"levels": levels}});
    crate::kai_topologies(&c)
        .patch("ret-kai", &pp, &kube::api::Patch::Apply(&k))
        .await?;
    // What stays: every Kueue Topology but the one of this configuration's names that no
    // ResourceFlavor names; `ret-other` (another installation's name, by our label too) is not
    // this installation's to judge, and stays though no flavor names it.
    let mut kueue_kept: Vec<String> = ours(&crate::topology_api(&c)).await?;
    kueue_kept.retain(|t| t != "ret-unnamed");
    ensure!(
        kueue_kept.contains(&"ret-named".to_string())
            && kueue_kept.contains(&"ret-other".to_string())
    );
    let labels_before = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
    // As an operator turns them off: the chart upgraded (its RBAC then lets the controller list
    // what it retires), the controller restarted with the features off.
    let chart_with = |on: bool| -> anyhow::Result<()> {
        e2e::helm::upgrade_reusing(
            &env.cluster.admin_kubeconfig,
            &[
                format!("config.kueueTopology={on}"),
                format!("config.kaiTopology={on}"),
            ],
        )?;
        Ok(())
    };
    chart_with(false)?;
    e2e::env::restart_labeler_with(
        env,
        &[
            "--node-condition=false",
            "--volcano-hypernodes=false",
            "--kueue-topology=false",
            "--kai-topology=false",
            // The names this configuration publishes under.
            "--kueue-topology-name=ret-named",
            "--kueue-topology-four-layer-name=ret-unnamed",
            "--kai-topology-name=ret-kai",
        ],
    )
    .await?;
    let result = eventually("retired and reported", WAIT, || async {
        let kueue = ours(&crate::topology_api(&c)).await?;
        let gone = with_condition(&c).await?.is_empty()
            && ours(&crate::hypernodes_api(&c)).await?.is_empty()
            && kueue == kueue_kept;
        let log = env
            .labeler
            .lock()
            .await
            .as_ref()
            .map(|l| l.log_text())
            .unwrap_or_default();
        let reported = log.lines().any(|l| {
            l.contains("kept what a feature now turned off published")
                && l.contains("ret-named")
                && l.contains("ret-flavor")
        }) && log.lines().any(|l| {
            l.contains("kept what a feature now turned off published") && l.contains("ret-kai")
        });
        Ok((gone && reported).then_some(()))
    })
    .await;
    let labels_after = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
    let kai_after = ours(&crate::kai_topologies(&c)).await?;
    // Put back what the later scenarios expect (the controller recreates its own Topologies).
    let _ = flavors.delete("ret-flavor", &Default::default()).await;
    for t in ["ret-named", "ret-other"] {
        let _ = crate::topology_api(&c).delete(t, &Default::default()).await;
    }
    let _ = crate::kai_topologies(&c)
        .delete("ret-kai", &Default::default())
        .await;
    chart_with(true)?;
    e2e::env::restart_labeler_with(env, &[]).await?;
    result?;
    ensure!(labels_after == labels_before, "labels changed");
    ensure!(
        kai_after.contains(&"ret-kai".to_string()),
        "the KAI Topology was not kept: {kai_after:?}"
    );
    kube_util::delete_node(&c, &s.name).await?;
    Ok(())
}

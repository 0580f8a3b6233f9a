//! Slurm scenarios beyond the ConfigMap's basics (`slurm_configmap_and_slinky_annotation`).

use anyhow::ensure;
use e2e::{
    env::{Env, WAIT, label_and_wait},
    fixtures::NodeSpec,
    kube_util::{self, eventually},
    labeler::metric_sum,
};
use k8s_openapi::api::{core::v1::ConfigMap, events::v1::Event};
use kube::Api;

/// Labels that give no topology slurmctld would load (a network node under two parents) leave
/// the ConfigMap as it was, with a Warning Event on it and the problems gauge up; once the labels
/// agree again it follows. With Slinky's block topology named, `topology.yaml` holds every
/// name the annotation carries.
pub async fn slurm_configmap_keeps_its_last_valid_files(env: &Env) -> anyhow::Result<()> {
    const SPEC: &str = "topology.slinky.slurm.net/spec";
    let c = env.admin().await?;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "slurm");
    e2e::env::restart_labeler_with(
        env,
        &[
            "--slurm-topology-configmap=slurm/slurm-topology",
            "--slinky-annotation=true",
            "--slinky-block-topology=topo-block",
        ],
    )
    .await?;
    let a = NodeSpec::ec2(0x125, 1, "p6e-gb200.36xlarge");
    let b = NodeSpec::ec2(0x125, 2, "p5.48xlarge");
    let result = async {
        let mut ia = a.instance(&["nn-vs1", "nn-va1", "nn-vl1"]);
        ia.capacity_block_id = Some("cr-0125e0bb10c0ffee0".into());
        label_and_wait(env, &c, &[(a.clone(), ia)]).await?;
        let yaml = |cm: &ConfigMap| {
            cm.data
                .as_ref()
                .and_then(|d| d.get("topology.yaml").cloned())
                .unwrap_or_default()
        };
        // Under its leaf switch (an unlabelled node is listed under `unlabelled` first).
        let good = eventually("our ConfigMap names node a under nn-vl1", WAIT, || async {
            let cm = cms.get_opt("slurm-topology").await?;
            Ok(cm.filter(|cm| {
                yaml(cm).lines().collect::<Vec<_>>().windows(2).any(|w| {
                    w[0] == "      - switch: nn-vl1" && w[1].contains(&a.name)
                })
            }))
        })
        .await?;
        // Every name of the annotation is a switch or a block of topology.yaml.
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
        let spec = eventually("the annotation", WAIT, || async {
            let n = nodes.get(&a.name).await?;
            Ok(n.metadata.annotations.unwrap_or_default().get(SPEC).cloned())
        })
        .await?;
        for pair in spec.split(',') {
            let (topology, name) = pair.split_once(':').unwrap_or_default();
            let line = if topology == "topo-block" {
                format!("      - block: {name}\n")
            } else {
                format!("      - switch: {name}\n")
            };
            ensure!(yaml(&good).contains(&line), "{pair} not in\n{}", yaml(&good));
        }
        // b puts nn-vl1 under another parent: no valid file.
        label_and_wait(env, &c, &[(b.clone(), b.instance(&["nn-vs1", "nn-va2", "nn-vl1"]))]).await?;
        eventually("the problems gauge", WAIT, || async {
            let guard = env.labeler.lock().await;
            let Some(l) = guard.as_ref() else {
                anyhow::bail!("no local controller");
            };
            let m = l.metrics().await?;
            Ok((metric_sum(&m, "ec2_topology_labeler_slurm_topology_problems", &[]) > 0.0).then_some(()))
        })
        .await?;
        let events: Api<Event> = Api::namespaced(c.clone(), "slurm");
        eventually("a SlurmTopologyInvalid Event on the ConfigMap", WAIT, || async {
            let list = events.list(&Default::default()).await?;
            Ok(list
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("SlurmTopologyInvalid")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("slurm-topology")
                })
                .map(|e| e.note.unwrap_or_default()))
        })
        .await
        .and_then(|note| {
            ensure!(note.contains("nn-vl1"), "{note}");
            Ok(())
        })?;
        // Several publish intervals later, the ConfigMap still holds the last valid files.
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let live = cms.get("slurm-topology").await?;
        ensure!(live.data == good.data, "the ConfigMap changed while the labels disagreed");
        // The labels agree again (b really sits under nn-vl2): the ConfigMap follows.
        env.mock_admin
            .upsert(&b.instance(&["nn-vs1", "nn-va2", "nn-vl2"]))
            .await?;
        kube_util::set_boot_id(&c, &b.name, &e2e::fixtures::boot_id(0x1252)).await?;
        eventually("the ConfigMap names node b under nn-vl2", WAIT, || async {
            let cm = cms.get("slurm-topology").await?;
            let conf = cm.data.unwrap_or_default().remove("topology.conf").unwrap_or_default();
            Ok(conf
                .lines()
                .any(|l| l.starts_with("SwitchName=nn-vl2 ") && l.contains(&b.name))
                .then_some(()))
        })
        .await?;
        let guard = env.labeler.lock().await;
        if let Some(l) = guard.as_ref() {
            let m = l.metrics().await?;
            ensure!(
                metric_sum(&m, "ec2_topology_labeler_slurm_topology_problems", &[]) == 0.0,
                "the gauge stays up once the labels agree"
            );
        }
        eprintln!("    disagreeing labels left the ConfigMap as it was (Event, gauge); it followed once they agreed");
        anyhow::Ok(())
    }
    .await;
    // Leave no disagreeing labels behind for the scenarios after this one.
    for n in [&a.name, &b.name] {
        let _ = kube_util::delete_node(&c, n).await;
    }
    e2e::env::restart_labeler_with(env, &[]).await?;
    result
}

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

/// A node whose answer disagrees with the others' (a network node under another parent, which
/// slurmctld would refuse) is left out of the ConfigMap, with a `TopologyNotPublished` Event on
/// it, and the rest is still published (no file is ever invalid); once its answer agrees it
/// follows. With Slinky's block topology named, `topology.yaml` holds every name the
/// annotation carries.
pub async fn slurm_leaves_out_a_disagreeing_node(env: &Env) -> anyhow::Result<()> {
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
        // EC2 puts nn-vl1 under another parent for b: b is left out (the tie between a's
        // parent and b's goes to the smaller name, nn-va1), a stays, and no file is invalid.
        label_and_wait(env, &c, &[(b.clone(), b.instance(&["nn-vs1", "nn-va2", "nn-vl1"]))]).await?;
        eventually("b left out as inconsistent", WAIT, || async {
            let guard = env.labeler.lock().await;
            let Some(l) = guard.as_ref() else {
                anyhow::bail!("no local controller");
            };
            let m = l.metrics().await?;
            Ok((metric_sum(&m, "ec2_topology_labeler_unpublished_nodes", &[r#"reason="inconsistent""#]) == 1.0).then_some(()))
        })
        .await?;
        let events: Api<Event> = Api::namespaced(c.clone(), "default");
        eventually("a TopologyNotPublished Event on node b", WAIT, || async {
            let list = events.list(&Default::default()).await?;
            Ok(list
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("TopologyNotPublished")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(b.name.as_str())
                })
                .map(|e| e.note.unwrap_or_default()))
        })
        .await
        .and_then(|note| {
            ensure!(note.contains("nn-vl1") && note.contains("nn-va1"), "{note}");
            Ok(())
        })?;
        // The ConfigMap names b without topology (under `unlabelled`), a under nn-vl1 as
        // before, and nothing was found invalid.
        let under = |cm: &ConfigMap, switch: &str| -> String {
            let text = yaml(cm);
            let lines: Vec<&str> = text.lines().collect();
            lines
                .windows(2)
                .find(|w| w[0] == format!("      - switch: {switch}"))
                .map(|w| w[1].to_string())
                .unwrap_or_default()
        };
        eventually("b under unlabelled, not under nn-vl1", WAIT, || async {
            let cm = cms.get("slurm-topology").await?;
            Ok((under(&cm, "unlabelled").contains(&b.name) && !under(&cm, "nn-vl1").contains(&b.name))
                .then_some(cm))
        })
        .await
        .and_then(|cm| {
            ensure!(under(&cm, "nn-vl1").contains(&a.name), "a stays under nn-vl1:\n{}", yaml(&cm));
            Ok(())
        })?;
        if let Some(l) = env.labeler.lock().await.as_ref() {
            let m = l.metrics().await?;
            ensure!(
                metric_sum(&m, "ec2_topology_labeler_slurm_topology_problems", &[]) == 0.0,
                "no invalid topology: the disagreeing node is not in it"
            );
        }
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
                metric_sum(&m, "ec2_topology_labeler_unpublished_nodes", &[r#"reason="inconsistent""#]) == 0.0,
                "b is published once its answer agrees"
            );
        }
        eprintln!("    a disagreeing node was left out of the ConfigMap (Event, gauge); it joined once it agreed");
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

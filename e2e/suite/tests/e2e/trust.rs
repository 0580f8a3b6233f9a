//! Only verified topology reaches a scheduler (issue 55): labels no EC2 answer vouches for
//! never shape what we publish, one node never stops publishing, and a writer that keeps
//! rewriting our label never wins.

use anyhow::ensure;
use e2e::{
    env::{Env, L, WAIT, expected_of, label_and_wait},
    fixtures::NodeSpec,
    kube_util::{self, eventually, wait_for_topology},
    labeler::metric_sum,
};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

// The suite's own readers of HyperNodes and Kueue Topologies (this file is a module of e2e.rs).
use super::{hypernodes, topology_api};

async fn events(c: &Client, node: &str, reason: &str) -> anyhow::Result<Vec<String>> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.clone(), "default");
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
        })
        .map(|e| e.note.unwrap_or_default())
        .collect())
}

/// The issue's scenario on the real API server: an EKS Hybrid node and a node with a malformed
/// providerID carry layer labels that give the fleet's leaf a second parent, and another field
/// manager rewrites an EC2 node's label five times. The HyperNodes, the Kueue Topology and
/// Slurm's topology are still published and follow the fleet; the forged nodes are not in them
/// (Slurm lists them without topology); the rewritten label is restored every time; Events and
/// metrics name each.
pub async fn forged_labels_never_reach_a_scheduler(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    // Slurm's ConfigMap, deleted at the end (the Slurm scenarios start without it).
    e2e::env::restart_labeler_with(env, &["--slurm-topology-configmap=slurm/slurm-topology"])
        .await?;
    let real: Vec<NodeSpec> = (1..=3)
        .map(|k| NodeSpec::ec2(0x130, k, "p5.48xlarge"))
        .collect();
    let hybrid = NodeSpec::ec2(0x130, 8, "p5.48xlarge")
        .with_provider_id("eks-hybrid:///us-west-2/my-cluster/mi-0130000000000008");
    let malformed =
        NodeSpec::ec2(0x130, 9, "p5.48xlarge").with_provider_id("aws:///us-west-2a/not-an-id");
    let result = async {
        let pairs: Vec<_> = real
            .iter()
            .map(|s| (s.clone(), s.instance(&["nn-ts", "nn-ta", "nn-tl"])))
            .collect();
        label_and_wait(env, &c, &pairs).await?;
        // The forged nodes: nn-tl under nn-tb (a second parent), and a leaf of their own.
        let forged = |s: &NodeSpec, path: [&str; 3]| {
            let mut n = s.node();
            let labels = n.metadata.labels.get_or_insert_default();
            for (i, v) in path.iter().enumerate() {
                labels.insert(format!("{L}{}", i + 1), v.to_string());
            }
            n
        };
        kube_util::create_nodes(
            &c,
            vec![
                forged(&hybrid, ["nn-ts", "nn-tb", "nn-tl"]),
                forged(&malformed, ["nn-ts", "nn-tb", "nn-tforged"]),
            ],
        )
        .await?;
        // Another field manager rewrites real[0]'s leaf five times; each time it comes back.
        let api: Api<Node> = Api::all(c.clone());
        let want = expected_of(&pairs[0].1);
        for round in 1..=5 {
            let patch = json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": real[0].name, "labels": {format!("{L}3"): "nn-rewritten"}}});
            api.patch(
                &real[0].name,
                &PatchParams::apply("forger").force(),
                &Patch::Apply(&patch),
            )
            .await?;
            // Our pauses (the suite's --conflict-backoff 10s, doubling) fit in the wait.
            wait_for_topology(&c, &real[0].name, &want, WAIT * 2)
                .await
                .map_err(|e| anyhow::anyhow!("rewrite {round} not restored: {e}"))?;
        }
        // A real change is still published: a fourth node joins under a new leaf.
        let joined = NodeSpec::ec2(0x130, 4, "p5.48xlarge");
        label_and_wait(
            env,
            &c,
            &[(joined.clone(), joined.instance(&["nn-ts", "nn-ta", "nn-tl2"]))],
        )
        .await?;
        let hn = eventually("the new leaf's HyperNode, under nn-ta", WAIT, || async {
            let hn = hypernodes(&c).await?;
            Ok((hn.contains_key("ec2tl-t1-nn-tl2")
                && hn.get("ec2tl-t2-nn-ta").is_some_and(|(_, members)| {
                    members.iter().any(|m| m == "ec2tl-t1-nn-tl")
                        && members.iter().any(|m| m == "ec2tl-t1-nn-tl2")
                }))
            .then_some(hn))
        })
        .await?;
        for name in ["ec2tl-t2-nn-tb", "ec2tl-t1-nn-tforged", "ec2tl-t1-nn-rewritten"] {
            ensure!(!hn.contains_key(name), "{name} published from forged labels: {hn:?}");
        }
        // The Kueue Topology is there, as it was.
        ensure!(
            topology_api(&c).get_opt("aws-network").await?.is_some(),
            "the Kueue Topology is published"
        );
        // Slurm: the real nodes under their leaves, the forged ones without topology.
        let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "slurm");
        let switch_of = |yaml: &str, node: &str| -> Option<String> {
            let lines: Vec<&str> = yaml.lines().collect();
            lines.windows(2).find_map(|w| {
                let nodes = w[1].trim().strip_prefix("nodes: ")?;
                nodes
                    .split(',')
                    .any(|n| n == node)
                    .then(|| w[0].trim().trim_start_matches("- switch: ").to_string())
            })
        };
        eventually("Slurm's topology places every node", WAIT, || async {
            let Some(cm) = cms.get_opt("slurm-topology").await? else {
                return Ok(None);
            };
            let yaml = cm.data.unwrap_or_default().remove("topology.yaml").unwrap_or_default();
            let placed = [
                (real[0].name.as_str(), "nn-tl"),
                (real[1].name.as_str(), "nn-tl"),
                (joined.name.as_str(), "nn-tl2"),
                (hybrid.name.as_str(), "unlabelled"),
                (malformed.name.as_str(), "unlabelled"),
            ]
            .iter()
            .all(|(n, sw)| switch_of(&yaml, n).as_deref() == Some(*sw));
            Ok(placed.then_some(()))
        })
        .await?;
        // Events and metrics name each.
        for s in [&hybrid, &malformed] {
            let notes = eventually("a TopologyNotPublished Event", WAIT, || async {
                let notes = events(&c, &s.name, "TopologyNotPublished").await?;
                Ok((!notes.is_empty()).then_some(notes))
            })
            .await?;
            ensure!(
                notes.len() == 1 && notes[0].contains("no EC2 instance we can verify"),
                "{}: {notes:?}",
                s.name
            );
        }
        let conflict = events(&c, &real[0].name, "TopologyLabelConflict").await?;
        ensure!(
            conflict.iter().any(|n| n.contains("forger")),
            "the conflict Event names the forger: {conflict:?}"
        );
        if let Some(l) = env.labeler.lock().await.as_ref() {
            let m = l.metrics().await?;
            let left = metric_sum(
                &m,
                "ec2_topology_labeler_unpublished_nodes",
                &[r#"reason="not_ec2""#],
            );
            ensure!(left >= 2.0, "unpublished_nodes{{not_ec2}} = {left}");
            let named = metric_sum(
                &m,
                "ec2_topology_labeler_label_conflict_writers_total",
                &[r#"manager="forger""#],
            );
            ensure!(named >= 1.0, "label_conflict_writers{{forger}} = {named}");
            ensure!(
                metric_sum(&m, "ec2_topology_labeler_hypernode_conflicts", &[]) == 0.0,
                "the forged parent never reached the HyperNodes"
            );
        }
        eprintln!(
            "    forged nodes left out (Events, unpublished_nodes), a label rewritten 5 times restored each time, HyperNodes/Kueue/Slurm published"
        );
        anyhow::Ok(joined)
    }
    .await;
    let mut names: Vec<String> = real.iter().map(|s| s.name.clone()).collect();
    names.extend([hybrid.name.clone(), malformed.name.clone()]);
    if let Ok(j) = &result {
        names.push(j.name.clone());
    } else {
        names.push(NodeSpec::ec2(0x130, 4, "p5.48xlarge").name);
    }
    for n in names {
        let _ = kube_util::delete_node(&c, &n).await;
    }
    e2e::env::restart_labeler_with(env, &[]).await?;
    let _ = Api::<ConfigMap>::namespaced(c.clone(), "slurm")
        .delete("slurm-topology", &Default::default())
        .await;
    result.map(|_| ())
}

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

/// Whether `user` may `verb` `resource` of `group` (cluster-wide), as the API server's RBAC
/// answers a SubjectAccessReview.
async fn can_i(
    c: &Client,
    user: &str,
    group: &str,
    resource: &str,
    verb: &str,
) -> anyhow::Result<bool> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_string()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_string()),
                resource: Some(resource.to_string()),
                verb: Some(verb.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(c.clone())
        .create(&Default::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// The chart's retire hook (`templates/retire-hook.yaml`) as it renders with `sets`.
fn retire_hook(sets: &[&str]) -> anyhow::Result<Vec<serde_json::Value>> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&e2e::helm::template("templates/retire-hook.yaml", sets)?)?;
    Ok(docs.into_iter().filter(|d| d.is_object()).collect())
}

/// The admin kubeconfig `admin` with its token replaced by `token`.
fn with_token(admin: &str, token: &str) -> String {
    admin
        .lines()
        .map(|l| match l.split_once("token:") {
            Some((indent, _)) => format!("{indent}token: {token}"),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Delete the object `doc` names (as applied from a rendered manifest).
async fn delete(c: &Client, doc: &serde_json::Value) -> anyhow::Result<()> {
    let obj: kube::api::DynamicObject = serde_json::from_value(doc.clone())?;
    let types = obj.types.clone().context("a document without kind")?;
    let gvk = kube::api::GroupVersionKind::try_from(&types)?;
    let (resource, caps) = kube::discovery::pinned_kind(c, &gvk).await?;
    let api: Api<kube::api::DynamicObject> = match caps.scope {
        kube::discovery::Scope::Namespaced => Api::namespaced_with(
            c.clone(),
            obj.metadata.namespace.as_deref().unwrap_or("default"),
            &resource,
        ),
        kube::discovery::Scope::Cluster => Api::all_with(c.clone(), &resource),
    };
    api.delete(&obj.metadata.name.unwrap_or_default(), &Default::default())
        .await?;
    Ok(())
}

/// The interconnect condition and taint, as `--ultraserver-health(-taint)` leave them on a node
/// of an impaired UltraServer, put on `name` by hand (with a taint of someone else's beside).
async fn impaired(c: &Client, name: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(c.clone());
    let pp = kube::api::PatchParams::default();
    nodes
        .patch_status(
            name,
            &pp,
            &kube::api::Patch::Strategic(serde_json::json!({ "status": { "conditions": [{
                "type": INTERCONNECT, "status": "True", "reason": "InterconnectImpaired",
                "message": "e2e", "lastTransitionTime": "2026-12-01T00:00:00Z"
            }] } })),
        )
        .await?;
    nodes
        .patch(
            name,
            &pp,
            &kube::api::Patch::Merge(serde_json::json!({ "spec": { "taints": [
                { "key": IMPAIRED_TAINT, "effect": "NoSchedule" },
                { "key": "example.com/theirs", "value": "x", "effect": "NoSchedule" }
            ] } })),
        )
        .await?;
    // And what UltraServer shape left (under its own field manager, as the controller writes
    // them).
    let shape = serde_json::json!({ "apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name,
        "labels": { SHAPE_LABELS[0]: "u-p6e-gb200x72", SHAPE_LABELS[1]: "18" },
        "annotations": { SHAPE_END: "2026-12-31T11:30:00Z" } } });
    nodes
        .patch(
            name,
            &kube::api::PatchParams::apply("ec2-topology-labeler-ultraserver-shape").force(),
            &kube::api::Patch::Apply(shape),
        )
        .await?;
    Ok(())
}

const SHAPE_LABELS: [&str; 2] = [
    "ec2-topology-labeler.io/ultraserver-type",
    "ec2-topology-labeler.io/capacity-block-size",
];
const SHAPE_END: &str = "ec2-topology-labeler.io/capacity-block-end";

const INTERCONNECT: &str = "UltraServerInterconnectImpaired";
const IMPAIRED_TAINT: &str = "ec2-topology-labeler.io/interconnect-impaired";

/// What of [`impaired`] node `name` still carries: the condition (or any UltraServer shape key)
/// and the taints' keys.
async fn still_impaired(c: &Client, name: &str) -> anyhow::Result<(bool, Vec<String>)> {
    let n = Api::<Node>::all(c.clone()).get(name).await?;
    let shape = n
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| SHAPE_LABELS.iter().any(|k| l.contains_key(*k)))
        || n.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(SHAPE_END));
    let condition = shape
        || n.status
            .and_then(|s| s.conditions)
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == INTERCONNECT));
    let taints = n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect();
    Ok((condition, taints))
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
/// Lease); once the controller is gone it removes the condition, the interconnect condition and
/// taint (and no other taint), our HyperNodes, KAI Topologies,
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
        // What UltraServer health left on the node (the suite's controller runs without it, so
        // only now that it is stopped).
        impaired(&c, &s.name).await?;
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
        let (condition, taints) = still_impaired(&c, &s.name).await?;
        ensure!(
            !condition && taints == ["example.com/theirs"],
            "uninstall left the interconnect condition or the shape keys ({condition}) or changed taints other than ours: {taints:?}"
        );
        ensure!(
            ["interconnect", "impaired-taint", "shape"]
                .iter()
                .all(|k| items.iter().any(|i| i["kind"] == *k && i["name"] == s.name.as_str())),
            "the report does not list the interconnect condition and taint: {items:?}"
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
        // A Kueue Topology carries Kueue's finalizer: deleted while Kueue is stopped (as it is
        // between the Kueue scenarios), it stays until Kueue runs again, and the report says so.
        let held: Vec<&serde_json::Value> = report["heldByFinalizers"]
            .as_array()
            .context("heldByFinalizers")?
            .iter()
            .collect();
        ensure!(
            held.iter().all(|h| h["kind"] == "kueue-topology"
                && h["finalizers"] == serde_json::json!(["kueue.x-k8s.io/resource-in-use"])),
            "held by something else than Kueue's finalizer: {held:?}"
        );
        let kueue = ours(&crate::topology_api(&c)).await?;
        ensure!(
            kueue.iter().all(|t| kept.iter().chain(&held).any(|k| k["name"] == *t)),
            "Kueue Topologies left that were reported neither kept nor held: {kueue:?} (kept {kept:?}, held {held:?})"
        );
        let labels_after = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
        ensure!(
            labels_after == labels_before && !labels_after.is_empty(),
            "labels changed: {labels_before:?} -> {labels_after:?}"
        );
        eprintln!(
            "    uninstall removed {} object(s), kept {:?}, held by finalizers {:?}; labels left in place",
            items.len() - kept.len() - held.len(),
            kept.iter().map(|k| &k["name"]).collect::<Vec<_>>(),
            held.iter().map(|k| &k["name"]).collect::<Vec<_>>()
        );
        anyhow::Ok(())
    }
    .await;
    e2e::env::restart_labeler_with(env, &[]).await?;
    result?;
    // The node stays for the scenarios after, without the taint of someone else's put on it.
    Api::<Node>::all(c.clone())
        .patch(
            &s.name,
            &Default::default(),
            &kube::api::Patch::Merge(serde_json::json!({ "spec": { "taints": null } })),
        )
        .await?;
    Ok(())
}

/// Turning features off: the controller removes our condition at its next start (`nodes/status`
/// stays among its rights), and with UltraServer health off the interconnect condition and taint
/// (the chart's admission policy then allows their removal only; no other taint changes); the chart then grants it nothing on the kinds turned off (the API
/// server's own SubjectAccessReview says so), and `ec2-topology-labeler retire`, run as the
/// chart's post-upgrade hook runs it (the hook's ServiceAccount and RBAC as the chart renders
/// them; no Job runs here, so the suite runs its command), retires what they published:
/// - `--volcano-hypernodes` off: this installation's HyperNodes go; one not annotated as ours
///   stays, and the admission policy refuses the hook's identity its deletion;
/// - `--kueue-topology` off: our Kueue Topologies of the configured names that no ResourceFlavor
///   names go; one a flavor names is kept and reported with the flavor; one of another name
///   (another installation's) is left alone;
/// - `--kai-topology` off: our KAI Topologies of the configured name are kept and reported
///   (workloads may name them);
///
/// and no label changes.
pub async fn turned_off_features_are_retired(env: &Env) -> anyhow::Result<()> {
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
    // marks what it publishes: the admission policy lets it delete nothing else); and a HyperNode
    // of our prefix and label not marked as this installation's.
    let ours_label = serde_json::json!({ "app.kubernetes.io/managed-by": "ec2-topology-labeler" });
    let this_installation = serde_json::json!({ "ec2-topology-labeler.io/owner": "ec2-topology-labeler/ec2-topology-labeler" });
    let levels = serde_json::json!([
        { "nodeLabel": "topology.k8s.aws/network-node-layer-1" },
        { "nodeLabel": "kubernetes.io/hostname" }
    ]);
    let pp = kube::api::PatchParams::apply("e2e-retire");
    for name in ["ret-unnamed", "ret-ultra", "ret-named", "ret-other"] {
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
    let unclaimed = "ec2tl-ret-unclaimed";
    // What stays: every Kueue Topology but the two of this configuration's names that no
    // ResourceFlavor names; `ret-other` (another installation's name, by our label too) is not
    // this installation's to judge, and stays though no flavor names it.
    let mut kueue_kept: Vec<String> = ours(&crate::topology_api(&c)).await?;
    kueue_kept.retain(|t| t != "ret-unnamed" && t != "ret-ultra");
    ensure!(
        kueue_kept.contains(&"ret-named".to_string())
            && kueue_kept.contains(&"ret-other".to_string())
    );
    let labels_before = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
    // What UltraServer health left on the node, as it would be after the option was turned off.
    impaired(&c, &s.name).await?;
    // As an operator turns them off: the chart upgraded (the hook off: no Job runs here), the
    // controller restarted with the features off.
    let off = [
        // The admission policy then lets the controller only remove the interconnect condition
        // and taint and the UltraServer shape keys.
        "config.ultraserverHealth=false",
        "config.ultraserverHealthTaint=false",
        "config.ultraserverShape=false",
        "config.volcanoHypernodes=false",
        "config.kueueTopology=false",
        "config.kaiTopology=false",
        // The names this configuration publishes under.
        "config.kueueTopologyName=ret-named",
        "config.kueueTopologyFourLayerName=ret-unnamed",
        "config.kueueTopologyUltraserverName=ret-ultra",
        "config.kaiTopologyName=ret-kai",
    ];
    let chart_with = |sets: &[&str]| -> anyhow::Result<()> {
        let sets: Vec<String> = sets
            .iter()
            .map(|s| s.to_string())
            .chain(["retireHook.enabled=false".to_string()])
            .collect();
        e2e::helm::upgrade_reusing(&env.cluster.admin_kubeconfig, &sets)?;
        Ok(())
    };
    let result = async {
        chart_with(&off)?;
        e2e::env::restart_labeler_with(
            env,
            &[
                "--node-condition=false",
                "--volcano-hypernodes=false",
                "--kueue-topology=false",
                "--kai-topology=false",
            ],
        )
        .await?;
        eventually("our condition removed by the controller", WAIT, || async {
            Ok(with_condition(&c).await?.is_empty().then_some(()))
        })
        .await?;
        eventually(
            "the interconnect condition and taint and the shape keys removed by the controller",
            WAIT,
            || async {
                let (condition, taints) = still_impaired(&c, &s.name).await?;
                Ok((!condition && !taints.iter().any(|t| t == IMPAIRED_TAINT)).then_some(taints))
            },
        )
        .await
        .and_then(|taints| {
            ensure!(
                taints == ["example.com/theirs"],
                "taints not ours changed: {taints:?}"
            );
            Ok(())
        })?;
        // A HyperNode of our prefix and label, not annotated as this installation's (made by hand,
        // or by another installation): not the hook's to remove.
        let h = serde_json::json!({"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
            "metadata": {"name": unclaimed, "labels": ours_label},
            "spec": {"tier": 1, "members": [{"type": "Node", "selector": {"exactMatch": {"name": s.name}}}]}});
        crate::hypernodes_api(&c)
            .patch(unclaimed, &pp, &kube::api::Patch::Apply(&h))
            .await?;
        // The controller's ServiceAccount holds nothing on the kinds turned off.
        let controller = format!("system:serviceaccount:{NAMESPACE}:ec2-topology-labeler");
        for (group, resource, verb) in [
            ("topology.volcano.sh", "hypernodes", "list"),
            ("topology.volcano.sh", "hypernodes", "delete"),
            ("kueue.x-k8s.io", "topologies", "list"),
            ("kueue.x-k8s.io", "topologies", "delete"),
            ("kueue.x-k8s.io", "resourceflavors", "list"),
            ("kai.scheduler", "topologies", "list"),
        ] {
            ensure!(
                !can_i(&c, &controller, group, resource, verb).await?,
                "the controller may still {verb} {resource}.{group} with the feature off"
            );
        }
        // The hook's ServiceAccount and RBAC, as the chart renders them for this configuration.
        let hook = retire_hook(&off)?;
        let rbac: Vec<&serde_json::Value> = hook.iter().filter(|d| d["kind"] != "Job").collect();
        for d in &rbac {
            kube_util::apply_yaml(&c, &serde_json::to_string(d)?, "e2e-retire").await?;
        }
        let hook_sa = format!("system:serviceaccount:{NAMESPACE}:ec2-topology-labeler-retire");
        ensure!(
            can_i(&c, &hook_sa, "topology.volcano.sh", "hypernodes", "delete").await?,
            "the hook may not delete HyperNodes"
        );
        let job = hook
            .iter()
            .find(|d| d["kind"] == "Job")
            .context("the chart renders no retire Job")?;
        let args: Vec<String> = job["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .context("the Job's args")?
            .iter()
            .filter_map(|a| a.as_str().map(str::to_string))
            // No kubelet runs the Deployment's Pods here: it never rolls out.
            .filter(|a| !a.starts_with("--wait-for-rollout"))
            .collect();
        let token = e2e::credentials::mint_token(
            &c,
            NAMESPACE,
            "ec2-topology-labeler-retire",
            "https://kubernetes.default.svc.cluster.local",
        )
        .await?;
        let kubeconfig = env.dir.join("retire-hook.kubeconfig");
        std::fs::write(
            &kubeconfig,
            with_token(&std::fs::read_to_string(&env.cluster.admin_kubeconfig)?, &token),
        )?;
        let out = std::process::Command::new(e2e::bin_dir().join("ec2-topology-labeler"))
            .args(&args)
            .args(["-o", "json"])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "warn")
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        ensure!(
            out.status.success(),
            "retire failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_str(&stdout)?;
        let kept = |name: &str, why: &str| {
            report["items"].as_array().is_some_and(|items| {
                items.iter().any(|i| {
                    i["name"] == name && i["kept"].as_str().is_some_and(|k| k.contains(why))
                })
            })
        };
        ensure!(
            kept("ret-named", "ret-flavor") && kept("ret-kai", "kai.scheduler/topology"),
            "what may be in use is not reported as kept: {report}"
        );
        ensure!(
            ours(&crate::hypernodes_api(&c)).await? == [unclaimed.to_string()],
            "this installation's HyperNodes (only) are not gone"
        );
        ensure!(ours(&crate::topology_api(&c)).await? == kueue_kept);
        let kai_after = ours(&crate::kai_topologies(&c)).await?;
        ensure!(
            kai_after.contains(&"ret-kai".to_string()),
            "the KAI Topology was not kept: {kai_after:?}"
        );
        // The hook's identity may delete no HyperNode that is not this installation's: the
        // admission policy's answer, not our code's.
        let as_hook = kube::Client::try_from(kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig)?,
            &Default::default(),
        )
        .await?)?;
        match crate::hypernodes_api(&as_hook)
            .delete(unclaimed, &Default::default())
            .await
        {
            Err(kube::Error::Api(e))
                if e.code == 403
                    && e.message.contains("ValidatingAdmissionPolicy")
                    && e.message.contains("may change or delete only what it published") =>
            {
                eprintln!("    refused, the hook deleting another's HyperNode: {}", e.message)
            }
            other => anyhow::bail!(
                "the hook's delete of a HyperNode not ours was not refused by the policy: {other:?}"
            ),
        }
        for d in rbac.iter().rev() {
            delete(&c, d).await?;
        }
        anyhow::Ok(())
    }
    .await;
    let labels_after = kube_util::topology_labels(&kube_util::labels(&c, &s.name).await?);
    // Put back what the later scenarios expect (the controller recreates its own Topologies).
    let _ = flavors.delete("ret-flavor", &Default::default()).await;
    for t in ["ret-named", "ret-other"] {
        let _ = crate::topology_api(&c).delete(t, &Default::default()).await;
    }
    let _ = crate::kai_topologies(&c)
        .delete("ret-kai", &Default::default())
        .await;
    let _ = crate::hypernodes_api(&c)
        .delete(unclaimed, &Default::default())
        .await;
    chart_with(&[
        "config.ultraserverHealth=true",
        "config.ultraserverHealthTaint=true",
        "config.volcanoHypernodes=true",
        "config.kueueTopology=true",
        "config.kaiTopology=true",
        "config.kueueTopologyName=aws-network",
        "config.kueueTopologyFourLayerName=aws-network-4-layer",
        "config.kaiTopologyName=aws-network",
    ])?;
    e2e::env::restart_labeler_with(env, &[]).await?;
    result?;
    ensure!(labels_after == labels_before, "labels changed");
    kube_util::delete_node(&c, &s.name).await?;
    Ok(())
}

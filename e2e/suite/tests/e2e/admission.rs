//! The chart's ValidatingAdmissionPolicy, enforced by the real API server: as the controller's
//! ServiceAccount, every write to a Node beyond the controller's own label and annotation keys,
//! its `TopologyLabeled` condition and the removal of the configured startup taint is refused;
//! those are allowed. (Everything the controller itself does runs under the same policy in the
//! rest of the suite: the chart is installed before the controller starts.)

use anyhow::{Context, bail, ensure};
use e2e::{
    cluster::client_from,
    env::{Env, WAIT, label_and_wait},
    fixtures::NodeSpec,
    kube_util::{self, eventually},
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

/// The startup taint the e2e install configures (`config.startupTaint`).
const PENDING: &str = "ec2-topology-labeler.io/topology-pending";
const FOREIGN_TAINT: &str = "example.com/dedicated";

fn merge() -> PatchParams {
    PatchParams::default()
}

/// A write the policy must refuse: 403, naming the policy, with `message` in its text.
async fn refused<T>(
    what: &str,
    write: impl std::future::Future<Output = kube::Result<T>>,
    message: &str,
) -> anyhow::Result<()> {
    match write.await {
        Ok(_) => bail!("{what}: accepted, but the admission policy should refuse it"),
        Err(kube::Error::Api(e)) => {
            ensure!(
                e.code == 403
                    && e.message.contains("ValidatingAdmissionPolicy")
                    && e.message.contains(message),
                "{what}: refused, but not by the policy with {message:?}: {} {}",
                e.code,
                e.message
            );
            eprintln!("    refused, {what}: {}", e.message);
            Ok(())
        }
        Err(e) => bail!("{what}: {e}"),
    }
}

async fn allowed(
    what: &str,
    write: impl std::future::Future<Output = kube::Result<Node>>,
) -> anyhow::Result<Node> {
    write.await.with_context(|| format!("{what}: refused"))
}

fn taints(n: &Node) -> Vec<Value> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| {
            t.iter()
                .filter_map(|t| serde_json::to_value(t).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// An administrator's client and one with the controller's ServiceAccount identity.
async fn clients(env: &Env) -> anyhow::Result<(Client, Client)> {
    let admin = env.admin().await?;
    let kc = env
        .cluster
        .controller_kubeconfig
        .clone()
        .context("a local control plane (the controller's ServiceAccount token)")?;
    Ok((admin, client_from(&kc).await?))
}

pub async fn admission_policy_limits_the_controllers_node_writes(env: &Env) -> anyhow::Result<()> {
    let (admin, sa) = clients(env).await?;
    let s = NodeSpec::ec2(0x1a0, 1, "p5.48xlarge");
    let inst = s.instance(&["nn-adm-spine", "nn-adm-agg", "nn-adm-leaf"]);
    label_and_wait(env, &admin, &[(s.clone(), inst)]).await?;
    let as_admin: Api<Node> = Api::all(admin.clone());
    let as_sa: Api<Node> = Api::all(sa.clone());
    let name = s.name.as_str();
    // Two taints the node's provisioner might have set: ours (released by the controller only
    // with --startup-taint, which the running controller has not) and someone else's.
    as_admin
        .patch(
            name,
            &merge(),
            &Patch::Merge(json!({ "spec": { "taints": [
                { "key": PENDING, "effect": "NoSchedule" },
                { "key": FOREIGN_TAINT, "value": "gpu", "effect": "NoSchedule" }
            ] } })),
        )
        .await?;

    // The policy may take a moment to be loaded after `helm install`: probe with a foreign label
    // of a new value each time (an attempt that went through must not hide the next one).
    let attempt = std::sync::atomic::AtomicU32::new(0);
    eventually("the admission policy in force", WAIT, || async {
        let n = attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let probe = json!({ "metadata": { "labels": { "example.com/probe": n.to_string() } } });
        let r = as_sa.patch(name, &merge(), &Patch::Merge(probe)).await;
        Ok(matches!(r, Err(kube::Error::Api(ref e)) if e.code == 403).then_some(()))
    })
    .await?;

    // Labels: only the controller's own keys, set or removed.
    let labels = |l: Value| Patch::Merge(json!({ "metadata": { "labels": l } }));
    refused(
        "a foreign label set",
        as_sa.patch(name, &merge(), &labels(json!({ "example.com/team": "a" }))),
        "may set only its own node labels; refused: example.com/team",
    )
    .await?;
    refused(
        "the kubelet's hostname label changed",
        as_sa.patch(
            name,
            &merge(),
            &labels(json!({ "kubernetes.io/hostname": "elsewhere" })),
        ),
        "refused: kubernetes.io/hostname",
    )
    .await?;
    refused(
        "a foreign label removed",
        as_sa.patch(
            name,
            &merge(),
            &labels(json!({ "eks.amazonaws.com/nodegroup": null })),
        ),
        "may remove only its own node labels; refused: eks.amazonaws.com/nodegroup",
    )
    .await?;
    refused(
        "a layer beyond the 16 the controller writes",
        as_sa.patch(
            name,
            &merge(),
            &labels(json!({ "topology.k8s.aws/network-node-layer-17": "x" })),
        ),
        "refused: topology.k8s.aws/network-node-layer-17",
    )
    .await?;
    // Server-side apply is a PATCH too, under the controller's own field manager.
    let apply = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name, "labels": {
            "topology.k8s.aws/network-node-layer-1": "nn-adm-spine",
            "example.com/applied": "yes"
        } }
    });
    refused(
        "a foreign label in a server-side apply",
        as_sa.patch(
            name,
            &PatchParams::apply("ec2-topology-labeler").force(),
            &Patch::Apply(apply),
        ),
        "refused: example.com/applied",
    )
    .await?;
    let changed = allowed(
        "one of its own labels changed",
        as_sa.patch(
            name,
            &merge(),
            &labels(json!({ "topology.k8s.aws/zone-id": "usw2-az9" })),
        ),
    )
    .await?;
    ensure!(
        kube_util::topology_labels(changed.metadata.labels.as_ref().context("labels")?)
            .get("topology.k8s.aws/zone-id")
            .map(String::as_str)
            == Some("usw2-az9"),
        "the zone-id label was not written"
    );

    // Annotations: only the controller's own keys.
    let annotations = |a: Value| Patch::Merge(json!({ "metadata": { "annotations": a } }));
    refused(
        "a foreign annotation set",
        as_sa.patch(
            name,
            &merge(),
            &annotations(json!({ "example.com/note": "x" })),
        ),
        "may set only its own node annotations; refused: example.com/note",
    )
    .await?;
    refused(
        "a foreign annotation removed",
        as_sa.patch(
            name,
            &merge(),
            &annotations(json!({ "node.alpha.kubernetes.io/ttl": null })),
        ),
        "may remove only its own node annotations; refused: node.alpha.kubernetes.io/ttl",
    )
    .await?;
    allowed(
        "its placement-group annotation set",
        as_sa.patch(
            name,
            &merge(),
            &annotations(json!({ "ec2-topology-labeler.io/placement-group": "pg" })),
        ),
    )
    .await?;
    allowed(
        "its verification record set",
        as_sa.patch(
            name,
            &merge(),
            &annotations(json!({ "ec2-topology-labeler.io/verified": "{\"v\":1}" })),
        ),
    )
    .await?;

    // Taints: only the configured startup taint, and only removed.
    let current = as_admin.get(name).await?;
    let all = taints(&current);
    let ours = |t: &Value| t["key"] == PENDING;
    let mut added = all.clone();
    added.push(json!({ "key": "example.com/added", "effect": "NoExecute" }));
    let spec_taints = |t: Vec<Value>| Patch::Merge(json!({ "spec": { "taints": t } }));
    refused(
        "a taint added",
        as_sa.patch(name, &merge(), &spec_taints(added)),
        "it may not add, change or remove other taints",
    )
    .await?;
    refused(
        "a foreign taint removed",
        as_sa.patch(
            name,
            &merge(),
            &spec_taints(
                all.iter()
                    .filter(|t| t["key"] != FOREIGN_TAINT)
                    .cloned()
                    .collect(),
            ),
        ),
        "may only remove the startup taint",
    )
    .await?;
    let mut revalued = all.clone();
    for t in revalued.iter_mut().filter(|t| ours(t)) {
        t["value"] = json!("changed");
    }
    refused(
        "the startup taint changed",
        as_sa.patch(name, &merge(), &spec_taints(revalued)),
        "it may not add, change or remove other taints",
    )
    .await?;
    refused(
        "the node cordoned",
        as_sa.patch(
            name,
            &merge(),
            &Patch::Merge(json!({ "spec": { "unschedulable": true } })),
        ),
        "may not change a Node's spec",
    )
    .await?;
    let released = allowed(
        "the startup taint removed",
        as_sa.patch(
            name,
            &merge(),
            &spec_taints(all.iter().filter(|t| !ours(t)).cloned().collect()),
        ),
    )
    .await?;
    let left: Vec<String> = taints(&released)
        .iter()
        .filter_map(|t| t["key"].as_str().map(str::to_string))
        .collect();
    ensure!(left == [FOREIGN_TAINT], "taints left: {left:?}");

    // Status: only our conditions (TopologyLabeled; UltraServerInterconnectImpaired, as the suite
    // installs the chart with config.ultraserverHealth).
    let condition = |t: &str, status: &str| {
        Patch::Strategic(json!({ "status": { "conditions": [{
            "type": t, "status": status, "reason": "E2e", "message": "e2e",
            "lastTransitionTime": "2026-12-01T00:00:00Z"
        }] } }))
    };
    refused(
        "the kubelet's Ready condition changed",
        as_sa.patch_status(name, &merge(), &condition("Ready", "False")),
        "may change only its own TopologyLabeled and UltraServerInterconnectImpaired conditions",
    )
    .await?;
    refused(
        "the node's capacity changed",
        as_sa.patch_status(
            name,
            &merge(),
            &Patch::Merge(json!({ "status": { "capacity": { "nvidia.com/gpu": "16" } } })),
        ),
        "may not change a Node's status",
    )
    .await?;
    refused(
        "a foreign label set through the status subresource",
        as_sa.patch_status(name, &merge(), &labels(json!({ "example.com/team": "a" }))),
        "refused: example.com/team",
    )
    .await?;
    allowed(
        "its TopologyLabeled condition",
        as_sa.patch_status(name, &merge(), &condition("TopologyLabeled", "True")),
    )
    .await?;
    allowed(
        "its UltraServerInterconnectImpaired condition",
        as_sa.patch_status(
            name,
            &merge(),
            &condition("UltraServerInterconnectImpaired", "False"),
        ),
    )
    .await?;

    // The policy binds the controller's ServiceAccount alone: an administrator may still.
    allowed(
        "a foreign label set by an administrator",
        as_admin.patch(name, &merge(), &labels(json!({ "example.com/team": "a" }))),
    )
    .await?;
    as_admin
        .patch(
            name,
            &merge(),
            &Patch::Merge(json!({ "spec": { "taints": null } })),
        )
        .await?;
    // The controller puts its own label back (a correction it is allowed to write).
    let want = e2e::env::expected(&["nn-adm-spine", "nn-adm-agg", "nn-adm-leaf"], &[]);
    kube_util::wait_for_topology(&admin, name, &want, WAIT).await
}

/// `admissionPolicy.exclusiveKeys`, enforced by the real API server: the chart's second policy,
/// rendered as this suite installs the chart plus that value, refuses an administrator setting,
/// changing or removing the controller's label or annotation keys (on update and on create, as a
/// kubelet registering with `--node-labels` would), and leaves other keys and the controller's
/// ServiceAccount alone. Its binding is narrowed to this scenario's nodes by a label: the rest of
/// the suite writes our keys as an administrator to make drift.
pub async fn exclusive_keys_refuse_every_other_writer(env: &Env) -> anyhow::Result<()> {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    const MARK: &str = "e2e.example.com/exclusive-keys";
    const NAME: &str = "e2e-exclusive-keys";
    let layer = "topology.k8s.aws/network-node-layer-3";
    let record = "ec2-topology-labeler.io/verified";

    let (admin, sa) = clients(env).await?;
    let s = NodeSpec::ec2(0x1a4, 1, "p5.48xlarge");
    let inst = s.instance(&["nn-exk-spine", "nn-exk-agg", "nn-exk-leaf"]);
    label_and_wait(env, &admin, &[(s.clone(), inst)]).await?;
    let name = s.name.as_str();
    let as_admin: Api<Node> = Api::all(admin.clone());
    let as_sa: Api<Node> = Api::all(sa.clone());
    let labels = |l: Value| Patch::Merge(json!({ "metadata": { "labels": l } }));
    as_admin
        .patch(name, &merge(), &labels(json!({ MARK: "yes" })))
        .await?;

    // The chart as the suite installed it (env::INSTALL_SETS), with exclusiveKeys on.
    let chart = e2e::helm::chart();
    let mut args = vec![
        "template",
        "ec2-topology-labeler",
        chart.to_str().unwrap_or_default(),
        "--namespace",
        e2e::cluster::NAMESPACE,
        "--api-versions",
        "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
        "--show-only",
        "templates/admissionpolicy.yaml",
    ];
    for set in e2e::env::INSTALL_SETS
        .iter()
        .chain(&["admissionPolicy.exclusiveKeys=true"])
    {
        args.extend(["--set", set]);
    }
    let docs: Vec<Value> = serde_saphyr::from_multiple(&e2e::helm::helm(None, &args)?)?;
    let find = |kind: &str| {
        docs.iter()
            .find(|d| {
                d["kind"] == kind
                    && d["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.ends_with("-exclusive-keys"))
            })
            .cloned()
            .with_context(|| format!("the chart renders no exclusive-keys {kind}"))
    };
    let mut policy = find("ValidatingAdmissionPolicy")?;
    let mut binding = find("ValidatingAdmissionPolicyBinding")?;
    policy["metadata"] = json!({ "name": NAME });
    binding["metadata"] = json!({ "name": NAME });
    binding["spec"]["policyName"] = json!(NAME);
    binding["spec"]["matchResources"] =
        json!({ "objectSelector": { "matchLabels": { MARK: "yes" } } });
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
    policies
        .create(&Default::default(), &serde_json::from_value(policy)?)
        .await?;
    bindings
        .create(&Default::default(), &serde_json::from_value(binding)?)
        .await?;

    let checks = async {
        // Loaded a moment after it is created: probe with a new value each time.
        let attempt = std::sync::atomic::AtomicU32::new(0);
        eventually("the exclusive-keys policy in force", WAIT, || async {
            let n = attempt.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let probe = labels(json!({ layer: format!("nn-probe-{n}") }));
            let r = as_admin.patch(name, &merge(), &probe).await;
            Ok(matches!(r, Err(kube::Error::Api(ref e)) if e.code == 403).then_some(()))
        })
        .await?;
        let ours = "only ec2-topology-labeler writes these node labels";
        refused(
            "our layer label changed by an administrator",
            as_admin.patch(name, &merge(), &labels(json!({ layer: "nn-forged" }))),
            &format!("{ours} (admissionPolicy.exclusiveKeys); refused: {layer}"),
        )
        .await?;
        refused(
            "our zone label removed by an administrator",
            as_admin.patch(
                name,
                &merge(),
                &labels(json!({ "topology.k8s.aws/zone-id": null })),
            ),
            "refused: topology.k8s.aws/zone-id",
        )
        .await?;
        refused(
            "our layer label set through the status subresource",
            as_admin.patch_status(name, &merge(), &labels(json!({ layer: "nn-forged" }))),
            ours,
        )
        .await?;
        refused(
            "the verification record forged",
            as_admin.patch(
                name,
                &merge(),
                &Patch::Merge(json!({ "metadata": { "annotations": { record: "forged" } } })),
            ),
            "only ec2-topology-labeler writes these node annotations",
        )
        .await?;
        // A Node registered with our keys (a kubelet's --node-labels).
        let mut joining = NodeSpec::ec2(0x1a5, 1, "p5.48xlarge").node();
        joining.metadata.labels.get_or_insert_default().extend([
            (MARK.to_string(), "yes".to_string()),
            (layer.to_string(), "nn-forged".to_string()),
        ]);
        refused(
            "a Node created with our layer label",
            as_admin.create(&Default::default(), &joining),
            ours,
        )
        .await?;
        // Other keys stay anyone's; ours stay the controller's to write.
        allowed(
            "a foreign label set by an administrator",
            as_admin.patch(name, &merge(), &labels(json!({ "example.com/team": "a" }))),
        )
        .await?;
        allowed(
            "our layer label written by the controller's ServiceAccount",
            as_sa.patch(name, &merge(), &labels(json!({ layer: "nn-sa-wrote" }))),
        )
        .await?;
        // And the controller, under the policy, puts its label back.
        let want = e2e::env::expected(&["nn-exk-spine", "nn-exk-agg", "nn-exk-leaf"], &[]);
        kube_util::wait_for_topology(&admin, name, &want, WAIT).await
    }
    .await;
    let _ = bindings.delete(NAME, &Default::default()).await;
    let _ = policies.delete(NAME, &Default::default()).await;
    checks
}

/// The chart's scheduler-objects policy, enforced by the real API server: as the controller's
/// ServiceAccount (whose RBAC grants HyperNodes and Topologies as whole kinds), a HyperNode or
/// Kueue Topology not annotated as this installation's is neither changed nor deleted, and none
/// is created without the annotation; one so annotated is created and deleted. (The API server's
/// answer, not our code's check: these writes are sent as they are.)
pub async fn admission_policy_holds_the_controller_to_its_scheduler_objects(
    env: &Env,
) -> anyhow::Result<()> {
    use kube::api::{DeleteParams, DynamicObject};
    const OWNER: &str = "ec2-topology-labeler.io/owner";
    // The installation as the suite runs it: the Lease ec2-topology-labeler/ec2-topology-labeler.
    const ME: &str = "ec2-topology-labeler/ec2-topology-labeler";
    let (admin, sa) = clients(env).await?;
    let hypernode = |name: &str, owner: Option<&str>| -> anyhow::Result<DynamicObject> {
        let mut o = json!({
            "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
            "metadata": { "name": name, "labels": { "app.kubernetes.io/managed-by": "ec2-topology-labeler" } },
            "spec": { "tier": 1, "members": [
                { "type": "Node", "selector": { "exactMatch": { "name": "e2e-no-such-node" } } }
            ] }
        });
        if let Some(owner) = owner {
            o["metadata"]["annotations"] = json!({ OWNER: owner });
        }
        Ok(serde_json::from_value(o)?)
    };
    let topology = |name: &str| -> anyhow::Result<DynamicObject> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology",
            "metadata": { "name": name },
            "spec": { "levels": [ { "nodeLabel": "kubernetes.io/hostname" } ] }
        }))?)
    };
    let (hn_admin, hn_sa) = (crate::hypernodes_api(&admin), crate::hypernodes_api(&sa));
    let (kt_admin, kt_sa) = (crate::topology_api(&admin), crate::topology_api(&sa));
    // Another team's: a HyperNode (even with our label, without our annotation) and a Topology.
    hn_admin
        .create(&Default::default(), &hypernode("e2e-theirs", None)?)
        .await?;
    kt_admin
        .create(&Default::default(), &topology("e2e-theirs")?)
        .await?;
    let checks = async {
        // In force a moment after `helm install`; the suite's earlier scenarios ran long after.
        refused(
            "another team's HyperNode deleted",
            hn_sa.delete("e2e-theirs", &DeleteParams::default()),
            "may change or delete only what it published (annotation ec2-topology-labeler.io/owner: ec2-topology-labeler/ec2-topology-labeler); refused: HyperNode e2e-theirs",
        )
        .await?;
        refused(
            "another team's HyperNode changed",
            hn_sa.patch(
                "e2e-theirs",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "tier": 2 } })),
            ),
            "may change or delete only what it published",
        )
        .await?;
        refused(
            "another team's HyperNode claimed by annotating it",
            hn_sa.patch(
                "e2e-theirs",
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "annotations": { OWNER: ME } } })),
            ),
            "may change or delete only what it published",
        )
        .await?;
        refused(
            "a HyperNode created without our annotation",
            hn_sa.create(&Default::default(), &hypernode("e2e-unmarked", None)?),
            "may create or keep only what is annotated as its own (ec2-topology-labeler.io/owner: ec2-topology-labeler/ec2-topology-labeler); refused: HyperNode e2e-unmarked",
        )
        .await?;
        refused(
            "a HyperNode created as another installation's",
            hn_sa.create(
                &Default::default(),
                &hypernode("e2e-unmarked", Some("elsewhere/ec2-topology-labeler"))?,
            ),
            "may create or keep only what is annotated as its own",
        )
        .await?;
        refused(
            "another team's Kueue Topology changed",
            kt_sa.patch(
                "e2e-theirs",
                &PatchParams::apply("ec2-topology-labeler").force(),
                &Patch::Apply(topology("e2e-theirs")?),
            ),
            "may change or delete only what it published (annotation ec2-topology-labeler.io/owner: ec2-topology-labeler/ec2-topology-labeler); refused: Topology e2e-theirs",
        )
        .await?;
        refused(
            "a Kueue Topology created without our annotation",
            kt_sa.create(&Default::default(), &topology("e2e-unmarked")?),
            "refused: Topology e2e-unmarked",
        )
        .await?;
        // Its own: created, changed and deleted.
        hn_sa
            .create(&Default::default(), &hypernode("e2e-mine", Some(ME))?)
            .await
            .context("our own HyperNode created: refused")?;
        hn_sa
            .patch(
                "e2e-mine",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "tier": 2 } })),
            )
            .await
            .context("our own HyperNode changed: refused")?;
        hn_sa
            .delete("e2e-mine", &DeleteParams::default())
            .await
            .context("our own HyperNode deleted: refused")?;
        // Still another team's, untouched.
        let theirs = hn_admin.get("e2e-theirs").await?;
        ensure!(
            theirs.data["spec"]["tier"] == 1 && !theirs.annotations().contains_key(OWNER),
            "another team's HyperNode changed: {:?}",
            theirs.data
        );
        anyhow::Ok(())
    }
    .await;
    let _ = hn_admin
        .delete("e2e-theirs", &DeleteParams::default())
        .await;
    let _ = hn_admin.delete("e2e-mine", &DeleteParams::default()).await;
    let _ = hn_admin
        .delete("e2e-unmarked", &DeleteParams::default())
        .await;
    let _ = kt_admin
        .delete("e2e-theirs", &DeleteParams::default())
        .await;
    let _ = kt_admin
        .delete("e2e-unmarked", &DeleteParams::default())
        .await;
    checks
}

/// RBAC cannot limit `create` by name, so the Role in Slurm's namespace lets the controller
/// create any ConfigMap there: the chart's `-configmaps` policy holds it to the one
/// `config.slurmTopologyConfigmap` names (`slurm/slurm-topology` in the suite).
pub async fn admission_policy_holds_the_controller_to_its_slurm_configmap(
    env: &Env,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let (_admin, sa) = clients(env).await?;
    let configmaps: Api<ConfigMap> = Api::namespaced(sa, "slurm");
    let other: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "other", "namespace": "slurm" },
        "data": { "topology.conf": "SwitchName=forged Nodes=x" }
    }))?;
    eventually("the configmaps policy in force", WAIT, || async {
        match configmaps.create(&Default::default(), &other).await {
            Err(kube::Error::Api(e))
                if e.code == 403 && e.message.contains("ValidatingAdmissionPolicy") =>
            {
                Ok(Some(()))
            }
            Err(kube::Error::Api(e)) if e.code == 403 => Ok(None),
            Ok(_) => {
                bail!(
                    "ConfigMap slurm/other created as the controller: the policy should refuse it"
                )
            }
            Err(e) => Err(e.into()),
        }
    })
    .await?;
    refused(
        "ConfigMap slurm/other created as the controller",
        configmaps.create(&Default::default(), &other),
        "may write only the ConfigMap slurm/slurm-topology (config.slurmTopologyConfigmap) and its verification ledger (ec2-topology-labeler/ec2-topology-labeler-records-NN); refused: slurm/other",
    )
    .await?;
    // In its own namespace, the ledger's 64 shards only (RBAC lets it create any ConfigMap
    // there: `create` cannot be limited by name).
    let own: Api<ConfigMap> = Api::namespaced(clients(env).await?.1, e2e::cluster::NAMESPACE);
    let beyond: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": "ec2-topology-labeler-records-64",
                      "namespace": e2e::cluster::NAMESPACE },
        "data": { "records": "{}" }
    }))?;
    refused(
        "ConfigMap ec2-topology-labeler-records-64 created as the controller",
        own.create(&Default::default(), &beyond),
        "refused: ec2-topology-labeler/ec2-topology-labeler-records-64",
    )
    .await
}

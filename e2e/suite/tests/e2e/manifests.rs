//! What an operator applies and runs besides `helm install`: `deploy/` (plain manifests for
//! `kubectl apply -f deploy/`), the `tree --min-labelled` check the chart's `helm test` runs, and
//! `tree --reservations`.

use anyhow::{Context, ensure};
use e2e::{
    env::{Env, label_and_wait},
    fixtures::NodeSpec,
};
use kube::{
    Api, ResourceExt,
    api::{DynamicObject, GroupVersionKind, Patch, PatchParams},
    discovery,
};

/// Every file in `deploy/` is Kubernetes objects, the Namespace first, and the API server takes
/// each of them as `kubectl apply --server-side` would (a server-side dry run: validation, the
/// admission policy's CEL compiled, nothing stored).
pub async fn deploy_manifests_apply_cleanly(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let dir = e2e::repo_root().join("deploy");
    let mut files: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    ensure!(!files.is_empty(), "deploy/ is empty");
    let mut kinds = Vec::new();
    for file in &files {
        ensure!(
            file.extension().is_some_and(|e| e == "yaml"),
            "{} is not a manifest: deploy/ holds Kubernetes objects only",
            file.display()
        );
        let text = std::fs::read_to_string(file)?;
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)
            .with_context(|| format!("parsing {}", file.display()))?;
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            let obj: DynamicObject = serde_json::from_value(doc.clone())
                .with_context(|| format!("{}: not a Kubernetes object: {doc}", file.display()))?;
            let types = obj
                .types
                .clone()
                .context("an object without apiVersion/kind")?;
            let gvk = GroupVersionKind::try_from(&types)?;
            let (resource, caps) = discovery::pinned_kind(&c, &gvk)
                .await
                .with_context(|| format!("the API server does not serve {}", types.kind))?;
            let api: Api<DynamicObject> = match caps.scope {
                discovery::Scope::Namespaced => Api::namespaced_with(
                    c.clone(),
                    &obj.namespace()
                        .context("a namespaced object without a namespace")?,
                    &resource,
                ),
                discovery::Scope::Cluster => Api::all_with(c.clone(), &resource),
            };
            api.patch(
                &obj.name_any(),
                &PatchParams::apply("kubectl").force().dry_run(),
                &Patch::Apply(doc),
            )
            .await
            .with_context(|| format!("applying {} {}", types.kind, obj.name_any()))?;
            kinds.push(types.kind);
        }
    }
    ensure!(
        kinds.first().map(String::as_str) == Some("Namespace"),
        "the Namespace must come first (kubectl applies in order): {kinds:?}"
    );
    for want in [
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        ensure!(
            kinds.iter().any(|k| k == want),
            "no {want} in deploy/: {kinds:?}"
        );
    }
    ensure!(
        !kinds.iter().any(|k| k == "Pod"),
        "the helm test pod is not a manifest to apply: {kinds:?}"
    );
    eprintln!("    deploy/: {} objects accepted: {kinds:?}", kinds.len());
    Ok(())
}

/// `tree --min-labelled=N` (the chart's `helm test`) exits 0 when N nodes are labelled, 1 with
/// a sentence saying how many are when fewer, after printing the tree either way.
pub async fn tree_min_labelled_checks_the_labels(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x1a1, 1, "p5.48xlarge");
    let inst = s.instance(&["nn-tree-spine", "nn-tree-agg", "nn-tree-leaf"]);
    let name = s.name.clone();
    label_and_wait(env, &c, &[(s, inst)]).await?;
    let tree = |min: &str| {
        std::process::Command::new(e2e::bin_dir().join("ec2-topology-labeler"))
            .args(["tree", &format!("--min-labelled={min}")])
            .env("KUBECONFIG", &env.cluster.admin_kubeconfig)
            .env("RUST_LOG", "error")
            .output()
    };
    let ok = tree("1")?;
    let printed = String::from_utf8_lossy(&ok.stdout);
    ensure!(
        ok.status.success() && printed.contains("nn-tree-leaf"),
        "tree --min-labelled=1: {:?}\n{printed}\n{}",
        ok.status,
        String::from_utf8_lossy(&ok.stderr)
    );
    // The pictures, from the same cluster: the network nodes nested, the node inside.
    for (format, opening) in [("dot", "digraph topology {"), ("mermaid", "flowchart TB")] {
        let out = std::process::Command::new(e2e::bin_dir().join("ec2-topology-labeler"))
            .args(["tree", "-o", format])
            .env("KUBECONFIG", &env.cluster.admin_kubeconfig)
            .env("RUST_LOG", "error")
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let at = |needle: &str| text.find(needle);
        ensure!(
            out.status.success()
                && text.contains(opening)
                && at("nn-tree-spine") < at("nn-tree-agg")
                && at("nn-tree-agg") < at("nn-tree-leaf")
                && at("nn-tree-leaf") < at(&name)
                && at("nn-tree-spine").is_some(),
            "tree -o {format}: {:?}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let short = tree("1000000")?;
    let said = String::from_utf8_lossy(&short.stderr);
    ensure!(
        short.status.code() == Some(1)
            && said.contains("carry complete topology labels")
            && String::from_utf8_lossy(&short.stdout).contains("nn-tree-leaf"),
        "tree --min-labelled=1000000: {:?}\n{said}",
        short.status
    );
    Ok(())
}

/// `tree --reservations` from a workstation: every Capacity Reservation of the region (12:
/// two pages of the topology call, as EC2 pages it), under the network nodes EC2 places it,
/// with the nodes that joined from it (Karpenter's label); a node naming a reservation EC2 does
/// not describe is pointed out; a role without the permission gets EC2's refusal, naming it.
pub async fn tree_reservations_show_capacity_by_network_node(env: &Env) -> anyhow::Result<()> {
    use mock_ec2::reservations::CapacityReservation;
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x1a2, 1, "p5.48xlarge");
    let inst = s.instance(&["nn-cr-spine", "nn-cr-agg", "nn-cr-leaf"]);
    let name = s.name.clone();
    label_and_wait(env, &c, &[(s, inst)]).await?;
    let id = |k: u32| format!("cr-{:017x}", 0xe2e000 + k);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "labels": {
                "karpenter.k8s.aws/capacity-reservation-id": id(1),
            }}})),
        )
        .await?;
    let reservation = |k: u32, state: &str, nodes: &[&str]| CapacityReservation {
        capacity_reservation_id: id(k),
        instance_type: "p5.48xlarge".into(),
        availability_zone: "us-west-2a".into(),
        availability_zone_id: "usw2-az1".into(),
        state: state.into(),
        network_nodes: nodes.iter().map(|n| n.to_string()).collect(),
        group_name: None,
        capacity_block_id: None,
        total_instance_count: 4,
        available_instance_count: 3,
        start_date: None,
    };
    let mut first = reservation(1, "active", &["nn-cr-spine", "nn-cr-agg", "nn-cr-leaf"]);
    first.start_date = Some("2026-12-01T08:00:00.000Z".into());
    let mut all = vec![
        first,
        reservation(2, "active", &["nn-cr-spine", "nn-cr-agg", "nn-cr-leaf"]),
        reservation(3, "expired", &["nn-cr-spine", "nn-cr-agg", "nn-cr-gone"]),
    ];
    all.extend(
        (4..=12).map(|k| reservation(k, "pending", &["nn-cr-spine", "nn-cr-agg2", "nn-cr-leaf2"])),
    );
    env.mock_admin.set_reservations(&all).await?;
    env.mock_admin.reset_stats().await?;
    let tree = |extra: &[&str]| {
        e2e::env::operator_cli(env)
            .args(["tree", "--reservations"])
            .args(extra)
            .env_remove("AWS_REGION")
            .env("RUST_LOG", "error")
            .output()
    };
    let out = tree(&[])?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line_of = |needle: &str| {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_default()
    };
    ensure!(
        out.status.success()
            && text.contains("nn-cr-spine / nn-cr-agg / nn-cr-leaf\n")
            && line_of(&id(1)).contains("active  reserved 4  in use 1  joined 1")
            && line_of(&id(2)).contains("(idle: none joined)")
            && line_of(&id(7)).contains("pending")
            && !text.contains("nn-cr-gone"),
        "tree --reservations: {:?}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("    tree --reservations:\n{text}");
    // The expired one is not placed (EC2 gives no network nodes for it).
    let after_note = text
        .split("(no network nodes from EC2")
        .nth(1)
        .unwrap_or_default();
    ensure!(
        after_note.contains(&id(3)),
        "the expired reservation is listed unplaced:\n{text}"
    );
    let stats = env.mock_admin.reservation_stats().await?;
    ensure!(
        stats.topology_calls == 2 && stats.reservations_calls == 1 && stats.failed == 0,
        "12 reservations: two topology pages of 10 and one reservations page: {stats:?}"
    );
    let json = tree(&["-o", "json"])?;
    let v: serde_json::Value = serde_json::from_slice(&json.stdout)
        .with_context(|| String::from_utf8_lossy(&json.stderr).into_owned())?;
    let joined = v["placed"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["reservations"].as_array().into_iter().flatten())
        .find(|r| r["reservation"]["id"] == id(1).as_str())
        .map(|r| r["joined"].clone());
    ensure!(
        joined == Some(serde_json::json!([name])),
        "-o json: the node joined from {}: {v}",
        id(1)
    );
    let start = v["placed"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["reservations"].as_array().into_iter().flatten())
        .find(|r| r["reservation"]["id"] == id(1).as_str())
        .map(|r| r["reservation"]["start"].clone());
    ensure!(
        start == Some(serde_json::json!("2026-12-01T08:00:00Z")),
        "-o json: when {} started (EC2's startDate): {start:?}",
        id(1)
    );
    // Read the other way (the topology call leaves out what is neither active nor pending):
    // the expired reservation still listed, from the reservations call, and a node carrying
    // its ID not called a stranger.
    env.mock_admin
        .set_faults(&mock_ec2::Faults {
            reservations_topology_active_only: true,
            ..Default::default()
        })
        .await?;
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "labels": {
                "karpenter.k8s.aws/capacity-reservation-id": id(3),
            }}})),
        )
        .await?;
    let out = tree(&[]);
    env.mock_admin
        .set_faults(&mock_ec2::Faults::default())
        .await?;
    let out = out?;
    let text = String::from_utf8_lossy(&out.stdout);
    let unplaced = text
        .split("(no network nodes from EC2")
        .nth(1)
        .unwrap_or_default();
    ensure!(
        out.status.success()
            && unplaced.contains(&format!("{}  p5.48xlarge  expired  reserved 4", id(3)))
            && !text.contains("not a reservation EC2 describes"),
        "with the topology call leaving the expired one out:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A node naming a reservation EC2 does not describe.
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "labels": {
                "karpenter.k8s.aws/capacity-reservation-id": id(99),
            }}})),
        )
        .await?;
    let out = tree(&[])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        text.contains(&format!("! {}: carried by 1 node(s) ({name})", id(99))),
        "an unknown reservation is pointed out:\n{text}"
    );
    // Without the permission: EC2's refusal, naming it, and a failed exit.
    env.mock_admin
        .set_faults(&mock_ec2::Faults {
            reservations_unauthorized: true,
            ..Default::default()
        })
        .await?;
    let denied = tree(&[]);
    env.mock_admin
        .set_faults(&mock_ec2::Faults::default())
        .await?;
    env.mock_admin.set_reservations(&[]).await?;
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "labels": {
                "karpenter.k8s.aws/capacity-reservation-id": null,
            }}})),
        )
        .await?;
    let denied = denied?;
    let said = String::from_utf8_lossy(&denied.stderr);
    ensure!(
        !denied.status.success() && said.contains("ec2:DescribeCapacityReservationTopology"),
        "without the permission: {:?}\n{said}",
        denied.status
    );
    Ok(())
}

/// `--capacity-reservations`: the leader counts each live reservation (instances reserved, the
/// nodes joined from it) per deepest network node as gauges, and follows a change at its next
/// interval; a reservation that ended drops its series.
pub async fn reserved_capacity_metrics_follow_the_reservations(env: &Env) -> anyhow::Result<()> {
    use mock_ec2::reservations::CapacityReservation;
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x1a3, 1, "p5.48xlarge");
    let inst = s.instance(&["nn-rm-spine", "nn-rm-agg", "nn-rm-leaf"]);
    let name = s.name.clone();
    label_and_wait(env, &c, &[(s, inst)]).await?;
    let id = format!("cr-{:017x}", 0xe2e100);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    let set_label = |v: serde_json::Value| {
        let nodes = nodes.clone();
        let name = name.clone();
        async move {
            nodes
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({ "metadata": { "labels": {
                        "karpenter.k8s.aws/capacity-reservation-id": v,
                    }}})),
                )
                .await
        }
    };
    set_label(serde_json::json!(id)).await?;
    let mut reservation = CapacityReservation {
        capacity_reservation_id: id.clone(),
        instance_type: "p5.48xlarge".into(),
        availability_zone: "us-west-2a".into(),
        availability_zone_id: "usw2-az1".into(),
        state: "active".into(),
        network_nodes: vec![
            "nn-rm-spine".into(),
            "nn-rm-agg".into(),
            "nn-rm-leaf".into(),
        ],
        group_name: None,
        capacity_block_id: None,
        total_instance_count: 8,
        available_instance_count: 7,
        // Started three hours ago: past the default --reservation-idle-after (1h).
        start_date: Some(
            k8s_openapi::jiff::Timestamp::now()
                .checked_sub(k8s_openapi::jiff::SignedDuration::from_hours(3))?
                .strftime("%Y-%m-%dT%H:%M:%S.000Z")
                .to_string(),
        ),
    };
    env.mock_admin
        .set_reservations(&[reservation.clone()])
        .await?;
    // In a Pod's namespace (the downward API's POD_NAMESPACE): Events about the controller
    // itself go on its Pod.
    e2e::env::restart_labeler_with_env(
        env,
        &[
            "--capacity-reservations=true",
            "--reservations-interval=10s",
        ],
        &[("POD_NAMESPACE", "default")],
    )
    .await?;
    let idle_events = || async {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(c.clone(), "default");
        anyhow::Ok(
            events
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .filter(|e| {
                    e.reason.as_deref() == Some("ReservationIdle")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some("controller-1")
                        && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Pod")
                })
                .filter_map(|e| e.note)
                .filter(|n| n.contains(&id))
                .collect::<Vec<_>>(),
        )
    };
    let series = format!(
        "{{network_node=\"nn-rm-leaf\",reservation=\"{id}\",instance_type=\"p5.48xlarge\"}}"
    );
    let wait_for = |want: Vec<String>, gone: Vec<String>| async move {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
        loop {
            let text = {
                let guard = env.labeler.lock().await;
                guard
                    .as_ref()
                    .context("a local controller")?
                    .metrics()
                    .await?
            };
            if want.iter().all(|w| text.contains(w.as_str()))
                && gone.iter().all(|g| !text.contains(g.as_str()))
            {
                return anyhow::Ok(());
            }
            if std::time::Instant::now() > deadline {
                anyhow::bail!("metrics never showed {want:?} without {gone:?}:\n{text}");
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    };
    let result = async {
        wait_for(
            vec![
                format!("ec2_topology_labeler_reserved_instances{series} 8"),
                format!("ec2_topology_labeler_reserved_instances_joined{series} 1"),
            ],
            vec![],
        )
        .await?;
        ensure!(
            idle_events().await?.is_empty(),
            "a node joined from it: not idle"
        );
        // The reservation grows; the node leaves it: both followed.
        reservation.total_instance_count = 16;
        env.mock_admin
            .set_reservations(&[reservation.clone()])
            .await?;
        set_label(serde_json::Value::Null).await?;
        wait_for(
            vec![
                format!("ec2_topology_labeler_reserved_instances{series} 16"),
                format!("ec2_topology_labeler_reserved_instances_joined{series} 0"),
            ],
            vec![],
        )
        .await?;
        // Active for three hours with none joined: one Warning Event on the leader's Pod,
        // saying where and since when (not repeated within the test's minutes).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let notes = loop {
            let notes = idle_events().await?;
            if !notes.is_empty() || std::time::Instant::now() > deadline {
                break notes;
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        };
        ensure!(
            notes.len() == 1
                && notes[0].contains(
                    "16 x p5.48xlarge in us-west-2a under nn-rm-spine / nn-rm-agg / nn-rm-leaf"
                )
                && notes[0].contains("has been active since")
                && notes[0].contains("(3h")
                && notes[0].contains("9 instance(s) run in it outside this cluster"),
            "one ReservationIdle Event on the Pod: {notes:?}"
        );
        // It ends: no capacity, its series gone.
        reservation.state = "expired".into();
        env.mock_admin
            .set_reservations(&[reservation.clone()])
            .await?;
        wait_for(
            vec![],
            vec![format!("ec2_topology_labeler_reserved_instances{series}")],
        )
        .await
    }
    .await;
    env.mock_admin.set_reservations(&[]).await?;
    e2e::env::restart_labeler_with(env, &[]).await?;
    result
}

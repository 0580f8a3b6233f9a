//! The startup taint and the `TopologyLabeled` condition on the real API server: released only
//! once the labels are on the node, by policy for nodes we cannot label, kept while EC2 fails
//! until the timeout; other taints stay.

use super::*;

pub(super) const PENDING: &str = "ec2-topology-labeler.io/topology-pending";
pub(super) const GATE_LABEL: &str = "e2e.ec2-topology-labeler.io/gate";

/// `spec`'s Node as a provisioner registers it with the startup taint (and `others`).
pub(super) fn tainted_node(spec: &NodeSpec, others: &[&str]) -> k8s_openapi::api::core::v1::Node {
    let mut n = spec.node();
    n.metadata
        .labels
        .get_or_insert_default()
        .insert(GATE_LABEL.into(), "1".into());
    let taints = n
        .spec
        .get_or_insert_default()
        .taints
        .get_or_insert_default();
    for key in std::iter::once(&PENDING).chain(others) {
        taints.push(k8s_openapi::api::core::v1::Taint {
            key: key.to_string(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        });
    }
    n
}

pub(super) async fn node_now(
    c: &Client,
    name: &str,
) -> anyhow::Result<k8s_openapi::api::core::v1::Node> {
    Ok(Api::<k8s_openapi::api::core::v1::Node>::all(c.clone())
        .get(name)
        .await?)
}

pub(super) fn taint_keys(n: &k8s_openapi::api::core::v1::Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

pub(super) fn topology_condition(n: &k8s_openapi::api::core::v1::Node) -> Option<(String, String)> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "TopologyLabeled")
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

/// Wait until `name` no longer carries the startup taint and its condition reads `condition`.
pub(super) async fn released(
    c: &Client,
    name: &str,
    condition: (&str, &str),
    within: Duration,
) -> anyhow::Result<k8s_openapi::api::core::v1::Node> {
    eventually(
        &format!("{name}: startup taint released, TopologyLabeled {condition:?}"),
        within,
        || async {
            let n = node_now(c, name).await?;
            let cond = topology_condition(&n);
            let done = !taint_keys(&n).iter().any(|k| k == PENDING)
                && cond
                    .as_ref()
                    .is_some_and(|(s, r)| (s.as_str(), r.as_str()) == condition);
            Ok(done.then_some(n))
        },
    )
    .await
}

pub(super) async fn event_count(c: &Client, node: &str, reason: &str) -> anyhow::Result<usize> {
    events_about(c, "Node", node, reason).await
}

/// The startup taint: released only once the labels are on the node (seen by a watch of every
/// version), by policy for nodes we cannot label, kept while EC2 fails until the timeout (then
/// released with a Warning Event); other taints, and one added meanwhile, stay; the
/// TopologyLabeled condition reads right each time. The controller runs under the chart's RBAC
/// (installed with `config.nodeCondition=true`).
pub(super) async fn startup_taint_and_condition(env: &Env) -> anyhow::Result<()> {
    const TIMEOUT_S: u64 = 15;
    let c = env.admin().await?;
    let taint_flag = format!("--startup-taint={PENDING}:NoSchedule");
    let timeout_flag = format!("--startup-taint-timeout={TIMEOUT_S}s");
    e2e::env::restart_labeler_with(env, &[&taint_flag, &timeout_flag, "--node-condition=true"])
        .await?;
    let result = startup_gate_steps(env, &c, TIMEOUT_S).await;
    let _ = env.mock_admin.set_faults(&Faults::default()).await;
    e2e::env::restart_labeler_with(env, &[]).await?;
    result
}

pub(super) async fn startup_gate_steps(
    env: &Env,
    c: &Client,
    timeout_s: u64,
) -> anyhow::Result<()> {
    let ok = NodeSpec::ec2(0x115, 1, "p5.48xlarge");
    let unsupported = NodeSpec::ec2(0x115, 2, "m7i.large");
    let fargate = NodeSpec::ec2(0x115, 3, "m5.large")
        .with_provider_id("aws:///us-west-2a/fargate-ip-10-1-2-3.us-west-2.compute.internal");
    let ok_path = ["nn-spine-t", "nn-agg-t1", "nn-leaf-t11"];
    env.mock_admin.upsert(&ok.instance(&ok_path)).await?;

    // Every version of the labelled node the API server sends: none may lack the taint before
    // it carries its labels.
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    let watched = ok.name.clone();
    let violations = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = violations.clone();
    let watch = tokio::spawn(async move {
        use futures::StreamExt;
        let cfg = kube::runtime::watcher::Config::default().labels(&format!("{GATE_LABEL}=1"));
        let mut stream = std::pin::pin!(kube::runtime::WatchStreamExt::applied_objects(
            kube::runtime::watcher(api, cfg)
        ));
        while let Some(Ok(n)) = stream.next().await {
            if kube::ResourceExt::name_any(&n) != watched {
                continue;
            }
            let labelled = kube::ResourceExt::labels(&n).contains_key(&format!("{L}3"));
            if !taint_keys(&n).iter().any(|k| k == PENDING)
                && !labelled
                && let Ok(mut v) = seen.lock()
            {
                v.push(format!("{:?}", n.metadata.resource_version));
            }
        }
    });
    let created = Instant::now();
    kube_util::create_nodes(
        c,
        vec![
            tainted_node(&ok, &["example.com/gpu"]),
            tainted_node(&unsupported, &[]),
            tainted_node(&fargate, &[]),
        ],
    )
    .await?;
    let n = released(c, &ok.name, ("True", "Labelled"), WAIT).await?;
    eprintln!(
        "    labelled node released {:.1}s after creation",
        created.elapsed().as_secs_f64()
    );
    ensure!(
        kube_util::topology_labels(&kube_util::labels(c, &ok.name).await?)
            == expected(&ok_path, &[]),
        "released without its labels"
    );
    // (The API server adds node.kubernetes.io/not-ready to a node without a Ready kubelet.)
    ensure!(
        taint_keys(&n).iter().any(|k| k == "example.com/gpu"),
        "another taint was lost: {:?}",
        taint_keys(&n)
    );
    released(c, &unsupported.name, ("False", "NotDescribed"), WAIT).await?;
    released(c, &fargate.name, ("False", "Skipped"), WAIT).await?;
    // The Event is created after the write that released the taint: wait for it, then make
    // sure there is one.
    eventually(
        "an Event saying why the unsupported node was released",
        WAIT,
        || async {
            Ok(
                (event_count(c, &unsupported.name, "StartupTaintReleased").await? >= 1)
                    .then_some(()),
            )
        },
    )
    .await?;
    ensure!(
        event_count(c, &unsupported.name, "StartupTaintReleased").await? == 1,
        "one Event saying why the unsupported node was released"
    );

    // EC2 fails: a new node keeps its taint (and says why) until the timeout.
    env.mock_admin
        .set_faults(&Faults {
            error_5xx_fraction: 1.0,
            ..Faults::default()
        })
        .await?;
    let down = NodeSpec::ec2(0x115, 4, "p5.48xlarge");
    let down_path = ["nn-spine-t", "nn-agg-t1", "nn-leaf-t12"];
    env.mock_admin.upsert(&down.instance(&down_path)).await?;
    let joined = Instant::now();
    kube_util::create_nodes(c, vec![tainted_node(&down, &[])]).await?;
    eventually("condition Ec2Unavailable", WAIT, || async {
        let n = node_now(c, &down.name).await?;
        Ok(
            (topology_condition(&n) == Some(("False".into(), "Ec2Unavailable".into())))
                .then_some(()),
        )
    })
    .await?;
    // Someone adds a taint of their own while ours waits.
    tokio::time::sleep(Duration::from_secs(timeout_s / 2)).await;
    let mut n = node_now(c, &down.name).await?;
    let mut taints = n.spec.take().and_then(|s| s.taints).unwrap_or_default();
    taints.push(k8s_openapi::api::core::v1::Taint {
        key: "example.com/maintenance".into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    });
    Api::<k8s_openapi::api::core::v1::Node>::all(c.clone())
        .patch(
            &down.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": n.metadata.resource_version}, "spec": {"taints": taints}})),
        )
        .await?;
    let early = taint_keys(&node_now(c, &down.name).await?);
    ensure!(
        early.iter().any(|k| k == PENDING),
        "released before the timeout while EC2 failed: {early:?}"
    );
    let n = released(
        c,
        &down.name,
        ("False", "Ec2Unavailable"),
        Duration::from_secs(timeout_s + 15),
    )
    .await?;
    let after = joined.elapsed();
    eprintln!(
        "    EC2 failing: released by the timeout ({timeout_s}s) {:.1}s after creation",
        after.as_secs_f64()
    );
    // creationTimestamp has whole seconds: the release can come up to 1 s early by our clock.
    ensure!(
        after + Duration::from_secs(1) >= Duration::from_secs(timeout_s),
        "released {after:?} after creation, before the {timeout_s}s timeout"
    );
    ensure!(
        taint_keys(&n)
            .iter()
            .any(|k| k == "example.com/maintenance"),
        "the taint added meanwhile was lost: {:?}",
        taint_keys(&n)
    );
    // The Event follows the release's write (CI saw the release and not yet the Event).
    eventually("a Warning Event for the timeout", WAIT, || async {
        Ok((event_count(c, &down.name, "StartupTaintTimedOut").await? >= 1).then_some(()))
    })
    .await?;
    ensure!(
        event_count(c, &down.name, "StartupTaintTimedOut").await? == 1,
        "one Warning Event for the timeout"
    );
    // EC2 back: the labels come, the condition turns True.
    env.mock_admin.set_faults(&Faults::default()).await?;
    released(c, &down.name, ("True", "Labelled"), WAIT).await?;
    wait_for_topology(c, &down.name, &expected(&down_path, &[]), WAIT).await?;

    watch.abort();
    let v = violations.lock().map(|v| v.clone()).unwrap_or_default();
    ensure!(
        v.is_empty(),
        "versions without the taint nor the labels: {v:?}"
    );
    let metrics = {
        let guard = env.labeler.lock().await;
        guard.as_ref().context("controller")?.metrics().await?
    };
    for (outcome, want) in [("labelled", 1.0), ("unsupported", 2.0), ("timeout", 1.0)] {
        let got = metric_sum(
            &metrics,
            "ec2_topology_labeler_startup_taint_releases_total",
            &[&format!("reason=\"{outcome}\"")],
        );
        ensure!(got == want, "releases {outcome}: {got}, want {want}");
    }
    for s in [&ok, &unsupported, &fargate, &down] {
        kube_util::delete_node(c, &s.name).await?;
    }
    Ok(())
}

//! What only a real cluster shows (kind, started by `e2e/kind/run.sh`): the image starting in
//! pods under the chart's security context, kubelet probes, in-cluster configuration under the
//! chart's RBAC alone, real kubelets whose providerIDs are EC2's, the real kube-scheduler placing
//! a pod by our labels, a leader pod deleted, a node drained, the release upgraded and removed.
//!
//! Phases, run by `run.sh` around the shared e2e suite (which needs the chart installed):
//! `install::` (from a cluster without the chart to the controller labelling), `ops::` (what
//! an operator does to a running installation, ending with its removal), then `creds::`
//! (credentials as EKS gives them: IRSA and EKS Pod Identity, see `kind/creds.rs`).

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use e2e::{
    cluster::NAMESPACE,
    env::{Env, ScenarioFn, WAIT},
    fixtures::NodeSpec,
    helm,
    incluster::{self, KindEnv, LossWatch, RELEASE},
    kube_util::{self, eventually, topology_labels, wait_for_topology},
};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

#[path = "kind/creds.rs"]
mod creds;

/// The chart's lease duration in e2e/kind/values.yaml.
const LEASE: Duration = Duration::from_secs(6);
/// A pod that may only run on the node under this leaf switch (the worker's, in mock-ec2.yaml).
const WAITER: &str = "waits-for-topology";
const WORKER_LEAF: &str = "nn-kind-leaf-w1";
const LAYER_3: &str = "topology.k8s.aws/network-node-layer-3";
/// The startup taint the kind values configure; the worker gets it before install, as a
/// provisioner would register it.
const PENDING: &str = "ec2-topology-labeler.io/topology-pending";
/// A pod that only needs the worker (not a leaf): held back by the startup taint alone.
const HELD: &str = "waits-for-the-startup-taint";

fn pinned_pod(name: &str, hostname: &str, image: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeSelector": { "kubernetes.io/hostname": hostname },
            "terminationGracePeriodSeconds": 0,
            "containers": [{ "name": "app", "image": image, "imagePullPolicy": "Never" }]
        }
    }))?)
}

/// The kind nodes (they run kubelets), by role.
async fn kind_nodes(c: &Client) -> anyhow::Result<(Node, Node)> {
    let api: Api<Node> = Api::all(c.clone());
    let nodes = api.list(&Default::default()).await?.items;
    let role = |n: &&Node, cp: bool| {
        n.labels()
            .contains_key("node-role.kubernetes.io/control-plane")
            == cp
            && n.spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .is_some_and(|p| p.starts_with("aws:///"))
            && n.status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .is_some_and(|i| !i.kubelet_version.is_empty() && i.kubelet_version != "v0.0.0")
    };
    let cp = nodes.iter().find(|n| role(n, true)).cloned();
    let worker = nodes
        .iter()
        .find(|n| role(n, false) && n.name_any().contains("worker"));
    Ok((
        cp.context("a control-plane node with an aws:/// providerID")?,
        worker
            .cloned()
            .context("a worker node with an aws:/// providerID")?,
    ))
}

/// The image tag of the pause container the nodes already hold (pods here never pull).
async fn pause_image(c: &Client) -> anyhow::Result<String> {
    let (_, worker) = kind_nodes(c).await?;
    worker
        .status
        .and_then(|s| s.images)
        .into_iter()
        .flatten()
        .flat_map(|i| i.names.unwrap_or_default())
        .find(|n| n.starts_with("registry.k8s.io/pause:"))
        .context("no pause image on the worker")
}

fn waiter_pod(name: &str, leaf: &str, image: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default" },
        "spec": {
            "nodeSelector": { LAYER_3: leaf },
            "terminationGracePeriodSeconds": 0,
            "containers": [{ "name": "app", "image": image, "imagePullPolicy": "Never" }]
        }
    }))?)
}

async fn unschedulable(pods: &Api<Pod>, name: &str) -> anyhow::Result<Option<()>> {
    let p = pods.get(name).await?;
    let unschedulable = p
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        });
    Ok(unschedulable.then_some(()))
}

// ---------------------------------------------------------------------------------------------
// install::

/// Before the chart: the kind nodes carry no topology labels, and a pod that needs the worker's
/// leaf switch is refused by the real scheduler.
async fn pod_waits_for_topology_before_install(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let (cp, worker) = kind_nodes(&c).await?;
    for n in [&cp, &worker] {
        let t = topology_labels(n.labels());
        ensure!(
            t.is_empty(),
            "{} is labelled before install: {t:?}",
            n.name_any()
        );
    }
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let _ = pods.delete(WAITER, &DeleteParams::default()).await;
    eventually("the old waiter pod gone", WAIT, || async {
        Ok(pods.get_opt(WAITER).await?.is_none().then_some(()))
    })
    .await?;
    let image = pause_image(&c).await?;
    pods.create(
        &PostParams::default(),
        &waiter_pod(WAITER, WORKER_LEAF, &image)?,
    )
    .await?;
    eventually(
        "the scheduler to refuse the pod (no node has the leaf label yet)",
        WAIT,
        || unschedulable(&pods, WAITER),
    )
    .await?;
    // The startup taint, as a provisioner registers it; a pod that needs only this node (no
    // toleration) must wait for its release.
    let nodes: Api<Node> = Api::all(c.clone());
    let mut taints = worker
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    if !taints.iter().any(|t| t.key == PENDING) {
        taints.push(k8s_openapi::api::core::v1::Taint {
            key: PENDING.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        });
        nodes
            .patch(
                &worker.name_any(),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({
                    "metadata": {"resourceVersion": worker.metadata.resource_version},
                    "spec": {"taints": taints}
                })),
            )
            .await?;
    }
    let _ = pods.delete(HELD, &DeleteParams::default()).await;
    eventually("the old held pod gone", WAIT, || async {
        Ok(pods.get_opt(HELD).await?.is_none().then_some(()))
    })
    .await?;
    let hostname = worker
        .labels()
        .get("kubernetes.io/hostname")
        .cloned()
        .unwrap_or_else(|| worker.name_any());
    pods.create(
        &PostParams::default(),
        &pinned_pod(HELD, &hostname, &image)?,
    )
    .await?;
    eventually(
        "the scheduler to refuse the pod (the worker carries the startup taint)",
        WAIT,
        || unschedulable(&pods, HELD),
    )
    .await
}

/// `REGISTRY` as the README's blocks take it: where the suite's release is (its chart is at
/// `oci://REGISTRY/charts/ec2-topology-labeler`).
fn readme_registry(kind: &KindEnv) -> anyhow::Result<String> {
    kind.release
        .chart
        .strip_prefix("oci://")
        .and_then(|r| r.strip_suffix("/charts/ec2-topology-labeler"))
        .map(str::to_string)
        .with_context(|| {
            format!(
                "the release's chart {} is not in REGISTRY/charts",
                kind.release.chart
            )
        })
}

/// A folder (under `dir`) holding the `helm` the docs' blocks run: Helm itself, with what this
/// cluster needs and a platform team's does not added: `--plain-http` to a command that names
/// the suite's registry (it has no TLS), and to `install` the kind values (EC2 is the in-cluster
/// mock) and `--wait`.
fn helm_as_the_docs_run_it(
    kind: &KindEnv,
    dir: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    let bin = dir.join("helm-bin");
    std::fs::create_dir_all(&bin)?;
    // Each value single-quoted for bash; the registry is matched as a literal, not a pattern.
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let plain_http = if kind.release.plain_http {
        format!(
            "[[ \"$*\" == *\"oci://\"{}\"/\"* ]] && extra+=(--plain-http)\n",
            quote(&readme_registry(kind)?)
        )
    } else {
        String::new()
    };
    let wrapper = bin.join("helm");
    // `install` gets the kind values and waits; `upgrade` waits less than a doc block may run
    // (120 s), so that a slow roll fails the block instead of leaving the release pending.
    std::fs::write(
        &wrapper,
        format!(
            "#!/usr/bin/env bash\nset -euo pipefail\nextra=()\n{plain_http}case \"${{1:-}}\" in\n  install) extra+=(-f {values} --wait --timeout 180s) ;;\n  upgrade) extra+=(--timeout 100s) ;;\nesac\nexec {helm} \"$@\" ${{extra[@]+\"${{extra[@]}}\"}}\n",
            helm = quote(&helm::helm_bin()?.to_string_lossy()),
            values = quote(&kind.values.to_string_lossy()),
        ),
    )?;
    std::fs::set_permissions(
        &wrapper,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )?;
    Ok(bin)
}

/// Run a doc block as written: `bash -e -o pipefail`, cut after `seconds`, in `dir`, with
/// `env` (KUBECONFIG, PATH, REGISTRY, ...), no input; its output (stdout and stderr), or why it
/// failed.
fn run_block(
    b: &e2e::doctest::Block,
    seconds: u32,
    dir: &std::path::Path,
    env: &[(&str, &std::ffi::OsStr)],
) -> anyhow::Result<String> {
    let out = std::process::Command::new("timeout")
        .args([
            &seconds.to_string(),
            "bash",
            "-e",
            "-o",
            "pipefail",
            "-c",
            &b.code,
        ])
        .current_dir(dir)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .context("running bash")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        out.status.success(),
        "{} exited {:?}:\n{}\n--- output:\n{text}",
        b.at(),
        out.status.code(),
        b.code
    );
    Ok(text)
}

/// The README's install block (`<!-- doc-test: kind-install -->`) run as written: `REGISTRY` the
/// suite's registry (where e2e/kind/run.sh ran the README's release block), and a `helm` that
/// adds to `install` what this cluster needs and a platform team's does not: the kind values
/// (EC2 is the in-cluster mock), `--plain-http` (this registry has no TLS) and `--wait`.
fn install_as_the_readme_says(kind: &KindEnv) -> anyhow::Result<String> {
    use e2e::doctest::{self, Mark};
    let block = doctest::blocks(&e2e::repo_root())?
        .into_iter()
        .find(|b| b.mark == Some(Mark::KindInstall))
        .context("README.md has no kind-install block")?;
    let registry = readme_registry(kind)?;
    let dir = std::env::temp_dir().join(format!("ec2tl-readme-install-{}", std::process::id()));
    let bin = helm_as_the_docs_run_it(kind, &dir)?;
    let path = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    let text = run_block(
        &block,
        240,
        &dir,
        &[
            ("KUBECONFIG", kind.kubeconfig.as_os_str()),
            ("REGISTRY", registry.as_ref()),
            ("PATH", path.as_os_str()),
        ],
    )
    .with_context(|| format!("REGISTRY={registry}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("    {}: ran as written (REGISTRY={registry})", block.at());
    Ok(text)
}

/// `helm install` exactly as the README says (its install block, plus the kind values): both
/// replicas start from our image, pass their probes and become Ready with no restart, under the
/// chart's security context.
async fn chart_installs_and_both_replicas_become_ready(env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let c = env.admin().await?;
    let started = Instant::now();
    install_as_the_readme_says(&kind)?;
    incluster::wait_rolled_out(&c, 2, Duration::from_secs(60)).await?;
    eprintln!(
        "    helm install --wait returned, 2/2 ready, in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let pods = incluster::pods(&c).await?;
    ensure!(pods.len() == 2, "{} controller pods", pods.len());
    for p in &pods {
        ensure!(incluster::is_ready(p), "{} is not Ready", p.name_any());
        ensure!(
            incluster::restarts(p) == 0,
            "{} restarted {} times at install",
            p.name_any(),
            incluster::restarts(p)
        );
        let spec = p.spec.as_ref().context("pod spec")?;
        let container = spec.containers.first().context("container")?;
        // The image the released chart pins, pulled by kind's containerd from the registry.
        ensure!(
            container.image.as_deref() == Some(kind.release.image.as_str()),
            "{} runs {:?}, not the release's {}",
            p.name_any(),
            container.image,
            kind.release.image
        );
        let status = p.status.as_ref().context("pod status")?;
        let image_id = status
            .container_statuses
            .as_ref()
            .and_then(|cs| cs.first())
            .map(|c| c.image_id.clone())
            .unwrap_or_default();
        ensure!(
            image_id == kind.release.image,
            "{}: the kubelet reports image {image_id}",
            p.name_any()
        );
        if kind.family == "ipv6" {
            // Single-stack: the pod has IPv6 addresses only, and the kubelet's probes (which
            // passed: the pod is Ready) reached the admin server over IPv6.
            let ips: Vec<String> = status
                .pod_ips
                .iter()
                .flatten()
                .map(|i| i.ip.clone())
                .collect();
            ensure!(
                !ips.is_empty()
                    && ips
                        .iter()
                        .all(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok()),
                "{}: pod IPs {ips:?}",
                p.name_any()
            );
            eprintln!("    {}: Ready on {ips:?}", p.name_any());
        }
        let sc = container
            .security_context
            .as_ref()
            .context("securityContext")?;
        ensure!(
            sc.read_only_root_filesystem == Some(true)
                && sc.allow_privilege_escalation == Some(false),
            "{}: {sc:?}",
            p.name_any()
        );
        ensure!(
            spec.security_context.as_ref().and_then(|s| s.run_as_user) == Some(65532),
            "runs as 65532"
        );
        for probe in ["liveness", "readiness", "startup"] {
            let set = match probe {
                "liveness" => container.liveness_probe.is_some(),
                "readiness" => container.readiness_probe.is_some(),
                _ => container.startup_probe.is_some(),
            };
            ensure!(set, "{}: no {probe} probe", p.name_any());
        }
    }
    Ok(())
}

/// In-cluster configuration (ServiceAccount token and CA) under the chart's RBAC only: the
/// controller labels the real kind nodes from their kubelets' aws:/// providerIDs, and exactly
/// one replica leads.
async fn kind_nodes_are_labelled_from_inside_the_cluster(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let (cp, worker) = kind_nodes(&c).await?;
    let scenario = env.mock_admin.scenario().await?;
    for n in [&cp, &worker] {
        let pid = n
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default();
        let inst = scenario
            .instances
            .iter()
            .find(|i| pid.ends_with(&format!("/{}", i.instance_id)))
            .with_context(|| format!("mock-ec2 has no instance for {pid}"))?;
        let nodes: Vec<&str> = inst.network_nodes.iter().map(String::as_str).collect();
        wait_for_topology(&c, &n.name_any(), &e2e::env::expected(&nodes, &[]), WAIT).await?;
    }
    let holder = incluster::lease_holder(&c)
        .await?
        .context("nobody holds the Lease")?;
    let mut leaders = Vec::new();
    for p in incluster::pods(&c).await? {
        let m = incluster::pod_metrics(&c, &p.name_any()).await?;
        if e2e::labeler::metric_sum(&m, "ec2_topology_labeler_leader", &[]) == 1.0 {
            leaders.push(p.name_any());
        }
    }
    ensure!(
        leaders == vec![holder.clone()],
        "leaders by their own gauge: {leaders:?}; Lease holder: {holder}"
    );
    Ok(())
}

/// The real kube-scheduler bound the waiting pod to the worker once its labels existed, and
/// the kubelet runs it; a pod asking for a leaf no node has stays Pending.
async fn scheduler_places_pods_by_topology_labels(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let (_, worker) = kind_nodes(&c).await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    eventually(
        "the waiting pod bound to the worker and running",
        WAIT,
        || async {
            let p = pods.get(WAITER).await?;
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let phase = p.status.as_ref().and_then(|s| s.phase.clone());
            Ok((node.as_deref() == Some(worker.name_any().as_str())
                && phase.as_deref() == Some("Running"))
            .then_some(()))
        },
    )
    .await?;
    // The pod held back by the startup taint alone: bound once the controller released it,
    // which it does only after the worker's labels are written.
    eventually("the held pod bound to the worker", WAIT, || async {
        let p = pods.get(HELD).await?;
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        Ok((node.as_deref() == Some(worker.name_any().as_str())).then_some(()))
    })
    .await?;
    let now: Node = Api::all(c.clone()).get(&worker.name_any()).await?;
    ensure!(
        now.labels().contains_key(LAYER_3),
        "the worker lost its labels"
    );
    ensure!(
        !now.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == PENDING)),
        "the held pod was bound while the startup taint was still on"
    );
    pods.delete(HELD, &DeleteParams::default()).await?;
    let nowhere = "waits-for-a-leaf-nobody-has";
    let _ = pods.delete(nowhere, &DeleteParams::default()).await;
    eventually("the old pod gone", WAIT, || async {
        Ok(pods.get_opt(nowhere).await?.is_none().then_some(()))
    })
    .await?;
    let image = pause_image(&c).await?;
    pods.create(
        &PostParams::default(),
        &waiter_pod(nowhere, "nn-no-such-leaf", &image)?,
    )
    .await?;
    eventually(
        "the scheduler to refuse a pod for a leaf no node has",
        WAIT,
        || unschedulable(&pods, nowhere),
    )
    .await?;
    for name in [WAITER, nowhere] {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// `kubectl apply -f deploy/` (the README's plain-manifest install) is accepted by a real API
/// server with the kubectl the kind node ships (a server-side dry run: the chart is installed
/// next, by Helm).
async fn deploy_manifests_apply_with_kubectl(_env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let deploy = e2e::repo_root().join("deploy");
    let (ok, out) = kind.kubectl(&[
        "apply",
        "--dry-run=server",
        "-f",
        deploy.to_str().unwrap_or_default(),
    ])?;
    ensure!(ok, "kubectl apply -f deploy/ failed:\n{out}");
    for object in [
        "namespace/ec2-topology-labeler",
        "deployment.apps/ec2-topology-labeler",
        "validatingadmissionpolicy.admissionregistration.k8s.io/ec2-topology-labeler-nodes",
    ] {
        ensure!(out.contains(object), "{object} not applied:\n{out}");
    }
    eprintln!(
        "    kubectl apply --dry-run=server -f deploy/: {} objects",
        out.lines().count()
    );
    Ok(())
}

/// `helm test`: the chart's test pod runs `tree --min-labelled=1` in the cluster with the
/// controller's image under a ServiceAccount of its own (list on Nodes only), prints the
/// topology and passes (the kind nodes are labelled by now).
async fn helm_test_passes(env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let started = Instant::now();
    let out = kind.helm(&[
        "test",
        RELEASE,
        "--namespace",
        NAMESPACE,
        "--logs",
        "--timeout",
        "120s",
    ])?;
    ensure!(
        out.contains("Phase:          Succeeded") || out.contains("Phase: Succeeded"),
        "{out}"
    );
    ensure!(
        out.contains(WORKER_LEAF),
        "the test pod's log has no tree with {WORKER_LEAF}:\n{out}"
    );
    eprintln!(
        "    helm test passed in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    // The controller's replicas did not restart meanwhile.
    let c = env.admin().await?;
    for p in incluster::pods(&c).await? {
        ensure!(incluster::restarts(&p) == 0, "{} restarted", p.name_any());
    }
    Ok(())
}

/// The admission policy holds in a real cluster: the controller's ServiceAccount (impersonated
/// by kubectl) may not label a node with a key that is not its own, though RBAC lets it patch
/// nodes; its own key it may write.
async fn admission_policy_refuses_foreign_writes(env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let c = env.admin().await?;
    let (_, worker) = kind_nodes(&c).await?;
    let worker = worker.name_any();
    let sa = format!("--as=system:serviceaccount:{NAMESPACE}:ec2-topology-labeler");
    let (ok, out) = kind.kubectl(&["label", "node", &worker, "example.com/team=ml", &sa])?;
    ensure!(
        !ok && out.contains("ValidatingAdmissionPolicy")
            && out.contains("refused: example.com/team"),
        "a foreign label by the controller's identity was not refused by the policy:\n{out}"
    );
    let (ok, out) = kind.kubectl(&["taint", "node", &worker, "example.com/x=y:NoSchedule", &sa])?;
    ensure!(
        !ok && out.contains("may not add, change or remove other taints"),
        "a taint was not refused:\n{out}"
    );
    // What RBAC alone would refuse stays refused by RBAC (delete is not granted).
    let (ok, out) = kind.kubectl(&["delete", "node", &worker, "--dry-run=server", &sa])?;
    ensure!(!ok && out.contains("forbidden"), "{out}");
    // kube-controller-manager type-checks the policy's CEL against the Node schema: every
    // field it names exists.
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(c.clone());
    let status = eventually("the policy type-checked", WAIT, || async {
        let p = policies.get("ec2-topology-labeler-nodes").await?;
        let generation = p.metadata.generation;
        Ok(p.status
            .filter(|s| s.observed_generation.is_some() && s.observed_generation == generation))
    })
    .await?;
    let warnings = status
        .type_checking
        .and_then(|t| t.expression_warnings)
        .unwrap_or_default();
    // The type checker does not model a Node's `status.capacity` and `status.allocatable` (maps
    // of quantities) and reports them as undefined; the API server still evaluates them at
    // runtime (the e2e admission scenario sees a capacity change refused). Anything else fails.
    let unmodelled = ["capacity", "allocatable"];
    let unexpected: Vec<_> = warnings
        .iter()
        .filter(|w| {
            let undefined: Vec<&str> = w
                .warning
                .split("undefined field '")
                .skip(1)
                .filter_map(|rest| rest.split('\'').next())
                .collect();
            let other_errors = w.warning.matches("ERROR:").count() != undefined.len();
            other_errors || undefined.iter().any(|f| !unmodelled.contains(f))
        })
        .collect();
    ensure!(
        unexpected.is_empty(),
        "type-checking warnings: {unexpected:?}"
    );
    if !warnings.is_empty() {
        eprintln!(
            "    type checker: status.capacity/allocatable not modelled (enforced at runtime)"
        );
    }
    Ok(())
}

/// `kubectl logs` shows one JSON object per line, with a level, a message, and the node and
/// instance on label changes.
async fn logs_are_json_lines_an_operator_can_read(env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let c = env.admin().await?;
    let holder = incluster::lease_holder(&c).await?.context("nobody leads")?;
    let (ok, text) = kind.kubectl(&["logs", "-n", NAMESPACE, &holder])?;
    ensure!(ok, "kubectl logs failed: {text}");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("not JSON: {l}")))
        .collect::<anyhow::Result<_>>()?;
    ensure!(!lines.is_empty(), "no log lines");
    for l in &lines {
        ensure!(
            l["level"].is_string() && l["timestamp"].is_string() && l["message"].is_string(),
            "a line without level, timestamp or message: {l}"
        );
    }
    ensure!(
        lines.iter().any(|l| l["message"]
            .as_str()
            .is_some_and(|m| m.contains("became leader"))),
        "no 'became leader' line"
    );
    let change = lines.iter().find(|l| {
        l["level"] == "INFO"
            && l["message"] == "node labels updated"
            && l["span"]["node"].is_string()
            && l["span"]["instance"].is_string()
            && l["changes"].is_string()
    });
    ensure!(
        change.is_some(),
        "no INFO line of a label change naming its node, instance and changes"
    );
    ensure!(
        lines.iter().all(|l| l.get("spans").is_none()),
        "span lists repeat the span on every line"
    );
    Ok(())
}

/// `explain` as docs/operations.md says to run it: `kubectl exec` in the leader's Pod (the image
/// has no shell: the binary is the entrypoint). It reads the controller's own flags and its view
/// over loopback: a labelled kind node is "Labelled", seen by the leading replica.
async fn explain_in_the_leaders_pod(env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let c = env.admin().await?;
    let holder = incluster::lease_holder(&c).await?.context("nobody leads")?;
    let (_, worker) = kind_nodes(&c).await?;
    let worker = worker.metadata.name.clone().unwrap_or_default();
    // The leader writes the ledger's shards every 10 s while there is news: the worker's
    // record may take that long to be there after its labels.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let e = loop {
        let (ok, out) = kind.kubectl(&[
            "exec", "-n", NAMESPACE, &holder, "--", "/app", "explain", &worker, "-o", "json",
        ])?;
        ensure!(ok, "kubectl exec ... explain failed:\n{out}");
        let start = out.find('{').context("no JSON in explain's output")?;
        // stdout (the JSON), then stderr (the note that the controller's flags are used).
        let e: serde_json::Value = serde_json::Deserializer::from_str(&out[start..])
            .into_iter()
            .next()
            .context("no JSON value")?
            .with_context(|| format!("explain's JSON: {out}"))?;
        let trusted = e["record"]
            .as_str()
            .unwrap_or_default()
            .starts_with("trusted");
        if trusted || std::time::Instant::now() > deadline {
            break e;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let verdict = e["verdict"].as_str().unwrap_or_default();
    ensure!(verdict.starts_with("Labelled"), "verdict: {verdict}");
    ensure!(
        e["controller"]["Ok"]["leading"] == true && e["controller"]["Ok"]["identity"] == holder,
        "the controller's view comes from the leader {holder}: {}",
        e["controller"]
    );
    ensure!(
        e["controller"]["Ok"]["record"]["state"] == "labelled",
        "{}",
        e["controller"]
    );
    // The record key the chart mounts reaches `explain` too (LABELER_RECORD_KEY_FILE): the
    // record the leader sealed with it (its ledger shard, which the controller's ServiceAccount
    // may read) is one a new leader would trust.
    let record = e["record"].as_str().unwrap_or_default();
    ensure!(
        record.starts_with("trusted"),
        "the worker's verification record, judged with the mounted key: {record}"
    );
    eprintln!("    kubectl exec {holder} -- /app explain {worker}: {verdict}; record {record}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// ops::

/// A new EC2 node, labelled within `bound`.
async fn new_node_labelled(env: &Env, c: &Client, n: u32, bound: Duration) -> anyhow::Result<()> {
    let s = NodeSpec::ec2(0xd1, n, "p5.48xlarge");
    let leaf = format!("nn-ops-leaf-{n}");
    let nodes = ["nn-ops-spine", "nn-ops-agg", leaf.as_str()];
    env.mock_admin.upsert(&s.instance(&nodes)).await?;
    kube_util::create_nodes(c, vec![s.node()]).await?;
    wait_for_topology(c, &s.name, &e2e::env::expected(&nodes, &[]), bound).await
}

/// Deleting the leader's pod hands the Lease over: another replica labels a new node within the
/// lease duration + 5 s, and no label is lost meanwhile.
async fn deleting_the_leader_pod_hands_over(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let holder = incluster::lease_holder(&c).await?.context("nobody leads")?;
    let watch = LossWatch::start(&c).await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), NAMESPACE);
    let deleted = Instant::now();
    pods.delete(&holder, &DeleteParams::default()).await?;
    let bound = LEASE + Duration::from_secs(5);
    // The deleted leader releases the Lease as it stops (its holder is empty for a moment);
    // the other replica takes it at its next try.
    let new_holder = eventually("another replica holds the Lease", bound, || async {
        Ok(incluster::lease_holder(&c).await?.filter(|h| *h != holder))
    })
    .await?;
    let led_in = deleted.elapsed();
    new_node_labelled(env, &c, 1, bound)
        .await
        .context("no replica labelled a new node within the lease duration + 5 s")?;
    let took = deleted.elapsed();
    eprintln!(
        "    leader pod deleted: {new_holder} led {:.1}s later and labelled a new node {:.1}s after the deletion",
        led_in.as_secs_f64(),
        took.as_secs_f64()
    );
    incluster::wait_rolled_out(&c, 2, Duration::from_secs(90)).await?;
    watch.finish().await
}

/// `kubectl drain` of the node both replicas run on (the control plane is tainted) evicts one,
/// is refused the second by the PodDisruptionBudget, and the remaining replica keeps labelling.
async fn drain_respects_the_disruption_budget(env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let c = env.admin().await?;
    let (_, worker) = kind_nodes(&c).await?;
    let worker = worker.name_any();
    let pods = incluster::pods(&c).await?;
    ensure!(
        pods.iter()
            .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(worker.as_str())),
        "both replicas should run on {worker}"
    );
    let watch = LossWatch::start(&c).await?;
    // Watch readiness while the drain runs: never zero ready replicas.
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let watcher_client = c.clone();
    let min_ready = tokio::spawn(async move {
        let mut min = usize::MAX;
        loop {
            if let Ok(pods) = incluster::pods(&watcher_client).await {
                min = min.min(pods.iter().filter(|p| incluster::is_ready(p)).count());
            }
            tokio::select! {
                _ = &mut stopped => return min,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    });
    let (drained, out) = kind.kubectl(&[
        "drain",
        &worker,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--timeout=25s",
    ])?;
    let _ = stop.send(());
    let min = min_ready.await?;
    let (uncordoned, text) = kind.kubectl(&["uncordon", &worker])?;
    ensure!(uncordoned, "uncordon failed: {text}");
    ensure!(
        !drained,
        "the drain completed although the budget allows one replica down:\n{out}"
    );
    ensure!(
        out.contains("disruption budget"),
        "the drain was not held by the PodDisruptionBudget:\n{out}"
    );
    ensure!(min >= 1, "at some point no replica was ready ({min})");
    new_node_labelled(env, &c, 2, WAIT)
        .await
        .context("the remaining replica did not label")?;
    incluster::wait_rolled_out(&c, 2, Duration::from_secs(90)).await?;
    watch.finish().await
}

/// `helm upgrade` with a changed configuration rolls both replicas without losing a label, and
/// the new replicas run with the new setting; the retire hook runs and leaves no rights behind.
async fn helm_upgrade_rolls_without_label_loss(env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let c = env.admin().await?;
    let before: Vec<String> = incluster::pods(&c)
        .await?
        .iter()
        .map(|p| p.name_any())
        .collect();
    let watch = LossWatch::start(&c).await?;
    // An absurd value is refused before anything changes, with a message naming it.
    let refused = kind.helm_released(
        "upgrade",
        &[
            "--namespace",
            NAMESPACE,
            "--reset-then-reuse-values",
            "--set",
            "config.concurrency=100000",
        ],
    );
    ensure!(
        refused
            .as_ref()
            .is_err_and(|e| format!("{e:#}").contains("concurrency")),
        "config.concurrency=100000 was not refused by the chart: {refused:?}"
    );
    kind.helm_released(
        "upgrade",
        &[
            "--namespace",
            NAMESPACE,
            "--reset-then-reuse-values",
            "--set",
            "config.resyncPeriod=7s",
            "--wait",
            "--timeout",
            "180s",
        ],
    )?;
    incluster::wait_rolled_out(&c, 2, Duration::from_secs(90)).await?;
    let after = incluster::pods(&c).await?;
    ensure!(
        after.iter().all(|p| !before.contains(&p.name_any())),
        "the replicas were not replaced: {before:?}"
    );
    // Every scheduler feature is off here: the upgrade ran the retire hook, whose Job succeeded
    // (helm waited for it) and whose ServiceAccount went with its rights; the controller's own
    // identity holds no right on those kinds (the API server's RBAC answers).
    let hook = format!("{RELEASE}-retire");
    let job = Api::<k8s_openapi::api::batch::v1::Job>::namespaced(c.clone(), NAMESPACE)
        .get(&hook)
        .await
        .context("the retire hook's Job")?;
    ensure!(
        job.status.as_ref().and_then(|s| s.succeeded) == Some(1),
        "the retire hook's Job did not succeed: {:?}",
        job.status
    );
    ensure!(
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(c.clone(), NAMESPACE)
            .get_opt(&hook)
            .await?
            .is_none(),
        "the retire hook's ServiceAccount outlived it"
    );
    let sa = format!("--as=system:serviceaccount:{NAMESPACE}:{RELEASE}");
    for (verb, what) in [
        ("delete", "hypernodes.topology.volcano.sh"),
        ("list", "topologies.kueue.x-k8s.io"),
        ("list", "topologies.kai.scheduler"),
    ] {
        let (_, out) = kind.kubectl(&["auth", "can-i", verb, what, &sa])?;
        // (stdout says yes or no; stderr may warn of a kind the cluster does not serve.)
        ensure!(
            out.lines().any(|l| l.trim() == "no") && !out.lines().any(|l| l.trim() == "yes"),
            "the controller may {verb} {what} with the feature off: {out}"
        );
    }
    for p in &after {
        let args = p
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.args.clone())
            .unwrap_or_default();
        ensure!(
            args.iter().any(|a| a == "--resync-period=7s"),
            "{} runs with {args:?}",
            p.name_any()
        );
    }
    new_node_labelled(env, &c, 3, WAIT).await?;
    watch.finish().await
}

/// Every shell block the docs mark `<!-- doc-test: kind -->` (README's verify steps,
/// install-eks.md's, the runbooks of operations.md: see `e2e::doctest`) runs as written against
/// this cluster, after the install and an upgrade, in the order of the docs: `bash -e -o
/// pipefail`, with `kubectl`, `helm` and the released `ec2-topology-labeler` on the PATH, this cluster as the
/// current context, in an empty directory. Each exits 0 within two minutes, and its output
/// holds what its mark expects.
async fn doc_commands_run_as_written(env: &Env) -> anyhow::Result<()> {
    use e2e::doctest::{self, Mark};
    let kind = KindEnv::from_env()?;
    let c = env.admin().await?;
    // NODE: a worker the controller labelled (the blocks that ask about one node). Each worker
    // is given GPUs and EFA devices the way Kubernetes' docs advertise an extended resource (a
    // patch of the Node's status), so that `fit` has a gang to place; taken off after.
    let nodes: Api<Node> = Api::all(c.clone());
    let workers: Vec<String> = nodes
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|n| n.labels().contains_key(LAYER_3))
        .map(|n| n.name_any())
        .collect();
    let node = workers
        .first()
        .context("no node carries the third network layer")?
        .clone();
    let devices = |on: bool| {
        let r = if on {
            json!({ "nvidia.com/gpu": "128", "vpc.amazonaws.com/efa": "512" })
        } else {
            json!({ "nvidia.com/gpu": null, "vpc.amazonaws.com/efa": null })
        };
        Patch::Merge(json!({ "status": { "capacity": r.clone(), "allocatable": r } }))
    };
    let dir = std::env::temp_dir().join(format!("ec2tl-doc-commands-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let parent = |p: &std::path::Path| {
        p.parent()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_default()
    };
    // `ec2-topology-labeler` is the released workstation binary (what docs/operations.md's
    // "From a workstation" downloads), not the dev build.
    let released = dir.join("bin");
    std::fs::create_dir_all(&released)?;
    let link = released.join("ec2-topology-labeler");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(kind.workstation_binary()?, &link)?;
    let helm_bin = helm_as_the_docs_run_it(&kind, &dir)?;
    let registry = readme_registry(&kind)?;
    let path = std::env::join_paths(
        [
            released,
            helm_bin,
            parent(&kind.kubectl),
            parent(&helm::helm_bin()?),
            e2e::bin_dir(),
        ]
        .into_iter()
        .chain(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        )),
    )?;
    let mut ran = 0;
    let result = async {
        for w in &workers {
            nodes
                .patch_status(w, &PatchParams::default(), &devices(true))
                .await?;
        }
        for b in doctest::blocks(&e2e::repo_root())? {
            let Some(Mark::Kind { expect }) = &b.mark else {
                continue;
            };
            let text = run_block(
                &b,
                120,
                &dir,
                &[
                    ("KUBECONFIG", kind.kubeconfig.as_os_str()),
                    ("PATH", path.as_os_str()),
                    ("REGISTRY", registry.as_ref()),
                    ("NODE", node.as_ref()),
                ],
            )?;
            for e in expect {
                ensure!(
                    text.contains(e.as_str()),
                    "{}: the output lacks {e:?}:\n{}\n--- output:\n{text}",
                    b.at(),
                    b.code
                );
            }
            eprintln!(
                "    {}: ran as written ({} lines of output)",
                b.at(),
                text.lines().count()
            );
            ran += 1;
        }
        anyhow::Ok(())
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    // Every worker's devices taken off whatever happened (the later scenarios run on them); a
    // block's own failure is the one reported.
    let mut cleanup = Vec::new();
    for w in &workers {
        if let Err(e) = nodes
            .patch_status(w, &PatchParams::default(), &devices(false))
            .await
        {
            cleanup.push(format!("{w}: {e}"));
        }
    }
    result?;
    ensure!(
        cleanup.is_empty(),
        "the advertised devices stay on: {}",
        cleanup.join("; ")
    );
    ensure!(ran >= 12, "only {ran} doc blocks are marked to run");
    Ok(())
}

/// EC2 refusing the controller's credentials is loud, not silent: a Warning Event on the
/// leader's Pod (where an operator looking at the controller sees it), one on the node, the error
/// counter by category; the replicas stay Ready and do not restart (restarting does not fix
/// IAM); once EC2 accepts the credentials again the node is labelled without a restart.
async fn ec2_denied_is_loud_and_readiness_holds(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let leader = incluster::lease_holder(&c)
        .await?
        .context("nobody holds the Lease")?;
    env.mock_admin
        .set_faults(&mock_ec2::Faults {
            unauthorized: true,
            ..Default::default()
        })
        .await?;
    let result = async {
        let s = NodeSpec::ec2(0xd1, 9, "p5.48xlarge");
        let nodes = ["nn-ops-spine", "nn-ops-agg", "nn-ops-leaf-9"];
        env.mock_admin.upsert(&s.instance(&nodes)).await?;
        kube_util::create_nodes(&c, vec![s.node()]).await?;
        let events: Api<k8s_openapi::api::core::v1::Event> = Api::all(c.clone());
        let seen = |kind: &'static str, name: String| {
            let events = events.clone();
            async move {
                let list = events.list(&Default::default()).await?;
                Ok(list.items.into_iter().find(|e| {
                    e.reason.as_deref() == Some("Ec2AccessDenied")
                        && e.type_.as_deref() == Some("Warning")
                        && e.involved_object.kind.as_deref() == Some(kind)
                        && e.involved_object.name.as_deref() == Some(name.as_str())
                }))
            }
        };
        let on_pod = eventually(
            "an Ec2AccessDenied Warning on the leader's Pod",
            WAIT,
            || seen("Pod", leader.clone()),
        )
        .await?;
        eventually("an Ec2AccessDenied Warning on the node", WAIT, || {
            seen("Node", s.name.clone())
        })
        .await?;
        let m = incluster::pod_metrics(&c, &leader).await?;
        let denied = e2e::labeler::metric_sum(
            &m,
            "ec2_topology_labeler_reconcile_errors_total",
            &["category=\"ec2_unauthorized\""],
        );
        ensure!(
            denied >= 1.0,
            "reconcile_errors_total{{category=ec2_unauthorized}} = {denied}"
        );
        for p in incluster::pods(&c).await? {
            ensure!(
                incluster::is_ready(&p),
                "{} is not Ready while EC2 refuses",
                p.name_any()
            );
            ensure!(incluster::restarts(&p) == 0, "{} restarted", p.name_any());
        }
        eprintln!("    leader's Pod: {:?}", on_pod.message.unwrap_or_default());
        env.mock_admin
            .set_faults(&mock_ec2::Faults::default())
            .await?;
        wait_for_topology(&c, &s.name, &e2e::env::expected(&nodes, &[]), WAIT).await?;
        for p in incluster::pods(&c).await? {
            ensure!(incluster::restarts(&p) == 0, "{} restarted", p.name_any());
        }
        Ok(())
    }
    .await;
    env.mock_admin
        .set_faults(&mock_ec2::Faults::default())
        .await?;
    result
}

/// `helm uninstall` removes the controller and leaves every label where it was (documented in
/// the README: labels are data the schedulers read, not the controller's state). The uninstall
/// hook (turned on first with a `helm upgrade`, as docs/operations.md says) runs
/// `ec2-topology-labeler uninstall` as a post-delete Job once the controller is gone: the Lease
/// is removed and the Job succeeds (helm waits for it).
async fn helm_uninstall_leaves_the_labels(env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let c = env.admin().await?;
    let before = incluster::all_topology_labels(&c).await?;
    ensure!(
        before.values().filter(|l| !l.is_empty()).count() >= 2,
        "nothing labelled to keep"
    );
    kind.helm_released(
        "upgrade",
        &[
            "--namespace",
            NAMESPACE,
            "--reset-then-reuse-values",
            "--set",
            "uninstallHook.enabled=true",
            "--wait",
            "--timeout",
            "180s",
        ],
    )?;
    ensure!(
        incluster::lease_holder(&c).await?.is_some(),
        "no Lease before the uninstall"
    );
    let out = kind.helm(&["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait"])?;
    eventually(
        "the controller's pods gone",
        Duration::from_secs(60),
        || async { Ok(incluster::pods(&c).await?.is_empty().then_some(())) },
    )
    .await?;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(c.clone(), NAMESPACE);
    ensure!(
        leases.get_opt(RELEASE).await?.is_none(),
        "the uninstall hook left the Lease ({out})"
    );
    let after = incluster::all_topology_labels(&c).await?;
    incluster::nothing_lost(&before, &after)
}

// --- release:: what `make release` pushed to the suite's registry ------------------------------

/// GET from the suite's registry (the OCI distribution API, on this machine's loopback).
fn registry_get(release: &incluster::Release, path: &str, accept: &str) -> anyhow::Result<Vec<u8>> {
    let host = release.registry().replace("localhost", "127.0.0.1");
    let url = format!("http://{host}/v2/{path}");
    let out = std::process::Command::new("curl")
        .args(["-fsSL", "-H", &format!("Accept: {accept}"), &url])
        .output()
        .context("running curl")?;
    ensure!(
        out.status.success(),
        "GET {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// The ELF machine of a binary's header (`e_machine`, little-endian at offset 18).
fn elf_machine(head: &[u8]) -> anyhow::Result<u16> {
    ensure!(
        head.len() >= 20 && head[..4] == *b"\x7fELF",
        "not an ELF file"
    );
    ensure!(
        head[4] == 2 && head[5] == 1,
        "not a 64-bit little-endian ELF"
    );
    Ok(u16::from_le_bytes([head[18], head[19]]))
}

/// The tag points at an OCI index of linux/amd64 and linux/arm64 whose digest is the one the
/// chart pins; in each platform's image `/app` is a static ELF for that architecture (x86-64,
/// AArch64: cross-compiled, no emulation); the image runs as 65532 with `/app` as entrypoint.
async fn the_index_holds_both_platforms(_env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let r = &kind.release;
    let index_bytes = registry_get(
        r,
        &format!("ec2-topology-labeler/manifests/{}", r.version),
        OCI_INDEX,
    )?;
    let digest = format!("sha256:{}", e2e::sha256_hex(&index_bytes));
    ensure!(
        digest == r.image_digest(),
        "the tag {} is {digest}, the chart pins {}",
        r.version,
        r.image_digest()
    );
    let index: serde_json::Value = serde_json::from_slice(&index_bytes)?;
    let manifests = index["manifests"]
        .as_array()
        .context("an index with manifests")?;
    let mut seen = Vec::new();
    for m in manifests {
        let arch = m["platform"]["architecture"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let os = m["platform"]["os"].as_str().unwrap_or_default();
        ensure!(os == "linux", "platform os {os}");
        let want: u16 = match arch.as_str() {
            "amd64" => 62,
            "arm64" => 183,
            other => anyhow::bail!("unexpected architecture {other} in the index"),
        };
        let mdigest = m["digest"].as_str().context("manifest digest")?;
        let manifest: serde_json::Value = serde_json::from_slice(&registry_get(
            r,
            &format!("ec2-topology-labeler/manifests/{mdigest}"),
            OCI_MANIFEST,
        )?)?;
        let config_digest = manifest["config"]["digest"].as_str().context("config")?;
        let config: serde_json::Value = serde_json::from_slice(&registry_get(
            r,
            &format!("ec2-topology-labeler/blobs/{config_digest}"),
            "*/*",
        )?)?;
        ensure!(
            config["architecture"] == arch.as_str() && config["os"] == "linux",
            "{arch}: the config says {}/{}",
            config["os"],
            config["architecture"]
        );
        ensure!(
            config["config"]["User"] == "65532:65532",
            "{arch}: user {}",
            config["config"]["User"]
        );
        ensure!(
            config["config"]["Entrypoint"] == json!(["/app"]),
            "{arch}: entrypoint {}",
            config["config"]["Entrypoint"]
        );
        // The layers, compressed as pushed; /app is in one of them.
        let layers = manifest["layers"].as_array().context("layers")?;
        let compressed: u64 = layers.iter().filter_map(|l| l["size"].as_u64()).sum();
        let dir = tempdir(&format!("release-{arch}"))?;
        let mut machine = None;
        let mut binary_bytes = 0;
        for (n, l) in layers.iter().enumerate() {
            let ld = l["digest"].as_str().context("layer digest")?;
            let blob = dir.join(format!("layer-{n}.tar.gz"));
            std::fs::write(
                &blob,
                registry_get(r, &format!("ec2-topology-labeler/blobs/{ld}"), "*/*")?,
            )?;
            let listing = std::process::Command::new("tar")
                .arg("-tzf")
                .arg(&blob)
                .output()?;
            let names = String::from_utf8_lossy(&listing.stdout).to_string();
            if names.lines().any(|n| n.trim_start_matches("./") == "app") {
                let out = std::process::Command::new("tar")
                    .arg("-xzOf")
                    .arg(&blob)
                    .arg(if names.lines().any(|n| n == "./app") {
                        "./app"
                    } else {
                        "app"
                    })
                    .output()?;
                ensure!(
                    out.status.success(),
                    "extracting /app from the {arch} layer"
                );
                binary_bytes = out.stdout.len();
                machine = Some(elf_machine(&out.stdout)?);
                // Static: no PT_INTERP program header (type 3).
                ensure!(
                    !has_interpreter(&out.stdout),
                    "{arch}: /app names an interpreter"
                );
            }
        }
        let machine = machine.with_context(|| format!("{arch}: no /app in any layer"))?;
        ensure!(
            machine == want,
            "{arch}: /app is for ELF machine {machine}, not {want}"
        );
        eprintln!(
            "    {arch}: image {:.1} MB compressed ({} layers), /app {:.1} MB static ELF machine {machine}",
            compressed as f64 / 1e6,
            layers.len(),
            binary_bytes as f64 / 1e6
        );
        seen.push(arch);
    }
    seen.sort();
    ensure!(seen == ["amd64", "arm64"], "platforms {seen:?}");
    Ok(())
}

/// Whether a 64-bit little-endian ELF has a PT_INTERP program header (a dynamic executable).
fn has_interpreter(elf: &[u8]) -> bool {
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
    };
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        return true;
    };
    (0..phnum as usize).any(|i| {
        let at = phoff as usize + i * phentsize as usize;
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            == Some(3)
    })
}

fn tempdir(name: &str) -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("ec2tl-kind-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The chart in the registry is the chart of this tree with the pushed image pinned by digest:
/// `helm template oci://...` renders `repository@digest` for the controller and its test pod.
async fn the_chart_pins_the_image_by_digest(_env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let r = &kind.release;
    let chart = r.chart_args();
    let mut args: Vec<&str> = vec!["template", RELEASE];
    args.extend(chart.iter().map(String::as_str));
    let rendered = helm::helm(None, &args)?;
    let images: Vec<&str> = rendered
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .map(|i| i.trim_matches('"'))
        .collect();
    ensure!(images.len() >= 2, "images rendered: {images:?}");
    ensure!(
        images.iter().all(|i| *i == r.image),
        "every image is {}: {images:?}",
        r.image
    );
    let mut show: Vec<&str> = vec!["show", "chart"];
    show.extend(chart.iter().map(String::as_str));
    let meta = helm::helm(None, &show)?;
    ensure!(
        meta.contains(&format!("version: {}", r.version))
            && meta.contains(&format!("appVersion: {}", r.version)),
        "chart metadata:\n{meta}"
    );
    Ok(())
}

/// The image index, the chart and the SBOM attestation verify with the run's public key (and not
/// with another key); the attested SBOM is CycloneDX and names the controller's crates.
async fn signatures_and_sbom_verify(_env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let r = &kind.release;
    ensure!(r.signed, "the release was not signed");
    let cosign = std::env::var("E2E_KIND_COSIGN").context("E2E_KIND_COSIGN")?;
    let public = std::env::var("E2E_KIND_COSIGN_PUB").context("E2E_KIND_COSIGN_PUB")?;
    let chart_ref = format!(
        "{}@{}",
        r.chart.trim_start_matches("oci://"),
        r.chart_digest
    );
    let run = |args: &[&str]| -> anyhow::Result<(bool, String)> {
        let out = std::process::Command::new(&cosign)
            .args(args)
            .env("COSIGN_PASSWORD", "")
            .output()
            .context("running cosign")?;
        Ok((
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ))
    };
    let insecure = [
        "--insecure-ignore-tlog=true",
        "--allow-http-registry",
        "--allow-insecure-registry",
    ];
    for target in [r.image.as_str(), chart_ref.as_str()] {
        let mut args = vec!["verify", "--key", public.as_str()];
        args.extend(insecure);
        args.push(target);
        let (ok, out) = run(&args)?;
        ensure!(ok, "cosign verify {target}:\n{out}");
    }
    let mut args = vec![
        "verify-attestation",
        "--type",
        "cyclonedx",
        "--key",
        public.as_str(),
    ];
    args.extend(insecure);
    args.push(r.image.as_str());
    let (ok, out) = run(&args)?;
    ensure!(ok, "cosign verify-attestation:\n{out}");
    // The attestation's payload is an in-toto statement whose predicate is the SBOM.
    let statement = out
        .lines()
        .find_map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .filter(|v| v.get("payload").is_some())
        })
        .context("no attestation envelope printed")?;
    let payload = statement["payload"].as_str().context("payload")?;
    let envelope = tempdir("attestation")?.join("payload.b64");
    std::fs::write(&envelope, payload)?;
    let decoded = std::process::Command::new("base64")
        .arg("-d")
        .arg(&envelope)
        .output()?;
    ensure!(
        decoded.status.success(),
        "the attestation's payload is not base64"
    );
    let intoto: serde_json::Value = serde_json::from_slice(&decoded.stdout)?;
    ensure!(
        intoto["predicateType"] == "https://cyclonedx.org/bom",
        "predicate type {}",
        intoto["predicateType"]
    );
    let components = intoto["predicate"]["components"]
        .as_array()
        .context("SBOM components")?;
    for krate in ["kube-client", "aws-config", "aws-sigv4", "rustls"] {
        ensure!(
            components.iter().any(|c| c["name"] == krate),
            "the SBOM does not list {krate}"
        );
    }
    // Another key does not verify them: the check above means something.
    let other = tempdir("other-key")?;
    let made = std::process::Command::new(&cosign)
        .arg("generate-key-pair")
        .current_dir(&other)
        .env("COSIGN_PASSWORD", "")
        .output()?;
    ensure!(made.status.success(), "cosign generate-key-pair");
    let other_pub = other.join("cosign.pub");
    let other_pub = other_pub.to_string_lossy();
    let mut args = vec!["verify", "--key", other_pub.as_ref()];
    args.extend(insecure);
    args.push(r.image.as_str());
    let (ok, _) = run(&args)?;
    ensure!(!ok, "the image verified with a key that did not sign it");
    eprintln!(
        "    image {} and chart {} verified (cosign, the run's key); SBOM attested: {} components",
        r.image,
        chart_ref,
        components.len()
    );
    Ok(())
}

/// The workstation path (docs/operations.md "From a workstation"): the release carries a static
/// binary per platform with SHA256SUMS, signed (a cosign bundle); the checksums verify with the
/// run's public key and the files with `sha256sum -c`, and neither passes once a byte changes.
/// This machine's binary then runs from the host as an operator's laptop would, through a
/// kubeconfig whose user is an exec plugin (as `aws eks update-kubeconfig` writes: the case
/// the image, FROM scratch, cannot serve), and reads the cluster.
async fn workstation_binaries_verify_and_run(_env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let r = &kind.release;
    ensure!(r.signed, "the release was not signed");
    for (platform, machine) in [("linux/amd64", 62u16), ("linux/arm64", 183)] {
        let name = r
            .binaries
            .get(platform)
            .with_context(|| format!("release.json lists no binary for {platform}"))?;
        let bytes =
            std::fs::read(kind.dist.join(name)).with_context(|| format!("reading {name}"))?;
        ensure!(
            elf_machine(&bytes)? == machine,
            "{name} is not built for {platform}"
        );
        ensure!(!has_interpreter(&bytes), "{name} is not static");
    }
    let sums = kind.dist.join(&r.checksums);
    let bundle = kind.dist.join(format!("{}.sigstore.json", r.checksums));
    let run = |cmd: &str,
               args: &[&std::ffi::OsStr],
               dir: &std::path::Path|
     -> anyhow::Result<(bool, String)> {
        let out = std::process::Command::new(cmd)
            .args(args)
            .current_dir(dir)
            .output()
            .with_context(|| format!("running {cmd}"))?;
        Ok((
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ))
    };
    let cosign = std::env::var("E2E_KIND_COSIGN").context("E2E_KIND_COSIGN")?;
    let public = std::env::var("E2E_KIND_COSIGN_PUB").context("E2E_KIND_COSIGN_PUB")?;
    let verify_blob = |file: &std::path::Path| {
        run(
            &cosign,
            &[
                "verify-blob".as_ref(),
                "--key".as_ref(),
                public.as_ref(),
                "--insecure-ignore-tlog=true".as_ref(),
                "--bundle".as_ref(),
                bundle.as_os_str(),
                file.as_os_str(),
            ],
            &kind.dist,
        )
    };
    let (ok, out) = verify_blob(&sums)?;
    ensure!(ok, "cosign verify-blob {}:\n{out}", sums.display());
    let (ok, out) = run("sha256sum", &["-c".as_ref(), sums.as_os_str()], &kind.dist)?;
    ensure!(ok, "sha256sum -c:\n{out}");
    ensure!(
        out.lines().filter(|l| l.ends_with(": OK")).count() == r.binaries.len(),
        "sha256sum -c checked {out:?}, not the {} binaries",
        r.binaries.len()
    );
    // One changed byte: the binary fails its checksum, the checksums their signature.
    let tampered = tempdir("tampered")?;
    for name in r.binaries.values() {
        let mut bytes = std::fs::read(kind.dist.join(name))?;
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(tampered.join(name), bytes)?;
    }
    std::fs::copy(&sums, tampered.join(&r.checksums))?;
    let (ok, _) = run(
        "sha256sum",
        &["-c".as_ref(), r.checksums.as_ref()],
        &tampered,
    )?;
    ensure!(!ok, "sha256sum -c passed a changed binary");
    let mut text = std::fs::read_to_string(&sums)?;
    text = text.replacen(&text[..1], if text.starts_with('0') { "1" } else { "0" }, 1);
    std::fs::write(tampered.join(&r.checksums), text)?;
    let (ok, _) = verify_blob(&tampered.join(&r.checksums))?;
    ensure!(!ok, "cosign verified changed checksums");

    // The operator's laptop: a kubeconfig whose user is an exec plugin handing out the kind
    // user's client certificate (an ExecCredential, as `aws eks get-token` hands out a token).
    let home = tempdir("workstation")?;
    let view = |path: &str| {
        kind.kubectl(&[
            "config",
            "view",
            "--raw",
            "--minify",
            "-o",
            &format!("jsonpath={path}"),
        ])
    };
    let (ok1, server) = view("{.clusters[0].cluster.server}")?;
    let (ok2, ca) = view("{.clusters[0].cluster.certificate-authority-data}")?;
    let (ok3, cert) = view("{.users[0].user.client-certificate-data}")?;
    let (ok4, key) = view("{.users[0].user.client-key-data}")?;
    ensure!(ok1 && ok2 && ok3 && ok4, "reading the kind kubeconfig");
    let decode = |b64: &str| -> anyhow::Result<String> {
        let f = home.join("b64");
        std::fs::write(&f, b64.trim())?;
        let out = std::process::Command::new("base64")
            .arg("-d")
            .arg(&f)
            .output()?;
        ensure!(out.status.success(), "base64 -d");
        Ok(String::from_utf8(out.stdout)?)
    };
    let credential = json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"clientCertificateData": decode(&cert)?, "clientKeyData": decode(&key)?},
    });
    std::fs::write(home.join("credential.json"), credential.to_string())?;
    let plugin = home.join("get-credential");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\ncat '{}'\n",
            home.join("credential.json").display()
        ),
    )?;
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&plugin)
        .status()?;
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kind", "cluster": {"server": server.trim(), "certificate-authority-data": ca.trim()}}],
        "users": [{"name": "exec", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": plugin.display().to_string(),
            "interactiveMode": "Never",
        }}}],
        "contexts": [{"name": "kind", "context": {"cluster": "kind", "user": "exec"}}],
        "current-context": "kind",
    });
    let config = home.join("kubeconfig");
    std::fs::write(&config, kubeconfig.to_string())?;
    let binary = kind.workstation_binary()?;
    let (ok, names) = kind.kubectl(&["get", "nodes", "-o", "name"])?;
    ensure!(ok, "kubectl get nodes: {names}");
    let nodes = names.lines().filter(|l| l.starts_with("node/")).count();
    let out = std::process::Command::new(&binary)
        .args(["tree", "-o", "dot"])
        .env("KUBECONFIG", &config)
        .env("HOME", &home)
        .output()
        .with_context(|| format!("running {}", binary.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "{} tree with an exec-plugin kubeconfig: {}{}",
        binary.display(),
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        text.contains(&format!("{nodes} without topology labels")),
        "tree from the workstation does not see the {nodes} unlabelled nodes:\n{text}"
    );
    let version = std::process::Command::new(&binary)
        .arg("--version")
        .output()?;
    ensure!(
        String::from_utf8_lossy(&version.stdout).contains(&r.version),
        "{} --version: {}",
        binary.display(),
        String::from_utf8_lossy(&version.stdout)
    );
    let _ = std::fs::remove_dir_all(&home);
    let _ = std::fs::remove_dir_all(&tampered);
    eprintln!(
        "    {} binaries, checksums signed and verified; {} ran tree through an exec-plugin kubeconfig ({nodes} nodes)",
        r.binaries.len(),
        binary.display()
    );
    Ok(())
}

fn scenarios() -> Vec<(&'static str, ScenarioFn, bool)> {
    macro_rules! s {
        ($name:literal, $f:ident) => {
            ($name, (|env| Box::pin($f(env))) as ScenarioFn, false)
        };
    }
    let mut all = vec![
        s!(
            "release::the_index_holds_both_platforms",
            the_index_holds_both_platforms
        ),
        s!(
            "release::the_chart_pins_the_image_by_digest",
            the_chart_pins_the_image_by_digest
        ),
        s!(
            "release::signatures_and_sbom_verify",
            signatures_and_sbom_verify
        ),
        s!(
            "release::workstation_binaries_verify_and_run",
            workstation_binaries_verify_and_run
        ),
        s!(
            "install::pod_waits_for_topology_before_install",
            pod_waits_for_topology_before_install
        ),
        s!(
            "install::deploy_manifests_apply_with_kubectl",
            deploy_manifests_apply_with_kubectl
        ),
        s!(
            "install::chart_installs_and_both_replicas_become_ready",
            chart_installs_and_both_replicas_become_ready
        ),
        s!(
            "install::kind_nodes_are_labelled_from_inside_the_cluster",
            kind_nodes_are_labelled_from_inside_the_cluster
        ),
        s!(
            "install::scheduler_places_pods_by_topology_labels",
            scheduler_places_pods_by_topology_labels
        ),
        s!("install::helm_test_passes", helm_test_passes),
        s!(
            "install::admission_policy_refuses_foreign_writes",
            admission_policy_refuses_foreign_writes
        ),
        s!(
            "install::logs_are_json_lines_an_operator_can_read",
            logs_are_json_lines_an_operator_can_read
        ),
        s!(
            "install::explain_in_the_leaders_pod",
            explain_in_the_leaders_pod
        ),
        s!(
            "ops::deleting_the_leader_pod_hands_over",
            deleting_the_leader_pod_hands_over
        ),
        s!(
            "ops::drain_respects_the_disruption_budget",
            drain_respects_the_disruption_budget
        ),
        s!(
            "ops::helm_upgrade_rolls_without_label_loss",
            helm_upgrade_rolls_without_label_loss
        ),
        s!(
            "ops::doc_commands_run_as_written",
            doc_commands_run_as_written
        ),
        s!(
            "ops::ec2_denied_is_loud_and_readiness_holds",
            ec2_denied_is_loud_and_readiness_holds
        ),
        s!(
            "ops::helm_uninstall_leaves_the_labels",
            helm_uninstall_leaves_the_labels
        ),
    ];
    all.extend(creds::scenarios());
    // The IPv6 single-stack cluster (run.sh's last phase): the same release from the registry.
    all.extend([
        s!(
            "ipv6::chart_installs_and_both_replicas_become_ready",
            chart_installs_and_both_replicas_become_ready
        ),
        s!(
            "ipv6::kind_nodes_are_labelled_from_inside_the_cluster",
            kind_nodes_are_labelled_from_inside_the_cluster
        ),
        s!("ipv6::helm_test_passes", helm_test_passes),
    ]);
    all
}

fn main() {
    if std::env::var_os("E2E_KUBECONFIG").is_none() {
        // `cargo test` on a machine without the kind cluster: nothing to run here (make kind).
        eprintln!("kind suite: E2E_KUBECONFIG is not set; run `make kind`");
        return;
    }
    e2e::env::run("kind", scenarios)
}

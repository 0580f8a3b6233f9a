//! `creds::` — the chart installed with credentials as EKS gives them, on kind: IRSA (a projected
//! token with audience `sts.amazonaws.com` exchanged at the stand-in STS) and EKS Pod Identity
//! (the stand-in agent as a hostNetwork DaemonSet on 169.254.170.23, exchanging the pod's token at
//! the stand-in EKS Auth). In each phase: the kind nodes' labels are taken off, the chart is
//! installed with `e2e/kind/values-<phase>.yaml` (what EKS's webhook would inject), both nodes
//! and nodes joining meanwhile are labelled, every EC2 call was signed with a credential the
//! stand-in handed to the controller's ServiceAccount (the mock verifies SigV4) while those
//! credentials expired and were replaced, and no container restarted. The chart is removed at
//! the end of each phase. Runs after `ops::` (which removes the chart the shared suite used).

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use e2e::{
    cluster::NAMESPACE,
    credentials::{self, BY_POD_IDENTITY, BY_WEB_IDENTITY},
    env::{Env, WAIT, expected_of},
    fixtures::NodeSpec,
    incluster::{self, KindEnv, RELEASE},
    kube_util::{self, eventually, topology_labels, wait_for_topology},
};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use mock_ec2::AuthConfig;
use serde_json::json;

use super::kind_nodes;

/// Handed-out credentials live this long: a phase sees them replaced at least once.
const SESSION: u64 = 20;
/// Nodes keep joining this long after the install.
const JOINING: Duration = Duration::from_secs(30);
const AGENT: &str = "eks-pod-identity-agent";

/// Take the topology labels off the kind nodes, so the phase shows them written again.
async fn unlabel_kind_nodes(c: &Client) -> anyhow::Result<()> {
    let (cp, worker) = kind_nodes(c).await?;
    let api: Api<Node> = Api::all(c.clone());
    for n in [&cp, &worker] {
        let gone: serde_json::Map<String, serde_json::Value> = topology_labels(n.labels())
            .into_keys()
            .map(|k| (k, serde_json::Value::Null))
            .collect();
        if !gone.is_empty() {
            api.patch(
                &n.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": gone } })),
            )
            .await?;
        }
    }
    Ok(())
}

/// Install the chart with the kind values and `phase_values` on top.
fn install(kind: &KindEnv, phase_values: &str) -> anyhow::Result<()> {
    let base = kind.values.to_string_lossy().to_string();
    let phase = kind
        .values
        .with_file_name(phase_values)
        .to_string_lossy()
        .to_string();
    kind.helm_released(
        "install",
        &[
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "-f",
            &base,
            "-f",
            &phase,
            "--wait",
            "--timeout",
            "180s",
        ],
    )?;
    Ok(())
}

/// Restarts of every container of the pods selected by `selector` in `namespace`.
async fn restarts(
    c: &Client,
    namespace: &str,
    selector: &str,
) -> anyhow::Result<Vec<(String, i32)>> {
    let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.clone(), namespace);
    Ok(api
        .list(&ListParams::default().labels(selector))
        .await?
        .items
        .iter()
        .map(|p| (p.name_any(), incluster::restarts(p)))
        .collect())
}

/// One phase: install with `values`, label, check the signatures, uninstall.
async fn phase(env: &Env, name: &str, values: &str, issued_by: &str) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let c = env.admin().await?;
    let started = Instant::now();
    env.mock_admin
        .set_auth(&credentials::auth_config(SESSION))
        .await?;
    unlabel_kind_nodes(&c).await?;
    env.mock_admin.reset_stats().await?;
    let result = async {
        install(&kind, values)?;
        incluster::wait_rolled_out(&c, 2, Duration::from_secs(60)).await?;
        let installed = started.elapsed();
        // The kind nodes, labelled from inside the cluster with the exchanged credentials.
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
            wait_for_topology(&c, &n.name_any(), &expected_of(inst), WAIT).await?;
        }
        // Nodes joining while the credentials expire and are replaced.
        let prefix = if issued_by == BY_WEB_IDENTITY { 0xc1 } else { 0xc2 };
        let mut n = 0;
        let joining = Instant::now();
        while joining.elapsed() < JOINING {
            n += 1;
            let s = NodeSpec::ec2(prefix, n, "p5.48xlarge");
            let leaf = format!("nn-kind-creds-leaf-{n}");
            let i = s.instance(&["nn-kind-creds-spine", "nn-kind-creds-agg", leaf.as_str()]);
            env.mock_admin.upsert(&i).await?;
            kube_util::create_nodes(&c, vec![s.node()]).await?;
            wait_for_topology(&c, &s.name, &expected_of(&i), WAIT).await?;
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let signed = credentials::check_signed_by(&env.mock_admin, issued_by, 2).await?;
        let creds = env.mock_admin.credentials().await?;
        let outcomes = if issued_by == BY_WEB_IDENTITY {
            &creds.web_identity
        } else {
            &creds.pod_identity
        };
        ensure!(
            outcomes.keys().all(|k| k == "ok"),
            "{issued_by} refused a token: {outcomes:?}"
        );
        let mut all = restarts(&c, NAMESPACE, incluster::SELECTOR).await?;
        if issued_by == BY_POD_IDENTITY {
            all.extend(restarts(&c, "kube-system", &format!("app.kubernetes.io/name={AGENT}")).await?);
        }
        ensure!(all.len() >= 2, "pods: {all:?}");
        ensure!(all.iter().all(|(_, r)| *r == 0), "restarts: {all:?}");
        eprintln!(
            "    creds::{name}: installed and 2/2 ready in {:.1}s; kind nodes and {n} joining nodes labelled; {} EC2 calls signed with {} keys ({} handed out by {issued_by}), 0 refused; restarts {all:?}; phase {:.1}s",
            installed.as_secs_f64(),
            signed.calls,
            signed.keys,
            signed.issued,
            started.elapsed().as_secs_f64()
        );
        anyhow::Ok(())
    }
    .await;
    let removed = kind.helm(&["uninstall", RELEASE, "--namespace", NAMESPACE, "--wait"]);
    env.mock_admin.set_auth(&AuthConfig::default()).await?;
    result?;
    removed.map(drop)
}

/// IRSA: the projected token (audience `sts.amazonaws.com`) exchanged at the stand-in STS.
async fn irsa(env: &Env) -> anyhow::Result<()> {
    phase(env, "irsa", "values-irsa.yaml", BY_WEB_IDENTITY).await
}

/// EKS Pod Identity: the agent DaemonSet on 169.254.170.23, the token (audience
/// `pods.eks.amazonaws.com`) exchanged through it at the stand-in EKS Auth.
async fn pod_identity(env: &Env) -> anyhow::Result<()> {
    let kind = KindEnv::from_env()?;
    let c = env.admin().await?;
    let manifest = kind.values.with_file_name("pod-identity-agent.yaml");
    let (ok, out) = kind.kubectl(&["apply", "-f", &manifest.to_string_lossy()])?;
    ensure!(ok, "kubectl apply {}: {out}", manifest.display());
    // Ready on both kind nodes. The DaemonSet also places pods on the Node objects the tests
    // create without a kubelet (they stay Pending there, as on a node that never came up).
    let (cp, worker) = kind_nodes(&c).await?;
    let kubelets = [cp.name_any(), worker.name_any()];
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(c.clone(), "kube-system");
    eventually(
        "the agent ready on both kind nodes",
        Duration::from_secs(90),
        || async {
            let list = pods
                .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={AGENT}")))
                .await?;
            let ready = |p: &k8s_openapi::api::core::v1::Pod| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            };
            let on_kubelets = kubelets.iter().all(|node| {
                list.items.iter().any(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
                        && ready(p)
                })
            });
            Ok(on_kubelets.then_some(()))
        },
    )
    .await?;
    let result = phase(
        env,
        "pod_identity",
        "values-pod-identity.yaml",
        BY_POD_IDENTITY,
    )
    .await;
    let (ok, out) = kind.kubectl(&["delete", "-f", &manifest.to_string_lossy(), "--wait"])?;
    result?;
    ensure!(ok, "kubectl delete {}: {out}", manifest.display());
    Ok(())
}

pub fn scenarios() -> Vec<(&'static str, e2e::env::ScenarioFn, bool)> {
    macro_rules! s {
        ($name:literal, $f:ident) => {
            (
                $name,
                (|env| Box::pin($f(env))) as e2e::env::ScenarioFn,
                false,
            )
        };
    }
    vec![
        s!("creds::irsa", irsa),
        s!("creds::pod_identity", pod_identity),
    ]
}

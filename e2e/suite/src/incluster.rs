//! The controller as the chart runs it in a real cluster (kind): its pods, their metrics and
//! logs through the API server, the Lease, and the command-line tools an operator would use.

use std::{path::PathBuf, process::Command, time::Duration};

use anyhow::{Context, bail};
use k8s_openapi::api::{apps::v1::Deployment, coordination::v1::Lease, core::v1::Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, LogParams},
};

use crate::{
    cluster::NAMESPACE,
    kube_util::{eventually, topology_labels},
};

/// The chart's release and Deployment name, and the Lease it elects on.
pub const RELEASE: &str = "ec2-topology-labeler";
pub const SELECTOR: &str = "app.kubernetes.io/name=ec2-topology-labeler";

/// What the kind run gives the tests (`e2e/kind/run.sh` sets these).
pub struct KindEnv {
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
    /// Values the chart is installed with (EC2 pointed at mock-ec2, short periods).
    pub values: PathBuf,
    /// What `make release` pushed to the suite's registry (`dist/release.json`).
    pub release: Release,
    /// `ipv4` or `ipv6`: the address family of the cluster.
    pub family: String,
    /// The release's directory (`dist/`): the workstation binaries, SHA256SUMS, its bundle.
    pub dist: PathBuf,
}

/// `dist/release.json`, as `hack/release.sh` writes it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Release {
    pub version: String,
    /// `REGISTRY/ec2-topology-labeler@sha256:...`: the OCI index of both platforms.
    pub image: String,
    /// `oci://REGISTRY/charts/ec2-topology-labeler`.
    pub chart: String,
    pub chart_digest: String,
    pub plain_http: bool,
    pub signed: bool,
    /// The workstation binaries by platform (`linux/amd64` -> a file name in `dist/`).
    #[serde(default)]
    pub binaries: std::collections::BTreeMap<String, String>,
    /// The checksums file of the binaries, in `dist/` (`SHA256SUMS`).
    #[serde(default)]
    pub checksums: String,
}

impl Release {
    /// The registry's host:port (`localhost:5001`).
    pub fn registry(&self) -> &str {
        self.image.split('/').next().unwrap_or_default()
    }

    /// The image index digest (`sha256:...`).
    pub fn image_digest(&self) -> &str {
        self.image.rsplit('@').next().unwrap_or_default()
    }

    /// The chart as `helm install`/`upgrade` take it: the OCI reference, its version, and
    /// `--plain-http` for a registry without TLS.
    pub fn chart_args(&self) -> Vec<String> {
        let mut args = vec![
            self.chart.clone(),
            "--version".to_string(),
            self.version.clone(),
        ];
        if self.plain_http {
            args.push("--plain-http".to_string());
        }
        args
    }
}

impl KindEnv {
    pub fn from_env() -> anyhow::Result<Self> {
        let var = |k: &str| {
            std::env::var(k)
                .map(PathBuf::from)
                .with_context(|| format!("{k} is not set (run e2e/kind/run.sh)"))
        };
        let release = var("E2E_KIND_RELEASE")?;
        let text = std::fs::read_to_string(&release)
            .with_context(|| format!("reading {}", release.display()))?;
        Ok(Self {
            kubeconfig: var("E2E_KUBECONFIG")?,
            kubectl: var("E2E_KUBECTL")?,
            values: var("E2E_KIND_VALUES")?,
            release: serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", release.display()))?,
            family: std::env::var("E2E_KIND_FAMILY").unwrap_or_else(|_| "ipv4".to_string()),
            dist: release
                .parent()
                .map(PathBuf::from)
                .context("the release file has no directory")?,
        })
    }

    /// The released workstation binary for this machine's architecture (what an operator
    /// downloads: `dist/ec2-topology-labeler-linux-amd64` on x86-64).
    pub fn workstation_binary(&self) -> anyhow::Result<PathBuf> {
        let platform = match std::env::consts::ARCH {
            "x86_64" => "linux/amd64",
            "aarch64" => "linux/arm64",
            other => anyhow::bail!("no released binary for {other}"),
        };
        let name = self
            .release
            .binaries
            .get(platform)
            .with_context(|| format!("the release lists no binary for {platform}"))?;
        Ok(self.dist.join(name))
    }

    /// Run kubectl; returns (success, stdout + stderr).
    pub fn kubectl(&self, args: &[&str]) -> anyhow::Result<(bool, String)> {
        let out = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .context("running kubectl")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((out.status.success(), text))
    }

    /// Run helm against the cluster; fails with its stderr.
    pub fn helm(&self, args: &[&str]) -> anyhow::Result<String> {
        crate::helm::helm(Some(&self.kubeconfig), args)
    }

    /// `helm install|upgrade RELEASE <the released chart> ARGS...`: the chart from the registry,
    /// as a platform team installs it.
    pub fn helm_released(&self, verb: &str, args: &[&str]) -> anyhow::Result<String> {
        let chart = self.release.chart_args();
        let mut all: Vec<&str> = vec![verb, RELEASE];
        all.extend(chart.iter().map(String::as_str));
        all.extend_from_slice(args);
        self.helm(&all)
    }
}

/// The controller's pods, oldest first, without those being deleted.
pub async fn pods(c: &Client) -> anyhow::Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(c.clone(), NAMESPACE);
    let mut pods: Vec<Pod> = api
        .list(&ListParams::default().labels(SELECTOR))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0));
    Ok(pods)
}

pub fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum())
        .unwrap_or(0)
}

/// Wait until the Deployment has `n` updated, ready replicas and no others.
pub async fn wait_rolled_out(c: &Client, n: i32, timeout: Duration) -> anyhow::Result<()> {
    let api: Api<Deployment> = Api::namespaced(c.clone(), NAMESPACE);
    eventually(&format!("{n} ready, updated replicas"), timeout, || async {
        let d = api.get(RELEASE).await?;
        let generation = d.metadata.generation.unwrap_or(0);
        let s = d.status.unwrap_or_default();
        let done = s.observed_generation.unwrap_or(0) >= generation
            && s.updated_replicas.unwrap_or(0) == n
            && s.ready_replicas.unwrap_or(0) == n
            && s.replicas.unwrap_or(0) == n;
        Ok(done.then_some(()))
    })
    .await
}

/// Who holds the Lease, as the API server says.
pub async fn lease_holder(c: &Client) -> anyhow::Result<Option<String>> {
    let api: Api<Lease> = Api::namespaced(c.clone(), NAMESPACE);
    Ok(api
        .get_opt(RELEASE)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// A pod's `/metrics`, through the API server's pod proxy.
pub async fn pod_metrics(c: &Client, pod: &str) -> anyhow::Result<String> {
    let req = http::Request::get(format!(
        "/api/v1/namespaces/{NAMESPACE}/pods/{pod}:8080/proxy/metrics"
    ))
    .body(Vec::new())?;
    Ok(c.request_text(req).await?)
}

pub async fn pod_logs(c: &Client, pod: &str) -> anyhow::Result<String> {
    let api: Api<Pod> = Api::namespaced(c.clone(), NAMESPACE);
    Ok(api.logs(pod, &LogParams::default()).await?)
}

/// The topology labels of every node, by node name.
pub async fn all_topology_labels(
    c: &Client,
) -> anyhow::Result<std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>>
{
    let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|n| (n.name_any(), topology_labels(n.labels())))
        .collect())
}

/// Nothing in `before` was removed or changed in `after` (nodes deleted meanwhile excepted).
pub fn nothing_lost(
    before: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
    after: &std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>>,
) -> anyhow::Result<()> {
    for (node, labels) in before {
        let Some(now) = after.get(node) else { continue };
        for (k, v) in labels {
            if now.get(k) != Some(v) {
                bail!("{node}: {k}={v} became {:?}", now.get(k));
            }
        }
    }
    Ok(())
}

/// Watches every Node while an operation runs and records each moment a topology label seen at
/// the start was missing or different: a snapshot before and after would miss a label removed
/// and written back.
pub struct LossWatch {
    task: tokio::task::JoinHandle<Vec<String>>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl LossWatch {
    pub async fn start(c: &Client) -> anyhow::Result<Self> {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let baseline = all_topology_labels(c).await?;
        let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut lost = Vec::new();
            let mut events = std::pin::pin!(
                watcher(api, watcher::Config::default())
                    .default_backoff()
                    .applied_objects()
            );
            loop {
                tokio::select! {
                    _ = &mut stopped => return lost,
                    event = events.next() => match event {
                        Some(Ok(node)) => {
                            let name = node.name_any();
                            let Some(want) = baseline.get(&name) else { continue };
                            let have = topology_labels(node.labels());
                            for (k, v) in want {
                                if have.get(k) != Some(v) {
                                    lost.push(format!("{name}: {k}={v} became {:?}", have.get(k)));
                                }
                            }
                        }
                        Some(Err(_)) => {}
                        None => return lost,
                    }
                }
            }
        });
        Ok(Self { task, stop })
    }

    /// Stop watching; fails naming every loss seen.
    pub async fn finish(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        let lost = self.task.await?;
        if !lost.is_empty() {
            bail!("topology labels lost: {}", lost.join("; "));
        }
        Ok(())
    }
}

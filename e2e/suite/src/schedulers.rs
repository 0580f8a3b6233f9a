//! The schedulers' side: their CRDs (from the pinned Kueue and Volcano modules, and KAI's
//! snapshot) and the real Kueue manager and Volcano scheduler and controllers, run out of cluster
//! against the e2e API server.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context, bail};
use kube::Client;

use crate::{
    kube_util,
    process::{Proc, free_port},
};

/// Build (or reuse) the Kueue manager and its CRDs; returns their directory.
pub fn artifacts() -> anyhow::Result<PathBuf> {
    crate::built_by("e2e/schedulers/build.sh", "E2E_SCHEDULERS")
}

/// Build (or reuse) Volcano's scheduler, controller-manager and CRDs; returns their directory.
pub fn volcano_artifacts() -> anyhow::Result<PathBuf> {
    crate::built_by("e2e/schedulers/volcano/build.sh", "E2E_VOLCANO")
}

/// Build (or reuse) KAI's scheduler, binder, pod grouper and CRDs from its source at the pinned
/// commit (`e2e/schedulers/kai/source.sh`: the Go module proxy, or a snapshot for offline
/// machines); returns their directory.
pub fn kai_artifacts() -> anyhow::Result<PathBuf> {
    crate::built_by("e2e/schedulers/kai/build.sh", "E2E_KAI")
}

/// Karpenter's NodePool CRD (from its module; nothing built), for the docs' NodePool recipes.
pub fn karpenter_crds() -> anyhow::Result<PathBuf> {
    crate::built_by("e2e/schedulers/karpenter/crds.sh", "E2E_KARPENTER_CRDS")
}

/// KAI's own Topology CRD, from KAI's source at the pinned commit (with its build).
pub fn kai_topology_crd() -> anyhow::Result<PathBuf> {
    Ok(kai_artifacts()?.join("topology/kai.scheduler_topologies.yaml"))
}

/// Apply every CRD YAML in `dir` (or the file `dir` names) and wait until the API server serves
/// them.
pub async fn install_crds(client: &Client, dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut applied = Vec::new();
    let mut entries: Vec<PathBuf> = if dir.is_file() {
        vec![dir.to_path_buf()]
    } else {
        std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect()
    };
    entries.sort();
    for path in entries {
        let text = std::fs::read_to_string(&path)?;
        applied.extend(kube_util::apply_yaml(client, &text, "e2e").await?);
    }
    kube_util::eventually("CRDs established", Duration::from_secs(30), || async {
        let crds: kube::Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            kube::Api::all(client.clone());
        let list = crds.list(&Default::default()).await?;
        let all = list.items.iter().all(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
        });
        Ok(all.then_some(()))
    })
    .await?;
    Ok(applied)
}

/// The Kueue manager as a process.
pub struct Kueue {
    proc: Proc,
    pub log: PathBuf,
}

fn openssl(args: &[&str]) -> anyhow::Result<()> {
    let ok = Command::new("openssl")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .context("running openssl")?
        .success();
    if !ok {
        bail!("openssl {args:?} failed");
    }
    Ok(())
}

/// A self-signed serving pair (Kueue's webhook server and metrics server need one even though
/// no webhook configuration points at them here).
fn self_signed(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let (crt, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=kueue-webhook-service.kueue-system.svc",
        "-keyout",
        key.to_str().unwrap_or_default(),
        "-out",
        crt.to_str().unwrap_or_default(),
    ])
}

/// Where Kueue v0.17 reads its metrics certificate when internal certificate management is off
/// (a fixed path in its main).
pub const KUEUE_METRICS_CERTS: &str = "/etc/kueue/metrics/certs";

impl Kueue {
    /// The last `n` lines of its log, for a failure's message.
    pub fn log_tail(&self, n: usize) -> String {
        format!("kueue log tail:\n{}", tail(&self.log, n))
    }

    pub async fn start(
        bin: &Path,
        kubeconfig: &Path,
        dir: &Path,
        client: &Client,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        kube_util::ensure_namespace(client, "kueue-system").await?;
        self_signed(&dir.join("webhook-certs"))?;
        self_signed(Path::new(KUEUE_METRICS_CERTS)).with_context(|| {
            format!("Kueue needs a certificate in {KUEUE_METRICS_CERTS} (fixed in its main): run the e2e as root or create it")
        })?;
        let (health, metrics, webhook) = (free_port()?, free_port()?, free_port()?);
        let config = dir.join("kueue-config.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\nnamespace: kueue-system\nhealth:\n  healthProbeBindAddress: 127.0.0.1:{health}\nmetrics:\n  bindAddress: 127.0.0.1:{metrics}\nwebhook:\n  port: {webhook}\n  host: 127.0.0.1\n  certDir: {certs}\nleaderElection:\n  leaderElect: false\ninternalCertManagement:\n  enable: false\nintegrations:\n  frameworks: [\"batch/job\"]\n",
                certs = dir.join("webhook-certs").display()
            ),
        )?;
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--config={}", config.display()))
            .arg("--feature-gates=VisibilityOnDemand=false")
            .arg("--zap-log-level=info")
            .env("KUBECONFIG", kubeconfig);
        let log = dir.join("kueue.log");
        let mut proc = Proc::spawn("kueue", cmd, &log)?;
        let admin = crate::mock::MockAdmin::new(&format!("http://127.0.0.1:{health}"));
        let started = std::time::Instant::now();
        loop {
            if !proc.alive() {
                bail!("kueue exited; see {}", log.display());
            }
            if admin.get_text("/readyz").await.is_ok() {
                break;
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("kueue not ready after 60s; see {}", log.display());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(Self { proc, log })
    }

    pub fn stop(&mut self) {
        self.proc.stop(Duration::from_secs(10));
    }
}

/// Wait until `GET http://127.0.0.1:<port><path>` answers 200 while `proc` lives.
async fn wait_healthy(
    proc: &mut Proc,
    name: &str,
    (port, path): (u16, &str),
    log: &Path,
) -> anyhow::Result<()> {
    let admin = crate::mock::MockAdmin::new(&format!("http://127.0.0.1:{port}"));
    let started = std::time::Instant::now();
    loop {
        if !proc.alive() {
            bail!("{name} exited; see {}", log.display());
        }
        if admin.get_text(path).await.is_ok() {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("{name} not healthy after 60s; see {}", log.display());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The namespace Volcano's controllers read their configuration from (`KUBE_POD_NAMESPACE`).
pub const VOLCANO_NAMESPACE: &str = "volcano-system";

/// Volcano's scheduler (`vc-scheduler`) and controller-manager as processes: the Job, PodGroup,
/// Queue and HyperNode controllers, no admission webhooks (so a Job names its queue, scheduler
/// and `minAvailable` itself), no leader election.
pub struct Volcano {
    scheduler: Proc,
    controllers: Proc,
    pub scheduler_log: PathBuf,
    pub controllers_log: PathBuf,
}

impl Volcano {
    /// Start both with the scheduler configuration `scheduler_conf` (Volcano's YAML: actions and
    /// plugin tiers). The HyperNode label discovery reads `volcano-controller-configmap` in
    /// [`VOLCANO_NAMESPACE`] if it exists.
    pub async fn start(
        bin_dir: &Path,
        kubeconfig: &Path,
        dir: &Path,
        client: &Client,
        scheduler_conf: &str,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        kube_util::ensure_namespace(client, VOLCANO_NAMESPACE).await?;
        let conf = dir.join("volcano-scheduler.conf");
        std::fs::write(&conf, scheduler_conf)?;
        let kubeconfig = format!("--kubeconfig={}", kubeconfig.display());

        let controllers_health = free_port()?;
        let mut cmd = Command::new(bin_dir.join("vc-controller-manager"));
        cmd.args([
            kubeconfig.as_str(),
            "--leader-elect=false",
            "--controllers=job-controller,pg-controller,queue-controller,hyperNode-controller",
            "--enable-healthz=true",
            &format!("--healthz-address=127.0.0.1:{controllers_health}"),
            "--v=3",
        ])
        .env("KUBE_POD_NAMESPACE", VOLCANO_NAMESPACE);
        let controllers_log = dir.join("vc-controller-manager.log");
        let mut controllers = Proc::spawn("vc-controller-manager", cmd, &controllers_log)?;

        let (scheduler_health, scheduler_metrics) = (free_port()?, free_port()?);
        let mut cmd = Command::new(bin_dir.join("vc-scheduler"));
        cmd.args([
            kubeconfig.as_str(),
            "--leader-elect=false",
            &format!("--scheduler-conf={}", conf.display()),
            "--schedule-period=1s",
            "--enable-healthz=true",
            &format!("--healthz-address=127.0.0.1:{scheduler_health}"),
            &format!("--listen-address=127.0.0.1:{scheduler_metrics}"),
            "--cache-dumper=false",
            "--v=3",
        ]);
        let scheduler_log = dir.join("vc-scheduler.log");
        let mut scheduler = Proc::spawn("vc-scheduler", cmd, &scheduler_log)?;

        wait_healthy(
            &mut controllers,
            "vc-controller-manager",
            (controllers_health, "/healthz"),
            &controllers_log,
        )
        .await?;
        wait_healthy(
            &mut scheduler,
            "vc-scheduler",
            (scheduler_health, "/healthz"),
            &scheduler_log,
        )
        .await?;
        Ok(Self {
            scheduler,
            controllers,
            scheduler_log,
            controllers_log,
        })
    }

    /// The last `n` lines of both logs, for a failure message.
    pub fn log_tails(&self, n: usize) -> String {
        format!(
            "vc-scheduler log tail:\n{}\nvc-controller-manager log tail:\n{}",
            tail(&self.scheduler_log, n),
            tail(&self.controllers_log, n)
        )
    }

    pub fn stop(&mut self) {
        self.scheduler.stop(Duration::from_secs(10));
        self.controllers.stop(Duration::from_secs(10));
    }
}

/// Tail of a log file.
fn tail(p: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// KAI's scheduler, binder and pod grouper as processes (what KAI's operator would deploy), no
/// leader election, no admission webhook.
pub struct Kai {
    procs: Vec<(String, Proc, PathBuf)>,
}

impl Kai {
    /// Start them, with the PriorityClasses KAI's chart installs (its pod groups name them).
    pub async fn start(
        bin_dir: &Path,
        kubeconfig: &Path,
        dir: &Path,
        client: &Client,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        for entry in std::fs::read_dir(bin_dir.join("priorityclasses"))? {
            let text = std::fs::read_to_string(entry?.path())?;
            kube_util::apply_yaml(client, &text, "e2e").await?;
        }
        let mut procs = Vec::new();
        let mut waits = Vec::new();
        for name in ["kai-podgrouper", "kai-binder", "kai-scheduler"] {
            let (a, b) = (free_port()?, free_port()?);
            let mut cmd = Command::new(bin_dir.join(name));
            cmd.env("KUBECONFIG", kubeconfig)
                .arg("--leader-elect=false");
            // The scheduler serves only metrics, the binder registers no readiness check (its
            // probe answers 404): their metrics endpoint says they are up.
            let probe = match name {
                "kai-scheduler" => {
                    cmd.args([
                        format!("--listen-address=127.0.0.1:{a}"),
                        format!("--plugin-server-port={b}"),
                        "--schedule-period=1s".into(),
                        "--v=4".into(),
                    ]);
                    (a, "/metrics")
                }
                _ => {
                    cmd.args([
                        format!("--metrics-bind-address=127.0.0.1:{a}"),
                        format!("--health-probe-bind-address=127.0.0.1:{b}"),
                    ]);
                    if name == "kai-binder" {
                        (a, "/metrics")
                    } else {
                        (b, "/readyz")
                    }
                }
            };
            let log = dir.join(format!("{name}.log"));
            let proc = Proc::spawn(name, cmd, &log)?;
            procs.push((name.to_string(), proc, log));
            waits.push(probe);
        }
        let mut kai = Self { procs };
        for ((name, proc, log), probe) in kai.procs.iter_mut().zip(waits) {
            wait_healthy(proc, name, probe, log).await?;
        }
        Ok(kai)
    }

    /// The last `n` lines of each log, for a failure message.
    pub fn log_tails(&self, n: usize) -> String {
        self.procs
            .iter()
            .map(|(name, _, log)| format!("{name} log tail:\n{}", tail(log, n)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn stop(&mut self) {
        for (_, proc, _) in &mut self.procs {
            proc.stop(Duration::from_secs(10));
        }
    }
}

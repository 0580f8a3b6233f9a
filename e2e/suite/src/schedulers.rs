//! The schedulers' side: their CRDs (from the pinned Kueue and Volcano modules) and the real
//! Kueue manager, run out of cluster against the e2e API server.

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

/// Build (or reuse) the Kueue manager and the CRDs; returns their directory.
pub fn artifacts() -> anyhow::Result<PathBuf> {
    crate::built_by("e2e/schedulers/build.sh", "E2E_SCHEDULERS")
}

/// Apply every CRD YAML in `dir` and wait until the API server serves them.
pub async fn install_crds(client: &Client, dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut applied = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
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

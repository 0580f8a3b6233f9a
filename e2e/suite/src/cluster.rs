//! A real Kubernetes API server for tests: kube-apiserver + etcd, built from the Go module proxy
//! by `e2e/controlplane/build.sh` and started here on loopback, with RBAC on, a self-generated
//! serving certificate and static tokens for an admin and for the controller's ServiceAccount
//! identity. Ports are picked freely, so two instances never collide.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use kube::{Client, Config, config::KubeConfigOptions, config::Kubeconfig};

use crate::process::{Proc, free_port};

/// Namespace the controller runs in, and so its ServiceAccount identity.
pub const NAMESPACE: &str = "ec2-topology-labeler";
pub const SERVICE_ACCOUNT: &str = "ec2-topology-labeler";
pub const SECOND_SERVICE_ACCOUNT: &str = "ec2-topology-labeler-b";

/// The directory holding `kube-apiserver` and `etcd`, building them if needed.
pub fn control_plane_bin_dir() -> anyhow::Result<PathBuf> {
    crate::built_by("e2e/controlplane/build.sh", "E2E_CONTROLPLANE_BIN")
}

pub struct ControlPlane {
    pub dir: PathBuf,
    pub server: String,
    pub admin_kubeconfig: PathBuf,
    pub controller_kubeconfig: PathBuf,
    /// A second controller identity (ServiceAccount [`SECOND_SERVICE_ACCOUNT`]), with no
    /// permissions until a test binds some: to cut one replica off without the other.
    pub second_controller_kubeconfig: PathBuf,
    bin: PathBuf,
    etcd: Proc,
    apiserver: std::sync::Mutex<Option<Proc>>,
    apiserver_args: Vec<String>,
}

fn token() -> String {
    (0..32)
        .map(|_| char::from_digit(fastrand::u32(..16), 16).unwrap_or('0'))
        .collect()
}

fn kubeconfig(server: &str, ca: &Path, user: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: e2e\n  context:\n    cluster: e2e\n    user: {user}\ncurrent-context: e2e\n",
        ca = ca.display()
    )
}

fn openssl(args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new("openssl")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .context("running openssl (install it: apt-get install openssl)")?;
    if !status.success() {
        bail!("openssl {args:?} failed");
    }
    Ok(())
}

impl ControlPlane {
    /// Start etcd and kube-apiserver in `dir`; returns once `/readyz` answers.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let bin = control_plane_bin_dir()?;
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let started = Instant::now();

        let (client_port, peer_port, secure_port) = (free_port()?, free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let mut etcd_cmd = Command::new(bin.join("etcd"));
        etcd_cmd.args([
            "--name=e2e",
            &format!("--data-dir={}", dir.join("etcd").display()),
            &format!("--listen-client-urls={etcd_url}"),
            &format!("--advertise-client-urls={etcd_url}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-cluster=e2e=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]);
        let etcd = Proc::spawn("etcd", etcd_cmd, &dir.join("etcd.log"))?;

        let sa_key = dir.join("sa.key");
        let sa_pub = dir.join("sa.pub");
        openssl(&["genrsa", "-out", path(&sa_key), "2048"])?;
        openssl(&[
            "rsa",
            "-in",
            path(&sa_key),
            "-pubout",
            "-out",
            path(&sa_pub),
        ])?;
        let (admin_token, controller_token, second_token) = (token(), token(), token());
        let sa_user = format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}");
        let second_user = format!("system:serviceaccount:{NAMESPACE}:{SECOND_SERVICE_ACCOUNT}");
        let groups = format!(
            "system:serviceaccounts,system:serviceaccounts:{NAMESPACE},system:authenticated"
        );
        std::fs::write(
            dir.join("tokens.csv"),
            format!(
                "{admin_token},e2e-admin,e2e-admin,\"system:masters\"\n{controller_token},{sa_user},{sa_uid},\"{groups}\"\n{second_token},{second_user},{second_uid},\"{groups}\"\n",
                sa_uid = "00000000-0000-4000-8000-00000000e2e0",
                second_uid = "00000000-0000-4000-8000-00000000e2e1",
            ),
        )?;
        let server = format!("https://127.0.0.1:{secure_port}");
        let ca = dir.join("certs/apiserver.crt");
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        let controller_kubeconfig = dir.join("controller.kubeconfig");
        let second_controller_kubeconfig = dir.join("controller-b.kubeconfig");
        std::fs::write(
            &second_controller_kubeconfig,
            kubeconfig(&server, &ca, SECOND_SERVICE_ACCOUNT, &second_token),
        )?;
        std::fs::write(
            &admin_kubeconfig,
            kubeconfig(&server, &ca, "e2e-admin", &admin_token),
        )?;
        std::fs::write(
            &controller_kubeconfig,
            kubeconfig(&server, &ca, SERVICE_ACCOUNT, &controller_token),
        )?;

        let apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={secure_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", dir.join("certs").display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--authorization-mode=RBAC".into(),
            format!("--token-auth-file={}", dir.join("tokens.csv").display()),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        let cp = Self {
            dir,
            server,
            admin_kubeconfig,
            controller_kubeconfig,
            second_controller_kubeconfig,
            bin,
            etcd,
            apiserver: std::sync::Mutex::new(None),
            apiserver_args,
        };
        cp.start_apiserver().await?;
        // Which Kubernetes the suite runs on (E2E_CONTROLPLANE_BIN picks another build).
        let version = cp
            .admin_client()
            .await?
            .apiserver_version()
            .await
            .map(|v| v.git_version)
            .unwrap_or_else(|e| format!("unknown ({e})"));
        eprintln!(
            "control plane (kube-apiserver {version}) ready at {} in {:.1}s ({})",
            cp.server,
            started.elapsed().as_secs_f64(),
            cp.dir.display()
        );
        Ok(cp)
    }

    fn apiserver(&self) -> std::sync::MutexGuard<'_, Option<Proc>> {
        self.apiserver.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn start_apiserver(&self) -> anyhow::Result<()> {
        let mut cmd = Command::new(self.bin.join("kube-apiserver"));
        cmd.args(&self.apiserver_args);
        *self.apiserver() = Some(Proc::spawn(
            "kube-apiserver",
            cmd,
            &self.dir.join("apiserver.log"),
        )?);
        self.wait_ready(Duration::from_secs(60)).await
    }

    /// Stop kube-apiserver (etcd keeps the data); every client's watch drops.
    pub fn stop_apiserver(&self) {
        let p = self.apiserver().take();
        if let Some(mut p) = p {
            p.stop(Duration::from_secs(10));
        }
    }

    /// Stop and start kube-apiserver, waiting until it is ready again.
    pub async fn restart_apiserver(&self) -> anyhow::Result<()> {
        self.stop_apiserver();
        self.start_apiserver().await
    }

    async fn wait_ready(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let ca = self.dir.join("certs/apiserver.crt");
        let mut last_error = String::from("not started");
        while Instant::now() < deadline {
            let exited = self.apiserver().as_mut().is_some_and(|p| !p.alive());
            if exited {
                bail!(
                    "kube-apiserver exited; see {}",
                    self.dir.join("apiserver.log").display()
                );
            }
            if ca.exists() {
                match self.admin_client().await {
                    Ok(client) => {
                        let req = http::Request::get("/readyz").body(Vec::new())?;
                        match client.request_text(req).await {
                            Ok(body) if body.trim() == "ok" => return Ok(()),
                            Ok(body) => last_error = body,
                            Err(e) => last_error = e.to_string(),
                        }
                    }
                    Err(e) => last_error = e.to_string(),
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        bail!("kube-apiserver not ready after {timeout:?}: {last_error}")
    }

    /// PIDs of etcd and kube-apiserver while they run.
    pub fn pids(&self) -> Vec<u32> {
        self.etcd
            .pid()
            .into_iter()
            .chain(self.apiserver().as_ref().and_then(Proc::pid))
            .collect()
    }

    pub async fn admin_client(&self) -> anyhow::Result<Client> {
        client_from(&self.admin_kubeconfig).await
    }

    /// Stop the API server and etcd, by PID, waiting for both to exit.
    pub fn stop(&mut self) {
        self.stop_apiserver();
        self.etcd.stop(Duration::from_secs(10));
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap_or_default()
}

/// A client from a kubeconfig file.
pub async fn client_from(kubeconfig: &Path) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// The cluster the tests run against: a local control plane, or whatever `E2E_KUBECONFIG`
/// points at (a kind cluster with the chart installed).
pub struct Cluster {
    pub admin_kubeconfig: PathBuf,
    /// For the local control plane: a kubeconfig with the controller's ServiceAccount identity.
    pub controller_kubeconfig: Option<PathBuf>,
    pub local: Option<ControlPlane>,
}

impl Cluster {
    pub async fn from_env(dir: &Path) -> anyhow::Result<Self> {
        if let Ok(kc) = std::env::var("E2E_KUBECONFIG") {
            return Ok(Self {
                admin_kubeconfig: PathBuf::from(kc),
                controller_kubeconfig: None,
                local: None,
            });
        }
        let cp = ControlPlane::start(dir).await?;
        Ok(Self {
            admin_kubeconfig: cp.admin_kubeconfig.clone(),
            controller_kubeconfig: Some(cp.controller_kubeconfig.clone()),
            local: Some(cp),
        })
    }

    pub async fn admin(&self) -> anyhow::Result<Client> {
        client_from(&self.admin_kubeconfig).await
    }
}

//! End-to-end harness shared by the e2e tests, the demo and the benchmarks.
//!
//! - [`cluster`]: a real kube-apiserver + etcd on loopback (the envtest approach), or any cluster
//!   given by kubeconfig (kind).
//! - [`mock`]: mock-ec2 as a process, driven through its admin HTTP API.
//! - [`labeler`]: the controller binary as a process, running as its ServiceAccount identity.
//! - [`fixtures`]: realistic Node objects and scenario instances.
//! - [`kube_util`]: applying manifests, waiting for labels, reading API-server metrics.

pub mod cluster;
pub mod env;
pub mod fixtures;
pub mod helm;
pub mod kube_util;
pub mod labeler;
pub mod mock;
pub mod process;
pub mod schedulers;

use std::path::PathBuf;

/// The repository root (this crate lives in `e2e/suite`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// Where cargo put this workspace's binaries (`target/debug`), found from the running binary
/// (tests run from `target/debug/deps`), unless `E2E_BIN_DIR` says otherwise.
pub fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("E2E_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(PathBuf::from).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Run one of the project's cached build scripts (they print the directory of what they built)
/// unless `env_override` names that directory already.
pub fn built_by(script: &str, env_override: &str) -> anyhow::Result<PathBuf> {
    if let Ok(dir) = std::env::var(env_override) {
        return Ok(PathBuf::from(dir));
    }
    let script = repo_root().join(script);
    let out = std::process::Command::new(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| anyhow::anyhow!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        anyhow::bail!("{} failed", script.display());
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// Install the process-wide rustls provider (ring) once.
pub fn init_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A fresh working directory under the system temp dir.
pub fn work_dir(prefix: &str) -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "{prefix}-{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

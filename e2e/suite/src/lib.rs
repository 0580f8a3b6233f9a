//! End-to-end harness shared by the e2e tests, the demo and the benchmarks.
//!
//! - [`cluster`]: a real kube-apiserver + etcd on loopback (the envtest approach), or any cluster
//!   given by kubeconfig (kind).
//! - [`mock`]: mock-ec2 as a process, driven through its admin HTTP API.
//! - [`labeler`]: the controller binary as a process, running as its ServiceAccount identity.
//! - [`fixtures`]: realistic Node objects and scenario instances.
//! - [`kube_util`]: applying manifests, waiting for labels, reading API-server metrics.

pub mod cluster;
pub mod credentials;
pub mod doctest;
pub mod env;
pub mod fixtures;
pub mod generated;
pub mod helm;
pub mod incluster;
pub mod kube_util;
pub mod labeler;
pub mod mock;
pub mod process;
pub mod schedulers;

use std::path::PathBuf;

/// The repository root, found at run time: `E2E_REPO_ROOT`, else two levels above the
/// `CARGO_MANIFEST_DIR` cargo sets when it runs a test or binary (this crate lives in
/// `e2e/suite`), else the first directory upwards from the working directory that holds the
/// e2e scripts, else where this crate was compiled. Not only the last: checkouts that share a
/// `CARGO_TARGET_DIR` (CI clones and a working tree) share fresh binaries, and a path baked in
/// at compile time may name another checkout, or one since deleted.
pub fn repo_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("E2E_REPO_ROOT") {
        return PathBuf::from(dir);
    }
    let holds_scripts = |dir: &std::path::Path| dir.join("e2e/controlplane/build.sh").is_file();
    if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") {
        let root = PathBuf::from(dir).join("../..");
        if holds_scripts(&root) {
            return root.canonicalize().unwrap_or(root);
        }
    }
    if let Ok(cwd) = std::env::current_dir()
        && let Some(root) = cwd.ancestors().find(|dir| holds_scripts(dir))
    {
        return root.to_path_buf();
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
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

/// Remove a working directory when the run it served passed (etcd's data alone is 0.5 to 2 GB
/// a run: kept, they filled a developer's disk in a day). A failed run keeps it for its logs,
/// and so does any run with `EC2TL_KEEP_WORK=1`.
pub fn remove_work_dir(dir: &std::path::Path, passed: bool) {
    if !passed || std::env::var_os("EC2TL_KEEP_WORK").is_some_and(|v| v == "1") {
        eprintln!("working directory kept: {}", dir.display());
        return;
    }
    if let Err(e) = std::fs::remove_dir_all(dir) {
        eprintln!("could not remove {}: {e}", dir.display());
    }
}

/// The SHA-256 of `bytes`, in lowercase hex (an OCI digest without its `sha256:`).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

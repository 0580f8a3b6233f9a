//! The controller binary as a process, as the tests and the demo run it.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::bail;

use crate::{
    mock::MockAdmin,
    process::{Proc, free_port},
};

/// The dummy long-term keys the controller signs with unless told otherwise.
pub const STATIC_ACCESS_KEY_ID: &str = "AKIDEXAMPLE";
pub const STATIC_SECRET_ACCESS_KEY: &str = "e2e-not-a-secret";

pub struct Labeler {
    pub metrics_url: String,
    /// `--debug-addr` (for `explain`).
    pub debug_addr: String,
    pub log: PathBuf,
    proc: Proc,
}

/// How to run it.
pub struct LabelerOptions<'a> {
    pub kubeconfig: &'a Path,
    pub ec2_url: &'a str,
    pub dir: &'a Path,
    /// Extra flags (`--resync-period=5s`, …).
    pub args: Vec<String>,
    /// `RUST_LOG`.
    pub log_filter: &'a str,
    /// Log file name inside `dir`.
    pub log_name: &'a str,
    /// Extra environment (`POD_NAME`, …). When it names another credential source
    /// (`AWS_ROLE_ARN` for a web identity, `AWS_CONTAINER_CREDENTIALS_FULL_URI` for EKS Pod
    /// Identity), the dummy static keys are left out: the SDK's chain would take them first.
    pub env: Vec<(String, String)>,
    /// The controller binary; `None`: `E2E_LABELER_BIN`, else this workspace's dev build.
    pub bin: Option<&'a Path>,
}

impl Labeler {
    pub fn start(opts: LabelerOptions<'_>) -> anyhow::Result<Self> {
        let port = free_port()?;
        let debug_port = free_port()?;
        // E2E_LABELER_BIN: another build of the controller (the benchmarks pass theirs).
        let bin = match opts.bin {
            Some(b) => b.to_path_buf(),
            None => std::env::var_os("E2E_LABELER_BIN")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| crate::bin_dir().join("ec2-topology-labeler")),
        };
        if !bin.exists() {
            bail!(
                "{} is missing: run cargo build --workspace --bins first",
                bin.display()
            );
        }
        // E2E_LABELER_WRAPPER runs the controller under a profiler (`heaptrack -o /tmp/ht`, say).
        let mut cmd = match std::env::var("E2E_LABELER_WRAPPER") {
            Ok(w) if !w.trim().is_empty() => {
                let mut words = w.split_whitespace();
                let mut cmd = Command::new(words.next().unwrap_or_default());
                cmd.args(words).arg(bin);
                cmd
            }
            _ => Command::new(bin),
        };
        // The key verification records are sealed with, as the chart mounts one: one per work
        // directory, so that every controller of a run (restarts, a second replica, a new
        // build) trusts the others' records. A scenario may pass its own.
        let key_flag = if opts.args.iter().any(|a| a.starts_with("--record-key-file")) {
            None
        } else {
            let key = opts.dir.join("record.key");
            if !key.exists() {
                let secret: String = (0..48)
                    .map(|_| char::from_digit(fastrand::u32(..16), 16).unwrap_or('0'))
                    .collect();
                std::fs::write(&key, secret)?;
            }
            Some(format!("--record-key-file={}", key.display()))
        };
        cmd.arg("run")
            .arg(format!("--metrics-addr=127.0.0.1:{port}"))
            .arg(format!("--debug-addr=127.0.0.1:{debug_port}"))
            .args(key_flag)
            .args(&opts.args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("KUBECONFIG", opts.kubeconfig)
            .env("RUST_LOG", opts.log_filter)
            // The SDK's standard endpoint override, as a user would point it at any EC2 endpoint.
            .env("AWS_ENDPOINT_URL_EC2", opts.ec2_url)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            .envs(opts.env.iter().map(|(k, v)| (k, v)));
        let other_source = opts
            .env
            .iter()
            .any(|(k, _)| k == "AWS_ROLE_ARN" || k == "AWS_CONTAINER_CREDENTIALS_FULL_URI");
        if !other_source {
            cmd.env("AWS_ACCESS_KEY_ID", STATIC_ACCESS_KEY_ID)
                .env("AWS_SECRET_ACCESS_KEY", STATIC_SECRET_ACCESS_KEY);
        }
        let log = opts.dir.join(opts.log_name);
        let proc = Proc::spawn("ec2-topology-labeler", cmd, &log)?;
        Ok(Self {
            metrics_url: format!("http://127.0.0.1:{port}"),
            debug_addr: format!("127.0.0.1:{debug_port}"),
            log,
            proc,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    pub fn alive(&mut self) -> bool {
        self.proc.alive()
    }

    /// Wait until `/readyz` says the node cache synced.
    pub async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let admin = MockAdmin::new(&self.metrics_url);
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if !self.alive() {
                bail!("controller exited; log:\n{}", self.log_tail(40));
            }
            if admin
                .get_text("/readyz")
                .await
                .is_ok_and(|b| b.trim() == "ok")
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!(
            "controller not ready after {timeout:?}; log:\n{}",
            self.log_tail(40)
        )
    }

    /// The controller's own `/metrics`.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        MockAdmin::new(&self.metrics_url).get_text("/metrics").await
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn stop(&mut self) {
        self.proc.stop(Duration::from_secs(10));
    }

    pub fn kill(&mut self) {
        self.proc.kill();
    }
}

/// Sum of a Prometheus counter family in a text exposition, over series whose labels contain
/// every `label="value"` given.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| labels.iter().all(|kv| l.contains(kv)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

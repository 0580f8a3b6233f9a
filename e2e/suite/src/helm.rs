//! Helm, built from the Go module proxy by `e2e/tools/build.sh` (or `E2E_HELM`).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, bail};

pub fn helm_bin() -> anyhow::Result<PathBuf> {
    if let Ok(h) = std::env::var("E2E_HELM") {
        return Ok(PathBuf::from(h));
    }
    Ok(crate::built_by("e2e/tools/build.sh", "E2E_TOOLS")?.join("helm"))
}

/// Run helm with `args` (and `--kubeconfig` when given); returns stdout, fails with stderr.
pub fn helm(kubeconfig: Option<&Path>, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = Command::new(helm_bin()?);
    cmd.args(args);
    if let Some(kc) = kubeconfig {
        cmd.arg("--kubeconfig").arg(kc);
    }
    let out = cmd.output().context("running helm")?;
    if !out.status.success() {
        bail!(
            "helm {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// `helm upgrade --reuse-values` of the suite's release with `sets` (`KEY=VALUE` each), as an
/// operator changes one setting.
pub fn upgrade_reusing(kubeconfig: &Path, sets: &[String]) -> anyhow::Result<String> {
    let chart = chart();
    let mut args = vec![
        "upgrade",
        "ec2-topology-labeler",
        chart.to_str().unwrap_or_default(),
        "--namespace",
        crate::cluster::NAMESPACE,
        "--reuse-values",
    ];
    for set in sets {
        args.extend(["--set", set.as_str()]);
    }
    helm(Some(kubeconfig), &args)
}

/// Our chart's `template` (`helm template`, release `ec2-topology-labeler` in the suite's
/// namespace) of the file `show_only` alone (`templates/…`), with `sets` (`KEY=VALUE` each).
pub fn template(show_only: &str, sets: &[&str]) -> anyhow::Result<String> {
    let chart = chart();
    let mut args = vec![
        "template",
        "ec2-topology-labeler",
        chart.to_str().unwrap_or_default(),
        "--namespace",
        crate::cluster::NAMESPACE,
        "--show-only",
        show_only,
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    helm(None, &args)
}

/// The chart directory.
pub fn chart() -> PathBuf {
    crate::repo_root().join("charts/ec2-topology-labeler")
}

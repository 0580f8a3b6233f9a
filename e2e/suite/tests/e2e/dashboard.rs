//! The chart's Grafana dashboard against a live controller: every series a panel queries is in
//! its `/metrics`, with every feature a panel covers turned on.

use anyhow::{Context, ensure};
use e2e::env::{Env, RESYNC};

/// Metric names in a PromQL expression (ours and the process ones we export).
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = ["ec2_topology_labeler_", "process_"]
        .iter()
        .filter_map(|p| rest.find(p))
        .min()
    {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        out.push(name);
    }
    out
}

/// The labels each `by (…)` of `expr` groups the metric right after it by: `sum by (state, reason)
/// (ec2_topology_labeler_nodes{…})` gives `("ec2_topology_labeler_nodes", ["state", "reason"])`
/// (through `rate(`/`increase(`).
fn grouped_by(expr: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find(" by (") {
        rest = &rest[i + " by (".len()..];
        let Some(close) = rest.find(')') else { break };
        let labels: Vec<String> = rest[..close]
            .split(',')
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect();
        rest = &rest[close + 1..];
        let inner = rest
            .trim_start()
            .trim_start_matches('(')
            .trim_start_matches("rate(")
            .trim_start_matches("increase(");
        if let Some(name) = metric_names(inner).into_iter().next()
            && inner.starts_with(&name)
        {
            out.push((name, labels));
        }
    }
    out
}

/// Labels a Prometheus scrape of a Pod adds to its series (the ServiceMonitor's and Kubernetes
/// service discovery's target labels).
const TARGET_LABELS: [&str; 6] = [
    "namespace",
    "pod",
    "instance",
    "job",
    "container",
    "service",
];

/// Series this run does not export, checked live elsewhere: the container memory limit (only
/// where a cgroup sets one, not for a process on this machine), the reserved capacity (only
/// with `--capacity-reservations` and reservations EC2 reports:
/// `reserved_capacity_metrics_follow_the_reservations`) and the UltraServer interconnects (only
/// with `--ultraserver-health` and capacity blocks: `ultraserver_interconnect_health`).
const ELSEWHERE: [&str; 5] = [
    "ec2_topology_labeler_memory_limit_bytes",
    "ec2_topology_labeler_reserved_instances",
    "ec2_topology_labeler_reserved_instances_joined",
    "ec2_topology_labeler_ultraserver_interconnect",
    "ec2_topology_labeler_ultraserver_interconnect_polls_total",
];

/// The label names of the series of `name` in a text exposition.
fn label_names<'a>(scrape: &'a str, name: &str) -> std::collections::BTreeSet<&'a str> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .flat_map(|l| {
            l.split_once('}')
                .map(|(labels, _)| labels)
                .unwrap_or_default()
                .split(',')
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
        })
        .collect()
}

/// Each query of the dashboard matches a series of the leader's `/metrics` (with the KAI, Kueue,
/// Volcano and Slurm publishers, the startup taint and the condition on), and every label a
/// panel groups by is a label of that metric's series (a query grouping by a label the series
/// lack would draw one unlabelled line). The only selector in the queries is `namespace`, which
/// Prometheus adds when it scrapes. The container memory limit is exported only where a cgroup
/// sets one: not for a process on this machine.
pub async fn dashboard_queries_match_live_metrics(env: &Env) -> anyhow::Result<()> {
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        e2e::repo_root().join("charts/ec2-topology-labeler/dashboards/ec2-topology-labeler.json"),
    )?)?;
    e2e::env::restart_labeler_with(
        env,
        &[
            "--kai-topology=true",
            "--slurm-topology-configmap=slurm/slurm-topology",
            "--node-condition=true",
            "--startup-taint=ec2-topology-labeler.io/topology-pending:NoSchedule",
        ],
    )
    .await?;
    // Until the leader's first coverage count (every 12 publish intervals) and a resync; what
    // is still missing after that matches nothing.
    let deadline = std::time::Instant::now() + RESYNC * 6;
    let (checked, checked_labels, missing) = loop {
        let scrape = {
            let guard = env.labeler.lock().await;
            guard
                .as_ref()
                .context("a local controller")?
                .metrics()
                .await?
        };
        let exported: std::collections::BTreeSet<&str> = scrape
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        let mut checked = 0;
        let mut checked_labels = 0;
        let mut missing = Vec::new();
        for panel in dashboard["panels"].as_array().context("panels")? {
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"].as_str().unwrap_or_default();
                for name in metric_names(expr) {
                    checked += 1;
                    if !exported.contains(name.as_str()) && !ELSEWHERE.contains(&name.as_str()) {
                        missing.push(format!("{} ({name})", panel["title"]));
                    }
                }
                for (name, labels) in grouped_by(expr) {
                    if ELSEWHERE.contains(&name.as_str()) {
                        continue;
                    }
                    let have = label_names(&scrape, &name);
                    // Labels Prometheus attaches to every series of a target when it scrapes
                    // (Kubernetes service discovery), not ones the controller exports.
                    for l in labels
                        .into_iter()
                        .filter(|l| !TARGET_LABELS.contains(&l.as_str()))
                    {
                        checked_labels += 1;
                        if !have.contains(l.as_str()) {
                            missing
                                .push(format!("{} ({name} by {l}: has {have:?})", panel["title"]));
                        }
                    }
                }
            }
        }
        if missing.is_empty() || std::time::Instant::now() > deadline {
            break (checked, checked_labels, missing);
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    };
    let result = (|| {
        ensure!(checked >= 30, "only {checked} series queried");
        ensure!(
            checked_labels >= 10,
            "only {checked_labels} grouping labels checked"
        );
        ensure!(
            missing.is_empty(),
            "panels query series that match nothing: {missing:?}"
        );
        Ok(())
    })();
    e2e::env::restart_labeler_with(env, &[]).await?;
    eprintln!("    {checked} queried series and {checked_labels} grouping labels, all in /metrics");
    result
}

//! `make bench-scale SCALE_EVERYTHING=1`: the controller at one size with every feature on, as
//! the chart turns them on (Kueue `Topology`, Volcano `HyperNode`s, KAI `Topology`, the Slurm
//! ConfigMap, Slinky's annotation, the `TopologyLabeled` condition, the startup taint, UltraServer
//! health and its taint, UltraServer shape), under the chart's RBAC and admission policy, on the real API server
//! with the schedulers' CRDs. A quarter of the leaves are UltraServers (a capacity block each),
//! so the UltraServer level is published, their health polled and their shape labelled. The nodes join carrying the
//! startup taint; once everything is labelled, released and published, a minute of steady state:
//! CPU per publish interval, memory, EC2 calls (the health round's among them) and every object
//! write the API server counts (0 is the target).
//!
//! Writes `docs/benchmarks-scale-everything.csv`; `scale::write_report` renders it as a section
//! of `docs/benchmarks-scale.md`.

use std::{collections::BTreeMap, fmt::Write as _, path::Path, time::Duration};

use super::*;

/// The controller's default publish interval (the steady state is measured in these).
const PUBLISH_INTERVAL: Duration = Duration::from_secs(5);
/// Publish intervals of steady state.
const STEADY_INTERVALS: u32 = 12;
/// The startup taint, as the chart and the flag take it (the nodes carry `PENDING` with it).
const TAINT: &str = "ec2-topology-labeler.io/topology-pending:NoSchedule";
const SLURM_CONFIGMAP: &str = "slurm/slurm-topology";

/// The chart's values that turn every feature on (what the controller's flags below say).
const CHART_SETS: &[&str] = &[
    "config.kueueTopology=true",
    "config.volcanoHypernodes=true",
    "config.kaiTopology=true",
    "config.slurmTopologyConfigmap=slurm/slurm-topology",
    "config.nodeCondition=true",
    "config.startupTaint=ec2-topology-labeler.io/topology-pending:NoSchedule",
    "config.slinkyAnnotation=true",
    "config.ultraserverHealth=true",
    "config.ultraserverHealthTaint=true",
    "config.ultraserverShape=true",
];

/// Every fourth leaf is an UltraServer (its 16 nodes one capacity block).
const ULTRASERVER_EVERY: u32 = 4;
/// The nodes under one leaf.
const LEAF: u32 = 16;

/// One run: a row of docs/benchmarks-scale-everything.csv.
#[derive(Clone, Debug, PartialEq)]
pub struct EverythingRow {
    pub date: String,
    pub commit: String,
    pub build: String,
    pub nodes: u32,
    pub idle_mib: f64,
    /// From the controller's start until every node carried its labels.
    pub labelled_s: f64,
    /// Until every taint was released and the last object written (nothing written for two
    /// publish intervals after).
    pub settled_s: f64,
    pub calls: u64,
    /// Object writes until settled (Nodes and their status, scheduler objects, the ConfigMap).
    pub install_writes: f64,
    pub peak_rss_mib: f64,
    pub install_cpu_s: f64,
    /// Steady state: RSS at its start and end, CPU-s per publish interval, EC2 calls, writes
    /// of any object (Leases aside), Events.
    pub steady_rss_start_mib: f64,
    pub steady_rss_end_mib: f64,
    pub cpu_per_publish_s: f64,
    pub steady_calls: u64,
    pub steady_writes: f64,
    pub steady_events: f64,
    /// What was published: HyperNodes, and the Slurm ConfigMap's size.
    pub hypernodes: usize,
    pub slurm_bytes: usize,
}

pub const CSV_HEADER: &str = "date,commit,build,nodes,idle_rss_mib,labelled_s,settled_s,ec2_calls,install_writes,peak_rss_mib,install_cpu_s,steady_rss_start_mib,steady_rss_end_mib,cpu_per_publish_s,steady_calls,steady_writes,steady_events,hypernodes,slurm_bytes";

impl EverythingRow {
    pub fn to_csv(&self) -> String {
        format!(
            "{},{},{},{},{:.1},{:.2},{:.2},{},{},{:.1},{:.2},{:.1},{:.1},{:.3},{},{},{},{},{}",
            self.date,
            self.commit,
            self.build,
            self.nodes,
            self.idle_mib,
            self.labelled_s,
            self.settled_s,
            self.calls,
            self.install_writes,
            self.peak_rss_mib,
            self.install_cpu_s,
            self.steady_rss_start_mib,
            self.steady_rss_end_mib,
            self.cpu_per_publish_s,
            self.steady_calls,
            self.steady_writes,
            self.steady_events,
            self.hypernodes,
            self.slurm_bytes,
        )
    }

    pub fn from_csv(line: &str) -> anyhow::Result<Self> {
        let f: Vec<&str> = line.split(',').collect();
        let want = CSV_HEADER.split(',').count();
        anyhow::ensure!(f.len() == want, "{} fields, not {want}: {line}", f.len());
        let num = |i: usize| -> anyhow::Result<f64> {
            f[i].parse::<f64>()
                .with_context(|| format!("field {i} of {line}"))
        };
        let int = |i: usize| -> anyhow::Result<u64> {
            f[i].parse::<u64>()
                .with_context(|| format!("field {i} of {line}"))
        };
        Ok(Self {
            date: f[0].into(),
            commit: f[1].into(),
            build: f[2].into(),
            nodes: u32::try_from(int(3)?)?,
            idle_mib: num(4)?,
            labelled_s: num(5)?,
            settled_s: num(6)?,
            calls: int(7)?,
            install_writes: num(8)?,
            peak_rss_mib: num(9)?,
            install_cpu_s: num(10)?,
            steady_rss_start_mib: num(11)?,
            steady_rss_end_mib: num(12)?,
            cpu_per_publish_s: num(13)?,
            steady_calls: int(14)?,
            steady_writes: num(15)?,
            steady_events: num(16)?,
            hypernodes: usize::try_from(int(17)?)?,
            slurm_bytes: usize::try_from(int(18)?)?,
        })
    }
}

/// The rows of `csv` (none when it is missing or of another format).
pub fn load_rows(csv: &Path) -> anyhow::Result<Vec<EverythingRow>> {
    let Ok(text) = std::fs::read_to_string(csv) else {
        return Ok(Vec::new());
    };
    let mut lines = text.lines();
    if lines.next() != Some(CSV_HEADER) {
        eprintln!("{}: another format; its rows are not kept", csv.display());
        return Ok(Vec::new());
    }
    lines
        .filter(|l| !l.trim().is_empty())
        .map(EverythingRow::from_csv)
        .collect()
}

/// `kept` with `new` in place of the row of the same size and build, by size then build.
pub fn merge(kept: Vec<EverythingRow>, new: EverythingRow) -> Vec<EverythingRow> {
    let mut rows: Vec<EverythingRow> = kept
        .into_iter()
        .filter(|k| !(k.nodes == new.nodes && k.build == new.build))
        .collect();
    rows.push(new);
    rows.sort_by(|a, b| (a.nodes, &a.build).cmp(&(b.nodes, &b.build)));
    rows
}

/// The section of docs/benchmarks-scale.md for `rows` (empty when there are none).
pub fn section(rows: &[EverythingRow]) -> anyhow::Result<String> {
    let mut md = String::new();
    if rows.is_empty() {
        return Ok(md);
    }
    writeln!(
        md,
        "### Everything on\n\nBuilt up by `make bench-scale SCALE_SIZES=20000 SCALE_BUILD=musl SCALE_EVERYTHING=1`. The chart installed with every feature on (Kueue `Topology`, Volcano `HyperNode`s, KAI `Topology`, the Slurm ConfigMap `{SLURM_CONFIGMAP}`, Slinky's annotation, the `TopologyLabeled` condition, the startup taint `{TAINT}`, UltraServer health and its taint, UltraServer shape), the controller under its RBAC and admission policy, the schedulers' CRDs from their pinned releases. The nodes exist, each carrying the startup taint, when the controller starts cold (default resync period, publish interval {} s). *Settled* is when every node was labelled, every taint released and nothing had been written for two publish intervals. Steady state is the {} publish intervals after that: CPU per interval, EC2 calls, and every write the API server counts (any resource but Leases and the API server's own Endpoints; Events apart). The fleet is a tree (2 spines, 20 aggregation blocks, leaves of 16 nodes): Volcano and Slurm publish only a tree. Every fourth leaf is an UltraServer (p6e-gb200, its 16 nodes one capacity block, every interconnect `ok`): the UltraServer level is published (Kueue and KAI Topologies, Volcano tier 0) and the leader polls their health every minute and their shape every 10 minutes (default intervals), so the steady state's EC2 calls are those rounds' (a call per 100 capacity blocks each).\n",
        PUBLISH_INTERVAL.as_secs(),
        STEADY_INTERVALS
    )?;
    writeln!(
        md,
        "| nodes | build | measured | labelled (s) | settled (s) | EC2 calls | writes until settled | peak RSS (MiB) | per node (KiB) | CPU (s) | steady RSS (MiB) | CPU-s per publish interval | steady: calls, writes, Events | HyperNodes | Slurm ConfigMap (KiB) |"
    )?;
    writeln!(
        md,
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: |"
    )?;
    for r in rows {
        writeln!(
            md,
            "| {} | {} | {} {} | {:.1} | {:.1} | {} | {} | {:.0} | {:.2} | {:.1} | {:.0} → {:.0} | {:.3} | {}, {}, {} | {} | {:.0} |",
            r.nodes,
            r.build,
            r.date,
            r.commit,
            r.labelled_s,
            r.settled_s,
            r.calls,
            r.install_writes,
            r.peak_rss_mib,
            (r.peak_rss_mib - r.idle_mib).max(0.0) * 1024.0 / f64::from(r.nodes.max(1)),
            r.install_cpu_s,
            r.steady_rss_start_mib,
            r.steady_rss_end_mib,
            r.cpu_per_publish_s,
            r.steady_calls,
            r.steady_writes,
            r.steady_events,
            r.hypernodes,
            r.slurm_bytes as f64 / 1024.0,
        )?;
    }
    writeln!(md)?;
    Ok(md)
}

/// Writes the API server has served since it started, by `resource[/subresource]`: every
/// mutating verb of any resource but Leases (leader election renews one every few seconds) and
/// the API server's own Endpoints; Events are among them (told apart by [`total`]).
async fn writes_by_resource(client: &Client) -> anyhow::Result<BTreeMap<String, f64>> {
    let text = kube_util::apiserver_metrics(client).await?;
    let mut by = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split("\",")
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        if !matches!(
            label("verb").as_str(),
            "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE" | "DELETECOLLECTION"
        ) {
            continue;
        }
        let resource = label("resource");
        // Leader election, and the API server's own endpoints (rewritten every 10 s).
        if matches!(resource.as_str(), "leases" | "endpoints" | "endpointslices") {
            continue;
        }
        let sub = label("subresource");
        let key = if sub.is_empty() {
            resource
        } else {
            format!("{resource}/{sub}")
        };
        *by.entry(key).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    Ok(by)
}

fn total(by: &BTreeMap<String, f64>, events: bool) -> f64 {
    by.iter()
        .filter(|(k, _)| (k.as_str() == "events") == events)
        .fold(0.0, |sum, (_, v)| sum + v)
}

/// What changed between two counts (only the resources written).
fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect()
}

async fn hypernodes(client: &Client) -> anyhow::Result<usize> {
    use kube::{
        api::{ApiResource, DynamicObject},
        core::GroupVersionKind,
    };
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("topology.volcano.sh", "v1alpha1", "HyperNode"),
        "hypernodes",
    );
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    Ok(api.list_metadata(&Default::default()).await?.items.len())
}

async fn slurm_bytes(client: &Client) -> anyhow::Result<usize> {
    use k8s_openapi::api::core::v1::ConfigMap;
    let (ns, name) = SLURM_CONFIGMAP
        .split_once('/')
        .unwrap_or(("slurm", "slurm-topology"));
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    Ok(api
        .get_opt(name)
        .await?
        .and_then(|c| c.data)
        .map(|d| d.values().map(String::len).sum())
        .unwrap_or(0))
}

/// Every EC2 call mock-ec2 received since its counts were reset: DescribeInstanceTopology and
/// the Capacity Block calls (the health rounds').
async fn ec2_calls(env: &Env) -> anyhow::Result<u64> {
    let blocks = env.mock.admin.capacity_block_stats().await?;
    Ok(env.mock.admin.stats().await?.calls + blocks.blocks_calls + blocks.status_calls)
}

/// Nodes still carrying the startup taint.
async fn tainted(client: &Client) -> anyhow::Result<usize> {
    let api: Api<Node> = Api::all(client.clone());
    let mut left = 0;
    let mut params = kube::api::ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        left += page
            .items
            .iter()
            .filter(|n| {
                n.spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == PENDING))
            })
            .count();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => params = params.continue_token(&c),
            _ => return Ok(left),
        }
    }
}

/// The fleet as a tree (Volcano and Slurm publish only a tree): 2 spines, 20 aggregation
/// blocks, 10 under each spine, leaves of 16 nodes; every fourth leaf an UltraServer
/// (p6e-gb200, the leaf's nodes one capacity block).
fn tree(n: u32) -> Vec<(NodeSpec, Instance)> {
    (0..n)
        .map(|k| {
            let leaf = k / LEAF;
            let block = leaf
                .is_multiple_of(ULTRASERVER_EVERY)
                .then(|| capacity_block(leaf));
            let kind = if block.is_some() {
                "p6e-gb200.36xlarge"
            } else {
                "p5.48xlarge"
            };
            let s = NodeSpec::ec2(0xbe0, k, kind);
            let agg = leaf % 20;
            let mut i = s.instance(&[
                &format!("nn-spine-{}", agg % 2),
                &format!("nn-agg-{agg}"),
                &format!("nn-leaf-{leaf}"),
            ]);
            i.capacity_block_id = block;
            (s, i)
        })
        .collect()
}

/// The capacity block of UltraServer leaf `leaf`.
fn capacity_block(leaf: u32) -> String {
    format!("cr-{leaf:017x}")
}

/// What EC2 says of the fleet's capacity blocks (every interconnect `ok`: a healthy fleet is
/// never written to).
fn capacity_blocks(
    pairs: &[(NodeSpec, Instance)],
) -> Vec<mock_ec2::capacity_blocks::CapacityBlock> {
    let ids: std::collections::BTreeSet<&str> = pairs
        .iter()
        .filter_map(|(_, i)| i.capacity_block_id.as_deref())
        .collect();
    ids.into_iter()
        .map(|id| e2e::fixtures::ultraserver_block(id, LEAF))
        .collect()
}

/// One size with one build, every feature on.
pub async fn run(
    n: u32,
    build: &Build,
    root: &Path,
    out: &Path,
    started: &str,
) -> anyhow::Result<()> {
    let csv = out.join("benchmarks-scale-everything.csv");
    let kept = load_rows(&csv)?;
    let idle_mib = scale::idle_rss(&root.join(&build.name), build).await?;
    eprintln!("idle controller ({}): {idle_mib:.1} MiB", build.name);
    let dir = root.join(format!("everything-{n}"));
    let pairs = tree(n);
    let mut env = Env::start_with(
        &dir,
        pairs.iter().map(|(_, i)| i.clone()).collect(),
        build,
        CHART_SETS,
    )
    .await?;
    env.resync = INSTALL_RESYNC;
    for crds in [
        e2e::schedulers::artifacts()?.join("crds/kueue"),
        e2e::schedulers::volcano_artifacts()?.join("crds"),
        e2e::schedulers::kai_topology_crd()?,
    ] {
        let k = e2e::schedulers::install_crds(&env.client, &crds)
            .await?
            .len();
        eprintln!("  {k} CRDs from {}", crds.display());
    }
    let blocks = capacity_blocks(&pairs);
    env.mock.admin.set_capacity_blocks(&blocks).await?;
    eprintln!("  {} UltraServers (capacity blocks)", blocks.len());
    let bodies = pending_bodies(&pairs)?;
    drop(pairs);
    eprintln!("everything on: creating {n} nodes with the startup taint");
    let made = Instant::now();
    create_nodes(&env.client, bodies, made, None).await?;
    eprintln!("  created in {:.1}s", made.elapsed().as_secs_f64());
    tokio::time::sleep(Duration::from_secs(3)).await;

    env.mock.admin.reset_stats().await?;
    let w0 = writes_by_resource(&env.client).await?;
    let start = Instant::now();
    let flags: Vec<String> = [
        "--kueue-topology=true",
        "--volcano-hypernodes=true",
        "--kai-topology=true",
        "--slinky-annotation=true",
        "--node-condition=true",
        "--ultraserver-health=true",
        "--ultraserver-health-taint=true",
        "--ultraserver-shape=true",
    ]
    .iter()
    .map(|f| f.to_string())
    .chain([
        format!("--slurm-topology-configmap={SLURM_CONFIGMAP}"),
        format!("--startup-taint={TAINT}"),
        // This installation's identity (the Lease's namespace and name), which the chart's
        // admission policy holds every scheduler object to: the chart's namespace, as the
        // controller's Pod would take it.
        format!("--leader-election-namespace={}", e2e::cluster::NAMESPACE),
        format!("--publish-interval={}s", PUBLISH_INTERVAL.as_secs()),
    ])
    .collect();
    let mut labeler = env.labeler_with("controller-everything", &flags)?;
    let deadline = Duration::from_secs(300 + u64::from(n) / 50);
    let labelled_s = loop {
        anyhow::ensure!(
            labeler.alive(),
            "the controller exited:\n{}",
            labeler.log_tail(20)
        );
        anyhow::ensure!(
            start.elapsed() < deadline,
            "not labelled within {deadline:?}"
        );
        if let Ok(m) = labeler.metrics().await
            && metric_sum(&m, "ec2_topology_labeler_nodes", &["state=\"labelled\""]) >= f64::from(n)
        {
            break start.elapsed().as_secs_f64();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("  labelled in {labelled_s:.1}s");
    // Settled: no taint left, and nothing written for two publish intervals.
    let mut last = writes_by_resource(&env.client).await?;
    let mut quiet_since = Instant::now();
    let settled_s = loop {
        anyhow::ensure!(
            start.elapsed() < deadline,
            "not settled within {deadline:?}: {:?}",
            delta(&w0, &last)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = writes_by_resource(&env.client).await?;
        if total(&now, false) != total(&last, false) {
            quiet_since = Instant::now();
            last = now;
            continue;
        }
        if quiet_since.elapsed() >= PUBLISH_INTERVAL * 2 && tainted(&env.client).await? == 0 {
            break (quiet_since - start).as_secs_f64();
        }
    };
    let install = delta(&w0, &last);
    let pid = labeler.pid().unwrap_or(0);
    let (hwm, install_cpu_s) = proc_stats(pid);
    let calls = ec2_calls(&env).await?;
    eprintln!(
        "  settled at {settled_s:.1}s: {calls} EC2 calls, writes {install:?}, peak RSS {:.0} MiB, {install_cpu_s:.1} CPU-s",
        hwm as f64 / 1024.0
    );

    // Steady state.
    env.mock.admin.reset_stats().await?;
    let w1 = writes_by_resource(&env.client).await?;
    let cpu0 = proc_stats(pid).1;
    let steady_rss_start_mib = scale::rss_now(pid);
    tokio::time::sleep(PUBLISH_INTERVAL * STEADY_INTERVALS).await;
    let cpu_per_publish_s = (proc_stats(pid).1 - cpu0) / f64::from(STEADY_INTERVALS);
    let steady_rss_end_mib = scale::rss_now(pid);
    let steady_calls = ec2_calls(&env).await?;
    let steady = delta(&w1, &writes_by_resource(&env.client).await?);
    let (hypernodes, slurm_bytes) = (
        hypernodes(&env.client).await?,
        slurm_bytes(&env.client).await?,
    );
    eprintln!(
        "  steady: {steady_calls} EC2 calls, writes {steady:?}, RSS {steady_rss_start_mib:.0} → {steady_rss_end_mib:.0} MiB, {cpu_per_publish_s:.3} CPU-s per publish interval; {hypernodes} HyperNodes, Slurm ConfigMap {slurm_bytes} bytes"
    );
    labeler.stop();
    let row = EverythingRow {
        date: started.to_string(),
        commit: scale::commit(),
        build: build.name.clone(),
        nodes: n,
        idle_mib,
        labelled_s,
        settled_s,
        calls,
        install_writes: total(&install, false),
        peak_rss_mib: hwm as f64 / 1024.0,
        install_cpu_s,
        steady_rss_start_mib,
        steady_rss_end_mib,
        cpu_per_publish_s,
        steady_calls,
        steady_writes: total(&steady, false),
        steady_events: total(&steady, true),
        hypernodes,
        slurm_bytes,
    };
    let rows = merge(kept, row);
    let mut text = format!("{CSV_HEADER}\n");
    for r in &rows {
        writeln!(text, "{}", r.to_csv())?;
    }
    std::fs::create_dir_all(out)?;
    std::fs::write(&csv, text)?;
    scale::rewrite_report(out, started)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(build: &str, nodes: u32) -> EverythingRow {
        EverythingRow {
            date: "2026-12-04".into(),
            commit: "abc1234".into(),
            build: build.into(),
            nodes,
            idle_mib: 15.5,
            labelled_s: 60.2,
            settled_s: 75.0,
            calls: 201,
            install_writes: 40_010.0,
            peak_rss_mib: 120.0,
            install_cpu_s: 30.5,
            steady_rss_start_mib: 100.0,
            steady_rss_end_mib: 101.0,
            cpu_per_publish_s: 0.125,
            steady_calls: 0,
            steady_writes: 0.0,
            steady_events: 0.0,
            hypernodes: 1300,
            slurm_bytes: 250_000,
        }
    }

    #[test]
    fn a_row_reads_back_from_the_csv_as_written() {
        let r = row("musl", 20_000);
        assert_eq!(EverythingRow::from_csv(&r.to_csv()).expect("a row"), r);
        assert_eq!(r.to_csv().split(',').count(), CSV_HEADER.split(',').count());
        assert!(EverythingRow::from_csv("2026-12-04,abc,musl").is_err());
    }

    #[test]
    fn a_run_replaces_its_size_and_build_only() {
        let kept = vec![
            row("musl", 20_000),
            row("glibc", 20_000),
            row("musl", 10_000),
        ];
        let mut new = row("musl", 20_000);
        new.calls = 7;
        let rows = merge(kept, new);
        let keys: Vec<(u32, &str, u64)> = rows
            .iter()
            .map(|r| (r.nodes, r.build.as_str(), r.calls))
            .collect();
        assert_eq!(
            keys,
            [
                (10_000, "musl", 201),
                (20_000, "glibc", 201),
                (20_000, "musl", 7)
            ]
        );
    }

    #[test]
    fn the_section_has_a_line_per_row_and_none_without_rows() {
        assert!(section(&[]).expect("md").is_empty());
        let md = section(&[row("musl", 20_000)]).expect("md");
        assert!(md.contains("| 20000 | musl | 2026-12-04 abc1234 |"), "{md}");
        assert!(md.contains("| 0.125 | 0, 0, 0 | 1300 |"), "{md}");
    }
}

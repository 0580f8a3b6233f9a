//! `make bench-scale`: the controller at 10,000 to 100,000 nodes on the same real kube-apiserver,
//! etcd and mock-ec2 as `make bench`. Per size: install into the existing cluster (time against
//! the write floor, EC2 calls, writes, peak RSS, CPU, the control plane's memory, the initial
//! list's pages), three resyncs of steady state (EC2 calls, writes, RSS after each), and a
//! restart with every node labelled. Beside it, what one EC2 call per node (EKS's cloud
//! controller) costs against the same token bucket, measured on mock-ec2.
//!
//! Writes `docs/benchmarks-scale.md` (embedded in `docs/benchmarks.md` by `make bench`),
//! `docs/benchmarks-scale.csv` and, through `e2e/bench/chart.sh`, `docs/benchmarks-scale.png`.

use std::{fmt::Write as _, path::Path, time::Duration};

use super::*;

/// The resync period at scale (long enough that three of them are a fair steady state, short
/// enough to run).
const SCALE_RESYNC: Duration = Duration::from_secs(30);

struct ScaleRow {
    nodes: u32,
    shape: Shape,
    install_s: f64,
    floor_s: f64,
    calls: u64,
    throttled: u64,
    unfiltered: usize,
    writes: f64,
    peak_rss_mib: f64,
    cpu_s: f64,
    control_plane_mib: f64,
    lists: f64,
    steady_calls: u64,
    steady_writes: f64,
    steady_rss_mib: Vec<f64>,
    restart_s: f64,
    restart_calls: u64,
    restart_writes: f64,
    restart_rss_mib: f64,
}

/// Current RSS (MiB) of a process.
fn rss_now(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// The controller's RSS with an empty cluster: what every size is measured above.
async fn idle_rss(root: &Path) -> anyhow::Result<f64> {
    let env = Env::start(&root.join("idle"), vec![]).await?;
    let mut labeler = env.labeler("controller-idle")?;
    labeler.wait_ready(Duration::from_secs(60)).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss = proc_stats(labeler.pid().unwrap_or(0)).0 as f64 / 1024.0;
    labeler.stop();
    Ok(rss)
}

async fn one_size(n: u32, shape: Shape, root: &Path) -> anyhow::Result<ScaleRow> {
    let (env, labeler, row, facts) = install(n, root, shape, SCALE_RESYNC).await?;
    let control_plane_mib = control_plane_rss(&env.cp);
    let pid = labeler.pid().unwrap_or(0);

    // Steady state: three resync periods, RSS after each.
    env.mock.admin.reset_stats().await?;
    let w0 = env.node_writes().await?;
    let mut steady_rss_mib = vec![rss_now(pid)];
    for _ in 0..3 {
        tokio::time::sleep(SCALE_RESYNC).await;
        steady_rss_mib.push(rss_now(pid));
    }
    let steady_calls = env.mock.admin.stats().await?.calls;
    let steady_writes = env.node_writes().await? - w0;
    eprintln!(
        "  steady: {steady_calls} EC2 calls, {steady_writes} writes, RSS {steady_rss_mib:.0?} MiB"
    );

    // Restart with every node labelled.
    let mut labeler = labeler;
    labeler.stop();
    env.mock.admin.reset_stats().await?;
    let w0 = env.node_writes().await?;
    let restarted = Instant::now();
    let mut labeler = env.labeler("controller-restarted")?;
    kube_util::eventually(
        "every node re-checked after the restart",
        Duration::from_secs(600),
        || async {
            let Ok(m) = labeler.metrics().await else {
                return Ok(None);
            };
            Ok(
                (metric_sum(&m, "ec2_topology_labeler_nodes", &["state=\"labelled\""]) >= n as f64)
                    .then_some(()),
            )
        },
    )
    .await?;
    let restart_s = restarted.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = env.mock.admin.stats().await?;
    let restart_writes = env.node_writes().await? - w0;
    let restart_rss_mib = proc_stats(labeler.pid().unwrap_or(0)).0 as f64 / 1024.0;
    eprintln!(
        "  restart: {restart_s:.1}s, {} EC2 calls, {restart_writes} writes, peak RSS {restart_rss_mib:.0} MiB",
        stats.calls
    );
    labeler.stop();
    Ok(ScaleRow {
        nodes: n,
        shape,
        install_s: row.seconds,
        floor_s: facts.floor.as_secs_f64(),
        calls: row.ec2_calls,
        throttled: row.throttled,
        unfiltered: facts.unfiltered,
        writes: row.writes,
        peak_rss_mib: row.rss_mib,
        cpu_s: row.cpu_s,
        control_plane_mib,
        lists: facts.lists,
        steady_calls,
        steady_writes,
        steady_rss_mib,
        restart_s,
        restart_calls: stats.calls,
        restart_writes,
        restart_rss_mib,
    })
}

/// One EC2 call per node, as EKS's cloud controller makes them, against mock-ec2's bucket (100
/// burst, 20/s; 50 ms per call): ten workers for `window`, each retrying a throttled call after
/// an exponential, jittered pause (the SDK's standard retry). Returns (calls answered, calls
/// throttled, answered per second after the burst).
async fn one_call_per_node(window: Duration, root: &Path) -> anyhow::Result<(u64, u64, f64)> {
    let pairs = fleet(20_000);
    let env = Env::start(
        &root.join("one-call-per-node"),
        pairs.iter().map(|(_, i)| i.clone()).collect(),
    )
    .await?;
    let ids: Vec<String> = pairs.iter().map(|(s, _)| s.instance_id.clone()).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let answered_at: Mutex<Vec<Duration>> = Mutex::default();
    let throttled = std::sync::atomic::AtomicU64::new(0);
    let start = Instant::now();
    let worker = || async {
        loop {
            let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(id) = ids.get(k) else { return };
            let mut pause = Duration::from_millis(100);
            loop {
                if start.elapsed() > window {
                    return;
                }
                match env.mock.admin.describe_topology(&[id]).await {
                    Ok(s) if s.is_success() => {
                        answered_at
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(start.elapsed());
                        break;
                    }
                    _ => {
                        throttled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let jitter = pause.mul_f64(fastrand::f64());
                        tokio::time::sleep(jitter).await;
                        pause = (pause * 2).min(Duration::from_secs(20));
                    }
                }
            }
        }
    };
    futures::future::join_all((0..10).map(|_| worker())).await;
    let answered = answered_at
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    // The sustained rate: answers after the first ten seconds (the burst is spent by then).
    let tail = Duration::from_secs(10);
    let late = answered.iter().filter(|t| **t > tail).count() as f64;
    let rate = late / (window - tail).as_secs_f64();
    Ok((
        answered.len() as u64,
        throttled.load(std::sync::atomic::Ordering::Relaxed),
        rate,
    ))
}

pub async fn run(
    sizes: &[u32],
    light_from: Option<u32>,
    root: &Path,
    out: &Path,
    started: &str,
) -> anyhow::Result<()> {
    let idle = idle_rss(root).await?;
    eprintln!("idle controller: {idle:.1} MiB");
    let window = Duration::from_secs(40);
    eprintln!(
        "one EC2 call per node: {}s against the bucket",
        window.as_secs()
    );
    let (answered, throttled, rate) = one_call_per_node(window, root).await?;
    eprintln!("  {answered} answered, {throttled} throttled, {rate:.1}/s sustained");
    let mut rows = Vec::new();
    for &n in sizes {
        let shape = if light_from.is_some_and(|l| n >= l) {
            Shape::Light
        } else {
            Shape::Realistic
        };
        match one_size(n, shape, root).await {
            Ok(row) => rows.push(row),
            Err(e) => {
                eprintln!("{n} nodes: stopped: {e:#}");
                write_report(
                    &rows,
                    idle,
                    (answered, throttled, rate, window),
                    out,
                    started,
                    Some((n, format!("{e:#}"))),
                )?;
                return Err(e);
            }
        }
        // Keep what ran even if a larger size fails later.
        write_report(
            &rows,
            idle,
            (answered, throttled, rate, window),
            out,
            started,
            None,
        )?;
    }
    Ok(())
}

fn write_report(
    rows: &[ScaleRow],
    idle: f64,
    (answered, throttled, rate, window): (u64, u64, f64, Duration),
    out: &Path,
    started: &str,
    failed: Option<(u32, String)>,
) -> anyhow::Result<()> {
    let mut md = String::new();
    writeln!(md, "## At scale: 10,000 to 100,000 nodes\n")?;
    writeln!(
        md,
        "Generated by `make bench-scale` on {started} — {}; the same setup as above (the controller's release build, a real kube-apiserver v1.36.3 + etcd, mock-ec2 at 50 ms per call behind a bucket of 100 burst and 20/s). Each size is an install: the nodes exist, unlabelled, when the controller starts cold; the write floor is a plain client applying one label per node by server-side apply, 32 in flight, in the same run under the same observer. Steady state is three resync periods of {} s; restart is a new controller process with every node labelled. RSS is the controller's; per node is (peak − idle) / nodes, idle being the controller with an empty cluster ({idle:.0} MiB). The control plane's memory is etcd + kube-apiserver's peak RSS.\n",
        machine(),
        SCALE_RESYNC.as_secs()
    )?;
    writeln!(
        md,
        "| nodes | node shape | install (s) | write floor (s) | ratio | EC2 calls (throttled; unfiltered) | writes | peak RSS (MiB) | per node (KiB) | CPU (s) | CPU-s / 1,000 nodes | initial list pages | steady: calls, writes | steady RSS after each resync (MiB) | restart: s, calls, writes, peak RSS (MiB) | control plane RSS (MiB) |"
    )?;
    writeln!(
        md,
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | ---: |"
    )?;
    let mut csv = String::from(
        "nodes,shape,install_s,floor_s,ec2_calls,writes,peak_rss_mib,idle_rss_mib,cpu_s,control_plane_mib,restart_calls,one_call_per_node_s\n",
    );
    for r in rows {
        let per_node_kib = (r.peak_rss_mib - idle).max(0.0) * 1024.0 / f64::from(r.nodes);
        writeln!(
            md,
            "| {} | {} | {:.1} | {:.1} | {:.2}× | {} ({}; {}) | {} | {:.0} | {:.2} | {:.1} | {:.2} | {} | {}, {} | {} | {:.1}, {}, {}, {:.0} | {:.0} |",
            r.nodes,
            match r.shape {
                Shape::Realistic => "realistic",
                Shape::Light => "light (no images)",
            },
            r.install_s,
            r.floor_s,
            r.install_s / r.floor_s.max(0.001),
            r.calls,
            r.throttled,
            r.unfiltered,
            r.writes,
            r.peak_rss_mib,
            per_node_kib,
            r.cpu_s,
            r.cpu_s * 1000.0 / f64::from(r.nodes),
            r.lists,
            r.steady_calls,
            r.steady_writes,
            r.steady_rss_mib
                .iter()
                .map(|m| format!("{m:.0}"))
                .collect::<Vec<_>>()
                .join(" → "),
            r.restart_s,
            r.restart_calls,
            r.restart_writes,
            r.restart_rss_mib,
            r.control_plane_mib,
        )?;
        let eks = f64::from(r.nodes) / rate.max(0.001);
        writeln!(
            csv,
            "{},{:?},{:.2},{:.2},{},{},{:.1},{:.1},{:.2},{:.0},{},{:.0}",
            r.nodes,
            r.shape,
            r.install_s,
            r.floor_s,
            r.calls,
            r.writes,
            r.peak_rss_mib,
            idle,
            r.cpu_s,
            r.control_plane_mib,
            r.restart_calls,
            eks
        )?;
    }
    if let Some((n, why)) = failed {
        writeln!(md, "\nAt {n} nodes the run stopped: {why}")?;
    }
    writeln!(
        md,
        "\n**One EC2 call per node**, as EKS's cloud controller makes them, measured on the same mock-ec2 bucket: ten workers calling for {} s, each throttled call retried after an exponential, jittered pause, got {answered} answers ({throttled} throttled calls); after the burst, **{rate:.1} answers per second**. At that rate, against our calls at each size:\n",
        window.as_secs()
    )?;
    writeln!(
        md,
        "| nodes | one call per node: calls, time at the measured rate | ours: calls, install time | calls saved |"
    )?;
    writeln!(md, "| ---: | --- | --- | ---: |")?;
    for r in rows {
        let eks = f64::from(r.nodes) / rate.max(0.001);
        writeln!(
            md,
            "| {} | {}, {:.0} s ({:.1} min) | {}, {:.1} s | {:.0}× |",
            r.nodes,
            r.nodes,
            eks,
            eks / 60.0,
            r.calls,
            r.install_s,
            f64::from(r.nodes) / r.calls.max(1) as f64
        )?;
    }
    writeln!(
        md,
        "\n![controller RSS and EC2 calls against nodes](benchmarks-scale.png)\n"
    )?;
    writeln!(
        md,
        "Reproduce: `make bench-scale` (about 40 minutes; `SCALE_SIZES` picks the sizes)."
    )?;
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("benchmarks-scale.md"), &md)?;
    std::fs::write(out.join("benchmarks-scale.csv"), csv)?;
    let chart = Command::new(e2e::repo_root().join("e2e/bench/chart.sh"))
        .arg("--scale")
        .arg(out.join("benchmarks-scale.csv"))
        .arg(out.join("benchmarks-scale.png"))
        .status()?;
    if !chart.success() {
        eprintln!("scale chart rendering failed; the table and CSV are written");
    }
    println!("{md}");
    Ok(())
}

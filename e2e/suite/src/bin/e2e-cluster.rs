//! `e2e-cluster`: the local control plane for people, not tests.
//!
//! - `e2e-cluster up`: kube-apiserver + etcd + mock-ec2 with the chart's RBAC applied; prints
//!   the kubeconfigs and the EC2 endpoint, runs until Ctrl-C.
//! - `e2e-cluster demo`: the same, plus a sample fleet (two spines, several leaves, a 4-layer
//!   rack, an UltraServer, a Fargate node), the controller running as its ServiceAccount, and
//!   the labelled nodes printed.

use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use clap::{Parser, Subcommand};
use e2e::{
    cluster::{ControlPlane, NAMESPACE},
    fixtures::NodeSpec,
    kube_util,
    labeler::{Labeler, LabelerOptions},
    mock::MockProcess,
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, ResourceExt, api::ListParams};
use mock_ec2::{Instance, Scenario};

#[derive(Parser)]
#[command(
    about = "A local Kubernetes control plane with mock EC2, for trying ec2-topology-labeler"
)]
struct Args {
    /// Working directory (kubeconfigs, logs, etcd data); a fresh temp dir by default.
    #[arg(long, global = true)]
    dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start kube-apiserver, etcd and mock-ec2; run until Ctrl-C.
    Up,
    /// Start everything, label a sample fleet, print it; run until Ctrl-C.
    Demo {
        /// Exit after printing instead of waiting for Ctrl-C.
        #[arg(long)]
        once: bool,
    },
}

/// The demo fleet: (node, network nodes top first, capacity block, placement group).
fn fleet() -> Vec<(NodeSpec, Instance)> {
    let mut out = Vec::new();
    let mut add = |n: u32, ty: &str, nodes: &[&str], cb: Option<&str>, pg: Option<&str>| {
        let spec = NodeSpec::ec2(0xde3, n, ty);
        let mut inst = spec.instance(nodes);
        inst.capacity_block_id = cb.map(Into::into);
        inst.group_name = pg.map(Into::into);
        out.push((spec, inst));
    };
    // Two spines, two aggregation blocks each, leaves under them: p5 training nodes.
    for n in 0..8u32 {
        let spine = if n < 4 {
            "nn-spine-1a2b3c4d"
        } else {
            "nn-spine-5e6f7a8b"
        };
        let agg = format!("nn-agg-{:08x}", 0x1000 + n / 2);
        let leaf = format!("nn-leaf-{:08x}", 0x2000 + n / 2);
        add(
            n,
            "p5.48xlarge",
            &[spine, &agg, &leaf],
            None,
            Some("training-pg"),
        );
    }
    // A 4-layer rack (p6-b200).
    for n in 8..10u32 {
        add(
            n,
            "p6-b200.48xlarge",
            &[
                "nn-spine-5e6f7a8b",
                "nn-agg-0000b200",
                "nn-rack-0000b200",
                "nn-leaf-0000b200",
            ],
            None,
            Some("B200 rack / prod (eu)"),
        );
    }
    // An UltraServer: two GB200 instances sharing one capacity block.
    for n in 10..12u32 {
        add(
            n,
            "p6e-gb200.36xlarge",
            &["nn-spine-1a2b3c4d", "nn-agg-0000gb20", "nn-leaf-0000gb20"],
            Some("cr-0123456789abcdef0"),
            None,
        );
    }
    // A general-purpose node: EC2 does not describe its type.
    add(12, "m7i.2xlarge", &[], None, None);
    out
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    e2e::init_tls();
    let args = Args::parse();
    // The handlers first: a signal that comes before them (while starting, or just after the
    // "running" line) would take its default action and orphan every process started so far.
    let stop = stopped()?;
    tokio::select! {
        r = run(args) => r,
        r = stop => {
            // `run` is dropped here, and with it every process it started (each stops by PID).
            r?;
            println!("stopped");
            Ok(())
        }
    }
}

/// Start everything and, unless `--once`, wait for ever: `main` ends this by dropping it.
async fn run(args: Args) -> anyhow::Result<()> {
    let dir = match args.dir {
        Some(d) => d,
        None => e2e::work_dir("ec2tl-demo")?,
    };
    std::fs::create_dir_all(&dir)?;
    let cp = ControlPlane::start(&dir.join("cluster")).await?;
    let client = cp.admin_client().await?;
    kube_util::ensure_namespace(&client, NAMESPACE).await?;
    let manifests =
        std::fs::read_to_string(e2e::repo_root().join("deploy/ec2-topology-labeler.yaml"))?;
    kube_util::apply_kinds(
        &client,
        &manifests,
        Some(kube_util::RBAC_KINDS),
        "e2e-cluster",
    )
    .await?;

    let fleet = fleet();
    let scenario = Scenario {
        instances: fleet.iter().map(|(_, i)| i.clone()).collect(),
        ..Default::default()
    };
    let mock = MockProcess::start(&dir.join("mock"), &scenario).await?;

    println!("kube-apiserver: {}", cp.server);
    println!("admin kubeconfig:      {}", cp.admin_kubeconfig.display());
    println!(
        "controller kubeconfig: {} (ServiceAccount {NAMESPACE}/ec2-topology-labeler)",
        cp.controller_kubeconfig.display()
    );
    println!(
        "mock EC2 endpoint:     {} (admin API under /_admin)",
        mock.url()
    );

    let mut labeler = None;
    if let Cmd::Demo { .. } = args.command {
        let mut nodes: Vec<Node> = fleet.iter().map(|(s, _)| s.node()).collect();
        nodes.push(
            NodeSpec::ec2(0xde3, 13, "fargate")
                .with_provider_id("aws:///us-west-2a/0123456789abcdef0123456789abcdef/fargate-ip-10-0-13-1.us-west-2.compute.internal")
                .node(),
        );
        kube_util::create_nodes(&client, nodes).await?;
        println!(
            "created {} nodes; starting the controller as its ServiceAccount...",
            fleet.len() + 1
        );
        let mut l = Labeler::start(LabelerOptions {
            kubeconfig: &cp.controller_kubeconfig,
            ec2_url: mock.url(),
            dir: &dir,
            args: vec![],
            log_filter: "info",
            log_name: "controller.log",
            env: vec![],
            bin: None,
        })?;
        l.wait_ready(Duration::from_secs(30)).await?;
        let labelled = fleet
            .iter()
            .filter(|(_, i)| !i.network_nodes.is_empty())
            .count();
        kube_util::eventually(
            "the demo fleet to be labelled",
            Duration::from_secs(30),
            || async {
                let api: Api<Node> = Api::all(client.clone());
                let n = api
                    .list(&ListParams::default())
                    .await?
                    .items
                    .iter()
                    .filter(|n| {
                        n.labels()
                            .contains_key("topology.k8s.aws/network-node-layer-1")
                    })
                    .count();
                Ok((n >= labelled).then_some(()))
            },
        )
        .await?;
        print_nodes(&client).await?;
        println!("The topology as the labels describe it (`ec2-topology-labeler tree`):\n");
        let tree = std::process::Command::new(e2e::bin_dir().join("ec2-topology-labeler"))
            .arg("tree")
            .env("KUBECONFIG", &cp.admin_kubeconfig)
            .env("RUST_LOG", "warn")
            .output()?;
        print!("{}", String::from_utf8_lossy(&tree.stdout));
        // The same as pictures (`tree -o dot`, `tree -o mermaid`), and an SVG where Graphviz is.
        for (format, file) in [("dot", "topology.dot"), ("mermaid", "topology.mmd")] {
            let out = std::process::Command::new(e2e::bin_dir().join("ec2-topology-labeler"))
                .args(["tree", "-o", format])
                .env("KUBECONFIG", &cp.admin_kubeconfig)
                .env("RUST_LOG", "warn")
                .output()?;
            std::fs::write(dir.join(file), &out.stdout)?;
        }
        let svg = std::process::Command::new("dot")
            .arg("-Tsvg")
            .arg(dir.join("topology.dot"))
            .arg("-o")
            .arg(dir.join("topology.svg"))
            .status()
            .is_ok_and(|s| s.success());
        println!(
            "\nas a picture: {} (`tree -o mermaid`), {}{}",
            dir.join("topology.mmd").display(),
            dir.join("topology.dot").display(),
            if svg {
                format!(" and {}", dir.join("topology.svg").display())
            } else {
                " (`dot -Tsvg` draws it)".to_string()
            }
        );
        println!("\ncontroller log: {}", l.log.display());
        println!("plan (what the controller would still change; nothing, now):");
        println!(
            "  KUBECONFIG={} AWS_ENDPOINT_URL_EC2={} AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x {}/ec2-topology-labeler plan",
            cp.admin_kubeconfig.display(),
            mock.url(),
            e2e::bin_dir().display()
        );
        labeler = Some(l);
    }
    if matches!(args.command, Cmd::Demo { once: true }) {
        return Ok(());
    }
    println!(
        "\nrunning; press Ctrl-C to stop everything (processes are stopped by PID, {} is kept)",
        dir.display()
    );
    // Held until `main` drops this future on a signal; then the labeler, mock-ec2 and the
    // control plane stop in that order (a tuple drops its fields first to last).
    let _running = (labeler, mock, cp);
    std::future::pending::<()>().await;
    Ok(())
}

/// Resolves on Ctrl-C, SIGTERM (`timeout`, a process manager, `kill`) or SIGHUP (the terminal
/// closed). The handlers are installed when this is called, not when it is first polled, so the
/// default action of the last two (ending this process alone, orphaning what it started) never
/// applies once `main` has begun.
fn stopped() -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        }
        Ok(())
    })
}

/// Like `kubectl get nodes -L <layers> -L zone-id -L capacity-block`.
async fn print_nodes(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let mut nodes = api.list(&ListParams::default()).await?.items;
    nodes.sort_by_key(|n| n.name_any());
    let cols = [
        ("LAYER-1", "topology.k8s.aws/network-node-layer-1"),
        ("LAYER-2", "topology.k8s.aws/network-node-layer-2"),
        ("LAYER-3", "topology.k8s.aws/network-node-layer-3"),
        ("LAYER-4", "topology.k8s.aws/network-node-layer-4"),
        ("ZONE-ID", "topology.k8s.aws/zone-id"),
        (
            "CAPACITY-BLOCK",
            "ec2-topology-labeler.io/capacity-block-id",
        ),
        ("PLACEMENT-GROUP", "ec2-topology-labeler.io/placement-group"),
    ];
    let mut rows: Vec<Vec<String>> = vec![
        std::iter::once("NODE".to_string())
            .chain(std::iter::once("TYPE".to_string()))
            .chain(cols.iter().map(|(h, _)| h.to_string()))
            .collect(),
    ];
    for n in &nodes {
        let labels: &BTreeMap<String, String> = n.labels();
        let mut row = vec![
            n.name_any(),
            labels
                .get("node.kubernetes.io/instance-type")
                .cloned()
                .unwrap_or_default(),
        ];
        row.extend(
            cols.iter()
                .map(|(_, k)| labels.get(*k).cloned().unwrap_or_else(|| "-".into())),
        );
        rows.push(row);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    println!();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    println!();
    Ok(())
}

//! The shared e2e environment: a cluster (local control plane, or any cluster by kubeconfig),
//! the chart installed with Helm, the schedulers' CRDs, mock-ec2, and the controller running as
//! its ServiceAccount — plus the runner both the e2e and the fault suites use.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use kube::Client;
use libtest_mimic::{Arguments, Failed, Trial};
use mock_ec2::{Instance, Scenario};
use tokio::sync::Mutex;

use crate::{
    cluster::{Cluster, NAMESPACE},
    fixtures::NodeSpec,
    helm,
    kube_util::{self, eventually, wait_for_topology},
    labeler::{Labeler, LabelerOptions, metric_sum},
    mock::{MockAdmin, MockProcess},
};

pub const WAIT: Duration = Duration::from_secs(30);
pub const RESYNC: Duration = Duration::from_secs(5);
pub const LEASE: Duration = Duration::from_secs(6);
pub const L: &str = "topology.k8s.aws/network-node-layer-";

/// Fields drop in order: the controller stops first, then mock-ec2, then the control plane.
pub struct Env {
    pub labeler: Mutex<Option<Labeler>>,
    /// Local runs only: the mock process the harness owns.
    pub mock: Mutex<Option<MockProcess>>,
    pub mock_admin: MockAdmin,
    pub ec2_url: String,
    pub cluster: Cluster,
    pub dir: PathBuf,
    pub rt: tokio::runtime::Runtime,
}

impl Env {
    pub fn local(&self) -> bool {
        self.cluster.local.is_some()
    }

    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    pub async fn admin(&self) -> anyhow::Result<Client> {
        self.cluster.admin().await
    }

    pub fn labeler_log(&self) -> String {
        self.labeler
            .try_lock()
            .map(|l| l.as_ref().map(|l| l.log_tail(30)).unwrap_or_default())
            .unwrap_or_default()
    }
}

pub fn expected(nodes: &[&str], extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut m: BTreeMap<String, String> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (format!("{L}{}", i + 1), n.to_string()))
        .collect();
    m.insert("topology.k8s.aws/zone-id".into(), "usw2-az1".into());
    for (k, v) in extra {
        m.insert(k.to_string(), v.to_string());
    }
    m
}

/// The labels `instance` gives its node (its network nodes and the zone ID).
pub fn expected_of(instance: &Instance) -> BTreeMap<String, String> {
    let nodes: Vec<&str> = instance.network_nodes.iter().map(String::as_str).collect();
    expected(&nodes, &[])
}

/// Create nodes for `specs` with instances in the mock, and wait for `want` on each.
pub async fn label_and_wait(
    env: &Env,
    client: &Client,
    pairs: &[(NodeSpec, Instance)],
) -> anyhow::Result<()> {
    env.mock_admin
        .upsert_all(&pairs.iter().map(|(_, i)| i.clone()).collect::<Vec<_>>())
        .await?;
    kube_util::create_nodes(client, pairs.iter().map(|(s, _)| s.node()).collect()).await?;
    for (spec, inst) in pairs {
        let want = expected_of(inst);
        let mut want = want;
        if let Some(cb) = &inst.capacity_block_id {
            want.insert(
                "ec2-topology-labeler.io/capacity-block-id".into(),
                cb.clone(),
            );
        }
        wait_for_topology(client, &spec.name, &want, WAIT).await?;
    }
    Ok(())
}

pub type ScenarioFn = for<'a> fn(
    &'a Env,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = anyhow::Result<()>> + 'a>,
>;

#[macro_export]
macro_rules! scenario {
    ($f:ident, $local_only:expr) => {
        (
            stringify!($f),
            (|env| Box::pin($f(env))) as $crate::env::ScenarioFn,
            $local_only,
        )
    };
}

/// The controller as the e2e runs it: its ServiceAccount identity, leader election on, short
/// periods so scenarios take seconds.
pub fn start_labeler(
    kubeconfig: &Path,
    ec2_url: &str,
    dir: &Path,
    name: &str,
) -> anyhow::Result<Labeler> {
    start_labeler_with(kubeconfig, ec2_url, dir, name, &[])
}

/// [`start_labeler`] with `extra` flags, which replace the usual value of the same flag.
pub fn start_labeler_with(
    kubeconfig: &Path,
    ec2_url: &str,
    dir: &Path,
    name: &str,
    extra: &[&str],
) -> anyhow::Result<Labeler> {
    start_labeler_with_env(kubeconfig, ec2_url, dir, name, extra, &[])
}

/// [`start_labeler_with`] with extra environment (credentials as EKS gives them, say).
pub fn start_labeler_with_env(
    kubeconfig: &Path,
    ec2_url: &str,
    dir: &Path,
    name: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<Labeler> {
    let mut args: Vec<String> = vec![
        format!("--resync-period={}s", RESYNC.as_secs()),
        // A test machine may stall for a few hundred ms (CI shares two cores between the API
        // server, etcd, the controller and the test); a wider quiet window keeps a burst of
        // node creations in full calls there. The default (200 ms) is unit-tested.
        "--batch-window=500ms".into(),
        "--batch-max-wait=3s".into(),
        "--not-described-retry=2s".into(),
        "--not-described-ttl=10s".into(),
        "--ec2-rate=50".into(),
        "--ec2-burst=100".into(),
        "--ec2-throttle-backoff-max=2s".into(),
        "--leader-election=true".into(),
        format!("--leader-election-namespace={NAMESPACE}"),
        format!("--leader-election-lease-duration={}s", LEASE.as_secs()),
        "--leader-election-renew-grace=2s".into(),
        "--kueue-topology=true".into(),
        "--kueue-topology-four-layer=true".into(),
        "--volcano-hypernodes=true".into(),
        "--publish-interval=1s".into(),
        "--conflict-backoff=10s".into(),
    ];
    // An extra flag replaces the usual value of the same flag.
    let name_of = |a: &str| a.split('=').next().unwrap_or(a).to_string();
    args.retain(|a| !extra.iter().any(|e| name_of(e) == name_of(a)));
    args.extend(extra.iter().map(|a| a.to_string()));
    Labeler::start(LabelerOptions {
        kubeconfig,
        ec2_url,
        dir,
        args,
        log_filter: &std::env::var("E2E_CONTROLLER_LOG")
            .unwrap_or_else(|_| "info,ec2_topology_labeler=debug".into()),
        log_name: &format!("{name}.log"),
        env: std::iter::once(("POD_NAME".to_string(), name.to_string()))
            .chain(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .collect(),
        bin: None,
    })
}

/// Replace the running controller (local only) with one started with `extra` flags (none: the
/// usual one), ready and leading.
pub async fn restart_labeler_with(env: &Env, extra: &[&str]) -> anyhow::Result<()> {
    restart_labeler_with_env(env, extra, &[]).await
}

/// [`restart_labeler_with`] with extra environment (`POD_NAMESPACE`, say, for Events about the
/// controller's own Pod).
pub async fn restart_labeler_with_env(
    env: &Env,
    extra: &[&str],
    vars: &[(&str, &str)],
) -> anyhow::Result<()> {
    let kc = env
        .cluster
        .controller_kubeconfig
        .clone()
        .context("a local control plane")?;
    let mut guard = env.labeler.lock().await;
    if let Some(mut old) = guard.take() {
        old.stop();
    }
    let mut l = start_labeler_with_env(&kc, &env.ec2_url, &env.dir, "controller-1", extra, vars)?;
    l.wait_ready(Duration::from_secs(30)).await?;
    wait_leader(&l, true).await?;
    *guard = Some(l);
    Ok(())
}

/// The binary as an operator runs it from a workstation: the environment's cluster
/// (kubeconfig) and EC2 (endpoint, credentials).
pub fn operator_cli(env: &Env) -> std::process::Command {
    let mut cmd = std::process::Command::new(crate::bin_dir().join("ec2-topology-labeler"));
    cmd.env("KUBECONFIG", &env.cluster.admin_kubeconfig)
        .env("AWS_ENDPOINT_URL_EC2", &env.ec2_url)
        .env("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
        .env("AWS_SECRET_ACCESS_KEY", "e2e-not-a-secret")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("RUST_LOG", "warn");
    cmd
}

/// `plan -o json` against the environment's cluster and EC2, as an operator runs it.
pub fn plan_json(env: &Env, extra: &[&str]) -> anyhow::Result<serde_json::Value> {
    let out = operator_cli(env)
        .arg("plan")
        .args(["-o", "json"])
        .args(extra)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "plan failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Wait until the controller's own `leader` gauge says `leader`.
pub async fn wait_leader(l: &Labeler, leader: bool) -> anyhow::Result<()> {
    let want = if leader { 1.0 } else { 0.0 };
    eventually(&format!("leader gauge {want}"), LEASE * 3, || async {
        let m = l.metrics().await?;
        Ok((metric_sum(&m, "ec2_topology_labeler_leader", &[]) == want).then_some(()))
    })
    .await
}

/// The chart's values as the suite installs it (every publisher, the condition, the startup
/// taint; scenarios turn the Slinky annotation on, which the admission policy allows only when
/// the chart's configuration does): `--set` each.
pub const INSTALL_SETS: &[&str] = &[
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

pub fn setup(prefix: &str) -> anyhow::Result<Env> {
    crate::init_tls();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = crate::work_dir(prefix)?;
    let (cluster, mock, mock_admin, ec2_url, labeler) = rt.block_on(async {
        let cluster = Cluster::from_env(&dir.join("cluster")).await?;
        crate::fixtures::taint_test_nodes(cluster.local.is_none());
        let c = cluster.admin().await?;
        kube_util::ensure_namespace(&c, NAMESPACE).await?;
        if cluster.local.is_some() {
            // The Slurm ConfigMap's namespace: the chart puts a Role there.
            kube_util::ensure_namespace(&c, "slurm").await?;
            // The chart itself, installed with Helm: the controller runs under its RBAC. (No
            // kubelet runs here, so its Deployment's Pods stay Pending; the controller runs as a
            // process with the ServiceAccount's identity instead.)
            let chart = helm::chart();
            let chart = chart.to_str().unwrap_or_default();
            helm::helm(None, &["lint", chart])?;
            helm::helm(
                Some(&cluster.admin_kubeconfig),
                &[
                    "install",
                    "ec2-topology-labeler",
                    chart,
                    "--namespace",
                    NAMESPACE,
                ]
                .into_iter()
                .chain(INSTALL_SETS.iter().flat_map(|s| ["--set", s]))
                .collect::<Vec<_>>(),
            )?;
            eprintln!("helm install of the chart succeeded");
            // The schedulers' CRDs, from the pinned Kueue and Volcano modules, and KAI's (its
            // Topology CRD apart) with its build from the pinned commit (with the PyTorchJob CRD
            // of the training operator it pins).
            let artifacts = crate::schedulers::artifacts()?;
            let volcano = crate::schedulers::volcano_artifacts()?;
            let kai = crate::schedulers::kai_artifacts()?;
            for dir in [
                artifacts.join("crds/kueue"),
                volcano.join("crds"),
                kai.join("topology"),
                kai.join("crds"),
                crate::schedulers::karpenter_crds()?,
            ] {
                let n = crate::schedulers::install_crds(&c, &dir).await?.len();
                eprintln!("installed {n} CRDs from {}", dir.display());
            }
        }
        let (mock, mock_admin, ec2_url) = match std::env::var("E2E_MOCK_EC2_URL") {
            Ok(url) => (None, MockAdmin::new(&url), url),
            Err(_) => {
                let m = MockProcess::start(&dir.join("mock"), &Scenario::default()).await?;
                let (admin, url) = (m.admin.clone(), m.url().to_string());
                (Some(m), admin, url)
            }
        };
        let labeler = match &cluster.controller_kubeconfig {
            Some(kc) => {
                let mut l = start_labeler(kc, &ec2_url, &dir, "controller-1")?;
                l.wait_ready(Duration::from_secs(30)).await?;
                wait_leader(&l, true).await?;
                Some(l)
            }
            None => None,
        };
        anyhow::Ok((cluster, mock, mock_admin, ec2_url, labeler))
    })?;
    Ok(Env {
        rt,
        dir,
        cluster,
        mock_admin,
        ec2_url,
        mock: Mutex::new(mock),
        labeler: Mutex::new(labeler),
    })
}

/// Run `scenarios` one at a time, in order, on one environment; exits the process.
pub fn run(prefix: &str, scenarios: fn() -> Vec<(&'static str, ScenarioFn, bool)>) -> ! {
    run_trials(prefix, scenarios).exit()
}

/// Run `scenarios` one at a time, in order, on one environment, and stop it.
pub fn run_trials(
    prefix: &str,
    scenarios: fn() -> Vec<(&'static str, ScenarioFn, bool)>,
) -> libtest_mimic::Conclusion {
    run_list(prefix, scenarios())
}

/// A scenario as the runner takes it: its name, its function, whether it needs the local
/// environment (it stops or restarts processes).
pub type ScenarioEntry = (&'static str, ScenarioFn, bool);

/// Run `scenarios` in lanes, side by side, and exit: the list is cut before each scenario
/// `starts` names, and each part runs one at a time, in order, on an environment of its own (its
/// own control plane, mock-ec2 and controller), the first in this process and the others in
/// child processes of this test binary (`E2E_LANE=k`), whose output is shown when they end. The
/// scenarios mostly wait on the controller and the schedulers (one lane keeps a third of a core
/// busy), so the lanes take the time of the longest, not of all. Only where the harness starts
/// the environment itself: against a cluster given by `E2E_KUBECONFIG` (one cluster, one
/// mock-ec2), or with `E2E_LANES=1`, everything runs in one lane. Filters (`cargo test --test e2e
/// -- NAME`) apply to every lane; a lane with nothing selected is not started.
pub fn run_in_lanes(prefix: &str, scenarios: fn() -> Vec<ScenarioEntry>, starts: &[&str]) -> ! {
    let all = scenarios();
    for start in starts {
        if !all.iter().any(|(n, _, _)| n == start) {
            eprintln!("lane start {start} is no scenario");
            std::process::exit(1);
        }
    }
    let mut lanes: Vec<Vec<ScenarioEntry>> = vec![Vec::new()];
    for s in all {
        if starts.contains(&s.0) && lanes.last().is_some_and(|l| !l.is_empty()) {
            lanes.push(Vec::new());
        }
        if let Some(lane) = lanes.last_mut() {
            lane.push(s);
        }
    }
    if let Some(k) = std::env::var("E2E_LANE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        let lane = lanes.get(k).cloned().unwrap_or_default();
        run_list(prefix, lane).exit()
    }
    let args = Arguments::from_args();
    let one_lane = args.list
        || std::env::var_os("E2E_KUBECONFIG").is_some()
        || std::env::var_os("E2E_LANES").is_some_and(|v| v == "1");
    if one_lane {
        run_list(prefix, lanes.into_iter().flatten().collect()).exit()
    }
    let selected = |lane: &[ScenarioEntry]| {
        lane.iter()
            .any(|(n, _, _)| !args.is_filtered_out(&Trial::test(*n, || Ok(()))))
    };
    let n = lanes.len();
    let mut children = Vec::new();
    for (k, lane) in lanes.iter().enumerate().skip(1) {
        if !selected(lane) {
            continue;
        }
        let log =
            std::env::temp_dir().join(format!("{prefix}-lane{}-{}.log", k + 1, std::process::id()));
        let spawned = std::fs::File::create(&log).and_then(|out| {
            let err = out.try_clone()?;
            std::process::Command::new(std::env::current_exe()?)
                .args(std::env::args_os().skip(1))
                .env("E2E_LANE", k.to_string())
                .stdin(std::process::Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
        });
        match spawned {
            Ok(child) => {
                eprintln!(
                    "lane {} of {n} ({} scenarios, {} … {}) started beside this one, log: {}",
                    k + 1,
                    lane.len(),
                    lane.first().map(|s| s.0).unwrap_or_default(),
                    lane.last().map(|s| s.0).unwrap_or_default(),
                    log.display()
                );
                children.push((k, child, log));
            }
            Err(e) => {
                eprintln!("could not start lane {}: {e}", k + 1);
                std::process::exit(1);
            }
        }
    }
    let mut failed = false;
    if selected(&lanes[0]) {
        eprintln!("lane 1 of {n} ({} scenarios) runs here", lanes[0].len());
        failed |= run_list(prefix, lanes[0].clone()).has_failed();
    }
    for (k, mut child, log) in children {
        let status = child.wait();
        let ok = status.as_ref().is_ok_and(|s| s.success());
        eprintln!(
            "\n---- lane {} of {n}: {} ({}) ----",
            k + 1,
            if ok { "passed" } else { "FAILED" },
            log.display()
        );
        match std::fs::read_to_string(&log) {
            Ok(text) => eprint!("{text}"),
            Err(e) => eprintln!("its log cannot be read: {e}"),
        }
        if ok {
            let _ = std::fs::remove_file(&log);
        }
        failed |= !ok;
    }
    std::process::exit(if failed { 101 } else { 0 })
}

/// Run `scenarios` one at a time, in order, on one environment, and stop it.
fn run_list(prefix: &str, scenarios: Vec<ScenarioEntry>) -> libtest_mimic::Conclusion {
    let mut args = Arguments::from_args();
    args.test_threads = Some(1);
    let names: Vec<(&str, bool)> = scenarios.iter().map(|(n, _, l)| (*n, *l)).collect();
    if args.list {
        let trials = names
            .iter()
            .map(|(n, _)| Trial::test(*n, || Ok(())))
            .collect();
        return libtest_mimic::run(&args, trials);
    }
    let env = match setup(prefix) {
        Ok(env) => Arc::new(env),
        Err(e) => {
            eprintln!("e2e setup failed: {e:#}");
            std::process::exit(1);
        }
    };
    eprintln!("e2e working directory: {}", env.dir.display());
    let trials: Vec<Trial> = scenarios
        .into_iter()
        .map(|(name, f, local_only)| {
            let ignored = local_only && !env.local();
            let env = env.clone();
            Trial::test(name, move || {
                let started = Instant::now();
                let result = env.block_on(f(&env));
                eprintln!("    {name}: {:.1}s", started.elapsed().as_secs_f64());
                result.map_err(|e| {
                    Failed::from(format!(
                        "{e:#}\ncontroller log tail:\n{}",
                        env.labeler_log()
                    ))
                })
            })
            .with_ignored_flag(ignored)
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    // Stop the controller, mock-ec2, kube-apiserver and etcd (by PID) before exiting.
    let dir = env.dir.clone();
    match Arc::try_unwrap(env) {
        Ok(env) => drop(env),
        Err(_) => eprintln!("environment still shared at exit; processes stop on exit"),
    }
    crate::remove_work_dir(&dir, !conclusion.has_failed());
    conclusion
}

/// A node whose instance is in placement group `raw`: once labelled, its placement-group label
/// and annotation.
pub async fn placement_group_of(
    env: &Env,
    client: &Client,
    spec: &NodeSpec,
    mut instance: Instance,
    raw: &str,
) -> anyhow::Result<(String, String)> {
    const KEY: &str = "ec2-topology-labeler.io/placement-group";
    instance.group_name = Some(raw.to_string());
    env.mock_admin.upsert(&instance).await?;
    kube_util::create_nodes(client, vec![spec.node()]).await?;
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    eventually("placement group label and annotation", WAIT, || async {
        let n = api.get(&spec.name).await?;
        let label = n.metadata.labels.as_ref().and_then(|l| l.get(KEY).cloned());
        let annotation = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(KEY).cloned());
        Ok(label.zip(annotation))
    })
    .await
}

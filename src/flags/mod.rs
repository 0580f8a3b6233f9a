//! Command line and configuration. Every flag also reads an environment variable (`LABELER_…`,
//! or the AWS SDK's own `AWS_REGION`); `--help` is the reference.
//!
//! Owns: the command line's shape. Reads nothing at run time but, for `explain` run inside the
//! controller's container, PID 1's command line ([`controller_flags`]).

//!
//! Each module owns its settings (`LabelArgs` in [`crate::flags::scheme`], `Ec2Args` and `LookupArgs` in
//! [`crate::lookup`], `ControllerArgs` in [`crate::reconcile`], `GateArgs` in
//! [`crate::reconcile::gate`], `PublishArgs` in
//! [`crate::publish`], `ServeArgs` in [`crate::admin::http`], `LeaderArgs` in [`crate::leader`]); this
//! module only composes them into the commands.

pub(crate) mod scheme;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub(crate) use crate::admin::http::ServeArgs;
pub use crate::duration::HumanDuration;
pub use crate::flags::scheme::LabelArgs;
pub(crate) use crate::leader::LeaderArgs;
pub use crate::lookup::{LookupArgs, ec2::Ec2Args};
pub use crate::publish::PublishArgs;
pub use crate::reconcile::gate::StartupTaint;
pub use crate::reconcile::{ControllerArgs, gate::GateArgs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Parser)]
#[command(
    name = "ec2-topology-labeler",
    version,
    about = "Keeps Kubernetes node labels in step with EC2 network topology (DescribeInstanceTopology)",
    long_about = None
)]
pub struct Cli {
    /// Log format; the level comes from RUST_LOG (default: info).
    #[arg(
        long,
        env = "LABELER_LOG_FORMAT",
        value_enum,
        default_value_t,
        global = true
    )]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The command line, parsed and checked: a value clap cannot check alone (one that depends
    /// on another flag) is refused here, with clap's usage error and exit status, before
    /// anything starts.
    pub fn parse_checked() -> Self {
        let cli = Self::parse();
        if let Err(message) = cli.check() {
            <Self as clap::CommandFactory>::command()
                .error(clap::error::ErrorKind::ArgumentConflict, message)
                .exit()
        }
        cli
    }

    /// The checks across flags, made before anything starts (the chart makes the same ones
    /// when it renders: `templates/_checks.tpl`, a test holds the two to the same answers).
    pub fn check(&self) -> std::result::Result<(), String> {
        if let Command::Run(args) = &self.command {
            args.check()?;
        }
        Ok(())
    }
}

// Parsed once at start-up: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller: watch Nodes and keep their topology labels right.
    Run(RunArgs),
    /// Read the cluster and EC2, write nothing, and print per node the labels that would be
    /// added, changed and removed.
    Plan(PlanArgs),
    /// Print the cluster's network topology as its labels describe it: layer → … → nodes, with
    /// counts, readiness, and nodes missing labels.
    Tree(TreeArgs),
    /// Say why a node has, or lacks, its topology labels: its providerID, the controller's view
    /// (state, last error, next look, EC2 cache), EC2's answer now, the labels, taint and
    /// condition it would get. Run it in the controller's Pod (`kubectl exec`) to read the same
    /// configuration and reach the controller.
    Explain(ExplainArgs),
    /// Remove what the controller wrote to the cluster (our conditions and interconnect taint on
    /// Nodes, HyperNodes, Kueue and KAI Topologies, Slurm ConfigMaps, the Lease) except the
    /// topology labels, unless `--labels`.
    /// Run once the controller is gone (the chart's post-delete hook does).
    Uninstall(UninstallArgs),
    /// Say where a gang of pods fits now: the domains at one topology level (the values of one
    /// node label) whose nodes have room for every pod, from their allocatable resources and
    /// the requests of the pods bound to them, tightest first; and the nearest misses, with
    /// what runs out. Reads Nodes and Pods, writes nothing; exit status 1 when none fits.
    Fit(FitArgs),
    /// Remove what a scheduler feature now turned off published (this installation's HyperNodes,
    /// Kueue Topologies no ResourceFlavor names; KAI Topologies are reported), under rights the
    /// running controller does not hold. The chart's post-upgrade hook runs it.
    Retire(RetireArgs),
}

impl RunArgs {
    /// What `run` refuses beyond each flag's own range: the leader election's timings (see
    /// [`crate::leader::Timings::from_args`]), the label keys as a whole (valid, none used
    /// twice, uniform depth only with top-first numbering) and the Slurm ConfigMap's name.
    pub fn check(&self) -> std::result::Result<(), String> {
        crate::leader::Timings::from_args(&self.leader).map_err(|e| e.to_string())?;
        let scheme = self.labels.scheme()?;
        if self.publish.ultraserver_level == crate::publish::topology::UltraServerLevel::Always
            && scheme.capacity_block_key.is_none()
        {
            return Err(
                "--ultraserver-level=always needs the capacity block label (--capacity-block-label=true): the UltraServer level is that label".into(),
            );
        }
        if self.publish.nvlink_clique_level
            && (self.publish.ultraserver_level == crate::publish::topology::UltraServerLevel::Never
                || scheme.capacity_block_key.is_none())
        {
            return Err(
                "--nvlink-clique-level=true puts the NVLink clique under the UltraServer level: it needs --ultraserver-level auto or always and the capacity block label".into(),
            );
        }
        if let Some(at) = &self.publish.slurm.slurm_topology_configmap {
            crate::publish::slurm::parse_target(at)?;
        }
        self.health.check()?;
        if self.health.ultraserver_health && scheme.capacity_block_key.is_none() {
            return Err(
                "--ultraserver-health needs the capacity block label (--capacity-block-label=true): its members are the nodes carrying it".into(),
            );
        }
        if self.shape.ultraserver_shape && scheme.capacity_block_key.is_none() {
            return Err(
                "--ultraserver-shape needs the capacity block label (--capacity-block-label=true): its members are the nodes carrying it".into(),
            );
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Args)]
pub struct RetireArgs {
    /// Print what would be removed; remove nothing.
    #[arg(long, env = "LABELER_RETIRE_DRY_RUN", action = clap::ArgAction::SetTrue)]
    pub dry_run: bool,
    /// What is published now (the same flags as `run`): a feature turned off has its objects
    /// retired; one turned on is left to the controller.
    #[command(flatten)]
    pub publish: crate::publish::PublishArgs,
    /// Wait for this Deployment (`NAMESPACE/NAME`) to finish rolling out first: until then a
    /// replica of the earlier configuration may lead and publish again what is retired.
    #[arg(long, env = "LABELER_RETIRE_WAIT_FOR_ROLLOUT")]
    pub wait_for_rollout: Option<String>,
    /// How long to wait for that rollout before giving up (removing nothing).
    #[arg(long, value_parser = crate::bounds::duration_flag("rollout-timeout"), env = "LABELER_RETIRE_ROLLOUT_TIMEOUT", default_value = "5m")]
    pub(crate) rollout_timeout: HumanDuration,
    /// This installation (its Lease): only what is annotated as its own is retired.
    #[command(flatten)]
    pub leader: LeaderArgs,
    #[command(flatten)]
    pub output: Output,
}

#[derive(Debug, Clone, Args)]
pub struct UninstallArgs {
    /// Print what would be removed; remove nothing.
    #[arg(long, env = "LABELER_UNINSTALL_DRY_RUN", action = clap::ArgAction::SetTrue)]
    pub dry_run: bool,
    /// Also remove the topology labels and annotations that only we own (keys another manager
    /// co-owns, as EKS's cloud controller does the layer keys, stay).
    #[arg(long, env = "LABELER_UNINSTALL_LABELS", action = clap::ArgAction::SetTrue)]
    pub labels: bool,
    /// Remove a Kueue Topology even when a ResourceFlavor names it, and run even while a
    /// controller holds the Lease.
    #[arg(long, env = "LABELER_UNINSTALL_FORCE", action = clap::ArgAction::SetTrue)]
    pub force: bool,
    /// What each scheduler's plug-in is told (its own flags).
    #[command(flatten)]
    pub plugins: crate::publish::UninstallFlags,
    /// Nodes still carrying the startup taint (as given to `run`) are pointed out.
    #[command(flatten)]
    pub taint: crate::reconcile::gate::StartupTaintFlag,
    /// Wait up to this long for a controller's Lease to lapse before refusing (the chart's
    /// post-delete hook waits for the deleted pods' last renewal to expire).
    #[arg(long, value_parser = crate::bounds::duration_flag("wait-for-lease"), env = "LABELER_UNINSTALL_WAIT_FOR_LEASE", default_value = "0s")]
    pub wait_for_lease: HumanDuration,
    /// Where the Lease is.
    #[command(flatten)]
    pub leader: LeaderArgs,
    #[command(flatten)]
    pub output: Output,
}

/// For the commands an operator runs in the controller's container with `kubectl exec`
/// (`explain`, `plan`, `tree`): there they take the running controller's own flags, read from
/// its command line (PID 1), so that they see what it sees.
#[derive(Debug, Clone, Args)]
pub struct OwnFlags {
    /// Use this command's own flags even inside the controller's container (by default, run
    /// there with `kubectl exec`, it reads the running controller's flags from its command line).
    #[arg(long, env = "LABELER_OWN_FLAGS", action = clap::ArgAction::SetTrue)]
    pub(crate) own_flags: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// The node's name.
    pub node: String,
    #[command(flatten)]
    pub decide: DecideArgs,
    /// Where to find the Lease, to name the leader.
    #[command(flatten)]
    pub leader: LeaderArgs,
    /// Where the controller serves its view of the nodes (`run`'s `--debug-addr`; in the
    /// controller's Pod its own value is used).
    #[arg(long, env = "LABELER_DEBUG_ADDR", default_value = "127.0.0.1:8081")]
    pub debug_addr: std::net::SocketAddr,
    #[command(flatten)]
    pub own: OwnFlags,
    /// Do not ask EC2: show only the node and the controller's view.
    #[arg(long, env = "LABELER_EXPLAIN_NO_EC2", action = clap::ArgAction::SetTrue)]
    pub(crate) no_ec2: bool,
    #[command(flatten)]
    pub output: Output,
}

#[derive(Debug, Clone, Args)]
pub struct FitArgs {
    /// A Kueue Workload (`NAMESPACE/NAME`, usually a pending one) instead of `--pods`,
    /// `--requests` and `--level`: each of its pod sets with a topology request, on each
    /// topology-aware flavor of its ClusterQueue (the flavor's node labels and tolerations
    /// added to the pod template's).
    #[arg(long, value_parser = parse_workload, env = "LABELER_FIT_WORKLOAD", conflicts_with_all = ["pods", "requests", "level", "node_selector", "tolerations"])]
    pub workload: Option<(String, String)>,
    /// Pods in the gang.
    #[arg(long, value_parser = crate::bounds::count_flag::<u64>("pods"), env = "LABELER_FIT_PODS", required_unless_present = "workload")]
    pub pods: Option<u64>,
    /// What each pod requests, `RESOURCE=QUANTITY` separated by commas
    /// (`nvidia.com/gpu=8,cpu=90,memory=1000Gi`). Every pod also takes a pod slot.
    #[arg(long, value_parser = parse_requests, env = "LABELER_FIT_REQUESTS", default_value = "")]
    pub requests: Requests,
    /// The node label whose values are the domains the whole gang must share
    /// (`topology.k8s.aws/network-node-layer-3` for one leaf switch).
    #[arg(long, value_parser = parse_label_key, env = "LABELER_FIT_LEVEL", required_unless_present = "workload")]
    pub level: Option<String>,
    /// Node labels every pod requires (its `nodeSelector`), `KEY=VALUE` separated by commas:
    /// other nodes are in no domain.
    #[arg(long, value_parser = parse_node_selector, env = "LABELER_FIT_NODE_SELECTOR", default_value = "")]
    pub(crate) node_selector: NodeSelector,
    /// Taints the pods tolerate, `KEY[=VALUE][:EFFECT]` separated by commas (no value: any
    /// value; no effect: any effect). Nodes with a `NoSchedule` or `NoExecute` taint not
    /// tolerated take no pod.
    #[arg(long, value_parser = parse_toleration, value_delimiter = ',', env = "LABELER_FIT_TOLERATIONS")]
    pub tolerations: Vec<crate::fit::Toleration>,
    /// Domains that do not fit to show, nearest first.
    #[arg(long, value_parser = crate::bounds::count_flag::<usize>("misses"), env = "LABELER_FIT_MISSES", default_value_t = 5)]
    pub misses: usize,
    /// The label keys, as `run` has them: they say which level is the capacity block (an
    /// UltraServer, named by its leaf switch too) and which are the network layers.
    #[command(flatten)]
    pub labels: LabelArgs,
    #[command(flatten)]
    pub output: Output,
}

/// Per-pod requests, in thousandths of each resource's unit.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Requests(pub std::collections::BTreeMap<String, crate::fit::Milli>);

/// `nvidia.com/gpu=8,cpu=500m`: each resource once, a name Kubernetes accepts, a quantity of
/// at least 0.
fn parse_requests(text: &str) -> std::result::Result<Requests, String> {
    let mut out = std::collections::BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, quantity) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected RESOURCE=QUANTITY"))?;
        let name = parse_label_key(name.trim())
            .map_err(|e| format!("{part:?}: not a resource name: {e}"))?;
        let amount = crate::fit::milli(quantity.trim()).map_err(|e| e.to_string())?;
        if amount < 0 {
            return Err(format!("{part:?}: a request is not negative"));
        }
        if name == crate::fit::PODS {
            return Err("pods: every pod takes one pod slot; not a request".into());
        }
        if out.insert(name.clone(), amount).is_some() {
            return Err(format!("{name} given twice"));
        }
    }
    Ok(Requests(out))
}

/// `NAMESPACE/NAME`.
fn parse_workload(text: &str) -> std::result::Result<(String, String), String> {
    let (ns, name) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?}: expected NAMESPACE/NAME"))?;
    let dns_label = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && crate::labels::is_valid_label_key(s)
            && !s.contains('/')
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    if !dns_label(ns) || !dns_label(name) {
        return Err(format!(
            "{text:?}: expected NAMESPACE/NAME (lowercase DNS names)"
        ));
    }
    Ok((ns.to_string(), name.to_string()))
}

/// Required node labels.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct NodeSelector(pub std::collections::BTreeMap<String, String>);

/// `pool=a,zone=b`: valid label keys and values, each key once.
fn parse_node_selector(text: &str) -> std::result::Result<NodeSelector, String> {
    let mut out = std::collections::BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?}: expected KEY=VALUE"))?;
        let key = parse_label_key(key)?;
        if !value.is_empty() && !crate::labels::is_valid_label_value(value) {
            return Err(format!("{part:?}: {value:?} is not a label value"));
        }
        if out.insert(key.clone(), value.to_string()).is_some() {
            return Err(format!("{key} given twice"));
        }
    }
    Ok(NodeSelector(out))
}

/// `KEY[=VALUE][:EFFECT]`: `Equal` with a value, `Exists` without; an empty key (`:NoSchedule`)
/// with no value tolerates every key.
fn parse_toleration(text: &str) -> std::result::Result<crate::fit::Toleration, String> {
    let (rest, effect) = match text.rsplit_once(':') {
        Some((rest, effect)) => (rest, Some(effect)),
        None => (text, None),
    };
    if let Some(e) = effect
        && !matches!(e, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
    {
        return Err(format!(
            "{text:?}: the effect is NoSchedule, PreferNoSchedule or NoExecute, not {e:?}"
        ));
    }
    let (key, value) = match rest.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (rest, None),
    };
    if !key.is_empty() {
        parse_label_key(key)?;
    } else if value.is_some() {
        return Err(format!("{text:?}: a value needs a key"));
    }
    Ok(crate::fit::Toleration {
        key: (!key.is_empty()).then(|| key.to_string()),
        operator: Some(if value.is_some() { "Equal" } else { "Exists" }.into()),
        value: value.map(str::to_string),
        effect: effect.map(str::to_string),
    })
}

/// A label key (or resource name) as Kubernetes accepts it: an optional DNS-subdomain prefix
/// and `/`, then a name of at most 63 characters.
fn parse_label_key(text: &str) -> std::result::Result<String, String> {
    if crate::labels::is_valid_label_key(text) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?} is not a label key (an optional DNS-subdomain prefix and `/`, then 1-63 letters, digits, `-`, `_`, `.`)"
        ))
    }
}

#[derive(Debug, Clone, Args)]
pub struct TreeArgs {
    #[command(flatten)]
    pub labels: LabelArgs,
    /// Nodes still carrying the startup taint are pointed out (unset: the chart's).
    #[command(flatten)]
    pub taint: crate::reconcile::gate::StartupTaintFlag,
    /// Output format: the tree, JSON, a picture (`dot`: Graphviz, `dot -Tsvg`; `mermaid`: a
    /// Mermaid flowchart, drawn where Markdown is), or Slurm's topology file (`slurm`:
    /// `topology.conf` for the tree plugin; `slurm-yaml`: `topology.yaml`, Slurm 25.05 and later).
    #[arg(
        short = 'o',
        long = "output",
        env = "LABELER_OUTPUT",
        value_enum,
        default_value_t
    )]
    pub output: TreeFormat,
    /// Fail (exit status 1, after printing) when fewer than this many nodes carry complete
    /// topology labels: the chart's `helm test` runs `tree --min-labelled=1` in the cluster.
    #[arg(long, value_parser = crate::bounds::count_flag::<usize>("min-labelled"), env = "LABELER_MIN_LABELLED", default_value_t = 0)]
    pub(crate) min_labelled: usize,
    /// Draw every node's topology labels as found. By default, when the cluster's nodes carry
    /// verification records, a node whose labels no record vouches for (labelled by hand or by
    /// another tool, or rewritten since the controller verified them) is listed without
    /// topology and says why, as the controller leaves it out of what it publishes. (Read
    /// without the record key: only the controller can tell a forged record.)
    #[arg(long, env = "LABELER_INCLUDE_UNVERIFIED")]
    pub(crate) include_unverified: bool,
    /// Instead of the tree: the account's Capacity Reservations under the network nodes EC2
    /// places them at (known before any instance runs), with instances reserved, in use, and
    /// the nodes that joined from each (by Karpenter's
    /// `karpenter.k8s.aws/capacity-reservation-id` label). Asks EC2 with the AWS credentials at
    /// hand: needs `ec2:DescribeCapacityReservationTopology` and
    /// `ec2:DescribeCapacityReservations`. Table or JSON.
    #[arg(long, env = "LABELER_TREE_RESERVATIONS")]
    pub reservations: bool,
    /// The region whose reservations `--reservations` shows; by default each region the nodes'
    /// `topology.kubernetes.io/region` labels name.
    #[arg(long, env = "AWS_REGION", value_parser = crate::lookup::ec2::parse_region)]
    pub region: Option<String>,
    #[command(flatten)]
    pub own: OwnFlags,
}

/// What `tree` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum TreeFormat {
    #[default]
    Table,
    Json,
    Dot,
    Mermaid,
    Slurm,
    SlurmYaml,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub labels: LabelArgs,
    #[command(flatten)]
    pub ec2: Ec2Args,
    #[command(flatten)]
    pub lookup: LookupArgs,
    #[command(flatten)]
    pub controller: ControllerArgs,
    #[command(flatten)]
    pub gate: GateArgs,
    #[command(flatten)]
    pub publish: PublishArgs,
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub leader: LeaderArgs,
    #[command(flatten)]
    pub client: crate::client::ClientArgs,
    #[command(flatten)]
    pub reservations: crate::publish::reserved::ReservationArgs,
    #[command(flatten)]
    pub health: crate::publish::interconnect::HealthArgs,
    #[command(flatten)]
    pub shape: crate::publish::shape::ShapeArgs,
}

/// `-o`/`--output` of the commands that print a table or JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Args, Default)]
pub struct Output {
    /// Output format.
    #[arg(
        short = 'o',
        long = "output",
        env = "LABELER_OUTPUT",
        value_enum,
        default_value_t
    )]
    pub format: OutputFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum OutputFormat {
    #[default]
    Table,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub decide: DecideArgs,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub own: OwnFlags,
}

/// What deciding a node's labels takes, the same flags as `run`'s: `plan` and `explain` read
/// them, and take the running controller's in its container.
#[derive(Debug, Clone, Args)]
pub struct DecideArgs {
    #[command(flatten)]
    pub labels: LabelArgs,
    /// What the startup gate would do (the same flags as `run`).
    #[command(flatten)]
    pub gate: GateArgs,
    #[command(flatten)]
    pub ec2: Ec2Args,
    #[command(flatten)]
    pub lookup: LookupArgs,
}

impl From<RunArgs> for DecideArgs {
    /// The running controller's.
    fn from(run: RunArgs) -> Self {
        DecideArgs {
            labels: run.labels,
            gate: run.gate,
            ec2: run.ec2,
            lookup: run.lookup,
        }
    }
}

/// The flags of the controller this process runs beside: PID 1's command line when it is
/// `ec2-topology-labeler run ...` (inside the controller's container, reached with `kubectl
/// exec`; the container's environment is this process's too). `None` elsewhere.
pub(crate) fn controller_flags() -> Option<RunArgs> {
    let raw = std::fs::read("/proc/1/cmdline").ok()?;
    run_args_of(&raw)
}

/// The running controller's flags when this command runs in its container and was not told to
/// use its own (`--own-flags`); says so on stderr.
pub(crate) fn in_the_controllers_container(own: &OwnFlags) -> Option<RunArgs> {
    if own.own_flags {
        return None;
    }
    let run = controller_flags()?;
    eprintln!("(using the flags of the controller in this container: --own-flags to use yours)");
    Some(run)
}

/// `run`'s arguments from a NUL-separated command line, if it is one.
pub(crate) fn run_args_of(cmdline: &[u8]) -> Option<RunArgs> {
    let argv: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    match <Cli as clap::Parser>::try_parse_from(argv).ok()?.command {
        Command::Run(run) => Some(run),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `uninstall --slurm-topology-configmap` is `none` or `NAMESPACE/NAME`, read when the
    /// command line is parsed; anything else is refused there, naming the flag.
    #[test]
    fn uninstall_reads_the_slurm_configmap_when_parsed() {
        use crate::publish::SlurmConfigMaps;
        let parse = |v: &str| {
            Cli::try_parse_from([
                "ec2-topology-labeler",
                "uninstall",
                "--slurm-topology-configmap",
                v,
            ])
            .map(|cli| match cli.command {
                Command::Uninstall(u) => u.plugins.slurm.slurm_topology_configmap,
                _ => panic!("parsed as uninstall"),
            })
        };
        assert_eq!(parse("none").ok(), Some(Some(SlurmConfigMaps::None)));
        assert_eq!(
            parse("slurm/topology").ok(),
            Some(Some(SlurmConfigMaps::One {
                namespace: "slurm".into(),
                name: "topology".into()
            }))
        );
        let refused = parse("Slurm/Topology")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("--slurm-topology-configmap"), "{refused}");
        assert!(refused.contains("is not NAMESPACE/NAME"), "{refused}");
    }
    use crate::labels::{LabelScheme, LayerNumbering};
    use clap::CommandFactory;
    use std::time::Duration;

    /// The UltraServer options that cannot work are refused before anything runs: `always`
    /// without the capacity block label, the clique level without the UltraServer level.
    #[test]
    fn ultraserver_options_that_cannot_work_are_refused() {
        let check = |args: &[&str]| -> std::result::Result<(), String> {
            let cli =
                Cli::try_parse_from(["ec2-topology-labeler", "run"].iter().chain(args).copied())
                    .map_err(|e| e.to_string())?;
            cli.check()
        };
        assert_eq!(check(&[]), Ok(()));
        assert_eq!(check(&["--nvlink-clique-level=true"]), Ok(()));
        assert_eq!(
            check(&["--nvlink-clique-level=true", "--ultraserver-level=always"]),
            Ok(())
        );
        for refused in [
            &["--ultraserver-level=always", "--capacity-block-label=false"][..],
            &["--nvlink-clique-level=true", "--ultraserver-level=never"],
            &["--nvlink-clique-level=true", "--capacity-block-label=false"],
        ] {
            assert!(check(refused).is_err(), "{refused:?} accepted");
        }
    }

    #[test]
    fn fit_reads_requests_selectors_and_tolerations_and_refuses_bad_ones() {
        let cli = Cli::try_parse_from([
            "x",
            "fit",
            "--pods",
            "4",
            "--requests",
            "nvidia.com/gpu=8, cpu=500m",
            "--level",
            "topology.k8s.aws/network-node-layer-3",
            "--node-selector",
            "pool=gpu",
            "--tolerations",
            "nvidia.com/gpu:NoSchedule,dedicated=train,:NoExecute",
        ]);
        let Ok(Cli {
            command: Command::Fit(f),
            ..
        }) = cli
        else {
            panic!("not parsed: {cli:?}");
        };
        assert_eq!(f.requests.0.get("nvidia.com/gpu"), Some(&8_000));
        assert_eq!(f.requests.0.get("cpu"), Some(&500));
        assert_eq!(
            f.node_selector.0.get("pool").map(String::as_str),
            Some("gpu")
        );
        assert_eq!(f.tolerations.len(), 3);
        assert_eq!(f.tolerations[0].operator.as_deref(), Some("Exists"));
        assert_eq!(f.tolerations[1].value.as_deref(), Some("train"));
        assert_eq!(f.tolerations[2].key, None);
        assert_eq!(f.misses, 5);
        assert_eq!(f.pods, Some(4));
        let w = Cli::try_parse_from(["x", "fit", "--workload", "ml/train-1"]);
        assert!(
            matches!(&w, Ok(Cli { command: Command::Fit(f), .. }) if f.workload == Some(("ml".into(), "train-1".into()))),
            "{w:?}"
        );
        for refused in [
            vec!["x", "fit", "--workload", "ml/train-1", "--pods", "2"],
            vec!["x", "fit", "--workload", "train-1"],
            vec!["x", "fit", "--pods", "2"],
        ] {
            assert!(Cli::try_parse_from(&refused).is_err(), "{refused:?}");
        }
        for (flag, value, says) in [
            (
                "--requests",
                "nvidia.com/gpu=eight",
                "not a Kubernetes quantity",
            ),
            ("--requests", "cpu=-1", "not negative"),
            ("--requests", "cpu=1,cpu=2", "given twice"),
            ("--requests", "pods=1", "pod slot"),
            ("--requests", "cpu", "RESOURCE=QUANTITY"),
            ("--level", "Not A Label", "not a label key"),
            ("--node-selector", "pool", "KEY=VALUE"),
            ("--tolerations", "gpu:NoWay", "the effect is"),
            ("--tolerations", "=v", "a value needs a key"),
            ("--pods", "0", "out of range"),
        ] {
            let mut args = vec!["x", "fit"];
            for (f, v) in [
                ("--pods", "1"),
                ("--level", "topology.k8s.aws/network-node-layer-3"),
            ] {
                if f != flag {
                    args.extend([f, v]);
                }
            }
            args.extend([flag, value]);
            let err = Cli::try_parse_from(args).map(drop).unwrap_err().to_string();
            assert!(err.contains(says), "{flag} {value}: {err}");
        }
    }

    #[test]
    fn cli_is_well_formed_and_every_flag_has_an_env_var_and_help() {
        Cli::command().debug_assert();
        let cmd = Cli::command();
        for sub in cmd.get_subcommands() {
            for arg in sub.get_arguments() {
                if arg.get_id() == "help" || arg.get_id() == "version" || arg.is_positional() {
                    continue;
                }
                assert!(
                    arg.get_env().is_some(),
                    "{} --{} has no env var",
                    sub.get_name(),
                    arg.get_id()
                );
                assert!(
                    arg.get_help().is_some() || arg.get_long_help().is_some(),
                    "{} --{} has no help",
                    sub.get_name(),
                    arg.get_id()
                );
            }
        }
    }

    /// docs/configuration.md's flag reference, generated from the flags themselves.
    #[test]
    fn docs_flags_table_is_generated_from_the_code() {
        use std::collections::BTreeMap;
        // One row per definition of a flag: (flag, env, default, help) -> commands. A flag
        // that two commands define differently (another variable, default or meaning) gets a
        // row for each, never the first one's for both.
        type Row = (String, String, String, String);
        let mut flags: BTreeMap<Row, Vec<String>> = BTreeMap::new();
        let mut order: Vec<Row> = Vec::new();
        for sub in Cli::command().get_subcommands() {
            for arg in sub.get_arguments() {
                let Some(long) = arg.get_long() else {
                    continue;
                };
                if long == "help" || long == "version" {
                    continue;
                }
                let key = match arg.get_short() {
                    Some(c) => format!("`-{c}`, `--{long}`"),
                    None => format!("`--{long}`"),
                };
                let env = arg
                    .get_env()
                    .map(|e| format!("`{}`", e.to_string_lossy()))
                    .unwrap_or_default();
                let default = arg
                    .get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(", ");
                let default = if default.is_empty() {
                    String::new()
                } else {
                    format!("`{default}`")
                };
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                let row = (key, env, default, help);
                let commands = flags.entry(row.clone()).or_insert_with(|| {
                    order.push(row);
                    Vec::new()
                });
                commands.push(sub.get_name().to_string());
            }
        }
        // A flag's definitions side by side, in the order flags first appear.
        let first: BTreeMap<&str, usize> =
            order
                .iter()
                .enumerate()
                .fold(BTreeMap::new(), |mut m, (i, r)| {
                    m.entry(r.0.as_str()).or_insert(i);
                    m
                });
        let mut rows: Vec<&Row> = order.iter().collect();
        rows.sort_by_key(|r| first[r.0.as_str()]);
        let mut t = String::from(
            "| Flag | Environment | Default | Range | Commands | What |\n| --- | --- | --- | --- | --- | --- |\n",
        );
        for row in rows {
            let (key, env, default, help) = row;
            let commands = &flags[row];
            // The range a value is checked against at start (crate::bounds).
            let long = key
                .rsplit("`--")
                .next()
                .unwrap_or_default()
                .trim_end_matches('`');
            let range = crate::bounds::of(long)
                .map(|r| r.describe())
                .unwrap_or_default();
            t.push_str(&format!(
                "| {key} | {env} | {default} | {range} | {} | {} |\n",
                commands.join(", "),
                crate::testing::docs::cell(help)
            ));
        }
        crate::testing::docs::check_generated("docs/configuration.md", "flags", &t);
    }

    /// An absurd duration or count is refused when the command line is parsed, naming the flag
    /// and its range (it once overflowed `Instant` arithmetic at run time); every default is
    /// inside its range (clap parses defaults through the same parser).
    #[test]
    fn absurd_values_are_refused_at_parse_naming_the_flag_and_its_range() {
        for (flag, value) in [
            ("--cache-ttl", "100000000years"),
            ("--resync-period", "0s"),
            ("--publish-interval", "1ms"),
            ("--leader-election-lease-duration", "1000years"),
            ("--startup-taint-timeout", "400days"),
            ("--concurrency", "0"),
            ("--write-concurrency", "65536"),
            ("--ec2-rate", "NaN"),
            ("--ec2-burst", "-1"),
        ] {
            let arg = format!("{flag}={value}");
            let err = Cli::try_parse_from(["ec2-topology-labeler", "run", arg.as_str()])
                .expect_err(flag)
                .to_string();
            let range = crate::bounds::of(flag.trim_start_matches("--"))
                .expect("bounded")
                .describe();
            assert!(
                err.contains(flag) && err.contains(&range),
                "{flag} {value}: {err}"
            );
        }
        for sub in ["run", "plan", "explain", "tree", "uninstall"] {
            let args: Vec<&str> = match sub {
                "explain" => vec!["ec2-topology-labeler", sub, "node-a"],
                _ => vec!["ec2-topology-labeler", sub],
            };
            assert!(Cli::try_parse_from(args).is_ok(), "{sub}'s defaults");
        }
    }

    #[test]
    fn defaults_give_the_eks_scheme_and_documented_timings() {
        let cli = Cli::try_parse_from(["ec2-topology-labeler", "run"]).unwrap();
        let Command::Run(run) = cli.command else {
            panic!()
        };
        assert_eq!(run.labels.scheme().unwrap(), LabelScheme::default());
        assert_eq!(run.lookup.batch_window.0, Duration::from_millis(200));
        assert_eq!(run.controller.resync_period.0, Duration::from_secs(3600));
    }

    #[test]
    fn extras_switch_off_and_durations_parse() {
        let cli = Cli::try_parse_from([
            "ec2-topology-labeler",
            "run",
            "--capacity-block-label",
            "false",
            "--batch-window",
            "50ms",
            "--layer-numbering",
            "leaf-first",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!()
        };
        let scheme = run.labels.scheme().unwrap();
        assert_eq!(scheme.capacity_block_key, None);
        assert_eq!(scheme.numbering, LayerNumbering::LeafFirst);
        assert_eq!(run.lookup.batch_window.0, Duration::from_millis(50));
        assert!(
            Cli::try_parse_from(["ec2-topology-labeler", "run", "--batch-window", "soon"]).is_err()
        );
    }

    #[test]
    fn durations_round_trip_through_serde() {
        let d: HumanDuration = serde_json::from_str("\"1h30m\"").unwrap();
        assert_eq!(d.0, Duration::from_secs(5400));
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"1h 30m\"");
    }
}

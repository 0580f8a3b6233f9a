//! Command line and configuration. Every flag also reads an environment variable (`LABELER_…`,
//! or the AWS SDK's own `AWS_REGION`); `--help` is the reference.

use std::{fmt, net::SocketAddr, str::FromStr, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    labels::{
        CAPACITY_BLOCK_KEY, EKS_LAYER_PREFIX, EKS_ZONE_ID_KEY, LabelScheme, LayerNumbering,
        PLACEMENT_GROUP_KEY,
    },
    limiter::LimiterConfig,
    lookup::LookupConfig,
};

/// A duration written the human way: `200ms`, `15s`, `1h`, `1h30m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s)
            .map(HumanDuration)
            .map_err(|e| format!("{s:?} is not a duration like 200ms, 15s or 1h: {e}"))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for HumanDuration {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^ *[0-9]+ *[a-zµ]+( *[0-9]+ *[a-zµ]+)* *$",
            "description": "A duration such as 200ms, 15s, 1h or 1h30m"
        })
    }
}

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
}

#[derive(Debug, Clone, Args)]
pub struct TreeArgs {
    #[command(flatten)]
    pub labels: LabelArgs,
    /// Output format.
    #[arg(
        short = 'o',
        long = "output",
        env = "LABELER_OUTPUT",
        value_enum,
        default_value_t
    )]
    pub output: OutputFormat,
}

/// Which labels to write.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LabelArgs {
    /// Prefix of the per-layer label keys; the layer number is appended. The default is the key
    /// family EKS itself writes.
    #[arg(long, env = "LABELER_LAYER_LABEL_PREFIX", default_value = EKS_LAYER_PREFIX)]
    pub layer_label_prefix: String,
    /// top-first: layer 1 is the top of the hierarchy (EKS). leaf-first: layer 1 is the switch
    /// above the instance.
    #[arg(long, env = "LABELER_LAYER_NUMBERING", value_enum, default_value_t)]
    pub layer_numbering: LayerNumbering,
    /// Write the zone ID label.
    #[arg(long, env = "LABELER_ZONE_ID_LABEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub zone_id_label: bool,
    /// Key of the zone ID label.
    #[arg(long, env = "LABELER_ZONE_ID_LABEL_KEY", default_value = EKS_ZONE_ID_KEY)]
    pub zone_id_label_key: String,
    /// Write the capacity block (UltraServer domain) label when EC2 reports one.
    #[arg(long, env = "LABELER_CAPACITY_BLOCK_LABEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub capacity_block_label: bool,
    /// Key of the capacity block label.
    #[arg(long, env = "LABELER_CAPACITY_BLOCK_LABEL_KEY", default_value = CAPACITY_BLOCK_KEY)]
    pub capacity_block_label_key: String,
    /// Write the placement group label (sanitised) and annotation (raw name).
    #[arg(long, env = "LABELER_PLACEMENT_GROUP_LABEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub placement_group_label: bool,
    /// Key of the placement group label and annotation.
    #[arg(long, env = "LABELER_PLACEMENT_GROUP_LABEL_KEY", default_value = PLACEMENT_GROUP_KEY)]
    pub placement_group_label_key: String,
}

impl LabelArgs {
    pub fn scheme(&self) -> Result<LabelScheme, String> {
        let scheme = LabelScheme {
            layer_prefix: self.layer_label_prefix.clone(),
            numbering: self.layer_numbering,
            zone_id_key: self.zone_id_label.then(|| self.zone_id_label_key.clone()),
            capacity_block_key: self
                .capacity_block_label
                .then(|| self.capacity_block_label_key.clone()),
            placement_group_key: self
                .placement_group_label
                .then(|| self.placement_group_label_key.clone()),
        };
        scheme.validate()?;
        Ok(scheme)
    }
}

/// How we talk to EC2.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Ec2Args {
    /// AWS region for every node; by default derived from each node's zone (us-west-2b →
    /// us-west-2).
    #[arg(long, env = "AWS_REGION")]
    pub region: Option<String>,
    /// Sustained DescribeInstanceTopology calls per second (EC2's account-wide bucket refills at
    /// about 20/s and is shared with every other tool).
    #[arg(long, env = "LABELER_EC2_RATE", default_value_t = 5.0)]
    pub ec2_rate: f64,
    /// Calls allowed back to back.
    #[arg(long, env = "LABELER_EC2_BURST", default_value_t = 20.0)]
    pub ec2_burst: f64,
    /// Timeout of one call.
    #[arg(long, env = "LABELER_EC2_TIMEOUT", default_value = "10s")]
    pub ec2_timeout: HumanDuration,
    /// Longest pause every caller takes after EC2 throttles (RequestLimitExceeded).
    #[arg(long, env = "LABELER_EC2_THROTTLE_BACKOFF_MAX", default_value = "30s")]
    pub ec2_throttle_backoff_max: HumanDuration,
}

impl Ec2Args {
    pub fn limiter(&self) -> LimiterConfig {
        LimiterConfig {
            rate: self.ec2_rate,
            burst: self.ec2_burst,
            backoff_cap: self.ec2_throttle_backoff_max.0,
            ..LimiterConfig::default()
        }
    }
}

/// Batching and caching of topology answers.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LookupArgs {
    /// A DescribeInstanceTopology call goes out once no new instance has joined the waiting
    /// ones for this long (a burst of new nodes keeps filling one call), or as soon as 100 wait.
    #[arg(long, env = "LABELER_BATCH_WINDOW", default_value = "200ms")]
    pub batch_window: HumanDuration,
    /// Longest an instance waits for its call to fill while others keep arriving.
    #[arg(long, env = "LABELER_BATCH_MAX_WAIT", default_value = "2s")]
    pub batch_max_wait: HumanDuration,
    /// Answers older than this are refreshed (in batches) when their node is next reconciled.
    #[arg(long, env = "LABELER_CACHE_TTL", default_value = "6h")]
    pub cache_ttl: HumanDuration,
    /// First retry after EC2 did not describe an instance (doubles per attempt).
    #[arg(long, env = "LABELER_NOT_DESCRIBED_RETRY", default_value = "15s")]
    pub not_described_retry: HumanDuration,
    /// Longest wait before asking again about an instance EC2 does not describe (an unsupported
    /// instance type).
    #[arg(long, env = "LABELER_NOT_DESCRIBED_TTL", default_value = "1h")]
    pub not_described_ttl: HumanDuration,
}

impl LookupArgs {
    pub fn lookup(&self) -> LookupConfig {
        LookupConfig {
            batch_window: self.batch_window.0,
            batch_max_wait: self.batch_max_wait.0,
            cache_ttl: self.cache_ttl.0,
            not_described_retry: self.not_described_retry.0,
            not_described_ttl: self.not_described_ttl.0,
            ..LookupConfig::default()
        }
    }
}

/// The controller's own behaviour.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ControllerArgs {
    /// Every node is re-checked against the cached topology this often (with jitter).
    #[arg(long, env = "LABELER_RESYNC_PERIOD", default_value = "1h")]
    pub resync_period: HumanDuration,
    /// Most reconciles in flight at once (they mostly wait for a shared EC2 batch).
    #[arg(long, env = "LABELER_CONCURRENCY", default_value_t = 512)]
    pub concurrency: u16,
    /// Most label writes (PATCH requests) in flight at once: bounds connections, memory and
    /// the load on the API server during a burst.
    #[arg(long, env = "LABELER_WRITE_CONCURRENCY", default_value_t = 32)]
    pub write_concurrency: u16,
    /// When another writer keeps changing our labels on a node (more than 3 corrections in 10
    /// minutes), stop correcting it for this long (doubling, up to 1h) and report the conflict.
    #[arg(long, env = "LABELER_CONFLICT_BACKOFF", default_value = "5m")]
    pub conflict_backoff: HumanDuration,
}

/// What to publish for schedulers beyond labels.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PublishArgs {
    /// Create a Kueue Topology whose levels are our layer labels (never changes an existing
    /// one: Kueue's levels are immutable; a mismatch is reported).
    #[arg(long, env = "LABELER_KUEUE_TOPOLOGY", default_value_t = false, action = clap::ArgAction::Set)]
    pub kueue_topology: bool,
    /// Name of that Topology (ResourceFlavors refer to it by `topologyName`).
    #[arg(
        long,
        env = "LABELER_KUEUE_TOPOLOGY_NAME",
        default_value = "aws-network"
    )]
    pub kueue_topology_name: String,
    /// Also create a Topology with four layers, for 4-layer instance types (p6-b200, p6-b300).
    #[arg(long, env = "LABELER_KUEUE_TOPOLOGY_FOUR_LAYER", default_value_t = false, action = clap::ArgAction::Set)]
    pub kueue_topology_four_layer: bool,
    /// Name of the 4-layer Topology.
    #[arg(
        long,
        env = "LABELER_KUEUE_TOPOLOGY_FOUR_LAYER_NAME",
        default_value = "aws-network-4-layer"
    )]
    pub kueue_topology_four_layer_name: String,
    /// End the Topology's levels with kubernetes.io/hostname (as Kueue advises).
    #[arg(long, env = "LABELER_KUEUE_TOPOLOGY_HOSTNAME_LEVEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub kueue_topology_hostname_level: bool,
    /// Keep a Volcano HyperNode tree in step with the labelled nodes.
    #[arg(long, env = "LABELER_VOLCANO_HYPERNODES", default_value_t = false, action = clap::ArgAction::Set)]
    pub volcano_hypernodes: bool,
    /// Prefix of the HyperNode names we own.
    #[arg(
        long,
        env = "LABELER_VOLCANO_HYPERNODE_PREFIX",
        default_value = "ec2tl"
    )]
    pub volcano_hypernode_prefix: String,
    /// How often publishers compare what they publish with the labels (nothing is sent when
    /// nothing changed).
    #[arg(long, env = "LABELER_PUBLISH_INTERVAL", default_value = "5s")]
    pub publish_interval: HumanDuration,
}

/// What the deployment sets itself (the chart owns these flags).
#[derive(Debug, Clone, Args, PartialEq)]
pub struct ServeArgs {
    /// Record Kubernetes Events on a Node when its labels change or it cannot be labelled.
    #[arg(long, env = "LABELER_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub events: bool,
    /// Address of the HTTP server for /metrics, /livez and /readyz.
    #[arg(long, env = "LABELER_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
}

/// Leader election, for running more than one replica (the chart sets these).
#[derive(Debug, Clone, Args, PartialEq)]
pub struct LeaderArgs {
    /// Elect a leader on a Lease; only the leader looks up EC2 and writes. Needed with more than
    /// one replica.
    #[arg(long, env = "LABELER_LEADER_ELECTION", default_value_t = false, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Namespace of the Lease (default: the namespace the controller runs in).
    #[arg(long, env = "LABELER_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Name of the Lease.
    #[arg(
        long,
        env = "LABELER_LEADER_ELECTION_LEASE_NAME",
        default_value = "ec2-topology-labeler"
    )]
    pub leader_election_lease_name: String,
    /// How long a leader's lease lasts without renewal: the longest a failover takes.
    #[arg(
        long,
        env = "LABELER_LEADER_ELECTION_LEASE_DURATION",
        default_value = "15s"
    )]
    pub leader_election_lease_duration: HumanDuration,
    /// The leader renews this long before its lease would expire.
    #[arg(
        long,
        env = "LABELER_LEADER_ELECTION_RENEW_GRACE",
        default_value = "5s"
    )]
    pub leader_election_renew_grace: HumanDuration,
    /// This replica's identity in the election (the chart passes the Pod name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
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
    pub publish: PublishArgs,
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(flatten)]
    pub leader: LeaderArgs,
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
    pub labels: LabelArgs,
    #[command(flatten)]
    pub ec2: Ec2Args,
    #[command(flatten)]
    pub lookup: LookupArgs,
    /// Output format.
    #[arg(
        short = 'o',
        long = "output",
        env = "LABELER_OUTPUT",
        value_enum,
        default_value_t
    )]
    pub output: OutputFormat,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed_and_every_flag_has_an_env_var_and_help() {
        Cli::command().debug_assert();
        let cmd = Cli::command();
        for sub in cmd.get_subcommands() {
            for arg in sub.get_arguments() {
                if arg.get_id() == "help" || arg.get_id() == "version" {
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

    #[test]
    fn readme_documents_every_flag_and_env_var() {
        let readme = include_str!("../README.md");
        for sub in Cli::command().get_subcommands() {
            for arg in sub.get_arguments() {
                if let (Some(long), Some(env)) = (arg.get_long(), arg.get_env()) {
                    assert!(
                        readme.contains(&format!("`--{long}`")),
                        "README lacks --{long}"
                    );
                    let env = env.to_string_lossy();
                    assert!(readme.contains(&format!("`{env}`")), "README lacks {env}");
                }
            }
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

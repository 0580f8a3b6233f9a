//! Command line and configuration. Every flag also reads an environment variable (`LABELER_…`,
//! or the AWS SDK's own `AWS_REGION`); `--help` is the reference.
//!
//! Owns: the command line's shape. Never reads anything at run time.

//!
//! Each module owns its settings (`LabelArgs` in [`crate::scheme`], `Ec2Args` and `LookupArgs` in
//! [`crate::lookup`], `ControllerArgs` in [`crate::reconcile`], `GateArgs` in
//! [`crate::reconcile::gate`], `PublishArgs` in
//! [`crate::publish`], `ServeArgs` in [`crate::http`], `LeaderArgs` in [`crate::leader`]); this
//! module only composes them into the commands.

use clap::{Args, Parser, Subcommand, ValueEnum};

pub use crate::duration::HumanDuration;
pub use crate::http::ServeArgs;
pub use crate::leader::LeaderArgs;
pub use crate::lookup::{LookupArgs, ec2::Ec2Args};
pub use crate::publish::PublishArgs;
pub use crate::reconcile::gate::StartupTaint;
pub use crate::reconcile::{ControllerArgs, gate::GateArgs};
pub use crate::scheme::LabelArgs;

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
    /// The startup taint to point out on nodes still carrying it (`KEY[=VALUE]:EFFECT`).
    #[arg(
        long,
        env = "LABELER_STARTUP_TAINT",
        default_value = "ec2-topology-labeler.io/topology-pending:NoSchedule"
    )]
    pub startup_taint: Option<StartupTaint>,
    /// Output format: the tree, JSON, or Slurm's topology file (`slurm`: `topology.conf` for the
    /// tree plugin; `slurm-yaml`: `topology.yaml`, Slurm 25.05 and later).
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
    #[arg(long, env = "LABELER_MIN_LABELLED", default_value_t = 0)]
    pub min_labelled: usize,
}

/// What `tree` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum TreeFormat {
    #[default]
    Table,
    Json,
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
    /// What the startup gate would do (the same flags as `run`).
    #[command(flatten)]
    pub gate: GateArgs,
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
    use crate::labels::{LabelScheme, LayerNumbering};
    use clap::CommandFactory;
    use std::time::Duration;

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

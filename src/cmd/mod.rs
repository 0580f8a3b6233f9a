//! Every command, and the command line that composes them ([`Cli`]): `run` is the controller
//! ([`crate::cmd::run`], the wiring of the rooms below); the operator's commands are each a thin
//! file over the library that reads the cluster (and EC2), prints, and writes nothing but what
//! `uninstall` and `retire` are for.
//!
//! Owns: the command line's shape, and each command's own arguments beside it (`plan`'s in
//! `plan.rs`, …); what several commands share (`run`'s settings, `-o`) is in [`crate::flags`].
//! Never: one command importing another.

pub mod explain;
pub mod fit;
pub mod plan;
pub mod retire;
pub mod run;
pub mod tree;
pub mod uninstall;

use clap::{Parser, Subcommand};

use crate::flags::{Globals, RunArgs};

#[derive(Debug, Parser)]
#[command(
    name = "ec2-topology-labeler",
    version,
    about = "Keeps Kubernetes node labels in step with EC2 network topology (DescribeInstanceTopology)",
    long_about = None
)]
pub struct Cli {
    #[command(flatten)]
    pub globals: Globals,
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
    Plan(plan::PlanArgs),
    /// Print the cluster's network topology as its labels describe it: layer → … → nodes, with
    /// counts, readiness, and nodes missing labels.
    Tree(tree::TreeArgs),
    /// Say why a node has, or lacks, its topology labels: its providerID, the controller's view
    /// (state, last error, next look, EC2 cache), EC2's answer now, the labels, taint and
    /// condition it would get. Run it in the controller's Pod (`kubectl exec`) to read the same
    /// configuration and reach the controller.
    Explain(explain::ExplainArgs),
    /// Remove what the controller wrote to the cluster (our conditions and interconnect taint on
    /// Nodes, HyperNodes, Kueue and KAI Topologies, Slurm ConfigMaps, the Lease) except the
    /// topology labels, unless `--labels`.
    /// Run once the controller is gone (the chart's post-delete hook does).
    Uninstall(uninstall::UninstallArgs),
    /// Say where a gang of pods fits now: the domains at one topology level (the values of one
    /// node label) whose nodes have room for every pod, from their allocatable resources and
    /// the requests of the pods bound to them, tightest first; and the nearest misses, with
    /// what runs out. Reads Nodes and Pods, writes nothing; exit status 1 when none fits.
    Fit(fit::FitArgs),
    /// Remove what a scheduler feature now turned off published (this installation's HyperNodes,
    /// Kueue Topologies no ResourceFlavor names; KAI Topologies are reported), under rights the
    /// running controller does not hold. The chart's post-upgrade hook runs it.
    Retire(retire::RetireArgs),
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
}

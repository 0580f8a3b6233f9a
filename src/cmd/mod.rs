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

use crate::{
    bounds::{Bound, Range},
    flags::{Globals, RunArgs},
};

/// Every bounded flag's range, each declared beside its flag: what docs/configuration.md and
/// the chart's values.schema.json give (a test holds this list to the command line: every flag
/// that refuses a value as out of range is in it, and every range in it is a flag's).
pub const BOUNDS: &[Bound] = &[
    crate::admin::http::WATCH_UNHEALTHY_AFTER_RANGE,
    crate::admin::http::WATCH_TIMEOUT_RANGE,
    crate::publish::reserved::RESERVATIONS_INTERVAL_RANGE,
    crate::publish::reserved::RESERVATION_IDLE_AFTER_RANGE,
    crate::publish::interconnect::ULTRASERVER_HEALTH_INTERVAL_RANGE,
    crate::publish::PUBLISH_INTERVAL_RANGE,
    crate::publish::shape::ULTRASERVER_SHAPE_INTERVAL_RANGE,
    crate::leader::LEADER_ELECTION_LEASE_DURATION_RANGE,
    crate::leader::LEADER_ELECTION_RENEW_GRACE_RANGE,
    crate::flags::scheme::UNIFORM_DEPTH_RANGE,
    retire::ROLLOUT_TIMEOUT_RANGE,
    fit::PODS_RANGE,
    fit::MISSES_RANGE,
    uninstall::WAIT_FOR_LEASE_RANGE,
    tree::MIN_LABELLED_RANGE,
    crate::client::KUBE_CONNECT_TIMEOUT_RANGE,
    crate::client::KUBE_REQUEST_TIMEOUT_RANGE,
    crate::client::KUBE_QPS_RANGE,
    crate::client::KUBE_BURST_RANGE,
    crate::reconcile::gate::STARTUP_TAINT_TIMEOUT_RANGE,
    crate::reconcile::RESYNC_PERIOD_RANGE,
    crate::reconcile::CONCURRENCY_RANGE,
    crate::reconcile::WRITE_CONCURRENCY_RANGE,
    crate::reconcile::CONFLICT_BACKOFF_RANGE,
    crate::reconcile::CONFLICT_WINDOW_RANGE,
    crate::lookup::BATCH_WINDOW_RANGE,
    crate::lookup::BATCH_MAX_WAIT_RANGE,
    crate::lookup::CACHE_TTL_RANGE,
    crate::lookup::NOT_DESCRIBED_RETRY_RANGE,
    crate::lookup::NOT_DESCRIBED_TTL_RANGE,
    crate::lookup::ec2::EC2_RATE_RANGE,
    crate::lookup::ec2::EC2_BURST_RANGE,
    crate::lookup::ec2::EC2_TIMEOUT_RANGE,
    crate::lookup::ec2::EC2_THROTTLE_BACKOFF_MAX_RANGE,
];

/// The range of the flag `flag` (its long name), if it has one.
pub fn bound(flag: &str) -> Option<Range> {
    BOUNDS.iter().find(|b| b.flag == flag).map(|b| b.range)
}

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

    /// The list of ranges and the command line agree: every flag that refuses a value as out of
    /// range has its range in [`BOUNDS`] (and the refusal gives it), and every range there is
    /// one such flag's, listed once and ordered. (A range declared beside its flag but left out
    /// of the list would miss the docs and the chart's schema; one listed but not the flag's
    /// parser would document a check that is not made.)
    #[test]
    fn every_bounded_flag_is_listed_and_every_listed_range_is_a_flags() {
        let mut listed = std::collections::HashSet::new();
        for b in BOUNDS {
            assert!(listed.insert(b.flag), "--{} listed twice", b.flag);
            assert!(b.is_ordered(), "--{}'s range is not ordered", b.flag);
        }
        // Far above every range, each kind: a duration, a whole number, a number.
        let probes = ["100000000years", "10000000000", "1e300"];
        let mut refusing = std::collections::HashSet::new();
        for sub in Cli::command().get_subcommands() {
            for arg in sub.get_arguments() {
                let Some(long) = arg.get_long() else {
                    continue;
                };
                if !arg.get_action().takes_values() {
                    continue;
                }
                for probe in probes {
                    let line = format!("--{long}={probe}");
                    let Err(e) = Cli::try_parse_from(["x", sub.get_name(), line.as_str()]) else {
                        continue;
                    };
                    let e = e.to_string();
                    if !e.contains(&format!("out of range for --{long}")) {
                        continue;
                    }
                    let range = bound(long).unwrap_or_else(|| {
                        panic!("{} --{long} refuses {probe} as out of range, but BOUNDS has no range for it", sub.get_name())
                    });
                    assert!(e.contains(&range.describe()), "{e}");
                    refusing.insert(long.to_string());
                }
            }
        }
        for b in BOUNDS {
            assert!(
                refusing.contains(b.flag),
                "--{} is in BOUNDS but no command's flag refuses a value outside it",
                b.flag
            );
        }
    }

    /// Random strings never panic a flag's parser, and whatever one takes is inside its range.
    #[test]
    fn parsers_take_only_values_in_range_for_any_input() {
        let mut rng = fastrand::Rng::with_seed(42);
        let pieces = [
            "0",
            "1",
            "9",
            "99999999999999999999",
            ".",
            "5",
            "ms",
            "s",
            "h",
            "d",
            "days",
            "y",
            "-",
            " ",
            "e",
            "NaN",
            "inf",
            "m",
            "w",
        ];
        for _ in 0..20_000 {
            let s: String = (0..rng.usize(1..6))
                .map(|_| pieces[rng.usize(..pieces.len())])
                .collect();
            for b in BOUNDS {
                match b.range {
                    Range::Duration { min, max } => {
                        if let Ok(d) = b.durations()(&s) {
                            assert!(d.0 >= min && d.0 <= max, "{} {s:?}", b.flag);
                        }
                    }
                    Range::Count { min, max } => {
                        if let Ok(n) = b.counts::<u64>()(&s) {
                            assert!(n >= min && n <= max, "{} {s:?}", b.flag);
                        }
                    }
                    Range::Number { min, max } => {
                        if let Ok(n) = b.numbers()(&s) {
                            assert!(n >= min && n <= max, "{} {s:?}", b.flag);
                        }
                    }
                }
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
            let range = bound(long).map(|r| r.describe()).unwrap_or_default();
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
            let range = bound(flag.trim_start_matches("--"))
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

//! The settings more than one command reads: the controller's (`run`'s, [`RunArgs`], which
//! `plan`, `explain` and `tree` take from the running controller in its container), the flags
//! every command takes ([`Globals`]), `-o`/`--output`, and what deciding a node's labels takes
//! ([`DecideArgs`]). Every flag also reads an environment variable (`LABELER_…`, or the AWS
//! SDK's own `AWS_REGION`); `--help` is the reference.
//!
//! Owns: those shared settings, composed from each room's own (`LabelArgs` in
//! [`crate::flags::scheme`], `Ec2Args` and `LookupArgs` in [`crate::lookup`], `ControllerArgs`
//! in [`crate::reconcile`], `GateArgs` in [`crate::reconcile::gate`], `PublishArgs` in
//! [`crate::publish`], `ServeArgs` in [`crate::admin::http`], `LeaderArgs` in
//! [`crate::leader`]). Each command's own arguments are beside it in [`crate::cmd`], which also
//! composes the command line. Reads nothing at run time but, for the commands run inside the
//! controller's container, PID 1's command line ([`controller_flags`]).

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

/// The flags every command takes (clap's `global`: before or after the command's name).
#[derive(Debug, Clone, Args)]
pub struct Globals {
    /// Log format; the level comes from RUST_LOG (default: info).
    #[arg(
        long,
        env = "LABELER_LOG_FORMAT",
        value_enum,
        default_value_t,
        global = true
    )]
    pub log_format: LogFormat,
}

/// A command line read only for `run`'s arguments: the controller's, in its container.
#[derive(Debug, Parser)]
struct ControllerLine {
    #[command(flatten)]
    _globals: Globals,
    #[command(subcommand)]
    command: ControllerCommand,
}

#[derive(Debug, Subcommand)]
enum ControllerCommand {
    Run(RunArgs),
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
    let ControllerCommand::Run(run) = ControllerLine::try_parse_from(argv).ok()?.command;
    Some(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations_round_trip_through_serde() {
        let d: HumanDuration = serde_json::from_str("\"1h30m\"").unwrap();
        assert_eq!(d.0, Duration::from_secs(5400));
        assert_eq!(serde_json::to_string(&d).unwrap(), "\"1h 30m\"");
    }
}

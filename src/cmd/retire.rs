//! `retire`: remove what a scheduler feature now turned off published, under rights the running
//! controller does not hold (its ClusterRole names only the kinds of the features turned on).
//! The chart's post-upgrade hook runs it with the new configuration's flags, once the Deployment
//! has rolled out (a replica of the earlier configuration would publish again what is removed):
//! - `--volcano-hypernodes` off: this installation's HyperNodes go;
//! - `--kueue-topology` off: this installation's Kueue Topologies of the configured names go,
//!   but one a ResourceFlavor names is kept and reported (deleting it stops topology-aware
//!   admission);
//! - `--kai-topology` off: this installation's KAI Topologies of the configured name are kept and
//!   reported (workloads name them in annotations we cannot cheaply find).
//!
//! Only objects annotated as this installation's are touched (the chart's admission policy holds
//! the hook's ServiceAccount to that too); `uninstall` removes the rest.
//!
//! Owns: the command. The removals themselves are [`crate::cleanup`]'s.

use crate::bounds::{Bound, secs};
use std::{io::Write, time::Duration};

use clap::Args;
use k8s_openapi::api::apps::v1::Deployment;
use kube::{Api, Client};
use tracing::info;

use crate::{
    Error, Result,
    cleanup::{self, Item, Scope},
    flags::{HumanDuration, LeaderArgs, Output},
    leader::Leadership,
    publish::{PublishArgs, plugin::Purpose},
};

/// `--rollout-timeout`'s range.
pub(crate) const ROLLOUT_TIMEOUT_RANGE: Bound =
    Bound::duration("rollout-timeout", secs(0), secs(3600));

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
    #[arg(long, value_parser = ROLLOUT_TIMEOUT_RANGE.durations(), env = "LABELER_RETIRE_ROLLOUT_TIMEOUT", default_value = "5m")]
    pub(crate) rollout_timeout: HumanDuration,
    /// This installation (its Lease): only what is annotated as its own is retired.
    #[command(flatten)]
    pub leader: LeaderArgs,
    #[command(flatten)]
    pub output: Output,
}

/// What the features `publish` turns off left behind, as this installation's: to remove, or
/// kept with why.
pub async fn find(client: &Client, publish: &PublishArgs, installation: &str) -> Result<Vec<Item>> {
    Ok(cleanup::leftovers(
        client,
        Scope::Annotated(installation),
        Purpose::TurnedOff(publish),
    )
    .await?)
}

/// Whether `d` has rolled out as `kubectl rollout status` judges it: its spec observed, every
/// replica updated and available, none of an older ReplicaSet left.
pub(crate) fn rolled_out(d: &Deployment) -> bool {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(st) = &d.status else {
        return false;
    };
    st.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
        && st.updated_replicas.unwrap_or(0) >= want
        && st.replicas.unwrap_or(0) <= st.updated_replicas.unwrap_or(0)
        && st.available_replicas.unwrap_or(0) >= st.updated_replicas.unwrap_or(0)
}

async fn wait_for_rollout(client: &Client, at: &str, timeout: Duration) -> Result<()> {
    let Some((ns, name)) = at
        .split_once('/')
        .filter(|(n, d)| !n.is_empty() && !d.is_empty())
    else {
        return Err(Error::Config(format!(
            "--wait-for-rollout {at:?}: NAMESPACE/NAME of the controller's Deployment"
        )));
    };
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match api.get_opt(name).await? {
            // Nothing runs that could publish again.
            None => return Ok(()),
            Some(d) if rolled_out(&d) => return Ok(()),
            Some(_) if tokio::time::Instant::now() >= deadline => {
                return Err(Error::Config(format!(
                    "the Deployment {at} has not rolled out within {}: a replica of the earlier configuration may still publish what would be retired; nothing removed (run `ec2-topology-labeler retire` once it has)",
                    crate::duration::HumanDuration(timeout)
                )));
            }
            Some(_) => tokio::time::sleep(Duration::from_secs(2)).await,
        }
    }
}

pub async fn run(args: RetireArgs) -> Result<()> {
    let client = crate::client::connect_default().await?;
    if let Some(at) = &args.wait_for_rollout {
        wait_for_rollout(&client, at, args.rollout_timeout.0).await?;
    }
    let installation = crate::leader::installation(&args.leader, &client);
    let items = find(&client, &args.publish, &installation).await?;
    let applied = if args.dry_run {
        cleanup::Applied::default()
    } else {
        cleanup::apply(&client, &items, &Leadership::always()).await
    };
    let failed = &applied.failed;
    let removed = items.iter().filter(|i| i.kept.is_none()).count() - failed.len();
    info!(
        installation,
        removed,
        kept = items.iter().filter(|i| i.kept.is_some()).count(),
        failed = failed.len(),
        dry_run = args.dry_run,
        "retired what features now turned off published"
    );
    let out = cleanup::report(
        &items,
        &applied,
        args.dry_run,
        args.output.format,
        "nothing of this installation's left by a feature now turned off\n",
        serde_json::json!({ "installation": installation }),
    )?;
    std::io::stdout().write_all(out.as_bytes())?;
    cleanup::outcome(failed.len())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};
    use kube::api::ObjectMeta;

    use super::*;

    fn deployment(generation: i64, status: DeploymentStatus) -> Deployment {
        Deployment {
            metadata: ObjectMeta {
                generation: Some(generation),
                ..Default::default()
            },
            spec: Some(DeploymentSpec {
                replicas: Some(2),
                ..Default::default()
            }),
            status: Some(status),
        }
    }

    fn status(observed: i64, replicas: i32, updated: i32, available: i32) -> DeploymentStatus {
        DeploymentStatus {
            observed_generation: Some(observed),
            replicas: Some(replicas),
            updated_replicas: Some(updated),
            available_replicas: Some(available),
            ..Default::default()
        }
    }

    #[test]
    fn a_rollout_is_done_only_when_no_replica_of_the_earlier_configuration_is_left() {
        assert!(rolled_out(&deployment(3, status(3, 2, 2, 2))));
        // The new spec not yet observed.
        assert!(!rolled_out(&deployment(3, status(2, 2, 2, 2))));
        // An old replica still runs beside the two new ones.
        assert!(!rolled_out(&deployment(3, status(3, 3, 2, 3))));
        // One new replica not yet available.
        assert!(!rolled_out(&deployment(3, status(3, 2, 2, 1))));
        // Only one of two updated.
        assert!(!rolled_out(&deployment(3, status(3, 2, 1, 2))));
        // No status at all.
        let mut d = deployment(1, status(1, 2, 2, 2));
        d.status = None;
        assert!(!rolled_out(&d));
    }
}

//! Leader election on a `coordination.k8s.io/v1` Lease (`kube-lease-manager`, which takes and
//! renews the lock with server-side apply, so two replicas can never hold it at once).
//!
//! Every replica watches Nodes and stays ready; only the holder looks up EC2 and writes. On
//! becoming leader a replica re-checks every node at once, so nothing that changed during the
//! hand-over waits for the next resync.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::channel::mpsc::UnboundedSender;
use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseParams};
use tokio::{sync::watch, task::JoinHandle};
use tracing::{info, warn};

use crate::{Error, Result, config::LeaderArgs, metrics::Metrics};

/// The lease duration and renew grace in whole seconds, as the Lease records them; refused at
/// start-up (not a panic in the lease library) unless 1 s ≤ grace < duration.
pub fn lease_seconds(args: &LeaderArgs) -> Result<(u64, u64)> {
    let (d, g) = (
        args.leader_election_lease_duration.0,
        args.leader_election_renew_grace.0,
    );
    let whole = |x: Duration| x.subsec_nanos() == 0 && x.as_secs() >= 1;
    if !whole(d) || !whole(g) {
        return Err(Error::Config(format!(
            "the lease duration ({}) and renew grace ({}) must be whole seconds, at least 1s",
            humantime::format_duration(d),
            humantime::format_duration(g)
        )));
    }
    if g >= d {
        return Err(Error::Config(format!(
            "the renew grace ({}) must be shorter than the lease duration ({})",
            humantime::format_duration(g),
            humantime::format_duration(d)
        )));
    }
    Ok((d.as_secs(), g.as_secs()))
}

/// A running election. Dropping [`Election::stop`]'s future releases the lease.
pub struct Election {
    status: watch::Receiver<bool>,
    manager: JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
    follower: JoinHandle<()>,
}

impl Election {
    /// Join the election. `leader` mirrors whether we hold the lease; `elected` gets a message
    /// each time we acquire it.
    pub async fn start(
        client: Client,
        args: &LeaderArgs,
        identity: String,
        leader: Arc<AtomicBool>,
        metrics: Arc<Metrics>,
        elected: UnboundedSender<()>,
    ) -> Result<Self> {
        let namespace = args
            .leader_election_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let (duration, grace) = lease_seconds(args)?;
        let params = LeaseParams::new(identity.clone(), duration, grace)
            .with_field_manager(format!("{}-lease", crate::FIELD_MANAGER));
        let lease = &args.leader_election_lease_name;
        // The first Lease call may find a cluster still settling (a fresh cluster, an API server
        // restarting, RBAC not yet propagated): retry with backoff instead of exiting, so the pod
        // stays live (and not ready) rather than crash-looping.
        let mut delay = Duration::from_millis(500);
        let manager = loop {
            match LeaseManagerBuilder::new(client.clone(), lease)
                .with_namespace(&namespace)
                .with_parameters(params.clone())
                .build()
                .await
            {
                Ok(m) => break m,
                Err(e) => {
                    warn!(error = %e, lease = %format!("{namespace}/{lease}"), retry_in_ms = delay.as_millis() as u64,
                        "cannot reach the leader-election Lease yet; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
        };
        leader.store(false, Ordering::SeqCst);
        metrics.set_leader(false);
        info!(%identity, lease = %args.leader_election_lease_name, %namespace, "joined leader election");
        let (status, manager) = manager.watch().await;
        let mut changes = status.clone();
        let follower = tokio::spawn(async move {
            loop {
                let is_leader = *changes.borrow_and_update();
                if leader.swap(is_leader, Ordering::SeqCst) != is_leader {
                    metrics.set_leader(is_leader);
                    if is_leader {
                        info!(%identity, "became leader: looking up EC2 and writing labels");
                        let _ = elected.unbounded_send(());
                    } else {
                        warn!(%identity, "lost leadership: no longer writing");
                    }
                }
                if changes.changed().await.is_err() {
                    leader.store(false, Ordering::SeqCst);
                    metrics.set_leader(false);
                    return;
                }
            }
        });
        Ok(Self {
            status,
            manager,
            follower,
        })
    }

    /// Leave the election, releasing the lease if we hold it, so a follower takes over at once.
    pub async fn stop(self) {
        self.follower.abort();
        let _ = self.follower.await;
        // The last receiver gone, the manager releases the lease and returns.
        drop(self.status);
        match tokio::time::timeout(Duration::from_secs(5), self.manager).await {
            Ok(Ok(Ok(_))) => info!("lease released"),
            Ok(Ok(Err(e))) => {
                warn!(error = %e, "releasing the lease failed; it expires on its own")
            }
            Ok(Err(e)) => warn!(error = %e, "lease task failed"),
            Err(_) => warn!("releasing the lease timed out; it expires on its own"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HumanDuration;

    fn args(duration: &str, grace: &str) -> LeaderArgs {
        LeaderArgs {
            leader_election: true,
            leader_election_namespace: None,
            leader_election_lease_name: "l".into(),
            leader_election_lease_duration: duration.parse::<HumanDuration>().expect("duration"),
            leader_election_renew_grace: grace.parse::<HumanDuration>().expect("grace"),
            identity: None,
        }
    }

    #[test]
    fn lease_settings_the_lease_library_would_panic_on_are_configuration_errors() {
        assert_eq!(lease_seconds(&args("15s", "5s")).ok(), Some((15, 5)));
        for (d, g) in [
            ("5s", "5s"),
            ("5s", "10s"),
            ("1500ms", "1s"),
            ("10s", "500ms"),
            ("10s", "0s"),
        ] {
            let e = lease_seconds(&args(d, g)).expect_err(&format!("{d}/{g} refused"));
            assert_eq!(e.category(), "config", "{d}/{g}: {e}");
        }
    }
}

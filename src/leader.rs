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
        let secs = |d: Duration| d.as_secs().max(1);
        let params = LeaseParams::new(
            identity.clone(),
            secs(args.leader_election_lease_duration.0),
            secs(args.leader_election_renew_grace.0),
        )
        .with_field_manager(format!("{}-lease", crate::FIELD_MANAGER));
        let manager = LeaseManagerBuilder::new(client, &args.leader_election_lease_name)
            .with_namespace(&namespace)
            .with_parameters(params)
            .build()
            .await
            .map_err(|e| {
                Error::Config(format!(
                    "leader election on Lease {namespace}/{}: {e}",
                    args.leader_election_lease_name
                ))
            })?;
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

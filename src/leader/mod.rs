//! Leader election on a `coordination.k8s.io/v1` Lease, following client-go's `leaderelection`
//! protocol, with its renew deadline:
//!
//! - a candidate takes the Lease when it is free, released, or has not changed for a whole lease
//!   duration *as observed on this replica's own clock* (never by comparing another replica's
//!   timestamps with ours, so clock skew between nodes does not matter);
//! - every write to the Lease is a `create` when there is none or a `replace` carrying the
//!   resourceVersion that was read, so two candidates can never both win: the second gets a
//!   conflict;
//! - the leader renews every retry period and **stops acting as leader on its own** once its last
//!   successful renewal is older than the renew deadline (lease duration − renew grace), whether
//!   renewals fail with errors, 403s or hang. The deadline is shorter than the lease duration, so
//!   a leader cut off from the API server has stopped before any other replica can take over.
//!
//! [`Leadership::is_leader`] is what every writer asks, right before it writes. Every replica
//! watches Nodes and stays ready; only the leader looks up EC2 and writes. On becoming leader a
//! replica re-checks every node at once.
//!
//! (kube-lease-manager, used before, reports leadership only after a successful sync: a leader
//! whose renewals failed kept acting after another replica took over.)
//!
//! Owns: whether this replica leads. Never writes anything but its Lease (see `lease`).

use crate::bounds::{Bound, secs};
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use clap::Args;
use futures::channel::mpsc::UnboundedSender;
use kube::{Api, Client};
use tokio::{task::JoinHandle, time::Instant};
use tracing::{debug, info, warn};

use crate::{Error, Result, duration::HumanDuration, metrics::Metrics};
use lease::Candidate;

mod lease;
#[cfg(test)]
mod tests;

/// `--leader-election-lease-duration`'s range.
pub(crate) const LEADER_ELECTION_LEASE_DURATION_RANGE: Bound =
    Bound::duration("leader-election-lease-duration", secs(1), secs(3600));
/// `--leader-election-renew-grace`'s range.
pub(crate) const LEADER_ELECTION_RENEW_GRACE_RANGE: Bound =
    Bound::duration("leader-election-renew-grace", secs(1), secs(3600));

/// Leader election, for running more than one replica (the chart sets these).
#[derive(Debug, Clone, Args, PartialEq)]
pub struct LeaderArgs {
    /// Elect a leader on a Lease; only the leader looks up EC2 and writes. Needed with more than
    /// one replica.
    #[arg(long, env = "LABELER_LEADER_ELECTION", default_value_t = false, action = clap::ArgAction::Set)]
    pub(crate) leader_election: bool,
    /// Namespace of the Lease, and of the verification ledger beside it (default: the namespace
    /// the controller runs in; outside a Pod, the kubeconfig's).
    #[arg(long, env = "LABELER_LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Name of the Lease; the verification ledger's shards are named after it
    /// (`NAME-records-00` … `-63`).
    #[arg(
        long,
        env = "LABELER_LEADER_ELECTION_LEASE_NAME",
        default_value = "ec2-topology-labeler"
    )]
    pub leader_election_lease_name: String,
    /// How long a leader's lease lasts without renewal: the longest a failover takes.
    #[arg(
        long,
        value_parser = LEADER_ELECTION_LEASE_DURATION_RANGE.durations(),
        env = "LABELER_LEADER_ELECTION_LEASE_DURATION",
        default_value = "15s"
    )]
    pub(crate) leader_election_lease_duration: HumanDuration,
    /// The margin between the leader stopping and another replica taking over: the leader
    /// stops writing, and cuts off its writes in flight, once it could not renew for the lease
    /// duration less this (the renew deadline, which must hold three renewals, one every half
    /// of this, at most 2s).
    #[arg(
        long,
        value_parser = LEADER_ELECTION_RENEW_GRACE_RANGE.durations(),
        env = "LABELER_LEADER_ELECTION_RENEW_GRACE",
        default_value = "5s"
    )]
    pub(crate) leader_election_renew_grace: HumanDuration,
    /// This replica's identity in the election (the chart passes the Pod name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

/// The namespace of the Lease: `--leader-election-namespace`, else the client's (the Pod's).
pub(crate) fn lease_namespace(args: &LeaderArgs, client: &Client) -> String {
    args.leader_election_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string())
}

/// This installation's identity, `<namespace>/<name>` of its Lease: two installations in one
/// cluster never share one (they would be one election). Marked on published objects that two
/// installations could both name.
pub fn installation(args: &LeaderArgs, client: &Client) -> String {
    format!(
        "{}/{}",
        lease_namespace(args, client),
        args.leader_election_lease_name
    )
}

/// The lease duration and renew grace, refused at start-up unless 1 s ≤ grace < duration in
/// whole seconds (the Lease records whole seconds).
pub(crate) fn lease_seconds(args: &LeaderArgs) -> Result<(u64, u64)> {
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

/// The election's timings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// How long a Lease nobody renews stays held.
    pub lease_duration: Duration,
    /// The leader stops acting once its last successful renewal is older than this.
    pub renew_deadline: Duration,
    /// How often the leader renews and candidates look.
    pub retry_period: Duration,
}

impl Timings {
    /// From the flags: renew deadline = duration − grace; renewals every grace / 2 (at most 2 s,
    /// client-go's period). Refused unless [`RENEWALS_PER_DEADLINE`] renewal attempts fit in the
    /// deadline: with fewer, one slow or failed renewal makes the leader step down (it flaps).
    pub fn from_args(args: &LeaderArgs) -> Result<Self> {
        let (duration, grace) = lease_seconds(args)?;
        let grace = Duration::from_secs(grace);
        let t = Self {
            lease_duration: Duration::from_secs(duration),
            renew_deadline: Duration::from_secs(duration) - grace,
            retry_period: (grace / 2).clamp(Duration::from_millis(200), Duration::from_secs(2)),
        };
        // Each attempt starts a retry period after the one before ended: the last of N starts
        // at N periods and needs one more to finish.
        if t.renew_deadline < t.retry_period * (RENEWALS_PER_DEADLINE + 1) {
            return Err(Error::Config(format!(
                "the renew deadline (lease duration {} − renew grace {} = {}) must hold {RENEWALS_PER_DEADLINE} renewal attempts, each a retry period ({}: half the grace, at most 2s) after the last and given one to finish: lengthen the lease duration to at least {} or shorten the grace",
                HumanDuration(t.lease_duration),
                HumanDuration(grace),
                HumanDuration(t.renew_deadline),
                HumanDuration(t.retry_period),
                HumanDuration(Duration::from_secs(
                    (grace + t.retry_period * (RENEWALS_PER_DEADLINE + 1))
                        .as_secs_f64()
                        .ceil() as u64
                )),
            )));
        }
        Ok(t)
    }
}

/// How many renewal attempts the renew deadline must hold, each with a retry period to finish
/// (client-go asks for more than one jittered retry period; we ask for three, so two can fail
/// or hang and the third still renews in time).
pub const RENEWALS_PER_DEADLINE: u32 = 3;

/// Whether this replica may act as leader, shared by everything that looks EC2 up or writes.
#[derive(Clone, Debug)]
pub struct Leadership {
    state: Arc<State>,
}

#[derive(Debug)]
struct State {
    /// Without election: always leader.
    always: bool,
    /// We hold the Lease (as far as the last successful read or write said).
    holding: AtomicBool,
    /// When the request of our last successful acquire or renew was sent.
    renewed_at: Mutex<Option<Instant>>,
    renew_deadline: Duration,
    /// Told each time leadership is renewed or lost (see [`Leadership::lost`]).
    changed: tokio::sync::watch::Sender<()>,
}

/// Until when this replica may still have a write land (see [`Leadership::fence`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    /// No election: a single replica, nothing to fence against.
    Unfenced,
    /// Leading until this instant (its renew deadline) unless renewed before.
    Until(Instant),
    /// Leading until told otherwise (tests).
    UntilSteppedDown,
    /// Not leading.
    Lost,
}

impl Leadership {
    /// A single replica without election: always leader.
    pub fn always() -> Self {
        Self::new(true, Duration::MAX)
    }

    /// A replica that does not lead (until an election says otherwise).
    pub fn follower() -> Self {
        Self::new(false, Duration::ZERO)
    }

    fn new(always: bool, renew_deadline: Duration) -> Self {
        Self {
            state: Arc::new(State {
                always,
                holding: AtomicBool::new(false),
                renewed_at: Mutex::new(None),
                renew_deadline,
                changed: tokio::sync::watch::Sender::new(()),
            }),
        }
    }

    /// Returns once this replica leads and `synced` holds (the node cache has its first list),
    /// looking every `poll`: what the leader's start-up tasks wait for.
    pub(crate) async fn leading_with(
        &self,
        synced: &std::sync::atomic::AtomicBool,
        poll: std::time::Duration,
    ) {
        while !(self.is_leader() && synced.load(Ordering::SeqCst)) {
            tokio::time::sleep(poll).await;
        }
    }

    /// May we act as leader right now? Checked again right before every write.
    pub(crate) fn is_leader(&self) -> bool {
        if self.state.always {
            return true;
        }
        self.state.holding.load(Ordering::SeqCst)
            && self
                .renewed_at()
                .is_some_and(|at| at.elapsed() < self.state.renew_deadline)
    }

    /// Until when a write sent now may land: this replica's renew deadline. The deadline is
    /// the lease duration less the renew grace after the last renewal was sent, so a write cut
    /// off at it ends at least the grace before another replica can take the Lease over.
    pub fn fence(&self) -> Fence {
        if self.state.always {
            return Fence::Unfenced;
        }
        if !self.state.holding.load(Ordering::SeqCst) {
            return Fence::Lost;
        }
        let Some(at) = self.renewed_at() else {
            return Fence::Lost;
        };
        match at.checked_add(self.state.renew_deadline) {
            Some(deadline) if deadline > Instant::now() => Fence::Until(deadline),
            Some(_) => Fence::Lost,
            None => Fence::UntilSteppedDown,
        }
    }

    /// Completes once this replica no longer leads: its renew deadline passed without a
    /// renewal, or it lost the Lease. Never completes without election.
    pub async fn lost(&self) {
        let mut changed = self.state.changed.subscribe();
        loop {
            changed.borrow_and_update();
            match self.fence() {
                Fence::Lost => return,
                Fence::Unfenced => std::future::pending::<()>().await,
                Fence::UntilSteppedDown => {
                    let _ = changed.changed().await;
                }
                Fence::Until(deadline) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(deadline) => {}
                        _ = changed.changed() => {}
                    }
                }
            }
        }
    }

    /// Leading until [`Leadership::step_down`]: for tests of a writer whose lease is lost
    /// while it works.
    #[doc(hidden)]
    pub fn leading_until_stepped_down() -> Self {
        let l = Self::new(false, Duration::MAX);
        l.renewed(Instant::now());
        l
    }

    /// Stop leading (see [`Leadership::leading_until_stepped_down`]).
    #[doc(hidden)]
    pub fn step_down(&self) {
        self.stopped();
    }

    fn renewed_at(&self) -> Option<Instant> {
        *self
            .state
            .renewed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn renewed(&self, sent_at: Instant) {
        *self
            .state
            .renewed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(sent_at);
        self.state.holding.store(true, Ordering::SeqCst);
        self.state.changed.send_replace(());
    }

    fn stopped(&self) {
        self.state.holding.store(false, Ordering::SeqCst);
        self.state.changed.send_replace(());
    }
}

/// A running election.
pub(crate) struct Election {
    task: JoinHandle<()>,
    candidate: Candidate,
}

impl Election {
    /// Join the election on Lease `namespace/name`. `elected` gets a message each time this
    /// replica becomes leader.
    pub(crate) fn start(
        client: Client,
        args: &LeaderArgs,
        identity: String,
        metrics: Arc<Metrics>,
        elected: UnboundedSender<()>,
        alive: crate::tasks::TaskGuard,
    ) -> Result<(Self, Leadership)> {
        let timings = Timings::from_args(args)?;
        let namespace = lease_namespace(args, &client);
        let leadership = Leadership::new(false, timings.renew_deadline);
        metrics.set_leader(false);
        let candidate = Candidate {
            api: Api::namespaced(client, &namespace),
            name: args.leader_election_lease_name.clone(),
            identity,
            timings,
            leadership: leadership.clone(),
        };
        info!(identity = %candidate.identity, lease = %format!("{namespace}/{}", candidate.name),
            renew_deadline_ms = timings.renew_deadline.as_millis() as u64, "joined leader election");
        let running = candidate.clone();
        let task = tokio::spawn(async move {
            let _alive = alive;
            running.run(metrics, elected).await;
        });
        Ok((Self { task, candidate }, leadership))
    }

    /// Leave the election and release the Lease if we hold it, so another replica takes over
    /// at once.
    pub(crate) async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
        let was_leader = self.candidate.leadership.is_leader();
        self.candidate.leadership.stopped();
        if !was_leader {
            return;
        }
        match tokio::time::timeout(Duration::from_secs(5), self.candidate.release()).await {
            Ok(Ok(true)) => info!("lease released"),
            Ok(Ok(false)) => debug!("the lease was no longer ours to release"),
            Ok(Err(e)) => warn!(error = %e, "releasing the lease failed; it expires on its own"),
            Err(_) => warn!("releasing the lease timed out; it expires on its own"),
        }
    }
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("lease", &self.candidate.api.resource_url())
            .finish()
    }
}

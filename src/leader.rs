//! Leader election on a `coordination.k8s.io/v1` Lease, following client-go's `leaderelection`
//! protocol, with its renew deadline:
//!
//! - a candidate takes the Lease when it is free, released, or has not changed for a whole lease
//!   duration *as observed on this replica's own clock* (never by comparing another replica's
//!   timestamps with ours, so clock skew between nodes does not matter);
//! - every write to the Lease is a `replace` carrying the resourceVersion that was read, so two
//!   candidates can never both win: the second gets a conflict;
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

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{Api, Client, api::PostParams};
use tokio::{task::JoinHandle, time::Instant};
use tracing::{debug, error, info, warn};

use crate::{Error, Result, config::LeaderArgs, metrics::Metrics};

/// The lease duration and renew grace, refused at start-up unless 1 s ≤ grace < duration in
/// whole seconds (the Lease records whole seconds).
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
    /// client-go's period), so several renewals fit in the deadline.
    pub fn from_args(args: &LeaderArgs) -> Result<Self> {
        let (duration, grace) = lease_seconds(args)?;
        let grace = Duration::from_secs(grace);
        Ok(Self {
            lease_duration: Duration::from_secs(duration),
            renew_deadline: Duration::from_secs(duration) - grace,
            retry_period: (grace / 2).clamp(Duration::from_millis(200), Duration::from_secs(2)),
        })
    }
}

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
            }),
        }
    }

    /// May we act as leader right now? Checked again right before every write.
    pub fn is_leader(&self) -> bool {
        if self.state.always {
            return true;
        }
        self.state.holding.load(Ordering::SeqCst)
            && self
                .renewed_at()
                .is_some_and(|at| at.elapsed() < self.state.renew_deadline)
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
    }

    fn lost(&self) {
        self.state.holding.store(false, Ordering::SeqCst);
    }
}

/// A running election.
pub struct Election {
    task: JoinHandle<()>,
    candidate: Candidate,
}

#[derive(Clone)]
struct Candidate {
    api: Api<Lease>,
    name: String,
    identity: String,
    timings: Timings,
    leadership: Leadership,
}

/// The Lease as we last read it, and when (on our clock) we first saw it in that state.
struct Observed {
    spec: LeaseSpec,
    at: Instant,
}

enum Attempt {
    /// We hold the Lease; the write that says so was sent at this instant.
    Held(Instant),
    /// Someone else holds it.
    Other(String),
}

impl Election {
    /// Join the election on Lease `namespace/name`. `elected` gets a message each time this
    /// replica becomes leader.
    pub fn start(
        client: Client,
        args: &LeaderArgs,
        identity: String,
        metrics: Arc<Metrics>,
        elected: UnboundedSender<()>,
        alive: crate::http::TaskGuard,
    ) -> Result<(Self, Leadership)> {
        let timings = Timings::from_args(args)?;
        let namespace = args
            .leader_election_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
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
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
        let was_leader = self.candidate.leadership.is_leader();
        self.candidate.leadership.lost();
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

impl Candidate {
    async fn run(self, metrics: Arc<Metrics>, elected: UnboundedSender<()>) {
        let mut observed: Option<Observed> = None;
        let mut denied_logged = false;
        loop {
            // Candidate: look every retry period (jittered) until the Lease is ours.
            match self.try_acquire(&mut observed).await {
                Ok(Attempt::Held(sent_at)) => {
                    self.leadership.renewed(sent_at);
                    metrics.set_leader(true);
                    info!(identity = %self.identity, "became leader: looking up EC2 and writing labels");
                    let _ = elected.unbounded_send(());
                    self.hold(sent_at).await;
                    self.leadership.lost();
                    metrics.set_leader(false);
                    observed = None;
                    denied_logged = false;
                }
                Ok(Attempt::Other(holder)) => {
                    debug!(%holder, "the lease is held by another replica");
                }
                Err(kube::Error::Api(e)) if e.code == 401 || e.code == 403 => {
                    if !std::mem::replace(&mut denied_logged, true) {
                        error!(error = %e, lease = %self.name, "not allowed to use the leader-election Lease: the ServiceAccount needs get, update and create on leases (the chart's Role); retrying");
                    }
                }
                Err(e) => {
                    warn!(error = %e, lease = %self.name, "cannot reach the leader-election Lease; retrying")
                }
            }
            let jitter = 1.0 + fastrand::f64() * 0.2;
            tokio::time::sleep(self.timings.retry_period.mul_f64(jitter)).await;
        }
    }

    /// Renew every retry period until the Lease is lost or the renew deadline passes.
    async fn hold(&self, mut renewed_at: Instant) {
        loop {
            tokio::time::sleep(self.timings.retry_period).await;
            // A renewal that hangs must not keep us leader past the deadline.
            let remaining = self
                .timings
                .renew_deadline
                .saturating_sub(renewed_at.elapsed());
            let sent_at = Instant::now();
            match tokio::time::timeout(remaining, self.renew()).await {
                Ok(Ok(true)) => {
                    renewed_at = sent_at;
                    self.leadership.renewed(sent_at);
                }
                Ok(Ok(false)) => {
                    warn!(identity = %self.identity, "lost leadership: another replica holds the lease; no longer writing");
                    return;
                }
                Ok(Err(e)) if renewed_at.elapsed() < self.timings.renew_deadline => {
                    warn!(error = %e, "renewing the lease failed; retrying until the renew deadline");
                }
                Ok(Err(e)) => {
                    warn!(error = %e, deadline_ms = self.timings.renew_deadline.as_millis() as u64,
                        "lost leadership: no successful lease renewal within the renew deadline; no longer writing");
                    return;
                }
                Err(_) => {
                    warn!(
                        deadline_ms = self.timings.renew_deadline.as_millis() as u64,
                        "lost leadership: the lease renewal did not complete within the renew deadline; no longer writing"
                    );
                    return;
                }
            }
        }
    }

    fn spec(&self, previous: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
        let ours = previous.is_some_and(|p| p.holder_identity.as_deref() == Some(&self.identity));
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.timings.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: if ours {
                previous.and_then(|p| p.acquire_time.clone())
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: match previous {
                None => Some(0),
                Some(p) if ours => p.lease_transitions,
                Some(p) => Some(p.lease_transitions.unwrap_or(0).saturating_add(1)),
            },
            ..LeaseSpec::default()
        }
    }

    async fn try_acquire(&self, observed: &mut Option<Observed>) -> Result<Attempt, kube::Error> {
        let sent_at = Instant::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(None, Timestamp::now())),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Held(sent_at)),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Other(String::new())),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.take().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        if let Some(holder) = holder.as_deref()
            && holder != self.identity
        {
            // Held by another replica: it is expired only once it has not changed for a whole
            // lease duration on our clock.
            let duration = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map_or(self.timings.lease_duration, Duration::from_secs);
            match observed {
                Some(o) if o.spec == spec => {
                    if o.at.elapsed() < duration {
                        return Ok(Attempt::Other(holder.to_string()));
                    }
                    info!(%holder, "the lease was not renewed for its whole duration; taking it over");
                }
                _ => {
                    *observed = Some(Observed {
                        spec,
                        at: Instant::now(),
                    });
                    return Ok(Attempt::Other(holder.to_string()));
                }
            }
        }
        lease.spec = Some(self.spec(Some(&spec), Timestamp::now()));
        // `replace` carries the resourceVersion we read: if anyone wrote the Lease since, this
        // fails with a conflict instead of making two leaders.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Attempt::Held(sent_at)),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Other(String::new())),
            Err(e) => Err(e),
        }
    }

    /// One renewal: `Ok(false)` when the Lease is no longer ours.
    async fn renew(&self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let spec = lease.spec.take().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(&self.identity) {
            return Ok(false);
        }
        lease.spec = Some(self.spec(Some(&spec), Timestamp::now()));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                // Written meanwhile: ours only if a re-read still says so (next renewal).
                let now_holder = self
                    .api
                    .get_opt(&self.name)
                    .await?
                    .and_then(|l| l.spec)
                    .and_then(|s| s.holder_identity);
                Ok(now_holder.as_deref() == Some(&self.identity))
            }
            Err(e) => Err(e),
        }
    }

    /// Give the Lease up (holder cleared), if it is still ours.
    async fn release(&self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let spec = lease.spec.take().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(&self.identity) {
            return Ok(false);
        }
        lease.spec = Some(LeaseSpec {
            lease_transitions: spec.lease_transitions,
            ..LeaseSpec::default()
        });
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HumanDuration;
    use http::{Method, Request, Response, StatusCode};
    use kube::client::Body;
    use serde_json::{Value, json};

    fn args(duration: &str, grace: &str) -> LeaderArgs {
        LeaderArgs {
            leader_election: true,
            leader_election_namespace: Some("ns".into()),
            leader_election_lease_name: "lease".into(),
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
        let t = Timings::from_args(&args("15s", "5s")).expect("timings");
        assert_eq!(
            (t.lease_duration, t.renew_deadline, t.retry_period),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2)
            )
        );
    }

    /// The Lease at version `rv`; each version has its own renewTime, as each renewal writes.
    fn lease(holder: &str, rv: u64) -> Value {
        let renewed = format!(
            "2026-11-30T{:02}:{:02}:{:02}.000000Z",
            rv / 3600 % 24,
            rv / 60 % 60,
            rv % 60
        );
        json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": { "name": "lease", "namespace": "ns", "resourceVersion": rv.to_string() },
            "spec": { "holderIdentity": holder, "leaseDurationSeconds": 6, "renewTime": renewed }
        })
    }

    fn status(code: u16) -> Value {
        let reason = match code {
            404 => "NotFound",
            409 => "Conflict",
            _ => "InternalError",
        };
        json!({ "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": "etcd is sad" })
    }

    /// An API server for the one Lease: `answer(method, request number)` decides each response.
    fn api(
        mut answer: impl FnMut(&Method, usize) -> (StatusCode, Value) + Send + 'static,
    ) -> Client {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        tokio::spawn(async move {
            let mut n = 0;
            while let Some((req, send)) = handle.next_request().await {
                n += 1;
                let (code, body) = answer(req.method(), n);
                send.send_response(
                    Response::builder()
                        .status(code)
                        .body(Body::from(serde_json::to_vec(&body).expect("json")))
                        .expect("response"),
                );
            }
        });
        Client::new(service, "ns")
    }

    fn start(client: Client) -> (Election, Leadership) {
        let (tx, _rx) = futures::channel::mpsc::unbounded();
        let (election, leadership) = Election::start(
            client,
            &args("6s", "2s"),
            "me".into(),
            Arc::new(Metrics::default()),
            tx,
            crate::http::Liveness::default().task("leader election"),
        )
        .expect("election");
        (election, leadership)
    }

    /// The Lease API answers 500 to every renewal: the leader stops acting before the lease
    /// duration has passed since its last successful renewal (when another replica could take
    /// over), and never acts again while renewals fail.
    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_renewals_fail_stops_before_its_lease_expires() {
        let client = api(|method, n| match (method, n) {
            (&Method::GET, 1) => (StatusCode::NOT_FOUND, status(404)),
            (&Method::POST, 2) => (StatusCode::CREATED, lease("me", 1)),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, status(500)),
        });
        let (election, leadership) = start(client);
        let started = Instant::now();
        while !leadership.is_leader() {
            assert!(started.elapsed() < Duration::from_secs(5), "never elected");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let elected = Instant::now();
        while leadership.is_leader() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let stopped_after = elected.elapsed();
        assert!(
            stopped_after <= Duration::from_secs(4) + Duration::from_millis(100),
            "acted for {stopped_after:?} without a renewal (renew deadline 4 s, lease 6 s)"
        );
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!leadership.is_leader(), "leader again while renewals fail");
        election.stop().await;
    }

    /// A cluster still settling: the first Lease calls fail (connection errors, 5xx, 403 while
    /// RBAC propagates). The election keeps trying — start-up never fails for it — and leads
    /// once the API server answers.
    #[tokio::test(start_paused = true)]
    async fn lease_errors_at_start_are_retried_until_the_api_server_answers() {
        let client = api(|method, n| match (method, n) {
            (_, 1..=3) => (StatusCode::SERVICE_UNAVAILABLE, status(503)),
            (_, 4..=5) => (StatusCode::FORBIDDEN, status(403)),
            (&Method::GET, _) => (StatusCode::NOT_FOUND, status(404)),
            (&Method::POST, _) => (StatusCode::CREATED, lease("me", 1)),
            _ => (StatusCode::OK, lease("me", 2)),
        });
        let (election, leadership) = start(client);
        let started = Instant::now();
        while !leadership.is_leader() {
            assert!(started.elapsed() < Duration::from_secs(30), "never elected");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        election.stop().await;
    }

    /// A renewal that hangs (a partition) counts as failed at the deadline.
    #[tokio::test(start_paused = true)]
    async fn a_leader_whose_renewals_hang_stops_at_the_deadline() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        tokio::spawn(async move {
            let mut n = 0;
            while let Some((_req, send)) = handle.next_request().await {
                n += 1;
                let (code, body) = match n {
                    1 => (StatusCode::NOT_FOUND, status(404)),
                    2 => (StatusCode::CREATED, lease("me", 1)),
                    _ => {
                        // Never answered.
                        std::mem::forget(send);
                        continue;
                    }
                };
                send.send_response(
                    Response::builder()
                        .status(code)
                        .body(Body::from(serde_json::to_vec(&body).expect("json")))
                        .expect("response"),
                );
            }
        });
        let (election, leadership) = start(Client::new(service, "ns"));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(leadership.is_leader());
        tokio::time::sleep(Duration::from_millis(4100)).await;
        assert!(
            !leadership.is_leader(),
            "still leader past the renew deadline"
        );
        election.stop().await;
    }

    /// Another replica holds the Lease and keeps renewing it: we never lead. When it stops
    /// renewing, we take over only after a whole lease duration without change on our clock.
    #[tokio::test(start_paused = true)]
    async fn a_held_lease_is_taken_only_after_a_whole_duration_unchanged() {
        let renewing = Arc::new(AtomicBool::new(true));
        let last_renewal = Arc::new(std::sync::Mutex::new(Instant::now()));
        let (still, renewed) = (renewing.clone(), last_renewal.clone());
        let rv = Arc::new(std::sync::atomic::AtomicU64::new(1));
        let client = api(move |method, _| match *method {
            Method::GET => {
                if still.load(Ordering::SeqCst) {
                    // The other replica renewed since the last read.
                    rv.fetch_add(1, Ordering::SeqCst);
                    *renewed.lock().unwrap() = Instant::now();
                }
                (StatusCode::OK, lease("other", rv.load(Ordering::SeqCst)))
            }
            Method::PUT => (StatusCode::OK, lease("me", 99)),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, status(500)),
        });
        let (election, leadership) = start(client);
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(
            !leadership.is_leader(),
            "took a lease that was being renewed"
        );
        renewing.store(false, Ordering::SeqCst);
        let stopped = Instant::now();
        while !leadership.is_leader() {
            assert!(
                stopped.elapsed() < Duration::from_secs(12),
                "never took over"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let unchanged_for = last_renewal.lock().unwrap().elapsed();
        assert!(
            unchanged_for >= Duration::from_secs(6),
            "took over when the lease had been unchanged for {unchanged_for:?}, less than its duration"
        );
        election.stop().await;
    }
}

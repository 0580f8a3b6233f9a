//! The Lease protocol (client-go's `leaderelection`): acquire when free, released, or unchanged
//! for a whole lease duration on our own clock; a `create` when there is none (a second creator
//! gets a conflict), else a `replace` carrying the resourceVersion read; renew every retry
//! period; give up at the renew deadline.
//!
//! Owns: the Lease object. Never touches anything else.

use std::{sync::Arc, time::Duration};

use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{Api, api::PostParams};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::{Leadership, Timings};
use crate::metrics::Metrics;

#[derive(Clone)]
pub(super) struct Candidate {
    pub(super) api: Api<Lease>,
    pub(super) name: String,
    pub(super) identity: String,
    pub(super) timings: Timings,
    pub(super) leadership: Leadership,
}

/// The Lease as we last read it, and when (on our clock) we first saw it in that state.
struct Observed {
    spec: LeaseSpec,
    at: Instant,
}

/// Now, to the microsecond: the API server keeps a Lease's times to the microsecond, so what
/// it returns equals what we sent only so.
fn now_micros() -> Timestamp {
    let now = Timestamp::now();
    Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now)
}

/// The Lease the API server returned holds what we wrote: our identity and our `renewTime`.
/// Leadership is judged by the Lease itself, not by the call having returned.
fn carries(stored: &Lease, wanted: &LeaseSpec) -> bool {
    stored.spec.as_ref().is_some_and(|s| {
        s.holder_identity == wanted.holder_identity && s.renew_time == wanted.renew_time
    })
}

/// What one renewal did.
enum Renewal {
    /// The Lease now carries our renewal.
    Renewed,
    /// Another replica holds the Lease, or it is gone.
    Lost,
    /// Still ours as far as we know, but this renewal did not move `renewTime`.
    NotRenewed(&'static str),
}

enum Attempt {
    /// We hold the Lease; the write that says so was sent at this instant.
    Held(Instant),
    /// Someone else holds it.
    Other(String),
}

impl Candidate {
    pub(super) async fn run(self, metrics: Arc<Metrics>, elected: UnboundedSender<()>) {
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
                    self.leadership.stopped();
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
            // One attempt that hangs (a pooled connection to a dead API server) must not take
            // the whole deadline: each gets a retry period, so the next starts in time.
            let limit = remaining.min(self.timings.retry_period);
            let sent_at = Instant::now();
            match tokio::time::timeout(limit, self.renew()).await {
                Ok(Ok(Renewal::Renewed)) => {
                    renewed_at = sent_at;
                    self.leadership.renewed(sent_at);
                }
                Ok(Ok(Renewal::Lost)) => {
                    warn!(identity = %self.identity, "lost leadership: another replica holds the lease; no longer writing");
                    return;
                }
                Ok(Ok(Renewal::NotRenewed(why)))
                    if renewed_at.elapsed() < self.timings.renew_deadline =>
                {
                    warn!(
                        why,
                        "the lease was not renewed; retrying until the renew deadline"
                    );
                }
                Ok(Err(e)) if renewed_at.elapsed() < self.timings.renew_deadline => {
                    warn!(error = %e, "renewing the lease failed; retrying until the renew deadline");
                }
                Ok(Ok(Renewal::NotRenewed(why))) => {
                    warn!(
                        why,
                        deadline_ms = self.timings.renew_deadline.as_millis() as u64,
                        "lost leadership: no successful lease renewal within the renew deadline; no longer writing"
                    );
                    return;
                }
                Ok(Err(e)) => {
                    warn!(error = %e, deadline_ms = self.timings.renew_deadline.as_millis() as u64,
                        "lost leadership: no successful lease renewal within the renew deadline; no longer writing");
                    return;
                }
                Err(_) if renewed_at.elapsed() < self.timings.renew_deadline => {
                    warn!(
                        limit_ms = limit.as_millis() as u64,
                        "a lease renewal did not complete in time; retrying until the renew deadline"
                    );
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
            let wanted = self.spec(None, now_micros());
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(wanted.clone()),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(stored) if carries(&stored, &wanted) => Ok(Attempt::Held(sent_at)),
                Ok(_) => Ok(Attempt::Other(String::new())),
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
        let wanted = self.spec(Some(&spec), now_micros());
        lease.spec = Some(wanted.clone());
        // `replace` carries the resourceVersion we read: if anyone wrote the Lease since, this
        // fails with a conflict instead of making two leaders.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(stored) if carries(&stored, &wanted) => Ok(Attempt::Held(sent_at)),
            Ok(_) => Ok(Attempt::Other(String::new())),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Attempt::Other(String::new())),
            Err(e) => Err(e),
        }
    }

    /// One renewal, judged by the Lease the API server returns: renewed only when it holds our
    /// identity and the very `renewTime` we wrote. A conflict means someone wrote the Lease since
    /// we read it: not a renewal, whoever holds it now (the next attempt reads it again).
    async fn renew(&self) -> Result<Renewal, kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(Renewal::Lost);
        };
        let spec = lease.spec.take().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(&self.identity) {
            return Ok(Renewal::Lost);
        }
        // The API server keeps microseconds: what it returns equals what we sent only so.
        let wanted = self.spec(Some(&spec), now_micros());
        lease.spec = Some(wanted.clone());
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(stored) if carries(&stored, &wanted) => Ok(Renewal::Renewed),
            Ok(_) => Ok(Renewal::NotRenewed(
                "the Lease returned does not carry our renewTime",
            )),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Renewal::NotRenewed(
                "the Lease changed since it was read (conflict)",
            )),
            Err(e) => Err(e),
        }
    }

    /// Give the Lease up (holder cleared), if it is still ours.
    pub(super) async fn release(&self) -> Result<bool, kube::Error> {
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

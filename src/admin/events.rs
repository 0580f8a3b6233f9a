//! Kubernetes Events (`events.k8s.io/v1`): informative, best effort, never in a reconcile's way.
//!
//! kube-runtime's `Recorder` keeps every Event it sent for six minutes (to count repeats as a
//! series) and walks that whole cache on each publish. We record Events on transitions only,
//! so repeats are rare, and at scale that cache was the controller's largest memory (about
//! 3.8 KiB per node during an install: 19 MiB of a 52 MiB heap at 5,000 nodes) and its walk a
//! quadratic CPU cost. So Events go out from here instead:
//!
//! - [`Events::publish`] never waits: it takes a token from the type's budget (a bucket of
//!   [`BURST`], refilled at [`RATE`] per second, one for Normal and one for Warning Events, so a
//!   labelling wave cannot starve warnings, and one for why a node is not labelled, recorded for
//!   every such node when a leader starts) and queues the Event; one background task creates
//!   them, [`IN_FLIGHT`] at a time, each with a 5 s timeout.
//! - Beyond the budget or a full queue the Event is dropped and counted
//!   (`events_total{outcome}`), like client-go's spam filter: during an install of thousands of
//!   nodes the first hundred say what happened, logs and metrics say the rest.
//! - Nothing is cached: memory does not grow with the number of nodes.
//!
//! Owns: Event delivery. Never decides what to say (callers do).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
pub(crate) use kube::runtime::events::EventType;
use kube::{Api, Client, api::PostParams};
use tracing::debug;

use crate::metrics::Metrics;

/// Events of one type allowed back to back.
pub(crate) const BURST: f64 = 100.0;
/// Events of one type per second after a burst.
pub(crate) const RATE: f64 = 5.0;
/// Events waiting to be sent.
const QUEUE: usize = 256;
/// Events being created at once.
const IN_FLIGHT: usize = 4;
/// The Events API caps notes at 1 kB.
const NOTE_MAX: usize = 1000;

/// Every Event this controller records: its reason, type, what it is about and when. The Event
/// table in docs/operations.md is generated from [`Reason::ALL`] (a test fails when it drifts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    TopologyLabelsUpdated,
    TopologyLabelingFailed,
    TopologyInvalid,
    InstanceIdRejected,
    TopologyNotDescribed,
    TopologySkipped,
    Ec2AccessDenied,
    TopologyLabelConflict,
    StartupTaintReleased,
    StartupTaintTimedOut,
    NotInSchedulerTopology,
    TopologyNotPublished,
    TopologyLevelsMismatch,
    TopologyLevelsChanged,
    SlurmTopologyInvalid,
    HyperNodeOwnedByAnother,
    ReservationIdle,
    NvlinkCliqueMismatch,
}

impl Reason {
    pub const ALL: [Reason; 18] = [
        Reason::TopologyLabelsUpdated,
        Reason::TopologyLabelingFailed,
        Reason::TopologyInvalid,
        Reason::InstanceIdRejected,
        Reason::TopologyNotDescribed,
        Reason::TopologySkipped,
        Reason::Ec2AccessDenied,
        Reason::TopologyLabelConflict,
        Reason::StartupTaintReleased,
        Reason::StartupTaintTimedOut,
        Reason::NotInSchedulerTopology,
        Reason::TopologyNotPublished,
        Reason::TopologyLevelsMismatch,
        Reason::TopologyLevelsChanged,
        Reason::SlurmTopologyInvalid,
        Reason::HyperNodeOwnedByAnother,
        Reason::ReservationIdle,
        Reason::NvlinkCliqueMismatch,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::TopologyLabelsUpdated => "TopologyLabelsUpdated",
            Reason::TopologyLabelingFailed => "TopologyLabelingFailed",
            Reason::TopologyInvalid => "TopologyInvalid",
            Reason::InstanceIdRejected => "InstanceIdRejected",
            Reason::TopologyNotDescribed => "TopologyNotDescribed",
            Reason::TopologySkipped => "TopologySkipped",
            Reason::Ec2AccessDenied => "Ec2AccessDenied",
            Reason::TopologyLabelConflict => "TopologyLabelConflict",
            Reason::StartupTaintReleased => "StartupTaintReleased",
            Reason::StartupTaintTimedOut => "StartupTaintTimedOut",
            Reason::NotInSchedulerTopology => "NotInSchedulerTopology",
            Reason::TopologyNotPublished => "TopologyNotPublished",
            Reason::TopologyLevelsMismatch => "TopologyLevelsMismatch",
            Reason::TopologyLevelsChanged => "TopologyLevelsChanged",
            Reason::SlurmTopologyInvalid => "SlurmTopologyInvalid",
            Reason::HyperNodeOwnedByAnother => "HyperNodeOwnedByAnother",
            Reason::ReservationIdle => "ReservationIdle",
            Reason::NvlinkCliqueMismatch => "NvlinkCliqueMismatch",
        }
    }

    pub fn type_(self) -> EventType {
        match self {
            Reason::TopologyLabelsUpdated
            | Reason::TopologyNotDescribed
            | Reason::TopologySkipped
            | Reason::StartupTaintReleased
            | Reason::TopologyLevelsChanged => EventType::Normal,
            Reason::TopologyLabelingFailed
            | Reason::TopologyInvalid
            | Reason::InstanceIdRejected
            | Reason::Ec2AccessDenied
            | Reason::TopologyLabelConflict
            | Reason::StartupTaintTimedOut
            | Reason::NotInSchedulerTopology
            | Reason::TopologyNotPublished
            | Reason::TopologyLevelsMismatch
            | Reason::SlurmTopologyInvalid
            | Reason::HyperNodeOwnedByAnother
            | Reason::ReservationIdle
            | Reason::NvlinkCliqueMismatch => EventType::Warning,
        }
    }

    /// A node's standing (not described, skipped) rather than something that happened to it:
    /// recorded for every such node whenever a leader starts, from a budget of its own.
    pub(crate) fn is_why_not(self) -> bool {
        matches!(
            self,
            Reason::TopologyNotDescribed | Reason::TopologySkipped | Reason::TopologyNotPublished
        )
    }

    /// The object the Event is recorded on.
    pub fn regarding(self) -> &'static str {
        match self {
            Reason::Ec2AccessDenied => "Node, and the leader's Pod",
            Reason::TopologyLevelsMismatch => "Kueue or KAI Topology",
            Reason::TopologyLevelsChanged => "KAI Topology",
            Reason::SlurmTopologyInvalid => "the Slurm ConfigMap",
            Reason::HyperNodeOwnedByAnother => "the other installation's HyperNode",
            Reason::ReservationIdle => "the leader's Pod",
            _ => "Node",
        }
    }

    /// When it is recorded, for the docs.
    pub fn when(self) -> &'static str {
        match self {
            Reason::TopologyLabelsUpdated => {
                "we changed the node's topology labels (the note says before → after)"
            }
            Reason::TopologyLabelingFailed => {
                "the node's lookup or label write started failing (EC2 down or throttled past its retries, the API server refusing); its labels are left as they are"
            }
            Reason::TopologyInvalid => {
                "EC2's answer for the node's instance cannot be turned into labels (for example more network nodes than layers); its labels are left as they are"
            }
            Reason::InstanceIdRejected => {
                "EC2 refuses the instance ID in the node's providerID (`InvalidInstanceID.*`: terminated, another account or region, or too new to be visible)"
            }
            Reason::TopologyNotDescribed => {
                "EC2 does not describe the node's instance: an instance type without topology (reason `unsupported_instance_type`), or one not running or too new (`not_described_yet`); asked again with backoff"
            }
            Reason::TopologySkipped => {
                "the node is not an EC2 instance we can look up: Fargate, EKS Hybrid, another cloud, a malformed or (yet) empty providerID"
            }
            Reason::Ec2AccessDenied => {
                "EC2 refuses the controller's credentials (UnauthorizedOperation, AccessDenied, expired or missing credentials): on each node as it falls into it, and on the leader's Pod at most every 10 minutes while it lasts"
            }
            Reason::TopologyLabelConflict => {
                "another writer keeps changing our labels on the node; we hold our writes to it for a while (the note names the other field manager)"
            }
            Reason::StartupTaintReleased => {
                "the startup taint was released from a node we cannot label (`--startup-taint-when-unsupported=release`)"
            }
            Reason::StartupTaintTimedOut => {
                "the startup taint was released by `--startup-taint-timeout` before the node's labels were written"
            }
            Reason::NotInSchedulerTopology => {
                "a labelled node carries fewer layer labels than the Kueue Topology we publish has levels: Kueue leaves it out of topology-aware scheduling"
            }
            Reason::TopologyNotPublished => {
                "the node carries our topology label keys but is left out of what we publish for schedulers (Kueue, KAI, Volcano, Slurm): its labels are not what EC2 says of its instance (held 2 publish intervals), it is not an EC2 instance we verify (Hybrid, Fargate, another cloud, a malformed providerID), EC2 does not describe its instance, or its path disagrees with most nodes' (a network node under another parent); once per node and reason, the note says which"
            }
            Reason::TopologyLevelsMismatch => {
                "a Kueue or KAI Topology of our name exists with other levels (levels are immutable: left alone)"
            }
            Reason::TopologyLevelsChanged => {
                "nodes deeper than the others were labelled: a KAI Topology with their number of levels was created beside the first (KAI leaves out of a Topology every node lacking one of its levels)"
            }
            Reason::SlurmTopologyInvalid => {
                "the labels give no topology slurmctld would load (a network node at two layers or under two parents, ...): the ConfigMap keeps its last valid files; the note names the problems"
            }
            Reason::HyperNodeOwnedByAnother => {
                "a HyperNode we would publish belongs to another installation using the same `--volcano-hypernode-prefix` (its `ec2-topology-labeler.io/owner` annotation names that installation's Lease): we write no HyperNode until each installation has its own prefix, and never touch the other's"
            }
            Reason::ReservationIdle => {
                "with `--capacity-reservations`: an active Capacity Reservation started `--reservation-idle-after` (1h) or longer ago and no node of this cluster carries its ID in `karpenter.k8s.aws/capacity-reservation-id` (the note says where it is, how many instances and since when); repeated every `--reservation-idle-after` (at least every 10 minutes) while it lasts"
            }
            Reason::NvlinkCliqueMismatch => {
                "a capacity block (one UltraServer to EC2) holds more than one NVLink clique (GPU Feature Discovery's `nvidia.com/gpu.clique`), or a clique spans capacity blocks: a gang placed inside one UltraServer by our level can span NVLink domains; on each of its nodes when the controller first sees it or its nodes change (the note lists the cliques or blocks and their nodes)"
            }
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where Events go; [`Events::default`] drops them (Events turned off).
#[derive(Clone, Default)]
pub struct Events {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    controller: String,
    instance: String,
    tx: tokio::sync::mpsc::Sender<Event>,
    normal: Mutex<Bucket>,
    warning: Mutex<Bucket>,
    /// `TopologyNotDescribed`, `TopologySkipped`, `TopologyNotPublished` (see
    /// [`Reason::is_why_not`]).
    why: Mutex<Bucket>,
    metrics: Arc<Metrics>,
}

/// A token bucket read without waiting.
#[derive(Debug)]
pub(crate) struct Bucket {
    tokens: f64,
    at: Instant,
    burst: f64,
    rate: f64,
}

impl Bucket {
    pub(crate) fn new(burst: f64, rate: f64, now: Instant) -> Self {
        Self {
            tokens: burst,
            at: now,
            burst,
            rate,
        }
    }

    /// Take a token if there is one at `now`.
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl Events {
    /// Send Events as `controller` (the reporting controller) from `instance` (this replica),
    /// through a task spawned on the current runtime.
    pub fn start(client: Client, controller: &str, instance: &str, metrics: Arc<Metrics>) -> Self {
        let (tx, rx) = tokio::sync::mpsc::channel::<Event>(QUEUE);
        let now = Instant::now();
        let inner = Arc::new(Inner {
            controller: controller.into(),
            instance: instance.into(),
            tx,
            normal: Mutex::new(Bucket::new(BURST, RATE, now)),
            warning: Mutex::new(Bucket::new(BURST, RATE, now)),
            why: Mutex::new(Bucket::new(BURST, RATE, now)),
            metrics: metrics.clone(),
        });
        tokio::spawn(deliver(client, rx, metrics));
        Self { inner: Some(inner) }
    }

    /// Events that go to the returned receiver instead of an API server (tests read what
    /// would have been sent).
    #[cfg(test)]
    pub(crate) fn captured(metrics: Arc<Metrics>) -> (Self, tokio::sync::mpsc::Receiver<Event>) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Event>(QUEUE);
        let now = Instant::now();
        let inner = Arc::new(Inner {
            controller: "test".into(),
            instance: "test".into(),
            tx,
            normal: Mutex::new(Bucket::new(BURST, RATE, now)),
            warning: Mutex::new(Bucket::new(BURST, RATE, now)),
            why: Mutex::new(Bucket::new(BURST, RATE, now)),
            metrics,
        });
        (Self { inner: Some(inner) }, rx)
    }

    /// Record an Event about `regarding`; returns at once (see the module docs).
    pub fn publish(&self, reason: Reason, action: &str, note: &str, regarding: ObjectReference) {
        let Some(inner) = &self.inner else {
            return;
        };
        let type_ = reason.type_();
        let bucket = match type_ {
            // Why a node is not labelled: every node without topology says so when a new leader
            // starts; that wave has a budget of its own, so label changes still get theirs.
            _ if reason.is_why_not() => &inner.why,
            EventType::Normal => &inner.normal,
            EventType::Warning => &inner.warning,
        };
        let allowed = bucket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(Instant::now());
        if !allowed {
            inner.metrics.event("dropped_rate_limited");
            return;
        }
        let event = inner.event(type_, reason.as_str(), action, note, regarding);
        match inner.tx.try_send(event) {
            Ok(()) => {}
            Err(_) => inner.metrics.event("dropped_queue_full"),
        }
    }
}

impl Inner {
    fn event(
        &self,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
        regarding: ObjectReference,
    ) -> Event {
        let now = k8s_openapi::jiff::Timestamp::now();
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or(&self.controller),
            now.as_nanosecond()
        );
        Event {
            metadata: ObjectMeta {
                name: Some(name),
                // Cluster-scoped objects (Nodes, Topologies) have their Events in `default`.
                namespace: Some(
                    regarding
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".into()),
                ),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            type_: Some(
                match type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            reason: Some(reason.into()),
            action: Some(action.into()),
            note: Some(note.chars().take(NOTE_MAX).collect()),
            regarding: Some(regarding),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        }
    }
}

/// Create the queued Events, a few at a time; a failure is only logged and counted.
async fn deliver(client: Client, rx: tokio::sync::mpsc::Receiver<Event>, metrics: Arc<Metrics>) {
    tokio_stream_of(rx)
        .for_each_concurrent(IN_FLIGHT, |event| {
            let client = client.clone();
            let metrics = metrics.clone();
            async move {
                let ns = event.metadata.namespace.clone().unwrap_or_default();
                let api: Api<Event> = Api::namespaced(client, &ns);
                match tokio::time::timeout(
                    Duration::from_secs(5),
                    api.create(&PostParams::default(), &event),
                )
                .await
                {
                    Ok(Ok(_)) => metrics.event("sent"),
                    Ok(Err(e)) => {
                        debug!(error = %e, reason = ?event.reason, "could not record an event");
                        metrics.event("failed");
                    }
                    Err(_) => {
                        debug!(reason = ?event.reason, "recording an event timed out");
                        metrics.event("failed");
                    }
                }
            }
        })
        .await;
}

fn tokio_stream_of<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|t| (t, rx)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(100.0, 5.0, t0);
        let burst = (0..150).filter(|_| b.take(t0)).count();
        assert_eq!(burst, 100, "a burst of 100, no more");
        // One second later: five more.
        let t1 = t0 + Duration::from_secs(1);
        let later = (0..20).filter(|_| b.take(t1)).count();
        assert_eq!(later, 5);
        // A long quiet period refills up to the burst, not beyond.
        let t2 = t1 + Duration::from_secs(3600);
        assert_eq!((0..500).filter(|_| b.take(t2)).count(), 100);
    }

    #[tokio::test]
    async fn a_stuck_api_server_never_holds_up_a_caller_and_the_budget_holds() {
        // An API server that never answers.
        let (service, _handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = Client::new(service, "default");
        let metrics = Arc::new(Metrics::default());
        let events = Events::start(client, "c", "i", metrics.clone());
        let node = |k: u32| ObjectReference {
            name: Some(format!("node-{k}")),
            ..ObjectReference::default()
        };
        let started = Instant::now();
        for k in 0..150 {
            events.publish(Reason::TopologyLabelsUpdated, "A", "n", node(k));
        }
        // Warnings have their own budget: a wave of Normal Events does not starve them.
        events.publish(Reason::TopologyLabelingFailed, "A", "n", node(0));
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "publishing never waits for the API server"
        );
        let text = metrics.render();
        let dropped = text
            .lines()
            .find(|l| {
                l.starts_with("ec2_topology_labeler_events_total{outcome=\"dropped_rate_limited\"}")
            })
            .unwrap_or_default()
            .to_string();
        assert!(
            dropped.ends_with(" 50"),
            "150 Normal Events, 100 allowed: {dropped}"
        );
        assert!(
            text.contains("ec2_topology_labeler_events_total{outcome=\"dropped_queue_full\"} 0"),
            "the queue (256) holds the 100 allowed: {text}"
        );
    }

    #[test]
    fn docs_events_table_is_generated_from_the_code() {
        use crate::testing::docs::cell;
        let mut t = String::from("| Reason | Type | On | When |\n| --- | --- | --- | --- |\n");
        for r in Reason::ALL {
            let type_ = match r.type_() {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            };
            t.push_str(&format!(
                "| `{}` | {type_} | {} | {} |\n",
                r.as_str(),
                cell(r.regarding()),
                cell(r.when())
            ));
        }
        crate::testing::docs::check_generated("docs/operations.md", "events", &t);
    }

    #[test]
    fn every_reason_is_listed_once() {
        let names: std::collections::HashSet<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Reason::ALL.len());
    }

    #[tokio::test]
    async fn turned_off_events_cost_nothing() {
        // No client, no task: publishing is a no-op.
        Events::default().publish(
            Reason::TopologyLabelingFailed,
            "A",
            "note",
            ObjectReference::default(),
        );
    }
}

//! The reconciler: one Node at a time, idempotent and cheap.
//!
//! [`assess`] reads (providerID → instance → cached or batched topology → desired labels →
//! diff) and is shared with `plan`; [`reconcile`] decides and, only when the diff is not empty,
//! writes ([`mod@write`]: one server-side apply of the full managed set, plus an explicit removal
//! when a stale key is also owned by another field manager) and records an Event (`events`).
//! What it remembers about each node is in one record ([`nodes`]).
//!
//! Owns: the decision for one node and its writes. Never calls EC2 itself (the lookup does);
//! never writes unless this replica leads, checked again right before the write.

mod assess;
pub mod conflict;
mod events;
pub mod gate;
pub mod nodes;
pub mod resync;
mod startup;
pub mod warm;
pub mod write;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::events::Reason;
use clap::Args;
use kube::{Api, ResourceExt, runtime::controller::Action};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracing::{Instrument, debug, error, info, info_span, warn};

pub use assess::{Assessment, Target, assess, boot_id, provider_id_of, target};
use conflict::{GuardConfig, Verdict};
use gate::{Gate, Standing};
use nodes::Nodes;
pub use write::{apply_body, write_labels};

use crate::{
    Error, Result,
    duration::HumanDuration,
    labels::LabelScheme,
    leader::Leadership,
    lookup::Lookup,
    metrics::{Metrics, NodeState, NotDescribed},
    node::LiteNode,
    provider_id,
};

/// The controller's own behaviour.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ControllerArgs {
    /// Every node is re-checked against the cached topology this often, spread evenly over the
    /// period.
    #[arg(long, env = "LABELER_RESYNC_PERIOD", default_value = "1h")]
    pub resync_period: HumanDuration,
    /// Most reconciles in flight at once (they mostly wait for a shared EC2 batch).
    #[arg(long, env = "LABELER_CONCURRENCY", default_value_t = 512)]
    pub concurrency: u16,
    /// Most label writes (PATCH requests) in flight at once: bounds connections, memory and
    /// the load on the API server during a burst.
    #[arg(long, env = "LABELER_WRITE_CONCURRENCY", default_value_t = 32)]
    pub write_concurrency: u16,
    /// When another writer keeps changing our labels on a node (more than 3 corrections within
    /// `--conflict-window`), stop correcting it for this long (doubling, up to 1h) and report the
    /// conflict.
    #[arg(long, env = "LABELER_CONFLICT_BACKOFF", default_value = "5m")]
    pub conflict_backoff: HumanDuration,
    /// The window in which more than 3 corrections of our labels on one node count as a
    /// conflict. Long enough to catch a writer that reverts them every few minutes (a cloud
    /// controller re-applying its labels at its node status period).
    #[arg(long, env = "LABELER_CONFLICT_WINDOW", default_value = "1h")]
    pub conflict_window: HumanDuration,
}

/// Everything a reconcile needs. Built once, shared by every reconcile.
pub struct Context {
    /// Node API (the trimmed Node type the watch uses).
    pub api: Api<LiteNode>,
    pub lookup: Lookup,
    pub scheme: LabelScheme,
    /// Region for every node; `None` derives it from each node's zone.
    pub region: Option<String>,
    pub resync: Duration,
    pub metrics: Arc<Metrics>,
    /// Whether this replica leads (always, without leader election). A follower neither asks
    /// EC2 nor writes; a leader whose Lease renewals fail stops at its renew deadline.
    pub leader: Leadership,
    /// Kubernetes Events on Nodes (dropped when turned off).
    pub events: crate::events::Events,
    /// When to hold writes to a node whose labels someone else keeps changing.
    pub conflict: GuardConfig,
    /// Every node's record (failures, our last write, conflicts, state).
    pub records: Nodes,
    /// The startup taint and the `TopologyLabeled` condition (off by default).
    pub gate: Gate,
    /// Bounds the label writes in flight.
    pub writes: tokio::sync::Semaphore,
    /// Set when a write failed; the next successful write re-checks every node (see `kicks`).
    api_failing: AtomicBool,
    /// Asks for every node to be reconciled (the API server accepts writes again).
    pub kicks: Option<futures::channel::mpsc::UnboundedSender<()>>,
    /// When an operator-facing error of each category (index in [`crate::Error::CATEGORIES`])
    /// was last logged: one line a minute per category, so a second problem (RBAC while EC2
    /// refuses our credentials) is not hidden behind the first.
    operator_error_logged_at: [AtomicU64; crate::Error::CATEGORIES.len()],
    /// This replica's Pod (from the downward API), where operator-facing Events about the
    /// controller itself go (EC2 refusing its credentials).
    pub pod: Option<k8s_openapi::api::core::v1::ObjectReference>,
    denied_reported_at: AtomicU64,
}

impl Context {
    pub fn new(
        nodes: Api<LiteNode>,
        lookup: Lookup,
        scheme: LabelScheme,
        region: Option<String>,
        resync: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            api: nodes,
            lookup,
            scheme,
            region,
            resync,
            metrics: metrics.clone(),
            leader: Leadership::always(),
            events: crate::events::Events::default(),
            conflict: GuardConfig::default(),
            records: Nodes::new(metrics.clone()),
            gate: Gate::default(),
            writes: tokio::sync::Semaphore::new(32),
            api_failing: AtomicBool::new(false),
            kicks: None,
            operator_error_logged_at: std::array::from_fn(|_| AtomicU64::new(0)),
            pod: None,
            denied_reported_at: AtomicU64::new(0),
        }
    }

    /// EC2 refused our credentials: a Warning Event on this replica's Pod, at most every
    /// [`DENIED_EVERY`] while it lasts (the operator looking at the controller sees it without
    /// reading logs), besides the per-node Events and the metrics.
    fn report_denied(&self, e: &Error) {
        let Some(pod) = &self.pod else {
            return;
        };
        if once_every(&self.denied_reported_at, DENIED_EVERY) {
            self.events.publish(
                Reason::Ec2AccessDenied,
                "LookUpTopology",
                &format!("no node can be labelled until this is fixed: {e}"),
                pod.clone(),
            );
        }
    }
}

/// How often the Pod Event about refused credentials is repeated while they are refused.
const DENIED_EVERY: Duration = Duration::from_secs(600);

/// True at most once per `every` (process-wide, across threads), using `at` (seconds since the
/// Unix epoch of the last time it was true).
fn once_every(at: &AtomicU64, every: Duration) -> bool {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let last = at.load(Ordering::Relaxed);
    (last == 0 || now >= last + every.as_secs())
        && at
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

pub async fn reconcile(node: Arc<LiteNode>, ctx: Arc<Context>) -> Result<Action> {
    if !ctx.leader.is_leader() {
        // Followers keep their node cache warm and stay ready; the leader does the work. Every
        // node is re-checked when this replica is elected.
        return Ok(Action::await_change());
    }
    let name = node.name_any();
    let span = info_span!("reconcile", node = %name, instance = tracing::field::Empty);
    let started = Instant::now();
    let result = reconcile_node(&node, &ctx).instrument(span.clone()).await;
    ctx.metrics.reconciled(started.elapsed());
    match result {
        Ok(next) => {
            ctx.records.with(&node, |r| r.succeeded(next));
            Ok(next.map_or_else(Action::await_change, Action::requeue))
        }
        Err(e) => {
            ctx.metrics.reconcile_failed(e.category());
            if let Some(standing) = startup::standing_of_error(&e)
                && let Err(gate_error) = startup::step(&ctx, &node, &standing, None)
                    .instrument(span.clone())
                    .await
            {
                warn!(node = %name, error = %gate_error, "cannot update the node's startup taint or condition");
            }
            let denied = matches!(
                &e,
                Error::Ec2(crate::topology::Ec2Error::Unauthorized { .. })
            );
            if ctx.records.enter(&node, NodeState::Failing(e.category())) {
                let (reason, note) = if denied {
                    (
                        Reason::Ec2AccessDenied,
                        format!(
                            "EC2 refuses the controller's credentials, so this node's topology cannot be looked up; its labels are left as they are: {e}"
                        ),
                    )
                } else {
                    (
                        Reason::TopologyLabelingFailed,
                        format!(
                            "cannot look up or write this node's topology labels; they are left as they are: {e}"
                        ),
                    )
                };
                events::record(&ctx, &node, reason, note)
                    .instrument(span)
                    .await;
            }
            if denied {
                ctx.report_denied(&e);
            }
            ctx.records.with(&node, |r| r.failed(&e));
            Err(e)
        }
    }
}

/// Look again after `usual` (`None`: when the node changes), or sooner if the gate asks.
fn next_look(usual: Option<Duration>, gate: Option<Duration>) -> Option<Duration> {
    let gate = gate.map(|d| d + Duration::from_millis(100));
    match (usual, gate) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (Some(d), None) | (None, Some(d)) => Some(d),
        (None, None) => None,
    }
}

/// Requeue exactly when the lookup says the instance is due again: those times sit on a grid
/// shared by every instance, so the nodes due in one round are asked about in one call.
fn grid(retry_in: Duration) -> Option<Duration> {
    Some(retry_in + Duration::from_millis(5))
}

/// One node's reconcile; returns when to look again (`None`: when it changes, or at its resync
/// slot).
async fn reconcile_node(node: &LiteNode, ctx: &Context) -> Result<Option<Duration>> {
    ctx.records.pending_if_new(node);
    let held = ctx.gate.taint.as_ref().is_some_and(|t| t.on(node));
    if !held
        && let Some(ours) = &ctx.gate.taint
        && let Some(other) = ours.other_effect(node)
    {
        // Each time the node changes, or at its resync: never released, so say why.
        warn!(node = %node.name_any(), key = %ours.key, configured = %ours.effect, found = %other.effect,
            "the node carries the startup taint's key with another effect: it is not ours, so it is never released; give the provisioner and --startup-taint the same effect");
    }
    let lookup = assess(node, &ctx.scheme, ctx.region.as_deref(), &ctx.lookup, held);
    let assessment = match ctx.gate.timeout_in(node) {
        // A held node's startup-taint timeout falls due on time, however long EC2 takes to
        // answer (a hung or slowly failing call must not hold the node past it). The call goes
        // on in the batcher; this node looks again shortly, untainted by then.
        Some(due) => match tokio::time::timeout(due + Duration::from_millis(100), lookup).await {
            Ok(assessment) => assessment?,
            Err(_) => {
                debug!("EC2 did not answer before the startup-taint timeout");
                let gate = startup::step(ctx, node, &Standing::Ec2Unavailable, None).await?;
                return Ok(next_look(Some(Duration::from_secs(1)), gate));
            }
        },
        None => lookup.await?,
    };
    match assessment {
        Assessment::Skipped(reason) => {
            if ctx.records.enter(node, NodeState::Skipped(reason.as_str())) {
                let provider_id = provider_id::for_log(provider_id_of(node));
                info!(
                    %provider_id,
                    %reason,
                    "not an EC2 instance we can look up; skipping until its providerID changes"
                );
                let note = format!(
                    "not labelled: {} (providerID {provider_id:?}); looked at again when its providerID changes",
                    reason.explain()
                );
                events::record(ctx, node, Reason::TopologySkipped, note).await;
            }
            // The watch brings the node back when its providerID changes.
            let gate = startup::step(ctx, node, &Standing::Skipped(reason), None).await?;
            Ok(next_look(None, gate))
        }
        Assessment::NotDescribed {
            instance_id,
            retry_in,
        } => {
            tracing::Span::current().record("instance", instance_id.as_str());
            let instance_type = node.label(gate::INSTANCE_TYPE_LABEL);
            let why = NotDescribed::of(instance_type.as_deref());
            if ctx.records.enter(node, NodeState::NotDescribed(why)) {
                let what = match why {
                    NotDescribed::UnsupportedType => format!(
                        "its instance type {} is not one EC2 describes network topology for",
                        instance_type.as_deref().unwrap_or_default()
                    ),
                    NotDescribed::NotYet => {
                        "the instance is not running, is too new, or EC2's answer has not caught up"
                            .to_string()
                    }
                };
                info!(
                    retry_in_s = retry_in.as_secs(),
                    reason = why.as_str(),
                    "EC2 does not describe this instance; leaving its labels alone"
                );
                let note = format!(
                    "EC2 does not describe instance {instance_id}: {what}; its labels are left as they are and EC2 is asked again in {}s (backoff up to --not-described-ttl)",
                    retry_in.as_secs()
                );
                events::record(ctx, node, Reason::TopologyNotDescribed, note).await;
            }
            let standing = Standing::NotDescribed { instance_type };
            let gate = startup::step(ctx, node, &standing, None).await?;
            Ok(next_look(grid(retry_in), gate))
        }
        Assessment::Rejected {
            instance_id,
            error,
            retry_in,
        } => {
            tracing::Span::current().record("instance", instance_id.as_str());
            if ctx.records.enter(node, NodeState::Rejected) {
                warn!(%error, retry_in_s = retry_in.as_secs(), provider_id = %provider_id::for_log(provider_id_of(node)),
                    "EC2 refuses this node's instance ID; leaving its labels alone and keeping it out of other nodes' calls");
                let note = format!(
                    "EC2 refuses instance ID {instance_id} from this node's providerID ({error}); its labels are left as they are and it is asked about again in {}s",
                    retry_in.as_secs()
                );
                events::record(ctx, node, Reason::InstanceIdRejected, note).await;
            }
            let gate = startup::step(ctx, node, &Standing::Rejected, None).await?;
            Ok(next_look(grid(retry_in), gate))
        }
        Assessment::Invalid { instance_id, error } => {
            tracing::Span::current().record("instance", instance_id.as_str());
            ctx.metrics.reconcile_failed("invalid_topology");
            // Not an answer to keep: ask EC2 again later, with the backoff of an instance it
            // did not describe, rather than trusting it until the cache TTL.
            let retry_in = ctx.lookup.reject(&instance_id);
            if ctx
                .records
                .enter(node, NodeState::Failing("invalid_topology"))
            {
                warn!(%error, retry_in_s = retry_in.as_secs(), "cannot label from EC2's answer; leaving the node's labels alone");
                let note = format!(
                    "EC2's topology answer cannot be turned into labels; they are left as they are: {error}"
                );
                events::record(ctx, node, Reason::TopologyInvalid, note).await;
            }
            let gate = startup::step(ctx, node, &Standing::Ec2Unavailable, None).await?;
            Ok(next_look(grid(retry_in), gate))
        }
        Assessment::Ready {
            instance_id,
            desired,
            diff,
            refresh_error,
            recheck_in,
        } => {
            tracing::Span::current().record("instance", instance_id.as_str());
            // Next look: sooner while EC2's answer is still settling; otherwise when the node
            // changes or its resync slot comes up (see `resync`: no timer per node).
            let usual = recheck_in.map(|d| d + Duration::from_millis(5));
            if let Some(e) = refresh_error {
                warn!(error = %e, "refreshing the topology failed; using the earlier answer");
            }
            if diff.is_empty() {
                ctx.records.with(node, |r| r.seen());
                ctx.records.set_state(node, NodeState::Labelled);
                let gate =
                    startup::step(ctx, node, &Standing::Labelled, Some(&desired.labels)).await?;
                return Ok(next_look(usual, gate));
            }
            if ctx.records.with(node, |r| r.awaiting(node, &desired)) {
                debug!("our last write is not in the node cache yet; not writing it again");
                ctx.records.set_state(node, NodeState::Labelled);
                return Ok(next_look(usual, None));
            }
            if !ctx.leader.is_leader() {
                // Leadership was lost while we looked EC2 up.
                return Ok(None);
            }
            let verdict = ctx.records.with(node, |r| {
                r.conflict
                    .before_write(&ctx.conflict, boot_id(node), std::time::Instant::now())
            });
            if let Verdict::Hold { until, first } = verdict {
                ctx.records.set_state(node, NodeState::Conflict);
                if first {
                    events::report_conflict(ctx, node, &diff, until).await;
                }
                let wait = until.saturating_duration_since(std::time::Instant::now());
                debug!(
                    wait_ms = wait.as_millis() as u64,
                    "label conflict: holding writes to this node"
                );
                let gate = startup::step(ctx, node, &Standing::Held, None).await?;
                return Ok(next_look(Some(wait + Duration::from_millis(100)), gate));
            }
            let first = !desired.labels.keys().any(|k| node.has_label(k));
            let written = {
                // A closed semaphore cannot happen (it is never closed); write regardless.
                let _permit = ctx.writes.acquire().await.ok();
                // The wait for a permit can be long under load: leadership may have lapsed.
                if !ctx.leader.is_leader() {
                    return Ok(None);
                }
                match write_labels(
                    &ctx.api,
                    node,
                    &desired,
                    &diff,
                    &ctx.metrics,
                    ctx.gate.enabled(),
                )
                .await
                {
                    Ok(written) => written,
                    Err(e) => {
                        if e.is_api_unavailable() {
                            ctx.api_failing.store(true, Ordering::SeqCst);
                        }
                        return Err(e);
                    }
                }
            };
            if ctx.api_failing.swap(false, Ordering::SeqCst)
                && let Some(kicks) = &ctx.kicks
            {
                // Writes work again (after an API server restart, say): nodes waiting out a
                // per-node backoff are re-checked now.
                info!("the API server accepts writes again; re-checking every node");
                let _ = kicks.unbounded_send(());
            }
            ctx.records.with(node, |r| {
                r.conflict.written();
                r.written(node, &desired);
                if ctx.gate.enabled() {
                    // Our newest write: the gate decides from it, and cached versions before it
                    // are stale.
                    r.gate_written(
                        written.metadata.resource_version.clone(),
                        nodes::GateMark::Labels,
                    );
                }
            });
            if first {
                let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                );
                ctx.metrics.first_labelled(gate::age(node, &now));
            }
            let summary = diff.summary();
            info!(changes = %summary, "node labels updated");
            ctx.records.set_state(node, NodeState::Labelled);
            events::record(ctx, node, Reason::TopologyLabelsUpdated, summary).await;
            // The gate decides from the node as the API server returned it after our write.
            let gate =
                startup::step(ctx, &written, &Standing::Labelled, Some(&desired.labels)).await?;
            Ok(next_look(usual, gate))
        }
    }
}

pub fn error_policy(node: Arc<LiteNode>, err: &Error, ctx: Arc<Context>) -> Action {
    let name = node.name_any();
    let failures = ctx.records.with(&node, |r| {
        r.failures = r.failures.saturating_add(1);
        r.failures
    });
    // Errors an operator must fix are retried less often; not rarely, though: a 403 can also be
    // an API server that just restarted and has not loaded its RBAC yet.
    let (base, cap) = if err.needs_operator() {
        (Duration::from_secs(5), Duration::from_secs(300))
    } else {
        (Duration::from_secs(1), Duration::from_secs(300))
    };
    let backoff = base
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(cap);
    // Full jitter on the upper half: failed nodes spread out instead of retrying together.
    let mut delay = backoff / 2 + backoff.mul_f64(fastrand::f64() / 2.0);
    // A startup-taint timeout falls due on time, backoff or not (once it has passed, the
    // release is retried with the backoff like any write).
    if let Some(due) = ctx.gate.timeout_in(&node).filter(|d| !d.is_zero()) {
        delay = delay.min(due + Duration::from_millis(100));
    }
    ctx.records.with(&node, |r| r.next_look(Some(delay)));
    if err.needs_operator() {
        // One line a minute for the whole fleet (per category), not one per node.
        let slot = crate::Error::CATEGORIES
            .iter()
            .position(|c| *c == err.category())
            .unwrap_or(0);
        if once_every(&ctx.operator_error_logged_at[slot], Duration::from_secs(60)) {
            error!(node = %name, category = err.category(), error = %err, "cannot label nodes until this is fixed; retrying with backoff");
        }
    } else {
        warn!(node = %name, category = err.category(), error = %err, retry_in_ms = delay.as_millis() as u64, "reconcile failed; labels left as they are");
    }
    Action::requeue(delay)
}

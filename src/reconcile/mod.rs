//! The reconciler: one Node at a time, idempotent and cheap.
//!
//! Three steps. [`assess`] reads (providerID → instance → cached or batched topology → desired
//! labels → diff) and is shared with `plan`. [`decide`](mod@decide) turns the node, what its
//! record says and that answer into one decision (where the node stands, what to say, the labels
//! to write, the startup gate's standing, when to look again), without I/O. [`reconcile`]
//! gathers the facts and carries the decision out: the write ([`mod@write`]: one server-side
//! apply of the full managed set, plus an explicit removal when a stale key is also owned by
//! another field manager), the node's record ([`nodes`]), an Event (`events`) and the gate's
//! step ([`startup`], as [`gate::Gate::plan`] decides it).
//!
//! Owns: carrying out the decision for one node. Never calls EC2 itself (the lookup does);
//! never writes unless this replica leads, checked again right before the write.

mod assess;
pub(crate) mod conflict;
mod decide;
mod events;
pub mod gate;
pub(crate) mod housekeeping;
pub(crate) mod nodes;
pub(crate) mod planning;
pub(crate) mod queue;
pub(crate) mod resync;
pub(crate) mod retire;
mod startup;
pub mod sweep;
pub(crate) mod view;
pub mod warm;
pub(crate) mod write;

use crate::bounds::{Bound, DAY, secs};
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use crate::admin::events::Reason;
use clap::Args;
use kube::Api;
pub use queue::Action;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracing::{Instrument, debug, error, info, info_span, warn};

pub use crate::state::Distrust;
pub(crate) use assess::{Assessment, assess};
pub use assess::{boot_id, target, trusted};
use conflict::GuardConfig;
use decide::{Answer, Decision, Facts, GateStep, Say, decide, next_look};
use gate::Gate;
use nodes::Nodes;
pub(crate) use write::write_labels;

use crate::{
    Error, Result,
    duration::HumanDuration,
    labels::LabelScheme,
    leader::Leadership,
    lookup::Lookup,
    metrics::Metrics,
    node::{LiteNode, WireNode},
    state::NodeState,
};

/// `--resync-period`'s range.
pub(crate) const RESYNC_PERIOD_RANGE: Bound =
    Bound::duration("resync-period", secs(1), secs(30 * DAY));
/// `--concurrency`'s range.
pub(crate) const CONCURRENCY_RANGE: Bound = Bound::count("concurrency", 1, 4096);
/// `--write-concurrency`'s range.
pub(crate) const WRITE_CONCURRENCY_RANGE: Bound = Bound::count("write-concurrency", 1, 1024);
/// `--conflict-backoff`'s range.
pub(crate) const CONFLICT_BACKOFF_RANGE: Bound =
    Bound::duration("conflict-backoff", secs(1), secs(3600));
/// `--conflict-window`'s range.
pub(crate) const CONFLICT_WINDOW_RANGE: Bound =
    Bound::duration("conflict-window", secs(1), secs(30 * DAY));

/// The controller's own behaviour.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ControllerArgs {
    /// Every node is re-checked against the cached topology this often, spread evenly over the
    /// period.
    #[arg(long, value_parser = RESYNC_PERIOD_RANGE.durations(), env = "LABELER_RESYNC_PERIOD", default_value = "1h")]
    pub(crate) resync_period: HumanDuration,
    /// Most reconciles in flight at once (they mostly wait for a shared EC2 batch).
    #[arg(long, value_parser = CONCURRENCY_RANGE.counts::<u16>(), env = "LABELER_CONCURRENCY", default_value_t = 512)]
    pub concurrency: u16,
    /// Most label writes (PATCH requests) in flight at once: bounds connections, memory and
    /// the load on the API server during a burst.
    #[arg(long, value_parser = WRITE_CONCURRENCY_RANGE.counts::<u16>(), env = "LABELER_WRITE_CONCURRENCY", default_value_t = 32)]
    pub(crate) write_concurrency: u16,
    /// When another writer keeps changing our labels on a node (more than 3 corrections within
    /// `--conflict-window`), pause correcting it for this long (doubling per pause, up to 10
    /// times this), then correct it again; each pause is reported.
    #[arg(long, value_parser = CONFLICT_BACKOFF_RANGE.durations(), env = "LABELER_CONFLICT_BACKOFF", default_value = "30s")]
    pub(crate) conflict_backoff: HumanDuration,
    /// The window in which more than 3 corrections of our labels on one node count as a
    /// conflict. Long enough to catch a writer that reverts them every few minutes (a cloud
    /// controller re-applying its labels at its node status period).
    #[arg(long, value_parser = CONFLICT_WINDOW_RANGE.durations(), env = "LABELER_CONFLICT_WINDOW", default_value = "1h")]
    pub(crate) conflict_window: HumanDuration,
}

/// Everything a reconcile needs. Built once, shared by every reconcile.
pub struct Context {
    /// Node API (the trimmed Node type the watch uses).
    pub api: Api<WireNode>,
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
    pub events: crate::admin::events::Events,
    /// When to hold writes to a node whose labels someone else keeps changing.
    pub conflict: GuardConfig,
    /// Every node's record (failures, our last write, conflicts, state, what EC2's answer
    /// makes of it); the publishers read it too.
    pub records: Arc<Nodes>,
    /// The verification records: which node's labels EC2's answer vouches for, kept in the
    /// controller's namespace (in memory only unless `run` wires its shards).
    pub ledger: Arc<crate::ledger::Ledger>,
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
    /// The node cache, to tell a node whose providerID another, older node names (a
    /// duplicate: skipped). `None` in tests that reconcile without one.
    pub cache: Option<crate::node::store::NodeCache>,
    /// This replica's Pod (from the downward API), where operator-facing Events about the
    /// controller itself go (EC2 refusing its credentials).
    pub pod: Option<k8s_openapi::api::core::v1::ObjectReference>,
    denied_reported_at: AtomicU64,
}

impl Context {
    pub fn new(
        nodes: Api<WireNode>,
        lookup: Lookup,
        scheme: LabelScheme,
        region: Option<String>,
        resync: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        let ledger = Arc::new(crate::ledger::Ledger::in_memory(
            lookup.record_key().cloned(),
        ));
        Self {
            api: nodes,
            ledger,
            lookup,
            scheme,
            region,
            resync,
            metrics: metrics.clone(),
            leader: Leadership::always(),
            events: crate::admin::events::Events::default(),
            conflict: GuardConfig::default(),
            records: Arc::new(Nodes::new(metrics.clone())),
            gate: Gate::default(),
            writes: tokio::sync::Semaphore::new(32),
            api_failing: AtomicBool::new(false),
            kicks: None,
            cache: None,
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

/// How long a reconcile waits, at most, for the ledger's shards to be read when this replica
/// starts leading (a node whose record is not read by then is asked about).
pub(crate) const LEDGER_WAIT: Duration = Duration::from_secs(30);

/// How often a node skipped as a duplicate is looked at again (the older node may be gone).
const DUPLICATE_RECHECK: Duration = Duration::from_secs(60);

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

/// Whether `node` is joining now ([`assess::joining`]).
fn joining_now(node: &LiteNode, ctx: &Context) -> bool {
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    assess::joining(node, &ctx.scheme, &now)
}

/// Whether `node`'s reconcile goes ahead of the others when every node is re-checked (on
/// election): it is joining, or held back by the startup taint.
pub(crate) fn urgent(node: &LiteNode, ctx: &Context) -> bool {
    ctx.gate.taint.as_ref().is_some_and(|t| t.on(node)) || joining_now(node, ctx)
}

pub async fn reconcile(node: Arc<LiteNode>, ctx: Arc<Context>) -> Result<Action> {
    if !ctx.leader.is_leader() {
        // Followers keep their node cache warm and stay ready; the leader does the work. Every
        // node is re-checked when this replica is elected.
        return Ok(Action::await_change());
    }
    let name = node.name();
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
            let mut facts = Facts::new(&node, Answer::Failed(&e), Instant::now());
            facts.previous = ctx.records.with(&node, |r| r.state().cloned());
            let decision = decide(facts);
            first_decision(&ctx, &node);
            // The error is what the controller retries on; the gate's own trouble is logged.
            if let Err(gate_error) = Box::pin(carry_out(&ctx, &node, decision))
                .instrument(span)
                .await
            {
                warn!(node = %name, error = %gate_error, "cannot update the node's startup taint or condition");
            }
            if matches!(
                &e,
                Error::Ec2(crate::topology::Ec2Error::Unauthorized { .. })
            ) {
                ctx.report_denied(&e);
            }
            ctx.records.with(&node, |r| r.failed(&e));
            Err(e)
        }
    }
}

/// One node's reconcile: gather the facts, [`decide`], carry the decision out. Returns when to
/// look again (`None`: when it changes, or at its resync slot).
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
    let urgent = held || joining_now(node, ctx);
    // Another node, created earlier, names this node's instance: a duplicate registration is
    // not ours to label (and, asked about, would look like a reboot at every event).
    let duplicate = ctx.cache.as_ref().is_some_and(|c| {
        c.younger_duplicate(
            node.name(),
            node.provider_id(),
            node.metadata.creation_timestamp.as_ref(),
        )
    });
    let mut answer = if duplicate {
        Answer::Assessed(Assessment::Skipped(
            crate::provider_id::SkipReason::Duplicate,
        ))
    } else {
        // The first lookup of this node's instance in this process: its verification record
        // may answer it (a new leader asks EC2 nothing about what was verified).
        if let Ok(Ok(t)) = target(node, &ctx.scheme, ctx.region.as_deref()) {
            ctx.ledger.ready(LEDGER_WAIT).await;
            assess::adopt(
                node,
                &ctx.scheme,
                &t,
                &ctx.lookup,
                &ctx.ledger,
                &ctx.metrics,
            );
        }
        let lookup = assess(
            node,
            &ctx.scheme,
            ctx.region.as_deref(),
            &ctx.lookup,
            urgent,
        );
        match ctx.gate.timeout_in(node) {
            // A held node's startup-taint timeout falls due on time, however long EC2 takes to
            // answer (a hung or slowly failing call must not hold the node past it). The call
            // goes on in the batcher; this node looks again shortly, untainted by then.
            Some(due) => {
                match tokio::time::timeout(due + Duration::from_millis(100), lookup).await {
                    Ok(assessment) => Answer::Assessed(assessment?),
                    Err(_) => {
                        debug!("EC2 did not answer before the startup-taint timeout");
                        Answer::TimedOut
                    }
                }
            }
            None => Answer::Assessed(lookup.await?),
        }
    };
    let mut unusable_retry_in = Duration::ZERO;
    if let Answer::Assessed(a) = &answer {
        if let Some(instance_id) = a.instance_id() {
            tracing::Span::current().record("instance", instance_id);
        }
        match a {
            Assessment::Invalid { instance_id, .. } => {
                ctx.metrics.reconcile_failed(decide::INVALID_TOPOLOGY);
                // Not an answer to keep (see `decide`): the lookup forgets it.
                unusable_retry_in = ctx.lookup.reject(instance_id);
            }
            Assessment::Ready {
                refresh_error: Some(e),
                ..
            } => warn!(error = %e, "refreshing the topology failed; using the earlier answer"),
            _ => {}
        }
    }
    // What the answer makes of the node, for the publishers: an answer vouches for labels
    // that are what it makes of them; a node that is no instance we verify loses any voucher;
    // anything else (EC2 failing or late, an answer we cannot use) leaves it as it was.
    let verified = match &answer {
        Answer::Assessed(Assessment::Ready { desired, .. }) => Some(Some(
            crate::labels::vouched_fingerprint(&ctx.scheme, desired),
        )),
        Answer::Assessed(Assessment::Skipped(_) | Assessment::Rejected { .. }) => Some(None),
        _ => None,
    };
    // The record of the answer, for the ledger once the node carries what it makes of it: now
    // (nothing to write) or after our write. (The instance ID taken out of the answer, which
    // `decide` does not read it from: no copy; the answer itself is shared.)
    let record = match &mut answer {
        Answer::Assessed(Assessment::Ready {
            instance_id,
            answer,
            verified_at,
            diff,
            ..
        }) => Some((
            std::mem::take(instance_id),
            answer.clone(),
            *verified_at,
            diff.is_empty(),
        )),
        _ => None,
    };
    let now = Instant::now();
    let mut facts = Facts::new(node, answer, now);
    facts.unusable_retry_in = unusable_retry_in;
    facts.previous = ctx.records.with(node, |r| r.state().cloned());
    // The record is asked only about a write that is due, and the guard only when ours is not
    // awaited: asking the guard counts a correction.
    if let Some(desired) = facts.write_due() {
        let awaiting = ctx.records.with(node, |r| r.awaiting(node, desired));
        if awaiting {
            debug!("our last write is not in the node cache yet; not writing it again");
        } else {
            if !ctx.leader.is_leader() {
                // Leadership was lost while we looked EC2 up.
                return Ok(None);
            }
            facts.verdict = ctx.records.with(node, |r| {
                r.conflict.before_write(&ctx.conflict, boot_id(node), now)
            });
        }
        facts.awaiting = awaiting;
    }
    let decision = decide(facts);
    first_decision(ctx, node);
    ctx.records.set_verified(node, verified);
    let writes = decision.write.is_some();
    let next = carry_out(ctx, node, decision).await?;
    if let Some((instance_id, answer, verified_at, carried)) = record
        && (carried || writes)
    {
        ctx.ledger.put_answer(
            node.name(),
            &instance_id,
            boot_id(node),
            verified_at,
            &answer,
        );
    }
    // A duplicate is looked at again every minute: once the older node is gone, it is labelled.
    Ok(if duplicate {
        Some(next.map_or(DUPLICATE_RECHECK, |n| n.min(DUPLICATE_RECHECK)))
    } else {
        next
    })
}

/// The first decision of this replica's term as leader is timed and logged.
fn first_decision(ctx: &Context, node: &LiteNode) {
    if let Some(took) = ctx.metrics.decided_as_leader() {
        info!(node = %node.name_any(), took_ms = took.as_millis() as u64,
            "first decision as leader since taking the lease");
    }
}

/// Carries out `decision` for `node`, in order: the label write, where the node stands, what
/// is said about it, the startup gate's step. Returns when to look again.
/// What takes time here (a write, the startup gate's writes, an Event) is boxed where it is
/// awaited: a reconcile's future is moved whole each time its task is spawned, polled to its
/// end and read (6.4 KB, most of it these, when they were inline), and most reconciles change
/// nothing.
async fn carry_out(ctx: &Context, node: &LiteNode, decision: Decision) -> Result<Option<Duration>> {
    let Decision {
        state,
        say,
        write,
        seen,
        gate_first,
        gate,
        mut next,
    } = decision;
    if seen {
        ctx.records.with(node, |r| r.seen());
    }
    let step = async |on: &LiteNode| match &gate {
        Some(GateStep { standing, labels }) => {
            startup::step(ctx, on, standing, labels.as_ref()).await
        }
        None => Ok(None),
    };
    let mut recheck = None;
    if gate_first {
        recheck = step(node).await?;
    }
    // The gate decides from the node as the API server returned it after our write.
    let written = match &write {
        Some(w) => match Box::pin(write_node(ctx, node, w)).await? {
            Some(written) => Some(written),
            // Leadership lapsed while waiting to write.
            None => return Ok(None),
        },
        None => None,
    };
    if state == Some(NodeState::Conflict) {
        debug!(
            wait_ms = next.map_or(0, |n| n.as_millis() as u64),
            "label conflict: holding writes to this node"
        );
    }
    if let Some(state) = state {
        ctx.records.set_state(node, state);
    }
    match &say {
        Some(Say::Conflict { diff, until }) => {
            Box::pin(events::report_conflict(ctx, node, diff, *until)).await;
            // Asking who the other writer is took time: the hold ends when it ends.
            next =
                Some(until.saturating_duration_since(Instant::now()) + Duration::from_millis(100));
        }
        Some(say) => {
            say.log();
            Box::pin(events::record(ctx, node, say.reason(), say.note())).await;
        }
        None => {}
    }
    if !gate_first {
        recheck = step(written.as_ref().unwrap_or(node)).await?;
    }
    Ok(next_look(next, recheck))
}

/// The label write, under a write permit and by the leader only; what it leaves in the node's
/// record. `None`: leadership lapsed while waiting for the permit.
async fn write_node(ctx: &Context, node: &LiteNode, w: &decide::Write) -> Result<Option<LiteNode>> {
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
            &w.desired,
            &w.diff,
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
        // Writes work again (after an API server restart, say): nodes waiting out a per-node
        // backoff are re-checked now.
        info!("the API server accepts writes again; re-checking every node");
        let _ = kicks.unbounded_send(());
    }
    ctx.records.with(node, |r| {
        r.conflict.written();
        r.written(node, &w.desired);
        if ctx.gate.enabled() {
            // Our newest write: the gate decides from it, and cached versions before it are
            // stale.
            r.gate_written(
                written.metadata.resource_version.clone(),
                nodes::GateMark::Labels,
            );
        }
    });
    if w.first {
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        ctx.metrics.first_labelled(gate::age(node, &now));
    }
    Ok(Some(written))
}

pub(crate) fn error_policy(node: Arc<LiteNode>, err: &Error, ctx: Arc<Context>) -> Action {
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
    // Jittered: failed nodes spread out instead of retrying together.
    let mut delay = crate::backoff::equal_jitter(crate::backoff::capped(base, failures, cap));
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
        if ctx
            .operator_error_logged_at
            .get(slot)
            .is_some_and(|at| once_every(at, Duration::from_secs(60)))
        {
            error!(node = %name, category = err.category(), error = %err, "cannot label nodes until this is fixed; retrying with backoff");
        }
    } else {
        warn!(node = %name, category = err.category(), error = %err, retry_in_ms = delay.as_millis() as u64, "reconcile failed; labels left as they are");
    }
    Action::requeue(delay)
}

//! The reconciler: one Node at a time, idempotent and cheap.
//!
//! `assess` reads (providerID → instance → cached or batched topology → desired labels → diff)
//! and is shared with `plan`; `reconcile` writes only when the diff is non-empty, with one
//! server-side apply of the full managed set, plus an explicit removal when a stale key is also
//! owned by another field manager (server-side apply cannot remove what others co-own).

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use futures::StreamExt;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        Controller, PredicateConfig, WatchStreamExt,
        controller::{self, Action},
        events::{Event, EventType, Recorder, Reporter},
        reflector::{self, Store},
        watcher,
    },
};
use serde_json::json;
use tracing::{Instrument, debug, error, info, info_span, warn};

use crate::{
    Error, FIELD_MANAGER, Result,
    config::RunArgs,
    conflict::{ConflictGuard, GuardConfig, Verdict, other_owners},
    ec2::AwsTopology,
    labels::{self, DeriveError, Desired, LabelScheme, NodeDiff},
    leader::Leadership,
    limiter::Limiter,
    lookup::{Lookup, Resolved},
    metrics::{Metrics, NodeState},
    node::LiteNode,
    provider_id::{self, SkipReason},
    topology::Ec2Error,
};

/// Everything a reconcile needs. Built once, shared by every reconcile.
pub struct Context {
    pub nodes: Api<LiteNode>,
    pub lookup: Lookup,
    pub scheme: LabelScheme,
    /// Region for every node; `None` derives it from each node's zone.
    pub region: Option<String>,
    pub resync: Duration,
    pub metrics: Arc<Metrics>,
    /// Whether this replica leads (always, without leader election). A follower neither asks
    /// EC2 nor writes; a leader whose Lease renewals fail stops at its renew deadline.
    pub leader: Leadership,
    /// Kubernetes Events on Nodes, when enabled.
    pub recorder: Option<Recorder>,
    /// Holds writes to nodes whose labels someone else keeps changing.
    pub guard: Mutex<ConflictGuard>,
    /// Bounds the label writes in flight.
    pub writes: tokio::sync::Semaphore,
    /// Set when a write failed; the next successful write re-checks every node (see `kicks`).
    api_failing: AtomicBool,
    /// Asks for every node to be reconciled (the API server accepts writes again).
    pub kicks: Option<futures::channel::mpsc::UnboundedSender<()>>,
    failures: Mutex<HashMap<String, u32>>,
    operator_error_logged_at: AtomicU64,
    /// Writes of ours whose watch event has not arrived yet (see [`Echoes`]).
    pub echoes: Mutex<Echoes>,
}

/// What we wrote to a node, until the node cache shows it.
///
/// Under load the watch can lag seconds behind our own writes. A reconcile that runs meanwhile
/// (a resync, a retry) reads the node as it was before our write and would apply the same
/// labels again. Each successful write records the resourceVersion it was made against and
/// what it wrote; while the cached node still carries that resourceVersion and the labels it
/// needs are the ones written, the write is known to be done and is not repeated. Entries go
/// as soon as the cache moves on, and with their node.
#[derive(Debug, Default)]
pub struct Echoes {
    pending: HashMap<String, Echo>,
}

#[derive(Debug)]
struct Echo {
    uid: Option<String>,
    resource_version: String,
    desired: Desired,
}

impl Echoes {
    /// We wrote `desired` to `node` (as the cache had it).
    pub fn written(&mut self, node: &LiteNode, desired: &Desired) {
        // Without a resourceVersion there is no telling the cache caught up: record nothing.
        let Some(rv) = node.metadata.resource_version.clone() else {
            return;
        };
        self.pending.insert(
            node.name_any(),
            Echo {
                uid: node.metadata.uid.clone(),
                resource_version: rv,
                desired: desired.clone(),
            },
        );
    }

    /// Is `node` (from the cache) still the version our write of `desired` was made against?
    /// Then the write is done and must not be repeated. Anything else forgets the entry.
    pub fn awaiting(&mut self, node: &LiteNode, desired: &Desired) -> bool {
        let name = node.name_any();
        let Some(echo) = self.pending.get(&name) else {
            return false;
        };
        if echo.uid == node.metadata.uid
            && Some(&echo.resource_version) == node.metadata.resource_version.as_ref()
            && echo.desired == *desired
        {
            return true;
        }
        self.pending.remove(&name);
        false
    }

    /// The cache shows the node as it is now: nothing is awaited.
    pub fn seen(&mut self, name: &str) {
        self.pending.remove(name);
    }

    /// Keep only the entries of nodes that still exist.
    pub fn retain(&mut self, live: &std::collections::HashSet<String>) {
        self.pending.retain(|name, _| live.contains(name));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.pending.len()
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
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
            nodes,
            lookup,
            scheme,
            region,
            resync,
            metrics,
            leader: Leadership::always(),
            recorder: None,
            guard: Mutex::new(ConflictGuard::new(GuardConfig::default())),
            writes: tokio::sync::Semaphore::new(32),
            api_failing: AtomicBool::new(false),
            kicks: None,
            failures: Mutex::new(HashMap::new()),
            operator_error_logged_at: AtomicU64::new(0),
            echoes: Mutex::new(Echoes::default()),
        }
    }
}

/// What a node needs, as far as reading can tell.
// Short-lived, one per reconcile: boxing `Ready` would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Assessment {
    /// Not an EC2 instance we can look up.
    Skipped(SkipReason),
    /// EC2 does not describe the instance (yet); labels are left as they are.
    NotDescribed {
        instance_id: String,
        retry_in: Duration,
    },
    /// EC2 refused the instance ID itself (`InvalidInstanceID.*`); labels are left as they are
    /// and the ID is kept out of other calls until `retry_in`.
    Rejected {
        instance_id: String,
        error: Ec2Error,
        retry_in: Duration,
    },
    /// EC2's answer cannot be turned into labels; labels are left as they are.
    Invalid {
        instance_id: String,
        error: DeriveError,
    },
    /// The labels the node should carry and what must change to get there.
    Ready {
        instance_id: String,
        desired: Desired,
        diff: NodeDiff,
        /// A refresh failed; `desired` comes from the earlier answer.
        refresh_error: Option<Ec2Error>,
        /// EC2's answer may still be settling (a late field missing): check again this soon.
        recheck_in: Option<Duration>,
    },
}

fn labels_of(node: &LiteNode) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

fn annotations_of(node: &LiteNode) -> BTreeMap<String, String> {
    node.metadata.annotations.clone().unwrap_or_default()
}

pub fn boot_id(node: &LiteNode) -> Option<&str> {
    node.boot_id()
}

pub fn provider_id_of(node: &LiteNode) -> &str {
    node.provider_id()
}

/// Read-only part of a reconcile, shared with `plan`.
pub async fn assess(
    node: &LiteNode,
    scheme: &LabelScheme,
    region: Option<&str>,
    lookup: &Lookup,
) -> Result<Assessment, Ec2Error> {
    let instance = match provider_id::parse(provider_id_of(node)) {
        Ok(i) => i,
        Err(reason) => return Ok(Assessment::Skipped(reason)),
    };
    let region = region
        .map(str::to_owned)
        .or_else(|| {
            instance
                .zone
                .as_deref()
                .and_then(provider_id::region_of_zone)
        })
        .ok_or(Ec2Error::NoRegion)?;
    let instance_id = instance.instance_id;
    let has_capacity_block = scheme
        .capacity_block_key
        .as_ref()
        .is_some_and(|k| node.labels().contains_key(k));
    match lookup
        .resolve_expecting(&region, &instance_id, boot_id(node), has_capacity_block)
        .await?
    {
        Resolved::NotDescribed { retry_in, .. } => Ok(Assessment::NotDescribed {
            instance_id,
            retry_in,
        }),
        Resolved::Rejected {
            error, retry_in, ..
        } => Ok(Assessment::Rejected {
            instance_id,
            error,
            retry_in,
        }),
        Resolved::Topology {
            topology,
            refresh_error,
            recheck_in,
        } => match labels::desired(scheme, &topology) {
            Ok(desired) => {
                let diff = labels::diff(scheme, &labels_of(node), &annotations_of(node), &desired);
                Ok(Assessment::Ready {
                    instance_id,
                    desired,
                    diff,
                    refresh_error,
                    recheck_in,
                })
            }
            Err(error) => Ok(Assessment::Invalid { instance_id, error }),
        },
    }
}

/// Requeue after `d`, spread by up to a tenth so a fleet does not resync in lockstep.
fn jittered(d: Duration) -> Duration {
    d + d.mul_f64(fastrand::f64() / 10.0)
}

/// Requeue exactly when the lookup says the instance is due again: those times sit on a grid
/// shared by every instance, so the nodes due in one round are asked about in one call.
fn on_grid(retry_in: Duration) -> Action {
    Action::requeue(retry_in + Duration::from_millis(5))
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
    let result = reconcile_node(&node, &name, &ctx)
        .instrument(span.clone())
        .await;
    ctx.metrics.reconciled(started.elapsed());
    match &result {
        Ok(_) => {
            ctx.failures
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&name);
        }
        Err(e) => {
            ctx.metrics.reconcile_failed(e.category());
            if ctx.metrics.set_node_state(&name, NodeState::Failing) != Some(NodeState::Failing) {
                let note = format!(
                    "cannot look up or write this node's topology labels; they are left as they are: {e}"
                );
                publish(
                    &ctx,
                    &node,
                    EventType::Warning,
                    "TopologyLabelingFailed",
                    note,
                )
                .instrument(span)
                .await;
            }
        }
    }
    result
}

/// Record an Event on the node. Events are informative: failing to record one is only logged.
async fn publish(ctx: &Context, node: &LiteNode, type_: EventType, reason: &str, note: String) {
    let Some(recorder) = &ctx.recorder else {
        return;
    };
    // The Events API caps notes at 1 kB.
    let note: String = note.chars().take(1000).collect();
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "LabelTopology".into(),
        secondary: None,
    };
    // Events are informative: never let one hold up a reconcile.
    match tokio::time::timeout(
        Duration::from_secs(5),
        recorder.publish(&event, &node.object_ref(&())),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!(error = %e, "could not record an event"),
        Err(_) => debug!("recording an event timed out"),
    }
}

async fn reconcile_node(node: &LiteNode, name: &str, ctx: &Context) -> Result<Action> {
    ctx.metrics.pending_if_new(name);
    let assessment = assess(node, &ctx.scheme, ctx.region.as_deref(), &ctx.lookup).await?;
    match assessment {
        Assessment::Skipped(reason) => {
            let state = NodeState::Skipped(reason.as_str());
            if ctx.metrics.set_node_state(name, state.clone()) != Some(state) {
                debug!(
                    provider_id = %provider_id::for_log(provider_id_of(node)),
                    %reason,
                    "not an EC2 instance we can look up; skipping until its providerID changes"
                );
            }
            // The watch brings the node back when its providerID changes.
            Ok(Action::await_change())
        }
        Assessment::NotDescribed {
            instance_id,
            retry_in,
        } => {
            tracing::Span::current().record("instance", instance_id.as_str());
            if ctx.metrics.set_node_state(name, NodeState::NotDescribed)
                != Some(NodeState::NotDescribed)
            {
                debug!(
                    retry_in_s = retry_in.as_secs(),
                    "EC2 does not describe this instance (unsupported type or not running yet); leaving its labels alone"
                );
            }
            Ok(on_grid(retry_in))
        }
        Assessment::Rejected {
            instance_id,
            error,
            retry_in,
        } => {
            tracing::Span::current().record("instance", instance_id.as_str());
            if ctx.metrics.set_node_state(name, NodeState::Rejected) != Some(NodeState::Rejected) {
                warn!(%error, retry_in_s = retry_in.as_secs(), provider_id = %provider_id::for_log(provider_id_of(node)),
                    "EC2 refuses this node's instance ID; leaving its labels alone and keeping it out of other nodes' calls");
                let note = format!(
                    "EC2 refuses instance ID {instance_id} from this node's providerID ({error}); its labels are left as they are and it is asked about again in {}s",
                    retry_in.as_secs()
                );
                publish(ctx, node, EventType::Warning, "InstanceIdRejected", note).await;
            }
            Ok(on_grid(retry_in))
        }
        Assessment::Invalid { instance_id, error } => {
            tracing::Span::current().record("instance", instance_id.as_str());
            ctx.metrics.reconcile_failed("invalid_topology");
            // Not an answer to keep: ask EC2 again later, with the backoff of an instance it
            // did not describe, rather than trusting it until the cache TTL.
            let retry_in = ctx.lookup.reject(&instance_id);
            if ctx.metrics.set_node_state(name, NodeState::Failing) != Some(NodeState::Failing) {
                warn!(%error, retry_in_s = retry_in.as_secs(), "cannot label from EC2's answer; leaving the node's labels alone");
                let note = format!(
                    "EC2's topology answer cannot be turned into labels; they are left as they are: {error}"
                );
                publish(ctx, node, EventType::Warning, "TopologyInvalid", note).await;
            }
            Ok(on_grid(retry_in))
        }
        Assessment::Ready {
            instance_id,
            desired,
            diff,
            refresh_error,
            recheck_in,
        } => {
            tracing::Span::current().record("instance", instance_id.as_str());
            // Next look: at the resync, or sooner while EC2's answer is still settling.
            let next = || recheck_in.map_or_else(|| Action::requeue(jittered(ctx.resync)), on_grid);
            if let Some(e) = refresh_error {
                warn!(error = %e, "refreshing the topology failed; using the earlier answer");
            }
            if diff.is_empty() {
                ctx.echoes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .seen(name);
                ctx.metrics.set_node_state(name, NodeState::Labelled);
                return Ok(next());
            }
            if ctx
                .echoes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .awaiting(node, &desired)
            {
                debug!("our last write is not in the node cache yet; not writing it again");
                ctx.metrics.set_node_state(name, NodeState::Labelled);
                return Ok(next());
            }
            if !ctx.leader.is_leader() {
                // Leadership was lost while we looked EC2 up.
                return Ok(Action::await_change());
            }
            let verdict = ctx
                .guard
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .before_write(name, boot_id(node), std::time::Instant::now());
            if let Verdict::Hold { until, first } = verdict {
                ctx.metrics.set_node_state(name, NodeState::Conflict);
                if first {
                    report_conflict(ctx, node, &diff, until).await;
                }
                let wait = until.saturating_duration_since(std::time::Instant::now());
                debug!(
                    wait_ms = wait.as_millis() as u64,
                    "label conflict: holding writes to this node"
                );
                return Ok(Action::requeue(wait + Duration::from_millis(100)));
            }
            {
                // A closed semaphore cannot happen (it is never closed); write regardless.
                let _permit = ctx.writes.acquire().await.ok();
                // The wait for a permit can be long under load: leadership may have lapsed.
                if !ctx.leader.is_leader() {
                    return Ok(Action::await_change());
                }
                if let Err(e) = write_labels(&ctx.nodes, node, &desired, &diff, &ctx.metrics).await
                {
                    if e.is_api_unavailable() {
                        ctx.api_failing.store(true, Ordering::SeqCst);
                    }
                    return Err(e);
                }
            }
            if ctx.api_failing.swap(false, Ordering::SeqCst)
                && let Some(kicks) = &ctx.kicks
            {
                // Writes work again (after an API server restart, say): nodes waiting out a
                // per-node backoff are re-checked now.
                info!("the API server accepts writes again; re-checking every node");
                let _ = kicks.unbounded_send(());
            }
            ctx.guard
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .written(name);
            ctx.echoes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .written(node, &desired);
            let summary = diff.summary();
            info!(changes = %summary, "node labels updated");
            ctx.metrics.set_node_state(name, NodeState::Labelled);
            publish(
                ctx,
                node,
                EventType::Normal,
                "TopologyLabelsUpdated",
                summary,
            )
            .await;
            Ok(next())
        }
    }
}

/// Someone keeps changing our labels on this node: say who, once per hold.
async fn report_conflict(
    ctx: &Context,
    node: &LiteNode,
    diff: &NodeDiff,
    until: std::time::Instant,
) {
    let keys: Vec<&String> = diff
        .labels
        .change
        .keys()
        .chain(diff.labels.remove.keys())
        .collect();
    // One GET of the full Node, once per hold: the cache keeps no managed fields.
    let full: Api<k8s_openapi::api::core::v1::Node> = Api::all(ctx.nodes.clone().into_client());
    let owners = match full.get(&node.name_any()).await {
        Ok(live) => other_owners(
            live.metadata.managed_fields.as_deref().unwrap_or_default(),
            &keys,
            FIELD_MANAGER,
        ),
        Err(_) => Vec::new(),
    };
    let pause = until
        .saturating_duration_since(std::time::Instant::now())
        .as_secs();
    let note = format!(
        "another writer ({}) keeps changing {:?}; not correcting this node for {pause}s to avoid a write loop",
        if owners.is_empty() {
            "unknown field manager".to_string()
        } else {
            owners.join(", ")
        },
        keys
    );
    warn!(owners = ?owners, keys = ?keys, pause_s = pause, "label conflict: {note}");
    ctx.metrics.label_conflict();
    publish(ctx, node, EventType::Warning, "TopologyLabelConflict", note).await;
}

/// The server-side apply body: the full set we manage. Keys the answer was silent on (see
/// [`Desired::keep`]) are re-applied with their current values so that apply does not drop them.
pub fn apply_body(node: &LiteNode, desired: &Desired) -> serde_json::Value {
    let mut labels = desired.labels.clone();
    let mut annotations = desired.annotations.clone();
    let current_labels = labels_of(node);
    let current_annotations = annotations_of(node);
    for key in &desired.keep {
        if let Some(v) = current_labels.get(key) {
            labels.insert(key.clone(), v.clone());
        }
        if let Some(v) = current_annotations.get(key) {
            annotations.insert(key.clone(), v.clone());
        }
    }
    let mut metadata = json!({ "name": node.name_any(), "labels": labels });
    if !annotations.is_empty() {
        metadata["annotations"] = json!(annotations);
    }
    // With the UID in the body, an apply to a node deleted meanwhile fails (409) instead of
    // creating a new Node of that name.
    if let Some(uid) = &node.metadata.uid {
        metadata["uid"] = json!(uid);
    }
    json!({ "apiVersion": "v1", "kind": "Node", "metadata": metadata })
}

/// One apply of the full managed set; then, only if stale keys survived it because another
/// manager co-owns them, one merge patch that removes exactly those keys.
pub async fn write_labels(
    nodes: &Api<LiteNode>,
    node: &LiteNode,
    desired: &Desired,
    diff: &NodeDiff,
    metrics: &Metrics,
) -> Result<()> {
    let name = node.name_any();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let applied = nodes
        .patch(&name, &params, &Patch::Apply(apply_body(node, desired)))
        .await?;
    metrics.label_write("apply");

    let live_labels = labels_of(&applied);
    let live_annotations = annotations_of(&applied);
    let stale_labels: Vec<&String> = diff
        .labels
        .remove
        .keys()
        .filter(|k| live_labels.contains_key(*k))
        .collect();
    let stale_annotations: Vec<&String> = diff
        .annotations
        .remove
        .keys()
        .filter(|k| live_annotations.contains_key(*k))
        .collect();
    if stale_labels.is_empty() && stale_annotations.is_empty() {
        return Ok(());
    }
    let null_map = |keys: &[&String]| -> serde_json::Map<String, serde_json::Value> {
        keys.iter()
            .map(|k| ((*k).clone(), serde_json::Value::Null))
            .collect()
    };
    let mut metadata = serde_json::Map::new();
    // A precondition: if anyone wrote the node since our apply (a fresh value for one of these
    // keys, say), the API server refuses this patch (409) and the next reconcile decides anew.
    if let Some(rv) = &applied.metadata.resource_version {
        metadata.insert("resourceVersion".into(), rv.clone().into());
    }
    if !stale_labels.is_empty() {
        metadata.insert("labels".into(), null_map(&stale_labels).into());
    }
    if !stale_annotations.is_empty() {
        metadata.insert("annotations".into(), null_map(&stale_annotations).into());
    }
    debug!(
        ?stale_labels,
        ?stale_annotations,
        "stale keys are co-owned by another field manager; removing them explicitly"
    );
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    nodes
        .patch(
            &name,
            &params,
            &Patch::Merge(json!({ "metadata": metadata })),
        )
        .await?;
    metrics.label_write("remove");
    Ok(())
}

pub fn error_policy(node: Arc<LiteNode>, err: &Error, ctx: Arc<Context>) -> Action {
    let name = node.name_any();
    let failures = {
        let mut f = ctx.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = f.entry(name.clone()).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
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
    let delay = backoff / 2 + backoff.mul_f64(fastrand::f64() / 2.0);
    if err.needs_operator() {
        // One line a minute for the whole fleet, not one per node.
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let last = ctx.operator_error_logged_at.load(Ordering::Relaxed);
        if now >= last + 60
            && ctx
                .operator_error_logged_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            error!(node = %name, category = err.category(), error = %err, "cannot label nodes until this is fixed; retrying with backoff");
        }
    } else {
        warn!(node = %name, category = err.category(), error = %err, retry_in_ms = delay.as_millis() as u64, "reconcile failed; labels left as they are");
    }
    Action::requeue(delay)
}

/// Keep only our label family and annotation: the rest of the Node was never deserialized
/// (see [`LiteNode`]), and other labels do not matter to a reconcile.
pub fn prune(node: &mut LiteNode, scheme: &LabelScheme) {
    let meta = &mut node.metadata;
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|k, _| scheme.is_family_label(k));
    }
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| scheme.is_family_annotation(k));
    }
}

/// Hash of what can change a reconcile's outcome; other updates (heartbeats, images, unrelated
/// labels) do not trigger one. Applied to pruned nodes.
fn relevant(node: &LiteNode) -> Option<u64> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    node.metadata.labels.hash(&mut h);
    node.metadata.annotations.hash(&mut h);
    provider_id_of(node).hash(&mut h);
    boot_id(node).hash(&mut h);
    Some(h.finish())
}

/// Build the lookup stack: EC2 client, shared limiter, batching cache.
pub async fn lookup_from(
    ec2: &crate::config::Ec2Args,
    lookup: &crate::config::LookupArgs,
    metrics: Arc<Metrics>,
) -> Lookup {
    let source = AwsTopology::from_env(ec2.ec2_timeout.0).await;
    let limiter = Arc::new(Limiter::new(ec2.limiter()));
    Lookup::spawn(source, limiter, lookup.lookup(), metrics)
}

/// Run the controller until SIGINT/SIGTERM.
pub async fn run(args: RunArgs) -> Result<()> {
    let scheme = args.labels.scheme().map_err(Error::Config)?;
    if args.leader.leader_election {
        crate::leader::Timings::from_args(&args.leader)?;
    }
    let metrics = Arc::new(Metrics::new());
    // Ready once the first list is in the cache. Served before anything talks to the API
    // server: while start-up waits for a cluster that is still settling, the probes see a live
    // process that is not ready (rather than one that exits and restarts).
    let synced = Arc::new(AtomicBool::new(false));
    let live = crate::http::Liveness::default();
    let listener = tokio::net::TcpListener::bind(args.serve.metrics_addr).await?;
    tokio::spawn(crate::http::serve(
        listener,
        metrics.clone(),
        synced.clone(),
        live.clone(),
    ));
    let client = Client::try_default().await?;
    let lookup = lookup_from(&args.ec2, &args.lookup, metrics.clone()).await;
    let batcher = lookup.clone();
    live.check("ec2 batcher", move || batcher.batcher_running());
    let nodes: Api<LiteNode> = Api::all(client.clone());
    let resync = args.controller.resync_period.0;
    let mut ctx = Context::new(
        nodes.clone(),
        lookup.clone(),
        scheme.clone(),
        args.ec2.region.clone(),
        resync,
        metrics.clone(),
    );
    ctx.writes = tokio::sync::Semaphore::new(usize::from(args.controller.write_concurrency.max(1)));
    ctx.guard = Mutex::new(ConflictGuard::new(GuardConfig {
        backoff: args.controller.conflict_backoff.0,
        ..GuardConfig::default()
    }));
    let identity = args
        .leader
        .identity
        .clone()
        .unwrap_or_else(default_identity);
    if args.serve.events {
        ctx.recorder = Some(Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: Some(identity.clone()),
            },
        ));
    }
    let (elected_tx, elected_rx) = futures::channel::mpsc::unbounded::<()>();
    let (kicks_tx, kicks_rx) = futures::channel::mpsc::unbounded::<()>();
    ctx.kicks = Some(kicks_tx);
    let election = if args.leader.leader_election {
        let (election, leadership) = crate::leader::Election::start(
            client.clone(),
            &args.leader,
            identity,
            metrics.clone(),
            elected_tx,
            live.task("leader election"),
        )?;
        ctx.leader = leadership;
        Some(election)
    } else {
        metrics.set_leader(true);
        None
    };
    let ctx = Arc::new(ctx);

    let (reader, writer) = reflector::store();
    let prune_scheme = scheme.clone();
    // Read from the stream itself: the store's own readiness signal wakes a single waiter, and
    // the controller is already waiting on it.
    let mark_synced = synced.clone();
    let triggers = watcher(nodes, watcher::Config::default())
        .default_backoff()
        .modify(move |node| prune(node, &prune_scheme))
        .reflect(writer)
        .inspect(move |event| {
            if matches!(event, Ok(watcher::Event::InitDone))
                && !mark_synced.swap(true, Ordering::SeqCst)
            {
                info!("node cache synced");
            }
        })
        .touched_objects()
        .predicate_filter(
            relevant,
            PredicateConfig::default().ttl(resync.saturating_mul(3)),
        );

    // Each time EC2 answers again after failing, re-check every node: those waiting out a
    // per-node backoff are labelled now (they share batched calls; the rest are cache hits).
    let recoveries = futures::stream::unfold(lookup.recoveries(), |mut rx| async move {
        rx.changed().await.ok()?;
        info!("EC2 answers again; re-checking every node");
        Some(((), rx))
    });
    if crate::publish::Publishers::enabled(&args.publish) {
        let alive = live.task("scheduler publishers");
        tokio::spawn(
            crate::publish::Publishers {
                client: client.clone(),
                args: args.publish.clone(),
                scheme: scheme.clone(),
                reader: reader.clone(),
                leader: ctx.leader.clone(),
                synced: synced.clone(),
                metrics: metrics.clone(),
                recorder: ctx.recorder.clone(),
                last_error: Default::default(),
            }
            .run(alive),
        );
    }
    tokio::spawn(retire_at_start(
        Api::all(client.clone()),
        scheme.clone(),
        ctx.leader.clone(),
        metrics.clone(),
        synced.clone(),
    ));
    tokio::spawn(housekeeping(
        live.task("housekeeping"),
        reader.clone(),
        lookup,
        metrics.clone(),
        ctx.clone(),
        resync,
    ));

    info!(resync_s = resync.as_secs(), "controller starting");
    Controller::for_stream(triggers, reader)
        .with_config(controller::Config::default().concurrency(args.controller.concurrency))
        .reconcile_all_on(futures::stream::select(
            elected_rx,
            futures::stream::select(recoveries, kicks_rx),
        ))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                match e {
                    controller::Error::ObjectNotFound(_)
                    | controller::Error::ReconcilerFailed(..) => {}
                    // The watcher relists by itself (after an expired resource version, a restarted
                    // API server); nothing is lost.
                    controller::Error::QueueError(e) => {
                        info!(error = %e, "watch interrupted; resuming")
                    }
                    other => warn!(error = %other, "controller event"),
                }
            }
        })
        .await;
    if let Some(election) = election {
        election.stop().await;
    }
    info!("controller stopped");
    Ok(())
}

/// Hostname and PID: unique enough among replicas when no Pod name is given.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "ec2-topology-labeler".into());
    format!("{host}-{}", std::process::id())
}

/// Once this replica leads and its cache synced: remove the labels we wrote under an earlier
/// configuration and no longer manage (see [`crate::retire`]).
async fn retire_at_start(
    api: Api<k8s_openapi::api::core::v1::Node>,
    scheme: LabelScheme,
    leader: Leadership,
    metrics: Arc<Metrics>,
    synced: Arc<AtomicBool>,
) {
    let mut delay = Duration::from_secs(5);
    loop {
        while !(leader.is_leader() && synced.load(Ordering::SeqCst)) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        match crate::retire::retire_all(&api, &scheme, &leader, &metrics).await {
            Ok(0) => return,
            Ok(n) => {
                info!(
                    nodes = n,
                    "removed labels this configuration no longer manages"
                );
                return;
            }
            Err(e) => {
                warn!(error = %e, retry_in_s = delay.as_secs(), "cannot list nodes to find labels no longer managed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(300));
            }
        }
    }
}

/// Forget deleted nodes: their metrics state and, once unused, their cached answers.
async fn housekeeping(
    _alive: crate::http::TaskGuard,
    reader: Store<LiteNode>,
    lookup: Lookup,
    metrics: Arc<Metrics>,
    ctx: Arc<Context>,
    resync: Duration,
) {
    let guard = &ctx.guard;
    let every = (resync / 4).clamp(Duration::from_secs(10), Duration::from_secs(900));
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let live: std::collections::HashSet<String> =
            reader.state().iter().map(|n| n.name_any()).collect();
        for name in metrics.known_nodes() {
            if !live.contains(&name) {
                metrics.forget_node(&name);
                guard
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .forget(&name);
            }
        }
        ctx.echoes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(&live);
        ctx.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|name, _| live.contains(name));
        let instances: std::collections::HashSet<String> = reader
            .state()
            .iter()
            .filter_map(|n| provider_id::parse(n.provider_id()).ok())
            .map(|i| i.instance_id)
            .collect();
        let evicted = lookup.retain_instances(&instances);
        if evicted > 0 {
            debug!(
                evicted,
                "dropped cached answers of instances no node runs on"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, rv: Option<&str>) -> LiteNode {
        let mut n = LiteNode::default();
        n.metadata.name = Some(name.into());
        n.metadata.uid = Some(format!("uid-{name}"));
        n.metadata.resource_version = rv.map(String::from);
        n
    }

    fn desired(leaf: &str) -> Desired {
        Desired {
            labels: [(
                "topology.k8s.aws/network-node-layer-3".to_string(),
                leaf.to_string(),
            )]
            .into(),
            ..Desired::default()
        }
    }

    #[test]
    fn echoes_hold_only_while_the_cache_is_behind_and_go_with_their_node() {
        let mut echoes = Echoes::default();
        echoes.written(&node("a", Some("1")), &desired("x"));
        echoes.written(&node("b", Some("1")), &desired("x"));
        echoes.written(&node("c", None), &desired("x"));
        assert_eq!(echoes.len(), 2, "no resourceVersion, nothing to wait for");
        assert!(echoes.awaiting(&node("a", Some("1")), &desired("x")));
        assert!(
            !echoes.awaiting(&node("a", Some("1")), &desired("y")),
            "other labels needed"
        );
        assert!(
            !echoes.awaiting(&node("a", Some("1")), &desired("x")),
            "forgotten after that"
        );
        let mut recreated = node("b", Some("1"));
        recreated.metadata.uid = Some("uid-b-2".into());
        assert!(
            !echoes.awaiting(&recreated, &desired("x")),
            "another object of that name"
        );
        echoes.written(&node("d", Some("7")), &desired("x"));
        echoes.retain(&["e".to_string()].into());
        assert!(echoes.is_empty(), "entries go with their node");
    }
}

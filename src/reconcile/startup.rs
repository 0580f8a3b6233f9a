//! The startup gate, applied: once a reconcile knows where a node stands, keep its
//! `TopologyLabeled` condition and release its startup taint when [`gate`] says so.
//!
//! Owns: the gate's writes for one node, in order (condition, then taint), each made by the
//! leader only, under a write permit. Never decides (the pure [`gate`] does).

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::admin::events::Reason;
use tracing::{info, warn};

use super::{
    Context, events,
    gate::{self, GatePlan, Release, Standing, TaintAction},
    nodes::GateMark,
    write::{release_taint, write_condition},
};
use crate::{Result, node::LiteNode};

/// Takes the gate's step on `node` (for [`Standing::Labelled`]: the version the API server
/// returned for our label write, or a cached version that already carries `labels`): decided by
/// [`gate::Gate::plan`], carried out here. Returns how soon to look at the node again for the
/// gate's sake (a timeout, a settling type, a cache behind our write), if sooner than usual.
pub(super) async fn step(
    ctx: &Context,
    node: &LiteNode,
    standing: &Standing,
    labels: Option<&BTreeMap<String, String>>,
) -> Result<Option<Duration>> {
    let gate = &ctx.gate;
    if !gate.enabled() {
        return Ok(None);
    }
    let behind = ctx.records.with(node, |r| {
        r.gate_behind(node, |mark| shows(gate, node, labels, mark))
    });
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let plan = gate.plan(node, standing, behind, &now);
    let GatePlan::Step { condition, taint } = plan else {
        return Ok(plan.recheck());
    };
    if condition.is_none() && !matches!(taint, TaintAction::Release(_)) {
        // Nothing to write (most steps): said without the writes' future (see `act`).
        return Ok(match taint {
            TaintAction::Keep(recheck) => recheck,
            _ => None,
        });
    }
    Box::pin(act(ctx, node, standing, labels, now, condition, taint)).await
}

/// The step's writes: the condition, then the taint's release. Boxed where it is awaited: a
/// reconcile's future holds what its awaits hold, and is moved whole each time its task is
/// spawned and polled to its end (see `carry_out`).
async fn act(
    ctx: &Context,
    node: &LiteNode,
    standing: &Standing,
    labels: Option<&BTreeMap<String, String>>,
    now: Time,
    condition: Option<gate::Wanted>,
    taint: TaintAction,
) -> Result<Option<Duration>> {
    let gate = &ctx.gate;
    let mut current = std::borrow::Cow::Borrowed(node);
    if let Some(wanted) = condition {
        let _permit = ctx.writes.acquire().await.ok();
        if !ctx.leader.is_leader() {
            return Ok(None);
        }
        // `plan` kept it because the node's condition says something else: there is a body.
        if let Some(body) = wanted.patch(node, &now) {
            let updated = write_condition(&ctx.api, &node.name_any(), body, &ctx.metrics).await?;
            ctx.records.with(node, |r| {
                r.gate_written(
                    updated.metadata.resource_version.clone(),
                    GateMark::Condition {
                        status: wanted.status,
                        reason: wanted.reason,
                    },
                )
            });
            current = std::borrow::Cow::Owned(updated);
        }
    }
    // The taint is judged on the version the condition write returned, when there is one: a
    // taint added meanwhile (a provisioner syncing its startup taints) is acted on now.
    let taint = match (&current, &gate.taint) {
        (std::borrow::Cow::Owned(updated), Some(t)) => {
            gate.taint_action(t.on(updated), standing, gate::age(node, &now))
        }
        _ => taint,
    };
    let recheck = match taint {
        TaintAction::Keep(recheck) => recheck,
        _ => None,
    };
    let (TaintAction::Release(why), Some(startup_taint)) = (taint, &gate.taint) else {
        return Ok(recheck);
    };
    let _permit = ctx.writes.acquire().await.ok();
    if !ctx.leader.is_leader() {
        return Ok(None);
    }
    let must_carry = if why == Release::Labelled {
        labels
    } else {
        None
    };
    // `release_taint` looks at the version it writes to: a taint gone meanwhile is left gone.
    let Some(updated) = release_taint(
        &ctx.api,
        &current,
        startup_taint,
        must_carry,
        &ctx.metrics,
        &ctx.leader,
    )
    .await?
    else {
        return Ok(None);
    };
    ctx.records.with(node, |r| {
        r.gate_written(
            updated.metadata.resource_version.clone(),
            GateMark::TaintReleased,
        )
    });
    let age = gate::age(node, &now);
    ctx.metrics.taint_released(why.as_str(), age);
    announce(ctx, node, startup_taint, why, standing, age).await;
    Ok(None)
}

/// Does `node`, a version other than the one our gate write returned, show what that write
/// left (`mark`)? Then it is a later version (or the cache holds ours under another name).
/// `labels`: the labels the caller wants, when it knows them.
fn shows(
    gate: &gate::Gate,
    node: &LiteNode,
    labels: Option<&BTreeMap<String, String>>,
    mark: GateMark,
) -> bool {
    match mark {
        // Without the labels wanted there is no telling: behind, until the version or the cap.
        GateMark::Labels => labels.is_some_and(|want| {
            want.iter()
                .all(|(k, v)| node.label(k).as_deref() == Some(v.as_str()))
        }),
        GateMark::Condition { status, reason } => node.topology_condition().is_some_and(|c| {
            c.status == if status { "True" } else { "False" } && c.reason.as_deref() == Some(reason)
        }),
        GateMark::TaintReleased => gate.taint.as_ref().is_none_or(|t| !t.on(node)),
    }
}

async fn announce(
    ctx: &Context,
    node: &LiteNode,
    taint: &gate::StartupTaint,
    why: Release,
    standing: &Standing,
    age: Duration,
) {
    let age_s = age.as_secs();
    match why {
        Release::Labelled => {
            info!(taint = %taint, age_s, "startup taint released: topology labels written");
        }
        Release::Unsupported => {
            let note = format!(
                "startup taint {taint} released: this node's topology cannot be labelled ({standing:?}); policy --startup-taint-when-unsupported=release"
            );
            info!(taint = %taint, ?standing, "startup taint released: node cannot be labelled");
            events::record(ctx, node, Reason::StartupTaintReleased, note).await;
        }
        Release::Timeout => {
            let note = format!(
                "startup taint {taint} released {age_s}s after the node was created, without its topology labels ({standing:?}): --startup-taint-timeout passed"
            );
            warn!(taint = %taint, ?standing, age_s, "startup taint released by timeout, topology not labelled");
            events::record(ctx, node, Reason::StartupTaintTimedOut, note).await;
        }
    }
}

//! Kubernetes Events on Nodes: informative, on changes and transitions only, handed to
//! [`crate::admin::events`] (which never waits). Reporting a conflict with another writer costs
//! one read of the Node, once per hold.
//!
//! Owns: which Events a reconcile's outcome gives. Never changes labels.

use kube::Api;
use tracing::warn;

use super::{Context, conflict::other_owners};
use crate::{FIELD_MANAGER, admin::events::Reason, labels::NodeDiff, node::LiteNode};

/// Record an Event on the node (never waits: see [`crate::admin::events`]).
pub(super) async fn record(ctx: &Context, node: &LiteNode, reason: Reason, note: String) {
    ctx.events
        .publish(reason, "LabelTopology", &note, node.object_ref());
}

/// Someone keeps changing our labels on this node: say who, once per hold.
pub(super) async fn report_conflict(
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
    let full: Api<k8s_openapi::api::core::v1::Node> = Api::all(ctx.api.clone().into_client());
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
    ctx.metrics.label_conflict(&owners);
    record(ctx, node, Reason::TopologyLabelConflict, note).await;
}

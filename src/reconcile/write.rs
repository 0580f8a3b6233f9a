//! The writes: one server-side apply of the full managed set; then, only if stale keys survived
//! it because another manager co-owns them, one merge patch that removes exactly those keys,
//! conditional on the node being as our apply left it.
//!
//! Owns: the shape of every label write. Never decides whether to write (the reconciler does).

use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tracing::debug;

use super::assess::{annotations_of, labels_of};
use crate::{
    FIELD_MANAGER, Result,
    labels::{Desired, NodeDiff},
    metrics::Metrics,
    node::LiteNode,
};

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

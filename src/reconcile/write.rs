//! The writes: one server-side apply of the full managed set; then, only if stale keys survived
//! it because another manager co-owns them, one merge patch that removes exactly those keys,
//! conditional on the node being as our apply left it.
//!
//! The startup gate's writes are here too: the taint removal (a merge patch of the remaining
//! taints, conditional on the resourceVersion it was computed from, re-read and retried on
//! conflict) and the `TopologyLabeled` condition (a strategic-merge patch of the status
//! subresource that touches no other condition).
//!
//! Owns: the shape of the reconciler's and the startup gate's writes, and of the taint writes
//! others share ([`set_taint`]). Never decides whether to write (the reconciler does).

use std::collections::BTreeMap;

use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tracing::debug;

use super::{
    assess::{annotations_of, labels_of},
    gate::StartupTaint,
};
use crate::{
    FIELD_MANAGER, Result,
    labels::{Desired, NodeDiff},
    metrics::Metrics,
    node::{LiteNode, WireNode},
};

/// The server-side apply body: the full set we manage. Keys the answer was silent on (see
/// [`Desired::keep`]) are re-applied with their current values so that apply does not drop them.
pub(crate) fn apply_body(node: &LiteNode, desired: &Desired) -> serde_json::Value {
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
    // No resourceVersion: the apply is of the full set we manage, whatever changed meanwhile.
    crate::node::apply_body(
        node.name(),
        node.metadata.uid.as_deref(),
        None,
        &labels,
        &annotations,
    )
}

/// One apply of the full managed set; then, only if stale keys survived it because another
/// manager co-owns them, one merge patch that removes exactly those keys. Returns the node as
/// the API server holds it after the last write: whole when `whole` (the startup gate reads its
/// taints), otherwise its metadata only.
///
/// Asking for metadata only (`as=PartialObjectMetadata`) spares the API server encoding, and us
/// decoding, a whole Node (~15 kB with its images) for every write: during an install of
/// thousands of nodes the API server is the bottleneck, and every byte it encodes counts.
pub(crate) async fn write_labels(
    nodes: &Api<WireNode>,
    node: &LiteNode,
    desired: &Desired,
    diff: &NodeDiff,
    metrics: &Metrics,
    whole: bool,
) -> Result<LiteNode> {
    let name = node.name_any();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let body = Patch::Apply(apply_body(node, desired));
    let applied = if whole {
        LiteNode::from(nodes.patch(&name, &params, &body).await?)
    } else {
        let req = kube::core::Request::new(nodes.resource_url())
            .patch_metadata(&name, &params, &body)
            .map_err(kube::Error::BuildRequest)?;
        // A `PartialObjectMetadata` reads as a Node without spec and status.
        nodes.clone().into_client().request::<LiteNode>(req).await?
    };
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
        return Ok(applied);
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
    let params = ours();
    let patched = nodes
        .patch(
            &name,
            &params,
            &Patch::Merge(json!({ "metadata": metadata })),
        )
        .await?;
    metrics.label_write("remove");
    Ok(patched.into())
}

/// Conflicts in a row after which a taint removal gives up (the next reconcile tries again).
const TAINT_ATTEMPTS: usize = 5;

/// Removes `taint` from the node, keeping every other taint. `node` is the version to start
/// from; each attempt is a merge patch of the remaining taints conditional on that version's
/// resourceVersion, so a concurrent edit of the taints (or of anything) makes it fail with 409,
/// and the node is read again and the removal computed anew. When `must_carry` is given, the
/// taint is removed only from a version that carries those labels (the labels we wrote, as the
/// API server holds them). Returns the node as the removal left it; `None` when the node no
/// longer carries the taint (nothing is written) or no longer carries the labels, or when
/// `leader` says this replica no longer leads (checked before each attempt: a 409 and the read
/// after it take time, in which the lease can pass to another replica).
pub(crate) async fn release_taint(
    nodes: &Api<WireNode>,
    node: &LiteNode,
    taint: &StartupTaint,
    must_carry: Option<&BTreeMap<String, String>>,
    metrics: &Metrics,
    leader: &crate::leader::Leadership,
) -> Result<Option<LiteNode>> {
    let name = node.name_any();
    let mut current = std::borrow::Cow::Borrowed(node);
    let mut attempt = 0;
    loop {
        if !taint.on(&current) {
            return Ok(None);
        }
        if let Some(want) = must_carry {
            let have = labels_of(&current);
            if want.iter().any(|(k, v)| have.get(k) != Some(v)) {
                debug!("the node no longer carries our labels; keeping its startup taint");
                return Ok(None);
            }
        }
        if !leader.is_leader() {
            debug!("no longer leading; leaving the startup taint to the leader");
            return Ok(None);
        }
        let body = taints_patch(&current, taint.others(&current));
        match nodes.patch(&name, &ours(), &Patch::Merge(body)).await {
            Ok(updated) => {
                metrics.label_write("taint");
                return Ok(Some(updated.into()));
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempt + 1 < TAINT_ATTEMPTS => {
                attempt += 1;
                debug!(
                    attempt,
                    "the node changed since it was read; reading it again"
                );
                current = std::borrow::Cow::Owned(nodes.get(&name).await?.into());
                if current.metadata.uid != node.metadata.uid {
                    // Deleted and re-created under the same name: not the node we decided for.
                    return Ok(None);
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The merge patch that sets `node`'s whole taint list to `taints`, conditional on the
/// resourceVersion and UID it was read with (a concurrent edit fails it with 409; a node deleted
/// and re-created under the name is not the one decided for).
fn taints_patch(
    node: &LiteNode,
    taints: Vec<k8s_openapi::api::core::v1::Taint>,
) -> serde_json::Value {
    let mut metadata = serde_json::Map::new();
    if let Some(rv) = &node.metadata.resource_version {
        metadata.insert("resourceVersion".into(), rv.clone().into());
    }
    if let Some(uid) = &node.metadata.uid {
        metadata.insert("uid".into(), uid.clone().into());
    }
    json!({ "metadata": metadata, "spec": { "taints": taints } })
}

/// Patch parameters under our field manager.
fn ours() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

/// Adds (`on`) or removes `taint` on node `name`, keeping every other taint: a merge patch of
/// the whole list conditional on the resourceVersion (and UID) it was computed from; a
/// concurrent edit makes it fail with 409, and the node is read again and the change tried anew
/// (at most [`TAINT_ATTEMPTS`] times). `false`: nothing to write (already so, or the node is
/// gone), or `leader` says this replica no longer leads (checked before each attempt).
///
/// The interconnect taint's writer ([`crate::publish::interconnect`]) and the removals of
/// [`crate::cleanup`]; the startup taint's release is [`release_taint`] (it also checks labels).
pub(crate) async fn set_taint(
    nodes: &Api<WireNode>,
    name: &str,
    taint: &StartupTaint,
    on: bool,
    leader: &crate::leader::Leadership,
) -> std::result::Result<bool, kube::Error> {
    for _ in 0..TAINT_ATTEMPTS {
        if !leader.is_leader() {
            return Ok(false);
        }
        let Some(node) = nodes.get_opt(name).await? else {
            return Ok(false);
        };
        let node = LiteNode::from(node);
        if taint.on(&node) == on {
            return Ok(false);
        }
        let mut taints = taint.others(&node);
        if on {
            taints.push(k8s_openapi::api::core::v1::Taint {
                key: taint.key.clone(),
                value: taint.value.clone(),
                effect: taint.effect.clone(),
                time_added: None,
            });
        }
        let body = taints_patch(&node, taints);
        match nodes.patch(name, &ours(), &Patch::Merge(body)).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// Writes the `TopologyLabeled` condition (`body` from [`super::gate::Wanted::patch`]) on the
/// status subresource; the kubelet's conditions are left alone (strategic merge by type).
pub(crate) async fn write_condition(
    nodes: &Api<WireNode>,
    name: &str,
    body: serde_json::Value,
    metrics: &Metrics,
) -> Result<LiteNode> {
    let params = ours();
    let updated = nodes
        .patch_status(name, &params, &Patch::Strategic(body))
        .await?;
    metrics.label_write("condition");
    Ok(updated.into())
}

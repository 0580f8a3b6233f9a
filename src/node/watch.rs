//! The one watch of the Nodes ([`nodes`]: listed in pages, then watched, feeding the node cache,
//! its errors counted and its health told), what it keeps of each Node ([`prune`]: the fields
//! and labels a reconcile, `tree`, `explain` and the gauges read) and which of its changes wake
//! a reconcile ([`relevant`]: not heartbeats, images or other labels).
//!
//! Owns: the Node watch and those two rules. Never writes to the cluster.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{Stream, StreamExt, TryStreamExt};
use kube::{
    Api,
    runtime::{WatchStreamExt, watcher},
};
use tracing::{error, info, warn};

use crate::{
    client::WatchHealth,
    labels::{
        CAPACITY_BLOCK_SIZE_KEY, CLIQUE_LABEL, INSTANCE_TYPE_LABEL, LabelScheme,
        ULTRASERVER_TYPE_KEY,
    },
    metrics::Metrics,
    node::LiteNode,
    node::{
        WireNode,
        store::{Feeder, NODE_PAGE, map_event},
    },
};

/// Keep only our label family and annotation: the rest of the Node was never deserialized
/// (see [`LiteNode`]), and other labels do not matter to a reconcile.
pub(crate) fn prune(node: &mut LiteNode, scheme: &LabelScheme) {
    let meta = &mut node.metadata;
    if let Some(labels) = meta.labels.as_mut() {
        // The instance type tells a type EC2 describes (but has not yet) from one it never will;
        // it and the zone are what coverage counts nodes by; the reservation a node joined
        // from, what the reserved-capacity gauges count; the NVLink clique, what the
        // UltraServers are checked against.
        labels.retain(|k, _| {
            scheme.is_family_label(k)
                || k == INSTANCE_TYPE_LABEL
                || k == crate::coverage::ZONE_LABEL
                || k == crate::reservations::RESERVATION_LABEL
                || k == CLIQUE_LABEL
                || k == ULTRASERVER_TYPE_KEY
                || k == CAPACITY_BLOCK_SIZE_KEY
        });
    }
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| {
            scheme.is_family_annotation(k) || k == crate::labels::CAPACITY_BLOCK_END_KEY
        });
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
    node.pack_labels();
    node.pack_annotations();
}

/// One event of the watch into the node cache, each node [`prune`]d as it arrives: the node whose
/// cached form the event changed, if any. (`benches/node_event.rs` times it, with the decoding
/// before it and [`relevant`] after it, on a captured Node.)
#[doc(hidden)]
pub fn ingest(
    feeder: &mut Feeder,
    scheme: &LabelScheme,
    event: watcher::Event<WireNode>,
) -> Option<Arc<LiteNode>> {
    feeder.apply(map_event(event, |wire| {
        let mut node = LiteNode::from(wire);
        prune(&mut node, scheme);
        node
    }))
}

/// Hash of what can change a reconcile's outcome; other updates (heartbeats, images, unrelated
/// labels) do not trigger one. Applied to pruned nodes.
pub fn relevant(node: &LiteNode) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    // A node deleted and created again under the same name is a new node.
    node.metadata.uid.hash(&mut h);
    node.metadata.labels.hash(&mut h);
    node.packed_labels().hash(&mut h);
    node.metadata.annotations.hash(&mut h);
    node.packed_annotations().hash(&mut h);
    node.kept_record().hash(&mut h);
    node.provider_id().hash(&mut h);
    node.boot_id().hash(&mut h);
    // The startup gate acts on taints (one added or removed) and on our condition.
    for t in &node.spec.taints {
        (&t.key, &t.value, &t.effect).hash(&mut h);
    }
    if let Some(c) = node.topology_condition() {
        (&c.status, &c.reason).hash(&mut h);
    }
    h.finish()
}

/// The reason label of a watch error.
pub(crate) fn error_reason(e: &kube::runtime::watcher::Error) -> &'static str {
    use kube::runtime::watcher::Error as W;
    let client = match e {
        W::InitialListFailed(e) | W::WatchStartFailed(e) | W::WatchFailed(e) => e,
        W::WatchError(s) => {
            return match s.code {
                401 | 403 => "forbidden",
                404 => "not_found",
                _ => "api",
            };
        }
        W::NoResourceVersion => return "other",
    };
    match client {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => "forbidden",
        kube::Error::Api(s) if s.code == 404 => "not_found",
        kube::Error::Api(_) => "api",
        kube::Error::SerdeError(_) => "decode",
        kube::Error::Service(_) if crate::client::Cut::of(client).is_some() => "timeout",
        kube::Error::HyperError(_) | kube::Error::Service(_) => "connect",
        _ => "other",
    }
}

/// What the Node watch tells as it goes: its health (each event: working; each error: failing),
/// that the node cache synced (the first list is in), the first list's nodes as they come (for
/// the lookups ahead of their reconciles; a full channel drops one, never waits), and its
/// errors, counted by reason.
pub(crate) struct Told {
    pub(crate) health: Arc<WatchHealth>,
    pub(crate) synced: Arc<AtomicBool>,
    pub(crate) arrivals: tokio::sync::mpsc::Sender<Arc<LiteNode>>,
    pub(crate) metrics: Arc<Metrics>,
}

/// The one watch of the Nodes, feeding the node cache (`feeder`) with each node [`prune`]d:
/// yields each node whose cached form the event changed. The watcher lists in pages of
/// [`NODE_PAGE`] (a page is read whole before it is decoded, and with container images a Node
/// is ~15 kB of JSON: kube's default of 500 made each page of the initial list a transient of
/// several MB), renews the watch every `timeout` (when revoked rights show), and after an
/// error resumes by itself with backoff, relisting when it lost its place: nothing is lost.
pub(crate) fn nodes(
    api: Api<WireNode>,
    mut feeder: Feeder,
    scheme: LabelScheme,
    timeout: Duration,
    told: Told,
) -> impl Stream<Item = Arc<LiteNode>> + Send {
    let Told {
        health,
        synced,
        arrivals,
        metrics,
    } = told;
    let mut arrivals = Some(arrivals);
    let healthy = health.clone();
    watcher(
        api,
        watcher::Config::default()
            .page_size(NODE_PAGE)
            .timeout(u32::try_from(timeout.as_secs()).unwrap_or(290)),
    )
    .default_backoff()
    .map_ok(move |event| {
        healthy.ok();
        let done = matches!(event, watcher::Event::InitDone);
        let touched = ingest(&mut feeder, &scheme, event);
        if done {
            arrivals = None;
            if !synced.swap(true, Ordering::SeqCst) {
                info!("node cache synced");
            }
        }
        if let (Some(tx), Some(node)) = (&arrivals, &touched) {
            tx.try_send(node.clone()).ok();
        }
        touched
    })
    .filter_map(move |event| {
        std::future::ready(match event {
            Ok(touched) => touched,
            Err(e) => {
                let reason = error_reason(&e);
                metrics.watch_error(reason);
                health.error();
                if reason == "forbidden" {
                    error!(error = %e, "the Node watch is refused: the ServiceAccount needs list and watch on nodes (the chart's ClusterRole); the node cache is going stale, retrying with backoff");
                } else {
                    warn!(error = %e, reason, "the Node watch failed; resuming with backoff");
                }
                None
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 26.5: the node cache keeps what coverage groups by (instance type and zone) beside
    /// our label family, and nothing else.
    #[test]
    fn the_cache_keeps_the_type_and_zone_coverage_groups_by() {
        let mut node: LiteNode = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "labels": {
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "topology.kubernetes.io/zone": "us-west-2a",
                "topology.k8s.aws/network-node-layer-1": "nn-1",
                "kubernetes.io/hostname": "n1",
                "nvidia.com/gpu.clique": "3d0c6f52-0b8e-4c3b-9a51-6f4f0c2a9e11.1",
                "nvidia.com/gpu.product": "NVIDIA-GB200",
                "team": "ml"
            }}
        }))
        .expect("a node");
        prune(&mut node, &LabelScheme::default());
        let labels = node.labels();
        let kept: Vec<&str> = labels.keys().map(String::as_str).collect();
        assert_eq!(
            kept,
            [
                "node.kubernetes.io/instance-type",
                "nvidia.com/gpu.clique",
                "topology.k8s.aws/network-node-layer-1",
                "topology.kubernetes.io/zone"
            ],
            "and the NVLink clique the UltraServers are checked against"
        );
    }

    /// The cache keeps annotations packed: a change of the verification record alone is still a
    /// change that triggers a reconcile, and the same record is not.
    #[test]
    fn a_changed_record_in_the_cache_is_a_relevant_change() {
        let cached = |record: &str| {
            let mut node: LiteNode = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "n1", "uid": "u1", "annotations": {
                    crate::verified::VERIFIED_KEY: record,
                    "kubectl.kubernetes.io/last-applied-configuration": "{}"
                }}
            }))
            .expect("a node");
            prune(&mut node, &LabelScheme::default());
            node
        };
        let (a, same, other) = (cached("r1"), cached("r1"), cached("r2"));
        assert!(a.metadata.annotations.is_none(), "packed");
        assert_eq!(
            a.annotations()
                .keys()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            [crate::verified::VERIFIED_KEY],
            "only our annotation is kept"
        );
        assert_eq!(relevant(&a), relevant(&same));
        assert_ne!(relevant(&a), relevant(&other));
    }
}

//! What the node watch keeps of each Node ([`prune`]: the fields and labels a reconcile,
//! `tree`, `explain` and the gauges read) and which of its changes wake a reconcile
//! ([`relevant`]: not heartbeats, images or other labels).
//!
//! Owns: those two rules. Never talks to the API server.

use crate::{
    labels::LabelScheme,
    node::LiteNode,
    reconcile::{boot_id, gate::INSTANCE_TYPE_LABEL, provider_id_of},
};

/// Keep only our label family and annotation: the rest of the Node was never deserialized
/// (see [`LiteNode`]), and other labels do not matter to a reconcile.
pub fn prune(node: &mut LiteNode, scheme: &LabelScheme) {
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
                || k == crate::publish::cliques::CLIQUE_LABEL
                || k == crate::publish::shape::TYPE_KEY
                || k == crate::publish::shape::SIZE_KEY
        });
    }
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations
            .retain(|k, _| scheme.is_family_annotation(k) || k == crate::publish::shape::END_KEY);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
    node.pack_labels();
    node.pack_annotations();
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
    provider_id_of(node).hash(&mut h);
    boot_id(node).hash(&mut h);
    // The startup gate acts on taints (one added or removed) and on our condition.
    for t in &node.spec.taints {
        (&t.key, &t.value, &t.effect).hash(&mut h);
    }
    if let Some(c) = node.topology_condition() {
        (&c.status, &c.reason).hash(&mut h);
    }
    h.finish()
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

/// The reasons `watch_errors` counts (see [`error_reason`]).
pub const ERROR_REASONS: [&str; 7] = [
    "forbidden",
    "not_found",
    "timeout",
    "connect",
    "api",
    "decode",
    "other",
];

/// The reason label of a watch error.
pub fn error_reason(e: &kube::runtime::watcher::Error) -> &'static str {
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

/// How long after its last error a failing watch counts as recovered without an event or a
/// watch started (the client tells [`WatchHealth::ok`] when a Node watch request is answered):
/// longer than the watcher's longest pause between attempts (30 s, jittered up to twice that)
/// plus an attempt's own bounds (connect 10 s, request 30 s), so a failure that lasts keeps
/// counting.
pub const RECOVERED_AFTER: std::time::Duration = std::time::Duration::from_secs(180);

/// Whether the Node watch works: failing from the first error with no event since, while errors
/// keep coming. Read by readiness and the `node_watch_unhealthy_seconds` gauge.
#[derive(Debug, Default)]
pub struct WatchHealth {
    /// The first error of the current run of errors, and the latest.
    failing: std::sync::Mutex<Option<(tokio::time::Instant, tokio::time::Instant)>>,
    /// Whether `failing` holds a run: every watch event calls [`WatchHealth::ok`], which
    /// reads this alone while the watch works (no lock on the event path).
    any: std::sync::atomic::AtomicBool,
}

impl WatchHealth {
    /// An event arrived: the watch works.
    pub fn ok(&self) {
        use std::sync::atomic::Ordering;
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        // Both under the lock, as `error` sets them: a concurrent error is never lost.
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        *failing = None;
        self.any.store(false, Ordering::Release);
    }

    /// The watch failed (it restarts with backoff).
    pub fn error(&self) {
        let now = tokio::time::Instant::now();
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        *failing = match *failing {
            Some((since, last)) if last.elapsed() < RECOVERED_AFTER => Some((since, now)),
            _ => Some((now, now)),
        };
        self.any.store(true, std::sync::atomic::Ordering::Release);
    }

    /// How long the watch has been failing (zero while it works).
    pub fn unhealthy_for(&self) -> std::time::Duration {
        match *self.failing.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((since, last)) if last.elapsed() < RECOVERED_AFTER => since.elapsed(),
            _ => std::time::Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod health_tests {
    use std::time::Duration;

    use super::WatchHealth;

    /// A persistent failure (a revoked `watch`: a 403 at every retry, up to 90 s apart) is
    /// unhealthy from its first error on; an event (or a watch started) makes it healthy at
    /// once; errors that stop count as recovered after 180 s.
    #[tokio::test(start_paused = true)]
    async fn a_watch_is_unhealthy_while_errors_keep_coming_and_healthy_after() {
        let health = WatchHealth::default();
        assert_eq!(health.unhealthy_for(), Duration::ZERO);
        for _ in 0..10 {
            health.error();
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        assert_eq!(health.unhealthy_for(), Duration::from_secs(300));
        health.ok();
        assert_eq!(health.unhealthy_for(), Duration::ZERO, "an event: healthy");
        health.error();
        tokio::time::sleep(Duration::from_secs(90)).await;
        health.error();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(
            health.unhealthy_for(),
            Duration::from_secs(150),
            "errors 90 s apart (the longest backoff and an attempt's bounds) keep counting"
        );
        tokio::time::sleep(Duration::from_secs(121)).await;
        assert_eq!(
            health.unhealthy_for(),
            Duration::ZERO,
            "no error for 180 s: the watch resumed"
        );
        health.error();
        assert_eq!(
            health.unhealthy_for(),
            Duration::ZERO,
            "a new run starts now"
        );
    }
}

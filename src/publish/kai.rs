//! A KAI Scheduler `Topology` (`kai.scheduler/v1alpha1`) whose levels are our layer labels,
//! then `kubernetes.io/hostname`, as deep as the deepest labelled node.
//!
//! KAI's levels are immutable (a validation rule refuses any change). When the fleet gets deeper
//! (a 4-layer type joins a 3-layer fleet) the controller does not try an update: it creates a
//! new Topology, `<name>-<depth>-layer`, and says so (log and Event); the old one stays, valid
//! for the nodes it named, and workloads move to the new one by their `kai.scheduler/topology`
//! annotation. A node lacking a level's label is only left out of placements required at that
//! level (KAI's documented behaviour), so one Topology as deep as the deepest node serves all.
//!
//! Owns: the KAI Topologies we create. Never changes or deletes any Topology.

use std::sync::Arc;

use futures::future::BoxFuture;
use kube::{
    Client, Resource,
    api::{ApiResource, DynamicObject},
};
use tracing::{error, info, warn};

use super::{
    PublishArgs, Publisher,
    kueue::{Outcome, ensure_in, levels, report_mismatch, served_resource},
};
use crate::{
    labels::{LabelScheme, MAX_LAYERS},
    metrics::Metrics,
    tree::NodeView,
};

pub const GROUP: &str = "kai.scheduler";

/// The depth the Topology's levels go to before any node is labelled: EC2's usual 3 layers, or
/// the uniform depth every node is given.
pub fn base_depth(scheme: &LabelScheme) -> usize {
    scheme.uniform_depth.unwrap_or(3)
}

/// Layer labels a node carries, counted from layer 1 without a gap.
fn label_depth(scheme: &LabelScheme, node: &NodeView) -> usize {
    (1..=MAX_LAYERS)
        .take_while(|n| node.labels.contains_key(&scheme.layer_key(*n)))
        .count()
}

/// How deep the Topology must go for these nodes: the deepest node's layers, at least the base.
pub fn depth_for(scheme: &LabelScheme, nodes: &[NodeView]) -> usize {
    nodes
        .iter()
        .map(|n| label_depth(scheme, n))
        .max()
        .unwrap_or(0)
        .max(base_depth(scheme))
}

/// The Topology's name for `depth` levels: `name` at the base depth, `<name>-<depth>-layer`
/// otherwise (a new object, since levels never change).
pub fn name_for(scheme: &LabelScheme, name: &str, depth: usize) -> String {
    if depth == base_depth(scheme) {
        name.to_string()
    } else {
        format!("{name}-{depth}-layer")
    }
}

/// An existing Topology is checked again every this many publish intervals (and whenever the
/// depth it must have changes).
const RECHECK_INTERVALS: u32 = 12;

/// Keeps the KAI Topology for the deepest labelled node.
pub struct KaiPublisher {
    client: Client,
    scheme: LabelScheme,
    name: String,
    recheck: std::time::Duration,
    /// The (name, levels) last found in place, and when.
    checked: Option<(String, Vec<String>, std::time::Instant)>,
    /// The depth published before a change of depth (to say which Topology it replaces).
    previous: Option<String>,
    /// A mismatch or a missing API reported for this name (each reported once).
    reported: Option<String>,
    metrics: Arc<Metrics>,
    events: crate::events::Events,
}

impl KaiPublisher {
    pub fn new(
        client: Client,
        args: &PublishArgs,
        scheme: &LabelScheme,
        metrics: Arc<Metrics>,
        events: crate::events::Events,
    ) -> Self {
        Self {
            client,
            scheme: scheme.clone(),
            name: args.kai_topology_name.clone(),
            recheck: args.publish_interval.0.saturating_mul(RECHECK_INTERVALS),
            checked: None,
            previous: None,
            reported: None,
            metrics,
            events,
        }
    }

    async fn ensure(
        &self,
        name: &str,
        want: &[String],
    ) -> Result<(Outcome, Option<(DynamicObject, ApiResource)>), kube::Error> {
        let Some(ar) = served_resource(&self.client, GROUP, &["v1alpha1"], "Topology").await?
        else {
            return Ok((Outcome::NotServed, None));
        };
        let (outcome, obj) = ensure_in(&self.client, &ar, name, want).await?;
        Ok((outcome, obj.map(|o| (o, ar))))
    }

    async fn check(&mut self, name: String, want: Vec<String>) {
        match self.ensure(&name, &want).await {
            Ok((Outcome::Created, obj)) => {
                self.metrics.kai_topology_mismatch(&name, false);
                match self.previous.as_deref().filter(|p| *p != name) {
                    Some(before) => {
                        let message = format!(
                            "the labelled nodes now go {} layers deep: created KAI Topology {name} with levels {want:?} (levels are immutable, so {before} is kept as it was); point workloads' kai.scheduler/topology at {name} to use the new level",
                            want.len().saturating_sub(1)
                        );
                        warn!(topology = %name, replaces = %before, ?want, "{message}");
                        if let Some((obj, ar)) = obj {
                            self.events.publish(
                                crate::events::Reason::TopologyLevelsChanged,
                                "PublishTopology",
                                &message,
                                obj.object_ref(&ar),
                            );
                        }
                    }
                    None => info!(topology = %name, levels = ?want, "created KAI Topology"),
                }
                self.checked = Some((name.clone(), want, std::time::Instant::now()));
                self.previous = Some(name);
            }
            Ok((Outcome::UpToDate, _)) => {
                self.metrics.kai_topology_mismatch(&name, false);
                self.checked = Some((name.clone(), want, std::time::Instant::now()));
                self.previous = Some(name);
            }
            Ok((Outcome::Mismatch { have }, obj)) => {
                self.metrics.kai_topology_mismatch(&name, true);
                if self.reported.as_deref() != Some(name.as_str()) {
                    warn!(topology = %name, ?have, ?want, "KAI Topology exists with other levels; levels are immutable, so it is left alone: delete it to let us recreate it, or set --kai-topology-name");
                    if let Some((obj, ar)) = obj {
                        report_mismatch(&self.events, &obj, &ar, &have, &want);
                    }
                    self.reported = Some(name.clone());
                }
                self.checked = Some((name, want, std::time::Instant::now()));
            }
            Ok((Outcome::NotServed, _)) => {
                if self.reported.as_deref() != Some("") {
                    error!(
                        "--kai-topology is on but the cluster serves no kai.scheduler/v1alpha1 Topology API (is the KAI Scheduler installed?)"
                    );
                    self.reported = Some(String::new());
                }
                self.metrics.publish_failed("kai");
                self.checked = Some((name, want, std::time::Instant::now()));
            }
            Err(e) => {
                warn!(topology = %name, error = %e, "cannot check the KAI Topology; trying again later");
                self.metrics.publish_failed("kai");
            }
        }
    }
}

impl Publisher for KaiPublisher {
    fn name(&self) -> &'static str {
        "kai"
    }

    fn needs_nodes(&self) -> bool {
        true
    }

    fn publish<'a>(&'a mut self, nodes: &'a [NodeView]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let depth = depth_for(&self.scheme, nodes);
            let name = name_for(&self.scheme, &self.name, depth);
            let want = levels(&self.scheme, depth, true);
            let due = self
                .checked
                .as_ref()
                .is_none_or(|(n, l, at)| *n != name || *l != want || at.elapsed() >= self.recheck);
            if due {
                self.check(name, want).await;
            }
        })
    }

    fn reset(&mut self) {
        self.checked = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::LabelScheme;

    fn view(depth: usize) -> NodeView {
        let path: Vec<String> = (0..depth).map(|i| format!("nn-{i}")).collect();
        let path: Vec<&str> = path.iter().map(String::as_str).collect();
        NodeView::labelled("n", &LabelScheme::default(), &path)
    }

    #[test]
    fn the_topology_goes_as_deep_as_the_deepest_node_and_is_renamed_when_deeper() {
        let s = LabelScheme::default();
        assert_eq!(
            depth_for(&s, &[]),
            3,
            "3 levels before any node is labelled"
        );
        assert_eq!(depth_for(&s, &[view(3), view(3)]), 3);
        assert_eq!(
            depth_for(&s, &[view(3), view(4)]),
            4,
            "a 4-layer type joined"
        );
        assert_eq!(name_for(&s, "aws-network", 3), "aws-network");
        assert_eq!(name_for(&s, "aws-network", 4), "aws-network-4-layer");
        let want = levels(&s, depth_for(&s, &[view(4)]), true);
        assert_eq!(want.len(), 5);
        assert_eq!(want[3], "topology.k8s.aws/network-node-layer-4");
        assert_eq!(
            want[4], "kubernetes.io/hostname",
            "hostname last, as KAI requires"
        );
    }

    #[test]
    fn with_uniform_depth_the_one_topology_keeps_the_base_name() {
        let s = LabelScheme {
            uniform_depth: Some(4),
            ..LabelScheme::default()
        };
        assert_eq!(depth_for(&s, &[view(4)]), 4);
        assert_eq!(name_for(&s, "aws-network", 4), "aws-network");
        assert_eq!(name_for(&s, "aws-network", 5), "aws-network-5-layer");
    }
}

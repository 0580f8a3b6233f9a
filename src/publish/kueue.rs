//! A Kueue `Topology` whose levels are our labels, created and owned by us.
//!
//! Kueue's levels are immutable: an existing Topology with other levels is never changed, only
//! reported (log, Event, metric). `kueue.x-k8s.io/v1beta2` is used where served, else `v1beta1`.
//!
//! Owns: the Kueue Topologies we create. Never changes or deletes one we did not create.

use std::sync::Arc;

use futures::future::BoxFuture;
use kube::{
    Client,
    api::{ApiResource, DynamicObject},
};
use tracing::{error, info, warn};

use super::{PublishArgs, Publisher};
use crate::{labels::LabelScheme, leader::Leadership, metrics::Metrics, tree::NodeView};

pub const GROUP: &str = "kueue.x-k8s.io";

use super::topology::served_resource;
pub use super::topology::{Outcome, levels};
use super::topology::{ensure_in, report_mismatch};

/// The Topology API the cluster serves, preferring v1beta2.
pub async fn topology_resource(client: &Client) -> Result<Option<ApiResource>, kube::Error> {
    served_resource(client, GROUP, &["v1beta2", "v1beta1"], "Topology").await
}

/// Create the Topology if it is missing; never change an existing one's levels. Returns the
/// object with the API it is served by (for Events about it).
pub async fn ensure(
    client: &Client,
    name: &str,
    levels: &[String],
    owner: &str,
    leader: &Leadership,
) -> Result<(Outcome, Option<(DynamicObject, ApiResource)>), kube::Error> {
    let Some(ar) = topology_resource(client).await? else {
        return Ok((Outcome::NotServed, None));
    };
    let (outcome, obj) = ensure_in(client, &ar, name, levels, owner, leader).await?;
    Ok((outcome, obj.map(|o| (o, ar))))
}

/// An existing Kueue Topology is checked again every this many publish intervals.
const RECHECK_INTERVALS: u32 = 12;

/// Keeps the Kueue Topologies of our layer labels: created when missing, checked every
/// `RECHECK_INTERVALS` intervals, a level mismatch reported once (log, Event, metric).
pub struct KueuePublisher {
    client: Client,
    /// Name and levels of each Topology.
    topologies: Vec<(String, Vec<String>)>,
    recheck: std::time::Duration,
    checked: Option<std::time::Instant>,
    /// The Topologies found mismatched at the last check (each reported once).
    reported: Option<Vec<String>>,
    /// This installation (its Lease), marked on the Topologies it creates.
    owner: String,
    metrics: Arc<Metrics>,
    events: crate::events::Events,
    leader: Leadership,
}

impl KueuePublisher {
    pub fn new(
        client: Client,
        args: &PublishArgs,
        scheme: &LabelScheme,
        owner: &str,
        metrics: Arc<Metrics>,
        events: crate::events::Events,
        leader: Leadership,
    ) -> Self {
        let hostname = args.kueue_topology_hostname_level;
        // With uniform depth every node carries that many layers: one Topology covers them all.
        let depth = scheme.uniform_depth.unwrap_or(3);
        let mut topologies = vec![(
            args.kueue_topology_name.clone(),
            levels(scheme, depth, hostname),
        )];
        if args.kueue_topology_four_layer && scheme.uniform_depth.is_some() {
            warn!(
                topology = %args.kueue_topology_four_layer_name,
                "--kueue-topology-four-layer is ignored with --uniform-depth: the one Topology covers every node"
            );
        } else if args.kueue_topology_four_layer {
            topologies.push((
                args.kueue_topology_four_layer_name.clone(),
                levels(scheme, 4, hostname),
            ));
        }
        Self {
            client,
            topologies,
            recheck: args.publish_interval.0.saturating_mul(RECHECK_INTERVALS),
            checked: None,
            reported: None,
            owner: owner.to_string(),
            metrics,
            events,
            leader,
        }
    }

    async fn check(&mut self) {
        let mut mismatched = Vec::new();
        for (name, levels) in self.topologies.clone() {
            match ensure(&self.client, &name, &levels, &self.owner, &self.leader).await {
                Ok((Outcome::Created, _)) => {
                    info!(topology = %name, ?levels, "created Kueue Topology");
                    self.metrics.kueue_topology_mismatch(&name, false);
                }
                Ok((Outcome::UpToDate, _)) => self.metrics.kueue_topology_mismatch(&name, false),
                Ok((Outcome::Mismatch { have }, obj)) => {
                    self.metrics.kueue_topology_mismatch(&name, true);
                    mismatched.push(name.clone());
                    if self.reported.as_ref().is_none_or(|r| !r.contains(&name)) {
                        warn!(topology = %name, have = ?have, want = ?levels, "Kueue Topology exists with other levels; levels are immutable, so it is left alone: delete it to let us recreate it, or point ResourceFlavors at another name");
                        if let Some((obj, ar)) = obj {
                            report_mismatch(&self.events, &obj, &ar, &have, &levels);
                        }
                    }
                }
                Ok((Outcome::NotServed, _)) => {
                    if self.reported.is_none() {
                        error!(
                            "--kueue-topology is on but the cluster serves no kueue.x-k8s.io Topology API (is Kueue installed?)"
                        );
                    }
                    self.metrics.publish_failed("kueue");
                }
                Ok((Outcome::NotLeading, _)) => {
                    // Checked afresh when this replica leads again (see `reset`).
                    self.checked = None;
                    return;
                }
                Err(e) => {
                    warn!(topology = %name, error = %e, "cannot check the Kueue Topology; trying again later");
                    self.metrics.publish_failed("kueue");
                }
            }
        }
        self.reported = Some(mismatched);
    }
}

impl Publisher for KueuePublisher {
    fn name(&self) -> &'static str {
        "kueue"
    }

    fn needs_nodes(&self) -> bool {
        false
    }

    fn publish<'a>(&'a mut self, _nodes: &'a [NodeView]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if self.checked.is_none_or(|t| t.elapsed() >= self.recheck) {
                self.checked = Some(std::time::Instant::now());
                self.check().await;
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
    use crate::{
        labels::LayerNumbering,
        publish::topology::{levels_of, topology_object},
    };

    #[test]
    fn levels_are_coarsest_first_and_end_with_the_hostname() {
        let s = LabelScheme::default();
        assert_eq!(
            levels(&s, 3, true),
            vec![
                "topology.k8s.aws/network-node-layer-1",
                "topology.k8s.aws/network-node-layer-2",
                "topology.k8s.aws/network-node-layer-3",
                "kubernetes.io/hostname"
            ]
        );
        assert_eq!(levels(&s, 4, false).len(), 4);
        let leaf_first = LabelScheme {
            numbering: LayerNumbering::LeafFirst,
            layer_prefix: "example.com/tier-".into(),
            ..LabelScheme::default()
        };
        assert_eq!(
            levels(&leaf_first, 3, false),
            vec![
                "example.com/tier-3",
                "example.com/tier-2",
                "example.com/tier-1"
            ]
        );
    }

    #[test]
    fn the_object_names_its_levels_in_order() {
        let obj = topology_object(
            "kueue.x-k8s.io/v1beta2",
            "aws-network",
            &levels(&LabelScheme::default(), 3, true),
            "ec2-topology-labeler/ec2-topology-labeler",
        );
        assert_eq!(
            obj["metadata"]["annotations"][super::super::owner::OWNER],
            "ec2-topology-labeler/ec2-topology-labeler",
            "marked as this installation's (the admission policy's condition)"
        );
        assert_eq!(
            obj["spec"]["levels"][3]["nodeLabel"],
            "kubernetes.io/hostname"
        );
        assert_eq!(obj["kind"], "Topology");
        let dynamic: DynamicObject = serde_json::from_value(obj).unwrap();
        assert_eq!(levels_of(&dynamic).len(), 4);
    }
}

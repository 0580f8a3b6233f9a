//! A Kueue `Topology` whose levels are our labels, created and owned by us.
//!
//! Kueue's levels are immutable: an existing Topology with other levels is never changed, only
//! reported (log, Event, metric). `kueue.x-k8s.io/v1beta2` is used where served, else `v1beta1`.
//!
//! Owns: the Kueue Topologies we create. Never changes or deletes one we did not create.

use std::{collections::BTreeSet, sync::Arc};

use futures::future::BoxFuture;
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, ListParams},
};
use tracing::{error, info, warn};

use super::{
    Publisher,
    plugin::{Item, Purpose, Scope, Setup, delete, labelled},
};
use crate::{leader::Leadership, metrics::Metrics, tree::NodeView};

pub const GROUP: &str = "kueue.x-k8s.io";

pub(crate) use super::topology::Outcome;
pub use super::topology::levels;
use super::topology::served_resource;
use super::topology::{UltraServerLevel, in_ultraserver, ultraserver_levels};
use super::topology::{ensure_in, report_mismatch};

/// The Topology API the cluster serves, preferring v1beta2.
pub(crate) async fn topology_resource(client: &Client) -> Result<Option<ApiResource>, kube::Error> {
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
pub(crate) struct KueuePublisher {
    client: Client,
    /// Name and levels of each Topology.
    topologies: Vec<(String, Vec<String>)>,
    /// The UltraServer members' Topology, until it joins `topologies` (with
    /// `--ultraserver-level=auto`: once a published node carries a capacity block).
    ultraserver: Option<(String, Vec<String>)>,
    /// This is that publisher (see [`KueuePublisher::ultraserver_when_seen`]): it reads the
    /// published nodes, from the first interval on (`unpublished_nodes` stays current).
    watches: bool,
    /// How the labels say a node is in an UltraServer.
    scheme: crate::labels::LabelScheme,
    recheck: std::time::Duration,
    checked: Option<std::time::Instant>,
    /// The Topologies found mismatched at the last check (each reported once).
    reported: Option<Vec<String>>,
    /// This installation (its Lease), marked on the Topologies it creates.
    owner: String,
    metrics: Arc<Metrics>,
    events: crate::admin::events::Events,
    leader: Leadership,
}

impl KueuePublisher {
    pub(crate) fn new(s: &Setup<'_>) -> Self {
        let (args, scheme) = (s.args, s.scheme);
        let hostname = args.kueue.kueue_topology_hostname_level;
        // With uniform depth every node carries that many layers: one Topology covers them all.
        let depth = scheme.uniform_depth.unwrap_or(3);
        let mut topologies = vec![(
            args.kueue.kueue_topology_name.clone(),
            levels(scheme, depth, hostname),
        )];
        if args.kueue.kueue_topology_four_layer && scheme.uniform_depth.is_some() {
            warn!(
                topology = %args.kueue.kueue_topology_four_layer_name,
                "--kueue-topology-four-layer is ignored with --uniform-depth: the one Topology covers every node"
            );
        } else if args.kueue.kueue_topology_four_layer {
            topologies.push((
                args.kueue.kueue_topology_four_layer_name.clone(),
                levels(scheme, 4, hostname),
            ));
        }
        if args.ultraserver_level == UltraServerLevel::Always {
            topologies.extend(ultraserver_topology(s));
        }
        Self::with(s, topologies, None)
    }

    /// With `--ultraserver-level=auto`: the publisher of the UltraServer members' Topology
    /// alone, created once a published node (one an EC2 answer vouches for) carries a capacity
    /// block. A publisher of its own, the only Kueue one that reads the nodes, so that the
    /// Topologies every node fits are kept as before: never held while nodes wait for
    /// verification.
    pub(crate) fn ultraserver_when_seen(s: &Setup<'_>) -> Option<Self> {
        if s.args.ultraserver_level != UltraServerLevel::Auto {
            return None;
        }
        let wanted = ultraserver_topology(s)?;
        Some(Self::with(s, Vec::new(), Some(wanted)))
    }

    fn with(
        s: &Setup<'_>,
        topologies: Vec<(String, Vec<String>)>,
        ultraserver: Option<(String, Vec<String>)>,
    ) -> Self {
        let args = s.args;
        Self {
            client: s.client.clone(),
            watches: ultraserver.is_some(),
            topologies,
            ultraserver,
            scheme: s.scheme.clone(),
            recheck: args.publish_interval.0.saturating_mul(RECHECK_INTERVALS),
            checked: None,
            reported: None,
            owner: s.owner.to_string(),
            metrics: s.metrics.clone(),
            events: s.events.clone(),
            leader: s.leader.clone(),
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
        self.watches
    }

    fn publish<'a>(&'a mut self, nodes: &'a [NodeView]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if self.ultraserver.is_some() && nodes.iter().any(|n| in_ultraserver(&self.scheme, n)) {
                if let Some((name, levels)) = self.ultraserver.take() {
                    info!(topology = %name, ?levels, "a published node is in an UltraServer: adding the UltraServer members' Kueue Topology");
                    self.topologies.push((name, levels));
                }
                self.checked = None;
            }
            if self.checked.is_none_or(|t| t.elapsed() >= self.recheck) {
                self.checked = Some(std::time::Instant::now());
                self.check().await;
            }
        })
    }

    /// Checked within the recheck interval: nothing to do until a node's labels change (a
    /// first UltraServer member) or the recheck is due.
    fn fresh(&self) -> bool {
        self.checked.is_some_and(|t| t.elapsed() < self.recheck)
    }

    fn reset(&mut self) {
        self.checked = None;
    }
}

/// The UltraServer members' Topology: the layers of the Topology every node fits (three, or
/// `--uniform-depth`), the capacity block, the hostname; `None` without a capacity block label.
fn ultraserver_topology(s: &Setup<'_>) -> Option<(String, Vec<String>)> {
    let depth = s.scheme.uniform_depth.unwrap_or(3);
    ultraserver_levels(
        s.scheme,
        depth,
        s.args.kueue.kueue_topology_hostname_level,
        s.args.nvlink_clique_level,
    )
    .map(|l| (s.args.kueue.kueue_topology_ultraserver_name.clone(), l))
}

/// Kueue's Topology as a plug-in.
pub(crate) struct Plugin;

impl super::plugin::Plugin for Plugin {
    fn kind(&self) -> &'static str {
        "kueue-topology"
    }

    fn build(&self, s: &Setup<'_>) -> Result<Vec<Box<dyn Publisher>>, String> {
        if !s.args.kueue.kueue_topology {
            return Ok(Vec::new());
        }
        let mut out: Vec<Box<dyn Publisher>> = vec![Box::new(KueuePublisher::new(s))];
        out.extend(
            KueuePublisher::ultraserver_when_seen(s).map(|p| Box::new(p) as Box<dyn Publisher>),
        );
        Ok(out)
    }

    /// Turned off, the Topologies of the names configured are listed (a ResourceFlavor may
    /// name one: removed only by `uninstall`, and then only when none does or `--force`).
    fn leftovers<'a>(
        &'a self,
        client: &'a Client,
        scope: Scope<'a>,
        purpose: Purpose<'a>,
    ) -> BoxFuture<'a, Result<Vec<Item>, kube::Error>> {
        Box::pin(async move {
            match purpose {
                Purpose::TurnedOff(args) if args.kueue.kueue_topology => Ok(Vec::new()),
                Purpose::TurnedOff(args) => {
                    let names = [
                        &args.kueue.kueue_topology_name,
                        &args.kueue.kueue_topology_four_layer_name,
                        &args.kueue.kueue_topology_ultraserver_name,
                    ];
                    Ok(topologies(client, false, scope)
                        .await?
                        .into_iter()
                        .filter(|i| names.contains(&&i.name))
                        .collect())
                }
                Purpose::Uninstall(u) => topologies(client, u.force, scope).await,
            }
        })
    }

    fn remove<'a>(
        &'a self,
        client: &'a Client,
        name: &'a str,
    ) -> BoxFuture<'a, Result<super::plugin::Removed, kube::Error>> {
        Box::pin(async move { delete(client, topology_resource(client).await?, name).await })
    }
}

/// Our Kueue Topologies (by the owner annotation, as `scope` says): removed unless a
/// ResourceFlavor names one (then kept, with the flavors), or `force`.
async fn topologies(
    client: &Client,
    force: bool,
    scope: Scope<'_>,
) -> Result<Vec<Item>, kube::Error> {
    let Some(ar) = topology_resource(client).await? else {
        return Ok(Vec::new());
    };
    // Each with its verdict (ours, or kept and why), those not ours to list left out.
    let topologies: Vec<(DynamicObject, Option<String>)> = labelled(client, &ar)
        .await?
        .into_iter()
        .filter_map(|t| match scope.ours(&t) {
            Ok(()) => Some((t, None)),
            Err(Some(why)) => Some((t, Some(why))),
            Err(None) => None,
        })
        .collect();
    if topologies.is_empty() {
        return Ok(Vec::new());
    }
    let flavors =
        match served_resource(client, GROUP, &["v1beta2", "v1beta1"], "ResourceFlavor").await? {
            Some(far) => {
                Api::<DynamicObject>::all_with(client.clone(), &far)
                    .list(&ListParams::default())
                    .await?
                    .items
            }
            None => Vec::new(),
        };
    Ok(topologies
        .into_iter()
        .map(|(t, kept)| {
            let name = t.name_any();
            if let Some(why) = kept {
                return Item::keep("kueue-topology", name, why);
            }
            let users: BTreeSet<String> = flavors
                .iter()
                .filter(|f| f.data.pointer("/spec/topologyName").and_then(|v| v.as_str()) == Some(name.as_str()))
                .map(|f| f.name_any())
                .collect();
            if users.is_empty() || force {
                Item::remove("kueue-topology", name)
            } else {
                Item::keep(
                    "kueue-topology",
                    name,
                    format!(
                        "ResourceFlavor(s) {} name it: deleting it would stop topology-aware admission; move them to another Topology first",
                        users.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                )
            }
        })
        .collect())
}

/// Kueue's flags: its Topology objects.
#[derive(
    Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct KueueArgs {
    /// Create a Kueue Topology whose levels are our layer labels (never changes an existing
    /// one: Kueue's levels are immutable; a mismatch is reported).
    #[arg(long, env = "LABELER_KUEUE_TOPOLOGY", default_value_t = false, action = clap::ArgAction::Set)]
    pub kueue_topology: bool,
    /// Name of that Topology (ResourceFlavors refer to it by `topologyName`).
    #[arg(
        long,
        env = "LABELER_KUEUE_TOPOLOGY_NAME",
        default_value = "aws-network"
    )]
    pub(crate) kueue_topology_name: String,
    /// Also create a Topology with four layers, for 4-layer instance types (p6-b200, p6-b300).
    #[arg(long, env = "LABELER_KUEUE_TOPOLOGY_FOUR_LAYER", default_value_t = false, action = clap::ArgAction::Set)]
    pub(crate) kueue_topology_four_layer: bool,
    /// Name of the 4-layer Topology.
    #[arg(
        long,
        env = "LABELER_KUEUE_TOPOLOGY_FOUR_LAYER_NAME",
        default_value = "aws-network-4-layer"
    )]
    pub(crate) kueue_topology_four_layer_name: String,
    /// Name of the Topology for UltraServer members: the layers, then the capacity block (one
    /// NVLink domain), then the hostname (see `--ultraserver-level`).
    #[arg(
        long,
        env = "LABELER_KUEUE_TOPOLOGY_ULTRASERVER_NAME",
        default_value = "aws-network-ultraserver"
    )]
    pub(crate) kueue_topology_ultraserver_name: String,
    /// End the Topology's levels with kubernetes.io/hostname (as Kueue advises).
    #[arg(long, env = "LABELER_KUEUE_TOPOLOGY_HOSTNAME_LEVEL", default_value_t = true, action = clap::ArgAction::Set)]
    pub(crate) kueue_topology_hostname_level: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        labels::{LabelScheme, LayerNumbering},
        leader::Leadership,
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

    /// The Topologies (names and levels) the Kueue publishers of these flags keep after they
    /// published each of `rounds` in turn, and which of them read the nodes (the publisher of
    /// the Topologies every node fits never does: it is never held for them).
    async fn kept(
        flags: &[&str],
        rounds: &[&[NodeView]],
    ) -> (Vec<(String, Vec<String>)>, Vec<bool>) {
        use crate::publish::plugin::tests::{flags as parse, unreachable};
        let args = parse(flags);
        let (client, metrics) = (unreachable(), Arc::new(Metrics::new()));
        let setup = Setup {
            client: &client,
            args: &args,
            owner: "ns/lease",
            scheme: &LabelScheme::default(),
            slurm_files: &crate::slurm::Files {
                tree_topology: "default".into(),
                switches_only: false,
            },
            metrics: &metrics,
            events: &crate::admin::events::Events::default(),
            leader: &Leadership::always(),
        };
        let mut publishers: Vec<KueuePublisher> = std::iter::once(KueuePublisher::new(&setup))
            .chain(KueuePublisher::ultraserver_when_seen(&setup))
            .collect();
        assert_eq!(
            super::super::plugin::Plugin::build(&Plugin, &setup)
                .unwrap()
                .len(),
            publishers.len(),
            "the plug-in builds these"
        );
        for nodes in rounds {
            for p in &mut publishers {
                // The API server answers nothing: each check fails, what is kept is the point.
                p.publish(nodes).await;
            }
        }
        (
            publishers
                .iter()
                .flat_map(|p| p.topologies.clone())
                .collect(),
            publishers.iter().map(|p| p.needs_nodes()).collect(),
        )
    }

    #[tokio::test]
    async fn the_ultraserver_topology_joins_once_a_published_node_is_in_an_ultraserver() {
        let s = LabelScheme::default();
        let plain = NodeView::labelled("a", &s, &["nn-1", "nn-2", "nn-3"]);
        let mut member = NodeView::labelled("b", &s, &["nn-1", "nn-2", "nn-4"]);
        member
            .labels
            .insert(crate::labels::CAPACITY_BLOCK_KEY.into(), "cr-1".into());
        let names =
            |t: &[(String, Vec<String>)]| t.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();

        let (t, needs) = kept(
            &["--kueue-topology", "true"],
            &[std::slice::from_ref(&plain)],
        )
        .await;
        assert_eq!(
            names(&t),
            ["aws-network"],
            "auto: no UltraServer member yet"
        );
        assert_eq!(
            needs,
            [false, true],
            "auto: a second publisher watches the nodes for the first member; the first never waits for them"
        );

        let (t, needs) = kept(
            &["--kueue-topology", "true"],
            &[
                std::slice::from_ref(&plain),
                &[plain.clone(), member.clone()],
                std::slice::from_ref(&plain),
            ],
        )
        .await;
        assert_eq!(
            names(&t),
            ["aws-network", "aws-network-ultraserver"],
            "auto: added with the first member and kept (a ResourceFlavor may name it)"
        );
        assert_eq!(
            t[1].1,
            [
                "topology.k8s.aws/network-node-layer-1",
                "topology.k8s.aws/network-node-layer-2",
                "topology.k8s.aws/network-node-layer-3",
                crate::labels::CAPACITY_BLOCK_KEY,
                "kubernetes.io/hostname",
            ],
            "the capacity block after the layers, before the hostname"
        );
        assert_eq!(t[0].1.len(), 4, "the Topology every node fits is unchanged");
        assert_eq!(needs, [false, true]);

        let (t, needs) = kept(
            &[
                "--kueue-topology",
                "true",
                "--ultraserver-level",
                "always",
                "--kueue-topology-ultraserver-name",
                "gb200",
            ],
            &[],
        )
        .await;
        assert_eq!(
            names(&t),
            ["aws-network", "gb200"],
            "always: from the start"
        );
        assert_eq!(
            needs,
            [false],
            "always: one publisher, not reading the nodes"
        );

        let (t, needs) = kept(
            &["--kueue-topology", "true", "--ultraserver-level", "never"],
            &[&[member.clone()]],
        )
        .await;
        assert_eq!(names(&t), ["aws-network"], "never");
        assert_eq!(needs, [false]);
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

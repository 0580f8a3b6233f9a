//! KAI Scheduler `Topology`s (`kai.scheduler/v1alpha1`) whose levels are our layer labels, then
//! `kubernetes.io/hostname`: one per depth the labelled nodes have.
//!
//! KAI leaves out of a Topology every node that lacks one of its level labels (its topology
//! plugin adds a node to the tree only if it carries them all): a 4-level Topology has no place
//! for a 3-layer node, even for a placement required at layer 1. So the 3-level Topology
//! (`<name>`) is always kept, and when nodes with more layers are labelled (p6-b200: 4) a
//! Topology of their depth is created beside it, `<name>-<depth>-layer` (said in a log line and
//! an Event); workloads for those nodes name it in `kai.scheduler/topology`. Likewise, UltraServer
//! members (nodes carrying the capacity block label) get `<name>-ultraserver` (or
//! `<name>-<depth>-layer-ultraserver`), whose levels hold the capacity block between the deepest
//! layer and the hostname (`--ultraserver-level`). KAI's levels are
//! immutable (a validation rule refuses any change), so nothing is ever updated in place.
//!
//! Owns: the KAI Topologies we create. Never changes a Topology; deletes ours only for
//! `uninstall` (and `retire`'s turned-off check lists them as kept).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use futures::future::BoxFuture;
use kube::{
    Client, Resource,
    api::{ApiResource, DynamicObject},
};
use tracing::{error, info, warn};

use super::{
    Publisher,
    plugin::{Item, Purpose, Scope, Setup, delete, labelled},
    topology::{
        Outcome, UltraServerLevel, ensure_in, in_ultraserver, levels, report_mismatch,
        served_resource, ultraserver_levels,
    },
};
use crate::{
    labels::{LabelScheme, MAX_LAYERS},
    metrics::Metrics,
    tree::NodeView,
};

pub(crate) const GROUP: &str = "kai.scheduler";

/// The depth of the Topology kept in any case: EC2's usual 3 layers, or the uniform depth every
/// node is given.
pub(crate) fn base_depth(scheme: &LabelScheme) -> usize {
    scheme.uniform_depth.unwrap_or(3)
}

/// Layer labels a node carries, counted from layer 1 without a gap.
fn label_depth(scheme: &LabelScheme, node: &NodeView) -> usize {
    (1..=MAX_LAYERS)
        .take_while(|n| node.labels.contains_key(&scheme.layer_key(*n)))
        .count()
}

/// What a Topology is for: nodes this many layers deep, in an UltraServer or any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Shape {
    pub depth: usize,
    /// The capacity block (the UltraServer) is a level between the deepest layer and the
    /// hostname: only UltraServer members fit it.
    pub ultraserver: bool,
}

/// The Topologies these nodes need: the base depth's, one for every deeper depth a node has,
/// and (as `--ultraserver-level` says) one with the UltraServer level for each depth an
/// UltraServer member has. (A node with fewer layers than the base fits none; EC2 describes 3
/// or 4.)
pub(crate) fn shapes_for(
    scheme: &LabelScheme,
    nodes: &[NodeView],
    level: UltraServerLevel,
) -> BTreeSet<Shape> {
    let base = base_depth(scheme);
    let ultraservers = level != UltraServerLevel::Never && scheme.capacity_block_key.is_some();
    let mut out = BTreeSet::from([Shape {
        depth: base,
        ultraserver: false,
    }]);
    if ultraservers && level == UltraServerLevel::Always {
        out.insert(Shape {
            depth: base,
            ultraserver: true,
        });
    }
    for n in nodes {
        let depth = label_depth(scheme, n);
        if depth < base {
            continue;
        }
        out.insert(Shape {
            depth,
            ultraserver: false,
        });
        if ultraservers && in_ultraserver(scheme, n) {
            out.insert(Shape {
                depth,
                ultraserver: true,
            });
        }
    }
    out
}

/// The Topology's name for a shape: `name` at the base depth, `<name>-<depth>-layer` deeper,
/// and `-ultraserver` after either for UltraServer members.
pub(crate) fn name_for(scheme: &LabelScheme, name: &str, shape: Shape) -> String {
    let mut out = if shape.depth == base_depth(scheme) {
        name.to_string()
    } else {
        format!("{name}-{}-layer", shape.depth)
    };
    if shape.ultraserver {
        out.push_str(ULTRASERVER_SUFFIX);
    }
    out
}

/// The levels of a shape's Topology (`None`: an UltraServer shape with no capacity block label);
/// `clique`: the NVLink clique under the capacity block (`--nvlink-clique-level`).
pub(crate) fn levels_for(scheme: &LabelScheme, shape: Shape, clique: bool) -> Option<Vec<String>> {
    if shape.ultraserver {
        ultraserver_levels(scheme, shape.depth, true, clique)
    } else {
        Some(levels(scheme, shape.depth, true))
    }
}

const ULTRASERVER_SUFFIX: &str = "-ultraserver";

/// An existing Topology is checked again every this many publish intervals.
const RECHECK_INTERVALS: u32 = 12;

/// Keeps a KAI Topology for each depth of the labelled nodes.
pub(crate) struct KaiPublisher {
    client: Client,
    scheme: LabelScheme,
    name: String,
    ultraserver_level: UltraServerLevel,
    /// `--nvlink-clique-level`.
    clique: bool,
    recheck: std::time::Duration,
    /// Name → the levels last found in place, and when.
    checked: BTreeMap<String, (Vec<String>, std::time::Instant)>,
    /// Names whose mismatch was reported ("" for a missing API; each reported once).
    reported: BTreeSet<String>,
    /// This installation (its Lease), marked on the Topologies it creates.
    owner: String,
    metrics: Arc<Metrics>,
    events: crate::admin::events::Events,
    leader: crate::leader::Leadership,
}

impl KaiPublisher {
    pub(crate) fn new(s: &Setup<'_>) -> Self {
        Self {
            client: s.client.clone(),
            scheme: s.scheme.clone(),
            name: s.args.kai.kai_topology_name.clone(),
            ultraserver_level: s.args.ultraserver_level,
            clique: s.args.nvlink_clique_level,
            recheck: s.args.publish_interval.0.saturating_mul(RECHECK_INTERVALS),
            checked: BTreeMap::new(),
            reported: BTreeSet::new(),
            owner: s.owner.to_string(),
            metrics: s.metrics.clone(),
            events: s.events.clone(),
            leader: s.leader.clone(),
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
        let (outcome, obj) =
            ensure_in(&self.client, &ar, name, want, &self.owner, &self.leader).await?;
        Ok((outcome, obj.map(|o| (o, ar))))
    }

    async fn check(&mut self, shape: Shape, name: String, want: Vec<String>) {
        match self.ensure(&name, &want).await {
            Ok((Outcome::Created, obj)) => {
                self.metrics.kai_topology_mismatch(&name, false);
                let depth = shape.depth;
                if shape
                    == (Shape {
                        depth: base_depth(&self.scheme),
                        ultraserver: false,
                    })
                {
                    info!(topology = %name, levels = ?want, "created KAI Topology");
                } else {
                    let whose = if shape.ultraserver {
                        format!("nodes in UltraServers ({depth} layers deep) are labelled")
                    } else {
                        format!("nodes {depth} layers deep are labelled")
                    };
                    let message = format!(
                        "{whose}: created KAI Topology {name} with levels {want:?} for them ({} stays for the others: KAI leaves out of a Topology every node lacking one of its levels); point their workloads' kai.scheduler/topology at {name}",
                        self.name
                    );
                    warn!(topology = %name, ?want, "{message}");
                    if let Some((obj, ar)) = obj {
                        self.events.publish(
                            crate::admin::events::Reason::TopologyLevelsChanged,
                            "PublishTopology",
                            &message,
                            obj.object_ref(&ar),
                        );
                    }
                }
                self.checked.insert(name, (want, std::time::Instant::now()));
            }
            Ok((Outcome::UpToDate, _)) => {
                self.metrics.kai_topology_mismatch(&name, false);
                self.checked.insert(name, (want, std::time::Instant::now()));
            }
            Ok((Outcome::Mismatch { have }, obj)) => {
                self.metrics.kai_topology_mismatch(&name, true);
                if self.reported.insert(name.clone()) {
                    warn!(topology = %name, ?have, ?want, "KAI Topology exists with other levels; levels are immutable, so it is left alone: delete it to let us recreate it, or set --kai-topology-name");
                    if let Some((obj, ar)) = obj {
                        report_mismatch(&self.events, &obj, &ar, &have, &want);
                    }
                }
                self.checked.insert(name, (want, std::time::Instant::now()));
            }
            Ok((Outcome::NotServed, _)) => {
                if self.reported.insert(String::new()) {
                    error!(
                        "--kai-topology is on but the cluster serves no kai.scheduler/v1alpha1 Topology API (is the KAI Scheduler installed?)"
                    );
                }
                self.metrics.publish_failed("kai");
                self.checked.insert(name, (want, std::time::Instant::now()));
            }
            // Not recorded as checked: looked at afresh when this replica leads again.
            Ok((Outcome::NotLeading, _)) => {}
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
            let shapes = shapes_for(&self.scheme, nodes, self.ultraserver_level);
            // A shape no node has any more is no longer followed (its Topology stays): left in
            // `checked`, it would age past the recheck and keep `fresh` false for good, so that
            // every interval read the nodes again for nothing.
            let now: BTreeSet<String> = shapes
                .iter()
                .map(|sh| name_for(&self.scheme, &self.name, *sh))
                .collect();
            self.checked.retain(|name, _| now.contains(name));
            for shape in shapes {
                let name = name_for(&self.scheme, &self.name, shape);
                let Some(want) = levels_for(&self.scheme, shape, self.clique) else {
                    continue;
                };
                let due = self
                    .checked
                    .get(&name)
                    .is_none_or(|(l, at)| *l != want || at.elapsed() >= self.recheck);
                if due {
                    self.check(shape, name, want).await;
                }
            }
        })
    }

    fn fresh(&self) -> bool {
        !self.checked.is_empty()
            && self
                .checked
                .values()
                .all(|(_, at)| at.elapsed() < self.recheck)
    }

    fn reset(&mut self) {
        self.checked.clear();
    }
}

/// KAI's Topologies as a plug-in.
pub(crate) struct Plugin;

/// The KAI Topology API the cluster serves.
async fn topology_resource(client: &Client) -> Result<Option<ApiResource>, kube::Error> {
    served_resource(client, GROUP, &["v1alpha1"], "Topology").await
}

impl super::plugin::Plugin for Plugin {
    fn kind(&self) -> &'static str {
        "kai-topology"
    }

    fn build(&self, s: &Setup<'_>) -> Result<Vec<Box<dyn Publisher>>, String> {
        Ok(s.args
            .kai
            .kai_topology
            .then(|| Box::new(KaiPublisher::new(s)) as Box<dyn Publisher>)
            .into_iter()
            .collect())
    }

    /// Turned off, the Topologies of the name configured (and its deeper `-<depth>-layer` and
    /// `-ultraserver`
    /// ones) are listed as kept: workloads name them; `uninstall` removes them.
    fn leftovers<'a>(
        &'a self,
        client: &'a Client,
        scope: Scope<'a>,
        purpose: Purpose<'a>,
    ) -> BoxFuture<'a, Result<Vec<Item>, kube::Error>> {
        Box::pin(async move {
            if matches!(purpose, Purpose::TurnedOff(args) if args.kai.kai_topology) {
                return Ok(Vec::new());
            }
            let Some(ar) = topology_resource(client).await? else {
                return Ok(Vec::new());
            };
            let ours = labelled(client, &ar)
                .await?
                .into_iter()
                .filter_map(|t| scope.item("kai-topology", &t));
            match purpose {
                Purpose::TurnedOff(args) => {
                    let name = args.kai.kai_topology_name.as_str();
                    let of_the_name = |n: &str| {
                        let of = |n: &str| {
                            n == name
                                || n.strip_prefix(name)
                                    .and_then(|rest| rest.strip_prefix('-'))
                                    .and_then(|rest| rest.strip_suffix("-layer"))
                                    .is_some_and(|depth| depth.parse::<u8>().is_ok())
                        };
                        // A name of ours, or one of ours with the UltraServer suffix (the
                        // configured name may end in it too).
                        of(n) || n.strip_suffix(ULTRASERVER_SUFFIX).is_some_and(of)
                    };
                    Ok(ours
                        .filter(|i| of_the_name(&i.name))
                        .map(|i| Item {
                            kept: Some(
                                "workloads may name it (kai.scheduler/topology); `ec2-topology-labeler uninstall` removes it once none does".into(),
                            ),
                            ..i
                        })
                        .collect())
                }
                Purpose::Uninstall(_) => Ok(ours.collect()),
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

/// KAI Scheduler's flags: its Topology objects.
#[derive(
    Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct KaiArgs {
    /// Create KAI Scheduler Topologies whose levels are our layer labels then the hostname: one
    /// of 3 layers, and `<name>-<depth>-layer` for nodes with more (KAI leaves out of a Topology
    /// every node lacking one of its levels).
    #[arg(long, env = "LABELER_KAI_TOPOLOGY", default_value_t = false, action = clap::ArgAction::Set)]
    pub kai_topology: bool,
    /// Name of that Topology (workloads name it in their `kai.scheduler/topology` annotation).
    #[arg(long, env = "LABELER_KAI_TOPOLOGY_NAME", default_value = "aws-network")]
    pub kai_topology_name: String,
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

    fn shape(depth: usize, ultraserver: bool) -> Shape {
        Shape { depth, ultraserver }
    }

    /// Once the deeper nodes are gone, their Topology is no longer followed: the publisher is
    /// fresh again after checking what the remaining nodes need (it was never fresh again).
    #[tokio::test]
    async fn a_shape_whose_nodes_left_no_longer_keeps_the_publisher_busy() {
        use crate::publish::plugin::tests::{flags as parse, unreachable};
        let args = parse(&["--kai-topology=true"]);
        let (client, metrics) = (unreachable(), Arc::new(Metrics::new()));
        let scheme = LabelScheme::default();
        let setup = Setup {
            client: &client,
            args: &args,
            owner: "ns/lease",
            scheme: &scheme,
            slurm_files: &crate::slurm::Files {
                tree_topology: "default".into(),
                switches_only: false,
            },
            metrics: &metrics,
            events: &crate::admin::events::Events::default(),
            leader: &crate::leader::Leadership::always(),
        };
        let mut p = KaiPublisher::new(&setup);
        let three = shape(3, false);
        let four = shape(4, false);
        let level = |sh| levels_for(&scheme, sh, false).unwrap_or_default();
        // Both checked once; the 4-layer one long ago, its nodes gone since.
        let now = std::time::Instant::now();
        let long_ago = now.checked_sub(p.recheck * 2).unwrap_or(now);
        p.checked
            .insert(name_for(&scheme, &p.name, three), (level(three), now));
        p.checked
            .insert(name_for(&scheme, &p.name, four), (level(four), long_ago));
        assert!(!p.fresh());
        // Only 3-layer nodes: nothing is due (no API call: the client answers nothing).
        p.publish(&[view(3)]).await;
        assert!(p.fresh(), "checked: {:?}", p.checked.keys());
        assert_eq!(p.checked.len(), 1);
    }

    /// Network shapes only (the UltraServer ones are tested below).
    fn depths_for(s: &LabelScheme, nodes: &[NodeView]) -> Vec<usize> {
        shapes_for(s, nodes, UltraServerLevel::Auto)
            .into_iter()
            .filter(|sh| !sh.ultraserver)
            .map(|sh| sh.depth)
            .collect()
    }

    fn in_block(mut n: NodeView, block: &str) -> NodeView {
        n.labels
            .insert(crate::labels::CAPACITY_BLOCK_KEY.into(), block.into());
        n
    }

    #[test]
    fn the_base_topology_is_kept_and_each_deeper_depth_gets_its_own() {
        let s = LabelScheme::default();
        let depths = |nodes: &[NodeView]| depths_for(&s, nodes);
        assert_eq!(depths(&[]), [3], "3 levels before any node is labelled");
        assert_eq!(depths(&[view(3), view(3)]), [3]);
        assert_eq!(
            depths(&[view(3), view(4)]),
            [3, 4],
            "a 4-layer type joined: its own Topology beside the 3-level one"
        );
        assert_eq!(
            depths(&[view(4)]),
            [3, 4],
            "the 3-level one exists even before any 3-layer node"
        );
        assert_eq!(
            depths(&[view(2), view(3)]),
            [3],
            "a 2-layer answer fits none"
        );
        assert_eq!(name_for(&s, "aws-network", shape(3, false)), "aws-network");
        assert_eq!(
            name_for(&s, "aws-network", shape(4, false)),
            "aws-network-4-layer"
        );
        let want = levels(&s, 4, true);
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
        assert_eq!(depths_for(&s, &[view(4)]), [4]);
        assert_eq!(name_for(&s, "aws-network", shape(4, false)), "aws-network");
        assert_eq!(
            name_for(&s, "aws-network", shape(5, false)),
            "aws-network-5-layer"
        );
        assert_eq!(
            name_for(&s, "aws-network", shape(4, true)),
            "aws-network-ultraserver"
        );
    }

    #[test]
    fn ultraserver_members_get_a_topology_of_their_own_with_the_block_as_a_level() {
        let s = LabelScheme::default();
        let fleet = [view(3), in_block(view(3), "cr-1")];
        let shapes = |nodes: &[NodeView], level| {
            shapes_for(&s, nodes, level).into_iter().collect::<Vec<_>>()
        };
        assert_eq!(
            shapes(&fleet, UltraServerLevel::Auto),
            [shape(3, false), shape(3, true)],
            "auto: the UltraServer Topology beside the one every node fits"
        );
        assert_eq!(
            shapes(&[view(3)], UltraServerLevel::Auto),
            [shape(3, false)],
            "auto: none before a node is in an UltraServer"
        );
        assert_eq!(
            shapes(&[in_block(view(3), "")], UltraServerLevel::Auto),
            [shape(3, false)],
            "an empty capacity block is none"
        );
        assert_eq!(
            shapes(&[view(3)], UltraServerLevel::Always),
            [shape(3, false), shape(3, true)],
            "always: from the start"
        );
        assert_eq!(shapes(&fleet, UltraServerLevel::Never), [shape(3, false)]);
        let no_block_label = LabelScheme {
            capacity_block_key: None,
            ..LabelScheme::default()
        };
        assert_eq!(
            shapes_for(&no_block_label, &fleet, UltraServerLevel::Always).len(),
            1,
            "no capacity block label: no UltraServer level to give"
        );
        assert_eq!(
            name_for(&s, "aws-network", shape(3, true)),
            "aws-network-ultraserver"
        );
        assert_eq!(
            levels_for(&s, shape(3, true), false).unwrap(),
            [
                "topology.k8s.aws/network-node-layer-1",
                "topology.k8s.aws/network-node-layer-2",
                "topology.k8s.aws/network-node-layer-3",
                crate::labels::CAPACITY_BLOCK_KEY,
                "kubernetes.io/hostname",
            ],
            "the block between the deepest layer and the hostname, which KAI requires last"
        );
        assert_eq!(
            levels_for(&s, shape(3, true), true).unwrap()[3..],
            [
                crate::labels::CAPACITY_BLOCK_KEY,
                "nvidia.com/gpu.clique",
                "kubernetes.io/hostname",
            ],
            "--nvlink-clique-level: the clique under the block"
        );
        assert_eq!(
            levels_for(&s, shape(3, false), true).unwrap().len(),
            4,
            "the Topology every node fits has no clique level"
        );
        // A 4-layer UltraServer member (none is sold today) gets the 4-layer UltraServer one.
        let deep = [in_block(view(4), "cr-2")];
        assert_eq!(
            shapes(&deep, UltraServerLevel::Auto),
            [shape(3, false), shape(4, false), shape(4, true)]
        );
        assert_eq!(
            name_for(&s, "aws-network", shape(4, true)),
            "aws-network-4-layer-ultraserver"
        );
    }
}

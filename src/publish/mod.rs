//! Publishers for schedulers, run by the leader beside the reconciler: a Kueue `Topology`
//! ([`kueue`]), Volcano `HyperNode`s ([`volcano`]), a KAI `Topology` ([`kai`]) and Slurm's
//! topology in a ConfigMap ([`slurm`]), each behind the small [`Publisher`] trait.
//! Each compares before it writes, so a steady cluster costs nothing.
//!
//! Owns: scheduler objects derived from the labels, and the UltraServer facts kept on Nodes
//! ([`shape`]: its labels and annotation; [`interconnect`]: its condition and taint). Never writes
//! the topology labels; never acts unless this replica leads.

pub(crate) mod cliques;
pub(crate) mod coverage;
pub mod interconnect;
pub(crate) mod kai;
pub mod kueue;
pub(crate) mod owner;
pub(crate) mod plugin;
pub mod reserved;
pub mod shape;
pub(crate) mod slurm;
pub mod topology;
pub(crate) mod trusted;
pub mod volcano;

use crate::bounds::{Bound, millis, secs};
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use clap::Args;
use futures::future::BoxFuture;
use kube::Client;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    duration::HumanDuration, labels::LabelScheme, leader::Leadership, metrics::Metrics,
    tree::NodeView,
};

/// `--publish-interval`'s range.
pub(crate) const PUBLISH_INTERVAL_RANGE: Bound =
    Bound::duration("publish-interval", millis(100), secs(3600));

/// What to publish for schedulers beyond labels: each scheduler's own flags (declared beside its
/// plug-in), and what they share (the UltraServer and NVLink levels, the publish interval).
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PublishArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub kueue: kueue::KueueArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub volcano: volcano::VolcanoArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub kai: kai::KaiArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub slurm: slurm::SlurmArgs,
    /// Give UltraServer members (nodes carrying the capacity block label) a Kueue and a KAI
    /// Topology with the capacity block as a level after the network layers and before the
    /// hostname, beside the ones every node fits, and a Volcano HyperNode of tier 0 per
    /// UltraServer under its leaf: auto (once a verified node has a capacity block), always,
    /// never. Kueue and KAI leave out of a Topology every node lacking one of its levels.
    #[arg(long, env = "LABELER_ULTRASERVER_LEVEL", value_enum, default_value_t)]
    #[serde(default)]
    pub(crate) ultraserver_level: topology::UltraServerLevel,
    /// Put the NVLink clique GPU Feature Discovery reports (`nvidia.com/gpu.clique`) under the
    /// capacity block in the UltraServer members' Kueue and KAI Topologies, and make Volcano's
    /// tier 0 one HyperNode per clique (in place of one per UltraServer), so that a capacity
    /// block holding two cliques (an x72 as two x36) is two domains. Nodes without the clique
    /// label (no GPU Feature Discovery, the fabric not complete) then fit no UltraServer
    /// Topology and no tier-0 HyperNode. Refused with `--ultraserver-level=never`.
    #[arg(long, env = "LABELER_NVLINK_CLIQUE_LEVEL", default_value_t = false, action = clap::ArgAction::Set)]
    #[serde(default)]
    pub(crate) nvlink_clique_level: bool,
    /// How often publishers compare what they publish with the labels (nothing is sent when
    /// nothing changed).
    #[arg(long, value_parser = PUBLISH_INTERVAL_RANGE.durations(), env = "LABELER_PUBLISH_INTERVAL", default_value = "5s")]
    pub(crate) publish_interval: HumanDuration,
}

/// What `uninstall` tells the plug-ins: each scheduler's own flags, declared beside it.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct UninstallFlags {
    #[command(flatten)]
    pub volcano: volcano::VolcanoUninstallFlags,
    #[command(flatten)]
    pub slurm: slurm::SlurmUninstallFlags,
}

/// Which Slurm ConfigMaps `uninstall` removes.
pub use slurm::ConfigMaps as SlurmConfigMaps;

/// Every scheduler we publish for, in the order they publish: adding one is a file implementing
/// [`plugin::Plugin`] and a line here.
pub(crate) const PLUGINS: [&dyn plugin::Plugin; 4] = [
    &kueue::Plugin,
    &kai::Plugin,
    &slurm::Plugin,
    &volcano::Plugin,
];

/// One kind of scheduler object kept in step with the labels.
pub(crate) trait Publisher: Send {
    /// For logs and metrics.
    fn name(&self) -> &'static str;
    /// Whether [`Publisher::publish`] needs the labelled nodes (then it waits for the node
    /// cache to sync).
    fn needs_nodes(&self) -> bool;
    /// Bring what this publisher owns in the cluster in step with `nodes` (empty unless it
    /// needs them); nothing is sent when nothing changed.
    fn publish<'a>(&'a mut self, nodes: &'a [NodeView]) -> BoxFuture<'a, ()>;
    /// Whether what it last made of the nodes still stands and no recheck of the cluster is
    /// due, so that [`Publisher::publish`] with the same nodes would read and send nothing: the
    /// loop then skips it (and building the nodes' views) while no node's name or labels
    /// changed. By default never (published every interval).
    fn fresh(&self) -> bool {
        false
    }
    /// This replica stopped leading: compare with the cluster afresh when it leads again.
    fn reset(&mut self);
}

/// The enabled publishers and what they share.
pub struct Publishers {
    list: Vec<Box<dyn Publisher>>,
    interval: Duration,
    leader: Leadership,
    scheme: LabelScheme,
    events: crate::admin::events::Events,
    metrics: Arc<Metrics>,
}

/// How long a new leader holds its first publish while nodes carrying topology labels wait for
/// their first reconcile (a partial view would take their HyperNodes and Slurm switches away
/// until then); after that it publishes what is verified. While EC2 fails for such a node, it
/// holds as long as that lasts: EC2 being down never takes a node out of what is published.
const FIRST_PASS_WAIT: Duration = Duration::from_secs(600);

/// How long a new leader holds its first publish while EC2 fails for many of the nodes
/// carrying topology labels (an outage; one node a hostile providerID makes unanswerable does
/// not hold it): what was published stays meanwhile.
const EC2_FAILING_WAIT: Duration = Duration::from_secs(3600);

impl Publishers {
    /// The publishers `args` turn on (`None` when none is); `slurm_files` says how to draw
    /// Slurm's files; `owner` is this installation's Lease (`<namespace>/<name>`), marked on
    /// what is ours where two installations may share names. A malformed
    /// `--slurm-topology-configmap` is an error.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: &Client,
        args: &PublishArgs,
        owner: &str,
        scheme: &LabelScheme,
        slurm_files: slurm::Files,
        metrics: &Arc<Metrics>,
        events: crate::admin::events::Events,
        leader: &Leadership,
    ) -> Result<Option<Self>, String> {
        let setup = plugin::Setup {
            client,
            args,
            owner,
            scheme,
            slurm_files: &slurm_files,
            metrics,
            events: &events,
            leader,
        };
        let mut list: Vec<Box<dyn Publisher>> = Vec::new();
        for p in PLUGINS {
            list.extend(p.build(&setup)?);
        }
        // Where schedulers are published to, the UltraServers they place by are checked
        // against the NVLink cliques the GPUs report (nothing is written but Events).
        if !list.is_empty() && args.ultraserver_level != topology::UltraServerLevel::Never {
            list.push(Box::new(cliques::CliqueCheck::new(
                client.clone(),
                scheme.clone(),
                metrics.clone(),
                events.clone(),
            )));
        }
        // Each enabled publisher's error counter exists from the start, at 0 (a query on it
        // matches something, and `increase()` sees the first failure).
        for p in &list {
            metrics.publisher_enabled(p.name());
        }
        Ok((!list.is_empty()).then(|| Self {
            list,
            interval: args.publish_interval.0.max(Duration::from_millis(100)),
            leader: leader.clone(),
            scheme: scheme.clone(),
            events,
            metrics: metrics.clone(),
        }))
    }

    /// The publishers built, in the order they publish.
    #[cfg(test)]
    pub fn names(&self) -> Vec<&'static str> {
        self.list.iter().map(|p| p.name()).collect()
    }

    /// Publish every interval until the process stops, from the node cache `reader` once
    /// `synced`, with the nodes `records` vouch for ([`trusted`]); `_alive` tells `/livez` this
    /// task runs.
    pub async fn run(
        mut self,
        reader: crate::node::store::NodeCache,
        records: Arc<crate::reconcile::nodes::Nodes>,
        synced: Arc<AtomicBool>,
        _alive: crate::tasks::TaskGuard,
    ) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The nodes' names and labels, and the records' generation, as of the last interval
        // (see `fingerprint`).
        let mut last: Option<(u64, u64)> = None;
        let mut reports = trusted::Reports::default();
        // Since when this replica leads, and whether it published with the nodes this term.
        let mut leading_since: Option<tokio::time::Instant> = None;
        let mut first_done = false;
        let mut told_waiting = false;
        let mut told_implausible = false;
        loop {
            tick.tick().await;
            if !self.leader.is_leader() {
                if leading_since.is_some() {
                    // What this term's answers vouched for is not the next term's: another
                    // leader may relabel nodes meanwhile. The next term starts from its own.
                    records.forget_verified();
                }
                self.list.iter_mut().for_each(|p| p.reset());
                reports.reset();
                last = None;
                leading_since = None;
                first_done = false;
                told_waiting = false;
                continue;
            }
            let since = *leading_since.get_or_insert_with(tokio::time::Instant::now);
            let synced = synced.load(Ordering::SeqCst);
            let now = synced.then(|| (fingerprint(&reader), records.generation()));
            let unchanged = now.is_some() && now == last;
            last = now;
            // What each publisher needs this interval: nothing while its nodes are as they were
            // and what it published stands (a quiet cluster costs a hash of the labels).
            let due: Vec<bool> = self
                .list
                .iter()
                .map(|p| !(unchanged && p.fresh()) && (synced || !p.needs_nodes()))
                .collect();
            if !due.contains(&true) {
                continue;
            }
            let wanted = self
                .list
                .iter()
                .zip(&due)
                .any(|(p, d)| *d && p.needs_nodes());
            // `None`: held (nodes awaiting verification, or an implausible view); the
            // publishers that do not read the nodes go on meanwhile.
            let nodes: Option<Vec<NodeView>> = if synced && wanted {
                let selection = trusted::select(&self.scheme, reader.state(), &records);
                if !first_done
                    && ((selection.waiting > 0 && since.elapsed() < FIRST_PASS_WAIT)
                        || (selection.ec2_failing() && since.elapsed() < EC2_FAILING_WAIT))
                {
                    if !std::mem::replace(&mut told_waiting, true) {
                        tracing::info!(
                            waiting = selection.waiting,
                            ec2_failing = selection.failing,
                            "holding the first publish until the nodes carrying topology labels are verified; what was published stays"
                        );
                    }
                    last = None;
                    None
                } else {
                    first_done = true;
                    self.metrics.unpublished_nodes(&selection.counts());
                    if reports.round(&selection.left, &self.events) {
                        // A node left out for a reason not told yet: look again next interval.
                        last = None;
                    }
                    let implausible = selection.implausible();
                    self.metrics.publish_halted(implausible);
                    if implausible {
                        if !std::mem::replace(&mut told_implausible, true) {
                            tracing::warn!(
                                vouched = selection.vouched,
                                "not publishing: more than a tenth of the verified nodes disagree with the rest on where a network node sits (EC2's answers mid-change?); what was published stays"
                            );
                        }
                        last = None;
                        None
                    } else {
                        told_implausible = false;
                        Some(selection.views)
                    }
                }
            } else {
                Some(Vec::new())
            };
            for (p, due) in self.list.iter_mut().zip(due) {
                match &nodes {
                    Some(nodes) if due => p.publish(nodes).await,
                    None if due && !p.needs_nodes() => p.publish(&[]).await,
                    _ => {}
                }
            }
        }
    }
}

/// What the publishers read of the nodes (each one's name and labels) in one number, the same
/// whatever order the cache lists them in: equal from one interval to the next when no node
/// came, went or had a label changed. Hashes the packed labels as they are (no unpacking).
fn fingerprint(reader: &crate::node::store::NodeCache) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    reader.state().iter().fold(0u64, |sum, n| {
        let mut h = DefaultHasher::new();
        n.name().hash(&mut h);
        match n.packed_labels() {
            Some(packed) => packed.hash(&mut h),
            None => n.plain_labels_for_hash().hash(&mut h),
        }
        sum.wrapping_add(h.finish())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{node::LiteNode, node::store::NodeCache};
    use kube::runtime::watcher::Event;
    use std::sync::Mutex;

    /// Counts its publishes (and the nodes with topology in each); fresh from its first publish on while `fresh_after` says so.
    struct Counting {
        calls: Arc<Mutex<Vec<usize>>>,
        published: bool,
        fresh_after: bool,
    }

    impl Publisher for Counting {
        fn name(&self) -> &'static str {
            "counting"
        }
        fn needs_nodes(&self) -> bool {
            true
        }
        fn publish<'a>(&'a mut self, nodes: &'a [NodeView]) -> BoxFuture<'a, ()> {
            // The nodes published with their topology (the others come without it).
            let placed = nodes
                .iter()
                .filter(|n| {
                    n.labels
                        .contains_key("topology.k8s.aws/network-node-layer-3")
                })
                .count();
            self.calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(placed);
            self.published = true;
            Box::pin(async {})
        }
        fn fresh(&self) -> bool {
            self.fresh_after && self.published
        }
        fn reset(&mut self) {
            self.published = false;
        }
    }

    /// A publisher that does not read the nodes (Kueue's Topologies every node fits): counts
    /// its calls.
    struct Blind(Arc<Mutex<usize>>);

    impl Publisher for Blind {
        fn name(&self) -> &'static str {
            "blind"
        }
        fn needs_nodes(&self) -> bool {
            false
        }
        fn publish<'a>(&'a mut self, _nodes: &'a [NodeView]) -> BoxFuture<'a, ()> {
            *self.0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
            Box::pin(async {})
        }
        fn reset(&mut self) {}
    }

    fn node(name: &str, leaf: &str) -> LiteNode {
        crate::testing::nodes::node(name)
            .path(
                "topology.k8s.aws/network-node-layer-",
                &["nn-spine", "nn-agg", leaf],
            )
            .packed()
    }

    /// `list` publishing every `interval` as the leader, with the default label keys.
    fn publishers(list: Vec<Box<dyn Publisher>>, interval: Duration) -> Publishers {
        Publishers {
            list,
            interval,
            leader: Leadership::always(),
            scheme: LabelScheme::default(),
            events: crate::admin::events::Events::default(),
            metrics: Arc::new(Metrics::default()),
        }
    }

    /// One never-fresh [`Counting`] publisher running every 5 s from `reader` and `records`;
    /// its task and what it counted.
    fn spawn_counting(
        reader: NodeCache,
        records: Arc<crate::reconcile::nodes::Nodes>,
        liveness: &crate::tasks::Liveness,
    ) -> (tokio::task::JoinHandle<()>, Arc<Mutex<Vec<usize>>>) {
        let calls = Arc::new(Mutex::new(vec![]));
        let counting: Box<dyn Publisher> = Box::new(Counting {
            calls: calls.clone(),
            published: false,
            fresh_after: false,
        });
        let run = publishers(vec![counting], Duration::from_secs(5)).run(
            reader,
            records,
            Arc::new(AtomicBool::new(true)),
            liveness.task("publish"),
        );
        (tokio::spawn(run), calls)
    }

    /// What a reconcile that found `n`'s labels to be EC2's answer leaves in its record.
    fn verify(records: &crate::reconcile::nodes::Nodes, n: &LiteNode) {
        records.set_state(n, crate::state::NodeState::Labelled);
        let fp = crate::labels::family_fingerprint(&LabelScheme::default(), n.labels().iter());
        records.set_verified(n, Some(Some(fp)));
    }

    /// A publisher whose last publish stands is not called, and no node view is built, while
    /// no node's labels change; a label change, a node joining or leaving, brings it back, and
    /// so does a node becoming verified. One that is never fresh is called every interval.
    #[tokio::test(start_paused = true)]
    async fn publishers_are_skipped_while_no_label_changes() {
        let (reader, mut writer) = NodeCache::new();
        let records = Arc::new(crate::reconcile::nodes::Nodes::new(Arc::new(
            Metrics::default(),
        )));
        for k in 0..50 {
            let n = node(&format!("n-{k}"), "nn-leaf-1");
            verify(&records, &n);
            writer.apply(Event::Apply(n));
        }
        let (skipping, every) = (Arc::new(Mutex::new(vec![])), Arc::new(Mutex::new(vec![])));
        let list: Vec<Box<dyn Publisher>> = vec![
            Box::new(Counting {
                calls: skipping.clone(),
                published: false,
                fresh_after: true,
            }),
            Box::new(Counting {
                calls: every.clone(),
                published: false,
                fresh_after: false,
            }),
        ];
        let interval = Duration::from_secs(5);
        let publishers = publishers(list, interval);
        let liveness = crate::tasks::Liveness::default();
        let synced = Arc::new(AtomicBool::new(true));
        let task =
            tokio::spawn(publishers.run(reader, records.clone(), synced, liveness.task("publish")));
        let count =
            |c: &Arc<Mutex<Vec<usize>>>| c.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // Five intervals of a quiet cluster.
        tokio::time::sleep(interval * 5 - Duration::from_millis(1)).await;
        assert_eq!(count(&skipping), [50], "published once, then skipped");
        assert_eq!(count(&every).len(), 5, "the other every interval");
        // A label changes and is verified: published again, once.
        let moved = node("n-7", "nn-leaf-2");
        verify(&records, &moved);
        writer.apply(Event::Apply(moved));
        tokio::time::sleep(interval * 3).await;
        assert_eq!(count(&skipping), [50, 50]);
        // A node joins, one leaves.
        let joined = node("n-50", "nn-leaf-1");
        verify(&records, &joined);
        writer.apply(Event::Apply(joined));
        tokio::time::sleep(interval * 2).await;
        writer.apply(Event::Delete(node("n-0", "nn-leaf-1")));
        tokio::time::sleep(interval * 2).await;
        assert_eq!(count(&skipping), [50, 50, 51, 50]);
        // The same labels on the same nodes, cached anew: nothing to publish.
        writer.apply(Event::Apply(node("n-7", "nn-leaf-2")));
        tokio::time::sleep(interval * 2).await;
        assert_eq!(count(&skipping).len(), 4);
        // A node joins with labels no answer vouches for: left out; once its answer agrees
        // (no label changes), it is in.
        let unverified = node("n-51", "nn-leaf-1");
        writer.apply(Event::Apply(unverified.clone()));
        tokio::time::sleep(interval * 2).await;
        assert_eq!(count(&skipping), [50, 50, 51, 50, 50]);
        verify(&records, &unverified);
        tokio::time::sleep(interval * 2).await;
        assert_eq!(count(&skipping), [50, 50, 51, 50, 50, 51]);
        task.abort();
    }

    /// A new leader whose EC2 lookups fail for a node carrying topology labels publishes
    /// nothing (what was published stays), past the first-pass wait, for as long as that lasts;
    /// a node waiting for its first reconcile holds it only up to that wait.
    #[tokio::test(start_paused = true)]
    async fn a_new_leader_never_publishes_without_nodes_ec2_could_not_be_asked_about() {
        let (reader, mut writer) = NodeCache::new();
        let records = Arc::new(crate::reconcile::nodes::Nodes::new(Arc::new(
            Metrics::default(),
        )));
        for k in 0..5 {
            let n = node(&format!("n-{k}"), "nn-leaf-1");
            verify(&records, &n);
            writer.apply(Event::Apply(n));
        }
        let down = node("down", "nn-leaf-1");
        records.set_state(&down, crate::state::NodeState::Failing("ec2_unavailable"));
        writer.apply(Event::Apply(down.clone()));
        let liveness = crate::tasks::Liveness::default();
        let (task, calls) = spawn_counting(reader, records.clone(), &liveness);
        let count = || calls.lock().unwrap_or_else(|e| e.into_inner()).clone();
        tokio::time::sleep(FIRST_PASS_WAIT * 2).await;
        assert!(
            count().is_empty(),
            "published while EC2 failed for 1 node of 6"
        );
        // EC2 answers: published, with every node.
        verify(&records, &down);
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(count().first(), Some(&6));
        task.abort();

        // A node never reconciled holds a new leader's first publish up to the wait only.
        let (reader, mut writer) = NodeCache::new();
        let records = Arc::new(crate::reconcile::nodes::Nodes::new(Arc::new(
            Metrics::default(),
        )));
        let verified = node("v", "nn-leaf-1");
        verify(&records, &verified);
        writer.apply(Event::Apply(verified));
        writer.apply(Event::Apply(node("new", "nn-leaf-1")));
        let (task, calls) = spawn_counting(reader, records, &liveness);
        tokio::time::sleep(FIRST_PASS_WAIT - Duration::from_secs(10)).await;
        assert!(calls.lock().unwrap_or_else(|e| e.into_inner()).is_empty());
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(
            calls.lock().unwrap_or_else(|e| e.into_inner()).first(),
            Some(&1),
            "published after the wait, without the unverified node"
        );
        task.abort();
    }

    /// While the publishers that read the nodes are held (a node EC2 could not be asked
    /// about), one that does not read them (the Kueue Topology every node fits) goes on.
    #[tokio::test(start_paused = true)]
    async fn a_publisher_that_reads_no_nodes_is_never_held_for_them() {
        let (reader, mut writer) = NodeCache::new();
        let records = Arc::new(crate::reconcile::nodes::Nodes::new(Arc::new(
            Metrics::default(),
        )));
        let down = node("down", "nn-leaf-1");
        records.set_state(&down, crate::state::NodeState::Failing("ec2_unavailable"));
        writer.apply(Event::Apply(down));
        let (calls, blind) = (Arc::new(Mutex::new(vec![])), Arc::new(Mutex::new(0)));
        let list: Vec<Box<dyn Publisher>> = vec![
            Box::new(Counting {
                calls: calls.clone(),
                published: false,
                fresh_after: false,
            }),
            Box::new(Blind(blind.clone())),
        ];
        let liveness = crate::tasks::Liveness::default();
        let run = publishers(list, Duration::from_secs(5)).run(
            reader,
            records,
            Arc::new(AtomicBool::new(true)),
            liveness.task("publish"),
        );
        let task = tokio::spawn(run);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            calls.lock().unwrap_or_else(|e| e.into_inner()).is_empty(),
            "the node reader was not held"
        );
        assert!(
            *blind.lock().unwrap_or_else(|e| e.into_inner()) >= 10,
            "the publisher reading no nodes was held with it"
        );
        task.abort();
    }
}

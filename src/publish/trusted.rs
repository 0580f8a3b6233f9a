//! Which nodes the publishers see: those whose topology labels are what EC2's answer (or a
//! verification record we trust) makes of them, as the reconciler last found, and whose paths
//! agree with the rest. Schedulers take what we publish as the truth about the fabric, so a
//! label no answer vouches for never reaches a Kueue or KAI Topology, a HyperNode or Slurm's
//! files: not one someone rewrote since, nor one on a node we cannot verify (EKS Hybrid,
//! Fargate, another cloud, a malformed providerID, an instance ID EC2 refuses).
//!
//! Each node carrying our topology keys that is left out is counted by reason
//! (`unpublished_nodes`) and, once per node and reason, told in a `TopologyNotPublished` Event
//! ([`Reports`]). One inconsistent node is left out on its own ([`consistent`]), so it never
//! stops the others being published.
//!
//! Owns: that choice. Never writes anything but Events.

use std::collections::{BTreeMap, HashMap};

use crate::{
    admin::events::{Events, Reason},
    consistent::{Disagreement, consistent},
    labels::{LabelScheme, family_fingerprint},
    node::CachedNode,
    reconcile::nodes::{Nodes, Standing},
    state::NodeState,
    tree::NodeView,
};

/// Why a node carrying our topology keys is left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Left {
    /// Its labels are not what EC2's answer makes of it (someone rewrote them, or our
    /// correction is on its way).
    LabelsDisagree,
    /// No EC2 instance we verify (the skip reason).
    NotEc2(&'static str),
    /// EC2 does not describe its instance, or refuses its ID.
    NotDescribed,
    /// No answer yet: new, or EC2 failing since it came.
    Unverified,
    /// Its path disagrees with most nodes'.
    Inconsistent(Disagreement),
}

impl Left {
    /// The `reason` label of `unpublished_nodes`.
    pub(crate) const REASONS: [&'static str; 5] = [
        "labels_disagree",
        "not_ec2",
        "not_described",
        "unverified",
        "inconsistent",
    ];

    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Left::LabelsDisagree => "labels_disagree",
            Left::NotEc2(_) => "not_ec2",
            Left::NotDescribed => "not_described",
            Left::Unverified => "unverified",
            Left::Inconsistent(_) => "inconsistent",
        }
    }

    /// Rounds in a row a node is left out for this before an Event says so: a rewritten label
    /// is usually put back within the interval (the reconciler's own Event tells that), and a
    /// node waiting for its first answer is not news.
    fn report_after(&self) -> Option<u32> {
        match self {
            Left::LabelsDisagree => Some(2),
            Left::Unverified => None,
            _ => Some(1),
        }
    }

    /// The Event's note.
    pub(crate) fn note(&self) -> String {
        let tail = "left out of the Kueue and KAI Topologies, Volcano HyperNodes and Slurm topology we publish";
        match self {
            Left::LabelsDisagree => format!(
                "its topology labels are not what EC2 says of its instance (rewritten by another writer?): {tail} until they are"
            ),
            Left::NotEc2(why) => format!(
                "it carries topology labels but is no EC2 instance we can verify ({why}): {tail}"
            ),
            Left::NotDescribed => format!(
                "it carries topology labels but EC2 does not describe its instance or refuses its ID: {tail}"
            ),
            Left::Unverified => format!("EC2 has not answered for it yet: {tail} until it does"),
            Left::Inconsistent(d) => format!("{d}: {tail}; the other nodes are published"),
        }
    }
}

/// What the publishers get this round.
#[derive(Debug, Default)]
pub(crate) struct Selection {
    /// Every node: those vouched for with their labels, the others without any family label
    /// (as nodes without topology, which Slurm still lists).
    pub views: Vec<NodeView>,
    /// Nodes carrying our topology keys left out, with why.
    pub left: Vec<(std::sync::Arc<CachedNode>, Left)>,
    /// Nodes carrying our topology keys not reconciled by this replica in its term yet.
    pub waiting: usize,
    /// Nodes carrying our topology keys that EC2 could not be asked about yet (their lookup
    /// fails): a new leader does not publish without them while they are many (see
    /// [`Selection::ec2_failing`]): EC2 being down must not take nodes out of what is published.
    pub failing: usize,
    /// Nodes carrying our topology keys, vouched for or not.
    pub carrying: usize,
    /// Nodes whose labels EC2's answers vouch for (those left out as inconsistent included).
    pub(crate) vouched: usize,
}

/// The view is implausible, and nothing is published, when more than this many of the vouched
/// nodes, and more than [`IMPLAUSIBLE_PERCENT`] of them, disagree with the rest: EC2's answers
/// caught mid-change, or our reading of them wrong. A forged or stale node or two never halts.
pub(crate) const IMPLAUSIBLE_MIN: usize = 2;
/// See [`IMPLAUSIBLE_MIN`].
pub(crate) const IMPLAUSIBLE_PERCENT: usize = 10;

impl Selection {
    /// EC2 fails for more than [`IMPLAUSIBLE_PERCENT`] of the nodes carrying topology labels
    /// that no answer vouches for yet: an outage, not one node a hostile providerID makes
    /// unanswerable.
    pub(crate) fn ec2_failing(&self) -> bool {
        self.failing > 0 && self.failing * 100 > self.carrying * IMPLAUSIBLE_PERCENT
    }

    /// Too many vouched nodes disagree with the rest to publish any (see [`IMPLAUSIBLE_MIN`]).
    pub(crate) fn implausible(&self) -> bool {
        let inconsistent = self
            .left
            .iter()
            .filter(|(_, l)| matches!(l, Left::Inconsistent(_)))
            .count();
        inconsistent > IMPLAUSIBLE_MIN && inconsistent * 100 > self.vouched * IMPLAUSIBLE_PERCENT
    }

    /// How many were left out, for every reason (0 included).
    pub(crate) fn counts(&self) -> Vec<(&'static str, usize)> {
        Left::REASONS
            .iter()
            .map(|r| {
                (
                    *r,
                    self.left.iter().filter(|(_, l)| l.as_str() == *r).count(),
                )
            })
            .collect()
    }
}

/// Whether `labels` hold any of what publishers draw from (a layer or the capacity block).
fn carries_topology(scheme: &LabelScheme, labels: &BTreeMap<String, String>) -> bool {
    labels
        .keys()
        .any(|k| scheme.layer_index(k).is_some() || scheme.capacity_block_key.as_deref() == Some(k))
}

/// Why a node whose labels the records do not vouch for is left out.
fn why(standing: Option<&Standing>) -> Left {
    match standing {
        None
        | Some(Standing {
            state: None | Some(NodeState::Pending),
            verified: None,
        }) => Left::Unverified,
        Some(Standing {
            verified: Some(_), ..
        }) => Left::LabelsDisagree,
        Some(Standing {
            state: Some(NodeState::Skipped(why)),
            ..
        }) => Left::NotEc2(why),
        Some(Standing {
            state: Some(NodeState::Rejected | NodeState::NotDescribed(_)),
            ..
        }) => Left::NotDescribed,
        Some(_) => Left::Unverified,
    }
}

/// The nodes of `cache` the records vouch for, and agreeing with one another.
pub(crate) fn select(
    scheme: &LabelScheme,
    cache: Vec<std::sync::Arc<CachedNode>>,
    records: &Nodes,
) -> Selection {
    let standings = records.standings(cache.iter().map(|n| n.name()));
    let mut out = Selection::default();
    let mut views = Vec::with_capacity(cache.len());
    // Nodes published without topology (Slurm still lists them, under no switch of theirs).
    let mut bare = Vec::new();
    let mut by_name: HashMap<String, std::sync::Arc<CachedNode>> = HashMap::new();
    for (node, standing) in cache.into_iter().zip(standings) {
        let mut labels = node.labels().into_owned();
        let vouched = standing
            .as_ref()
            .and_then(|s| s.verified)
            .is_some_and(|fp| fp == family_fingerprint(scheme, &labels));
        let view = |labels| NodeView {
            name: node.name().to_string(),
            ready: None,
            labels,
            note: None,
            tainted: false,
        };
        let carries = carries_topology(scheme, &labels);
        out.carrying += usize::from(carries);
        if vouched {
            out.vouched += 1;
            views.push(view(labels));
            by_name.insert(node.name().to_string(), node);
            continue;
        }
        labels.retain(|k, _| !scheme.is_family_label(k));
        bare.push(view(labels));
        if carries {
            // No answer in this term yet, and not a node that will have none.
            let answerless = standing.as_ref().is_none_or(|s| s.verified.is_none());
            if answerless
                && !matches!(
                    standing,
                    Some(Standing {
                        state: Some(
                            NodeState::Skipped(_)
                                | NodeState::Rejected
                                | NodeState::NotDescribed(_)
                                | NodeState::Failing(_)
                        ),
                        ..
                    })
                )
            {
                out.waiting += 1;
            }
            if matches!(
                standing,
                Some(Standing {
                    state: Some(NodeState::Failing(_)),
                    verified: None,
                })
            ) {
                out.failing += 1;
            }
            out.left.push((node, why(standing.as_ref())));
        }
    }
    let (mut kept, excluded) = consistent(scheme, views);
    for mut e in excluded {
        if let Some(node) = by_name.remove(&e.node.name) {
            out.left.push((node, Left::Inconsistent(e.why)));
        }
        e.node.labels.retain(|k, _| !scheme.is_family_label(k));
        kept.push(e.node);
    }
    kept.extend(bare);
    out.views = kept;
    out
}

/// One Event per node and reason it is left out for (see [`Left::report_after`]).
#[derive(Default)]
pub(crate) struct Reports {
    /// Node → the reason it was left out for, rounds in a row, whether that was told.
    seen: HashMap<String, (Left, u32, bool)>,
}

impl Reports {
    /// Count this round's `left` and record the Events due. Returns whether a node is left out
    /// for a reason not yet told (the caller looks again next interval, changed or not).
    pub(crate) fn round(
        &mut self,
        left: &[(std::sync::Arc<CachedNode>, Left)],
        events: &Events,
    ) -> bool {
        let mut next: HashMap<String, (Left, u32, bool)> = HashMap::with_capacity(left.len());
        let mut untold = false;
        for (node, why) in left {
            if why.report_after().is_none() {
                // Never told (waiting for a first answer): nothing to remember either (an
                // install leaves every node so for a while).
                continue;
            }
            let (rounds, told) = match self.seen.remove(node.name()) {
                Some((was, rounds, told)) if &was == why => (rounds.saturating_add(1), told),
                _ => (1, false),
            };
            let due = why.report_after().is_some_and(|after| rounds >= after);
            if due && !told {
                events.publish(
                    Reason::TopologyNotPublished,
                    "PublishTopology",
                    &why.note(),
                    node.object_ref(),
                );
            }
            untold |= !(due || told);
            next.insert(node.name().to_string(), (why.clone(), rounds, told || due));
        }
        self.seen = next;
        untold
    }

    /// Forget everything (this replica stopped leading).
    pub(crate) fn reset(&mut self) {
        self.seen.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{metrics::Metrics, node::LiteNode, node::store::NodeCache};
    use kube::runtime::watcher::Event;
    use std::sync::Arc;

    const L: &str = "topology.k8s.aws/network-node-layer-";

    fn node(name: &str, path: &[&str], provider_id: &str) -> LiteNode {
        crate::testing::nodes::node(name)
            .uid()
            .path(L, path)
            .provider_id(provider_id)
            .packed()
    }

    fn fp(path: &[&str]) -> u64 {
        let s = LabelScheme::default();
        let labels: BTreeMap<String, String> = path
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("{L}{}", i + 1), v.to_string()))
            .collect();
        family_fingerprint(&s, &labels)
    }

    /// Only nodes whose labels are what their answer makes of them reach the publishers: a
    /// Hybrid node and a malformed providerID carrying layer labels (one of them giving a leaf
    /// a second parent), an EC2 node whose label was rewritten after verification, and a node
    /// never reconciled are left out, each with its reason; the rest is published whole.
    #[test]
    fn only_what_answers_vouch_for_is_published() {
        let s = LabelScheme::default();
        let records = Nodes::new(Arc::new(Metrics::default()));
        let (reader, mut writer) = NodeCache::new();
        let real = ["nn-s", "nn-a", "nn-l"];
        let mut all = Vec::new();
        for k in 0..3 {
            let n = node(
                &format!("ok-{k}"),
                &real,
                &format!("aws:///us-west-2a/i-{k:017x}"),
            );
            records.set_state(&n, NodeState::Labelled);
            records.set_verified(&n, Some(Some(fp(&real))));
            all.push(n);
        }
        let hybrid = node(
            "hybrid",
            &["nn-s", "nn-b", "nn-l"],
            "eks-hybrid:///us-west-2/c/hybrid",
        );
        records.set_state(&hybrid, NodeState::Skipped("eks_hybrid"));
        records.set_verified(&hybrid, Some(None));
        let malformed = node("malformed", &real, "aws:///us-west-2a/not-an-id");
        records.set_state(&malformed, NodeState::Skipped("malformed_provider_id"));
        let rewritten = node(
            "rewritten",
            &["nn-s", "nn-a", "nn-forged"],
            "aws:///us-west-2a/i-00000000000000009",
        );
        records.set_state(&rewritten, NodeState::Labelled);
        records.set_verified(&rewritten, Some(Some(fp(&real))));
        let fresh = node("fresh", &real, "aws:///us-west-2a/i-0000000000000000a");
        let failing = node("failing", &real, "aws:///us-west-2a/i-0000000000000000c");
        records.set_state(&failing, NodeState::Failing("ec2_unavailable"));
        let bare = node("bare", &[], "aws:///us-west-2a/i-0000000000000000b");
        all.extend([hybrid, malformed, rewritten, fresh, failing, bare]);
        for n in all {
            writer.apply(Event::Apply(n));
        }
        let sel = select(&s, reader.state(), &records);
        let mut names: Vec<&str> = sel
            .views
            .iter()
            .filter(|v| carries_topology(&s, &v.labels))
            .map(|v| v.name.as_str())
            .collect();
        names.sort();
        assert_eq!(names, ["ok-0", "ok-1", "ok-2"]);
        assert_eq!(
            sel.views.len(),
            9,
            "every node, the others as without topology"
        );
        let mut left: Vec<(&str, &str)> = sel
            .left
            .iter()
            .map(|(n, l)| (n.name(), l.as_str()))
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ("failing", "unverified"),
                ("fresh", "unverified"),
                ("hybrid", "not_ec2"),
                ("malformed", "not_ec2"),
                ("rewritten", "labels_disagree"),
            ]
        );
        assert_eq!(sel.waiting, 1, "fresh was never reconciled");
        assert_eq!(sel.failing, 1, "EC2 could not be asked about failing");
        let counts: BTreeMap<&str, usize> = sel.counts().into_iter().collect();
        assert_eq!(counts["not_ec2"], 2);
        assert_eq!(counts["inconsistent"], 0);
    }

    /// One node EC2 cannot answer for (a hostile providerID's region) does not hold a new
    /// leader's first publish; EC2 failing for more than a tenth of the nodes (an outage) does.
    #[test]
    fn only_an_outage_holds_the_first_publish() {
        let of = |failing, carrying| Selection {
            failing,
            carrying,
            ..Selection::default()
        };
        assert!(!of(1, 20).ec2_failing(), "one hostile node among 20");
        assert!(of(3, 20).ec2_failing());
        assert!(of(20, 20).ec2_failing(), "EC2 down for every node");
        assert!(!of(0, 20).ec2_failing());
    }

    /// Issue 55 review: a replica leading again does not take its last term's vouchers for
    /// this term's: forgotten when it stopped leading, its nodes wait for their reconcile.
    #[test]
    fn a_new_term_waits_for_its_own_answers() {
        let s = LabelScheme::default();
        let records = Nodes::new(Arc::new(Metrics::default()));
        let (reader, mut writer) = NodeCache::new();
        let path = ["nn-s", "nn-a", "nn-l"];
        let n = node("n", &path, "aws:///us-west-2a/i-00000000000000001");
        records.set_state(&n, NodeState::Labelled);
        records.set_verified(&n, Some(Some(fp(&path))));
        writer.apply(Event::Apply(n.clone()));
        assert_eq!(select(&s, reader.state(), &records).waiting, 0);
        let before = records.generation();
        records.forget_verified();
        assert_ne!(records.generation(), before, "the publishers look again");
        let sel = select(&s, reader.state(), &records);
        assert_eq!((sel.waiting, sel.vouched), (1, 0));
        records.set_verified(&n, Some(Some(fp(&path))));
        assert_eq!(select(&s, reader.state(), &records).vouched, 1);
    }

    /// Two verified nodes whose answers disagree (EC2 moved one, the other not yet re-asked):
    /// the minority is left out as inconsistent and the rest is still published.
    #[test]
    fn an_inconsistent_verified_node_is_left_out_alone() {
        let s = LabelScheme::default();
        let records = Nodes::new(Arc::new(Metrics::default()));
        let (reader, mut writer) = NodeCache::new();
        for (name, path) in [
            ("a", ["nn-s", "nn-a", "nn-l"]),
            ("b", ["nn-s", "nn-a", "nn-l"]),
            ("c", ["nn-s", "nn-b", "nn-l"]),
        ] {
            let n = node(name, &path, "aws:///us-west-2a/i-00000000000000001");
            records.set_state(&n, NodeState::Labelled);
            records.set_verified(&n, Some(Some(fp(&path))));
            writer.apply(Event::Apply(n));
        }
        let sel = select(&s, reader.state(), &records);
        let placed = |name: &str| {
            sel.views
                .iter()
                .any(|v| v.name == name && carries_topology(&s, &v.labels))
        };
        assert!(placed("a") && placed("b") && !placed("c"));
        assert_eq!(sel.views.len(), 3, "c is published without topology");
        assert_eq!(sel.left.len(), 1);
        assert_eq!(sel.left[0].0.name(), "c");
        assert!(
            sel.left[0]
                .1
                .note()
                .contains("under nn-b, the other nodes under nn-a")
        );
    }

    /// One or two disagreeing nodes are left out and the rest published; more than a tenth of
    /// the fleet disagreeing (and more than two nodes) is an implausible view.
    #[test]
    fn only_a_view_where_many_disagree_is_implausible() {
        let s = LabelScheme::default();
        let records = Nodes::new(Arc::new(Metrics::default()));
        let (reader, mut writer) = NodeCache::new();
        let mut add = |name: String, path: [&str; 3]| {
            let n = node(&name, &path, "aws:///us-west-2a/i-00000000000000001");
            records.set_state(&n, NodeState::Labelled);
            records.set_verified(&n, Some(Some(fp(&path))));
            writer.apply(Event::Apply(n));
        };
        for k in 0..40 {
            add(format!("ok-{k}"), ["nn-s", "nn-a", "nn-l"]);
        }
        for k in 0..3 {
            add(format!("odd-{k}"), ["nn-s", "nn-b", "nn-l"]);
        }
        let sel = select(&s, reader.state(), &records);
        assert_eq!(sel.vouched, 43);
        assert!(
            !sel.implausible(),
            "3 of 43 disagree: published without them"
        );
        for k in 3..6 {
            add(format!("odd-{k}"), ["nn-s", "nn-b", "nn-l"]);
        }
        let sel = select(&s, reader.state(), &records);
        assert!(sel.implausible(), "6 of 46 disagree");
    }

    /// Events: once per node and reason; a rewritten label only when it is still left out the
    /// round after; a node waiting for its first answer never.
    #[test]
    fn reports_are_told_once_per_node_and_reason() {
        let (reader, mut writer) = NodeCache::new();
        for name in ["x", "y", "z"] {
            writer.apply(Event::Apply(node(
                name,
                &["s"],
                "aws:///a/i-00000000000000001",
            )));
        }
        let nodes = reader.state();
        let by = |name: &str| {
            nodes
                .iter()
                .find(|n| n.name() == name)
                .cloned()
                .expect("node")
        };
        let (events, mut rx) = Events::captured(Arc::new(Metrics::default()));
        let mut told: Vec<String> = Vec::new();
        let mut sent = || {
            while let Ok(e) = rx.try_recv() {
                assert_eq!(e.reason.as_deref(), Some("TopologyNotPublished"));
                told.push(e.regarding.and_then(|r| r.name).unwrap_or_default());
            }
            told.clone()
        };
        let mut reports = Reports::default();
        let left = vec![
            (by("x"), Left::NotEc2("eks_hybrid")),
            (by("y"), Left::LabelsDisagree),
            (by("z"), Left::Unverified),
        ];
        assert!(reports.round(&left, &events), "y not told yet");
        assert_eq!(sent(), ["x"]);
        assert!(!reports.round(&left, &events));
        assert_eq!(sent(), ["x", "y"]);
        assert!(!reports.round(&left, &events));
        assert_eq!(sent(), ["x", "y"], "told once");
        // y is put back, then rewritten again: a new spell, told again when it lasts.
        reports.round(&left[..1], &events);
        reports.round(&left[..2], &events);
        reports.round(&left[..2], &events);
        assert_eq!(sent(), ["x", "y", "y"]);
    }
}

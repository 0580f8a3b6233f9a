//! Everything the controller remembers about one node, in one record: its failure count (the
//! error policy's backoff), our last write until the node cache shows it, its history of
//! corrections (another writer fighting over our labels), and where it stands (the
//! `nodes{state}` gauge). One map keyed by node name, and one place that forgets a node that is
//! gone ([`Nodes::retain`]).
//!
//! Owns: per-node memory. Never does I/O. (What we know about *instances* is the lookup cache's,
//! keyed by instance and boot, with its own life.)

use std::{
    collections::{HashMap, HashSet},
    num::NonZeroU64,
    sync::{Arc, Mutex, MutexGuard},
};

use super::conflict::History;
use crate::{labels::Desired, metrics::Metrics, node::LiteNode, state::NodeState};

/// One node's record.
#[derive(Debug, Default)]
pub struct NodeRecord {
    /// Reconciles in a row that failed.
    pub failures: u32,
    /// When the controller looks at the node again (seconds after [`EPOCH`], plus one; 0: when
    /// it changes or at its resync slot). For `explain`.
    next_look: u32,
    /// What the record holds only for a while: most records hold none of it.
    passing: Option<Box<Passing>>,
    /// Corrections of our labels on this node (see [`super::conflict`]).
    pub conflict: History,
    /// Where the node stands; `None` before its first reconcile.
    state: Option<NodeState>,
    /// Hash of what matters to a reconcile, as the watch last delivered the node (see
    /// [`Nodes::changed`]).
    relevant: Option<NonZeroU64>,
    /// The fingerprint ([`crate::labels::family_fingerprint`]) of the family labels EC2's
    /// latest answer for this node (or a record we trust) makes of it: the node is published to
    /// schedulers while its labels have exactly this fingerprint. `None` before any answer, and
    /// once the node is no instance we can verify. Kept when EC2 fails: a correct label is
    /// never dropped because EC2 was down.
    /// (Fingerprints are never 0: kept in 8 bytes.)
    verified: Option<NonZeroU64>,
}

/// What a node's record holds only for a while (an error, a write the node cache does not show
/// yet), boxed together: most records hold none of it, and a record of every node is kept
/// inline in one table (see `a_node_record_stays_small`). Each part boxed again: a record holding
/// one of them (every node failing in an EC2 outage, every node written during an install)
/// holds a 32-byte box and that part alone.
#[derive(Debug, Default)]
struct Passing {
    /// The last reconcile's error, while it fails. For `explain`.
    /// Shared with every other node that failed with the same text (an EC2 outage fails the
    /// whole fleet with one message: one text, not one per node).
    last_error: Option<std::sync::Arc<str>>,
    /// Our last write, while the node cache does not show it yet (see [`Echo`]).
    echo: Option<Box<Echo>>,
    /// Our last startup-gate write (labels, condition, taint), until the node cache shows it
    /// (see [`NodeRecord::gate_behind`]).
    gate_write: Option<Box<GateWrite>>,
}

impl Passing {
    fn is_empty(&self) -> bool {
        self.last_error.is_none() && self.echo.is_none() && self.gate_write.is_none()
    }
}

/// How long the node cache may lag behind a gate write before we stop waiting for it (a watch
/// that re-listed may have skipped that version).
const GATE_ECHO: std::time::Duration = std::time::Duration::from_secs(30);

/// How soon a reconcile that found the cache behind our gate write looks again (the watch event
/// of our write usually comes first and triggers it anyway).
const GATE_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// What one of our startup-gate writes left on the node. Another writer (the kubelet, the cloud
/// controller) can bump the node right after us, and the cache may then never hold the exact
/// version our write returned: a version that shows this is as good as ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GateMark {
    /// Our labels (the gate decided from the version the write returned).
    Labels,
    /// The `TopologyLabeled` condition with this status and reason.
    Condition { status: bool, reason: &'static str },
    /// The startup taint, removed.
    TaintReleased,
}

#[derive(Debug)]
struct GateWrite {
    resource_version: String,
    at: std::time::Instant,
    mark: GateMark,
}

/// What we wrote to a node, until the node cache shows it.
///
/// Under load the watch can lag seconds behind our own writes. A reconcile that runs meanwhile
/// (a resync, a retry) reads the node as it was before our write and would apply the same
/// labels again. Each successful write records the resourceVersion it was made against and
/// what it wrote; while the cached node still carries that resourceVersion and the labels it
/// needs are the ones written, the write is known to be done and is not repeated.
#[derive(Debug)]
struct Echo {
    uid: Option<String>,
    resource_version: String,
    /// A hash of what was written: the labels and record themselves are a kilobyte or two, and
    /// during an install every node written holds one until the watch shows its write.
    desired: u64,
}

fn hash_of(desired: &Desired) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut h = DefaultHasher::new();
    desired.hash(&mut h);
    h.finish()
}

/// The clock `next_look` counts from.
static EPOCH: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

/// What `explain` shows of a node's record.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordView {
    pub state: Option<String>,
    pub reason: Option<String>,
    pub failures: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Seconds until the controller looks at the node again by itself (`None`: when the node
    /// changes, or at its resync slot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) next_look_in_s: Option<u64>,
    /// Our last write is not in the node cache yet.
    pub(crate) write_pending: bool,
    /// Another writer keeps changing our labels: writes to this node are held.
    pub(crate) held_for_conflict: bool,
}

impl NodeRecord {
    /// Change what passes (made when needed, dropped when it holds nothing).
    fn passing<R>(&mut self, f: impl FnOnce(&mut Passing) -> R) -> R {
        let passing = self.passing.get_or_insert_default();
        let r = f(passing);
        if passing.is_empty() {
            self.passing = None;
        }
        r
    }

    fn last_error(&self) -> Option<&std::sync::Arc<str>> {
        self.passing.as_ref()?.last_error.as_ref()
    }

    fn echo(&self) -> Option<&Echo> {
        self.passing.as_ref()?.echo.as_deref()
    }

    /// The reconcile succeeded; it looks again after `next` (`None`: on change or resync).
    pub fn succeeded(&mut self, next: Option<std::time::Duration>) {
        self.failures = 0;
        if self.last_error().is_some() {
            self.passing(|p| p.last_error = None);
        }
        self.next_look(next);
    }

    /// The reconcile failed with `e` (the error policy sets the next look).
    pub fn failed(&mut self, e: &crate::Error) {
        let error = Nodes::shared_error(e.to_string());
        self.passing(|p| p.last_error = Some(error));
    }

    /// The controller looks at the node again after `after` (`None`: on change or resync).
    pub(crate) fn next_look(&mut self, after: Option<std::time::Duration>) {
        self.next_look = after.map_or(0, |d| {
            let at = EPOCH.elapsed().saturating_add(d).as_secs();
            u32::try_from(at).unwrap_or(u32::MAX - 1).saturating_add(1)
        });
    }

    pub fn view(&self) -> RecordView {
        let next_look_in_s = (self.next_look > 0)
            .then(|| u64::from(self.next_look - 1).saturating_sub(EPOCH.elapsed().as_secs()));
        RecordView {
            state: self.state.as_ref().map(|s| s.name().to_string()),
            reason: self
                .state
                .as_ref()
                .map(|s| s.reason().to_string())
                .filter(|r| !r.is_empty()),
            failures: self.failures,
            last_error: self.last_error().map(|e| e.to_string()),
            next_look_in_s,
            write_pending: self.echo().is_some(),
            held_for_conflict: self.conflict.holding(std::time::Instant::now()),
        }
    }

    /// We wrote `desired` to `node` (as the cache had it).
    pub fn written(&mut self, node: &LiteNode, desired: &Desired) {
        // Without a resourceVersion there is no telling the cache caught up: record nothing.
        let echo = node.metadata.resource_version.clone().map(|rv| {
            Box::new(Echo {
                uid: node.metadata.uid.clone(),
                resource_version: rv,
                desired: hash_of(desired),
            })
        });
        if echo.is_some() || self.echo().is_some() {
            self.passing(|p| p.echo = echo);
        }
    }

    /// Is `node` (from the cache) still the version our write of `desired` was made against?
    /// Then the write is done and must not be repeated. Anything else forgets it.
    pub(crate) fn awaiting(&mut self, node: &LiteNode, desired: &Desired) -> bool {
        let Some(echo) = self.echo() else {
            return false;
        };
        if echo.uid == node.metadata.uid
            && Some(&echo.resource_version) == node.metadata.resource_version.as_ref()
            && echo.desired == hash_of(desired)
        {
            return true;
        }
        self.passing(|p| p.echo = None);
        false
    }

    /// Our last startup-gate write left the node at `resource_version`, showing `mark`.
    pub(crate) fn gate_written(&mut self, resource_version: Option<String>, mark: GateMark) {
        let write = resource_version.map(|resource_version| {
            Box::new(GateWrite {
                resource_version,
                at: std::time::Instant::now(),
                mark,
            })
        });
        if write.is_some() || self.passing.is_some() {
            self.passing(|p| p.gate_write = write);
        }
    }

    /// Is `node` (from the cache) older than our last gate write? Then deciding its taint or
    /// condition from it would repeat that write. It is not when it is the version our write
    /// returned, or a later one (another writer's, on top of ours) that `shows` our write's
    /// mark. While it is, returns how soon to look again; after [`GATE_ECHO`] it no longer is
    /// (a watch that re-listed may have skipped our version; someone may have undone it).
    pub(crate) fn gate_behind(
        &mut self,
        node: &LiteNode,
        shows: impl FnOnce(GateMark) -> bool,
    ) -> Option<std::time::Duration> {
        let w = self.passing.as_ref()?.gate_write.as_deref()?;
        let waited = w.at.elapsed();
        if node.metadata.resource_version.as_ref() == Some(&w.resource_version)
            || waited > GATE_ECHO
            || shows(w.mark)
        {
            self.passing(|p| p.gate_write = None);
            return None;
        }
        Some(GATE_RECHECK.min(GATE_ECHO.saturating_sub(waited)))
    }

    /// The fingerprint of the labels EC2's answer makes of the node (see `verified`).
    pub fn verified(&self) -> Option<u64> {
        self.verified.map(NonZeroU64::get)
    }

    /// Where the node stands (`None` before its first reconcile).
    pub fn state(&self) -> Option<&NodeState> {
        self.state.as_ref()
    }

    /// The cache shows the node as it is now: nothing is awaited.
    pub fn seen(&mut self) {
        if self.echo().is_some() {
            self.passing(|p| p.echo = None);
        }
    }
}

/// Has a node that stood at `previous` just fallen into `state` *and reason*? (Callers then say
/// so once, in an Event and a log line.) A failing node changing from one error to another has
/// not: one Event per spell of failing, except that refused credentials are told apart.
pub(crate) fn entering(previous: Option<&NodeState>, state: &NodeState) -> bool {
    let denied = |s: &NodeState| matches!(s, NodeState::Failing("ec2_unauthorized"));
    match previous {
        Some(p @ NodeState::Failing(_)) if matches!(state, NodeState::Failing(_)) => {
            denied(p) != denied(state)
        }
        Some(p) => p != state,
        None => true,
    }
}

/// What the publishers read of one node's record (see [`Nodes::standings`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Standing {
    pub state: Option<NodeState>,
    pub verified: Option<u64>,
}

/// Every node's record.
pub struct Nodes {
    records: Mutex<HashMap<Box<str>, NodeRecord>>,
    metrics: Arc<Metrics>,
    /// Counts changes of any node's state or verified fingerprint: the publishers read the
    /// records again when it moved (their view depends on them as well as on the labels).
    generation: std::sync::atomic::AtomicU64,
}

impl Nodes {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self {
            records: Mutex::default(),
            metrics,
            generation: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Changes with any node's state or verified fingerprint (see `generation`).
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn bump(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Record what EC2's answer makes of `node`: `Some(Some(fp))` an answer, `Some(None)` no
    /// instance to verify; `None` leaves what was recorded (EC2 failed or was late).
    pub(crate) fn set_verified(&self, node: &LiteNode, verified: Option<Option<u64>>) {
        let Some(verified) = verified else {
            return;
        };
        let verified = verified.and_then(NonZeroU64::new);
        if self.with(node, |r| std::mem::replace(&mut r.verified, verified)) != verified {
            self.bump();
        }
    }

    /// Forget what every node's answer vouched for (this replica stopped leading).
    pub(crate) fn forget_verified(&self) {
        for r in self.records().values_mut() {
            r.verified = None;
        }
        self.bump();
    }

    /// The standing of each of `names` (`None`: never reconciled), under one lock.
    pub(crate) fn standings<'a>(
        &self,
        names: impl Iterator<Item = &'a str>,
    ) -> Vec<Option<Standing>> {
        let records = self.records();
        names
            .map(|n| {
                records.get(n).map(|r| Standing {
                    state: r.state.clone(),
                    verified: r.verified.map(NonZeroU64::get),
                })
            })
            .collect()
    }

    fn records(&self) -> MutexGuard<'_, HashMap<Box<str>, NodeRecord>> {
        // A record is updated in place by small, total steps: a panic elsewhere cannot leave one
        // half-written.
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Work on `node`'s record (made on first use).
    pub fn with<R>(&self, node: &LiteNode, f: impl FnOnce(&mut NodeRecord) -> R) -> R {
        let mut records = self.records();
        let name = node.metadata.name.as_deref().unwrap_or_default();
        // Look up by reference: a name is allocated only for a node seen the first time.
        if let Some(r) = records.get_mut(name) {
            return f(r);
        }
        f(records.entry(name.into()).or_default())
    }

    /// Record where `node` stands (and move it between the state gauges).
    pub(crate) fn set_state(&self, node: &LiteNode, state: NodeState) {
        let previous = self.with(node, |r| r.state.replace(state.clone()));
        if previous.as_ref() != Some(&state) {
            self.bump();
        }
        self.metrics
            .node_state_changed(previous.as_ref(), Some(&state));
    }

    /// A node seen for the first time is pending until its first reconcile settles.
    pub(crate) fn pending_if_new(&self, node: &LiteNode) {
        if self.with(node, |r| r.state.is_none()) {
            self.set_state(node, NodeState::Pending);
        }
    }

    /// Does this version of `node` (with `relevant`, the hash of what can change a reconcile's
    /// outcome) differ from the last one the watch delivered? Heartbeats and image updates do
    /// not: they are filtered out before the controller. Kept in the node's record rather than
    /// in a map of its own (one name per node, forgotten in one place).
    pub fn changed(&self, node: &LiteNode, relevant: u64) -> bool {
        // The lowest bit set: never 0, kept in 8 bytes (one bit of a 64-bit hash is not missed).
        let relevant = NonZeroU64::new(relevant | 1);
        self.with(node, |r| {
            std::mem::replace(&mut r.relevant, relevant) != relevant
        })
    }

    /// Forget every node not in `live` (deleted): all it had in its record goes.
    pub fn retain<S: std::borrow::Borrow<str> + std::hash::Hash + Eq>(&self, live: &HashSet<S>) {
        let mut records = self.records();
        records.retain(|name, r| {
            let keep = live.contains(&**name);
            if !keep {
                self.metrics.node_state_changed(r.state.as_ref(), None);
            }
            keep
        });
    }

    /// The record of the node called `name`, as `explain` shows it.
    pub fn view(&self, name: &str) -> Option<RecordView> {
        self.records().get(name).map(NodeRecord::view)
    }

    /// `text` as an `Arc<str>`, the same allocation as the last error recorded when it reads the
    /// same.
    fn shared_error(text: String) -> std::sync::Arc<str> {
        static LAST: std::sync::Mutex<Option<std::sync::Arc<str>>> = std::sync::Mutex::new(None);
        let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
        match last.as_ref() {
            Some(l) if **l == *text => l.clone(),
            _ => {
                let new: std::sync::Arc<str> = text.into();
                *last = Some(new.clone());
                new
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.records().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One record per node lives in a hash table whose buckets hold it inline (131,072 buckets
    /// at 100,000 nodes): every 8 bytes here are 1 MiB there.
    #[test]
    fn a_node_record_stays_small() {
        let size = std::mem::size_of::<NodeRecord>();
        eprintln!("NodeRecord: {size} bytes");
        assert!(
            size <= 80,
            "NodeRecord is {size} bytes (was 80; 112 before issue 60)"
        );
        // Held by every failing node in an EC2 outage: musl's 48-byte class.
        let passing = std::mem::size_of::<Passing>();
        eprintln!("Passing: {passing} bytes");
        assert!(passing <= 32, "Passing is {passing} bytes (was 32)");
    }

    fn node(name: &str, rv: Option<&str>) -> LiteNode {
        crate::testing::nodes::node(name)
            .uid()
            .resource_version(rv)
            .build()
    }

    fn desired(leaf: &str) -> Desired {
        Desired {
            labels: [(
                "topology.k8s.aws/network-node-layer-3".to_string(),
                leaf.to_string(),
            )]
            .into(),
            ..Desired::default()
        }
    }

    #[test]
    fn a_write_is_awaited_only_while_the_cache_is_behind() {
        let nodes = Nodes::new(Arc::new(Metrics::default()));
        let a = node("a", Some("1"));
        nodes.with(&a, |r| r.written(&a, &desired("x")));
        let c = node("c", None);
        nodes.with(&c, |r| r.written(&c, &desired("x")));
        assert!(
            !nodes.with(&c, |r| r.awaiting(&c, &desired("x"))),
            "no resourceVersion, nothing to wait for"
        );
        assert!(nodes.with(&a, |r| r.awaiting(&a, &desired("x"))));
        assert!(
            !nodes.with(&a, |r| r.awaiting(&a, &desired("y"))),
            "other labels needed"
        );
        assert!(
            !nodes.with(&a, |r| r.awaiting(&a, &desired("x"))),
            "forgotten after that"
        );
        let b = node("b", Some("1"));
        nodes.with(&b, |r| r.written(&b, &desired("x")));
        let mut recreated = node("b", Some("1"));
        recreated.metadata.uid = Some("uid-b-2".into());
        assert!(
            !nodes.with(&recreated, |r| r.awaiting(&recreated, &desired("x"))),
            "another object of that name"
        );
    }

    #[test]
    fn gate_writes_are_awaited_until_the_cache_shows_them() {
        let nodes = Nodes::new(Arc::new(Metrics::default()));
        let a = node("a", Some("5"));
        let behind = |n: &LiteNode, shows: bool| nodes.with(n, |r| r.gate_behind(n, |_| shows));
        assert_eq!(behind(&a, false), None, "nothing written");
        nodes.with(&a, |r| {
            r.gate_written(Some("7".into()), GateMark::TaintReleased)
        });
        let wait = behind(&a, false);
        assert!(
            wait.is_some_and(|d| d <= GATE_RECHECK),
            "the cache holds version 5: look again soon ({wait:?})"
        );
        let between = node("a", Some("6"));
        assert!(behind(&between, false).is_some(), "nor 6");
        let caught_up = node("a", Some("7"));
        assert_eq!(behind(&caught_up, false), None);
        assert_eq!(behind(&a, false), None, "forgotten once seen");
    }

    /// Issue 26.2: the kubelet bumps the node right after our write; the cache then holds a
    /// later version than ours, which carries our write. It is not behind (on main it was,
    /// until 30 s had passed, and nothing looked again: the taint stayed up to the resync).
    #[test]
    fn a_later_version_that_shows_our_gate_write_is_not_behind() {
        let nodes = Nodes::new(Arc::new(Metrics::default()));
        let a = node("a", Some("5"));
        nodes.with(&a, |r| {
            r.gate_written(
                Some("7".into()),
                GateMark::Condition {
                    status: true,
                    reason: "Labelled",
                },
            )
        });
        let later = node("a", Some("8"));
        let mut asked = None;
        let behind = nodes.with(&later, |r| {
            r.gate_behind(&later, |m| {
                asked = Some(m);
                true
            })
        });
        assert_eq!(behind, None, "version 8 carries our condition");
        assert_eq!(
            asked,
            Some(GateMark::Condition {
                status: true,
                reason: "Labelled"
            })
        );
        assert_eq!(
            nodes.with(&a, |r| r.gate_behind(&a, |_| false)),
            None,
            "and the write is no longer awaited"
        );
    }

    #[test]
    fn a_deleted_node_takes_all_its_state_with_it() {
        let metrics = Arc::new(Metrics::default());
        metrics.set_leader(true);
        let nodes = Nodes::new(metrics.clone());
        let (a, b) = (node("a", Some("1")), node("b", Some("1")));
        nodes.pending_if_new(&a);
        nodes.set_state(&b, NodeState::Labelled);
        nodes.with(&b, |r| {
            r.failures = 3;
            r.written(&b, &desired("x"));
        });
        nodes.retain(&["a".to_string()].into());
        assert_eq!(nodes.tracked(), 1);
        let text = metrics.render();
        assert!(
            text.contains(r#"ec2_topology_labeler_nodes{state="labelled",reason=""} 0"#),
            "{text}"
        );
        assert!(
            text.contains(r#"ec2_topology_labeler_nodes{state="pending",reason=""} 1"#),
            "{text}"
        );
        assert_eq!(
            nodes.with(&b, |r| r.failures),
            0,
            "a node of that name starts afresh"
        );
    }
}

//! The node cache: every node as the controller keeps it ([`CachedNode`]: the fields a
//! reconcile, the publishers, `tree` and `explain` read, in as few allocations as we can), fed
//! by one watch of the Nodes. A reconcile gets its node whole, as a [`LiteNode`].
//!
//! kube-runtime's reflector keeps whatever type the watch reads, under a key that copies its
//! name, UID and resourceVersion again; its controller can only read from that. The node as
//! read from the API server ([`crate::node::WireNode`]) carries a whole `ObjectMeta`; the
//! cached node carries only what we read, its name once (the set is keyed by the node's own
//! name), and is built by [`crate::node::watch::prune`] before it is stored.
//!
//! As with the reflector, a relist (after the watch lost its place) fills a new set that
//! replaces the old one once complete, so readers never see a half-listed fleet. The first list
//! has no fleet to replace: its nodes are served as they come (reconciles start on its first
//! page), and [`NodeCache::is_ready`] says when it is whole (what needs the whole fleet waits
//! for that: housekeeping, the publishers, `/readyz`).
//!
//! Owns: the cached nodes and whether the first list is in. Never talks to the API server
//! (the watch feeding it does).

use std::{
    borrow::Borrow,
    collections::HashSet,
    hash::{Hash, Hasher},
    sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard},
};

use kube::runtime::watcher::Event;

use crate::node::{CachedNode, LiteNode, Sharing};

/// Nodes per page of every list of Nodes the controller makes (the watcher's initial list and
/// relists, the start-up scan for retired labels): a page is held whole before it is decoded.
pub(crate) const NODE_PAGE: u32 = 100;

/// Shards of the node cache: a node's is a hash of its name. The resync looks at one shard a
/// tick ([`crate::reconcile::resync`]: every node once a period, a shard at a time), which
/// visits a hundredth of the fleet instead of all of it each tick (100 times a period: the
/// walk over every cached node was 40 % of the controller's steady-state CPU at 10,000 nodes,
/// profiled).
pub(crate) const SHARDS: u64 = 100;

/// The shard (`0..SHARDS`) of the node called `name`.
pub(crate) fn shard(name: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    name.hash(&mut h);
    h.finish() % SHARDS
}

/// The cached nodes, in [`SHARDS`] sets by [`shard`].
#[derive(Debug)]
struct Shards(Vec<HashSet<ByName>>);

impl Default for Shards {
    fn default() -> Self {
        Self((0..SHARDS).map(|_| HashSet::new()).collect())
    }
}

impl Shards {
    /// The set `name` belongs in.
    fn of(&self, name: &str) -> Option<&HashSet<ByName>> {
        self.0.get(usize::try_from(shard(name)).ok()?)
    }

    fn of_mut(&mut self, name: &str) -> Option<&mut HashSet<ByName>> {
        self.0.get_mut(usize::try_from(shard(name)).ok()?)
    }

    fn get(&self, name: &str) -> Option<&ByName> {
        self.of(name)?.get(name.as_bytes())
    }

    fn take(&mut self, name: &str) -> Option<ByName> {
        self.of_mut(name)?.take(name.as_bytes())
    }

    fn replace(&mut self, node: ByName) -> Option<ByName> {
        self.of_mut(node.0.name())?.replace(node)
    }

    fn iter(&self) -> impl Iterator<Item = &ByName> {
        self.0.iter().flatten()
    }

    /// How many nodes shard `k` holds.
    fn shard_len(&self, k: u64) -> usize {
        usize::try_from(k)
            .ok()
            .and_then(|k| self.0.get(k))
            .map_or(0, HashSet::len)
    }

    /// The nodes of shard `k`.
    fn shard(&self, k: u64) -> impl Iterator<Item = &ByName> {
        usize::try_from(k)
            .ok()
            .and_then(|k| self.0.get(k))
            .into_iter()
            .flatten()
    }
}

/// A cached node, found in the set by its name (as bytes: read in place, not checked again as
/// text at every lookup).
#[derive(Debug, Clone)]
struct ByName(Arc<CachedNode>);

impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        self.0.name_bytes() == other.0.name_bytes()
    }
}

impl Eq for ByName {}

impl Hash for ByName {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name_bytes().hash(state);
    }
}

impl Borrow<[u8]> for ByName {
    fn borrow(&self) -> &[u8] {
        self.0.name_bytes()
    }
}

#[derive(Debug, Default)]
struct Shared {
    nodes: RwLock<Shards>,
    /// How many cached nodes name each instance in their providerID (by a hash of its ID):
    /// more than one, and all but the oldest are duplicates (see [`NodeCache::younger_duplicate`]).
    claims: std::sync::Mutex<std::collections::HashMap<u64, u32>>,
    ready: tokio::sync::watch::Sender<bool>,
    /// Counts what may have left the cache: a node deleted, a relist done (it may have dropped
    /// nodes), a node whose providerID changed (its instance left). What the controller keeps
    /// of gone nodes is looked for only when this moved (see `reconcile::housekeeping`).
    removals: std::sync::atomic::AtomicU64,
}

/// The hash of the instance a providerID names, if it names one.
fn instance_key(provider_id: &str) -> Option<u64> {
    let i = crate::provider_id::parse(provider_id).ok()?;
    let mut h = std::hash::DefaultHasher::new();
    i.instance_id.hash(&mut h);
    Some(h.finish())
}

/// The cache, for readers (cheap to clone).
#[derive(Debug, Clone, Default)]
pub struct NodeCache {
    shared: Arc<Shared>,
}

impl NodeCache {
    /// A cache and the writer that feeds it.
    pub fn new() -> (Self, Feeder) {
        let cache = Self::default();
        let feeder = Feeder {
            cache: cache.clone(),
            relist: None,
            sharing: Sharing::default(),
        };
        (cache, feeder)
    }

    fn read(&self) -> RwLockReadGuard<'_, Shards> {
        // A writer that panicked left a whole set (each write replaces or removes one entry).
        self.shared
            .nodes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Shards> {
        self.shared
            .nodes
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Moves whenever a node (or a node's instance) may have left the cache (see `removals`).
    pub(crate) fn removals(&self) -> u64 {
        self.shared
            .removals
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn removed(&self) {
        self.shared
            .removals
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The node called `name`, as last seen, whole.
    pub fn get(&self, name: &str) -> Option<Arc<LiteNode>> {
        let cached = self.read().get(name).map(|n| n.0.clone())?;
        Some(Arc::new(cached.expand()))
    }

    /// Every cached node, as last seen.
    pub fn state(&self) -> Vec<Arc<CachedNode>> {
        self.read().iter().map(|n| n.0.clone()).collect()
    }

    /// The names of every cached node.
    pub(crate) fn names(&self) -> Vec<Arc<str>> {
        self.read().iter().map(|n| Arc::from(n.0.name())).collect()
    }

    /// The names of the cached nodes of shard `k` (`0..SHARDS`; see [`shard`]).
    pub(crate) fn names_in_shard(&self, k: u64) -> Vec<Arc<str>> {
        let nodes = self.read();
        // Sized once (a hundredth of the fleet: grown by doubling, it was a tenth of the
        // steady state's allocator time in a profile at 10,000 nodes).
        let mut names = Vec::with_capacity(nodes.shard_len(k));
        names.extend(nodes.shard(k).map(|n| Arc::from(n.0.name())));
        names
    }

    fn claims(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, u32>> {
        // Counts changed one step at a time: whole after any panic.
        self.shared
            .claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A node naming the instance `key` left the set (`-1`) or came into it (`+1`).
    fn claim(&self, key: Option<u64>, step: i8) {
        let Some(key) = key else {
            return;
        };
        let mut claims = self.claims();
        let n = claims.entry(key).or_default();
        *n = if step > 0 {
            n.saturating_add(1)
        } else {
            n.saturating_sub(1)
        };
        if *n == 0 {
            claims.remove(&key);
        }
    }

    /// Count every node of the set anew (a list replaced it).
    fn recount(&self) {
        let mut counts = std::collections::HashMap::new();
        for n in self.read().iter() {
            if let Some(key) = instance_key(n.0.provider_id()) {
                *counts.entry(key).or_insert(0u32) += 1;
            }
        }
        *self.claims() = counts;
    }

    /// Whether another cached node names the instance `provider_id` names and is older than
    /// `name` (created earlier; the smaller name when created together): then `name` is a
    /// duplicate, which a hostile or broken registration makes, and is not labelled. Only a node
    /// whose instance is named more than once pays for the look through the cache.
    pub(crate) fn younger_duplicate(
        &self,
        name: &str,
        provider_id: &str,
        created: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    ) -> bool {
        let Some(key) = instance_key(provider_id) else {
            return false;
        };
        if self.claims().get(&key).is_none_or(|n| *n < 2) {
            return false;
        }
        let me = (created.map(|t| t.0), name);
        self.read().iter().any(|n| {
            n.0.name() != name
                && instance_key(n.0.provider_id()) == Some(key)
                && (n.0.created().map(|t| t.0), n.0.name()) < me
        })
    }

    /// Whether the first list is in.
    pub fn is_ready(&self) -> bool {
        *self.shared.ready.borrow()
    }

    /// Resolves once the first list is in (at once if it is).
    #[cfg(test)]
    pub(crate) async fn wait_until_ready(&self) {
        let mut rx = self.shared.ready.subscribe();
        // Only fails if the sender is gone, and it lives as long as `self`.
        let _ = rx.wait_for(|ready| *ready).await;
    }
}

/// Applies the watch's events to the cache.
#[derive(Debug)]
pub struct Feeder {
    cache: NodeCache,
    /// The set a relist is filling (it replaces the cache's when the relist is done).
    relist: Option<Shards>,
    /// What the cached nodes share.
    sharing: Sharing,
}

impl Feeder {
    /// Apply one watch event; returns the node it brought, if any (a deletion brings none: the
    /// node is gone from the cache, and what we kept about it goes with housekeeping).
    pub fn apply(&mut self, event: Event<LiteNode>) -> Option<Arc<LiteNode>> {
        match event {
            Event::Apply(mut node) => {
                node.share(&mut self.sharing);
                let cached = Arc::new(CachedNode::from(&node));
                self.replace_live(cached);
                Some(Arc::new(node))
            }
            Event::Delete(node) => {
                let gone = self.cache.write().take(node.name());
                if let Some(gone) = gone {
                    self.cache.claim(instance_key(gone.0.provider_id()), -1);
                    self.cache.removed();
                }
                None
            }
            Event::Init => {
                self.relist = Some(Shards::default());
                None
            }
            Event::InitApply(mut node) => {
                node.share(&mut self.sharing);
                let cached = Arc::new(CachedNode::from(&node));
                if !self.cache.is_ready() {
                    // The first list replaces nothing, so each node is served as it comes: the
                    // reconciles start on the first page instead of after the last (at 10,000
                    // nodes the list alone takes two seconds). The set is still replaced when
                    // the list is done, so that a first list that broke off and started again
                    // leaves no node it saw that is gone since.
                    self.replace_live(cached.clone());
                }
                self.relist
                    .get_or_insert_with(Shards::default)
                    .replace(ByName(cached));
                Some(Arc::new(node))
            }
            Event::InitDone => {
                if let Some(set) = self.relist.take() {
                    *self.cache.write() = set;
                    self.cache.recount();
                    self.cache.removed();
                }
                self.cache.shared.ready.send_replace(true);
                None
            }
        }
    }
}

/// `event` with its node (if any) made by `f`.
impl Feeder {
    /// Put `cached` in the set readers see, and count its instance (uncounting the version it
    /// replaces).
    fn replace_live(&self, cached: Arc<CachedNode>) {
        let key = instance_key(cached.provider_id());
        let old = self.cache.write().replace(ByName(cached));
        if let Some(old) = old {
            let old_key = instance_key(old.0.provider_id());
            if old_key != key {
                self.cache.removed();
            }
            self.cache.claim(old_key, -1);
        }
        self.cache.claim(key, 1);
    }
}

pub(crate) fn map_event<A, B>(event: Event<A>, mut f: impl FnMut(A) -> B) -> Event<B> {
    match event {
        Event::Apply(a) => Event::Apply(f(a)),
        Event::Delete(a) => Event::Delete(f(a)),
        Event::Init => Event::Init,
        Event::InitApply(a) => Event::InitApply(f(a)),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every cached node is in exactly one shard, its own: the shards together are the whole
    /// cache, as a resync visiting them one a tick needs.
    #[test]
    fn the_shards_partition_the_cache_by_name() {
        let (cache, mut feeder) = NodeCache::new();
        for k in 0..1_000 {
            let mut n = LiteNode::default();
            n.metadata.name = Some(format!("node-{k}"));
            feeder.apply(Event::Apply(n));
        }
        let mut seen = std::collections::HashSet::new();
        for k in 0..SHARDS {
            for name in cache.names_in_shard(k) {
                assert_eq!(shard(&name), k, "{name} in another's shard");
                assert!(seen.insert(name.to_string()), "{name} twice");
            }
        }
        assert_eq!(seen.len(), 1_000, "every node in a shard");
        assert_eq!(cache.names().len(), 1_000);
        assert!(cache.get("node-7").is_some(), "found through its shard");
    }

    fn node(name: &str, rv: &str) -> LiteNode {
        crate::testing::nodes::node(name)
            .resource_version(Some(rv))
            .build()
    }

    /// Housekeeping looks for what the controller keeps of gone nodes only when the count of
    /// removals moved: it must move with every way a node (or its instance) leaves, and not
    /// with a change that leaves it where it is.
    #[test]
    fn removals_move_when_a_node_or_its_instance_may_have_left_and_only_then() {
        let (cache, mut feeder) = NodeCache::new();
        let with_instance = |name: &str, rv: &str, id: &str| {
            crate::testing::nodes::node(name)
                .resource_version(Some(rv))
                .provider_id(&format!("aws:///us-west-2a/{id}"))
                .build()
        };
        feeder.apply(Event::Apply(with_instance("a", "1", "i-0123456789abcdef0")));
        feeder.apply(Event::Apply(with_instance("b", "1", "i-0123456789abcdef1")));
        let start = cache.removals();
        feeder.apply(Event::Apply(with_instance("a", "2", "i-0123456789abcdef0")));
        assert_eq!(cache.removals(), start, "a change that keeps its instance");
        feeder.apply(Event::Apply(with_instance("a", "3", "i-0123456789abcdef9")));
        assert_eq!(cache.removals(), start + 1, "its instance changed");
        feeder.apply(Event::Delete(node("unknown", "1")));
        assert_eq!(
            cache.removals(),
            start + 1,
            "nothing was cached under that name"
        );
        feeder.apply(Event::Delete(node("b", "2")));
        assert_eq!(cache.removals(), start + 2, "deleted");
        feeder.apply(Event::Init);
        feeder.apply(Event::InitApply(with_instance(
            "a",
            "3",
            "i-0123456789abcdef9",
        )));
        feeder.apply(Event::InitDone);
        assert_eq!(
            cache.removals(),
            start + 3,
            "a relist may have dropped nodes"
        );
    }

    #[tokio::test]
    async fn a_relist_replaces_the_set_when_it_is_complete_and_marks_the_cache_ready() {
        let (cache, mut feeder) = NodeCache::new();
        assert!(!cache.is_ready());
        feeder.apply(Event::Init);
        assert!(feeder.apply(Event::InitApply(node("a", "1"))).is_some());
        assert!(
            cache.get("a").is_some(),
            "the first list's nodes are served as they come"
        );
        assert!(!cache.is_ready(), "but the cache is not whole yet");
        // The first list broke off and started again: `gone` was deleted meanwhile.
        feeder.apply(Event::InitApply(node("gone", "1")));
        feeder.apply(Event::Init);
        feeder.apply(Event::InitApply(node("a", "1")));
        feeder.apply(Event::InitApply(node("b", "1")));
        feeder.apply(Event::InitDone);
        assert!(cache.is_ready());
        assert!(
            cache.get("gone").is_none(),
            "the set the list made replaces what the broken one left"
        );
        cache.wait_until_ready().await;
        assert_eq!(cache.state().len(), 2);
        // A change replaces the node; a deletion removes it.
        feeder.apply(Event::Apply(node("a", "2")));
        assert_eq!(
            cache
                .get("a")
                .and_then(|n| n.metadata.resource_version.clone()),
            Some("2".into())
        );
        assert!(feeder.apply(Event::Delete(node("b", "2"))).is_none());
        assert!(cache.get("b").is_none());
        // A relist that no longer has `a` drops it once done.
        feeder.apply(Event::Init);
        feeder.apply(Event::InitApply(node("c", "3")));
        assert!(
            cache.get("a").is_some(),
            "readers see the old set meanwhile"
        );
        assert!(cache.get("c").is_none(), "and not a relist's half");
        feeder.apply(Event::InitDone);
        assert!(cache.get("a").is_none());
        assert_eq!(cache.state().len(), 1);
    }

    /// Nodes with the same labels (as the cache keeps them) share them; a changed node gets
    /// its own again.
    #[test]
    fn nodes_with_the_same_labels_share_them() {
        let (cache, mut feeder) = NodeCache::new();
        let labelled = |name: &str, leaf: &str| {
            let mut n = node(name, "1");
            n.metadata.labels = Some(
                [("topology.k8s.aws/network-node-layer-3", leaf)]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            n.pack_labels();
            n
        };
        feeder.apply(Event::Init);
        for i in 0..10 {
            feeder.apply(Event::InitApply(labelled(&format!("a{i}"), "nn-1")));
        }
        feeder.apply(Event::InitApply(labelled("b", "nn-2")));
        feeder.apply(Event::InitDone);
        assert_eq!(feeder.sharing.len().0, 2);
        let (a0, a9, b) = (
            cache.get("a0").unwrap(),
            cache.get("a9").unwrap(),
            cache.get("b").unwrap(),
        );
        assert!(
            a0.packed_labels()
                .unwrap()
                .shares(a9.packed_labels().unwrap())
        );
        assert!(
            !a0.packed_labels()
                .unwrap()
                .shares(b.packed_labels().unwrap())
        );
        assert_eq!(
            b.label("topology.k8s.aws/network-node-layer-3").as_deref(),
            Some("nn-2")
        );
        // a0 moved to nn-2: it shares b's labels now.
        feeder.apply(Event::Apply(labelled("a0", "nn-2")));
        let a0 = cache.get("a0").unwrap();
        assert!(
            a0.packed_labels()
                .unwrap()
                .shares(b.packed_labels().unwrap())
        );
    }

    /// Issue 55.4: two nodes naming one instance (a duplicate registration): the younger is the
    /// duplicate, whatever zone its providerID claims; the older never is. When the older goes,
    /// the younger is the only one; a relist counts the same.
    #[test]
    fn the_younger_of_two_nodes_naming_one_instance_is_the_duplicate() {
        use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
        let at = |s: i64| Some(Time(Timestamp::from_second(s).expect("a time")));
        let ec2 = |name: &str, pid: &str, created: i64| {
            let mut n = node(name, "1");
            n.spec.provider_id = Some(pid.into());
            n.metadata.creation_timestamp = at(created);
            n
        };
        let (cache, mut feeder) = NodeCache::new();
        let real = ec2("real", "aws:///us-west-2a/i-0123456789abcdef0", 100);
        let copy = ec2("copy", "aws:///zz-north-1a/i-0123456789abcdef0", 200);
        let other = ec2("other", "aws:///us-west-2a/i-0123456789abcdef1", 300);
        for n in [&real, &copy, &other] {
            feeder.apply(Event::Apply(n.clone()));
        }
        let dup = |n: &LiteNode| {
            cache.younger_duplicate(
                n.name(),
                n.provider_id(),
                n.metadata.creation_timestamp.as_ref(),
            )
        };
        assert!(dup(&copy), "the younger one");
        assert!(!dup(&real) && !dup(&other));
        // The same node applied again is not a duplicate of itself.
        feeder.apply(Event::Apply(real.clone()));
        assert!(!dup(&real) && dup(&copy));
        // A relist counts the same.
        feeder.apply(Event::Init);
        for n in [&real, &copy, &other] {
            feeder.apply(Event::InitApply(n.clone()));
        }
        feeder.apply(Event::InitDone);
        assert!(dup(&copy) && !dup(&real));
        // The older one is deleted: the copy is the only one now.
        feeder.apply(Event::Delete(real.clone()));
        assert!(!dup(&copy));
        // The copy's providerID changes to another instance: nothing is shared any more.
        let moved = ec2("copy", "aws:///us-west-2a/i-0123456789abcdef2", 200);
        feeder.apply(Event::Apply(real.clone()));
        feeder.apply(Event::Apply(moved.clone()));
        assert!(!dup(&moved) && !dup(&real));
    }
}

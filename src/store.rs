//! The node cache: every node as the controller keeps it ([`CachedNode`]: the fields a
//! reconcile, the publishers, `tree` and `explain` read, in as few allocations as we can), fed
//! by one watch of the Nodes. A reconcile gets its node whole, as a [`LiteNode`].
//!
//! kube-runtime's reflector keeps whatever type the watch reads, under a key that copies its
//! name, UID and resourceVersion again; its controller can only read from that. The node as
//! read from the API server ([`crate::node::WireNode`]) carries a whole `ObjectMeta`; the
//! cached node carries only what we read, its name once (the set is keyed by the node's own
//! name), and is built by [`crate::watch::prune`] before it is stored.
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
pub const NODE_PAGE: u32 = 100;

/// A cached node, found in the set by its name.
#[derive(Debug, Clone)]
struct ByName(Arc<CachedNode>);

impl PartialEq for ByName {
    fn eq(&self, other: &Self) -> bool {
        self.0.name() == other.0.name()
    }
}

impl Eq for ByName {}

impl Hash for ByName {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.name().hash(state);
    }
}

impl Borrow<str> for ByName {
    fn borrow(&self) -> &str {
        self.0.name()
    }
}

#[derive(Debug, Default)]
struct Shared {
    nodes: RwLock<HashSet<ByName>>,
    ready: tokio::sync::watch::Sender<bool>,
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

    fn read(&self) -> RwLockReadGuard<'_, HashSet<ByName>> {
        // A writer that panicked left a whole set (each write replaces or removes one entry).
        self.shared
            .nodes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashSet<ByName>> {
        self.shared
            .nodes
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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

    /// Whether the first list is in.
    pub fn is_ready(&self) -> bool {
        *self.shared.ready.borrow()
    }

    /// Resolves once the first list is in (at once if it is).
    pub async fn wait_until_ready(&self) {
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
    relist: Option<HashSet<ByName>>,
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
                self.cache.write().replace(ByName(cached));
                Some(Arc::new(node))
            }
            Event::Delete(node) => {
                self.cache.write().remove(node.name());
                None
            }
            Event::Init => {
                self.relist = Some(HashSet::new());
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
                    self.cache.write().replace(ByName(cached.clone()));
                }
                self.relist
                    .get_or_insert_with(HashSet::new)
                    .replace(ByName(cached));
                Some(Arc::new(node))
            }
            Event::InitDone => {
                if let Some(set) = self.relist.take() {
                    *self.cache.write() = set;
                }
                self.cache.shared.ready.send_replace(true);
                None
            }
        }
    }
}

/// `event` with its node (if any) made by `f`.
pub fn map_event<A, B>(event: Event<A>, mut f: impl FnMut(A) -> B) -> Event<B> {
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

    fn node(name: &str, rv: &str) -> LiteNode {
        let mut n = LiteNode::default();
        n.metadata.name = Some(name.into());
        n.metadata.resource_version = Some(rv.into());
        n
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
}

//! The NVLink domain as EC2 says it (the capacity block: one UltraServer) against the one the
//! GPUs say they are in: NVIDIA's GPU Feature Discovery labels each node with its NVLink clique
//! (`nvidia.com/gpu.clique`, `<ClusterUUID>.<CliqueID>`) once the fabric manager reports the
//! fabric complete. A capacity block is meant to be one clique; when it holds several (an x72
//! split into two x36) or a clique spans capacity blocks, a scheduler placing a gang "inside one
//! UltraServer" by our level can put it across NVLink domains. Each mismatch is counted
//! (`ultraserver_clique_mismatches{kind}`) and told once, in an Event on each of its nodes.
//!
//! Only published nodes are compared (their capacity block is what an EC2 answer vouches for);
//! a node without a clique label (no GPU Feature Discovery, or the fabric not complete yet) is
//! left out of the comparison, never a mismatch.
//!
//! Owns: that comparison. Never writes anything but Events.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::{Api, Client};
use tracing::warn;

use super::Publisher;
use crate::{
    admin::events::{Events, Reason},
    labels::LabelScheme,
    metrics::Metrics,
    tree::NodeView,
};

pub(crate) use crate::labels::CLIQUE_LABEL;

/// One way the capacity blocks and the cliques disagree.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Mismatch {
    /// One capacity block, several cliques: nodes per clique.
    BlockHoldsCliques {
        block: String,
        cliques: BTreeMap<String, BTreeSet<String>>,
    },
    /// One clique over several capacity blocks: nodes per block.
    CliqueSpansBlocks {
        clique: String,
        blocks: BTreeMap<String, BTreeSet<String>>,
    },
}

impl Mismatch {
    /// The metric's `kind`.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Mismatch::BlockHoldsCliques { .. } => "block_holds_cliques",
            Mismatch::CliqueSpansBlocks { .. } => "clique_spans_blocks",
        }
    }

    /// What it is about (`block_holds_cliques:<block>`, `clique_spans_blocks:<clique>`): the
    /// same mismatch whatever nodes it holds now.
    pub(crate) fn key(&self) -> String {
        match self {
            Mismatch::BlockHoldsCliques { block, .. } => format!("{}:{block}", self.kind()),
            Mismatch::CliqueSpansBlocks { clique, .. } => format!("{}:{clique}", self.kind()),
        }
    }

    /// Its nodes.
    pub(crate) fn nodes(&self) -> BTreeSet<&str> {
        let parts = match self {
            Mismatch::BlockHoldsCliques { cliques, .. } => cliques,
            Mismatch::CliqueSpansBlocks { blocks, .. } => blocks,
        };
        parts.values().flatten().map(String::as_str).collect()
    }

    /// What an operator reads about it, on node `node`.
    pub(crate) fn note(&self, node: &str) -> String {
        let parts = |m: &BTreeMap<String, BTreeSet<String>>| {
            m.iter()
                .map(|(k, nodes)| {
                    let here = if nodes.contains(node) {
                        ", this node"
                    } else {
                        ""
                    };
                    format!("{k} ({} nodes{here})", nodes.len())
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Mismatch::BlockHoldsCliques { block, cliques } => format!(
                "capacity block {block} (one UltraServer to EC2) holds {} NVLink cliques ({CLIQUE_LABEL}): {}; a gang placed inside this UltraServer can span NVLink domains",
                cliques.len(),
                parts(cliques)
            ),
            Mismatch::CliqueSpansBlocks { clique, blocks } => format!(
                "NVLink clique {clique} ({CLIQUE_LABEL}) spans {} capacity blocks: {}",
                blocks.len(),
                parts(blocks)
            ),
        }
    }
}

/// Every mismatch between the capacity blocks and the cliques of `nodes`, in a stable order.
pub(crate) fn mismatches(scheme: &LabelScheme, nodes: &[NodeView]) -> Vec<Mismatch> {
    let Some(block_key) = scheme.capacity_block_key.as_deref() else {
        return Vec::new();
    };
    let mut by_block: BTreeMap<&str, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let mut by_clique: BTreeMap<&str, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for n in nodes {
        let (Some(block), Some(clique)) = (n.labels.get(block_key), n.labels.get(CLIQUE_LABEL))
        else {
            continue;
        };
        if block.is_empty() || clique.is_empty() {
            continue;
        }
        by_block
            .entry(block)
            .or_default()
            .entry(clique.clone())
            .or_default()
            .insert(n.name.clone());
        by_clique
            .entry(clique)
            .or_default()
            .entry(block.clone())
            .or_default()
            .insert(n.name.clone());
    }
    let mut out: Vec<Mismatch> = by_block
        .into_iter()
        .filter(|(_, c)| c.len() > 1)
        .map(|(block, cliques)| Mismatch::BlockHoldsCliques {
            block: block.to_string(),
            cliques,
        })
        .collect();
    out.extend(
        by_clique
            .into_iter()
            .filter(|(_, b)| b.len() > 1)
            .map(|(clique, blocks)| Mismatch::CliqueSpansBlocks {
                clique: clique.to_string(),
                blocks,
            }),
    );
    out
}

/// (mismatch key, node) pairs told.
pub(crate) type Told = BTreeSet<(String, String)>;

/// The nodes of `found` to tell about each mismatch (a node is told once per mismatch, by
/// [`Mismatch::key`]: a mismatch that gains a node tells that node alone), and what is told
/// after that (mismatches gone are forgotten: one that comes back is told again).
pub(crate) fn due<'a>(
    found: &'a BTreeSet<Mismatch>,
    told: &Told,
) -> (Vec<(&'a Mismatch, &'a str)>, Told) {
    let mut tell = Vec::new();
    let mut now = BTreeSet::new();
    for m in found {
        let key = m.key();
        for node in m.nodes() {
            let k = (key.clone(), node.to_string());
            if !told.contains(&k) {
                tell.push((m, node));
            }
            now.insert(k);
        }
    }
    (tell, now)
}

/// Compares them whenever a node's labels change; publishes nothing but the metric and Events.
pub(crate) struct CliqueCheck {
    client: Client,
    scheme: LabelScheme,
    metrics: Arc<Metrics>,
    events: Events,
    /// (mismatch key, node) told so far (see [`due`]).
    told: Told,
    /// The nodes as last compared still stand (nothing to do until a label changes).
    checked: bool,
}

impl CliqueCheck {
    pub(crate) fn new(
        client: Client,
        scheme: LabelScheme,
        metrics: Arc<Metrics>,
        events: Events,
    ) -> Self {
        metrics.clique_mismatches(0, 0);
        Self {
            client,
            scheme,
            metrics,
            events,
            told: BTreeSet::new(),
            checked: false,
        }
    }

    /// The Event's object: the Node with its UID (`kubectl describe node` matches Events by
    /// UID). Read when a mismatch is new (rare), not kept for every node.
    async fn node_ref(&self, name: &str) -> Option<ObjectReference> {
        match Api::<Node>::all(self.client.clone())
            .get_metadata_opt(name)
            .await
        {
            Ok(Some(m)) => Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(name.to_string()),
                uid: m.metadata.uid,
                ..Default::default()
            }),
            Ok(None) => None,
            Err(e) => {
                warn!(node = name, error = %e, "cannot read the node to record an NVLink clique Event on it");
                None
            }
        }
    }
}

impl Publisher for CliqueCheck {
    fn name(&self) -> &'static str {
        "nvlink-cliques"
    }

    fn needs_nodes(&self) -> bool {
        true
    }

    fn publish<'a>(&'a mut self, nodes: &'a [NodeView]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let found: BTreeSet<Mismatch> = mismatches(&self.scheme, nodes).into_iter().collect();
            let count = |kind: &str| found.iter().filter(|m| m.kind() == kind).count();
            self.metrics
                .clique_mismatches(count("block_holds_cliques"), count("clique_spans_blocks"));
            let (tell, told) = due(&found, &self.told);
            let mut logged = BTreeSet::new();
            for (m, node) in tell {
                if logged.insert(m.key()) {
                    warn!(mismatch = %m.note(""), "the capacity blocks and the NVLink cliques disagree");
                }
                if let Some(r) = self.node_ref(node).await {
                    self.events.publish(
                        Reason::NvlinkCliqueMismatch,
                        "CompareNvlinkCliques",
                        &m.note(node),
                        r,
                    );
                }
            }
            self.told = told;
            self.checked = true;
        })
    }

    fn fresh(&self) -> bool {
        self.checked
    }

    /// A new leader tells each mismatch it finds again (the Events are its own).
    fn reset(&mut self) {
        self.told.clear();
        self.checked = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, block: Option<&str>, clique: Option<&str>) -> NodeView {
        let s = LabelScheme::default();
        let mut v = NodeView::labelled(name, &s, &["nn-s", "nn-a", "nn-l"]);
        if let (Some(k), Some(b)) = (&s.capacity_block_key, block) {
            v.labels.insert(k.clone(), b.into());
        }
        if let Some(c) = clique {
            v.labels.insert(CLIQUE_LABEL.into(), c.into());
        }
        v
    }

    /// An x72 split in two (block A, cliques u.1 and u.2), a clique over two blocks (u.3 in B
    /// and C), an agreeing block (D), and nodes without a clique or a block: exactly the two
    /// mismatches, with their nodes; nothing without a capacity block label.
    #[test]
    fn a_block_of_two_cliques_and_a_clique_over_two_blocks_are_found() {
        let nodes = vec![
            node("a1", Some("cr-a"), Some("u.1")),
            node("a2", Some("cr-a"), Some("u.1")),
            node("a3", Some("cr-a"), Some("u.2")),
            node("b1", Some("cr-b"), Some("u.3")),
            node("c1", Some("cr-c"), Some("u.3")),
            node("d1", Some("cr-d"), Some("u.4")),
            node("d2", Some("cr-d"), Some("u.4")),
            node("a4", Some("cr-a"), None),
            node("x1", None, Some("u.1")),
            node("e1", Some(""), Some("u.5")),
        ];
        let found = mismatches(&LabelScheme::default(), &nodes);
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(
            found,
            vec![
                Mismatch::BlockHoldsCliques {
                    block: "cr-a".into(),
                    cliques: BTreeMap::from([
                        ("u.1".into(), set(&["a1", "a2"])),
                        ("u.2".into(), set(&["a3"])),
                    ]),
                },
                Mismatch::CliqueSpansBlocks {
                    clique: "u.3".into(),
                    blocks: BTreeMap::from([
                        ("cr-b".into(), set(&["b1"])),
                        ("cr-c".into(), set(&["c1"])),
                    ]),
                },
            ]
        );
        assert_eq!(found[0].nodes(), BTreeSet::from(["a1", "a2", "a3"]));
        assert_eq!(
            found[0].note("a3"),
            "capacity block cr-a (one UltraServer to EC2) holds 2 NVLink cliques (nvidia.com/gpu.clique): u.1 (2 nodes), u.2 (1 nodes, this node); a gang placed inside this UltraServer can span NVLink domains"
        );
        let no_block = LabelScheme {
            capacity_block_key: None,
            ..LabelScheme::default()
        };
        assert!(mismatches(&no_block, &nodes).is_empty());
    }
    /// A mismatch that gains a node tells that node alone; one that goes and comes back is told
    /// again.
    #[test]
    fn a_node_is_told_once_per_mismatch() {
        let found = |nodes: &[NodeView]| -> BTreeSet<Mismatch> {
            mismatches(&LabelScheme::default(), nodes)
                .into_iter()
                .collect()
        };
        let two = vec![
            node("a1", Some("cr-a"), Some("u.1")),
            node("a2", Some("cr-a"), Some("u.2")),
        ];
        let told = BTreeSet::new();
        let first = found(&two);
        let (tell, told) = due(&first, &told);
        let names =
            |t: &[(&Mismatch, &str)]| t.iter().map(|(_, n)| n.to_string()).collect::<Vec<_>>();
        assert_eq!(names(&tell), ["a1", "a2"]);
        let mut three = two.clone();
        three.push(node("a3", Some("cr-a"), Some("u.3")));
        let second = found(&three);
        let (tell, told) = due(&second, &told);
        assert_eq!(
            names(&tell),
            ["a3"],
            "only the node that joined the mismatch"
        );
        let none = found(&[]);
        let (tell, told) = due(&none, &told);
        assert!(tell.is_empty() && told.is_empty());
        let (tell, _) = due(&first, &told);
        assert_eq!(names(&tell), ["a1", "a2"], "back again: told again");
    }
}

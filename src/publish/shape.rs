//! UltraServer shape (`--ultraserver-shape`, off by default): every
//! `--ultraserver-shape-interval` (and every minute for a block it has not asked about yet: a
//! node that joins is labelled within about a minute), the leader asks EC2 about each capacity
//! block (UltraServer) a verified node is in — `DescribeCapacityBlocks` (its UltraServer type and end date) and
//! `DescribeCapacityBlockStatus` (its instances, `totalCapacity`), paced by the limiter every EC2
//! call shares — and keeps on each member node:
//!
//! - the label [`TYPE_KEY`]: the UltraServer type (`u-p6e-gb200x72`, `u-trn2x64`), to select
//!   on;
//! - the label [`SIZE_KEY`]: the capacity block's instances, available or not (what Slurm's
//!   block topology takes as its base block size in switches-only mode, rather than the fewest
//!   nodes any block has joined with);
//! - the annotation [`END_KEY`]: when the block ends (RFC 3339; EC2 terminates its instances
//!   then).
//!
//! A block EC2 leaves out of its answer, or a call that fails, changes nothing on its nodes
//! (what EC2 cannot tell is never taken for "no type"); a value EC2 no longer gives (a block
//! without a type) is removed. The size stays as it was when only the status call failed.
//!
//! The keys are written by one server-side apply per node that must change, under the field
//! manager [`MANAGER`] (not the reconciler's: its applies and its start-up retirement never
//! touch these keys, and these writes never touch the topology labels). A key the apply gives up
//! that another field manager co-owns stays; that node is not written again until what EC2 says
//! or what the node carries changes ([`Settled`]). A block EC2 leaves out of its answer is asked
//! about again with the next full round, not every minute.
//!
//! Owns: those three keys. Never writes anything else; never acts unless this replica leads.

use crate::bounds::{Bound, DAY, secs};
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use clap::Args;
use kube::api::{Patch, PatchParams};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{
    duration::HumanDuration,
    lookup::{
        capacity_blocks::{Found, Shape},
        ec2::AwsTopology,
    },
    node::CachedNode,
    reconcile::Context,
};

pub use crate::labels::{
    CAPACITY_BLOCK_END_KEY as END_KEY, CAPACITY_BLOCK_SIZE_KEY as SIZE_KEY,
    ULTRASERVER_TYPE_KEY as TYPE_KEY,
};
/// The field manager of these keys.
pub(crate) const MANAGER: &str = "ec2-topology-labeler-ultraserver-shape";

/// `--ultraserver-shape-interval`'s range.
pub(crate) const ULTRASERVER_SHAPE_INTERVAL_RANGE: Bound =
    Bound::duration("ultraserver-shape-interval", secs(10), secs(DAY));

/// UltraServer shape, from EC2.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ShapeArgs {
    /// Label each node of a capacity block (UltraServer) with its UltraServer type
    /// (`ec2-topology-labeler.io/ultraserver-type`) and its instances
    /// (`ec2-topology-labeler.io/capacity-block-size`, Slurm's base block size with Slinky), and
    /// annotate when it ends (`ec2-topology-labeler.io/capacity-block-end`). Leader only. Needs
    /// `ec2:DescribeCapacityBlocks` and `ec2:DescribeCapacityBlockStatus`.
    #[arg(long, env = "LABELER_ULTRASERVER_SHAPE", default_value_t = false, action = clap::ArgAction::Set)]
    #[serde(default)]
    pub(crate) ultraserver_shape: bool,
    /// How often the leader asks (two calls per region for every 100 capacity blocks; a
    /// block's shape changes only when it is extended).
    #[arg(long, value_parser = ULTRASERVER_SHAPE_INTERVAL_RANGE.durations(), env = "LABELER_ULTRASERVER_SHAPE_INTERVAL", default_value = "10m")]
    pub(crate) ultraserver_shape_interval: HumanDuration,
}

/// The shape keys a node should carry: labels and the annotation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl Wanted {
    /// What `node` (as a write returned it) carries.
    pub(crate) fn of_lite(node: &crate::node::LiteNode) -> Self {
        let mut out = Self::default();
        for key in [TYPE_KEY, SIZE_KEY] {
            if let Some(v) = node.label(key) {
                out.labels.insert(key.into(), v);
            }
        }
        if let Some(v) = node.annotation(END_KEY) {
            out.annotations.insert(END_KEY.into(), v.into_owned());
        }
        out
    }

    /// What `node` carries now.
    pub fn of(node: &CachedNode) -> Self {
        let mut out = Self::default();
        for key in [TYPE_KEY, SIZE_KEY] {
            if let Some(v) = node.label(key) {
                out.labels.insert(key.into(), v);
            }
        }
        if let Some(v) = node.annotation(END_KEY) {
            out.annotations.insert(END_KEY.into(), v);
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// Whether `v` is a valid label value (63 characters at most, alphanumeric at both ends, `-`,
/// `_` and `.` between).
fn label_value(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// What a member of a block EC2 described should carry: the type and end from `shape`, the size
/// from `capacity` (or, when the status call could not tell, as `current` has it).
pub fn wanted(shape: &Shape, capacity: Option<u32>, current: &Wanted) -> Wanted {
    let mut out = Wanted::default();
    if let Some(t) = shape.ultraserver_type.as_deref().filter(|t| label_value(t)) {
        out.labels.insert(TYPE_KEY.into(), t.into());
    }
    match capacity {
        Some(n) => {
            out.labels.insert(SIZE_KEY.into(), n.to_string());
        }
        None => {
            if let Some(v) = current.labels.get(SIZE_KEY) {
                out.labels.insert(SIZE_KEY.into(), v.clone());
            }
        }
    }
    if let Some(end) = &shape.end {
        out.annotations.insert(END_KEY.into(), end.clone());
    }
    out
}

/// One member: its name, block, what it carries now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub uid: Option<String>,
    pub block: String,
    pub current: Wanted,
}

/// Nodes where our last apply of a shape left the node otherwise (a key we gave up that another
/// field manager co-owns stays): node → (what we applied, what the API server left). Not written
/// again while both still hold.
pub type Settled = HashMap<String, (Wanted, Wanted)>;

/// What to write, by node: only members of a block EC2 described (`known`) whose keys must
/// change, and not what an apply already settled as far as it can.
pub fn plan(
    members: &[Member],
    known: &Known,
    settled: &Settled,
) -> Vec<(String, Option<String>, Wanted)> {
    members
        .iter()
        .filter_map(|m| {
            let (shape, size) = known.get(&m.block)?;
            let w = wanted(shape, *size, &m.current);
            let done = settled
                .get(&m.name)
                .is_some_and(|(applied, left)| *applied == w && *left == m.current);
            (w != m.current && !done).then(|| (m.name.clone(), m.uid.clone(), w))
        })
        .collect()
}

/// The apply of `wanted`, whole (keys left out are given up).
pub(crate) fn apply_body(name: &str, uid: Option<&str>, wanted: &Wanted) -> serde_json::Value {
    crate::node::apply_body(name, uid, None, &wanted.labels, &wanted.annotations)
}

/// What the leader knows of each block from EC2's last answers: its shape and, when the status
/// call answered for it, its instances.
pub(crate) type Known = BTreeMap<String, (Shape, Option<u32>)>;

/// `known` after a round that asked about `asked`: each block EC2 described takes its new
/// answer (the size it had when only the status call failed for it); on a full round a block
/// EC2 left out is forgotten (its nodes then keep what they carry), one whose request failed is
/// kept as it was.
pub fn merge(
    known: &mut Known,
    asked: &[String],
    shapes: BTreeMap<String, Shape>,
    capacities: &BTreeMap<String, u32>,
    failed: &BTreeSet<String>,
) {
    for id in asked {
        match shapes.get(id) {
            Some(shape) => {
                let size = capacities
                    .get(id)
                    .copied()
                    .or_else(|| known.get(id).and_then(|(_, n)| *n));
                known.insert(id.clone(), (shape.clone(), size));
            }
            None if failed.contains(id) => {}
            None => {
                known.remove(id);
            }
        }
    }
}

/// How often the leader looks for members of blocks it has not asked about yet (a node that
/// joins gets its shape within about this, not a whole `--ultraserver-shape-interval` later).
const NEW_BLOCKS_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// While this replica leads and its cache is whole: every `--ultraserver-shape-interval` ask
/// about every block, and every minute about blocks not asked about yet; write what must change.
pub async fn run(
    reader: crate::node::store::NodeCache,
    ctx: Arc<Context>,
    synced: Arc<AtomicBool>,
    ec2: Arc<AwsTopology>,
    args: ShapeArgs,
) {
    let every = args.ultraserver_shape_interval.0;
    let mut tick = tokio::time::interval(every.min(NEW_BLOCKS_EVERY));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let params = PatchParams::apply(MANAGER).force();
    let mut known = Known::new();
    let mut last_full: Option<tokio::time::Instant> = None;
    // Blocks asked about since the last full round (one EC2 leaves out is not asked again
    // every minute, only with the next full round).
    let mut asked: BTreeSet<String> = BTreeSet::new();
    let mut settled = Settled::new();
    loop {
        // The tick's scheduled instant: full rounds keep to whole intervals, whatever a round's
        // own calls took.
        let at = tick.tick().await;
        if !ctx.leader.is_leader() {
            // A new term starts from EC2's answers, not from what a former term knew.
            known.clear();
            asked.clear();
            settled.clear();
            last_full = None;
            continue;
        }
        if !synced.load(Ordering::SeqCst) {
            continue;
        }
        let cache = reader.state();
        let selection = super::trusted::select(&ctx.scheme, cache.clone(), &ctx.records);
        let found = super::interconnect::members(&ctx, &selection.views, &cache);
        drop(selection);
        if found.is_empty() {
            continue;
        }
        let full = last_full.is_none_or(|t| at.duration_since(t) >= every);
        let mut by_region: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for m in &found {
            if let Some(region) = &m.region
                && (full || !(known.contains_key(&m.block) || asked.contains(&m.block)))
            {
                by_region.entry(region).or_default().insert(&m.block);
            }
        }
        if full {
            last_full = Some(at);
            asked.clear();
            // Members that left: their settled writes go too.
            let names: BTreeSet<&str> = found.iter().map(|m| m.name.as_str()).collect();
            settled.retain(|n, _| names.contains(n.as_str()));
        }
        for (region, blocks) in &by_region {
            let ids: Vec<String> = blocks.iter().map(|b| b.to_string()).collect();
            asked.extend(ids.iter().cloned());
            let described = ec2.shapes(region, &ids).await;
            let mut failed = BTreeSet::new();
            for (ids, e) in described.failed {
                warn!(%region, blocks = ids.len(), error = %e, "cannot describe these capacity blocks (DescribeCapacityBlocks); their nodes' UltraServer shape does not change");
                failed.extend(ids);
            }
            let Found {
                capacities,
                failed: status_failed,
                ..
            } = ec2.interconnects(region, &ids).await;
            for (ids, e) in status_failed {
                warn!(%region, blocks = ids.len(), error = %e, "cannot read these capacity blocks' capacity (DescribeCapacityBlockStatus); their nodes' capacity-block-size label does not change");
            }
            merge(&mut known, &ids, described.blocks, &capacities, &failed);
        }
        let by_name: std::collections::HashMap<&str, &Arc<CachedNode>> =
            cache.iter().map(|n| (n.name(), n)).collect();
        let members: Vec<Member> = found
            .iter()
            .filter_map(|m| {
                let node = by_name.get(m.name.as_str())?;
                Some(Member {
                    name: m.name.clone(),
                    uid: node.uid().map(std::borrow::Cow::into_owned),
                    block: m.block.clone(),
                    current: Wanted::of(node),
                })
            })
            .collect();
        drop(by_name);
        for (node, uid, wanted) in plan(&members, &known, &settled) {
            if !ctx.leader.is_leader() {
                break;
            }
            let body = apply_body(&node, uid.as_deref(), &wanted);
            match ctx.api.patch(&node, &params, &Patch::Apply(body)).await {
                Ok(written) => {
                    ctx.metrics.label_write("shape");
                    let left = Wanted::of_lite(&crate::node::LiteNode::from(written));
                    if left == wanted {
                        settled.remove(&node);
                    } else {
                        warn!(%node, wanted = ?wanted, left = ?left, "another field manager co-owns an UltraServer shape key we gave up: it stays, and is not written again until something changes");
                        settled.insert(node.clone(), (wanted.clone(), left));
                    }
                    info!(%node, labels = ?wanted.labels, annotations = ?wanted.annotations, "UltraServer shape written");
                }
                Err(e) => {
                    warn!(%node, error = %e, "cannot write the node's UltraServer shape; tried again next round")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(t: Option<&str>, end: Option<&str>) -> Shape {
        Shape {
            ultraserver_type: t.map(str::to_owned),
            end: end.map(str::to_owned),
            state: Some("active".into()),
        }
    }

    fn member(name: &str, block: &str, labels: &[(&str, &str)], end: Option<&str>) -> Member {
        Member {
            name: name.into(),
            uid: Some(format!("uid-{name}")),
            block: block.into(),
            current: Wanted {
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                annotations: end
                    .map(|e| BTreeMap::from([(END_KEY.to_string(), e.to_string())]))
                    .unwrap_or_default(),
            },
        }
    }

    const END: &str = "2026-12-31T11:30:00Z";

    /// What one round asking about every block of `shapes` knows.
    fn known(shapes: BTreeMap<String, Shape>, capacities: &BTreeMap<String, u32>) -> Known {
        let asked: Vec<String> = shapes.keys().cloned().collect();
        let mut k = Known::new();
        merge(&mut k, &asked, shapes, capacities, &BTreeSet::new());
        k
    }

    #[test]
    fn answers_replace_what_was_known_and_failures_keep_it() {
        let mut k = Known::new();
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let shapes = |v: &[&str]| {
            v.iter()
                .map(|id| (id.to_string(), shape(Some("u-p6e-gb200x72"), None)))
                .collect::<BTreeMap<_, _>>()
        };
        merge(
            &mut k,
            &ids(&["a", "b", "c"]),
            shapes(&["a", "b", "c"]),
            &BTreeMap::from([("a".to_string(), 18), ("b".to_string(), 9)]),
            &BTreeSet::new(),
        );
        assert_eq!(k["a"].1, Some(18));
        assert_eq!(k["c"].1, None);
        // Next round: a's status call failed (its size stays), b's request failed (kept whole),
        // c left out of EC2's answer (forgotten), d new.
        merge(
            &mut k,
            &ids(&["a", "b", "c", "d"]),
            shapes(&["a", "d"]),
            &BTreeMap::from([("d".to_string(), 4)]),
            &BTreeSet::from(["b".to_string()]),
        );
        assert_eq!(k.keys().collect::<Vec<_>>(), ["a", "b", "d"]);
        assert_eq!((k["a"].1, k["b"].1, k["d"].1), (Some(18), Some(9), Some(4)));
    }

    #[test]
    fn members_get_type_size_and_end_and_only_changes_are_written() {
        let members = [
            member("a1", "cb-a", &[], None),
            member(
                "a2",
                "cb-a",
                &[(TYPE_KEY, "u-p6e-gb200x72"), (SIZE_KEY, "18")],
                Some(END),
            ),
            member("b1", "cb-b", &[(TYPE_KEY, "u-trn2x64")], None),
        ];
        let shapes = BTreeMap::from([
            ("cb-a".to_string(), shape(Some("u-p6e-gb200x72"), Some(END))),
            ("cb-b".to_string(), shape(None, None)),
        ]);
        let capacities = BTreeMap::from([("cb-a".to_string(), 18), ("cb-b".to_string(), 4)]);
        let p = plan(&members, &known(shapes, &capacities), &Settled::new());
        let names: Vec<&str> = p.iter().map(|(n, _, _)| n.as_str()).collect();
        // a2 carries it all already; b1's block no longer has a type: it goes, the size comes.
        assert_eq!(names, ["a1", "b1"]);
        let (_, uid, a1) = &p[0];
        assert_eq!(uid.as_deref(), Some("uid-a1"));
        assert_eq!(a1.labels[TYPE_KEY], "u-p6e-gb200x72");
        assert_eq!(a1.labels[SIZE_KEY], "18");
        assert_eq!(a1.annotations[END_KEY], END);
        let b1 = &p[1].2;
        assert!(!b1.labels.contains_key(TYPE_KEY), "{b1:?}");
        assert_eq!(b1.labels[SIZE_KEY], "4");
        assert!(b1.annotations.is_empty());
    }

    #[test]
    fn a_block_ec2_did_not_describe_changes_nothing_and_a_failed_status_keeps_the_size() {
        let members = [
            member(
                "a1",
                "cb-a",
                &[(TYPE_KEY, "u-p6e-gb200x72"), (SIZE_KEY, "18")],
                None,
            ),
            member(
                "z1",
                "cb-unknown",
                &[(TYPE_KEY, "u-trn2x64"), (SIZE_KEY, "4")],
                None,
            ),
        ];
        let shapes =
            BTreeMap::from([("cb-a".to_string(), shape(Some("u-p6e-gb200x72"), Some(END)))]);
        // The status call failed: no capacities at all.
        let p = plan(&members, &known(shapes, &BTreeMap::new()), &Settled::new());
        assert_eq!(p.len(), 1, "{p:?}");
        let (name, _, w) = &p[0];
        assert_eq!(name, "a1");
        assert_eq!(w.labels[SIZE_KEY], "18", "kept as it was");
        assert_eq!(w.annotations[END_KEY], END);
        // Nothing described at all (EC2 unreachable): nothing written.
        assert!(plan(&members, &Known::new(), &Settled::new()).is_empty());
    }

    #[test]
    fn a_key_another_manager_keeps_is_not_written_again_until_something_changes() {
        // EC2 no longer gives a type; the apply gave it up, but another manager co-owns it.
        let m = member(
            "a1",
            "cb-a",
            &[(TYPE_KEY, "u-trn2x64"), (SIZE_KEY, "4")],
            None,
        );
        let k = known(
            BTreeMap::from([("cb-a".to_string(), shape(None, None))]),
            &BTreeMap::from([("cb-a".to_string(), 4)]),
        );
        let p = plan(std::slice::from_ref(&m), &k, &Settled::new());
        assert_eq!(p.len(), 1, "{p:?}");
        let applied = p[0].2.clone();
        let settled = Settled::from([("a1".to_string(), (applied, m.current.clone()))]);
        assert!(plan(std::slice::from_ref(&m), &k, &settled).is_empty());
        // The size changes: written again.
        let bigger = known(
            BTreeMap::from([("cb-a".to_string(), shape(None, None))]),
            &BTreeMap::from([("cb-a".to_string(), 8)]),
        );
        assert_eq!(plan(std::slice::from_ref(&m), &bigger, &settled).len(), 1);
    }

    #[test]
    fn a_type_that_is_no_label_value_is_left_out() {
        let w = wanted(
            &shape(Some("u-p6e gb200/x72"), None),
            Some(18),
            &Wanted::default(),
        );
        assert!(!w.labels.contains_key(TYPE_KEY));
        assert_eq!(w.labels[SIZE_KEY], "18");
        assert!(label_value("u-p6e-gb200x72"));
        assert!(!label_value(&"x".repeat(64)));
    }

    #[test]
    fn the_apply_names_the_uid_and_carries_the_whole_set() {
        let w = wanted(
            &shape(Some("u-trn2x64"), Some(END)),
            Some(4),
            &Wanted::default(),
        );
        let body = apply_body("n1", Some("u1"), &w);
        assert_eq!(body["metadata"]["uid"], "u1");
        assert_eq!(body["metadata"]["labels"][TYPE_KEY], "u-trn2x64");
        assert_eq!(body["metadata"]["labels"][SIZE_KEY], "4");
        assert_eq!(body["metadata"]["annotations"][END_KEY], END);
    }
}

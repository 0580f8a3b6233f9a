//! Coverage: per instance type and zone, the nodes carrying each layer, as gauges, and a
//! Warning Event for a node Kueue's Topology leaves out (fewer layer labels than its levels).
//!
//! Owns: the coverage gauges and the `NotInSchedulerTopology` Event. Never writes to a Node.

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use crate::{labels::LabelScheme, provider_id, reconcile::Context};

/// The fewest levels a configured Kueue Topology has (`None` when none is published): a node
/// with fewer layer labels is left out of topology-aware scheduling.
pub(crate) fn kueue_levels(
    args: &crate::publish::PublishArgs,
    scheme: &LabelScheme,
) -> Option<(String, usize)> {
    args.kueue.kueue_topology.then(|| {
        (
            args.kueue.kueue_topology_name.clone(),
            scheme.uniform_depth.unwrap_or(3),
        )
    })
}

/// Coverage per instance type and zone as gauges, counted every `every` (12 publish intervals:
/// a minute by default) from the node cache
/// (reading each node's few labels in place), and a Warning Event, once per node, when a node
/// we labelled carries fewer layers than the Kueue Topology we publish (Kueue leaves it out).
pub(crate) async fn coverage(
    reader: crate::node::store::NodeCache,
    synced: Arc<AtomicBool>,
    kueue: Option<(String, usize)>,
    every: Duration,
    ctx: Arc<Context>,
) {
    let mut tick = tokio::time::interval(every.max(Duration::from_secs(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported: HashSet<String> = HashSet::new();
    loop {
        tick.tick().await;
        if !synced.load(Ordering::SeqCst) {
            continue;
        }
        let nodes = reader.state();
        let mut short = Vec::new();
        let items: Vec<_> = nodes
            .iter()
            .filter(|n| provider_id::parse(n.provider_id()).is_ok())
            .map(|n| {
                let depth = crate::coverage::depth_of(&ctx.scheme, |k| n.label(k));
                // Labels carried, not path depth: a node padded to --uniform-depth is in.
                if let Some((_, levels)) = &kueue
                    && let Some(carried) =
                        crate::coverage::short_of(&ctx.scheme, *levels, |k| n.label(k))
                {
                    short.push((n.clone(), carried));
                }
                (
                    n.label(crate::coverage::INSTANCE_TYPE_LABEL),
                    n.label(crate::coverage::ZONE_LABEL),
                    depth,
                )
            })
            .collect();
        ctx.metrics.set_coverage(&crate::coverage::cells(items));
        let Some((name, levels)) = &kueue else {
            continue;
        };
        let now: HashSet<String> = short.iter().map(|(n, _)| n.name_any()).collect();
        reported.retain(|n| now.contains(n));
        if !ctx.leader.is_leader() {
            continue;
        }
        for (node, depth) in short {
            if reported.insert(node.name_any()) {
                ctx.events.publish(
                    crate::admin::events::Reason::NotInSchedulerTopology,
                    "CountCoverage",
                    &format!(
                        "the node carries {depth} layer label(s), Kueue Topology {name} has {levels} levels: Kueue leaves the node out of topology-aware scheduling"
                    ),
                    node.object_ref(),
                );
            }
        }
    }
}

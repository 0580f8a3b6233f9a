//! Forgetting what is gone: a deleted node's record (and its verification record, in the
//! ledger) and the cached answers of instances no node runs on any more. Looked for at a tick
//! every quarter resync period (10 s to 15 min) when something may have gone since the last
//! look (a node deleted, a relist, an instance changed, a ledger read), and at every fourth
//! tick regardless (once a resync period, for resync periods of 40 s to 1 h).
//!
//! Owns: that forgetting. Never writes to the cluster.

use std::{collections::HashSet, sync::Arc, time::Duration};

use tracing::debug;

use super::Context;
use crate::{lookup::Lookup, provider_id};

/// Forget deleted nodes: their metrics state and, once unused, their cached answers.
pub(crate) async fn housekeeping(
    reader: crate::node::store::NodeCache,
    lookup: Lookup,
    ctx: Arc<Context>,
    resync: Duration,
) {
    let every = (resync / 4).clamp(Duration::from_secs(10), Duration::from_secs(900));
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    let mut looked = None;
    let mut ticks = 0u64;
    loop {
        tick.tick().await;
        // Only against the whole fleet: while the first list pages in, a node not listed yet
        // is not gone.
        if !reader.is_ready() {
            continue;
        }
        // What can be gone: nodes deleted (or dropped by a relist, or whose instance changed)
        // and nodes a ledger read brought in. Nothing of that since the last pass: nothing to
        // look for (a pass reads every node and walks four tables: at 100,000 nodes some
        // 100,000 allocations, 3 to 4 times a resync period, for nothing), but for once every
        // fourth tick (a resync period), which also finds what a reconcile in flight as its
        // node was deleted left behind.
        ticks += 1;
        let now = (reader.removals(), ctx.ledger.merges());
        if looked == Some(now) && !ticks.is_multiple_of(4) {
            continue;
        }
        looked = Some(now);
        // The one place a deleted node is forgotten: its record (failures, our last write,
        // conflicts, state), and the cached answers of instances no node runs on any more.
        // One copy of the cache's references (the watch's writer waits while its lock is
        // held), the names read in place.
        let nodes = reader.state();
        let live: HashSet<&str> = nodes.iter().map(|n| n.name()).collect();
        let instances: HashSet<String> = nodes
            .iter()
            .filter_map(|n| provider_id::parse(n.provider_id()).ok())
            .map(|i| i.instance_id)
            .collect();
        ctx.records.retain(&live);
        ctx.ledger.retain(&live);
        drop(live);
        drop(nodes);
        let evicted = lookup.retain_instances(&instances);
        if evicted > 0 {
            debug!(
                evicted,
                "dropped cached answers of instances no node runs on"
            );
        }
    }
}

//! Forgetting what is gone: a deleted node's record (and its verification record, in the
//! ledger) and the cached answers of instances no node
//! runs on any more, every quarter resync period (10 s to 15 min).
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
    loop {
        tick.tick().await;
        // Only against the whole fleet: while the first list pages in, a node not listed yet
        // is not gone.
        if !reader.is_ready() {
            continue;
        }
        // The one place a deleted node is forgotten: its record (failures, our last write,
        // conflicts, state), and the cached answers of instances no node runs on any more.
        // One copy of the cache's references, then the work outside its lock (the watch's
        // writer waits while it is held).
        let nodes = reader.state();
        let live: HashSet<String> = nodes.iter().map(|n| n.name_any()).collect();
        let instances: HashSet<String> = nodes
            .iter()
            .filter_map(|n| provider_id::parse(n.provider_id()).ok())
            .map(|i| i.instance_id)
            .collect();
        drop(nodes);
        ctx.records.retain(&live);
        ctx.ledger.retain(&live);
        let evicted = lookup.retain_instances(&instances);
        if evicted > 0 {
            debug!(
                evicted,
                "dropped cached answers of instances no node runs on"
            );
        }
    }
}

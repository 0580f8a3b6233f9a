//! The periodic re-check: every node once per resync period, spread evenly over it, one shard of
//! the node cache a tick.
//!
//! A requeue per node (`Action::requeue(resync)`) would do the same with one timer per node in
//! kube-runtime's scheduler: about 600 bytes a node, held all the time (60 MiB at 100,000
//! nodes) for an event that happens once an hour. Instead the period is cut into [`SLOTS`]
//! ticks; a node's slot is its shard of the node cache (a hash of its name), so each node comes
//! up once per period, the load is even (a hundredth of the fleet per tick at 100,000 nodes:
//! cache hits, no EC2 call), a tick visits only its shard, and nothing is kept per node.
//!
//! Owns: when a settled node is looked at again. Never reconciles (the controller does).

use std::time::Duration;

use super::queue::Key;
use futures::{Stream, StreamExt};

/// Ticks per resync period: one per shard of the node cache, a node's slot being its shard.
pub(crate) const SLOTS: u64 = crate::node::store::SHARDS;

/// The nodes due at each tick, forever: at tick `k` (every `period / SLOTS`) those whose slot
/// is `k % SLOTS`, as the cache has them then.
pub(crate) fn due(
    store: crate::node::store::NodeCache,
    period: Duration,
) -> impl Stream<Item = Key> {
    let every = (period / SLOTS as u32).max(Duration::from_millis(10));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    futures::stream::unfold((tick, 0u64), move |(mut tick, k)| {
        let store = store.clone();
        async move {
            tick.tick().await;
            let now = k % SLOTS;
            let refs: Vec<Key> = store.names_in_shard(now);
            Some((futures::stream::iter(refs), (tick, k + 1)))
        }
    })
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_has_one_slot_and_the_fleet_spreads_evenly() {
        let names: Vec<String> = (0..100_000)
            .map(|k| format!("ip-10-{}-{}.ec2.internal", k / 250, k % 250))
            .collect();
        let mut per_slot = vec![0u32; SLOTS as usize];
        for n in &names {
            let slot = crate::node::store::shard(n);
            assert_eq!(slot, crate::node::store::shard(n), "stable");
            per_slot[slot as usize] += 1;
        }
        let (min, max) = (
            per_slot.iter().min().copied().unwrap_or_default(),
            per_slot.iter().max().copied().unwrap_or_default(),
        );
        // 1,000 a slot on average; no slot more than 15 % off.
        assert!(min > 850 && max < 1150, "min {min}, max {max}");
    }

    #[tokio::test(start_paused = true)]
    async fn every_node_comes_up_once_per_period() {
        let (reader, mut writer) = crate::node::store::NodeCache::new();
        for k in 0..1000 {
            let mut n = crate::node::LiteNode::default();
            n.metadata.name = Some(format!("node-{k}"));
            writer.apply(kube::runtime::watcher::Event::Apply(n));
        }
        let period = Duration::from_secs(100);
        let stream = due(reader, period);
        futures::pin_mut!(stream);
        let mut seen = std::collections::HashMap::<String, u32>::new();
        // Two periods' worth of ticks.
        let started = tokio::time::Instant::now();
        while let Some(r) = stream.next().await {
            if started.elapsed() > period * 2 {
                break;
            }
            *seen.entry(r.to_string()).or_default() += 1;
        }
        assert_eq!(seen.len(), 1000, "every node came up");
        assert!(
            seen.values().all(|c| *c == 2),
            "each exactly once per period"
        );
    }
}

//! What a new leader does first: every node's reconcile, the joining and held nodes' before the
//! rest, the rest in chunks the controller keeps up with.
//!
//! Owns: the order and pace of an election's sweep. Never reconciles a node itself (it sends
//! keys to the queue).

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use futures::StreamExt;
use tracing::debug;

use super::{Context, queue::Key};
use crate::tasks::{Lifetime, supervise};

/// On each election, every node's reconcile: the joining and held nodes' first, then the
/// others in chunks: the first once every joining and held node's reconcile has run (at most
/// [`URGENT_FIRST`]), each of the next once the controller has taken most of the one before. A new
/// leader labels the nodes that wait for it before it re-checks thousands of verified ones, and
/// a node that joins meanwhile waits behind one chunk, not behind the fleet (measured, 5,000
/// verified nodes queued at once: 1.5 s for a joiner behind them).
pub fn on_election(
    elected: futures::channel::mpsc::UnboundedReceiver<()>,
    reader: crate::node::store::NodeCache,
    ctx: Arc<Context>,
) -> futures::channel::mpsc::UnboundedReceiver<Key> {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    // Restarted if it panics: the receiver outlives a run (a panic drops the run's lock).
    let elected = Arc::new(tokio::sync::Mutex::new(elected));
    let runs = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let metrics = ctx.metrics.clone();
    supervise("election sweep", Lifetime::Forever, metrics, move || {
        let (elected, reader, ctx, tx) = (elected.clone(), reader.clone(), ctx.clone(), tx.clone());
        let restarted = runs.fetch_add(1, Ordering::SeqCst) > 0;
        async move {
            let mut elected = elected.lock().await;
            // A restart after a panic mid-sweep: that election's message is spent; a replica
            // that leads sweeps again rather than wait for the next election.
            if restarted && ctx.leader.is_leader() && !sweep(&reader, &ctx, &tx).await {
                return std::future::pending().await;
            }
            while elected.next().await.is_some() {
                if !sweep(&reader, &ctx, &tx).await {
                    // The queue stopped: shutting down.
                    return std::future::pending().await;
                }
            }
            // The election stopped: shutting down.
            std::future::pending().await
        }
    });
    rx
}

/// One election's sweep: every node's key sent, the joining and held nodes' first, the rest in
/// chunks. `false` once the queue no longer takes keys.
/// How long an election's sweep holds the rest of the fleet back while the joining and held
/// nodes' reconciles run (a lookup's batch windows, EC2's answer and the write, with room).
const URGENT_FIRST: Duration = Duration::from_secs(3);

async fn sweep(
    reader: &crate::node::store::NodeCache,
    ctx: &Context,
    tx: &futures::channel::mpsc::UnboundedSender<Key>,
) -> bool {
    const CHUNK: usize = 256;
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    for n in reader.state() {
        // Cooperative: thousands of nodes judged at a takeover must not hold a worker.
        tokio::task::coop::consume_budget().await;
        if crate::reconcile::urgent(&n.expand(), ctx) {
            first.push(n);
        } else {
            rest.push(n);
        }
    }
    if !first.is_empty() {
        debug!(
            nodes = first.len(),
            "reconciling the joining and held nodes first"
        );
    }
    let mut sent_at = ctx.metrics.reconciles_run();
    let mut sent = 0u64;
    let refs = first.iter().chain(&rest).map(|n| Key::from(n.name()));
    for (k, r) in refs.enumerate() {
        if k >= first.len() && (k - first.len()) % CHUNK == 0 {
            // The controller's queue is first come, first served: wait until most of what was
            // sent has run (at most a second) before sending the next chunk. Before the first
            // chunk, until every joining and held node's reconcile has run (at most
            // URGENT_FIRST): their lookups wait for a batch window or three and their writes
            // for the API server, and re-checking verified nodes meanwhile only competes with
            // them for the CPU and the API server (seen: joiners labelled up to 2.4 s after a
            // takeover on a loaded machine, where 1 s is usual).
            let (wait, need) = if k == first.len() && k > 0 {
                (URGENT_FIRST, sent)
            } else {
                (Duration::from_secs(1), sent / 2)
            };
            let deadline = tokio::time::Instant::now() + wait;
            while ctx.metrics.reconciles_run() < sent_at + need
                && tokio::time::Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if !ctx.leader.is_leader() {
                break;
            }
            sent_at = ctx.metrics.reconciles_run();
            sent = 0;
        }
        if tx.unbounded_send(r).is_err() {
            return false;
        }
        sent += 1;
    }
    true
}

//! Warming the answer cache when this replica starts leading: one walk of the node cache that
//! looks up every node's instance, many at a time, ahead of the reconciles.
//!
//! Without it, lookups reach the batcher only as fast as reconciles start, and reconciles start
//! only as fast as label writes finish (the API server's pace: a few hundred a second). A
//! batch then waits for IDs that trickle in, and whenever the API server pauses the batcher
//! rightly sends what it has: about one call in ten went out part-full installing into 100,000
//! nodes. Walking the cache feeds the batcher the whole fleet at EC2's pace instead, so nearly
//! every call carries 100 instances, and the reconciles behind find their answers cached (or
//! join the call already on its way). Nothing is held per node: the walk keeps a bounded
//! number of lookups in flight.
//!
//! The first list is not waited for: reconciles start on its first page, so its nodes are
//! looked up as they arrive, a page (100 nodes, a call's worth) at a time; the walk that follows
//! the list then finds them cached.
//!
//! Stops at the first failed call (EC2 down, throttling that outlasted its re-sends): the
//! reconciles' own backoff and the re-check on recovery take over, and a walk never sends a
//! stream of calls to an EC2 that is failing. Stops too when leadership is lost.
//!
//! Owns: nothing. Never writes; labels are the reconciler's.

use std::{sync::Arc, time::Duration};

use futures::{StreamExt, stream::FuturesUnordered};
use tokio::time::Instant;
use tracing::{debug, info};

use super::{Context, assess};
use crate::{
    node::LiteNode,
    topology::{Ec2Error, MAX_IDS_PER_CALL},
};

/// Lookups in flight during the walk: ten full calls' worth, so the batcher always has a full
/// call to send while answers come back, and memory stays bounded. A multiple of the IDs a
/// call carries: the walk tops up a call's worth at a time.
pub const IN_FLIGHT: usize = 1_000;

/// What one walk did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Walked {
    /// Nodes looked up (cache hits included), up to where the walk stopped.
    pub nodes: usize,
    /// Whether the walk stopped early (a failed call, or leadership lost).
    pub stopped: bool,
}

/// Look up every node in `store` (those with an instance to look up), at most [`IN_FLIGHT`]
/// at a time; stop at the first failed call or when this replica stops leading.
pub async fn warm(store: &crate::node::store::NodeCache, ctx: &Context) -> Walked {
    let started = Instant::now();
    let (nodes, stop) = walk(store, ctx).await;
    let took_ms = started.elapsed().as_millis() as u64;
    match &stop {
        None => info!(
            nodes,
            took_ms,
            cached = ctx.lookup.cached(),
            "looked up every node's topology ahead of its reconcile"
        ),
        Some(Stop::Failed(e)) => info!(error = %e, nodes, took_ms,
            "stopped looking up nodes ahead of their reconciles: an EC2 call failed; each is looked up when it is reconciled"),
        Some(Stop::NotLeading) => info!(
            nodes,
            took_ms,
            "stopped looking up nodes ahead of their reconciles: this replica no longer leads"
        ),
    }
    Walked {
        nodes,
        stopped: stop.is_some(),
    }
}

/// Why a walk stopped early.
enum Stop {
    Failed(Ec2Error),
    NotLeading,
}

/// Nodes looked up, and why the walk stopped early (if it did).
async fn walk(store: &crate::node::store::NodeCache, ctx: &Context) -> (usize, Option<Stop>) {
    let mut in_flight = FuturesUnordered::new();
    let mut done = 0usize;
    // The ledger's records first: a node one vouches for is asked nothing.
    ctx.ledger.ready(super::LEDGER_WAIT).await;
    // In the order the reconciles come (the initial list's: by name), not the store's hash
    // order: the first reconciles then ask for what the walk's first calls carry.
    let mut nodes = store.state();
    nodes.sort_unstable_by(|a, b| a.name().cmp(b.name()));
    for node in nodes {
        // A node answered from its verification record is CPU alone (the record checked, its
        // answer ready at once): without this the walk never yields, and at 5,000 nodes it held
        // a worker for ~1 s at a takeover while the joiners' call, due after two batch windows,
        // waited behind it (the fault suite's `leader_killed_during_a_join_wave`).
        tokio::task::coop::consume_budget().await;
        let node = node.expand();
        let Ok(Ok(target)) = assess::target(&node, &ctx.scheme, ctx.region.as_deref()) else {
            continue;
        };
        if in_flight.len() >= IN_FLIGHT {
            // Top up a whole call at a time: wait until a call's worth of answers came back,
            // then hand the next ones to the batcher together (nothing awaited between them),
            // so that each fills a call of its own whatever the timing. Handed over one by one
            // as answers trickled in, a pause longer than the batch window split them (seen:
            // calls of 1 and 49 where one of 50 was due).
            while in_flight.len() > IN_FLIGHT - MAX_IDS_PER_CALL {
                match in_flight.next().await {
                    Some(Err(e)) => return drain(in_flight, done, Stop::Failed(e)).await,
                    Some(Ok(())) => done += 1,
                    None => break,
                }
            }
        }
        if !ctx.leader.is_leader() {
            return drain(in_flight, done, Stop::NotLeading).await;
        }
        in_flight.push(ask(&node, &target, ctx));
    }
    while let Some(answer) = in_flight.next().await {
        match answer {
            Err(e) => return drain(in_flight, done, Stop::Failed(e)).await,
            Ok(()) => done += 1,
        }
    }
    (done, None)
}

/// Stopping early, nothing more is asked; the answers on their way are still awaited, since
/// an answer is recorded in the cache only when awaited (dropped, the calls already made would
/// be made again).
async fn drain<F>(
    mut in_flight: FuturesUnordered<F>,
    mut done: usize,
    stop: Stop,
) -> (usize, Option<Stop>)
where
    F: std::future::Future<Output = Result<(), Ec2Error>>,
{
    while let Some(answer) = in_flight.next().await {
        if answer.is_ok() {
            done += 1;
        }
    }
    (done, Some(stop))
}

/// `node`'s lookup, to be awaited (the answer is recorded in the cache then).
fn ask(
    node: &LiteNode,
    target: &assess::Target,
    ctx: &Context,
) -> impl std::future::Future<Output = Result<(), Ec2Error>> + use<> {
    // A node whose verification record holds is answered from it: no EC2 call.
    assess::adopt(
        node,
        &ctx.scheme,
        target,
        &ctx.lookup,
        &ctx.ledger,
        &ctx.metrics,
    );
    let asked = ctx.lookup.ask(
        target.region,
        target.instance_id,
        assess::boot_id(node),
        target.capacity_block_expected,
        false,
    );
    async move { asked.answer().await.map(|_| ()) }
}

/// The first list's nodes as they come, for [`first_list`]; the sender is dropped once the
/// list is in. Bounded (a node that finds it full is looked up by its reconcile, or by the walk
/// after the list): while EC2's pace held the lookups back, an unbounded one kept most of the
/// list (+5 MiB at the peak at 10,000 nodes).
pub type Arrivals = tokio::sync::mpsc::Receiver<Arc<LiteNode>>;

/// While the first list pages in: each node looked up as it arrives (once this replica leads),
/// so that the reconciles, which start on the first page, find their answers on the way; a
/// page is 100 nodes, a call's worth, and comes whole, so the calls go out full. At most
/// [`IN_FLIGHT`] at a time (the rest wait in `arrivals`, or are left to their reconciles); after a failed call nothing more is
/// asked (the reconciles' own backoff takes over). Returns the nodes looked up, once the list
/// is in and their answers are back.
pub async fn ahead_of_first_list(mut arrivals: Arrivals, ctx: &Context) -> usize {
    let mut in_flight = FuturesUnordered::new();
    let (mut done, mut failed) = (0usize, false);
    let mut settle = |answer: Result<(), Ec2Error>, failed: &mut bool| match answer {
        Ok(()) => done += 1,
        Err(_) => *failed = true,
    };
    loop {
        if in_flight.len() >= IN_FLIGHT {
            // As in the walk: a call's worth of room at a time.
            while in_flight.len() > IN_FLIGHT - MAX_IDS_PER_CALL {
                match in_flight.next().await {
                    Some(answer) => settle(answer, &mut failed),
                    None => break,
                }
            }
        }
        tokio::select! {
            // Every node already here before any answer: a page is handed over whole.
            biased;
            node = arrivals.recv() => {
                let Some(node) = node else { break };
                if failed || !ctx.leader.is_leader() {
                    continue;
                }
                if let Ok(Ok(target)) = assess::target(&node, &ctx.scheme, ctx.region.as_deref()) {
                    // The ledger's records first: a node one vouches for is asked nothing.
                    ctx.ledger.ready(super::LEDGER_WAIT).await;
                    in_flight.push(ask(&node, &target, ctx));
                }
            }
            Some(answer) = in_flight.next(), if !in_flight.is_empty() => settle(answer, &mut failed),
        }
    }
    while let Some(answer) = in_flight.next().await {
        settle(answer, &mut failed);
    }
    done
}

/// The first list's nodes looked up as they come (see [`ahead_of_first_list`]).
pub(crate) async fn first_list(arrivals: Arrivals, ctx: &Context) {
    let started = Instant::now();
    let nodes = ahead_of_first_list(arrivals, ctx).await;
    if nodes > 0 {
        info!(
            nodes,
            took_ms = started.elapsed().as_millis() as u64,
            "looked up the first list's nodes as they came"
        );
    }
}

/// Each time this replica starts leading with a synced cache, one walk of every node (never
/// ends; restartable: it holds nothing it cannot make again).
pub(crate) async fn walks(
    store: crate::node::store::NodeCache,
    ctx: Arc<Context>,
    synced: Arc<std::sync::atomic::AtomicBool>,
) {
    // Well inside the batch window (200 ms by default): the reconciles start at the same moment
    // and their first lookups should go out in the walk's full calls, not in a call of their own.
    let poll = Duration::from_millis(20);
    loop {
        ctx.leader.leading_with(&synced, poll).await;
        let walked = warm(&store, &ctx).await;
        debug!(?walked, "cache walk done");
        // Leadership lost, then won again: walk again (mostly cache hits by then).
        while ctx.leader.is_leader() {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

//! `run`: wires the controller together — clients, the node watch and cache, the lookup, the
//! leader election, the publishers, the admin server, housekeeping — and runs it until
//! SIGINT/SIGTERM.
//!
//! Owns: start-up order and shutdown. Holds no logic of its own beyond what each task needs to
//! be started.

use std::{
    collections::HashSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use futures::{StreamExt, TryStreamExt};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use tracing::{debug, error, info, warn};

use crate::tasks::{Lifetime, supervise};

use crate::{
    Error, FIELD_MANAGER, Result,
    flags::RunArgs,
    labels::LabelScheme,
    leader::Leadership,
    lookup::{Lookup, ec2::AwsTopology, limiter::Limiter},
    metrics::Metrics,
    node::store::NodeCache,
    node::watch::{prune, relevant},
    node::{LiteNode, WireNode},
    provider_id,
    reconcile::{
        Context,
        conflict::GuardConfig,
        error_policy,
        gate::Gate,
        queue::{self, Key},
        reconcile, resync, warm,
    },
};

/// What `/debug/nodes/NAME` reads, once the controller is wired: the node cache, the context and
/// this replica's identity.
type Wired = (NodeCache, Arc<Context>, String);

/// Run the controller until SIGINT/SIGTERM.
pub async fn run(args: RunArgs) -> Result<()> {
    let scheme = args.labels.scheme().map_err(Error::Config)?;
    if let Some(at) = &args.publish.slurm_topology_configmap {
        crate::publish::slurm::parse_target(at).map_err(Error::Config)?;
    }
    if args.leader.leader_election {
        crate::leader::Timings::from_args(&args.leader)?;
    }
    let metrics = Arc::new(Metrics::new());
    // Ready once the first list is in the cache. Served before anything talks to the API
    // server: while start-up waits for a cluster that is still settling, the probes see a live
    // process that is not ready (rather than one that exits and restarts).
    let synced = Arc::new(AtomicBool::new(false));
    let live = crate::tasks::Liveness::default();
    let listener = crate::admin::http::bind(args.serve.metrics_addr)?;
    // `/debug/nodes/NAME` (for `explain`) answers once the controller is wired below.
    let wired: Arc<std::sync::OnceLock<Wired>> = Arc::default();
    let inspect: crate::admin::http::Inspector = {
        let wired = wired.clone();
        Arc::new(move |name: &str| {
            let (reader, ctx, identity) = wired.get()?;
            let node = reader.get(name);
            let view = crate::reconcile::view::controller_view(
                identity,
                ctx.leader.is_leader(),
                node.as_deref(),
                ctx.records.view(name),
                &ctx.lookup,
            );
            (node.is_some() || view.record.is_some())
                .then(|| serde_json::to_value(view).ok())
                .flatten()
        })
    };
    let watch_health = Arc::new(crate::client::WatchHealth::default());
    tokio::spawn(crate::admin::http::serve(
        listener,
        metrics.clone(),
        crate::admin::http::Readiness {
            synced: synced.clone(),
            watch: watch_health.clone(),
            unhealthy_after: args.serve.watch_unhealthy_after.0,
        },
        live.clone(),
    ));
    // Not being able to serve `explain` does not stop the controller.
    match tokio::net::TcpListener::bind(args.serve.debug_addr).await {
        Ok(l) => {
            tokio::spawn(crate::admin::http::serve_debug(l, inspect));
        }
        Err(e) => {
            warn!(addr = %args.serve.debug_addr, error = %e, "cannot serve /debug/nodes (explain will not see the controller's view)");
        }
    }
    let identity = args
        .leader
        .identity
        .clone()
        .unwrap_or_else(crate::metrics::process::default_identity);
    // The election first: the client that writes is fenced by what it decides. The Lease has a
    // client of its own, unpaced and unfenced (renewals never wait behind writes).
    let (elected_tx, elected_rx) = futures::channel::mpsc::unbounded::<()>();
    let (election, leadership) = if args.leader.leader_election {
        let lease_client =
            crate::client::connect(&args.client, crate::client::Policy::unpaced(&args.client))
                .await?;
        let (election, leadership) = crate::leader::Election::start(
            lease_client,
            &args.leader,
            identity.clone(),
            metrics.clone(),
            elected_tx,
            live.task("leader election"),
        )?;
        (Some(election), leadership)
    } else {
        metrics.set_leader(true);
        (None, crate::leader::Leadership::always())
    };
    let client = crate::client::connect(
        &args.client,
        crate::client::Policy::new(&args.client)
            .fenced(leadership.clone())
            .counted(metrics.clone())
            .watching(watch_health.clone()),
    )
    .await?;
    let limiter = Arc::new(Limiter::new(args.ec2.limiter()));
    let lookup =
        crate::lookup::lookup_sharing(&args.ec2, &args.lookup, metrics.clone(), limiter.clone())
            .await
            .map_err(crate::Error::Config)?;
    match lookup.record_key() {
        Some(key) => info!(key = %key.id(), previous = ?key.previous_ids(),
            "verification records are sealed with this key (and trusted when sealed with the previous ones)"),
        None => warn!(
            "no --record-key-file: verification records are neither written nor trusted, and every start asks EC2 about every instance"
        ),
    }
    let batcher = lookup.clone();
    live.check("ec2 batcher", move || batcher.batcher_running());
    let nodes: Api<WireNode> = Api::all(client.clone());
    let nodes_watch = nodes.clone();
    let resync = args.controller.resync_period.0;
    let mut ctx = Context::new(
        nodes.clone(),
        lookup.clone(),
        scheme.clone(),
        args.ec2.region.clone(),
        resync,
        metrics.clone(),
    );
    ctx.writes = tokio::sync::Semaphore::new(usize::from(args.controller.write_concurrency.max(1)));
    ctx.conflict = GuardConfig::new(
        args.controller.conflict_backoff.0,
        // A zero window would never count a second correction: the guard would be off.
        args.controller
            .conflict_window
            .0
            .max(Duration::from_secs(1)),
    );
    ctx.gate = Gate::from(&args.gate);
    if let Some(taint) = &ctx.gate.taint {
        info!(%taint, when_unsupported = ?ctx.gate.when_unsupported,
            timeout_s = ctx.gate.timeout.map(|d| d.as_secs()),
            "releasing the startup taint once each node's topology labels are written");
    }
    ctx.pod = crate::metrics::process::own_pod();
    if args.serve.events {
        ctx.events = crate::admin::events::Events::start(
            client.clone(),
            FIELD_MANAGER,
            &identity,
            metrics.clone(),
        );
    }
    let (kicks_tx, kicks_rx) = futures::channel::mpsc::unbounded::<()>();
    ctx.kicks = Some(kicks_tx);
    ctx.leader = leadership;
    let (reader, mut feeder) = NodeCache::new();
    ctx.cache = Some(reader.clone());
    let ctx = Arc::new(ctx);

    let _ = wired.set((reader.clone(), ctx.clone(), identity));
    let prune_scheme = scheme.clone();
    let filter_ctx = ctx.clone();
    let mark_synced = synced.clone();
    // The first list's nodes, for the lookups ahead of their reconciles (dropped once it is in).
    // Bounded: while EC2's pace holds the lookups back, a node that finds the channel full is
    // not held for them (its reconcile asks, or the walk after the list does).
    let (arrivals_tx, arrivals) = tokio::sync::mpsc::channel(warm::IN_FLIGHT);
    let mut arrivals_tx = Some(arrivals_tx);
    // Pages of NODE_PAGE nodes: a page is read whole before it is decoded, and with container
    // images a Node is ~15 kB of JSON; kube's default of 500 made each page of the initial list
    // a transient of several MB, the largest the controller had at start-up.
    let healthy = watch_health.clone();
    let triggers = watcher(
        nodes_watch,
        watcher::Config::default()
            .page_size(crate::node::store::NODE_PAGE)
            .timeout(u32::try_from(args.serve.watch_timeout.0.as_secs()).unwrap_or(290)),
    )
    .default_backoff()
    .map_ok(move |event| {
        healthy.ok();
        let done = matches!(event, watcher::Event::InitDone);
        let touched = feeder.apply(crate::node::store::map_event(event, |wire| {
            let mut node = LiteNode::from(wire);
            prune(&mut node, &prune_scheme);
            node
        }));
        if done {
            arrivals_tx = None;
            if !mark_synced.swap(true, Ordering::SeqCst) {
                info!("node cache synced");
            }
        }
        if let (Some(tx), Some(node)) = (&arrivals_tx, &touched) {
            tx.try_send(node.clone()).ok();
        }
        touched
    })
    .try_filter_map(|touched| std::future::ready(Ok(touched)))
    .try_filter(move |node| std::future::ready(filter_ctx.records.changed(node, relevant(node))));

    // Each time EC2 answers again after failing, re-check every node: those waiting out a
    // per-node backoff are labelled now (they share batched calls; the rest are cache hits).
    let recoveries = futures::stream::unfold(lookup.recoveries(), |mut rx| async move {
        rx.changed().await.ok()?;
        info!("EC2 answers again; re-checking every node");
        Some(((), rx))
    });
    let installation = crate::leader::installation(&args.leader, &client);
    if let Some(publishers) = crate::publish::Publishers::new(
        &client,
        &args.publish,
        &installation,
        &scheme,
        crate::publish::slurm::Files {
            tree_topology: args.labels.slurm_topology_name.clone(),
            switches_only: args.labels.slurm_switches_only,
        },
        &metrics,
        ctx.events.clone(),
        &ctx.leader,
    )
    .map_err(Error::Config)?
    {
        tokio::spawn(publishers.run(
            reader.clone(),
            ctx.records.clone(),
            synced.clone(),
            live.task("scheduler publishers"),
        ));
    }
    // Background tasks: each restarted with backoff if it panics or ends (crate::tasks).
    {
        let (api, scheme, leader, metrics_, synced) = (
            Api::all(client.clone()),
            scheme.clone(),
            ctx.leader.clone(),
            metrics.clone(),
            synced.clone(),
        );
        supervise(
            "retire at start",
            Lifetime::Once,
            metrics.clone(),
            move || {
                retire_at_start(
                    api.clone(),
                    scheme.clone(),
                    leader.clone(),
                    metrics_.clone(),
                    synced.clone(),
                )
            },
        );
    }
    // What a feature now turned off left on Nodes: removed once, when leading with a synced cache.
    let retired: Vec<crate::cleanup::OnNode> = [
        (!args.gate.node_condition, crate::cleanup::OnNode::Condition),
        (
            !args.health.ultraserver_health,
            crate::cleanup::OnNode::Interconnect,
        ),
        (
            !args.health.ultraserver_health_taint,
            crate::cleanup::OnNode::InterconnectTaint,
        ),
        (!args.shape.ultraserver_shape, crate::cleanup::OnNode::Shape),
    ]
    .into_iter()
    .filter_map(|(off, what)| off.then_some(what))
    .collect();
    if !retired.is_empty() {
        let (client, reader, ctx, synced) =
            (client.clone(), reader.clone(), ctx.clone(), synced.clone());
        supervise(
            "retire condition at start",
            Lifetime::Once,
            metrics.clone(),
            move || {
                retire_from_nodes_at_start(
                    client.clone(),
                    reader.clone(),
                    ctx.clone(),
                    synced.clone(),
                    retired.clone(),
                )
            },
        );
    }
    // Look every node up ahead of its reconcile, so batches fill from the whole fleet: the
    // first list's nodes as they come (once: a failure there only loses the head start), then
    // a walk each time this replica starts leading.
    {
        let first = ctx.clone();
        tokio::spawn(async move { warm::first_list(arrivals, &first).await });
        let (reader, ctx, synced) = (reader.clone(), ctx.clone(), synced.clone());
        supervise("warm-up", Lifetime::Forever, metrics.clone(), move || {
            warm::walks(reader.clone(), ctx.clone(), synced.clone())
        });
    }
    {
        let (reader, synced, levels, every, ctx) = (
            reader.clone(),
            synced.clone(),
            kueue_levels(&args.publish, &scheme),
            args.publish.publish_interval.0.saturating_mul(12),
            ctx.clone(),
        );
        supervise("coverage", Lifetime::Forever, metrics.clone(), move || {
            coverage(
                reader.clone(),
                synced.clone(),
                levels.clone(),
                every,
                ctx.clone(),
            )
        });
    }
    // One EC2 client (credentials, per-region clients, the shared limiter) for the leader's
    // other EC2 tasks, built once when any of them is on.
    let side_ec2 = if args.reservations.capacity_reservations
        || args.health.ultraserver_health
        || args.shape.ultraserver_shape
    {
        Some(Arc::new(
            AwsTopology::from_env(args.ec2.ec2_timeout.0)
                .await
                .with_limiter(limiter.clone()),
        ))
    } else {
        None
    };
    if let (true, Some(ec2)) = (args.reservations.capacity_reservations, side_ec2.clone()) {
        let (reader, ctx, synced, args) = (
            reader.clone(),
            ctx.clone(),
            synced.clone(),
            args.reservations.clone(),
        );
        supervise(
            "reservations",
            Lifetime::Forever,
            metrics.clone(),
            move || {
                crate::publish::reserved::run(
                    reader.clone(),
                    ctx.clone(),
                    synced.clone(),
                    ec2.clone(),
                    args.clone(),
                )
            },
        );
    }
    if let (true, Some(ec2)) = (args.shape.ultraserver_shape, side_ec2.clone()) {
        let (reader, ctx, synced, args) = (
            reader.clone(),
            ctx.clone(),
            synced.clone(),
            args.shape.clone(),
        );
        supervise(
            "ultraserver-shape",
            Lifetime::Forever,
            metrics.clone(),
            move || {
                crate::publish::shape::run(
                    reader.clone(),
                    ctx.clone(),
                    synced.clone(),
                    ec2.clone(),
                    args.clone(),
                )
            },
        );
    }
    if let (true, Some(ec2)) = (args.health.ultraserver_health, side_ec2) {
        let (reader, ctx, synced, args) = (
            reader.clone(),
            ctx.clone(),
            synced.clone(),
            args.health.clone(),
        );
        supervise(
            "ultraserver-health",
            Lifetime::Forever,
            metrics.clone(),
            move || {
                crate::publish::interconnect::run(
                    reader.clone(),
                    ctx.clone(),
                    synced.clone(),
                    ec2.clone(),
                    args.clone(),
                )
            },
        );
    }
    {
        let (reader, ctx) = (reader.clone(), ctx.clone());
        supervise(
            "housekeeping",
            Lifetime::Forever,
            metrics.clone(),
            move || housekeeping(reader.clone(), lookup.clone(), ctx.clone(), resync),
        );
    }

    info!(resync_s = resync.as_secs(), "controller starting");
    let key = |n: &LiteNode| -> Key { Key::from(n.name()) };
    let watch_metrics = metrics.clone();
    let changed = triggers.filter_map(move |event| {
        std::future::ready(match event {
            Ok(node) => Some(key(&node)),
            // The watcher relists by itself (after an expired resource version, a restarted API
            // server); nothing is lost.
            Err(e) => {
                let reason = crate::node::watch::error_reason(&e);
                watch_metrics.watch_error(reason);
                watch_health.error();
                if reason == "forbidden" {
                    error!(error = %e, "the Node watch is refused: the ServiceAccount needs list and watch on nodes (the chart's ClusterRole); the node cache is going stale, retrying with backoff");
                } else {
                    warn!(error = %e, reason, "the Node watch failed; resuming with backoff");
                }
                None
            }
        })
    });
    let due = resync::due(reader.clone(), resync);
    let elected = on_election(elected_rx, reader.clone(), ctx.clone());
    let requests = futures::stream::select_all([changed.boxed(), due.boxed(), elected.boxed()]);
    let names_of = reader.clone();
    let get_from = reader.clone();
    queue::run(
        queue::Sources {
            requests,
            all: futures::stream::select(recoveries, kicks_rx),
            // The first list's nodes are served as they come (crate::node::store): reconciles start
            // on its first page.
            ready: std::future::ready(()),
            shutdown: queue::signalled(),
            concurrency: usize::from(args.controller.concurrency),
        },
        move |name| get_from.get(name),
        move || {
            names_of
                .state()
                .iter()
                .map(|n| Key::from(n.name()))
                .collect()
        },
        move |node: Arc<LiteNode>| {
            let ctx = ctx.clone();
            async move {
                match reconcile(node.clone(), ctx.clone()).await {
                    Ok(next) => next,
                    Err(e) => error_policy(node, &e, ctx),
                }
            }
        },
    )
    .await;
    if let Some(election) = election {
        election.stop().await;
    }
    info!("controller stopped");
    Ok(())
}

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

/// Once leading with a synced cache: remove what the features turned off left on Nodes
/// (`what`): our `TopologyLabeled` condition with `--node-condition` off (a stale `False` would
/// hold back whatever gates on it), our `UltraServerInterconnectImpaired` condition with
/// `--ultraserver-health` off (nothing would keep it true any more), our interconnect taint with
/// `--ultraserver-health-taint` off (nothing would ever take it off), the UltraServer shape
/// labels and annotation with `--ultraserver-shape` off (nothing would keep them true). One pass; a failure is
/// logged with what to do.
///
/// What a scheduler feature now turned off published is not the controller's to remove: its
/// ClusterRole holds no rights on the kinds of features turned off. `ec2-topology-labeler
/// retire` does that (the chart's post-upgrade hook runs it; see [`crate::cmd::retire`]).
async fn retire_from_nodes_at_start(
    client: Client,
    reader: crate::node::store::NodeCache,
    ctx: Arc<Context>,
    synced: Arc<AtomicBool>,
    what: Vec<crate::cleanup::OnNode>,
) {
    let leader = ctx.leader.clone();
    while !(leader.is_leader() && synced.load(Ordering::SeqCst)) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // One pass over the cache, each node expanded in turn (never the whole fleet at once).
    let found = crate::cleanup::on_nodes(reader.state().iter().map(|n| n.expand()), &what);
    for w in what {
        let items: Vec<_> = found
            .iter()
            .filter(|i| i.kind == w.kind())
            .cloned()
            .collect();
        if items.is_empty() {
            continue;
        }
        let failed = crate::cleanup::apply(&client, &items, &leader).await.failed;
        let removed = items.len() - failed.len();
        let (what, flag) = (w.describe(), w.flag());
        if removed > 0 {
            info!(removed, "removed {what} from nodes ({flag} is off)");
        }
        if let Some((item, e)) = failed.first() {
            warn!(failed = failed.len(), name = %item.name, error = %e, "cannot remove {what} ({flag} is off); grant the controller patch on nodes and nodes/status (the chart does) or run `ec2-topology-labeler uninstall`");
        }
    }
}

/// Once this replica leads and its cache synced: remove the labels we wrote under an earlier
/// configuration and no longer manage (see [`crate::reconcile::retire`]).
async fn retire_at_start(
    api: Api<k8s_openapi::api::core::v1::Node>,
    scheme: LabelScheme,
    leader: Leadership,
    metrics: Arc<Metrics>,
    synced: Arc<AtomicBool>,
) {
    let mut delay = Duration::from_secs(5);
    loop {
        while !(leader.is_leader() && synced.load(Ordering::SeqCst)) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        match crate::reconcile::retire::retire_all(&api, &scheme, &leader, &metrics).await {
            Ok(0) => return,
            Ok(n) => {
                info!(
                    nodes = n,
                    "removed labels and annotations this configuration no longer manages"
                );
                return;
            }
            Err(e) => {
                warn!(error = %e, retry_in_s = delay.as_secs(), "cannot list nodes to find labels no longer managed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(300));
            }
        }
    }
}

/// The fewest levels a configured Kueue Topology has (`None` when none is published): a node
/// with fewer layer labels is left out of topology-aware scheduling.
fn kueue_levels(
    args: &crate::publish::PublishArgs,
    scheme: &LabelScheme,
) -> Option<(String, usize)> {
    args.kueue_topology.then(|| {
        (
            args.kueue_topology_name.clone(),
            scheme.uniform_depth.unwrap_or(3),
        )
    })
}

/// Coverage per instance type and zone as gauges, counted every `every` (12 publish intervals:
/// a minute by default) from the node cache
/// (reading each node's few labels in place), and a Warning Event, once per node, when a node
/// we labelled carries fewer layers than the Kueue Topology we publish (Kueue leaves it out).
async fn coverage(
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

/// Forget deleted nodes: their metrics state and, once unused, their cached answers.
async fn housekeeping(
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
        let live: HashSet<String> = reader.state().iter().map(|n| n.name_any()).collect();
        ctx.records.retain(&live);
        let instances: HashSet<String> = reader
            .state()
            .iter()
            .filter_map(|n| provider_id::parse(n.provider_id()).ok())
            .map(|i| i.instance_id)
            .collect();
        let evicted = lookup.retain_instances(&instances);
        if evicted > 0 {
            debug!(
                evicted,
                "dropped cached answers of instances no node runs on"
            );
        }
    }
}

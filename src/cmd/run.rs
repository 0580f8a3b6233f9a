//! `run`: wires the controller together — clients, the node watch and cache, the lookup, the
//! leader election, the publishers, the admin server, housekeeping — and runs it until
//! SIGINT/SIGTERM.
//!
//! Owns: start-up order and shutdown. Each part it starts lives in its room (the watch in
//! `node::watch`, the sweep and housekeeping in `reconcile`, coverage in `publish`, the removals
//! at start-up in `cleanup` and `reconcile::retire`); what is here is which parts a
//! configuration starts and what each is handed.

use std::{
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use futures::StreamExt;
use kube::Api;
use tracing::{info, warn};

use crate::tasks::{Lifetime, supervise};

use crate::{
    Error, FIELD_MANAGER, Result,
    flags::RunArgs,
    lookup::{ec2::AwsTopology, limiter::Limiter},
    metrics::Metrics,
    node::store::NodeCache,
    node::watch::relevant,
    node::{LiteNode, WireNode},
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
    if let Some(at) = &args.publish.slurm.slurm_topology_configmap {
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
    // The verification records live in the ledger's shards in our namespace: read when this
    // replica starts leading, written in batches while it leads.
    ctx.ledger = Arc::new(crate::ledger::Ledger::new(lookup.record_key().cloned()));
    let shards = crate::ledger::keep::Shards {
        api: Api::namespaced(
            client.clone(),
            &crate::leader::lease_namespace(&args.leader, &client),
        ),
        lease: args.leader.leader_election_lease_name.clone(),
    };
    {
        let shards = shards.clone();
        let (ledger, leader, metrics_) = (ctx.ledger.clone(), ctx.leader.clone(), metrics.clone());
        supervise(
            "verification ledger",
            Lifetime::Forever,
            metrics.clone(),
            move || {
                crate::ledger::keep::keep(
                    shards.clone(),
                    ledger.clone(),
                    leader.clone(),
                    metrics_.clone(),
                )
            },
        );
    }
    let (reader, feeder) = NodeCache::new();
    ctx.cache = Some(reader.clone());
    let ctx = Arc::new(ctx);
    let ledger = ctx.ledger.clone();

    let _ = wired.set((reader.clone(), ctx.clone(), identity));
    // The first list's nodes, for the lookups ahead of their reconciles (dropped once it is in).
    // Bounded: while EC2's pace holds the lookups back, a node that finds the channel full is
    // not held for them (its reconcile asks, or the walk after the list does).
    let (arrivals_tx, arrivals) = tokio::sync::mpsc::channel(warm::IN_FLIGHT);
    let filter_ctx = ctx.clone();
    let changed = crate::node::watch::nodes(
        nodes_watch,
        feeder,
        scheme.clone(),
        args.serve.watch_timeout.0,
        crate::node::watch::Told {
            health: watch_health.clone(),
            synced: synced.clone(),
            arrivals: arrivals_tx,
            metrics: metrics.clone(),
        },
    )
    .filter(move |node| std::future::ready(filter_ctx.records.changed(node, relevant(node))))
    .map(|node| Key::from(node.name()));

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
                crate::reconcile::retire::retire_at_start(
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
                crate::cleanup::retire_from_nodes_at_start(
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
            crate::publish::coverage::kueue_levels(&args.publish, &scheme),
            args.publish.publish_interval.0.saturating_mul(12),
            ctx.clone(),
        );
        supervise("coverage", Lifetime::Forever, metrics.clone(), move || {
            crate::publish::coverage::coverage(
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
            move || {
                crate::reconcile::housekeeping::housekeeping(
                    reader.clone(),
                    lookup.clone(),
                    ctx.clone(),
                    resync,
                )
            },
        );
    }

    info!(resync_s = resync.as_secs(), "controller starting");
    let due = resync::due(reader.clone(), resync);
    let elected = crate::reconcile::sweep::on_election(elected_rx, reader.clone(), ctx.clone());
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
        move || names_of.names(),
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
    // Before the lease goes: what the ledger learnt since its last write.
    crate::ledger::keep::last_write(&shards, &ledger, &metrics, Duration::from_secs(5)).await;
    if let Some(election) = election {
        election.stop().await;
    }
    info!("controller stopped");
    Ok(())
}

//! `uninstall`: remove everything this controller wrote to the cluster except the topology labels
//! (unless `--labels`): our `TopologyLabeled` and `UltraServerInterconnectImpaired` conditions
//! and our interconnect taint on Nodes, our HyperNodes, our Kueue and KAI
//! Topologies (not a Kueue Topology a ResourceFlavor still names, unless `--force`), our Slurm
//! ConfigMaps, the Lease and the verification ledger's shards beside it. Run after the controller is gone (the chart's post-delete hook does),
//! since a running controller would write them again; it refuses while the Lease is held.
//!
//! Owns: the command. The removals themselves are [`crate::cleanup`]'s.

use crate::bounds::{Bound, secs};
use std::io::Write;

use clap::Args;
use k8s_openapi::{api::coordination::v1::Lease, jiff::Timestamp};
use kube::{Api, Client, ResourceExt};

use crate::{
    Error, Result,
    cleanup::{self, Item},
    flags::{HumanDuration, LeaderArgs, Output, OutputFormat},
    leader::Leadership,
    node::{LiteNode, WireNode},
    publish::plugin::{Purpose, Uninstall},
};

/// `--wait-for-lease`'s range.
pub(crate) const WAIT_FOR_LEASE_RANGE: Bound =
    Bound::duration("wait-for-lease", secs(0), secs(3600));

#[derive(Debug, Clone, Args)]
pub struct UninstallArgs {
    /// Print what would be removed; remove nothing.
    #[arg(long, env = "LABELER_UNINSTALL_DRY_RUN", action = clap::ArgAction::SetTrue)]
    pub dry_run: bool,
    /// Also remove the topology labels and annotations that only we own (keys another manager
    /// co-owns, as EKS's cloud controller does the layer keys, stay).
    #[arg(long, env = "LABELER_UNINSTALL_LABELS", action = clap::ArgAction::SetTrue)]
    pub labels: bool,
    /// Remove a Kueue Topology even when a ResourceFlavor names it, and run even while a
    /// controller holds the Lease.
    #[arg(long, env = "LABELER_UNINSTALL_FORCE", action = clap::ArgAction::SetTrue)]
    pub force: bool,
    /// What each scheduler's plug-in is told (its own flags).
    #[command(flatten)]
    pub plugins: crate::publish::UninstallFlags,
    /// Nodes still carrying the startup taint (as given to `run`) are pointed out.
    #[command(flatten)]
    pub taint: crate::reconcile::gate::StartupTaintFlag,
    /// Wait up to this long for a controller's Lease to lapse before refusing (the chart's
    /// post-delete hook waits for the deleted pods' last renewal to expire).
    #[arg(long, value_parser = WAIT_FOR_LEASE_RANGE.durations(), env = "LABELER_UNINSTALL_WAIT_FOR_LEASE", default_value = "0s")]
    pub wait_for_lease: HumanDuration,
    /// Where the Lease is.
    #[command(flatten)]
    pub leader: LeaderArgs,
    #[command(flatten)]
    pub output: Output,
}

/// The Lease, if a controller still holds it (renewed within its lease duration).
async fn held_by(client: &Client, ns: &str, args: &UninstallArgs) -> Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let Some(lease) = leases
        .get_opt(&args.leader.leader_election_lease_name)
        .await?
    else {
        return Ok(None);
    };
    let Some(spec) = lease.spec else {
        return Ok(None);
    };
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    // A renewal in the future (clocks apart) counts as fresh.
    let fresh = spec.renew_time.is_some_and(|t| {
        let age = Timestamp::now().duration_since(t.0).as_secs();
        age < 0
            || (age as u64)
                < args
                    .leader
                    .leader_election_lease_duration
                    .0
                    .as_secs()
                    .max(1)
    });
    Ok(holder.filter(|_| fresh))
}

pub async fn run(args: UninstallArgs) -> Result<()> {
    let client = crate::client::connect_default().await?;
    let ns = crate::leader::lease_namespace(&args.leader, &client);
    let deadline = std::time::Instant::now() + args.wait_for_lease.0;
    let mut holder = None;
    if !args.dry_run && !args.force {
        holder = held_by(&client, &ns, &args).await?;
        while holder.is_some() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            holder = held_by(&client, &ns, &args).await?;
        }
    }
    if let Some(holder) = holder {
        return Err(Error::Config(format!(
            "a controller still runs ({holder} holds the Lease {ns}/{}): it would write everything again. Uninstall it first (helm uninstall runs this command in its post-delete hook with uninstallHook.enabled=true), or pass --force",
            args.leader.leader_election_lease_name
        )));
    }
    let mut items: Vec<Item> = Vec::new();
    // Paginated as the controller's own list is: a whole large fleet is never one response.
    let nodes: Api<WireNode> = Api::all(client.clone());
    let mut all: Vec<LiteNode> = Vec::new();
    let nodes = &nodes;
    crate::client::pages::each_page(
        kube::api::ListParams::default(),
        crate::client::pages::PAGE,
        |p| async move { nodes.list(&p).await },
        |items| all.extend(items.into_iter().map(LiteNode::from)),
    )
    .await?;
    items.extend(cleanup::on_nodes(all.iter(), &cleanup::OnNode::ALL));
    let tainted: Vec<String> = match &args.taint.startup_taint {
        Some(t) => all
            .iter()
            .filter(|n| t.on(n))
            .map(|n| n.name_any())
            .collect(),
        None => Vec::new(),
    };
    let installation = crate::leader::installation(&args.leader, &client);
    let told = Uninstall {
        force: args.force,
        flags: &args.plugins,
    };
    items.extend(
        cleanup::leftovers(
            &client,
            cleanup::Scope::Labelled(&installation),
            Purpose::Uninstall(&told),
        )
        .await?,
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    if let Some(l) = leases
        .get_opt(&args.leader.leader_election_lease_name)
        .await?
    {
        items.push(Item {
            kind: "lease",
            name: format!("{ns}/{}", l.name_any()),
            kept: None,
        });
    }
    // The verification ledger's shards, beside the Lease.
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), &ns);
    for k in 0..crate::ledger::SHARDS {
        let name = crate::ledger::shard_name(&args.leader.leader_election_lease_name, k);
        if configmaps.get_metadata_opt(&name).await?.is_some() {
            items.push(Item {
                kind: "ledger",
                name: format!("{ns}/{name}"),
                kept: None,
            });
        }
    }
    if args.labels {
        items.extend(cleanup::nodes_with_our_keys(&client).await?);
    }
    let applied = if args.dry_run {
        cleanup::Applied::default()
    } else {
        cleanup::apply(&client, &items, &Leadership::always()).await
    };
    let failed = &applied.failed;
    let mut out = cleanup::report(
        &items,
        &applied,
        args.dry_run,
        args.output.format,
        "nothing of ours left in the cluster\n",
        serde_json::json!({ "nodesStillTainted": tainted }),
    )?;
    if args.output.format == OutputFormat::Table {
        if !args.labels {
            out.push_str("topology labels left in place (they are what schedulers read; --labels removes the ones only we own)\n");
        }
        if !tainted.is_empty() {
            out.push_str(&format!(
                "WARNING: {} node(s) still carry the startup taint ({}…): nothing will remove it now. Take it out of your NodePools / node groups first, then remove it from these nodes (kubectl taint nodes NODE KEY-)\n",
                tainted.len(),
                tainted.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    std::io::stdout().write_all(out.as_bytes())?;
    cleanup::outcome(failed.len())
}

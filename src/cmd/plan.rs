//! `plan`: what `run` would do, without writing anything (the plan itself is
//! [`crate::reconcile::planning`]'s).
//!
//! Owns: the report. Never writes to the cluster.

use std::{io::Write, sync::Arc};

use clap::Args;
use kube::Api;

use crate::{
    Error, Result,
    flags::{DecideArgs, Output, OutputFormat, OwnFlags},
    lookup::lookup_from,
    node::WireNode,
    reconcile::gate::Gate,
    reconcile::planning::{add_retired, list_nodes, plan_nodes, render_table},
};

#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub decide: DecideArgs,
    #[command(flatten)]
    pub output: Output,
    #[command(flatten)]
    pub own: OwnFlags,
}

/// `args` with the running controller's label, gate, EC2 and lookup flags (`plan` run in its
/// container with `kubectl exec`, where its credentials are too).
pub fn adopt(args: PlanArgs, run: crate::flags::RunArgs) -> PlanArgs {
    PlanArgs {
        decide: run.into(),
        ..args
    }
}

pub async fn run(args: PlanArgs) -> Result<()> {
    let args = match crate::flags::in_the_controllers_container(&args.own) {
        Some(run) => adopt(args, run),
        None => args,
    };
    let scheme = args.decide.labels.scheme().map_err(Error::Config)?;
    let client = crate::client::connect_default().await?;
    let api: Api<WireNode> = Api::all(client.clone());
    let nodes = list_nodes(&api, &scheme).await?;
    let lookup = lookup_from(&args.decide.ec2, &args.decide.lookup, Arc::new(()))
        .await
        .map_err(crate::Error::Config)?;
    let gate = Gate::from(&args.decide.gate);
    let mut plans = plan_nodes(
        &nodes,
        &scheme,
        args.decide.ec2.region.as_deref(),
        &lookup,
        &gate,
    )
    .await;
    let retired = crate::reconcile::retire::find(&Api::all(client), &scheme).await?;
    add_retired(&mut plans, retired);
    let text = match args.output.format {
        OutputFormat::Table => render_table(&plans),
        OutputFormat::Json => {
            let mut s = serde_json::to_string_pretty(&plans)
                .map_err(|e| Error::Config(format!("cannot render JSON: {e}")))?;
            s.push('\n');
            s
        }
    };
    std::io::stdout().write_all(text.as_bytes())?;
    Ok(())
}

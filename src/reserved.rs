//! Reserved capacity, watched by the leader (`--capacity-reservations`, off by default): every
//! `--reservations-interval`, the account's Capacity Reservations in each region the nodes run
//! in ([`crate::lookup::ec2::AwsTopology::reservations`], paced by the limiter every EC2 call
//! shares), as the gauges `reserved_instances` and `reserved_instances_joined` per reservation
//! and the deepest network node EC2 places it under, beside the nodes joined from it
//! (Karpenter's `karpenter.k8s.aws/capacity-reservation-id` label, kept in the node cache).
//!
//! Owns: the reserved-capacity gauges. Never writes to the cluster; a failed call leaves the
//! gauges as they were and is tried again at the next interval.

use std::{
    collections::BTreeSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use clap::Args;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::{
    duration::HumanDuration,
    lookup::ec2::AwsTopology,
    reconcile::Context,
    reservations::{Member, RESERVATION_LABEL, view},
};

/// Reserved capacity by network node.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReservationArgs {
    /// Watch the account's Capacity Reservations (Capacity Blocks, ODCRs): where EC2 places
    /// each before any instance runs, beside the nodes joined from it, as the metrics
    /// `reserved_instances` and `reserved_instances_joined` (leader only). Needs
    /// `ec2:DescribeCapacityReservationTopology` and `ec2:DescribeCapacityReservations`.
    #[arg(long, env = "LABELER_CAPACITY_RESERVATIONS", default_value_t = false, action = clap::ArgAction::Set)]
    #[serde(default)]
    pub capacity_reservations: bool,
    /// How often the leader asks about reservations (two calls a region, and their pages).
    #[arg(long, value_parser = crate::bounds::duration_flag("reservations-interval"), env = "LABELER_RESERVATIONS_INTERVAL", default_value = "5m")]
    pub reservations_interval: HumanDuration,
}

/// The regions to ask about: `--region`, or each region the cached nodes' zones are in.
fn regions(ctx: &Context, reader: &crate::store::NodeCache) -> BTreeSet<String> {
    if let Some(region) = &ctx.region {
        return [region.clone()].into();
    }
    reader
        .state()
        .iter()
        .filter_map(|n| n.label(crate::coverage::ZONE_LABEL))
        .filter_map(|z| crate::provider_id::region_of_zone(&z))
        .collect()
}

/// Every `every`, while this replica leads and its cache is whole: the reservations, as gauges.
pub async fn run(
    reader: crate::store::NodeCache,
    ctx: Arc<Context>,
    synced: Arc<AtomicBool>,
    ec2: AwsTopology,
    every: std::time::Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !(synced.load(Ordering::SeqCst) && ctx.leader.is_leader()) {
            continue;
        }
        let mut all = Vec::new();
        let mut failed = false;
        for region in regions(&ctx, &reader) {
            match ec2.reservations(&region).await {
                Ok(found) => all.extend(found),
                Err(e) => {
                    warn!(%region, error = %e, "cannot read the Capacity Reservations; the reserved-capacity metrics keep their last values");
                    failed = true;
                }
            }
        }
        if failed {
            continue;
        }
        let members: Vec<Member> = reader
            .state()
            .iter()
            .map(|n| Member {
                name: n.name().to_string(),
                reservation: n.label(RESERVATION_LABEL),
            })
            .collect();
        let shown = view(&all, &members);
        let series = shown.series();
        debug!(
            reservations = all.len(),
            series = series.len(),
            "reserved capacity counted"
        );
        ctx.metrics.set_reserved(&series);
    }
}

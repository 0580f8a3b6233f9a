//! Reserved capacity, watched by the leader (`--capacity-reservations`, off by default): every
//! `--reservations-interval`, the account's Capacity Reservations in each region the nodes run
//! in ([`crate::lookup::ec2::AwsTopology::reservations`], paced by the limiter every EC2 call
//! shares), as the gauges `reserved_instances` and `reserved_instances_joined` per reservation
//! and the deepest network node EC2 places it under, beside the nodes joined from it
//! (Karpenter's `karpenter.k8s.aws/capacity-reservation-id` label, kept in the node cache).
//! An active reservation no node joined from, started `--reservation-idle-after` ago or
//! longer, is a `ReservationIdle` Warning Event on the leader's Pod, repeated every
//! `--reservation-idle-after` (at least [`REPEAT_MIN`]) while it lasts: Events expire (an hour
//! by default), so a reservation idle for days keeps one in view.
//!
//! Owns: the reserved-capacity gauges and the `ReservationIdle` Event. Never writes anything
//! else to the cluster; a failed call leaves the gauges as they were and is tried again at the
//! next interval.

use crate::bounds::{Bound, DAY, secs};
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use clap::Args;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::{
    admin::events::Reason,
    duration::HumanDuration,
    lookup::ec2::AwsTopology,
    node::CachedNode,
    reconcile::Context,
    reservations::{Member, RESERVATION_LABEL, View, view},
};

/// The `ReservationIdle` Event about one reservation is repeated no more often than this.
pub(crate) const REPEAT_MIN: Duration = Duration::from_secs(600);

/// `--reservations-interval`'s range.
pub(crate) const RESERVATIONS_INTERVAL_RANGE: Bound =
    Bound::duration("reservations-interval", secs(10), secs(DAY));
/// `--reservation-idle-after`'s range.
pub(crate) const RESERVATION_IDLE_AFTER_RANGE: Bound =
    Bound::duration("reservation-idle-after", secs(10), secs(30 * DAY));

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
    pub(crate) capacity_reservations: bool,
    /// How often the leader asks about reservations (two calls a region, and their pages).
    #[arg(long, value_parser = RESERVATIONS_INTERVAL_RANGE.durations(), env = "LABELER_RESERVATIONS_INTERVAL", default_value = "5m")]
    pub(crate) reservations_interval: HumanDuration,
    /// An active reservation no node of this cluster joined from, started this long ago or
    /// longer, is a `ReservationIdle` Warning Event on the leader's Pod (repeated as often
    /// while it lasts, at least every 10 minutes).
    #[arg(long, value_parser = RESERVATION_IDLE_AFTER_RANGE.durations(), env = "LABELER_RESERVATION_IDLE_AFTER", default_value = "1h")]
    pub(crate) reservation_idle_after: HumanDuration,
}

/// Which idle reservations to record an Event about now: those not recorded in the last
/// `every` (at least [`REPEAT_MIN`]) by this leader. Forgets reservations no longer idle, so
/// one idle again is recorded again.
#[derive(Debug, Default)]
pub(crate) struct IdleReports {
    recorded: BTreeMap<String, Instant>,
}

impl IdleReports {
    /// The IDs in `idle` (now idle past the threshold) to record now, marked as recorded.
    pub(crate) fn due(&mut self, idle: &[&str], every: Duration, now: Instant) -> Vec<String> {
        let every = every.max(REPEAT_MIN);
        self.recorded.retain(|id, _| idle.contains(&id.as_str()));
        let mut due = Vec::new();
        for id in idle {
            let recorded = self.recorded.get(*id);
            if recorded.is_none_or(|at| now.saturating_duration_since(*at) >= every) {
                self.recorded.insert((*id).to_string(), now);
                due.push((*id).to_string());
            }
        }
        due
    }

    /// Leadership lost: a later term records again from its start.
    pub(crate) fn forget(&mut self) {
        self.recorded.clear();
    }
}

/// The regions to ask about: `--region`, or each region the cached nodes' zones are in.
fn regions(ctx: &Context, nodes: &[Arc<CachedNode>]) -> BTreeSet<String> {
    if let Some(region) = &ctx.region {
        return [region.clone()].into();
    }
    nodes
        .iter()
        .filter_map(|n| n.label(crate::coverage::ZONE_LABEL))
        .filter_map(|z| crate::provider_id::region_of_zone(&z))
        .collect()
}

/// Every `every`, while this replica leads and its cache is whole: the reservations, as gauges.
pub async fn run(
    reader: crate::node::store::NodeCache,
    ctx: Arc<Context>,
    synced: Arc<AtomicBool>,
    ec2: Arc<AwsTopology>,
    args: ReservationArgs,
) {
    let mut tick = tokio::time::interval(args.reservations_interval.0);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let idle_after = args.reservation_idle_after.0;
    let mut reports = IdleReports::default();
    loop {
        tick.tick().await;
        if !ctx.leader.is_leader() {
            reports.forget();
            continue;
        }
        if !synced.load(Ordering::SeqCst) {
            continue;
        }
        // One walk of the cache a round: the regions to ask, and the nodes joined from a
        // reservation (the view needs no other).
        let nodes = reader.state();
        let mut all = Vec::new();
        let mut failed = false;
        for region in regions(&ctx, &nodes) {
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
        let members: Vec<Member> = nodes
            .iter()
            .filter_map(|n| {
                Some(Member {
                    reservation: Some(n.label(RESERVATION_LABEL)?),
                    name: n.name().to_string(),
                })
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
        report_idle(&ctx, &shown, idle_after, &mut reports);
    }
}

/// A `ReservationIdle` Event on this replica's Pod for each reservation idle past `after` and
/// due again (see [`IdleReports`]); logged as well, for a controller run outside a Pod.
fn report_idle(ctx: &Context, shown: &View, after: Duration, reports: &mut IdleReports) {
    let idle = shown.idle_past(SystemTime::now(), after);
    let ids: Vec<&str> = idle
        .iter()
        .map(|(row, _)| row.reservation.id.as_str())
        .collect();
    let due = reports.due(&ids, after, Instant::now());
    for (row, for_) in idle {
        if !due.contains(&row.reservation.id) {
            continue;
        }
        let note = row.idle_note(for_);
        warn!(reservation = %row.reservation.id, "{note}");
        if let Some(pod) = &ctx.pod {
            ctx.events.publish(
                Reason::ReservationIdle,
                "WatchReservations",
                &note,
                pod.clone(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn an_idle_reservation_is_reported_once_per_interval_and_again_after_a_pause() {
        let mut r = IdleReports::default();
        let t0 = Instant::now();
        let every = 60 * MIN;
        assert_eq!(r.due(&["cr-a", "cr-b"], every, t0), ["cr-a", "cr-b"]);
        assert!(r.due(&["cr-a", "cr-b"], every, t0 + 59 * MIN).is_empty());
        assert_eq!(
            r.due(&["cr-a", "cr-b"], every, t0 + every),
            ["cr-a", "cr-b"]
        );
        // cr-a is joined (not idle) for a while, then idle again: recorded at once.
        assert_eq!(
            r.due(&["cr-b"], every, t0 + every + MIN),
            Vec::<String>::new()
        );
        assert_eq!(
            r.due(&["cr-a", "cr-b"], every, t0 + every + 2 * MIN),
            ["cr-a"]
        );
    }

    #[test]
    fn a_short_threshold_still_repeats_no_more_than_every_ten_minutes() {
        let mut r = IdleReports::default();
        let t0 = Instant::now();
        assert_eq!(r.due(&["cr-a"], MIN, t0), ["cr-a"]);
        assert!(r.due(&["cr-a"], MIN, t0 + 5 * MIN).is_empty());
        assert_eq!(r.due(&["cr-a"], MIN, t0 + REPEAT_MIN), ["cr-a"]);
    }

    #[test]
    fn a_new_term_reports_again() {
        let mut r = IdleReports::default();
        let t0 = Instant::now();
        assert_eq!(r.due(&["cr-a"], MIN, t0), ["cr-a"]);
        r.forget();
        assert_eq!(r.due(&["cr-a"], MIN, t0 + MIN), ["cr-a"]);
    }
}

//! The account's Capacity Reservations in one region, where EC2 places them and what they
//! hold: `DescribeCapacityReservationTopology` (network nodes, state, capacity block; 10 a page,
//! as documented) joined with `DescribeCapacityReservations` (instance counts; 1,000 a page).
//! Needs `ec2:DescribeCapacityReservationTopology` and `ec2:DescribeCapacityReservations`.
//!
//! Owns: reading those two calls' pages into [`Reservation`]s. Never caches or retries; each
//! page waits for the shared limiter's token, as every EC2 call does.

use std::collections::BTreeMap;

use ec2_topology_core::reservations::Reservation;

use super::{
    ec2::{AwsTopology, Listing, Pace},
    query::{number, strings, text, time},
};
use crate::topology::Ec2Error;

/// Pages of either call followed before giving up: 10,000 reservations of the topology call
/// (10 a page). Guards against an endpoint that keeps sending `nextToken`.
const MAX_PAGES: usize = 1_000;
/// Items a topology page may carry (documented range 1–10).
const TOPOLOGY_PAGE: u32 = 10;
/// Items a reservations page may carry (documented range 5–1,000).
const RESERVATIONS_PAGE: u32 = 1_000;

impl AwsTopology {
    /// Every Capacity Reservation of the account in `region`, by ID: placed (network nodes
    /// from the topology call; none for an unsupported type or one neither active nor
    /// pending, or one only the reservations call lists) and counted (from the reservations
    /// call, when it lists it).
    pub async fn reservations(&self, region: &str) -> Result<Vec<Reservation>, Ec2Error> {
        const TOPOLOGY: &str = "DescribeCapacityReservationTopology";
        const RESERVATIONS: &str = "DescribeCapacityReservations";
        let at = &self.client(region)?;
        let mut by_id: BTreeMap<String, Reservation> = BTreeMap::new();
        let page = |size: u32| vec![("MaxResults".to_string(), size.to_string())];
        self.follow(
            region,
            at,
            Listing {
                what: TOPOLOGY,
                action: TOPOLOGY,
                params: page(TOPOLOGY_PAGE),
                set: "capacityReservationSet",
                pace: Pace::Every,
                max_pages: MAX_PAGES,
            },
            |item| {
                let Some(id) = text(item, "capacityReservationId") else {
                    return Err(Ec2Error::BadResponse(
                        "EC2 described a Capacity Reservation without its ID".into(),
                    ));
                };
                by_id.insert(
                    id.to_string(),
                    Reservation {
                        id: id.to_string(),
                        instance_type: owned(item, "instanceType"),
                        state: owned(item, "state"),
                        availability_zone: owned(item, "availabilityZone"),
                        capacity_block_id: owned(item, "capacityBlockId"),
                        group_name: owned(item, "groupName"),
                        network_nodes: strings(item, "networkNodeSet")?,
                        total: None,
                        available: None,
                        start: None,
                    },
                );
                Ok(())
            },
        )
        .await?;
        self.follow(
            region,
            at,
            Listing {
                what: RESERVATIONS,
                action: RESERVATIONS,
                params: page(RESERVATIONS_PAGE),
                set: "capacityReservationSet",
                pace: Pace::Every,
                max_pages: MAX_PAGES,
            },
            |item| {
                let Some(id) = text(item, "capacityReservationId") else {
                    return Ok(());
                };
                // One the topology call left out (it describes pending and active ones) is
                // still the account's: listed without network nodes, so that a node carrying
                // its ID is not called a stranger.
                let r = by_id.entry(id.to_string()).or_insert_with(|| Reservation {
                    id: id.to_string(),
                    instance_type: owned(item, "instanceType"),
                    availability_zone: owned(item, "availabilityZone"),
                    capacity_block_id: owned(item, "capacityBlockId"),
                    ..Reservation::default()
                });
                let count = |name| -> Result<Option<u32>, Ec2Error> {
                    Ok(number(item, name)?.and_then(|n| u32::try_from(n).ok()))
                };
                r.total = count("totalInstanceCount")?;
                r.available = count("availableInstanceCount")?;
                r.start = time(item, "startDate")?;
                if r.state.is_none() {
                    r.state = owned(item, "state");
                }
                Ok(())
            },
        )
        .await?;
        Ok(by_id.into_values().collect())
    }
}

/// The text of `item`'s child `name`, owned.
fn owned(item: roxmltree::Node<'_, '_>, name: &str) -> Option<String> {
    text(item, name).map(str::to_owned)
}

//! The account's Capacity Reservations in one region, where EC2 places them and what they
//! hold: `DescribeCapacityReservationTopology` (network nodes, state, capacity block; 10 a page,
//! as documented) joined with `DescribeCapacityReservations` (instance counts; 1,000 a page).
//! Needs `ec2:DescribeCapacityReservationTopology` and `ec2:DescribeCapacityReservations`.
//!
//! Owns: reading those two calls' pages into [`Reservation`]s. Never caches or retries; each
//! page after the first waits for the shared limiter's token, as every EC2 call does.

use std::collections::BTreeMap;

use ec2_topology_core::reservations::Reservation;

use super::ec2::{AwsTopology, Pace, classify};
use crate::topology::Ec2Error;

/// Pages of either call followed before giving up: 10,000 reservations of the topology call
/// (10 a page). Guards against an endpoint that keeps sending `nextToken`.
const MAX_PAGES: usize = 1_000;
/// Items a topology page may carry (documented range 1–10).
const TOPOLOGY_PAGE: i32 = 10;
/// Items a reservations page may carry (documented range 5–1,000).
const RESERVATIONS_PAGE: i32 = 1_000;

impl AwsTopology {
    /// Every Capacity Reservation of the account in `region`, by ID: placed (network nodes
    /// from the topology call; none for an unsupported type or one neither active nor
    /// pending, or one only the reservations call lists) and counted (from the reservations
    /// call, when it lists it).
    pub async fn reservations(&self, region: &str) -> Result<Vec<Reservation>, Ec2Error> {
        let client = self.client(region)?;
        let mut by_id: BTreeMap<String, Reservation> = BTreeMap::new();
        let text = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_owned);
        self.follow(
            "DescribeCapacityReservationTopology",
            Pace::Every,
            MAX_PAGES,
            |token| {
                let request = client
                    .describe_capacity_reservation_topology()
                    .max_results(TOPOLOGY_PAGE)
                    .set_next_token(token);
                async move { request.send().await.map_err(classify) }
            },
            |page| {
                for item in page.capacity_reservations() {
                    let Some(id) = item.capacity_reservation_id().filter(|s| !s.is_empty()) else {
                        return Err(Ec2Error::BadResponse(
                            "EC2 described a Capacity Reservation without its ID".into(),
                        ));
                    };
                    by_id.insert(
                        id.to_string(),
                        Reservation {
                            id: id.to_string(),
                            instance_type: text(item.instance_type()),
                            state: text(item.state()),
                            availability_zone: text(item.availability_zone()),
                            capacity_block_id: text(item.capacity_block_id()),
                            group_name: text(item.group_name()),
                            network_nodes: item.network_nodes().to_vec(),
                            total: None,
                            available: None,
                            start: None,
                        },
                    );
                }
                Ok(page.next_token().map(str::to_owned))
            },
        )
        .await?;
        self.follow(
            "DescribeCapacityReservations",
            Pace::Every,
            MAX_PAGES,
            |token| {
                let request = client
                    .describe_capacity_reservations()
                    .max_results(RESERVATIONS_PAGE)
                    .set_next_token(token);
                async move { request.send().await.map_err(classify) }
            },
            |page| {
                for item in page.capacity_reservations() {
                    let Some(id) = item.capacity_reservation_id().filter(|s| !s.is_empty()) else {
                        continue;
                    };
                    // One the topology call left out (it describes pending and active ones) is
                    // still the account's: listed without network nodes, so that a node carrying
                    // its ID is not called a stranger.
                    let r = by_id.entry(id.to_string()).or_insert_with(|| Reservation {
                        id: id.to_string(),
                        instance_type: text(item.instance_type()),
                        availability_zone: text(item.availability_zone()),
                        capacity_block_id: text(item.capacity_block_id()),
                        ..Reservation::default()
                    });
                    let count = |n: Option<i32>| n.and_then(|n| u32::try_from(n).ok());
                    r.total = count(item.total_instance_count());
                    r.available = count(item.available_instance_count());
                    r.start = item
                        .start_date()
                        .and_then(|t| std::time::SystemTime::try_from(*t).ok());
                    if r.state.is_none() {
                        r.state = item.state().map(|s| s.as_str().to_owned());
                    }
                }
                Ok(page.next_token().map(str::to_owned))
            },
        )
        .await?;
        Ok(by_id.into_values().collect())
    }
}

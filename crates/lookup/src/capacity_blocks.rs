//! The account's Capacity Blocks (UltraServers), for the blocks named:
//! `DescribeCapacityBlockStatus`, each block's `interconnectStatus` (`ok`, `impaired`,
//! `insufficient-data`) and `totalCapacity` (needs `ec2:DescribeCapacityBlockStatus`); and
//! `DescribeCapacityBlocks`, each block's UltraServer type, state and end date (needs
//! `ec2:DescribeCapacityBlocks`).
//!
//! Owns: reading those calls' pages into [`Found`] and [`Shapes`]. Never caches or retries; each page
//! waits for the shared limiter's token, as every EC2 call does. A block EC2 leaves out of its
//! answer (one it does not know: the API Reference names no error for it) is absent from the
//! result, never taken as healthy.

use std::collections::BTreeMap;

use super::{
    ec2::{AwsTopology, Listing, Pace},
    query::{Endpoint, list, number, text, time},
};
use crate::topology::Ec2Error;

/// Capacity Block IDs a request names (the API Reference sets no limit; a bounded request
/// stays small).
const IDS_PER_CALL: usize = 100;
/// Pages followed for one request before giving up (guards against an endpoint that keeps
/// sending `nextToken`).
const MAX_PAGES: usize = 100;

/// What EC2 says of a Capacity Block's accelerator interconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Interconnect {
    Ok,
    Impaired,
    /// EC2 cannot tell (and a value this build does not know): never acted on.
    InsufficientData,
}

impl Interconnect {
    pub fn as_str(self) -> &'static str {
        match self {
            Interconnect::Ok => "ok",
            Interconnect::Impaired => "impaired",
            Interconnect::InsufficientData => "insufficient-data",
        }
    }
}

/// What one region's round found: the blocks EC2 described, and each request that failed
/// with the IDs it named (only those are unknown this round).
#[derive(Debug, Default)]
pub struct Found {
    pub statuses: BTreeMap<String, Interconnect>,
    /// Each described block's `totalCapacity` (its instances, available or not), when EC2 gave
    /// a positive one.
    pub capacities: BTreeMap<String, u32>,
    pub failed: Vec<(Vec<String>, Ec2Error)>,
}

/// What `DescribeCapacityBlocks` says of one block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shape {
    /// The UltraServer type (`u-p6e-gb200x72`, `u-trn2x64`); `None` for a block of instances.
    pub ultraserver_type: Option<String>,
    /// When the block ends (its instances are terminated then), RFC 3339.
    pub end: Option<String>,
    /// Its state (`active`, `scheduled`, …), as EC2 spells it.
    pub state: Option<String>,
}

/// What one region's `DescribeCapacityBlocks` round found, as [`Found`].
#[derive(Debug, Default)]
pub struct Shapes {
    pub blocks: BTreeMap<String, Shape>,
    pub failed: Vec<(Vec<String>, Ec2Error)>,
}

impl AwsTopology {
    /// The interconnect of each of `ids` (Capacity Block IDs) in `region` that EC2 describes,
    /// a request of at most [`IDS_PER_CALL`] IDs at a time: one that fails leaves only its own
    /// IDs unknown. No `MaxResults` beside the IDs (some EC2 Describe calls refuse the two
    /// together; a request of 100 IDs is followed page by page whatever the page size).
    pub async fn interconnects(&self, region: &str, ids: &[String]) -> Found {
        let mut out = Found::default();
        let at = match self.client(region) {
            Ok(at) => at,
            Err(e) => {
                out.failed.push((ids.to_vec(), e));
                return out;
            }
        };
        for chunk in ids.chunks(IDS_PER_CALL) {
            let mut statuses = BTreeMap::new();
            let mut capacities = BTreeMap::new();
            match self
                .chunk(region, &at, chunk, &mut statuses, &mut capacities)
                .await
            {
                Ok(()) => {
                    out.statuses.extend(statuses);
                    out.capacities.extend(capacities);
                }
                Err(e) => out.failed.push((chunk.to_vec(), e)),
            }
        }
        out
    }

    /// What `DescribeCapacityBlocks` says of each of `ids` in `region` (type, end, state), a
    /// request of at most [`IDS_PER_CALL`] IDs at a time, as [`AwsTopology::interconnects`].
    pub async fn shapes(&self, region: &str, ids: &[String]) -> Shapes {
        let mut out = Shapes::default();
        let at = match self.client(region) {
            Ok(at) => at,
            Err(e) => {
                out.failed.push((ids.to_vec(), e));
                return out;
            }
        };
        for chunk in ids.chunks(IDS_PER_CALL) {
            let mut blocks = BTreeMap::new();
            match self.shape_chunk(region, &at, chunk, &mut blocks).await {
                Ok(()) => out.blocks.extend(blocks),
                Err(e) => out.failed.push((chunk.to_vec(), e)),
            }
        }
        out
    }

    async fn shape_chunk(
        &self,
        region: &str,
        at: &Endpoint,
        ids: &[String],
        out: &mut BTreeMap<String, Shape>,
    ) -> Result<(), Ec2Error> {
        const ACTION: &str = "DescribeCapacityBlocks";
        self.follow(
            region,
            at,
            Listing {
                what: ACTION,
                action: ACTION,
                params: list("CapacityBlockId", ids),
                set: "capacityBlockSet",
                pace: Pace::Every,
                max_pages: MAX_PAGES,
            },
            |item| {
                let Some(id) = text(item, "capacityBlockId") else {
                    return Err(Ec2Error::BadResponse(
                        "EC2 described a Capacity Block without its ID".into(),
                    ));
                };
                let end = time(item, "endDate")?.map(humantime::format_rfc3339_seconds);
                out.insert(
                    id.to_string(),
                    Shape {
                        ultraserver_type: text(item, "ultraserverType").map(str::to_owned),
                        end: end.map(|t| t.to_string()),
                        state: text(item, "state").map(str::to_owned),
                    },
                );
                Ok(())
            },
        )
        .await
    }

    async fn chunk(
        &self,
        region: &str,
        at: &Endpoint,
        ids: &[String],
        out: &mut BTreeMap<String, Interconnect>,
        capacities: &mut BTreeMap<String, u32>,
    ) -> Result<(), Ec2Error> {
        const ACTION: &str = "DescribeCapacityBlockStatus";
        self.follow(
            region,
            at,
            Listing {
                what: ACTION,
                action: ACTION,
                params: list("CapacityBlockId", ids),
                set: "capacityBlockStatusSet",
                pace: Pace::Every,
                max_pages: MAX_PAGES,
            },
            |item| {
                let Some(id) = text(item, "capacityBlockId") else {
                    return Err(Ec2Error::BadResponse(
                        "EC2 described a Capacity Block's status without its ID".into(),
                    ));
                };
                // A value this build does not know is never acted on.
                let status = match text(item, "interconnectStatus") {
                    Some("ok") => Interconnect::Ok,
                    Some("impaired") => Interconnect::Impaired,
                    _ => Interconnect::InsufficientData,
                };
                out.insert(id.to_string(), status);
                if let Some(n) = number(item, "totalCapacity")?
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| *n > 0)
                {
                    capacities.insert(id.to_string(), n);
                }
                Ok(())
            },
        )
        .await
    }
}

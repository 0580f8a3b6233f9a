//! The accelerator interconnect of the account's Capacity Blocks (UltraServers):
//! `DescribeCapacityBlockStatus` for the blocks named, each block's `interconnectStatus`
//! (`ok`, `impaired`, `insufficient-data`). Needs `ec2:DescribeCapacityBlockStatus`.
//!
//! Owns: reading that call's pages into [`Interconnect`]s. Never caches or retries; each page
//! waits for the shared limiter's token, as every EC2 call does. A block EC2 leaves out of its
//! answer (one it does not know: the API Reference names no error for it) is absent from the
//! result, never taken as healthy.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::CapacityBlockInterconnectStatus;

use super::ec2::{AwsTopology, Pace, classify};
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
    pub failed: Vec<(Vec<String>, Ec2Error)>,
}

impl AwsTopology {
    /// The interconnect of each of `ids` (Capacity Block IDs) in `region` that EC2 describes,
    /// a request of at most [`IDS_PER_CALL`] IDs at a time: one that fails leaves only its own
    /// IDs unknown. No `MaxResults` beside the IDs (some EC2 Describe calls refuse the two
    /// together; a request of 100 IDs is followed page by page whatever the page size).
    pub async fn interconnects(&self, region: &str, ids: &[String]) -> Found {
        let mut out = Found::default();
        let client = match self.client(region) {
            Ok(c) => c,
            Err(e) => {
                out.failed.push((ids.to_vec(), e));
                return out;
            }
        };
        for chunk in ids.chunks(IDS_PER_CALL) {
            let mut statuses = BTreeMap::new();
            match self.chunk(&client, chunk, &mut statuses).await {
                Ok(()) => out.statuses.extend(statuses),
                Err(e) => out.failed.push((chunk.to_vec(), e)),
            }
        }
        out
    }

    async fn chunk(
        &self,
        client: &aws_sdk_ec2::Client,
        ids: &[String],
        out: &mut BTreeMap<String, Interconnect>,
    ) -> Result<(), Ec2Error> {
        self.follow(
            "DescribeCapacityBlockStatus",
            Pace::Every,
            MAX_PAGES,
            |token| {
                let request = client
                    .describe_capacity_block_status()
                    .set_capacity_block_ids(Some(ids.to_vec()))
                    .set_next_token(token);
                async move { request.send().await.map_err(classify) }
            },
            |page| {
                for item in page.capacity_block_statuses() {
                    let Some(id) = item.capacity_block_id().filter(|s| !s.is_empty()) else {
                        return Err(Ec2Error::BadResponse(
                            "EC2 described a Capacity Block's status without its ID".into(),
                        ));
                    };
                    let status = match item.interconnect_status() {
                        Some(CapacityBlockInterconnectStatus::Ok) => Interconnect::Ok,
                        Some(CapacityBlockInterconnectStatus::Impaired) => Interconnect::Impaired,
                        _ => Interconnect::InsufficientData,
                    };
                    out.insert(id.to_string(), status);
                }
                Ok(page.next_token().map(str::to_owned))
            },
        )
        .await
    }
}

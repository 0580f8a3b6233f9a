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

use super::ec2::{AwsTopology, classify};
use crate::topology::Ec2Error;

/// Capacity Block IDs a request names (the API Reference sets no limit; a bounded request
/// stays small).
const IDS_PER_CALL: usize = 100;
/// Items a page may carry (documented range 1–1,000).
const PAGE: i32 = 1_000;
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

impl AwsTopology {
    /// The interconnect of each of `ids` (Capacity Block IDs) in `region` that EC2 describes.
    pub async fn interconnects(
        &self,
        region: &str,
        ids: &[String],
    ) -> Result<BTreeMap<String, Interconnect>, Ec2Error> {
        let client = self.client(region)?;
        let mut out = BTreeMap::new();
        for chunk in ids.chunks(IDS_PER_CALL) {
            let mut next: Option<String> = None;
            let mut pages = 0;
            loop {
                self.pace().await;
                let page = client
                    .describe_capacity_block_status()
                    .set_capacity_block_ids(Some(chunk.to_vec()))
                    .max_results(PAGE)
                    .set_next_token(next.take())
                    .send()
                    .await
                    .map_err(classify)?;
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
                pages += 1;
                next = page
                    .next_token()
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned);
                if next.is_none() {
                    break;
                }
                if pages >= MAX_PAGES {
                    return Err(Ec2Error::BadResponse(format!(
                        "DescribeCapacityBlockStatus: still paginating after {MAX_PAGES} pages"
                    )));
                }
            }
        }
        Ok(out)
    }
}

//! What a node needs, as far as reading can tell: shared by the reconciler and `plan`.
//!
//! Owns: the read-only part of a reconcile. Never writes.

use std::{collections::BTreeMap, time::Duration};

use crate::{
    labels::{self, DeriveError, Desired, LabelScheme, NodeDiff},
    lookup::{Lookup, Resolved},
    node::LiteNode,
    provider_id::{self, SkipReason},
    topology::Ec2Error,
};

/// What a node needs, as far as reading can tell.
// Short-lived, one per reconcile: boxing `Ready` would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Assessment {
    /// Not an EC2 instance we can look up.
    Skipped(SkipReason),
    /// EC2 does not describe the instance (yet); labels are left as they are.
    NotDescribed {
        instance_id: String,
        retry_in: Duration,
    },
    /// EC2 refused the instance ID itself (`InvalidInstanceID.*`); labels are left as they are
    /// and the ID is kept out of other calls until `retry_in`.
    Rejected {
        instance_id: String,
        error: Ec2Error,
        retry_in: Duration,
    },
    /// EC2's answer cannot be turned into labels; labels are left as they are.
    Invalid {
        instance_id: String,
        error: DeriveError,
    },
    /// The labels the node should carry and what must change to get there.
    Ready {
        instance_id: String,
        desired: Desired,
        diff: NodeDiff,
        /// A refresh failed; `desired` comes from the earlier answer.
        refresh_error: Option<Ec2Error>,
        /// EC2's answer may still be settling (a late field missing): check again this soon.
        recheck_in: Option<Duration>,
    },
}

impl Assessment {
    /// The instance it is about (`None` for a node that is not one we can look up).
    pub fn instance_id(&self) -> Option<&str> {
        match self {
            Assessment::Skipped(_) => None,
            Assessment::NotDescribed { instance_id, .. }
            | Assessment::Rejected { instance_id, .. }
            | Assessment::Invalid { instance_id, .. }
            | Assessment::Ready { instance_id, .. } => Some(instance_id),
        }
    }
}

pub(super) fn labels_of(node: &LiteNode) -> BTreeMap<String, String> {
    node.labels().into_owned()
}

pub(super) fn annotations_of(node: &LiteNode) -> BTreeMap<String, String> {
    node.metadata.annotations.clone().unwrap_or_default()
}

pub fn boot_id(node: &LiteNode) -> Option<&str> {
    node.boot_id()
}

pub fn provider_id_of(node: &LiteNode) -> &str {
    node.provider_id()
}

/// The instance behind a node, as its lookup needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub region: String,
    pub instance_id: String,
    /// The node carries a capacity-block label already (an answer without one is asked for
    /// again soon).
    pub capacity_block_expected: bool,
}

/// The instance to look up for `node`: `Ok(Err(_))` when the node is not an EC2 instance we
/// can look up, `Err` when its region cannot be told.
pub fn target(
    node: &LiteNode,
    scheme: &LabelScheme,
    region: Option<&str>,
) -> Result<Result<Target, SkipReason>, Ec2Error> {
    let instance = match provider_id::parse(provider_id_of(node)) {
        Ok(i) => i,
        Err(reason) => return Ok(Err(reason)),
    };
    let region = region
        .map(str::to_owned)
        .or_else(|| {
            instance
                .zone
                .as_deref()
                .and_then(provider_id::region_of_zone)
        })
        .ok_or(Ec2Error::NoRegion)?;
    let capacity_block_expected = scheme
        .capacity_block_key
        .as_ref()
        .is_some_and(|k| node.has_label(k));
    Ok(Ok(Target {
        region,
        instance_id: instance.instance_id,
        capacity_block_expected,
    }))
}

/// Read-only part of a reconcile, shared with `plan`. `held`: the node is held back from
/// scheduling until labelled (its lookup is not kept waiting for a fuller call).
pub async fn assess(
    node: &LiteNode,
    scheme: &LabelScheme,
    region: Option<&str>,
    lookup: &Lookup,
    held: bool,
) -> Result<Assessment, Ec2Error> {
    let Target {
        region,
        instance_id,
        capacity_block_expected,
    } = match target(node, scheme, region)? {
        Ok(t) => t,
        Err(reason) => return Ok(Assessment::Skipped(reason)),
    };
    match lookup
        .resolve_expecting(
            &region,
            &instance_id,
            boot_id(node),
            capacity_block_expected,
            held,
        )
        .await?
    {
        Resolved::NotDescribed { retry_in, .. } => Ok(Assessment::NotDescribed {
            instance_id,
            retry_in,
        }),
        Resolved::Rejected {
            error, retry_in, ..
        } => Ok(Assessment::Rejected {
            instance_id,
            error,
            retry_in,
        }),
        Resolved::Topology {
            topology,
            refresh_error,
            recheck_in,
        } => match labels::desired(scheme, &topology) {
            Ok(mut desired) => {
                let labels = labels_of(node);
                labels::settle(scheme, &labels, &mut desired);
                let diff = labels::diff(scheme, &labels, &annotations_of(node), &desired);
                Ok(Assessment::Ready {
                    instance_id,
                    desired,
                    diff,
                    refresh_error,
                    recheck_in,
                })
            }
            Err(error) => Ok(Assessment::Invalid { instance_id, error }),
        },
    }
}

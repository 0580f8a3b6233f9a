//! What a node needs, as far as reading can tell: shared by the reconciler and `plan`.
//!
//! Owns: the read-only part of a reconcile. Never writes.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tracing::debug;

use crate::{
    labels::{self, DeriveError, Desired, LabelScheme, NodeDiff},
    lookup::{Lookup, Resolved},
    metrics::Metrics,
    node::LiteNode,
    provider_id::{self, SkipReason},
    state::Distrust,
    topology::{Ec2Error, InstanceTopology},
    verified::{RecordError, RecordKey, VERIFIED_KEY, Verified},
};

/// What a node needs, as far as reading can tell.
// Short-lived, one per reconcile: boxing `Ready` would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Assessment {
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
        /// EC2's answer (without its instance ID, shared with the lookup's cache) and since
        /// when EC2 has given it in this boot: the node's verification record, kept in the
        /// ledger once the node carries `desired`.
        answer: Arc<InstanceTopology>,
        verified_at: u64,
    },
}

impl Assessment {
    /// The instance it is about (`None` for a node that is not one we can look up).
    pub(crate) fn instance_id(&self) -> Option<&str> {
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
    node.annotations().into_owned()
}

pub fn boot_id(node: &LiteNode) -> Option<&str> {
    node.boot_id()
}

pub(crate) fn provider_id_of(node: &LiteNode) -> &str {
    node.provider_id()
}

/// The instance behind a node, as its lookup needs it (read in place: the node's providerID,
/// the configured region).
#[derive(Debug, Clone, PartialEq)]
pub struct Target<'a> {
    pub region: &'a str,
    pub instance_id: &'a str,
    /// The node carries a capacity-block label already (an answer without one is asked for
    /// again soon).
    pub(crate) capacity_block_expected: bool,
}

/// The instance to look up for `node`: `Ok(Err(_))` when the node is not an EC2 instance we
/// can look up, `Err` when its region cannot be told.
pub fn target<'a>(
    node: &'a LiteNode,
    scheme: &LabelScheme,
    region: Option<&'a str>,
) -> Result<Result<Target<'a>, SkipReason>, Ec2Error> {
    let (zone, instance_id) = match provider_id::parse_borrowed(provider_id_of(node)) {
        Ok(i) => i,
        Err(reason) => return Ok(Err(reason)),
    };
    let region = region
        .or_else(|| zone.and_then(provider_id::region_of_zone_borrowed))
        .ok_or(Ec2Error::NoRegion)?;
    let capacity_block_expected = scheme
        .capacity_block_key
        .as_ref()
        .is_some_and(|k| node.has_label(k));
    Ok(Ok(Target {
        region,
        instance_id,
        capacity_block_expected,
    }))
}

/// How long after its creation a node that carries none of our layer labels yet counts as
/// joining: its lookup goes ahead of the walk, resync or install queued before it.
pub(super) const JOINING_FOR: Duration = Duration::from_secs(10 * 60);

/// Is `node` joining at `now`: created less than [`JOINING_FOR`] ago, and without any of our
/// layer labels? (A node without a creation time is not: the API server always sets one.)
pub(super) fn joining(node: &LiteNode, scheme: &LabelScheme, now: &Time) -> bool {
    node.metadata.creation_timestamp.is_some()
        && super::gate::age(node, now) < JOINING_FOR
        && !node
            .label_pairs()
            .any(|(k, _)| scheme.layer_index(k).is_some())
}

/// Read-only part of a reconcile, shared with `plan`. `urgent`: the node is joining, or held
/// back from scheduling until labelled (its lookup goes ahead of the others waiting, and is
/// not kept waiting for a fuller call).
pub(crate) async fn assess(
    node: &LiteNode,
    scheme: &LabelScheme,
    region: Option<&str>,
    lookup: &Lookup,
    urgent: bool,
) -> Result<Assessment, Ec2Error> {
    let Target {
        region,
        instance_id,
        capacity_block_expected,
    } = match target(node, scheme, region)? {
        Ok(t) => t,
        Err(reason) => return Ok(Assessment::Skipped(reason)),
    };
    let resolved = lookup
        .resolve_expecting(
            region,
            instance_id,
            boot_id(node),
            capacity_block_expected,
            urgent,
        )
        .await?;
    let instance_id = instance_id.to_owned();
    match resolved {
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
            answer,
            refresh_error,
            recheck_in,
            verified_at,
        } => match derive(node, scheme, &answer) {
            Ok((desired, diff)) => Ok(Assessment::Ready {
                instance_id,
                desired,
                diff,
                refresh_error,
                recheck_in,
                answer,
                verified_at,
            }),
            Err(error) => Ok(Assessment::Invalid { instance_id, error }),
        },
    }
}

/// What `node` should carry for EC2's `answer` (its instance ID is not read), and what must
/// change to get there. The verification record is not among it: it is kept in the ledger (`crate::ledger`),
/// and one an earlier version left on the node is dropped by our next apply, never written
/// for alone (see `labels::diff`).
fn derive(
    node: &LiteNode,
    scheme: &LabelScheme,
    answer: &InstanceTopology,
) -> Result<(Desired, NodeDiff), DeriveError> {
    let mut desired = labels::desired(scheme, answer)?;
    labels::settle_with(scheme, |k| node.label_ref(k), &mut desired);
    let diff = labels::diff_pairs(
        scheme,
        node.label_pairs(),
        node.annotation_pairs(),
        &desired,
    );
    Ok((desired, diff))
}

/// The answer `node`'s verification record holds, if it can be taken as this process's own: a
/// whole record, sealed with the record key, about the instance `target` names and the boot the
/// node runs now, of a complete answer, and the node carries exactly what that answer makes of
/// it. The record is the ledger's (`recorded`, its shard's seal checked when it was read); a
/// node the ledger holds none for is judged by the annotation an earlier version wrote on it
/// (read for one release, so that an upgrade asks EC2 nothing either).
///
/// Its age plays no part: an instance keeps its place in the network while it runs in one boot
/// (only a stop and start, a new boot ID, can move it), and the taker re-verifies every answer
/// it took within a TTL of taking it (see `Cache::seed`), as it would its own.
pub fn trusted(
    node: &LiteNode,
    scheme: &LabelScheme,
    target: &Target,
    key: Option<&RecordKey>,
    recorded: Option<Verified>,
) -> Result<Verified, Distrust> {
    let verified = match recorded {
        Some(v) => {
            key.ok_or(Distrust::NoKey)?;
            v
        }
        None => {
            let value = node.annotation(VERIFIED_KEY).ok_or(Distrust::Missing)?;
            let key = key.ok_or(Distrust::NoKey)?;
            Verified::open(&value, key).map_err(|e| match e {
                RecordError::Unreadable(_) => Distrust::Unreadable,
                RecordError::OtherVersion(_) => Distrust::OtherVersion,
                RecordError::Tampered => Distrust::Tampered,
                RecordError::OtherKey(_) => Distrust::OtherKey,
            })?
        }
    };
    if verified.topology.instance_id != target.instance_id {
        return Err(Distrust::OtherInstance);
    }
    // Both known and equal: a record without a boot ID (or a node that reports none yet)
    // cannot tell a reboot.
    match (verified.boot_id.as_deref(), boot_id(node)) {
        (Some(a), Some(b)) if a == b => {}
        _ => return Err(Distrust::OtherBoot),
    }
    if verified.topology.settling(target.capacity_block_expected) {
        return Err(Distrust::Incomplete);
    }
    match derive(node, scheme, &verified.topology) {
        Ok((_, diff)) if diff.is_empty() => Ok(verified),
        _ => Err(Distrust::LabelsChanged),
    }
}

/// Before `node`'s instance is asked about for the first time in this process: take its
/// verification record as the answer when [`trusted`] (counted, with why not, in
/// `verification_records_total`). Nothing when the lookup knows the instance already.
pub(super) fn adopt(
    node: &LiteNode,
    scheme: &LabelScheme,
    target: &Target,
    lookup: &Lookup,
    ledger: &crate::ledger::Ledger,
    metrics: &Metrics,
) {
    if lookup.knows(target.instance_id) {
        return;
    }
    match trusted(
        node,
        scheme,
        target,
        lookup.record_key(),
        ledger.get(node.name()),
    ) {
        Ok(verified) => {
            // Taken unless another reconcile's answer got there first (then that one stands).
            if lookup.adopt(verified) {
                metrics.verification_record("trusted");
            }
        }
        Err(why) => {
            debug!(node = %node.metadata.name.as_deref().unwrap_or_default(), instance = %target.instance_id, why = why.as_str(),
                "the node's verification record is not taken: its instance is asked about");
            metrics.verification_record(why.as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(created_s_ago: Option<i64>, labels: &[(&str, &str)], now: &Time) -> LiteNode {
        crate::testing::nodes::unnamed()
            .created(created_s_ago, now)
            .labels(labels)
            .build()
    }

    #[test]
    fn a_node_is_joining_while_new_and_without_our_layer_labels() {
        let scheme = LabelScheme::default();
        let now = Time("2026-12-03T12:00:00Z".parse().expect("a time"));
        let layer = scheme.layer_key(1);
        let other = [("kubernetes.io/hostname", "ip-10-0-0-1")];
        assert!(joining(&node(Some(5), &other, &now), &scheme, &now));
        assert!(joining(&node(Some(9 * 60), &[], &now), &scheme, &now));
        // Old: an existing node at install or restart is not a join.
        assert!(!joining(&node(Some(11 * 60), &other, &now), &scheme, &now));
        // Labelled already (by us, or by the cloud controller at registration).
        assert!(!joining(
            &node(Some(5), &[(layer.as_str(), "nn-1")], &now),
            &scheme,
            &now
        ));
        // No creation time: not judged new.
        assert!(!joining(&node(None, &[], &now), &scheme, &now));
    }
}

#[cfg(test)]
mod trust {
    //! What a new leader takes from a node's verification record, and what it re-verifies:
    //! one test per way a record can be wrong.
    use super::*;
    use crate::topology::InstanceTopology;

    const NOW: u64 = 1_796_300_000;
    const TTL: Duration = Duration::from_secs(6 * 3600);
    const ID: &str = "i-0123456789abcdef0";

    fn answer() -> InstanceTopology {
        InstanceTopology {
            instance_id: ID.into(),
            instance_type: Some("p5.48xlarge".into()),
            availability_zone: Some("us-west-2a".into()),
            zone_id: Some("usw2-az1".into()),
            network_nodes: vec!["nn-1".into(), "nn-2".into(), "nn-3".into()],
            ..InstanceTopology::default()
        }
    }

    fn key() -> RecordKey {
        RecordKey::new(b"the controller's key, 32 bytes or more").expect("a key")
    }

    fn target() -> Target<'static> {
        Target {
            region: "us-west-2",
            instance_id: ID,
            capacity_block_expected: false,
        }
    }

    /// A node as our last write left it: labels from `answer`, its record `age_s` old, booted
    /// `boot`.
    fn verified_node(scheme: &LabelScheme, age_s: u64, boot: &str) -> LiteNode {
        let mut n = LiteNode::default();
        n.metadata.name = Some("ip-10-0-0-1".into());
        n.spec.provider_id = Some(format!("aws:///us-west-2a/{ID}"));
        n.status.node_info.boot_id = Some(boot.into());
        let verified = Verified {
            topology: answer(),
            boot_id: Some(boot.into()),
            at: NOW - age_s,
        };
        let (mut desired, _) =
            derive(&n, scheme, &verified.topology).expect("labels for the answer");
        n.metadata.labels = Some(desired.labels);
        // As an earlier version left it: the record on the node.
        desired
            .annotations
            .insert(VERIFIED_KEY.into(), verified.encode(&key()));
        n.metadata.annotations = Some(desired.annotations);
        n
    }

    fn record_of(n: &mut LiteNode) -> &mut String {
        n.metadata
            .annotations
            .as_mut()
            .and_then(|a| a.get_mut(VERIFIED_KEY))
            .expect("a record")
    }

    fn judge(n: &LiteNode) -> Result<Verified, Distrust> {
        trusted(n, &LabelScheme::default(), &target(), Some(&key()), None)
    }

    #[test]
    fn a_record_packed_in_the_node_cache_is_trusted_and_needs_no_write() {
        let scheme = LabelScheme::default();
        let mut n = verified_node(&scheme, 3600, "boot-1");
        // As the watch keeps it: labels and annotations packed.
        crate::node::watch::prune(&mut n, &scheme);
        assert!(n.metadata.annotations.is_none() && n.metadata.labels.is_none());
        let v = judge(&n).expect("trusted from the packed record");
        let (_, diff) = derive(&n, &scheme, &v.topology).expect("labels for the answer");
        assert!(diff.is_empty(), "nothing to write: {diff:?}");
    }

    /// Issue 55.5: a rotation. The new key, holding the old one as previous, trusts records
    /// the old one sealed (no EC2 call) and writes nothing (packed as the watch keeps the node,
    /// and not). Without the old key, the same record is another key's.
    #[test]
    fn a_rotation_trusts_old_records_and_rewrites_none() {
        let scheme = LabelScheme::default();
        let new = RecordKey::new(b"the key after the rotation, 32 bytes+").expect("a key");
        let rotated = new.clone().with_previous([key()]);
        for packed in [false, true] {
            let mut n = verified_node(&scheme, 3600, "boot-1");
            if packed {
                crate::node::watch::prune(&mut n, &scheme);
            }
            let v = trusted(&n, &scheme, &target(), Some(&rotated), None).expect("trusted");
            let (_, diff) = derive(&n, &scheme, &v.topology).expect("labels");
            assert!(diff.is_empty(), "a rotation rewrites nothing: {diff:?}");
            assert_eq!(
                trusted(&n, &scheme, &target(), Some(&new), None),
                Err(Distrust::OtherKey)
            );
        }
    }

    /// Issue 60: the ledger's record is the one judged (its shard's seal was checked when read);
    /// the node's annotation only when the ledger holds none.
    #[test]
    fn the_ledgers_record_is_judged_before_the_nodes_annotation() {
        let scheme = LabelScheme::default();
        let mut bare = verified_node(&scheme, 60, "boot-1");
        bare.metadata.annotations = None;
        let recorded = Verified {
            topology: answer(),
            boot_id: Some("boot-1".into()),
            at: NOW - 60,
        };
        assert_eq!(
            trusted(
                &bare,
                &scheme,
                &target(),
                Some(&key()),
                Some(recorded.clone())
            ),
            Ok(recorded.clone())
        );
        assert_eq!(judge(&bare), Err(Distrust::Missing));
        // A ledger record of an earlier boot is not saved by a valid annotation.
        let with_annotation = verified_node(&scheme, 60, "boot-1");
        let earlier = Verified {
            boot_id: Some("boot-0".into()),
            ..recorded.clone()
        };
        assert_eq!(
            trusted(
                &with_annotation,
                &scheme,
                &target(),
                Some(&key()),
                Some(earlier)
            ),
            Err(Distrust::OtherBoot)
        );
        // Nor is one whose answer the labels no longer say.
        let moved = Verified {
            topology: InstanceTopology {
                network_nodes: vec!["nn-1".into(), "nn-2".into(), "nn-9".into()],
                ..answer()
            },
            ..recorded.clone()
        };
        assert_eq!(
            trusted(&bare, &scheme, &target(), Some(&key()), Some(moved)),
            Err(Distrust::LabelsChanged)
        );
        // Without a key nothing is trusted, the ledger's records neither.
        assert_eq!(
            trusted(&bare, &scheme, &target(), None, Some(recorded)),
            Err(Distrust::NoKey)
        );
    }

    #[test]
    fn a_record_of_this_boot_over_unchanged_labels_is_trusted() {
        let n = verified_node(&LabelScheme::default(), 3600, "boot-1");
        let v = judge(&n).expect("trusted");
        assert_eq!(v.topology, answer());
        assert_eq!(v.at, NOW - 3600);
        // Taken as the answer, it makes the reconcile write nothing.
        let (_, diff) = derive(&n, &LabelScheme::default(), &v.topology).expect("labels");
        assert!(diff.is_empty(), "{diff:?}");
    }

    #[test]
    fn a_boot_that_changed_while_no_leader_ran_is_re_verified() {
        let mut n = verified_node(&LabelScheme::default(), 60, "boot-1");
        n.status.node_info.boot_id = Some("boot-2".into());
        assert_eq!(judge(&n), Err(Distrust::OtherBoot));
        // A node that reports no boot ID cannot tell a reboot either.
        n.status.node_info.boot_id = None;
        assert_eq!(judge(&n), Err(Distrust::OtherBoot));
    }

    #[test]
    fn a_record_of_another_version_is_re_verified() {
        let mut n = verified_node(&LabelScheme::default(), 60, "boot-1");
        let r = record_of(&mut n);
        *r = r.replacen(r#""v":2"#, r#""v":3"#, 1);
        assert_eq!(judge(&n), Err(Distrust::OtherVersion));
    }

    /// Whoever may patch the node may write labels and a record to match: without the key, the
    /// record is not taken as an answer, whatever it claims (issue 44).
    #[test]
    fn a_record_forged_without_the_key_is_re_verified() {
        let mut n = verified_node(&LabelScheme::default(), 60, "boot-1");
        let forged = Verified {
            topology: answer(),
            boot_id: Some("boot-1".into()),
            at: NOW - 60,
        };
        // Sealed with a key of the forger's own.
        let theirs = RecordKey::new(b"a key the forger made up, long enough").expect("a key");
        *record_of(&mut n) = forged.encode(&theirs);
        assert_eq!(judge(&n), Err(Distrust::OtherKey));
        // Their sum under our key's name.
        *record_of(&mut n) = forged.encode(&theirs).replace(&theirs.id(), &key().id());
        assert_eq!(judge(&n), Err(Distrust::Tampered));
        // The format the sum of which anyone could recompute.
        let old = serde_json::json!({"v": 1, "instanceId": ID, "bootId": "boot-1",
            "at": NOW - 60, "networkNodes": ["nn-1", "nn-2", "nn-3"], "sum": "0123456789abcdef"});
        *record_of(&mut n) = old.to_string();
        assert_eq!(judge(&n), Err(Distrust::OtherVersion));
        // The genuine record again, but this process holds no key: nothing is trusted.
        let n = verified_node(&LabelScheme::default(), 60, "boot-1");
        assert!(judge(&n).is_ok());
        assert_eq!(
            trusted(&n, &LabelScheme::default(), &target(), None, None),
            Err(Distrust::NoKey)
        );
    }

    /// Issue 60: a record an earlier version left on the node is never written for alone (no
    /// write storm at an upgrade), and is not part of what our next apply carries (so that apply
    /// removes it).
    #[test]
    fn a_record_left_on_the_node_costs_no_write_and_goes_with_the_next() {
        let scheme = LabelScheme::default();
        let n = verified_node(&scheme, 60, "boot-1");
        let v = judge(&n).expect("trusted");
        let (desired, diff) = derive(&n, &scheme, &v.topology).expect("labels");
        assert!(diff.is_empty(), "{diff:?}");
        let moved = Verified {
            topology: InstanceTopology {
                network_nodes: vec!["nn-1".into(), "nn-2".into(), "nn-9".into()],
                ..answer()
            },
            ..v
        };
        let (desired_moved, diff) = derive(&n, &scheme, &moved.topology).expect("labels");
        assert!(!diff.is_empty());
        for d in [&desired, &desired_moved] {
            assert!(!d.annotations.contains_key(VERIFIED_KEY));
            assert!(!d.keep.contains(VERIFIED_KEY));
        }
        let body = crate::reconcile::write::apply_body(&n, &desired_moved);
        assert!(
            body["metadata"]["annotations"].get(VERIFIED_KEY).is_none(),
            "{body}"
        );
    }

    #[test]
    fn a_record_edited_by_hand_is_re_verified() {
        let mut n = verified_node(&LabelScheme::default(), 60, "boot-1");
        let r = record_of(&mut n);
        // Its time moved by hand.
        *r = r.replace(&(NOW - 60).to_string(), &NOW.to_string());
        assert_eq!(judge(&n), Err(Distrust::Tampered));
        *record_of(&mut n) = "verified, trust me".into();
        assert_eq!(judge(&n), Err(Distrust::Unreadable));
        n.metadata.annotations = None;
        assert_eq!(judge(&n), Err(Distrust::Missing));
    }

    #[test]
    fn a_label_changed_by_someone_else_since_is_re_verified() {
        let mut n = verified_node(&LabelScheme::default(), 60, "boot-1");
        let mut labels = n.labels().into_owned();
        labels.insert(
            "topology.k8s.aws/network-node-layer-3".into(),
            "nn-9".into(),
        );
        n.metadata.labels = Some(labels.clone());
        assert_eq!(judge(&n), Err(Distrust::LabelsChanged));
        // Removed, too.
        labels.remove("topology.k8s.aws/network-node-layer-3");
        n.metadata.labels = Some(labels);
        assert_eq!(judge(&n), Err(Distrust::LabelsChanged));
        // Or the labels are right but for another configuration (a fourth, padded layer).
        let n = verified_node(&LabelScheme::default(), 60, "boot-1");
        let padded = LabelScheme {
            uniform_depth: Some(4),
            ..LabelScheme::default()
        };
        assert_eq!(
            trusted(&n, &padded, &target(), Some(&key()), None),
            Err(Distrust::LabelsChanged)
        );
    }

    #[test]
    fn a_record_about_another_instance_is_re_verified() {
        let mut n = verified_node(&LabelScheme::default(), 60, "boot-1");
        n.spec.provider_id = Some("aws:///us-west-2a/i-0fedcba9876543210".into());
        let other = Target {
            instance_id: "i-0fedcba9876543210",
            ..target()
        };
        assert_eq!(
            trusted(&n, &LabelScheme::default(), &other, Some(&key()), None),
            Err(Distrust::OtherInstance)
        );
    }

    /// The record says since when EC2 has given the answer, not when it was last asked: a
    /// node whose answer has not changed for days (or whose time says anything at all) is
    /// trusted as long as the rest holds. Its re-verification comes within the taker's TTL.
    #[test]
    fn a_record_of_any_age_is_trusted() {
        for age in [0, TTL.as_secs(), 30 * 24 * 3600] {
            let n = verified_node(&LabelScheme::default(), age, "boot-1");
            assert_eq!(judge(&n).map(|v| v.at), Ok(NOW - age), "{age} s old");
        }
    }

    #[test]
    fn a_record_of_an_answer_still_settling_is_re_verified() {
        // A UltraServer type without its capacity block yet: EC2 fills it in late.
        let mut n = verified_node(&LabelScheme::default(), 60, "boot-1");
        let mut t = answer();
        t.instance_type = Some("p6e-gb200.36xlarge".into());
        let v = Verified {
            topology: t,
            boot_id: Some("boot-1".into()),
            at: NOW - 60,
        };
        *record_of(&mut n) = v.encode(&key());
        assert_eq!(judge(&n), Err(Distrust::Incomplete));
    }
}

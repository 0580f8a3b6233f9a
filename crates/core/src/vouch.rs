//! Whether a node's topology labels are what its verification record's answer makes of them,
//! read without the record key (the seal is not checked): what `tree` can tell on its own of
//! the labels it draws. A record that vouches may still be forged by whoever may patch the node
//! (only the controller, which holds the key, tells); a node no record vouches for is one whose
//! labels nobody verified with EC2 since they were written: labelled by hand, by another tool,
//! or rewritten since.
//!
//! Owns: that reading. Pure.

use std::collections::BTreeMap;

use crate::{
    labels::{self, LabelScheme},
    provider_id,
    verified::Verified,
};

/// Why no record vouches for a node's labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unvouched {
    /// The node carries no verification record.
    NoRecord,
    /// Not a record this build can read.
    Unreadable,
    /// A record about another instance than the node's providerID names.
    OtherInstance,
    /// A record of another boot (the node rebooted since, or either boot is unknown).
    OtherBoot,
    /// The labels are not what the record's answer makes of them.
    LabelsDiffer,
}

impl Unvouched {
    pub fn explain(self) -> &'static str {
        match self {
            Unvouched::NoRecord => "no verification record",
            Unvouched::Unreadable => "an unreadable verification record",
            Unvouched::OtherInstance => "a verification record about another instance",
            Unvouched::OtherBoot => "a verification record of another boot",
            Unvouched::LabelsDiffer => "labels that are not what its verification record says",
        }
    }
}

/// Whether `record` (the node's verification record), about the instance `provider_id` names in
/// boot `boot_id`, vouches for the family labels among `labels`.
pub fn vouched(
    scheme: &LabelScheme,
    labels: &BTreeMap<String, String>,
    record: Option<&str>,
    provider_id: &str,
    boot_id: Option<&str>,
) -> Result<(), Unvouched> {
    let record = record.ok_or(Unvouched::NoRecord)?;
    let (verified, _) = Verified::parse(record).map_err(|_| Unvouched::Unreadable)?;
    vouched_by(scheme, labels, &verified, provider_id, boot_id)
}

/// Whether `verified` (a node's record, read from the controller's ledger or the node), about
/// the instance `provider_id` names in boot `boot_id`, vouches for the family labels among
/// `labels`.
pub fn vouched_by(
    scheme: &LabelScheme,
    labels: &BTreeMap<String, String>,
    verified: &Verified,
    provider_id: &str,
    boot_id: Option<&str>,
) -> Result<(), Unvouched> {
    let instance = provider_id::parse(provider_id).map_err(|_| Unvouched::OtherInstance)?;
    if instance.instance_id != verified.topology.instance_id {
        return Err(Unvouched::OtherInstance);
    }
    match (verified.boot_id.as_deref(), boot_id) {
        (Some(a), Some(b)) if a == b => {}
        _ => return Err(Unvouched::OtherBoot),
    }
    let desired =
        labels::desired(scheme, &verified.topology).map_err(|_| Unvouched::LabelsDiffer)?;
    if labels::family_fingerprint(scheme, labels) != labels::vouched_fingerprint(scheme, &desired) {
        return Err(Unvouched::LabelsDiffer);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{topology::InstanceTopology, verified::RecordKey};

    const PID: &str = "aws:///us-west-2a/i-0123456789abcdef0";

    fn record() -> Verified {
        Verified {
            topology: InstanceTopology {
                instance_id: "i-0123456789abcdef0".into(),
                availability_zone: Some("us-west-2a".into()),
                zone_id: Some("usw2-az1".into()),
                network_nodes: vec!["nn-1".into(), "nn-2".into(), "nn-3".into()],
                ..InstanceTopology::default()
            },
            boot_id: Some("boot-1".into()),
            at: 1,
        }
    }

    /// Labels as the record's answer makes them are vouched for, other labels beside them too;
    /// anything else says why not.
    #[test]
    fn a_record_vouches_only_for_the_labels_its_answer_makes() {
        let s = LabelScheme::default();
        let key = RecordKey::new(b"any key: the seal is not checked here").expect("a key");
        let text = record().encode(&key);
        let mut labels = labels::desired(&s, &record().topology)
            .expect("labels")
            .labels;
        labels.insert("kubernetes.io/hostname".into(), "h".into());
        assert_eq!(
            vouched(&s, &labels, Some(&text), PID, Some("boot-1")),
            Ok(())
        );
        assert_eq!(
            vouched(&s, &labels, None, PID, Some("boot-1")),
            Err(Unvouched::NoRecord)
        );
        assert_eq!(
            vouched(&s, &labels, Some("{"), PID, Some("boot-1")),
            Err(Unvouched::Unreadable)
        );
        assert_eq!(
            vouched(
                &s,
                &labels,
                Some(&text),
                "aws:///us-west-2a/i-0123456789abcdef1",
                Some("boot-1")
            ),
            Err(Unvouched::OtherInstance)
        );
        assert_eq!(
            vouched(&s, &labels, Some(&text), PID, Some("boot-2")),
            Err(Unvouched::OtherBoot)
        );
        let mut forged = labels.clone();
        forged.insert(s.layer_key(3), "nn-forged".into());
        assert_eq!(
            vouched(&s, &forged, Some(&text), PID, Some("boot-1")),
            Err(Unvouched::LabelsDiffer)
        );
    }
}

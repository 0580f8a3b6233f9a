//! The verification record: what a node's labels were last verified against, kept on the node
//! (annotation [`VERIFIED_KEY`], written in the same apply as the labels) so that it outlives
//! the process that verified them.
//!
//! A new leader — every rollout, drain, OOM or lease handover — would otherwise ask EC2 about
//! every instance again (1,000 calls at 100,000 nodes, minutes of the account's shared budget)
//! although nothing changed. With the record it takes the answer of the node's last
//! verification as its own, as long as the record is whole, from this format, about the
//! instance and boot the node runs now, and the node's labels are still what that answer makes
//! of them; anything else is asked about at once.
//!
//! Nothing in the record changes with time alone: `at` says since when EC2 has given this
//! answer in this boot, and a re-verification that finds the same answer keeps it. So the
//! record, and the node, are written only when the answer changes, never once per TTL.
//!
//! The value is one line of JSON, fields in a fixed order, ending with `sum`: the first 16 hex
//! digits of the SHA-256 of the line without it. The sum is not a secret (anyone may write an
//! annotation who may write the node's labels); it tells a record we wrote from one edited by
//! hand, which is then distrusted.
//!
//! Owns: the record's format. Never decides what to trust (the controller does, with the node).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::topology::InstanceTopology;

/// The annotation holding a node's verification record.
pub const VERIFIED_KEY: &str = "ec2-topology-labeler.io/verified";

/// The record format this build writes and trusts.
pub const VERSION: u32 = 1;

/// What a node's labels were verified against: EC2's answer about its instance in one boot, and
/// since when EC2 has given it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The answer (its `instance_id` is the instance's).
    pub topology: InstanceTopology,
    /// The node's `status.nodeInfo.bootID` when asked.
    pub boot_id: Option<String>,
    /// Since when EC2 has given this answer in this boot (its first answer that said so), in
    /// seconds since the Unix epoch; kept by re-verifications that find it unchanged.
    pub at: u64,
}

/// Why a record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("not a verification record: {0}")]
    Unreadable(String),
    #[error("a record of format {0}, not {VERSION}")]
    OtherVersion(u64),
    #[error("the record's sum does not match it (edited by hand?)")]
    Tampered,
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Wire {
    v: u32,
    instance_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    boot_id: Option<String>,
    at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    instance_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    availability_zone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    zone_id: Option<String>,
    network_nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    group_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    capacity_block_id: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    sum: String,
}

impl Wire {
    fn sum(&self) -> String {
        let unsummed = Wire {
            sum: String::new(),
            ..self.clone()
        };
        // Serialising a struct of strings cannot fail.
        let line = serde_json::to_string(&unsummed).unwrap_or_default();
        let digest = Sha256::digest(line.as_bytes());
        digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }
}

impl Verified {
    /// The annotation value.
    pub fn encode(&self) -> String {
        let t = &self.topology;
        let mut wire = Wire {
            v: VERSION,
            instance_id: t.instance_id.clone(),
            boot_id: self.boot_id.clone(),
            at: self.at,
            instance_type: t.instance_type.clone(),
            availability_zone: t.availability_zone.clone(),
            zone_id: t.zone_id.clone(),
            network_nodes: t.network_nodes.clone(),
            group_name: t.group_name.clone(),
            capacity_block_id: t.capacity_block_id.clone(),
            sum: String::new(),
        };
        wire.sum = wire.sum();
        serde_json::to_string(&wire).unwrap_or_default()
    }

    /// Read an annotation value: a record of this format whose sum matches.
    pub fn parse(value: &str) -> Result<Self, RecordError> {
        let any: serde_json::Value =
            serde_json::from_str(value).map_err(|e| RecordError::Unreadable(e.to_string()))?;
        match any.get("v").and_then(serde_json::Value::as_u64) {
            Some(v) if v == u64::from(VERSION) => {}
            Some(v) => return Err(RecordError::OtherVersion(v)),
            None => return Err(RecordError::Unreadable("no format version".into())),
        }
        let wire: Wire =
            serde_json::from_value(any).map_err(|e| RecordError::Unreadable(e.to_string()))?;
        if wire.sum.is_empty() || wire.sum != wire.sum() {
            return Err(RecordError::Tampered);
        }
        Ok(Verified {
            topology: InstanceTopology {
                instance_id: wire.instance_id,
                instance_type: wire.instance_type,
                availability_zone: wire.availability_zone,
                zone_id: wire.zone_id,
                network_nodes: wire.network_nodes,
                group_name: wire.group_name,
                capacity_block_id: wire.capacity_block_id,
            },
            boot_id: wire.boot_id,
            at: wire.at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Verified {
        Verified {
            topology: InstanceTopology {
                instance_id: "i-0123456789abcdef0".into(),
                instance_type: Some("p5.48xlarge".into()),
                availability_zone: Some("us-west-2a".into()),
                zone_id: Some("usw2-az1".into()),
                network_nodes: vec!["nn-1".into(), "nn-2".into(), "nn-3".into()],
                group_name: None,
                capacity_block_id: Some("cr-0abc".into()),
            },
            boot_id: Some("4f6c-boot".into()),
            at: 1_796_300_000,
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = record();
        let line = r.encode();
        assert_eq!(Verified::parse(&line), Ok(r.clone()));
        // One line, fields in a fixed order: the same record always encodes the same (a write
        // happens only when it changes).
        assert_eq!(line, record().encode());
        assert!(
            line.starts_with(
                r#"{"v":1,"instanceId":"i-0123456789abcdef0","bootId":"4f6c-boot","at":1796300000,"#
            ),
            "{line}"
        );
        assert!(!line.contains('\n'));
    }

    #[test]
    fn a_record_edited_by_hand_is_tampered() {
        let line = record().encode();
        // Made younger, to be trusted longer.
        let edited = line.replace("1796300000", "1796399999");
        assert_eq!(Verified::parse(&edited), Err(RecordError::Tampered));
        // Moved to another switch.
        let moved = line.replace("nn-3", "nn-9");
        assert_eq!(Verified::parse(&moved), Err(RecordError::Tampered));
        // The sum taken away.
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let mut m = v.as_object().unwrap().clone();
        m.remove("sum");
        let unsummed = serde_json::to_string(&m).unwrap();
        assert_eq!(Verified::parse(&unsummed), Err(RecordError::Tampered));
    }

    #[test]
    fn a_record_of_another_format_or_none_at_all_is_not_read() {
        let line = record().encode().replacen(r#""v":1"#, r#""v":2"#, 1);
        assert_eq!(Verified::parse(&line), Err(RecordError::OtherVersion(2)));
        for bad in ["", "yes", "{}", "[1]", r#"{"v":1}"#, r#"{"v":"1"}"#] {
            assert!(
                matches!(Verified::parse(bad), Err(RecordError::Unreadable(_))),
                "{bad:?}"
            );
        }
        // A field this format does not have: another writer's, not ours.
        let extra = record()
            .encode()
            .replacen(r#""v":1,"#, r#""v":1,"extra":true,"#, 1);
        assert!(matches!(
            Verified::parse(&extra),
            Err(RecordError::Unreadable(_))
        ));
    }
}

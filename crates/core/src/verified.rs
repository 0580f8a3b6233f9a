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
//! The value is one line of JSON, fields in a fixed order, ending with `key` and `sum`: `sum` is
//! the first 16 bytes (32 hex digits) of the HMAC-SHA-256 of the line without them, under a key
//! only the controller holds (`key` names it: the first 4 bytes of its SHA-256, in hex). Whoever
//! may write a node's labels may write its annotations too (a kubelet, any script with node
//! patch rights): without the key, a record they make is not trusted, and the instance is asked
//! about. Format 1 carried an unkeyed SHA-256 anyone could recompute; it is no longer trusted.
//!
//! Owns: the record's format. Never decides what to trust (the controller does, with the node).

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::topology::InstanceTopology;

/// The annotation holding a node's verification record.
pub const VERIFIED_KEY: &str = "ec2-topology-labeler.io/verified";

/// The record format this build writes and trusts.
pub const VERSION: u32 = 2;

/// What a text seal's MAC is taken of before the text (see [`RecordKey::seal_text`]).
const TEXT_DOMAIN: &[u8] = b"ec2-topology-labeler ledger shard\n";

/// The shortest key a record is sealed with (bytes).
pub const MIN_KEY_LEN: usize = 32;

/// The key records are sealed with, and its public name; with the keys of earlier rotations
/// that records are still opened with (never sealed with), so that a rotation neither distrusts
/// every record nor rewrites one.
#[derive(Clone)]
pub struct RecordKey {
    id: [u8; 4],
    mac: Hmac<Sha256>,
    previous: Vec<([u8; 4], Hmac<Sha256>)>,
}

impl std::fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RecordKey({})", hex(&self.id))
    }
}

impl PartialEq for RecordKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl RecordKey {
    /// A key of `secret` (at least [`MIN_KEY_LEN`] bytes).
    pub fn new(secret: &[u8]) -> Result<Self, String> {
        if secret.len() < MIN_KEY_LEN {
            return Err(format!(
                "a record key of {} bytes: at least {MIN_KEY_LEN} are needed",
                secret.len()
            ));
        }
        let digest = Sha256::digest(secret);
        let mut id = [0u8; 4];
        for (to, from) in id.iter_mut().zip(digest.iter()) {
            *to = *from;
        }
        let mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
            .map_err(|e| format!("not a record key: {e}"))?;
        Ok(Self {
            id,
            mac,
            previous: Vec::new(),
        })
    }

    /// This key, also opening records sealed with `older` (the keys of earlier rotations, the
    /// newest first). One of the same name as this key is left out.
    pub fn with_previous(mut self, older: impl IntoIterator<Item = RecordKey>) -> Self {
        for k in older {
            if k.id != self.id && !self.previous.iter().any(|(id, _)| *id == k.id) {
                self.previous.push((k.id, k.mac));
            }
        }
        self
    }

    /// Whether records sealed with earlier keys are opened too.
    pub fn has_previous(&self) -> bool {
        !self.previous.is_empty()
    }

    /// The names of the earlier keys it opens records with.
    pub fn previous_ids(&self) -> Vec<String> {
        self.previous.iter().map(|(id, _)| hex(id)).collect()
    }

    /// The MAC of the key named `id`, this one's or an earlier one's.
    fn mac_of(&self, id: &[u8; 4]) -> Option<&Hmac<Sha256>> {
        if *id == self.id {
            return Some(&self.mac);
        }
        self.previous
            .iter()
            .find_map(|(i, mac)| (i == id).then_some(mac))
    }

    /// Its public name, as records carry it (8 hex digits).
    pub fn id(&self) -> String {
        hex(&self.id)
    }

    /// A seal of `text` (a ledger shard's records, see the controller's `ledger`): the key's
    /// name and the first 16 bytes of the HMAC-SHA-256, `<name>:<sum>` in hex. The MAC is taken
    /// of `text` behind a prefix of its own, so no seal of one kind opens the other.
    pub fn seal_text(&self, text: &str) -> String {
        let mut mac = self.mac.clone();
        mac.update(TEXT_DOMAIN);
        mac.update(text.as_bytes());
        let tag = mac.finalize().into_bytes();
        let sum: Vec<u8> = tag.iter().take(16).copied().collect();
        format!("{}:{}", hex(&self.id), hex(&sum))
    }

    /// Whether `seal` (as [`RecordKey::seal_text`] makes it) seals `text` under this key or
    /// one of the earlier keys it holds (compared in constant time). `Ok(true)` when sealed
    /// with this key, `Ok(false)` with an earlier one.
    pub fn open_text(&self, text: &str, seal: &str) -> Result<bool, RecordError> {
        let (id, sum) = seal.split_once(':').ok_or(RecordError::Tampered)?;
        let (Some(id), Some(sum)) = (unhex::<4>(id), unhex::<16>(sum)) else {
            return Err(RecordError::Tampered);
        };
        let Some(mac) = self.mac_of(&id) else {
            return Err(RecordError::OtherKey(hex(&id)));
        };
        let mut mac = mac.clone();
        mac.update(TEXT_DOMAIN);
        mac.update(text.as_bytes());
        mac.verify_truncated_left(&sum)
            .map_err(|_| RecordError::Tampered)?;
        Ok(id == self.id)
    }

    fn sum(&self, line: &str) -> [u8; 16] {
        let mut mac = self.mac.clone();
        mac.update(line.as_bytes());
        let tag = mac.finalize().into_bytes();
        let mut sum = [0u8; 16];
        for (to, from) in sum.iter_mut().zip(tag.iter()) {
            *to = *from;
        }
        sum
    }
}

/// A record's seal, kept as its parts so that a record read can be written back as it was
/// without the key: the key's name and the sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Seal {
    key: [u8; 4],
    sum: [u8; 16],
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// What a node's labels were verified against: EC2's answer about its instance in one boot, and
/// since when EC2 has given it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
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
    #[error("the record's sum does not match it (edited, or forged without the key)")]
    Tampered,
    #[error("a record sealed with another key ({0})")]
    OtherKey(String),
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
    key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    sum: String,
}

impl Wire {
    /// The line the sum is taken of: the record without `key` and `sum`.
    fn unsealed(&self) -> String {
        let unsealed = Wire {
            key: String::new(),
            sum: String::new(),
            ..self.clone()
        };
        // Serialising a struct of strings and numbers cannot fail.
        serde_json::to_string(&unsealed).unwrap_or_default()
    }
}

impl Verified {
    fn wire(&self, seal: &Seal) -> Wire {
        let t = &self.topology;
        Wire {
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
            key: hex(&seal.key),
            sum: hex(&seal.sum),
        }
    }

    /// The seal `key` gives this record.
    pub fn seal(&self, key: &RecordKey) -> Seal {
        let mut seal = Seal {
            key: key.id,
            sum: [0; 16],
        };
        seal.sum = key.sum(&self.wire(&seal).unsealed());
        seal
    }

    /// The annotation value, sealed with `key`.
    pub fn encode(&self, key: &RecordKey) -> String {
        self.encode_sealed(&self.seal(key))
    }

    /// The annotation value with a seal read before (no key needed: it is not checked).
    pub fn encode_sealed(&self, seal: &Seal) -> String {
        // Serialising a struct of strings and numbers cannot fail.
        serde_json::to_string(&self.wire(seal)).unwrap_or_default()
    }

    /// Read an annotation value of this format, and its seal, without checking the seal
    /// (see [`Verified::open`]).
    pub fn parse(value: &str) -> Result<(Self, Seal), RecordError> {
        let any: serde_json::Value =
            serde_json::from_str(value).map_err(|e| RecordError::Unreadable(e.to_string()))?;
        match any.get("v").and_then(serde_json::Value::as_u64) {
            Some(v) if v == u64::from(VERSION) => {}
            Some(v) => return Err(RecordError::OtherVersion(v)),
            None => return Err(RecordError::Unreadable("no format version".into())),
        }
        let wire: Wire =
            serde_json::from_value(any).map_err(|e| RecordError::Unreadable(e.to_string()))?;
        let seal = match (unhex::<4>(&wire.key), unhex::<16>(&wire.sum)) {
            (Some(key), Some(sum)) => Seal { key, sum },
            _ => return Err(RecordError::Tampered),
        };
        Ok((
            Verified {
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
            },
            seal,
        ))
    }

    /// Read an annotation value: a record of this format sealed with `key` (or one of the
    /// earlier keys it holds), whose sum matches (compared in constant time).
    pub fn open(value: &str, key: &RecordKey) -> Result<Self, RecordError> {
        let (verified, seal) = Self::parse(value)?;
        let Some(mac) = key.mac_of(&seal.key) else {
            return Err(RecordError::OtherKey(hex(&seal.key)));
        };
        let mut mac = mac.clone();
        mac.update(verified.wire(&seal).unsealed().as_bytes());
        mac.verify_truncated_left(&seal.sum)
            .map_err(|_| RecordError::Tampered)?;
        Ok(verified)
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

    fn key() -> RecordKey {
        RecordKey::new(b"0123456789abcdef0123456789abcdef").unwrap()
    }

    #[test]
    fn a_text_seal_opens_only_its_text_under_its_key() {
        let k = key();
        let seal = k.seal_text("the records");
        assert_eq!(k.open_text("the records", &seal), Ok(true));
        assert_eq!(
            k.open_text("the records!", &seal),
            Err(RecordError::Tampered)
        );
        let other = RecordKey::new(b"another key of thirty-two bytes or so").unwrap();
        assert!(matches!(
            other.open_text("the records", &seal),
            Err(RecordError::OtherKey(_))
        ));
        let rotated = other.clone().with_previous([k.clone()]);
        assert_eq!(rotated.open_text("the records", &seal), Ok(false));
        assert_eq!(
            k.open_text("the records", "nonsense"),
            Err(RecordError::Tampered)
        );
        // A record's own sum is no seal of its line as text.
        let r = record();
        let line = r.wire(&r.seal(&k)).unsealed();
        let sum = hex(&r.seal(&k).sum);
        assert_eq!(
            k.open_text(&line, &format!("{}:{sum}", k.id())),
            Err(RecordError::Tampered)
        );
    }

    /// A rotation: the new key opens what the old one sealed, when it holds it as previous,
    /// and seals only with itself; a key it does not hold is still refused, as is an edit.
    #[test]
    fn a_rotated_key_opens_records_of_the_keys_before_it() {
        let old = key();
        let new = RecordKey::new(b"the new key, thirty-two bytes or more").unwrap();
        let forger = RecordKey::new(b"someone else's key of 32 bytes or more").unwrap();
        let r = record();
        let by_old = r.encode(&old);
        assert!(matches!(
            Verified::open(&by_old, &new),
            Err(RecordError::OtherKey(_))
        ));
        let both = new.clone().with_previous([old.clone(), new.clone()]);
        assert_eq!(both.previous_ids(), vec![old.id()], "itself left out");
        assert_eq!(Verified::open(&by_old, &both), Ok(r.clone()));
        assert_eq!(
            r.encode(&both),
            r.encode(&new),
            "sealed with the new key only"
        );
        assert!(matches!(
            Verified::open(&r.encode(&forger), &both),
            Err(RecordError::OtherKey(_))
        ));
        let edited = by_old.replace("nn-3", "nn-4");
        assert_eq!(Verified::open(&edited, &both), Err(RecordError::Tampered));
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = record();
        let line = r.encode(&key());
        assert_eq!(Verified::open(&line, &key()), Ok(r.clone()));
        // One line, fields in a fixed order: the same record always encodes the same (a write
        // happens only when it changes).
        assert_eq!(line, record().encode(&key()));
        assert!(
            line.starts_with(
                r#"{"v":2,"instanceId":"i-0123456789abcdef0","bootId":"4f6c-boot","at":1796300000,"#
            ),
            "{line}"
        );
        assert!(
            line.contains(&format!(r#""key":"{}","sum":""#, key().id())),
            "{line}"
        );
        assert!(!line.contains('\n'));
        // Read without the key and written back with its seal: the same text.
        let (read, seal) = Verified::parse(&line).unwrap();
        assert_eq!(read.encode_sealed(&seal), line);
    }

    #[test]
    fn a_record_edited_by_hand_is_tampered() {
        let line = record().encode(&key());
        // Made younger, to be trusted longer.
        let edited = line.replace("1796300000", "1796399999");
        assert_eq!(Verified::open(&edited, &key()), Err(RecordError::Tampered));
        // Moved to another switch.
        let moved = line.replace("nn-3", "nn-9");
        assert_eq!(Verified::open(&moved, &key()), Err(RecordError::Tampered));
        // The sum taken away, or cut short.
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let mut m = v.as_object().unwrap().clone();
        m.remove("sum");
        let unsummed = serde_json::to_string(&m).unwrap();
        assert_eq!(
            Verified::open(&unsummed, &key()),
            Err(RecordError::Tampered)
        );
        let sum = m.get("key").unwrap().clone();
        m.insert("sum".into(), sum);
        let short = serde_json::to_string(&m).unwrap();
        assert_eq!(Verified::open(&short, &key()), Err(RecordError::Tampered));
    }

    /// Whoever may patch a node may write a record: one they make without the key is not
    /// trusted, whether they seal it with a key of their own under its name or another's.
    #[test]
    fn a_record_forged_without_the_key_is_not_trusted() {
        let theirs = RecordKey::new(b"an attacker's key, long enough to pass").unwrap();
        let forged = record().encode(&theirs);
        assert_eq!(
            Verified::open(&forged, &key()),
            Err(RecordError::OtherKey(theirs.id()))
        );
        // Their sum under our key's name.
        let renamed = forged.replace(&theirs.id(), &key().id());
        assert_eq!(Verified::open(&renamed, &key()), Err(RecordError::Tampered));
        // Format 1's unkeyed sum, which anyone could recompute.
        let mut old = serde_json::json!({"v": 1, "instanceId": "i-0123456789abcdef0",
            "bootId": "4f6c-boot", "at": 1796300000u64, "networkNodes": ["nn-1", "nn-2", "nn-3"]});
        let digest = Sha256::digest(old.to_string().as_bytes());
        old["sum"] = hex(&digest[..8]).into();
        assert_eq!(
            Verified::open(&old.to_string(), &key()),
            Err(RecordError::OtherVersion(1))
        );
    }

    #[test]
    fn a_key_is_long_enough_and_named_by_its_digest() {
        assert!(RecordKey::new(b"short").is_err());
        assert!(RecordKey::new(&[0u8; MIN_KEY_LEN - 1]).is_err());
        let k = key();
        assert_eq!(k.id().len(), 8);
        assert_eq!(
            k.id(),
            hex(&Sha256::digest(b"0123456789abcdef0123456789abcdef")[..4])
        );
        assert!(
            !format!("{k:?}").contains("0123456789abcdef"),
            "the secret is not printed"
        );
    }

    #[test]
    fn a_record_of_another_format_or_none_at_all_is_not_read() {
        let line = record().encode(&key()).replacen(r#""v":2"#, r#""v":3"#, 1);
        assert_eq!(
            Verified::open(&line, &key()),
            Err(RecordError::OtherVersion(3))
        );
        for bad in ["", "yes", "{}", "[1]", r#"{"v":2}"#, r#"{"v":"2"}"#] {
            assert!(
                matches!(Verified::open(bad, &key()), Err(RecordError::Unreadable(_))),
                "{bad:?}"
            );
        }
        // A field this format does not have: another writer's, not ours.
        let extra = record()
            .encode(&key())
            .replacen(r#""v":2,"#, r#""v":2,"extra":true,"#, 1);
        assert!(matches!(
            Verified::open(&extra, &key()),
            Err(RecordError::Unreadable(_))
        ));
    }
}

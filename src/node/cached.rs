//! The node as the node cache keeps it: [`CachedNode`], in as few and as small allocations as
//! it can be, read back whole as a [`LiteNode`].

use super::*;
use crate::compact::{canonical_uuid, uuid_text};

/// A node as the cache keeps it: what a [`LiteNode`] holds, in as few and as small allocations
/// as we can (a cache holds every node of the cluster, a `LiteNode` lives for a reconcile). Its
/// five strings (name, UID, resourceVersion, providerID, bootID) are one allocation (the UID
/// and the boot ID as their 16 bytes when they are UUIDs in canonical text, as the API server
/// and the kernel write them: 160 bytes of text become 120, musl's 192-byte class 128), the labels
/// and the record's answer are shared with the nodes that have the same (see [`Sharing`]), and
/// lists that are nearly always empty (taints, our condition) cost no allocation when empty.
/// Read as a whole through [`CachedNode::expand`]; the few fields every-node scans read
/// (name, labels, providerID, our condition) are read in place.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedNode {
    /// The strings, one after another: UTF-8 text, or a UUID's 16 bytes (see `present`).
    text: Box<[u8]>,
    /// Where each but the last ends in `text` (the last ends where `text` does).
    ends: [u32; TEXTS - 1],
    /// Which strings the node has (bit `i` for string `i`): absent is not empty; and which are
    /// kept as a UUID's bytes (`uuid_bit`).
    present: u8,
    /// `creationTimestamp` as its seconds and nanoseconds (see [`Created`]), apart: a `Time`
    /// takes 24 bytes as an `Option`, a `Created` 16, these two 12 beside the other small
    /// fields (see `a_cached_node_fits_the_144_byte_class`).
    created_second: i64,
    created_nanosecond: i32,
    taints: Box<[Taint]>,
    conditions: Box<[LiteCondition]>,
    labels: Option<PackedMap>,
    annotations: Option<PackedMap>,
    /// What few nodes have, boxed: every cached node would pay for its 24 bytes.
    rare: Option<Box<Rare>>,
}

/// What a cached node keeps of what few nodes have.
#[derive(Debug, Clone, PartialEq)]
struct Rare {
    /// Labels and annotations that could not be packed (a NUL byte in a value), as they are.
    plain: (Plain, Plain),
    /// The verification record an earlier build wrote on the node (the ledger keeps records
    /// now), as its parts.
    record: Option<KeptRecord>,
}

/// A timestamp as seconds and nanoseconds (`i64::MIN` seconds: none), exactly as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Created {
    second: i64,
    nanosecond: i32,
}

impl Created {
    const NONE: Self = Self {
        second: i64::MIN,
        nanosecond: 0,
    };

    fn from(t: Option<&Time>) -> Self {
        t.map_or(Self::NONE, |t| Self {
            second: t.0.as_second(),
            nanosecond: t.0.subsec_nanosecond(),
        })
    }

    fn time(self) -> Option<Time> {
        if self == Self::NONE {
            return None;
        }
        // Read from a Timestamp, so always one again.
        k8s_openapi::jiff::Timestamp::new(self.second, self.nanosecond)
            .ok()
            .map(Time)
    }
}

/// How many strings a [`CachedNode`] keeps, and which is where.
pub(super) const TEXTS: usize = 5;
pub(super) const NAME: usize = 0;
pub(super) const UID: usize = 1;
pub(super) const RESOURCE_VERSION: usize = 2;
pub(super) const PROVIDER_ID: usize = 3;
pub(super) const BOOT_ID: usize = 4;
/// The bit of `present` saying string `i` is kept as a UUID's bytes (only the UID and the boot
/// ID may be).
fn uuid_bit(i: usize) -> u8 {
    match i {
        UID => 1 << TEXTS,
        BOOT_ID => 1 << (TEXTS + 1),
        _ => 0,
    }
}

impl From<&LiteNode> for CachedNode {
    fn from(n: &LiteNode) -> Self {
        let texts: [Option<&str>; TEXTS] = [
            n.metadata.name.as_deref(),
            n.metadata.uid.as_deref(),
            n.metadata.resource_version.as_deref(),
            n.spec.provider_id.as_deref(),
            n.status.node_info.boot_id.as_deref(),
        ];
        let uuids: [Option<[u8; 16]>; TEXTS] = std::array::from_fn(|i| {
            // Only the UID and the boot ID may be kept as a UUID's bytes.
            texts
                .get(i)
                .copied()
                .flatten()
                .filter(|_| uuid_bit(i) != 0)
                .and_then(canonical_uuid)
        });
        let mut text = Vec::with_capacity(
            texts
                .iter()
                .zip(&uuids)
                .map(|(t, u)| match (t, u) {
                    (_, Some(u)) => u.len(),
                    (Some(t), None) => t.len(),
                    (None, None) => 0,
                })
                .sum(),
        );
        let mut ends = [0u32; TEXTS - 1];
        let mut present = 0u8;
        for (i, t) in texts.iter().enumerate() {
            if let Some(t) = t {
                match uuids.get(i).copied().flatten() {
                    Some(bytes) => {
                        text.extend_from_slice(&bytes);
                        present |= uuid_bit(i);
                    }
                    None => text.extend_from_slice(t.as_bytes()),
                }
                present |= 1 << i;
            }
            if let Some(end) = ends.get_mut(i) {
                // An object's strings are far below 4 GiB (the API server stores objects of
                // at most 1.5 MiB).
                *end = u32::try_from(text.len()).unwrap_or(u32::MAX);
            }
        }
        let plain = (n.metadata.labels.is_some() || n.metadata.annotations.is_some())
            .then(|| (n.metadata.labels.clone(), n.metadata.annotations.clone()));
        let record = n.record.as_deref().cloned();
        let rare = (plain.is_some() || record.is_some()).then(|| {
            Box::new(Rare {
                plain: plain.unwrap_or_default(),
                record,
            })
        });
        let created = Created::from(n.metadata.creation_timestamp.as_ref());
        CachedNode {
            text: text.into_boxed_slice(),
            ends,
            present,
            created_second: created.second,
            created_nanosecond: created.nanosecond,
            taints: n.spec.taints.clone().into_boxed_slice(),
            conditions: n.status.conditions.clone().into_boxed_slice(),
            labels: n.packed_labels.clone(),
            annotations: n.packed_annotations.clone(),
            rare,
        }
    }
}

impl CachedNode {
    fn bytes(&self, i: usize) -> Option<&[u8]> {
        if self.present & (1 << i) == 0 {
            return None;
        }
        let start = match i.checked_sub(1) {
            Some(before) => *self.ends.get(before)? as usize,
            None => 0,
        };
        let end = match self.ends.get(i) {
            Some(end) => *end as usize,
            None => self.text.len(),
        };
        self.text.get(start..end)
    }

    /// String `i`, as it was on the node.
    pub(super) fn text(&self, i: usize) -> Option<Cow<'_, str>> {
        let bytes = self.bytes(i)?;
        if self.present & uuid_bit(i) != 0 {
            return Some(Cow::Owned(uuid_text(bytes.try_into().ok()?)));
        }
        // Written from a `&str` above.
        std::str::from_utf8(bytes).ok().map(Cow::Borrowed)
    }

    /// String `i`, which is never kept as a UUID's bytes (the name, the resourceVersion, the
    /// providerID), in place.
    fn str(&self, i: usize) -> Option<&str> {
        match self.text(i)? {
            Cow::Borrowed(s) => Some(s),
            Cow::Owned(_) => None,
        }
    }

    fn owned(&self, i: usize) -> Option<String> {
        self.text(i).map(Cow::into_owned)
    }

    fn plain_labels(&self) -> &Plain {
        self.rare.as_ref().map_or(&None, |r| &r.plain.0)
    }

    /// The node, whole, as a reconcile reads it.
    pub fn expand(&self) -> LiteNode {
        let (labels, annotations) = self
            .rare
            .as_ref()
            .map(|r| r.plain.clone())
            .unwrap_or_default();
        LiteNode {
            metadata: LiteMeta {
                name: self.owned(NAME),
                uid: self.owned(UID),
                resource_version: self.owned(RESOURCE_VERSION),
                creation_timestamp: self.created(),
                labels,
                annotations,
            },
            spec: LiteSpec {
                provider_id: self.owned(PROVIDER_ID),
                taints: self.taints.to_vec(),
            },
            status: LiteStatus {
                node_info: LiteNodeInfo {
                    boot_id: self.owned(BOOT_ID),
                },
                conditions: self.conditions.to_vec(),
            },
            packed_labels: self.labels.clone(),
            packed_annotations: self.annotations.clone(),
            record: self
                .rare
                .as_ref()
                .and_then(|r| r.record.clone())
                .map(Box::new),
        }
    }

    /// The node's name (empty if it has none).
    pub fn name(&self) -> &str {
        self.str(NAME).unwrap_or_default()
    }

    /// The node's name as the bytes it is kept in (empty if it has none): for lookups, which
    /// need not check it is text again.
    pub(crate) fn name_bytes(&self) -> &[u8] {
        self.bytes(NAME).unwrap_or_default()
    }

    pub fn name_any(&self) -> String {
        self.name().to_owned()
    }

    /// When the node was created (its `creationTimestamp`).
    pub fn created(&self) -> Option<Time> {
        Created {
            second: self.created_second,
            nanosecond: self.created_nanosecond,
        }
        .time()
    }

    pub fn provider_id(&self) -> &str {
        self.str(PROVIDER_ID).unwrap_or_default()
    }

    pub fn labels(&self) -> Cow<'_, BTreeMap<String, String>> {
        whole(self.plain_labels(), &self.labels)
    }

    /// The value of the label `key`, if any.
    pub fn label(&self, key: &str) -> Option<String> {
        value(self.plain_labels(), &self.labels, key).map(str::to_owned)
    }

    /// The value of the annotation `key` as the cache keeps it (ours only, and never the
    /// verification record: see [`CachedNode::expand`]), if any.
    pub fn annotation(&self, key: &str) -> Option<String> {
        let plain = self.rare.as_ref().map_or(&None, |r| &r.plain.1);
        value(plain, &self.annotations, key).map(str::to_owned)
    }

    /// The node's UID, if it has one.
    pub fn uid(&self) -> Option<Cow<'_, str>> {
        self.text(UID)
    }

    /// The packed labels, for hashing what changed.
    pub(crate) fn packed_labels(&self) -> Option<&PackedMap> {
        self.labels.as_ref()
    }

    /// Labels that could not be packed, for hashing what changed.
    pub(crate) fn plain_labels_for_hash(&self) -> &Plain {
        self.plain_labels()
    }

    /// Our `TopologyLabeled` condition, if the node carries one.
    pub fn topology_condition(&self) -> Option<&LiteCondition> {
        self.conditions.iter().find(|c| c.type_ == CONDITION_TYPE)
    }

    /// Its taints.
    pub fn taints(&self) -> &[k8s_openapi::api::core::v1::Taint] {
        &self.taints
    }

    /// Our `UltraServerInterconnectImpaired` condition, if the node carries one.
    pub(crate) fn interconnect_condition(&self) -> Option<&LiteCondition> {
        self.conditions
            .iter()
            .find(|c| c.type_ == super::INTERCONNECT_CONDITION_TYPE)
    }

    /// A reference to the node (see [`LiteNode::object_ref`]).
    pub(crate) fn object_ref(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: self.owned(NAME),
            resource_version: self.owned(RESOURCE_VERSION),
            uid: self.owned(UID),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cached node lives behind an `Arc` (16 bytes of counters). musl's allocator (the image's)
    /// keeps 4 bytes of its own per slot and has a 144-byte and then a 160-byte class: at 125
    /// bytes or more every node costs 16 bytes more (1.5 MiB at 100,000 nodes). It was in the
    /// 240-byte class while every node kept its verification record's parts inline.
    #[test]
    fn a_cached_node_fits_the_144_byte_class() {
        let size = std::mem::size_of::<CachedNode>();
        eprintln!("CachedNode: {size} bytes");
        assert!(
            size + 16 + 4 <= 144,
            "CachedNode is {size} bytes: an Arc of it no longer fits musl's 144-byte class"
        );
    }

    #[test]
    fn the_creation_time_reads_back_exactly() {
        use k8s_openapi::jiff::Timestamp;
        for t in [
            None,
            Some(Time(Timestamp::new(1_764_000_000, 0).unwrap())),
            Some(Time(Timestamp::new(1_764_000_000, 123_456_789).unwrap())),
            Some(Time(Timestamp::new(-1, 999_999_999).unwrap())),
            Some(Time(Timestamp::MIN)),
            Some(Time(Timestamp::MAX)),
        ] {
            assert_eq!(Created::from(t.as_ref()).time(), t);
        }
    }
}

//! The Node as the controller reads it: only what a reconcile needs.
//!
//! A kubelet's Node is 10–20 kB of JSON (`status.images`, conditions, managed fields). Watching
//! it as `k8s_openapi`'s `Node` allocates all of that for every event of every node; this type
//! lets serde skip what we never read, so the watch costs less CPU and the cache and every
//! event in flight stay small. It is still the `v1` Node resource (same API path, same verbs).
//!
//! Besides metadata it keeps `spec.taints` (a handful per node: the startup taint we may release
//! must be removed without losing the others) and, of `status.conditions`, only our own
//! `TopologyLabeled` and `UltraServerInterconnectImpaired` (the kubelet's conditions are skipped as
//! they are read).
//!
//! Owns: how a Node is read (serde skips the rest). Never writes one.

use std::{borrow::Cow, collections::BTreeMap, sync::Arc};

use k8s_openapi::{
    api::core::v1::Taint,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use serde::{Deserialize, Deserializer, Serialize};

use crate::{
    compact::{BootId, InstanceId},
    intern::Interner,
    topology::InstanceTopology,
    verified::{Seal, VERIFIED_KEY, Verified},
};

mod cached;
pub mod store;
pub mod watch;
pub(crate) use cached::CachedNode;

/// The condition type we own on Nodes.
pub(crate) const CONDITION_TYPE: &str = "TopologyLabeled";

/// The condition we keep on UltraServer members while EC2 says their capacity block's
/// accelerator interconnect is impaired (`--ultraserver-health`; see
/// [`crate::publish::interconnect`]).
pub(crate) const INTERCONNECT_CONDITION_TYPE: &str = "UltraServerInterconnectImpaired";

/// `v1` Node as read from the API server: metadata, `spec.providerID`, `spec.taints`,
/// `status.nodeInfo.bootID` and our own condition. What the node `Api` gets, patches and
/// watches; turned into a [`LiteNode`] as soon as it arrives and never kept (its `ObjectMeta`
/// alone is some 340 bytes, mostly empty fields).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WireNode {
    #[serde(deserialize_with = "lite_meta", default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: LiteSpec,
    #[serde(default)]
    pub status: LiteStatus,
}

/// A Node as the controller keeps it: only the fields a reconcile, the publishers, `tree` and
/// `explain` read. Read from the API server as a [`WireNode`] (and deserializes from a Node's
/// JSON the same way).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(from = "WireNode")]
pub struct LiteNode {
    pub metadata: LiteMeta,
    pub spec: LiteSpec,
    pub status: LiteStatus,
    /// The labels of a node in the cache, packed (see [`LiteNode::pack_labels`]); read through
    /// [`LiteNode::labels`].
    packed_labels: Option<PackedMap>,
    /// The annotations of a node in the cache (our own), packed the same way but for the
    /// verification record (in `record`); read through [`LiteNode::annotations`] and
    /// [`LiteNode::annotation`].
    packed_annotations: Option<PackedMap>,
    /// The verification record of a node in the cache, kept as its parts (a third of its
    /// text, the answer shared). Boxed: only nodes an earlier build recorded on carry one (the
    /// ledger keeps records now), and every cached node would pay for its ~80 bytes.
    record: Option<Box<KeptRecord>>,
}

/// The metadata fields we read, under `ObjectMeta`'s names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LiteMeta {
    pub name: Option<String>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub creation_timestamp: Option<Time>,
    pub labels: Option<BTreeMap<String, String>>,
    pub annotations: Option<BTreeMap<String, String>>,
}

impl From<WireNode> for LiteNode {
    fn from(w: WireNode) -> Self {
        let m = w.metadata;
        LiteNode {
            metadata: LiteMeta {
                name: m.name,
                uid: m.uid,
                resource_version: m.resource_version,
                creation_timestamp: m.creation_timestamp,
                labels: m.labels,
                annotations: m.annotations,
            },
            spec: w.spec,
            status: w.status,
            packed_labels: None,
            packed_annotations: None,
            record: None,
        }
    }
}

/// Labels (or annotations) in one allocation: `key\0value\0` pairs, in key order. A
/// `BTreeMap<String, String>` of the half-dozen labels a cached node keeps costs about 900 bytes
/// (a 544-byte tree node and a dozen small strings); this costs their length (about 300 bytes).
/// The one annotation a cached node keeps, our ~400-byte verification record, costs about 1 KiB
/// in a map and its length packed. `\0` is valid in no key nor label value; a map with one
/// anywhere (an annotation value may hold any text) is not packed. Cheap to clone: nodes with
/// the same labels share one (see [`Sharing`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PackedMap(Arc<str>);

impl PackedMap {
    pub(crate) fn pack(labels: &BTreeMap<String, String>) -> Option<Self> {
        if labels.is_empty()
            || labels
                .iter()
                .any(|(k, v)| k.contains('\0') || v.contains('\0'))
        {
            return None;
        }
        let mut s = String::with_capacity(labels.iter().map(|(k, v)| k.len() + v.len() + 2).sum());
        for (k, v) in labels {
            s.push_str(k);
            s.push('\0');
            s.push_str(v);
            s.push('\0');
        }
        Some(Self(s.into()))
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str)> + Clone {
        let mut parts = self.0.split('\0');
        std::iter::from_fn(move || Some((parts.next()?, parts.next()?)))
    }

    /// Whether `self` and `other` are one allocation (shared, not only equal).
    #[cfg(test)]
    pub(crate) fn shares(&self, other: &PackedMap) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    pub(crate) fn unpack(&self) -> BTreeMap<String, String> {
        self.iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }
}

/// What cached nodes share, each kept once. What a cached node keeps of its labels (our
/// family, its instance type and zone) is the same for every node of one instance type under
/// one switch, and so is the answer in its verification record but for the instance ID: at
/// 100,000 nodes, a few thousand of each instead of 100,000 (about 300 bytes each).
#[derive(Debug, Default)]
pub struct Sharing {
    labels: Interner<str>,
    answers: Interner<InstanceTopology>,
}

impl Sharing {
    /// How many label sets and answers are kept (some may be held by no node until the next
    /// sweep).
    pub fn len(&self) -> (usize, usize) {
        (self.labels.len(), self.answers.len())
    }
}

/// A verification record as a cached node keeps it: its answer without the instance ID,
/// shared (see [`Sharing`]), and what is the node's own. Only a record that encodes back to
/// exactly its text is kept this way (any other is kept as text), so it reads back as it was.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct KeptRecord {
    instance_id: InstanceId,
    boot_id: Option<BootId>,
    at: u64,
    answer: Arc<InstanceTopology>,
    /// Its seal as read (not checked here: the key is not needed to keep it).
    seal: Seal,
}

impl KeptRecord {
    fn keep(text: &str) -> Option<Self> {
        let (verified, seal) = Verified::parse(text).ok()?;
        if verified.encode_sealed(&seal) != text {
            return None;
        }
        let mut answer = verified.topology;
        let instance_id = InstanceId::from(std::mem::take(&mut answer.instance_id));
        Some(Self {
            instance_id,
            boot_id: verified.boot_id.as_deref().map(BootId::new),
            at: verified.at,
            answer: Arc::new(answer),
            seal,
        })
    }

    /// The record's text, as it was on the node.
    fn text(&self) -> String {
        Verified {
            topology: InstanceTopology {
                instance_id: self.instance_id.to_string(),
                ..(*self.answer).clone()
            },
            boot_id: self.boot_id.as_ref().map(ToString::to_string),
            at: self.at,
        }
        .encode_sealed(&self.seal)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LiteSpec {
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LiteStatus {
    #[serde(rename = "nodeInfo", default)]
    pub node_info: LiteNodeInfo,
    /// Our conditions only (`TopologyLabeled`, `UltraServerInterconnectImpaired`); every other
    /// condition is skipped while reading.
    #[serde(
        default,
        deserialize_with = "our_condition",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<LiteCondition>,
}

/// A node condition as we read and compare it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LiteCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_transition_time: Option<Time>,
}

impl LiteCondition {
    /// The strategic-merge patch of the status subresource that sets the condition of `type_`
    /// (merged by type: the kubelet's conditions are left alone), `current` being what the node
    /// carries now: the transition time moves only when the status does.
    pub fn patch(
        type_: &str,
        status: bool,
        reason: &str,
        message: &str,
        current: Option<&LiteCondition>,
        now: &Time,
    ) -> serde_json::Value {
        let status = if status { "True" } else { "False" };
        let transition = match current {
            Some(c) if c.status == status => c
                .last_transition_time
                .clone()
                .unwrap_or_else(|| now.clone()),
            _ => now.clone(),
        };
        serde_json::json!({
            "status": {
                "conditions": [{
                    "type": type_,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": transition,
                }]
            }
        })
    }
}

/// Reads `status.conditions`, keeping only [`CONDITION_TYPE`]; the others (the kubelet's) are
/// skipped without being allocated.
fn our_condition<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<LiteCondition>, D::Error> {
    struct Visit;
    impl<'de> serde::de::Visitor<'de> for Visit {
        type Value = Vec<LiteCondition>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of node conditions")
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(Vec::new())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut ours = Vec::new();
            while let Some(c) = seq.next_element::<MaybeOurs>()? {
                if let MaybeOurs(Some(c)) = c {
                    ours.push(c);
                }
            }
            Ok(ours)
        }
    }
    d.deserialize_any(Visit)
}

/// One condition: ours in full, anyone else's skipped.
struct MaybeOurs(Option<LiteCondition>);

impl<'de> Deserialize<'de> for MaybeOurs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Raw<'a> {
            #[serde(rename = "type", borrow)]
            type_: Cow<'a, str>,
            #[serde(default)]
            status: Option<String>,
            #[serde(default)]
            reason: Option<String>,
            #[serde(default)]
            message: Option<String>,
            #[serde(default)]
            last_transition_time: Option<Time>,
        }
        let raw = Raw::deserialize(d)?;
        if raw.type_ != CONDITION_TYPE && raw.type_ != INTERCONNECT_CONDITION_TYPE {
            return Ok(MaybeOurs(None));
        }
        Ok(MaybeOurs(Some(LiteCondition {
            type_: raw.type_.into_owned(),
            status: raw.status.unwrap_or_default(),
            reason: raw.reason,
            message: raw.message,
            last_transition_time: raw.last_transition_time,
        })))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LiteNodeInfo {
    #[serde(rename = "bootID", default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

/// The metadata fields we use; managed fields, owner references and the rest are skipped.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMeta {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    annotations: Option<BTreeMap<String, String>>,
}

fn lite_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let raw = RawMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: raw.name,
        uid: raw.uid,
        resource_version: raw.resource_version,
        creation_timestamp: raw.creation_timestamp,
        deletion_timestamp: raw.deletion_timestamp,
        labels: raw.labels,
        annotations: raw.annotations,
        ..ObjectMeta::default()
    })
}

/// The body of a server-side apply to Node `name`: the labels and annotations this field
/// manager owns, whole (an apply gives up every key it leaves out). With the UID, an apply to a
/// node deleted meanwhile fails (409) instead of creating a new Node of that name; with the
/// resourceVersion, it applies to the node as read or not at all.
pub(crate) fn apply_body(
    name: &str,
    uid: Option<&str>,
    resource_version: Option<&str>,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> serde_json::Value {
    let mut metadata = serde_json::Map::new();
    metadata.insert("name".into(), name.into());
    metadata.insert("labels".into(), serde_json::json!(labels));
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), serde_json::json!(annotations));
    }
    if let Some(uid) = uid {
        metadata.insert("uid".into(), uid.into());
    }
    if let Some(rv) = resource_version {
        metadata.insert("resourceVersion".into(), rv.into());
    }
    serde_json::json!({ "apiVersion": "v1", "kind": "Node", "metadata": metadata })
}

impl LiteStatus {
    pub fn boot_id(&self) -> Option<&str> {
        self.node_info.boot_id.as_deref().filter(|b| !b.is_empty())
    }
}

impl k8s_openapi::Resource for WireNode {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Node";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "nodes";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::Metadata for WireNode {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl LiteNode {
    /// The node's name (empty if it has none, as `ResourceExt::name_any` without a
    /// `generateName`).
    pub fn name_any(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }

    /// The node's name, borrowed.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// A reference to the node, as `kube::Resource::object_ref` makes one (where Events about
    /// it point; `kubectl describe node` finds them by its UID).
    pub(crate) fn object_ref(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: self.metadata.name.clone(),
            resource_version: self.metadata.resource_version.clone(),
            uid: self.metadata.uid.clone(),
            ..Default::default()
        }
    }

    pub fn provider_id(&self) -> &str {
        self.spec.provider_id.as_deref().unwrap_or("")
    }

    pub fn boot_id(&self) -> Option<&str> {
        self.status.boot_id()
    }

    /// Our `TopologyLabeled` condition, if the node carries one.
    pub fn topology_condition(&self) -> Option<&LiteCondition> {
        self.status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_TYPE)
    }

    /// Our `UltraServerInterconnectImpaired` condition, if the node carries one.
    pub(crate) fn interconnect_condition(&self) -> Option<&LiteCondition> {
        self.status
            .conditions
            .iter()
            .find(|c| c.type_ == INTERCONNECT_CONDITION_TYPE)
    }

    pub fn labels(&self) -> Cow<'_, BTreeMap<String, String>> {
        whole(&self.metadata.labels, &self.packed_labels)
    }

    /// Its labels, read in place (packed or not), in key order.
    pub(crate) fn label_pairs(&self) -> impl Iterator<Item = (&str, &str)> + Clone {
        pairs(&self.metadata.labels, &self.packed_labels)
    }

    /// The value of the label `key`, read in place.
    pub(crate) fn label_ref(&self, key: &str) -> Option<&str> {
        value(&self.metadata.labels, &self.packed_labels, key)
    }

    /// Its annotations as the metadata or the packed map hold them, read in place, in key
    /// order: without a verification record kept as its parts (see [`KeptRecord`]; read it
    /// through [`LiteNode::annotation`]).
    pub(crate) fn annotation_pairs(&self) -> impl Iterator<Item = (&str, &str)> + Clone {
        pairs(&self.metadata.annotations, &self.packed_annotations)
    }

    /// Does the node carry the label `key`? (Without unpacking packed labels.)
    pub(crate) fn has_label(&self, key: &str) -> bool {
        value(&self.metadata.labels, &self.packed_labels, key).is_some()
    }

    /// The value of the label `key`, if any.
    pub fn label(&self, key: &str) -> Option<String> {
        value(&self.metadata.labels, &self.packed_labels, key).map(str::to_owned)
    }

    /// Move the labels out of the metadata into one packed allocation: for nodes kept in the
    /// cache (thousands of them), read through [`LiteNode::labels`].
    pub(crate) fn pack_labels(&mut self) {
        pack(&mut self.metadata.labels, &mut self.packed_labels);
    }

    /// Packed labels equal to another node's, and a kept record's answer equal to another
    /// node's, share their allocation.
    pub fn share(&mut self, sharing: &mut Sharing) {
        if let Some(packed) = self.packed_labels.take() {
            self.packed_labels = Some(PackedMap(sharing.labels.share(packed.0)));
        }
        if let Some(record) = self.record.as_mut() {
            record.answer = sharing.answers.share(record.answer.clone());
        }
    }

    /// The packed labels, for hashing what changed.
    pub(crate) fn packed_labels(&self) -> Option<&PackedMap> {
        self.packed_labels.as_ref()
    }

    pub fn annotations(&self) -> Cow<'_, BTreeMap<String, String>> {
        let whole = whole(&self.metadata.annotations, &self.packed_annotations);
        match &self.record {
            None => whole,
            Some(record) => {
                let mut all = whole.into_owned();
                all.insert(VERIFIED_KEY.to_owned(), record.text());
                Cow::Owned(all)
            }
        }
    }

    /// The value of the annotation `key`, if any (without unpacking).
    pub fn annotation(&self, key: &str) -> Option<Cow<'_, str>> {
        match &self.record {
            Some(record) if key == VERIFIED_KEY => Some(Cow::Owned(record.text())),
            _ => {
                value(&self.metadata.annotations, &self.packed_annotations, key).map(Cow::Borrowed)
            }
        }
    }

    /// As [`LiteNode::pack_labels`], for the annotations; a verification record is kept as
    /// its parts (see [`KeptRecord`]).
    pub(crate) fn pack_annotations(&mut self) {
        if let Some(map) = self.metadata.annotations.as_mut() {
            if let Some(record) = map.get(VERIFIED_KEY).and_then(|t| KeptRecord::keep(t)) {
                map.remove(VERIFIED_KEY);
                self.record = Some(Box::new(record));
            }
            if map.is_empty() {
                self.metadata.annotations = None;
            }
        }
        pack(&mut self.metadata.annotations, &mut self.packed_annotations);
    }

    /// The verification record as kept, for hashing what changed.
    pub(crate) fn kept_record(&self) -> Option<&KeptRecord> {
        self.record.as_deref()
    }

    /// The packed annotations, for hashing what changed.
    pub(crate) fn packed_annotations(&self) -> Option<&PackedMap> {
        self.packed_annotations.as_ref()
    }
}

type Plain = Option<BTreeMap<String, String>>;

/// A map that is either in the metadata (not packed yet, or not packable) or packed.
fn whole<'a>(plain: &'a Plain, packed: &Option<PackedMap>) -> Cow<'a, BTreeMap<String, String>> {
    match (plain, packed) {
        (Some(m), _) => Cow::Borrowed(m),
        (None, Some(p)) => Cow::Owned(p.unpack()),
        (None, None) => Cow::Owned(BTreeMap::new()),
    }
}

/// A map's pairs wherever they are (see [`whole`]), read in place.
fn pairs<'a>(
    plain: &'a Plain,
    packed: &'a Option<PackedMap>,
) -> impl Iterator<Item = (&'a str, &'a str)> + Clone {
    let plain_pairs = plain
        .iter()
        .flat_map(|m| m.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let packed_pairs = packed
        .iter()
        .filter(|_| plain.is_none())
        .flat_map(PackedMap::iter);
    plain_pairs.chain(packed_pairs)
}

fn value<'a>(plain: &'a Plain, packed: &'a Option<PackedMap>, key: &str) -> Option<&'a str> {
    match (plain, packed) {
        (Some(m), _) => m.get(key).map(String::as_str),
        (None, Some(p)) => p.iter().find(|(k, _)| *k == key).map(|(_, v)| v),
        (None, None) => None,
    }
}

fn pack(plain: &mut Plain, packed: &mut Option<PackedMap>) {
    if let Some(map) = plain.take() {
        *packed = PackedMap::pack(&map);
        if packed.is_none() && !map.is_empty() {
            // Not packable (a NUL byte in a value, as an annotation could hold): kept as is.
            *plain = Some(map);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::cached::UID;

    #[test]
    fn reads_what_we_need_and_skips_the_rest() {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": "n1", "uid": "u1", "resourceVersion": "42",
                "labels": {"a": "b"},
                "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
                "ownerReferences": []
            },
            "spec": {"providerID": "aws:///us-west-2a/i-0123456789abcdef0", "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {
                "nodeInfo": {"bootID": "boot-1", "kernelVersion": "6.1"},
                "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}],
                "images": [{"names": ["x"], "sizeBytes": 1}]
            }
        });
        let n: LiteNode = serde_json::from_value(json).unwrap();
        assert_eq!(n.metadata.name.as_deref(), Some("n1"));
        assert_eq!(n.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(n.provider_id(), "aws:///us-west-2a/i-0123456789abcdef0");
        assert_eq!(n.boot_id(), Some("boot-1"));
        assert_eq!(n.labels()["a"], "b");
        assert_eq!(n.spec.taints.len(), 1);
        assert_eq!(n.spec.taints[0].key, "k");
        assert!(
            n.status.conditions.is_empty(),
            "the kubelet's conditions are not kept"
        );
    }

    #[test]
    fn keeps_only_our_conditions() {
        let json = serde_json::json!({
            "metadata": {"name": "n1"},
            "status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": "2026-01-01T00:00:00Z"},
                {"type": "TopologyLabeled", "status": "False", "reason": "Ec2Unavailable", "message": "m",
                 "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:00:00Z"},
                {"type": "UltraServerInterconnectImpaired", "status": "True", "reason": "InterconnectImpaired"}
            ]}
        });
        let n: LiteNode = serde_json::from_value(json).unwrap();
        assert_eq!(n.status.conditions.len(), 2);
        let i = n.interconnect_condition().unwrap();
        assert_eq!(
            (i.status.as_str(), i.reason.as_deref()),
            ("True", Some("InterconnectImpaired"))
        );
        let c = n.topology_condition().unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some("Ec2Unavailable"))
        );
        assert!(c.last_transition_time.is_some());
        let null: LiteNode = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "n"}, "status": {"conditions": null}}),
        )
        .unwrap();
        assert!(null.topology_condition().is_none());
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn packed_labels_read_back_exactly() {
        let labels = map(&[
            ("topology.k8s.aws/network-node-layer-1", "nn-1"),
            ("topology.k8s.aws/network-node-layer-2", "nn-2"),
            ("node.kubernetes.io/instance-type", "p5.48xlarge"),
            ("empty", ""),
        ]);
        let mut n = LiteNode::default();
        n.metadata.labels = Some(labels.clone());
        n.pack_labels();
        assert!(n.metadata.labels.is_none(), "moved out of the metadata");
        assert_eq!(*n.labels(), labels);
        assert!(n.has_label("empty") && !n.has_label("nn-1"));
        assert_eq!(
            n.label("node.kubernetes.io/instance-type").as_deref(),
            Some("p5.48xlarge")
        );
        assert_eq!(n.label("missing"), None);
        let mut none = LiteNode::default();
        none.pack_labels();
        assert!(none.labels().is_empty() && none.packed_labels().is_none());
    }

    #[test]
    fn labels_and_annotations_read_in_place_are_the_whole_maps() {
        let labels = map(&[
            ("topology.k8s.aws/network-node-layer-1", "nn-1"),
            ("node.kubernetes.io/instance-type", "p5.48xlarge"),
            ("empty", ""),
        ]);
        let annotations = map(&[("a", "1"), ("b", "")]);
        let odd = map(&[("a", "x\0y")]);
        let owned = |pairs: Vec<(&str, &str)>| -> BTreeMap<String, String> {
            pairs
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        for pack in [false, true] {
            let mut n = LiteNode::default();
            n.metadata.labels = Some(labels.clone());
            n.metadata.annotations = Some(annotations.clone());
            let mut unpackable = LiteNode::default();
            unpackable.metadata.annotations = Some(odd.clone());
            if pack {
                n.pack_labels();
                n.pack_annotations();
                unpackable.pack_annotations();
                assert!(n.packed_labels().is_some() && n.packed_annotations().is_some());
            }
            assert_eq!(owned(n.label_pairs().collect()), labels, "packed: {pack}");
            assert_eq!(owned(n.annotation_pairs().collect()), annotations);
            assert_eq!(owned(unpackable.annotation_pairs().collect()), odd);
            assert_eq!(n.label_ref("empty"), Some(""));
            assert_eq!(n.label_ref("missing"), None);
            // In key order, each key once.
            let keys: Vec<&str> = n.label_pairs().map(|(k, _)| k).collect();
            assert_eq!(keys, labels.keys().map(String::as_str).collect::<Vec<_>>());
        }
        let none = LiteNode::default();
        assert_eq!(
            none.label_pairs().count() + none.annotation_pairs().count(),
            0
        );
    }

    #[test]
    fn packed_annotations_read_back_exactly() {
        let record = r#"{"v":1,"instanceId":"i-0123456789abcdef0","networkNodes":["nn-1","nn-2"],"sum":"0123456789abcdef"}"#;
        let annotations = map(&[
            ("ec2-topology-labeler.io/verified", record),
            ("ec2-topology-labeler.io/other", ""),
        ]);
        let mut n = LiteNode::default();
        n.metadata.annotations = Some(annotations.clone());
        n.pack_annotations();
        assert!(
            n.metadata.annotations.is_none(),
            "moved out of the metadata"
        );
        assert_eq!(*n.annotations(), annotations);
        assert_eq!(
            n.annotation("ec2-topology-labeler.io/verified").as_deref(),
            Some(record)
        );
        assert_eq!(
            n.annotation("ec2-topology-labeler.io/other").as_deref(),
            Some("")
        );
        assert_eq!(n.annotation("missing"), None);
        // A value with a NUL (an annotation may hold any text) cannot be packed: kept as it is,
        // and read the same.
        let odd = map(&[("ec2-topology-labeler.io/verified", "a\0b")]);
        let mut kept = LiteNode::default();
        kept.metadata.annotations = Some(odd.clone());
        kept.pack_annotations();
        assert_eq!(kept.metadata.annotations.as_ref(), Some(&odd), "not packed");
        assert!(kept.packed_annotations().is_none());
        assert_eq!(
            kept.annotation("ec2-topology-labeler.io/verified")
                .as_deref(),
            Some("a\0b")
        );
        let mut none = LiteNode::default();
        none.pack_annotations();
        assert!(none.annotations().is_empty() && none.packed_annotations().is_none());
    }

    fn record(instance: &str, leaf: &str) -> String {
        Verified {
            topology: InstanceTopology {
                instance_id: instance.into(),
                instance_type: Some("p5.48xlarge".into()),
                availability_zone: Some("us-west-2a".into()),
                zone_id: Some("usw2-az1".into()),
                network_nodes: vec!["nn-top".into(), "nn-mid".into(), leaf.into()],
                ..InstanceTopology::default()
            },
            boot_id: Some("5d3a1c2e-8f4b-4a6c-9e7d-0b1f2a3c4d5e".into()),
            at: 1_796_300_000,
        }
        .encode(
            &crate::verified::RecordKey::new(b"a test key of thirty-two bytes or more")
                .expect("a key"),
        )
    }

    fn cached(annotations: &[(&str, &str)], sharing: &mut Sharing) -> LiteNode {
        let mut n = LiteNode::default();
        n.metadata.annotations = Some(map(annotations));
        n.pack_annotations();
        n.share(sharing);
        n
    }

    /// A record we wrote is kept as its parts, its answer shared by the nodes under one
    /// switch, and reads back as the very text it was; any other value under the record's key
    /// (not in the form we write it) is kept as its text.
    #[test]
    fn a_record_is_kept_as_its_parts_and_reads_back_as_it_was() {
        let mut sharing = Sharing::default();
        let (a, b, c) = (
            record("i-0aaaaaaaaaaaaaaaa", "nn-leaf-1"),
            record("i-0bbbbbbbbbbbbbbbb", "nn-leaf-1"),
            record("i-0cccccccccccccccc", "nn-leaf-2"),
        );
        let other = ("ec2-topology-labeler.io/other", "x");
        let na = cached(&[(VERIFIED_KEY, &a), other], &mut sharing);
        let nb = cached(&[(VERIFIED_KEY, &b)], &mut sharing);
        let nc = cached(&[(VERIFIED_KEY, &c)], &mut sharing);
        for (n, text) in [(&na, &a), (&nb, &b), (&nc, &c)] {
            assert!(n.kept_record().is_some(), "kept as its parts");
            assert_eq!(n.annotation(VERIFIED_KEY).as_deref(), Some(text.as_str()));
            assert_eq!(
                n.annotations().get(VERIFIED_KEY).map(String::as_str),
                Some(text.as_str())
            );
        }
        assert_eq!(*na.annotations(), map(&[(VERIFIED_KEY, &a), other]));
        assert!(nb.metadata.annotations.is_none() && nb.packed_annotations().is_none());
        assert_eq!(sharing.len().1, 2, "two switches, two answers kept");
        let answer = |n: &LiteNode| n.kept_record().map(|r| r.answer.clone());
        assert!(Arc::ptr_eq(&answer(&na).unwrap(), &answer(&nb).unwrap()));
        // Edited: kept as its parts too (whether it is trusted is judged with the key, not
        // here), and read back as the very text it is.
        let tampered = a.replacen("nn-leaf-1", "nn-leaf-9", 1);
        let n = cached(&[(VERIFIED_KEY, &tampered)], &mut sharing);
        assert!(n.kept_record().is_some());
        assert_eq!(
            n.annotation(VERIFIED_KEY).as_deref(),
            Some(tampered.as_str())
        );
        // Not as we write it: kept as text, read back as it is.
        let spaced = a.replacen(',', ", ", 1);
        for text in [spaced, "{}".to_string()] {
            let n = cached(&[(VERIFIED_KEY, &text)], &mut sharing);
            assert!(n.kept_record().is_none(), "{text}");
            assert_eq!(n.annotation(VERIFIED_KEY).as_deref(), Some(text.as_str()));
        }
    }

    /// The cache keeps a node in its compact form and gives it back whole: every field a
    /// reconcile reads comes back as it went in, absent strings absent and empty ones empty,
    /// packed or not.
    #[test]
    fn a_cached_node_expands_to_the_node_it_was() {
        let text = record("i-0123456789abcdef0", "nn-leaf-1");
        let json = serde_json::json!({
            "metadata": {
                "name": "ip-10-0-0-1.us-west-2.compute.internal", "uid": "", "resourceVersion": "42",
                "creationTimestamp": "2026-12-04T12:00:00Z",
                "labels": {"topology.k8s.aws/network-node-layer-1": "nn-1", "k": ""},
                "annotations": {VERIFIED_KEY: text, "ec2-topology-labeler.io/odd": "a\0b"}
            },
            "spec": {"providerID": "aws:///us-west-2a/i-0123456789abcdef0",
                     "taints": [{"key": "ec2-topology-labeler.io/topology-pending", "effect": "NoSchedule"}]},
            "status": {
                "nodeInfo": {"bootID": "5d3a1c2e-8f4b-4a6c-9e7d-0b1f2a3c4d5e"},
                "conditions": [{"type": "TopologyLabeled", "status": "True", "reason": "Labelled"}]
            }
        });
        let mut sharing = Sharing::default();
        let mut packed: LiteNode = serde_json::from_value(json.clone()).unwrap();
        packed.pack_labels();
        packed.pack_annotations();
        packed.share(&mut sharing);
        let unpacked: LiteNode = serde_json::from_value(json).unwrap();
        let bare = LiteNode::default();
        for n in [&packed, &unpacked, &bare] {
            let cached = CachedNode::from(n);
            assert_eq!(&cached.expand(), n);
            assert_eq!(cached.name(), n.name());
            assert_eq!(cached.provider_id(), n.provider_id());
            assert_eq!(cached.labels(), n.labels());
            assert_eq!(cached.topology_condition(), n.topology_condition());
            assert_eq!(cached.object_ref(), n.object_ref());
        }
        let cached = CachedNode::from(&packed);
        assert_eq!(cached.text(UID).as_deref(), Some(""), "empty, not absent");
        assert_eq!(CachedNode::from(&bare).text(UID), None);
        // A UID and a boot ID are kept as a UUID's 16 bytes only when they read back exactly.
        for (uid, boot) in [
            (
                "0d6f3c1e-4b2a-4f8e-9c7d-1a2b3c4d5e6f",
                "5d3a1c2e-8f4b-4a6c-9e7d-0b1f2a3c4d5e",
            ),
            (
                "0D6F3C1E-4B2A-4F8E-9C7D-1A2B3C4D5E6F",
                "5d3a1c2e8f4b4a6c9e7d0b1f2a3c4d5e",
            ),
            ("uid-1", ""),
        ] {
            let mut n = packed.clone();
            n.metadata.uid = Some(uid.into());
            n.status.node_info.boot_id = Some(boot.into());
            let cached = CachedNode::from(&n);
            assert_eq!(cached.expand(), n);
            assert_eq!(cached.uid().as_deref(), Some(uid));
            assert_eq!(cached.name(), n.name());
            assert_eq!(cached.provider_id(), n.provider_id());
        }
        assert_eq!(
            cached
                .label("topology.k8s.aws/network-node-layer-1")
                .as_deref(),
            Some("nn-1")
        );
        assert_eq!(
            cached.expand().annotation(VERIFIED_KEY).as_deref(),
            Some(text.as_str())
        );
    }

    #[test]
    fn a_node_without_spec_or_status_is_fine() {
        let n: LiteNode =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}})).unwrap();
        assert_eq!(n.provider_id(), "");
        assert_eq!(n.boot_id(), None);
    }
}

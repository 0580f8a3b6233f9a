//! The Node as the controller reads it: only what a reconcile needs.
//!
//! A kubelet's Node is 10–20 kB of JSON (`status.images`, conditions, managed fields). Watching
//! it as `k8s_openapi`'s `Node` allocates all of that for every event of every node; this type
//! lets serde skip what we never read, so the watch costs less CPU and the cache and every
//! event in flight stay small. It is still the `v1` Node resource (same API path, same verbs).
//!
//! Owns: how a Node is read (serde skips the rest). Never writes one.

use std::{borrow::Cow, collections::BTreeMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Deserializer, Serialize};

/// `v1` Node, reduced to metadata, `spec.providerID` and `status.nodeInfo.bootID`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LiteNode {
    #[serde(deserialize_with = "lite_meta", default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: LiteSpec,
    #[serde(default)]
    pub status: LiteStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LiteSpec {
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LiteStatus {
    #[serde(rename = "nodeInfo", default)]
    pub node_info: LiteNodeInfo,
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

impl LiteStatus {
    pub fn boot_id(&self) -> Option<&str> {
        self.node_info.boot_id.as_deref().filter(|b| !b.is_empty())
    }
}

impl k8s_openapi::Resource for LiteNode {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Node";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "nodes";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::Metadata for LiteNode {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl LiteNode {
    pub fn provider_id(&self) -> &str {
        self.spec.provider_id.as_deref().unwrap_or("")
    }

    pub fn boot_id(&self) -> Option<&str> {
        self.status.boot_id()
    }

    pub fn labels(&self) -> Cow<'_, BTreeMap<String, String>> {
        match &self.metadata.labels {
            Some(l) => Cow::Borrowed(l),
            None => Cow::Owned(BTreeMap::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(n.metadata.managed_fields.is_none());
        assert_eq!(n.provider_id(), "aws:///us-west-2a/i-0123456789abcdef0");
        assert_eq!(n.boot_id(), Some("boot-1"));
        assert_eq!(n.labels()["a"], "b");
    }

    #[test]
    fn a_node_without_spec_or_status_is_fine() {
        let n: LiteNode =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}})).unwrap();
        assert_eq!(n.provider_id(), "");
        assert_eq!(n.boot_id(), None);
    }
}

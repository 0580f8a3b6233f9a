//! The one node builder of the unit tests: a [`LiteNode`] with only what a test names.

use k8s_openapi::{api::core::v1::Taint, apimachinery::pkg::apis::meta::v1::Time};

use crate::node::{LiteCondition, LiteNode};

/// A node named `name`, nothing else set.
pub(crate) fn node(name: &str) -> NodeBuilder {
    let mut n = LiteNode::default();
    n.metadata.name = Some(name.into());
    NodeBuilder(n)
}

/// A node without a name (tests of what a reconcile reads from other fields).
pub(crate) fn unnamed() -> NodeBuilder {
    NodeBuilder(LiteNode::default())
}

pub(crate) struct NodeBuilder(LiteNode);

impl NodeBuilder {
    /// Its UID, `uid-NAME`.
    pub(crate) fn uid(mut self) -> Self {
        let name = self.0.metadata.name.clone().unwrap_or_default();
        self.0.metadata.uid = Some(format!("uid-{name}"));
        self
    }

    pub(crate) fn resource_version(mut self, rv: Option<&str>) -> Self {
        self.0.metadata.resource_version = rv.map(String::from);
        self
    }

    pub(crate) fn provider_id(mut self, provider_id: &str) -> Self {
        self.0.spec.provider_id = Some(provider_id.into());
        self
    }

    /// Created `seconds` before `now` (`None`: no creation time).
    pub(crate) fn created(mut self, seconds: Option<i64>, now: &Time) -> Self {
        self.0.metadata.creation_timestamp =
            seconds.map(|s| Time(now.0 - k8s_openapi::jiff::SignedDuration::from_secs(s)));
        self
    }

    /// These labels, besides those set already.
    pub(crate) fn labels<K: ToString, V: ToString>(mut self, labels: &[(K, V)]) -> Self {
        let map = self.0.metadata.labels.get_or_insert_default();
        for (k, v) in labels {
            map.insert(k.to_string(), v.to_string());
        }
        self
    }

    /// The layer labels `PREFIX1`, `PREFIX2`, … set to `path`, top first.
    pub(crate) fn path(self, prefix: &str, path: &[&str]) -> Self {
        let labels: Vec<(String, &str)> = path
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("{prefix}{}", i + 1), *v))
            .collect();
        self.labels(&labels)
    }

    pub(crate) fn taint(mut self, key: &str, effect: &str) -> Self {
        self.0.spec.taints.push(Taint {
            key: key.into(),
            effect: effect.into(),
            ..Taint::default()
        });
        self
    }

    pub(crate) fn condition(mut self, condition: LiteCondition) -> Self {
        self.0.status.conditions.push(condition);
        self
    }

    pub(crate) fn build(self) -> LiteNode {
        self.0
    }

    /// Built with its labels packed, as the node cache keeps them.
    pub(crate) fn packed(mut self) -> LiteNode {
        self.0.pack_labels();
        self.0
    }
}

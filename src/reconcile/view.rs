//! What the controller says about one node at `/debug/nodes/NODE` on its admin server (loopback
//! only): which replica answered, whether it leads, its record of the node, what its EC2 cache
//! holds about the instance. Served by the running controller, read by `explain`.
//!
//! Owns: that view. Never talks to the API server or EC2.

use serde::{Deserialize, Serialize};

use crate::{lookup::cache::CacheView, node::LiteNode, provider_id, reconcile::nodes::RecordView};

/// The controller's view of one node, served on loopback at `/debug/nodes/NODE`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerView {
    /// The replica that answered.
    pub identity: String,
    pub leading: bool,
    /// The node is in this replica's node cache.
    pub cached: bool,
    /// Its record (`None` before its first reconcile on this replica, and on followers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<RecordView>,
    /// What the EC2 cache holds about its instance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lookup: Option<CacheView>,
}

/// The controller's side: what it knows about `name`.
pub(crate) fn controller_view(
    identity: &str,
    leading: bool,
    node: Option<&LiteNode>,
    record: Option<RecordView>,
    lookup: &crate::lookup::Lookup,
) -> ControllerView {
    let cache = node
        .and_then(|n| provider_id::parse(n.provider_id()).ok())
        .and_then(|i| lookup.inspect(&i.instance_id));
    ControllerView {
        identity: identity.to_string(),
        leading,
        cached: node.is_some(),
        record,
        lookup: cache,
    }
}

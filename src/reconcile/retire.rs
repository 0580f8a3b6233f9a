//! Labels we wrote under an earlier configuration and no longer manage (an extra turned off,
//! `--layer-label-prefix` changed): found from each Node's managed fields and removed at start-up
//! by the leader, in one pass, logged and counted — not silently at whatever write happens next
//! (server-side apply drops keys we owned and no longer send). `plan` shows them.
//!
//! Only keys our field manager owns are touched. A key another manager co-owns (EKS's cloud
//! controller writes the same layer keys) stays on the node: we only give up our share of it.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use futures::{StreamExt, stream};
use k8s_openapi::{api::core::v1::Node, apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry};
use kube::{
    Api, ResourceExt,
    api::{ListParams, ObjectMeta, Patch, PatchParams},
};
use tracing::{info, warn};

use crate::{FIELD_MANAGER, labels::LabelScheme, leader::Leadership, metrics::Metrics};

/// Label and annotation keys `manager` owns, as the managed fields record them.
pub(crate) fn owned_keys(
    managed: &[ManagedFieldsEntry],
    manager: &str,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut labels = BTreeSet::new();
    let mut annotations = BTreeSet::new();
    for entry in managed
        .iter()
        .filter(|e| e.manager.as_deref() == Some(manager))
    {
        let Some(fields) = entry.fields_v1.as_ref() else {
            continue;
        };
        let meta = fields.0.get("f:metadata");
        for (set, key) in [
            (&mut labels, "f:labels"),
            (&mut annotations, "f:annotations"),
        ] {
            if let Some(map) = meta.and_then(|m| m.get(key)).and_then(|v| v.as_object()) {
                set.extend(
                    map.keys()
                        .filter_map(|k| k.strip_prefix("f:"))
                        .map(str::to_owned),
                );
            }
        }
    }
    (labels, annotations)
}

/// What one node carries that we wrote and no longer manage, and what we still manage.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Retired {
    /// Keys to give up (removed when only we own them).
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// Keys we own and still manage, with their current values: re-applied as they are, so
    /// that the apply gives up exactly the retired ones.
    keep_labels: BTreeMap<String, String>,
    keep_annotations: BTreeMap<String, String>,
}

impl Retired {
    pub(crate) fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// The keys on this node that our field manager owns but `scheme` no longer manages.
pub(crate) fn retired(scheme: &LabelScheme, meta: &ObjectMeta) -> Retired {
    let (owned_labels, owned_annotations) = owned_keys(
        meta.managed_fields.as_deref().unwrap_or_default(),
        FIELD_MANAGER,
    );
    let (labels, keep_labels) = split(meta.labels.as_ref(), &owned_labels, |k| {
        scheme.is_family_label(k)
    });
    let (annotations, keep_annotations) =
        split(meta.annotations.as_ref(), &owned_annotations, |k| {
            scheme.is_family_annotation(k)
        });
    Retired {
        labels,
        annotations,
        keep_labels,
        keep_annotations,
    }
}

type Map = BTreeMap<String, String>;

/// The entries of `map` that we own, split into (no longer managed, still managed).
fn split(
    map: Option<&Map>,
    owned: &BTreeSet<String>,
    managed: impl Fn(&str) -> bool,
) -> (Map, Map) {
    map.into_iter()
        .flatten()
        .filter(|(k, _)| owned.contains(*k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .partition(|(k, _)| !managed(k))
}

/// The server-side apply that gives up the retired keys: everything else we own, as it is.
/// Carries the UID and resourceVersion, so it applies to the node as read or not at all.
pub(crate) fn apply_body(meta: &ObjectMeta, r: &Retired) -> serde_json::Value {
    crate::node::apply_body(
        meta.name.as_deref().unwrap_or_default(),
        meta.uid.as_deref(),
        meta.resource_version.as_deref(),
        &r.keep_labels,
        &r.keep_annotations,
    )
}

/// Retired keys per node name, from one paginated list of the Nodes' metadata.
pub(crate) async fn find(
    api: &Api<Node>,
    scheme: &LabelScheme,
) -> kube::Result<Vec<(ObjectMeta, Retired)>> {
    let mut out = Vec::new();
    crate::client::pages::each_page(
        ListParams::default(),
        crate::node::store::NODE_PAGE,
        |p| async move { api.list_metadata(&p).await },
        |items| {
            for item in items {
                let r = retired(scheme, &item.metadata);
                if !r.is_empty() {
                    out.push((item.metadata, r));
                }
            }
        },
    )
    .await?;
    Ok(out)
}

/// How many times one node's retirement is sent: a node that changed between the read and the
/// write (a kubelet status update, another writer) is read again and retried with what it holds.
const RETIRE_ATTEMPTS: usize = 3;

/// Remove, once, every key we wrote and no longer manage. `leader` is asked before each write.
/// Returns how many nodes were changed.
pub(crate) async fn retire_all(
    api: &Api<Node>,
    scheme: &LabelScheme,
    leader: &crate::leader::Leadership,
    metrics: &crate::metrics::Metrics,
) -> kube::Result<usize> {
    let found = find(api, scheme).await?;
    if found.is_empty() {
        return Ok(0);
    }
    let changed = stream::iter(found)
        .map(|(meta, r)| retire_one(api, scheme, leader, metrics, meta, r))
        .buffer_unordered(16)
        .filter(|changed| std::future::ready(*changed))
        .count()
        .await;
    Ok(changed)
}

/// One node's retirement: applied to the node as read (UID and resourceVersion); on a conflict,
/// read again and sent again with what the node holds now, at most `RETIRE_ATTEMPTS` times.
async fn retire_one(
    api: &Api<Node>,
    scheme: &LabelScheme,
    leader: &crate::leader::Leadership,
    metrics: &crate::metrics::Metrics,
    mut meta: ObjectMeta,
    mut r: Retired,
) -> bool {
    let name = meta.name.clone().unwrap_or_default();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for attempt in 1..=RETIRE_ATTEMPTS {
        if !leader.is_leader() {
            return false;
        }
        match api
            .patch(&name, &params, &Patch::Apply(apply_body(&meta, &r)))
            .await
        {
            Ok(node) => {
                let still: Vec<&String> = r
                    .labels
                    .keys()
                    .filter(|k| node.labels().contains_key(*k))
                    .collect();
                metrics.label_write("retire");
                info!(node = %name, retired = ?r.labels.keys().collect::<Vec<_>>(),
                    retired_annotations = ?r.annotations.keys().collect::<Vec<_>>(),
                    kept_by_other_managers = ?still,
                    "removed labels and annotations this configuration no longer manages");
                return true;
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < RETIRE_ATTEMPTS => {
                match api.get_metadata_opt(&name).await {
                    Ok(Some(fresh)) => {
                        let again = retired(scheme, &fresh.metadata);
                        if again.is_empty() {
                            // Someone else removed them meanwhile, or the node was replaced.
                            return false;
                        }
                        meta = fresh.metadata;
                        r = again;
                    }
                    // Deleted since the list: nothing left to retire.
                    Ok(None) => return false,
                    Err(e) => {
                        warn!(node = %name, error = %e, "could not read the node again to remove labels this configuration no longer manages; the next start-up tries again");
                        return false;
                    }
                }
            }
            // Deleted since the list, refused, or changed on every attempt: the next start-up
            // (or `plan`) sees it again.
            Err(e) => {
                warn!(node = %name, error = %e, attempts = attempt, "could not remove labels this configuration no longer manages; the next start-up tries again");
                return false;
            }
        }
    }
    false
}

/// Once this replica leads and its cache synced: remove the labels we wrote under an earlier
/// configuration and no longer manage (see [`retire_all`]).
pub(crate) async fn retire_at_start(
    api: Api<k8s_openapi::api::core::v1::Node>,
    scheme: LabelScheme,
    leader: Leadership,
    metrics: Arc<Metrics>,
    synced: Arc<AtomicBool>,
) {
    let mut delay = Duration::from_secs(5);
    loop {
        leader
            .leading_with(&synced, Duration::from_millis(500))
            .await;
        match retire_all(&api, &scheme, &leader, &metrics).await {
            Ok(0) => return,
            Ok(n) => {
                info!(
                    nodes = n,
                    "removed labels and annotations this configuration no longer manages"
                );
                return;
            }
            Err(e) => {
                warn!(error = %e, retry_in_s = delay.as_secs(), "cannot list nodes to find labels no longer managed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(300));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
    use serde_json::json;

    fn entry(manager: &str, labels: &[&str], annotations: &[&str]) -> ManagedFieldsEntry {
        let f = |keys: &[&str]| -> serde_json::Value {
            keys.iter().map(|k| (format!("f:{k}"), json!({}))).collect()
        };
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            fields_v1: Some(FieldsV1(json!({ "f:metadata": {
                "f:labels": f(labels), "f:annotations": f(annotations)
            }}))),
            ..ManagedFieldsEntry::default()
        }
    }

    const CB: &str = "ec2-topology-labeler.io/capacity-block-id";
    const L3: &str = "topology.k8s.aws/network-node-layer-3";

    fn meta() -> ObjectMeta {
        ObjectMeta {
            name: Some("n".into()),
            uid: Some("u".into()),
            resource_version: Some("7".into()),
            labels: Some(
                [(L3, "nn-c"), (CB, "cr-1"), ("kubernetes.io/hostname", "n")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
            ),
            managed_fields: Some(vec![
                entry(FIELD_MANAGER, &[L3, CB], &[]),
                entry("kubelet", &["kubernetes.io/hostname"], &[]),
            ]),
            ..ObjectMeta::default()
        }
    }

    /// `--capacity-block-label=false`: the capacity-block label we wrote is given up (the apply
    /// that does it sends every other key we own, unchanged); other managers' keys are never
    /// considered.
    #[test]
    fn an_extra_turned_off_is_retired_and_nothing_else() {
        let scheme = LabelScheme {
            capacity_block_key: None,
            ..LabelScheme::default()
        };
        let r = retired(&scheme, &meta());
        assert_eq!(r.labels, [(CB.to_string(), "cr-1".to_string())].into());
        assert!(r.annotations.is_empty());
        let body = apply_body(&meta(), &r);
        assert_eq!(body["metadata"]["labels"], json!({ L3: "nn-c" }));
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(body["metadata"]["uid"], "u");
        assert!(
            retired(&LabelScheme::default(), &meta()).is_empty(),
            "all still managed"
        );
    }

    #[test]
    fn a_new_layer_prefix_retires_the_old_layer_keys_we_own() {
        let scheme = LabelScheme {
            layer_prefix: "example.com/tier-".into(),
            ..LabelScheme::default()
        };
        let r = retired(&scheme, &meta());
        assert_eq!(r.labels.keys().collect::<Vec<_>>(), vec![L3]);
    }

    #[test]
    fn keys_only_others_own_are_never_retired() {
        let mut m = meta();
        m.managed_fields = Some(vec![entry("eks", &[L3, CB], &[])]);
        let scheme = LabelScheme {
            capacity_block_key: None,
            layer_prefix: "example.com/tier-".into(),
            ..LabelScheme::default()
        };
        assert!(retired(&scheme, &m).is_empty());
    }

    /// A node that changed between the list and the write (a kubelet status update moved its
    /// resourceVersion): the apply is refused with 409, the node is read again, and the keys
    /// are retired by a second apply carrying the new resourceVersion, not left for the next
    /// start-up.
    #[tokio::test]
    async fn a_node_changed_since_the_list_is_read_again_and_retired() {
        use http::{Method, Request, Response};
        use kube::client::Body;
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let api: Api<Node> = Api::all(kube::Client::new(service, "default"));
        let scheme = LabelScheme {
            capacity_block_key: None,
            ..LabelScheme::default()
        };
        let leader = crate::leader::Leadership::leading_until_stepped_down();
        let metrics = crate::metrics::Metrics::default();
        let partial = |rv: &str| {
            let mut m = meta();
            m.resource_version = Some(rv.into());
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": m})
        };
        let server = async {
            let mut seen = Vec::new();
            for step in 0..4 {
                let (req, send) =
                    tokio::time::timeout(std::time::Duration::from_secs(5), handle.next_request())
                        .await
                        .expect("a request within 5 s")
                        .expect("a request");
                let method = req.method().clone();
                let body = req
                    .into_body()
                    .collect_bytes()
                    .await
                    .expect("the request body");
                let (code, answer) = match step {
                    0 => (
                        200,
                        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                        "metadata": {}, "items": [partial("7")]}),
                    ),
                    1 => (
                        409,
                        json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                        "code": 409, "reason": "Conflict", "message": "the object has been modified"}),
                    ),
                    2 => (200, partial("8")),
                    _ => (
                        200,
                        json!({"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": "n", "labels": {L3: "nn-c"}}}),
                    ),
                };
                seen.push((
                    method,
                    serde_json::from_slice::<serde_json::Value>(&body).ok(),
                ));
                send.send_response(
                    Response::builder()
                        .status(code)
                        .body(Body::from(serde_json::to_vec(&answer).expect("json")))
                        .expect("response"),
                );
            }
            seen
        };
        let (changed, seen) = tokio::join!(retire_all(&api, &scheme, &leader, &metrics), server);
        assert_eq!(changed.expect("retired"), 1, "the node was changed");
        let methods: Vec<&Method> = seen.iter().map(|(m, _)| m).collect();
        assert_eq!(
            methods,
            [&Method::GET, &Method::PATCH, &Method::GET, &Method::PATCH]
        );
        let rv = |i: usize| {
            seen[i].1.as_ref().expect("an apply body")["metadata"]["resourceVersion"].clone()
        };
        assert_eq!(
            rv(1),
            json!("7"),
            "the first apply is to the node as listed"
        );
        assert_eq!(rv(3), json!("8"), "the retry is to the node as read again");
        let labels = &seen[3].1.as_ref().expect("an apply body")["metadata"]["labels"];
        assert!(
            labels.get(CB).is_none(),
            "the retry still gives up the key: {labels}"
        );
    }
}

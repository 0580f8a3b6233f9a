//! Volcano `HyperNode`s (`topology.volcano.sh/v1alpha1`) kept in step with the labelled nodes.
//!
//! Tiers count from the nodes up: tier 1 is the switch an instance hangs off, selecting its
//! Nodes by label (so nodes coming and going need no HyperNode update); each tier above lists
//! the HyperNodes below by exact name. On 4-layer instance types the top layer is therefore
//! tier 4, on 3-layer types tier 3: `highestTierAllowed: N` always means "within N hops of the
//! nodes". [`desired`] is pure; [`HyperNodeSync`] applies the difference.
//!
//! Owns: HyperNodes ours by label, name prefix and owner annotation. Never touches any other, not
//! even one of our label and prefix without the annotation (the chart's admission policy refuses
//! our ServiceAccount any change to a HyperNode not annotated as this installation's).

use std::{
    collections::{BTreeMap, BTreeSet},
    hash::{DefaultHasher, Hash, Hasher},
    sync::Arc,
};

use kube::{
    Api, Client, ResourceExt,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    },
};
use tracing::{info, warn};

use crate::{
    FIELD_MANAGER,
    labels::LabelScheme,
    metrics::Metrics,
    tree::{Conflict, NodeView},
};

use super::{
    owner::{Claim, MANAGED_BY, OWNER, claim},
    plugin::{Item, Purpose, Scope, Setup, delete, labelled},
};

mod desired;
pub(crate) use desired::owned_by;
pub use desired::{HyperNode, Tier0, desired};

/// A HyperNode this installation would publish that another installation holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Taken {
    pub name: String,
    /// The other installation's Lease; `None`: our label and prefix, but no owner annotation.
    pub owner: Option<String>,
}

/// Why a sync wrote nothing, or stopped.
#[derive(Debug)]
pub(crate) enum SyncError {
    Api(kube::Error),
    /// HyperNodes we would publish are another installation's (both use one name prefix):
    /// nothing is written, since a part of the tree would be wrong for Volcano.
    Taken(Vec<Taken>),
}

impl From<kube::Error> for SyncError {
    fn from(e: kube::Error) -> Self {
        SyncError::Api(e)
    }
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncError::Api(e) => e.fmt(f),
            SyncError::Taken(t) => {
                let owners: BTreeSet<&str> = t.iter().filter_map(|t| t.owner.as_deref()).collect();
                let unclaimed: Vec<&str> = t
                    .iter()
                    .filter(|t| t.owner.is_none())
                    .map(|t| t.name.as_str())
                    .collect();
                let mut said = false;
                if let Some(first) = t.iter().find(|t| t.owner.is_some()) {
                    write!(
                        f,
                        "{} HyperNodes this installation would publish (such as {}) belong to another installation ({}) using the same name prefix; give each installation its own --volcano-hypernode-prefix",
                        t.len() - unclaimed.len(),
                        first.name,
                        owners.into_iter().collect::<Vec<_>>().join(", ")
                    )?;
                    said = true;
                }
                if let Some(first) = unclaimed.first() {
                    write!(
                        f,
                        "{}{} HyperNodes this installation would publish (such as {first}) exist with our label but without the annotation {OWNER}: not ours to change; annotate them with this installation's Lease to make them ours, or delete them",
                        if said { "; " } else { "" },
                        unclaimed.len(),
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// What one sync did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SyncStats {
    pub applied: usize,
    pub deleted: usize,
    pub(crate) unchanged: usize,
}

/// Applies the difference between the desired HyperNodes and those we own.
pub(crate) struct HyperNodeSync {
    api: Api<DynamicObject>,
    prefix: String,
    owner: String,
    leader: crate::leader::Leadership,
    /// What the last successful sync applied, and when it listed.
    last: Option<(u64, tokio::time::Instant)>,
    /// A tree that stays the same is listed again this often (a HyperNode deleted by hand, or
    /// taken by another installation, is seen then).
    recheck: std::time::Duration,
}

pub(crate) fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("topology.volcano.sh", "v1alpha1", "HyperNode"),
        "hypernodes",
    )
}

impl HyperNodeSync {
    /// `prefix`: this installation's HyperNode name prefix; `owner`: its Lease
    /// (`<namespace>/<name>`, see [`OWNER`]); `recheck`: how often an unchanged tree is compared
    /// with the cluster again; `leader`: checked again right before every write and delete.
    pub(crate) fn new(
        client: Client,
        prefix: &str,
        owner: &str,
        recheck: std::time::Duration,
        leader: crate::leader::Leadership,
    ) -> Self {
        Self {
            api: Api::all_with(client, &api_resource()),
            prefix: prefix.to_string(),
            owner: owner.to_string(),
            leader,
            last: None,
            recheck,
        }
    }

    /// Bring the cluster's HyperNodes to `desired`. Nothing is sent when `desired` is what the
    /// last successful sync applied, less than `recheck` ago. Another installation's HyperNodes are never written or
    /// deleted; when one of them has a name we would publish, nothing is written.
    pub(crate) async fn sync(&mut self, desired: &[HyperNode]) -> Result<SyncStats, SyncError> {
        let mut h = DefaultHasher::new();
        desired.hash(&mut h);
        let hash = h.finish();
        if self
            .last
            .is_some_and(|(h, at)| h == hash && at.elapsed() < self.recheck)
        {
            return Ok(SyncStats::default());
        }
        let listed = tokio::time::Instant::now();
        let selector = format!("{}={}", MANAGED_BY.0, MANAGED_BY.1);
        let mut existing: BTreeMap<String, DynamicObject> = BTreeMap::new();
        let mut others: BTreeMap<String, Option<String>> = BTreeMap::new();
        // Page by page: one HyperNode per network node is thousands in a large fleet.
        crate::client::pages::each_page(
            ListParams::default().labels(&selector),
            super::plugin::PAGE,
            |p| {
                let api = self.api.clone();
                async move { api.list(&p).await }
            },
            |items| {
                for o in items {
                    let name = o.name_any();
                    if !owned_by(&self.prefix, &name) {
                        continue;
                    }
                    match claim(&o, &self.owner) {
                        Claim::Other(owner) => {
                            others.insert(name, Some(owner));
                        }
                        Claim::Unclaimed => {
                            others.insert(name, None);
                        }
                        Claim::Ours => {
                            existing.insert(name, o);
                        }
                    }
                }
            },
        )
        .await?;
        let taken: Vec<Taken> = desired
            .iter()
            .filter_map(|h| {
                others.get(&h.name).map(|owner| Taken {
                    name: h.name.clone(),
                    owner: owner.clone(),
                })
            })
            .collect();
        if !taken.is_empty() {
            return Err(SyncError::Taken(taken));
        }
        let mut stats = SyncStats::default();
        let mut failed: Option<kube::Error> = None;
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for hn in desired {
            let object = hn.to_object(&self.owner);
            let same = existing
                .get(&hn.name)
                .is_some_and(|live| live.data.get("spec") == object.get("spec"));
            if same {
                stats.unchanged += 1;
                continue;
            }
            if !self.leader.is_leader() {
                return Ok(stats);
            }
            // One object that fails (a write that hangs until its deadline, a webhook refusing
            // it) does not hold back the others: each is tried, the first error is returned.
            match self
                .api
                .patch(&hn.name, &params, &Patch::Apply(object))
                .await
            {
                Ok(_) => stats.applied += 1,
                Err(e) => {
                    warn!(hypernode = %hn.name, error = %e, "applying a HyperNode failed; going on with the others");
                    failed.get_or_insert(e);
                }
            }
        }
        let wanted: BTreeSet<&str> = desired.iter().map(|h| h.name.as_str()).collect();
        for name in existing.keys().filter(|n| !wanted.contains(n.as_str())) {
            // The list may be seconds old under load; a replica that lost the lease meanwhile
            // must not delete what the new leader just made.
            if !self.leader.is_leader() {
                return Ok(stats);
            }
            match self.api.delete(name, &DeleteParams::default()).await {
                Ok(_) => stats.deleted += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    warn!(hypernode = %name, error = %e, "deleting a HyperNode failed; going on with the others");
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e.into());
        }
        if stats.applied + stats.deleted > 0 {
            info!(
                applied = stats.applied,
                deleted = stats.deleted,
                total = desired.len(),
                "HyperNodes updated"
            );
        }
        self.last = Some((hash, listed));
        Ok(stats)
    }

    /// Whether the last successful sync listed less than `recheck` ago (the same tree would
    /// send nothing).
    pub(crate) fn fresh(&self) -> bool {
        self.last.is_some_and(|(_, at)| at.elapsed() < self.recheck)
    }

    /// Forget what was applied (after losing leadership, or an error): the next sync compares
    /// against the cluster again.
    pub(crate) fn reset(&mut self) {
        self.last = None;
    }
}

/// Log conflicts once per distinct set.
pub(crate) fn report_conflicts(conflicts: &[Conflict]) {
    for c in conflicts.iter().take(10) {
        warn!(
            network_node = %c.network_node,
            tier = c.layer,
            parents = ?c.parents,
            "not publishing HyperNodes: a network node would have two parents (inconsistent labels)"
        );
    }
}

/// Keeps the HyperNode tree in step with the labelled nodes; publishes nothing while the labels
/// put a network node under two parents (reported once per distinct set).
pub(crate) struct VolcanoPublisher {
    sync: HyperNodeSync,
    prefix: String,
    scheme: LabelScheme,
    /// What tier 0 holds: each UltraServer under a leaf (`--ultraserver-level` not `never`;
    /// only nodes with a capacity block make one), or each NVLink clique of one
    /// (`--nvlink-clique-level`), or nothing.
    tier0: Tier0,
    metrics: Arc<Metrics>,
    events: crate::admin::events::Events,
    last_conflicts: Vec<Conflict>,
    /// The last error logged (each distinct one is logged once).
    last_error: Option<String>,
}

impl VolcanoPublisher {
    /// `owner`: this installation's Lease, `<namespace>/<name>` (see [`OWNER`]); `recheck`: how
    /// often an unchanged tree is compared with the cluster again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        client: Client,
        prefix: &str,
        owner: &str,
        recheck: std::time::Duration,
        scheme: LabelScheme,
        metrics: Arc<Metrics>,
        events: crate::admin::events::Events,
        leader: crate::leader::Leadership,
    ) -> Self {
        Self {
            sync: HyperNodeSync::new(client, prefix, owner, recheck, leader),
            prefix: prefix.to_string(),
            scheme,
            tier0: Tier0::UltraServers,
            metrics,
            events,
            last_conflicts: Vec::new(),
            last_error: None,
        }
    }

    /// Tier 0 holding `tier0` (UltraServers unless told).
    pub(crate) fn with_tier0(mut self, tier0: Tier0) -> Self {
        self.tier0 = tier0;
        self
    }

    async fn publish_views(&mut self, views: &[NodeView]) {
        match desired(&self.scheme, views, &self.prefix, self.tier0) {
            Ok(desired) => {
                self.last_conflicts.clear();
                self.metrics.hypernode_conflicts(0);
                match self.sync.sync(&desired).await {
                    Ok(stats) => {
                        self.metrics
                            .hypernodes(desired.len(), stats.applied, stats.deleted);
                        self.last_error = None;
                    }
                    Err(e) => {
                        self.sync.reset();
                        self.metrics.publish_failed("volcano");
                        // Once per distinct error, not once per interval.
                        let text = e.to_string();
                        if self.last_error.replace(text.clone()) != Some(text) {
                            warn!(error = %e, "cannot sync Volcano HyperNodes; trying again every interval");
                            if let SyncError::Taken(taken) = &e {
                                self.report_taken(taken);
                            }
                        }
                    }
                }
            }
            Err(conflicts) => {
                self.metrics.hypernode_conflicts(conflicts.len());
                if conflicts != self.last_conflicts {
                    report_conflicts(&conflicts);
                    self.last_conflicts = conflicts;
                }
            }
        }
    }
}

impl VolcanoPublisher {
    /// A Warning Event on each of the first HyperNodes another installation holds.
    fn report_taken(&self, taken: &[Taken]) {
        for t in taken.iter().take(10) {
            self.events.publish(
                crate::admin::events::Reason::HyperNodeOwnedByAnother,
                "PublishHyperNodes",
                &match &t.owner {
                    None => format!(
                        "this HyperNode has our label and name prefix but no annotation {OWNER}: not ours to change, so the installation using this prefix publishes no HyperNode; annotate it with that installation's Lease (<namespace>/<name>) to make it theirs, or delete it"
                    ),
                    Some(owner) => format!(
                        "this HyperNode belongs to the installation with Lease {owner} (annotation {OWNER}); the installation using the same prefix publishes no HyperNode until each has its own --volcano-hypernode-prefix (if that Lease was this installation's own before a rename, annotate it with the new Lease)"
                    ),
                },
                k8s_openapi::api::core::v1::ObjectReference {
                    api_version: Some("topology.volcano.sh/v1alpha1".into()),
                    kind: Some("HyperNode".into()),
                    name: Some(t.name.clone()),
                    ..Default::default()
                },
            );
        }
    }
}

impl super::Publisher for VolcanoPublisher {
    fn name(&self) -> &'static str {
        "volcano"
    }

    fn needs_nodes(&self) -> bool {
        true
    }

    fn publish<'a>(&'a mut self, nodes: &'a [NodeView]) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(self.publish_views(nodes))
    }

    fn fresh(&self) -> bool {
        self.sync.fresh()
    }

    fn reset(&mut self) {
        self.sync.reset();
    }
}

/// Volcano's HyperNodes as a plug-in.
pub(crate) struct Plugin;

impl super::plugin::Plugin for Plugin {
    fn kind(&self) -> &'static str {
        "hypernode"
    }

    fn build(&self, s: &Setup<'_>) -> Result<Vec<Box<dyn super::Publisher>>, String> {
        let a = s.args;
        Ok(a.volcano
            .volcano_hypernodes
            .then(|| {
                let p = VolcanoPublisher::new(
                    s.client.clone(),
                    &a.volcano.volcano_hypernode_prefix,
                    s.owner,
                    a.publish_interval
                        .0
                        .max(std::time::Duration::from_millis(100))
                        .saturating_mul(12),
                    s.scheme.clone(),
                    s.metrics.clone(),
                    s.events.clone(),
                    s.leader.clone(),
                );
                let p = p.with_tier0(
                    if a.ultraserver_level == super::topology::UltraServerLevel::Never {
                        Tier0::Off
                    } else if a.nvlink_clique_level {
                        Tier0::Cliques
                    } else {
                        Tier0::UltraServers
                    },
                );
                Box::new(p) as Box<dyn super::Publisher>
            })
            .into_iter()
            .collect())
    }

    /// This installation's prefix and, by the owner annotation, as `scope` says (another
    /// installation's of that prefix are listed as kept by `uninstall`, with why). Turned off,
    /// all go: Volcano re-plans from what exists.
    fn leftovers<'a>(
        &'a self,
        client: &'a Client,
        scope: Scope<'a>,
        purpose: Purpose<'a>,
    ) -> futures::future::BoxFuture<'a, Result<Vec<Item>, kube::Error>> {
        Box::pin(async move {
            let prefix = match purpose {
                Purpose::TurnedOff(args) if args.volcano.volcano_hypernodes => {
                    return Ok(Vec::new());
                }
                Purpose::TurnedOff(args) => args.volcano.volcano_hypernode_prefix.as_str(),
                Purpose::Uninstall(u) => u.flags.volcano.volcano_hypernode_prefix.as_str(),
            };
            Ok(labelled(client, &api_resource())
                .await?
                .into_iter()
                .filter(|o| owned_by(prefix, &o.name_any()))
                .filter_map(|o| scope.item("hypernode", &o))
                .collect())
        })
    }

    fn remove<'a>(
        &'a self,
        client: &'a Client,
        name: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<super::plugin::Removed, kube::Error>> {
        Box::pin(async move { delete(client, Some(api_resource()), name).await })
    }
}

/// The sync against a fake API server: what it sends when HyperNodes of our label and prefix
/// already exist, some written by another installation with the same prefix.
#[cfg(test)]
mod sync_tests {
    use std::time::Duration;

    use http::{Method, Request, Response};
    use kube::client::Body;
    use serde_json::{Value, json};

    use super::*;

    const ME: &str = "ec2tl-a/ec2-topology-labeler";
    const OTHER: &str = "ec2tl-b/ec2-topology-labeler";

    /// A HyperNode as the API server lists it: our label, and `owner` in the annotation.
    fn live(name: &str, owner: Option<&str>, spec: Value) -> Value {
        let mut meta = json!({ "name": name, "labels": { MANAGED_BY.0: MANAGED_BY.1 } });
        if let Some(o) = owner {
            meta["annotations"] = json!({ OWNER: o });
        }
        json!({ "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
            "metadata": meta, "spec": spec })
    }

    fn ok(body: &Value) -> Response<Body> {
        Response::builder()
            .status(200)
            .body(Body::from(serde_json::to_vec(body).expect("json")))
            .expect("response")
    }

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    /// This installation's sync (prefix `ec2tl`, owner [`ME`], recheck 60 s, leading) against a
    /// fake API server.
    fn mock_sync() -> (HyperNodeSync, Handle) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let sync = HyperNodeSync::new(
            Client::new(service, "default"),
            "ec2tl",
            ME,
            Duration::from_secs(60),
            crate::leader::Leadership::leading_until_stepped_down(),
        );
        (sync, handle)
    }

    /// Run one sync of `desired` against a server listing `existing` (in two pages when it holds
    /// two or more: the sync must follow the continue token); every request after the list is
    /// answered 200. Returns the sync's result and the (method, name, body) of each write and
    /// delete.
    async fn sync_against(
        desired: &[HyperNode],
        existing: Vec<Value>,
    ) -> (Result<SyncStats, SyncError>, Vec<(Method, String, Value)>) {
        let (mut sync, mut handle) = mock_sync();
        let api = async move {
            let mut seen = Vec::new();
            let (list, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
                .await
                .expect("the list within 5 s")
                .expect("the list");
            assert_eq!(list.method(), Method::GET);
            let query = list.uri().query().unwrap_or_default().to_string();
            assert!(query.contains("limit=500"), "paged: {query}");
            let mut pages = vec![existing];
            if pages[0].len() >= 2 {
                let half = pages[0].len() / 2;
                let second = pages[0].split_off(half);
                pages.push(second);
            }
            let last = pages.len() - 1;
            let mut send = Some(send);
            for (k, items) in pages.into_iter().enumerate() {
                let to = match send.take() {
                    Some(s) => s,
                    None => {
                        let (next, s) = handle.next_request().await.expect("the next page");
                        let query = next.uri().query().unwrap_or_default().to_string();
                        assert!(query.contains("continue=page-2"), "asked on: {query}");
                        s
                    }
                };
                let meta = if k < last {
                    json!({"continue": "page-2"})
                } else {
                    json!({})
                };
                to.send_response(ok(&json!({
                    "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNodeList",
                    "metadata": meta, "items": items })));
            }
            // Bounded: the sync is done when no request comes for a second.
            while let Ok(Some((req, send))) =
                tokio::time::timeout(Duration::from_secs(1), handle.next_request()).await
            {
                let method = req.method().clone();
                let name = req
                    .uri()
                    .path()
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let bytes = req
                    .into_body()
                    .collect_bytes()
                    .await
                    .expect("the request body");
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let answer = if method == Method::DELETE {
                    json!({"apiVersion": "v1", "kind": "Status", "status": "Success"})
                } else {
                    body.clone()
                };
                send.send_response(ok(&answer));
                seen.push((method, name, body));
            }
            seen
        };
        let (result, seen) = tokio::join!(sync.sync(desired), api);
        (result, seen)
    }

    /// One HyperNode's write hangs (the API server never answers it): it is cut at the client's
    /// deadline and the others are still written; the sync reports the error.
    #[tokio::test(start_paused = true)]
    async fn one_hanging_write_does_not_hold_back_the_others() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let args = crate::client::ClientArgs {
            kube_request_timeout: crate::duration::HumanDuration(Duration::from_secs(5)),
            ..crate::client::ClientArgs::default()
        };
        let client = crate::client::over(service, "default", crate::client::Policy::new(&args));
        let mut sync = HyperNodeSync::new(
            client,
            "ec2tl",
            ME,
            Duration::from_secs(60),
            crate::leader::Leadership::leading_until_stepped_down(),
        );
        let written = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = written.clone();
        tokio::spawn(async move {
            let mut patches = 0;
            while let Some((req, send)) = handle.next_request().await {
                if req.method() == Method::GET {
                    send.send_response(ok(&json!({
                        "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNodeList",
                        "metadata": {}, "items": [] })));
                    continue;
                }
                patches += 1;
                if patches == 1 {
                    // Never answered.
                    std::mem::forget(send);
                    continue;
                }
                let name = req
                    .uri()
                    .path()
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let bytes = req.into_body().collect_bytes().await.expect("body");
                seen.lock().expect("lock").push(name);
                send.send_response(ok(&serde_json::from_slice::<Value>(&bytes).expect("json")));
            }
        });
        let started = tokio::time::Instant::now();
        let result = sync.sync(&tree()).await;
        assert!(result.is_err(), "the hanging write is reported");
        assert_eq!(
            written.lock().expect("lock").len(),
            2,
            "the other two are written"
        );
        assert!(
            started.elapsed() <= Duration::from_secs(6),
            "{:?}",
            started.elapsed()
        );
    }

    fn tree() -> Vec<HyperNode> {
        let s = LabelScheme::default();
        desired(
            &s,
            &[NodeView::labelled("n1", &s, &["s", "a", "m"])],
            "ec2tl",
            Tier0::UltraServers,
        )
        .expect("a tree")
    }

    /// Two installations with the default prefix: ours deletes none of the other's HyperNodes
    /// (not even those it would not publish), and marks its own as its.
    #[tokio::test]
    async fn another_installations_hypernodes_are_never_deleted() {
        let (result, seen) = sync_against(
            &tree(),
            vec![live("ec2tl-t1-theirs", Some(OTHER), json!({"tier": 1}))],
        )
        .await;
        assert!(result.is_ok(), "{:?}", result.err().map(|e| e.to_string()));
        assert!(
            seen.iter().all(|(m, _, _)| m == Method::PATCH),
            "only our three applies, no delete: {seen:?}"
        );
        assert_eq!(seen.len(), 3, "{seen:?}");
        for (_, name, body) in &seen {
            assert_eq!(body["metadata"]["annotations"][OWNER], ME, "{name}");
        }
    }

    /// A HyperNode we would publish is the other installation's: we write nothing (neither it,
    /// nor the rest of a tree it belongs to), and say whose it is.
    #[tokio::test]
    async fn a_name_another_installation_holds_stops_our_writes() {
        let (result, seen) = sync_against(
            &tree(),
            vec![live("ec2tl-t1-m", Some(OTHER), json!({"tier": 1}))],
        )
        .await;
        assert!(seen.is_empty(), "no write: {seen:?}");
        let (taken, text) = taken(result);
        assert_eq!(
            taken,
            vec![Taken {
                name: "ec2tl-t1-m".into(),
                owner: Some(OTHER.into())
            }]
        );
        assert!(text.contains(OTHER), "{text}");
    }

    /// The HyperNodes a sync found taken, and its error's text; panics on any other outcome.
    fn taken(result: Result<SyncStats, SyncError>) -> (Vec<Taken>, String) {
        match result {
            Err(e @ SyncError::Taken(_)) => {
                let text = e.to_string();
                let SyncError::Taken(taken) = e else {
                    unreachable!()
                };
                (taken, text)
            }
            other => panic!("expected Taken, got {:?}", other.map_err(|e| e.to_string())),
        }
    }

    /// A HyperNode of our label and prefix without the owner annotation is not ours (the
    /// admission policy would refuse the write anyway): one we would publish stops the sync with
    /// what to do, one we would not is left alone, and nothing is written.
    #[tokio::test]
    async fn unannotated_hypernodes_of_our_prefix_are_left_alone() {
        let want = tree();
        let top = want
            .iter()
            .find(|h| h.name == "ec2tl-t3-s")
            .expect("the top")
            .to_object(ME);
        let (result, seen) = sync_against(
            &want,
            vec![
                live("ec2tl-t3-s", None, top["spec"].clone()),
                live("ec2tl-t1-gone", None, json!({"tier": 1})),
            ],
        )
        .await;
        assert!(seen.is_empty(), "no write: {seen:?}");
        let (taken, text) = taken(result);
        assert_eq!(
            taken,
            vec![Taken {
                name: "ec2tl-t3-s".into(),
                owner: None
            }]
        );
        assert!(
            text.contains("without the annotation ec2-topology-labeler.io/owner")
                && text.contains("ec2tl-t3-s")
                && !text.contains("another installation"),
            "{text}"
        );
    }

    /// An unchanged tree sends nothing at the next interval, but is listed again at the recheck:
    /// a HyperNode deleted by hand meanwhile is put back.
    #[tokio::test(start_paused = true)]
    async fn an_unchanged_tree_is_compared_again_at_the_recheck() {
        let (mut sync, mut handle) = mock_sync();
        let want = tree();
        let empty = json!({ "apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNodeList",
            "metadata": {}, "items": [] });
        // Answer every request: the list empty, each apply with its body. Returns the methods.
        async fn serve(
            handle: &mut tower_test::mock::Handle<Request<Body>, Response<Body>>,
            list: &Value,
        ) -> Vec<Method> {
            let mut seen = Vec::new();
            while let Ok(Some((req, send))) =
                tokio::time::timeout(Duration::from_millis(100), handle.next_request()).await
            {
                seen.push(req.method().clone());
                let body = if req.method() == Method::GET {
                    list.clone()
                } else {
                    let bytes = req.into_body().collect_bytes().await.expect("the body");
                    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
                };
                send.send_response(ok(&body));
            }
            seen
        }
        let (first, seen) = tokio::join!(sync.sync(&want), serve(&mut handle, &empty));
        assert!(first.is_ok());
        assert_eq!(seen.len(), 4, "a list and three applies: {seen:?}");
        let (second, seen) = tokio::join!(sync.sync(&want), serve(&mut handle, &empty));
        assert!(second.is_ok());
        assert!(seen.is_empty(), "nothing sent within the recheck: {seen:?}");
        tokio::time::advance(Duration::from_secs(61)).await;
        let (third, seen) = tokio::join!(sync.sync(&want), serve(&mut handle, &empty));
        assert!(third.is_ok());
        assert_eq!(
            seen,
            vec![Method::GET, Method::PATCH, Method::PATCH, Method::PATCH],
            "listed again, and the missing HyperNodes applied"
        );
    }
}

/// Volcano's flags: its HyperNode tree.
#[derive(
    Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct VolcanoArgs {
    /// Keep a Volcano HyperNode tree in step with the labelled nodes.
    #[arg(long, env = "LABELER_VOLCANO_HYPERNODES", default_value_t = false, action = clap::ArgAction::Set)]
    pub volcano_hypernodes: bool,
    /// Prefix of the HyperNode names we own.
    #[arg(
        long,
        env = "LABELER_VOLCANO_HYPERNODE_PREFIX",
        default_value = HYPERNODE_PREFIX
    )]
    pub volcano_hypernode_prefix: String,
}

/// `--volcano-hypernode-prefix`'s default, for `run` and `uninstall` alike.
const HYPERNODE_PREFIX: &str = "ec2tl";

/// `uninstall`'s Volcano flag.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct VolcanoUninstallFlags {
    /// Prefix of the HyperNode names this installation owns (as given to `run`).
    #[arg(
        long,
        env = "LABELER_VOLCANO_HYPERNODE_PREFIX",
        default_value = HYPERNODE_PREFIX
    )]
    pub volcano_hypernode_prefix: String,
}

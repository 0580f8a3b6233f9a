//! Slurm's topology in a ConfigMap: `topology.yaml` (Slurm 25.05 and later) and `topology.conf`
//! (the tree plugin), rendered from the labelled nodes by the pure generators `tree -o slurm`
//! and `-o slurm-yaml` use, kept in step for a Slurm controller that mounts it (`scontrol
//! reconfigure` after a change).
//!
//! Owns: that one ConfigMap, when we created it (our `managed-by` label). One of that name
//! without our label is never changed, only reported. Never deletes it while publishing;
//! `uninstall` removes ours.

use std::{
    collections::hash_map::DefaultHasher,
    hash::{Hash, Hasher},
    sync::Arc,
};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::json;
use tracing::{error, info, warn};

use super::{
    Publisher,
    owner::MANAGED_BY,
    plugin::{Item, Purpose, Removed, Scope, Setup},
};
use crate::{
    FIELD_MANAGER, admin::events::Events, labels::LabelScheme, metrics::Metrics, slurm::Problem,
    tree::NodeView,
};

/// The files this publisher may keep in the ConfigMap.
const FILES: [&str; 2] = ["topology.yaml", "topology.conf"];

/// ConfigMaps hold at most 1 MiB; a bigger topology is reported, not sent.
pub(crate) const MAX_BYTES: usize = 1_000_000;

/// `NAMESPACE/NAME` of the ConfigMap.
pub(crate) fn parse_target(at: &str) -> Result<(String, String), String> {
    let valid = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    match at.split_once('/') {
        Some((ns, name)) if valid(ns) && valid(name) && ns.len() <= 63 && !ns.contains('.') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!(
            "--slurm-topology-configmap {at:?} is not NAMESPACE/NAME (lowercase DNS names)"
        )),
    }
}

pub(crate) use crate::slurm::{Files, data};

/// What fits a ConfigMap: every file; else `topology.yaml` alone (Slurm 25.05 and later read
/// only it when it exists), for fleets about twice as big; else the size that does not fit.
pub(crate) fn fitting(data: &[(String, String)]) -> Result<&[(String, String)], usize> {
    let size = |d: &[(String, String)]| d.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    let first = data.get(..1).unwrap_or_default();
    if size(data) <= MAX_BYTES {
        Ok(data)
    } else if !first.is_empty() && size(first) <= MAX_BYTES {
        Ok(first)
    } else {
        Err(size(data))
    }
}

/// What a sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Applied,
    Unchanged,
    NotOurs,
    TooBig(usize),
    /// This replica no longer leads: nothing written (the leader will).
    NotLeading,
}

pub(crate) struct SlurmPublisher {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    scheme: LabelScheme,
    files: Files,
    /// Hash of the data last applied (or last refused for its size), and when: nothing is sent
    /// while the topology stays the same; the ConfigMap is read again every `recheck` (someone
    /// may have edited or deleted it).
    last: Option<(u64, std::time::Instant)>,
    recheck: std::time::Duration,
    reported: bool,
    /// The problems last reported (each distinct set once).
    problems: Vec<Problem>,
    metrics: Arc<Metrics>,
    events: Events,
    /// Checked right before the write.
    leader: crate::leader::Leadership,
}

impl SlurmPublisher {
    /// `namespace`/`name` come from [`parse_target`] (checked at start-up).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        client: Client,
        (namespace, name): (String, String),
        files: Files,
        scheme: &LabelScheme,
        recheck: std::time::Duration,
        metrics: Arc<Metrics>,
        events: Events,
        leader: crate::leader::Leadership,
    ) -> Self {
        Self {
            leader,
            api: Api::namespaced(client, &namespace),
            namespace,
            name,
            scheme: scheme.clone(),
            files,
            last: None,
            recheck,
            reported: false,
            problems: Vec::new(),
            metrics,
            events,
        }
    }

    /// Labels that give no file slurmctld would load: the ConfigMap keeps what it has (a file
    /// slurmctld refuses stops it, at start and on `scontrol reconfigure`); each distinct set
    /// is logged and sent as a Warning Event on the ConfigMap once, the gauge says how many.
    fn refuse(&mut self, problems: Vec<Problem>) {
        self.metrics.slurm_topology_problems(problems.len());
        if problems == self.problems {
            return;
        }
        let at = format!("{}/{}", self.namespace, self.name);
        for p in problems.iter().take(10) {
            warn!(configmap = %at, problem = %p, "not publishing Slurm's topology: slurmctld would refuse it; the ConfigMap keeps its last valid files");
        }
        let shown: Vec<String> = problems.iter().take(3).map(ToString::to_string).collect();
        let more = problems.len().saturating_sub(shown.len());
        let mut note = format!(
            "labels give no topology slurmctld would load, ConfigMap left as it was: {}",
            shown.join("; ")
        );
        if more > 0 {
            note.push_str(&format!(" (and {more} more)"));
        }
        self.events.publish(
            crate::admin::events::Reason::SlurmTopologyInvalid,
            "PublishSlurmTopology",
            &note,
            ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("ConfigMap".into()),
                namespace: Some(self.namespace.clone()),
                name: Some(self.name.clone()),
                ..ObjectReference::default()
            },
        );
        self.problems = problems;
    }

    async fn sync(&mut self, data: &[(String, String)]) -> Result<Outcome, kube::Error> {
        let send = match fitting(data) {
            Ok(send) => send,
            Err(size) => return Ok(Outcome::TooBig(size)),
        };
        // Keys of ours left out (topology.conf when only topology.yaml fits, or in
        // switches-only mode) must go.
        let dropped: Vec<&str> = FILES
            .into_iter()
            .filter(|f| send.iter().all(|(k, _)| k != f))
            .collect();
        if let Some(live) = self.api.get_opt(&self.name).await? {
            let ours = live
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MANAGED_BY.0))
                .is_some_and(|v| v == MANAGED_BY.1);
            if !ours {
                return Ok(Outcome::NotOurs);
            }
            let live_data = live.data.unwrap_or_default();
            if send.iter().all(|(k, v)| live_data.get(k) == Some(v))
                && dropped.iter().all(|k| !live_data.contains_key(*k))
            {
                return Ok(Outcome::Unchanged);
            }
        }
        let files: serde_json::Map<String, serde_json::Value> =
            send.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        let object = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": { MANAGED_BY.0: MANAGED_BY.1 },
            },
            "data": files,
        });
        // The reads above take time, in which the lease can pass to another replica.
        if !self.leader.is_leader() {
            return Ok(Outcome::NotLeading);
        }
        self.api
            .patch(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(object),
            )
            .await?;
        if send.len() < data.len() {
            warn!(configmap = %format!("{}/{}", self.namespace, self.name), left_out = ?dropped, "both Slurm files do not fit a ConfigMap: topology.yaml only (Slurm 25.05 and later)");
        }
        Ok(Outcome::Applied)
    }
}

impl Publisher for SlurmPublisher {
    fn name(&self) -> &'static str {
        "slurm"
    }

    fn needs_nodes(&self) -> bool {
        true
    }

    fn publish<'a>(&'a mut self, nodes: &'a [NodeView]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let data = match data(&self.scheme, &self.files, nodes) {
                Ok(data) => data,
                Err(problems) => return self.refuse(problems),
            };
            if !self.problems.is_empty() {
                info!(configmap = %format!("{}/{}", self.namespace, self.name), "the labels give a valid Slurm topology again");
                self.problems.clear();
            }
            self.metrics.slurm_topology_problems(0);
            let mut h = DefaultHasher::new();
            data.hash(&mut h);
            let hash = h.finish();
            if self
                .last
                .is_some_and(|(h, at)| h == hash && at.elapsed() < self.recheck)
            {
                return;
            }
            let now = std::time::Instant::now();
            let at = format!("{}/{}", self.namespace, self.name);
            match self.sync(&data).await {
                Ok(Outcome::Applied) => {
                    info!(configmap = %at, nodes = nodes.len(), "Slurm topology ConfigMap updated");
                    self.reported = false;
                    self.last = Some((hash, now));
                }
                Ok(Outcome::Unchanged) => self.last = Some((hash, now)),
                Ok(Outcome::NotLeading) => {}
                Ok(Outcome::NotOurs) => {
                    if !self.reported {
                        warn!(configmap = %at, "a ConfigMap of that name exists without our app.kubernetes.io/managed-by label; left alone: delete it or choose another --slurm-topology-configmap");
                        self.reported = true;
                    }
                    self.metrics.publish_failed("slurm");
                    // Looked at again at the next recheck, not every interval.
                    self.last = Some((hash, now));
                }
                Ok(Outcome::TooBig(size)) => {
                    error!(configmap = %at, size, limit = MAX_BYTES, "Slurm's topology for this fleet is larger than a ConfigMap holds; not written (tree -o slurm-yaml prints it)");
                    self.metrics.publish_failed("slurm");
                    self.last = Some((hash, now));
                }
                Err(e) => {
                    warn!(configmap = %at, error = %e, "cannot write the Slurm topology ConfigMap; trying again later");
                    self.metrics.publish_failed("slurm");
                }
            }
        })
    }

    fn fresh(&self) -> bool {
        self.last.is_some_and(|(_, at)| at.elapsed() < self.recheck)
    }

    fn reset(&mut self) {
        self.last = None;
        self.reported = false;
        self.problems.clear();
    }
}

/// Slurm's ConfigMap as a plug-in.
pub(crate) struct Plugin;

impl super::plugin::Plugin for Plugin {
    fn kind(&self) -> &'static str {
        "configmap"
    }

    /// A malformed `--slurm-topology-configmap` is an error.
    fn build(&self, s: &Setup<'_>) -> Result<Vec<Box<dyn Publisher>>, String> {
        let Some(target) = s.args.slurm.slurm_topology_configmap.as_deref() else {
            return Ok(Vec::new());
        };
        Ok(vec![Box::new(SlurmPublisher::new(
            s.client.clone(),
            parse_target(target)?,
            s.slurm_files.clone(),
            s.scheme,
            s.args.publish_interval.0.saturating_mul(12),
            s.metrics.clone(),
            s.events.clone(),
            s.leader.clone(),
        ))])
    }

    /// Turned off, nothing (a slurmctld may mount it; `uninstall` removes it). Labelled only:
    /// a ConfigMap carries no owner annotation.
    fn leftovers<'a>(
        &'a self,
        client: &'a Client,
        _scope: Scope<'a>,
        purpose: Purpose<'a>,
    ) -> BoxFuture<'a, Result<Vec<Item>, kube::Error>> {
        Box::pin(async move {
            let ours = |c: &ConfigMap| {
                c.labels().get(MANAGED_BY.0).map(String::as_str) == Some(MANAGED_BY.1)
            };
            let item = |c: ConfigMap| {
                Item::remove(
                    "configmap",
                    format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()),
                )
            };
            let Purpose::Uninstall(u) = purpose else {
                return Ok(Vec::new());
            };
            match &u.flags.slurm.slurm_topology_configmap {
                Some(ConfigMaps::None) => Ok(Vec::new()),
                Some(ConfigMaps::One { namespace, name }) => {
                    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
                    Ok(api
                        .get_opt(name)
                        .await?
                        .filter(ours)
                        .map(item)
                        .into_iter()
                        .collect())
                }
                None => {
                    let api: Api<ConfigMap> = Api::all(client.clone());
                    let selector = super::owner::selector();
                    Ok(api
                        .list(&ListParams::default().labels(&selector))
                        .await?
                        .items
                        .into_iter()
                        .map(item)
                        .collect())
                }
            }
        })
    }

    /// `name` is `NAMESPACE/NAME`.
    fn remove<'a>(
        &'a self,
        client: &'a Client,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Removed, kube::Error>> {
        Box::pin(async move {
            let (ns, name) = name.split_once('/').unwrap_or(("default", name));
            Removed::of(
                Api::<ConfigMap>::namespaced(client.clone(), ns)
                    .delete(name, &DeleteParams::default())
                    .await,
            )
        })
    }
}

/// Slurm's flags: its topology ConfigMap.
#[derive(
    Debug, Clone, PartialEq, clap::Args, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct SlurmArgs {
    /// Keep Slurm's `topology.yaml` (the tree of the labelled nodes) in this ConfigMap,
    /// `NAMESPACE/NAME`; one that exists and is not ours is left alone.
    #[arg(long, env = "LABELER_SLURM_TOPOLOGY_CONFIGMAP")]
    #[schemars(regex(
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
    ))]
    pub slurm_topology_configmap: Option<String>,
}

/// Which Slurm ConfigMaps `uninstall` removes (each only if it carries our label); unset, every
/// ConfigMap of our label, in any namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigMaps {
    /// `--slurm-topology-configmap none`.
    None,
    /// The one `run` was given.
    One { namespace: String, name: String },
}

/// `none` or `NAMESPACE/NAME`, checked when the command line is read.
fn uninstall_target(at: &str) -> Result<ConfigMaps, String> {
    if at == "none" {
        return Ok(ConfigMaps::None);
    }
    let (namespace, name) = parse_target(at)?;
    Ok(ConfigMaps::One { namespace, name })
}

/// `uninstall`'s Slurm flag.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct SlurmUninstallFlags {
    /// The Slurm ConfigMap to remove (`NAMESPACE/NAME`, as given to `run`; removed only if it
    /// carries our managed-by label), or `none`. Unset: every ConfigMap with our label, in any
    /// namespace (needs cluster-wide ConfigMap list; the chart's hook names its one instead).
    #[arg(long, env = "LABELER_SLURM_TOPOLOGY_CONFIGMAP", value_parser = uninstall_target)]
    pub slurm_topology_configmap: Option<ConfigMaps>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_namespace_slash_name() {
        assert_eq!(
            parse_target("slurm/slurm-topology"),
            Ok(("slurm".into(), "slurm-topology".into()))
        );
        for bad in ["slurm", "/x", "x/", "Slurm/x", "a/b/c", "a.b/x", "x/-y"] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }

    fn files(switches_only: bool) -> Files {
        Files {
            tree_topology: "topo-switch".into(),
            switches_only,
        }
    }

    #[test]
    fn a_fleet_too_big_for_both_files_gets_topology_yaml_alone() {
        let file = |k: &str, n: usize| (k.to_string(), "x".repeat(n));
        let small = [file("topology.yaml", 10), file("topology.conf", 10)];
        assert_eq!(fitting(&small).map(<[_]>::len), Ok(2));
        let half = MAX_BYTES / 2 + 10;
        let big = [file("topology.yaml", half), file("topology.conf", half)];
        let sent = fitting(&big).unwrap();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0, "topology.yaml");
        let huge = [file("topology.yaml", MAX_BYTES), file("topology.conf", 1)];
        assert!(fitting(&huge).is_err());
    }

    #[test]
    fn the_data_holds_both_files_from_the_same_tree() {
        let s = LabelScheme::default();
        let nodes = [
            NodeView::labelled("n1", &s, &["nn-a", "nn-b", "nn-c"]),
            NodeView::labelled("n2", &s, &["nn-a", "nn-b", "nn-c"]),
        ];
        let data = data(&s, &files(false), &nodes).unwrap();
        let [(yk, yaml), (ck, conf)] = &data[..] else {
            panic!("two files: {data:?}");
        };
        assert_eq!(
            (yk.as_str(), ck.as_str()),
            ("topology.yaml", "topology.conf")
        );
        assert!(yaml.contains("- topology: topo-switch"), "{yaml}");
        assert!(yaml.contains("nodes: n1,n2"), "{yaml}");
        assert!(conf.contains("SwitchName=nn-c Nodes=n1,n2"), "{conf}");
    }

    #[test]
    fn switches_only_is_topology_yaml_alone_without_node_names() {
        let s = LabelScheme::default();
        let nodes = [NodeView::labelled("n1", &s, &["nn-a", "nn-b", "nn-c"])];
        let data = data(&s, &files(true), &nodes).unwrap();
        assert_eq!(data.len(), 1, "{data:?}");
        assert_eq!(data[0].0, "topology.yaml");
        assert!(!data[0].1.contains("n1"), "{}", data[0].1);
    }

    #[test]
    fn labels_slurmctld_would_refuse_give_no_data() {
        let s = LabelScheme::default();
        let nodes = [
            NodeView::labelled("a", &s, &["nn-t", "nn-m1", "nn-l"]),
            NodeView::labelled("b", &s, &["nn-t", "nn-m2", "nn-l"]),
        ];
        for switches_only in [false, true] {
            let got = data(&s, &files(switches_only), &nodes);
            assert!(
                matches!(&got, Err(p) if matches!(p[..], [Problem::TwoParents(_)])),
                "{got:?}"
            );
        }
    }

    /// Issue 26.7: the lease passes to another replica while the ConfigMap is read: nothing is
    /// written by this one (the check at the start of the publish tick came before the read).
    #[tokio::test]
    async fn a_lease_lost_during_the_read_writes_nothing() {
        use http::{Request, Response};
        use kube::client::Body;
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let leader = crate::leader::Leadership::leading_until_stepped_down();
        let s = LabelScheme::default();
        let mut publisher = SlurmPublisher::new(
            Client::new(service, "default"),
            ("slurm".into(), "slurm-topology".into()),
            files(false),
            &s,
            std::time::Duration::from_secs(60),
            Arc::new(Metrics::default()),
            Events::default(),
            leader.clone(),
        );
        let nodes = [NodeView::labelled("n1", &s, &["nn-a", "nn-b", "nn-c"])];
        let api = async {
            let (request, send) =
                tokio::time::timeout(std::time::Duration::from_secs(5), handle.next_request())
                    .await
                    .expect("the read within 5 s")
                    .expect("the read");
            assert_eq!(request.method(), http::Method::GET);
            leader.step_down();
            let missing = serde_json::json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                "code": 404, "reason": "NotFound", "message": "not found"});
            send.send_response(
                Response::builder()
                    .status(404)
                    .body(Body::from(serde_json::to_vec(&missing).expect("json")))
                    .expect("response"),
            );
        };
        // Bounded: a write sent after the step-down waits for an answer that never comes; it is
        // then seen below, as the request too many.
        let published =
            tokio::time::timeout(std::time::Duration::from_secs(5), publisher.publish(&nodes));
        let _ = tokio::join!(published, api);
        drop(publisher);
        let next =
            tokio::time::timeout(std::time::Duration::from_secs(1), handle.next_request()).await;
        assert!(
            matches!(next, Ok(None)),
            "no write after the lease was lost"
        );
    }
}

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
//! The reconciler against a mocked API server (`tower-test`): the exact requests it sends —
//! method, URI with field manager, content type, body — and that a no-op sends nothing.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use ec2_topology_labeler::reconcile::Action;
use ec2_topology_labeler::{
    labels::LabelScheme,
    lookup::limiter::{Limiter, LimiterConfig},
    lookup::{Lookup, LookupConfig},
    metrics::Metrics,
    node::{LiteNode, LiteNodeInfo, LiteSpec, LiteStatus},
    reconcile::{
        Context,
        gate::{Gate, WhenUnsupported},
        reconcile, warm,
    },
    topology::{Ec2Error, InstanceTopology, TopologySource},
    verified::{RecordKey, VERIFIED_KEY, Verified},
};
use http::{Method, Request, Response};
use kube::{Api, Client, client::Body};
use serde_json::{Value, json};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

const ID: &str = "i-0123456789abcdef0";
const L: &str = "topology.k8s.aws/network-node-layer-";

#[derive(Default)]
struct FakeState {
    answers: Mutex<HashMap<String, InstanceTopology>>,
    down: AtomicBool,
    /// Calls never return (a hung EC2 endpoint).
    hang: AtomicBool,
    /// How many IDs each call carried, in order.
    calls: Mutex<Vec<usize>>,
    /// Answer every instance ID asked for (with one shared topology).
    describe_all: AtomicBool,
}

#[derive(Clone, Default)]
struct Fake(Arc<FakeState>);

impl TopologySource for Fake {
    async fn describe(&self, _: &str, ids: &[String]) -> Result<Vec<InstanceTopology>, Ec2Error> {
        self.0.calls.lock().unwrap().push(ids.len());
        if self.0.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.0.down.load(Ordering::SeqCst) {
            return Err(Ec2Error::Transport("connection refused".into()));
        }
        if self.0.describe_all.load(Ordering::SeqCst) {
            return Ok(ids
                .iter()
                .map(|i| InstanceTopology {
                    instance_id: i.clone(),
                    instance_type: Some("p5.48xlarge".into()),
                    zone_id: Some("usw2-az1".into()),
                    network_nodes: vec!["nn-a".into(), "nn-b".into(), "nn-c".into()],
                    ..InstanceTopology::default()
                })
                .collect());
        }
        let answers = self.0.answers.lock().unwrap();
        Ok(ids.iter().filter_map(|i| answers.get(i).cloned()).collect())
    }
}

impl Fake {
    fn set(&self, nodes: &[&str]) {
        self.0.answers.lock().unwrap().insert(
            ID.into(),
            InstanceTopology {
                instance_id: ID.into(),
                instance_type: Some("p5.48xlarge".into()),
                zone_id: Some("usw2-az1".into()),
                network_nodes: nodes.iter().map(|s| s.to_string()).collect(),
                ..InstanceTopology::default()
            },
        );
    }
}

fn node(labels: &[(&str, &str)]) -> LiteNode {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut n = LiteNode::default();
    n.metadata = ec2_topology_labeler::node::LiteMeta {
        name: Some("ip-10-0-0-1.us-west-2.compute.internal".into()),
        uid: Some("5c3e1c0e-0000-4000-8000-000000000001".into()),
        labels: Some(labels),
        ..Default::default()
    };
    n.spec = LiteSpec {
        provider_id: Some(format!("aws:///us-west-2a/{ID}")),
        ..Default::default()
    };
    n.status = LiteStatus {
        node_info: LiteNodeInfo {
            boot_id: Some("boot-1".into()),
        },
        ..Default::default()
    };
    n
}

/// The key the controller under test seals and opens records with.
fn record_key() -> RecordKey {
    RecordKey::new(b"the reconcile tests' key, 32 bytes or more").expect("a key")
}

fn setup(fake: &Fake) -> (Arc<Context>, Handle) {
    let (ctx, handle) = setup_context(fake);
    (Arc::new(ctx), handle)
}

fn setup_context(fake: &Fake) -> (Context, Handle) {
    setup_with_window(fake, Duration::from_millis(1))
}

/// The same, with this batch window (the production default is 200 ms; most tests take 1 ms to
/// run fast, which a test of how calls fill cannot: a worker delayed past 1 ms on a loaded
/// machine sends a part-full call).
fn setup_with_window(fake: &Fake, batch_window: Duration) -> (Context, Handle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let metrics = Arc::new(Metrics::new());
    let lookup = Lookup::spawn(
        fake.clone(),
        Arc::new(Limiter::new(LimiterConfig::default())),
        LookupConfig {
            batch_window,
            ..LookupConfig::default()
        },
        metrics.clone(),
    )
    .with_record_key(Some(record_key()));
    let ctx = Context::new(
        Api::all(client),
        lookup,
        LabelScheme::default(),
        None,
        Duration::from_secs(3600),
        metrics,
    );
    (ctx, handle)
}

struct Seen {
    method: Method,
    uri: String,
    content_type: String,
    accept: String,
    body: Value,
}

/// Take the next request, answer it with `reply`, and return what was asked.
async fn answer(handle: &mut Handle, reply: Value) -> Seen {
    // A reconcile that sends nothing must fail the test, not hang it.
    let (request, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("a request within 5 s")
        .expect("a request");
    let method = request.method().clone();
    let uri = request.uri().to_string();
    let content_type = request
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let accept = request
        .headers()
        .get("accept")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let bytes = request.into_body().collect_bytes().await.unwrap();
    // A GET has no body.
    let body: Value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    send.send_response(
        Response::builder()
            .body(Body::from(serde_json::to_vec(&reply).unwrap()))
            .unwrap(),
    );
    Seen {
        method,
        uri,
        content_type,
        accept,
        body,
    }
}

/// After the context (the only client) is gone, the mock API server must have seen nothing more.
/// Run a reconcile that must send no request. Without this, one that does would wait for an
/// answer forever and hang the test instead of failing it.
async fn without_requests<T>(
    handle: &mut Handle,
    reconcile: impl std::future::Future<Output = T>,
) -> T {
    tokio::select! {
        out = tokio::time::timeout(Duration::from_secs(10), reconcile) => {
            out.expect("the reconcile finished within 10 s")
        }
        req = handle.next_request() => match req {
            Some((r, _)) => panic!("no request may be sent; got {} {}", r.method(), r.uri()),
            None => panic!("the API client was dropped"),
        },
    }
}

async fn assert_no_more_requests(ctx: Arc<Context>, mut handle: Handle) {
    drop(ctx);
    let next = tokio::time::timeout(Duration::from_secs(1), handle.next_request()).await;
    assert!(matches!(next, Ok(None)), "no further request may be sent");
}

fn node_json(labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": "ip-10-0-0-1.us-west-2.compute.internal", "labels": labels }
    })
}

#[tokio::test]
async fn a_new_node_gets_one_server_side_apply_of_the_full_set() {
    let fake = Fake::default();
    fake.set(&["nn-a", "nn-b", "nn-c"]);
    let (ctx, mut handle) = setup(&fake);
    let n = Arc::new(node(&[("kubernetes.io/hostname", "ip-10-0-0-1")]));
    let expected = json!({
        format!("{L}1"): "nn-a", format!("{L}2"): "nn-b", format!("{L}3"): "nn-c",
        "topology.k8s.aws/zone-id": "usw2-az1"
    });
    let reply = node_json(expected.clone());
    let (result, seen) = tokio::join!(reconcile(n, ctx.clone()), answer(&mut handle, reply));
    assert_eq!(
        result.ok(),
        Some(Action::await_change()),
        "no timer of its own: the resync walk comes back to it"
    );
    assert_eq!(seen.method, Method::PATCH);
    assert!(
        seen.accept.contains("as=PartialObjectMetadata"),
        "only the metadata comes back, not a whole Node: {}",
        seen.accept
    );
    assert_eq!(
        seen.uri,
        "/api/v1/nodes/ip-10-0-0-1.us-west-2.compute.internal?&force=true&fieldManager=ec2-topology-labeler"
    );
    assert_eq!(seen.content_type, "application/apply-patch+yaml");
    // The verification record is not on the node: the ledger keeps it (EC2's answer, for this
    // boot, just now), once the write went through.
    let body = seen.body.clone();
    assert!(
        body["metadata"].get("annotations").is_none(),
        "nothing of ours but labels: {body}"
    );
    let record = ctx
        .ledger
        .get("ip-10-0-0-1.us-west-2.compute.internal")
        .expect("the ledger's record");
    assert_eq!(record.topology, shared_answer(ID));
    assert_eq!(record.boot_id.as_deref(), Some("boot-1"));
    assert!(unix_now().abs_diff(record.at) <= 5, "verified now");
    assert_eq!(
        body,
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": "ip-10-0-0-1.us-west-2.compute.internal",
                "uid": "5c3e1c0e-0000-4000-8000-000000000001",
                "labels": expected
            }
        }),
        "only our family, never kubelet's labels"
    );
    assert_no_more_requests(ctx, handle).await;
}

#[tokio::test]
async fn a_node_already_right_costs_no_request() {
    let fake = Fake::default();
    fake.set(&["nn-a", "nn-b", "nn-c"]);
    let (ctx, mut handle) = setup(&fake);
    // Labelled, and its record says against what: no write, and no EC2 call either.
    let n = Arc::new(as_verified(node(&[]), shared_answer(ID), 60));
    for _ in 0..3 {
        let action = without_requests(&mut handle, reconcile(n.clone(), ctx.clone()))
            .await
            .expect("no-op");
        assert_eq!(
            action,
            Action::await_change(),
            "no timer per node: the resync walk comes back to it"
        );
    }
    assert!(fake.0.calls.lock().unwrap().is_empty(), "no EC2 call");
    assert_no_more_requests(ctx, handle).await;
}

/// Labelled right by someone else (EKS's cloud controller at registration, an earlier version
/// of ours): nothing is written to the node (issue 60); the ledger records what EC2 said.
#[tokio::test]
async fn a_node_labelled_right_without_a_record_costs_no_write_and_is_recorded() {
    let fake = Fake::default();
    fake.set(&["nn-a", "nn-b", "nn-c"]);
    let (ctx, mut handle) = setup(&fake);
    let n = Arc::new(node(&FULL));
    without_requests(&mut handle, reconcile(n.clone(), ctx.clone()))
        .await
        .expect("reconciled");
    assert_eq!(*fake.0.calls.lock().unwrap(), vec![1], "EC2 asked once");
    let record = ctx.ledger.get(n.name()).expect("recorded in the ledger");
    assert_eq!(record.topology, shared_answer(ID));
    // Asked again, the ledger's record answers: no EC2 call, no write.
    let (again, mut handle2) = setup(&fake);
    again.ledger.put(n.name(), &record);
    without_requests(&mut handle2, reconcile(n, again.clone()))
        .await
        .expect("nothing to do");
    assert_eq!(*fake.0.calls.lock().unwrap(), vec![1], "no second call");
    assert_no_more_requests(ctx, handle).await;
    assert_no_more_requests(again, handle2).await;
}

/// The node as the cache holds it at `rv`.
fn node_at(rv: &str, labels: &[(&str, &str)]) -> LiteNode {
    let mut n = node(labels);
    n.metadata.resource_version = Some(rv.into());
    n
}

#[tokio::test]
async fn a_cache_behind_our_own_write_does_not_cause_a_second_write() {
    let fake = Fake::default();
    fake.set(&["nn-a", "nn-b", "nn-c"]);
    let (ctx, mut handle) = setup(&fake);
    // The cache still has the node as it was before our write (the watch lags under load):
    // a resync or retry in that window must not apply the same labels again.
    let stale = Arc::new(node_at("100", &[]));
    let reply = node_json(json!({ format!("{L}1"): "nn-a" }));
    let (first, seen) = tokio::join!(
        reconcile(stale.clone(), ctx.clone()),
        answer(&mut handle, reply)
    );
    assert!(first.is_ok());
    assert_eq!(seen.method, Method::PATCH);
    for _ in 0..3 {
        // A request would wait for an answer that never comes.
        let again = tokio::time::timeout(
            Duration::from_secs(2),
            reconcile(stale.clone(), ctx.clone()),
        )
        .await
        .expect("no request sent for a write already made");
        assert!(
            matches!(again, Ok(a) if a == Action::await_change()),
            "left to the resync walk"
        );
    }
    assert_no_more_requests(ctx, handle).await;
}

#[tokio::test]
async fn a_newer_node_without_our_labels_is_written_again() {
    let fake = Fake::default();
    fake.set(&["nn-a", "nn-b", "nn-c"]);
    let (ctx, mut handle) = setup(&fake);
    let reply = node_json(json!({ format!("{L}1"): "nn-a" }));
    let (first, _) = tokio::join!(
        reconcile(Arc::new(node_at("100", &[])), ctx.clone()),
        answer(&mut handle, reply.clone())
    );
    assert!(first.is_ok());
    // Someone removed our labels after our write: the cache shows a newer version without
    // them, and that one is corrected.
    let (second, seen) = tokio::join!(
        reconcile(Arc::new(node_at("105", &[])), ctx.clone()),
        answer(&mut handle, reply)
    );
    assert!(second.is_ok());
    assert_eq!(seen.method, Method::PATCH);
    assert_eq!(seen.content_type, "application/apply-patch+yaml");
    assert_no_more_requests(ctx, handle).await;
}

#[tokio::test]
async fn a_changed_topology_is_written_even_before_the_cache_caught_up() {
    let fake = Fake::default();
    fake.set(&["nn-a", "nn-b", "nn-c"]);
    let (ctx, mut handle) = setup(&fake);
    let stale = Arc::new(node_at("100", &[]));
    let reply = node_json(json!({ format!("{L}1"): "nn-a" }));
    let (first, _) = tokio::join!(
        reconcile(stale.clone(), ctx.clone()),
        answer(&mut handle, reply.clone())
    );
    assert!(first.is_ok());
    // The instance moved (a new boot, a new answer) before the watch delivered our write:
    // what the node needs is no longer what we wrote, so it is written.
    fake.set(&["nn-a", "nn-b", "nn-z"]);
    let mut rebooted = node_at("100", &[]);
    rebooted.status.node_info.boot_id = Some("boot-2".into());
    let (second, seen) = tokio::join!(
        reconcile(Arc::new(rebooted), ctx.clone()),
        answer(&mut handle, reply)
    );
    assert!(second.is_ok());
    assert_eq!(seen.body["metadata"]["labels"][format!("{L}3")], "nn-z");
    assert_no_more_requests(ctx, handle).await;
}

#[tokio::test]
async fn a_stale_fourth_layer_co_owned_elsewhere_is_removed_explicitly() {
    let fake = Fake::default();
    fake.set(&["nn-a", "nn-b", "nn-c"]);
    let (ctx, mut handle) = setup(&fake);
    let n = Arc::new(node(&[
        ("topology.k8s.aws/network-node-layer-1", "nn-a"),
        ("topology.k8s.aws/network-node-layer-2", "nn-b"),
        ("topology.k8s.aws/network-node-layer-3", "nn-c"),
        ("topology.k8s.aws/network-node-layer-4", "nn-d"),
        ("topology.k8s.aws/zone-id", "usw2-az1"),
    ]));
    // The apply leaves layer-4 in place: another manager (EKS) owns it too.
    let mut after_apply = node_json(json!({
        format!("{L}1"): "nn-a", format!("{L}2"): "nn-b", format!("{L}3"): "nn-c",
        format!("{L}4"): "nn-d", "topology.k8s.aws/zone-id": "usw2-az1"
    }));
    after_apply["metadata"]["resourceVersion"] = json!("42");
    let verify = async {
        let apply = answer(&mut handle, after_apply).await;
        assert!(
            apply.body["metadata"]["labels"]
                .get(format!("{L}4"))
                .is_none()
        );
        let removal = answer(&mut handle, node_json(json!({}))).await;
        (apply, removal)
    };
    let (result, (_, removal)) = tokio::join!(reconcile(n, ctx.clone()), verify);
    result.expect("reconciled");
    assert_eq!(removal.method, Method::PATCH);
    assert_eq!(
        removal.uri,
        "/api/v1/nodes/ip-10-0-0-1.us-west-2.compute.internal?&fieldManager=ec2-topology-labeler"
    );
    assert_eq!(removal.content_type, "application/merge-patch+json");
    assert_eq!(
        removal.body,
        json!({"metadata": {"resourceVersion": "42", "labels": {format!("{L}4"): null}}}),
        "exactly the stale key, and only if nobody wrote the node since our apply (a fresh \
         value written in between must not be deleted)"
    );
    assert_no_more_requests(ctx, handle).await;
}

#[tokio::test]
async fn a_stale_key_we_solely_owned_goes_with_the_apply_alone() {
    let fake = Fake::default();
    fake.set(&["nn-a", "nn-b", "nn-c"]);
    let (ctx, mut handle) = setup(&fake);
    let n = Arc::new(node(&[
        ("topology.k8s.aws/network-node-layer-1", "nn-a"),
        ("topology.k8s.aws/network-node-layer-2", "nn-b"),
        ("topology.k8s.aws/network-node-layer-3", "nn-c"),
        ("topology.k8s.aws/network-node-layer-4", "nn-d"),
    ]));
    let after_apply = node_json(json!({
        format!("{L}1"): "nn-a", format!("{L}2"): "nn-b", format!("{L}3"): "nn-c",
        "topology.k8s.aws/zone-id": "usw2-az1"
    }));
    let (result, _) = tokio::join!(reconcile(n, ctx.clone()), answer(&mut handle, after_apply));
    result.expect("reconciled");
    assert_no_more_requests(ctx, handle).await;
}

#[tokio::test]
async fn ec2_down_is_an_error_and_nothing_is_written() {
    let fake = Fake::default();
    fake.0.down.store(true, Ordering::SeqCst);
    let (ctx, mut handle) = setup(&fake);
    let n = Arc::new(node(&[("topology.k8s.aws/network-node-layer-1", "nn-a")]));
    let err = without_requests(&mut handle, reconcile(n, ctx.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.category(), "ec2_transport");
    assert_no_more_requests(ctx, handle).await;
}

#[tokio::test]
async fn an_instance_ec2_does_not_describe_keeps_its_labels() {
    let fake = Fake::default();
    let (ctx, mut handle) = setup(&fake);
    let n = Arc::new(node(&[("topology.k8s.aws/network-node-layer-1", "nn-a")]));
    let action = without_requests(&mut handle, reconcile(n, ctx.clone()))
        .await
        .expect("not an error");
    assert_ne!(action, Action::await_change(), "asked again later");
    assert_no_more_requests(ctx, handle).await;
}

#[tokio::test]
async fn a_follower_neither_asks_ec2_nor_writes() {
    let fake = Fake::default();
    fake.0.down.store(true, Ordering::SeqCst);
    let (mut ctx, mut handle) = setup_context(&fake);
    ctx.leader = ec2_topology_labeler::leader::Leadership::follower();
    let ctx = Arc::new(ctx);
    let action = without_requests(&mut handle, reconcile(Arc::new(node(&[])), ctx.clone()))
        .await
        .expect("no EC2 call, so no EC2 error");
    assert_eq!(action, Action::await_change(), "re-checked when elected");
    assert_no_more_requests(ctx, handle).await;
}

#[tokio::test]
async fn nodes_that_are_not_ec2_instances_wait_for_a_change() {
    let fake = Fake::default();
    let (ctx, mut handle) = setup(&fake);
    for pid in [
        "",
        "aws:///us-east-1b/0123/fargate-ip-10-0-0-1.ec2.internal",
        "eks-hybrid:///us-west-2/c/mi-1",
        "gce://p/z/vm",
    ] {
        let mut n = node(&[]);
        n.spec.provider_id = Some(pid.into());
        let action = without_requests(&mut handle, reconcile(Arc::new(n), ctx.clone()))
            .await
            .expect("skipped");
        assert_eq!(action, Action::await_change(), "{pid}");
    }
    assert_no_more_requests(ctx, handle).await;
}

/// Answer the next request with an API error `code`.
async fn refuse(handle: &mut Handle, code: u16) {
    let (_, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("a request within 5 s")
        .expect("a request");
    let status = json!({
        "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
        "reason": if code == 409 { "Conflict" } else { "ServiceUnavailable" },
        "message": "refused by the test"
    });
    send.send_response(
        Response::builder()
            .status(code)
            .body(Body::from(serde_json::to_vec(&status).unwrap()))
            .unwrap(),
    );
}

/// A write refused because that node changed or went meanwhile (409, 404) says nothing about
/// the API server: the next successful write must not re-check the whole fleet. After a 503 it
/// must (nodes waiting out their backoff are re-checked at once).
#[tokio::test]
async fn only_an_unavailable_api_server_makes_the_next_write_recheck_every_node() {
    let fake = Fake::default();
    fake.set(&["nn-a", "nn-b", "nn-c"]);
    let (mut ctx, mut handle) = setup_context(&fake);
    let (kicks, mut kicked) = futures::channel::mpsc::unbounded();
    ctx.kicks = Some(kicks);
    let ctx = Arc::new(ctx);
    let labelled = node_json(json!({
        format!("{L}1"): "nn-a", format!("{L}2"): "nn-b", format!("{L}3"): "nn-c",
        "topology.k8s.aws/zone-id": "usw2-az1"
    }));
    for (code, rechecks) in [(409, false), (404, false), (503, true)] {
        // A node of its own per case: rewriting one node would count as a label fight.
        let mut n = node(&[]);
        n.metadata.name = Some(format!("ip-10-0-0-{code}.us-west-2.compute.internal"));
        let n = Arc::new(n);
        let (failed, _) =
            tokio::join!(reconcile(n.clone(), ctx.clone()), refuse(&mut handle, code));
        assert!(failed.is_err(), "{code} is an error");
        let (ok, _) = tokio::join!(
            reconcile(n.clone(), ctx.clone()),
            answer(&mut handle, labelled.clone())
        );
        ok.expect("written");
        assert_eq!(
            kicked.try_recv().is_ok(),
            rechecks,
            "after a {code}, the next write re-checks every node: {rechecks}"
        );
    }
}

// The startup gate: the startup taint and the TopologyLabeled condition.

const TAINT: &str = "ec2-topology-labeler.io/topology-pending";

fn gated(fake: &Fake, when: WhenUnsupported, timeout: Option<u64>) -> (Arc<Context>, Handle) {
    let (ctx, handle) = gated_context(fake, when, timeout);
    (Arc::new(ctx), handle)
}

fn gated_context(fake: &Fake, when: WhenUnsupported, timeout: Option<u64>) -> (Context, Handle) {
    let (mut ctx, handle) = setup_context(fake);
    ctx.gate = Gate {
        taint: Some(format!("{TAINT}:NoSchedule").parse().unwrap()),
        when_unsupported: when,
        timeout: timeout.map(Duration::from_secs),
        condition: true,
    };
    (ctx, handle)
}

fn taint(key: &str) -> Value {
    json!({"key": key, "effect": "NoSchedule"})
}

fn tainted(labels: &[(&str, &str)], taints: &[&str], created_s_ago: i64) -> LiteNode {
    let mut n = node_at("1", labels);
    if labels == FULL {
        // As our own write left it: with its verification record.
        n = as_verified(n, shared_answer(ID), 1);
    }
    n.spec.taints = taints
        .iter()
        .map(|k| serde_json::from_value(taint(k)).unwrap())
        .collect();
    let created = k8s_openapi::jiff::Timestamp::now()
        - k8s_openapi::jiff::SignedDuration::from_secs(created_s_ago);
    n.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        created,
    ));
    n
}

fn full_labels() -> Value {
    json!({
        format!("{L}1"): "nn-a", format!("{L}2"): "nn-b", format!("{L}3"): "nn-c",
        "topology.k8s.aws/zone-id": "usw2-az1"
    })
}

/// The node as the API server answers a write: at `rv`, with `labels`, `taints` and (if any)
/// our condition.
fn node_reply(rv: &str, labels: Value, taints: &[&str], condition: Option<(&str, &str)>) -> Value {
    let mut n = node_json(labels);
    n["metadata"]["resourceVersion"] = json!(rv);
    n["metadata"]["uid"] = json!("5c3e1c0e-0000-4000-8000-000000000001");
    n["spec"] = json!({"providerID": format!("aws:///us-west-2a/{ID}"),
        "taints": taints.iter().map(|k| taint(k)).collect::<Vec<_>>()});
    if let Some((status, reason)) = condition {
        n["status"] = json!({"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "TopologyLabeled", "status": status, "reason": reason}
        ]});
    }
    n
}

/// Every label we write, as the cache holds them.
const FULL: [(&str, &str); 4] = [
    ("topology.k8s.aws/network-node-layer-1", "nn-a"),
    ("topology.k8s.aws/network-node-layer-2", "nn-b"),
    ("topology.k8s.aws/network-node-layer-3", "nn-c"),
    ("topology.k8s.aws/zone-id", "usw2-az1"),
];

/// The node at `rv` with its labels and condition already right and the startup taint still
/// on: only the release is left.
fn awaiting_release(rv: &str) -> LiteNode {
    let mut n = tainted(&FULL, &[TAINT], 2);
    n.metadata.resource_version = Some(rv.into());
    n.status.conditions = serde_json::from_value(
        node_reply(rv, json!({}), &[], Some(("True", "Labelled")))["status"].clone(),
    )
    .map(|s: LiteStatus| s.conditions)
    .unwrap();
    n
}

#[tokio::test]
async fn the_startup_taint_goes_only_after_the_labels_and_other_taints_stay() {
    let fake = Fake::default();
    fake.set(&["nn-a", "nn-b", "nn-c"]);
    let (ctx, mut handle) = gated(&fake, WhenUnsupported::Keep, None);
    let n = Arc::new(tainted(&[], &[TAINT, "example.com/gpu"], 2));
    let steps = async {
        let apply = answer(
            &mut handle,
            node_reply("2", full_labels(), &[TAINT, "example.com/gpu"], None),
        )
        .await;
        let condition = answer(
            &mut handle,
            node_reply(
                "3",
                full_labels(),
                &[TAINT, "example.com/gpu"],
                Some(("True", "Labelled")),
            ),
        )
        .await;
        let release = answer(
            &mut handle,
            node_reply(
                "4",
                full_labels(),
                &["example.com/gpu"],
                Some(("True", "Labelled")),
            ),
        )
        .await;
        (apply, condition, release)
    };
    let (result, (apply, condition, release)) = tokio::join!(reconcile(n, ctx.clone()), steps);
    result.expect("reconciled");
    assert_eq!(
        apply.content_type, "application/apply-patch+yaml",
        "labels first"
    );
    assert!(
        !apply.accept.contains("PartialObjectMetadata"),
        "the gate reads the taints from the apply's answer: the whole Node comes back"
    );
    assert_eq!(
        condition.uri,
        "/api/v1/nodes/ip-10-0-0-1.us-west-2.compute.internal/status?&fieldManager=ec2-topology-labeler"
    );
    assert_eq!(
        condition.content_type,
        "application/strategic-merge-patch+json"
    );
    let c = &condition.body["status"]["conditions"];
    assert_eq!(
        c.as_array().map(Vec::len),
        Some(1),
        "only our condition is sent"
    );
    assert_eq!(
        (
            c[0]["type"].as_str(),
            c[0]["status"].as_str(),
            c[0]["reason"].as_str()
        ),
        (Some("TopologyLabeled"), Some("True"), Some("Labelled"))
    );
    assert_eq!(release.content_type, "application/merge-patch+json");
    assert_eq!(
        release.body["metadata"]["resourceVersion"],
        json!("3"),
        "against the version that carries the labels"
    );
    assert_eq!(
        release.body["spec"]["taints"],
        json!([taint("example.com/gpu")]),
        "the other taint stays"
    );
    assert_no_more_requests(ctx, handle).await;
}

#[tokio::test]
async fn a_taint_edit_in_between_is_read_again_and_kept() {
    let fake = Fake::default();
    fake.set(&["nn-a", "nn-b", "nn-c"]);
    let (ctx, mut handle) = gated(&fake, WhenUnsupported::Keep, None);
    // Labels and condition already right: only the taint is left.
    let n = awaiting_release("1");
    let steps = async {
        refuse(&mut handle, 409).await;
        let get = answer(
            &mut handle,
            node_reply(
                "7",
                full_labels(),
                &["other.io/new", TAINT],
                Some(("True", "Labelled")),
            ),
        )
        .await;
        let release = answer(
            &mut handle,
            node_reply(
                "8",
                full_labels(),
                &["other.io/new"],
                Some(("True", "Labelled")),
            ),
        )
        .await;
        (get, release)
    };
    let (result, (get, release)) = tokio::join!(reconcile(Arc::new(n), ctx.clone()), steps);
    result.expect("reconciled");
    assert_eq!(get.method, Method::GET);
    assert_eq!(release.body["metadata"]["resourceVersion"], json!("7"));
    assert_eq!(
        release.body["spec"]["taints"],
        json!([taint("other.io/new")]),
        "the concurrent edit survives"
    );
    assert_no_more_requests(ctx, handle).await;
}

/// Issue 26.2: our condition write, then the kubelet's write on top of it, then a failed
/// release (503). The next reconcile reads the kubelet's version: not the one our write returned,
/// but one that carries our condition. The taint goes then (it used to wait for a version equal
/// to ours, which never came: the taint stayed until the hourly resync).
#[tokio::test]
async fn the_taint_goes_when_another_writer_bumped_the_node_after_our_write() {
    let fake = Fake::default();
    fake.set(&["nn-a", "nn-b", "nn-c"]);
    let (ctx, mut handle) = gated(&fake, WhenUnsupported::Keep, None);
    let n = tainted(&FULL, &[TAINT], 2);
    let steps = async {
        let condition = answer(
            &mut handle,
            node_reply("2", full_labels(), &[TAINT], Some(("True", "Labelled"))),
        )
        .await;
        refuse(&mut handle, 503).await;
        condition
    };
    let (result, condition) = tokio::join!(reconcile(Arc::new(n), ctx.clone()), steps);
    assert!(result.is_err(), "the release was refused");
    assert_eq!(
        condition.body["status"]["conditions"][0]["status"],
        json!("True")
    );
    let bumped = awaiting_release("3");
    let (result, release) = tokio::join!(
        reconcile(Arc::new(bumped), ctx.clone()),
        answer(
            &mut handle,
            node_reply("4", full_labels(), &[], Some(("True", "Labelled")))
        )
    );
    result.expect("reconciled");
    assert_eq!(release.body["metadata"]["resourceVersion"], json!("3"));
    assert_eq!(release.body["spec"]["taints"], json!([]), "the taint goes");
    assert_no_more_requests(ctx, handle).await;
}

/// Issue 26.7: the lease passes to another replica while the taint release retries (a 409,
/// then the read): no further PATCH from this one.
#[tokio::test]
async fn a_lease_lost_between_release_attempts_ends_the_release() {
    let fake = Fake::default();
    fake.set(&["nn-a", "nn-b", "nn-c"]);
    let (mut ctx, mut handle) = gated_context(&fake, WhenUnsupported::Keep, None);
    let leader = ec2_topology_labeler::leader::Leadership::leading_until_stepped_down();
    ctx.leader = leader.clone();
    let ctx = Arc::new(ctx);
    let n = awaiting_release("1");
    let steps = async {
        refuse(&mut handle, 409).await;
        // The read after the conflict: the lease is lost while it is under way.
        let (request, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("a request within 5 s")
            .expect("a request");
        assert_eq!(request.method(), Method::GET);
        leader.step_down();
        send.send_response(
            Response::builder()
                .body(Body::from(
                    serde_json::to_vec(&node_reply(
                        "7",
                        full_labels(),
                        &[TAINT],
                        Some(("True", "Labelled")),
                    ))
                    .unwrap(),
                ))
                .unwrap(),
        );
    };
    // Bounded: a PATCH sent after the step-down waits for an answer that never comes; it is
    // then seen below, as the request too many.
    let reconciled =
        tokio::time::timeout(Duration::from_secs(5), reconcile(Arc::new(n), ctx.clone()));
    let (result, ()) = tokio::join!(reconciled, steps);
    if let Ok(result) = result {
        result.expect("reconciled");
    }
    assert_no_more_requests(ctx, handle).await;
}

#[tokio::test]
async fn ec2_down_keeps_the_taint_and_says_why() {
    let fake = Fake::default();
    fake.0.down.store(true, Ordering::SeqCst);
    let (ctx, mut handle) = gated(&fake, WhenUnsupported::Release, Some(600));
    let n = Arc::new(tainted(&[], &[TAINT], 10));
    let (result, condition) = tokio::join!(
        reconcile(n.clone(), ctx.clone()),
        answer(
            &mut handle,
            node_reply("2", json!({}), &[TAINT], Some(("False", "Ec2Unavailable")))
        )
    );
    assert!(result.is_err(), "EC2 down is an error");
    let c = &condition.body["status"]["conditions"][0];
    assert_eq!(
        (c["status"].as_str(), c["reason"].as_str()),
        (Some("False"), Some("Ec2Unavailable"))
    );
    // Nothing more: the taint stays, and the same condition is not written again.
    let mut again = tainted(&[], &[TAINT], 10);
    again.metadata.resource_version = Some("2".into());
    again.status.conditions = serde_json::from_value(
        node_reply("2", json!({}), &[], Some(("False", "Ec2Unavailable")))["status"].clone(),
    )
    .map(|s: LiteStatus| s.conditions)
    .unwrap();
    let result = without_requests(&mut handle, reconcile(Arc::new(again), ctx.clone())).await;
    assert!(result.is_err());
    assert_no_more_requests(ctx, handle).await;
}

#[tokio::test]
async fn the_timeout_releases_a_node_ec2_never_answered_for() {
    let fake = Fake::default();
    fake.0.down.store(true, Ordering::SeqCst);
    let (ctx, mut handle) = gated(&fake, WhenUnsupported::Keep, Some(300));
    let n = Arc::new(tainted(&[], &[TAINT, "example.com/gpu"], 301));
    let steps = async {
        answer(
            &mut handle,
            node_reply(
                "2",
                json!({}),
                &[TAINT, "example.com/gpu"],
                Some(("False", "Ec2Unavailable")),
            ),
        )
        .await;
        answer(
            &mut handle,
            node_reply(
                "3",
                json!({}),
                &["example.com/gpu"],
                Some(("False", "Ec2Unavailable")),
            ),
        )
        .await
    };
    let (result, release) = tokio::join!(reconcile(n, ctx.clone()), steps);
    assert!(result.is_err(), "still an EC2 error");
    assert_eq!(
        release.body["spec"]["taints"],
        json!([taint("example.com/gpu")])
    );
    assert!(
        ctx.metrics
            .render()
            .contains(r#"startup_taint_releases_total{reason="timeout"} 1"#)
    );
    assert_no_more_requests(ctx, handle).await;
}

#[tokio::test]
async fn the_timeout_falls_due_on_time_while_an_ec2_call_hangs() {
    let fake = Fake::default();
    fake.0.hang.store(true, Ordering::SeqCst);
    let (ctx, mut handle) = gated(&fake, WhenUnsupported::Keep, Some(300));
    // Two seconds before its timeout; EC2 never answers.
    let n = Arc::new(tainted(&[], &[TAINT], 298));
    let started = std::time::Instant::now();
    let steps = async {
        answer(
            &mut handle,
            node_reply("2", json!({}), &[TAINT], Some(("False", "Ec2Unavailable"))),
        )
        .await;
        answer(
            &mut handle,
            node_reply("3", json!({}), &[], Some(("False", "Ec2Unavailable"))),
        )
        .await
    };
    let (result, release) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(10), reconcile(n, ctx.clone())),
        steps
    );
    let action = result.expect("the reconcile does not wait for EC2 past the timeout");
    assert!(action.is_ok(), "{action:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "released at the timeout, not later: {:?}",
        started.elapsed()
    );
    assert_eq!(release.body["spec"]["taints"], json!([]));
    assert!(
        ctx.metrics
            .render()
            .contains(r#"startup_taint_releases_total{reason="timeout"} 1"#)
    );
}

#[tokio::test]
async fn an_unsupported_type_is_released_by_policy_and_kept_otherwise() {
    let fake = Fake::default(); // describes nothing
    for (when, released) in [
        (WhenUnsupported::Release, true),
        (WhenUnsupported::Keep, false),
    ] {
        let (ctx, mut handle) = gated(&fake, when, None);
        let n = Arc::new(tainted(
            &[("node.kubernetes.io/instance-type", "m5.large")],
            &[TAINT],
            5,
        ));
        let steps = async {
            let condition = answer(
                &mut handle,
                node_reply("2", json!({}), &[TAINT], Some(("False", "NotDescribed"))),
            )
            .await;
            let release = if released {
                Some(
                    answer(
                        &mut handle,
                        node_reply("3", json!({}), &[], Some(("False", "NotDescribed"))),
                    )
                    .await,
                )
            } else {
                None
            };
            (condition, release)
        };
        let (result, (condition, release)) = tokio::join!(reconcile(n, ctx.clone()), steps);
        result.expect("not described is not an error");
        assert_eq!(
            condition.body["status"]["conditions"][0]["reason"],
            json!("NotDescribed")
        );
        if let Some(r) = release {
            assert_eq!(r.body["spec"]["taints"], json!([]));
        }
        assert_no_more_requests(ctx, handle).await;
    }
}

/// `n` nodes on distinct instances, in a node cache as the watch would fill it.
fn fleet(n: usize) -> ec2_topology_labeler::node::store::NodeCache {
    let (reader, mut writer) = ec2_topology_labeler::node::store::NodeCache::new();
    for k in 0..n {
        let mut node = node(&[]);
        node.metadata.name = Some(format!("ip-10-0-{}-{}.internal", k / 250, k % 250));
        node.metadata.uid = Some(format!("uid-{k}"));
        node.spec.provider_id = Some(format!("aws:///us-west-2a/i-{k:017x}"));
        writer.apply(kube::runtime::watcher::Event::Apply(node));
    }
    reader
}

#[tokio::test]
async fn the_walk_at_start_fills_every_call_and_leaves_reconciles_cache_hits() {
    let fake = Fake::default();
    fake.0.describe_all.store(true, Ordering::SeqCst);
    let (ctx, handle) = setup_with_window(&fake, LookupConfig::default().batch_window);
    let ctx = Arc::new(ctx);
    let store = fleet(1_050);
    let walked = warm::warm(&store, &ctx).await;
    assert_eq!(walked.nodes, 1_050);
    assert!(!walked.stopped);
    let mut calls = fake.0.calls.lock().unwrap().clone();
    calls.sort_unstable();
    assert_eq!(calls.len(), 11, "ceil(1,050 / 100) calls: {calls:?}");
    assert_eq!(calls[0], 50, "only the remainder goes part-full: {calls:?}");
    assert!(calls[1..].iter().all(|&c| c == 100), "{calls:?}");
    assert_eq!(ctx.lookup.cached(), 1_050, "every answer kept");
    // A reconcile after the walk asks EC2 nothing more (its write is all the mock sees).
    let before = fake.0.calls.lock().unwrap().len();
    let node = store.state().into_iter().next().expect("a node");
    drop(handle);
    let _ = reconcile(std::sync::Arc::new(node.expand()), ctx.clone()).await;
    assert_eq!(fake.0.calls.lock().unwrap().len(), before, "a cache hit");
}

#[tokio::test]
async fn the_walk_stops_at_the_first_failed_call() {
    let fake = Fake::default();
    fake.0.down.store(true, Ordering::SeqCst);
    let (ctx, _handle) = setup(&fake);
    let walked = warm::warm(&fleet(5_000), &ctx).await;
    assert!(walked.stopped);
    let calls = fake.0.calls.lock().unwrap().len();
    // What was in flight when the first call failed (the walk's bound), not the 50 calls the
    // whole fleet would take.
    assert!(
        calls <= warm::IN_FLIGHT / 100 + 1,
        "{calls} calls to a failing EC2"
    );
}

#[tokio::test]
async fn a_follower_walks_nothing() {
    let fake = Fake::default();
    fake.0.describe_all.store(true, Ordering::SeqCst);
    let (mut ctx, _handle) = setup_context(&fake);
    ctx.leader = ec2_topology_labeler::leader::Leadership::follower();
    let walked = warm::warm(&fleet(300), &ctx).await;
    assert!(walked.stopped);
    assert!(fake.0.calls.lock().unwrap().is_empty(), "no EC2 call");
}

/// The first list's nodes, sent as the watch delivers them: pages of 100, a pause between.
async fn deliver(
    store: &ec2_topology_labeler::node::store::NodeCache,
    tx: tokio::sync::mpsc::Sender<Arc<LiteNode>>,
) {
    let mut nodes = store.state();
    nodes.sort_unstable_by(|a, b| a.name().cmp(b.name()));
    for page in nodes.chunks(100) {
        for n in page {
            // Never full here: the lookups keep up.
            let _ = tx.try_send(Arc::new(n.expand()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_first_list_is_looked_up_as_it_pages_in_in_full_calls() {
    let fake = Fake::default();
    fake.0.describe_all.store(true, Ordering::SeqCst);
    let (ctx, _handle) = setup(&fake);
    let store = fleet(1_050);
    let (tx, rx) = tokio::sync::mpsc::channel(warm::IN_FLIGHT);
    let (looked, ()) = tokio::join!(warm::ahead_of_first_list(rx, &ctx), deliver(&store, tx));
    assert_eq!(looked, 1_050, "every node, once the list is in");
    assert_eq!(ctx.lookup.cached(), 1_050, "every answer kept");
    let calls = fake.0.calls.lock().unwrap().clone();
    let full = calls.iter().filter(|&&c| c == 100).count();
    assert!(
        calls.len() <= 12 && full >= 9,
        "a page is a call's worth: {calls:?}"
    );
}

#[tokio::test]
async fn the_first_list_asks_nothing_more_after_a_failed_call_nor_as_a_follower() {
    let fake = Fake::default();
    fake.0.down.store(true, Ordering::SeqCst);
    let (ctx, _handle) = setup(&fake);
    let store = fleet(3_000);
    let (tx, rx) = tokio::sync::mpsc::channel(warm::IN_FLIGHT);
    let (looked, ()) = tokio::join!(warm::ahead_of_first_list(rx, &ctx), deliver(&store, tx));
    assert_eq!(looked, 0);
    let calls = fake.0.calls.lock().unwrap().len();
    // What was in flight when the first call failed, not the 30 calls the whole list would
    // take.
    assert!(
        calls <= warm::IN_FLIGHT / 100 + 1,
        "the first call failed: the pages after it are not asked about ({calls} calls)"
    );

    let fake = Fake::default();
    fake.0.describe_all.store(true, Ordering::SeqCst);
    let (mut ctx, _handle) = setup_context(&fake);
    ctx.leader = ec2_topology_labeler::leader::Leadership::follower();
    let few = fleet(300);
    let (tx, rx) = tokio::sync::mpsc::channel(warm::IN_FLIGHT);
    let (looked, ()) = tokio::join!(warm::ahead_of_first_list(rx, &ctx), deliver(&few, tx));
    assert_eq!(looked, 0);
    assert!(
        fake.0.calls.lock().unwrap().is_empty(),
        "a follower asks nothing"
    );
}

/// The topology `Fake` answers for every instance with `describe_all`.
fn shared_answer(instance_id: &str) -> InstanceTopology {
    InstanceTopology {
        instance_id: instance_id.into(),
        instance_type: Some("p5.48xlarge".into()),
        zone_id: Some("usw2-az1".into()),
        network_nodes: vec!["nn-a".into(), "nn-b".into(), "nn-c".into()],
        ..InstanceTopology::default()
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `n` as an earlier leader left it: labelled from `topology` and carrying the verification
/// record of that answer, `age_s` old, for its current boot.
fn as_verified(mut n: LiteNode, topology: InstanceTopology, age_s: u64) -> LiteNode {
    let mut labels = n.labels().into_owned();
    for (i, nn) in topology.network_nodes.iter().enumerate() {
        labels.insert(format!("{L}{}", i + 1), nn.clone());
    }
    if let Some(z) = &topology.zone_id {
        labels.insert("topology.k8s.aws/zone-id".into(), z.clone());
    }
    n.metadata.labels = Some(labels);
    let record = Verified {
        topology,
        boot_id: n.boot_id().map(str::to_owned),
        at: unix_now() - age_s,
    };
    n.metadata
        .annotations
        .get_or_insert_default()
        .insert(VERIFIED_KEY.into(), record.encode(&record_key()));
    n
}

/// A restart with nothing changed: every node carries its record, so the new leader's walk
/// and reconciles ask EC2 nothing and write nothing.
#[tokio::test]
async fn a_new_leader_asks_ec2_nothing_about_verified_nodes() {
    let fake = Fake::default();
    fake.0.describe_all.store(true, Ordering::SeqCst);
    let (ctx, mut handle) = setup(&fake);
    let (reader, mut writer) = ec2_topology_labeler::node::store::NodeCache::new();
    for k in 0..1_050 {
        let mut n = node(&[]);
        n.metadata.name = Some(format!("ip-10-0-{}-{}.internal", k / 250, k % 250));
        n.metadata.uid = Some(format!("uid-{k}"));
        let id = format!("i-{k:017x}");
        n.spec.provider_id = Some(format!("aws:///us-west-2a/{id}"));
        writer.apply(kube::runtime::watcher::Event::Apply(as_verified(
            n,
            shared_answer(&id),
            3_600,
        )));
    }
    let walked = warm::warm(&reader, &ctx).await;
    assert_eq!(walked.nodes, 1_050);
    assert!(
        fake.0.calls.lock().unwrap().is_empty(),
        "no EC2 call: {:?}",
        fake.0.calls.lock().unwrap()
    );
    assert_eq!(ctx.lookup.cached(), 1_050, "every record taken");
    for n in reader.state().into_iter().take(20) {
        without_requests(
            &mut handle,
            reconcile(std::sync::Arc::new(n.expand()), ctx.clone()),
        )
        .await
        .expect("nothing to do");
    }
    assert!(fake.0.calls.lock().unwrap().is_empty());
    assert_no_more_requests(ctx, handle).await;
}

/// What cannot be trusted is asked about at once, in one call: a node rebooted while no
/// leader ran, a record of another format, one edited by hand, one whose labels someone
/// changed since. A record older than the cache TTL is trusted (its age says since when EC2 has
/// given the answer, not that it is stale): it is re-verified within the TTL, like the rest.
#[tokio::test]
async fn a_new_leader_re_verifies_at_once_only_what_it_cannot_trust() {
    let fake = Fake::default();
    fake.0.describe_all.store(true, Ordering::SeqCst);
    let (ctx, _handle) = setup(&fake);
    let (reader, mut writer) = ec2_topology_labeler::node::store::NodeCache::new();
    for k in 0..300usize {
        let mut n = node(&[]);
        n.metadata.name = Some(format!("ip-10-0-1-{k}.internal"));
        n.metadata.uid = Some(format!("uid-{k}"));
        let id = format!("i-{k:017x}");
        n.spec.provider_id = Some(format!("aws:///us-west-2a/{id}"));
        let mut n = as_verified(n, shared_answer(&id), 60);
        let record = |n: &mut LiteNode| -> String {
            n.metadata.annotations.as_mut().unwrap()[VERIFIED_KEY].clone()
        };
        let set = |n: &mut LiteNode, v: String| {
            n.metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(VERIFIED_KEY.into(), v);
        };
        match k {
            0 => n.status.node_info.boot_id = Some("boot-2".into()),
            1 => {
                let r = record(&mut n).replacen(r#""v":2"#, r#""v":3"#, 1);
                set(&mut n, r);
            }
            2 => {
                let r = record(&mut n).replace("nn-c", "nn-z");
                set(&mut n, r);
            }
            3 => {
                let mut labels = n.labels().into_owned();
                labels.insert(format!("{L}3"), "nn-elsewhere".into());
                n.metadata.labels = Some(labels);
            }
            4 => n = as_verified(n, shared_answer(&id), 7 * 3600),
            _ => {}
        }
        writer.apply(kube::runtime::watcher::Event::Apply(n));
    }
    warm::warm(&reader, &ctx).await;
    assert_eq!(
        *fake.0.calls.lock().unwrap(),
        vec![4],
        "one call, for the four that cannot be trusted"
    );
    let metrics = ctx.metrics.render();
    for (outcome, n) in [
        ("trusted", 296),
        ("other_boot", 1),
        ("other_version", 1),
        ("tampered", 1),
        ("labels_changed", 1),
    ] {
        let line =
            format!("ec2_topology_labeler_verification_records_total{{outcome=\"{outcome}\"}} {n}");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
}

/// On election the joining nodes' reconciles go first; the rest of the fleet follows in
/// chunks, the first once every joiner's reconcile has run, each after once the controller has
/// run most of what was sent before it (else after a second), so a node that joins meanwhile
/// waits behind one chunk, not behind the fleet.
#[tokio::test(start_paused = true)]
async fn on_election_joiners_go_first_and_the_fleet_follows_in_paced_chunks() {
    use futures::StreamExt;
    let fake = Fake::default();
    let (ctx, _handle) = setup(&fake);
    let (reader, mut writer) = ec2_topology_labeler::node::store::NodeCache::new();
    for k in 0..600 {
        let mut n = node(&[("topology.k8s.aws/network-node-layer-1", "nn-1")]);
        n.metadata.name = Some(format!("fleet-{k:03}"));
        n.metadata.uid = Some(format!("uid-{k}"));
        writer.apply(kube::runtime::watcher::Event::Apply(n));
    }
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    for k in 0..3 {
        let mut n = node(&[]);
        n.metadata.name = Some(format!("joiner-{k}"));
        n.metadata.uid = Some(format!("uid-j{k}"));
        n.metadata.creation_timestamp = Some(now.clone());
        writer.apply(kube::runtime::watcher::Event::Apply(n));
    }
    let (elected, rx) = futures::channel::mpsc::unbounded();
    let mut refs = ec2_topology_labeler::reconcile::sweep::on_election(rx, reader, ctx.clone());
    elected.unbounded_send(()).expect("the pass is listening");
    let mut next = async || {
        tokio::time::timeout(Duration::from_millis(500), refs.next())
            .await
            .ok()
            .flatten()
            .map(|r| r.to_string())
    };
    let first: Vec<_> = [next().await, next().await, next().await]
        .into_iter()
        .flatten()
        .collect();
    assert!(
        first.len() == 3 && first.iter().all(|n| n.starts_with("joiner-")),
        "the joiners first: {first:?}"
    );
    assert_eq!(
        next().await,
        None,
        "the fleet waits while the joiners have not run"
    );
    let ran = |n: usize| (0..n).for_each(|_| ctx.metrics.reconciled(Duration::ZERO));
    ran(2);
    assert_eq!(
        next().await,
        None,
        "the fleet waits while one joiner has not run"
    );
    ran(1);
    let mut chunk = Vec::new();
    while let Some(n) = next().await {
        chunk.push(n);
        if chunk.len() == 256 {
            break;
        }
    }
    assert!(
        chunk.len() == 256 && chunk.iter().all(|n| n.starts_with("fleet-")),
        "one chunk of the fleet once they ran: {} refs",
        chunk.len()
    );
    assert_eq!(
        next().await,
        None,
        "the next chunk waits for this one to run"
    );
    ran(128);
    assert!(
        next().await.is_some_and(|n| n.starts_with("fleet-")),
        "sent once half of the chunk ran"
    );
}

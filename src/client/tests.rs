//! The client's layer against a mocked API server (paused time): deadlines, the pace, and the
//! lease fence on writes.

use std::sync::{Arc, Mutex};

use http::StatusCode;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

use super::*;
use crate::{leader::LeaderArgs, metrics::Metrics};

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn args(request_timeout: u64, qps: f64, burst: f64) -> ClientArgs {
    ClientArgs {
        kube_request_timeout: HumanDuration(Duration::from_secs(request_timeout)),
        kube_qps: qps,
        kube_burst: burst,
        ..ClientArgs::default()
    }
}

fn node_json(name: &str) -> Value {
    json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": name, "resourceVersion": "2" } })
}

fn respond(send: tower_test::mock::SendResponse<Response<Body>>, code: StatusCode, body: &Value) {
    send.send_response(
        Response::builder()
            .status(code)
            .body(Body::from(serde_json::to_vec(body).expect("json")))
            .expect("response"),
    );
}

/// What the mocked API server saw and did.
#[derive(Default)]
struct Server {
    /// Request URIs, in order.
    seen: Mutex<Vec<(Method, String)>>,
}

/// An API server answering every request after `delay` (reads and writes alike).
fn slow_server(delay: Duration) -> (Service, Arc<Server>) {
    let (service, mut handle): (Service, Handle) = tower_test::mock::pair();
    let server = Arc::new(Server::default());
    let seen = server.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let method = req.method().clone();
            seen.seen
                .lock()
                .expect("lock")
                .push((method.clone(), req.uri().to_string()));
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                respond(send, StatusCode::OK, &node_json("n"));
            });
        }
    });
    (service, server)
}

type Service = tower_test::mock::Mock<Request<Body>, Response<Body>>;

fn patch(client: &Client, name: &str) -> impl Future<Output = Result<Node, kube::Error>> + use<> {
    let api: Api<Node> = Api::all(client.clone());
    let name = name.to_string();
    async move {
        api.patch(
            &name,
            &PatchParams::apply("ec2-topology-labeler").force(),
            &Patch::Apply(json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "labels": { "a": "b" } } })),
        )
        .await
    }
}

/// 32 writes (the default write slots) stall in the API server while this replica leads; it
/// steps down: every write ends at once with the fence's error, none counts as applied on our
/// side, and every slot is free again.
#[tokio::test(start_paused = true)]
async fn writes_in_flight_are_cancelled_when_leadership_is_lost_and_their_slots_freed() {
    let (service, _server) = slow_server(Duration::from_secs(3600));
    let leadership = Leadership::leading_until_stepped_down();
    let metrics = Arc::new(Metrics::new());
    let client = over(
        service,
        "default",
        Policy::new(&ClientArgs::default())
            .fenced(leadership.clone())
            .counted(metrics.clone()),
    );
    let slots = Arc::new(tokio::sync::Semaphore::new(32));
    let mut writes = Vec::new();
    for i in 0..32 {
        let permit = slots.clone().acquire_owned().await.expect("a slot");
        let write = patch(&client, &format!("n{i}"));
        writes.push(tokio::spawn(async move {
            let _permit = permit;
            write.await
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        slots.available_permits(),
        0,
        "every slot taken by a stalled write"
    );
    leadership.step_down();
    let stepped_down = Instant::now();
    for w in writes {
        let e = w
            .await
            .expect("task")
            .expect_err("no write completes after stepping down");
        assert_eq!(Cut::of(&e), Some(&Cut::LostLeadership), "{e}");
    }
    assert_eq!(stepped_down.elapsed(), Duration::ZERO, "cancelled at once");
    assert_eq!(slots.available_permits(), 32, "the slots are free again");
    assert!(
        metrics
            .render()
            .contains("ec2_topology_labeler_api_calls_cut_total{reason=\"fenced\"} 32"),
        "counted"
    );
    // And a write sent now is refused before it leaves.
    let e = patch(&client, "late").await.expect_err("refused");
    assert_eq!(Cut::of(&e), Some(&Cut::NotLeading));
}

/// The whole protocol: a real election whose Lease renewals fail (500), and writes the API
/// server holds for a minute. No write completes after `is_leader()` turned false: each ends
/// by the renew deadline, the grace before another replica could take over.
#[tokio::test(start_paused = true)]
async fn no_write_completes_after_the_renew_deadline_when_renewals_fail() {
    // The Lease: created once, then every renewal fails.
    let (lease_service, mut lease_handle): (Service, Handle) = tower_test::mock::pair();
    tokio::spawn(async move {
        let mut n = 0;
        while let Some((req, send)) = lease_handle.next_request().await {
            n += 1;
            match (req.method().clone(), n) {
                (Method::GET, 1) => respond(
                    send,
                    StatusCode::NOT_FOUND,
                    &json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound", "message": "no lease" }),
                ),
                (Method::POST, _) => {
                    let sent = req.into_body().collect_bytes().await.expect("body");
                    let lease: Value = serde_json::from_slice(&sent).expect("json");
                    respond(send, StatusCode::CREATED, &lease);
                }
                _ => respond(
                    send,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500, "reason": "InternalError", "message": "etcd is sad" }),
                ),
            }
        }
    });
    let (tx, _rx) = futures::channel::mpsc::unbounded();
    let leader_args = LeaderArgs {
        leader_election: true,
        leader_election_namespace: Some("ns".into()),
        leader_election_lease_name: "lease".into(),
        leader_election_lease_duration: HumanDuration(Duration::from_secs(6)),
        leader_election_renew_grace: HumanDuration(Duration::from_secs(2)),
        identity: None,
    };
    let (election, leadership) = crate::leader::Election::start(
        Client::new(lease_service, "ns"),
        &leader_args,
        "me".into(),
        Arc::new(Metrics::new()),
        tx,
        crate::tasks::Liveness::default().task("leader election"),
    )
    .expect("election");
    while !leadership.is_leader() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elected = Instant::now();
    let (service, server) = slow_server(Duration::from_secs(60));
    let client = over(
        service,
        "default",
        Policy::new(&ClientArgs::default()).fenced(leadership.clone()),
    );
    let watch = leadership.clone();
    let writes: Vec<_> = (0..8)
        .map(|i| {
            let write = patch(&client, &format!("n{i}"));
            let leadership = watch.clone();
            tokio::spawn(async move {
                let result = write.await;
                (result.is_ok(), leadership.is_leader(), Instant::now())
            })
        })
        .collect();
    for w in writes {
        let (ok, leading, ended) = w.await.expect("task");
        assert!(
            !ok,
            "a write completed (the API server holds them for a minute)"
        );
        assert!(!leading, "a write ended while still leading");
        let after = ended.duration_since(elected);
        assert!(
            after <= Duration::from_secs(4) + Duration::from_millis(50),
            "a write outlived the renew deadline (4 s): ended {after:?} after the last renewal"
        );
    }
    // Each write told the API server its own bound: at most the renew deadline (4 s after the
    // last renewal), in milliseconds.
    let seen = server.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 8);
    for (method, uri) in &seen {
        assert_eq!(method, Method::PATCH);
        let ms: u64 = uri
            .split("timeout=")
            .nth(1)
            .and_then(|t| t.strip_suffix("ms"))
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("a timeout in milliseconds: {uri}"));
        assert!(
            (1..=4000).contains(&ms),
            "the API server is told the write's deadline: {uri}"
        );
    }
    election.stop().await;
}

/// Reads are bounded by the request timeout (and the API server told it); a watch's stream is
/// not, only its start.
#[tokio::test(start_paused = true)]
async fn a_call_is_cut_at_the_request_timeout_but_a_watch_is_not_given_it() {
    let (service, server) = slow_server(Duration::from_secs(60));
    let client = over(service, "default", Policy::new(&args(30, 500.0, 1000.0)));
    let api: Api<Node> = Api::all(client.clone());
    let started = Instant::now();
    let e = api.get("n").await.expect_err("cut");
    assert_eq!(Cut::of(&e), Some(&Cut::TimedOut(Duration::from_secs(30))));
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    let (_, uri) = server.seen.lock().expect("lock")[0].clone();
    assert_eq!(uri, "/api/v1/nodes/n?timeout=30000ms");
    // A watch streams for as long as the API server keeps it open: it is not given the request
    // timeout (only its start is bounded by it; see a_watch_that_never_starts_is_cut).
    let (service, server) = slow_server(Duration::from_secs(20));
    let client = over(service, "default", Policy::new(&args(30, 500.0, 1000.0)));
    let request = Request::get("/api/v1/nodes?watch=true&timeoutSeconds=290")
        .body(Body::empty())
        .expect("request");
    assert!(
        client.send(request).await.is_ok(),
        "a watch started in time"
    );
    assert_eq!(
        server.seen.lock().expect("lock")[0].1,
        "/api/v1/nodes?watch=true&timeoutSeconds=290",
        "a watch is not given the request timeout"
    );
}

/// A follower's writes never leave; its reads, and Events, do.
#[tokio::test(start_paused = true)]
async fn a_follower_sends_no_write_but_reads_and_events_go() {
    let (service, server) = slow_server(Duration::from_millis(1));
    let client = over(
        service,
        "default",
        Policy::new(&ClientArgs::default()).fenced(Leadership::follower()),
    );
    let e = patch(&client, "n").await.expect_err("refused");
    assert_eq!(Cut::of(&e), Some(&Cut::NotLeading));
    assert!(server.seen.lock().expect("lock").is_empty(), "nothing sent");
    let api: Api<Node> = Api::all(client.clone());
    api.get("n").await.expect("a read goes");
    let event = Request::post("/apis/events.k8s.io/v1/namespaces/default/events")
        .body(Body::from(b"{}".to_vec()))
        .expect("request");
    client.send(event).await.expect("an Event goes");
    assert_eq!(server.seen.lock().expect("lock").len(), 2);
}

/// The pace: with 2 a second and a burst of 2, 6 calls take 2 s.
#[tokio::test(start_paused = true)]
async fn calls_are_paced_by_the_bucket() {
    let (service, _server) = slow_server(Duration::ZERO);
    let client = over(service, "default", Policy::new(&args(30, 2.0, 2.0)));
    let api: Api<Node> = Api::all(client.clone());
    let started = Instant::now();
    for _ in 0..6 {
        api.get("n").await.expect("answered");
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_millis(2100),
        "6 calls at 2/s after a burst of 2 took {took:?}"
    );
}

/// A watch whose answer never starts (a half-open connection) is cut at the request timeout:
/// no silent stall.
#[tokio::test(start_paused = true)]
async fn a_watch_that_never_starts_is_cut() {
    let (service, mut handle): (Service, Handle) = tower_test::mock::pair();
    tokio::spawn(async move {
        while let Some((_req, send)) = handle.next_request().await {
            std::mem::forget(send);
        }
    });
    let client = over(service, "default", Policy::new(&args(30, 500.0, 1000.0)));
    let started = Instant::now();
    let request = Request::get("/api/v1/nodes?watch=true&timeoutSeconds=290")
        .body(Body::empty())
        .expect("request");
    let e = client.send(request).await.expect_err("cut");
    assert_eq!(Cut::of(&e), Some(&Cut::TimedOut(Duration::from_secs(30))));
    assert_eq!(started.elapsed(), Duration::from_secs(30));
}

/// Only Events are exempt from the fence, matched segment by segment: a Node, a HyperNode or a
/// namespace named `events` is not an Event.
#[test]
fn only_events_are_exempt_from_the_fence() {
    let post = Method::POST;
    for (path, fenced) in [
        ("/api/v1/namespaces/default/events", false),
        ("/api/v1/namespaces/default/events/n.123", false),
        ("/apis/events.k8s.io/v1/namespaces/default/events", false),
        (
            "/apis/events.k8s.io/v1/namespaces/default/events/n.123",
            false,
        ),
        ("/api/v1/nodes/events", true),
        ("/api/v1/nodes/events/status", true),
        ("/apis/topology.volcano.sh/v1alpha1/hypernodes/events", true),
        ("/api/v1/namespaces/events/configmaps/slurm", true),
        ("/api/v1/namespaces/events", true),
        ("/api/v1/nodes/n", true),
    ] {
        let uri: Uri = path.parse().expect("uri");
        assert_eq!(is_fenced_write(&post, &uri), fenced, "{path}");
    }
    let get: Uri = "/api/v1/nodes/n".parse().expect("uri");
    assert!(!is_fenced_write(&Method::GET, &get), "a read");
}

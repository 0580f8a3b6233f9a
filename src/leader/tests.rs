//! The election against a mocked API server (paused time).

use super::*;
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};

fn args(duration: &str, grace: &str) -> LeaderArgs {
    LeaderArgs {
        leader_election: true,
        leader_election_namespace: Some("ns".into()),
        leader_election_lease_name: "lease".into(),
        leader_election_lease_duration: duration.parse::<HumanDuration>().expect("duration"),
        leader_election_renew_grace: grace.parse::<HumanDuration>().expect("grace"),
        identity: None,
    }
}

#[test]
fn lease_settings_the_lease_library_would_panic_on_are_configuration_errors() {
    assert_eq!(lease_seconds(&args("15s", "5s")).ok(), Some((15, 5)));
    for (d, g) in [
        ("5s", "5s"),
        ("5s", "10s"),
        ("1500ms", "1s"),
        ("10s", "500ms"),
        ("10s", "0s"),
    ] {
        let e = lease_seconds(&args(d, g)).expect_err(&format!("{d}/{g} refused"));
        assert_eq!(e.category(), "config", "{d}/{g}: {e}");
    }
    // Accepted by lease_seconds, but the deadline does not hold three renewals: a leader that
    // would flap. The error gives the rule and a duration that works.
    for (d, g, fix) in [
        ("15s", "14s", "22s"),
        ("2s", "1s", "3s"),
        ("5s", "4s", "12s"),
        ("10s", "4s", "12s"),
    ] {
        let e = Timings::from_args(&args(d, g)).expect_err(&format!("{d}/{g} refused"));
        assert!(
            e.to_string().contains("renewal attempts") && e.to_string().contains(fix),
            "{d}/{g}: {e}"
        );
    }
    let t = Timings::from_args(&args("15s", "5s")).expect("timings");
    assert_eq!(
        (t.lease_duration, t.renew_deadline, t.retry_period),
        (
            Duration::from_secs(15),
            Duration::from_secs(10),
            Duration::from_secs(2)
        )
    );
}

/// The Lease at version `rv`; each version has its own renewTime, as each renewal writes.
fn lease(holder: &str, rv: u64) -> Value {
    let renewed = format!(
        "2026-11-30T{:02}:{:02}:{:02}.000000Z",
        rv / 3600 % 24,
        rv / 60 % 60,
        rv % 60
    );
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": { "name": "lease", "namespace": "ns", "resourceVersion": rv.to_string() },
        "spec": { "holderIdentity": holder, "leaseDurationSeconds": 6, "renewTime": renewed }
    })
}

fn status(code: u16) -> Value {
    let reason = match code {
        404 => "NotFound",
        409 => "Conflict",
        _ => "InternalError",
    };
    json!({ "apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason, "message": "etcd is sad" })
}

/// An API server for the one Lease: `answer(method, request number)` decides each response
/// (`Value::Null`: the Lease as it was sent, as the API server stores and returns it).
fn api(mut answer: impl FnMut(&Method, usize) -> (StatusCode, Value) + Send + 'static) -> Client {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        let mut n = 0;
        while let Some((req, send)) = handle.next_request().await {
            n += 1;
            let method = req.method().clone();
            let (code, mut body) = answer(&method, n);
            if body.is_null() {
                let sent = req.into_body().collect_bytes().await.expect("body");
                body = serde_json::from_slice(&sent).expect("json");
            }
            send.send_response(
                Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&body).expect("json")))
                    .expect("response"),
            );
        }
    });
    Client::new(service, "ns")
}

fn start(client: Client) -> (Election, Leadership) {
    let (tx, _rx) = futures::channel::mpsc::unbounded();
    let (election, leadership) = Election::start(
        client,
        &args("6s", "2s"),
        "me".into(),
        Arc::new(Metrics::default()),
        tx,
        crate::tasks::Liveness::default().task("leader election"),
    )
    .expect("election");
    (election, leadership)
}

/// The Lease API answers 500 to every renewal: the leader stops acting before the lease
/// duration has passed since its last successful renewal (when another replica could take
/// over), and never acts again while renewals fail.
#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewals_fail_stops_before_its_lease_expires() {
    let client = api(|method, n| match (method, n) {
        (&Method::GET, 1) => (StatusCode::NOT_FOUND, status(404)),
        (&Method::POST, 2) => (StatusCode::CREATED, Value::Null),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, status(500)),
    });
    let (election, leadership) = start(client);
    let started = Instant::now();
    while !leadership.is_leader() {
        assert!(started.elapsed() < Duration::from_secs(5), "never elected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elected = Instant::now();
    while leadership.is_leader() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stopped_after = elected.elapsed();
    assert!(
        stopped_after <= Duration::from_secs(4) + Duration::from_millis(100),
        "acted for {stopped_after:?} without a renewal (renew deadline 4 s, lease 6 s)"
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!leadership.is_leader(), "leader again while renewals fail");
    election.stop().await;
}

/// A cluster still settling: the first Lease calls fail (connection errors, 5xx, 403 while
/// RBAC propagates). The election keeps trying — start-up never fails for it — and leads
/// once the API server answers.
#[tokio::test(start_paused = true)]
async fn lease_errors_at_start_are_retried_until_the_api_server_answers() {
    let client = api(|method, n| match (method, n) {
        (_, 1..=3) => (StatusCode::SERVICE_UNAVAILABLE, status(503)),
        (_, 4..=5) => (StatusCode::FORBIDDEN, status(403)),
        (&Method::GET, _) => (StatusCode::NOT_FOUND, status(404)),
        (&Method::POST, _) => (StatusCode::CREATED, Value::Null),
        _ => (StatusCode::OK, Value::Null),
    });
    let (election, leadership) = start(client);
    let started = Instant::now();
    while !leadership.is_leader() {
        assert!(started.elapsed() < Duration::from_secs(30), "never elected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    election.stop().await;
}

/// A renewal that hangs (a partition) counts as failed at the deadline.
#[tokio::test(start_paused = true)]
async fn a_leader_whose_renewals_hang_stops_at_the_deadline() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        let mut n = 0;
        while let Some((req, send)) = handle.next_request().await {
            n += 1;
            let (code, body) = match n {
                1 => (StatusCode::NOT_FOUND, status(404)),
                2 => {
                    let sent = req.into_body().collect_bytes().await.expect("body");
                    (
                        StatusCode::CREATED,
                        serde_json::from_slice::<Value>(&sent).expect("json"),
                    )
                }
                _ => {
                    // Never answered.
                    std::mem::forget(send);
                    continue;
                }
            };
            send.send_response(
                Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&body).expect("json")))
                    .expect("response"),
            );
        }
    });
    let (election, leadership) = start(Client::new(service, "ns"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(leadership.is_leader());
    tokio::time::sleep(Duration::from_millis(4100)).await;
    assert!(
        !leadership.is_leader(),
        "still leader past the renew deadline"
    );
    election.stop().await;
}

/// Another replica holds the Lease and keeps renewing it: we never lead. When it stops
/// renewing, we take over only after a whole lease duration without change on our clock.
#[tokio::test(start_paused = true)]
async fn a_held_lease_is_taken_only_after_a_whole_duration_unchanged() {
    let renewing = Arc::new(AtomicBool::new(true));
    let last_renewal = Arc::new(std::sync::Mutex::new(Instant::now()));
    let (still, renewed) = (renewing.clone(), last_renewal.clone());
    let rv = Arc::new(std::sync::atomic::AtomicU64::new(1));
    let client = api(move |method, _| match *method {
        Method::GET => {
            if still.load(Ordering::SeqCst) {
                // The other replica renewed since the last read.
                rv.fetch_add(1, Ordering::SeqCst);
                *renewed.lock().unwrap() = Instant::now();
            }
            (StatusCode::OK, lease("other", rv.load(Ordering::SeqCst)))
        }
        Method::PUT => (StatusCode::OK, Value::Null),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, status(500)),
    });
    let (election, leadership) = start(client);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(
        !leadership.is_leader(),
        "took a lease that was being renewed"
    );
    renewing.store(false, Ordering::SeqCst);
    let stopped = Instant::now();
    while !leadership.is_leader() {
        assert!(
            stopped.elapsed() < Duration::from_secs(12),
            "never took over"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let unchanged_for = last_renewal.lock().unwrap().elapsed();
    assert!(
        unchanged_for >= Duration::from_secs(6),
        "took over when the lease had been unchanged for {unchanged_for:?}, less than its duration"
    );
    election.stop().await;
}

/// The leader's renewals meet conflicts (someone wrote the Lease since it was read) while a
/// re-read still names it holder: a conflict is no renewal, so the leader stops at its renew
/// deadline instead of counting itself renewed while `renewTime` stands still.
#[tokio::test(start_paused = true)]
async fn a_renewal_that_conflicts_is_not_a_renewal() {
    let client = api(|method, n| match (method, n) {
        (&Method::GET, 1) => (StatusCode::NOT_FOUND, status(404)),
        (&Method::POST, 2) => (StatusCode::CREATED, Value::Null),
        (&Method::GET, _) => (StatusCode::OK, lease("me", 1)),
        _ => (StatusCode::CONFLICT, status(409)),
    });
    let (election, leadership) = start(client);
    let started = Instant::now();
    while !leadership.is_leader() {
        assert!(started.elapsed() < Duration::from_secs(5), "never elected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elected = Instant::now();
    while leadership.is_leader() {
        assert!(
            elected.elapsed() <= Duration::from_secs(4) + Duration::from_millis(100),
            "still leader past the renew deadline (4 s) with every renewal in conflict"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    election.stop().await;
}

/// A renewal the API server accepts but returns without our `renewTime` (another writer's
/// Lease, a webhook that rewrote it) is not a renewal either; one that returns ours is.
#[tokio::test(start_paused = true)]
async fn a_renewal_counts_only_when_the_lease_carries_our_renew_time() {
    // The API server stores what was sent (`Value::Null`: echoed), or (stale) answers an
    // older Lease to every renewal.
    let echo = |stale: bool| {
        api(move |method, n| match (method, n) {
            (&Method::GET, 1) => (StatusCode::NOT_FOUND, status(404)),
            (&Method::GET, _) => (StatusCode::OK, lease("me", 1)),
            (&Method::PUT, _) if stale => (StatusCode::OK, lease("me", 1)),
            (&Method::POST, _) => (StatusCode::CREATED, Value::Null),
            _ => (StatusCode::OK, Value::Null),
        })
    };
    for (stale, leads_after) in [(false, true), (true, false)] {
        let (election, leadership) = start(echo(stale));
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(leadership.is_leader(), "elected (stale renewals: {stale})");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            leadership.is_leader(),
            leads_after,
            "leading 10 s on (stale renewals: {stale})"
        );
        election.stop().await;
    }
}

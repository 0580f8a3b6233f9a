#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
//! What the controller spends on what changes nothing (issue 60, "nothing for nothing"):
//!
//! - **A Node event that changes nothing a decision reads**: a kubelet's status update (a
//!   heartbeat), the most common event of a cluster (a 100,000-node cluster posts some 330 a
//!   second). Each event is the captured Node (`fixtures/node.json`, as kube-apiserver served
//!   it once the controller had labelled it: ~40 container images, conditions, managed fields,
//!   our labels and verification record) with a new resourceVersion and heartbeat time, as the
//!   API server sends it on a watch. Timed: decoding it as the watch does
//!   (`WatchEvent<WireNode>`), putting it in the node cache (`node::watch::ingest`) and hashing
//!   what a reconcile reads (`node::watch::relevant`); what kube's watcher adds around the
//!   decoding (its line buffering, HTTP, TLS) is not.
//! - **A reconcile that changes nothing**: the captured node carrying its sealed record, its
//!   answer cached, taken from the node cache and reconciled as every resync pass does for
//!   every node (the whole pass at 100,000 nodes is 100,000 of these). It sends no request
//!   (checked).
//!
//! Prints µs, allocations and bytes allocated per event and per reconcile. `cargo bench --bench
//! unchanged` (the release profile; the system allocator, glibc's here, where the image ships
//! musl's).

use std::{sync::atomic::Ordering, time::Instant};

use std::{sync::Arc, time::Duration};

use ec2_topology_labeler::{
    labels::LabelScheme,
    lookup::{
        Lookup, LookupConfig,
        limiter::{Limiter, LimiterConfig},
    },
    metrics::Metrics,
    node::{WireNode, store::NodeCache, watch},
    reconcile::{Context, reconcile},
    topology::{Ec2Error, InstanceTopology, TopologySource},
    verified::{RecordKey, VERIFIED_KEY, Verified},
};
use kube::{core::WatchEvent, runtime::watcher};

mod counting;
use counting::{ALLOCATIONS, BYTES, Counting};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const EVENTS: usize = 20_000;

/// The captured Node as the watch would send it after `k` heartbeats.
fn heartbeat(node: &serde_json::Value, k: usize) -> Vec<u8> {
    let mut node = node.clone();
    let rv = format!("{}", 1_000_000 + k);
    node["metadata"]["resourceVersion"] = rv.into();
    let at = format!(
        "2026-12-07T{:02}:{:02}:{:02}Z",
        k / 3600 % 24,
        k / 60 % 60,
        k % 60
    );
    if let Some(conditions) = node["status"]["conditions"].as_array_mut() {
        for c in conditions {
            c["lastHeartbeatTime"] = at.clone().into();
        }
    }
    // The type first, as kube-apiserver writes it: serde_json's own map would put "object"
    // first, which makes serde buffer the whole object before it knows the variant (three times
    // the time and 36 KiB more a event, measured: not what the watch pays).
    let mut line = br#"{"type":"MODIFIED","object":"#.to_vec();
    serde_json::to_writer(&mut line, &node).expect("a Node serializes");
    line.push(b'}');
    line
}

fn main() {
    // As the controller runs: its log subscriber at `info` (written nowhere here), which every
    // reconcile's span goes through.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::sink)
        .init();
    node_event();
    reconcile_noop();
}

/// The captured Node as it is now: the verification record it carried then lives in the
/// controller's ledger (issue 60), so it is taken off.
fn fixture() -> serde_json::Value {
    let mut node: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/node.json")).expect("the fixture is a Node");
    if let Some(annotations) = node["metadata"]["annotations"].as_object_mut() {
        annotations.remove(VERIFIED_KEY);
    }
    node
}

fn node_event() {
    let node = fixture();
    let scheme = LabelScheme::default();
    let (_cache, mut feeder) = NodeCache::new();
    let events: Vec<Vec<u8>> = (0..=EVENTS).map(|k| heartbeat(&node, k)).collect();
    let decode = |bytes: &[u8]| -> watcher::Event<WireNode> {
        match serde_json::from_slice(bytes).expect("a watch event") {
            WatchEvent::Added(n) | WatchEvent::Modified(n) => watcher::Event::Apply(n),
            _ => panic!("the fixture is a MODIFIED event"),
        }
    };
    // The decoding alone, as kube's watcher does it (the rest is what the controller adds).
    let (a0, b0) = (
        ALLOCATIONS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    let started = Instant::now();
    for bytes in &events[1..] {
        std::hint::black_box(decode(bytes));
    }
    let decoding = started.elapsed();
    let decoding_allocations = ALLOCATIONS.load(Ordering::Relaxed) - a0;
    let decoding_bytes = BYTES.load(Ordering::Relaxed) - b0;
    // The node as the cache holds it before the heartbeats.
    let first = watch::ingest(&mut feeder, &scheme, decode(&events[0])).expect("a node");
    let before = watch::relevant(&first);
    drop(first);
    let (a0, b0) = (
        ALLOCATIONS.load(Ordering::Relaxed),
        BYTES.load(Ordering::Relaxed),
    );
    let started = Instant::now();
    let mut woke = 0usize;
    for bytes in &events[1..] {
        if let Some(node) = watch::ingest(&mut feeder, &scheme, decode(bytes))
            && watch::relevant(&node) != before
        {
            woke += 1;
        }
    }
    let took = started.elapsed();
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - a0;
    let bytes = BYTES.load(Ordering::Relaxed) - b0;
    let n = EVENTS as f64;
    println!(
        "node event ({} bytes of JSON, a heartbeat): {:.1} µs, {:.0} allocations, {:.1} KiB allocated per event ({EVENTS} events; {:.3} CPU-s per 1,000); {woke} would wake a reconcile",
        events[1].len(),
        took.as_secs_f64() * 1e6 / n,
        allocations as f64 / n,
        bytes as f64 / n / 1024.0,
        took.as_secs_f64() * 1000.0 / n,
    );
    println!(
        "  of which decoding (WatchEvent<WireNode>): {:.1} µs, {:.0} allocations, {:.1} KiB; into the cache and hashed: {:.1} µs, {:.0} allocations, {:.1} KiB",
        decoding.as_secs_f64() * 1e6 / n,
        decoding_allocations as f64 / n,
        decoding_bytes as f64 / n / 1024.0,
        (took.as_secs_f64() - decoding.as_secs_f64()) * 1e6 / n,
        (allocations as f64 - decoding_allocations as f64) / n,
        (bytes as f64 - decoding_bytes as f64) / n / 1024.0,
    );
    assert_eq!(woke, 0, "a heartbeat changes nothing a reconcile reads");
}

const RECONCILES: usize = 20_000;
const ID: &str = "i-0123456789abcdef0";

/// EC2 with one answer, for [`ID`].
#[derive(Clone)]
struct Ec2(InstanceTopology);

impl TopologySource for Ec2 {
    async fn describe(&self, _: &str, ids: &[String]) -> Result<Vec<InstanceTopology>, Ec2Error> {
        Ok(ids
            .iter()
            .filter(|i| **i == self.0.instance_id)
            .map(|_| self.0.clone())
            .collect())
    }
}

fn reconcile_noop() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let answer = InstanceTopology {
            instance_id: ID.into(),
            instance_type: Some("p5.48xlarge".into()),
            zone_id: Some("usw2-az1".into()),
            network_nodes: vec!["nn-spine-1".into(), "nn-agg-6".into(), "nn-leaf-6".into()],
            ..InstanceTopology::default()
        };
        let key = RecordKey::new(b"the benchmark's record key, 32 bytes or more").expect("a key");
        let metrics = Arc::new(Metrics::new());
        let lookup = Lookup::spawn(
            Ec2(answer.clone()),
            Arc::new(Limiter::new(LimiterConfig::default())),
            LookupConfig::default(),
            metrics.clone(),
        )
        .with_record_key(Some(key.clone()));
        let (service, mut handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let client = kube::Client::new(service, "default");
        let ctx = Arc::new(Context::new(
            kube::Api::all(client),
            lookup,
            LabelScheme::default(),
            None,
            Duration::from_secs(3600),
            metrics,
        ));
        // The captured Node in the node cache as the watch puts it there (pruned, packed), its
        // record, sealed a minute ago, in the ledger.
        let mut node = fixture();
        node["spec"]["providerID"] = format!("aws:///us-west-2a/{ID}").into();
        let boot_id = node["status"]["nodeInfo"]["bootID"]
            .as_str()
            .map(str::to_owned);
        let record = Verified {
            topology: answer,
            boot_id,
            at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_secs()
                - 60,
        };
        let name = node["metadata"]["name"]
            .as_str()
            .expect("a name")
            .to_owned();
        ctx.ledger.put(&name, &record);
        let wire: WireNode = serde_json::from_value(node).expect("a Node");
        let (cache, mut feeder) = NodeCache::new();
        watch::ingest(&mut feeder, &LabelScheme::default(), watcher::Event::Apply(wire));
        // What a resync does for each node: take it from the cache, reconcile it. The first
        // takes the record as the answer; every one after is a resync's.
        let once = || async {
            let node = cache.get(&name).expect("cached");
            reconcile(node, ctx.clone()).await.expect("a no-op")
        };
        // What each reconcile's task moves whole (spawned, polled to its end, read back).
        let future = std::mem::size_of_val(&reconcile(cache.get(&name).expect("cached"), ctx.clone()));
        // A reconcile that sends a request would wait on the mock forever: the first one is
        // bounded, and every one after it finds the node as it did.
        tokio::time::timeout(Duration::from_secs(10), once())
            .await
            .expect("a reconcile that changes nothing sends no request");
        let (a0, b0) = (
            ALLOCATIONS.load(Ordering::Relaxed),
            BYTES.load(Ordering::Relaxed),
        );
        let started = Instant::now();
        for _ in 0..RECONCILES {
            once().await;
        }
        let took = started.elapsed();
        let allocations = ALLOCATIONS.load(Ordering::Relaxed) - a0;
        let bytes = BYTES.load(Ordering::Relaxed) - b0;
        let sent = tokio::time::timeout(Duration::from_millis(100), handle.next_request()).await;
        assert!(sent.is_err(), "a reconcile that changes nothing sends nothing");
        let n = RECONCILES as f64;
        println!(
            "reconcile that changes nothing: {:.1} µs, {:.0} allocations, {:.1} KiB allocated per reconcile ({RECONCILES} reconciles; a resync pass at 100,000 nodes: {:.1} CPU-s); its future {future} bytes",
            took.as_secs_f64() * 1e6 / n,
            allocations as f64 / n,
            bytes as f64 / n / 1024.0,
            took.as_secs_f64() * 100_000.0 / n,
        );
    });
}

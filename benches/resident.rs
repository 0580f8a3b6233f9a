#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
//! What the controller keeps per node at rest (issue 60, "one slot per node"): bytes a node
//! in each of the places the controller keeps something of every node, counted by the
//! allocator, for a fleet of light nodes (as the scale bench's: no images) that EKS labelled
//! right, each taken in by the watch (`node::watch::ingest`) and reconciled once (no write: the
//! labels are right; EC2's answer asked and cached; its record in the ledger).
//!
//! Printed per node: the bytes the allocations ask for, their count, and the bytes musl's
//! allocator (the image's) would hold for them (its size classes and 4 bytes of its own a
//! slot; an estimate, computed from the sizes asked for). `cargo bench --bench resident`
//! (`RESIDENT_NODES`, default 100,000: a hash table's slack depends on how full it is).

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use ec2_topology_labeler::{
    labels::LabelScheme,
    ledger::Ledger,
    lookup::{
        Lookup, LookupConfig,
        limiter::{Limiter, LimiterConfig},
    },
    metrics::Metrics,
    node::{WireNode, store::NodeCache, watch},
    reconcile::{Context, reconcile},
    topology::{Ec2Error, InstanceTopology, TopologySource},
    verified::RecordKey,
};
use kube::runtime::watcher;

mod counting;
use counting::{Counting, LIVE, LIVE_ALLOCATIONS, LIVE_MUSL};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Clone, Copy)]
struct Live {
    bytes: i64,
    allocations: i64,
    musl: i64,
}

fn live() -> Live {
    Live {
        bytes: LIVE.load(Ordering::Relaxed),
        allocations: LIVE_ALLOCATIONS.load(Ordering::Relaxed),
        musl: LIVE_MUSL.load(Ordering::Relaxed),
    }
}

fn report(what: &str, before: Live, n: usize) -> Live {
    let now = live();
    let n = n as f64;
    println!(
        "{what:<44} {:>7.0} B {:>5.2} allocations {:>7.0} B in musl's classes",
        (now.bytes - before.bytes) as f64 / n,
        (now.allocations - before.allocations) as f64 / n,
        (now.musl - before.musl) as f64 / n,
    );
    now
}

/// Node `i`'s instance ID, name and the switches above it (16 nodes a leaf, as the scale
/// bench's fleet).
fn instance(i: usize) -> (String, String, [String; 3]) {
    (
        format!("i-{:07x}{i:010x}", 0x5ca1e),
        format!(
            "ip-10-{}-{}-{}.us-west-2.compute.internal",
            i / 62_500,
            i / 250 % 250,
            i % 250
        ),
        [
            format!("nn-spine-{}", i % 2),
            format!("nn-agg-{}", (i / 16) % 20),
            format!("nn-leaf-{}", i / 16),
        ],
    )
}

/// EC2 describing every instance of [`instance`] (its index in its ID).
#[derive(Clone)]
struct Ec2;

impl TopologySource for Ec2 {
    async fn describe(&self, _: &str, ids: &[String]) -> Result<Vec<InstanceTopology>, Ec2Error> {
        Ok(ids
            .iter()
            .filter_map(|id| {
                let i = usize::from_str_radix(id.get(9..)?, 16).ok()?;
                let (_, _, network_nodes) = instance(i);
                Some(InstanceTopology {
                    instance_id: id.clone(),
                    instance_type: Some("p5.48xlarge".into()),
                    zone_id: Some("usw2-az1".into()),
                    network_nodes: network_nodes.into(),
                    ..InstanceTopology::default()
                })
            })
            .collect())
    }
}

/// Node `i` as a kubelet registers it (light: no images) and EKS's cloud controller labels it.
fn node(i: usize) -> WireNode {
    let (id, name, network_nodes) = instance(i);
    let hostname = name.split('.').next().unwrap_or_default().to_owned();
    let ip = hostname.trim_start_matches("ip-").replace('-', ".");
    let condition = |t: &str, status: &str, reason: &str| {
        serde_json::json!({
            "type": t, "status": status, "reason": reason,
            "message": format!("kubelet reports {t}={status}"),
            "lastHeartbeatTime": "2026-11-30T08:00:00Z",
            "lastTransitionTime": "2026-11-30T07:00:00Z"
        })
    };
    let value = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": format!("{:08x}-0000-4000-8000-{i:012x}", 0x5ca1e),
            "resourceVersion": format!("{}", 1_000_000 + i),
            "creationTimestamp": "2026-11-30T07:00:00Z",
            "labels": {
                "kubernetes.io/hostname": hostname,
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "topology.kubernetes.io/zone": "us-west-2a",
                "topology.kubernetes.io/region": "us-west-2",
                "eks.amazonaws.com/nodegroup": "gpu-training",
                "eks.amazonaws.com/capacityType": "CAPACITY_BLOCK",
                "k8s.io/cloud-provider-aws": "a1b2c3d4e5f6",
                "topology.k8s.aws/network-node-layer-1": network_nodes[0],
                "topology.k8s.aws/network-node-layer-2": network_nodes[1],
                "topology.k8s.aws/network-node-layer-3": network_nodes[2],
                "topology.k8s.aws/zone-id": "usw2-az1"
            },
            "annotations": {
                "alpha.kubernetes.io/provided-node-ip": ip,
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"
            }
        },
        "spec": { "providerID": format!("aws:///us-west-2a/{id}") },
        "status": {
            "capacity": { "cpu": "192", "memory": "2097152Mi", "pods": "110", "nvidia.com/gpu": "8" },
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady")
            ],
            "addresses": [{ "type": "InternalIP", "address": ip }],
            "nodeInfo": {
                "bootID": format!("{i:08x}-0000-4000-8000-{:012x}", i * 7919),
                "kubeletVersion": "v1.33.5-eks-1234567",
                "architecture": "amd64"
            }
        }
    });
    serde_json::from_value(value).expect("a Node")
}

fn main() {
    let n: usize = std::env::var("RESIDENT_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::sink)
        .init();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let key = RecordKey::new(b"the benchmark's record key, 32 bytes or more").expect("a key");
        let metrics = Arc::new(Metrics::new());
        let lookup = Lookup::spawn(
            Ec2,
            Arc::new(Limiter::new(LimiterConfig {
                rate: 1e6,
                burst: 1e6,
                ..LimiterConfig::default()
            })),
            LookupConfig {
                batch_window: Duration::from_millis(1),
                ..LookupConfig::default()
            },
            metrics.clone(),
        )
        .with_record_key(Some(key.clone()));
        // A reconcile that sends a request would wait on the mock forever (checked below).
        let (service, mut handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = kube::Client::new(service, "default");
        let ctx = Arc::new(Context::new(
            kube::Api::all(client),
            lookup,
            LabelScheme::default(),
            None,
            Duration::from_secs(3600),
            metrics,
        ));
        let scheme = LabelScheme::default();
        let (cache, mut feeder) = NodeCache::new();
        println!("{n} light nodes, labelled as EKS labels them; per node:");
        let start = live();
        for i in 0..n {
            watch::ingest(&mut feeder, &scheme, watcher::Event::Apply(node(i)));
        }
        let ingested = report("the node cache (watch::ingest)", start, n);
        let names: Vec<String> = (0..n).map(|i| instance(i).1).collect();
        let before = live();
        for chunk in names.chunks(1_000) {
            let reconciles = chunk.iter().map(|name| {
                let node = cache.get(name).expect("cached");
                tokio::time::timeout(Duration::from_secs(30), reconcile(node, ctx.clone()))
            });
            for done in futures::future::join_all(reconciles).await {
                done.expect("a reconcile that writes nothing sends no request")
                    .expect("a reconcile");
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let sent = tokio::time::timeout(Duration::from_millis(100), handle.next_request()).await;
        assert!(sent.is_err(), "labels EKS wrote right are not written");
        assert_eq!(ctx.ledger.len(), n, "every node's record in the ledger");
        let reconciled = report("  + one reconcile each (records, answers, ledger)", before, n);
        // The ledger's part, alone: the same records in a ledger of their own.
        let ledger = Ledger::in_memory(Some(key));
        let before_ledger = live();
        for name in &names {
            let record = ctx.ledger.get(name).expect("a record");
            ledger.put(name, &record);
        }
        report("  of which the ledger (the same, alone)", before_ledger, n);
        let all = (ingested.bytes - start.bytes + reconciled.bytes - before.bytes) as f64 / n as f64;
        let all_musl =
            (ingested.musl - start.musl + reconciled.musl - before.musl) as f64 / n as f64;
        println!(
            "the controller's, in all: {all:.0} B a node, {all_musl:.0} B in musl's classes ({:.2} KiB)",
            all_musl / 1024.0
        );
    });
}

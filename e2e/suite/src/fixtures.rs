//! Realistic test objects: Nodes as EKS kubelets register them (labels, conditions, capacity,
//! ~40 images, nodeInfo with a bootID), and the EC2 instances behind them.

use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Node;
use mock_ec2::Instance;
use serde_json::json;

/// Taint of test nodes in a real cluster (kind): they have no kubelet, so nothing may be
/// scheduled on them. Off on the bare control plane (no scheduler runs there, and Kueue's
/// topology-aware scheduling must see these nodes untainted).
pub const NO_KUBELET_TAINT_KEY: &str = "e2e.ec2-topology-labeler.io/no-kubelet";
static NO_KUBELET_TAINT: AtomicBool = AtomicBool::new(false);

/// Taint every test node made from now on (see [`NO_KUBELET_TAINT_KEY`]).
pub fn taint_test_nodes(on: bool) {
    NO_KUBELET_TAINT.store(on, Ordering::Relaxed);
}

/// How a test node is known: its name, instance ID and providerID.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub name: String,
    pub instance_id: String,
    pub zone: String,
    pub provider_id: String,
    pub instance_type: String,
    pub boot_id: String,
}

/// A deterministic instance ID (17 hex digits) for test `prefix` and index `n`.
pub fn instance_id(prefix: u32, n: u32) -> String {
    format!("i-{prefix:07x}{n:010x}")
}

pub fn boot_id(seed: u32) -> String {
    format!(
        "{:08x}-0000-4000-8000-{:012x}",
        seed,
        fastrand::u64(..1 << 48)
    )
}

impl NodeSpec {
    pub fn ec2(prefix: u32, n: u32, instance_type: &str) -> Self {
        let instance_id = instance_id(prefix, n);
        let zone = "us-west-2a".to_string();
        Self {
            name: format!(
                "ip-10-{}-{}-{}.us-west-2.compute.internal",
                prefix % 250,
                n / 250,
                n % 250
            ),
            provider_id: format!("aws:///{zone}/{instance_id}"),
            instance_id,
            zone,
            instance_type: instance_type.into(),
            boot_id: boot_id(n),
        }
    }

    pub fn with_provider_id(mut self, provider_id: &str) -> Self {
        self.provider_id = provider_id.into();
        self
    }

    /// The Node object a kubelet would register.
    pub fn node(&self) -> Node {
        let images: Vec<serde_json::Value> = (0..40)
            .map(|i| {
                json!({
                    "names": [
                        format!("602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/image-{i}@sha256:{:064x}", i as u64 * 7919 + 1),
                        format!("602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/image-{i}:v1.{i}.0-eksbuild.1")
                    ],
                    "sizeBytes": 50_000_000 + i * 1_234_567
                })
            })
            .collect();
        let ip = self
            .name
            .strip_prefix("ip-")
            .and_then(|s| s.split('.').next())
            .unwrap_or("10-0-0-1")
            .replace('-', ".");
        let hostname = self
            .name
            .split('.')
            .next()
            .unwrap_or(&self.name)
            .to_string();
        let condition = |t: &str, status: &str, reason: &str| {
            json!({
                "type": t, "status": status, "reason": reason,
                "message": format!("kubelet reports {t}={status}"),
                "lastHeartbeatTime": "2026-11-30T08:00:00Z",
                "lastTransitionTime": "2026-11-30T07:00:00Z"
            })
        };
        let mut spec = json!({ "providerID": self.provider_id });
        if NO_KUBELET_TAINT.load(Ordering::Relaxed) {
            // In a cluster with a scheduler no pod may land on a node no kubelet runs.
            spec["taints"] =
                json!([{ "key": NO_KUBELET_TAINT_KEY, "value": "true", "effect": "NoSchedule" }]);
        }
        let value = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": {
                    "kubernetes.io/hostname": hostname,
                    "kubernetes.io/arch": "amd64",
                    "kubernetes.io/os": "linux",
                    "node.kubernetes.io/instance-type": self.instance_type,
                    "topology.kubernetes.io/zone": self.zone,
                    "topology.kubernetes.io/region": "us-west-2",
                    "eks.amazonaws.com/nodegroup": "gpu-training",
                    "eks.amazonaws.com/capacityType": "CAPACITY_BLOCK",
                    "k8s.io/cloud-provider-aws": "a1b2c3d4e5f6"
                },
                "annotations": {
                    "alpha.kubernetes.io/provided-node-ip": ip,
                    "node.alpha.kubernetes.io/ttl": "0",
                    "volumes.kubernetes.io/controller-managed-attach-detach": "true"
                }
            },
            "spec": spec,
            "status": {
                "capacity": { "cpu": "192", "memory": "2097152Mi", "pods": "110", "nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32", "ephemeral-storage": "3758096384Ki" },
                "allocatable": { "cpu": "191450m", "memory": "2060000Mi", "pods": "110", "nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32", "ephemeral-storage": "3463452752Ki" },
                "conditions": [
                    condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                    condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                    condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                    condition("Ready", "True", "KubeletReady")
                ],
                "addresses": [
                    { "type": "InternalIP", "address": ip },
                    { "type": "Hostname", "address": self.name },
                    { "type": "InternalDNS", "address": self.name }
                ],
                "daemonEndpoints": { "kubeletEndpoint": { "Port": 10250 } },
                "nodeInfo": {
                    "machineID": format!("ec2{:029x}", fastrand::u128(..1 << 116)),
                    "systemUUID": format!("ec2{:05x}-0000-0000-0000-000000000000", fastrand::u32(..1 << 20)),
                    "bootID": self.boot_id,
                    "kernelVersion": "6.1.119-129.201.amzn2023.x86_64",
                    "osImage": "Amazon Linux 2023.6.20241212",
                    "containerRuntimeVersion": "containerd://1.7.25",
                    "kubeletVersion": "v1.33.5-eks-1234567",
                    "kubeProxyVersion": "",
                    "operatingSystem": "linux",
                    "architecture": "amd64"
                },
                "images": images
            }
        });
        // The value is built above from known-good parts.
        serde_json::from_value(value).expect("fixture node is a valid Node")
    }

    /// The EC2 instance behind this node, with `network_nodes` (top first).
    pub fn instance(&self, network_nodes: &[&str]) -> Instance {
        Instance {
            instance_id: self.instance_id.clone(),
            instance_type: self.instance_type.clone(),
            availability_zone: self.zone.clone(),
            zone_id: "usw2-az1".into(),
            network_nodes: network_nodes.iter().map(|s| s.to_string()).collect(),
            group_name: None,
            capacity_block_id: None,
            state: "running".into(),
        }
    }
}

/// An active UltraServer capacity block (`u-p6e-gb200x72`, in us-west-2a) of `instances`
/// instances, its interconnect `ok`, as `DescribeCapacityBlocks` and
/// `DescribeCapacityBlockStatus` describe one.
pub fn ultraserver_block(id: &str, instances: u32) -> mock_ec2::capacity_blocks::CapacityBlock {
    mock_ec2::capacity_blocks::CapacityBlock {
        capacity_block_id: id.into(),
        ultraserver_type: Some("u-p6e-gb200x72".into()),
        availability_zone: "us-west-2a".into(),
        availability_zone_id: "usw2-az1".into(),
        capacity_reservation_ids: vec![],
        start_date: None,
        end_date: None,
        create_date: None,
        state: "active".into(),
        interconnect_status: "ok".into(),
        total_capacity: instances,
        total_available_capacity: 0,
        total_unavailable_capacity: 0,
    }
}

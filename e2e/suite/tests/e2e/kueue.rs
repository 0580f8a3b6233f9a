//! Kueue scenarios: our Topologies published and never changed, and Kueue's real scheduler
//! admitting gangs into one network domain, one UltraServer or one NVLink clique, on mixed
//! fleets and with the label presets.

use super::*;

/// No controller-manager or kubelet here: clear the taints the API server put on new Nodes.
pub(super) async fn schedulable(c: &Client, specs: &[NodeSpec]) -> anyhow::Result<()> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    for s in specs {
        nodes
            .patch(
                &s.name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": null}})),
            )
            .await?;
    }
    Ok(())
}

/// A ResourceFlavor of one instance type on `topology`, and a ClusterQueue and a LocalQueue
/// (in `ns`), both named `queue`, taking 1000 CPUs of it.
pub(super) fn kueue_queue(
    flavor: &str,
    instance_type: &str,
    topology: &str,
    queue: &str,
    ns: &str,
) -> String {
    format!(
        r#"
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {{ name: {flavor} }}
spec:
  nodeLabels: {{ node.kubernetes.io/instance-type: {instance_type} }}
  topologyName: {topology}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {{ name: {queue} }}
spec:
  namespaceSelector: {{}}
  resourceGroups:
    - coveredResources: ["cpu"]
      flavors:
        - name: {flavor}
          resources: [{{ name: cpu, nominalQuota: 1000 }}]
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {{ name: {queue}, namespace: {ns} }}
spec: {{ clusterQueue: {queue} }}
"#
    )
}

/// A Workload in `queue` of `count` pods of 100 CPUs (one a node here) whose pod set asks
/// `request` (the topologyRequest's fields, as YAML at that indentation).
pub(super) fn kueue_workload(
    name: &str,
    ns: &str,
    queue: &str,
    count: u32,
    request: &str,
) -> String {
    format!(
        "apiVersion: kueue.x-k8s.io/v1beta2\nkind: Workload\nmetadata: {{ name: {name}, namespace: {ns} }}\nspec:\n  queueName: {queue}\n  podSets:\n    - name: workers\n      count: {count}\n      topologyRequest:\n        {request}\n      template:\n        spec:\n          restartPolicy: Never\n          containers:\n            - name: w\n              image: registry.k8s.io/pause:3.10\n              resources: {{ requests: {{ cpu: \"100\" }} }}\n"
    )
}

/// The topology assignment of Workload `name`'s first pod set, once Kueue admits it (60 s).
pub(super) async fn kueue_assignment(
    workloads: &Api<kube::api::DynamicObject>,
    name: &str,
) -> anyhow::Result<serde_json::Value> {
    eventually(
        &format!("Kueue admits {name}"),
        Duration::from_secs(60),
        || async {
            let w = workloads.get(name).await?;
            let ta =
                w.data["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"].clone();
            Ok(ta.is_object().then_some(ta))
        },
    )
    .await
}

pub(super) fn kueue_workloads(c: &Client, ns: &str) -> Api<kube::api::DynamicObject> {
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"),
        "workloads",
    );
    Api::namespaced_with(c.clone(), ns, &ar)
}

pub(super) fn topology_api(c: &Client) -> Api<kube::api::DynamicObject> {
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Topology"),
        "topologies",
    );
    Api::all_with(c.clone(), &ar)
}

pub(super) fn resource_flavors(c: &Client) -> Api<kube::api::DynamicObject> {
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "ResourceFlavor"),
        "resourceflavors",
    );
    Api::all_with(c.clone(), &ar)
}

pub(super) fn levels(t: &kube::api::DynamicObject) -> Vec<String> {
    t.data["spec"]["levels"]
        .as_array()
        .map(|ls| {
            ls.iter()
                .filter_map(|l| l["nodeLabel"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

pub(super) async fn kueue_topology_published_and_never_changed(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let api = topology_api(&c);
    let three = eventually("Topology aws-network", WAIT, || async {
        Ok(api.get_opt("aws-network").await?)
    })
    .await?;
    ensure!(
        levels(&three)
            == [
                format!("{L}1"),
                format!("{L}2"),
                format!("{L}3"),
                "kubernetes.io/hostname".into()
            ],
        "{:?}",
        levels(&three)
    );
    let four = eventually("Topology aws-network-4-layer", WAIT, || async {
        Ok(api.get_opt("aws-network-4-layer").await?)
    })
    .await?;
    ensure!(levels(&four).len() == 5);
    // Someone recreates it with other levels: we leave it and report the mismatch.
    api.delete("aws-network-4-layer", &Default::default())
        .await?;
    let theirs = json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology", "metadata": {"name": "aws-network-4-layer"},
        "spec": {"levels": [{"nodeLabel": "example.com/block"}, {"nodeLabel": "kubernetes.io/hostname"}]}});
    eventually("recreated by hand", WAIT, || async {
        Ok(api
            .patch(
                "aws-network-4-layer",
                &PatchParams::apply("someone-else"),
                &Patch::Apply(&theirs),
            )
            .await
            .ok())
    })
    .await?;
    let guard = env.labeler.lock().await;
    let l = guard.as_ref().context("local controller")?;
    eventually("the mismatch reported", WAIT, || async {
        let m = l.metrics().await?;
        Ok((metric_sum(
            &m,
            "ec2_topology_labeler_kueue_topology_mismatch",
            &["topology=\"aws-network-4-layer\""],
        ) == 1.0)
            .then_some(()))
    })
    .await?;
    let still = api.get("aws-network-4-layer").await?;
    ensure!(
        levels(&still) == ["example.com/block", "kubernetes.io/hostname"],
        "never changed: {:?}",
        levels(&still)
    );
    ensure!(
        l.log_text().contains("levels are immutable"),
        "a log line says why"
    );
    Ok(())
}

pub(super) async fn kueue_admits_into_one_layer3_domain(env: &Env) -> anyhow::Result<()> {
    use e2e::schedulers::Kueue;
    let c = env.admin().await?;
    let artifacts = e2e::schedulers::artifacts()?;
    let mut kueue = Kueue::start(
        &artifacts.join("kueue"),
        &env.cluster.admin_kubeconfig,
        &env.dir.join("kueue"),
        &c,
    )
    .await?;
    // Three nodes of their own instance type: two under leaf nn-kl1, one under nn-kl2. Each fits
    // one pod of 100 CPUs.
    let specs: Vec<NodeSpec> = (0..3)
        .map(|k| NodeSpec::ec2(0x111, k, "p5e-e2e.48xlarge"))
        .collect();
    let leaves = ["nn-kl1", "nn-kl1", "nn-kl2"];
    let pairs: Vec<(NodeSpec, Instance)> = specs
        .iter()
        .zip(leaves)
        .map(|(s, l)| (s.clone(), s.instance(&["nn-ks", "nn-ka", l])))
        .collect();
    label_and_wait(env, &c, &pairs).await?;
    schedulable(&c, &specs).await?;
    kube_util::ensure_namespace(&c, "ml").await?;
    let objects = kueue_queue(
        "p5e-e2e",
        "p5e-e2e.48xlarge",
        "aws-network",
        "training",
        "ml",
    );
    kube_util::apply_yaml(&c, &objects, "e2e").await?;
    let workload = |name: &str, count: u32, layer: u32| {
        kueue_workload(
            name,
            "ml",
            "training",
            count,
            &format!("required: {L}{layer}"),
        )
    };
    let workloads = kueue_workloads(&c, "ml");
    kube_util::apply_yaml(&c, &workload("fits-one-leaf", 2, 3), "e2e").await?;
    let admitted = eventually(
        "Kueue admits the 2-pod workload",
        Duration::from_secs(60),
        || async {
            let w = workloads.get("fits-one-leaf").await?;
            let assigned =
                w.data["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
                    .is_object();
            Ok(assigned.then_some(w))
        },
    )
    .await;
    let admitted = match admitted {
        Ok(w) => w,
        Err(e) => {
            kueue.stop();
            anyhow::bail!("{e:#}\n{}", kueue.log_tail(15));
        }
    };
    let ta = &admitted.data["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"];
    // Decode the v1beta2 assignment (levels + slices of compressed per-level values) into the
    // assigned hostnames, and map each back to its node's layer-3 label: all must be nn-kl1.
    let hosts = decode_assignment(ta);
    let by_host: BTreeMap<String, &str> = specs
        .iter()
        .zip(leaves)
        .map(|(s, l)| (s.name.split('.').next().unwrap_or_default().to_string(), l))
        .collect();
    let leaves_used: std::collections::BTreeSet<&str> = hosts
        .iter()
        .filter_map(|h| by_host.get(h).copied())
        .collect();
    ensure!(hosts.len() == 2, "two hosts assigned: {hosts:?} from {ta}");
    ensure!(
        leaves_used.len() == 1 && leaves_used.contains("nn-kl1"),
        "assigned to {leaves_used:?} ({hosts:?}): {ta}"
    );
    eprintln!("    Kueue admitted 2 pods into layer-3 domain nn-kl1: {ta}");
    // Free the two nodes again: three pods now fit the cluster's free capacity (three nodes,
    // all under spine nn-ks) but no single layer-3 domain (two nodes under nn-kl1, one under
    // nn-kl2).
    workloads
        .delete("fits-one-leaf", &Default::default())
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    kube_util::apply_yaml(&c, &workload("fits-no-leaf", 3, 3), "e2e").await?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let w = workloads.get("fits-no-leaf").await?;
    let not_admitted = w.data["status"]["admission"].is_null();
    let reason = w.data["status"]["conditions"].to_string();
    // The same three pods asking only for one layer-1 domain are admitted: capacity was never
    // the obstacle, the layer-3 constraint was.
    kube_util::apply_yaml(&c, &workload("fits-one-spine", 3, 1), "e2e").await?;
    let spine = eventually(
        "Kueue admits 3 pods under one spine",
        Duration::from_secs(30),
        || async {
            let w = workloads.get("fits-one-spine").await?;
            let ta =
                w.data["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"].clone();
            Ok(ta.is_object().then_some(ta))
        },
    )
    .await;
    kueue.stop();
    ensure!(
        not_admitted,
        "a workload that fits no single layer-3 domain was admitted: {}",
        w.data["status"]
    );
    ensure!(
        reason.contains("topology"),
        "pending because of the topology: {reason}"
    );
    let spine = spine?;
    ensure!(
        decode_assignment(&spine).len() == 3,
        "3 hosts under one spine: {spine}"
    );
    eprintln!(
        "    3 pods requiring one layer-3 domain stay pending: {}",
        reason.chars().take(200).collect::<String>()
    );
    eprintln!("    the same 3 pods requiring one layer-1 domain are admitted: {spine}");
    Ok(())
}

/// `--ultraserver-level` (auto, the suite's default): once UltraServer members are labelled the
/// controller creates the Kueue Topology `aws-network-ultraserver` (layers, capacity block,
/// hostname) beside `aws-network`, and the real Kueue places pod-set slices inside one
/// UltraServer each. Three UltraServers of two nodes: A and B under one leaf each, C split
/// across both leaves (its halves are two domains, as every level above names a domain). Four
/// pods in slices of two land on A and B; six in slices of two stay pending (C has no domain
/// of two) though the six nodes have room, which the same six pods without slices show.
pub(super) async fn kueue_places_slices_inside_one_ultraserver(env: &Env) -> anyhow::Result<()> {
    use e2e::schedulers::Kueue;
    const ULTRA: &str = "aws-network-ultraserver";
    const BLOCK: &str = "ec2-topology-labeler.io/capacity-block-id";
    let c = env.admin().await?;
    let specs: Vec<NodeSpec> = (0..6)
        .map(|k| NodeSpec::ec2(0x140, k, "p6e-gb200-e2e.36xlarge"))
        .collect();
    let placement = [
        ("nn-gl1", "cr-0a0000000000000a1"),
        ("nn-gl1", "cr-0a0000000000000a1"),
        ("nn-gl2", "cr-0b0000000000000b2"),
        ("nn-gl2", "cr-0b0000000000000b2"),
        ("nn-gl1", "cr-0c0000000000000c3"),
        ("nn-gl2", "cr-0c0000000000000c3"),
    ];
    let pairs: Vec<(NodeSpec, Instance)> = specs
        .iter()
        .zip(placement)
        .map(|(s, (leaf, block))| {
            let mut i = s.instance(&["nn-gs", "nn-ga", leaf]);
            i.capacity_block_id = Some(block.into());
            (s.clone(), i)
        })
        .collect();
    label_and_wait(env, &c, &pairs).await?;
    schedulable(&c, &specs).await?;
    let api = topology_api(&c);
    let ultra = eventually("Topology aws-network-ultraserver", WAIT, || async {
        Ok(api.get_opt(ULTRA).await?)
    })
    .await?;
    ensure!(
        levels(&ultra)
            == [
                format!("{L}1"),
                format!("{L}2"),
                format!("{L}3"),
                BLOCK.into(),
                "kubernetes.io/hostname".into()
            ],
        "the capacity block between the deepest layer and the hostname: {:?}",
        levels(&ultra)
    );
    ensure!(
        levels(&api.get("aws-network").await?).len() == 4,
        "the Topology every node fits keeps its levels"
    );
    // `tree` draws each UltraServer under its leaf: C once under each.
    let out = std::process::Command::new(e2e::bin_dir().join("ec2-topology-labeler"))
        .arg("tree")
        .env("KUBECONFIG", &env.cluster.admin_kubeconfig)
        .env("RUST_LOG", "error")
        .output()?;
    let tree = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success()
            && tree.contains("UltraServer cr-0a0000000000000a1 [2 nodes, ")
            && tree
                .matches("UltraServer cr-0c0000000000000c3 [1 nodes, ")
                .count()
                == 2,
        "tree: {tree}"
    );
    let artifacts = e2e::schedulers::artifacts()?;
    let mut kueue = Kueue::start(
        &artifacts.join("kueue"),
        &env.cluster.admin_kubeconfig,
        &env.dir.join("kueue-ultraserver"),
        &c,
    )
    .await?;
    kube_util::ensure_namespace(&c, "gb200").await?;
    let objects = kueue_queue(
        "gb200-e2e",
        "p6e-gb200-e2e.36xlarge",
        ULTRA,
        "gb200",
        "gb200",
    );
    kube_util::apply_yaml(&c, &objects, "e2e").await?;
    let workload = |name: &str, count: u32, slices: bool| {
        let mut request = format!("required: {L}1");
        if slices {
            request.push_str(&format!(
                "\n        podSetSliceRequiredTopology: {BLOCK}\n        podSetSliceSize: 2"
            ));
        }
        kueue_workload(name, "gb200", "gb200", count, &request)
    };
    let workloads = kueue_workloads(&c, "gb200");
    let assignment = |name: &'static str| kueue_assignment(&workloads, name);
    let result = async {
        let host = |s: &NodeSpec| s.name.split('.').next().unwrap_or_default().to_string();
        let block_of: BTreeMap<String, &str> = specs
            .iter()
            .zip(placement)
            .map(|(s, (_, b))| (host(s), b))
            .collect();
        kube_util::apply_yaml(&c, &workload("four-in-slices", 4, true), "e2e").await?;
        let ta = assignment("four-in-slices").await?;
        let hosts = decode_assignment(&ta);
        let blocks: std::collections::BTreeSet<&str> = hosts
            .iter()
            .filter_map(|h| block_of.get(h).copied())
            .collect();
        ensure!(hosts.len() == 4, "four hosts: {hosts:?} from {ta}");
        ensure!(
            blocks
                == ["cr-0a0000000000000a1", "cr-0b0000000000000b2"]
                    .into_iter()
                    .collect(),
            "two slices of two, each inside one UltraServer under one leaf (never C, split): {blocks:?} {ta}"
        );
        eprintln!("    Kueue placed 2 slices of 2 pods in UltraServers A and B: {ta}");
        workloads
            .delete("four-in-slices", &Default::default())
            .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        kube_util::apply_yaml(&c, &workload("six-in-slices", 6, true), "e2e").await?;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let w = workloads.get("six-in-slices").await?;
        ensure!(
            w.data["status"]["admission"].is_null(),
            "six pods in slices of two were admitted though UltraServer C is split: {}",
            w.data["status"]
        );
        workloads
            .delete("six-in-slices", &Default::default())
            .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        kube_util::apply_yaml(&c, &workload("six-anywhere", 6, false), "e2e").await?;
        let ta = assignment("six-anywhere").await?;
        ensure!(
            decode_assignment(&ta).len() == 6,
            "without slices the six fit: {ta}"
        );
        eprintln!("    6 pods in slices of 2 stay pending (C split across leaves); without slices they fit");
        anyhow::Ok(())
    }
    .await;
    kueue.stop();
    result.map_err(|e| anyhow::anyhow!("{e:#}\n{}", kueue.log_tail(15)))
}

/// `--nvlink-clique-level`: the Kueue UltraServer Topology gets GPU Feature Discovery's NVLink
/// clique (`nvidia.com/gpu.clique`) under the capacity block, and the real Kueue places by it.
/// One UltraServer of four nodes under one leaf holds two cliques of two (an x72 running as two
/// x36; the clique labels set here as GPU Feature Discovery would). The Topology gets a name of
/// its own here (`--kueue-topology-ultraserver-name`): a Topology's levels are never changed in
/// place, and the suite's `aws-network-ultraserver` is held by Kueue's finalizer for its
/// ResourceFlavor.
/// Three pods requiring one clique stay pending though three requiring one capacity block are
/// admitted; two requiring one clique land inside one. The labeler goes back to the suite's
/// usual flags after.
pub(super) async fn kueue_places_gangs_inside_one_clique(env: &Env) -> anyhow::Result<()> {
    use e2e::schedulers::Kueue;
    const ULTRA: &str = "aws-clique-ultraserver";
    const BLOCK: &str = "ec2-topology-labeler.io/capacity-block-id";
    const CLIQUE: &str = "nvidia.com/gpu.clique";
    let c = env.admin().await?;
    let api = topology_api(&c);
    let with_clique: Vec<String> = (1..=3)
        .map(|i| format!("{L}{i}"))
        .chain([BLOCK.into(), CLIQUE.into(), "kubernetes.io/hostname".into()])
        .collect();
    e2e::env::restart_labeler_with(
        env,
        &[
            "--nvlink-clique-level=true",
            "--kueue-topology-ultraserver-name=aws-clique-ultraserver",
        ],
    )
    .await?;
    let result = async {
        let specs: Vec<NodeSpec> = (0..4)
            .map(|k| NodeSpec::ec2(0x171, k, "p6e-gb200-e2e.36xlarge"))
            .collect();
        let pairs: Vec<(NodeSpec, Instance)> = specs
            .iter()
            .map(|s| {
                let mut i = s.instance(&["nn-gqs", "nn-gqa", "nn-gq-l1"]);
                i.capacity_block_id = Some("cr-0e00000000000171e".into());
                (s.clone(), i)
            })
            .collect();
        label_and_wait(env, &c, &pairs).await?;
        let cliques = ["e2e-fabric-0171.1", "e2e-fabric-0171.2"];
        let host = |s: &NodeSpec| s.name.split('.').next().unwrap_or_default().to_string();
        let clique_of: BTreeMap<String, &str> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| (host(s), cliques[i / 2]))
            .collect();
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
        for (i, s) in specs.iter().enumerate() {
            nodes
                .patch(
                    &s.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {CLIQUE: cliques[i / 2]}}})),
                )
                .await?;
        }
        schedulable(&c, &specs).await?;
        eventually(
            &format!("Topology {ULTRA} with levels {with_clique:?}"),
            WAIT,
            || async {
                Ok(api
                    .get_opt(ULTRA)
                    .await?
                    .filter(|t| levels(t) == with_clique)
                    .map(|_| ()))
            },
        )
        .await?;
        let artifacts = e2e::schedulers::artifacts()?;
        let mut kueue = Kueue::start(
            &artifacts.join("kueue"),
            &env.cluster.admin_kubeconfig,
            &env.dir.join("kueue-clique"),
            &c,
        )
        .await?;
        kube_util::ensure_namespace(&c, "gb200q").await?;
        kube_util::apply_yaml(
            &c,
            &kueue_queue(
                "gb200q-e2e",
                "p6e-gb200-e2e.36xlarge",
                ULTRA,
                "gb200q",
                "gb200q",
            ),
            "e2e",
        )
        .await?;
        let workloads = kueue_workloads(&c, "gb200q");
        let workload = |name: &str, count: u32, level: &str| {
            kueue_workload(name, "gb200q", "gb200q", count, &format!("required: {level}"))
        };
        let placing = async {
            kube_util::apply_yaml(&c, &workload("three-in-a-clique", 3, CLIQUE), "e2e").await?;
            tokio::time::sleep(Duration::from_secs(10)).await;
            let w = workloads.get("three-in-a-clique").await?;
            ensure!(
                w.data["status"]["admission"].is_null(),
                "3 pods requiring one clique were admitted though each clique has 2 nodes: {}",
                w.data["status"]
            );
            workloads
                .delete("three-in-a-clique", &Default::default())
                .await?;
            kube_util::apply_yaml(&c, &workload("three-in-the-block", 3, BLOCK), "e2e").await?;
            let ta = kueue_assignment(&workloads, "three-in-the-block").await?;
            ensure!(
                decode_assignment(&ta).len() == 3,
                "3 pods requiring one capacity block fit its 4 nodes: {ta}"
            );
            workloads
                .delete("three-in-the-block", &Default::default())
                .await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            kube_util::apply_yaml(&c, &workload("two-in-a-clique", 2, CLIQUE), "e2e").await?;
            let ta = kueue_assignment(&workloads, "two-in-a-clique").await?;
            let hosts = decode_assignment(&ta);
            let of: std::collections::BTreeSet<&str> = hosts
                .iter()
                .map(|h| clique_of.get(h).copied().unwrap_or("(none)"))
                .collect();
            ensure!(
                hosts.len() == 2 && of.len() == 1 && !of.contains("(none)"),
                "2 pods requiring one clique land inside one: {of:?} {ta}"
            );
            workloads
                .delete("two-in-a-clique", &Default::default())
                .await?;
            eprintln!(
                "    Kueue: 3 pods requiring one clique pending, 3 requiring the capacity block admitted, 2 requiring one clique placed in {of:?}"
            );
            anyhow::Ok(())
        }
        .await;
        kueue.stop();
        placing.map_err(|e| anyhow::anyhow!("{e:#}\n{}", kueue.log_tail(15)))
    }
    .await;
    let restored = e2e::env::restart_labeler_with(env, &[]).await;
    result.and(restored)
}

/// `--uniform-depth=4`: one 4-level Kueue Topology covers a fleet of 3- and 4-layer nodes. A
/// 3-layer node gets its switch repeated as layer 4, so Kueue no longer leaves it out of TAS,
/// and a workload requiring one layer-4 domain lands under one switch on either kind of node.
pub(super) async fn kueue_one_topology_for_a_mixed_fleet(env: &Env) -> anyhow::Result<()> {
    const POOL: &str = "e2e.ec2-topology-labeler.io/pool";
    const UNIFORM: &str = "aws-network-uniform";
    let c = env.admin().await?;
    // Three 3-layer nodes under switch nn-u3, two 4-layer nodes under switch nn-u4; each fits
    // one pod of 100 CPUs.
    let three: Vec<NodeSpec> = (0..3)
        .map(|k| NodeSpec::ec2(0x115, k, "p5en-e2e.48xlarge"))
        .collect();
    let four: Vec<NodeSpec> = (3..5)
        .map(|k| NodeSpec::ec2(0x115, k, "p6-b200-e2e.48xlarge"))
        .collect();
    let mut pairs: Vec<(NodeSpec, Instance)> = three
        .iter()
        .map(|s| (s.clone(), s.instance(&["nn-us", "nn-ua", "nn-u3"])))
        .collect();
    pairs.extend(four.iter().map(|s| {
        (
            s.clone(),
            s.instance(&["nn-us", "nn-ua4", "nn-ub4", "nn-u4"]),
        )
    }));
    label_and_wait(env, &c, &pairs).await?;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    for (s, _) in &pairs {
        nodes
            .patch(
                &s.name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {POOL: "uniform"}}, "spec": {"taints": null}}),
                ),
            )
            .await?;
    }
    e2e::env::restart_labeler_with(
        env,
        &[
            "--uniform-depth=4",
            &format!("--kueue-topology-name={UNIFORM}"),
        ],
    )
    .await?;
    let result = async {
        for s in &three {
            wait_for_topology(
                &c,
                &s.name,
                &expected(&["nn-us", "nn-ua", "nn-u3", "nn-u3"], &[]),
                WAIT,
            )
            .await
            .context("a 3-layer node padded to 4 layers")?;
        }
        for s in &four {
            wait_for_topology(
                &c,
                &s.name,
                &expected(&["nn-us", "nn-ua4", "nn-ub4", "nn-u4"], &[]),
                WAIT,
            )
            .await?;
        }
        let topology = eventually("the uniform Topology", WAIT, || async {
            Ok(topology_api(&c).get_opt(UNIFORM).await?)
        })
        .await?;
        ensure!(
            levels(&topology)
                == [1, 2, 3, 4]
                    .map(|n| format!("{L}{n}"))
                    .into_iter()
                    .chain(["kubernetes.io/hostname".to_string()])
                    .collect::<Vec<_>>(),
            "levels of {UNIFORM}: {:?}",
            levels(&topology)
        );
        // Volcano: the padding is no tier of its own; switch nn-u3 selects its nodes by the
        // layer they now carry deepest.
        let hns = eventually("HyperNode nn-u3 selecting layer 4", WAIT, || async {
            let hns = hypernodes(&c).await?;
            let leaf = hns.get("ec2tl-t1-nn-u3").cloned();
            Ok(leaf
                .filter(|(_, m)| m.iter().any(|m| m.contains(&format!("{L}4"))))
                .map(|_| hns))
        })
        .await?;
        ensure!(
            !hns.contains_key("ec2tl-t2-nn-u3"),
            "the padded layer made a tier: {hns:?}"
        );
        uniform_depth_admissions(env, &c, &three, &four, UNIFORM, POOL).await
    }
    .await;
    // Back to the usual controller: the padding is a stale layer and goes.
    e2e::env::restart_labeler_with(env, &[]).await?;
    result?;
    for s in &three {
        wait_for_topology(
            &c,
            &s.name,
            &expected(&["nn-us", "nn-ua", "nn-u3"], &[]),
            WAIT,
        )
        .await
        .context("the padded layer removed once --uniform-depth is off")?;
    }
    eprintln!("    without --uniform-depth the padded layer 4 is removed from the 3-layer nodes");
    Ok(())
}

/// `--label-preset`: topograph's keys (tiers from the leaf at 0, the domain), then HyperPod's
/// (EKS's layers and `ultraserver-id`), each written by the controller against the real API
/// server, the previous preset's keys retired, and the Kueue Topology on the preset's keys; then
/// back to the default.
pub(super) async fn label_presets_rewrite_the_keys(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x11c, 1, "p6e-gb200.36xlarge");
    let mut i = s.instance(&["nn-ps", "nn-pa", "nn-pl"]);
    i.capacity_block_id = Some("cr-0c0ffee0c0ffee012".into());
    label_and_wait(env, &c, &[(s.clone(), i)]).await?;
    let labels_now = |want: Vec<(&'static str, &'static str)>, gone: Vec<&'static str>| {
        let c = c.clone();
        let name = s.name.clone();
        async move {
            let waited = eventually("the preset's labels", WAIT, || async {
                let n = node_now(&c, &name).await?;
                let have = n.metadata.labels.clone().unwrap_or_default();
                let right = want
                    .iter()
                    .all(|(k, v)| have.get(*k).map(String::as_str) == Some(*v))
                    && gone.iter().all(|k| !have.contains_key(*k));
                Ok(right.then_some(()))
            })
            .await;
            if waited.is_err() {
                let have = node_now(&c, &name).await?.metadata.labels;
                return waited.with_context(|| format!("the node's labels: {have:?}"));
            }
            waited
        }
    };
    let kueue_levels = |name: &'static str| {
        let c = c.clone();
        async move {
            let t = eventually("the preset's Kueue Topology", WAIT, || async {
                Ok(topology_api(&c).get_opt(name).await?)
            })
            .await?;
            anyhow::Ok(levels(&t))
        }
    };
    // As an operator switches: the chart upgraded (its admission policy then lets the
    // controller write the preset's keys and remove the others), the controller restarted.
    let chart_with = |preset: &str| -> anyhow::Result<()> {
        e2e::helm::upgrade_reusing(
            &env.cluster.admin_kubeconfig,
            &[format!("config.labelPreset={preset}")],
        )?;
        Ok(())
    };
    let result = async {
        chart_with("topograph")?;
        e2e::env::restart_labeler_with(
            env,
            &[
                "--label-preset=topograph",
                "--kueue-topology-name=aws-network-topograph",
            ],
        )
        .await?;
        labels_now(
            vec![
                ("fabric.topograph.run/tier-0", "nn-pl"),
                ("fabric.topograph.run/tier-1", "nn-pa"),
                ("fabric.topograph.run/tier-2", "nn-ps"),
                ("accelerator.topograph.run/domain", "cr-0c0ffee0c0ffee012"),
            ],
            vec![
                "topology.k8s.aws/network-node-layer-1",
                "ec2-topology-labeler.io/capacity-block-id",
                "fabric.topograph.run/tier-3",
            ],
        )
        .await
        .context("topograph's keys, EKS's retired")?;
        let have = kueue_levels("aws-network-topograph").await?;
        ensure!(
            have == [
                "fabric.topograph.run/tier-2",
                "fabric.topograph.run/tier-1",
                "fabric.topograph.run/tier-0",
                "kubernetes.io/hostname"
            ],
            "Kueue levels with --label-preset=topograph: {have:?}"
        );
        chart_with("hyperpod")?;
        e2e::env::restart_labeler_with(env, &["--label-preset=hyperpod"]).await?;
        labels_now(
            vec![
                ("topology.k8s.aws/network-node-layer-1", "nn-ps"),
                ("topology.k8s.aws/network-node-layer-3", "nn-pl"),
                ("topology.k8s.aws/ultraserver-id", "cr-0c0ffee0c0ffee012"),
            ],
            vec![
                "fabric.topograph.run/tier-0",
                "accelerator.topograph.run/domain",
                "ec2-topology-labeler.io/capacity-block-id",
            ],
        )
        .await
        .context("HyperPod's keys, topograph's retired")
    }
    .await;
    // Back to the defaults whatever happened above; the scenario's own error first.
    let restored = chart_with("eks");
    e2e::env::restart_labeler_with(env, &[]).await?;
    result?;
    restored?;
    labels_now(
        vec![(
            "ec2-topology-labeler.io/capacity-block-id",
            "cr-0c0ffee0c0ffee012",
        )],
        vec!["topology.k8s.aws/ultraserver-id"],
    )
    .await
    .context("back to the default preset")?;
    eprintln!(
        "    topograph's and HyperPod's keys written in turn, each previous preset's retired"
    );
    Ok(())
}

pub(super) async fn uniform_depth_admissions(
    env: &Env,
    c: &Client,
    three: &[NodeSpec],
    four: &[NodeSpec],
    topology: &str,
    pool: &str,
) -> anyhow::Result<()> {
    use e2e::schedulers::Kueue;
    let artifacts = e2e::schedulers::artifacts()?;
    let mut kueue = Kueue::start(
        &artifacts.join("kueue"),
        &env.cluster.admin_kubeconfig,
        &env.dir.join("kueue-uniform"),
        c,
    )
    .await?;
    kube_util::ensure_namespace(c, "ml").await?;
    let objects = format!(
        r#"
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {{ name: uniform }}
spec:
  nodeLabels: {{ {pool}: uniform }}
  topologyName: {topology}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {{ name: uniform }}
spec:
  namespaceSelector: {{}}
  resourceGroups:
    - coveredResources: ["cpu"]
      flavors:
        - name: uniform
          resources: [{{ name: cpu, nominalQuota: 1000 }}]
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {{ name: uniform, namespace: ml }}
spec: {{ clusterQueue: uniform }}
"#
    );
    kube_util::apply_yaml(c, &objects, "e2e").await?;
    let workload = |name: &str, count: u32| {
        kueue_workload(name, "ml", "uniform", count, &format!("required: {L}4"))
    };
    let workloads = kueue_workloads(c, "ml");
    let hosts_of = |specs: &[NodeSpec]| -> std::collections::BTreeSet<String> {
        specs
            .iter()
            .map(|s| s.name.split('.').next().unwrap_or_default().to_string())
            .collect()
    };
    let admitted = |name: &'static str| kueue_assignment(&workloads, name);
    let result = async {
        // Three pods under one switch: only the 3-layer switch has three nodes. Without the
        // padding Kueue would leave those nodes out of a 4-level Topology and never admit it.
        kube_util::apply_yaml(c, &workload("three-under-one-switch", 3), "e2e").await?;
        let ta = admitted("three-under-one-switch").await?;
        let hosts: std::collections::BTreeSet<String> =
            decode_assignment(&ta).into_iter().collect();
        ensure!(
            hosts == hosts_of(three),
            "3 pods on the 3-layer nodes under nn-u3: {hosts:?} ({ta})"
        );
        eprintln!(
            "    3 pods requiring one layer-4 domain admitted onto the 3-layer nodes: {hosts:?}"
        );
        // Two more: the 4-layer switch is the only domain with room left.
        kube_util::apply_yaml(c, &workload("two-under-one-switch", 2), "e2e").await?;
        let ta = admitted("two-under-one-switch").await?;
        let hosts: std::collections::BTreeSet<String> =
            decode_assignment(&ta).into_iter().collect();
        ensure!(
            hosts == hosts_of(four),
            "2 pods on the 4-layer nodes under nn-u4: {hosts:?} ({ta})"
        );
        eprintln!(
            "    2 pods requiring one layer-4 domain admitted onto the 4-layer nodes: {hosts:?}"
        );
        anyhow::Ok(())
    }
    .await;
    kueue.stop();
    result.map_err(|e| anyhow::anyhow!("{e:#}\n{}", kueue.log_tail(15)))
}

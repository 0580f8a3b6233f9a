//! `fit`: where a gang fits now, read from the nodes' allocatable and the pods bound to them,
//! against the real API server.

use std::time::Duration;

use anyhow::{Context, ensure};
use e2e::{env::Env, fixtures::NodeSpec, kube_util};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};

const LEVEL: &str = "e2e.example.com/fit-block";
const SELECTOR: &str = "e2e-fit=true";

/// A node of 8 GPUs in `block` (none: unlabelled), untainted (no pod but ours is bound here:
/// ours name their node), `cordoned` or not.
fn node(k: u32, block: Option<&str>, cordoned: bool) -> Node {
    let mut n = NodeSpec::ec2(0x1f00 + k, 1, "p5.48xlarge").node();
    let labels = n.metadata.labels.get_or_insert_with(Default::default);
    labels.insert("e2e-fit".into(), "true".into());
    if let Some(b) = block {
        labels.insert(LEVEL.into(), b.into());
    }
    if let Some(spec) = n.spec.as_mut() {
        spec.taints = None;
        spec.unschedulable = cordoned.then_some(true);
    }
    n
}

fn pod(name: &str, node: &str, gpus: u32) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": { "e2e-fit": "true" } },
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "w",
                "image": "registry.k8s.io/pause:3.10",
                "resources": { "requests": { "nvidia.com/gpu": gpus.to_string(), "cpu": "1" },
                               "limits": { "nvidia.com/gpu": gpus.to_string() } },
            }],
        },
    }))?)
}

/// Domains: `fa` two free nodes (16 GPUs), `fb` four nodes each half used by a bound pod (16
/// GPUs free, no node with 8), `fc` three free nodes and one cordoned; a node without the
/// label; a finished pod that holds nothing. A gang of two 8-GPU pods fits `fa` (none to
/// spare) before `fc` (one to spare); of three, only `fc`, with `fa` the nearest miss; of
/// four, none (exit status 1).
pub async fn fit_names_the_domains_that_take_the_gang(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let mut nodes = vec![node(0, Some("fa"), false), node(1, Some("fa"), false)];
    nodes.extend((2..6).map(|k| node(k, Some("fb"), false)));
    nodes.extend((6..9).map(|k| node(k, Some("fc"), false)));
    nodes.push(node(9, Some("fc"), true));
    nodes.push(node(10, None, false));
    let names: Vec<String> = nodes
        .iter()
        .map(|n| n.metadata.name.clone().unwrap_or_default())
        .collect();
    kube_util::create_nodes(&c, nodes).await?;
    // No controller-manager or kubelet here: clear the not-ready taint the API server puts on
    // new Nodes.
    let node_api: Api<Node> = Api::all(c.clone());
    for name in &names {
        node_api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"taints": null}})),
            )
            .await?;
    }
    // No controller-manager here to create a namespace's default ServiceAccount.
    kube_util::apply_yaml(
        &c,
        "apiVersion: v1\nkind: Namespace\nmetadata: { name: fit }\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: { name: default, namespace: fit }\n",
        "e2e",
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "fit");
    let result = async {
        for (i, node) in names[2..6].iter().enumerate() {
            pods.create(
                &PostParams::default(),
                &pod(&format!("fit-half-{i}"), node, 4)?,
            )
            .await?;
        }
        pods.create(&PostParams::default(), &pod("fit-done", &names[0], 8)?)
            .await?;
        pods.patch_status(
            "fit-done",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": { "phase": "Succeeded" } })),
        )
        .await?;
        let fit = |pods: &str, extra: &[&str]| {
            e2e::env::operator_cli(env)
                .args([
                    "fit",
                    "--pods",
                    pods,
                    "--requests",
                    "nvidia.com/gpu=8,cpu=1",
                ])
                .args(["--level", LEVEL])
                // Other scenarios' nodes share the cluster: this one's only.
                .args(["--node-selector", "e2e-fit=true"])
                .args(extra)
                .output()
        };
        let out = fit("2", &[])?;
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        ensure!(
            out.status.success()
                && lines.first().is_some_and(
                    |l| l.contains("2 domain(s) fit, 1 do not (1 node(s) without the label)")
                )
                && lines.get(1).is_some_and(
                    |l| l.starts_with("FITS  fa  takes 2 of 2 (0 to spare) on 2 of 2 node(s)")
                )
                && lines.get(2).is_some_and(
                    |l| l.starts_with("FITS  fc  takes 2 of 2 (1 to spare) on 3 of 4 node(s)")
                )
                && lines.get(3).is_some_and(|l| l
                    .starts_with("MISS  fb  takes 0 of 2 (short 2) on 0 of 4 node(s)  free cpu=")
                    && l.contains("nvidia.com/gpu=16")
                    && l.ends_with("runs out: nvidia.com/gpu on 4 node(s)")),
            "fit --pods 2: {:?}\n{text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("    fit --pods 2:\n{text}");
        let out = fit("3", &["-o", "json"])?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
        let fits: Vec<&str> = v["fits"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["name"].as_str())
            .collect();
        ensure!(
            out.status.success()
                && fits == ["fc"]
                && v["misses"][0]["name"] == "fa"
                && v["misses"][0]["short"] == 1
                && v["misses"][0]["takes"] == 2
                && v["level"] == LEVEL,
            "fit --pods 3 -o json: {v}"
        );
        let out = fit("4", &[])?;
        let said = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.code() == Some(1)
                && String::from_utf8_lossy(&out.stdout).contains("0 domain(s) fit, 3 do not")
                && said.contains("no domain at e2e.example.com/fit-block takes all 4 pod(s) now"),
            "fit --pods 4: {:?}\n{said}",
            out.status
        );
        // Bad input: a clear error before the cluster is read.
        let out = e2e::env::operator_cli(env)
            .args(["fit", "--pods", "2", "--requests", "nvidia.com/gpu=eight"])
            .args(["--level", LEVEL])
            .output()?;
        let said = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && said.contains("\"eight\" is not a Kubernetes quantity"),
            "a bad quantity: {said}"
        );
        anyhow::Ok(())
    }
    .await;
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default().labels(SELECTOR),
    )
    .await?;
    for name in &names {
        kube_util::delete_node(&c, name).await?;
    }
    result
}

/// What `fit --workload` says of a Workload's first pod set: whether a domain takes it, and the
/// text it printed.
fn fit_says(env: &Env, ns: &str, name: &str) -> anyhow::Result<(bool, serde_json::Value)> {
    let out = e2e::env::operator_cli(env)
        .args(["fit", "--workload", &format!("{ns}/{name}"), "-o", "json"])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
    let fits = v["podSets"][0]["fits"]
        .as_array()
        .is_some_and(|f| !f.is_empty());
    ensure!(
        out.status.success() == fits && v["podSets"][0]["flavor"] == "p5f-e2e",
        "fit --workload {ns}/{name}: {:?} with {v}",
        out.status
    );
    Ok((fits, v))
}

/// `fit --workload` against the real Kueue: on a mixed fleet (twelve nodes under four leaf
/// switches in two layer-2 domains, some partly used by pods Kueue does not manage), 24 random
/// gangs (1-6 pods of 40-190 CPUs, one layer-3 or one layer-2 domain required). Each is
/// created inactive, `fit` asked, then activated: what `fit` says fits, Kueue admits; what it
/// says does not, Kueue leaves pending, saying the topology does not fit it.
pub async fn fit_agrees_with_kueue(env: &Env) -> anyhow::Result<()> {
    use e2e::{kube_util::eventually, schedulers::Kueue};
    use kube::api::DynamicObject;
    const NS: &str = "fitq";
    let c = env.admin().await?;
    let artifacts = e2e::schedulers::artifacts()?;
    let mut kueue = Kueue::start(
        &artifacts.join("kueue"),
        &env.cluster.admin_kubeconfig,
        &env.dir.join("kueue-fit"),
        &c,
    )
    .await?;
    let leaves = [
        (0..4, "nn-fa1", "nn-fl1"),
        (4..7, "nn-fa1", "nn-fl2"),
        (7..10, "nn-fa2", "nn-fl3"),
        (10..12, "nn-fa2", "nn-fl4"),
    ];
    let specs: Vec<NodeSpec> = (0..12)
        .map(|k| NodeSpec::ec2(0x1e0, k, "p5f-e2e.48xlarge"))
        .collect();
    let pairs: Vec<_> = leaves
        .iter()
        .flat_map(|(range, agg, leaf)| {
            specs[range.clone()]
                .iter()
                .map(|s| (s.clone(), s.instance(&["nn-fs1", agg, leaf])))
        })
        .collect();
    e2e::env::label_and_wait(env, &c, &pairs).await?;
    let node_api: Api<Node> = Api::all(c.clone());
    for s in &specs {
        node_api
            .patch(
                &s.name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"taints": null}})),
            )
            .await?;
    }
    // CPUs already taken on each node (of 191.45) by pods Kueue does not manage.
    let busy = [0, 100, 0, 50, 100, 0, 150, 0, 0, 60, 100, 100];
    kube_util::apply_yaml(
        &c,
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{ name: {NS} }}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{ name: default, namespace: {NS} }}\n---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: ResourceFlavor\nmetadata: {{ name: p5f-e2e }}\nspec:\n  nodeLabels: {{ node.kubernetes.io/instance-type: p5f-e2e.48xlarge }}\n  topologyName: aws-network\n---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\nmetadata: {{ name: fit }}\nspec:\n  namespaceSelector: {{}}\n  resourceGroups:\n    - coveredResources: [\"cpu\"]\n      flavors:\n        - name: p5f-e2e\n          resources: [{{ name: cpu, nominalQuota: 100000 }}]\n---\napiVersion: kueue.x-k8s.io/v1beta2\nkind: LocalQueue\nmetadata: {{ name: fit, namespace: {NS} }}\nspec: {{ clusterQueue: fit }}\n"
        ),
        "e2e",
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(c.clone(), NS);
    for (s, cpu) in specs.iter().zip(busy) {
        if cpu > 0 {
            let mut p = pod(
                &format!("busy-{}", s.name.split('.').next().unwrap_or("n")),
                &s.name,
                0,
            )?;
            if let Some(spec) = p.spec.as_mut() {
                spec.containers[0].resources = serde_json::from_value(
                    serde_json::json!({"requests": {"cpu": cpu.to_string()}}),
                )?;
            }
            pods.create(&PostParams::default(), &p).await?;
        }
    }
    let wl_ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta2", "Workload"),
        "workloads",
    );
    let workloads: Api<DynamicObject> = Api::namespaced_with(c.clone(), NS, &wl_ar);
    let result = async {
        // Kueue counts those pods from its own watch: until it has them all, a probe that fits
        // only without them (7 pods of 100 CPUs under nn-fa1; 4 with them) is admitted.
        eventually(
            "Kueue counts the pods it does not manage",
            Duration::from_secs(60),
            || async {
                create_gang(&c, "probe", 7, 100, 2, true).await?;
                let (admitted, why) = decision(&workloads, "probe").await?;
                remove(&workloads, "probe").await?;
                Ok((!admitted && why.contains("fit only 4 out of 7")).then_some(()))
            },
        )
        .await?;
        let mut rng = fastrand::Rng::with_seed(0x0f17);
        let mut agreed = (0, 0);
        for i in 0..24 {
            let count = rng.u32(1..=6);
            let cpu = [40, 60, 90, 100, 150, 190][rng.usize(..6)];
            let layer = if rng.bool() { 3 } else { 2 };
            let name = format!("gang-{i}");
            create_gang(&c, &name, count, cpu, layer, false).await?;
            let (fits, said) = fit_says(env, NS, &name)?;
            workloads
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"spec": {"active": true}})),
                )
                .await?;
            let gang = format!("{name}: {count} x {cpu} CPUs in one layer-{layer} domain");
            let (admitted, why) = decision(&workloads, &name).await?;
            ensure!(
                admitted == fits,
                "{gang}: fit says {} but Kueue {} it ({why})\nfit: {said}",
                if fits { "it fits" } else { "it does not fit" },
                if admitted { "admitted" } else { "left pending" },
            );
            if !fits && agreed.1 == 0 {
                let table = e2e::env::operator_cli(env)
                    .args(["fit", "--workload", &format!("{NS}/{name}")])
                    .output()?;
                eprintln!(
                    "    fit --workload {NS}/{name}:\n{}",
                    String::from_utf8_lossy(&table.stdout)
                );
            }
            if !fits {
                // Kueue says how many of the pods its best domain takes; so does fit.
                let nearest = said["podSets"][0]["misses"][0]["takes"]
                    .as_u64()
                    .unwrap_or(0);
                ensure!(
                    why.contains(&format!("fit only {nearest} out of {count} pod(s)")),
                    "{gang}: fit's nearest miss takes {nearest}, Kueue says: {why}"
                );
            }
            eprintln!(
                "    {gang}: fit and Kueue agree: {}",
                if fits {
                    "admitted".to_string()
                } else {
                    format!("pending ({why})")
                }
            );
            if fits {
                agreed.0 += 1;
            } else {
                agreed.1 += 1;
            }
            remove(&workloads, &name).await?;
        }
        anyhow::Ok(agreed)
    }
    .await;
    kueue.stop();
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default(),
    )
    .await?;
    // The fleet goes too: later scenarios count nodes, HyperNodes and Topologies of their own.
    for s in &specs {
        kube_util::delete_node(&c, &s.name).await?;
    }
    let agreed = result?;
    ensure!(
        agreed.0 >= 5 && agreed.1 >= 5,
        "too one-sided to judge: {} admitted, {} pending",
        agreed.0,
        agreed.1
    );
    eprintln!(
        "    24 gangs: {} fit and admitted, {} did not fit and stayed pending",
        agreed.0, agreed.1
    );
    Ok(())
}

/// A Workload in `fitq` of `count` pods of `cpu` CPUs requiring one layer-`layer` domain.
async fn create_gang(
    c: &kube::Client,
    name: &str,
    count: u32,
    cpu: u32,
    layer: u32,
    active: bool,
) -> anyhow::Result<()> {
    let l = e2e::env::L;
    kube_util::apply_yaml(
        c,
        &format!(
            "apiVersion: kueue.x-k8s.io/v1beta2\nkind: Workload\nmetadata: {{ name: {name}, namespace: fitq }}\nspec:\n  active: {active}\n  queueName: fit\n  podSets:\n    - name: workers\n      count: {count}\n      topologyRequest:\n        required: {l}{layer}\n      template:\n        spec:\n          restartPolicy: Never\n          containers:\n            - name: w\n              image: registry.k8s.io/pause:3.10\n              resources: {{ requests: {{ cpu: \"{cpu}\" }} }}\n"
        ),
        "e2e",
    )
    .await
    .map(drop)
}

/// Kueue's decision on an active Workload: admitted (with its topology assignment), or left
/// pending with its reason.
async fn decision(
    workloads: &Api<kube::api::DynamicObject>,
    name: &str,
) -> anyhow::Result<(bool, String)> {
    kube_util::eventually(
        &format!("Kueue decides {name}"),
        Duration::from_secs(40),
        || async {
            let w = workloads.get(name).await?;
            let assignment =
                &w.data["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"];
            let pending = w.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "QuotaReserved" && c["status"] == "False")
                .and_then(|c| c["message"].as_str().map(str::to_string))
                // Kueue's verdict on the pod set, not a word left from before it was activated.
                .filter(|m| m.contains("couldn't assign flavors"));
            Ok(match (assignment.is_object(), pending) {
                (true, _) => Some((true, assignment.to_string())),
                (false, Some(m)) => Some((false, m)),
                // Undecided: its status, for the timeout's message.
                _ => anyhow::bail!("status: {}", w.data["status"]),
            })
        },
    )
    .await
}

/// Delete a Workload and wait until it is gone (Kueue has released what it held).
async fn remove(workloads: &Api<kube::api::DynamicObject>, name: &str) -> anyhow::Result<()> {
    workloads.delete(name, &Default::default()).await?;
    kube_util::eventually(&format!("{name} gone"), Duration::from_secs(30), || async {
        Ok(workloads.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

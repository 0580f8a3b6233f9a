//! `fit`: where a gang fits now, read from the nodes' allocatable and the pods bound to them,
//! against the real API server.

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

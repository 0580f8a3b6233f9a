//! What an operator applies and runs besides `helm install`: `deploy/` (plain manifests for
//! `kubectl apply -f deploy/`) and the `tree --min-labelled` check the chart's `helm test` runs.

use anyhow::{Context, ensure};
use e2e::{
    env::{Env, label_and_wait},
    fixtures::NodeSpec,
};
use kube::{
    Api, ResourceExt,
    api::{DynamicObject, GroupVersionKind, Patch, PatchParams},
    discovery,
};

/// Every file in `deploy/` is Kubernetes objects, the Namespace first, and the API server takes
/// each of them as `kubectl apply --server-side` would (a server-side dry run: validation, the
/// admission policy's CEL compiled, nothing stored).
pub async fn deploy_manifests_apply_cleanly(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let dir = e2e::repo_root().join("deploy");
    let mut files: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    ensure!(!files.is_empty(), "deploy/ is empty");
    let mut kinds = Vec::new();
    for file in &files {
        ensure!(
            file.extension().is_some_and(|e| e == "yaml"),
            "{} is not a manifest: deploy/ holds Kubernetes objects only",
            file.display()
        );
        let text = std::fs::read_to_string(file)?;
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)
            .with_context(|| format!("parsing {}", file.display()))?;
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            let obj: DynamicObject = serde_json::from_value(doc.clone())
                .with_context(|| format!("{}: not a Kubernetes object: {doc}", file.display()))?;
            let types = obj
                .types
                .clone()
                .context("an object without apiVersion/kind")?;
            let gvk = GroupVersionKind::try_from(&types)?;
            let (resource, caps) = discovery::pinned_kind(&c, &gvk)
                .await
                .with_context(|| format!("the API server does not serve {}", types.kind))?;
            let api: Api<DynamicObject> = match caps.scope {
                discovery::Scope::Namespaced => Api::namespaced_with(
                    c.clone(),
                    &obj.namespace()
                        .context("a namespaced object without a namespace")?,
                    &resource,
                ),
                discovery::Scope::Cluster => Api::all_with(c.clone(), &resource),
            };
            api.patch(
                &obj.name_any(),
                &PatchParams::apply("kubectl").force().dry_run(),
                &Patch::Apply(doc),
            )
            .await
            .with_context(|| format!("applying {} {}", types.kind, obj.name_any()))?;
            kinds.push(types.kind);
        }
    }
    ensure!(
        kinds.first().map(String::as_str) == Some("Namespace"),
        "the Namespace must come first (kubectl applies in order): {kinds:?}"
    );
    for want in [
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        ensure!(
            kinds.iter().any(|k| k == want),
            "no {want} in deploy/: {kinds:?}"
        );
    }
    ensure!(
        !kinds.iter().any(|k| k == "Pod"),
        "the helm test pod is not a manifest to apply: {kinds:?}"
    );
    eprintln!("    deploy/: {} objects accepted: {kinds:?}", kinds.len());
    Ok(())
}

/// `tree --min-labelled=N` (the chart's `helm test`) exits 0 when N nodes are labelled, 1 with
/// a sentence saying how many are when fewer, after printing the tree either way.
pub async fn tree_min_labelled_checks_the_labels(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let s = NodeSpec::ec2(0x1a1, 1, "p5.48xlarge");
    let inst = s.instance(&["nn-tree-spine", "nn-tree-agg", "nn-tree-leaf"]);
    let name = s.name.clone();
    label_and_wait(env, &c, &[(s, inst)]).await?;
    let tree = |min: &str| {
        std::process::Command::new(e2e::bin_dir().join("ec2-topology-labeler"))
            .args(["tree", &format!("--min-labelled={min}")])
            .env("KUBECONFIG", &env.cluster.admin_kubeconfig)
            .env("RUST_LOG", "error")
            .output()
    };
    let ok = tree("1")?;
    let printed = String::from_utf8_lossy(&ok.stdout);
    ensure!(
        ok.status.success() && printed.contains("nn-tree-leaf"),
        "tree --min-labelled=1: {:?}\n{printed}\n{}",
        ok.status,
        String::from_utf8_lossy(&ok.stderr)
    );
    // The pictures, from the same cluster: the network nodes nested, the node inside.
    for (format, opening) in [("dot", "digraph topology {"), ("mermaid", "flowchart TB")] {
        let out = std::process::Command::new(e2e::bin_dir().join("ec2-topology-labeler"))
            .args(["tree", "-o", format])
            .env("KUBECONFIG", &env.cluster.admin_kubeconfig)
            .env("RUST_LOG", "error")
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let at = |needle: &str| text.find(needle);
        ensure!(
            out.status.success()
                && text.contains(opening)
                && at("nn-tree-spine") < at("nn-tree-agg")
                && at("nn-tree-agg") < at("nn-tree-leaf")
                && at("nn-tree-leaf") < at(&name)
                && at("nn-tree-spine").is_some(),
            "tree -o {format}: {:?}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let short = tree("1000000")?;
    let said = String::from_utf8_lossy(&short.stderr);
    ensure!(
        short.status.code() == Some(1)
            && said.contains("carry complete topology labels")
            && String::from_utf8_lossy(&short.stdout).contains("nn-tree-leaf"),
        "tree --min-labelled=1000000: {:?}\n{said}",
        short.status
    );
    Ok(())
}

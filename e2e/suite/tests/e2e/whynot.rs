//! Why a node is not labelled, asked the way an operator asks: one Event per node when it falls
//! into a reason (never one per look), the `nodes{state, reason}` gauge, and `explain NODE`.

use std::collections::BTreeMap;

use anyhow::{Context, ensure};
use e2e::{
    cluster::NAMESPACE,
    env::{Env, RESYNC, WAIT},
    fixtures::NodeSpec,
    kube_util::{self, eventually},
    labeler::metric_sum,
};
use k8s_openapi::api::events::v1::Event;
use kube::{Api, Client};
use mock_ec2::Faults;

/// Events with `reason` about Node `node`.
async fn events(c: &Client, node: &str) -> anyhow::Result<BTreeMap<String, usize>> {
    let api: Api<Event> = Api::namespaced(c.clone(), "default");
    let mut by_reason = BTreeMap::new();
    for e in api.list(&Default::default()).await?.items {
        let about = e.regarding.as_ref().and_then(|r| r.name.as_deref());
        if about == Some(node) {
            *by_reason
                .entry(e.reason.unwrap_or_default())
                .or_insert(0usize) += e.series.map(|s| s.count.max(1) as usize).unwrap_or(1);
        }
    }
    Ok(by_reason)
}

async fn metrics(env: &Env) -> anyhow::Result<String> {
    let guard = env.labeler.lock().await;
    guard
        .as_ref()
        .context("a local controller")?
        .metrics()
        .await
}

async fn debug_addr(env: &Env) -> anyhow::Result<String> {
    let guard = env.labeler.lock().await;
    Ok(guard
        .as_ref()
        .context("a local controller")?
        .debug_addr
        .clone())
}

fn gauge(m: &str, state: &str, reason: &str) -> f64 {
    metric_sum(
        m,
        "ec2_topology_labeler_nodes",
        &[&format!("state=\"{state}\",reason=\"{reason}\"")],
    )
}

/// `explain NODE -o json` as an operator runs it next to the controller (its debug address on
/// loopback, the cluster's kubeconfig, EC2's endpoint).
fn explain(env: &Env, debug_addr: &str, node: &str) -> anyhow::Result<serde_json::Value> {
    let out = std::process::Command::new(e2e::bin_dir().join("ec2-topology-labeler"))
        .args(["explain", node, "-o", "json"])
        .arg(format!("--debug-addr={debug_addr}"))
        .args([
            "--leader-election=true",
            &format!("--leader-election-namespace={NAMESPACE}"),
        ])
        .env("KUBECONFIG", &env.cluster.admin_kubeconfig)
        .env("AWS_ENDPOINT_URL_EC2", &env.ec2_url)
        .env("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
        .env("AWS_SECRET_ACCESS_KEY", "e2e-not-a-secret")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("RUST_LOG", "warn")
        .output()?;
    ensure!(
        out.status.success(),
        "explain {node} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// Each reason a node is not labelled produces exactly one Event on it (however many times the
/// controller looks again), the matching `nodes{state, reason}` series, and an `explain` verdict
/// that names it; EC2 refusing our credentials too, until it stops.
pub async fn every_reason_says_why_once(env: &Env) -> anyhow::Result<()> {
    let c = env.admin().await?;
    let m0 = metrics(env).await?;
    let fargate = NodeSpec::ec2(0x130, 1, "p5.48xlarge").with_provider_id(
        "aws:///us-west-2a/0123456789abcdef0123456789abcdef/fargate-ip-10-9-2-3.us-west-2.compute.internal",
    );
    let hybrid = NodeSpec::ec2(0x130, 2, "p5.48xlarge")
        .with_provider_id("eks-hybrid:///us-west-2/my-cluster/mi-0123456789abcdef1");
    let empty = NodeSpec::ec2(0x130, 3, "p5.48xlarge").with_provider_id("");
    let malformed =
        NodeSpec::ec2(0x130, 4, "p5.48xlarge").with_provider_id("aws:///us-west-2a/i-NOTHEX");
    let unsupported = NodeSpec::ec2(0x130, 5, "m7i.large");
    let not_yet = NodeSpec::ec2(0x130, 6, "p5.48xlarge");
    let rejected = NodeSpec::ec2(0x130, 7, "p5.48xlarge");
    env.mock_admin.upsert(&unsupported.instance(&[])).await?;
    env.mock_admin
        .upsert(&not_yet.instance(&["nn-why-s", "nn-why-a", "nn-why-l"]))
        .await?;
    env.mock_admin
        .set_faults(&Faults {
            omit_instances: vec![not_yet.instance_id.clone()],
            not_found_instances: vec![rejected.instance_id.clone()],
            ..Faults::default()
        })
        .await?;
    // (node, Event reason, gauge state, gauge reason, words the verdict must have)
    let cases: Vec<(&NodeSpec, &str, &str, &str, &str)> = vec![
        (&fargate, "TopologySkipped", "skipped", "fargate", "Fargate"),
        (&hybrid, "TopologySkipped", "skipped", "hybrid", "Hybrid"),
        (
            &empty,
            "TopologySkipped",
            "skipped",
            "empty_provider_id",
            "providerID",
        ),
        (
            &malformed,
            "TopologySkipped",
            "skipped",
            "malformed_provider_id",
            "providerID",
        ),
        (
            &unsupported,
            "TopologyNotDescribed",
            "not_described",
            "unsupported_instance_type",
            "m7i.large",
        ),
        (
            &not_yet,
            "TopologyNotDescribed",
            "not_described",
            "not_described_yet",
            "Not labelled yet",
        ),
        (
            &rejected,
            "InstanceIdRejected",
            "rejected",
            "invalid_instance_id",
            "refuses the instance ID",
        ),
    ];
    let result = async {
        kube_util::create_nodes(&c, cases.iter().map(|(s, ..)| s.node()).collect()).await?;
        // Each node's Event, then several more looks (resyncs, not-described retries every 2 s).
        for (s, reason, ..) in &cases {
            eventually(&format!("{reason} Event on {}", s.name), WAIT, || async {
                Ok(events(&c, &s.name)
                    .await?
                    .contains_key(*reason)
                    .then_some(()))
            })
            .await?;
        }
        tokio::time::sleep(RESYNC * 3).await;
        let m1 = metrics(env).await?;
        let mut want: BTreeMap<(&str, &str), f64> = BTreeMap::new();
        for (_, _, state, why, _) in &cases {
            *want.entry((*state, *why)).or_default() += 1.0;
        }
        for ((state, why), n) in &want {
            let got = gauge(&m1, state, why) - gauge(&m0, state, why);
            ensure!(
                got == *n,
                "nodes{{state={state},reason={why}}} rose by {got}, want {n}"
            );
        }
        let addr = debug_addr(env).await?;
        for (s, reason, state, why, words) in &cases {
            let seen = events(&c, &s.name).await?;
            ensure!(
                seen.get(*reason) == Some(&1) && seen.len() == 1,
                "{}: exactly one {reason} Event, got {seen:?}",
                s.name
            );
            let e = explain(env, &addr, &s.name)?;
            let verdict = e["verdict"].as_str().unwrap_or_default();
            ensure!(
                verdict.contains(words),
                "{}: verdict {verdict:?} lacks {words:?}",
                s.name
            );
            let record = &e["controller"]["Ok"]["record"];
            ensure!(
                record["state"] == *state && record["reason"] == *why,
                "{}: explain shows the controller's state {record} (want {state}/{why})",
                s.name
            );
            eprintln!("    {}: {verdict}", s.name);
        }
        anyhow::Ok(())
    }
    .await;
    env.mock_admin.set_faults(&Faults::default()).await?;
    result?;

    // EC2 refuses our credentials: one Ec2AccessDenied on the node (and the leader's Pod would
    // get one too; here the controller runs outside a Pod), then labelled once EC2 answers.
    let denied = NodeSpec::ec2(0x130, 8, "p5.48xlarge");
    env.mock_admin
        .upsert(&denied.instance(&["nn-why-s", "nn-why-a", "nn-why-l2"]))
        .await?;
    env.mock_admin
        .set_faults(&Faults {
            unauthorized: true,
            ..Faults::default()
        })
        .await?;
    let result = async {
        kube_util::create_nodes(&c, vec![denied.node()]).await?;
        eventually("Ec2AccessDenied Event", WAIT, || async {
            Ok(events(&c, &denied.name)
                .await?
                .contains_key("Ec2AccessDenied")
                .then_some(()))
        })
        .await?;
        tokio::time::sleep(RESYNC * 2).await;
        let seen = events(&c, &denied.name).await?;
        ensure!(seen.get("Ec2AccessDenied") == Some(&1), "{seen:?}");
        let m = metrics(env).await?;
        ensure!(
            gauge(&m, "failing", "ec2_unauthorized") >= 1.0,
            "the failing gauge"
        );
        let e = explain(env, &debug_addr(env).await?, &denied.name)?;
        let verdict = e["verdict"].as_str().unwrap_or_default();
        ensure!(verdict.starts_with("Failing"), "{verdict}");
        eprintln!("    {}: {verdict}", denied.name);
        anyhow::Ok(())
    }
    .await;
    env.mock_admin.set_faults(&Faults::default()).await?;
    result?;
    eventually(
        "the denied node labelled once EC2 answers",
        WAIT * 2,
        || async {
            let labels = kube_util::topology_labels(&kube_util::labels(&c, &denied.name).await?);
            Ok((!labels.is_empty()).then_some(()))
        },
    )
    .await?;
    let mut all: Vec<&NodeSpec> = cases.iter().map(|(s, ..)| *s).collect();
    all.push(&denied);
    for s in all {
        kube_util::delete_node(&c, &s.name).await?;
    }
    Ok(())
}

/// GPU Feature Discovery's label for a node's NVLink clique (`<ClusterUUID>.<CliqueID>`).
const CLIQUE: &str = "nvidia.com/gpu.clique";

/// The capacity block against the NVLink cliques the GPUs report: an UltraServer of 4 nodes
/// whose GPUs say two cliques (an x72 split into two x36, as NVIDIA's topograph found) is
/// counted in `ultraserver_clique_mismatches{kind="block_holds_cliques"}`, told in one
/// `NvlinkCliqueMismatch` Event on each of its nodes, and named by `explain`; once the cliques
/// agree the count is 0 again and nothing more is told.
pub async fn nvlink_cliques_are_checked_against_ultraservers(env: &Env) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams};
    const KIND: &str = r#"kind="block_holds_cliques""#;
    const FAMILY: &str = "ec2_topology_labeler_ultraserver_clique_mismatches";
    let c = env.admin().await?;
    let block = "cr-0d00000000000160d";
    let specs: Vec<NodeSpec> = (1..=4)
        .map(|k| NodeSpec::ec2(0x160, k, "p6e-gb200.36xlarge"))
        .collect();
    let pairs: Vec<_> = specs
        .iter()
        .map(|s| {
            let mut i = s.instance(&["nn-ks", "nn-ka", "nn-kl"]);
            i.capacity_block_id = Some(block.into());
            (s.clone(), i)
        })
        .collect();
    e2e::env::label_and_wait(env, &c, &pairs).await?;
    let uuid = "3d0c6f52-0b8e-4c3b-9a51-6f4f0c2a9e11";
    let api: Api<Node> = Api::all(c.clone());
    let set_cliques = |of: fn(usize) -> usize| {
        let api = api.clone();
        let specs = specs.clone();
        async move {
            for (k, s) in specs.iter().enumerate() {
                let clique = format!("{uuid}.{}", of(k));
                api.patch(
                    &s.name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"labels": {CLIQUE: clique}}})),
                )
                .await?;
            }
            anyhow::Ok(())
        }
    };
    // Two nodes in clique 1, two in clique 2.
    set_cliques(|k| 1 + k / 2).await?;
    eventually("the split UltraServer counted", WAIT, || async {
        let m = metrics(env).await?;
        Ok((metric_sum(&m, FAMILY, &[KIND]) == 1.0).then_some(()))
    })
    .await?;
    for s in &specs {
        eventually(
            &format!("an NvlinkCliqueMismatch Event on {}", s.name),
            WAIT,
            || async {
                Ok(
                    (events(&c, &s.name).await?.get("NvlinkCliqueMismatch") == Some(&1))
                        .then_some(()),
                )
            },
        )
        .await?;
    }
    let addr = debug_addr(env).await?;
    let e = explain(env, &addr, &specs[0].name)?;
    let line = e["nvlink"].as_str().unwrap_or_default().to_string();
    ensure!(
        line.contains(&format!("capacity block {block}"))
            && line.contains("holds 2 NVLink cliques")
            && line.contains(&format!("{uuid}.1 (2 nodes, this node)"))
            && line.contains(&format!("{uuid}.2 (2 nodes)")),
        "explain: {line}"
    );
    // The fabric whole again: one clique.
    set_cliques(|_| 1).await?;
    eventually("no mismatch counted", WAIT, || async {
        let m = metrics(env).await?;
        Ok((metric_sum(&m, FAMILY, &[KIND]) == 0.0).then_some(()))
    })
    .await?;
    tokio::time::sleep(RESYNC).await;
    for s in &specs {
        let told = events(&c, &s.name).await?;
        ensure!(
            told.get("NvlinkCliqueMismatch") == Some(&1),
            "told once on {}: {told:?}",
            s.name
        );
    }
    let e = explain(env, &addr, &specs[0].name)?;
    let line = e["nvlink"].as_str().unwrap_or_default();
    ensure!(
        line == format!("capacity block {block} is NVLink clique {uuid}.1 (4 nodes)"),
        "explain once they agree: {line}"
    );
    eprintln!("    a split UltraServer: counted, told once on each of its 4 nodes, explained");
    Ok(())
}

/// Nodes 1, 2, … of `base` under the network nodes `path`, each in the capacity block given
/// (`p6e-gb200.36xlarge`) or in none (a type without one, `p5.48xlarge`: an UltraServer type
/// without its block is asked about again every resync, as one whose block comes late).
fn ultraserver_nodes<const N: usize>(
    base: u32,
    blocks: [Option<&str>; N],
    path: &[&str],
) -> Vec<(NodeSpec, mock_ec2::Instance)> {
    (1..)
        .zip(blocks)
        .map(|(k, block)| {
            let kind = if block.is_some() {
                "p6e-gb200.36xlarge"
            } else {
                "p5.48xlarge"
            };
            let s = NodeSpec::ec2(base, k, kind);
            let mut i = s.instance(path);
            i.capacity_block_id = block.map(str::to_string);
            (s, i)
        })
        .collect()
}

/// `--ultraserver-health` with its taint (issue 58 item 3): EC2 says one capacity block's
/// interconnect is impaired: exactly its nodes carry `UltraServerInterconnectImpaired=True` and
/// the `interconnect-impaired:NoSchedule` taint, the other block's node and a node in no block
/// carry nothing; EC2 failing then changes nothing, even once the block is healthy again; EC2
/// answering again turns the condition False and takes the taint off the same nodes.
pub async fn ultraserver_interconnect_health(env: &Env) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Node;
    const TYPE: &str = "UltraServerInterconnectImpaired";
    let c = env.admin().await?;
    let (sick, well) = ("cr-0d0000000000001c0", "cr-0d0000000000001c1");
    // Names, instances and network nodes of this scenario alone (others share the cluster);
    // the node in no block is of a type without one (an UltraServer type without its block is
    // asked about again every resync, as one whose block comes late).
    let pairs = ultraserver_nodes(
        0x1c0,
        [Some(sick), Some(sick), Some(well), None],
        &["nn-ics", "nn-ica", "nn-icl"],
    );
    e2e::env::label_and_wait(env, &c, &pairs).await?;
    let names: Vec<String> = pairs.iter().map(|(s, _)| s.name.clone()).collect();
    let block = |id: &str| e2e::fixtures::ultraserver_block(id, 18);
    env.mock_admin
        .set_capacity_blocks(&[block(sick), block(well)])
        .await?;
    env.mock_admin.set_interconnect(sick, "impaired").await?;
    let api: Api<Node> = Api::all(c.clone());
    // Each node's condition, as (status, reason); `None` without one.
    let conditions = || async {
        let mut out = Vec::new();
        for n in &names {
            let node = api.get(n).await?;
            out.push(
                node.status
                    .and_then(|s| s.conditions)
                    .into_iter()
                    .flatten()
                    .find(|c| c.type_ == TYPE)
                    .map(|c| (c.status, c.reason.unwrap_or_default())),
            );
        }
        anyhow::Ok(out)
    };
    // Whether each node carries the interconnect taint.
    let tainted = || async {
        let mut out = Vec::new();
        for n in &names {
            let node = api.get(n).await?;
            out.push(
                node.spec
                    .and_then(|s| s.taints)
                    .into_iter()
                    .flatten()
                    .any(|t| {
                        t.key == "ec2-topology-labeler.io/interconnect-impaired"
                            && t.effect == "NoSchedule"
                    }),
            );
        }
        anyhow::Ok(out)
    };
    let impaired = Some(("True".to_string(), "InterconnectImpaired".to_string()));
    let ok_again = Some(("False".to_string(), "InterconnectOk".to_string()));
    e2e::env::restart_labeler_with(
        env,
        &[
            "--ultraserver-health=true",
            "--ultraserver-health-interval=10s",
            "--ultraserver-health-taint=true",
        ],
    )
    .await?;
    // Rounds every 10 s, the first once the new leader has verified the nodes.
    let rounds = std::time::Duration::from_secs(60);
    let result = async {
        let want = vec![impaired.clone(), impaired.clone(), None, None];
        eventually("the impaired block's two nodes marked", rounds, || async {
            let now = conditions().await?;
            Ok((now == want).then_some(()))
        })
        .await?;
        eventually("the impaired block's two nodes tainted", rounds, || async {
            Ok((tainted().await? == [true, true, false, false]).then_some(()))
        })
        .await?;
        // Quiet at rest: two more rounds with nothing new from EC2 write nothing.
        let writes = |m: &str| {
            metric_sum(
                m,
                "ec2_topology_labeler_label_writes_total",
                &[r#"kind="interconnect""#],
            ) + metric_sum(m, "ec2_topology_labeler_label_writes_total", &[r#"kind="taint""#])
        };
        let before = writes(&metrics(env).await?);
        tokio::time::sleep(std::time::Duration::from_secs(25)).await;
        let after = writes(&metrics(env).await?);
        ensure!(
            before == after && before >= 4.0,
            "rounds with nothing new wrote: {before} -> {after} condition and taint writes"
        );
        let m = metrics(env).await?;
        ensure!(
            m.contains(&format!(
                "ec2_topology_labeler_ultraserver_interconnect{{capacity_block=\"{sick}\",status=\"impaired\"}} 1"
            )) && m.contains(&format!(
                "ec2_topology_labeler_ultraserver_interconnect{{capacity_block=\"{well}\",status=\"ok\"}} 1"
            )),
            "the interconnect gauges:\n{}",
            m.lines()
                .filter(|l| l.contains("interconnect"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        // EC2 failing: the block heals meanwhile, but nothing EC2 could not say changes.
        env.mock_admin
            .set_faults(&Faults {
                error_5xx_fraction: 1.0,
                ..Faults::default()
            })
            .await?;
        env.mock_admin.set_interconnect(sick, "ok").await?;
        eventually("two failed rounds counted", rounds, || async {
            let m = metrics(env).await?;
            Ok((metric_sum(
                &m,
                "ec2_topology_labeler_ultraserver_interconnect_polls_total",
                &[r#"outcome="failed""#],
            ) >= 2.0)
                .then_some(()))
        })
        .await?;
        ensure!(
            conditions().await? == want && tainted().await? == [true, true, false, false],
            "EC2 failing changed a condition or a taint: {:?} {:?}",
            conditions().await?,
            tainted().await?
        );
        // EC2 answers again: False on the same two nodes, still nothing on the others.
        env.mock_admin.set_faults(&Faults::default()).await?;
        let healed = vec![ok_again.clone(), ok_again.clone(), None, None];
        eventually("the healed block's nodes cleared", rounds, || async {
            Ok((conditions().await? == healed).then_some(()))
        })
        .await?;
        eventually("the healed block's nodes untainted", rounds, || async {
            Ok((tainted().await? == [false; 4]).then_some(()))
        })
        .await
    }
    .await;
    env.mock_admin.set_faults(&Faults::default()).await?;
    env.mock_admin.set_capacity_blocks(&[]).await?;
    e2e::env::restart_labeler_with(env, &[]).await?;
    // Whatever happened, this scenario's nodes (their UltraServers, taints and conditions) do
    // not outlive it.
    for n in &names {
        api.delete(n, &Default::default()).await?;
    }
    result
}

/// `--ultraserver-shape` (issue 58 item 4): each node of a capacity block EC2 describes carries
/// its UltraServer type and size as labels and its end as an annotation, a node in no block
/// nothing; rounds with nothing new write nothing; EC2 failing changes nothing, even once EC2's
/// answer changed; EC2 answering again brings the new size.
pub async fn ultraserver_shape_labels(env: &Env) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Node;
    const TYPE: &str = "ec2-topology-labeler.io/ultraserver-type";
    const SIZE: &str = "ec2-topology-labeler.io/capacity-block-size";
    const END: &str = "ec2-topology-labeler.io/capacity-block-end";
    let c = env.admin().await?;
    let (x72, trn) = ("cr-0d0000000000001d0", "cr-0d0000000000001d1");
    let pairs = ultraserver_nodes(
        0x1d0,
        [Some(x72), Some(x72), Some(trn), None],
        &["nn-shs", "nn-sha", "nn-shl"],
    );
    e2e::env::label_and_wait(env, &c, &pairs).await?;
    let names: Vec<String> = pairs.iter().map(|(s, _)| s.name.clone()).collect();
    let mut big = e2e::fixtures::ultraserver_block(x72, 18);
    big.end_date = Some("2026-12-31T11:30:00.000Z".into());
    let mut small = e2e::fixtures::ultraserver_block(trn, 4);
    small.ultraserver_type = Some("u-trn2x64".into());
    env.mock_admin
        .set_capacity_blocks(&[big.clone(), small.clone()])
        .await?;
    let api: Api<Node> = Api::all(c.clone());
    // Each node's (type, size, end), `None` where absent.
    type Shape = (Option<String>, Option<String>, Option<String>);
    let shapes = || async {
        let mut out: Vec<Shape> = Vec::new();
        for n in &names {
            let meta = api.get_metadata(n).await?.metadata;
            let label = |k: &str| meta.labels.as_ref().and_then(|l| l.get(k)).cloned();
            let end = meta.annotations.as_ref().and_then(|a| a.get(END)).cloned();
            out.push((label(TYPE), label(SIZE), end));
        }
        anyhow::Ok(out)
    };
    let some = |s: &str| Some(s.to_string());
    let x72_shape = (
        some("u-p6e-gb200x72"),
        some("18"),
        some("2026-12-31T11:30:00Z"),
    );
    let trn_shape = (some("u-trn2x64"), some("4"), None);
    let nothing: Shape = (None, None, None);
    e2e::env::restart_labeler_with(
        env,
        &[
            "--ultraserver-shape=true",
            "--ultraserver-shape-interval=10s",
        ],
    )
    .await?;
    let rounds = std::time::Duration::from_secs(60);
    let result = async {
        let want = vec![
            x72_shape.clone(),
            x72_shape.clone(),
            trn_shape.clone(),
            nothing.clone(),
        ];
        eventually("each block's nodes carry its shape", rounds, || async {
            let now = shapes().await?;
            Ok((now == want).then_some(()))
        })
        .await?;
        // Quiet at rest: two more rounds with nothing new from EC2 write nothing.
        let writes = |m: &str| {
            metric_sum(
                m,
                "ec2_topology_labeler_label_writes_total",
                &[r#"kind="shape""#],
            )
        };
        let before = writes(&metrics(env).await?);
        let asked = env.mock_admin.capacity_block_stats().await?.blocks_calls;
        tokio::time::sleep(std::time::Duration::from_secs(25)).await;
        let after = writes(&metrics(env).await?);
        let rounds_run = env.mock_admin.capacity_block_stats().await?.blocks_calls - asked;
        ensure!(
            rounds_run >= 2,
            "{rounds_run} rounds asked EC2 in 25 s (every 10 s): the quiet window proves nothing"
        );
        ensure!(
            before == after && before >= 3.0,
            "rounds with nothing new wrote: {before} -> {after} shape writes"
        );
        // EC2 failing: the block grows meanwhile, but nothing EC2 could not say changes.
        env.mock_admin
            .set_faults(&Faults {
                error_5xx_fraction: 1.0,
                ..Faults::default()
            })
            .await?;
        big.total_capacity = 9;
        env.mock_admin
            .set_capacity_blocks(&[big.clone(), small.clone()])
            .await?;
        let was = env.mock_admin.capacity_block_stats().await?;
        tokio::time::sleep(std::time::Duration::from_secs(25)).await;
        let now = env.mock_admin.capacity_block_stats().await?;
        ensure!(
            now.blocks_calls >= was.blocks_calls + 2 && now.failed >= was.failed + 2,
            "rounds in the fault window: {was:?} -> {now:?}"
        );
        ensure!(
            shapes().await? == want,
            "EC2 failing changed a shape: {:?}",
            shapes().await?
        );
        env.mock_admin.set_faults(&Faults::default()).await?;
        let mut nine = x72_shape.clone();
        nine.1 = some("9");
        let changed = vec![nine.clone(), nine, trn_shape.clone(), nothing.clone()];
        eventually("the new size once EC2 answers", rounds, || async {
            Ok((shapes().await? == changed).then_some(()))
        })
        .await
    }
    .await;
    env.mock_admin.set_faults(&Faults::default()).await?;
    env.mock_admin.set_capacity_blocks(&[]).await?;
    e2e::env::restart_labeler_with(env, &[]).await?;
    for n in &names {
        api.delete(n, &Default::default()).await?;
    }
    result
}

//! What `run` would do to each node, without writing anything: the library under the `plan`
//! command, which `explain` also asks about one node.
//!
//! Owns: a node's plan and its table. Never writes to the cluster.

use std::collections::BTreeMap;

use futures::future::join_all;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Api, api::ListParams};
use serde::Serialize;

use crate::{
    Result,
    labels::{LabelScheme, MapDiff},
    lookup::Lookup,
    node::watch::prune,
    node::{LiteNode, WireNode},
    reconcile::{
        Assessment, assess,
        gate::{Gate, INSTANCE_TYPE_LABEL, Standing},
    },
    topology::Ec2Error,
};

/// One node's line of the plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePlan {
    pub node: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// `up-to-date`, `change`, `skipped`, `not-described`, `invalid` or `error`.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "MapDiff::is_empty")]
    pub labels: MapDiff,
    #[serde(skip_serializing_if = "MapDiff::is_empty")]
    pub annotations: MapDiff,
    /// What would happen to the node's startup taint (`--startup-taint`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub startup_taint: Option<String>,
    /// The node's `TopologyLabeled` condition, and what it would become (`--node-condition`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub condition: Option<String>,
}

/// Plan every node. Lookups run concurrently so they share batched EC2 calls.
pub(crate) async fn plan_nodes(
    nodes: &[LiteNode],
    scheme: &LabelScheme,
    region: Option<&str>,
    lookup: &Lookup,
    gate: &Gate,
) -> Vec<NodePlan> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let now = &now;
    let plans = nodes.iter().map(|node| async move {
        let mut p = NodePlan {
            node: node.name_any(),
            instance_id: None,
            status: "error",
            reason: None,
            labels: MapDiff::default(),
            annotations: MapDiff::default(),
            startup_taint: None,
            condition: None,
        };
        let assessed = assess(node, scheme, region, lookup, false).await;
        let standing = match &assessed {
            Ok(Assessment::Skipped(reason)) => Some(Standing::Skipped(*reason)),
            Ok(Assessment::NotDescribed { .. }) => Some(Standing::NotDescribed {
                instance_type: node.label(INSTANCE_TYPE_LABEL),
            }),
            Ok(Assessment::Rejected { .. }) => Some(Standing::Rejected),
            Ok(Assessment::Invalid { .. }) => Some(Standing::Ec2Unavailable),
            // The planned write would leave the node labelled.
            Ok(Assessment::Ready { .. }) => Some(Standing::Labelled),
            Err(Ec2Error::Unauthorized { .. }) => Some(Standing::Unauthorized),
            Err(_) => Some(Standing::Ec2Unavailable),
        };
        if let Some(standing) = standing {
            (p.startup_taint, p.condition) = gate.preview(node, &standing, now);
        }
        match assessed {
            Ok(Assessment::Skipped(reason)) => {
                p.status = "skipped";
                p.reason = Some(reason.to_string());
            }
            Ok(Assessment::NotDescribed { instance_id, .. }) => {
                p.instance_id = Some(instance_id);
                p.status = "not-described";
                p.reason = Some(
                    "EC2 does not describe this instance (unsupported type or not running)".into(),
                );
            }
            Ok(Assessment::Rejected {
                instance_id, error, ..
            }) => {
                p.instance_id = Some(instance_id);
                p.status = "rejected";
                p.reason = Some(error.to_string());
            }
            Ok(Assessment::Invalid { instance_id, error }) => {
                p.instance_id = Some(instance_id);
                p.status = "invalid";
                p.reason = Some(error.to_string());
            }
            Ok(Assessment::Ready {
                instance_id,
                diff,
                refresh_error,
                ..
            }) => {
                p.instance_id = Some(instance_id);
                // Not the verification record: plan asks EC2 now, so the record's time always
                // differs from the node's; what plan shows is what the labels would become.
                let mut annotations = diff.annotations;
                let key = crate::verified::VERIFIED_KEY;
                annotations.add.remove(key);
                annotations.change.remove(key);
                annotations.remove.remove(key);
                p.status = if diff.labels.is_empty() && annotations.is_empty() {
                    "up-to-date"
                } else {
                    "change"
                };
                p.reason = refresh_error.map(|e| e.to_string());
                p.labels = diff.labels;
                p.annotations = annotations;
            }
            Err(e) => p.reason = Some(e.to_string()),
        }
        p
    });
    join_all(plans).await
}

/// Labels we wrote under an earlier configuration and no longer manage: `run` removes them at
/// start-up, so the plan shows them as removals.
pub(crate) fn add_retired(
    plans: &mut [NodePlan],
    retired: Vec<(kube::api::ObjectMeta, crate::reconcile::retire::Retired)>,
) {
    let by_node: BTreeMap<String, crate::reconcile::retire::Retired> = retired
        .into_iter()
        .filter_map(|(meta, r)| Some((meta.name?, r)))
        .collect();
    for p in plans.iter_mut() {
        let Some(r) = by_node.get(&p.node) else {
            continue;
        };
        p.labels.remove.extend(r.labels.clone());
        p.annotations.remove.extend(r.annotations.clone());
        let note = format!(
            "no longer configured (removed at start-up): {}",
            r.labels.keys().cloned().collect::<Vec<_>>().join(", ")
        );
        p.reason = Some(match p.reason.take() {
            Some(earlier) => format!("{earlier}; {note}"),
            None => note,
        });
        if p.status == "up-to-date" {
            p.status = "change";
        }
    }
}

/// Render the plan as an aligned table.
pub(crate) fn render_table(plans: &[NodePlan]) -> String {
    let mut rows: Vec<[String; 4]> = vec![[
        "NODE".into(),
        "INSTANCE".into(),
        "STATUS".into(),
        "CHANGES".into(),
    ]];
    for p in plans {
        let mut changes = p.labels.lines();
        let ann = p.annotations.add.len() + p.annotations.change.len() + p.annotations.remove.len();
        if ann > 0 {
            changes.push(format!("({ann} annotation change(s))"));
        }
        if changes.is_empty()
            && let Some(r) = &p.reason
        {
            changes.push(r.clone());
        }
        if let Some(t) = &p.startup_taint {
            changes.push(format!("[taint: {t}]"));
        }
        if let Some(c) = &p.condition {
            changes.push(format!("[condition: {c}]"));
        }
        rows.push([
            p.node.clone(),
            p.instance_id.clone().unwrap_or_else(|| "-".into()),
            p.status.to_string(),
            changes.join(" "),
        ]);
    }
    let mut widths = [0usize; 3];
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for [a, b, c, last] in &rows {
        for (w, cell) in widths.iter().zip([a, b, c]) {
            out.push_str(cell);
            out.push_str(&" ".repeat(w - cell.chars().count() + 2));
        }
        out.push_str(last.trim_end());
        out.push('\n');
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for p in plans {
        *counts.entry(p.status).or_default() += 1;
    }
    let summary: Vec<String> = counts.iter().map(|(s, n)| format!("{n} {s}")).collect();
    out.push_str(&format!(
        "\n{} nodes: {}\n",
        plans.len(),
        summary.join(", ")
    ));
    out
}

/// List every node, page by page, keeping only what planning needs.
pub(crate) async fn list_nodes(api: &Api<WireNode>, scheme: &LabelScheme) -> Result<Vec<LiteNode>> {
    let mut out = Vec::new();
    crate::client::pages::each_page(
        ListParams::default(),
        crate::client::pages::PAGE,
        |p| async move { api.list(&p).await },
        |items| {
            for node in items {
                let mut node = LiteNode::from(node);
                prune(&mut node, scheme);
                out.push(node);
            }
        },
    )
    .await?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shows_changes_and_reasons() {
        let mut change = NodePlan {
            node: "ip-10-0-0-1".into(),
            instance_id: Some("i-0123456789abcdef0".into()),
            status: "change",
            reason: None,
            labels: MapDiff::default(),
            annotations: MapDiff::default(),
            startup_taint: Some(
                "ec2-topology-labeler.io/topology-pending released (labelled)".into(),
            ),
            condition: None,
        };
        change.labels.add.insert(
            "topology.k8s.aws/network-node-layer-1".into(),
            "nn-a".into(),
        );
        change.labels.remove.insert(
            "topology.k8s.aws/network-node-layer-4".into(),
            "nn-d".into(),
        );
        let skipped = NodePlan {
            node: "fargate-ip-1".into(),
            instance_id: None,
            status: "skipped",
            reason: Some("fargate".into()),
            labels: MapDiff::default(),
            annotations: MapDiff::default(),
            startup_taint: None,
            condition: None,
        };
        let t = render_table(&[change, skipped]);
        assert!(
            t.contains("+topology.k8s.aws/network-node-layer-1=nn-a"),
            "{t}"
        );
        assert!(t.contains("-topology.k8s.aws/network-node-layer-4"));
        assert!(
            t.contains("[taint: ec2-topology-labeler.io/topology-pending released (labelled)]")
        );
        assert!(t.lines().any(|l| l.starts_with("fargate-ip-1")
            && l.contains("skipped")
            && l.ends_with("fargate")));
        assert!(t.contains("2 nodes: 1 change, 1 skipped"));
    }
}

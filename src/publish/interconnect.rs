//! UltraServer health (`--ultraserver-health`, off by default): every
//! `--ultraserver-health-interval`, the leader asks EC2 (`DescribeCapacityBlockStatus`, paced by
//! the limiter every EC2 call shares) about the accelerator interconnect of each capacity block
//! (UltraServer) a verified node is in, and keeps the `UltraServerInterconnectImpaired`
//! condition on the member nodes:
//!
//! - `impaired`: the condition is True (reason `InterconnectImpaired`) on each member;
//! - `ok`: a member whose condition is True gets it False (reason `InterconnectOk`); a member
//!   that never had one gets none (nothing is written on a healthy fleet);
//! - `insufficient-data`, a block EC2 leaves out of its answer, or EC2 unreachable, refusing or
//!   throttling: nothing changes on any node (what EC2 cannot tell is never taken for
//!   impaired, nor for healthy).
//!
//! Only nodes whose capacity block an EC2 answer vouches for are members (as for what is
//! published to schedulers: [`super::trusted`]). A node that leaves its block keeps its
//! condition as it was. The gauge `ultraserver_interconnect{capacity_block,status}` says what
//! EC2 last said of each block; `ultraserver_interconnect_polls{outcome}` counts the rounds.
//!
//! Owns: that condition. Never writes anything else; never acts unless this replica leads.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use clap::Args;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{
    FIELD_MANAGER,
    duration::HumanDuration,
    lookup::{capacity_blocks::Interconnect, ec2::AwsTopology},
    node::{INTERCONNECT_CONDITION_TYPE, LiteCondition},
    reconcile::Context,
    tree::NodeView,
};

/// UltraServer health, from EC2.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HealthArgs {
    /// Ask EC2 about the accelerator interconnect of each capacity block (UltraServer) a
    /// verified node is in, and keep the `UltraServerInterconnectImpaired` condition True on
    /// its nodes while EC2 says `impaired` (False once it says `ok`; `insufficient-data` and EC2
    /// unreachable change nothing). Leader only. Needs `ec2:DescribeCapacityBlockStatus`.
    #[arg(long, env = "LABELER_ULTRASERVER_HEALTH", default_value_t = false, action = clap::ArgAction::Set)]
    #[serde(default)]
    pub ultraserver_health: bool,
    /// How often the leader asks (a call per region for every 100 capacity blocks).
    #[arg(long, value_parser = crate::bounds::duration_flag("ultraserver-health-interval"), env = "LABELER_ULTRASERVER_HEALTH_INTERVAL", default_value = "1m")]
    pub ultraserver_health_interval: HumanDuration,
}

/// A node in a capacity block, as the round found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub block: String,
    /// Its region (`--region`, or its zone's); `None`: not asked about.
    pub region: Option<String>,
    /// Our condition on it now.
    pub condition: Option<LiteCondition>,
}

/// The condition a member should carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub impaired: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Wanted {
    fn status(&self) -> &'static str {
        if self.impaired { "True" } else { "False" }
    }

    /// The strategic-merge patch of the status subresource (the kubelet's conditions are left
    /// alone: merged by type); the transition time moves only when the status does.
    pub fn patch(&self, current: Option<&LiteCondition>, now: &Time) -> serde_json::Value {
        let transition = match current {
            Some(c) if c.status == self.status() => c
                .last_transition_time
                .clone()
                .unwrap_or_else(|| now.clone()),
            _ => now.clone(),
        };
        serde_json::json!({
            "status": {
                "conditions": [{
                    "type": INTERCONNECT_CONDITION_TYPE,
                    "status": self.status(),
                    "reason": self.reason,
                    "message": self.message,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": transition,
                }]
            }
        })
    }
}

/// What to write, by node: only where the condition must change (see the module's comment).
pub fn plan(
    members: &[Member],
    statuses: &BTreeMap<String, Interconnect>,
) -> Vec<(String, Wanted)> {
    let mut out = Vec::new();
    for m in members {
        let current = m.condition.as_ref();
        let wanted = match statuses.get(&m.block) {
            Some(Interconnect::Impaired) => Wanted {
                impaired: true,
                reason: "InterconnectImpaired",
                message: format!(
                    "EC2 says the accelerator interconnect of capacity block {} is impaired (DescribeCapacityBlockStatus)",
                    m.block
                ),
            },
            Some(Interconnect::Ok) if current.is_some_and(|c| c.status == "True") => Wanted {
                impaired: false,
                reason: "InterconnectOk",
                message: format!(
                    "EC2 says the accelerator interconnect of capacity block {} is ok",
                    m.block
                ),
            },
            _ => continue,
        };
        let same = current.is_some_and(|c| {
            c.status == wanted.status() && c.reason.as_deref() == Some(wanted.reason)
        });
        if !same {
            out.push((m.name.clone(), wanted));
        }
    }
    out
}

/// The members among `views` (the nodes EC2's answers vouch for), with their condition from the
/// node cache.
fn members(
    ctx: &Context,
    views: &[NodeView],
    cache: &[Arc<crate::node::CachedNode>],
) -> Vec<Member> {
    let Some(key) = ctx.scheme.capacity_block_key.as_deref() else {
        return Vec::new();
    };
    let mut out: Vec<Member> = views
        .iter()
        .filter_map(|v| {
            let block = v.labels.get(key)?;
            let region = ctx.region.clone().or_else(|| {
                v.labels
                    .get(crate::coverage::ZONE_LABEL)
                    .and_then(|z| crate::provider_id::region_of_zone(z))
            });
            Some(Member {
                name: v.name.clone(),
                block: block.clone(),
                region,
                condition: None,
            })
        })
        .collect();
    if out.is_empty() {
        return out;
    }
    let index: HashMap<&str, usize> = out
        .iter()
        .enumerate()
        .map(|(i, m)| (m.name.as_str(), i))
        .collect();
    let mut found: Vec<(usize, LiteCondition)> = Vec::new();
    for node in cache {
        if let (Some(i), Some(c)) = (index.get(node.name()), node.interconnect_condition()) {
            found.push((*i, c.clone()));
        }
    }
    for (i, c) in found {
        if let Some(m) = out.get_mut(i) {
            m.condition = Some(c);
        }
    }
    out
}

/// Every interval, while this replica leads and its cache is whole: ask, then write what must
/// change.
pub async fn run(
    reader: crate::store::NodeCache,
    ctx: Arc<Context>,
    synced: Arc<AtomicBool>,
    ec2: Arc<AwsTopology>,
    args: HealthArgs,
) {
    let mut tick = tokio::time::interval(args.ultraserver_health_interval.0);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !ctx.leader.is_leader() || !synced.load(Ordering::SeqCst) {
            continue;
        }
        let cache = reader.state();
        let selection = super::trusted::select(&ctx.scheme, cache.clone(), &ctx.records);
        let members = members(&ctx, &selection.views, &cache);
        drop(selection);
        let mut by_region: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for m in &members {
            if let Some(region) = &m.region {
                by_region.entry(region).or_default().insert(&m.block);
            }
        }
        let mut statuses: BTreeMap<String, Interconnect> = BTreeMap::new();
        let mut unasked: Vec<String> = Vec::new();
        let mut failed = false;
        for (region, blocks) in &by_region {
            let ids: Vec<String> = blocks.iter().map(|b| b.to_string()).collect();
            match ec2.interconnects(region, &ids).await {
                Ok(found) => statuses.extend(found),
                Err(e) => {
                    warn!(%region, error = %e, "cannot read the capacity blocks' interconnect status; no node's UltraServerInterconnectImpaired condition changes");
                    failed = true;
                    unasked.extend(ids);
                }
            }
        }
        if !by_region.is_empty() {
            ctx.metrics
                .interconnect_poll(if failed { "failed" } else { "ok" });
        }
        ctx.metrics.set_interconnects(
            statuses.iter().map(|(b, s)| (b.as_str(), s.as_str())),
            &unasked,
        );
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let conditions: HashMap<&str, Option<&LiteCondition>> = members
            .iter()
            .map(|m| (m.name.as_str(), m.condition.as_ref()))
            .collect();
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        for (node, wanted) in plan(&members, &statuses) {
            if !ctx.leader.is_leader() {
                break;
            }
            let body = wanted.patch(conditions.get(node.as_str()).copied().flatten(), &now);
            match ctx
                .api
                .patch_status(&node, &params, &Patch::Strategic(body))
                .await
            {
                Ok(_) => {
                    ctx.metrics.label_write("interconnect");
                    info!(%node, impaired = wanted.impaired, reason = wanted.reason, "{}", wanted.message);
                }
                Err(e) => {
                    warn!(%node, error = %e, "cannot write the node's UltraServerInterconnectImpaired condition; tried again next round")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, block: &str, condition: Option<(&str, &str)>) -> Member {
        Member {
            name: name.into(),
            block: block.into(),
            region: Some("us-east-1".into()),
            condition: condition.map(|(status, reason)| LiteCondition {
                type_: INTERCONNECT_CONDITION_TYPE.into(),
                status: status.into(),
                reason: Some(reason.into()),
                ..LiteCondition::default()
            }),
        }
    }

    fn names(p: &[(String, Wanted)]) -> Vec<(&str, bool)> {
        p.iter().map(|(n, w)| (n.as_str(), w.impaired)).collect()
    }

    #[test]
    fn impaired_marks_exactly_the_members_of_that_block() {
        let members = [
            member("a1", "cr-a", None),
            member("a2", "cr-a", Some(("True", "InterconnectImpaired"))),
            member("b1", "cr-b", None),
        ];
        let statuses = BTreeMap::from([
            ("cr-a".to_string(), Interconnect::Impaired),
            ("cr-b".to_string(), Interconnect::Ok),
        ]);
        // a2 already says so: nothing to write; b1 is healthy and never had one.
        assert_eq!(names(&plan(&members, &statuses)), [("a1", true)]);
    }

    #[test]
    fn ok_clears_only_a_condition_that_is_true() {
        let members = [
            member("a1", "cr-a", Some(("True", "InterconnectImpaired"))),
            member("a2", "cr-a", Some(("False", "InterconnectOk"))),
            member("a3", "cr-a", None),
        ];
        let statuses = BTreeMap::from([("cr-a".to_string(), Interconnect::Ok)]);
        assert_eq!(names(&plan(&members, &statuses)), [("a1", false)]);
    }

    #[test]
    fn insufficient_data_and_a_block_ec2_left_out_change_nothing() {
        let members = [
            member("a1", "cr-a", Some(("True", "InterconnectImpaired"))),
            member("b1", "cr-b", None),
            member("c1", "cr-unknown", Some(("True", "InterconnectImpaired"))),
        ];
        let statuses = BTreeMap::from([
            ("cr-a".to_string(), Interconnect::InsufficientData),
            ("cr-b".to_string(), Interconnect::InsufficientData),
        ]);
        assert!(plan(&members, &statuses).is_empty());
        // EC2 unreachable: no statuses at all.
        assert!(plan(&members, &BTreeMap::new()).is_empty());
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let then = Time(
            "2026-01-01T00:00:00Z"
                .parse()
                .unwrap_or_else(|e| panic!("a timestamp: {e}")),
        );
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let wanted = Wanted {
            impaired: true,
            reason: "InterconnectImpaired",
            message: "m".into(),
        };
        let was = |status: &str| LiteCondition {
            type_: INTERCONNECT_CONDITION_TYPE.into(),
            status: status.into(),
            reason: Some("Other".into()),
            last_transition_time: Some(then.clone()),
            ..LiteCondition::default()
        };
        let at = |c: &LiteCondition| {
            wanted.patch(Some(c), &now)["status"]["conditions"][0]["lastTransitionTime"].clone()
        };
        assert_eq!(at(&was("True")), serde_json::json!(then));
        assert_eq!(at(&was("False")), serde_json::json!(now));
        let body = wanted.patch(None, &now);
        let c = &body["status"]["conditions"][0];
        assert_eq!(c["type"], INTERCONNECT_CONDITION_TYPE);
        assert_eq!(c["status"], "True");
    }
}

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
//! With `--ultraserver-health-taint`, the members of an impaired block also carry the taint
//! [`TAINT`] (`NoSchedule`), removed once EC2 says `ok`: Kueue (`TASReplaceNodeOnNodeTaints`)
//! replaces a tainted node in a running gang, and no new pod lands there. Never on
//! `insufficient-data` or when EC2 cannot be asked.
//!
//! Only nodes whose capacity block an EC2 answer vouches for are members (as for what is
//! published to schedulers: [`super::trusted`]). A node that leaves its block keeps its
//! condition as it was. The gauge `ultraserver_interconnect{capacity_block,status}` says what
//! EC2 last said of each block; `ultraserver_interconnect_polls{outcome}` counts the rounds.
//!
//! Owns: that condition and that taint. Never writes anything else; never acts unless this
//! replica leads.

use crate::bounds::{Bound, secs};
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
    reconcile::gate::StartupTaint,
    tree::NodeView,
};

/// `--ultraserver-health-interval`'s range.
pub(crate) const ULTRASERVER_HEALTH_INTERVAL_RANGE: Bound =
    Bound::duration("ultraserver-health-interval", secs(10), secs(3600));

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
    pub(crate) ultraserver_health: bool,
    /// How often the leader asks (a call per region for every 100 capacity blocks).
    #[arg(long, value_parser = ULTRASERVER_HEALTH_INTERVAL_RANGE.durations(), env = "LABELER_ULTRASERVER_HEALTH_INTERVAL", default_value = "1m")]
    pub(crate) ultraserver_health_interval: HumanDuration,
    /// Also taint the nodes of an impaired capacity block
    /// `ec2-topology-labeler.io/interconnect-impaired:NoSchedule` (removed once EC2 says `ok`),
    /// so that no new pod lands there and Kueue replaces them in running gangs
    /// (`TASReplaceNodeOnNodeTaints`). Needs `--ultraserver-health`.
    #[arg(long, env = "LABELER_ULTRASERVER_HEALTH_TAINT", default_value_t = false, action = clap::ArgAction::Set)]
    #[serde(default)]
    pub(crate) ultraserver_health_taint: bool,
}

/// The taint of `--ultraserver-health-taint`.
pub const TAINT: &str = "ec2-topology-labeler.io/interconnect-impaired:NoSchedule";

/// Our taint, parsed.
pub fn taint() -> StartupTaint {
    StartupTaint {
        key: "ec2-topology-labeler.io/interconnect-impaired".into(),
        value: None,
        effect: "NoSchedule".into(),
    }
}

impl HealthArgs {
    /// Combinations refused at start.
    pub fn check(&self) -> Result<(), String> {
        if self.ultraserver_health_taint && !self.ultraserver_health {
            return Err("--ultraserver-health-taint needs --ultraserver-health".into());
        }
        Ok(())
    }
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
    /// It carries [`TAINT`] now.
    pub tainted: bool,
}

/// What to change on one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub node: String,
    /// The condition to write; `None`: it stands.
    pub condition: Option<Wanted>,
    /// Add (`true`) or remove (`false`) [`TAINT`]; `None`: leave it.
    pub taint: Option<bool>,
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
        LiteCondition::patch(
            INTERCONNECT_CONDITION_TYPE,
            self.impaired,
            self.reason,
            &self.message,
            current,
            now,
        )
    }
}

/// What to write, by node: only where the condition (or, with `taint`, the taint) must change
/// (see the module's comment).
pub fn plan(
    members: &[Member],
    statuses: &BTreeMap<String, Interconnect>,
    taint: bool,
) -> Vec<Change> {
    let mut out = Vec::new();
    for m in members {
        let current = m.condition.as_ref();
        let (wanted, tainted) = match statuses.get(&m.block) {
            Some(Interconnect::Impaired) => (
                Some(Wanted {
                    impaired: true,
                    reason: "InterconnectImpaired",
                    message: format!(
                        "EC2 says the accelerator interconnect of capacity block {} is impaired (DescribeCapacityBlockStatus)",
                        m.block
                    ),
                }),
                true,
            ),
            Some(Interconnect::Ok) => (
                current.is_some_and(|c| c.status == "True").then(|| Wanted {
                    impaired: false,
                    reason: "InterconnectOk",
                    message: format!(
                        "EC2 says the accelerator interconnect of capacity block {} is ok",
                        m.block
                    ),
                }),
                false,
            ),
            _ => continue,
        };
        let condition = wanted.filter(|w| {
            !current
                .is_some_and(|c| c.status == w.status() && c.reason.as_deref() == Some(w.reason))
        });
        let taint = (taint && m.tainted != tainted).then_some(tainted);
        if condition.is_some() || taint.is_some() {
            out.push(Change {
                node: m.name.clone(),
                condition,
                taint,
            });
        }
    }
    out
}

/// The members among `views` (the nodes EC2's answers vouch for), with their condition from the
/// node cache.
pub(crate) fn members(
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
                tainted: false,
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
    let ours = taint();
    let mut found: Vec<(usize, Option<LiteCondition>, bool, Option<String>)> = Vec::new();
    for node in cache {
        if let Some(i) = index.get(node.name()) {
            let tainted = node.taints().iter().any(|t| ours.matches(t));
            // No zone label: the zone in the providerID, as the lookup takes it.
            let region = crate::provider_id::parse(node.provider_id())
                .ok()
                .and_then(|r| r.zone)
                .and_then(|z| crate::provider_id::region_of_zone(&z));
            found.push((*i, node.interconnect_condition().cloned(), tainted, region));
        }
    }
    for (i, c, tainted, region) in found {
        if let Some(m) = out.get_mut(i) {
            m.condition = c;
            m.tainted = tainted;
            if m.region.is_none() {
                m.region = region;
            }
        }
    }
    let nowhere = out.iter().filter(|m| m.region.is_none()).count();
    if nowhere > 0 {
        warn!(
            nodes = nowhere,
            "UltraServer members without a region (no --region, no zone label, no zone in the providerID): their capacity blocks are not asked about"
        );
    }
    out
}

/// Every interval, while this replica leads and its cache is whole: ask, then write what must
/// change.
pub async fn run(
    reader: crate::node::store::NodeCache,
    ctx: Arc<Context>,
    synced: Arc<AtomicBool>,
    ec2: Arc<AwsTopology>,
    args: HealthArgs,
) {
    let mut tick = tokio::time::interval(args.ultraserver_health_interval.0);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !ctx.leader.is_leader() {
            // Only the leader says what EC2 says: a former leader's gauges would keep an alert
            // firing after the block healed.
            ctx.metrics.set_interconnects([], &[]);
            continue;
        }
        if !synced.load(Ordering::SeqCst) {
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
            let found = ec2.interconnects(region, &ids).await;
            statuses.extend(found.statuses);
            for (ids, e) in found.failed {
                warn!(%region, blocks = ids.len(), error = %e, "cannot read these capacity blocks' interconnect status; their nodes' UltraServerInterconnectImpaired condition does not change");
                failed = true;
                unasked.extend(ids);
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
        for change in plan(&members, &statuses, args.ultraserver_health_taint) {
            if !ctx.leader.is_leader() {
                break;
            }
            let node = change.node.as_str();
            if let Some(wanted) = &change.condition {
                let body = wanted.patch(conditions.get(node).copied().flatten(), &now);
                match ctx
                    .api
                    .patch_status(node, &params, &Patch::Strategic(body))
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
            if let Some(on) = change.taint {
                match crate::reconcile::write::set_taint(&ctx.api, node, &taint(), on, &ctx.leader)
                    .await
                {
                    Ok(true) => {
                        ctx.metrics.label_write("taint");
                        info!(%node, taint = TAINT, added = on, "the interconnect taint {}", if on { "added" } else { "removed" });
                    }
                    Ok(false) => {}
                    Err(e) => {
                        warn!(%node, error = %e, "cannot change the node's interconnect taint; tried again next round")
                    }
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
            tainted: false,
            condition: condition.map(|(status, reason)| LiteCondition {
                type_: INTERCONNECT_CONDITION_TYPE.into(),
                status: status.into(),
                reason: Some(reason.into()),
                ..LiteCondition::default()
            }),
        }
    }

    /// The condition changes (node, impaired).
    fn names(p: &[Change]) -> Vec<(&str, bool)> {
        p.iter()
            .filter_map(|c| Some((c.node.as_str(), c.condition.as_ref()?.impaired)))
            .collect()
    }

    /// The taint changes (node, added).
    fn taints(p: &[Change]) -> Vec<(&str, bool)> {
        p.iter()
            .filter_map(|c| Some((c.node.as_str(), c.taint?)))
            .collect()
    }

    #[test]
    fn the_taint_follows_impaired_and_ok_only_when_asked_for() {
        let tainted = |mut m: Member| {
            m.tainted = true;
            m
        };
        let members = [
            member("a1", "cr-a", Some(("True", "InterconnectImpaired"))),
            tainted(member("a2", "cr-a", Some(("True", "InterconnectImpaired")))),
            tainted(member("b1", "cr-b", Some(("False", "InterconnectOk")))),
            tainted(member("c1", "cr-c", Some(("True", "InterconnectImpaired")))),
        ];
        let statuses = BTreeMap::from([
            ("cr-a".to_string(), Interconnect::Impaired),
            ("cr-b".to_string(), Interconnect::Ok),
            ("cr-c".to_string(), Interconnect::InsufficientData),
        ]);
        let p = plan(&members, &statuses, true);
        // a1 gains it, a2 keeps it, b1 loses it (its condition already False), c1 unknown: kept.
        assert_eq!(taints(&p), [("a1", true), ("b1", false)]);
        assert!(names(&p).is_empty(), "no condition changes: {p:?}");
        // Without the taint option, never touched.
        assert!(plan(&members, &statuses, false).is_empty());
    }

    #[test]
    fn the_taint_needs_the_health_check() {
        let args = |health, taint| HealthArgs {
            ultraserver_health: health,
            ultraserver_health_interval: HumanDuration(std::time::Duration::from_secs(60)),
            ultraserver_health_taint: taint,
        };
        assert!(args(false, true).check().is_err());
        assert!(args(true, true).check().is_ok());
        assert!(args(false, false).check().is_ok());
        assert_eq!(taint().to_string(), TAINT);
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
        assert_eq!(names(&plan(&members, &statuses, false)), [("a1", true)]);
    }

    #[test]
    fn ok_clears_only_a_condition_that_is_true() {
        let members = [
            member("a1", "cr-a", Some(("True", "InterconnectImpaired"))),
            member("a2", "cr-a", Some(("False", "InterconnectOk"))),
            member("a3", "cr-a", None),
        ];
        let statuses = BTreeMap::from([("cr-a".to_string(), Interconnect::Ok)]);
        assert_eq!(names(&plan(&members, &statuses, false)), [("a1", false)]);
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
        assert!(plan(&members, &statuses, true).is_empty());
        // EC2 unreachable: no statuses at all.
        assert!(plan(&members, &BTreeMap::new(), true).is_empty());
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

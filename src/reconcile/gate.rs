//! The startup gate: a startup taint we release once a node's topology is known, and the
//! `TopologyLabeled` condition that says where the node stands.
//!
//! The node's provisioner adds the taint (Karpenter `startupTaints`, a managed node group
//! taint, kubelet `--register-with-taints`); we only ever remove it: when the node's labels
//! are written and the API server holds them, when the node is one we cannot label (by
//! policy), or when the operator's timeout has passed.
//!
//! Owns: what to do with a node's startup taint and condition, given where the node stands.
//! Pure but for the clock [`Gate::timeout_in`] reads: never does I/O (the writes are in
//! [`super::write`]).

use crate::bounds::{Bound, DAY, secs};
use std::{fmt, str::FromStr, time::Duration};

use clap::{Args, ValueEnum};
use k8s_openapi::{api::core::v1::Taint, apimachinery::pkg::apis::meta::v1::Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    duration::HumanDuration,
    node::{CONDITION_TYPE, LiteNode},
    provider_id::SkipReason,
    topology::is_topology_type,
};

/// The shape [`StartupTaint`]'s parser accepts, for the chart's schema (a test checks the two
/// agree): a qualified name, an optional label value, one of the three effects. (The prefix's
/// 253-character limit is left to the parser.)
pub(crate) const TAINT_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?(=[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?:(NoSchedule|PreferNoSchedule|NoExecute)$";

/// The startup taint, one definition for every command that reads it: `run` releases it,
/// `tree` and `uninstall` point out the nodes still carrying it.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct StartupTaintFlag {
    /// A startup taint (`KEY[=VALUE]:EFFECT`, for example
    /// `ec2-topology-labeler.io/topology-pending:NoSchedule`) that the node's provisioner adds
    /// and the controller removes once the node's topology labels are written. Matched by key
    /// and effect. Off when unset (`tree` then points out nodes carrying that example, the
    /// chart's taint).
    #[arg(long, env = "LABELER_STARTUP_TAINT")]
    #[schemars(with = "Option<String>", regex(pattern = TAINT_PATTERN))]
    pub startup_taint: Option<StartupTaint>,
}

/// The taint `tree` points out when none is given: the chart's.
pub(crate) const CHART_TAINT: &str = "ec2-topology-labeler.io/topology-pending:NoSchedule";

/// `--startup-taint-timeout`'s range.
pub(crate) const STARTUP_TAINT_TIMEOUT_RANGE: Bound =
    Bound::duration("startup-taint-timeout", secs(1), secs(30 * DAY));

/// Holding new nodes back until their topology is known.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GateArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub taint: StartupTaintFlag,
    /// What to do with the startup taint of a node we cannot label (an instance type EC2 does
    /// not describe, a non-EC2 node, a providerID we skip): release it (with an Event saying
    /// why) or keep it (until the timeout, if one is set).
    #[arg(
        long,
        env = "LABELER_STARTUP_TAINT_WHEN_UNSUPPORTED",
        value_enum,
        default_value_t
    )]
    #[serde(default)]
    pub(crate) startup_taint_when_unsupported: WhenUnsupported,
    /// Release the startup taint anyway this long after the node was created, with a Warning
    /// Event, so that an EC2 outage never strands capacity. No timeout when unset.
    #[arg(long, value_parser = STARTUP_TAINT_TIMEOUT_RANGE.durations(), env = "LABELER_STARTUP_TAINT_TIMEOUT")]
    pub(crate) startup_taint_timeout: Option<HumanDuration>,
    /// Keep a `TopologyLabeled` condition on every node (status subresource; needs RBAC for
    /// `nodes/status` patch, which the chart always grants: without this flag the condition is
    /// removed at start-up).
    #[arg(long, env = "LABELER_NODE_CONDITION", default_value_t = false, action = clap::ArgAction::Set)]
    #[serde(default)]
    pub(crate) node_condition: bool,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum WhenUnsupported {
    #[default]
    Release,
    Keep,
}

/// A taint as given on the command line: `KEY[=VALUE]:EFFECT`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct StartupTaint {
    pub key: String,
    pub value: Option<String>,
    pub effect: String,
}

const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

impl FromStr for StartupTaint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kv, effect) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("startup taint {s:?}: expected KEY[=VALUE]:EFFECT"))?;
        if !EFFECTS.contains(&effect) {
            return Err(format!(
                "startup taint {s:?}: effect must be one of {}",
                EFFECTS.join(", ")
            ));
        }
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (kv, None),
        };
        if !crate::labels::is_valid_label_key(key) {
            return Err(format!(
                "startup taint {s:?}: {key:?} is not a valid key (a qualified name)"
            ));
        }
        if let Some(v) = &value
            && !crate::labels::is_valid_label_value(v)
        {
            return Err(format!("startup taint {s:?}: {v:?} is not a valid value"));
        }
        Ok(Self {
            key: key.to_string(),
            value,
            effect: effect.to_string(),
        })
    }
}

impl TryFrom<String> for StartupTaint {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<StartupTaint> for String {
    fn from(t: StartupTaint) -> String {
        t.to_string()
    }
}

impl fmt::Display for StartupTaint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={}:{}", self.key, v, self.effect),
            None => write!(f, "{}:{}", self.key, self.effect),
        }
    }
}

impl StartupTaint {
    /// Ours: same key and effect (the value is the provisioner's business).
    pub fn matches(&self, t: &Taint) -> bool {
        t.key == self.key && t.effect == self.effect
    }

    /// Whether `node` carries it.
    pub fn on(&self, node: &LiteNode) -> bool {
        node.spec.taints.iter().any(|t| self.matches(t))
    }

    /// A taint of our key with another effect (a provisioner given another effect than we
    /// were): not ours, so never released; worth saying why.
    pub(crate) fn other_effect<'a>(&self, node: &'a LiteNode) -> Option<&'a Taint> {
        node.spec
            .taints
            .iter()
            .find(|t| t.key == self.key && t.effect != self.effect)
    }

    /// `node`'s taints without this one.
    pub fn others(&self, node: &LiteNode) -> Vec<Taint> {
        node.spec
            .taints
            .iter()
            .filter(|t| !self.matches(t))
            .cloned()
            .collect()
    }
}

pub use crate::labels::INSTANCE_TYPE_LABEL;

/// How long a node of an instance type EC2 documents as described may go undescribed before
/// it is treated as one EC2 will not describe (EC2 is eventually consistent just after launch).
pub(crate) const SETTLE: Duration = Duration::from_secs(120);

/// Where a node stands, as the gate sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Its labels are written and the node version we hold (from the API server) carries them.
    Labelled,
    /// EC2 does not describe its instance.
    NotDescribed { instance_type: Option<String> },
    /// EC2 refuses its instance ID (`InvalidInstanceID.*`; possibly not visible yet).
    Rejected,
    /// Not an EC2 instance we can look up.
    Skipped(SkipReason),
    /// EC2 cannot be asked right now (throttled, down, failing, or its answer is unusable).
    Ec2Unavailable,
    /// EC2 refuses our credentials.
    Unauthorized,
    /// Someone else keeps changing our labels: we hold our writes (nothing to say).
    Held,
}

/// Why we release a startup taint (also the metric's `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    Labelled,
    Unsupported,
    Timeout,
}

impl Release {
    pub fn as_str(self) -> &'static str {
        match self {
            Release::Labelled => "labelled",
            Release::Unsupported => "unsupported",
            Release::Timeout => "timeout",
        }
    }
}

/// What to do with a node's startup taint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaintAction {
    /// No startup taint configured, or the node does not carry it: nothing to do.
    None,
    /// Keep it; look again within this long (`None`: when the node changes or at the next
    /// regular reconcile).
    Keep(Option<Duration>),
    Release(Release),
}

/// The gate's step on one node: what to write, decided from the node and where it stands.
#[derive(Debug, Clone, PartialEq)]
pub enum GatePlan {
    /// No startup taint and no condition configured.
    Off,
    /// The node cache has not caught up with our last gate write: deciding from this version
    /// would repeat it. Decide from the next one (its watch event usually comes first; look
    /// again within this long in case it does not).
    Behind(Duration),
    Step {
        /// The condition to write (`None`: the node's says this already, or there is nothing
        /// to say).
        condition: Option<Wanted>,
        taint: TaintAction,
    },
}

impl GatePlan {
    /// How soon to look at the node again for the gate's sake, if the plan is carried out
    /// (a timeout, a settling type, a cache behind our write).
    pub(crate) fn recheck(&self) -> Option<Duration> {
        match self {
            GatePlan::Behind(wait) => Some(*wait),
            GatePlan::Step {
                taint: TaintAction::Keep(recheck),
                ..
            } => *recheck,
            _ => None,
        }
    }
}

/// The gate's settings, resolved.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gate {
    pub taint: Option<StartupTaint>,
    pub when_unsupported: WhenUnsupported,
    pub timeout: Option<Duration>,
    pub condition: bool,
}

impl From<&GateArgs> for Gate {
    fn from(a: &GateArgs) -> Self {
        Self {
            taint: a.taint.startup_taint.clone(),
            when_unsupported: a.startup_taint_when_unsupported,
            timeout: a.startup_taint_timeout.map(|d| d.0),
            condition: a.node_condition,
        }
    }
}

impl Gate {
    /// Whether the gate does anything at all.
    pub fn enabled(&self) -> bool {
        self.taint.is_some() || self.condition
    }

    /// The startup-taint decision for a node that carries (`tainted`) or not the taint, is
    /// `age` old and stands where `standing` says.
    pub(crate) fn taint_action(
        &self,
        tainted: bool,
        standing: &Standing,
        age: Duration,
    ) -> TaintAction {
        if self.taint.is_none() || !tainted {
            return TaintAction::None;
        }
        if *standing == Standing::Labelled {
            return TaintAction::Release(Release::Labelled);
        }
        let unsupported = match standing {
            // An empty providerID may still be filled in by the cloud controller.
            Standing::Skipped(SkipReason::Empty) => false,
            Standing::Skipped(_) => true,
            // A type EC2 documents as described is given time to appear (eventual consistency),
            // and so is a node whose type is not known yet (the cloud controller adds the label
            // after kubelet registers): only a known type EC2 never describes is released at once.
            Standing::NotDescribed { instance_type } => {
                instance_type
                    .as_deref()
                    .is_some_and(|t| !t.is_empty() && !is_topology_type(t))
                    || age >= SETTLE
            }
            _ => false,
        };
        if unsupported && self.when_unsupported == WhenUnsupported::Release {
            return TaintAction::Release(Release::Unsupported);
        }
        if let Some(timeout) = self.timeout {
            if age >= timeout {
                return TaintAction::Release(Release::Timeout);
            }
            let settle = match standing {
                Standing::NotDescribed { .. }
                    if self.when_unsupported == WhenUnsupported::Release && age < SETTLE =>
                {
                    SETTLE - age
                }
                _ => Duration::MAX,
            };
            return TaintAction::Keep(Some((timeout - age).min(settle)));
        }
        match standing {
            Standing::NotDescribed { .. } if self.when_unsupported == WhenUnsupported::Release => {
                TaintAction::Keep(Some(SETTLE.saturating_sub(age)))
            }
            _ => TaintAction::Keep(None),
        }
    }

    /// The step for `node`, standing where `standing` says, at `now`; `behind`: the node cache
    /// has not caught up with our last gate write (see [`GatePlan::Behind`]).
    pub fn plan(
        &self,
        node: &LiteNode,
        standing: &Standing,
        behind: Option<Duration>,
        now: &Time,
    ) -> GatePlan {
        if !self.enabled() {
            return GatePlan::Off;
        }
        if let Some(wait) = behind {
            return GatePlan::Behind(wait);
        }
        let condition = self
            .condition(standing)
            .filter(|wanted| wanted.patch(node, now).is_some());
        let taint = match &self.taint {
            Some(t) => self.taint_action(t.on(node), standing, age(node, now)),
            None => TaintAction::None,
        };
        GatePlan::Step { condition, taint }
    }

    /// How long until the startup-taint timeout falls due for `node`, if it carries the taint
    /// and a timeout is set.
    pub(crate) fn timeout_in(&self, node: &LiteNode) -> Option<Duration> {
        let (taint, timeout) = (self.taint.as_ref()?, self.timeout?);
        if !taint.on(node) {
            return None;
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        Some(timeout.saturating_sub(age(node, &now)))
    }

    /// The condition the node should carry, when conditions are on and the standing says
    /// something (`Held` does not).
    pub fn condition(&self, standing: &Standing) -> Option<Wanted> {
        if !self.condition {
            return None;
        }
        let (status, reason, message) = match standing {
            Standing::Labelled => (
                true,
                "Labelled",
                "the node's network topology labels are written",
            ),
            Standing::NotDescribed { .. } | Standing::Rejected => (
                false,
                "NotDescribed",
                "EC2 does not describe this instance's network topology (an unsupported type, or not yet)",
            ),
            Standing::Skipped(_) => (
                false,
                "Skipped",
                "not an EC2 instance whose topology can be looked up (see the providerID)",
            ),
            Standing::Ec2Unavailable => (
                false,
                "Ec2Unavailable",
                "EC2 cannot be asked for this node's topology right now; retrying",
            ),
            Standing::Unauthorized => (
                false,
                "Unauthorized",
                "EC2 refuses the controller's credentials (ec2:DescribeInstanceTopology)",
            ),
            Standing::Held => return None,
        };
        Some(Wanted {
            status,
            reason,
            message,
        })
    }
}

impl Gate {
    /// What the gate would do to `node`, in words, for `plan`: (startup taint, condition).
    pub(crate) fn preview(
        &self,
        node: &LiteNode,
        standing: &Standing,
        now: &Time,
    ) -> (Option<String>, Option<String>) {
        let taint = self.taint.as_ref().and_then(|t| {
            match self.taint_action(t.on(node), standing, age(node, now)) {
                TaintAction::None => None,
                TaintAction::Keep(_) => Some(format!("{} kept", t.key)),
                TaintAction::Release(why) => Some(format!("{} released ({})", t.key, why.as_str())),
            }
        });
        let current = node
            .topology_condition()
            .map(|c| format!("{}/{}", c.status, c.reason.as_deref().unwrap_or("")));
        let condition = match self.condition(standing) {
            Some(w) if w.patch(node, now).is_some() => Some(format!(
                "{} -> {}/{}",
                current.as_deref().unwrap_or("none"),
                w.status_str(),
                w.reason
            )),
            _ => current,
        };
        (taint, condition)
    }
}

/// One note on a node's startup taint and condition as they are, for `tree`.
pub fn note(taint: Option<&StartupTaint>, node: &LiteNode) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(t) = taint
        && t.on(node)
    {
        parts.push(format!("startup taint {}", t.key));
    }
    if let Some(c) = node.topology_condition() {
        parts.push(format!(
            "{CONDITION_TYPE}={} {}",
            c.status,
            c.reason.as_deref().unwrap_or("")
        ));
    }
    (!parts.is_empty()).then(|| parts.join(", ").trim_end().to_string())
}

/// The condition a node should carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    pub status: bool,
    pub reason: &'static str,
    pub message: &'static str,
}

impl Wanted {
    fn status_str(&self) -> &'static str {
        if self.status { "True" } else { "False" }
    }

    /// The strategic-merge patch body for the status subresource, or `None` when the node's
    /// condition already says this (status and reason; only a change is written). The
    /// transition time moves only when the status does.
    pub fn patch(&self, node: &LiteNode, now: &Time) -> Option<serde_json::Value> {
        let current = node.topology_condition();
        if let Some(c) = current
            && c.status == self.status_str()
            && c.reason.as_deref() == Some(self.reason)
        {
            return None;
        }
        Some(crate::node::LiteCondition::patch(
            CONDITION_TYPE,
            self.status,
            self.reason,
            self.message,
            current,
            now,
        ))
    }
}

/// How old `node` is (zero when it has no creation time, or one in the future).
pub fn age(node: &LiteNode, now: &Time) -> Duration {
    node.metadata
        .creation_timestamp
        .as_ref()
        .and_then(|c| Duration::try_from(now.0.duration_since(c.0)).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(when: WhenUnsupported, timeout: Option<u64>) -> Gate {
        Gate {
            taint: Some(
                "ec2-topology-labeler.io/topology-pending:NoSchedule"
                    .parse()
                    .unwrap(),
            ),
            when_unsupported: when,
            timeout: timeout.map(Duration::from_secs),
            condition: true,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn parses_key_value_and_effect() {
        let t: StartupTaint = "example.com/pending=topology:NoExecute".parse().unwrap();
        assert_eq!(
            (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
            ("example.com/pending", Some("topology"), "NoExecute")
        );
        assert_eq!(t.to_string(), "example.com/pending=topology:NoExecute");
        let t: StartupTaint = "pending:NoSchedule".parse().unwrap();
        assert_eq!(t.value, None);
        for bad in [
            "pending",
            "pending:Never",
            ":NoSchedule",
            "bad key:NoSchedule",
            "k=bad value:NoSchedule",
        ] {
            assert!(
                bad.parse::<StartupTaint>().is_err(),
                "{bad} must be refused"
            );
        }
    }

    #[test]
    fn matches_by_key_and_effect_whatever_the_value() {
        let t: StartupTaint = "p:NoSchedule".parse().unwrap();
        let taint = |k: &str, v: Option<&str>, e: &str| Taint {
            key: k.into(),
            value: v.map(Into::into),
            effect: e.into(),
            time_added: None,
        };
        assert!(t.matches(&taint("p", Some("anything"), "NoSchedule")));
        assert!(!t.matches(&taint("p", None, "NoExecute")));
        assert!(!t.matches(&taint("q", None, "NoSchedule")));
    }

    #[test]
    fn released_once_labelled_and_only_then() {
        let g = gate(WhenUnsupported::Keep, None);
        assert_eq!(
            g.taint_action(true, &Standing::Labelled, secs(1)),
            TaintAction::Release(Release::Labelled)
        );
        for waiting in [
            Standing::Ec2Unavailable,
            Standing::Unauthorized,
            Standing::Held,
            Standing::Rejected,
        ] {
            assert_eq!(
                g.taint_action(true, &waiting, secs(3600)),
                TaintAction::Keep(None),
                "{waiting:?}"
            );
        }
        // Nothing to do without the taint or without the feature.
        assert_eq!(
            g.taint_action(false, &Standing::Labelled, secs(1)),
            TaintAction::None
        );
        assert_eq!(
            Gate::default().taint_action(true, &Standing::Labelled, secs(1)),
            TaintAction::None
        );
    }

    /// Issue 26.10: our key with another effect is told apart (and so can be warned about).
    #[test]
    fn our_key_with_another_effect_is_not_ours_but_is_noticed() {
        let taint: StartupTaint = "ec2-topology-labeler.io/topology-pending:NoSchedule"
            .parse()
            .unwrap();
        let node: LiteNode = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
            "spec": {"taints": [{"key": "ec2-topology-labeler.io/topology-pending", "effect": "NoExecute"}]}
        }))
        .unwrap();
        assert!(!taint.on(&node));
        assert_eq!(
            taint.other_effect(&node).map(|t| t.effect.as_str()),
            Some("NoExecute")
        );
    }

    /// Issue 26.3: kubelet set the providerID, the cloud controller has not added the instance
    /// type yet and EC2 does not describe the fresh instance yet. An unknown type is not an
    /// unsupported one: under `release` the taint stays while the node settles, like a type EC2
    /// describes, and goes only after [`SETTLE`].
    #[test]
    fn a_node_whose_instance_type_is_not_known_yet_is_given_time_to_settle() {
        let release = gate(WhenUnsupported::Release, None);
        for unknown in [None, Some(String::new())] {
            let unknown = Standing::NotDescribed {
                instance_type: unknown,
            };
            assert_eq!(
                release.taint_action(true, &unknown, secs(1)),
                TaintAction::Keep(Some(SETTLE - secs(1))),
                "{unknown:?}"
            );
            assert_eq!(
                release.taint_action(true, &unknown, SETTLE),
                TaintAction::Release(Release::Unsupported)
            );
        }
    }

    #[test]
    fn unsupported_nodes_follow_the_policy() {
        let release = gate(WhenUnsupported::Release, None);
        let keep = gate(WhenUnsupported::Keep, None);
        let m5 = Standing::NotDescribed {
            instance_type: Some("m5.large".into()),
        };
        let fargate = Standing::Skipped(SkipReason::Fargate);
        for s in [&m5, &fargate] {
            assert_eq!(
                release.taint_action(true, s, secs(1)),
                TaintAction::Release(Release::Unsupported),
                "{s:?}"
            );
            assert_eq!(
                keep.taint_action(true, s, secs(1)),
                TaintAction::Keep(None),
                "{s:?}"
            );
        }
        // An empty providerID may be filled in later: not unsupported.
        assert_eq!(
            release.taint_action(true, &Standing::Skipped(SkipReason::Empty), secs(1)),
            TaintAction::Keep(None)
        );
    }

    #[test]
    fn a_documented_type_not_described_yet_is_given_time_to_settle() {
        let g = gate(WhenUnsupported::Release, None);
        let p5 = Standing::NotDescribed {
            instance_type: Some("p5.48xlarge".into()),
        };
        assert_eq!(
            g.taint_action(true, &p5, secs(20)),
            TaintAction::Keep(Some(SETTLE - secs(20)))
        );
        assert_eq!(
            g.taint_action(true, &p5, SETTLE),
            TaintAction::Release(Release::Unsupported)
        );
    }

    #[test]
    fn the_timeout_releases_anything_and_says_when_to_look_again() {
        let g = gate(WhenUnsupported::Keep, Some(300));
        assert_eq!(
            g.taint_action(true, &Standing::Ec2Unavailable, secs(100)),
            TaintAction::Keep(Some(secs(200)))
        );
        assert_eq!(
            g.taint_action(true, &Standing::Ec2Unavailable, secs(300)),
            TaintAction::Release(Release::Timeout)
        );
        let m5 = Standing::NotDescribed {
            instance_type: Some("m5.large".into()),
        };
        assert_eq!(
            g.taint_action(true, &m5, secs(301)),
            TaintAction::Release(Release::Timeout)
        );
        // With `release`, a settling type is looked at again when it stops settling.
        let g = gate(WhenUnsupported::Release, Some(300));
        let p5 = Standing::NotDescribed {
            instance_type: Some("p5.48xlarge".into()),
        };
        assert_eq!(
            g.taint_action(true, &p5, secs(100)),
            TaintAction::Keep(Some(secs(20)))
        );
    }

    fn node_with(cond: Option<(&str, &str, &str)>) -> LiteNode {
        let n = crate::testing::nodes::unnamed();
        match cond {
            Some((status, reason, at)) => n
                .condition(crate::node::LiteCondition {
                    type_: CONDITION_TYPE.into(),
                    status: status.into(),
                    reason: Some(reason.into()),
                    message: None,
                    last_transition_time: Some(Time(at.parse().unwrap())),
                })
                .build(),
            None => n.build(),
        }
    }

    #[test]
    fn the_condition_is_written_only_on_change_and_keeps_its_transition_time() {
        let g = gate(WhenUnsupported::Release, None);
        let now = Time("2026-11-30T12:00:00Z".parse().unwrap());
        let labelled = g.condition(&Standing::Labelled).unwrap();
        // New: written, transition now.
        let p = labelled.patch(&node_with(None), &now).unwrap();
        let c = &p["status"]["conditions"][0];
        assert_eq!(
            (
                c["type"].as_str(),
                c["status"].as_str(),
                c["reason"].as_str()
            ),
            (Some(CONDITION_TYPE), Some("True"), Some("Labelled"))
        );
        assert_eq!(
            c["lastTransitionTime"],
            serde_json::json!("2026-11-30T12:00:00Z")
        );
        // Same status and reason: nothing to write.
        assert!(
            labelled
                .patch(
                    &node_with(Some(("True", "Labelled", "2026-11-01T00:00:00Z"))),
                    &now
                )
                .is_none()
        );
        // Reason changes, status does not: the transition time stays.
        let down = g.condition(&Standing::Unauthorized).unwrap();
        let p = down
            .patch(
                &node_with(Some(("False", "Ec2Unavailable", "2026-11-01T00:00:00Z"))),
                &now,
            )
            .unwrap();
        assert_eq!(
            p["status"]["conditions"][0]["lastTransitionTime"],
            serde_json::json!("2026-11-01T00:00:00Z")
        );
        // Status flips: the transition time moves.
        let p = labelled
            .patch(
                &node_with(Some(("False", "Ec2Unavailable", "2026-11-01T00:00:00Z"))),
                &now,
            )
            .unwrap();
        assert_eq!(
            p["status"]["conditions"][0]["lastTransitionTime"],
            serde_json::json!("2026-11-30T12:00:00Z")
        );
    }

    #[test]
    fn plan_and_tree_say_what_the_gate_does() {
        let g = gate(WhenUnsupported::Keep, None);
        let now = Time("2026-11-30T12:00:00Z".parse().unwrap());
        let mut n = node_with(Some(("False", "Ec2Unavailable", "2026-11-30T11:00:00Z")));
        n.spec.taints.push(Taint {
            key: "ec2-topology-labeler.io/topology-pending".into(),
            effect: "NoSchedule".into(),
            ..Taint::default()
        });
        assert_eq!(
            g.preview(&n, &Standing::Labelled, &now),
            (
                Some("ec2-topology-labeler.io/topology-pending released (labelled)".into()),
                Some("False/Ec2Unavailable -> True/Labelled".into())
            )
        );
        assert_eq!(
            g.preview(&n, &Standing::Ec2Unavailable, &now),
            (
                Some("ec2-topology-labeler.io/topology-pending kept".into()),
                Some("False/Ec2Unavailable".into())
            )
        );
        assert_eq!(
            note(g.taint.as_ref(), &n).as_deref(),
            Some(
                "startup taint ec2-topology-labeler.io/topology-pending, TopologyLabeled=False Ec2Unavailable"
            )
        );
        assert_eq!(note(None, &LiteNode::default()), None);
    }

    #[test]
    fn every_standing_has_its_reason() {
        let g = gate(WhenUnsupported::Release, None);
        let reason = |s: Standing| g.condition(&s).map(|w| (w.status, w.reason));
        assert_eq!(reason(Standing::Labelled), Some((true, "Labelled")));
        assert_eq!(
            reason(Standing::NotDescribed {
                instance_type: None
            }),
            Some((false, "NotDescribed"))
        );
        assert_eq!(reason(Standing::Rejected), Some((false, "NotDescribed")));
        assert_eq!(
            reason(Standing::Skipped(SkipReason::Fargate)),
            Some((false, "Skipped"))
        );
        assert_eq!(
            reason(Standing::Ec2Unavailable),
            Some((false, "Ec2Unavailable"))
        );
        assert_eq!(
            reason(Standing::Unauthorized),
            Some((false, "Unauthorized"))
        );
        assert_eq!(reason(Standing::Held), None);
        assert_eq!(Gate::default().condition(&Standing::Labelled), None);
    }
}

//! What one reconcile does to a node, decided before anything is done.
//!
//! [`decide`] is pure: from the node, what its record says and the answer (EC2's, through
//! [`super::assess`], or why there is none) it gives one [`Decision`]: where the node stands,
//! what to say about it (an Event and a log line, once, on entering that), the labels to write,
//! where the startup gate stands (its condition and taint follow from that:
//! [`super::gate::Gate::plan`]) and when to look again. [`super::reconcile_node`] gathers the
//! facts (and stops early when leadership is lost while it does) and `carry_out` carries the
//! decision out; neither decides where a node stands.
//!
//! Owns: the decision for one node. Never does I/O, never reads a clock (the time is a fact).

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use tracing::{info, warn};

use super::{
    assess::{Assessment, provider_id_of},
    conflict::Verdict,
    gate::{self, Standing},
    nodes::entering,
};
use crate::{
    Error,
    admin::events::Reason,
    labels::{DeriveError, Desired, NodeDiff},
    node::LiteNode,
    provider_id::{self, SkipReason},
    state::{NodeState, NotDescribed},
    topology::Ec2Error,
};

/// Why a reconcile has an answer, or has none.
#[derive(Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per reconcile, on its stack, moved once into the facts"
)]
pub(super) enum Answer<'a> {
    /// What reading told (see [`Assessment`]).
    Assessed(Assessment),
    /// EC2 did not answer before the node's startup-taint timeout fell due (the call goes on in
    /// the batcher).
    TimedOut,
    /// The reconcile failed: EC2, or the API server (the write).
    Failed(&'a Error),
}

/// What a decision is made from. The record's answers (`awaiting`, `verdict`) are asked by the
/// executor only when [`Facts::write_due`] says a write is due, in that order: asking has
/// effects (the guard counts a correction).
#[derive(Debug)]
pub(super) struct Facts<'a> {
    pub node: &'a LiteNode,
    pub answer: Answer<'a>,
    /// Where the node stood before this reconcile (`None`: never reconciled).
    pub previous: Option<NodeState>,
    /// Our last label write is not in the node cache yet (it is not repeated).
    pub(crate) awaiting: bool,
    /// The conflict guard's say on the write that is due.
    pub verdict: Verdict,
    /// For an answer that cannot be turned into labels: when the lookup asks EC2 again (the
    /// executor has told it to forget that answer).
    pub(crate) unusable_retry_in: Duration,
    pub now: Instant,
}

impl<'a> Facts<'a> {
    pub(super) fn new(node: &'a LiteNode, answer: Answer<'a>, now: Instant) -> Self {
        Self {
            node,
            answer,
            previous: None,
            awaiting: false,
            verdict: Verdict::Write,
            unusable_retry_in: Duration::ZERO,
            now,
        }
    }

    /// The labels the answer says the node lacks, if any: a write is due unless the record
    /// says ours is awaited or the guard holds it.
    pub(super) fn write_due(&self) -> Option<&Desired> {
        match &self.answer {
            Answer::Assessed(Assessment::Ready { desired, diff, .. }) if !diff.is_empty() => {
                Some(desired)
            }
            _ => None,
        }
    }
}

/// The labels to write: one server-side apply of the full managed set.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Write {
    pub desired: Desired,
    pub diff: NodeDiff,
    /// The node carries none of the labels yet (its first labelling: a metric).
    pub first: bool,
}

/// Where the startup gate stands for this node, and the labels a release after labelling
/// requires the node to carry.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct GateStep {
    pub standing: Standing,
    pub labels: Option<BTreeMap<String, String>>,
}

/// What one reconcile does to a node.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Decision {
    /// Where the node stands now (`None`: as it stood). With a write, once it succeeded.
    pub state: Option<NodeState>,
    /// Said once (an Event, and a log line where [`Say::log`] has one): on entering `state`, on
    /// a write, when a hold starts.
    pub say: Option<Say>,
    pub write: Option<Write>,
    /// The node cache shows the node as it is: our last write is no longer awaited.
    pub seen: bool,
    /// The startup gate's step comes before the state and what is said (as on a failed
    /// reconcile, whose Event follows the gate's).
    pub(crate) gate_first: bool,
    /// The startup gate's step (`None`: none this time, as while our write is awaited). With a
    /// write, taken on the node the API server returned.
    pub gate: Option<GateStep>,
    /// When to look again, unless the gate asks sooner (`None`: when the node changes or at
    /// its resync slot).
    pub next: Option<Duration>,
}

/// An Event and a log line, with what they say.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Say {
    Skipped {
        reason: SkipReason,
        provider_id: String,
    },
    NotDescribed {
        instance_id: String,
        why: NotDescribed,
        instance_type: Option<String>,
        retry_in: Duration,
    },
    Rejected {
        instance_id: String,
        error: Ec2Error,
        retry_in: Duration,
        provider_id: String,
    },
    Unusable {
        error: DeriveError,
        retry_in: Duration,
    },
    Failed {
        denied: bool,
        error: String,
    },
    /// Another writer keeps changing our labels: the Event names it (the executor asks the API
    /// server who), once per hold.
    Conflict {
        diff: NodeDiff,
        until: Instant,
    },
    Updated {
        summary: String,
    },
}

impl Say {
    pub(super) fn reason(&self) -> Reason {
        match self {
            Say::Skipped { .. } => Reason::TopologySkipped,
            Say::NotDescribed { .. } => Reason::TopologyNotDescribed,
            Say::Rejected { .. } => Reason::InstanceIdRejected,
            Say::Unusable { .. } => Reason::TopologyInvalid,
            Say::Failed { denied: true, .. } => Reason::Ec2AccessDenied,
            Say::Failed { denied: false, .. } => Reason::TopologyLabelingFailed,
            Say::Conflict { .. } => Reason::TopologyLabelConflict,
            Say::Updated { .. } => Reason::TopologyLabelsUpdated,
        }
    }

    /// The Event's note. A conflict's Event is written by `events::report_conflict`, which
    /// names the other writer; this note is only its gist.
    pub(super) fn note(&self) -> String {
        match self {
            Say::Skipped {
                reason,
                provider_id,
            } => format!(
                "not labelled: {} (providerID {provider_id:?}); looked at again when its providerID changes",
                reason.explain()
            ),
            Say::NotDescribed {
                instance_id,
                why,
                instance_type,
                retry_in,
            } => {
                let what = match why {
                    NotDescribed::UnsupportedType => format!(
                        "its instance type {} is not one EC2 describes network topology for",
                        instance_type.as_deref().unwrap_or_default()
                    ),
                    NotDescribed::NotYet => {
                        "the instance is not running, is too new, or EC2's answer has not caught up"
                            .to_string()
                    }
                };
                format!(
                    "EC2 does not describe instance {instance_id}: {what}; its labels are left as they are and EC2 is asked again in {}s (backoff up to --not-described-ttl)",
                    retry_in.as_secs()
                )
            }
            Say::Rejected {
                instance_id,
                error,
                retry_in,
                ..
            } => format!(
                "EC2 refuses instance ID {instance_id} from this node's providerID ({error}); its labels are left as they are and it is asked about again in {}s",
                retry_in.as_secs()
            ),
            Say::Unusable { error, .. } => format!(
                "EC2's topology answer cannot be turned into labels; they are left as they are: {error}"
            ),
            Say::Failed {
                denied: true,
                error,
            } => format!(
                "EC2 refuses the controller's credentials, so this node's topology cannot be looked up; its labels are left as they are: {error}"
            ),
            Say::Failed {
                denied: false,
                error,
            } => format!(
                "cannot look up or write this node's topology labels; they are left as they are: {error}"
            ),
            Say::Conflict { diff, .. } => format!("another writer keeps changing {diff:?}"),
            Say::Updated { summary } => summary.clone(),
        }
    }

    /// The log line (inside the reconcile's span, which names the node and instance).
    pub(super) fn log(&self) {
        match self {
            Say::Skipped {
                reason,
                provider_id,
            } => info!(
                %provider_id,
                %reason,
                "not an EC2 instance we can look up; skipping until its providerID changes"
            ),
            Say::NotDescribed { why, retry_in, .. } => info!(
                retry_in_s = retry_in.as_secs(),
                reason = why.as_str(),
                "EC2 does not describe this instance; leaving its labels alone"
            ),
            Say::Rejected {
                error,
                retry_in,
                provider_id,
                ..
            } => warn!(%error, retry_in_s = retry_in.as_secs(), %provider_id,
                "EC2 refuses this node's instance ID; leaving its labels alone and keeping it out of other nodes' calls"),
            Say::Unusable { error, retry_in } => warn!(%error, retry_in_s = retry_in.as_secs(),
                "cannot label from EC2's answer; leaving the node's labels alone"),
            // The error policy logs failures (one line a minute for those an operator must fix).
            Say::Failed { .. } => {}
            // Logged with the other writer's name, where the Event is written.
            Say::Conflict { .. } => {}
            Say::Updated { summary } => info!(changes = %summary, "node labels updated"),
        }
    }
}

/// Look again after `usual` (`None`: when the node changes), or sooner if the gate asks.
pub(super) fn next_look(usual: Option<Duration>, gate: Option<Duration>) -> Option<Duration> {
    let gate = gate.map(|d| d + Duration::from_millis(100));
    match (usual, gate) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (Some(d), None) | (None, Some(d)) => Some(d),
        (None, None) => None,
    }
}

/// Requeue exactly when the lookup says the instance is due again: those times sit on a grid
/// shared by every instance, so the nodes due in one round are asked about in one call.
fn grid(retry_in: Duration) -> Option<Duration> {
    Some(retry_in + Duration::from_millis(5))
}

/// Where the node stands once it is in `state`, and what to say if it has just entered it.
fn enter(facts: &Facts<'_>, state: NodeState, say: impl FnOnce() -> Say) -> Option<Say> {
    entering(facts.previous.as_ref(), &state).then(say)
}

fn step(standing: Standing) -> Option<GateStep> {
    Some(GateStep {
        standing,
        labels: None,
    })
}

/// The decision for one node.
pub(super) fn decide(facts: Facts<'_>) -> Decision {
    let node = facts.node;
    let provider_id = || provider_id::for_log(provider_id_of(node));
    let mut d = Decision {
        state: None,
        say: None,
        write: None,
        seen: false,
        gate_first: false,
        gate: None,
        next: None,
    };
    let assessment = match &facts.answer {
        Answer::TimedOut => {
            d.gate = step(Standing::Ec2Unavailable);
            d.next = Some(Duration::from_secs(1));
            return d;
        }
        Answer::Failed(e) => {
            let state = NodeState::Failing(e.category());
            let denied = matches!(e, Error::Ec2(Ec2Error::Unauthorized { .. }));
            d.say = enter(&facts, state.clone(), || Say::Failed {
                denied,
                error: e.to_string(),
            });
            d.state = Some(state);
            d.gate_first = true;
            d.gate = match e {
                Error::Ec2(Ec2Error::Unauthorized { .. }) => step(Standing::Unauthorized),
                Error::Ec2(_) => step(Standing::Ec2Unavailable),
                // The API server's trouble: nothing could be written anyway.
                _ => None,
            };
            return d;
        }
        Answer::Assessed(a) => a,
    };
    match assessment {
        Assessment::Skipped(reason) => {
            let state = NodeState::Skipped(reason.as_str());
            d.say = enter(&facts, state.clone(), || Say::Skipped {
                reason: *reason,
                provider_id: provider_id(),
            });
            d.state = Some(state);
            d.gate = step(Standing::Skipped(*reason));
            // The watch brings the node back when its providerID changes.
        }
        Assessment::NotDescribed {
            instance_id,
            retry_in,
        } => {
            let instance_type = node.label(gate::INSTANCE_TYPE_LABEL);
            let why = NotDescribed::of(instance_type.as_deref());
            let state = NodeState::NotDescribed(why);
            d.say = enter(&facts, state.clone(), || Say::NotDescribed {
                instance_id: instance_id.clone(),
                why,
                instance_type: instance_type.clone(),
                retry_in: *retry_in,
            });
            d.state = Some(state);
            d.gate = step(Standing::NotDescribed { instance_type });
            d.next = grid(*retry_in);
        }
        Assessment::Rejected {
            instance_id,
            error,
            retry_in,
        } => {
            d.say = enter(&facts, NodeState::Rejected, || Say::Rejected {
                instance_id: instance_id.clone(),
                error: error.clone(),
                retry_in: *retry_in,
                provider_id: provider_id(),
            });
            d.state = Some(NodeState::Rejected);
            d.gate = step(Standing::Rejected);
            d.next = grid(*retry_in);
        }
        Assessment::Invalid { error, .. } => {
            // Not an answer to keep: EC2 is asked again later, with the backoff of an instance
            // it did not describe, rather than trusting it until the cache TTL.
            let retry_in = facts.unusable_retry_in;
            let state = NodeState::Failing(INVALID_TOPOLOGY);
            d.say = enter(&facts, state.clone(), || Say::Unusable {
                error: error.clone(),
                retry_in,
            });
            d.state = Some(state);
            d.gate = step(Standing::Ec2Unavailable);
            d.next = grid(retry_in);
        }
        Assessment::Ready {
            desired,
            diff,
            recheck_in,
            ..
        } => {
            // Sooner while EC2's answer is still settling; otherwise when the node changes or
            // its resync slot comes up (see `resync`: no timer per node).
            d.next = recheck_in.map(|r| r + Duration::from_millis(5));
            d.state = Some(NodeState::Labelled);
            // The labels the gate's release requires are the answer's: moved into the step
            // once the decision is made (below), not copied at every resync.
            let labelled = GateStep {
                standing: Standing::Labelled,
                labels: None,
            };
            if diff.is_empty() {
                d.seen = true;
                d.gate = Some(labelled);
            } else if facts.awaiting {
                // Our last write is not in the node cache yet: not written again, and the gate
                // waits for the version that shows it.
            } else if let Verdict::Hold { until, first } = facts.verdict {
                d.state = Some(NodeState::Conflict);
                d.say = first.then(|| Say::Conflict {
                    diff: diff.clone(),
                    until,
                });
                d.gate = step(Standing::Held);
                d.next =
                    Some(until.saturating_duration_since(facts.now) + Duration::from_millis(100));
            } else {
                d.write = Some(Write {
                    desired: desired.clone(),
                    diff: diff.clone(),
                    first: !desired.labels.keys().any(|k| node.has_label(k)),
                });
                d.say = Some(Say::Updated {
                    summary: diff.summary(),
                });
                d.gate = Some(labelled);
            }
        }
    }
    if let Some(
        gate @ GateStep {
            standing: Standing::Labelled,
            labels: None,
        },
    ) = d.gate.as_mut()
        && let Answer::Assessed(Assessment::Ready { desired, .. }) = facts.answer
    {
        gate.labels = Some(desired.labels);
    }
    d
}

/// The failure category of an EC2 answer that cannot be turned into labels.
pub(super) const INVALID_TOPOLOGY: &str = "invalid_topology";

#[cfg(test)]
mod tests {
    //! Every reason a node stands where it does, and every startup-taint and condition outcome,
    //! as one table: the decision, then the gate's plan for the node it steps on.

    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::{
        node::{CONDITION_TYPE, LiteCondition},
        reconcile::gate::{Gate, GatePlan, TaintAction, WhenUnsupported},
    };

    const TAINT: &str = "ec2-topology-labeler.io/topology-pending:NoSchedule";
    const LEAF: &str = "topology.k8s.aws/network-node-layer-3";

    /// A node `age_s` old at `now`, carrying the startup taint (when `tainted`) and these labels.
    fn node(
        now: &Time,
        age_s: i64,
        provider_id: &str,
        tainted: bool,
        labels: &[(&str, &str)],
    ) -> LiteNode {
        let n = crate::testing::nodes::node("n1")
            .created(Some(age_s), now)
            .labels(labels)
            .provider_id(provider_id);
        if tainted {
            n.taint("ec2-topology-labeler.io/topology-pending", "NoSchedule")
                .build()
        } else {
            n.build()
        }
    }

    fn gate(when: WhenUnsupported, timeout_s: Option<u64>) -> Gate {
        Gate {
            taint: Some(TAINT.parse().expect("a valid taint")),
            when_unsupported: when,
            timeout: timeout_s.map(Duration::from_secs),
            condition: true,
        }
    }

    fn desired(leaf: &str) -> Desired {
        Desired {
            labels: BTreeMap::from([(LEAF.to_string(), leaf.to_string())]),
            ..Desired::default()
        }
    }

    fn ready(node: &LiteNode, leaf: &str, recheck_in: Option<Duration>) -> Assessment {
        let want = desired(leaf);
        let mut diff = NodeDiff::default();
        match node.label(LEAF) {
            None => {
                diff.labels.add.insert(LEAF.into(), leaf.into());
            }
            Some(have) if have != leaf => {
                diff.labels.change.insert(LEAF.into(), (have, leaf.into()));
            }
            Some(_) => {}
        }
        Assessment::Ready {
            instance_id: "i-0123456789abcdef0".into(),
            desired: want,
            diff,
            refresh_error: None,
            recheck_in,
            answer: std::sync::Arc::new(crate::topology::InstanceTopology {
                network_nodes: vec![leaf.into()],
                ..Default::default()
            }),
            verified_at: 1_796_300_000,
        }
    }

    fn throttled() -> Error {
        Error::Ec2(Ec2Error::Throttled {
            code: "RequestLimitExceeded".into(),
            message: "slow down".into(),
        })
    }

    fn denied() -> Error {
        Error::Ec2(Ec2Error::Unauthorized {
            code: "UnauthorizedOperation".into(),
            message: "no".into(),
        })
    }

    /// One row: what the decision and the gate's plan come to, in words.
    fn row(facts: Facts<'_>, gate: &Gate, behind: Option<Duration>, now: &Time) -> String {
        let node = facts.node;
        let d = decide(facts);
        let state = d
            .state
            .as_ref()
            .map_or("-".to_string(), |s| format!("{}/{}", s.name(), s.reason()));
        let say = d
            .say
            .as_ref()
            .map_or("-".to_string(), |s| format!("{:?}", s.reason()));
        let write = match (&d.write, d.seen) {
            (Some(w), _) => {
                if w.first {
                    "first"
                } else {
                    "write"
                }
            }
            (None, true) => "seen",
            (None, false) => "-",
        };
        // The labels a release after labelling requires the node to carry.
        let carry = d
            .gate
            .as_ref()
            .and_then(|g| g.labels.as_ref())
            .map_or("-".to_string(), |l| l.len().to_string());
        let (condition, taint, recheck) = match &d.gate {
            None => ("-".to_string(), "-".to_string(), None),
            Some(step) => {
                let plan = gate.plan(node, &step.standing, behind, now);
                let recheck = plan.recheck();
                match plan {
                    GatePlan::Off => ("off".into(), "off".into(), recheck),
                    GatePlan::Behind(_) => ("behind".into(), "behind".into(), recheck),
                    GatePlan::Step { condition, taint } => (
                        match (condition, gate.condition(&step.standing)) {
                            (Some(w), _) => {
                                format!("{}/{}", if w.status { "True" } else { "False" }, w.reason)
                            }
                            // The node's condition says it already.
                            (None, Some(_)) => "=".to_string(),
                            // Nothing to say (a hold), or conditions off.
                            (None, None) => "n/a".to_string(),
                        },
                        match taint {
                            TaintAction::None => "none".to_string(),
                            TaintAction::Keep(None) => "keep".to_string(),
                            TaintAction::Keep(Some(r)) => format!("keep {}s", r.as_secs()),
                            TaintAction::Release(why) => format!("release {}", why.as_str()),
                        },
                        recheck,
                    ),
                }
            }
        };
        let next = next_look(d.next, recheck)
            .map_or("change".to_string(), |n| format!("{}ms", n.as_millis()));
        format!("{state} | {say} | {write} | {carry} | {condition} | {taint} | {next}")
    }

    #[test]
    fn every_reason_and_every_taint_and_condition_outcome() {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let at = Instant::now();
        let release = gate(WhenUnsupported::Release, None);
        let keep = gate(WhenUnsupported::Keep, Some(600));
        let off = Gate::default();
        let aws = "aws:///us-east-1a/i-0123456789abcdef0";
        let young = |labels: &[(&str, &str)]| node(&now, 10, aws, true, labels);
        let p5 = [(gate::INSTANCE_TYPE_LABEL, "p5.48xlarge")];
        let m5 = [(gate::INSTANCE_TYPE_LABEL, "m5.large")];
        let not_described = |retry_s| {
            Answer::Assessed(Assessment::NotDescribed {
                instance_id: "i-0123456789abcdef0".into(),
                retry_in: Duration::from_secs(retry_s),
            })
        };
        let rejected = Answer::Assessed(Assessment::Rejected {
            instance_id: "i-0123456789abcdef0".into(),
            error: Ec2Error::InvalidRequest {
                code: "InvalidInstanceID.NotFound".into(),
                message: "gone".into(),
            },
            retry_in: Duration::from_secs(30),
        });
        let invalid = Answer::Assessed(Assessment::Invalid {
            instance_id: "i-0123456789abcdef0".into(),
            error: DeriveError::NoNetworkNodes,
        });
        let (throttled, denied) = (throttled(), denied());
        let api = Error::Kube(kube::Error::Api(
            kube::core::Status::failure("unavailable", "ServiceUnavailable")
                .with_code(503)
                .boxed(),
        ));

        let bare = young(&p5);
        let labelled = young(&[(LEAF, "nn-3"), p5[0]]);
        let mut settled = node(&now, 10, aws, false, &[(LEAF, "nn-3")]);
        settled.status.conditions.push(LiteCondition {
            type_: CONDITION_TYPE.into(),
            status: "True".into(),
            reason: Some("Labelled".into()),
            ..LiteCondition::default()
        });
        let untainted = node(&now, 10, aws, false, &p5);
        let empty = node(&now, 10, "", true, &[]);
        let other_cloud = node(&now, 10, "kind://docker/kind/n1", true, &[]);
        let (unsupported, unknown) = (young(&m5), young(&[]));
        let fargate = node(
            &now,
            10,
            "aws:///us-west-2a/0123456789abcdef0123456789abcdef/fargate-ip-10-0-13-1.us-west-2.compute.internal",
            true,
            &[],
        );
        let hybrid = node(
            &now,
            10,
            "eks-hybrid:///us-west-2/my-cluster/mi-0123456789abcdef0",
            true,
            &[],
        );
        let malformed = node(&now, 10, "aws:///us-east-1a/not-an-instance", true, &[]);
        let mut said_not_described = node(&now, 10, aws, false, &p5);
        said_not_described.status.conditions.push(LiteCondition {
            type_: CONDITION_TYPE.into(),
            status: "False".into(),
            reason: Some("NotDescribed".into()),
            ..LiteCondition::default()
        });
        let settling_too_long = node(&now, 200, aws, true, &p5);
        let past_timeout = node(&now, 700, aws, true, &p5);

        let facts = |node, answer| Facts::new(node, answer, at);
        let after = |mut f: Facts<'static>, previous: NodeState| {
            f.previous = Some(previous);
            f
        };
        // Leaked for the table's sake: each row borrows its node for the test's length.
        let leak = |n: LiteNode| -> &'static LiteNode { Box::leak(Box::new(n)) };
        let (bare, labelled, settled, untainted) =
            (leak(bare), leak(labelled), leak(settled), leak(untainted));
        let (empty, other_cloud, unsupported, unknown) = (
            leak(empty),
            leak(other_cloud),
            leak(unsupported),
            leak(unknown),
        );
        let (settling_too_long, past_timeout) = (leak(settling_too_long), leak(past_timeout));
        let (fargate, hybrid, malformed, said_not_described) = (
            leak(fargate),
            leak(hybrid),
            leak(malformed),
            leak(said_not_described),
        );
        let condition_only = Gate {
            taint: None,
            ..gate(WhenUnsupported::Release, None)
        };
        let skipped = |n, why| facts(n, Answer::Assessed(Assessment::Skipped(why)));
        let throttled: &'static Error = Box::leak(Box::new(throttled));
        let denied: &'static Error = Box::leak(Box::new(denied));
        let api: &'static Error = Box::leak(Box::new(api));
        let hold = |first| Verdict::Hold {
            until: at + Duration::from_secs(300),
            first,
        };

        let rows: Vec<(&str, Facts<'static>, &Gate, Option<Duration>, &str)> = vec![
            // Skipped: each reason a providerID is not looked up.
            (
                "skipped, a Fargate pod-node",
                skipped(fargate, SkipReason::Fargate),
                &release,
                None,
                "skipped/fargate | TopologySkipped | - | - | False/Skipped | release unsupported | change",
            ),
            (
                "skipped, a Hybrid node",
                skipped(hybrid, SkipReason::Hybrid),
                &release,
                None,
                "skipped/hybrid | TopologySkipped | - | - | False/Skipped | release unsupported | change",
            ),
            (
                "skipped, a malformed providerID",
                skipped(malformed, SkipReason::Malformed),
                &release,
                None,
                "skipped/malformed_provider_id | TopologySkipped | - | - | False/Skipped | release unsupported | change",
            ),
            (
                "a first reconcile says where the node stands",
                after(facts(bare, not_described(60)), NodeState::Pending),
                &release,
                None,
                "not_described/not_described_yet | TopologyNotDescribed | - | - | False/NotDescribed | keep 110s | 60005ms",
            ),
            (
                "not described, the condition says so already",
                after(
                    facts(said_not_described, not_described(60)),
                    NodeState::NotDescribed(NotDescribed::NotYet),
                ),
                &release,
                None,
                "not_described/not_described_yet | - | - | - | = | none | 60005ms",
            ),
            (
                "EC2 refuses our credentials still: said once",
                after(
                    facts(bare, Answer::Failed(denied)),
                    NodeState::Failing("ec2_unauthorized"),
                ),
                &release,
                None,
                "failing/ec2_unauthorized | - | - | - | False/Unauthorized | keep | change",
            ),
            (
                "credentials refused, then EC2 throttles: said",
                after(
                    facts(bare, Answer::Failed(throttled)),
                    NodeState::Failing("ec2_unauthorized"),
                ),
                &release,
                None,
                "failing/ec2_throttled | TopologyLabelingFailed | - | - | False/Ec2Unavailable | keep | change",
            ),
            (
                "the condition without a taint",
                facts(bare, Answer::Assessed(ready(bare, "nn-3", None))),
                &condition_only,
                None,
                "labelled/ | TopologyLabelsUpdated | first | 1 | True/Labelled | none | change",
            ),
            (
                "skipped, no providerID yet",
                facts(
                    empty,
                    Answer::Assessed(Assessment::Skipped(SkipReason::Empty)),
                ),
                &release,
                None,
                "skipped/empty_provider_id | TopologySkipped | - | - | False/Skipped | keep | change",
            ),
            (
                "skipped, another cloud",
                facts(
                    other_cloud,
                    Answer::Assessed(Assessment::Skipped(SkipReason::OtherCloud)),
                ),
                &release,
                None,
                "skipped/other_cloud | TopologySkipped | - | - | False/Skipped | release unsupported | change",
            ),
            (
                "skipped, another cloud, kept by policy",
                facts(
                    other_cloud,
                    Answer::Assessed(Assessment::Skipped(SkipReason::OtherCloud)),
                ),
                &keep,
                None,
                "skipped/other_cloud | TopologySkipped | - | - | False/Skipped | keep 590s | 590100ms",
            ),
            (
                "skipped again: said once",
                after(
                    facts(
                        other_cloud,
                        Answer::Assessed(Assessment::Skipped(SkipReason::OtherCloud)),
                    ),
                    NodeState::Skipped("other_cloud"),
                ),
                &release,
                None,
                "skipped/other_cloud | - | - | - | False/Skipped | release unsupported | change",
            ),
            // Not described: an unsupported type, a type still settling, a type not known yet.
            (
                "not described, unsupported type",
                facts(unsupported, not_described(60)),
                &release,
                None,
                "not_described/unsupported_instance_type | TopologyNotDescribed | - | - | False/NotDescribed | release unsupported | 60005ms",
            ),
            (
                "not described, a described type settling",
                facts(bare, not_described(60)),
                &release,
                None,
                "not_described/not_described_yet | TopologyNotDescribed | - | - | False/NotDescribed | keep 110s | 60005ms",
            ),
            (
                "not described, type not known yet",
                facts(unknown, not_described(300)),
                &release,
                None,
                "not_described/not_described_yet | TopologyNotDescribed | - | - | False/NotDescribed | keep 110s | 110100ms",
            ),
            (
                "not described past the settling time",
                facts(settling_too_long, not_described(60)),
                &release,
                None,
                "not_described/not_described_yet | TopologyNotDescribed | - | - | False/NotDescribed | release unsupported | 60005ms",
            ),
            (
                "not described, kept by policy until the timeout",
                facts(bare, not_described(60)),
                &keep,
                None,
                "not_described/not_described_yet | TopologyNotDescribed | - | - | False/NotDescribed | keep 590s | 60005ms",
            ),
            (
                "not described past the timeout",
                facts(past_timeout, not_described(60)),
                &keep,
                None,
                "not_described/not_described_yet | TopologyNotDescribed | - | - | False/NotDescribed | release timeout | 60005ms",
            ),
            (
                "not described, untainted",
                facts(untainted, not_described(60)),
                &release,
                None,
                "not_described/not_described_yet | TopologyNotDescribed | - | - | False/NotDescribed | none | 60005ms",
            ),
            // Refused, unusable.
            (
                "EC2 refuses the ID",
                facts(bare, rejected),
                &release,
                None,
                "rejected/invalid_instance_id | InstanceIdRejected | - | - | False/NotDescribed | keep | 30005ms",
            ),
            (
                "EC2's answer unusable",
                Facts {
                    unusable_retry_in: Duration::from_secs(45),
                    ..facts(bare, invalid)
                },
                &release,
                None,
                "failing/invalid_topology | TopologyInvalid | - | - | False/Ec2Unavailable | keep | 45005ms",
            ),
            // Ready: written, already right, awaited, held, settling.
            (
                "labels to write, the first",
                facts(bare, Answer::Assessed(ready(bare, "nn-3", None))),
                &release,
                None,
                "labelled/ | TopologyLabelsUpdated | first | 1 | True/Labelled | release labelled | change",
            ),
            (
                "labels to correct",
                facts(labelled, Answer::Assessed(ready(labelled, "nn-9", None))),
                &release,
                None,
                "labelled/ | TopologyLabelsUpdated | write | 1 | True/Labelled | release labelled | change",
            ),
            (
                "labels right, taint still up",
                facts(labelled, Answer::Assessed(ready(labelled, "nn-3", None))),
                &release,
                None,
                "labelled/ | - | seen | 1 | True/Labelled | release labelled | change",
            ),
            (
                "labels right, condition says so, untainted",
                facts(settled, Answer::Assessed(ready(settled, "nn-3", None))),
                &release,
                None,
                "labelled/ | - | seen | 1 | = | none | change",
            ),
            (
                "labels right, the cache behind our gate write",
                facts(labelled, Answer::Assessed(ready(labelled, "nn-3", None))),
                &release,
                Some(Duration::from_secs(1)),
                "labelled/ | - | seen | 1 | behind | behind | 1100ms",
            ),
            (
                "labels right, EC2's answer settling",
                facts(
                    settled,
                    Answer::Assessed(ready(settled, "nn-3", Some(Duration::from_secs(20)))),
                ),
                &release,
                None,
                "labelled/ | - | seen | 1 | = | none | 20005ms",
            ),
            (
                "our write awaited",
                Facts {
                    awaiting: true,
                    ..facts(bare, Answer::Assessed(ready(bare, "nn-3", None)))
                },
                &release,
                None,
                "labelled/ | - | - | - | - | - | change",
            ),
            (
                "another writer: the hold starts",
                Facts {
                    verdict: hold(true),
                    ..facts(labelled, Answer::Assessed(ready(labelled, "nn-9", None)))
                },
                &release,
                None,
                "conflict/other_writer | TopologyLabelConflict | - | - | n/a | keep | 300100ms",
            ),
            (
                "another writer: held still",
                Facts {
                    verdict: hold(false),
                    ..facts(labelled, Answer::Assessed(ready(labelled, "nn-9", None)))
                },
                &release,
                None,
                "conflict/other_writer | - | - | - | n/a | keep | 300100ms",
            ),
            // No answer.
            (
                "EC2 slower than the startup-taint timeout",
                facts(past_timeout, Answer::TimedOut),
                &keep,
                None,
                "- | - | - | - | False/Ec2Unavailable | release timeout | 1000ms",
            ),
            (
                "EC2 throttles",
                facts(bare, Answer::Failed(throttled)),
                &release,
                None,
                "failing/ec2_throttled | TopologyLabelingFailed | - | - | False/Ec2Unavailable | keep | change",
            ),
            (
                "EC2 throttles still: said once",
                after(
                    facts(bare, Answer::Failed(throttled)),
                    NodeState::Failing("ec2_timeout"),
                ),
                &release,
                None,
                "failing/ec2_throttled | - | - | - | False/Ec2Unavailable | keep | change",
            ),
            (
                "EC2 refuses our credentials",
                after(
                    facts(bare, Answer::Failed(denied)),
                    NodeState::Failing("ec2_throttled"),
                ),
                &release,
                None,
                "failing/ec2_unauthorized | Ec2AccessDenied | - | - | False/Unauthorized | keep | change",
            ),
            (
                "the API server fails the write",
                facts(bare, Answer::Failed(api)),
                &release,
                None,
                "failing/kube | TopologyLabelingFailed | - | - | - | - | change",
            ),
            (
                "the gate off",
                facts(bare, not_described(60)),
                &off,
                None,
                "not_described/not_described_yet | TopologyNotDescribed | - | - | off | off | 60005ms",
            ),
        ];
        let mut wrong = Vec::new();
        for (case, facts, gate, behind, want) in rows {
            let got = row(facts, gate, behind, &now);
            if got != want {
                wrong.push(format!("{case}:\n  want {want}\n  got  {got}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn a_note_says_what_was_decided() {
        let say = Say::NotDescribed {
            instance_id: "i-0123456789abcdef0".into(),
            why: NotDescribed::UnsupportedType,
            instance_type: Some("m5.large".into()),
            retry_in: Duration::from_secs(60),
        };
        assert_eq!(say.reason(), Reason::TopologyNotDescribed);
        assert_eq!(
            say.note(),
            "EC2 does not describe instance i-0123456789abcdef0: its instance type m5.large is not one EC2 describes network topology for; its labels are left as they are and EC2 is asked again in 60s (backoff up to --not-described-ttl)"
        );
    }
}

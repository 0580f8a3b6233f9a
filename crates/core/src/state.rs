//! Where a node stands, in the domain's words: why EC2 does not describe an instance, the
//! state the `nodes{state, reason}` gauge counts, and why a new leader does not trust a
//! verification record. Read by the reconcile (which decides them), `explain` and the metrics
//! (which count them).
//!
//! Owns: those verdicts and their names. A leaf: imports nothing of this crate but the
//! topology facts.

/// Why EC2 does not describe an instance, as far as we can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotDescribed {
    /// Its instance type is not one EC2 documents for `DescribeInstanceTopology`: it never will.
    UnsupportedType,
    /// A type EC2 describes (or one not known yet): the instance is new, not running, or EC2's
    /// answer has not caught up.
    NotYet,
}

impl NotDescribed {
    /// From the node's `node.kubernetes.io/instance-type` label (absent: not known yet, as
    /// right after registration, before the cloud controller sets it).
    pub fn of(instance_type: Option<&str>) -> Self {
        match instance_type {
            Some(t) if !t.is_empty() && !crate::topology::is_topology_type(t) => {
                NotDescribed::UnsupportedType
            }
            _ => NotDescribed::NotYet,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NotDescribed::UnsupportedType => "unsupported_instance_type",
            NotDescribed::NotYet => "not_described_yet",
        }
    }
}

/// Where a node stands, for the `nodes{state, reason}` gauge.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NodeState {
    /// Labels match EC2's answer.
    Labelled,
    /// EC2 does not describe the instance.
    NotDescribed(NotDescribed),
    /// EC2 refuses the instance ID (`InvalidInstanceID.*`).
    Rejected,
    /// Not an EC2 instance we can look up; the reason is `SkipReason::as_str`.
    Skipped(&'static str),
    /// Waiting for its first answer.
    Pending,
    /// The last attempt failed; the reason is the error's category (`Error::category`).
    Failing(&'static str),
    /// Another writer keeps changing our labels; writes are held.
    Conflict,
}

impl NodeState {
    /// The `state` label.
    pub fn name(&self) -> &'static str {
        match self {
            NodeState::Labelled => "labelled",
            NodeState::NotDescribed(_) => "not_described",
            NodeState::Rejected => "rejected",
            NodeState::Skipped(_) => "skipped",
            NodeState::Pending => "pending",
            NodeState::Failing(_) => "failing",
            NodeState::Conflict => "conflict",
        }
    }

    /// The `reason` label: why a node is in a state other than `labelled` or `pending`.
    pub fn reason(&self) -> &'static str {
        match self {
            NodeState::Labelled | NodeState::Pending => "",
            NodeState::NotDescribed(r) => r.as_str(),
            NodeState::Rejected => "invalid_instance_id",
            NodeState::Skipped(r) | NodeState::Failing(r) => r,
            NodeState::Conflict => "other_writer",
        }
    }
}

/// Why a new leader does not take a node's verification record as its answer (and asks EC2
/// about the instance at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distrust {
    /// The node carries no record (labelled before records, by another tool, or never).
    Missing,
    /// Not a record this build can read.
    Unreadable,
    /// A record of another format version.
    OtherVersion,
    /// The record does not match its sum: edited, or forged without the key.
    Tampered,
    /// Sealed with another key than this process holds (forged, or sealed before the key was
    /// rotated).
    OtherKey,
    /// This process holds no key (`--record-key-file`), so trusts no record.
    NoKey,
    /// About another instance than the node's providerID names.
    OtherInstance,
    /// About another boot: the node rebooted (maybe while no leader ran), and may have moved.
    OtherBoot,
    /// The node's labels are no longer what the record's answer makes of them (changed by
    /// someone else since, or under another label configuration).
    LabelsChanged,
    /// The record's answer lacks a field EC2 fills in late: it was still settling.
    Incomplete,
}

impl Distrust {
    pub const ALL: [Distrust; 10] = [
        Distrust::Missing,
        Distrust::Unreadable,
        Distrust::OtherVersion,
        Distrust::Tampered,
        Distrust::OtherKey,
        Distrust::NoKey,
        Distrust::OtherInstance,
        Distrust::OtherBoot,
        Distrust::LabelsChanged,
        Distrust::Incomplete,
    ];

    /// For `explain`.
    pub fn explain(self) -> &'static str {
        match self {
            Distrust::Missing => "the node carries no verification record",
            Distrust::Unreadable => "its verification record cannot be read",
            Distrust::OtherVersion => "its verification record is of another format version",
            Distrust::Tampered => {
                "its verification record does not match its sum (edited, or forged without the key)"
            }
            Distrust::OtherKey => {
                "its verification record is sealed with another key (forged, or sealed before the key was rotated)"
            }
            Distrust::NoKey => {
                "no record key is configured (--record-key-file): no record is trusted"
            }
            Distrust::OtherInstance => {
                "its verification record is about another instance than its providerID's"
            }
            Distrust::OtherBoot => {
                "its verification record is of another boot (or one of them is unknown)"
            }
            Distrust::LabelsChanged => {
                "its labels are not what its verification record's answer makes of them"
            }
            Distrust::Incomplete => "its verification record's answer was still settling",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Distrust::Missing => "missing",
            Distrust::Unreadable => "unreadable",
            Distrust::OtherVersion => "other_version",
            Distrust::Tampered => "tampered",
            Distrust::OtherKey => "other_key",
            Distrust::NoKey => "no_key",
            Distrust::OtherInstance => "other_instance",
            Distrust::OtherBoot => "other_boot",
            Distrust::LabelsChanged => "labels_changed",
            Distrust::Incomplete => "incomplete",
        }
    }
}

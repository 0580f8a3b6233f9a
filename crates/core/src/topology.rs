//! What EC2 says about an instance's place in the network, and the trait that hides where the
//! answer comes from (EC2's Query API in production, a fake in unit tests).

use std::future::Future;

/// One instance as `DescribeInstanceTopology` describes it, in our own terms.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceTopology {
    pub instance_id: String,
    pub instance_type: Option<String>,
    pub availability_zone: Option<String>,
    pub zone_id: Option<String>,
    /// Network nodes, top of the hierarchy first; the last is the switch the instance hangs off.
    pub network_nodes: Vec<String>,
    /// Placement group name.
    pub group_name: Option<String>,
    /// Set for UltraServer instances: names the UltraServer domain.
    pub capacity_block_id: Option<String>,
}

impl InstanceTopology {
    /// This answer, with the fields it leaves out taken from an earlier answer about the same
    /// instance in the same boot. EC2 is eventually consistent: an answer right after launch can
    /// lack `capacityBlockId` (documented) or another field a later one has; within one boot
    /// none of them can go away, so missing is "not known yet", never "none".
    pub fn filled_from(mut self, earlier: &InstanceTopology) -> Self {
        fn fill(field: &mut Option<String>, earlier: &Option<String>) {
            if field.as_deref().is_none_or(str::is_empty) {
                field.clone_from(earlier);
            }
        }
        fill(&mut self.instance_type, &earlier.instance_type);
        fill(&mut self.availability_zone, &earlier.availability_zone);
        fill(&mut self.zone_id, &earlier.zone_id);
        fill(&mut self.group_name, &earlier.group_name);
        fill(&mut self.capacity_block_id, &earlier.capacity_block_id);
        self
    }

    /// Whether this answer may still be settling: a field EC2 fills in late is missing where it
    /// is expected (the capacity block of an UltraServer-class instance, or of an instance whose
    /// node already carries that label; the zone ID of any instance). Such an answer is asked
    /// for again on a short schedule until the field appears.
    pub fn settling(&self, capacity_block_expected: bool) -> bool {
        let missing = |f: &Option<String>| f.as_deref().is_none_or(str::is_empty);
        let ultra = self
            .instance_type
            .as_deref()
            .is_none_or(is_ultraserver_type);
        (missing(&self.capacity_block_id) && (ultra || capacity_block_expected))
            || missing(&self.zone_id)
    }
}

/// Instance families that run in UltraServers, whose instances EC2 reports with a
/// `capacityBlockId` naming the UltraServer domain (P6e-GB200, P6e-GB300, Trn2 UltraServers).
pub const ULTRASERVER_FAMILIES: &[&str] = &["p6e-gb200", "p6e-gb300", "trn2u"];

/// Whether `instance_type` (`p6e-gb200.36xlarge`) belongs to an UltraServer family.
pub fn is_ultraserver_type(instance_type: &str) -> bool {
    let family = instance_type.split('.').next().unwrap_or_default();
    ULTRASERVER_FAMILIES.contains(&family)
}

/// Instance families EC2 documents as described by `DescribeInstanceTopology` (the AWS EC2 User
/// Guide, "Prerequisites for Amazon EC2 topology"; the list grows). Used only to tell a
/// supported instance EC2 has not described *yet* (eventual consistency just after launch)
/// from one it never will: an instance of a family not listed here is labelled all the same
/// when EC2 describes it.
pub const TOPOLOGY_FAMILIES: &[&str] = &[
    "g6e",
    "g7e",
    "hpc6a",
    "hpc6id",
    "hpc7a",
    "hpc7g",
    "hpc8a",
    "p3dn",
    "p4d",
    "p4de",
    "p5",
    "p5e",
    "p5en",
    "p6-b200",
    "p6-b300",
    "p6e-gb200",
    "p6e-gb300",
    "trn1",
    "trn1n",
    "trn2",
    "trn2u",
];

/// Whether EC2 documents `instance_type` (`p5.48xlarge`) as one it describes.
pub fn is_topology_type(instance_type: &str) -> bool {
    let family = instance_type.split('.').next().unwrap_or_default();
    TOPOLOGY_FAMILIES.contains(&family)
}

/// A failed `DescribeInstanceTopology` call, classified by what the caller should do about it.
///
/// Cloneable because one answer fans out to every node waiting in the batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ec2Error {
    /// `RequestLimitExceeded`: slow down (every caller, through the shared limiter).
    #[error("EC2 throttled the request ({code}): {message}")]
    Throttled { code: String, message: String },
    /// The credentials lack `ec2:DescribeInstanceTopology`, or EC2 does not accept them (unknown,
    /// expired, badly signed), or the SDK could not get any.
    #[error(
        "EC2 refused the controller's credentials ({code}): {message}; the IAM role (IRSA or EKS Pod Identity) must allow ec2:DescribeInstanceTopology and its credentials must be valid"
    )]
    Unauthorized { code: String, message: String },
    /// The region does not offer the API.
    #[error("EC2 does not support DescribeInstanceTopology here ({code}): {message}")]
    UnsupportedOperation { code: String, message: String },
    /// EC2 rejected what we sent (a bug on our side, or an ID EC2 does not accept).
    #[error("EC2 rejected the request ({code}): {message}")]
    InvalidRequest { code: String, message: String },
    /// EC2 answered with a server-side error.
    #[error("EC2 failed ({code}): {message}")]
    Service { code: String, message: String },
    /// No answer in time.
    #[error("EC2 call timed out: {0}")]
    Timeout(String),
    /// No connection, or the connection broke.
    #[error("could not reach EC2: {0}")]
    Transport(String),
    /// An answer we could not parse (malformed or truncated XML).
    #[error("could not parse EC2's answer: {0}")]
    BadResponse(String),
    /// No region could be determined for the instance.
    #[error(
        "no AWS region for this instance: set --region (AWS_REGION) or a providerID with a zone"
    )]
    NoRegion,
}

impl Ec2Error {
    /// Stable category, used as a metric label and in logs.
    pub fn category(&self) -> &'static str {
        match self {
            Ec2Error::Throttled { .. } => "throttled",
            Ec2Error::Unauthorized { .. } => "unauthorized",
            Ec2Error::UnsupportedOperation { .. } => "unsupported_operation",
            Ec2Error::InvalidRequest { .. } => "invalid_request",
            Ec2Error::Service { .. } => "service",
            Ec2Error::Timeout(_) => "timeout",
            Ec2Error::Transport(_) => "transport",
            Ec2Error::BadResponse(_) => "bad_response",
            Ec2Error::NoRegion => "no_region",
        }
    }

    pub fn is_throttle(&self) -> bool {
        matches!(self, Ec2Error::Throttled { .. })
    }

    /// Errors an operator must fix (permissions, region): retrying soon will not help.
    pub fn needs_operator(&self) -> bool {
        matches!(
            self,
            Ec2Error::Unauthorized { .. }
                | Ec2Error::UnsupportedOperation { .. }
                | Ec2Error::NoRegion
        )
    }

    /// EC2 refused an instance ID of the call (`InvalidInstanceID.Malformed`, `.NotFound`, …):
    /// the whole call fails for it, so the batch must be split to find which.
    pub fn is_instance_id_error(&self) -> bool {
        matches!(self, Ec2Error::InvalidRequest { code, .. } if code.starts_with("InvalidInstanceID"))
    }

    /// Whether the error's message names `instance_id` (EC2 does: `Invalid id: "i-…"`, `The
    /// instance ID 'i-…' does not exist`). A whole-word match: `i-1234abcd` is not named by
    /// `i-1234abcd00000000f`.
    pub fn names_instance(&self, instance_id: &str) -> bool {
        let Ec2Error::InvalidRequest { message, .. } = self else {
            return false;
        };
        message.match_indices(instance_id).any(|(at, m)| {
            let after = message[at + m.len()..].bytes().next();
            let before = message[..at].bytes().next_back();
            !after.is_some_and(|b| b.is_ascii_alphanumeric())
                && !before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
    }

    /// Map an EC2 error code to its class.
    pub fn from_code(code: &str, message: &str) -> Self {
        let (code, message) = (code.to_string(), message.to_string());
        match code.as_str() {
            "RequestLimitExceeded" | "Throttling" | "ThrottlingException" | "RequestThrottled" => {
                Ec2Error::Throttled { code, message }
            }
            // Denied, or credentials EC2 does not accept (unknown, expired, badly signed): the
            // operator's to fix (IAM role, IRSA / Pod Identity set-up, clock).
            "UnauthorizedOperation"
            | "AuthFailure"
            | "AccessDenied"
            | "AccessDeniedException"
            | "NotAuthorized"
            | "Blocked"
            | "OptInRequired"
            | "ExpiredToken"
            | "ExpiredTokenException"
            | "RequestExpired"
            | "InvalidClientTokenId"
            | "UnrecognizedClientException"
            | "MissingAuthenticationToken"
            | "IncompleteSignature"
            | "SignatureDoesNotMatch" => Ec2Error::Unauthorized { code, message },
            "UnsupportedOperation" | "InvalidAction" => {
                Ec2Error::UnsupportedOperation { code, message }
            }
            c if c.starts_with("Invalid") || c.starts_with("Missing") => {
                Ec2Error::InvalidRequest { code, message }
            }
            _ => Ec2Error::Service { code, message },
        }
    }
}

/// Where topology answers come from. One call describes up to 100 instances of one region;
/// instances EC2 does not describe are simply absent from the result.
pub trait TopologySource: Send + Sync + 'static {
    fn describe(
        &self,
        region: &str,
        instance_ids: &[String],
    ) -> impl Future<Output = Result<Vec<InstanceTopology>, Ec2Error>> + Send;
}

/// At most this many `InstanceId.N` per call (an EC2 limit).
pub const MAX_IDS_PER_CALL: usize = 100;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_map_to_classes() {
        assert!(Ec2Error::from_code("RequestLimitExceeded", "").is_throttle());
        assert!(Ec2Error::from_code("UnauthorizedOperation", "").needs_operator());
        assert!(Ec2Error::from_code("UnsupportedOperation", "").needs_operator());
        assert_eq!(
            Ec2Error::from_code("InvalidInstanceID.Malformed", "").category(),
            "invalid_request"
        );
        assert_eq!(
            Ec2Error::from_code("InternalError", "").category(),
            "service"
        );
    }

    fn answer(ty: Option<&str>, cb: Option<&str>, zone: Option<&str>) -> InstanceTopology {
        InstanceTopology {
            instance_id: "i-0123456789abcdef0".into(),
            instance_type: ty.map(Into::into),
            zone_id: zone.map(Into::into),
            capacity_block_id: cb.map(Into::into),
            network_nodes: vec!["nn-a".into(), "nn-b".into(), "nn-c".into()],
            ..InstanceTopology::default()
        }
    }

    #[test]
    fn an_answer_missing_a_late_field_is_settling() {
        let gb200 = Some("p6e-gb200.36xlarge");
        let zone = Some("usw2-az1");
        assert!(
            answer(gb200, None, zone).settling(false),
            "UltraServer without capacity block"
        );
        assert!(!answer(gb200, Some("cr-1"), zone).settling(false));
        assert!(
            !answer(Some("p5.48xlarge"), None, zone).settling(false),
            "no capacity block expected"
        );
        assert!(
            answer(Some("p5.48xlarge"), None, zone).settling(true),
            "the node carries the label"
        );
        assert!(
            answer(None, None, zone).settling(false),
            "type unknown: it may be one"
        );
        assert!(
            answer(Some("p5.48xlarge"), None, None).settling(false),
            "zone ID missing"
        );
        assert!(is_ultraserver_type("trn2u.48xlarge") && !is_ultraserver_type("trn2.48xlarge"));
        assert!(is_topology_type("p5.48xlarge") && is_topology_type("p6-b200.48xlarge"));
        assert!(!is_topology_type("m5.large") && !is_topology_type(""));
    }

    #[test]
    fn fields_left_out_later_in_a_boot_are_taken_from_the_earlier_answer() {
        let first = answer(Some("p6e-gb200.36xlarge"), Some("cr-1"), Some("usw2-az1"));
        let late = answer(None, None, Some(""));
        let filled = late.filled_from(&first);
        assert_eq!(filled.capacity_block_id.as_deref(), Some("cr-1"));
        assert_eq!(filled.zone_id.as_deref(), Some("usw2-az1"));
        assert_eq!(filled.instance_type.as_deref(), Some("p6e-gb200.36xlarge"));
        let moved = answer(None, Some("cr-2"), None).filled_from(&first);
        assert_eq!(
            moved.capacity_block_id.as_deref(),
            Some("cr-2"),
            "a new value wins"
        );
    }

    #[test]
    fn refused_ids_are_found_in_ec2s_messages() {
        let one = Ec2Error::from_code(
            "InvalidInstanceID.NotFound",
            "The instance ID 'i-0123456789abcdef0' does not exist",
        );
        assert!(one.is_instance_id_error());
        assert!(one.names_instance("i-0123456789abcdef0"));
        assert!(!one.names_instance("i-0123456789abcdef1"));
        assert!(!one.names_instance("i-01234567"), "a prefix is not a name");
        let many = Ec2Error::from_code(
            "InvalidInstanceID.NotFound",
            "The instance IDs 'i-0123456789abcdef0, i-1234abcd' do not exist",
        );
        assert!(many.names_instance("i-1234abcd") && many.names_instance("i-0123456789abcdef0"));
        let malformed = Ec2Error::from_code(
            "InvalidInstanceID.Malformed",
            "Invalid id: \"i-0123456789abcdef\" (expecting \"i-...\")",
        );
        assert!(malformed.is_instance_id_error());
        assert!(malformed.names_instance("i-0123456789abcdef"));
        assert!(!Ec2Error::from_code("InvalidParameterValue", "i-1234abcd").is_instance_id_error());
        assert!(
            !Ec2Error::from_code("RequestLimitExceeded", "i-1234abcd").names_instance("i-1234abcd")
        );
    }

    #[test]
    fn unauthorized_message_names_the_permission() {
        let e = Ec2Error::from_code("UnauthorizedOperation", "not authorized");
        assert!(e.to_string().contains("ec2:DescribeInstanceTopology"));
        for code in [
            "AuthFailure",
            "ExpiredToken",
            "RequestExpired",
            "InvalidClientTokenId",
            "MissingAuthenticationToken",
            "SignatureDoesNotMatch",
        ] {
            assert!(
                matches!(Ec2Error::from_code(code, ""), Ec2Error::Unauthorized { .. }),
                "{code} is about the credentials, not the request"
            );
        }
        assert!(matches!(
            Ec2Error::from_code("InvalidInstanceID.Malformed", ""),
            Ec2Error::InvalidRequest { .. }
        ));
    }
}

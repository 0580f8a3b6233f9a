//! What EC2 says about an instance's place in the network, and the trait that hides where the
//! answer comes from (the AWS SDK in production, a fake in unit tests).

use std::future::Future;

/// One instance as `DescribeInstanceTopology` describes it, in our own terms.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
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

/// A failed `DescribeInstanceTopology` call, classified by what the caller should do about it.
///
/// Cloneable because one answer fans out to every node waiting in the batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Ec2Error {
    /// `RequestLimitExceeded`: slow down (every caller, through the shared limiter).
    #[error("EC2 throttled the request ({code}): {message}")]
    Throttled { code: String, message: String },
    /// The credentials lack `ec2:DescribeInstanceTopology`.
    #[error(
        "EC2 refused the call ({code}): the controller's IAM role needs ec2:DescribeInstanceTopology: {message}"
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

    /// Map an EC2 error code to its class.
    pub fn from_code(code: &str, message: &str) -> Self {
        let (code, message) = (code.to_string(), message.to_string());
        match code.as_str() {
            "RequestLimitExceeded" | "Throttling" | "ThrottlingException" | "RequestThrottled" => {
                Ec2Error::Throttled { code, message }
            }
            "UnauthorizedOperation"
            | "AuthFailure"
            | "AccessDenied"
            | "AccessDeniedException"
            | "Blocked"
            | "OptInRequired" => Ec2Error::Unauthorized { code, message },
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

    #[test]
    fn unauthorized_message_names_the_permission() {
        let e = Ec2Error::from_code("UnauthorizedOperation", "not authorized");
        assert!(e.to_string().contains("ec2:DescribeInstanceTopology"));
    }
}

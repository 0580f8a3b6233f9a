//! A stand-in for the EKS Auth API's `AssumeRoleForPodIdentity` (REST-JSON,
//! `POST /clusters/{clusterName}/assume-role-for-pod-identity`), the call the EKS Pod Identity
//! Agent on each node makes with the token a pod sent it: the token (audience
//! `pods.eks.amazonaws.com`) is verified against the cluster, the pod's ServiceAccount looked up
//! among the Pod Identity associations, and temporary credentials for the associated role handed
//! out. The stand-in agent ([`crate::agent`]) calls it.
//!
//! Errors as the API reference lists them: `InvalidTokenException`, `ExpiredTokenException`,
//! `AccessDeniedException`, `ResourceNotFoundException` (no association), `InvalidParameterException`.
//! The real API also requires the caller (the agent) to sign with the node's role; this one does
//! not (the agent has no AWS credentials here).

use axum::{
    Json,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::{MockEc2, oidc::TokenError, sts::role_id};

pub const AUDIENCE: &str = "pods.eks.amazonaws.com";
const ACTION: &str = "AssumeRoleForPodIdentity";

#[derive(Deserialize)]
pub struct AssumeRoleForPodIdentityRequest {
    #[serde(default)]
    token: String,
}

/// The API's response (camelCase, expiration in epoch seconds), also what the agent reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssumeRoleForPodIdentityResponse {
    pub subject: Subject,
    pub audience: String,
    pub pod_identity_association: Association,
    pub assumed_role_user: AssumedRoleUser,
    pub credentials: PodCredentials,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    pub namespace: String,
    pub service_account: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Association {
    pub association_arn: String,
    pub association_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AssumedRoleUser {
    pub arn: String,
    pub assume_role_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: String,
    /// Epoch seconds.
    pub expiration: u64,
}

struct EksAuthError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl EksAuthError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn injected(code: &str) -> Self {
        match code {
            "InvalidIdentityToken" | "InvalidTokenException" => Self::new(
                StatusCode::BAD_REQUEST,
                "InvalidTokenException",
                "The token is not valid",
            ),
            "ExpiredTokenException" | "ExpiredToken" => Self::new(
                StatusCode::BAD_REQUEST,
                "ExpiredTokenException",
                "The token has expired",
            ),
            _ => Self::new(
                StatusCode::BAD_REQUEST,
                "AccessDeniedException",
                format!("Not authorized to perform eks-auth:{ACTION}"),
            ),
        }
    }

    /// REST-JSON errors: the code in `x-amzn-ErrorType`, the message in the body.
    fn response(&self) -> Response {
        (
            self.status,
            [("x-amzn-ErrorType", self.code)],
            Json(json!({ "message": self.message })),
        )
            .into_response()
    }
}

/// `[0-9A-Za-z][A-Za-z0-9\-_]*`, 1 to 100 characters.
fn valid_cluster_name(s: &str) -> bool {
    (1..=100).contains(&s.len())
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Three base64url parts separated by dots.
fn looks_like_jwt(s: &str) -> bool {
    let parts: Vec<&str> = s.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_=".contains(&b))
        })
}

pub(crate) async fn assume_role_for_pod_identity(
    State(mock): State<MockEc2>,
    Path(cluster): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let (outcome, response) = match exchange(&mock, &cluster, &body).await {
        Ok(answer) => ("ok".to_string(), Json(answer).into_response()),
        Err(e) => (e.code.to_string(), e.response()),
    };
    *mock
        .registry()
        .stats
        .pod_identity
        .entry(outcome)
        .or_default() += 1;
    response
}

async fn exchange(
    mock: &MockEc2,
    cluster: &str,
    body: &[u8],
) -> Result<AssumeRoleForPodIdentityResponse, EksAuthError> {
    let invalid =
        |m: &str| EksAuthError::new(StatusCode::BAD_REQUEST, "InvalidParameterException", m);
    if !valid_cluster_name(cluster) {
        return Err(invalid("The cluster name is not valid"));
    }
    let request: AssumeRoleForPodIdentityRequest =
        serde_json::from_slice(body).map_err(|e| invalid(&format!("Invalid request body: {e}")))?;
    if !looks_like_jwt(&request.token) {
        return Err(invalid("The token is not a valid JWT"));
    }
    if let Some(code) = mock.registry().config.refuse_assume_role.clone() {
        return Err(EksAuthError::injected(&code));
    }
    let claims = mock
        .issuer()
        .verify(&request.token, AUDIENCE)
        .await
        .map_err(|e| match e {
            TokenError::Expired(_) => EksAuthError::new(
                StatusCode::BAD_REQUEST,
                "ExpiredTokenException",
                e.to_string(),
            ),
            TokenError::Unreachable(_) => EksAuthError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailableException",
                e.to_string(),
            ),
            TokenError::Malformed(_) | TokenError::Invalid(_) => EksAuthError::new(
                StatusCode::BAD_REQUEST,
                "InvalidTokenException",
                e.to_string(),
            ),
        })?;
    let (namespace, service_account) = claims.service_account().ok_or_else(|| {
        EksAuthError::new(
            StatusCode::BAD_REQUEST,
            "InvalidTokenException",
            "The token's subject is not a service account",
        )
    })?;
    let mut registry = mock.registry();
    let role_arn = registry
        .config
        .pod_identity_associations
        .iter()
        .find(|a| a.namespace == namespace && a.service_account == service_account)
        .map(|a| a.role_arn.clone())
        .ok_or_else(|| {
            EksAuthError::new(
                StatusCode::NOT_FOUND,
                "ResourceNotFoundException",
                format!(
                    "No Pod Identity association for service account {namespace}/{service_account} in cluster {cluster}"
                ),
            )
        })?;
    let seconds = registry.config.session_seconds.max(1);
    let c = registry.issue(ACTION, &role_arn, &claims.sub, seconds);
    drop(registry);
    let account = role_arn.split(':').nth(4).unwrap_or_default().to_string();
    let role_name = role_arn.rsplit('/').next().unwrap_or_default().to_string();
    let pod = claims
        .kubernetes
        .as_ref()
        .and_then(|k| k.pod.as_ref())
        .map(|p| p.name.clone())
        .unwrap_or_else(|| "pod".into());
    let session = format!("eks-{cluster}-{pod}");
    let session: String = session.chars().take(64).collect();
    let association_id = format!("a-{:017x}", fastrand::u64(..) >> 4);
    Ok(AssumeRoleForPodIdentityResponse {
        subject: Subject {
            namespace: namespace.to_string(),
            service_account: service_account.to_string(),
        },
        audience: AUDIENCE.into(),
        pod_identity_association: Association {
            association_arn: format!(
                "arn:aws:eks:us-west-2:{account}:podidentityassociation/{cluster}/{association_id}"
            ),
            association_id,
        },
        assumed_role_user: AssumedRoleUser {
            arn: format!("arn:aws:sts::{account}:assumed-role/{role_name}/{session}"),
            assume_role_id: format!("{}:{session}", role_id(&role_arn)),
        },
        credentials: PodCredentials {
            access_key_id: c.access_key_id,
            secret_access_key: c.secret_access_key,
            session_token: c.session_token,
            expiration: c.expires_at,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_tokens_are_checked_as_the_api_documents() {
        assert!(valid_cluster_name("ec2tl-e2e"));
        assert!(!valid_cluster_name("-starts-with-dash"));
        assert!(!valid_cluster_name(""));
        assert!(looks_like_jwt("eyJh.eyJi.c2ln"));
        assert!(!looks_like_jwt("eyJh.eyJi"));
        assert!(!looks_like_jwt("a.b.c d"));
    }
}

//! Credentials as EKS gives them to the controller's pod, for the e2e and kind suites: the
//! environment EKS's webhook injects for IRSA and for EKS Pod Identity, the projected
//! service-account tokens (minted here with the TokenRequest API where no kubelet projects
//! them), the mock's stand-in STS / EKS Auth configured to trust exactly the controller's
//! ServiceAccount, and the check that EC2 saw only calls signed with what they handed out.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::ensure;
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::ServiceAccount,
};
use kube::{Api, Client, api::PostParams};
use mock_ec2::{AuthConfig, PodIdentityAssociation, Role, StaticCredential};

use crate::{
    cluster::{NAMESPACE, SERVICE_ACCOUNT},
    labeler::{STATIC_ACCESS_KEY_ID, STATIC_SECRET_ACCESS_KEY},
    mock::MockAdmin,
};

/// The role the controller assumes (IRSA) or is associated with (Pod Identity).
pub const ROLE_ARN: &str = "arn:aws:iam::111122223333:role/ec2-topology-labeler";
/// The audience of an IRSA token (the pod identity webhook's default).
pub const STS_AUDIENCE: &str = "sts.amazonaws.com";
/// The audience of an EKS Pod Identity token.
pub const POD_IDENTITY_AUDIENCE: &str = "pods.eks.amazonaws.com";
/// Where EKS mounts them.
pub const IRSA_TOKEN_DIR: &str = "/var/run/secrets/eks.amazonaws.com/serviceaccount";
pub const POD_IDENTITY_TOKEN_DIR: &str = "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount";
pub const POD_IDENTITY_TOKEN_FILE: &str = "eks-pod-identity-token";
/// Who answers AssumeRoleWithWebIdentity / AssumeRoleForPodIdentity in the mock.
pub const BY_WEB_IDENTITY: &str = "AssumeRoleWithWebIdentity";
pub const BY_POD_IDENTITY: &str = "AssumeRoleForPodIdentity";

/// `system:serviceaccount:<ns>:<sa>` of the controller.
pub fn subject() -> String {
    format!("system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}")
}

/// The mock verifying every EC2 call's signature; STS trusting the controller's ServiceAccount
/// for [`ROLE_ARN`], EKS Auth associating it with that role; credentials valid
/// `session_seconds`. The dummy static keys stay valid for the rest of the suite.
pub fn auth_config(session_seconds: u64) -> AuthConfig {
    AuthConfig {
        verify_signatures: true,
        static_credentials: vec![StaticCredential {
            access_key_id: STATIC_ACCESS_KEY_ID.into(),
            secret_access_key: STATIC_SECRET_ACCESS_KEY.into(),
        }],
        roles: vec![Role {
            arn: ROLE_ARN.into(),
            web_identity_subjects: vec![subject()],
        }],
        pod_identity_associations: vec![PodIdentityAssociation {
            namespace: NAMESPACE.into(),
            service_account: SERVICE_ACCOUNT.into(),
            role_arn: ROLE_ARN.into(),
        }],
        session_seconds,
        refuse_assume_role: None,
    }
}

/// A token for `namespace/service_account` with `audience`, as the kubelet projects one
/// (TokenRequest; the API server's minimum lifetime is 10 minutes).
pub async fn mint_token(
    client: &Client,
    namespace: &str,
    service_account: &str,
    audience: &str,
) -> anyhow::Result<String> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_string()],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = api
        .create_token_request(service_account, &PostParams::default(), &request)
        .await?;
    answer
        .status
        .map(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| anyhow::anyhow!("the API server returned no token"))
}

/// What EC2 saw, judged against what the stand-ins handed out.
#[derive(Debug)]
pub struct Signed {
    /// Distinct access keys the calls were signed with.
    pub keys: usize,
    /// Calls signed.
    pub calls: u64,
    /// Credentials `issued_by` handed out to the controller.
    pub issued: usize,
}

/// Every EC2 call the mock saw since its stats were reset was signed with a credential that
/// `issued_by` (STS or EKS Auth) handed to the controller's ServiceAccount for [`ROLE_ARN`], at
/// least `min_keys` distinct ones, and none was refused (an expired, unknown or badly signed
/// credential would have been: the mock verifies).
pub async fn check_signed_by(
    mock: &MockAdmin,
    issued_by: &str,
    min_keys: usize,
) -> anyhow::Result<Signed> {
    let stats = mock.stats().await?;
    let creds = mock.credentials().await?;
    ensure!(
        stats.auth_refused.is_empty(),
        "EC2 refused calls for their credentials: {:?}",
        stats.auth_refused
    );
    let ours: BTreeSet<&str> = creds
        .issued
        .iter()
        .filter(|c| c.issued_by == issued_by && c.subject == subject() && c.role_arn == ROLE_ARN)
        .map(|c| c.access_key_id.as_str())
        .collect();
    let strangers: BTreeMap<&String, &u64> = stats
        .signed_by
        .iter()
        .filter(|(k, _)| !ours.contains(k.as_str()))
        .collect();
    ensure!(
        strangers.is_empty(),
        "calls signed with keys {issued_by} did not hand to {}: {strangers:?}",
        subject()
    );
    ensure!(
        stats.signed_by.len() >= min_keys,
        "calls were signed with {} distinct keys, expected at least {min_keys} ({} handed out): {:?}",
        stats.signed_by.len(),
        ours.len(),
        stats.signed_by
    );
    let calls: u64 = stats.signed_by.values().sum();
    ensure!(
        calls == stats.calls,
        "{} calls, {calls} of them signed",
        stats.calls
    );
    Ok(Signed {
        keys: stats.signed_by.len(),
        calls,
        issued: ours.len(),
    })
}

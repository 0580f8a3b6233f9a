//! Service-account tokens checked the way STS and EKS Auth check them: signature against the
//! cluster's published keys (OIDC discovery: the issuer in `/.well-known/openid-configuration`,
//! the keys at `/openid/v1/jwks`), issuer, audience, expiry. AWS fetches the issuer's discovery
//! document from the issuer URL; a test cluster's issuer (`https://kubernetes.default.svc…`) is
//! not reachable from here, so the same two documents are read through the API server, which
//! serves them (ServiceAccountIssuerDiscovery, readable by every ServiceAccount).
//!
//! The cluster is found as any client finds it: `KUBECONFIG`, or the pod's own ServiceAccount.
//! Documents are fetched for every token (a test double: a few requests a minute), so key
//! rotation needs no cache invalidation.

use jsonwebtoken::{Algorithm, DecodingKey, Validation, jwk::JwkSet};
use serde::Deserialize;
use tokio::sync::OnceCell;

/// What a Kubernetes service-account token says about its bearer.
#[derive(Debug, Clone, Deserialize)]
pub struct Claims {
    pub iss: String,
    /// `system:serviceaccount:<namespace>:<name>`
    pub sub: String,
    #[serde(default)]
    pub exp: u64,
    #[serde(rename = "kubernetes.io", default)]
    pub kubernetes: Option<KubernetesClaims>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct KubernetesClaims {
    pub namespace: String,
    pub serviceaccount: NamedObject,
    #[serde(default)]
    pub pod: Option<NamedObject>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct NamedObject {
    pub name: String,
    #[serde(default)]
    pub uid: String,
}

impl Claims {
    /// (namespace, service account) from the `sub` claim.
    pub fn service_account(&self) -> Option<(&str, &str)> {
        let rest = self.sub.strip_prefix("system:serviceaccount:")?;
        rest.split_once(':')
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("{0}")]
    Malformed(String),
    #[error("Token expired: {0}")]
    Expired(String),
    #[error("{0}")]
    Invalid(String),
    /// The issuer's keys could not be read (AWS: `IDPCommunicationError`).
    #[error("Couldn't retrieve verification key from your identity provider: {0}")]
    Unreachable(String),
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
}

/// The cluster whose tokens are checked, connected on first use.
#[derive(Default)]
pub struct ClusterIssuer {
    client: OnceCell<kube::Client>,
}

impl ClusterIssuer {
    async fn client(&self) -> Result<kube::Client, TokenError> {
        self.client
            .get_or_try_init(|| async {
                let config = kube::Config::infer()
                    .await
                    .map_err(|e| TokenError::Unreachable(format!("no cluster configured: {e}")))?;
                kube::Client::try_from(config).map_err(|e| TokenError::Unreachable(e.to_string()))
            })
            .await
            .cloned()
    }

    async fn get(&self, path: &str) -> Result<String, TokenError> {
        let request = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| TokenError::Unreachable(e.to_string()))?;
        self.client()
            .await?
            .request_text(request)
            .await
            .map_err(|e| TokenError::Unreachable(format!("{path}: {e}")))
    }

    /// Verify `token` for `audience`; its claims when the cluster signed it, for that audience,
    /// and it has not expired.
    pub async fn verify(&self, token: &str, audience: &str) -> Result<Claims, TokenError> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| TokenError::Malformed(format!("the token is not a JWT: {e}")))?;
        if !matches!(header.alg, Algorithm::RS256 | Algorithm::ES256) {
            return Err(TokenError::Invalid(format!(
                "unsupported signing algorithm {:?}",
                header.alg
            )));
        }
        let discovery: Discovery =
            serde_json::from_str(&self.get("/.well-known/openid-configuration").await?)
                .map_err(|e| TokenError::Unreachable(format!("discovery document: {e}")))?;
        let keys: JwkSet = serde_json::from_str(&self.get("/openid/v1/jwks").await?)
            .map_err(|e| TokenError::Unreachable(format!("JWKS: {e}")))?;
        let candidates: Vec<_> = keys
            .keys
            .iter()
            .filter(|k| header.kid.is_none() || k.common.key_id == header.kid)
            .collect();
        if candidates.is_empty() {
            return Err(TokenError::Invalid(
                "no key of the issuer matches the token's key ID".into(),
            ));
        }
        let mut validation = Validation::new(header.alg);
        validation.set_audience(&[audience]);
        validation.set_issuer(&[discovery.issuer.as_str()]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = 0;
        let mut last = TokenError::Invalid("no key verified the token".into());
        for jwk in candidates {
            let key = DecodingKey::from_jwk(jwk)
                .map_err(|e| TokenError::Unreachable(format!("unusable key: {e}")))?;
            match jsonwebtoken::decode::<Claims>(token, &key, &validation) {
                Ok(data) => return Ok(data.claims),
                Err(e) => last = classify(e, audience),
            }
        }
        Err(last)
    }
}

fn classify(e: jsonwebtoken::errors::Error, audience: &str) -> TokenError {
    use jsonwebtoken::errors::ErrorKind;
    match e.kind() {
        ErrorKind::ExpiredSignature => TokenError::Expired(format!(
            "current date/time must be before the expiration date/time ({e})"
        )),
        ErrorKind::InvalidAudience => {
            TokenError::Invalid(format!("Incorrect token audience (expected {audience})"))
        }
        ErrorKind::InvalidIssuer => TokenError::Invalid("Issuer does not match".into()),
        ErrorKind::InvalidSignature => TokenError::Invalid("Invalid token signature".into()),
        ErrorKind::ImmatureSignature => TokenError::Invalid("Token not valid yet".into()),
        ErrorKind::MissingRequiredClaim(c) => {
            TokenError::Invalid(format!("The token has no {c} claim"))
        }
        _ => TokenError::Malformed(e.to_string()),
    }
}

//! Who may call EC2, judged as AWS judges it: Signature Version 4 recomputed with the AWS SDK's
//! own signer (`aws-sigv4`) for the credential the request names, the session token it must
//! carry, and the credential's expiry. The credentials are long-term keys the test configures and
//! the temporary ones the stand-in STS and EKS Auth hand out ([`crate::sts`],
//! [`crate::eks_auth`]).
//!
//! Verification is off by default (every other test signs with dummy keys, or not at all); what
//! the mock saw is recorded either way: calls per access key, refusals per error code.

use std::{
    collections::BTreeMap,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use aws_credential_types::Credentials;
use aws_sigv4::{
    http_request::{SignableBody, SignableRequest, SigningSettings, sign},
    sign::v4,
};
use aws_smithy_runtime_api::client::identity::Identity;
use aws_smithy_types::date_time::{DateTime, Format};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};

use crate::ApiError;

/// EC2 refuses a request whose date stamp is further than this from its own clock
/// (`RequestExpired`, EC2 API error codes).
const MAX_SKEW: Duration = Duration::from_secs(15 * 60);

/// STS's default session length, when the request names none.
pub const DEFAULT_SESSION_SECONDS: u64 = 3600;

/// What the mock accepts, set through `PUT /_admin/auth`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct AuthConfig {
    /// Refuse DescribeInstanceTopology calls that are not signed (SigV4) with a credential the
    /// mock knows, unexpired, with its session token, as EC2 does. Off: anything is accepted.
    pub verify_signatures: bool,
    /// Long-term keys accepted besides the temporary credentials the stand-ins hand out.
    pub static_credentials: Vec<StaticCredential>,
    /// IAM roles a web identity may assume through `AssumeRoleWithWebIdentity` (IRSA).
    pub roles: Vec<Role>,
    /// EKS Pod Identity associations (`AssumeRoleForPodIdentity`).
    pub pod_identity_associations: Vec<PodIdentityAssociation>,
    /// Lifetime of the credentials handed out when the request names none (STS: 3600 s; EKS
    /// Pod Identity: hours). Tests shorten it to see credentials rotate.
    pub session_seconds: u64,
    /// Answer every AssumeRoleWithWebIdentity and AssumeRoleForPodIdentity with this error
    /// code (`AccessDenied`, `InvalidIdentityToken`, `ExpiredTokenException`, …) instead.
    pub refuse_assume_role: Option<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            verify_signatures: false,
            static_credentials: Vec::new(),
            roles: Vec::new(),
            pod_identity_associations: Vec::new(),
            session_seconds: DEFAULT_SESSION_SECONDS,
            refuse_assume_role: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StaticCredential {
    pub access_key_id: String,
    pub secret_access_key: String,
}

/// An IAM role whose trust policy admits web identities of the cluster's OIDC issuer with
/// audience `sts.amazonaws.com` and one of these subjects (`oidc:sub`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Role {
    pub arn: String,
    /// `system:serviceaccount:<namespace>:<name>`
    #[serde(default)]
    pub web_identity_subjects: Vec<String>,
}

/// `aws eks create-pod-identity-association --namespace … --service-account … --role-arn …`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodIdentityAssociation {
    pub namespace: String,
    pub service_account: String,
    pub role_arn: String,
}

/// A temporary credential a stand-in handed out (the secret parts are not shown).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IssuedCredential {
    pub access_key_id: String,
    #[serde(skip)]
    pub secret_access_key: String,
    #[serde(skip)]
    pub session_token: String,
    /// `AssumeRoleWithWebIdentity` or `AssumeRoleForPodIdentity`.
    pub issued_by: String,
    pub role_arn: String,
    /// Whose token it was exchanged for (`system:serviceaccount:<namespace>:<name>`).
    pub subject: String,
    /// Unix seconds.
    pub issued_at: u64,
    pub expires_at: u64,
}

/// What `GET /_admin/credentials` shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CredentialStats {
    /// Every temporary credential handed out, oldest first.
    pub issued: Vec<IssuedCredential>,
    /// AssumeRoleWithWebIdentity answers by outcome (`ok` or the error code).
    pub web_identity: BTreeMap<String, u64>,
    /// AssumeRoleForPodIdentity answers by outcome (`ok` or the error code).
    pub pod_identity: BTreeMap<String, u64>,
}

/// The mock's credential state: configuration and what was handed out.
#[derive(Default)]
pub(crate) struct Registry {
    pub config: AuthConfig,
    pub stats: CredentialStats,
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

fn random_chars(n: usize, alphabet: &[u8]) -> String {
    (0..n)
        .map(|_| char::from(alphabet[fastrand::usize(..alphabet.len())]))
        .collect()
}

impl Registry {
    /// Hand out a temporary credential (an `ASIA…` key, as STS's are) valid `seconds`.
    pub fn issue(
        &mut self,
        issued_by: &str,
        role_arn: &str,
        subject: &str,
        seconds: u64,
    ) -> IssuedCredential {
        const UPPER: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
        const SECRET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let now = now_secs();
        let credential = IssuedCredential {
            access_key_id: format!("ASIA{}", random_chars(16, UPPER)),
            secret_access_key: random_chars(40, SECRET),
            session_token: format!("IQoJb3JpZ2luX2VjE{}", random_chars(300, SECRET)),
            issued_by: issued_by.into(),
            role_arn: role_arn.into(),
            subject: subject.into(),
            issued_at: now,
            expires_at: now + seconds,
        };
        self.stats.issued.push(credential.clone());
        credential
    }

    /// Make every credential handed out so far expire now (a session that ran out while the
    /// client still holds it).
    pub fn expire_all(&mut self) {
        let now = now_secs();
        for c in &mut self.stats.issued {
            c.expires_at = c.expires_at.min(now);
        }
    }

    /// The secret and session token for `access_key_id`, and when it expires (never, for a
    /// long-term key).
    fn lookup(&self, access_key_id: &str) -> Option<(String, Option<String>, Option<u64>)> {
        if let Some(c) = self
            .config
            .static_credentials
            .iter()
            .find(|c| c.access_key_id == access_key_id)
        {
            return Some((c.secret_access_key.clone(), None, None));
        }
        self.stats
            .issued
            .iter()
            .rev()
            .find(|c| c.access_key_id == access_key_id)
            .map(|c| {
                (
                    c.secret_access_key.clone(),
                    Some(c.session_token.clone()),
                    Some(c.expires_at),
                )
            })
    }

    /// Judge one request. `Ok(Some(key))`: signed with `key` (and, when verifying, valid);
    /// `Ok(None)`: unsigned and not verifying; `Err`: refused as EC2 would refuse it.
    pub fn authenticate(
        &self,
        request: &SignedRequest<'_>,
        now: SystemTime,
    ) -> Result<Option<String>, ApiError> {
        let header = request.headers.get("authorization");
        let parsed = header
            .and_then(|v| v.to_str().ok())
            .and_then(Authorization::parse);
        if !self.config.verify_signatures {
            return Ok(parsed.map(|a| a.access_key_id.to_string()));
        }
        if header.is_none() {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "MissingAuthenticationToken",
                "The request must contain either a valid (registered) AWS access key ID or X.509 certificate.",
            ));
        }
        let auth = parsed.ok_or_else(incomplete)?;
        let (secret, token, expires_at) =
            self.lookup(auth.access_key_id).ok_or_else(auth_failure)?;
        let sent_token = request
            .headers
            .get("x-amz-security-token")
            .and_then(|v| v.to_str().ok());
        if token.as_deref() != sent_token {
            return Err(auth_failure());
        }
        let now_secs = now
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        if expires_at.is_some_and(|e| now_secs >= e) {
            // EC2 answers a call made with expired temporary credentials `RequestExpired`.
            return Err(expired());
        }
        let amz_date = request
            .headers
            .get("x-amz-date")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(incomplete)?;
        let signed_at = parse_amz_date(amz_date).ok_or_else(incomplete)?;
        if !amz_date.starts_with(auth.date) || !auth.signed_headers.contains(&"host") {
            return Err(incomplete());
        }
        let skew = now
            .duration_since(signed_at)
            .unwrap_or_else(|e| e.duration());
        if skew > MAX_SKEW {
            return Err(expired());
        }
        let expected = signature(
            request,
            &auth,
            Credentials::new(auth.access_key_id, secret, token, None, "mock-ec2"),
            signed_at,
        )
        .ok_or_else(incomplete)?;
        if expected != auth.signature {
            return Err(auth_failure());
        }
        Ok(Some(auth.access_key_id.to_string()))
    }
}

fn auth_failure() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "AuthFailure",
        "AWS was not able to validate the provided access credentials",
    )
}

fn expired() -> ApiError {
    ApiError::bad("RequestExpired", "Request has expired.")
}

fn incomplete() -> ApiError {
    ApiError::bad(
        "IncompleteSignature",
        "The request signature does not conform to AWS standards.",
    )
}

/// The parts of an HTTP request a signature covers.
pub(crate) struct SignedRequest<'a> {
    pub method: &'a str,
    /// Path and query, as received.
    pub uri: &'a str,
    pub headers: &'a HeaderMap,
    pub body: &'a [u8],
}

/// `AWS4-HMAC-SHA256 Credential=AKID/20240101/us-west-2/ec2/aws4_request,
/// SignedHeaders=host;x-amz-date, Signature=…`
struct Authorization<'a> {
    access_key_id: &'a str,
    date: &'a str,
    region: &'a str,
    service: &'a str,
    signed_headers: Vec<&'a str>,
    signature: &'a str,
}

impl<'a> Authorization<'a> {
    fn parse(value: &'a str) -> Option<Self> {
        let rest = value.strip_prefix("AWS4-HMAC-SHA256 ")?;
        let (mut credential, mut signed, mut signature) = (None, None, None);
        for part in rest.split(',').map(str::trim) {
            let (k, v) = part.split_once('=')?;
            match k {
                "Credential" => credential = Some(v),
                "SignedHeaders" => signed = Some(v),
                "Signature" => signature = Some(v),
                _ => return None,
            }
        }
        let mut scope = credential?.split('/');
        let parsed = Self {
            access_key_id: scope.next()?,
            date: scope.next()?,
            region: scope.next()?,
            service: scope.next()?,
            signed_headers: signed?.split(';').collect(),
            signature: signature?,
        };
        (scope.next()? == "aws4_request" && scope.next().is_none()).then_some(parsed)
    }
}

/// `20240101T000000Z` (SigV4's basic ISO 8601).
fn parse_amz_date(s: &str) -> Option<SystemTime> {
    if s.len() != 16 || !s.is_ascii() {
        return None;
    }
    let iso = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &s[0..4],
        &s[4..6],
        &s[6..8],
        &s[9..11],
        &s[11..13],
        &s[13..15]
    );
    SystemTime::try_from(DateTime::from_str(&iso, Format::DateTime).ok()?).ok()
}

/// The signature the SDK's signer computes for this request with `credentials`, over exactly the
/// headers the client says it signed.
fn signature(
    request: &SignedRequest<'_>,
    auth: &Authorization<'_>,
    credentials: Credentials,
    signed_at: SystemTime,
) -> Option<String> {
    let identity: Identity = credentials.into();
    let mut headers: Vec<(&str, &str)> = Vec::with_capacity(auth.signed_headers.len());
    for name in &auth.signed_headers {
        let value = request.headers.get(*name)?.to_str().ok()?;
        headers.push((name, value));
    }
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(auth.region)
        .name(auth.service)
        .time(signed_at)
        .settings(SigningSettings::default())
        .build()
        .ok()?
        .into();
    let signable = SignableRequest::new(
        request.method,
        request.uri,
        headers.into_iter(),
        SignableBody::Bytes(request.body),
    )
    .ok()?;
    Some(sign(signable, &params).ok()?.signature().to_string())
}

/// Epoch seconds as ISO 8601 (`2024-01-01T00:00:00Z`), as STS and the agent write expiry times.
pub(crate) fn iso8601(secs: u64) -> String {
    DateTime::from_secs(i64::try_from(secs).unwrap_or(i64::MAX))
        .fmt(Format::DateTime)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sign a request the way the SDK does (its own signer), to check the verifier against.
    fn signed(
        creds: &Credentials,
        at: SystemTime,
        body: &'static [u8],
    ) -> (HeaderMap, &'static [u8]) {
        let identity: Identity = creds.clone().into();
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region("us-west-2")
            .name("ec2")
            .time(at)
            .settings(SigningSettings::default())
            .build()
            .expect("params")
            .into();
        let base = [
            ("host", "127.0.0.1:8080"),
            ("content-type", "application/x-www-form-urlencoded"),
        ];
        let signable = SignableRequest::new(
            "POST",
            "http://127.0.0.1:8080/",
            base.iter().copied(),
            SignableBody::Bytes(body),
        )
        .expect("signable");
        let (instructions, _) = sign(signable, &params).expect("sign").into_parts();
        let mut headers = HeaderMap::new();
        for (k, v) in base {
            headers.insert(k, v.parse().expect("value"));
        }
        for (k, v) in instructions.headers() {
            let name = axum::http::HeaderName::from_bytes(k.as_bytes()).expect("name");
            headers.insert(name, v.parse().expect("value"));
        }
        (headers, body)
    }

    fn verifying() -> Registry {
        let mut r = Registry::default();
        r.config.verify_signatures = true;
        r.config.static_credentials.push(StaticCredential {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "e2e-not-a-secret".into(),
        });
        r
    }

    fn judge(r: &Registry, headers: &HeaderMap, body: &[u8], now: SystemTime) -> String {
        let req = SignedRequest {
            method: "POST",
            uri: "/",
            headers,
            body,
        };
        match r.authenticate(&req, now) {
            Ok(k) => format!("ok {}", k.unwrap_or_default()),
            Err(e) => e.code.to_string(),
        }
    }

    const BODY: &[u8] = b"Action=DescribeInstanceTopology&Version=2016-11-15";

    #[test]
    fn a_long_term_key_signs_and_a_wrong_secret_or_body_does_not() {
        let r = verifying();
        let now = SystemTime::now();
        let good = Credentials::new("AKIDEXAMPLE", "e2e-not-a-secret", None, None, "t");
        let (h, b) = signed(&good, now, BODY);
        assert_eq!(judge(&r, &h, b, now), "ok AKIDEXAMPLE");
        assert_eq!(
            judge(
                &r,
                &h,
                b"Action=DescribeInstanceTopology&Version=2016-11-16",
                now
            ),
            "AuthFailure",
            "a changed body breaks the signature"
        );
        let wrong = Credentials::new("AKIDEXAMPLE", "another-secret", None, None, "t");
        let (h, b) = signed(&wrong, now, BODY);
        assert_eq!(judge(&r, &h, b, now), "AuthFailure");
        let unknown = Credentials::new("AKIDUNKNOWN", "e2e-not-a-secret", None, None, "t");
        let (h, b) = signed(&unknown, now, BODY);
        assert_eq!(judge(&r, &h, b, now), "AuthFailure");
        assert_eq!(
            judge(&r, &HeaderMap::new(), BODY, now),
            "MissingAuthenticationToken"
        );
    }

    #[test]
    fn a_temporary_credential_needs_its_token_and_expires() {
        let mut r = verifying();
        let c = r.issue(
            "AssumeRoleWithWebIdentity",
            "arn:aws:iam::1:role/r",
            "s",
            60,
        );
        let creds = Credentials::new(
            &c.access_key_id,
            &c.secret_access_key,
            Some(c.session_token.clone()),
            None,
            "t",
        );
        let now = SystemTime::now();
        let (h, b) = signed(&creds, now, BODY);
        assert_eq!(judge(&r, &h, b, now), format!("ok {}", c.access_key_id));
        let mut no_token = h.clone();
        no_token.remove("x-amz-security-token");
        assert_eq!(judge(&r, &no_token, b, now), "AuthFailure");
        let later = now + Duration::from_secs(61);
        let (h2, b2) = signed(&creds, later, BODY);
        assert_eq!(judge(&r, &h2, b2, later), "RequestExpired");
        r.expire_all();
        assert_eq!(judge(&r, &h, b, now), "RequestExpired");
    }

    #[test]
    fn an_old_date_stamp_is_refused_and_nothing_is_refused_when_not_verifying() {
        let mut r = verifying();
        let now = SystemTime::now();
        let good = Credentials::new("AKIDEXAMPLE", "e2e-not-a-secret", None, None, "t");
        let (h, b) = signed(&good, now - Duration::from_secs(16 * 60), BODY);
        assert_eq!(judge(&r, &h, b, now), "RequestExpired");
        r.config.verify_signatures = false;
        assert_eq!(judge(&r, &h, b, now), "ok AKIDEXAMPLE");
        assert_eq!(judge(&r, &HeaderMap::new(), b, now), "ok ");
    }

    #[test]
    fn dates_are_read_and_written_as_aws_does() {
        let t = parse_amz_date("20240229T235959Z").expect("a date");
        let secs = t.duration_since(UNIX_EPOCH).expect("after 1970").as_secs();
        assert_eq!(iso8601(secs), "2024-02-29T23:59:59Z");
        assert!(parse_amz_date("2024-02-29T23:59:59Z").is_none());
    }
}

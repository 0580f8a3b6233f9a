//! A stand-in for STS `AssumeRoleWithWebIdentity` (query protocol, API version 2011-06-15), as
//! IRSA uses it: the SDK sends the pod's projected service-account token (audience
//! `sts.amazonaws.com`) with `AWS_ROLE_ARN`, and gets temporary credentials that EC2 then
//! accepts. Reached through `AWS_ENDPOINT_URL_STS` (the same address as EC2: the `Action`
//! parameter tells them apart).
//!
//! Checks, as STS documents them: parameters (`ValidationError`), the token's signature, issuer
//! and audience against the cluster (`InvalidIdentityToken`), its expiry
//! (`ExpiredTokenException`), the keys being reachable (`IDPCommunicationError`), and the role's
//! trust policy admitting the token's subject (`AccessDenied`).

use axum::{
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};

use crate::{MockEc2, auth::iso8601, oidc::TokenError, xml_escape};

const XMLNS: &str = "https://sts.amazonaws.com/doc/2011-06-15/";
pub const AUDIENCE: &str = "sts.amazonaws.com";
const ACTION: &str = "AssumeRoleWithWebIdentity";

struct StsError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl StsError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn validation(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "ValidationError", message)
    }

    /// A refusal the test asked for (`refuseAssumeRole`), with STS's status for that code.
    fn injected(code: &str) -> Self {
        let (status, code): (StatusCode, &'static str) = match code {
            "InvalidIdentityToken" => (StatusCode::BAD_REQUEST, "InvalidIdentityToken"),
            "ExpiredTokenException" | "ExpiredToken" => {
                (StatusCode::BAD_REQUEST, "ExpiredTokenException")
            }
            "IDPCommunicationError" => (StatusCode::BAD_REQUEST, "IDPCommunicationError"),
            "IDPRejectedClaim" => (StatusCode::FORBIDDEN, "IDPRejectedClaim"),
            "RegionDisabledException" => (StatusCode::FORBIDDEN, "RegionDisabledException"),
            _ => (StatusCode::FORBIDDEN, "AccessDenied"),
        };
        Self::new(
            status,
            code,
            format!("Not authorized to perform sts:{ACTION}"),
        )
    }

    fn response(&self, request_id: &str) -> Response {
        let kind = if self.status.is_server_error() {
            "Receiver"
        } else {
            "Sender"
        };
        let body = format!(
            "<ErrorResponse xmlns=\"{XMLNS}\">\n  <Error>\n    <Type>{kind}</Type>\n    <Code>{}</Code>\n    <Message>{}</Message>\n  </Error>\n  <RequestId>{request_id}</RequestId>\n</ErrorResponse>\n",
            self.code,
            xml_escape(&self.message)
        );
        (self.status, [(header::CONTENT_TYPE, "text/xml")], body).into_response()
    }
}

fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn required<'a>(params: &'a [(String, String)], name: &str) -> Result<&'a str, StsError> {
    param(params, name).ok_or_else(|| {
        StsError::validation(format!(
            "1 validation error detected: Value null at '{}' failed to satisfy constraint: Member must not be null",
            lower_first(name)
        ))
    })
}

fn lower_first(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_ascii_lowercase().to_string() + c.as_str())
        .unwrap_or_default()
}

/// `[\w+=,.@-]{2,64}`
fn valid_session_name(s: &str) -> bool {
    (2..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_+=,.@-".contains(&b))
}

/// The request parameters STS checks before it looks at the token.
struct Request<'a> {
    role_arn: &'a str,
    session_name: &'a str,
    token: &'a str,
    duration: Option<u64>,
}

fn parse(params: &[(String, String)]) -> Result<Request<'_>, StsError> {
    if param(params, "Version").is_none() {
        return Err(StsError::new(
            StatusCode::BAD_REQUEST,
            "MissingParameter",
            "The request must contain the parameter Version",
        ));
    }
    let role_arn = required(params, "RoleArn")?;
    let session_name = required(params, "RoleSessionName")?;
    let token = required(params, "WebIdentityToken")?;
    if !(20..=2048).contains(&role_arn.len()) || !role_arn.starts_with("arn:") {
        return Err(StsError::validation(format!(
            "{role_arn} is invalid: RoleArn must be an ARN of 20 to 2048 characters"
        )));
    }
    if !valid_session_name(session_name) {
        return Err(StsError::validation(format!(
            "1 validation error detected: Value '{session_name}' at 'roleSessionName' failed to satisfy constraint: Member must satisfy regular expression pattern: [\\w+=,.@-]*"
        )));
    }
    if !(4..=20_000).contains(&token.len()) {
        return Err(StsError::validation(
            "1 validation error detected: Value at 'webIdentityToken' failed to satisfy constraint: Member must have length between 4 and 20000",
        ));
    }
    let duration = match param(params, "DurationSeconds") {
        None => None,
        Some(d) => match d.parse::<u64>() {
            Ok(n) if (900..=43_200).contains(&n) => Some(n),
            _ => {
                return Err(StsError::validation(format!(
                    "1 validation error detected: Value '{d}' at 'durationSeconds' failed to satisfy constraint: Member must have value between 900 and 43200"
                )));
            }
        },
    };
    Ok(Request {
        role_arn,
        session_name,
        token,
        duration,
    })
}

/// A role's unique ID (`AROA…`), stable for its ARN.
pub(crate) fn role_id(arn: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    arn.hash(&mut h);
    format!("AROA{:016X}", h.finish())
}

/// Answer one `AssumeRoleWithWebIdentity`.
pub(crate) async fn assume_role_with_web_identity(
    mock: &MockEc2,
    params: &[(String, String)],
) -> Response {
    let request_id = mock.next_request_id();
    let (outcome, response) = match exchange(mock, params).await {
        Ok(body) => (
            "ok".to_string(),
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/xml")],
                body.replace("@REQUEST_ID@", &request_id),
            )
                .into_response(),
        ),
        Err(e) => (e.code.to_string(), e.response(&request_id)),
    };
    *mock
        .registry()
        .stats
        .web_identity
        .entry(outcome)
        .or_default() += 1;
    response
}

async fn exchange(mock: &MockEc2, params: &[(String, String)]) -> Result<String, StsError> {
    let request = parse(params)?;
    if let Some(code) = mock.registry().config.refuse_assume_role.clone() {
        return Err(StsError::injected(&code));
    }
    let claims = mock
        .issuer()
        .verify(request.token, AUDIENCE)
        .await
        .map_err(|e| match e {
            TokenError::Expired(_) => StsError::new(
                StatusCode::BAD_REQUEST,
                "ExpiredTokenException",
                e.to_string(),
            ),
            TokenError::Unreachable(_) => StsError::new(
                StatusCode::BAD_REQUEST,
                "IDPCommunicationError",
                e.to_string(),
            ),
            TokenError::Malformed(_) | TokenError::Invalid(_) => StsError::new(
                StatusCode::BAD_REQUEST,
                "InvalidIdentityToken",
                e.to_string(),
            ),
        })?;
    let mut registry = mock.registry();
    let trusted = registry
        .config
        .roles
        .iter()
        .any(|r| r.arn == request.role_arn && r.web_identity_subjects.contains(&claims.sub));
    if !trusted {
        return Err(StsError::new(
            StatusCode::FORBIDDEN,
            "AccessDenied",
            format!("Not authorized to perform sts:{ACTION}"),
        ));
    }
    let seconds = request
        .duration
        .unwrap_or(registry.config.session_seconds)
        .max(1);
    let c = registry.issue(ACTION, request.role_arn, &claims.sub, seconds);
    drop(registry);
    let role_name = request.role_arn.rsplit('/').next().unwrap_or_default();
    let account = request.role_arn.split(':').nth(4).unwrap_or_default();
    let provider = claims.iss.trim_start_matches("https://");
    Ok(format!(
        "<AssumeRoleWithWebIdentityResponse xmlns=\"{XMLNS}\">
  <AssumeRoleWithWebIdentityResult>
    <Audience>{AUDIENCE}</Audience>
    <AssumedRoleUser>
      <AssumedRoleId>{role_id}:{session}</AssumedRoleId>
      <Arn>arn:aws:sts::{account}:assumed-role/{role}/{session}</Arn>
    </AssumedRoleUser>
    <Provider>{provider}</Provider>
    <Credentials>
      <AccessKeyId>{akid}</AccessKeyId>
      <SecretAccessKey>{secret}</SecretAccessKey>
      <SessionToken>{token}</SessionToken>
      <Expiration>{expiration}</Expiration>
    </Credentials>
    <SubjectFromWebIdentityToken>{subject}</SubjectFromWebIdentityToken>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata>
    <RequestId>@REQUEST_ID@</RequestId>
  </ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>
",
        role_id = role_id(request.role_arn),
        session = xml_escape(request.session_name),
        account = xml_escape(account),
        role = xml_escape(role_name),
        provider = xml_escape(provider),
        akid = c.access_key_id,
        secret = xml_escape(&c.secret_access_key),
        token = xml_escape(&c.session_token),
        expiration = iso8601(c.expires_at),
        subject = xml_escape(&claims.sub),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn base() -> Vec<(&'static str, &'static str)> {
        vec![
            ("Action", ACTION),
            ("Version", "2011-06-15"),
            ("RoleArn", "arn:aws:iam::111122223333:role/labeler"),
            ("RoleSessionName", "web-identity-token-1700000000000"),
            ("WebIdentityToken", "aaaa.bbbb.cccc"),
        ]
    }

    fn code(params: &[(&str, &str)]) -> Option<&'static str> {
        parse(&p(params)).err().map(|e| e.code)
    }

    #[test]
    fn parameters_are_checked_as_sts_documents() {
        assert_eq!(code(&base()), None);
        let mut short = base();
        short.push(("DurationSeconds", "899"));
        assert_eq!(code(&short), Some("ValidationError"));
        let mut long = base();
        long.push(("DurationSeconds", "43201"));
        assert_eq!(code(&long), Some("ValidationError"));
        let mut ok = base();
        ok.push(("DurationSeconds", "900"));
        assert_eq!(code(&ok), None);
        let bad_name: Vec<_> = base()
            .into_iter()
            .map(|(k, v)| {
                if k == "RoleSessionName" {
                    (k, "a b")
                } else {
                    (k, v)
                }
            })
            .collect();
        assert_eq!(code(&bad_name), Some("ValidationError"));
        let no_token: Vec<_> = base()
            .into_iter()
            .filter(|(k, _)| *k != "WebIdentityToken")
            .collect();
        assert_eq!(code(&no_token), Some("ValidationError"));
    }

    #[test]
    fn injected_refusals_carry_sts_status_codes() {
        let e = StsError::injected("AccessDenied");
        assert_eq!((e.status, e.code), (StatusCode::FORBIDDEN, "AccessDenied"));
        let e = StsError::injected("ExpiredTokenException");
        assert_eq!(
            (e.status, e.code),
            (StatusCode::BAD_REQUEST, "ExpiredTokenException")
        );
        let e = StsError::injected("InvalidIdentityToken");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }
}

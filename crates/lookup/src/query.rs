//! EC2's Query API, spoken directly, for the five read-only calls the controller makes.
//!
//! A call is a form-encoded `POST` (`Action`, `Version`, the call's parameters) to the region's
//! EC2 endpoint, signed with Signature Version 4 by the AWS SDK's own signer (`aws-sigv4`) with
//! credentials from the SDK's default chain (`aws-config`: environment, profile, IRSA web
//! identity, EKS Pod Identity), sent over hyper 1.x and rustls with ring (what the controller's Kubernetes client
//! resolves to, so the binary links one of each). The
//! answer is read by a strict XML parser: a malformed or truncated body is an error, never an
//! answer with fewer items. (The generated `aws-sdk-ec2` crate, every EC2 operation for the five
//! we call, was a quarter of a cold build's CPU and compiled four times per CI run.)
//!
//! Owns: where EC2 is (the SDK's endpoint rules for EC2: partitions, FIPS, dual-stack,
//! `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL`), signing, the credentials cache, one connection
//! pool, and turning an answer into a document or an [`Ec2Error`]. Never retries.

use std::{
    sync::atomic::{AtomicI64, Ordering},
    time::{Duration, SystemTime},
};

use aws_credential_types::{
    Credentials,
    provider::{ProvideCredentials, SharedCredentialsProvider, error::CredentialsError},
};
use aws_sigv4::{
    http_request::{SignableBody, SignableRequest, SigningSettings, sign},
    sign::v4,
};
use aws_smithy_runtime_api::client::identity::Identity;
use aws_smithy_types::error::display::DisplayErrorContext;
use aws_types::{SdkConfig, service_config::ServiceConfigKey};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioTimer},
};
use roxmltree::{Document, Node};

use crate::topology::Ec2Error;

/// The EC2 API version every call names (the one the EC2 API Reference documents).
const VERSION: &str = "2016-11-15";
/// Longest wait for a TCP connection (within the call's own timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Largest answer read: a page of 100 instances is ~60 kB, 1,000 reservations under 2 MB.
const MAX_BODY: usize = 16 << 20;
/// Credentials without an expiry (static keys) are asked for again after this long, as the
/// SDK's own cache does.
const STATIC_CREDENTIALS_TTL: Duration = Duration::from_secs(15 * 60);
/// Credentials are renewed this long before they expire (at most half their lifetime).
const RENEW_BEFORE: Duration = Duration::from_secs(60);
/// What an answer's first characters show of it in an error.
const SHOWN: usize = 200;
/// A difference between our clock and EC2's (its answers' `Date`) at least this large is
/// corrected when signing, as the SDKs do: EC2 refuses a request stamped more than 5 minutes
/// off (`RequestExpired`, `SignatureDoesNotMatch`). Smaller ones are the `Date`'s one-second
/// resolution and the answer's time in flight.
const SKEW_CORRECTED: Duration = Duration::from_secs(60);

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// Where EC2 is: the SDK configuration's endpoint settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoints {
    /// `AWS_ENDPOINT_URL_EC2`, `AWS_ENDPOINT_URL`, a profile's `endpoint_url`, or the
    /// configuration's own, in the SDK's order.
    pub custom: Option<String>,
    /// `AWS_USE_FIPS_ENDPOINT`.
    pub fips: bool,
    /// `AWS_USE_DUALSTACK_ENDPOINT`.
    pub dual_stack: bool,
}

impl Endpoints {
    /// As the SDK's EC2 client reads them from `conf`: an endpoint set on the configuration
    /// itself wins; otherwise the EC2 one (`AWS_ENDPOINT_URL_EC2`, a profile's `ec2`
    /// `endpoint_url`), then the global one.
    pub fn from_config(conf: &SdkConfig) -> Self {
        let custom = if conf.get_origin("endpoint_url").is_client_config() {
            conf.endpoint_url().map(str::to_owned)
        } else {
            ServiceConfigKey::builder()
                .service_id("EC2")
                .env("AWS_ENDPOINT_URL")
                .profile("endpoint_url")
                .build()
                .ok()
                .and_then(|key| conf.service_config()?.load_config(key))
                .or_else(|| conf.endpoint_url().map(str::to_owned))
        };
        Self {
            custom: custom.filter(|u| !u.is_empty()),
            fips: conf.use_fips().unwrap_or(false),
            dual_stack: conf.use_dual_stack().unwrap_or(false),
        }
    }

    /// EC2's endpoint in `region`, parsed ([`Self::url`]).
    pub fn endpoint(&self, region: &str) -> Result<Endpoint, Ec2Error> {
        Endpoint::parse(self.url(region)?)
    }

    /// EC2's URL in `region` (a region name `provider_id::is_region_name` accepts), by the
    /// SDK's endpoint rules for EC2.
    pub fn url(&self, region: &str) -> Result<String, Ec2Error> {
        if let Some(url) = &self.custom {
            let refused = match (self.fips, self.dual_stack) {
                (true, _) => "FIPS",
                (false, true) => "dual-stack",
                (false, false) => return Ok(url.clone()),
            };
            return Err(Ec2Error::InvalidRequest {
                code: "InvalidConfiguration".into(),
                message: format!(
                    "{refused} endpoints and a custom endpoint ({url}) cannot be combined, as in the AWS SDKs: unset AWS_USE_FIPS_ENDPOINT / AWS_USE_DUALSTACK_ENDPOINT or the endpoint URL"
                ),
            });
        }
        let (dns, dual) = partition(region);
        Ok(match (self.fips, self.dual_stack) {
            (true, true) => format!("https://ec2-fips.{region}.{dual}"),
            // GovCloud's EC2 endpoints are FIPS endpoints already.
            (true, false) if region.starts_with("us-gov-") => {
                format!("https://ec2.{region}.amazonaws.com")
            }
            (true, false) => format!("https://ec2-fips.{region}.{dns}"),
            (false, true) => format!("https://ec2.{region}.{dual}"),
            (false, false) => format!("https://ec2.{region}.{dns}"),
        })
    }
}

/// EC2's endpoint in one region, parsed once (for every call there).
#[derive(Debug, Clone)]
pub struct Endpoint {
    url: String,
    uri: http::Uri,
    host: String,
}

impl Endpoint {
    fn parse(url: String) -> Result<Self, Ec2Error> {
        let bad = |why: String| Ec2Error::InvalidRequest {
            code: "InvalidConfiguration".into(),
            message: format!("the EC2 endpoint {url:?} {why}"),
        };
        let uri: http::Uri = url.parse().map_err(|e| bad(format!("is not a URL: {e}")))?;
        let host = uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .ok_or_else(|| bad("names no host".into()))?;
        Ok(Self { url, uri, host })
    }
}

/// The DNS suffixes (plain, dual-stack) of the partition `region` is in, as the SDK's partition
/// table has them; the `aws` partition for any other.
fn partition(region: &str) -> (&'static str, &'static str) {
    const PARTITIONS: [(&str, &str, &str); 7] = [
        ("cn-", "amazonaws.com.cn", "api.amazonwebservices.com.cn"),
        ("us-gov-", "amazonaws.com", "api.aws"),
        ("us-iso-", "c2s.ic.gov", "api.aws.ic.gov"),
        ("us-isob-", "sc2s.sgov.gov", "api.aws.scloud"),
        ("us-isof-", "csp.hci.ic.gov", "api.aws.hci.ic.gov"),
        ("eu-isoe-", "cloud.adc-e.uk", "api.cloud-aws.adc-e.uk"),
        ("eusc-", "amazonaws.eu", "api.amazonwebservices.eu"),
    ];
    PARTITIONS
        .iter()
        .find(|(prefix, ..)| region.starts_with(prefix))
        .map_or(("amazonaws.com", "api.aws"), |(_, dns, dual)| (dns, dual))
}

/// Credentials held until shortly before they expire.
struct Held {
    credentials: Credentials,
    renew_at: SystemTime,
}

/// The EC2 Query API client: one connection pool and one credentials cache for every region.
pub struct Api {
    http: Client<Https, Full<Bytes>>,
    credentials: Option<SharedCredentialsProvider>,
    held: tokio::sync::Mutex<Option<Held>>,
    pub(super) endpoints: Endpoints,
    timeout: Duration,
    /// EC2's clock minus ours, in milliseconds, when at least [`SKEW_CORRECTED`] apart (else 0),
    /// from the last answer's `Date`.
    skew_ms: AtomicI64,
}

impl Api {
    /// A client with `conf`'s credentials and endpoint settings; `timeout` bounds each call
    /// (credentials, connection, answer).
    pub fn new(conf: &SdkConfig, timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.enforce_http(false);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT.min(timeout)));
        connector.set_nodelay(true);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config())
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        Self {
            http: Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .build(https),
            credentials: conf.credentials_provider(),
            held: tokio::sync::Mutex::new(None),
            endpoints: Endpoints::from_config(conf),
            timeout,
            skew_ms: AtomicI64::new(0),
        }
    }

    /// One call: `action` with `params` to `at` (EC2 in `region`). The answer's body when EC2
    /// accepted the call; EC2's error (or what went wrong on the way) otherwise.
    pub async fn call(
        &self,
        region: &str,
        at: &Endpoint,
        action: &str,
        params: &[(String, String)],
    ) -> Result<String, Ec2Error> {
        match tokio::time::timeout(self.timeout, self.attempt(region, at, action, params)).await {
            Ok(result) => result,
            Err(_) => Err(Ec2Error::Timeout(format!(
                "{action} at {}: not done within {:?} (credentials, connection and answer)",
                at.url, self.timeout
            ))),
        }
    }

    async fn attempt(
        &self,
        region: &str,
        at: &Endpoint,
        action: &str,
        params: &[(String, String)],
    ) -> Result<String, Ec2Error> {
        let body = Bytes::from(form(action, params));
        let mut request = http::Request::post(at.uri.clone())
            .header(http::header::HOST, at.host.as_str())
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded; charset=utf-8",
            )
            .header(
                http::header::USER_AGENT,
                concat!("ec2-topology-labeler/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(body.clone()))
            .map_err(|e| Ec2Error::Transport(format!("building the request: {e}")))?;
        let credentials = self.credentials().await?;
        let signed_at = skewed(SystemTime::now(), self.skew_ms.load(Ordering::Relaxed));
        sign_request(
            &mut request,
            &credentials,
            region,
            &at.url,
            &body,
            signed_at,
        )?;
        let response = self.http.request(request).await.map_err(send_error)?;
        let status = response.status();
        if let Some(date) = response.headers().get(http::header::DATE) {
            let skew = skew_of(date.to_str().ok(), SystemTime::now());
            self.skew_ms.store(skew, Ordering::Relaxed);
        }
        let bytes = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| {
                if e.downcast_ref::<LengthLimitError>().is_some() {
                    Ec2Error::BadResponse(format!("{action}'s answer is over {MAX_BODY} bytes"))
                } else {
                    Ec2Error::Transport(format!("reading {action}'s answer: {e}"))
                }
            })?
            .to_bytes();
        let text = String::from_utf8(bytes.to_vec()).map_err(|_| {
            Ec2Error::BadResponse(format!("{action}'s answer (HTTP {status}) is not UTF-8"))
        })?;
        if status.is_success() {
            return Ok(text);
        }
        let refused = refusal(status, &text);
        // Credentials EC2 calls expired (revoked, or a session cut short) are renewed at the
        // next call, not held until the expiry they came with. (`RequestExpired` is also a
        // clock far off: the `Date` above corrects that, and a renewal costs one more call.)
        if let Ec2Error::Unauthorized { code, .. } = &refused
            && matches!(
                code.as_str(),
                "ExpiredToken" | "ExpiredTokenException" | "RequestExpired"
            )
        {
            let mut held = self.held.lock().await;
            // Unless another call renewed them meanwhile.
            if held.as_ref().is_some_and(|h| {
                h.credentials.access_key_id() == credentials.access_key_id()
                    && h.credentials.session_token() == credentials.session_token()
            }) {
                *held = None;
            }
        }
        Err(refused)
    }

    /// The chain's credentials, held until shortly before they expire: IRSA and Pod Identity
    /// are asked once per session, not once per call.
    async fn credentials(&self) -> Result<Credentials, Ec2Error> {
        let Some(provider) = &self.credentials else {
            return Err(Ec2Error::Unauthorized {
                code: "CredentialsUnavailable".into(),
                message: "no credentials provider is configured".into(),
            });
        };
        let mut held = self.held.lock().await;
        let now = SystemTime::now();
        if let Some(h) = held.as_ref()
            && now < h.renew_at
        {
            return Ok(h.credentials.clone());
        }
        let fresh = provider
            .provide_credentials()
            .await
            .map_err(|e| credentials_error(&e))?;
        let renew_at = match fresh.expiry() {
            Some(expiry) => {
                let life = expiry.duration_since(now).unwrap_or_default();
                expiry
                    .checked_sub(RENEW_BEFORE.min(life / 2))
                    .unwrap_or(now)
            }
            None => now + STATIC_CREDENTIALS_TTL,
        };
        *held = Some(Held {
            credentials: fresh.clone(),
            renew_at,
        });
        Ok(fresh)
    }
}

/// The request's body: `Action`, `Version` and `params`, form-encoded.
fn form(action: &str, params: &[(String, String)]) -> String {
    let mut form = form_urlencoded::Serializer::new(String::new());
    form.append_pair("Action", action)
        .append_pair("Version", VERSION);
    for (k, v) in params {
        form.append_pair(k, v);
    }
    form.finish()
}

/// rustls with ring (the provider kube uses) and the platform's CA certificates (the image
/// carries Debian's bundle). Certificates that fail to load are logged, as the SDK does; with
/// none, HTTPS calls fail and say why.
fn tls_config() -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::warn!(error = %e, "could not load a CA certificate for EC2 calls");
    }
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        tracing::warn!(
            ignored,
            "no CA certificates found (SSL_CERT_FILE, SSL_CERT_DIR or the system's): HTTPS calls to EC2 will fail"
        );
    }
    // ring offers every protocol version rustls defaults to: this cannot fail.
    #[allow(clippy::expect_used)]
    let builder = rustls::ClientConfig::builder_with_provider(
        rustls::crypto::ring::default_provider().into(),
    )
    .with_safe_default_protocol_versions()
    .expect("ring supports rustls's default protocol versions");
    builder.with_root_certificates(roots).with_no_client_auth()
}

/// `now` moved by `skew_ms` (EC2's clock minus ours).
fn skewed(now: SystemTime, skew_ms: i64) -> SystemTime {
    let by = Duration::from_millis(skew_ms.unsigned_abs());
    if skew_ms >= 0 {
        now.checked_add(by)
    } else {
        now.checked_sub(by)
    }
    .unwrap_or(now)
}

/// EC2's clock minus ours (`now`) in milliseconds from an answer's `Date` (RFC 9110's
/// IMF-fixdate), when at least [`SKEW_CORRECTED`] apart; 0 otherwise or when it does not parse.
fn skew_of(date: Option<&str>, now: SystemTime) -> i64 {
    let Some(theirs) = date.and_then(|d| httpdate::parse_http_date(d).ok()) else {
        return 0;
    };
    let (ahead, by) = match theirs.duration_since(now) {
        Ok(by) => (true, by),
        Err(e) => (false, e.duration()),
    };
    if by < SKEW_CORRECTED {
        return 0;
    }
    let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
    if ahead { ms } else { -ms }
}

/// Signature Version 4 over the request as it will be sent (host, content type and body), by
/// the SDK's signer; the signature, date and session token go into its headers.
fn sign_request(
    request: &mut http::Request<Full<Bytes>>,
    credentials: &Credentials,
    region: &str,
    url: &str,
    body: &[u8],
    at: SystemTime,
) -> Result<(), Ec2Error> {
    let identity: Identity = credentials.clone().into();
    let unsignable = |e: &dyn std::fmt::Display| Ec2Error::Transport(format!("signing: {e}"));
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("ec2")
        .time(at)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| unsignable(&e))?
        .into();
    let headers: Vec<(&str, &str)> = request
        .headers()
        .iter()
        .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
        .collect();
    let signable =
        SignableRequest::new("POST", url, headers.into_iter(), SignableBody::Bytes(body))
            .map_err(|e| unsignable(&e))?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|e| unsignable(&e))?
        .into_parts();
    instructions.apply_to_request_http1x(request);
    Ok(())
}

/// What the chain's failure to give credentials means: the operator's to fix (no provider
/// found any, IRSA's STS exchange or the Pod Identity agent refused), like a denied call; a
/// provider that only timed out is transient.
fn credentials_error(e: &CredentialsError) -> Ec2Error {
    match e {
        CredentialsError::ProviderTimedOut(_) => {
            Ec2Error::Transport(format!("getting credentials: {}", DisplayErrorContext(e)))
        }
        _ => Ec2Error::Unauthorized {
            code: "CredentialsUnavailable".into(),
            message: DisplayErrorContext(e).to_string(),
        },
    }
}

/// A request that got no answer: a timeout (connecting, or anywhere below) or a transport error.
fn send_error(e: hyper_util::client::legacy::Error) -> Ec2Error {
    let text = chain(&e);
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if s.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return Ec2Error::Timeout(text);
        }
        source = s.source();
    }
    Ec2Error::Transport(text)
}

/// An error and its causes, `: `-separated.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// EC2's refusal (`<Response><Errors><Error><Code>…`), by its code; an answer without one (an
/// HTTP error page, a proxy's) by its status.
fn refusal(status: http::StatusCode, body: &str) -> Ec2Error {
    let coded = Document::parse(body).ok().and_then(|doc| {
        let error = doc.descendants().find(|n| n.has_tag_name("Error"))?;
        let code = text(error, "Code")?;
        Some(Ec2Error::from_code(
            code,
            text(error, "Message").unwrap_or_default(),
        ))
    });
    coded.unwrap_or_else(|| Ec2Error::Service {
        code: "Unknown".into(),
        message: format!("HTTP {status}: {}", shown(body)),
    })
}

/// The first characters of `body`, for an error.
fn shown(body: &str) -> String {
    body.chars().take(SHOWN).collect()
}

/// `body` parsed, when it is the answer to `action` (`<{action}Response>`).
pub(super) fn document<'i>(action: &str, body: &'i str) -> Result<Document<'i>, Ec2Error> {
    let doc = Document::parse(body)
        .map_err(|e| Ec2Error::BadResponse(format!("{action}: {e} in {:?}", shown(body))))?;
    let root = doc.root_element().tag_name().name();
    if root.strip_suffix("Response") != Some(action) {
        return Err(Ec2Error::BadResponse(format!(
            "{action}: the answer is a <{root}>, not a <{action}Response>"
        )));
    }
    Ok(doc)
}

/// The `item`s of the list `set` (`instanceSet`) in the answer.
pub(super) fn items<'a, 'i>(
    doc: &'a Document<'i>,
    set: &'a str,
) -> impl Iterator<Item = Node<'a, 'i>> + 'a {
    doc.root_element()
        .children()
        .filter(move |n| n.has_tag_name(set))
        .flat_map(|s| s.children().filter(|n| n.has_tag_name("item")))
}

/// The answer's `nextToken`, when it has a non-empty one.
pub(super) fn next_token(doc: &Document<'_>) -> Option<String> {
    text(doc.root_element(), "nextToken").map(str::to_owned)
}

/// The text of `node`'s child `name`, when it has a non-empty one.
pub(super) fn text<'a>(node: Node<'a, '_>, name: &str) -> Option<&'a str> {
    node.children()
        .find(|n| n.has_tag_name(name))
        .and_then(|n| n.text())
        .map(str::trim)
        .filter(|s| !s.is_empty())
}

/// The texts of the `item`s of `node`'s list `set` (`networkNodeSet`), in order; an empty item
/// is a broken answer (dropping it would shift every layer below it).
pub(super) fn strings(node: Node<'_, '_>, set: &str) -> Result<Vec<String>, Ec2Error> {
    node.children()
        .filter(|n| n.has_tag_name(set))
        .flat_map(|s| s.children().filter(|n| n.has_tag_name("item")))
        .map(|n| {
            n.text()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| Ec2Error::BadResponse(format!("an empty <item> in <{set}>")))
        })
        .collect()
}

/// The whole number in `node`'s child `name`; a present one that is not is a broken answer.
pub(super) fn number(node: Node<'_, '_>, name: &str) -> Result<Option<i64>, Ec2Error> {
    text(node, name)
        .map(|t| {
            t.parse().map_err(|_| {
                Ec2Error::BadResponse(format!("<{name}> is not a whole number: {:?}", shown(t)))
            })
        })
        .transpose()
}

/// The time in `node`'s child `name` (ISO 8601, as EC2 writes `startDate`); a present one that
/// does not parse is a broken answer.
pub(super) fn time(node: Node<'_, '_>, name: &str) -> Result<Option<SystemTime>, Ec2Error> {
    text(node, name)
        .map(|t| {
            humantime::parse_rfc3339_weak(t).map_err(|e| {
                Ec2Error::BadResponse(format!("<{name}> is not a time ({e}): {:?}", shown(t)))
            })
        })
        .transpose()
}

/// `params` and, after the first page, the `NextToken` of the page before.
pub(super) fn paged(
    mut params: Vec<(String, String)>,
    token: Option<String>,
) -> Vec<(String, String)> {
    params.extend(token.map(|t| ("NextToken".to_string(), t)));
    params
}

/// `values` as the numbered parameters of a list (`InstanceId.1`, `InstanceId.2`, …).
pub(super) fn list(name: &str, values: &[String]) -> Vec<(String, String)> {
    values
        .iter()
        .enumerate()
        .map(|(k, v)| (format!("{name}.{}", k + 1), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoints(fips: bool, dual_stack: bool) -> Endpoints {
        Endpoints {
            custom: None,
            fips,
            dual_stack,
        }
    }

    /// The endpoints the SDK's own endpoint tests for EC2 expect (aws-sdk-ec2's
    /// `config/endpoint.rs`), one per partition and setting.
    #[test]
    fn endpoints_follow_the_sdk_rules_for_ec2() {
        let cases = [
            (
                "us-west-2",
                false,
                false,
                "https://ec2.us-west-2.amazonaws.com",
            ),
            (
                "us-west-2",
                true,
                false,
                "https://ec2-fips.us-west-2.amazonaws.com",
            ),
            ("us-west-2", false, true, "https://ec2.us-west-2.api.aws"),
            (
                "us-east-1",
                true,
                true,
                "https://ec2-fips.us-east-1.api.aws",
            ),
            (
                "cn-north-1",
                false,
                false,
                "https://ec2.cn-north-1.amazonaws.com.cn",
            ),
            (
                "cn-north-1",
                true,
                true,
                "https://ec2-fips.cn-north-1.api.amazonwebservices.com.cn",
            ),
            (
                "cn-north-1",
                false,
                true,
                "https://ec2.cn-north-1.api.amazonwebservices.com.cn",
            ),
            (
                "us-gov-west-1",
                false,
                false,
                "https://ec2.us-gov-west-1.amazonaws.com",
            ),
            (
                "us-gov-east-1",
                true,
                false,
                "https://ec2.us-gov-east-1.amazonaws.com",
            ),
            (
                "us-gov-east-1",
                true,
                true,
                "https://ec2-fips.us-gov-east-1.api.aws",
            ),
            (
                "us-gov-east-1",
                false,
                true,
                "https://ec2.us-gov-east-1.api.aws",
            ),
            (
                "us-iso-east-1",
                false,
                false,
                "https://ec2.us-iso-east-1.c2s.ic.gov",
            ),
            (
                "us-iso-east-1",
                true,
                false,
                "https://ec2-fips.us-iso-east-1.c2s.ic.gov",
            ),
            (
                "us-isob-east-1",
                false,
                false,
                "https://ec2.us-isob-east-1.sc2s.sgov.gov",
            ),
            (
                "us-isob-east-1",
                true,
                false,
                "https://ec2-fips.us-isob-east-1.sc2s.sgov.gov",
            ),
        ];
        for (region, fips, dual, want) in cases {
            assert_eq!(
                endpoints(fips, dual).url(region).expect("an endpoint"),
                want,
                "{region} fips={fips} dual-stack={dual}"
            );
        }
    }

    #[test]
    fn a_custom_endpoint_is_used_as_given_and_never_with_fips_or_dual_stack() {
        let mut e = Endpoints {
            custom: Some("http://127.0.0.1:8080".into()),
            ..Endpoints::default()
        };
        assert_eq!(e.url("us-west-2").expect("custom"), "http://127.0.0.1:8080");
        e.fips = true;
        assert!(matches!(
            e.url("us-west-2"),
            Err(Ec2Error::InvalidRequest { code, .. }) if code == "InvalidConfiguration"
        ));
        e.fips = false;
        e.dual_stack = true;
        assert!(e.url("us-west-2").is_err());
    }

    #[test]
    fn an_answer_is_read_only_when_it_is_whole_and_the_one_asked_for() {
        let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstanceTopologyResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>r</requestId><instanceSet><item><instanceId>i-1</instanceId><networkNodeSet><item>nn-1</item><item> nn-2 </item></networkNodeSet></item><item><instanceId>i-2</instanceId></item></instanceSet><nextToken>t+/=</nextToken></DescribeInstanceTopologyResponse>";
        let doc = document("DescribeInstanceTopology", body).expect("parsed");
        let found: Vec<_> = items(&doc, "instanceSet").collect();
        assert_eq!(found.len(), 2);
        assert_eq!(text(found[0], "instanceId"), Some("i-1"));
        assert_eq!(
            strings(found[0], "networkNodeSet").expect("items"),
            ["nn-1", "nn-2"]
        );
        let hole = Document::parse(
            "<item><networkNodeSet><item>nn-1</item><item/><item>nn-3</item></networkNodeSet></item>",
        )
        .expect("xml");
        assert!(strings(hole.root_element(), "networkNodeSet").is_err());
        assert_eq!(next_token(&doc).as_deref(), Some("t+/="));
        // Truncated anywhere: an error, not fewer items.
        for cut in [body.len() - 1, body.len() / 2, 60] {
            assert!(
                document("DescribeInstanceTopology", &body[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        assert!(matches!(
            document("DescribeCapacityBlocks", body),
            Err(Ec2Error::BadResponse(_))
        ));
    }

    #[test]
    fn refusals_are_read_by_their_code_or_their_status() {
        let throttled = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>r</RequestID></Response>";
        assert!(refusal(http::StatusCode::SERVICE_UNAVAILABLE, throttled).is_throttle());
        let page = refusal(http::StatusCode::BAD_GATEWAY, "<html>bad gateway</html>");
        assert!(
            matches!(&page, Ec2Error::Service { code, message } if code == "Unknown" && message.contains("502")),
            "{page:?}"
        );
    }

    #[test]
    fn numbers_and_times_that_do_not_parse_are_broken_answers() {
        let doc = Document::parse(
            "<r><n>18</n><bad>x</bad><t>2026-12-19T11:30:00.000Z</t><badt>soon</badt></r>",
        )
        .expect("xml");
        let r = doc.root_element();
        assert_eq!(number(r, "n").expect("a number"), Some(18));
        assert_eq!(number(r, "absent").expect("absent"), None);
        assert!(number(r, "bad").is_err());
        let t = time(r, "t").expect("a time").expect("present");
        assert_eq!(
            t.duration_since(SystemTime::UNIX_EPOCH)
                .expect("after")
                .as_secs(),
            1_797_679_800
        );
        assert!(time(r, "badt").is_err());
    }

    /// A clock minutes off EC2's is corrected from its answers' `Date` (EC2 refuses a request
    /// stamped more than 5 minutes off); the `Date`'s own second of resolution is not.
    #[test]
    fn a_clock_minutes_off_is_corrected_from_the_answers_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_797_679_800);
        let date = |at: SystemTime| httpdate::fmt_http_date(at);
        let ahead = date(now + Duration::from_secs(600));
        assert_eq!(skew_of(Some(&ahead), now), 600_000);
        let behind = date(now - Duration::from_secs(420));
        assert_eq!(skew_of(Some(&behind), now), -420_000);
        assert_eq!(skew_of(Some(&date(now + Duration::from_secs(2))), now), 0);
        assert_eq!(skew_of(Some("yesterday"), now), 0);
        assert_eq!(skew_of(None, now), 0);
        assert_eq!(skewed(now, -420_000), now - Duration::from_secs(420));
        assert_eq!(skewed(now, 600_000), now + Duration::from_secs(600));
    }

    #[test]
    fn lists_are_numbered_from_one() {
        assert_eq!(
            list("InstanceId", &["i-a".into(), "i-b".into()]),
            [
                ("InstanceId.1".to_string(), "i-a".to_string()),
                ("InstanceId.2".to_string(), "i-b".to_string())
            ]
        );
    }
}

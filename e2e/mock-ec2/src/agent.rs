//! A stand-in for the EKS Pod Identity Agent, run as EKS runs it: a hostNetwork DaemonSet whose
//! init step puts the link-local address `169.254.170.23` on the node, and whose server answers
//! `GET /v1/credentials` there. The SDK in a pod (`AWS_CONTAINER_CREDENTIALS_FULL_URI`) sends the
//! pod's projected token (audience `pods.eks.amazonaws.com`, read from
//! `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE`) in the `Authorization` header; the agent checks that
//! the request came to its own address and that the token is a well-formed, unexpired JWT, then
//! exchanges it with EKS Auth `AssumeRoleForPodIdentity` ([`crate::eks_auth`], which verifies
//! it) and answers the container-credentials JSON (`AccessKeyId`, `SecretAccessKey`, `Token`,
//! `AccountId`, `Expiration`).
//!
//! Differences from the real agent: the init step adds the address to `lo` (the real one makes
//! a dummy interface; a kind node may lack the module), the call to EKS Auth is not signed with
//! a node role, and nothing is cached (the SDK caches until the credentials near expiry).

use std::net::{IpAddr, SocketAddr};

use axum::{
    Json, Router,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde::Serialize;
use serde_json::json;

use crate::{auth::iso8601, eks_auth::AssumeRoleForPodIdentityResponse};

/// The EKS Pod Identity Agent's IPv4 address (the SDK allows plain HTTP to it).
pub const AGENT_IPV4: &str = "169.254.170.23";

/// How the agent runs.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// Addresses to serve credentials on (EKS: 169.254.170.23:80 and [fd00:ec2::23]:80).
    #[arg(long = "listen", required = true, num_args = 1..)]
    pub listen: Vec<SocketAddr>,
    /// Health probes (`/healthz`, `/readyz`), as the real agent's `--probe-port`.
    #[arg(long)]
    pub probe_listen: Option<SocketAddr>,
    /// Base URL of EKS Auth (the mock: http://mock-ec2.ec2-topology-labeler:8080).
    #[arg(long)]
    pub eks_auth_url: String,
    /// The cluster's name, sent to EKS Auth.
    #[arg(long)]
    pub cluster_name: String,
}

#[derive(Clone)]
struct Agent {
    args: AgentArgs,
    http: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

/// The container-credentials format the SDKs read.
#[derive(Serialize)]
struct ContainerCredentials {
    #[serde(rename = "AccessKeyId")]
    access_key_id: String,
    #[serde(rename = "SecretAccessKey")]
    secret_access_key: String,
    #[serde(rename = "Token")]
    token: String,
    #[serde(rename = "AccountId")]
    account_id: String,
    #[serde(rename = "Expiration")]
    expiration: String,
}

fn refuse(status: StatusCode, message: impl Into<String>) -> Response {
    (status, message.into()).into_response()
}

/// The host part of a `Host` header (`169.254.170.23`, `[fd00:ec2::23]:80`, `127.0.0.1:2703`).
fn host_ip(host: &str) -> Option<IpAddr> {
    if let Ok(addr) = host.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .ok()
}

/// Parseable, with a subject and not expired: what the agent checks before asking EKS Auth
/// (which checks the signature).
fn basic_claims(token: &str) -> Result<(), String> {
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.insecure_disable_signature_validation();
    validation.validate_aud = false;
    validation.leeway = 0;
    validation.set_required_spec_claims(&["exp", "sub"]);
    let header = jsonwebtoken::decode_header(token).map_err(|e| e.to_string())?;
    validation.algorithms = vec![header.alg];
    jsonwebtoken::decode::<serde_json::Value>(
        token,
        &jsonwebtoken::DecodingKey::from_secret(b""),
        &validation,
    )
    .map(drop)
    .map_err(|e| e.to_string())
}

async fn credentials(State(agent): State<Agent>, headers: HeaderMap) -> Response {
    let host = headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let ours = host_ip(host).is_some_and(|ip| agent.args.listen.iter().any(|l| l.ip() == ip));
    if !ours {
        let addresses: Vec<String> = agent
            .args
            .listen
            .iter()
            .map(|l| l.ip().to_string())
            .collect();
        return refuse(
            StatusCode::FORBIDDEN,
            format!(
                "Access Denied. Called agent through invalid address, please use either {addresses:?} address not {host}"
            ),
        );
    }
    let token = headers
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default()
        .trim();
    if token.is_empty() {
        return refuse(
            StatusCode::BAD_REQUEST,
            "Service account token cannot be empty",
        );
    }
    if let Err(e) = basic_claims(token) {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!("Service account token failed basic claim validations: {e}"),
        );
    }
    match exchange(&agent, token).await {
        Ok(a) => Json(ContainerCredentials {
            account_id: a
                .assumed_role_user
                .arn
                .split(':')
                .nth(4)
                .unwrap_or_default()
                .to_string(),
            access_key_id: a.credentials.access_key_id,
            secret_access_key: a.credentials.secret_access_key,
            token: a.credentials.session_token,
            expiration: iso8601(a.credentials.expiration),
        })
        .into_response(),
        Err((status, message)) => refuse(status, message),
    }
}

async fn exchange(
    agent: &Agent,
    token: &str,
) -> Result<AssumeRoleForPodIdentityResponse, (StatusCode, String)> {
    let url = format!(
        "{}/clusters/{}/assume-role-for-pod-identity",
        agent.args.eks_auth_url.trim_end_matches('/'),
        agent.args.cluster_name
    );
    let unavailable = |e: String| (StatusCode::INTERNAL_SERVER_ERROR, e);
    let request = http::Request::post(&url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            json!({ "token": token }).to_string(),
        )))
        .map_err(|e| unavailable(e.to_string()))?;
    let response = agent
        .http
        .request(request)
        .await
        .map_err(|e| unavailable(format!("unable to fetch credentials from EKS Auth: {e}")))?;
    let status = response.status();
    let code = response
        .headers()
        .get("x-amzn-ErrorType")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| unavailable(e.to_string()))?
        .to_bytes();
    if !status.is_success() {
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        // As the real agent: EKS Auth's status, its error code and message.
        return Err((status, format!("({code}): {message}, fault: client")));
    }
    serde_json::from_slice(&body)
        .map_err(|e| unavailable(format!("invalid response from EKS Auth: {e}")))
}

/// Serve until interrupted.
pub async fn run(args: AgentArgs) -> Result<(), Box<dyn std::error::Error>> {
    let agent = Agent {
        http: Client::builder(TokioExecutor::new()).build_http(),
        args: args.clone(),
    };
    let app = Router::new()
        .route("/v1/credentials", get(credentials))
        .with_state(agent);
    let mut servers = tokio::task::JoinSet::new();
    for addr in &args.listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("binding {addr}: {e}"))?;
        println!("pod identity agent listening on http://{addr}/v1/credentials");
        let app = app.clone();
        servers.spawn(async move { axum::serve(listener, app).await });
    }
    if let Some(addr) = args.probe_listen {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let probes = Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(|| async { "ok" }));
        servers.spawn(async move { axum::serve(listener, probes).await });
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Ok(()),
        done = servers.join_next() => match done {
            Some(Ok(Err(e))) => Err(e.into()),
            Some(Err(e)) => Err(e.into()),
            _ => Ok(()),
        },
    }
}

/// The agent's init step: put `address` (a /32 or /128) on the loopback interface of the node's
/// network namespace (hostNetwork), so that pods reach the agent there. Needs `NET_ADMIN`.
/// Adding an address that is already there succeeds.
pub async fn init(addresses: &[IpAddr]) -> Result<(), Box<dyn std::error::Error>> {
    use futures::TryStreamExt;
    let (connection, handle, _) = rtnetlink::new_connection()?;
    tokio::spawn(connection);
    let lo = handle
        .link()
        .get()
        .match_name("lo".to_string())
        .execute()
        .try_next()
        .await?
        .ok_or("no loopback interface")?;
    for ip in addresses {
        let prefix = if ip.is_ipv4() { 32 } else { 128 };
        match handle
            .address()
            .add(lo.header.index, *ip, prefix)
            .execute()
            .await
        {
            Ok(()) => println!("added {ip}/{prefix} to lo"),
            Err(rtnetlink::Error::NetlinkError(e))
                if e.code.map(|c| c.get()) == Some(-libc::EEXIST) =>
            {
                println!("{ip}/{prefix} is already on lo");
            }
            Err(e) => return Err(format!("adding {ip}/{prefix} to lo: {e}").into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_header_names_the_address_called() {
        assert_eq!(host_ip("169.254.170.23"), "169.254.170.23".parse().ok());
        assert_eq!(host_ip("[fd00:ec2::23]:80"), "fd00:ec2::23".parse().ok());
        assert_eq!(host_ip("[fd00:ec2::23]"), "fd00:ec2::23".parse().ok());
        assert_eq!(host_ip("127.0.0.1:2703"), "127.0.0.1".parse().ok());
        assert_eq!(host_ip("localhost"), None);
    }

    #[test]
    fn tokens_the_agent_refuses_before_asking_eks_auth() {
        assert!(basic_claims("not-a-jwt").is_err());
        // {"alg":"RS256"} . {"sub":"system:serviceaccount:a:b","exp":1} . signature
        let expired =
            "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6YTpiIiwiZXhwIjoxfQ.c2ln";
        assert!(basic_claims(expired).is_err());
        // the same, expiring in 2100
        let fresh = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6YTpiIiwiZXhwIjo0MTAyNDQ0ODAwfQ.c2ln";
        assert_eq!(basic_claims(fresh), Ok(()));
    }
}

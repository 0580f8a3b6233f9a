//! A mock of EC2's `DescribeInstanceTopology`, speaking the EC2 query protocol (API version
//! 2016-11-15) the way AWS does, with fault injection and call statistics.
//!
//! One implementation serves three users: the controller's integration tests (in process, see
//! [`serve`]), the e2e suite and the demo (the `mock-ec2` binary), and the AWS CLI check that proves
//! AWS's own parsers accept what we send.
//!
//! Endpoints:
//! - `POST /` (form-encoded) or `GET /?…`: the EC2 query API (`Action=DescribeInstanceTopology`).
//! - `GET /_admin/stats`, `POST /_admin/stats/reset`: calls, IDs per call, throttled, failed.
//! - `GET|PUT /_admin/faults`: throttling (fraction or token bucket), latency, 5xx, timeouts,
//!   malformed or truncated XML, unauthorized, omitted instances, duplicated items.
//! - `GET|PUT /_admin/instances`, `PUT|DELETE /_admin/instances/{id}`: the scenario itself
//!   (move an instance or change its depth by replacing it; its Capacity Reservations too).
//! - `Action=DescribeCapacityReservationTopology` and `DescribeCapacityReservations`
//!   ([`reservations`]; `GET /_admin/stats/reservations`).
//! - `Action=DescribeCapacityBlocks` and `DescribeCapacityBlockStatus` ([`capacity_blocks`];
//!   `GET /_admin/stats/capacity-blocks`; `PUT /_admin/capacity-blocks/{id}/interconnect` with
//!   `ok`, `impaired` or `insufficient-data` as the body).
//! - Credentials as EKS hands them out: STS `AssumeRoleWithWebIdentity` on `/` (IRSA, [`sts`]),
//!   EKS Auth `AssumeRoleForPodIdentity` on `/clusters/{name}/assume-role-for-pod-identity`
//!   (EKS Pod Identity, [`eks_auth`]; the node agent is [`agent`]), both checking the pod's
//!   token against the cluster ([`oidc`]); SigV4 verification of EC2 calls when asked
//!   ([`auth`]). `GET|PUT /_admin/auth` (what is accepted), `GET /_admin/credentials` (what was
//!   handed out), `POST /_admin/credentials/expire` (every handed-out credential expires now).

pub mod agent;
pub mod auth;
pub mod capacity_blocks;
pub mod eks_auth;
pub mod oidc;
mod query;
pub mod reservations;
pub mod sts;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
    routing::{get, post, put},
};
use serde::{Deserialize, Serialize};

pub use auth::{
    AuthConfig, CredentialStats, IssuedCredential, PodIdentityAssociation, Role, StaticCredential,
};

pub const API_VERSION: &str = "2016-11-15";
const XMLNS: &str = "http://ec2.amazonaws.com/doc/2016-11-15/";
const MAX_IDS: usize = 100;
const DEFAULT_PAGE: usize = 20;

/// One EC2 instance as DescribeInstanceTopology reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    pub instance_id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub zone_id: String,
    /// Top of the hierarchy first; empty for an unsupported type or an instance not yet placed.
    #[serde(default)]
    pub network_nodes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_block_id: Option<String>,
    /// Only running instances are described; anything else is omitted, as EC2 does.
    #[serde(default = "running")]
    pub state: String,
}

fn running() -> String {
    "running".into()
}

/// A scenario file: the instances the mock knows.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Scenario {
    pub instances: Vec<Instance>,
    /// Capacity Reservations (`DescribeCapacityReservationTopology`, `DescribeCapacityReservations`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservations: Vec<reservations::CapacityReservation>,
    /// Capacity Blocks (`DescribeCapacityBlocks`, `DescribeCapacityBlockStatus`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity_blocks: Vec<capacity_blocks::CapacityBlock>,
}

impl Scenario {
    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// An EC2-like token bucket: `burst` tokens, refilled at `rate` per second.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TokenBucket {
    pub burst: f64,
    pub rate: f64,
}

/// Faults to inject. A fraction `p` in 0..=1 hits exactly that share of calls, spread evenly
/// (with 0.5, every second call), so tests that inject faults are deterministic.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Faults {
    /// Answer `RequestLimitExceeded` (HTTP 503) to this fraction of calls.
    pub throttle_fraction: f64,
    /// Answer `RequestLimitExceeded` when this bucket is empty (EC2: ~100 burst, 20/s).
    pub token_bucket: Option<TokenBucket>,
    /// Added to every call.
    pub latency_ms: u64,
    /// Answer HTTP 500 `InternalError` to this fraction of calls.
    pub error_5xx_fraction: f64,
    /// Hold this fraction of calls for `timeout_hold_ms` before answering 500 (a client with a
    /// shorter timeout sees a timeout).
    pub timeout_fraction: f64,
    pub timeout_hold_ms: u64,
    /// Answer this fraction of calls with a 200 whose body is not well-formed XML.
    pub malformed_fraction: f64,
    /// Answer this fraction of calls with a 200 whose body stops half way.
    pub truncated_fraction: f64,
    /// Answer every call `UnauthorizedOperation` (HTTP 403).
    pub unauthorized: bool,
    /// Leave these instance IDs out of every answer (as if EC2 had not caught up).
    pub omit_instances: Vec<String>,
    /// Fail every call that asks for one of these IDs with `InvalidInstanceID.NotFound`, naming
    /// them, as EC2 does for an ID it does not know (another account's, a mistyped one): one such
    /// ID sinks the whole call.
    pub not_found_instances: Vec<String>,
    /// Repeat every item of an answer (EC2 should not, a client must cope).
    pub duplicate_items: bool,
    /// Page answers to requests with instance IDs too, this many items per page (EC2 may).
    pub page_size: Option<usize>,
    /// Answer the Capacity Reservation calls `UnauthorizedOperation` (the role lacks
    /// `ec2:DescribeCapacityReservationTopology`), the topology calls as usual.
    pub reservations_unauthorized: bool,
    /// Leave reservations neither active nor pending out of `DescribeCapacityReservationTopology`
    /// (by default they are listed without network nodes; the API Reference reads both ways).
    pub reservations_topology_active_only: bool,
    /// Answer the Capacity Block calls `UnauthorizedOperation` (the role lacks
    /// `ec2:DescribeCapacityBlocks` / `ec2:DescribeCapacityBlockStatus`).
    pub capacity_blocks_unauthorized: bool,
}

/// What the mock saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// Every DescribeInstanceTopology request received, whatever its outcome.
    pub calls: u64,
    /// Number of `InstanceId.N` in each request, in arrival order.
    pub ids_per_call: Vec<usize>,
    /// Requests answered `RequestLimitExceeded`.
    pub throttled: u64,
    /// Requests answered with any other error or a broken body.
    pub failed: u64,
    /// Total instance IDs asked for.
    pub ids_requested: u64,
    /// How often each instance ID was asked for.
    pub asked: BTreeMap<String, u64>,
    /// Requests by the access key they were signed with (verified or not; unsigned ones are not
    /// counted).
    #[serde(default)]
    pub signed_by: BTreeMap<String, u64>,
    /// Requests refused for their credentials or signature, by error code (`AuthFailure`,
    /// `RequestExpired`, …); only while signatures are verified.
    #[serde(default)]
    pub auth_refused: BTreeMap<String, u64>,
}

struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Evenly spread hits for each fractional fault.
#[derive(Default)]
struct Spread {
    throttle: f64,
    timeout: f64,
    error_5xx: f64,
    malformed: f64,
    truncated: f64,
}

/// Add `p` to the accumulator; a hit each time it reaches 1.
fn hit(acc: &mut f64, p: f64) -> bool {
    if p <= 0.0 {
        return false;
    }
    *acc += p.min(1.0);
    if *acc >= 1.0 - 1e-9 {
        *acc -= 1.0;
        true
    } else {
        false
    }
}

#[derive(Default)]
struct Inner {
    instances: BTreeMap<String, Instance>,
    faults: Faults,
    spread: Spread,
    stats: Stats,
    bucket: Option<Bucket>,
    request_seq: u64,
    reservations: BTreeMap<String, reservations::CapacityReservation>,
    reservation_stats: reservations::ReservationStats,
    capacity_blocks: BTreeMap<String, capacity_blocks::CapacityBlock>,
    capacity_block_stats: capacity_blocks::CapacityBlockStats,
}

impl Inner {
    /// The `requestId` of the next answer, as EC2 writes them (a UUID).
    fn next_request_id(&mut self) -> String {
        self.request_seq += 1;
        format!("00000000-0000-4000-8000-{:012x}", self.request_seq)
    }
}

/// Shared state of one mock.
#[derive(Clone, Default)]
pub struct MockEc2 {
    inner: Arc<Mutex<Inner>>,
    /// Locked after `inner` when both are needed, never the other way round.
    registry: Arc<Mutex<auth::Registry>>,
    issuer: Arc<oidc::ClusterIssuer>,
}

impl MockEc2 {
    pub fn new(scenario: Scenario) -> Self {
        let mock = Self::default();
        mock.set_instances(scenario.instances);
        mock.set_reservations(scenario.reservations);
        mock.set_capacity_blocks(scenario.capacity_blocks);
        mock
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-written in a way that matters
        // to a test double; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_instances(&self, instances: Vec<Instance>) {
        let mut inner = self.lock();
        inner.instances = instances
            .into_iter()
            .map(|i| (i.instance_id.clone(), i))
            .collect();
    }

    pub fn upsert(&self, instance: Instance) {
        self.lock()
            .instances
            .insert(instance.instance_id.clone(), instance);
    }

    pub fn remove(&self, instance_id: &str) -> bool {
        self.lock().instances.remove(instance_id).is_some()
    }

    pub fn instances(&self) -> Vec<Instance> {
        self.lock().instances.values().cloned().collect()
    }

    pub fn set_faults(&self, faults: Faults) {
        let mut inner = self.lock();
        inner.bucket = faults.token_bucket.map(|b| Bucket {
            tokens: b.burst,
            at: Instant::now(),
        });
        inner.faults = faults;
        inner.spread = Spread::default();
    }

    pub fn faults(&self) -> Faults {
        self.lock().faults.clone()
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats.clone()
    }

    pub fn reset_stats(&self) {
        let mut inner = self.lock();
        inner.stats = Stats::default();
        inner.reservation_stats = reservations::ReservationStats::default();
        inner.capacity_block_stats = capacity_blocks::CapacityBlockStats::default();
    }

    fn registry(&self) -> MutexGuard<'_, auth::Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn issuer(&self) -> &oidc::ClusterIssuer {
        &self.issuer
    }

    fn next_request_id(&self) -> String {
        self.lock().next_request_id()
    }

    pub fn set_auth(&self, config: AuthConfig) {
        self.registry().config = config;
    }

    pub fn auth(&self) -> AuthConfig {
        self.registry().config.clone()
    }

    /// The credentials the stand-ins handed out, and how the exchanges went.
    pub fn credentials(&self) -> CredentialStats {
        self.registry().stats.clone()
    }

    /// Every credential handed out so far expires now.
    pub fn expire_credentials(&self) {
        self.registry().expire_all();
    }

    /// Decide the fate of one unsigned call (the unit tests' entry point).
    #[cfg(test)]
    fn handle(&self, params: &[(String, String)]) -> Outcome {
        self.handle_signed(params, None)
    }

    /// Decide the fate of one call and, when it is answered normally, compute the answer.
    fn handle_signed(
        &self,
        params: &[(String, String)],
        signed: Option<&auth::SignedRequest<'_>>,
    ) -> Outcome {
        let mut inner = self.lock();
        let request_id = inner.next_request_id();
        let request = match parse_request(params) {
            Ok(r) => r,
            Err(e) => {
                inner.stats.calls += 1;
                inner.stats.ids_per_call.push(0);
                inner.stats.failed += 1;
                return Outcome::Error(e, request_id);
            }
        };
        inner.stats.calls += 1;
        inner.stats.ids_per_call.push(request.instance_ids.len());
        if let Some(signed) = signed {
            match self
                .registry()
                .authenticate(signed, std::time::SystemTime::now())
            {
                Ok(Some(key)) => *inner.stats.signed_by.entry(key).or_default() += 1,
                Ok(None) => {}
                Err(e) => {
                    inner.stats.failed += 1;
                    *inner
                        .stats
                        .auth_refused
                        .entry(e.code.to_string())
                        .or_default() += 1;
                    return Outcome::Error(e, request_id);
                }
            }
        }
        inner.stats.ids_requested += request.instance_ids.len() as u64;
        for id in &request.instance_ids {
            *inner.stats.asked.entry(id.clone()).or_default() += 1;
        }
        let faults = inner.faults.clone();
        let latency = Duration::from_millis(faults.latency_ms);

        if faults.unauthorized {
            inner.stats.failed += 1;
            return Outcome::Error(
                ApiError::new(
                    StatusCode::FORBIDDEN,
                    "UnauthorizedOperation",
                    "You are not authorized to perform this operation. User: arn:aws:sts::111122223333:assumed-role/labeler is not authorized to perform: ec2:DescribeInstanceTopology",
                ),
                request_id,
            )
            .after(latency);
        }
        let throttled_by_bucket = match (&mut inner.bucket, faults.token_bucket) {
            (Some(bucket), Some(cfg)) => {
                let now = Instant::now();
                let refill = now.duration_since(bucket.at).as_secs_f64() * cfg.rate;
                bucket.tokens = (bucket.tokens + refill).min(cfg.burst);
                bucket.at = now;
                if bucket.tokens >= 1.0 {
                    bucket.tokens -= 1.0;
                    false
                } else {
                    true
                }
            }
            _ => false,
        };
        if throttled_by_bucket || hit(&mut inner.spread.throttle, faults.throttle_fraction) {
            inner.stats.throttled += 1;
            return Outcome::Error(
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "RequestLimitExceeded",
                    "Request limit exceeded.",
                ),
                request_id,
            )
            .after(latency);
        }
        if hit(&mut inner.spread.timeout, faults.timeout_fraction) {
            inner.stats.failed += 1;
            return Outcome::Error(
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    "An internal error has occurred (held past the client's timeout).",
                ),
                request_id,
            )
            .after(latency + Duration::from_millis(faults.timeout_hold_ms.max(1)));
        }
        if hit(&mut inner.spread.error_5xx, faults.error_5xx_fraction) {
            inner.stats.failed += 1;
            return Outcome::Error(
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    "An internal error has occurred.",
                ),
                request_id,
            )
            .after(latency);
        }
        if hit(&mut inner.spread.malformed, faults.malformed_fraction) {
            inner.stats.failed += 1;
            return Outcome::Raw(
                "<DescribeInstanceTopologyResponse><instanceSet><item><instanceId>i-<<&&>>"
                    .to_string(),
                latency,
            );
        }

        let unknown: Vec<&String> = request
            .instance_ids
            .iter()
            .filter(|id| faults.not_found_instances.contains(id))
            .collect();
        if !unknown.is_empty() {
            inner.stats.failed += 1;
            let list = unknown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let message = if unknown.len() == 1 {
                format!("The instance ID '{list}' does not exist")
            } else {
                format!("The instance IDs '{list}' do not exist")
            };
            return Outcome::Error(
                ApiError::bad("InvalidInstanceID.NotFound", message),
                request_id,
            )
            .after(latency);
        }
        let matched: Vec<&Instance> = inner
            .instances
            .values()
            .filter(|i| i.state == "running")
            .filter(|i| !faults.omit_instances.contains(&i.instance_id))
            .filter(|i| request.matches(i))
            .collect();
        // EC2 pages by MaxResults (default 20) when no instance IDs are given; with IDs it
        // answers them all (at most 100).
        let page = if request.instance_ids.is_empty() {
            request.max_results.unwrap_or(DEFAULT_PAGE)
        } else {
            faults.page_size.unwrap_or(MAX_IDS).max(1)
        };
        let start = request.next_token.unwrap_or(0).min(matched.len());
        let end = (start + page).min(matched.len());
        let next_token = (end < matched.len()).then(|| encode_token(end));
        let mut items: Vec<&Instance> = matched[start..end].to_vec();
        if faults.duplicate_items {
            items = items.iter().flat_map(|i| [*i, *i]).collect();
        }
        let body = response_xml(&request_id, &items, next_token.as_deref());
        if hit(&mut inner.spread.truncated, faults.truncated_fraction) {
            inner.stats.failed += 1;
            let cut = body.len() / 2;
            let mut cut_at = cut;
            while !body.is_char_boundary(cut_at) {
                cut_at -= 1;
            }
            return Outcome::Raw(body[..cut_at].to_string(), latency);
        }
        Outcome::Raw(body, latency)
    }
}

enum Outcome {
    Raw(String, Duration),
    Error(ApiError, String),
    Delayed(ApiError, String, Duration),
}

impl Outcome {
    fn after(self, d: Duration) -> Self {
        match self {
            Outcome::Error(e, id) => Outcome::Delayed(e, id, d),
            other => other,
        }
    }
}

#[derive(Debug, Clone)]
struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
    fn bad(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
    fn response(&self, request_id: &str) -> Response {
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code><Message>{}</Message></Error></Errors><RequestID>{}</RequestID></Response>",
            self.code,
            xml_escape(&self.message),
            request_id
        );
        (
            self.status,
            [(header::CONTENT_TYPE, "text/xml;charset=UTF-8")],
            body,
        )
            .into_response()
    }
}

#[derive(Debug, Default)]
struct Request {
    instance_ids: Vec<String>,
    group_names: Vec<String>,
    /// (filter name, values)
    filters: Vec<(String, Vec<String>)>,
    max_results: Option<usize>,
    next_token: Option<usize>,
}

impl Request {
    fn matches(&self, i: &Instance) -> bool {
        (self.instance_ids.is_empty() || self.instance_ids.contains(&i.instance_id))
            && (self.group_names.is_empty()
                || i.group_name
                    .as_ref()
                    .is_some_and(|g| self.group_names.contains(g)))
            && self.filters.iter().all(|(name, values)| {
                let field = match name.as_str() {
                    "availability-zone" => &i.availability_zone,
                    "instance-type" => &i.instance_type,
                    _ => &i.zone_id,
                };
                values.iter().any(|v| wildcard_match(v, field))
            })
    }
}

/// Indexed parameters (`InstanceId.3`, `Filter.1.Value.2`) in index order.
fn indexed<'a>(params: &'a [(String, String)], prefix: &str) -> Vec<(u32, &'a str)> {
    let mut out: Vec<(u32, &str)> = params
        .iter()
        .filter_map(|(k, v)| {
            let n = k.strip_prefix(prefix)?.strip_prefix('.')?;
            n.parse::<u32>().ok().map(|n| (n, v.as_str()))
        })
        .collect();
    out.sort_by_key(|(n, _)| *n);
    out
}

fn parse_request(params: &[(String, String)]) -> Result<Request, ApiError> {
    let get = |k: &str| params.iter().find(|(p, _)| p == k).map(|(_, v)| v.as_str());
    match get("Action") {
        Some("DescribeInstanceTopology") => {}
        Some(other) => {
            return Err(ApiError::bad(
                "InvalidAction",
                format!("The action {other} is not valid for this web service."),
            ));
        }
        None => {
            return Err(ApiError::bad(
                "MissingAction",
                "The request must contain the parameter Action",
            ));
        }
    }
    if get("Version").is_none() {
        return Err(ApiError::bad(
            "MissingParameter",
            "The request must contain the parameter Version",
        ));
    }
    if get("DryRun") == Some("true") {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "DryRunOperation",
            "Request would have succeeded, but DryRun flag is set.",
        ));
    }
    let mut req = Request {
        instance_ids: indexed(params, "InstanceId")
            .into_iter()
            .map(|(_, v)| v.to_string())
            .collect(),
        group_names: indexed(params, "GroupName")
            .into_iter()
            .map(|(_, v)| v.to_string())
            .collect(),
        ..Request::default()
    };
    if req.instance_ids.len() > MAX_IDS {
        return Err(ApiError::bad(
            "InvalidParameterValue",
            format!("The maximum number of instance IDs is {MAX_IDS}."),
        ));
    }
    if req.group_names.len() > MAX_IDS {
        return Err(ApiError::bad(
            "InvalidParameterValue",
            format!("The maximum number of group names is {MAX_IDS}."),
        ));
    }
    for id in &req.instance_ids {
        if !is_instance_id(id) {
            // As EC2 answers: the whole call fails, naming the ID.
            return Err(ApiError::bad(
                "InvalidInstanceID.Malformed",
                format!("Invalid id: \"{id}\" (expecting \"i-...\")"),
            ));
        }
    }
    if let Some(m) = get("MaxResults") {
        if !req.instance_ids.is_empty() {
            return Err(ApiError::bad(
                "InvalidParameterCombination",
                "The parameter instancesSet cannot be used with the parameter maxResults",
            ));
        }
        match m.parse::<usize>() {
            Ok(n) if (1..=MAX_IDS).contains(&n) => req.max_results = Some(n),
            _ => {
                return Err(ApiError::bad(
                    "InvalidParameterValue",
                    format!(
                        "Value ( {m} ) for parameter maxResults is invalid. Expecting a value between 1 and {MAX_IDS}."
                    ),
                ));
            }
        }
    }
    if let Some(t) = get("NextToken") {
        req.next_token =
            Some(decode_token(t).ok_or_else(|| {
                ApiError::bad("InvalidParameterValue", "The nextToken is invalid")
            })?);
    }
    let mut filter_indices: Vec<u32> = params
        .iter()
        .filter_map(|(k, _)| k.strip_prefix("Filter.")?.split('.').next()?.parse().ok())
        .collect();
    filter_indices.sort_unstable();
    filter_indices.dedup();
    for n in filter_indices {
        let name = get(&format!("Filter.{n}.Name")).ok_or_else(|| {
            ApiError::bad(
                "InvalidParameterValue",
                format!("Filter.{n}.Name is missing"),
            )
        })?;
        if !matches!(name, "availability-zone" | "instance-type" | "zone-id") {
            return Err(ApiError::bad(
                "InvalidParameterValue",
                format!("The filter '{name}' is invalid"),
            ));
        }
        let values: Vec<String> = indexed(params, &format!("Filter.{n}.Value"))
            .into_iter()
            .map(|(_, v)| v.to_string())
            .collect();
        req.filters.push((name.to_string(), values));
    }
    Ok(req)
}

/// What EC2 accepts as an instance ID: `i-` and 8 or 17 lowercase hex digits.
fn is_instance_id(id: &str) -> bool {
    id.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17)
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn encode_token(offset: usize) -> String {
    // Opaque to clients, like EC2's own tokens.
    format!("eyJvIjo{offset:08x}")
}

fn decode_token(token: &str) -> Option<usize> {
    usize::from_str_radix(token.strip_prefix("eyJvIjo")?, 16).ok()
}

/// `*` matches any run of characters, `?` exactly one.
fn wildcard_match(pattern: &str, value: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let v: Vec<char> = value.chars().collect();
    let (mut pi, mut vi, mut star, mut mark) = (0, 0, None, 0);
    while vi < v.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == v[vi]) {
            pi += 1;
            vi += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = vi;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            vi = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

fn response_xml(request_id: &str, items: &[&Instance], next_token: Option<&str>) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(256 + items.len() * 512);
    s.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(s, "<DescribeInstanceTopologyResponse xmlns=\"{XMLNS}\">");
    let _ = writeln!(s, "    <requestId>{request_id}</requestId>");
    s.push_str("    <instanceSet>\n");
    for i in items {
        s.push_str("        <item>\n");
        let _ = writeln!(
            s,
            "            <instanceId>{}</instanceId>",
            xml_escape(&i.instance_id)
        );
        let _ = writeln!(
            s,
            "            <instanceType>{}</instanceType>",
            xml_escape(&i.instance_type)
        );
        if let Some(g) = &i.group_name {
            let _ = writeln!(s, "            <groupName>{}</groupName>", xml_escape(g));
        }
        s.push_str("            <networkNodeSet>\n");
        for n in &i.network_nodes {
            let _ = writeln!(s, "                <item>{}</item>", xml_escape(n));
        }
        s.push_str("            </networkNodeSet>\n");
        let _ = writeln!(
            s,
            "            <availabilityZone>{}</availabilityZone>",
            xml_escape(&i.availability_zone)
        );
        let _ = writeln!(s, "            <zoneId>{}</zoneId>", xml_escape(&i.zone_id));
        if let Some(c) = &i.capacity_block_id {
            let _ = writeln!(
                s,
                "            <capacityBlockId>{}</capacityBlockId>",
                xml_escape(c)
            );
        }
        s.push_str("        </item>\n");
    }
    s.push_str("    </instanceSet>\n");
    if let Some(t) = next_token {
        let _ = writeln!(s, "    <nextToken>{t}</nextToken>");
    }
    s.push_str("</DescribeInstanceTopologyResponse>\n");
    s
}

/// The query API on `/`: EC2, or STS when the action is STS's. Form-encoded POST or GET.
async fn query_api(
    State(mock): State<MockEc2>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let params: Vec<(String, String)> = if method == Method::GET {
        form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect()
    } else {
        form_urlencoded::parse(&body).into_owned().collect()
    };
    let action = params.iter().find(|(k, _)| k == "Action").map(|(_, v)| v);
    if action.is_some_and(|a| a == "AssumeRoleWithWebIdentity") {
        return sts::assume_role_with_web_identity(&mock, &params).await;
    }
    let reservations = action.and_then(|a| reservations::Action::of(a));
    let blocks = action.and_then(|a| capacity_blocks::Action::of(a));
    let path = uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/")
        .to_string();
    let signed = auth::SignedRequest {
        method: method.as_str(),
        uri: &path,
        headers: &headers,
        body: &body,
    };
    let outcome = match (reservations, blocks) {
        (Some(action), _) => mock.handle_reservations(action, &params, Some(&signed)),
        (None, Some(action)) => mock.handle_capacity_blocks(action, &params, Some(&signed)),
        (None, None) => mock.handle_signed(&params, Some(&signed)),
    };
    answer(outcome).await
}

async fn answer(outcome: Outcome) -> Response {
    match outcome {
        Outcome::Raw(body, latency) => {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "text/xml;charset=UTF-8")],
                body,
            )
                .into_response()
        }
        Outcome::Error(e, id) => e.response(&id),
        Outcome::Delayed(e, id, latency) => {
            tokio::time::sleep(latency).await;
            e.response(&id)
        }
    }
}

async fn get_stats(State(mock): State<MockEc2>) -> Json<Stats> {
    Json(mock.stats())
}

async fn reset_stats(State(mock): State<MockEc2>) -> StatusCode {
    mock.reset_stats();
    StatusCode::NO_CONTENT
}

async fn get_faults(State(mock): State<MockEc2>) -> Json<Faults> {
    Json(mock.faults())
}

async fn put_faults(State(mock): State<MockEc2>, Json(faults): Json<Faults>) -> StatusCode {
    mock.set_faults(faults);
    StatusCode::NO_CONTENT
}

async fn get_instances(State(mock): State<MockEc2>) -> Json<Scenario> {
    Json(Scenario {
        instances: mock.instances(),
        reservations: mock.reservations(),
        capacity_blocks: mock.capacity_blocks(),
    })
}

async fn put_instances(State(mock): State<MockEc2>, Json(s): Json<Scenario>) -> StatusCode {
    mock.set_instances(s.instances);
    mock.set_reservations(s.reservations);
    mock.set_capacity_blocks(s.capacity_blocks);
    StatusCode::NO_CONTENT
}

async fn get_capacity_block_stats(
    State(mock): State<MockEc2>,
) -> Json<capacity_blocks::CapacityBlockStats> {
    Json(mock.capacity_block_stats())
}

/// `PUT /_admin/capacity-blocks/{id}/interconnect` with the status as the body.
async fn put_interconnect(
    State(mock): State<MockEc2>,
    axum::extract::Path(id): axum::extract::Path<String>,
    status: String,
) -> StatusCode {
    let status = status.trim();
    if !matches!(status, "ok" | "impaired" | "insufficient-data") {
        return StatusCode::BAD_REQUEST;
    }
    if mock.set_interconnect_status(&id, status) {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    }
}

async fn get_reservation_stats(
    State(mock): State<MockEc2>,
) -> Json<reservations::ReservationStats> {
    Json(mock.reservation_stats())
}

async fn put_instance(
    State(mock): State<MockEc2>,
    Path(id): Path<String>,
    Json(instance): Json<Instance>,
) -> Response {
    if instance.instance_id != id {
        return (
            StatusCode::BAD_REQUEST,
            "instanceId in the body differs from the path",
        )
            .into_response();
    }
    mock.upsert(instance);
    StatusCode::NO_CONTENT.into_response()
}

async fn delete_instance(State(mock): State<MockEc2>, Path(id): Path<String>) -> StatusCode {
    if mock.remove(&id) {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::NOT_FOUND
    }
}

async fn get_auth(State(mock): State<MockEc2>) -> Json<AuthConfig> {
    Json(mock.auth())
}

async fn put_auth(State(mock): State<MockEc2>, Json(config): Json<AuthConfig>) -> StatusCode {
    mock.set_auth(config);
    StatusCode::NO_CONTENT
}

async fn get_credentials(State(mock): State<MockEc2>) -> Json<CredentialStats> {
    Json(mock.credentials())
}

async fn expire_credentials(State(mock): State<MockEc2>) -> StatusCode {
    mock.expire_credentials();
    StatusCode::NO_CONTENT
}

/// The largest scenario `PUT /_admin/instances` takes.
const ADMIN_SCENARIO_LIMIT: usize = 256 << 20;

/// The mock's HTTP API: EC2 and STS on `/`, EKS Auth under `/clusters`, administration under
/// `/_admin`.
pub fn router(mock: MockEc2) -> Router {
    Router::new()
        .route("/", post(query_api).get(query_api))
        .route(
            "/clusters/{cluster}/assume-role-for-pod-identity",
            post(eks_auth::assume_role_for_pod_identity),
        )
        .route("/_admin/auth", get(get_auth).put(put_auth))
        .route("/_admin/credentials", get(get_credentials))
        .route("/_admin/credentials/expire", post(expire_credentials))
        .route("/_admin/stats", get(get_stats))
        .route("/_admin/stats/reset", post(reset_stats))
        .route("/_admin/stats/reservations", get(get_reservation_stats))
        .route(
            "/_admin/stats/capacity-blocks",
            get(get_capacity_block_stats),
        )
        .route(
            "/_admin/capacity-blocks/{id}/interconnect",
            axum::routing::put(put_interconnect),
        )
        .route("/_admin/faults", get(get_faults).put(put_faults))
        // A whole scenario (every instance, every capacity block): tens of MB at 100,000
        // instances, past axum's 2 MB default (the benchmarks replace it whole).
        .route(
            "/_admin/instances",
            get(get_instances)
                .put(put_instances)
                .layer(axum::extract::DefaultBodyLimit::max(ADMIN_SCENARIO_LIMIT)),
        )
        .route(
            "/_admin/instances/{id}",
            put(put_instance).delete(delete_instance),
        )
        .with_state(mock)
}

/// Serve the mock on an already bound listener until the future is dropped.
pub async fn serve(listener: tokio::net::TcpListener, mock: MockEc2) -> std::io::Result<()> {
    axum::serve(listener, router(mock)).await
}

/// Bind an ephemeral loopback port, serve the mock in the background, and return its base URL.
pub async fn spawn(mock: MockEc2) -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(e) = serve(listener, mock).await {
            tracing::error!(error = %e, "mock-ec2 stopped");
        }
    });
    Ok(format!("http://{addr}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(id: &str, ty: &str, nodes: &[&str]) -> Instance {
        Instance {
            instance_id: id.into(),
            instance_type: ty.into(),
            availability_zone: "us-west-2a".into(),
            zone_id: "usw2-az1".into(),
            network_nodes: nodes.iter().map(|s| s.to_string()).collect(),
            group_name: None,
            capacity_block_id: None,
            state: running(),
        }
    }

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut v = vec![
            ("Action".to_string(), "DescribeInstanceTopology".to_string()),
            ("Version".to_string(), API_VERSION.to_string()),
        ];
        v.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        v
    }

    fn body(o: Outcome) -> String {
        match o {
            Outcome::Raw(b, _) => b,
            Outcome::Error(e, _) | Outcome::Delayed(e, _, _) => format!("ERROR {}", e.code),
        }
    }

    #[test]
    fn ids_together_with_max_results_is_an_invalid_combination() {
        let m = MockEc2::new(Scenario::default());
        let out = m.handle(&params(&[
            ("InstanceId.1", "i-0123456789abcdef0"),
            ("MaxResults", "5"),
        ]));
        assert_eq!(body(out), "ERROR InvalidParameterCombination");
    }

    #[test]
    fn more_than_100_ids_are_refused_and_malformed_ids_named() {
        let m = MockEc2::new(Scenario::default());
        let many: Vec<(String, String)> = (1..=101)
            .map(|n| (format!("InstanceId.{n}"), format!("i-{n:017x}")))
            .collect();
        let mut p = params(&[]);
        p.extend(many);
        assert_eq!(body(m.handle(&p)), "ERROR InvalidParameterValue");
        let out = m.handle(&params(&[("InstanceId.1", "i-zz")]));
        assert_eq!(body(out), "ERROR InvalidInstanceID.Malformed");
        // Lengths EC2 refuses: anything but 8 or 17 digits, and upper case. One such ID fails
        // the whole call, good IDs beside it included.
        for bad in ["i-0123456789abcdef", "i-0123456789", "i-0123456789ABCDEF0"] {
            let out = m.handle(&params(&[
                ("InstanceId.1", "i-0123456789abcdef0"),
                ("InstanceId.2", bad),
            ]));
            assert_eq!(body(out), "ERROR InvalidInstanceID.Malformed", "{bad}");
        }
        for good in ["i-0123abcd", "i-0123456789abcdef0"] {
            let out = m.handle(&params(&[("InstanceId.1", good)]));
            assert!(!body(out).starts_with("ERROR"), "{good}");
        }
    }

    #[test]
    fn pages_by_max_results_without_ids_and_omits_stopped_instances() {
        let mut instances: Vec<Instance> = (0..5)
            .map(|n| {
                inst(
                    &format!("i-{n:017x}"),
                    "p5.48xlarge",
                    &["nn-a", "nn-b", "nn-c"],
                )
            })
            .collect();
        instances[4].state = "stopped".into();
        let m = MockEc2::new(Scenario {
            instances,
            ..Default::default()
        });
        let first = body(m.handle(&params(&[("MaxResults", "3")])));
        assert_eq!(first.matches("<instanceId>").count(), 3);
        let token = first
            .split("<nextToken>")
            .nth(1)
            .and_then(|s| s.split("</nextToken>").next())
            .expect("a next token");
        let second = body(m.handle(&params(&[("MaxResults", "3"), ("NextToken", token)])));
        assert_eq!(
            second.matches("<instanceId>").count(),
            1,
            "the stopped one is left out"
        );
        assert!(!second.contains("<nextToken>"));
    }

    #[test]
    fn filters_support_wildcards() {
        let m = MockEc2::new(Scenario {
            instances: vec![
                inst("i-00000000000000001", "p5.48xlarge", &["a"]),
                inst("i-00000000000000002", "trn2.48xlarge", &["a"]),
            ],
            ..Default::default()
        });
        let out = body(m.handle(&params(&[
            ("Filter.1.Name", "instance-type"),
            ("Filter.1.Value.1", "p5*"),
        ])));
        assert!(out.contains("i-00000000000000001") && !out.contains("i-00000000000000002"));
        assert!(wildcard_match("p?.48x*", "p5.48xlarge"));
        assert!(!wildcard_match("p?.48x", "p5.48xlarge"));
    }

    #[test]
    fn token_bucket_throttles_past_its_burst_and_counts_it() {
        let m = MockEc2::new(Scenario::default());
        m.set_faults(Faults {
            token_bucket: Some(TokenBucket {
                burst: 2.0,
                rate: 0.001,
            }),
            ..Faults::default()
        });
        let outs: Vec<String> = (0..3).map(|_| body(m.handle(&params(&[])))).collect();
        assert!(!outs[0].starts_with("ERROR") && !outs[1].starts_with("ERROR"));
        assert_eq!(outs[2], "ERROR RequestLimitExceeded");
        assert_eq!(m.stats().throttled, 1);
        assert_eq!(m.stats().calls, 3);
    }

    #[test]
    fn fractional_faults_hit_exactly_their_share() {
        let m = MockEc2::new(Scenario::default());
        m.set_faults(Faults {
            throttle_fraction: 0.5,
            ..Faults::default()
        });
        let outs: Vec<String> = (0..10).map(|_| body(m.handle(&params(&[])))).collect();
        let throttled = outs
            .iter()
            .filter(|o| *o == "ERROR RequestLimitExceeded")
            .count();
        assert_eq!(throttled, 5);
        assert_eq!(outs[1], "ERROR RequestLimitExceeded", "every second call");
    }

    #[test]
    fn xml_escapes_hostile_group_names() {
        let mut i = inst("i-00000000000000001", "p5.48xlarge", &["a"]);
        i.group_name = Some("a<b>&\"c'".into());
        let m = MockEc2::new(Scenario {
            instances: vec![i],
            ..Default::default()
        });
        let out = body(m.handle(&params(&[])));
        assert!(out.contains("<groupName>a&lt;b&gt;&amp;&quot;c&apos;</groupName>"));
    }
}

//! The production [`TopologySource`]: `DescribeInstanceTopology` through EC2's Query API
//! ([`super::query`]).
//!
//! Credentials come from the AWS SDK's default chain (environment, profile, IRSA web identity,
//! EKS Pod Identity); `AWS_ENDPOINT_URL_EC2` / `AWS_ENDPOINT_URL` redirect calls (tests use a
//! mock). Nothing retries behind the caller's back: throttling and retries are handled once, for
//! every caller, by the shared limiter and the reconciler's backoff.
//!
//! Owns: the regions called (at most [`MAX_REGIONS`]) and how their answers are read and
//! refused. Never caches or retries: the cache, the batcher and the limiter do.

use crate::bounds::{Bound, millis, secs};
use std::{collections::HashMap, sync::Mutex, time::Duration};

use aws_config::{BehaviorVersion, retry::RetryConfig, timeout::TimeoutConfig};
use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
use roxmltree::Node;

use clap::Args;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    limiter::LimiterConfig,
    query::{Api, Endpoint, document, items, list, next_token, paged, strings, text},
};
use crate::{
    duration::HumanDuration,
    topology::{Ec2Error, InstanceTopology, TopologySource},
};

/// Calls without a timeout of their own in the SDK configuration ([`AwsTopology::new`]) wait
/// this long.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Pages followed for one batch before giving up (EC2 answers up to 100 IDs in one page; this
/// only guards against a misbehaving endpoint that keeps sending `nextToken`).
const MAX_PAGES: usize = 10;

/// EC2 clients kept at most, one per region.
pub const MAX_REGIONS: usize = 32;

/// The shape [`crate::provider_id::is_region_name`] accepts, for the chart's schema (a test
/// checks the two agree).
pub const REGION_PATTERN: &str = "^[a-z]{2,4}(-[a-z]{2,4})?-(north|south|east|west|central|northeast|northwest|southeast|southwest)-[0-9]{1,2}$";

/// `--region`: a region name (`us-west-2`, `us-gov-west-1`), refused at start otherwise (every
/// call would only fail later, naming a host that does not exist).
pub fn parse_region(s: &str) -> Result<String, String> {
    if crate::provider_id::is_region_name(s) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not an AWS region name like us-west-2"))
    }
}

/// `--ec2-rate`'s range.
pub const EC2_RATE_RANGE: Bound = Bound::number("ec2-rate", 0.01, 1000.0);
/// `--ec2-burst`'s range.
pub const EC2_BURST_RANGE: Bound = Bound::number("ec2-burst", 1.0, 10_000.0);
/// `--ec2-timeout`'s range.
pub const EC2_TIMEOUT_RANGE: Bound = Bound::duration("ec2-timeout", millis(100), secs(600));
/// `--ec2-throttle-backoff-max`'s range.
pub const EC2_THROTTLE_BACKOFF_MAX_RANGE: Bound =
    Bound::duration("ec2-throttle-backoff-max", millis(100), secs(3600));

/// How we talk to EC2.
#[derive(Debug, Clone, Args, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Ec2Args {
    /// AWS region for every node; by default derived from each node's zone (us-west-2b →
    /// us-west-2).
    #[arg(long, env = "AWS_REGION", value_parser = parse_region)]
    #[schemars(regex(pattern = REGION_PATTERN))]
    pub region: Option<String>,
    /// Sustained DescribeInstanceTopology calls per second (EC2's account-wide bucket refills at
    /// about 20/s and is shared with every other tool).
    #[arg(long, value_parser = EC2_RATE_RANGE.numbers(), env = "LABELER_EC2_RATE", default_value_t = 5.0)]
    pub ec2_rate: f64,
    /// Calls allowed back to back.
    #[arg(long, value_parser = EC2_BURST_RANGE.numbers(), env = "LABELER_EC2_BURST", default_value_t = 20.0)]
    pub ec2_burst: f64,
    /// Timeout of one call.
    #[arg(long, value_parser = EC2_TIMEOUT_RANGE.durations(), env = "LABELER_EC2_TIMEOUT", default_value = "10s")]
    pub ec2_timeout: HumanDuration,
    /// Longest pause every caller takes after EC2 throttles (RequestLimitExceeded).
    #[arg(long, value_parser = EC2_THROTTLE_BACKOFF_MAX_RANGE.durations(), env = "LABELER_EC2_THROTTLE_BACKOFF_MAX", default_value = "30s")]
    pub ec2_throttle_backoff_max: HumanDuration,
}

impl Ec2Args {
    pub fn limiter(&self) -> LimiterConfig {
        LimiterConfig {
            rate: self.ec2_rate,
            burst: self.ec2_burst,
            backoff_cap: self.ec2_throttle_backoff_max.0,
            ..LimiterConfig::default()
        }
    }
}

/// The regions with a client (EC2's endpoint there). Region names come from providerIDs, which whoever may create a
/// Node writes: a region EC2 has answered from (proven) keeps its client, up to
/// [`MAX_REGIONS`]; any other is on trial, and all of them together take one slot (a new one
/// replaces the last), so hostile names (`aws:///zz-north-1a/i-…`, one region each) never crowd
/// out the real ones.
#[derive(Default)]
struct Clients {
    by_region: HashMap<String, Endpoint>,
    proven: std::collections::HashSet<String>,
    trial: Option<String>,
}

impl Clients {
    /// Room for a client of `region`, not held yet: refused when it is proven and the proven
    /// fill every slot; a region on trial takes the trial slot (dropping the last trial's
    /// client: a call in flight keeps its own handle).
    fn admit(&mut self, region: &str) -> Result<(), Ec2Error> {
        if self.proven.contains(region) {
            if self.by_region.len() - usize::from(self.trial.is_some()) >= MAX_REGIONS {
                return Err(too_many(region));
            }
            return Ok(());
        }
        if self.proven.len() >= MAX_REGIONS {
            return Err(too_many(region));
        }
        if let Some(last) = self.trial.replace(region.to_string()) {
            self.by_region.remove(&last);
        }
        Ok(())
    }

    /// EC2 answered from `region` (an answer or an error of its own, not a failure to reach
    /// it): it keeps its client.
    fn prove(&mut self, region: &str) {
        if self.trial.as_deref() == Some(region) {
            self.trial = None;
        }
        if !self.proven.contains(region) && self.proven.len() < MAX_REGIONS {
            self.proven.insert(region.to_string());
        }
    }
}

fn too_many(region: &str) -> Ec2Error {
    Ec2Error::InvalidRequest {
        code: "TooManyRegions".into(),
        message: format!(
            "nodes name more than {MAX_REGIONS} regions; not opening a client for {region:?} (set --region, or check the nodes' providerIDs)"
        ),
    }
}

/// Which pages of a paginated call wait for the shared limiter ([`AwsTopology::follow`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pace {
    /// All but the first (whose token the caller took: the batcher's calls).
    AfterFirst,
    /// Every page.
    Every,
}

/// One paginated EC2 call, for [`AwsTopology::follow`].
pub(super) struct Listing<'a> {
    /// The call, as its errors name it.
    pub(super) what: &'a str,
    pub(super) action: &'static str,
    /// Its parameters but the NextToken.
    pub(super) params: Vec<(String, String)>,
    /// The element of the answer holding its items (`instanceSet`).
    pub(super) set: &'static str,
    pub(super) pace: Pace,
    pub(super) max_pages: usize,
}

pub struct AwsTopology {
    api: Api,
    clients: Mutex<Clients>,
    /// The shared EC2 budget: each page after the first takes a token (the batcher takes the
    /// first's before it calls).
    limiter: Option<std::sync::Arc<super::limiter::Limiter>>,
}

impl AwsTopology {
    /// Load the SDK configuration from the environment. `call_timeout` bounds each call.
    pub async fn from_env(call_timeout: Duration) -> Self {
        Self::new(Self::loader(call_timeout).load().await)
    }

    /// Use an SDK configuration built by the caller (tests point it at a mock): its
    /// credentials, endpoint settings and operation timeout.
    pub fn new(base: aws_config::SdkConfig) -> Self {
        let timeout = base
            .timeout_config()
            .and_then(|t| t.operation_timeout())
            .unwrap_or(DEFAULT_TIMEOUT);
        Self {
            api: Api::new(&base, timeout),
            clients: Mutex::new(Clients::default()),
            limiter: None,
        }
    }

    /// Pace the pages of a paginated answer with the limiter every call shares.
    pub fn with_limiter(self, limiter: std::sync::Arc<super::limiter::Limiter>) -> Self {
        Self {
            limiter: Some(limiter),
            ..self
        }
    }

    /// Every call that is not a batch of instances (whose first token the batcher takes)
    /// waits for the shared limiter's token, when there is one.
    pub(super) async fn pace(&self) {
        if let Some(limiter) = &self.limiter {
            limiter.acquire().await;
        }
    }

    /// Follows one paginated EC2 call to its end: `listing.action` with `listing.params` (and,
    /// after the first page, the NextToken of the page before) to `region` at `at`; each item of
    /// every page's `listing.set` goes to `each`. An empty NextToken ends the answer as an
    /// absent one does. A page waits for the shared limiter as `listing.pace` says. More than
    /// `listing.max_pages` pages is a broken answer (`listing.what` names the call in the error).
    pub(super) async fn follow(
        &self,
        region: &str,
        at: &Endpoint,
        listing: Listing<'_>,
        mut each: impl FnMut(Node<'_, '_>) -> Result<(), Ec2Error>,
    ) -> Result<(), Ec2Error> {
        let Listing {
            what,
            action,
            params,
            set,
            pace,
            max_pages,
        } = listing;
        let mut next: Option<String> = None;
        for page in 0..max_pages {
            if page > 0 || pace == Pace::Every {
                self.pace().await;
            }
            let body = self
                .call(region, at, action, paged(params.clone(), next.take()))
                .await?;
            let doc = document(action, &body)?;
            for item in items(&doc, set) {
                each(item)?;
            }
            next = next_token(&doc).filter(|t| !t.is_empty());
            if next.is_none() {
                return Ok(());
            }
        }
        Err(Ec2Error::BadResponse(format!(
            "{what}: still paginating after {max_pages} pages"
        )))
    }

    /// The SDK configuration loader with our transport (for the credential providers' own
    /// calls: STS, the Pod Identity agent), timeouts and retry policy.
    pub fn loader(call_timeout: Duration) -> aws_config::ConfigLoader {
        // One TLS stack for the process: rustls with ring, the same provider kube uses.
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let timeouts = TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(3).min(call_timeout))
            .operation_attempt_timeout(call_timeout)
            .operation_timeout(call_timeout)
            .build();
        aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .retry_config(RetryConfig::disabled())
            .timeout_config(timeouts)
    }

    /// EC2's endpoint in `region`, found on first use (see [`Clients`]). Region names come
    /// from providerIDs (validated, see `provider_id::is_region_name`).
    pub(super) fn client(&self, region: &str) -> Result<Endpoint, Ec2Error> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = clients.by_region.get(region) {
            return Ok(at.clone());
        }
        let at = self.api.endpoints.endpoint(region)?;
        clients.admit(region)?;
        clients.by_region.insert(region.to_string(), at.clone());
        Ok(at)
    }

    /// One call of `action` with `params` to EC2 in `region` at `at` (from [`Self::client`]).
    pub(super) async fn call(
        &self,
        region: &str,
        at: &Endpoint,
        action: &str,
        params: Vec<(String, String)>,
    ) -> Result<String, Ec2Error> {
        self.api.call(region, at, action, &params).await
    }

    /// What a call to `region` told of it: an answer from EC2 there (described instances, or
    /// an error of EC2's own about the request) proves the region exists; failing to reach it,
    /// credentials refused or missing (which can fail before any call), or no client, do not.
    fn heard(&self, region: &str, result: &Result<Vec<InstanceTopology>, Ec2Error>) {
        let answered = match result {
            Ok(_) => true,
            Err(Ec2Error::InvalidRequest { code, .. }) => {
                code != "TooManyRegions" && code != "InvalidConfiguration"
            }
            Err(
                Ec2Error::Throttled { .. }
                | Ec2Error::Service { .. }
                | Ec2Error::UnsupportedOperation { .. },
            ) => true,
            Err(_) => false,
        };
        if answered {
            self.clients
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .prove(region);
        }
    }
}

impl TopologySource for AwsTopology {
    async fn describe(
        &self,
        region: &str,
        instance_ids: &[String],
    ) -> Result<Vec<InstanceTopology>, Ec2Error> {
        let result = self.pages(region, instance_ids).await;
        self.heard(region, &result);
        result
    }
}

impl AwsTopology {
    /// Every page of the answer for `instance_ids` in `region`.
    async fn pages(
        &self,
        region: &str,
        instance_ids: &[String],
    ) -> Result<Vec<InstanceTopology>, Ec2Error> {
        const ACTION: &str = "DescribeInstanceTopology";
        let at = &self.client(region)?;
        let mut out = Vec::with_capacity(instance_ids.len());
        // Instance IDs only: never MaxResults with IDs (EC2 refuses the combination), never an
        // unfiltered scan of the region.
        self.follow(
            region,
            at,
            Listing {
                what: &format!("{ACTION} for {} instance IDs", instance_ids.len()),
                action: ACTION,
                params: list("InstanceId", instance_ids),
                set: "instanceSet",
                pace: Pace::AfterFirst,
                max_pages: MAX_PAGES,
            },
            |item| {
                out.push(believe(item, instance_ids)?);
                Ok(())
            },
        )
        .await?;
        Ok(out)
    }
}

/// Accept an item only if it is about an instance we asked for and is complete.
///
/// The XML parser refuses a malformed or truncated body; an answer that is well-formed but
/// wrong (items with nonsense IDs, an item whose network node list stops early, which would
/// relabel a node one layer short) is caught here. EC2 always sends the zone and zone ID after
/// the network nodes, so an item without them is a broken answer, refused as a whole.
fn believe(item: Node<'_, '_>, asked: &[String]) -> Result<InstanceTopology, Ec2Error> {
    let shown = || {
        text(item, "instanceId")
            .unwrap_or_default()
            .chars()
            .take(40)
            .collect::<String>()
    };
    let t = convert(item)?.ok_or_else(|| {
        Ec2Error::BadResponse("EC2 described an instance without an instance ID".into())
    })?;
    if !asked.contains(&t.instance_id) {
        return Err(Ec2Error::BadResponse(format!(
            "EC2 described an instance we did not ask for: {:?}",
            shown()
        )));
    }
    if t.availability_zone.is_none() || t.zone_id.is_none() {
        return Err(Ec2Error::BadResponse(format!(
            "EC2's answer for {} is incomplete (no zone): truncated?",
            shown()
        )));
    }
    Ok(t)
}

fn convert(t: Node<'_, '_>) -> Result<Option<InstanceTopology>, Ec2Error> {
    let owned = |name: &str| text(t, name).map(str::to_owned);
    let network_nodes = strings(t, "networkNodeSet")?;
    let Some(instance_id) = owned("instanceId") else {
        return Ok(None);
    };
    Ok(Some(InstanceTopology {
        instance_id,
        instance_type: owned("instanceType"),
        availability_zone: owned("availabilityZone"),
        zone_id: owned("zoneId"),
        network_nodes,
        group_name: owned("groupName"),
        capacity_block_id: owned("capacityBlockId"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aws() -> AwsTopology {
        AwsTopology::new(
            aws_config::SdkConfig::builder()
                .behavior_version(BehaviorVersion::latest())
                .build(),
        )
    }

    fn held(t: &AwsTopology) -> usize {
        t.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_region
            .len()
    }

    /// Issue 55.4: regions named by hostile providerIDs, never heard from, take one client slot
    /// between them, and never crowd out a region EC2 answered from.
    #[test]
    fn unknown_regions_take_one_client_slot_between_them() {
        let t = aws();
        t.client("us-west-2").expect("a client");
        t.heard("us-west-2", &Ok(vec![]));
        for k in 0..100 {
            let fake = format!("zz-north-{}", k % 90 + 1);
            t.client(&fake).expect("a trial client");
            t.heard(&fake, &Err(Ec2Error::Transport("dns error".into())));
            assert!(held(&t) <= 2, "{} clients after {k} fake regions", held(&t));
        }
        assert!(
            t.clients
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .by_region
                .contains_key("us-west-2"),
            "the real region keeps its client"
        );
        // Refused credentials say nothing of a region (they can fail before any call).
        t.client("ap-south-1").expect("a trial client");
        t.heard(
            "ap-south-1",
            &Err(Ec2Error::from_code("UnauthorizedOperation", "no")),
        );
        // A second real region is on trial until EC2 answers from it, then it stays.
        t.client("eu-west-1").expect("a trial client");
        t.heard(
            "eu-west-1",
            &Err(Ec2Error::from_code(
                "InvalidInstanceID.NotFound",
                "no such instance",
            )),
        );
        t.client("zz-north-99").expect("a trial client");
        assert_eq!(
            held(&t),
            3,
            "us-west-2, eu-west-1 (proven) and one on trial"
        );
    }

    /// Proven regions fill at most every slot; then no new region gets a client.
    #[test]
    fn proven_regions_are_bounded() {
        let t = aws();
        for k in 0..MAX_REGIONS {
            let r = format!("us-west-{}", k + 1);
            t.client(&r).expect("a client");
            t.heard(&r, &Ok(vec![]));
        }
        assert!(matches!(
            t.client("eu-west-1"),
            Err(Ec2Error::InvalidRequest { code, .. }) if code == "TooManyRegions"
        ));
        assert!(t.client("us-west-1").is_ok(), "the proven keep theirs");
    }
}

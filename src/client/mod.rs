//! The Kubernetes client every command uses: each call bounded in time, the process paced, and
//! (for the controller) every write fenced by the lease.
//!
//! - **Bounded**: connecting is bounded by `--kube-connect-timeout`; every call but a watch, its
//!   response body included, by `--kube-request-timeout`, and the API server is told the same
//!   bound (its `timeout` parameter) so that it gives up on the request too. A watch is bounded
//!   by the API server's own `timeoutSeconds` and the watcher's restarts.
//! - **Paced**: every request waits for a token of one bucket (`--kube-qps`, `--kube-burst`), as
//!   client-go's QPS and burst.
//! - **Fenced**: with leader election, a write (any method but GET, HEAD and OPTIONS, Events
//!   aside) is sent only while this replica leads, is told to the API server with a timeout that
//!   ends at the renew deadline, and is cancelled there, or as soon as the Lease is lost. The
//!   renew deadline is the renew grace before another replica can take the Lease over, so no
//!   write of ours can land after another leader started (see [`crate::leader::Fence`]). A write
//!   cut off frees its slot at once.
//!
//! The Lease itself is written through a client without the fence and the pace (the election
//! must renew while the writes queue).
//!
//! Owns: the client's transport policy. Never decides what to write.

use crate::bounds::{Bound, secs};
use std::{sync::Arc, task::Poll, time::Duration};

use bytes::Bytes;
use clap::Args;
use futures::future::BoxFuture;
use http::{Method, Request, Response, Uri};
use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};
use kube::client::{Body, ClientBuilder};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt, util::BoxService};

use crate::{
    duration::HumanDuration,
    leader::{Fence, Leadership},
    lookup::limiter::{Limiter, LimiterConfig},
};

mod health;
pub(crate) mod pages;
pub(crate) use health::WatchHealth;
#[cfg(test)]
mod tests;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response: a watch's streamed, any other read whole within its deadline.
pub(crate) type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// `--kube-connect-timeout`'s range.
pub(crate) const KUBE_CONNECT_TIMEOUT_RANGE: Bound =
    Bound::duration("kube-connect-timeout", secs(1), secs(300));
/// `--kube-request-timeout`'s range.
pub(crate) const KUBE_REQUEST_TIMEOUT_RANGE: Bound =
    Bound::duration("kube-request-timeout", secs(1), secs(600));
/// `--kube-qps`'s range.
pub(crate) const KUBE_QPS_RANGE: Bound = Bound::number("kube-qps", 1.0, 100_000.0);
/// `--kube-burst`'s range.
pub(crate) const KUBE_BURST_RANGE: Bound = Bound::number("kube-burst", 1.0, 100_000.0);

/// How the process talks to the API server.
#[derive(Debug, Clone, Args, PartialEq)]
pub struct ClientArgs {
    /// Time to connect to the API server (TCP and TLS).
    #[arg(
        long,
        value_parser = KUBE_CONNECT_TIMEOUT_RANGE.durations(),
        env = "LABELER_KUBE_CONNECT_TIMEOUT",
        default_value = "10s"
    )]
    pub(crate) kube_connect_timeout: HumanDuration,
    /// Time for one API call but a watch, response included; the API server is given the same
    /// bound. A write is also cut off at the renew deadline (see docs/reliability.md).
    #[arg(
        long,
        value_parser = KUBE_REQUEST_TIMEOUT_RANGE.durations(),
        env = "LABELER_KUBE_REQUEST_TIMEOUT",
        default_value = "30s"
    )]
    pub(crate) kube_request_timeout: HumanDuration,
    /// Sustained API requests a second (client-go's QPS). Above the controller's measured write
    /// pace (~430 a second): a ceiling against a runaway loop, not a brake on an install.
    #[arg(
        long,
        value_parser = KUBE_QPS_RANGE.numbers(),
        env = "LABELER_KUBE_QPS",
        default_value_t = 500.0
    )]
    pub(crate) kube_qps: f64,
    /// API requests allowed back to back after a quiet period (client-go's burst).
    #[arg(
        long,
        value_parser = KUBE_BURST_RANGE.numbers(),
        env = "LABELER_KUBE_BURST",
        default_value_t = 1000.0
    )]
    pub(crate) kube_burst: f64,
}

impl Default for ClientArgs {
    fn default() -> Self {
        Self {
            kube_connect_timeout: HumanDuration(Duration::from_secs(10)),
            kube_request_timeout: HumanDuration(Duration::from_secs(30)),
            kube_qps: 500.0,
            kube_burst: 1000.0,
        }
    }
}

/// Why a call was cut short by us (the error a caller sees, inside `kube::Error::Service`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum Cut {
    #[error("not sent: this replica no longer leads (a write is fenced by the lease)")]
    NotLeading,
    #[error("cancelled: this replica stopped leading while the write was in flight")]
    LostLeadership,
    #[error(
        "cut at the renew deadline it was sent with (a later renewal does not extend a write in flight)"
    )]
    RenewDeadline,
    #[error("the API server did not answer within {0:?} (--kube-request-timeout)")]
    TimedOut(Duration),
}

impl Cut {
    /// The cut inside an error from the client, if any.
    pub(crate) fn of(e: &kube::Error) -> Option<&Cut> {
        let kube::Error::Service(e) = e else {
            return None;
        };
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e.as_ref());
        while let Some(s) = source {
            if let Some(cut) = s.downcast_ref::<Cut>() {
                return Some(cut);
            }
            source = s.source();
        }
        None
    }

    /// Cut by the lease fence: about this replica's leadership, not about the API server.
    pub(crate) fn is_fenced(&self) -> bool {
        !matches!(self, Cut::TimedOut(_))
    }

    /// The metric label.
    pub(crate) fn reason(&self) -> &'static str {
        if self.is_fenced() {
            "fenced"
        } else {
            "timeout"
        }
    }
}

/// The policy [`Bounded`] applies.
#[derive(Clone)]
pub(crate) struct Policy {
    request_timeout: Duration,
    pace: Option<Arc<Limiter>>,
    fence: Option<Leadership>,
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// Told when a Node watch starts (a 2xx answer to the watch request).
    watch: Option<Arc<crate::client::WatchHealth>>,
}

impl Policy {
    /// Calls bounded by `args`, paced by its bucket; no fence.
    pub(crate) fn new(args: &ClientArgs) -> Self {
        Self {
            request_timeout: args.kube_request_timeout.0,
            pace: Some(Arc::new(Limiter::new(LimiterConfig {
                rate: args.kube_qps,
                burst: args.kube_burst,
                ..LimiterConfig::default()
            }))),
            fence: None,
            metrics: None,
            watch: None,
        }
    }

    /// Calls bounded by `args`, unpaced (the Lease's client).
    pub(crate) fn unpaced(args: &ClientArgs) -> Self {
        Self {
            pace: None,
            ..Self::new(args)
        }
    }

    /// Writes fenced by `leadership`.
    pub(crate) fn fenced(mut self, leadership: Leadership) -> Self {
        self.fence = Some(leadership);
        self
    }

    /// Node watch starts told to `health`.
    pub(crate) fn watching(mut self, health: Arc<crate::client::WatchHealth>) -> Self {
        self.watch = Some(health);
        self
    }

    /// Cut calls counted in `metrics`.
    pub(crate) fn counted(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

/// A client to the cluster the environment names (kubeconfig or in-cluster), with `policy`.
pub(crate) async fn connect(args: &ClientArgs, policy: Policy) -> crate::Result<kube::Client> {
    // kube's own retries (429, 503, 504) run below this layer, each resent with the same
    // `timeout`: a write retried just before its fence would get a fresh window at the API
    // server. A failed call is retried by its caller instead (reconcile backoff, the next
    // publish interval, the watcher's backoff).
    build(args, policy, false).await
}

async fn build(args: &ClientArgs, policy: Policy, retry: bool) -> crate::Result<kube::Client> {
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| crate::Error::Config(format!("no Kubernetes configuration: {e}")))?;
    config.connect_timeout = Some(args.kube_connect_timeout.0);
    // No read timeout on the connection: it would cut watches; calls are bounded per request.
    config.read_timeout = None;
    config.default_retry = retry;
    let builder = ClientBuilder::try_from(config)?;
    Ok(builder.with_layer(&BoundedLayer(policy)).build())
}

/// A client with the default bounds and pace (the commands other than `run`). No fence to
/// outrun: kube's own retries are on, so that a command run as the API server comes up (or
/// sheds load: 429 "storage is (re)initializing", 503, 504) waits for it instead of failing.
pub(crate) async fn connect_default() -> crate::Result<kube::Client> {
    let args = ClientArgs::default();
    build(&args, Policy::new(&args), true).await
}

/// A client over `service` (tests: a mocked API server) with `policy`.
#[cfg(test)]
pub(crate) fn over<S, B>(service: S, namespace: &str, policy: Policy) -> kube::Client
where
    S: Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    ClientBuilder::new(service, namespace)
        .with_layer(&BoundedLayer(policy))
        .build()
}

/// The layer of [`Bounded`].
pub(crate) struct BoundedLayer(pub Policy);

/// The stack below: a call takes the lock only to be handed its response future.
type Inner = Arc<std::sync::Mutex<BoxService<Request<Body>, Response<ResponseBody>, BoxError>>>;

impl<S, B> Layer<S> for BoundedLayer
where
    S: Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Service = Bounded;

    fn layer(&self, inner: S) -> Self::Service {
        let boxed = BoxService::new(
            inner
                .map_response(|r: Response<B>| r.map(|b| b.map_err(Into::into).boxed_unsync()))
                .map_err(Into::into),
        );
        Bounded {
            // Shared by every call in flight (each call owns a handle).
            inner: Arc::new(std::sync::Mutex::new(boxed)),
            policy: self.0.clone(),
        }
    }
}

/// Applies a [`Policy`] to each request (see the module's comment).
#[derive(Clone)]
pub(crate) struct Bounded {
    inner: Inner,
    policy: Policy,
}

/// A watch (streamed for as long as the API server keeps it open).
fn is_watch(uri: &Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "watch=True"))
    })
}

/// A write the fence applies to: any method but the reads, Events aside (an Event about what
/// happened is no claim on the cluster's state, and a follower may tell why it waits). An Event
/// is `/api/v1/namespaces/NS/events[/NAME]` or `/apis/events.k8s.io/VERSION/namespaces/NS/events
/// [/NAME]`, segment for segment (a Node, a HyperNode or a namespace named `events` is not).
fn is_fenced_write(method: &Method, uri: &Uri) -> bool {
    let read = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    !read && !is_event(uri.path())
}

fn is_event(path: &str) -> bool {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let rest = match segments.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", "events.k8s.io", _, rest @ ..] => rest,
        _ => return false,
    };
    matches!(
        rest,
        ["namespaces", _, "events"] | ["namespaces", _, "events", _]
    )
}

/// `uri` with the API server's `timeout` parameter, in milliseconds (a Go duration: `850ms`).
fn with_timeout(uri: &Uri, timeout: Duration) -> Option<Uri> {
    let ms = timeout.as_millis().max(1);
    let pq = match uri.query() {
        Some(q) if q.split('&').any(|kv| kv.starts_with("timeout=")) => return None,
        Some(q) => format!("{}?{q}&timeout={ms}ms", uri.path()),
        None => format!("{}?timeout={ms}ms", uri.path()),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = pq.parse().ok();
    Uri::from_parts(parts).ok()
}

/// A fenced write is not sent with less than this before the renew deadline: too little for
/// the API server to apply it, and the margin the deadline keeps from another leader is the
/// renew grace whatever happens.
pub(crate) const LEAST_WRITE_TIME: Duration = Duration::from_millis(250);

impl Service<Request<Body>> for Bounded {
    type Response = Response<ResponseBody>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> Poll<Result<(), BoxError>> {
        // Each call waits for the buffer in its own future, after its pace.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        Box::pin(send(self.inner.clone(), self.policy.clone(), req))
    }
}

/// One request under `policy` (see the module's comment).
async fn send(
    inner: Inner,
    policy: Policy,
    mut req: Request<Body>,
) -> Result<Response<ResponseBody>, BoxError> {
    if let Some(pace) = policy.pace.clone() {
        pace.acquire().await;
    }
    if is_watch(req.uri()) {
        // The stream is bounded by the API server's `timeoutSeconds` and the watcher's idle
        // timeout; its start (the response's head) by the request timeout.
        let node_watch = policy
            .watch
            .clone()
            .filter(|_| req.uri().path() == "/api/v1/nodes");
        let started = tokio::time::timeout(policy.request_timeout, call(&inner, req)).await;
        let response = match started {
            Ok(r) => r?,
            Err(_) => return Err(policy.cut(Cut::TimedOut(policy.request_timeout))),
        };
        if let Some(health) = node_watch
            && response.status().is_success()
        {
            // A watch resumed: in a quiet cluster no event would say so.
            health.ok();
        }
        return Ok(response);
    }
    let now = Instant::now();
    let mut deadline = now + policy.request_timeout;
    let mut fenced_at = None;
    let fence = policy
        .fence
        .clone()
        .filter(|_| is_fenced_write(req.method(), req.uri()));
    if let Some(leadership) = &fence {
        match leadership.fence() {
            Fence::Unfenced | Fence::UntilSteppedDown => {}
            Fence::Lost => return Err(policy.cut(Cut::NotLeading)),
            Fence::Until(until) if until.saturating_duration_since(now) < LEAST_WRITE_TIME => {
                return Err(policy.cut(Cut::NotLeading));
            }
            Fence::Until(until) if until < deadline => {
                deadline = until;
                fenced_at = Some(until);
            }
            Fence::Until(_) => {}
        }
    }
    let bound = deadline.saturating_duration_since(now);
    if let Some(uri) = with_timeout(req.uri(), bound) {
        *req.uri_mut() = uri;
    }
    let lost = {
        let fence = fence.clone();
        async move {
            match fence {
                Some(l) => l.lost().await,
                None => std::future::pending().await,
            }
        }
    };
    tokio::select! {
        done = tokio::time::timeout_at(deadline, exchange(inner, req)) => match done {
            Ok(r) => r,
            Err(_) if fence.is_some_and(|l| !l.is_leader()) => Err(policy.cut(Cut::LostLeadership)),
            Err(_) if fenced_at.is_some() => Err(policy.cut(Cut::RenewDeadline)),
            Err(_) => Err(policy.cut(Cut::TimedOut(bound))),
        },
        () = lost => Err(policy.cut(Cut::LostLeadership)),
    }
}

/// The stack below called once it is ready (under its lock, released before the response).
fn call(
    inner: &Inner,
    req: Request<Body>,
) -> impl Future<Output = Result<Response<ResponseBody>, BoxError>> + Send + 'static {
    let mut req = Some(req);
    let inner = inner.clone();
    let sent = futures::future::poll_fn(move |cx| {
        let mut service = inner.lock().unwrap_or_else(|e| e.into_inner());
        match service.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => match req.take() {
                Some(req) => Poll::Ready(Ok(service.call(req))),
                None => Poll::Ready(Err::<_, BoxError>("a request sent twice".into())),
            },
        }
    });
    async move { sent.await?.await }
}

/// The request sent and its response read whole.
async fn exchange(inner: Inner, req: Request<Body>) -> Result<Response<ResponseBody>, BoxError> {
    let (parts, body) = match call(&inner, req).await {
        Ok(response) => response.into_parts(),
        Err(e) => return Err(e),
    };
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Err(e),
    };
    Ok(Response::from_parts(
        parts,
        Full::new(bytes).map_err(|e| match e {}).boxed_unsync(),
    ))
}

impl Policy {
    /// The error of a cut call, counted.
    fn cut(&self, cut: Cut) -> BoxError {
        if let Some(m) = &self.metrics {
            m.api_call_cut(cut.reason());
        }
        Box::new(cut)
    }
}

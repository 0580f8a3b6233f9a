//! The admin HTTP servers: `/metrics`, `/livez` (the tasks the controller cannot work without
//! still run), `/readyz` (ready once the node cache synced); and on loopback `/debug/nodes/NAME`
//! (the controller's view of a node, for `explain`).
//!
//! Owns: the admin endpoints. Never changes the controller's state.

use crate::bounds::{Bound, secs};
use std::{
    io,
    net::{Ipv4Addr, SocketAddr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use clap::Args;

use axum::{
    Router,
    extract::{ConnectInfo, Path, State},
    http::StatusCode,
    http::header,
    response::IntoResponse,
    routing::get,
};
use tracing::{error, info, warn};

use crate::{metrics::Metrics, tasks::Liveness};

/// `--watch-unhealthy-after`'s range.
pub(crate) const WATCH_UNHEALTHY_AFTER_RANGE: Bound =
    Bound::duration("watch-unhealthy-after", secs(10), secs(3600));
/// `--watch-timeout`'s range.
pub(crate) const WATCH_TIMEOUT_RANGE: Bound = Bound::duration("watch-timeout", secs(5), secs(3600));

/// What the deployment sets itself (the chart owns these flags).
#[derive(Debug, Clone, Args, PartialEq)]
pub struct ServeArgs {
    /// Record Kubernetes Events on a Node when its labels change or it cannot be labelled.
    #[arg(long, env = "LABELER_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub events: bool,
    /// Address of the HTTP server for /metrics, /livez and /readyz. The default `[::]:8080`
    /// takes IPv4 and IPv6 connections (on a host without IPv6: 0.0.0.0:8080).
    #[arg(long, env = "LABELER_METRICS_ADDR", default_value = "[::]:8080")]
    pub metrics_addr: SocketAddr,
    /// Address of `/debug/nodes/NAME`, the controller's view of a node that `explain` reads in
    /// the controller's Pod. Loopback by default: it names instances and errors, and only
    /// processes in the Pod's own network namespace (its containers, a mesh sidecar among them)
    /// reach a loopback listener; nothing from outside the Pod does.
    #[arg(long, env = "LABELER_DEBUG_ADDR", default_value = "127.0.0.1:8081")]
    pub debug_addr: SocketAddr,
    /// `/readyz` fails once the Node watch has been failing this long (a revoked `watch` on
    /// Nodes, an API server that refuses it): the cache it feeds is going stale.
    #[arg(
        long,
        value_parser = WATCH_UNHEALTHY_AFTER_RANGE.durations(),
        env = "LABELER_WATCH_UNHEALTHY_AFTER",
        default_value = "2m"
    )]
    pub(crate) watch_unhealthy_after: crate::duration::HumanDuration,
    /// How long each Node watch request lasts before it is renewed (the API server's
    /// `timeoutSeconds`): a renewal is when lost rights show, so a shorter one finds a revoked
    /// `watch` sooner, at one request per renewal.
    #[arg(
        long,
        value_parser = WATCH_TIMEOUT_RANGE.durations(),
        env = "LABELER_WATCH_TIMEOUT",
        default_value = "290s"
    )]
    pub(crate) watch_timeout: crate::duration::HumanDuration,
}

/// What `/readyz` checks: the node cache synced once, and its watch not failing for longer than
/// a bound since.
#[derive(Clone)]
pub(crate) struct Readiness {
    pub synced: Arc<AtomicBool>,
    pub watch: Arc<crate::client::WatchHealth>,
    pub(crate) unhealthy_after: std::time::Duration,
}

impl Readiness {
    /// Ready once `synced`, whatever the watch does (tests).
    #[cfg(test)]
    pub(crate) fn synced(synced: Arc<AtomicBool>) -> Self {
        Self {
            synced,
            watch: Arc::default(),
            unhealthy_after: std::time::Duration::MAX,
        }
    }
}

/// The controller's view of one node by name, for `/debug/nodes/NAME` (`None`: unknown node).
pub(crate) type Inspector = Arc<dyn Fn(&str) -> Option<serde_json::Value> + Send + Sync>;

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    ready: Readiness,
    live: Liveness,
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    s.metrics.set_watch_unhealthy(s.ready.watch.unhealthy_for());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(),
    )
}

async fn livez(State(s): State<AppState>) -> (StatusCode, String) {
    let failing = s.live.failing();
    if failing.is_empty() {
        (StatusCode::OK, "ok".into())
    } else {
        error!(
            ?failing,
            "not live: a task the controller cannot work without has stopped"
        );
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("stopped: {}", failing.join(", ")),
        )
    }
}

async fn readyz(State(s): State<AppState>) -> (StatusCode, String) {
    if !s.ready.synced.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "node cache not synced yet".into(),
        );
    }
    let failing = s.ready.watch.unhealthy_for();
    if failing > s.ready.unhealthy_after {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the Node watch has been failing for {}s (see the watch_errors metric and the logs)",
                failing.as_secs()
            ),
        );
    }
    (StatusCode::OK, "ok".into())
}

/// `/debug/nodes/NAME`: the controller's view of a node, for `explain`, on its own listener
/// ([`ServeArgs::debug_addr`], loopback). Loopback peers only, as a second guard.
async fn debug_node(
    State(inspect): State<Inspector>,
    Path(name): Path<String>,
    request: axum::extract::Request,
) -> (StatusCode, String) {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let loopback = peer.is_some_and(|ip| ip.to_canonical().is_loopback());
    if !loopback {
        return (
            StatusCode::FORBIDDEN,
            "loopback only: run `ec2-topology-labeler explain` in the controller's Pod".into(),
        );
    }
    match inspect(&name) {
        Some(view) => (StatusCode::OK, view.to_string()),
        None => (
            StatusCode::NOT_FOUND,
            format!("no node {name} in the cache"),
        ),
    }
}

/// The debug listener's routes.
pub(crate) fn debug_router(inspect: Inspector) -> Router {
    Router::new()
        .route("/debug/nodes/{name}", get(debug_node))
        .with_state(inspect)
}

/// Serve `/debug/nodes/NAME` on an already bound (loopback) listener.
pub(crate) async fn serve_debug(listener: tokio::net::TcpListener, inspect: Inspector) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /debug/nodes/NAME (for explain)");
    }
    let app = debug_router(inspect).into_make_service_with_connect_info::<SocketAddr>();
    if let Err(e) = axum::serve(listener, app).await {
        error!(error = %e, "debug server stopped");
    }
}

pub(crate) fn router(metrics_: Arc<Metrics>, ready: Readiness, live: Liveness) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(AppState {
            metrics: metrics_,
            ready,
            live,
        })
}

/// Bind the admin server's address. `[::]` (the default) is bound as one dual-stack socket that
/// takes IPv4 and IPv6 connections whatever the host's `net.ipv6.bindv6only`, so the kubelet's
/// probes reach it on IPv4, IPv6 and dual-stack clusters alike. Where the host has no IPv6 (a
/// kernel booted with `ipv6.disable=1`, or IPv6 disabled in the pod's network namespace) the
/// same port is bound on 0.0.0.0 instead. Any other address is bound as given.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
    match bind_exactly(addr) {
        Ok(listener) => Ok(listener),
        Err(e) => match ipv4_fallback(addr, &e) {
            Some(v4) => {
                warn!(%addr, error = %e, fallback = %v4, "no IPv6 on this host; serving on IPv4 only");
                bind_exactly(v4)
            }
            None => Err(e),
        },
    }
}

fn bind_exactly(addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        socket.set_only_v6(false)?;
    }
    // As tokio's own bind: a restarted process can take the port while old connections linger.
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    tokio::net::TcpListener::from_std(socket.into())
}

/// The IPv4 address to fall back to when binding `addr` failed because the host has no IPv6:
/// only for the unspecified IPv6 address (an explicit one is the operator's choice), and only
/// for "no such address family" (no IPv6 in the kernel) or "address not available" (IPv6
/// disabled) — a port in use or a permission error fails start-up as it should.
fn ipv4_fallback(addr: SocketAddr, e: &io::Error) -> Option<SocketAddr> {
    let no_ipv6 =
        e.kind() == io::ErrorKind::AddrNotAvailable || e.raw_os_error() == Some(libc::EAFNOSUPPORT);
    (addr.is_ipv6() && addr.ip().is_unspecified() && no_ipv6)
        .then(|| SocketAddr::from((Ipv4Addr::UNSPECIFIED, addr.port())))
}

/// Serve on an already bound listener (bind first, so a taken port fails start-up).
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ready: Readiness,
    live: Liveness,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /livez, /readyz");
    }
    let app = router(metrics, ready, live).into_make_service();
    if let Err(e) = axum::serve(listener, app).await {
        error!(error = %e, "metrics server stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_ipv6_falls_back_to_ipv4_and_only_from_the_default() {
        let any6: SocketAddr = "[::]:8080".parse().expect("addr");
        let v4: SocketAddr = "0.0.0.0:8080".parse().expect("addr");
        let no_family = io::Error::from_raw_os_error(libc::EAFNOSUPPORT);
        let disabled = io::Error::from_raw_os_error(libc::EADDRNOTAVAIL);
        let in_use = io::Error::from_raw_os_error(libc::EADDRINUSE);
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        assert_eq!(ipv4_fallback(any6, &no_family), Some(v4));
        assert_eq!(ipv4_fallback(any6, &disabled), Some(v4));
        assert_eq!(ipv4_fallback(any6, &in_use), None, "a taken port fails");
        assert_eq!(ipv4_fallback(any6, &denied), None);
        let loopback6: SocketAddr = "[::1]:8080".parse().expect("addr");
        assert_eq!(
            ipv4_fallback(loopback6, &no_family),
            None,
            "an explicit address is bound as given"
        );
        assert_eq!(ipv4_fallback(v4, &disabled), None);
    }

    /// Without a flag the admin server listens on every address family.
    #[test]
    fn the_default_address_is_every_family() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        use clap::Parser;
        let cli = Cli::try_parse_from(["ec2-topology-labeler"]).expect("defaults parse");
        assert_eq!(
            cli.serve.metrics_addr,
            "[::]:8080".parse::<SocketAddr>().expect("addr")
        );
    }

    /// One accepted connection to `to`, answered with a byte.
    async fn reaches(listener: &tokio::net::TcpListener, to: SocketAddr) -> bool {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let accept = async {
            let (mut s, _) = listener.accept().await?;
            s.write_all(b"k").await
        };
        let connect = async {
            let mut s = tokio::net::TcpStream::connect(to).await?;
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.map(|_| b[0] == b'k')
        };
        let run = async { tokio::try_join!(accept, connect) };
        matches!(
            tokio::time::timeout(std::time::Duration::from_secs(5), run).await,
            Ok(Ok(((), true)))
        )
    }

    /// The default address takes IPv4 and IPv6 connections on one port (what an IPv6 or a
    /// dual-stack cluster's kubelet needs); a host without IPv6 gets 0.0.0.0.
    #[tokio::test]
    async fn the_default_address_serves_both_address_families() {
        let listener = bind("[::]:0".parse().expect("addr")).expect("bind");
        let local = listener.local_addr().expect("local address");
        let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, local.port()));
        assert!(reaches(&listener, v4).await, "IPv4 refused on {local}");
        if local.is_ipv6() {
            let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, local.port()));
            assert!(reaches(&listener, v6).await, "IPv6 refused on {local}");
        } else {
            // Only where this host has no IPv6 at all: the fallback took the IPv4 wildcard.
            assert_eq!(local.ip(), Ipv4Addr::UNSPECIFIED);
            assert!(std::net::TcpListener::bind("[::1]:0").is_err());
        }
    }

    async fn get(router: Router, path: &str) -> (StatusCode, String) {
        get_from(router, path, "127.0.0.1:40000").await
    }

    async fn get_from(router: Router, path: &str, peer: &str) -> (StatusCode, String) {
        use tower::ServiceExt;
        let mut request = axum::http::Request::get(path)
            .body(axum::body::Body::empty())
            .expect("request");
        request
            .extensions_mut()
            .insert(ConnectInfo(peer.parse::<SocketAddr>().expect("address")));
        let res = router.oneshot(request).await.expect("response");
        let status = res.status();
        let body = axum::body::to_bytes(res.into_body(), 1 << 16)
            .await
            .expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn livez_fails_once_a_task_the_controller_needs_has_stopped() {
        let live = Liveness::default();
        let batcher = live.task("ec2 batcher");
        let _election = live.task("leader election");
        let router = || {
            super::router(
                Arc::new(Metrics::default()),
                Readiness::synced(Arc::new(AtomicBool::new(true))),
                live.clone(),
            )
        };
        assert_eq!(get(router(), "/livez").await.0, StatusCode::OK);
        drop(batcher);
        let (status, body) = get(router(), "/livez").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, "stopped: ec2 batcher");
        assert_eq!(
            get(router(), "/readyz").await.0,
            StatusCode::OK,
            "readiness is apart"
        );
    }

    /// Readiness fails once the Node watch has been failing longer than its bound, says why,
    /// and comes back with the watch; the gauge follows.
    #[tokio::test(start_paused = true)]
    async fn readyz_fails_while_the_node_watch_fails_past_its_bound() {
        let watch = Arc::new(crate::client::WatchHealth::default());
        let metrics = Arc::new(Metrics::default());
        let router = || {
            super::router(
                metrics.clone(),
                Readiness {
                    synced: Arc::new(AtomicBool::new(true)),
                    watch: watch.clone(),
                    unhealthy_after: std::time::Duration::from_secs(120),
                },
                Liveness::default(),
            )
        };
        assert_eq!(get(router(), "/readyz").await.0, StatusCode::OK);
        for _ in 0..5 {
            watch.error();
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        }
        watch.error();
        let (status, body) = get(router(), "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            body.contains("the Node watch has been failing for 150s"),
            "{body}"
        );
        let (_, scraped) = get(router(), "/metrics").await;
        assert!(
            scraped.contains("ec2_topology_labeler_node_watch_unhealthy_seconds 150"),
            "{scraped}"
        );
        watch.ok();
        assert_eq!(get(router(), "/readyz").await.0, StatusCode::OK);
    }

    /// The node views are on their own router (the debug listener, loopback by default), not
    /// on the metrics port the whole cluster reaches; and they answer loopback peers only, an
    /// IPv4 peer reaching a dual-stack socket (`::ffff:127.0.0.1`) included.
    #[tokio::test]
    async fn node_views_are_served_on_loopback_only() {
        let metrics_port = super::router(
            Arc::new(Metrics::default()),
            Readiness::synced(Arc::new(AtomicBool::new(true))),
            Liveness::default(),
        );
        assert_eq!(
            get(metrics_port, "/debug/nodes/n1").await.0,
            StatusCode::NOT_FOUND,
            "not on the metrics port"
        );
        let inspect: Inspector = Arc::new(|name: &str| {
            (name == "n1").then(|| serde_json::json!({ "identity": "me", "node": name }))
        });
        let router = || debug_router(inspect.clone());
        let (status, body) = get(router(), "/debug/nodes/n1").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains(r#""node":"n1""#), "{body}");
        for peer in ["[::1]:40000", "[::ffff:127.0.0.1]:40000"] {
            assert_eq!(
                get_from(router(), "/debug/nodes/n1", peer).await.0,
                StatusCode::OK,
                "{peer}"
            );
        }
        assert_eq!(
            get(router(), "/debug/nodes/other").await.0,
            StatusCode::NOT_FOUND
        );
        for peer in [
            "10.0.0.7:40000",
            "[::ffff:10.0.0.7]:40000",
            "[fd00::7]:40000",
        ] {
            let (status, body) = get_from(router(), "/debug/nodes/n1", peer).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{peer}: {body}");
        }
    }
}

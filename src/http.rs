//! The admin HTTP server: `/metrics`, `/livez` (the tasks the controller cannot work without
//! still run), `/readyz` (ready once the node cache synced).
//!
//! Owns: the admin endpoints. Never changes the controller's state.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

use clap::Args;

use std::net::SocketAddr;

use axum::{
    Router,
    extract::{ConnectInfo, Path, State},
    http::StatusCode,
    http::header,
    response::IntoResponse,
    routing::get,
};
use tracing::{error, info};

use crate::metrics::Metrics;

/// What the deployment sets itself (the chart owns these flags).
#[derive(Debug, Clone, Args, PartialEq)]
pub struct ServeArgs {
    /// Record Kubernetes Events on a Node when its labels change or it cannot be labelled.
    #[arg(long, env = "LABELER_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub events: bool,
    /// Address of the HTTP server for /metrics, /livez and /readyz.
    #[arg(long, env = "LABELER_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: std::net::SocketAddr,
}

type Check = Box<dyn Fn() -> bool + Send + Sync>;

/// The controller's view of one node by name, for `/debug/nodes/NAME` (`None`: unknown node).
pub type Inspector = Arc<dyn Fn(&str) -> Option<serde_json::Value> + Send + Sync>;

/// What `/livez` checks: named conditions that hold while the process can do its work (the
/// EC2 batcher runs, the leader election runs…). Once one fails the process is of no use
/// until restarted, and the kubelet restarts it.
#[derive(Clone, Default)]
pub struct Liveness {
    checks: Arc<Mutex<Vec<(&'static str, Check)>>>,
}

impl Liveness {
    /// Add a condition that must keep holding.
    pub fn check(&self, name: &'static str, alive: impl Fn() -> bool + Send + Sync + 'static) {
        self.checks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name, Box::new(alive)));
    }

    /// A task that must keep running: it holds the returned guard for its whole life (a panic
    /// drops it too).
    pub fn task(&self, name: &'static str) -> TaskGuard {
        let flag = Arc::new(AtomicBool::new(true));
        let seen = flag.clone();
        self.check(name, move || seen.load(Ordering::SeqCst));
        TaskGuard(flag)
    }

    /// The names of the conditions that no longer hold.
    pub fn failing(&self) -> Vec<&'static str> {
        self.checks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, alive)| !alive())
            .map(|(name, _)| *name)
            .collect()
    }
}

/// Held by a task that must keep running; marks it ended when dropped.
pub struct TaskGuard(Arc<AtomicBool>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    live: Liveness,
    inspect: Option<Inspector>,
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
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

async fn readyz(State(s): State<AppState>) -> (StatusCode, &'static str) {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "node cache not synced yet")
    }
}

/// `/debug/nodes/NAME`: the controller's view of a node, for `explain`. Loopback only: it names
/// instances and errors, and the metrics port is reachable from the whole cluster.
async fn debug_node(
    State(s): State<AppState>,
    Path(name): Path<String>,
    request: axum::extract::Request,
) -> (StatusCode, String) {
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let loopback = peer.is_some_and(|ip| match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    });
    if !loopback {
        return (
            StatusCode::FORBIDDEN,
            "loopback only: run `ec2-topology-labeler explain` in the controller's Pod".into(),
        );
    }
    match s.inspect.as_ref().and_then(|inspect| inspect(&name)) {
        Some(view) => (StatusCode::OK, view.to_string()),
        None => (
            StatusCode::NOT_FOUND,
            format!("no node {name} in the cache"),
        ),
    }
}

pub fn router(
    metrics_: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    live: Liveness,
    inspect: Option<Inspector>,
) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/debug/nodes/{name}", get(debug_node))
        .with_state(AppState {
            metrics: metrics_,
            ready,
            live,
            inspect,
        })
}

/// Serve on an already bound listener (bind first, so a taken port fails start-up).
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    live: Liveness,
    inspect: Option<Inspector>,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /livez, /readyz (and /debug/nodes/NAME on loopback)");
    }
    let app =
        router(metrics, ready, live, inspect).into_make_service_with_connect_info::<SocketAddr>();
    if let Err(e) = axum::serve(listener, app).await {
        error!(error = %e, "metrics server stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
                Arc::new(AtomicBool::new(true)),
                live.clone(),
                None,
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

    #[tokio::test]
    async fn node_views_are_served_on_loopback_only() {
        let inspect: Inspector = Arc::new(|name: &str| {
            (name == "n1").then(|| serde_json::json!({ "identity": "me", "node": name }))
        });
        let router = || {
            super::router(
                Arc::new(Metrics::default()),
                Arc::new(AtomicBool::new(true)),
                Liveness::default(),
                Some(inspect.clone()),
            )
        };
        let (status, body) = get(router(), "/debug/nodes/n1").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains(r#""node":"n1""#), "{body}");
        assert_eq!(
            get_from(router(), "/debug/nodes/n1", "[::1]:40000").await.0,
            StatusCode::OK
        );
        assert_eq!(
            get(router(), "/debug/nodes/other").await.0,
            StatusCode::NOT_FOUND
        );
        let (status, body) = get_from(router(), "/debug/nodes/n1", "10.0.0.7:40000").await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
        assert_eq!(
            get_from(router(), "/debug/nodes/n1", "[::ffff:10.0.0.7]:40000")
                .await
                .0,
            StatusCode::FORBIDDEN
        );
    }
}

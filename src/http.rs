//! The admin HTTP server: `/metrics`, `/livez`, `/readyz` (ready once the node cache synced).

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use axum::{
    Router, extract::State, http::StatusCode, http::header, response::IntoResponse, routing::get,
};
use tracing::{error, info};

use crate::metrics::Metrics;

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
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

async fn livez() -> &'static str {
    "ok"
}

async fn readyz(State(s): State<AppState>) -> (StatusCode, &'static str) {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "node cache not synced yet")
    }
}

pub fn router(metrics_: Arc<Metrics>, ready: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .with_state(AppState {
            metrics: metrics_,
            ready,
        })
}

/// Serve on an already bound listener (bind first, so a taken port fails start-up).
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "serving /metrics, /livez, /readyz");
    }
    if let Err(e) = axum::serve(listener, router(metrics, ready)).await {
        error!(error = %e, "metrics server stopped");
    }
}

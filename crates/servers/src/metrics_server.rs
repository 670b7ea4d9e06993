//! The metrics server (`metricsBindAddress`, default `127.0.0.1:10249`).
//!
//! Routes as upstream's metrics mux: `/metrics`, `/healthz` (component-base's plain `ok` ping, which
//! says the metrics server is up, not that the proxy is healthy; the proxy's health is on the
//! health server), `/healthz/ping`, `/proxyMode` and `/configz`; and kproxy's `/debug/explain`
//! (see [`crate::explain`]) when the daemon provides an explainer.
//!
//! `/metrics` answers in Prometheus text 0.0.4, as kube-proxy, unless the scraper's `Accept`
//! header asks for OpenMetrics, which it then gets (ending in `# EOF`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::RawQuery;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::error::ServeError;
use crate::explain::{self, Explainer};
use crate::healthz::NOSNIFF;
use crate::metrics::{Exposition, Metrics};
use crate::server::{RunningServer, listen, spawn};

/// The API group kube-proxy files its configuration under in `/configz`.
pub const CONFIGZ_GROUP: &str = "kubeproxy.config.k8s.io";

/// What the metrics server says about the running proxy besides metrics.
#[derive(Debug, Clone)]
pub struct MetricsServerInfo {
    /// The proxy mode, as `/proxyMode` reports it (`nftables`, `iptables`, `ipvs`).
    pub proxy_mode: String,
    /// The effective configuration (a KubeProxyConfiguration-shaped JSON value); `/configz`
    /// answers `{"kubeproxy.config.k8s.io": <this>}`.
    pub config: serde_json::Value,
    /// Answers `/debug/explain` (absent: the route is not served).
    pub explainer: Option<Explainer>,
}

/// The metrics server's routes.
pub fn metrics_router(metrics: Metrics, info: MetricsServerInfo) -> Router {
    let info = Arc::new(info);
    let mode = info.clone();
    let configz = serde_json::json!({ CONFIGZ_GROUP: info.config }).to_string();
    let router = Router::new()
        .route("/metrics", get(move |headers: HeaderMap| std::future::ready(scrape(&metrics, &headers))))
        .route("/healthz", get(|| std::future::ready(text("ok".to_string()))))
        .route("/healthz/ping", get(|| std::future::ready(text("ok".to_string()))))
        .route("/proxyMode", get(move || std::future::ready(text(mode.proxy_mode.clone()))))
        .route("/configz", get(move || std::future::ready(json(configz.clone()))));
    match info.explainer.clone() {
        Some(explainer) => router.route(
            "/debug/explain",
            get(move |conn: Option<axum::Extension<crate::ConnInfo>>, RawQuery(query): RawQuery| {
                let explainer = explainer.clone();
                async move {
                    let conn = conn.map(|axum::Extension(c)| c);
                    let (status, body) = explain::answer(&explainer, conn, query.as_deref()).await;
                    let mut response = json(body);
                    *response.status_mut() = status;
                    response
                }
            }),
        ),
        None => router,
    }
}

fn text(body: String) -> Response {
    let mut response = body.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response.headers_mut().insert(NOSNIFF.0, HeaderValue::from_static(NOSNIFF.1));
    response
}

fn json(body: String) -> Response {
    let mut response = body.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Whether the scraper accepts OpenMetrics (Prometheus sends it first in its `Accept` list).
fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| item.trim().to_ascii_lowercase().starts_with("application/openmetrics-text"))
}

fn scrape(metrics: &Metrics, headers: &HeaderMap) -> Response {
    let format = if wants_openmetrics(headers) { Exposition::OpenMetrics } else { Exposition::PrometheusText };
    match metrics.encode(format) {
        Ok(body) => {
            let mut response = body.into_response();
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
            response
        }
        Err(error) => {
            tracing::error!(%error, "encoding metrics failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "encoding metrics failed").into_response()
        }
    }
}

/// Binds `addr` and serves the metrics routes in the background. A bind failure is returned at
/// once, so the caller can apply `bindAddressHardFail`.
pub async fn serve_metrics(
    addr: SocketAddr,
    metrics: Metrics,
    info: MetricsServerInfo,
) -> Result<RunningServer, ServeError> {
    let listener = listen(addr)?;
    let server = spawn(listener, metrics_router(metrics, info))?;
    tracing::info!(address = %server.local_addr(), "serving /metrics");
    Ok(server)
}

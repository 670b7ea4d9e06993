//! The health server (`healthzBindAddress`, default `0.0.0.0:10256`): `/healthz`, `/livez` and
//! kproxy's `/readyz`.
//!
//! Load balancers of `externalTrafficPolicy: Cluster` Services probe `/healthz` on every node, so
//! it answers 503 when the proxy is stuck or the Node is draining; kubelet's liveness probe uses
//! `/livez`, which ignores the Node so a draining node's proxy is not restarted. As upstream, both
//! answer 200 from the start, before anything is programmed. `/readyz` is for a readiness probe:
//! 503 until the first sync reached the kernel, then as `/livez`. All answer any method, as
//! upstream, with `Content-Type: application/json` and `X-Content-Type-Options: nosniff`; the
//! first two count their answers in `kubeproxy_proxy_healthz_total` / `kubeproxy_proxy_livez_total`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;

use crate::error::ServeError;
use crate::health::{Probe, ProxyHealth};
use crate::metrics::Metrics;
use crate::server::{RunningServer, listen, spawn};

/// `X-Content-Type-Options`, which upstream sets on every JSON answer.
pub(crate) const NOSNIFF: (&str, &str) = ("x-content-type-options", "nosniff");

/// The `/healthz`, `/livez` and `/readyz` routes.
pub fn healthz_router(health: Arc<ProxyHealth>, metrics: Metrics) -> Router {
    let (h, m) = (health.clone(), metrics.clone());
    let (rh, rm) = (health.clone(), metrics.clone());
    Router::new()
        .route("/healthz", any(move || std::future::ready(answer(&h, &m, Probe::Healthz))))
        .route("/livez", any(move || std::future::ready(answer(&health, &metrics, Probe::Livez))))
        .route("/readyz", any(move || std::future::ready(answer(&rh, &rm, Probe::Readyz))))
}

fn answer(health: &ProxyHealth, metrics: &Metrics, probe: Probe) -> Response {
    let verdict = health.probe(probe);
    match probe {
        Probe::Healthz => metrics.record_healthz(verdict.status),
        Probe::Livez => metrics.record_livez(verdict.status),
        Probe::Readyz => {}
    }
    let status = StatusCode::from_u16(verdict.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut response = (status, verdict.body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(NOSNIFF.0, HeaderValue::from_static(NOSNIFF.1));
    response
}

/// Binds `addr` and serves `/healthz` and `/livez` in the background. A bind failure is returned
/// at once, so the caller can apply `bindAddressHardFail`.
pub async fn serve_healthz(
    addr: SocketAddr,
    health: Arc<ProxyHealth>,
    metrics: Metrics,
) -> Result<RunningServer, ServeError> {
    let listener = listen(addr)?;
    let server = spawn(listener, healthz_router(health, metrics))?;
    tracing::info!(address = %server.local_addr(), "serving /healthz, /livez and /readyz");
    Ok(server)
}

//! `/healthz` and `/livez` over real HTTP, driven by a fake clock.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use common::{get, refused};
use kproxy_servers::{DataplaneMode, Exposition, FakeClock, Metrics, ProxyHealth, ServeError, serve_healthz};
use kproxy_state::IpFamily;
use serde_json::Value;

/// 2023-11-14T22:13:20Z
const START: u64 = 1_700_000_000;

fn fixture() -> (Arc<FakeClock>, Arc<ProxyHealth>, Metrics) {
    let clock = Arc::new(FakeClock::new(UNIX_EPOCH + Duration::from_secs(START)));
    // syncPeriod 30 s → healthz timeout 60 s, as upstream.
    let timeout = ProxyHealth::healthz_timeout_for(Duration::from_secs(30));
    let health = Arc::new(ProxyHealth::with_clock(timeout, clock.clone()));
    (clock, health, Metrics::new(DataplaneMode::Nftables))
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("body is not JSON ({e}): {body}"))
}

fn counter(metrics: &Metrics, series: &str) -> f64 {
    let text = metrics.encode(Exposition::PrometheusText).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.parse().unwrap())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn healthy_at_start_with_upstreams_exact_body_and_headers() {
    let (_clock, health, metrics) = fixture();
    let server = serve_healthz(loopback(), health, metrics.clone()).await.unwrap();
    let addr = server.local_addr();

    let r = get(addr, "/healthz").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(
        r.body,
        r#"{"lastUpdated":"2023-11-14T22:13:20Z","currentTime":"2023-11-14T22:13:20Z","nodeEligible":true,"healthy":true}"#
    );

    let r = get(addr, "/livez").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, r#"{"lastUpdated":"2023-11-14T22:13:20Z","currentTime":"2023-11-14T22:13:20Z","healthy":true}"#);

    assert_eq!(get(addr, "/").await.unwrap().status, 404);
    assert_eq!(get(addr, "/healthz/extra").await.unwrap().status, 404);
    assert_eq!(counter(&metrics, "kubeproxy_proxy_healthz_total{code=\"200\"}"), 1.0);
    assert_eq!(counter(&metrics, "kubeproxy_proxy_livez_total{code=\"200\"}"), 1.0);
}

#[tokio::test]
async fn a_queued_update_older_than_the_timeout_turns_both_probes_503_until_synced() {
    let (clock, health, metrics) = fixture();
    let server = serve_healthz(loopback(), health.clone(), metrics.clone()).await.unwrap();
    let addr = server.local_addr();

    health.updated(IpFamily::V4); // synced at START
    health.updated(IpFamily::V6);
    clock.advance(Duration::from_secs(10));
    health.queued_update(IpFamily::V6); // queued at START+10
    clock.advance(Duration::from_secs(59)); // waited 59 s < 60 s
    let r = get(addr, "/healthz").await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let body = json(&r.body);
    assert_eq!(body["lastUpdated"], "2023-11-14T22:14:29Z", "healthy answers carry the current time");
    assert_eq!(body["status"]["IPv6"]["healthy"], true);

    clock.advance(Duration::from_secs(1)); // waited 60 s: late
    for path in ["/healthz", "/livez"] {
        let r = get(addr, path).await.unwrap();
        assert_eq!(r.status, 503, "{path}: {}", r.body);
        assert_eq!(r.header("content-type"), Some("application/json"));
        let body = json(&r.body);
        assert_eq!(body["healthy"], false);
        assert_eq!(body["lastUpdated"], "2023-11-14T22:13:20Z", "unhealthy answers carry the last sync");
        assert_eq!(body["currentTime"], "2023-11-14T22:14:30Z");
        assert_eq!(body["status"]["IPv4"], serde_json::json!({"lastUpdated": "2023-11-14T22:13:20Z", "healthy": true}));
        assert_eq!(
            body["status"]["IPv6"],
            serde_json::json!({"lastUpdated": "2023-11-14T22:13:20Z", "healthy": false})
        );
    }

    clock.advance(Duration::from_millis(1500));
    health.updated(IpFamily::V6);
    let r = get(addr, "/healthz").await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r.body)["status"]["IPv6"]["lastUpdated"], "2023-11-14T22:14:31.5Z");

    assert_eq!(counter(&metrics, "kubeproxy_proxy_healthz_total{code=\"200\"}"), 2.0);
    assert_eq!(counter(&metrics, "kubeproxy_proxy_healthz_total{code=\"503\"}"), 1.0);
    assert_eq!(counter(&metrics, "kubeproxy_proxy_livez_total{code=\"503\"}"), 1.0);
}

/// `/readyz` (kproxy's) says "this node is programmed": 503 while `/healthz` and `/livez` are
/// already 200 at start, as upstream's are; 200 once every family synced; 503 again while a
/// change is late.
#[tokio::test]
async fn readyz_is_503_until_the_first_sync_and_while_a_change_is_late() {
    let (clock, health, metrics) = fixture();
    let server = serve_healthz(loopback(), health.clone(), metrics.clone()).await.unwrap();
    let addr = server.local_addr();

    health.queued_update(IpFamily::V4);
    health.queued_update(IpFamily::V6);
    clock.advance(Duration::from_secs(14));
    assert_eq!(get(addr, "/healthz").await.unwrap().status, 200, "upstream's /healthz: healthy while starting");
    assert_eq!(get(addr, "/livez").await.unwrap().status, 200);
    let r = get(addr, "/readyz").await.unwrap();
    assert_eq!(r.status, 503, "nothing programmed yet: {}", r.body);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(json(&r.body)["healthy"], true, "the proxy is healthy, just not programmed yet");

    health.updated(IpFamily::V4);
    health.updated(IpFamily::V6);
    let r = get(addr, "/readyz").await.unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(json(&r.body)["status"]["IPv4"]["healthy"], true);

    health.set_node_eligible(false);
    assert_eq!(get(addr, "/readyz").await.unwrap().status, 200, "a draining Node is /healthz's business");
    health.queued_update(IpFamily::V4);
    clock.advance(Duration::from_secs(60));
    assert_eq!(get(addr, "/readyz").await.unwrap().status, 503, "a change late by the timeout");
    health.updated(IpFamily::V4);
    assert_eq!(get(addr, "/readyz").await.unwrap().status, 200);
    assert_eq!(
        counter(&metrics, "kubeproxy_proxy_healthz_total{code=\"200\"}"),
        1.0,
        "/readyz is not counted as /healthz"
    );
}

#[tokio::test]
async fn a_draining_node_fails_healthz_but_not_livez() {
    let (_clock, health, metrics) = fixture();
    let server = serve_healthz(loopback(), health.clone(), metrics).await.unwrap();
    let addr = server.local_addr();

    health.set_node_eligible(false);
    let r = get(addr, "/healthz").await.unwrap();
    assert_eq!(r.status, 503);
    let body = json(&r.body);
    assert_eq!(body["nodeEligible"], false);
    assert_eq!(body["healthy"], true, "the proxy itself is fine");
    assert_eq!(body["lastUpdated"], "0001-01-01T00:00:00Z", "never synced and not answering 200: Go's zero time");

    let r = get(addr, "/livez").await.unwrap();
    assert_eq!(r.status, 200);
    assert!(json(&r.body).get("nodeEligible").is_none(), "/livez does not talk about the node: {}", r.body);

    health.set_node_eligible(true);
    assert_eq!(get(addr, "/healthz").await.unwrap().status, 200);
}

#[tokio::test]
async fn a_taken_address_is_an_error_and_shutdown_closes_the_port() {
    let (_clock, health, metrics) = fixture();
    let server = serve_healthz(loopback(), health.clone(), metrics.clone()).await.unwrap();
    let addr = server.local_addr();
    match serve_healthz(addr, health, metrics).await {
        Err(ServeError::Bind { addr: failed, .. }) => assert_eq!(failed, addr),
        other => panic!("expected a bind error, got {other:?}"),
    }
    assert_eq!(get(addr, "/livez").await.unwrap().status, 200);
    server.shutdown().await.unwrap();
    assert!(refused(addr).await, "port still open after shutdown");
}

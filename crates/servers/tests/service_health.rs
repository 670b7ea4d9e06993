//! Health-check node ports over real HTTP: open, close, move, endpoint counts, proxy health, and
//! bind failures.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

mod common;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use common::{free_port, get, refused};
use kproxy_servers::{
    DataplaneMode, Exposition, FakeClock, HealthCheckBind, Metrics, ProxyHealth, ServiceHealthServer,
    service_health_body,
};
use kproxy_state::{IpFamily, ObjectKey};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

struct Fixture {
    clock: Arc<FakeClock>,
    health: Arc<ProxyHealth>,
    metrics: Metrics,
    server: ServiceHealthServer,
}

fn fixture() -> Fixture {
    let clock = Arc::new(FakeClock::new(UNIX_EPOCH + Duration::from_secs(1_700_000_000)));
    let health = Arc::new(ProxyHealth::with_clock(Duration::from_secs(60), clock.clone()));
    let metrics = Metrics::new(DataplaneMode::Nftables);
    let server = ServiceHealthServer::new(HealthCheckBind::Addresses(vec![LOCALHOST]), health.clone(), metrics.clone());
    Fixture { clock, health, metrics, server }
}

fn svc(name: &str) -> ObjectKey {
    ObjectKey::new("shop", name)
}

fn at(port: u16) -> SocketAddr {
    SocketAddr::new(LOCALHOST, port)
}

#[tokio::test]
async fn answers_with_upstreams_body_and_headers_following_local_endpoints_and_proxy_health() {
    let f = fixture();
    let port = free_port();
    let failures = f.server.sync_services(&HashMap::from([(svc("web"), port)])).await;
    assert!(failures.is_empty(), "{failures:?}");

    // Open but no endpoints reported yet: 503, weight 0.
    let r = get(at(port), "/healthz").await.unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.header("x-load-balancing-endpoint-weight"), Some("0"));
    assert_eq!(r.body, service_health_body(&svc("web"), 0, true));

    f.server.sync_endpoints(&HashMap::from([(svc("web"), 3), (svc("not-open"), 7)])).await;
    let r = get(at(port), "/healthz").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(r.header("x-load-balancing-endpoint-weight"), Some("3"));
    assert_eq!(
        r.body,
        "{\n\t\"service\": {\n\t\t\"namespace\": \"shop\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 3,\n\t\"serviceProxyHealthy\": true\n}"
    );
    let parsed: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(parsed["localEndpoints"], 3);

    // Any path answers the same, as upstream.
    let other = get(at(port), "/some/other/path?x=1").await.unwrap();
    assert_eq!((other.status, other.body), (200, r.body.clone()));

    // The proxy turns unhealthy: 503 although endpoints exist; the weight still says 3.
    f.health.updated(IpFamily::V4);
    f.health.queued_update(IpFamily::V4);
    f.clock.advance(Duration::from_secs(61));
    let r = get(at(port), "/").await.unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.header("x-load-balancing-endpoint-weight"), Some("3"));
    assert_eq!(r.body, service_health_body(&svc("web"), 3, false));
    f.health.updated(IpFamily::V4);
    assert_eq!(get(at(port), "/").await.unwrap().status, 200);

    // A draining node does not fail service health checks (that is /healthz's job).
    f.health.set_node_eligible(false);
    assert_eq!(get(at(port), "/").await.unwrap().status, 200);

    // The Service missing from the next endpoint report has no local endpoints.
    f.server.sync_endpoints(&HashMap::new()).await;
    let r = get(at(port), "/").await.unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.header("x-load-balancing-endpoint-weight"), Some("0"));
}

#[tokio::test]
async fn ports_open_close_and_move_with_the_service_set() {
    let f = fixture();
    let (p1, p2) = (free_port(), free_port());
    f.server.sync_services(&HashMap::from([(svc("a"), p1), (svc("b"), p2)])).await;
    f.server.sync_endpoints(&HashMap::from([(svc("a"), 1), (svc("b"), 2)])).await;
    assert_eq!(get(at(p1), "/").await.unwrap().body, service_health_body(&svc("a"), 1, true));
    assert_eq!(get(at(p2), "/").await.unwrap().body, service_health_body(&svc("b"), 2, true));
    assert_eq!(f.server.listening().await, [(svc("a"), vec![at(p1)]), (svc("b"), vec![at(p2)])].into_iter().collect());

    // b goes away: its port is closed by the time sync_services returns; a keeps its count.
    f.server.sync_services(&HashMap::from([(svc("a"), p1)])).await;
    assert!(refused(at(p2)).await, "closed port still accepts");
    let r = get(at(p1), "/").await.unwrap();
    assert_eq!((r.status, r.header("x-load-balancing-endpoint-weight")), (200, Some("1")));

    // a's port moves from p1 to p2 and, in the same sync, a new Service c takes p1.
    f.server.sync_services(&HashMap::from([(svc("a"), p2), (svc("c"), p1)])).await;
    assert_eq!(get(at(p2), "/").await.unwrap().body, service_health_body(&svc("a"), 0, true));
    assert_eq!(get(at(p1), "/").await.unwrap().body, service_health_body(&svc("c"), 0, true));

    f.server.shutdown().await;
    assert!(refused(at(p1)).await && refused(at(p2)).await);
    assert!(f.server.listening().await.is_empty());
}

#[tokio::test]
async fn a_taken_port_is_reported_counted_and_retried_never_fatal() {
    let f = fixture();
    let squatter = std::net::TcpListener::bind(at(0)).unwrap();
    let taken = squatter.local_addr().unwrap().port();
    let free = free_port();

    let wanted = HashMap::from([(svc("blocked"), taken), (svc("fine"), free)]);
    let failures = f.server.sync_services(&wanted).await;
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!((failures[0].service.clone(), failures[0].port), (svc("blocked"), taken));
    assert!(failures[0].error.to_string().contains(&taken.to_string()), "{}", failures[0].error);
    assert_eq!(get(at(free), "/").await.unwrap().status, 503, "the other Service is served regardless");
    let text = f.metrics.encode(Exposition::PrometheusText).unwrap();
    assert!(text.contains("\nkproxy_service_healthcheck_bind_failures_total 1\n"), "{text}");

    // Once the port is free again, the next sync opens it.
    drop(squatter);
    let failures = f.server.sync_services(&wanted).await;
    assert!(failures.is_empty(), "{failures:?}");
    f.server.sync_endpoints(&HashMap::from([(svc("blocked"), 1)])).await;
    let r = get(at(taken), "/").await.unwrap();
    assert_eq!((r.status, r.body), (200, service_health_body(&svc("blocked"), 1, true)));
}

#[tokio::test]
async fn all_addresses_listens_on_ipv4_loopback_too() {
    let clock = Arc::new(FakeClock::new(UNIX_EPOCH));
    let health = Arc::new(ProxyHealth::with_clock(Duration::from_secs(60), clock));
    let server = ServiceHealthServer::new(HealthCheckBind::AllAddresses, health, Metrics::new(DataplaneMode::Nftables));
    let port = std::net::TcpListener::bind("0.0.0.0:0").unwrap().local_addr().unwrap().port();
    let failures = server.sync_services(&HashMap::from([(svc("wide"), port)])).await;
    assert!(failures.is_empty(), "{failures:?}");
    server.sync_endpoints(&HashMap::from([(svc("wide"), 2)])).await;
    let r = get(at(port), "/").await.unwrap();
    assert_eq!((r.status, r.header("x-load-balancing-endpoint-weight")), (200, Some("2")));
    server.shutdown().await;
    assert!(refused(at(port)).await);
}

#[tokio::test]
async fn closing_a_port_also_drops_its_open_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let f = fixture();
    let port = free_port();
    f.server.sync_services(&HashMap::from([(svc("keepalive"), port)])).await;
    f.server.sync_endpoints(&HashMap::from([(svc("keepalive"), 1)])).await;

    // A keep-alive client that has been answered once and keeps its connection open.
    let mut stream = tokio::net::TcpStream::connect(at(port)).await.unwrap();
    stream.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\n\r\n").await.unwrap();
    let mut first = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut first)).await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200 "), "{:?}", &first[..n]);

    f.server.sync_services(&HashMap::new()).await;
    // The server side is gone: the next read sees end of stream (or a reset), not a hang and
    // not another answer for a Service that no longer exists.
    let _ = stream.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\n\r\n").await;
    let mut rest = vec![0u8; 4096];
    let after = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut rest)).await.unwrap();
    match after {
        Ok(0) => {}
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        Ok(n) => panic!("closed health check still answered: {:?}", String::from_utf8_lossy(&rest[..n])),
    }
}

#[tokio::test]
async fn ports_move_when_the_bind_addresses_change() {
    let f = fixture();
    let port = free_port();
    let services = HashMap::from([(svc("web"), port)]);
    assert!(f.server.sync_services(&services).await.is_empty());
    assert_eq!(f.server.listening().await[&svc("web")], vec![at(port)]);

    // nodePortAddresses now match no address: the port closes and stays closed.
    assert!(f.server.set_bind(HealthCheckBind::Addresses(Vec::new())).await);
    assert!(f.server.sync_services(&services).await.is_empty());
    assert_eq!(f.server.listening().await[&svc("web")], Vec::<SocketAddr>::new());
    assert!(get(at(port), "/healthz").await.is_err(), "nothing listens any more");

    // Back on loopback: open again; the same bind again changes nothing.
    assert!(f.server.set_bind(HealthCheckBind::Addresses(vec![LOCALHOST])).await);
    assert!(!f.server.set_bind(HealthCheckBind::Addresses(vec![LOCALHOST])).await);
    assert!(f.server.sync_services(&services).await.is_empty());
    assert_eq!(get(at(port), "/healthz").await.unwrap().status, 503);
}

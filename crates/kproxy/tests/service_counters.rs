//! `--service-counters` end to end: the real binary in a node namespace, a fake API server,
//! known connections, and the numbers `/metrics` exports and `/debug/explain` shows.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kproxy_state::Kind;
use kproxy_testbed::{ProbeOptions, ProbeResult, Proto, Testbed, Where, probe_many};
use serde_json::json;

const SERVED: &str = "kproxy_service_new_connections_total{ip_family=\"IPv4\",namespace=\"demo\",service=\"web\",port=\"p\",protocol=\"tcp\",verdict=\"served\"}";
const REJECTED: &str = "kproxy_service_new_connections_total{ip_family=\"IPv4\",namespace=\"demo\",service=\"empty\",port=\"p\",protocol=\"tcp\",verdict=\"rejected_no_endpoints\"}";

#[test]
fn service_counters_export_the_connections_sent_served_and_rejected() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let pod = tb.add_pod("web-b", Where::Node2).unwrap();
    pod.serve(&[(Proto::Tcp, 8080)]).unwrap();
    let api = support::api_in(tb.node());
    support::apply_node_a(&api.server);
    for (name, ip) in [("web", "198.18.128.10"), ("empty", "198.18.128.11")] {
        api.server.apply(
            Kind::Service,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": name},
                   "spec": {"type": "NodePort", "clusterIP": ip, "clusterIPs": [ip],
                            "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080}]}}),
        );
    }
    support::apply_one_endpoint_slice(&api.server, "web", "p", &pod.ipv4().to_string(), "node-b");
    let metrics: SocketAddr = "127.0.0.1:10249".parse().unwrap();
    let args: Vec<String> = vec![
        "--service-counters".into(),
        format!("--metrics-bind-address={metrics}"),
        "--healthz-bind-address=".into(),
        "--hostname-override=node-a".into(),
        "--detect-local-mode=NodeCIDR".into(),
        "--conntrack-max-per-core=0".into(),
        "--conntrack-tcp-timeout-established=0".into(),
        "--conntrack-tcp-timeout-close-wait=0".into(),
    ];
    let (_kproxy, dir) = support::kproxy_in(tb.node().name(), &api.server.url(), "service-counters", &args);
    let web: SocketAddr = "198.18.128.10:80".parse().unwrap();
    let got = support::answered_by(tb.external(), web, "web-b", support::START);
    assert!(matches!(got, ProbeResult::Answered { .. }), "kproxy never served the ClusterIP: {got:?}");

    // The metrics listener is the node namespace's loopback.
    let get = |path: &str| tb.node().run_in(|| support::http_get(metrics, path)).unwrap().unwrap_or_default().1;
    let scrape_until = |done: &dyn Fn(&str) -> bool| {
        let start = Instant::now();
        loop {
            let text = get("/metrics");
            if done(&text) || start.elapsed() > Duration::from_secs(30) {
                return text;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    // Whatever the probes above sent is counted (served ≥ 1) by the next reading.
    let text = scrape_until(&|t| support::value(t, SERVED).is_some_and(|v| v >= 1.0));
    let before = support::value(&text, SERVED).unwrap_or_else(|| panic!("no served series:\n{text}"));

    let options = ProbeOptions::with_timeout(Duration::from_millis(500));
    let served = probe_many(tb.external(), Proto::Tcp, web, 5, &options).unwrap();
    assert_eq!(served.backends.values().sum::<usize>(), 5, "{served:?}");
    let rejected = probe_many(tb.external(), Proto::Tcp, "198.18.128.11:80".parse().unwrap(), 4, &options).unwrap();
    assert_eq!(rejected.refused, 4, "{rejected:?}");

    let text =
        scrape_until(&|t| support::value(t, SERVED) == Some(before + 5.0) && support::value(t, REJECTED) == Some(4.0));
    assert_eq!(support::value(&text, SERVED), Some(before + 5.0), "{text}");
    assert_eq!(support::value(&text, REJECTED), Some(4.0), "{text}");

    let explained = get("/debug/explain?from=198.18.0.10&to=198.18.128.11:80");
    let v: serde_json::Value = serde_json::from_str(&explained).unwrap();
    assert_eq!(v["verdict"], "reject", "{v}");
    assert_eq!(v["connections"]["rejected_no_endpoints"], 4, "explain shows the counts: {v}");
    let _ = std::fs::remove_dir_all(&dir);
}

//! `--service-counters` end to end: the real binary in a node namespace, a fake API server,
//! known connections and known payloads, and the numbers `/metrics` exports and
//! `/debug/explain` shows.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use kproxy_state::Kind;
use kproxy_testbed::{ProbeOptions, ProbeResult, Proto, Testbed, Where, probe_many};
use serde_json::json;

const SERVED: &str = "kproxy_service_new_connections_total{ip_family=\"IPv4\",namespace=\"demo\",service=\"web\",port=\"p\",protocol=\"tcp\",verdict=\"served\"}";
const REJECTED: &str = "kproxy_service_new_connections_total{ip_family=\"IPv4\",namespace=\"demo\",service=\"empty\",port=\"p\",protocol=\"tcp\",verdict=\"rejected_no_endpoints\"}";

/// One series of a per-Service metric of Service `service` (port `p`, TCP, IPv4) in `demo`.
fn series(metric: &str, service: &str, verdict: &str) -> String {
    format!(
        "{metric}{{ip_family=\"IPv4\",namespace=\"demo\",service=\"{service}\",port=\"p\",protocol=\"tcp\",verdict=\"{verdict}\"}}"
    )
}

const PACKETS: &str = "kproxy_service_packets_total";
const BYTES: &str = "kproxy_service_bytes_total";
const CONNECTIONS: &str = "kproxy_service_new_connections_total";

/// The bytes each bulk connection sends, and gets back.
const PAYLOAD: usize = 64 * 1024;

/// An echo in `pod` on TCP `port`: for each of `n` connections, reads to the end, sends it all
/// back, closes.
fn echo(pod: &kproxy_testbed::Pod, port: u16, n: usize) -> std::thread::JoinHandle<()> {
    // Bound inside the pod's namespace; the socket stays there when served from this one.
    let listener = pod.netns().run_in(move || TcpListener::bind(("0.0.0.0", port))).unwrap().unwrap();
    std::thread::spawn(move || {
        for _ in 0..n {
            let Ok((mut conn, _)) = listener.accept() else { return };
            let mut got = Vec::new();
            if conn.read_to_end(&mut got).is_ok() {
                let _ = conn.write_all(&got);
            }
        }
    })
}

/// Sends [`PAYLOAD`] bytes to `dest` from `from`, ends its half, and returns what came back.
fn send_payload(from: &kproxy_testbed::Netns, dest: SocketAddr) -> Vec<u8> {
    from.run_in(move || {
        let mut stream = TcpStream::connect_timeout(&dest, Duration::from_secs(2)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        stream.write_all(&vec![0x5a; PAYLOAD]).unwrap();
        stream.shutdown(Shutdown::Write).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        answer
    })
    .unwrap()
}

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
    // `bulk` carries known payloads both ways, from outside through its ClusterIP and its
    // NodePort (forward both ways), and from the node itself (out through output, the replies
    // in through input); `idle` has an endpoint and no traffic.
    let bulk_clients = [
        (tb.external(), "198.18.128.12:90", 2),
        (tb.external(), "198.18.0.2:30090", 2),
        (tb.node(), "198.18.128.12:90", 1),
    ];
    let bulk_connections: usize = bulk_clients.iter().map(|(_, _, n)| n).sum();
    let _echo = echo(&pod, 9090, bulk_connections);
    api.server.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": "bulk"},
               "spec": {"type": "NodePort", "clusterIP": "198.18.128.12", "clusterIPs": ["198.18.128.12"],
                        "ports": [{"name": "p", "port": 90, "protocol": "TCP", "targetPort": 9090, "nodePort": 30090}]}}),
    );
    api.server.apply(
        Kind::EndpointSlice,
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"namespace": "demo", "name": "bulk-1", "labels": {"kubernetes.io/service-name": "bulk"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": [pod.ipv4().to_string()], "nodeName": "node-b", "conditions": {"ready": true}}],
               "ports": [{"name": "p", "port": 9090, "protocol": "TCP"}]}),
    );
    for (name, ip) in [("web", "198.18.128.10"), ("empty", "198.18.128.11"), ("idle", "198.18.128.13")] {
        api.server.apply(
            Kind::Service,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": name},
                   "spec": {"type": "NodePort", "clusterIP": ip, "clusterIPs": [ip],
                            "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080}]}}),
        );
    }
    support::apply_one_endpoint_slice(&api.server, "web", "p", &pod.ipv4().to_string(), "node-b");
    support::apply_one_endpoint_slice(&api.server, "idle", "p", &pod.ipv4().to_string(), "node-b");
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
            if done(&text) || start.elapsed() > support::CHANGE {
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

    // Rejected: each refused connection was one SYN (answered by a reset, so never resent),
    // counted with its IP and TCP headers (20 + 20 to 60 bytes), all of the same size.
    let rejected_packets = support::value(&text, &series(PACKETS, "empty", "rejected_no_endpoints"));
    assert_eq!(rejected_packets, Some(4.0), "{text}");
    let rejected_bytes = support::value(&text, &series(BYTES, "empty", "rejected_no_endpoints")).unwrap();
    assert!((160.0..=320.0).contains(&rejected_bytes) && rejected_bytes % 4.0 == 0.0, "{rejected_bytes}\n{text}");
    assert_eq!(support::value(&text, &series(PACKETS, "empty", "served")), Some(0.0), "{text}");
    assert_eq!(v["packets"]["rejected_no_endpoints"], 4, "explain shows the packets: {v}");
    assert_eq!(v["bytes"]["rejected_no_endpoints"].as_f64(), Some(rejected_bytes), "explain shows the bytes: {v}");

    // Served: known payloads through the ClusterIP and the NodePort of `bulk`.
    let bulk = |metric, verdict| series(metric, "bulk", verdict);
    let text = scrape_until(&|t| support::value(t, &bulk(PACKETS, "served")).is_some());
    assert_eq!(support::value(&text, &bulk(PACKETS, "served")), Some(0.0), "nothing sent yet:\n{text}");
    for (from, dest, n) in bulk_clients {
        for _ in 0..n {
            let back = send_payload(from, dest.parse().unwrap());
            assert!(back.len() == PAYLOAD && back.iter().all(|&b| b == 0x5a), "{} bytes back from {dest}", back.len());
        }
    }
    let payload = (bulk_connections * 2 * PAYLOAD) as f64;
    let text = scrape_until(&|t| {
        support::value(t, &bulk(CONNECTIONS, "served")) == Some(bulk_connections as f64)
            && support::value(t, &bulk(BYTES, "served")).is_some_and(|b| b >= payload)
    });
    assert_eq!(support::value(&text, &bulk(CONNECTIONS, "served")), Some(bulk_connections as f64), "{text}");
    let packets = support::value(&text, &bulk(PACKETS, "served")).unwrap();
    let bytes = support::value(&text, &bulk(BYTES, "served")).unwrap();
    // Every connection has at least a SYN, a SYN-ACK, the client's data and the sink's answer
    // (segments may travel merged, GSO, so no more than that is certain), and at most what
    // 536-byte segments each acknowledged, plus the handshake and close, would make.

    let per_connection_max = 2 * (PAYLOAD / 536 + 1) + 20;
    assert!(
        packets >= (4 * bulk_connections) as f64 && packets <= (per_connection_max * bulk_connections) as f64,
        "{packets} packets\n{text}"
    );
    // The bytes are the payloads both ways plus 40 to 80 bytes of IP and TCP headers per packet:
    // missing a direction or a hook falls short, counting any packet twice (say in forward and
    // in input) or another Service's traffic exceeds it.
    assert!(
        bytes >= payload + 40.0 * packets && bytes <= payload + 80.0 * packets,
        "{bytes} bytes for {payload} payload bytes in {packets} packets\n{text}"
    );
    for verdict in ["rejected_no_endpoints", "dropped_no_local_endpoints", "dropped_by_source_ranges"] {
        assert_eq!(support::value(&text, &bulk(PACKETS, verdict)), Some(0.0), "{verdict}\n{text}");
        assert_eq!(support::value(&text, &bulk(BYTES, verdict)), Some(0.0), "{verdict}\n{text}");
    }
    // A Service with an endpoint and no traffic counts nothing.
    assert_eq!(support::value(&text, &series(PACKETS, "idle", "served")), Some(0.0), "{text}");
    assert_eq!(support::value(&text, &series(BYTES, "idle", "served")), Some(0.0), "{text}");
    // The echo probes to `web` are counted, and not as `bulk`'s.
    let web_bytes = support::value(&text, &series(BYTES, "web", "served")).unwrap();
    assert!(web_bytes > 0.0 && web_bytes < payload / 10.0, "{web_bytes}\n{text}");

    let explained = get("/debug/explain?from=198.18.0.10&to=198.18.128.12:90");
    let v: serde_json::Value = serde_json::from_str(&explained).unwrap();
    assert_eq!(v["verdict"], "dnat", "{v}");
    let shown = (v["packets"]["served"].as_f64().unwrap(), v["bytes"]["served"].as_f64().unwrap());
    assert!(
        shown.0 >= packets && shown.1 >= bytes && shown.1 <= payload + 80.0 * shown.0,
        "explain shows {shown:?}: {v}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

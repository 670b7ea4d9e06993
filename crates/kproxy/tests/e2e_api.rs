//! End to end: a fake API server (real HTTP list/watch) → the real `kproxy` binary → nftables in
//! a test network namespace → packets reach the right pods; then changes over the API reach the
//! packets, through an API server restart, with /healthz and /metrics checked over HTTP.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use kproxy_kube_source::fake::FakeApiServer;
use kproxy_state::Kind;
use kproxy_testbed::{Netns, ProbeResult, Proto, Testbed, Where, probe};
use serde_json::{Value, json};
use support::probe_until;

const CLUSTER_IP: &str = "198.18.128.10";

fn service(port: u16, cluster_ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "demo", "name": "web"},
        "spec": {"type": "ClusterIP", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                 "ports": [{"name": "http", "port": port, "protocol": "TCP", "targetPort": 8080}]},
    })
}

fn slice(ip: &str, node: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "demo", "name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "nodeName": node, "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    })
}

fn node() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
        "spec": {"podCIDRs": ["198.18.16.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.2"}]},
    })
}

/// The fake API server, running on a thread inside the node namespace (so that kproxy, also in
/// that namespace, reaches it on 127.0.0.1).
struct Api {
    server: Arc<FakeApiServer>,
    runtime: Arc<tokio::runtime::Runtime>,
}

impl Api {
    fn start(ns: &Netns) -> Api {
        ns.run_in(|| {
            let runtime =
                Arc::new(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap());
            let server = runtime.block_on(FakeApiServer::start()).unwrap();
            Api { server: Arc::new(server), runtime }
        })
        .unwrap()
    }
}

struct Kproxy(Child);

impl Drop for Kproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http_get(ns: &Netns, addr: SocketAddr, path: &str) -> (u16, String) {
    let path = path.to_owned();
    ns.run_in(move || {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        (status, body)
    })
    .unwrap()
}

/// An answer from `backend`. The external client is not a local pod, so ClusterIP traffic from it is
/// masqueraded to the node's address.
fn answered(backend: &str) -> ProbeResult {
    ProbeResult::Answered { backend: backend.into(), seen_source: "198.18.0.2".parse().unwrap() }
}

#[test]
fn api_changes_reach_the_packets() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let pod_a = tb.add_pod("web-a", Where::Node).unwrap();
    let pod_b = tb.add_pod("web-b", Where::Node2).unwrap();
    pod_a.serve(&[(Proto::Tcp, 8080)]).unwrap();
    pod_b.serve(&[(Proto::Tcp, 8080)]).unwrap();

    let api = Api::start(tb.node());
    api.server.apply(Kind::Node, node());
    api.server.apply(Kind::Service, service(80, CLUSTER_IP));
    api.server.apply(Kind::EndpointSlice, slice(&pod_a.ipv4().to_string(), "node-a"));

    let dir = std::env::temp_dir().join(format!("kproxy-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            api.server.url()
        ),
    )
    .unwrap();

    let _kproxy = Kproxy(
        Command::new("ip")
            .args(["netns", "exec", tb.node().name(), env!("CARGO_BIN_EXE_kproxy")])
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--hostname-override=node-a", "--detect-local-mode=NodeCIDR", "--iptables-min-sync-period=100ms"])
            .args(["--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249"])
            .args([
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );

    let dest: SocketAddr = format!("{CLUSTER_IP}:80").parse().unwrap();
    let got = probe_until(tb.external(), dest, &answered("web-a"), support::START);
    assert_eq!(got, answered("web-a"), "the initial state reaches the packets");

    let healthz: SocketAddr = "127.0.0.1:10256".parse().unwrap();
    let (status, body) = http_get(tb.node(), healthz, "/healthz");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"nodeEligible\":true"), "{body}");

    // An endpoint change over the API moves the traffic; its trigger time feeds the network
    // programming latency metric.
    let mut moved = slice(&pod_b.ipv4().to_string(), "node-b");
    moved["metadata"]["annotations"] = json!({
        "endpoints.kubernetes.io/last-change-trigger-time": kproxy_servers::rfc3339_nano(Some(std::time::SystemTime::now())),
    });
    api.server.apply(Kind::EndpointSlice, moved);
    assert_eq!(probe_until(tb.external(), dest, &answered("web-b"), support::CHANGE), answered("web-b"));

    // A malformed Service is skipped and counted; the rest keeps working.
    let mut bad = service(80, "not-an-ip");
    bad["metadata"]["name"] = json!("broken");
    api.server.apply(Kind::Service, bad);

    // The API server goes away: the rules stay and keep serving.
    api.runtime.block_on(api.server.stop());
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(probe(tb.external(), Proto::Tcp, dest, Duration::from_secs(1)).unwrap(), answered("web-b"));

    // It comes back with a changed port, which kproxy picks up.
    // (Restarting binds a new socket: do it from inside the node namespace.)
    tb.node().run_in(|| api.runtime.block_on(api.server.restart())).unwrap().unwrap();
    api.server.apply(Kind::Service, service(81, CLUSTER_IP));
    let dest81: SocketAddr = format!("{CLUSTER_IP}:81").parse().unwrap();
    assert_eq!(probe_until(tb.external(), dest81, &answered("web-b"), support::CHANGE), answered("web-b"));
    assert_eq!(
        probe_until(tb.external(), dest, &ProbeResult::Refused, support::CHANGE),
        ProbeResult::Refused,
        "the old port has no stale path"
    );

    let metrics: SocketAddr = "127.0.0.1:10249".parse().unwrap();
    let (status, text) = http_get(tb.node(), metrics, "/metrics");
    assert_eq!(status, 200);
    for name in [
        "kubeproxy_sync_proxy_rules_duration_seconds_bucket",
        "kubeproxy_sync_partial_proxy_rules_duration_seconds_count",
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
    ] {
        assert!(text.contains(name), "/metrics lacks {name}");
    }
    assert!(text.contains("kproxy_invalid_objects_total{kind=\"Service\"} 1"), "the bad Service is counted:\n{text}");
    assert!(
        text.contains("kubeproxy_network_programming_duration_seconds_count{ip_family=\"IPv4\"} 1"),
        "the endpoint change's programming latency is recorded:\n{text}"
    );

    let _ = std::fs::remove_dir_all(&dir);
}

//! Upstream's two packet counters of iptables mode, end to end: the real binary in a node
//! namespace, packets conntrack deems INVALID sent through the node, connections to a localhost
//! NodePort, and the numbers `/metrics` exports. And nftables mode, which (as upstream's) drops
//! no INVALID packet and serves no localhost NodePort, so it forwards those packets and exports
//! neither counter.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::{SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use kproxy_state::Kind;
use kproxy_testbed::{
    Netns, ProbeOptions, ProbeResult, Proto, SegmentTap, TCP_FIN, Testbed, Where, probe_many, send_tcp_segments,
};
use serde_json::json;

const INVALID: &str = "kubeproxy_iptables_ct_state_invalid_dropped_packets_total";
const LOCALHOST: &str = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total";
const WEB: &str = "198.18.128.10:80";

/// Bare FINs sent through the node to the pod: a FIN without ACK is no valid flag combination,
/// so conntrack deems every one INVALID, whatever it has seen before.
const FINS: u16 = 5;

/// A node running kproxy in `mode` with `demo/web` (NodePort 30080) served by one pod on the
/// node; returns once a client outside reaches the pod through the ClusterIP.
struct Node {
    tb: Testbed,
    pod: std::sync::Arc<kproxy_testbed::Pod>,
    _api: support::Api,
    _kproxy: support::KillOnDrop,
    dir: std::path::PathBuf,
    metrics: SocketAddr,
}

impl Node {
    fn start(mode: &str) -> Node {
        let tb = Testbed::new().unwrap();
        let pod = tb.add_pod("web-a", Where::Node).unwrap();
        pod.serve(&[(Proto::Tcp, 8080)]).unwrap();
        let api = support::api_in(tb.node());
        support::apply_node_a(&api.server);
        api.server.apply(
            Kind::Service,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": "web"},
                   "spec": {"type": "NodePort", "clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
                            "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}]}}),
        );
        support::apply_one_endpoint_slice(&api.server, "web", "p", &pod.ipv4().to_string(), "node-a");
        let metrics: SocketAddr = "127.0.0.1:10249".parse().unwrap();
        let args = support::node_a_args(metrics, &[&format!("--proxy-mode={mode}"), "--healthz-bind-address="]);
        let (kproxy, dir) = support::kproxy_in(tb.node().name(), &api.server.url(), &format!("counters-{mode}"), &args);
        let node = Node { tb, pod, _api: api, _kproxy: kproxy, dir, metrics };
        node.assert_serves("at start");
        node
    }

    /// A valid connection from outside reaches the pod through the ClusterIP.
    fn assert_serves(&self, when: &str) {
        let got = support::answered_by(self.tb.external(), WEB.parse().unwrap(), "web-a", support::START);
        assert!(matches!(got, ProbeResult::Answered { .. }), "{when}: the ClusterIP is not served: {got:?}");
    }

    fn scrape(&self) -> String {
        self.tb.node().run_in(|| support::http_get(self.metrics, "/metrics")).unwrap().unwrap_or_default().1
    }

    fn scrape_until(&self, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let text = self.scrape();
            if done(&text) || start.elapsed() > support::CHANGE {
                return text;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Sends [`FINS`] bare FINs from outside to the pod, through the node.
    fn send_fins(&self) {
        let pod = SocketAddrV4::new(self.pod.ipv4(), 8080);
        send_tcp_segments(self.tb.external(), pod, TCP_FIN, FINS).unwrap();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `n` connections from `from` to `dest`, all answered by the pod.
fn connect(from: &Netns, dest: &str, n: usize) {
    let options = ProbeOptions::with_timeout(Duration::from_secs(2));
    let got = probe_many(from, Proto::Tcp, dest.parse().unwrap(), n, &options).unwrap();
    assert_eq!(got.backends.get("web-a").copied(), Some(n), "{dest}: {got:?}");
}

#[test]
fn iptables_mode_counts_invalid_drops_and_localhost_nodeport_connections_in_nfacct() {
    kproxy_testbed::require_kernel!(NfAcct);
    let node = Node::start("iptables");
    let text = node.scrape_until(|t| support::value(t, INVALID).is_some() && support::value(t, LOCALHOST).is_some());
    let before = |series| support::value(&text, series).unwrap_or_else(|| panic!("no {series}:\n{text}"));
    let (invalid, localhost) = (before(INVALID), before(LOCALHOST));
    for line in [format!("# TYPE {INVALID} counter"), format!("# TYPE {LOCALHOST} counter")] {
        assert!(text.lines().any(|l| l == line), "no {line:?}:\n{text}");
    }

    // INVALID packets forwarded by the node are dropped and counted, each once.
    node.send_fins();
    let want = invalid + f64::from(FINS);
    let text = node.scrape_until(|t| support::value(t, INVALID) == Some(want));
    assert_eq!(support::value(&text, INVALID), Some(want), "{text}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(support::value(&node.scrape(), INVALID), Some(want), "counted more than was sent");
    node.assert_serves("after the INVALID packets");

    // Each connection to a localhost NodePort is one packet in nat (its first); a NodePort on
    // the node's own address is no localhost NodePort.
    connect(node.tb.node(), "127.0.0.1:30080", 3);
    connect(node.tb.node(), "198.18.0.2:30080", 2);
    let want = localhost + 3.0;
    let text = node.scrape_until(|t| support::value(t, LOCALHOST) == Some(want));
    assert_eq!(support::value(&text, LOCALHOST), Some(want), "{text}");
    assert_eq!(support::value(&text, INVALID), Some(invalid + f64::from(FINS)), "{text}");
}

#[test]
fn nftables_mode_forwards_invalid_packets_and_exports_no_nfacct_counter() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let node = Node::start("nftables");
    let synced = "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}";
    let text = node.scrape_until(|t| support::value(t, synced).is_some());
    assert!(support::value(&text, synced).is_some(), "{text}");

    let tap = SegmentTap::open(node.pod.netns(), 8080, TCP_FIN).unwrap();
    node.send_fins();
    let arrived = tap.count(usize::from(FINS), support::CHANGE).unwrap();
    assert_eq!(arrived, usize::from(FINS), "nftables mode drops no INVALID packet (as upstream's)");
    node.assert_serves("after the INVALID packets");
    let text = node.scrape();
    assert!(!text.contains("kubeproxy_iptables_"), "no nfacct counter in nftables mode:\n{text}");
}

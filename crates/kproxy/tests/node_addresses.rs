//! Node addresses are followed: an address added to the node after start, inside the
//! `nodePortAddresses` CIDR, serves NodePorts within seconds (it was never served before: the
//! addresses were read once at start). The real binary, a fake API server, packets.
//!
//! Stale UDP NodePort conntrack entries on a secondary node address are deleted: the entry of a
//! datagram sent before the NodePort existed (never DNATed: recognised as a NodePort entry only
//! by its destination being a node address), and the entry DNATed to an endpoint since removed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use kproxy_state::Kind;
use kproxy_testbed::kernel::KernelFeature;
use kproxy_testbed::{ProbeResult, Proto, Testbed, UdpSession, Where, conntrack_list, probe};
use serde_json::json;

/// The NodePort of `demo/web` (ClientIP affinity with `affinity`) is served on the node IP, then
/// on an address added to the node inside `nodeport_addresses`.
fn node_port_on_an_address_added_later_is_served_with(mode: &str, nodeport_addresses: &str, affinity: bool) {
    let tb = Testbed::new().unwrap();
    let pod = tb.add_pod("web-b", Where::Node2).unwrap();
    pod.serve(&[(Proto::Tcp, 8080)]).unwrap();
    let api = support::api_in(tb.node());
    support::apply_node_a(&api.server);
    let mut spec = json!({"type": "NodePort", "clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
        "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}]});
    if affinity {
        spec["sessionAffinity"] = json!("ClientIP");
    }
    api.server.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": "web"}, "spec": spec}),
    );
    support::apply_one_endpoint_slice(&api.server, "web", "p", &pod.ipv4().to_string(), "node-b");
    let args: Vec<String> = [
        format!("--proxy-mode={mode}"),
        format!("--nodeport-addresses={nodeport_addresses}"),
        "--hostname-override=node-a".into(),
        "--detect-local-mode=NodeCIDR".into(),
        "--conntrack-max-per-core=0".into(),
        "--conntrack-tcp-timeout-established=0".into(),
        "--conntrack-tcp-timeout-close-wait=0".into(),
    ]
    .to_vec();
    let (_kproxy, dir) = support::kproxy_in(tb.node().name(), &api.server.url(), &format!("addrs-{mode}"), &args);
    let answered = |got: &ProbeResult| matches!(got, ProbeResult::Answered { backend, .. } if backend == "web-b");

    let primary: SocketAddr = "198.18.0.2:30080".parse().unwrap();
    let got = support::answered_by(tb.external(), primary, "web-b", support::START);
    assert!(answered(&got), "{mode}: the node IP serves the NodePort: {got:?}");

    tb.node().ip(["addr", "add", "198.18.0.4/24", "dev", "eth0"]).unwrap();
    let added: SocketAddr = "198.18.0.4:30080".parse().unwrap();
    let got = support::answered_by(tb.external(), added, "web-b", support::CHANGE);
    assert!(answered(&got), "{mode}: the address added inside nodePortAddresses serves it: {got:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn node_port_on_an_address_added_later_is_served(mode: &str) {
    node_port_on_an_address_added_later_is_served_with(mode, "198.18.0.0/24", false);
}

#[test]
fn nftables_mode_serves_node_ports_on_an_address_added_later() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    node_port_on_an_address_added_later_is_served("nftables");
}

#[test]
fn iptables_mode_serves_node_ports_on_an_address_added_later() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    node_port_on_an_address_added_later_is_served("iptables");
}

#[test]
fn ipvs_mode_serves_node_ports_on_an_address_added_later() {
    if !kproxy_testbed::kernel::require_root()
        || !kproxy_testbed::kernel::require(&[KernelFeature::Ipvs, KernelFeature::Dummy])
    {
        return;
    }
    node_port_on_an_address_added_later_is_served("ipvs");
}

/// An IPVS NodePort is an address service on each node address (see kproxy_ipvs::render;
/// here a persistent one, under ClientIP affinity), so the node's addresses themselves are
/// followed: `all` (every local address, kube-ipvs0's VIPs not among them), and one added
/// later gets its service.
#[test]
fn ipvs_mode_serves_an_affinity_node_port_on_every_address_even_one_added_later() {
    if !kproxy_testbed::kernel::require_root()
        || !kproxy_testbed::kernel::require(&[KernelFeature::Ipvs, KernelFeature::Dummy])
    {
        return;
    }
    node_port_on_an_address_added_later_is_served_with("ipvs", "all", true);
}

/// Service `demo/dns`: NodePort 30053/UDP → 8053, its one endpoint `pod` (named `backend`).
fn apply_udp_node_port(server: &kproxy_kube_source::fake::FakeApiServer, pod: &str) {
    server.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": "dns"},
               "spec": {"type": "NodePort", "clusterIP": "198.18.128.53", "clusterIPs": ["198.18.128.53"],
                        "ports": [{"name": "d", "port": 53, "protocol": "UDP", "targetPort": 8053, "nodePort": 30053}]}}),
    );
    server.apply(
        Kind::EndpointSlice,
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"namespace": "demo", "name": "dns-1", "labels": {"kubernetes.io/service-name": "dns"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": [pod], "nodeName": "node-b", "conditions": {"ready": true}}],
               "ports": [{"name": "d", "port": 8053, "protocol": "UDP"}]}),
    );
}

fn stale_udp_node_port_entries_on_a_secondary_address_are_deleted(mode: &str) {
    let tb = Testbed::new().unwrap();
    let web = tb.add_pod("web-b", Where::Node2).unwrap();
    web.serve(&[(Proto::Tcp, 8080)]).unwrap();
    let client = tb.add_pod("client", Where::Node).unwrap();
    let (udp_a, udp_b) = (tb.add_pod("udp-a", Where::Node2).unwrap(), tb.add_pod("udp-b", Where::Node2).unwrap());
    udp_a.serve(&[(Proto::Udp, 8053)]).unwrap();
    udp_b.serve(&[(Proto::Udp, 8053)]).unwrap();
    // A second node address; NodePorts are served on every local address (`all`).
    tb.node().ip(["addr", "add", "198.18.0.4/24", "dev", "eth0"]).unwrap();
    let api = support::api_in(tb.node());
    support::apply_node_a(&api.server);
    support::apply_web_service(&api.server, "p");
    support::apply_one_endpoint_slice(&api.server, "web", "p", &web.ipv4().to_string(), "node-b");
    let metrics = support::free_port();
    let args = support::node_a_args(metrics, &[&format!("--proxy-mode={mode}"), "--nodeport-addresses=all"]);
    let (_kproxy, dir) = support::kproxy_in(tb.node().name(), &api.server.url(), &format!("stale-udp-{mode}"), &args);
    let service: SocketAddr = "198.18.128.10:80".parse().unwrap();
    let got = support::answered_by(client.netns(), service, "web-b", support::START);
    assert!(matches!(&got, ProbeResult::Answered { .. }), "{mode}: kproxy serves: {got:?}");

    // A client sends to the secondary address's port 30053 before it is a NodePort: nothing
    // listens there, the node refuses, and the datagrams share one conntrack entry, not DNATed.
    let node_port: SocketAddr = "198.18.0.4:30053".parse().unwrap();
    let session = UdpSession::start(tb.external(), None, 40053, node_port, Duration::from_millis(100)).unwrap();
    let refused = session.wait_for(support::CHANGE, |r| *r == ProbeResult::Refused);
    assert_eq!(refused, Some(ProbeResult::Refused), "{mode}: nothing serves 30053 yet: {:?}", session.results());
    let entries = conntrack_list(tb.node()).unwrap();
    assert!(
        entries.iter().any(|e| e.contains("dst=198.18.0.4") && e.contains("sport=40053") && e.contains("dport=30053")),
        "{mode}: the client's entry: {entries:#?}"
    );

    // The NodePort appears: a new flow reaches its endpoint, and so, once its entry is deleted
    // as stale, does the client's.
    apply_udp_node_port(&api.server, &udp_a.ipv4().to_string());
    let start = std::time::Instant::now();
    let fresh = loop {
        let got = probe(tb.external(), Proto::Udp, node_port, Duration::from_millis(300)).unwrap();
        if got.backend() == Some("udp-a") || start.elapsed() > support::CHANGE {
            break got;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(fresh.backend(), Some("udp-a"), "{mode}: a new flow reaches the NodePort's endpoint: {fresh:?}");
    let got = session.wait_for(support::CHANGE, |r| r.backend().is_some());
    assert_eq!(
        got.as_ref().and_then(ProbeResult::backend),
        Some("udp-a"),
        "{mode}: the entry from before the NodePort (to a secondary address, never DNATed) was deleted: {got:?}\n{:#?}",
        conntrack_list(tb.node()).unwrap()
    );

    // Its endpoint is replaced: the entry DNATed to udp-a is stale and deleted, the client's
    // next datagrams reach udp-b.
    apply_udp_node_port(&api.server, &udp_b.ipv4().to_string());
    let got = session.wait_for(support::CHANGE, |r| r.backend() == Some("udp-b"));
    assert_eq!(
        got.as_ref().and_then(ProbeResult::backend),
        Some("udp-b"),
        "{mode}: the entry to the removed endpoint was deleted: {:?}\n{:#?}",
        session.latest(),
        conntrack_list(tb.node()).unwrap()
    );
    session.clear();
    let later = session.wait_for(support::CHANGE, |_| true);
    assert_eq!(later.as_ref().and_then(ProbeResult::backend), Some("udp-b"), "{mode}: and stays there");
    drop(session);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nftables_mode_deletes_stale_udp_node_port_entries_on_a_secondary_address() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    stale_udp_node_port_entries_on_a_secondary_address_are_deleted("nftables");
}

#[test]
fn iptables_mode_deletes_stale_udp_node_port_entries_on_a_secondary_address() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    stale_udp_node_port_entries_on_a_secondary_address_are_deleted("iptables");
}

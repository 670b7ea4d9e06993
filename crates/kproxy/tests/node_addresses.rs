//! Node addresses are followed: an address added to the node after start, inside the
//! `nodePortAddresses` CIDR, serves NodePorts within seconds (it was never served before: the
//! addresses were read once at start). The real binary, a fake API server, packets.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::SocketAddr;

use kproxy_state::Kind;
use kproxy_testbed::kernel::KernelFeature;
use kproxy_testbed::{ProbeResult, Proto, Testbed, Where};
use serde_json::json;

fn node_port_on_an_address_added_later_is_served(mode: &str) {
    let tb = Testbed::new().unwrap();
    let pod = tb.add_pod("web-b", Where::Node2).unwrap();
    pod.serve(&[(Proto::Tcp, 8080)]).unwrap();
    let api = support::api_in(tb.node());
    support::apply_node_a(&api.server);
    api.server.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": "web"},
               "spec": {"type": "NodePort", "clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
                        "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}]}}),
    );
    support::apply_one_endpoint_slice(&api.server, "web", "p", &pod.ipv4().to_string(), "node-b");
    let args: Vec<String> = [
        format!("--proxy-mode={mode}"),
        "--nodeport-addresses=198.18.0.0/24".into(),
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

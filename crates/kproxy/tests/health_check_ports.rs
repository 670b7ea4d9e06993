//! Health-check node ports listen where NodePorts are served (`nodePortAddresses`), as
//! upstream, not on every address: the real binary in a sandbox whose node has a second address
//! outside nodePortAddresses; the health check answers on the node IP and not on the other.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kproxy_state::Kind;
use kproxy_testbed::kernel::KernelFeature;
use kproxy_testbed::{Proto, Testbed, Where};
use serde_json::json;

const HEALTH_CHECK_PORT: u16 = 31000;

fn health_check_port_answers_on_node_port_addresses_only(mode: &str) {
    let tb = Testbed::new().unwrap();
    let pod = tb.add_pod("web-a", Where::Node).unwrap();
    pod.serve(&[(Proto::Tcp, 8080)]).unwrap();
    tb.node().ip(["addr", "add", "198.18.0.4/24", "dev", "eth0"]).unwrap();
    let api = support::api_in(tb.node());
    support::apply_node_a(&api.server);
    api.server.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": "lb"},
               "spec": {"type": "LoadBalancer", "clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
                        "externalTrafficPolicy": "Local", "healthCheckNodePort": HEALTH_CHECK_PORT,
                        "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}]},
               "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}),
    );
    support::apply_one_endpoint_slice(&api.server, "lb", "p", &pod.ipv4().to_string(), "node-a");
    let args: Vec<String> = [
        &format!("--proxy-mode={mode}"),
        "--nodeport-addresses=198.18.0.2/32",
        "--hostname-override=node-a",
        "--detect-local-mode=NodeCIDR",
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=0",
        "--conntrack-tcp-timeout-close-wait=0",
    ]
    .map(String::from)
    .to_vec();
    let (_kproxy, dir) = support::kproxy_in(tb.node().name(), &api.server.url(), &format!("hc-{mode}"), &args);

    let on_node_ip: SocketAddr = format!("198.18.0.2:{HEALTH_CHECK_PORT}").parse().unwrap();
    let deadline = Instant::now() + support::START;
    let answer = loop {
        let answer = tb.external().run_in(move || support::http_get(on_node_ip, "/healthz")).unwrap();
        if answer.as_ref().is_some_and(|(status, _)| *status == 200) || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (status, body) = answer.expect("the health check answers on the node IP");
    assert_eq!(status, 200, "{mode}: one local endpoint: {body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["localEndpoints"], 1, "{body}");

    let elsewhere: SocketAddr = format!("198.18.0.4:{HEALTH_CHECK_PORT}").parse().unwrap();
    let other = tb.external().run_in(move || support::http_get(elsewhere, "/healthz")).unwrap();
    assert!(other.is_none(), "{mode}: the health check must not answer outside nodePortAddresses: {other:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn iptables_mode_health_check_port_answers_on_node_port_addresses_only() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    health_check_port_answers_on_node_port_addresses_only("iptables");
}

#[test]
fn nftables_mode_health_check_port_answers_on_node_port_addresses_only() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    health_check_port_answers_on_node_port_addresses_only("nftables");
}

#[test]
fn ipvs_mode_health_check_port_answers_on_node_port_addresses_only() {
    if !kproxy_testbed::kernel::require_root()
        || !kproxy_testbed::kernel::require(&[KernelFeature::Ipvs, KernelFeature::Dummy])
    {
        return;
    }
    health_check_port_answers_on_node_port_addresses_only("ipvs");
}

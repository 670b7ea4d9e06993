//! A UDP flow to an endpoint that is terminating but still serving keeps going while the
//! endpoint drains (new flows go to the ready endpoint), and is cut over to the ready endpoint
//! once the draining one stops serving: the stale-flow cleanup keeps conntrack entries of every
//! serving endpoint, as upstream. The real binary, a fake API server, packets.
//!
//! IPVS mode differs, as upstream's does: a terminating endpoint leaves the virtual service's
//! real servers, and UDP gets no graceful termination (upstream deletes UDP and SCTP real
//! servers at once, `expire_nodest_conn` expiring their connections on the next packet), so the
//! flow moves to the ready endpoint as soon as the other terminates.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kproxy_state::Kind;
use kproxy_testbed::kernel::KernelFeature;
use kproxy_testbed::{Netns, ProbeOptions, ProbeResult, Proto, Testbed, Where, probe_with};
use serde_json::{Value, json};

const SERVICE: &str = "198.18.128.10:53";
/// The long-lived flow's source port; other probes use ephemeral ports.
const FLOW_PORT: u16 = 40_000;

/// The Service's one slice: `(pod address, ready, serving)` per endpoint.
fn slice(endpoints: &[(&str, bool, bool)]) -> Value {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, ready, serving)| {
            json!({"addresses": [ip], "nodeName": "node-b",
                   "conditions": {"ready": ready, "serving": serving, "terminating": !ready}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"namespace": "demo", "name": "dns-1", "labels": {"kubernetes.io/service-name": "dns"}},
           "addressType": "IPv4", "endpoints": endpoints,
           "ports": [{"name": "dns", "port": 8053, "protocol": "UDP"}]})
}

/// One datagram from `from`, from the flow's source port when `flow`, else an ephemeral one.
fn udp(from: &Netns, flow: bool) -> ProbeResult {
    let bind = flow.then(|| SocketAddr::from(([0, 0, 0, 0], FLOW_PORT)));
    let options = ProbeOptions { timeout: Duration::from_millis(500), bind };
    probe_with(from, Proto::Udp, SERVICE.parse().unwrap(), &options).unwrap()
}

/// Probes until `want` answers a datagram (from the flow's port when `flow`) or `within`
/// passed; returns the last result.
fn until_answered_by(from: &Netns, flow: bool, want: &str, within: Duration) -> ProbeResult {
    let deadline = Instant::now() + within;
    loop {
        let got = udp(from, flow);
        if got.backend() == Some(want) || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How a mode treats a live UDP flow to an endpoint that starts terminating while another is
/// ready.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Terminating {
    /// The flow keeps reaching it until it stops serving (conntrack-based modes).
    Drains,
    /// The flow moves to the ready endpoint at once (IPVS mode, as upstream).
    CutsOver,
}

fn udp_flow_to_a_terminating_endpoint(mode: &str, expected: Terminating) {
    let tb = Testbed::new().unwrap();
    let a = tb.add_pod("dns-a", Where::Node2).unwrap();
    a.serve(&[(Proto::Udp, 8053)]).unwrap();
    let b = tb.add_pod("dns-b", Where::Node2).unwrap();
    b.serve(&[(Proto::Udp, 8053)]).unwrap();
    let client = tb.add_pod("client", Where::Node).unwrap();
    let (a_ip, b_ip) = (a.ipv4().to_string(), b.ipv4().to_string());

    let api = support::api_in(tb.node());
    support::apply_node_a(&api.server);
    api.server.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": "dns"},
               "spec": {"clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
                        "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 8053}]}}),
    );
    api.server.apply(Kind::EndpointSlice, slice(&[(&a_ip, true, true)]));
    let metrics = support::free_port();
    let args = support::node_a_args(metrics, &[&format!("--proxy-mode={mode}"), "--detect-local-mode=NodeCIDR"]);
    let (_kproxy, dir) = support::kproxy_in(tb.node().name(), &api.server.url(), &format!("udp-drain-{mode}"), &args);

    // The flow starts on A, the only endpoint.
    let got = until_answered_by(client.netns(), true, "dns-a", support::START);
    assert_eq!(got.backend(), Some("dns-a"), "{mode}: the flow reaches A: {got:?}");

    // A terminates but still serves; B is ready: new flows go to B, the flow stays on A.
    api.server.apply(Kind::EndpointSlice, slice(&[(&a_ip, false, true), (&b_ip, true, true)]));
    let got = until_answered_by(client.netns(), false, "dns-b", support::CHANGE);
    assert_eq!(got.backend(), Some("dns-b"), "{mode}: new flows go to the ready B: {got:?}");
    let mut b_answers = 0;
    for _ in 0..20 {
        let got = udp(client.netns(), false);
        b_answers += usize::from(got.backend() == Some("dns-b"));
    }
    assert_eq!(b_answers, 20, "{mode}: every new flow goes to B while A drains");
    match expected {
        Terminating::Drains => {
            // Several syncs' worth of time: the cleanup runs after each sync.
            for _ in 0..10 {
                let got = udp(client.netns(), true);
                assert_eq!(
                    got.backend(),
                    Some("dns-a"),
                    "{mode}: the live flow keeps reaching the draining A: {got:?}"
                );
                std::thread::sleep(Duration::from_millis(300));
            }
        }
        Terminating::CutsOver => {
            let got = until_answered_by(client.netns(), true, "dns-b", support::CHANGE);
            assert_eq!(got.backend(), Some("dns-b"), "{mode}: the flow moves to B once A terminates: {got:?}");
        }
    }

    // A stops serving: its flow is stale, deleted, and the next datagram of the flow reaches B.
    api.server.apply(Kind::EndpointSlice, slice(&[(&a_ip, false, false), (&b_ip, true, true)]));
    let got = until_answered_by(client.netns(), true, "dns-b", support::CHANGE);
    assert_eq!(got.backend(), Some("dns-b"), "{mode}: the flow moves to B once A stops serving: {got:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn nftables_mode_keeps_a_udp_flow_to_a_draining_endpoint_until_it_stops_serving() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    udp_flow_to_a_terminating_endpoint("nftables", Terminating::Drains);
}

#[test]
fn iptables_mode_keeps_a_udp_flow_to_a_draining_endpoint_until_it_stops_serving() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    udp_flow_to_a_terminating_endpoint("iptables", Terminating::Drains);
}

#[test]
fn ipvs_mode_moves_a_udp_flow_off_a_terminating_endpoint_at_once_as_upstream_ipvs() {
    if !kproxy_testbed::kernel::require_root()
        || !kproxy_testbed::kernel::require(&[KernelFeature::Ipvs, KernelFeature::Dummy])
    {
        return;
    }
    udp_flow_to_a_terminating_endpoint("ipvs", Terminating::CutsOver);
}

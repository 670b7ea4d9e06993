//! Stale UDP conntrack cleanup against the real kernel.
//!
//! A client keeps sending to a ClusterIP from one source port, so all its datagrams share one
//! conntrack entry. The node's rules (a hand-written nft table standing in for the dataplane)
//! change; the entry does not, and keeps steering the client to the old endpoint. Each test
//! first shows that (the bug upstream users hit), then runs one reconcile pass with the new plan
//! and shows the very next datagram takes the new path.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may unwrap

mod common;

use common::*;

/// Two UDP echo endpoints, A and B, the service routed to A, and a client whose flow is on A.
struct FlowOnA {
    t: Topology,
    a: UdpEcho,
    _b: UdpEcho,
    client: UdpClient,
}

fn flow_on_a(tag: &str) -> FlowOnA {
    let t = Topology::new(tag);
    let a = UdpEcho::start(&t.pod_a, "198.18.2.2:8053", "A");
    let _b = UdpEcho::start(&t.pod_b, "198.18.3.2:8053", "B");
    t.route_service_to(POD_A);
    let client = UdpClient::new(&t.client, 40000);
    assert_eq!(client.probe(), reply("A"));
    FlowOnA { t, a, _b, client }
}

#[test]
fn replaced_endpoint_is_reached_after_one_reconcile() {
    if !kernel_tests_enabled("replaced_endpoint_is_reached_after_one_reconcile") {
        return;
    }
    let FlowOnA { t, a, _b, client } = flow_on_a("repl");

    // The endpoint is replaced: the dataplane now sends new flows to B.
    t.route_service_to(POD_B);
    let fresh = UdpClient::new(&t.client, 40001);
    assert_eq!(fresh.probe(), reply("B"), "the rules send new flows to B");
    for _ in 0..3 {
        assert_eq!(client.probe(), reply("A"), "without cleanup, the conntrack entry keeps the client on A");
    }

    let mut reconciler = t.reconciler();
    let stats = reconciler.reconcile(&plan(Some(&[POD_B]))).unwrap();
    assert_eq!(stats.deleted, 1, "exactly the entry to A: {stats:?}\n{}", t.udp_entries());
    assert!(stats.examined >= 2, "{stats:?}");
    let a_before = a.received();
    assert_eq!(client.probe(), reply("B"), "the very next datagram reaches B");
    assert_eq!(fresh.probe(), reply("B"), "the flow that already went to B is untouched");
    assert_eq!(a.received(), a_before, "A gets nothing more");

    let again = reconciler.reconcile(&plan(Some(&[POD_B]))).unwrap();
    assert_eq!((again.stale, again.deleted), (0, 0), "nothing left to delete: {again:?}");
    assert_eq!(client.probe(), reply("B"));
}

#[test]
fn replaced_endpoint_whose_pod_is_gone_stops_blackholing() {
    if !kernel_tests_enabled("replaced_endpoint_whose_pod_is_gone_stops_blackholing") {
        return;
    }
    let FlowOnA { t, a, _b, client } = flow_on_a("gone");

    // Pod A is deleted (its interface with it) and B replaces it.
    drop(a);
    t.node.ip("link del to-a");
    t.route_service_to(POD_B);
    for _ in 0..3 {
        let probe = client.probe();
        assert!(
            matches!(probe, Probe::Silent | Probe::Unreachable),
            "without cleanup the client is blackholed towards the deleted pod, got {probe:?}"
        );
    }

    let stats = t.reconciler().reconcile(&plan(Some(&[POD_B]))).unwrap();
    assert_eq!(stats.deleted, 1, "{stats:?}");
    assert_eq!(client.probe(), reply("B"));
}

#[test]
fn service_scaled_to_zero_and_back() {
    if !kernel_tests_enabled("service_scaled_to_zero_and_back") {
        return;
    }
    let FlowOnA { t, a, _b, client } = flow_on_a("zero");
    let mut reconciler = t.reconciler();
    assert_eq!(reconciler.reconcile(&plan(Some(&[POD_A]))).unwrap().deleted, 0, "A is a serving endpoint");

    // Scaled to zero: the dataplane rejects new flows. The entry bypasses the reject rule
    // (kubernetes#139628: the upstream reconciler skipped services without endpoints).
    t.reject_service();
    assert_eq!(client.probe(), reply("A"), "without cleanup, the entry keeps reaching the old pod");

    let stats = reconciler.reconcile(&plan(Some(&[]))).unwrap();
    assert_eq!(stats.deleted, 1, "{stats:?}");
    let a_before = a.received();
    assert_eq!(client.probe(), Probe::Refused, "the next datagram meets the reject rule");
    assert_eq!(a.received(), a_before);

    // Scaled back up, to B.
    t.route_service_to(POD_B);
    let stats = reconciler.reconcile(&plan(Some(&[POD_B]))).unwrap();
    assert_eq!(stats.deleted, 0, "rejected datagrams leave no entry behind: {stats:?}");
    assert_eq!(client.probe(), reply("B"));
}

#[test]
fn deleted_service_stops_reaching_its_old_endpoint() {
    if !kernel_tests_enabled("deleted_service_stops_reaching_its_old_endpoint") {
        return;
    }
    let t = Topology::new("del");
    let a = UdpEcho::start(&t.pod_a, "198.18.2.2:8053", "A");
    t.route_service_to(POD_A);
    let client = UdpClient::new(&t.client, 40000);
    assert_eq!(client.probe(), reply("A"));
    let mut reconciler = t.reconciler();
    assert_eq!(reconciler.reconcile(&plan(Some(&[POD_A]))).unwrap().deleted, 0);

    // The service is deleted: its rules are gone, and so is it from the plan (PR #141371).
    t.forget_service();
    assert_eq!(client.probe(), reply("A"), "without cleanup, the entry outlives the service");

    let stats = reconciler.reconcile(&plan(None)).unwrap();
    assert_eq!(stats.deleted, 1, "{stats:?}");
    let a_before = a.received();
    assert_eq!(client.probe(), Probe::Unreachable, "the service address is routed nowhere");
    assert_eq!(a.received(), a_before, "the old endpoint gets nothing more");

    // The deleted frontend is forgotten after a complete pass: nothing else is touched.
    let stats = reconciler.reconcile(&plan(None)).unwrap();
    assert_eq!((stats.examined, stats.deleted), (0, 0), "no UDP frontend left, no dump: {stats:?}");
}

#[test]
fn entries_that_agree_with_the_plan_are_left_alone() {
    if !kernel_tests_enabled("entries_that_agree_with_the_plan_are_left_alone") {
        return;
    }
    let t = Topology::new("keep");
    let _a = UdpEcho::start(&t.pod_a, "198.18.2.2:8053", "A");
    let _b = UdpEcho::start(&t.pod_b, "198.18.3.2:8053", "B");
    // A direct (non-service) flow to pod B's echo, which no reconcile may touch.
    let _direct = UdpEcho::start(&t.pod_b, "198.18.3.2:9999", "B-direct");
    let direct = t.client.enter(|| {
        let socket = std::net::UdpSocket::bind("198.18.1.2:41000").unwrap();
        socket.connect("198.18.3.2:9999").unwrap();
        socket
    });
    direct.set_read_timeout(Some(std::time::Duration::from_millis(400))).unwrap();
    direct.send(b"ping").unwrap();
    let mut buffer = [0; 16];
    let length = direct.recv(&mut buffer).unwrap();
    assert_eq!(&buffer[..length], b"B-direct");

    t.route_service_to(POD_A);
    let clients: Vec<UdpClient> = (40000..40010).map(|port| UdpClient::new(&t.client, port)).collect();
    for client in &clients {
        assert_eq!(client.probe(), reply("A"));
    }
    let stats = t.reconciler().reconcile(&plan(Some(&[POD_A, POD_B]))).unwrap();
    assert_eq!((stats.examined, stats.stale, stats.deleted), (11, 0, 0), "{stats:?}");
    for client in &clients {
        assert_eq!(client.probe(), reply("A"));
    }
    let entries = t.udp_entries();
    assert!(entries.contains("dport=9999"), "the direct flow is still tracked:\n{entries}");
}

#[test]
fn udp_flow_to_a_terminating_endpoint_drains_until_it_stops_serving() {
    if !kernel_tests_enabled("udp_flow_to_a_terminating_endpoint_drains_until_it_stops_serving") {
        return;
    }
    let FlowOnA { t, a, _b, client } = flow_on_a("drain");

    // A is terminating but still serving; B is ready, so new flows go to B only.
    t.route_service_to(POD_B);
    let mut reconciler = t.reconciler();
    let stats = reconciler.reconcile(&plan_draining(Some(&[POD_B]), &[POD_A])).unwrap();
    assert_eq!((stats.stale, stats.deleted), (0, 0), "the flow to the draining A stays: {stats:?}");
    let a_before = a.received();
    assert_eq!(client.probe(), reply("A"), "the live flow keeps reaching A while it drains");
    assert!(a.received() > a_before);
    assert_eq!(UdpClient::new(&t.client, 40001).probe(), reply("B"), "new flows go to the ready B");

    // A stops serving: now its flow is stale, and the next datagram reaches B.
    let stats = reconciler.reconcile(&plan_draining(Some(&[POD_B]), &[])).unwrap();
    assert_eq!(stats.deleted, 1, "{stats:?}\n{}", t.udp_entries());
    assert_eq!(client.probe(), reply("B"));
}

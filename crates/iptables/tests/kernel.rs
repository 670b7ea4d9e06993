//! iptables-specific behaviour on the real kernel, in testbed namespaces, for both backends:
//! localhost NodePorts and the route_localnet mitigation, canary self-healing after a flush,
//! and `--cleanup` leaving other tools' rules alone.

#![allow(clippy::unwrap_used)]

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use kproxy_iptables::{Backend, Config, IptablesDataplane, IptablesRestore};
use kproxy_packet_suite::{endpoint, node_objects, service, slice};
use kproxy_plan::{NodeContext, NodePortAddress, Plan, PlanDelta, Planner, ProxyPolicy};
use kproxy_state::{Change, ClusterState};
use kproxy_testbed::topology::{CLUSTER_CIDR_V4, CLUSTER_CIDR_V6, NODE_IP_V4, NODE_IP_V6};
use kproxy_testbed::{ProbeOptions, Proto, Testbed, Where, probe_many};
use serde_json::json;

struct Bed {
    tb: Testbed,
    plan: Plan,
}

/// A testbed with backend `a` on the node and `b` on node2, and a NodePort service `web`
/// (ClusterIP 198.18.128.10:80, NodePort 30080) on NodePorts of every local address.
fn bed() -> Option<Bed> {
    if !kproxy_testbed::kernel::require_root() {
        return None;
    }
    let tb = Testbed::new().unwrap();
    let mut objs = node_objects();
    let mut ips = Vec::new();
    for (name, on) in [("a", Where::Node), ("b", Where::Node2)] {
        let pod = tb.add_pod(name, on).unwrap();
        pod.serve(&[(Proto::Tcp, 8080)]).unwrap();
        let node = if on == Where::Node { "node-a" } else { "node-b" };
        ips.push(endpoint(&pod.ipv4().to_string(), node, json!({"ready": true})));
    }
    objs.push(service(
        "default",
        "web",
        json!({"type": "NodePort", "clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]}),
        json!({}),
    ));
    objs.push(slice("default", "web", "v4", "IPv4", json!([{"name": "http", "protocol": "TCP", "port": 8080}]), ips));
    let policy = ProxyPolicy {
        detect_local: kproxy_plan::DetectLocal::ClusterCidr(vec![CLUSTER_CIDR_V4.into(), CLUSTER_CIDR_V6.into()]),
        nodeport_addresses: vec![NodePortAddress::All],
        ..ProxyPolicy::default()
    };
    let node = NodeContext {
        name: "node-a".into(),
        node_ip_override: Vec::new(),
        local_addresses: vec![NODE_IP_V4.into(), NODE_IP_V6.into()],
    };
    let mut state = ClusterState::new();
    for o in objs {
        state.apply(Change::Applied(o));
    }
    let plan = Planner::new(policy, node).build(&state);
    Some(Bed { tb, plan })
}

impl Bed {
    fn dataplane(&self, backend: Backend) -> IptablesDataplane<IptablesRestore> {
        IptablesDataplane::new(IptablesRestore::new(backend), Config::default())
    }

    fn sync(&self, dp: &mut IptablesDataplane<IptablesRestore>, delta: &PlanDelta) -> kproxy_iptables::SyncReport {
        self.tb.node().run_in(|| dp.sync(&self.plan, delta)).unwrap().unwrap()
    }

    fn full_delta(&self) -> PlanDelta {
        PlanDelta::between(&Plan::default(), &self.plan)
    }

    /// Backends answering `n` TCP connections from `from` to `dest` (name → count).
    fn answered(&self, from: &kproxy_testbed::Netns, dest: &str, n: usize) -> kproxy_testbed::Tally {
        let dest: SocketAddr = dest.parse().unwrap();
        probe_many(from, Proto::Tcp, dest, n, &ProbeOptions::with_timeout(Duration::from_millis(700))).unwrap()
    }

    fn iptables(&self, backend: Backend, args: &[&str]) -> String {
        let program = format!("iptables-{}", backend.as_str());
        self.tb.node().exec_ok(&program, args).unwrap()
    }

    fn save(&self, backend: Backend) -> String {
        let program = format!("iptables-{}-save", backend.as_str());
        self.tb.node().exec_ok(&program, &[] as &[&str]).unwrap()
    }
}

/// Teaches `external` to send packets for 127.0.0.1 to the node, like a neighbour forging them.
fn route_loopback_to_node(tb: &Testbed) {
    let ext = tb.external();
    ext.sysctls(&[("net/ipv4/conf/all/route_localnet", "1"), ("net/ipv4/conf/eth0/route_localnet", "1")]).unwrap();
    ext.ip_batch(&[
        "route del local 127.0.0.0/8 dev lo table local".to_owned(),
        "route del local 127.0.0.1 dev lo table local".to_owned(),
        format!("route add 127.0.0.1/32 via {NODE_IP_V4} dev eth0"),
    ])
    .unwrap();
}

/// Whether a datagram `external` sends to 127.0.0.1:9999 reaches a socket the node bound there.
fn node_localhost_udp_reachable_from_external(tb: &Testbed) -> bool {
    let listener = tb
        .node()
        .run_in(|| {
            let s = UdpSocket::bind("127.0.0.1:9999").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(800))).unwrap();
            s
        })
        .unwrap();
    tb.external()
        .run_in(|| {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            for _ in 0..3 {
                s.send_to(b"hello", "127.0.0.1:9999").unwrap();
            }
        })
        .unwrap();
    let mut buf = [0u8; 16];
    listener.recv_from(&mut buf).is_ok()
}

fn localhost_nodeports(backend: Backend) {
    let Some(bed) = bed() else { return };
    let tb = &bed.tb;
    route_loopback_to_node(tb);
    // The spoofing path works: with route_localnet on and no mitigation, a neighbour reaches
    // a service the node bound to 127.0.0.1 (CVE-2020-8558).
    tb.node().sysctl("net/ipv4/conf/all/route_localnet", "1").unwrap();
    assert!(node_localhost_udp_reachable_from_external(tb), "test setup: forged packets to 127.0.0.1 don't arrive");
    tb.node().sysctl("net/ipv4/conf/all/route_localnet", "0").unwrap();

    let mut dp = bed.dataplane(backend);
    bed.sync(&mut dp, &bed.full_delta());
    assert_eq!(tb.node().read_sysctl("net/ipv4/conf/all/route_localnet").unwrap().trim(), "1");
    // From the node itself, 127.0.0.1:<nodePort> reaches the backends.
    let t = bed.answered(tb.node(), "127.0.0.1:30080", 12);
    assert_eq!(t.answered(), 12, "{t:?}");
    assert!(t.backends.contains_key("a") && t.backends.contains_key("b"), "{t:?}");
    // From a neighbour, neither the localhost NodePort nor localhost-bound services are reachable.
    // (Kernel 6.18 itself drops a DNATed packet whose original destination was 127.0.0.0/8 from
    // the wire; kproxy's RETURN for non-loopback sources covers kernels that don't. The UDP check
    // below is KUBE-FIREWALL's: it fails without that rule.)
    let t = bed.answered(tb.external(), "127.0.0.1:30080", 3);
    assert_eq!(t.answered(), 0, "a neighbour reached a localhost NodePort: {t:?}");
    assert!(!node_localhost_udp_reachable_from_external(tb), "a neighbour reached 127.0.0.1 on the node");
    // The node IP keeps working from outside.
    let t = bed.answered(tb.external(), "198.18.0.2:30080", 6);
    assert_eq!(t.answered(), 6, "{t:?}");
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

fn canary_heals_a_flush(backend: Backend) {
    let Some(bed) = bed() else { return };
    let tb = &bed.tb;
    let mut dp = bed.dataplane(backend);
    assert!(bed.sync(&mut dp, &bed.full_delta()).full);
    assert!(tb.node().run_in(|| dp.check_canary()).unwrap().unwrap());
    assert_eq!(bed.answered(tb.external(), "198.18.128.10:80", 6).answered(), 6);

    bed.iptables(backend, &["-t", "nat", "-F"]);
    assert_eq!(bed.answered(tb.external(), "198.18.128.10:80", 2).answered(), 0, "the flush did not break services");
    assert!(!tb.node().run_in(|| dp.check_canary()).unwrap().unwrap(), "the canary missed the flush");
    // Nothing changed in the cluster: the sync is full only because of the canary.
    let report = bed.sync(&mut dp, &PlanDelta::default());
    assert!(report.full, "{report:?}");
    assert!(tb.node().run_in(|| dp.check_canary()).unwrap().unwrap());
    let t = bed.answered(tb.external(), "198.18.128.10:80", 12);
    assert_eq!(t.answered(), 12, "{t:?}");
    // Deleting the chains outright is noticed too.
    bed.iptables(backend, &["-t", "mangle", "-F"]);
    bed.iptables(backend, &["-t", "mangle", "-X"]);
    assert!(!tb.node().run_in(|| dp.check_canary()).unwrap().unwrap());
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

fn cleanup_keeps_other_rules(backend: Backend) {
    let Some(bed) = bed() else { return };
    let tb = &bed.tb;
    // Another tool's chain, jump and plain rules in the tables kproxy uses.
    bed.iptables(backend, &["-t", "nat", "-N", "OTHER-TOOL"]);
    bed.iptables(backend, &["-t", "nat", "-A", "OTHER-TOOL", "-d", "192.0.2.99/32", "-j", "RETURN"]);
    bed.iptables(backend, &["-t", "nat", "-A", "PREROUTING", "-j", "OTHER-TOOL"]);
    bed.iptables(backend, &["-t", "filter", "-A", "FORWARD", "-s", "192.0.2.98/32", "-j", "ACCEPT"]);
    let before = bed.save(backend);

    let mut dp = bed.dataplane(backend);
    bed.sync(&mut dp, &bed.full_delta());
    let during = bed.save(backend);
    for chain in ["KUBE-SERVICES", "KUBE-SVC-", "KUBE-EXT-", "KUBE-POSTROUTING", "KUBE-PROXY-CANARY"] {
        assert!(during.contains(chain), "{chain} missing:\n{during}");
    }
    // A fresh process (`kproxy --cleanup`) knows nothing of what was applied.
    drop(dp);
    tb.node().run_in(|| kproxy_iptables::cleanup(&mut IptablesRestore::new(backend))).unwrap().unwrap();
    let after = bed.save(backend);
    assert!(!after.contains("KUBE-"), "kproxy left something:\n{after}");
    for rule in [
        ":OTHER-TOOL - [0:0]",
        "-A PREROUTING -j OTHER-TOOL",
        "-A OTHER-TOOL -d 192.0.2.99/32 -j RETURN",
        "-A FORWARD -s 192.0.2.98/32 -j ACCEPT",
    ] {
        assert!(after.contains(rule), "cleanup removed {rule:?}:\n{after}");
    }
    let strip = |s: &str| -> Vec<String> {
        s.lines().filter(|l| !l.starts_with('#')).map(|l| l.split(" [").next().unwrap_or(l).to_owned()).collect()
    };
    // Table sections kproxy created (mangle) may remain empty; everything that was there is.
    for line in strip(&before) {
        assert!(strip(&after).contains(&line), "missing after cleanup: {line}\n{after}");
    }
}

macro_rules! both_backends {
    ($($name:ident),+ $(,)?) => {
        mod nft {
            $( #[test] fn $name() { super::$name(kproxy_iptables::Backend::Nft); } )+
        }
        mod legacy {
            $( #[test] fn $name() { super::$name(kproxy_iptables::Backend::Legacy); } )+
        }
    };
}

both_backends!(localhost_nodeports, canary_heals_a_flush, cleanup_keeps_other_rules);

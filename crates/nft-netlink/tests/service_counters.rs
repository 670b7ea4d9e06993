#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Per-Service counters in the kernel: with `service_counters` on (over the tables of a kproxy
//! that ran without), known connections to a served ClusterIP, a Service without endpoints, a
//! LoadBalancer IP whose source ranges exclude the client and that Service's NodePort come back
//! from the counted maps' elements as exactly that many served, rejected and range-dropped
//! connections, and the packets and bytes the same traffic took.

use kproxy_nft_netlink::NetlinkExecutor;
use kproxy_nft_netlink::counters::{Counted, element_counters};
use kproxy_nftables::counters::{self, ElementCount, ServicePortCounts};
use kproxy_nftables::{Config, NftablesDataplane};
use kproxy_packet_suite::{Env, node_objects, service, slice};
use kproxy_plan::explain::ConnectionCounts;
use kproxy_plan::{DetectLocal, NodeContext, Plan, PlanDelta, Planner, ProxyPolicy};
use kproxy_state::{Change, ClusterState};
use kproxy_testbed::topology::{CLUSTER_CIDR_V4, NODE_IP_V4};
use kproxy_testbed::{ProbeOptions, Proto, Testbed, Where, probe_many};
use serde_json::json;

fn config() -> Config {
    Config { service_counters: true, ..Config::default() }
}

fn read(tb: &Testbed, plan: &Plan) -> Vec<ServicePortCounts> {
    let plan = plan.clone();
    tb.node()
        .run_in(move || {
            let mut exec = NetlinkExecutor::new();
            counters::read(&config(), &plan, |table, set, keys| {
                let counts = element_counters(&mut exec, table, set, keys)?;
                let count = |c: Counted| ElementCount { packets: c.packets, bytes: c.bytes };
                Ok::<_, std::io::Error>(counts.into_iter().map(|c| c.map(count)).collect())
            })
        })
        .unwrap()
        .unwrap()
}

fn of(counts: &[ServicePortCounts], service: &str) -> ConnectionCounts {
    all_of(counts, service).counts
}

fn all_of<'a>(counts: &'a [ServicePortCounts], service: &str) -> &'a ServicePortCounts {
    counts.iter().find(|c| &*c.name.service == service).unwrap()
}

#[test]
fn counters_count_served_rejected_and_range_dropped_connections_per_service_port() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let tb = Testbed::builder().build().unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    a.serve(&[(Proto::Tcp, 8080)]).unwrap();
    let client = tb.add_pod("client", Where::Node).unwrap();
    let env = Env { testbed: &tb };
    let ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    let svc_port = json!([{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]);
    let lb_port = json!([{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]);
    let mut objects = node_objects();
    objects.extend([
        service("default", "web", json!({"clusterIP": "198.18.128.10", "ports": svc_port.clone()}), json!({})),
        slice("default", "web", "v4", "IPv4", ports.clone(), vec![env.ep("a", false)]),
        service("default", "empty", json!({"clusterIP": "198.18.128.11", "ports": svc_port}), json!({})),
        service(
            "default",
            "lb",
            json!({"type": "LoadBalancer", "clusterIP": "198.18.128.12", "ports": lb_port,
                   "loadBalancerSourceRanges": ["198.51.100.0/24"]}),
            json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}),
        ),
        slice("default", "lb", "v4", "IPv4", ports, vec![env.ep("a", false)]),
    ]);
    let mut state = ClusterState::new();
    for o in objects {
        state.apply(Change::Applied(o));
    }
    let policy =
        ProxyPolicy { detect_local: DetectLocal::ClusterCidr(vec![CLUSTER_CIDR_V4.into()]), ..ProxyPolicy::default() };
    let node =
        NodeContext { name: "node-a".into(), node_ip_override: Vec::new(), local_addresses: vec![NODE_IP_V4.into()] };
    let plan = Planner::new(policy, node).build(&state);
    // A kproxy without counters ran before: turning them on takes over its tables.
    let mut uncounted = tb.node().run_in(|| NftablesDataplane::new(NetlinkExecutor::new(), Config::default())).unwrap();
    tb.node().run_in(|| uncounted.full_sync(&plan)).unwrap().unwrap();
    let mut dp = tb.node().run_in(|| NftablesDataplane::new(NetlinkExecutor::new(), config())).unwrap();
    tb.node().run_in(|| dp.partial_sync(&plan, &PlanDelta::between(&Plan::default(), &plan))).unwrap().unwrap();

    let initial = read(&tb, &plan);
    let zero = ConnectionCounts::default();
    assert!(initial.iter().all(|c| (c.counts, c.packets, c.bytes) == (zero, zero, zero)), "{initial:?}");
    let options = ProbeOptions::with_timeout(std::time::Duration::from_millis(500));
    let probe = |from: &kproxy_testbed::Netns, to: &str, n: usize| {
        probe_many(from, Proto::Tcp, to.parse().unwrap(), n, &options).unwrap()
    };
    assert_eq!(probe(client.netns(), "198.18.128.10:80", 5).backends.values().sum::<usize>(), 5);
    assert_eq!(probe(client.netns(), "198.18.128.11:80", 4).refused, 4);
    assert_eq!(probe(tb.external(), "203.0.113.10:80", 3).timed_out, 3, "outside the source ranges");
    assert_eq!(probe(tb.external(), &format!("{NODE_IP_V4}:30080"), 2).backends.values().sum::<usize>(), 2);

    let counts = read(&tb, &plan);
    let (web, empty, lb) = (of(&counts, "web"), of(&counts, "empty"), of(&counts, "lb"));
    assert_eq!((web.served, web.rejected_no_endpoints, web.dropped_by_source_ranges), (5, 0, 0), "{counts:?}");
    assert_eq!((empty.served, empty.rejected_no_endpoints), (0, 4), "{counts:?}");
    assert_eq!((lb.served, lb.dropped_by_source_ranges, lb.rejected_no_endpoints), (2, 3, 0), "{counts:?}");

    // Packets and bytes. Each echo connection (SYN, SYN-ACK, the echo line, the close) is at
    // least 3 packets both ways counted, of 40 to 80 header bytes plus a reply line under 64.
    let served_within = |c: &ServicePortCounts, connections: u64| {
        let (p, b) = (c.packets.served, c.bytes.served);
        p >= 3 * connections && p <= 20 * connections && b >= 40 * p && b <= 80 * p + 64 * connections
    };
    let (web, empty, lb) = (all_of(&counts, "web"), all_of(&counts, "empty"), all_of(&counts, "lb"));
    assert!(served_within(web, 5), "{web:?}");
    // Served through the NodePort only (the LoadBalancer IP dropped them): node-port traffic.
    assert!(served_within(lb, 2), "{lb:?}");
    // Refused: one SYN each (a reset is not resent; the dropped ones timed out before a resend),
    // all of one size.
    assert_eq!((empty.packets.served, empty.bytes.served, empty.packets.rejected_no_endpoints), (0, 0, 4));
    assert!(empty.bytes.rejected_no_endpoints % 4 == 0 && (160..=320).contains(&empty.bytes.rejected_no_endpoints));
    assert_eq!(lb.packets.dropped_by_source_ranges, 3, "{lb:?}");
    assert_eq!(lb.bytes.dropped_by_source_ranges, 3 * empty.bytes.rejected_no_endpoints / 4, "{lb:?}");
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

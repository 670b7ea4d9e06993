//! Table-driven tests of the stale-flow decision.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use kproxy_plan::{
    Endpoint, FamilyDelta, FamilyPlan, InternalTraffic, LocalTraffic, MasqueradeWhen, NodePlan, NodePortAddresses,
    Plan, PlanDelta, ServicePortName, ServicePortPlan, SnatPolicy,
};
use kproxy_state::{IpFamily, Protocol};
use proptest::prelude::*;

use super::*;
use crate::flow::Tuple;

const NODE_IP: &str = "192.0.2.10";
const CLIENT: &str = "198.18.1.2";

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn endpoint(address: &str) -> Endpoint {
    let socket: SocketAddr = address.parse().unwrap();
    Endpoint { ip: socket.ip(), port: socket.port(), is_local: false, ready: true }
}

struct Service {
    name: &'static str,
    protocol: Protocol,
    cluster_ip: &'static str,
    port: u16,
    node_port: Option<u16>,
    external_ips: &'static [&'static str],
    load_balancer_ips: &'static [&'static str],
    cluster_endpoints: &'static [&'static str],
    local_endpoints: &'static [&'static str],
    /// Serving endpoints beyond the cluster and local sets (terminating, topology-filtered).
    other_serving: &'static [&'static str],
}

const SERVICE: Service = Service {
    name: "",
    protocol: Protocol::Udp,
    cluster_ip: "",
    port: 0,
    node_port: None,
    external_ips: &[],
    load_balancer_ips: &[],
    cluster_endpoints: &[],
    local_endpoints: &[],
    other_serving: &[],
};

fn port_plan(service: &Service) -> ServicePortPlan {
    ServicePortPlan {
        name: ServicePortName {
            namespace: "default".into(),
            service: service.name.into(),
            port: "".into(),
            protocol: service.protocol,
        },
        cluster_ip: ip(service.cluster_ip),
        port: service.port,
        protocol: service.protocol,
        node_port: service.node_port,
        external_ips: service.external_ips.iter().map(|a| ip(a)).collect(),
        load_balancer_ips: service.load_balancer_ips.iter().map(|a| ip(a)).collect(),
        source_ranges: Vec::new(),
        affinity_timeout: None,
        cluster_endpoints: service.cluster_endpoints.iter().map(|a| endpoint(a)).collect(),
        local_endpoints: service.local_endpoints.iter().map(|a| endpoint(a)).collect(),
        internal: InternalTraffic { local: false, masquerade: MasqueradeWhen::Never, no_endpoints: None },
        external: None,
        health_check_node_port: None,
        accelerate: false,
        serving_endpoints: {
            let all = service.cluster_endpoints.iter().chain(service.local_endpoints).chain(service.other_serving);
            let mut all: Vec<SocketAddr> = all.map(|a| a.parse().unwrap()).collect();
            all.sort();
            all.dedup();
            all
        },
    }
}

fn plan(services: &[Service], nodeport_addresses: NodePortAddresses) -> FamilyPlan {
    let services: BTreeMap<ServicePortName, Arc<ServicePortPlan>> = services
        .iter()
        .map(|service| {
            let plan = port_plan(service);
            (plan.name.clone(), Arc::new(plan))
        })
        .collect();
    FamilyPlan {
        family: IpFamily::V4,
        node: NodePlan {
            node_ip: Some(ip(NODE_IP)),
            local_traffic: LocalTraffic::Undetectable,
            nodeport_addresses,
            snat: SnatPolicy::masquerade(),
            service_cidrs: Vec::new(),
            acceleration: false,
        },
        services,
    }
}

fn cluster() -> Vec<Service> {
    vec![
        Service {
            name: "dns",
            cluster_ip: "198.18.128.10",
            port: 53,
            node_port: Some(30053),
            external_ips: &["203.0.113.7"],
            load_balancer_ips: &["198.51.100.9"],
            cluster_endpoints: &["198.18.2.2:8053", "198.18.5.2:8053"],
            local_endpoints: &["198.18.2.2:8053"],
            ..SERVICE
        },
        Service {
            name: "syslog-scaled-to-zero",
            cluster_ip: "198.18.128.20",
            port: 514,
            node_port: Some(30514),
            ..SERVICE
        },
        Service {
            name: "web",
            protocol: Protocol::Tcp,
            cluster_ip: "198.18.128.30",
            port: 80,
            cluster_endpoints: &["198.18.2.2:8080"],
            ..SERVICE
        },
        Service {
            name: "signalling",
            protocol: Protocol::Sctp,
            cluster_ip: "198.18.128.40",
            port: 9000,
            cluster_endpoints: &["198.18.3.2:9001"],
            ..SERVICE
        },
        Service {
            name: "local-only",
            cluster_ip: "198.18.128.50",
            port: 123,
            local_endpoints: &["198.18.2.2:1123"],
            ..SERVICE
        },
    ]
}

/// A flow from the client's port 40000 to `to`, answered by `reply_from`.
fn flow(protocol: Protocol, to: &str, reply_from: &str) -> Flow {
    let to: SocketAddr = to.parse().unwrap();
    let reply_from: SocketAddr = reply_from.parse().unwrap();
    Flow {
        protocol,
        original: Tuple { src: ip(CLIENT), dst: to.ip(), src_port: 40000, dst_port: to.port() },
        reply: Tuple { src: reply_from.ip(), dst: ip(CLIENT), src_port: reply_from.port(), dst_port: 40000 },
        zone: 0,
        id: Some(1),
    }
}

use Protocol::{Sctp, Tcp, Udp};

#[test]
fn decides_per_flow_with_node_ports_on_the_node_ip() {
    let cases: &[(&str, Flow, bool)] = &[
        ("udp to ClusterIP, DNATed to a serving endpoint", flow(Udp, "198.18.128.10:53", "198.18.2.2:8053"), false),
        (
            "udp to ClusterIP, DNATed to the other serving endpoint",
            flow(Udp, "198.18.128.10:53", "198.18.5.2:8053"),
            false,
        ),
        ("udp to ClusterIP, DNATed to a removed endpoint", flow(Udp, "198.18.128.10:53", "198.18.9.9:8053"), true),
        (
            "udp to ClusterIP, DNATed to a serving address on an old port",
            flow(Udp, "198.18.128.10:53", "198.18.2.2:5353"),
            true,
        ),
        (
            "udp to ClusterIP, never DNATed (sent before the service had endpoints)",
            flow(Udp, "198.18.128.10:53", "198.18.128.10:53"),
            true,
        ),
        (
            "udp to ClusterIP on a port the service does not have",
            flow(Udp, "198.18.128.10:54", "198.18.9.9:8053"),
            false,
        ),
        ("udp to external IP, DNATed to a removed endpoint", flow(Udp, "203.0.113.7:53", "198.18.9.9:8053"), true),
        ("udp to external IP, DNATed to a serving endpoint", flow(Udp, "203.0.113.7:53", "198.18.5.2:8053"), false),
        (
            "udp to load balancer IP, DNATed to a removed endpoint",
            flow(Udp, "198.51.100.9:53", "198.18.9.9:8053"),
            true,
        ),
        (
            "udp to load balancer IP, DNATed to a serving endpoint",
            flow(Udp, "198.51.100.9:53", "198.18.2.2:8053"),
            false,
        ),
        (
            "udp to a service scaled to zero, DNATed to its last endpoint (kubernetes#139628)",
            flow(Udp, "198.18.128.20:514", "198.18.6.2:514"),
            true,
        ),
        ("udp to the node port of a service scaled to zero", flow(Udp, "192.0.2.10:30514", "198.18.6.2:514"), true),
        (
            "udp to a local-policy-only service, DNATed to its local endpoint",
            flow(Udp, "198.18.128.50:123", "198.18.2.2:1123"),
            false,
        ),
        (
            "udp to a local-policy-only service, DNATed to a remote endpoint",
            flow(Udp, "198.18.128.50:123", "198.18.5.2:1123"),
            true,
        ),
        (
            "tcp to a TCP ClusterIP, DNATed to a removed endpoint: TCP is left alone",
            flow(Tcp, "198.18.128.30:80", "198.18.9.9:8080"),
            false,
        ),
        ("tcp to the UDP ClusterIP and port", flow(Tcp, "198.18.128.10:53", "198.18.9.9:8053"), false),
        ("sctp to ClusterIP, DNATed to a removed endpoint", flow(Sctp, "198.18.128.40:9000", "198.18.9.9:9001"), true),
        (
            "sctp to ClusterIP, DNATed to its serving endpoint",
            flow(Sctp, "198.18.128.40:9000", "198.18.3.2:9001"),
            false,
        ),
        ("udp to the node port, DNATed to a removed endpoint", flow(Udp, "192.0.2.10:30053", "198.18.9.9:8053"), true),
        ("udp to the node port, DNATed to a serving endpoint", flow(Udp, "192.0.2.10:30053", "198.18.2.2:8053"), false),
        ("udp to the node port, never DNATed", flow(Udp, "192.0.2.10:30053", "192.0.2.10:30053"), true),
        ("udp to another node's node port through this node", flow(Udp, "192.0.2.99:30053", "192.0.2.99:30053"), false),
        (
            "udp to another node's node port, NATed by someone else",
            flow(Udp, "192.0.2.99:30053", "198.18.9.9:8053"),
            false,
        ),
        ("udp to an unrelated server", flow(Udp, "203.0.113.50:53", "203.0.113.50:53"), false),
        ("udp to the node IP on a port that is no node port", flow(Udp, "192.0.2.10:30054", "198.18.9.9:8053"), false),
    ];
    let frontends = Frontends::from_plan(&plan(&cluster(), NodePortAddresses::Only(vec![ip(NODE_IP)])), &[]);
    let mut failures = Vec::new();
    for (name, flow, stale) in cases {
        if frontends.is_stale(flow) != *stale {
            failures.push(format!("{name}: expected stale={stale} for {flow}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn with_node_ports_on_every_local_address() {
    let cases: &[(&str, Flow, bool)] = &[
        ("a known local address, never DNATed", flow(Udp, "192.0.2.11:30053", "192.0.2.11:30053"), true),
        ("the node IP, never DNATed", flow(Udp, "192.0.2.10:30053", "192.0.2.10:30053"), true),
        (
            "an unknown address, never DNATed: another node's node port",
            flow(Udp, "192.0.2.99:30053", "192.0.2.99:30053"),
            false,
        ),
        (
            "an unknown address, DNATed to a removed endpoint: a local address we were not told of",
            flow(Udp, "192.0.2.99:30053", "198.18.9.9:8053"),
            true,
        ),
        ("an unknown address, DNATed to a serving endpoint", flow(Udp, "192.0.2.99:30053", "198.18.5.2:8053"), false),
    ];
    let frontends =
        Frontends::from_plan(&plan(&cluster(), NodePortAddresses::AllLocal(Vec::new())), &[ip("192.0.2.11")]);
    for (name, flow, stale) in cases {
        assert_eq!(frontends.is_stale(flow), *stale, "{name}");
    }
}

#[test]
fn a_service_address_wins_over_a_node_port_with_the_same_number() {
    // Service "dns" has node port 30053; another UDP service listens on ClusterIP port 30053.
    let mut services = cluster();
    services.push(Service {
        name: "high-port",
        cluster_ip: "198.18.128.60",
        port: 30053,
        cluster_endpoints: &["198.18.7.2:30053"],
        ..SERVICE
    });
    let frontends = Frontends::from_plan(&plan(&services, NodePortAddresses::AllLocal(Vec::new())), &[]);
    // DNATed to its own endpoint: not stale although that is no endpoint of "dns".
    assert!(!frontends.is_stale(&flow(Udp, "198.18.128.60:30053", "198.18.7.2:30053")));
    assert!(frontends.is_stale(&flow(Udp, "198.18.128.60:30053", "198.18.2.2:8053")));
}

#[test]
fn a_deleted_services_frontend_makes_all_its_flows_stale() {
    let mut frontends = Frontends::from_plan(&plan(&[], NodePortAddresses::Only(vec![ip(NODE_IP)])), &[]);
    let flows = [
        flow(Udp, "198.18.128.10:53", "198.18.2.2:8053"),
        flow(Udp, "192.0.2.10:30053", "198.18.2.2:8053"),
        flow(Udp, "198.18.128.11:53", "198.18.2.2:8053"),
    ];
    assert!(stale_flows(&frontends, &flows).is_empty(), "nothing is known about a plan without services");
    frontends.insert_without_endpoints(Frontend::Address { protocol: Udp, ip: ip("198.18.128.10"), port: 53 });
    frontends.insert_without_endpoints(Frontend::NodePort { protocol: Udp, port: 30053 });
    assert_eq!(stale_flows(&frontends, &flows), flows[..2].to_vec());
}

#[test]
fn a_remembered_frontend_does_not_hide_the_endpoints_of_a_current_one() {
    let mut frontends = Frontends::from_plan(&plan(&cluster(), NodePortAddresses::Only(vec![ip(NODE_IP)])), &[]);
    frontends.insert_without_endpoints(Frontend::Address { protocol: Udp, ip: ip("198.18.128.10"), port: 53 });
    assert!(!frontends.is_stale(&flow(Udp, "198.18.128.10:53", "198.18.2.2:8053")));
}

#[test]
fn stale_entries_keeps_input_order_and_skips_fresh_flows() {
    let flows = [
        flow(Udp, "198.18.128.20:514", "198.18.6.2:514"),
        flow(Udp, "198.18.128.10:53", "198.18.2.2:8053"),
        flow(Sctp, "198.18.128.40:9000", "198.18.9.9:9001"),
    ];
    let stale = stale_entries(&plan(&cluster(), NodePortAddresses::Only(vec![ip(NODE_IP)])), &[], &flows);
    assert_eq!(stale, vec![flows[0], flows[2]]);
}

#[test]
fn reports_which_protocols_are_in_use() {
    let frontends = Frontends::from_plan(&plan(&cluster(), NodePortAddresses::AllLocal(Vec::new())), &[]);
    assert!(frontends.uses(Udp) && frontends.uses(Sctp));
    assert!(!frontends.uses(Tcp), "TCP services are not managed");
    let only_tcp = Frontends::from_plan(&plan(&cluster()[2..3], NodePortAddresses::AllLocal(Vec::new())), &[]);
    assert_eq!(only_tcp.frontends().count(), 0);
}

#[test]
fn flows_to_serving_endpoints_outside_the_used_sets_drain() {
    // 198.18.5.2 is serving but not used: terminating while a ready endpoint exists, or filtered
    // out by topology. Its flows keep going (upstream); a non-serving endpoint's do not.
    let drain = Service {
        name: "drain",
        cluster_ip: "198.18.128.60",
        port: 53,
        node_port: Some(30060),
        cluster_endpoints: &["198.18.2.2:8053"],
        other_serving: &["198.18.5.2:8053"],
        ..SERVICE
    };
    let frontends = Frontends::from_plan(&plan(&[drain], NodePortAddresses::AllLocal(Vec::new())), &[ip(NODE_IP)]);
    let cases = [
        ("to the used endpoint", flow(Udp, "198.18.128.60:53", "198.18.2.2:8053"), false),
        ("to the terminating serving endpoint", flow(Udp, "198.18.128.60:53", "198.18.5.2:8053"), false),
        ("to it through the node port", flow(Udp, "192.0.2.10:30060", "198.18.5.2:8053"), false),
        ("to an endpoint that is not serving", flow(Udp, "198.18.128.60:53", "198.18.9.9:8053"), true),
    ];
    for (name, flow, stale) in cases {
        assert_eq!(frontends.is_stale(&flow), stale, "{name}: {flow}");
    }
}

/// A service port drawn from small pools, so that frontends and endpoints collide across
/// service ports and across plans.
fn arbitrary_port() -> impl Strategy<Value = ServicePortPlan> {
    let protocol = prop::sample::select(vec![Protocol::Udp, Protocol::Udp, Protocol::Sctp, Protocol::Tcp]);
    let address = |pool: &'static [&'static str]| prop::sample::select(pool.to_vec()).prop_map(ip);
    let endpoints = prop::collection::vec((0u8..6, prop::sample::select(vec![53u16, 8053])), 0..4);
    (
        (0u8..4, protocol, address(&["198.18.128.10", "198.18.128.20", "198.18.128.30"])),
        (prop::sample::select(vec![53u16, 514]), proptest::option::of(prop::sample::select(vec![30053u16, 30514]))),
        (prop::collection::vec(address(&["203.0.113.7", "198.51.100.9"]), 0..2), endpoints.clone(), endpoints),
    )
        .prop_map(|((name, protocol, cluster_ip), (port, node_port), (external_ips, cluster, terminating))| {
            let endpoint = |(host, port): &(u8, u16)| Endpoint {
                ip: IpAddr::from([198, 18, 2, *host]),
                port: *port,
                is_local: *host == 0,
                ready: true,
            };
            let mut cluster_endpoints: Vec<Endpoint> = cluster.iter().map(endpoint).collect();
            cluster_endpoints.sort();
            cluster_endpoints.dedup();
            let mut serving_endpoints: Vec<SocketAddr> = cluster_endpoints
                .iter()
                .chain(&terminating.iter().map(endpoint).collect::<Vec<_>>())
                .map(|ep| SocketAddr::new(ep.ip, ep.port))
                .collect();
            serving_endpoints.sort();
            serving_endpoints.dedup();
            ServicePortPlan {
                name: ServicePortName {
                    namespace: "default".into(),
                    service: format!("svc-{name}").into(),
                    port: "".into(),
                    protocol,
                },
                cluster_ip,
                port,
                protocol,
                node_port,
                external_ips,
                load_balancer_ips: Vec::new(),
                source_ranges: Vec::new(),
                affinity_timeout: None,
                local_endpoints: cluster_endpoints.iter().filter(|ep| ep.is_local).cloned().collect(),
                cluster_endpoints,
                internal: InternalTraffic { local: false, masquerade: MasqueradeWhen::Never, no_endpoints: None },
                external: None,
                health_check_node_port: None,
                accelerate: false,
                serving_endpoints,
            }
        })
}

fn arbitrary_plan() -> impl Strategy<Value = Plan> {
    prop::collection::vec(arbitrary_port(), 0..6).prop_map(|ports| {
        let mut family = plan(&[], NodePortAddresses::Only(vec![ip(NODE_IP)]));
        family.services = ports.into_iter().map(|p| (p.name.clone(), Arc::new(p))).collect();
        Plan { families: [(IpFamily::V4, family)].into() }
    })
}

proptest! {
    /// Frontends patched with each change of a sequence of plans are those of the last plan
    /// built whole, and each patch names exactly the frontends the plan before had and the
    /// plan after has not.
    #[test]
    fn frontends_patched_change_by_change_equal_those_built_from_the_whole_plan(
        plans in prop::collection::vec(arbitrary_plan(), 1..8),
    ) {
        let mut before = Plan::default();
        let mut patched: Option<Frontends> = None;
        for after in plans {
            let family = &after.families[&IpFamily::V4];
            let whole = Frontends::from_plan(family, &[]);
            if let Some(frontends) = patched.as_mut() {
                let delta = PlanDelta::between(&before, &after);
                let gone = frontends.apply(delta.families.get(&IpFamily::V4).unwrap_or(&FamilyDelta::default()));
                prop_assert_eq!(&*frontends, &whole);
                let previous = Frontends::from_plan(&before.families[&IpFamily::V4], &[]);
                let expected: Vec<Frontend> =
                    previous.frontends().filter(|f| !whole.contains(f)).copied().collect();
                prop_assert_eq!(gone, expected);
            } else {
                patched = Some(whole);
            }
            before = after;
        }
    }
}

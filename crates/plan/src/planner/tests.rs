//! Planner rules, table by table, and properties: determinism, diff/apply, incremental = full.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kproxy_state::{Change, ClusterState, Object};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::model::{ExternalPolicy, MasqueradeWhen, NoEndpointsVerdict};
use crate::policy::NoMasqueradeSource;

const NODE: &str = "node-a";

fn service(name: &str, spec: Value) -> Change {
    service_with(name, spec, json!({}))
}

fn service_with(name: &str, spec: Value, status: Value) -> Change {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": name},
        "spec": spec,
        "status": status,
    }))
    .unwrap();
    Change::Applied(Object::Service(Box::new(svc.into())))
}

/// A slice with port "" TCP 8080 (or `port_name`) and endpoints given as (ip, node, flags).
fn slice(name: &str, svc: &str, endpoints: &[(&str, &str, &str)]) -> Change {
    let family = if endpoints.first().is_some_and(|e| e.0.contains(':')) { "IPv6" } else { "IPv4" };
    let eps: Vec<Value> = endpoints
        .iter()
        .map(|(ip, node, flags)| {
            json!({
                "addresses": [ip],
                "nodeName": node,
                "conditions": {
                    "ready": flags.contains('r'),
                    "serving": flags.contains('r') || flags.contains('s'),
                    "terminating": flags.contains('t'),
                },
            })
        })
        .collect();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": family,
        "endpoints": eps,
        "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap();
    Change::Applied(Object::EndpointSlice(Box::new(slice)))
}

fn node(pod_cidrs: &[&str], ips: &[&str]) -> Change {
    let addresses: Vec<Value> = ips.iter().map(|ip| json!({"type": "InternalIP", "address": ip})).collect();
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE, "labels": {"topology.kubernetes.io/zone": "zone-a"}},
        "spec": {"podCIDRs": pod_cidrs},
        "status": {"addresses": addresses},
    }))
    .unwrap();
    Change::Applied(Object::Node(Box::new(node)))
}

fn state(changes: Vec<Change>) -> ClusterState {
    let mut state = ClusterState::new();
    for change in changes {
        let outcome = state.apply(change);
        assert!(outcome.rejected.is_empty(), "{:?}", outcome.rejected);
    }
    state
}

fn planner(policy: ProxyPolicy) -> Planner {
    Planner::new(policy, NodeContext { name: NODE.into(), ..Default::default() })
}

fn only_port(plan: &Plan, family: IpFamily, svc: &str) -> Arc<ServicePortPlan> {
    let fam = &plan.families[&family];
    let mut ports = fam.services.values().filter(|p| &*p.name.service == svc);
    let port = ports.next().unwrap_or_else(|| panic!("no port for {svc}"));
    assert!(ports.next().is_none());
    port.clone()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn basic_cluster() -> Vec<Change> {
    vec![
        node(&["198.18.16.0/24"], &["198.18.0.2"]),
        service("web", json!({"clusterIP": "198.18.128.10", "ports": [{"port": 80, "targetPort": 8080}]})),
        slice("web-1", "web", &[("198.18.16.5", NODE, "r"), ("198.18.17.5", "node-b", "r")]),
    ]
}

#[test]
fn internal_masquerade_follows_masquerade_all_and_detect_local() {
    let cases = [
        (
            "masqueradeAll",
            true,
            DetectLocal::ClusterCidr(vec!["198.18.16.0/20".parse().unwrap()]),
            MasqueradeWhen::Always,
        ),
        (
            "ClusterCIDR",
            false,
            DetectLocal::ClusterCidr(vec!["198.18.16.0/20".parse().unwrap()]),
            MasqueradeWhen::SourceNotLocal,
        ),
        (
            "ClusterCIDR without a v4 CIDR",
            false,
            DetectLocal::ClusterCidr(vec!["fd00:10::/48".parse().unwrap()]),
            MasqueradeWhen::Never,
        ),
        ("NodeCIDR", false, DetectLocal::NodeCidr, MasqueradeWhen::SourceNotLocal),
        ("BridgeInterface", false, DetectLocal::BridgeInterface("cbr0".into()), MasqueradeWhen::SourceNotLocal),
        ("InterfaceNamePrefix", false, DetectLocal::InterfaceNamePrefix("veth".into()), MasqueradeWhen::SourceNotLocal),
        ("none", false, DetectLocal::None, MasqueradeWhen::Never),
    ];
    let st = state(basic_cluster());
    for (name, masquerade_all, detect_local, want) in cases {
        let plan = planner(ProxyPolicy { masquerade_all, detect_local, ..Default::default() }).build(&st);
        assert_eq!(only_port(&plan, IpFamily::V4, "web").internal.masquerade, want, "{name}");
    }
}

#[test]
fn detect_local_resolves_per_family() {
    let mut changes = basic_cluster();
    changes[0] = node(&["198.18.16.0/24", "fd00:10:16::/64"], &["198.18.0.2", "fd00:18::2"]);
    let st = state(changes);
    let plan = planner(ProxyPolicy { detect_local: DetectLocal::NodeCidr, ..Default::default() }).build(&st);
    assert_eq!(
        plan.families[&IpFamily::V4].node.local_traffic,
        LocalTraffic::SourceCidrs(vec!["198.18.16.0/24".parse().unwrap()])
    );
    assert_eq!(
        plan.families[&IpFamily::V6].node.local_traffic,
        LocalTraffic::SourceCidrs(vec!["fd00:10:16::/64".parse().unwrap()])
    );
    assert_eq!(plan.families[&IpFamily::V4].node.node_ip, Some(ip("198.18.0.2")));
    assert_eq!(plan.families[&IpFamily::V6].node.node_ip, Some(ip("fd00:18::2")));
}

#[test]
fn no_endpoint_verdicts() {
    struct Case {
        name: &'static str,
        spec: Value,
        endpoints: &'static [(&'static str, &'static str, &'static str)],
        internal: Option<NoEndpointsVerdict>,
        external: Option<Option<NoEndpointsVerdict>>,
    }
    let cases = [
        Case {
            name: "no endpoints at all: reject both",
            spec: json!({"type": "NodePort", "clusterIP": "198.18.128.10", "ports": [{"port": 80, "nodePort": 30080}]}),
            endpoints: &[],
            internal: Some(NoEndpointsVerdict::Reject),
            external: Some(Some(NoEndpointsVerdict::Reject)),
        },
        Case {
            name: "only unready endpoints: reject",
            spec: json!({"clusterIP": "198.18.128.10", "ports": [{"port": 80}]}),
            endpoints: &[("198.18.16.5", NODE, "")],
            internal: Some(NoEndpointsVerdict::Reject),
            external: None,
        },
        Case {
            name: "iTP Local without local endpoints: drop internal",
            spec: json!({"clusterIP": "198.18.128.10", "internalTrafficPolicy": "Local", "ports": [{"port": 80}]}),
            endpoints: &[("198.18.17.5", "node-b", "r")],
            internal: Some(NoEndpointsVerdict::Drop),
            external: None,
        },
        Case {
            name: "eTP Local without local endpoints: drop external only",
            spec: json!({"type": "NodePort", "clusterIP": "198.18.128.10", "externalTrafficPolicy": "Local", "ports": [{"port": 80, "nodePort": 30080}]}),
            endpoints: &[("198.18.17.5", "node-b", "r")],
            internal: None,
            external: Some(Some(NoEndpointsVerdict::Drop)),
        },
        Case {
            name: "eTP Local with a local terminating endpoint: served",
            spec: json!({"type": "NodePort", "clusterIP": "198.18.128.10", "externalTrafficPolicy": "Local", "ports": [{"port": 80, "nodePort": 30080}]}),
            endpoints: &[("198.18.16.5", NODE, "st"), ("198.18.17.5", "node-b", "r")],
            internal: None,
            external: Some(None),
        },
        Case {
            name: "eTP Local on a ClusterIP service without external IPs is ignored",
            spec: json!({"clusterIP": "198.18.128.10", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}),
            endpoints: &[("198.18.17.5", "node-b", "r")],
            internal: None,
            external: None,
        },
    ];
    for case in cases {
        let mut changes = vec![node(&["198.18.16.0/24"], &["198.18.0.2"]), service("svc", case.spec)];
        if !case.endpoints.is_empty() {
            changes.push(slice("svc-1", "svc", case.endpoints));
        }
        let plan = planner(ProxyPolicy::default()).build(&state(changes));
        let port = only_port(&plan, IpFamily::V4, "svc");
        assert_eq!(port.internal.no_endpoints, case.internal, "{}: internal", case.name);
        assert_eq!(port.external.as_ref().map(|e| e.no_endpoints), case.external, "{}: external", case.name);
    }
}

#[test]
fn external_local_policy_short_circuits_only_when_pods_are_detectable() {
    let spec = json!({"type": "LoadBalancer", "clusterIP": "198.18.128.10", "externalTrafficPolicy": "Local",
        "healthCheckNodePort": 32000, "ports": [{"port": 80, "nodePort": 30080}]});
    let status =
        json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}, {"ip": "203.0.113.11", "ipMode": "Proxy"}]}});
    let changes = vec![
        node(&["198.18.16.0/24"], &["198.18.0.2"]),
        service_with("lb", spec, status),
        slice("lb-1", "lb", &[("198.18.16.5", NODE, "r"), ("198.18.17.5", "node-b", "r")]),
    ];
    let st = state(changes);
    for (detect_local, short_circuit) in [(DetectLocal::NodeCidr, true), (DetectLocal::None, false)] {
        let port =
            only_port(&planner(ProxyPolicy { detect_local, ..Default::default() }).build(&st), IpFamily::V4, "lb");
        let external = port.external.clone().unwrap();
        assert_eq!(external.policy, ExternalPolicy::Local { short_circuit_pods: short_circuit });
        assert_eq!(port.load_balancer_ips, vec![ip("203.0.113.10")], "ipMode Proxy is skipped");
        assert_eq!(port.health_check_node_port, Some(32000));
        assert_eq!(port.local_endpoints.iter().map(|e| e.ip).collect::<Vec<_>>(), [ip("198.18.16.5")]);
        assert_eq!(port.cluster_endpoints.len(), 2);
    }
}

#[test]
fn nodeport_addresses_resolve_keywords_and_cidrs() {
    let st = state(basic_cluster());
    let node_ctx = NodeContext {
        name: NODE.into(),
        node_ip_override: vec![],
        local_addresses: vec![ip("198.18.0.2"), ip("192.0.2.7"), ip("127.0.0.1"), ip("fd00:18::2")],
    };
    let cases = [
        (vec![NodePortAddress::Primary], NodePortAddresses::Only(vec![ip("198.18.0.2")])),
        (vec![NodePortAddress::All], NodePortAddresses::AllLocal(vec![ip("192.0.2.7"), ip("198.18.0.2")])),
        (
            vec![NodePortAddress::Primary, NodePortAddress::Localhost],
            NodePortAddresses::Only(vec![ip("127.0.0.1"), ip("198.18.0.2")]),
        ),
        (vec![NodePortAddress::Cidr("192.0.2.0/24".parse().unwrap())], NodePortAddresses::Only(vec![ip("192.0.2.7")])),
    ];
    for (addresses, want) in cases {
        let policy =
            ProxyPolicy { nodeport_addresses: addresses.clone(), list_local_addresses: true, ..Default::default() };
        let plan = Planner::new(policy, node_ctx.clone()).build(&st);
        assert_eq!(plan.families[&IpFamily::V4].node.nodeport_addresses, want, "{addresses:?}");
    }
    // Unlisted (every mode but IPVS): an address coming or going changes nothing in the plan.
    let policy = ProxyPolicy { nodeport_addresses: vec![NodePortAddress::All], ..Default::default() };
    let plan = Planner::new(policy, node_ctx).build(&st);
    assert_eq!(plan.families[&IpFamily::V4].node.nodeport_addresses, NodePortAddresses::AllLocal(Vec::new()));
}

#[test]
fn snat_to_node_ip_falls_back_to_masquerade_when_the_node_ip_is_unknown() {
    let policy = ProxyPolicy {
        snat_to_node_ip: true,
        no_masquerade_cidrs: vec!["198.18.16.0/20".parse().unwrap(), "fd00:10::/48".parse().unwrap()],
        ..Default::default()
    };
    let plan = planner(policy.clone()).build(&state(basic_cluster()));
    let v4 = &plan.families[&IpFamily::V4].node.snat;
    assert_eq!(v4.source, SnatSource::NodeIp(ip("198.18.0.2")));
    assert_eq!(v4.no_masquerade_cidrs, vec!["198.18.16.0/20".parse::<IpNet>().unwrap()]);
    let v6 = &plan.families[&IpFamily::V6].node.snat;
    assert_eq!(v6.source, SnatSource::Masquerade);
    assert!(v6.fell_back_to_masquerade);
}

#[test]
fn dual_stack_service_gets_one_port_plan_per_family_with_matching_endpoints() {
    let changes = vec![
        node(&["198.18.16.0/24"], &["198.18.0.2"]),
        service(
            "ds",
            json!({"clusterIPs": ["198.18.128.20", "fd00:96::20"], "externalIPs": ["203.0.113.5", "fd00:203::5"],
            "loadBalancerSourceRanges": ["192.0.2.0/24", "fd00:1::/64"], "ports": [{"port": 80}]}),
        ),
        slice("ds-v4", "ds", &[("198.18.16.5", NODE, "r")]),
        slice("ds-v6", "ds", &[("fd00:10:16::5", NODE, "r")]),
    ];
    let plan = planner(ProxyPolicy::default()).build(&state(changes));
    let v4 = only_port(&plan, IpFamily::V4, "ds");
    let v6 = only_port(&plan, IpFamily::V6, "ds");
    assert_eq!((v4.cluster_ip, v6.cluster_ip), (ip("198.18.128.20"), ip("fd00:96::20")));
    assert_eq!((v4.external_ips.clone(), v6.external_ips.clone()), (vec![ip("203.0.113.5")], vec![ip("fd00:203::5")]));
    assert_eq!(v4.source_ranges, vec!["192.0.2.0/24".parse::<IpNet>().unwrap()]);
    assert_eq!(v6.cluster_endpoints.iter().map(|e| e.ip).collect::<Vec<_>>(), [ip("fd00:10:16::5")]);
}

#[test]
fn duplicate_endpoints_across_slices_count_once_and_prefer_local() {
    let changes = vec![
        node(&["198.18.16.0/24"], &["198.18.0.2"]),
        service(
            "dup",
            json!({"clusterIP": "198.18.128.30", "internalTrafficPolicy": "Local", "ports": [{"port": 80}]}),
        ),
        slice("dup-a", "dup", &[("198.18.16.5", "node-b", "r")]),
        slice("dup-b", "dup", &[("198.18.16.5", NODE, "r")]),
    ];
    let port = only_port(&planner(ProxyPolicy::default()).build(&state(changes)), IpFamily::V4, "dup");
    assert_eq!(port.local_endpoints.len(), 1);
    assert!(port.local_endpoints[0].is_local);
}

#[test]
fn acceleration_needs_the_hint_the_switch_and_tcp_or_udp() {
    let annotated = |name: &str, proto: &str| {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name, "annotations": {"service.kproxy.io/traffic-hint": "LongLived"}},
            "spec": {"clusterIP": format!("198.18.128.{}", 40 + name.len()), "ports": [{"port": 80, "protocol": proto}]},
        }))
        .unwrap();
        Change::Applied(Object::Service(Box::new(svc.into())))
    };
    let st = state(vec![
        annotated("tcp", "TCP"),
        annotated("sctp", "SCTP"),
        service("plain", json!({"clusterIP": "198.18.128.50", "ports": [{"port": 80}]})),
    ]);
    let on = planner(ProxyPolicy::default()).build(&st);
    assert!(only_port(&on, IpFamily::V4, "tcp").accelerate);
    assert!(!only_port(&on, IpFamily::V4, "sctp").accelerate);
    assert!(!only_port(&on, IpFamily::V4, "plain").accelerate);
    let off = planner(ProxyPolicy { acceleration: false, ..Default::default() }).build(&st);
    assert!(!only_port(&off, IpFamily::V4, "tcp").accelerate);
}

// ---- properties -------------------------------------------------------------------------

/// A generated service: (cluster ip last octet, port count, iTP local, eTP local + node port,
/// affinity, endpoints as (last octet, on this node, flags index)).
type GenService = (u8, u8, bool, bool, bool, Vec<(u8, bool, u8)>);

fn gen_service() -> impl Strategy<Value = GenService> {
    (
        1u8..250,
        1u8..3,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec((1u8..250, any::<bool>(), 0u8..4), 0..6),
    )
}

fn changes_for(services: &[GenService]) -> Vec<Change> {
    const FLAGS: [&str; 4] = ["r", "st", "", "t"];
    let mut changes = vec![node(&["198.18.16.0/24"], &["198.18.0.2"])];
    for (i, (octet, nports, itp, etp, affinity, eps)) in services.iter().enumerate() {
        let name = format!("svc-{i}");
        let ports: Vec<Value> = (0..*nports).map(|p| json!({"name": format!("p{p}"), "port": 80 + p as i32, "nodePort": 30000 + i as i32 * 4 + p as i32})).collect();
        let mut spec = json!({"type": if *etp { "NodePort" } else { "ClusterIP" }, "clusterIP": format!("198.18.{}.{}", 128 + i / 250, octet), "ports": ports});
        if !*etp {
            for p in spec["ports"].as_array_mut().unwrap() {
                p.as_object_mut().unwrap().remove("nodePort");
            }
        }
        spec["internalTrafficPolicy"] = json!(if *itp { "Local" } else { "Cluster" });
        spec["externalTrafficPolicy"] = json!(if *etp { "Local" } else { "Cluster" });
        if *affinity {
            spec["sessionAffinity"] = json!("ClientIP");
        }
        changes.push(service(&name, spec));
        let endpoints: Vec<(String, &str, &str)> = eps
            .iter()
            .map(|(o, local, f)| {
                (
                    format!("198.18.{}.{o}", if *local { 16 } else { 17 }),
                    if *local { NODE } else { "node-b" },
                    FLAGS[*f as usize],
                )
            })
            .collect();
        let endpoints: Vec<(&str, &str, &str)> = endpoints.iter().map(|(a, b, c)| (a.as_str(), *b, *c)).collect();
        let mut slice_change = slice(&format!("{name}-1"), &name, &endpoints);
        if let Change::Applied(Object::EndpointSlice(s)) = &mut slice_change {
            s.ports = Some(
                (0..*nports)
                    .map(|p| k8s_openapi::api::discovery::v1::EndpointPort {
                        name: Some(format!("p{p}")),
                        port: Some(8080 + p as i32),
                        ..Default::default()
                    })
                    .collect(),
            );
        }
        changes.push(slice_change);
    }
    changes
}

fn lenient_state(changes: Vec<Change>) -> ClusterState {
    let mut st = ClusterState::new();
    for c in changes {
        st.apply(c); // generated services may collide on cluster IPs; rejected ones are fine here
    }
    st
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn plan_is_deterministic_whatever_the_event_order(services in prop::collection::vec(gen_service(), 0..8), seed in any::<u64>()) {
        let changes = changes_for(&services);
        let mut shuffled = changes.clone();
        // A deterministic permutation from the seed: the node first, then the rest rotated.
        let k = if shuffled.len() > 1 { (seed as usize) % (shuffled.len() - 1) } else { 0 };
        shuffled[1..].rotate_left(k);
        shuffled[1..].reverse();
        let p = planner(ProxyPolicy { detect_local: DetectLocal::NodeCidr, ..Default::default() });
        prop_assert_eq!(p.build(&lenient_state(changes)), p.build(&lenient_state(shuffled)));
    }

    #[test]
    fn diff_applied_to_a_gives_b(a in prop::collection::vec(gen_service(), 0..8), b in prop::collection::vec(gen_service(), 0..8)) {
        let p = planner(ProxyPolicy::default());
        let mut plan_a = p.build(&lenient_state(changes_for(&a)));
        let plan_b = p.build(&lenient_state(changes_for(&b)));
        let delta = PlanDelta::between(&plan_a, &plan_b);
        plan_a.apply(&delta);
        prop_assert_eq!(plan_a, plan_b);
    }

    #[test]
    fn incremental_update_equals_a_full_build(a in prop::collection::vec(gen_service(), 1..8), b in prop::collection::vec(gen_service(), 1..8)) {
        let p = planner(ProxyPolicy { detect_local: DetectLocal::NodeCidr, ..Default::default() });
        let mut st = lenient_state(changes_for(&a));
        let mut plan = p.build(&st);
        let before = plan.clone();
        st.take_dirty();
        // Move from a to b through events: delete what b lacks, apply b's objects.
        for i in b.len()..a.len() {
            st.apply(Change::Deleted(kproxy_state::Kind::Service, kproxy_state::ObjectKey::new("ns", format!("svc-{i}"))));
            st.apply(Change::Deleted(kproxy_state::Kind::EndpointSlice, kproxy_state::ObjectKey::new("ns", format!("svc-{i}-1"))));
        }
        for c in changes_for(&b).into_iter().skip(1) {
            st.apply(c);
        }
        let dirty = st.take_dirty();
        let delta = p.update(&mut plan, &st, &dirty);
        prop_assert_eq!(&plan, &p.build(&st));
        let mut replay = before;
        replay.apply(&delta);
        prop_assert_eq!(replay, plan);
    }
}

#[test]
fn no_masquerade_sources_are_the_node_and_detectable_local_pods_only() {
    let cidrs = vec!["198.18.16.0/20".parse().unwrap(), "fd00:10::/32".parse().unwrap()];
    let detectable = ProxyPolicy {
        no_masquerade_cidrs: cidrs.clone(),
        detect_local: DetectLocal::ClusterCidr(vec!["198.18.16.0/20".parse().unwrap()]),
        ..Default::default()
    };
    let plan = planner(detectable).build(&state(basic_cluster()));
    let v4 = &plan.families[&IpFamily::V4].node;
    assert_eq!(v4.no_masquerade_sources(), [NoMasqueradeSource::Node, NoMasqueradeSource::LocalPods]);
    // No cluster CIDR of IPv6: IPv6 pod traffic is undetectable, so only the node is exempt.
    let v6 = &plan.families[&IpFamily::V6].node;
    assert_eq!(v6.snat.no_masquerade_cidrs, vec!["fd00:10::/32".parse::<IpNet>().unwrap()]);
    assert_eq!(v6.no_masquerade_sources(), [NoMasqueradeSource::Node]);

    let none = planner(ProxyPolicy { detect_local: DetectLocal::NodeCidr, ..Default::default() })
        .build(&state(basic_cluster()));
    assert!(none.families[&IpFamily::V4].node.no_masquerade_sources().is_empty());

    // masqueradeAll does not remove the exemption (the explicit list wins).
    let all = ProxyPolicy { no_masquerade_cidrs: cidrs, masquerade_all: true, ..Default::default() };
    let plan = planner(all).build(&state(basic_cluster()));
    assert_eq!(plan.families[&IpFamily::V4].node.no_masquerade_sources(), [NoMasqueradeSource::Node]);
}

#[test]
fn snat_to_node_ip_follows_node_ip_changes_and_prefers_bind_address() {
    let policy = ProxyPolicy { snat_to_node_ip: true, ..Default::default() };
    let p = planner(policy.clone());
    let mut st = state(vec![node(&["198.18.16.0/24"], &["198.18.0.2", "fd00:18::2"])]);
    let _ = st.take_dirty();
    let mut plan = p.build(&st);
    assert_eq!(plan.families[&IpFamily::V4].node.snat.source, SnatSource::NodeIp(ip("198.18.0.2")));
    assert_eq!(plan.families[&IpFamily::V6].node.snat.source_label(), "node-ip");

    // The InternalIP changes and the IPv6 one disappears.
    st.apply(node(&["198.18.16.0/24"], &["198.18.0.4"]));
    let dirty = st.take_dirty();
    let delta = p.update(&mut plan, &st, &dirty);
    let v4 = &plan.families[&IpFamily::V4].node.snat;
    let v6 = &plan.families[&IpFamily::V6].node.snat;
    assert_eq!(v4.source, SnatSource::NodeIp(ip("198.18.0.4")));
    assert_eq!((v6.source.clone(), v6.source_label()), (SnatSource::Masquerade, "masquerade-fallback"));
    assert!(delta.families[&IpFamily::V4].node.is_some(), "the new SNAT target must reach the dataplane");
    assert!(delta.families[&IpFamily::V6].node.is_some());

    // bindAddress overrides the Node's InternalIP of its family only.
    let ctx = NodeContext { name: NODE.into(), node_ip_override: vec![ip("198.18.0.9")], ..Default::default() };
    let plan = Planner::new(policy, ctx).build(&state(vec![node(&[], &["198.18.0.2", "fd00:18::2"])]));
    assert_eq!(plan.families[&IpFamily::V4].node.snat.source, SnatSource::NodeIp(ip("198.18.0.9")));
    assert_eq!(plan.families[&IpFamily::V6].node.snat.source, SnatSource::NodeIp(ip("fd00:18::2")));

    let off = planner(ProxyPolicy::default()).build(&st);
    assert_eq!(off.families[&IpFamily::V4].node.snat.source_label(), "masquerade");
}

#[test]
fn udp_ports_list_every_serving_endpoint_whatever_policy_topology_or_termination() {
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": "dns-1", "labels": {"kubernetes.io/service-name": "dns"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["198.18.16.5"], "nodeName": NODE, "conditions": {"ready": true}},
            {"addresses": ["198.18.17.5"], "nodeName": "node-b",
             "conditions": {"ready": false, "serving": true, "terminating": true}},
            {"addresses": ["198.18.18.5"], "nodeName": "node-b",
             "conditions": {"ready": false, "serving": false, "terminating": true}},
        ],
        "ports": [{"name": "", "port": 8053, "protocol": "UDP"}],
    }))
    .unwrap();
    let changes = vec![
        node(&["198.18.16.0/24"], &["198.18.0.2"]),
        service("dns", json!({"clusterIP": "198.18.128.10", "ports": [{"port": 53, "protocol": "UDP"}]})),
        Change::Applied(Object::EndpointSlice(Box::new(slice))),
    ];
    let plan = planner(ProxyPolicy::default()).build(&state(changes));
    let dns = only_port(&plan, IpFamily::V4, "dns");
    // The terminating endpoint is not used while a ready one exists, but its flows may drain.
    assert_eq!(dns.cluster_endpoints.iter().map(|e| e.ip).collect::<Vec<_>>(), [ip("198.18.16.5")]);
    let serving: Vec<SocketAddr> = ["198.18.16.5:8053", "198.18.17.5:8053"].map(|a| a.parse().unwrap()).into();
    assert_eq!(dns.serving_endpoints, serving);

    let web = only_port(&planner(ProxyPolicy::default()).build(&state(basic_cluster())), IpFamily::V4, "web");
    assert!(web.serving_endpoints.is_empty(), "TCP flows are never cleaned, so TCP ports carry none");
}

#[test]
fn new_local_addresses_are_resolved_by_the_next_plan() {
    let st = state(basic_cluster());
    let policy = ProxyPolicy {
        nodeport_addresses: vec![NodePortAddress::Cidr("192.0.2.0/24".parse().unwrap())],
        ..Default::default()
    };
    let mut planner = planner(policy);
    assert!(planner.set_local_addresses(vec![ip("192.0.2.7"), ip("198.18.0.2")]));
    assert!(!planner.set_local_addresses(vec![ip("198.18.0.2"), ip("192.0.2.7")]), "same set, other order");
    assert!(planner.set_local_addresses(vec![ip("192.0.2.9"), ip("192.0.2.7"), ip("198.18.0.2")]));
    let plan = planner.build(&st);
    assert_eq!(
        plan.families[&IpFamily::V4].node.nodeport_addresses,
        NodePortAddresses::Only(vec![ip("192.0.2.7"), ip("192.0.2.9")])
    );
}

#[test]
fn only_addresses_that_node_port_addresses_select_change_the_plan_and_only_its_node_part() {
    let st = state(basic_cluster());
    let policy = ProxyPolicy {
        nodeport_addresses: vec![NodePortAddress::Cidr("192.0.2.0/24".parse().unwrap()), NodePortAddress::Primary],
        ..Default::default()
    };
    let mut planner = planner(policy);
    planner.set_local_addresses(vec![ip("192.0.2.7"), ip("198.18.0.2")]);
    let mut plan = planner.build(&st);

    // A pod's veth (link-local, both families) and an address outside the CIDR.
    assert!(planner.set_local_addresses(vec![
        ip("192.0.2.7"),
        ip("198.18.0.2"),
        ip("169.254.3.1"),
        ip("fe80::1"),
        ip("203.0.113.9")
    ]));
    assert_eq!(planner.node_addresses_delta(&plan), PlanDelta::default(), "nothing the plan depends on");

    // An address inside the CIDR: the IPv4 node-port addresses, nothing else.
    planner.set_local_addresses(vec![ip("192.0.2.7"), ip("192.0.2.9"), ip("198.18.0.2"), ip("fe80::1")]);
    let delta = planner.node_addresses_delta(&plan);
    assert_eq!(delta.families.keys().copied().collect::<Vec<_>>(), [IpFamily::V4]);
    let v4 = &delta.families[&IpFamily::V4];
    assert!(v4.added.is_empty() && v4.changed.is_empty() && v4.removed.is_empty(), "no service port: {v4:?}");
    assert_eq!(
        v4.node.as_ref().map(|n| n.nodeport_addresses.clone()),
        Some(NodePortAddresses::Only(vec![ip("192.0.2.7"), ip("192.0.2.9"), ip("198.18.0.2")])),
        "the CIDR's addresses and the primary node IP"
    );
    plan.apply(&delta);
    assert_eq!(plan, planner.build(&st), "the delta applied is the plan built anew");
}

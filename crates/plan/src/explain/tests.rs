//! Explain, case by case, on plans the planner builds from cluster objects.

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kproxy_state::{Change, ClusterState, Object};
use serde_json::{Value, json};

use super::*;
use crate::planner::Planner;
use crate::policy::{DetectLocal, NodeContext, ProxyPolicy};

const NODE: &str = "node-a";
const NODE_IP: &str = "198.18.0.2";
const CIP: &str = "198.18.128.10:80";
/// Local pod CIDR (detect-local ClusterCIDR covers 198.18.16.0/20).
const LOCAL_EP: &str = "198.18.16.5";
const REMOTE_EP: &str = "198.18.17.5";
const LOCAL_CLIENT: &str = "198.18.16.9";
const EXTERNAL_CLIENT: &str = "203.0.113.77";

fn service(name: &str, spec: Value, status: Value, annotations: Value) -> Change {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": name, "annotations": annotations},
        "spec": spec,
        "status": status,
    }))
    .unwrap();
    Change::Applied(Object::Service(Box::new(svc.into())))
}

/// A slice of port "http" TCP 8080, endpoints as (ip, node, flags: r ready, s serving, t terminating).
fn slice(svc: &str, endpoints: &[(&str, &str, &str)]) -> Change {
    let eps: Vec<Value> = endpoints
        .iter()
        .map(|(ip, node, flags)| {
            json!({"addresses": [ip], "nodeName": node, "conditions": {
                "ready": flags.contains('r'),
                "serving": flags.contains('r') || flags.contains('s'),
                "terminating": flags.contains('t'),
            }})
        })
        .collect();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": format!("{svc}-1"), "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap();
    Change::Applied(Object::EndpointSlice(Box::new(slice)))
}

fn node() -> Change {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": NODE},
        "spec": {"podCIDRs": ["198.18.16.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]},
    }))
    .unwrap();
    Change::Applied(Object::Node(Box::new(node)))
}

/// `web` at 198.18.128.10:80 (port "http" → 8080) with `spec` merged in.
fn web(spec: Value, status: Value, endpoints: &[(&str, &str, &str)]) -> Vec<Change> {
    let mut base = json!({"clusterIP": "198.18.128.10", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
    if let (Some(b), Value::Object(extra)) = (base.as_object_mut(), spec) {
        b.extend(extra);
    }
    let mut changes = vec![node(), service("web", base, status, json!({}))];
    if !endpoints.is_empty() {
        changes.push(slice("web", endpoints));
    }
    changes
}

fn both() -> [(&'static str, &'static str, &'static str); 2] {
    [(LOCAL_EP, NODE, "r"), (REMOTE_EP, "node-b", "r")]
}

fn cluster_cidr() -> ProxyPolicy {
    ProxyPolicy {
        detect_local: DetectLocal::ClusterCidr(vec!["198.18.16.0/20".parse().unwrap()]),
        ..ProxyPolicy::default()
    }
}

fn plan(policy: ProxyPolicy, changes: Vec<Change>) -> Plan {
    let mut state = ClusterState::new();
    for change in changes {
        let outcome = state.apply(change);
        assert!(outcome.rejected.is_empty(), "{:?}", outcome.rejected);
    }
    Planner::new(policy, NodeContext { name: NODE.into(), ..Default::default() }).build(&state)
}

fn ask(plan: &Plan, from: &str, to: &str) -> Explanation {
    let packet = Packet { from: from.parse().unwrap(), to: to.parse().unwrap(), protocol: Protocol::Tcp };
    explain(plan, &Host::default(), &packet)
}

fn addresses(e: &Explanation) -> Vec<String> {
    e.endpoints.iter().map(|ep| ep.address.to_string()).collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn clusterip_from_a_remote_source_goes_to_every_endpoint_evenly_masqueraded() {
    let p = plan(cluster_cidr(), web(json!({}), json!({}), &both()));
    let e = ask(&p, EXTERNAL_CLIENT, CIP);
    assert_eq!(e.service.as_deref(), Some("ns/web:http"));
    assert_eq!(e.destination, Some(DestinationKind::ClusterIp));
    assert_eq!(e.verdict, Verdict::Dnat);
    assert_eq!(addresses(&e), ["198.18.16.5:8080", "198.18.17.5:8080"]);
    assert!(e.endpoints.iter().all(|ep| ep.probability == 0.5));
    assert!(e.masquerade);
    assert!(e.endpoints.iter().all(|ep| ep.masquerade_reason == SnatReason::NotFromLocalPod));
    assert_eq!(e.source_seen, Some(ip(NODE_IP)));
    assert!(!e.endpoints[0].source_seen_certain, "MASQUERADE picks the egress interface's address");
}

#[test]
fn clusterip_from_a_local_pod_keeps_its_source() {
    let p = plan(cluster_cidr(), web(json!({}), json!({}), &both()));
    let e = ask(&p, LOCAL_CLIENT, CIP);
    assert_eq!(e.source, SourceKind::LocalPod);
    assert!(!e.masquerade);
    assert_eq!(e.source_seen, Some(ip(LOCAL_CLIENT)));
    assert!(e.endpoints.iter().all(|ep| ep.masquerade_reason == SnatReason::FromLocalPod));
}

#[test]
fn clusterip_from_the_node_is_masqueraded_and_without_detect_local_nothing_is() {
    let p = plan(cluster_cidr(), web(json!({}), json!({}), &both()));
    let e = ask(&p, NODE_IP, CIP);
    assert_eq!(e.source, SourceKind::Node);
    assert!(e.masquerade);
    let undetectable = plan(ProxyPolicy::default(), web(json!({}), json!({}), &both()));
    let e = ask(&undetectable, EXTERNAL_CLIENT, CIP);
    assert!(!e.masquerade);
    assert_eq!(e.endpoints[0].masquerade_reason, SnatReason::PodTrafficUndetectable);
}

#[test]
fn hairpin_masquerades_only_the_way_back_to_the_client_itself() {
    let p = plan(cluster_cidr(), web(json!({}), json!({}), &both()));
    let e = ask(&p, LOCAL_EP, CIP);
    let to_self = e.endpoints.iter().find(|ep| ep.address.ip() == ip(LOCAL_EP)).unwrap();
    let to_other = e.endpoints.iter().find(|ep| ep.address.ip() == ip(REMOTE_EP)).unwrap();
    assert_eq!((to_self.masquerade, &to_self.masquerade_reason), (true, &SnatReason::Hairpin));
    assert_eq!((to_other.masquerade, &to_other.masquerade_reason), (false, &SnatReason::FromLocalPod));
    assert!(e.masquerade, "masqueraded to at least one endpoint");
    assert_eq!(e.source_seen, None, "the endpoints see different sources");
}

#[test]
fn an_endpoint_on_another_node_is_never_hairpin_here() {
    // Its own node's proxy translates its connections; should one arrive here untranslated
    // (routed in from outside), it is judged as any other source, as the kernel does.
    let p = plan(cluster_cidr(), web(json!({}), json!({}), &both()));
    let e = ask(&p, REMOTE_EP, CIP);
    let to_itself = e.endpoints.iter().find(|ep| ep.address.ip() == ip(REMOTE_EP)).unwrap();
    assert_ne!(to_itself.masquerade_reason, SnatReason::Hairpin, "{e:?}");
    let local = ask(&p, LOCAL_EP, CIP);
    let to_itself = local.endpoints.iter().find(|ep| ep.address.ip() == ip(LOCAL_EP)).unwrap();
    assert_eq!(to_itself.masquerade_reason, SnatReason::Hairpin, "{local:?}");
}

#[test]
fn masquerade_all_marks_everything_and_no_masquerade_cidrs_exempt_only_node_and_local_pods() {
    let policy = ProxyPolicy {
        masquerade_all: true,
        no_masquerade_cidrs: vec!["198.18.16.0/20".parse().unwrap()],
        ..cluster_cidr()
    };
    let p = plan(policy, web(json!({}), json!({}), &both()));
    for from in [LOCAL_CLIENT, NODE_IP] {
        let e = ask(&p, from, CIP);
        assert!(!e.masquerade, "{from}: {e:?}");
        assert!(
            e.endpoints
                .iter()
                .all(|ep| ep.masquerade_reason
                    == SnatReason::NoMasqueradeCidr { cidr: "198.18.16.0/20".parse().unwrap() })
        );
    }
    let e = ask(&p, EXTERNAL_CLIENT, CIP);
    assert!(e.masquerade);
    assert!(e.endpoints.iter().all(|ep| ep.masquerade_reason == SnatReason::MasqueradeAll));
    // Loopback is never exempt: it can not leave the node.
    let e = ask(&p, "127.0.0.1", CIP);
    assert!(e.masquerade);
}

#[test]
fn snat_to_node_ip_makes_the_seen_source_certain() {
    let policy = ProxyPolicy { snat_to_node_ip: true, ..cluster_cidr() };
    let p = plan(policy, web(json!({}), json!({}), &both()));
    let e = ask(&p, EXTERNAL_CLIENT, CIP);
    assert_eq!(e.source_seen, Some(ip(NODE_IP)));
    assert!(e.endpoints.iter().all(|ep| ep.source_seen_certain));
}

#[test]
fn no_endpoints_rejects_and_internal_local_without_local_endpoints_drops() {
    let p = plan(cluster_cidr(), web(json!({}), json!({}), &[]));
    let e = ask(&p, EXTERNAL_CLIENT, CIP);
    assert_eq!((e.verdict, e.endpoints.len(), e.source_seen), (Verdict::Reject, 0, None));
    let p =
        plan(cluster_cidr(), web(json!({"internalTrafficPolicy": "Local"}), json!({}), &[(REMOTE_EP, "node-b", "r")]));
    assert_eq!(ask(&p, LOCAL_CLIENT, CIP).verdict, Verdict::Drop);
    let p = plan(cluster_cidr(), web(json!({"internalTrafficPolicy": "Local"}), json!({}), &both()));
    let e = ask(&p, LOCAL_CLIENT, CIP);
    assert_eq!(addresses(&e), ["198.18.16.5:8080"]);
    assert_eq!(e.endpoints[0].probability, 1.0);
}

#[test]
fn terminating_endpoints_are_the_fallback_when_none_is_ready() {
    let p = plan(cluster_cidr(), web(json!({}), json!({}), &[(LOCAL_EP, NODE, "st"), (REMOTE_EP, "node-b", "")]));
    let e = ask(&p, EXTERNAL_CLIENT, CIP);
    assert_eq!(addresses(&e), ["198.18.16.5:8080"]);
    assert!(!e.endpoints[0].ready);
    assert!(e.reason.contains("terminating"), "{}", e.reason);
}

#[test]
fn nodeport_is_served_on_the_node_ip_only_and_masqueraded_under_cluster_policy() {
    let spec =
        json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]});
    let p = plan(cluster_cidr(), web(spec, json!({}), &both()));
    let e = ask(&p, EXTERNAL_CLIENT, "198.18.0.2:30080");
    assert_eq!((e.destination, e.verdict), (Some(DestinationKind::NodePort), Verdict::Dnat));
    assert_eq!(addresses(&e).len(), 2);
    assert!(e.endpoints.iter().all(|ep| ep.masquerade_reason == SnatReason::ExternalCluster));
    let elsewhere = ask(&p, EXTERNAL_CLIENT, "198.18.0.3:30080");
    assert_eq!((elsewhere.verdict, elsewhere.service), (Verdict::None, None));
}

#[test]
fn external_policy_local_keeps_the_client_and_short_circuits_the_node_and_local_pods() {
    let spec = json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000,
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]});
    let status = json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}});
    let p = plan(cluster_cidr(), web(spec.clone(), status.clone(), &both()));

    let e = ask(&p, EXTERNAL_CLIENT, "203.0.113.10:80");
    assert_eq!(e.destination, Some(DestinationKind::LoadBalancerIp));
    assert_eq!(addresses(&e), ["198.18.16.5:8080"]);
    assert!(!e.masquerade);
    assert_eq!(e.source_seen, Some(ip(EXTERNAL_CLIENT)));
    assert_eq!(e.endpoints[0].masquerade_reason, SnatReason::ExternalLocal);

    let e = ask(&p, NODE_IP, "198.18.0.2:30080");
    assert_eq!(addresses(&e).len(), 2, "the node goes to every endpoint");
    assert!(e.endpoints.iter().all(|ep| ep.masquerade_reason == SnatReason::NodeToExternalLocal));

    let e = ask(&p, LOCAL_CLIENT, "203.0.113.10:80");
    assert_eq!(addresses(&e).len(), 2, "local pods go to every endpoint");
    assert!(!e.masquerade);
    assert_eq!(e.endpoints[0].masquerade_reason, SnatReason::LocalPodShortCircuit);

    let remote_only = plan(cluster_cidr(), web(spec, status, &[(REMOTE_EP, "node-b", "r")]));
    assert_eq!(ask(&remote_only, EXTERNAL_CLIENT, "203.0.113.10:80").verdict, Verdict::Drop);
    assert_eq!(ask(&remote_only, LOCAL_CLIENT, "203.0.113.10:80").verdict, Verdict::Dnat);
}

#[test]
fn load_balancer_source_ranges_drop_other_sources_before_anything_else() {
    let spec = json!({"type": "LoadBalancer", "loadBalancerSourceRanges": ["203.0.113.0/28"],
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]});
    let status = json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}});
    let p = plan(cluster_cidr(), web(spec, status, &both()));
    let e = ask(&p, EXTERNAL_CLIENT, "203.0.113.10:80");
    assert_eq!(e.verdict, Verdict::Drop);
    assert_eq!(e.source_ranges.as_ref().map(|r| r.source_allowed), Some(false));
    let e = ask(&p, "203.0.113.5", "203.0.113.10:80");
    assert_eq!(e.verdict, Verdict::Dnat);
    assert_eq!(e.source_ranges.as_ref().map(|r| r.source_allowed), Some(true));
    // The NodePort of the same service has no firewall.
    assert_eq!(ask(&p, EXTERNAL_CLIENT, "198.18.0.2:30080").verdict, Verdict::Dnat);
}

#[test]
fn external_ips_affinity_and_acceleration_are_reported() {
    let changes = vec![
        node(),
        service(
            "web",
            json!({"clusterIP": "198.18.128.10", "externalIPs": ["203.0.113.20"], "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
            json!({}),
            json!({"service.kproxy.io/traffic-hint": "LongLived"}),
        ),
        slice("web", &both()),
    ];
    let p = plan(cluster_cidr(), changes);
    let e = ask(&p, EXTERNAL_CLIENT, "203.0.113.20:80");
    assert_eq!(e.destination, Some(DestinationKind::ExternalIp));
    assert_eq!(e.affinity_timeout_seconds, Some(60));
    assert!(e.acceleration_eligible);
    let plain = plan(cluster_cidr(), web(json!({}), json!({}), &both()));
    assert!(!ask(&plain, EXTERNAL_CLIENT, CIP).acceleration_eligible);
}

#[test]
fn unknown_ports_of_a_cluster_ip_reject_and_unallocated_service_cidr_addresses_drop() {
    let mut p = plan(cluster_cidr(), web(json!({}), json!({}), &both()));
    assert_eq!(ask(&p, EXTERNAL_CLIENT, "198.18.128.10:81").verdict, Verdict::Reject);
    assert_eq!(ask(&p, EXTERNAL_CLIENT, "198.18.128.11:80").verdict, Verdict::None);
    let v4 = p.families.get_mut(&IpFamily::V4).unwrap();
    v4.node.service_cidrs = vec!["198.18.128.0/20".parse().unwrap()];
    assert_eq!(ask(&p, EXTERNAL_CLIENT, "198.18.128.11:80").verdict, Verdict::Drop);
    assert_eq!(ask(&p, EXTERNAL_CLIENT, "192.0.2.1:80").verdict, Verdict::None);
}

#[test]
fn protocol_must_match_the_service_port() {
    let p = plan(cluster_cidr(), web(json!({}), json!({}), &both()));
    let packet = Packet { from: ip(EXTERNAL_CLIENT), to: CIP.parse().unwrap(), protocol: Protocol::Udp };
    assert_eq!(explain(&p, &Host::default(), &packet).verdict, Verdict::Reject);
}

#[test]
fn json_has_the_documented_fields() {
    let p = plan(cluster_cidr(), web(json!({}), json!({}), &both()));
    let e = ask(&p, EXTERNAL_CLIENT, CIP);
    let v = serde_json::to_value(&e).unwrap();
    assert_eq!(serde_json::from_value::<Explanation>(v.clone()).unwrap(), e, "clients read back what was sent");
    assert_eq!(v["service"], "ns/web:http");
    assert_eq!(v["verdict"], "dnat");
    assert_eq!(v["endpoints"][0]["address"], "198.18.16.5:8080");
    assert_eq!(v["endpoints"][0]["probability"], 0.5);
    assert_eq!(v["masquerade"], true);
    assert_eq!(v["source_seen"], NODE_IP);
    assert!(v["reason"].as_str().is_some_and(|r| !r.is_empty()));
    let none = serde_json::to_value(ask(&p, EXTERNAL_CLIENT, "192.0.2.1:80")).unwrap();
    assert_eq!(
        (&none["service"], &none["verdict"], &none["source_seen"]),
        (&Value::Null, &json!("none"), &Value::Null)
    );
}

fn observed(answered_by: &[&str], seen: &[&str], probes: usize, answered: usize, timed_out: usize) -> Observed {
    Observed {
        probes,
        answered,
        answered_by: answered_by.iter().map(|a| ip(a)).collect(),
        seen_sources: seen.iter().map(|a| ip(a)).collect(),
        refused: probes - answered - timed_out,
        timed_out,
    }
}

#[test]
fn agreement_holds_only_for_predicted_endpoints_sources_and_verdicts() {
    let p = plan(cluster_cidr(), web(json!({}), json!({}), &both()));
    let e = ask(&p, LOCAL_CLIENT, CIP);
    let strict = Strictness { silent: Default::default(), expect_coverage: true };
    let client = ip(LOCAL_CLIENT);
    assert_eq!(e.agrees_with(client, &observed(&[LOCAL_EP, REMOTE_EP], &[LOCAL_CLIENT], 6, 6, 0), &strict), Ok(()));
    assert!(e.agrees_with(client, &observed(&[LOCAL_EP], &[LOCAL_CLIENT], 6, 6, 0), &strict).is_err(), "coverage");
    assert!(e.agrees_with(client, &observed(&[LOCAL_EP, "198.18.17.99"], &[LOCAL_CLIENT], 6, 6, 0), &strict).is_err());
    assert!(e.agrees_with(client, &observed(&[LOCAL_EP, REMOTE_EP], &[NODE_IP], 6, 6, 0), &strict).is_err(), "source");
    assert!(e.agrees_with(client, &observed(&[LOCAL_EP, REMOTE_EP], &[LOCAL_CLIENT], 6, 4, 2), &strict).is_err());
    // A silent endpoint (a node nobody hosts) explains timeouts and is not expected to answer.
    let silent = Strictness { silent: [ip(REMOTE_EP)].into(), expect_coverage: true };
    assert_eq!(e.agrees_with(client, &observed(&[LOCAL_EP], &[LOCAL_CLIENT], 6, 3, 3), &silent), Ok(()));

    let masqueraded = ask(&p, EXTERNAL_CLIENT, CIP);
    let from = ip(EXTERNAL_CLIENT);
    let ok = observed(&[LOCAL_EP, REMOTE_EP], &[NODE_IP, "198.18.16.1"], 6, 6, 0);
    assert_eq!(masqueraded.agrees_with(from, &ok, &strict), Ok(()), "MASQUERADE may pick any egress address");
    let leaked = observed(&[LOCAL_EP, REMOTE_EP], &[EXTERNAL_CLIENT], 6, 6, 0);
    assert!(masqueraded.agrees_with(from, &leaked, &strict).is_err());

    let rejected = ask(&plan(cluster_cidr(), web(json!({}), json!({}), &[])), EXTERNAL_CLIENT, CIP);
    assert_eq!(rejected.agrees_with(from, &observed(&[], &[], 6, 0, 0), &strict), Ok(()));
    assert!(rejected.agrees_with(from, &observed(&[], &[], 6, 0, 6), &strict).is_err(), "timed out is no reject");
}

#[test]
fn masquerade_on_a_node_without_a_known_ip_says_the_source_is_unknown() {
    let mut changes = web(json!({}), json!({}), &both());
    changes.remove(0); // no Node object: its IP is unknown
    let p = plan(cluster_cidr(), changes);
    let e = ask(&p, EXTERNAL_CLIENT, CIP);
    assert!(e.masquerade);
    assert_eq!(e.source_seen, None);
    assert!(e.endpoints.iter().all(|ep| ep.source_seen.is_none() && !ep.source_seen_certain));
}

#[test]
fn a_bounded_answer_lists_at_most_the_limit_and_counts_the_rest() {
    let endpoint = |i: usize| crate::explain::Endpoint {
        address: std::net::SocketAddr::from(([198, 18, 16, (i % 250) as u8], 8080)),
        probability: 1.0,
        local: true,
        ready: true,
        masquerade: false,
        masquerade_reason: crate::explain::SnatReason::Hairpin,
        source_seen: None,
        source_seen_certain: false,
    };
    let mut e = crate::explain::Explanation::untouched(crate::explain::SourceKind::Remote, String::new());
    e.endpoints = (0..250).map(endpoint).collect();
    let bounded = e.clone().bounded();
    assert_eq!(bounded.endpoints.len(), crate::explain::Explanation::MAX_LISTED_ENDPOINTS);
    assert_eq!(bounded.endpoints_omitted, 150);
    assert_eq!(bounded.endpoints[..], e.endpoints[..100]);
    let json = serde_json::to_value(&bounded).unwrap();
    assert_eq!(json["endpoints_omitted"], 150);
    let small = crate::explain::Explanation::untouched(crate::explain::SourceKind::Remote, String::new()).bounded();
    assert!(
        serde_json::to_value(&small).unwrap().get("endpoints_omitted").is_none(),
        "absent when nothing is left out"
    );
}

/// Under `nodePortAddresses: all`, IPVS mode (the addresses listed: an address service on each)
/// serves a NodePort on the addresses it planned for alone; a mode matching any local address
/// by rule serves it on every local address the host has.
#[test]
fn nodeport_under_all_addresses_is_served_where_the_mode_serves_it() {
    let spec =
        json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]});
    let mut state = ClusterState::new();
    for change in web(spec, json!({}), &both()) {
        state.apply(change);
    }
    let host = Host { local_addresses: vec![ip(NODE_IP), ip("198.18.0.9")], ..Host::default() };
    let packet = |to: &str| Packet { from: ip(EXTERNAL_CLIENT), to: to.parse().unwrap(), protocol: Protocol::Tcp };
    for listed in [true, false] {
        let policy = ProxyPolicy {
            nodeport_addresses: vec![crate::policy::NodePortAddress::All],
            list_local_addresses: listed,
            ..cluster_cidr()
        };
        let node = NodeContext { name: NODE.into(), local_addresses: vec![ip(NODE_IP)], ..Default::default() };
        let p = Planner::new(policy, node).build(&state);
        let served = |to: &str| explain(&p, &host, &packet(to)).destination == Some(DestinationKind::NodePort);
        assert!(served("198.18.0.2:30080"), "listed {listed}");
        assert_eq!(served("198.18.0.9:30080"), !listed, "an address the listing did not have");
    }
}

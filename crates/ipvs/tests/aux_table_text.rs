//! The auxiliary table's transactions mean the same over netlink (how [`kproxy_ipvs::KernelHost`]
//! applies them) and as `nft -f` text (their rendering, for people and `--dry-run`): a cold
//! start and a partial sync are applied both ways, each in its own network namespace, and the
//! two `nft -j list ruleset` listings must be identical. Needs no IPVS (the transactions come
//! from the in-memory host), so it runs on the development kernel.

#![allow(clippy::unwrap_used)]

mod fake_world;

use fake_world::World;
use kproxy_ipvs::{Config, FakeHost, IpvsDataplane};
use kproxy_nft_model::{Executor, NftCommand, Transaction};
use kproxy_nft_netlink::NetlinkExecutor;
use kproxy_packet_suite::{NODE_A, NODE_B, service, slice};
use kproxy_plan::{DetectLocal, Plan, PlanDelta, ProxyPolicy};
use kproxy_state::{IpFamily, Object, Protocol};
use kproxy_testbed::Netns;
use kproxy_testbed::kernel::require_root;
use serde_json::{Value, json};

/// A dual-stack service `name` with one TCP and one UDP port and endpoints on both nodes;
/// `extra` is merged into its spec.
fn svc(name: &str, ips: [&str; 2], endpoints: [[&str; 2]; 2], extra: Value) -> Vec<Object> {
    let mut spec = json!({"clusterIP": ips[0], "clusterIPs": ips, "ipFamilies": ["IPv4", "IPv6"],
        "ipFamilyPolicy": "RequireDualStack",
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                  {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]});
    if let (Some(s), Value::Object(e)) = (spec.as_object_mut(), extra) {
        s.extend(e);
    }
    let ports =
        json!([{"name": "http", "protocol": "TCP", "port": 8080}, {"name": "dns", "protocol": "UDP", "port": 5353}]);
    let eps = |family: usize| {
        [NODE_A, NODE_B]
            .iter()
            .zip(endpoints[family])
            .map(|(node, ip)| json!({"addresses": [ip], "nodeName": node, "conditions": {"ready": true}}))
            .collect()
    };
    vec![
        service("default", name, spec, json!({})),
        slice("default", name, "v4", "IPv4", ports.clone(), eps(0)),
        slice("default", name, "v6", "IPv6", ports, eps(1)),
    ]
}

/// Every shape of service the auxiliary table has elements for: ClusterIP only, NodePort
/// (marks), a LoadBalancer with `externalTrafficPolicy: Local` (short-circuit marks) and
/// source ranges (the firewall's interval set), and no endpoints (the reject verdicts).
fn cluster() -> Vec<Object> {
    let mut o = svc(
        "web",
        ["198.18.128.10", "fd00:96::10"],
        [["198.18.16.10", "198.18.17.10"], ["fd00:16::a", "fd00:17::a"]],
        json!({}),
    );
    o.extend(svc(
        "np",
        ["198.18.128.11", "fd00:96::11"],
        [["198.18.16.11", "198.18.17.11"], ["fd00:16::b", "fd00:17::b"]],
        json!({"type": "NodePort"}),
    ));
    o.extend(svc(
        "lb",
        ["198.18.128.12", "fd00:96::12"],
        [["198.18.16.12", "198.18.17.12"], ["fd00:16::c", "fd00:17::c"]],
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
               "externalIPs": ["203.0.113.12"],
               "loadBalancerSourceRanges": ["192.0.2.0/24", "198.51.100.0/25", "fd00:99::/64"]}),
    ));
    o
}

/// The dual-stack cluster of these tests, with `objects`.
fn dual_stack_world(objects: Vec<Object>) -> World {
    let policy = ProxyPolicy {
        families: vec![IpFamily::V4, IpFamily::V6],
        detect_local: DetectLocal::ClusterCidr(vec![
            "198.18.16.0/20".parse().unwrap(),
            "fd00:16::/48".parse().unwrap(),
        ]),
        no_masquerade_cidrs: vec!["198.19.0.0/16".parse().unwrap()],
        ..ProxyPolicy::default()
    };
    World::with_policy(policy, objects)
}

/// The auxiliary table's transactions of a cold start, then of a partial sync after which the
/// NodePort service lost its endpoints and the LoadBalancer moved its endpoints.
fn transactions() -> Vec<Transaction> {
    let mut world = dual_stack_world(cluster());
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&world.plan, &PlanDelta::between(&Plan::default(), &world.plan)).unwrap();
    let mut changed = svc(
        "np",
        ["198.18.128.11", "fd00:96::11"],
        [["198.18.16.11", "198.18.17.11"], ["fd00:16::b", "fd00:17::b"]],
        json!({"type": "NodePort"}),
    );
    changed.truncate(1);
    changed.push(slice("default", "np", "v4", "IPv4", json!([]), vec![]));
    changed.push(slice("default", "np", "v6", "IPv6", json!([]), vec![]));
    changed.extend(svc(
        "lb",
        ["198.18.128.12", "fd00:96::12"],
        [["198.18.17.12", "198.18.16.13"], ["fd00:17::c", "fd00:16::d"]],
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Cluster", "externalIPs": ["203.0.113.12"]}),
    ));
    let delta = world.apply(changed);
    dp.sync(&world.plan, &delta).unwrap();
    dp.host().nft.clone()
}

/// The namespace's ruleset, comparable (see [`kproxy_testbed::nft_listing`]).
fn listing(ns: &Netns) -> Value {
    kproxy_testbed::nft_listing(ns).unwrap()
}

fn apply_all<E: Executor>(exec: &mut E, txs: &[Transaction]) {
    for tx in txs {
        exec.apply(tx).unwrap_or_else(|e| panic!("{e}\n{tx}"));
    }
}

#[test]
fn the_auxiliary_table_lists_the_same_over_netlink_and_as_nft_text() {
    if !require_root() {
        return;
    }
    let txs = transactions();
    assert_eq!(txs.len(), 2, "a cold start and a partial sync");
    let text = txs[0].render();
    // The statements only this table uses are all in the cold start.
    for needle in
        ["meta mark set", "ct mark set ct mark or", "ct mark and", "meta l4proto { tcp, udp, sctp }", ": mark;"]
    {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
    assert!(!txs[1].is_empty() && txs[1].render().contains("delete element"), "{}", txs[1]);

    let over_netlink = Netns::new("auxnl").unwrap();
    let as_text = Netns::new("auxtext").unwrap();
    over_netlink.run_in(|| apply_all(&mut NetlinkExecutor::new(), &txs)).unwrap();
    as_text.run_in(|| apply_all(&mut NftCommand::new(), &txs)).unwrap();
    let (a, b) = (listing(&over_netlink), listing(&as_text));
    let listed = a.to_string();
    assert!(listed.contains("kproxy-ipvs") && listed.contains("fd00:96::12"), "{listed}");
    assert!(listed.contains("\"mark\""), "the mark maps are listed: {listed}");
    assert_eq!(serde_json::to_string_pretty(&a).unwrap(), serde_json::to_string_pretty(&b).unwrap());
}

/// `obj` (a Service) opted in to acceleration, as `spec.trafficHint: LongLived` says.
fn opted_in(mut objects: Vec<Object>) -> Vec<Object> {
    if let Some(Object::Service(s)) = objects.first_mut() {
        s.traffic_hint = Some("LongLived".to_owned());
    }
    objects
}

/// One IPv4 TCP port 80 → 8080 service `name` at `ip` with endpoints `eps` (address, node);
/// `extra` is merged into its spec.
fn svc4(name: &str, ip: &str, eps: &[(&str, &str)], extra: Value) -> Vec<Object> {
    let mut spec = json!({"clusterIP": ip, "clusterIPs": [ip],
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]});
    if let (Some(s), Value::Object(e)) = (spec.as_object_mut(), extra) {
        s.extend(e);
    }
    let endpoints = eps
        .iter()
        .map(|(ip, node)| json!({"addresses": [ip], "nodeName": node, "conditions": {"ready": true}}))
        .collect();
    let ports = json!([{"name": "http", "protocol": "TCP", "port": 8080}]);
    vec![service("default", name, spec, json!({})), slice("default", name, "v4", "IPv4", ports, endpoints)]
}

/// An opted-in NodePort service, an opted-in `externalTrafficPolicy: Local` service with an
/// external IP and no local endpoint, an opted-in service with ClientIP affinity, and a
/// NodePort service without the hint.
fn accel_cluster() -> Vec<Object> {
    let mut o = opted_in(svc4(
        "fast",
        "198.18.128.20",
        &[("198.18.16.20", NODE_A), ("198.18.17.20", NODE_B), ("198.18.17.21", NODE_B)],
        json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30020}]}),
    ));
    o.extend(opted_in(svc4(
        "edge",
        "198.18.128.22",
        &[("198.18.17.22", NODE_B)],
        json!({"type": "NodePort", "externalTrafficPolicy": "Local", "externalIPs": ["203.0.113.22"],
               "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30022}]}),
    )));
    o.extend(opted_in(svc4(
        "sticky",
        "198.18.128.23",
        &[("198.18.17.23", NODE_B)],
        json!({"sessionAffinity": "ClientIP"}),
    )));
    o.extend(svc4(
        "slow",
        "198.18.128.21",
        &[("198.18.17.24", NODE_B)],
        json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30021}]}),
    ));
    o
}

/// The rules of `chain` in a transaction's text.
fn rules_of(text: &str, chain: &str) -> Vec<String> {
    let prefix = format!("add rule ip kproxy-ipvs {chain} ");
    text.lines().filter_map(|l| l.strip_prefix(&prefix)).map(str::to_owned).collect()
}

/// The opted-in service ports are DNATed by the auxiliary table ahead of IPVS, with the
/// nftables dataplane's endpoint pick; the others (no hint, or ClientIP affinity) are IPVS's
/// alone; every virtual service stays in IPVS.
#[test]
fn opted_in_services_are_dnated_in_the_auxiliary_table_ahead_of_ipvs() {
    let world = World::new(accel_cluster());
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&world.plan, &PlanDelta::between(&Plan::default(), &world.plan)).unwrap();
    let text = dp.host().nft[0].render();
    for chain in [
        "accel-prerouting { type nat hook prerouting priority -100; policy accept; }",
        "accel-output { type nat hook output priority -100; policy accept; }",
    ] {
        assert!(text.contains(&format!("add chain ip kproxy-ipvs {chain}")), "{chain} missing:\n{text}");
    }
    let dest = "ip daddr . meta l4proto . th dport";
    let np = "ip daddr @nodeport-ips meta l4proto . th dport";
    assert_eq!(
        rules_of(&text, "accel-prerouting"),
        [
            format!("{dest} @firewall-dests {dest} . ip saddr != @firewall-allow return"),
            format!("ip saddr @pod-cidrs {dest} @accel-external-local goto pick-cluster-address"),
            format!("ip saddr @pod-cidrs {np} @accel-nodeports-local goto pick-cluster-nodeport"),
            format!("{dest} @accel-cluster goto pick-cluster-address"),
            format!("{dest} @accel-local goto pick-local-address"),
            format!("{dest} @accel-external-local goto pick-local-address"),
            format!("{np} @accel-nodeports goto pick-cluster-nodeport"),
            format!("{np} @accel-nodeports-local goto pick-local-nodeport"),
        ]
    );
    // The node's connections to Local-policy external destinations go to the cluster endpoints.
    assert_eq!(
        rules_of(&text, "accel-output"),
        [
            format!("{dest} @accel-cluster goto pick-cluster-address"),
            format!("{dest} @accel-local goto pick-local-address"),
            format!("{dest} @accel-external-local goto pick-cluster-address"),
            format!("{np} @accel-nodeports goto pick-cluster-nodeport"),
            format!("{np} @accel-nodeports-local goto pick-cluster-nodeport"),
        ]
    );
    assert_eq!(rules_of(&text, "pick-cluster-address")[2], format!("{dest} @cluster-cap-4 goto pick-cluster-4"));
    // ... and pass the no-endpoint check (this node has no local endpoint of `edge`), as the
    // short-circuit marks let other services' connections through.
    let checks = rules_of(&text, "service-checks");
    let accept = checks.iter().position(|r| r.contains("@accel-external-local accept")).unwrap();
    assert!(checks[accept].starts_with("fib saddr type local "), "{checks:#?}");
    assert!(accept < checks.iter().position(|r| r.contains("@no-endpoint-services")).unwrap(), "{checks:#?}");
    assert!(checks[0].contains("@firewall-dests"), "the firewall still comes first: {checks:#?}");

    let elements: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("add element ip kproxy-ipvs ")).collect();
    for wanted in [
        // fast: ClusterIP and NodePort, three endpoints picked among four slots.
        "accel-cluster { 198.18.128.20 . tcp . 80 }",
        "accel-nodeports { tcp . 30020 }",
        "cluster-cap-4 { 198.18.128.20 . tcp . 80 }",
        "cluster-nodeport-cap-4 { tcp . 30020 }",
        "cluster-tcp-endpoints-4 { 198.18.128.20 . tcp . 80 . 0x0 : 198.18.16.20 . 8080 }",
        "cluster-tcp-endpoints-4 { 198.18.128.20 . tcp . 80 . 0x2 : 198.18.17.21 . 8080 }",
        "cluster-nodeport-tcp-endpoints-4 { tcp . 30020 . 0x1 : 198.18.17.20 . 8080 }",
        // Masquerading is decided as for every IPVS service.
        "masquerade-not-local { 198.18.128.20 . tcp . 80 }",
        "masquerade-nodeports { tcp . 30020 }",
        // edge: Local policy, no local endpoint: only the short-circuit has endpoints, the
        // rest meets the drop verdict.
        "accel-cluster { 198.18.128.22 . tcp . 80 }",
        "accel-external-local { 203.0.113.22 . tcp . 80 }",
        "accel-nodeports-local { tcp . 30022 }",
        "cluster-tcp-endpoints-1 { 203.0.113.22 . tcp . 80 . 0x0 : 198.18.17.22 . 8080 }",
        "cluster-nodeport-cap-1 { tcp . 30022 }",
        "no-endpoint-services { 203.0.113.22 . tcp . 80 : drop }",
    ] {
        assert!(elements.iter().any(|e| e.starts_with(wanted)), "{wanted:?} not in {elements:#?}");
    }
    for unwanted in ["shortcircuit-", "local-cap-"] {
        assert!(!elements.iter().any(|e| e.starts_with(unwanted)), "{unwanted:?} in {elements:#?}");
    }
    // Neither the service without the hint nor the one with affinity is DNATed here.
    for ip in ["198.18.128.21", "198.18.128.23"] {
        assert!(
            !elements.iter().any(|e| e.contains(ip) && (e.starts_with("accel-") || e.starts_with("cluster-"))),
            "{ip} in {elements:#?}"
        );
    }
    // ipvsadm still lists every service, the opted-in ones with their real servers.
    let key = |ip: &str| kproxy_ipvs::ServiceKey::Addr { addr: ip.parse().unwrap(), protocol: Protocol::Tcp, port: 80 };
    for ip in ["198.18.128.20", "198.18.128.21", "198.18.128.22", "198.18.128.23"] {
        assert!(dp.host().services.contains_key(&key(ip)), "no virtual service for {ip}");
    }
    assert_eq!(dp.host().services[&key("198.18.128.20")].dests.len(), 3);
    // slow: its NodePort is IPVS's alone, address services on the NodePort addresses.
    let addresses = world.plan.families[&IpFamily::V4].node.nodeport_addresses.addresses();
    assert!(!addresses.is_empty());
    for &addr in addresses {
        let key = kproxy_ipvs::ServiceKey::Addr { addr, protocol: Protocol::Tcp, port: 30021 };
        assert_eq!(dp.host().services[&key].dests.len(), 1, "{key}");
    }
}

/// The accelerated path keeps IPVS's O(change) partial syncs: an endpoint of an opted-in
/// service is map elements; removing the hint deletes its elements, and adding it again adds
/// them back; no rule or chain is touched.
#[test]
fn opted_in_services_change_by_elements_only() {
    let mut world = World::new(accel_cluster());
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&world.plan, &PlanDelta::between(&Plan::default(), &world.plan)).unwrap();
    let np = json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30020}]});
    // The added endpoint runs on this node (its address sorts last, so it takes the last slot):
    // its hairpin pair is an element too (a remote endpoint has none).
    let four = [("198.18.16.20", NODE_A), ("198.18.17.20", NODE_B), ("198.18.17.21", NODE_B), ("198.18.17.25", NODE_A)];
    let mut syncs = Vec::new();
    for objects in [
        opted_in(svc4("fast", "198.18.128.20", &four, np.clone())),
        svc4("fast", "198.18.128.20", &four, np.clone()),
        opted_in(svc4("fast", "198.18.128.20", &four, np.clone())),
    ] {
        let delta = world.apply(objects);
        let report = dp.sync(&world.plan, &delta).unwrap();
        assert!(!report.full);
        let text = dp.host().nft.last().unwrap().render();
        assert!(text.lines().all(|l| l.starts_with("add element") || l.starts_with("delete element")), "{text}");
        syncs.push(text);
    }
    let [endpoint, unhinted, hinted] = [&syncs[0], &syncs[1], &syncs[2]];
    for wanted in [
        "add element ip kproxy-ipvs cluster-tcp-endpoints-4 { 198.18.128.20 . tcp . 80 . 0x3 : 198.18.17.25 . 8080 }",
        "add element ip kproxy-ipvs cluster-nodeport-tcp-endpoints-4 { tcp . 30020 . 0x3 : 198.18.17.25 . 8080 }",
        "add element ip kproxy-ipvs hairpin-endpoints { 198.18.17.25 . 198.18.17.25 }",
    ] {
        assert!(endpoint.contains(wanted), "{wanted:?} not in\n{endpoint}");
    }
    assert_eq!(endpoint.lines().count(), 3, "{endpoint}");
    // Without the hint the NodePort is IPVS's alone (address services): no element replaces them.
    assert!(unhinted.contains("delete element ip kproxy-ipvs accel-nodeports"), "{unhinted}");
    assert!(!unhinted.contains("add element"), "{unhinted}");
    assert!(hinted.contains("add element ip kproxy-ipvs accel-nodeports"), "{hinted}");
    assert!(!hinted.contains("delete element"), "{hinted}");
    assert!(unhinted.contains("delete element ip kproxy-ipvs cluster-tcp-endpoints-4 "), "{unhinted}");
    assert!(hinted.contains("add element ip kproxy-ipvs cluster-tcp-endpoints-4 "), "{hinted}");
}

/// An endpoint of an accelerated port keeps its pick slot while it stays, as in the nftables
/// dataplane: one endpoint of 300 replaced (by an address that sorts last) is its slot's
/// element deleted and added again per destination (ClusterIP and NodePort), and one real
/// server in IPVS; nothing else moves, whichever endpoint it is.
#[test]
fn an_endpoint_replaced_in_a_big_accelerated_port_moves_no_other_slot() {
    let np = json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30020}]});
    let mut addresses: Vec<String> = (0..300).map(|i| format!("198.18.{}.{}", 64 + i / 250, i % 250 + 1)).collect();
    let objects = |addresses: &[String]| {
        let eps: Vec<(&str, &str)> = addresses.iter().map(|a| (a.as_str(), NODE_B)).collect();
        opted_in(svc4("fast", "198.18.128.20", &eps, np.clone()))
    };
    let mut world = World::new(objects(&addresses));
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&world.plan, &PlanDelta::between(&Plan::default(), &world.plan)).unwrap();
    for (k, j) in [0, 150, 7].into_iter().enumerate() {
        addresses[j] = format!("198.18.96.{}", k + 1);
        let delta = world.apply(objects(&addresses));
        dp.sync(&world.plan, &delta).unwrap();
        let text = dp.host().nft.last().unwrap().render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        let slot = format!(". {j:#x} ");
        assert!(lines.iter().all(|l| l.contains("-endpoints") && l.contains(&slot)), "slot {j} only:\n{text}");
    }
}

/// The accelerated path's transactions (a cold start, an endpoint change, the hint removed)
/// list the same over netlink and as nft text.
#[test]
fn the_accelerated_path_lists_the_same_over_netlink_and_as_nft_text() {
    if !require_root() {
        return;
    }
    let mut world = World::new(accel_cluster());
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&world.plan, &PlanDelta::between(&Plan::default(), &world.plan)).unwrap();
    let np = json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30020}]});
    let two = [("198.18.16.20", NODE_A), ("198.18.17.25", NODE_B)];
    for objects in [opted_in(svc4("fast", "198.18.128.20", &two, np.clone())), svc4("fast", "198.18.128.20", &two, np)]
    {
        let delta = world.apply(objects);
        dp.sync(&world.plan, &delta).unwrap();
    }
    let txs = dp.host().nft.clone();
    assert_eq!(txs.len(), 3);
    let over_netlink = Netns::new("auxaccnl").unwrap();
    let as_text = Netns::new("auxacctext").unwrap();
    over_netlink.run_in(|| apply_all(&mut NetlinkExecutor::new(), &txs)).unwrap();
    as_text.run_in(|| apply_all(&mut NftCommand::new(), &txs)).unwrap();
    let (a, b) = (listing(&over_netlink), listing(&as_text));
    let listed = a.to_string();
    assert!(listed.contains("accel-prerouting") && listed.contains("203.0.113.22"), "{listed}");
    assert_eq!(serde_json::to_string_pretty(&a).unwrap(), serde_json::to_string_pretty(&b).unwrap());
}

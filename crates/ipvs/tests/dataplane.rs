//! The dataplane's logic against the in-memory kernel ([`FakeHost`]): what would be sent.

#![allow(clippy::unwrap_used)]

mod fake_world;

use std::time::Duration;

use fake_world::{World, cip, dest, svc, two_services};
use kproxy_ipvs::{Config, FakeHost, IpvsDataplane, IpvsOp, ServiceKey};
use kproxy_packet_suite::{NODE_A, NODE_B};
use kproxy_plan::{DetectLocal, ProxyPolicy};
use kproxy_state::{IpFamily, Protocol};
use serde_json::json;

#[test]
fn first_sync_creates_services_vips_sysctls_and_the_table() {
    let world = World::new(two_services());
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    let report = dp.sync(&world.plan, &world.full()).unwrap();
    assert!(report.full);
    let host = dp.host();
    let web = &host.services[&cip("198.18.128.10")];
    assert_eq!(web.spec.scheduler, "rr");
    assert_eq!(web.dests.keys().copied().collect::<Vec<_>>(), vec![dest("198.18.16.10"), dest("198.18.17.10")]);
    let link = &host.links["kube-ipvs0"];
    assert_eq!(link.kind.as_deref(), Some("dummy"));
    assert!(link.addresses.contains(&"198.18.128.11".parse().unwrap()));
    for s in ["net/ipv4/vs/conntrack", "net/ipv4/vs/expire_nodest_conn", "net/ipv4/vs/expire_quiescent_template"] {
        assert_eq!(host.sysctls[s], "1", "{s}");
    }
    assert_eq!(host.sysctls["net/ipv4/conf/all/arp_ignore"], "0", "strictARP is off by default");
    let text = host.nft.last().unwrap().render();
    assert!(text.contains("198.18.128.10 . tcp . 80"), "{text}");
}

#[test]
fn ipv6_forwarding_is_set_only_when_ipv6_is_planned() {
    // Setting net.ipv6.conf.all.forwarding turns off router-advertisement acceptance, so an
    // IPv4-only node must keep its value.
    const V6_FORWARDING: &str = "net/ipv6/conf/all/forwarding";
    let ipv4_only = World::new(two_services());
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&ipv4_only.plan, &ipv4_only.full()).unwrap();
    assert_eq!(dp.host().sysctls["net/ipv4/ip_forward"], "1");
    assert_eq!(dp.host().sysctls[V6_FORWARDING], "0");
    assert!(!dp.host().log.iter().any(|l| l.contains(V6_FORWARDING)), "{:?}", dp.host().log);

    let policy = ProxyPolicy {
        families: vec![IpFamily::V4, IpFamily::V6],
        detect_local: DetectLocal::ClusterCidr(vec![
            "198.18.16.0/20".parse().unwrap(),
            "fd00:16::/48".parse().unwrap(),
        ]),
        ..ProxyPolicy::default()
    };
    let dual_stack = World::with_policy(policy, two_services());
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&dual_stack.plan, &dual_stack.full()).unwrap();
    assert_eq!(dp.host().sysctls["net/ipv4/ip_forward"], "1");
    assert_eq!(dp.host().sysctls[V6_FORWARDING], "1");
}

#[test]
fn an_endpoint_change_touches_only_that_services_real_servers() {
    let mut world = World::new(two_services());
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&world.plan, &world.full()).unwrap();
    dp.host_mut().clear_log();
    let delta =
        world.apply(svc("db", "198.18.128.11", &[("198.18.16.11", NODE_A), ("198.18.16.12", NODE_A)], json!({})));
    let report = dp.sync(&world.plan, &delta).unwrap();
    assert!(!report.full);
    assert_eq!(
        dp.host().ipvs_ops,
        vec![IpvsOp::AddDest(cip("198.18.128.11"), kproxy_ipvs::DestSpec { key: dest("198.18.16.12"), weight: 1 })]
    );
    assert_eq!(dp.host().dumps, 0, "no listing of the kernel on a partial sync");
    assert_eq!(report.address_ops, 0);
    // Only the new hairpin element changes in the auxiliary table.
    assert_eq!(report.nft_ops, 1, "{:?}", dp.host().nft);
}

#[test]
fn a_restart_adopts_what_the_kernel_has_and_fixes_only_differences() {
    let world = World::new(two_services());
    let mut first = IpvsDataplane::new(FakeHost::new(), Config::default());
    first.sync(&world.plan, &world.full()).unwrap();
    let mut kernel = first.host().clone();
    // Something changed behind kproxy's back: a real server gone, a stranger added.
    kernel.services.get_mut(&cip("198.18.128.10")).unwrap().dests.remove(&dest("198.18.17.10"));
    kernel
        .ipvs(&IpvsOp::AddService(kproxy_ipvs::ServiceSpec {
            key: cip("198.18.128.99"),
            scheduler: "rr".into(),
            flags: 0,
            timeout: 0,
        }))
        .unwrap();
    kernel.clear_log();
    let mut second = IpvsDataplane::new(kernel, Config::default());
    let report = second.sync(&world.plan, &world.full()).unwrap();
    assert_eq!(report.ipvs_ops, 2, "{:?}", second.host().ipvs_ops);
    assert!(second.host().ipvs_ops.contains(&IpvsOp::DeleteService(cip("198.18.128.99"))));
    assert!(matches!(&second.host().ipvs_ops[..], [IpvsOp::AddDest(..), _] | [_, IpvsOp::AddDest(..)]));
    assert_eq!(report.address_ops, 0);
    // And once more: nothing at all.
    let mut third = IpvsDataplane::new(second.host().clone(), Config::default());
    third.host_mut().clear_log();
    let report = third.sync(&world.plan, &world.full()).unwrap();
    assert_eq!((report.ipvs_ops, report.address_ops), (0, 0));
}

#[test]
fn removed_tcp_endpoints_drain_at_weight_zero_and_go_when_idle() {
    let mut world = World::new(two_services());
    let config = Config { graceful_period: Duration::from_secs(3600), ..Config::default() };
    let mut dp = IpvsDataplane::new(FakeHost::new(), config);
    dp.sync(&world.plan, &world.full()).unwrap();
    dp.host_mut().set_active(&cip("198.18.128.10"), &dest("198.18.17.10"), 1);
    let delta = world.apply(svc("web", "198.18.128.10", &[("198.18.16.10", NODE_A)], json!({})));
    dp.sync(&world.plan, &delta).unwrap();
    let web = &dp.host().services[&cip("198.18.128.10")];
    assert_eq!(web.dests[&dest("198.18.17.10")].spec.weight, 0, "kept at weight 0 while it has a connection");
    assert_eq!(dp.draining().count(), 1);
    assert_eq!(dp.reap_drained().unwrap(), 0);
    dp.host_mut().set_active(&cip("198.18.128.10"), &dest("198.18.17.10"), 0);
    assert_eq!(dp.reap_drained().unwrap(), 1);
    assert!(!dp.host().services[&cip("198.18.128.10")].dests.contains_key(&dest("198.18.17.10")));
    // It comes back: weight 1 again, not a second entry.
    let delta =
        world.apply(svc("web", "198.18.128.10", &[("198.18.16.10", NODE_A), ("198.18.17.10", NODE_B)], json!({})));
    dp.sync(&world.plan, &delta).unwrap();
    assert_eq!(dp.host().services[&cip("198.18.128.10")].dests[&dest("198.18.17.10")].spec.weight, 1);
}

fn affinity_nodeport(policy: &str) -> World {
    World::new(svc(
        "web",
        "198.18.128.10",
        &[("198.18.16.10", NODE_A), ("198.18.17.10", NODE_B)],
        json!({"type": "NodePort", "sessionAffinity": "ClientIP", "externalTrafficPolicy": policy,
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 30}},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]}),
    ))
}

fn node_port(addr: &str) -> ServiceKey {
    ServiceKey::Addr { addr: addr.parse().unwrap(), protocol: Protocol::Tcp, port: 30080 }
}

/// A dataplane over the in-memory kernel after a full sync of `world`.
fn synced(world: &World) -> IpvsDataplane<FakeHost> {
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&world.plan, &world.full()).unwrap();
    dp
}

/// The firewall-mark services `host` has.
fn fwmark_services(host: &FakeHost) -> Vec<ServiceKey> {
    host.services.keys().filter(|k| matches!(k, ServiceKey::Fwmark { .. })).copied().collect()
}

fn addrs(ips: &[&str]) -> Vec<std::net::IpAddr> {
    ips.iter().map(|ip| ip.parse().unwrap()).collect()
}

/// `world`'s plan with the IPv4 node-port addresses `addresses`.
fn with_nodeport_addresses(world: &World, addresses: kproxy_plan::NodePortAddresses) -> kproxy_plan::Plan {
    let mut plan = world.plan.clone();
    plan.families.get_mut(&IpFamily::V4).unwrap().node.nodeport_addresses = addresses;
    plan
}

/// A persistent firewall-mark service would send the connection to the endpoint's NodePort
/// (the kernel keeps a destination port other than the service's, and a firewall-mark service
/// has none), so under ClientIP affinity a NodePort is a persistent address service on each
/// node address, as upstream's, and gets no firewall mark.
#[test]
fn affinity_is_persistence_and_nodeports_under_it_are_address_services_on_the_node_addresses() {
    let world = affinity_nodeport("Cluster");
    let dp = synced(&world);
    let host = dp.host();
    let web = &host.services[&cip("198.18.128.10")];
    assert_eq!((web.spec.flags & 1, web.spec.timeout), (1, 30));
    let np = &host.services[&node_port("198.18.0.2")];
    assert_eq!((np.spec.flags & 1, np.spec.timeout), (1, 30));
    assert_eq!(np.dests.keys().copied().collect::<Vec<_>>(), vec![dest("198.18.16.10"), dest("198.18.17.10")]);
    let fw = fwmark_services(host);
    assert!(fw.is_empty(), "{fw:?}");
    let text = host.nft.last().unwrap().render();
    assert!(text.contains("tcp . 30080"), "still a NodePort to masquerade: {text}");
    assert!(!text.contains("tcp . 30080 : 0x"), "no firewall mark: {text}");
}

fn plain_nodeport() -> World {
    World::new(svc(
        "web",
        "198.18.128.10",
        &[("198.18.16.10", NODE_A)],
        json!({"type": "NodePort",
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]}),
    ))
}

/// A NodePort is an address service on each node address, as upstream's (the services
/// kube-proxy's IPVS mode makes, so a node moving between the two keeps its NodePort
/// connections), and its packets get no firewall mark.
#[test]
fn nodeports_are_address_services_on_the_node_addresses_as_upstreams() {
    let dp = synced(&plain_nodeport());
    let host = dp.host();
    let np = &host.services[&node_port("198.18.0.2")];
    assert_eq!((np.spec.flags & 1, np.spec.scheduler.as_str()), (0, "rr"));
    assert_eq!(np.dests.keys().copied().collect::<Vec<_>>(), vec![dest("198.18.16.10")]);
    let fw = fwmark_services(host);
    assert!(fw.is_empty(), "{fw:?}");
    let text = host.nft.last().unwrap().render();
    assert!(text.contains("masquerade-nodeports { tcp . 30080 }"), "still a NodePort to masquerade: {text}");
    assert!(!text.contains(" : 0x"), "no firewall mark: {text}");
}

/// Under `externalTrafficPolicy: Local` the NodePort's address service has the local endpoints;
/// the short-circuit (local pods and the node to the cluster endpoints) stays a firewall-mark
/// service, not persistent, so its connections reach the endpoints' target port.
#[test]
fn affinity_under_local_policy_keeps_a_short_circuit_that_is_not_persistent() {
    let world = affinity_nodeport("Local");
    let dp = synced(&world);
    let host = dp.host();
    let np = &host.services[&node_port("198.18.0.2")];
    assert_eq!(np.dests.keys().copied().collect::<Vec<_>>(), vec![dest("198.18.16.10")], "the local endpoint");
    let fw = fwmark_services(host);
    assert_eq!(fw.len(), 1, "the short-circuit: {fw:?}");
    let short_circuit = &host.services[&fw[0]];
    assert_eq!((short_circuit.spec.flags & 1, short_circuit.spec.timeout), (0, 0));
    assert_eq!(short_circuit.dests.len(), 2, "the cluster endpoints");
}

/// A node address came: each NodePort's address services follow (with or without ClientIP
/// affinity), in a partial sync that touches those services and the `nodeport-ips` element
/// alone; and the address going takes them away.
#[test]
fn a_node_address_change_moves_the_address_services_of_nodeports() {
    use kproxy_plan::{NodePortAddresses, PlanDelta};
    for world in [plain_nodeport(), affinity_nodeport("Cluster")] {
        let with = |ips: &[&str]| with_nodeport_addresses(&world, NodePortAddresses::AllLocal(addrs(ips)));
        let (one, two) = (with(&["198.18.0.2"]), with(&["198.18.0.2", "198.18.0.4"]));
        let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
        dp.sync(&one, &PlanDelta::between(&kproxy_plan::Plan::default(), &one)).unwrap();
        assert!(!dp.host().services.contains_key(&node_port("198.18.0.4")));
        dp.host_mut().clear_log();
        let report = dp.sync(&two, &PlanDelta::between(&one, &two)).unwrap();
        assert!(!report.full, "not a full reconcile");
        assert!(dp.host().services.contains_key(&node_port("198.18.0.4")));
        assert!(dp.host().services.contains_key(&node_port("198.18.0.2")));
        let touched: std::collections::BTreeSet<Option<ServiceKey>> =
            dp.host().ipvs_ops.iter().map(op_service).collect();
        assert_eq!(touched, [Some(node_port("198.18.0.4"))].into(), "{:?}", dp.host().ipvs_ops);
        assert_eq!(dp.host().dumps, 0, "no listing");
        dp.sync(&one, &PlanDelta::between(&two, &one)).unwrap();
        assert!(!dp.host().services.contains_key(&node_port("198.18.0.4")));
        assert!(dp.host().services.contains_key(&node_port("198.18.0.2")));
    }
}

/// With `nodePortAddresses` CIDRs, packets to a NodePort are marked for masquerading by the
/// address's `nodeport-ips` element: an address that comes gets its element before its NodePort
/// services, so that no connection reaches one of them unmarked; the rest of the auxiliary
/// table's changes still follow the services.
#[test]
fn a_new_nodeport_address_is_in_nodeport_ips_before_its_services() {
    use kproxy_plan::{NodePortAddresses, PlanDelta};
    let world = plain_nodeport();
    let with = |ips: &[&str]| with_nodeport_addresses(&world, NodePortAddresses::Only(addrs(ips)));
    let (one, two) = (with(&["198.18.0.2"]), with(&["198.18.0.2", "198.18.0.4"]));
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&one, &PlanDelta::between(&kproxy_plan::Plan::default(), &one)).unwrap();
    dp.host_mut().clear_log();
    let report = dp.sync(&two, &PlanDelta::between(&one, &two)).unwrap();
    assert!(!report.full, "not a full reconcile");
    let log = &dp.host().log;
    let element_at = log.iter().position(|l| l.starts_with("nft ")).expect("an nftables transaction");
    let service_at = log.iter().position(|l| l.starts_with("ipvs AddService")).expect("the new address's service");
    assert!(element_at < service_at, "{log:#?}");
    let added = format!("{:?}", dp.host().nft.first().expect("the sync's first transaction"));
    assert!(added.contains("nodeport-ips") && added.contains("198.18.0.4"), "{added}");
    assert!(dp.host().services.contains_key(&node_port("198.18.0.4")));
}

/// The virtual service an IPVS change is about (none for the global timeouts).
fn op_service(op: &IpvsOp) -> Option<ServiceKey> {
    match op {
        IpvsOp::AddService(spec) | IpvsOp::UpdateService(spec) => Some(spec.key),
        IpvsOp::DeleteService(key)
        | IpvsOp::AddDest(key, _)
        | IpvsOp::UpdateDest(key, _)
        | IpvsOp::DeleteDest(key, _) => Some(*key),
        IpvsOp::SetTimeouts { .. } => None,
    }
}

/// A delta that adds an affinity NodePort together with a node address (one sync after both
/// changed) gives the new port its address services on every address, the new one included.
#[test]
fn a_port_added_with_a_node_address_change_gets_services_on_the_new_addresses() {
    use kproxy_plan::{NodePortAddresses, PlanDelta};
    let world = affinity_nodeport("Cluster");
    let mut before = with_nodeport_addresses(&world, NodePortAddresses::AllLocal(addrs(&["198.18.0.2"])));
    before.families.values_mut().for_each(|family| family.services.clear());
    let after = with_nodeport_addresses(&world, NodePortAddresses::AllLocal(addrs(&["198.18.0.2", "198.18.0.4"])));
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&before, &PlanDelta::between(&kproxy_plan::Plan::default(), &before)).unwrap();
    dp.sync(&after, &PlanDelta::between(&before, &after)).unwrap();
    for addr in ["198.18.0.2", "198.18.0.4"] {
        assert!(dp.host().services.contains_key(&node_port(addr)), "{addr}: {:?}", dp.host().services.keys());
    }
}

#[test]
fn cleanup_spares_excluded_and_foreign_services() {
    let world = World::new(two_services());
    let config = Config { exclude_cidrs: vec!["192.0.2.0/24".parse().unwrap()], ..Config::default() };
    let mut host = FakeHost::new();
    for key in [
        ServiceKey::Addr { addr: "192.0.2.1".parse().unwrap(), protocol: Protocol::Tcp, port: 80 },
        ServiceKey::Fwmark { family: kproxy_state::IpFamily::V4, mark: 7 },
    ] {
        host.ipvs(&IpvsOp::AddService(kproxy_ipvs::ServiceSpec { key, scheduler: "rr".into(), flags: 0, timeout: 0 }))
            .unwrap();
    }
    let mut dp = IpvsDataplane::new(host, config);
    dp.sync(&world.plan, &world.full()).unwrap();
    assert_eq!(dp.host().services.len(), 4, "foreign services are left alone by syncs too");
    dp.cleanup().unwrap();
    assert_eq!(dp.host().services.len(), 2);
    assert!(!dp.host().links.contains_key("kube-ipvs0"));
    assert!(dp.host().links.contains_key("eth0"));
}

use kproxy_ipvs::Host as _;

/// A node address that `nodePortAddresses` selects came, then went, with no NodePort: one
/// `nodeport-ips` element of the auxiliary table each, no IPVS change, no listing, and the
/// table ends as a full sync of the new plan builds it.
#[test]
fn a_node_port_address_change_costs_its_element_alone() {
    use kproxy_plan::{NodePortAddresses, PlanDelta};
    let world = World::new(two_services());
    let with = |ips: &[&str]| with_nodeport_addresses(&world, NodePortAddresses::Only(addrs(ips)));
    let (one, two) = (with(&["198.18.0.2"]), with(&["198.18.0.2", "198.18.0.4"]));
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&one, &PlanDelta::between(&kproxy_plan::Plan::default(), &one)).unwrap();
    for (from, to) in [(&one, &two), (&two, &one)] {
        dp.host_mut().clear_log();
        let report = dp.sync(to, &PlanDelta::between(from, to)).unwrap();
        assert!(!report.full, "not a full reconcile");
        assert_eq!(report.nft_ops, 1, "one element: {:?}", dp.host().nft.last());
        let text = dp.host().nft.last().unwrap().render();
        assert!(text.contains("nodeport-ips") && text.contains("198.18.0.4"), "{text}");
        assert!(dp.host().ipvs_ops.is_empty() && dp.host().dumps == 0, "{:?}", dp.host().log);

        let mut fresh = IpvsDataplane::new(FakeHost::new(), Config::default());
        fresh.sync(to, &PlanDelta::between(&kproxy_plan::Plan::default(), to)).unwrap();
        assert_eq!(dp.host().nft_tables, fresh.host().nft_tables, "as a full sync builds it");
    }
}

/// Adds an address service with one real server (weight 1) to `host`.
fn add_foreign_service(host: &mut FakeHost, key: ServiceKey) {
    let spec = kproxy_ipvs::ServiceSpec { key, scheduler: "rr".into(), flags: 0, timeout: 0 };
    host.ipvs(&IpvsOp::AddService(spec)).unwrap();
    let real = kproxy_ipvs::DestSpec { key: dest("198.18.16.10"), weight: 1 };
    host.ipvs(&IpvsOp::AddDest(key, real)).unwrap();
}

/// Address services kproxy does not want on a node address (kube-proxy's, on a node kproxy's
/// IPVS mode takes over; a deleted Service's NodePort): one that carries a connection stays
/// (deleting it would break the connection) until the connection ends, its real servers at
/// weight 0 (no new connection), not reported as drift; one without, a UDP one and one on an
/// address of the dummy interface's kind (a VIP) go at once, as upstream deletes what it does
/// not want.
#[test]
fn an_unwanted_service_on_a_node_address_stays_while_it_carries_connections() {
    let world = World::new(two_services());
    let kept = node_port("198.18.0.2");
    let idle = ServiceKey::Addr { addr: "198.18.0.2".parse().unwrap(), protocol: Protocol::Tcp, port: 30081 };
    let udp = ServiceKey::Addr { addr: "198.18.0.2".parse().unwrap(), protocol: Protocol::Udp, port: 30082 };
    let vip_addr: std::net::IpAddr = "198.18.128.99".parse().unwrap();
    let vip = cip("198.18.128.99");
    let mut host = FakeHost::new();
    for key in [kept, idle, udp, vip] {
        add_foreign_service(&mut host, key);
        host.set_active(&key, &dest("198.18.16.10"), 1);
    }
    host.set_active(&idle, &dest("198.18.16.10"), 0);
    // kube-proxy's dummy interface, with its ClusterIP.
    host.links.insert(
        "kube-ipvs0".into(),
        kproxy_ipvs::FakeLink { index: 9, kind: Some("dummy".into()), up: true, addresses: [vip_addr].into() },
    );
    let mut dp = IpvsDataplane::new(host, Config::default());
    dp.sync(&world.plan, &world.full()).unwrap();
    let services = &dp.host().services;
    assert!(services.contains_key(&kept), "kept while it carries a connection");
    assert_eq!(services[&kept].dests[&dest("198.18.16.10")].spec.weight, 0, "no new connection");
    for gone in [idle, udp, vip] {
        assert!(!services.contains_key(&gone), "{gone} goes at once");
    }
    assert_eq!(dp.draining_services().collect::<Vec<_>>(), [&kept]);
    assert_eq!(dp.verify(&world.plan).unwrap(), kproxy_plan::Verified::Clean, "kept is not drift");
    assert_eq!(dp.reap_drained().unwrap(), 0, "still connected");

    dp.host_mut().set_active(&kept, &dest("198.18.16.10"), 0);
    assert_eq!(dp.reap_drained().unwrap(), 1);
    assert!(!dp.host().services.contains_key(&kept));
    assert_eq!(dp.draining_services().count(), 0);
    assert_eq!(dp.verify(&world.plan).unwrap(), kproxy_plan::Verified::Clean);
}

/// An earlier kproxy's NodePort (until 2026-12-07 a firewall-mark service in kproxy's range,
/// which nothing marks packets for any more) keeps the connections it carries after an
/// upgrade: it stays, taking no new connection, until they end.
#[test]
fn an_earlier_kproxys_firewall_mark_nodeport_drains_after_an_upgrade() {
    let config = Config::default();
    let old = ServiceKey::Fwmark { family: IpFamily::V4, mark: config.fwmark_base | 0x123 };
    let mut host = FakeHost::new();
    add_foreign_service(&mut host, old);
    host.set_active(&old, &dest("198.18.16.10"), 1);
    let world = plain_nodeport();
    let mut dp = IpvsDataplane::new(host, config);
    dp.sync(&world.plan, &world.full()).unwrap();
    assert_eq!(dp.host().services[&old].dests[&dest("198.18.16.10")].spec.weight, 0, "no new connection");
    assert_eq!(dp.verify(&world.plan).unwrap(), kproxy_plan::Verified::Clean, "draining is not drift");
    assert_eq!(dp.reap_drained().unwrap(), 0, "still connected");
    dp.host_mut().set_active(&old, &dest("198.18.16.10"), 0);
    assert_eq!(dp.reap_drained().unwrap(), 1);
    assert!(!dp.host().services.contains_key(&old));
    assert!(dp.host().services.contains_key(&node_port("198.18.0.2")), "the NodePort's address service serves");
}

/// `excludeCIDRs` spares the services kproxy does not want (as upstream's): a NodePort on a
/// node address inside them is still kproxy's, kept in line and not drift at every check.
#[test]
fn a_nodeport_on_a_node_address_inside_exclude_cidrs_is_kept_in_line() {
    let config = Config { exclude_cidrs: vec!["198.18.0.0/24".parse().unwrap()], ..Config::default() };
    let world = plain_nodeport();
    let mut dp = IpvsDataplane::new(FakeHost::new(), config);
    dp.sync(&world.plan, &world.full()).unwrap();
    assert!(dp.host().services.contains_key(&node_port("198.18.0.2")));
    assert_eq!(dp.verify(&world.plan).unwrap(), kproxy_plan::Verified::Clean);
    dp.host_mut().ipvs(&IpvsOp::DeleteService(node_port("198.18.0.2"))).unwrap();
    assert!(matches!(dp.verify(&world.plan).unwrap(), kproxy_plan::Verified::Repaired(_)));
    assert!(dp.host().services.contains_key(&node_port("198.18.0.2")), "repaired");
}

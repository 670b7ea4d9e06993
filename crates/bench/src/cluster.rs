//! Synthetic clusters: `n` services × `e` endpoints, with a realistic mix of features, built
//! directly as a [`Plan`] (what the planner would produce), deterministic for a given size.
//!
//! Mix: 10% NodePort, 2% LoadBalancer (half of them `externalTrafficPolicy: Local`, with
//! source ranges), 1% ClientIP affinity. Addresses stay inside 198.18.0.0/15: ClusterIPs in
//! 198.19.0.0/16 (with the service port varying once the /16 is used up, so every
//! `address . proto . port` key is distinct), load balancer IPs in 203.0.113.0/24 (likewise),
//! endpoints in 198.18.0.0/16 — past 65k endpoints,
//! pod addresses are shared by several services, as when many services select the same pods.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use kproxy_plan::{
    Endpoint, ExternalPolicy, ExternalTraffic, FamilyDelta, FamilyPlan, InternalTraffic, LocalTraffic, MasqueradeWhen,
    NodePlan, NodePortAddresses, Plan, PlanDelta, ServicePortChange, ServicePortName, ServicePortPlan, SnatPolicy,
};
use kproxy_state::{IpFamily, Protocol};

/// Feature counts of a generated cluster.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct Mix {
    /// Services.
    pub services: usize,
    /// Endpoints in total.
    pub endpoints: usize,
    /// NodePort services (LoadBalancers included).
    pub node_ports: usize,
    /// LoadBalancer services.
    pub load_balancers: usize,
    /// eTP Local services.
    pub etp_local: usize,
    /// ClientIP affinity services.
    pub affinity: usize,
}

fn addr(base: [u8; 2], index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(base[0], base[1], ((index >> 8) & 0xff) as u8, (index & 0xff) as u8))
}

/// The node: pod CIDR 198.18.0.0/16 is local, node IP 203.0.113.2.
pub fn node() -> NodePlan {
    NodePlan {
        node_ip: Some(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 2))),
        local_traffic: LocalTraffic::SourceCidrs(vec![ipnet("198.18.0.0/16")]),
        nodeport_addresses: NodePortAddresses::Only(vec![IpAddr::V4(Ipv4Addr::new(203, 0, 113, 2))]),
        snat: SnatPolicy::masquerade(),
        service_cidrs: vec![ipnet("198.19.0.0/16")],
        acceleration: false,
    }
}

fn ipnet(s: &str) -> ipnet::IpNet {
    // Constant, valid literals.
    s.parse().unwrap_or_else(|_| ipnet::IpNet::V4(ipnet::Ipv4Net::default()))
}

/// Endpoint `j` of service `i` (pod addresses wrap around 198.18.0.0/16).
pub fn endpoint(i: usize, j: usize, per_service: usize, generation: usize) -> Endpoint {
    let index = (i * per_service + j + generation * 7919) % 65536;
    Endpoint { ip: addr([198, 18], index), port: 8080, is_local: j == 0, ready: true }
}

/// Service port `i` of a cluster with `per_service` endpoints per service.
pub fn service(i: usize, per_service: usize) -> ServicePortPlan {
    let node_port = i.is_multiple_of(10);
    let load_balancer = i.is_multiple_of(50);
    let etp_local = load_balancer && i.is_multiple_of(100);
    let affinity = i % 100 == 7;
    let eps: Vec<Endpoint> = (0..per_service).map(|j| endpoint(i, j, per_service, 0)).collect();
    let mut eps_sorted = eps.clone();
    eps_sorted.sort();
    let local: Vec<Endpoint> = eps_sorted.iter().filter(|e| e.is_local).cloned().collect();
    ServicePortPlan {
        name: ServicePortName {
            namespace: format!("ns{}", i / 1000).into(),
            service: format!("svc{i}").into(),
            port: "http".into(),
            protocol: Protocol::Tcp,
        },
        cluster_ip: addr([198, 19], i % 65536),
        // Load balancers: 250 ingress addresses, each reused on another port.
        port: if load_balancer { 443 + (i / 50 / 250) as u16 } else { 80 + (i / 65536) as u16 },
        protocol: Protocol::Tcp,
        // A node port range wide enough for 10% of 100k services (`--service-node-port-range`).
        node_port: node_port.then_some(1024 + (i / 10) as u16),
        external_ips: vec![],
        load_balancer_ips: if load_balancer {
            vec![IpAddr::V4(Ipv4Addr::new(203, 0, 113, (i / 50 % 250) as u8 + 3))]
        } else {
            vec![]
        },
        source_ranges: if etp_local { vec![ipnet("192.0.2.0/24")] } else { vec![] },
        affinity_timeout: affinity.then_some(10800),
        cluster_endpoints: eps_sorted,
        local_endpoints: local,
        internal: InternalTraffic { local: false, masquerade: MasqueradeWhen::SourceNotLocal, no_endpoints: None },
        external: node_port.then_some(ExternalTraffic {
            policy: if etp_local {
                ExternalPolicy::Local { short_circuit_pods: true }
            } else {
                ExternalPolicy::Cluster
            },
            no_endpoints: None,
        }),
        health_check_node_port: None,
        accelerate: false,
        serving_endpoints: Vec::new(),
    }
}

/// A cluster of `n` services × `per_service` endpoints, and its feature counts.
pub fn plan(n: usize, per_service: usize) -> (Plan, Mix) {
    let mut mix = Mix { services: n, endpoints: n * per_service, ..Mix::default() };
    let mut services = BTreeMap::new();
    for i in 0..n {
        let s = service(i, per_service);
        mix.node_ports += usize::from(s.node_port.is_some());
        mix.load_balancers += usize::from(!s.load_balancer_ips.is_empty());
        mix.etp_local +=
            usize::from(matches!(s.external, Some(ExternalTraffic { policy: ExternalPolicy::Local { .. }, .. })));
        mix.affinity += usize::from(s.affinity_timeout.is_some());
        services.insert(s.name.clone(), Arc::new(s));
    }
    let fam = FamilyPlan { family: IpFamily::V4, node: node(), services };
    (Plan { families: [(IpFamily::V4, fam)].into_iter().collect() }, mix)
}

/// Changes one endpoint of service port `i` (change number `k`): the new plan and the delta the
/// planner would hand the dataplane for it (one changed service port, built directly as the
/// planner's O(change) update does, outside any timing). Changes cycle through the kinds a
/// rollout or a scale produces: replace an endpoint, add one, remove one.
pub fn change_one_endpoint(plan: &mut Plan, i: usize, per_service: usize, k: usize) -> PlanDelta {
    let Some(fam) = plan.families.get_mut(&IpFamily::V4) else { return PlanDelta::default() };
    let name = service(i, per_service).name;
    let Some(old) = fam.services.get(&name).cloned() else { return PlanDelta::default() };
    let mut new = (*old).clone();
    let j = k % per_service.max(1);
    let fresh = Endpoint { is_local: false, ..endpoint(i, j, per_service, k + 1) };
    // Only remote endpoints change, so the local-policy endpoints stay as they are.
    let remote = new.cluster_endpoints.iter().position(|e| !e.is_local);
    match (k % 3, remote) {
        (0, Some(at)) => new.cluster_endpoints[at] = fresh,
        (2, Some(at)) if new.cluster_endpoints.len() > 1 => {
            new.cluster_endpoints.remove(at);
        }
        _ => new.cluster_endpoints.push(fresh),
    }
    new.cluster_endpoints.sort();
    let new = Arc::new(new);
    fam.services.insert(name, new.clone());
    let family = FamilyDelta { changed: vec![ServicePortChange { old, new }], ..FamilyDelta::default() };
    PlanDelta { families: [(IpFamily::V4, family)].into_iter().collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delta_of_a_change_is_what_diffing_the_plans_gives() {
        let (mut plan, _) = plan(300, 5);
        for k in 0..9 {
            let before = plan.clone();
            let delta = change_one_endpoint(&mut plan, k * 31 % 300, 5, k);
            assert_eq!(delta, PlanDelta::between(&before, &plan), "change {k}");
        }
    }
}

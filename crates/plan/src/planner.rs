//! Computing the plan from the cluster state.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use kproxy_state::{ClusterState, Dirty, IpFamily, NodeInfo, ObjectKey, Protocol, ServiceInfo, TrafficHint};

use crate::categorize::{Candidate, categorize_endpoints};
use crate::delta::{FamilyDelta, PlanDelta};
use crate::model::{
    ExternalPolicy, ExternalTraffic, FamilyPlan, InternalTraffic, MasqueradeWhen, NoEndpointsVerdict, NodePlan, Plan,
    ServicePortName, ServicePortPlan,
};
use crate::policy::{
    DetectLocal, LocalTraffic, NodeContext, NodePortAddress, NodePortAddresses, ProxyPolicy, SnatPolicy, SnatSource,
};

/// Computes plans for one node under one configuration.
#[derive(Debug, Clone)]
pub struct Planner {
    policy: ProxyPolicy,
    node: NodeContext,
}

impl Planner {
    /// A planner for `node` under `policy`.
    pub fn new(policy: ProxyPolicy, node: NodeContext) -> Self {
        Self { policy, node }
    }

    /// The configuration this planner applies.
    pub fn policy(&self) -> &ProxyPolicy {
        &self.policy
    }

    /// The node planned for.
    pub fn node(&self) -> &NodeContext {
        &self.node
    }

    /// The node's interface addresses changed (`nodePortAddresses` CIDRs resolve against them);
    /// returns whether they differ from the ones planned with, i.e. whether to replan.
    pub fn set_local_addresses(&mut self, mut addresses: Vec<IpAddr>) -> bool {
        addresses.sort();
        addresses.dedup();
        let changed = addresses != self.node.local_addresses;
        self.node.local_addresses = addresses;
        changed
    }

    /// What the node's addresses (as last set) change in `plan`, which was planned with the
    /// addresses before: the node-wide settings of each family whose `nodePortAddresses` now
    /// resolve differently. Empty when no address they select came or went (a pod's link-local
    /// address, an address outside the CIDRs, any address under `primary`). Service ports never
    /// depend on the node's addresses, so this costs O(addresses), not O(plan).
    pub fn node_addresses_delta(&self, plan: &Plan) -> PlanDelta {
        let mut delta = PlanDelta::default();
        for (&family, fam) in &plan.families {
            let nodeport_addresses = self.nodeport_addresses(fam.node.node_ip, family);
            if nodeport_addresses != fam.node.nodeport_addresses {
                let node = NodePlan { nodeport_addresses, ..fam.node.clone() };
                delta.families.insert(family, FamilyDelta { node: Some(node), ..FamilyDelta::default() });
            }
        }
        delta
    }

    /// The plan for the whole state.
    pub fn build(&self, state: &ClusterState) -> Plan {
        let mut plan = Plan::default();
        for &family in &self.policy.families {
            let node = self.node_plan(state, family);
            let mut services = BTreeMap::new();
            for svc in state.services() {
                services.extend(self.service_ports(state, &node, svc, family));
            }
            plan.families.insert(family, FamilyPlan { family, node, services });
        }
        plan
    }

    /// Brings `plan` up to date with `state`, recomputing only what `dirty` names, and returns
    /// what changed. When something node-wide changed (`dirty.all`) everything is recomputed.
    pub fn update(&self, plan: &mut Plan, state: &ClusterState, dirty: &Dirty) -> PlanDelta {
        if dirty.all {
            let new = self.build(state);
            let delta = PlanDelta::between(plan, &new);
            *plan = new;
            return delta;
        }
        let mut target = Plan::default();
        for (&family, fam) in &plan.families {
            let mut services = BTreeMap::new();
            for key in &dirty.services {
                if let Some(svc) = state.service(key) {
                    services.extend(self.service_ports(state, &fam.node, svc, family));
                }
            }
            target.families.insert(family, FamilyPlan { family, node: fam.node.clone(), services });
        }
        let delta = PlanDelta::for_services(plan, &target, &dirty.services);
        plan.apply(&delta);
        delta
    }

    fn node_plan(&self, state: &ClusterState, family: IpFamily) -> NodePlan {
        let node = state.node(&self.node.name).map(|n| n.as_ref());
        let of_family = |ips: &[IpAddr]| ips.iter().copied().find(|ip| IpFamily::of(ip) == family);
        let node_ip = of_family(&self.node.node_ip_override).or_else(|| node.and_then(|n| of_family(&n.internal_ips)));
        let (source, fell_back) = match (self.policy.snat_to_node_ip, node_ip) {
            (true, Some(ip)) => (SnatSource::NodeIp(ip), false),
            (true, None) => (SnatSource::Masquerade, true),
            (false, _) => (SnatSource::Masquerade, false),
        };
        NodePlan {
            node_ip,
            local_traffic: self.local_traffic(node, family),
            nodeport_addresses: self.nodeport_addresses(node_ip, family),
            snat: SnatPolicy {
                no_masquerade_cidrs: of_family_nets(&self.policy.no_masquerade_cidrs, family),
                source,
                fell_back_to_masquerade: fell_back,
            },
            service_cidrs: {
                let mut cidrs: Vec<IpNet> =
                    state.service_cidrs().filter(|n| IpFamily::of_net(n) == family).copied().collect();
                cidrs.sort();
                cidrs.dedup();
                cidrs
            },
            acceleration: self.policy.acceleration,
        }
    }

    fn local_traffic(&self, node: Option<&NodeInfo>, family: IpFamily) -> LocalTraffic {
        let cidrs = |nets: Vec<IpNet>| {
            if nets.is_empty() { LocalTraffic::Undetectable } else { LocalTraffic::SourceCidrs(nets) }
        };
        match &self.policy.detect_local {
            DetectLocal::ClusterCidr(nets) => cidrs(of_family_nets(nets, family)),
            DetectLocal::NodeCidr => cidrs(node.map(|n| of_family_nets(&n.pod_cidrs, family)).unwrap_or_default()),
            DetectLocal::BridgeInterface(name) => LocalTraffic::Interface(name.clone()),
            DetectLocal::InterfaceNamePrefix(prefix) => LocalTraffic::InterfacePrefix(prefix.clone()),
            DetectLocal::None => LocalTraffic::Undetectable,
        }
    }

    fn nodeport_addresses(&self, node_ip: Option<IpAddr>, family: IpFamily) -> NodePortAddresses {
        let local = || self.node.local_addresses.iter().copied().filter(move |ip| IpFamily::of(ip) == family);
        let mut ips = Vec::new();
        for entry in &self.policy.nodeport_addresses {
            match entry {
                NodePortAddress::All if !self.policy.list_local_addresses => {
                    return NodePortAddresses::AllLocal(Vec::new());
                }
                NodePortAddress::All => {
                    // A pod's veth brings an IPv6 link-local address at every pod start: not
                    // an address a NodePort is reached at, and not a reason to resync.
                    let link_local = |ip: &IpAddr| matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local());
                    let mut known: Vec<IpAddr> = local().filter(|ip| !ip.is_loopback() && !link_local(ip)).collect();
                    known.sort();
                    known.dedup();
                    return NodePortAddresses::AllLocal(known);
                }
                NodePortAddress::Primary => ips.extend(node_ip),
                NodePortAddress::Localhost => ips.push(match family {
                    IpFamily::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
                    IpFamily::V6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
                }),
                NodePortAddress::Cidr(net) => ips.extend(local().filter(|ip| net.contains(ip))),
            }
        }
        ips.sort();
        ips.dedup();
        NodePortAddresses::Only(ips)
    }

    fn service_ports(
        &self,
        state: &ClusterState,
        node: &NodePlan,
        svc: &ServiceInfo,
        family: IpFamily,
    ) -> Vec<(ServicePortName, Arc<ServicePortPlan>)> {
        let Some(&cluster_ip) = svc.cluster_ips.iter().find(|ip| IpFamily::of(ip) == family) else {
            return Vec::new();
        };
        let of_family =
            |ips: &[IpAddr]| ips.iter().copied().filter(|ip| IpFamily::of(ip) == family).collect::<Vec<_>>();
        let external_ips = of_family(&svc.external_ips);
        let load_balancer_ips = of_family(&svc.load_balancer_ips);
        let source_ranges = of_family_nets(&svc.load_balancer_source_ranges, family);
        let zone = state.node(&self.node.name).and_then(|n| n.zone().map(str::to_owned));
        let short_circuit_pods = node.local_traffic.is_detectable();

        let mut out = Vec::with_capacity(svc.ports.len());
        for port in &svc.ports {
            let name = ServicePortName {
                namespace: svc.key.namespace.clone(),
                service: svc.key.name.clone(),
                port: port.name.as_str().into(),
                protocol: port.protocol,
            };
            let externally_accessible =
                port.node_port.is_some() || !external_ips.is_empty() || !load_balancer_ips.is_empty();
            let external_local = svc.external_policy_local && externally_accessible;
            let uses_cluster = !svc.internal_policy_local || externally_accessible;
            let uses_local = svc.internal_policy_local || external_local;
            let candidates = self.candidates(state, &svc.key, family, &port.name, port.protocol);
            let cat = categorize_endpoints(&candidates, uses_cluster, uses_local, &self.node.name, zone.as_deref());
            let serving_endpoints = if matches!(port.protocol, Protocol::Udp | Protocol::Sctp) {
                candidates.iter().filter(|c| c.serving).map(|c| SocketAddr::new(c.ip, c.port)).collect()
            } else {
                Vec::new()
            };

            let verdict = |local_policy: bool| {
                if !cat.has_any {
                    Some(NoEndpointsVerdict::Reject)
                } else if local_policy && cat.local.is_empty() {
                    Some(NoEndpointsVerdict::Drop)
                } else {
                    None
                }
            };
            let internal = InternalTraffic {
                local: svc.internal_policy_local,
                masquerade: if self.policy.masquerade_all {
                    MasqueradeWhen::Always
                } else if node.local_traffic.is_detectable() {
                    MasqueradeWhen::SourceNotLocal
                } else {
                    MasqueradeWhen::Never
                },
                no_endpoints: verdict(svc.internal_policy_local),
            };
            let external = externally_accessible.then(|| ExternalTraffic {
                policy: if external_local {
                    ExternalPolicy::Local { short_circuit_pods }
                } else {
                    ExternalPolicy::Cluster
                },
                no_endpoints: verdict(external_local),
            });
            let plan = ServicePortPlan {
                name: name.clone(),
                cluster_ip,
                port: port.port,
                protocol: port.protocol,
                node_port: port.node_port,
                external_ips: external_ips.clone(),
                load_balancer_ips: load_balancer_ips.clone(),
                source_ranges: source_ranges.clone(),
                affinity_timeout: svc.session_affinity_timeout,
                cluster_endpoints: if uses_cluster { cat.cluster } else { Vec::new() },
                local_endpoints: if uses_local { cat.local } else { Vec::new() },
                internal,
                external,
                health_check_node_port: svc.health_check_node_port.filter(|_| external_local),
                accelerate: self.policy.acceleration
                    && svc.traffic_hint == Some(TrafficHint::LongLived)
                    && port.protocol != Protocol::Sctp,
                serving_endpoints,
            };
            out.push((name, Arc::new(plan)));
        }
        out
    }

    /// The endpoints of one service port, merged across slices: an endpoint (IP and port) listed
    /// by several slices counts once, and is local if any listing says so (as upstream does):
    /// the first listing that says it is local, else the first. Sorted by address and port.
    fn candidates(
        &self,
        state: &ClusterState,
        service: &ObjectKey,
        family: IpFamily,
        port_name: &str,
        protocol: Protocol,
    ) -> Vec<Candidate> {
        // Gathered in slice order, then put in order through a vector of small keys (the
        // listing's address, port, whether it is local and its place): a Service of thousands
        // of endpoints is planned again at each of its changes, and a B-tree map of them, or
        // sorting the candidates themselves, cost much of that.
        let mut listed: Vec<Option<Candidate>> = Vec::new();
        for slice in state.slices_of(service).filter(|s| s.family == family) {
            let Some(port) = slice.ports.iter().find(|p| p.name == port_name && p.protocol == protocol) else {
                continue;
            };
            listed.reserve(slice.endpoints.len());
            for ep in &slice.endpoints {
                listed.push(Some(Candidate {
                    ip: ep.ip,
                    port: port.port,
                    is_local: ep.node_name.as_deref() == Some(self.node.name.as_str()),
                    ready: ep.ready,
                    serving: ep.serving,
                    terminating: ep.terminating,
                    zone_hints: ep.zone_hints().clone(),
                    node_hints: ep.node_hints().clone(),
                }));
            }
        }
        let mut order: Vec<(IpAddr, u16, bool, u32)> = listed
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (c.ip, c.port, !c.is_local, i as u32)))
            .collect();
        // The listings of one endpoint: the local ones first, each kind in slice order.
        order.sort_unstable();
        order.dedup_by_key(|(ip, port, _, _)| (*ip, *port));
        order.into_iter().filter_map(|(_, _, _, i)| listed.get_mut(i as usize).and_then(Option::take)).collect()
    }
}

fn of_family_nets(nets: &[IpNet], family: IpFamily) -> Vec<IpNet> {
    nets.iter().copied().filter(|n| IpFamily::of_net(n) == family).collect()
}

#[cfg(test)]
mod tests;

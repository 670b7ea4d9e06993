//! The objects of one service port: its chains, its map elements, and (only with ClientIP
//! affinity) its per-endpoint affinity sets.
//!
//! Chains: `service-*` picks among the cluster-policy endpoints, `local-*` among the local ones,
//! `external-*` applies externalTrafficPolicy to NodePort/ExternalIP/LoadBalancer traffic,
//! `firewall-*` applies loadBalancerSourceRanges. There is no chain per endpoint: the endpoints
//! are elements of the shared maps of [`super::pick`], which the chains end in.
//!
//! ClientIP affinity needs to know which endpoint was picked, so those services keep a cascade
//! of `dnat` rules, one per endpoint (and an endpoint change there is a rule change, which costs
//! the kernel a validation of the table). They use upstream's per-endpoint `affinity-*` sets (type address, dynamic, with
//! the service's timeout), but only for services that ask for affinity. A single shared map
//! keyed by client, service and endpoint would avoid them, but `nft` 1.0.6 can express neither a
//! lookup whose key concatenates packet fields with constants, nor (for IPv6) a dynamic map
//! update with a concatenated key; and a shared map keyed by the service address could not be
//! purged of one removed endpoint without dumping it, so sticky clients would keep going to a
//! dead endpoint until the timeout. A netlink-native executor can build the shared-set form.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kproxy_plan::{Endpoint, ExternalPolicy, MasqueradeWhen, NoEndpointsVerdict, NodePlan, ServicePortPlan};

use super::pick::{self, Class};
use super::skeleton::{
    CLUSTER_IPS, FIREWALL_IPS, HAIRPIN, MARK_FOR_MASQUERADE, NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES, REJECT_CHAIN,
    SERVICE_IPS, SERVICE_NODEPORTS,
};
use super::{Ctx, Destination, addr_port, local_match};
use crate::naming;
use crate::transaction::{Element, SetDef};

/// Everything one service port puts in the table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceObjects {
    /// Chains and their rules, by name.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Per-endpoint affinity sets, by name.
    pub sets: BTreeMap<String, SetDef>,
    /// Elements of the shared maps and sets, by the destination they are keyed by.
    pub destinations: BTreeMap<Destination, Vec<Element>>,
    /// Elements other service ports may want too.
    pub shared: BTreeSet<Shared>,
}

/// An element several service ports may want: in the table while any of them does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Shared {
    /// A ClusterIP (all ports of a service share it).
    ClusterIp(IpAddr),
    /// The hairpin pair of an endpoint address (services may select the same pods).
    Hairpin(IpAddr),
}

impl Shared {
    /// The element.
    pub fn element(self) -> Element {
        match self {
            Shared::ClusterIp(ip) => Element { set: CLUSTER_IPS.to_owned(), key: ip.to_string(), value: None },
            Shared::Hairpin(ip) => Element { set: HAIRPIN.to_owned(), key: format!("{ip} . {ip}"), value: None },
        }
    }
}

impl ServiceObjects {
    fn claim(&mut self, dest: Destination, set: &str, value: Option<String>) {
        let element = Element { set: set.to_owned(), key: dest.key(), value };
        self.destinations.entry(dest).or_default().push(element);
    }
}

fn verdict(v: NoEndpointsVerdict) -> String {
    match v {
        NoEndpointsVerdict::Reject => format!("goto {REJECT_CHAIN}"),
        NoEndpointsVerdict::Drop => "drop".to_owned(),
    }
}

/// Renders one service port.
pub fn render(ctx: &Ctx, node: &NodePlan, p: &ServicePortPlan) -> ServiceObjects {
    let ip = ctx.ip();
    let svc_chain = naming::chain("service", &p.name);
    let local_chain = naming::chain("local", &p.name);
    let ext_chain = naming::chain("external", &p.name);
    let fw_chain = naming::chain("firewall", &p.name);
    let mut out = ServiceObjects::default();

    // ClusterIP masquerading, on the chain ClusterIP traffic enters (guarded by the destination
    // because external traffic also reaches these chains).
    let masq = match p.internal.masquerade {
        MasqueradeWhen::Always => Some(format!("{ip} daddr {} jump {MARK_FOR_MASQUERADE}", p.cluster_ip)),
        MasqueradeWhen::SourceNotLocal => local_match(ctx, &node.local_traffic, true)
            .map(|m| format!("{ip} daddr {} {m} jump {MARK_FOR_MASQUERADE}", p.cluster_ip)),
        MasqueradeWhen::Never => None,
    };
    if p.uses_cluster_endpoints() {
        let mut rules: Vec<String> = masq.iter().filter(|_| !p.internal.local).cloned().collect();
        rules.extend(dispatch(ctx, p, Class::Cluster, &mut out.sets));
        out.chains.insert(svc_chain.clone(), rules);
    }
    if p.uses_local_endpoints() {
        let mut rules: Vec<String> = masq.iter().filter(|_| p.internal.local).cloned().collect();
        rules.extend(dispatch(ctx, p, Class::Local, &mut out.sets));
        out.chains.insert(local_chain.clone(), rules);
    }

    // ClusterIP.
    let dest = |addr: &IpAddr| Destination::Address(*addr, p.protocol, p.port);
    out.shared.insert(Shared::ClusterIp(p.cluster_ip));
    match p.internal.no_endpoints {
        Some(v) => out.claim(dest(&p.cluster_ip), NO_ENDPOINT_SERVICES, Some(verdict(v))),
        None => {
            let target = if p.internal.local { &local_chain } else { &svc_chain };
            out.claim(dest(&p.cluster_ip), SERVICE_IPS, Some(format!("goto {target}")));
        }
    }

    // NodePort, ExternalIPs, LoadBalancer IPs.
    if let Some(ext) = &p.external {
        if let Some(v) = ext.no_endpoints {
            for vip in p.external_vips() {
                out.claim(dest(vip), NO_ENDPOINT_SERVICES, Some(verdict(v)));
            }
            if let Some(np) = p.node_port {
                out.claim(Destination::NodePort(p.protocol, np), NO_ENDPOINT_NODEPORTS, Some(verdict(v)));
            }
        }
        // With Drop (Local policy, no local endpoint) pods and the node itself are still
        // short-circuited to the cluster endpoints; everything else falls through undNATed and
        // hits the drop verdict in the filter chains.
        if ext.no_endpoints != Some(NoEndpointsVerdict::Reject) {
            let mut rules = Vec::new();
            match ext.policy {
                ExternalPolicy::Cluster => {
                    rules.push(format!("jump {MARK_FOR_MASQUERADE}"));
                    rules.push(format!("goto {svc_chain}"));
                }
                ExternalPolicy::Local { short_circuit_pods } => {
                    let short_circuit = local_match(ctx, &node.local_traffic, false).filter(|_| short_circuit_pods);
                    if let Some(m) = short_circuit {
                        rules.push(format!("{m} goto {svc_chain}"));
                    }
                    rules.push(format!("fib saddr type local jump {MARK_FOR_MASQUERADE}"));
                    rules.push(format!("fib saddr type local goto {svc_chain}"));
                    rules.push(format!("goto {local_chain}"));
                }
            }
            out.chains.insert(ext_chain.clone(), rules);
            for vip in p.external_vips() {
                out.claim(dest(vip), SERVICE_IPS, Some(format!("goto {ext_chain}")));
            }
            if let Some(np) = p.node_port {
                out.claim(Destination::NodePort(p.protocol, np), SERVICE_NODEPORTS, Some(format!("goto {ext_chain}")));
            }
        }
        if !p.source_ranges.is_empty() && !p.load_balancer_ips.is_empty() {
            let mut rules: Vec<String> = p.source_ranges.iter().map(|r| format!("{ip} saddr {r} return")).collect();
            // Traffic from the node to its own LB IP may carry the LB IP as source.
            if node.node_ip.is_some_and(|n| p.source_ranges.iter().any(|r| r.contains(&n))) {
                rules.extend(p.load_balancer_ips.iter().map(|lb| format!("{ip} saddr {lb} return")));
            }
            rules.push("drop".to_owned());
            out.chains.insert(fw_chain.clone(), rules);
            for lb in &p.load_balancer_ips {
                out.claim(dest(lb), FIREWALL_IPS, Some(format!("goto {fw_chain}")));
            }
        }
    }

    if p.affinity_timeout.is_none() {
        for (d, element) in pick::elements(p) {
            out.destinations.entry(d).or_default().push(element);
        }
    }
    out.shared.extend(p.reachable_endpoints().into_iter().map(|ep| Shared::Hairpin(ep.ip)));
    for elements in out.destinations.values_mut() {
        elements.sort();
        elements.dedup();
    }
    out
}

/// The endpoint-picking rules: the shared pick chain of the class, or with ClientIP affinity the
/// affinity hits first, then a uniform random cascade.
fn dispatch(ctx: &Ctx, p: &ServicePortPlan, class: Class, sets: &mut BTreeMap<String, SetDef>) -> Vec<String> {
    if p.affinity_timeout.is_none() {
        return vec![format!("goto {}", class.chain())];
    }
    let endpoints: &[Endpoint] = match class {
        Class::Cluster => &p.cluster_endpoints,
        Class::Local => &p.local_endpoints,
    };
    let ip = ctx.ip();
    let proto = p.protocol.as_str();
    let dnat = |ep: &Endpoint| format!("meta l4proto {proto} dnat to {}", addr_port(ep.ip, ep.port));
    let mut rules = Vec::new();
    let affinity: Vec<Option<String>> = endpoints
        .iter()
        .map(|ep| {
            p.affinity_timeout.map(|timeout| {
                let name = naming::affinity_set(&p.name, ep.ip, ep.port);
                sets.insert(
                    name.clone(),
                    SetDef {
                        name: name.clone(),
                        key_type: ctx.addr_type().to_owned(),
                        data_type: None,
                        by_typeof: false,
                        flags: vec!["dynamic", "timeout"],
                        timeout: Some(timeout),
                        size: None,
                        comment: None,
                    },
                );
                name
            })
        })
        .collect();
    for (ep, set) in endpoints.iter().zip(&affinity) {
        if let Some(set) = set {
            rules.push(format!("{ip} saddr @{set} update @{set} {{ {ip} saddr }} {}", dnat(ep)));
        }
    }
    let n = endpoints.len();
    for (i, (ep, set)) in endpoints.iter().zip(&affinity).enumerate() {
        let mut rule = String::new();
        if i + 1 < n {
            rule.push_str(&format!("numgen random mod {} == 0 ", n - i));
        }
        if let Some(set) = set {
            rule.push_str(&format!("update @{set} {{ {ip} saddr }} "));
        }
        rule.push_str(&dnat(ep));
        rules.push(rule);
    }
    rules
}

//! The objects of one service port: its map elements, and the chains and sets only some
//! service ports have of their own.
//!
//! A service port is mostly elements: its destinations in the dispatch maps point at chains
//! shared by every service port with the same traffic policies ([`shared_chains`]:
//! `service-<class>[-masquerade…]` for ClusterIP traffic, `external-*` for externalTrafficPolicy),
//! which end in the endpoint pick of [`super::pick`]; loadBalancerSourceRanges are elements of
//! the shared `firewall-dests` / `firewall-allow` sets. Every nf_tables commit walks every chain
//! of the table, so chains per service would make every sync cost grow with the cluster.
//!
//! Only ClientIP affinity has chains of its own (`service-*` / `local-*` / `external-*`):
//! affinity must know which endpoint was picked, so those services keep a cascade of `dnat`
//! rules, one per endpoint, and an endpoint change there is a rule change (which costs the kernel
//! a validation of the table). Each has one dynamic `affinity-*` set with the service's timeout,
//! keyed by client and a stable endpoint id (a hash of the endpoint's address and port), where
//! upstream has a set per endpoint: the kernel finds a set by walking the table's list of sets
//! by name, so a set per endpoint made creating and referencing them quadratic. A removed
//! endpoint's entries are never looked up again and expire. Shared affinity chains would need a
//! map lookup as the data of a dynamic-set update, which nft 1.0.6 cannot express.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use kproxy_plan::{Endpoint, ExternalPolicy, MasqueradeWhen, NoEndpointsVerdict, NodePlan, ServicePortPlan};

use super::pick::{self, Class};
use super::skeleton::{
    CLUSTER_IPS, FIREWALL_ALLOW, FIREWALL_DESTS, HAIRPIN, MARK_FOR_MASQUERADE, NO_ENDPOINT_NODEPORTS,
    NO_ENDPOINT_SERVICES, REJECT_CHAIN, SERVICE_IPS, SERVICE_NODEPORTS,
};
use super::{Ctx, Destination, addr_port, local_match};
use crate::naming;
use crate::transaction::{Chain, Element, SetDef};

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

/// The shared chain ClusterIP traffic of the given class and masquerading enters.
fn shared_service_chain(class: Class, masquerade: MasqueradeWhen) -> String {
    let suffix = match masquerade {
        MasqueradeWhen::Always => "-masquerade",
        MasqueradeWhen::SourceNotLocal => "-masquerade-remote",
        MasqueradeWhen::Never => "",
    };
    format!("service-{}{suffix}", class.name())
}

/// The shared chain NodePort / ExternalIP / LoadBalancer traffic with `policy` enters.
fn shared_external_chain(policy: ExternalPolicy) -> &'static str {
    match policy {
        ExternalPolicy::Cluster => "external-cluster",
        ExternalPolicy::Local { short_circuit_pods: true } => "external-local-pods-to-cluster",
        ExternalPolicy::Local { short_circuit_pods: false } => "external-local",
    }
}

/// The masquerade rule for ClusterIP traffic; `guard` restricts it to the service's ClusterIP
/// (per-service chains are entered by external traffic too).
fn masquerade_rule(ctx: &Ctx, node: &NodePlan, when: MasqueradeWhen, guard: Option<IpAddr>) -> Option<String> {
    let ip = ctx.ip();
    let guard = guard.map(|g| format!("{ip} daddr {g} ")).unwrap_or_default();
    match when {
        MasqueradeWhen::Always => Some(format!("{guard}jump {MARK_FOR_MASQUERADE}")),
        MasqueradeWhen::SourceNotLocal => {
            local_match(ctx, &node.local_traffic, true).map(|m| format!("{guard}{m} jump {MARK_FOR_MASQUERADE}"))
        }
        MasqueradeWhen::Never => None,
    }
}

/// The rules that apply externalTrafficPolicy, ending in `cluster` or `local`.
fn external_rules(ctx: &Ctx, node: &NodePlan, policy: ExternalPolicy, cluster: &str, local: &str) -> Vec<String> {
    match policy {
        ExternalPolicy::Cluster => vec![format!("jump {MARK_FOR_MASQUERADE}"), format!("goto {cluster}")],
        ExternalPolicy::Local { short_circuit_pods } => {
            let mut rules = Vec::new();
            if let Some(m) = local_match(ctx, &node.local_traffic, false).filter(|_| short_circuit_pods) {
                rules.push(format!("{m} goto {cluster}"));
            }
            rules.push(format!("fib saddr type local jump {MARK_FOR_MASQUERADE}"));
            rules.push(format!("fib saddr type local goto {cluster}"));
            rules.push(format!("goto {local}"));
            rules
        }
    }
}

/// The chains every service port without ClientIP affinity shares: what its traffic does
/// depends only on its traffic policies, and its endpoints are map elements (see
/// [`super::pick`]). Sharing them keeps the table's chain count independent of the number of
/// services, which matters because every commit walks every chain of the table.
pub fn shared_chains(ctx: &Ctx, node: &NodePlan) -> Vec<(Chain, Vec<String>)> {
    let mut chains = Vec::new();
    for class in [Class::Cluster, Class::Local] {
        for when in [MasqueradeWhen::Never, MasqueradeWhen::Always, MasqueradeWhen::SourceNotLocal] {
            let mut rules: Vec<String> = masquerade_rule(ctx, node, when, None).into_iter().collect();
            rules.push(format!("goto {}", class.chain()));
            chains.push((Chain { name: shared_service_chain(class, when), hook: None }, rules));
        }
    }
    let policies = [
        ExternalPolicy::Cluster,
        ExternalPolicy::Local { short_circuit_pods: true },
        ExternalPolicy::Local { short_circuit_pods: false },
    ];
    for policy in policies {
        let rules = external_rules(ctx, node, policy, &Class::Cluster.chain(), &Class::Local.chain());
        chains.push((Chain { name: shared_external_chain(policy).to_owned(), hook: None }, rules));
    }
    chains
}

/// Renders one service port.
pub fn render(ctx: &Ctx, node: &NodePlan, p: &ServicePortPlan) -> ServiceObjects {
    let mut out = ServiceObjects::default();
    let internal_class = if p.internal.local { Class::Local } else { Class::Cluster };

    // The chains ClusterIP and external traffic enter: shared ones, unless ClientIP affinity
    // needs per-endpoint rules in chains of the service port's own.
    // With Reject (no endpoints at all) external traffic enters no chain.
    let entered = p.external.as_ref().filter(|e| e.no_endpoints != Some(NoEndpointsVerdict::Reject));
    let (cluster_ip_chain, external_chain) = if p.affinity_timeout.is_none() {
        let external = entered.map(|e| shared_external_chain(e.policy).to_owned());
        (shared_service_chain(internal_class, p.internal.masquerade), external)
    } else {
        let svc_chain = naming::chain("service", &p.name);
        let local_chain = naming::chain("local", &p.name);
        let masq = masquerade_rule(ctx, node, p.internal.masquerade, Some(p.cluster_ip));
        if p.uses_cluster_endpoints() {
            let mut rules: Vec<String> = masq.iter().filter(|_| !p.internal.local).cloned().collect();
            rules.extend(affinity_dispatch(ctx, p, &p.cluster_endpoints, &mut out.sets));
            out.chains.insert(svc_chain.clone(), rules);
        }
        if p.uses_local_endpoints() {
            let mut rules: Vec<String> = masq.iter().filter(|_| p.internal.local).cloned().collect();
            rules.extend(affinity_dispatch(ctx, p, &p.local_endpoints, &mut out.sets));
            out.chains.insert(local_chain.clone(), rules);
        }
        let external = entered.map(|e| {
            let ext_chain = naming::chain("external", &p.name);
            out.chains.insert(ext_chain.clone(), external_rules(ctx, node, e.policy, &svc_chain, &local_chain));
            ext_chain
        });
        (if p.internal.local { local_chain } else { svc_chain }, external)
    };

    // ClusterIP.
    let dest = |addr: &IpAddr| Destination::Address(*addr, p.protocol, p.port);
    out.shared.insert(Shared::ClusterIp(p.cluster_ip));
    match p.internal.no_endpoints {
        Some(v) => out.claim(dest(&p.cluster_ip), NO_ENDPOINT_SERVICES, Some(verdict(v))),
        None => out.claim(dest(&p.cluster_ip), SERVICE_IPS, Some(format!("goto {cluster_ip_chain}"))),
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
        if let Some(chain) = &external_chain {
            for vip in p.external_vips() {
                out.claim(dest(vip), SERVICE_IPS, Some(format!("goto {chain}")));
            }
            if let Some(np) = p.node_port {
                out.claim(Destination::NodePort(p.protocol, np), SERVICE_NODEPORTS, Some(format!("goto {chain}")));
            }
        }
        if !p.source_ranges.is_empty() && !p.load_balancer_ips.is_empty() {
            let mut allowed: Vec<IpNet> = p.source_ranges.clone();
            // Traffic from the node to its own LB IP may carry the LB IP as source.
            if node.node_ip.is_some_and(|n| p.source_ranges.iter().any(|r| r.contains(&n))) {
                allowed.extend(p.load_balancer_ips.iter().map(|lb| IpNet::from(*lb)));
            }
            // The kernel ignores a range inside another one (and could not delete it later):
            // only disjoint ranges go in.
            let allowed: Vec<String> = IpNet::aggregate(&allowed).iter().map(ToString::to_string).collect();
            for lb in &p.load_balancer_ips {
                let d = dest(lb);
                out.claim(d, FIREWALL_DESTS, None);
                let key = d.key();
                let ranges = allowed.iter().map(|r| Element {
                    set: FIREWALL_ALLOW.to_owned(),
                    key: format!("{key} . {r}"),
                    value: None,
                });
                out.destinations.entry(d).or_default().extend(ranges);
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

/// ClientIP affinity: the affinity hits first, then a uniform random cascade over `endpoints`.
fn affinity_dispatch(
    ctx: &Ctx,
    p: &ServicePortPlan,
    endpoints: &[Endpoint],
    sets: &mut BTreeMap<String, SetDef>,
) -> Vec<String> {
    let ip = ctx.ip();
    let proto = p.protocol.as_str();
    let Some(timeout) = p.affinity_timeout else { return Vec::new() };
    let set = naming::chain("affinity", &p.name);
    sets.insert(
        set.clone(),
        SetDef {
            by_typeof: true,
            flags: vec!["dynamic", "timeout"],
            timeout: Some(timeout),
            ..SetDef::new(&set, format!("{ip} saddr . numgen random mod 2"))
        },
    );
    // `client . endpoint id`: the id is written as a constant-valued numgen, the one way nft
    // 1.0.6 accepts a constant inside a concatenation.
    let key =
        |ep: &Endpoint| format!("{ip} saddr . numgen random mod 1 offset {}", naming::endpoint_id(ep.ip, ep.port));
    let dnat = |ep: &Endpoint| format!("meta l4proto {proto} dnat to {}", addr_port(ep.ip, ep.port));
    let mut rules: Vec<String> =
        endpoints.iter().map(|ep| format!("{k} @{set} update @{set} {{ {k} }} {}", dnat(ep), k = key(ep))).collect();
    let n = endpoints.len();
    for (i, ep) in endpoints.iter().enumerate() {
        let draw = if i + 1 < n { format!("numgen random mod {} == 0 ", n - i) } else { String::new() };
        rules.push(format!("{draw}update @{set} {{ {} }} {}", key(ep), dnat(ep)));
    }
    rules
}

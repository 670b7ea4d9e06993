//! The objects of one service port: its map elements, and the chains only some service ports
//! have of their own.
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
//! a validation of the table). Their sticky clients are entries of one dynamic set per table,
//! [`CLIENT_AFFINITY`], keyed by client and a stable id of the service port and endpoint
//! ([`naming::affinity_id`]), each entry with its service's timeout. Upstream has a set per
//! endpoint, and kproxy had one per service port: the kernel finds a set by walking the table's
//! list of sets by name, once per rule that reads or updates it, so sets per service made
//! creating them quadratic (at 100,000 Services, 1 % of them with affinity, the dataplane's
//! cold start took 2.0 s with a set per service port and takes 1.6–1.9 s with one set:
//! docs/benchmarks.md, "One affinity set per table"). A removed endpoint's entries are never
//! looked up again and expire. Shared affinity chains would need a map lookup as the data of a
//! dynamic-set update, which nft 1.0.6 cannot express.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use kproxy_nft_model::{Chain, Element, Field, Key, MapData, NatKind, Rule, Stmt, Value, Verdict};
use kproxy_plan::{Endpoint, ExternalPolicy, MasqueradeWhen, NoEndpointsVerdict, NodePlan, ServicePortPlan};

use super::pick::{self, Class};
use super::skeleton::{
    CLIENT_AFFINITY, CLUSTER_IPS, FIREWALL_ALLOW, FIREWALL_DESTS, HAIRPIN, MARK_FOR_MASQUERADE, NO_ENDPOINT_NODEPORTS,
    NO_ENDPOINT_SERVICES, NODEPORT_TRAFFIC, REJECT_CHAIN, SERVICE_IPS, SERVICE_NODEPORTS, SERVICE_TRAFFIC,
};
use super::{Ctx, Destination, local_match};
use crate::naming;

/// Everything one service port puts in the table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceObjects {
    /// Chains and their rules, by name.
    pub chains: BTreeMap<String, Vec<Rule>>,
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
            Shared::ClusterIp(ip) => Element::new(CLUSTER_IPS, Value::Addr(ip)),
            Shared::Hairpin(ip) => Element::new(HAIRPIN, Key(vec![Value::Addr(ip), Value::Addr(ip)])),
        }
    }
}

impl ServiceObjects {
    fn claim(&mut self, dest: Destination, set: &str, value: Option<Verdict>) {
        let element = Element { set: set.to_owned(), key: dest.key(), value: value.map(MapData::Verdict) };
        self.destinations.entry(dest).or_default().push(element);
    }
}

fn verdict(v: NoEndpointsVerdict) -> Verdict {
    match v {
        NoEndpointsVerdict::Reject => Verdict::goto(REJECT_CHAIN),
        NoEndpointsVerdict::Drop => Verdict::Drop,
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
fn masquerade_rule(ctx: &Ctx, node: &NodePlan, when: MasqueradeWhen, guard: Option<IpAddr>) -> Option<Rule> {
    let mut rule = Rule::new(guard.map(|g| Stmt::eq(ctx.daddr(), Value::Addr(g))));
    match when {
        MasqueradeWhen::Always => {}
        MasqueradeWhen::SourceNotLocal => rule.0.push(local_match(ctx, &node.local_traffic, true)?),
        MasqueradeWhen::Never => return None,
    }
    Some(rule.then(Stmt::jump(MARK_FOR_MASQUERADE)))
}

/// The rules that apply externalTrafficPolicy, ending in `cluster` or `local`.
fn external_rules(ctx: &Ctx, node: &NodePlan, policy: ExternalPolicy, cluster: &str, local: &str) -> Vec<Rule> {
    match policy {
        ExternalPolicy::Cluster => vec![Stmt::jump(MARK_FOR_MASQUERADE).into(), Stmt::goto(cluster).into()],
        ExternalPolicy::Local { short_circuit_pods } => {
            let mut rules = Vec::new();
            if let Some(m) = local_match(ctx, &node.local_traffic, false).filter(|_| short_circuit_pods) {
                rules.push(Rule::new([m, Stmt::goto(cluster)]));
            }
            let from_node = || Stmt::FibLocal { saddr: true };
            rules.push(Rule::new([from_node(), Stmt::jump(MARK_FOR_MASQUERADE)]));
            rules.push(Rule::new([from_node(), Stmt::goto(cluster)]));
            rules.push(Stmt::goto(local).into());
            rules
        }
    }
}

/// The chains every service port without ClientIP affinity shares: what its traffic does
/// depends only on its traffic policies, and its endpoints are map elements (see
/// [`super::pick`]). Sharing them keeps the table's chain count independent of the number of
/// services, which matters because every commit walks every chain of the table.
pub fn shared_chains(ctx: &Ctx, node: &NodePlan) -> Vec<(Chain, Vec<Rule>)> {
    let mut chains = Vec::new();
    for class in [Class::Cluster, Class::Local] {
        for when in [MasqueradeWhen::Never, MasqueradeWhen::Always, MasqueradeWhen::SourceNotLocal] {
            let mut rules: Vec<Rule> = masquerade_rule(ctx, node, when, None).into_iter().collect();
            rules.push(Stmt::goto(class.chain()).into());
            chains.push((Chain::regular(shared_service_chain(class, when)), rules));
        }
    }
    let policies = [
        ExternalPolicy::Cluster,
        ExternalPolicy::Local { short_circuit_pods: true },
        ExternalPolicy::Local { short_circuit_pods: false },
    ];
    for policy in policies {
        let rules = external_rules(ctx, node, policy, &Class::Cluster.chain(), &Class::Local.chain());
        chains.push((Chain::regular(shared_external_chain(policy)), rules));
    }
    chains
}

/// Renders one service port, with its endpoints in `slots` (see [`pick::Slots`]).
pub fn render(ctx: &Ctx, node: &NodePlan, p: &ServicePortPlan, slots: &pick::Slots) -> ServiceObjects {
    render_with(ctx, node, p, slots, true)
}

/// Renders one service port without the endpoints-map elements of its destinations, which a
/// partial sync compares slot by slot instead ([`pick::endpoint_elements_difference`]): in a
/// Service of thousands of endpoints they are thousands of elements, where everything else is a
/// few.
pub fn render_without_endpoints(
    ctx: &Ctx,
    node: &NodePlan,
    p: &ServicePortPlan,
    slots: &pick::Slots,
) -> ServiceObjects {
    render_with(ctx, node, p, slots, false)
}

fn render_with(
    ctx: &Ctx,
    node: &NodePlan,
    p: &ServicePortPlan,
    slots: &pick::Slots,
    endpoints: bool,
) -> ServiceObjects {
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
            let mut rules: Vec<Rule> = masq.iter().filter(|_| !p.internal.local).cloned().collect();
            rules.extend(affinity_dispatch(ctx, p, &p.cluster_endpoints));
            out.chains.insert(svc_chain.clone(), rules);
        }
        if p.uses_local_endpoints() {
            let mut rules: Vec<Rule> = masq.iter().filter(|_| p.internal.local).cloned().collect();
            rules.extend(affinity_dispatch(ctx, p, &p.local_endpoints));
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
        None => out.claim(dest(&p.cluster_ip), SERVICE_IPS, Some(Verdict::goto(cluster_ip_chain))),
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
                out.claim(dest(vip), SERVICE_IPS, Some(Verdict::goto(chain.as_str())));
            }
            if let Some(np) = p.node_port {
                out.claim(
                    Destination::NodePort(p.protocol, np),
                    SERVICE_NODEPORTS,
                    Some(Verdict::goto(chain.as_str())),
                );
            }
        }
        let allowed = p.firewall_allowed_sources(node.node_ip);
        if !allowed.is_empty() {
            // The kernel ignores a range inside another one (and could not delete it later):
            // only disjoint ranges go in.
            let allowed = IpNet::aggregate(&allowed);
            for lb in &p.load_balancer_ips {
                let d = dest(lb);
                out.claim(d, FIREWALL_DESTS, None);
                let ranges = allowed.iter().map(|r| {
                    let mut key = d.values();
                    key.push(Value::Prefix(*r));
                    Element::new(FIREWALL_ALLOW, Key(key))
                });
                out.destinations.entry(d).or_default().extend(ranges);
            }
        }
    }

    if ctx.service_counters {
        // Every destination keeps its traffic counter, served or not: a counter survives
        // endpoints coming and going.
        let mut counted: Vec<Destination> = vec![dest(&p.cluster_ip)];
        if p.external.is_some() {
            counted.extend(p.external_vips().map(dest));
            counted.extend(p.node_port.map(|np| Destination::NodePort(p.protocol, np)));
        }
        for d in counted {
            let set = if matches!(d, Destination::NodePort(..)) { NODEPORT_TRAFFIC } else { SERVICE_TRAFFIC };
            out.destinations.entry(d).or_default().push(Element { set: set.to_owned(), key: d.key(), value: None });
        }
    }

    if p.affinity_timeout.is_none() {
        let picks = if endpoints { pick::elements(p, slots) } else { pick::cap_elements(p, slots) };
        for (d, element) in picks {
            out.destinations.entry(d).or_default().push(element);
        }
    }
    out.shared.extend(p.hairpin_endpoints().into_iter().map(|ep| Shared::Hairpin(ep.ip)));
    for elements in out.destinations.values_mut() {
        elements.sort();
        elements.dedup();
    }
    out
}

/// ClientIP affinity: the affinity hits first, then a uniform random cascade over `endpoints`
/// that records the pick, then the same cascade without recording it. A full set fails the
/// update and with it the rule (the kernel's `NFT_BREAK`); the last cascade makes a full set
/// cost new clients their stickiness, not their connection, as upstream's separate update rule
/// does.
fn affinity_dispatch(ctx: &Ctx, p: &ServicePortPlan, endpoints: &[Endpoint]) -> Vec<Rule> {
    let Some(timeout) = p.affinity_timeout else { return Vec::new() };
    // `client . id`: the id's halves are written as constant-valued numgens, the one way nft
    // 1.0.6 accepts a constant inside a concatenation. One key per endpoint, used three times.
    let keys: Vec<Vec<Field>> = endpoints
        .iter()
        .map(|ep| {
            let [high, low] = naming::affinity_id(&p.name, timeout, ep.ip, ep.port);
            vec![ctx.saddr(), Field::Constant(high), Field::Constant(low)]
        })
        .collect();
    let update =
        |key: &[Field]| Stmt::Update { set: CLIENT_AFFINITY.to_owned(), key: key.to_vec(), timeout: Some(timeout) };
    let dnat = |ep: &Endpoint| {
        [
            Stmt::l4proto(p.protocol),
            Stmt::Nat { kind: NatKind::Dnat, addr: ep.ip, port: Some(ep.port), fully_random: false },
        ]
    };
    let mut rules: Vec<Rule> = endpoints
        .iter()
        .zip(&keys)
        .map(|(ep, key)| {
            let mut r = Rule::new([Stmt::member(key.clone(), CLIENT_AFFINITY), update(key)]);
            r.0.extend(dnat(ep));
            r
        })
        .collect();
    let n = endpoints.len();
    for recorded in [true, false] {
        for (i, (ep, key)) in endpoints.iter().zip(&keys).enumerate() {
            let mut r = Rule::default();
            if i + 1 < n {
                r.0.push(Stmt::NumgenEq { modulus: (n - i) as u32, value: 0 });
            }
            if recorded {
                r.0.push(update(key));
            }
            r.0.extend(dnat(ep));
            rules.push(r);
        }
    }
    rules
}

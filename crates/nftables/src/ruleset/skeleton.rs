//! The fixed part of each table: base chains at upstream's hook priorities, the dispatch maps,
//! and the node-wide rules (node ports, masquerading, no-endpoint checks).

use kproxy_plan::{LocalTraffic, NoMasqueradeSource, NodePlan, NodePortAddresses, SnatSource};

use super::{Ctx, local_match};
use crate::transaction::{Chain, Element, Hook, SetDef};

/// Set of ClusterIPs (for rejecting traffic to ports no service has).
pub const CLUSTER_IPS: &str = "cluster-ips";
/// Set of addresses that accept NodePort traffic.
pub const NODEPORT_IPS: &str = "nodeport-ips";
/// Interval set of local pod CIDRs (detect-local `ClusterCIDR` / `NodeCIDR`).
pub const POD_CIDRS: &str = "pod-cidrs";
/// Set of `endpoint . endpoint` pairs: after DNAT, a packet from an endpoint to itself is hairpin.
pub const HAIRPIN: &str = "hairpin-endpoints";
/// `addr . proto . port : verdict` for ClusterIP, ExternalIP and LoadBalancer IP traffic.
pub const SERVICE_IPS: &str = "service-ips";
/// `proto . port : verdict` for NodePort traffic.
pub const SERVICE_NODEPORTS: &str = "service-nodeports";
/// `addr . proto . port : verdict` for destinations without endpoints.
pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
/// `proto . port : verdict` for node ports without endpoints.
pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
/// `addr . proto . port` of destinations subject to loadBalancerSourceRanges.
pub const FIREWALL_DESTS: &str = "firewall-dests";
/// `addr . proto . port . source range` (concatenated ranges): the sources each of them allows.
pub const FIREWALL_ALLOW: &str = "firewall-allow";

/// Regular chain the service maps hang off.
pub const SERVICES: &str = "services";
/// Marks a packet for masquerading.
pub const MARK_FOR_MASQUERADE: &str = "mark-for-masquerade";
/// Rejects (TCP reset / ICMP port unreachable).
pub const REJECT_CHAIN: &str = "reject-chain";

/// The skeleton of one family's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skeleton {
    /// Chains with their rules, base chains first.
    pub chains: Vec<(Chain, Vec<String>)>,
    /// Sets and maps.
    pub sets: Vec<SetDef>,
    /// Node-wide elements (node port addresses, pod CIDRs).
    pub elements: Vec<Element>,
}

fn hook(kind: &'static str, hook: &'static str, priority: &'static str) -> Option<Hook> {
    Some(Hook { kind, hook, priority })
}

fn set(name: &str, key: String, data: Option<&str>, flags: Vec<&'static str>, comment: &str) -> SetDef {
    SetDef { data_type: data.map(str::to_owned), flags, comment: Some(comment.to_owned()), ..SetDef::new(name, key) }
}

/// KEP-6246: marked packets from the node or its local pods to a no-masquerade destination
/// (matched after DNAT, so on the chosen endpoint) leave `masquerading` untranslated. Hairpin was
/// sent to `masquerade-now` before these rules, and traffic from elsewhere does not match them.
fn no_masquerade_rules(ctx: &Ctx, node: &NodePlan) -> Vec<String> {
    let ip = ctx.ip();
    let mut rules = Vec::new();
    for source in node.no_masquerade_sources() {
        let from = match source {
            NoMasqueradeSource::Node => Some(format!("fib saddr type local {ip} saddr != {}", ctx.loopback())),
            NoMasqueradeSource::LocalPods => local_match(ctx, &node.local_traffic, false),
        };
        let Some(from) = from else { continue };
        rules.extend(node.snat.no_masquerade_cidrs.iter().map(|c| format!("{from} {ip} daddr {c} return")));
    }
    rules
}

/// Renders the skeleton for `node`.
pub fn render(ctx: &Ctx, node: &NodePlan) -> Skeleton {
    let ip = ctx.ip();
    let a = ctx.addr_type();
    let m = ctx.mark;
    let dest = format!("{ip} daddr . meta l4proto . th dport");
    let nodeport_match = match &node.nodeport_addresses {
        NodePortAddresses::AllLocal => format!("fib daddr type local {ip} daddr != {}", ctx.loopback()),
        NodePortAddresses::Only(_) => format!("{ip} daddr @{NODEPORT_IPS}"),
    };
    let base = |name: &str, h: Option<Hook>| Chain { name: name.to_owned(), hook: h };
    let new = "ct state new";
    let mut masquerading = vec![
        format!("ct status dnat {ip} saddr . {ip} daddr @{HAIRPIN} goto masquerade-now"),
        format!("mark and {m:#x} == 0 return"),
        format!("mark set mark and {:#x}", !m),
    ];
    masquerading.extend(no_masquerade_rules(ctx, node));
    masquerading.push("goto masquerade-now".to_owned());
    let snat = match node.snat.source {
        SnatSource::Masquerade => "masquerade fully-random".to_owned(),
        SnatSource::NodeIp(addr) => format!("snat to {addr} fully-random"),
    };
    let mut cluster_ips_check = vec![format!("{ip} daddr @{CLUSTER_IPS} reject")];
    cluster_ips_check.extend(node.service_cidrs.iter().map(|c| format!("{ip} daddr {c} drop")));

    let chains = vec![
        (
            base("filter-prerouting-pre-dnat", hook("filter", "prerouting", "-110")),
            vec![format!("{new} jump firewall-check")],
        ),
        (base("filter-output-pre-dnat", hook("filter", "output", "-110")), vec![format!("{new} jump firewall-check")]),
        (base("nat-prerouting", hook("nat", "prerouting", "-100")), vec![format!("jump {SERVICES}")]),
        (base("nat-output", hook("nat", "output", "-100")), vec![format!("jump {SERVICES}")]),
        (
            base("filter-forward", hook("filter", "forward", "0")),
            vec![format!("{new} jump service-endpoints-check"), format!("{new} jump cluster-ips-check")],
        ),
        (
            base("filter-input", hook("filter", "input", "0")),
            vec![format!("{new} jump nodeport-endpoints-check"), format!("{new} jump service-endpoints-check")],
        ),
        (
            base("filter-output", hook("filter", "output", "0")),
            vec![format!("{new} jump service-endpoints-check"), format!("{new} jump cluster-ips-check")],
        ),
        (base("nat-postrouting", hook("nat", "postrouting", "100")), vec!["jump masquerading".to_owned()]),
        (
            base("firewall-check", None),
            vec![format!("{dest} @{FIREWALL_DESTS} {dest} . {ip} saddr != @{FIREWALL_ALLOW} drop")],
        ),
        (
            base(SERVICES, None),
            vec![
                format!("{dest} vmap @{SERVICE_IPS}"),
                format!("{nodeport_match} meta l4proto . th dport vmap @{SERVICE_NODEPORTS}"),
            ],
        ),
        (base("service-endpoints-check", None), vec![format!("{dest} vmap @{NO_ENDPOINT_SERVICES}")]),
        (
            base("nodeport-endpoints-check", None),
            vec![format!("{nodeport_match} meta l4proto . th dport vmap @{NO_ENDPOINT_NODEPORTS}")],
        ),
        (base("cluster-ips-check", None), cluster_ips_check),
        (base(MARK_FOR_MASQUERADE, None), vec![ctx.mark_rule()]),
        (base("masquerading", None), masquerading),
        (base("masquerade-now", None), vec![format!("mark set mark and {:#x}", !m), snat]),
        (base(REJECT_CHAIN, None), vec!["meta l4proto tcp reject with tcp reset".to_owned(), "reject".to_owned()]),
    ];

    let (pick_chains, pick_sets) = super::pick::skeleton(ctx);
    let mut chains = chains;
    chains.extend(super::service::shared_chains(ctx, node));
    chains.extend(pick_chains);

    let dest_key = format!("{a} . inet_proto . inet_service");
    let port_key = "inet_proto . inet_service".to_owned();
    let mut sets = vec![
        set(CLUSTER_IPS, a.to_owned(), None, vec![], "Active ClusterIPs"),
        set(NODEPORT_IPS, a.to_owned(), None, vec![], "IPs that accept NodePort traffic"),
        set(POD_CIDRS, a.to_owned(), None, vec!["interval"], "Local pod CIDRs (detect-local)"),
        set(HAIRPIN, format!("{a} . {a}"), None, vec![], "Endpoint pairs whose traffic is hairpin"),
        set(
            SERVICE_IPS,
            dest_key.clone(),
            Some("verdict"),
            vec![],
            "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        ),
        set(SERVICE_NODEPORTS, port_key.clone(), Some("verdict"), vec![], "NodePort traffic"),
        set(
            NO_ENDPOINT_SERVICES,
            dest_key.clone(),
            Some("verdict"),
            vec![],
            "vmap to drop or reject packets to services with no endpoints",
        ),
        set(
            NO_ENDPOINT_NODEPORTS,
            port_key,
            Some("verdict"),
            vec![],
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        set(
            FIREWALL_DESTS,
            dest_key.clone(),
            None,
            vec![],
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        set(
            FIREWALL_ALLOW,
            format!("{dest_key} . {a}"),
            None,
            vec!["interval"],
            "the source ranges each of them allows",
        ),
    ];
    sets.extend(pick_sets);

    let mut elements = Vec::new();
    if let NodePortAddresses::Only(ips) = &node.nodeport_addresses {
        elements.extend(ips.iter().map(|ip| Element { set: NODEPORT_IPS.into(), key: ip.to_string(), value: None }));
    }
    if let LocalTraffic::SourceCidrs(nets) = &node.local_traffic {
        elements.extend(nets.iter().map(|n| Element { set: POD_CIDRS.into(), key: n.to_string(), value: None }));
    }
    Skeleton { chains, sets, elements }
}

#[cfg(test)]
mod tests {
    use kproxy_plan::{SnatPolicy, SnatSource};

    use super::*;

    fn node(local: LocalTraffic, cidrs: &[&str]) -> NodePlan {
        NodePlan {
            node_ip: None,
            local_traffic: local,
            nodeport_addresses: NodePortAddresses::Only(Vec::new()),
            snat: SnatPolicy {
                no_masquerade_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
                source: SnatSource::Masquerade,
                fell_back_to_masquerade: false,
            },
            service_cidrs: Vec::new(),
            acceleration: false,
        }
    }

    fn masquerading(ctx: &Ctx, node: &NodePlan) -> Vec<String> {
        let skel = render(ctx, node);
        skel.chains.into_iter().find(|(c, _)| c.name == "masquerading").map(|(_, r)| r).unwrap()
    }

    #[test]
    fn no_masquerade_cidrs_exempt_only_the_node_and_local_pods_after_hairpin() {
        let ctx = Ctx::new(kproxy_state::IpFamily::V4, "kproxy", 0x4000);
        let rules = masquerading(&ctx, &node(LocalTraffic::InterfacePrefix("veth".into()), &["198.18.16.0/20"]));
        assert_eq!(
            rules,
            [
                "ct status dnat ip saddr . ip daddr @hairpin-endpoints goto masquerade-now",
                "mark and 0x4000 == 0 return",
                "mark set mark and 0xffffbfff",
                "fib saddr type local ip saddr != 127.0.0.0/8 ip daddr 198.18.16.0/20 return",
                "iifname \"veth*\" ip daddr 198.18.16.0/20 return",
                "goto masquerade-now",
            ]
        );
        let ctx6 = Ctx::new(kproxy_state::IpFamily::V6, "kproxy", 0x4000);
        let rules = masquerading(&ctx6, &node(LocalTraffic::Undetectable, &["fd00:10::/32"]));
        assert!(rules.contains(&"fib saddr type local ip6 saddr != ::1 ip6 daddr fd00:10::/32 return".to_owned()));
        assert_eq!(rules.iter().filter(|r| r.ends_with("return")).count(), 2, "{rules:?}");
        let none = masquerading(&ctx, &node(LocalTraffic::Undetectable, &[]));
        assert!(!none.iter().any(|r| r.contains("daddr") && r.ends_with("return")), "{none:?}");
    }
}

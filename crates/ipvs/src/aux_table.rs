//! The auxiliary nftables table (`ip kproxy-ipvs`, `ip6 kproxy-ipvs`): everything IPVS can not
//! do, rendered from the plan. Its shape is fixed per node; services only add elements to a
//! handful of shared sets and maps (no per-service sets or chains, so the kernel's cost stays
//! linear, and a partial sync is element adds and deletes).
//!
//! Packet path, for a packet to a VIP or NodePort:
//!
//! 1. `classify-*` (prerouting and output, priority -150): NodePort traffic gets its service
//!    port's firewall mark; traffic from local pods or the node to an `externalTrafficPolicy:
//!    Local` destination gets the port's cluster mark (the short-circuit). New connections get
//!    the masquerade conntrack mark per the plan (`masquerade-marks-*`), and, when KEP-6246
//!    CIDRs are set, the local-pod conntrack mark. Conntrack marks are used rather than packet
//!    marks because IPVS looks firewall-mark services up by the whole packet mark.
//! 2. `service-checks` (input priority 0 and output priority -110: both before IPVS, which hooks
//!    `LOCAL_IN` at 98 and `LOCAL_OUT` at -98): loadBalancerSourceRanges, then marked traffic
//!    passes, then the plan's no-endpoint verdicts, then the guard: VIPs are local addresses, so
//!    a new connection to a VIP on a port no service has is rejected — host services listening
//!    on a wildcard address never leak on ClusterIPs (kubernetes#72236).
//! 3. IPVS schedules and NATs.
//! 4. `nat-postrouting`: hairpin is always masqueraded; marked connections are, except
//!    (KEP-6246) from the node or local pods to the no-masquerade CIDRs. The node's exempt
//!    connections that carry a VIP as source can not go out untranslated under IPVS; they are
//!    source-NATed to the node IP, what a direct connection shows (see `vip_source_snat`).

use kproxy_nftables::ruleset::{Ctx, local_match};
use kproxy_nftables::transaction::{Chain, Element, Hook, SetDef};
use kproxy_plan::{LocalTraffic, NoMasqueradeSource, NodePlan, NodePortAddresses, SnatSource};

use crate::config::Config;

/// Addresses on the dummy interface.
pub const VIPS: &str = "vips";
/// `addr . proto . port` of every virtual service on a VIP.
pub const VIP_PORTS: &str = "vip-ports";
/// Addresses that accept NodePort traffic (`nodePortAddresses` other than "all").
pub const NODEPORT_IPS: &str = "nodeport-ips";
/// Local pod CIDRs (detect-local by CIDR); the name `local_match` expects.
pub const POD_CIDRS: &str = "pod-cidrs";
/// `endpoint . endpoint`: after IPVS NAT, a packet from an endpoint to itself is hairpin.
pub const HAIRPIN: &str = "hairpin-endpoints";
/// ClusterIP destinations always masqueraded (`masqueradeAll`).
pub const MASQ_ALWAYS: &str = "masquerade-always";
/// ClusterIP destinations masqueraded unless the source is a local pod.
pub const MASQ_NOT_LOCAL: &str = "masquerade-not-local";
/// External destinations under Cluster policy (masqueraded).
pub const MASQ_EXTERNAL: &str = "masquerade-external";
/// NodePorts under Cluster policy (masqueraded).
pub const MASQ_NODEPORTS: &str = "masquerade-nodeports";
/// Every external destination with a virtual service (the node's traffic to them is masqueraded).
pub const EXTERNAL_DESTS: &str = "external-dests";
/// Every NodePort with a virtual service.
pub const NODEPORTS: &str = "nodeports";
/// `proto . port : mark` of NodePort traffic.
pub const NODEPORT_MARKS: &str = "nodeport-marks";
/// `addr . proto . port : mark`: Local-policy external destinations, short-circuited.
pub const SHORTCIRCUIT_DESTS: &str = "shortcircuit-dests";
/// `proto . port : mark`: Local-policy NodePorts, short-circuited.
pub const SHORTCIRCUIT_NODEPORTS: &str = "shortcircuit-nodeports";
/// LoadBalancer destinations with loadBalancerSourceRanges.
pub const FIREWALL_DESTS: &str = "firewall-dests";
/// `addr . proto . port . source-range` allowed through the firewall.
pub const FIREWALL_ALLOW: &str = "firewall-allow";
// The no-endpoint maps, the reject chain and the skeleton's shape are the nftables dataplane's:
// the auxiliary table is rendered with the same building blocks.
pub use kproxy_nftables::ruleset::skeleton::{NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES, REJECT_CHAIN, Skeleton};

fn set(name: &str, key: String, data: Option<&str>, flags: Vec<&'static str>) -> SetDef {
    SetDef { data_type: data.map(str::to_owned), flags, ..SetDef::new(name, key) }
}

/// What the node's exempt (KEP-6246) traffic with a VIP as source gets instead of "not
/// translated". Under IPVS every VIP is a local address on the dummy interface, so the kernel's
/// route to a VIP is a local route and the node's own connection to a ClusterIP takes the VIP
/// itself as source (under iptables/nftables it takes the source of the route to the ClusterIP,
/// usually the InternalIP). IPVS rewrites only the destination; left alone, the endpoint would
/// answer the VIP, which it routes to its own node or drops, and the connection times out.
/// So this traffic is source-NATed to what a direct node → endpoint connection shows: the node
/// IP of the family (the `src` of the pod routes in the #133024 setup). Without a known node IP
/// it is masqueraded like non-exempt traffic.
fn vip_source_snat(node: &NodePlan) -> String {
    match node.node_ip {
        Some(addr) => format!("snat to {addr} fully-random"),
        None => "goto masquerade-now".to_owned(),
    }
}

/// Renders the skeleton for `node`.
pub fn skeleton(cfg: &Config, ctx: &Ctx, node: &NodePlan) -> Skeleton {
    let ip = ctx.ip();
    let a = ctx.addr_type();
    let m = cfg.masquerade_mark;
    let p = cfg.local_pod_mark;
    let dest = format!("{ip} daddr . meta l4proto . th dport");
    let port = "meta l4proto . th dport";
    let np = match &node.nodeport_addresses {
        NodePortAddresses::AllLocal => {
            format!("fib daddr type local {ip} daddr != {} {ip} daddr != @{VIPS}", ctx.loopback())
        }
        NodePortAddresses::Only(_) => format!("{ip} daddr @{NODEPORT_IPS}"),
    };
    let set_masq = format!("ct mark set ct mark or {m:#x}");
    let pod = local_match(ctx, &node.local_traffic, false);
    let not_pod = local_match(ctx, &node.local_traffic, true);
    let sources = node.no_masquerade_sources();
    let base = |name: &str, kind: &'static str, hook: &'static str, priority: &'static str| Chain {
        name: name.to_owned(),
        hook: Some(Hook { kind, hook, priority }),
    };
    let plain = |name: &str| Chain { name: name.to_owned(), hook: None };

    let mut classify_pre = vec![format!("{np} meta mark set {port} map @{NODEPORT_MARKS}")];
    if let Some(pod) = &pod {
        classify_pre.push(format!("{pod} meta mark set {dest} map @{SHORTCIRCUIT_DESTS}"));
        classify_pre.push(format!("{pod} {np} meta mark set {port} map @{SHORTCIRCUIT_NODEPORTS}"));
    }
    classify_pre.push("ct state new jump masquerade-marks-prerouting".to_owned());
    let classify_out = vec![
        format!("{np} meta mark set {port} map @{NODEPORT_MARKS}"),
        format!("meta mark set {dest} map @{SHORTCIRCUIT_DESTS}"),
        format!("{np} meta mark set {port} map @{SHORTCIRCUIT_NODEPORTS}"),
        "ct state new jump masquerade-marks-output".to_owned(),
    ];
    let mut marks_pre = vec![format!("{dest} @{MASQ_ALWAYS} {set_masq}")];
    if let Some(not_pod) = &not_pod {
        marks_pre.push(format!("{not_pod} {dest} @{MASQ_NOT_LOCAL} {set_masq}"));
    }
    marks_pre.push(format!("{dest} @{MASQ_EXTERNAL} {set_masq}"));
    marks_pre.push(format!("{np} {port} @{MASQ_NODEPORTS} {set_masq}"));
    if let (Some(pod), true) = (&pod, sources.contains(&NoMasqueradeSource::LocalPods)) {
        marks_pre.push(format!("{pod} ct mark set ct mark or {p:#x}"));
    }
    let marks_out = vec![
        format!("{dest} @{MASQ_ALWAYS} {set_masq}"),
        format!("{dest} @{MASQ_NOT_LOCAL} {set_masq}"),
        format!("{dest} @{EXTERNAL_DESTS} {set_masq}"),
        format!("{np} {port} @{NODEPORTS} {set_masq}"),
        // A VIP as source (the kernel's choice for a local route) can not be answered from
        // another node: always masquerade it.
        format!("{ip} saddr @{VIPS} {ip} daddr @{VIPS} {set_masq}"),
    ];
    let checks = vec![
        format!("{dest} @{FIREWALL_DESTS} {dest} . {ip} saddr != @{FIREWALL_ALLOW} drop"),
        format!("meta mark and {:#x} == {:#x} accept", cfg.fwmark_mask, cfg.fwmark_base),
        format!("{dest} vmap @{NO_ENDPOINT_SERVICES}"),
        format!("{np} {port} vmap @{NO_ENDPOINT_NODEPORTS}"),
        format!("{ip} daddr @{VIPS} meta l4proto {{ tcp, udp, sctp }} {dest} != @{VIP_PORTS} goto {REJECT_CHAIN}"),
    ];
    let mut postrouting = vec![
        format!("{ip} saddr . {ip} daddr @{HAIRPIN} goto masquerade-now"),
        format!("ct mark and {m:#x} == 0 return"),
    ];
    // The node's own connections to a VIP leave with the VIP as source (see `vip_source_snat`).
    let vip_source = vip_source_snat(node);
    for cidr in &node.snat.no_masquerade_cidrs {
        if sources.contains(&NoMasqueradeSource::Node) {
            postrouting.push(format!("{ip} daddr {cidr} {ip} saddr @{VIPS} {vip_source}"));
            postrouting.push(format!("{ip} daddr {cidr} fib saddr type local {ip} saddr != {} return", ctx.loopback()));
        }
        if sources.contains(&NoMasqueradeSource::LocalPods) {
            postrouting.push(format!("{ip} daddr {cidr} ct mark and {p:#x} != 0 return"));
        }
    }
    postrouting.push("goto masquerade-now".to_owned());
    let snat = match node.snat.source {
        SnatSource::Masquerade => "masquerade fully-random".to_owned(),
        SnatSource::NodeIp(addr) => format!("snat to {addr} fully-random"),
    };

    let chains = vec![
        (base("classify-prerouting", "filter", "prerouting", "-150"), classify_pre),
        (base("classify-output", "filter", "output", "-150"), classify_out),
        (base("service-checks-input", "filter", "input", "0"), vec!["ct state new jump service-checks".to_owned()]),
        (
            base("service-checks-output", "filter", "output", "-110"),
            vec!["ct state new jump service-checks".to_owned()],
        ),
        (base("nat-postrouting", "nat", "postrouting", "100"), postrouting),
        (plain("masquerade-marks-prerouting"), marks_pre),
        (plain("masquerade-marks-output"), marks_out),
        (plain("service-checks"), checks),
        (plain("masquerade-now"), vec![snat]),
        (plain(REJECT_CHAIN), vec!["meta l4proto tcp reject with tcp reset".to_owned(), "reject".to_owned()]),
    ];
    let dest_key = format!("{a} . inet_proto . inet_service");
    let port_key = "inet_proto . inet_service".to_owned();
    let sets = vec![
        set(VIPS, a.to_owned(), None, vec![]),
        set(VIP_PORTS, dest_key.clone(), None, vec![]),
        set(NODEPORT_IPS, a.to_owned(), None, vec![]),
        set(POD_CIDRS, a.to_owned(), None, vec!["interval"]),
        set(HAIRPIN, format!("{a} . {a}"), None, vec![]),
        set(MASQ_ALWAYS, dest_key.clone(), None, vec![]),
        set(MASQ_NOT_LOCAL, dest_key.clone(), None, vec![]),
        set(MASQ_EXTERNAL, dest_key.clone(), None, vec![]),
        set(MASQ_NODEPORTS, port_key.clone(), None, vec![]),
        set(EXTERNAL_DESTS, dest_key.clone(), None, vec![]),
        set(NODEPORTS, port_key.clone(), None, vec![]),
        set(NODEPORT_MARKS, port_key.clone(), Some("mark"), vec![]),
        set(SHORTCIRCUIT_DESTS, dest_key.clone(), Some("mark"), vec![]),
        set(SHORTCIRCUIT_NODEPORTS, port_key.clone(), Some("mark"), vec![]),
        set(NO_ENDPOINT_SERVICES, dest_key.clone(), Some("verdict"), vec![]),
        set(NO_ENDPOINT_NODEPORTS, port_key, Some("verdict"), vec![]),
        set(FIREWALL_DESTS, dest_key.clone(), None, vec![]),
        set(FIREWALL_ALLOW, format!("{dest_key} . {a}"), None, vec!["interval"]),
    ];
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
    use std::net::IpAddr;

    use kproxy_plan::SnatPolicy;
    use kproxy_state::IpFamily;

    use super::*;

    fn node(node_ip: Option<&str>, cidrs: &[&str], source: SnatSource) -> NodePlan {
        NodePlan {
            node_ip: node_ip.map(|ip| ip.parse::<IpAddr>().unwrap()),
            local_traffic: LocalTraffic::SourceCidrs(vec!["198.18.16.0/20".parse().unwrap()]),
            nodeport_addresses: NodePortAddresses::AllLocal,
            snat: SnatPolicy {
                no_masquerade_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
                source,
                fell_back_to_masquerade: false,
            },
            service_cidrs: vec![],
            acceleration: false,
        }
    }

    fn postrouting(node: &NodePlan) -> Vec<String> {
        let ctx = Ctx::new(IpFamily::V4, "kproxy-ipvs", 0);
        let skel = skeleton(&Config::default(), &ctx, node);
        skel.chains.into_iter().find(|(c, _)| c.name == "nat-postrouting").unwrap().1
    }

    fn position(rules: &[String], needle: &str) -> usize {
        rules.iter().position(|r| r.contains(needle)).unwrap_or_else(|| panic!("no rule with {needle:?} in {rules:#?}"))
    }

    #[test]
    fn exempt_node_traffic_from_a_vip_is_snated_to_the_node_ip_before_the_exemption() {
        let rules = postrouting(&node(Some("198.18.0.2"), &["198.18.16.0/20"], SnatSource::Masquerade));
        let snat = position(&rules, "ip daddr 198.18.16.0/20 ip saddr @vips snat to 198.18.0.2 fully-random");
        let node_exempt = position(&rules, "fib saddr type local");
        assert!(position(&rules, "@hairpin-endpoints") < snat, "{rules:#?}");
        assert!(position(&rules, "ct mark and") < snat, "only marked traffic: {rules:#?}");
        assert!(snat < node_exempt, "{rules:#?}");
    }

    #[test]
    fn exempt_node_traffic_from_a_vip_is_masqueraded_without_a_node_ip() {
        let rules = postrouting(&node(None, &["198.18.16.0/20"], SnatSource::Masquerade));
        let masq = position(&rules, "ip daddr 198.18.16.0/20 ip saddr @vips goto masquerade-now");
        assert!(masq < position(&rules, "fib saddr type local"), "{rules:#?}");
    }

    #[test]
    fn without_no_masquerade_cidrs_vip_sourced_traffic_follows_the_snat_source() {
        let rules = postrouting(&node(Some("198.18.0.2"), &[], SnatSource::Masquerade));
        assert!(!rules.iter().any(|r| r.contains("@vips")), "{rules:#?}");
        let ctx = Ctx::new(IpFamily::V4, "kproxy-ipvs", 0);
        let skel = skeleton(&Config::default(), &ctx, &node(Some("198.18.0.2"), &[], SnatSource::Masquerade));
        let marks = skel.chains.iter().find(|(c, _)| c.name == "masquerade-marks-output").unwrap();
        assert!(marks.1.iter().any(|r| r.contains("ip saddr @vips ip daddr @vips ct mark set")), "{marks:#?}");
    }
}

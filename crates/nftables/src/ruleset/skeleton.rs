//! The fixed part of each table: base chains at upstream's hook priorities, the dispatch maps,
//! and the node-wide rules (node ports, masquerading, no-endpoint checks).

use kproxy_nft_model::{
    Chain, ChainType, CmpOp, DataType, Element, Field, HookPoint, Reject, Rule, SetDef, SetFlag, SetType, Stmt, Value,
    Verdict,
};
use kproxy_plan::{LocalTraffic, NoMasqueradeSource, NodePlan, NodePortAddresses, SnatSource};
use kproxy_state::Protocol;

use super::{Ctx, local_match};

/// Set of ClusterIPs (for rejecting traffic to ports no service has).
pub const CLUSTER_IPS: &str = "cluster-ips";
/// Set of addresses that accept NodePort traffic.
pub const NODEPORT_IPS: &str = "nodeport-ips";
/// Interval set of local pod CIDRs (detect-local `ClusterCIDR` / `NodeCIDR`).
pub const POD_CIDRS: &str = "pod-cidrs";
/// Set of `endpoint . endpoint` pairs: after DNAT, a packet from an endpoint to itself is hairpin
/// (endpoints on this node: `ServicePortPlan::hairpin_endpoints`).
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

/// Dynamic `client . id-high . id-low` (the id of a service port's endpoint,
/// `naming::affinity_id`): the sticky clients of every ClientIP-affinity service port, each entry
/// with its service's timeout. Declared early, as the kernel finds a set by name by walking the
/// table's sets in the order they were made.
pub const CLIENT_AFFINITY: &str = "client-affinity";
/// The most entries [`CLIENT_AFFINITY`] holds. A set without a size gets 65,535 from the kernel
/// when a rule first updates it (upstream's per-endpoint sets each have that); one set for every
/// service needs room for all of them (a full one costs new clients their stickiness, see
/// `service::affinity_dispatch`). A multiple of 2^16: the kernel takes the size's low 16 bits as
/// a hint of how many hash buckets to allocate up front (rhashtable's `u16 nelem_hint`), so this
/// size allocates no more than an unsized set; entries are allocated as they come.
pub const CLIENT_AFFINITY_SIZE: u32 = 1 << 20;

/// `addr . proto . port` of service addresses (counters on): each element counts the packets of
/// the connections to it that were DNATed (served).
pub const SERVICE_TRAFFIC: &str = "service-traffic";
/// `proto . port` of node ports (counters on): each element counts the packets of the DNATed
/// connections to it.
pub const NODEPORT_TRAFFIC: &str = "nodeport-traffic";
/// The chain that counts packets of served connections (counters on), see [`traffic_counting`].
pub const COUNT_SERVICE_TRAFFIC: &str = "count-service-traffic";

/// The maps whose elements count new connections per destination when per-Service counters
/// are on (each is looked up once per new connection: the dispatch maps in the nat chains, the
/// others behind `ct state new`).
pub const COUNTED: [&str; 5] =
    [SERVICE_IPS, SERVICE_NODEPORTS, NO_ENDPOINT_SERVICES, NO_ENDPOINT_NODEPORTS, FIREWALL_DESTS];

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
    pub chains: Vec<(Chain, Vec<Rule>)>,
    /// Sets and maps.
    pub sets: Vec<SetDef>,
    /// Node-wide elements (node port addresses, pod CIDRs).
    pub elements: Vec<Element>,
}

fn set(name: &str, key: Vec<DataType>, verdict_map: bool, flags: Vec<SetFlag>, comment: &str) -> SetDef {
    let def = if verdict_map { SetDef::verdict_map(name, key) } else { SetDef::of(name, key) };
    SetDef { flags, comment: Some(comment.to_owned()), ..def }
}

/// `rule` as one rule.
fn rule<const N: usize>(stmts: [Stmt; N]) -> Rule {
    Rule::new(stmts)
}

/// `fib saddr type local SADDR != loopback`: the node itself is the source.
pub fn from_node(ctx: &Ctx) -> [Stmt; 2] {
    [Stmt::FibLocal { saddr: true }, Stmt::neq(ctx.saddr(), ctx.loopback())]
}

/// KEP-6246: marked packets from the node or its local pods to a no-masquerade destination
/// (matched after DNAT, so on the chosen endpoint) leave `masquerading` untranslated. Hairpin was
/// sent to `masquerade-now` before these rules, and traffic from elsewhere does not match them.
fn no_masquerade_rules(ctx: &Ctx, node: &NodePlan) -> Vec<Rule> {
    let mut rules = Vec::new();
    for source in node.no_masquerade_sources() {
        let from: Vec<Stmt> = match source {
            NoMasqueradeSource::Node => from_node(ctx).into(),
            NoMasqueradeSource::LocalPods => local_match(ctx, &node.local_traffic, false).into_iter().collect(),
        };
        if from.is_empty() {
            continue;
        }
        rules.extend(node.snat.no_masquerade_cidrs.iter().map(|c| {
            let mut r = Rule::new(from.iter().cloned());
            r.0.push(Stmt::eq(ctx.daddr(), Value::Prefix(*c)));
            r.then(Stmt::Verdict(Verdict::Return))
        }));
    }
    rules
}

/// The match for addresses that accept NodePort traffic.
fn nodeport_match(ctx: &Ctx, node: &NodePlan) -> Vec<Stmt> {
    match &node.nodeport_addresses {
        NodePortAddresses::AllLocal(_) => vec![Stmt::FibLocal { saddr: false }, Stmt::neq(ctx.daddr(), ctx.loopback())],
        NodePortAddresses::Only(_) => vec![Stmt::member(vec![ctx.daddr()], NODEPORT_IPS)],
    }
}

/// Renders the skeleton for `node`.
pub fn render(ctx: &Ctx, node: &NodePlan) -> Skeleton {
    let a = ctx.addr_type();
    let m = ctx.mark;
    let dest = ctx.destination();
    let port = vec![Field::L4Proto, Field::ThDport];
    let nodeport_vmap = |map: &str| {
        let mut r = Rule::new(nodeport_match(ctx, node));
        r.0.push(Stmt::vmap(port.clone(), map));
        r
    };
    let new = || Stmt::CtState(kproxy_nft_model::CtState::New);
    let mut masquerading = vec![
        rule([
            Stmt::CtStatus(kproxy_nft_model::CtStatus::Dnat),
            Stmt::member(vec![ctx.saddr(), ctx.daddr()], HAIRPIN),
            Stmt::goto("masquerade-now"),
        ]),
        rule([Stmt::MarkAndEq { mask: m, value: 0 }, Stmt::Verdict(Verdict::Return)]),
        rule([Stmt::MarkAnd(!m)]),
    ];
    masquerading.extend(no_masquerade_rules(ctx, node));
    masquerading.push(rule([Stmt::goto("masquerade-now")]));
    let snat = match node.snat.source {
        SnatSource::Masquerade => Stmt::Masquerade { fully_random: true },
        SnatSource::NodeIp(addr) => {
            Stmt::Nat { kind: kproxy_nft_model::NatKind::Snat, addr, port: None, fully_random: true }
        }
    };
    let mut cluster_ips_check =
        vec![rule([Stmt::member(vec![ctx.daddr()], CLUSTER_IPS), Stmt::Reject(Reject::PortUnreachable)])];
    cluster_ips_check.extend(
        node.service_cidrs
            .iter()
            .map(|c| rule([Stmt::eq(ctx.daddr(), Value::Prefix(*c)), Stmt::Verdict(Verdict::Drop)])),
    );
    let mut firewall = dest.clone();
    firewall.push(ctx.saddr());

    use ChainType::{Filter, Nat};
    use HookPoint::{Forward, Input, Output, Postrouting, Prerouting};
    let regular = Chain::regular;
    let chains = vec![
        (
            Chain::base("filter-prerouting-pre-dnat", Filter, Prerouting, -110),
            vec![rule([new(), Stmt::jump("firewall-check")])],
        ),
        (
            Chain::base("filter-output-pre-dnat", Filter, Output, -110),
            vec![rule([new(), Stmt::jump("firewall-check")])],
        ),
        (Chain::base("nat-prerouting", Nat, Prerouting, -100), vec![rule([Stmt::jump(SERVICES)])]),
        (Chain::base("nat-output", Nat, Output, -100), vec![rule([Stmt::jump(SERVICES)])]),
        (
            Chain::base("filter-forward", Filter, Forward, 0),
            vec![rule([new(), Stmt::jump("service-endpoints-check")]), rule([new(), Stmt::jump("cluster-ips-check")])],
        ),
        (
            Chain::base("filter-input", Filter, Input, 0),
            vec![
                rule([new(), Stmt::jump("nodeport-endpoints-check")]),
                rule([new(), Stmt::jump("service-endpoints-check")]),
            ],
        ),
        (
            Chain::base("filter-output", Filter, Output, 0),
            vec![rule([new(), Stmt::jump("service-endpoints-check")]), rule([new(), Stmt::jump("cluster-ips-check")])],
        ),
        (Chain::base("nat-postrouting", Nat, Postrouting, 100), vec![rule([Stmt::jump("masquerading")])]),
        (
            regular("firewall-check"),
            vec![rule([
                Stmt::member(dest.clone(), FIREWALL_DESTS),
                Stmt::not_member(firewall, FIREWALL_ALLOW),
                Stmt::Verdict(Verdict::Drop),
            ])],
        ),
        (regular(SERVICES), vec![rule([Stmt::vmap(dest.clone(), SERVICE_IPS)]), nodeport_vmap(SERVICE_NODEPORTS)]),
        (regular("service-endpoints-check"), vec![rule([Stmt::vmap(dest.clone(), NO_ENDPOINT_SERVICES)])]),
        (regular("nodeport-endpoints-check"), vec![nodeport_vmap(NO_ENDPOINT_NODEPORTS)]),
        (regular("cluster-ips-check"), cluster_ips_check),
        (regular(MARK_FOR_MASQUERADE), vec![rule([ctx.mark_rule()])]),
        (regular("masquerading"), masquerading),
        (regular("masquerade-now"), vec![rule([Stmt::MarkAnd(!m)]), rule([snat])]),
        (
            regular(REJECT_CHAIN),
            vec![
                rule([Stmt::l4proto(kproxy_state::Protocol::Tcp), Stmt::Reject(Reject::TcpReset)]),
                rule([Stmt::Reject(Reject::PortUnreachable)]),
            ],
        ),
    ];

    let (pick_chains, pick_sets) = super::pick::skeleton(ctx);
    let mut chains = chains;
    if ctx.service_counters {
        traffic_counting(ctx, node, &mut chains);
    }
    chains.extend(super::service::shared_chains(ctx, node));
    chains.extend(pick_chains);

    use DataType::{InetProto, InetService};
    let dest_key = vec![a, InetProto, InetService];
    let port_key = vec![InetProto, InetService];
    let mut allow_key = dest_key.clone();
    allow_key.push(a);
    let affinity_key = vec![ctx.saddr(), Field::Numgen(2), Field::Numgen(2)];
    let mut sets = vec![
        SetDef {
            flags: vec![SetFlag::Dynamic, SetFlag::Timeout],
            size: Some(CLIENT_AFFINITY_SIZE),
            comment: Some("ClientIP affinity: client . service port's endpoint".to_owned()),
            ..SetDef::new(CLIENT_AFFINITY, SetType::Typeof { key: affinity_key, data: None })
        },
        set(CLUSTER_IPS, vec![a], false, vec![], "Active ClusterIPs"),
        set(NODEPORT_IPS, vec![a], false, vec![], "IPs that accept NodePort traffic"),
        set(POD_CIDRS, vec![a], false, vec![SetFlag::Interval], "Local pod CIDRs (detect-local)"),
        set(HAIRPIN, vec![a, a], false, vec![], "Endpoint pairs whose traffic is hairpin"),
        set(SERVICE_IPS, dest_key.clone(), true, vec![], "ClusterIP, ExternalIP and LoadBalancer IP traffic"),
        set(SERVICE_NODEPORTS, port_key.clone(), true, vec![], "NodePort traffic"),
        set(
            NO_ENDPOINT_SERVICES,
            dest_key.clone(),
            true,
            vec![],
            "vmap to drop or reject packets to services with no endpoints",
        ),
        set(
            NO_ENDPOINT_NODEPORTS,
            port_key.clone(),
            true,
            vec![],
            "vmap to drop or reject packets to service nodeports with no endpoints",
        ),
        set(
            FIREWALL_DESTS,
            dest_key.clone(),
            false,
            vec![],
            "destinations that are subject to LoadBalancerSourceRanges",
        ),
        set(FIREWALL_ALLOW, allow_key, false, vec![SetFlag::Interval], "the source ranges each of them allows"),
    ];
    for def in sets.iter_mut().filter(|d| COUNTED.contains(&d.name.as_str())) {
        def.counter = ctx.service_counters;
    }
    if ctx.service_counters {
        let counted = |name, key, comment| SetDef { counter: true, ..set(name, key, false, vec![], comment) };
        sets.push(counted(
            SERVICE_TRAFFIC,
            dest_key.clone(),
            "packets of the served connections to each service address",
        ));
        sets.push(counted(NODEPORT_TRAFFIC, port_key.clone(), "packets of the served connections to each node port"));
    }
    sets.extend(pick_sets);

    let mut elements = Vec::new();
    if let NodePortAddresses::Only(ips) = &node.nodeport_addresses {
        elements.extend(ips.iter().map(|ip| Element::new(NODEPORT_IPS, Value::Addr(*ip))));
    }
    if let LocalTraffic::SourceCidrs(nets) = &node.local_traffic {
        elements.extend(nets.iter().map(|n| Element::new(POD_CIDRS, Value::Prefix(*n))));
    }
    Skeleton { chains, sets, elements }
}

/// Per-Service counters: the rules that count every packet of served connections, in both
/// directions, by the destination the client opened the connection to (`ct original`, so one
/// key covers the request, before and after DNAT, and the reply). Served means DNATed
/// (`ct status dnat`): rejected and dropped traffic never is, and is counted by the no-endpoint
/// and firewall maps instead.
///
/// Where: each packet of a proxied connection passes exactly one of forward (the client or the
/// endpoint is elsewhere), output (sent by the node: a host-network client, or a host-network
/// endpoint's reply) and input from another interface than `lo` (received by the node: a
/// host-network endpoint's request, or the reply to a host-network client). Input from `lo` is
/// left out because a node talking to itself through a Service passed output first.
///
/// Node ports are keyed by protocol and port like the nat chain's dispatch; a connection whose
/// original destination is a service address returned after the first lookups, and with
/// `nodePortAddresses` the original destination must be one of them, as in the nat chain. With
/// every local address accepting node ports the remaining DNATed connections are counted by
/// original port alone: kproxy DNATs no other connection, but another tool's DNAT to such a port
/// would be counted too.
///
/// Cost: only with counters on, and only for packets of DNATed connections: conntrack reads and
/// one or two set lookups per packet (the `meta l4proto` matches let nft 1.0.6 type
/// `ct original proto-dst` in the concatenation).
fn traffic_counting(ctx: &Ctx, node: &NodePlan, chains: &mut Vec<(Chain, Vec<Rule>)>) {
    let dnat = || Stmt::CtStatus(kproxy_nft_model::CtStatus::Dnat);
    for (chain, rules) in chains.iter_mut() {
        let mut jump = Rule::new([dnat()]);
        match chain.name.as_str() {
            "filter-forward" | "filter-output" => {}
            "filter-input" => jump.0.push(Stmt::IifName { op: CmpOp::Neq, name: "lo".to_owned() }),
            _ => continue,
        }
        rules.push(jump.then(Stmt::jump(COUNT_SERVICE_TRAFFIC)));
    }
    let protocols = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];
    let original_daddr = Field::CtOriginalDaddr(ctx.family);
    let mut rules: Vec<Rule> = protocols
        .iter()
        .map(|&p| {
            let key = vec![original_daddr, Field::L4Proto, Field::CtOriginalProtoDst];
            rule([Stmt::l4proto(p), Stmt::member(key, SERVICE_TRAFFIC), Stmt::Verdict(Verdict::Return)])
        })
        .collect();
    rules.extend(protocols.iter().map(|&p| {
        let mut r = rule([Stmt::l4proto(p)]);
        if let NodePortAddresses::Only(_) = node.nodeport_addresses {
            r.0.push(Stmt::member(vec![original_daddr], NODEPORT_IPS));
        }
        r.then(Stmt::member(vec![Field::L4Proto, Field::CtOriginalProtoDst], NODEPORT_TRAFFIC))
    }));
    chains.push((Chain::regular(COUNT_SERVICE_TRAFFIC), rules));
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
        let rules = skel.chains.into_iter().find(|(c, _)| c.name == "masquerading").map(|(_, r)| r).unwrap();
        rules.iter().map(ToString::to_string).collect()
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

    #[test]
    fn with_counters_on_every_packet_of_dnated_connections_is_counted_once_by_its_original_destination() {
        let text = |ctx: &Ctx, nodeport_addresses| {
            let node = NodePlan { nodeport_addresses, ..node(LocalTraffic::Undetectable, &[]) };
            let skel = render(ctx, &node);
            let chains: Vec<(String, Vec<String>)> = skel
                .chains
                .iter()
                .map(|(c, rules)| (c.name.clone(), rules.iter().map(ToString::to_string).collect()))
                .collect();
            let sets: Vec<String> = skel.sets.iter().filter(|d| d.counter).map(|d| d.name.clone()).collect();
            (chains, sets)
        };
        let mut ctx = Ctx::new(kproxy_state::IpFamily::V4, "kproxy", 0x4000);
        let (off, off_sets) = text(&ctx, NodePortAddresses::AllLocal(Vec::new()));
        assert!(
            off.iter().all(|(name, rules)| name != COUNT_SERVICE_TRAFFIC
                && rules.iter().all(|r| !r.contains(COUNT_SERVICE_TRAFFIC)))
        );
        assert!(off_sets.is_empty(), "{off_sets:?}");

        ctx.service_counters = true;
        let (on, sets) = text(&ctx, NodePortAddresses::AllLocal(Vec::new()));
        assert!(sets.contains(&SERVICE_TRAFFIC.to_owned()) && sets.contains(&NODEPORT_TRAFFIC.to_owned()), "{sets:?}");
        let rules = |chain: &str| on.iter().find(|(n, _)| n == chain).map(|(_, r)| r.clone()).unwrap();
        let jump = "ct status dnat jump count-service-traffic";
        assert_eq!(rules("filter-forward").last().map(String::as_str), Some(jump));
        assert_eq!(rules("filter-output").last().map(String::as_str), Some(jump));
        assert_eq!(
            rules("filter-input").last().map(String::as_str),
            Some("ct status dnat iifname != \"lo\" jump count-service-traffic")
        );
        let jumps = on.iter().flat_map(|(_, r)| r).filter(|r| r.ends_with("jump count-service-traffic")).count();
        assert_eq!(jumps, 3, "{on:?}");
        assert_eq!(
            rules(COUNT_SERVICE_TRAFFIC),
            [
                "meta l4proto tcp ct original ip daddr . meta l4proto . ct original proto-dst @service-traffic return",
                "meta l4proto udp ct original ip daddr . meta l4proto . ct original proto-dst @service-traffic return",
                "meta l4proto sctp ct original ip daddr . meta l4proto . ct original proto-dst @service-traffic return",
                "meta l4proto tcp meta l4proto . ct original proto-dst @nodeport-traffic",
                "meta l4proto udp meta l4proto . ct original proto-dst @nodeport-traffic",
                "meta l4proto sctp meta l4proto . ct original proto-dst @nodeport-traffic",
            ]
        );
        // With nodePortAddresses, node ports count only connections opened to one of them.
        let ctx6 = Ctx { service_counters: true, ..Ctx::new(kproxy_state::IpFamily::V6, "kproxy", 0x4000) };
        let (only, _) = text(&ctx6, NodePortAddresses::Only(vec!["fd00::1".parse().unwrap()]));
        let counting = only.iter().find(|(n, _)| n == COUNT_SERVICE_TRAFFIC).map(|(_, r)| r.clone()).unwrap();
        assert_eq!(
            counting[3],
            "meta l4proto tcp ct original ip6 daddr @nodeport-ips meta l4proto . ct original proto-dst @nodeport-traffic"
        );
    }
}

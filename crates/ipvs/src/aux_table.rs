//! The auxiliary nftables table (`ip kproxy-ipvs`, `ip6 kproxy-ipvs`): everything IPVS can not
//! do, rendered from the plan. Its shape is fixed per node; services only add elements to a
//! handful of shared sets and maps (no per-service sets or chains, so the kernel's cost stays
//! linear, and a partial sync is element adds and deletes).
//!
//! Packet path, for a packet to a VIP or NodePort:
//!
//! 1. `classify-*` (prerouting and output, priority -150): traffic from local pods or the node
//!    to an `externalTrafficPolicy: Local` destination or NodePort gets the port's firewall
//!    mark (the short-circuit to its cluster endpoints). New connections get
//!    the masquerade conntrack mark per the plan (`masquerade-marks-*`), and, when KEP-6246
//!    CIDRs are set, the local-pod conntrack mark. Conntrack marks are used rather than packet
//!    marks because IPVS looks firewall-mark services up by the whole packet mark.
//!    The same marks are set again for a new connection in `remark-input` (priority 90) and
//!    `remark-output` (-99), just before IPVS: other programs' nat rules in between may OR bits
//!    into the mark (kube-proxy's masquerade bit, during a migration), and IPVS matches it whole.
//! 2. `service-checks` (input priority 0 and output priority -110: both before IPVS, which hooks
//!    `LOCAL_IN` at 98 and `LOCAL_OUT` at -98): loadBalancerSourceRanges, then marked traffic
//!    passes, then the plan's no-endpoint verdicts, then NodePorts pass, then the guard: VIPs
//!    are local addresses, so a new connection to a VIP on a port no service has is rejected —
//!    host services listening on a wildcard address never leak on ClusterIPs (kubernetes#72236).
//! 3. IPVS schedules and NATs.
//!
//! Services acceleration (KEP-4963) needs conntrack to carry the NAT, which IPVS does not do
//! (it translates in its own hooks). So, while acceleration is on, the connections of opted-in
//! service ports without session affinity never reach IPVS: `accel-prerouting` and
//! `accel-output` (nat, priority dstnat, before IPVS's `LOCAL_IN` and `LOCAL_OUT` hooks) DNAT
//! them with the nftables dataplane's endpoint pick ([`kproxy_nftables::ruleset::pick`]: its
//! chains and maps, uniform over the same endpoints, keyed by destination and slot, so an
//! endpoint change is map elements). Which class of endpoints a destination uses is a member of
//! one of the `accel-*` sets. Classification and masquerade marks (step 1) are the same as for
//! every other connection, and step 4 masquerades them alike; such service ports get no firewall
//! marks (IPVS would otherwise schedule the already DNATed packet again in `LOCAL_OUT`). Their
//! virtual services stay in IPVS, unused, so that connections IPVS already carries drain there.
//! 4. `nat-postrouting`: hairpin is always masqueraded; marked connections are, except
//!    (KEP-6246) from the node or local pods to the no-masquerade CIDRs. The node's exempt
//!    connections that carry a VIP as source can not go out untranslated under IPVS; they are
//!    source-NATed to the node IP, what a direct connection shows (see `vip_source_snat`).

use kproxy_nft_model::{
    Chain, ChainType, CmpOp, DataType, Element, Field, HookPoint, NatKind, Reject, Rule, SetDef, SetFlag, Stmt, Value,
    Verdict,
};
use kproxy_nftables::ruleset::pick::{self, Class};
use kproxy_nftables::ruleset::{Ctx, local_match};
use kproxy_plan::{LocalTraffic, NoMasqueradeSource, NodePlan, NodePortAddresses, SnatSource};
use kproxy_state::Protocol;

use crate::config::Config;

/// Between the nat hooks of other programs (-100; none at input) and IPVS (`LOCAL_IN` at 98,
/// `LOCAL_OUT` at -98): where the firewall marks are set again ([`skeleton`]).
const REMARK_INPUT_PRIORITY: i32 = 90;
const REMARK_OUTPUT_PRIORITY: i32 = -99;

/// Addresses on the dummy interface.
pub const VIPS: &str = "vips";
/// `addr . proto . port` of every virtual service on a VIP.
pub const VIP_PORTS: &str = "vip-ports";
/// Addresses that accept NodePort traffic (`nodePortAddresses` other than "all").
pub const NODEPORT_IPS: &str = "nodeport-ips";
/// Local pod CIDRs (detect-local by CIDR); the name `local_match` expects.
pub const POD_CIDRS: &str = "pod-cidrs";
/// `endpoint . endpoint`: after IPVS NAT, a packet from an endpoint to itself is hairpin
/// (endpoints on this node: `ServicePortPlan::hairpin_endpoints`).
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
/// `addr . proto . port : mark`: Local-policy external destinations, short-circuited.
pub const SHORTCIRCUIT_DESTS: &str = "shortcircuit-dests";
/// `proto . port : mark`: Local-policy NodePorts, short-circuited.
pub const SHORTCIRCUIT_NODEPORTS: &str = "shortcircuit-nodeports";
/// LoadBalancer destinations with loadBalancerSourceRanges.
pub const FIREWALL_DESTS: &str = "firewall-dests";
/// `addr . proto . port . source-range` allowed through the firewall.
pub const FIREWALL_ALLOW: &str = "firewall-allow";
/// `addr . proto . port` of accelerated destinations served by the cluster endpoints
/// (ClusterIPs under `internalTrafficPolicy: Cluster`, external IPs under
/// `externalTrafficPolicy: Cluster`).
pub const ACCEL_CLUSTER: &str = "accel-cluster";
/// `addr . proto . port` of accelerated ClusterIPs under `internalTrafficPolicy: Local`.
pub const ACCEL_LOCAL: &str = "accel-local";
/// `addr . proto . port` of accelerated external destinations under `externalTrafficPolicy:
/// Local`: local endpoints, except for the node's and local pods' traffic (cluster endpoints).
pub const ACCEL_EXTERNAL_LOCAL: &str = "accel-external-local";
/// `proto . port` of accelerated NodePorts under `externalTrafficPolicy: Cluster`.
pub const ACCEL_NODEPORTS: &str = "accel-nodeports";
/// `proto . port` of accelerated NodePorts under `externalTrafficPolicy: Local`.
pub const ACCEL_NODEPORTS_LOCAL: &str = "accel-nodeports-local";
// The no-endpoint maps, the reject chain and the skeleton's shape are the nftables dataplane's:
// the auxiliary table is rendered with the same building blocks.
pub use kproxy_nftables::ruleset::skeleton::{NO_ENDPOINT_NODEPORTS, NO_ENDPOINT_SERVICES, REJECT_CHAIN, Skeleton};

fn set(name: &str, key: Vec<DataType>, data: Option<DataType>, flags: Vec<SetFlag>) -> SetDef {
    SetDef { flags, ..SetDef::new(name, kproxy_nft_model::SetType::Named { key, data }) }
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
fn vip_source_snat(node: &NodePlan) -> Stmt {
    match node.node_ip {
        Some(addr) => Stmt::Nat { kind: NatKind::Snat, addr, port: None, fully_random: true },
        None => Stmt::goto("masquerade-now"),
    }
}

/// The DNAT of accelerated connections, in prerouting or (`output`) output: blocked by
/// loadBalancerSourceRanges → left alone (IPVS's path drops them in `service-checks`);
/// short-circuited (local pods under the Local policy; the node for every external
/// destination under it) → cluster endpoints; else the class of the destination. A destination
/// without endpoints in its class is left alone too, and meets its no-endpoint verdict there.
fn accel_dnat(ctx: &Ctx, node: &NodePlan, np: &[Stmt], output: bool) -> Vec<Rule> {
    let dest = ctx.destination();
    let port = vec![Field::L4Proto, Field::ThDport];
    let address = |set: &str, class: Class| {
        Rule::new([Stmt::member(dest.clone(), set), Stmt::goto(pick::keyspace_chain(class, false))])
    };
    let nodeport = |set: &str, class: Class| {
        with(np, [Stmt::member(port.clone(), set), Stmt::goto(pick::keyspace_chain(class, true))])
    };
    let mut rules = Vec::new();
    let external_local = if output {
        Class::Cluster
    } else {
        let mut firewall = dest.clone();
        firewall.push(ctx.saddr());
        rules.push(Rule::new([
            Stmt::member(dest.clone(), FIREWALL_DESTS),
            Stmt::not_member(firewall, FIREWALL_ALLOW),
            Stmt::Verdict(Verdict::Return),
        ]));
        if let Some(pod) = local_match(ctx, &node.local_traffic, false) {
            let mut r = address(ACCEL_EXTERNAL_LOCAL, Class::Cluster);
            r.0.insert(0, pod.clone());
            rules.push(r);
            let mut r = nodeport(ACCEL_NODEPORTS_LOCAL, Class::Cluster);
            r.0.insert(0, pod);
            rules.push(r);
        }
        Class::Local
    };
    rules.push(address(ACCEL_CLUSTER, Class::Cluster));
    rules.push(address(ACCEL_LOCAL, Class::Local));
    rules.push(address(ACCEL_EXTERNAL_LOCAL, external_local));
    rules.push(nodeport(ACCEL_NODEPORTS, Class::Cluster));
    rules.push(nodeport(ACCEL_NODEPORTS_LOCAL, external_local));
    rules
}

/// A rule of `prefix` followed by `stmts`.
fn with(prefix: &[Stmt], stmts: impl IntoIterator<Item = Stmt>) -> Rule {
    Rule::new(prefix.iter().cloned().chain(stmts))
}

/// Renders the skeleton for `node`.
pub fn skeleton(cfg: &Config, ctx: &Ctx, node: &NodePlan) -> Skeleton {
    let a = ctx.addr_type();
    let m = cfg.masquerade_mark;
    let p = cfg.local_pod_mark;
    let dest = ctx.destination();
    let port = vec![Field::L4Proto, Field::ThDport];
    let np: Vec<Stmt> = match &node.nodeport_addresses {
        NodePortAddresses::AllLocal(_) => vec![
            Stmt::FibLocal { saddr: false },
            Stmt::neq(ctx.daddr(), ctx.loopback()),
            Stmt::not_member(vec![ctx.daddr()], VIPS),
        ],
        NodePortAddresses::Only(_) => vec![Stmt::member(vec![ctx.daddr()], NODEPORT_IPS)],
    };
    let set_masq = || Stmt::CtMarkOr(m);
    let pod = local_match(ctx, &node.local_traffic, false);
    let not_pod = local_match(ctx, &node.local_traffic, true);
    let sources = node.no_masquerade_sources();
    let mark_map = |key: &[Field], map: &str| Stmt::MarkSetMap { key: key.to_vec(), map: map.to_owned() };
    let new = || Stmt::CtState(kproxy_nft_model::CtState::New);

    // The firewall marks, of the short-circuits of Local-policy ports to their cluster
    // endpoints: from outside (prerouting) only for local pods; from the node (output), always.
    let marks_in = match &pod {
        Some(pod) => {
            let mut nodeport = Rule::new([pod.clone()]);
            nodeport.0.extend(np.iter().cloned());
            vec![
                Rule::new([pod.clone(), mark_map(&dest, SHORTCIRCUIT_DESTS)]),
                nodeport.then(mark_map(&port, SHORTCIRCUIT_NODEPORTS)),
            ]
        }
        None => Vec::new(),
    };
    let marks_out =
        vec![Rule::from(mark_map(&dest, SHORTCIRCUIT_DESTS)), with(&np, [mark_map(&port, SHORTCIRCUIT_NODEPORTS)])];
    let mut classify_pre = marks_in.clone();
    classify_pre.push(Rule::new([new(), Stmt::jump("masquerade-marks-prerouting")]));
    let mut classify_out = marks_out.clone();
    classify_out.push(Rule::new([new(), Stmt::jump("masquerade-marks-output")]));
    // Set again just before IPVS looks the service up, for a new connection: rules of other
    // programs between here and IPVS may OR bits into the packet mark (kube-proxy's
    // KUBE-MARK-MASQ in nat PREROUTING and OUTPUT, while both run during a migration), and IPVS
    // matches the whole mark.
    let only_new = |rules: Vec<Rule>| -> Vec<Rule> {
        rules.into_iter().map(|r| Rule::new(std::iter::once(new()).chain(r.0))).collect()
    };
    let (remark_in, remark_out) = (only_new(marks_in), only_new(marks_out));
    let mut marks_pre = vec![Rule::new([Stmt::member(dest.clone(), MASQ_ALWAYS), set_masq()])];
    if let Some(not_pod) = &not_pod {
        marks_pre.push(Rule::new([not_pod.clone(), Stmt::member(dest.clone(), MASQ_NOT_LOCAL), set_masq()]));
    }
    marks_pre.push(Rule::new([Stmt::member(dest.clone(), MASQ_EXTERNAL), set_masq()]));
    marks_pre.push(with(&np, [Stmt::member(port.clone(), MASQ_NODEPORTS), set_masq()]));
    if let (Some(pod), true) = (&pod, sources.contains(&NoMasqueradeSource::LocalPods)) {
        marks_pre.push(Rule::new([pod.clone(), Stmt::CtMarkOr(p)]));
    }
    let masq_marks_out = vec![
        Rule::new([Stmt::member(dest.clone(), MASQ_ALWAYS), set_masq()]),
        Rule::new([Stmt::member(dest.clone(), MASQ_NOT_LOCAL), set_masq()]),
        Rule::new([Stmt::member(dest.clone(), EXTERNAL_DESTS), set_masq()]),
        with(&np, [Stmt::member(port.clone(), NODEPORTS), set_masq()]),
        // A VIP as source (the kernel's choice for a local route) can not be answered from
        // another node: always masquerade it.
        Rule::new([Stmt::member(vec![ctx.saddr()], VIPS), Stmt::member(vec![ctx.daddr()], VIPS), set_masq()]),
    ];
    let mut firewall = dest.clone();
    firewall.push(ctx.saddr());
    let mut checks = vec![
        Rule::new([
            Stmt::member(dest.clone(), FIREWALL_DESTS),
            Stmt::not_member(firewall, FIREWALL_ALLOW),
            Stmt::Verdict(Verdict::Drop),
        ]),
        Rule::new([Stmt::MarkAndEq { mask: cfg.fwmark_mask, value: cfg.fwmark_base }, Stmt::Verdict(Verdict::Accept)]),
    ];
    if node.acceleration {
        // The node's connections to accelerated Local-policy external destinations go to the
        // cluster endpoints (DNATed in `accel-output`, after this chain), like the
        // short-circuit marks let other services' through.
        let from_node = Stmt::FibLocal { saddr: true };
        checks.push(Rule::new([
            from_node.clone(),
            Stmt::member(dest.clone(), ACCEL_EXTERNAL_LOCAL),
            Stmt::Verdict(Verdict::Accept),
        ]));
        let mut r = Rule::new([from_node]);
        r.0.extend(np.iter().cloned());
        checks.push(r.then(Stmt::member(port.clone(), ACCEL_NODEPORTS_LOCAL)).then(Stmt::Verdict(Verdict::Accept)));
    }
    checks.extend([
        Rule::from(Stmt::vmap(dest.clone(), NO_ENDPOINT_SERVICES)),
        with(&np, [Stmt::vmap(port.clone(), NO_ENDPOINT_NODEPORTS)]),
        // A NodePort on a node address that is a VIP too (an external IP set to the node's).
        with(&np, [Stmt::member(port.clone(), NODEPORTS), Stmt::Verdict(Verdict::Accept)]),
        Rule::new([
            Stmt::member(vec![ctx.daddr()], VIPS),
            Stmt::L4ProtoIn(vec![Protocol::Tcp, Protocol::Udp, Protocol::Sctp]),
            Stmt::not_member(dest.clone(), VIP_PORTS),
            Stmt::goto(REJECT_CHAIN),
        ]),
    ]);
    let mut postrouting = vec![
        Rule::new([Stmt::member(vec![ctx.saddr(), ctx.daddr()], HAIRPIN), Stmt::goto("masquerade-now")]),
        Rule::new([Stmt::CtMarkAnd { mask: m, op: CmpOp::Eq, value: 0 }, Stmt::Verdict(Verdict::Return)]),
    ];
    // The node's own connections to a VIP leave with the VIP as source (see `vip_source_snat`).
    for cidr in &node.snat.no_masquerade_cidrs {
        let to_cidr = || Stmt::eq(ctx.daddr(), Value::Prefix(*cidr));
        if sources.contains(&NoMasqueradeSource::Node) {
            postrouting.push(Rule::new([to_cidr(), Stmt::member(vec![ctx.saddr()], VIPS), vip_source_snat(node)]));
            let [fib, not_loopback] = kproxy_nftables::ruleset::skeleton::from_node(ctx);
            postrouting.push(Rule::new([to_cidr(), fib, not_loopback, Stmt::Verdict(Verdict::Return)]));
        }
        if sources.contains(&NoMasqueradeSource::LocalPods) {
            postrouting.push(Rule::new([
                to_cidr(),
                Stmt::CtMarkAnd { mask: p, op: CmpOp::Neq, value: 0 },
                Stmt::Verdict(Verdict::Return),
            ]));
        }
    }
    postrouting.push(Rule::from(Stmt::goto("masquerade-now")));
    let snat = match node.snat.source {
        SnatSource::Masquerade => Stmt::Masquerade { fully_random: true },
        SnatSource::NodeIp(addr) => Stmt::Nat { kind: NatKind::Snat, addr, port: None, fully_random: true },
    };

    use ChainType::{Filter, Nat};
    use HookPoint::{Input, Output, Postrouting, Prerouting};
    let checks_entry = || vec![Rule::new([new(), Stmt::jump("service-checks")])];
    let chains = vec![
        (Chain::base("classify-prerouting", Filter, Prerouting, -150), classify_pre),
        (Chain::base("classify-output", Filter, Output, -150), classify_out),
        (Chain::base("service-checks-input", Filter, Input, 0), checks_entry()),
        (Chain::base("service-checks-output", Filter, Output, -110), checks_entry()),
        (Chain::base("remark-input", Filter, Input, REMARK_INPUT_PRIORITY), remark_in),
        (Chain::base("remark-output", Filter, Output, REMARK_OUTPUT_PRIORITY), remark_out),
        (Chain::base("nat-postrouting", Nat, Postrouting, 100), postrouting),
        (Chain::regular("masquerade-marks-prerouting"), marks_pre),
        (Chain::regular("masquerade-marks-output"), masq_marks_out),
        (Chain::regular("service-checks"), checks),
        (Chain::regular("masquerade-now"), vec![Rule::from(snat)]),
        (
            Chain::regular(REJECT_CHAIN),
            vec![
                Rule::new([Stmt::l4proto(Protocol::Tcp), Stmt::Reject(Reject::TcpReset)]),
                Rule::from(Stmt::Reject(Reject::PortUnreachable)),
            ],
        ),
    ];
    let mut chains = chains;
    let mut accel_sets = Vec::new();
    if node.acceleration {
        let (pick_chains, pick_sets) = pick::skeleton(ctx);
        chains.push((Chain::base("accel-prerouting", Nat, Prerouting, -100), accel_dnat(ctx, node, &np, false)));
        chains.push((Chain::base("accel-output", Nat, Output, -100), accel_dnat(ctx, node, &np, true)));
        chains.extend(pick::keyspace_chains(ctx));
        chains.extend(pick_chains);
        let dest_key = vec![a, DataType::InetProto, DataType::InetService];
        let port_key = vec![DataType::InetProto, DataType::InetService];
        for name in [ACCEL_CLUSTER, ACCEL_LOCAL, ACCEL_EXTERNAL_LOCAL] {
            accel_sets.push(set(name, dest_key.clone(), None, vec![]));
        }
        for name in [ACCEL_NODEPORTS, ACCEL_NODEPORTS_LOCAL] {
            accel_sets.push(set(name, port_key.clone(), None, vec![]));
        }
        accel_sets.extend(pick_sets);
    }
    use DataType::{InetProto, InetService, Mark};
    let dest_key = vec![a, InetProto, InetService];
    let port_key = vec![InetProto, InetService];
    let mut allow_key = dest_key.clone();
    allow_key.push(a);
    let verdict = Some(DataType::Verdict);
    let sets = vec![
        set(VIPS, vec![a], None, vec![]),
        set(VIP_PORTS, dest_key.clone(), None, vec![]),
        set(NODEPORT_IPS, vec![a], None, vec![]),
        set(POD_CIDRS, vec![a], None, vec![SetFlag::Interval]),
        set(HAIRPIN, vec![a, a], None, vec![]),
        set(MASQ_ALWAYS, dest_key.clone(), None, vec![]),
        set(MASQ_NOT_LOCAL, dest_key.clone(), None, vec![]),
        set(MASQ_EXTERNAL, dest_key.clone(), None, vec![]),
        set(MASQ_NODEPORTS, port_key.clone(), None, vec![]),
        set(EXTERNAL_DESTS, dest_key.clone(), None, vec![]),
        set(NODEPORTS, port_key.clone(), None, vec![]),
        set(SHORTCIRCUIT_DESTS, dest_key.clone(), Some(Mark), vec![]),
        set(SHORTCIRCUIT_NODEPORTS, port_key.clone(), Some(Mark), vec![]),
        set(NO_ENDPOINT_SERVICES, dest_key.clone(), verdict, vec![]),
        set(NO_ENDPOINT_NODEPORTS, port_key, verdict, vec![]),
        set(FIREWALL_DESTS, dest_key, None, vec![]),
        set(FIREWALL_ALLOW, allow_key, None, vec![SetFlag::Interval]),
    ];
    let mut sets = sets;
    sets.extend(accel_sets);
    let mut elements = Vec::new();
    if let NodePortAddresses::Only(ips) = &node.nodeport_addresses {
        elements.extend(ips.iter().map(|ip| Element::new(NODEPORT_IPS, Value::Addr(*ip))));
    }
    if let LocalTraffic::SourceCidrs(nets) = &node.local_traffic {
        elements.extend(nets.iter().map(|n| Element::new(POD_CIDRS, Value::Prefix(*n))));
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
            nodeport_addresses: NodePortAddresses::AllLocal(Vec::new()),
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
        let rules = skel.chains.into_iter().find(|(c, _)| c.name == "nat-postrouting").unwrap().1;
        rules.iter().map(ToString::to_string).collect()
    }

    fn position(rules: &[String], needle: &str) -> usize {
        rules.iter().position(|r| r.contains(needle)).unwrap_or_else(|| panic!("no rule with {needle:?} in {rules:#?}"))
    }

    /// A NodePort on a node address that is a VIP too (an external IP set to the node's) passes
    /// the guard that rejects a VIP's ports no service has.
    #[test]
    fn nodeports_pass_the_checks_before_the_vip_guard() {
        let ctx = Ctx::new(IpFamily::V4, "kproxy-ipvs", 0);
        let mut only = node(Some("198.18.0.2"), &[], SnatSource::Masquerade);
        only.nodeport_addresses = NodePortAddresses::Only(vec!["198.18.0.2".parse().unwrap()]);
        for node in [node(Some("198.18.0.2"), &[], SnatSource::Masquerade), only] {
            let skel = skeleton(&Config::default(), &ctx, &node);
            let checks = &skel.chains.iter().find(|(c, _)| c.name == "service-checks").unwrap().1;
            let rules: Vec<String> = checks.iter().map(ToString::to_string).collect();
            let pass = position(&rules, "th dport @nodeports accept");
            assert!(pass > position(&rules, "@no-endpoint-nodeports"), "{rules:#?}");
            assert!(pass < position(&rules, "@vip-ports"), "{rules:#?}");
        }
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
        assert!(
            marks.1.iter().any(|r| r.to_string().contains("ip saddr @vips ip daddr @vips ct mark set")),
            "{marks:#?}"
        );
    }
}

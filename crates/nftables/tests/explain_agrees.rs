#![allow(clippy::unwrap_used, clippy::panic)]
//! Explain agrees with the ruleset: for random clusters, proxy policies (detect-local by CIDR,
//! by interface or not at all, masqueradeAll, KEP-6246's noMasqueradeCIDRs and snatToNodeIP) and
//! random packets, what `kproxy_plan::explain` says (verdict, endpoints, masquerade per
//! endpoint) is what walking the rendered nftables table implies — the base chains in hook order, the dispatch maps, the shared
//! and per-service chains, the endpoint maps, the filter checks and postrouting's masquerading
//! chain — evaluated on the strict kernel model the sync property uses.
//!
//! The walk is an interpreter of the statements the renderer emits for the first packet of a
//! connection: `numgen` draws are explored (every endpoint a draw can reach), dynamic affinity
//! sets start empty, and a statement it does not model fails the test rather than being guessed.
//!
//! The table walked is the one partial syncs leave after a random history of earlier clusters
//! (none, or a few), so the endpoints sit in the slots the changes gave them, not in sorted order.

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use common::generated::{Kernel, Table, cluster_state, svc};
use kproxy_nft_model::{CmpOp, Field, Key, MapData, NatKind, Stmt, Value, Verdict};
use kproxy_nftables::{Config, NftablesDataplane, Recording};
use kproxy_plan::explain::{self, Host, Packet};
use kproxy_plan::{DetectLocal, NodeContext, Planner, ProxyPolicy};
use kproxy_state::Protocol;
use proptest::prelude::*;

const NODE_IP: &str = "198.18.0.2";
/// node-a's pod CIDR (its Node object's `podCIDRs`).
const POD_CIDR: &str = "198.18.16.0/24";

/// The packet as the chains see it, and what the walk has done to it.
#[derive(Debug, Clone)]
struct Walk {
    saddr: IpAddr,
    daddr: IpAddr,
    proto: Protocol,
    dport: u16,
    /// Sent by the node itself (output hooks; `fib saddr type local`).
    from_node: bool,
    /// The input interface (empty for the node's own packets).
    iif: &'static str,
    /// The masquerade mark.
    marked: bool,
    /// DNAT targets reached so far by random draws.
    dnat: BTreeSet<SocketAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    Accept,
    Drop,
    Reject,
    Dnat(BTreeSet<SocketAddr>),
    Snat,
}

enum Flow {
    /// Off the end of the chain, or `return`: back to the caller.
    Next,
    Stop(End),
}

fn node_ip() -> IpAddr {
    NODE_IP.parse().unwrap()
}

impl Walk {
    fn field(&self, f: &Field) -> Value {
        match f {
            Field::Saddr(_) => Value::Addr(self.saddr),
            Field::Daddr(_) => Value::Addr(self.daddr),
            Field::L4Proto => Value::Proto(self.proto),
            Field::ThDport | Field::Dport(_) => Value::Port(self.dport),
            // An affinity entry's endpoint id (those sets start empty).
            Field::Constant(c) => Value::Int(*c),
            other => panic!("unmodelled key field {other:?}"),
        }
    }

    fn key(&self, fields: &[Field]) -> Vec<Value> {
        fields.iter().map(|f| self.field(f)).collect()
    }
}

/// An element's value matches the packet's: equal, or an address inside a prefix.
fn value_matches(element: &Value, packet: &Value) -> bool {
    match (element, packet) {
        (Value::Prefix(net), Value::Addr(a)) => net.contains(a),
        (e, p) => e == p,
    }
}

fn key_matches(element: &Key, packet: &[Value]) -> bool {
    element.0.len() == packet.len() && element.0.iter().zip(packet).all(|(e, p)| value_matches(e, p))
}

fn lookup<'a>(table: &'a Table, set: &str, key: &[Value]) -> Option<&'a Option<MapData>> {
    let set = table.sets.get(set).unwrap_or_else(|| panic!("no set {set}"));
    set.iter().find(|(k, _)| key_matches(k, key)).map(|(_, v)| v)
}

fn cmp(op: CmpOp, eq: bool) -> bool {
    if op == CmpOp::Eq { eq } else { !eq }
}

/// Runs `chain`.
fn run(table: &Table, chain: &str, w: &mut Walk) -> Flow {
    let rules = table.chains.get(chain).unwrap_or_else(|| panic!("no chain {chain}"));
    'rules: for rule in rules {
        let mut random = false;
        for stmt in &rule.0 {
            let matched = match stmt {
                Stmt::Cmp { field, op, value } => cmp(*op, value_matches(value, &w.field(field))),
                Stmt::FibLocal { saddr: true } => w.from_node,
                Stmt::IifName { op, name } => {
                    let eq = match name.strip_suffix('*') {
                        Some(prefix) => w.iif.starts_with(prefix),
                        None => w.iif == name,
                    };
                    cmp(*op, eq)
                }
                Stmt::FibLocal { saddr: false } => w.daddr == node_ip(),
                Stmt::CtState(_) | Stmt::CtStatus(_) | Stmt::Counter | Stmt::Update { .. } => true,
                Stmt::MarkOr(_) => {
                    w.marked = true;
                    true
                }
                Stmt::MarkAnd(_) => {
                    w.marked = false;
                    true
                }
                Stmt::MarkAndEq { value, .. } => (if w.marked { 1 } else { 0 }) == u32::from(*value != 0),
                Stmt::NumgenEq { .. } => {
                    random = true;
                    true
                }
                Stmt::Lookup { key, negate, set } => lookup(table, set, &w.key(key)).is_some() != *negate,
                Stmt::Vmap { key, map } => match lookup(table, map, &w.key(key)) {
                    Some(Some(MapData::Verdict(v))) => match verdict(table, v, w) {
                        Some(flow) => return flow,
                        None => true,
                    },
                    _ => false,
                },
                Stmt::Nat { kind: NatKind::Dnat, addr, port, .. } => {
                    w.dnat.insert(SocketAddr::new(*addr, port.unwrap_or(w.dport)));
                    if random {
                        continue 'rules;
                    }
                    return Flow::Stop(End::Dnat(std::mem::take(&mut w.dnat)));
                }
                Stmt::NatMap { kind: NatKind::Dnat, key, map, .. } => {
                    let Some((Field::Numgen(modulus), prefix)) = key.split_last() else {
                        panic!("unmodelled dnat map key {key:?}")
                    };
                    let prefix = w.key(prefix);
                    for slot in 0..*modulus {
                        let mut k = prefix.clone();
                        k.push(Value::Int(slot));
                        if let Some(Some(MapData::Value(Key(target)))) = lookup(table, map, &k)
                            && let [Value::Addr(a), Value::Port(p)] = target.as_slice()
                        {
                            w.dnat.insert(SocketAddr::new(*a, *p));
                        }
                    }
                    // Only `mod 1` always draws (slot 0); a miss of a wider draw goes on.
                    if *modulus == 1 && !w.dnat.is_empty() {
                        return Flow::Stop(End::Dnat(std::mem::take(&mut w.dnat)));
                    }
                    continue 'rules;
                }
                Stmt::Nat { kind: NatKind::Snat, .. } | Stmt::Masquerade { .. } => return Flow::Stop(End::Snat),
                Stmt::Reject(_) => return Flow::Stop(End::Reject),
                Stmt::Verdict(v) => match verdict(table, v, w) {
                    Some(flow) => return flow,
                    None => true,
                },
                other => panic!("unmodelled statement {other:?} in {chain}"),
            };
            if !matched {
                continue 'rules;
            }
        }
    }
    Flow::Next
}

/// Applies a verdict; `None` when the rule goes on (a jump that came back).
fn verdict(table: &Table, v: &Verdict, w: &mut Walk) -> Option<Flow> {
    match v {
        Verdict::Accept => Some(Flow::Stop(End::Accept)),
        Verdict::Drop => Some(Flow::Stop(End::Drop)),
        Verdict::Return => Some(Flow::Next),
        Verdict::Goto(c) => Some(run(table, c, w)),
        Verdict::Jump(c) => match run(table, c, w) {
            Flow::Next => None,
            stop => Some(stop),
        },
    }
}

/// What the table does with the first packet of a connection: the outcome, and for a DNAT
/// whether each endpoint's packet is source-NATed in postrouting.
fn ruleset(table: &Table, from: IpAddr, to: SocketAddr, proto: Protocol) -> (End, Vec<(SocketAddr, bool)>) {
    let from_node = from == node_ip();
    // Pods of this node sit behind veth interfaces; everything else comes in through eth0.
    let iif = if from_node {
        ""
    } else if POD_CIDR.parse::<ipnet::IpNet>().unwrap().contains(&from) {
        "veth1"
    } else {
        "eth0"
    };
    let mut w = Walk {
        saddr: from,
        daddr: to.ip(),
        proto,
        dport: to.port(),
        from_node,
        iif,
        marked: false,
        dnat: BTreeSet::new(),
    };
    let (pre, nat) = if from_node {
        ("filter-output-pre-dnat", "nat-output")
    } else {
        ("filter-prerouting-pre-dnat", "nat-prerouting")
    };
    if let Flow::Stop(End::Drop) = run(table, pre, &mut w) {
        return (End::Drop, Vec::new());
    }
    if let Flow::Stop(End::Dnat(targets)) = run(table, nat, &mut w) {
        let masquerade = targets
            .iter()
            .map(|t| {
                let mut post = Walk { daddr: t.ip(), dport: t.port(), ..w.clone() };
                (*t, matches!(run(table, "masquerading", &mut post), Flow::Stop(End::Snat)))
            })
            .collect();
        return (End::Dnat(targets), masquerade);
    }
    // The node's own packets to itself go out and come back in (over loopback).
    let to_node = to.ip() == node_ip();
    let filters: &[&str] = match (from_node, to_node) {
        (true, true) => &["filter-output", "filter-input"],
        (true, false) => &["filter-output"],
        (false, true) => &["filter-input"],
        (false, false) => &["filter-forward"],
    };
    for filter in filters {
        if let Flow::Stop(end @ (End::Drop | End::Reject)) = run(table, filter, &mut w) {
            return (end, Vec::new());
        }
    }
    (End::Accept, Vec::new())
}

/// A source: the node, a local pod, an endpoint (hairpin), a pod elsewhere, external clients
/// inside and outside the generated source range.
fn source() -> impl Strategy<Value = IpAddr> {
    prop::sample::select(vec![
        NODE_IP,
        "198.18.16.200",
        "198.18.16.10",
        "198.18.16.12",
        "198.18.17.200",
        "203.0.113.200",
        "203.0.113.5",
    ])
    .prop_map(|s| s.parse().unwrap())
}

/// A destination of service `i` (or near it): ClusterIP, a wrong port, its external IP pool,
/// its NodePort, its LoadBalancer IP, an address no service has.
fn destination() -> impl Strategy<Value = (u8, SocketAddr)> {
    (0u8..5, 0u8..6, 0u8..3).prop_map(|(i, kind, x)| {
        let to = match kind {
            0 => format!("198.18.128.{}:80", 100 + i),
            1 => format!("198.18.128.{}:81", 100 + i),
            2 => format!("203.0.113.{}:80", 50 + x),
            3 => format!("{NODE_IP}:{}", 30100 + u16::from(i)),
            4 => format!("203.0.113.{}:80", 70 + i),
            _ => "192.0.2.1:80".to_owned(),
        };
        (i, to.parse().unwrap())
    })
}

/// The proxy configurations the property runs under: how pods are told apart, masqueradeAll,
/// KEP-6246's no-masquerade CIDRs (node-a's pods, node-b's) and SNAT to the node IP.
fn policy() -> impl Strategy<Value = ProxyPolicy> {
    let detect = prop::sample::select(vec![0u8, 1, 2]).prop_map(|d| match d {
        0 => DetectLocal::ClusterCidr(vec!["198.18.16.0/20".parse().unwrap()]),
        1 => DetectLocal::InterfaceNamePrefix("veth".into()),
        _ => DetectLocal::None,
    });
    let cidrs = prop::sample::select(vec![vec![], vec!["198.18.16.0/24"], vec!["198.18.17.0/24"]]);
    (detect, any::<bool>(), cidrs, any::<bool>()).prop_map(|(detect_local, masquerade_all, cidrs, snat_to_node_ip)| {
        ProxyPolicy {
            detect_local,
            masquerade_all,
            no_masquerade_cidrs: cidrs.iter().map(|c| c.parse().unwrap()).collect(),
            snat_to_node_ip,
            ..ProxyPolicy::default()
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn explain_agrees_with_the_rendered_ruleset(
        history in prop::collection::vec(prop::collection::vec(proptest::option::of(svc()), 5), 0..3),
        cluster in prop::collection::vec(proptest::option::of(svc()), 5),
        policy in policy(),
        packets in prop::collection::vec((source(), destination(), any::<bool>()), 1..12),
    ) {
        let state = cluster_state(&cluster);
        let node = NodeContext { name: "node-a".into(), ..NodeContext::default() };
        let planner = Planner::new(policy, node);
        let plan = planner.build(&state);
        let mut dp = NftablesDataplane::new(Recording::default(), Config::default());
        let mut last: Option<kproxy_plan::Plan> = None;
        for earlier in history.iter().map(|c| planner.build(&cluster_state(c))).chain([plan.clone()]) {
            match &last {
                None => dp.full_sync(&earlier).unwrap(),
                Some(before) => dp.partial_sync(&earlier, &kproxy_plan::PlanDelta::between(before, &earlier)).unwrap(),
            };
            last = Some(earlier);
        }
        let mut kernel = Kernel::default();
        for tx in &dp.executor().applied {
            kernel.apply(tx);
        }
        let table = kernel.0.iter().find(|(name, _)| name.starts_with("ip ")).map(|(_, t)| t).unwrap();
        let host = Host::of_node(&state, "node-a", vec![node_ip()]);
        for (from, (_, to), udp) in packets {
            let protocol = if udp { Protocol::Udp } else { Protocol::Tcp };
            let e = explain::explain(&plan, &host, &Packet { from, to, protocol });
            let (end, masquerade) = ruleset(table, from, to, protocol);
            let context = format!("{protocol} {from} -> {to}: explain said {e:?}; the ruleset {end:?} {masquerade:?}");
            match (&end, e.verdict) {
                (End::Dnat(targets), explain::Verdict::Dnat) => {
                    let predicted: BTreeSet<SocketAddr> = e.endpoints.iter().map(|ep| ep.address).collect();
                    prop_assert_eq!(&predicted, targets, "endpoints: {}", context);
                    for (target, masq) in masquerade {
                        let ep = e.endpoints.iter().find(|ep| ep.address == target).unwrap();
                        prop_assert_eq!(ep.masquerade, masq, "masquerade to {}: {}", target, context);
                    }
                }
                (End::Drop, explain::Verdict::Drop)
                | (End::Reject, explain::Verdict::Reject)
                | (End::Accept, explain::Verdict::None) => {}
                _ => prop_assert!(false, "verdicts differ: {}", context),
            }
        }
    }
}

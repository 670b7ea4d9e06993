//! Endpoint selection through shared data maps, so that an endpoint change is only map elements.
//!
//! Why: in any commit that adds a rule, or a map element whose data is a `jump`/`goto`, the
//! kernel re-validates the whole table, walking every chain reachable from the base chains. With
//! a `dnat` rule per endpoint, one endpoint change at 100k services cost half a second of that
//! walk. Set elements, and map elements whose data is not a verdict, skip the validation; here
//! an endpoint change touches nothing else, so its cost does not grow with the cluster.
//!
//! Every destination an endpoint class serves has its endpoints in slots `0..N` of the class's
//! endpoints map, keyed by the destination and the slot: `daddr . proto . port . slot` for a
//! ClusterIP, ExternalIP or LoadBalancer IP, `proto . port . slot` for a NodePort (whose
//! address is any of the node's). The destination is also in the class's cap set for `P`, `N`
//! rounded up to a power of two. A service chain ends in `goto pick-<class>`, which finds the
//! cap; `pick-<class>-<P>` draws a slot uniformly in `0..P` and draws again when it hits an empty
//! slot (`N < P`, at most half the slots), so the pick is uniform over the `N` endpoints. After
//! [`DRAWS`] misses (probability below 2^-16) it takes slot 0.
//!
//! Each protocol has its own endpoints maps, declared with its own port field, and the `dnat`
//! rules match the protocol before reading them.
//!
//! The detour through caps exists because nft takes the `numgen` modulus only as a constant,
//! and a chain per exact `N` reached through a verdict map would put a `goto` element (which
//! triggers the validation) into every count change. ClientIP-affinity services keep their
//! per-endpoint rules (see [`super::service`]).

use std::net::IpAddr;

use kproxy_plan::{Endpoint, ExternalPolicy, NoEndpointsVerdict, ServicePortPlan};
use kproxy_state::Protocol;

use kproxy_nft_model::{Chain, DataType, Element, Field, Key, MapData, NatKind, Rule, SetDef, SetType, Stmt, Value};

use super::{Ctx, Destination};

/// Draws of a slot before falling back to slot 0.
pub const DRAWS: usize = 16;

/// The largest cap, as a power of two: a service port uses at most this many endpoints.
pub const MAX_CAP_LOG2: u32 = 16;

/// The endpoint classes of a service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// Cluster traffic policy endpoints (`service-*` chains).
    Cluster,
    /// Local traffic policy endpoints (`local-*` chains).
    Local,
}

impl Class {
    const ALL: [Class; 2] = [Class::Cluster, Class::Local];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Class::Cluster => "cluster",
            Class::Local => "local",
        }
    }

    /// The chain a service chain of this class ends in.
    pub fn chain(self) -> String {
        format!("pick-{}", self.name())
    }
}

/// How a destination is keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keyspace {
    /// `daddr . proto . port`.
    Address,
    /// `proto . port` (NodePorts).
    NodePort,
}

impl Keyspace {
    const ALL: [Keyspace; 2] = [Keyspace::Address, Keyspace::NodePort];

    fn infix(self) -> &'static str {
        match self {
            Keyspace::Address => "",
            Keyspace::NodePort => "-nodeport",
        }
    }

    fn selector(self, ctx: &Ctx) -> Vec<Field> {
        match self {
            Keyspace::Address => ctx.destination(),
            Keyspace::NodePort => vec![Field::L4Proto, Field::ThDport],
        }
    }

    fn key_type(self, ctx: &Ctx) -> Vec<DataType> {
        match self {
            Keyspace::Address => vec![ctx.addr_type(), DataType::InetProto, DataType::InetService],
            Keyspace::NodePort => vec![DataType::InetProto, DataType::InetService],
        }
    }
}

/// The protocols a service port can have: each has its own endpoints maps.
const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];

fn endpoints_map(class: Class, ks: Keyspace, proto: Protocol) -> String {
    format!("{}{}-{}-endpoints", class.name(), ks.infix(), proto.as_str())
}

fn cap_set(class: Class, ks: Keyspace, cap: u32) -> String {
    format!("{}{}-cap-{cap}", class.name(), ks.infix())
}

fn cap_chain(class: Class, ks: Keyspace, cap: u32) -> String {
    format!("pick-{}{}-{cap}", class.name(), ks.infix())
}

fn caps() -> impl Iterator<Item = u32> {
    (0..=MAX_CAP_LOG2).map(|k| 1 << k)
}

/// The shared chains (with their rules) and maps of endpoint selection.
pub fn skeleton(ctx: &Ctx) -> (Vec<(Chain, Vec<Rule>)>, Vec<SetDef>) {
    let mut chains = Vec::new();
    let mut sets = Vec::new();
    for class in Class::ALL {
        let mut entry = Vec::new();
        for ks in Keyspace::ALL {
            let sel = ks.selector(ctx);
            for proto in PROTOCOLS {
                let mut key = sel.clone();
                key.push(Field::Numgen(2));
                // The data is `address . port`, named by the protocol's own port field:
                // with `th dport` nft 1.0.6 could not reload the ruleset.
                let data = Some(vec![ctx.daddr(), Field::Dport(proto)]);
                sets.push(SetDef {
                    comment: Some(format!("{} {} endpoints by destination and slot", class.name(), proto.as_str())),
                    ..SetDef::new(endpoints_map(class, ks, proto), SetType::Typeof { key, data })
                });
            }
            for cap in caps() {
                let set = cap_set(class, ks, cap);
                entry.push(Rule::new([Stmt::member(sel.clone(), set.as_str()), Stmt::goto(cap_chain(class, ks, cap))]));
                // A map whose data names `tcp dport` only translates TCP: the match says so.
                let draw = |proto: Protocol, modulus: u32| {
                    let mut key = sel.clone();
                    key.push(Field::Numgen(modulus));
                    let map = endpoints_map(class, ks, proto);
                    let nat = Stmt::NatMap { kind: NatKind::Dnat, family: ctx.family, key, map };
                    Rule::new([Stmt::l4proto(proto), nat])
                };
                let mut rules = Vec::new();
                for proto in PROTOCOLS {
                    if cap > 1 {
                        rules.extend(std::iter::repeat_n(draw(proto, cap), DRAWS));
                    }
                    rules.push(draw(proto, 1));
                }
                chains.push((Chain::regular(cap_chain(class, ks, cap)), rules));
                sets.push(SetDef::of(set, ks.key_type(ctx)));
            }
        }
        chains.push((Chain::regular(class.chain()), entry));
    }
    (chains, sets)
}

/// The entry chain of `class` for one keyspace only: `pick-<class>-address` (destinations
/// keyed by address) or `pick-<class>-nodeport` (NodePorts). [`skeleton`] defines what it
/// jumps to. The IPVS dataplane's auxiliary table enters these after its own match on the
/// destination, so a NodePort entry can never answer a packet to a service address (and the
/// other way round), whatever the endpoints.
pub fn keyspace_chain(class: Class, nodeport: bool) -> String {
    format!("pick-{}-{}", class.name(), if nodeport { "nodeport" } else { "address" })
}

/// The chains named by [`keyspace_chain`], for every class and keyspace.
pub fn keyspace_chains(ctx: &Ctx) -> Vec<(Chain, Vec<Rule>)> {
    let mut chains = Vec::new();
    for class in Class::ALL {
        for ks in Keyspace::ALL {
            let sel = ks.selector(ctx);
            let rules = caps()
                .map(|cap| {
                    Rule::new([
                        Stmt::member(sel.clone(), cap_set(class, ks, cap)),
                        Stmt::goto(cap_chain(class, ks, cap)),
                    ])
                })
                .collect();
            chains.push((Chain::regular(keyspace_chain(class, ks == Keyspace::NodePort)), rules));
        }
    }
    chains
}

/// The destinations of a service port, each with the class its endpoints are picked from.
fn destinations(p: &ServicePortPlan) -> Vec<(Class, Destination)> {
    let addr = |a: &IpAddr| Destination::Address(*a, p.protocol, p.port);
    let internal = if p.internal.local { Class::Local } else { Class::Cluster };
    let mut out = vec![(internal, addr(&p.cluster_ip))];
    if let Some(ext) = p.external.as_ref().filter(|e| e.no_endpoints != Some(NoEndpointsVerdict::Reject)) {
        // Local policy still sends the node's and (detectably) local pods' traffic to the
        // cluster endpoints.
        let classes: &[Class] = match ext.policy {
            ExternalPolicy::Cluster => &[Class::Cluster],
            ExternalPolicy::Local { .. } => &[Class::Local, Class::Cluster],
        };
        for &class in classes {
            out.extend(p.external_vips().map(|vip| (class, addr(vip))));
            if let Some(np) = p.node_port {
                out.push((class, Destination::NodePort(p.protocol, np)));
            }
        }
    }
    out
}

/// The cap-set and endpoints-map elements of one service port, by destination.
pub fn elements(p: &ServicePortPlan) -> Vec<(Destination, Element)> {
    let mut out = Vec::new();
    for (class, dest) in destinations(p) {
        let endpoints: &[Endpoint] = match class {
            Class::Cluster => &p.cluster_endpoints,
            Class::Local => &p.local_endpoints,
        };
        let endpoints = &endpoints[..endpoints.len().min(1 << MAX_CAP_LOG2)];
        if endpoints.is_empty() {
            continue;
        }
        let ks = match dest {
            Destination::Address(..) => Keyspace::Address,
            Destination::NodePort(..) => Keyspace::NodePort,
        };
        let cap = (endpoints.len() as u32).next_power_of_two();
        out.push((dest, Element::new(cap_set(class, ks, cap), dest.key())));
        let map = endpoints_map(class, ks, p.protocol);
        out.extend(endpoints.iter().enumerate().map(|(slot, ep)| {
            let mut key = dest.values();
            // The slot is a host-order integer, as numgen leaves it (unlike ports).
            key.push(Value::Int(slot as u32));
            let value = MapData::Value(Key(vec![Value::Addr(ep.ip), Value::Port(ep.port)]));
            (dest, Element::mapped(map.as_str(), Key(key), value))
        }));
    }
    out
}

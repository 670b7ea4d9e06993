//! Endpoint selection through shared data maps, so that an endpoint change is only map elements.
//!
//! Why: in any commit that adds a rule, or a map element whose data is a `jump`/`goto`, the
//! kernel re-validates the whole table, walking every chain reachable from the base chains. With
//! a `dnat` rule per endpoint, one endpoint change at 100k services cost half a second of that
//! walk. Set elements, and map elements whose data is not a verdict, skip the validation; here
//! an endpoint change touches nothing else, so its cost does not grow with the cluster.
//!
//! Every destination an endpoint class serves has its endpoints in slots `0..N` of one of the
//! class's endpoints maps, keyed by the destination and the slot: `daddr . proto . port . slot`
//! for a ClusterIP, ExternalIP or LoadBalancer IP, `proto . port . slot` for a NodePort (whose
//! address is any of the node's). The destination is also in the class's cap set for `P`, `N`
//! rounded up to a power of two. A service chain ends in `goto pick-<class>`, which finds the
//! cap; `pick-<class>-<P>` draws a slot uniformly in `0..P` and draws again when it hits an empty
//! slot (`N < P`, at most half the slots), so the pick is uniform over the `N` endpoints. After
//! [`DRAWS`] misses (probability below 2^-16) it takes slot 0.
//!
//! Each cap has endpoints maps of its own (`<class>[-nodeport]-<proto>-endpoints-<P>`), read only by the
//! draws of `pick-<class>-<P>`. Why: the kernel checks a new map element against every rule that
//! reads the map, and one map read by every cap's draws (273 rules) made each endpoint element
//! cost the kernel about 3 µs more: 1.6 s of a cold start at 100k Services. With a map per cap
//! it is read by 17 rules. The price: when a destination's endpoint count crosses a power of
//! two, its endpoints move to the next map, `N` elements once per doubling.
//!
//! Each protocol has its own endpoints maps, declared with its own port field, and the `dnat`
//! rules match the protocol before reading them.
//!
//! The detour through caps exists because nft takes the `numgen` modulus only as a constant,
//! and a chain per exact `N` reached through a verdict map would put a `goto` element (which
//! triggers the validation) into every count change. ClientIP-affinity services keep their
//! per-endpoint rules (see [`super::service`]).
//!
//! Which endpoint sits in which slot is [`Slots`]: an endpoint keeps its slot for as long as it
//! stays, so one endpoint change is a few elements whatever the Service's size (numbering the
//! sorted endpoints instead moved every endpoint after the changed one: 2N elements for one
//! change in a Service of N). A new endpoint takes a slot a gone one left, else the next one;
//! a gone endpoint's slot that no newcomer takes gets the endpoint of the last slot. So the
//! slots stay dense, `0..N`, and the argument above holds as it is: whatever endpoint sits in
//! which slot, each draw that hits a slot hits each of the `N` endpoints with probability
//! `1/P`, so the pick is uniform over them; a draw misses with probability `(P - N) / P < 1/2`.
//!
//! The slots are the nftables dataplane's state, not the plan's: they depend on the order in
//! which endpoints came and went, while the plan is a function of the cluster alone (and
//! explain, iptables and IPVS have no use for them). The dataplane keeps them next to the
//! applied plan whose endpoints they number (see `sync.rs`), the one place that knows what the
//! kernel holds; a restart reads them back from the kernel ([`Slots::adopt`]).

use std::collections::HashMap;
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Class {
    /// Cluster traffic policy endpoints (`service-*` chains).
    Cluster,
    /// Local traffic policy endpoints (`local-*` chains).
    Local,
}

impl Class {
    /// Both classes.
    pub const ALL: [Class; 2] = [Class::Cluster, Class::Local];

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

fn endpoints_map(class: Class, ks: Keyspace, proto: Protocol, cap: u32) -> String {
    format!("{}{}-{}-endpoints-{cap}", class.name(), ks.infix(), proto.as_str())
}

/// The cap of a destination whose class has `count` endpoints (none counts as one; a class
/// picks from at most the largest cap's).
fn cap_of(count: usize) -> u32 {
    (count.clamp(1, 1 << MAX_CAP_LOG2) as u32).next_power_of_two()
}

/// The endpoints map that holds the endpoints of a destination of `class` with `count` of
/// them: an address's (ClusterIP, external or load-balancer IP), or a NodePort's.
pub fn endpoints_map_of(class: Class, nodeport: bool, proto: Protocol, count: usize) -> String {
    let ks = if nodeport { Keyspace::NodePort } else { Keyspace::Address };
    endpoints_map(class, ks, proto, cap_of(count))
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

fn endpoints_map_def(ctx: &Ctx, class: Class, ks: Keyspace, proto: Protocol, cap: u32) -> SetDef {
    let mut key = ks.selector(ctx);
    key.push(Field::Numgen(2));
    // The data is `address . port`, named by the protocol's own port field: with `th dport`
    // nft 1.0.6 could not reload the ruleset.
    let data = Some(vec![ctx.daddr(), Field::Dport(proto)]);
    SetDef {
        comment: Some(format!("{} {} endpoints by destination and slot, cap {cap}", class.name(), proto.as_str())),
        ..SetDef::new(endpoints_map(class, ks, proto, cap), SetType::Typeof { key, data })
    }
}

/// Every endpoints map of `ctx`'s table, as declared, with the class of endpoints it holds.
pub fn endpoints_maps(ctx: &Ctx) -> Vec<(Class, SetDef)> {
    let mut out = Vec::new();
    for class in Class::ALL {
        for ks in Keyspace::ALL {
            for cap in caps() {
                out.extend(PROTOCOLS.map(|proto| (class, endpoints_map_def(ctx, class, ks, proto, cap))));
            }
        }
    }
    out
}

/// The shared chains (with their rules) and maps of endpoint selection.
pub fn skeleton(ctx: &Ctx) -> (Vec<(Chain, Vec<Rule>)>, Vec<SetDef>) {
    let mut chains = Vec::new();
    let mut sets = Vec::new();
    for class in Class::ALL {
        let mut entry = Vec::new();
        for ks in Keyspace::ALL {
            let sel = ks.selector(ctx);
            for cap in caps() {
                sets.extend(PROTOCOLS.map(|proto| endpoints_map_def(ctx, class, ks, proto, cap)));
                let set = cap_set(class, ks, cap);
                entry.push(Rule::new([Stmt::member(sel.clone(), set.as_str()), Stmt::goto(cap_chain(class, ks, cap))]));
                // A map whose data names `tcp dport` only translates TCP: the match says so.
                let draw = |proto: Protocol, modulus: u32| {
                    let mut key = sel.clone();
                    key.push(Field::Numgen(modulus));
                    let map = endpoints_map(class, ks, proto, cap);
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

/// The cap-set and endpoints-map elements of one service port, by destination, with its
/// endpoints in `slots`.
pub fn elements(p: &ServicePortPlan, slots: &Slots) -> Vec<(Destination, Element)> {
    let mut out = cap_elements(p, slots);
    for (class, dest) in destinations(p) {
        let cap = cap_of(picked(p, slots, class).count());
        let endpoints = picked(p, slots, class);
        out.extend(endpoints.enumerate().map(|(slot, ep)| (dest, endpoint_element(class, dest, cap, slot, ep))));
    }
    out
}

/// The cap-set elements of one service port alone, by destination: what its endpoints-map
/// elements are left out of (see [`endpoint_elements_difference`]).
pub fn cap_elements(p: &ServicePortPlan, slots: &Slots) -> Vec<(Destination, Element)> {
    let mut out = Vec::new();
    for (class, dest) in destinations(p) {
        let count = picked(p, slots, class).count();
        if count == 0 {
            continue;
        }
        let cap = cap_of(count);
        out.push((dest, Element::new(cap_set(class, Keyspace::of(&dest), cap), dest.key())));
    }
    out
}

/// The endpoints `class` picks from in `p`, slot by slot: at most the largest cap.
fn picked<'a>(p: &'a ServicePortPlan, slots: &'a Slots, class: Class) -> impl Iterator<Item = &'a Endpoint> {
    slots.endpoints(p, class).take(1 << MAX_CAP_LOG2)
}

/// The endpoints-map element of `class` that puts `ep` in `slot` of `dest`, whose cap is `cap`.
fn endpoint_element(class: Class, dest: Destination, cap: u32, slot: usize, ep: &Endpoint) -> Element {
    let (protocol, ks) = match dest {
        Destination::Address(_, protocol, _) => (protocol, Keyspace::Address),
        Destination::NodePort(protocol, _) => (protocol, Keyspace::NodePort),
    };
    let mut key = dest.values();
    // The slot is a host-order integer, as numgen leaves it (unlike ports).
    key.push(Value::Int(slot as u32));
    let value = MapData::Value(Key(vec![Value::Addr(ep.ip), Value::Port(ep.port)]));
    Element::mapped(endpoints_map(class, ks, protocol, cap), Key(key), value)
}

/// Moves the endpoints-map elements of `dest` that differ between two pickings (a service
/// port's plan with its slots; `None`: no pick) into `gone` and `new`, comparing slot by slot:
/// O(slots) comparisons and only the differing elements built, so one endpoint replaced in a
/// Service of thousands costs two elements, not two renderings of thousands. (A change of the
/// endpoint count across a power of two moves every endpoint to the other cap's maps.)
pub fn endpoint_elements_difference(
    dest: Destination,
    before: Option<(&ServicePortPlan, &Slots)>,
    after: Option<(&ServicePortPlan, &Slots)>,
    gone: &mut Vec<Element>,
    new: &mut Vec<Element>,
) {
    let classes = |picking: Option<(&ServicePortPlan, &Slots)>| -> Vec<Class> {
        // ClientIP affinity picks by rules, not from the maps.
        let Some((p, _)) = picking.filter(|(p, _)| p.affinity_timeout.is_none()) else { return Vec::new() };
        destinations(p).into_iter().filter(|(_, d)| *d == dest).map(|(class, _)| class).collect()
    };
    let (classes_before, classes_after) = (classes(before), classes(after));
    for class in Class::ALL {
        let was = before.filter(|_| classes_before.contains(&class)).map(|(p, slots)| picked(p, slots, class));
        let is = after.filter(|_| classes_after.contains(&class)).map(|(p, slots)| picked(p, slots, class));
        let (was, is): (Vec<&Endpoint>, Vec<&Endpoint>) =
            (was.into_iter().flatten().collect(), is.into_iter().flatten().collect());
        let (cap_was, cap_is) = (cap_of(was.len()), cap_of(is.len()));
        if cap_was != cap_is {
            // Another cap's maps: every endpoint moves.
            gone.extend(was.iter().enumerate().map(|(slot, ep)| endpoint_element(class, dest, cap_was, slot, ep)));
            new.extend(is.iter().enumerate().map(|(slot, ep)| endpoint_element(class, dest, cap_is, slot, ep)));
            continue;
        }
        let (mut was, mut is) = (was.into_iter().fuse(), is.into_iter().fuse());
        for slot in 0.. {
            match (was.next(), is.next()) {
                (None, None) => break,
                (Some(a), Some(b)) if address(a) == address(b) => {}
                (a, b) => {
                    gone.extend(a.map(|ep| endpoint_element(class, dest, cap_was, slot, ep)));
                    new.extend(b.map(|ep| endpoint_element(class, dest, cap_is, slot, ep)));
                }
            }
        }
    }
}

impl Keyspace {
    fn of(dest: &Destination) -> Keyspace {
        match dest {
            Destination::Address(..) => Keyspace::Address,
            Destination::NodePort(..) => Keyspace::NodePort,
        }
    }
}

/// The endpoints of `class` in `p`, sorted.
fn class_endpoints(p: &ServicePortPlan, class: Class) -> &[Endpoint] {
    match class {
        Class::Cluster => &p.cluster_endpoints,
        Class::Local => &p.local_endpoints,
    }
}

/// What identifies an endpoint in a slot: what the slot's element points at.
pub type Address = (IpAddr, u16);

fn address(ep: &Endpoint) -> Address {
    (ep.ip, ep.port)
}

/// Which slot each endpoint of a service port sits in, per class (see the module docs).
///
/// An order is kept as the index, slot by slot, into the class's endpoints in the plan it was
/// made for (sorted, so 4 bytes per endpoint), and only when it is not the sorted order itself:
/// every service port starts sorted, and most never change. An order is meaningless without
/// that plan: [`Slots::follow`] carries it to the next one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slots {
    /// Slot by slot, the index of the cluster endpoint it holds; `None`: slot `i` holds the
    /// `i`-th.
    cluster: Option<Box<[u32]>>,
    /// Likewise for the local endpoints.
    local: Option<Box<[u32]>>,
}

impl Slots {
    /// Slot `i` holds the `i`-th endpoint of each class: a service port's first slots.
    pub const fn sorted() -> Slots {
        Slots { cluster: None, local: None }
    }

    /// Whether slot `i` holds the `i`-th endpoint of each class.
    pub fn is_sorted(&self) -> bool {
        self.cluster.is_none() && self.local.is_none()
    }

    fn order(&self, class: Class) -> Option<&[u32]> {
        match class {
            Class::Cluster => self.cluster.as_deref(),
            Class::Local => self.local.as_deref(),
        }
    }

    /// The endpoints of `class` in `p` (the plan these slots were made for), slot by slot.
    pub fn endpoints<'a>(&'a self, p: &'a ServicePortPlan, class: Class) -> impl Iterator<Item = &'a Endpoint> {
        let endpoints = class_endpoints(p, class);
        let by_slot = self.order(class).map(|order| order.iter().filter_map(|&i| endpoints.get(i as usize)));
        let sorted = by_slot.is_none().then(|| endpoints.iter());
        by_slot.into_iter().flatten().chain(sorted.into_iter().flatten())
    }

    /// The slots of `new`'s endpoints when `old`'s sit in these: every endpoint of both keeps its
    /// slot, unless it sat past the end of `new`'s endpoints and moves into a slot a gone one
    /// left; a new one takes a slot a gone one left, else the next free one.
    pub fn follow(&self, old: &ServicePortPlan, new: &ServicePortPlan) -> Slots {
        if new.affinity_timeout.is_some() {
            // Its endpoints are rules, not slots.
            return Slots::sorted();
        }
        let order = |class| {
            let held: Vec<Option<Address>> = self.endpoints(old, class).map(|ep| Some(address(ep))).collect();
            arrange(&held, class_endpoints(new, class))
        };
        Slots { cluster: order(Class::Cluster), local: order(Class::Local) }
    }

    /// The slots of `p`'s endpoints that keep what the kernel holds: the endpoint in each slot
    /// of the first of `p`'s destinations of each class that `held` has. An endpoint `p` no
    /// longer has leaves its slot as in [`Slots::follow`], and so on.
    pub fn adopt(p: &ServicePortPlan, held: &HeldSlots) -> Slots {
        if p.affinity_timeout.is_some() {
            // Its endpoints are rules, not slots.
            return Slots::sorted();
        }
        let order = |class| {
            let mut of_class = destinations(p).into_iter().filter(|(c, _)| *c == class);
            let from_kernel = of_class.find_map(|(_, d)| held.0.get(&(class, d)))?;
            arrange(from_kernel, class_endpoints(p, class))
        };
        Slots { cluster: order(Class::Cluster), local: order(Class::Local) }
    }
}

/// What the endpoints maps of a table hold: for each class and destination, the endpoint in
/// each slot (`None`: an empty slot).
#[derive(Debug, Default)]
pub struct HeldSlots(HashMap<(Class, Destination), Vec<Option<Address>>>);

impl HeldSlots {
    /// Takes in the elements of an endpoints map of `class` (see [`endpoints_maps`]); returns
    /// how many it could not read as a destination's slot (they are not kproxy's: an adoption
    /// deletes them).
    pub fn add(&mut self, class: Class, elements: &[Element]) -> usize {
        let mut unread = 0;
        for e in elements {
            match slot_of(e) {
                Some((dest, slot, address)) => {
                    let slots = self.0.entry((class, dest)).or_default();
                    if slots.len() <= slot {
                        slots.resize(slot + 1, None);
                    }
                    slots[slot] = Some(address);
                }
                None => unread += 1,
            }
        }
        unread
    }

    /// The slots the endpoints-map elements among `elements` (a rendering's, of any sets)
    /// give their destinations.
    pub fn of_elements<'a>(elements: impl IntoIterator<Item = &'a Element>) -> HeldSlots {
        let maps: HashMap<String, Class> = Class::ALL
            .iter()
            .flat_map(|&class| Keyspace::ALL.iter().flat_map(move |&ks| PROTOCOLS.map(|p| (class, ks, p))))
            .flat_map(|(class, ks, proto)| caps().map(move |cap| (endpoints_map(class, ks, proto, cap), class)))
            .collect();
        let mut held = HeldSlots::default();
        for e in elements {
            if let Some(&class) = maps.get(&e.set) {
                held.add(class, std::slice::from_ref(e));
            }
        }
        held
    }

    /// How many slots hold an endpoint.
    pub fn len(&self) -> usize {
        self.0.values().map(|slots| slots.iter().flatten().count()).sum()
    }

    /// Whether no slot holds an endpoint.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The destination, slot and endpoint of an endpoints map's element, as [`elements`] writes it.
fn slot_of(e: &Element) -> Option<(Destination, usize, Address)> {
    let dest_and_slot = match e.key.0.as_slice() {
        [Value::Addr(a), Value::Proto(p), Value::Port(port), Value::Int(slot)] => {
            (Destination::Address(*a, *p, *port), *slot)
        }
        [Value::Proto(p), Value::Port(port), Value::Int(slot)] => (Destination::NodePort(*p, *port), *slot),
        _ => return None,
    };
    let (dest, slot) = dest_and_slot;
    let Some(MapData::Value(Key(value))) = &e.value else { return None };
    let [Value::Addr(ip), Value::Port(port)] = value.as_slice() else { return None };
    // Slots past the largest cap are not kproxy's: no room is made for them.
    (slot < 1 << MAX_CAP_LOG2).then_some((dest, slot as usize, (*ip, *port)))
}

/// The order that puts `wanted` (sorted) into slots where `held` (slot by slot: the address
/// each holds, `None` when empty) has them already, dense from slot 0: an address held in a
/// slot below `wanted.len()` stays there; the other slots below take, in turn, the addresses
/// nothing holds yet (in sorted order), then those held in the highest slots from
/// `wanted.len()` on. `None` when that is the sorted order.
fn arrange(held: &[Option<Address>], wanted: &[Endpoint]) -> Option<Box<[u32]>> {
    let n = wanted.len();
    // `wanted` is sorted, by address first, and holds an address once: found by bisection, with
    // no index built at each change of a Service of thousands.
    let index = |a: &Address| wanted.binary_search_by(|ep| address(ep).cmp(a)).ok().map(|i| i as u32);
    let mut placed = vec![false; n];
    // Slot by slot, the wanted endpoint it already holds.
    let kept: Vec<Option<u32>> = held
        .iter()
        .map(|a| {
            let i = index(a.as_ref()?)?;
            // An address twice in the kernel (not kproxy's doing) keeps its first slot only.
            let first = !std::mem::replace(&mut placed[i as usize], true);
            first.then_some(i)
        })
        .collect();
    let mut newcomers = (0..n as u32).filter(|i| !placed[*i as usize]);
    // Endpoints past the last slot, taken from the highest.
    let mut beyond: Vec<u32> = kept.iter().skip(n).flatten().copied().collect();
    let order: Vec<u32> = (0..n)
        .filter_map(|slot| kept.get(slot).copied().flatten().or_else(|| newcomers.next()).or_else(|| beyond.pop()))
        .collect();
    // Every slot below `n` that holds no wanted endpoint is filled: there are as many such
    // slots as newcomers and endpoints beyond together.
    debug_assert_eq!(order.len(), n);
    let sorted = order.iter().enumerate().all(|(slot, &i)| slot == i as usize);
    (!sorted && order.len() == n).then(|| order.into_boxed_slice())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ep(last: u8) -> Endpoint {
        Endpoint { ip: IpAddr::from([198, 18, 16, last]), port: 8080, is_local: false, ready: true }
    }

    fn endpoints(lasts: &[u8]) -> Vec<Endpoint> {
        let mut v: Vec<Endpoint> = lasts.iter().map(|l| ep(*l)).collect();
        v.sort();
        v.dedup();
        v
    }

    /// The addresses `order` puts in each slot.
    fn by_slot(order: &Option<Box<[u32]>>, wanted: &[Endpoint]) -> Vec<u8> {
        let last = |ep: &Endpoint| match ep.ip {
            IpAddr::V4(v4) => v4.octets()[3],
            IpAddr::V6(_) => 0,
        };
        match order {
            Some(o) => o.iter().map(|&i| last(&wanted[i as usize])).collect(),
            None => wanted.iter().map(last).collect(),
        }
    }

    fn held(lasts: &[Option<u8>]) -> Vec<Option<Address>> {
        lasts.iter().map(|l| l.map(|l| address(&ep(l)))).collect()
    }

    #[test]
    fn a_replaced_endpoint_takes_its_predecessors_slot_and_a_removed_ones_goes_to_the_last() {
        let wanted = endpoints(&[1, 3, 4, 9]);
        // 2 replaced by 9, which sorts last.
        let order = arrange(&held(&[Some(1), Some(2), Some(3), Some(4)]), &wanted);
        assert_eq!(by_slot(&order, &wanted), vec![1, 9, 3, 4]);
        // 1 removed: the last slot's endpoint moves into its slot.
        let wanted = endpoints(&[2, 3, 4]);
        let order = arrange(&held(&[Some(1), Some(2), Some(3), Some(4)]), &wanted);
        assert_eq!(by_slot(&order, &wanted), vec![4, 2, 3]);
        // Added: the next slot.
        let wanted = endpoints(&[0, 1, 2]);
        let order = arrange(&held(&[Some(1), Some(2)]), &wanted);
        assert_eq!(by_slot(&order, &wanted), vec![1, 2, 0]);
        // Nothing changed, sorted: nothing to keep.
        assert_eq!(arrange(&held(&[Some(1), Some(2)]), &endpoints(&[1, 2])), None);
    }

    #[test]
    fn empty_slots_and_doubles_in_the_kernel_are_filled_densely() {
        let wanted = endpoints(&[1, 2, 3]);
        let order = arrange(&held(&[None, Some(2), Some(2), None, Some(7), Some(1)]), &wanted);
        assert_eq!(by_slot(&order, &wanted), vec![3, 2, 1]);
    }

    proptest! {
        /// Whatever the slots held, the new order holds every wanted endpoint once, in slots
        /// `0..N`, keeps every one that was in a slot below `N` there, and moves at most as
        /// many others as changed.
        #[test]
        fn every_wanted_endpoint_gets_one_slot_and_kept_ones_stay(
            before in prop::collection::vec(proptest::option::of(0u8..40), 0..30),
            after in prop::collection::vec(0u8..40, 0..30),
        ) {
            let wanted = endpoints(&after);
            let order = arrange(&held(&before), &wanted);
            let slots = by_slot(&order, &wanted);
            let mut sorted = slots.clone();
            sorted.sort();
            let mut want: Vec<u8> = after.clone();
            want.sort();
            want.dedup();
            prop_assert_eq!(&sorted, &want);
            let mut seen = std::collections::BTreeSet::new();
            for (slot, held) in before.iter().enumerate().take(wanted.len()) {
                if let Some(h) = held.filter(|h| want.contains(h) && seen.insert(*h)) {
                    prop_assert_eq!(slots[slot], h, "slot {} moved", slot);
                }
            }
        }
    }

    /// A ClusterIP service port with a node port: its endpoints local ones when `local` (with
    /// `externalTrafficPolicy: Local`, so its destinations pick from both classes).
    fn port_plan(lasts: &[u8], local: &[u8], external_local: bool) -> ServicePortPlan {
        use kproxy_plan::{ExternalTraffic, InternalTraffic, MasqueradeWhen, ServicePortName};
        let mut cluster_endpoints = endpoints(lasts);
        for ep in &mut cluster_endpoints {
            ep.is_local = matches!(ep.ip, IpAddr::V4(v4) if local.contains(&v4.octets()[3]));
        }
        let local_endpoints = cluster_endpoints.iter().filter(|ep| ep.is_local).cloned().collect();
        let protocol = Protocol::Tcp;
        ServicePortPlan {
            name: ServicePortName { namespace: "ns".into(), service: "big".into(), port: "".into(), protocol },
            cluster_ip: IpAddr::from([198, 18, 128, 1]),
            port: 80,
            protocol,
            node_port: Some(30080),
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            source_ranges: Vec::new(),
            affinity_timeout: None,
            cluster_endpoints,
            local_endpoints,
            internal: InternalTraffic { local: false, masquerade: MasqueradeWhen::Never, no_endpoints: None },
            external: Some(ExternalTraffic {
                policy: if external_local {
                    ExternalPolicy::Local { short_circuit_pods: false }
                } else {
                    ExternalPolicy::Cluster
                },
                no_endpoints: None,
            }),
            health_check_node_port: None,
            accelerate: false,
            serving_endpoints: Vec::new(),
        }
    }

    proptest! {
        /// Compared slot by slot, two pickings of a service port differ by exactly the
        /// endpoints-map elements that differ between their whole renderings, destination by
        /// destination.
        #[test]
        fn the_slot_by_slot_difference_is_that_of_the_whole_renderings(
            before in prop::collection::vec(0u8..40, 0..30),
            after in prop::collection::vec(0u8..40, 0..30),
            local in prop::collection::vec(0u8..40, 0..10),
            external_local in any::<bool>(),
        ) {
            let old = port_plan(&before, &local, external_local);
            let new = port_plan(&after, &local, external_local);
            let old_slots = Slots::sorted();
            let new_slots = old_slots.follow(&old, &new);
            let is_endpoint = |e: &Element| e.set.contains("-endpoints-");
            for (_, dest) in destinations(&old).into_iter().chain(destinations(&new)) {
                let whole = |p: &ServicePortPlan, slots: &Slots| -> std::collections::BTreeSet<Element> {
                    elements(p, slots).into_iter().filter(|(d, e)| *d == dest && is_endpoint(e)).map(|(_, e)| e).collect()
                };
                let (was, is) = (whole(&old, &old_slots), whole(&new, &new_slots));
                let (mut gone, mut added) = (Vec::new(), Vec::new());
                endpoint_elements_difference(dest, Some((&old, &old_slots)), Some((&new, &new_slots)), &mut gone, &mut added);
                gone.sort();
                added.sort();
                prop_assert_eq!(gone, was.difference(&is).cloned().collect::<Vec<_>>());
                prop_assert_eq!(added, is.difference(&was).cloned().collect::<Vec<_>>());
            }
        }
    }
}

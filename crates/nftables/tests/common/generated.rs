//! A strict model of the kernel's nf_tables state, and random clusters to plan, for the
//! property tests.

#![allow(dead_code, clippy::unwrap_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};

use kproxy_nft_model::{
    Element, ExecError, Executor, Key, Listings, MapData, Op, Rule, SetDef, TableListing, TableRef, Value,
};
use kproxy_nftables::Transaction;
use kproxy_plan::Plan;
use proptest::prelude::*;
use serde_json::json;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Table {
    pub chains: BTreeMap<String, Vec<Rule>>,
    pub sets: BTreeMap<String, BTreeMap<Key, Option<MapData>>>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Kernel(pub BTreeMap<String, Table>);

/// The identity the model kernel gives an element (see [`ModelKernel`]).
pub fn identity(key: &Key, value: &Option<MapData>) -> Vec<u8> {
    format!("{key:?} {value:?}").into_bytes()
}

/// The endpoints of every destination of every endpoints map: (table, map, the key without its
/// slot) → the endpoints its slots hold.
pub type EndpointsByDestination = BTreeMap<(String, String, Vec<Value>), BTreeSet<MapData>>;

impl Kernel {
    /// This kernel with the endpoints maps apart: everything else as it is (those maps empty),
    /// and the endpoints each destination holds — after checking that every destination's slots
    /// are `0..N` and hold `N` different endpoints, as the pick needs them.
    pub fn slots_apart(&self) -> Result<(Kernel, EndpointsByDestination), String> {
        let mut rest = self.clone();
        let mut by_destination = EndpointsByDestination::new();
        for (table_name, table) in &mut rest.0 {
            // `cluster[-nodeport]-<proto>-endpoints-<cap>`, `local[-nodeport]-<proto>-endpoints-<cap>`.
            let endpoints_map_cap = |name: &str| -> Option<usize> {
                let (map, cap) = name.rsplit_once('-')?;
                let ours = (map.starts_with("cluster-") || map.starts_with("local-")) && map.ends_with("-endpoints");
                ours.then(|| cap.parse().ok()).flatten()
            };
            for (set, elements) in table.sets.iter_mut() {
                let Some(cap) = endpoints_map_cap(set) else { continue };
                let mut slots: BTreeMap<Vec<Value>, Vec<(u32, MapData)>> = BTreeMap::new();
                for (key, value) in std::mem::take(elements) {
                    let Some((Value::Int(slot), dest)) = key.0.split_last() else {
                        return Err(format!("{set}: a key without a slot: {key}"));
                    };
                    let value = value.ok_or_else(|| format!("{set}: {key} has no endpoint"))?;
                    slots.entry(dest.to_vec()).or_default().push((*slot, value));
                }
                for (dest, held) in slots {
                    let numbers: Vec<u32> = held.iter().map(|(slot, _)| *slot).collect();
                    if numbers != (0..held.len() as u32).collect::<Vec<_>>() {
                        return Err(format!("{table_name} {set} {dest:?}: slots {numbers:?} are not dense"));
                    }
                    if held.len().next_power_of_two() != cap {
                        return Err(format!(
                            "{table_name} {set} {dest:?}: {} endpoints in cap {cap}'s map",
                            held.len()
                        ));
                    }
                    let endpoints: BTreeSet<MapData> = held.into_iter().map(|(_, v)| v).collect();
                    if endpoints.len() != numbers.len() {
                        return Err(format!("{table_name} {set} {dest:?}: an endpoint in two slots"));
                    }
                    by_destination.insert((table_name.clone(), set.clone(), dest), endpoints);
                }
            }
        }
        Ok((rest, by_destination))
    }
}

impl Kernel {
    pub fn apply(&mut self, tx: &Transaction) {
        for op in tx.ops() {
            let table = |k: &mut Kernel, t: &dyn std::fmt::Display| -> String {
                let name = t.to_string();
                assert!(k.0.contains_key(&name), "{op:?}: no table {name}");
                name
            };
            match op {
                Op::AddTable { table, .. } => {
                    self.0.entry(table.to_string()).or_default();
                }
                Op::DeleteTable(t) => {
                    assert!(self.0.remove(&t.to_string()).is_some(), "{op:?}: no such table");
                }
                Op::AddChain(t, c) => {
                    let n = table(self, t);
                    self.0.get_mut(&n).unwrap().chains.entry(c.name.clone()).or_default();
                }
                Op::FlushChain(t, c) => {
                    let n = table(self, t);
                    self.0.get_mut(&n).unwrap().chains.get_mut(c).unwrap_or_else(|| panic!("{op:?}")).clear();
                }
                Op::DeleteChain(t, c) => {
                    let n = table(self, t);
                    let rules = self.0.get_mut(&n).unwrap().chains.remove(c).unwrap_or_else(|| panic!("{op:?}"));
                    assert!(rules.is_empty(), "{op:?}: chain still has rules");
                }
                Op::AddRule { table: t, chain, rule, .. } => {
                    let n = table(self, t);
                    let c = self.0.get_mut(&n).unwrap().chains.get_mut(chain).unwrap_or_else(|| panic!("{op:?}"));
                    c.push(rule.clone());
                }
                Op::AddSet(t, s) => {
                    let n = table(self, t);
                    self.0.get_mut(&n).unwrap().sets.entry(s.name.clone()).or_default();
                }
                Op::FlushSet { table: t, name, .. } => {
                    let n = table(self, t);
                    self.0.get_mut(&n).unwrap().sets.get_mut(name).unwrap_or_else(|| panic!("{op:?}")).clear();
                }
                Op::DeleteSet { table: t, name, .. } => {
                    let n = table(self, t);
                    assert!(self.0.get_mut(&n).unwrap().sets.remove(name).is_some(), "{op:?}");
                }
                Op::AddElement(t, e) => {
                    let n = table(self, t);
                    let set = self.0.get_mut(&n).unwrap().sets.get_mut(&e.set).unwrap_or_else(|| panic!("{op:?}"));
                    assert!(set.insert(e.key.clone(), e.value.clone()).is_none(), "{op:?}: element exists");
                }
                Op::DeleteElement(t, e) => {
                    let n = table(self, t);
                    let set = self.0.get_mut(&n).unwrap().sets.get_mut(&e.set).unwrap_or_else(|| panic!("{op:?}"));
                    assert!(set.remove(&e.key).is_some(), "{op:?}: no such element");
                }
                Op::DeleteElementByIdentity { table: t, set, identity: id } => {
                    let n = table(self, t);
                    let set = self.0.get_mut(&n).unwrap().sets.get_mut(set).unwrap_or_else(|| panic!("{op:?}"));
                    let key = set.iter().find(|(k, v)| identity(k, v) == *id).map(|(k, _)| k.clone());
                    set.remove(&key.unwrap_or_else(|| panic!("{op:?}: no such element")));
                }
                other => panic!("unmodelled operation {other:?}"),
            }
        }
    }
}

/// One service of a generated cluster.
#[derive(Debug, Clone)]
pub struct Svc {
    /// Index into a small pool of external IPs (so services contend for them), if any.
    pub external_ip: Option<u8>,
    pub node_port: bool,
    pub local: bool,
    pub affinity: bool,
    pub udp: bool,
    /// Endpoints, from a small pool (so services share them).
    pub endpoints: Vec<u8>,
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// A LoadBalancer IP, with `loadBalancerSourceRanges` when `Some(true)`.
    pub load_balancer: Option<bool>,
}

pub fn svc() -> impl Strategy<Value = Svc> {
    (
        proptest::option::of(0u8..3),
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.3),
        prop::collection::vec(0u8..12, 0..6),
        prop::bool::weighted(0.2),
        proptest::option::weighted(0.3, any::<bool>()),
    )
        .prop_map(|(external_ip, node_port, local, affinity, udp, endpoints, internal_local, load_balancer)| Svc {
            external_ip,
            node_port,
            local,
            affinity,
            udp,
            endpoints,
            internal_local,
            load_balancer,
        })
}

/// The plan of `cluster` under the test cluster's default policy.
pub fn plan(cluster: &[Option<Svc>]) -> Plan {
    super::planner().build(&cluster_state(cluster))
}

/// The cluster state of `cluster` (node-a, node-b's endpoints, the services).
pub fn cluster_state(cluster: &[Option<Svc>]) -> kproxy_state::ClusterState {
    let mut objects = vec![super::node()];
    for (i, s) in cluster.iter().enumerate() {
        let Some(s) = s else { continue };
        let name = format!("s{i}");
        let mut spec = json!({
            "clusterIP": format!("198.18.128.{}", 100 + i),
            "ports": [{"name": "p", "port": 80, "protocol": if s.udp { "UDP" } else { "TCP" }}],
        });
        if let Some(x) = s.external_ip {
            spec["externalIPs"] = json!([format!("203.0.113.{}", 50 + x)]);
        }
        if s.node_port || s.local {
            spec["type"] = json!("NodePort");
            spec["ports"][0]["nodePort"] = json!(30100 + i);
        }
        if s.local {
            spec["externalTrafficPolicy"] = json!("Local");
        }
        if s.affinity {
            spec["sessionAffinity"] = json!("ClientIP");
        }
        if s.internal_local {
            spec["internalTrafficPolicy"] = json!("Local");
        }
        let mut status = json!({});
        if let Some(ranges) = s.load_balancer {
            spec["type"] = json!("LoadBalancer");
            spec["ports"][0]["nodePort"] = json!(30100 + i);
            status = json!({"loadBalancer": {"ingress": [{"ip": format!("203.0.113.{}", 70 + i)}]}});
            if ranges {
                spec["loadBalancerSourceRanges"] = json!(["203.0.113.192/26"]);
            }
        }
        objects.push(super::service("default", &name, spec, status));
        let eps: Vec<_> = s
            .endpoints
            .iter()
            .map(|e| {
                super::ep(&format!("198.18.{}.{}", 16 + e % 2, 10 + e), if e % 2 == 0 { "node-a" } else { "node-b" })
            })
            .collect();
        let protocol = if s.udp { "UDP" } else { "TCP" };
        objects.push(super::slice(
            "default",
            &name,
            "1",
            "IPv4",
            json!([{"name": "p", "port": 8080, "protocol": protocol}]),
            json!(eps),
        ));
    }
    super::state(objects)
}

/// Whether two kernels hold the same, but for which slot each endpoint sits in (and both
/// keep their slots dense): what a fresh start and a history of changes must agree on.
pub fn same_but_slots(a: &Kernel, b: &Kernel) -> Result<(), String> {
    let (a_rest, a_endpoints) = a.slots_apart()?;
    let (b_rest, b_endpoints) = b.slots_apart()?;
    if a_endpoints != b_endpoints {
        return Err(format!("endpoints differ:\n{a_endpoints:#?}\n{b_endpoints:#?}"));
    }
    if a_rest != b_rest {
        return Err(format!("the rest differs:\n{a_rest:#?}\n{b_rest:#?}"));
    }
    Ok(())
}

/// An executor over the strict kernel model that reads back what a restart reads from a real
/// kernel: the tables' summaries, the identities of elements and the elements themselves.
#[derive(Debug, Default)]
pub struct ModelKernel {
    pub kernel: Kernel,
    pub listings: Listings,
    pub generation: u32,
    pub applied: Vec<Transaction>,
}

impl ModelKernel {
    fn set(&self, table: &TableRef, set: &str) -> Option<&BTreeMap<Key, Option<MapData>>> {
        self.kernel.0.get(&table.to_string())?.sets.get(set)
    }
}

impl Executor for ModelKernel {
    fn apply(&mut self, tx: &Transaction) -> Result<(), ExecError> {
        self.kernel.apply(tx);
        self.listings.apply(tx);
        self.generation = self.generation.wrapping_add(1);
        self.applied.push(tx.clone());
        Ok(())
    }

    fn generation(&mut self) -> Result<Option<u32>, ExecError> {
        Ok(Some(self.generation))
    }

    fn list(&mut self, table: &TableRef) -> Result<Option<TableListing>, ExecError> {
        Ok(Some(self.listings.get(table)))
    }

    fn element_identities(&mut self, table: &TableRef, set: &str) -> Result<Option<BTreeSet<Vec<u8>>>, ExecError> {
        Ok(self.set(table, set).map(|s| s.iter().map(|(k, v)| identity(k, v)).collect()))
    }

    fn element_identity(&self, e: &Element) -> Option<Vec<u8>> {
        Some(identity(&e.key, &e.value))
    }

    fn elements(&mut self, table: &TableRef, set: &SetDef) -> Result<Option<Vec<Element>>, ExecError> {
        let elements = self.set(table, &set.name).into_iter().flatten();
        Ok(Some(elements.map(|(k, v)| Element { set: set.name.clone(), key: k.clone(), value: v.clone() }).collect()))
    }
}

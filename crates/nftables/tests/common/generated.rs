//! A strict model of the kernel's nf_tables state, and random clusters to plan, for the
//! property tests.

#![allow(dead_code, clippy::unwrap_used, clippy::panic)]

use std::collections::BTreeMap;

use kproxy_nft_model::{Key, MapData, Op, Rule};
use kproxy_nftables::Transaction;
use kproxy_plan::Plan;
use proptest::prelude::*;
use serde_json::json;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Table {
    pub chains: BTreeMap<String, Vec<Rule>>,
    pub sets: BTreeMap<String, BTreeMap<Key, Option<MapData>>>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Kernel(pub BTreeMap<String, Table>);

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

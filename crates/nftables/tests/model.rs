#![allow(clippy::unwrap_used, clippy::panic)]
//! Partial syncs land the kernel exactly where a cold start of the final plan would. The kernel
//! is modelled strictly: adding an element that exists, deleting one that does not, or touching
//! a missing chain or set is an error, as nf_tables would make it.

mod common;

use std::collections::BTreeMap;

use kproxy_nft_model::{Key, MapData, Op, Rule};
use kproxy_nftables::{Config, NftablesDataplane, Recording, Transaction};
use kproxy_plan::{Plan, PlanDelta};
use proptest::prelude::*;
use serde_json::json;

#[derive(Debug, Default, PartialEq, Eq)]
struct Table {
    chains: BTreeMap<String, Vec<Rule>>,
    sets: BTreeMap<String, BTreeMap<Key, Option<MapData>>>,
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Kernel(BTreeMap<String, Table>);

impl Kernel {
    fn apply(&mut self, tx: &Transaction) {
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
                Op::AddRule { table: t, chain, rule } => {
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
struct Svc {
    /// Index into a small pool of external IPs (so services contend for them), if any.
    external_ip: Option<u8>,
    node_port: bool,
    local: bool,
    affinity: bool,
    udp: bool,
    /// Endpoints, from a small pool (so services share them).
    endpoints: Vec<u8>,
}

fn svc() -> impl Strategy<Value = Svc> {
    (
        proptest::option::of(0u8..3),
        any::<bool>(),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.3),
        prop::collection::vec(0u8..12, 0..6),
    )
        .prop_map(|(external_ip, node_port, local, affinity, udp, endpoints)| Svc {
            external_ip,
            node_port,
            local,
            affinity,
            udp,
            endpoints,
        })
}

fn plan(cluster: &[Option<Svc>]) -> Plan {
    let mut objects = vec![common::node()];
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
        objects.push(common::service("default", &name, spec, json!({})));
        let eps: Vec<_> = s
            .endpoints
            .iter()
            .map(|e| {
                common::ep(&format!("198.18.{}.{}", 16 + e % 2, 10 + e), if e % 2 == 0 { "node-a" } else { "node-b" })
            })
            .collect();
        let protocol = if s.udp { "UDP" } else { "TCP" };
        objects.push(common::slice(
            "default",
            &name,
            "1",
            "IPv4",
            json!([{"name": "p", "port": 8080, "protocol": protocol}]),
            json!(eps),
        ));
    }
    common::planner().build(&common::state(objects))
}

fn kernel_after(dp: &NftablesDataplane<Recording>, from: usize) -> Kernel {
    let mut k = Kernel::default();
    for tx in &dp.executor().applied[from..] {
        k.apply(tx);
    }
    k
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn partial_syncs_reach_what_a_cold_start_builds(
        steps in prop::collection::vec(prop::collection::vec(proptest::option::of(svc()), 5), 2..6),
    ) {
        let plans: Vec<Plan> = steps.iter().map(|c| plan(c)).collect();
        let mut dp = NftablesDataplane::new(Recording::default(), Config::default());
        dp.full_sync(&plans[0]).unwrap();
        for pair in plans.windows(2) {
            dp.partial_sync(&pair[1], &PlanDelta::between(&pair[0], &pair[1])).unwrap();
        }
        let last = plans.last().unwrap();
        // Stale chains are deleted by the sync after the one that flushed them.
        dp.partial_sync(last, &PlanDelta::default()).unwrap();
        let incremental = kernel_after(&dp, 0);

        let mut fresh = NftablesDataplane::new(Recording::default(), Config::default());
        fresh.full_sync(last).unwrap();
        let cold = kernel_after(&fresh, 0);
        prop_assert_eq!(&incremental, &cold);

        // A reconciling full sync, and the sync that deletes what it left stale, change nothing.
        dp.full_sync(last).unwrap();
        dp.partial_sync(last, &PlanDelta::default()).unwrap();
        prop_assert_eq!(&kernel_after(&dp, 0), &cold);
    }
}

#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The netlink executor against the real kernel, in namespaces these tests create: random plans
//! applied over netlink in one namespace and as `nft -f` text in another must list identically
//! (`nft -j`, handles and element order normalised); kernel errors name the operation; the
//! netlink listing matches what was applied and sees drift.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use kproxy_nft_netlink::{NetlinkExecutor, TableListing, list_table};
use kproxy_nftables::transaction::{Op, TableFamily, TableRef, Transaction};
use kproxy_nftables::{Config, ExecError, Executor, NftCommand, NftablesDataplane};
use kproxy_plan::*;
use kproxy_state::{IpFamily, Protocol};
use kproxy_testbed::Netns;
use kproxy_testbed::kernel::require_root;
use proptest::prelude::*;
use serde_json::Value;

/// One randomly shaped service port.
#[derive(Debug, Clone)]
struct Shape {
    endpoints: usize,
    local: usize,
    node_port: bool,
    lb: bool,
    affinity: bool,
    etp_local: bool,
    source_ranges: bool,
    udp: bool,
}

fn shape() -> impl Strategy<Value = Shape> {
    (0usize..5, 0usize..3, any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>())
        .prop_map(|(endpoints, local, node_port, lb, affinity, etp_local, source_ranges, udp)| Shape {
            endpoints,
            local: local.min(endpoints),
            node_port,
            lb,
            affinity,
            etp_local,
            source_ranges,
            udp,
        })
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn node() -> NodePlan {
    NodePlan {
        node_ip: Some(v4(198, 18, 0, 2)),
        local_traffic: LocalTraffic::SourceCidrs(vec!["198.18.16.0/20".parse().unwrap()]),
        nodeport_addresses: NodePortAddresses::Only(vec![v4(198, 18, 0, 2)]),
        snat: SnatPolicy {
            no_masquerade_cidrs: vec!["198.19.0.0/16".parse().unwrap()],
            source: SnatSource::Masquerade,
            fell_back_to_masquerade: false,
        },
        service_cidrs: vec!["198.18.128.0/17".parse().unwrap()],
        acceleration: false,
    }
}

fn service(i: usize, s: &Shape) -> ServicePortPlan {
    let protocol = if s.udp { Protocol::Udp } else { Protocol::Tcp };
    let name = ServicePortName { namespace: "ns".into(), service: format!("svc{i}"), port: "p".into(), protocol };
    let eps: Vec<Endpoint> = (0..s.endpoints)
        .map(|e| Endpoint {
            ip: v4(198, 18, if e < s.local { 16 } else { 40 }, (i * 8 + e + 2) as u8),
            port: 8080,
            is_local: e < s.local,
            ready: true,
        })
        .collect();
    let local: Vec<Endpoint> = eps.iter().filter(|e| e.is_local).cloned().collect();
    let none = |eps: &[Endpoint]| eps.is_empty().then_some(NoEndpointsVerdict::Reject);
    let external = (s.node_port || s.lb).then(|| ExternalTraffic {
        policy: if s.etp_local { ExternalPolicy::Local { short_circuit_pods: true } } else { ExternalPolicy::Cluster },
        no_endpoints: if s.etp_local && !eps.is_empty() && local.is_empty() {
            Some(NoEndpointsVerdict::Drop)
        } else if s.etp_local {
            none(&local)
        } else {
            none(&eps)
        },
    });
    ServicePortPlan {
        name,
        cluster_ip: v4(198, 18, 128, (i + 10) as u8),
        port: 80,
        protocol,
        node_port: s.node_port.then_some(30000 + i as u16),
        external_ips: vec![],
        load_balancer_ips: if s.lb { vec![v4(203, 0, 113, (i + 1) as u8)] } else { vec![] },
        source_ranges: if s.lb && s.source_ranges { vec!["198.18.0.0/24".parse().unwrap()] } else { vec![] },
        affinity_timeout: s.affinity.then_some(30),
        cluster_endpoints: eps.clone(),
        local_endpoints: local,
        internal: InternalTraffic {
            local: false,
            masquerade: MasqueradeWhen::SourceNotLocal,
            no_endpoints: none(&eps),
        },
        external,
        health_check_node_port: None,
        accelerate: false,
    }
}

fn plan(shapes: &[Shape]) -> Plan {
    let services: BTreeMap<ServicePortName, Arc<ServicePortPlan>> =
        shapes.iter().enumerate().map(|(i, s)| service(i, s)).map(|p| (p.name.clone(), Arc::new(p))).collect();
    let fam = FamilyPlan { family: IpFamily::V4, node: node(), services };
    Plan { families: [(IpFamily::V4, fam)].into_iter().collect() }
}

/// `nft -j list table ip kproxy` without handles, element lists sorted.
fn listing(ns: &Netns) -> Value {
    let out = ns.exec_ok("nft", &["-j", "list", "table", "ip", "kproxy"]).unwrap();
    let mut v: Value = serde_json::from_str(&out).unwrap();
    normalize(&mut v);
    v
}

fn normalize(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("handle");
            m.remove("metainfo");
            m.values_mut().for_each(normalize);
            if let Some(Value::Array(elems)) = m.get_mut("elem") {
                elems.sort_by_key(|e| e.to_string());
            }
        }
        Value::Array(a) => a.iter_mut().for_each(normalize),
        _ => {}
    }
}

/// Applies `plan` (then `next` incrementally, when given) over netlink in one namespace and
/// through `nft -f` text in another; returns both listings.
fn both_ways(plan: &Plan, next: Option<&Plan>) -> (Value, Value) {
    fn run<E: Executor + Send>(ns: &Netns, exec: E, plan: &Plan, next: Option<&Plan>) -> Value {
        ns.run_in(|| {
            let mut dp = NftablesDataplane::new(exec, Config::default());
            dp.full_sync(plan).unwrap();
            if let Some(next) = next {
                dp.partial_sync(next, &PlanDelta::between(plan, next)).unwrap();
            }
        })
        .unwrap();
        listing(ns)
    }
    let a = Netns::new("nlexec").unwrap();
    let b = Netns::new("nltext").unwrap();
    (run(&a, NetlinkExecutor::new(), plan, next), run(&b, NftCommand::new(), plan, next))
}

#[test]
fn the_example_shapes_list_the_same_either_way() {
    if !require_root() {
        return;
    }
    let all = Shape {
        endpoints: 3,
        local: 1,
        node_port: true,
        lb: true,
        affinity: true,
        etp_local: true,
        source_ranges: true,
        udp: false,
    };
    let shapes = vec![
        all.clone(),
        Shape { etp_local: false, affinity: false, udp: true, ..all.clone() },
        Shape { endpoints: 0, local: 0, ..all },
    ];
    let (netlink, text) = both_ways(&plan(&shapes), None);
    assert!(netlink.to_string().contains("dnat"), "{netlink}");
    assert_eq!(differences(&netlink, &text), Vec::<String>::new());
}

/// The lines of the pretty-printed listings that differ (netlink `-`, text `+`).
fn differences(netlink: &Value, text: &Value) -> Vec<String> {
    let a = serde_json::to_string_pretty(netlink).unwrap();
    let b = serde_json::to_string_pretty(text).unwrap();
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let mut out: Vec<String> = a.iter().filter(|l| !b.contains(l)).map(|l| format!("- {l}")).collect();
    out.extend(b.iter().filter(|l| !a.contains(l)).map(|l| format!("+ {l}")));
    if out.is_empty() && a.len() != b.len() {
        out.push(format!("{} lines vs {}", a.len(), b.len()));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn random_plans_and_changes_list_the_same_either_way(
        first in prop::collection::vec(shape(), 1..6),
        second in prop::collection::vec(shape(), 1..6),
    ) {
        if !require_root() {
            return Ok(());
        }
        let (p1, p2) = (plan(&first), plan(&second));
        let (netlink, text) = both_ways(&p1, Some(&p2));
        prop_assert!(differences(&netlink, &text).is_empty(), "{:#?}", differences(&netlink, &text));
    }
}

#[test]
fn a_rejected_operation_is_named_and_nothing_is_applied() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("nlerr").unwrap();
    let t = TableRef { family: TableFamily::Ip, name: "kproxy".into() };
    let mut tx = Transaction::new();
    tx.push(Op::AddTable { table: t.clone(), comment: None });
    tx.push(Op::AddChain(t.clone(), kproxy_nftables::transaction::Chain { name: "a".into(), hook: None }));
    tx.add_rules(&t, "a", ["drop".to_owned(), "goto missing-chain".to_owned(), "accept".to_owned()]);
    let err = ns.run_in(|| NetlinkExecutor::new().apply(&tx)).unwrap().unwrap_err();
    match err {
        ExecError::Kernel { index, op, source } => {
            assert_eq!(index, 3, "{op}");
            assert!(op.contains("goto missing-chain"), "{op}");
            assert_eq!(source.raw_os_error(), Some(2), "{source}");
        }
        other => panic!("unexpected {other}"),
    }
    // Atomic: not even the table exists.
    let out = ns.exec("nft", &["list", "table", "ip", "kproxy"]).unwrap();
    assert!(!out.status.success());
}

#[test]
fn the_listing_matches_what_was_applied_and_sees_drift() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("nllist").unwrap();
    let shapes = vec![
        Shape {
            endpoints: 2,
            local: 1,
            node_port: true,
            lb: true,
            affinity: true,
            etp_local: true,
            source_ranges: true,
            udp: false
        };
        3
    ];
    let plan = plan(&shapes);
    let table = TableRef { family: TableFamily::Ip, name: "kproxy".into() };
    let tx = NftablesDataplane::new(kproxy_nftables::Recording::default(), Config::default()).render_initial(&plan);
    let expected = TableListing::expected(&tx, &table);
    let (before, after) = ns
        .run_in(|| {
            let mut exec = NetlinkExecutor::new();
            exec.apply(&tx).unwrap();
            let before = list_table(&mut exec, &table).unwrap();
            let mut drift = Transaction::new();
            drift.add_rules(&table, "services", ["drop".to_owned()]);
            exec.apply(&drift).unwrap();
            (before, list_table(&mut exec, &table).unwrap())
        })
        .unwrap();
    assert!(expected.chains.len() > 15 && expected.sets.values().any(|n| n.is_some_and(|n| n > 3)), "{expected:?}");
    assert_eq!(before.drift(&expected), Vec::<String>::new());
    assert_eq!(after.drift(&expected), vec!["chain services has 3 rules, expected 2".to_owned()]);
}

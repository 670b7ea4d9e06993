#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The netlink executor against the real kernel, in namespaces these tests create: random plans
//! applied over netlink in one namespace and as `nft -f` text in another must list identically
//! (`nft -j`, handles and element order normalised); kernel errors name the operation; the
//! netlink listing matches what was applied and sees drift.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use kproxy_nft_model::{Chain, Element, MapData, Op, Rule, SetDef, SetType, TableFamily, TableRef, Transaction, parse};
use kproxy_nft_netlink::{NetlinkExecutor, TableListing, list_table};

/// A rule written as nft text (the pick-dataplane cases are generated as text).
fn rule(text: &str) -> Rule {
    parse::rule(text).unwrap_or_else(|e| panic!("{e}"))
}

/// Rules written as nft text, appended to `chain`.
fn add_rules<const N: usize>(tx: &mut Transaction, t: &TableRef, chain: &str, rules: [String; N]) {
    tx.add_rules(t, chain, rules.iter().map(|r| rule(r)));
}

/// Fields written as nft text (`ip daddr . th dport`).
fn fields(text: &str) -> Vec<kproxy_nft_model::Field> {
    match rule(&format!("{text} @s")).0.pop() {
        Some(kproxy_nft_model::Stmt::Lookup { key, .. }) => key,
        other => panic!("{other:?}"),
    }
}
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
    let name =
        ServicePortName { namespace: "ns".into(), service: format!("svc{i}").into(), port: "p".into(), protocol };
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
        serving_endpoints: Vec::new(),
    }
}

fn plan(shapes: &[Shape]) -> Plan {
    let services: BTreeMap<ServicePortName, Arc<ServicePortPlan>> =
        shapes.iter().enumerate().map(|(i, s)| service(i, s)).map(|p| (p.name.clone(), Arc::new(p))).collect();
    let fam = FamilyPlan { family: IpFamily::V4, node: node(), services };
    Plan { families: [(IpFamily::V4, fam)].into_iter().collect() }
}

/// The namespace's ruleset, comparable (see [`kproxy_testbed::nft_listing`]).
fn listing(ns: &Netns) -> Value {
    kproxy_testbed::nft_listing(ns).unwrap()
}

/// Applies `plan` (then `next` incrementally, when given) and then the `extra` transactions
/// over netlink in one namespace and through `nft -f` text in another; returns both listings.
fn both_ways(plan: &Plan, next: Option<&Plan>, extra: &[Transaction]) -> (Value, Value) {
    fn run<E: Executor + Send>(
        ns: &Netns,
        exec: fn() -> E,
        plan: &Plan,
        next: Option<&Plan>,
        extra: &[Transaction],
    ) -> Value {
        ns.run_in(|| {
            let mut dp = NftablesDataplane::new(exec(), Config::default());
            dp.full_sync(plan).unwrap();
            if let Some(next) = next {
                dp.partial_sync(next, &PlanDelta::between(plan, next)).unwrap();
            }
            let mut e = exec();
            for tx in extra {
                e.apply(tx).unwrap();
            }
        })
        .unwrap();
        listing(ns)
    }
    let a = Netns::new("nlexec").unwrap();
    let b = Netns::new("nltext").unwrap();
    (run(&a, NetlinkExecutor::new, plan, next, extra), run(&b, NftCommand::new, plan, next, extra))
}

/// A service of the endpoint-pick dataplane: endpoints picked by `numgen` from shared maps.
#[derive(Debug, Clone)]
struct Pick {
    v6: bool,
    proto: &'static str,
    node_port: bool,
    endpoints: usize,
}

fn pick() -> impl Strategy<Value = Pick> {
    (any::<bool>(), prop::sample::select(PROTOS.to_vec()), any::<bool>(), 1usize..5)
        .prop_map(|(v6, proto, node_port, endpoints)| Pick { v6, proto, node_port, endpoints })
}

/// The protocols with endpoint maps of their own.
const PROTOS: [&str; 3] = ["tcp", "udp", "sctp"];

/// The slot count a service with `n` endpoints uses (its cap set and pick chain).
fn cap(n: usize) -> usize {
    n.next_power_of_two()
}

const CAPS: [usize; 3] = [1, 2, 4];

fn pick_table(v6: bool) -> TableRef {
    TableRef { family: if v6 { TableFamily::Ip6 } else { TableFamily::Ip }, name: "pick".into() }
}

/// The pick skeleton of one family: shared endpoint maps (declared by `typeof`), one cap set
/// and pick chain per slot count, dispatched by cap-set `goto` rules. The renderer's form is
/// one map per class, keyspace and protocol, whose data names the protocol's port, read by
/// rules that match the protocol explicitly; the four older maps shared by all protocols
/// (data `tcp dport`, nft's implicit protocol match, or `th dport`) are kept alongside.
fn pick_skeleton(tx: &mut Transaction, v6: bool) {
    let t = pick_table(v6);
    let ip = if v6 { "ip6" } else { "ip" };
    tx.push(Op::AddTable { table: t.clone(), comment: None });
    let chain = |name: String| Op::AddChain(t.clone(), Chain { name, hook: None });
    tx.push(chain("pick".into()));
    // The data's port as the renderer names it (`tcp dport`) and as `th dport`: same type.
    let map = |name: &str, key: String, port: &str, comment: Option<&str>| {
        Op::AddSet(
            t.clone(),
            SetDef {
                comment: comment.map(str::to_owned),
                ..SetDef::new(
                    name,
                    SetType::Typeof { key: fields(&key), data: Some(fields(&format!("{ip} daddr . {port} dport"))) },
                )
            },
        )
    };
    let service_key = format!("{ip} daddr . meta l4proto . th dport . numgen random mod 2");
    let nodeport_key = "meta l4proto . th dport . numgen random mod 2".to_owned();
    tx.push(map("cluster-endpoints", service_key.clone(), "tcp", Some("Endpoints by numgen slot")));
    tx.push(map("local-endpoints", service_key, "th", None));
    tx.push(map("cluster-nodeport-endpoints", nodeport_key.clone(), "tcp", Some("NodePort endpoints")));
    tx.push(map("local-nodeport-endpoints", nodeport_key.clone(), "th", None));
    for proto in PROTOS {
        for class in ["cluster", "local"] {
            let comment = format!("{class} {proto} endpoints by destination and slot");
            let service_key = format!("{ip} daddr . meta l4proto . th dport . numgen random mod 2");
            tx.push(map(&format!("{class}-{proto}-endpoints"), service_key, proto, Some(&comment)));
            tx.push(map(&format!("{class}-nodeport-{proto}-endpoints"), nodeport_key.clone(), proto, None));
        }
    }
    let addr = if v6 { "ipv6_addr" } else { "ipv4_addr" };
    for c in CAPS {
        let set = |name: String, key: String| {
            parse::op(&format!("add set {t} {name} {{ type {key}; }}")).unwrap_or_else(|e| panic!("{e}"))
        };
        tx.push(set(format!("cluster-cap-{c}"), format!("{addr} . inet_proto . inet_service")));
        tx.push(set(format!("cluster-nodeport-cap-{c}"), "inet_proto . inet_service".into()));
        tx.push(chain(format!("pick-cluster-{c}")));
        tx.push(chain(format!("pick-cluster-nodeport-{c}")));
        add_rules(
            tx,
            &t,
            "pick",
            [
                format!("{ip} daddr . meta l4proto . th dport @cluster-cap-{c} goto pick-cluster-{c}"),
                format!("meta l4proto . th dport @cluster-nodeport-cap-{c} goto pick-cluster-nodeport-{c}"),
            ],
        );
        add_rules(
            tx,
            &t,
            &format!("pick-cluster-{c}"),
            [format!(
                "dnat {ip} to {ip} daddr . meta l4proto . th dport . numgen random mod {c} map @cluster-endpoints"
            )],
        );
        add_rules(
            tx,
            &t,
            &format!("pick-cluster-nodeport-{c}"),
            [format!("dnat {ip} to meta l4proto . th dport . numgen random mod {c} map @cluster-nodeport-endpoints")],
        );
        for proto in PROTOS {
            let dnat = |key: &str, map: &str| {
                format!("meta l4proto {proto} dnat {ip} to {key} . numgen random mod {c} map @{map}")
            };
            let service = format!("{ip} daddr . meta l4proto . th dport");
            let nodeport = "meta l4proto . th dport";
            add_rules(tx, &t, &format!("pick-cluster-{c}"), [dnat(&service, &format!("cluster-{proto}-endpoints"))]);
            add_rules(
                tx,
                &t,
                &format!("pick-cluster-nodeport-{c}"),
                [dnat(nodeport, &format!("cluster-nodeport-{proto}-endpoints"))],
            );
            add_rules(
                tx,
                &t,
                "pick",
                [
                    dnat(&service, &format!("local-{proto}-endpoints")),
                    dnat(nodeport, &format!("local-nodeport-{proto}-endpoints")),
                ],
            );
        }
    }
    add_rules(
        tx,
        &t,
        "pick",
        [
            format!("dnat {ip} to {ip} daddr . meta l4proto . th dport . numgen random mod 65536 map @local-endpoints"),
            format!("dnat {ip} to meta l4proto . th dport . numgen random mod 3 map @local-nodeport-endpoints"),
            "goto pick-cluster-1".to_owned(),
        ],
    );
}

/// The elements of service `i` (cap-set entries and one map element per slot), as added with
/// `generation`'s endpoint addresses, or as deleted (keys only).
fn pick_elements(tx: &mut Transaction, i: usize, p: &Pick, generation: u8, add: bool) {
    let t = pick_table(p.v6);
    let proto = p.proto;
    let service_ip = if p.v6 { format!("fd00:96::{:x}", i + 10) } else { format!("198.18.128.{}", i + 10) };
    let endpoint = |e: usize| {
        if p.v6 {
            format!("fd00:16::{:x}:{:x}", generation, e + 2)
        } else {
            format!("198.18.{}.{}", 16 + generation, e + 2)
        }
    };
    let port = 80 + i;
    let node_port = 30000 + i;
    let c = cap(p.endpoints);
    let mut push = |set: String, key: String, value: Option<String>| {
        let value = value.filter(|_| add).map(|v| MapData::Value(parse::key(&v).unwrap()));
        let e = Element { set, key: parse::key(&key).unwrap(), value };
        tx.push(if add { Op::AddElement(t.clone(), e) } else { Op::DeleteElement(t.clone(), e) });
    };
    push(format!("cluster-cap-{c}"), format!("{service_ip} . {proto} . {port}"), None);
    if p.node_port {
        push(format!("cluster-nodeport-cap-{c}"), format!("{proto} . {node_port}"), None);
    }
    for slot in 0..c {
        let data = Some(format!("{} . 8080", endpoint(slot % p.endpoints)));
        let key = format!("{service_ip} . {proto} . {port} . {slot:#x}");
        push("cluster-endpoints".into(), key.clone(), data.clone());
        push("local-endpoints".into(), key.clone(), data.clone());
        push(format!("cluster-{proto}-endpoints"), key.clone(), data.clone());
        if slot == 0 {
            push(format!("local-{proto}-endpoints"), key, data.clone());
        }
        if p.node_port {
            let key = format!("{proto} . {node_port} . {slot:#x}");
            push("cluster-nodeport-endpoints".into(), key.clone(), data.clone());
            push(format!("cluster-nodeport-{proto}-endpoints"), key.clone(), data.clone());
            push(format!("local-nodeport-{proto}-endpoints"), key, data);
        }
    }
}

/// Two transactions over the pick dataplane: the skeletons of both families with `first`'s
/// elements; then, in a later batch (sets no longer new), a chain whose rules read maps of the
/// first batch, and every service of `first` whose shape `second` changes has its elements
/// deleted and re-added with new endpoints.
fn pick_transactions(first: &[Pick], second: &[Pick]) -> Vec<Transaction> {
    let mut tx1 = Transaction::new();
    pick_skeleton(&mut tx1, false);
    pick_skeleton(&mut tx1, true);
    for (i, p) in first.iter().enumerate() {
        pick_elements(&mut tx1, i, p, 0, true);
    }
    let mut tx2 = Transaction::new();
    for v6 in [false, true] {
        let t = pick_table(v6);
        let ip = if v6 { "ip6" } else { "ip" };
        tx2.push(Op::AddChain(t.clone(), Chain { name: "pick-later".into(), hook: None }));
        add_rules(
            &mut tx2,
            &t,
            "pick-later",
            [
                format!(
                    "meta l4proto sctp dnat {ip} to {ip} daddr . meta l4proto . th dport . numgen random mod 8 map \
                     @cluster-sctp-endpoints"
                ),
                format!(
                    "meta l4proto udp dnat {ip} to meta l4proto . th dport . numgen random mod 2 map @local-nodeport-udp-endpoints"
                ),
            ],
        );
    }
    for (i, p) in first.iter().enumerate() {
        match second.get(i) {
            Some(q) if q.v6 == p.v6 => {
                pick_elements(&mut tx2, i, p, 0, false);
                pick_elements(&mut tx2, i, q, 1, true);
            }
            Some(_) => {}
            None => pick_elements(&mut tx2, i, p, 0, false),
        }
    }
    vec![tx1, tx2]
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
    let picks = [
        Pick { v6: false, proto: "tcp", node_port: true, endpoints: 3 },
        Pick { v6: true, proto: "udp", node_port: true, endpoints: 2 },
        Pick { v6: false, proto: "udp", node_port: false, endpoints: 1 },
        Pick { v6: false, proto: "sctp", node_port: true, endpoints: 2 },
        Pick { v6: true, proto: "sctp", node_port: false, endpoints: 4 },
    ];
    let changed = [Pick { endpoints: 4, ..picks[0].clone() }, Pick { endpoints: 1, ..picks[1].clone() }];
    let (netlink, text) = both_ways(&plan(&shapes), None, &pick_transactions(&picks, &changed));
    let listed = netlink.to_string();
    assert!(listed.contains("dnat") && listed.contains("numgen"), "{netlink}");
    // The maps are declared by typeof, and hold `addr . port` data after the second batch.
    assert!(listed.contains(r#""typeof""#) || listed.contains(r#""concat""#), "{netlink}");
    assert!(listed.contains("fd00:16::1:2") && listed.contains("198.18.17.5"), "{netlink}");
    // Per-protocol maps hold their protocol's endpoints, SCTP ones included.
    assert!(listed.contains("cluster-sctp-endpoints") && listed.contains("local-nodeport-udp-endpoints"), "{netlink}");
    assert!(listed.contains(r#""sctp""#) && listed.contains("pick-later"), "{netlink}");
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
        picks in prop::collection::vec(pick(), 0..6),
        changed_picks in prop::collection::vec(pick(), 0..6),
    ) {
        if !require_root() {
            return Ok(());
        }
        let (p1, p2) = (plan(&first), plan(&second));
        let (netlink, text) = both_ways(&p1, Some(&p2), &pick_transactions(&picks, &changed_picks));
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
    tx.push(Op::AddChain(t.clone(), Chain::regular("a")));
    add_rules(&mut tx, &t, "a", ["drop".to_owned(), "goto missing-chain".to_owned(), "accept".to_owned()]);
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

/// A run of one set's elements is one message: the kernel's refusal of one of them names the
/// run, and nothing is applied.
#[test]
fn a_rejected_element_of_a_run_names_the_run_and_nothing_is_applied() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("nlrun").unwrap();
    let mut tx = Transaction::new();
    for line in [
        "add table ip kproxy",
        "add set ip kproxy s { type ipv4_addr; }",
        "add element ip kproxy s { 198.18.0.1 }",
        // An IPv6 address in a set of IPv4 addresses: a key of the wrong length.
        "add element ip kproxy s { fd00::1 }",
        "add element ip kproxy s { 198.18.0.2 }",
    ] {
        tx.push(parse::op(line).unwrap());
    }
    let err = ns.run_in(|| NetlinkExecutor::new().apply(&tx)).unwrap().unwrap_err();
    match err {
        ExecError::Kernel { index, op, source } => {
            assert_eq!(index, 2, "{op}");
            assert!(op.contains("one of the 3 element operations"), "{op}");
            assert!(op.contains("198.18.0.1") && op.contains("198.18.0.2"), "{op}");
            assert_eq!(source.raw_os_error(), Some(22), "{source}");
        }
        other => panic!("unexpected {other}"),
    }
    let out = ns.exec("nft", &["list", "table", "ip", "kproxy"]).unwrap();
    assert!(!out.status.success(), "atomic: not even the table exists");
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
            let before = list_table(&mut exec, &table, true).unwrap();
            let mut drift = Transaction::new();
            add_rules(&mut drift, &table, "services", ["drop".to_owned()]);
            exec.apply(&drift).unwrap();
            (before, list_table(&mut exec, &table, true).unwrap())
        })
        .unwrap();
    assert!(expected.chains.len() > 15 && expected.sets.values().any(|n| n.is_some_and(|n| n > 3)), "{expected:?}");
    assert_eq!(before.drift(&expected), Vec::<String>::new());
    assert_eq!(after.drift(&expected), vec!["chain services has 3 rules, expected 2".to_owned()]);
}

/// Shapes with every kind of object: endpoints picked from maps, affinity chains, node ports,
/// load balancers with source ranges, Local policy.
fn rich_shapes(n: usize) -> Vec<Shape> {
    (0..n)
        .map(|i| Shape {
            endpoints: 1 + i % 4,
            local: i % 2,
            node_port: i % 2 == 0,
            lb: i % 3 == 0,
            affinity: i % 4 == 1,
            etp_local: i % 5 == 0,
            source_ranges: i % 3 == 0,
            udp: i % 2 == 1,
        })
        .collect()
}

/// What a fresh start of `plan` leaves, listed.
fn fresh_listing(plan: &Plan) -> Value {
    let ns = Netns::new("nlfresh").unwrap();
    ns.run_in(|| NftablesDataplane::new(NetlinkExecutor::new(), Config::default()).full_sync(plan).unwrap()).unwrap();
    listing(&ns)
}

#[test]
fn the_periodic_check_repairs_what_another_tool_changed_and_ignores_other_tables() {
    if !require_root() {
        return;
    }
    let plan = plan(&rich_shapes(8));
    let ns = Netns::new("nlcheck").unwrap();
    let mut dp = NftablesDataplane::new(NetlinkExecutor::new(), Config::default());
    let verify = |dp: &mut NftablesDataplane<NetlinkExecutor>| ns.run_in(|| dp.verify(&plan).unwrap()).unwrap();
    ns.run_in(|| dp.full_sync(&plan).unwrap()).unwrap();
    assert_eq!(verify(&mut dp), kproxy_nftables::Verification::Untouched, "nobody committed: nothing is listed");
    // Another program commits to its own table: listed, nothing to repair.
    ns.exec_ok("nft", &["add", "table", "ip", "other"]).unwrap();
    assert_eq!(verify(&mut dp), kproxy_nftables::Verification::Clean);
    // Another tool flushes a chain and deletes a dispatch element of kproxy's table.
    ns.exec_ok("nft", &["flush", "chain", "ip", "kproxy", "services"]).unwrap();
    ns.exec_ok("nft", &["delete", "element", "ip", "kproxy", "cluster-ips", "{ 198.18.128.10 }"]).unwrap();
    let kproxy_nftables::Verification::Repaired(drift) = verify(&mut dp) else { panic!("not repaired") };
    assert_eq!(drift.len(), 2, "{drift:?}");
    ns.exec_ok("nft", &["delete", "table", "ip", "other"]).unwrap();
    let repaired = listing(&ns);
    let fresh = fresh_listing(&plan);
    assert!(differences(&repaired, &fresh).is_empty(), "{:#?}", differences(&repaired, &fresh));
    assert_eq!(verify(&mut dp), kproxy_nftables::Verification::Clean);
    // Another tool deletes the whole table: the check rebuilds it.
    ns.exec_ok("nft", &["delete", "table", "ip", "kproxy"]).unwrap();
    assert!(matches!(verify(&mut dp), kproxy_nftables::Verification::Repaired(_)));
    let rebuilt = listing(&ns);
    assert!(differences(&rebuilt, &fresh).is_empty(), "{:#?}", differences(&rebuilt, &fresh));
    assert_eq!(verify(&mut dp), kproxy_nftables::Verification::Untouched, "the rebuild's commits were ours");
}

/// Applies through netlink and keeps every transaction, to see what a restart sends.
#[derive(Debug, Default)]
struct Watched {
    exec: NetlinkExecutor,
    sent: Vec<Transaction>,
}

impl Executor for Watched {
    fn apply(&mut self, tx: &Transaction) -> Result<(), ExecError> {
        self.sent.push(tx.clone());
        self.exec.apply(tx)
    }
    fn generation(&mut self) -> Result<Option<u32>, ExecError> {
        self.exec.generation()
    }
    fn list(&mut self, table: &TableRef) -> Result<Option<TableListing>, ExecError> {
        self.exec.list(table)
    }
}

#[test]
fn a_restart_adopts_the_live_table_in_one_transaction_without_deleting_it() {
    if !require_root() {
        return;
    }
    let before = plan(&rich_shapes(10));
    // The restarted kproxy sees one service fewer and other endpoints for another.
    let mut shapes = rich_shapes(9);
    shapes[2].endpoints = 4;
    let after = plan(&shapes);
    let ns = Netns::new("nladopt").unwrap();
    ns.run_in(|| NftablesDataplane::new(NetlinkExecutor::new(), Config::default()).full_sync(&before).unwrap())
        .unwrap();
    let mut restarted = NftablesDataplane::new(Watched::default(), Config::default());
    let report = ns.run_in(|| restarted.full_sync(&after).unwrap()).unwrap();
    assert!(report.full);
    let sent = &restarted.executor().sent;
    assert_eq!(sent.len(), 1, "one atomic transaction");
    // (Only the table of the family the plan does not have, ip6, is deleted, if it is there.)
    let live = TableRef { family: TableFamily::Ip, name: "kproxy".into() };
    assert!(!sent[0].ops().iter().any(|op| matches!(op, Op::DeleteTable(t) if *t == live)), "{}", sent[0].render());
    let adopted = listing(&ns);
    let fresh = fresh_listing(&after);
    assert!(differences(&adopted, &fresh).is_empty(), "{:#?}", differences(&adopted, &fresh));
    // And it keeps following the kernel from there: nobody committed since its adoption.
    assert_eq!(ns.run_in(|| restarted.verify(&after).unwrap()).unwrap(), kproxy_nftables::Verification::Untouched);
}

#[test]
fn a_listing_taken_while_another_process_commits_to_the_table_is_one_ruleset() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("nlconsistent").unwrap();
    let table = TableRef { family: TableFamily::Ip, name: "shared".into() };
    // A chain and a set, and another process that adds (then removes) a rule and an element
    // together, in single transactions: any one ruleset has both or neither.
    ns.nft("add table ip shared\nadd chain ip shared c\nadd set ip shared s { type ipv4_addr; }\nadd element ip shared s { 192.0.2.1 }")
        .unwrap();
    use std::sync::atomic::{AtomicUsize, Ordering};
    let commits = Arc::new(AtomicUsize::new(0));
    let committer = {
        let (commits, name) = (commits.clone(), ns.name().to_owned());
        std::thread::spawn(move || {
            let add = "add rule ip shared c counter\nadd element ip shared s { 192.0.2.2 }";
            let remove = "flush chain ip shared c\ndelete element ip shared s { 192.0.2.2 }";
            while commits.load(Ordering::Relaxed) < 60 {
                for script in [add, remove] {
                    let out = std::process::Command::new("ip")
                        .args(["netns", "exec", &name, "nft", script])
                        .output()
                        .unwrap();
                    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                    commits.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    // List back to back for as long as the other process commits.
    let listings = ns
        .run_in(|| {
            let mut exec = NetlinkExecutor::new();
            let mut listings = Vec::new();
            while commits.load(Ordering::Relaxed) < 60 {
                match list_table(&mut exec, &table, true) {
                    Ok(listing) => listings.push(listing),
                    // Every attempt met a commit: no listing is the right answer.
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => panic!("listing failed: {e}"),
                }
            }
            listings
        })
        .unwrap();
    committer.join().unwrap();
    assert!(listings.len() > 60, "listings were taken throughout: {}", listings.len());
    let mut seen = std::collections::BTreeSet::new();
    for listing in &listings {
        let state = (listing.chains.get("c").copied(), listing.sets.get("s").copied().flatten());
        assert!(
            matches!(state, (Some(0), Some(1)) | (Some(1), Some(2))),
            "a listing mixed two rulesets (rules in c, elements in s): {state:?}"
        );
        seen.insert(state);
    }
    assert_eq!(seen.len(), 2, "both rulesets were listed: {seen:?}");
}

/// The socket of `exec`, opened in `ns`, joins nf_tables' notices with the smallest receive
/// buffer the kernel allows: the next commit of any size overruns it (`ENOBUFS`), as a dump reader
/// is overrun when the kernel has more for it than its buffer holds.
fn overrunnable_executor(ns: &Netns) -> NetlinkExecutor {
    use nix::sys::socket::{setsockopt, sockopt};
    use std::os::fd::AsFd;
    ns.run_in(|| {
        let mut exec = NetlinkExecutor::new();
        let sock = exec.socket().unwrap();
        sock.subscribe(kproxy_nft_netlink::sys::NFNLGRP_NFTABLES).unwrap();
        setsockopt(&sock.as_fd(), sockopt::RcvBuf, &0).unwrap();
        exec
    })
    .unwrap()
}

/// Another process's commit of 500 rules (coalesced into about 25 notices) to its own table.
fn commit_many_rules(ns: &Netns, round: usize) {
    let rules: String =
        (0..500).map(|i| format!("add rule ip other c{round} udp dport {} accept\n", 1000 + i)).collect();
    ns.nft(&format!("add table ip other\nadd chain ip other c{round}\n{rules}")).unwrap();
}

/// Runs `f` in `ns` and returns what it returned; fails the test if it has not within 10 s (a
/// request whose reply the kernel dropped waits forever).
fn answered_in<T: Send + 'static>(ns: &Netns, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (answered_tx, answered) = std::sync::mpsc::channel();
    let _thread = ns.spawn_in("request", move || answered_tx.send(f()).unwrap()).unwrap();
    answered.recv_timeout(std::time::Duration::from_secs(10)).expect("an answer within 10 s")
}

#[test]
fn a_listing_or_request_on_a_socket_the_kernel_overran_is_answered_on_a_fresh_socket() {
    if !require_root() {
        return;
    }
    use kproxy_nft_model::Executor as _;
    let ns = Netns::new("nloverrun").unwrap();
    let table = TableRef { family: TableFamily::Ip, name: "shared".into() };
    ns.nft("add table ip shared\nadd chain ip shared c\nadd rule ip shared c counter\nadd set ip shared s { type ipv4_addr; }\nadd element ip shared s { 192.0.2.1, 192.0.2.2 }")
        .unwrap();
    // The fault is real: a request on an overrun socket gets ENOBUFS.
    let mut probe = overrunnable_executor(&ns);
    commit_many_rules(&ns, 1);
    let error = probe.socket().unwrap().generation().unwrap_err();
    assert_eq!(error.raw_os_error(), Some(nix::libc::ENOBUFS), "the socket was overrun: {error}");

    // A listing on an overrun socket starts afresh and lists the table as it is.
    let mut exec = overrunnable_executor(&ns);
    commit_many_rules(&ns, 2);
    let listing = answered_in(&ns, move || list_table(&mut exec, &table, true)).unwrap();
    assert_eq!(listing.chains, BTreeMap::from([("c".to_owned(), 1)]), "{listing:?}");
    assert_eq!(listing.sets, BTreeMap::from([("s".to_owned(), Some(2))]), "{listing:?}");

    // A request that met the overrun leaves the executor with a fresh socket. Kept, the overrun
    // socket would stay full and lose the next reply: the request after would wait forever.
    let mut exec = overrunnable_executor(&ns);
    commit_many_rules(&ns, 3);
    let failed = exec.generation().unwrap_err();
    assert!(
        matches!(&failed, ExecError::Netlink(e) if e.raw_os_error() == Some(nix::libc::ENOBUFS)),
        "the overrun is reported: {failed}"
    );
    commit_many_rules(&ns, 4);
    let next = answered_in(&ns, move || exec.generation());
    assert!(matches!(next, Ok(Some(_))), "the next request succeeds: {next:?}");
}

#[test]
fn the_monitor_reports_other_processes_commits_to_the_watched_table_and_no_other() {
    if !require_root() {
        return;
    }
    use kproxy_nft_model::Executor as _;
    use kproxy_nft_netlink::monitor::{Commit, Monitor, Notice};
    let ns = Netns::new("nlmonitor").unwrap();
    let watched = TableRef { family: TableFamily::Ip, name: "watched".into() };
    ns.nft("add table ip watched\nadd chain ip watched c\nadd table ip other\nadd chain ip other c").unwrap();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    let monitor = {
        let watched = watched.clone();
        ns.spawn_in("monitor", move || {
            let mut monitor = Monitor::open(&[watched]).unwrap();
            ready_tx.send(()).unwrap();
            monitor.wait().unwrap()
        })
        .unwrap()
    };
    ready.recv().unwrap();
    // This process's own commit to the watched table: not reported. Its thread lives on until
    // the end, as kproxy's sync thread does (the notice names the committing thread).
    let (committed_tx, committed) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let own = {
        let watched = watched.clone();
        ns.spawn_in("own-commit", move || {
            let mut tx = Transaction::new();
            tx.push(Op::AddRule { table: watched, chain: "c".into(), rule: rule("counter"), comment: None });
            committed_tx.send(NetlinkExecutor::new().apply(&tx)).unwrap();
            let _ = released.recv();
        })
        .unwrap()
    };
    committed.recv().unwrap().unwrap();
    // Another process's commit to another table: not reported.
    ns.nft("add rule ip other c counter").unwrap();
    // Another process's commit to the watched table: reported, with its generation.
    ns.nft("add rule ip watched c counter").unwrap();
    let generation = ns.run_in(|| NetlinkExecutor::new().generation()).unwrap().unwrap().unwrap();
    let notice = monitor.join().unwrap();
    drop(release);
    own.join().unwrap();
    let commit = Commit { generation, elements_added: 0, elements_deleted: 0, objects: 1 };
    assert_eq!(notice, Notice::Touched(commit), "only the last of three commits is reported, with the rule it added");
}

/// The notice of a commit counts the elements it added to and deleted from the watched table,
/// as the kernel reports them (a benchmark's count of what a change cost), and keeps the added
/// ones when asked; with `with_own_commits` this process's commits are reported too.
#[test]
fn the_monitor_counts_the_elements_each_commit_adds_and_deletes() {
    if !require_root() {
        return;
    }
    use kproxy_nft_model::Executor as _;
    use kproxy_nft_netlink::monitor::{Commit, Monitor, Notice};
    let ns = Netns::new("nlmoncount").unwrap();
    let t = TableRef { family: TableFamily::Ip, name: "counted".into() };
    ns.nft("add table ip counted\nadd set ip counted s { type ipv4_addr; }\nadd table ip other\nadd set ip other s { type ipv4_addr; }").unwrap();
    let other = TableRef { family: TableFamily::Ip, name: "other".into() };
    let element = |ip: &str| Element::new("s", kproxy_nft_model::Value::Addr(ip.parse().unwrap()));
    let (first, first_added, second) = ns
        .run_in(|| {
            let mut monitor = Monitor::open(std::slice::from_ref(&t)).unwrap().with_own_commits().with_added_elements();
            let mut exec = NetlinkExecutor::new();
            let mut tx = Transaction::new();
            for ip in ["198.18.0.1", "198.18.0.2", "198.18.0.3"] {
                tx.push(Op::AddElement(t.clone(), element(ip)));
            }
            // Elements of another table are not counted.
            tx.push(Op::AddElement(other.clone(), element("198.18.0.1")));
            exec.apply(&tx).unwrap();
            let first = monitor.wait().unwrap();
            let first_added = monitor.take_added();
            let mut tx = Transaction::new();
            tx.push(Op::DeleteElement(t.clone(), element("198.18.0.1")));
            tx.push(Op::AddElement(t.clone(), element("198.18.0.4")));
            exec.apply(&tx).unwrap();
            (first, first_added, monitor.wait().unwrap())
        })
        .unwrap();
    let counts = |n: &Notice| match n {
        Notice::Touched(Commit { elements_added, elements_deleted, objects, .. }) => {
            (*elements_added, *elements_deleted, *objects)
        }
        Notice::Overrun => panic!("notifications lost"),
    };
    assert_eq!(counts(&first), (3, 0, 0));
    let mut keys: Vec<Vec<u8>> = first_added.iter().map(|e| e.key.clone()).collect();
    keys.sort();
    assert_eq!(keys, vec![vec![198, 18, 0, 1], vec![198, 18, 0, 2], vec![198, 18, 0, 3]]);
    assert!(first_added.iter().all(|e| e.set == "s" && e.data.is_none()), "{first_added:?}");
    assert_eq!(counts(&second), (1, 1, 0));
}

/// What the executor reads back from an endpoints map (a restart's endpoint slots) is what was
/// written into it, in both families.
#[test]
fn an_endpoints_map_reads_back_as_written() {
    if !require_root() {
        return;
    }
    use kproxy_nft_model::{Executor as _, Field, Key, Value};
    let ns = Netns::new("nlraise").unwrap();
    for (family, table_family, dest, ep) in [
        (IpFamily::V4, TableFamily::Ip, "198.18.128.10", "198.18.16.2"),
        (IpFamily::V6, TableFamily::Ip6, "fd00:96::10", "fd00:16::2"),
    ] {
        let t = TableRef { family: table_family, name: "raised".into() };
        let key = vec![Field::Daddr(family), Field::L4Proto, Field::ThDport, Field::Numgen(2)];
        let data = Some(vec![Field::Daddr(family), Field::Dport(Protocol::Udp)]);
        let def = SetDef::new("cluster-udp-endpoints", SetType::Typeof { key, data });
        let elements: Vec<Element> = (0..300u32)
            .map(|slot| {
                let dest: IpAddr = dest.parse().unwrap();
                let ep: IpAddr = ep.parse().unwrap();
                let key = Key(vec![Value::Addr(dest), Value::Proto(Protocol::Udp), Value::Port(53), Value::Int(slot)]);
                let value = MapData::Value(Key(vec![Value::Addr(ep), Value::Port(5300 + slot as u16)]));
                Element::mapped(def.name.clone(), key, value)
            })
            .collect();
        let mut tx = Transaction::new();
        tx.push(Op::AddTable { table: t.clone(), comment: None });
        tx.push(Op::AddSet(t.clone(), def.clone()));
        elements.iter().for_each(|e| tx.push(Op::AddElement(t.clone(), e.clone())));
        let read = ns
            .run_in(|| {
                let mut exec = NetlinkExecutor::new();
                exec.apply(&tx).unwrap();
                exec.elements(&t, &def).unwrap()
            })
            .unwrap();
        let mut read = read.expect("an endpoints map reads back");
        read.sort();
        let mut want = elements;
        want.sort();
        assert_eq!(read, want, "{family:?}");
        let missing = SetDef { name: "local-udp-endpoints".into(), ..def };
        let none = ns.run_in(|| NetlinkExecutor::new().elements(&t, &missing).unwrap()).unwrap();
        assert_eq!(none, Some(Vec::new()), "a missing map has no element");
    }
}

#[test]
fn tables_lists_every_family_and_name_of_other_programs_tables() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("nltables").unwrap();
    ns.nft("table ip kube-proxy {}\ntable ip6 kube-proxy {}\ntable inet other {}\ntable ip nat {}").unwrap();
    let listed = ns.run_in(|| kproxy_nft_netlink::listing::tables(&mut NetlinkExecutor::new()).unwrap()).unwrap();
    let t = |family, name: &str| TableRef { family, name: name.to_owned() };
    assert_eq!(
        listed,
        vec![
            t(TableFamily::Ip, "kube-proxy"),
            t(TableFamily::Ip, "nat"),
            t(TableFamily::Ip6, "kube-proxy"),
            t(TableFamily::Inet, "other")
        ]
    );
    let chains = ns
        .run_in(|| {
            ns.nft("table ip nat {\n chain KUBE-SERVICES {\n }\n chain POSTROUTING { type nat hook postrouting priority srcnat; }\n}")
                .unwrap();
            let nat = t(TableFamily::Ip, "nat");
            let mut exec = NetlinkExecutor::new();
            let mut names = kproxy_nft_netlink::listing::chain_names(&mut exec, &nat).unwrap();
            names.sort();
            (names, kproxy_nft_netlink::listing::chain_names(&mut exec, &t(TableFamily::Ip6, "nat")).unwrap())
        })
        .unwrap();
    assert_eq!(chains, (vec!["KUBE-SERVICES".to_owned(), "POSTROUTING".to_owned()], vec![]));
    let empty = Netns::new("nlnotables").unwrap();
    assert_eq!(empty.run_in(|| kproxy_nft_netlink::listing::tables(&mut NetlinkExecutor::new()).unwrap()).unwrap(), []);
}

#[test]
fn ipsets_are_listed_by_name_and_destroyed_unless_an_iptables_rule_refers_to_them() {
    if !require_root() {
        return;
    }
    use kproxy_nft_netlink::ipset::IpsetClient;
    let ns = Netns::new("nlipset").unwrap();
    for (name, kind) in
        [("KUBE-CLUSTER-IP", "hash:ip,port"), ("KUBE-6-LOOP-BACK", "hash:ip,port,ip"), ("other", "hash:ip")]
    {
        let family = if name.contains("-6-") { "inet6" } else { "inet" };
        ns.exec_ok("ipset", &["create", name, kind, "family", family]).unwrap();
    }
    ns.exec_ok(
        "iptables-legacy",
        &["-t", "nat", "-A", "PREROUTING", "-m", "set", "--match-set", "KUBE-CLUSTER-IP", "dst,dst", "-j", "ACCEPT"],
    )
    .unwrap();
    let (names, refused, after) = ns
        .run_in(|| {
            let mut client = IpsetClient::open().unwrap();
            let names = client.names().unwrap();
            let refused = client.destroy("KUBE-CLUSTER-IP").unwrap_err().to_string();
            client.destroy("KUBE-6-LOOP-BACK").unwrap();
            client.destroy("no-such-set").unwrap();
            (names, refused, client.names().unwrap())
        })
        .unwrap();
    assert_eq!(names, ["KUBE-CLUSTER-IP", "KUBE-6-LOOP-BACK", "other"]);
    assert!(refused.contains("still in use"), "{refused}");
    assert_eq!(after, ["KUBE-CLUSTER-IP", "other"]);
    // Once the rule is gone, the set goes too: the refusal was the reference.
    ns.exec_ok("iptables-legacy", &["-t", "nat", "-F", "PREROUTING"]).unwrap();
    let last = ns
        .run_in(|| {
            let mut client = IpsetClient::open().unwrap();
            client.destroy("KUBE-CLUSTER-IP").unwrap();
            client.names().unwrap()
        })
        .unwrap();
    assert_eq!(last, ["other"]);
}

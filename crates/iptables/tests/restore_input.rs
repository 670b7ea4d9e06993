//! What the dataplane feeds `iptables-restore`, recorded (no kernel): the full restore's
//! layout, partial restores that rewrite only the changed service's chains, and when a full
//! restore comes back.

#![allow(clippy::unwrap_used)]

use kproxy_iptables::naming;
use kproxy_iptables::rules::Table;
use kproxy_iptables::{Config, IptablesDataplane, KernelTables, NfacctCounters, Recording};
use kproxy_packet_suite::{endpoint, node_objects, service, slice};
use kproxy_plan::{NodeContext, NodePortAddress, Plan, PlanDelta, Planner, ProxyPolicy, ServicePortName};
use kproxy_state::{Change, ClusterState, IpFamily, Object, Protocol};
use serde_json::json;

fn web(eps: &[&str]) -> Vec<Object> {
    web_with(eps, json!({}))
}

/// `web` with ClientIP affinity (upstream's endpoint chains stay for it).
fn web_affinity(eps: &[&str]) -> Vec<Object> {
    web_with(eps, json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}))
}

fn web_with(eps: &[&str], affinity: serde_json::Value) -> Vec<Object> {
    let ports = json!([{"name": "http", "protocol": "TCP", "port": 8080}]);
    let mut spec = json!({"type": "NodePort", "clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), affinity.as_object()) {
        spec.extend(extra.clone());
    }
    vec![
        service("default", "web", spec, json!({})),
        slice(
            "default",
            "web",
            "v4",
            "IPv4",
            ports,
            eps.iter().map(|ip| endpoint(ip, "node-b", json!({"ready": true}))).collect(),
        ),
    ]
}

fn other() -> Vec<Object> {
    vec![
        service(
            "default",
            "other",
            json!({"clusterIP": "198.18.128.11", "clusterIPs": ["198.18.128.11"],
                "ports": [{"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]}),
            json!({}),
        ),
        slice(
            "default",
            "other",
            "v4",
            "IPv4",
            json!([{"name": "dns", "protocol": "UDP", "port": 5353}]),
            vec![endpoint("198.18.17.20", "node-b", json!({"ready": true}))],
        ),
    ]
}

struct World {
    planner: Planner,
    state: ClusterState,
    plan: Plan,
}

impl World {
    fn new(objects: Vec<Object>) -> Self {
        let policy = ProxyPolicy {
            families: vec![IpFamily::V4],
            nodeport_addresses: vec![NodePortAddress::All],
            detect_local: kproxy_plan::DetectLocal::ClusterCidr(vec!["198.18.16.0/20".parse().unwrap()]),
            ..ProxyPolicy::default()
        };
        let node = NodeContext {
            name: "node-a".into(),
            node_ip_override: Vec::new(),
            local_addresses: vec!["198.18.0.2".parse().unwrap()],
        };
        let planner = Planner::new(policy, node);
        let mut state = ClusterState::new();
        for o in node_objects().into_iter().chain(objects) {
            state.apply(Change::Applied(o));
        }
        let _ = state.take_dirty();
        let plan = planner.build(&state);
        World { planner, state, plan }
    }

    fn apply(&mut self, objects: Vec<Object>) -> PlanDelta {
        for o in objects {
            self.state.apply(Change::Applied(o));
        }
        let dirty = self.state.take_dirty();
        self.planner.update(&mut self.plan, &self.state, &dirty)
    }
}

fn spn(service: &str, port: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName { namespace: "default".into(), service: service.into(), port: port.into(), protocol }
}

fn sep(service: &str, port: &str, protocol: Protocol, ip: &str, target: u16) -> String {
    let ep = kproxy_plan::Endpoint { ip: ip.parse().unwrap(), port: target, is_local: false, ready: true };
    naming::sep_chain(&spn(service, port, protocol), &ep)
}

fn declared(input: &str) -> Vec<&str> {
    input.lines().filter_map(|l| l.strip_prefix(':')).filter_map(|l| l.split_whitespace().next()).collect()
}

/// With nfacct counters (`Config::nfacct`), upstream's two counting rules: the INVALID drop
/// names its counter, and each NodePort gets a rule for 127.0.0.0/8 naming the other one, first,
/// to the same chain. Only counters that exist are named, and no localhost rule without
/// localhost NodePorts.
#[test]
fn nfacct_counters_are_named_by_the_invalid_drop_and_a_localhost_nodeport_rule() {
    let w = World::new([web(&["198.18.17.10"]), other()].concat());
    let web_ext = naming::ext_chain(&spn("web", "http", Protocol::Tcp));
    let restore = |config: Config| {
        let mut dp = IptablesDataplane::new(Recording::default(), config);
        dp.sync(&w.plan, &PlanDelta::between(&Plan::default(), &w.plan)).unwrap();
        dp.executor().last(IpFamily::V4).unwrap().to_owned()
    };
    let invalid =
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP";
    let localhost = format!(
        "-A KUBE-NODEPORTS -m comment --comment \"default/web:http\" -m tcp -p tcp -d 127.0.0.0/8 --dport 30080 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j {web_ext}"
    );
    let nodeport =
        format!("-A KUBE-NODEPORTS -m comment --comment \"default/web:http\" -m tcp -p tcp --dport 30080 -j {web_ext}");
    let both = NfacctCounters { ct_state_invalid_dropped: true, localhost_nodeports_accepted: true };

    let input = restore(Config { nfacct: both, ..Config::default() });
    let lines: Vec<&str> = input.lines().collect();
    assert!(lines.contains(&invalid), "{input}");
    let at = |line: &str| lines.iter().position(|l| *l == line).unwrap_or_else(|| panic!("no {line:?} in\n{input}"));
    assert_eq!(at(&localhost) + 1, at(&nodeport), "the localhost rule goes just before the NodePort's:\n{input}");

    let input = restore(Config {
        nfacct: NfacctCounters { ct_state_invalid_dropped: false, localhost_nodeports_accepted: true },
        ..Config::default()
    });
    assert!(input.contains("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n"), "{input}");
    assert!(input.contains(&localhost), "{input}");

    let input = restore(Config { nfacct: both, localhost_nodeports: false, ..Config::default() });
    assert!(input.contains(invalid) && !input.contains("localhost_nps_accepted_pkts"), "{input}");
    let input = restore(Config { nfacct: both, drop_invalid: false, ..Config::default() });
    assert!(!input.contains("INVALID") && input.contains(&localhost), "{input}");
    let input = restore(Config::default());
    assert!(!input.contains("nfacct"), "no counters, no -m nfacct:\n{input}");
}

#[test]
fn full_restore_has_upstreams_layout_jumps_and_localhost_nodeports() {
    let w = World::new([web(&["198.18.17.10", "198.18.17.11"]), other()].concat());
    let mut dp = IptablesDataplane::new(Recording::default(), Config::default());
    let report = dp.sync(&w.plan, &PlanDelta::between(&Plan::default(), &w.plan)).unwrap();
    assert!(report.full);
    let input = dp.executor().last(IpFamily::V4).unwrap().to_owned();
    let web_svc = naming::svc_chain(&spn("web", "http", Protocol::Tcp));
    let web_ext = naming::ext_chain(&spn("web", "http", Protocol::Tcp));
    for line in [
        "*filter",
        "*nat",
        "*mangle",
        ":KUBE-PROXY-CANARY - [0:0]",
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
        "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully",
        &format!(
            "-A KUBE-SERVICES -m comment --comment \"default/web:http cluster IP\" -m tcp -p tcp -d 198.18.128.10 --dport 80 -j {web_svc}"
        ),
        &format!(
            "-A {web_svc} -m comment --comment \"default/web:http cluster IP\" -m tcp -p tcp -d 198.18.128.10 --dport 80 ! -s 198.18.16.0/20 -j KUBE-MARK-MASQ"
        ),
        // Each endpoint is rules in the service chain: the hairpin draw (masquerade and hairpin
        // marks) and its DNAT, then everyone else's draw, same probability.
        &format!(
            "-A {web_svc} -m comment --comment \"default/web:http -> 198.18.17.10:8080\" -s 198.18.17.10 -m statistic --mode random --probability 0.5000000000 -j MARK --or-mark 0x6000"
        ),
        &format!(
            "-A {web_svc} -m comment --comment \"default/web:http -> 198.18.17.10:8080\" -s 198.18.17.10 -m mark --mark 0x2000/0x2000 -p tcp -j DNAT --to-destination 198.18.17.10:8080"
        ),
        &format!(
            "-A {web_svc} -m comment --comment \"default/web:http -> 198.18.17.10:8080\" ! -s 198.18.17.10 -m statistic --mode random --probability 0.5000000000 -p tcp -j DNAT --to-destination 198.18.17.10:8080"
        ),
        &format!(
            "-A {web_svc} -m comment --comment \"default/web:http -> 198.18.17.11:8080\" -s 198.18.17.11 -j MARK --or-mark 0x6000"
        ),
        &format!(
            "-A {web_svc} -m comment --comment \"default/web:http -> 198.18.17.11:8080\" -p tcp -j DNAT --to-destination 198.18.17.11:8080"
        ),
        // The hairpin bit is cleared with the masquerade mark.
        "-A KUBE-POSTROUTING -j MARK --and-mark 0xffffdfff",
        &format!(
            "-A KUBE-NODEPORTS -m comment --comment \"default/web:http\" -m tcp -p tcp --dport 30080 -j {web_ext}"
        ),
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS",
        "-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
    ] {
        assert!(input.lines().any(|l| l == line), "missing {line:?} in\n{input}");
    }
    // No endpoint chains without affinity.
    assert!(!input.contains("KUBE-SEP-"), "{input}");
    // Built-in chains are never declared (that would flush them) and only get jumps, ensured
    // with -C then -I.
    for builtin in ["PREROUTING", "OUTPUT", "POSTROUTING", "INPUT", "FORWARD"] {
        assert!(!declared(&input).contains(&builtin), "{builtin} declared");
    }
    let cmds = &dp.executor().commands;
    let jumps: Vec<String> = cmds.iter().map(|(_, a)| a.join(" ")).collect();
    for jump in [
        "-t nat -C PREROUTING -m comment --comment kubernetes service portals -j KUBE-SERVICES",
        "-t nat -I PREROUTING -m comment --comment kubernetes service portals -j KUBE-SERVICES",
        "-t nat -I POSTROUTING -m comment --comment kubernetes postrouting rules -j KUBE-POSTROUTING",
        "-t filter -I FORWARD -m conntrack --ctstate NEW -m comment --comment kubernetes service portals -j KUBE-SERVICES",
        "-t filter -I INPUT -j KUBE-FIREWALL",
    ] {
        assert!(jumps.iter().any(|j| j == jump), "missing {jump:?} in {jumps:#?}");
    }
    assert_eq!(dp.executor().sysctls, vec![("net/ipv4/conf/all/route_localnet".to_owned(), "1".to_owned())]);
}

#[test]
fn one_endpoint_change_rewrites_only_that_services_chain() {
    let mut w = World::new([web(&["198.18.17.10", "198.18.17.11"]), other()].concat());
    let mut dp = IptablesDataplane::new(Recording::default(), Config::default());
    dp.sync(&w.plan, &PlanDelta::between(&Plan::default(), &w.plan)).unwrap();
    let full = dp.executor().last(IpFamily::V4).unwrap().to_owned();
    let other_svc = naming::svc_chain(&spn("other", "dns", Protocol::Udp));
    assert!(declared(&full).contains(&other_svc.as_str()));

    // 198.18.17.11 is replaced by 198.18.17.12.
    let delta = w.apply(web(&["198.18.17.10", "198.18.17.12"]));
    let report = dp.sync(&w.plan, &delta).unwrap();
    assert!(!report.full, "{report:?}");
    assert_eq!((report.restores, report.chains_written, report.chains_deleted), (1, 1, 0), "{report:?}");
    let input = dp.executor().last(IpFamily::V4).unwrap().to_owned();
    let web_svc = naming::svc_chain(&spn("web", "http", Protocol::Tcp));
    // Only the service chain: the dispatch chains, the EXT chain and the other service are as
    // they were, so they are not written.
    assert_eq!(declared(&input), vec![web_svc.as_str()], "restore input:\n{input}");
    assert!(input.starts_with("*nat\n") && input.ends_with("COMMIT\n") && input.matches("COMMIT").count() == 1);
    assert!(input.contains("-j DNAT --to-destination 198.18.17.12:8080"), "{input}");
    assert!(input.contains("-j DNAT --to-destination 198.18.17.10:8080"), "{input}");
    assert!(!input.contains("198.18.17.11"), "{input}");
    assert!(input.lines().all(|l| l == "*nat" || l == "COMMIT" || l.contains(&web_svc)), "{input}");
}

#[test]
fn a_new_service_rewrites_the_dispatch_chains_it_changes() {
    let mut w = World::new(web(&["198.18.17.10"]));
    let mut dp = IptablesDataplane::new(Recording::default(), Config::default());
    dp.sync(&w.plan, &PlanDelta::between(&Plan::default(), &w.plan)).unwrap();
    let delta = w.apply(other());
    let report = dp.sync(&w.plan, &delta).unwrap();
    assert!(!report.full, "{report:?}");
    let input = dp.executor().last(IpFamily::V4).unwrap().to_owned();
    let other_svc = naming::svc_chain(&spn("other", "dns", Protocol::Udp));
    let mut chains = declared(&input);
    chains.sort_unstable();
    // filter KUBE-SERVICES gains the REJECT for the new ClusterIP's other ports, nat
    // KUBE-SERVICES the jump to the new chain; the NodePort chains did not change.
    let mut expected = vec!["KUBE-SERVICES", "KUBE-SERVICES", other_svc.as_str()];
    expected.sort_unstable();
    assert_eq!(chains, expected, "restore input:\n{input}");
    // The dispatch chain is whole: the old service's jump is rewritten with the new one.
    assert!(input.contains("-d 198.18.128.10 --dport 80 -j KUBE-SVC-"), "{input}");
    assert!(input.contains(&format!("-d 198.18.128.11 --dport 53 -j {other_svc}")), "{input}");
    assert!(input.contains("-d 198.18.128.11 -j REJECT"), "{input}");
}

/// A recording executor that also keeps the tables its restores leave, as the kernel would.
fn kernel() -> Recording {
    Recording { kernel: Some(KernelTables::default()), ..Recording::default() }
}

#[test]
fn a_failed_restore_makes_the_next_sync_full() {
    // With affinity, endpoints keep chains of their own: replacing one makes its chain stale.
    let mut w = World::new([web_affinity(&["198.18.17.10"]), other()].concat());
    let mut dp = IptablesDataplane::new(kernel(), Config::default());
    dp.sync(&w.plan, &PlanDelta::between(&Plan::default(), &w.plan)).unwrap();
    let delta = w.apply(web_affinity(&["198.18.17.11"]));
    dp.executor_mut().fail_next = true;
    assert!(dp.sync(&w.plan, &delta).is_err());
    assert!(dp.full_sync_pending());
    let report = dp.sync(&w.plan, &PlanDelta::default()).unwrap();
    assert!(report.full && report.adopted, "{report:?}");
    let input = dp.executor().last(IpFamily::V4).unwrap();
    let stale = sep("web", "http", Protocol::Tcp, "198.18.17.10", 8080);
    assert!(input.contains(&format!("-X {stale}\n")), "the full restore must delete the stale chain:\n{input}");
    // The chains the failed restore was to write are written; the other service's, as wanted
    // in the kernel, are not, and what was not kproxy's doing is no drift.
    assert!(
        input.contains(&format!(":{} - [0:0]", sep("web", "http", Protocol::Tcp, "198.18.17.11", 8080))),
        "{input}"
    );
    assert!(!input.contains(&other_svc_line()), "{input}");
    assert_eq!(report.drift, 0, "{report:?}");
    assert!(dp.take_drift().is_empty());
}

fn all_of(w: &World) -> PlanDelta {
    PlanDelta::between(&Plan::default(), &w.plan)
}

/// A restarted kproxy (a new dataplane over the tables the last one left) and the hourly
/// resync restore nothing when nothing changed, and check the jumps in the saves, not with `-C`.
#[test]
fn full_syncs_over_unchanged_live_rules_restore_nothing() {
    let w = World::new([web(&["198.18.17.10", "198.18.17.11"]), web_affinity(&["198.18.17.12"]), other()].concat());
    let mut first = IptablesDataplane::new(kernel(), Config::default());
    let report = first.sync(&w.plan, &all_of(&w)).unwrap();
    assert!(!report.adopted && report.restores == 1 && report.jumps_inserted > 0, "{report:?}");
    let kernel_tables = first.executor().kernel.clone();
    let mut restarted =
        IptablesDataplane::new(Recording { kernel: kernel_tables, ..Recording::default() }, Config::default());
    for _ in 0..2 {
        let report = restarted.full_sync(&w.plan).unwrap();
        assert!(report.adopted && report.chains_kept > 10, "{report:?}");
        assert_eq!(
            (report.restores, report.chains_written, report.node_chains_written, report.jumps_inserted),
            (0, 0, 0, 0),
            "{report:?}"
        );
        assert!(restarted.executor().restores.is_empty() && restarted.executor().commands.is_empty());
    }
    // Its rule counts are the whole ruleset's, of which nothing was written.
    let counts = restarted.rule_counter().snapshot();
    assert_eq!(
        counts,
        first
            .rule_counter()
            .snapshot()
            .into_iter()
            .map(|(f, t, r)| (f, t, kproxy_iptables::TableRules { last: 0, ..r }))
            .collect::<Vec<_>>()
    );
}

/// Someone flushed a chain kproxy wrote and deleted a jump: the next full sync restores that
/// chain alone, inserts that jump alone, and reports both as drift.
#[test]
fn a_full_sync_repairs_and_reports_drift() {
    let w = World::new([web(&["198.18.17.10"]), other()].concat());
    let mut dp = IptablesDataplane::new(kernel(), Config::default());
    dp.sync(&w.plan, &all_of(&w)).unwrap();
    let other_svc = naming::svc_chain(&spn("other", "dns", Protocol::Udp));
    let k = dp.executor_mut().kernel.as_mut().unwrap();
    k.restore(IpFamily::V4, &format!("*nat\n:{other_svc} - [0:0]\nCOMMIT\n")).unwrap();
    let jump = k.chain(IpFamily::V4, Table::Nat, "PREROUTING").unwrap().remove(0);
    k.restore(IpFamily::V4, &format!("*nat\n{}\nCOMMIT\n", jump.replacen("-A", "-D", 1))).unwrap();
    let restores = dp.executor().restores.len();
    let report = dp.full_sync(&w.plan).unwrap();
    assert_eq!(
        (report.restores, report.chains_written, report.node_chains_written, report.jumps_inserted, report.drift),
        (1, 1, 0, 1, 2),
        "{report:?}"
    );
    let input = &dp.executor().restores[restores].1;
    assert_eq!(declared(input), vec![other_svc.as_str()], "{input}");
    let drift = dp.take_drift();
    assert!(drift[0].contains(&other_svc) && drift[1].contains("PREROUTING"), "{drift:?}");
    assert_eq!(dp.full_sync(&w.plan).unwrap().restores, 0, "repaired");
}

fn other_svc_line() -> String {
    format!(":{} - [0:0]", naming::svc_chain(&spn("other", "dns", Protocol::Udp)))
}

#[test]
fn stale_chains_found_by_iptables_save_are_deleted_on_a_full_restore() {
    let w = World::new(other());
    let mut rec = Recording::default();
    let leftover = "KUBE-SEP-AAAAAAAAAAAAAAAA";
    rec.saved.insert(
        (IpFamily::V4, kproxy_iptables::rules::Table::Nat),
        format!("*nat\n:PREROUTING ACCEPT [0:0]\n:{leftover} - [0:0]\n:DOCKER - [0:0]\nCOMMIT\n"),
    );
    let mut dp = IptablesDataplane::new(rec, Config::default());
    dp.sync(&w.plan, &PlanDelta::between(&Plan::default(), &w.plan)).unwrap();
    let input = dp.executor().last(IpFamily::V4).unwrap();
    assert!(input.contains(&format!("-X {leftover}\n")), "{input}");
    assert!(!input.contains("DOCKER"), "{input}");
}

#[test]
fn a_split_full_restore_declares_every_chain_before_anything_jumps_to_it() {
    let w = World::new([web_affinity(&["198.18.17.10", "198.18.17.11"]), other()].concat());
    let rec = Recording { section_limit: Some(2), ..Recording::default() };
    let mut dp = IptablesDataplane::new(rec, Config::default());
    dp.sync(&w.plan, &PlanDelta::between(&Plan::default(), &w.plan)).unwrap();
    let input = dp.executor().last(IpFamily::V4).unwrap().to_owned();
    let nat: Vec<&str> = input.split("COMMIT\n").filter(|s| s.starts_with("*nat\n")).collect();
    assert!(nat.len() > 3, "expected the nat table in several sections:\n{input}");
    let mut declared: Vec<&str> = Vec::new();
    for section in nat {
        let mut this_section: Vec<&str> = Vec::new();
        for line in section.lines().skip(1) {
            if let Some(chain) = line.strip_prefix(':').and_then(|l| l.split_whitespace().next()) {
                this_section.push(chain);
                declared.push(chain);
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let chain = rule.split_whitespace().next().unwrap();
                assert!(
                    this_section.contains(&chain),
                    "{chain} written in a section that did not declare it:\n{input}"
                );
                let target = rule.rsplit_once(" -j ").map(|(_, t)| t.split_whitespace().next().unwrap()).unwrap();
                if target.starts_with("KUBE-") {
                    assert!(declared.contains(&target), "{line}: {target} not declared before:\n{input}");
                }
            }
        }
    }
    // Every service chain, the endpoint chains of the affinity service included, is written.
    for chain in [
        naming::svc_chain(&spn("web", "http", Protocol::Tcp)),
        naming::ext_chain(&spn("web", "http", Protocol::Tcp)),
        sep("web", "http", Protocol::Tcp, "198.18.17.10", 8080),
        sep("web", "http", Protocol::Tcp, "198.18.17.11", 8080),
        naming::svc_chain(&spn("other", "dns", Protocol::Udp)),
    ] {
        assert!(declared.contains(&chain.as_str()), "{chain} missing:\n{input}");
    }
}

/// When `iptables-save` shows a chain otherwise than kproxy's comparison expects even right
/// after kproxy wrote it (another version of the tools), the chain is rewritten but that is no
/// drift: a reread after the restore tells the two apart.
#[test]
fn a_chain_shown_otherwise_than_kproxy_writes_it_is_rewritten_not_drift() {
    let w = World::new(other());
    let mut dp = IptablesDataplane::new(Recording { check_succeeds: true, ..Recording::default() }, Config::default());
    dp.sync(&w.plan, &all_of(&w)).unwrap();
    // A save that never changes: as if the tools printed KUBE-SERVICES in a form kproxy does
    // not know, whatever was restored.
    dp.executor_mut()
        .saved
        .insert((IpFamily::V4, Table::Nat), "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j ODD\nCOMMIT\n".into());
    let report = dp.full_sync(&w.plan).unwrap();
    assert!(report.adopted && report.restores == 1 && report.node_chains_written > 0, "{report:?}");
    assert_eq!(report.drift, 0, "{report:?}");
    assert!(dp.take_drift().is_empty());
}

/// A node address that `nodePortAddresses` selects came, then went: a partial restore of the
/// chains that name the node-port addresses (nat KUBE-SERVICES' jumps to KUBE-NODEPORTS, and
/// filter KUBE-EXTERNAL-SERVICES for a NodePort without endpoints), no service chain, and the
/// tables end as a full restore of the new plan leaves them.
#[test]
fn a_node_port_address_change_restores_only_the_chains_that_name_the_addresses() {
    use kproxy_plan::NodePortAddresses;
    let w = World::new([web(&[]), other()].concat());
    let with = |ips: &[&str]| {
        let mut plan = w.plan.clone();
        let v4 = plan.families.get_mut(&IpFamily::V4).unwrap();
        v4.node.nodeport_addresses = NodePortAddresses::Only(ips.iter().map(|ip| ip.parse().unwrap()).collect());
        plan
    };
    let (one, two) = (with(&["198.18.0.2"]), with(&["198.18.0.2", "198.18.0.4"]));
    let mut dp = IptablesDataplane::new(kernel(), Config::default());
    dp.sync(&one, &PlanDelta::between(&Plan::default(), &one)).unwrap();
    for (from, to) in [(&one, &two), (&two, &one)] {
        let report = dp.sync(to, &PlanDelta::between(from, to)).unwrap();
        assert!(!report.full, "{report:?}");
        let input = dp.executor().last(IpFamily::V4).unwrap().to_owned();
        let mut chains = declared(&input);
        chains.sort_unstable();
        assert_eq!(chains, ["KUBE-EXTERNAL-SERVICES", "KUBE-SERVICES"], "restore input:\n{input}");
        assert!(input.contains("-d 198.18.0.2 -j KUBE-NODEPORTS"), "{input}");
        assert_eq!(input.contains("198.18.0.4"), to == &two, "{input}");

        let mut fresh = IptablesDataplane::new(kernel(), Config::default());
        fresh.sync(to, &PlanDelta::between(&Plan::default(), to)).unwrap();
        let tables = |dp: &IptablesDataplane<Recording>| {
            let k = dp.executor().kernel.as_ref().unwrap();
            [Table::Nat, Table::Filter].map(|t| k.save(IpFamily::V4, t))
        };
        assert_eq!(tables(&dp), tables(&fresh), "as a full restore leaves them");
    }
}

//! iptables-specific behaviour on the real kernel, in testbed namespaces, for both backends:
//! localhost NodePorts and the route_localnet mitigation, canary self-healing after a flush,
//! `--cleanup` leaving other tools' rules alone, and full syncs over live rules (a restart,
//! the hourly resync) restoring only the chains that differ.

#![allow(clippy::unwrap_used)]

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use kproxy_iptables::rules::Table;
use kproxy_iptables::{Backend, Config, ExecError, Executor, IptablesDataplane, IptablesRestore, Output, naming};
use kproxy_packet_suite::{endpoint, node_objects, service, slice};
use kproxy_plan::{NodeContext, NodePortAddress, Plan, PlanDelta, Planner, ProxyPolicy, ServicePortName};
use kproxy_state::{Change, ClusterState, IpFamily, Object, Protocol};
use kproxy_testbed::kernel::KernelFeature;
use kproxy_testbed::topology::{CLUSTER_CIDR_V4, CLUSTER_CIDR_V6, NODE_IP_V4, NODE_IP_V6};
use kproxy_testbed::{ProbeOptions, Proto, Testbed, Where, probe_many};
use serde_json::json;

/// The real tools of a backend, with what they were given recorded.
#[derive(Debug)]
struct Tap {
    inner: IptablesRestore,
    restores: Vec<(IpFamily, String)>,
    commands: Vec<Vec<String>>,
}

impl Executor for Tap {
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), ExecError> {
        self.restores.push((family, input.to_owned()));
        self.inner.restore(family, input)
    }
    fn save(&mut self, family: IpFamily, table: Table) -> Result<String, ExecError> {
        self.inner.save(family, table)
    }
    fn save_all(&mut self, family: IpFamily) -> Result<String, ExecError> {
        self.inner.save_all(family)
    }
    fn run(&mut self, family: IpFamily, args: &[String]) -> Result<Output, ExecError> {
        self.commands.push(args.to_vec());
        self.inner.run(family, args)
    }
    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), ExecError> {
        self.inner.sysctl(key, value)
    }
    fn drop_empty_table(&mut self, family: IpFamily, table: Table) -> Result<(), ExecError> {
        self.inner.drop_empty_table(family, table)
    }
    fn section_limit(&self) -> Option<usize> {
        self.inner.section_limit()
    }
}

impl Tap {
    fn restores_since(&self, from: usize) -> String {
        self.restores[from..].iter().map(|(f, text)| format!("# {f:?}\n{text}")).collect()
    }
}

type Dp = IptablesDataplane<Tap>;

struct Bed {
    tb: Testbed,
    plan: Plan,
    /// Pod `a`'s and `b`'s IPv4 addresses.
    pods: [String; 2],
    policy: ProxyPolicy,
    config: Config,
}

const WEB: &str = "198.18.128.10:80";

/// A testbed with backend `a` on the node and `b` on node2, and a NodePort service `web`
/// (ClusterIP 198.18.128.10:80, NodePort 30080) on NodePorts of every local address.
fn bed() -> Option<Bed> {
    bed_with(|_| Vec::new(), |_| {})
}

/// [`bed`] with more objects (given pod `a`'s and `b`'s addresses) and another policy.
fn bed_with(more: impl FnOnce(&[String; 2]) -> Vec<Object>, policy: impl FnOnce(&mut ProxyPolicy)) -> Option<Bed> {
    if !kproxy_testbed::kernel::require_root() {
        return None;
    }
    let tb = Testbed::new().unwrap();
    let mut pods = Vec::new();
    for (name, on) in [("a", Where::Node), ("b", Where::Node2)] {
        let pod = tb.add_pod(name, on).unwrap();
        pod.serve(&[(Proto::Tcp, 8080)]).unwrap();
        pods.push(pod.ipv4().to_string());
    }
    let pods: [String; 2] = [pods[0].clone(), pods[1].clone()];
    let mut p = ProxyPolicy {
        detect_local: kproxy_plan::DetectLocal::ClusterCidr(vec![CLUSTER_CIDR_V4.into(), CLUSTER_CIDR_V6.into()]),
        nodeport_addresses: vec![NodePortAddress::All],
        ..ProxyPolicy::default()
    };
    policy(&mut p);
    let mut bed = Bed { tb, plan: Plan::default(), pods, policy: p, config: Config::default() };
    let mut objs = web(&bed.pods);
    objs.extend(more(&bed.pods));
    bed.plan = bed.plan_of(objs);
    Some(bed)
}

/// `web` with these endpoints (on node-a, then node-b).
fn web(endpoints: &[String]) -> Vec<Object> {
    let eps = endpoints
        .iter()
        .zip(["node-a", "node-b"])
        .map(|(ip, node)| endpoint(ip, node, json!({"ready": true})))
        .collect();
    vec![
        service(
            "default",
            "web",
            json!({"type": "NodePort", "clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]}),
            json!({}),
        ),
        slice("default", "web", "v4", "IPv4", json!([{"name": "http", "protocol": "TCP", "port": 8080}]), eps),
    ]
}

/// A ClusterIP service `name` on TCP port 80 with one endpoint on node-b.
fn plain(name: &str, cluster_ip: &str, endpoint_ip: &str) -> Vec<Object> {
    vec![
        service(
            "default",
            name,
            json!({"clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}),
            json!({}),
        ),
        slice(
            "default",
            name,
            "v4",
            "IPv4",
            json!([{"name": "http", "protocol": "TCP", "port": 8080}]),
            vec![endpoint(endpoint_ip, "node-b", json!({"ready": true}))],
        ),
    ]
}

fn spn(service: &str, port: &str, protocol: Protocol) -> ServicePortName {
    ServicePortName { namespace: "default".into(), service: service.into(), port: port.into(), protocol }
}

/// The chains a restore input declares (to write or to delete), with their table.
fn declared(input: &str) -> Vec<(String, String)> {
    let mut table = "";
    let mut out = Vec::new();
    for line in input.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t;
        } else if let Some(chain) = line.strip_prefix(':').and_then(|l| l.split_whitespace().next()) {
            out.push((table.to_owned(), chain.to_owned()));
        }
    }
    out.sort();
    out
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = list.iter().map(|(t, c)| ((*t).to_owned(), (*c).to_owned())).collect();
    out.sort();
    out
}

impl Bed {
    fn plan_of(&self, objects: Vec<Object>) -> Plan {
        let node = NodeContext {
            name: "node-a".into(),
            node_ip_override: Vec::new(),
            local_addresses: vec![NODE_IP_V4.into(), NODE_IP_V6.into()],
        };
        let mut state = ClusterState::new();
        for o in node_objects().into_iter().chain(objects) {
            state.apply(Change::Applied(o));
        }
        Planner::new(self.policy.clone(), node).build(&state)
    }

    fn dataplane(&self, backend: Backend) -> Dp {
        let tap = Tap { inner: IptablesRestore::new(backend), restores: Vec::new(), commands: Vec::new() };
        IptablesDataplane::new(tap, self.config.clone())
    }

    fn sync(&self, dp: &mut Dp, delta: &PlanDelta) -> kproxy_iptables::SyncReport {
        self.tb.node().run_in(|| dp.sync(&self.plan, delta)).unwrap().unwrap()
    }

    /// A full sync of `plan` (a start, or the hourly resync of a running dataplane).
    fn full(&self, dp: &mut Dp, plan: &Plan) -> kproxy_iptables::SyncReport {
        self.tb.node().run_in(|| dp.full_sync(plan)).unwrap().unwrap()
    }

    /// Both families' rules as `iptables-save` prints them, without comments and counters.
    fn rules(&self, backend: Backend) -> Vec<String> {
        let mut out = Vec::new();
        for tool in ["iptables", "ip6tables"] {
            let program = format!("{tool}-{}-save", backend.as_str());
            let text = self.tb.node().exec_ok(&program, &[] as &[&str]).unwrap();
            out.extend(
                text.lines().filter(|l| !l.starts_with('#')).map(|l| l.split(" [").next().unwrap_or(l).to_owned()),
            );
        }
        out
    }

    fn full_delta(&self) -> PlanDelta {
        PlanDelta::between(&Plan::default(), &self.plan)
    }

    /// Backends answering `n` TCP connections from `from` to `dest` (name → count), each waited
    /// for as an answer must be (`ProbeOptions::must_answer`: a hang guard, not a speed bound).
    fn answered(&self, from: &kproxy_testbed::Netns, dest: &str, n: usize) -> kproxy_testbed::Tally {
        self.probed(from, dest, n, &ProbeOptions::must_answer())
    }

    /// The same for connections that must be dropped: each waits only the short drop window.
    fn answered_expecting_drop(&self, from: &kproxy_testbed::Netns, dest: &str, n: usize) -> kproxy_testbed::Tally {
        self.probed(from, dest, n, &ProbeOptions::must_drop())
    }

    fn probed(
        &self,
        from: &kproxy_testbed::Netns,
        dest: &str,
        n: usize,
        options: &ProbeOptions,
    ) -> kproxy_testbed::Tally {
        let dest: SocketAddr = dest.parse().unwrap();
        probe_many(from, Proto::Tcp, dest, n, options).unwrap()
    }

    fn iptables(&self, backend: Backend, args: &[&str]) -> String {
        let program = format!("iptables-{}", backend.as_str());
        self.tb.node().exec_ok(&program, args).unwrap()
    }

    fn save(&self, backend: Backend) -> String {
        let program = format!("iptables-{}-save", backend.as_str());
        self.tb.node().exec_ok(&program, &[] as &[&str]).unwrap()
    }
}

/// Teaches `external` to send packets for 127.0.0.1 to the node, like a neighbour forging them.
fn route_loopback_to_node(tb: &Testbed) {
    let ext = tb.external();
    ext.sysctls(&[("net/ipv4/conf/all/route_localnet", "1"), ("net/ipv4/conf/eth0/route_localnet", "1")]).unwrap();
    ext.ip_batch(&[
        "route del local 127.0.0.0/8 dev lo table local".to_owned(),
        "route del local 127.0.0.1 dev lo table local".to_owned(),
        format!("route add 127.0.0.1/32 via {NODE_IP_V4} dev eth0"),
    ])
    .unwrap();
}

/// Whether a datagram `external` sends to 127.0.0.1:9999 reaches a socket the node bound there.
fn node_localhost_udp_reachable_from_external(tb: &Testbed) -> bool {
    let listener = tb
        .node()
        .run_in(|| {
            let s = UdpSocket::bind("127.0.0.1:9999").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(800))).unwrap();
            s
        })
        .unwrap();
    tb.external()
        .run_in(|| {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            for _ in 0..3 {
                s.send_to(b"hello", "127.0.0.1:9999").unwrap();
            }
        })
        .unwrap();
    let mut buf = [0u8; 16];
    listener.recv_from(&mut buf).is_ok()
}

fn localhost_nodeports(backend: Backend) {
    let Some(bed) = bed() else { return };
    let tb = &bed.tb;
    route_loopback_to_node(tb);
    // The spoofing path works: with route_localnet on and no mitigation, a neighbour reaches
    // a service the node bound to 127.0.0.1 (CVE-2020-8558).
    tb.node().sysctl("net/ipv4/conf/all/route_localnet", "1").unwrap();
    assert!(node_localhost_udp_reachable_from_external(tb), "test setup: forged packets to 127.0.0.1 don't arrive");
    tb.node().sysctl("net/ipv4/conf/all/route_localnet", "0").unwrap();

    let mut dp = bed.dataplane(backend);
    bed.sync(&mut dp, &bed.full_delta());
    assert_eq!(tb.node().read_sysctl("net/ipv4/conf/all/route_localnet").unwrap().trim(), "1");
    // From the node itself, 127.0.0.1:<nodePort> reaches the backends.
    let t = bed.answered(tb.node(), "127.0.0.1:30080", 12);
    assert_eq!(t.answered(), 12, "{t:?}");
    assert!(t.backends.contains_key("a") && t.backends.contains_key("b"), "{t:?}");
    // From a neighbour, neither the localhost NodePort nor localhost-bound services are reachable.
    // (Kernel 6.18 itself drops a DNATed packet whose original destination was 127.0.0.0/8 from
    // the wire; kproxy's RETURN for non-loopback sources covers kernels that don't. The UDP check
    // below is KUBE-FIREWALL's: it fails without that rule.)
    let t = bed.answered_expecting_drop(tb.external(), "127.0.0.1:30080", 3);
    assert_eq!(t.answered(), 0, "a neighbour reached a localhost NodePort: {t:?}");
    assert!(!node_localhost_udp_reachable_from_external(tb), "a neighbour reached 127.0.0.1 on the node");
    // The node IP keeps working from outside.
    let t = bed.answered(tb.external(), "198.18.0.2:30080", 6);
    assert_eq!(t.answered(), 6, "{t:?}");
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

fn canary_heals_a_flush(backend: Backend) {
    let Some(bed) = bed() else { return };
    let tb = &bed.tb;
    let mut dp = bed.dataplane(backend);
    assert!(bed.sync(&mut dp, &bed.full_delta()).full);
    assert!(tb.node().run_in(|| dp.check_canary()).unwrap().unwrap());
    assert_eq!(bed.answered(tb.external(), "198.18.128.10:80", 6).answered(), 6);

    bed.iptables(backend, &["-t", "nat", "-F"]);
    assert_eq!(
        bed.answered_expecting_drop(tb.external(), "198.18.128.10:80", 2).answered(),
        0,
        "the flush did not break services"
    );
    assert!(!tb.node().run_in(|| dp.check_canary()).unwrap().unwrap(), "the canary missed the flush");
    // Nothing changed in the cluster: the sync is full only because of the canary.
    let report = bed.sync(&mut dp, &PlanDelta::default());
    assert!(report.full, "{report:?}");
    assert!(tb.node().run_in(|| dp.check_canary()).unwrap().unwrap());
    let t = bed.answered(tb.external(), "198.18.128.10:80", 12);
    assert_eq!(t.answered(), 12, "{t:?}");
    // Deleting the chains outright is noticed too.
    bed.iptables(backend, &["-t", "mangle", "-F"]);
    bed.iptables(backend, &["-t", "mangle", "-X"]);
    assert!(!tb.node().run_in(|| dp.check_canary()).unwrap().unwrap());
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

/// The periodic check ([`kproxy_plan::Dataplane::verify`], what the daemon runs on its own timer)
/// notices another tool flushing kproxy's chains and heals them without any cluster change.
fn periodic_check_heals_a_flush(backend: Backend) {
    use kproxy_plan::{Dataplane, Verified};
    let Some(bed) = bed() else { return };
    let tb = &bed.tb;
    let mut dp = bed.dataplane(backend);
    let verify = |dp: &mut Dp| tb.node().run_in(|| dp.verify(&bed.plan)).unwrap().unwrap();
    bed.full(&mut dp, &bed.plan);
    assert_eq!(verify(&mut dp), Verified::Clean);
    assert_eq!(bed.answered(tb.external(), WEB, 6).answered(), 6);

    // Another tool flushes the nat table: the Service is gone until the check runs.
    bed.iptables(backend, &["-t", "nat", "-F"]);
    assert_eq!(bed.answered_expecting_drop(tb.external(), WEB, 2).answered(), 0, "the flush did not break the Service");
    let Verified::Repaired(drift) = verify(&mut dp) else { panic!("the periodic check missed the flush") };
    for chain in ["nat chain KUBE-PROXY-CANARY", "nat chain KUBE-SERVICES", "jump from PREROUTING to KUBE-SERVICES"] {
        assert!(drift.iter().any(|d| d.contains(chain)), "{chain} not reported: {drift:?}");
    }
    let t = bed.answered(tb.external(), WEB, 12);
    assert_eq!(t.answered(), 12, "{t:?}");
    assert!(t.backends.contains_key("a") && t.backends.contains_key("b"), "{t:?}");
    assert_eq!(verify(&mut dp), Verified::Clean, "the repair holds");

    // Only the canary chain flushed, in one table: noticed, and the canary is back after.
    bed.iptables(backend, &["-t", "filter", "-F", "KUBE-PROXY-CANARY"]);
    assert!(matches!(verify(&mut dp), Verified::Repaired(_)));
    assert!(bed.iptables(backend, &["-t", "filter", "-S", "KUBE-PROXY-CANARY"]).contains("-A KUBE-PROXY-CANARY"));
    assert_eq!(verify(&mut dp), Verified::Clean);
    assert_eq!(bed.answered(tb.external(), WEB, 6).answered(), 6);
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

fn cleanup_keeps_other_rules(backend: Backend) {
    let Some(bed) = bed() else { return };
    let tb = &bed.tb;
    // Another tool's chain, jump and plain rules in the tables kproxy uses.
    bed.iptables(backend, &["-t", "nat", "-N", "OTHER-TOOL"]);
    bed.iptables(backend, &["-t", "nat", "-A", "OTHER-TOOL", "-d", "192.0.2.99/32", "-j", "RETURN"]);
    bed.iptables(backend, &["-t", "nat", "-A", "PREROUTING", "-j", "OTHER-TOOL"]);
    bed.iptables(backend, &["-t", "filter", "-A", "FORWARD", "-s", "192.0.2.98/32", "-j", "ACCEPT"]);
    let before = bed.save(backend);

    let mut dp = bed.dataplane(backend);
    bed.sync(&mut dp, &bed.full_delta());
    let during = bed.save(backend);
    for chain in ["KUBE-SERVICES", "KUBE-SVC-", "KUBE-EXT-", "KUBE-POSTROUTING", "KUBE-PROXY-CANARY"] {
        assert!(during.contains(chain), "{chain} missing:\n{during}");
    }
    // A fresh process (`kproxy --cleanup`) knows nothing of what was applied.
    drop(dp);
    tb.node()
        .run_in(|| kproxy_iptables::cleanup(&mut IptablesRestore::new(backend), &IpFamily::BOTH))
        .unwrap()
        .unwrap();
    let after = bed.save(backend);
    assert!(!after.contains("KUBE-"), "kproxy left something:\n{after}");
    for rule in [
        ":OTHER-TOOL - [0:0]",
        "-A PREROUTING -j OTHER-TOOL",
        "-A OTHER-TOOL -d 192.0.2.99/32 -j RETURN",
        "-A FORWARD -s 192.0.2.98/32 -j ACCEPT",
    ] {
        assert!(after.contains(rule), "cleanup removed {rule:?}:\n{after}");
    }
    let strip = |s: &str| -> Vec<String> {
        s.lines().filter(|l| !l.starts_with('#')).map(|l| l.split(" [").next().unwrap_or(l).to_owned()).collect()
    };
    // Table sections kproxy created (mangle) may remain empty; everything that was there is.
    for line in strip(&before) {
        assert!(strip(&after).contains(&line), "missing after cleanup: {line}\n{after}");
    }
}

/// Every kind of rule kproxy writes, in both families: a LoadBalancer with source ranges and
/// `externalTrafficPolicy: Local` (firewall, external, local-endpoint chains, health check node
/// port), ClientIP affinity (endpoint chains, `recent`), three endpoints (the `statistic`
/// cascade), UDP, a Service without endpoints (filter rejects), a dual-stack Service with an
/// external IP, two pod CIDRs of one family (`KUBE-MARK-MASQ-NOT-LOCAL`), `noMasqueradeCIDRs`
/// and SNAT to the node IP (KEP-6246), and the nfacct counters where the kernel has them.
fn every_rule_kind() -> Option<Bed> {
    let mut bed = bed_with(
        |_| {
            let tcp = |port: u16| json!([{"name": "p", "protocol": "TCP", "port": port}]);
            let ep = |ip: &str, node: &str| endpoint(ip, node, json!({"ready": true}));
            vec![
                service(
                    "default",
                    "lb",
                    json!({"type": "LoadBalancer", "clusterIP": "198.18.128.20", "clusterIPs": ["198.18.128.20"],
                        "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000,
                        "loadBalancerSourceRanges": ["203.0.113.0/25"],
                        "ports": [{"name": "p", "port": 443, "targetPort": 8443, "protocol": "TCP", "nodePort": 30443}]}),
                    json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.50"}]}}),
                ),
                slice(
                    "default",
                    "lb",
                    "v4",
                    "IPv4",
                    tcp(8443),
                    vec![ep("198.18.16.40", "node-a"), ep("198.18.17.40", "node-b")],
                ),
                service(
                    "default",
                    "sticky",
                    json!({"clusterIP": "198.18.128.21", "clusterIPs": ["198.18.128.21"], "sessionAffinity": "ClientIP",
                        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
                        "ports": [{"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}]}),
                    json!({}),
                ),
                slice(
                    "default",
                    "sticky",
                    "v4",
                    "IPv4",
                    json!([{"name": "dns", "protocol": "UDP", "port": 5353}]),
                    vec![ep("198.18.17.41", "node-b"), ep("198.18.17.42", "node-b")],
                ),
                service(
                    "default",
                    "three",
                    json!({"clusterIP": "198.18.128.22", "clusterIPs": ["198.18.128.22"],
                        "ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}),
                    json!({}),
                ),
                slice(
                    "default",
                    "three",
                    "v4",
                    "IPv4",
                    tcp(8080),
                    vec![ep("198.18.17.43", "node-b"), ep("198.18.17.44", "node-b"), ep("198.18.16.45", "node-a")],
                ),
                service(
                    "default",
                    "none",
                    json!({"type": "NodePort", "clusterIP": "198.18.128.23", "clusterIPs": ["198.18.128.23"],
                        "ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30081}]}),
                    json!({}),
                ),
                service(
                    "default",
                    "dual",
                    json!({"clusterIP": "198.18.128.24", "clusterIPs": ["198.18.128.24", "fd00:96::24"],
                        "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack",
                        "externalIPs": ["192.0.2.24", "fd00:203::24"],
                        "ports": [{"name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}),
                    json!({}),
                ),
                slice(
                    "default",
                    "dual",
                    "v4",
                    "IPv4",
                    tcp(8080),
                    vec![ep("198.18.17.46", "node-b"), ep("198.18.16.46", "node-a")],
                ),
                slice(
                    "default",
                    "dual",
                    "v6",
                    "IPv6",
                    tcp(8080),
                    vec![ep("fd00:10:17::46", "node-b"), ep("fd00:10:16::46", "node-a")],
                ),
            ]
        },
        |p| {
            p.detect_local = kproxy_plan::DetectLocal::ClusterCidr(vec![
                CLUSTER_CIDR_V4.into(),
                "192.0.2.128/25".parse().unwrap(),
                CLUSTER_CIDR_V6.into(),
            ]);
            p.no_masquerade_cidrs = vec!["198.51.100.0/24".parse().unwrap(), "fd00:51::/64".parse().unwrap()];
            p.snat_to_node_ip = true;
        },
    )?;
    if KernelFeature::NfAcct.is_available() {
        let nfacct = bed.tb.node().run_in(kproxy_iptables::Nfacct::setup).unwrap().unwrap();
        bed.config.nfacct = nfacct.counters();
    }
    Some(bed)
}

/// The rules a dataplane left are taken over unchanged by the next kproxy (a restart) and by
/// the hourly resync: no restore, no jump checked with `-C`, not a rule different in the
/// kernel, and the Service answers before and after.
fn restart_over_unchanged_rules_restores_nothing(backend: Backend) {
    let Some(bed) = every_rule_kind() else { return };
    let tb = &bed.tb;
    let mut first = bed.dataplane(backend);
    let report = bed.full(&mut first, &bed.plan);
    assert!(!report.adopted && report.restores == 2, "the first start writes everything: {report:?}");
    let t = bed.answered(tb.external(), WEB, 12);
    assert_eq!(t.answered(), 12, "{t:?}");
    let before = bed.rules(backend);
    drop(first);

    let mut second = bed.dataplane(backend);
    for what in ["restart", "hourly resync"] {
        let report = bed.full(&mut second, &bed.plan);
        let restored = second.executor().restores_since(0);
        assert!(report.adopted, "{what}: {report:?}");
        assert_eq!(
            (report.restores, report.chains_written, report.node_chains_written, report.chains_deleted),
            (0, 0, 0, 0),
            "{what}: a chain looked different from what kproxy writes: {report:?}\n{restored}"
        );
        assert_eq!((report.jumps_inserted, report.drift), (0, 0), "{what}: {report:?}");
        assert!(report.chains_kept > 30, "{what}: {report:?}");
        assert!(second.executor().commands.is_empty(), "{what}: {:?}", second.executor().commands);
        assert!(second.take_drift().is_empty());
        assert_eq!(bed.rules(backend), before, "{what} changed the kernel's rules");
        let t = bed.answered(tb.external(), WEB, 12);
        assert_eq!(t.answered(), 12, "{what}: {t:?}");
        assert!(t.backends.contains_key("a") && t.backends.contains_key("b"), "{t:?}");
    }
    tb.node().run_in(|| second.cleanup()).unwrap().unwrap();
}

/// Another tool flushes a service chain, and a chain named like kproxy's that it no longer
/// wants is there: the hourly resync repairs the one and deletes the other in one restore,
/// touches nothing else, and reports the flush as drift; a restarted kproxy repairs it the
/// same way (without calling it drift: it wrote nothing yet).
fn one_sync_repairs_a_flushed_chain_and_deletes_a_stale_one(backend: Backend) {
    let Some(bed) = bed() else { return };
    let tb = &bed.tb;
    let mut dp = bed.dataplane(backend);
    bed.full(&mut dp, &bed.plan);
    assert_eq!(bed.answered(tb.external(), WEB, 6).answered(), 6);

    let svc = naming::svc_chain(&spn("web", "http", Protocol::Tcp));
    let stale = "KUBE-SEP-STALE234567ABCDEF";
    bed.iptables(backend, &["-t", "nat", "-F", &svc]);
    bed.iptables(backend, &["-t", "nat", "-N", stale]);
    bed.iptables(backend, &["-t", "nat", "-A", stale, "-j", "RETURN"]);
    assert_eq!(bed.answered_expecting_drop(tb.external(), WEB, 2).answered(), 0, "the flush did not break the service");

    let from = dp.executor().restores.len();
    let report = bed.full(&mut dp, &bed.plan);
    let input = dp.executor().restores_since(from);
    assert_eq!(
        (report.restores, report.chains_written, report.node_chains_written, report.chains_deleted, report.drift),
        (1, 1, 0, 1, 1),
        "{report:?}\n{input}"
    );
    assert_eq!(declared(&input), pairs(&[("nat", &svc), ("nat", stale)]), "{input}");
    assert!(input.contains(&format!("-X {stale}\n")), "{input}");
    let drift = dp.take_drift();
    assert!(drift.len() == 1 && drift[0].contains(&svc), "{drift:?}");
    let t = bed.answered(tb.external(), WEB, 12);
    assert_eq!(t.answered(), 12, "{t:?}");
    assert!(!bed.save(backend).contains(stale));

    bed.iptables(backend, &["-t", "nat", "-F", &svc]);
    drop(dp);
    let mut restarted = bed.dataplane(backend);
    let report = bed.full(&mut restarted, &bed.plan);
    let input = restarted.executor().restores_since(0);
    assert_eq!((report.restores, report.chains_written, report.drift), (1, 1, 0), "{report:?}\n{input}");
    assert_eq!(declared(&input), pairs(&[("nat", &svc)]), "{input}");
    assert_eq!(bed.answered(tb.external(), WEB, 6).answered(), 6);
    tb.node().run_in(|| restarted.cleanup()).unwrap().unwrap();
}

/// While kproxy was down, `web` lost an endpoint, a Service was deleted and one created: the
/// restarted kproxy writes the chains of those and the dispatch chains that list them, and
/// nothing else.
fn changes_while_down_write_only_the_changed_chains(backend: Backend) {
    let Some(bed) = bed_with(
        |_| [plain("other", "198.18.128.11", "198.18.17.50"), plain("gone", "198.18.128.12", "198.18.17.51")].concat(),
        |_| {},
    ) else {
        return;
    };
    let tb = &bed.tb;
    let mut dp = bed.dataplane(backend);
    bed.full(&mut dp, &bed.plan);
    let t = bed.answered(tb.external(), WEB, 12);
    assert!(t.backends.contains_key("a") && t.backends.contains_key("b"), "{t:?}");
    drop(dp);

    let changed = bed.plan_of(
        [
            web(&bed.pods[..1]),
            plain("other", "198.18.128.11", "198.18.17.50"),
            plain("new", "198.18.128.13", "198.18.17.52"),
        ]
        .concat(),
    );
    let mut restarted = bed.dataplane(backend);
    let report = bed.full(&mut restarted, &changed);
    let input = restarted.executor().restores_since(0);
    let chain = |name: &str| naming::svc_chain(&spn(name, "http", Protocol::Tcp));
    let (web_svc, new_svc, gone_svc) = (chain("web"), chain("new"), chain("gone"));
    assert_eq!(
        declared(&input),
        pairs(&[
            ("filter", "KUBE-SERVICES"),
            ("nat", "KUBE-SERVICES"),
            ("nat", &web_svc),
            ("nat", &new_svc),
            ("nat", &gone_svc),
        ]),
        "{input}"
    );
    assert!(input.contains(&format!("-X {gone_svc}\n")), "{input}");
    assert_eq!(
        (report.restores, report.chains_written, report.node_chains_written, report.chains_deleted, report.drift),
        (1, 2, 2, 1, 0),
        "{report:?}\n{input}"
    );
    let t = bed.answered(tb.external(), WEB, 12);
    assert_eq!(t.answered(), 12, "{t:?}");
    assert_eq!(t.backends.keys().collect::<Vec<_>>(), ["a"], "{t:?}");
    tb.node().run_in(|| restarted.cleanup()).unwrap().unwrap();
}

macro_rules! both_backends {
    ($($name:ident),+ $(,)?) => {
        mod nft {
            $( #[test] fn $name() { super::$name(kproxy_iptables::Backend::Nft); } )+
        }
        mod legacy {
            $( #[test] fn $name() { super::$name(kproxy_iptables::Backend::Legacy); } )+
        }
    };
}

both_backends!(
    localhost_nodeports,
    canary_heals_a_flush,
    periodic_check_heals_a_flush,
    cleanup_keeps_other_rules,
    restart_over_unchanged_rules_restores_nothing,
    one_sync_repairs_a_flushed_chain_and_deletes_a_stale_one,
    changes_while_down_write_only_the_changed_chains,
);

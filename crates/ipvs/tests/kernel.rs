//! IPVS-specific kernel tests (guest kernel): every scheduler in the kernel's table, `sh`
//! stickiness, persistence, the VIP port guard, graceful termination, restart adoption, and the
//! periodic check repairing what other tools deleted.
//! On the host they skip (no IPVS, no dummy devices) with a message, per `kproxy_testbed::kernel`.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use kproxy_ipvs::{Config, IpvsDataplane, KernelHost, Scheduler};
use kproxy_packet_suite::{NODE_A, NODE_B, node_objects, service, slice};
use kproxy_plan::{DetectLocal, NodeContext, Plan, PlanDelta, Planner, ProxyPolicy, Verified};
use kproxy_state::{Change, ClusterState, Object};
use kproxy_testbed::kernel::{self, KernelFeature};
use kproxy_testbed::topology::{CLUSTER_CIDR_V4, CLUSTER_CIDR_V6, NODE_IP_V4, NODE_IP_V6};
use kproxy_testbed::{
    EchoServer, Netns, Pod, ProbeOptions, ProbeResult, Proto, Testbed, Where, probe, probe_many, probe_with,
};
use serde_json::json;

const CIP: &str = "198.18.128.10:80";

fn ready() -> bool {
    kernel::require_root() && kernel::require(&[KernelFeature::Ipvs, KernelFeature::Dummy])
}

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// The cluster: service `web` (ClusterIP 198.18.128.10:80 → `target`) with `eps` (pod, node).
fn web(eps: &[(&Pod, &str)], target: u16, extra: serde_json::Value) -> Vec<Object> {
    let mut spec = json!({"clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
        "ports": [{"name": "http", "port": 80, "targetPort": target, "protocol": "TCP"}]});
    if let (Some(s), serde_json::Value::Object(e)) = (spec.as_object_mut(), extra) {
        s.extend(e);
    }
    let endpoints = eps
        .iter()
        .map(|(p, node)| json!({"addresses": [p.ipv4().to_string()], "nodeName": node, "conditions": {"ready": true}}))
        .collect();
    let ports = json!([{"name": "http", "protocol": "TCP", "port": target}]);
    let mut out = node_objects();
    out.push(service("default", "web", spec, json!({})));
    out.push(slice("default", "web", "v4", "IPv4", ports, endpoints));
    out
}

struct Cluster {
    planner: Planner,
    state: ClusterState,
    plan: Plan,
}

impl Cluster {
    fn new(objects: Vec<Object>) -> Self {
        let policy = ProxyPolicy {
            detect_local: DetectLocal::ClusterCidr(vec![CLUSTER_CIDR_V4.into(), CLUSTER_CIDR_V6.into()]),
            ..ProxyPolicy::default()
        };
        let node = NodeContext {
            name: NODE_A.into(),
            node_ip_override: Vec::new(),
            local_addresses: vec![NODE_IP_V4.into(), NODE_IP_V6.into()],
        };
        let planner = Planner::new(policy, node);
        let mut state = ClusterState::new();
        for o in objects {
            state.apply(Change::Applied(o));
        }
        let _ = state.take_dirty();
        let plan = planner.build(&state);
        Self { planner, state, plan }
    }

    fn full(&self) -> PlanDelta {
        PlanDelta::between(&Plan::default(), &self.plan)
    }

    fn update(&mut self, objects: Vec<Object>) -> PlanDelta {
        for o in objects {
            self.state.apply(Change::Applied(o));
        }
        let dirty = self.state.take_dirty();
        self.planner.update(&mut self.plan, &self.state, &dirty)
    }
}

fn dataplane(tb: &Testbed, config: Config) -> IpvsDataplane<KernelHost> {
    tb.node().run_in(|| IpvsDataplane::new(KernelHost::new(), config)).unwrap()
}

fn sync(tb: &Testbed, dp: &mut IpvsDataplane<KernelHost>, plan: &Plan, delta: &PlanDelta) -> kproxy_ipvs::SyncReport {
    tb.node().run_in(|| dp.sync(plan, delta)).unwrap().unwrap()
}

fn ipvsadm(ns: &Netns) -> String {
    ns.exec_ok("ipvsadm", &["-Ln"]).unwrap()
}

/// A TCP server that answers every line with its name, on long-lived connections.
fn line_server(ns: &Netns, name: &'static str, port: u16) {
    let listener = ns.run_in(move || TcpListener::bind(("::", port))).unwrap().unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut writer = conn;
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if writer.write_all(format!("{name}\n").as_bytes()).is_err() {
                        return;
                    }
                    line.clear();
                }
            });
        }
    });
}

/// A long-lived client connection opened from `ns`.
struct Conn(BufReader<TcpStream>);

impl Conn {
    fn open(ns: &Netns, to: SocketAddr) -> Self {
        let s = ns.run_in(move || TcpStream::connect_timeout(&to, Duration::from_secs(2))).unwrap().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        Conn(BufReader::new(s))
    }

    fn ask(&mut self) -> std::io::Result<String> {
        self.0.get_mut().write_all(b"who\n")?;
        let mut line = String::new();
        self.0.read_line(&mut line)?;
        Ok(line.trim().to_owned())
    }
}

fn pods(tb: &Testbed, specs: &[(&str, Where)]) -> Vec<Arc<Pod>> {
    specs
        .iter()
        .map(|(n, w)| {
            let p = tb.add_pod(n, *w).unwrap();
            p.serve(&[(Proto::Tcp, 8080)]).unwrap();
            p
        })
        .collect()
}

#[test]
fn every_scheduler_is_accepted_and_visible_in_the_kernel_table() {
    if !ready() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let ps = pods(&tb, &[("a", Where::Node), ("client", Where::Node)]);
    let cluster = Cluster::new(web(&[(&ps[0], NODE_A)], 8080, json!({})));
    for scheduler in Scheduler::ALL {
        let mut dp = dataplane(&tb, Config { scheduler, ..Config::default() });
        sync(&tb, &mut dp, &cluster.plan, &cluster.full());
        let table = ipvsadm(tb.node());
        let line = table.lines().find(|l| l.contains(CIP)).unwrap_or_else(|| panic!("no {CIP} in\n{table}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.get(2), Some(&scheduler.name()), "{line}");
        if scheduler == Scheduler::Mh {
            assert!(line.contains("mh-port"), "{line}");
        }
        let got = probe(ps[1].netns(), Proto::Tcp, sa(CIP), Duration::from_secs(1)).unwrap();
        assert!(matches!(&got, ProbeResult::Answered { backend, .. } if backend == "a"), "{scheduler}: {got:?}");
        tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
        assert!(!ipvsadm(tb.node()).contains(CIP), "cleanup leaves no service");
    }
}

#[test]
fn sh_scheduler_sticks_by_source() {
    if !ready() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let ps = pods(&tb, &[("a", Where::Node), ("b", Where::Node2), ("c", Where::Node2), ("client", Where::Node)]);
    let eps: [(&Pod, &str); 3] = [(&ps[0], NODE_A), (&ps[1], NODE_B), (&ps[2], NODE_B)];
    let cluster = Cluster::new(web(&eps, 8080, json!({})));
    let mut dp = dataplane(&tb, Config { scheduler: Scheduler::Sh, ..Config::default() });
    sync(&tb, &mut dp, &cluster.plan, &cluster.full());
    let options = ProbeOptions::must_answer();
    for from in [ps[3].netns(), tb.external(), tb.node()] {
        let tally = probe_many(from, Proto::Tcp, sa(CIP), 15, &options).unwrap();
        assert_eq!(tally.backends.values().sum::<usize>(), 15, "{tally:?}");
        assert_eq!(tally.backends.len(), 1, "sh must send one source to one backend: {tally:?}");
    }
    // rr, for contrast, spreads the same client.
    let mut rr = dataplane(&tb, Config::default());
    sync(&tb, &mut rr, &cluster.plan, &cluster.full());
    let tally = probe_many(ps[3].netns(), Proto::Tcp, sa(CIP), 15, &options).unwrap();
    assert_eq!(tally.backends.len(), 3, "{tally:?}");
    tb.node().run_in(|| rr.cleanup()).unwrap().unwrap();
}

/// IPVS keeps a persistence template while connections it controls are in its table, and a
/// closed TCP connection stays there in TIME_WAIT for two minutes (not settable through the
/// IPVS API); UDP entries live `ipvs.udpTimeout`. So the expiry is shown with UDP and a short
/// `udpTimeout`, and the TCP template is shown to be the Service's timeout.
#[test]
fn affinity_is_persistence_with_the_service_timeout_and_expires() {
    if !ready() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    let b = tb.add_pod("b", Where::Node2).unwrap();
    let client = tb.add_pod("client", Where::Node).unwrap();
    for p in [&a, &b] {
        p.serve(&[(Proto::Tcp, 8080), (Proto::Udp, 8080)]).unwrap();
    }
    let affinity = json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 2}},
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                  {"name": "dns", "port": 53, "targetPort": 8080, "protocol": "UDP"}]});
    let mut objects = web(&[], 8080, affinity);
    let ports =
        json!([{"name": "http", "protocol": "TCP", "port": 8080}, {"name": "dns", "protocol": "UDP", "port": 8080}]);
    let eps = [(&a, NODE_A), (&b, NODE_B)]
        .iter()
        .map(|(p, node)| json!({"addresses": [p.ipv4().to_string()], "nodeName": node, "conditions": {"ready": true}}))
        .collect();
    objects.push(slice("default", "web", "both", "IPv4", ports, eps));
    let cluster = Cluster::new(objects);
    let config = Config { udp_timeout: Duration::from_secs(1), ..Config::default() };
    let mut dp = dataplane(&tb, config);
    sync(&tb, &mut dp, &cluster.plan, &cluster.full());
    let table = ipvsadm(tb.node());
    assert!(table.lines().any(|l| l.contains(CIP) && l.contains("persistent 2")), "{table}");
    assert!(table.lines().any(|l| l.contains("198.18.128.10:53") && l.contains("persistent 2")), "{table}");
    let timeouts = tb.node().exec_ok("ipvsadm", &["-L", "--timeout"]).unwrap();
    assert!(timeouts.trim_end().ends_with(" 1"), "ipvs.udpTimeout applied: {timeouts}");
    let options = ProbeOptions::must_answer();
    let udp = sa("198.18.128.10:53");
    let mut chosen = std::collections::BTreeSet::new();
    for _ in 0..10 {
        let tally = probe_many(client.netns(), Proto::Udp, udp, 4, &options).unwrap();
        assert_eq!(tally.backends.values().sum::<usize>(), 4, "{tally:?}");
        assert_eq!(tally.backends.len(), 1, "persistence sticks: {tally:?}");
        chosen.extend(tally.backends.into_keys());
        if chosen.len() == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(3500));
    }
    assert_eq!(chosen.len(), 2, "persistence never expired: {chosen:?}");
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

#[test]
fn a_host_service_on_another_port_is_not_reachable_through_a_cluster_ip() {
    if !ready() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let ps = pods(&tb, &[("a", Where::Node), ("client", Where::Node)]);
    let _host = EchoServer::start(tb.node(), "host", &[(Proto::Tcp, 9999), (Proto::Udp, 9999)]).unwrap();
    let cluster = Cluster::new(web(&[(&ps[0], NODE_A)], 8080, json!({})));
    let mut dp = dataplane(&tb, Config::default());
    sync(&tb, &mut dp, &cluster.plan, &cluster.full());
    let t = Duration::from_secs(1);
    // The host service answers on the node's address...
    let direct = probe(ps[1].netns(), Proto::Tcp, sa("198.18.0.2:9999"), t).unwrap();
    assert!(matches!(&direct, ProbeResult::Answered { backend, .. } if backend == "host"), "{direct:?}");
    // ...and not on the ClusterIP, from a pod, from outside, or from the node itself.
    for from in [ps[1].netns(), tb.external(), tb.node()] {
        for proto in [Proto::Tcp, Proto::Udp] {
            let got = probe(from, proto, sa("198.18.128.10:9999"), t).unwrap();
            assert_eq!(got, ProbeResult::Refused, "{proto} from {}: {got:?}", from.role());
        }
    }
    // The service port still works.
    let got = probe(ps[1].netns(), Proto::Tcp, sa(CIP), t).unwrap();
    assert!(matches!(&got, ProbeResult::Answered { backend, .. } if backend == "a"), "{got:?}");
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

#[test]
fn graceful_termination_keeps_established_connections_while_new_ones_go_elsewhere() {
    if !ready() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    let b = tb.add_pod("b", Where::Node2).unwrap();
    let client = tb.add_pod("client", Where::Node).unwrap();
    line_server(a.netns(), "a", 9000);
    line_server(b.netns(), "b", 9000);
    let mut cluster = Cluster::new(web(&[(&a, NODE_A)], 9000, json!({})));
    let config = Config { graceful_period: Duration::from_secs(3), ..Config::default() };
    let mut dp = dataplane(&tb, config);
    sync(&tb, &mut dp, &cluster.plan, &cluster.full());
    let mut old = Conn::open(client.netns(), sa(CIP));
    assert_eq!(old.ask().unwrap(), "a");

    // a leaves the endpoints, b arrives.
    let delta = cluster.update(web(&[(&b, NODE_B)], 9000, json!({})));
    let report = sync(&tb, &mut dp, &cluster.plan, &delta);
    assert!(!report.full, "an endpoint change is a partial sync");
    assert_eq!(report.ipvs_ops, 2, "weight 0 for a, add b: {report:?}");
    let table = ipvsadm(tb.node());
    let a_line = table.lines().find(|l| l.contains(&format!("{}:9000", a.ipv4()))).unwrap_or_else(|| panic!("{table}"));
    assert_eq!(a_line.split_whitespace().nth(3), Some("0"), "a drains at weight 0: {a_line}");
    assert_eq!(old.ask().unwrap(), "a", "the established connection keeps working");
    for _ in 0..5 {
        assert_eq!(Conn::open(client.netns(), sa(CIP)).ask().unwrap(), "b", "new connections go to b");
    }
    assert_eq!(old.ask().unwrap(), "a");
    drop(old);
    std::thread::sleep(Duration::from_secs(4));
    let drained = tb.node().run_in(|| dp.reap_drained()).unwrap().unwrap();
    assert_eq!(drained, 1);
    let table = ipvsadm(tb.node());
    assert!(!table.contains(&format!("{}:9000", a.ipv4())), "a is gone once drained:\n{table}");
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

#[test]
fn a_restarted_kproxy_adopts_the_kernel_state_without_dropping_connections() {
    if !ready() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    let b = tb.add_pod("b", Where::Node2).unwrap();
    let client = tb.add_pod("client", Where::Node).unwrap();
    line_server(a.netns(), "a", 9000);
    line_server(b.netns(), "b", 9000);
    let objects = web(
        &[(&a, NODE_A), (&b, NODE_B)],
        9000,
        json!({"type": "NodePort",
        "ports": [{"name": "http", "port": 80, "targetPort": 9000, "protocol": "TCP", "nodePort": 30090}]}),
    );
    let cluster = Cluster::new(objects);
    let mut first = dataplane(&tb, Config::default());
    sync(&tb, &mut first, &cluster.plan, &cluster.full());
    let mut conns: Vec<(Conn, String)> = (0..4)
        .map(|_| {
            let mut c = Conn::open(client.netns(), sa(CIP));
            let who = c.ask().unwrap();
            (c, who)
        })
        .collect();
    let mut external = Conn::open(tb.external(), sa("198.18.0.2:30090"));
    let external_who = external.ask().unwrap();
    let before = ipvsadm(tb.node());
    drop(first); // the process dies: nothing is cleaned up

    let mut second = dataplane(&tb, Config::default());
    let report = sync(&tb, &mut second, &cluster.plan, &cluster.full());
    assert!(report.full);
    assert_eq!((report.ipvs_ops, report.address_ops), (0, 0), "adoption changes nothing: {report:?}");
    assert_eq!(ipvsadm(tb.node()), before);
    for (c, who) in &mut conns {
        assert_eq!(&c.ask().unwrap(), who, "established connections survive the restart");
    }
    assert_eq!(external.ask().unwrap(), external_who);
    let mut fresh = Conn::open(client.netns(), sa(CIP));
    assert!(["a", "b"].contains(&fresh.ask().unwrap().as_str()));
    tb.node().run_in(|| second.cleanup()).unwrap().unwrap();
}

#[test]
fn cleanup_removes_services_interface_and_table_only() {
    if !ready() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let ps = pods(&tb, &[("a", Where::Node)]);
    // Someone else's virtual service, inside excludeCIDRs.
    tb.node().exec_ok("ipvsadm", &["-A", "-t", "192.0.2.1:80", "-s", "rr"]).unwrap();
    let cluster = Cluster::new(web(&[(&ps[0], NODE_A)], 8080, json!({})));
    let config = Config { exclude_cidrs: vec!["192.0.2.0/24".parse().unwrap()], ..Config::default() };
    let mut dp = dataplane(&tb, config.clone());
    sync(&tb, &mut dp, &cluster.plan, &cluster.full());
    assert!(tb.node().ip(["link", "show", "kube-ipvs0"]).is_ok());
    // A fresh process's --cleanup.
    tb.node().run_in(|| kproxy_ipvs::cleanup(&mut KernelHost::new(), &config)).unwrap().unwrap();
    let table = ipvsadm(tb.node());
    assert!(table.contains("192.0.2.1:80"), "excluded service kept:\n{table}");
    assert!(!table.contains(CIP), "{table}");
    assert!(tb.node().ip(["link", "show", "kube-ipvs0"]).is_err(), "dummy interface removed");
    let rules = tb.node().exec_ok("nft", &["list", "ruleset"]).unwrap();
    assert!(!rules.contains("kproxy-ipvs"), "{rules}");
}

/// A client that opens a new connection from the port of one that just closed (what random
/// ephemeral ports do now and then). TCP is answered at once: conntrack replaces a TIME_WAIT or
/// CLOSE entry on a new SYN, so IPVS (`conn_reuse_mode` 1, the kernel default kept on >= 5.9 as
/// upstream does) reschedules without dropping. SCTP is not, on this kernel: conntrack keeps the
/// confirmed entry of the closed association for the new INIT, and `ip_vs_in_hook` drops a new
/// connection's first packet that reuses an IPVS connection in CLOSED state (10 s, not settable
/// through the IPVS API) while it "uses old conntrack". The INIT is retransmitted after SCTP's
/// initial RTO (3 s) and then answered. This is why `clusterip_sctp` can, rarely, see one of its
/// 700 ms probes time out: two of its probes drew the same random source port.
#[test]
fn a_client_reusing_the_port_of_a_closed_connection() {
    if !ready() || !kernel::require(&[KernelFeature::Sctp]) {
        return;
    }
    let tb = Testbed::new().unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    let client = tb.add_pod("client", Where::Node).unwrap();
    a.serve(&[(Proto::Tcp, 8080), (Proto::Sctp, 8080)]).unwrap();
    let spec = json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                               {"name": "sctp", "port": 80, "targetPort": 8080, "protocol": "SCTP"}]});
    let mut objects = web(&[], 8080, spec);
    let ports =
        json!([{"name": "http", "protocol": "TCP", "port": 8080}, {"name": "sctp", "protocol": "SCTP", "port": 8080}]);
    let eps = vec![json!({"addresses": [a.ipv4().to_string()], "nodeName": NODE_A, "conditions": {"ready": true}})];
    objects.push(slice("default", "web", "both", "IPv4", ports, eps));
    let cluster = Cluster::new(objects);
    let mut dp = dataplane(&tb, Config::default());
    sync(&tb, &mut dp, &cluster.plan, &cluster.full());
    let from = |port| Some(SocketAddr::new(client.ipv4().into(), port));
    let quick = |port| ProbeOptions { timeout: Duration::from_millis(700), bind: from(port) };

    for round in 0..3 {
        let result = probe_with(client.netns(), Proto::Tcp, sa(CIP), &quick(40000)).unwrap();
        assert_eq!(result.backend(), Some("a"), "TCP from port 40000, connection {round}: {result:?}");
    }

    let first = probe_with(client.netns(), Proto::Sctp, sa(CIP), &quick(40001)).unwrap();
    assert_eq!(first.backend(), Some("a"), "SCTP, first association: {first:?}");
    let started = std::time::Instant::now();
    let patient = ProbeOptions { timeout: Duration::from_secs(6), bind: from(40001) };
    let second = probe_with(client.netns(), Proto::Sctp, sa(CIP), &patient).unwrap();
    let took = started.elapsed();
    assert_eq!(second.backend(), Some("a"), "SCTP, same port again: {second:?}");
    assert!(
        took >= Duration::from_secs(2),
        "the reused port's first INIT was answered at once ({took:?}): the kernel no longer drops it, so \
         this test's explanation of clusterip_sctp timeouts is out of date"
    );
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

fn verify(tb: &Testbed, dp: &mut IpvsDataplane<KernelHost>, plan: &Plan) -> Verified {
    tb.node().run_in(|| dp.verify(plan)).unwrap().unwrap()
}

fn repaired(v: Verified) -> Vec<String> {
    match v {
        Verified::Repaired(lines) => lines,
        other => panic!("expected a repair, got {other:?}"),
    }
}

/// The backends that answer 10 connections from `from` to `to`.
fn answering(from: &Netns, to: &str) -> Vec<String> {
    let tally = probe_many(from, Proto::Tcp, sa(to), 10, &ProbeOptions::must_answer()).unwrap();
    tally.backends.into_keys().collect()
}

/// `web` with endpoints a (node) and b (node2) and a NodePort under `externalTrafficPolicy:
/// Local` (an address service on the node's address with a, and a firewall-mark service with
/// a and b for the short-circuit of local pods and the node, so the check's reading of both
/// kinds is on trial), synced and checked clean.
fn web_synced(tb: &Testbed) -> (Vec<Arc<Pod>>, Cluster, IpvsDataplane<KernelHost>) {
    let ps = pods(tb, &[("a", Where::Node), ("b", Where::Node2), ("client", Where::Node)]);
    let node_port = json!({"type": "NodePort", "externalTrafficPolicy": "Local",
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]});
    let cluster = Cluster::new(web(&[(&ps[0], NODE_A), (&ps[1], NODE_B)], 8080, node_port));
    let mut dp = dataplane(tb, Config::default());
    sync(tb, &mut dp, &cluster.plan, &cluster.full());
    let table = ipvsadm(tb.node());
    assert_eq!(verify(tb, &mut dp, &cluster.plan), Verified::Clean, "a fresh sync is clean");
    assert_eq!(ipvsadm(tb.node()), table, "a clean check writes nothing");
    assert_eq!(answering(ps[2].netns(), CIP), ["a", "b"]);
    (ps, cluster, dp)
}

#[test]
fn the_periodic_check_restores_a_virtual_service_real_server_and_vip_deleted_from_outside() {
    if !ready() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let (ps, cluster, mut dp) = web_synced(&tb);
    let (client, a) = (ps[2].netns(), ps[0].ipv4());
    let t = Duration::from_secs(1);

    tb.node().exec_ok("ipvsadm", &["-D", "-t", CIP]).unwrap();
    let got = probe(client, Proto::Tcp, sa(CIP), t).unwrap();
    assert_eq!(got, ProbeResult::Refused, "no virtual service: the node itself refuses");
    let lines = repaired(verify(&tb, &mut dp, &cluster.plan));
    assert_eq!(lines, [format!("IPVS virtual service tcp {CIP} is missing")]);
    assert_eq!(answering(client, CIP), ["a", "b"]);

    tb.node().exec_ok("ipvsadm", &["-d", "-t", CIP, "-r", &format!("{a}:8080")]).unwrap();
    assert_eq!(answering(client, CIP), ["b"], "a is out of the virtual service");
    let lines = repaired(verify(&tb, &mut dp, &cluster.plan));
    assert_eq!(lines, [format!("real server {a}:8080 of IPVS virtual service tcp {CIP} is missing")]);
    assert_eq!(answering(client, CIP), ["a", "b"]);

    tb.node().ip(["addr", "del", "198.18.128.10/32", "dev", "kube-ipvs0"]).unwrap();
    let got = probe(client, Proto::Tcp, sa(CIP), t).unwrap();
    assert_eq!(got.backend(), None, "the VIP is not local: IPVS never sees it ({got:?})");
    let lines = repaired(verify(&tb, &mut dp, &cluster.plan));
    assert_eq!(lines, ["address 198.18.128.10 is missing from kube-ipvs0"]);
    assert_eq!(answering(client, CIP), ["a", "b"]);

    assert_eq!(verify(&tb, &mut dp, &cluster.plan), Verified::Clean);
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

/// The auxiliary table's guard (a VIP answers only on its service ports) shows whether the
/// table works: a host service on port 9999 is refused on the ClusterIP while it does, and
/// answers there when the guard is gone.
#[test]
fn the_periodic_check_restores_an_aux_chain_set_and_table_deleted_from_outside() {
    if !ready() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let _host = EchoServer::start(tb.node(), "host", &[(Proto::Tcp, 9999)]).unwrap();
    let (ps, cluster, mut dp) = web_synced(&tb);
    let client = ps[2].netns();
    let t = Duration::from_secs(1);
    let host_port = "198.18.128.10:9999";
    let host_on_vip = || probe(client, Proto::Tcp, sa(host_port), t).unwrap();
    let direct = probe(client, Proto::Tcp, sa("198.18.0.2:9999"), t).unwrap();
    assert_eq!(direct.backend(), Some("host"), "the host service answers on the node's address: {direct:?}");
    assert_eq!(host_on_vip(), ProbeResult::Refused, "and not on the ClusterIP");

    tb.node().nft("flush chain ip kproxy-ipvs service-checks").unwrap();
    assert_eq!(host_on_vip().backend(), Some("host"), "the guard is gone");
    let lines = repaired(verify(&tb, &mut dp, &cluster.plan));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].starts_with("ip kproxy-ipvs: chain service-checks has 0 rules, expected"), "{lines:?}");
    assert_eq!(host_on_vip(), ProbeResult::Refused, "the guard is back");
    assert_eq!(verify(&tb, &mut dp, &cluster.plan), Verified::Clean, "listed again: nothing else differs");

    tb.node().nft("flush set ip kproxy-ipvs vip-ports").unwrap();
    let got = probe(client, Proto::Tcp, sa(CIP), t).unwrap();
    assert_eq!(got, ProbeResult::Refused, "port 80 is no service port of the VIP any more");
    let lines = repaired(verify(&tb, &mut dp, &cluster.plan));
    assert_eq!(lines, ["ip kproxy-ipvs: set vip-ports has 0 elements, expected 1"]);
    assert_eq!(answering(client, CIP), ["a", "b"]);

    tb.node().nft("delete table ip kproxy-ipvs").unwrap();
    assert_eq!(host_on_vip().backend(), Some("host"), "no table, no guard");
    let lines = repaired(verify(&tb, &mut dp, &cluster.plan));
    assert_eq!(lines, ["ip kproxy-ipvs: the table is gone"]);
    assert_eq!(host_on_vip(), ProbeResult::Refused);
    assert_eq!(answering(client, CIP), ["a", "b"]);

    assert_eq!(verify(&tb, &mut dp, &cluster.plan), Verified::Clean);
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

/// Another program's nat rules OR a bit into the packet mark between kproxy's classification
/// and IPVS (kube-proxy's KUBE-MARK-MASQ, while both run on a node during a migration): IPVS
/// matches the whole mark, so kproxy sets it again just before IPVS (`remark-*`). Without
/// that, a Local-policy NodePort's short-circuit (local pods and the node to every endpoint)
/// is lost: its connections meet the NodePort's address service, with the local endpoint
/// alone (shown by emptying the chains); and the periodic check puts the chains back.
#[test]
fn a_nodeport_short_circuit_holds_when_other_nat_rules_or_a_bit_into_the_packet_mark() {
    if !ready() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let (ps, cluster, mut dp) = web_synced(&tb);
    let client = ps[2].netns();
    let node_port = format!("{}:30080", kproxy_testbed::topology::NODE_IP_V4);
    // kube-proxy's masquerade bit, or the next one if the service's mark has it already.
    let table = ipvsadm(tb.node());
    let mark: u32 = table
        .lines()
        .find_map(|l| l.strip_prefix("FWM").and_then(|rest| rest.split_whitespace().next()?.parse().ok()))
        .unwrap_or_else(|| panic!("no firewall-mark service:\n{table}"));
    let bit = [0x4000u32, 0x8000, 0x2000].into_iter().find(|b| mark & b == 0).unwrap();
    tb.node()
        .nft(&format!(
            "table ip masq-bit {{
               chain pre {{ type nat hook prerouting priority -100; meta mark set meta mark | {bit:#x}; }}
               chain out {{ type nat hook output priority -100; meta mark set meta mark | {bit:#x}; }}
             }}"
        ))
        .unwrap();
    assert_eq!(answering(client, &node_port), ["a", "b"], "from a pod (prerouting)");
    assert_eq!(answering(tb.node(), &node_port), ["a", "b"], "from the node (output)");

    for chain in ["remark-input", "remark-output"] {
        tb.node().exec_ok("nft", &["flush", "chain", "ip", "kproxy-ipvs", chain]).unwrap();
    }
    assert_eq!(answering(client, &node_port), ["a"], "the ORed mark matches no firewall-mark service");
    assert_eq!(answering(tb.node(), &node_port), ["a"], "nor from the node");
    assert!(matches!(verify(&tb, &mut dp, &cluster.plan), Verified::Repaired(_)));
    assert_eq!(answering(client, &node_port), ["a", "b"]);
    assert_eq!(answering(tb.node(), &node_port), ["a", "b"]);
    tb.node().exec_ok("nft", &["delete", "table", "ip", "masq-bit"]).unwrap();
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

/// A virtual service kproxy does not want on a node address (kube-proxy's NodePort address
/// service, when kproxy's IPVS mode takes a node over) keeps the connections IPVS scheduled
/// through it: kproxy's syncs leave it while it carries one, and delete it once it carries none
/// or the graceful period passed.
#[test]
fn another_proxys_service_on_a_node_address_keeps_its_connections_until_they_end() {
    if !ready() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    let client = tb.add_pod("client", Where::Node).unwrap();
    line_server(a.netns(), "a", 9000);
    let theirs = format!("{}:31000", kproxy_testbed::topology::NODE_IP_V4);
    let real = format!("{}:9000", a.ipv4());
    tb.node().exec_ok("ipvsadm", &["-A", "-t", &theirs, "-s", "rr"]).unwrap();
    tb.node().exec_ok("ipvsadm", &["-a", "-t", &theirs, "-r", &real, "-m"]).unwrap();
    let mut conn = Conn::open(client.netns(), sa(&theirs));
    assert_eq!(conn.ask().unwrap(), "a");

    let cluster = Cluster::new(web(&[(&a, NODE_A)], 9000, json!({})));
    let config = Config { graceful_period: Duration::from_secs(3), ..Config::default() };
    let mut dp = dataplane(&tb, config);
    sync(&tb, &mut dp, &cluster.plan, &cluster.full());
    assert!(ipvsadm(tb.node()).contains(&theirs), "kept while it carries a connection");
    assert_eq!(conn.ask().unwrap(), "a", "the connection survives kproxy's sync");
    assert_eq!(verify(&tb, &mut dp, &cluster.plan), Verified::Clean, "a kept service is not drift");
    assert_eq!(conn.ask().unwrap(), "a");

    std::thread::sleep(Duration::from_secs(4));
    let deleted = tb.node().run_in(|| dp.reap_drained()).unwrap().unwrap();
    assert_eq!(deleted, 1, "the graceful period is over");
    assert!(!ipvsadm(tb.node()).contains(&theirs), "{}", ipvsadm(tb.node()));
    tb.node().run_in(|| dp.cleanup()).unwrap().unwrap();
}

//! Taking a node over from the real kube-proxy v1.36.2 and handing it back, with the real
//! kube-apiserver (crates/k8s-harness) and the real `kproxy` binary in a sandbox's node
//! namespace, while a client outside sends a new TCP request to the ClusterIP every 20 ms and
//! keeps one connection open through it the whole time:
//!
//! 1. kube-proxy serves the node; kproxy starts beside it: the ports are kube-proxy's, so kproxy
//!    programs its rules but leaves kube-proxy's alone (and says why);
//! 2. kube-proxy stops: kproxy takes its ports and removes everything kube-proxy left;
//! 3. an endpoint change is served by kproxy;
//! 4. kube-proxy starts again beside kproxy and programs the node; kproxy gets SIGTERM: it lets
//!    go of the ports, waits for kube-proxy's `/healthz`, removes its own rules and exits;
//! 5. an endpoint change is served by kube-proxy.
//!
//! Not one request fails, the open connection answers after every step, and at the end nothing
//! of kproxy's is left (and, after step 2, nothing of kube-proxy's was).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kproxy_k8s_harness::{Binary, ControlPlane, ControlPlaneOptions, Identity, Launch, Process, require_k8s};
use kproxy_testbed::{Netns, ProbeResult, Proto, Testbed, Where, probe};
use serde_json::json;
use support::{answered_by, http_get};

const CLUSTER_IP: &str = "198.18.128.10";
const HEALTHZ: &str = "127.0.0.1:10256";
const METRICS: &str = "127.0.0.1:10249";

/// How long a step may take to show in the kernel (a debug kproxy, kube-proxy and the API
/// server share two cores with the rest of the suite; the guest is slower still).
const STEP: Duration = Duration::from_secs(60);

fn apply(plane: &ControlPlane, object: serde_json::Value) {
    plane.kubectl_with_stdin(&["apply", "-f", "-"], Some(&object.to_string())).unwrap();
}

/// The Node, Service `demo/web` and its slice pointing at `ip` on node-a.
fn cluster(plane: &ControlPlane, ip: &str) {
    apply(
        plane,
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "node-a"}, "spec": {"podCIDRs": ["198.18.16.0/24"], "podCIDR": "198.18.16.0/24"}}),
    );
    plane
        .kubectl(&[
            "patch",
            "node",
            "node-a",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"addresses":[{"type":"InternalIP","address":"198.18.0.2"}]}}"#,
        ])
        .unwrap();
    plane.kubectl(&["create", "namespace", "demo"]).unwrap();
    apply(
        plane,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": "web"},
               "spec": {"type": "ClusterIP", "clusterIP": CLUSTER_IP,
                        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                                  {"name": "conv", "port": 81, "protocol": "TCP", "targetPort": 8081}]}}),
    );
    apply(
        plane,
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"namespace": "demo", "name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": [ip], "nodeName": "node-a", "conditions": {"ready": true}}],
               "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "conv", "port": 8081, "protocol": "TCP"}]}),
    );
}

/// Moves the slice's one endpoint to `ip`.
fn move_endpoint(plane: &ControlPlane, ip: &str) {
    let patch = json!([{"op": "replace", "path": "/endpoints/0/addresses/0", "value": ip}]);
    plane.kubectl(&["-n", "demo", "patch", "endpointslice", "web-1", "--type=json", "-p", &patch.to_string()]).unwrap();
}

/// The flags both proxies run with here: the same listeners, as a drop-in's shared ConfigMap.
fn common_args(kubeconfig: &Path, mode: &str) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        "--hostname-override=node-a".into(),
        format!("--proxy-mode={mode}"),
        "--detect-local-mode=NodeCIDR".into(),
        format!("--healthz-bind-address={HEALTHZ}"),
        format!("--metrics-bind-address={METRICS}"),
        // The machine's conntrack table is not this sandbox's to resize.
        "--conntrack-max-per-core=0".into(),
        "--conntrack-tcp-timeout-established=0".into(),
        "--conntrack-tcp-timeout-close-wait=0".into(),
    ]
}

/// The status of `GET path` on the healthz port in the node namespace (0: nothing answered).
fn node_get(node: &Netns, path: &str) -> u16 {
    node.run_in(|| http_get(HEALTHZ.parse().unwrap(), path)).unwrap().map_or(0, |(status, _)| status)
}

/// kube-proxy's flags: the common ones, and verbosity 2 for its "SyncProxyRules complete".
fn upstream_args(kubeconfig: &Path, mode: &str) -> Vec<String> {
    let mut args = common_args(kubeconfig, mode);
    args.push("--v=2".into());
    args
}

/// New TCP requests to `dest` from `from`, one every 20 ms, until `stop`: how many were
/// answered, and every failure (with when it happened).
fn send_requests(from: &Netns, dest: SocketAddr, stop: &AtomicBool) -> (usize, Vec<String>) {
    let (mut answered, mut failures) = (0, Vec::new());
    let start = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        match probe(from, Proto::Tcp, dest, Duration::from_secs(2)) {
            Ok(ProbeResult::Answered { .. }) => answered += 1,
            other => failures.push(format!("+{:.2}s {other:?}", start.elapsed().as_secs_f64())),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (answered, failures)
}

/// One TCP connection to the ClusterIP held open (port 81: the pods' conversation servers, which
/// answer every line with their name).
struct Conn(BufReader<TcpStream>);

impl Conn {
    fn open(ns: &Netns, to: SocketAddr) -> Self {
        let s = ns.run_in(move || TcpStream::connect_timeout(&to, Duration::from_secs(5))).unwrap().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Conn(BufReader::new(s))
    }

    /// The name of the backend answering (its answer is "name source port").
    fn ask(&mut self) -> String {
        self.0.get_mut().write_all(b"who\n").unwrap();
        let mut line = String::new();
        self.0.read_line(&mut line).unwrap();
        line.split_whitespace().next().unwrap_or_default().to_owned()
    }
}

/// What of each proxy is in the node namespace's kernel.
#[derive(Debug)]
struct Kernel {
    kube_proxy_table: bool,
    kproxy_table: bool,
    kube_services_chain: bool,
}

fn kernel(node: &Netns) -> Kernel {
    let tables = node.exec_ok("nft", &["list", "tables"]).unwrap();
    let nat = node.exec("iptables-nft-save", &["-t", "nat"]).map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    Kernel {
        kube_proxy_table: tables.lines().any(|l| l.trim() == "table ip kube-proxy"),
        kproxy_table: tables.lines().any(|l| l.trim() == "table ip kproxy"),
        kube_services_chain: nat.is_ok_and(|t| t.lines().any(|l| l.starts_with(":KUBE-SERVICES "))),
    }
}

fn eventually(what: &str, node: &Netns, done: impl Fn(&Kernel) -> bool, log: impl Fn() -> String) {
    let start = Instant::now();
    loop {
        let k = kernel(node);
        if done(&k) {
            return;
        }
        assert!(start.elapsed() < STEP, "{what}: not within {STEP:?}, the kernel has {k:?}\n{}", log());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The whole story for kube-proxy in `upstream_mode` and kproxy in `kproxy_mode`.
fn kube_proxy_to_kproxy_and_back(upstream_mode: &str, kproxy_mode: &str) {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let Some(binaries) = require_k8s() else { return };
    let tb = Testbed::new().unwrap();
    let pods: Vec<_> = ["web-a", "web-b", "web-c"]
        .iter()
        .map(|name| {
            let pod = tb.add_pod(name, Where::Node).unwrap();
            pod.serve(&[(Proto::Tcp, 8080)]).unwrap();
            pod.serve_conversations(&[(Proto::Tcp, 8081)]).unwrap();
            pod
        })
        .collect();
    let plane = ControlPlane::start(
        &binaries,
        ControlPlaneOptions {
            netns: Some(tb.node().path()),
            service_cidr: "198.18.128.0/24".into(),
            ..Default::default()
        },
    )
    .unwrap();
    cluster(&plane, &pods[0].ipv4().to_string());
    let kubeconfig = plane.kubeconfig(&Identity::kube_proxy()).unwrap();
    let launch = Launch { netns: Some(tb.node().path()), die_with_parent: true };
    let upstream = binaries.path(Binary::KubeProxy).unwrap();
    let upstream_log = plane.log_path("kube-proxy");
    let kube_proxy =
        Process::spawn("kube-proxy", &upstream, &upstream_args(&kubeconfig, upstream_mode), &upstream_log, &launch)
            .unwrap();
    let dest: SocketAddr = format!("{CLUSTER_IP}:80").parse().unwrap();
    let up = answered_by(tb.external(), dest, "web-a", STEP);
    assert!(up.backend() == Some("web-a"), "kube-proxy serves the Service: {up:?}\n{}", kube_proxy.log_tail(4000));

    let stop = AtomicBool::new(false);
    let (answered, failures) = std::thread::scope(|scope| {
        let traffic = scope.spawn(|| send_requests(tb.external(), dest, &stop));
        let stopper = StopOnDrop(&stop);
        steps(
            &tb,
            &plane,
            &pods,
            &kubeconfig,
            &launch,
            &upstream,
            &upstream_log,
            kube_proxy,
            upstream_mode,
            kproxy_mode,
        );
        drop(stopper);
        traffic.join().unwrap()
    });
    assert!(answered > 100, "only {answered} requests answered");
    assert!(failures.is_empty(), "{} of {} requests failed: {failures:?}", failures.len(), answered + failures.len());
    eprintln!("{upstream_mode} -> {kproxy_mode} -> {upstream_mode}: {answered} requests, none failed");
}

/// Stops the request loop however the steps end (a failed assertion too).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Steps 1 to 5 (see the module's doc), with requests flowing.
#[allow(clippy::too_many_arguments)]
fn steps(
    tb: &Testbed,
    plane: &ControlPlane,
    pods: &[std::sync::Arc<kproxy_testbed::Pod>],
    kubeconfig: &Path,
    launch: &Launch,
    upstream: &Path,
    upstream_log: &Path,
    mut kube_proxy: Process,
    upstream_mode: &str,
    kproxy_mode: &str,
) {
    let dest: SocketAddr = format!("{CLUSTER_IP}:80").parse().unwrap();
    let upstream_rules =
        |k: &Kernel| if upstream_mode == "nftables" { k.kube_proxy_table } else { k.kube_services_chain };
    assert!(upstream_rules(&kernel(tb.node())), "kube-proxy's rules are in: {:?}", kernel(tb.node()));
    let mut conn = Conn::open(tb.external(), format!("{CLUSTER_IP}:81").parse().unwrap());
    assert_eq!(conn.ask(), "web-a");

    // 1. kproxy beside a running kube-proxy: its rules go in, kube-proxy's stay.
    let kproxy_log = plane.log_path("kproxy");
    let mut args = common_args(kubeconfig, kproxy_mode);
    args.push("--iptables-min-sync-period=100ms".into());
    let mut kproxy =
        Process::spawn("kproxy", Path::new(env!("CARGO_BIN_EXE_kproxy")), &args, &kproxy_log, launch).unwrap();
    let log = || std::fs::read_to_string(&kproxy_log).unwrap_or_default();
    let start = Instant::now();
    while !log().contains("full sync done") {
        assert!(start.elapsed() < STEP, "kproxy never synced:\n{}", log());
        std::thread::sleep(Duration::from_millis(200));
    }
    if kproxy_mode == "nftables" {
        assert!(kernel(tb.node()).kproxy_table);
    }
    std::thread::sleep(Duration::from_secs(3));
    assert!(upstream_rules(&kernel(tb.node())), "kube-proxy's rules were touched while it ran:\n{}", log());
    assert!(log().contains("port is taken"), "kproxy says why it waits:\n{}", log());
    assert!(kproxy.exited().is_none(), "a taken port is no crash:\n{}", log());
    assert_eq!(conn.ask(), "web-a");

    // 2. kube-proxy stops: kproxy takes its ports and its leftovers go.
    let stopped = Instant::now();
    kube_proxy.stop(Duration::from_secs(10));
    if upstream_mode == "nftables" || kproxy_mode != "iptables" {
        eventually("kube-proxy's leftovers removed", tb.node(), |k| !upstream_rules(k), log);
    }
    let start = Instant::now();
    while node_get(tb.node(), "/readyz") != 200 {
        assert!(start.elapsed() < STEP, "kproxy never took the healthz port:\n{}", log());
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "{upstream_mode} -> {kproxy_mode}: kube-proxy stopped -> kproxy serving /readyz in {:?}",
        stopped.elapsed()
    );
    if upstream_mode == "nftables" || kproxy_mode != "iptables" {
        assert!(log().contains("took the node over from kube-proxy"), "{}", log());
    }
    assert_eq!(conn.ask(), "web-a", "the connection opened under kube-proxy survives the takeover");

    // 3. kproxy serves a change.
    move_endpoint(plane, &pods[1].ipv4().to_string());
    let moved = answered_by(tb.external(), dest, "web-b", STEP);
    assert_eq!(moved.backend(), Some("web-b"), "{}", log());

    // 4. kube-proxy starts again beside kproxy, then kproxy is stopped: it hands back.
    kube_proxy =
        Process::spawn("kube-proxy", upstream, &upstream_args(kubeconfig, upstream_mode), upstream_log, launch)
            .unwrap();
    if upstream_mode == "nftables" || kproxy_mode != "iptables" {
        eventually("kube-proxy's rules back", tb.node(), upstream_rules, || kube_proxy.log_tail(4000));
    } else {
        // Both write the same chains: wait until kube-proxy has synced (it logs it).
        let start = Instant::now();
        while !std::fs::read_to_string(upstream_log).unwrap_or_default().contains("SyncProxyRules complete") {
            assert!(start.elapsed() < STEP, "kube-proxy never synced:\n{}", kube_proxy.log_tail(4000));
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let asked = Instant::now();
    kproxy.stop(Duration::from_secs(30));
    let took = asked.elapsed();
    eprintln!("{upstream_mode} -> {kproxy_mode} -> {upstream_mode}: SIGTERM -> kproxy gone in {took:?}");
    assert!(took < Duration::from_secs(29), "kproxy did not stop within its grace:\n{}", log());
    let text = log();
    if upstream_mode == kproxy_mode && kproxy_mode == "iptables" {
        // The same chains: kube-proxy owns them now, nothing of kproxy's is separate.
        assert!(text.contains("the rules stay in place"), "{text}");
    } else {
        assert!(text.contains("handed the node back to kube-proxy"), "{text}");
        // It waited for kube-proxy's first sync (its /metrics), not only its /healthz, which
        // answers 200 from the moment kube-proxy starts.
        assert!(!text.contains("did not report a sync"), "{text}");
        let k = kernel(tb.node());
        assert!(!k.kproxy_table, "kproxy's table stayed: {k:?}");
        assert!(upstream_rules(&k), "{k:?}");
    }
    let start = Instant::now();
    while node_get(tb.node(), "/healthz") != 200 {
        assert!(start.elapsed() < STEP, "kube-proxy never served /healthz:\n{}", kube_proxy.log_tail(4000));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(conn.ask(), "web-a", "the connection survives the handback too");

    // 5. kube-proxy serves a change.
    move_endpoint(plane, &pods[2].ipv4().to_string());
    let moved = answered_by(tb.external(), dest, "web-c", STEP);
    assert_eq!(moved.backend(), Some("web-c"), "{}", kube_proxy.log_tail(4000));
    kube_proxy.stop(Duration::from_secs(10));
}

#[test]
fn kube_proxy_nftables_to_kproxy_nftables_and_back_loses_no_request_and_leaves_nothing_behind() {
    kube_proxy_to_kproxy_and_back("nftables", "nftables");
}

#[test]
fn kube_proxy_iptables_to_kproxy_nftables_and_back_loses_no_request_and_leaves_nothing_behind() {
    kube_proxy_to_kproxy_and_back("iptables", "nftables");
}

#[test]
fn kube_proxy_iptables_to_kproxy_iptables_and_back_shares_the_chains_and_loses_no_request() {
    kube_proxy_to_kproxy_and_back("iptables", "iptables");
}

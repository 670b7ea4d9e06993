//! End to end against the real kube-apiserver v1.36.2 (crates/k8s-harness), with etcd 3.6.13 and
//! with etcd 3.5.1 (on which the API server fails streaming lists with an ERROR event inside the
//! watch): Services and EndpointSlices created, patched and deleted through the API server with
//! kubectl reach the real `kproxy` binary's nftables in the sandbox's node namespace and the
//! packets, also across an API server restart; and with the API server's WatchList gate off.
//!
//! The control plane runs inside the node namespace (`nsenter --net`), bound to 127.0.0.1 there,
//! so kproxy reaches it as it would a local API server, and nothing listens outside the sandbox.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use kproxy_k8s_harness::{ControlPlane, ControlPlaneOptions, Etcd, Identity, Launch, Process, require_k8s};
use kproxy_testbed::{Netns, ProbeResult, Proto, Testbed, Where, probe};
use serde_json::json;
use support::{http_get, probe_until, value};

const CLUSTER_IP: &str = "198.18.128.10";

/// Waits until the node namespace's ruleset does (or does not) mention `needle`.
fn nft_eventually(node: &Netns, needle: &str, present: bool, within: Duration) -> bool {
    let start = Instant::now();
    loop {
        let ruleset = node.exec_ok("nft", &["list", "ruleset"]).unwrap();
        if ruleset.contains(needle) == present {
            return true;
        }
        if start.elapsed() > within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The external client is not a local pod, so ClusterIP traffic from it is masqueraded to the node.
fn answered(backend: &str) -> ProbeResult {
    ProbeResult::Answered { backend: backend.into(), seen_source: "198.18.0.2".parse().unwrap() }
}

/// A sample of kproxy's /metrics (127.0.0.1:10249 in the node namespace).
fn metric(node: &Netns, series: &str) -> f64 {
    let (status, text) = node.run_in(|| http_get("127.0.0.1:10249".parse().unwrap(), "/metrics")).unwrap().unwrap();
    assert_eq!(status, 200, "/metrics: {text}");
    value(&text, series).unwrap_or_else(|| panic!("/metrics lacks {series}"))
}

fn apply(plane: &ControlPlane, object: serde_json::Value) {
    plane.kubectl_with_stdin(&["apply", "-f", "-"], Some(&object.to_string())).unwrap();
}

/// Patches the slice `demo/web-1`'s one endpoint to `ip` on `node`.
fn move_slice(plane: &ControlPlane, ip: impl std::fmt::Display, node: &str) {
    let patch = json!([{"op": "replace", "path": "/endpoints/0/addresses/0", "value": ip.to_string()},
                       {"op": "replace", "path": "/endpoints/0/nodeName", "value": node}]);
    plane.kubectl(&["-n", "demo", "patch", "endpointslice", "web-1", "--type=json", "-p", &patch.to_string()]).unwrap();
}

fn services_and_slices_through_the_api_server_reach_the_packets(etcd: Etcd, watch_list: bool) {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let Some(binaries) = require_k8s() else { return };
    let tb = Testbed::new().unwrap();
    let t0 = Instant::now();
    let mark = |what: &str| eprintln!("{etcd:?}/{watch_list}: +{:.2}s {what}", t0.elapsed().as_secs_f64());
    let pod_a = tb.add_pod("web-a", Where::Node).unwrap();
    let pod_b = tb.add_pod("web-b", Where::Node2).unwrap();
    pod_a.serve(&[(Proto::Tcp, 8080)]).unwrap();
    pod_b.serve(&[(Proto::Tcp, 8080)]).unwrap();

    let plane = ControlPlane::start(
        &binaries,
        ControlPlaneOptions {
            etcd,
            watch_list,
            netns: Some(tb.node().path()),
            service_cidr: "198.18.128.0/24".into(),
            ..Default::default()
        },
    )
    .unwrap();
    apply(
        &plane,
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
    mark("namespace created");
    apply(
        &plane,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": "web"},
               "spec": {"type": "ClusterIP", "clusterIP": CLUSTER_IP,
                        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]}}),
    );
    let slice = |ip: String, node: &str| {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"namespace": "demo", "name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": [ip], "nodeName": node, "conditions": {"ready": true}}],
               "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
    };
    apply(&plane, slice(pod_a.ipv4().to_string(), "node-a"));
    mark("objects created");

    // kproxy as kube-proxy runs: its own identity (RBAC role system:node-proxier), in the node.
    let kubeconfig = plane.kubeconfig(&Identity::kube_proxy()).unwrap();
    let log = plane.log_path("kproxy");
    mark("kproxy starting");
    let started = Instant::now();
    let args: Vec<String> = [
        format!("--kubeconfig={}", kubeconfig.display()),
        "--hostname-override=node-a".into(),
        "--detect-local-mode=NodeCIDR".into(),
        "--iptables-min-sync-period=100ms".into(),
        "--healthz-bind-address=127.0.0.1:10256".into(),
        "--metrics-bind-address=127.0.0.1:10249".into(),
        "--conntrack-max-per-core=0".into(),
        "--conntrack-tcp-timeout-established=0".into(),
        "--conntrack-tcp-timeout-close-wait=0".into(),
    ]
    .into();
    // Its own process group in the node namespace, killed on drop (and with this thread).
    let launch = Launch { netns: Some(tb.node().path()), die_with_parent: true };
    let mut kproxy = Process::spawn("kproxy", Path::new(env!("CARGO_BIN_EXE_kproxy")), &args, &log, &launch).unwrap();
    let kproxy_log = || std::fs::read_to_string(&log).unwrap_or_default();

    let dest: SocketAddr = format!("{CLUSTER_IP}:80").parse().unwrap();
    let got = probe_until(tb.external(), dest, &answered("web-a"), support::START);
    assert_eq!(
        got,
        answered("web-a"),
        "the created Service and slice reach the packets; kproxy's log:\n{}",
        kproxy_log()
    );
    eprintln!("{etcd:?}: start -> first answer through kproxy in {:?}", started.elapsed());
    assert!(nft_eventually(tb.node(), CLUSTER_IP, true, Duration::ZERO), "the ClusterIP is in the node's ruleset");
    // etcd 3.5.1 fails the streaming list (an ERROR event), WatchList off refuses it (422):
    // kproxy got there by falling back to list + watch; on etcd 3.6 it streamed.
    let fallbacks = metric(tb.node(), "kproxy_source_streaming_list_fallbacks_total{kind=\"Service\"}");
    if etcd == Etcd::V3_5_1 || !watch_list {
        assert!(fallbacks >= 1.0, "no streaming-list fallback counted ({etcd:?}, WatchList {watch_list})");
    } else {
        assert_eq!(fallbacks, 0.0, "a streaming-list fallback on etcd 3.6 with WatchList on");
    }

    // The slice patched to the other node's pod moves the traffic.
    move_slice(&plane, pod_b.ipv4(), "node-b");
    assert_eq!(probe_until(tb.external(), dest, &answered("web-b"), support::CHANGE), answered("web-b"));
    mark("slice patch in the packets");

    // The Service's port patched: the new port answers, the old one is refused.
    plane
        .kubectl(&[
            "-n",
            "demo",
            "patch",
            "service",
            "web",
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/spec/ports/0/port","value":81}]"#,
        ])
        .unwrap();
    let dest81: SocketAddr = format!("{CLUSTER_IP}:81").parse().unwrap();
    assert_eq!(probe_until(tb.external(), dest81, &answered("web-b"), support::CHANGE), answered("web-b"));
    mark("port patch in the packets");
    assert_eq!(probe_until(tb.external(), dest, &ProbeResult::Refused, support::CHANGE), ProbeResult::Refused);
    mark("old port refused");

    // kube-proxy's RBAC (system:node-proxier) covers everything kproxy watches. (Right after an
    // API server restart its authorizer may deny for a moment, so this is checked before.)
    assert!(!kproxy_log().contains("is forbidden: User"), "kproxy was denied something:\n{}", kproxy_log());

    // The API server restarts (same port and etcd): the rules keep serving meanwhile, and a
    // change made after it reaches the packets.
    let mut plane = plane;
    plane.stop_apiserver();
    assert_eq!(probe(tb.external(), Proto::Tcp, dest81, Duration::from_secs(1)).unwrap(), answered("web-b"));
    let restarted = Instant::now();
    plane.start_apiserver().unwrap();
    eprintln!("{etcd:?}: API server back in {:?}", restarted.elapsed());
    mark("API server back");
    move_slice(&plane, pod_a.ipv4(), "node-a");
    mark("post-restart patch made");
    assert_eq!(
        probe_until(tb.external(), dest81, &answered("web-a"), support::CHANGE),
        answered("web-a"),
        "a change after an API server restart; kproxy's log:\n{}",
        kproxy_log()
    );
    eprintln!("{etcd:?}: API server restart -> a change in the packets in {:?}", restarted.elapsed());

    // The slice deleted: the Service has no endpoint left and is rejected, as upstream does.
    plane.kubectl(&["-n", "demo", "delete", "endpointslice", "web-1"]).unwrap();
    mark("slice deleted");
    assert_eq!(
        probe_until(tb.external(), dest81, &ProbeResult::Refused, support::CHANGE),
        ProbeResult::Refused,
        "a Service whose slice was deleted; kproxy's log:\n{}",
        kproxy_log()
    );

    // Deleted: the ClusterIP leaves the ruleset and no pod answers it.
    plane.kubectl(&["-n", "demo", "delete", "service", "web"]).unwrap();
    mark("service deleted");
    assert!(
        nft_eventually(tb.node(), CLUSTER_IP, false, support::CHANGE),
        "the deleted Service's ClusterIP is still in the node's ruleset"
    );
    let after = probe(tb.external(), Proto::Tcp, dest81, Duration::from_millis(500)).unwrap();
    assert!(after.backend().is_none(), "a deleted Service still answers: {after:?}");
    assert!(kproxy.exited().is_none(), "kproxy exited: {:?}\n{}", kproxy.exited(), kproxy_log());
    kproxy.stop(Duration::from_secs(5));
}

#[test]
fn services_and_slices_through_a_real_api_server_on_etcd_3_6_reach_the_packets() {
    services_and_slices_through_the_api_server_reach_the_packets(Etcd::V3_6, true);
}

/// The API server's WatchList feature gate off: a streaming list is refused at its start (422).
#[test]
fn services_and_slices_through_a_real_api_server_with_watch_list_off_reach_the_packets() {
    services_and_slices_through_the_api_server_reach_the_packets(Etcd::V3_6, false);
}

/// kube-apiserver v1.36.2 on etcd 3.5.1 fails every streaming list; kproxy must fall back to
/// list + watch (as client-go does) and serve.
#[test]
fn services_and_slices_through_a_real_api_server_on_etcd_3_5_1_reach_the_packets() {
    services_and_slices_through_the_api_server_reach_the_packets(Etcd::V3_5_1, true);
}

/// etcd 3.5.1 and the WatchList feature gate off: the streaming list is refused at its start
/// (422) before etcd's missing progress notifications could matter.
#[test]
fn services_and_slices_through_a_real_api_server_on_etcd_3_5_1_with_watch_list_off_reach_the_packets() {
    services_and_slices_through_the_api_server_reach_the_packets(Etcd::V3_5_1, false);
}

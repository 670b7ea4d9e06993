//! `--dry-run` has no side effects: it plans and prints, but opens no health-check node port and
//! leaves the process's `oom_score_adj` alone, while the same Service is planned (its Local
//! policy without local endpoints is counted), so the test would see the port if it opened.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kproxy_state::Kind;
use serde_json::json;
use support::{Api, DryRun, free_port, value};

#[test]
fn dry_run_opens_no_health_check_port_and_keeps_oom_score_adj() {
    let health_check_port = free_port().port();
    let api = Api::start();
    api.server.apply(
        Kind::Node,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
               "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.2"}]}}),
    );
    api.server.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": "lb"},
               "spec": {"type": "LoadBalancer", "clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
                        "externalTrafficPolicy": "Local", "healthCheckNodePort": health_check_port,
                        "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}]},
               "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}}),
    );
    api.server.apply(
        Kind::EndpointSlice,
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"namespace": "demo", "name": "lb-1", "labels": {"kubernetes.io/service-name": "lb"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": ["198.18.17.5"], "nodeName": "node-b", "conditions": {"ready": true}}],
               "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}]}),
    );
    let kproxy = DryRun::start(&api, "side-effects", &[]);
    let text = kproxy.wait_synced();
    let no_local =
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"external\"}";
    assert_eq!(value(&text, no_local), Some(1.0), "the eTP Local Service was planned:\n{text}");
    // Give the health-check task time to act on the plan, as it would outside --dry-run.
    std::thread::sleep(Duration::from_millis(500));

    let port = SocketAddr::from(([127, 0, 0, 1], health_check_port));
    let connected = TcpStream::connect_timeout(&port, Duration::from_secs(1));
    assert!(connected.is_err(), "--dry-run opened the health-check node port {health_check_port}");
    let ours = std::fs::read_to_string("/proc/self/oom_score_adj").unwrap();
    let its = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", kproxy.child.id())).unwrap();
    assert_eq!(its, ours, "--dry-run changed its oom_score_adj (inherited from this test)");
}

#[test]
fn master_overrides_the_kubeconfig_server() {
    let api = Api::start();
    api.server.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "demo", "name": "web"},
        "spec": {"clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
                 "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080}]}}),
    );
    // The kubeconfig names a server where nothing listens; --master names the real one.
    let nowhere = format!("http://{}", free_port());
    let kproxy = DryRun::start_with_server(&nowhere, "master", &[format!("--master={}", api.server.url())]);
    kproxy.wait_synced();
    // The initial list is streamed (a watch with initial events) or, on servers without
    // streaming lists, a list.
    let requests = api.server.list_count(Kind::Service) + api.server.watch_count(Kind::Service);
    assert!(requests >= 1, "kproxy listed Services from --master");
}

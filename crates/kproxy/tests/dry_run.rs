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

/// In `--manifests` mode no API server checks names: a Service and a slice whose names hold a
/// newline and a quote are rejected by field, counted, and nothing of theirs reaches the
/// `iptables-restore` input, while the valid Service next to them is written.
#[test]
fn names_an_api_server_would_refuse_never_reach_iptables_restore_input() {
    use std::io::Read;
    let dir = std::env::temp_dir().join(format!("kproxy-dry-names-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let service = |name: &str, ip: &str| {
        format!(
            "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: demo, name: {name}}}\n\
             spec: {{clusterIP: {ip}, ports: [{{name: p, port: 80, protocol: TCP}}]}}\n"
        )
    };
    let slice = |name: &str, service: &str, ip: &str| {
        format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{namespace: demo, name: {name}, labels: {{kubernetes.io/service-name: {service}}}}}\n\
             addressType: IPv4\nendpoints: [{{addresses: [{ip}]}}]\nports: [{{name: p, port: 8080, protocol: TCP}}]\n"
        )
    };
    let manifests = [
        service("good", "198.18.128.10"),
        slice("good-1", "good", "198.18.16.5"),
        service("\"bad\\n-A INPUT -j ACCEPT\"", "198.18.128.11"),
        slice("\"evil\\\" -j DROP\"", "good", "198.18.16.6"),
    ]
    .concat();
    std::fs::write(dir.join("cluster.yaml"), manifests).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_kproxy"))
        .arg(format!("--manifests={}", dir.display()))
        .args(["--dry-run", "--proxy-mode=iptables", "--hostname-override=node-a", "--healthz-bind-address="])
        .arg(format!("--metrics-bind-address={}", free_port()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let mut buf = [0u8; 4096];
        // The first full restore holds the nat table with every Service chain.
        while !text.contains("demo/good:p") || !text.contains("COMMIT") {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
        text
    });
    let deadline = std::time::Instant::now() + support::START;
    while !reader.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    let text = reader.join().unwrap();
    let mut log = String::new();
    child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(text.contains("demo/good:p") && text.contains("198.18.16.5"), "the valid Service is written:\n{text}");
    assert!(!text.contains("bad") && !text.contains("evil") && !text.contains("198.18.128.11"), "{text}");
    assert!(!text.contains("198.18.16.6"), "the bad slice's endpoint is not written:\n{text}");
    assert!(log.contains("metadata.name"), "the rejection names the field:\n{log}");
}

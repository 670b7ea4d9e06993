//! Swapping kube-proxy for kproxy with kubeadm's ConfigMap unchanged (`mode: ""`): the real
//! binary, a fake API server and packets in a sandbox. kube-proxy's default (iptables) served a
//! NodePort on every local address, a secondary one included, and on 127.0.0.1; so must kproxy.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};

use kproxy_state::Kind;
use kproxy_testbed::{ProbeResult, Proto, Testbed, Where};
use serde_json::json;

const NODE_PORT: u16 = 30080;
/// A second address on the node's uplink, in the LAN the external client is on.
const SECONDARY: &str = "198.18.0.4";

#[test]
fn kubeadm_configmap_keeps_node_ports_on_secondary_addresses_and_localhost() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let pod = tb.add_pod("web-b", Where::Node2).unwrap();
    pod.serve(&[(Proto::Tcp, 8080)]).unwrap();
    tb.node().ip(["addr", "add", &format!("{SECONDARY}/24"), "dev", "eth0"]).unwrap();

    let api = support::api_in(tb.node());
    let server = &api.server;
    support::apply_node_a(server);
    server.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": "web"},
               "spec": {"type": "NodePort", "clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
                        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080,
                                   "nodePort": NODE_PORT}]}}),
    );
    support::apply_one_endpoint_slice(server, "web", "http", &pod.ipv4().to_string(), "node-b");

    let dir = std::env::temp_dir().join(format!("kproxy-kubeadm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = support::write_kubeconfig(&dir, &server.url());
    // kubeadm's ConfigMap as it is, but for where the kubeconfig lives and the conntrack limits:
    // nf_conntrack's hash size is global to the host, which a test must not change.
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/tests/fixtures/kubeadm.yaml");
    let config = std::fs::read_to_string(fixture)
        .unwrap()
        .replace("/var/lib/kube-proxy/kubeconfig.conf", &kubeconfig.display().to_string())
        .replace("maxPerCore: null", "maxPerCore: 0")
        .replace("tcpCloseWaitTimeout: null", "tcpCloseWaitTimeout: 0s")
        .replace("tcpEstablishedTimeout: null", "tcpEstablishedTimeout: 0s");
    assert!(config.contains("mode: \"\""), "kubeadm's mode is blank");
    let config_path = dir.join("config.conf");
    std::fs::write(&config_path, config).unwrap();

    let _kproxy = support::KillOnDrop(
        Command::new("ip")
            .args(["netns", "exec", tb.node().name(), env!("CARGO_BIN_EXE_kproxy")])
            .arg(format!("--config={}", config_path.display()))
            .arg("--hostname-override=node-a")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );

    let primary: SocketAddr = format!("198.18.0.2:{NODE_PORT}").parse().unwrap();
    let got = support::answered_by(tb.external(), primary, "web-b", support::START);
    assert!(matches!(&got, ProbeResult::Answered { backend, .. } if backend == "web-b"), "primary: {got:?}");
    let secondary: SocketAddr = format!("{SECONDARY}:{NODE_PORT}").parse().unwrap();
    let got = support::answered_by(tb.external(), secondary, "web-b", support::CHANGE);
    assert!(matches!(&got, ProbeResult::Answered { backend, .. } if backend == "web-b"), "secondary: {got:?}");
    let localhost: SocketAddr = format!("127.0.0.1:{NODE_PORT}").parse().unwrap();
    let got = support::answered_by(tb.node(), localhost, "web-b", support::CHANGE);
    assert!(matches!(&got, ProbeResult::Answered { backend, .. } if backend == "web-b"), "127.0.0.1: {got:?}");

    let _ = std::fs::remove_dir_all(&dir);
}

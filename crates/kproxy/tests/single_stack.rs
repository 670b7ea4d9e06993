//! A node without IPv6 (a sandbox whose namespace has IPv6 disabled): kproxy probes the families
//! at start and runs IPv4 only, so its iptables syncs succeed, IPv4 Services are served, and no
//! IPv6 series is exported; the same binary on a dual-stack node exports both (the control).
//! `--cleanup` there removes the IPv4 chains and succeeds without ip6tables.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use kproxy_testbed::{ProbeResult, Proto, Testbed, Where};

/// Runs kproxy (`mode`) in the node of a fresh sandbox, IPv6 disabled there or not; returns the
/// /metrics text once the IPv4 Service answers.
fn run(mode: &str, ipv6: bool) -> String {
    let tb = Testbed::new().unwrap();
    let pod = tb.add_pod("web-b", Where::Node2).unwrap();
    pod.serve(&[(Proto::Tcp, 8080)]).unwrap();
    if !ipv6 {
        tb.node().exec_ok("sysctl", &["-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"]).unwrap();
    }
    let api = support::api_in(tb.node());
    support::apply_node_a(&api.server);
    support::apply_web_service(&api.server, "http");
    support::apply_one_endpoint_slice(&api.server, "web", "http", &pod.ipv4().to_string(), "node-b");
    let args: Vec<String> = [
        format!("--proxy-mode={mode}"),
        "--hostname-override=node-a".into(),
        "--metrics-bind-address=127.0.0.1:10249".into(),
        "--detect-local-mode=NodeCIDR".into(),
        "--conntrack-max-per-core=0".into(),
        "--conntrack-tcp-timeout-established=0".into(),
        "--conntrack-tcp-timeout-close-wait=0".into(),
    ]
    .to_vec();
    let (_kproxy, dir) =
        support::kproxy_in(tb.node().name(), &api.server.url(), &format!("stack-{mode}-{ipv6}"), &args);
    let dest: SocketAddr = "198.18.128.10:80".parse().unwrap();
    let got = support::answered_by(tb.external(), dest, "web-b", support::START);
    assert!(matches!(&got, ProbeResult::Answered { backend, .. } if backend == "web-b"), "{mode}: {got:?}");
    // The packets flow as soon as the rules are in; the metrics follow right after the sync.
    let metrics: SocketAddr = "127.0.0.1:10249".parse().unwrap();
    let synced = "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}";
    let deadline = std::time::Instant::now() + support::CHANGE;
    let text = loop {
        let text = tb.node().run_in(move || support::http_get(metrics, "/metrics")).unwrap().unwrap().1;
        if text.contains(synced) || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = std::fs::remove_dir_all(&dir);
    text
}

fn assert_single_stack(mode: &str) {
    let text = run(mode, false);
    assert!(text.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}"), "{text}");
    assert!(!text.contains("ip_family=\"IPv6\""), "{mode}: IPv6 series on a node without IPv6:\n{text}");
    // The failure counters are exported at zero from the start: none may have counted.
    let failures: Vec<&str> = text.lines().filter(|l| l.contains("failures_total{")).collect();
    assert!(!failures.is_empty(), "{mode}: the failure counters are exported:\n{text}");
    assert!(failures.iter().all(|l| l.ends_with(" 0")), "{mode}: no sync failed: {failures:?}");
}

#[test]
fn iptables_mode_runs_ipv4_only_on_a_node_without_ipv6() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    assert_single_stack("iptables");
}

#[test]
fn nftables_mode_runs_ipv4_only_on_a_node_without_ipv6() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    assert_single_stack("nftables");
}

#[test]
fn dual_stack_node_exports_both_families() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let text = run("iptables", true);
    assert!(text.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"}"), "{text}");
}

/// `--cleanup` on a node without IPv6 and without `ip6tables` (every `ip6tables*` tool on
/// `PATH` fails): kproxy's IPv4 chains go, and the cleanup reports success instead of failing on
/// the family the node does not have. (The backend probe still reads `ip6tables-save`, as
/// upstream's iptables-wrapper does, ignoring failures.)
#[test]
fn cleanup_on_a_node_without_ipv6_succeeds_and_removes_ipv4_chains() {
    use std::os::unix::fs::PermissionsExt;
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let tb = Testbed::new().unwrap();
    tb.node().exec_ok("sysctl", &["-q", "-w", "net.ipv6.conf.all.disable_ipv6=1"]).unwrap();
    // An IPv4 chain of kproxy's in the backend cleanup picks on a fresh node (nft).
    tb.node().exec_ok("iptables-nft", &["-t", "nat", "-N", "KUBE-SERVICES"]).unwrap();
    let tools = std::env::temp_dir().join(format!("kproxy-no-ip6tables-{}", std::process::id()));
    std::fs::create_dir_all(&tools).unwrap();
    for backend in ["nft", "legacy"] {
        for tool in ["", "-save", "-restore"] {
            let path = tools.join(format!("ip6tables-{backend}{tool}"));
            std::fs::write(&path, "#!/bin/sh\necho 'ip6tables: no IPv6 here' >&2\nexit 3\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap_or_default());
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", tb.node().name(), env!("CARGO_BIN_EXE_kproxy"), "--cleanup"])
        .env("PATH", &path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let _ = std::fs::remove_dir_all(&tools);
    assert!(out.status.success(), "cleanup failed:\n{stderr}");
    assert!(!stderr.contains("could not remove"), "{stderr}");
    let saved = tb.node().exec_ok("iptables-nft-save", &["-t", "nat"]).unwrap();
    assert!(!saved.contains("KUBE-SERVICES"), "IPv4 chain left:\n{saved}");
}

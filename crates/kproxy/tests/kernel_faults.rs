//! What other programs do to the kernel under a running kproxy (nftables mode): a map flushed and
//! the whole table deleted by another tool are repaired within seconds (kproxy follows nf_tables'
//! notifications; the periodic check is an hour away) and counted;
//! another process committing nf_tables batches in a loop does not stop kproxy's syncs, and
//! kproxy leaves that process's table alone. The real binary, a fake API server, packets.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kproxy_state::Kind;
use kproxy_testbed::{Netns, ProbeResult, Proto, Testbed, Where, probe};
use serde_json::json;

const CLUSTER_IP: &str = "198.18.128.10:80";
const REPAIRS: &str = "kproxy_sync_proxy_rules_drift_repairs_total";
/// The periodic check's period in the repair test: an hour, so that only the notice of the other
/// tool's commit can have caused a repair the test sees (with the default 30 s, the test had to
/// tell the two apart by how fast the repair came).
const NO_PERIODIC_CHECK: &str = "--iptables-sync-period=1h";
const SYNC_FAILURES: &str = "kubeproxy_sync_proxy_rules_nftables_sync_failures";

/// Sync failures of every family (exported at zero from the start).
fn sync_failures(text: &str) -> f64 {
    let series = format!("{SYNC_FAILURES}_total{{");
    assert!(text.contains(&series), "sync failures not exported:\n{text}");
    text.lines()
        .filter(|line| line.starts_with(&series))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn scrape(node: &Netns, metrics: SocketAddr) -> String {
    node.run_in(move || support::http_get(metrics, "/metrics").map(|(_, body)| body).unwrap_or_default()).unwrap()
}

/// Waits until the series reaches at least `at_least`; returns its value.
fn metric_reaches(node: &Netns, metrics: SocketAddr, series: &str, at_least: f64) -> f64 {
    let deadline = Instant::now() + support::CHANGE;
    loop {
        let value = support::value(&scrape(node, metrics), series).unwrap_or(0.0);
        if value >= at_least || Instant::now() > deadline {
            return value;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn answered_by(got: &ProbeResult, pod: &str) -> bool {
    matches!(got, ProbeResult::Answered { backend, .. } if backend == pod)
}

#[test]
fn damage_by_another_tool_is_repaired_within_seconds_not_at_the_next_periodic_check_and_a_concurrent_committer_is_left_alone()
 {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let pods = [tb.add_pod("web-b", Where::Node2).unwrap(), tb.add_pod("web-c", Where::Node2).unwrap()];
    for pod in &pods {
        pod.serve(&[(Proto::Tcp, 8080)]).unwrap();
    }
    let client = tb.add_pod("client", Where::Node).unwrap();
    let api = support::api_in(tb.node());
    support::apply_node_a(&api.server);
    support::apply_web_service(&api.server, "p");
    let endpoint = |pod: usize| {
        support::apply_one_endpoint_slice(&api.server, "web", "p", &pods[pod].ipv4().to_string(), "node-b");
    };
    endpoint(0);
    let metrics = support::free_port();
    // The periodic check comes every syncPeriod, here an hour away: a repair the test sees is
    // the notice of the other tool's commit at work. (Host: about 0.5 s; the guest's emulated
    // kernel and debug build took 5.3 s to rebuild the deleted table.)
    let args = support::node_a_args(metrics, &[NO_PERIODIC_CHECK]);
    let (_kproxy, dir) = support::kproxy_in(tb.node().name(), &api.server.url(), "kernel-faults", &args);
    let service: SocketAddr = CLUSTER_IP.parse().unwrap();
    let got = support::answered_by(client.netns(), service, "web-b", support::START);
    assert!(answered_by(&got, "web-b"), "the ClusterIP answers once kproxy synced: {got:?}");
    assert_eq!(support::value(&scrape(tb.node(), metrics), REPAIRS), Some(0.0), "nothing to repair yet");

    // Another tool empties the ClusterIP dispatch map, then deletes kproxy's whole table: each
    // is found and repaired (and counted) within the time a change takes to reach the kernel.
    let damages = ["flush map ip kproxy service-ips", "delete table ip kproxy"];
    for (n, damage) in damages.into_iter().enumerate() {
        let at = Instant::now();
        tb.node().nft(damage).unwrap();
        let repairs = metric_reaches(tb.node(), metrics, REPAIRS, (n + 1) as f64);
        assert!(repairs >= (n + 1) as f64, "`{damage}` was found and its repair counted");
        let got = support::answered_by(client.netns(), service, "web-b", support::CHANGE);
        assert!(answered_by(&got, "web-b"), "repaired after `{damage}`: {got:?}");
        eprintln!("`{damage}` repaired after {:?}", at.elapsed());
    }

    // Another process commits batches to its own table in a loop while kproxy syncs changes.
    tb.node().nft("add table ip bystander\nadd set ip bystander seen { type ipv4_addr; }").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let commits = Arc::new(AtomicUsize::new(0));
    let committer = {
        let (stop, commits) = (stop.clone(), commits.clone());
        let script = "add element ip bystander seen { 192.0.2.1 }\ndelete element ip bystander seen { 192.0.2.1 }";
        let node = tb.node().name().to_owned();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let status = std::process::Command::new("ip")
                    .args(["netns", "exec", &node, "nft", "-f", "-"])
                    .stdin(std::process::Stdio::piped())
                    .spawn()
                    .and_then(|mut child| {
                        use std::io::Write as _;
                        child.stdin.take().unwrap().write_all(script.as_bytes())?;
                        child.wait()
                    });
                assert!(status.is_ok_and(|s| s.success()), "the bystander's own batch failed");
                commits.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let failures_before = sync_failures(&scrape(tb.node(), metrics));
    for round in 0..6 {
        let pod = (round + 1) % 2;
        endpoint(pod);
        let name = pods[pod].name();
        let got = support::answered_by(client.netns(), service, name, support::CHANGE);
        assert!(answered_by(&got, name), "change {round} reached the kernel during the concurrent commits: {got:?}");
    }
    stop.store(true, Ordering::Relaxed);
    committer.join().unwrap();
    assert!(commits.load(Ordering::Relaxed) > 5, "the bystander committed while kproxy synced");
    let text = scrape(tb.node(), metrics);
    assert_eq!(sync_failures(&text), failures_before, "no sync failed:\n{text}");
    let bystander = tb.node().exec_ok("nft", &["list", "table", "ip", "bystander"]).unwrap();
    assert!(bystander.contains("set seen"), "kproxy left the other table alone: {bystander}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stale_chain_another_tool_still_jumps_to_is_a_counted_cleanup_failure_and_syncs_go_on() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    const CLEANUP_FAILURES: &str = "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family=\"IPv4\"}";
    let tb = Testbed::new().unwrap();
    let pods = [tb.add_pod("web-b", Where::Node2).unwrap(), tb.add_pod("web-c", Where::Node2).unwrap()];
    for pod in &pods {
        pod.serve(&[(Proto::Tcp, 8080)]).unwrap();
    }
    let client = tb.add_pod("client", Where::Node).unwrap();
    let api = support::api_in(tb.node());
    support::apply_node_a(&api.server);
    // Session affinity gives a service port chains of its own.
    for (name, ip, affinity) in [("web", "198.18.128.10", "None"), ("gone", "198.18.128.11", "ClientIP")] {
        api.server.apply(
            Kind::Service,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": name},
                   "spec": {"clusterIP": ip, "clusterIPs": [ip], "sessionAffinity": affinity,
                            "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080}]}}),
        );
    }
    let endpoint = |service: &str, pod: usize| {
        support::apply_one_endpoint_slice(&api.server, service, "p", &pods[pod].ipv4().to_string(), "node-b");
    };
    endpoint("web", 0);
    endpoint("gone", 0);
    let metrics = support::free_port();
    // Followed commits would have kproxy remove the other tool's jump as soon as it is made
    // (the first test): without, it stays until the next periodic check, past the next sync.
    let args = support::node_a_args(metrics, &["--watch-kernel-changes=false"]);
    let (_kproxy, dir) = support::kproxy_in(tb.node().name(), &api.server.url(), "cleanup-failure", &args);
    let service: SocketAddr = CLUSTER_IP.parse().unwrap();
    let got = support::answered_by(client.netns(), service, "web-b", support::START);
    assert!(answered_by(&got, "web-b"), "the ClusterIP answers once kproxy synced: {got:?}");
    assert_eq!(support::value(&scrape(tb.node(), metrics), CLEANUP_FAILURES), Some(0.0), "exported at zero");
    let gone_chains = || -> Vec<String> {
        let listing = tb.node().exec_ok("nft", &["list", "table", "ip", "kproxy"]).unwrap();
        listing
            .lines()
            .filter_map(|l| l.trim().strip_prefix("chain ")?.strip_suffix(" {").map(str::to_owned))
            .filter(|c| c.contains("demo/gone"))
            .collect()
    };
    let gone: SocketAddr = "198.18.128.11:80".parse().unwrap();
    let got = support::answered_by(client.netns(), gone, "web-b", support::START);
    assert!(answered_by(&got, "web-b"), "the second Service answers too: {got:?}");
    let chains = gone_chains();
    assert!(!chains.is_empty(), "the second Service has chains of its own");

    // The Service goes: its chains are flushed and left for the next sync to delete; another
    // tool jumps to one of them meanwhile, so the kernel refuses that deletion.
    api.server.delete(Kind::Service, "demo", "gone");
    let deadline = Instant::now() + support::CHANGE;
    while probe(client.netns(), Proto::Tcp, gone, Duration::from_millis(300)).unwrap().backend().is_some() {
        assert!(Instant::now() < deadline, "the deleted Service kept answering");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(gone_chains(), chains, "flushed, not yet deleted");
    tb.node().nft(&format!("add chain ip kproxy intruder\nadd rule ip kproxy intruder jump {}", chains[0])).unwrap();

    // The next sync still lands (the Service moves to web-c) and the failed cleanup is counted.
    endpoint("web", 1);
    let got = support::answered_by(client.netns(), service, "web-c", support::CHANGE);
    assert!(answered_by(&got, "web-c"), "the sync after the failed cleanup landed: {got:?}");
    assert!(metric_reaches(tb.node(), metrics, CLEANUP_FAILURES, 1.0) >= 1.0, "the failed cleanup was counted");
    assert_eq!(sync_failures(&scrape(tb.node(), metrics)), 0.0, "a cleanup failure is not a sync failure");
    assert!(gone_chains().contains(&chains[0]), "the held chain is still there");

    // Once the other tool lets go, the next sync deletes what was left.
    tb.node().nft("flush chain ip kproxy intruder\ndelete chain ip kproxy intruder").unwrap();
    endpoint("web", 0);
    let got = support::answered_by(client.netns(), service, "web-b", support::CHANGE);
    assert!(answered_by(&got, "web-b"), "the next sync landed: {got:?}");
    let deadline = Instant::now() + support::CHANGE;
    while !gone_chains().is_empty() {
        assert!(Instant::now() < deadline, "the stale chains were never deleted: {:?}", gone_chains());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(support::value(&scrape(tb.node(), metrics), CLEANUP_FAILURES), Some(1.0), "no further failure");
    let _ = std::fs::remove_dir_all(&dir);
}

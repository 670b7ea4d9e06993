//! The node's conntrack table full (`nf_conntrack_max` reached) under a running kproxy, in each
//! mode (nftables, iptables, IPVS): the kernel drops every new connection, established flows go
//! on, and kproxy goes on too. Changes still reach the kernel, a removed endpoint's stale UDP entry
//! is still deleted (by kproxy's cleanup; in IPVS mode by IPVS itself), the freed slot lets that
//! flow move to the new endpoint, and once the table has room again every Service answers, the
//! one added meanwhile included, with no sync failed. The real binary, a fake API server, packets.
//!
//! `nf_conntrack_max` is global to the kernel (read-only outside the initial namespace), so this
//! test runs only in the throwaway guest kernel (`cargo xtask guest-test conntrack_table_full`);
//! the only test of its binary, it runs there alone, and the modes run one after another.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kproxy_state::Kind;
use kproxy_testbed::kernel::KernelFeature;
use kproxy_testbed::{Netns, ProbeOptions, ProbeResult, Proto, Testbed, Where, probe, probe_with};
use serde_json::{Value, json};

const WEB: &str = "198.18.128.10:80";
const DNS: &str = "198.18.128.11:53";
/// The Service created while the table is full.
const LATE: &str = "198.18.128.12:80";
/// The long-lived UDP flow's source port.
const FLOW_PORT: u16 = 40_000;
const CONNTRACK_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

/// The kernel's `nf_conntrack_max`, set for the test and put back when dropped (also on failure).
struct ConntrackMax {
    before: String,
}

impl ConntrackMax {
    fn set(max: usize) -> ConntrackMax {
        let before = std::fs::read_to_string(CONNTRACK_MAX).unwrap().trim().to_owned();
        std::fs::write(CONNTRACK_MAX, max.to_string()).unwrap();
        ConntrackMax { before }
    }
}

impl Drop for ConntrackMax {
    fn drop(&mut self) {
        let _ = std::fs::write(CONNTRACK_MAX, &self.before);
    }
}

fn service(name: &str, ip: &str, proto: &str, port: u16, target: u16) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": name},
           "spec": {"clusterIP": ip, "clusterIPs": [ip],
                    "ports": [{"name": "p", "port": port, "protocol": proto, "targetPort": target}]}})
}

fn slice(service: &str, pod_ip: &str, proto: &str, port: u16) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"namespace": "demo", "name": format!("{service}-1"),
                        "labels": {"kubernetes.io/service-name": service}},
           "addressType": "IPv4",
           "endpoints": [{"addresses": [pod_ip], "nodeName": "node-b", "conditions": {"ready": true}}],
           "ports": [{"name": "p", "port": port, "protocol": proto}]})
}

/// One datagram of the long-lived flow (always from [`FLOW_PORT`]).
fn flow(client: &Netns) -> ProbeResult {
    let options =
        ProbeOptions { timeout: Duration::from_millis(500), bind: Some(SocketAddr::from(([0, 0, 0, 0], FLOW_PORT))) };
    probe_with(client, Proto::Udp, DNS.parse().unwrap(), &options).unwrap()
}

/// Sends the flow's datagrams until `pod` answers one or `within` passed; returns the last result.
fn flow_answered_by(client: &Netns, pod: &str, within: Duration) -> ProbeResult {
    let deadline = Instant::now() + within;
    loop {
        let got = flow(client);
        if got.backend() == Some(pod) || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The node's conntrack entries of the flow (`conntrack -L` lines).
fn flow_entries(node: &Netns) -> String {
    node.exec_ok("conntrack", &["-L", "-p", "udp", "--orig-port-src", &FLOW_PORT.to_string()]).unwrap()
}

/// Inserts one assured, established TCP entry between two documentation addresses (no packet
/// ever matches it); false when the kernel refused it.
fn insert_filler(node: &Netns, port: u16) -> bool {
    let port = port.to_string();
    let args = [
        "-I",
        "-p",
        "tcp",
        "-s",
        "203.0.113.1",
        "-d",
        "203.0.113.2",
        "--sport",
        &port,
        "--dport",
        "9",
        "-r",
        "203.0.113.2",
        "-q",
        "203.0.113.1",
        "--reply-port-src",
        "9",
        "--reply-port-dst",
        &port,
        "--state",
        "ESTABLISHED",
        "-u",
        "ASSURED,SEEN_REPLY",
        "-t",
        "600",
    ];
    node.exec("conntrack", &args).unwrap().status.success()
}

/// What the dataplane of `mode` holds in `node`, as its own tool lists it.
fn dataplane_listing(node: &Netns, mode: &str) -> String {
    let (tool, args): (&str, &[&str]) = match mode {
        "nftables" => ("nft", &["list", "ruleset"]),
        "iptables" => ("iptables-save", &[]),
        _ => ("ipvsadm", &["-Ln"]),
    };
    node.exec_ok(tool, args).unwrap()
}

/// Waits until the dataplane of `mode` in `node` holds `text`.
fn programmed(node: &Netns, mode: &str, text: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if dataplane_listing(node, mode).contains(text) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until `done` holds for the flow's conntrack entries; returns them.
fn flow_entries_until(node: &Netns, within: Duration, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + within;
    loop {
        let entries = flow_entries(node);
        if done(&entries) || Instant::now() > deadline {
            return entries;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn sum_of(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(family))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn with_the_conntrack_table_full_kproxy_keeps_syncing_and_cleaning_and_every_service_answers_once_it_has_room() {
    if !kproxy_testbed::kernel::require_root()
        || !kproxy_testbed::kernel::require_guest("changes nf_conntrack_max, which is global to the kernel")
        || !kproxy_testbed::kernel::require(&[KernelFeature::Ipvs, KernelFeature::Dummy])
    {
        return;
    }
    // One mode after another: the limit is the whole kernel's.
    for mode in ["nftables", "iptables", "ipvs"] {
        full_table(mode);
    }
}

fn full_table(mode: &str) {
    let tb = Testbed::new().unwrap();
    let web = tb.add_pod("web", Where::Node2).unwrap();
    web.serve(&[(Proto::Tcp, 8080)]).unwrap();
    let dns_a = tb.add_pod("dns-a", Where::Node2).unwrap();
    let dns_b = tb.add_pod("dns-b", Where::Node2).unwrap();
    for dns in [&dns_a, &dns_b] {
        dns.serve(&[(Proto::Udp, 8053)]).unwrap();
    }
    let client = tb.add_pod("client", Where::Node).unwrap();
    let (web_ip, a_ip, b_ip) = (web.ipv4().to_string(), dns_a.ipv4().to_string(), dns_b.ipv4().to_string());
    let node = tb.node();

    // As on a real node (where the CNI and the firewall use conntrack long before kproxy starts),
    // the node tracks connections before kproxy connects to the API server, so that connection
    // has its entry. One made untracked and picked up later needs a new entry, which a full
    // table refuses: kproxy's watch would then hear nothing until the table has room.
    node.nft(
        "table inet conntrack-on {\n  chain c {\n    type filter hook output priority 0; ct state new accept\n  }\n}",
    )
    .unwrap();
    let api = support::api_in(node);
    support::apply_node_a(&api.server);
    api.server.apply(Kind::Service, service("web", "198.18.128.10", "TCP", 80, 8080));
    api.server.apply(Kind::EndpointSlice, slice("web", &web_ip, "TCP", 8080));
    api.server.apply(Kind::Service, service("dns", "198.18.128.11", "UDP", 53, 8053));
    api.server.apply(Kind::EndpointSlice, slice("dns", &a_ip, "UDP", 8053));
    let metrics = support::free_port();
    let args = support::node_a_args(metrics, &[&format!("--proxy-mode={mode}"), "--detect-local-mode=NodeCIDR"]);
    let (_kproxy, dir) = support::kproxy_in(node.name(), &api.server.url(), &format!("conntrack-full-{mode}"), &args);

    // The paths work: a new connection to web, and a UDP flow to dns-a, kept alive past the 2 s
    // after which the kernel marks a UDP flow with replies assured (never evicted to make room).
    let got = support::answered_by(client.netns(), WEB.parse().unwrap(), "web", support::START);
    assert_eq!(got.backend(), Some("web"), "{mode}: web answers before the table fills: {got:?}");
    let got = flow_answered_by(client.netns(), "dns-a", support::CHANGE);
    assert_eq!(got.backend(), Some("dns-a"), "{mode}: the flow reaches dns-a: {got:?}");
    std::thread::sleep(Duration::from_millis(2_500));
    assert_eq!(flow(client.netns()).backend(), Some("dns-a"), "{mode}: the flow goes on past 2 s");
    let entries = flow_entries(node);
    assert!(entries.contains("[ASSURED]") && entries.contains(&a_ip), "{mode}: the flow's entry: {entries}");

    // Fill the node's table: room for 20 more entries, then entries until the kernel refuses one.
    let count: usize = node.read_sysctl("net.netfilter.nf_conntrack_count").unwrap().trim().parse().unwrap();
    let _max = ConntrackMax::set(count + 20);
    let mut inserted = 0;
    while inserted < 200 && insert_filler(node, 10_000 + inserted) {
        inserted += 1;
    }
    assert!((1..200).contains(&inserted), "{mode}: the table filled after {inserted} entries (it held {count})");

    // Full: a new connection is dropped by the kernel; the established flow goes on. Entries of
    // the node's own earlier connections expire meanwhile (CLOSE after 10 s): the table is topped
    // up again before each attempt, so that each one meets a full table.
    let mut next_filler = 10_000 + inserted;
    for attempt in 0..3 {
        while next_filler < 10_400 && insert_filler(node, next_filler) {
            next_filler += 1;
        }
        let got = probe(client.netns(), Proto::Tcp, WEB.parse().unwrap(), Duration::from_secs(1)).unwrap();
        assert!(
            got.backend().is_none(),
            "{mode}, attempt {attempt}: with the table full a new connection fails: {got:?}"
        );
    }
    assert_eq!(flow(client.netns()).backend(), Some("dns-a"), "{mode}: the established flow goes on");

    // Changes while full: a new Service, and dns's endpoint replaced. Both reach the kernel; the
    // flow's entry, now stale, is deleted (by kproxy's cleanup; in IPVS mode by IPVS, below), and
    // the freed slot lets the flow reach dns-b.
    api.server.apply(Kind::Service, service("late", "198.18.128.12", "TCP", 80, 8080));
    api.server.apply(Kind::EndpointSlice, slice("late", &web_ip, "TCP", 8080));
    api.server.apply(Kind::EndpointSlice, slice("dns", &b_ip, "UDP", 8053));
    assert!(
        programmed(node, mode, "198.18.128.12", support::CHANGE),
        "{mode}: the Service added while full is programmed"
    );
    assert!(programmed(node, mode, &b_ip, support::CHANGE), "{mode}: dns's new endpoint is programmed");
    let entries = flow_entries_until(node, support::CHANGE, |entries| !entries.contains(&a_ip));
    assert!(!entries.contains(&a_ip), "{mode}: the flow's stale entry was deleted: {entries}");
    let got = flow_answered_by(client.netns(), "dns-b", support::CHANGE);
    assert_eq!(got.backend(), Some("dns-b"), "{mode}: the flow moves to dns-b in the slot its old entry left: {got:?}");

    // Room again (the fillers go, as entries expire on a real node): every Service answers.
    node.exec_ok("conntrack", &["-D", "-p", "tcp", "--orig-port-dst", "9"]).unwrap();
    let got = support::answered_by(client.netns(), WEB.parse().unwrap(), "web", support::CHANGE);
    assert_eq!(got.backend(), Some("web"), "{mode}: web answers once the table has room: {got:?}");
    let got = support::answered_by(client.netns(), LATE.parse().unwrap(), "web", support::CHANGE);
    assert_eq!(got.backend(), Some("web"), "{mode}: the Service added while full answers: {got:?}");

    let text =
        node.run_in(move || support::http_get(metrics, "/metrics").map(|(_, body)| body).unwrap_or_default()).unwrap();
    let failures = match mode {
        "nftables" => "kubeproxy_sync_proxy_rules_nftables_sync_failures_total{",
        _ => "kubeproxy_sync_proxy_rules_iptables_restore_failures_total{",
    };
    assert!(text.contains(failures), "{mode}: sync failures exported:\n{text}");
    assert_eq!(sum_of(&text, failures), 0.0, "{mode}: no sync failed while the table was full");
    let cleanup_failures = "kproxy_conntrack_cleanup_failures_total{";
    assert!(text.contains(cleanup_failures), "{mode}: cleanup failures exported:\n{text}");
    assert_eq!(sum_of(&text, cleanup_failures), 0.0, "{mode}: no cleanup pass failed");
    // In IPVS mode the kernel drops the entry itself: the real server went, and with
    // `expire_nodest_conn` IPVS expires its connections with their conntrack entries.
    if mode != "ipvs" {
        let deleted = sum_of(&text, "kubeproxy_conntrack_reconciler_deleted_entries_total{");
        assert!(deleted >= 1.0, "{mode}: the cleanup's deletion is counted: {deleted}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

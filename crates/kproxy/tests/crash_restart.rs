//! `kill -9` at random points — during the cold start, during an adoption after a restart, right
//! after changes (a partial sync in flight) — then start again: new connections to an unchanged
//! Service never fail while kproxy crashes and restarts over its own tables, and the kernel ends
//! holding exactly what a fresh start on the final state holds (listings compared). The real
//! binary, a fake API server with 2,000 Services, packets.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kproxy_state::Kind;
use kproxy_testbed::{Netns, ProbeResult, Proto, Testbed, Where, probe};
use serde_json::Value;

const SERVICES: usize = 2000;
const WEB: &str = "198.18.128.10:80";

/// A cheap pseudo-random sequence (the test must not depend on a seed being lucky: it prints it).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// The namespace's ruleset as a sorted list of objects: restarts may create chains and sets in
/// another order than a fresh start, which is no difference to the packet path.
fn ruleset(ns: &Netns) -> Vec<String> {
    let listing = kproxy_testbed::nft_listing(ns).unwrap();
    let mut objects: Vec<String> = listing["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o.get("metainfo").is_none())
        .map(Value::to_string)
        .collect();
    objects.sort();
    objects
}

/// Scrapes until the last sync is at least as recent as the last queued change.
fn wait_settled(node: &Netns, metrics: SocketAddr) {
    let deadline = Instant::now() + support::START;
    let last = "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}";
    let queued = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family=\"IPv4\"}";
    loop {
        let text =
            node.run_in(move || support::http_get(metrics, "/metrics").map(|(_, b)| b).unwrap_or_default()).unwrap();
        if let (Some(last), Some(queued)) = (support::value(&text, last), support::value(&text, queued))
            && last >= queued
        {
            return;
        }
        assert!(Instant::now() < deadline, "kproxy never settled:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

// Ignored while a defect is open: in Debian 12's kernel (6.1, `cargo xtask guest-test`) 1 to 8
// probes of most runs are refused (ECONNREFUSED within 4 ms, at the node) while a restarted
// kproxy starts or adopts its tables; on the host's 6.18 kernel every run passes. Restarts are
// not needed: `commit_refusals` reproduces it with any commit in the namespace. What was ruled
// out and what is left is in docs/reliability.md ("Open: refused connections during restarts on
// 6.1"). Run it with `cargo test -p kproxy --test crash_restart -- --ignored`.
#[test]
#[ignore = "open defect: refused connections during restarts on kernel 6.1 (docs/reliability.md)"]
fn kill_9_at_random_points_never_breaks_new_connections_and_ends_as_a_fresh_start() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let tb = Testbed::new().unwrap();
    let web = tb.add_pod("web-b", Where::Node2).unwrap();
    web.serve(&[(Proto::Tcp, 8080)]).unwrap();
    let client = tb.add_pod("client", Where::Node).unwrap();
    let api = support::api_in(tb.node());
    support::apply_bulk_cluster(&api.server, &web.ipv4().to_string(), SERVICES);
    let metrics = support::free_port();
    let args = support::node_a_args(metrics, &[]);
    let start = || support::kproxy_in(tb.node().name(), &api.server.url(), "crash-restart", &args);
    let service: SocketAddr = WEB.parse().unwrap();

    // A cold start killed at a random point, on an empty kernel: nothing to protect yet.
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("crash_restart seed {seed}");
    let mut rng = Rng(seed);
    let spawned = Instant::now();
    let (first, dir) = start();
    let got = support::answered_by(client.netns(), service, "web-b", support::START);
    assert!(matches!(&got, ProbeResult::Answered { .. }), "the first start serves the Service: {got:?}");
    let cold_start = spawned.elapsed();
    drop(first);
    let (killed, _) = start();
    std::thread::sleep(Duration::from_millis(rng.below(cold_start.as_millis() as u64)));
    drop(killed);

    // From here on, the Service answers every new connection, whatever is killed when.
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let (stop, from) = (stop.clone(), client.clone());
        client.netns().spawn_in("crash-prober", move || {
            let (mut attempts, mut failures) = (0, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let got = probe(from.netns(), Proto::Tcp, service, Duration::from_millis(500));
                attempts += 1;
                if !matches!(&got, Ok(ProbeResult::Answered { backend, .. }) if backend == "web-b") {
                    // When, so a failure can be matched with the daemons' logs.
                    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
                    failures.push(format!("{got:?} at {:.3}", at.as_secs_f64()));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (attempts, failures)
        })
    };
    let mut generation = 0;
    for round in 0..6 {
        let (daemon, _) = start();
        if round % 2 == 0 {
            // Killed during its start: adoption of the existing tables.
            std::thread::sleep(Duration::from_millis(rng.below(cold_start.as_millis() as u64)));
        } else {
            // Killed right after changes: a partial sync in flight.
            wait_settled(tb.node(), metrics);
            generation += 1;
            for i in (0..SERVICES).step_by(97) {
                api.server.apply(Kind::EndpointSlice, support::bulk_slice(i, generation));
            }
            api.server.delete(Kind::Service, "bulk", &format!("svc-{}", SERVICES - round));
            std::thread::sleep(Duration::from_millis(rng.below(1500)));
        }
        drop(daemon);
    }
    let (daemon, _) = start();
    wait_settled(tb.node(), metrics);
    stop.store(true, Ordering::Relaxed);
    let (attempts, failures) = prober.unwrap().join().unwrap();
    assert!(attempts > 20, "the prober ran: {attempts}");
    assert_eq!(failures, Vec::<String>::new(), "new connections failed during crashes (seed {seed})");
    let after_crashes = ruleset(tb.node());
    drop(daemon);

    // The same final state from a clean kernel.
    tb.node().nft("flush ruleset").unwrap();
    let (fresh, _) = start();
    wait_settled(tb.node(), metrics);
    let fresh_start = ruleset(tb.node());
    drop(fresh);
    assert!(fresh_start.iter().any(|o| o.contains("198.18.128.10")), "the fresh start holds the Service");
    let only_crashed: Vec<&String> = after_crashes.iter().filter(|o| !fresh_start.contains(o)).collect();
    let only_fresh: Vec<&String> = fresh_start.iter().filter(|o| !after_crashes.contains(o)).collect();
    assert!(
        only_crashed.is_empty() && only_fresh.is_empty(),
        "after crashes the kernel differs from a fresh start (seed {seed}):\nonly after crashes: {only_crashed:#?}\nonly fresh: {only_fresh:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

//! `kill -9` at random points — during the cold start, during an adoption after a restart, right
//! after changes (a partial sync in flight) — then start again: new connections to an unchanged
//! Service never fail while kproxy crashes and restarts over its own tables, and the kernel ends
//! holding exactly what a fresh start on the final state holds (listings compared). The real
//! binary, a fake API server with 2,000 Services, packets.
//!
//! The prober also connects, in turn, to a control address that a static rule of the test's own
//! DNATs to the same pod: its failures would say the sandbox itself is broken. (The refusals
//! once blamed on Debian 12's 6.1 kernel were the test's own: conntrack entries of SYNs sent to
//! the Service before any rule DNATed it, matched again by a reused source port; they are
//! flushed before probing starts. docs/reliability.md has the history.)

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kproxy_state::Kind;
use kproxy_testbed::{Netns, ProbeResult, Proto, probe};
use serde_json::Value;

const SERVICES: usize = 2000;
const WEB: &str = "198.18.128.10:80";
/// The control address, DNATed to the same pod by a static rule of the test's own.
const CONTROL: &str = "198.18.127.10:80";

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

#[test]
fn kill_9_at_random_points_never_breaks_new_connections_and_ends_as_a_fresh_start() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let support::BulkSandbox { tb, web, client, api, .. } = support::bulk_sandbox(SERVICES);
    let metrics = support::free_port();
    // Extra kproxy flags, to bisect a failure (e.g. `--feature-gates=KubeProxyAcceleration=false`).
    let extra = std::env::var("CRASH_RESTART_KPROXY_ARGS").unwrap_or_default();
    let args = support::node_a_args(metrics, &extra.split_whitespace().collect::<Vec<_>>());
    let start = || support::kproxy_in(tb.node().name(), &api.server.url(), "crash-restart", &args);
    let service: SocketAddr = WEB.parse().unwrap();

    // A cold start killed at a random point, on an empty kernel: nothing to protect yet.
    let seed = std::env::var("CRASH_RESTART_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
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

    // The probes that waited for the first start left conntrack entries of SYNs that reached the
    // Service's address before any rule DNATed it (SYN_SENT, kept 120 s). A probe from a source
    // port the kernel hands out again would match one of them and skip NAT altogether: refused at
    // the node, whatever kproxy holds. Nothing the prober measures may inherit them.
    kproxy_testbed::conntrack_flush(tb.node()).unwrap();

    // From here on, the Service answers every new connection, whatever is killed when.
    let control: SocketAddr = CONTROL.parse().unwrap();
    tb.node().nft(&control_table(control, web.ipv4())).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let timeline = Timeline::default();
    let prober = {
        let (stop, from, timeline) = (stop.clone(), client.clone(), timeline.clone());
        client.netns().spawn_in("crash-prober", move || {
            let mut tally = Tally { timeline, ..Tally::default() };
            while !stop.load(Ordering::Relaxed) {
                for (dest, results) in [(service, &mut tally.service), (control, &mut tally.control)] {
                    let at = tally.timeline.now();
                    let got = probe(from.netns(), Proto::Tcp, dest, Duration::from_millis(500));
                    results.push(Probe { at, took: tally.timeline.now() - at, got });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            tally
        })
    };
    let mut generation = 0;
    for round in 0..6 {
        let (daemon, _) = start();
        timeline.event(format!("round {round}: kproxy started"));
        if round % 2 == 0 {
            // Killed during its start: adoption of the existing tables.
            std::thread::sleep(Duration::from_millis(rng.below(cold_start.as_millis() as u64)));
        } else {
            // Killed right after changes: a partial sync in flight.
            wait_settled(tb.node(), metrics);
            timeline.event(format!("round {round}: settled; changes applied"));
            generation += 1;
            for i in (0..SERVICES).step_by(97) {
                api.server.apply(Kind::EndpointSlice, support::bulk_slice(i, generation));
            }
            api.server.delete(Kind::Service, "bulk", &format!("svc-{}", SERVICES - round));
            std::thread::sleep(Duration::from_millis(rng.below(1500)));
        }
        drop(daemon);
        timeline.event(format!("round {round}: kproxy killed"));
    }
    let (daemon, _) = start();
    timeline.event("last start".into());
    wait_settled(tb.node(), metrics);
    timeline.event("settled".into());
    stop.store(true, Ordering::Relaxed);
    let tally = prober.unwrap().join().unwrap();
    tally.assert_no_failure_of_kproxys(seed);
    tb.node().nft("delete table ip control").unwrap();
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

/// The control: `control` DNATed to `pod`:8080 ahead of kproxy's rules, and rejected in the
/// forward path if it ever goes un-DNATed (as kproxy's `cluster-ips-check` rejects an un-DNATed
/// ClusterIP), so that the kernel's failures look like kproxy's would.
fn control_table(control: SocketAddr, pod: std::net::Ipv4Addr) -> String {
    let (ip, port) = (control.ip(), control.port());
    format!(
        "table ip control {{\n\
         chain to-pod {{ type nat hook prerouting priority dstnat - 10; ip daddr {ip} tcp dport {port} dnat to {pod}:8080; }}\n\
         chain un-dnated {{ type filter hook forward priority filter - 10; ip daddr {ip} reject; }}\n\
         }}\n"
    )
}

/// When things happened, in milliseconds since the prober started: kproxy's starts and kills,
/// so that a failed probe can be told apart from what kproxy was doing at the time.
#[derive(Clone)]
struct Timeline {
    started: Instant,
    /// The same moment by the wall clock, to match kproxy's log lines.
    started_utc: std::time::SystemTime,
    events: Arc<Mutex<Vec<(u128, String)>>>,
}

impl Default for Timeline {
    fn default() -> Self {
        Self { started: Instant::now(), started_utc: std::time::SystemTime::now(), events: Arc::default() }
    }
}

impl Timeline {
    fn now(&self) -> u128 {
        self.started.elapsed().as_millis()
    }

    fn event(&self, what: String) {
        self.events.lock().unwrap().push((self.now(), what));
    }

    /// `at` as the UTC time of day, as kproxy's log lines give it.
    fn utc(&self, at: u128) -> String {
        let since_epoch = self.started_utc + Duration::from_millis(at as u64);
        let ms = since_epoch.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() % 86_400_000;
        format!("{:02}:{:02}:{:02}.{:03}Z", ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000)
    }

    /// The last two events before `at` and the first one after.
    fn around(&self, at: u128) -> Vec<String> {
        let events = self.events.lock().unwrap();
        let next = events.iter().position(|(t, _)| *t > at).unwrap_or(events.len());
        events[next.saturating_sub(2)..(next + 1).min(events.len())]
            .iter()
            .map(|(t, what)| format!("{t} ms: {what}"))
            .collect()
    }
}

/// One probe: when it started (ms on the [`Timeline`]), how long it took, what it got.
struct Probe {
    at: u128,
    took: u128,
    got: kproxy_testbed::Result<ProbeResult>,
}

impl Probe {
    fn failed(&self) -> bool {
        !matches!(&self.got, Ok(ProbeResult::Answered { backend, .. }) if backend == "web-b")
    }

    fn describe(&self, i: usize) -> String {
        format!("probe {i} at {} ms, {} ms: {:?}", self.at, self.took, self.got)
    }
}

/// What the prober saw, per destination.
#[derive(Default)]
struct Tally {
    service: Vec<Probe>,
    control: Vec<Probe>,
    timeline: Timeline,
}

impl Tally {
    fn failures(probes: &[Probe]) -> Vec<String> {
        probes.iter().enumerate().filter(|(_, p)| p.failed()).map(|(i, p)| p.describe(i)).collect()
    }

    /// Each failed probe of the Service with the control probes next to it and what kproxy was
    /// doing around then, for the failure message.
    fn context_of_failures(&self) -> String {
        let mut text = String::new();
        for (i, failed) in self.service.iter().enumerate().filter(|(_, p)| p.failed()) {
            text += &format!("{} ({})\n", failed.describe(i), self.timeline.utc(failed.at));
            for j in i.saturating_sub(1)..(i + 1).min(self.control.len()) {
                text += &format!("  control {}\n", self.control[j].describe(j));
            }
            for event in self.timeline.around(failed.at) {
                text += &format!("  {event}\n");
            }
        }
        text
    }

    /// No probe may fail, to either destination: the control shows the sandbox itself works
    /// while kproxy restarts.
    fn assert_no_failure_of_kproxys(&self, seed: u64) {
        let (service, control) = (Self::failures(&self.service), Self::failures(&self.control));
        eprintln!(
            "crash_restart: {} of {} probes of the Service failed, {} of {} of the control\n{}control failures: {control:#?}",
            service.len(),
            self.service.len(),
            control.len(),
            self.control.len(),
            self.context_of_failures()
        );
        assert!(self.service.len() > 20, "the prober ran: {}", self.service.len());
        assert_eq!(control, Vec::<String>::new(), "the control's static DNAT failed: the sandbox is broken");
        assert_eq!(service, Vec::<String>::new(), "new connections failed during crashes (seed {seed})");
    }
}

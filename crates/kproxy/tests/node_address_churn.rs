//! Pods coming and going on the node do not make kproxy resync. Each pod's veth brings an IPv6
//! link-local address into the node's namespace; with `nodePortAddresses` a CIDR, such an address
//! cannot change the plan, so it must cost nothing: no sync, no replan. An address that the CIDR
//! selects costs one small sync, not a full one, and serves NodePorts at once.
//!
//! The real binary in the testbed's node namespace, against a fake API server holding
//! `KPROXY_CHURN_SERVICES` Services (default 2,000); `KPROXY_CHURN_VETHS` veth pairs (default 5)
//! are added one every `KPROXY_CHURN_INTERVAL_MS` (default 500), in `KPROXY_CHURN_MODE` (default
//! nftables; iptables, or ipvs where the kernel has it). `KPROXY_CHURN_BIN` runs another
//! build of kproxy (to measure an older one: then what this test asserts is reported, `NOT MET: …`,
//! not asserted, so the older build's figures are printed whole). The figures are printed; as a
//! benchmark:
//!
//! ```sh
//! KPROXY_CHURN_SERVICES=50000 KPROXY_CHURN_VETHS=20 KPROXY_CHURN_INTERVAL_MS=1000 \
//!   cargo test --release -p kproxy --test node_address_churn -- --nocapture
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kproxy_testbed::ProbeResult;
use serde_json::json;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// User plus system CPU time of process `pid`, from `/proc/PID/stat`.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start at the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// Syncs so far: (all, full, seconds spent in all), scraped inside `ns` (kproxy's metrics
/// listen on its loopback).
fn syncs(ns: &kproxy_testbed::Netns, metrics: SocketAddr) -> (f64, f64, f64) {
    let text = ns.run_in(|| support::http_get(metrics, "/metrics")).unwrap().map(|(_, body)| body).unwrap_or_default();
    let v4 = "{ip_family=\"IPv4\"}";
    let get = |name: &str| {
        support::value(&text, &format!("{name}{v4}")).unwrap_or_else(|| panic!("no {name}{v4} in:\n{text}"))
    };
    (
        get("kubeproxy_sync_proxy_rules_duration_seconds_count"),
        get("kubeproxy_sync_full_proxy_rules_duration_seconds_count"),
        get("kubeproxy_sync_proxy_rules_duration_seconds_sum"),
    )
}

/// Asserts `holds`; with another build of kproxy (`KPROXY_CHURN_BIN`), reports it instead.
fn expect(holds: bool, what: std::fmt::Arguments<'_>) {
    if std::env::var_os("KPROXY_CHURN_BIN").is_some() {
        if !holds {
            println!("NOT MET: {what}");
        }
    } else {
        assert!(holds, "{what}");
    }
}

#[test]
fn pod_veths_cost_no_sync_and_a_selected_address_costs_one_partial_sync() {
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let services = env_or("KPROXY_CHURN_SERVICES", 2_000) as usize;
    let veths = env_or("KPROXY_CHURN_VETHS", 5);
    let interval = Duration::from_millis(env_or("KPROXY_CHURN_INTERVAL_MS", 500));
    let sandbox = support::bulk_sandbox(services);
    let tb = &sandbox.tb;
    // `demo/web` becomes a NodePort (30080).
    sandbox.api.server.apply(
        kproxy_state::Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": "web"},
               "spec": {"type": "NodePort", "clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
                        "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}]}}),
    );
    let metrics = support::free_port();
    let mode = format!("--proxy-mode={}", std::env::var("KPROXY_CHURN_MODE").unwrap_or_else(|_| "nftables".into()));
    let args = support::node_a_args(
        metrics,
        &[
            mode.as_str(),
            "--nodeport-addresses=198.18.0.0/24",
            "--healthz-bind-address=",
            "--iptables-min-sync-period=100ms",
        ],
    );
    let dir = std::env::temp_dir().join(format!("kproxy-churn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = support::write_kubeconfig(&dir, &sandbox.api.server.url());
    let binary = std::env::var("KPROXY_CHURN_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_kproxy").to_owned());
    // `ip netns exec` execs kproxy: the child's pid is kproxy's.
    let kproxy = support::KillOnDrop(
        std::process::Command::new("ip")
            .args(["netns", "exec", tb.node().name(), &binary])
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let pid = kproxy.0.id();

    let primary: SocketAddr = "198.18.0.2:30080".parse().unwrap();
    let got = support::answered_by(tb.external(), primary, "web-b", Duration::from_secs(300));
    assert!(matches!(&got, ProbeResult::Answered { .. }), "the node IP serves the NodePort: {got:?}");
    // Settled: what start still had queued is synced.
    std::thread::sleep(Duration::from_secs(2));

    let idle_window = Duration::from_secs(3);
    let cpu_idle_start = cpu_time(pid);
    std::thread::sleep(idle_window);
    let idle_cpu = cpu_time(pid) - cpu_idle_start;

    // Pods come: a veth pair each, up, so the kernel gives both ends an IPv6 link-local address.
    let (before, cpu_before, started) = (syncs(tb.node(), metrics), cpu_time(pid), Instant::now());
    for i in 0..veths {
        let (a, b) = (format!("kpchurn{i}a"), format!("kpchurn{i}b"));
        tb.node().ip(["link", "add", a.as_str(), "type", "veth", "peer", "name", b.as_str()]).unwrap();
        tb.node().ip(["link", "set", a.as_str(), "up"]).unwrap();
        tb.node().ip(["link", "set", b.as_str(), "up"]).unwrap();
        std::thread::sleep(interval);
    }
    // The watcher re-reads at most every 200 ms; give it and a sync time to happen.
    std::thread::sleep(Duration::from_secs(2));
    let (after, cpu_after, window) = (syncs(tb.node(), metrics), cpu_time(pid), started.elapsed());
    let link_local = tb.node().ip(["-6", "addr", "show", "scope", "link"]).unwrap();
    assert!(link_local.contains("kpchurn0a"), "the veths got link-local addresses:\n{link_local}");
    let churn_cpu = cpu_after - cpu_before;
    println!(
        "{services} Services, {veths} veth pairs in {:.1} s: kproxy CPU {} ms (idle {} ms per {} s); syncs {} (full {}), {:.1} ms in syncs",
        window.as_secs_f64(),
        churn_cpu.as_millis(),
        idle_cpu.as_millis(),
        idle_window.as_secs(),
        after.0 - before.0,
        after.1 - before.1,
        (after.2 - before.2) * 1000.0
    );
    expect(
        after.0 == before.0,
        format_args!(
            "link-local addresses of pod veths caused {} syncs ({} full)",
            after.0 - before.0,
            after.1 - before.1
        ),
    );

    // An address the CIDR selects: served at once, by a partial sync.
    let (before, cpu_before, started) = (syncs(tb.node(), metrics), cpu_time(pid), Instant::now());
    tb.node().ip(["addr", "add", "198.18.0.4/24", "dev", "eth0"]).unwrap();
    let added: SocketAddr = "198.18.0.4:30080".parse().unwrap();
    let got = support::answered_by(tb.external(), added, "web-b", support::CHANGE);
    let served_in = started.elapsed();
    assert!(matches!(&got, ProbeResult::Answered { .. }), "the address added inside the CIDR serves: {got:?}");
    // The sync is counted once everything after the commit is done (conntrack, health checks).
    let counted = Instant::now();
    let mut after = syncs(tb.node(), metrics);
    while after.0 == before.0 && counted.elapsed() < support::CHANGE {
        std::thread::sleep(Duration::from_millis(100));
        after = syncs(tb.node(), metrics);
    }
    std::thread::sleep(Duration::from_secs(1));
    let (after, cpu_after) = (syncs(tb.node(), metrics), cpu_time(pid));
    println!(
        "one address inside nodePortAddresses: served within {} ms; kproxy CPU {} ms; syncs {} (full {}), {:.1} ms in syncs",
        served_in.as_millis(),
        (cpu_after - cpu_before).as_millis(),
        after.0 - before.0,
        after.1 - before.1,
        (after.2 - before.2) * 1000.0
    );
    expect(after.1 == before.1, format_args!("a selected address was programmed by {} full syncs", after.1 - before.1));
    assert!(after.0 > before.0, "the selected address was programmed by a sync");
    drop(kproxy);
    let _ = std::fs::remove_dir_all(&dir);
}

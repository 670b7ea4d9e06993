#![allow(clippy::expect_used, clippy::unwrap_used)] // a panic is a test failure
//! The daemon benchmark at a small scale (200 Services, a 3 s idle window, 12 changes at one per
//! second and a burst of 28): a kernel
//! test (root, in namespaces the benchmark creates) that the benchmark measures every figure
//! and that the figures are sane. It builds the current `kproxy` binary first, in this test's
//! profile, so it never measures a stale one.

mod support;

use kproxy_testbed::kernel::require_root;
use serde_json::Value;
use support::run_bench;

fn f(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {v}"))
}

#[test]
fn a_small_daemon_run_sees_every_change_and_measures_every_figure() {
    if !require_root() {
        return;
    }
    let args = ["--services", "200", "--idle", "3", "--changes", "12", "--change-interval-ms", "1000"];
    let more = ["--total-changes", "40", "--burst-per-second", "50", "--rate-phase", "1", "--start-timeout", "60"];
    let run = run_bench("daemon", &[&args[..], &more[..]].concat());
    let stdout = &run.stdout;
    // Targets are judged at 100k Services only, so a small run exits 0 whatever it measured.
    assert_eq!(run.code, Some(0), "{stdout}\n{}", run.stderr);
    let results = run.json.as_array().unwrap();
    let [r] = results.as_slice() else { panic!("one size expected: {results:?}") };

    assert_eq!(f(r, "services"), 200.0);
    // Service 0 has the one real pod; 199 have 5 endpoints; the dual-stack ones 5 more.
    let dual = f(r, "dual_stack");
    assert_eq!(dual, 20.0, "services 3, 13, …, 193");
    assert_eq!(f(r, "endpoints"), 1.0 + 199.0 * 5.0 + dual * 5.0);
    assert!(f(r, "object_bytes") > 200.0 * 2000.0, "realistic objects are kilobytes each: {r}");

    let start = f(r, "start_s");
    assert!(start > 0.0 && start < 60.0, "start {start}");
    // Every change reached the kernel, each with a positive latency below the give-up time.
    assert_eq!(f(r, "changes_timed"), 12.0);
    let timed = r["change_ms"].as_array().unwrap();
    assert_eq!(timed.len(), 12, "every timed change observed: {r}");
    assert!(timed.iter().all(|v| v.as_f64().is_some_and(|ms| ms > 0.0 && ms < 30_000.0)), "{r}");
    // The burst: every changed Service's final endpoints reached the kernel.
    assert_eq!(f(r, "burst_changes"), 28.0);
    let settled = f(r, "burst_settled_ms");
    assert!(settled > 0.0 && settled < 30_000.0, "{r}");
    assert_eq!(f(r, "changes_total"), 40.0);
    assert_eq!(f(r, "changes_observed"), 40.0, "{r}");

    assert!(f(r, "idle_s") >= 3.0);
    let cpu = f(r, "idle_cpu_pct");
    assert!((0.0..=200.0).contains(&cpu), "idle CPU {cpu}");
    let (steady, peak, after) = (f(r, "rss_steady_mib"), f(r, "rss_peak_mib"), f(r, "rss_after_changes_mib"));
    assert!(steady > 1.0 && after > 1.0 && peak >= steady.max(after), "RSS {steady} {peak} {after}");

    // Traffic flowed both ways, without failures.
    let rates = &r["rates"];
    assert!(f(rates, "direct") > 10.0 && f(rates, "cluster_ip") > 10.0, "{rates}");
    assert_eq!(f(rates, "failed"), 0.0, "{rates}");
    // The prober reached the pod through the ClusterIP before the kill: the path works; what
    // failed afterwards is the measured gap.
    assert!(f(r, "restart_attempts") > 100.0, "{r}");
    assert_eq!(f(r, "restart_failed_before_kill"), 0.0, "{r}");
    assert!(f(r, "restart_synced_after_s") > 0.0);

    assert!(stdout.lines().any(|l| l.starts_with("| 200 |")), "{stdout}");
    assert!(stdout.contains("Targets of #14 (nftables mode) at 200 Services"), "{stdout}");
}

/// The endpoint-heavy shape at a small scale (100 Services of 20 endpoints and one of 500): the
/// big Service's single changes each cost the kernel two element operations (its ClusterIP's
/// slot: the old endpoint out, the new one in), and its rolling replacement, 25 at a time, is
/// seen step by step, each step 50.
#[test]
fn a_small_endpoint_heavy_run_measures_the_big_services_changes_and_rollout() {
    if !require_root() {
        return;
    }
    let args = ["--services", "100", "--endpoints", "20", "--big-service", "500", "--big-changes", "5"];
    let more = ["--idle", "1", "--changes", "3", "--change-interval-ms", "200", "--total-changes", "5"];
    let rest = ["--rate-phase", "1", "--start-timeout", "60", "--rollout-step", "25"];
    let run = run_bench("daemon", &[&args[..], &more[..], &rest[..]].concat());
    let stdout = &run.stdout;
    // #38's targets are judged at its shape only: a small run exits 0 whatever it measured.
    assert_eq!(run.code, Some(0), "{stdout}\n{}", run.stderr);
    let results = run.json.as_array().unwrap();
    let [r] = results.as_slice() else { panic!("one size expected: {results:?}") };
    let dual = f(r, "dual_stack");
    assert_eq!(f(r, "endpoints"), 1.0 + 99.0 * 20.0 + dual * 20.0 + 500.0, "{r}");
    assert_eq!(r["changes_observed"], r["changes_total"], "{r}");

    let big = &r["big"];
    assert_eq!(f(big, "endpoints"), 500.0);
    let changes = big["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 5);
    for c in changes {
        assert!(c["ms"].as_f64().is_some_and(|ms| ms > 0.0), "every change seen: {c}");
        assert_eq!(f(&c["cost"], "elements"), 2.0, "{c}");
        assert_eq!(f(&c["cost"], "objects"), 0.0, "{c}");
    }
    let rollout = &big["rollout"];
    assert_eq!(rollout["finished"], true, "{rollout}");
    let done = rollout["done"].as_array().unwrap();
    assert_eq!(done.len(), 20);
    for step in done {
        assert!(step["ms"].as_f64().is_some_and(|ms| ms > 0.0), "{step}");
        assert_eq!(f(&step["cost"], "elements"), 50.0, "25 slots rewritten: {step}");
    }
    assert!(f(rollout, "total_s") > 0.0 && f(rollout, "cpu_s") > 0.0, "{rollout}");
    assert!(stdout.contains("The big Service (500 endpoints"), "{stdout}");
    assert!(stdout.contains("| kproxy, nftables (100 Services) |"), "{stdout}");
    assert!(stdout.contains("reported, not judged here"), "{stdout}");
}

#![allow(clippy::expect_used, clippy::unwrap_used)] // a panic is a test failure
//! The faults benchmark at a small scale (200 Services, 3 s outages, a 3 s sync period): a kernel
//! test (root, in namespaces the benchmark creates) that every fault is injected and survived —
//! for the API server's faults and a concurrent committer, the unchanged Service answered and
//! stayed in the kernel throughout and every change made during the fault reached the kernel
//! afterwards; a table deleted by another tool was repaired (kproxy follows nf_tables'
//! notifications); kproxy kept running.

mod support;

use kproxy_testbed::kernel::require_root;
use support::run_bench;

#[test]
fn every_fault_is_survived_and_converges_or_is_repaired() {
    if !require_root() {
        return;
    }
    let args = ["--services", "200", "--down-seconds", "3", "--slow-list-seconds", "3", "--forbidden-seconds", "3"];
    let run = run_bench("faults", &[&args[..], &["--sync-period", "3"]].concat());
    let stdout = &run.stdout;
    // Exit 2 means a fault missed the 2 s convergence target: a debug build on a loaded
    // machine may; that is judged on the release run in docs/reliability.md, not here.
    assert!(matches!(run.code, Some(0 | 2)), "{stdout}\n{}", run.stderr);
    let results = run.json.as_array().unwrap();
    assert_eq!(results.len(), 9, "{results:?}");
    for r in results {
        let fault = r["fault"].as_str().unwrap();
        assert!(r["attempts"].as_u64().unwrap() > 0 && r["lookups"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["alive"], true, "kproxy exited during {fault}: {r}");
        let converged = r["converged_ms"].as_f64();
        if r["damage"] == true {
            // The table deleted by another tool: the Service is gone until kproxy, told of the
            // commit by nf_tables' notifications, rebuilds it (often faster than the sampler's
            // 100 ms, so how much it saw missing is reported, not asserted).
            assert!(converged.is_some_and(|ms| ms < 10_000.0), "{fault} was not repaired: {r}");
            continue;
        }
        assert_eq!(r["failed"], 0, "connections to an unchanged Service failed during {fault}: {r}");
        assert_eq!(r["missing"], 0, "an unchanged Service left the kernel during {fault}: {r}");
        assert_eq!(r["changes"], 20, "{r}");
        assert!(converged.is_some_and(|ms| ms < 30_000.0), "the changes made during {fault} never arrived: {r}");
    }
    assert!(stdout.contains("| API server down 3 s, changes meanwhile | 0 of "), "{stdout}");
}

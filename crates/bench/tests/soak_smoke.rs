#![allow(clippy::expect_used, clippy::unwrap_used)] // a panic is a test failure
//! The soak benchmark at a small scale (200 Services, 300 changes, a checkpoint every 100): a
//! kernel test (root, in namespaces the benchmark creates) that every checkpoint is verified in
//! the kernel and by packets and that every figure it judges flatness by is measured.

mod support;

use kproxy_testbed::kernel::require_root;
use support::run_bench;

#[test]
fn a_small_soak_verifies_every_checkpoint_and_measures_every_figure() {
    if !require_root() {
        return;
    }
    let run =
        run_bench("soak", &["--services", "200", "--changes", "300", "--checkpoint-every", "100", "--rate", "100"]);
    let stdout = &run.stdout;
    // Exit 2 would mean growth: judged on the long run in docs/reliability.md, where warm-up is
    // a small part of the run; three checkpoints are too few to judge it.
    assert!(matches!(run.code, Some(0 | 2)), "{stdout}\n{}", run.stderr);
    let checkpoints = run.json.as_array().unwrap();
    assert_eq!(checkpoints.len(), 3, "{checkpoints:?}");
    for (k, c) in checkpoints.iter().enumerate() {
        assert_eq!(c["changes"], 100 * (k + 1), "{c}");
        assert!(c["converged_ms"].as_f64().is_some(), "checkpoint {k} never converged: {c}");
        assert_eq!(c["packets_ok"], true, "the moved Service's new pod did not answer: {c}");
        assert!(c["rss_mib"].as_f64().unwrap() > 1.0 && c["fds"].as_u64().unwrap() > 3, "{c}");
        assert!(c["threads"].as_u64().unwrap() >= 1, "{c}");
        // 200 Services × 5 endpoints (one has the real pod), give or take the created and
        // deleted ones.
        let elements = c["elements"].as_u64().unwrap();
        assert!((950..=1050).contains(&elements), "{c}");
    }
    assert!(stdout.contains("Checkpoints verified in the kernel and by packets: 3 of 3."), "{stdout}");
}

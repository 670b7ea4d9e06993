//! The CI rules for kernel tests that cannot run here, checked by running a test that skips as a
//! child process of this test binary: on the host a skip is printed past libtest's capture and,
//! under `CI=true` or with `KPROXY_RECORD_SKIPS=1` (`./scripts/test`), recorded in the skip
//! ledger; in the guest a skip fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use kproxy_testbed::kernel;

const CHILD: &str = "child_skips_with_a_reason";
const REASON: &str = "needs a feature no kernel has";

/// Runs only as the child of the tests below (it skips, which is what they observe).
#[test]
#[ignore = "run as a child process by the skip-rule tests"]
fn child_skips_with_a_reason() {
    kernel::skip(REASON);
}

/// How the child is asked to record its skip: `CI=true`, `KPROXY_RECORD_SKIPS=1`, or neither.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Recording {
    Ci,
    Asked,
    Off,
}

fn run_child(recording: Recording, guest: bool, ledger: &Path) -> Output {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args(["--exact", CHILD, "--ignored", "--test-threads=2"]);
    command.env("KPROXY_SKIP_LEDGER", ledger).env("KPROXY_GUEST", if guest { "1" } else { "0" });
    command.env_remove("CI").env_remove(kernel::RECORD_SKIPS_VAR);
    match recording {
        Recording::Ci => command.env("CI", "true"),
        Recording::Asked => command.env(kernel::RECORD_SKIPS_VAR, "1"),
        Recording::Off => &mut command,
    };
    command.output().unwrap()
}

fn ledger_path(tag: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("kproxy-skip-ledger-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// A host skip that is to be recorded: printed, and written to the ledger.
fn assert_printed_and_recorded(recording: Recording, tag: &str) {
    let ledger = ledger_path(tag);
    let output = run_child(recording, false, &ledger);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "a host skip passes: {stderr}");
    let expected = format!("SKIPPED {CHILD}: {REASON}");
    assert!(stderr.contains(&expected), "the skip is visible although the test passed: {stderr}");
    let recorded = std::fs::read_to_string(&ledger).unwrap_or_default();
    let _ = std::fs::remove_file(&ledger);
    assert_eq!(recorded.trim(), expected, "the ledger names the test and why");
}

#[test]
fn host_skip_under_ci_is_printed_and_recorded_in_the_ledger() {
    assert_printed_and_recorded(Recording::Ci, "ci");
}

#[test]
fn host_skip_outside_ci_with_kproxy_record_skips_is_printed_and_recorded_in_the_ledger() {
    assert_printed_and_recorded(Recording::Asked, "asked");
}

#[test]
fn host_skip_outside_ci_is_printed_but_not_recorded() {
    let ledger = ledger_path("dev");
    let output = run_child(Recording::Off, false, &ledger);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("SKIPPED {CHILD}: {REASON}")), "{stderr}");
    assert!(!ledger.exists(), "outside CI nothing is recorded");
}

#[test]
fn any_skip_in_the_guest_fails_the_test() {
    let ledger = ledger_path("guest");
    let output = run_child(Recording::Ci, true, &ledger);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let _ = std::fs::remove_file(&ledger);
    assert!(!output.status.success(), "a skip in the guest must fail: {stdout}");
    assert!(stdout.contains("nothing may be skipped in the guest kernel"), "{stdout}");
}

#![allow(clippy::expect_used)]
//! CI's smoke run of the benchmark: one small size, quick mode, must produce a full row.

use std::process::Command;

use kproxy_testbed::kernel::require_root;

#[test]
fn a_quick_run_at_1000_services_reports_every_column() {
    if !require_root() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kproxy-bench"))
        .args(["--sizes", "1000", "--quick"])
        .output()
        .expect("running kproxy-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let row = stdout.lines().find(|l| l.starts_with("| 1000 |")).unwrap_or_else(|| panic!("no row in:\n{stdout}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).filter(|c| !c.is_empty()).collect();
    assert_eq!(cells.len(), 13, "{row}");
    assert_eq!(cells[1], "5000", "{row}");
    // Every operation of the cold start went through; one change costs a handful of operations.
    let ops: usize = cells[3].split(" / ").next().unwrap_or("").parse().expect("ops");
    assert!(ops > 10_000, "{row}");
    assert!(cells[10].ends_with(" ms"), "{row}");
    let change_ops: usize = cells[11].parse().expect("change ops");
    assert!((2..=20).contains(&change_ops), "{row}");
    assert!(cells[12].ends_with("MiB"), "{row}");
}

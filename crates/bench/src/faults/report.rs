//! The faults table, in Markdown, as docs/reliability.md shows it.

use std::fmt::Write as _;

use super::FaultResult;

/// Renders the results; true when kproxy survived every fault, every fault of the API server was
/// served throughout and converged within 2 s of its end, and damage by another program was
/// repaired within `repair_within`.
pub fn render(
    command: &str,
    n: usize,
    start_s: f64,
    repair_within: std::time::Duration,
    results: &[FaultResult],
) -> (String, bool) {
    let mut out = String::new();
    let _ = writeln!(out, "\n`{command}`\n");
    let _ = writeln!(out, "{n} Services × 5 endpoints; first sync in the kernel {start_s:.2} s after the start.\n");
    let _ = writeln!(
        out,
        "| fault | connections failed | unchanged Services missing from the kernel | changes during the fault | converged after the fault | RSS before → peak |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    let mut all_good = true;
    for r in results {
        let converged = r.converged_ms.map_or("not within 180 s".to_owned(), |ms| format!("{ms:.0} ms"));
        let good = if r.damage {
            // Repaired once kproxy noticed it, at the latest by the next periodic check.
            r.alive && r.converged_ms.is_some_and(|ms| ms <= repair_within.as_secs_f64() * 1000.0)
        } else {
            r.failed == 0 && r.missing == 0 && r.alive && r.converged_ms.is_some_and(|ms| ms <= 2000.0)
        };
        all_good &= good;
        let _ = writeln!(
            out,
            "| {}{} | {} of {}{} | {} of {} lookups | {} | {} | {:.0} → {:.0} MiB |",
            r.fault,
            if r.alive { "" } else { " (kproxy exited)" },
            r.failed,
            r.attempts,
            failure_kinds(&r.failures),
            r.missing,
            r.lookups,
            r.changes,
            converged,
            r.rss_before_mib,
            r.rss_peak_mib,
        );
    }
    (out, all_good)
}

/// ` (2 connect: connection refused, 1 read: timed out)`, or nothing when nothing failed.
fn failure_kinds(failures: &std::collections::BTreeMap<String, usize>) -> String {
    if failures.is_empty() {
        return String::new();
    }
    let kinds: Vec<String> = failures.iter().map(|(kind, n)| format!("{n} {kind}")).collect();
    format!(" ({})", kinds.join(", "))
}

//! The daemon table, and the targets of issue #14 checked against the largest size measured.

use std::fmt::Write as _;
use std::path::Path;

use super::run::SizeResult;
use super::{DaemonArgs, Mode};

/// The size the targets are set at.
const TARGET_SIZE: usize = 100_000;

/// The `p` quantile (0–1) of sorted samples; NaN when there are none.
pub(crate) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Milliseconds as a reader wants them: 2 decimals below 10 ms, seconds from 1 s.
pub(crate) fn ms(v: f64) -> String {
    if v.is_nan() {
        "–".into()
    } else if v < 10.0 {
        format!("{v:.2} ms")
    } else if v < 1000.0 {
        format!("{v:.0} ms")
    } else {
        format!("{:.2} s", v / 1000.0)
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "?".into(), |v| format!("{v:.0}"))
}

/// RSS growth over the changes that counts as none: allocator noise, 2 MiB or 2 %.
fn growth_allowed(steady: f64) -> f64 {
    (steady * 0.02).max(2.0)
}

/// Issue #20's targets for iptables mode: (size, target, measured, met).
fn iptables_targets(r: &SizeResult) -> Vec<(String, String, bool)> {
    let p50 = pct(&r.change_ms, 0.5);
    match r.services {
        10_000 => vec![
            ("start → programmed ≤ 10 s".into(), format!("{:.2} s", r.start_s), r.start_s <= 10.0),
            (
                "one endpoint change ≤ 100 ms (p50, all seen)".into(),
                format!("{} (p99 {})", ms(p50), ms(pct(&r.change_ms, 0.99))),
                p50 <= 100.0 && r.change_ms.len() == r.changes_timed,
            ),
            (
                "idle CPU ≤ 1 %, iptables children counted".into(),
                format!("{:.2} %", r.idle_cpu_pct),
                r.idle_cpu_pct <= 1.0,
            ),
        ],
        50_000 => vec![("start → programmed ≤ 90 s".into(), format!("{:.2} s", r.start_s), r.start_s <= 90.0)],
        _ => Vec::new(),
    }
}

/// (target, measured, met) for one size.
fn targets(r: &SizeResult) -> Vec<(String, String, bool)> {
    let p50 = pct(&r.change_ms, 0.5);
    let p99 = pct(&r.change_ms, 0.99);
    let growth = r.rss_after_changes_mib - r.rss_steady_mib;
    let ratio = r.rates.cluster_ip / r.rates.direct;
    vec![
        ("start → programmed ≤ 15 s".into(), format!("{:.2} s", r.start_s), r.start_s <= 15.0),
        (
            "programming latency p50 ≤ 10 ms / p99 ≤ 50 ms".into(),
            format!("{} / {}", ms(p50), ms(p99)),
            p50 <= 10.0 && p99 <= 50.0 && r.change_ms.len() == r.changes_timed,
        ),
        ("idle CPU ≤ 1 % of a core".into(), format!("{:.2} %", r.idle_cpu_pct), r.idle_cpu_pct <= 1.0),
        (
            "RSS steady ≤ 300 MiB / peak ≤ 500 MiB".into(),
            format!("{:.0} / {:.0} MiB", r.rss_steady_mib, r.rss_peak_mib),
            r.rss_steady_mib <= 300.0 && r.rss_peak_mib <= 500.0,
        ),
        (
            format!("no RSS growth over {} changes (≤ 2 MiB or 2 %)", r.changes_total),
            format!("{growth:+.1} MiB"),
            growth <= growth_allowed(r.rss_steady_mib),
        ),
        ("restart gap: 0 failed connections".into(), format!("{} failed", r.restart_failed), r.restart_failed == 0),
        ("connections via ClusterIP ≥ 95 % of straight".into(), format!("{:.0} %", ratio * 100.0), ratio >= 0.95),
    ]
}

/// Renders the report; the flag is false when the target size was measured and missed a target.
pub fn render(command: &str, args: &DaemonArgs, binary: &Path, results: &[SizeResult]) -> (String, bool) {
    let mut s = String::new();
    // Writing to a String cannot fail.
    let _ = write_report(&mut s, command, args, binary, results);
    let nft = results.iter().filter(|r| r.mode == Mode::Nftables && r.services == TARGET_SIZE);
    let ipt = results.iter().filter(|r| r.mode == Mode::Iptables);
    let big_met = results
        .iter()
        .filter(|r| r.mode == Mode::Nftables && super::big::is_target_shape(r.services, r.layout))
        .filter_map(|r| r.big.as_ref())
        .all(|b| super::big::targets(None, b, None).iter().all(|(_, _, ok)| *ok));
    let met = nft.clone().all(|r| targets(r).iter().all(|(_, _, ok)| *ok))
        && ipt.clone().all(|r| iptables_targets(r).iter().all(|(_, _, ok)| *ok))
        && big_met;
    (s, met)
}

fn write_report(
    s: &mut String,
    command: &str,
    args: &DaemonArgs,
    binary: &Path,
    results: &[SizeResult],
) -> Result<(), std::fmt::Error> {
    writeln!(s, "$ {command}")?;
    writeln!(s)?;
    writeln!(
        s,
        "kproxy: {}; default flags but --proxy-mode. Each Service: one TCP port, an EndpointSlice of {} \
         endpoints; 10% NodePort, 2% LoadBalancer (half eTP Local), 1% ClientIP affinity, 10% dual-stack{}. \
         Idle window {} s; {} changes timed at one per {} ms, {} in all.",
        binary.display(),
        args.endpoints,
        if args.big_service > 0 {
            format!("; and one Service of {} endpoints (`bench/big`)", args.big_service)
        } else {
            String::new()
        },
        args.idle,
        args.changes,
        args.change_interval_ms,
        args.total_changes.max(args.changes)
    )?;
    writeln!(s)?;
    writeln!(
        s,
        "| services | mode | endpoints | objects (JSON) | start → first sync in kernel | change p50 | change p99 | changes seen (full syncs meanwhile) | burst: changes at rate → all in kernel after | idle CPU (full syncs) | RSS steady | RSS peak | RSS after changes |"
    )?;
    writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for r in results {
        writeln!(
            s,
            "| {} | {} | {} | {:.0} MiB | {:.2} s{} | {} | {} | {} / {} ({}) | {} at {:.0}/s → {} | {:.2} % ({}) | {:.0} MiB | {:.0} MiB | {:.0} MiB ({} changes, {}/{} seen) |",
            r.services,
            r.mode.as_str(),
            r.endpoints,
            r.object_bytes as f64 / (1 << 20) as f64,
            r.start_s,
            if r.start_by_listing { "*" } else { "" },
            ms(pct(&r.change_ms, 0.5)),
            ms(pct(&r.change_ms, 0.99)),
            r.change_ms.len(),
            r.changes_timed,
            opt(r.changes_full_syncs),
            r.burst_changes,
            r.burst_rate,
            r.burst_settled_ms.map_or_else(|| "not seen".into(), ms),
            r.idle_cpu_pct,
            opt(r.idle_full_syncs),
            r.rss_steady_mib,
            r.rss_peak_mib,
            r.rss_after_changes_mib,
            r.changes_total,
            r.changes_observed,
            r.changes_total,
        )?;
    }
    if results.iter().any(|r| r.start_by_listing) {
        writeln!(s)?;
        writeln!(s, "\\* timed by full listings of the endpoints maps (resolution: one listing).")?;
    }
    writeln!(s)?;
    writeln!(
        s,
        "| services | mode | new TCP connections/s straight to the pod | via the ClusterIP | ratio | failed | restart: failed / attempts | longest outage | restarted kproxy's first full sync after |"
    )?;
    writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---:|")?;
    for r in results {
        writeln!(
            s,
            "| {} | {} | {:.0} | {:.0} | {:.0} % | {} | {} / {} (before the kill: {}) | {} | {:.2} s |",
            r.services,
            r.mode.as_str(),
            r.rates.direct,
            r.rates.cluster_ip,
            r.rates.cluster_ip / r.rates.direct * 100.0,
            r.rates.failed,
            r.restart_failed,
            r.restart_attempts,
            r.restart_failed_before_kill,
            ms(r.restart_outage_ms),
            r.restart_synced_after_s,
        )?;
    }
    for r in results.iter().filter(|r| r.mode == Mode::Iptables) {
        let t = iptables_targets(r);
        if t.is_empty() {
            continue;
        }
        writeln!(s)?;
        writeln!(s, "Targets of #20 (iptables mode) at {} Services:", r.services)?;
        writeln!(s)?;
        writeln!(s, "| target | measured | met |")?;
        writeln!(s, "|---|---:|:---:|")?;
        for (name, measured, ok) in t {
            writeln!(s, "| {name} | {measured} | {} |", if ok { "yes" } else { "NO" })?;
        }
    }
    for r in results.iter().filter(|r| r.big.is_some()) {
        let rows: Vec<(String, &super::big::BigResult)> =
            r.big.iter().map(|b| (format!("kproxy, {} ({} Services)", r.mode.as_str(), r.services), b)).collect();
        super::big::write_table(s, &rows)?;
        if let (Mode::Nftables, Some(b)) = (r.mode, &r.big) {
            writeln!(s)?;
            writeln!(s, "{}", super::big::targets_title(r.services, r.layout, "kproxy, nftables"))?;
            writeln!(s)?;
            writeln!(s, "| target | measured | met |")?;
            writeln!(s, "|---|---:|:---:|")?;
            for (name, measured, ok) in super::big::targets(None, b, None) {
                writeln!(s, "| {name} | {measured} | {} |", if ok { "yes" } else { "NO" })?;
            }
        }
    }
    if let Some(r) = results.iter().filter(|r| r.mode == Mode::Nftables).max_by_key(|r| r.services) {
        writeln!(s)?;
        let note = if r.services == TARGET_SIZE {
            String::new()
        } else {
            format!(" (the targets are set at {TARGET_SIZE} Services; this is the largest size measured)")
        };
        writeln!(s, "Targets of #14 (nftables mode) at {} Services{note}:", r.services)?;
        writeln!(s)?;
        writeln!(s, "| target | measured | met |")?;
        writeln!(s, "|---|---:|:---:|")?;
        for (name, measured, ok) in targets(r) {
            writeln!(s, "| {name} | {measured} | {} |", if ok { "yes" } else { "NO" })?;
        }
    }
    Ok(())
}

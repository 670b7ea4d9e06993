//! The result table, the ratios, and the targets checked against them.

use std::fmt::Write as _;

use crate::Args;
use crate::measure::{SizeResult, UpstreamLoad};

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn secs(s: f64) -> String {
    if s < 1.0 { format!("{:.0} ms", s * 1000.0) } else { format!("{s:.2} s") }
}

fn upstream(u: &UpstreamLoad) -> String {
    match u {
        UpstreamLoad::Skipped => "skipped".into(),
        UpstreamLoad::TimedOut(t) => format!("> {t} s"),
        UpstreamLoad::Loaded(s) => secs(*s),
        UpstreamLoad::Failed(e) => format!("failed: {e}"),
    }
}

/// Renders the report; the flag is true when every checkable target is met.
pub fn render(command: &str, args: &Args, results: &[SizeResult]) -> (String, bool) {
    let mut s = String::new();
    // Writing to a String cannot fail.
    let _ = write_report(&mut s, command, args, results);
    let met = targets(results).iter().all(|(_, ok, _)| *ok);
    (s, met)
}

fn by_size(results: &[SizeResult], n: usize) -> Option<&SizeResult> {
    results.iter().find(|r| r.mix.services == n)
}

/// (target, met, measured).
fn targets(results: &[SizeResult]) -> Vec<(String, bool, String)> {
    let mut t = Vec::new();
    let p50 = |r: &SizeResult| pct(&r.change_ms, 0.5);
    if let Some(r) = by_size(results, 10_000) {
        t.push(("full sync 10k ≤ 1.0 s".into(), r.full_sync_s <= 1.0, secs(r.full_sync_s)));
        let ratio = r.full_sync_s / r.floor_s;
        t.push(("full sync 10k ≤ 1.5 × one nft -f".into(), ratio <= 1.5, format!("{ratio:.2}×")));
    }
    if let Some(r) = by_size(results, 100_000) {
        t.push(("full sync 100k ≤ 10 s".into(), r.full_sync_s <= 10.0, secs(r.full_sync_s)));
        t.push(("one change at 100k ≤ 5 ms (median)".into(), p50(r) <= 5.0, format!("{:.2} ms", p50(r))));
        t.push(("peak RSS at 100k ≤ 300 MiB".into(), r.peak_rss_mib <= 300.0, format!("{:.0} MiB", r.peak_rss_mib)));
        if let Some(small) = by_size(results, 10_000) {
            let g = r.full_sync_s / small.full_sync_s;
            t.push(("growth 100k / 10k ≤ 12×".into(), g <= 12.0, format!("{g:.1}×")));
        }
        if let Some(small) = by_size(results, 1_000) {
            let g = p50(r) / p50(small);
            t.push(("change median 100k / 1k ≤ 2×".into(), g <= 2.0, format!("{g:.2}×")));
        }
    }
    t
}

fn write_report(s: &mut String, command: &str, args: &Args, results: &[SizeResult]) -> Result<(), std::fmt::Error> {
    writeln!(s, "$ {command}")?;
    writeln!(s)?;
    writeln!(
        s,
        "{} endpoints per service; mix: 10% NodePort, 2% LoadBalancer (half eTP Local), 1% ClientIP affinity. \
         Changes cycle through replacing, adding and removing one endpoint of one service. \
         Upstream shape loaded up to {} services, timeout {} s.",
        args.endpoints, args.upstream_max, args.upstream_timeout
    )?;
    writeln!(s)?;
    writeln!(
        s,
        "| services | endpoints | full sync (netlink) | ops / txs | one nft -f (incl. nft's parsing) | sync / nft -f | upstream shape (nft -f) | upstream / sync | change p50 | change p99 | of which netlink p50 | change ops | peak RSS |"
    )?;
    writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for r in results {
        let up_ratio = match r.upstream {
            UpstreamLoad::Loaded(u) => format!("{:.0}×", u / r.full_sync_s),
            UpstreamLoad::TimedOut(t) => format!("> {:.0}×", t as f64 / r.full_sync_s),
            _ => "–".into(),
        };
        writeln!(
            s,
            "| {} | {} | {} | {} / {} | {} | {:.2}× | {} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {} | {:.0} MiB |",
            r.mix.services,
            r.mix.endpoints,
            secs(r.full_sync_s),
            r.full_ops,
            r.full_transactions,
            secs(r.floor_s),
            r.full_sync_s / r.floor_s,
            upstream(&r.upstream),
            up_ratio,
            pct(&r.change_ms, 0.5),
            pct(&r.change_ms, 0.99),
            pct(&r.change_apply_ms, 0.5),
            r.change_ops,
            r.peak_rss_mib,
        )?;
    }
    writeln!(s)?;
    if let [first, .., last] = results {
        writeln!(
            s,
            "Growth {} → {} services: full sync {:.1}×, one nft -f {:.1}×, change median {:.2}×.",
            first.mix.services,
            last.mix.services,
            last.full_sync_s / first.full_sync_s,
            last.floor_s / first.floor_s,
            pct(&last.change_ms, 0.5) / pct(&first.change_ms, 0.5),
        )?;
        writeln!(s)?;
    }
    write_restarts(s, results)?;
    write_iptables(s, results)?;
    let t = targets(results);
    if !t.is_empty() {
        writeln!(s, "| target | measured | met |")?;
        writeln!(s, "|---|---:|:---:|")?;
        for (name, ok, measured) in t {
            writeln!(s, "| {name} | {measured} | {} |", if ok { "yes" } else { "NO" })?;
        }
    }
    Ok(())
}

/// A restarted dataplane's first sync over live tables of the same plan (see
/// [`crate::measure::RestartOverLive`]).
fn write_restarts(s: &mut String, results: &[SizeResult]) -> Result<(), std::fmt::Error> {
    writeln!(
        s,
        "Restart over live tables (a new dataplane's first sync over the tables of the same plan, own namespace; \
         listing, comparing and committing included): over chains without rule digests (as a kproxy before \
         digests left them: every chain rewritten), then over chains with them."
    )?;
    writeln!(s)?;
    writeln!(s, "| services | without digests | ops | with digests | ops | ratio |")?;
    writeln!(s, "|---:|---:|---:|---:|---:|---:|")?;
    for r in results {
        let x = &r.restart;
        writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.1}× |",
            r.mix.services,
            secs(x.without_digests_s),
            x.without_digests_ops,
            secs(x.with_digests_s),
            x.with_digests_ops,
            x.without_digests_s / x.with_digests_s,
        )?;
    }
    writeln!(s)
}

/// The iptables dataplane next to the nftables one, same clusters, same run.
fn write_iptables(s: &mut String, results: &[SizeResult]) -> Result<(), std::fmt::Error> {
    if results.iter().all(|r| r.iptables.is_empty()) {
        return Ok(());
    }
    writeln!(
        s,
        "iptables mode, same clusters and changes, each backend in a fresh namespace (full sync: kproxy's rendering, \
         `iptables-save` of what is there, the restore, the jump checks; tools: time waiting for the iptables \
         binaries, and their CPU; resync / restart: a full sync over the live rules by the same dataplane / by a \
         fresh one, with the `COMMIT` sections it restored):"
    )?;
    writeln!(s)?;
    writeln!(
        s,
        "| services | backend | full sync | of which tools (wall) | tools CPU user / system | restores / sections | vs nftables full sync | upstream layout, ClusterIPs only (one restore) | change p50 | change p99 | of which iptables-restore p50 | resync over live rules (sections) | restart over live rules (sections) |"
    )?;
    writeln!(s, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for r in results {
        for i in &r.iptables {
            writeln!(
                s,
                "| {} | {} | {} | {} | {} / {} | {} / {} | {:.0}× | {} | {:.2} ms | {:.2} ms | {:.2} ms | {} ({}) | {} ({}) |",
                r.mix.services,
                i.backend,
                secs(i.full_sync_s),
                secs(i.full_tools_s),
                secs(i.full_tools_user_s),
                secs(i.full_tools_sys_s),
                i.full_restores,
                i.full_sections,
                i.full_sync_s / r.full_sync_s,
                upstream(&i.upstream),
                pct(&i.change_ms, 0.5),
                pct(&i.change_ms, 0.99),
                pct(&i.change_tools_ms, 0.5),
                i.resync_s.map_or_else(|| "skipped".to_owned(), secs),
                i.resync_sections,
                i.restart_s.map_or_else(|| "skipped".to_owned(), secs),
                i.restart_sections,
            )?;
        }
    }
    writeln!(s)
}

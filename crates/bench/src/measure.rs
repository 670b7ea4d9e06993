//! Measures one cluster size (runs in a child process of its own).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kproxy_nft_model::{Element, Op, TableListing, TableRef};
use kproxy_nft_netlink::NetlinkExecutor;
use kproxy_nftables::{Config, NftablesDataplane, Recording};
use kproxy_testbed::Netns;
use serde::{Deserialize, Serialize};

use crate::Args;
use crate::cluster::{self, Mix};

/// How the upstream-shaped load went.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum UpstreamLoad {
    /// Not attempted at this size.
    Skipped,
    /// Gave up after this many seconds.
    TimedOut(u64),
    /// Loaded in this many seconds.
    Loaded(f64),
    /// `nft` failed.
    Failed(String),
}

/// Everything measured for one size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SizeResult {
    /// The cluster.
    pub mix: Mix,
    /// Full sync over netlink (render, diff, encode, kernel), seconds.
    pub full_sync_s: f64,
    /// Operations of the full sync.
    pub full_ops: usize,
    /// Transactions the cold start was split into.
    pub full_transactions: usize,
    /// One-endpoint change sync latencies, milliseconds, sorted.
    pub change_ms: Vec<f64>,
    /// Of each change, the time in the netlink executor (encoding, kernel commit), sorted.
    pub change_apply_ms: Vec<f64>,
    /// Operations of the first change.
    pub change_ops: usize,
    /// Peak RSS of the process after full sync and changes (VmHWM), MiB.
    pub peak_rss_mib: f64,
    /// The same final ruleset as text through one `nft -f` (nft's parsing included), seconds.
    pub floor_s: f64,
    /// Upstream's shape through one `nft -f`.
    pub upstream: UpstreamLoad,
    /// The iptables dataplane on the same cluster, per backend.
    pub iptables: Vec<crate::iptables::IptablesResult>,
    /// A restarted dataplane's first sync over the live tables of the same plan.
    pub restart: RestartOverLive,
}

/// A new dataplane's first sync (what a restarted kproxy does) over tables that already hold
/// the same plan, in a namespace of its own: once over tables whose chains carry no rule
/// digest (as a kproxy before digests left them, so every chain is rewritten: what every
/// restart cost before), then over the tables that adoption left (digests in place).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct RestartOverLive {
    /// Over tables without digests: seconds, operations.
    pub without_digests_s: f64,
    pub without_digests_ops: usize,
    /// Over tables with digests: seconds, operations.
    pub with_digests_s: f64,
    pub with_digests_ops: usize,
}

fn vm_hwm_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Counts transactions while applying them over netlink.
#[derive(Debug, Default)]
struct Counting {
    inner: NetlinkExecutor,
    transactions: usize,
    /// Time spent applying, in total.
    applying: Duration,
    /// Drops rule comments before applying: tables as a kproxy without chain digests wrote them.
    without_digests: bool,
}

impl kproxy_nftables::Executor for Counting {
    fn apply(&mut self, tx: &kproxy_nftables::Transaction) -> Result<(), kproxy_nftables::ExecError> {
        self.transactions += 1;
        let stripped;
        let tx = if self.without_digests {
            let mut t = kproxy_nftables::Transaction::new();
            for op in tx.ops() {
                let mut op = op.clone();
                if let Op::AddRule { comment, .. } = &mut op {
                    *comment = None;
                }
                t.push(op);
            }
            stripped = t;
            &stripped
        } else {
            tx
        };
        let start = Instant::now();
        let result = self.inner.apply(tx);
        self.applying += start.elapsed();
        result
    }
    // A restart reads the live tables: the reads go to the kernel too.
    fn generation(&mut self) -> Result<Option<u32>, kproxy_nftables::ExecError> {
        self.inner.generation()
    }
    fn list(&mut self, table: &TableRef) -> Result<Option<TableListing>, kproxy_nftables::ExecError> {
        self.inner.list(table)
    }
    fn list_without_elements(&mut self, table: &TableRef) -> Result<Option<TableListing>, kproxy_nftables::ExecError> {
        self.inner.list_without_elements(table)
    }
    fn element_identities(
        &mut self,
        table: &TableRef,
        set: &str,
    ) -> Result<Option<BTreeSet<Vec<u8>>>, kproxy_nftables::ExecError> {
        self.inner.element_identities(table, set)
    }
    fn element_identity(&self, element: &Element) -> Option<Vec<u8>> {
        self.inner.element_identity(element)
    }
    fn elements(
        &mut self,
        table: &TableRef,
        set: &kproxy_nft_model::SetDef,
    ) -> Result<Option<Vec<Element>>, kproxy_nftables::ExecError> {
        self.inner.elements(table, set)
    }
}

/// See [`RestartOverLive`].
fn restart_over_live(plan: &kproxy_plan::Plan) -> anyhow::Result<RestartOverLive> {
    let ns = Netns::new("bench-restart")?;
    ns.run_in(|| -> anyhow::Result<RestartOverLive> {
        let executor = Counting { without_digests: true, ..Counting::default() };
        NftablesDataplane::new(executor, Config::default()).full_sync(plan).context("cold start without digests")?;
        let timed = || -> anyhow::Result<(f64, usize)> {
            let mut dp = NftablesDataplane::new(Counting::default(), Config::default());
            let start = Instant::now();
            let report = dp.full_sync(plan).context("restart over live tables")?;
            Ok((start.elapsed().as_secs_f64(), report.ops))
        };
        let (without_digests_s, without_digests_ops) = timed()?;
        let (with_digests_s, with_digests_ops) = timed()?;
        Ok(RestartOverLive { without_digests_s, without_digests_ops, with_digests_s, with_digests_ops })
    })?
}

/// Loads `script` with `nft -f` inside `ns`, timed; `None` when it ran past `timeout`.
fn nft_load(ns: &Netns, script: &str, timeout: Duration) -> anyhow::Result<Option<f64>> {
    let path = std::env::temp_dir().join(format!("kproxy-bench-{}-{}.nft", std::process::id(), ns.name()));
    std::fs::File::create(&path)?.write_all(script.as_bytes())?;
    let result = ns.run_in(|| -> anyhow::Result<Option<f64>> {
        let start = Instant::now();
        let mut child =
            Command::new("nft").arg("-f").arg(&path).stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
        loop {
            if let Some(status) = child.try_wait()? {
                let elapsed = start.elapsed().as_secs_f64();
                if !status.success() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        std::io::Read::read_to_string(&mut e, &mut err)?;
                    }
                    anyhow::bail!("nft -f failed: {}", err.lines().take(3).collect::<Vec<_>>().join(" / "));
                }
                return Ok(Some(elapsed));
            }
            if start.elapsed() > timeout {
                child.kill()?;
                child.wait()?;
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let _ = std::fs::remove_file(&path);
    result?
}

/// Measures `size` services.
pub fn run(size: usize, args: &Args) -> anyhow::Result<SizeResult> {
    let per = args.endpoints;
    let (mut plan, mix) = cluster::plan(size, per);
    let ns = Netns::new("bench-netlink")?;
    let changes = args.changes;
    let (full_sync_s, full_ops, full_transactions, change_ms, change_apply_ms, change_ops, final_plan) =
        ns.run_in(move || -> anyhow::Result<_> {
            let mut dp = NftablesDataplane::new(Counting::default(), Config::default());
            let start = Instant::now();
            let report = dp.full_sync(&plan).context("full sync")?;
            let full = start.elapsed().as_secs_f64();
            let transactions = dp.executor().transactions;
            let mut lat = Vec::with_capacity(changes);
            let mut apply = Vec::with_capacity(changes);
            let mut change_ops = 0;
            for k in 0..changes {
                let i = (k * 7919 + 13) % size.max(1);
                let delta = cluster::change_one_endpoint(&mut plan, i, per, k);
                let applying = dp.executor().applying;
                let t = Instant::now();
                let r = dp.partial_sync(&plan, &delta).context("partial sync")?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
                apply.push((dp.executor().applying - applying).as_secs_f64() * 1000.0);
                if k == 0 {
                    change_ops = r.ops;
                }
            }
            lat.sort_by(f64::total_cmp);
            apply.sort_by(f64::total_cmp);
            Ok((full, report.ops, transactions, lat, apply, change_ops, plan))
        })??;
    let peak_rss_mib = vm_hwm_mib();
    drop(ns);
    eprintln!("kproxy-bench: {size} services, restart over live tables ...");
    let restart = restart_over_live(&final_plan)?;

    let text = NftablesDataplane::new(Recording::default(), Config::default()).render_initial(&final_plan).render();
    let floor_ns = Netns::new("bench-floor")?;
    let floor_s = nft_load(&floor_ns, &text, Duration::from_secs(1800))?.context("the nft -f load timed out")?;
    drop(text);
    drop(floor_ns);

    let upstream = if size > args.upstream_max {
        UpstreamLoad::Skipped
    } else {
        let script = crate::upstream::ruleset(&final_plan);
        let ns = Netns::new("bench-upstream")?;
        match nft_load(&ns, &script, Duration::from_secs(args.upstream_timeout)) {
            Ok(Some(s)) => UpstreamLoad::Loaded(s),
            Ok(None) => UpstreamLoad::TimedOut(args.upstream_timeout),
            Err(e) => UpstreamLoad::Failed(format!("{e:#}")),
        }
    };
    let mut iptables = Vec::new();
    for backend in crate::iptables::backends(size, args.iptables_max, &args.iptables_backends) {
        eprintln!("kproxy-bench: {size} services, iptables-{} ...", backend.as_str());
        let timeout = Duration::from_secs(args.upstream_timeout);
        let upstream_max = if args.quick { 0 } else { args.iptables_upstream_max };
        iptables.push(crate::iptables::run(
            size,
            args.endpoints,
            args.changes,
            backend,
            upstream_max,
            timeout,
            args.iptables_resync_max,
        )?);
    }
    Ok(SizeResult {
        iptables,
        restart,
        mix,
        full_sync_s,
        full_ops,
        full_transactions,
        change_ms,
        change_apply_ms,
        change_ops,
        peak_rss_mib,
        floor_s,
        upstream,
    })
}

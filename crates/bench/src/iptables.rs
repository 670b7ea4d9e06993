//! The iptables dataplane on the same cluster, per iptables backend, in the same child process
//! as the nftables figures: the first full sync (rendering, `iptables-save` for stale chains,
//! the restore, the jump checks), one-endpoint changes, then a full resync over the live rules
//! (the hourly one) and a fresh dataplane's full sync over them (a restart), in a fresh network
//! namespace each.
//! The time spent waiting for the iptables tools and the CPU they used are kept apart from
//! kproxy's own.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kproxy_iptables::rules::Table;
use kproxy_iptables::{Backend, Config, ExecError, Executor, IptablesDataplane, IptablesRestore, Output};
use kproxy_plan::Dataplane as _;
use kproxy_state::IpFamily;
use kproxy_testbed::Netns;
use serde::{Deserialize, Serialize};

use crate::cluster;
use crate::measure::UpstreamLoad;

/// `USER_HZ`: the unit of `/proc/<pid>/stat` CPU times.
const USER_HZ: f64 = 100.0;

/// One backend's figures at one size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IptablesResult {
    /// `nft` or `legacy`.
    pub backend: String,
    /// The first full sync, seconds (everything: kproxy and the tools).
    pub full_sync_s: f64,
    /// Of it, waiting for the iptables tools (restore, save, jump checks), seconds.
    pub full_tools_s: f64,
    /// CPU the tools used during the full sync: user, and system (the kernel applying the
    /// rules), of the waited-for children.
    pub full_tools_user_s: f64,
    pub full_tools_sys_s: f64,
    /// `iptables-restore` runs of the full sync, and `COMMIT` sections in them.
    pub full_restores: usize,
    pub full_sections: usize,
    /// One-endpoint change syncs, ms, sorted.
    pub change_ms: Vec<f64>,
    /// Of each, waiting for `iptables-restore`, ms, sorted.
    pub change_tools_ms: Vec<f64>,
    /// A second full sync after the changes, over the live rules with the jumps in place (a
    /// restart, or the hourly resync): each section's commit then revalidates the table.
    pub resync_s: Option<f64>,
    pub resync_sections: usize,
    /// Then a fresh dataplane's first full sync over those live rules (a restart of kproxy),
    /// seconds, and the `COMMIT` sections it restored.
    #[serde(default)]
    pub restart_s: Option<f64>,
    #[serde(default)]
    pub restart_sections: usize,
    /// The ClusterIP part of the cluster in upstream's layout, one `iptables-restore --noflush`
    /// into an empty namespace ([`crate::upstream_iptables`]).
    pub upstream: UpstreamLoad,
}

/// The real tools, timed.
#[derive(Debug)]
struct Timed {
    inner: IptablesRestore,
    waiting: Duration,
    restores: usize,
    sections: usize,
}

impl Timed {
    fn time<T>(&mut self, f: impl FnOnce(&mut IptablesRestore) -> T) -> T {
        let start = Instant::now();
        let out = f(&mut self.inner);
        self.waiting += start.elapsed();
        out
    }
}

impl Executor for Timed {
    fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), ExecError> {
        self.restores += 1;
        self.sections += input.matches("COMMIT\n").count();
        self.time(|e| e.restore(family, input))
    }
    fn save(&mut self, family: IpFamily, table: Table) -> Result<String, ExecError> {
        self.time(|e| e.save(family, table))
    }
    fn save_all(&mut self, family: IpFamily) -> Result<String, ExecError> {
        self.time(|e| e.save_all(family))
    }
    fn run(&mut self, family: IpFamily, args: &[String]) -> Result<Output, ExecError> {
        self.time(|e| e.run(family, args))
    }
    fn sysctl(&mut self, key: &str, value: &str) -> Result<(), ExecError> {
        self.inner.sysctl(key, value)
    }
    fn drop_empty_table(&mut self, family: IpFamily, table: Table) -> Result<(), ExecError> {
        self.time(|e| e.drop_empty_table(family, table))
    }
    fn section_limit(&self) -> Option<usize> {
        self.inner.section_limit()
    }
}

/// User and system CPU of this process's waited-for children so far, seconds (`cutime`,
/// `cstime`: fields 16 and 17 of `/proc/self/stat`).
fn children_cpu_s() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    let fields: Vec<f64> = rest.split_whitespace().map(|f| f.parse().unwrap_or(0.0)).collect();
    // `rest` starts at field 3.
    let field = |i: usize| fields.get(i).copied().unwrap_or(0.0) / USER_HZ;
    (field(13), field(14))
}

/// Loads `text` with `iptables-restore --noflush -w` of `backend` in a fresh namespace, timed;
/// gives up after `timeout`.
fn restore_load(backend: Backend, text: &str, timeout: Duration) -> anyhow::Result<UpstreamLoad> {
    let path = std::env::temp_dir().join(format!("kproxy-bench-{}-ipt-{}.txt", std::process::id(), backend.as_str()));
    std::fs::write(&path, text)?;
    let ns = Netns::new(&format!("bench-ipt-up-{}", backend.as_str()))?;
    let program = backend.program(IpFamily::V4, "-restore");
    let result = ns.run_in(|| -> anyhow::Result<UpstreamLoad> {
        let start = Instant::now();
        let mut child = Command::new(&program)
            .args(["--noflush", "-w"])
            .stdin(std::fs::File::open(&path)?)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        loop {
            if let Some(status) = child.try_wait()? {
                let elapsed = start.elapsed().as_secs_f64();
                return Ok(if status.success() {
                    UpstreamLoad::Loaded(elapsed)
                } else {
                    UpstreamLoad::Failed(format!("{program}: {status}"))
                });
            }
            if start.elapsed() > timeout {
                child.kill()?;
                child.wait()?;
                return Ok(UpstreamLoad::TimedOut(timeout.as_secs()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let _ = std::fs::remove_file(&path);
    result?
}

/// Measures `backend` on the cluster of `size` services: full sync, then `changes` changes;
/// then upstream's layout of the cluster when `size <= upstream_max`.
pub fn run(
    size: usize,
    per: usize,
    changes: usize,
    backend: Backend,
    upstream_max: usize,
    upstream_timeout: Duration,
    resync_max: usize,
) -> anyhow::Result<IptablesResult> {
    let (mut plan, _) = cluster::plan(size, per);
    let upstream = if size <= upstream_max {
        restore_load(backend, &crate::upstream_iptables::restore(&plan), upstream_timeout)?
    } else {
        UpstreamLoad::Skipped
    };
    let ns = Netns::new(&format!("bench-ipt-{}", backend.as_str()))?;
    ns.run_in(move || -> anyhow::Result<IptablesResult> {
        let exec = Timed { inner: IptablesRestore::new(backend), waiting: Duration::ZERO, restores: 0, sections: 0 };
        let mut dp = IptablesDataplane::new(exec, Config::default());
        let cpu = children_cpu_s();
        let start = Instant::now();
        dp.full_sync(&plan).context("iptables full sync")?;
        let full_sync_s = start.elapsed().as_secs_f64();
        let e = dp.executor();
        let (full_tools_s, full_restores, full_sections) = (e.waiting.as_secs_f64(), e.restores, e.sections);
        let after = children_cpu_s();
        let (full_tools_user_s, full_tools_sys_s) = (after.0 - cpu.0, after.1 - cpu.1);
        let mut change_ms = Vec::with_capacity(changes);
        let mut change_tools_ms = Vec::with_capacity(changes);
        for k in 0..changes {
            let i = (k * 7919 + 13) % size.max(1);
            let delta = cluster::change_one_endpoint(&mut plan, i, per, k);
            let waiting = dp.executor().waiting;
            let t = Instant::now();
            dp.partial_sync(&plan, &delta).map_err(|e| anyhow::anyhow!("iptables partial sync: {e}"))?;
            change_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            change_tools_ms.push((dp.executor().waiting - waiting).as_secs_f64() * 1000.0);
        }
        change_ms.sort_by(f64::total_cmp);
        change_tools_ms.sort_by(f64::total_cmp);
        let sections = dp.executor().sections;
        let mut resync_s = None;
        if size <= resync_max {
            let start = Instant::now();
            dp.full_sync(&plan).context("iptables resync")?;
            resync_s = Some(start.elapsed().as_secs_f64());
        }
        let resync_sections = dp.executor().sections - sections;
        let mut restart_s = None;
        let mut restart_sections = 0;
        if size <= resync_max {
            drop(dp);
            let exec =
                Timed { inner: IptablesRestore::new(backend), waiting: Duration::ZERO, restores: 0, sections: 0 };
            let mut dp = IptablesDataplane::new(exec, Config::default());
            let start = Instant::now();
            dp.full_sync(&plan).context("iptables restart")?;
            restart_s = Some(start.elapsed().as_secs_f64());
            restart_sections = dp.executor().sections;
        }
        Ok(IptablesResult {
            backend: backend.as_str().to_owned(),
            full_sync_s,
            full_tools_s,
            full_tools_user_s,
            full_tools_sys_s,
            full_restores,
            full_sections,
            change_ms,
            change_tools_ms,
            resync_s,
            resync_sections,
            restart_s,
            restart_sections,
            upstream,
        })
    })?
}

/// The backends measured at `size` (none above `max`).
pub fn backends(size: usize, max: usize, names: &[String]) -> Vec<Backend> {
    if size > max {
        return Vec::new();
    }
    names
        .iter()
        .filter_map(|n| match n.as_str() {
            "nft" => Some(Backend::Nft),
            "legacy" => Some(Backend::Legacy),
            _ => None,
        })
        .collect()
}

//! Startup tuning of the connection tracker, as kube-proxy does it (`conntrack` config section).
//!
//! - `nf_conntrack_max` = max(`maxPerCore` × CPUs, `min`), when `maxPerCore` > 0;
//! - the conntrack hash size (`/sys/module/nf_conntrack/parameters/hashsize`) raised to a quarter
//!   of that, only when it is smaller and sysfs is mounted read-write: container runtimes have
//!   been known to mount /sys read-only, and the kernel refuses the write outside the initial
//!   network namespace, where it would change every namespace's table;
//! - `nf_conntrack_tcp_timeout_established`, `…_close_wait`, `nf_conntrack_udp_timeout`,
//!   `…_udp_timeout_stream`, each only when configured above zero;
//! - `nf_conntrack_tcp_be_liberal` = 1 when asked for.
//!
//! A value is only written when it differs from the current one. A setting that cannot be
//! applied is logged as a warning and reported, and the others are still applied: inside a
//! network namespace `nf_conntrack_max` is read-only while the timeouts are per namespace, so
//! partial success is the normal case there. The caller decides whether a failure is fatal.
//!
//! Every path is relative to a root directory, "/" in production and a scratch directory in tests.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::{info, warn};

use crate::error::Error;

const CONNTRACK_MAX: &str = "proc/sys/net/netfilter/nf_conntrack_max";
const HASHSIZE: &str = "sys/module/nf_conntrack/parameters/hashsize";
const TCP_ESTABLISHED: &str = "proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established";
const TCP_CLOSE_WAIT: &str = "proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait";
const TCP_BE_LIBERAL: &str = "proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal";
const UDP_TIMEOUT: &str = "proc/sys/net/netfilter/nf_conntrack_udp_timeout";
const UDP_STREAM_TIMEOUT: &str = "proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream";
const MOUNTS: &str = "proc/mounts";

/// The `conntrack` section of the proxy configuration. Zero means "leave the kernel's value".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConntrackTuning {
    /// `maxPerCore`: table entries per CPU.
    pub max_per_core: u32,
    /// `min`: the table size floor.
    pub min: u32,
    /// `tcpEstablishedTimeout`.
    pub tcp_established_timeout: Duration,
    /// `tcpCloseWaitTimeout`.
    pub tcp_close_wait_timeout: Duration,
    /// `tcpBeLiberal`: accept out-of-window TCP packets instead of marking them INVALID.
    pub tcp_be_liberal: bool,
    /// `udpTimeout`: timeout of UDP entries that saw no reply.
    pub udp_timeout: Duration,
    /// `udpStreamTimeout`: timeout of UDP entries that saw replies.
    pub udp_stream_timeout: Duration,
}

impl Default for ConntrackTuning {
    /// kube-proxy's defaults.
    fn default() -> Self {
        Self {
            max_per_core: 32_768,
            min: 131_072,
            tcp_established_timeout: Duration::from_secs(24 * 3600),
            tcp_close_wait_timeout: Duration::from_secs(3600),
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        }
    }
}

/// What happened to one setting.
#[derive(Debug)]
pub enum SettingOutcome {
    /// It already had the wanted value.
    Unchanged(u64),
    /// It was written.
    Changed {
        /// The value before, when it could be read.
        from: Option<u64>,
        /// The value written.
        to: u64,
    },
    /// The hash size is too small but sysfs is read-only (or not mounted).
    ReadOnlySysfs,
    /// It could not be read or written.
    Failed(Error),
}

/// One setting and its outcome.
#[derive(Debug)]
pub struct SettingResult {
    /// The file, under the root given to [`ConntrackTuning::apply`].
    pub path: PathBuf,
    /// What happened.
    pub outcome: SettingOutcome,
}

/// Every setting [`ConntrackTuning::apply`] touched, in order.
#[derive(Debug, Default)]
pub struct TuningReport {
    /// The settings.
    pub settings: Vec<SettingResult>,
}

impl TuningReport {
    /// Settings that could not be applied.
    pub fn failures(&self) -> impl Iterator<Item = &SettingResult> {
        self.settings.iter().filter(|s| matches!(s.outcome, SettingOutcome::Failed(_) | SettingOutcome::ReadOnlySysfs))
    }

    /// The outcome for a file, by its path under the root (e.g. `proc/sys/net/netfilter/nf_conntrack_max`).
    pub fn outcome(&self, path: &str) -> Option<&SettingOutcome> {
        self.settings.iter().find(|s| s.path == Path::new(path)).map(|s| &s.outcome)
    }
}

impl ConntrackTuning {
    /// The `nf_conntrack_max` to set for this many CPUs; 0 leaves it alone.
    pub fn conntrack_max(&self, cpus: usize) -> u64 {
        if self.max_per_core == 0 {
            return 0;
        }
        let scaled = u64::from(self.max_per_core).saturating_mul(cpus as u64);
        scaled.max(u64::from(self.min))
    }

    /// Applies the settings under `root`, counting the CPUs this process may run on.
    pub fn apply(&self, root: &Path) -> TuningReport {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.apply_with_cpus(root, cpus)
    }

    /// Applies the settings under `root` for a node with `cpus` CPUs.
    pub fn apply_with_cpus(&self, root: &Path, cpus: usize) -> TuningReport {
        let mut report = TuningReport::default();
        let max = self.conntrack_max(cpus);
        if max > 0 {
            report.settings.push(set_if_different(root, CONNTRACK_MAX, max));
            report.settings.push(raise_hashsize(root, max / 4));
        }
        let timeouts = [
            (TCP_ESTABLISHED, self.tcp_established_timeout),
            (TCP_CLOSE_WAIT, self.tcp_close_wait_timeout),
            (UDP_TIMEOUT, self.udp_timeout),
            (UDP_STREAM_TIMEOUT, self.udp_stream_timeout),
        ];
        for (path, timeout) in timeouts {
            if timeout.as_secs() > 0 {
                report.settings.push(set_if_different(root, path, timeout.as_secs()));
            }
        }
        if self.tcp_be_liberal {
            report.settings.push(set_if_different(root, TCP_BE_LIBERAL, 1));
        }
        for setting in report.failures() {
            match &setting.outcome {
                SettingOutcome::Failed(error) => warn!(%error, "conntrack setting not applied"),
                _ => warn!(
                    path = %setting.path.display(),
                    "sysfs is read-only: cannot raise the conntrack hash size, problems may arise later"
                ),
            }
        }
        report
    }
}

fn read_integer(path: &Path) -> Result<u64, Error> {
    let content =
        fs::read_to_string(path).map_err(|source| Error::File { action: "reading", path: path.into(), source })?;
    content.trim().parse().map_err(|_| Error::NotAnInteger { path: path.into(), content })
}

fn write_integer(path: &Path, value: u64) -> Result<(), Error> {
    fs::write(path, format!("{value}\n")).map_err(|source| Error::File { action: "writing", path: path.into(), source })
}

fn set_if_different(root: &Path, relative: &str, value: u64) -> SettingResult {
    let path = root.join(relative);
    let current = read_integer(&path).ok();
    let outcome = if current == Some(value) {
        SettingOutcome::Unchanged(value)
    } else {
        match write_integer(&path, value) {
            Ok(()) => {
                info!(path = %path.display(), ?current, value, "set conntrack sysctl");
                SettingOutcome::Changed { from: current, to: value }
            }
            Err(error) => SettingOutcome::Failed(error),
        }
    };
    SettingResult { path: relative.into(), outcome }
}

fn raise_hashsize(root: &Path, wanted: u64) -> SettingResult {
    let path = root.join(HASHSIZE);
    let outcome = match read_integer(&path) {
        Err(error) => SettingOutcome::Failed(error),
        Ok(current) if current >= wanted => SettingOutcome::Unchanged(current),
        Ok(current) => match sysfs_writable(root) {
            Ok(false) => SettingOutcome::ReadOnlySysfs,
            Err(error) => SettingOutcome::Failed(error),
            Ok(true) => match write_integer(&path, wanted) {
                Ok(()) => {
                    info!(from = current, to = wanted, "set conntrack hashsize");
                    SettingOutcome::Changed { from: Some(current), to: wanted }
                }
                Err(error) => SettingOutcome::Failed(error),
            },
        },
    };
    SettingResult { path: HASHSIZE.into(), outcome }
}

/// Whether the sysfs mounted on /sys (else the first sysfs) is mounted read-write.
fn sysfs_writable(root: &Path) -> Result<bool, Error> {
    let path = root.join(MOUNTS);
    let mounts =
        fs::read_to_string(&path).map_err(|source| Error::File { action: "reading", path: path.clone(), source })?;
    let sysfs: Vec<(&str, &str)> = mounts
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() >= 4 && fields[2] == "sysfs").then(|| (fields[1], fields[3]))
        })
        .collect();
    let chosen = sysfs.iter().find(|(target, _)| *target == "/sys").or(sysfs.first());
    Ok(chosen.is_some_and(|(_, options)| options.split(',').next() == Some("rw")))
}

#[cfg(test)]
mod tests;

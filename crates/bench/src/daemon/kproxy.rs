//! The `kproxy` binary under test: started in the node namespace against the fake API server,
//! killed with SIGKILL, and read from the outside through `/proc` (CPU time, memory) and its
//! `/metrics` (only to know when to stop watching, never as a measured figure).

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kproxy_testbed::{Netns, topology};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::Mode;

/// `USER_HZ`: the unit of `/proc/<pid>/stat` CPU times, fixed at 100 in Linux's user ABI.
const USER_HZ: f64 = 100.0;

/// The kproxy binary a benchmark runs: `explicit` (`--kproxy`), else `kproxy` next to this
/// executable (e.g. target/release/kproxy).
pub fn binary(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()?.with_file_name("kproxy"),
    };
    anyhow::ensure!(
        path.is_file(),
        "no kproxy binary at {} (build it: cargo build --release -p kproxy, or pass --kproxy)",
        path.display()
    );
    Ok(path)
}

/// A directory of its own for one run's kubeconfig and kproxy log, under `log_dir` (`--log-dir`,
/// else the temporary directory).
pub fn run_dir(log_dir: Option<&Path>, name: &str) -> anyhow::Result<PathBuf> {
    let dir = log_dir.map_or_else(std::env::temp_dir, Path::to_path_buf).join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("{}", dir.display()))?;
    Ok(dir)
}

/// Where kproxy serves `/metrics` inside the node namespace (its default).
pub const METRICS: &str = "127.0.0.1:10249";

/// A running kproxy; killed (SIGKILL) on drop.
#[derive(Debug)]
pub struct Kproxy {
    child: Child,
    /// When it was spawned.
    pub started: Instant,
}

/// The command line kproxy runs with: its defaults, plus what the sandbox needs.
pub fn args(kubeconfig: &Path, node_name: &str, mode: Mode) -> Vec<String> {
    let args = vec![
        format!("--proxy-mode={}", mode.as_str()),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--hostname-override={node_name}"),
        // As a cluster's kube-proxy ConfigMap sets it (kubeadm does): traffic from pods is told
        // apart from the rest (detect-local mode ClusterCIDR, the default).
        format!("--cluster-cidr={},{}", topology::CLUSTER_CIDR_V4, topology::CLUSTER_CIDR_V6),
        // conntrack sysctls such as nf_conntrack_max are global, not per namespace: the
        // benchmark must not change the host's.
        "--conntrack-max-per-core=0".into(),
        "--conntrack-tcp-timeout-established=0".into(),
        "--conntrack-tcp-timeout-close-wait=0".into(),
    ];
    args
}

impl Kproxy {
    /// Starts `binary args…` inside `ns`, its log appended to `log`.
    pub fn start(ns: &Netns, binary: &Path, args: &[String], log: &Path) -> anyhow::Result<Kproxy> {
        let log = File::options().create(true).append(true).open(log).with_context(|| format!("{}", log.display()))?;
        let started = Instant::now();
        // `ip netns exec` enters the namespace and execs kproxy in the same process: the child's
        // pid is kproxy's.
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name()])
            .arg(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // A group of its own: killing the group also ends whatever `binary` may have started
            // (a wrapper's child), never leaving a proxy running after the benchmark.
            .process_group(0)
            .spawn()
            .context("starting kproxy")?;
        let kproxy = Kproxy { child, started };
        kproxy.wait_exec(binary)?;
        Ok(kproxy)
    }

    /// Waits until the child process is kproxy itself (after `ip`'s exec).
    fn wait_exec(&self, binary: &Path) -> anyhow::Result<()> {
        let want = std::fs::canonicalize(binary).unwrap_or_else(|_| binary.to_owned());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let exe: Option<PathBuf> = std::fs::read_link(format!("/proc/{}/exe", self.pid())).ok();
            if exe.as_deref() == Some(want.as_path()) {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "kproxy did not start (pid {} is {exe:?}; --kproxy must name the kproxy executable itself, not a wrapper)",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL to its process group, and waits for it to be gone.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        self.kill_group();
        self.child.wait().context("waiting for kproxy")?;
        Ok(())
    }

    /// SIGKILL to the whole group, while the child is not yet reaped (until then its pid, the
    /// group's id, cannot be anyone else's).
    fn kill_group(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = killpg(Pid::from_raw(self.pid() as i32), Signal::SIGKILL);
        }
    }

    /// CPU time (user + system, every thread, and every child it waited for, such as
    /// `iptables-restore`) used so far, in seconds.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).context("reading /proc/<pid>/stat")?;
        cpu_seconds(&stat).context("parsing /proc/<pid>/stat")
    }

    /// `VmRSS` and `VmHWM` in MiB.
    pub fn memory_mib(&self) -> anyhow::Result<Memory> {
        memory_mib(self.pid())
    }

    /// Samples its memory every 20 ms until the returned watch is stopped.
    pub fn watch_memory(&self) -> MemoryWatch {
        let pid = self.pid();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Memory { rss: 0.0, peak: 0.0 };
            while !flag.load(Ordering::Relaxed) {
                if let Ok(m) = memory_mib(pid) {
                    seen.rss = seen.rss.max(m.rss);
                    seen.peak = seen.peak.max(m.rss).max(m.peak);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            seen
        });
        MemoryWatch { stop, thread }
    }
}

pub(crate) fn memory_mib(pid: u32) -> anyhow::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading /proc/<pid>/status")?;
    Ok(Memory { rss: status_kib(&status, "VmRSS:")? / 1024.0, peak: status_kib(&status, "VmHWM:")? / 1024.0 })
}

/// The highest RSS seen by sampling, next to `VmHWM`: the kernel folds the current RSS into
/// `VmHWM` only at some events (unmaps, exit), so a peak freed since may be missing from it.
#[derive(Debug)]
pub struct MemoryWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Memory>,
}

impl MemoryWatch {
    /// What was seen while watching, MiB: `rss`, the highest sampled `VmRSS` (the peak of the
    /// watched window); `peak`, the larger of that and `VmHWM` (the process's life so far).
    pub fn stop(self) -> Memory {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(Memory { rss: 0.0, peak: 0.0 })
    }
}

impl Drop for Kproxy {
    fn drop(&mut self) {
        self.kill_group();
        let _ = self.child.wait();
    }
}

/// Resident memory, MiB: `VmRSS`, and `VmHWM` (the peak as far as the kernel recorded it).
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub rss: f64,
    pub peak: f64,
}

/// utime + stime + cutime + cstime from the text of `/proc/<pid>/stat` (fields 14 to 17; the
/// command name, field 2, may hold spaces, so count from the last `)`).
pub(crate) fn cpu_seconds(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); then utime, stime, cutime, cstime.
    let ticks: f64 = fields.get(11..15)?.iter().map(|f| f.parse::<f64>().ok()).sum::<Option<f64>>()?;
    Some(ticks / USER_HZ)
}

fn status_kib(status: &str, field: &str) -> anyhow::Result<f64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/<pid>/status"))
}

/// Full syncs kproxy has reported, from its `/metrics` (counted in the IPv4 family: each sync
/// counts once per family).
pub fn full_syncs(ns: &Netns) -> Option<f64> {
    metric(ns, "kubeproxy_sync_full_proxy_rules_duration_seconds_count", "ip_family=\"IPv4\"")
}

/// The sum of the samples of metric `name` whose labels include `label` (`key="value"`) in
/// kproxy's `/metrics` (run inside the node namespace); `None` when kproxy does not answer.
pub fn metric(ns: &Netns, name: &str, label: &str) -> Option<f64> {
    let addr: SocketAddr = METRICS.parse().ok()?;
    let text = ns
        .run_in(move || -> std::io::Result<String> {
            let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
            stream.set_read_timeout(Some(Duration::from_secs(5)))?;
            write!(stream, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
            let mut response = String::new();
            stream.read_to_string(&mut response)?;
            Ok(response)
        })
        .ok()?
        .ok()?;
    sum_samples(&text, name, label)
}

/// Sums the samples of `name` whose labels include `label` in Prometheus text.
fn sum_samples(text: &str, name: &str, label: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else { continue };
        let labels = match rest.strip_prefix('{') {
            Some(inner) => inner.split_once('}').map_or("", |(l, _)| l),
            None if rest.starts_with(' ') => "",
            None => continue,
        };
        if !labels.split(',').any(|l| l == label) {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests: a panic is a failure
mod tests {
    use super::*;

    fn gone(pid: u32) -> bool {
        // A zombie is gone for this purpose: it runs nothing.
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| stat.contains(") Z "))
    }

    #[test]
    fn a_wrapper_given_as_kproxy_is_refused_and_leaves_nothing_running() {
        if !kproxy_testbed::kernel::require_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let wrapper = dir.path().join("wrapper");
        let child_pid = dir.path().join("child.pid");
        std::fs::write(&wrapper, format!("#!/bin/sh\nsleep 300 &\necho $! > {}\nwait\n", child_pid.display())).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ns = Netns::new("wrapper").unwrap();
        let err = Kproxy::start(&ns, &wrapper, &[], &dir.path().join("log")).unwrap_err();
        assert!(err.to_string().contains("not a wrapper"), "{err:#}");
        let pid: u32 = std::fs::read_to_string(&child_pid).unwrap().trim().parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !gone(pid) {
            assert!(Instant::now() < deadline, "the wrapper's child {pid} is still running");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        let stat = "4242 (kproxy (x) y) S 1 4242 4242 0 -1 4194560 1 0 0 0 250 130 7 13 20 0 9 0 100 0 0";
        assert_eq!(cpu_seconds(stat), Some(4.0));
    }

    #[test]
    fn samples_are_chosen_by_label() {
        let v4 = "ip_family=\"IPv4\"";
        let text = "# TYPE x_count counter\nx_count{ip_family=\"IPv4\",a=\"b\"} 3\nx_count{ip_family=\"IPv6\"} 2\n\
                    x_count_total{ip_family=\"IPv4\"} 9\n";
        assert_eq!(sum_samples(text, "x_count", v4), Some(3.0));
        assert_eq!(sum_samples(text, "x_count", "ip_family=\"IPv6\""), Some(2.0));
        assert_eq!(sum_samples(text, "y", v4), None);
    }
}

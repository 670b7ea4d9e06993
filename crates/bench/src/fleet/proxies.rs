//! The proxies of one fleet: one process per node namespace, each a node of its own
//! (`--hostname-override=node-K`), started together and stopped together. Each is a
//! `kproxy_k8s_harness::Process`: its own process group, its log in the run's directory, and
//! killed by the kernel should the benchmark's main thread die (`PR_SET_PDEATHSIG`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kproxy_k8s_harness::{Launch, Process};
use kproxy_testbed::Netns;

use super::interrupt;
use super::net::node_name;
use super::server;
use crate::daemon::{Mode, Proxy, kproxy};

/// A running fleet.
pub struct Fleet {
    proxy: Proxy,
    processes: Vec<Process>,
    /// When each was spawned.
    pub started: Vec<Instant>,
}

impl Fleet {
    /// Starts `binary` in each of `nodes`, with the same flags as `kproxy-bench daemon --api
    /// real` gives both proxies (`daemon::kproxy::args`), as node `node-K`.
    pub fn start(
        proxy: Proxy,
        binary: &Path,
        nodes: &[Netns],
        kubeconfig: &Path,
        logs: &Path,
    ) -> anyhow::Result<Fleet> {
        std::fs::create_dir_all(logs).with_context(|| format!("{}", logs.display()))?;
        let mut fleet = Fleet { proxy, processes: Vec::new(), started: Vec::new() };
        for (k, node) in nodes.iter().enumerate() {
            let name = node_name(k);
            let args = kproxy::args(kubeconfig, &name, Mode::Nftables);
            let launch = Launch { netns: Some(node.path()), die_with_parent: true };
            let log = logs.join(format!("{}-{name}.log", proxy.as_str()));
            fleet.started.push(Instant::now());
            let process = Process::spawn(&format!("{}-{name}", proxy.as_str()), binary, &args, &log, &launch)?;
            if let Some(pid) = process.pid() {
                interrupt::process_group(pid);
            }
            fleet.processes.push(process);
        }
        Ok(fleet)
    }

    pub fn len(&self) -> usize {
        self.processes.len()
    }

    fn pids(&self) -> Vec<u32> {
        self.processes.iter().filter_map(Process::pid).collect()
    }

    /// An error naming the first proxy that has exited, with the end of its log.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for process in &mut self.processes {
            if let Some(status) = process.exited() {
                anyhow::bail!(
                    "{} exited ({status}); the end of its log ({}):\n{}",
                    process.name(),
                    process.log().display(),
                    process.log_tail(2000)
                );
            }
        }
        Ok(())
    }

    /// CPU of the whole fleet so far (children included), s.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        self.pids().into_iter().map(server::cpu_seconds).sum()
    }

    /// Each proxy's `VmRSS` and `VmHWM`, MiB.
    pub fn memory(&self) -> anyhow::Result<Vec<kproxy::Memory>> {
        self.pids().into_iter().map(kproxy::memory_mib).collect()
    }

    pub fn proxy(&self) -> Proxy {
        self.proxy
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for process in &mut self.processes {
            if let Some(pid) = process.pid() {
                interrupt::forget_process_group(pid);
            }
            // SIGTERM then SIGKILL at once, as `kproxy-bench daemon` kills its proxies: what
            // they leave in the kernel is flushed before the next fleet.
            process.stop(Duration::ZERO);
        }
    }
}

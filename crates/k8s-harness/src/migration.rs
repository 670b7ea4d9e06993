//! What moving a running cluster's nodes between kube-proxy and kproxy takes of the harness:
//! starting and stopping upstream kube-proxy on one node of a cluster that is up (as `up` starts
//! it for `--proxy upstream`), bringing kproxy's image to every node's containerd, and looking at
//! what each proxy has in a node's kernel. `cargo xtask cluster migrate` drives them.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cluster::{ClusterInfo, ledger_path};
use crate::ledger::{Ledger, Resource};
use crate::node::Node;
use crate::{Binaries, Binary};

/// The cluster name behind `info` (its wire namespace is `NAME-wire`).
fn cluster_name(info: &ClusterInfo) -> Result<&str> {
    info.wire_netns.strip_suffix("-wire").context("the cluster's wire namespace is not NAME-wire")
}

/// Node `index` (1-based) of the cluster in `work`.
fn node(work: &Path, info: &ClusterInfo, index: u8) -> Result<Node> {
    let zone = info.nodes.get(usize::from(index) - 1).and_then(|n| n.zone.clone());
    Ok(Node::new(cluster_name(info)?, index, info.families, zone, &work.join("run")))
}

/// The ledger name of kube-proxy on node `index`.
pub fn kube_proxy_process(info: &ClusterInfo, index: u8) -> String {
    let name = info.nodes.get(usize::from(index) - 1).map_or("?", |n| n.name.as_str());
    format!("{name}/kube-proxy")
}

/// Starts upstream kube-proxy on node `index` with the configuration `up` wrote for it
/// (`<work>/kube-proxy.config.yaml`) and `extra` flags, logging to the node's kube-proxy log
/// (appended). Returns its pid.
pub fn start_kube_proxy(
    binaries: &Binaries,
    work: &Path,
    info: &ClusterInfo,
    index: u8,
    extra: &[String],
) -> Result<u32> {
    let config = work.join("kube-proxy.config.yaml");
    if !config.is_file() {
        bail!("{} is missing: the cluster was not brought up with --proxy upstream", config.display());
    }
    let node = node(work, info, index)?;
    let mut args = vec![format!("--config={}", config.display()), format!("--hostname-override={}", node.name)];
    args.extend(extra.iter().cloned());
    let mut ledger = Ledger::open(&ledger_path(work))?;
    node.spawn(&mut ledger, "kube-proxy", &binaries.path(Binary::KubeProxy)?, &args, &info.logs)
}

/// SIGTERM to the newest live process the ledger records as `name`, and waits (at most `grace`,
/// then SIGKILL) until it is gone. Returns whether one was running.
pub fn stop_recorded(work: &Path, name: &str, grace: Duration) -> Result<bool> {
    let ledger = Ledger::open(&ledger_path(work))?;
    let live = ledger
        .resources()
        .filter_map(|r| match r {
            Resource::Process { name: n, pid, start_time } if n == name => Some((*pid, *start_time)),
            _ => None,
        })
        .filter(|(pid, start)| crate::ledger::start_time(*pid) == Some(*start))
        .last();
    let Some((pid, _)) = live else { return Ok(false) };
    let group = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while crate::ledger::start_time(pid).is_some() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    Ok(true)
}

/// Imports kproxy's image archive into every node's containerd (a cluster brought up for
/// upstream kube-proxy has it nowhere).
pub fn import_image(work: &Path, info: &ClusterInfo, archive: &Path) -> Result<()> {
    for index in 1..=u8::try_from(info.nodes.len())? {
        node(work, info, index)?.containerd().import(archive)?;
    }
    Ok(())
}

/// What of each proxy is in one node's kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyRules {
    /// nftables tables named `kube-proxy` (kube-proxy's nftables mode).
    pub kube_proxy_tables: usize,
    /// nftables tables named `kproxy` or `kproxy-accel`.
    pub kproxy_tables: usize,
    /// `KUBE-SERVICES` in iptables-nft's nat table (either proxy's iptables mode).
    pub kube_services_chain: bool,
}

/// Reads [`ProxyRules`] in namespace `netns`.
pub fn proxy_rules(netns: &str) -> Result<ProxyRules> {
    let run = |args: &[&str]| -> Result<String> {
        let out =
            Command::new("ip").args(["netns", "exec", netns]).args(args).output().context("running ip netns exec")?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let tables = run(&["nft", "list", "tables"])?;
    let named = |name: &str| tables.lines().filter(|l| l.split_whitespace().nth(2) == Some(name)).count();
    let nat = run(&["iptables-nft-save", "-t", "nat"])?;
    Ok(ProxyRules {
        kube_proxy_tables: named("kube-proxy"),
        kproxy_tables: named("kproxy") + named("kproxy-accel"),
        kube_services_chain: nat.lines().any(|l| l.starts_with(":KUBE-SERVICES ")),
    })
}

/// Waits until `log` (a file) contains `needle`; returns when it did.
pub fn wait_for_log(log: &Path, needle: &str, timeout: Duration) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        if fs::read_to_string(log).is_ok_and(|text| text.contains(needle)) {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("{} never said {needle:?} within {timeout:?}", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

//! Start → first sync, seen in the kernel: the hooked base chains of both tables, then every
//! Service's ClusterIP endpoints (nftables mode); the jumps into `KUBE-SERVICES` and every
//! Service's ClusterIP in it (iptables mode, written last, after every service chain).

use std::collections::HashSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use kproxy_testbed::Netns;

use super::Mode;
use super::kernel::{self, KernelProbe, MapKey};
use super::kproxy::Kproxy;
use super::objects::{self, Layout, Shape};

/// How often the kernel is polled while waiting for the first sync.
const START_POLL: Duration = Duration::from_millis(5);
/// Services whose keys are looked up while waiting for the first sync.
const START_SAMPLES: usize = 64;

/// The ClusterIP keys (`address . tcp . port . slot` for every slot) the first sync must have
/// put in the endpoints maps: every Service but the affinity ones, whose endpoints are rules;
/// the big Service's last.
pub(crate) fn expected_keys(n: usize, layout: Layout) -> Vec<MapKey> {
    let mut keys = Vec::new();
    for i in (0..n).filter(|i| !Shape::of(*i).affinity) {
        let port = objects::service_port(i);
        let slots = objects::initial_endpoint_count(i, layout.endpoints);
        let mut ips: Vec<IpAddr> = vec![objects::cluster_ip_v4(i).into()];
        if Shape::of(i).dual_stack && i > 0 {
            ips.push(objects::cluster_ip_v6(i).into());
        }
        for ip in ips {
            keys.extend((0..slots as u32).map(|slot| MapKey::endpoint(ip, port, slot, slots)));
        }
    }
    let big: IpAddr = objects::cluster_ip_v4(n).into();
    keys.extend((0..layout.big as u32).map(|slot| MapKey::endpoint(big, 80, slot, layout.big)));
    keys
}

/// Waits until the first sync is in the kernel; returns the seconds since kproxy was spawned
/// and whether full listings (rather than the sampled lookups) decided it.
pub fn wait(
    node: &Netns,
    n: usize,
    layout: Layout,
    daemon: &mut Kproxy,
    timeout_s: u64,
    mode: Mode,
) -> anyhow::Result<(f64, bool)> {
    if mode == Mode::Iptables {
        return wait_iptables(node, n, layout, daemon, timeout_s);
    }
    let expected = expected_keys(n, layout);
    // Evenly spread samples, the last Service included.
    let step = (expected.len() / START_SAMPLES).max(1);
    let mut samples: Vec<MapKey> = expected.iter().step_by(step).cloned().collect();
    samples.extend(expected.last().cloned());
    let started = daemon.started;
    let deadline = started + Duration::from_secs(timeout_s);
    let v4: IpAddr = objects::cluster_ip_v4(0).into();
    let v6: IpAddr = objects::cluster_ip_v6(0).into();
    node.run_in(|| -> anyhow::Result<(f64, bool)> {
        let mut probe = KernelProbe::open()?;
        let live = |probe: &mut KernelProbe| -> anyhow::Result<bool> {
            if !(probe.chain_exists(v4, kernel::HOOKED_CHAIN)? && probe.chain_exists(v6, kernel::HOOKED_CHAIN)?) {
                return Ok(false);
            }
            for k in &samples {
                if probe.key_data(k)?.is_none() {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        let mut by_listing = false;
        loop {
            anyhow::ensure!(daemon.alive(), "kproxy exited before its first sync");
            anyhow::ensure!(Instant::now() < deadline, "no first sync in the kernel after {timeout_s} s");
            if !by_listing && live(&mut probe)? {
                let at = started.elapsed().as_secs_f64();
                if probe.has_all_keys(&expected)? {
                    return Ok((at, false));
                }
                by_listing = true;
            }
            if by_listing && live(&mut probe)? && probe.has_all_keys(&expected)? {
                return Ok((started.elapsed().as_secs_f64(), true));
            }
            std::thread::sleep(START_POLL);
        }
    })?
}

/// How often the kernel is polled in iptables mode (a poll dumps a dispatch chain's rules).
const IPTABLES_POLL: Duration = Duration::from_millis(20);

/// Every Service's ClusterIPs, per family (the big Service's, IPv4 only, too).
fn cluster_ips(n: usize, layout: Layout) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = (0..layout.services(n)).map(|i| objects::cluster_ip_v4(i).into()).collect();
    ips.extend((1..n).filter(|i| Shape::of(*i).dual_stack).map(|i| IpAddr::from(objects::cluster_ip_v6(i))));
    ips
}

/// iptables mode: the nat `PREROUTING` jumps to `KUBE-SERVICES` (ensured after the restore) and
/// `KUBE-SERVICES` names the sampled ClusterIPs (the chain is written in one section, so all
/// or none), in both families; then, once, every ClusterIP.
fn wait_iptables(
    node: &Netns,
    n: usize,
    layout: Layout,
    daemon: &mut Kproxy,
    timeout_s: u64,
) -> anyhow::Result<(f64, bool)> {
    let expected = cluster_ips(n, layout);
    let step = (expected.len() / START_SAMPLES).max(1);
    let mut samples: Vec<IpAddr> = expected.iter().step_by(step).copied().collect();
    samples.extend(expected.iter().rfind(|ip| ip.is_ipv6()).copied());
    samples.extend(expected.iter().rfind(|ip| ip.is_ipv4()).copied());
    let families: Vec<IpAddr> = vec![objects::cluster_ip_v4(0).into(), objects::cluster_ip_v6(1).into()];
    let started = daemon.started;
    let deadline = started + Duration::from_secs(timeout_s);
    node.run_in(|| -> anyhow::Result<(f64, bool)> {
        let mut probe = KernelProbe::open()?;
        let live = |probe: &mut KernelProbe| -> anyhow::Result<bool> {
            for family in &families {
                let hooked = probe.iptables_rules(*family, "nat", "PREROUTING")?.unwrap_or_default();
                if !kernel::mention(&hooked, b"KUBE-SERVICES") {
                    return Ok(false);
                }
            }
            let mut dispatch: Vec<Vec<Vec<u8>>> = Vec::new();
            for family in &families {
                dispatch.push(probe.iptables_rules(*family, "nat", "KUBE-SERVICES")?.unwrap_or_default());
            }
            Ok(samples.iter().all(|ip| kernel::mention(&dispatch[usize::from(ip.is_ipv6())], &kernel::ip_bytes(*ip))))
        };
        let complete = |probe: &mut KernelProbe| -> anyhow::Result<bool> {
            let mut seen: HashSet<Vec<u8>> = HashSet::new();
            for (family, width) in families.iter().zip([4, 16]) {
                for rule in probe.iptables_rules(*family, "nat", "KUBE-SERVICES")?.unwrap_or_default() {
                    seen.extend(rule.windows(width).map(<[u8]>::to_vec));
                }
            }
            Ok(expected.iter().all(|ip| seen.contains(&kernel::ip_bytes(*ip))))
        };
        let mut by_listing = false;
        loop {
            anyhow::ensure!(daemon.alive(), "kproxy exited before its first sync");
            anyhow::ensure!(Instant::now() < deadline, "no first sync in the kernel after {timeout_s} s");
            if live(&mut probe)? {
                let at = started.elapsed().as_secs_f64();
                if complete(&mut probe)? {
                    return Ok((if by_listing { started.elapsed().as_secs_f64() } else { at }, by_listing));
                }
                by_listing = true;
            }
            std::thread::sleep(IPTABLES_POLL);
        }
    })?
}

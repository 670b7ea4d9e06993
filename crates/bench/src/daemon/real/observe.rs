//! Upstream kube-proxy's rules seen in the kernel, by the same netlink probe that watches
//! kproxy's: its start (every ClusterIP in its `service-ips` maps), and a changed endpoint (its
//! endpoint chain exists: upstream writes the chain and the Service's new pick of endpoints in
//! one transaction per family).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use kproxy_nft_model::{Key, Value};
use kproxy_nft_netlink::lower::element_key;
use kproxy_state::Protocol;
use kproxy_testbed::Netns;

use super::super::kernel::{KernelProbe, MapKey};
use super::super::kproxy::Kproxy;
use super::super::objects::{self, Layout, Shape};
use super::upstream::{NFT_TABLE, SERVICE_IPS};

/// How often the kernel is polled while waiting for the first sync.
const START_POLL: Duration = Duration::from_millis(5);
/// Services looked up while waiting.
const START_SAMPLES: usize = 64;

/// The `service-ips` key of a ClusterIP: `address . tcp . port`.
fn service_key(ip: IpAddr, port: u16) -> MapKey {
    let key = Key(vec![Value::Addr(ip), Value::Proto(Protocol::Tcp), Value::Port(port)]);
    MapKey { ip, map: SERVICE_IPS.to_owned(), key: element_key(&key).map(|k| k.start).unwrap_or_default() }
}

/// Every Service's ClusterIP keys, both families (the big Service's, IPv4, last).
pub(crate) fn expected(n: usize, layout: Layout) -> Vec<MapKey> {
    let mut keys = Vec::new();
    for i in 0..n {
        let port = objects::service_port(i);
        let v4: IpAddr = objects::cluster_ip_v4(i).into();
        keys.push(service_key(v4, port));
        if Shape::of(i).dual_stack && i > 0 {
            let v6: IpAddr = objects::cluster_ip_v6(i).into();
            keys.push(service_key(v6, port));
        }
    }
    if layout.big > 0 {
        let big: IpAddr = objects::cluster_ip_v4(n).into();
        keys.push(service_key(big, 80));
    }
    keys
}

/// Upstream nftables mode: waits until both families' `service-ips` maps hold every Service's
/// ClusterIP (sampled lookups every 5 ms, then one dump of each map to confirm); seconds since
/// the process was spawned, and whether the dumps (not the samples) decided it.
pub fn wait_upstream_nft(
    node: &Netns,
    n: usize,
    layout: Layout,
    daemon: &mut Kproxy,
    timeout_s: u64,
) -> anyhow::Result<(f64, bool)> {
    let expected = expected(n, layout);
    let step = (expected.len() / START_SAMPLES).max(1);
    let mut samples: Vec<MapKey> = expected.iter().step_by(step).cloned().collect();
    samples.extend(expected.iter().rfind(|k| k.ip.is_ipv6()).cloned());
    samples.extend(expected.last().cloned());
    let started = daemon.started;
    let deadline = started + Duration::from_secs(timeout_s);
    node.run_in(|| -> anyhow::Result<(f64, bool)> {
        let mut probe = KernelProbe::open_table(NFT_TABLE)?;
        let mut by_listing = false;
        loop {
            anyhow::ensure!(daemon.alive(), "kube-proxy exited before its first sync");
            anyhow::ensure!(Instant::now() < deadline, "no first sync of kube-proxy in the kernel after {timeout_s} s");
            let mut sampled = true;
            for k in &samples {
                if !probe.has_key(k)? {
                    sampled = false;
                    break;
                }
            }
            if sampled {
                let at = started.elapsed().as_secs_f64();
                if probe.has_all_keys(&expected)? {
                    return Ok((if by_listing { started.elapsed().as_secs_f64() } else { at }, by_listing));
                }
                by_listing = true;
            }
            std::thread::sleep(START_POLL);
        }
    })?
}

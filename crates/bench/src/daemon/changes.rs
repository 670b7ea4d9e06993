//! EndpointSlice changes made at the API server, and when the kernel shows them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use kproxy_kube_source::fake::FakeApiServer;
use kproxy_state::Kind;
use kproxy_testbed::Netns;

use super::api::NODE_NAME;
use super::kernel::{self, KernelProbe, MapKey};
use super::kproxy::{Kproxy, full_syncs};
use super::objects::{self, Shape, TARGET_PORT};
use super::{DaemonArgs, Mode, commit};

/// A change not visible after this long counts as not observed.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Slots looked at for a changed endpoint beyond a Service's endpoints (a change replaces one).
const SPARE_SLOTS: u32 = 3;
/// How often the kernel is polled while waiting for a burst to be programmed.
const BURST_POLL: Duration = Duration::from_millis(5);

/// The changes made and what the kernel showed of them.
pub struct Changes {
    /// Latency of each timed change, `None` when not observed.
    pub timed: Vec<Option<f64>>,
    pub burst: usize,
    /// Last burst change stored → the kernel showing every changed Service's final endpoints.
    pub burst_settled: Option<f64>,
    pub total: usize,
    pub observed: usize,
    pub full_syncs: Option<f64>,
}

/// The Service change `k` goes to: spread over the cluster, never the real pod's Service nor an
/// affinity Service (whose endpoints are rules, not map elements).
pub(crate) fn changed_service(k: usize, n: usize) -> usize {
    let mut i = 1 + (k * 7919 + 13) % (n - 1);
    if Shape::of(i).affinity {
        i = if i + 1 < n { i + 1 } else { 1 };
    }
    i
}

/// The Service changes one at a time: each replaces one endpoint address with a new one (a pod
/// of a rollout replaced).
struct Changer<'a> {
    server: &'a FakeApiServer,
    mode: Mode,
    n: usize,
    /// Endpoints per Service.
    per: usize,
    web_pod: IpAddr,
    current: HashMap<usize, objects::Endpoints>,
}

impl Changer<'_> {
    /// Makes change `k`; returns the Service changed and the address it brought in.
    fn change(&mut self, k: usize) -> (usize, IpAddr) {
        let i = changed_service(k, self.n);
        let web_pod = self.web_pod;
        let per = self.per;
        let eps =
            self.current.entry(i).or_insert_with(|| objects::initial_endpoints(i, false, (web_pod, NODE_NAME), per));
        let fresh: IpAddr = objects::fresh_endpoint(k).into();
        let j = k % eps.len();
        eps[j].0 = fresh;
        let trigger = kproxy_servers::rfc3339_nano(Some(std::time::SystemTime::now()));
        self.server.apply(Kind::EndpointSlice, objects::slice(i, false, eps, &trigger));
        (i, fresh)
    }

    /// Whether the kernel holds every endpoint the bench last gave Service `i`.
    fn in_kernel(&self, probe: &mut KernelProbe, i: usize) -> anyhow::Result<bool> {
        let Some(eps) = self.current.get(&i) else { return Ok(true) };
        let ip: IpAddr = objects::cluster_ip_v4(i).into();
        if self.mode == Mode::Iptables {
            let rules = probe.iptables_rules(ip, "nat", &objects::svc_chain(i))?.unwrap_or_default();
            return Ok(eps.iter().all(|(ep, _)| kernel::mention(&rules, &kernel::ip_bytes(*ep))));
        }
        let port = objects::service_port(i);
        let mut found = Vec::new();
        for slot in 0..self.per as u32 + SPARE_SLOTS {
            if let Some(data) = probe.key_data(&MapKey::endpoint(ip, port, slot, eps.len()))? {
                found.push(data);
            }
        }
        Ok(eps.iter().all(|(ep, _)| found.contains(&kernel::endpoint_data(*ep, TARGET_PORT))))
    }
}

/// `--changes` changes at the chosen interval, each timed from the API server's store to the
/// kernel showing the new address in one of the Service's slots; then the rest of
/// `--total-changes` as a burst at `--burst-per-second`, and the time until the kernel shows
/// the final endpoints of every Service changed.
pub fn make(
    mode: Mode,
    node: &Netns,
    server: &FakeApiServer,
    web_pod: IpAddr,
    n: usize,
    args: &DaemonArgs,
    daemon: &mut Kproxy,
) -> anyhow::Result<Changes> {
    let total = args.total_changes.max(args.changes);
    let full_before = full_syncs(node);
    let mut changer = Changer { server, mode, n, per: args.endpoints, web_pod, current: HashMap::new() };
    let slots = args.endpoints as u32 + SPARE_SLOTS;
    let interval = args.change_interval();
    let mut changes = Changes {
        timed: Vec::new(),
        burst: total - args.changes,
        burst_settled: None,
        total,
        observed: 0,
        full_syncs: None,
    };
    node.run_in(|| -> anyhow::Result<()> {
        let mut probe = KernelProbe::open()?;
        let mut monitor = commit::monitor(&commit::tables(mode, kernel::TABLE))?;
        let mut next = Instant::now();
        for k in 0..args.changes {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            next += interval;
            let fresh: IpAddr = objects::fresh_endpoint(k).into();
            let want = kernel::endpoint_data(fresh, TARGET_PORT);
            let sent = Instant::now();
            let (i, _) = changer.change(k);
            let ip: IpAddr = objects::cluster_ip_v4(i).into();
            let chain = objects::svc_chain(i);
            let latency = commit::wait(sent, CHANGE_TIMEOUT, &mut monitor, || {
                Ok(match mode {
                    Mode::Nftables => probe.endpoint_in_slots(ip, objects::service_port(i), slots, &want)?,
                    Mode::Iptables => probe
                        .iptables_rules(ip, "nat", &chain)?
                        .is_some_and(|rules| kernel::mention(&rules, &kernel::ip_bytes(fresh))),
                })
            })?;
            changes.observed += usize::from(latency.is_some());
            changes.timed.push(latency);
            anyhow::ensure!(daemon.alive(), "kproxy exited during the changes");
        }
        changes.full_syncs = full_syncs(node).zip(full_before).map(|(a, b)| a - b);

        let pace = Duration::from_secs_f64(1.0 / args.burst_per_second.max(0.001));
        let mut burst_services: HashMap<usize, usize> = HashMap::new();
        let mut next = Instant::now();
        for k in args.changes..total {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            next += pace;
            let (i, _) = changer.change(k);
            *burst_services.entry(i).or_default() += 1;
        }
        let last = Instant::now();
        let mut pending: Vec<usize> = burst_services.keys().copied().collect();
        while !pending.is_empty() && last.elapsed() < CHANGE_TIMEOUT {
            let mut still = Vec::new();
            for i in pending {
                if !changer.in_kernel(&mut probe, i)? {
                    still.push(i);
                }
            }
            pending = still;
            if pending.is_empty() {
                changes.burst_settled = Some(last.elapsed().as_secs_f64() * 1000.0);
            } else {
                std::thread::sleep(BURST_POLL);
            }
        }
        changes.observed += burst_services.iter().filter(|(i, _)| !pending.contains(i)).map(|(_, k)| k).sum::<usize>();
        anyhow::ensure!(daemon.alive(), "kproxy exited during the changes");
        Ok(())
    })??;
    Ok(changes)
}

impl Changes {
    /// Latencies of the timed changes the kernel showed, ms, sorted.
    pub fn timed_observed(&self) -> Vec<f64> {
        let mut v: Vec<f64> = self.timed.iter().flatten().copied().collect();
        v.sort_by(f64::total_cmp);
        v
    }
}

//! One cluster size, end to end: sandbox, API server, kproxy; then the figures in order — start
//! to first sync in the kernel, the idle window, endpoint changes, memory, the connection rate,
//! and the restart gap — and teardown.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use kproxy_state::Kind;
use kproxy_testbed::{Netns, Proto, Testbed, Where};
use serde::{Deserialize, Serialize};

use super::DaemonArgs;
use super::api::{Api, NODE_NAME};
use super::kernel::{self, KernelProbe};
use super::kproxy::{self, Kproxy};
use super::objects::{self, ENDPOINTS, Shape, TARGET_PORT};
use super::traffic::{self, ConnectionRates, Prober};

/// The real pod's port for connections straight to it (the Service's is `TARGET_PORT`).
const DIRECT_PORT: u16 = 8081;
/// How often the kernel is polled while waiting for the first sync.
const START_POLL: Duration = Duration::from_millis(5);
/// How often the kernel is polled while waiting for one change.
const CHANGE_POLL: Duration = Duration::from_micros(200);
/// A change not visible after this long counts as not observed.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Services whose keys are looked up while waiting for the first sync.
const START_SAMPLES: usize = 64;
/// Time left to kproxy after the first sync before the idle window opens.
const SETTLE: Duration = Duration::from_secs(5);
/// Slots looked at for a changed endpoint (a Service has at most 6 endpoints during a change).
const SLOTS: u32 = 8;
/// Connection attempts of the restart prober: one every…
const PROBE_INTERVAL: Duration = Duration::from_millis(5);
/// Attempts before the kill, and after the restarted kproxy's first full sync.
const PROBE_MARGIN: Duration = Duration::from_secs(2);

/// Everything measured at one size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SizeResult {
    pub services: usize,
    /// Endpoints in all slices (both families).
    pub endpoints: usize,
    pub dual_stack: usize,
    /// JSON bytes of every object the API server holds.
    pub object_bytes: usize,
    /// Spawn → the kernel holds the hooked base chains of both tables and every Service's
    /// ClusterIP endpoints, seconds.
    pub start_s: f64,
    /// True when the sampled lookups passed before the whole ruleset was there, so the start was
    /// timed by full listings (resolution: one listing).
    pub start_by_listing: bool,
    pub idle_s: f64,
    /// CPU of kproxy (user + system, all threads) over the idle window, % of one core.
    pub idle_cpu_pct: f64,
    /// Full syncs kproxy reported during the idle window (its /metrics; context only).
    pub idle_full_syncs: Option<f64>,
    /// Programming latencies of the timed changes, ms, sorted (only observed ones).
    pub change_ms: Vec<f64>,
    pub changes_timed: usize,
    /// Full syncs kproxy reported while the timed changes ran (its /metrics; context only).
    pub changes_full_syncs: Option<f64>,
    /// Changes of the burst that followed, at `burst_rate` per second.
    pub burst_changes: usize,
    pub burst_rate: f64,
    /// Last burst change stored → the kernel showing every changed Service's final
    /// endpoints, ms (`None`: not within the give-up time).
    pub burst_settled_ms: Option<f64>,
    /// Changes made in all, and how many of them the kernel showed.
    pub changes_total: usize,
    pub changes_observed: usize,
    /// VmRSS at the end of the idle window, MiB.
    pub rss_steady_mib: f64,
    /// VmRSS one second after the last change, MiB.
    pub rss_after_changes_mib: f64,
    /// The peak RSS before the restart, MiB: the larger of `VmHWM` and `VmRSS` sampled every 20 ms.
    pub rss_peak_mib: f64,
    pub rates: ConnectionRates,
    /// The restart: attempts, failures before the kill (a healthy run has none), failures
    /// from the kill on, the longest outage, and the time from the kill to the restarted
    /// kproxy's first full sync (its /metrics; it bounds the watch, it is not a figure).
    pub restart_attempts: usize,
    pub restart_failed_before_kill: usize,
    pub restart_failed: usize,
    pub restart_outage_ms: f64,
    pub restart_synced_after_s: f64,
}

/// The pods and the API server of one run.
struct Sandbox {
    // Dropped in this order (kproxy, a local of the caller, went first): the API server, the
    // pods, the rest of the namespaces.
    api: Api,
    web: std::sync::Arc<kproxy_testbed::Pod>,
    client: std::sync::Arc<kproxy_testbed::Pod>,
    prober: std::sync::Arc<kproxy_testbed::Pod>,
    tb: Testbed,
}

pub fn measure(n: usize, args: &DaemonArgs, binary: &Path, log_dir: &Path) -> anyhow::Result<SizeResult> {
    let tb = Testbed::new()?;
    let web = tb.add_pod("web", Where::Node)?;
    // The Service's port, and one for connections straight to the pod: were they the same, a
    // ClusterIP connection's reply tuple (pod:port → client:p) would meet the conntrack entry
    // of an earlier direct connection from the same client port, and NAT would have to find
    // the client another port, a cost that is the benchmark's, not kproxy's.
    web.serve(&[(Proto::Tcp, TARGET_PORT), (Proto::Tcp, DIRECT_PORT)])?;
    let client = tb.add_pod("client", Where::Node)?;
    // Room for the connection-rate phases.
    client.netns().sysctl("net.ipv4.ip_local_port_range", "1024 65535")?;
    // The restart prober has an address of its own, so none of its connections meets a
    // conntrack entry of the rate phases.
    let prober = tb.add_pod("prober", Where::Node)?;
    let api = Api::start(tb.node(), n, web.ipv4().into())?;
    let sandbox = Sandbox { api, web, client, prober, tb };
    let (endpoints, dual_stack) = counts(n);

    let run_dir = log_dir.join(format!("kproxy-bench-daemon-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&run_dir)?;
    let kubeconfig = run_dir.join("kubeconfig");
    sandbox.api.write_kubeconfig(&kubeconfig)?;
    let kproxy_args = kproxy::args(&kubeconfig, NODE_NAME);
    let log = run_dir.join("kproxy.log");
    eprintln!("  kproxy log: {}", log.display());

    let mut daemon = Kproxy::start(sandbox.tb.node(), binary, &kproxy_args, &log)?;
    let memory_watch = daemon.watch_memory();
    let (start_s, start_by_listing) = wait_first_sync(sandbox.tb.node(), n, &mut daemon, args)?;
    eprintln!("  first sync in the kernel after {start_s:.2} s");

    std::thread::sleep(SETTLE);
    let idle = Duration::from_secs(args.idle);
    let full_before = full_syncs(&sandbox);
    let cpu_before = daemon.cpu_seconds()?;
    let idle_started = Instant::now();
    std::thread::sleep(idle);
    let idle_s = idle_started.elapsed().as_secs_f64();
    let idle_cpu_pct = (daemon.cpu_seconds()? - cpu_before) / idle_s * 100.0;
    let idle_full_syncs = full_syncs(&sandbox).zip(full_before).map(|(a, b)| a - b);
    let rss_steady_mib = daemon.memory_mib()?.rss;
    eprintln!("  idle: {idle_cpu_pct:.1} % of a core over {idle_s:.0} s, RSS {rss_steady_mib:.0} MiB");

    let changes = make_changes(&sandbox, n, args, &mut daemon)?;
    std::thread::sleep(Duration::from_secs(1));
    let memory = daemon.memory_mib()?;
    let rss_peak_mib = memory_watch.stop().max(memory.peak);
    eprintln!("  {} of {} changes observed; RSS {:.0} MiB", changes.observed, changes.total, memory.rss);

    let web_ip: IpAddr = sandbox.web.ipv4().into();
    let service: SocketAddr = (IpAddr::from(objects::cluster_ip_v4(0)), objects::service_port(0)).into();
    let rates = traffic::connection_rates(
        sandbox.client.netns(),
        (web_ip, DIRECT_PORT).into(),
        service,
        sandbox.web.name(),
        Duration::from_secs(args.rate_phase),
    )?;
    eprintln!("  connections/s: straight {:.0}, via ClusterIP {:.0}", rates.direct, rates.cluster_ip);

    let restart = restart_gap(&sandbox, daemon, binary, &kproxy_args, &log, service, start_s)?;
    eprintln!("  restart: {} of {} attempts failed", restart.failed, restart.attempts);

    Ok(SizeResult {
        services: n,
        endpoints,
        dual_stack,
        object_bytes: sandbox.api.object_bytes,
        start_s,
        start_by_listing,
        idle_s,
        idle_cpu_pct,
        idle_full_syncs,
        changes_timed: changes.timed.len(),
        change_ms: {
            let mut v: Vec<f64> = changes.timed.iter().flatten().copied().collect();
            v.sort_by(f64::total_cmp);
            v
        },
        changes_full_syncs: changes.full_syncs,
        burst_changes: changes.burst,
        burst_rate: args.burst_per_second,
        burst_settled_ms: changes.burst_settled,
        changes_total: changes.total,
        changes_observed: changes.observed,
        rss_steady_mib,
        rss_after_changes_mib: memory.rss,
        rss_peak_mib,
        rates,
        restart_attempts: restart.attempts,
        restart_failed_before_kill: restart.failed_before_kill,
        restart_failed: restart.failed,
        restart_outage_ms: restart.outage.as_secs_f64() * 1000.0,
        restart_synced_after_s: restart.synced_after.as_secs_f64(),
    })
}

/// Endpoints in all slices, and dual-stack Services, of a cluster of `n`.
fn counts(n: usize) -> (usize, usize) {
    let dual = (1..n).filter(|i| Shape::of(*i).dual_stack).count();
    (1 + (n - 1) * ENDPOINTS + dual * ENDPOINTS, dual)
}

fn full_syncs(sandbox: &Sandbox) -> Option<f64> {
    full_syncs_in(sandbox.tb.node())
}

/// The ClusterIP keys (`address . tcp . port . slot` for every slot) the first sync must have
/// put in the endpoints maps: every Service but the affinity ones, whose endpoints are rules.
fn expected_keys(n: usize) -> Vec<(IpAddr, Vec<u8>)> {
    let mut keys = Vec::new();
    for i in (0..n).filter(|i| !Shape::of(*i).affinity) {
        let port = objects::service_port(i);
        let slots = if i == 0 { 1 } else { ENDPOINTS as u32 };
        let mut ips: Vec<IpAddr> = vec![objects::cluster_ip_v4(i).into()];
        if Shape::of(i).dual_stack && i > 0 {
            ips.push(objects::cluster_ip_v6(i).into());
        }
        for ip in ips {
            keys.extend((0..slots).map(|slot| (ip, kernel::endpoint_key(ip, port, slot))));
        }
    }
    keys
}

/// Whether every expected key is in the kernel (one dump of the map per family).
fn all_programmed(probe: &mut KernelProbe, expected: &[(IpAddr, Vec<u8>)]) -> anyhow::Result<bool> {
    let v4 = probe.map_keys(objects::cluster_ip_v4(0).into(), kernel::CLUSTER_TCP_ENDPOINTS)?;
    let v6 = probe.map_keys(objects::cluster_ip_v6(0).into(), kernel::CLUSTER_TCP_ENDPOINTS)?;
    Ok(expected.iter().all(|(ip, key)| if ip.is_ipv4() { v4.contains(key) } else { v6.contains(key) }))
}

/// Waits until the first sync is in the kernel; returns the seconds since kproxy was spawned
/// and whether full listings (rather than the sampled lookups) decided it.
fn wait_first_sync(node: &Netns, n: usize, daemon: &mut Kproxy, args: &DaemonArgs) -> anyhow::Result<(f64, bool)> {
    let expected = expected_keys(n);
    // Evenly spread samples, the last Service included.
    let step = (expected.len() / START_SAMPLES).max(1);
    let mut samples: Vec<(IpAddr, Vec<u8>)> = expected.iter().step_by(step).cloned().collect();
    samples.extend(expected.last().cloned());
    let started = daemon.started;
    let deadline = started + Duration::from_secs(args.start_timeout);
    let v4: IpAddr = objects::cluster_ip_v4(0).into();
    let v6: IpAddr = objects::cluster_ip_v6(0).into();
    node.run_in(|| -> anyhow::Result<(f64, bool)> {
        let mut probe = KernelProbe::open()?;
        let live = |probe: &mut KernelProbe| -> anyhow::Result<bool> {
            if !(probe.chain_exists(v4, kernel::HOOKED_CHAIN)? && probe.chain_exists(v6, kernel::HOOKED_CHAIN)?) {
                return Ok(false);
            }
            for (ip, key) in &samples {
                if probe.element_data(*ip, kernel::CLUSTER_TCP_ENDPOINTS, key)?.is_none() {
                    return Ok(false);
                }
            }
            Ok(true)
        };
        let mut by_listing = false;
        loop {
            anyhow::ensure!(daemon.alive(), "kproxy exited before its first sync");
            anyhow::ensure!(Instant::now() < deadline, "no first sync in the kernel after {} s", args.start_timeout);
            if !by_listing && live(&mut probe)? {
                let at = started.elapsed().as_secs_f64();
                if all_programmed(&mut probe, &expected)? {
                    return Ok((at, false));
                }
                by_listing = true;
            }
            if by_listing && live(&mut probe)? && all_programmed(&mut probe, &expected)? {
                return Ok((started.elapsed().as_secs_f64(), true));
            }
            std::thread::sleep(START_POLL);
        }
    })?
}

/// The changes made and what the kernel showed of them.
struct Changes {
    /// Latency of each timed change, `None` when not observed.
    timed: Vec<Option<f64>>,
    burst: usize,
    /// Last burst change stored → the kernel showing every changed Service's final endpoints.
    burst_settled: Option<f64>,
    total: usize,
    observed: usize,
    full_syncs: Option<f64>,
}

/// The Service change `k` goes to: spread over the cluster, never the real pod's Service nor an
/// affinity Service (whose endpoints are rules, not map elements).
fn changed_service(k: usize, n: usize) -> usize {
    let mut i = 1 + (k * 7919 + 13) % (n - 1);
    if Shape::of(i).affinity {
        i = if i + 1 < n { i + 1 } else { 1 };
    }
    i
}

/// The Service changes one at a time: each replaces one endpoint address with a new one (a pod
/// of a rollout replaced).
struct Changer<'a> {
    server: &'a kproxy_kube_source::fake::FakeApiServer,
    n: usize,
    web_pod: IpAddr,
    current: HashMap<usize, objects::Endpoints>,
}

impl Changer<'_> {
    /// Makes change `k`; returns the Service changed and the address it brought in.
    fn change(&mut self, k: usize) -> (usize, IpAddr) {
        let i = changed_service(k, self.n);
        let web_pod = self.web_pod;
        let eps = self.current.entry(i).or_insert_with(|| objects::initial_endpoints(i, false, (web_pod, NODE_NAME)));
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
        let port = objects::service_port(i);
        let mut found = Vec::new();
        for slot in 0..SLOTS {
            if let Some(data) =
                probe.element_data(ip, kernel::CLUSTER_TCP_ENDPOINTS, &kernel::endpoint_key(ip, port, slot))?
            {
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
fn make_changes(sandbox: &Sandbox, n: usize, args: &DaemonArgs, daemon: &mut Kproxy) -> anyhow::Result<Changes> {
    let total = args.total_changes.max(args.changes);
    let full_before = full_syncs(sandbox);
    let mut changer =
        Changer { server: &sandbox.api.server, n, web_pod: sandbox.web.ipv4().into(), current: HashMap::new() };
    let interval = args.change_interval();
    let mut changes = Changes {
        timed: Vec::new(),
        burst: total - args.changes,
        burst_settled: None,
        total,
        observed: 0,
        full_syncs: None,
    };
    let node = sandbox.tb.node();
    node.run_in(|| -> anyhow::Result<()> {
        let mut probe = KernelProbe::open()?;
        let mut next = Instant::now();
        for k in 0..args.changes {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            next += interval;
            let want = kernel::endpoint_data(objects::fresh_endpoint(k).into(), TARGET_PORT);
            let sent = Instant::now();
            let (i, _) = changer.change(k);
            let ip: IpAddr = objects::cluster_ip_v4(i).into();
            let mut latency = None;
            while sent.elapsed() < CHANGE_TIMEOUT {
                if probe.endpoint_in_slots(ip, objects::service_port(i), SLOTS, &want)? {
                    latency = Some(sent.elapsed().as_secs_f64() * 1000.0);
                    break;
                }
                std::thread::sleep(CHANGE_POLL);
            }
            changes.observed += usize::from(latency.is_some());
            changes.timed.push(latency);
            anyhow::ensure!(daemon.alive(), "kproxy exited during the changes");
        }
        changes.full_syncs = full_syncs_in(node).zip(full_before).map(|(a, b)| a - b);

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
                std::thread::sleep(START_POLL);
            }
        }
        changes.observed += burst_services.iter().filter(|(i, _)| !pending.contains(i)).map(|(_, k)| k).sum::<usize>();
        anyhow::ensure!(daemon.alive(), "kproxy exited during the changes");
        Ok(())
    })??;
    Ok(changes)
}

/// Full syncs kproxy has reported (counted in the IPv4 family: each sync counts once per family).
fn full_syncs_in(node: &Netns) -> Option<f64> {
    kproxy::metric(node, "kubeproxy_sync_full_proxy_rules_duration_seconds_count", "ip_family=\"IPv4\"")
}

struct Restart {
    attempts: usize,
    failed_before_kill: usize,
    failed: usize,
    outage: Duration,
    synced_after: Duration,
}

/// Connects to the real pod's ClusterIP continuously while kproxy is killed (SIGKILL) and
/// started again, until the new kproxy has reported its first full sync plus a margin.
fn restart_gap(
    sandbox: &Sandbox,
    daemon: Kproxy,
    binary: &Path,
    kproxy_args: &[String],
    log: &Path,
    service: SocketAddr,
    start_s: f64,
) -> anyhow::Result<Restart> {
    let prober = Prober::start(sandbox.prober.netns(), service, sandbox.web.name(), PROBE_INTERVAL)?;
    std::thread::sleep(PROBE_MARGIN);
    let killed = prober.started.elapsed();
    let kill_at = Instant::now();
    daemon.kill()?;
    let mut daemon = Kproxy::start(sandbox.tb.node(), binary, kproxy_args, log)?;
    // Generous: the restart may take longer than the first start, but not without bound.
    let deadline = Instant::now() + Duration::from_secs_f64(60.0 + 5.0 * start_s);
    let synced_after = loop {
        if full_syncs(sandbox).is_some_and(|n| n >= 1.0) {
            break kill_at.elapsed();
        }
        if Instant::now() > deadline || !daemon.alive() {
            let _ = prober.stop();
            anyhow::bail!("the restarted kproxy reported no full sync (see {})", log.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(PROBE_MARGIN);
    let probes = prober.stop()?;
    drop(daemon);
    let (before, after): (Vec<_>, Vec<_>) = probes.attempts.iter().partition(|(at, _)| *at < killed);
    let after = traffic::ProbeLog { attempts: after };
    Ok(Restart {
        attempts: probes.attempts.len(),
        failed_before_kill: before.iter().filter(|(_, ok)| !ok).count(),
        failed: after.failed(),
        outage: after.longest_outage(),
        synced_after,
    })
}

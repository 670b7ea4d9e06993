//! One cluster size, end to end: sandbox, API server, kproxy; then the figures in order — start
//! to first sync in the kernel, the idle window, endpoint changes, memory, the big Service's
//! changes and rollout (`--big-service`), the connection rate, and the restart gap — and
//! teardown.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use kproxy_testbed::{Proto, Testbed, Where};
use serde::{Deserialize, Serialize};

use super::api::{Api, NODE_NAME};
use super::big::{self, BigResult, BigState};
use super::kproxy::{self, Kproxy};
use super::objects::{self, Layout, TARGET_PORT};
use super::traffic::{self, ConnectionRates, Prober};
use super::{DaemonArgs, Mode, Proxy, changes, first_sync};

/// The real pod's port for connections straight to it (the Service's is `TARGET_PORT`).
const DIRECT_PORT: u16 = 8081;
/// Time left to kproxy after the first sync before the idle window opens.
const SETTLE: Duration = Duration::from_secs(5);
/// Connection attempts of the restart prober: one every…
const PROBE_INTERVAL: Duration = Duration::from_millis(5);
/// Attempts before the kill, and after the restarted kproxy's first full sync.
const PROBE_MARGIN: Duration = Duration::from_secs(2);

/// Everything measured at one size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SizeResult {
    pub services: usize,
    pub mode: Mode,
    /// Endpoints per Service and the big Service's.
    #[serde(default)]
    pub layout: Layout,
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
    /// The big Service's changes and rollout (`--big-service`).
    #[serde(default)]
    pub big: Option<BigResult>,
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

pub fn measure(n: usize, mode: Mode, args: &DaemonArgs, binary: &Path, log_dir: &Path) -> anyhow::Result<SizeResult> {
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
    let layout = args.layout();
    let api = Api::start(tb.node(), n, web.ipv4().into(), layout)?;
    let sandbox = Sandbox { api, web, client, prober, tb };
    let dual_stack = (1..n).filter(|i| objects::Shape::of(*i).dual_stack).count();
    let endpoints = layout.endpoint_count(n);

    let run_dir = log_dir.join(format!("kproxy-bench-daemon-{}-{n}-{}", std::process::id(), mode.as_str()));
    std::fs::create_dir_all(&run_dir)?;
    let kubeconfig = run_dir.join("kubeconfig");
    sandbox.api.write_kubeconfig(&kubeconfig)?;
    let mut kproxy_args = kproxy::args(&kubeconfig, NODE_NAME, mode);
    kproxy_args.extend(args.kproxy_args.iter().cloned());
    let log = run_dir.join("kproxy.log");
    eprintln!("  kproxy log: {}", log.display());

    let mut daemon = Kproxy::start(sandbox.tb.node(), binary, &kproxy_args, &log)?;
    let memory_watch = daemon.watch_memory();
    let (start_s, start_by_listing) =
        first_sync::wait(sandbox.tb.node(), n, layout, &mut daemon, args.start_timeout, mode)?;
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

    let changes =
        changes::make(mode, sandbox.tb.node(), &sandbox.api.server, sandbox.web.ipv4().into(), n, args, &mut daemon)?;
    std::thread::sleep(Duration::from_secs(1));
    let memory = daemon.memory_mib()?;
    let rss_peak_mib = memory_watch.stop().peak.max(memory.peak);
    eprintln!("  {} of {} changes observed; RSS {:.0} MiB", changes.observed, changes.total, memory.rss);

    let big = if layout.big > 0 {
        let writer = big::Writer::Fake(&sandbox.api.server);
        let mut state = BigState::new(n, layout.big);
        Some(big::measure(sandbox.tb.node(), &writer, &mut state, Proxy::Kproxy, mode, args, &mut daemon)?)
    } else {
        None
    };

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
        mode,
        layout,
        endpoints,
        dual_stack,
        object_bytes: sandbox.api.object_bytes,
        start_s,
        start_by_listing,
        idle_s,
        idle_cpu_pct,
        idle_full_syncs,
        changes_timed: changes.timed.len(),
        change_ms: changes.timed_observed(),
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
        big,
    })
}

fn full_syncs(sandbox: &Sandbox) -> Option<f64> {
    kproxy::full_syncs(sandbox.tb.node())
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
    mut daemon: Kproxy,
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
    let after = traffic::ProbeLog { attempts: after, ..Default::default() };
    Ok(Restart {
        attempts: probes.attempts.len(),
        failed_before_kill: before.iter().filter(|(_, ok)| !ok).count(),
        failed: after.failed(),
        outage: after.longest_outage(),
        synced_after,
    })
}

//! `kproxy-bench soak`: many changes over a long run, against the real kproxy daemon (the same
//! sandbox, fake API server, cluster and kernel witness as `kproxy-bench daemon`). Every
//! checkpoint (100 changes by default) waits until the kernel shows every change made so far,
//! moves the real pod's Service to its other pod and checks with a connection that the new pod
//! answers, then records kproxy's RSS, open file descriptors and threads (from `/proc`), the
//! endpoint elements in the kernel, and kproxy's mean partial-sync duration over the window
//! (its `/metrics`). What must stay flat after warm-up is judged in the report.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kproxy_state::Kind;
use kproxy_testbed::{ProbeResult, Proto, Testbed, Where, probe};
use serde::Serialize;

use crate::churn::Churn;
use crate::daemon::api::{Api, NODE_NAME};
use crate::daemon::kernel::{self, KernelProbe};
use crate::daemon::kproxy::{self, Kproxy};
use crate::daemon::objects::{self, Layout, TARGET_PORT};
use crate::daemon::{Mode, first_sync};

/// Changes made per call to the churn (one create, one delete, the rest endpoint changes).
const BATCH: usize = 10;
/// Give up on a checkpoint after this long.
const CHECKPOINT_TIMEOUT: Duration = Duration::from_secs(60);

/// Soak the daemon with changes (root; builds its own network namespaces).
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// Services in the cluster (each with an EndpointSlice of 5 endpoints; 10% dual-stack).
    #[arg(long, default_value_t = 10_000)]
    pub services: usize,
    /// Changes in all (Services created and deleted, endpoints replaced).
    #[arg(long, default_value_t = 10_000)]
    pub changes: usize,
    /// Changes between two checkpoints.
    #[arg(long, default_value_t = 100)]
    pub checkpoint_every: usize,
    /// Changes per second.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// The kproxy binary (default: `kproxy` next to this executable).
    #[arg(long)]
    pub kproxy: Option<PathBuf>,
    /// Also write the checkpoints as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where kproxy's log goes.
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
}

/// One checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Checkpoint {
    pub changes: usize,
    /// Last change of the window stored → the kernel shows every change, ms.
    pub converged_ms: Option<f64>,
    /// The connection to the moved Service reached its new pod.
    pub packets_ok: bool,
    pub rss_mib: f64,
    pub fds: usize,
    pub threads: usize,
    /// ClusterIP endpoint elements in the kernel (IPv4).
    pub elements: usize,
    /// Mean partial-sync duration over the window, ms (kproxy's `/metrics`).
    pub mean_sync_ms: Option<f64>,
}

pub fn main(args: &SoakArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(kproxy_testbed::kernel::is_root(), "kproxy-bench soak needs root (it creates network namespaces)");
    anyhow::ensure!(args.checkpoint_every >= BATCH, "--checkpoint-every: at least {BATCH}");
    let n = args.services;
    anyhow::ensure!(
        n >= 100 && n + args.changes / BATCH + 1000 < objects::MAX_SERVICES,
        "--services/--changes: the created Services must fit the test ranges"
    );
    let binary = kproxy::binary(args.kproxy.as_deref())?;
    let run_dir = kproxy::run_dir(args.log_dir.as_deref(), "kproxy-bench-soak")?;

    let tb = Testbed::new()?;
    let pods = [tb.add_pod("web", Where::Node)?, tb.add_pod("web2", Where::Node)?];
    for pod in &pods {
        pod.serve(&[(Proto::Tcp, TARGET_PORT)])?;
    }
    let client = tb.add_pod("client", Where::Node)?;
    eprintln!("kproxy-bench soak: {n} services, {} changes ...", args.changes);
    let api = Api::start(tb.node(), n, pods[0].ipv4().into(), Layout::default())?;
    let kubeconfig = run_dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let log = run_dir.join("kproxy.log");
    eprintln!("  kproxy log: {}", log.display());
    let mut daemon = Kproxy::start(tb.node(), &binary, &kproxy::args(&kubeconfig, NODE_NAME, Mode::Nftables), &log)?;
    let (start_s, _) = first_sync::wait(tb.node(), n, Layout::default(), &mut daemon, 900, Mode::Nftables)?;
    eprintln!("  first sync in the kernel after {start_s:.2} s");

    let mut churn = Churn::new(n, pods[0].ipv4().into());
    let service: SocketAddr = (IpAddr::from(objects::cluster_ip_v4(0)), objects::service_port(0)).into();
    let pace = Duration::from_secs_f64(BATCH as f64 / args.rate.max(0.1));
    let mut checkpoints = Vec::new();
    let mut syncs = partial_syncs(&tb);
    let mut next = Instant::now();
    while churn.made() < args.changes {
        for _ in 0..args.checkpoint_every / BATCH {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            next += pace;
            churn.apply(&api.server, BATCH);
        }
        let converged_ms = churn.wait_converged(tb.node(), Instant::now(), CHECKPOINT_TIMEOUT, &[])?;
        // The real pod's Service moves to its other pod; a new connection must reach it.
        let to = &pods[(checkpoints.len() + 1) % 2];
        let trigger = kproxy_servers::rfc3339_nano(Some(std::time::SystemTime::now()));
        let endpoints = vec![(IpAddr::from(to.ipv4()), NODE_NAME.to_owned())];
        api.server.apply(Kind::EndpointSlice, objects::slice(0, false, &endpoints, &trigger));
        let packets_ok = answered_by(client.netns(), service, to.name());
        anyhow::ensure!(daemon.alive(), "kproxy exited during the soak (see {})", log.display());
        let now_syncs = partial_syncs(&tb);
        let mean_sync_ms = match (syncs, now_syncs) {
            (Some((s0, c0)), Some((s1, c1))) if c1 > c0 => Some((s1 - s0) / (c1 - c0) * 1000.0),
            _ => None,
        };
        syncs = now_syncs;
        let checkpoint = Checkpoint {
            changes: churn.made(),
            converged_ms,
            packets_ok,
            rss_mib: daemon.memory_mib()?.rss,
            fds: std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))?.count(),
            threads: threads(daemon.pid())?,
            elements: elements(&tb)?,
            mean_sync_ms,
        };
        eprintln!("  {}", serde_json::to_string(&checkpoint).unwrap_or_default());
        checkpoints.push(checkpoint);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&checkpoints)?)
            .with_context(|| format!("{}", path.display()))?;
    }
    let command: Vec<String> = std::env::args().collect();
    let (text, flat) = render(&command.join(" "), n, start_s, &checkpoints);
    print!("{text}");
    Ok(flat)
}

fn answered_by(client: &kproxy_testbed::Netns, service: SocketAddr, pod: &str) -> bool {
    let deadline = Instant::now() + CHECKPOINT_TIMEOUT;
    while Instant::now() < deadline {
        let got = probe(client, Proto::Tcp, service, Duration::from_millis(300));
        if matches!(&got, Ok(ProbeResult::Answered { backend, .. }) if backend == pod) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// kproxy's partial syncs so far: (seconds in all, count), IPv4.
fn partial_syncs(tb: &Testbed) -> Option<(f64, f64)> {
    let family = "ip_family=\"IPv4\"";
    let sum = kproxy::metric(tb.node(), "kubeproxy_sync_partial_proxy_rules_duration_seconds_sum", family)?;
    let count = kproxy::metric(tb.node(), "kubeproxy_sync_partial_proxy_rules_duration_seconds_count", family)?;
    Some((sum, count))
}

fn threads(pid: u32) -> anyhow::Result<usize> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:")?.trim().parse().ok())
        .context("no Threads: in /proc/<pid>/status")
}

fn elements(tb: &Testbed) -> anyhow::Result<usize> {
    let v4: IpAddr = objects::cluster_ip_v4(0).into();
    tb.node().run_in(|| -> anyhow::Result<usize> {
        let mut probe = KernelProbe::open()?;
        let mut count = 0;
        for map in kernel::all_cluster_tcp_endpoints() {
            count += probe.map_keys(v4, &map)?.len();
        }
        Ok(count)
    })?
}

/// The report: first checkpoint after warm-up (10% of the run) against the last; true when
/// everything stayed flat and every checkpoint converged with packets reaching the moved pod.
fn render(command: &str, n: usize, start_s: f64, checkpoints: &[Checkpoint]) -> (String, bool) {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "\n`{command}`\n");
    let _ = writeln!(out, "{n} Services × 5 endpoints; first sync in the kernel {start_s:.2} s after the start.\n");
    let (Some(warm), Some(last)) = (checkpoints.get(checkpoints.len() / 10), checkpoints.last()) else {
        return (out, false);
    };
    let mean = |f: fn(&Checkpoint) -> Option<f64>, part: &[Checkpoint]| {
        let v: Vec<f64> = part.iter().filter_map(f).collect();
        if v.is_empty() { f64::NAN } else { v.iter().sum::<f64>() / v.len() as f64 }
    };
    let tenth = (checkpoints.len() / 10).max(1);
    let early = &checkpoints[..tenth.min(checkpoints.len())];
    let late = &checkpoints[checkpoints.len() - tenth.min(checkpoints.len())..];
    let _ = writeln!(out, "| | after warm-up ({} changes) | at the end ({} changes) |", warm.changes, last.changes);
    let _ = writeln!(out, "|---|---|---|");
    let _ = writeln!(out, "| RSS | {:.0} MiB | {:.0} MiB |", warm.rss_mib, last.rss_mib);
    let _ = writeln!(out, "| open file descriptors | {} | {} |", warm.fds, last.fds);
    let _ = writeln!(out, "| threads | {} | {} |", warm.threads, last.threads);
    let _ = writeln!(out, "| ClusterIP endpoint elements (IPv4) | {} | {} |", warm.elements, last.elements);
    let ms = |v: f64, digits: usize| if v.is_nan() { "n/a".to_owned() } else { format!("{v:.digits$} ms") };
    let (sync_early, sync_late) = (mean(|c| c.mean_sync_ms, early), mean(|c| c.mean_sync_ms, late));
    let _ = writeln!(out, "| mean partial sync, first / last tenth | {} | {} |", ms(sync_early, 1), ms(sync_late, 1));
    let (conv_early, conv_late) = (mean(|c| c.converged_ms, early), mean(|c| c.converged_ms, late));
    let _ = writeln!(
        out,
        "| mean time to converge at a checkpoint, first / last tenth | {} | {} |",
        ms(conv_early, 0),
        ms(conv_late, 0)
    );
    let verified = checkpoints.iter().filter(|c| c.packets_ok && c.converged_ms.is_some()).count();
    let _ = writeln!(out, "\nCheckpoints verified in the kernel and by packets: {verified} of {}.", checkpoints.len());
    let flat = verified == checkpoints.len()
        && last.rss_mib <= warm.rss_mib * 1.10
        && last.fds <= warm.fds
        && last.threads <= warm.threads
        && last.elements.abs_diff(warm.elements) * 100 <= warm.elements.max(1)
        // NaN (no partial syncs measured in a window) does not count as growth.
        && sync_late.partial_cmp(&(sync_early * 1.5 + 1.0)) != Some(std::cmp::Ordering::Greater);
    let _ = writeln!(out, "Flat after warm-up (RSS +10%, fds, threads, elements ±1%, sync duration ×1.5): {flat}.");
    (out, flat)
}

//! `kproxy-bench explain-flood`: does a flood of `/debug/explain` questions delay the daemon's
//! syncs? The real kproxy daemon (nftables mode) in a sandbox's node namespace, against the
//! in-process fake API server; endpoint changes timed from the API server's store to the nf_tables
//! commit notice that put them in the kernel (as `kproxy-bench daemon` times them), in phases
//! with and without a flood of questions sent from the node itself (where `/debug/explain`
//! answers by default) to the metrics listener: quiet, flood, quiet, flood, side by side in one
//! run. The flood runs on keep-alive connections, as fast as the answers come back, up to
//! `--qps`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kproxy_state::Kind;
use kproxy_testbed::{Netns, Proto, Testbed, Where};

use crate::daemon::api::{Api, NODE_NAME};
use crate::daemon::kernel::{self, KernelProbe};
use crate::daemon::kproxy::{self, Kproxy};
use crate::daemon::objects::{self, Layout, TARGET_PORT};
use crate::daemon::{Mode, commit, first_sync};

/// Options.
#[derive(Debug, Clone, clap::Args)]
pub struct FloodArgs {
    /// Services in the cluster.
    #[arg(long, default_value_t = 1000)]
    pub services: usize,
    /// Timed endpoint changes per phase, one every `--change-interval-ms`.
    #[arg(long, default_value_t = 30)]
    pub changes: usize,
    /// Milliseconds between two timed changes (at least kproxy's minSyncPeriod, 1 s by
    /// default, as the daemon benchmark's: closer changes wait for the sync pacing).
    #[arg(long, default_value_t = 1000)]
    pub change_interval_ms: u64,
    /// The flood's target rate, questions a second (30,000 in #34's target).
    #[arg(long, default_value_t = 30_000)]
    pub qps: u64,
    /// Connections the flood keeps open (one thread each).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// The kproxy binary (default: `kproxy` next to this executable).
    #[arg(long)]
    pub kproxy: Option<std::path::PathBuf>,
}

/// The metrics listener kproxy runs with here (its default address).
const METRICS: &str = "127.0.0.1:10249";
/// A change not in the kernel after this long counts as lost.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);

/// One phase's figures.
#[derive(Debug)]
struct Phase {
    flood: bool,
    /// Change latencies (ms), sorted; lost changes are not in it.
    latencies: Vec<f64>,
    lost: usize,
    /// Questions sent, and by answer status (200, 429, other).
    asked: u64,
    answered: u64,
    limited: u64,
    seconds: f64,
}

pub fn main(args: &FloodArgs) -> anyhow::Result<bool> {
    let binary = kproxy::binary(args.kproxy.as_deref())?;
    let tb = Testbed::new()?;
    let web = tb.add_pod("web", Where::Node)?;
    web.serve(&[(Proto::Tcp, TARGET_PORT)])?;
    let n = args.services.max(2);
    let api = Api::start(tb.node(), n, web.ipv4().into(), Layout::default())?;
    let run_dir = kproxy::run_dir(None, "explain-flood")?;
    let kubeconfig = run_dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let mut kproxy_args = kproxy::args(&kubeconfig, NODE_NAME, Mode::Nftables);
    kproxy_args.push(format!("--metrics-bind-address={METRICS}"));
    let log = run_dir.join("kproxy.log");
    let mut daemon = Kproxy::start(tb.node(), &binary, &kproxy_args, &log)?;
    let (start_s, _) = first_sync::wait(tb.node(), n, Layout::default(), &mut daemon, 300, Mode::Nftables)?;
    eprintln!("explain-flood: {n} Services, first sync after {start_s:.2} s; kproxy log {}", log.display());
    std::thread::sleep(Duration::from_secs(2));

    let mut phases = Vec::new();
    let mut k = 0;
    for flood in [false, true, false, true] {
        let stop = AtomicBool::new(false);
        let counters = Counters::default();
        let started = Instant::now();
        let (latencies, lost) = std::thread::scope(|scope| -> anyhow::Result<(Vec<f64>, usize)> {
            if flood {
                let per = args.qps / args.connections.max(1) as u64;
                for _ in 0..args.connections.max(1) {
                    let (node, stop, counters) = (tb.node(), &stop, &counters);
                    scope.spawn(move || flood_one(node, per, stop, counters));
                }
            }
            let timed = timed_changes(tb.node(), &api, web.ipv4().into(), n, &mut k, args);
            stop.store(true, Ordering::Relaxed);
            timed
        })?;
        let seconds = started.elapsed().as_secs_f64();
        anyhow::ensure!(daemon.alive(), "kproxy exited during the run:\n{}", std::fs::read_to_string(&log)?);
        let phase = Phase {
            flood,
            latencies,
            lost,
            asked: counters.asked.load(Ordering::Relaxed),
            answered: counters.answered.load(Ordering::Relaxed),
            limited: counters.limited.load(Ordering::Relaxed),
            seconds,
        };
        eprintln!("  {}", line(&phase));
        phases.push(phase);
    }
    let (quiet, flooded): (Vec<&Phase>, Vec<&Phase>) = phases.iter().partition(|p| !p.flood);
    let merged = |ps: &[&Phase]| {
        let mut all: Vec<f64> = ps.iter().flat_map(|p| p.latencies.iter().copied()).collect();
        all.sort_by(f64::total_cmp);
        all
    };
    let (q, f) = (merged(&quiet), merged(&flooded));
    let (q50, f50) = (percentile(&q, 50.0), percentile(&f, 50.0));
    let ratio = f50 / q50;
    println!(
        "kproxy-bench explain-flood: {n} Services, {} changes per phase, flood target {} questions/s",
        args.changes, args.qps
    );
    for p in &phases {
        println!("  {}", line(p));
    }
    println!(
        "  change -> kernel p50: quiet {q50:.2} ms, under the flood {f50:.2} ms ({ratio:.2}x); p99 {:.2} vs {:.2} ms",
        percentile(&q, 99.0),
        percentile(&f, 99.0)
    );
    let lost: usize = phases.iter().map(|p| p.lost).sum();
    let met = ratio <= 1.10 && lost == 0;
    println!(
        "  target (#34): p50 under the flood within 10 % of quiet, no change lost: {}",
        if met { "met" } else { "NOT met" }
    );
    Ok(met)
}

fn line(p: &Phase) -> String {
    format!(
        "{}: {} changes, p50 {:.2} ms, p99 {:.2} ms, {} lost; questions {:.0}/s ({} answered 200, {} refused 429)",
        if p.flood { "flood" } else { "quiet" },
        p.latencies.len(),
        percentile(&p.latencies, 50.0),
        percentile(&p.latencies, 99.0),
        p.lost,
        p.asked as f64 / p.seconds,
        p.answered,
        p.limited
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[derive(Default)]
struct Counters {
    asked: AtomicU64,
    answered: AtomicU64,
    limited: AtomicU64,
}

/// Questions on one keep-alive connection from the node, at most `qps` a second, until `stop`.
fn flood_one(node: &Netns, qps: u64, stop: &AtomicBool, counters: &Counters) {
    let addr: SocketAddr = METRICS.parse().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 10249)));
    let request = format!(
        "GET /debug/explain?from=203.0.113.7&to={}:{} HTTP/1.1\r\nHost: {addr}\r\n\r\n",
        objects::cluster_ip_v4(1),
        objects::service_port(1)
    );
    let gap = Duration::from_secs_f64(1.0 / qps.max(1) as f64);
    let Ok(Ok(stream)) = node.run_in(move || TcpStream::connect(addr)) else { return };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(15)));
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
        next += gap;
        if writer.write_all(request.as_bytes()).is_err() {
            return;
        }
        counters.asked.fetch_add(1, Ordering::Relaxed);
        match read_status(&mut reader) {
            Some(200) => counters.answered.fetch_add(1, Ordering::Relaxed),
            Some(429) => counters.limited.fetch_add(1, Ordering::Relaxed),
            Some(_) => 0,
            None => return,
        };
    }
}

/// Reads one HTTP/1.1 response (status line, headers, a Content-Length body); its status.
fn read_status(reader: &mut BufReader<TcpStream>) -> Option<u16> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let status = line.split_whitespace().nth(1)?.parse().ok()?;
    let mut length = 0usize;
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some(v) = trimmed.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().ok()?;
        }
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).ok()?;
    Some(status)
}

/// `--changes` endpoint changes one every `--change-interval-ms`, each timed to the commit notice
/// of the sync that put it in the kernel. Returns the latencies (sorted) and the lost count.
fn timed_changes(
    node: &Netns,
    api: &Api,
    web_pod: IpAddr,
    n: usize,
    k: &mut usize,
    args: &FloodArgs,
) -> anyhow::Result<(Vec<f64>, usize)> {
    node.run_in(|| -> anyhow::Result<(Vec<f64>, usize)> {
        let mut probe = KernelProbe::open()?;
        let mut monitor = commit::monitor(&commit::tables(Mode::Nftables, kernel::TABLE))?;
        let (mut latencies, mut lost) = (Vec::new(), 0);
        let interval = Duration::from_millis(args.change_interval_ms);
        for _ in 0..args.changes {
            std::thread::sleep(interval);
            *k += 1;
            let i = crate::daemon::changes::changed_service(*k, n);
            let mut eps = objects::initial_endpoints(i, false, (web_pod, NODE_NAME), Layout::default().endpoints);
            let fresh: IpAddr = objects::fresh_endpoint(*k).into();
            let j = *k % eps.len();
            eps[j].0 = fresh;
            let want = kernel::endpoint_data(fresh, TARGET_PORT);
            let trigger = kproxy_servers::rfc3339_nano(Some(std::time::SystemTime::now()));
            let sent = Instant::now();
            api.server.apply(Kind::EndpointSlice, objects::slice(i, false, &eps, &trigger));
            let ip: IpAddr = objects::cluster_ip_v4(i).into();
            match commit::wait(sent, CHANGE_TIMEOUT, &mut monitor, || {
                Ok(probe.endpoint_in_slots(ip, objects::service_port(i), 8, &want)?)
            })? {
                Some(ms) => latencies.push(ms),
                None => lost += 1,
            }
        }
        latencies.sort_by(f64::total_cmp);
        Ok((latencies, lost))
    })?
}

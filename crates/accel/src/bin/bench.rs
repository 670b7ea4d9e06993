//! `kproxy-accel-bench`: a long-lived TCP transfer and sequential short connections through an
//! opted-in Service, with and without the fast path, on every dataplane side by side in one run.
//!
//! Runs as root in a kernel with flowtables (and IPVS for `ipvs`); on a development host
//! without them:
//!
//! ```text
//! cargo build --release -p kproxy-accel --features harness --bin kproxy-accel-bench
//! cargo xtask guest-run -- target/release/kproxy-accel-bench [--mode all|nftables|iptables-nft|iptables-legacy|ipvs] [--mb N] [--conns N] [--rounds N]
//! ```
//!
//! One cluster per dataplane (the harness's topology, each in namespaces of its own), all
//! started before the first round. Traffic goes from `external` through `node` (DNAT,
//! masquerade, flowtable) to a pod on `node2`, all in this machine's kernel. "With" is the
//! opted-in Service with the fast path programmed; "without" is the same Service with the fast
//! path's table removed. Each round measures every dataplane with and without (the order of
//! the two alternates from round to round), so drift of the machine affects all sides alike;
//! medians over rounds are reported, and ratios are medians of per-round ratios.
//!
//! What each figure counts:
//! - **MB/s**: bytes uploaded (2^20 per MB) / wall time from connect to the sink's answer that
//!   it received every byte (after the client's FIN).
//! - **CPU s/GB**: CPU time of the whole machine (every CPU, from `/proc/stat`: user, nice,
//!   system, irq, softirq, steal; not idle or iowait) between the same two instants, divided by
//!   the bytes (10^9 per GB). It includes the client and the sink (both in this machine), not
//!   only the node's forwarding; **softirq s/GB** is the softirq part of it, where the veth
//!   pairs' receive processing runs: the node's forwarding (netfilter hooks, conntrack, NAT, the
//!   flowtable) and both TCP stacks' receive paths (the copies to and from user space are
//!   system time, outside it). Resolution: one clock tick (`_SC_CLK_TCK`, usually 10 ms) per
//!   CPU. When every CPU is busy for the whole transfer, CPU s/GB is just CPUs / throughput.
//! - **short connections/s**: connect, send 100 bytes, read the sink's answer, close; one
//!   after the other from one thread (below the offload threshold: the cost of classification
//!   and the idle flowtable hooks on new connections).
//!
//! Every "with" transfer must have been handed to the flowtable (the offload counter grew) and
//! no "without" transfer may have been, or the run fails.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kproxy_accel::AccelConfig;
use kproxy_accel::harness::{Cluster, FAST_VIP, Hint, ProxyMode, SERVICE_PORT, finish, send_bytes};

#[derive(Debug)]
struct Options {
    modes: Vec<ProxyMode>,
    megabytes: usize,
    connections: usize,
    rounds: usize,
}

fn parse() -> Result<Options, String> {
    let mut options = Options { modes: ProxyMode::ALL.to_vec(), megabytes: 200, connections: 300, rounds: 5 };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--mode" => {
                options.modes = match value()?.as_str() {
                    "all" => ProxyMode::ALL.to_vec(),
                    other => vec![ProxyMode::parse(other).ok_or(format!("unknown mode {other}"))?],
                }
            }
            "--mb" => options.megabytes = value()?.parse().map_err(|e| format!("--mb: {e}"))?,
            "--conns" => options.connections = value()?.parse().map_err(|e| format!("--conns: {e}"))?,
            "--rounds" => options.rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(options)
}

/// CPU time of the whole machine so far, in clock ticks, from the `cpu` line of `/proc/stat`.
#[derive(Debug, Clone, Copy)]
struct CpuTicks {
    /// user + nice + system + irq + softirq + steal.
    busy: u64,
    /// softirq.
    softirq: u64,
}

fn cpu_ticks() -> Result<CpuTicks, String> {
    let stat = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    let line = stat.lines().find(|line| line.starts_with("cpu ")).ok_or("/proc/stat has no cpu line")?;
    let values: Vec<u64> = line.split_whitespace().skip(1).map(|v| v.parse().unwrap_or(0)).collect();
    let field = |i: usize| values.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal guest guest_nice (guest time is in user).
    Ok(CpuTicks { busy: field(0) + field(1) + field(2) + field(5) + field(6) + field(7), softirq: field(6) })
}

fn ticks_per_second() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().map_or(100.0, |t| t as f64)
}

/// One long-lived upload.
#[derive(Debug, Clone, Copy)]
struct Transfer {
    mb_per_s: f64,
    cpu_s_per_gb: f64,
    softirq_s_per_gb: f64,
}

/// One upload of `megabytes` through the Service; the client runs in `external`.
fn transfer(cluster: &Cluster, address: IpAddr, megabytes: usize) -> Result<Transfer, String> {
    let target = SocketAddr::new(address, SERVICE_PORT);
    let bytes = megabytes * 1024 * 1024;
    let measured = cluster.testbed.external().run_in(move || -> Result<(u64, f64, CpuTicks, CpuTicks), String> {
        let before = cpu_ticks()?;
        let started = Instant::now();
        let mut stream = TcpStream::connect_timeout(&target, Duration::from_secs(5)).map_err(|e| e.to_string())?;
        send_bytes(&mut stream, bytes).map_err(|e| e.to_string())?;
        let received = finish(stream).map_err(|e| e.to_string())?;
        let took = started.elapsed().as_secs_f64();
        Ok((received, took, before, cpu_ticks()?))
    });
    let (received, took, before, after) = measured.map_err(|e| e.to_string())??;
    if received != bytes as u64 {
        return Err(format!("sink received {received} of {bytes} bytes"));
    }
    let gigabytes = bytes as f64 / 1e9;
    let seconds = |ticks: u64| ticks as f64 / ticks_per_second();
    Ok(Transfer {
        mb_per_s: megabytes as f64 / took,
        cpu_s_per_gb: seconds(after.busy - before.busy) / gigabytes,
        softirq_s_per_gb: seconds(after.softirq - before.softirq) / gigabytes,
    })
}

/// Connections per second: connect, send 100 bytes, read the answer, close; sequentially,
/// from one thread in `external`.
fn short_rate(cluster: &Cluster, address: IpAddr, connections: usize) -> Result<f64, String> {
    let target = SocketAddr::new(address, SERVICE_PORT);
    let measured = cluster.testbed.external().run_in(move || -> std::io::Result<f64> {
        let started = Instant::now();
        for _ in 0..connections {
            let mut stream = TcpStream::connect_timeout(&target, Duration::from_secs(5))?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            send_bytes(&mut stream, 100)?;
            let received = finish(stream)?;
            if received != 100 {
                return Err(std::io::Error::other(format!("sink received {received} bytes")));
            }
        }
        Ok(connections as f64 / started.elapsed().as_secs_f64())
    });
    measured.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Everything measured for one dataplane, one entry per round.
#[derive(Debug, Default)]
struct Series {
    with: Vec<(Transfer, f64)>,
    without: Vec<(Transfer, f64)>,
}

impl Series {
    fn medians(side: &[(Transfer, f64)]) -> [f64; 4] {
        [
            median(side.iter().map(|(t, _)| t.mb_per_s).collect()),
            median(side.iter().map(|(t, _)| t.cpu_s_per_gb).collect()),
            median(side.iter().map(|(t, _)| t.softirq_s_per_gb).collect()),
            median(side.iter().map(|(_, rate)| *rate).collect()),
        ]
    }

    fn ratio(&self, of: impl Fn(&(Transfer, f64)) -> f64) -> f64 {
        median(self.with.iter().zip(&self.without).map(|(w, o)| of(w) / of(o)).collect())
    }
}

/// One measurement with the fast path on or off; checks that the transfer was offloaded
/// exactly when it was on.
fn measure(cluster: &Cluster, on: bool, options: &Options) -> Result<(Transfer, f64), String> {
    cluster.set_acceleration(on)?;
    let address: IpAddr = FAST_VIP.into();
    let counted = cluster.accelerated_connections_total()?;
    let transfer = transfer(cluster, address, options.megabytes)?;
    let offloaded = cluster.accelerated_connections_total()? - counted;
    if offloaded != u64::from(on) {
        return Err(format!("acceleration {on}: {offloaded} connections offloaded during the transfer"));
    }
    let rate = short_rate(cluster, address, options.connections)?;
    Ok((transfer, rate))
}

fn run(options: &Options) -> Result<(), String> {
    let mut clusters = Vec::new();
    for &mode in &options.modes {
        if !kproxy_testbed::kernel::require_root() || !kproxy_testbed::kernel::require(&mode.features()) {
            return Err(format!(
                "{} needs root and a kernel with {:?} (cargo xtask guest-run)",
                mode.name(),
                mode.features()
            ));
        }
        let cluster = Cluster::start(mode, AccelConfig::default(), Hint::Field)?;
        // Warm up ARP, routes and conntrack.
        short_rate(&cluster, FAST_VIP.into(), 20)?;
        clusters.push((mode, cluster, Series::default()));
    }
    for round in 0..options.rounds {
        for (mode, cluster, series) in &mut clusters {
            let order = if round % 2 == 0 { [true, false] } else { [false, true] };
            for on in order {
                let (t, rate) = measure(cluster, on, options)?;
                eprintln!(
                    "round {round} {:<15} acceleration {}: {:6.1} MB/s, CPU {:5.2} s/GB (softirq {:5.2}), {rate:4.0} short connections/s",
                    mode.name(),
                    if on { "on " } else { "off" },
                    t.mb_per_s,
                    t.cpu_s_per_gb,
                    t.softirq_s_per_gb,
                );
                if on { &mut series.with } else { &mut series.without }.push((t, rate));
            }
        }
    }
    println!(
        "kernel {}, {} CPUs, {} rounds, long-lived TCP upload of {} MB, {} sequential short connections; medians (ratio = median of per-round with/without)",
        kernel_release(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        options.rounds,
        options.megabytes,
        options.connections
    );
    println!(
        "{:<15} | {:>21} | {:>23} | {:>23} | {:>21}",
        "dataplane", "MB/s with/without", "CPU s/GB with/without", "softirq s/GB w/wo", "short conn/s w/wo"
    );
    for (mode, _, series) in &clusters {
        let [tw, cw, kw, rw] = Series::medians(&series.with);
        let [to, co, ko, ro] = Series::medians(&series.without);
        println!(
            "{:<15} | {tw:6.1} {to:6.1} x{:<5.2} | {cw:6.2} {co:6.2} x{:<5.2}  | {kw:6.2} {ko:6.2} x{:<5.2}  | {rw:5.0} {ro:5.0} x{:<5.3}",
            mode.name(),
            series.ratio(|(t, _)| t.mb_per_s),
            series.ratio(|(t, _)| t.cpu_s_per_gb),
            series.ratio(|(t, _)| t.softirq_s_per_gb),
            series.ratio(|(_, rate)| *rate),
        );
    }
    Ok(())
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|r| r.trim().to_owned()).unwrap_or_default()
}

fn main() -> ExitCode {
    match parse().and_then(|options| run(&options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("kproxy-accel-bench: {error}");
            ExitCode::FAILURE
        }
    }
}

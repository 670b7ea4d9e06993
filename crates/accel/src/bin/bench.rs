//! `kproxy-accel-bench`: long-lived TCP throughput and the short-connection rate through a
//! Service, with and without the fast path, in one run (so the ratios compare like with like).
//!
//! Runs as root in a kernel with flowtables; on a development host without them:
//!
//! ```text
//! cargo build --release -p kproxy-accel --features harness --bin kproxy-accel-bench
//! cargo xtask guest-run -- target/release/kproxy-accel-bench [--mode nftables|iptables|ipvs] [--mb N] [--conns N] [--rounds N]
//! ```
//!
//! Traffic goes from `external` through `node` (DNAT, masquerade, flowtable) to a pod on
//! `node2`. "With" is the opted-in Service with the fast path programmed; "without" is the same
//! Service with the fast path's table removed. Rounds alternate with/without and the median is
//! reported, so drift of the machine affects both sides alike.

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kproxy_accel::AccelConfig;
use kproxy_accel::harness::{Cluster, FAST_VIP, Hint, ProxyMode, SERVICE_PORT, finish, send_bytes};

#[derive(Debug)]
struct Options {
    mode: ProxyMode,
    megabytes: usize,
    connections: usize,
    rounds: usize,
}

fn parse() -> Result<Options, String> {
    let mut options = Options { mode: ProxyMode::Nftables, megabytes: 200, connections: 300, rounds: 5 };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--mode" => {
                options.mode = match value()?.as_str() {
                    "nftables" => ProxyMode::Nftables,
                    "iptables" => ProxyMode::Iptables,
                    "ipvs" => ProxyMode::Ipvs,
                    other => return Err(format!("unknown mode {other}")),
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

/// MB/s of one upload of `megabytes` through the Service; the client runs in `external`.
fn throughput(cluster: &Cluster, address: IpAddr, megabytes: usize) -> Result<f64, String> {
    let target = SocketAddr::new(address, SERVICE_PORT);
    let bytes = megabytes * 1024 * 1024;
    let measured = cluster.testbed.external().run_in(move || -> std::io::Result<(u64, f64)> {
        let mut stream = TcpStream::connect_timeout(&target, Duration::from_secs(5))?;
        let started = Instant::now();
        send_bytes(&mut stream, bytes)?;
        let received = finish(stream)?;
        Ok((received, started.elapsed().as_secs_f64()))
    });
    let (received, took) = measured.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    if received != bytes as u64 {
        return Err(format!("sink received {received} of {bytes} bytes"));
    }
    Ok(megabytes as f64 / took)
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

fn run(options: &Options) -> Result<(), String> {
    if !kproxy_testbed::kernel::require_root() || !kproxy_testbed::kernel::require(&options.mode.features()) {
        return Err("needs root and a kernel with flowtables (cargo xtask guest-run)".into());
    }
    let cluster = Cluster::start(options.mode, AccelConfig::default(), Hint::Field)?;
    let address: IpAddr = FAST_VIP.into();
    // Warm up ARP, routes and conntrack.
    short_rate(&cluster, address, 20)?;
    let (mut tput_with, mut tput_without, mut rate_with, mut rate_without) = (vec![], vec![], vec![], vec![]);
    for round in 0..options.rounds {
        for on in [true, false] {
            cluster.set_acceleration(on)?;
            let mbps = throughput(&cluster, address, options.megabytes)?;
            let rate = short_rate(&cluster, address, options.connections)?;
            eprintln!(
                "round {round} acceleration {}: {mbps:.1} MB/s, {rate:.0} short connections/s",
                if on { "on " } else { "off" }
            );
            if on {
                tput_with.push(mbps);
                rate_with.push(rate);
            } else {
                tput_without.push(mbps);
                rate_without.push(rate);
            }
        }
    }
    let tput_ratio = median(tput_with.iter().zip(&tput_without).map(|(w, o)| w / o).collect());
    let rate_ratio = median(rate_with.iter().zip(&rate_without).map(|(w, o)| w / o).collect());
    let (tw, to, rw, ro) = (median(tput_with), median(tput_without), median(rate_with), median(rate_without));
    println!("mode: {:?}, kernel {}", options.mode, kernel_release());
    println!(
        "long-lived TCP ({} MB, median of {} rounds): with {tw:.1} MB/s, without {to:.1} MB/s, \
         median per-round ratio {tput_ratio:.2}",
        options.megabytes, options.rounds
    );
    println!(
        "short connections ({} sequential, median of {} rounds): with {rw:.0}/s, without {ro:.0}/s, \
         median per-round ratio {rate_ratio:.3} (must be >= 0.95)",
        options.connections, options.rounds
    );
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

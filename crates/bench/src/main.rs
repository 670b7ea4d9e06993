//! `kproxy-bench`: how long kproxy's nftables dataplane alone takes to program clusters of
//! 1k–100k services, next to one `nft -f` of the same ruleset and to upstream's ruleset shape;
//! `kproxy-bench daemon`, the real `kproxy` binary end to end ([`daemon`]); and `kproxy-bench fleet`,
//! fleets of kproxies and of kube-proxies against one real API server ([`fleet`]).
//!
//! The dataplane-only run (no subcommand): each size runs in a fresh child process (so its peak
//! RSS is its own) and in fresh network namespaces: (1) full sync over netlink, (2) 50
//! one-endpoint changes, (3) peak RSS of the process after those — then, outside the measured
//! process state, (4) the same final ruleset as text loaded by one `nft -f` (nft's parsing
//! included), (5) upstream's shape of the same cluster loaded by `nft -f` (capped: it is
//! quadratic); (6) the iptables dataplane on the same cluster and changes, per iptables backend,
//! each in a fresh namespace, and upstream's iptables layout of the cluster's ClusterIPs.

mod churn;
mod cluster;
mod daemon;
mod explain_flood;
mod faults;
mod fleet;
mod iptables;
mod ipvs_verify;
mod measure;
mod monitor_cost;
mod report;
mod soak;
mod upstream;
mod upstream_iptables;

use std::process::{Command, ExitCode};

/// The daemon's allocator (see `crates/kproxy/src/main.rs`), so the bench measures what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};

/// Benchmarks of kproxy (root; they use fresh network namespaces). Without a subcommand: the
/// nftables dataplane alone, in this process, at scale.
#[derive(Debug, Parser)]
#[command(name = "kproxy-bench", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Bench>,
    #[command(flatten)]
    args: Args,
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// The real kproxy daemon end to end: fake API server, kernel, traffic.
    Daemon(daemon::DaemonArgs),
    /// API server faults injected into the real kproxy daemon at scale.
    Faults(faults::FaultArgs),
    /// Fleets of proxies (kproxy, kube-proxy), one node namespace each, against one real API server.
    Fleet(fleet::FleetArgs),
    /// Many changes over a long run: memory, descriptors, threads, kernel objects stay flat.
    Soak(soak::SoakArgs),
    /// What following nf_tables' notifications costs kproxy's own commits.
    MonitorCost(monitor_cost::MonitorCostArgs),
    /// The IPVS dataplane's periodic check against a full sync (guest kernel: needs IPVS).
    IpvsVerify(ipvs_verify::IpvsVerifyArgs),
    /// Endpoint changes timed with and without a flood of `/debug/explain` questions.
    ExplainFlood(explain_flood::FloodArgs),
}

/// The dataplane-only benchmark's options.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Cluster sizes, in services.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,50000,100000")]
    pub sizes: Vec<usize>,
    /// Endpoints per service.
    #[arg(long, default_value_t = 5)]
    pub endpoints: usize,
    /// One-endpoint changes to time per size.
    #[arg(long, default_value_t = 50)]
    pub changes: usize,
    /// Largest size whose upstream-shaped ruleset is loaded (it grows quadratically).
    #[arg(long, default_value_t = 10_000)]
    pub upstream_max: usize,
    /// Give up on an upstream-shaped load after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub upstream_timeout: u64,
    /// Largest size the iptables dataplane is measured at.
    #[arg(long, default_value_t = 50_000)]
    pub iptables_max: usize,
    /// Largest size whose upstream-layout iptables restore is loaded (it grows quadratically).
    #[arg(long, default_value_t = 3000)]
    pub iptables_upstream_max: usize,
    /// Largest size whose iptables full resync and restart over the live rules are timed.
    #[arg(long, default_value_t = 10_000)]
    pub iptables_resync_max: usize,
    /// iptables backends measured (`nft`, `legacy`; empty: none).
    #[arg(long, value_delimiter = ',', default_value = "nft,legacy")]
    pub iptables_backends: Vec<String>,
    /// CI smoke run: 10 changes, no upstream shape.
    #[arg(long)]
    pub quick: bool,
    /// Internal: measure one size and print its result as JSON.
    #[arg(long, hide = true)]
    pub child: Option<usize>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    let cli = Cli::parse();
    let subcommand = match &cli.command {
        Some(Bench::Daemon(args)) => Some(("daemon", daemon::main(args))),
        Some(Bench::Faults(args)) => Some(("faults", faults::main(args))),
        Some(Bench::Fleet(args)) => Some(("fleet", fleet::main(args))),
        Some(Bench::Soak(args)) => Some(("soak", soak::main(args))),
        Some(Bench::MonitorCost(args)) => Some(("monitor-cost", monitor_cost::main(args))),
        Some(Bench::IpvsVerify(args)) => Some(("ipvs-verify", ipvs_verify::main(args))),
        Some(Bench::ExplainFlood(args)) => Some(("explain-flood", explain_flood::main(args))),
        None => None,
    };
    if let Some((name, result)) = subcommand {
        // 2: the run completed but missed a target.
        return match result {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(2),
            Err(e) => {
                eprintln!("kproxy-bench {name}: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let mut args = cli.args;
    if args.quick {
        args.changes = args.changes.min(10);
        args.upstream_max = 0;
    }
    if let Some(size) = args.child {
        return match measure::run(size, &args) {
            Ok(result) => {
                println!("{}", serde_json::to_string(&result).unwrap_or_default());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("kproxy-bench: size {size}: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    match parent(&args) {
        Ok(all_met) => {
            if all_met || args.quick {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            }
        }
        Err(e) => {
            eprintln!("kproxy-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn parent(args: &Args) -> anyhow::Result<bool> {
    let exe = std::env::current_exe()?;
    let mut results = Vec::new();
    for &size in &args.sizes {
        eprintln!("kproxy-bench: {size} services × {} endpoints ...", args.endpoints);
        let out = Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .arg("--child")
            .arg(size.to_string())
            .stderr(std::process::Stdio::inherit())
            .output()?;
        if !out.status.success() {
            anyhow::bail!("measuring {size} services failed ({})", out.status);
        }
        let line = String::from_utf8_lossy(&out.stdout);
        results.push(serde_json::from_str::<measure::SizeResult>(line.trim())?);
    }
    let cmd: Vec<String> = std::env::args().collect();
    let (text, all_met) = report::render(&cmd.join(" "), args, &results);
    print!("{text}");
    Ok(all_met)
}

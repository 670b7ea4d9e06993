//! `kproxy-bench fleet`: what a fleet of proxies costs one control plane. N proxies, each in a
//! network namespace of its own as a node of its own (its Node object, name and addresses),
//! against one real kube-apiserver v1.36.2 + etcd 3.6 (`kproxy-k8s-harness`); a fleet of kproxy
//! and a fleet of upstream kube-proxy v1.36.2 one after the other on the same objects, each
//! against a freshly restarted API server. Per fleet: the API server's and etcd's CPU and peak
//! RSS during the fleet's cold start, the bytes the API server wrote to the fleet and the lists
//! and watches the fleet made; per EndpointSlice change, the API server's CPU and bytes and the
//! time from the PATCH to the change in each of the N kernels; an API server restart under the
//! fleet; each proxy's RSS. What each figure times: `docs/benchmarks.md`, "Fleet".

mod interrupt;
mod net;
mod observe;
mod proxies;
mod report;
mod run;
mod server;

use std::path::PathBuf;

use anyhow::Context as _;
use kproxy_k8s_harness::{Binaries, Binary};

use crate::daemon::{Proxy, kproxy, objects};

/// Benchmark fleets of proxies against one real API server (root; builds its own network
/// namespaces; nftables mode).
#[derive(Debug, Clone, clap::Args)]
pub struct FleetArgs {
    /// Fleet sizes (proxies, one per node namespace), each measured for every proxy in turn.
    #[arg(long, value_delimiter = ',', default_value = "10,50,100")]
    pub nodes: Vec<usize>,
    /// Cluster sizes, in Services (each with an EndpointSlice of 5 endpoints; 10% dual-stack):
    /// the objects of `kproxy-bench daemon`.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    pub services: Vec<usize>,
    /// The fleets, one after the other on the same objects.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "kproxy,upstream")]
    pub proxies: Vec<Proxy>,
    /// The kproxy binary (default: `kproxy` next to this executable).
    #[arg(long)]
    pub kproxy: Option<PathBuf>,
    /// Endpoint changes timed per fleet, one per `--change-interval-ms` (the next waits until
    /// every kernel has the last).
    #[arg(long, default_value_t = 30)]
    pub changes: usize,
    /// Milliseconds between two changes.
    #[arg(long, default_value_t = 1000)]
    pub change_interval_ms: u64,
    /// Seconds of each idle window whose API server CPU and bytes are measured (before each
    /// fleet starts, and with the fleet running before its changes).
    #[arg(long, default_value_t = 10)]
    pub idle: u64,
    /// Seconds left after an API server (re)start and after a fleet's start before the next
    /// window opens.
    #[arg(long, default_value_t = 10)]
    pub settle: u64,
    /// Give up on a fleet's cold start after this many seconds (reported; the run goes on).
    #[arg(long, default_value_t = 900)]
    pub start_timeout: u64,
    /// A change not in a kernel after this many seconds counts as not seen there.
    #[arg(long, default_value_t = 60)]
    pub change_timeout: u64,
    /// Skip the API server restart under each fleet.
    #[arg(long)]
    pub no_restart: bool,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where the proxies', API server's and audit logs go (default: the temporary directory).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// etcd syncs its writes to disk (default: `--unsafe-no-fsync`).
    #[arg(long)]
    pub etcd_fsync: bool,
    /// Saved clusters, as `kproxy-bench daemon --api real` keeps them (default
    /// `<workspace>/target/bench-clusters`; the same objects, so either benchmark reuses the other's).
    #[arg(long)]
    pub cluster_cache: Option<PathBuf>,
    /// Write every cluster through the API server, neither reusing nor saving one.
    #[arg(long)]
    pub no_cluster_cache: bool,
    /// Create requests in flight at once while writing a cluster.
    #[arg(long, default_value_t = 64)]
    pub create_concurrency: usize,
    /// Above this many Services, objects are validated by the API server and put into etcd
    /// directly (as `kproxy-bench daemon --api real` does).
    #[arg(long, default_value_t = 20000)]
    pub store_directly_above: usize,
}

/// Runs every cluster size and fleet; prints the report; true when every target was met.
pub fn main(args: &FleetArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(kproxy_testbed::kernel::is_root(), "kproxy-bench fleet needs root (it creates network namespaces)");
    anyhow::ensure!(!args.nodes.is_empty() && !args.proxies.is_empty(), "--nodes and --proxies: at least one each");
    for &n in &args.nodes {
        anyhow::ensure!((1..=net::MAX_NODES).contains(&n), "--nodes {n}: between 1 and {}", net::MAX_NODES);
    }
    for &n in &args.services {
        anyhow::ensure!(
            (2..=objects::MAX_SERVICES).contains(&n),
            "--services {n}: between 2 and {}",
            objects::MAX_SERVICES
        );
    }
    let removed = kproxy_testbed::Netns::remove_stale();
    if removed > 0 {
        eprintln!("kproxy-bench fleet: removed {removed} network namespaces left by runs that were killed");
    }
    interrupt::install()?;
    let binaries = Binaries::locate().context("the Kubernetes binaries (KPROXY_K8S_DIR)")?;
    let bins = run::Bins {
        kproxy: kproxy::binary(args.kproxy.as_deref())?,
        upstream: binaries.path(Binary::KubeProxy)?,
        apiserver: binaries.path(Binary::KubeApiserver)?,
        binaries,
    };
    let log_dir = kproxy::run_dir(args.log_dir.as_deref(), "kproxy-bench-fleet")?;
    eprintln!("kproxy-bench fleet: logs in {}", log_dir.display());
    let mut results = Vec::new();
    for &services in &args.services {
        eprintln!("kproxy-bench fleet: {services} Services ...");
        let dir = log_dir.join(services.to_string());
        let result = run::size(services, args, &bins, &dir).with_context(|| format!("{services} Services"))?;
        results.push(result);
        // Rewritten after each size: a run stopped midway keeps what it measured.
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_string_pretty(&results)?)
                .with_context(|| format!("{}", path.display()))?;
        }
    }
    let command: Vec<String> = std::env::args().collect();
    let (text, met) = report::render(&command.join(" "), args, &bins.kproxy, &results);
    print!("{text}");
    Ok(met)
}

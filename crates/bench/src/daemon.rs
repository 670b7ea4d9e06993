//! `kproxy-bench daemon`: the real `kproxy` binary, end to end. It runs in the node namespace of
//! a sandbox (its defaults; nftables mode, or iptables mode with `--modes`), against the in-process fake API server serving a
//! realistic cluster, and is measured only from the outside: the kernel over netlink, `/proc`,
//! and real TCP connections from a pod. What each figure times is in `docs/benchmarks.md`.

pub(crate) mod api;
mod big;
pub(crate) mod changes;
pub(crate) mod commit;
pub(crate) mod first_sync;
pub(crate) mod kernel;
pub(crate) mod kproxy;
pub(crate) mod objects;
pub(crate) mod real;
pub(crate) mod report;
mod run;
pub(crate) mod traffic;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

/// kproxy's `--proxy-mode` under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
pub enum Mode {
    /// The default: kproxy's own nftables tables, observed over netlink.
    Nftables,
    /// Upstream's iptables chains with the host's default backend (iptables-nft here),
    /// observed over nf_tables netlink too.
    Iptables,
}

impl Mode {
    /// The flag's value.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Nftables => "nftables",
            Mode::Iptables => "iptables",
        }
    }
}

/// Where the cluster is served from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiKind {
    /// The in-process fake API server (`kproxy_kube_source::fake`): objects stored at once.
    Fake,
    /// kube-apiserver v1.36.2 + etcd 3.6.13 from `KPROXY_K8S_DIR` (`kproxy-k8s-harness`),
    /// objects created through it.
    Real,
}

/// A proxy the real-API-server mode runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
pub enum Proxy {
    /// The `kproxy` binary.
    Kproxy,
    /// Upstream kube-proxy v1.36.2 (`KPROXY_K8S_DIR`).
    Upstream,
}

impl Proxy {
    pub fn as_str(self) -> &'static str {
        match self {
            Proxy::Kproxy => "kproxy",
            Proxy::Upstream => "kube-proxy",
        }
    }
}

/// Benchmark the kproxy daemon end to end (root; builds its own network namespaces).
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonArgs {
    /// Proxy modes, each measured at every size, one after the other (side by side in the
    /// report).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "nftables")]
    pub modes: Vec<Mode>,
    /// Cluster sizes, in Services (each with an EndpointSlice of `--endpoints`; 10% dual-stack).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub services: Vec<usize>,
    /// Endpoints per Service (Service 0 has one: the real pod).
    #[arg(long, default_value_t = objects::DEFAULT_ENDPOINTS, value_parser = endpoints_per_service)]
    pub endpoints: usize,
    /// One more Service (`bench/big`, ClusterIP, one TCP port) with this many endpoints, in
    /// slices of 100 (0: none): its endpoint changes and a rolling replacement of all of them
    /// are measured after the other changes.
    #[arg(long, default_value_t = 0)]
    pub big_service: usize,
    /// With `--big-service`: timed changes that each replace one endpoint of the big Service,
    /// one per `--change-interval-ms`.
    #[arg(long, default_value_t = 20)]
    pub big_changes: usize,
    /// With `--big-service`: endpoints replaced per step of its rolling replacement, each step
    /// written once the last is in the kernel (0: no rollout).
    #[arg(long, default_value_t = 25)]
    pub rollout_step: usize,
    /// With `--big-service`: the least time between the writes of two steps of the rollout, ms
    /// (a step is written no sooner than this after the last, and not before the last is in the
    /// kernel). 0: back to back, as fast as the proxy follows — then each step waits out the
    /// proxy's `minSyncPeriod` (1 s by default, kproxy and kube-proxy alike), and the step's
    /// time is that period rather than what the step costs.
    #[arg(long, default_value_t = 1000)]
    pub rollout_interval_ms: u64,
    /// With `--big-service`: a proxy's rollout is called off after this many seconds (reported
    /// as "> N s" with the steps it made).
    #[arg(long, default_value_t = 900)]
    pub rollout_timeout: u64,
    /// The kproxy binary (default: `kproxy` next to this executable, e.g. target/release/kproxy).
    #[arg(long)]
    pub kproxy: Option<PathBuf>,
    /// One more flag for kproxy (not kube-proxy), after the benchmark's own; repeatable, e.g.
    /// `--kproxy-arg=--kube-api-content-type=application/json` to have it ask for JSON.
    #[arg(long = "kproxy-arg", value_name = "FLAG", allow_hyphen_values = true)]
    pub kproxy_args: Vec<String>,
    /// Seconds of the idle window whose CPU use is reported.
    #[arg(long, default_value_t = 300)]
    pub idle: u64,
    /// Endpoint changes whose programming latency is reported, made one per `--change-interval-ms`.
    #[arg(long, default_value_t = 100)]
    pub changes: usize,
    /// Milliseconds between two timed changes.
    #[arg(long, default_value_t = 1000)]
    pub change_interval_ms: u64,
    /// Changes in all: the timed ones first, the rest as a burst at `--burst-per-second`;
    /// RSS is read again after them.
    #[arg(long, default_value_t = 1000)]
    pub total_changes: usize,
    /// Pace of the burst of changes that follows the timed ones.
    #[arg(long, default_value_t = 50.0)]
    pub burst_per_second: f64,
    /// Seconds per phase of the connection-rate comparison (4 phases, alternating).
    #[arg(long, default_value_t = 5)]
    pub rate_phase: u64,
    /// Give up when the first sync has not reached the kernel after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub start_timeout: u64,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where kproxy's logs go (one file per size and start).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// The API server: the in-process fake, or a real kube-apiserver + etcd (which runs only the
    /// start, the idle window and the timed changes: no burst, connection rates or restart).
    #[arg(long, value_enum, default_value = "fake")]
    pub api: ApiKind,
    /// With `--api real`: the proxies run one after the other on the same objects (default
    /// `kproxy,upstream`), each in every `--modes`.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub proxies: Option<Vec<Proxy>>,
    /// With `--api real`: each proxy runs this many times in a row on the same objects (a fresh
    /// start each time, the ruleset flushed between two), every run reported and judged, so the
    /// spread of one run's figures is measured rather than guessed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub repeat: u32,
    /// With `--api real`: give up on upstream kube-proxy's first sync after this many seconds
    /// (reported as not within the bound; the run goes on).
    #[arg(long, default_value_t = 600)]
    pub upstream_timeout: u64,
    /// With `--api real`: create requests in flight at once.
    #[arg(long, default_value_t = 64)]
    pub create_concurrency: usize,
    /// With `--api real`: etcd syncs its writes to disk (default: `--unsafe-no-fsync`, said so in
    /// the report).
    #[arg(long)]
    pub etcd_fsync: bool,
    /// With `--api real`: keep each size's cluster here (etcd's data right after the cluster was
    /// written through the API server) and start later runs of that size from it instead of
    /// writing it again (writing 100k Services takes over an hour; the report marks reused
    /// clusters). Default: `<workspace>/target/bench-clusters`.
    #[arg(long)]
    pub cluster_cache: Option<PathBuf>,
    /// With `--api real`: write every cluster through the API server, neither reusing nor saving one.
    #[arg(long)]
    pub no_cluster_cache: bool,
    /// With `--api real`: above this many Services, each object is validated and defaulted by
    /// the API server (a dry-run create) and put into etcd directly instead of created through
    /// it (v1.36.2 takes O(n) per ClusterIP allocated: hours at 100k); the report says so.
    #[arg(long, default_value_t = 20000)]
    pub store_directly_above: usize,
}

/// `--endpoints`: 1 to 1,000 (the most one EndpointSlice holds).
fn endpoints_per_service(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=1000).contains(&n) => Ok(n),
        _ => Err(format!("{s}: endpoints per Service are 1 to 1000 (one EndpointSlice)")),
    }
}

impl DaemonArgs {
    pub fn change_interval(&self) -> Duration {
        Duration::from_millis(self.change_interval_ms)
    }

    pub fn rollout_interval(&self) -> Duration {
        Duration::from_millis(self.rollout_interval_ms)
    }

    /// The cluster's shape beyond its number of Services.
    pub fn layout(&self) -> objects::Layout {
        objects::Layout { endpoints: self.endpoints, big: self.big_service }
    }

    /// Refuses sizes and shapes the address plan cannot hold, for `runs` proxy runs per size.
    fn check_sizes(&self, runs: usize) -> anyhow::Result<()> {
        for &n in &self.services {
            anyhow::ensure!(
                (2..=objects::MAX_SERVICES).contains(&n),
                "--services {n}: between 2 and {} (unique ClusterIPs in the test ranges)",
                objects::MAX_SERVICES
            );
            anyhow::ensure!(
                self.big_service == 0 || n < objects::MAX_SERVICES_WITH_BIG,
                "--big-service needs --services below {} (its endpoints take 198.18.128.0/17)",
                objects::MAX_SERVICES_WITH_BIG
            );
        }
        let needed = big::addresses_needed(self.big_service, self, runs);
        anyhow::ensure!(
            self.big_service == 0 || needed <= objects::BIG_POOL,
            "--big-service {}: its changes over {runs} run(s) need {needed} addresses, the pool has {}",
            self.big_service,
            objects::BIG_POOL
        );
        Ok(())
    }
}

/// Runs every size; prints the report; true when every target of the issue was met.
pub fn main(args: &DaemonArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        kproxy_testbed::kernel::is_root(),
        "kproxy-bench daemon needs root (it creates network namespaces)"
    );
    if args.api == ApiKind::Real {
        let proxies = args.proxies.clone().unwrap_or_else(|| vec![Proxy::Kproxy, Proxy::Upstream]);
        if args.total_changes != 1000 || args.rate_phase != 5 || args.burst_per_second != 50.0 {
            eprintln!(
                "kproxy-bench daemon: --total-changes, --burst-per-second and --rate-phase are not used with --api real"
            );
        }
        // Each proxy's runs, and the API server's alone (`real::bare::big_service_trips`).
        args.check_sizes(proxies.len() * args.modes.len() * args.repeat as usize + 1)?;
        return real::main(args, &proxies);
    }
    anyhow::ensure!(
        args.proxies.as_deref().is_none_or(|p| p == [Proxy::Kproxy]),
        "--proxies: upstream kube-proxy runs only with --api real"
    );
    anyhow::ensure!(args.repeat == 1, "--repeat runs only with --api real");
    let binary = kproxy::binary(args.kproxy.as_deref())?;
    args.check_sizes(1)?;
    let log_dir = args.log_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&log_dir).with_context(|| format!("{}", log_dir.display()))?;
    let mut results = Vec::new();
    for (&n, &mode) in args.services.iter().flat_map(|n| args.modes.iter().map(move |m| (n, m))) {
        let mode_name = mode.as_str();
        eprintln!("kproxy-bench daemon: {n} services, {mode_name} mode ...");
        let result =
            run::measure(n, mode, args, &binary, &log_dir).with_context(|| format!("{n} services, {mode_name}"))?;
        keep_result(&mut results, result, n, args.json.as_deref())?;
    }
    let command: Vec<String> = std::env::args().collect();
    let (text, all_met) = report::render(&command.join(" "), args, &binary, &results);
    print!("{text}");
    Ok(all_met)
}

/// Logs one size's result, keeps it, and rewrites `--json` with every result so far (a run
/// stopped midway keeps what it measured).
pub(crate) fn keep_result<T: serde::Serialize>(
    results: &mut Vec<T>,
    result: T,
    services: usize,
    json: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    eprintln!("kproxy-bench daemon: {services} services done: {}", serde_json::to_string(&result).unwrap_or_default());
    results.push(result);
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(results)?).with_context(|| format!("{}", path.display()))?;
    }
    Ok(())
}

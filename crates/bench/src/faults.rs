//! `kproxy-bench faults`: what the API server does to a real kproxy daemon at cluster scale, and
//! what kproxy does about it. The same sandbox, fake API server, cluster and kernel witness as
//! `kproxy-bench daemon` (nftables mode, kproxy's defaults); per fault:
//!
//! - while the fault lasts, a prober pod connects to a ClusterIP every 20 ms and a sample of
//!   unchanged Services is looked up in the kernel every 100 ms: "served throughout" means no
//!   connection failed and no sampled Service left the kernel (no partial view programmed);
//! - during the fault, Services and EndpointSlices are created, changed and deleted at the API
//!   server; "converged" is the time from the end of the fault until the kernel shows all of it;
//! - kproxy's peak RSS during the fault, against its RSS before (a relist must not double it).
//!
//! docs/reliability.md has the figures and the command that reproduces them.

mod report;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kproxy_state::Kind;
use kproxy_testbed::{Proto, Testbed, Where};
use serde::Serialize;

use crate::churn::Churn;
use crate::daemon::api::{Api, NODE_NAME};
use crate::daemon::kproxy::{self, Kproxy};
use crate::daemon::objects::{self, Layout, TARGET_PORT};
use crate::daemon::traffic::Prober;
use crate::daemon::{Mode, first_sync, kernel};

/// How often the prober connects while a fault lasts.
const PROBE_INTERVAL: Duration = Duration::from_millis(20);
/// How often the sampled Services are looked up in the kernel while a fault lasts.
const SAMPLE_POLL: Duration = Duration::from_millis(100);
/// Unchanged Services looked up while a fault lasts.
const SAMPLES: usize = 64;
/// Give up on convergence after this long.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(180);

/// Inject API server faults into a running kproxy (root; builds its own network namespaces).
#[derive(Debug, Clone, clap::Args)]
pub struct FaultArgs {
    /// Services in the cluster (each with an EndpointSlice of 5 endpoints; 10% dual-stack).
    #[arg(long, default_value_t = 10_000)]
    pub services: usize,
    /// The kproxy binary (default: `kproxy` next to this executable).
    #[arg(long)]
    pub kproxy: Option<PathBuf>,
    /// How long the API server is down.
    #[arg(long, default_value_t = 60)]
    pub down_seconds: u64,
    /// How long the slow EndpointSlice list takes at start.
    #[arg(long, default_value_t = 30)]
    pub slow_list_seconds: u64,
    /// How long EndpointSlices are forbidden (403) while kproxy runs.
    #[arg(long, default_value_t = 20)]
    pub forbidden_seconds: u64,
    /// kproxy's `syncPeriod` (its periodic check), seconds: what repairs damage by others.
    #[arg(long, default_value_t = 30)]
    pub sync_period: u64,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where kproxy's log goes.
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
}

/// What one fault did.
#[derive(Debug, Clone, Serialize)]
pub struct FaultResult {
    pub fault: String,
    /// Connection attempts to the unchanged ClusterIP while the fault lasted, and failures.
    pub attempts: usize,
    pub failed: usize,
    /// How the failed attempts failed (`connect: connection refused`, `read: timed out`...).
    #[serde(default)]
    pub failures: std::collections::BTreeMap<String, usize>,
    /// Kernel lookups of unchanged Services while the fault lasted, and how many missed.
    pub lookups: usize,
    pub missing: usize,
    /// Changes made at the API server during the fault.
    pub changes: usize,
    /// End of the fault → the kernel shows every change, ms (`None`: not within the timeout).
    pub converged_ms: Option<f64>,
    pub rss_before_mib: f64,
    pub rss_peak_mib: f64,
    /// Whether kproxy was still running at the end.
    pub alive: bool,
    /// Another program damaged kproxy's rules: connections fail until the periodic check
    /// repairs them, and "converged" is the time to that repair.
    pub damage: bool,
}

/// The sandbox of one run: namespaces, the real pod behind Service 0, the prober, the API server.
struct Sandbox {
    api: Api,
    web: Arc<kproxy_testbed::Pod>,
    prober: Arc<kproxy_testbed::Pod>,
    tb: Testbed,
    binary: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    n: usize,
}

pub fn main(args: &FaultArgs) -> anyhow::Result<bool> {
    anyhow::ensure!(
        kproxy_testbed::kernel::is_root(),
        "kproxy-bench faults needs root (it creates network namespaces)"
    );
    anyhow::ensure!(
        (100..objects::MAX_SERVICES - 1000).contains(&args.services),
        "--services: between 100 and {}",
        objects::MAX_SERVICES - 1000
    );
    let binary = kproxy::binary(args.kproxy.as_deref())?;
    let run_dir = kproxy::run_dir(args.log_dir.as_deref(), "kproxy-bench-faults")?;

    let n = args.services;
    let tb = Testbed::new()?;
    let web = tb.add_pod("web", Where::Node)?;
    web.serve(&[(Proto::Tcp, TARGET_PORT)])?;
    let prober = tb.add_pod("prober", Where::Node)?;
    eprintln!("kproxy-bench faults: {n} services ...");
    let api = Api::start(tb.node(), n, web.ipv4().into(), Layout::default())?;
    let kubeconfig = run_dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let log = run_dir.join("kproxy.log");
    eprintln!("  kproxy log: {}", log.display());
    let mut kproxy_args = kproxy::args(&kubeconfig, NODE_NAME, Mode::Nftables);
    kproxy_args.push(format!("--iptables-sync-period={}s", args.sync_period));
    let sandbox = Sandbox { api, web, prober, tb, binary, args: kproxy_args, log, n };

    let mut daemon = sandbox.start()?;
    let (start_s, _) = first_sync::wait(sandbox.tb.node(), n, Layout::default(), &mut daemon, 900, Mode::Nftables)?;
    eprintln!("  first sync in the kernel after {start_s:.2} s");
    let mut churn = Churn::new(n, sandbox.web.ipv4().into());
    let server = sandbox.api.server.clone();
    let rt = sandbox.api.runtime();

    let mut results = Vec::new();
    let mut record = |result: FaultResult| {
        eprintln!("  {}", serde_json::to_string(&result).unwrap_or_default());
        results.push(result);
    };

    record(sandbox.fault("watch connections closed mid-stream", &mut daemon, &mut churn, |churn, _| {
        rt.block_on(server.drop_connections());
        churn.apply(&server, 20);
        Ok(())
    })?);
    record(sandbox.fault(
        "410 Gone: watches expired, history compacted (relist)",
        &mut daemon,
        &mut churn,
        |churn, _| {
            server.compact();
            server.expire_watches();
            churn.apply(&server, 20);
            Ok(())
        },
    )?);
    let down = Duration::from_secs(args.down_seconds);
    let fault = format!("API server down {} s, changes meanwhile", args.down_seconds);
    record(sandbox.fault(&fault, &mut daemon, &mut churn, |churn, _| {
        rt.block_on(server.stop());
        churn.apply(&server, 20);
        std::thread::sleep(down);
        // It listens again in the node namespace, where kproxy reaches it.
        let restarted = sandbox.tb.node().run_in(|| rt.block_on(server.restart()))?;
        restarted.context("restarting the fake API server")
    })?);
    let forbidden = Duration::from_secs(args.forbidden_seconds);
    let fault = format!("EndpointSlices 403 Forbidden for {} s (RBAC revoked), watches broken", args.forbidden_seconds);
    record(sandbox.fault(&fault, &mut daemon, &mut churn, |churn, _| {
        server.set_forbidden(Kind::EndpointSlice, true);
        rt.block_on(server.drop_connections());
        churn.apply(&server, 20);
        std::thread::sleep(forbidden);
        server.set_forbidden(Kind::EndpointSlice, false);
        Ok(())
    })?);
    record(sandbox.fault("ServiceCIDR API no longer served (404)", &mut daemon, &mut churn, |churn, _| {
        server.set_served(Kind::ServiceCidr, false);
        churn.apply(&server, 20);
        Ok(())
    })?);
    // Other programs and the kernel.
    let node = sandbox.tb.node();
    let fault = "another process commits nf_tables batches in a loop (its own table) while changes arrive";
    record(sandbox.fault(fault, &mut daemon, &mut churn, |churn, _| {
        server.set_served(Kind::ServiceCidr, true);
        let committer = Committer::start(node)?;
        churn.apply(&server, 20);
        std::thread::sleep(Duration::from_secs(5));
        committer.stop()
    })?);
    let mut deleted = sandbox.fault("another tool deletes kproxy's table", &mut daemon, &mut churn, |_, _| {
        node.nft("delete table ip kproxy")?;
        Ok(())
    })?;
    deleted.damage = true;
    record(deleted);
    // Restarts: kill -9 and start again with a fault at start; the kernel keeps the old rules.
    let slow = Duration::from_secs(args.slow_list_seconds);
    let fault = format!("restart with a {} s EndpointSlice list", args.slow_list_seconds);
    record(sandbox.fault(&fault, &mut daemon, &mut churn, |churn, daemon| {
        server.set_list_delay(Kind::EndpointSlice, slow);
        churn.apply(&server, 20);
        sandbox.restart(daemon)?;
        std::thread::sleep(slow);
        server.set_list_delay(Kind::EndpointSlice, Duration::ZERO);
        Ok(())
    })?);
    record(sandbox.fault(
        "restart with the ServiceCIDR API forbidden (403)",
        &mut daemon,
        &mut churn,
        |churn, daemon| {
            server.set_forbidden(Kind::ServiceCidr, true);
            churn.apply(&server, 20);
            sandbox.restart(daemon)
        },
    )?);
    drop(daemon);

    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&results)?).with_context(|| format!("{}", path.display()))?;
    }
    let command: Vec<String> = std::env::args().collect();
    let repair_within = Duration::from_secs(args.sync_period + 5);
    let (text, all_good) = report::render(&command.join(" "), n, start_s, repair_within, &results);
    print!("{text}");
    Ok(all_good)
}

impl Sandbox {
    fn start(&self) -> anyhow::Result<Kproxy> {
        Kproxy::start(self.tb.node(), &self.binary, &self.args, &self.log)
    }

    /// Runs `inject` (which makes its changes through the churn and ends the fault when it
    /// returns) while the prober and the kernel sampler watch; then times convergence.
    fn fault(
        &self,
        name: &str,
        daemon: &mut Kproxy,
        churn: &mut Churn,
        inject: impl FnOnce(&mut Churn, &mut Kproxy) -> anyhow::Result<()>,
    ) -> anyhow::Result<FaultResult> {
        eprintln!("  fault: {name}");
        let service = (objects::cluster_ip_v4(0), objects::service_port(0)).into();
        let rss_before_mib = daemon.memory_mib()?.rss;
        let pid_before = daemon.pid();
        let memory = daemon.watch_memory();
        let prober = Prober::start(self.prober.netns(), service, self.web.name(), PROBE_INTERVAL)?;
        let untouched = churn.untouched_keys(self.n, SAMPLES);
        let sampler = Sampler::start(self, untouched.clone())?;
        let changes_before = churn.made();
        inject(churn, daemon)?;
        let ended = Instant::now();
        let converged_ms = churn.wait_converged(self.tb.node(), ended, CONVERGE_TIMEOUT, &untouched)?;
        let (lookups, missing) = sampler.stop()?;
        let probes = prober.stop()?;
        let alive = daemon.alive();
        // The peak sampled during the fault; after a restart fault, the new process's
        // high-water mark (its whole life is the fault window).
        let sampled = memory.stop().rss;
        let rss_peak_mib = match (alive, daemon.pid() == pid_before) {
            (true, true) => sampled.max(daemon.memory_mib()?.rss),
            (true, false) => sampled.max(daemon.memory_mib()?.peak),
            (false, _) => sampled,
        };
        Ok(FaultResult {
            fault: name.to_owned(),
            attempts: probes.attempts.len(),
            failed: probes.failed(),
            failures: probes.failures.clone(),
            lookups,
            missing,
            changes: churn.made() - changes_before,
            converged_ms,
            rss_before_mib,
            rss_peak_mib,
            alive,
            damage: false,
        })
    }

    /// `kill -9`, then a new kproxy with the same arguments in its place.
    fn restart(&self, daemon: &mut Kproxy) -> anyhow::Result<()> {
        daemon.kill()?;
        *daemon = self.start()?;
        Ok(())
    }
}

/// Looks up unchanged Services in the kernel until stopped: (lookups, misses).
struct Sampler {
    stop: Arc<AtomicBool>,
    lookups: Arc<AtomicUsize>,
    thread: kproxy_testbed::NsThread<anyhow::Result<usize>>,
}

impl Sampler {
    fn start(sandbox: &Sandbox, keys: Vec<kernel::MapKey>) -> anyhow::Result<Sampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let lookups = Arc::new(AtomicUsize::new(0));
        let (flag, count) = (stop.clone(), lookups.clone());
        let thread = sandbox.tb.node().spawn_in("fault-sampler", move || -> anyhow::Result<usize> {
            let mut probe = kernel::KernelProbe::open()?;
            let mut missing = 0;
            while !flag.load(Ordering::Relaxed) {
                for k in &keys {
                    count.fetch_add(1, Ordering::Relaxed);
                    if probe.key_data(k)?.is_none() {
                        missing += 1;
                    }
                }
                std::thread::sleep(SAMPLE_POLL);
            }
            Ok(missing)
        })?;
        Ok(Sampler { stop, lookups, thread })
    }

    fn stop(self) -> anyhow::Result<(usize, usize)> {
        self.stop.store(true, Ordering::Relaxed);
        let missing = self.thread.join()??;
        Ok((self.lookups.load(Ordering::Relaxed), missing))
    }
}

/// Another process committing batches to its own nf_tables table, as fast as `nft` goes.
struct Committer {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<usize>>,
}

impl Committer {
    fn start(node: &kproxy_testbed::Netns) -> anyhow::Result<Committer> {
        node.nft("add table ip bystander\nadd set ip bystander seen { type ipv4_addr; }")?;
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, name) = (stop.clone(), node.name().to_owned());
        let thread = std::thread::spawn(move || -> anyhow::Result<usize> {
            let script = "add element ip bystander seen { 192.0.2.1 }\ndelete element ip bystander seen { 192.0.2.1 }";
            let mut commits = 0;
            while !flag.load(Ordering::Relaxed) {
                let out = std::process::Command::new("ip").args(["netns", "exec", &name, "nft", script]).output()?;
                anyhow::ensure!(out.status.success(), "the bystander's batch failed");
                commits += 1;
            }
            Ok(commits)
        });
        Ok(Committer { stop, thread })
    }

    fn stop(self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let commits = self.thread.join().map_err(|_| anyhow::anyhow!("the committer panicked"))??;
        anyhow::ensure!(commits > 0, "the bystander never committed");
        Ok(())
    }
}

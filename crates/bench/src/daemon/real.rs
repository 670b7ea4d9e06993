//! `kproxy-bench daemon --api real`: kproxy and upstream kube-proxy v1.36.2 against a real
//! kube-apiserver + etcd (`kproxy-k8s-harness`, binaries from `KPROXY_K8S_DIR`), one after
//! the other on the same objects in the same run, each measured the same way from outside:
//! start → every Service's ClusterIP in the kernel, one endpoint address replaced through the
//! API server → the new address in the kernel, CPU (children included) and RSS from `/proc`.
//!
//! Per size: a fresh node namespace; etcd and kube-apiserver inside it on 127.0.0.1 (so the
//! proxies reach it as a node's kube-proxy reaches its API server, and share the node's two
//! cores with it); the cluster created through the API server; the time the API server takes
//! to serve the same lists to a bare client; then each proxy in turn, the ruleset flushed
//! between two.

mod bare;
pub(crate) mod bulk;
pub(crate) mod cache;
pub(crate) mod create;
pub(crate) mod observe;
mod report;
pub(crate) mod upstream;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use kproxy_k8s_harness::{Binaries, Binary, ControlPlane, ControlPlaneOptions, Identity};
use kproxy_testbed::{Netns, Testbed};
use serde::{Deserialize, Serialize};

use super::api::NODE_NAME;
use super::big::{self, BigResult, BigState};
use super::keep_result;
use super::kernel::{self, KernelProbe};
use super::kproxy::{self, Kproxy};
use super::objects::{self, Layout, TARGET_PORT};
use super::{DaemonArgs, Mode, Proxy, changes, commit, first_sync};

pub use bare::BareLists;
pub use create::Created;

/// The real pod address Service 0 points at (no pod runs: no traffic is measured here).
pub(crate) const WEB_POD: Ipv4Addr = Ipv4Addr::new(198, 18, 47, 254);
/// Time left to a proxy after its first sync before its idle window opens.
const SETTLE: Duration = Duration::from_secs(5);
/// A change not in the kernel after this long counts as not observed.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(60);
/// A change slower than this is named in the output, with when it was sent.
const SLOW_CHANGE_MS: f64 = 20.0;
/// ClusterIP ranges of the API server: every address `objects.rs` gives a Service.
pub(crate) const SERVICE_CIDRS: &str = "198.18.0.0/15,fd00:96::/108";
/// NodePorts `objects.rs` gives: 20000 + i/10 and health checks at 12000 + i/100.
pub(crate) const NODE_PORTS: (u16, u16) = (10000, 32767);

/// One proxy at one size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProxyResult {
    pub proxy: Proxy,
    pub mode: Mode,
    /// Which of the `--repeat` runs of this proxy and mode (from 1).
    #[serde(default = "first_run")]
    pub repeat: u32,
    /// `None`: no first sync within the bound (`--upstream-timeout` / `--start-timeout`).
    pub start_s: Option<f64>,
    pub start_by_listing: bool,
    /// CPU (user + system, children waited for included) from spawn to the first sync, s.
    pub start_cpu_s: f64,
    pub idle_s: f64,
    pub idle_cpu_pct: f64,
    /// Latencies of the observed changes, ms, sorted.
    pub change_ms: Vec<f64>,
    pub changes_timed: usize,
    pub rss_steady_mib: f64,
    pub rss_peak_mib: f64,
    pub rss_after_changes_mib: f64,
    /// CPU over the whole run of the proxy (start, idle, changes), s.
    pub cpu_total_s: f64,
    /// The big Service's changes and rollout (`--big-service`).
    #[serde(default)]
    pub big: Option<BigResult>,
}

fn first_run() -> u32 {
    1
}

/// One size: the cluster, what the API server takes to serve it, and each proxy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SizeResult {
    pub services: usize,
    /// Endpoints per Service and the big Service's.
    #[serde(default)]
    pub layout: Layout,
    pub endpoints: usize,
    pub created: Created,
    pub bare: BareLists,
    /// With `--big-service`: the big Service's changes and rollout through the API server alone.
    #[serde(default)]
    pub bare_big: Option<BigResult>,
    pub unsafe_no_fsync: bool,
    pub proxies: Vec<ProxyResult>,
    /// 1-minute load average at the start and at the end of the size.
    pub load: (f64, f64),
}

/// Runs every size; prints the report; true when every target of #27 met.
pub fn main(args: &DaemonArgs, proxies: &[Proxy]) -> anyhow::Result<bool> {
    let binaries = Binaries::locate().context("the Kubernetes binaries (KPROXY_K8S_DIR)")?;
    let kproxy_binary = kproxy::binary(args.kproxy.as_deref())?;
    let upstream_binary = binaries.path(Binary::KubeProxy)?;
    let apiserver_binary = binaries.path(Binary::KubeApiserver)?;
    let log_dir = kproxy::run_dir(args.log_dir.as_deref(), "kproxy-bench-daemon-real")?;
    let mut results = Vec::new();
    for &n in &args.services {
        anyhow::ensure!(
            (2..=objects::MAX_SERVICES).contains(&n),
            "--services {n}: between 2 and {}",
            objects::MAX_SERVICES
        );
        eprintln!("kproxy-bench daemon --api real: {n} services ...");
        let bins = Bins {
            binaries: &binaries,
            apiserver: &apiserver_binary,
            kproxy: &kproxy_binary,
            upstream: &upstream_binary,
        };
        let result =
            measure(n, args, proxies, &bins, &log_dir.join(n.to_string())).with_context(|| format!("{n} services"))?;
        keep_result(&mut results, result, n, args.json.as_deref())?;
    }
    let command: Vec<String> = std::env::args().collect();
    let (text, met) = report::render(&command.join(" "), args, &kproxy_binary, &results);
    print!("{text}");
    Ok(met)
}

struct Bins<'a> {
    binaries: &'a Binaries,
    apiserver: &'a Path,
    kproxy: &'a Path,
    upstream: &'a Path,
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn measure(n: usize, args: &DaemonArgs, proxies: &[Proxy], bins: &Bins, dir: &Path) -> anyhow::Result<SizeResult> {
    let load_before = load_average();
    std::fs::create_dir_all(dir)?;
    let tb = Testbed::new()?;
    let node = tb.node();
    let saved = (!args.no_cluster_cache).then(|| {
        let root = args
            .cluster_cache
            .clone()
            .unwrap_or_else(|| kproxy_k8s_harness::workspace_root().join("target").join("bench-clusters"));
        cache::SavedCluster::new(&root, n, args.layout(), bins.apiserver, "etcd-3.6")
    });
    let seed = saved.as_ref().and_then(cache::SavedCluster::etcd);
    let options = ControlPlaneOptions {
        etcd_seed: seed.clone(),
        netns: Some(PathBuf::from(format!("/run/netns/{}", node.name()))),
        unsafe_no_fsync: !args.etcd_fsync,
        service_cidr: "198.18.0.0/15".into(),
        node_port_range: NODE_PORTS,
        extra_apiserver_args: vec![format!("--service-cluster-ip-range={SERVICE_CIDRS}")],
        ..ControlPlaneOptions::default()
    };
    let mut plane = ControlPlane::start(bins.binaries, options).context("starting etcd and kube-apiserver")?;
    eprintln!("  API server {} (etcd --unsafe-no-fsync: {})", plane.url(), !args.etcd_fsync);
    let admin = plane.admin_kubeconfig().to_path_buf();
    let proxy_kubeconfig = plane.kubeconfig(&Identity::kube_proxy())?;

    // The runtime's threads are born in the node namespace, so are the sockets they open.
    let runtime =
        node.run_in(|| tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build())??;
    let client = in_node(node, &runtime, client(&admin))?;
    let created = match (&saved, seed) {
        (Some(saved), Some(seed)) => {
            eprintln!("  the cluster: etcd started from {} (written by an earlier run)", seed.display());
            saved.created()?
        }
        (saved, _) => {
            let concurrency = args.create_concurrency;
            let endpoints = (WEB_POD.into(), args.endpoints);
            let mut created = if n > args.store_directly_above {
                let etcd = plane.etcd_url();
                in_node(node, &runtime, bulk::cluster(&client, &etcd, n, endpoints, concurrency))?
            } else {
                in_node(node, &runtime, create::cluster(&client, n, endpoints, concurrency))?
            };
            if args.big_service > 0 {
                let started = Instant::now();
                let trigger = kproxy_servers::rfc3339_nano(Some(std::time::SystemTime::now()));
                let (slices, bytes) =
                    in_node(node, &runtime, create::create_big(&client, n, args.big_service, &trigger))?;
                created.services += 1;
                created.slices += slices;
                created.bytes += bytes;
                created.seconds += started.elapsed().as_secs_f64();
            }
            if let Some(saved) = saved {
                plane.save_etcd(&saved.etcd_dest()?).context("saving the cluster")?;
                saved.finish(&created)?;
            }
            created
        }
    };
    eprintln!(
        "  created {} Services and {} EndpointSlices in {:.1} s ({:.0} objects/s, {} in flight{})",
        created.services,
        created.slices,
        created.seconds,
        (created.services + created.slices) as f64 / created.seconds,
        created.concurrency,
        if created.stored_directly { "; dry-run creates put into etcd" } else { "" }
    );
    let bare = in_node(node, &runtime, bare::measure(&client, args.changes.max(1), args.change_interval()))?;
    if let Some(p) = &bare.protobuf {
        eprintln!(
            "  bare client, protobuf: lists {:.2} s ({} MiB), streaming lists {:.2} s",
            p.list_s,
            p.list_bytes >> 20,
            p.streaming_s
        );
    }
    eprintln!(
        "  bare client, JSON: lists {:.2} s ({} MiB), streaming lists {:.2} s, a change PATCH → watch p50 {} p99 {}",
        bare.list_s,
        bare.list_bytes >> 20,
        bare.streaming_s,
        super::report::ms(super::report::pct(&bare.watch_ms, 0.5)),
        super::report::ms(super::report::pct(&bare.watch_ms, 0.99)),
    );

    let mut current: HashMap<usize, objects::Endpoints> = HashMap::new();
    let mut big_state = (args.big_service > 0).then(|| BigState::new(n, args.big_service));
    let bare_big = match big_state.as_mut() {
        Some(state) => {
            let alone = in_node(node, &runtime, bare::big_service_trips(&client, state, args))?;
            let (changes, steps) = (alone.change_ms(), alone.rollout.as_ref().map(|r| r.step_ms()).unwrap_or_default());
            let ms = |v: &[f64], p| super::report::ms(super::report::pct(v, p));
            eprintln!(
                "  bare client, the big Service: one endpoint replaced, PATCH → watch p50 {}; a rollout step p50 {} p99 {}",
                ms(&changes, 0.5),
                ms(&steps, 0.5),
                ms(&steps, 0.99),
            );
            Some(alone)
        }
        None => None,
    };
    let mut results = Vec::new();
    let runs = proxies
        .iter()
        .flat_map(|p| args.modes.iter().map(move |m| (*p, *m)))
        .flat_map(|(p, m)| (1..=args.repeat).map(move |repeat| (p, m, repeat)));
    for (index, (proxy, mode, repeat)) in runs.enumerate() {
        node.nft("flush ruleset\n").context("flushing the node's ruleset between two proxies")?;
        let ctx = Run { node, n, args, runtime: &runtime, client: &client, dir };
        let turn = Turn { proxy, mode, repeat, index };
        let result = ctx
            .proxy(turn, bins, &proxy_kubeconfig, &mut current, big_state.as_mut())
            .with_context(|| format!("{} in {} mode, run {repeat}", proxy.as_str(), mode.as_str()))?;
        eprintln!("  {} {}: {}", proxy.as_str(), mode.as_str(), serde_json::to_string(&result).unwrap_or_default());
        results.push(result);
    }
    node.nft("flush ruleset\n")?;
    drop(plane);
    Ok(SizeResult {
        services: n,
        layout: args.layout(),
        endpoints: args.layout().endpoint_count(n),
        created,
        bare,
        bare_big,
        unsafe_no_fsync: !args.etcd_fsync,
        proxies: results,
        load: (load_before, load_average()),
    })
}

/// Runs `future` to its end from a thread in the node namespace: connections are made by the
/// task that needs them, so `block_on`'s own thread must be in the namespace too.
fn in_node<T: Send>(
    node: &Netns,
    runtime: &tokio::runtime::Runtime,
    future: impl std::future::Future<Output = anyhow::Result<T>> + Send,
) -> anyhow::Result<T> {
    node.run_in(|| runtime.block_on(future))?
}

async fn client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    let file = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// One run of one proxy: which proxy, in which mode, which of its `--repeat` runs, and its
/// place among every run of the size (which decides the changes it makes).
#[derive(Clone, Copy)]
struct Turn {
    proxy: Proxy,
    mode: Mode,
    repeat: u32,
    index: usize,
}

/// What every proxy's run shares.
struct Run<'a> {
    node: &'a Netns,
    n: usize,
    args: &'a DaemonArgs,
    runtime: &'a tokio::runtime::Runtime,
    client: &'a kube::Client,
    dir: &'a Path,
}

impl Run<'_> {
    fn proxy(
        &self,
        turn: Turn,
        bins: &Bins,
        kubeconfig: &Path,
        current: &mut HashMap<usize, objects::Endpoints>,
        big_state: Option<&mut BigState>,
    ) -> anyhow::Result<ProxyResult> {
        let Turn { proxy, mode, repeat, index: run } = turn;
        let (binary, flags, timeout) = match proxy {
            Proxy::Kproxy => {
                let mut flags = kproxy::args(kubeconfig, NODE_NAME, mode);
                flags.extend(self.args.kproxy_args.iter().cloned());
                (bins.kproxy, flags, self.args.start_timeout)
            }
            // The same command line as kproxy's: kube-proxy reads every one of its flags alike.
            Proxy::Upstream => (bins.upstream, kproxy::args(kubeconfig, NODE_NAME, mode), self.args.upstream_timeout),
        };
        let log = match self.args.repeat {
            1 => self.dir.join(format!("{}-{}.log", proxy.as_str(), mode.as_str())),
            _ => self.dir.join(format!("{}-{}-{repeat}.log", proxy.as_str(), mode.as_str())),
        };
        eprintln!("  {} {} mode, log {}", proxy.as_str(), mode.as_str(), log.display());
        let mut daemon = Kproxy::start(self.node, binary, &flags, &log)?;
        let memory_watch = daemon.watch_memory();
        let started = match (proxy, mode) {
            (Proxy::Upstream, Mode::Nftables) => {
                observe::wait_upstream_nft(self.node, self.n, self.args.layout(), &mut daemon, timeout)
            }
            // Upstream's iptables layout and kproxy's share `KUBE-SERVICES` and its jumps.
            _ => first_sync::wait(self.node, self.n, self.args.layout(), &mut daemon, timeout, mode),
        };
        let (start_s, start_by_listing) = match started {
            Ok((s, by)) => (Some(s), by),
            Err(e) if daemon.alive() => {
                eprintln!("  no first sync within {timeout} s: {e:#}");
                (None, false)
            }
            Err(e) => return Err(e),
        };
        let start_cpu_s = daemon.cpu_seconds()?;
        let mut result = ProxyResult {
            proxy,
            mode,
            repeat,
            start_s,
            start_by_listing,
            start_cpu_s,
            idle_s: 0.0,
            idle_cpu_pct: f64::NAN,
            change_ms: Vec::new(),
            changes_timed: 0,
            rss_steady_mib: f64::NAN,
            rss_peak_mib: f64::NAN,
            rss_after_changes_mib: f64::NAN,
            cpu_total_s: start_cpu_s,
            big: None,
        };
        if start_s.is_none() {
            result.rss_peak_mib = memory_watch.stop().peak;
            return Ok(result);
        }
        eprintln!("  first sync in the kernel after {:.2} s ({start_cpu_s:.1} s of CPU)", start_s.unwrap_or_default());
        std::thread::sleep(SETTLE);
        let cpu_before = daemon.cpu_seconds()?;
        let idle_started = Instant::now();
        std::thread::sleep(Duration::from_secs(self.args.idle));
        result.idle_s = idle_started.elapsed().as_secs_f64();
        result.idle_cpu_pct = (daemon.cpu_seconds()? - cpu_before) / result.idle_s * 100.0;
        result.rss_steady_mib = daemon.memory_mib()?.rss;

        let timed = self.changes(proxy, mode, run, current, &mut daemon)?;
        result.changes_timed = timed.len();
        result.change_ms = timed.into_iter().flatten().collect();
        result.change_ms.sort_by(f64::total_cmp);
        std::thread::sleep(Duration::from_secs(1));
        let memory = daemon.memory_mib()?;
        result.rss_after_changes_mib = memory.rss;
        if let Some(state) = big_state {
            let writer = big::Writer::Real { runtime: self.runtime, client: self.client };
            result.big = Some(big::measure(self.node, &writer, state, proxy, mode, self.args, &mut daemon)?);
        }
        let memory = daemon.memory_mib()?;
        result.rss_peak_mib = memory_watch.stop().peak.max(memory.peak);
        result.cpu_total_s = daemon.cpu_seconds()?;
        daemon.kill()?;
        Ok(result)
    }

    /// `--changes` endpoint replacements through the API server, one per `--change-interval-ms`
    /// (the next waits for the last to be seen), each timed from before the PATCH is sent to
    /// the kernel showing the new address. Run `run` takes changes `run·C .. (run+1)·C`, so
    /// every proxy gets changes of the same kind to Services spread the same way.
    fn changes(
        &self,
        proxy: Proxy,
        mode: Mode,
        run: usize,
        current: &mut HashMap<usize, objects::Endpoints>,
        daemon: &mut Kproxy,
    ) -> anyhow::Result<Vec<Option<f64>>> {
        let count = self.args.changes;
        let interval = self.args.change_interval();
        let web: IpAddr = WEB_POD.into();
        self.node.run_in(|| -> anyhow::Result<Vec<Option<f64>>> {
            let mut kproxy_probe = KernelProbe::open()?;
            let mut upstream_probe = KernelProbe::open_table(upstream::NFT_TABLE)?;
            let mut nat_probe = KernelProbe::open_table("nat")?;
            let table = match proxy {
                Proxy::Kproxy => kernel::TABLE,
                Proxy::Upstream => upstream::NFT_TABLE,
            };
            let mut monitor = commit::monitor(&commit::tables(mode, table))?;
            let mut timed = Vec::new();
            let mut next = Instant::now();
            for k in run * count..(run + 1) * count {
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
                next += interval;
                let i = changes::changed_service(k, self.n);
                let per = self.args.endpoints;
                let eps =
                    current.entry(i).or_insert_with(|| objects::initial_endpoints(i, false, (web, NODE_NAME), per));
                let fresh: IpAddr = objects::fresh_endpoint(k).into();
                let j = k % eps.len();
                eps[j].0 = fresh;
                let eps = eps.clone();
                let ip: IpAddr = objects::cluster_ip_v4(i).into();
                let want = kernel::endpoint_data(fresh, TARGET_PORT);
                let svc_chain = objects::svc_chain(i);
                let nft_chain = upstream::nft_service_chain(i);
                let sep_chain = upstream::iptables_endpoint_chain(i, fresh);
                // The kernel is watched from the moment the PATCH leaves, not from its answer:
                // a proxy may program the change before the API server has answered the writer.
                let client = self.client.clone();
                let sent_at = std::time::SystemTime::now();
                let sent = Instant::now();
                let patch = self.runtime.spawn(async move { create::set_endpoints(&client, i, &eps).await });
                let latency = commit::wait(sent, CHANGE_TIMEOUT, &mut monitor, || {
                    Ok(match (proxy, mode) {
                        (Proxy::Kproxy, Mode::Nftables) => kproxy_probe.endpoint_in_slots(
                            ip,
                            objects::service_port(i),
                            self.args.endpoints as u32 + 3,
                            &want,
                        )?,
                        (Proxy::Kproxy, Mode::Iptables) => kproxy_probe
                            .iptables_rules(ip, "nat", &svc_chain)?
                            .is_some_and(|rules| kernel::mention(&rules, &kernel::ip_bytes(fresh))),
                        (Proxy::Upstream, Mode::Nftables) => upstream_probe.rule_map_holds(ip, &nft_chain, &want)?,
                        (Proxy::Upstream, Mode::Iptables) => nat_probe.chain_exists(ip, &sep_chain)?,
                    })
                })?;
                self.runtime.block_on(patch)??;
                match latency {
                    None => eprintln!("  change {k} (Service {i}, {fresh}) not seen within {CHANGE_TIMEOUT:?}"),
                    // Its PATCH's wall-clock time, to find it in the proxy's and API server's logs.
                    Some(ms) if ms > SLOW_CHANGE_MS => {
                        let at = kproxy_servers::rfc3339_nano(Some(sent_at));
                        eprintln!("  change {k} (Service {i}) took {ms:.1} ms; its PATCH left at {at}");
                    }
                    Some(_) => {}
                }
                timed.push(latency);
                anyhow::ensure!(daemon.alive(), "the proxy exited during the changes");
            }
            Ok(timed)
        })?
    }
}

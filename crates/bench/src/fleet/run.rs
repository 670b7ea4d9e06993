//! One cluster size: the network, the control plane, the objects, then each fleet in turn
//! (`--nodes` × `--proxies`), each measured the same way (see `docs/benchmarks.md`, "Fleet").

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Node;
use kproxy_k8s_harness::{Binaries, ControlPlane, ControlPlaneOptions, Identity};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::FleetArgs;
use super::interrupt;
use super::net::{self, ByteCounters, Bytes, Network, PLANE_V4};
use super::observe::{Change, Expected, Observers};
use super::proxies::Fleet;
use super::server::{self, Audit, PeakWatch, Requests};
use crate::daemon::api::NODE_NAME;
use crate::daemon::objects::{self, Endpoints, Layout};
use crate::daemon::real::cache::SavedCluster;
use crate::daemon::real::create::{self, Created};
use crate::daemon::real::{NODE_PORTS, SERVICE_CIDRS, WEB_POD, bulk};
use crate::daemon::{Proxy, changes};

/// The binaries a run starts.
pub struct Bins {
    pub binaries: Binaries,
    pub apiserver: PathBuf,
    pub kproxy: PathBuf,
    pub upstream: PathBuf,
}

impl Bins {
    fn of(&self, proxy: Proxy) -> &Path {
        match proxy {
            Proxy::Kproxy => &self.kproxy,
            Proxy::Upstream => &self.upstream,
        }
    }
}

/// The load averages (1, 5, 15 minutes) from `/proc/loadavg`, as `uptime` prints them.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Load(pub f64, pub f64, pub f64);

impl Load {
    pub fn now() -> Load {
        let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let mut v = text.split_whitespace().map(|f| f.parse::<f64>().unwrap_or(f64::NAN));
        Load(v.next().unwrap_or(f64::NAN), v.next().unwrap_or(f64::NAN), v.next().unwrap_or(f64::NAN))
    }
}

impl std::fmt::Display for Load {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2}, {:.2}, {:.2}", self.0, self.1, self.2)
    }
}

/// One cluster size.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SizeResult {
    pub services: usize,
    pub created: Created,
    pub unsafe_no_fsync: bool,
    /// The API server with no proxy at all.
    pub baseline: Baseline,
    pub fleets: Vec<FleetResult>,
}

/// The API server without proxies: idle, and the same kind of changes with nobody watching.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Baseline {
    pub idle: Idle,
    pub apiserver_rss_mib: f64,
    pub changes: usize,
    /// The API server's CPU per change (the PATCH itself) in its [`FAN_OUT`] window, ms.
    pub apiserver_cpu_per_change_ms: f64,
    pub etcd_cpu_per_change_ms: f64,
}

/// An idle window.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Idle {
    pub seconds: f64,
    pub apiserver_cpu_pct: f64,
    pub etcd_cpu_pct: f64,
    /// Bytes per second the API server sent to the fleet (watch bookmarks, ...).
    pub bytes_sent_per_s: f64,
}

/// One fleet: a proxy, a number of nodes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FleetResult {
    pub proxy: Proxy,
    pub nodes: usize,
    /// Load averages when the fleet's turn began and ended.
    pub load: (Load, Load),
    /// The API server freshly restarted, before the fleet starts.
    pub before: Idle,
    pub apiserver_rss_before_mib: f64,
    pub cold: ColdStart,
    /// With the fleet running, before its changes.
    pub idle: Idle,
    pub changes: Changes,
    pub restart: Option<Restart>,
    /// Each proxy's `VmRSS` after the changes (before the restart), MiB, sorted.
    pub rss_mib: Vec<f64>,
    /// The largest `VmHWM` of a proxy at the end of its fleet's turn, MiB.
    pub rss_peak_mib: f64,
}

/// The fleet's cold start: every proxy spawned at once, until the last one's first sync is in
/// its kernel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ColdStart {
    /// First spawn → the last proxy's first sync in its kernel, s (`None`: not every proxy
    /// within `--start-timeout`).
    pub last_s: Option<f64>,
    /// Each proxy: its spawn → its first sync in its kernel, s, sorted (those seen).
    pub proxy_s: Vec<f64>,
    pub synced: usize,
    /// The window: first spawn → last first sync (or the timeout), s.
    pub window_s: f64,
    pub apiserver_cpu_s: f64,
    pub etcd_cpu_s: f64,
    pub apiserver_peak_rss_mib: f64,
    pub etcd_peak_rss_mib: f64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Bytes the API server sent each proxy, sorted.
    pub bytes_sent_per_proxy: Vec<u64>,
    pub fleet_cpu_s: f64,
    pub requests: Requests,
    /// Poll interval of the first-sync look (its resolution), ms.
    pub poll_ms: f64,
    pub load: (Load, Load),
}

/// The timed changes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Changes {
    pub count: usize,
    /// Every (proxy, change) seen: PATCH sent → the kernel's notice, ms, sorted.
    pub latency_ms: Vec<f64>,
    /// (proxy, change) pairs not seen within `--change-timeout`.
    pub missed: usize,
    /// Per change seen by every proxy: PATCH → the last kernel, ms, sorted.
    pub last_ms: Vec<f64>,
    /// First PATCH → one second after the last change was everywhere, s.
    pub window_s: f64,
    pub apiserver_cpu_s: f64,
    pub etcd_cpu_s: f64,
    /// Every change's [`FAN_OUT`] window (from just before its PATCH) summed, s; the API
    /// server's and etcd's CPU in those windows, s.
    pub fan_out_s: f64,
    pub fan_out_apiserver_cpu_s: f64,
    pub fan_out_etcd_cpu_s: f64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub fleet_cpu_s: f64,
    pub load: (Load, Load),
}

/// The window after each PATCH in which the API server's and etcd's CPU is charged to the
/// change: the write, and the watch event encoded and sent to every watcher, are done well
/// within it, and it is the same for every fleet whatever its proxies' programming latency (the
/// whole changes window of a slow fleet is longer and holds more idle work, which subtracting
/// an idle rate measured over a few seconds takes out only roughly). Read to the nanosecond
/// ([`server::plane_cpu_seconds`]), not in `/proc/<pid>/stat`'s 10 ms ticks.
pub const FAN_OUT: Duration = Duration::from_millis(500);

/// CPU of the API server and etcd in a [`FAN_OUT`] window, read at both ends (the far end by
/// a thread, as the caller may still be waiting for the change in the kernels).
struct FanOut {
    before: PlaneCpu,
    after: std::thread::JoinHandle<anyhow::Result<PlaneCpu>>,
}

impl FanOut {
    fn start(pids: (u32, u32)) -> anyhow::Result<FanOut> {
        let before = plane_cpu(pids)?;
        let end = before.at + FAN_OUT;
        let after = std::thread::spawn(move || {
            std::thread::sleep(end.saturating_duration_since(Instant::now()));
            plane_cpu(pids)
        });
        Ok(FanOut { before, after })
    }

    /// (window s, API server CPU s, etcd CPU s).
    fn finish(self) -> anyhow::Result<(f64, f64, f64)> {
        let after = self.after.join().map_err(|_| anyhow::anyhow!("the CPU sampling thread panicked"))??;
        Ok((
            after.at.duration_since(self.before.at).as_secs_f64(),
            after.apiserver - self.before.apiserver,
            after.etcd - self.before.etcd,
        ))
    }
}

fn plane_cpu((apiserver, etcd): (u32, u32)) -> anyhow::Result<PlaneCpu> {
    Ok(PlaneCpu {
        apiserver: server::plane_cpu_seconds(apiserver)?,
        etcd: server::plane_cpu_seconds(etcd)?,
        at: Instant::now(),
    })
}

/// The API server stopped and started again under the running fleet, then one change.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Restart {
    /// SIGTERM to the API server → its `/readyz` answering 200 again, s.
    pub stop_to_ready_s: f64,
    /// Ready → the change in the last kernel, s (`None`: not in every kernel in time).
    pub ready_to_last_s: Option<f64>,
    /// Ready → the change in each kernel, s, sorted (those seen).
    pub ready_to_proxy_s: Vec<f64>,
    pub seen: usize,
    /// Ready → the PATCH sent, s.
    pub ready_to_patch_s: f64,
    /// The new API server's peak RSS, its start included (`VmHWM`, and `VmRSS` sampled).
    pub apiserver_peak_rss_mib: f64,
    /// The new API server's CPU from its start to the end of the window, s.
    pub apiserver_cpu_s: f64,
    pub etcd_cpu_s: f64,
    /// SIGTERM → the end of the window (the last kernel + `--settle`), s.
    pub window_s: f64,
    pub bytes_sent: u64,
    /// The fleet's requests from the stop to the end of the window.
    pub requests: Requests,
    pub load: (Load, Load),
}

/// What every fleet of a size shares.
struct Size<'a> {
    args: &'a FleetArgs,
    bins: &'a Bins,
    services: usize,
    network: &'a Network,
    plane: ControlPlane,
    counters: ByteCounters<'a>,
    audit: Audit,
    runtime: tokio::runtime::Runtime,
    client: kube::Client,
    observers: Observers,
    kubeconfig: PathBuf,
    node_ips: Vec<Ipv4Addr>,
    /// Each changed Service's endpoints as last written.
    current: HashMap<usize, Endpoints>,
    /// The next change's number (every change of the run is a different one).
    next_change: usize,
    dir: &'a Path,
}

/// Measures one cluster size: every fleet of `args`.
pub fn size(services: usize, args: &FleetArgs, bins: &Bins, dir: &Path) -> anyhow::Result<SizeResult> {
    std::fs::create_dir_all(dir)?;
    let max_nodes = args.nodes.iter().copied().max().unwrap_or(1);
    eprintln!("  network: a control plane namespace and {max_nodes} node namespaces");
    let network = Network::build(max_nodes)?;
    let saved = (!args.no_cluster_cache).then(|| {
        let root = args
            .cluster_cache
            .clone()
            .unwrap_or_else(|| kproxy_k8s_harness::workspace_root().join("target").join("bench-clusters"));
        SavedCluster::new(&root, services, Layout::default(), &bins.apiserver, "etcd-3.6")
    });
    let seed = saved.as_ref().and_then(SavedCluster::etcd);
    let audit = Audit::new(dir)?;
    let mut extra = vec![
        format!("--service-cluster-ip-range={SERVICE_CIDRS}"),
        // The `kubernetes` Service keeps no endpoints, as in `daemon --api real` (bound to
        // loopback there): no object of the API server's own changes under the fleets.
        "--endpoint-reconciler-type=none".into(),
    ];
    extra.extend(audit.apiserver_args());
    let options = ControlPlaneOptions {
        etcd_seed: seed.clone(),
        netns: Some(network.plane.path()),
        bind: PLANE_V4.into(),
        unsafe_no_fsync: !args.etcd_fsync,
        service_cidr: "198.18.0.0/15".into(),
        node_port_range: NODE_PORTS,
        extra_apiserver_args: extra,
        ..ControlPlaneOptions::default()
    };
    let mut plane = ControlPlane::start(&bins.binaries, options).context("starting etcd and kube-apiserver")?;
    interrupt::dir(plane.work_dir());
    record_plane(&plane);
    eprintln!("  API server {} (etcd --unsafe-no-fsync: {})", plane.url(), !args.etcd_fsync);
    let counters = ByteCounters::install(&network.plane, plane.port(), max_nodes)?;
    let kubeconfig = plane.kubeconfig(&Identity::kube_proxy())?;
    let runtime = network
        .plane
        .run_in(|| tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build())??;
    let admin = plane.admin_kubeconfig().to_path_buf();
    let client = on(&runtime, async move {
        let file = kube::config::Kubeconfig::read_from(&admin)?;
        let config = kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(config)?)
    })?;
    let created = match (&saved, seed) {
        (Some(saved), Some(seed)) => {
            eprintln!("  the cluster: etcd started from {} (written by an earlier run)", seed.display());
            saved.created()?
        }
        (saved, _) => {
            let concurrency = args.create_concurrency;
            let endpoints = (WEB_POD.into(), Layout::default().endpoints);
            let created = if services > args.store_directly_above {
                let (client, etcd) = (client.clone(), plane.etcd_url());
                on(&runtime, async move { bulk::cluster(&client, &etcd, services, endpoints, concurrency).await })?
            } else {
                let client = client.clone();
                on(&runtime, async move { create::cluster(&client, services, endpoints, concurrency).await })?
            };
            if let Some(saved) = saved {
                plane.save_etcd(&saved.etcd_dest()?).context("saving the cluster")?;
                record_plane(&plane);
                saved.finish(&created)?;
            }
            created
        }
    };
    eprintln!(
        "  {} Services and {} EndpointSlices ({:.0} s to write{})",
        created.services,
        created.slices,
        created.seconds,
        if created.reused_from.is_some() { ", reused" } else { "" }
    );
    {
        let client = client.clone();
        on(&runtime, async move { create_nodes(&client, max_nodes).await })?;
    }
    let observers = Observers::start(&network.nodes, Expected::of(services))?;
    let mut size = Size {
        args,
        bins,
        services,
        network: &network,
        counters,
        audit,
        runtime,
        client,
        observers,
        kubeconfig,
        node_ips: (0..max_nodes).map(net::node_v4).collect(),
        current: HashMap::new(),
        next_change: 0,
        dir,
        plane,
    };
    let baseline = size.baseline()?;
    eprintln!(
        "  no proxy: API server idle {:.1} % CPU, {:.0} MiB; a change costs it {:.1} ms of CPU",
        baseline.idle.apiserver_cpu_pct, baseline.apiserver_rss_mib, baseline.apiserver_cpu_per_change_ms
    );
    let mut fleets = Vec::new();
    for &nodes in &args.nodes {
        for &proxy in &args.proxies {
            eprintln!("  {} × {nodes} (load {}) ...", proxy.as_str(), Load::now());
            let result = size.fleet(proxy, nodes).with_context(|| format!("{} × {nodes}", proxy.as_str()))?;
            eprintln!("  {} × {nodes}: {}", proxy.as_str(), serde_json::to_string(&result).unwrap_or_default());
            fleets.push(result);
        }
    }
    drop(size.observers);
    interrupt::forget_dir(size.plane.work_dir());
    drop(size.plane);
    interrupt::plane(&[]);
    Ok(SizeResult { services, created, unsafe_no_fsync: !args.etcd_fsync, baseline, fleets })
}

/// Runs `future` on `runtime` (whose threads are in the control plane's namespace, so are the
/// connections its tasks open) and waits for it.
fn on<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    future: impl std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
) -> anyhow::Result<T> {
    runtime.block_on(runtime.spawn(future))?
}

/// Records the control plane's processes for the signal handler.
fn record_plane(plane: &ControlPlane) {
    let pids: Vec<u32> = plane.pids().into_iter().map(|(_, pid)| pid).collect();
    interrupt::plane(&pids);
}

/// The pid of the plane's `component` (`kube-apiserver`, `etcd`).
fn pid_of(plane: &ControlPlane, component: &str) -> anyhow::Result<u32> {
    plane.pids().into_iter().find(|(name, _)| name == component).map(|(_, pid)| pid).context(component.to_owned())
}

/// Node objects `node-1` … `node-N`, each with its namespace's addresses.
async fn create_nodes(client: &kube::Client, count: usize) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for k in 0..count {
        let name = net::node_name(k);
        let pod_cidrs = [format!("198.18.{}.{}/28", 16 + k / 16, (k % 16) * 16), format!("fd00:10:16:{k:x}::/64")];
        let object = objects::node(&name, net::node_v4(k), net::node_v6(k), [&pod_cidrs[0], &pod_cidrs[1]]);
        let node: Node = serde_json::from_value(create::for_create(object.clone()))?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e).with_context(|| format!("creating Node {name}")),
        }
        let status = Patch::Merge(json!({"status": object["status"]}));
        let params = PatchParams::default();
        create::retry(|| nodes.patch_status(&name, &params, &status))
            .await
            .with_context(|| format!("writing the addresses of Node {name}"))?;
    }
    Ok(())
}

/// CPU of the API server and etcd at one moment.
#[derive(Clone, Copy)]
struct PlaneCpu {
    apiserver: f64,
    etcd: f64,
    at: Instant,
}

impl Size<'_> {
    fn apiserver_pid(&self) -> anyhow::Result<u32> {
        pid_of(&self.plane, "kube-apiserver")
    }

    fn etcd_pid(&self) -> anyhow::Result<u32> {
        pid_of(&self.plane, "etcd")
    }

    fn cpu(&self) -> anyhow::Result<PlaneCpu> {
        Ok(PlaneCpu {
            apiserver: server::plane_cpu_seconds(self.apiserver_pid()?)?,
            etcd: server::plane_cpu_seconds(self.etcd_pid()?)?,
            at: Instant::now(),
        })
    }

    fn bytes(&self) -> anyhow::Result<Bytes> {
        self.counters.read()
    }

    /// `seconds` of idling, measured.
    fn idle(&self, nodes: usize) -> anyhow::Result<Idle> {
        let (cpu, bytes) = (self.cpu()?, self.bytes()?);
        std::thread::sleep(Duration::from_secs(self.args.idle));
        let (cpu2, bytes2) = (self.cpu()?, self.bytes()?);
        let seconds = cpu2.at.duration_since(cpu.at).as_secs_f64();
        Ok(Idle {
            seconds,
            apiserver_cpu_pct: (cpu2.apiserver - cpu.apiserver) / seconds * 100.0,
            etcd_cpu_pct: (cpu2.etcd - cpu.etcd) / seconds * 100.0,
            bytes_sent_per_s: bytes2.sent_since(&bytes, nodes) as f64 / seconds,
        })
    }

    /// Restarts the API server (same etcd, same port) and waits `--settle`.
    fn fresh_apiserver(&mut self) -> anyhow::Result<()> {
        self.plane.restart_apiserver().context("restarting the API server")?;
        record_plane(&self.plane);
        std::thread::sleep(Duration::from_secs(self.args.settle));
        Ok(())
    }

    /// The next change: Service, its new endpoints, and the address brought in.
    fn next_change(&mut self) -> (usize, Endpoints, IpAddr) {
        let k = self.next_change;
        self.next_change += 1;
        let i = changes::changed_service(k, self.services);
        let web: IpAddr = WEB_POD.into();
        let eps = self
            .current
            .entry(i)
            .or_insert_with(|| objects::initial_endpoints(i, false, (web, NODE_NAME), Layout::default().endpoints));
        let fresh: IpAddr = objects::fresh_endpoint(k).into();
        let j = k % eps.len();
        eps[j].0 = fresh;
        (i, eps.clone(), fresh)
    }

    /// Sends change `(i, eps)` through the API server (tried again on a busy server or a
    /// connection cut, as after a restart); returns the task and when it left.
    fn patch(&self, i: usize, eps: Endpoints) -> (Instant, tokio::task::JoinHandle<anyhow::Result<()>>) {
        let client = self.client.clone();
        let sent = Instant::now();
        let task = self.runtime.spawn(async move {
            let mut attempt = 0u64;
            loop {
                match create::set_endpoints(&client, i, &eps).await {
                    Ok(()) => return Ok(()),
                    Err(e) if attempt < 20 => {
                        tracing::debug!("change of Service {i}, attempt {attempt}: {e:#}");
                        attempt += 1;
                        tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        });
        (sent, task)
    }

    /// The API server alone: idle, and `--changes` changes with no proxy watching.
    fn baseline(&mut self) -> anyhow::Result<Baseline> {
        self.fresh_apiserver()?;
        let idle = self.idle(0)?;
        let apiserver_rss_mib = server::rss_mib(self.apiserver_pid()?)?;
        let count = self.args.changes;
        let pids = (self.apiserver_pid()?, self.etcd_pid()?);
        let (mut window, mut apiserver, mut etcd) = (0.0, 0.0, 0.0);
        for _ in 0..count {
            let (i, eps, _) = self.next_change();
            let fan_out = FanOut::start(pids)?;
            let (_, task) = self.patch(i, eps);
            self.runtime.block_on(task)??;
            let (w, a, e) = fan_out.finish()?;
            (window, apiserver, etcd) = (window + w, apiserver + a, etcd + e);
            std::thread::sleep(Duration::from_millis(self.args.change_interval_ms).saturating_sub(FAN_OUT));
        }
        // The idle CPU of the windows is taken out: what is left is the changes'.
        let per_change = |spent: f64, idle_pct: f64| (spent - idle_pct / 100.0 * window) / count.max(1) as f64 * 1000.0;
        Ok(Baseline {
            apiserver_cpu_per_change_ms: per_change(apiserver, idle.apiserver_cpu_pct),
            etcd_cpu_per_change_ms: per_change(etcd, idle.etcd_cpu_pct),
            idle,
            apiserver_rss_mib,
            changes: count,
        })
    }

    /// One fleet's turn, from a freshly restarted API server to the fleet killed and its rules
    /// flushed.
    fn fleet(&mut self, proxy: Proxy, nodes: usize) -> anyhow::Result<FleetResult> {
        let load_before = Load::now();
        self.fresh_apiserver()?;
        let before = self.idle(nodes)?;
        let apiserver_rss_before_mib = server::rss_mib(self.apiserver_pid()?)?;
        let logs = self.dir.join(format!("{}-{nodes}", proxy.as_str()));
        let (cold, mut fleet) = self.cold_start(proxy, nodes, &logs)?;
        let result = self.running(&mut fleet, cold, before, apiserver_rss_before_mib, load_before);
        drop(fleet);
        self.observers.unsubscribe(nodes)?;
        for node in &self.network.nodes[..nodes] {
            node.nft("flush ruleset\n").context("flushing a node's ruleset after its fleet")?;
        }
        result
    }

    fn cold_start(&mut self, proxy: Proxy, nodes: usize, logs: &Path) -> anyhow::Result<(ColdStart, Fleet)> {
        let load = Load::now();
        let audit_offset = self.audit.offset();
        let (cpu, bytes) = (self.cpu()?, self.bytes()?);
        let peaks = PeakWatch::start(vec![self.apiserver_pid()?, self.etcd_pid()?]);
        let nodes_ns = &self.network.nodes[..nodes];
        let mut fleet = Fleet::start(proxy, self.bins.of(proxy), nodes_ns, &self.kubeconfig, logs)?;
        let first_spawn = fleet.started[0];
        let deadline = first_spawn + Duration::from_secs(self.args.start_timeout);
        // Polls of the proxies not yet synced: about 400 looks a second in all, at most one per
        // proxy every 20 ms.
        let poll = Duration::from_micros((nodes as u64 * 2500).clamp(20_000, 250_000));
        let synced = {
            let fleet = &mut fleet;
            self.observers.first_sync(nodes, proxy, deadline, poll, &mut || fleet.check_alive())?
        };
        let end = synced.iter().flatten().max().copied().filter(|_| synced.iter().all(Option::is_some));
        let (cpu2, bytes2) = (self.cpu()?, self.bytes()?);
        let peaks = peaks.stop();
        let fleet_cpu_s = fleet.cpu_seconds()?;
        let mut proxy_s: Vec<f64> = synced
            .iter()
            .zip(&fleet.started)
            .filter_map(|(at, started)| at.map(|at| at.duration_since(*started).as_secs_f64()))
            .collect();
        proxy_s.sort_by(f64::total_cmp);
        let mut per_proxy = bytes2.sent_per_node(&bytes, nodes);
        per_proxy.sort_unstable();
        let cold = ColdStart {
            last_s: end.map(|end| end.duration_since(first_spawn).as_secs_f64()),
            synced: proxy_s.len(),
            proxy_s,
            window_s: cpu2.at.duration_since(first_spawn).as_secs_f64(),
            apiserver_cpu_s: cpu2.apiserver - cpu.apiserver,
            etcd_cpu_s: cpu2.etcd - cpu.etcd,
            apiserver_peak_rss_mib: peaks.first().copied().unwrap_or(f64::NAN),
            etcd_peak_rss_mib: peaks.get(1).copied().unwrap_or(f64::NAN),
            bytes_sent: bytes2.sent_since(&bytes, nodes),
            bytes_received: bytes2.received_since(&bytes, nodes),
            bytes_sent_per_proxy: per_proxy,
            fleet_cpu_s,
            requests: self.audit.since(audit_offset, &self.node_ips[..nodes])?,
            poll_ms: poll.as_secs_f64() * 1000.0,
            load: (load, Load::now()),
        };
        eprintln!(
            "    cold start: {} of {nodes} synced, the last after {}; API server {:.1} s CPU, peak {:.0} MiB; {:.1} MiB sent",
            cold.synced,
            cold.last_s.map_or("-".into(), |s| format!("{s:.2} s")),
            cold.apiserver_cpu_s,
            cold.apiserver_peak_rss_mib,
            cold.bytes_sent as f64 / 1048576.0
        );
        Ok((cold, fleet))
    }

    /// Everything after the cold start, while the fleet runs.
    fn running(
        &mut self,
        fleet: &mut Fleet,
        cold: ColdStart,
        before: Idle,
        apiserver_rss_before_mib: f64,
        load_before: Load,
    ) -> anyhow::Result<FleetResult> {
        let (proxy, nodes) = (fleet.proxy(), fleet.len());
        if cold.last_s.is_none() {
            eprintln!("    not every proxy synced within --start-timeout: no changes, no restart");
            let memory = fleet.memory()?;
            return Ok(FleetResult {
                proxy,
                nodes,
                load: (load_before, Load::now()),
                before,
                apiserver_rss_before_mib,
                changes: Changes::none(),
                idle: Idle::default(),
                restart: None,
                rss_mib: sorted(memory.iter().map(|m| m.rss).collect()),
                rss_peak_mib: memory.iter().map(|m| m.peak).fold(0.0, f64::max),
                cold,
            });
        }
        std::thread::sleep(Duration::from_secs(self.args.settle));
        fleet.check_alive()?;
        let idle = self.idle(nodes)?;
        self.observers.subscribe(nodes, proxy)?;
        let changes = self.changes(fleet)?;
        eprintln!(
            "    changes: {} seen of {}; PATCH → last kernel p50 {:.1} ms, max {:.1} ms",
            changes.latency_ms.len(),
            changes.count * nodes,
            crate::daemon::report::pct(&changes.last_ms, 0.5),
            changes.last_ms.last().copied().unwrap_or(f64::NAN)
        );
        let memory = fleet.memory()?;
        let rss_mib = sorted(memory.iter().map(|m| m.rss).collect());
        let restart = if self.args.no_restart { None } else { Some(self.restart(fleet)?) };
        let memory = fleet.memory()?;
        fleet.check_alive()?;
        Ok(FleetResult {
            proxy,
            nodes,
            load: (load_before, Load::now()),
            before,
            apiserver_rss_before_mib,
            cold,
            idle,
            changes,
            restart,
            rss_mib,
            rss_peak_mib: memory.iter().map(|m| m.peak).fold(0.0, f64::max),
        })
    }

    /// `--changes` changes, each timed to every kernel.
    fn changes(&mut self, fleet: &mut Fleet) -> anyhow::Result<Changes> {
        let (proxy, nodes) = (fleet.proxy(), fleet.len());
        let load = Load::now();
        let count = self.args.changes;
        let timeout = Duration::from_secs(self.args.change_timeout);
        let (cpu, bytes, fleet_cpu) = (self.cpu()?, self.bytes()?, fleet.cpu_seconds()?);
        let mut latency_ms = Vec::new();
        let mut last_ms = Vec::new();
        let mut missed = 0;
        let pids = (self.apiserver_pid()?, self.etcd_pid()?);
        let (mut fan_out_s, mut fan_out_apiserver, mut fan_out_etcd) = (0.0, 0.0, 0.0);
        let mut next = Instant::now();
        for _ in 0..count {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            next += Duration::from_millis(self.args.change_interval_ms);
            let (i, eps, fresh) = self.next_change();
            let mut task = None;
            let mut fan_out = None;
            let (sent, seen) = {
                let this = &*self;
                let make = || {
                    fan_out = Some(FanOut::start(pids)?);
                    let (sent, patch) = this.patch(i, eps);
                    task = Some(patch);
                    Ok(sent)
                };
                this.observers
                    .change(nodes, proxy, Change { service: i, fresh }, timeout, make, &mut || fleet.check_alive())?
            };
            if let Some(task) = task {
                self.runtime.block_on(task)??;
            }
            if let Some(fan_out) = fan_out {
                let (w, a, e) = fan_out.finish()?;
                (fan_out_s, fan_out_apiserver, fan_out_etcd) = (fan_out_s + w, fan_out_apiserver + a, fan_out_etcd + e);
            }
            let ms: Vec<f64> = seen.iter().flatten().map(|at| at.duration_since(sent).as_secs_f64() * 1000.0).collect();
            missed += nodes - ms.len();
            if ms.len() == nodes {
                last_ms.push(ms.iter().copied().fold(0.0, f64::max));
            } else {
                eprintln!("    change of Service {i} ({fresh}): in {} of {nodes} kernels within {timeout:?}", ms.len());
            }
            latency_ms.extend(ms);
        }
        std::thread::sleep(Duration::from_secs(1));
        let (cpu2, bytes2, fleet_cpu2) = (self.cpu()?, self.bytes()?, fleet.cpu_seconds()?);
        Ok(Changes {
            count,
            latency_ms: sorted(latency_ms),
            missed,
            last_ms: sorted(last_ms),
            window_s: cpu2.at.duration_since(cpu.at).as_secs_f64(),
            apiserver_cpu_s: cpu2.apiserver - cpu.apiserver,
            etcd_cpu_s: cpu2.etcd - cpu.etcd,
            fan_out_s,
            fan_out_apiserver_cpu_s: fan_out_apiserver,
            fan_out_etcd_cpu_s: fan_out_etcd,
            bytes_sent: bytes2.sent_since(&bytes, nodes),
            bytes_received: bytes2.received_since(&bytes, nodes),
            fleet_cpu_s: fleet_cpu2 - fleet_cpu,
            load: (load, Load::now()),
        })
    }

    /// The API server stopped and started again under the fleet; then a change, timed from
    /// the API server being ready to each kernel; then `--settle` for the last re-watches.
    fn restart(&mut self, fleet: &mut Fleet) -> anyhow::Result<Restart> {
        let (proxy, nodes) = (fleet.proxy(), fleet.len());
        let load = Load::now();
        let audit_offset = self.audit.offset();
        let bytes = self.bytes()?;
        let etcd_cpu = server::plane_cpu_seconds(self.etcd_pid()?)?;
        let stop = Instant::now();
        self.plane.stop_apiserver();
        self.plane.start_apiserver().context("starting the API server again")?;
        let ready = Instant::now();
        record_plane(&self.plane);
        let apiserver = self.apiserver_pid()?;
        let peaks = PeakWatch::start(vec![apiserver]);
        let (i, eps, fresh) = self.next_change();
        let timeout = Duration::from_secs(self.args.change_timeout);
        let mut task = None;
        let (sent, seen) = {
            let this = &*self;
            let make = || {
                let (sent, patch) = this.patch(i, eps);
                task = Some(patch);
                Ok(sent)
            };
            this.observers
                .change(nodes, proxy, Change { service: i, fresh }, timeout, make, &mut || fleet.check_alive())?
        };
        if let Some(task) = task {
            self.runtime.block_on(task)??;
        }
        let ready_to_proxy_s: Vec<f64> =
            seen.iter().flatten().map(|at| at.duration_since(ready).as_secs_f64()).collect();
        let ready_to_last_s =
            (ready_to_proxy_s.len() == nodes).then(|| ready_to_proxy_s.iter().copied().fold(0.0, f64::max));
        std::thread::sleep(Duration::from_secs(self.args.settle));
        let peak = peaks.stop().first().copied().unwrap_or(f64::NAN);
        let hwm = crate::daemon::kproxy::memory_mib(apiserver).map(|m| m.peak).unwrap_or(f64::NAN);
        let restart = Restart {
            stop_to_ready_s: ready.duration_since(stop).as_secs_f64(),
            ready_to_last_s,
            seen: ready_to_proxy_s.len(),
            ready_to_proxy_s: sorted(ready_to_proxy_s),
            ready_to_patch_s: sent.duration_since(ready).as_secs_f64(),
            apiserver_peak_rss_mib: peak.max(hwm),
            apiserver_cpu_s: server::plane_cpu_seconds(apiserver)?,
            etcd_cpu_s: server::plane_cpu_seconds(self.etcd_pid()?)? - etcd_cpu,
            window_s: stop.elapsed().as_secs_f64(),
            bytes_sent: self.bytes()?.sent_since(&bytes, nodes),
            requests: self.audit.since(audit_offset, &self.node_ips[..nodes])?,
            load: (load, Load::now()),
        };
        eprintln!(
            "    restart: ready {:.1} s after the stop; the change in {} of {nodes} kernels, the last {} after ready; {} lists",
            restart.stop_to_ready_s,
            restart.seen,
            restart.ready_to_last_s.map_or("-".into(), |s| format!("{s:.2} s")),
            restart.requests.lists()
        );
        Ok(restart)
    }
}

impl Changes {
    fn none() -> Changes {
        Changes {
            count: 0,
            latency_ms: Vec::new(),
            missed: 0,
            last_ms: Vec::new(),
            window_s: 0.0,
            apiserver_cpu_s: 0.0,
            etcd_cpu_s: 0.0,
            fan_out_s: 0.0,
            fan_out_apiserver_cpu_s: 0.0,
            fan_out_etcd_cpu_s: 0.0,
            bytes_sent: 0,
            bytes_received: 0,
            fleet_cpu_s: 0.0,
            load: (Load::default(), Load::default()),
        }
    }
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

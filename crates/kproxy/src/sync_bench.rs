//! `kproxy sync-bench` (hidden): what one endpoint change costs the daemon's sync path, in one
//! process, with nothing else running — no API server, no watch decoding, no other load on
//! the sync thread.
//!
//! In a network namespace of its own, the sync loop of the daemon ([`Proxier`]) with the
//! daemon's observer ([`DaemonObserver`]: metrics, health, conntrack cleanup, services
//! acceleration) and the nftables dataplane over netlink, configured from the same flags as the
//! daemon, is fed a cluster of `--services` Services of `--endpoints` endpoints and one Service
//! of `--big-service` endpoints in slices of 100 (the shape of `kproxy-bench daemon
//! --big-service`, #38). After the cold start, `--changes` single changes (one endpoint of the
//! big Service replaced by an address it never had) and `--rollout-steps` rollout steps (25
//! endpoints of one of its slices replaced, one slice written) are each applied and synced at
//! once; each is timed in four parts:
//!
//! - **apply**: the change into the cluster state (`Proxier::apply`);
//! - **plan**: the plan brought up to date with it (`Planner::update`, in `Proxier::sync`);
//! - **dataplane**: the nftables diff, its netlink encoding and the kernel's commit;
//! - **observer**: everything the daemon does after a sync (`DaemonObserver::synced`).
//!
//! It prints p50 / p99 / max of each part and of the whole, and the kproxy process's CPU time
//! per change. A benchmark, not a test: it asserts nothing about time.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kproxy_config::ProxyConfig;
use kproxy_plan::{Dataplane, Plan, PlanDelta, Planner, Verified};
use kproxy_state::{Change, IpFamily, Kind, Object};
use serde_json::json;

use crate::observer::{DaemonObserver, Sinks};
use crate::proxier::{Pacing, Proxier, SyncObserver, Synced};

/// The benchmark's options.
#[derive(Debug, Clone, clap::Args)]
pub struct SyncBenchArgs {
    /// Services besides the big one.
    #[arg(long, default_value_t = 5000)]
    pub services: usize,
    /// Endpoints of each of them (one slice each).
    #[arg(long, default_value_t = 50)]
    pub endpoints: usize,
    /// Endpoints of the big Service, in slices of 100.
    #[arg(long, default_value_t = 5000)]
    pub big_service: usize,
    /// Single changes: one endpoint of the big Service replaced.
    #[arg(long, default_value_t = 50)]
    pub changes: usize,
    /// Rollout steps: 25 endpoints of one slice of the big Service replaced.
    #[arg(long, default_value_t = 50)]
    pub rollout_steps: usize,
}

/// Endpoints per slice of the big Service (the EndpointSlice controller's size).
const BIG_SLICE: usize = 100;
/// Endpoints a rollout step replaces.
const ROLLOUT_STEP: usize = 25;
/// The node kproxy plans for; endpoints are on other nodes.
const NODE: &str = "bench-node";

/// Runs the benchmark in a fresh network namespace; prints the report.
pub fn run(config: &ProxyConfig, args: &SyncBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.big_service > 0, "--big-service must be at least 1");
    anyhow::ensure!(
        config.mode == kproxy_config::ProxyMode::Nftables,
        "sync-bench times the nftables dataplane only; proxy mode {:?} is not supported",
        config.mode
    );
    let ns = kproxy_testbed::Netns::new("kp-syncbench").context("creating the benchmark's network namespace")?;
    let config = config.clone();
    let args = args.clone();
    ns.run_in(move || bench(&config, &args)).context("running in the benchmark's namespace")??;
    Ok(())
}

/// Times the dataplane's syncs (the planner's share is the sync's time minus this).
struct TimedDataplane<D> {
    inner: D,
    last: Duration,
}

impl<D: Dataplane> Dataplane for TimedDataplane<D> {
    fn full_sync(&mut self, plan: &Plan) -> Result<(), kproxy_plan::DataplaneError> {
        let start = Instant::now();
        let result = self.inner.full_sync(plan);
        self.last = start.elapsed();
        result
    }
    fn partial_sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<(), kproxy_plan::DataplaneError> {
        let start = Instant::now();
        let result = self.inner.partial_sync(plan, delta);
        self.last = start.elapsed();
        result
    }
    fn cleanup(&mut self) -> Result<(), kproxy_plan::DataplaneError> {
        self.inner.cleanup()
    }
    fn verify(&mut self, plan: &Plan) -> Result<Verified, kproxy_plan::DataplaneError> {
        self.inner.verify(plan)
    }
    fn take_cleanup_failures(&mut self) -> Vec<IpFamily> {
        self.inner.take_cleanup_failures()
    }
    fn take_drift_repairs(&mut self) -> Vec<String> {
        self.inner.take_drift_repairs()
    }
}

/// Times the observer's `synced` and keeps the sync's own time.
struct TimedObserver {
    inner: DaemonObserver,
    took: Duration,
    observed: Duration,
}

impl SyncObserver for TimedObserver {
    fn received(&mut self, change: &Change) {
        self.inner.received(change);
    }
    fn queued(&mut self, at: tokio::time::Instant) {
        self.inner.queued(at);
    }
    fn synced(&mut self, sync: &Synced<'_>) {
        let start = Instant::now();
        self.inner.synced(sync);
        self.observed = start.elapsed();
        self.took = sync.took;
    }
    fn failed(&mut self, full: bool) {
        self.inner.failed(full);
    }
    fn cleanup_failed(&mut self, family: IpFamily) {
        self.inner.cleanup_failed(family);
    }
    fn rejected(&mut self, errors: &[kproxy_state::ObjectError]) {
        self.inner.rejected(errors);
    }
    fn drift_repaired(&mut self, drift: &[String]) {
        self.inner.drift_repaired(drift);
    }
}

type BenchProxier =
    Proxier<TimedDataplane<kproxy_nftables::NftablesDataplane<kproxy_nft_netlink::NetlinkExecutor>>, TimedObserver>;

/// One change's parts.
#[derive(Debug, Clone, Copy, Default)]
struct Timing {
    apply: Duration,
    plan: Duration,
    dataplane: Duration,
    observer: Duration,
    total: Duration,
    cpu: Duration,
}

fn bench(config: &ProxyConfig, args: &SyncBenchArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // The observer starts its health-check task on the runtime: enter it.
    let _entered = runtime.enter();
    let families = vec![IpFamily::V4, IpFamily::V6];
    let planner = Planner::new(
        crate::policy::proxy_policy_for(config, families.clone()),
        crate::node::context(config, NODE.to_owned()),
    );
    let mode = kproxy_servers::DataplaneMode::Nftables;
    let metrics = kproxy_servers::Metrics::new(mode);
    metrics.declare_families(&families);
    let health = std::sync::Arc::new(kproxy_servers::ProxyHealth::new(
        kproxy_servers::ProxyHealth::healthz_timeout_for(config.sync_period),
    ));
    let observer = DaemonObserver::new(Sinks {
        node_name: NODE.to_owned(),
        families,
        health,
        metrics,
        // As `--dry-run`: the benchmark opens no ports.
        health_check_server: None,
        conntrack: crate::conntrack_reconciler(),
        mode,
        accel: Some(crate::accelerator(config)),
    });
    let observer = TimedObserver { inner: observer, took: Duration::ZERO, observed: Duration::ZERO };
    let dataplane = TimedDataplane {
        inner: kproxy_nftables::NftablesDataplane::new(
            kproxy_nft_netlink::NetlinkExecutor::new(),
            crate::nft_config(config),
        ),
        last: Duration::ZERO,
    };
    // Every change synced at once: the pacing of the daemon is not what is measured.
    let pacing = Pacing { min_sync_period: Duration::ZERO, sync_period: config.sync_period, burst: 1 };
    let mut proxier = Proxier::new(planner, dataplane, observer, pacing);

    let start = Instant::now();
    let cluster = Cluster::new(args);
    proxier.apply(Change::Replaced(Kind::Node, vec![cluster.node()]));
    proxier.apply(Change::Replaced(Kind::ServiceCidr, Vec::new()));
    proxier.apply(Change::Replaced(Kind::Service, cluster.services()));
    proxier.apply(Change::Replaced(Kind::EndpointSlice, cluster.slices()));
    let built = start.elapsed();
    let cold = Instant::now();
    anyhow::ensure!(proxier.sync(), "the cold start failed");
    let cold = cold.elapsed();
    println!(
        "sync-bench: {} Services × {} endpoints + one of {} ({} endpoints); objects built and applied in {:.2} s, cold start {:.2} s",
        args.services,
        args.endpoints,
        args.big_service,
        args.services * args.endpoints + args.big_service,
        built.as_secs_f64(),
        cold.as_secs_f64()
    );

    let mut big = cluster.big_slices();
    let mut fresh = 0u32;
    let mut change = |proxier: &mut BenchProxier, slice: usize, count: usize| -> anyhow::Result<Timing> {
        let endpoints = &mut big[slice];
        for k in 0..count {
            let at = (fresh as usize + k) % endpoints.len();
            endpoints[at] = new_address(fresh);
            fresh += 1;
        }
        let object = big_slice(slice, endpoints);
        let cpu = process_cpu();
        let start = Instant::now();
        proxier.apply(Change::Applied(object));
        let apply = start.elapsed();
        anyhow::ensure!(proxier.sync(), "a partial sync failed");
        let total = start.elapsed();
        let (took, observer, dataplane) = proxier.sync_timings();
        Ok(Timing {
            apply,
            plan: took.saturating_sub(dataplane),
            dataplane,
            observer,
            total,
            cpu: process_cpu().saturating_sub(cpu),
        })
    };
    let slices = args.big_service.div_ceil(BIG_SLICE);
    let singles: Vec<Timing> =
        (0..args.changes).map(|i| change(&mut proxier, (i * 7) % slices, 1)).collect::<anyhow::Result<_>>()?;
    let steps: Vec<Timing> = (0..args.rollout_steps)
        .map(|i| change(&mut proxier, i % slices, ROLLOUT_STEP))
        .collect::<anyhow::Result<_>>()?;
    report("one endpoint of the big Service replaced", &singles);
    report(&format!("rollout step: {ROLLOUT_STEP} endpoints of one slice replaced"), &steps);
    Ok(())
}

impl<D: Dataplane> Proxier<TimedDataplane<D>, TimedObserver> {
    /// The last sync's own time (plan and dataplane), its observer's and its dataplane's.
    fn sync_timings(&self) -> (Duration, Duration, Duration) {
        let (dataplane, observer) = self.parts();
        (observer.took, observer.observed, dataplane.last)
    }
}

fn report(what: &str, timings: &[Timing]) {
    println!("\n{what}: {} changes, each synced at once (ms)", timings.len());
    println!("| part | p50 | p99 | max |");
    println!("|---|---:|---:|---:|");
    type Part = fn(&Timing) -> Duration;
    let parts: [(&str, Part); 6] = [
        ("apply (state)", |t| t.apply),
        ("plan", |t| t.plan),
        ("dataplane (diff, netlink, kernel)", |t| t.dataplane),
        ("observer", |t| t.observer),
        ("whole change", |t| t.total),
        ("CPU of the process", |t| t.cpu),
    ];
    for (name, part) in parts {
        let mut ms: Vec<f64> = timings.iter().map(|t| part(t).as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms.get(((ms.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
        println!("| {name} | {:.2} | {:.2} | {:.2} |", at(0.5), at(0.99), at(1.0));
    }
}

/// User + system CPU of this process so far.
fn process_cpu() -> Duration {
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF);
    usage.map_or(Duration::ZERO, |u| {
        let tv = |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
        tv(u.user_time()) + tv(u.system_time())
    })
}

/// The objects: the mix of `kproxy-bench daemon` (10 % NodePort, 1 % ClientIP affinity, 10 %
/// dual-stack), all TCP, endpoints on other nodes.
struct Cluster {
    services: usize,
    endpoints: usize,
    big: usize,
}

impl Cluster {
    fn new(args: &SyncBenchArgs) -> Self {
        Cluster { services: args.services, endpoints: args.endpoints, big: args.big_service }
    }

    fn node(&self) -> Object {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": NODE, "labels": {"topology.kubernetes.io/zone": "zone-0"}},
            "spec": {"podCIDRs": ["10.244.0.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.10"}]},
        }))
        .unwrap_or_default();
        Object::Node(Box::new(node))
    }

    fn services(&self) -> Vec<Object> {
        let mut out: Vec<Object> = (0..self.services).map(service).collect();
        out.push(object_service(json!({
            "metadata": {"namespace": "bench", "name": "big"},
            "spec": {"clusterIP": "198.18.127.1", "clusterIPs": ["198.18.127.1"],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
        })));
        out
    }

    fn slices(&self) -> Vec<Object> {
        let mut out = Vec::new();
        for i in 0..self.services {
            let v4: Vec<String> = (0..self.endpoints).map(|j| small_endpoint_v4(i, j)).collect();
            out.push(slice(&format!("svc-{i}"), &format!("svc-{i}-v4"), "IPv4", &v4));
            if i % 10 == 3 {
                let v6: Vec<String> = (0..self.endpoints).map(|j| format!("fd00:10:20::{:x}:{:x}", i, j + 1)).collect();
                out.push(slice(&format!("svc-{i}"), &format!("svc-{i}-v6"), "IPv6", &v6));
            }
        }
        out.extend(self.big_slices().iter().enumerate().map(|(k, eps)| big_slice(k, eps)));
        out
    }

    /// The big Service's endpoints, slice by slice.
    fn big_slices(&self) -> Vec<Vec<String>> {
        (0..self.big)
            .map(|j| {
                let n = j + 1;
                format!("198.18.{}.{}", 128 + n / 256, n % 256)
            })
            .collect::<Vec<_>>()
            .chunks(BIG_SLICE)
            .map(<[String]>::to_vec)
            .collect()
    }
}

/// Addresses brought in by changes: 198.18.160.0/19 onwards (never one the cluster had).
fn new_address(n: u32) -> String {
    let n = (160 << 8) + n;
    format!("198.18.{}.{}", (n >> 8) & 0xff, n & 0xff)
}

/// Endpoint `j` of small Service `i`: 10.0.0.0/8 is not a test range, so 198.18.32.0/20 as the
/// daemon benchmark (shared between Services past 4,096 endpoints).
fn small_endpoint_v4(i: usize, j: usize) -> String {
    let n = (i * 50 + j) % 4094 + 1;
    format!("198.18.{}.{}", 32 + n / 256, n % 256)
}

fn service(i: usize) -> Object {
    let ip = i + 1;
    let cluster_ip = format!("198.19.{}.{}", ip >> 8, ip & 0xff);
    let mut spec = json!({
        "clusterIP": cluster_ip,
        "clusterIPs": [cluster_ip],
        "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
    });
    if i.is_multiple_of(10) && i > 0 {
        spec["type"] = json!("NodePort");
        spec["ports"][0]["nodePort"] = json!(10000 + i % 20000);
    }
    if i % 100 == 7 {
        spec["sessionAffinity"] = json!("ClientIP");
    }
    if i % 10 == 3 {
        let v6 = format!("fd00:96::{:x}", i + 1);
        spec["clusterIPs"] = json!([cluster_ip, v6]);
        spec["ipFamilies"] = json!(["IPv4", "IPv6"]);
        spec["ipFamilyPolicy"] = json!("PreferDualStack");
    }
    object_service(json!({"metadata": {"namespace": "bench", "name": format!("svc-{i}")}, "spec": spec}))
}

fn object_service(value: serde_json::Value) -> Object {
    let service: Service = serde_json::from_value(value).unwrap_or_default();
    Object::Service(Box::new(service.into()))
}

fn slice(service: &str, name: &str, address_type: &str, addresses: &[String]) -> Object {
    let endpoints: Vec<serde_json::Value> = addresses
        .iter()
        .enumerate()
        .map(|(j, ip)| {
            json!({
                "addresses": [ip],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": format!("node-{}", j % 100),
                "zone": format!("zone-{}", j % 3),
            })
        })
        .collect();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"namespace": "bench", "name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }))
    .unwrap_or_else(|_| EndpointSlice { address_type: address_type.to_owned(), ..Default::default() });
    Object::EndpointSlice(Box::new(slice))
}

fn big_slice(k: usize, addresses: &[String]) -> Object {
    slice("big", &format!("big-{k}"), "IPv4", addresses)
}

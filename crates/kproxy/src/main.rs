//! kproxy: a Kubernetes Service proxy, drop-in for kube-proxy.
//!
//! `kproxy [kube-proxy flags]` runs the proxy; `kproxy plan --manifests DIR` prints the plan;
//! `kproxy explain` says what a node does with one packet, and why; `kproxy demo` runs the live
//! demo in a sandbox of network namespaces.

mod allocator;
mod api_client;
mod change_metrics;
mod columns;
mod dataplane;
mod demo;
mod explain;
mod families;
mod nfacct;
mod node;
mod node_addresses;
mod observer;
mod plan_table;
mod policy;
mod proxier;
mod sync_bench;
mod takeover;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use kproxy_config::{Action, ProxyConfig, ProxyMode, SourceSelection, VersionRequest};
use kproxy_iptables::IptablesDataplane;
use kproxy_nftables::NftablesDataplane;
use kproxy_plan::Planner;
use kproxy_state::{Change, ClusterState};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::observer::{DaemonObserver, Sinks};

use crate::proxier::{Pacing, Proxier};

#[derive(Parser, Debug)]
#[command(name = "kproxy", about = "A Kubernetes Service proxy, drop-in for kube-proxy", disable_version_flag = true)]
struct Cli {
    #[command(flatten)]
    flags: kproxy_config::Flags,
    #[command(subcommand)]
    command: Option<Command>,
}

/// The subcommands. kproxy's flags (`--manifests`, `--config`, every kube-proxy flag) are
/// global: given before or after the subcommand, they mean the same.
#[derive(Subcommand, Debug)]
enum Command {
    /// Print the plan computed from a directory of manifests (`--manifests DIR`), without
    /// touching the kernel.
    Plan {
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// The node to plan for (default: --hostname-override, else the hostname).
        #[arg(long)]
        node: Option<String>,
    },
    /// What a node does with one packet, and why: from manifests, the API server, or a running
    /// kproxy (`--server`).
    Explain(explain::ExplainArgs),
    /// Live demo: network namespaces, kproxy on `--manifests DIR` (default examples/), real
    /// traffic, a table; cleans up.
    Demo {
        /// The dataplane to demonstrate.
        #[arg(long, value_name = "MODE", default_value = "nftables", value_parser = ["nftables", "iptables"])]
        mode: String,
    },
    /// Developers' benchmark: one endpoint change through the sync path, in one process and a
    /// network namespace of its own (see `src/sync_bench.rs`, docs/benchmarks.md).
    #[command(hide = true)]
    SyncBench(sync_bench::SyncBenchArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> ExitCode {
    allocator::purge_freed_memory_at_once();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kproxy: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.flags.version_request()? {
        VersionRequest::None => {}
        _ => {
            println!("kproxy v{}", env!("CARGO_PKG_VERSION"));
            return Ok(());
        }
    }
    let config = kproxy_config::resolve(&cli.flags)?;
    init_logging(&config);
    for warning in &config.warnings {
        warn!("{warning}");
    }
    match cli.command {
        Some(Command::Plan { output, node }) => {
            let Some(manifests) = &cli.flags.manifests else {
                anyhow::bail!("kproxy plan: --manifests DIR is required");
            };
            return print_plan(&config, manifests, output, node);
        }
        Some(Command::Explain(args)) => return explain::run(&config, &cli.flags, args),
        Some(Command::Demo { mode }) => {
            let manifests = cli.flags.manifests.clone().unwrap_or_else(|| PathBuf::from("examples"));
            return demo::run(&manifests, &mode);
        }
        Some(Command::SyncBench(args)) => return sync_bench::run(&config, &args),
        None => {}
    }
    match &config.action {
        Action::WriteConfigTo(path) => {
            config.write_config_file(path)?;
            info!(path = %path.display(), "wrote the effective configuration");
            Ok(())
        }
        Action::Cleanup => cleanup(&config),
        Action::InitOnly => init_node(&config),
        Action::Run => {
            if !config.dry_run {
                tune_conntrack(&config);
            }
            run_proxy(config)
        }
    }
}

fn init_logging(config: &ProxyConfig) {
    // kube-proxy's -v levels: 0-1 info, 2-4 debug, 5+ trace.
    let level = match config.logging.verbosity {
        0..=1 => "info",
        2..=4 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("KPROXY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour_logs());
    let _ = match config.logging.format {
        kproxy_config::LogFormat::Json => builder.json().try_init(),
        _ => builder.try_init(),
    };
}

/// Colours only on a terminal: not in a file, a pipe or what `kubectl logs` shows; never with
/// `NO_COLOR` set to anything but empty (no-color.org).
fn colour_logs() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// `--cleanup`: removes what any kproxy mode installed (its nftables tables, its iptables chains
/// and jumps) and nothing else, like kube-proxy's `--cleanup` for every mode.
fn cleanup(config: &ProxyConfig) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    let mut step = |what: &str, result: Result<(), String>| match result {
        Ok(()) => info!("removed {what}"),
        Err(e) => {
            warn!(error = %e, "could not remove {what}");
            failed.push(what.to_owned());
        }
    };
    step(
        "kproxy's nftables tables",
        kproxy_nftables::cleanup(&mut kproxy_nft_netlink::NetlinkExecutor::new()).map_err(|e| e.to_string()),
    );
    // IPVS services (never those in ipvs.excludeCIDRs), kube-ipvs0 and the auxiliary table; a
    // kernel without IPVS has none of them.
    let ipvs = ipvs_config(config)?;
    step(
        "kproxy's IPVS services, kube-ipvs0 and its table",
        kproxy_ipvs::cleanup(&mut kproxy_ipvs::KernelHost::new(), &ipvs).map_err(|e| e.to_string()),
    );
    step(
        "the services acceleration table",
        kproxy_accel::cleanup(&mut kproxy_accel::NetlinkExecutor::new()).map_err(|e| e.to_string()),
    );
    let backend = kproxy_iptables::backend::detect();
    step(
        "kproxy's iptables chains",
        kproxy_iptables::cleanup(
            &mut kproxy_iptables::IptablesRestore::new(backend),
            &families::for_iptables_cleanup(),
        )
        .map_err(|e| e.to_string()),
    );
    if failed.is_empty() { Ok(()) } else { anyhow::bail!("cleanup incomplete: {}", failed.join(", ")) }
}

/// Loads a manifest directory into a state, reporting (and skipping) what is malformed.
fn load_manifests(dir: &Path) -> anyhow::Result<ClusterState> {
    let snapshot = kproxy_source::manifest::load(dir).with_context(|| format!("reading {}", dir.display()))?;
    for e in snapshot.errors() {
        warn!("{e}");
    }
    let mut state = ClusterState::new();
    for change in snapshot.initial_changes() {
        let outcome = state.apply(change);
        for e in outcome.rejected.iter().chain(&outcome.warnings) {
            warn!("{e}");
        }
    }
    Ok(state)
}

fn print_plan(config: &ProxyConfig, dir: &Path, output: Output, node: Option<String>) -> anyhow::Result<()> {
    let state = load_manifests(dir)?;
    let name = node.unwrap_or_else(|| node::node_name(config));
    let planner = Planner::new(policy::proxy_policy(config), node::context(config, name));
    let plan = planner.build(&state);
    match output {
        Output::Table => print!("{}", plan_table::render(&plan)),
        Output::Json => println!("{}", serde_json::to_string_pretty(&plan)?),
    }
    Ok(())
}

/// `/debug/explain` answered by the sync loop through `requests`.
fn explainer(requests: mpsc::Sender<proxier::ExplainRequest>) -> kproxy_servers::Explainer {
    use kproxy_servers::ExplainUnavailable;
    kproxy_servers::Explainer::new(move |q: kproxy_servers::ExplainQuery| {
        let requests = requests.clone();
        async move {
            let packet = kproxy_plan::explain::Packet { from: q.from, to: q.to, protocol: q.protocol };
            let (reply, answer) = tokio::sync::oneshot::channel();
            requests.send(proxier::ExplainRequest { packet, reply }).await.map_err(|_| ExplainUnavailable::Busy)?;
            match answer.await {
                Ok(Some(explanation)) => {
                    serde_json::to_value(explanation.bounded()).map_err(|_| ExplainUnavailable::Busy)
                }
                Ok(None) => Err(ExplainUnavailable::NotSynced),
                Err(_) => Err(ExplainUnavailable::Busy),
            }
        }
    })
}

/// How long a handback waits for the sync in progress to end before it removes kproxy's rules.
const STOP_SYNCING_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a stopping kproxy waits for work in flight. A sync in progress is not waited for:
/// each one is atomic in the kernel (one nf_tables batch, one `iptables-restore` per table), so
/// leaving mid-sync leaves the last committed ruleset, and a long sync (seconds at 50k Services)
/// must not hold up SIGTERM.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

fn run_proxy(config: ProxyConfig) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = serve(&runtime, config);
    // Dropping the runtime would wait for the blocking sync thread to finish its sync.
    runtime.shutdown_timeout(SHUTDOWN_GRACE);
    result
}

fn serve(runtime: &tokio::runtime::Runtime, config: ProxyConfig) -> anyhow::Result<()> {
    runtime.block_on(async move {
        let name = node::node_name(&config);
        info!(node = %name, mode = config.mode.as_str(), "starting kproxy");
        apply_process_settings(&config);
        let families = families::probe(config.mode, config.dry_run);
        let planner =
            Planner::new(policy::proxy_policy_for(&config, families.clone()), node::context(&config, name.clone()));
        log_masquerade_policy(&config);
        let pacing = Pacing {
            min_sync_period: config.min_sync_period,
            sync_period: config.sync_period,
            burst: proxier::DEFAULT_BURST,
        };
        let (tx, rx) = mpsc::channel::<Change>(1024);
        let (source, source_counters) = match &config.source {
            SourceSelection::Manifests(dir) => {
                let dir = dir.clone();
                let task = tokio::spawn(async move {
                    let result = kproxy_source::manifest::watch(dir, tx, |e| warn!("{e}")).await;
                    if let Err(e) = result {
                        error!("manifest source stopped: {e}");
                    }
                });
                (task, None)
            }
            SourceSelection::KubernetesApi => {
                let options = api_client::source_options(&config.client_connection, name.clone())?;
                let client =
                    api_client::client(&config.client_connection).await.context("connecting to the Kubernetes API")?;
                let stats = std::sync::Arc::new(kproxy_kube_source::SourceStats::new());
                let counters: std::sync::Arc<dyn kproxy_servers::SourceCounters> =
                    std::sync::Arc::new(api_client::ApiSourceCounters(stats.clone()));
                (tokio::spawn(kproxy_kube_source::run(client, options, tx, stats)), Some(counters))
            }
        };
        // `/debug/explain` questions go to the sync loop, which owns the plan.
        let (explain_tx, explain_rx) = mpsc::channel::<proxier::ExplainRequest>(16);
        let (mut observer, mut listeners, health) =
            start_servers(&config, &name, families, explainer(explain_tx), source_counters).await?;
        // One owner of the node's addresses, followed over rtnetlink: the planner (through the
        // sync loop) and the conntrack reconciler (through the observer) read it.
        observer.follow_node_addresses(node_addresses::follow());
        // Flowtable devices follow the node's links (rtnetlink events, rate-limited).
        let _link_watcher = match observer.accelerator() {
            Some(accel) => match kproxy_accel::LinkWatcher::spawn(accel, kproxy_accel::WatchOptions::default()) {
                Ok(watcher) => Some(watcher),
                Err(e) => {
                    warn!(error = %e, "no link watcher: the flowtable follows interfaces only at syncs");
                    None
                }
            },
            None => None,
        };
        // kproxy's iptables backend, detected once like upstream (iptables mode only).
        let iptables_backend = (config.mode == ProxyMode::Iptables && !config.dry_run).then(|| {
            let backend = kproxy_iptables::backend::detect();
            info!(?backend, "iptables backend");
            backend
        });
        let mut proxier_task = match (config.mode, config.dry_run) {
            (ProxyMode::Nftables, false) => {
                let dp = NftablesDataplane::new(kproxy_nft_netlink::NetlinkExecutor::new(), nft_config(&config));
                let counters = config.service_counters.then(|| counter_reader(nft_config(&config)));
                let touched =
                    config.watch_kernel_changes.then(|| touch_watcher(kproxy_nftables::tables(&nft_config(&config))));
                spawn_proxier(planner, dp, observer, pacing, rx, explain_rx, Extras { counters, touched })
            }
            (ProxyMode::Nftables, true) => spawn_proxier(
                planner,
                NftablesDataplane::new(dataplane::PrintTransactions, nft_config(&config)),
                observer,
                pacing,
                rx,
                explain_rx,
                Extras::default(),
            ),
            (ProxyMode::Iptables, false) => {
                let backend = iptables_backend.unwrap_or(kproxy_iptables::Backend::Nft);
                let exec = kproxy_iptables::IptablesRestore::new(backend);
                let nfacct = nfacct::setup(observer.metrics());
                let dp = IptablesDataplane::new(exec, kproxy_iptables::Config { nfacct, ..iptables_config(&config) });
                observer.count_iptables_rules(dp.rule_counter());
                spawn_proxier(planner, dp, observer, pacing, rx, explain_rx, Extras::default())
            }
            (ProxyMode::Iptables, true) => {
                let dp = IptablesDataplane::new(dataplane::PrintRestores::default(), iptables_config(&config));
                observer.count_iptables_rules(dp.rule_counter());
                spawn_proxier(planner, dp, observer, pacing, rx, explain_rx, Extras::default())
            }
            (ProxyMode::Ipvs, false) => {
                let dp = kproxy_ipvs::IpvsDataplane::new(kproxy_ipvs::KernelHost::new(), ipvs_config(&config)?);
                spawn_proxier(planner, dp, observer, pacing, rx, explain_rx, Extras::default())
            }
            // The in-memory kernel records what would be programmed.
            (ProxyMode::Ipvs, true) => {
                let dp = kproxy_ipvs::IpvsDataplane::new(kproxy_ipvs::FakeHost::new(), ipvs_config(&config)?);
                spawn_proxier(planner, dp, observer, pacing, rx, explain_rx, Extras::default())
            }
        };
        let own = match config.mode {
            ProxyMode::Nftables => kproxy_takeover::Own::Nftables,
            ProxyMode::Iptables => {
                kproxy_takeover::Own::Iptables(iptables_backend.unwrap_or(kproxy_iptables::Backend::Nft))
            }
            ProxyMode::Ipvs => kproxy_takeover::Own::Ipvs,
        };
        let ipvs = ipvs_config(&config)?;
        let took_over = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handover = config.take_over_kube_proxy && !config.dry_run;
        let takeover_task = handover.then(|| {
            tokio::spawn(takeover::take_over(
                own,
                ipvs.clone(),
                health.clone(),
                listeners.configured(),
                listeners.held(),
                took_over.clone(),
            ))
        });
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let result = tokio::select! {
            _ = tokio::signal::ctrl_c() => Ok(()),
            _ = terminate.recv() => Ok(()),
            ended = &mut proxier_task => Err(match ended {
                Ok(()) => anyhow::anyhow!("the sync loop stopped: its source of cluster state ended"),
                Err(e) => anyhow::anyhow!("the sync loop failed: {e}"),
            }),
        };
        if let Some(task) = takeover_task {
            task.abort();
        }
        if result.is_ok() && handover {
            // Stopping the source closes the sync loop's channel: it ends after the sync in
            // progress, if any (each is atomic in the kernel).
            let stop_syncing = async {
                source.abort();
                let _ = tokio::time::timeout(STOP_SYNCING_WAIT, &mut proxier_task).await;
            };
            let outcome = takeover::hand_back(
                own,
                &ipvs,
                config.healthz_bind_address,
                config.metrics_bind_address,
                &mut listeners,
                took_over.load(std::sync::atomic::Ordering::Relaxed),
                stop_syncing,
            )
            .await;
            if outcome != takeover::Handback::NotRunning {
                return result;
            }
        }
        if result.is_ok() {
            info!("stopping; the rules stay in place (kproxy --cleanup removes them)");
        }
        source.abort();
        result
    })
}

/// States the configured masquerade policy at startup (KEP-6246 asks for it); the effective
/// per-family policy (node IP known or not) is logged and exported once the Node is seen.
fn log_masquerade_policy(config: &ProxyConfig) {
    info!(
        masquerade_all = config.masquerade_all,
        detect_local = config.detect_local.mode_name(),
        no_masquerade_cidrs = ?config.no_masquerade_cidrs,
        snat_to_node_ip = config.snat_to_node_ip,
        "masquerade policy: hairpin and external-client traffic is always masqueraded; noMasqueradeCIDRs exempt \
         traffic from the node and from detectable local pods, and win over masqueradeAll"
    );
}

/// Starts `/healthz`+`/livez`, `/metrics` (see [`takeover::Listeners`]) and the health-check
/// node port server.
async fn start_servers(
    config: &ProxyConfig,
    node_name: &str,
    families: Vec<kproxy_state::IpFamily>,
    explainer: kproxy_servers::Explainer,
    source_counters: Option<std::sync::Arc<dyn kproxy_servers::SourceCounters>>,
) -> anyhow::Result<(DaemonObserver, takeover::Listeners, std::sync::Arc<kproxy_servers::ProxyHealth>)> {
    use kproxy_servers::{DataplaneMode, HealthCheckBind, MetricsServerInfo, ProxyHealth, ServiceHealthServer};
    use std::sync::Arc;

    let health = Arc::new(ProxyHealth::new(ProxyHealth::healthz_timeout_for(config.sync_period)));
    let mode = match config.mode {
        ProxyMode::Nftables => DataplaneMode::Nftables,
        ProxyMode::Iptables => DataplaneMode::Iptables,
        ProxyMode::Ipvs => DataplaneMode::Ipvs,
    };
    let metrics = kproxy_servers::Metrics::new(mode);
    metrics.declare_families(&families);
    if let Some(counters) = source_counters {
        metrics.set_source(counters);
    }
    metrics.set_feature_gates(
        kproxy_config::feature_gates::effective(&config.feature_gates)
            .into_iter()
            .map(|(gate, enabled)| (gate.name, gate.stage.label(), enabled)),
    );
    let mut specs = Vec::new();
    if let Some(addr) = config.healthz_bind_address {
        let (health, metrics) = (health.clone(), metrics.clone());
        let serve: takeover::Serve = Arc::new(move || {
            let (health, metrics) = (health.clone(), metrics.clone());
            Box::pin(async move { kproxy_servers::serve_healthz(addr, health, metrics).await })
        });
        specs.push(takeover::ListenerSpec { what: "healthz server", addr, serve });
    }
    if let Some(addr) = config.metrics_bind_address {
        let info = MetricsServerInfo {
            proxy_mode: config.mode.as_str().to_owned(),
            config: config
                .to_kube_proxy_configuration_yaml()
                .ok()
                .and_then(|yaml| serde_saphyr::from_str::<serde_json::Value>(&yaml).ok())
                .unwrap_or_default(),
            explainer: match config.explain_access {
                kproxy_config::ExplainAccess::Off => None,
                kproxy_config::ExplainAccess::Local => {
                    Some(explainer.with_access(kproxy_servers::ExplainAccess::Local))
                }
                kproxy_config::ExplainAccess::Any => Some(explainer.with_access(kproxy_servers::ExplainAccess::Any)),
            },
        };
        let metrics = metrics.clone();
        let serve: takeover::Serve = Arc::new(move || {
            let (metrics, info) = (metrics.clone(), info.clone());
            Box::pin(async move { kproxy_servers::serve_metrics(addr, metrics, info).await })
        });
        specs.push(takeover::ListenerSpec { what: "metrics server", addr, serve });
    }
    // A bind failure is fatal only with `bindAddressHardFail`, as upstream; a taken port is
    // tried again (another proxy on the node: see `takeover`).
    let listeners = takeover::Listeners::start(specs, config.bind_address_hard_fail).await?;
    // Health-check node ports follow the plan's nodePortAddresses (the observer moves them once
    // the addresses are known, e.g. `primary` once the Node arrives). --dry-run opens none.
    let hc = (!config.dry_run)
        .then(|| Arc::new(ServiceHealthServer::new(HealthCheckBind::AllAddresses, health.clone(), metrics.clone())));
    let observer = DaemonObserver::new(Sinks {
        node_name: node_name.to_owned(),
        families,
        health: health.clone(),
        metrics,
        health_check_server: hc,
        conntrack: (!config.dry_run).then(conntrack_reconciler).flatten(),
        mode,
        accel: (!config.dry_run).then(|| accelerator(config)),
    });
    Ok((observer, listeners, health))
}

/// The stale-conntrack cleaner of the calling thread's network namespace; none (said once) when
/// its netlink socket cannot be opened.
fn conntrack_reconciler() -> Option<kproxy_conntrack::Reconciler> {
    match kproxy_conntrack::Reconciler::new() {
        Ok(r) => Some(r),
        Err(e) => {
            warn!(error = %e, "no conntrack netlink socket: stale UDP entries will not be cleaned");
            None
        }
    }
}

/// The services-acceleration controller, its kernel probed (see `probe_once`).
fn accelerator(config: &ProxyConfig) -> observer::SharedAccelerator {
    let accel_config =
        kproxy_accel::AccelConfig { packet_threshold: config.acceleration.packet_threshold, ..Default::default() };
    let mut accel = kproxy_accel::Accelerator::new(kproxy_accel::NetlinkExecutor::new(), accel_config);
    // Before the first sync (see `probe_once`); a failure is retried at the first sync.
    if let Err(e) = accel.probe_once() {
        tracing::warn!(error = %e, "probing the kernel for flowtables failed; retrying at the first sync");
    }
    std::sync::Arc::new(std::sync::Mutex::new(accel))
}

/// `--init-only`: every host setting the proxy needs that only a privileged process can write
/// (as upstream's `--init-only`): conntrack limits and timeouts; in iptables mode
/// `route_localnet` when NodePorts are served on 127.0.0.1; in IPVS mode the IPVS sysctls and
/// forwarding. The proxy itself then runs with `CAP_NET_ADMIN` (and `CAP_NET_RAW` for
/// iptables-legacy): it reads these and writes only what differs (deploy/kproxy.yaml).
fn init_node(config: &ProxyConfig) -> anyhow::Result<()> {
    tune_conntrack(config);
    match config.mode {
        ProxyMode::Iptables if serves_localhost_node_ports(config) => {
            let path = "/proc/sys/net/ipv4/conf/all/route_localnet";
            if std::fs::read_to_string(path).map(|v| v.trim() != "1").unwrap_or(true) {
                std::fs::write(path, "1").with_context(|| format!("writing {path}"))?;
                info!("set net.ipv4.conf.all.route_localnet=1 (NodePorts on 127.0.0.1)");
            }
        }
        ProxyMode::Ipvs => {
            let families = families::probe(config.mode, false);
            let mut host = kproxy_ipvs::KernelHost::new();
            // Asking for IPVS loads ip_vs, whose sysctls come with it.
            if let Err(e) = kproxy_ipvs::Host::ipvs_services(&mut host) {
                warn!(error = %e, "IPVS is not available");
            }
            for line in kproxy_ipvs::ensure_node_sysctls(&mut host, &ipvs_config(config)?, &families)? {
                info!("{line}");
            }
        }
        _ => {}
    }
    info!("host set up (--init-only); exiting");
    Ok(())
}

/// Whether iptables mode will serve NodePorts on 127.0.0.1 (and so needs `route_localnet`).
fn serves_localhost_node_ports(config: &ProxyConfig) -> bool {
    use kproxy_config::NodePortAddress;
    let loopback = std::net::IpAddr::from([127, 0, 0, 1]);
    config.localhost_node_ports
        && config.node_port_addresses.iter().any(|a| match a {
            NodePortAddress::All | NodePortAddress::Localhost => true,
            NodePortAddress::Cidr(net) => net.contains(&loopback),
            NodePortAddress::Primary => false,
        })
}

/// kube-proxy's privileged host setup: nf_conntrack limits and timeouts.
fn tune_conntrack(config: &ProxyConfig) {
    let c = &config.conntrack;
    let tuning = kproxy_conntrack::ConntrackTuning {
        max_per_core: c.max_per_core,
        min: c.min,
        tcp_established_timeout: c.tcp_established_timeout,
        tcp_close_wait_timeout: c.tcp_close_wait_timeout,
        tcp_be_liberal: c.tcp_be_liberal,
        udp_timeout: c.udp_timeout,
        udp_stream_timeout: c.udp_stream_timeout,
    };
    // Each failed setting is logged by the tuner; none of them stops the proxy (upstream does the same).
    let _ = tuning.apply(Path::new("/"));
}

/// What the sync loop does besides syncing, where the dataplane offers it (nftables mode).
#[derive(Default)]
struct Extras {
    /// Per-Service counters (`--service-counters`).
    counters: Option<proxier::CounterReader>,
    /// Checks after other programs' commits to kproxy's tables (`--watch-kernel-changes`).
    touched: Option<proxier::TouchWatcher>,
}

fn spawn_proxier<D: kproxy_plan::Dataplane + 'static>(
    planner: Planner,
    dataplane: D,
    observer: DaemonObserver,
    pacing: Pacing,
    events: mpsc::Receiver<Change>,
    explain_requests: mpsc::Receiver<proxier::ExplainRequest>,
    extras: Extras,
) -> tokio::task::JoinHandle<()> {
    // Syncs block (netlink, `iptables-restore`, conntrack): run the loop on its own thread so the
    // API watch, /healthz and the health-check ports never wait for one.
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let addresses = observer.node_addresses();
        let mut proxier = Proxier::new(planner, dataplane, observer, pacing).answer_explain(explain_requests);
        if let Some(read) = extras.counters {
            proxier = proxier.count_services(read);
        }
        if let Some(addresses) = addresses {
            proxier = proxier.follow_local_addresses(addresses);
        }
        if let Some(start) = extras.touched {
            proxier = proxier.check_when_touched(start);
        }
        runtime.block_on(proxier.run(events));
    })
}

/// Follows nf_tables' notifications on a thread of its own and passes on a notice whenever a
/// commit touched one of `tables` (kproxy's), so the sync loop checks and repairs them at once
/// rather than at the next periodic check. kproxy's own commits are left out by the monitor.
fn touch_watcher(tables: Vec<kproxy_nftables::TableRef>) -> proxier::TouchWatcher {
    Box::new(move || {
        let (tx, rx) = mpsc::channel(1);
        let spawned = std::thread::Builder::new().name("nft-monitor".into()).spawn(move || {
            let mut monitor = match kproxy_nft_netlink::monitor::Monitor::open(&tables) {
                // One notice once subscribed: a commit made between the first sync and the
                // subscription is checked for too.
                Ok(m) => {
                    let _ = tx.try_send(());
                    m
                }
                Err(e) => {
                    warn!(error = %e, "cannot follow nf_tables notifications: changes by other programs are found by the periodic check only");
                    return;
                }
            };
            loop {
                match monitor.wait() {
                    // A full channel already asks for a check.
                    Ok(_) => {
                        if let Err(mpsc::error::TrySendError::Closed(())) = tx.try_send(()) {
                            return;
                        }
                    }
                    Err(e) => {
                        warn!(error = %e, "nf_tables notifications stopped: changes by other programs are found by the periodic check only");
                        return;
                    }
                }
            }
        });
        if let Err(e) = spawned {
            warn!(error = %e, "cannot start the nf_tables notification thread");
        }
        rx
    })
}

fn nft_config(config: &ProxyConfig) -> kproxy_nftables::Config {
    kproxy_nftables::Config {
        masquerade_mark: config.masquerade_mark(),
        service_counters: config.service_counters,
        ..Default::default()
    }
}

/// Reads the per-Service counters of the nftables dataplane configured by `nft`, over a netlink
/// socket of its own.
fn counter_reader(nft: kproxy_nftables::Config) -> proxier::CounterReader {
    use kproxy_nftables::counters::ElementCount;
    let mut exec = kproxy_nft_netlink::NetlinkExecutor::new();
    Box::new(move |plan| {
        kproxy_nftables::counters::read(&nft, plan, |table, set, keys| {
            let counts = kproxy_nft_netlink::counters::element_counters(&mut exec, table, set, keys)?;
            let count = |c: kproxy_nft_netlink::counters::Counted| ElementCount { packets: c.packets, bytes: c.bytes };
            Ok::<_, std::io::Error>(counts.into_iter().map(|c| c.map(count)).collect())
        })
        .map_err(|e| e.to_string())
    })
}

fn ipvs_config(config: &ProxyConfig) -> anyhow::Result<kproxy_ipvs::Config> {
    let mut ipvs = kproxy_ipvs::Config { masquerade_mark: config.masquerade_mark(), ..Default::default() };
    if let Some(c) = &config.ipvs {
        ipvs.scheduler = c.scheduler.as_str().parse()?;
        ipvs.strict_arp = c.strict_arp;
        ipvs.tcp_timeout = c.tcp_timeout;
        ipvs.tcp_fin_timeout = c.tcp_fin_timeout;
        ipvs.udp_timeout = c.udp_timeout;
        ipvs.exclude_cidrs = c.exclude_cidrs.clone();
    }
    Ok(ipvs)
}

fn iptables_config(config: &ProxyConfig) -> kproxy_iptables::Config {
    kproxy_iptables::Config {
        masquerade_mark: config.masquerade_mark(),
        localhost_nodeports: config.localhost_node_ports,
        drop_invalid: !config.conntrack.tcp_be_liberal,
        ..Default::default()
    }
}

/// Process-level settings: `oomScoreAdj`, and a warning for each setting kproxy accepts for
/// compatibility but does not act on.
fn apply_process_settings(config: &ProxyConfig) {
    if config.dry_run {
        info!(value = config.oom_score_adj, "--dry-run: oom_score_adj left as it is");
    } else if let Err(e) = std::fs::write("/proc/self/oom_score_adj", config.oom_score_adj.to_string()) {
        warn!(error = %e, value = config.oom_score_adj, "could not set oom_score_adj");
    }
    let ignored = [
        (config.enable_profiling, "enableProfiling (--profiling): kproxy serves no /debug/pprof"),
        (config.show_hidden_metrics_for_version.is_some(), "showHiddenMetricsForVersion: kproxy has no hidden metrics"),
    ];
    for (set, what) in ignored {
        if set {
            warn!("ignored: {what}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_daemons_flags_after_a_subcommand_mean_what_they_mean_before_it() {
        let packet = ["--from", "203.0.113.7", "--to", "198.18.0.2:30080"];
        let flags = [
            "--cluster-cidr",
            "198.18.16.0/20",
            "--config=/etc/kproxy/config.yaml",
            "--proxy-mode=iptables",
            "-v=4",
            "--feature-gates=A=true",
            "--manifests",
            "examples",
            "--masquerade-all",
            "--nodeport-addresses=198.18.0.0/24,primary",
        ];
        let after = parse(&[&["kproxy", "explain"][..], &flags, &packet].concat());
        let before = parse(&[&["kproxy"][..], &flags, &["explain"], &packet].concat());
        assert!(matches!(after.command, Some(Command::Explain(_))));
        assert_eq!(after.flags, before.flags);
        let f = &after.flags;
        assert_eq!(f.cluster_cidr.as_deref(), Some("198.18.16.0/20"));
        assert_eq!(f.config, Some(PathBuf::from("/etc/kproxy/config.yaml")));
        assert_eq!((f.proxy_mode.as_deref(), f.verbosity), (Some("iptables"), Some(4)));
        assert_eq!(f.feature_gates, ["A=true"]);
        assert_eq!((f.manifests.clone(), f.masquerade_all), (Some(PathBuf::from("examples")), Some(true)));
        assert_eq!(f.node_port_addresses, Some(vec!["198.18.0.0/24".to_owned(), "primary".to_owned()]));

        // `plan`, the flags split around the subcommand and between its own.
        let plan = parse(&[
            "kproxy",
            "--proxy-mode=ipvs",
            "plan",
            "--manifests",
            "examples",
            "--node",
            "node-a",
            "--cluster-cidr=198.18.16.0/20",
            "-o",
            "json",
        ]);
        assert!(
            matches!(plan.command, Some(Command::Plan { output: Output::Json, node: Some(ref n) }) if n == "node-a")
        );
        assert_eq!(plan.flags.proxy_mode.as_deref(), Some("ipvs"));
        assert_eq!(plan.flags.cluster_cidr.as_deref(), Some("198.18.16.0/20"));
        assert_eq!(plan.flags.manifests, Some(PathBuf::from("examples")));

        // An unknown flag is still refused wherever it is.
        assert!(Cli::try_parse_from(["kproxy", "explain", "--no-such-flag", "--from", "203.0.113.7"]).is_err());
    }
}

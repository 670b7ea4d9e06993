//! `cargo xtask cluster`: a real Kubernetes v1.36.2 cluster on this machine (control plane,
//! kubelet nodes in network namespaces, containerd, CNI, cluster DNS) with kproxy deployed from
//! `deploy/kproxy.yaml` — or upstream kube-proxy — and Kubernetes' own e2e network tests run
//! against it. The building blocks are in `crates/k8s-harness` (cluster.rs, node.rs, ...);
//! docs/conformance.md has the layout, the commands and the last results.

use std::ffi::OsString;
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kproxy_k8s_harness::cluster::{self, Cluster, ClusterInfo, ClusterOptions, Kubectl, Proxy};
use kproxy_k8s_harness::migration::{self, VirtualKey};
use kproxy_k8s_harness::wire::{self, Family, IpFamilies};
use kproxy_k8s_harness::{Binaries, Binary, dns, startup_patience};

use crate::error::{Error, Result};
use crate::image;
use crate::layout::Layout;
use crate::test_images;

pub const USAGE: &str = "cargo xtask cluster up    [--name NAME] [--nodes N] [--zones Z] [--ip-family ipv4|ipv6|dual] [--proxy kproxy|upstream|none] [--mode nftables|iptables|ipvs] [--no-image-build]
       cargo xtask cluster down
       cargo xtask cluster show                       /healthz, logs and `kproxy explain` from the kproxy pods
       cargo xtask cluster smoke [--nodes N] [--ip-family F] [--mode M] [--keep] [--no-image-build]
       cargo xtask cluster workloads [--proxy P] [--mode M] [--ip-family F] [--keep]   rolling update under load, internalTrafficPolicy Local, headless, hairpin
       cargo xtask cluster accel [--mode M] [--keep]     Services acceleration between real pods: offloaded, intact, throughput, endpoint gone (needs --guest here)
       cargo xtask cluster table [--ip-family F]      the e2e runs in target/kproxy-e2e side by side (markdown)
       cargo xtask cluster e2e   [--proxy P] [--mode M] [--ip-family F] [--nodes N] [--zones Z] [--focus RE] [--skip RE] [--e2e-timeout S] [--keep] [--no-image-build]
       cargo xtask cluster migrate [--from M] [--mode M] [--nodes N] [--direct-handback] [--keep] [--no-image-build]
                                  kube-proxy (--from) -> kproxy (--mode) -> kube-proxy, node by node, under traffic
                                  (docs/migration.md; --direct-handback: from kproxy iptables to kube-proxy nftables
                                  without switching kproxy to nftables first, the known limit)
every command takes --name NAME (default kpc): clusters of different names run side by side
--guest (smoke, e2e, workloads, migrate, accel): the whole cluster runs inside Debian's kernel under qemu
(cargo xtask guest-run), which has IPVS and flowtables; --mode ipvs and --from ipvs need it here
--ip-family: ipv4 (default), ipv6 (no IPv4 on the wire) or dual (IPv4 primary); --zones Z labels the
nodes topology.kubernetes.io/zone=zone-a, zone-b, ... round-robin
environment: KPROXY_CLUSTER_DIR (default target/kproxy-cluster), KPROXY_K8S_DIR, KPROXY_CLUSTER_KEEP=1 (keep a failed up)";

/// The e2e focus: every sig-network spec that touches a Service proxy (docs/conformance.md).
pub const E2E_FOCUS: &str = r"\[sig-network\] (Services|Conntrack|Networking|\[Feature:IPv6DualStack\]|Traffic Distribution|Topology Hints|Service CIDRs|NoSNAT|Connectivity Pod Lifecycle|KubeProxy)";
/// The specs this machine cannot run (docs/conformance.md says why each): `LoadBalancer`,
/// `ESIPP`, `GCE`: a cloud load balancer; `invalid conntrack state bug`: its server image
/// (regression-issue-74839) does not exist offline; `Networking-Performance`: an iperf2
/// throughput benchmark (the offline agnhost has no iperf2); `SCTP`: this kernel has no SCTP;
/// `Networking-IPv4`, `Networking-IPv6`, `Networking-DNS`: reach the internet; `Windows`,
/// `Flaky`: none here, kept so that a wider focus stays safe.
pub const E2E_SKIP: &str = r"LoadBalancer|ESIPP|GCE|Windows|Flaky|Networking-Performance|SCTP|Networking-IPv4|Networking-IPv6|Networking-DNS|should not be vulnerable to the invalid conntrack state bug";
/// What a single-stack cluster skips besides: the dual-stack specs (upstream runs them on
/// dual-stack clusters only; several assert that the cluster is one).
pub const E2E_SKIP_SINGLE_STACK: &str = r"\[Feature:IPv6DualStack\]";

#[derive(Debug, Clone)]
struct Args {
    name: String,
    nodes: Option<u8>,
    zones: Option<u8>,
    families: IpFamilies,
    proxy: Proxy,
    mode: String,
    keep: bool,
    image_build: bool,
    focus: String,
    skip: String,
    dns: Vec<String>,
    /// `migrate`: kube-proxy's mode (default: `--mode`).
    from: Option<String>,
    /// `migrate`: hand back from kproxy's iptables mode to kube-proxy's nftables mode directly.
    direct_handback: bool,
    /// Run the command inside the guest kernel (`run_in_guest`).
    guest: bool,
    /// `e2e`: ginkgo's suite timeout; when it strikes, the running spec is interrupted and the
    /// report still lists every spec that ran (default 3 h, times `startup_patience`).
    e2e_timeout: Option<Duration>,
}

/// The proxy modes a cluster runs (kube-proxy's `--proxy-mode`, kproxy's `mode:`).
const MODES: [&str; 3] = ["nftables", "iptables", "ipvs"];

fn parse(args: &[OsString]) -> Result<Args> {
    let usage = || Error::Usage(USAGE.into());
    let mut parsed = Args {
        name: wire::DEFAULT_CLUSTER.into(),
        nodes: None,
        zones: None,
        families: IpFamilies::Ipv4,
        proxy: Proxy::Kproxy,
        mode: "nftables".into(),
        keep: false,
        image_build: true,
        focus: E2E_FOCUS.into(),
        skip: String::new(),
        dns: Vec::new(),
        from: None,
        direct_handback: false,
        guest: false,
        e2e_timeout: None,
    };
    let mut it = args.iter().map(|a| a.to_str().map(str::to_owned).ok_or_else(usage));
    while let Some(arg) = it.next() {
        let arg = arg?;
        let (key, inline) = match arg.split_once('=') {
            Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
            None => (arg.clone(), None),
        };
        let mut value = || -> Result<String> { inline.clone().map_or_else(|| it.next().ok_or_else(usage)?, Ok) };
        match key.as_str() {
            "--name" => parsed.name = value()?,
            "--nodes" => parsed.nodes = Some(value()?.parse().map_err(|_| usage())?),
            "--zones" => parsed.zones = Some(value()?.parse().map_err(|_| usage())?),
            "--ip-family" => parsed.families = IpFamilies::parse(&value()?).ok_or_else(usage)?,
            "--proxy" => {
                parsed.proxy = match value()?.as_str() {
                    "kproxy" => Proxy::Kproxy,
                    "upstream" => Proxy::Upstream,
                    "none" => Proxy::None,
                    _ => return Err(usage()),
                }
            }
            "--mode" => {
                parsed.mode = value()?;
                if !MODES.contains(&parsed.mode.as_str()) {
                    return Err(usage());
                }
            }
            "--from" => {
                let from = value()?;
                if !MODES.contains(&from.as_str()) {
                    return Err(usage());
                }
                parsed.from = Some(from);
            }
            "--keep" => parsed.keep = true,
            "--guest" => parsed.guest = true,
            "--direct-handback" => parsed.direct_handback = true,
            "--no-image-build" => parsed.image_build = false,
            "--focus" => parsed.focus = value()?,
            "--skip" => parsed.skip = value()?,
            "--e2e-timeout" => parsed.e2e_timeout = Some(Duration::from_secs(value()?.parse().map_err(|_| usage())?)),
            "--bind" | "--server" | "--ca" | "--cert" | "--key" => parsed.dns.push(format!("{key}={}", value()?)),
            _ => return Err(usage()),
        }
    }
    if parsed.skip.is_empty() {
        parsed.skip = match parsed.families {
            IpFamilies::Dual => E2E_SKIP.into(),
            IpFamilies::Ipv4 | IpFamilies::Ipv6 => format!("{E2E_SKIP}|{E2E_SKIP_SINGLE_STACK}"),
        };
    }
    Ok(parsed)
}

fn setup(e: impl std::fmt::Display) -> Error {
    Error::Setup(e.to_string())
}

fn anyhow_err(e: anyhow::Error) -> Error {
    Error::Setup(format!("{e:#}"))
}

/// `cargo xtask cluster …`.
pub fn run(layout: &Layout, args: &[OsString]) -> Result<i32> {
    let Some(sub) = args.first().and_then(|a| a.to_str()) else { return Err(Error::Usage(USAGE.into())) };
    let parsed = parse(&args[1..])?;
    let work = work_dir(layout, &parsed.name);
    if parsed.e2e_timeout.is_some() && sub != "e2e" {
        return Err(Error::Usage(format!("--e2e-timeout is e2e's (ginkgo's suite timeout), not {sub}'s\n{USAGE}")));
    }
    if parsed.guest && !kproxy_testbed::kernel::in_guest() {
        return run_in_guest(layout, sub, &args[1..], &parsed, &work);
    }
    if matches!(sub, "up" | "smoke" | "workloads" | "e2e" | "migrate" | "accel") {
        refuse_ipvs_without_kernel_support(&parsed)?;
    }
    match sub {
        "up" => {
            let cluster = up(layout, &work, &parsed, parsed.nodes.unwrap_or(1), true)?;
            print_access(&cluster.info);
            cluster.detach();
            Ok(0)
        }
        "down" => {
            cluster::down(&work).map_err(anyhow_err)?;
            Ok(0)
        }
        "show" => {
            let info = read_info(&work)?;
            show(&info);
            Ok(0)
        }
        "smoke" => smoke(layout, &work, &parsed),
        "workloads" => workloads(layout, &work, &parsed),
        "table" => {
            print!("{}", table(&layout.target.join("kproxy-e2e"), parsed.families)?);
            Ok(0)
        }
        "e2e" => e2e(layout, &work, &parsed),
        "migrate" => migrate(layout, &work, &parsed),
        "accel" => accel(layout, &work, &parsed),
        // Internal: the cluster DNS stand-in, started by `up` in each node's namespace.
        "dns" => serve_dns(&parsed.dns),
        _ => Err(Error::Usage(USAGE.into())),
    }
}

/// The subcommands `--guest` runs: each brings its cluster up and down itself (the guest, and all
/// it ran, is gone when the command ends).
const GUEST_SUBCOMMANDS: [&str; 5] = ["smoke", "e2e", "workloads", "migrate", "accel"];

/// `--guest`: runs `cargo xtask cluster SUB ARGS` inside Debian's kernel under qemu (whole
/// cluster: control plane, nodes, e2e.test). Images are built on the host first (the guest sees the
/// host's files read-only); the cluster's work directory is a tmpfs in the guest; e2e reports are
/// written through a read-write share. docs/conformance.md "In the guest kernel" has the costs.
fn run_in_guest(layout: &Layout, sub: &str, args: &[OsString], parsed: &Args, work: &Path) -> Result<i32> {
    if !GUEST_SUBCOMMANDS.contains(&sub) {
        return Err(Error::Usage(format!(
            "--guest runs {} (a cluster that lives as long as the command)\n{USAGE}",
            GUEST_SUBCOMMANDS.join(", ")
        )));
    }
    let needs_kproxy = parsed.proxy == Proxy::Kproxy || sub == "migrate";
    let needs_upstream = parsed.proxy == Proxy::Upstream || sub == "migrate";
    let archive = layout.target.join(image::ARCHIVE);
    if needs_kproxy && (parsed.image_build || !archive.is_file()) {
        let status = image::run(layout, &["--no-verify".into()])?;
        if status != 0 {
            return Err(setup(format!("cargo xtask image failed ({status})")));
        }
    }
    let binaries = Binaries::locate().map_err(setup)?;
    let kube_proxy = if needs_upstream { Some(binaries.path(Binary::KubeProxy).map_err(setup)?) } else { None };
    test_images::ensure(layout, sub == "e2e", kube_proxy.as_deref())?;
    let reports = layout.target.join("kproxy-e2e");
    fs::create_dir_all(&reports).map_err(setup)?;
    let nodes = u32::from(parsed.nodes.unwrap_or(if sub == "smoke" { 1 } else { 2 }));
    let guest_setup = crate::guest::Setup {
        rw_shares: vec![reports],
        tmpfs: vec![work.to_path_buf()],
        cgroups_v1: true,
        // Measured in the guest: the control plane ~0.6 GiB; a node's images, snapshots (tmpfs)
        // and processes ~1–1.3 GiB.
        memory_mib: Some(2048 + 2048 * nodes),
        panic_on_soft_lockup: true,
    };
    let exe = std::env::current_exe().map_err(setup)?;
    let mut command = vec![exe.into_os_string(), "cluster".into(), sub.into()];
    command.extend(args.iter().filter(|a| *a != "--guest").cloned());
    command.push("--no-image-build".into());
    let guest = crate::guest::Guest::prepare(layout)?;
    // Hang guards, not speed bounds: the guest's CPU is emulated (TCG, ~8x slower).
    // An e2e run given its own timeout ends within it, plus the cluster's start and teardown.
    let timeout = match (sub, parsed.e2e_timeout) {
        ("e2e", Some(e2e)) => e2e + Duration::from_secs(3600),
        ("e2e", None) => Duration::from_secs(24 * 3600),
        _ => Duration::from_secs(3 * 3600),
    };
    guest.run_with(&command, &[], timeout, &guest_setup)
}

/// `--mode ipvs` (and `--from ipvs`) where this kernel has no IPVS: a clear refusal rather than
/// a proxy that fails on every node.
fn refuse_ipvs_without_kernel_support(args: &Args) -> Result<()> {
    let wants_ipvs = args.mode == "ipvs" || args.from.as_deref() == Some("ipvs");
    if wants_ipvs && !kproxy_testbed::kernel::KernelFeature::Ipvs.is_available() {
        return Err(Error::Usage(format!(
            "this kernel has no IPVS (/proc/net/ip_vs is absent after modprobe ip_vs): add --guest to run the cluster in Debian's kernel under qemu\n{USAGE}"
        )));
    }
    Ok(())
}

/// `cargo xtask cluster accel`: see `crate::accel`. Acceleration is kproxy's: `--proxy` must be
/// kproxy (the default).
fn accel(layout: &Layout, work: &Path, args: &Args) -> Result<i32> {
    if args.proxy != Proxy::Kproxy {
        return Err(Error::Usage(format!("accel checks kproxy's Services acceleration: --proxy kproxy\n{USAGE}")));
    }
    if !kproxy_testbed::kernel::KernelFeature::Flowtable.is_available() {
        return Err(Error::Usage(format!(
            "this kernel has no nftables flowtables: add --guest to run the cluster in Debian's kernel under qemu\n{USAGE}"
        )));
    }
    let started = Instant::now();
    let cluster = up(layout, work, args, args.nodes.unwrap_or(2), false)?;
    let result = crate::accel::run(&cluster.info);
    if args.keep {
        print_access(&cluster.info);
        cluster.detach();
    } else {
        cluster.down().map_err(anyhow_err)?;
    }
    let mode = &args.mode;
    match result {
        Ok(lines) => {
            for line in &lines {
                println!("accel [{mode}]: {line}");
            }
            let failed = lines.iter().any(|l| l.starts_with("FAIL"));
            let verdict = if failed { "FAILED" } else { "passed" };
            println!("accel [{mode}]: {verdict} in {:.0} s", started.elapsed().as_secs_f64());
            Ok(i32::from(failed))
        }
        Err(e) => {
            println!("accel [{mode}]: FAILED: {e:#}");
            Ok(1)
        }
    }
}

/// `cargo xtask cluster migrate`: see `crate::migrate`.
fn migrate(layout: &Layout, work: &Path, args: &Args) -> Result<i32> {
    let from = args.from.clone().unwrap_or_else(|| args.mode.clone());
    if args.direct_handback && !(from == "nftables" && args.mode == "iptables") {
        return Err(Error::Usage(format!(
            "--direct-handback is about kproxy in iptables mode handing back to kube-proxy in nftables mode (--from nftables --mode iptables)\n{USAGE}"
        )));
    }
    let archive = layout.target.join(image::ARCHIVE);
    if args.image_build || !archive.is_file() {
        let status = image::run(layout, &["--no-verify".into()])?;
        if status != 0 {
            return Err(setup(format!("cargo xtask image failed ({status})")));
        }
    }
    let upstream = Args { proxy: Proxy::Upstream, mode: from.clone(), ..args.clone() };
    let cluster = up(layout, work, &upstream, args.nodes.unwrap_or(2), false)?;
    let run =
        crate::migrate::Migration { layout, work, from: &from, to: &args.mode, direct_handback: args.direct_handback };
    let result = crate::migrate::run(&run, &cluster);
    if args.keep {
        print_access(&cluster.info);
        cluster.detach();
    } else {
        cluster.down().map_err(anyhow_err)?;
    }
    match result {
        Ok(true) => Ok(0),
        Ok(false) => {
            println!("migrate: FAILED (requests failed or connections broke)");
            Ok(1)
        }
        Err(e) => {
            println!("migrate: FAILED: {e:#}");
            Ok(1)
        }
    }
}

/// `target/kproxy-cluster` (`KPROXY_CLUSTER_DIR`) for the default cluster, `…-NAME` for another.
fn work_dir(layout: &Layout, name: &str) -> PathBuf {
    let base = std::env::var_os("KPROXY_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| layout.target.join("kproxy-cluster"));
    if name == wire::DEFAULT_CLUSTER {
        base
    } else {
        let mut dir = base.into_os_string();
        dir.push(format!("-{name}"));
        PathBuf::from(dir)
    }
}

fn read_info(work: &Path) -> Result<ClusterInfo> {
    let path = cluster::info_path(work);
    let bytes = fs::read(&path)
        .map_err(|e| setup(format!("no cluster is up ({}: {e}); run `cargo xtask cluster up`", path.display())))?;
    serde_json::from_slice(&bytes).map_err(setup)
}

/// Brings a cluster up (building kproxy's image first unless `--no-image-build`); with
/// `with_e2e_images`, the images only e2e uses are imported too.
fn up(layout: &Layout, work: &Path, args: &Args, nodes: u8, with_e2e_images: bool) -> Result<Cluster> {
    let binaries = Binaries::locate().map_err(setup)?;
    let archive = layout.target.join(image::ARCHIVE);
    if args.proxy == Proxy::Kproxy && (args.image_build || !archive.is_file()) {
        let started = Instant::now();
        let status = image::run(layout, &["--no-verify".into()])?;
        if status != 0 {
            return Err(setup(format!("cargo xtask image failed ({status})")));
        }
        tracing::info!("kproxy image ready in {:.1} s", started.elapsed().as_secs_f64());
    }
    // Upstream kube-proxy runs from an image built here; e2e's KubeProxy spec needs distroless.
    let kube_proxy = match args.proxy {
        Proxy::Upstream => Some(binaries.path(Binary::KubeProxy).map_err(setup)?),
        Proxy::Kproxy | Proxy::None => None,
    };
    let test_images = test_images::ensure(layout, with_e2e_images, kube_proxy.as_deref())?;
    let exe = std::env::current_exe().map_err(setup)?;
    let options = ClusterOptions {
        name: args.name.clone(),
        work: work.to_path_buf(),
        nodes,
        families: args.families,
        zones: args.zones.unwrap_or(0),
        proxy: args.proxy,
        mode: args.mode.clone(),
        kproxy_image: Some((archive, image::IMAGE_NAME.into())),
        upstream_image: test_images.kube_proxy.map(|archive| (archive, test_images::KUBE_PROXY.into())),
        test_images: test_images.distroless_iptables.into_iter().collect(),
        manifest: layout.workspace.join("deploy").join("kproxy.yaml"),
        dns_command: (exe, vec!["cluster".into(), "dns".into()]),
        images: binaries.dir().join("images"),
    };
    cluster::up(&binaries, &options).map_err(anyhow_err)
}

fn print_access(info: &ClusterInfo) {
    let nodes: Vec<String> = info
        .nodes
        .iter()
        .map(|n| {
            let ips: Vec<String> = n.ips.iter().map(ToString::to_string).collect();
            let zone = n.zone.as_ref().map(|z| format!(" ({z})")).unwrap_or_default();
            format!("{}{zone} {} pods {}", n.name, ips.join(","), n.pod_cidrs.join(","))
        })
        .collect();
    println!(
        "cluster up in {:.1} s: {}, proxy {:?} ({}), nodes: {}",
        info.started_in_secs,
        info.families.as_str(),
        info.proxy,
        info.mode,
        nodes.join("; ")
    );
    println!(
        "kubectl: nsenter --net=/run/netns/{} {} --kubeconfig {} get pods -A",
        info.wire_netns,
        info.kubectl.display(),
        info.admin_kubeconfig.display()
    );
    let name = info.wire_netns.strip_suffix("-wire").filter(|n| *n != wire::DEFAULT_CLUSTER);
    let down = name
        .map(|n| format!("cargo xtask cluster down --name {n}"))
        .unwrap_or_else(|| "cargo xtask cluster down".into());
    println!("logs: {}    down: {down}", info.logs.display());
}

/// /healthz of every node's proxy, the last log lines of its pod, and `kproxy explain` from each
/// kproxy pod.
fn show(info: &ClusterInfo) -> bool {
    let kubectl = Kubectl::from_info(info);
    let mut ok = true;
    for node in &info.nodes {
        match cluster::wait_http_ok(&node.netns, "http://127.0.0.1:10256/healthz", Duration::from_secs(5)) {
            Ok(body) => println!("== {} /healthz (:10256, the pod's host network): {}", node.name, body.trim()),
            Err(e) => {
                ok = false;
                println!("== {} /healthz: {e:#}", node.name);
            }
        }
    }
    if info.proxy == Proxy::None {
        return ok;
    }
    let selector = format!("k8s-app={}", cluster::PROXY_APP);
    let pods = kubectl
        .run(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            &selector,
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{\"\\n\"}{end}",
        ])
        .unwrap_or_default();
    for line in pods.lines() {
        let Some((pod, node)) = line.split_once(' ') else { continue };
        println!("== kubectl -n kube-system logs {pod} --tail=15   ({node})");
        match kubectl.run(&["-n", "kube-system", "logs", pod, "--tail=15"]) {
            Ok(text) => print!("{text}"),
            Err(e) => {
                ok = false;
                println!("{e:#}");
            }
        }
        if info.proxy != Proxy::Kproxy {
            continue;
        }
        let primary = info.families.primary();
        let to = wire::host_port(primary.kubernetes_service_ip(), 443);
        let node_ip = info.nodes.iter().find(|n| n.name == node).map(|n| n.ips[0].to_string()).unwrap_or_default();
        // The metrics server binds the primary family's loopback (docs/conformance.md).
        let metrics = match primary {
            Family::V4 => "127.0.0.1:10249",
            Family::V6 => "[::1]:10249",
        };
        println!(
            "== kubectl -n kube-system exec {pod} -- kproxy explain --server {metrics} --from {node_ip} --to {to}"
        );
        match kubectl.run(&[
            "-n",
            "kube-system",
            "exec",
            pod,
            "--",
            "kproxy",
            "explain",
            "--server",
            metrics,
            "--from",
            &node_ip,
            "--to",
            &to,
        ]) {
            Ok(text) => print!("{text}"),
            Err(e) => {
                ok = false;
                println!("{e:#}");
            }
        }
    }
    ok
}

/// The smoke (CI): up, node Ready, the DaemonSet ready, one Service through a real pod by
/// ClusterIP, by name (cluster DNS) and by NodePort (from a pod and from outside the node),
/// then down. Every step is timed.
fn smoke(layout: &Layout, work: &Path, args: &Args) -> Result<i32> {
    let started = Instant::now();
    if args.proxy == Proxy::None {
        return Err(Error::Usage("smoke needs a proxy".into()));
    }
    // Like every test that needs ../shared/k8s: a visible skip outside CI, a failure under CI.
    if let Err(missing) = Binaries::locate() {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            return Err(setup(format!("CI=true and the Kubernetes binaries are missing: {missing}")));
        }
        println!("SKIPPED cluster smoke: needs the Kubernetes v1.36.2 binaries: {missing}");
        return Ok(0);
    }
    let cluster = up(layout, work, args, args.nodes.unwrap_or(1), false)?;
    let up_secs = started.elapsed().as_secs_f64();
    let result = smoke_checks(&cluster.info);
    let checks_secs = started.elapsed().as_secs_f64() - up_secs;
    if result.is_err() {
        print_failure_context(&cluster.info);
    }
    if args.keep {
        print_access(&cluster.info);
        cluster.detach();
    } else {
        cluster.down().map_err(anyhow_err)?;
    }
    let total = started.elapsed().as_secs_f64();
    match result {
        Ok(()) => {
            println!(
                "cluster smoke: passed — up (image, control plane, nodes Ready, proxy ready) {up_secs:.1} s, checks {checks_secs:.1} s, total with down {total:.1} s"
            );
            Ok(0)
        }
        Err(e) => {
            println!("cluster smoke: FAILED after {total:.1} s: {e:#}");
            Ok(1)
        }
    }
}

const SMOKE_NS: &str = "kproxy-smoke";

/// What a failed smoke leaves to look at in CI's log: the end of each node's DNS stand-in and
/// kubelet logs, the smoke's pods and Services as the API server has them, and the proxy pods'.
fn print_failure_context(info: &ClusterInfo) {
    let kubectl = Kubectl::from_info(info);
    for args in [
        &["-n", SMOKE_NS, "get", "pods,svc,endpointslices", "-o", "wide"][..],
        &["-n", "kube-system", "get", "pods,svc,endpointslices", "-o", "wide"][..],
    ] {
        println!("== kubectl {}", args.join(" "));
        println!("{}", kubectl.run(args).unwrap_or_else(|e| format!("{e:#}")));
    }
    for node in &info.nodes {
        for component in ["dns", "kubelet"] {
            let log = info.logs.join(format!("{}-{component}.log", node.name));
            let text = fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(20).collect();
            println!("== the last lines of {}", log.display());
            for line in tail.iter().rev() {
                println!("{line}");
            }
        }
    }
}

fn smoke_checks(info: &ClusterInfo) -> anyhow::Result<()> {
    use anyhow::{Context, bail};
    let kubectl = Kubectl::from_info(info);
    if !show(info) {
        bail!("the proxy's /healthz, logs or explain could not be read");
    }
    let node = &info.nodes[0];
    // One single-stack NodePort Service of each family of the cluster, both on the same server.
    let services: Vec<serde_json::Value> = info
        .families
        .families()
        .iter()
        .map(|family| {
            serde_json::json!({"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": smoke_service(*family), "namespace": SMOKE_NS},
             "spec": {"type": "NodePort", "selector": {"app": "server"}, "ipFamilyPolicy": "SingleStack",
                "ipFamilies": [family.api_name()], "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
        })
        .collect();
    let mut items = vec![
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SMOKE_NS}}),
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "server", "namespace": SMOKE_NS, "labels": {"app": "server"}},
         "spec": {"nodeName": node.name, "containers": [{"name": "netexec", "image": AGNHOST,
            "args": ["netexec", "--http-port=8080"], "ports": [{"containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1}}]}}),
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": SMOKE_NS},
         "spec": {"containers": [{"name": "client", "image": AGNHOST, "args": ["pause"]}]}}),
    ];
    items.extend(services);
    kubectl.apply(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string())?;
    kubectl
        .run(&["-n", SMOKE_NS, "wait", "--for=condition=Ready", "pod", "--all", &kubectl_timeout(120)])
        .context("smoke pods Ready")?;
    for family in info.families.families() {
        let name = smoke_service(*family);
        let cluster_ip = kubectl.run(&["-n", SMOKE_NS, "get", "svc", &name, "-o", "jsonpath={.spec.clusterIP}"])?;
        let cluster_ip: IpAddr = cluster_ip.trim().parse().with_context(|| format!("{name}'s ClusterIP"))?;
        if Family::of(cluster_ip) != *family {
            bail!("{name} got ClusterIP {cluster_ip}, not {}", family.api_name());
        }
        let node_port: u16 = kubectl
            .run(&["-n", SMOKE_NS, "get", "svc", &name, "-o", "jsonpath={.spec.ports[0].nodePort}"])?
            .trim()
            .parse()
            .with_context(|| format!("{name}'s nodePort"))?;
        let node_ip =
            node.ip(*family).with_context(|| format!("{} has no {} address", node.name, family.api_name()))?;
        let targets = [
            ("ClusterIP from a pod", format!("http://{}/hostname", wire::host_port(cluster_ip, 80)), true),
            (
                "the Service's name (cluster DNS) from a pod",
                format!("http://{name}.{SMOKE_NS}.svc.cluster.local/hostname"),
                true,
            ),
            ("NodePort from a pod", format!("http://{}/hostname", wire::host_port(node_ip, node_port)), true),
            (
                "NodePort from outside the node",
                format!("http://{}/hostname", wire::host_port(node_ip, node_port)),
                false,
            ),
        ];
        for (what, url, from_pod) in targets {
            let began = Instant::now();
            let answer = kubectl.wait_for(startup_patience(Duration::from_secs(30)), what, || {
                let out = if from_pod {
                    kubectl
                        .run(&["-n", SMOKE_NS, "exec", "client", "--", "curl", "-sS", "--max-time", "3", &url])
                        .ok()?
                } else {
                    let out = Command::new("ip")
                        .args(["netns", "exec", &info.wire_netns, "curl", "-sS", "--max-time", "3", &url])
                        .output()
                        .ok()?;
                    String::from_utf8_lossy(&out.stdout).into_owned()
                };
                (out.trim() == "server").then_some(out)
            })?;
            println!(
                "smoke [{}]: {what}: {url} -> {} ({} ms)",
                family.api_name(),
                answer.trim(),
                began.elapsed().as_millis()
            );
        }
        if info.mode == "ipvs" {
            // The ClusterIP's TCP virtual server, with the pod behind it as a real server.
            let virtual_server = VirtualKey::Addr { protocol: "TCP", addr: cluster_ip, port: 80 };
            let services = migration::ipvs_services(&node.netns)?;
            let Some(service) = services.iter().find(|s| s.key == virtual_server) else {
                bail!("{} runs the IPVS mode but has no virtual server {virtual_server} for {name}", node.name);
            };
            if service.real_servers.is_empty() {
                bail!("{} runs the IPVS mode but has no real server behind {name}'s ClusterIP", node.name);
            }
            let real_servers: Vec<String> = service.real_servers.iter().map(ToString::to_string).collect();
            println!(
                "smoke [{}]: IPVS virtual server {virtual_server} on {}: real servers {}",
                family.api_name(),
                node.name,
                real_servers.join(", ")
            );
        }
    }
    Ok(())
}

/// kubectl's `--timeout` for a wait of `host_secs` on the host ([`startup_patience`]: eight times
/// that in the guest, whose pods start under an emulated CPU).
pub(crate) fn kubectl_timeout(host_secs: u64) -> String {
    format!("--timeout={}s", startup_patience(Duration::from_secs(host_secs)).as_secs())
}

/// A ClusterIP as a URL's host (IPv6 in brackets); anything else as it is.
fn url_host(ip: &str) -> String {
    match ip.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
        _ => ip.to_owned(),
    }
}

/// The smoke's Service of `family`.
fn smoke_service(family: Family) -> String {
    format!("smoke-{}", family.api_name().to_ascii_lowercase())
}

const WORKLOADS_NS: &str = "kproxy-workloads";
pub(crate) const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.63.0";

/// `workloads` (#28 part 4): on two nodes, a Deployment rolled while a client pod sends requests
/// to its ClusterIP and NodePort without pause (failures counted), `internalTrafficPolicy: Local`
/// from a node-local client, a headless Service by DNS, and a pod reaching itself through its
/// Service (hairpin). Then down (unless `--keep`).
fn workloads(layout: &Layout, work: &Path, args: &Args) -> Result<i32> {
    let started = Instant::now();
    let cluster = up(layout, work, args, args.nodes.unwrap_or(2), false)?;
    let mut cluster = cluster;
    let result = workload_checks(&cluster.info.clone()).and_then(|mut lines| {
        lines.push(apiserver_restart_check(&mut cluster)?);
        Ok(lines)
    });
    if args.keep {
        print_access(&cluster.info);
        cluster.detach();
    } else {
        cluster.down().map_err(anyhow_err)?;
    }
    let proxy = format!("{:?} ({})", args.proxy, args.mode);
    match result {
        Ok(lines) => {
            for line in &lines {
                println!("workloads [{proxy}]: {line}");
            }
            let failed = lines.iter().any(|l| l.starts_with("FAIL"));
            println!(
                "workloads [{proxy}]: {} in {:.0} s",
                if failed { "FAILED" } else { "passed" },
                started.elapsed().as_secs_f64()
            );
            Ok(i32::from(failed))
        }
        Err(e) => {
            println!("workloads [{proxy}]: FAILED: {e:#}");
            Ok(1)
        }
    }
}

fn workload_checks(info: &ClusterInfo) -> anyhow::Result<Vec<String>> {
    use anyhow::{Context, bail};
    if info.nodes.len() < 2 {
        bail!("workloads needs two nodes (internalTrafficPolicy Local and cross-node traffic)");
    }
    let kubectl = Kubectl::from_info(info);
    let (node1, node2) = (&info.nodes[0], &info.nodes[1]);
    let netexec = |name: &str, replicas: u32| netexec_deployment(name, WORKLOADS_NS, replicas);
    let service = |name: &str, app: &str, extra: serde_json::Value| {
        let mut spec =
            serde_json::json!({"selector": {"app": app}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": WORKLOADS_NS}, "spec": spec})
    };
    let manifest = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": WORKLOADS_NS}},
        netexec("web", 4),
        netexec("solo", 1),
        service("web", "web", serde_json::json!({"type": "NodePort"})),
        service("web-local", "web", serde_json::json!({"internalTrafficPolicy": "Local"})),
        service("web-headless", "web", serde_json::json!({"clusterIP": "None"})),
        service("solo", "solo", serde_json::json!({})),
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": WORKLOADS_NS},
         "spec": {"nodeName": node1.name, "containers": [{"name": "client", "image": AGNHOST, "args": ["pause"]}]}}
    ]});
    kubectl.apply(&manifest.to_string())?;
    for deployment in ["web", "solo"] {
        kubectl.run(&[
            "-n",
            WORKLOADS_NS,
            "rollout",
            "status",
            &format!("deployment/{deployment}"),
            &kubectl_timeout(180),
        ])?;
    }
    kubectl.run(&["-n", WORKLOADS_NS, "wait", "--for=condition=Ready", "pod/client", &kubectl_timeout(120)])?;
    let get = |args: &[&str]| kubectl.run(args).map(|s| s.trim().to_owned());
    let cluster_ip = get(&["-n", WORKLOADS_NS, "get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"])?;
    let node_port = get(&["-n", WORKLOADS_NS, "get", "svc", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"])?;
    let mut lines = Vec::new();

    // 1. Rolling update under load: requests from before the rollout starts until 10 s after it
    // ends (in the guest kernel a rollout takes minutes), at most an hour.
    let script = format!(
        "rm -f /tmp/stop-load; ok1=0; f1=0; ok2=0; f2=0; end=$((SECONDS+3600)); while [ $SECONDS -lt $end ] && [ ! -e /tmp/stop-load ]; do \
         if [ \"$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 2 http://{}/hostname)\" = 200 ]; then ok1=$((ok1+1)); else f1=$((f1+1)); fi; \
         if [ \"$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 2 http://{}/hostname)\" = 200 ]; then ok2=$((ok2+1)); else f2=$((f2+1)); fi; \
         done; echo $ok1 $f1 $ok2 $f2",
        url_host(&cluster_ip),
        wire::host_port(node2.ips[0], node_port.parse().context("the web Service's nodePort")?),
    );
    let load = kubectl
        .command(&["-n", WORKLOADS_NS, "exec", "client", "--", "bash", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("starting the client's load")?;
    let load_started = Instant::now();
    std::thread::sleep(Duration::from_secs(5));
    let roll_started = Instant::now();
    kubectl.run(&["-n", WORKLOADS_NS, "rollout", "restart", "deployment/web"])?;
    kubectl.run(&["-n", WORKLOADS_NS, "rollout", "status", "deployment/web", &kubectl_timeout(180)])?;
    let rolled_in = roll_started.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(10));
    kubectl.run(&["-n", WORKLOADS_NS, "exec", "client", "--", "touch", "/tmp/stop-load"])?;
    let out = load.wait_with_output()?;
    let seconds = load_started.elapsed().as_secs();
    let counts: Vec<u64> =
        String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|w| w.parse().ok()).collect();
    let [ok1, f1, ok2, f2] = counts[..] else {
        bail!(
            "the client's load printed {:?} ({})",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let verdict = if f1 + f2 == 0 { "ok  " } else { "FAIL" };
    lines.push(format!(
        "{verdict} rolling update (4 replicas, maxSurge 1, readiness-gated, preStop 5 s; rolled in {rolled_in:.0} s) under {seconds} s of requests without pause: ClusterIP {ok1} ok / {f1} failed, NodePort (other node) {ok2} ok / {f2} failed"
    ));

    // 2. internalTrafficPolicy Local: every answer from a pod on the client's node.
    let pods = get(&[
        "-n",
        WORKLOADS_NS,
        "get",
        "pods",
        "-l",
        "app=web",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{\"\\n\"}{end}",
    ])?;
    let local_pods: Vec<String> = pods
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(_, n)| *n == node1.name)
        .map(|(p, _)| p.to_owned())
        .collect();
    let local_ip = get(&["-n", WORKLOADS_NS, "get", "svc", "web-local", "-o", "jsonpath={.spec.clusterIP}"])?;
    let answers = get(&[
        "-n",
        WORKLOADS_NS,
        "exec",
        "client",
        "--",
        "bash",
        "-c",
        &format!("for i in $(seq 20); do curl -s --max-time 2 http://{}/hostname; echo; done", url_host(&local_ip)),
    ])?;
    let answered: Vec<&str> = answers.lines().filter(|l| !l.is_empty()).collect();
    let all_local = answered.len() == 20 && answered.iter().all(|a| local_pods.iter().any(|p| p == a));
    lines.push(format!(
        "{} internalTrafficPolicy Local from a pod on {}: {} of 20 answered, all by that node's pods ({}): {all_local}",
        if all_local && !local_pods.is_empty() { "ok  " } else { "FAIL" },
        node1.name,
        answered.len(),
        local_pods.join(", ")
    ));

    // 3. Headless: the name resolves to the ready pods, and a request by name reaches one.
    let ready = get(&[
        "-n",
        WORKLOADS_NS,
        "get",
        "endpointslices",
        "-l",
        "kubernetes.io/service-name=web-headless",
        "-o",
        "jsonpath={range .items[*].endpoints[?(@.conditions.ready==true)]}{.addresses[0]}{\"\\n\"}{end}",
    ])?;
    let mut want: Vec<&str> = ready.lines().filter(|l| !l.is_empty()).collect();
    want.sort_unstable();
    // The image has busybox's nslookup (no getent): "Address: IP" lines after the server's.
    let resolved = get(&[
        "-n",
        WORKLOADS_NS,
        "exec",
        "client",
        "--",
        "nslookup",
        &format!("web-headless.{WORKLOADS_NS}.svc.cluster.local"),
    ])
    .unwrap_or_else(|e| format!("{e:#}"));
    let mut got: Vec<&str> = resolved
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Address:"))
        .map(str::trim)
        // The server's own lines say `Address: IP:53` or `[IP]:53`, which do not parse.
        .filter(|a| a.parse::<IpAddr>().is_ok_and(|ip| ip != Family::of(ip).dns_service_ip()))
        .collect();
    got.sort_unstable();
    got.dedup();
    let by_name = get(&[
        "-n",
        WORKLOADS_NS,
        "exec",
        "client",
        "--",
        "curl",
        "-s",
        "--max-time",
        "3",
        &format!("http://web-headless.{WORKLOADS_NS}.svc.cluster.local:8080/hostname"),
    ])
    .unwrap_or_default();
    let headless_ok = got == want && !want.is_empty() && by_name.starts_with("web-");
    // A failure says what nslookup printed (its error, or the server's answer).
    let lookup = if headless_ok { String::new() } else { format!("; nslookup said: {:?}", resolved.trim()) };
    lines.push(format!(
        "{} headless Service: resolves to the {} ready pod IPs {:?} (got {:?}); by name -> {by_name}{lookup}",
        if headless_ok { "ok  " } else { "FAIL" },
        want.len(),
        want,
        got
    ));

    // 4. Hairpin: the one solo pod reaches itself through its Service's ClusterIP.
    let solo = get(&["-n", WORKLOADS_NS, "get", "pods", "-l", "app=solo", "-o", "jsonpath={.items[0].metadata.name}"])?;
    let solo_ip = get(&["-n", WORKLOADS_NS, "get", "svc", "solo", "-o", "jsonpath={.spec.clusterIP}"])?;
    let itself = get(&[
        "-n",
        WORKLOADS_NS,
        "exec",
        &solo,
        "--",
        "curl",
        "-s",
        "--max-time",
        "3",
        &format!("http://{}/hostname", url_host(&solo_ip)),
    ])
    .unwrap_or_default();
    lines.push(format!(
        "{} hairpin: pod {solo} through its Service {solo_ip}:80 -> {itself}",
        if itself == solo { "ok  " } else { "FAIL" }
    ));
    Ok(lines)
}

/// Check 5 of `workloads`: the API server stopped and started again (same port and etcd), as a
/// control-plane crash or upgrade does, which e2e's `Services should work after restarting
/// apiserver` cannot do here (it deletes the API server's pod; this one is a process, docs/conformance.md): while it
/// is down, the `web` Service still answers from node 1 by ClusterIP and through node 2's
/// NodePort from outside (the proxies keep their rules without the API server; no kubectl, so
/// the requests come from the node and the wire); once it is back, a new Service is served from
/// a pod within 30 s (the proxies re-established their watches) and the old one still is.
fn apiserver_restart_check(cluster: &mut Cluster) -> anyhow::Result<String> {
    use anyhow::Context;
    let info = cluster.info.clone();
    let kubectl = Kubectl::from_info(&info);
    let get = |args: &[&str]| kubectl.run(args).map(|s| s.trim().to_owned());
    let cluster_ip = get(&["-n", WORKLOADS_NS, "get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"])?;
    let node_port: u16 = get(&["-n", WORKLOADS_NS, "get", "svc", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"])?
        .parse()
        .context("the web Service's nodePort")?;
    let (node1, node2) = (&info.nodes[0], &info.nodes[1]);
    let probes = [
        (node1.netns.clone(), format!("http://{}/hostname", url_host(&cluster_ip))),
        (info.wire_netns.clone(), format!("http://{}/hostname", wire::host_port(node2.ips[0], node_port))),
    ];
    let answered = |netns: &str, url: &str| {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                netns,
                "curl",
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "2",
                url,
            ])
            .output()
            .is_ok_and(|out| out.stdout == b"200")
    };
    cluster.stop_apiserver()?;
    let stopped = Instant::now();
    let (mut ok, mut failed) = (0, 0);
    while stopped.elapsed() < Duration::from_secs(15) {
        for (netns, url) in &probes {
            if answered(netns, url) {
                ok += 1;
            } else {
                failed += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    cluster.start_apiserver()?;
    let down_for = stopped.elapsed().as_secs_f64();
    let manifest = serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "after-restart", "namespace": WORKLOADS_NS},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}});
    kubectl.apply(&manifest.to_string())?;
    let new_ip = get(&["-n", WORKLOADS_NS, "get", "svc", "after-restart", "-o", "jsonpath={.spec.clusterIP}"])?;
    let began = Instant::now();
    let from_client = |ip: &str| {
        kubectl
            .run(&[
                "-n",
                WORKLOADS_NS,
                "exec",
                "client",
                "--",
                "curl",
                "-s",
                "--max-time",
                "2",
                &format!("http://{}/hostname", url_host(ip)),
            ])
            .is_ok_and(|out| out.starts_with("web-"))
    };
    // 30 s on the host (client-go's watch backoff is about 20 s); in the guest kernel every wait
    // is eight times longer, as each `kubectl exec` there takes seconds.
    let new_served = kubectl
        .wait_for(startup_patience(Duration::from_secs(30)), "the new Service served", || {
            from_client(&new_ip).then_some(())
        })
        .is_ok();
    let new_after = began.elapsed().as_secs_f64();
    let old_served = from_client(&cluster_ip);
    let passed = failed == 0 && ok > 0 && new_served && old_served;
    Ok(format!(
        "{} API server restart (down {down_for:.0} s): during the outage {ok} ok / {failed} failed requests (ClusterIP from node 1, NodePort of node 2 from outside); after it, a new Service {new_ip} served from a pod: {new_served} ({new_after:.1} s), the old one: {old_served}",
        if passed { "ok  " } else { "FAIL" }
    ))
}

/// `e2e`: a cluster with the chosen proxy, Kubernetes' e2e.test focused on the sig-network
/// Services, Conntrack and Networking specs, a junit report and a summary; then down.
fn e2e(layout: &Layout, work: &Path, args: &Args) -> Result<i32> {
    let started = Instant::now();
    let nodes = args.nodes.unwrap_or(2);
    let proxy = format!("{:?}", args.proxy).to_lowercase();
    // A run in the guest kernel (`--guest`) is its own column: `…-Nn-guest`.
    let place = if kproxy_testbed::kernel::in_guest() { "-guest" } else { "" };
    let report = layout.target.join("kproxy-e2e").join(format!(
        "{proxy}-{}-{}-{nodes}n{place}",
        args.mode,
        args.families.as_str()
    ));
    // Two e2e runs at once would share their report directory.
    if report.exists() {
        fs::remove_dir_all(&report).map_err(setup)?;
    }
    fs::create_dir_all(&report).map_err(setup)?;
    let cluster = up(layout, work, args, nodes, true)?;
    let up_secs = started.elapsed().as_secs_f64();
    let binaries = Binaries::locate().map_err(setup)?;
    let e2e_bin = binaries.path(Binary::E2eTest).map_err(setup)?;
    let info = cluster.info.clone();
    let log = report.join("e2e.log");
    let e2e_timeout = args.e2e_timeout.unwrap_or_else(|| startup_patience(Duration::from_secs(3 * 3600)));
    let run_started = Instant::now();
    let status = fs::File::create(&log).map_err(setup).and_then(|out| {
        let err = out.try_clone().map_err(setup)?;
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", info.wire_netns))
            .arg("--")
            .arg(&e2e_bin)
            // What e2e's SSH helpers read (test/e2e/framework/ssh): the nodes' sshd takes this key.
            .env("KUBE_SSH_USER", kproxy_k8s_harness::ssh::USER)
            .env("KUBE_SSH_KEY_PATH", &info.ssh_key)
            .args([
                "--provider=local".to_owned(),
                format!("--kubeconfig={}", info.admin_kubeconfig.display()),
                format!("--kubectl-path={}", info.kubectl.display()),
                format!("--num-nodes={nodes}"),
                format!("--report-dir={}", report.display()),
                format!("--ginkgo.focus={}", args.focus),
                format!("--ginkgo.skip={}", args.skip),
                "--ginkgo.no-color".into(),
                format!("--ginkgo.timeout={}s", e2e_timeout.as_secs()),
            ])
            // In the guest a spec takes minutes: say which one runs (each spec's steps as they go),
            // and where a spec still running after 10 minutes waits (ginkgo's progress report).
            .args(
                kproxy_testbed::kernel::in_guest()
                    .then_some(["--ginkgo.v", "--ginkgo.poll-progress-after=10m"])
                    .into_iter()
                    .flatten(),
            )
            .current_dir(&report)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .map_err(setup)
    });
    let e2e_secs = run_started.elapsed().as_secs_f64();
    // The proxy's logs belong in the report.
    copy_logs(&info, &report);
    if args.keep {
        print_access(&info);
        cluster.detach();
    } else {
        cluster.down().map_err(anyhow_err)?;
    }
    let status = status?;
    let summary = summarize(
        &report,
        &format!(
            "proxy {proxy}, mode {}, {nodes} node(s); focus `{}`, skip `{}`; cluster up {up_secs:.0} s, e2e.test {e2e_secs:.0} s, total {:.0} s; e2e.test exit {status}",
            args.mode,
            args.focus,
            args.skip,
            started.elapsed().as_secs_f64()
        ),
    )?;
    println!("{summary}");
    println!("report: {}", report.display());
    Ok(if status.success() { 0 } else { 1 })
}

/// What each node's kernel holds at the end of a run, for a failure to be understood afterwards:
/// in the guest the cluster is gone with the machine.
const NODE_KERNEL_DUMP: &str = "ip -o addr; ip route; nft list ruleset; iptables-save; \
    if [ -e /proc/net/ip_vs ]; then cat /proc/net/ip_vs; cat /proc/net/ip_vs_conn | head -200; fi; \
    conntrack -L 2>/dev/null | head -300";

fn copy_logs(info: &ClusterInfo, report: &Path) {
    let dir = report.join("logs");
    let _ = fs::create_dir_all(&dir);
    for node in &info.nodes {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &node.netns, "sh", "-c", NODE_KERNEL_DUMP])
            .output();
        let text = match out {
            Ok(out) => format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
            Err(e) => format!("could not read the node's kernel state: {e}"),
        };
        let _ = fs::write(dir.join(format!("{}-kernel.txt", node.name)), text);
    }
    if let Ok(entries) = fs::read_dir(&info.logs) {
        for entry in entries.flatten() {
            let _ = fs::copy(entry.path(), dir.join(entry.file_name()));
        }
    }
    if info.proxy != Proxy::None {
        let kubectl = Kubectl::from_info(info);
        let proxy = format!("{:?}", info.proxy).to_lowercase();
        let pods = kubectl
            .run(&[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                &format!("k8s-app={}", cluster::PROXY_APP),
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{\"\\n\"}{end}",
            ])
            .unwrap_or_default();
        for line in pods.lines() {
            let Some((pod, node)) = line.split_once(' ') else { continue };
            if let Ok(text) = kubectl.run(&["-n", "kube-system", "logs", pod, "--tail=-1"]) {
                let _ = fs::write(dir.join(format!("{node}-{proxy}-pod-{pod}.log")), text);
            }
        }
    }
}

/// Every e2e report of one IP family under `dir` (`<proxy>-<mode>-<family>-<N>n/junit*.xml`) side
/// by side: one row per focused spec, one column per run, and the reason of each failure or skip.
fn table(dir: &Path, families: IpFamilies) -> Result<String> {
    use std::collections::BTreeMap;
    let mut runs: Vec<(String, BTreeMap<String, Case>)> = Vec::new();
    // The runs of one family: `<proxy>-<mode>-<family>-<N>n`.
    let family = format!("-{}-", families.as_str());
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .map_err(setup)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().contains(&family)))
        .collect();
    // upstream before kproxy, nftables before iptables.
    entries.sort_by_key(|p| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        (!name.contains("nftables"), !name.starts_with("upstream"), name)
    });
    for run in entries {
        let mut cases = BTreeMap::new();
        for file in fs::read_dir(&run).map_err(setup)?.flatten() {
            let name = file.file_name().to_string_lossy().into_owned();
            if name.starts_with("junit") && name.ends_with(".xml") {
                for case in parse_junit(&fs::read_to_string(file.path()).map_err(setup)?) {
                    if case.name.contains("[sig-network]") && !not_focused(&case) {
                        cases.insert(case.name.trim_start_matches("[It] ").to_owned(), case);
                    }
                }
            }
        }
        if !cases.is_empty() {
            runs.push((run.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), cases));
        }
    }
    let names: std::collections::BTreeSet<&String> = runs.iter().flat_map(|(_, c)| c.keys()).collect();
    let mut md = format!(
        "| test | {} | reason (failure or skip) |\n|---|{}---|\n",
        runs.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(" | "),
        "---|".repeat(runs.len())
    );
    for name in names {
        let mut reasons = Vec::new();
        let cells: Vec<&str> = runs
            .iter()
            .map(|(run, cases)| match cases.get(name) {
                Some(case) => {
                    if !case.message.is_empty() && !reasons.iter().any(|(_, m): &(String, String)| *m == case.message) {
                        reasons.push((run.clone(), case.message.clone()));
                    }
                    case.result
                }
                None => "—",
            })
            .collect();
        let reason = reasons.iter().map(|(run, m)| format!("{run}: {m}")).collect::<Vec<_>>().join("; ");
        md.push_str(&format!(
            "| {} | {} | {} |\n",
            name.replace('|', "\\|"),
            cells.join(" | "),
            reason.replace('|', "\\|")
        ));
    }
    for (run, cases) in &runs {
        let count = |r: &str| cases.values().filter(|c| c.result == r).count();
        md.push_str(&format!(
            "\n{run}: {} passed, {} failed, {} skipped",
            count("passed"),
            count("failed"),
            count("skipped")
        ));
    }
    md.push('\n');
    Ok(md)
}

/// A spec the focus or skip left out: ginkgo's junit lists it as skipped with the bare message
/// `skipped` (a spec that skips itself at run time says why).
fn not_focused(case: &Case) -> bool {
    case.result == "skipped" && (case.message.is_empty() || case.message == "skipped")
}

/// One junit test case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    pub name: String,
    /// "passed", "failed" or "skipped".
    pub result: &'static str,
    pub message: String,
}

/// Reads the junit XML files of `report` and writes `summary.md` (a table of every focused spec
/// that ran, failed or was skipped, with the reason); returns the summary's first lines.
fn summarize(report: &Path, header: &str) -> Result<String> {
    let mut cases = Vec::new();
    for entry in fs::read_dir(report).map_err(setup)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("junit") && name.ends_with(".xml") {
            cases.extend(parse_junit(&fs::read_to_string(entry.path()).map_err(setup)?));
        }
    }
    // e2e's junit lists every spec of the binary; only the focused ones (sig-network) matter.
    cases.retain(|c| c.name.contains("[sig-network]") && !not_focused(c));
    cases.sort_by(|a, b| a.name.cmp(&b.name));
    let count = |r: &str| cases.iter().filter(|c| c.result == r).count();
    let line = format!("e2e: {} passed, {} failed, {} skipped", count("passed"), count("failed"), count("skipped"));
    let mut md = format!("# e2e summary\n\n{header}\n\n{line}\n\n| test | result | reason |\n|---|---|---|\n");
    for c in &cases {
        md.push_str(&format!(
            "| {} | {} | {} |\n",
            c.name.replace('|', "\\|"),
            c.result,
            c.message.replace('|', "\\|")
        ));
    }
    fs::write(report.join("summary.md"), &md).map_err(setup)?;
    Ok(format!("{header}\n{line}"))
}

/// The `<testcase>` elements of a junit report: name, result and the first line of the reason.
pub fn parse_junit(xml: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find("<testcase ") {
        rest = &rest[start..];
        let head_end = rest.find('>').unwrap_or(rest.len());
        let head = &rest[..head_end];
        let self_closing = head.ends_with('/');
        let body_end = if self_closing { head_end } else { rest.find("</testcase>").unwrap_or(rest.len()) };
        let body = &rest[head_end.min(body_end)..body_end];
        let name = unescape(&attribute(head, "name").unwrap_or_default());
        let (result, message) = if let Some(i) = body.find("<failure") {
            ("failed", reason(&body[i..]))
        } else if let Some(i) = body.find("<error") {
            ("failed", reason(&body[i..]))
        } else if let Some(i) = body.find("<skipped") {
            ("skipped", reason(&body[i..]))
        } else {
            ("passed", String::new())
        };
        cases.push(Case { name, result, message });
        rest = &rest[body_end.min(rest.len())..];
        if rest.starts_with("</testcase>") {
            rest = &rest["</testcase>".len()..];
        } else if self_closing {
            rest = &rest[1.min(rest.len())..];
        }
    }
    cases
}

fn attribute(head: &str, key: &str) -> Option<String> {
    let pat = format!(" {key}=\"");
    let start = head.find(&pat)? + pat.len();
    let end = head[start..].find('"')? + start;
    Some(head[start..end].to_owned())
}

/// The `message` attribute of a failure/skipped element, else (ginkgo leaves it empty for a
/// failure) the first two lines of its text; one line, bounded.
fn reason(element: &str) -> String {
    let head_end = element.find('>').unwrap_or(element.len());
    let attr = attribute(&element[..head_end], "message").unwrap_or_default();
    let text = if attr.trim().is_empty() {
        let body = &element[(head_end + 1).min(element.len())..];
        body.split('<').next().unwrap_or_default().to_owned()
    } else {
        attr
    };
    let text = unescape(&text);
    let line = text.lines().map(str::trim).filter(|l| !l.is_empty()).take(2).collect::<Vec<_>>().join(" ");
    line.chars().take(200).collect()
}

fn unescape(s: &str) -> String {
    s.replace("&#34;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&apos;", "'")
        .replace("&#xA;", "\n")
        .replace("&amp;", "&")
}

fn serve_dns(flags: &[String]) -> Result<i32> {
    let get = |k: &str| {
        flags
            .iter()
            .find_map(|f| f.strip_prefix(&format!("{k}=")).map(str::to_owned))
            .ok_or_else(|| Error::Usage(format!("cluster dns needs {k}")))
    };
    let bind = get("--bind")?
        .split(',')
        .map(|ip| ip.parse::<IpAddr>().map_err(|_| Error::Usage("--bind IP[,IP]".into())))
        .collect::<Result<Vec<_>>>()?;
    let options = dns::DnsOptions {
        bind,
        server: get("--server")?,
        ca: get("--ca")?.into(),
        cert: get("--cert")?.into(),
        key: get("--key")?.into(),
        domain: "cluster.local".into(),
    };
    dns::serve(options).map_err(anyhow_err)?;
    Ok(0)
}

/// Deployment `name` in `namespace`: `replicas` agnhost netexec pods on :8080, spread over the
/// nodes, ready by `/healthz`, rolled one surge pod at a time, each serving 5 s into its
/// termination (as a real server drains while its endpoint is terminating).
pub(crate) fn netexec_deployment(name: &str, namespace: &str, replicas: u32) -> serde_json::Value {
    serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
    "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {
            "terminationGracePeriodSeconds": 30,
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": name}}}],
            "containers": [{"name": "netexec", "image": AGNHOST, "args": ["netexec", "--http-port=8080"],
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1},
                "lifecycle": {"preStop": {"sleep": {"seconds": 5}}}}]}}}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn junit_cases_are_read_with_result_and_reason() {
        let xml = r#"<testsuite><testcase name="[sig-network] Services should a" classname="x" time="1"></testcase>
<testcase name="[sig-network] Services should b &amp; c" time="2"><failure message="boom&#xA;more" type="failed">text</failure></testcase>
<testcase name="[sig-network] Services should e" time="2"><failure message="" type="failed">[FAILED] Timed out.&#xA;expected pod ready&#xA;more</failure></testcase>
<testcase name="[sig-network] Services should d" time="0"><skipped message="skipped - requires at least two ready nodes"></skipped></testcase>
<testcase name="[sig-storage] x" time="0"/></testsuite>"#;
        let mut cases = parse_junit(xml);
        assert_eq!(cases.len(), 5);
        assert_eq!((cases[0].result, cases[0].name.as_str()), ("passed", "[sig-network] Services should a"));
        assert_eq!((cases[1].result, cases[1].message.as_str()), ("failed", "boom more"));
        let e = cases.remove(2);
        assert_eq!((e.result, e.message.as_str()), ("failed", "[FAILED] Timed out. expected pod ready"));
        assert_eq!(cases[1].name, "[sig-network] Services should b & c");
        assert_eq!(
            (cases[2].result, cases[2].message.as_str()),
            ("skipped", "skipped - requires at least two ready nodes")
        );
        assert_eq!(cases[3].result, "passed");
    }

    #[test]
    fn ipvs_is_a_mode_and_guest_a_flag_while_unknown_modes_are_refused() {
        let args = |list: &[&str]| parse(&list.iter().map(OsString::from).collect::<Vec<_>>());
        let ipvs = args(&["--mode", "ipvs", "--from=ipvs", "--guest"]).unwrap();
        assert_eq!((ipvs.mode.as_str(), ipvs.from.as_deref(), ipvs.guest), ("ipvs", Some("ipvs"), true));
        assert!(!args(&[]).unwrap().guest);
        for bad in [&["--mode", "userspace"][..], &["--from", "kernelspace"][..]] {
            assert!(matches!(args(bad), Err(Error::Usage(_))), "{bad:?} was accepted");
        }
    }

    #[test]
    fn single_stack_clusters_skip_the_dual_stack_specs_and_an_explicit_skip_wins() {
        let args = |list: &[&str]| parse(&list.iter().map(OsString::from).collect::<Vec<_>>()).unwrap();
        let dual = args(&["--ip-family", "dual", "--zones", "3", "--nodes", "6"]);
        assert_eq!((dual.families, dual.skip.as_str()), (IpFamilies::Dual, E2E_SKIP));
        assert_eq!((dual.zones, dual.nodes), (Some(3), Some(6)));
        for family in ["ipv4", "ipv6"] {
            let single = args(&["--ip-family", family]);
            assert!(single.skip.ends_with(E2E_SKIP_SINGLE_STACK) && single.skip.starts_with(E2E_SKIP), "{family}");
        }
        assert_eq!(args(&["--ip-family", "ipv6", "--skip", "X"]).skip, "X");
        assert!(parse(&[OsString::from("--ip-family"), OsString::from("ipv5")]).is_err());
    }
}

//! A whole cluster on this machine: the control plane in the wire namespace, N kubelet nodes
//! (see [`crate::node`]), cluster DNS, the test images in every node's containerd, and a Service
//! proxy on every node — kproxy as its DaemonSet, or upstream kube-proxy as kubeadm's.
//!
//! Everything made is recorded in the ledger (`<work>/ledger.json`) before it is made;
//! [`down`] undoes it from that file alone, so it works after a crash, and [`up`] runs it first
//! when a previous run left something behind.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::containerd;
use crate::ledger::{Ledger, Resource};
use crate::node::{self, Node};
use crate::ssh;
use crate::wire::{self, Family, IpFamilies};
use crate::{Binaries, Binary, ControlPlane, ControlPlaneOptions, ControllerManagerOptions, Identity};

/// Which Service proxy the nodes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proxy {
    /// kproxy, deployed by applying `deploy/kproxy.yaml` (image substituted).
    Kproxy,
    /// Upstream kube-proxy v1.36.2 as kubeadm's DaemonSet ([`upstream_daemonset`], its image
    /// built here), with the configuration kproxy's ConfigMap sets.
    Upstream,
    /// No proxy (for debugging the harness).
    None,
}

/// How to bring a cluster up.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The cluster's name: the prefix of its namespaces (`NAME-wire`, `NAME-node1`, …), cgroup
    /// roots and CNI networks, so that clusters of different names can run side by side.
    pub name: String,
    /// Where the ledger, logs and state live (one per name).
    pub work: PathBuf,
    pub nodes: u8,
    /// IPv4, IPv6 or dual-stack (IPv4 primary).
    pub families: IpFamilies,
    /// Label the nodes `topology.kubernetes.io/zone` = `zone-a`, `zone-b`, … round-robin (0: no
    /// zone labels).
    pub zones: u8,
    pub proxy: Proxy,
    /// `nftables` or `iptables`.
    pub mode: String,
    /// kproxy's OCI archive and the image name inside it.
    pub kproxy_image: Option<(PathBuf, String)>,
    /// Upstream kube-proxy's image (archive, name), for `--proxy upstream`.
    pub upstream_image: Option<(PathBuf, String)>,
    /// More image archives every node gets (e2e's distroless-iptables).
    pub test_images: Vec<PathBuf>,
    /// `deploy/kproxy.yaml`.
    pub manifest: PathBuf,
    /// The command that runs the DNS stand-in: program and leading arguments; the harness adds
    /// `--bind IP --server URL --ca F --cert F --key F`.
    pub dns_command: (PathBuf, Vec<String>),
    /// Where the test images are (`<KPROXY_K8S_DIR>/images`).
    pub images: PathBuf,
}

/// What `up` leaves for later commands (`e2e`, `smoke`, `down`): `<work>/cluster.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterInfo {
    pub server: String,
    pub admin_kubeconfig: PathBuf,
    pub kubectl: PathBuf,
    pub wire_netns: String,
    pub families: IpFamilies,
    pub nodes: Vec<NodeInfo>,
    pub proxy: Proxy,
    pub mode: String,
    /// The private key that logs in as root on every node (`KUBE_SSH_KEY_PATH`).
    pub ssh_key: PathBuf,
    pub logs: PathBuf,
    pub started_in_secs: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    /// Its addresses, primary first.
    pub ips: Vec<IpAddr>,
    pub netns: String,
    /// Its pod ranges, primary first.
    pub pod_cidrs: Vec<String>,
    pub zone: Option<String>,
}

impl NodeInfo {
    /// Its address of `family`, if it has one.
    pub fn ip(&self, family: Family) -> Option<IpAddr> {
        self.ips.iter().copied().find(|ip| Family::of(*ip) == family)
    }
}

/// The most nodes a cluster may have (each costs memory and CPU, docs/conformance.md).
pub const MAX_NODES: u8 = 16;

/// The zone of node `index` (1-based) among `zones` zones: `zone-a`, `zone-b`, … round-robin.
pub fn zone_of(index: u8, zones: u8) -> Option<String> {
    (zones > 0).then(|| format!("zone-{}", char::from(b'a' + (index - 1) % zones)))
}

/// The ledger of a work dir.
pub fn ledger_path(work: &Path) -> PathBuf {
    work.join("ledger.json")
}

pub fn info_path(work: &Path) -> PathBuf {
    work.join("cluster.json")
}

/// Undoes everything the ledger in `work` records (a no-op when there is none).
pub fn down(work: &Path) -> Result<()> {
    let ledger = Ledger::open(&ledger_path(work))?;
    if ledger.is_empty() {
        tracing::info!("no cluster recorded in {}", work.display());
        return Ok(());
    }
    let started = Instant::now();
    ledger.cleanup()?;
    let _ = fs::remove_file(info_path(work));
    tracing::info!(
        "cluster down in {:.1} s: every process, mount, cgroup, namespace and sysctl it recorded is gone",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A running cluster: its ledger and control plane. Dropping it does not stop it; call
/// [`Cluster::down`] (or `down(work)` from another process).
#[derive(Debug)]
pub struct Cluster {
    pub info: ClusterInfo,
    work: PathBuf,
    plane: Option<ControlPlane>,
}

impl Cluster {
    /// Stops and removes everything.
    pub fn down(mut self) -> Result<()> {
        if let Some(plane) = self.plane.take() {
            // Its processes are in the ledger; ours stops them with the rest.
            std::mem::forget(plane);
        }
        down(&self.work)
    }

    /// Stops the API server (etcd and everything else keep running), as a crash or an upgrade
    /// of the control plane would: the nodes' proxies lose their watches.
    pub fn stop_apiserver(&mut self) -> Result<()> {
        self.plane.as_mut().context("this cluster's control plane is not ours to restart")?.stop_apiserver();
        Ok(())
    }

    /// Starts the API server again on the same address, port and etcd, waits for `/readyz`, and
    /// records its new process in the ledger.
    pub fn start_apiserver(&mut self) -> Result<()> {
        let plane = self.plane.as_mut().context("this cluster's control plane is not ours to restart")?;
        plane.start_apiserver()?;
        let mut ledger = Ledger::open(&ledger_path(&self.work))?;
        record_plane(&mut ledger, plane)
    }

    /// Leaves it running for later commands.
    pub fn detach(mut self) {
        if let Some(plane) = self.plane.take() {
            std::mem::forget(plane);
        }
    }
}

/// Brings a cluster up (cleaning a previous run's leftovers first). On failure everything made
/// so far is removed again, unless `KPROXY_CLUSTER_KEEP=1`.
pub fn up(binaries: &Binaries, options: &ClusterOptions) -> Result<Cluster> {
    down(&options.work).context("cleaning up what a previous run left")?;
    let mut ledger = Ledger::open(&ledger_path(&options.work))?;
    match up_inner(binaries, options, &mut ledger) {
        Ok(cluster) => Ok(cluster),
        Err(error) => {
            if std::env::var("KPROXY_CLUSTER_KEEP").is_ok_and(|v| v == "1") {
                tracing::error!(
                    "KPROXY_CLUSTER_KEEP=1: left the failed cluster up; `cargo xtask cluster down` removes it"
                );
            } else {
                // The logs go with the cluster (in the guest, with the whole machine): their
                // last lines are what says why it failed.
                print_log_tails(&options.work.join("logs"));
                if let Err(cleanup) = down(&options.work) {
                    tracing::error!("cleanup after the failure also failed: {cleanup:#}");
                }
            }
            Err(error)
        }
    }
}

/// How often a long [`Kubectl::wait_for`] says that it still waits.
const STILL_WAITING_EVERY: Duration = Duration::from_secs(120);

/// The last lines of every log of a failed cluster (control plane, each node's components).
fn print_log_tails(logs: &Path) {
    const LINES: usize = 20;
    let Ok(entries) = fs::read_dir(logs) else { return };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        let Ok(text) = fs::read(&path) else { continue };
        let text = String::from_utf8_lossy(&text);
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(LINES)..].join("\n");
        tracing::error!("last lines of {}:\n{tail}", path.display());
    }
}

fn up_inner(binaries: &Binaries, options: &ClusterOptions, ledger: &mut Ledger) -> Result<Cluster> {
    let began = Instant::now();
    if options.nodes == 0 || options.nodes > MAX_NODES {
        bail!("--nodes must be 1 to {MAX_NODES}");
    }
    if options.zones > 26 || options.zones > options.nodes {
        bail!("--zones must be 0 to the number of nodes (and at most 26)");
    }
    let families = options.families;
    let valid = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if options.name.is_empty()
        || options.name.len() > 8
        || !options.name.chars().all(valid)
        || options.name.starts_with("kpt")
    {
        bail!("a cluster name is 1 to 8 of [a-z0-9], not starting with kpt (the testbed's prefix)");
    }
    let run_dir = options.work.join("run");
    let logs = options.work.join("logs");
    if logs.exists() {
        fs::remove_dir_all(&logs)?;
    }
    fs::create_dir_all(&logs)?;
    ledger.add(Resource::Dir { path: run_dir.clone() })?;
    fs::create_dir_all(&run_dir)?;

    wire::make_wire(ledger, &options.name, families)?;
    let wire_netns = wire::wire_netns(&options.name);
    let wire_path = wire::netns_path(&wire_netns);
    let mut plane = ControlPlane::start(
        binaries,
        ControlPlaneOptions {
            netns: Some(wire_path.clone()),
            bind: families.primary().wire_ip(),
            service_cidr: families.service_cidrs(),
            die_with_parent: false,
            work_parent: Some(run_dir.clone()),
            extra_apiserver_args: vec!["--kubelet-preferred-address-types=InternalIP,Hostname".into()],
            ..ControlPlaneOptions::default()
        },
    )?;
    ledger.add(Resource::Dir { path: plane.work_dir().to_path_buf() })?;
    record_plane(ledger, &plane)?;
    plane.start_controller_manager(ControllerManagerOptions {
        cluster_cidr: Some(families.cluster_cidrs()),
        // kube-controller-manager takes the per-family flags only for a dual-stack --cluster-cidr.
        extra_args: match families.families() {
            [single] => vec![format!("--node-cidr-mask-size={}", single.node_cidr_mask())],
            _ => vec![
                format!("--node-cidr-mask-size-ipv4={}", Family::V4.node_cidr_mask()),
                format!("--node-cidr-mask-size-ipv6={}", Family::V6.node_cidr_mask()),
            ],
        },
        ..ControllerManagerOptions::default()
    })?;
    record_plane(ledger, &plane)?;
    plane.start_scheduler(&[])?;
    record_plane(ledger, &plane)?;
    for name in ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"] {
        let _ = fs::remove_file(logs.join(format!("{name}.log")));
        let _ = std::os::unix::fs::symlink(plane.log_path(name), logs.join(format!("{name}.log")));
    }
    tracing::info!("control plane ready at {} ({:.1} s)", plane.url(), began.elapsed().as_secs_f64());

    let kubectl = Kubectl {
        kubectl: binaries.kubectl().to_path_buf(),
        kubeconfig: plane.admin_kubeconfig().to_path_buf(),
        netns: wire_path.clone(),
    };
    let nodes: Vec<Node> = (1..=options.nodes)
        .map(|i| Node::new(&options.name, i, families, zone_of(i, options.zones), &run_dir))
        .collect();
    kubectl.apply(&dns_service(&nodes, families))?;

    let image_cache = options.work.join("images");
    let mut archives = Vec::new();
    for name in ["pause-3.10.2.tar.xz", "busybox-1.37.0-1.tar.xz", "agnhost-2.63.0.tar.xz"] {
        archives.push(containerd::unpacked(&options.images.join(name), &image_cache)?);
    }
    let proxy_image = match options.proxy {
        Proxy::Kproxy => Some(options.kproxy_image.as_ref().context("--proxy kproxy needs kproxy's image archive")?),
        Proxy::Upstream => {
            Some(options.upstream_image.as_ref().context("--proxy upstream needs kube-proxy's image archive")?)
        }
        Proxy::None => None,
    };
    for archive in proxy_image.map(|(archive, _)| archive).into_iter().chain(&options.test_images) {
        if !archive.is_file() {
            bail!("{} is missing: run `cargo xtask image` first", archive.display());
        }
        archives.push(archive.clone());
    }
    let kubelet = binaries.path(Binary::Kubelet)?;
    let dns_creds = plane.credentials(&Identity::new("kproxy-cluster-dns", Some("system:masters")))?;
    // Every kubelet takes six or so inotify instances (cAdvisor, its config and pod watches), and
    // the machine's default allows 128 for all of root's processes together: the third six-node
    // cluster's kubelets died with "inotify_init: too many open files". kind asks for the same
    // raise; the machine's values come back when the last cluster goes down.
    ledger.raise_limit("fs.inotify.max_user_instances", 1024)?;
    ledger.raise_limit("fs.inotify.max_user_watches", 524_288)?;
    let ssh = ssh::SshKeys::generate(&run_dir.join("ssh"))?;
    ssh::ensure_privsep_dir()?;
    for node in &nodes {
        node.prepare(ledger)?;
        node.start_containerd(ledger, &logs)?;
    }
    // The imports are most of a node's start: every node's at once.
    std::thread::scope(|scope| -> Result<()> {
        let imports: Vec<_> = nodes
            .iter()
            .map(|node| {
                scope.spawn(|| -> Result<()> {
                    let containerd = node.containerd();
                    for archive in &archives {
                        containerd.import(archive).with_context(|| format!("{}: importing", node.name))?;
                    }
                    containerd.tag(
                        "registry.k8s.io/e2e-test-images/agnhost:2.63.0",
                        "registry.k8s.io/e2e-test-images/agnhost:2.55",
                    )
                })
            })
            .collect();
        for import in imports {
            import.join().map_err(|_| anyhow::anyhow!("an image import thread panicked"))??;
        }
        Ok(())
    })?;
    tracing::info!("images imported into {} node(s) ({:.1} s)", nodes.len(), began.elapsed().as_secs_f64());
    for (i, node) in nodes.iter().enumerate() {
        let (program, lead) = &options.dns_command;
        let mut args = lead.clone();
        args.extend([
            format!("--bind={}", node.ips.iter().map(IpAddr::to_string).collect::<Vec<_>>().join(",")),
            format!("--server={}", plane.url()),
            format!("--ca={}", plane.pki().ca_cert_file().display()),
            format!("--cert={}", dns_creds.cert_file.display()),
            format!("--key={}", dns_creds.key_file.display()),
        ]);
        node.spawn(ledger, "dns", program, &args, &logs)?;
        let kubeconfig = plane.kubeconfig(&Identity::node(&node.name))?;
        let kubelet_started = std::time::SystemTime::now();
        node.start_kubelet(ledger, &kubelet, &kubeconfig, &plane.pki().ca_cert_file(), &logs)?;
        if i + 1 < nodes.len()
            && !node::wait_for_device_plugin_socket(kubelet_started, crate::startup_patience(Duration::from_secs(60)))
        {
            tracing::warn!(
                "{}: the kubelet has not bound {} yet; starting the next",
                node.name,
                node::DEVICE_PLUGIN_SOCKET
            );
        }
        node.start_sshd(ledger, &ssh, &logs)?;
        tracing::info!(
            "{}: containerd, images, DNS, kubelet and sshd started ({:.1} s)",
            node.name,
            began.elapsed().as_secs_f64()
        );
    }
    let mut infos = Vec::new();
    // Nodes get their pod ranges and become Ready within seconds of starting (about a minute in
    // the guest); nodes still waiting after a minute (eight in the guest) show every log once,
    // while the wait goes on: its guard is long (40 min in the guest) and the guest's logs vanish
    // with it.
    let nodes_started = Instant::now();
    let logs_shown = std::cell::Cell::new(false);
    let show_logs_once_slow = || {
        if !logs_shown.get() && nodes_started.elapsed() > crate::startup_patience(Duration::from_secs(60)) {
            logs_shown.set(true);
            tracing::warn!("the nodes are slow to become Ready: every component's last log lines follow");
            print_log_tails(&logs);
        }
    };
    for node in &nodes {
        // One pod range of each family, primary first (kube-controller-manager allocates them all
        // at once).
        let pod_cidrs = kubectl.wait_for(node_ready_timeout(), &format!("{}'s podCIDRs", node.name), || {
            show_logs_once_slow();
            let out = kubectl.run(&["get", "node", &node.name, "-o", "jsonpath={.spec.podCIDRs[*]}"]).ok()?;
            let cidrs: Vec<String> = out.split_whitespace().map(str::to_owned).collect();
            (cidrs.len() == families.families().len()).then_some(cidrs)
        })?;
        node.write_cni(&pod_cidrs)?;
        for cidr in &pod_cidrs {
            wire::route_pod_cidr(&options.name, node.index, cidr)?;
        }
        wire::bridge_netfilter(&node.netns)?;
        infos.push(NodeInfo {
            name: node.name.clone(),
            ips: node.ips.clone(),
            netns: node.netns.clone(),
            pod_cidrs,
            zone: node.zone.clone(),
        });
    }
    for node in &nodes {
        kubectl.wait_for(node_ready_timeout(), &format!("{} Ready", node.name), || {
            show_logs_once_slow();
            let out = kubectl
                .run(&["get", "node", &node.name, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"])
                .ok()?;
            (out.trim() == "True").then_some(())
        })?;
    }
    // Every kubelet has written its global sysctls by now (at start, before Ready).
    let problems = ledger.restore_sysctls();
    if !problems.is_empty() {
        bail!("restoring global sysctls: {}", problems.join("; "));
    }
    tracing::info!("{} node(s) Ready ({:.1} s)", nodes.len(), began.elapsed().as_secs_f64());

    match options.proxy {
        Proxy::Kproxy => {
            let (_, image) = options.kproxy_image.as_ref().context("kproxy image")?;
            let manifest = fs::read_to_string(&options.manifest)
                .with_context(|| format!("reading {}", options.manifest.display()))?;
            let manifest = substitute_manifest(&manifest, image, &plane.url(), &options.mode, families)?;
            let applied = options.work.join("kproxy.applied.yaml");
            fs::write(&applied, &manifest)?;
            kubectl.run(&["apply", "-f", &applied.display().to_string()])?;
            wait_daemonset_ready(&kubectl, "kproxy", nodes.len())?;
        }
        Proxy::Upstream => {
            // kubeadm's kube-proxy DaemonSet, with the KubeProxyConfiguration kproxy's ConfigMap
            // gives kproxy and the same one flag.
            let (_, image) = options.upstream_image.as_ref().context("kube-proxy's image")?;
            let manifest = fs::read_to_string(&options.manifest)
                .with_context(|| format!("reading {}", options.manifest.display()))?;
            let upstream = upstream_daemonset(&manifest, image, &plane.url(), &options.mode, families)?;
            let applied = options.work.join("kube-proxy.applied.json");
            fs::write(&applied, &upstream)?;
            kubectl.run(&["apply", "-f", &applied.display().to_string()])?;
            wait_daemonset_ready(&kubectl, "kube-proxy", nodes.len())?;
            // It has no readiness probe (as kubeadm's has none): ready when it serves /healthz.
            for node in &nodes {
                wait_http_ok(&node.netns, "http://127.0.0.1:10256/healthz", proxy_ready_timeout())
                    .with_context(|| format!("kube-proxy on {}", node.name))?;
            }
        }
        Proxy::None => {}
    }
    let info = ClusterInfo {
        server: plane.url(),
        admin_kubeconfig: plane.admin_kubeconfig().to_path_buf(),
        kubectl: binaries.kubectl().to_path_buf(),
        wire_netns,
        families,
        nodes: infos,
        proxy: options.proxy,
        mode: options.mode.clone(),
        ssh_key: ssh.client_key.clone(),
        logs,
        started_in_secs: began.elapsed().as_secs_f64(),
    };
    fs::write(info_path(&options.work), serde_json::to_vec_pretty(&info)?)?;
    tracing::info!(
        "cluster up in {:.1} s: {} node(s), {}, proxy {:?} ({})",
        info.started_in_secs,
        nodes.len(),
        families.as_str(),
        options.proxy,
        options.mode
    );
    Ok(Cluster { info, work: options.work.clone(), plane: Some(plane) })
}

/// How long a node may take to get its pod CIDRs and be Ready, and a proxy to be ready on every
/// node: seconds on an idle machine, minutes with three six-node clusters starting at once on two
/// cores other work shares (load average 35 measured; 120 s were not enough there); longer in
/// the guest kernel ([`crate::startup_patience`]).
fn node_ready_timeout() -> Duration {
    crate::startup_patience(Duration::from_secs(300))
}

fn proxy_ready_timeout() -> Duration {
    crate::startup_patience(Duration::from_secs(300))
}

/// Waits until DaemonSet `kube-system/NAME` has a ready pod on each of the `nodes` nodes.
fn wait_daemonset_ready(kubectl: &Kubectl, name: &str, nodes: usize) -> Result<()> {
    kubectl.wait_for(proxy_ready_timeout(), &format!("the {name} DaemonSet ready on every node"), || {
        let out = kubectl
            .run(&[
                "-n",
                "kube-system",
                "get",
                "ds",
                name,
                "-o",
                "jsonpath={.status.numberReady}/{.status.desiredNumberScheduled}",
            ])
            .ok()?;
        (out.trim() == format!("{nodes}/{nodes}")).then_some(())
    })
}

fn record_plane(ledger: &mut Ledger, plane: &ControlPlane) -> Result<()> {
    for (name, pid) in plane.pids() {
        ledger.add_process(&format!("control-plane/{name}"), pid)?;
    }
    Ok(())
}

/// The cluster DNS Service (`kube-system/kube-dns`, the kubelets' `clusterDNS`) with a ClusterIP
/// of each family (dual-stack: `RequireDualStack`) and one EndpointSlice per family of every
/// node's DNS stand-in (no selector: no controller owns them).
fn dns_service(nodes: &[Node], families: IpFamilies) -> String {
    let dual = families.families().len() > 1;
    let mut spec = serde_json::json!({
        "clusterIP": families.primary().dns_service_ip().to_string(),
        "clusterIPs": families.families().iter().map(|f| f.dns_service_ip().to_string()).collect::<Vec<_>>(),
        "ipFamilies": families.families().iter().map(|f| f.api_name()).collect::<Vec<_>>(),
        "ipFamilyPolicy": if dual { "RequireDualStack" } else { "SingleStack" },
        "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}]});
    if let Some(spec) = spec.as_object_mut() {
        spec.retain(|_, v| !v.is_null());
    }
    let mut items = vec![serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
        "spec": spec})];
    for family in families.families() {
        let endpoints: Vec<serde_json::Value> = nodes
            .iter()
            .filter_map(|n| {
                let ip = n.ips.iter().find(|ip| Family::of(**ip) == *family)?;
                Some(serde_json::json!({"addresses": [ip.to_string()], "conditions": {"ready": true}, "nodeName": n.name}))
            })
            .collect();
        items.push(serde_json::json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("kube-dns-harness-{}", family.api_name().to_ascii_lowercase()),
                "namespace": "kube-system", "labels": {
                "kubernetes.io/service-name": "kube-dns",
                "endpointslice.kubernetes.io/managed-by": "kproxy-cluster-harness"}},
            "addressType": family.api_name(),
            "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}],
            "endpoints": endpoints}));
    }
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// The `KubeProxyConfiguration` fields an IPv6-primary cluster sets otherwise, as kubeadm
/// writes them when the API server advertises an IPv6 address (`bindAddress: "::"`; the healthz
/// and metrics servers then default to `[::]` and `[::1]`): each key and its new value. IPv4 and
/// dual-stack (IPv4 primary) clusters keep the manifest's.
fn family_settings(families: IpFamilies) -> &'static [(&'static str, &'static str)] {
    match families.primary() {
        Family::V4 => &[],
        Family::V6 => &[
            ("bindAddress", "\"::\""),
            ("healthzBindAddress", "\"[::]:10256\""),
            ("metricsBindAddress", "\"[::1]:10249\""),
        ],
    }
}

/// The `k8s-app` label of the DaemonSet and pods of `deploy/kproxy.yaml`.
pub const KPROXY_APP: &str = "kproxy";
/// The `k8s-app` label of every cluster's Service proxy pods here, kproxy's as kube-proxy's:
/// kubeadm's label for kube-proxy, which e2e selects the proxy's pods by (`Services should work
/// after restarting kube-proxy` deletes them and waits for them to come back).
pub const PROXY_APP: &str = "kube-proxy";

/// `deploy/kproxy.yaml` as the harness applies it: the image (imported into every node's
/// containerd; the manifest's `IfNotPresent` then never pulls), the API server address (a node
/// without a proxy cannot reach the `kubernetes` Service's ClusterIP, which is what every
/// cluster's kube-proxy kubeconfig avoids too), the mode, `conntrack.maxPerCore: 0` (as kind
/// does: `nf_conntrack_max` is machine-global, read-only in a node's network namespace, and not
/// the harness's to change), an IPv6-primary cluster's addresses ([`family_settings`]), and the
/// `k8s-app` label ([`PROXY_APP`]: kproxy replaces kube-proxy, and is labelled as kubeadm labels
/// the Service proxy). Each substitution must find its lines, or the manifest changed under the
/// harness.
pub fn substitute_manifest(
    manifest: &str,
    image: &str,
    server: &str,
    mode: &str,
    families: IpFamilies,
) -> Result<String> {
    substitute(manifest, image, server, mode, families, true)
}

/// [`substitute_manifest`] for kproxy beside a running kube-proxy DaemonSet (`cargo xtask
/// cluster migrate`): the manifest's own `k8s-app: kproxy` label stays, as an operator's apply
/// leaves it, so that the two DaemonSets' selectors do not overlap.
pub fn substitute_manifest_beside_kube_proxy(
    manifest: &str,
    image: &str,
    server: &str,
    mode: &str,
    families: IpFamilies,
) -> Result<String> {
    substitute(manifest, image, server, mode, families, false)
}

fn substitute(
    manifest: &str,
    image: &str,
    server: &str,
    mode: &str,
    families: IpFamilies,
    relabel: bool,
) -> Result<String> {
    let mut out = String::with_capacity(manifest.len());
    let (mut images, mut servers, mut modes, mut conntracks, mut labels) = (0, 0, 0, 0, 0);
    let family = family_settings(families);
    let mut family_found = vec![0; family.len()];
    for line in manifest.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let family_key =
            family.iter().position(|(key, _)| indent.len() == 4 && trimmed.starts_with(&format!("{key}:")));
        if let Some(i) = family_key {
            out.push_str(&format!("{indent}{}: {}\n", family[i].0, family[i].1));
            family_found[i] += 1;
        } else if trimmed.starts_with("maxPerCore:") {
            out.push_str(&format!("{indent}maxPerCore: 0\n"));
            conntracks += 1;
        } else if trimmed.starts_with("image:") {
            out.push_str(&format!("{indent}image: {image}\n"));
            images += 1;
        } else if trimmed.starts_with("server: https://") {
            out.push_str(&format!("{indent}server: {server}\n"));
            servers += 1;
        } else if trimmed.starts_with("mode: ") && indent.len() == 4 {
            out.push_str(&format!("{indent}mode: {mode}\n"));
            modes += 1;
        } else if trimmed == format!("k8s-app: {KPROXY_APP}") {
            let app = if relabel { PROXY_APP } else { KPROXY_APP };
            out.push_str(&format!("{indent}k8s-app: {app}\n"));
            labels += 1;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    // The image twice: the init container (`--init-only`) and the proxy.
    if (images, servers, modes, conntracks, labels) != (2, 1, 1, 1, 3) || family_found.iter().any(|n| *n != 1) {
        bail!(
            "deploy/kproxy.yaml: expected two image lines (init container and proxy), one kubeconfig server, mode and conntrack maxPerCore line and three `k8s-app: {KPROXY_APP}` labels, found {images}, {servers}, {modes}, {conntracks}, {labels}; and one of each of {:?}, found {family_found:?}",
            family.iter().map(|(key, _)| key).collect::<Vec<_>>()
        );
    }
    Ok(out)
}

/// Top-level fields of kproxy's ConfigMap that kube-proxy does not know (one-line scalars).
const KPROXY_ONLY_FIELDS: [&str; 6] = [
    "takeOverKubeProxy",
    "explainAccess",
    "snatToNodeIP",
    "serviceCounters",
    "watchKernelChanges",
    "noMasqueradeCIDRs",
];

/// The lines of ConfigMap key `key` (a `KEY: |-` block) in `manifest`, without their indent.
fn configmap_entry<'a>(manifest: &'a str, key: &str) -> Result<Vec<&'a str>> {
    let mut lines = manifest.lines();
    let key_indent = loop {
        let Some(line) = lines.next() else { bail!("deploy/kproxy.yaml has no `{key}: |-`") };
        if line.trim_start().starts_with(&format!("{key}: |")) {
            break line.len() - line.trim_start().len();
        }
    };
    Ok(lines
        .take_while(|line| line.trim().is_empty() || line.len() - line.trim_start().len() > key_indent)
        .map(|line| line.get(key_indent + 2..).unwrap_or(""))
        .collect())
}

/// The `config.conf` of kproxy's ConfigMap in `manifest`, for upstream kube-proxy: its
/// kubeconfig path, mode, `conntrack.maxPerCore` (0, as for kproxy) and an IPv6-primary
/// cluster's addresses replaced (each must be found once).
pub fn upstream_config(manifest: &str, kubeconfig: &Path, mode: &str, families: IpFamilies) -> Result<String> {
    let family = family_settings(families);
    let mut family_found = vec![0; family.len()];
    let mut out = String::new();
    let (mut kubeconfigs, mut modes, mut conntracks) = (0, 0, 0);
    for body in configmap_entry(manifest, "config.conf")? {
        if let Some(i) = family.iter().position(|(key, _)| body.starts_with(&format!("{key}:"))) {
            out.push_str(&format!("{}: {}\n", family[i].0, family[i].1));
            family_found[i] += 1;
        } else if body.trim_start().starts_with("kubeconfig:") {
            let pad = &body[..body.len() - body.trim_start().len()];
            out.push_str(&format!("{pad}kubeconfig: {}\n", kubeconfig.display()));
            kubeconfigs += 1;
        } else if body.trim_start().starts_with("maxPerCore:") {
            let pad = &body[..body.len() - body.trim_start().len()];
            out.push_str(&format!("{pad}maxPerCore: 0\n"));
            conntracks += 1;
        } else if body.starts_with("mode: ") {
            out.push_str(&format!("mode: {mode}\n"));
            modes += 1;
        } else if KPROXY_ONLY_FIELDS.iter().any(|f| body.starts_with(&format!("{f}:"))) {
            // kproxy's own fields: a cluster's kube-proxy ConfigMap has none of them.
        } else {
            out.push_str(body);
            out.push('\n');
        }
    }
    if (kubeconfigs, modes, conntracks) != (1, 1, 1) || family_found.iter().any(|n| *n != 1) {
        bail!(
            "config.conf in deploy/kproxy.yaml: expected one kubeconfig, mode and maxPerCore line, found {kubeconfigs}, {modes}, {conntracks}; and one of each of {:?}, found {family_found:?}",
            family.iter().map(|(key, _)| key).collect::<Vec<_>>()
        );
    }
    Ok(out)
}

/// Where kubeadm's kube-proxy DaemonSet mounts its ConfigMap.
const KUBE_PROXY_CONFIG_DIR: &str = "/var/lib/kube-proxy";

/// Upstream kube-proxy deployed as kubeadm deploys it (ServiceAccount `kube-proxy` bound to
/// `system:node-proxier`, ConfigMap `kube-proxy`, DaemonSet `kube-proxy` labelled
/// `k8s-app: kube-proxy`, hostNetwork, privileged, no probes; `--v=2`, so that its log says
/// when a sync reached the kernel: "SyncProxyRules complete"), with kproxy's `config.conf`
/// ([`upstream_config`]) and `kubeconfig.conf` (its `server:` the API server's address, as for
/// kproxy): both proxies get the same configuration.
pub fn upstream_daemonset(
    manifest: &str,
    image: &str,
    server: &str,
    mode: &str,
    families: IpFamilies,
) -> Result<String> {
    let config = upstream_config(manifest, &Path::new(KUBE_PROXY_CONFIG_DIR).join("kubeconfig.conf"), mode, families)?;
    let mut kubeconfig = String::new();
    let mut servers = 0;
    for line in configmap_entry(manifest, "kubeconfig.conf")? {
        let trimmed = line.trim_start();
        if trimmed.starts_with("server: https://") {
            kubeconfig.push_str(&format!("{}server: {server}\n", &line[..line.len() - trimmed.len()]));
            servers += 1;
        } else {
            kubeconfig.push_str(line);
            kubeconfig.push('\n');
        }
    }
    if servers != 1 {
        bail!("kubeconfig.conf in deploy/kproxy.yaml: expected one `server: https://` line, found {servers}");
    }
    let labels = serde_json::json!({"k8s-app": "kube-proxy"});
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kube-proxy", "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "kubeadm:node-proxier"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-proxier"},
         "subjects": [{"kind": "ServiceAccount", "name": "kube-proxy", "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": {"app": "kube-proxy"}},
         "data": {"config.conf": config, "kubeconfig.conf": kubeconfig}},
        {"apiVersion": "apps/v1", "kind": "DaemonSet",
         "metadata": {"name": "kube-proxy", "namespace": "kube-system", "labels": labels},
         "spec": {"selector": {"matchLabels": labels}, "updateStrategy": {"type": "RollingUpdate"},
          "template": {"metadata": {"labels": labels}, "spec": {
            "priorityClassName": "system-node-critical", "serviceAccountName": "kube-proxy", "hostNetwork": true,
            "nodeSelector": {"kubernetes.io/os": "linux"}, "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "kube-proxy", "image": image, "imagePullPolicy": "IfNotPresent",
              "command": ["/usr/local/bin/kube-proxy", format!("--config={KUBE_PROXY_CONFIG_DIR}/config.conf"),
                          "--hostname-override=$(NODE_NAME)", "--v=2"],
              "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
              "securityContext": {"privileged": true},
              "volumeMounts": [
                {"name": "kube-proxy", "mountPath": KUBE_PROXY_CONFIG_DIR},
                {"name": "xtables-lock", "mountPath": "/run/xtables.lock"},
                {"name": "lib-modules", "mountPath": "/lib/modules", "readOnly": true}]}],
            "volumes": [
                {"name": "kube-proxy", "configMap": {"name": "kube-proxy"}},
                {"name": "xtables-lock", "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"}},
                {"name": "lib-modules", "hostPath": {"path": "/lib/modules"}}]}}}}
    ]});
    Ok(serde_json::to_string_pretty(&list)?)
}

/// kubectl as admin, run in the wire namespace.
#[derive(Debug, Clone)]
pub struct Kubectl {
    pub kubectl: PathBuf,
    pub kubeconfig: PathBuf,
    pub netns: PathBuf,
}

impl Kubectl {
    pub fn from_info(info: &ClusterInfo) -> Kubectl {
        Kubectl {
            kubectl: info.kubectl.clone(),
            kubeconfig: info.admin_kubeconfig.clone(),
            netns: wire::netns_path(&info.wire_netns),
        }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.netns.display()))
            .arg("--")
            .arg(&self.kubectl)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args);
        cmd
    }

    /// Runs kubectl; its stdout, or an error with its stderr.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        node::run(&mut self.command(args))
    }

    /// `kubectl apply -f -` with `text`.
    pub fn apply(&self, text: &str) -> Result<String> {
        use std::io::Write;
        let mut child = self
            .command(&["apply", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(text.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("kubectl apply: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Polls `check` every 500 ms until it gives a value or `timeout` passes.
    pub fn wait_for<T>(&self, timeout: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> Result<T> {
        let began = Instant::now();
        let deadline = began + timeout;
        // A wait of many minutes (the guest's are eight times the host's) says that it is waiting.
        let mut next_note = began + STILL_WAITING_EVERY;
        loop {
            if let Some(value) = check() {
                return Ok(value);
            }
            let now = Instant::now();
            if now > deadline {
                bail!("timed out after {timeout:?} waiting for {what}");
            }
            if now > next_note {
                tracing::info!(
                    "still waiting for {what} ({:.0} s of {:.0} s)",
                    (now - began).as_secs_f64(),
                    timeout.as_secs_f64()
                );
                next_note = now + STILL_WAITING_EVERY;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

/// GETs `url` from inside `netns` with curl until it answers 200.
pub fn wait_http_ok(netns: &str, url: &str, timeout: Duration) -> Result<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", netns, "curl", "-sS", "--max-time", "3", "-f", url])
            .output()
            .context("running curl")?;
        if out.status.success() {
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        if Instant::now() > deadline {
            bail!("{url} in {netns}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_substitution_replaces_image_server_mode_and_conntrack_max_only() {
        let manifest = "data:\n  config.conf: |-\n    mode: nftables\n    conntrack:\n      maxPerCore: 32768\n  kubeconfig.conf: |-\n    clusters:\n      - cluster:\n          server: https://CONTROL-PLANE-ENDPOINT:6443\nmetadata:\n  labels:\n    k8s-app: kproxy\nspec:\n  selector:\n    matchLabels:\n      k8s-app: kproxy\n  template:\n    metadata:\n      labels:\n        k8s-app: kproxy\n  initContainers:\n    - name: init\n      image: ghcr.io/x:1\n  containers:\n    - name: kproxy\n      image: ghcr.io/x:1\n      imagePullPolicy: IfNotPresent\n";
        let out = substitute_manifest(
            manifest,
            "localhost/kproxy:dev",
            "https://198.18.0.1:6443",
            "iptables",
            IpFamilies::Dual,
        )
        .unwrap();
        assert_eq!(out.matches("      image: localhost/kproxy:dev\n").count(), 2, "{out}");
        assert!(out.contains("          server: https://198.18.0.1:6443\n"));
        assert!(out.contains("    mode: iptables\n"));
        assert!(out.contains("      maxPerCore: 0\n"));
        assert!(out.contains("imagePullPolicy: IfNotPresent"));
        assert_eq!(out.matches("k8s-app: kube-proxy\n").count(), 3, "{out}");
        assert!(!out.contains("k8s-app: kproxy"));
        assert!(substitute_manifest("nothing", "i", "s", "m", IpFamilies::Ipv4).is_err());
        assert!(
            substitute_manifest(manifest, "i", "s", "m", IpFamilies::Ipv6).is_err(),
            "an IPv6 cluster's bindAddress line is missing from this manifest"
        );
    }

    #[test]
    fn upstream_config_is_the_configmaps_with_its_kubeconfig_and_mode() {
        let manifest = "data:\n  config.conf: |-\n    kind: KubeProxyConfiguration\n    clientConnection:\n      kubeconfig: /var/lib/kproxy/kubeconfig.conf\n    mode: nftables\n    takeOverKubeProxy: true\n    conntrack:\n      maxPerCore: 32768\n  kubeconfig.conf: |-\n    x: y\n";
        let out = upstream_config(manifest, Path::new("/k/kp.kubeconfig"), "iptables", IpFamilies::Ipv4).unwrap();
        assert_eq!(
            out,
            "kind: KubeProxyConfiguration\nclientConnection:\n  kubeconfig: /k/kp.kubeconfig\nmode: iptables\nconntrack:\n  maxPerCore: 0\n"
        );
    }

    #[test]
    fn the_real_manifest_substitutes_for_every_family_and_ipv6_binds_ipv6() {
        let manifest = include_str!("../../../deploy/kproxy.yaml");
        for families in [IpFamilies::Ipv4, IpFamilies::Ipv6, IpFamilies::Dual] {
            let out = substitute_manifest(manifest, "i", "https://[fd00:18::1]:6443", "nftables", families).unwrap();
            let config = upstream_config(manifest, Path::new("/k"), "nftables", families).unwrap();
            let v6 = families == IpFamilies::Ipv6;
            assert_eq!(out.contains("    bindAddress: \"::\"\n"), v6, "{families:?}");
            assert_eq!(out.contains("    healthzBindAddress: \"[::]:10256\"\n"), v6, "{families:?}");
            assert_eq!(config.contains("metricsBindAddress: \"[::1]:10249\"\n"), v6, "{families:?}");
            assert_eq!(config.contains("bindAddress: 0.0.0.0\n"), !v6, "{families:?}");
        }
    }

    #[test]
    fn upstream_runs_as_kubeadms_daemonset_with_kproxys_configuration() {
        let manifest = include_str!("../../../deploy/kproxy.yaml");
        let text = upstream_daemonset(
            manifest,
            "localhost/kube-proxy:v1.36.2",
            "https://198.18.0.1:6443",
            "iptables",
            IpFamilies::Dual,
        )
        .unwrap();
        let list: serde_json::Value = serde_json::from_str(&text).unwrap();
        let items = list["items"].as_array().unwrap();
        let config_map = items.iter().find(|i| i["kind"] == "ConfigMap").unwrap();
        let config = config_map["data"]["config.conf"].as_str().unwrap();
        assert!(
            config.contains("mode: iptables\n")
                && config.contains("  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf\n")
        );
        let kubeconfig = config_map["data"]["kubeconfig.conf"].as_str().unwrap();
        assert!(kubeconfig.contains("      server: https://198.18.0.1:6443\n"), "{kubeconfig}");
        assert!(kubeconfig.contains("tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"));
        let ds = items.iter().find(|i| i["kind"] == "DaemonSet").unwrap();
        assert_eq!(ds["spec"]["template"]["metadata"]["labels"]["k8s-app"], PROXY_APP);
        let container = &ds["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], "localhost/kube-proxy:v1.36.2");
        assert_eq!(container["command"][2], "--hostname-override=$(NODE_NAME)");
        let binding = items.iter().find(|i| i["kind"] == "ClusterRoleBinding").unwrap();
        assert_eq!(binding["roleRef"]["name"], "system:node-proxier");
    }
}

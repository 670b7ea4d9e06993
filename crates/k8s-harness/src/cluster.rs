//! A whole cluster on this machine: the control plane in the wire namespace, N kubelet nodes
//! (see [`crate::node`]), cluster DNS, the test images in every node's containerd, and a Service
//! proxy on every node — kproxy as its DaemonSet, or upstream kube-proxy as a process.
//!
//! Everything made is recorded in the ledger (`<work>/ledger.json`) before it is made;
//! [`down`] undoes it from that file alone, so it works after a crash, and [`up`] runs it first
//! when a previous run left something behind.

use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::containerd;
use crate::ledger::{Ledger, Resource};
use crate::node::{self, Node};
use crate::wire;
use crate::{Binaries, Binary, ControlPlane, ControlPlaneOptions, ControllerManagerOptions, Identity};

/// Which Service proxy the nodes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proxy {
    /// kproxy, deployed by applying `deploy/kproxy.yaml` (image substituted).
    Kproxy,
    /// Upstream kube-proxy v1.36.2 as a process in each node's namespaces (no image of it exists
    /// offline), with the flags kproxy's ConfigMap sets.
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
    pub proxy: Proxy,
    /// `nftables` or `iptables`.
    pub mode: String,
    /// kproxy's OCI archive and the image name inside it.
    pub kproxy_image: Option<(PathBuf, String)>,
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
    pub nodes: Vec<NodeInfo>,
    pub proxy: Proxy,
    pub mode: String,
    pub logs: PathBuf,
    pub started_in_secs: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    pub ip: Ipv4Addr,
    pub netns: String,
    pub pod_cidr: String,
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
            } else if let Err(cleanup) = down(&options.work) {
                tracing::error!("cleanup after the failure also failed: {cleanup:#}");
            }
            Err(error)
        }
    }
}

fn up_inner(binaries: &Binaries, options: &ClusterOptions, ledger: &mut Ledger) -> Result<Cluster> {
    let began = Instant::now();
    if options.nodes == 0 || options.nodes > 9 {
        bail!("--nodes must be 1 to 9");
    }
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

    wire::make_wire(ledger, &options.name)?;
    let wire_netns = wire::wire_netns(&options.name);
    let wire_path = wire::netns_path(&wire_netns);
    let mut plane = ControlPlane::start(
        binaries,
        ControlPlaneOptions {
            netns: Some(wire_path.clone()),
            bind: IpAddr::V4(wire::WIRE_IP),
            service_cidr: wire::SERVICE_CIDR.into(),
            die_with_parent: false,
            work_parent: Some(run_dir.clone()),
            extra_apiserver_args: vec!["--kubelet-preferred-address-types=InternalIP,Hostname".into()],
            ..ControlPlaneOptions::default()
        },
    )?;
    ledger.add(Resource::Dir { path: plane.work_dir().to_path_buf() })?;
    record_plane(ledger, &plane)?;
    plane.start_controller_manager(ControllerManagerOptions {
        cluster_cidr: Some(wire::CLUSTER_CIDR.into()),
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
    let nodes: Vec<Node> = (1..=options.nodes).map(|i| Node::new(&options.name, i, &run_dir)).collect();
    kubectl.apply(&dns_service(&nodes))?;

    let image_cache = options.work.join("images");
    let mut archives = Vec::new();
    for name in ["pause-3.10.2.tar.xz", "busybox-1.37.0-1.tar.xz", "agnhost-2.63.0.tar.xz"] {
        archives.push(containerd::unpacked(&options.images.join(name), &image_cache)?);
    }
    if options.proxy == Proxy::Kproxy {
        let Some((archive, _)) = &options.kproxy_image else { bail!("--proxy kproxy needs kproxy's image archive") };
        if !archive.is_file() {
            bail!("{} is missing: run `cargo xtask image` first", archive.display());
        }
        archives.push(archive.clone());
    }
    let kubelet = binaries.path(Binary::Kubelet)?;
    let dns_creds = plane.credentials(&Identity::new("kproxy-cluster-dns", Some("system:masters")))?;
    for node in &nodes {
        node.prepare(ledger)?;
        node.start_containerd(ledger, &logs)?;
        let containerd = node.containerd();
        for archive in &archives {
            containerd.import(archive)?;
        }
        containerd
            .tag("registry.k8s.io/e2e-test-images/agnhost:2.63.0", "registry.k8s.io/e2e-test-images/agnhost:2.55")?;
        let (program, lead) = &options.dns_command;
        let mut args = lead.clone();
        args.extend([
            format!("--bind={}", node.ip),
            format!("--server={}", plane.url()),
            format!("--ca={}", plane.pki().ca_cert_file().display()),
            format!("--cert={}", dns_creds.cert_file.display()),
            format!("--key={}", dns_creds.key_file.display()),
        ]);
        node.spawn(ledger, "dns", program, &args, &logs)?;
        let kubeconfig = plane.kubeconfig(&Identity::node(&node.name))?;
        node.start_kubelet(ledger, &kubelet, &kubeconfig, &plane.pki().ca_cert_file(), &logs)?;
        tracing::info!(
            "{}: containerd, images, DNS and kubelet started ({:.1} s)",
            node.name,
            began.elapsed().as_secs_f64()
        );
    }
    let mut infos = Vec::new();
    for node in &nodes {
        let pod_cidr = kubectl.wait_for(Duration::from_secs(120), &format!("{}'s podCIDR", node.name), || {
            let out = kubectl.run(&["get", "node", &node.name, "-o", "jsonpath={.spec.podCIDR}"]).ok()?;
            let cidr = out.trim().to_owned();
            (!cidr.is_empty()).then_some(cidr)
        })?;
        node.write_cni(&pod_cidr)?;
        wire::route_pod_cidr(&options.name, node.index, &pod_cidr)?;
        wire::bridge_netfilter(&node.netns)?;
        infos.push(NodeInfo { name: node.name.clone(), ip: node.ip, netns: node.netns.clone(), pod_cidr });
    }
    for node in &nodes {
        kubectl.wait_for(Duration::from_secs(120), &format!("{} Ready", node.name), || {
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
            let manifest = substitute_manifest(&manifest, image, &plane.url(), &options.mode)?;
            let applied = options.work.join("kproxy.applied.yaml");
            fs::write(&applied, &manifest)?;
            kubectl.run(&["apply", "-f", &applied.display().to_string()])?;
            kubectl.wait_for(Duration::from_secs(180), "the kproxy DaemonSet ready on every node", || {
                let out = kubectl
                    .run(&[
                        "-n",
                        "kube-system",
                        "get",
                        "ds",
                        "kproxy",
                        "-o",
                        "jsonpath={.status.numberReady}/{.status.desiredNumberScheduled}",
                    ])
                    .ok()?;
                (out.trim() == format!("{0}/{0}", nodes.len())).then_some(())
            })?;
        }
        Proxy::Upstream => {
            // The same KubeProxyConfiguration the DaemonSet gives kproxy, and its one flag.
            let bin = binaries.path(Binary::KubeProxy)?;
            let kubeconfig = plane.kubeconfig(&Identity::kube_proxy())?;
            let manifest = fs::read_to_string(&options.manifest)
                .with_context(|| format!("reading {}", options.manifest.display()))?;
            let config = upstream_config(&manifest, &kubeconfig, &options.mode)?;
            let config_path = options.work.join("kube-proxy.config.yaml");
            fs::write(&config_path, config)?;
            for node in &nodes {
                let args =
                    vec![format!("--config={}", config_path.display()), format!("--hostname-override={}", node.name)];
                node.spawn(ledger, "kube-proxy", &bin, &args, &logs)?;
            }
            for node in &nodes {
                wait_http_ok(&node.netns, "http://127.0.0.1:10256/healthz", Duration::from_secs(60))
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
        nodes: infos,
        proxy: options.proxy,
        mode: options.mode.clone(),
        logs,
        started_in_secs: began.elapsed().as_secs_f64(),
    };
    fs::write(info_path(&options.work), serde_json::to_vec_pretty(&info)?)?;
    tracing::info!(
        "cluster up in {:.1} s: {} node(s), proxy {:?} ({})",
        info.started_in_secs,
        nodes.len(),
        options.proxy,
        options.mode
    );
    Ok(Cluster { info, work: options.work.clone(), plane: Some(plane) })
}

fn record_plane(ledger: &mut Ledger, plane: &ControlPlane) -> Result<()> {
    for (name, pid) in plane.pids() {
        ledger.add_process(&format!("control-plane/{name}"), pid)?;
    }
    Ok(())
}

/// The cluster DNS Service (`kube-system/kube-dns`, the kubelets' `clusterDNS`) with one
/// EndpointSlice of every node's DNS stand-in (no selector: no controller owns it).
fn dns_service(nodes: &[Node]) -> String {
    let endpoints: Vec<serde_json::Value> = nodes
        .iter()
        .map(
            |n| serde_json::json!({"addresses": [n.ip.to_string()], "conditions": {"ready": true}, "nodeName": n.name}),
        )
        .collect();
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
             "spec": {"clusterIP": wire::DNS_SERVICE_IP.to_string(), "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53}]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "kube-dns-harness", "namespace": "kube-system", "labels": {
                "kubernetes.io/service-name": "kube-dns",
                "endpointslice.kubernetes.io/managed-by": "kproxy-cluster-harness"}},
             "addressType": "IPv4",
             "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}],
             "endpoints": endpoints}
        ]
    });
    list.to_string()
}

/// `deploy/kproxy.yaml` as the harness applies it: the image (imported into every node's
/// containerd; the manifest's `IfNotPresent` then never pulls), the API server address (a node without a proxy cannot reach the `kubernetes`
/// Service's ClusterIP, which is what every cluster's kube-proxy kubeconfig avoids too), the
/// mode, and `conntrack.maxPerCore: 0` (as kind does: `nf_conntrack_max` is machine-global,
/// read-only in a node's network namespace, and not the harness's to change). Each substitution must find its line, or the manifest changed under the harness.
pub fn substitute_manifest(manifest: &str, image: &str, server: &str, mode: &str) -> Result<String> {
    let mut out = String::with_capacity(manifest.len());
    let (mut images, mut servers, mut modes, mut conntracks) = (0, 0, 0, 0);
    for line in manifest.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if trimmed.starts_with("maxPerCore:") {
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
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    // The image twice: the init container (`--init-only`) and the proxy.
    if (images, servers, modes, conntracks) != (2, 1, 1, 1) {
        bail!(
            "deploy/kproxy.yaml: expected two image lines and one kubeconfig server, mode and conntrack maxPerCore line, found {images}, {servers}, {modes}, {conntracks}"
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

/// The `config.conf` of kproxy's ConfigMap in `manifest`, for upstream kube-proxy: its
/// kubeconfig path, mode and `conntrack.maxPerCore` (0, as for kproxy) replaced (each must be
/// found once), and kproxy's own fields left out.
pub fn upstream_config(manifest: &str, kubeconfig: &Path, mode: &str) -> Result<String> {
    let mut lines = manifest.lines();
    let key_indent = loop {
        let Some(line) = lines.next() else { bail!("deploy/kproxy.yaml has no `config.conf: |-`") };
        if line.trim_start().starts_with("config.conf: |") {
            break line.len() - line.trim_start().len();
        }
    };
    let mut out = String::new();
    let (mut kubeconfigs, mut modes, mut conntracks) = (0, 0, 0);
    for line in lines {
        let indent = line.len() - line.trim_start().len();
        if !line.trim().is_empty() && indent <= key_indent {
            break;
        }
        let body = line.get(key_indent + 2..).unwrap_or("");
        if body.trim_start().starts_with("kubeconfig:") {
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
    if (kubeconfigs, modes, conntracks) != (1, 1, 1) {
        bail!(
            "config.conf in deploy/kproxy.yaml: expected one kubeconfig, mode and maxPerCore line, found {kubeconfigs}, {modes}, {conntracks}"
        );
    }
    Ok(out)
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
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(value) = check() {
                return Ok(value);
            }
            if Instant::now() > deadline {
                bail!("timed out after {timeout:?} waiting for {what}");
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
        let manifest = "data:\n  config.conf: |-\n    mode: nftables\n    conntrack:\n      maxPerCore: 32768\n  kubeconfig.conf: |-\n    clusters:\n      - cluster:\n          server: https://CONTROL-PLANE-ENDPOINT:6443\nspec:\n  initContainers:\n    - name: init\n      image: ghcr.io/x:1\n  containers:\n    - name: kproxy\n      image: ghcr.io/x:1\n      imagePullPolicy: IfNotPresent\n";
        let out = substitute_manifest(manifest, "localhost/kproxy:dev", "https://198.18.0.1:6443", "iptables").unwrap();
        assert_eq!(out.matches("      image: localhost/kproxy:dev\n").count(), 2, "{out}");
        assert!(out.contains("          server: https://198.18.0.1:6443\n"));
        assert!(out.contains("    mode: iptables\n"));
        assert!(out.contains("      maxPerCore: 0\n"));
        assert!(out.contains("imagePullPolicy: IfNotPresent"));
        assert!(substitute_manifest("nothing", "i", "s", "m").is_err());
    }

    #[test]
    fn upstream_config_is_the_configmaps_with_its_kubeconfig_and_mode() {
        let manifest = "data:\n  config.conf: |-\n    kind: KubeProxyConfiguration\n    clientConnection:\n      kubeconfig: /var/lib/kproxy/kubeconfig.conf\n    mode: nftables\n    takeOverKubeProxy: true\n    conntrack:\n      maxPerCore: 32768\n  kubeconfig.conf: |-\n    x: y\n";
        let out = upstream_config(manifest, Path::new("/k/kp.kubeconfig"), "iptables").unwrap();
        assert_eq!(
            out,
            "kind: KubeProxyConfiguration\nclientConnection:\n  kubeconfig: /k/kp.kubeconfig\nmode: iptables\nconntrack:\n  maxPerCore: 0\n"
        );
    }
}

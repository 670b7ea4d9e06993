//! A kubelet node: its own network namespace (wired to the others), its own UTS namespace (the
//! node's hostname, which hostNetwork pods see), its own containerd, its own cgroup root, pod log
//! dir and kubelet root dir, all inside the run's work dir. Every process is started detached
//! (its own process group, no parent tie), so `cluster up` can return, and is recorded in the
//! ledger first.

use std::fs;
use std::net::IpAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};

use crate::containerd::Containerd;
use crate::ledger::{Ledger, Resource};
use crate::wire::{self, IpFamilies};

/// The global sysctls kubelet v1.36 writes at start (`setupKernelTunables`, with the default
/// `protectKernelDefaults: false`; `true` would make it refuse to start on a machine that has
/// other values). Recorded before the first kubelet and put back after each start and at `down`.
pub const KUBELET_GLOBAL_SYSCTLS: [&str; 6] = [
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
];

/// One node's names, addresses and directories.
#[derive(Debug, Clone)]
pub struct Node {
    /// The cluster's name (prefix of its namespaces, cgroups and CNI networks).
    pub cluster: String,
    pub index: u8,
    pub name: String,
    pub netns: String,
    pub families: IpFamilies,
    /// The node's addresses on the wire, primary first.
    pub ips: Vec<IpAddr>,
    /// `topology.kubernetes.io/zone`, when the cluster has zones.
    pub zone: Option<String>,
    pub dir: PathBuf,
}

impl Node {
    pub fn new(cluster: &str, index: u8, families: IpFamilies, zone: Option<String>, run_dir: &Path) -> Node {
        let name = format!("kproxy-node{index}");
        Node {
            cluster: cluster.to_owned(),
            index,
            netns: wire::node_netns(cluster, index),
            families,
            ips: families.node_ips(index),
            zone,
            dir: run_dir.join(&name),
            name,
        }
    }
    /// The primary address (the kubelet's first `--node-ip`, what the API server dials).
    pub fn primary_ip(&self) -> IpAddr {
        self.ips[0]
    }
    pub fn netns_path(&self) -> PathBuf {
        wire::netns_path(&self.netns)
    }
    /// The bind mount pinning the node's UTS namespace (its hostname).
    pub fn uts_path(&self) -> PathBuf {
        self.dir.join("uts")
    }
    pub fn containerd(&self) -> Containerd {
        Containerd::new(self.dir.join("containerd"))
    }
    pub fn kubelet_dir(&self) -> PathBuf {
        self.dir.join("kubelet")
    }
    pub fn pod_logs_dir(&self) -> PathBuf {
        self.dir.join("pod-logs")
    }
    /// The kubelet's cgroupRoot (a folder of every hierarchy).
    pub fn cgroup_root(&self) -> String {
        format!("/{}", self.netns)
    }
    /// The CNI network name (also libcni's cache key).
    pub fn cni_network(&self) -> String {
        self.netns.clone()
    }
    pub fn log(&self, component: &str, logs: &Path) -> PathBuf {
        logs.join(format!("{}-{component}.log", self.name))
    }

    /// Namespaces, cgroup root and directories (recorded first).
    pub fn prepare(&self, ledger: &mut Ledger) -> Result<()> {
        fs::create_dir_all(&self.dir)?;
        wire::make_node_netns(ledger, &self.cluster, self.index, self.families)?;
        // The UTS namespace: hostNetwork pods inherit it through containerd's shims.
        let uts = self.uts_path();
        fs::write(&uts, b"")?;
        ledger.add(Resource::MountsUnder { dir: self.dir.clone() })?;
        run(Command::new("unshare").arg(format!("--uts={}", uts.display())).args(["hostname", &self.name]))?;
        ledger.add(Resource::CgroupRoot { name: self.cgroup_root() })?;
        crate::ledger::make_cgroup_root(&self.cgroup_root())?;
        ledger.add(Resource::ContainerLogLinks { pods_log_dir: self.pod_logs_dir() })?;
        ledger.add(Resource::CniCache { network: self.cni_network() })?;
        fs::create_dir_all(self.pod_logs_dir())?;
        Ok(())
    }

    /// Starts containerd in the node's namespaces and waits for its socket.
    pub fn start_containerd(&self, ledger: &mut Ledger, logs: &Path) -> Result<()> {
        let containerd = self.containerd();
        containerd.write_config()?;
        ledger.add(Resource::Containerd {
            address: containerd.socket(),
            state: containerd.state(),
            node_netns: self.netns.clone(),
        })?;
        let config = containerd.config();
        self.spawn(
            ledger,
            "containerd",
            Path::new("containerd"),
            &["--config".into(), config.display().to_string()],
            logs,
        )?;
        // Seconds when idle; minutes when several clusters start at once on a busy machine.
        containerd.wait_ready(crate::startup_patience(std::time::Duration::from_secs(180)))
    }

    /// Writes the CNI conflist for the node's pod CIDRs (one per family): a bridge with hairpin (a
    /// pod reaching itself through its Service), no ipMasq (cross-node pod traffic keeps its
    /// source), host-local with one range set per family and a default route of each, the node's
    /// own IPAM dir, portmap for hostPort.
    pub fn write_cni(&self, pod_cidrs: &[String]) -> Result<()> {
        let ranges: Vec<serde_json::Value> =
            pod_cidrs.iter().map(|cidr| serde_json::json!([{ "subnet": cidr }])).collect();
        let routes: Vec<serde_json::Value> = pod_cidrs
            .iter()
            .map(|cidr| serde_json::json!({ "dst": if cidr.contains(':') { "::/0" } else { "0.0.0.0/0" } }))
            .collect();
        let conflist = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": self.cni_network(),
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": ranges,
                        "routes": routes,
                        "dataDir": self.dir.join("cni-ipam").display().to_string(),
                    }
                },
                { "type": "portmap", "capabilities": { "portMappings": true } }
            ]
        });
        let dir = self.containerd().cni_conf_dir();
        fs::create_dir_all(&dir)?;
        let tmp = dir.join(".10-kproxy.conflist.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(&conflist)?)?;
        fs::rename(&tmp, dir.join("10-kproxy.conflist"))?;
        Ok(())
    }

    /// Writes the kubelet's configuration and starts it.
    pub fn start_kubelet(
        &self,
        ledger: &mut Ledger,
        kubelet: &Path,
        kubeconfig: &Path,
        client_ca: &Path,
        logs: &Path,
    ) -> Result<()> {
        let dir = self.kubelet_dir();
        fs::create_dir_all(&dir)?;
        for key in KUBELET_GLOBAL_SYSCTLS {
            ledger.add_sysctl(key)?;
        }
        // Pods resolve through the cluster DNS stand-in (which forwards nothing: no internet).
        let resolv = dir.join("resolv.conf");
        let nameservers: String = self.ips.iter().map(|ip| format!("nameserver {ip}\n")).collect();
        fs::write(&resolv, nameservers)?;
        let socket = format!("unix://{}", self.containerd().socket().display());
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {cgroup_root}
cgroupsPerQOS: true
address: "{ip}"
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
clusterDomain: cluster.local
clusterDNS:
  - "{dns}"
resolvConf: {resolv}
containerRuntimeEndpoint: {socket}
imageServiceEndpoint: {socket}
podLogsDir: {pod_logs}
volumePluginDir: {plugins}
failSwapOn: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
rotateCertificates: false
serverTLSBootstrap: false
"#,
            cgroup_root = self.cgroup_root(),
            ip = self.primary_ip(),
            ca = client_ca.display(),
            // The primary family's, as kind configures dual-stack clusters; the Service has both.
            dns = self.families.primary().dns_service_ip(),
            resolv = resolv.display(),
            pod_logs = self.pod_logs_dir().display(),
            plugins = dir.join("volume-plugins").display(),
        );
        let config_path = dir.join("config.yaml");
        fs::write(&config_path, config)?;
        let mut args: Vec<String> = vec![
            format!("--config={}", config_path.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", dir.join("root").display()),
            format!("--cert-dir={}", dir.join("pki").display()),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.ips.iter().map(IpAddr::to_string).collect::<Vec<_>>().join(",")),
            "--v=2".into(),
        ];
        if let Some(zone) = &self.zone {
            // As a cloud provider labels its nodes (the kubelet may set this label on itself).
            args.push(format!("--node-labels=topology.kubernetes.io/zone={zone}"));
        }
        self.spawn(ledger, "kubelet", kubelet, &args, logs)?;
        Ok(())
    }

    /// Starts sshd in the node's namespaces on the node's addresses (see [`crate::ssh`]).
    pub fn start_sshd(&self, ledger: &mut Ledger, keys: &crate::ssh::SshKeys, logs: &Path) -> Result<()> {
        let config = self.dir.join("sshd_config");
        fs::write(&config, keys.sshd_config(&self.ips))?;
        // -D: stay in the foreground (supervised like every other process); -e: log to stderr.
        let args = vec!["-D".to_owned(), "-e".into(), "-f".into(), config.display().to_string()];
        self.spawn(ledger, "sshd", Path::new(crate::ssh::SSHD), &args, logs)?;
        Ok(())
    }

    /// Starts `program args` in the node's network and UTS namespaces, detached, its output in
    /// `logs/<node>-<name>.log`; recorded in the ledger before this returns.
    pub fn spawn(&self, ledger: &mut Ledger, name: &str, program: &Path, args: &[String], logs: &Path) -> Result<u32> {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.netns_path().display()))
            .arg(format!("--uts={}", self.uts_path().display()))
            .arg("--")
            .arg(program)
            .args(args);
        spawn_detached(ledger, &format!("{}/{name}", self.name), cmd, &self.log(name, logs))
    }
}

/// Spawns `cmd` in its own process group with stdin closed and its output appended to `log`,
/// and records it in the ledger.
pub fn spawn_detached(ledger: &mut Ledger, name: &str, mut cmd: Command, log: &Path) -> Result<u32> {
    if let Some(dir) = log.parent() {
        fs::create_dir_all(dir)?;
    }
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let err = out.try_clone()?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
    let child = cmd.spawn().with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
    let pid = child.id();
    // Not waited for here: `down` (or the ledger's cleanup) stops it; `up` returns while it runs.
    drop(child);
    ledger.add_process(name, pid)?;
    tracing::debug!(name, pid, log = %log.display(), "started");
    Ok(pid)
}

pub(crate) fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} {:?} failed ({}): {}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Where every kubelet binds its device-plugin registration socket: the kubelet's constant, not
/// under `--root-dir`, so the nodes of one machine share it.
pub const DEVICE_PLUGIN_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";

/// Waits (at most `patience`) until a kubelet started at `started` has bound
/// [`DEVICE_PLUGIN_SOCKET`]; whether it did. Two kubelets starting together race for it: each
/// empties the directory, then binds, and the loser fails with "address already in use" and exits
/// ("Failed to start ContainerManager"; its node never gets a pod range). Seen under TCG in the
/// guest, where the window is wide; so kubelets start one after another past this point.
pub fn wait_for_device_plugin_socket(started: SystemTime, patience: Duration) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let deadline = Instant::now() + patience;
    loop {
        let bound = fs::symlink_metadata(DEVICE_PLUGIN_SOCKET)
            .is_ok_and(|m| m.file_type().is_socket() && m.modified().is_ok_and(|t| t >= started));
        if bound || Instant::now() >= deadline {
            return bound;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

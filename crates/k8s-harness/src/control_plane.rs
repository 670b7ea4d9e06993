//! etcd + kube-apiserver (and, on demand, kube-controller-manager and kube-scheduler) for one
//! test, each a supervised process with its log in the run's work directory.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::binaries::{Binaries, Binary};
use crate::net;
use crate::pki::{ClientCredentials, Identity, Pki, ServingNames};
use crate::process::{Launch, Process};
use crate::{Error, Result};

/// Set to `1` to keep a run's work directory (PKI, kubeconfigs, logs, etcd data); its path is printed.
pub const KEEP_ENV: &str = "KPROXY_K8S_KEEP";

/// Which etcd the API server stores in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Etcd {
    /// etcd 3.6.13 from `KPROXY_K8S_DIR`: serves streaming lists.
    #[default]
    V3_6,
    /// etcd 3.5.1 from PyPI: kube-apiserver v1.36.2 disables `RequestWatchProgress` on it and
    /// answers a streaming list with an `ERROR` event inside the watch.
    V3_5_1,
}

/// How to start a [`ControlPlane`]. `Default` is etcd 3.6, WatchList on, no fsync, 127.0.0.1.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// Which etcd.
    pub etcd: Etcd,
    /// The API server's `WatchList` feature gate (beta, default on in v1.36.2, which still
    /// accepts `--feature-gates=WatchList=false`). Off, the server refuses streaming lists.
    pub watch_list: bool,
    /// etcd `--unsafe-no-fsync`: much faster writes, no durability (fine for a test's cluster).
    pub unsafe_no_fsync: bool,
    /// Run every process inside this network namespace (`nsenter --net=PATH`; e.g. `/run/netns/NAME`).
    /// The harness's own requests (readiness, [`ControlPlane::get`], [`ControlPlane::kubectl`])
    /// are made from inside it too.
    pub netns: Option<PathBuf>,
    /// The API server's bind and advertise address (default 127.0.0.1). etcd always listens on
    /// 127.0.0.1 (of the namespace). A loopback address cannot be the `kubernetes` Service's
    /// endpoint, so then the Service has none (`--endpoint-reconciler-type=none`); bind a
    /// namespace's own address for one that pods can reach.
    pub bind: IpAddr,
    /// `--service-cluster-ip-range` (default 198.19.0.0/16, inside the test range 198.18.0.0/15);
    /// a dual-stack pair is two ranges joined by a comma, primary first.
    pub service_cidr: String,
    /// `--service-node-port-range` (inclusive).
    pub node_port_range: (u16, u16),
    /// The cluster domain in the serving certificate's names.
    pub cluster_domain: String,
    /// More kube-apiserver flags, appended last (a repeated flag's last value wins).
    pub extra_apiserver_args: Vec<String>,
    /// Kill the processes when the thread that started them exits (`setpriv --pdeathsig`), so a
    /// test killed outright leaves nothing running. Start and drop the control plane on one
    /// long-lived thread (a test's own thread is); turn off for one that must outlive its thread.
    pub die_with_parent: bool,
    /// How long each component may take to become ready (default 90 s, longer in the guest:
    /// [`crate::startup_patience`]).
    pub ready_timeout: Duration,
    /// Where the work directory is made (default: the system's temporary directory). A harness
    /// whose plane outlives its process (`cargo xtask cluster up`) keeps it out of /tmp, where a
    /// sweep of stale `kproxy-k8s-*` directories would take it from under a running cluster.
    pub work_parent: Option<PathBuf>,
    /// An etcd data directory saved earlier by [`ControlPlane::save_etcd`]: copied into the work
    /// directory and started instead of an empty etcd, so a cluster that took an hour to write
    /// through the API server is written once (the benchmark's 100k Services). Its etcd version
    /// must be [`ControlPlaneOptions::etcd`]'s.
    pub etcd_seed: Option<PathBuf>,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        ControlPlaneOptions {
            etcd: Etcd::V3_6,
            watch_list: true,
            unsafe_no_fsync: true,
            netns: None,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            service_cidr: "198.19.0.0/16".into(),
            node_port_range: (30000, 32767),
            cluster_domain: "cluster.local".into(),
            extra_apiserver_args: Vec::new(),
            die_with_parent: true,
            ready_timeout: crate::startup_patience(Duration::from_secs(90)),
            work_parent: None,
            etcd_seed: None,
        }
    }
}

/// kube-controller-manager's settings.
#[derive(Debug, Clone, Default)]
pub struct ControllerManagerOptions {
    /// `--cluster-cidr` and `--allocate-node-cidrs=true` (node IPAM), when set.
    pub cluster_cidr: Option<String>,
    /// `--controllers` (default: upstream's default set, `*`).
    pub controllers: Option<Vec<String>>,
    /// More flags, appended last.
    pub extra_args: Vec<String>,
}

/// A body and status from [`ControlPlane::get`].
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// The HTTP status.
    pub status: u16,
    /// The whole body, as text.
    pub body: String,
}

/// A running etcd + kube-apiserver; everything is stopped (process groups killed) and the work
/// directory removed on drop, also during a panic's unwind.
#[derive(Debug)]
pub struct ControlPlane {
    binaries: Binaries,
    options: ControlPlaneOptions,
    work: Option<tempfile::TempDir>,
    work_path: PathBuf,
    pki: Pki,
    launch: Launch,
    etcd_port: u16,
    etcd_peer_port: u16,
    port: u16,
    admin_kubeconfig: PathBuf,
    // Stopped in reverse order of start by Drop.
    etcd: Option<Process>,
    apiserver: Option<Process>,
    controller_manager: Option<Process>,
    scheduler: Option<Process>,
    started_in: Duration,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver and waits for `/readyz`. Ports are picked free just
    /// before; if another process took one meanwhile, the start is tried again on new ports.
    pub fn start(binaries: &Binaries, options: ControlPlaneOptions) -> Result<ControlPlane> {
        let began = Instant::now();
        let mut attempt = 1;
        loop {
            match ControlPlane::try_start(binaries, options.clone()) {
                Err(Error::Start { log_tail, .. }) if attempt < 3 && log_tail.contains("address already in use") => {
                    tracing::warn!(attempt, "a port was taken before the control plane bound it; trying new ports");
                    attempt += 1;
                }
                Err(error) => return Err(error),
                Ok(mut plane) => {
                    plane.started_in = began.elapsed();
                    tracing::info!(url = %plane.url(), etcd = ?plane.options.etcd, took = ?plane.started_in, "control plane ready");
                    return Ok(plane);
                }
            }
        }
    }

    fn try_start(binaries: &Binaries, options: ControlPlaneOptions) -> Result<ControlPlane> {
        // One range, or a dual-stack pair (primary first): the serving certificate names the
        // first address of each (the `kubernetes` Service's ClusterIP is the primary's).
        let mut first_service_ips = Vec::new();
        for cidr in options.service_cidr.split(',') {
            let range: ipnet::IpNet =
                cidr.trim().parse().map_err(|e| Error::Refused(format!("service_cidr {cidr:?}: {e}")))?;
            first_service_ips.push(range.hosts().next().unwrap_or(range.network()));
        }
        let (low, high) = options.node_port_range;
        if low == 0 || low > high {
            return Err(Error::Refused(format!("node_port_range {low}-{high}: not a range of ports")));
        }
        let mut builder = tempfile::Builder::new();
        builder.prefix("kproxy-k8s-");
        let work = match &options.work_parent {
            Some(parent) => builder.tempdir_in(parent),
            None => builder.tempdir(),
        }
        .map_err(|e| Error::io("creating the work directory", e))?;
        let work_path = work.path().to_path_buf();
        let pki = Pki::generate(
            &work_path.join("pki"),
            &ServingNames {
                ips: std::iter::once(options.bind).chain(first_service_ips).collect(),
                cluster_domain: options.cluster_domain.clone(),
            },
        )?;
        let netns = options.netns.clone();
        let ports = net::free_ports(netns.as_deref(), IpAddr::V4(Ipv4Addr::LOCALHOST), 2)?;
        let port = net::free_ports(netns.as_deref(), options.bind, 1)?[0];
        let mut plane = ControlPlane {
            binaries: binaries.clone(),
            launch: Launch { netns, die_with_parent: options.die_with_parent },
            options,
            work: Some(work),
            admin_kubeconfig: work_path.join("admin.kubeconfig"),
            work_path,
            pki,
            etcd_port: ports[0],
            etcd_peer_port: ports[1],
            port,
            etcd: None,
            apiserver: None,
            controller_manager: None,
            scheduler: None,
            started_in: Duration::ZERO,
        };
        // The API server's client certificate towards kubelets (logs, exec, port-forward).
        plane.pki.client(&kubelet_client())?;
        if let Some(seed) = &plane.options.etcd_seed {
            copy_dir(seed, &plane.work_path.join("etcd"))
                .map_err(|e| Error::io(format!("copying the etcd seed {}", seed.display()), e))?;
        }
        plane.start_etcd()?;
        plane.pki.write_kubeconfig(&Identity::admin(), &plane.url(), &plane.admin_kubeconfig)?;
        plane.start_apiserver()?;
        Ok(plane)
    }

    /// `https://BIND:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", SocketAddr::new(self.options.bind, self.port))
    }

    /// The API server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// etcd's client URL (`http://127.0.0.1:PORT`, inside the namespace when there is one).
    pub fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.etcd_port)
    }

    /// The options it was started with.
    pub fn options(&self) -> &ControlPlaneOptions {
        &self.options
    }

    /// How long [`ControlPlane::start`] took (etcd and the API server ready).
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The run's work directory (PKI, kubeconfigs, `logs/`, etcd data).
    pub fn work_dir(&self) -> &Path {
        &self.work_path
    }

    /// Where each component logs: `<work>/logs/<component>.log`.
    pub fn log_path(&self, component: &str) -> PathBuf {
        self.work_path.join("logs").join(format!("{component}.log"))
    }

    /// The cluster CA, PEM.
    pub fn ca_pem(&self) -> &str {
        self.pki.ca_pem()
    }

    /// The PKI (CA, serving and service-account key files), e.g. for a kubelet's flags.
    pub fn pki(&self) -> &Pki {
        &self.pki
    }

    /// The located binaries this plane runs.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// A kubeconfig for `identity` (a fresh client certificate), `<work>/kubeconfigs/<stem>.kubeconfig`.
    pub fn kubeconfig(&self, identity: &Identity) -> Result<PathBuf> {
        let dir = self.work_path.join("kubeconfigs");
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let path = dir.join(format!("{}.kubeconfig", identity.file_stem()));
        self.pki.write_kubeconfig(identity, &self.url(), &path)?;
        Ok(path)
    }

    /// The admin's kubeconfig (`system:masters`).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A fresh client certificate and key for `identity`.
    pub fn credentials(&self, identity: &Identity) -> Result<ClientCredentials> {
        self.pki.client(identity)
    }

    /// `GET path` as `identity` (anonymous when `None`), from inside the namespace. Any status
    /// is returned; only a transport failure is an error.
    pub fn get(&self, identity: Option<&Identity>, path: &str) -> Result<HttpResponse> {
        let creds = identity.map(|identity| self.credentials(identity)).transpose()?;
        let url = format!("{}{path}", self.url());
        let agent = agent(self.ca_pem(), creds.as_ref(), Duration::from_secs(30))?;
        net::run_in(self.options.netns.as_deref(), move || http_get(&agent, &url))?
    }

    /// Runs kubectl (as admin, inside the namespace, each request bounded to 60 s) with `args`;
    /// its stdout, or an error with its stderr.
    pub fn kubectl<S: AsRef<str>>(&self, args: &[S]) -> Result<String> {
        self.kubectl_with_stdin(args, None)
    }

    /// [`ControlPlane::kubectl`] with `stdin` fed to it (e.g. `apply -f -`).
    pub fn kubectl_with_stdin<S: AsRef<str>>(&self, args: &[S], stdin: Option<&str>) -> Result<String> {
        use std::io::Write;
        let mut argv: Vec<String> = Vec::new();
        if let Some(netns) = &self.options.netns {
            argv.extend(["nsenter".into(), format!("--net={}", netns.display()), "--".into()]);
        }
        argv.push(self.binaries.kubectl().display().to_string());
        argv.push(format!("--kubeconfig={}", self.admin_kubeconfig.display()));
        // A hung server fails the call instead of the test run; a later flag overrides it.
        argv.push("--request-timeout=60s".into());
        argv.extend(args.iter().map(|a| a.as_ref().to_owned()));
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| Error::io(format!("running {}", argv.join(" ")), e))?;
        if let Some(mut pipe) = child.stdin.take()
            && let Some(text) = stdin
        {
            pipe.write_all(text.as_bytes()).map_err(|e| Error::io("writing kubectl's stdin", e))?;
        }
        let output = child.wait_with_output().map_err(|e| Error::io("waiting for kubectl", e))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(Error::Command {
                command: argv[1..].join(" "),
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            })
        }
    }

    /// Stops the API server (etcd keeps running): SIGTERM, then SIGKILL after 3 s. With a
    /// client's watches open, v1.36.2 stops listening at once but does not exit on its own
    /// (measured: still serving them 10 s later), so a longer grace would only slow tests.
    pub fn stop_apiserver(&mut self) {
        if let Some(mut apiserver) = self.apiserver.take() {
            apiserver.stop(Duration::from_secs(3));
        }
    }

    /// Starts the API server on the same port and etcd (a no-op while it runs) and waits for `/readyz`.
    /// `/readyz` can pass before RBAC's caches are filled: for a few tens of milliseconds after,
    /// users that RBAC grants (e.g. `system:kube-proxy`) may get 403 (measured after a restart;
    /// `system:masters` is not affected). Real clients meet this too, so the harness leaves it.
    pub fn start_apiserver(&mut self) -> Result<()> {
        if self.apiserver.is_some() {
            return Ok(());
        }
        let args = self.apiserver_args();
        let bin = self.binaries.path(Binary::KubeApiserver)?;
        let mut process = self.spawn("kube-apiserver", &bin, &args)?;
        let url = format!("{}/readyz", self.url());
        let agent = agent(self.ca_pem(), None, Duration::from_secs(5))?;
        self.wait_ready(&mut process, || matches!(http_get(&agent, &url), Ok(r) if r.status == 200))?;
        self.apiserver = Some(process);
        Ok(())
    }

    /// Stops and starts the API server (same port, same etcd).
    pub fn restart_apiserver(&mut self) -> Result<()> {
        self.stop_apiserver();
        self.start_apiserver()
    }

    /// Each running component's name and pid (its process group), e.g. for a harness that records
    /// what it must stop should it die before this plane drops (`cargo xtask cluster`'s ledger).
    pub fn pids(&self) -> Vec<(String, u32)> {
        [&self.etcd, &self.apiserver, &self.controller_manager, &self.scheduler]
            .into_iter()
            .flatten()
            .filter_map(|p| Some((p.name().to_owned(), p.pid()?)))
            .collect()
    }

    /// Whether the API server process is running (not stopped, not exited).
    pub fn apiserver_running(&mut self) -> bool {
        self.apiserver.as_mut().is_some_and(|p| p.exited().is_none())
    }

    /// Starts kube-controller-manager (as `system:kube-controller-manager`, per-controller
    /// service-account credentials, signing with the cluster CA) and waits for its `/healthz`.
    pub fn start_controller_manager(&mut self, options: ControllerManagerOptions) -> Result<()> {
        if self.controller_manager.is_some() {
            return Err(Error::Refused("kube-controller-manager already runs".into()));
        }
        let mut args = vec![
            "--use-service-account-credentials=true".into(),
            format!("--service-account-private-key-file={}", self.pki.service_account_key_file().display()),
            format!("--root-ca-file={}", self.pki.ca_cert_file().display()),
            format!("--cluster-signing-cert-file={}", self.pki.ca_cert_file().display()),
            format!("--cluster-signing-key-file={}", self.pki.ca_key_file().display()),
            format!("--service-cluster-ip-range={}", self.options.service_cidr),
        ];
        if let Some(cidr) = &options.cluster_cidr {
            args.push("--allocate-node-cidrs=true".into());
            args.push(format!("--cluster-cidr={cidr}"));
        }
        if let Some(controllers) = &options.controllers {
            args.push(format!("--controllers={}", controllers.join(",")));
        }
        args.extend(options.extra_args.iter().cloned());
        let process =
            self.start_component(Binary::KubeControllerManager, &Identity::controller_manager(), "kcm-certs", &args)?;
        self.controller_manager = Some(process);
        Ok(())
    }

    /// Starts kube-scheduler (as `system:kube-scheduler`) with `extra_args` and waits for its `/healthz`.
    pub fn start_scheduler(&mut self, extra_args: &[String]) -> Result<()> {
        if self.scheduler.is_some() {
            return Err(Error::Refused("kube-scheduler already runs".into()));
        }
        let process =
            self.start_component(Binary::KubeScheduler, &Identity::scheduler(), "scheduler-certs", extra_args)?;
        self.scheduler = Some(process);
        Ok(())
    }

    /// Starts kube-controller-manager or kube-scheduler as `identity` (kubeconfig, authn and
    /// authz through it), serving on a free loopback port with its certificates in
    /// `<work>/<cert_dir>`, without leader election, `args` appended; waits for its `/healthz`.
    fn start_component(&self, binary: Binary, identity: &Identity, cert_dir: &str, args: &[String]) -> Result<Process> {
        let kubeconfig = self.kubeconfig(identity)?;
        let port = net::free_ports(self.options.netns.as_deref(), IpAddr::V4(Ipv4Addr::LOCALHOST), 1)?[0];
        let k = kubeconfig.display().to_string();
        let mut argv = vec![
            format!("--kubeconfig={k}"),
            format!("--authentication-kubeconfig={k}"),
            format!("--authorization-kubeconfig={k}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            format!("--cert-dir={}", self.work_path.join(cert_dir).display()),
            "--leader-elect=false".into(),
        ];
        argv.extend(args.iter().cloned());
        let bin = self.binaries.path(binary)?;
        let mut process = self.spawn(binary.file_name(), &bin, &argv)?;
        let url = format!("https://127.0.0.1:{port}/healthz");
        let agent = insecure_agent()?;
        self.wait_ready(&mut process, || matches!(http_get(&agent, &url), Ok(r) if r.status == 200))?;
        Ok(process)
    }

    /// Saves etcd's data directory to `dest` (replaced if present) for a later
    /// [`ControlPlaneOptions::etcd_seed`]: stops the API server and etcd (so the copy is
    /// consistent), copies, and starts both again on the same ports.
    pub fn save_etcd(&mut self, dest: &Path) -> Result<()> {
        self.stop_apiserver();
        if let Some(mut etcd) = self.etcd.take() {
            etcd.stop(Duration::from_secs(30));
        }
        let partial = dest.with_extension("partial");
        let _ = std::fs::remove_dir_all(&partial);
        copy_dir(&self.work_path.join("etcd"), &partial)
            .and_then(|()| {
                let _ = std::fs::remove_dir_all(dest);
                std::fs::rename(&partial, dest)
            })
            .map_err(|e| Error::io(format!("saving etcd's data to {}", dest.display()), e))?;
        self.start_etcd()?;
        self.start_apiserver()
    }

    fn start_etcd(&mut self) -> Result<()> {
        let peer_port = self.etcd_peer_port;
        let (bin, version) = match self.options.etcd {
            Etcd::V3_6 => (self.binaries.path(Binary::Etcd3_6)?, "3.6"),
            Etcd::V3_5_1 => (self.binaries.etcd_3_5_1().to_path_buf(), "3.5.1"),
        };
        let client = self.etcd_url();
        let peer = format!("http://127.0.0.1:{peer_port}");
        let mut args = vec![
            "--name=harness".to_owned(),
            format!("--data-dir={}", self.work_path.join("etcd").display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=harness={peer}"),
            "--initial-cluster-state=new".into(),
            "--log-level=warn".into(),
            "--quota-backend-bytes=8589934592".into(),
        ];
        if self.options.unsafe_no_fsync {
            args.push("--unsafe-no-fsync".into());
        }
        let mut process = self.spawn("etcd", &bin, &args)?;
        tracing::debug!(version, "etcd started");
        let url = format!("{client}/health");
        let agent = insecure_agent()?;
        self.wait_ready(
            &mut process,
            || matches!(http_get(&agent, &url), Ok(r) if r.status == 200 && r.body.contains("true")),
        )?;
        self.etcd = Some(process);
        Ok(())
    }

    fn apiserver_args(&self) -> Vec<String> {
        let pki = &self.pki;
        let (low, high) = self.options.node_port_range;
        let issuer = format!("https://kubernetes.default.svc.{}", self.options.cluster_domain);
        let mut args = vec![
            format!("--etcd-servers={}", self.etcd_url()),
            format!("--bind-address={}", self.options.bind),
            format!("--advertise-address={}", self.options.bind),
            format!("--secure-port={}", self.port),
            format!("--cert-dir={}", self.work_path.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", pki.serving_cert_file().display()),
            format!("--tls-private-key-file={}", pki.serving_key_file().display()),
            format!("--client-ca-file={}", pki.ca_cert_file().display()),
            "--authorization-mode=Node,RBAC".into(),
            format!("--kubelet-client-certificate={}", kubelet_client_file(pki, "crt").display()),
            format!("--kubelet-client-key={}", kubelet_client_file(pki, "key").display()),
            format!("--service-account-issuer={issuer}"),
            format!("--service-account-key-file={}", pki.service_account_pub_file().display()),
            format!("--service-account-signing-key-file={}", pki.service_account_key_file().display()),
            format!("--service-cluster-ip-range={}", self.options.service_cidr),
            format!("--service-node-port-range={low}-{high}"),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
        ];
        if self.options.bind.is_loopback() {
            // The `kubernetes` Service's endpoint is the advertise address, and an Endpoints
            // address may not be loopback: the reconciler would fail (and log) for ever.
            args.push("--endpoint-reconciler-type=none".into());
        }
        if !self.options.watch_list {
            args.push("--feature-gates=WatchList=false".into());
        }
        args.extend(self.options.extra_apiserver_args.iter().cloned());
        args
    }

    fn spawn(&self, name: &str, bin: &Path, args: &[String]) -> Result<Process> {
        let logs = self.work_path.join("logs");
        std::fs::create_dir_all(&logs).map_err(|e| Error::io(format!("creating {}", logs.display()), e))?;
        Process::spawn(name, bin, args, &self.log_path(name), &self.launch)
    }

    /// Polls `ready` (from inside the namespace) until it holds, the process exits, or the timeout.
    fn wait_ready(&self, process: &mut Process, ready: impl Fn() -> bool + Send + Sync) -> Result<()> {
        let deadline = Instant::now() + self.options.ready_timeout;
        let ready = Arc::new(ready);
        loop {
            if let Some(status) = process.exited() {
                return Err(Error::Start {
                    component: process.name().to_owned(),
                    reason: format!("exited ({status})"),
                    log_tail: process.log_tail(4000),
                });
            }
            let ready = Arc::clone(&ready);
            if net::run_in(self.options.netns.as_deref(), move || ready())? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Start {
                    component: process.name().to_owned(),
                    reason: format!("not ready within {:?}", self.options.ready_timeout),
                    log_tail: process.log_tail(4000),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for process in [&mut self.scheduler, &mut self.controller_manager, &mut self.apiserver, &mut self.etcd] {
            if let Some(mut process) = process.take() {
                process.stop(Duration::from_secs(5));
            }
        }
        if std::env::var(KEEP_ENV).is_ok_and(|v| v == "1")
            && let Some(work) = self.work.take()
        {
            let path = work.keep();
            use std::io::Write;
            let _ = writeln!(std::io::stderr().lock(), "{KEEP_ENV}=1: kept {}", path.display());
        }
        // Otherwise the TempDir removes the work directory as it drops.
    }
}

/// Copies the directory tree `from` to `to` (files, directories; etcd's data has nothing else).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The identity the API server presents to kubelets (in `system:masters`: allowed every kubelet API).
fn kubelet_client() -> Identity {
    Identity::new("kube-apiserver-kubelet-client", Some("system:masters"))
}

fn kubelet_client_file(pki: &Pki, ext: &str) -> PathBuf {
    pki.ca_cert_file().with_file_name("clients").join(format!("{}.{ext}", kubelet_client().file_stem()))
}

fn agent(ca_pem: &str, creds: Option<&ClientCredentials>, timeout: Duration) -> Result<ureq::Agent> {
    use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};
    let ca = Certificate::from_pem(ca_pem.as_bytes()).map_err(|e| Error::Http(format!("the CA: {e}")))?;
    let mut tls = TlsConfig::builder().root_certs(RootCerts::Specific(Arc::new(vec![ca])));
    if let Some(creds) = creds {
        let cert =
            Certificate::from_pem(creds.cert_pem.as_bytes()).map_err(|e| Error::Http(format!("a client cert: {e}")))?;
        let key =
            PrivateKey::from_pem(creds.key_pem.as_bytes()).map_err(|e| Error::Http(format!("a client key: {e}")))?;
        tls = tls.client_cert(Some(ClientCert::new_with_certs(&[cert], key)));
    }
    Ok(build_agent(tls.build(), timeout))
}

/// For etcd's plain HTTP and the self-signed `/healthz` of kube-controller-manager and kube-scheduler.
fn insecure_agent() -> Result<ureq::Agent> {
    let tls = ureq::tls::TlsConfig::builder().disable_verification(true).build();
    Ok(build_agent(tls, Duration::from_secs(5)))
}

fn build_agent(tls: ureq::tls::TlsConfig, timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

fn http_get(agent: &ureq::Agent, url: &str) -> Result<HttpResponse> {
    let mut response = agent.get(url).call().map_err(|e| Error::Http(format!("GET {url}: {e}")))?;
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string().map_err(|e| Error::Http(format!("GET {url}: reading: {e}")))?;
    Ok(HttpResponse { status, body })
}

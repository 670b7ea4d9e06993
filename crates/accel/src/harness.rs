//! A small cluster in network namespaces for the fast path's kernel tests and its benchmark
//! (feature `harness`): the standard testbed, one backend pod on `node2` running a byte sink
//! (TCP) and an echo (UDP) on port 9000, two Services in front of it — `fast` (opted in with
//! `spec.trafficHint: LongLived`) and `slow` (no hint) — programmed by a real dataplane
//! ([`ProxyMode`]) plus the [`Accelerator`], all in `node`. Clients run in `external`, so
//! their connections are forwarded through `node` (DNAT, masquerade, flowtable) to `node2`.
//!
//! Every sync takes the daemon's path (`kproxy`'s `DaemonObserver::synced`): the flowtable
//! probe before the first sync, the dataplane's full sync first and partial syncs after it,
//! then the stale-UDP conntrack cleanup ([`kproxy_conntrack::Reconciler`], one pass per family
//! of the plan), then the fast path (a full sync first, then O(change) syncs), each applied
//! with the executor the daemon uses (nf_tables netlink for the fast path and the nftables
//! dataplane, `iptables-restore` of the chosen backend, IPVS netlink).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kproxy_conntrack::{ReconcileStats, Reconciler};
use kproxy_packet_suite::{Dataplane, NODE_A, NODE_B, endpoint, node_objects, slice};
use kproxy_plan::{DetectLocal, NodeContext, Plan, Planner, ProxyPolicy};
use kproxy_state::{Change, ClusterState, Object, ServiceObject};
use kproxy_testbed::kernel::KernelFeature;
use kproxy_testbed::topology::{CLUSTER_CIDR_V4, CLUSTER_CIDR_V6, NODE_IP_V4, NODE_IP_V6};
use kproxy_testbed::{Netns, NsThread, Pod, Testbed, Where};
use serde_json::json;

use crate::{AccelConfig, Accelerator, LinkWatcher, NetlinkExecutor, WatchOptions};

/// ClusterIP of the opted-in Service.
pub const FAST_VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 128, 20);
/// ClusterIP of the Service without the hint.
pub const SLOW_VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 128, 21);
/// Node port of the opted-in Service (TCP).
pub const FAST_NODE_PORT: u16 = 30020;
/// Service port of both Services (TCP and UDP).
pub const SERVICE_PORT: u16 = 80;
/// Where the backend listens (TCP sink, UDP echo).
pub const BACKEND_PORT: u16 = 9000;

/// The dataplane programming the Services.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// `--proxy-mode=nftables`.
    Nftables,
    /// `--proxy-mode=iptables` with the nf_tables backend (iptables-nft).
    Iptables,
    /// `--proxy-mode=iptables` with the legacy x_tables backend (iptables-legacy).
    IptablesLegacy,
    /// `--proxy-mode=ipvs`.
    Ipvs,
}

impl ProxyMode {
    /// Every dataplane, in the order reports list them.
    pub const ALL: [ProxyMode; 4] =
        [ProxyMode::Nftables, ProxyMode::Iptables, ProxyMode::IptablesLegacy, ProxyMode::Ipvs];

    /// `nftables`, `iptables-nft`, `iptables-legacy` or `ipvs`.
    pub fn name(self) -> &'static str {
        match self {
            ProxyMode::Nftables => "nftables",
            ProxyMode::Iptables => "iptables-nft",
            ProxyMode::IptablesLegacy => "iptables-legacy",
            ProxyMode::Ipvs => "ipvs",
        }
    }

    /// The mode [`ProxyMode::name`] names (`iptables` is accepted for `iptables-nft`).
    pub fn parse(name: &str) -> Option<ProxyMode> {
        match name {
            "iptables" => Some(ProxyMode::Iptables),
            _ => ProxyMode::ALL.into_iter().find(|mode| mode.name() == name),
        }
    }

    /// What the kernel needs for this mode plus flowtables.
    pub fn features(self) -> Vec<KernelFeature> {
        match self {
            ProxyMode::Ipvs => vec![KernelFeature::Flowtable, KernelFeature::Ipvs, KernelFeature::Dummy],
            _ => vec![KernelFeature::Flowtable],
        }
    }

    fn dataplane(self) -> Box<dyn Dataplane> {
        match self {
            // The daemon's executor: nf_tables netlink, no `nft` process.
            ProxyMode::Nftables => Box::new(kproxy_nftables::NftablesDataplane::new(
                NetlinkExecutor::new(),
                kproxy_nftables::Config::default(),
            )),
            ProxyMode::Iptables => Box::new(kproxy_iptables::IptablesDataplane::new(
                kproxy_iptables::IptablesRestore::new(kproxy_iptables::Backend::Nft),
                kproxy_iptables::Config::default(),
            )),
            ProxyMode::IptablesLegacy => Box::new(kproxy_iptables::IptablesDataplane::new(
                kproxy_iptables::IptablesRestore::new(kproxy_iptables::Backend::Legacy),
                kproxy_iptables::Config::default(),
            )),
            ProxyMode::Ipvs => Box::new(kproxy_ipvs::IpvsDataplane::new(
                kproxy_ipvs::KernelHost::new(),
                kproxy_ipvs::Config::default(),
            )),
        }
    }
}

/// How a Service opts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    /// No hint.
    None,
    /// `spec.trafficHint: LongLived` (read from the raw object).
    Field,
    /// Annotation `service.kproxy.io/traffic-hint: LongLived`.
    Annotation,
}

/// The Service `name` at `vip`, TCP and UDP port 80 → 9000, NodePort when `node_port` is set.
pub fn service_object(name: &str, vip: Ipv4Addr, node_port: Option<u16>, hint: Hint) -> Object {
    let mut ports = vec![
        json!({"name": "tcp", "port": SERVICE_PORT, "targetPort": BACKEND_PORT, "protocol": "TCP"}),
        json!({"name": "udp", "port": SERVICE_PORT, "targetPort": BACKEND_PORT, "protocol": "UDP"}),
    ];
    if let Some(node_port) = node_port {
        ports[0]["nodePort"] = json!(node_port);
    }
    let mut metadata = json!({"namespace": "default", "name": name});
    if hint == Hint::Annotation {
        metadata["annotations"] = json!({crate_annotation(): "LongLived"});
    }
    let kind = if node_port.is_some() { "NodePort" } else { "ClusterIP" };
    let value = json!({"metadata": metadata, "spec": {"type": kind, "clusterIP": vip.to_string(), "ports": ports}});
    let service: k8s_openapi::api::core::v1::Service = match serde_json::from_value(value) {
        Ok(service) => service,
        Err(error) => panic!("invalid Service {name}: {error}"),
    };
    let traffic_hint = (hint == Hint::Field).then(|| "LongLived".to_owned());
    Object::Service(Box::new(ServiceObject { service, traffic_hint }))
}

fn crate_annotation() -> &'static str {
    kproxy_state::TRAFFIC_HINT_ANNOTATION
}

/// The testbed, the dataplane and the fast path, programmed for `fast` and `slow`.
pub struct Cluster {
    // Field order is drop order: stop the watcher and the sinks before the namespaces go.
    watcher: Option<LinkWatcher>,
    sinks: Vec<Sink>,
    /// The fast path (shared with the link watcher).
    pub accel: Arc<Mutex<Accelerator<NetlinkExecutor>>>,
    dataplane: Box<dyn Dataplane>,
    /// The stale-UDP conntrack cleanup, as the daemon runs it after each sync.
    reconciler: Reconciler,
    planner: Planner,
    state: ClusterState,
    plan: Plan,
    /// The backend pod on node2 (the endpoint of both Services at start).
    pub backend: Arc<Pod>,
    /// The namespaces.
    pub testbed: Testbed,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("backend", &self.backend.name()).finish_non_exhaustive()
    }
}

/// The ports of both Services' EndpointSlices.
fn slice_ports() -> serde_json::Value {
    json!([
        {"name": "tcp", "port": BACKEND_PORT, "protocol": "TCP"},
        {"name": "udp", "port": BACKEND_PORT, "protocol": "UDP"},
    ])
}

/// The EndpointSlice of `service` (`fast` or `slow`) with these ready endpoints (on node2).
pub fn endpoint_slice(service: &str, endpoints: &[&Pod]) -> Object {
    let endpoints =
        endpoints.iter().map(|pod| endpoint(&pod.ipv4().to_string(), NODE_B, json!({"ready": true}))).collect();
    slice("default", service, "1", "IPv4", slice_ports(), endpoints)
}

impl Cluster {
    /// Builds the topology, programs `mode` and the fast path for `fast` (hinted with `hint`)
    /// and `slow`, as the daemon's first sync does.
    pub fn start(mode: ProxyMode, config: AccelConfig, hint: Hint) -> Result<Cluster, String> {
        let testbed = Testbed::new().map_err(|e| e.to_string())?;
        let backend = testbed.add_pod("backend", Where::Node2).map_err(|e| e.to_string())?;
        let sink = Sink::start(backend.netns(), backend.name())?;
        let policy = ProxyPolicy {
            detect_local: DetectLocal::ClusterCidr(vec![CLUSTER_CIDR_V4.into(), CLUSTER_CIDR_V6.into()]),
            acceleration: true,
            ..ProxyPolicy::default()
        };
        let node = NodeContext {
            name: NODE_A.to_owned(),
            node_ip_override: Vec::new(),
            local_addresses: vec![NODE_IP_V4.into(), NODE_IP_V6.into()],
        };
        let planner = Planner::new(policy, node);
        let mut state = ClusterState::new();
        let objects = node_objects().into_iter().chain([
            service_object("fast", FAST_VIP, Some(FAST_NODE_PORT), hint),
            service_object("slow", SLOW_VIP, None, Hint::None),
            endpoint_slice("fast", &[&backend]),
            endpoint_slice("slow", &[&backend]),
        ]);
        for object in objects {
            state.apply(Change::Applied(object));
        }
        let _ = state.take_dirty();
        let plan = planner.build(&state);
        let node_ns = testbed.node();
        // What the daemon creates at start, in the node's namespace: the dataplane, the
        // conntrack reconciler, the fast path, probed before the first sync.
        let mut dataplane = node_ns.run_in(|| mode.dataplane()).map_err(|e| e.to_string())?;
        let mut reconciler = node_ns
            .run_in(Reconciler::new)
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("conntrack socket: {e}"))?;
        reconciler.set_local_addresses(vec![NODE_IP_V4.into(), NODE_IP_V6.into()]);
        let mut accelerator = Accelerator::new(NetlinkExecutor::new(), config);
        node_ns.run_in(|| accelerator.probe_once()).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        // The first sync: full dataplane sync, conntrack cleanup, full fast-path sync.
        node_ns.run_in(|| dataplane.full_sync(&plan).map_err(|e| e.to_string())).map_err(|e| e.to_string())??;
        reconcile(&mut reconciler, &plan)?;
        node_ns.run_in(|| accelerator.full_sync(&plan)).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        Ok(Cluster {
            watcher: None,
            sinks: vec![sink],
            accel: Arc::new(Mutex::new(accelerator)),
            dataplane,
            reconciler,
            planner,
            state,
            plan,
            backend,
            testbed,
        })
    }

    /// The node namespace.
    pub fn node(&self) -> &Netns {
        self.testbed.node()
    }

    /// The current plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Adds a backend pod `name` on node2 running the same sink and echo (not an endpoint of
    /// anything until [`Cluster::set_endpoints`]).
    pub fn add_backend(&mut self, name: &str) -> Result<Arc<Pod>, String> {
        let pod = self.testbed.add_pod(name, Where::Node2).map_err(|e| e.to_string())?;
        self.sinks.push(Sink::start(pod.netns(), pod.name())?);
        Ok(pod)
    }

    /// Replaces the endpoints of `service` (`fast` or `slow`) and syncs as the daemon does;
    /// returns what the conntrack cleanup of that sync did.
    pub fn set_endpoints(&mut self, service: &str, endpoints: &[&Pod]) -> Result<Vec<ReconcileStats>, String> {
        self.apply(vec![endpoint_slice(service, endpoints)])
    }

    /// Starts the link watcher (in the node's namespace).
    pub fn watch_links(&mut self, options: WatchOptions) -> Result<(), String> {
        let accel = self.accel.clone();
        let watcher = self.testbed.node().run_in(|| LinkWatcher::spawn(accel, options)).map_err(|e| e.to_string())?;
        self.watcher = Some(watcher.map_err(|e| e.to_string())?);
        Ok(())
    }

    /// Applies changed objects and syncs as the daemon does after its first sync: the
    /// dataplane's partial sync, the stale-UDP conntrack cleanup, the fast path's O(change)
    /// sync. Returns what the conntrack cleanup did (one pass per family of the plan).
    pub fn apply(&mut self, objects: Vec<Object>) -> Result<Vec<ReconcileStats>, String> {
        for object in objects {
            self.state.apply(Change::Applied(object));
        }
        let dirty = self.state.take_dirty();
        let delta = self.planner.update(&mut self.plan, &self.state, &dirty);
        let (plan, dataplane, accel) = (&self.plan, &mut self.dataplane, &self.accel);
        let node = self.testbed.node();
        if !delta.is_empty() {
            node.run_in(|| dataplane.partial_sync(plan, &delta).map_err(|e| e.to_string()))
                .map_err(|e| e.to_string())??;
        }
        let cleaned = reconcile(&mut self.reconciler, plan)?;
        node.run_in(|| lock(accel).sync(plan, &delta)).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        Ok(cleaned)
    }

    /// Turns the fast path off (its table removed) or back on (recreated from the plan).
    pub fn set_acceleration(&self, on: bool) -> Result<(), String> {
        let plan = &self.plan;
        let accel = &self.accel;
        self.testbed
            .node()
            .run_in(|| if on { lock(accel).full_sync(plan).map(|_| ()) } else { lock(accel).cleanup() })
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    /// The metric `kubeproxy_accelerated_connections_count_total`: connections handed to the
    /// flowtable so far (read in the node's namespace).
    pub fn accelerated_connections_total(&self) -> Result<u64, String> {
        let accel = &self.accel;
        self.testbed.node().run_in(|| lock(accel).accelerated_connections_total()).map_err(|e| e.to_string())
    }

    /// A TCP connection from `external` to `address:port`, made in that namespace.
    pub fn connect_tcp(&self, address: IpAddr, port: u16) -> Result<TcpStream, String> {
        let target = SocketAddr::new(address, port);
        let stream = self
            .testbed
            .external()
            .run_in(move || TcpStream::connect_timeout(&target, Duration::from_secs(5)))
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("connect {target}: {e}"))?;
        let _ = stream.set_read_timeout(Some(Duration::from_secs(20)));
        let _ = stream.set_write_timeout(Some(Duration::from_secs(20)));
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// A UDP socket in `external`, connected to `address:port`.
    pub fn connect_udp(&self, address: IpAddr, port: u16) -> Result<UdpSocket, String> {
        let target = SocketAddr::new(address, port);
        let socket = self
            .testbed
            .external()
            .run_in(move || -> std::io::Result<UdpSocket> {
                let socket = UdpSocket::bind("0.0.0.0:0")?;
                socket.connect(target)?;
                socket.set_read_timeout(Some(Duration::from_secs(2)))?;
                Ok(socket)
            })
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("udp {target}: {e}"))?;
        Ok(socket)
    }

    /// The node's conntrack entry of the connection from `client_port` (original direction),
    /// one line of `conntrack -L`.
    pub fn conntrack_entry(&self, protocol: &str, client_port: u16) -> Option<String> {
        let table = self.testbed.node().exec_ok("conntrack", &["-L", "-p", protocol]).ok()?;
        let needle = format!(" sport={client_port} ");
        table.lines().find(|line| line.contains(&needle)).map(str::to_owned)
    }

    /// Waits up to `timeout` for the connection from `client_port` to show `[OFFLOAD]`.
    pub fn wait_offloaded(&self, protocol: &str, client_port: u16, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.conntrack_entry(protocol, client_port).is_some_and(|line| line.contains("[OFFLOAD]")) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `nft list ruleset` of the node.
    pub fn ruleset(&self) -> String {
        self.testbed.node().exec_ok("nft", &["list", "ruleset"]).unwrap_or_else(|e| e.to_string())
    }

    /// Removes the fast path and the dataplane (as `--cleanup` would).
    pub fn cleanup(&mut self) -> Result<(), String> {
        self.watcher = None;
        let (dataplane, accel) = (&mut self.dataplane, &self.accel);
        self.testbed.node().run_in(|| lock(accel).cleanup()).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        self.testbed.node().run_in(|| dataplane.cleanup().map_err(|e| e.to_string())).map_err(|e| e.to_string())?
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.watcher = None;
        for sink in self.sinks.drain(..) {
            sink.stop();
        }
    }
}

/// One stale-UDP conntrack cleanup pass per family of the plan, as the daemon runs after each
/// sync (the reconciler's socket is in the node's namespace).
fn reconcile(reconciler: &mut Reconciler, plan: &Plan) -> Result<Vec<ReconcileStats>, String> {
    plan.families
        .values()
        .map(|family| reconciler.reconcile(family).map_err(|e| format!("conntrack cleanup: {e}")))
        .collect()
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends `bytes` zero bytes in 64 KiB writes.
pub fn send_bytes(stream: &mut TcpStream, bytes: usize) -> std::io::Result<()> {
    let chunk = vec![0u8; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        stream.write_all(&chunk[..n])?;
        left -= n;
    }
    Ok(())
}

/// Ends the upload and returns how many bytes the sink says it received.
pub fn finish(stream: TcpStream) -> std::io::Result<u64> {
    finish_at(stream).map(|(bytes, _)| bytes)
}

/// Ends the upload (FIN) and returns how many bytes the sink received and which backend it is.
pub fn finish_at(mut stream: TcpStream) -> std::io::Result<(u64, String)> {
    stream.shutdown(Shutdown::Write)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let mut words = answer.split_whitespace();
    match (words.next().and_then(|bytes| bytes.parse().ok()), words.next(), words.next()) {
        (Some(bytes), Some(backend), None) => Ok((bytes, backend.to_owned())),
        _ => Err(std::io::Error::other(format!("sink answered {answer:?}"))),
    }
}

/// Aborts the connection: `SO_LINGER` 0 makes the close send a RST instead of a FIN.
pub fn reset(stream: TcpStream) -> std::io::Result<()> {
    let linger = nix::libc::linger { l_onoff: 1, l_linger: 0 };
    nix::sys::socket::setsockopt(&stream, nix::sys::socket::sockopt::Linger, &linger).map_err(std::io::Error::from)?;
    drop(stream);
    Ok(())
}

/// What a UDP backend answers to this datagram: its name.
pub const WHO: &[u8] = b"who";

/// Asks the backend behind `socket` for its name ([`WHO`]); `None` when nothing answers.
pub fn udp_backend(socket: &UdpSocket) -> Option<String> {
    let mut buffer = [0u8; 256];
    socket.send(WHO).ok()?;
    let n = socket.recv(&mut buffer).ok()?;
    Some(String::from_utf8_lossy(&buffer[..n]).into_owned())
}

/// A backend: a TCP sink that answers each connection, at EOF, with the number of bytes it
/// received and its name; a UDP echo that answers [`WHO`] with its name and echoes anything
/// else. Polls a stop flag, so it ends with the test.
struct Sink {
    stop: Arc<AtomicBool>,
    threads: Vec<NsThread<()>>,
}

impl Sink {
    fn start(netns: &Netns, name: &str) -> Result<Sink, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tcp_name, udp_name) = (name.to_owned(), name.to_owned());
        let (tcp_stop, udp_stop) = (stop.clone(), stop.clone());
        let listener = netns
            .run_in(|| TcpListener::bind(("0.0.0.0", BACKEND_PORT)))
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let udp = netns
            .run_in(|| UdpSocket::bind(("0.0.0.0", BACKEND_PORT)))
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        listener.set_nonblocking(true).map_err(|e| e.to_string())?;
        udp.set_read_timeout(Some(Duration::from_millis(100))).map_err(|e| e.to_string())?;
        let tcp = netns
            .spawn_in("sink-tcp", move || {
                while !tcp_stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let name = tcp_name.clone();
                            std::thread::spawn(move || serve_sink(stream, &name));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        let echo = netns
            .spawn_in("sink-udp", move || {
                let mut buffer = [0u8; 2048];
                while !udp_stop.load(Ordering::Relaxed) {
                    if let Ok((n, peer)) = udp.recv_from(&mut buffer) {
                        let answer = if &buffer[..n] == WHO { udp_name.as_bytes() } else { &buffer[..n] };
                        let _ = udp.send_to(answer, peer);
                    }
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(Sink { stop, threads: vec![tcp, echo] })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

fn serve_sink(mut stream: TcpStream, name: &str) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(60)));
    let mut buffer = vec![0u8; 256 * 1024];
    let mut total: u64 = 0;
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(_) => return,
        }
    }
    let _ = stream.write_all(format!("{total} {name}\n").as_bytes());
}

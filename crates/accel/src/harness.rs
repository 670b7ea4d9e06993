//! A small cluster in network namespaces for the fast path's kernel tests and its benchmark
//! (feature `harness`): the standard testbed, one backend pod on `node2` running a byte sink
//! (TCP) and an echo (UDP) on port 9000, two Services in front of it — `fast` (opted in with
//! `spec.trafficHint: LongLived`) and `slow` (no hint) — programmed by a real dataplane
//! ([`ProxyMode`]) plus the [`Accelerator`], all in `node`. Clients run in `external`, so
//! their connections are forwarded through `node` (DNAT, masquerade, flowtable) to `node2`.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kproxy_packet_suite::{Dataplane, NODE_A, NODE_B, endpoint, node_objects, slice};
use kproxy_plan::{DetectLocal, NodeContext, Plan, PlanDelta, Planner, ProxyPolicy};
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
    /// `--proxy-mode=iptables` (iptables-nft).
    Iptables,
    /// `--proxy-mode=ipvs`.
    Ipvs,
}

impl ProxyMode {
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
    // Field order is drop order: stop the watcher and the sink before the namespaces go.
    watcher: Option<LinkWatcher>,
    sink: Option<Sink>,
    /// The fast path (shared with the link watcher).
    pub accel: Arc<Mutex<Accelerator<NetlinkExecutor>>>,
    dataplane: Box<dyn Dataplane>,
    planner: Planner,
    state: ClusterState,
    plan: Plan,
    /// The backend pod on node2.
    pub backend: Arc<Pod>,
    /// The namespaces.
    pub testbed: Testbed,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("backend", &self.backend.name()).finish_non_exhaustive()
    }
}

impl Cluster {
    /// Builds the topology, programs `mode` and the fast path for `fast` (hinted with `hint`)
    /// and `slow`.
    pub fn start(mode: ProxyMode, config: AccelConfig, hint: Hint) -> Result<Cluster, String> {
        let testbed = Testbed::new().map_err(|e| e.to_string())?;
        let backend = testbed.add_pod("backend", Where::Node2).map_err(|e| e.to_string())?;
        let sink = Sink::start(backend.netns())?;
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
        let ip = backend.ipv4().to_string();
        let slice_ports = json!([
            {"name": "tcp", "port": BACKEND_PORT, "protocol": "TCP"},
            {"name": "udp", "port": BACKEND_PORT, "protocol": "UDP"},
        ]);
        let ready = json!({"ready": true});
        let objects = node_objects().into_iter().chain([
            service_object("fast", FAST_VIP, Some(FAST_NODE_PORT), hint),
            service_object("slow", SLOW_VIP, None, Hint::None),
            slice("default", "fast", "1", "IPv4", slice_ports.clone(), vec![endpoint(&ip, NODE_B, ready.clone())]),
            slice("default", "slow", "1", "IPv4", slice_ports, vec![endpoint(&ip, NODE_B, ready)]),
        ]);
        for object in objects {
            state.apply(Change::Applied(object));
        }
        let _ = state.take_dirty();
        let plan = planner.build(&state);
        let delta = PlanDelta::between(&Plan::default(), &plan);
        let node_ns = testbed.node();
        let mut dataplane = node_ns.run_in(|| mode.dataplane()).map_err(|e| e.to_string())?;
        node_ns
            .run_in(|| dataplane.partial_sync(&plan, &delta).map_err(|e| e.to_string()))
            .map_err(|e| e.to_string())??;
        let mut accelerator = Accelerator::new(NetlinkExecutor::new(), config);
        node_ns.run_in(|| accelerator.sync(&plan, &delta)).map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
        Ok(Cluster {
            watcher: None,
            sink: Some(sink),
            accel: Arc::new(Mutex::new(accelerator)),
            dataplane,
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

    /// Starts the link watcher (in the node's namespace).
    pub fn watch_links(&mut self, options: WatchOptions) -> Result<(), String> {
        let accel = self.accel.clone();
        let watcher = self.testbed.node().run_in(|| LinkWatcher::spawn(accel, options)).map_err(|e| e.to_string())?;
        self.watcher = Some(watcher.map_err(|e| e.to_string())?);
        Ok(())
    }

    /// Applies changed objects and syncs the dataplane, then the fast path, as the daemon does.
    pub fn apply(&mut self, objects: Vec<Object>) -> Result<(), String> {
        for object in objects {
            self.state.apply(Change::Applied(object));
        }
        let dirty = self.state.take_dirty();
        let delta = self.planner.update(&mut self.plan, &self.state, &dirty);
        let (plan, dataplane, accel) = (&self.plan, &mut self.dataplane, &self.accel);
        self.testbed
            .node()
            .run_in(|| dataplane.partial_sync(plan, &delta).map_err(|e| e.to_string()))
            .map_err(|e| e.to_string())??;
        self.testbed
            .node()
            .run_in(|| lock(accel).sync(plan, &delta))
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        Ok(())
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
        if let Some(sink) = self.sink.take() {
            sink.stop();
        }
    }
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
pub fn finish(mut stream: TcpStream) -> std::io::Result<u64> {
    stream.shutdown(Shutdown::Write)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    answer.trim().parse().map_err(|_| std::io::Error::other(format!("sink answered {answer:?}")))
}

/// The backend: a TCP sink that answers each connection, at EOF, with the number of bytes it
/// received; a UDP echo. Polls a stop flag, so it ends with the test.
struct Sink {
    stop: Arc<AtomicBool>,
    threads: Vec<NsThread<()>>,
}

impl Sink {
    fn start(netns: &Netns) -> Result<Sink, String> {
        let stop = Arc::new(AtomicBool::new(false));
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
                            std::thread::spawn(move || serve_sink(stream));
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
                        let _ = udp.send_to(&buffer[..n], peer);
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

fn serve_sink(mut stream: TcpStream) {
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
    let _ = stream.write_all(format!("{total}\n").as_bytes());
}

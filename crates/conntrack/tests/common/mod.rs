//! Helpers for the kernel tests: network namespaces, a node with a client and two pods, UDP
//! echo backends that say who they are, a UDP client with a fixed source port, and plans.
//!
//! Everything happens in namespaces the test creates, with unique names, removed on drop (also
//! when a test panics). The root namespace's interfaces and netfilter are never touched.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{ErrorKind, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use kproxy_plan::{
    Endpoint, FamilyPlan, InternalTraffic, LocalTraffic, MasqueradeWhen, NodePlan, NodePortAddresses, ServicePortName,
    ServicePortPlan, SnatPolicy,
};
use kproxy_state::{IpFamily, Protocol};
use nix::sched::{CloneFlags, setns};

/// True when the kernel tests can run. Outside CI they skip (with a message) when not root or
/// when a tool is missing; with `CI=true` that is a failure.
pub fn kernel_tests_enabled(test: &str) -> bool {
    let ci = std::env::var("CI").is_ok_and(|value| value == "true");
    let problem = if !nix::unistd::Uid::effective().is_root() {
        Some("not running as root".to_string())
    } else {
        [("ip", "-V"), ("nft", "--version"), ("conntrack", "--version")]
            .into_iter()
            .find(|(tool, flag)| Command::new(tool).arg(flag).output().map_or(true, |out| !out.status.success()))
            .map(|(tool, _)| tool)
            .map(|tool| format!("`{tool}` is not installed"))
    };
    match problem {
        None => true,
        Some(problem) if ci => panic!("{test}: kernel test cannot run in CI: {problem}"),
        Some(problem) => {
            eprintln!("SKIPPED {test}: {problem} (kernel tests need root, ip, nft and conntrack)");
            false
        }
    }
}

fn run(command: &mut Command) -> String {
    let output = command.output().unwrap_or_else(|error| panic!("running {command:?}: {error}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `kpct-<tag>-<pid>-<n>` with its loopback up.
    pub fn new(tag: &str) -> Self {
        let name = format!("kpct-{tag}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        assert!(name.len() < 64, "namespace name too long: {name}");
        run(Command::new("ip").args(["netns", "add", &name]));
        let netns = Self { name };
        netns.ip("link set lo up");
        netns
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n <ns> <args>`.
    pub fn ip(&self, args: &str) -> String {
        run(Command::new("ip").args(["-n", &self.name]).args(args.split_whitespace()))
    }

    /// Runs a program inside the namespace.
    pub fn exec(&self, program: &str, args: &[&str]) -> String {
        run(Command::new("ip").args(["netns", "exec", &self.name, program]).args(args))
    }

    /// Loads an nft script inside the namespace.
    pub fn nft(&self, script: &str) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(output.status.success(), "nft -f failed: {}\n{script}", String::from_utf8_lossy(&output.stderr));
    }

    /// Runs `f` on a thread that entered the namespace. Sockets it creates stay in the namespace
    /// and can be used from any thread afterwards.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|scope| {
            let handle = scope.spawn(|| {
                let file = File::open(&path).unwrap_or_else(|error| panic!("opening {path}: {error}"));
                setns(&file, CloneFlags::CLONE_NEWNET).unwrap_or_else(|error| panic!("entering {path}: {error}"));
                f()
            });
            match handle.join() {
                Ok(value) => value,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    /// Writes a sysctl of this namespace (path under /proc/sys).
    pub fn sysctl(&self, path: &str, value: &str) {
        self.enter(|| std::fs::write(format!("/proc/sys/{path}"), value).unwrap());
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// The service under test.
pub const VIP: &str = "198.18.128.10";
/// Its port.
pub const SERVICE_PORT: u16 = 53;
/// The endpoints' target port.
pub const TARGET_PORT: u16 = 8053;
/// The client's address.
pub const CLIENT_IP: &str = "198.18.1.2";
/// Pod A's address.
pub const POD_A: &str = "198.18.2.2";
/// Pod B's address.
pub const POD_B: &str = "198.18.3.2";

/// A node namespace that forwards between a client namespace and two pod namespaces, with an nft
/// table that stands in for the dataplane.
pub struct Topology {
    /// The node, where conntrack and the rules live.
    pub node: Netns,
    /// A client (think: a pod on another node).
    pub client: Netns,
    /// Backend pod A.
    pub pod_a: Netns,
    /// Backend pod B.
    pub pod_b: Netns,
}

fn link(node: &Netns, node_side: &str, node_cidr: &str, peer: &Netns, peer_cidr: &str) {
    node.ip(&format!("link add {node_side} type veth peer name eth0 netns {}", peer.name()));
    node.ip(&format!("addr add {node_cidr} dev {node_side}"));
    node.ip(&format!("link set {node_side} up"));
    peer.ip(&format!("addr add {peer_cidr} dev eth0"));
    peer.ip("link set eth0 up");
    let gateway = node_cidr.split('/').next().unwrap();
    peer.ip(&format!("route add default via {gateway}"));
}

impl Topology {
    /// Builds the topology; service traffic has no rule yet.
    pub fn new(tag: &str) -> Self {
        let topology = Self {
            node: Netns::new(&format!("{tag}-n")),
            client: Netns::new(&format!("{tag}-c")),
            pod_a: Netns::new(&format!("{tag}-a")),
            pod_b: Netns::new(&format!("{tag}-b")),
        };
        link(&topology.node, "to-client", "198.18.1.1/30", &topology.client, "198.18.1.2/30");
        link(&topology.node, "to-a", "198.18.2.1/30", &topology.pod_a, "198.18.2.2/30");
        link(&topology.node, "to-b", "198.18.3.1/30", &topology.pod_b, "198.18.3.2/30");
        topology.node.sysctl("net/ipv4/ip_forward", "1");
        // Service addresses are not routed anywhere: traffic the rules do not DNAT fails loudly.
        // Like a real dataplane, the table always holds a rule that needs connection tracking
        // (kube-proxy's masquerade rule): a namespace only tracks connections while some rule
        // needs it, and without tracking an existing entry would not be used at all, which would
        // hide the very problem these tests show.
        topology.node.ip("route add prohibit 198.18.128.0/17");
        topology.node.nft(
            "table ip kproxy-test {\n\
             \tchain services { }\n\
             \tchain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; jump services; }\n\
             \tchain filter-prerouting { type filter hook prerouting priority dstnat + 10; policy accept; }\n\
             \tchain nat-postrouting { type nat hook postrouting priority srcnat; policy accept; meta mark & 0x4000 == 0x4000 masquerade; }\n\
             }\n",
        );
        topology
    }

    /// What a dataplane does for a service with this endpoint: DNAT new flows to it.
    pub fn route_service_to(&self, endpoint_ip: &str) {
        self.node.nft(&format!(
            "flush chain ip kproxy-test services\n\
             flush chain ip kproxy-test filter-prerouting\n\
             add rule ip kproxy-test services ip daddr {VIP} udp dport {SERVICE_PORT} dnat to {endpoint_ip}:{TARGET_PORT}\n"
        ));
    }

    /// What a dataplane does for a service without endpoints: reject new flows.
    pub fn reject_service(&self) {
        self.node.nft(&format!(
            "flush chain ip kproxy-test services\n\
             flush chain ip kproxy-test filter-prerouting\n\
             add rule ip kproxy-test filter-prerouting ip daddr {VIP} udp dport {SERVICE_PORT} reject\n"
        ));
    }

    /// What a dataplane does once the service is deleted: nothing at all.
    pub fn forget_service(&self) {
        self.node.nft("flush chain ip kproxy-test services\nflush chain ip kproxy-test filter-prerouting\n");
    }

    /// A reconciler whose socket lives in the node's namespace.
    pub fn reconciler(&self) -> kproxy_conntrack::Reconciler {
        self.node.enter(kproxy_conntrack::Reconciler::new).expect("ctnetlink socket in the node namespace")
    }

    /// The node's UDP conntrack entries, as `conntrack -L` prints them.
    pub fn udp_entries(&self) -> String {
        self.node.exec("conntrack", &["-L", "-p", "udp"])
    }
}

/// A UDP server in a namespace that answers every datagram with its name.
pub struct UdpEcho {
    received: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl UdpEcho {
    /// Starts answering on `bind` inside `netns`.
    pub fn start(netns: &Netns, bind: &str, name: &'static str) -> Self {
        let bind: SocketAddr = bind.parse().unwrap();
        let socket = netns.enter(|| UdpSocket::bind(bind).unwrap());
        socket.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let received = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let (received, stop) = (received.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buffer = [0; 1500];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((_, peer)) = socket.recv_from(&mut buffer) {
                        received.fetch_add(1, Ordering::SeqCst);
                        let _ = socket.send_to(name.as_bytes(), peer);
                    }
                }
            })
        };
        Self { received, stop, handle: Some(handle) }
    }

    /// Datagrams received so far.
    pub fn received(&self) -> usize {
        self.received.load(Ordering::SeqCst)
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// What one datagram to the service got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// An answer from the named backend.
    Reply(String),
    /// ICMP port unreachable: the service rejected it.
    Refused,
    /// ICMP administratively prohibited (or host/network unreachable): nothing routes the
    /// service address.
    Unreachable,
    /// Nothing came back.
    Silent,
}

/// A UDP client with a fixed source port, connected to the service: every datagram it sends
/// belongs to the same conntrack entry.
pub struct UdpClient {
    socket: UdpSocket,
}

impl UdpClient {
    /// Binds `CLIENT_IP:port` in `netns` and connects to the service.
    pub fn new(netns: &Netns, port: u16) -> Self {
        let local: SocketAddr = format!("{CLIENT_IP}:{port}").parse().unwrap();
        let remote: SocketAddr = format!("{VIP}:{SERVICE_PORT}").parse().unwrap();
        let socket = netns.enter(|| {
            let socket = UdpSocket::bind(local).unwrap();
            socket.connect(remote).unwrap();
            socket
        });
        socket.set_read_timeout(Some(Duration::from_millis(400))).unwrap();
        Self { socket }
    }

    /// Drops late answers and pending ICMP errors of earlier datagrams.
    fn drain(&self) {
        let _ = self.socket.take_error();
        self.socket.set_nonblocking(true).unwrap();
        let mut buffer = [0; 64];
        while self.socket.recv(&mut buffer).is_ok() {}
        let _ = self.socket.take_error();
        self.socket.set_nonblocking(false).unwrap();
    }

    /// Sends one datagram and reports what came back.
    pub fn probe(&self) -> Probe {
        self.drain();
        match self.socket.send(b"ping") {
            Ok(_) => {}
            Err(error) => return Self::classify(error),
        }
        let mut buffer = [0; 64];
        match self.socket.recv(&mut buffer) {
            Ok(length) => Probe::Reply(String::from_utf8_lossy(&buffer[..length]).into_owned()),
            Err(error) => Self::classify(error),
        }
    }

    fn classify(error: std::io::Error) -> Probe {
        match error.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => Probe::Silent,
            ErrorKind::ConnectionRefused => Probe::Refused,
            ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => Probe::Unreachable,
            _ => panic!("unexpected error from the service: {error}"),
        }
    }
}

/// Shorthand for a reply from a backend.
pub fn reply(name: &str) -> Probe {
    Probe::Reply(name.to_string())
}

/// The node's IPv4 plan with the UDP service `default/dns` (ClusterIP [`VIP`]) and these
/// endpoints (none: the service exists but has no endpoints). `None`: the service is deleted.
pub fn plan(endpoints: Option<&[&str]>) -> FamilyPlan {
    plan_draining(endpoints, &[])
}

/// Like [`plan`], with `draining` endpoints that are serving but not used (terminating while a
/// ready one exists, or filtered out by topology).
pub fn plan_draining(endpoints: Option<&[&str]>, draining: &[&str]) -> FamilyPlan {
    let mut services = BTreeMap::new();
    if let Some(endpoints) = endpoints {
        let name = ServicePortName {
            namespace: "default".into(),
            service: "dns".into(),
            port: "".into(),
            protocol: Protocol::Udp,
        };
        let endpoints: Vec<Endpoint> = endpoints
            .iter()
            .map(|ip| Endpoint { ip: ip.parse().unwrap(), port: TARGET_PORT, is_local: true, ready: true })
            .collect();
        let serving = endpoints.iter().map(|ep| SocketAddr::new(ep.ip, ep.port));
        let draining = draining.iter().map(|ip| SocketAddr::new(ip.parse().unwrap(), TARGET_PORT));
        let mut serving_endpoints: Vec<SocketAddr> = serving.chain(draining).collect();
        serving_endpoints.sort();
        let service = ServicePortPlan {
            name: name.clone(),
            cluster_ip: VIP.parse().unwrap(),
            port: SERVICE_PORT,
            protocol: Protocol::Udp,
            node_port: None,
            external_ips: Vec::new(),
            load_balancer_ips: Vec::new(),
            source_ranges: Vec::new(),
            affinity_timeout: None,
            cluster_endpoints: endpoints,
            local_endpoints: Vec::new(),
            internal: InternalTraffic { local: false, masquerade: MasqueradeWhen::Never, no_endpoints: None },
            external: None,
            health_check_node_port: None,
            accelerate: false,
            serving_endpoints,
        };
        services.insert(name, Arc::new(service));
    }
    FamilyPlan {
        family: IpFamily::V4,
        node: NodePlan {
            node_ip: Some(IpAddr::from([198, 18, 1, 1])),
            local_traffic: LocalTraffic::Undetectable,
            nodeport_addresses: NodePortAddresses::AllLocal(Vec::new()),
            snat: SnatPolicy::masquerade(),
            service_cidrs: Vec::new(),
            acceleration: false,
        },
        services,
    }
}

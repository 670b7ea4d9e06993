//! The standard topology: two nodes and an external client on one LAN, pods behind the nodes.
//!
//! `node` is where the proxy under test runs; `node2` is a remote node whose pods are reached
//! through it; `external` is a client outside the cluster that routes service, LoadBalancer and
//! pod ranges to the nodes. Pods attach to their node either routed (one veth per pod, the
//! node routes a /32 and /128 to it) or through a bridge (`cbr0`), because detect-local modes
//! `InterfaceNamePrefix` and `BridgeInterface` need each style. Addresses are in
//! [`crate::topology`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::echo::EchoServer;
use crate::error::{Result, TestbedError};
use crate::netns::Netns;
use crate::probe::Proto;
use crate::topology::*;

/// Settings for every namespace of the testbed: IPv6 addresses usable at once (no duplicate
/// address detection), and no ICMP rate limiting, so that a reject answers every probe of a
/// burst instead of turning into an apparent drop after a few.
const COMMON_SYSCTLS: [(&str, &str); 6] = [
    ("net.ipv6.conf.all.accept_dad", "0"),
    ("net.ipv6.conf.default.accept_dad", "0"),
    ("net.ipv4.icmp_ratemask", "0"),
    ("net.ipv4.icmp_ratelimit", "0"),
    ("net.ipv6.icmp.ratemask", ""),
    ("net.ipv6.icmp.ratelimit", "0"),
];

/// How long a new link may take to become usable before building the testbed fails.
const LINK_UP_TIMEOUT: Duration = Duration::from_secs(10);

/// Linux limits interface names to 15 bytes.
const MAX_IFNAME: usize = 15;

/// Which node a pod lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Where {
    Node,
    Node2,
}

/// How pods attach to their node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodNetworking {
    /// One veth per pod named `<iface_prefix><host-number>` in the node, a /32 and /128 route
    /// to the pod over it (the Calico pattern); pods use [`ROUTED_GATEWAY_V4`] (answered by
    /// proxy ARP, no IPv4 address on the node's veth) and [`ROUTED_GATEWAY_V6`] (a link-local
    /// address of the node's veth) as gateways.
    Routed { iface_prefix: String },
    /// Pod veths (`veth<host-number>`) are ports of bridge `name` in the node, which holds the
    /// first address of the node's pod CIDR (`198.18.16.1/24`, `fd00:10:16::1/64`) — the pods'
    /// gateway.
    Bridge { name: String },
}

impl Default for PodNetworking {
    fn default() -> Self {
        PodNetworking::Routed { iface_prefix: "veth".into() }
    }
}

/// Builds a [`Testbed`].
#[derive(Debug, Clone, Default)]
pub struct TestbedBuilder {
    pod_networking: PodNetworking,
}

impl TestbedBuilder {
    /// How pods attach to both nodes (default: routed veths with prefix `veth`).
    pub fn pod_networking(mut self, pod_networking: PodNetworking) -> Self {
        self.pod_networking = pod_networking;
        self
    }

    /// Creates the namespaces, links, addresses and routes.
    pub fn build(self) -> Result<Testbed> {
        Testbed::create(self.pod_networking)
    }
}

/// A pod: its own namespace with `eth0`, and the echo backends it runs.
#[derive(Debug)]
pub struct Pod {
    // Declared before `netns` so backends stop before the namespace is deleted.
    servers: Mutex<Vec<EchoServer>>,
    name: String,
    location: Where,
    ipv4: Ipv4Addr,
    ipv6: Ipv6Addr,
    host_iface: String,
    netns: Netns,
}

impl Pod {
    /// The pod's name; its backends answer with it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node it runs on.
    pub fn location(&self) -> Where {
        self.location
    }

    pub fn ipv4(&self) -> Ipv4Addr {
        self.ipv4
    }

    pub fn ipv6(&self) -> Ipv6Addr {
        self.ipv6
    }

    /// Both addresses, IPv4 first.
    pub fn ips(&self) -> [IpAddr; 2] {
        [self.ipv4.into(), self.ipv6.into()]
    }

    /// The pod's address of the same family as `like`.
    pub fn ip_like(&self, like: IpAddr) -> IpAddr {
        match like {
            IpAddr::V4(_) => self.ipv4.into(),
            IpAddr::V6(_) => self.ipv6.into(),
        }
    }

    /// The node-side end of the pod's veth (`veth10`, …).
    pub fn host_iface(&self) -> &str {
        &self.host_iface
    }

    /// The pod's network namespace (to probe from it, or run commands in it).
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// Starts echo backends named after the pod on these ports (all addresses, both families).
    /// They run until [`Pod::stop_serving`] or until the pod is dropped.
    pub fn serve(&self, ports: &[(Proto, u16)]) -> Result<()> {
        let server = EchoServer::start(&self.netns, &self.name, ports)?;
        self.servers.lock().unwrap_or_else(PoisonError::into_inner).push(server);
        Ok(())
    }

    /// Like [`Pod::serve`], but TCP connections stay open and every line sent is answered (see
    /// [`EchoServer::start_conversations`]): for long-lived connections.
    pub fn serve_conversations(&self, ports: &[(Proto, u16)]) -> Result<()> {
        let server = EchoServer::start_conversations(&self.netns, &self.name, ports)?;
        self.servers.lock().unwrap_or_else(PoisonError::into_inner).push(server);
        Ok(())
    }

    /// Stops every backend of this pod; afterwards its ports refuse connections.
    pub fn stop_serving(&self) {
        let servers = std::mem::take(&mut *self.servers.lock().unwrap_or_else(PoisonError::into_inner));
        drop(servers);
    }
}

/// Pods created so far, the next host number per node, and the secondary NIC count.
#[derive(Debug, Default)]
struct Pods {
    all: Vec<Arc<Pod>>,
    /// Host numbers in use on each node's pod CIDR.
    used_hosts: [std::collections::BTreeSet<u8>; 2],
    /// Secondary node interfaces added so far (names their LAN-side peers).
    extra_nics: u32,
}

/// The standard topology. Everything it created is deleted on drop, pods first.
#[derive(Debug)]
pub struct Testbed {
    pods: Mutex<Pods>,
    pod_networking: PodNetworking,
    node: Netns,
    node2: Netns,
    external: Netns,
    lan: Netns,
}

impl Testbed {
    /// A builder; `Testbed::builder().build()` gives the default (routed) topology.
    pub fn builder() -> TestbedBuilder {
        TestbedBuilder::default()
    }

    /// The default topology.
    pub fn new() -> Result<Testbed> {
        Testbed::builder().build()
    }

    /// The node kproxy runs on (`198.18.0.2`, `fd00:18::2` on `eth0`).
    pub fn node(&self) -> &Netns {
        &self.node
    }

    /// The remote node (`198.18.0.3`, `fd00:18::3`).
    pub fn node2(&self) -> &Netns {
        &self.node2
    }

    /// The external client (`198.18.0.10`, `fd00:18::10`).
    pub fn external(&self) -> &Netns {
        &self.external
    }

    /// The namespace holding the LAN bridge `br0`.
    pub fn lan(&self) -> &Netns {
        &self.lan
    }

    /// The node namespace for `location`.
    pub fn host(&self, location: Where) -> &Netns {
        match location {
            Where::Node => &self.node,
            Where::Node2 => &self.node2,
        }
    }

    /// How pods attach to the nodes.
    pub fn pod_networking(&self) -> &PodNetworking {
        &self.pod_networking
    }

    /// Every pod, in creation order.
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.lock().unwrap_or_else(PoisonError::into_inner).all.clone()
    }

    /// The pod called `name`.
    pub fn pod(&self, name: &str) -> Option<Arc<Pod>> {
        self.pods.lock().unwrap_or_else(PoisonError::into_inner).all.iter().find(|p| p.name == name).cloned()
    }

    /// Names of every namespace of this testbed, pods included.
    pub fn netns_names(&self) -> Vec<String> {
        let mut names: Vec<String> =
            [&self.lan, &self.node, &self.node2, &self.external].iter().map(|n| n.name().to_owned()).collect();
        names.extend(self.pods().iter().map(|p| p.netns.name().to_owned()));
        names
    }

    /// Creates a pod on `location` with the next free addresses of that node's pod CIDR
    /// (`198.18.16.10`/`fd00:10:16::a` first on `node`, `198.18.17.10`/`fd00:10:17::a` on
    /// `node2`) and a default route via the node.
    pub fn add_pod(&self, name: &str, location: Where) -> Result<Arc<Pod>> {
        self.add_pod_with(name, location, None)
    }

    /// Adds a pod with a chosen host number in its node's pod CIDR (e.g. 13 for 198.18.16.13 and
    /// fd00:10:16::d), so a sandbox can match a cluster described elsewhere (the shipped examples).
    pub fn add_pod_at(&self, name: &str, location: Where, host_number: u8) -> Result<Arc<Pod>> {
        self.add_pod_with(name, location, Some(host_number))
    }

    fn add_pod_with(&self, name: &str, location: Where, wanted: Option<u8>) -> Result<Arc<Pod>> {
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(TestbedError::Invalid(format!("pod name {name:?} must be one non-empty word")));
        }
        let host_number = {
            let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
            if pods.all.iter().any(|p| p.name == name) {
                return Err(TestbedError::Invalid(format!("pod {name} exists already")));
            }
            let used = &mut pods.used_hosts[location as usize];
            let number = match wanted {
                Some(n) if (2..255).contains(&n) && !used.contains(&n) => n,
                Some(n) => return Err(TestbedError::Invalid(format!("pod host number {n} is taken or out of range"))),
                None => (FIRST_POD_HOST..255)
                    .find(|n| !used.contains(n))
                    .ok_or_else(|| TestbedError::Invalid("no pod addresses left on this node".into()))?,
            };
            used.insert(number);
            number
        };
        let (cidr4, cidr6) = pod_cidrs(location);
        let ipv4 = host_v4(cidr4, host_number);
        let ipv6 = host_v6(cidr6, host_number);
        let host_iface = match &self.pod_networking {
            PodNetworking::Routed { iface_prefix } => format!("{iface_prefix}{host_number}"),
            PodNetworking::Bridge { .. } => format!("veth{host_number}"),
        };
        if host_iface.len() > MAX_IFNAME {
            return Err(TestbedError::Invalid(format!("interface name {host_iface} is longer than {MAX_IFNAME}")));
        }

        let netns = Netns::new(&format!("pod-{name}"))?;
        netns.sysctls(&COMMON_SYSCTLS)?;
        let host = self.host(location);
        host.ip(["link", "add", &host_iface, "type", "veth", "peer", "name", POD_IFACE, "netns", netns.name()])?;

        let (host_cmds, pod_cmds) = match &self.pod_networking {
            PodNetworking::Routed { .. } => (
                vec![
                    format!("link set {host_iface} up"),
                    format!("addr add {ROUTED_GATEWAY_V6}/64 dev {host_iface} nodad"),
                    format!("route add {ipv4}/32 dev {host_iface}"),
                    format!("route add {ipv6}/128 dev {host_iface}"),
                ],
                vec![
                    format!("link set {POD_IFACE} up"),
                    format!("addr add {ipv4}/32 dev {POD_IFACE}"),
                    format!("addr add {ipv6}/128 dev {POD_IFACE} nodad"),
                    format!("route add {ROUTED_GATEWAY_V4}/32 dev {POD_IFACE} scope link"),
                    format!("route add default via {ROUTED_GATEWAY_V4} dev {POD_IFACE}"),
                    format!("route add ::/0 via {ROUTED_GATEWAY_V6} dev {POD_IFACE}"),
                ],
            ),
            PodNetworking::Bridge { name: bridge } => (
                vec![format!("link set {host_iface} master {bridge} up")],
                vec![
                    format!("link set {POD_IFACE} up"),
                    format!("addr add {ipv4}/{} dev {POD_IFACE}", cidr4.prefix_len()),
                    format!("addr add {ipv6}/{} dev {POD_IFACE} nodad", cidr6.prefix_len()),
                    format!("route add default via {}", host_v4(cidr4, 1)),
                    format!("route add ::/0 via {}", host_v6(cidr6, 1)),
                ],
            ),
        };
        if matches!(self.pod_networking, PodNetworking::Routed { .. }) {
            // The node answers the pod's ARP for the IPv4 gateway by proxy, at once, and holds
            // no IPv4 address on the veth — so traffic the node sends to a pod leaves with the
            // node's own address, as with Calico.
            host.sysctls(&[
                (&format!("net/ipv4/conf/{host_iface}/proxy_arp"), "1"),
                (&format!("net/ipv4/neigh/{host_iface}/proxy_delay"), "0"),
            ])?;
        }
        host.ip_batch(&host_cmds)?;
        netns.ip_batch(&pod_cmds)?;
        let mut host_links = vec![host_iface.as_str()];
        if let PodNetworking::Bridge { name: bridge } = &self.pod_networking {
            host_links.push(bridge);
        }
        host.wait_links_up(&host_links, LINK_UP_TIMEOUT)?;
        netns.wait_links_up(&[POD_IFACE], LINK_UP_TIMEOUT)?;

        let pod = Arc::new(Pod {
            servers: Mutex::new(Vec::new()),
            name: name.to_owned(),
            location,
            ipv4,
            ipv6,
            host_iface,
            netns,
        });
        self.pods.lock().unwrap_or_else(PoisonError::into_inner).all.push(Arc::clone(&pod));
        tracing::debug!(pod = name, ?location, %ipv4, %ipv6, "pod created");
        Ok(pod)
    }

    /// Adds another interface to `node` holding `addrs`: a veth whose peer sits, up but
    /// unattached, in the LAN namespace — a second NIC with carrier and nothing behind it, an
    /// extra local address source (e.g. the NIC whose address MASQUERADE would pick). Steer
    /// routes to it with `node().ip(["route", "replace", …])`.
    pub fn add_node_interface(&self, name: &str, addrs: &[IpNet]) -> Result<()> {
        if name.is_empty() || name.len() > MAX_IFNAME || name.contains(char::is_whitespace) {
            return Err(TestbedError::Invalid(format!("bad interface name {name:?}")));
        }
        let peer = {
            let mut pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
            pods.extra_nics += 1;
            format!("nic{}", pods.extra_nics)
        };
        self.node.ip(["link", "add", name, "type", "veth", "peer", "name", &peer, "netns", self.lan.name()])?;
        self.lan.ip(["link", "set", &peer, "up"])?;
        let mut cmds = Vec::new();
        for addr in addrs {
            let nodad = if addr.addr().is_ipv6() { " nodad" } else { "" };
            cmds.push(format!("addr add {addr} dev {name}{nodad}"));
        }
        cmds.push(format!("link set {name} up"));
        self.node.ip_batch(&cmds)?;
        self.node.wait_links_up(&[name], LINK_UP_TIMEOUT)
    }

    fn create(pod_networking: PodNetworking) -> Result<Testbed> {
        let stale = Netns::remove_stale();
        if stale > 0 {
            tracing::info!(stale, "removed namespaces left behind by dead test processes");
        }
        if let PodNetworking::Routed { iface_prefix } = &pod_networking
            && (iface_prefix.is_empty() || iface_prefix.len() + 3 > MAX_IFNAME)
        {
            return Err(TestbedError::Invalid(format!("interface prefix {iface_prefix:?} must be 1..=12 bytes")));
        }
        // Each namespace is owned by `testbed` as soon as it exists, so a failure below
        // deletes everything created so far.
        let testbed = Testbed {
            pods: Mutex::new(Pods::default()),
            pod_networking,
            node: Netns::new("node")?,
            node2: Netns::new("node2")?,
            external: Netns::new("external")?,
            lan: Netns::new("lan")?,
        };
        testbed.configure()?;
        Ok(testbed)
    }

    fn configure(&self) -> Result<()> {
        let router = [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            // Traffic DNATed to node2's pods leaves the LAN port it came in on; a redirect
            // would teach `external` a shortcut around the node.
            ("net.ipv4.conf.all.send_redirects", "0"),
            ("net.ipv4.conf.default.send_redirects", "0"),
        ];
        for host in [&self.node, &self.node2] {
            host.sysctls(&COMMON_SYSCTLS)?;
            host.sysctls(&router)?;
        }
        self.external.sysctls(&COMMON_SYSCTLS)?;
        self.external.sysctls(&[
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            ("net.ipv4.conf.all.accept_redirects", "0"),
            ("net.ipv4.conf.default.accept_redirects", "0"),
            ("net.ipv6.conf.all.accept_redirects", "0"),
            ("net.ipv6.conf.default.accept_redirects", "0"),
        ])?;
        self.lan.sysctls(&[("net.ipv6.conf.all.disable_ipv6", "1"), ("net.ipv6.conf.default.disable_ipv6", "1")])?;

        self.lan.ip_batch(&[
            format!("link add {LAN_BRIDGE} type bridge mcast_snooping 0"),
            format!("link set {LAN_BRIDGE} up"),
        ])?;
        let members = [
            (&self.node, "node", NODE_IP_V4, NODE_IP_V6),
            (&self.node2, "node2", NODE2_IP_V4, NODE2_IP_V6),
            (&self.external, "external", EXTERNAL_IP_V4, EXTERNAL_IP_V6),
        ];
        for (host, port, v4, v6) in members {
            host.ip(["link", "add", UPLINK_IFACE, "type", "veth", "peer", "name", port, "netns", self.lan.name()])?;
            self.lan.ip(["link", "set", port, "master", LAN_BRIDGE, "up"])?;
            host.ip_batch(&[
                format!("addr add {v4}/{} dev {UPLINK_IFACE}", LAN_V4.prefix_len()),
                format!("addr add {v6}/{} dev {UPLINK_IFACE} nodad", LAN_V6.prefix_len()),
                format!("link set {UPLINK_IFACE} up"),
            ])?;
        }

        for host in [&self.node, &self.node2, &self.external] {
            host.wait_links_up(&[UPLINK_IFACE], LINK_UP_TIMEOUT)?;
        }
        self.lan.wait_links_up(&[LAN_BRIDGE, "node", "node2", "external"], LINK_UP_TIMEOUT)?;

        self.node.ip_batch(&[
            format!("route add {NODE2_POD_CIDR_V4} via {NODE2_IP_V4}"),
            format!("route add {NODE2_POD_CIDR_V6} via {NODE2_IP_V6}"),
            format!("route add default via {EXTERNAL_IP_V4}"),
            format!("route add ::/0 via {EXTERNAL_IP_V6}"),
        ])?;
        self.node2.ip_batch(&[
            format!("route add {NODE_POD_CIDR_V4} via {NODE_IP_V4}"),
            format!("route add {NODE_POD_CIDR_V6} via {NODE_IP_V6}"),
            format!("route add default via {EXTERNAL_IP_V4}"),
            format!("route add ::/0 via {EXTERNAL_IP_V6}"),
        ])?;
        self.external.ip_batch(&[
            format!("route add {NODE_POD_CIDR_V4} via {NODE_IP_V4}"),
            format!("route add {NODE_POD_CIDR_V6} via {NODE_IP_V6}"),
            format!("route add {NODE2_POD_CIDR_V4} via {NODE2_IP_V4}"),
            format!("route add {NODE2_POD_CIDR_V6} via {NODE2_IP_V6}"),
            format!("route add {SERVICE_CIDR_V4} via {NODE_IP_V4}"),
            format!("route add {SERVICE_CIDR_V6} via {NODE_IP_V6}"),
            format!("route add {LOADBALANCER_V4} via {NODE_IP_V4}"),
            format!("route add {LOADBALANCER_V6} via {NODE_IP_V6}"),
        ])?;

        if let PodNetworking::Bridge { name } = &self.pod_networking {
            for location in [Where::Node, Where::Node2] {
                let (cidr4, cidr6) = pod_cidrs(location);
                self.host(location).ip_batch(&[
                    format!("link add {name} type bridge mcast_snooping 0"),
                    format!("link set {name} up"),
                    format!("addr add {}/{} dev {name}", host_v4(cidr4, 1), cidr4.prefix_len()),
                    format!("addr add {}/{} dev {name} nodad", host_v6(cidr6, 1), cidr6.prefix_len()),
                ])?;
            }
        }
        Ok(())
    }
}

fn pod_cidrs(location: Where) -> (Ipv4Net, Ipv6Net) {
    match location {
        Where::Node => (NODE_POD_CIDR_V4, NODE_POD_CIDR_V6),
        Where::Node2 => (NODE2_POD_CIDR_V4, NODE2_POD_CIDR_V6),
    }
}

/// Host `n` of a /24.
fn host_v4(cidr: Ipv4Net, n: u8) -> Ipv4Addr {
    let [a, b, c, _] = cidr.network().octets();
    Ipv4Addr::new(a, b, c, n)
}

/// Host `n` of a /64.
fn host_v6(cidr: Ipv6Net, n: u8) -> Ipv6Addr {
    let s = cidr.network().segments();
    Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, u16::from(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_addresses() {
        assert_eq!(host_v4(NODE_POD_CIDR_V4, 10), Ipv4Addr::new(198, 18, 16, 10));
        assert_eq!(host_v6(NODE2_POD_CIDR_V6, 10).to_string(), "fd00:10:17::a");
        assert!(CLUSTER_CIDR_V4.contains(&NODE2_POD_CIDR_V4) && CLUSTER_CIDR_V4.contains(&NODE_POD_CIDR_V4));
        assert!(CLUSTER_CIDR_V6.contains(&NODE2_POD_CIDR_V6) && CLUSTER_CIDR_V6.contains(&NODE_POD_CIDR_V6));
        assert!(!CLUSTER_CIDR_V4.contains(&NODE_IP_V4));
    }
}

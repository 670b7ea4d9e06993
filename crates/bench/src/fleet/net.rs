//! The fleet's network: one namespace for the control plane (etcd on its loopback, kube-apiserver
//! on the bridge `br0`, 198.51.100.1) and one per node, each with its own `eth0` on that bridge
//! (198.51.100.10 + k, fd00:5100::10 + k): the proxies reach the API server over a link, as
//! kube-proxy on a node does, from an address of their own, so that what the API server sends
//! each of them can be counted apart.
//!
//! The counting: an nftables table in the control plane's namespace with one named counter per
//! node and direction, chosen by a map from the node's address, on every TCP packet from or to
//! the API server's port ([`ByteCounters`]). It counts the IP packets the API server's sockets
//! hand to the network (TLS records, TCP and IP headers, retransmissions; a TSO/GSO burst
//! counted once, with one set of headers): the bytes it wrote to each proxy, whatever the
//! proxy's encoding or compression.
//!
//! Addresses: 198.51.100.0/24 and fd00:5100::/64 (test ranges), apart from every address the
//! benchmark's objects use (198.18.0.0/15, 203.0.113.0/24, fd00:10::/32, fd00:96::/32), so no
//! proxy's rules ever apply to the API server's traffic.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use anyhow::Context as _;
use kproxy_testbed::Netns;

use super::interrupt;

/// The API server's address, on the bridge.
pub const PLANE_V4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const PLANE_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x5100, 0, 0, 0, 0, 0, 1);
/// Nodes the /24 holds after the first ten addresses.
pub const MAX_NODES: usize = 240;
/// The nftables table that counts the API server's bytes (control plane namespace).
const COUNTER_TABLE: &str = "kproxy-bench-fleet";

/// Node `k`'s address (k from 0).
pub fn node_v4(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 51, 100, 10 + k as u8)
}

pub fn node_v6(k: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x5100, 0, 0, 0, 0, 0, 0x10 + k as u16)
}

/// The node's name, as its Node object and `--hostname-override` carry it: `node-1` … (the
/// benchmark's endpoints name nodes `node-1` to `node-100`, so some are each proxy's own).
pub fn node_name(k: usize) -> String {
    format!("node-{}", k + 1)
}

/// The namespaces and links; removed on drop.
pub struct Network {
    // Dropped before `plane` (field order): a node's veth goes with the node's namespace.
    pub nodes: Vec<Netns>,
    pub plane: Netns,
}

impl Network {
    /// The control plane's namespace and bridge, and `nodes` node namespaces linked to it.
    pub fn build(nodes: usize) -> anyhow::Result<Network> {
        anyhow::ensure!(nodes <= MAX_NODES, "{nodes} nodes: at most {MAX_NODES}");
        let plane = owned(Netns::new("fleet-plane")?);
        let mut network = Network { nodes: Vec::new(), plane };
        network.plane.ip_batch(&[
            "link add br0 type bridge".to_owned(),
            format!("addr add {PLANE_V4}/24 dev br0"),
            format!("addr add {PLANE_V6}/64 dev br0 nodad"),
            "link set br0 up".to_owned(),
        ])?;
        for k in 0..nodes {
            let ns = owned(Netns::new(&format!("fleet-node-{k}"))?);
            network.nodes.push(ns);
            let ns = &network.nodes[k];
            network
                .plane
                .ip_batch(&[
                    format!("link add vn{k} type veth peer name eth0 netns {}", ns.name()),
                    format!("link set vn{k} master br0 up"),
                ])
                .with_context(|| format!("linking node {k}"))?;
            ns.ip_batch(&[
                format!("addr add {}/24 dev eth0", node_v4(k)),
                format!("addr add {}/64 dev eth0 nodad", node_v6(k)),
                "link set eth0 up".to_owned(),
                format!("route add default via {PLANE_V4}"),
                format!("route add default via {PLANE_V6}"),
            ])?;
        }
        let ports: Vec<String> = (0..nodes).map(|k| format!("vn{k}")).collect();
        let mut links: Vec<&str> = ports.iter().map(String::as_str).collect();
        links.push("br0");
        network.plane.wait_links_up(&links, Duration::from_secs(60))?;
        for ns in &network.nodes {
            ns.wait_links_up(&["eth0"], Duration::from_secs(60))?;
        }
        Ok(network)
    }
}

/// Recorded for the signal handler until it is dropped.
fn owned(ns: Netns) -> Netns {
    interrupt::netns(ns.name());
    ns
}

impl Drop for Network {
    fn drop(&mut self) {
        for ns in self.nodes.iter().chain(std::iter::once(&self.plane)) {
            interrupt::forget_netns(ns.name());
        }
    }
}

/// Bytes the API server sent to and received from each node, counted in the control plane's
/// namespace (see the module's comment).
pub struct ByteCounters<'a> {
    plane: &'a Netns,
    nodes: usize,
}

/// What the counters held at one moment: per node, (bytes from the API server, bytes to it).
#[derive(Debug, Clone)]
pub struct Bytes(pub Vec<(u64, u64)>);

impl Bytes {
    /// Bytes the API server sent to the first `nodes` nodes since `before`.
    pub fn sent_since(&self, before: &Bytes, nodes: usize) -> u64 {
        self.0.iter().zip(&before.0).take(nodes).map(|(a, b)| a.0 - b.0).sum()
    }

    /// Bytes the first `nodes` nodes sent to the API server since `before`.
    pub fn received_since(&self, before: &Bytes, nodes: usize) -> u64 {
        self.0.iter().zip(&before.0).take(nodes).map(|(a, b)| a.1 - b.1).sum()
    }

    /// Per node, bytes sent since `before`, for the first `nodes` nodes.
    pub fn sent_per_node(&self, before: &Bytes, nodes: usize) -> Vec<u64> {
        self.0.iter().zip(&before.0).take(nodes).map(|(a, b)| a.0 - b.0).collect()
    }
}

impl<'a> ByteCounters<'a> {
    /// Loads the counting table for an API server on `port` and `nodes` nodes.
    pub fn install(plane: &'a Netns, port: u16, nodes: usize) -> anyhow::Result<ByteCounters<'a>> {
        let mut script = format!("table inet {COUNTER_TABLE} {{\n");
        for k in 0..nodes {
            script.push_str(&format!("  counter to-{k} {{ }}\n  counter from-{k} {{ }}\n"));
        }
        let map = |name: &str, dir: &str| {
            let elements: Vec<String> = (0..nodes).map(|k| format!("{} : \"{dir}-{k}\"", node_v4(k))).collect();
            format!("  map {name} {{ type ipv4_addr : counter; elements = {{ {} }}; }}\n", elements.join(", "))
        };
        script.push_str(&map("to-node", "to"));
        script.push_str(&map("from-node", "from"));
        script.push_str(&format!(
            "  chain out {{ type filter hook output priority 0; policy accept; \
             tcp sport {port} counter name ip daddr map @to-node; }}\n  \
             chain in {{ type filter hook input priority 0; policy accept; \
             tcp dport {port} counter name ip saddr map @from-node; }}\n}}\n"
        ));
        plane.nft(&script).context("loading the byte counters")?;
        Ok(ByteCounters { plane, nodes })
    }

    pub fn read(&self) -> anyhow::Result<Bytes> {
        let listing = self.plane.exec_ok("nft", &["-j", "list", "counters", "table", "inet", COUNTER_TABLE])?;
        let json: serde_json::Value = serde_json::from_str(&listing).context("nft's JSON")?;
        let mut bytes = vec![(0, 0); self.nodes];
        for item in json["nftables"].as_array().into_iter().flatten() {
            let counter = &item["counter"];
            let (Some(name), Some(value)) = (counter["name"].as_str(), counter["bytes"].as_u64()) else { continue };
            let (to, k) = match (name.strip_prefix("to-"), name.strip_prefix("from-")) {
                (Some(k), _) => (true, k),
                (_, Some(k)) => (false, k),
                _ => continue,
            };
            let Some(slot) = k.parse::<usize>().ok().and_then(|k| bytes.get_mut(k)) else { continue };
            if to {
                slot.0 = value;
            } else {
                slot.1 = value;
            }
        }
        Ok(Bytes(bytes))
    }
}

//! The addresses of the standard testbed, as constants the packet suite can name.
//!
//! Everything lives in ranges reserved for benchmarking/documentation/ULA (198.18.0.0/15,
//! 203.0.113.0/24, fd00::/8), inside namespaces the test made, so no packet can leave the host.
//!
//! ```text
//!                  lan netns: bridge br0 (ports "node", "node2", "external")
//!        ┌───────────────────────────┼───────────────────────────┐
//!   node: eth0 198.18.0.2      node2: eth0 198.18.0.3      external: eth0 198.18.0.10
//!         fd00:18::2/64              fd00:18::3/64                   fd00:18::10/64
//!   pods 198.18.16.0/24        pods 198.18.17.0/24         routes pod CIDRs to their node,
//!        fd00:10:16::/64            fd00:10:17::/64         service/LB ranges to node
//! ```

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};

/// The node kproxy runs on.
pub const NODE_IP_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const NODE_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0, 0x2);
/// A remote node (no proxy runs there).
pub const NODE2_IP_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 3);
pub const NODE2_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0, 0x3);
/// A client outside the cluster; also the default gateway of both nodes. It does not forward,
/// so traffic the nodes send "to the internet" is silently dropped there.
pub const EXTERNAL_IP_V4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 10);
pub const EXTERNAL_IP_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0, 0x10);

/// The shared L2 segment of node, node2 and external.
pub const LAN_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 0, 0), 24);
pub const LAN_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0, 0), 64);

/// Pod CIDR of `node` (the node's `podCIDR`; detect-local mode NodeCIDR).
pub const NODE_POD_CIDR_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 16, 0), 24);
pub const NODE_POD_CIDR_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x10, 0x16, 0, 0, 0, 0, 0), 64);
/// Pod CIDR of `node2`.
pub const NODE2_POD_CIDR_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 17, 0), 24);
pub const NODE2_POD_CIDR_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x10, 0x17, 0, 0, 0, 0, 0), 64);
/// The cluster CIDR covering both nodes' pod CIDRs (`--cluster-cidr`, detect-local ClusterCIDR).
pub const CLUSTER_CIDR_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 16, 0), 20);
pub const CLUSTER_CIDR_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x10, 0, 0, 0, 0, 0, 0), 32);

/// Service ClusterIP ranges; `external` routes them to `node`.
pub const SERVICE_CIDR_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(198, 18, 128, 0), 20);
pub const SERVICE_CIDR_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0), 112);
/// LoadBalancer / external IP ranges; `external` routes them to `node`.
pub const LOADBALANCER_V4: Ipv4Net = Ipv4Net::new_assert(Ipv4Addr::new(203, 0, 113, 0), 24);
pub const LOADBALANCER_V6: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0xfd00, 0x203, 0, 0, 0, 0, 0, 0), 64);

/// With [`crate::PodNetworking::Routed`] pods route everything via these gateways: the node
/// answers ARP for the IPv4 one by proxy, and holds the IPv6 one on every pod veth (the
/// Calico pattern).
pub const ROUTED_GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
pub const ROUTED_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// Interface names.
pub const UPLINK_IFACE: &str = "eth0";
pub const POD_IFACE: &str = "eth0";
pub const LAN_BRIDGE: &str = "br0";

/// The first pod on a node gets host number 10 (`198.18.16.10`, `fd00:10:16::a`), the next 11…
pub const FIRST_POD_HOST: u8 = 10;

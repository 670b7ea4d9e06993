//! The cluster's network: a "wire" namespace with a bridge that every node's `eth0` plugs into,
//! and one namespace per node, in IPv4, IPv6 or both ([`IpFamilies`]). Only test ranges are
//! used (198.18.0.0/15 and the ULA range fd00::/8), and nothing is added to the machine's own
//! namespace.
//!
//! ```text
//!                  IPv4                          IPv6
//! the wire         198.18.0.0/24                 fd00:18::/64
//!   wire bridge    198.18.0.1                    fd00:18::1      (API server, e2e.test, gateway)
//!   node N         198.18.0.(10+N)               fd00:18::(10+N) (hex digits: node 1 = ::11)
//! Services         198.18.128.0/17               fd00:18:128::/108
//!   kubernetes     198.18.128.1                  fd00:18:128::1
//!   cluster DNS    198.18.128.10                 fd00:18:128::a
//! pods             198.19.0.0/16, a /24 a node   fd00:19::/48, a /64 a node (kube-controller-manager)
//! ```
//!
//! A dual-stack cluster is IPv4-primary (kind's default): the API server advertises its IPv4
//! address, Services are `SingleStack` IPv4 unless asked otherwise, and each node lists its
//! IPv4 address first. An IPv6 cluster has no IPv4 address on the wire at all (each namespace's
//! loopback keeps 127.0.0.1, as every Linux host does).
//!
//! IPv6 addresses are added with `nodad` and every namespace gets `accept_dad=0` before its
//! links exist (the CNI bridge and pod veths inherit it; the bridge plugin turns DAD off inside
//! pods itself when hairpin mode is on): duplicate address detection would hold each address
//! "tentative" for a second or more, and a server binding it meanwhile fails.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::ledger::{Ledger, Resource};

/// The default cluster name: namespaces `kpc-wire`, `kpc-node1`, … (never `kpt-`, the testbed's
/// prefix, whose stale-namespace sweeper would take them).
pub const DEFAULT_CLUSTER: &str = "kpc";

/// The IP families of a cluster (`--ip-family`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IpFamilies {
    /// IPv4 only.
    #[default]
    Ipv4,
    /// IPv6 only: no IPv4 address on the wire.
    Ipv6,
    /// Both, IPv4 primary.
    Dual,
}

impl IpFamilies {
    /// `ipv4`, `ipv6` or `dual`.
    pub fn parse(text: &str) -> Option<IpFamilies> {
        match text {
            "ipv4" => Some(IpFamilies::Ipv4),
            "ipv6" => Some(IpFamilies::Ipv6),
            "dual" => Some(IpFamilies::Dual),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            IpFamilies::Ipv4 => "ipv4",
            IpFamilies::Ipv6 => "ipv6",
            IpFamilies::Dual => "dual",
        }
    }

    /// The families, primary first.
    pub fn families(self) -> &'static [Family] {
        match self {
            IpFamilies::Ipv4 => &[Family::V4],
            IpFamilies::Ipv6 => &[Family::V6],
            IpFamilies::Dual => &[Family::V4, Family::V6],
        }
    }

    pub fn primary(self) -> Family {
        self.families()[0]
    }

    /// `--service-cluster-ip-range` (primary first).
    pub fn service_cidrs(self) -> String {
        self.families().iter().map(|f| f.service_cidr()).collect::<Vec<_>>().join(",")
    }

    /// kube-controller-manager's `--cluster-cidr` (primary first).
    pub fn cluster_cidrs(self) -> String {
        self.families().iter().map(|f| f.cluster_cidr()).collect::<Vec<_>>().join(",")
    }

    /// Node `index`'s addresses, primary first (the kubelet's `--node-ip`).
    pub fn node_ips(self, index: u8) -> Vec<IpAddr> {
        self.families().iter().map(|f| f.node_ip(index)).collect()
    }
}

/// One IP family and its part of the address plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    /// The EndpointSlice `addressType` and ipFamilies name: `IPv4` or `IPv6`.
    pub fn api_name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// The wire bridge's address: the API server binds it; every node's gateway.
    pub fn wire_ip(self) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
            Family::V6 => IpAddr::V6(Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0, 1)),
        }
    }

    /// The wire's prefix length.
    pub fn wire_prefix(self) -> u8 {
        match self {
            Family::V4 => 24,
            Family::V6 => 64,
        }
    }

    /// Node `index`'s (1-based) address: 198.18.0.(10+N) or fd00:18::(0x10+N), so that node 1 is
    /// `.11` and `::11` alike. Two clusters use the same addresses in different namespaces.
    pub fn node_ip(self, index: u8) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(Ipv4Addr::new(198, 18, 0, 10 + index)),
            Family::V6 => IpAddr::V6(Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0, 0x10 + u16::from(index))),
        }
    }

    /// The Service range. IPv6: a /108, the widest kube-apiserver accepts for the legacy
    /// allocator's bitmap.
    pub fn service_cidr(self) -> &'static str {
        match self {
            Family::V4 => "198.18.128.0/17",
            Family::V6 => "fd00:18:128::/108",
        }
    }

    /// The `kubernetes` Service's ClusterIP (first of the range).
    pub fn kubernetes_service_ip(self) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(Ipv4Addr::new(198, 18, 128, 1)),
            Family::V6 => IpAddr::V6(Ipv6Addr::new(0xfd00, 0x18, 0x128, 0, 0, 0, 0, 1)),
        }
    }

    /// The cluster DNS Service's ClusterIP.
    pub fn dns_service_ip(self) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(Ipv4Addr::new(198, 18, 128, 10)),
            Family::V6 => IpAddr::V6(Ipv6Addr::new(0xfd00, 0x18, 0x128, 0, 0, 0, 0, 0xa)),
        }
    }

    /// The pods' range (`--cluster-cidr`).
    pub fn cluster_cidr(self) -> &'static str {
        match self {
            Family::V4 => "198.19.0.0/16",
            Family::V6 => "fd00:19::/48",
        }
    }

    /// The prefix length of a node's pod range (`--node-cidr-mask-size-ipv4/-ipv6`).
    pub fn node_cidr_mask(self) -> u8 {
        match self {
            Family::V4 => 24,
            Family::V6 => 64,
        }
    }
}

/// `host:port` for a URL or a socket address: IPv6 in brackets.
pub fn host_port(ip: IpAddr, port: u16) -> String {
    std::net::SocketAddr::new(ip, port).to_string()
}

/// The wire namespace of cluster `cluster`.
pub fn wire_netns(cluster: &str) -> String {
    format!("{cluster}-wire")
}

/// The path of a namespace made with `ip netns add`.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// Node `index` (1-based) of `cluster`: its namespace name (its addresses are
/// [`Family::node_ip`]).
pub fn node_netns(cluster: &str, index: u8) -> String {
    format!("{cluster}-node{index}")
}

/// IPv6 switches every namespace of the cluster gets before its links are made: no duplicate
/// address detection (see the module doc), forwarding (the wire routes between nodes, a node
/// between its pods and the wire).
const IPV6_SYSCTLS: [(&str, &str); 5] = [
    ("net.ipv6.conf.all.accept_dad", "0"),
    ("net.ipv6.conf.default.accept_dad", "0"),
    ("net.ipv6.conf.all.forwarding", "1"),
    ("net.ipv6.conf.all.disable_ipv6", "0"),
    ("net.ipv6.conf.default.disable_ipv6", "0"),
];

/// `addr add` of `ip/prefix` (IPv6 without duplicate address detection).
fn addr_add(ip: IpAddr, prefix: u8, dev: &str) -> String {
    let nodad = if ip.is_ipv6() { " nodad" } else { "" };
    format!("addr add {ip}/{prefix} dev {dev}{nodad}")
}

/// Makes the wire namespace and its bridge (recorded first, so a failure half way is undone).
pub fn make_wire(ledger: &mut Ledger, cluster: &str, families: IpFamilies) -> Result<()> {
    let wire = wire_netns(cluster);
    ledger.add(Resource::Netns { name: wire.clone() })?;
    ip(&["netns", "add", &wire])?;
    let n = wire.as_str();
    // Route between nodes (pod CIDRs) without NAT, and without telling nodes to go direct.
    sysctls(
        n,
        &[
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv4.conf.all.send_redirects", "0"),
            ("net.ipv4.conf.default.send_redirects", "0"),
        ],
    )?;
    sysctls(n, &IPV6_SYSCTLS)?;
    let mut lines = vec!["link set lo up".to_owned(), "link add wire0 type bridge".into()];
    for family in families.families() {
        lines.push(addr_add(family.wire_ip(), family.wire_prefix(), "wire0"));
    }
    lines.push("link set wire0 up".into());
    batch(n, &lines)?;
    // Nothing leaves the cluster: whatever a node sends beyond the cluster's ranges (an image
    // pull, a lookup through the machine's resolver) fails at once, here. Both families, so an
    // IPv6-only cluster's stray IPv4 (and the reverse) fails just as fast.
    for flag in ["-4", "-6"] {
        ip(&["-n", n, flag, "route", "add", "unreachable", "default"])?;
    }
    Ok(())
}

/// Makes node `index`'s namespace with `eth0` plugged into the wire's bridge, an address and a
/// default route through the wire of each family (node-IP detection and kube-proxy need one),
/// and forwarding.
pub fn make_node_netns(ledger: &mut Ledger, cluster: &str, index: u8, families: IpFamilies) -> Result<String> {
    let name = node_netns(cluster, index);
    let wire = wire_netns(cluster);
    ledger.add(Resource::Netns { name: name.clone() })?;
    ip(&["netns", "add", &name])?;
    sysctls(&name, &[("net.ipv4.ip_forward", "1"), ("net.ipv4.conf.all.send_redirects", "0")])?;
    sysctls(&name, &IPV6_SYSCTLS)?;
    let peer = format!("n{index}");
    let mut lines = vec![
        "link set lo up".to_owned(),
        format!("link add eth0 type veth peer name {peer}"),
        format!("link set {peer} netns {wire}"),
    ];
    for family in families.families() {
        lines.push(addr_add(family.node_ip(index), family.wire_prefix(), "eth0"));
    }
    lines.push("link set eth0 up".into());
    for family in families.families() {
        // The gateway's address says the family (`ip -batch` takes no `-6` per line).
        lines.push(format!("route add default via {} dev eth0", family.wire_ip()));
    }
    batch(&name, &lines)?;
    batch(&wire, &[format!("link set {peer} master wire0"), format!("link set {peer} up")])?;
    Ok(name)
}

/// Routes node `index`'s pod CIDR (either family) through its address, in the wire namespace.
pub fn route_pod_cidr(cluster: &str, index: u8, pod_cidr: &str) -> Result<()> {
    let family = if pod_cidr.contains(':') { Family::V6 } else { Family::V4 };
    batch(&wire_netns(cluster), &[format!("route replace {pod_cidr} via {}", family.node_ip(index))])
}

/// `net.bridge.bridge-nf-call-*` exist once br_netfilter is loaded; kube-proxy needs them on
/// (both: a pod's IPv6 traffic to a Service on its own bridge must meet ip6tables/nftables too).
pub fn bridge_netfilter(netns: &str) -> Result<()> {
    if !Path::new("/proc/sys/net/bridge").exists() {
        let _ = Command::new("modprobe").arg("br_netfilter").status();
    }
    if Path::new("/proc/sys/net/bridge").exists() {
        sysctls(netns, &[("net.bridge.bridge-nf-call-iptables", "1"), ("net.bridge.bridge-nf-call-ip6tables", "1")])?;
    } else {
        tracing::warn!("br_netfilter is not available: pod-to-Service traffic on the same bridge may bypass the proxy");
    }
    Ok(())
}

/// Writes per-namespace sysctls (`ip netns exec NS sysctl -w`).
pub fn sysctls(netns: &str, settings: &[(&str, &str)]) -> Result<()> {
    let mut args = vec!["netns", "exec", netns, "sysctl", "-q", "-w"];
    let pairs: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
    args.extend(pairs.iter().map(String::as_str));
    ip(&args)
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn batch(netns: &str, lines: &[String]) -> Result<()> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["-n", netns, "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running ip -batch")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(lines.join("\n").as_bytes())?;
        stdin.write_all(b"\n")?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("ip -n {netns} -batch: {}: {}", lines.join("; "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_plan_keeps_every_family_in_its_test_range_and_lists_the_primary_first() {
        let v4_test: ipnet::IpNet = "198.18.0.0/15".parse().unwrap();
        let ula: ipnet::IpNet = "fd00::/8".parse().unwrap();
        for family in [Family::V4, Family::V6] {
            let range = if family == Family::V4 { v4_test } else { ula };
            let service: ipnet::IpNet = family.service_cidr().parse().unwrap();
            let pods: ipnet::IpNet = family.cluster_cidr().parse().unwrap();
            for ip in [family.wire_ip(), family.node_ip(1), family.node_ip(16), family.kubernetes_service_ip()] {
                assert!(range.contains(&ip), "{ip} outside {range}");
                assert_eq!(Family::of(ip), family);
            }
            assert!(range.contains(&service) && range.contains(&pods));
            assert!(service.contains(&family.kubernetes_service_ip()) && service.contains(&family.dns_service_ip()));
            assert!(!service.contains(&family.node_ip(1)) && !pods.contains(&family.node_ip(1)));
        }
        assert_eq!(Family::V6.node_ip(1).to_string(), "fd00:18::11");
        assert_eq!(Family::V4.node_ip(1).to_string(), "198.18.0.11");
        assert_eq!(IpFamilies::Dual.node_ips(2), vec![Family::V4.node_ip(2), Family::V6.node_ip(2)]);
        assert_eq!(IpFamilies::Dual.service_cidrs(), "198.18.128.0/17,fd00:18:128::/108");
        assert_eq!(IpFamilies::Ipv6.cluster_cidrs(), "fd00:19::/48");
        assert_eq!(host_port(Family::V6.wire_ip(), 6443), "[fd00:18::1]:6443");
        for name in ["ipv4", "ipv6", "dual"] {
            assert_eq!(IpFamilies::parse(name).map(IpFamilies::as_str), Some(name));
        }
        assert_eq!(IpFamilies::parse("ipv5"), None);
    }
}

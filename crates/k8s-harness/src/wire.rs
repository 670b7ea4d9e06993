//! The cluster's network: a "wire" namespace with a bridge that every node's `eth0` plugs into,
//! and one namespace per node. Only test ranges (198.18.0.0/15) are used, and nothing is added
//! to the machine's own namespace.
//!
//! ```text
//! 198.18.0.0/24    the wire: 198.18.0.1 (bridge in the wire namespace: control plane, e2e.test,
//!                  every node's default gateway), node N = 198.18.0.(10+N)
//! 198.18.128.0/17  Services (kubernetes = 198.18.128.1, cluster DNS = 198.18.128.10)
//! 198.19.0.0/16    pods; node N gets the /24 kube-controller-manager allocates (routed by the wire)
//! ```

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::ledger::{Ledger, Resource};

/// The default cluster name: namespaces `kpc-wire`, `kpc-node1`, … (never `kpt-`, the testbed's
/// prefix, whose stale-namespace sweeper would take them).
pub const DEFAULT_CLUSTER: &str = "kpc";

/// The wire namespace of cluster `cluster`.
pub fn wire_netns(cluster: &str) -> String {
    format!("{cluster}-wire")
}
/// The bridge address in the wire namespace: the API server binds it.
pub const WIRE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// The wire's prefix length.
pub const WIRE_PREFIX: u8 = 24;
/// `--service-cluster-ip-range`.
pub const SERVICE_CIDR: &str = "198.18.128.0/17";
/// The `kubernetes` Service's ClusterIP (first of the range).
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 128, 1);
/// The cluster DNS Service's ClusterIP.
pub const DNS_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 128, 10);
/// `--cluster-cidr` (pods).
pub const CLUSTER_CIDR: &str = "198.19.0.0/16";

/// The path of a namespace made with `ip netns add`.
pub fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// Node `index` (1-based) of `cluster`: its namespace name (its address is [`node_ip`]; two
/// clusters use the same addresses in different namespaces).
pub fn node_netns(cluster: &str, index: u8) -> String {
    format!("{cluster}-node{index}")
}

pub fn node_ip(index: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, 10 + index)
}

/// Makes the wire namespace and its bridge (recorded first, so a failure half way is undone).
pub fn make_wire(ledger: &mut Ledger, cluster: &str) -> Result<()> {
    let wire = wire_netns(cluster);
    ledger.add(Resource::Netns { name: wire.clone() })?;
    ip(&["netns", "add", &wire])?;
    let n = wire.as_str();
    batch(
        n,
        &[
            "link set lo up".into(),
            "link add wire0 type bridge".into(),
            format!("addr add {WIRE_IP}/{WIRE_PREFIX} dev wire0"),
            "link set wire0 up".into(),
            // Nothing leaves the cluster: whatever a node sends beyond 198.18.0.0/15 (an image
            // pull, a lookup through the machine's resolver) fails at once, here.
            "route add unreachable default".into(),
        ],
    )?;
    // Route between nodes (pod CIDRs) without NAT, and without telling nodes to go direct.
    sysctls(
        n,
        &[
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv4.conf.all.send_redirects", "0"),
            ("net.ipv4.conf.wire0.send_redirects", "0"),
        ],
    )?;
    Ok(())
}

/// Makes node `index`'s namespace with `eth0` plugged into the wire's bridge, a default route
/// through the wire (node-IP detection and kube-proxy need one), forwarding, and bridge netfilter.
pub fn make_node_netns(ledger: &mut Ledger, cluster: &str, index: u8) -> Result<String> {
    let name = node_netns(cluster, index);
    let wire = wire_netns(cluster);
    ledger.add(Resource::Netns { name: name.clone() })?;
    ip(&["netns", "add", &name])?;
    let peer = format!("n{index}");
    batch(
        &name,
        &[
            "link set lo up".into(),
            format!("link add eth0 type veth peer name {peer}"),
            format!("link set {peer} netns {wire}"),
            format!("addr add {}/{WIRE_PREFIX} dev eth0", node_ip(index)),
            "link set eth0 up".into(),
            format!("route add default via {WIRE_IP} dev eth0"),
        ],
    )?;
    batch(&wire, &[format!("link set {peer} master wire0"), format!("link set {peer} up")])?;
    // br_netfilter is loaded by the CNI bridge; set what kube-proxy expects once it is.
    sysctls(&name, &[("net.ipv4.ip_forward", "1"), ("net.ipv4.conf.all.send_redirects", "0")])?;
    Ok(name)
}

/// Routes node `index`'s pod CIDR through its address, in the wire namespace.
pub fn route_pod_cidr(cluster: &str, index: u8, pod_cidr: &str) -> Result<()> {
    batch(&wire_netns(cluster), &[format!("route replace {pod_cidr} via {}", node_ip(index))])
}

/// `net.bridge.bridge-nf-call-*` exist once br_netfilter is loaded; kube-proxy needs them on.
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

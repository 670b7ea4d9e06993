//! What moving a running cluster's nodes between kube-proxy's DaemonSet and kproxy's takes of
//! the harness: the node label both DaemonSets' node affinities read, the patch that keeps
//! kube-proxy's DaemonSet off the nodes kproxy has, kproxy's image in every node's containerd,
//! and what each proxy has in a node's kernel. `cargo xtask cluster migrate` drives them, the
//! way docs/migration.md tells an operator to.

use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::cluster::ClusterInfo;
use crate::node::Node;

/// The node label the two DaemonSets' node affinities read (docs/migration.md). Its values are
/// [`ON_KUBE_PROXY`], [`ON_BOTH`] and [`ON_KPROXY`]; a node without it runs both.
pub const NODE_LABEL: &str = "kproxy.io/proxy";
/// kube-proxy only: kproxy's DaemonSet (deploy/kproxy.yaml) stays off the node.
pub const ON_KUBE_PROXY: &str = "kube-proxy";
/// Both proxies, while one hands the node to the other.
pub const ON_BOTH: &str = "both";
/// kproxy only: kube-proxy's DaemonSet, once patched ([`kube_proxy_affinity_patch`]), leaves.
pub const ON_KPROXY: &str = "kproxy";

/// The strategic-merge patch of kube-proxy's DaemonSet that keeps its pods off nodes labelled
/// [`NODE_LABEL`]`=`[`ON_KPROXY`] (the mirror of deploy/kproxy.yaml's affinity).
pub fn kube_proxy_affinity_patch() -> String {
    serde_json::json!({"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": NODE_LABEL, "operator": "NotIn", "values": [ON_KPROXY]}]}]}}}}}}})
    .to_string()
}

/// The cluster name behind `info` (its wire namespace is `NAME-wire`).
fn cluster_name(info: &ClusterInfo) -> Result<&str> {
    info.wire_netns.strip_suffix("-wire").context("the cluster's wire namespace is not NAME-wire")
}

/// Node `index` (1-based) of the cluster in `work`.
fn node(work: &Path, info: &ClusterInfo, index: u8) -> Result<Node> {
    let zone = info.nodes.get(usize::from(index) - 1).and_then(|n| n.zone.clone());
    Ok(Node::new(cluster_name(info)?, index, info.families, zone, &work.join("run")))
}

/// Imports kproxy's image archive into every node's containerd (a cluster brought up for
/// upstream kube-proxy has it nowhere).
pub fn import_image(work: &Path, info: &ClusterInfo, archive: &Path) -> Result<()> {
    for index in 1..=u8::try_from(info.nodes.len())? {
        node(work, info, index)?.containerd().import(archive)?;
    }
    Ok(())
}

/// The `KUBE-` chains the kubelet owns (`KUBE-FIREWALL`, the canary and the hint), and
/// `KUBE-MARK-DROP`, which upstream's own `kube-proxy --cleanup` leaves as well: none of them is
/// a proxy's.
const NOT_A_PROXYS: [&str; 4] = ["KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-MARK-DROP"];

/// The iptables chains upstream kube-proxy's IPVS mode writes, as `(table, chain)` (upstream's
/// `pkg/proxy/ipvs/proxier.go` `iptablesChains`, which its cleanup removes too).
pub const KUBE_PROXY_IPVS_CHAINS: [(&str, &str); 11] = [
    ("nat", "KUBE-SERVICES"),
    ("nat", "KUBE-POSTROUTING"),
    ("nat", "KUBE-NODE-PORT"),
    ("nat", "KUBE-LOAD-BALANCER"),
    ("nat", "KUBE-MARK-MASQ"),
    ("filter", "KUBE-FORWARD"),
    ("filter", "KUBE-NODE-PORT"),
    ("filter", "KUBE-PROXY-FIREWALL"),
    ("filter", "KUBE-SOURCE-RANGES-FIREWALL"),
    ("filter", "KUBE-IPVS-FILTER"),
    ("filter", "KUBE-IPVS-OUT-FILTER"),
];

/// Those of [`KUBE_PROXY_IPVS_CHAINS`] that no iptables-mode proxy writes (kube-proxy's and
/// kproxy's iptables modes share upstream's names for the rest).
pub const IPVS_ONLY_CHAINS: [(&str, &str); 6] = [
    ("nat", "KUBE-NODE-PORT"),
    ("nat", "KUBE-LOAD-BALANCER"),
    ("filter", "KUBE-NODE-PORT"),
    ("filter", "KUBE-SOURCE-RANGES-FIREWALL"),
    ("filter", "KUBE-IPVS-FILTER"),
    ("filter", "KUBE-IPVS-OUT-FILTER"),
];

/// The dummy interface that holds the Service addresses in IPVS mode (kube-proxy's and
/// kproxy's alike).
pub const IPVS_DUMMY: &str = "kube-ipvs0";

/// The prefix of kube-proxy's ip sets (IPVS mode): `KUBE-CLUSTER-IP`, `KUBE-6-LOOP-BACK`, ...
/// kproxy makes none in any mode.
pub const KUBE_IPSET_PREFIX: &str = "KUBE-";

/// kproxy's IPVS mode's auxiliary nftables table (both families; `ipvs.table` defaults to it).
pub const KPROXY_IPVS_TABLE: &str = "kproxy-ipvs";

/// What a virtual service is, as `/proc/net/ip_vs` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VirtualKey {
    /// An address service: `TCP 10.96.0.1:443`.
    Addr { protocol: &'static str, addr: IpAddr, port: u16 },
    /// A firewall-mark service (kproxy's IPVS mode's short-circuits of Local-policy ports;
    /// kube-proxy makes none).
    Fwmark(u32),
    /// A protocol neither proxy uses (`AH`, `ESP`).
    Other,
}

impl std::fmt::Display for VirtualKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VirtualKey::Addr { protocol, addr: IpAddr::V6(a), port } => write!(f, "{protocol} [{a}]:{port}"),
            VirtualKey::Addr { protocol, addr, port } => write!(f, "{protocol} {addr}:{port}"),
            VirtualKey::Fwmark(mark) => write!(f, "FWM {mark:#x}"),
            VirtualKey::Other => f.write_str("another protocol's"),
        }
    }
}

/// One IPVS virtual service of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualService {
    pub key: VirtualKey,
    /// Its real servers (address and port), in the kernel's order.
    pub real_servers: Vec<SocketAddr>,
    /// Connections IPVS tracks through it (active and inactive, over its real servers): while
    /// any is left, kproxy's takeover keeps kube-proxy's virtual service (docs/migration.md).
    pub connections: u64,
}

/// What of each proxy is in one node's kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyRules {
    /// nftables tables named `kube-proxy` (kube-proxy's nftables mode), any family.
    pub kube_proxy_tables: usize,
    /// nftables tables named `kproxy` or `kproxy-accel` (kproxy's).
    pub kproxy_tables: usize,
    /// nftables tables named [`KPROXY_IPVS_TABLE`] (kproxy's IPVS mode's).
    pub kproxy_ipvs_tables: usize,
    /// Service proxy `KUBE-…` chains in iptables, as `backend family table chain` (either
    /// proxy's iptables mode: both use upstream's names; kube-proxy's IPVS mode), the kubelet's
    /// left out.
    pub kube_chains: Vec<String>,
    /// Rules in `KUBE-IPVS-FILTER` (kube-proxy's IPVS mode's; any backend and family). Its sync
    /// creates its chains first and writes their rules last, in one iptables-restore after
    /// every virtual service and ip set: rules there say a sync of it reached the kernel.
    pub ipvs_filter_rules: usize,
    /// The IPVS virtual services (none where the kernel has no IPVS loaded).
    pub ipvs: Vec<VirtualService>,
    /// The addresses on [`IPVS_DUMMY`] (IPv6 link-local ones left out), `None` without it.
    pub ipvs_dummy: Option<Vec<IpAddr>>,
    /// ip sets named `KUBE-…` (kube-proxy's IPVS mode's).
    pub kube_ipsets: Vec<String>,
}

impl ProxyRules {
    /// Whether the node's iptables has the Service proxy's entry chain (`KUBE-SERVICES`).
    pub fn kube_services(&self) -> bool {
        self.kube_chains.iter().any(|c| c.ends_with(" KUBE-SERVICES"))
    }

    /// The `KUBE-…` chains whose `(table, chain)` `pick` selects.
    pub fn chains_where(&self, pick: impl Fn(&str, &str) -> bool) -> Vec<String> {
        self.kube_chains
            .iter()
            .filter(|entry| {
                let words: Vec<&str> = entry.split_whitespace().collect();
                matches!(words[..], [_, _, table, chain] if pick(table, chain))
            })
            .cloned()
            .collect()
    }

    /// Firewall-mark virtual services.
    pub fn fwmark_services(&self) -> impl Iterator<Item = &VirtualService> {
        self.ipvs.iter().filter(|s| matches!(s.key, VirtualKey::Fwmark(_)))
    }

    /// Address virtual services.
    pub fn address_services(&self) -> impl Iterator<Item = &VirtualService> {
        self.ipvs.iter().filter(|s| matches!(s.key, VirtualKey::Addr { .. }))
    }
}

/// The IPVS virtual services of namespace `netns` (`/proc/net/ip_vs`); none where `ip_vs` is not
/// loaded (the file exists in every namespace once it is, and only then).
pub fn ipvs_services(netns: &str) -> Result<Vec<VirtualService>> {
    let text = run_in(netns, &["sh", "-c", "if [ -e /proc/net/ip_vs ]; then cat /proc/net/ip_vs; fi"])?;
    parse_ip_vs(&text).with_context(|| format!("/proc/net/ip_vs in {netns}"))
}

/// Runs `args` in namespace `netns`; its stdout, or an error with its stderr: an empty listing
/// must mean "nothing there", never "could not look".
fn run_in(netns: &str, args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", netns])
        .args(args)
        .output()
        .with_context(|| format!("running {}", args.join(" ")))?;
    if !out.status.success() {
        anyhow::bail!("{} in {netns}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Reads [`ProxyRules`] in namespace `netns`: `nft list tables`, the four `*tables-save` of both
/// backends and families, `/proc/net/ip_vs`, the dummy interface's addresses and `ipset list -n`.
/// Reading creates nothing: IPVS and ip sets are looked at only where their kernel module is
/// loaded (without it there is nothing of theirs; `ipset` would load it).
pub fn proxy_rules(netns: &str) -> Result<ProxyRules> {
    let run = |args: &[&str]| run_in(netns, args);
    let tables = run(&["nft", "list", "tables"])?;
    let named = |name: &str| tables.lines().filter(|l| l.split_whitespace().nth(2) == Some(name)).count();
    let mut kube_chains = Vec::new();
    let mut ipvs_filter_rules = 0;
    for (backend, family, save) in [
        ("nft", "ipv4", "iptables-nft-save"),
        ("nft", "ipv6", "ip6tables-nft-save"),
        ("legacy", "ipv4", "iptables-legacy-save"),
        ("legacy", "ipv6", "ip6tables-legacy-save"),
    ] {
        let mut table = "";
        for line in run(&[save])?.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = name;
            } else if line.starts_with("-A KUBE-IPVS-FILTER ") {
                ipvs_filter_rules += 1;
            } else if let Some(chain) = line.strip_prefix(':').and_then(|l| l.split_whitespace().next())
                && chain.starts_with("KUBE-")
                && !NOT_A_PROXYS.contains(&chain)
            {
                kube_chains.push(format!("{backend} {family} {table} {chain}"));
            }
        }
    }
    let ipvs = ipvs_services(netns)?;
    let ipvs_dummy = if link_names(&run(&["ip", "-o", "link", "show"])?).iter().any(|n| n == IPVS_DUMMY) {
        Some(addresses(&run(&["ip", "-o", "addr", "show", "dev", IPVS_DUMMY])?))
    } else {
        None
    };
    let kube_ipsets = if Path::new("/sys/module/ip_set").exists() {
        run(&["ipset", "list", "-n"])?
            .lines()
            .map(str::trim)
            .filter(|n| n.starts_with(KUBE_IPSET_PREFIX))
            .map(str::to_owned)
            .collect()
    } else {
        Vec::new()
    };
    Ok(ProxyRules {
        kube_proxy_tables: named("kube-proxy"),
        kproxy_tables: named("kproxy") + named("kproxy-accel"),
        kproxy_ipvs_tables: named(KPROXY_IPVS_TABLE),
        kube_chains,
        ipvs_filter_rules,
        ipvs,
        ipvs_dummy,
        kube_ipsets,
    })
}

/// The virtual services of a `/proc/net/ip_vs` text, each with its real servers and the
/// connections over them. Hand-written: kproxy-ipvs has a parser of this text (`proc_table`), but it comes
/// with the daemon's planning crates (and their Kubernetes API types), too much for the
/// harness to build for three fields.
pub fn parse_ip_vs(text: &str) -> Result<Vec<VirtualService>> {
    let mut out: Vec<VirtualService> = Vec::new();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let unknown = || anyhow::anyhow!("a line not understood: {line:?}");
        match words[..] {
            [] | ["IP", ..] | ["Prot", ..] | ["->", "RemoteAddress:Port", ..] => {}
            ["->", real_server, _, _, active, inactive, ..] => {
                let count = |w: &str| w.parse::<u64>().map_err(|_| unknown());
                let (addr, port) = hex_addr_port(real_server).ok_or_else(unknown)?;
                let service = out.last_mut().ok_or_else(unknown)?;
                service.real_servers.push(SocketAddr::new(addr, port));
                service.connections += count(active)? + count(inactive)?;
            }
            ["FWM", mark, ..] => out.push(VirtualService {
                key: VirtualKey::Fwmark(u32::from_str_radix(mark, 16).map_err(|_| unknown())?),
                real_servers: Vec::new(),
                connections: 0,
            }),
            [protocol @ ("TCP" | "UDP" | "SCTP"), addr_port, ..] => {
                let protocol = match protocol {
                    "TCP" => "TCP",
                    "UDP" => "UDP",
                    _ => "SCTP",
                };
                let (addr, port) = hex_addr_port(addr_port).ok_or_else(unknown)?;
                out.push(VirtualService {
                    key: VirtualKey::Addr { protocol, addr, port },
                    real_servers: Vec::new(),
                    connections: 0,
                });
            }
            [first, ..] if !first.starts_with("->") => {
                out.push(VirtualService { key: VirtualKey::Other, real_servers: Vec::new(), connections: 0 })
            }
            _ => return Err(unknown()),
        }
    }
    Ok(out)
}

/// `0A600001:01BB` (IPv4 in hex) or `[fd00:0000:…:0001]:01BB`; the port in hex.
fn hex_addr_port(s: &str) -> Option<(IpAddr, u16)> {
    let (addr, port) = match s.strip_prefix('[') {
        Some(v6) => {
            let (a, p) = v6.split_once("]:")?;
            (IpAddr::V6(a.parse().ok()?), p)
        }
        None => {
            let (a, p) = s.split_once(':')?;
            (IpAddr::V4(std::net::Ipv4Addr::from(u32::from_str_radix(a, 16).ok()?)), p)
        }
    };
    Some((addr, u16::from_str_radix(port, 16).ok()?))
}

/// The interface names of `ip -o link show` (`5: kube-ipvs0: <BROADCAST,NOARP> ...`,
/// `3: eth0@if4: ...`).
pub fn link_names(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .collect()
}

/// The addresses of `ip -o addr show` (`5: kube-ipvs0    inet 10.96.0.1/32 scope global ...`),
/// IPv6 link-local ones (the kernel's own once the interface is up) left out.
pub fn addresses(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "inet" || *w == "inet6")?;
            words.get(at + 1)?.split('/').next()?.parse::<IpAddr>().ok()
        })
        .filter(|a| !matches!(a, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80))
        .collect()
}

/// Waits until `log` (a file) contains `needle`; returns when it was seen.
pub fn wait_for_log(log: &Path, needle: &str, timeout: Duration) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        if fs::read_to_string(log).is_ok_and(|text| text.contains(needle)) {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            anyhow::bail!("{} never said {needle:?} within {timeout:?}", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifests_affinity_keeps_kproxy_off_nodes_labelled_kube_proxy_only() {
        let manifest = include_str!("../../../deploy/kproxy.yaml");
        let expected = format!(
            "                  - key: {NODE_LABEL}\n                    operator: NotIn\n                    values: [\"{ON_KUBE_PROXY}\"]\n"
        );
        assert!(manifest.contains(&expected), "deploy/kproxy.yaml's DaemonSet lacks {expected}");
        let patch: serde_json::Value = serde_json::from_str(&kube_proxy_affinity_patch()).unwrap();
        let term = &patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0];
        assert_eq!((term["key"].as_str(), term["operator"].as_str()), (Some(NODE_LABEL), Some("NotIn")));
        assert_eq!(term["values"], serde_json::json!([ON_KPROXY]));
    }

    /// `/proc/net/ip_vs` of a node with kube-proxy's IPVS mode (a ClusterIP, a NodePort on the
    /// node's address, an IPv6 ClusterIP) and a firewall-mark service of kproxy's.
    const IP_VS: &str = "IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A600001:01BB rr
  -> C6120002:192B      Masq    1      0          0
TCP  C6120101:7918 rr persistent 10800
  -> 0AF40105:1F90      Masq    1      1          2
  -> 0AF40206:1F90      Masq    0      0          4
TCP  [fd00:0000:0000:0000:0000:0000:0000:000a]:0050 rr
FWM  10000001 rr
  -> 0AF40105:1F90      Masq    1      3          0
";

    #[test]
    fn proc_net_ip_vs_gives_each_virtual_service_its_real_servers_and_the_connections_through_them() {
        let services = parse_ip_vs(IP_VS).unwrap();
        let listed: Vec<(String, u64)> = services.iter().map(|s| (s.key.to_string(), s.connections)).collect();
        assert_eq!(
            listed,
            [
                ("TCP 10.96.0.1:443".to_owned(), 0),
                ("TCP 198.18.1.1:31000".to_owned(), 7),
                ("TCP [fd00::a]:80".to_owned(), 0),
                ("FWM 0x10000001".to_owned(), 3),
            ]
        );
        let real_servers: Vec<String> =
            services[1].real_servers.iter().chain(&services[3].real_servers).map(ToString::to_string).collect();
        assert_eq!(real_servers, ["10.244.1.5:8080", "10.244.2.6:8080", "10.244.1.5:8080"]);
        assert_eq!(services[2].real_servers, [], "a virtual service without real servers");
        assert_eq!(parse_ip_vs("").unwrap(), [], "no IPVS in the kernel: nothing");
        assert!(parse_ip_vs("TCP  nothex:01BB rr\n").is_err(), "a line not understood is an error, not nothing");
        assert!(parse_ip_vs("  -> 0AF40105:1F90 Masq 1 0 0\n").is_err(), "a real server without a service");
    }

    #[test]
    fn virtual_services_are_told_apart_by_kind() {
        let rules = ProxyRules { ipvs: parse_ip_vs(IP_VS).unwrap(), ..Default::default() };
        let fwmark: Vec<String> = rules.fwmark_services().map(|s| s.key.to_string()).collect();
        assert_eq!(fwmark, ["FWM 0x10000001"]);
        assert_eq!(rules.address_services().count(), 3);
    }

    #[test]
    fn the_dummy_interface_and_its_addresses_are_read_from_ip_o() {
        let links = "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN\n\
                     3: eth0@if4: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500\n\
                     5: kube-ipvs0: <BROADCAST,NOARP> mtu 1500 qdisc noop state DOWN\n";
        assert_eq!(link_names(links), ["lo", "eth0", "kube-ipvs0"]);
        let addrs = "5: kube-ipvs0    inet 10.96.0.1/32 scope global kube-ipvs0\\       valid_lft forever preferred_lft forever\n\
                     5: kube-ipvs0    inet6 fd00::a/128 scope global \\       valid_lft forever preferred_lft forever\n\
                     5: kube-ipvs0    inet6 fe80::1c2f:5aff:fe3b:1/64 scope link \\       valid_lft forever\n";
        let expected: Vec<IpAddr> = vec!["10.96.0.1".parse().unwrap(), "fd00::a".parse().unwrap()];
        assert_eq!(addresses(addrs), expected);
    }

    #[test]
    fn chains_are_picked_by_table_and_name() {
        let rules = ProxyRules {
            kube_chains: vec!["nft ipv4 nat KUBE-SERVICES".into(), "nft ipv4 filter KUBE-IPVS-FILTER".into()],
            ..Default::default()
        };
        assert!(rules.kube_services());
        let ipvs_only = rules.chains_where(|table, chain| IPVS_ONLY_CHAINS.contains(&(table, chain)));
        assert_eq!(ipvs_only, ["nft ipv4 filter KUBE-IPVS-FILTER"]);
        assert!(IPVS_ONLY_CHAINS.iter().all(|c| KUBE_PROXY_IPVS_CHAINS.contains(c)));
    }
}

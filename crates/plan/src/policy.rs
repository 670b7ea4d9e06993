//! The inputs that are not cluster objects: the proxy's configuration and the node it runs on.

use std::net::IpAddr;

use ipnet::IpNet;
use kproxy_state::IpFamily;
use serde::Serialize;

/// How to tell traffic that comes from a local pod from anything else (kube-proxy's
/// `detectLocalMode`, KEP-2450).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DetectLocal {
    /// Pods are the sources inside these cluster CIDRs (`clusterCIDR`). Empty: undetectable.
    ClusterCidr(Vec<IpNet>),
    /// Pods are the sources inside the Node's `spec.podCIDRs`.
    NodeCidr,
    /// Pod traffic enters through this bridge (`detectLocal.bridgeInterface`).
    BridgeInterface(String),
    /// Pod traffic enters through interfaces with this prefix (`detectLocal.interfaceNamePrefix`).
    InterfaceNamePrefix(String),
    /// No way to tell.
    #[default]
    None,
}

/// One entry of `nodePortAddresses`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortAddress {
    /// The node's primary IP of each family.
    Primary,
    /// Every local address.
    All,
    /// 127.0.0.0/8 and ::1.
    Localhost,
    /// Local addresses inside this CIDR.
    Cidr(IpNet),
}

/// The proxy's configuration, as far as semantics go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyPolicy {
    /// Families to plan for (one plan each).
    pub families: Vec<IpFamily>,
    /// `masqueradeAll`: masquerade every packet to a ClusterIP.
    pub masquerade_all: bool,
    /// `detectLocalMode` and its companion setting.
    pub detect_local: DetectLocal,
    /// `nodePortAddresses` (already defaulted by the caller: `[Primary]` when unset in nftables mode).
    pub nodeport_addresses: Vec<NodePortAddress>,
    /// KEP-6246 `noMasqueradeCIDRs`: never masquerade packets whose (post-DNAT) destination is in these.
    pub no_masquerade_cidrs: Vec<IpNet>,
    /// KEP-6246: SNAT to the node's primary InternalIP instead of the egress interface's address.
    pub snat_to_node_ip: bool,
    /// KEP-4963: offload established connections of opted-in Services.
    pub acceleration: bool,
}

impl Default for ProxyPolicy {
    fn default() -> Self {
        Self {
            families: IpFamily::BOTH.to_vec(),
            masquerade_all: false,
            detect_local: DetectLocal::None,
            nodeport_addresses: vec![NodePortAddress::Primary],
            no_masquerade_cidrs: Vec::new(),
            snat_to_node_ip: false,
            acceleration: true,
        }
    }
}

/// Facts about the node that come from the host rather than the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeContext {
    /// This node's name (`hostnameOverride` or the hostname).
    pub name: String,
    /// Node IPs set by configuration (`bindAddress`); when empty the Node's InternalIPs are used.
    pub node_ip_override: Vec<IpAddr>,
    /// Addresses of the node's interfaces, for `nodePortAddresses` CIDRs and keywords.
    pub local_addresses: Vec<IpAddr>,
}

/// How pod traffic is recognised, resolved for one family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum LocalTraffic {
    /// Not detectable: ClusterIP traffic is never masqueraded for being non-local and eTP Local
    /// traffic from pods is not short-circuited.
    Undetectable,
    /// Source address inside one of these CIDRs.
    SourceCidrs(Vec<IpNet>),
    /// Input interface is exactly this one.
    Interface(String),
    /// Input interface name starts with this prefix.
    InterfacePrefix(String),
}

impl LocalTraffic {
    /// True when pod traffic can be told apart.
    pub fn is_detectable(&self) -> bool {
        !matches!(self, LocalTraffic::Undetectable)
    }
}

/// Where NodePorts listen, resolved for one family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum NodePortAddresses {
    /// Every local address of the family (except loopback, which needs `Localhost`).
    AllLocal,
    /// Only these addresses.
    Only(Vec<IpAddr>),
}

/// What address masqueraded packets get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum SnatSource {
    /// The egress interface's address (MASQUERADE), kube-proxy's behaviour.
    Masquerade,
    /// The node's primary InternalIP (KEP-6246).
    NodeIp(IpAddr),
}

/// The source NAT policy of one family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnatPolicy {
    /// Post-DNAT destinations that are never masqueraded (except hairpin traffic, which must be).
    pub no_masquerade_cidrs: Vec<IpNet>,
    /// The source address of masqueraded packets.
    pub source: SnatSource,
    /// Set when the SNAT-to-node-IP option is on but the node IP is unknown, so masquerade is
    /// used instead; the caller logs it.
    pub fell_back_to_masquerade: bool,
}

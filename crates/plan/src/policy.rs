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
    /// KEP-6246 `noMasqueradeCIDRs` (both families; the planner splits them): traffic from the
    /// node and its local pods whose destination after DNAT is in these is not masqueraded, even
    /// under `masqueradeAll`; hairpin and external traffic still are. See [`SnatPolicy`].
    pub no_masquerade_cidrs: Vec<IpNet>,
    /// KEP-6246 `snatToNodeIP`: SNAT to the node's primary IP of each family instead of the
    /// egress interface's address; per family, masquerade when that node IP is unknown.
    pub snat_to_node_ip: bool,
    /// KEP-4963: offload established connections of opted-in Services.
    pub acceleration: bool,
    /// List the node's addresses in [`NodePortAddresses::AllLocal`]: IPVS mode, whose NodePorts
    /// are address services on each. Other modes match any local address by rule, and an
    /// address coming or going must cost them no sync.
    pub list_local_addresses: bool,
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
            list_local_addresses: false,
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
    /// Every local address of the family (except loopback, which needs `Localhost`), matched
    /// as such where a dataplane can (`fib daddr type local`); with the ones the node has now
    /// (not loopback, not IPv6 link-local, not the VIPs of IPVS's dummy interface) when the
    /// policy lists them (`ProxyPolicy::list_local_addresses`), for what must name each address
    /// (IPVS address services), else none.
    AllLocal(Vec<IpAddr>),
    /// Only these addresses.
    Only(Vec<IpAddr>),
}

impl NodePortAddresses {
    /// The addresses NodePorts answer on, as known now.
    pub fn addresses(&self) -> &[IpAddr] {
        match self {
            NodePortAddresses::AllLocal(known) | NodePortAddresses::Only(known) => known,
        }
    }
}

/// What address masqueraded packets get.
///
/// KEP-6246 part 2. MASQUERADE takes the primary address of the interface the packet leaves
/// through (IPv4: the address in the next hop's subnet, ignoring the route's `src` hint; IPv6:
/// source address selection preferring the outgoing interface), so behind a bridge or a second
/// NIC the endpoint sees an address that is neither the node's InternalIP nor what direct
/// node-to-pod traffic carries. [`SnatSource::NodeIp`] pins it to the node IP instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum SnatSource {
    /// The egress interface's address (MASQUERADE), kube-proxy's behaviour.
    Masquerade,
    /// The node's primary IP of this family (KEP-6246): `bindAddress` when it is set and of this
    /// family, else the first InternalIP of this family in the Node's `status.addresses`. It
    /// follows the Node: a changed InternalIP re-plans the node (`Dirty::all`) and the dataplane
    /// re-renders its SNAT target; connections already translated keep their old source until
    /// their conntrack entries expire.
    NodeIp(IpAddr),
}

/// Traffic whose sources may skip masquerading to [`SnatPolicy::no_masquerade_cidrs`].
///
/// Only sources whose replies are certain to come back through this node qualify: the node
/// itself (replies go to the node's own address) and its local pods (replies go to the pod, which
/// is routed to this node). Everything else — external clients of NodePorts, LoadBalancer IPs,
/// ExternalIPs and ClusterIPs under `externalTrafficPolicy: Cluster` — stays masqueraded
/// whenever the service plan marks it: a remote endpoint would answer the client directly,
/// bypassing the conntrack entry that has to undo the DNAT, and the connection would break.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum NoMasqueradeSource {
    /// Packets the node itself sends: the source is a local address of the node that is not
    /// loopback (`127.0.0.0/8` and `::1` must always be masqueraded: they can not leave the
    /// node, and localhost NodePorts DNAT them to pods).
    Node,
    /// Packets from local pods, as [`crate::NodePlan::local_traffic`] recognises them; only when
    /// pod traffic is detectable.
    LocalPods,
}

/// The source NAT policy of one family (KEP-6246).
///
/// Rendering contract, identical for every dataplane, in the order a packet meets it in
/// postrouting:
///
/// 1. Hairpin — after DNAT the source equals the chosen endpoint — is always source-NATed, to
///    [`SnatPolicy::source`], whatever the other settings say: without it the endpoint answers
///    itself directly and the connection breaks. Correctness wins over the option.
/// 2. A packet not marked for masquerade by the service plan ([`crate::MasqueradeWhen`],
///    [`crate::ExternalPolicy`]) is left alone.
/// 3. A marked packet whose destination after DNAT (the chosen endpoint) is in
///    [`SnatPolicy::no_masquerade_cidrs`] and whose source is one of
///    [`crate::NodePlan::no_masquerade_sources`] is not translated: it is routed natively, so
///    the endpoint sees what direct node-to-pod (or pod-to-pod) traffic shows. This applies on
///    top of `masqueradeAll` too — the explicit, narrower list wins over the blanket switch,
///    since both sources are safe without SNAT.
/// 4. Every other marked packet is source-NATed to [`SnatPolicy::source`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnatPolicy {
    /// Post-DNAT destinations (of this family) that traffic from the node and its local pods is
    /// never masqueraded to; hairpin and external traffic still are (see the type's contract).
    pub no_masquerade_cidrs: Vec<IpNet>,
    /// The source address of masqueraded packets.
    pub source: SnatSource,
    /// Set when the SNAT-to-node-IP option is on but the node IP of this family is unknown, so
    /// masquerade is used instead; the caller warns about it (every time it becomes true).
    pub fell_back_to_masquerade: bool,
}

impl SnatPolicy {
    /// kube-proxy's default: masquerade to the egress interface's address, no destination
    /// exempt.
    pub fn masquerade() -> Self {
        SnatPolicy { no_masquerade_cidrs: Vec::new(), source: SnatSource::Masquerade, fell_back_to_masquerade: false }
    }

    /// A short name of the effective source NAT, for logs and the
    /// `kproxy_masquerade_policy_info` metric: `masquerade`, `node-ip`, or
    /// `masquerade-fallback` (node IP asked for but unknown).
    pub fn source_label(&self) -> &'static str {
        match (&self.source, self.fell_back_to_masquerade) {
            (SnatSource::NodeIp(_), _) => "node-ip",
            (SnatSource::Masquerade, true) => "masquerade-fallback",
            (SnatSource::Masquerade, false) => "masquerade",
        }
    }
}

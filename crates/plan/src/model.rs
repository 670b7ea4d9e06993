//! The plan's types: a value a dataplane renders.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;
use kproxy_state::{IpFamily, Protocol};
use serde::Serialize;

use crate::policy::{LocalTraffic, NoMasqueradeSource, NodePortAddresses, SnatPolicy};

/// The plan for every planned IP family.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Plan {
    /// One plan per family, IPv4 first.
    pub families: BTreeMap<IpFamily, FamilyPlan>,
}

/// Everything one family's dataplane needs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FamilyPlan {
    /// The family.
    pub family: IpFamily,
    /// Node-wide settings.
    pub node: NodePlan,
    /// Every service port with a ClusterIP of this family (serialized as a list, by name).
    #[serde(serialize_with = "serialize_values")]
    pub services: BTreeMap<ServicePortName, Arc<ServicePortPlan>>,
}

/// Node-wide settings of one family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodePlan {
    /// The node's primary IP of this family, if known.
    pub node_ip: Option<IpAddr>,
    /// How pod traffic is recognised.
    pub local_traffic: LocalTraffic,
    /// Where NodePorts listen.
    pub nodeport_addresses: NodePortAddresses,
    /// Source NAT policy (KEP-6246).
    pub snat: SnatPolicy,
    /// CIDRs of ServiceCIDR objects: addresses in them that are not a ClusterIP are unallocated.
    pub service_cidrs: Vec<IpNet>,
    /// Services acceleration (KEP-4963) is on.
    pub acceleration: bool,
}

impl NodePlan {
    /// The addresses that go from these settings' node-port addresses to `new`'s, `(gone, added)`,
    /// when `new` differs from these in the node's addresses alone: a dataplane then updates its
    /// set of node-port addresses and nothing else, as no service port depends on them (but
    /// IPVS's NodePorts, address services on each, see `NodePortAddresses::addresses`). Both lists of
    /// addresses: the addresses they select came or went; both "all local": nothing to update
    /// where any local address matches. `None` for any other change.
    pub fn nodeport_addresses_change(&self, new: &NodePlan) -> Option<(Vec<IpAddr>, Vec<IpAddr>)> {
        if (NodePlan { nodeport_addresses: self.nodeport_addresses.clone(), ..new.clone() }) != *self {
            return None;
        }
        match (&self.nodeport_addresses, &new.nodeport_addresses) {
            (NodePortAddresses::Only(before), NodePortAddresses::Only(after)) => {
                let gone = before.iter().filter(|ip| !after.contains(ip)).copied().collect();
                let added = after.iter().filter(|ip| !before.contains(ip)).copied().collect();
                Some((gone, added))
            }
            (NodePortAddresses::AllLocal(_), NodePortAddresses::AllLocal(_)) => Some((Vec::new(), Vec::new())),
            _ => None,
        }
    }

    /// The sources whose traffic skips masquerading to `snat.no_masquerade_cidrs` (KEP-6246):
    /// none without CIDRs; the node itself always; local pods when they are detectable. See
    /// [`SnatPolicy`] for the rendering contract and [`NoMasqueradeSource`] for why external
    /// traffic is not among them.
    pub fn no_masquerade_sources(&self) -> Vec<NoMasqueradeSource> {
        if self.snat.no_masquerade_cidrs.is_empty() {
            return Vec::new();
        }
        let mut sources = vec![NoMasqueradeSource::Node];
        if self.local_traffic.is_detectable() {
            sources.push(NoMasqueradeSource::LocalPods);
        }
        sources
    }
}

/// Identity of one service port in one family: namespace, service, port name and protocol.
///
/// Shared strings: the plan, the dataplane's state (by service port, by destination) and the
/// conntrack cleanup each keep copies of every name, and a copy costs a reference count, not
/// three allocations.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct ServicePortName {
    /// Namespace.
    pub namespace: Arc<str>,
    /// Service name.
    pub service: Arc<str>,
    /// Port name ("" for a single unnamed port).
    pub port: Arc<str>,
    /// Protocol.
    pub protocol: Protocol,
}

impl fmt::Display for ServicePortName {
    /// Upstream's spelling: `ns/svc:port` (`ns/svc` for unnamed ports), then the protocol.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.service)?;
        if !self.port.is_empty() {
            write!(f, ":{}", self.port)?;
        }
        write!(f, "/{}", self.protocol)
    }
}

/// One endpoint as the dataplane uses it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Endpoint {
    /// Address.
    pub ip: IpAddr,
    /// Target port.
    pub port: u16,
    /// The endpoint runs on this node.
    pub is_local: bool,
    /// Ready (else it is a serving, terminating endpoint used as a fallback).
    pub ready: bool,
}

impl Endpoint {
    /// Whether a connection from this endpoint to its own Service can be sent back to it here
    /// (hairpin): only when it runs on this node. A pod on another node reaches the Service
    /// through its own node's proxy, which translates it there; its packets never cross this
    /// node's DNAT addressed to the Service. Upstream's IPVS mode fills `KUBE-LOOP-BACK` the
    /// same way (local endpoints only); its iptables and nftables modes mark hairpin in every
    /// endpoint's own chain, a rule that costs them nothing more, where here every distinct
    /// endpoint address in the cluster was one more element to write at start and to change
    /// with each endpoint.
    pub fn can_hairpin(&self) -> bool {
        self.is_local
    }
}

/// When ClusterIP traffic is masqueraded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum MasqueradeWhen {
    /// Always (`masqueradeAll`).
    Always,
    /// When the source is not a local pod (per the node's [`LocalTraffic`]).
    SourceNotLocal,
    /// Never (pod traffic can not be detected and masqueradeAll is off).
    Never,
}

/// What a dataplane does with traffic of one class that has no endpoint to go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum NoEndpointsVerdict {
    /// The service has no endpoints anywhere: reject (TCP reset / ICMP port unreachable).
    Reject,
    /// A Local policy has no local endpoints, although the service has some elsewhere: drop.
    Drop,
}

/// How ClusterIP traffic is handled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InternalTraffic {
    /// `internalTrafficPolicy: Local`: use [`ServicePortPlan::local_endpoints`], else the cluster ones.
    pub local: bool,
    /// When to masquerade.
    pub masquerade: MasqueradeWhen,
    /// Set when this traffic has no endpoint: the verdict to apply instead of DNAT.
    pub no_endpoints: Option<NoEndpointsVerdict>,
}

/// `externalTrafficPolicy`, with what the Local policy needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ExternalPolicy {
    /// Masquerade and send to any cluster endpoint.
    Cluster,
    /// Keep the client's source address and send only to local endpoints. Traffic from local
    /// pods (when detectable) goes to the cluster endpoints unmasqueraded, and traffic from the
    /// node itself is masqueraded and goes to the cluster endpoints: neither would otherwise
    /// work when this node has no local endpoint.
    Local {
        /// Pod traffic is detectable, so pod-originated traffic is short-circuited.
        short_circuit_pods: bool,
    },
}

/// How NodePort, ExternalIP and LoadBalancer IP traffic is handled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExternalTraffic {
    /// The policy.
    pub policy: ExternalPolicy,
    /// Set when external traffic has no endpoint: the verdict to apply instead of DNAT.
    pub no_endpoints: Option<NoEndpointsVerdict>,
}

/// Everything a dataplane needs for one service port in one family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServicePortPlan {
    /// Identity.
    pub name: ServicePortName,
    /// The ClusterIP of this family.
    pub cluster_ip: IpAddr,
    /// Service port.
    pub port: u16,
    /// Protocol.
    pub protocol: Protocol,
    /// Node port, when allocated.
    pub node_port: Option<u16>,
    /// External IPs of this family.
    pub external_ips: Vec<IpAddr>,
    /// Load balancer ingress IPs of this family (`ipMode: VIP` only).
    pub load_balancer_ips: Vec<IpAddr>,
    /// `loadBalancerSourceRanges` of this family; when non-empty, traffic to the load balancer IPs
    /// from other sources is dropped. The node's own IP is allowed when it is inside a range.
    pub source_ranges: Vec<IpNet>,
    /// ClientIP session affinity timeout, in seconds.
    pub affinity_timeout: Option<u32>,
    /// Endpoints for Cluster policy traffic, after topology and terminating fallback; sorted.
    pub cluster_endpoints: Vec<Endpoint>,
    /// Endpoints for Local policy traffic (local ready ones, else local serving+terminating); sorted.
    pub local_endpoints: Vec<Endpoint>,
    /// ClusterIP traffic.
    pub internal: InternalTraffic,
    /// NodePort / ExternalIP / LoadBalancer traffic, when the service accepts any.
    pub external: Option<ExternalTraffic>,
    /// Health check node port (eTP Local LoadBalancer services).
    pub health_check_node_port: Option<u16>,
    /// Offload established connections to the flowtable (KEP-4963 opt-in, acceleration on, not SCTP).
    pub accelerate: bool,
    /// Every serving endpoint (address and target port) of a UDP or SCTP port, whatever the
    /// traffic policies, topology or terminating state; sorted. Conntrack entries DNATed to
    /// one of them are left alone, so a flow to a terminating or topology-filtered endpoint
    /// drains instead of breaking (upstream's conntrack cleanup). Empty for TCP.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub serving_endpoints: Vec<SocketAddr>,
}

impl ServicePortPlan {
    /// The endpoints ClusterIP traffic goes to.
    pub fn internal_endpoints(&self) -> &[Endpoint] {
        if self.internal.local { &self.local_endpoints } else { &self.cluster_endpoints }
    }

    /// Every endpoint some traffic class of this port may reach (the union of both sets).
    pub fn reachable_endpoints(&self) -> Vec<&Endpoint> {
        self.reachable_where(|_| true)
    }

    /// The reachable endpoints whose own connections to this port are hairpin here
    /// ([`Endpoint::can_hairpin`]): masqueraded so the reply comes back through the un-DNAT.
    pub fn hairpin_endpoints(&self) -> Vec<&Endpoint> {
        self.reachable_where(Endpoint::can_hairpin)
    }

    /// The reachable endpoints `keep` accepts, each once, in order.
    fn reachable_where(&self, keep: impl Fn(&Endpoint) -> bool) -> Vec<&Endpoint> {
        let mut all: Vec<&Endpoint> =
            self.cluster_endpoints.iter().chain(&self.local_endpoints).filter(|ep| keep(ep)).collect();
        all.sort();
        all.dedup();
        all
    }

    /// Whether the cluster-policy endpoint set is in use by some traffic class.
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal.local || self.external.is_some()
    }

    /// Whether the local-policy endpoint set is in use by some traffic class.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal.local || self.external.as_ref().is_some_and(|e| matches!(e.policy, ExternalPolicy::Local { .. }))
    }

    /// The sources `loadBalancerSourceRanges` let through to the LoadBalancer IPs, empty when
    /// there is no such firewall: the ranges, plus the LoadBalancer IPs themselves when the
    /// node IP is inside a range (the node reaching its own LB IP may carry the LB IP as source).
    pub fn firewall_allowed_sources(&self, node_ip: Option<IpAddr>) -> Vec<IpNet> {
        if self.source_ranges.is_empty() || self.load_balancer_ips.is_empty() {
            return Vec::new();
        }
        let mut allowed = self.source_ranges.clone();
        if node_ip.is_some_and(|n| self.source_ranges.iter().any(|r| r.contains(&n))) {
            allowed.extend(self.load_balancer_ips.iter().map(|lb| IpNet::from(*lb)));
        }
        allowed
    }

    /// Every address that receives external traffic (external IPs then load balancer IPs).
    pub fn external_vips(&self) -> impl Iterator<Item = &IpAddr> {
        self.external_ips.iter().chain(&self.load_balancer_ips)
    }
}

fn serialize_values<S: serde::Serializer>(
    map: &BTreeMap<ServicePortName, Arc<ServicePortPlan>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(map.values())
}

//! The answer of [`super::explain`]: what it says about one packet, serialized as
//! `kproxy explain -o json` and `/debug/explain` print it.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::model::ServicePortName;

/// Who sent the packet, as the ruleset tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// The node itself (a local address, loopback included).
    Node,
    /// A pod on this node, as detect-local recognises it.
    LocalPod,
    /// Anything else: a pod on another node, an external client.
    Remote,
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SourceKind::Node => "the node itself",
            SourceKind::LocalPod => "a local pod",
            SourceKind::Remote => "remote",
        })
    }
}

/// Which kind of service address the destination is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DestinationKind {
    /// A ClusterIP.
    ClusterIp,
    /// A NodePort on one of the addresses that accept them.
    NodePort,
    /// An external IP.
    ExternalIp,
    /// A LoadBalancer ingress IP.
    LoadBalancerIp,
}

impl fmt::Display for DestinationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DestinationKind::ClusterIp => "ClusterIP",
            DestinationKind::NodePort => "NodePort",
            DestinationKind::ExternalIp => "external IP",
            DestinationKind::LoadBalancerIp => "LoadBalancer IP",
        })
    }
}

/// What the node does with the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Translated to one of the endpoints.
    Dnat,
    /// Dropped.
    Drop,
    /// Refused (TCP reset / ICMP port unreachable).
    Reject,
    /// kproxy does not touch it.
    None,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Dnat => "dnat",
            Verdict::Drop => "drop",
            Verdict::Reject => "reject",
            Verdict::None => "none",
        })
    }
}

/// Why the source is, or is not, translated on the way to one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "why")]
pub enum SnatReason {
    /// The endpoint is the client itself: always source-NATed, or it would answer itself.
    Hairpin,
    /// `masqueradeAll`.
    MasqueradeAll,
    /// ClusterIP traffic that detect-local does not recognise as a local pod's.
    NotFromLocalPod,
    /// NodePort / ExternalIP / LoadBalancer traffic under `externalTrafficPolicy: Cluster`.
    ExternalCluster,
    /// The node itself to an `externalTrafficPolicy: Local` address: sent to any endpoint, so
    /// source-NATed.
    NodeToExternalLocal,
    /// ClusterIP traffic from a local pod.
    FromLocalPod,
    /// Pod traffic is not detectable and masqueradeAll is off: ClusterIP traffic keeps its source.
    PodTrafficUndetectable,
    /// `externalTrafficPolicy: Local` keeps the client's address.
    ExternalLocal,
    /// A local pod to an `externalTrafficPolicy: Local` address: short-circuited to any
    /// endpoint, unmasqueraded.
    LocalPodShortCircuit,
    /// KEP-6246: from the node or a local pod to an endpoint inside a no-masquerade CIDR.
    NoMasqueradeCidr {
        /// The CIDR.
        cidr: IpNet,
    },
}

impl fmt::Display for SnatReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnatReason::Hairpin => f.write_str("hairpin: the endpoint is the client itself"),
            SnatReason::MasqueradeAll => f.write_str("masqueradeAll"),
            SnatReason::NotFromLocalPod => f.write_str("ClusterIP traffic not from a local pod (detect-local)"),
            SnatReason::ExternalCluster => f.write_str("external traffic under externalTrafficPolicy Cluster"),
            SnatReason::NodeToExternalLocal => {
                f.write_str("from the node to an externalTrafficPolicy Local address: any endpoint, masqueraded")
            }
            SnatReason::FromLocalPod => f.write_str("ClusterIP traffic from a local pod"),
            SnatReason::PodTrafficUndetectable => {
                f.write_str("pod traffic is undetectable and masqueradeAll is off: ClusterIP traffic keeps its source")
            }
            SnatReason::ExternalLocal => f.write_str("externalTrafficPolicy Local keeps the client's address"),
            SnatReason::LocalPodShortCircuit => {
                f.write_str("a local pod to an externalTrafficPolicy Local address: any endpoint, unmasqueraded")
            }
            SnatReason::NoMasqueradeCidr { cidr } => write!(f, "the endpoint is in noMasqueradeCIDR {cidr} (KEP-6246)"),
        }
    }
}

/// One endpoint the packet may go to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Endpoint {
    /// `IP:PORT`.
    pub address: SocketAddr,
    /// The chance a new connection goes there (uniform over the class's endpoints).
    pub probability: f64,
    /// On this node.
    pub local: bool,
    /// Ready (else serving and terminating, used as a fallback).
    pub ready: bool,
    /// The source is translated on the way there.
    pub masquerade: bool,
    /// Why (or why not).
    pub masquerade_reason: SnatReason,
    /// The source address the endpoint sees; `None` when masqueraded on a node whose IP of the
    /// family is unknown.
    pub source_seen: Option<IpAddr>,
    /// False when the endpoint sees the address of the egress interface (MASQUERADE), which the
    /// plan does not know: `source_seen` is then the node IP, what remote endpoints usually see.
    pub source_seen_certain: bool,
}

/// `loadBalancerSourceRanges` as they apply to the packet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRanges {
    /// The ranges allowed (the LoadBalancer IPs too when the node IP is in a range).
    pub allowed: Vec<IpNet>,
    /// The source is inside one of them.
    pub source_allowed: bool,
}

/// One service port's traffic by what became of it, as the kernel counted it (per-Service
/// counters, nftables mode, opt-in): new connections, or (the same verdicts) packets or bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionCounts {
    /// Sent to an endpoint.
    pub served: u64,
    /// Rejected: the service has no endpoints.
    pub rejected_no_endpoints: u64,
    /// Dropped: a Local traffic policy without a local endpoint.
    pub dropped_no_local_endpoints: u64,
    /// Dropped by `loadBalancerSourceRanges`.
    pub dropped_by_source_ranges: u64,
}

/// What this node does with a packet, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// The service port the destination belongs to, `ns/name:port` (`ns/name` when unnamed).
    pub service: Option<String>,
    /// The verdict.
    pub verdict: Verdict,
    /// The endpoints a new connection can go to, with their probabilities.
    pub endpoints: Vec<Endpoint>,
    /// Endpoints left out of `endpoints` (a running daemon lists at most
    /// [`Explanation::MAX_LISTED_ENDPOINTS`], so an answer's size stays bounded).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub endpoints_omitted: usize,
    /// The packet is source-NATed to at least one of the endpoints (each says for itself).
    pub masquerade: bool,
    /// The source the endpoint sees, when every endpoint sees the same.
    pub source_seen: Option<IpAddr>,
    /// One sentence: why.
    pub reason: String,
    /// What kind of service address the destination is.
    pub destination: Option<DestinationKind>,
    /// Who sent the packet, as the ruleset tells them apart.
    pub source: SourceKind,
    /// `loadBalancerSourceRanges`, when the destination has some.
    pub source_ranges: Option<SourceRanges>,
    /// ClientIP affinity timeout: after the first connection, the client sticks to its endpoint.
    pub affinity_timeout_seconds: Option<u32>,
    /// Established connections are offloaded to the flowtable (KEP-4963), when the kernel has one.
    pub acceleration_eligible: bool,
    /// The service port's new connections so far, when a running kproxy counts them
    /// (`--service-counters`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<ConnectionCounts>,
    /// The service port's packets so far by the same verdicts: served counts every packet of
    /// the served connections, both directions; the others the packets refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets: Option<ConnectionCounts>,
    /// The bytes (IP packets, headers included) of those packets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<ConnectionCounts>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Explanation {
    /// The most endpoints a running daemon lists in one answer.
    pub const MAX_LISTED_ENDPOINTS: usize = 100;

    /// Keeps the first [`Explanation::MAX_LISTED_ENDPOINTS`] endpoints and counts the rest.
    pub fn bounded(mut self) -> Self {
        if self.endpoints.len() > Self::MAX_LISTED_ENDPOINTS {
            self.endpoints_omitted += self.endpoints.len() - Self::MAX_LISTED_ENDPOINTS;
            self.endpoints.truncate(Self::MAX_LISTED_ENDPOINTS);
        }
        self
    }

    pub(super) fn untouched(source: SourceKind, reason: String) -> Self {
        Explanation {
            service: None,
            verdict: Verdict::None,
            endpoints: Vec::new(),
            endpoints_omitted: 0,
            masquerade: false,
            source_seen: None,
            reason,
            destination: None,
            source,
            source_ranges: None,
            affinity_timeout_seconds: None,
            acceleration_eligible: false,
            connections: None,
            packets: None,
            bytes: None,
        }
    }
}

/// How `ns/name:port` is spelled in explanations (upstream's spelling without the protocol).
pub fn service_port_label(n: &ServicePortName) -> String {
    if n.port.is_empty() {
        format!("{}/{}", n.namespace, n.service)
    } else {
        format!("{}/{}:{}", n.namespace, n.service, n.port)
    }
}

//! What this node does with one packet, and why: the plan's decisions evaluated for a concrete
//! source, destination and protocol.
//!
//! Every dataplane renders the same decisions this module evaluates — [`MasqueradeWhen`] for
//! ClusterIP traffic, [`ExternalPolicy`] for NodePort / ExternalIP / LoadBalancer traffic, the
//! [`NoEndpointsVerdict`]s, `loadBalancerSourceRanges`, and the source-NAT contract of
//! [`crate::SnatPolicy`] (hairpin first, then the mark, then the KEP-6246 exemptions of
//! [`crate::NodePlan::no_masquerade_sources`]) — in the order a packet meets them in the kernel:
//! source-range firewall, destination dispatch, the traffic class's endpoints, then postrouting.
//!
//! What the plan does not know is said, not guessed: with MASQUERADE the endpoint sees the
//! address of the interface the packet leaves through, which is the node IP for remote
//! endpoints on a typical node but not necessarily for local ones (see [`Endpoint::source_seen_certain`]).
//! Pod traffic recognised by interface (`bridgeInterface`, `interfaceNamePrefix`) is recognised
//! here by address: a source is a local pod when it is inside the Node's `podCIDRs` or is the
//! address of a local endpoint.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use kproxy_state::{ClusterState, IpFamily, Protocol};

mod agreement;
mod answer;

pub use agreement::{Observed, Strictness};
pub use answer::{
    ConnectionCounts, DestinationKind, Endpoint, Explanation, SnatReason, SourceKind, SourceRanges, Verdict,
    service_port_label,
};

use crate::model::{
    Endpoint as PlanEndpoint, ExternalPolicy, FamilyPlan, MasqueradeWhen, NoEndpointsVerdict, Plan, ServicePortPlan,
};
use crate::policy::{LocalTraffic, NoMasqueradeSource, NodePortAddresses, SnatSource};

/// The packet to explain: the first packet of a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// Source address.
    pub from: IpAddr,
    /// Destination address and port.
    pub to: SocketAddr,
    /// Protocol.
    pub protocol: Protocol,
}

/// What the explainer knows about the node beyond the plan.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    /// Addresses of the node's interfaces: a packet from one of them is sent by the node
    /// itself, and NodePorts on `nodePortAddresses: all` listen on them.
    pub local_addresses: Vec<IpAddr>,
    /// The Node's `spec.podCIDRs`: where interface-based detect-local (`bridgeInterface`,
    /// `interfaceNamePrefix`) finds local pods, which the ruleset tells by interface.
    pub pod_cidrs: Vec<IpNet>,
}

impl Host {
    /// The node `name` of `state`, with these interface addresses.
    pub fn of_node(state: &ClusterState, name: &str, local_addresses: Vec<IpAddr>) -> Self {
        let pod_cidrs = state.node(name).map(|n| n.pod_cidrs.clone()).unwrap_or_default();
        Host { local_addresses, pod_cidrs }
    }
}

/// Explains what the node planned in `plan` does with `packet`.
pub fn explain(plan: &Plan, host: &Host, packet: &Packet) -> Explanation {
    let family = IpFamily::of(&packet.to.ip());
    let Some(fam) = plan.families.get(&family) else {
        return Explanation::untouched(SourceKind::Remote, format!("kproxy does not proxy {family} on this node"));
    };
    let source = source_kind(fam, host, packet.from);
    let Some((p, kind)) = resolve(fam, host, packet) else {
        return unclaimed(fam, source, packet);
    };
    let mut out = Explanation {
        service: Some(service_port_label(&p.name)),
        destination: Some(kind),
        affinity_timeout_seconds: p.affinity_timeout,
        ..Explanation::untouched(source, String::new())
    };
    let what = format!("{} {} {} of {}", packet.protocol, kind, packet.to, service_port_label(&p.name));

    // filter prerouting/output, before DNAT: the source-range firewall of LoadBalancer IPs.
    if kind == DestinationKind::LoadBalancerIp && !p.source_ranges.is_empty() {
        let allowed = p.firewall_allowed_sources(fam.node.node_ip);
        let source_allowed = allowed.iter().any(|r| r.contains(&packet.from));
        out.source_ranges = Some(SourceRanges { allowed, source_allowed });
        if !source_allowed {
            out.verdict = Verdict::Drop;
            out.reason = format!("{what}: source {} is outside loadBalancerSourceRanges", packet.from);
            return out;
        }
    }

    let route = match kind {
        DestinationKind::ClusterIp => route_internal(p, source),
        _ => route_external(p, source),
    };
    let (endpoints, marked) = match route {
        Route::Verdict(v, why) => {
            out.verdict = match v {
                NoEndpointsVerdict::Reject => Verdict::Reject,
                NoEndpointsVerdict::Drop => Verdict::Drop,
            };
            out.reason = format!("{what}: {why}");
            return out;
        }
        Route::Dnat { endpoints, marked } => (endpoints, marked),
    };

    let n = endpoints.len();
    out.endpoints = endpoints
        .iter()
        .map(|ep| {
            let (masquerade, reason) = postrouting(fam, source, packet.from, ep, &marked);
            let (source_seen, certain) = if masquerade { snat_address(fam) } else { (Some(packet.from), true) };
            Endpoint {
                address: SocketAddr::new(ep.ip, ep.port),
                probability: 1.0 / n as f64,
                local: ep.is_local,
                ready: ep.ready,
                masquerade,
                masquerade_reason: reason,
                source_seen,
                source_seen_certain: certain,
            }
        })
        .collect();
    out.verdict = Verdict::Dnat;
    out.masquerade = out.endpoints.iter().any(|e| e.masquerade);
    let first_seen = out.endpoints.first().and_then(|e| e.source_seen);
    out.source_seen = first_seen.filter(|s| out.endpoints.iter().all(|e| e.source_seen == Some(*s)));
    out.acceleration_eligible = p.accelerate;
    let reasons: Vec<String> = {
        let mut r: Vec<String> = out.endpoints.iter().map(|e| e.masquerade_reason.to_string()).collect();
        r.dedup();
        r
    };
    let terminating =
        if out.endpoints.iter().all(|e| !e.ready) { " (terminating endpoints as a fallback)" } else { "" };
    out.reason = format!(
        "{what}: DNAT to one of {n} {} endpoint(s){terminating}; {}: {}",
        marked.class,
        if out.masquerade { "masqueraded" } else { "source kept" },
        reasons.join("; ")
    );
    out
}

/// Whether `from` is the node, one of its pods, or something else (see the module's note on
/// interface-based detect-local).
pub fn source_kind(fam: &FamilyPlan, host: &Host, from: IpAddr) -> SourceKind {
    if from.is_loopback() || fam.node.node_ip == Some(from) || host.local_addresses.contains(&from) {
        return SourceKind::Node;
    }
    let local_pod = match &fam.node.local_traffic {
        LocalTraffic::Undetectable => false,
        LocalTraffic::SourceCidrs(nets) => nets.iter().any(|n| n.contains(&from)),
        LocalTraffic::Interface(_) | LocalTraffic::InterfacePrefix(_) => {
            host.pod_cidrs.iter().any(|n| n.contains(&from))
                || fam.services.values().any(|p| p.reachable_endpoints().iter().any(|ep| ep.is_local && ep.ip == from))
        }
    };
    if local_pod { SourceKind::LocalPod } else { SourceKind::Remote }
}

/// The service port claiming the destination, as the `services` chain dispatches: addresses
/// first (ClusterIP, external and LoadBalancer IPs), then NodePorts; on a conflict the first
/// service port by name wins, as in the table.
fn resolve<'a>(fam: &'a FamilyPlan, host: &Host, packet: &Packet) -> Option<(&'a ServicePortPlan, DestinationKind)> {
    let (ip, port) = (packet.to.ip(), packet.to.port());
    let ports = || fam.services.values().map(AsRef::as_ref).filter(|p| p.protocol == packet.protocol);
    let by_address = ports().filter(|p| p.port == port).find_map(|p| {
        if p.cluster_ip == ip {
            Some((p, DestinationKind::ClusterIp))
        } else if p.external.is_none() {
            None
        } else if p.external_ips.contains(&ip) {
            Some((p, DestinationKind::ExternalIp))
        } else if p.load_balancer_ips.contains(&ip) {
            Some((p, DestinationKind::LoadBalancerIp))
        } else {
            None
        }
    });
    by_address.or_else(|| {
        if !accepts_node_ports(fam, host, ip) {
            return None;
        }
        ports().find(|p| p.external.is_some() && p.node_port == Some(port)).map(|p| (p, DestinationKind::NodePort))
    })
}

fn accepts_node_ports(fam: &FamilyPlan, host: &Host, ip: IpAddr) -> bool {
    match &fam.node.nodeport_addresses {
        NodePortAddresses::Only(ips) => ips.contains(&ip),
        // Listed (IPVS mode: an address service on each): those alone.
        NodePortAddresses::AllLocal(listed) if !listed.is_empty() => listed.contains(&ip),
        NodePortAddresses::AllLocal(_) => {
            !ip.is_loopback() && (fam.node.node_ip == Some(ip) || host.local_addresses.contains(&ip))
        }
    }
}

/// A destination no service port claims: the filter chains still reject unknown ports of a
/// ClusterIP and drop unallocated addresses of the service CIDRs.
fn unclaimed(fam: &FamilyPlan, source: SourceKind, packet: &Packet) -> Explanation {
    let ip = packet.to.ip();
    let mut out = Explanation::untouched(source, format!("no service port has {} {}", packet.protocol, packet.to));
    if fam.services.values().any(|p| p.cluster_ip == ip) {
        out.verdict = Verdict::Reject;
        out.reason =
            format!("{ip} is a ClusterIP, but none of its service ports is {} {}", packet.protocol, packet.to.port());
    } else if let Some(cidr) = fam.node.service_cidrs.iter().find(|c| c.contains(&ip)) {
        out.verdict = Verdict::Drop;
        out.reason = format!("{ip} is in service CIDR {cidr} but is no ClusterIP");
    }
    out
}

/// Which endpoint set a traffic class uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Cluster,
    Local,
}

impl fmt::Display for Class {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Class::Cluster => "cluster",
            Class::Local => "local",
        })
    }
}

/// Whether the service chain marks the packet for masquerading, and why (or why not).
#[derive(Debug, Clone)]
struct Marked {
    class: Class,
    mark: bool,
    reason: SnatReason,
}

enum Route<'a> {
    Verdict(NoEndpointsVerdict, &'static str),
    Dnat { endpoints: &'a [PlanEndpoint], marked: Marked },
}

fn no_endpoints_reason(v: NoEndpointsVerdict) -> &'static str {
    match v {
        NoEndpointsVerdict::Reject => "the service has no endpoints: rejected",
        NoEndpointsVerdict::Drop => "the Local traffic policy has no endpoint on this node: dropped",
    }
}

/// ClusterIP traffic: the internal policy's endpoints, marked per [`MasqueradeWhen`].
fn route_internal(p: &ServicePortPlan, source: SourceKind) -> Route<'_> {
    if let Some(v) = p.internal.no_endpoints {
        return Route::Verdict(v, no_endpoints_reason(v));
    }
    let class = if p.internal.local { Class::Local } else { Class::Cluster };
    let (mark, reason) = match p.internal.masquerade {
        MasqueradeWhen::Always => (true, SnatReason::MasqueradeAll),
        // The node's own packets never match a local-pod match (no pod interface, no pod address).
        MasqueradeWhen::SourceNotLocal if source == SourceKind::LocalPod => (false, SnatReason::FromLocalPod),
        MasqueradeWhen::SourceNotLocal => (true, SnatReason::NotFromLocalPod),
        MasqueradeWhen::Never => (false, SnatReason::PodTrafficUndetectable),
    };
    Route::Dnat { endpoints: p.internal_endpoints(), marked: Marked { class, mark, reason } }
}

/// NodePort, ExternalIP and LoadBalancer traffic, per [`ExternalPolicy`].
fn route_external(p: &ServicePortPlan, source: SourceKind) -> Route<'_> {
    let Some(ext) = &p.external else {
        return Route::Verdict(NoEndpointsVerdict::Reject, "the service accepts no external traffic");
    };
    if ext.no_endpoints == Some(NoEndpointsVerdict::Reject) {
        return Route::Verdict(NoEndpointsVerdict::Reject, no_endpoints_reason(NoEndpointsVerdict::Reject));
    }
    let cluster = |mark, reason| Route::Dnat {
        endpoints: &p.cluster_endpoints,
        marked: Marked { class: Class::Cluster, mark, reason },
    };
    match ext.policy {
        ExternalPolicy::Cluster => cluster(true, SnatReason::ExternalCluster),
        ExternalPolicy::Local { short_circuit_pods: true } if source == SourceKind::LocalPod => {
            cluster(false, SnatReason::LocalPodShortCircuit)
        }
        ExternalPolicy::Local { .. } if source == SourceKind::Node => cluster(true, SnatReason::NodeToExternalLocal),
        ExternalPolicy::Local { .. } if p.local_endpoints.is_empty() => {
            let v = ext.no_endpoints.unwrap_or(NoEndpointsVerdict::Drop);
            Route::Verdict(v, no_endpoints_reason(v))
        }
        ExternalPolicy::Local { .. } => Route::Dnat {
            endpoints: &p.local_endpoints,
            marked: Marked { class: Class::Local, mark: false, reason: SnatReason::ExternalLocal },
        },
    }
}

/// Postrouting, per the [`crate::SnatPolicy`] contract: hairpin, then the mark, then the
/// KEP-6246 exemptions.
fn postrouting(
    fam: &FamilyPlan,
    source: SourceKind,
    from: IpAddr,
    ep: &PlanEndpoint,
    marked: &Marked,
) -> (bool, SnatReason) {
    if ep.can_hairpin() && ep.ip == from {
        return (true, SnatReason::Hairpin);
    }
    if !marked.mark {
        return (false, marked.reason.clone());
    }
    let exempt = fam.node.no_masquerade_sources().into_iter().any(|s| match s {
        NoMasqueradeSource::Node => source == SourceKind::Node && !from.is_loopback(),
        NoMasqueradeSource::LocalPods => source == SourceKind::LocalPod,
    });
    if exempt && let Some(cidr) = fam.node.snat.no_masquerade_cidrs.iter().find(|c| c.contains(&ep.ip)) {
        return (false, SnatReason::NoMasqueradeCidr { cidr: *cidr });
    }
    (true, marked.reason.clone())
}

/// The source a masqueraded packet gets, and whether the plan knows it for sure.
fn snat_address(fam: &FamilyPlan) -> (Option<IpAddr>, bool) {
    match &fam.node.snat.source {
        SnatSource::NodeIp(ip) => (Some(*ip), true),
        SnatSource::Masquerade => (fam.node.node_ip, false),
    }
}

#[cfg(test)]
mod tests;

//! Services, validated into what the proxy needs.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

use crate::change::{Kind, ObjectKey, ServiceObject};
use crate::error::ObjectError;
use crate::labels::{TRAFFIC_HINT_ANNOTATION, ignored_by_selectors};
use crate::names;

/// An IP family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum IpFamily {
    /// IPv4
    V4,
    /// IPv6
    V6,
}

impl IpFamily {
    /// Both families, IPv4 first.
    pub const BOTH: [IpFamily; 2] = [IpFamily::V4, IpFamily::V6];

    /// The family of an address.
    pub fn of(ip: &IpAddr) -> Self {
        if ip.is_ipv4() { IpFamily::V4 } else { IpFamily::V6 }
    }

    /// The family of a network.
    pub fn of_net(net: &IpNet) -> Self {
        Self::of(&net.addr())
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        })
    }
}

/// A transport protocol a Service port can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Protocol {
    /// TCP
    Tcp,
    /// UDP
    Udp,
    /// SCTP
    Sctp,
}

impl Protocol {
    /// Lower-case name as nftables and iptables spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// Parses the Kubernetes spelling (`TCP`, `UDP`, `SCTP`); absent means TCP.
    pub fn from_k8s(value: Option<&str>) -> Result<Self, String> {
        match value.unwrap_or("TCP") {
            "TCP" => Ok(Protocol::Tcp),
            "UDP" => Ok(Protocol::Udp),
            "SCTP" => Ok(Protocol::Sctp),
            other => Err(format!("unsupported protocol {other:?} (want TCP, UDP or SCTP)")),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The per-Service opt-in of KEP-4963 (Services acceleration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum TrafficHint {
    /// Connections are long-lived: offload them to a flowtable once established.
    LongLived,
}

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServicePortSpec {
    /// Port name ("" when the Service has a single unnamed port).
    pub name: String,
    /// Protocol.
    pub protocol: Protocol,
    /// The Service port.
    pub port: u16,
    /// The node port, when the Service type allocates one.
    pub node_port: Option<u16>,
}

/// A Service, validated.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceInfo {
    /// Namespace and name.
    pub key: ObjectKey,
    /// `spec.clusterIPs` (one per family at most).
    pub cluster_ips: Vec<IpAddr>,
    /// Ports.
    pub ports: Vec<ServicePortSpec>,
    /// `spec.externalIPs`.
    pub external_ips: Vec<IpAddr>,
    /// `status.loadBalancer.ingress[].ip` of type LoadBalancer services, except `ipMode: Proxy`.
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges` (only meaningful with load balancer IPs).
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// `externalTrafficPolicy: Local` on a Service that accepts external traffic.
    pub external_policy_local: bool,
    /// `internalTrafficPolicy: Local`.
    pub internal_policy_local: bool,
    /// ClientIP session affinity timeout in seconds, when affinity is on.
    pub session_affinity_timeout: Option<u32>,
    /// `spec.healthCheckNodePort` (eTP Local LoadBalancer services).
    pub health_check_node_port: Option<u16>,
    /// KEP-4963 opt-in.
    pub traffic_hint: Option<TrafficHint>,
}

/// Default ClientIP affinity timeout (3 hours), as the API server defaults it.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

impl ServiceInfo {
    /// True when the Service accepts traffic from outside the cluster network
    /// (node ports, external IPs or load balancer IPs).
    pub fn externally_accessible(&self) -> bool {
        self.ports.iter().any(|p| p.node_port.is_some())
            || !self.external_ips.is_empty()
            || !self.load_balancer_ips.is_empty()
    }

    /// Validates a Service. `Ok(None)` means the Service is valid but kube-proxy ignores it
    /// (headless, ExternalName, or owned by another proxy).
    pub fn from_object(obj: &ServiceObject) -> Result<Option<Self>, ObjectError> {
        let svc = &obj.service;
        let key = ObjectKey::of(&svc.metadata);
        let err = |field: &str, reason: String| ObjectError::new(Kind::Service, &key, field, reason);
        if key.name.is_empty() {
            return Err(err("metadata.name", "missing".into()));
        }
        names::dns1123_label(&key.namespace).map_err(|e| err("metadata.namespace", e))?;
        names::dns1035_label(&key.name).map_err(|e| err("metadata.name", e))?;
        if ignored_by_selectors(svc.metadata.labels.as_ref()) {
            return Ok(None);
        }
        let Some(spec) = svc.spec.as_ref() else { return Ok(None) };
        let svc_type = spec.type_.as_deref().unwrap_or("ClusterIP");
        if svc_type == "ExternalName" {
            return Ok(None);
        }
        if !matches!(svc_type, "ClusterIP" | "NodePort" | "LoadBalancer") {
            return Err(err("spec.type", format!("unknown service type {svc_type:?}")));
        }

        let mut cluster_ip_strings: Vec<&str> = spec.cluster_ips.iter().flatten().map(String::as_str).collect();
        if cluster_ip_strings.is_empty() {
            cluster_ip_strings.extend(spec.cluster_ip.as_deref());
        }
        if cluster_ip_strings.is_empty() || cluster_ip_strings.iter().any(|ip| ip.is_empty() || *ip == "None") {
            return Ok(None); // headless or not yet allocated
        }
        // Vecs sized exactly: a cluster holds one of each per Service.
        let mut cluster_ips = Vec::with_capacity(cluster_ip_strings.len());
        for (i, ip) in cluster_ip_strings.iter().enumerate() {
            let ip = parse_ip(ip).map_err(|e| err(&format!("spec.clusterIPs[{i}]"), e))?;
            if cluster_ips.iter().any(|c| IpFamily::of(c) == IpFamily::of(&ip)) {
                return Err(err(&format!("spec.clusterIPs[{i}]"), "two cluster IPs of the same family".into()));
            }
            cluster_ips.push(ip);
        }

        let exposes_node_ports = matches!(svc_type, "NodePort" | "LoadBalancer");
        let mut ports = Vec::with_capacity(spec.ports.as_ref().map_or(0, Vec::len));
        for (i, p) in spec.ports.iter().flatten().enumerate() {
            let field = format!("spec.ports[{i}]");
            let protocol =
                Protocol::from_k8s(p.protocol.as_deref()).map_err(|e| err(&format!("{field}.protocol"), e))?;
            let port = port_number(p.port).map_err(|e| err(&format!("{field}.port"), e))?;
            let node_port = match p.node_port {
                Some(np) if exposes_node_ports && np != 0 => {
                    Some(port_number(np).map_err(|e| err(&format!("{field}.nodePort"), e))?)
                }
                _ => None,
            };
            let name = p.name.clone().unwrap_or_default();
            if !name.is_empty() {
                names::dns1123_label(&name).map_err(|e| err(&format!("{field}.name"), e))?;
            }
            if ports.iter().any(|q: &ServicePortSpec| q.name == name && q.protocol == protocol) {
                return Err(err(&format!("{field}.name"), format!("duplicate port name {name:?}")));
            }
            ports.push(ServicePortSpec { name, protocol, port, node_port });
        }

        let external_ips = spec
            .external_ips
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, ip)| parse_ip(ip).map_err(|e| err(&format!("spec.externalIPs[{i}]"), e)))
            .collect::<Result<Vec<_>, _>>()?;

        let mut load_balancer_ips = Vec::new();
        if svc_type == "LoadBalancer" {
            let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
            for (i, ing) in ingress.into_iter().flatten().enumerate() {
                // ipMode Proxy: the load balancer delivers traffic to the node with its own
                // destination, so the proxy must not capture the VIP (KEP-1860).
                if ing.ip_mode.as_deref() == Some("Proxy") {
                    continue;
                }
                if let Some(ip) = ing.ip.as_deref().filter(|ip| !ip.is_empty()) {
                    let ip = parse_ip(ip).map_err(|e| err(&format!("status.loadBalancer.ingress[{i}].ip"), e))?;
                    if !load_balancer_ips.contains(&ip) {
                        load_balancer_ips.push(ip);
                    }
                }
            }
        }

        let load_balancer_source_ranges = spec
            .load_balancer_source_ranges
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, cidr)| {
                IpNet::from_str(cidr.trim())
                    .map(|n| n.trunc())
                    .map_err(|_| err(&format!("spec.loadBalancerSourceRanges[{i}]"), format!("invalid CIDR {cidr:?}")))
            })
            .collect::<Result<Vec<_>, _>>()?;

        let policy_local = |field: &str, value: Option<&str>| match value.unwrap_or("Cluster") {
            "Cluster" => Ok(false),
            "Local" => Ok(true),
            other => Err(err(field, format!("unknown traffic policy {other:?} (want Cluster or Local)"))),
        };
        let internal_policy_local =
            policy_local("spec.internalTrafficPolicy", spec.internal_traffic_policy.as_deref())?;
        let etp_local = policy_local("spec.externalTrafficPolicy", spec.external_traffic_policy.as_deref())?;

        let session_affinity_timeout = match spec.session_affinity.as_deref().unwrap_or("None") {
            "None" => None,
            "ClientIP" => {
                let timeout = spec
                    .session_affinity_config
                    .as_ref()
                    .and_then(|c| c.client_ip.as_ref())
                    .and_then(|c| c.timeout_seconds)
                    .unwrap_or(DEFAULT_AFFINITY_TIMEOUT as i32);
                if !(1..=86_400).contains(&timeout) {
                    return Err(err(
                        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                        format!("{timeout} is outside 1..=86400"),
                    ));
                }
                Some(timeout as u32)
            }
            other => return Err(err("spec.sessionAffinity", format!("unknown value {other:?}"))),
        };

        let health_check_node_port = match spec.health_check_node_port {
            Some(p) if p != 0 => Some(port_number(p).map_err(|e| err("spec.healthCheckNodePort", e))?),
            _ => None,
        };

        let traffic_hint = parse_traffic_hint(obj);

        let mut info = ServiceInfo {
            key,
            cluster_ips,
            ports,
            external_ips,
            load_balancer_ips,
            load_balancer_source_ranges,
            external_policy_local: false,
            internal_policy_local,
            session_affinity_timeout,
            health_check_node_port,
            traffic_hint,
        };
        // externalTrafficPolicy only means something for Services that accept external traffic.
        info.external_policy_local = etp_local && info.externally_accessible();
        Ok(Some(info))
    }
}

fn raw_traffic_hint(obj: &ServiceObject) -> Option<&str> {
    // spec.trafficHint wins over the annotation.
    let annotation = obj.service.metadata.annotations.as_ref().and_then(|a| a.get(TRAFFIC_HINT_ANNOTATION));
    obj.traffic_hint.as_deref().or(annotation.map(String::as_str)).filter(|v| !v.is_empty())
}

fn parse_traffic_hint(obj: &ServiceObject) -> Option<TrafficHint> {
    (raw_traffic_hint(obj) == Some("LongLived")).then_some(TrafficHint::LongLived)
}

/// A traffic hint that is set but not understood: the hint is ignored (the Service is still
/// proxied) and the caller reports it.
pub(crate) fn invalid_traffic_hint(obj: &ServiceObject) -> Option<String> {
    raw_traffic_hint(obj).filter(|v| *v != "LongLived").map(str::to_owned)
}

pub(crate) fn parse_ip(s: &str) -> Result<IpAddr, String> {
    IpAddr::from_str(s.trim()).map_err(|_| format!("invalid IP address {s:?}"))
}

pub(crate) fn port_number(p: i32) -> Result<u16, String> {
    u16::try_from(p).ok().filter(|p| *p != 0).ok_or_else(|| format!("port {p} is outside 1..=65535"))
}

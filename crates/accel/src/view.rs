//! What is accelerated: the connection counter behind the metric, and a per-service view of
//! the connections the flowtable holds right now.
//!
//! The kernel does not count flowtable inserts. The forward chain's first `flow add` rule sets
//! a second conntrack mark bit and matches only while that bit is clear, so its `counter` counts
//! each connection once. Per-service numbers come from conntrack itself: entries flagged
//! `[OFFLOAD]`, attributed to a service port by their original destination (the frontend the
//! client addressed, before DNAT) — O(opted-in ports + offloaded entries), no per-service rules.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::{Command, Stdio};

use kproxy_plan::ServicePortName;
use kproxy_state::{IpFamily, Protocol};

use crate::elements::ElementIndex;
use crate::error::AccelError;

/// One connection the flowtable holds, by the frontend it was addressed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OffloadedConnection {
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Original destination address (ClusterIP, external/LB IP, or a node address).
    pub destination: IpAddr,
    /// Original destination port.
    pub port: u16,
}

/// One accelerated service port and how many of its connections are offloaded now.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceAcceleration {
    /// Family of the service port.
    pub family: IpFamily,
    /// The service port.
    pub service: ServicePortName,
    /// Connections to it in the flowtable now.
    pub offloaded_connections: usize,
}

/// Groups offloaded connections by the service port whose frontend they addressed.
pub(crate) fn group_by_service(index: &ElementIndex, offloaded: &[OffloadedConnection]) -> Vec<ServiceAcceleration> {
    let mut counts: BTreeMap<&(IpFamily, ServicePortName), usize> = index.ports().map(|key| (key, 0)).collect();
    for connection in offloaded {
        let family = if connection.destination.is_ipv4() { IpFamily::V4 } else { IpFamily::V6 };
        let Some(owners) = index.owners_of(connection.protocol, connection.destination, connection.port) else {
            continue;
        };
        for owner in owners.iter().filter(|(owner_family, _)| *owner_family == family) {
            if let Some(count) = counts.get_mut(owner) {
                *count += 1;
            }
        }
    }
    counts
        .into_iter()
        .map(|((family, service), offloaded_connections)| ServiceAcceleration {
            family: *family,
            service: service.clone(),
            offloaded_connections,
        })
        .collect()
}

/// The offloaded connections of both families in the calling thread's network namespace
/// (`conntrack -L`, entries flagged `[OFFLOAD]`).
pub fn offloaded_connections() -> Result<Vec<OffloadedConnection>, AccelError> {
    let mut out = Vec::new();
    for family in ["ipv4", "ipv6"] {
        let output = Command::new("conntrack")
            .args(["-L", "-f", family])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .map_err(|source| AccelError::Spawn { program: "conntrack".into(), source })?;
        out.extend(String::from_utf8_lossy(&output.stdout).lines().filter_map(parse_offloaded));
    }
    Ok(out)
}

/// One `conntrack -L` line, when it is an offloaded TCP or UDP entry. The first `dst=` and
/// `dport=` are the original direction's.
pub fn parse_offloaded(line: &str) -> Option<OffloadedConnection> {
    if !line.contains("[OFFLOAD]") && !line.contains("[HW_OFFLOAD]") {
        return None;
    }
    let mut words = line.split_whitespace();
    let protocol = match words.next()? {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        _ => return None,
    };
    let field = |name: &str| line.split_whitespace().find_map(|w| w.strip_prefix(name));
    Some(OffloadedConnection {
        protocol,
        destination: field("dst=")?.parse().ok()?,
        port: field("dport=")?.parse().ok()?,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn offloaded_lines_are_parsed_by_original_destination() {
        let line = "tcp      6 src=198.18.0.10 dst=198.18.128.10 sport=40000 dport=80 packets=30 bytes=9000 \
                    src=198.18.17.10 dst=198.18.0.10 sport=8080 dport=40000 packets=25 bytes=100000 [OFFLOAD] mark=1048576 use=2";
        assert_eq!(
            parse_offloaded(line),
            Some(OffloadedConnection {
                protocol: Protocol::Tcp,
                destination: "198.18.128.10".parse().unwrap(),
                port: 80
            })
        );
        assert_eq!(parse_offloaded(&line.replace("[OFFLOAD] ", "[ASSURED] ")), None);
        let udp = "udp      17 src=fd00:18::10 dst=fd00:96::10 sport=5000 dport=53 src=fd00:10:17::a dst=fd00:18::10 sport=53 dport=5000 [OFFLOAD] mark=0 use=2";
        assert_eq!(parse_offloaded(udp).map(|c| c.port), Some(53));
    }
}

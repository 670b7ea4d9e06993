//! Upstream's chain names, so tools and CNIs that look for them find them.
//!
//! `KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-`, `KUBE-FW-` carry the first 16 characters of
//! base32(sha256(servicePortName + protocol)); `KUBE-SEP-` hashes the endpoint in as well.
//! The service port name is upstream's spelling `ns/svc:port` (`ns/svc` for an unnamed port)
//! and the protocol is lower case, so a node switching from kube-proxy keeps the same names.
//! Names stay under iptables' 28-character limit.

use kproxy_plan::{Endpoint, ServicePortName};
use sha2::{Digest, Sha256};

/// Prefixes of the per-service chains kproxy owns in the nat table.
pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"];

/// Upstream's `ns/svc:port` spelling.
pub fn port_name(name: &ServicePortName) -> String {
    if name.port.is_empty() {
        format!("{}/{}", name.namespace, name.service)
    } else {
        format!("{}/{}:{}", name.namespace, name.service, name.port)
    }
}

fn proto_hash(name: &ServicePortName) -> String {
    hash16(&format!("{}{}", port_name(name), name.protocol.as_str()))
}

/// `KUBE-SVC-<hash>`: picks among the cluster-policy endpoints.
pub fn svc_chain(name: &ServicePortName) -> String {
    format!("KUBE-SVC-{}", proto_hash(name))
}

/// `KUBE-SVL-<hash>`: picks among the local-policy endpoints.
pub fn svl_chain(name: &ServicePortName) -> String {
    format!("KUBE-SVL-{}", proto_hash(name))
}

/// `KUBE-EXT-<hash>`: applies externalTrafficPolicy.
pub fn ext_chain(name: &ServicePortName) -> String {
    format!("KUBE-EXT-{}", proto_hash(name))
}

/// `KUBE-FW-<hash>`: applies loadBalancerSourceRanges.
pub fn fw_chain(name: &ServicePortName) -> String {
    format!("KUBE-FW-{}", proto_hash(name))
}

/// `KUBE-SEP-<hash>`: one endpoint (hairpin masquerade, affinity, DNAT).
pub fn sep_chain(name: &ServicePortName, ep: &Endpoint) -> String {
    let base = format!("{}{}{}", port_name(name), name.protocol.as_str(), endpoint_string(ep));
    format!("KUBE-SEP-{}", hash16(&base))
}

/// `ip:port`, IPv6 in brackets (Go's `net.JoinHostPort`).
pub fn endpoint_string(ep: &Endpoint) -> String {
    match ep.ip {
        std::net::IpAddr::V4(v4) => format!("{v4}:{}", ep.port),
        std::net::IpAddr::V6(v6) => format!("[{v6}]:{}", ep.port),
    }
}

/// Whether `chain` is a per-service chain name kproxy (or kube-proxy) creates.
pub fn is_service_chain(chain: &str) -> bool {
    SERVICE_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// The first 16 characters of the RFC 4648 base32 encoding of sha256(`s`): exactly 80 bits.
pub fn hash16(s: &str) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let digest = Sha256::digest(s.as_bytes());
    let bits = digest[..10].iter().fold(0u128, |acc, b| (acc << 8) | u128::from(*b));
    (0..16).map(|i| ALPHABET[((bits >> (75 - 5 * i)) & 31) as usize] as char).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kproxy_state::Protocol;

    use super::*;

    fn spn(port: &str) -> ServicePortName {
        ServicePortName { namespace: "ns1".into(), service: "svc1".into(), port: port.into(), protocol: Protocol::Tcp }
    }

    #[test]
    fn names_match_upstream_golden_rules() {
        // Upstream's iptables golden dump (proxier_test.go) names ns1/svc1:p80 TCP
        // "KUBE-SVC-XPGD46QRK7WJZT7O" and its endpoint 10.180.0.1:80 "KUBE-SEP-SXIVWICOYRO3J4NJ".
        assert_eq!(svc_chain(&spn("p80")), "KUBE-SVC-XPGD46QRK7WJZT7O");
        let ep = Endpoint { ip: "10.180.0.1".parse().unwrap(), port: 80, is_local: false, ready: true };
        assert_eq!(sep_chain(&spn("p80"), &ep), "KUBE-SEP-SXIVWICOYRO3J4NJ");
    }

    #[test]
    fn unnamed_ports_and_ipv6_endpoints_are_spelled_like_upstream() {
        assert_eq!(port_name(&spn("")), "ns1/svc1");
        let ep = Endpoint { ip: "fd00::1".parse().unwrap(), port: 8080, is_local: true, ready: true };
        assert_eq!(endpoint_string(&ep), "[fd00::1]:8080");
        assert!(is_service_chain(&sep_chain(&spn(""), &ep)));
        assert!(!is_service_chain("KUBE-SERVICES"));
        assert!(svc_chain(&spn("")).len() <= 28);
    }
}

//! Upstream kube-proxy v1.36.2 next to kproxy: its command line, and the names its rules carry,
//! so the benchmark can find a change of one endpoint in the kernel by a point lookup.

use std::net::IpAddr;

use kproxy_iptables::naming::hash16;

use super::super::objects::{self, TARGET_PORT};

/// Upstream's nftables table (both families).
pub const NFT_TABLE: &str = "kube-proxy";
/// Upstream's map from `ClusterIP . protocol . port` to the Service's chain.
pub const SERVICE_IPS: &str = "service-ips";

/// The nftables chain of Service `i`'s port `http` in upstream's table (`service-`, the first 8
/// characters of base32(sha256(name)), then `ns/svc/tcp/http`): its one rule picks an endpoint
/// from an anonymous map of `address . port`.
pub fn nft_service_chain(i: usize) -> String {
    let (namespace, service) = objects::name(i);
    nft_service_chain_of(&namespace, &service)
}

/// The same for Service `namespace/service`.
pub fn nft_service_chain_of(namespace: &str, service: &str) -> String {
    let name = format!("{namespace}/{service}/tcp/http");
    format!("service-{}-{name}", &hash16(&name)[..8])
}

/// The iptables chain upstream creates for endpoint `ip` of Service `i`'s port `http`
/// (`KUBE-SEP-` and base32(sha256(`ns/svc:http` + `tcp` + `ip:port`)), as kproxy names it too).
pub fn iptables_endpoint_chain(i: usize, ip: IpAddr) -> String {
    let (namespace, service) = objects::name(i);
    iptables_endpoint_chain_of(&namespace, &service, ip)
}

/// The same for Service `namespace/service`.
pub fn iptables_endpoint_chain_of(namespace: &str, service: &str, ip: IpAddr) -> String {
    let endpoint = match ip {
        IpAddr::V4(v4) => format!("{v4}:{TARGET_PORT}"),
        IpAddr::V6(v6) => format!("[{v6}]:{TARGET_PORT}"),
    };
    format!("KUBE-SEP-{}", hash16(&format!("{namespace}/{service}:httptcp{endpoint}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_carry_upstreams_hash_and_name() {
        // As kube-proxy v1.36.2 named them in the kernel (`nft list table ip kube-proxy`).
        assert_eq!(nft_service_chain(2), "service-QHP6NKX6-ns-0/svc-2/tcp/http");
        assert_eq!(nft_service_chain(0), "service-XS2ODQL6-bench/web/tcp/http");
        let ip: IpAddr = "198.18.48.1".parse().unwrap_or(IpAddr::from([0; 4]));
        assert!(iptables_endpoint_chain(1, ip).starts_with("KUBE-SEP-"));
        assert_eq!(iptables_endpoint_chain(1, ip).len(), "KUBE-SEP-".len() + 16);
    }
}

//! What kproxy learns about its own node from the host: name and interface addresses.

use std::net::IpAddr;

use kproxy_config::ProxyConfig;
use kproxy_plan::NodeContext;

/// The node name: `--hostname-override`, else the kernel's hostname (lower-cased, as upstream).
pub fn node_name(config: &ProxyConfig) -> String {
    if let Some(name) = config.hostname_override.as_deref().filter(|n| !n.is_empty()) {
        return name.to_owned();
    }
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .map(|h| h.trim().to_lowercase())
        .unwrap_or_default()
}

/// Addresses of every interface in this network namespace (for `nodePortAddresses`) but the
/// Service VIPs on IPVS's dummy interface, which are not the node's (as upstream's IPVS mode).
/// A failed read is an error, never "no addresses": that would take every NodePort away.
pub fn local_addresses() -> nix::Result<Vec<IpAddr>> {
    let addrs = nix::ifaddrs::getifaddrs()?;
    let mut out: Vec<IpAddr> = addrs
        .filter(|a| a.interface_name != kproxy_ipvs::DUMMY_INTERFACE)
        .filter_map(|a| a.address)
        .filter_map(|sa| {
            if let Some(v4) = sa.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                sa.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// The node context the planner needs.
pub fn context(config: &ProxyConfig, name: String) -> NodeContext {
    NodeContext {
        name,
        // bindAddress overrides kube-proxy's idea of the node IP (0.0.0.0 / :: mean "not set").
        node_ip_override: Some(config.bind_address).filter(|ip| !ip.is_unspecified()).into_iter().collect(),
        local_addresses: local_addresses().unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot read the node's addresses: none known until the next read");
            Vec::new()
        }),
    }
}

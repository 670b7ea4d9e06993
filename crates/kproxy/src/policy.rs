//! From the configuration to the plan's policy: the one place config vocabulary meets the plan's.

use kproxy_config::{NodePortAddress as CfgAddress, ProxyConfig};
use kproxy_plan::{DetectLocal, NodePortAddress, ProxyPolicy};
use kproxy_state::IpFamily;

/// The plan policy a configuration asks for, on a node with both families.
pub fn proxy_policy(config: &ProxyConfig) -> ProxyPolicy {
    proxy_policy_for(config, IpFamily::BOTH.to_vec())
}

/// The plan policy a configuration asks for, for the families the node has
/// ([`crate::families::probe`]).
pub fn proxy_policy_for(config: &ProxyConfig, families: Vec<IpFamily>) -> ProxyPolicy {
    ProxyPolicy {
        families,
        masquerade_all: config.masquerade_all,
        detect_local: match &config.detect_local {
            kproxy_config::DetectLocal::ClusterCidr(cidrs) => DetectLocal::ClusterCidr(cidrs.clone()),
            kproxy_config::DetectLocal::NodeCidr => DetectLocal::NodeCidr,
            kproxy_config::DetectLocal::BridgeInterface(name) => DetectLocal::BridgeInterface(name.clone()),
            kproxy_config::DetectLocal::InterfaceNamePrefix(prefix) => DetectLocal::InterfaceNamePrefix(prefix.clone()),
        },
        nodeport_addresses: config
            .node_port_addresses
            .iter()
            .map(|a| match a {
                CfgAddress::Primary => NodePortAddress::Primary,
                CfgAddress::All => NodePortAddress::All,
                CfgAddress::Localhost => NodePortAddress::Localhost,
                CfgAddress::Cidr(net) => NodePortAddress::Cidr(*net),
            })
            .collect(),
        no_masquerade_cidrs: config.no_masquerade_cidrs.clone(),
        snat_to_node_ip: config.snat_to_node_ip,
        acceleration: config.acceleration.active(),
        list_local_addresses: config.mode == kproxy_config::ProxyMode::Ipvs,
    }
}

//! Per-Service counters (opt-in: [`crate::Config::service_counters`]).
//!
//! No chain or rule per Service comes back for them: the maps every new connection is looked up
//! in are declared with `counter` ([`skeleton::COUNTED`]), so each destination's element counts
//! the new connections that took it, and an endpoint change stays an element change. What the
//! elements mean, per service port:
//!
//! - the dispatch maps (`service-ips`, `service-nodeports`, in the nat chains, which see only
//!   the first packet of a connection) count connections sent to the port's chains;
//! - the no-endpoint maps (behind `ct state new` in the filter chains) count the connections
//!   rejected (no endpoints) or dropped (a Local policy without local endpoints: those also went
//!   through the dispatch map, whose count includes them);
//! - `firewall-dests` (behind `ct state new`, before DNAT) counts every new connection to a
//!   LoadBalancer IP with source ranges: those that did not reach the nat chains were dropped by
//!   the ranges.
//!
//! Counts are of new connections (UDP: new conntrack flows), not of packets or bytes after the
//! first. Reading is one dump per map and family; the maps are read one after the other, so a
//! connection in flight may be seen by one and not yet by the next (the differences saturate at
//! zero). When two service ports claim one destination, both report its element (the table
//! holds it once, for the first by name).

use std::collections::HashMap;

use kproxy_nft_model::{Key, TableRef};
use kproxy_plan::explain::ConnectionCounts;
use kproxy_plan::{NoEndpointsVerdict, Plan, ServicePortName, ServicePortPlan};
use kproxy_state::IpFamily;

use crate::ruleset::{Destination, skeleton};
use crate::sync::{Config, ctx};

/// The new connections of one service port (of one family), by what became of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePortCounts {
    /// The family.
    pub family: IpFamily,
    /// The service port.
    pub name: ServicePortName,
    /// The counts.
    pub counts: ConnectionCounts,
}

/// The destinations of a service port as the counted maps key them, each with whether it is a
/// LoadBalancer IP behind source ranges.
fn destinations(p: &ServicePortPlan) -> Vec<(Destination, bool)> {
    let addr = |a: &std::net::IpAddr| Destination::Address(*a, p.protocol, p.port);
    let mut out = vec![(addr(&p.cluster_ip), false)];
    if p.external.is_some() {
        let firewalled = !p.source_ranges.is_empty();
        out.extend(p.external_ips.iter().map(|ip| (addr(ip), false)));
        out.extend(p.load_balancer_ips.iter().map(|ip| (addr(ip), firewalled)));
        out.extend(p.node_port.map(|np| (Destination::NodePort(p.protocol, np), false)));
    }
    out
}

/// The counts of every service port of `plan`, from the kernel through `read`: given a table,
/// one of [`skeleton::COUNTED`] and keys, it returns each key's count of packets (`None` for a
/// key without an element).
pub fn read<E>(
    config: &Config,
    plan: &Plan,
    mut read: impl FnMut(&TableRef, &str, &[Key]) -> Result<Vec<Option<u64>>, E>,
) -> Result<Vec<ServicePortCounts>, E> {
    let mut out = Vec::new();
    for (&family, fam) in &plan.families {
        let table = ctx(config, family).table;
        let ports: Vec<(&ServicePortPlan, Vec<(Destination, bool)>)> =
            fam.services.values().map(|p| (p.as_ref(), destinations(p))).collect();
        let all: Vec<(Destination, bool)> = ports.iter().flat_map(|(_, d)| d.iter().copied()).collect();
        let keys = |nodeport: bool| -> Vec<Key> {
            all.iter()
                .filter(|(d, _)| matches!(d, Destination::NodePort(..)) == nodeport)
                .map(|(d, _)| d.key())
                .collect()
        };
        let (address_keys, nodeport_keys) = (keys(false), keys(true));
        let firewall_keys: Vec<Key> = all.iter().filter(|(_, fw)| *fw).map(|(d, _)| d.key()).collect();
        let mut counted = |set: &str, keys: &[Key]| -> Result<HashMap<Key, u64>, E> {
            let counts = read(&table, set, keys)?;
            Ok(keys.iter().cloned().zip(counts).filter_map(|(k, c)| Some((k, c?))).collect())
        };
        let dispatched = counted(skeleton::SERVICE_IPS, &address_keys)?;
        let dispatched_np = counted(skeleton::SERVICE_NODEPORTS, &nodeport_keys)?;
        let no_endpoints = counted(skeleton::NO_ENDPOINT_SERVICES, &address_keys)?;
        let no_endpoints_np = counted(skeleton::NO_ENDPOINT_NODEPORTS, &nodeport_keys)?;
        let firewall = counted(skeleton::FIREWALL_DESTS, &firewall_keys)?;
        for (p, dests) in ports {
            let mut c = ConnectionCounts::default();
            for (d, firewalled) in dests {
                let key = d.key();
                let (dispatch, none) = match d {
                    Destination::NodePort(..) => (&dispatched_np, &no_endpoints_np),
                    Destination::Address(..) => (&dispatched, &no_endpoints),
                };
                let through = dispatch.get(&key).copied();
                let refused = none.get(&key).copied().unwrap_or(0);
                let external = !matches!(d, Destination::Address(ip, ..) if ip == p.cluster_ip);
                let verdict =
                    if external { p.external.as_ref().and_then(|e| e.no_endpoints) } else { p.internal.no_endpoints };
                match verdict {
                    Some(NoEndpointsVerdict::Reject) => c.rejected_no_endpoints += refused,
                    Some(NoEndpointsVerdict::Drop) => c.dropped_no_local_endpoints += refused,
                    None => {}
                }
                // A Local policy's drops went through the dispatch map first.
                c.served += through.unwrap_or(0).saturating_sub(if through.is_some() { refused } else { 0 });
                if firewalled {
                    let reached_nat = through.unwrap_or(refused);
                    let seen = firewall.get(&key).copied().unwrap_or(0);
                    c.dropped_by_source_ranges += seen.saturating_sub(reached_nat);
                }
            }
            out.push(ServicePortCounts { family, name: p.name.clone(), counts: c });
        }
    }
    Ok(out)
}

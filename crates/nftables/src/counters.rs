//! Per-Service counters (opt-in: [`crate::Config::service_counters`]).
//!
//! No chain or rule per Service comes back for them: the maps every new connection is looked up
//! in are declared with `counter` ([`skeleton::COUNTED`]), so each destination's element counts
//! the new connections that took it, and two counted sets keyed like the dispatch maps
//! ([`skeleton::SERVICE_TRAFFIC`], [`skeleton::NODEPORT_TRAFFIC`]) count the packets and bytes of
//! the connections served; an endpoint change stays an element change, and a service change
//! adds or removes its destinations' elements with the rest of them. What the elements mean,
//! per service port:
//!
//! - the dispatch maps (`service-ips`, `service-nodeports`, in the nat chains, which see only
//!   the first packet of a connection) count connections sent to the port's chains;
//! - the no-endpoint maps (behind `ct state new` in the filter chains) count the connections
//!   rejected (no endpoints) or dropped (a Local policy without local endpoints: those also went
//!   through the dispatch map, whose count includes them);
//! - `firewall-dests` (behind `ct state new`, before DNAT) counts every new connection to a
//!   LoadBalancer IP with source ranges: those that did not reach the nat chains were dropped by
//!   the ranges;
//! - `service-traffic` / `nodeport-traffic` (in the filter chains' `count-service-traffic`, see
//!   `skeleton::traffic_counting`) count every packet, in both directions, of the connections
//!   that were DNATed, keyed by the destination the client opened the connection to.
//!
//! Connection counts are of new connections (UDP: new conntrack flows): a refused packet is a
//! refused connection, so a client that retries counts once per attempt. Packets and bytes:
//!
//! - served: every packet of a served connection, request and reply, as the kernel handles it
//!   (bytes are IP bytes, headers included; with GRO, several segments arrive as one packet);
//! - rejected / dropped (no endpoints, no local endpoint, source ranges): the packets refused,
//!   which are the connections' first packets (a reject's answer is not counted).
//!
//! The extra per-packet cost (conntrack reads and one or two set lookups for each packet of a
//! DNATed connection) exists only with counters on. Reading is one dump per set and family; the
//! sets are read one after the other, so a connection in flight may be seen by one and not yet
//! by the next (the differences saturate at zero). When two service ports claim one
//! destination, both report its element (the table holds it once, for the first by name).

use std::collections::HashMap;

use kproxy_nft_model::{Key, TableRef};
use kproxy_plan::explain::ConnectionCounts;
use kproxy_plan::{NoEndpointsVerdict, Plan, ServicePortName, ServicePortPlan};
use kproxy_state::IpFamily;

use crate::ruleset::{Destination, skeleton};
use crate::sync::{Config, ctx};

/// What one counted element counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ElementCount {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// The counts of one service port (of one family), by what became of its traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePortCounts {
    /// The family.
    pub family: IpFamily,
    /// The service port.
    pub name: ServicePortName,
    /// New connections.
    pub counts: ConnectionCounts,
    /// Packets, by the same verdicts.
    pub packets: ConnectionCounts,
    /// Bytes (IP packets, headers included), by the same verdicts.
    pub bytes: ConnectionCounts,
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

/// What the counted elements of one destination saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Seen {
    /// Its dispatch map element (`None`: none in the table).
    dispatched: Option<ElementCount>,
    /// Its no-endpoint map element.
    refused: ElementCount,
    /// Its `firewall-dests` element (LoadBalancer IPs with source ranges).
    firewall: ElementCount,
    /// Its traffic set element.
    traffic: ElementCount,
}

/// How a destination's elements add to its service port's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rules {
    /// What its no-endpoint element does.
    no_endpoints: Option<NoEndpointsVerdict>,
    /// A LoadBalancer IP behind source ranges.
    firewalled: bool,
}

/// The connections, packets and bytes one destination's elements add.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tally {
    connections: ConnectionCounts,
    packets: ConnectionCounts,
    bytes: ConnectionCounts,
}

impl Tally {
    fn add(&mut self, seen: &Seen, rules: Rules) {
        refusals(&mut self.connections, seen, rules, |c| c.packets);
        refusals(&mut self.packets, seen, rules, |c| c.packets);
        refusals(&mut self.bytes, seen, rules, |c| c.bytes);
        // A Local policy's drops went through the dispatch map first.
        if let Some(d) = seen.dispatched {
            self.connections.served += d.packets.saturating_sub(seen.refused.packets);
        }
        self.packets.served += seen.traffic.packets;
        self.bytes.served += seen.traffic.bytes;
    }
}

/// Adds what `seen` refused, in the unit `of` picks (each refused packet is a refused connection).
fn refusals(c: &mut ConnectionCounts, seen: &Seen, rules: Rules, of: impl Fn(ElementCount) -> u64) {
    match rules.no_endpoints {
        Some(NoEndpointsVerdict::Reject) => c.rejected_no_endpoints += of(seen.refused),
        Some(NoEndpointsVerdict::Drop) => c.dropped_no_local_endpoints += of(seen.refused),
        None => {}
    }
    if rules.firewalled {
        let reached_nat = seen.dispatched.unwrap_or(seen.refused);
        c.dropped_by_source_ranges += of(seen.firewall).saturating_sub(of(reached_nat));
    }
}

/// The counts of every service port of `plan`, from the kernel through `read`: given a table,
/// one of the counted sets and keys, it returns each key's count (`None` for a key without an
/// element).
pub fn read<E>(
    config: &Config,
    plan: &Plan,
    mut read: impl FnMut(&TableRef, &str, &[Key]) -> Result<Vec<Option<ElementCount>>, E>,
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
        let mut counted = |set: &str, keys: &[Key]| -> Result<HashMap<Key, ElementCount>, E> {
            let counts = read(&table, set, keys)?;
            Ok(keys.iter().cloned().zip(counts).filter_map(|(k, c)| Some((k, c?))).collect())
        };
        let dispatched = counted(skeleton::SERVICE_IPS, &address_keys)?;
        let dispatched_np = counted(skeleton::SERVICE_NODEPORTS, &nodeport_keys)?;
        let no_endpoints = counted(skeleton::NO_ENDPOINT_SERVICES, &address_keys)?;
        let no_endpoints_np = counted(skeleton::NO_ENDPOINT_NODEPORTS, &nodeport_keys)?;
        let firewall = counted(skeleton::FIREWALL_DESTS, &firewall_keys)?;
        let traffic = counted(skeleton::SERVICE_TRAFFIC, &address_keys)?;
        let traffic_np = counted(skeleton::NODEPORT_TRAFFIC, &nodeport_keys)?;
        for (p, dests) in ports {
            let mut tally = Tally::default();
            for (d, firewalled) in dests {
                let key = d.key();
                let (dispatch, none, served) = match d {
                    Destination::NodePort(..) => (&dispatched_np, &no_endpoints_np, &traffic_np),
                    Destination::Address(..) => (&dispatched, &no_endpoints, &traffic),
                };
                let get = |m: &HashMap<Key, ElementCount>| m.get(&key).copied().unwrap_or_default();
                let seen = Seen {
                    dispatched: dispatch.get(&key).copied(),
                    refused: get(none),
                    firewall: get(&firewall),
                    traffic: get(served),
                };
                let external = !matches!(d, Destination::Address(ip, ..) if ip == p.cluster_ip);
                let no_endpoints =
                    if external { p.external.as_ref().and_then(|e| e.no_endpoints) } else { p.internal.no_endpoints };
                tally.add(&seen, Rules { no_endpoints, firewalled });
            }
            out.push(ServicePortCounts {
                family,
                name: p.name.clone(),
                counts: tally.connections,
                packets: tally.packets,
                bytes: tally.bytes,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(packets: u64, bytes: u64) -> ElementCount {
        ElementCount { packets, bytes }
    }

    const OPEN: Rules = Rules { no_endpoints: None, firewalled: false };

    #[test]
    fn served_traffic_is_the_traffic_sets_count_and_connections_the_dispatch_maps() {
        let mut t = Tally::default();
        let seen = Seen { dispatched: Some(count(3, 180)), traffic: count(40, 9000), ..Seen::default() };
        t.add(&seen, OPEN);
        assert_eq!(t.connections, ConnectionCounts { served: 3, ..Default::default() });
        assert_eq!(t.packets, ConnectionCounts { served: 40, ..Default::default() });
        assert_eq!(t.bytes, ConnectionCounts { served: 9000, ..Default::default() });
    }

    #[test]
    fn refused_packets_and_bytes_go_to_the_verdict_of_the_destination() {
        let mut t = Tally::default();
        let rejected = Seen { refused: count(4, 240), ..Seen::default() };
        t.add(&rejected, Rules { no_endpoints: Some(NoEndpointsVerdict::Reject), ..OPEN });
        assert_eq!((t.connections.rejected_no_endpoints, t.packets.rejected_no_endpoints), (4, 4));
        assert_eq!(t.bytes.rejected_no_endpoints, 240);
        // A Local policy without local endpoints: 5 connections went through the dispatch map,
        // 2 of them (short-circuited pods) were DNATed and served, 3 were dropped.
        let dropped = Seen {
            dispatched: Some(count(5, 300)),
            refused: count(3, 180),
            traffic: count(12, 1500),
            ..Seen::default()
        };
        t.add(&dropped, Rules { no_endpoints: Some(NoEndpointsVerdict::Drop), ..OPEN });
        assert_eq!(
            t.connections,
            ConnectionCounts {
                served: 2,
                rejected_no_endpoints: 4,
                dropped_no_local_endpoints: 3,
                dropped_by_source_ranges: 0
            }
        );
        assert_eq!(
            t.packets,
            ConnectionCounts {
                served: 12,
                rejected_no_endpoints: 4,
                dropped_no_local_endpoints: 3,
                dropped_by_source_ranges: 0
            }
        );
        assert_eq!(
            t.bytes,
            ConnectionCounts {
                served: 1500,
                rejected_no_endpoints: 240,
                dropped_no_local_endpoints: 180,
                dropped_by_source_ranges: 0
            }
        );
    }

    #[test]
    fn source_ranges_dropped_what_the_firewall_saw_and_the_nat_chains_did_not() {
        let mut t = Tally::default();
        let seen = Seen {
            dispatched: Some(count(2, 120)),
            firewall: count(7, 420),
            traffic: count(20, 2000),
            ..Seen::default()
        };
        t.add(&seen, Rules { firewalled: true, ..OPEN });
        assert_eq!((t.connections.dropped_by_source_ranges, t.connections.served), (5, 2));
        assert_eq!((t.packets.dropped_by_source_ranges, t.packets.served), (5, 20));
        assert_eq!((t.bytes.dropped_by_source_ranges, t.bytes.served), (300, 2000));
        // Read in flight: the dispatch map already counted a connection the firewall had not.
        let mut t = Tally::default();
        t.add(
            &Seen { dispatched: Some(count(3, 180)), firewall: count(2, 120), ..Seen::default() },
            Rules { firewalled: true, ..OPEN },
        );
        assert_eq!((t.packets.dropped_by_source_ranges, t.bytes.dropped_by_source_ranges), (0, 0));
    }
}

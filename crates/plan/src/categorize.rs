//! Which endpoints each traffic policy uses: upstream's `CategorizeEndpoints`
//! (kubernetes pkg/proxy/topology.go), rule for rule.
//!
//! - Cluster policy uses ready endpoints, narrowed by topology; when there are none, serving
//!   terminating endpoints (same topology narrowing).
//! - Local policy uses local ready endpoints; when there are none, local serving terminating ones.
//! - Topology comes from EndpointSlice hints only (the EndpointSlice controller turns the
//!   `service.kubernetes.io/topology-mode` annotation and `trafficDistribution` into hints): when
//!   every ready endpoint has a node hint and one names this node, same-node; else when every
//!   ready endpoint has a zone hint and one names this node's zone, same-zone; else no topology.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::model::Endpoint;

/// An endpoint with everything categorization looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Address.
    pub ip: IpAddr,
    /// Target port.
    pub port: u16,
    /// On this node.
    pub is_local: bool,
    /// `conditions.ready`.
    pub ready: bool,
    /// `conditions.serving`.
    pub serving: bool,
    /// `conditions.terminating`.
    pub terminating: bool,
    /// `hints.forZones`.
    pub zone_hints: BTreeSet<String>,
    /// `hints.forNodes`.
    pub node_hints: BTreeSet<String>,
}

impl Candidate {
    fn serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint { ip: self.ip, port: self.port, is_local: self.is_local, ready: self.ready }
    }
}

/// The result of categorizing one service port's endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Categorized {
    /// Endpoints for Cluster policy (empty when the port does not use Cluster policy).
    pub cluster: Vec<Endpoint>,
    /// Endpoints for Local policy (empty when the port does not use Local policy).
    pub local: Vec<Endpoint>,
    /// Some usable (ready, or serving and terminating) endpoint exists anywhere in the cluster.
    pub has_any: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology {
    None,
    SameNode,
    SameZone,
}

/// Categorizes `endpoints` for a port that uses the cluster and/or local endpoint sets.
pub fn categorize_endpoints(
    endpoints: &[Candidate],
    uses_cluster: bool,
    uses_local: bool,
    node_name: &str,
    zone: Option<&str>,
) -> Categorized {
    let mut out = Categorized::default();
    if uses_cluster {
        let topology = topology_from_hints(endpoints, node_name, zone);
        let in_topology = |c: &Candidate| match topology {
            Topology::None => true,
            Topology::SameNode => c.node_hints.contains(node_name),
            Topology::SameZone => zone.is_some_and(|z| c.zone_hints.contains(z)),
        };
        out.cluster = pick(endpoints, |c| c.ready && in_topology(c));
        if out.cluster.is_empty() {
            out.cluster = pick(endpoints, |c| c.serving_terminating() && in_topology(c));
        }
        out.has_any = !out.cluster.is_empty();
    }
    if !uses_local {
        return out;
    }
    let mut has_local_ready = false;
    let mut has_local_serving_terminating = false;
    for c in endpoints {
        if c.ready {
            out.has_any = true;
            has_local_ready |= c.is_local;
        } else if c.serving_terminating() {
            out.has_any = true;
            has_local_serving_terminating |= c.is_local;
        }
    }
    if has_local_ready {
        out.local = pick(endpoints, |c| c.is_local && c.ready);
    } else if has_local_serving_terminating {
        out.local = pick(endpoints, |c| c.is_local && c.serving_terminating());
    }
    out
}

fn pick(endpoints: &[Candidate], keep: impl Fn(&Candidate) -> bool) -> Vec<Endpoint> {
    let mut picked: Vec<Endpoint> = endpoints.iter().filter(|c| keep(c)).map(Candidate::endpoint).collect();
    picked.sort();
    // Kept in the plan for as long as the Service exists: no room for more (a filtered collect
    // grows by doubling, to 8 places for 5 endpoints).
    picked.shrink_to_fit();
    picked
}

fn topology_from_hints(endpoints: &[Candidate], node_name: &str, zone: Option<&str>) -> Topology {
    let ready: Vec<&Candidate> = endpoints.iter().filter(|c| c.ready).collect();
    if ready.is_empty() {
        return Topology::None;
    }
    let all_have_node_hints = ready.iter().all(|c| !c.node_hints.is_empty());
    if all_have_node_hints && ready.iter().any(|c| c.node_hints.contains(node_name)) {
        return Topology::SameNode;
    }
    let all_have_zone_hints = ready.iter().all(|c| !c.zone_hints.is_empty());
    if all_have_zone_hints && zone.is_some_and(|z| ready.iter().any(|c| c.zone_hints.contains(z))) {
        return Topology::SameZone;
    }
    Topology::None
}

#[cfg(test)]
mod tests;

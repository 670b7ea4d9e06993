//! Which conntrack entries are stale: the pure decision, no I/O.
//!
//! A UDP or SCTP packet that matches an existing conntrack entry is NATed the way the entry says,
//! before any rule is looked at. So once a service's endpoints change, the entries created for
//! the old endpoints keep steering a client that keeps sending (statsd, DNS from a fixed port,
//! QUIC) to an endpoint that is gone, for as long as it keeps sending. Entries created while a
//! service had no rule at all (no endpoints yet, or not created yet) likewise keep bypassing the
//! rules that appear later. Deleting such an entry makes the next packet go through the rules
//! again.
//!
//! The decision compares the kernel's entries with the desired state, every time, instead of
//! reacting to events: that is what makes it correct after a restart, after a failed cleanup, for
//! services that scaled to zero (upstream kubernetes#139628) and for services that were deleted
//! (upstream PR #141371; see [`crate::Reconciler`] for how deleted frontends are remembered).
//!
//! An entry is stale when
//! - its protocol is UDP or SCTP (TCP connections to a gone endpoint fail and are retried by the
//!   client on a new connection, so they are left alone like upstream does), and
//! - its original destination is a frontend of a service port: a service address (ClusterIP,
//!   external IP, load balancer IP) and port, or else a node port on an address NodePorts are
//!   served on; and
//! - its reply source, i.e. where it was DNATed to, is not a serving endpoint (address and port)
//!   of that service port. Serving means the EndpointSlice says so, whatever the traffic
//!   policies, topology or terminating state (as upstream: changing a Service must not break
//!   existing UDP flows any more than TCP ones, so a flow to a terminating endpoint drains). An entry that was not DNATed at all replies from the frontend itself,
//!   which is never an endpoint, so it is stale too: it was created before the service had
//!   endpoints (or existed) and would keep bypassing the DNAT rules.
//!
//! Unlike upstream, endpoints are compared by address *and* port (a changed `targetPort` leaves
//! entries that point at the old port), and a node-port frontend is only considered when the
//! destination is not itself a service frontend, and is an address node ports are served on (or,
//! when they are served on every local address, an address known to be local or an entry that
//! was DNATed). A UDP flow from a local pod to another node's node port therefore survives.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};

use kproxy_plan::{FamilyPlan, NodePortAddresses};
use kproxy_state::Protocol;

use crate::flow::Flow;

/// Where a service port receives traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Frontend {
    /// A service address and port: a ClusterIP, an external IP or a load balancer IP.
    Address {
        /// Protocol.
        protocol: Protocol,
        /// The address.
        ip: IpAddr,
        /// The service port.
        port: u16,
    },
    /// A node port, on the addresses node ports are served on.
    NodePort {
        /// Protocol.
        protocol: Protocol,
        /// The node port.
        port: u16,
    },
}

/// The node addresses node-port traffic arrives on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortScope {
    /// Only these addresses.
    Only(HashSet<IpAddr>),
    /// Every local address. Those known are listed; an entry to another address counts only when
    /// it was DNATed (which only happens on a local address).
    AllLocal(HashSet<IpAddr>),
}

impl NodePortScope {
    fn covers(&self, flow: &Flow) -> bool {
        match self {
            NodePortScope::Only(addresses) => addresses.contains(&flow.original.dst),
            NodePortScope::AllLocal(known) => known.contains(&flow.original.dst) || flow.is_dnat(),
        }
    }
}

/// Every UDP and SCTP frontend with the endpoints its flows may legitimately be DNATed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frontends {
    serving: BTreeMap<Frontend, BTreeSet<SocketAddr>>,
    node_ports: NodePortScope,
}

/// The protocols whose entries the reconciler manages.
pub const MANAGED_PROTOCOLS: [Protocol; 2] = [Protocol::Udp, Protocol::Sctp];

fn is_managed(protocol: Protocol) -> bool {
    MANAGED_PROTOCOLS.contains(&protocol)
}

impl Frontends {
    /// No frontends; node ports served on the given scope.
    pub fn new(node_ports: NodePortScope) -> Self {
        Self { serving: BTreeMap::new(), node_ports }
    }

    /// The UDP and SCTP frontends of one family's plan. A service port's serving endpoints are
    /// its serving endpoints in the EndpointSlices, plus every endpoint any of its traffic
    /// classes may be sent to (cluster and local sets).
    /// `local_addresses` are the node's addresses, used when node ports are served on all of them.
    pub fn from_plan(plan: &FamilyPlan, local_addresses: &[IpAddr]) -> Self {
        let node_ports = match &plan.node.nodeport_addresses {
            NodePortAddresses::Only(addresses) => NodePortScope::Only(addresses.iter().copied().collect()),
            NodePortAddresses::AllLocal => {
                NodePortScope::AllLocal(local_addresses.iter().copied().chain(plan.node.node_ip).collect())
            }
        };
        let mut frontends = Self::new(node_ports);
        for service in plan.services.values() {
            if !is_managed(service.protocol) {
                continue;
            }
            // Every serving endpoint, whatever policies, topology and terminating state say (as
            // upstream): a flow to a terminating or topology-filtered endpoint drains in peace.
            let serving: BTreeSet<SocketAddr> = service
                .reachable_endpoints()
                .into_iter()
                .map(|ep| SocketAddr::new(ep.ip, ep.port))
                .chain(service.serving_endpoints.iter().copied())
                .collect();
            let protocol = service.protocol;
            for ip in std::iter::once(&service.cluster_ip).chain(service.external_vips()) {
                frontends.insert(Frontend::Address { protocol, ip: *ip, port: service.port }, serving.iter().copied());
            }
            if let Some(port) = service.node_port {
                frontends.insert(Frontend::NodePort { protocol, port }, serving.iter().copied());
            }
        }
        frontends
    }

    /// Adds a frontend and endpoints it may be DNATed to (merged with any already known).
    pub fn insert(&mut self, frontend: Frontend, serving: impl IntoIterator<Item = SocketAddr>) {
        self.serving.entry(frontend).or_default().extend(serving);
    }

    /// Adds a frontend that has no endpoints at all (a deleted service's), unless it is known.
    pub fn insert_without_endpoints(&mut self, frontend: Frontend) {
        self.serving.entry(frontend).or_default();
    }

    /// Every frontend.
    pub fn frontends(&self) -> impl Iterator<Item = &Frontend> {
        self.serving.keys()
    }

    /// True when some frontend uses the protocol.
    pub fn uses(&self, protocol: Protocol) -> bool {
        self.serving.keys().any(|frontend| match frontend {
            Frontend::Address { protocol: p, .. } | Frontend::NodePort { protocol: p, .. } => *p == protocol,
        })
    }

    /// The endpoints of the frontend the flow was sent to, if it was sent to one.
    fn serving_for(&self, flow: &Flow) -> Option<&BTreeSet<SocketAddr>> {
        let address =
            Frontend::Address { protocol: flow.protocol, ip: flow.original.dst, port: flow.original.dst_port };
        if let Some(serving) = self.serving.get(&address) {
            return Some(serving);
        }
        let node_port = Frontend::NodePort { protocol: flow.protocol, port: flow.original.dst_port };
        self.serving.get(&node_port).filter(|_| self.node_ports.covers(flow))
    }

    /// True when the flow targets a frontend and was not DNATed to one of its serving endpoints.
    pub fn is_stale(&self, flow: &Flow) -> bool {
        is_managed(flow.protocol)
            && self.serving_for(flow).is_some_and(|serving| !serving.contains(&flow.reply.source()))
    }
}

/// The flows to delete, in input order.
pub fn stale_flows(frontends: &Frontends, flows: &[Flow]) -> Vec<Flow> {
    flows.iter().filter(|flow| frontends.is_stale(flow)).copied().collect()
}

/// The flows of `plan`'s family that are stale for it (no deleted-service memory; see
/// [`crate::Reconciler`] for that).
pub fn stale_entries(plan: &FamilyPlan, local_addresses: &[IpAddr], flows: &[Flow]) -> Vec<Flow> {
    stale_flows(&Frontends::from_plan(plan, local_addresses), flows)
}

#[cfg(test)]
mod tests;

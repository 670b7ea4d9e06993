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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};

use kproxy_plan::{FamilyDelta, FamilyPlan, NodePlan, NodePortAddresses, ServicePortName, ServicePortPlan};
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
///
/// Kept service port by service port, so that a sync's changes patch it ([`Frontends::apply`])
/// at the cost of the service ports they touch, instead of a walk of the whole plan at every
/// sync; [`Frontends::from_plan`] builds it from a whole plan through the same steps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frontends {
    /// Each UDP or SCTP service port's frontends and serving endpoints.
    ports: HashMap<ServicePortName, PortFrontends>,
    /// The service ports behind each frontend: almost always one (two Services sharing an
    /// external IP and port is invalid but possible), and their serving endpoints all count.
    owners: BTreeMap<Frontend, BTreeSet<ServicePortName>>,
    /// Frontends no service port has that are known to have no endpoints at all (a deleted
    /// service's, see [`crate::Reconciler`]).
    without_endpoints: BTreeSet<Frontend>,
    node_ports: NodePortScope,
}

/// What one service port contributes to [`Frontends`].
#[derive(Debug, Clone, PartialEq, Eq)]
struct PortFrontends {
    frontends: Vec<Frontend>,
    serving: BTreeSet<SocketAddr>,
}

/// The protocols whose entries the reconciler manages.
pub const MANAGED_PROTOCOLS: [Protocol; 2] = [Protocol::Udp, Protocol::Sctp];

fn is_managed(protocol: Protocol) -> bool {
    MANAGED_PROTOCOLS.contains(&protocol)
}

impl NodePortScope {
    /// Where a family's node ports are served, per its plan; `local_addresses` are the node's
    /// addresses, used when node ports are served on all of them.
    pub fn of(node: &NodePlan, local_addresses: &[IpAddr]) -> Self {
        match &node.nodeport_addresses {
            NodePortAddresses::Only(addresses) => NodePortScope::Only(addresses.iter().copied().collect()),
            NodePortAddresses::AllLocal(_) => {
                NodePortScope::AllLocal(local_addresses.iter().copied().chain(node.node_ip).collect())
            }
        }
    }
}

impl Frontends {
    /// No frontends; node ports served on the given scope.
    pub fn new(node_ports: NodePortScope) -> Self {
        Self { ports: HashMap::new(), owners: BTreeMap::new(), without_endpoints: BTreeSet::new(), node_ports }
    }

    /// The UDP and SCTP frontends of one family's plan. A service port's serving endpoints are
    /// its serving endpoints in the EndpointSlices, plus every endpoint any of its traffic
    /// classes may be sent to (cluster and local sets).
    /// `local_addresses` are the node's addresses, used when node ports are served on all of them.
    pub fn from_plan(plan: &FamilyPlan, local_addresses: &[IpAddr]) -> Self {
        let mut frontends = Self::new(NodePortScope::of(&plan.node, local_addresses));
        for service in plan.services.values() {
            frontends.add_port(service);
        }
        frontends
    }

    /// Brings these frontends, those of a family's plan, to the plan `changes` lead to (the
    /// node's settings aside: see [`Frontends::set_node_ports`]). Returns the frontends that no
    /// service port has any more. O(the service ports changed).
    pub fn apply(&mut self, changes: &FamilyDelta) -> Vec<Frontend> {
        let mut gone = Vec::new();
        for port in &changes.removed {
            gone.extend(self.remove_port(&port.name));
        }
        for change in &changes.changed {
            gone.extend(self.remove_port(&change.old.name));
            self.add_port(&change.new);
        }
        for port in &changes.added {
            self.add_port(port);
        }
        gone.retain(|frontend| !self.owners.contains_key(frontend));
        gone.sort();
        gone.dedup();
        gone
    }

    /// Where node ports are served from now on.
    pub fn set_node_ports(&mut self, node_ports: NodePortScope) {
        self.node_ports = node_ports;
    }

    /// Adds the frontends of one service port (none unless UDP or SCTP) with the endpoints its
    /// flows may be DNATed to: every serving endpoint, whatever policies, topology and
    /// terminating state say (as upstream), so a flow to a terminating or topology-filtered
    /// endpoint drains in peace.
    fn add_port(&mut self, service: &ServicePortPlan) {
        if !is_managed(service.protocol) {
            return;
        }
        let serving: BTreeSet<SocketAddr> = service
            .reachable_endpoints()
            .into_iter()
            .map(|ep| SocketAddr::new(ep.ip, ep.port))
            .chain(service.serving_endpoints.iter().copied())
            .collect();
        let protocol = service.protocol;
        let mut frontends: Vec<Frontend> = std::iter::once(&service.cluster_ip)
            .chain(service.external_vips())
            .map(|ip| Frontend::Address { protocol, ip: *ip, port: service.port })
            .chain(service.node_port.map(|port| Frontend::NodePort { protocol, port }))
            .collect();
        frontends.sort();
        frontends.dedup();
        for frontend in &frontends {
            self.owners.entry(*frontend).or_default().insert(service.name.clone());
        }
        self.ports.insert(service.name.clone(), PortFrontends { frontends, serving });
    }

    /// Removes the frontends of one service port; returns those it owned.
    fn remove_port(&mut self, name: &ServicePortName) -> Vec<Frontend> {
        let Some(port) = self.ports.remove(name) else { return Vec::new() };
        for frontend in &port.frontends {
            if let Some(owners) = self.owners.get_mut(frontend) {
                owners.remove(name);
                if owners.is_empty() {
                    self.owners.remove(frontend);
                }
            }
        }
        port.frontends
    }

    /// Adds a frontend that has no endpoints at all (a deleted service's), unless it is known.
    pub fn insert_without_endpoints(&mut self, frontend: Frontend) {
        self.without_endpoints.insert(frontend);
    }

    /// Forgets the frontends added by [`Frontends::insert_without_endpoints`].
    pub fn clear_without_endpoints(&mut self) {
        self.without_endpoints.clear();
    }

    /// Every frontend of the plan's service ports.
    pub fn frontends(&self) -> impl Iterator<Item = &Frontend> {
        self.owners.keys()
    }

    /// Whether some service port has this frontend.
    pub fn contains(&self, frontend: &Frontend) -> bool {
        self.owners.contains_key(frontend)
    }

    /// True when some frontend uses the protocol.
    pub fn uses(&self, protocol: Protocol) -> bool {
        let of_protocol = |frontend: Option<&Frontend>, address: bool| match frontend {
            Some(Frontend::Address { protocol: p, .. }) => address && *p == protocol,
            Some(Frontend::NodePort { protocol: p, .. }) => !address && *p == protocol,
            None => false,
        };
        // Frontends sort by kind, then protocol: the first of each kind at or after the
        // protocol's smallest one says whether there is any.
        let first_address = Frontend::Address { protocol, ip: IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), port: 0 };
        let first_node_port = Frontend::NodePort { protocol, port: 0 };
        let known = |start: Frontend, address: bool| {
            of_protocol(self.owners.range(start..).next().map(|(f, _)| f), address)
                || of_protocol(self.without_endpoints.range(start..).next(), address)
        };
        known(first_address, true) || known(first_node_port, false)
    }

    /// The frontend the flow was sent to, if it was sent to one.
    fn frontend_of(&self, flow: &Flow) -> Option<Frontend> {
        let known =
            |frontend: &Frontend| self.owners.contains_key(frontend) || self.without_endpoints.contains(frontend);
        let address =
            Frontend::Address { protocol: flow.protocol, ip: flow.original.dst, port: flow.original.dst_port };
        if known(&address) {
            return Some(address);
        }
        let node_port = Frontend::NodePort { protocol: flow.protocol, port: flow.original.dst_port };
        (known(&node_port) && self.node_ports.covers(flow)).then_some(node_port)
    }

    /// Whether `endpoint` is a serving endpoint of some service port behind `frontend`.
    fn serves(&self, frontend: &Frontend, endpoint: &SocketAddr) -> bool {
        self.owners.get(frontend).is_some_and(|owners| {
            owners.iter().any(|name| self.ports.get(name).is_some_and(|port| port.serving.contains(endpoint)))
        })
    }

    /// True when the flow targets a frontend and was not DNATed to one of its serving endpoints.
    pub fn is_stale(&self, flow: &Flow) -> bool {
        is_managed(flow.protocol)
            && self.frontend_of(flow).is_some_and(|frontend| !self.serves(&frontend, &flow.reply.source()))
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

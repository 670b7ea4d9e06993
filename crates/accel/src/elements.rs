//! What the fast path matches: the opted-in service frontends, as set elements.
//!
//! A service port contributes one VIP element per frontend address (ClusterIP, external IPs,
//! load balancer IPs) and one node-port element. Several service ports may name the same
//! element (two Services sharing an external IP and port is invalid but possible), so the index
//! counts owners and an element leaves the kernel only when its last owner goes. Every update
//! reports the elements whose presence flipped, so the kernel sees O(change) operations.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kproxy_plan::{Plan, ServicePortName, ServicePortPlan};
use kproxy_state::{IpFamily, Protocol};

/// One element of the fast path's sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Element {
    /// `protocol . address . port` in `vips-v4` / `vips-v6`.
    Vip {
        /// TCP or UDP.
        protocol: Protocol,
        /// ClusterIP, external IP or load balancer IP.
        address: IpAddr,
        /// Service port.
        port: u16,
    },
    /// `protocol . port` in `nodeports` (matched together with `fib daddr type local`).
    NodePort {
        /// TCP or UDP.
        protocol: Protocol,
        /// Node port.
        port: u16,
    },
}

/// Identity of a service port across families (the same name exists once per family).
pub type PortKey = (IpFamily, ServicePortName);

/// The elements one service port contributes: none unless the plan says to accelerate it.
/// SCTP never contributes (flowtables do not handle it; the plan already excludes it).
pub fn elements_of(port: &ServicePortPlan) -> BTreeSet<Element> {
    let mut out = BTreeSet::new();
    if !port.accelerate || !matches!(port.protocol, Protocol::Tcp | Protocol::Udp) {
        return out;
    }
    let protocol = port.protocol;
    for address in std::iter::once(&port.cluster_ip).chain(port.external_vips()) {
        out.insert(Element::Vip { protocol, address: *address, port: port.port });
    }
    if let Some(node_port) = port.node_port {
        out.insert(Element::NodePort { protocol, port: node_port });
    }
    out
}

/// Elements that appeared and disappeared in one update.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElementChanges {
    /// Now present, absent before.
    pub added: BTreeSet<Element>,
    /// Absent now, present before.
    pub removed: BTreeSet<Element>,
}

impl ElementChanges {
    /// Nothing flipped.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }

    fn record_added(&mut self, element: Element) {
        if !self.removed.remove(&element) {
            self.added.insert(element);
        }
    }

    fn record_removed(&mut self, element: Element) {
        if !self.added.remove(&element) {
            self.removed.insert(element);
        }
    }
}

/// The accelerated elements with their owners, and each owner's elements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElementIndex {
    owners: BTreeMap<Element, BTreeSet<PortKey>>,
    by_port: BTreeMap<PortKey, BTreeSet<Element>>,
}

impl ElementIndex {
    /// The index of a whole plan.
    pub fn from_plan(plan: &Plan) -> Self {
        let mut index = ElementIndex::default();
        for (family, family_plan) in &plan.families {
            for (name, port) in &family_plan.services {
                index.set_port((*family, name.clone()), elements_of(port));
            }
        }
        index
    }

    /// Replaces the elements of one service port (an empty set removes it); returns what flipped.
    pub fn set_port(&mut self, key: PortKey, elements: BTreeSet<Element>) -> ElementChanges {
        let mut changes = ElementChanges::default();
        let old = if elements.is_empty() {
            self.by_port.remove(&key).unwrap_or_default()
        } else {
            self.by_port.insert(key.clone(), elements.clone()).unwrap_or_default()
        };
        for element in old.difference(&elements) {
            if let Some(owners) = self.owners.get_mut(element) {
                owners.remove(&key);
                if owners.is_empty() {
                    self.owners.remove(element);
                    changes.record_removed(*element);
                }
            }
        }
        for element in elements.difference(&old) {
            let owners = self.owners.entry(*element).or_default();
            if owners.is_empty() {
                changes.record_added(*element);
            }
            owners.insert(key.clone());
        }
        changes
    }

    /// What turns `self` into `target`, element by element.
    pub fn changes_to(&self, target: &ElementIndex) -> ElementChanges {
        let before: BTreeSet<&Element> = self.owners.keys().collect();
        let after: BTreeSet<&Element> = target.owners.keys().collect();
        ElementChanges {
            added: after.difference(&before).map(|e| **e).collect(),
            removed: before.difference(&after).map(|e| **e).collect(),
        }
    }

    /// Every element present.
    pub fn elements(&self) -> impl Iterator<Item = &Element> {
        self.owners.keys()
    }

    /// No service port is accelerated.
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// The accelerated service ports.
    pub fn ports(&self) -> impl Iterator<Item = &PortKey> {
        self.by_port.keys()
    }

    /// The service ports that own the frontend a connection was addressed to (its original
    /// destination): a VIP element first, else a node port.
    pub fn owners_of(&self, protocol: Protocol, address: IpAddr, port: u16) -> Option<&BTreeSet<PortKey>> {
        self.owners
            .get(&Element::Vip { protocol, address, port })
            .or_else(|| self.owners.get(&Element::NodePort { protocol, port }))
    }
}

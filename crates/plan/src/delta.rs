//! The difference between two plans, so a backend applies O(change).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kproxy_state::{IpFamily, ObjectKey, Protocol};

use crate::model::{Endpoint, FamilyPlan, NodePlan, Plan, ServicePortName, ServicePortPlan};

/// One service port that exists in both plans but differs.
#[derive(Debug, Clone, PartialEq)]
pub struct ServicePortChange {
    /// Before.
    pub old: Arc<ServicePortPlan>,
    /// After.
    pub new: Arc<ServicePortPlan>,
}

impl ServicePortChange {
    /// Endpoints reachable before and not after (their conntrack entries are stale).
    pub fn removed_endpoints(&self) -> Vec<Endpoint> {
        let after: BTreeSet<_> = self.new.reachable_endpoints().into_iter().map(|e| (e.ip, e.port)).collect();
        self.old.reachable_endpoints().into_iter().filter(|e| !after.contains(&(e.ip, e.port))).cloned().collect()
    }
}

/// What changed in one family.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FamilyDelta {
    /// The new node-wide settings, when they changed.
    pub node: Option<NodePlan>,
    /// Service ports that are new.
    pub added: Vec<Arc<ServicePortPlan>>,
    /// Service ports that changed.
    pub changed: Vec<ServicePortChange>,
    /// Service ports that are gone.
    pub removed: Vec<Arc<ServicePortPlan>>,
}

impl FamilyDelta {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.node.is_none() && self.added.is_empty() && self.changed.is_empty() && self.removed.is_empty()
    }

    fn compare(&mut self, old: Option<&Arc<ServicePortPlan>>, new: Option<&Arc<ServicePortPlan>>) {
        match (old, new) {
            (None, Some(new)) => self.added.push(new.clone()),
            (Some(old), None) => self.removed.push(old.clone()),
            (Some(old), Some(new)) if old != new => {
                self.changed.push(ServicePortChange { old: old.clone(), new: new.clone() })
            }
            _ => {}
        }
    }
}

/// What changed between two plans, per family.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PlanDelta {
    /// Per family; families without changes may be absent.
    pub families: BTreeMap<IpFamily, FamilyDelta>,
}

impl PlanDelta {
    /// Everything that differs between `old` and `new`.
    pub fn between(old: &Plan, new: &Plan) -> Self {
        let mut delta = PlanDelta::default();
        let families: BTreeSet<IpFamily> = old.families.keys().chain(new.families.keys()).copied().collect();
        for family in families {
            let (old_f, new_f) = (old.families.get(&family), new.families.get(&family));
            let mut fd = FamilyDelta::default();
            let old_node = old_f.map(|f| &f.node);
            if let Some(new_node) = new_f.map(|f| &f.node).filter(|n| Some(*n) != old_node) {
                fd.node = Some(new_node.clone());
            }
            let empty = BTreeMap::new();
            let old_s = old_f.map_or(&empty, |f| &f.services);
            let new_s = new_f.map_or(&empty, |f| &f.services);
            let names: BTreeSet<&ServicePortName> = old_s.keys().chain(new_s.keys()).collect();
            for name in names {
                fd.compare(old_s.get(name), new_s.get(name));
            }
            if !fd.is_empty() {
                delta.families.insert(family, fd);
            }
        }
        delta
    }

    /// The difference for the named services only: `target` holds their new service ports.
    pub(crate) fn for_services(old: &Plan, target: &Plan, services: &BTreeSet<ObjectKey>) -> Self {
        let mut delta = PlanDelta::default();
        for (&family, old_f) in &old.families {
            let Some(new_f) = target.families.get(&family) else { continue };
            let mut fd = FamilyDelta::default();
            for key in services {
                let old_ports: BTreeMap<_, _> = ports_of(old_f, key).collect();
                let new_ports: BTreeMap<_, _> = ports_of(new_f, key).collect();
                let names: BTreeSet<&ServicePortName> = old_ports.keys().chain(new_ports.keys()).copied().collect();
                for name in names {
                    fd.compare(old_ports.get(name).copied(), new_ports.get(name).copied());
                }
            }
            if !fd.is_empty() {
                delta.families.insert(family, fd);
            }
        }
        delta
    }

    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.families.values().all(FamilyDelta::is_empty)
    }
}

/// The service ports of one Service, found by range (O(ports of that service)).
fn ports_of<'a>(
    family: &'a FamilyPlan,
    service: &'a ObjectKey,
) -> impl Iterator<Item = (&'a ServicePortName, &'a Arc<ServicePortPlan>)> + 'a {
    let start = ServicePortName {
        namespace: service.namespace.clone(),
        service: service.name.clone(),
        port: "".into(),
        protocol: Protocol::Tcp,
    };
    family
        .services
        .range(start..)
        .take_while(move |(n, _)| *n.namespace == *service.namespace && *n.service == *service.name)
}

impl Plan {
    /// Applies a delta computed against this plan.
    pub fn apply(&mut self, delta: &PlanDelta) {
        for (&family, fd) in &delta.families {
            let Some(f) = self.families.get_mut(&family) else {
                if let Some(node) = &fd.node {
                    let services = fd.added.iter().map(|p| (p.name.clone(), p.clone())).collect();
                    self.families.insert(family, FamilyPlan { family, node: node.clone(), services });
                }
                continue;
            };
            if let Some(node) = &fd.node {
                f.node = node.clone();
            }
            for p in &fd.removed {
                f.services.remove(&p.name);
            }
            for p in fd.added.iter().chain(fd.changed.iter().map(|c| &c.new)) {
                f.services.insert(p.name.clone(), p.clone());
            }
        }
    }
}

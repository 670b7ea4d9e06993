//! The cluster state: the latest valid version of every watched object.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;

use crate::change::{Change, Kind, Object, ObjectKey};
use crate::endpoints::{SliceInfo, last_change_trigger_time};
use crate::error::ObjectError;
use crate::node::NodeInfo;
use crate::service::{IpFamily, ServiceInfo, invalid_traffic_hint};

/// What applying one change did.
#[derive(Debug, Default, PartialEq)]
pub struct ApplyOutcome {
    /// Objects that were rejected (and skipped; any previous valid version stays).
    pub rejected: Vec<ObjectError>,
    /// Problems that did not stop the object from being used (e.g. an unknown traffic hint).
    pub warnings: Vec<ObjectError>,
    /// Objects a completed listing no longer named ([`Change::ListEnded`]): removed, or, for
    /// those kproxy kept no record of (`unheld`), forgotten.
    pub gone: Vec<ObjectKey>,
}

impl ApplyOutcome {
    fn merge(&mut self, other: ApplyOutcome) {
        self.rejected.extend(other.rejected);
        self.warnings.extend(other.warnings);
        self.gone.extend(other.gone);
    }
}

/// Which services changed since the plan was last brought up to date.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Dirty {
    /// Services (by Service key) whose Service or EndpointSlices changed.
    pub services: BTreeSet<ObjectKey>,
    /// Something that affects every service changed (a Node, a ServiceCIDR).
    pub all: bool,
}

/// The latest valid version of every object kproxy watches.
#[derive(Debug, Default, Clone)]
pub struct ClusterState {
    services: BTreeMap<ObjectKey, Arc<ServiceInfo>>,
    /// Slices grouped by the Service they belong to, sorted by slice name (a stable merge order).
    /// A Vec, not a map: most Services have one or two slices, and an inner map would cost a
    /// whole B-tree node per Service.
    slices: BTreeMap<ObjectKey, Vec<Arc<SliceInfo>>>,
    /// Slice key → owning Service key, to find a slice on delete.
    slice_owner: BTreeMap<ObjectKey, ObjectKey>,
    nodes: BTreeMap<String, Arc<NodeInfo>>,
    /// Node names endpoints refer to, shared by every endpoint on the node. Grows with the
    /// cluster's node names only (a few bytes each), never per endpoint.
    endpoint_nodes: BTreeSet<Arc<str>>,
    service_cidrs: BTreeMap<String, Vec<IpNet>>,
    synced: BTreeSet<Kind>,
    /// Per kind, while a listing of it runs over objects already here: the keys it named so far
    /// ([`Change::ListStarted`]). Nothing is kept for a listing that starts with none of its kind
    /// here (a cold start): everything it brings is named.
    listing: BTreeMap<Kind, BTreeSet<ObjectKey>>,
    /// Per kind, the keys of objects the cluster has but kproxy keeps no record of (ExternalName
    /// and headless Services, slices it ignores, objects rejected from their first version): so a
    /// relist that no longer names one reports it gone, as upstream counts every delete its
    /// informer sees. Only keys: a few dozen bytes each.
    unheld: BTreeMap<Kind, BTreeSet<ObjectKey>>,
    dirty: Dirty,
    /// Trigger times of EndpointSlice changes not yet programmed.
    change_triggers: Vec<(IpFamily, String)>,
}

impl ClusterState {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one change from a source.
    pub fn apply(&mut self, change: Change) -> ApplyOutcome {
        match change {
            Change::Applied(object) => {
                let outcome = self.upsert(&object);
                let (kind, key) = (object.kind(), object.key());
                self.note_held(kind, &key);
                if self.listing.contains_key(&kind) {
                    let key = self.shared_key(kind, key);
                    self.listing.entry(kind).or_default().insert(key);
                }
                outcome
            }
            Change::ListStarted(kind) => {
                if self.holds_any(kind) {
                    self.listing.insert(kind, BTreeSet::new());
                } else {
                    self.listing.remove(&kind);
                }
                ApplyOutcome::default()
            }
            Change::Unreadable(kind, key) => {
                if let Some(named) = self.listing.get_mut(&kind) {
                    named.insert(key);
                }
                ApplyOutcome::default()
            }
            Change::ListEnded(kind) => {
                let mut outcome = ApplyOutcome::default();
                if let Some(named) = self.listing.remove(&kind) {
                    for key in self.keys(kind) {
                        if !named.contains(&key) {
                            self.remove(kind, &key);
                            outcome.gone.push(key);
                        }
                    }
                }
                self.synced.insert(kind);
                outcome
            }
            Change::Deleted(kind, key) => {
                self.remove(kind, &key);
                ApplyOutcome::default()
            }
            Change::Replaced(kind, objects) => {
                let keep: BTreeSet<ObjectKey> = objects.iter().map(Object::key).collect();
                for key in self.keys(kind) {
                    if !keep.contains(&key) {
                        self.remove(kind, &key);
                    }
                }
                let mut outcome = ApplyOutcome::default();
                for object in &objects {
                    outcome.merge(self.upsert(object));
                    self.note_held(object.kind(), &object.key());
                }
                self.synced.insert(kind);
                outcome
            }
            Change::Synced(kind) => {
                self.synced.insert(kind);
                ApplyOutcome::default()
            }
        }
    }

    /// True once a complete listing of `kind` has been applied.
    pub fn is_synced(&self, kind: Kind) -> bool {
        self.synced.contains(&kind)
    }

    /// Takes the set of services that changed since the last call.
    pub fn take_dirty(&mut self) -> Dirty {
        std::mem::take(&mut self.dirty)
    }

    /// Takes the `last-change-trigger-time`s of the EndpointSlice changes applied since the last
    /// call (for `kubeproxy_network_programming_duration_seconds`).
    pub fn take_change_triggers(&mut self) -> Vec<(IpFamily, String)> {
        std::mem::take(&mut self.change_triggers)
    }

    /// Every Service kproxy proxies.
    pub fn services(&self) -> impl Iterator<Item = &Arc<ServiceInfo>> {
        self.services.values()
    }

    /// One Service.
    pub fn service(&self, key: &ObjectKey) -> Option<&Arc<ServiceInfo>> {
        self.services.get(key)
    }

    /// The EndpointSlices of one Service, ordered by slice name.
    pub fn slices_of(&self, service: &ObjectKey) -> impl Iterator<Item = &Arc<SliceInfo>> {
        self.slices.get(service).into_iter().flatten()
    }

    /// A Node by name.
    pub fn node(&self, name: &str) -> Option<&Arc<NodeInfo>> {
        self.nodes.get(name)
    }

    /// Every CIDR of every ServiceCIDR object.
    pub fn service_cidrs(&self) -> impl Iterator<Item = &IpNet> {
        self.service_cidrs.values().flatten()
    }

    /// Notes whether the object last applied, `key`, left a record here; see `unheld`.
    fn note_held(&mut self, kind: Kind, key: &ObjectKey) {
        if self.holds(kind, key) {
            if let Some(unheld) = self.unheld.get_mut(&kind) {
                unheld.remove(key);
            }
        } else {
            self.unheld.entry(kind).or_default().insert(key.clone());
        }
    }

    fn holds(&self, kind: Kind, key: &ObjectKey) -> bool {
        match kind {
            Kind::Service => self.services.contains_key(key),
            Kind::EndpointSlice => self.slice_owner.contains_key(key),
            Kind::Node => self.nodes.contains_key(&*key.name),
            Kind::ServiceCidr => self.service_cidrs.contains_key(&*key.name),
        }
    }

    /// The state's own copy of `key` when it holds the object (its strings shared, not copied
    /// again), else `key`.
    fn shared_key(&self, kind: Kind, key: ObjectKey) -> ObjectKey {
        let stored = match kind {
            Kind::Service => self.services.get_key_value(&key).map(|(stored, _)| stored),
            Kind::EndpointSlice => self.slice_owner.get_key_value(&key).map(|(stored, _)| stored),
            Kind::Node | Kind::ServiceCidr => None,
        };
        let unheld = || self.unheld.get(&kind)?.get(&key);
        stored.or_else(unheld).cloned().unwrap_or(key)
    }

    fn holds_any(&self, kind: Kind) -> bool {
        self.unheld.get(&kind).is_some_and(|unheld| !unheld.is_empty())
            || match kind {
                Kind::Service => !self.services.is_empty(),
                Kind::EndpointSlice => !self.slice_owner.is_empty(),
                Kind::Node => !self.nodes.is_empty(),
                Kind::ServiceCidr => !self.service_cidrs.is_empty(),
            }
    }

    /// The keys of every object of `kind` here, held or [`unheld`](Self::unheld).
    fn keys(&self, kind: Kind) -> Vec<ObjectKey> {
        let mut keys: Vec<ObjectKey> = match kind {
            Kind::Service => self.services.keys().cloned().collect(),
            Kind::EndpointSlice => self.slice_owner.keys().cloned().collect(),
            Kind::Node => self.nodes.keys().map(|n| ObjectKey::cluster(n.as_str())).collect(),
            Kind::ServiceCidr => self.service_cidrs.keys().map(|n| ObjectKey::cluster(n.as_str())).collect(),
        };
        keys.extend(self.unheld.get(&kind).into_iter().flatten().cloned());
        keys
    }

    fn upsert(&mut self, object: &Object) -> ApplyOutcome {
        let mut outcome = ApplyOutcome::default();
        match object {
            Object::Service(svc) => match ServiceInfo::from_object(svc) {
                Ok(info) => {
                    if let Some(value) = invalid_traffic_hint(svc) {
                        outcome.warnings.push(ObjectError::new(
                            Kind::Service,
                            &object.key(),
                            "spec.trafficHint",
                            format!("unknown traffic hint {value:?} ignored (want LongLived)"),
                        ));
                    }
                    // The index shares the record's key (its strings are not copied).
                    let changed = match info {
                        Some(info) => {
                            let (key, info) = (info.key.clone(), Arc::new(info));
                            let changed = self.services.insert(key.clone(), info.clone()).is_none_or(|old| old != info);
                            changed.then_some(key)
                        }
                        None => {
                            let key = object.key();
                            self.services.remove(&key).is_some().then_some(key)
                        }
                    };
                    if let Some(key) = changed {
                        self.dirty.services.insert(key);
                    }
                }
                Err(e) => outcome.rejected.push(e),
            },
            Object::EndpointSlice(slice) => match SliceInfo::from_object(slice) {
                Ok(Some(mut info)) => {
                    for endpoint in &mut info.endpoints {
                        endpoint.node_name = endpoint.node_name.take().map(|name| self.intern_node(name));
                    }
                    // One copy of the Service's name, shared with its record when it has one.
                    if let Some((service, _)) = self.services.get_key_value(&info.service) {
                        info.service = service.clone();
                    }
                    let key = info.key.clone();
                    // A slice that moved to another service (label change) leaves the old one.
                    if self.slice_owner.get(&key).is_some_and(|owner| *owner != info.service) {
                        self.remove(Kind::EndpointSlice, &key);
                    }
                    let (owner, family) = (info.service.clone(), info.family);
                    let slices = self.slices.entry(owner.clone()).or_default();
                    let changed = match slices.binary_search_by(|s| s.key.name.cmp(&key.name)) {
                        Ok(i) if *slices[i] == info => false,
                        Ok(i) => {
                            slices[i] = Arc::new(info);
                            true
                        }
                        Err(i) => {
                            // Usually a Service's only slice: no room for more than it holds.
                            slices.reserve_exact(1);
                            slices.insert(i, Arc::new(info));
                            true
                        }
                    };
                    self.slice_owner.insert(key, owner.clone());
                    if changed {
                        self.dirty.services.insert(owner);
                        self.change_triggers.extend(last_change_trigger_time(slice).map(|t| (family, t)));
                    }
                }
                Ok(None) => self.remove(Kind::EndpointSlice, &object.key()),
                Err(e) => outcome.rejected.push(e),
            },
            Object::Node(node) => match NodeInfo::from_object(node) {
                Ok(info) => {
                    if self.nodes.get(&info.name).is_none_or(|old| **old != info) {
                        self.nodes.insert(info.name.clone(), Arc::new(info));
                        self.dirty.all = true;
                    }
                }
                Err(e) => outcome.rejected.push(e),
            },
            Object::ServiceCidr(cidr) => match service_cidr_nets(cidr) {
                Ok(nets) => {
                    let name = object.key().name.to_string();
                    if self.service_cidrs.insert(name, nets.clone()).is_none_or(|old| old != nets) {
                        self.dirty.all = true;
                    }
                }
                Err(e) => outcome.rejected.push(e),
            },
        }
        outcome
    }

    /// The shared copy of a node name.
    fn intern_node(&mut self, name: Arc<str>) -> Arc<str> {
        if let Some(shared) = self.endpoint_nodes.get(&name) {
            return shared.clone();
        }
        self.endpoint_nodes.insert(name.clone());
        name
    }

    fn remove(&mut self, kind: Kind, key: &ObjectKey) {
        if let Some(unheld) = self.unheld.get_mut(&kind) {
            unheld.remove(key);
        }
        match kind {
            Kind::Service => {
                if self.services.remove(key).is_some() {
                    self.dirty.services.insert(key.clone());
                }
            }
            Kind::EndpointSlice => {
                if let Some(owner) = self.slice_owner.remove(key) {
                    if let Some(slices) = self.slices.get_mut(&owner) {
                        slices.retain(|s| s.key.name != key.name);
                        if slices.is_empty() {
                            self.slices.remove(&owner);
                        }
                    }
                    self.dirty.services.insert(owner);
                }
            }
            Kind::Node => {
                if self.nodes.remove(&*key.name).is_some() {
                    self.dirty.all = true;
                }
            }
            Kind::ServiceCidr => {
                if self.service_cidrs.remove(&*key.name).is_some() {
                    self.dirty.all = true;
                }
            }
        }
    }
}

fn service_cidr_nets(cidr: &ServiceCIDR) -> Result<Vec<IpNet>, ObjectError> {
    let key = ObjectKey::of(&cidr.metadata);
    if key.name.is_empty() {
        return Err(ObjectError::new(Kind::ServiceCidr, &key, "metadata.name", "missing"));
    }
    crate::names::dns1123_subdomain(&key.name)
        .map_err(|e| ObjectError::new(Kind::ServiceCidr, &key, "metadata.name", e))?;
    cidr.spec
        .iter()
        .flat_map(|s| s.cidrs.iter().flatten())
        .enumerate()
        .map(|(i, c)| {
            c.parse::<IpNet>().map(|n| n.trunc()).map_err(|_| {
                ObjectError::new(Kind::ServiceCidr, &key, format!("spec.cidrs[{i}]"), format!("invalid CIDR {c:?}"))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;

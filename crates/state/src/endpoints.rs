//! EndpointSlices, validated. Several slices of one Service are merged by the plan.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::change::{Kind, ObjectKey};
use crate::error::ObjectError;
use crate::labels::{LAST_CHANGE_TRIGGER_TIME_ANNOTATION, SERVICE_NAME_LABEL, ignored_by_selectors};
use crate::names;
use crate::service::{IpFamily, Protocol, parse_ip, port_number};

/// One port of an EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SlicePort {
    /// Port name; matches the Service port of the same name and protocol.
    pub name: String,
    /// Protocol.
    pub protocol: Protocol,
    /// Target port on the endpoints.
    pub port: u16,
}

/// One endpoint of an EndpointSlice. Compact (48 bytes): a cluster holds one per pod and port
/// family, so the rarely set topology hints sit behind one pointer and the node name is shared
/// by every endpoint on that node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointInfo {
    /// The endpoint's address (the first of `addresses`, as upstream uses).
    pub ip: IpAddr,
    /// `conditions.ready` (absent means ready).
    pub ready: bool,
    /// `conditions.serving` (absent means ready's value).
    pub serving: bool,
    /// `conditions.terminating` (absent means false).
    pub terminating: bool,
    /// `nodeName`, when set ([`crate::ClusterState`] shares one copy per node).
    pub node_name: Option<Arc<str>>,
    /// `hints`, when the slice has any.
    pub hints: Option<Box<TopologyHints>>,
}

/// The topology hints of an endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct TopologyHints {
    /// `hints.forZones`.
    pub zones: BTreeSet<String>,
    /// `hints.forNodes`.
    pub nodes: BTreeSet<String>,
}

/// No hints.
static NO_HINTS: BTreeSet<String> = BTreeSet::new();

impl EndpointInfo {
    /// `hints.forZones` (empty when none).
    pub fn zone_hints(&self) -> &BTreeSet<String> {
        self.hints.as_ref().map_or(&NO_HINTS, |h| &h.zones)
    }

    /// `hints.forNodes` (empty when none).
    pub fn node_hints(&self) -> &BTreeSet<String> {
        self.hints.as_ref().map_or(&NO_HINTS, |h| &h.nodes)
    }
}

/// An EndpointSlice, validated.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SliceInfo {
    /// The slice's own namespace and name.
    pub key: ObjectKey,
    /// The Service it belongs to (label `kubernetes.io/service-name`).
    pub service: ObjectKey,
    /// The address family of every endpoint in it.
    pub family: IpFamily,
    /// Ports.
    pub ports: Vec<SlicePort>,
    /// Endpoints.
    pub endpoints: Vec<EndpointInfo>,
}

/// `endpoints.kubernetes.io/last-change-trigger-time`: when the change behind this version of
/// `slice` happened, for the network programming latency metric. Read when the slice is applied
/// and not kept in its record: it matters only for the change that brought it.
pub fn last_change_trigger_time(slice: &EndpointSlice) -> Option<String> {
    slice.metadata.annotations.as_ref().and_then(|a| a.get(LAST_CHANGE_TRIGGER_TIME_ANNOTATION)).cloned()
}

impl SliceInfo {
    /// Validates a slice. `Ok(None)` for slices kube-proxy ignores: FQDN slices, slices of
    /// headless services or of another proxy, slices without a service-name label.
    pub fn from_object(slice: &EndpointSlice) -> Result<Option<Self>, ObjectError> {
        let key = ObjectKey::of(&slice.metadata);
        let err = |field: &str, reason: String| ObjectError::new(Kind::EndpointSlice, &key, field, reason);
        if key.name.is_empty() {
            return Err(err("metadata.name", "missing".into()));
        }
        names::dns1123_label(&key.namespace).map_err(|e| err("metadata.namespace", e))?;
        names::dns1123_subdomain(&key.name).map_err(|e| err("metadata.name", e))?;
        let labels = slice.metadata.labels.as_ref();
        if ignored_by_selectors(labels) {
            return Ok(None);
        }
        let Some(service_name) = labels.and_then(|l| l.get(SERVICE_NAME_LABEL)).filter(|n| !n.is_empty()) else {
            return Ok(None);
        };
        names::dns1035_label(service_name).map_err(|e| err(&format!("metadata.labels[{SERVICE_NAME_LABEL}]"), e))?;
        let family = match slice.address_type.as_str() {
            "IPv4" => IpFamily::V4,
            "IPv6" => IpFamily::V6,
            "FQDN" => return Ok(None),
            other => return Err(err("addressType", format!("unknown address type {other:?}"))),
        };

        // Vecs sized exactly: a cluster holds one of each per slice.
        let mut ports = Vec::with_capacity(slice.ports.as_ref().map_or(0, Vec::len));
        for (i, p) in slice.ports.iter().flatten().enumerate() {
            // A port without a number or protocol cannot be proxied; upstream skips it.
            let Some(number) = p.port else { continue };
            let protocol =
                Protocol::from_k8s(p.protocol.as_deref()).map_err(|e| err(&format!("ports[{i}].protocol"), e))?;
            let port = port_number(number).map_err(|e| err(&format!("ports[{i}].port"), e))?;
            let name = p.name.clone().unwrap_or_default();
            if !name.is_empty() {
                names::dns1123_label(&name).map_err(|e| err(&format!("ports[{i}].name"), e))?;
            }
            ports.push(SlicePort { name, protocol, port });
        }

        let mut endpoints = Vec::with_capacity(slice.endpoints.len());
        for (i, ep) in slice.endpoints.iter().enumerate() {
            let Some(address) = ep.addresses.first() else { continue };
            let ip = parse_ip(address).map_err(|e| err(&format!("endpoints[{i}].addresses[0]"), e))?;
            if IpFamily::of(&ip) != family {
                return Err(err(&format!("endpoints[{i}].addresses[0]"), format!("{ip} is not an {family} address")));
            }
            if let Some(node) = ep.node_name.as_deref().filter(|n| !n.is_empty()) {
                names::dns1123_subdomain(node).map_err(|e| err(&format!("endpoints[{i}].nodeName"), e))?;
            }
            let conditions = ep.conditions.as_ref();
            let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            let hints = ep.hints.as_ref();
            let hints = TopologyHints {
                zones: hints.and_then(|h| h.for_zones.as_ref()).into_iter().flatten().map(|z| z.name.clone()).collect(),
                nodes: hints.and_then(|h| h.for_nodes.as_ref()).into_iter().flatten().map(|n| n.name.clone()).collect(),
            };
            for (j, zone) in hints.zones.iter().enumerate() {
                names::label_value(zone).map_err(|e| err(&format!("endpoints[{i}].hints.forZones[{j}].name"), e))?;
            }
            for (j, node) in hints.nodes.iter().enumerate() {
                names::dns1123_subdomain(node)
                    .map_err(|e| err(&format!("endpoints[{i}].hints.forNodes[{j}].name"), e))?;
            }
            endpoints.push(EndpointInfo {
                ip,
                ready,
                serving: conditions.and_then(|c| c.serving).unwrap_or(ready),
                terminating: conditions.and_then(|c| c.terminating).unwrap_or(false),
                node_name: ep.node_name.as_deref().filter(|n| !n.is_empty()).map(Arc::from),
                hints: (hints != TopologyHints::default()).then(|| Box::new(hints)),
            });
        }

        Ok(Some(SliceInfo {
            service: ObjectKey::new(key.namespace.clone(), service_name.clone()),
            key,
            family,
            ports,
            endpoints,
        }))
    }
}

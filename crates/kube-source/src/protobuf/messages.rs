//! The messages kproxy reads, with only the fields it reads (numbers from k8s.io/api and
//! k8s.io/apimachinery v0.36.2 `generated.proto`), and their conversion into the k8s-openapi
//! objects the state takes.
//!
//! What is read, per kind (everything else is skipped by prost unread):
//!
//! - every kind: `metadata.name`, `namespace`, `resourceVersion`, `labels`,
//!   `deletionTimestamp`, and of the annotations only [`ANNOTATIONS_READ`];
//! - Service: `spec.ports[].{name,protocol,port,nodePort}`, `clusterIP`, `clusterIPs`, `type`,
//!   `externalIPs`, `sessionAffinity`, `sessionAffinityConfig.clientIP.timeoutSeconds`,
//!   `loadBalancerSourceRanges`, `externalTrafficPolicy`, `internalTrafficPolicy`,
//!   `healthCheckNodePort`; `status.loadBalancer.ingress[].{ip,ipMode}`;
//! - EndpointSlice: `addressType`, `endpoints[].{addresses,conditions,nodeName,hints}`,
//!   `ports[].{name,protocol,port}`;
//! - Node: `spec.{podCIDR,podCIDRs,unschedulable,taints[].{key,effect}}`, `status.addresses`;
//! - ServiceCIDR: `spec.cidrs`.
//!
//! That is what `kproxy_state` validates (`ServiceInfo::from_object` and its siblings); a field
//! the state starts reading must be added here too, which `tests/real_apiserver.rs` checks by
//! comparing the state's records of the same objects read as JSON and as protobuf.
//!
//! Go writes its plain (non-pointer) fields even when empty in protobuf and leaves them out of
//! JSON (`omitempty`): such fields are declared without `optional` here and converted with
//! [`nonempty`]/[`nonzero`], so an object reads the same from both encodings. Pointer fields
//! are `optional` and keep their presence.

use std::collections::BTreeMap;

use bytes::Bytes;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as networking;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use kproxy_state::{Kind, Object, ServiceObject};
use kube::core::Status;
use kube::core::response::{StatusCause, StatusDetails, StatusSummary};
use prost::Message as _;

use super::{DecodeError, FieldReader, WireType};

/// The annotations kproxy reads; the others are skipped.
pub(crate) const ANNOTATIONS_READ: &[&str] = &[
    kproxy_state::TRAFFIC_HINT_ANNOTATION,
    kproxy_state::LAST_CHANGE_TRIGGER_TIME_ANNOTATION,
    crate::watcher::INITIAL_EVENTS_END_ANNOTATION,
];

// ---- meta.v1 ----

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ObjectMeta {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "3")]
    namespace: String,
    #[prost(string, tag = "6")]
    resource_version: String,
    #[prost(message, optional, tag = "9")]
    deletion_timestamp: Option<Time>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
    /// A map's entries, as bytes: those kproxy does not read cost no allocation.
    #[prost(message, repeated, tag = "12")]
    annotations: Vec<MapEntry>,
}

/// One entry of a `map<string, string>` (the wire form of a map is a repeated message of these).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct MapEntry {
    #[prost(bytes = "bytes", tag = "1")]
    key: Bytes,
    #[prost(bytes = "bytes", tag = "2")]
    value: Bytes,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Time {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ListMeta {
    #[prost(string, tag = "2")]
    pub(crate) resource_version: String,
    #[prost(string, tag = "3")]
    pub(crate) continue_: String,
    #[prost(int64, optional, tag = "4")]
    pub(crate) remaining_item_count: Option<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct StatusPb {
    #[prost(string, tag = "2")]
    status: String,
    #[prost(string, tag = "3")]
    message: String,
    #[prost(string, tag = "4")]
    reason: String,
    #[prost(message, optional, tag = "5")]
    details: Option<StatusDetailsPb>,
    #[prost(int32, tag = "6")]
    code: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct StatusDetailsPb {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    group: String,
    #[prost(string, tag = "3")]
    kind: String,
    #[prost(message, repeated, tag = "4")]
    causes: Vec<StatusCausePb>,
    #[prost(int32, tag = "5")]
    retry_after_seconds: i32,
    #[prost(string, tag = "6")]
    uid: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct StatusCausePb {
    #[prost(string, tag = "1")]
    reason: String,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(string, tag = "3")]
    field: String,
}

// ---- core.v1 Service ----

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ServicePb {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<ServiceSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<ServiceStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ServiceSpec {
    #[prost(message, repeated, tag = "1")]
    ports: Vec<ServicePort>,
    #[prost(string, tag = "3")]
    cluster_ip: String,
    #[prost(string, tag = "4")]
    type_: String,
    #[prost(string, repeated, tag = "5")]
    external_ips: Vec<String>,
    #[prost(string, tag = "7")]
    session_affinity: String,
    #[prost(string, repeated, tag = "9")]
    load_balancer_source_ranges: Vec<String>,
    #[prost(string, tag = "11")]
    external_traffic_policy: String,
    #[prost(int32, tag = "12")]
    health_check_node_port: i32,
    #[prost(message, optional, tag = "14")]
    session_affinity_config: Option<SessionAffinityConfig>,
    #[prost(string, repeated, tag = "18")]
    cluster_ips: Vec<String>,
    #[prost(string, optional, tag = "22")]
    internal_traffic_policy: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ServicePort {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "2")]
    protocol: String,
    #[prost(int32, tag = "3")]
    port: i32,
    #[prost(int32, tag = "5")]
    node_port: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SessionAffinityConfig {
    #[prost(message, optional, tag = "1")]
    client_ip: Option<ClientIpConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ClientIpConfig {
    #[prost(int32, optional, tag = "1")]
    timeout_seconds: Option<i32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ServiceStatus {
    #[prost(message, optional, tag = "1")]
    load_balancer: Option<LoadBalancerStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LoadBalancerStatus {
    #[prost(message, repeated, tag = "1")]
    ingress: Vec<LoadBalancerIngress>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct LoadBalancerIngress {
    #[prost(string, tag = "1")]
    ip: String,
    #[prost(string, optional, tag = "3")]
    ip_mode: Option<String>,
}

// ---- discovery.v1 EndpointSlice ----

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct EndpointSlicePb {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, repeated, tag = "2")]
    endpoints: Vec<Endpoint>,
    #[prost(message, repeated, tag = "3")]
    ports: Vec<EndpointPort>,
    #[prost(string, tag = "4")]
    address_type: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Endpoint {
    #[prost(string, repeated, tag = "1")]
    addresses: Vec<String>,
    #[prost(message, optional, tag = "2")]
    conditions: Option<EndpointConditions>,
    #[prost(string, optional, tag = "6")]
    node_name: Option<String>,
    #[prost(message, optional, tag = "8")]
    hints: Option<EndpointHints>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct EndpointConditions {
    #[prost(bool, optional, tag = "1")]
    ready: Option<bool>,
    #[prost(bool, optional, tag = "2")]
    serving: Option<bool>,
    #[prost(bool, optional, tag = "3")]
    terminating: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct EndpointHints {
    #[prost(message, repeated, tag = "1")]
    for_zones: Vec<Named>,
    #[prost(message, repeated, tag = "2")]
    for_nodes: Vec<Named>,
}

/// `ForZone` and `ForNode`: a name.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Named {
    #[prost(string, tag = "1")]
    name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct EndpointPort {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    protocol: Option<String>,
    #[prost(int32, optional, tag = "3")]
    port: Option<i32>,
}

// ---- core.v1 Node ----

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct NodePb {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<NodeSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<NodeStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct NodeSpec {
    #[prost(string, tag = "1")]
    pod_cidr: String,
    #[prost(bool, tag = "4")]
    unschedulable: bool,
    #[prost(message, repeated, tag = "5")]
    taints: Vec<Taint>,
    #[prost(string, repeated, tag = "7")]
    pod_cidrs: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Taint {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(string, tag = "3")]
    effect: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct NodeStatus {
    #[prost(message, repeated, tag = "5")]
    addresses: Vec<NodeAddress>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct NodeAddress {
    #[prost(string, tag = "1")]
    type_: String,
    #[prost(string, tag = "2")]
    address: String,
}

// ---- networking.v1 ServiceCIDR ----

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ServiceCidrPb {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<ServiceCidrSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ServiceCidrSpec {
    #[prost(string, repeated, tag = "1")]
    cidrs: Vec<String>,
}

// ---- conversions ----

/// A plain Go string: empty is absent (JSON's `omitempty`).
fn nonempty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// A plain Go number: zero is absent (JSON's `omitempty`).
fn nonzero(n: i32) -> Option<i32> {
    (n != 0).then_some(n)
}

/// A repeated field: empty is absent (JSON's `omitempty`).
fn nonempty_vec<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

fn utf8(bytes: &Bytes, field: &str) -> Result<String, DecodeError> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| DecodeError::Message(format!("{field}: invalid string value: data is not UTF-8 encoded")))
}

impl ObjectMeta {
    fn into_meta(self) -> Result<meta::ObjectMeta, DecodeError> {
        let mut annotations = BTreeMap::new();
        for entry in self.annotations {
            if let Some(read) = ANNOTATIONS_READ.iter().find(|read| read.as_bytes() == entry.key) {
                annotations.insert((*read).to_owned(), utf8(&entry.value, "ObjectMeta.annotations")?);
            }
        }
        let deletion_timestamp = match self.deletion_timestamp {
            Some(time) => Some(meta::Time(
                k8s_openapi::jiff::Timestamp::new(time.seconds, time.nanos)
                    .map_err(|e| DecodeError::Message(format!("ObjectMeta.deletionTimestamp: {e}")))?,
            )),
            None => None,
        };
        Ok(meta::ObjectMeta {
            name: nonempty(self.name),
            namespace: nonempty(self.namespace),
            resource_version: nonempty(self.resource_version),
            deletion_timestamp,
            labels: (!self.labels.is_empty()).then_some(self.labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..meta::ObjectMeta::default()
        })
    }
}

fn metadata(meta: Option<ObjectMeta>) -> Result<meta::ObjectMeta, DecodeError> {
    meta.unwrap_or_default().into_meta()
}

impl ServicePb {
    fn into_object(self) -> Result<Object, DecodeError> {
        let spec = self.spec.map(|spec| core::ServiceSpec {
            ports: nonempty_vec(
                spec.ports
                    .into_iter()
                    .map(|p| core::ServicePort {
                        name: nonempty(p.name),
                        protocol: nonempty(p.protocol),
                        port: p.port,
                        node_port: nonzero(p.node_port),
                        ..core::ServicePort::default()
                    })
                    .collect(),
            ),
            cluster_ip: nonempty(spec.cluster_ip),
            cluster_ips: nonempty_vec(spec.cluster_ips),
            type_: nonempty(spec.type_),
            external_ips: nonempty_vec(spec.external_ips),
            session_affinity: nonempty(spec.session_affinity),
            load_balancer_source_ranges: nonempty_vec(spec.load_balancer_source_ranges),
            external_traffic_policy: nonempty(spec.external_traffic_policy),
            health_check_node_port: nonzero(spec.health_check_node_port),
            session_affinity_config: spec.session_affinity_config.map(|config| core::SessionAffinityConfig {
                client_ip: config
                    .client_ip
                    .map(|client_ip| core::ClientIPConfig { timeout_seconds: client_ip.timeout_seconds }),
            }),
            internal_traffic_policy: spec.internal_traffic_policy,
            ..core::ServiceSpec::default()
        });
        let status = self.status.map(|status| core::ServiceStatus {
            load_balancer: status.load_balancer.map(|lb| core::LoadBalancerStatus {
                ingress: nonempty_vec(
                    lb.ingress
                        .into_iter()
                        .map(|ingress| core::LoadBalancerIngress {
                            ip: nonempty(ingress.ip),
                            ip_mode: ingress.ip_mode,
                            ..core::LoadBalancerIngress::default()
                        })
                        .collect(),
                ),
            }),
            ..core::ServiceStatus::default()
        });
        let service = core::Service { metadata: metadata(self.metadata)?, spec, status };
        Ok(Object::Service(Box::new(ServiceObject::from(service))))
    }
}

impl EndpointSlicePb {
    fn into_object(self) -> Result<Object, DecodeError> {
        let endpoints = self
            .endpoints
            .into_iter()
            .map(|endpoint| discovery::Endpoint {
                addresses: endpoint.addresses,
                conditions: endpoint.conditions.map(|c| discovery::EndpointConditions {
                    ready: c.ready,
                    serving: c.serving,
                    terminating: c.terminating,
                }),
                node_name: endpoint.node_name,
                hints: endpoint.hints.map(|hints| discovery::EndpointHints {
                    for_zones: nonempty_vec(
                        hints.for_zones.into_iter().map(|z| discovery::ForZone { name: z.name }).collect(),
                    ),
                    for_nodes: nonempty_vec(
                        hints.for_nodes.into_iter().map(|n| discovery::ForNode { name: n.name }).collect(),
                    ),
                }),
                ..discovery::Endpoint::default()
            })
            .collect();
        let ports = self
            .ports
            .into_iter()
            .map(|p| discovery::EndpointPort { name: p.name, protocol: p.protocol, port: p.port, app_protocol: None })
            .collect();
        Ok(Object::EndpointSlice(Box::new(discovery::EndpointSlice {
            metadata: metadata(self.metadata)?,
            address_type: self.address_type,
            endpoints,
            ports: nonempty_vec(ports),
        })))
    }
}

impl NodePb {
    fn into_object(self) -> Result<Object, DecodeError> {
        let spec = self.spec.map(|spec| core::NodeSpec {
            pod_cidr: nonempty(spec.pod_cidr),
            pod_cidrs: nonempty_vec(spec.pod_cidrs),
            unschedulable: spec.unschedulable.then_some(true),
            taints: nonempty_vec(
                spec.taints
                    .into_iter()
                    .map(|t| core::Taint { key: t.key, effect: t.effect, ..core::Taint::default() })
                    .collect(),
            ),
            ..core::NodeSpec::default()
        });
        let status = self.status.map(|status| core::NodeStatus {
            addresses: nonempty_vec(
                status
                    .addresses
                    .into_iter()
                    .map(|a| core::NodeAddress { type_: a.type_, address: a.address })
                    .collect(),
            ),
            ..core::NodeStatus::default()
        });
        Ok(Object::Node(Box::new(core::Node { metadata: metadata(self.metadata)?, spec, status })))
    }
}

impl ServiceCidrPb {
    fn into_object(self) -> Result<Object, DecodeError> {
        let spec = self.spec.map(|spec| networking::ServiceCIDRSpec { cidrs: nonempty_vec(spec.cidrs) });
        Ok(Object::ServiceCidr(Box::new(networking::ServiceCIDR {
            metadata: metadata(self.metadata)?,
            spec,
            status: None,
        })))
    }
}

/// Decodes one object of `kind` from its own message (the `raw` of its envelope, or a list item).
pub(crate) fn decode_object(kind: Kind, raw: Bytes) -> Result<Object, DecodeError> {
    match kind {
        Kind::Service => ServicePb::decode(raw)?.into_object(),
        Kind::EndpointSlice => EndpointSlicePb::decode(raw)?.into_object(),
        Kind::Node => NodePb::decode(raw)?.into_object(),
        Kind::ServiceCidr => ServiceCidrPb::decode(raw)?.into_object(),
    }
}

/// The identity of an object that did not decode (name, namespace, resource version), read from
/// its metadata (field 1 of every kind) as far as the bytes allow: the watcher needs the version
/// and the log the name, even when a later field is what is broken.
pub(crate) fn identity(raw: &Bytes) -> meta::ObjectMeta {
    let mut reader = FieldReader::new(&raw[..]);
    let mut found = meta::ObjectMeta::default();
    while let Ok(Some((field, wire_type))) = reader.key() {
        if (field, wire_type) != (1, WireType::Len) {
            if reader.skip_value(wire_type).is_err() {
                break;
            }
            continue;
        }
        let Ok(len) = reader.len() else { break };
        let Ok(bytes) = reader.bytes(len, "metadata") else { break };
        let mut fields = FieldReader::new(&bytes[..]);
        while let Ok(Some((field, wire_type))) = fields.key() {
            let slot = match (field, wire_type) {
                (1, WireType::Len) => &mut found.name,
                (3, WireType::Len) => &mut found.namespace,
                (6, WireType::Len) => &mut found.resource_version,
                (_, wire_type) => {
                    if fields.skip_value(wire_type).is_err() {
                        break;
                    }
                    continue;
                }
            };
            let Ok(len) = fields.len() else { break };
            let Ok(text) = fields.bytes(len, "a metadata field") else { break };
            *slot = nonempty(String::from_utf8_lossy(&text).into_owned());
        }
    }
    found
}

/// A `meta.v1.Status` from its own message, as kube-rs has it.
pub(crate) fn status(raw: Bytes) -> Result<Status, DecodeError> {
    let status = StatusPb::decode(raw)?;
    Ok(Status {
        status: match status.status.as_str() {
            "Success" => Some(StatusSummary::Success),
            "Failure" => Some(StatusSummary::Failure),
            _ => None,
        },
        code: u16::try_from(status.code).unwrap_or_default(),
        message: status.message,
        reason: status.reason,
        metadata: None,
        details: status.details.map(|d| StatusDetails {
            name: d.name,
            group: d.group,
            kind: d.kind,
            uid: d.uid,
            causes: d
                .causes
                .into_iter()
                .map(|c| StatusCause { reason: c.reason, message: c.message, field: c.field })
                .collect(),
            retry_after_seconds: u32::try_from(d.retry_after_seconds).unwrap_or_default(),
        }),
    })
}

/// A `meta.v1.ObjectMeta`'s fields a bookmark carries: its resource version and annotations.
pub(crate) fn bookmark_meta(raw: Bytes) -> Result<(String, BTreeMap<String, String>), DecodeError> {
    #[derive(Clone, PartialEq, prost::Message)]
    struct Bookmark {
        #[prost(message, optional, tag = "1")]
        metadata: Option<ObjectMeta>,
    }
    let meta = Bookmark::decode(raw)?.metadata.unwrap_or_default().into_meta()?;
    Ok((meta.resource_version.unwrap_or_default(), meta.annotations.unwrap_or_default()))
}

/// The other way, for the fake API server: the typed objects as the messages above (what kproxy
/// reads, plus every annotation), Go's way (plain fields written even when empty).
#[cfg(feature = "fake")]
pub(crate) mod from_typed {
    use super::*;

    fn meta(meta: &meta::ObjectMeta) -> ObjectMeta {
        ObjectMeta {
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            deletion_timestamp: meta
                .deletion_timestamp
                .as_ref()
                .map(|t| Time { seconds: t.0.as_second(), nanos: t.0.subsec_nanosecond() }),
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: meta
                .annotations
                .iter()
                .flatten()
                .map(|(k, v)| MapEntry { key: Bytes::from(k.clone()), value: Bytes::from(v.clone()) })
                .collect(),
        }
    }

    /// The message of `object` without its metadata (which the caller writes), and the metadata.
    pub(crate) fn object(object: &Object) -> (Vec<u8>, Vec<u8>) {
        match object {
            Object::Service(s) => {
                let svc = &s.service;
                let spec = svc.spec.as_ref().map(|spec| ServiceSpec {
                    ports: spec
                        .ports
                        .iter()
                        .flatten()
                        .map(|p| ServicePort {
                            name: p.name.clone().unwrap_or_default(),
                            protocol: p.protocol.clone().unwrap_or_default(),
                            port: p.port,
                            node_port: p.node_port.unwrap_or_default(),
                        })
                        .collect(),
                    cluster_ip: spec.cluster_ip.clone().unwrap_or_default(),
                    type_: spec.type_.clone().unwrap_or_default(),
                    external_ips: spec.external_ips.clone().unwrap_or_default(),
                    session_affinity: spec.session_affinity.clone().unwrap_or_default(),
                    load_balancer_source_ranges: spec.load_balancer_source_ranges.clone().unwrap_or_default(),
                    external_traffic_policy: spec.external_traffic_policy.clone().unwrap_or_default(),
                    health_check_node_port: spec.health_check_node_port.unwrap_or_default(),
                    session_affinity_config: spec.session_affinity_config.as_ref().map(|c| SessionAffinityConfig {
                        client_ip: c.client_ip.as_ref().map(|c| ClientIpConfig { timeout_seconds: c.timeout_seconds }),
                    }),
                    cluster_ips: spec.cluster_ips.clone().unwrap_or_default(),
                    internal_traffic_policy: spec.internal_traffic_policy.clone(),
                });
                let status = svc.status.as_ref().map(|status| ServiceStatus {
                    load_balancer: status.load_balancer.as_ref().map(|lb| LoadBalancerStatus {
                        ingress: lb
                            .ingress
                            .iter()
                            .flatten()
                            .map(|i| LoadBalancerIngress {
                                ip: i.ip.clone().unwrap_or_default(),
                                ip_mode: i.ip_mode.clone(),
                            })
                            .collect(),
                    }),
                });
                (ServicePb { metadata: None, spec, status }.encode_to_vec(), meta(&svc.metadata).encode_to_vec())
            }
            Object::EndpointSlice(slice) => {
                let message = EndpointSlicePb {
                    metadata: None,
                    endpoints: slice
                        .endpoints
                        .iter()
                        .map(|e| Endpoint {
                            addresses: e.addresses.clone(),
                            conditions: e.conditions.as_ref().map(|c| EndpointConditions {
                                ready: c.ready,
                                serving: c.serving,
                                terminating: c.terminating,
                            }),
                            node_name: e.node_name.clone(),
                            hints: e.hints.as_ref().map(|h| EndpointHints {
                                for_zones: h
                                    .for_zones
                                    .iter()
                                    .flatten()
                                    .map(|z| Named { name: z.name.clone() })
                                    .collect(),
                                for_nodes: h
                                    .for_nodes
                                    .iter()
                                    .flatten()
                                    .map(|n| Named { name: n.name.clone() })
                                    .collect(),
                            }),
                        })
                        .collect(),
                    ports: slice
                        .ports
                        .iter()
                        .flatten()
                        .map(|p| EndpointPort { name: p.name.clone(), protocol: p.protocol.clone(), port: p.port })
                        .collect(),
                    address_type: slice.address_type.clone(),
                };
                (message.encode_to_vec(), meta(&slice.metadata).encode_to_vec())
            }
            Object::Node(node) => {
                let message = NodePb {
                    metadata: None,
                    spec: node.spec.as_ref().map(|spec| NodeSpec {
                        pod_cidr: spec.pod_cidr.clone().unwrap_or_default(),
                        unschedulable: spec.unschedulable.unwrap_or_default(),
                        taints: spec
                            .taints
                            .iter()
                            .flatten()
                            .map(|t| Taint { key: t.key.clone(), effect: t.effect.clone() })
                            .collect(),
                        pod_cidrs: spec.pod_cidrs.clone().unwrap_or_default(),
                    }),
                    status: node.status.as_ref().map(|status| NodeStatus {
                        addresses: status
                            .addresses
                            .iter()
                            .flatten()
                            .map(|a| NodeAddress { type_: a.type_.clone(), address: a.address.clone() })
                            .collect(),
                    }),
                };
                (message.encode_to_vec(), meta(&node.metadata).encode_to_vec())
            }
            Object::ServiceCidr(cidr) => {
                let message = ServiceCidrPb {
                    metadata: None,
                    spec: cidr
                        .spec
                        .as_ref()
                        .map(|spec| ServiceCidrSpec { cidrs: spec.cidrs.clone().unwrap_or_default() }),
                };
                (message.encode_to_vec(), meta(&cidr.metadata).encode_to_vec())
            }
        }
    }

    /// A bookmark's object: only the metadata, with its resource version and annotations.
    pub(crate) fn bookmark(resource_version: &str, annotations: &BTreeMap<String, String>) -> Vec<u8> {
        let meta = meta::ObjectMeta {
            resource_version: Some(resource_version.to_owned()),
            annotations: Some(annotations.clone()),
            ..meta::ObjectMeta::default()
        };
        self::meta(&meta).encode_to_vec()
    }

    /// A `ListMeta`.
    pub(crate) fn list_meta(resource_version: &str, continue_: Option<&str>, remaining: Option<i64>) -> Vec<u8> {
        ListMeta {
            resource_version: resource_version.to_owned(),
            continue_: continue_.unwrap_or_default().to_owned(),
            remaining_item_count: remaining,
        }
        .encode_to_vec()
    }

    /// A `Status`.
    pub(crate) fn status(status: &Status) -> Vec<u8> {
        StatusPb {
            status: match status.status {
                Some(StatusSummary::Success) => "Success".into(),
                Some(StatusSummary::Failure) => "Failure".into(),
                None => String::new(),
            },
            message: status.message.clone(),
            reason: status.reason.clone(),
            details: status.details.as_ref().map(|d| StatusDetailsPb {
                name: d.name.clone(),
                group: d.group.clone(),
                kind: d.kind.clone(),
                causes: d
                    .causes
                    .iter()
                    .map(|c| StatusCausePb {
                        reason: c.reason.clone(),
                        message: c.message.clone(),
                        field: c.field.clone(),
                    })
                    .collect(),
                retry_after_seconds: i32::try_from(d.retry_after_seconds).unwrap_or(i32::MAX),
                uid: d.uid.clone(),
            }),
            code: i32::from(status.code),
        }
        .encode_to_vec()
    }
}

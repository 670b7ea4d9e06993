//! Protobuf encoding for the fake API server (feature `fake`): objects, lists, watch frames and
//! `Status` bodies as kube-apiserver writes them (see the parent module for the format).
//!
//! The fake keeps its objects as JSON; each is encoded with the fields kproxy reads, every
//! annotation and its managed fields (the bulk of a real object's bytes, which the decoder must
//! skip). It cannot be the oracle of the field numbers (it shares them with the decoder):
//! `tests/real_apiserver.rs` checks those against kube-apiserver v1.36.2.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use kproxy_state::{Kind, Object};
use kube::core::Status;
use prost::Message as _;
use serde_json::Value;

use super::messages::from_typed;
use super::{MAGIC, TypeMeta, Unknown};

#[derive(Clone, PartialEq, prost::Message)]
struct ManagedFieldsEntry {
    #[prost(string, tag = "1")]
    manager: String,
    #[prost(string, tag = "2")]
    operation: String,
    #[prost(string, tag = "3")]
    api_version: String,
    #[prost(string, tag = "6")]
    fields_type: String,
    #[prost(message, optional, tag = "7")]
    fields_v1: Option<FieldsV1>,
    #[prost(string, tag = "8")]
    subresource: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct FieldsV1 {
    #[prost(bytes = "vec", tag = "1")]
    raw: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct WatchEventPb {
    #[prost(string, tag = "1")]
    type_: String,
    #[prost(message, optional, tag = "2")]
    object: Option<RawExtension>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawExtension {
    #[prost(bytes = "vec", tag = "1")]
    raw: Vec<u8>,
}

/// A field's key (number and wire type 2, length-delimited) and length.
fn length_delimited(field: u32, bytes: &[u8], out: &mut Vec<u8>) {
    prost::encode_length_delimiter((field << 3 | 2) as usize, out).unwrap_or_default();
    prost::encode_length_delimiter(bytes.len(), out).unwrap_or_default();
    out.extend_from_slice(bytes);
}

/// The kind's `apiVersion` and `kind`.
fn type_meta(kind: Kind) -> TypeMeta {
    let (api_version, kind) = match kind {
        Kind::Service => ("v1", "Service"),
        Kind::EndpointSlice => ("discovery.k8s.io/v1", "EndpointSlice"),
        Kind::Node => ("v1", "Node"),
        Kind::ServiceCidr => ("networking.k8s.io/v1", "ServiceCIDR"),
    };
    TypeMeta { api_version: api_version.to_owned(), kind: kind.to_owned() }
}

/// The magic and the `runtime.Unknown` envelope around `raw`.
fn envelope(type_meta: TypeMeta, raw: Vec<u8>) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(type_meta),
        raw: raw.into(),
        content_encoding: String::new(),
        content_type: String::new(),
    };
    let mut out = MAGIC.to_vec();
    unknown.encode(&mut out).unwrap_or_default();
    out
}

/// One object's own message (metadata first, managed fields included), from its JSON, read as
/// the source reads JSON (leniently where kproxy reads nothing: a `null` condition time, which a
/// real server would hold as Go's zero time); an error for an object a fake's test made
/// malformed where kproxy reads (see [`broken_message`]).
pub fn message(kind: Kind, value: &Value) -> Result<Vec<u8>, String> {
    let object = crate::decode(kind, value.to_string().as_bytes()).map_err(|bad| bad.to_string())?;
    let managed_fields = value
        .pointer("/metadata/managedFields")
        .and_then(|m| serde_json::from_value::<Vec<meta::ManagedFieldsEntry>>(m.clone()).ok());
    let (rest, mut metadata) = from_typed::object(&object);
    for entry in managed_fields.iter().flatten() {
        let entry = managed_fields_entry(entry);
        length_delimited(17, &entry.encode_to_vec(), &mut metadata);
    }
    let mut out = Vec::with_capacity(metadata.len() + rest.len() + 8);
    length_delimited(1, &metadata, &mut out);
    out.extend_from_slice(&rest);
    Ok(out)
}

fn managed_fields_entry(entry: &meta::ManagedFieldsEntry) -> ManagedFieldsEntry {
    ManagedFieldsEntry {
        manager: entry.manager.clone().unwrap_or_default(),
        operation: entry.operation.clone().unwrap_or_default(),
        api_version: entry.api_version.clone().unwrap_or_default(),
        fields_type: entry.fields_type.clone().unwrap_or_default(),
        fields_v1: entry.fields_v1.as_ref().map(|f| FieldsV1 { raw: f.0.to_string().into_bytes() }),
        subresource: entry.subresource.clone().unwrap_or_default(),
    }
}

/// One object as a response body or a watch event's object: magic, envelope, message.
pub fn object(kind: Kind, value: &Value) -> Result<Vec<u8>, String> {
    Ok(envelope(type_meta(kind), message(kind, value)?))
}

/// A list's body: the envelope around the `<Kind>List` of `items` (each an object's own
/// [`message`]).
pub fn list(
    kind: Kind,
    items: &[Vec<u8>],
    resource_version: &str,
    continue_: Option<&str>,
    remaining: Option<i64>,
) -> Vec<u8> {
    let mut raw = Vec::with_capacity(items.iter().map(|i| i.len() + 6).sum::<usize>() + 64);
    length_delimited(1, &from_typed::list_meta(resource_version, continue_, remaining), &mut raw);
    for item in items {
        length_delimited(2, item, &mut raw);
    }
    let TypeMeta { api_version, kind } = type_meta(kind);
    envelope(TypeMeta { api_version, kind: format!("{kind}List") }, raw)
}

/// One watch frame: the 4-byte length and the event of `type_` with `object` (an envelope).
pub fn watch_frame(type_: &str, object: Vec<u8>) -> Vec<u8> {
    let event = WatchEventPb { type_: type_.to_owned(), object: Some(RawExtension { raw: object }) }.encode_to_vec();
    let mut out = u32::try_from(event.len()).unwrap_or(u32::MAX).to_be_bytes().to_vec();
    out.extend_from_slice(&event);
    out
}

/// A bookmark's object (an envelope): the kind's empty object with only its resource version,
/// annotated when it ends a streaming list's initial events.
pub fn bookmark(kind: Kind, resource_version: u64, initial_events_end: bool) -> Vec<u8> {
    let mut annotations = BTreeMap::new();
    if initial_events_end {
        annotations.insert(crate::watcher::INITIAL_EVENTS_END_ANNOTATION.to_owned(), "true".to_owned());
    }
    let mut raw = Vec::new();
    length_delimited(1, &from_typed::bookmark(&resource_version.to_string(), &annotations), &mut raw);
    envelope(type_meta(kind), raw)
}

/// A `Status` (an envelope), from its JSON form.
pub fn status(value: &Value) -> Vec<u8> {
    let status: Status = serde_json::from_value(value.clone()).unwrap_or_default();
    envelope(TypeMeta { api_version: "v1".into(), kind: "Status".into() }, from_typed::status(&status))
}

/// For a JSON object the fake holds that is not of its kind (a test's malformed object, which a
/// real API server's typed storage could not hold): a message whose metadata names it and whose
/// next field runs past the end, so a reader finds its identity and fails on the rest.
pub fn broken_message(value: &Value) -> Vec<u8> {
    let field = |name: &str| value.pointer(&format!("/metadata/{name}")).and_then(Value::as_str).map(str::to_owned);
    let meta = meta::ObjectMeta {
        name: field("name"),
        namespace: field("namespace"),
        resource_version: field("resourceVersion"),
        ..meta::ObjectMeta::default()
    };
    let object = Object::ServiceCidr(Box::new(k8s_openapi::api::networking::v1::ServiceCIDR {
        metadata: meta,
        ..Default::default()
    }));
    let (_, metadata) = from_typed::object(&object);
    let mut out = Vec::new();
    length_delimited(1, &metadata, &mut out);
    // Field 2, length-delimited, 100 bytes long: none follow.
    out.extend_from_slice(&[0x12, 100]);
    out
}

/// [`broken_message`] in its envelope.
pub fn broken_object(kind: Kind, value: &Value) -> Vec<u8> {
    envelope(type_meta(kind), broken_message(value))
}

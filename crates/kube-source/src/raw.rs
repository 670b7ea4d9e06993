//! Objects as the API server sent them: decoded straight from their JSON text into the typed
//! objects, one at a time, and read leniently when they do not fit.
//!
//! kube-rs deserializes a whole list response, or a whole watch event, at once: with a typed
//! `Api<Service>` one object of an unexpected shape fails the entire list (and the watcher would
//! retry that list forever) or the watch. [`Decoded`] never fails on valid JSON. It takes the
//! object's text as serde_json hands it over (`RawValue`, no JSON tree built), decodes the typed
//! object from it. When that fails it decodes again without the fields kproxy does not read that
//! stand in the way (a `null` condition time, bad managedFields: kube-apiserver accepts what Go
//! decodes leniently, see [`without_unread_fields`]); when a field kproxy reads is at fault, it
//! keeps the reason with as much of the object's identity as can be read (name, namespace,
//! resource version: the watcher needs the last).
//!
//! Decoding straight from the text costs about 40 % of decoding through a `serde_json::Value`
//! first (`source_bench decode`). The text comes without a copy from serde_json's own
//! deserializer; any other deserializer (serde's buffer, used when a watch event sends its
//! `object` before its `type`, which kube-apiserver never does) gets a JSON tree read and its text
//! decoded, with the same result.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use std::marker::PhantomData;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kproxy_state::{Kind, Object, ObjectKey, ServiceObject};
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, DeserializeSeed, Deserializer, Error as _, MapAccess, Visitor};
use serde_json::Value;

use crate::protobuf;

/// The newtype name that makes serde_json (feature `raw_value`) hand a value over as its text.
/// Any other deserializer treats it as an ordinary newtype, which [`ObjectVisitor`] also reads.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// A kind kproxy watches, with its typed object.
pub(crate) trait ApiKind:
    DeserializeOwned + kube::Resource<DynamicType = ()> + Clone + fmt::Debug + Send + Sync + 'static
{
    /// The kind.
    const KIND: Kind;

    /// The fields kproxy reads of this kind, besides [`METADATA_READ`] (paths of map keys):
    /// everything at and under them is read; nothing else is (see [`without_unread_fields`]).
    const READ: &'static [&'static [&'static str]];

    /// The state's object, from the typed one and the JSON text it was decoded from.
    fn into_object(self, json: &str) -> Object;
}

impl ApiKind for Service {
    const KIND: Kind = Kind::Service;
    const READ: &'static [&'static [&'static str]] =
        &[&["spec"], &["status", "loadBalancer"], &["metadata", "annotations", kproxy_state::TRAFFIC_HINT_ANNOTATION]];

    fn into_object(self, json: &str) -> Object {
        Object::Service(Box::new(ServiceObject { service: self, traffic_hint: traffic_hint(json) }))
    }
}

impl ApiKind for EndpointSlice {
    const KIND: Kind = Kind::EndpointSlice;
    const READ: &'static [&'static [&'static str]] = &[
        &["addressType"],
        &["endpoints"],
        &["ports"],
        &["metadata", "annotations", kproxy_state::LAST_CHANGE_TRIGGER_TIME_ANNOTATION],
    ];

    fn into_object(self, _: &str) -> Object {
        Object::EndpointSlice(Box::new(self))
    }
}

impl ApiKind for Node {
    const KIND: Kind = Kind::Node;
    const READ: &'static [&'static [&'static str]] = &[&["spec"], &["status", "addresses"]];

    fn into_object(self, _: &str) -> Object {
        Object::Node(Box::new(self))
    }
}

impl ApiKind for ServiceCIDR {
    const KIND: Kind = Kind::ServiceCidr;
    const READ: &'static [&'static [&'static str]] = &[&["spec"]];

    fn into_object(self, _: &str) -> Object {
        Object::ServiceCidr(Box::new(self))
    }
}

/// `spec.trafficHint` (KEP-4963), a field k8s-openapi's `ServiceSpec` does not have. Read from the
/// text only when the key is in it (kube-apiserver writes keys unescaped), so a Service without
/// it costs a substring search, not a second parse. Read as a JSON tree, which takes the last of
/// duplicated keys as the typed decode does.
fn traffic_hint(json: &str) -> Option<String> {
    if !json.contains("\"trafficHint\"") {
        return None;
    }
    let value: Value = serde_json::from_str(json).ok()?;
    value.pointer("/spec/trafficHint")?.as_str().map(str::to_owned)
}

/// One object of kind `K` as the API server sent it: the state's object, or why it could not be
/// read.
pub(crate) struct Decoded<K> {
    read: Result<Object, Box<Unreadable>>,
    kind: PhantomData<fn() -> K>,
}

/// An object that did not fit its kind: what could be read of its metadata, and why.
#[derive(Debug, Clone)]
struct Unreadable {
    meta: ObjectMeta,
    reason: String,
}

impl<K> Clone for Decoded<K> {
    fn clone(&self) -> Self {
        Self { read: self.read.clone(), kind: PhantomData }
    }
}

impl<K> fmt::Debug for Decoded<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.read.fmt(f)
    }
}

impl<K: ApiKind> Decoded<K> {
    /// Decodes one object's JSON text.
    fn from_json(json: &str) -> Self {
        let read = match serde_json::from_str::<K>(json) {
            Ok(typed) => Self::named(typed.into_object(json)),
            Err(_) => Self::without_unread_fields(json),
        };
        Self { read, kind: PhantomData }
    }

    /// Decodes one object's protobuf message (a list item, or the `raw` of an event's object);
    /// one that does not decode keeps what can be read of its identity, and why.
    pub(crate) fn from_protobuf(raw: Bytes) -> Self {
        let read = match protobuf::decode_object(K::KIND, raw.clone()) {
            Ok(object) => Self::named(object),
            Err(error) => Err(Box::new(Unreadable { meta: protobuf::identity(&raw), reason: error.to_string() })),
        };
        Self { read, kind: PhantomData }
    }

    /// An object nothing could be read of, and why.
    pub(crate) fn unreadable(reason: String) -> Self {
        Self { read: Err(Box::new(Unreadable { meta: ObjectMeta::default(), reason })), kind: PhantomData }
    }

    fn named(mut object: Object) -> Result<Object, Box<Unreadable>> {
        if object.meta().name.as_deref().is_none_or(str::is_empty) {
            return Err(Box::new(Unreadable { meta: object.meta().clone(), reason: "metadata.name missing".into() }));
        }
        // Often the largest part of an object, and nothing kproxy reads: dropped before the
        // object waits in a channel.
        object_meta_mut(&mut object).managed_fields = None;
        Ok(object)
    }

    /// An object that did not decode: decoded again without the fields kproxy does not read
    /// that stand in the way, or, when a field it reads is at fault, why not. Read as a JSON
    /// tree (which takes the last of duplicated keys, as the typed decode does): only a bad
    /// object pays for it.
    fn without_unread_fields(json: &str) -> Result<Object, Box<Unreadable>> {
        let Ok(mut value) = serde_json::from_str::<Value>(json) else {
            return Err(Box::new(Unreadable { meta: ObjectMeta::default(), reason: reason_of::<K>(json) }));
        };
        match without_unread_fields::<K>(&mut value) {
            Ok((typed, dropped)) => {
                let text = value.to_string();
                tracing::debug!(kind = %K::KIND, name = ?typed.meta().name, ?dropped,
                                "fields kproxy does not read did not decode; read without them");
                Self::named(typed.into_object(&text))
            }
            Err(reason) => Err(Box::new(Unreadable { meta: identity(&value), reason })),
        }
    }

    /// The object, or why it could not be read (with its kind and identity).
    pub(crate) fn into_result(self) -> Result<Object, Malformed> {
        self.read.map_err(|unreadable| Malformed {
            kind: K::KIND,
            key: ObjectKey::of(&unreadable.meta),
            reason: unreadable.reason,
        })
    }
}

impl<K> Decoded<K> {
    fn meta_of(&self) -> &ObjectMeta {
        match &self.read {
            Ok(object) => object.meta(),
            Err(unreadable) => &unreadable.meta,
        }
    }
}

/// Why `json` is not a `K`, starting with the path of the field at fault. Decodes again, tracking
/// the path, which only a bad object pays for.
fn reason_of<K: DeserializeOwned>(json: &str) -> String {
    match serde_path_to_error::deserialize::<_, K>(&mut serde_json::Deserializer::from_str(json)) {
        Ok(_) => "decodes only when its field path is tracked".into(),
        Err(e) => {
            let path = e.path().to_string();
            format!("{path}: {}", e.into_inner())
        }
    }
}

/// The metadata every kind is read for: identity, the watcher's resource version, the labels
/// (selectors, the Service an EndpointSlice belongs to, a Node's zone), deletion; and the kind.
pub(crate) const METADATA_READ: &[&[&str]] = &[
    &["apiVersion"],
    &["kind"],
    &["metadata", "name"],
    &["metadata", "namespace"],
    &["metadata", "resourceVersion"],
    &["metadata", "labels"],
    &["metadata", "deletionTimestamp"],
];

/// At most this many unread fields are dropped from one object.
const MAX_DROPPED: usize = 64;

/// Decodes `value` as a `K`, dropping each field that fails to decode where kproxy reads
/// nothing ([`METADATA_READ`], [`ApiKind::READ`]): the outermost field on the failing path that
/// is neither read nor holds a read field (`status.conditions` for a bad
/// `status.conditions[0].lastTransitionTime` of a Service). kube-apiserver accepts what Go
/// decodes leniently (a `null` time is a zero time there, a required field for k8s-openapi), and
/// kube-proxy never looks at most of an object: such a field must not cost the object. A field
/// kproxy reads that does not decode makes the object unreadable, with the reason. Returns the
/// object and the paths dropped.
pub(crate) fn without_unread_fields<K: ApiKind>(value: &mut Value) -> Result<(K, Vec<String>), String> {
    let mut dropped = Vec::new();
    loop {
        let error = match serde_path_to_error::deserialize::<_, K>(&*value) {
            Ok(typed) => return Ok((typed, dropped)),
            Err(error) => error,
        };
        let reason = format!("{}: {}", error.path(), error.inner());
        let keys: Option<Vec<PathKey<'_>>> = error.path().iter().map(PathKey::of).collect();
        let Some(unread) = keys.as_deref().and_then(unread_prefix::<K>) else { return Err(reason) };
        if dropped.len() == MAX_DROPPED || !remove(value, unread) {
            return Err(reason);
        }
        dropped.push(error.path().to_string());
    }
}

/// One step of a path into a JSON tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathKey<'a> {
    Key(&'a str),
    Index(usize),
}

impl<'a> PathKey<'a> {
    fn of(segment: &'a serde_path_to_error::Segment) -> Option<Self> {
        match segment {
            serde_path_to_error::Segment::Map { key } => Some(PathKey::Key(key)),
            serde_path_to_error::Segment::Seq { index } => Some(PathKey::Index(*index)),
            _ => None,
        }
    }
}

/// The shortest prefix of `path` that kproxy does not read and that holds nothing it reads;
/// `None` when the path runs through what it reads.
fn unread_prefix<'p, K: ApiKind>(path: &'p [PathKey<'p>]) -> Option<&'p [PathKey<'p>]> {
    let read = || METADATA_READ.iter().chain(K::READ);
    for end in 1..=path.len() {
        let prefix = &path[..end];
        let is =
            |read: &&[&str]| read.len() <= prefix.len() && read.iter().zip(prefix).all(|(r, p)| *p == PathKey::Key(r));
        if read().any(is) {
            return None;
        }
        let holds =
            |read: &&[&str]| read.len() > prefix.len() && read.iter().zip(prefix).all(|(r, p)| *p == PathKey::Key(r));
        if !read().any(holds) {
            return Some(prefix);
        }
    }
    None
}

/// Removes the value at `path` from `value`; false when there is none.
fn remove(value: &mut Value, path: &[PathKey<'_>]) -> bool {
    let Some((last, parents)) = path.split_last() else { return false };
    let mut parent = value;
    for key in parents {
        let next = match (parent, key) {
            (Value::Object(map), PathKey::Key(k)) => map.get_mut(*k),
            (Value::Array(items), PathKey::Index(i)) => items.get_mut(*i),
            _ => None,
        };
        let Some(next) = next else { return false };
        parent = next;
    }
    match (parent, last) {
        (Value::Object(map), PathKey::Key(k)) => map.remove(*k).is_some(),
        (Value::Array(items), PathKey::Index(i)) if *i < items.len() => {
            items.remove(*i);
            true
        }
        _ => false,
    }
}

/// The fields of the metadata the watcher needs: name, namespace and resource version. Read
/// field by field, so they are there even when the rest of the metadata is malformed.
fn identity(value: &Value) -> ObjectMeta {
    let field = |name: &str| value.get("metadata")?.get(name)?.as_str().map(str::to_owned);
    ObjectMeta {
        name: field("name"),
        namespace: field("namespace"),
        resource_version: field("resourceVersion"),
        ..ObjectMeta::default()
    }
}

impl<'de, K: ApiKind> Deserialize<'de> for Decoded<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_newtype_struct(RAW_VALUE_TOKEN, ObjectVisitor(PhantomData))
    }
}

struct ObjectVisitor<K>(PhantomData<fn() -> K>);

impl<'de, K: ApiKind> Visitor<'de> for ObjectVisitor<K> {
    type Value = Decoded<K>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} object", K::KIND)
    }

    /// serde_json hands the value over as a one-entry map: the token, then the text.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        match map.next_key_seed(IsToken)? {
            Some(true) => map.next_value_seed(TextSeed(PhantomData)),
            _ => Err(A::Error::custom("expected an object's JSON text")),
        }
    }

    /// Any other deserializer: read the value as a JSON tree, then decode its text.
    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Ok(Decoded::from_json(&value.to_string()))
    }
}

/// Whether a map key is [`RAW_VALUE_TOKEN`] (read without copying it).
struct IsToken;

impl<'de> DeserializeSeed<'de> for IsToken {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl Visitor<'_> for IsToken {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == RAW_VALUE_TOKEN)
    }
}

/// Decodes the text serde_json hands over, borrowed or owned.
struct TextSeed<K>(PhantomData<fn() -> K>);

impl<'de, K: ApiKind> DeserializeSeed<'de> for TextSeed<K> {
    type Value = Decoded<K>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<K: ApiKind> Visitor<'_> for TextSeed<K> {
    type Value = Decoded<K>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the JSON text of a {} object", K::KIND)
    }

    fn visit_str<E: de::Error>(self, json: &str) -> Result<Self::Value, E> {
        Ok(Decoded::from_json(json))
    }
}

impl<K: ApiKind> kube::Resource for Decoded<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }

    fn api_version(dt: &()) -> Cow<'_, str> {
        K::api_version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        self.meta_of()
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match &mut self.read {
            Ok(object) => object_meta_mut(object),
            Err(unreadable) => &mut unreadable.meta,
        }
    }
}

fn object_meta_mut(object: &mut Object) -> &mut ObjectMeta {
    match object {
        Object::Service(s) => &mut s.service.metadata,
        Object::EndpointSlice(s) => &mut s.metadata,
        Object::Node(n) => &mut n.metadata,
        Object::ServiceCidr(c) => &mut c.metadata,
    }
}

/// An object that could not be converted, with enough context to log it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {kind} {key}: {reason}")]
pub struct Malformed {
    /// The kind the object was listed or watched as.
    pub kind: Kind,
    /// Its namespace and name, as far as the metadata could be read.
    pub key: ObjectKey,
    /// What is wrong, starting with the field path when one is at fault.
    pub reason: String,
}

/// Decodes one object of `kind` from the protobuf the API server sent (the magic `k8s\0` and the
/// `runtime.Unknown` envelope, as a watch event's object comes), exactly as a watch event's object
/// is decoded. The entry point for fuzzing.
pub fn decode_protobuf(kind: Kind, bytes: &[u8]) -> Result<Object, Malformed> {
    fn read<K: ApiKind>(bytes: &[u8]) -> Result<Object, Malformed> {
        match protobuf::unwrap(Bytes::copy_from_slice(bytes)) {
            Ok((_, raw)) => Decoded::<K>::from_protobuf(raw).into_result(),
            Err(error) => Err(Malformed { kind: K::KIND, key: ObjectKey::default(), reason: error.to_string() }),
        }
    }
    match kind {
        Kind::Service => read::<Service>(bytes),
        Kind::EndpointSlice => read::<EndpointSlice>(bytes),
        Kind::Node => read::<Node>(bytes),
        Kind::ServiceCidr => read::<ServiceCIDR>(bytes),
    }
}

/// Decodes one object of `kind` from the JSON the API server sent, exactly as a list item or a
/// watch event's object is decoded. The entry point for fuzzing.
pub fn decode(kind: Kind, json: &[u8]) -> Result<Object, Malformed> {
    fn read<K: ApiKind>(json: &[u8]) -> Result<Object, Malformed> {
        let decoded: Decoded<K> = serde_json::from_slice(json).map_err(|e| Malformed {
            kind: K::KIND,
            key: ObjectKey::default(),
            reason: format!("not JSON: {e}"),
        })?;
        decoded.into_result()
    }
    match kind {
        Kind::Service => read::<Service>(json),
        Kind::EndpointSlice => read::<EndpointSlice>(json),
        Kind::Node => read::<Node>(json),
        Kind::ServiceCidr => read::<ServiceCIDR>(json),
    }
}

#[cfg(test)]
mod tests;

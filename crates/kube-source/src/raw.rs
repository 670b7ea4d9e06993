//! Objects as the API server sent them, read leniently, then converted one at a time.
//!
//! kube-rs deserializes a whole list response at once: with a typed `Api<Service>` one object of
//! an unexpected shape fails the entire list, and the watcher would retry that list forever.
//! [`RawObject`] accepts any JSON value (only a best-effort `metadata` is extracted, which the
//! watcher needs for resource versions), so the list always succeeds; [`to_object`] then does the
//! strict conversion per object and reports the bad ones.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kproxy_state::{Kind, Object, ObjectKey, ServiceObject};
use kube::core::{ApiResource, DynamicResourceScope};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// One object of any kind, kept as raw JSON.
#[derive(Debug, Clone)]
pub(crate) struct RawObject {
    meta: ObjectMeta,
    value: Value,
}

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut value = Value::deserialize(deserializer)?;
        // Often the largest part of an object, and nothing kproxy reads: dropped on arrival, so
        // a page or an event in flight costs less.
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
        Ok(Self { meta: identity(&value), value })
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

impl kube::Resource for RawObject {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

impl RawObject {
    /// Namespace and name, as far as the metadata could be read.
    pub(crate) fn key(&self) -> ObjectKey {
        ObjectKey::new(self.meta.namespace.clone().unwrap_or_default(), self.meta.name.clone().unwrap_or_default())
    }
}

/// The API resource (group, version, plural) of a kind.
pub(crate) fn api_resource(kind: Kind) -> ApiResource {
    match kind {
        Kind::Service => ApiResource::erase::<Service>(&()),
        Kind::EndpointSlice => ApiResource::erase::<EndpointSlice>(&()),
        Kind::Node => ApiResource::erase::<Node>(&()),
        Kind::ServiceCidr => ApiResource::erase::<ServiceCIDR>(&()),
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

/// Decodes one object of `kind` from the JSON the API server sent, exactly as a list page or a
/// watch event is decoded (lenient read, then strict conversion). The entry point for fuzzing.
pub fn decode(kind: Kind, json: &[u8]) -> Result<Object, Malformed> {
    let raw: RawObject = serde_json::from_slice(json).map_err(|e| Malformed {
        kind,
        key: ObjectKey::default(),
        reason: format!("not a JSON object: {e}"),
    })?;
    to_object(kind, raw)
}

/// Converts a raw object into the typed object of `kind`.
pub(crate) fn to_object(kind: Kind, raw: RawObject) -> Result<Object, Malformed> {
    let key = raw.key();
    let fail = |reason: String| Malformed { kind, key: key.clone(), reason };
    if key.name.is_empty() {
        return Err(fail("metadata.name missing".into()));
    }
    let value = raw.value;
    Ok(match kind {
        Kind::Service => {
            let traffic_hint = value.pointer("/spec/trafficHint").and_then(Value::as_str).map(str::to_owned);
            let service: Service = typed(value).map_err(fail)?;
            Object::Service(Box::new(ServiceObject { service, traffic_hint }))
        }
        Kind::EndpointSlice => Object::EndpointSlice(Box::new(typed(value).map_err(fail)?)),
        Kind::Node => Object::Node(Box::new(typed(value).map_err(fail)?)),
        Kind::ServiceCidr => Object::ServiceCidr(Box::new(typed(value).map_err(fail)?)),
    })
}

/// Strict deserialization, naming the offending field on failure.
fn typed<T: DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        format!("{path}: {}", e.into_inner())
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn raw(value: Value) -> RawObject {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn service_with_traffic_hint() {
        let object = to_object(
            Kind::Service,
            raw(json!({"metadata": {"name": "web", "namespace": "prod", "resourceVersion": "7"},
                       "spec": {"clusterIP": "198.18.0.10", "trafficHint": "LongLived"}})),
        )
        .unwrap();
        let Object::Service(svc) = object else { panic!("not a service: {object:?}") };
        assert_eq!(svc.traffic_hint.as_deref(), Some("LongLived"));
        assert_eq!(svc.service.spec.unwrap().cluster_ip.as_deref(), Some("198.18.0.10"));
        assert_eq!(svc.service.metadata.resource_version.as_deref(), Some("7"));
    }

    #[test]
    fn bad_field_is_named_and_key_kept() {
        let err = to_object(
            Kind::Service,
            raw(json!({"metadata": {"name": "web", "namespace": "prod"}, "spec": {"ports": "eighty"}})),
        )
        .unwrap_err();
        assert_eq!(err.key, ObjectKey::new("prod", "web"));
        assert!(err.reason.starts_with("spec.ports:"), "{}", err.reason);
    }

    #[test]
    fn bad_metadata_still_yields_identity() {
        let raw = raw(json!({"metadata": {"name": "n1", "resourceVersion": "9", "labels": {"a": 1}}}));
        assert_eq!(raw.key(), ObjectKey::cluster("n1"));
        assert_eq!(raw.meta.resource_version.as_deref(), Some("9"));
        let err = to_object(Kind::Node, raw).unwrap_err();
        assert!(err.reason.contains("metadata.labels"), "{}", err.reason);
    }

    #[test]
    fn managed_fields_are_dropped_on_arrival() {
        let raw = raw(json!({"metadata": {"name": "web", "namespace": "prod", "resourceVersion": "3",
                                          "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
                             "spec": {"clusterIP": "198.18.0.10"}}));
        assert_eq!(raw.value.pointer("/metadata/managedFields"), None);
        assert_eq!(raw.meta.resource_version.as_deref(), Some("3"));
        let Object::Service(svc) = to_object(Kind::Service, raw).unwrap() else { panic!("not a service") };
        assert_eq!(svc.service.metadata.managed_fields, None);
        assert_eq!(svc.service.metadata.name.as_deref(), Some("web"));
    }

    #[test]
    fn nameless_object_is_malformed() {
        let err = to_object(Kind::ServiceCidr, raw(json!({"spec": {"cidrs": ["198.18.0.0/16"]}}))).unwrap_err();
        assert_eq!(err.reason, "metadata.name missing");
    }

    #[test]
    fn api_resources_match_upstream_paths() {
        let ar = api_resource(Kind::EndpointSlice);
        assert_eq!(
            (ar.group.as_str(), ar.version.as_str(), ar.plural.as_str()),
            ("discovery.k8s.io", "v1", "endpointslices")
        );
        let ar = api_resource(Kind::ServiceCidr);
        assert_eq!((ar.group.as_str(), ar.plural.as_str()), ("networking.k8s.io", "servicecidrs"));
    }
}

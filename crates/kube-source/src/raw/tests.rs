use kube::Resource as _;
use kube::core::{ObjectList, WatchEvent};
use serde_json::json;

use super::*;

fn decoded<K: ApiKind>(value: Value) -> Decoded<K> {
    serde_json::from_str(&value.to_string()).unwrap()
}

fn decoded_text<K: ApiKind>(json: &str) -> Decoded<K> {
    serde_json::from_str(json).unwrap()
}

fn service(value: Value) -> Result<Object, Malformed> {
    decoded::<Service>(value).into_result()
}

#[test]
fn service_with_traffic_hint() {
    let object = service(json!({"metadata": {"name": "web", "namespace": "prod", "resourceVersion": "7"},
                                "spec": {"clusterIP": "198.18.0.10", "trafficHint": "LongLived"}}))
    .unwrap();
    let Object::Service(svc) = object else { panic!("not a service: {object:?}") };
    assert_eq!(svc.traffic_hint.as_deref(), Some("LongLived"));
    assert_eq!(svc.service.spec.unwrap().cluster_ip.as_deref(), Some("198.18.0.10"));
    assert_eq!(svc.service.metadata.resource_version.as_deref(), Some("7"));
}

#[test]
fn traffic_hint_is_read_only_from_the_spec_and_only_as_text() {
    let hint = |spec: Value, annotations: Value| {
        let object = service(json!({"metadata": {"name": "web", "annotations": annotations}, "spec": spec})).unwrap();
        let Object::Service(svc) = object else { panic!("not a service") };
        svc.traffic_hint
    };
    assert_eq!(hint(json!({}), json!({})), None);
    assert_eq!(hint(json!({"trafficHint": 3}), json!({})), None, "not text");
    assert_eq!(hint(json!({}), json!({"trafficHint": "LongLived"})), None, "an annotation is not the field");
    assert_eq!(hint(json!({"trafficHint": "LongLived"}), json!({})).as_deref(), Some("LongLived"));
}

#[test]
fn bad_field_is_named_and_key_kept() {
    let err =
        service(json!({"metadata": {"name": "web", "namespace": "prod"}, "spec": {"ports": "eighty"}})).unwrap_err();
    assert_eq!(err.kind, Kind::Service);
    assert_eq!(err.key, ObjectKey::new("prod", "web"));
    assert!(err.reason.starts_with("spec.ports:"), "{}", err.reason);
}

#[test]
fn bad_metadata_still_yields_identity() {
    let node = decoded::<Node>(json!({"metadata": {"name": "n1", "resourceVersion": "9", "labels": {"a": 1}}}));
    assert_eq!(node.meta().name.as_deref(), Some("n1"));
    assert_eq!(node.meta().resource_version.as_deref(), Some("9"), "the watcher needs it");
    let err = node.into_result().unwrap_err();
    assert_eq!(err.key, ObjectKey::cluster("n1"));
    assert!(err.reason.contains("metadata.labels"), "{}", err.reason);
}

#[test]
fn identity_fields_of_the_wrong_type_are_left_out() {
    let err = service(json!({"metadata": {"name": 5, "namespace": "prod", "resourceVersion": "3"}})).unwrap_err();
    assert_eq!(err.key, ObjectKey::new("prod", ""));
    let err = service(json!({"metadata": "web"})).unwrap_err();
    assert_eq!(err.key, ObjectKey::default());
    let err = service(json!(["not", "an", "object"])).unwrap_err();
    assert_eq!(err.key, ObjectKey::default());
}

#[test]
fn managed_fields_are_dropped_on_arrival() {
    let object = service(json!({"metadata": {"name": "web", "namespace": "prod", "resourceVersion": "3",
                                             "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
                                "spec": {"clusterIP": "198.18.0.10"}}))
    .unwrap();
    let Object::Service(svc) = object else { panic!("not a service") };
    assert_eq!(svc.service.metadata.managed_fields, None);
    assert_eq!(svc.service.metadata.name.as_deref(), Some("web"));
    assert_eq!(svc.service.metadata.resource_version.as_deref(), Some("3"));
}

#[test]
fn nameless_object_is_malformed() {
    let err = decoded::<ServiceCIDR>(json!({"spec": {"cidrs": ["198.18.0.0/16"]}})).into_result().unwrap_err();
    assert_eq!(err.reason, "metadata.name missing");
    let err = service(json!({"metadata": {"name": ""}})).unwrap_err();
    assert_eq!(err.reason, "metadata.name missing");
}

#[test]
fn one_bad_item_does_not_fail_its_list() {
    let list = json!({"apiVersion": "v1", "kind": "ServiceList", "metadata": {"resourceVersion": "12"}, "items": [
        {"metadata": {"name": "a", "namespace": "prod"}, "spec": {"clusterIP": "198.18.0.1"}},
        {"metadata": {"name": "b", "namespace": "prod"}, "spec": {"ports": "eighty"}},
        {"metadata": {"name": "c", "namespace": "prod"}, "spec": {"clusterIP": "198.18.0.3"}},
    ]});
    let list: ObjectList<Decoded<Service>> = serde_json::from_str(&list.to_string()).unwrap();
    let read: Vec<_> = list.items.into_iter().map(Decoded::into_result).collect();
    assert_eq!(read.iter().filter(|r| r.is_ok()).count(), 2);
    assert_eq!(read[1].as_ref().unwrap_err().key, ObjectKey::new("prod", "b"));
    assert_eq!(read[2].as_ref().unwrap().key(), ObjectKey::new("prod", "c"));
}

#[test]
fn a_watch_event_decodes_alike_whatever_the_order_of_its_fields() {
    let object = json!({"metadata": {"name": "web", "namespace": "prod", "resourceVersion": "4"},
                        "spec": {"clusterIP": "198.18.0.10", "trafficHint": "LongLived"}});
    // kube-apiserver writes `type` first, so the object's text reaches the decoder as sent;
    // with `object` first, serde buffers it and the decoder reads the buffer.
    let type_first = format!(r#"{{"type":"ADDED","object":{object}}}"#);
    let object_first = format!(r#"{{"object":{object},"type":"ADDED"}}"#);
    let read = |line: &str| match serde_json::from_str::<WatchEvent<Decoded<Service>>>(line).unwrap() {
        WatchEvent::Added(decoded) => decoded.into_result().unwrap(),
        other => panic!("not an ADDED event: {other:?}"),
    };
    assert_eq!(read(&type_first), read(&object_first));
    let bad = |line: &str| match serde_json::from_str::<WatchEvent<Decoded<Service>>>(line).unwrap() {
        WatchEvent::Modified(decoded) => decoded.into_result().unwrap_err(),
        other => panic!("not a MODIFIED event: {other:?}"),
    };
    let malformed = json!({"metadata": {"name": "web", "namespace": "prod"}, "spec": {"ports": 1}});
    assert_eq!(
        bad(&format!(r#"{{"type":"MODIFIED","object":{malformed}}}"#)),
        bad(&format!(r#"{{"object":{malformed},"type":"MODIFIED"}}"#))
    );
}

#[test]
fn decode_names_the_kind_and_refuses_what_is_not_json() {
    let err = decode(Kind::EndpointSlice, b"{\"metadata\":").unwrap_err();
    assert_eq!(err.kind, Kind::EndpointSlice);
    assert!(err.reason.starts_with("not JSON"), "{}", err.reason);
    let slice = json!({"metadata": {"name": "web-x", "namespace": "prod"}, "addressType": "IPv4", "endpoints": []});
    let object = decode(Kind::EndpointSlice, slice.to_string().as_bytes()).unwrap();
    assert_eq!(object.key(), ObjectKey::new("prod", "web-x"));
}

#[test]
fn api_resources_match_upstream_paths() {
    assert_eq!(
        (
            Decoded::<EndpointSlice>::group(&()),
            Decoded::<EndpointSlice>::version(&()),
            Decoded::<EndpointSlice>::plural(&())
        ),
        ("discovery.k8s.io".into(), "v1".into(), "endpointslices".into())
    );
    assert_eq!(
        (Decoded::<ServiceCIDR>::group(&()), Decoded::<ServiceCIDR>::plural(&())),
        ("networking.k8s.io".into(), "servicecidrs".into())
    );
}

#[test]
fn a_bad_object_with_duplicated_keys_is_named_by_the_last_of_them() {
    // As a JSON tree (and the typed decode) reads them: the last one wins.
    let json = r#"{"metadata": {"name": "first", "name": "web", "namespace": "prod", "resourceVersion": "5"},
                   "spec": {"ports": "eighty"}}"#;
    let bad: Decoded<Service> = serde_json::from_str(json).unwrap();
    assert_eq!(bad.meta().resource_version.as_deref(), Some("5"), "the watcher needs it");
    assert_eq!(bad.into_result().unwrap_err().key, ObjectKey::new("prod", "web"));
    let hinted = r#"{"metadata": {"name": "web"}, "spec": {"trafficHint": "Other", "trafficHint": "LongLived"}}"#;
    let Object::Service(svc) = decoded_text::<Service>(hinted).into_result().unwrap() else { panic!("not a service") };
    assert_eq!(svc.traffic_hint.as_deref(), Some("LongLived"));
}

#[test]
fn managed_fields_kproxy_cannot_read_do_not_make_an_object_unreadable() {
    let object = service(json!({"metadata": {"name": "web", "namespace": "prod",
                                             "managedFields": [{"manager": 7, "time": "yesterday"}]},
                                "spec": {"clusterIP": "198.18.0.10", "trafficHint": "LongLived"}}))
    .unwrap();
    let Object::Service(svc) = object else { panic!("not a service") };
    assert_eq!(svc.service.metadata.managed_fields, None);
    assert_eq!(svc.traffic_hint.as_deref(), Some("LongLived"));
    // Still unreadable for a field kproxy does read.
    let err = service(json!({"metadata": {"name": "web", "managedFields": [{"manager": 7}]},
                             "spec": {"ports": "eighty"}}))
    .unwrap_err();
    assert!(err.reason.starts_with("metadata.managedFields") || err.reason.starts_with("spec.ports"), "{}", err.reason);
    assert_eq!(err.key, ObjectKey::cluster("web"));
}

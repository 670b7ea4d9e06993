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

/// A Service as kube-apiserver stores it after e2e's "should complete a service status
/// lifecycle" (test/e2e/network/service.go) patched its status: a `metav1.Condition` with a zero
/// time, which Go writes as `"lastTransitionTime": null`. kube-apiserver accepts it; upstream
/// kube-proxy serves the Service.
const E2E_STATUS_LIFECYCLE_SERVICE: &str = r#"{
  "kind": "Service", "apiVersion": "v1",
  "metadata": {
    "name": "test-service-2wnsx", "namespace": "services-8121",
    "uid": "4ad3b5e4-2d0a-4d5c-9a0e-0d2f6c1b8e61", "resourceVersion": "31987",
    "creationTimestamp": "2026-12-04T12:41:09Z",
    "labels": {"test-service-static": "true"},
    "annotations": {"patchedstatus": "true"},
    "managedFields": [
      {"manager": "e2e.test", "operation": "Update", "apiVersion": "v1", "time": "2026-12-04T12:41:09Z",
       "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:test-service-static": {}}}}},
      {"manager": "e2e.test", "operation": "Update", "apiVersion": "v1", "time": "2026-12-04T12:41:10Z",
       "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}}, "subresource": "status"}
    ]
  },
  "spec": {
    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 80}],
    "clusterIP": "198.18.0.12", "clusterIPs": ["198.18.0.12"], "type": "ClusterIP",
    "sessionAffinity": "None", "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
    "internalTrafficPolicy": "Cluster"
  },
  "status": {
    "loadBalancer": {"ingress": [{"ip": "203.0.113.1"}]},
    "conditions": [{"type": "StatusUpdate", "status": "True", "lastTransitionTime": null,
                    "reason": "E2E", "message": "Set from e2e test"}]
  }
}"#;

#[test]
fn a_service_whose_status_condition_has_a_null_time_is_read() {
    let object = decode(Kind::Service, E2E_STATUS_LIFECYCLE_SERVICE.as_bytes()).unwrap();
    let Object::Service(svc) = object else { panic!("not a service") };
    assert_eq!(svc.service.metadata.name.as_deref(), Some("test-service-2wnsx"));
    assert_eq!(svc.service.metadata.resource_version.as_deref(), Some("31987"));
    let spec = svc.service.spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ips.as_deref(), Some(&["198.18.0.12".to_owned()][..]));
    assert_eq!(spec.ports.as_ref().map(Vec::len), Some(1));
    let status = svc.service.status.as_ref().unwrap();
    let ingress = status.load_balancer.as_ref().and_then(|lb| lb.ingress.as_ref()).unwrap();
    assert_eq!(ingress[0].ip.as_deref(), Some("203.0.113.1"), "the status kproxy reads is kept");
    assert_eq!(status.conditions, None, "the conditions it does not read are dropped");
    // And the state serves it.
    let mut state = kproxy_state::ClusterState::new();
    let outcome = state.apply(kproxy_state::Change::Applied(Object::Service(svc)));
    assert!(outcome.rejected.is_empty(), "{:?}", outcome.rejected);
    assert!(state.service(&ObjectKey::new("services-8121", "test-service-2wnsx")).is_some());
}

#[test]
fn a_field_kproxy_reads_that_does_not_decode_still_makes_the_object_unreadable() {
    let mut value: Value = serde_json::from_str(E2E_STATUS_LIFECYCLE_SERVICE).unwrap();
    value["status"]["loadBalancer"]["ingress"][0]["ip"] = json!(7);
    let err = decode(Kind::Service, value.to_string().as_bytes()).unwrap_err();
    assert!(err.reason.starts_with("status.loadBalancer.ingress[0].ip"), "{}", err.reason);
    assert_eq!(err.key, ObjectKey::new("services-8121", "test-service-2wnsx"));
    let err = service(json!({"metadata": {"name": "web", "labels": {"a": null}}})).unwrap_err();
    assert!(err.reason.starts_with("metadata.labels"), "labels are read: {}", err.reason);
    let mut hinted: Value = serde_json::from_str(E2E_STATUS_LIFECYCLE_SERVICE).unwrap();
    hinted["metadata"]["annotations"][kproxy_state::TRAFFIC_HINT_ANNOTATION] = json!(["LongLived"]);
    let err = decode(Kind::Service, hinted.to_string().as_bytes()).unwrap_err();
    assert!(err.reason.contains(kproxy_state::TRAFFIC_HINT_ANNOTATION), "a read annotation: {}", err.reason);
}

/// A readable object of each kind, shaped as kube-apiserver sends it.
fn seeds() -> Vec<(Kind, Value)> {
    let mut service: Value = serde_json::from_str(E2E_STATUS_LIFECYCLE_SERVICE).unwrap();
    service["status"].as_object_mut().unwrap().remove("conditions");
    vec![
        (Kind::Service, service),
        (
            Kind::EndpointSlice,
            json!({"metadata": {"name": "web-x1", "namespace": "prod", "resourceVersion": "8",
                                "labels": {"kubernetes.io/service-name": "web"},
                                "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-04T12:41:09Z"}},
                   "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                   "endpoints": [{"addresses": ["198.19.0.1"], "conditions": {"ready": true}}]}),
        ),
        (
            Kind::Node,
            json!({"metadata": {"name": "node-a", "resourceVersion": "9", "labels": {"kubernetes.io/hostname": "node-a"}},
                   "spec": {"podCIDR": "198.19.0.0/24", "podCIDRs": ["198.19.0.0/24"]},
                   "status": {"addresses": [{"type": "InternalIP", "address": "198.51.100.10"}],
                              "conditions": [{"type": "Ready", "status": "True",
                                              "lastHeartbeatTime": "2026-12-04T12:41:09Z",
                                              "lastTransitionTime": "2026-12-04T12:41:09Z"}]}}),
        ),
        (
            Kind::ServiceCidr,
            json!({"metadata": {"name": "kubernetes", "resourceVersion": "3"}, "spec": {"cidrs": ["198.18.0.0/16"]},
                   "status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-04T12:41:09Z",
                                              "reason": "", "message": ""}]}}),
        ),
    ]
}

/// Places kproxy reads nothing from, in every kind, and the fields there that decode to a type.
const UNREAD: &[&str] = &[
    "/metadata/uid",
    "/metadata/generation",
    "/metadata/creationTimestamp",
    "/metadata/deletionGracePeriodSeconds",
    "/metadata/finalizers",
    "/metadata/ownerReferences",
    "/metadata/managedFields",
    "/metadata/annotations/example.com~1note",
    "/status/conditions",
    "/status/conditions/0",
    "/status/conditions/0/lastTransitionTime",
];

/// Sets `value` at the JSON pointer `at`, making the objects and arrays on the way.
fn set(object: &mut Value, at: &str, value: Value) {
    let mut here = object;
    let keys: Vec<String> = at.split('/').skip(1).map(|k| k.replace("~1", "/")).collect();
    let Some((last, parents)) = keys.split_last() else { return };
    for key in parents {
        if let Ok(i) = key.parse::<usize>() {
            if !here.is_array() {
                *here = json!([]);
            }
            let items = here.as_array_mut().unwrap();
            while items.len() <= i {
                items.push(json!({}));
            }
            here = &mut items[i];
        } else {
            if !here.is_object() {
                *here = json!({});
            }
            here = here.as_object_mut().unwrap().entry(key.clone()).or_insert_with(|| json!({}));
        }
    }
    match (last.parse::<usize>(), here) {
        (Ok(i), Value::Array(items)) => {
            while items.len() <= i {
                items.push(Value::Null);
            }
            items[i] = value;
        }
        (_, here) => {
            if !here.is_object() {
                *here = json!({});
            }
            here.as_object_mut().unwrap().insert(last.clone(), value);
        }
    }
}

/// What kproxy reads of an object: the typed object, as JSON, cut down to the read fields.
fn read_fields(kind: Kind, object: &Object) -> String {
    let mut value = match object {
        Object::Service(s) => serde_json::to_value(&s.service).unwrap(),
        Object::EndpointSlice(s) => serde_json::to_value(s).unwrap(),
        Object::Node(n) => serde_json::to_value(n).unwrap(),
        Object::ServiceCidr(c) => serde_json::to_value(c).unwrap(),
    };
    let mut kept = json!({});
    let read: &[&[&str]] = match kind {
        Kind::Service => <Service as ApiKind>::READ,
        Kind::EndpointSlice => <EndpointSlice as ApiKind>::READ,
        Kind::Node => <Node as ApiKind>::READ,
        Kind::ServiceCidr => <ServiceCIDR as ApiKind>::READ,
    };
    for path in METADATA_READ.iter().chain(read) {
        let pointer: String = path.iter().map(|k| format!("/{}", k.replace('/', "~1"))).collect();
        if let Some(v) = value.pointer_mut(&pointer) {
            set(&mut kept, &pointer, v.take());
        }
    }
    kept.to_string()
}

proptest::proptest! {
    /// Whatever lands where kproxy reads nothing — any JSON, in any kind — the object is read,
    /// with what kproxy reads exactly as without it.
    #[test]
    fn anything_where_kproxy_reads_nothing_leaves_the_object_readable_and_unchanged(
        seed in 0..4usize,
        at in proptest::sample::select(UNREAD),
        junk in json_value(),
    ) {
        let (kind, clean) = seeds().swap_remove(seed);
        let want = decode(kind, clean.to_string().as_bytes()).unwrap();
        let mut dirty = clean.clone();
        set(&mut dirty, at, junk.clone());
        let got = decode(kind, dirty.to_string().as_bytes());
        let got = got.unwrap_or_else(|e| panic!("{kind} with {at} = {junk}: {e}"));
        proptest::prop_assert_eq!(got.key(), want.key());
        proptest::prop_assert_eq!(read_fields(kind, &got), read_fields(kind, &want));
    }
}

/// Any JSON value, a few levels deep.
fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        "[a-zA-Z0-9:/ -]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

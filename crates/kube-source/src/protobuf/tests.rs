use k8s_openapi::api::core::v1::Service;
use kproxy_state::{NodeInfo, ObjectKey, ServiceInfo, SliceInfo};
use serde_json::{Value, json};

use super::*;

fn service_json() -> Value {
    json!({"metadata": {"name": "web", "namespace": "prod", "resourceVersion": "42",
                        "labels": {"app": "web"},
                        "annotations": {"service.kproxy.io/traffic-hint": "LongLived", "other": "x"},
                        "managedFields": [{"manager": "kubectl", "operation": "Apply", "apiVersion": "v1",
                                           "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
           "spec": {"type": "LoadBalancer", "clusterIP": "198.18.0.10", "clusterIPs": ["198.18.0.10", "fd00::a"],
                    "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30080},
                              {"name": "dns", "protocol": "UDP", "port": 53}],
                    "externalIPs": ["203.0.113.7"], "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
                    "internalTrafficPolicy": "Cluster", "sessionAffinity": "ClientIP",
                    "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
                    "loadBalancerSourceRanges": ["192.0.2.0/24"]},
           "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}, {"ip": "198.51.100.2", "ipMode": "Proxy"}]}}})
}

fn slice_json() -> Value {
    json!({"metadata": {"name": "web-abc", "namespace": "prod", "resourceVersion": "43",
                        "labels": {"kubernetes.io/service-name": "web"},
                        "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-06T05:00:00Z"}},
           "addressType": "IPv4",
           "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
           "endpoints": [{"addresses": ["198.18.1.1"], "conditions": {"ready": true, "serving": true, "terminating": false},
                          "nodeName": "node-a", "hints": {"forZones": [{"name": "z1"}], "forNodes": [{"name": "node-a"}]}},
                         {"addresses": ["198.18.1.2"], "conditions": {"ready": false}}]})
}

fn node_json() -> Value {
    json!({"metadata": {"name": "node-a", "resourceVersion": "44", "labels": {"topology.kubernetes.io/zone": "z1"},
                        "deletionTimestamp": "2026-12-06T05:00:00Z"},
           "spec": {"podCIDR": "198.18.64.0/24", "podCIDRs": ["198.18.64.0/24"],
                    "taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]},
           "status": {"addresses": [{"type": "InternalIP", "address": "198.51.100.9"}, {"type": "Hostname", "address": "a"}]}})
}

/// The object read from JSON, as the source reads it.
fn from_json(kind: Kind, value: &Value) -> Object {
    crate::decode(kind, value.to_string().as_bytes()).unwrap()
}

/// The object encoded as the fake does and read back as a watch event's object is.
fn from_protobuf(kind: Kind, value: &Value) -> Object {
    crate::decode_protobuf(kind, &encode::object(kind, value).unwrap()).unwrap()
}

#[test]
fn every_kind_reads_the_same_from_both_encodings() {
    let (json, proto) = (from_json(Kind::Service, &service_json()), from_protobuf(Kind::Service, &service_json()));
    let (Object::Service(j), Object::Service(p)) = (&json, &proto) else { panic!("not services") };
    assert_eq!(ServiceInfo::from_object(j).unwrap(), ServiceInfo::from_object(p).unwrap());
    assert!(ServiceInfo::from_object(p).unwrap().is_some_and(|s| s.traffic_hint.is_some()), "the annotation is read");
    assert_eq!(p.service.metadata.resource_version.as_deref(), Some("42"));
    assert_eq!(p.service.metadata.labels, j.service.metadata.labels);
    let annotations = p.service.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations.keys().collect::<Vec<_>>(), ["service.kproxy.io/traffic-hint"], "only what is read");
    assert!(p.service.metadata.managed_fields.is_none());

    let (json, proto) =
        (from_json(Kind::EndpointSlice, &slice_json()), from_protobuf(Kind::EndpointSlice, &slice_json()));
    let (Object::EndpointSlice(j), Object::EndpointSlice(p)) = (&json, &proto) else { panic!("not slices") };
    assert_eq!(SliceInfo::from_object(j).unwrap(), SliceInfo::from_object(p).unwrap());
    let trigger =
        p.metadata.annotations.as_ref().and_then(|a| a.get(kproxy_state::LAST_CHANGE_TRIGGER_TIME_ANNOTATION));
    assert_eq!(trigger.map(String::as_str), Some("2026-12-06T05:00:00Z"));
    assert_eq!(p.endpoints[1].conditions.as_ref().unwrap().serving, None, "pointer fields keep their absence");

    let (json, proto) = (from_json(Kind::Node, &node_json()), from_protobuf(Kind::Node, &node_json()));
    let (Object::Node(j), Object::Node(p)) = (&json, &proto) else { panic!("not nodes") };
    assert_eq!(NodeInfo::from_object(j).unwrap(), NodeInfo::from_object(p).unwrap());
    assert!(NodeInfo::from_object(p).unwrap().draining);
    assert_eq!(p.metadata.deletion_timestamp, j.metadata.deletion_timestamp);

    let cidr =
        json!({"metadata": {"name": "kubernetes", "resourceVersion": "1"}, "spec": {"cidrs": ["198.18.0.0/15"]}});
    let Object::ServiceCidr(p) = from_protobuf(Kind::ServiceCidr, &cidr) else { panic!("not a ServiceCIDR") };
    assert_eq!(p.spec.unwrap().cidrs.unwrap(), ["198.18.0.0/15"]);
}

#[test]
fn empty_plain_fields_read_as_absent_like_json_omits_them() {
    // Go writes `type: ""` and `nodePort: 0`; JSON leaves them out.
    let mut raw = Vec::new();
    let meta = [0x0a, 1, b'a', 0x1a, 1, b'p'];
    encode_field(1, &meta, &mut raw);
    let port = [0x18, 80, 0x28, 0]; // port 80, nodePort 0
    let mut spec = Vec::new();
    encode_field(1, &port, &mut spec);
    encode_field(4, b"", &mut spec); // type ""
    encode_field(2, &spec, &mut raw);
    let Ok(Object::Service(svc)) = decode_object(Kind::Service, raw.into()) else { panic!("a service") };
    let spec = svc.service.spec.unwrap();
    assert_eq!(spec.type_, None);
    assert_eq!(spec.ports.unwrap()[0].node_port, None);
}

fn encode_field(field: u8, bytes: &[u8], out: &mut Vec<u8>) {
    out.push(field << 3 | 2);
    prost::encode_length_delimiter(bytes.len(), out).unwrap();
    out.extend_from_slice(bytes);
}

#[test]
fn bad_bytes_are_a_clear_error_with_the_identity_that_could_be_read() {
    let good = encode::object(Kind::Service, &service_json()).unwrap();
    // Cut inside the spec: the metadata is whole, the spec is not.
    let cut = &good[..good.len() - 10];
    let bad = crate::decode_protobuf(Kind::Service, cut).unwrap_err();
    assert_eq!(bad.key, ObjectKey::new("", ""), "the envelope itself is cut: nothing is read");
    assert!(!bad.reason.is_empty());

    let broken = encode::broken_object(
        Kind::Service,
        &json!({"metadata": {"name": "web", "namespace": "prod", "resourceVersion": "7"}}),
    );
    let bad = crate::decode_protobuf(Kind::Service, &broken).unwrap_err();
    assert_eq!(bad.key, ObjectKey::new("prod", "web"));
    assert!(bad.reason.contains("Service"), "prost names the message: {}", bad.reason);
    let (_, raw) = unwrap(Bytes::from(broken)).unwrap();
    assert_eq!(identity(&raw).resource_version.as_deref(), Some("7"), "the watcher needs it");

    let no_magic = crate::decode_protobuf(Kind::Service, b"{\"kind\":\"Service\"}").unwrap_err();
    assert!(no_magic.reason.contains("magic"), "{}", no_magic.reason);
    let encoded = crate::decode_protobuf(Kind::Service, &[&MAGIC[..], &[0x1a, 4], b"gzip"].concat()).unwrap_err();
    assert!(encoded.reason.contains("gzip"), "{}", encoded.reason);
}

fn list_body(items: &[Vec<u8>]) -> Vec<u8> {
    encode::list(Kind::Service, items, "100", None, None)
}

#[test]
fn a_list_hands_each_item_over_and_a_bad_one_is_skipped_with_its_name() {
    let a = encode::message(Kind::Service, &json!({"metadata": {"name": "a", "namespace": "p"}})).unwrap();
    let bad = encode::broken_message(&json!({"metadata": {"name": "b", "namespace": "p"}}));
    let c = encode::message(Kind::Service, &json!({"metadata": {"name": "c", "namespace": "p"}})).unwrap();
    let (items, meta) = read_list_body(Kind::Service, &list_body(&[a, bad, c]));
    assert_eq!(meta, Ok(Some("100".to_owned())));
    let keys: Vec<_> = items.iter().map(|i| i.as_ref().map(|o| o.key()).map_err(|b| b.key.clone())).collect();
    assert_eq!(keys, [Ok(ObjectKey::new("p", "a")), Err(ObjectKey::new("p", "b")), Ok(ObjectKey::new("p", "c"))]);

    let (items, meta) = read_list_body(Kind::Service, &list_body(&[]));
    assert!(items.is_empty());
    assert_eq!(meta, Ok(Some("100".to_owned())), "an empty list");
}

#[test]
fn a_list_body_that_is_cut_or_lies_about_lengths_fails_without_allocating_its_lengths() {
    let a = encode::message(Kind::Service, &json!({"metadata": {"name": "a", "namespace": "p"}})).unwrap();
    let body = list_body(&[a.clone(), a]);
    for cut in [3, 10, body.len() / 2, body.len() - 1] {
        let (_, meta) = read_list_body(Kind::Service, &body[..cut]);
        assert!(meta.is_err(), "cut at {cut} of {}", body.len());
    }
    // An item claiming 4 GiB inside a tiny body.
    let mut raw = Vec::new();
    raw.push(0x12);
    prost::encode_length_delimiter(u32::MAX as usize, &mut raw).unwrap();
    let mut body = MAGIC.to_vec();
    body.push(0x12);
    prost::encode_length_delimiter(raw.len() + 10, &mut body).unwrap();
    body.extend_from_slice(&raw);
    let (items, meta) = read_list_body(Kind::Service, &body);
    assert!(meta.is_err());
    assert_eq!(items.len(), 0, "nothing handed over for bytes that are not there");
}

#[test]
fn watch_frames_are_events_a_bad_frame_is_reported_and_the_next_one_read() {
    let added = encode::watch_frame("ADDED", encode::object(Kind::Service, &service_json()).unwrap());
    let mut garbage = vec![0, 0, 0, 3];
    garbage.extend_from_slice(&[0xff, 0xff, 0xff]);
    let bad_object = encode::watch_frame(
        "MODIFIED",
        encode::broken_object(
            Kind::Service,
            &json!({"metadata": {"name": "b", "namespace": "prod", "resourceVersion": "9"}}),
        ),
    );
    let bookmark = encode::watch_frame("BOOKMARK", encode::bookmark(Kind::Service, 77, true));
    let error = encode::watch_frame(
        "ERROR",
        encode::status(
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410, "message": "too old"}),
        ),
    );
    let unknown = encode::watch_frame("SURPRISE", Vec::new());
    let body = [added, garbage, bad_object, bookmark, error, unknown].concat();
    let events = read_watch_body(Kind::Service, &body);
    assert_eq!(events.len(), 6, "{events:?}");
    assert_eq!(events[0], Ok("ADDED prod/web".to_owned()));
    assert!(events[1].is_err(), "{:?}", events[1]);
    assert!(events[2].as_ref().is_ok_and(|e| e.starts_with("MODIFIED malformed prod/b")), "{:?}", events[2]);
    assert_eq!(events[3], Ok("BOOKMARK 77 initial-events-end".to_owned()));
    assert_eq!(events[4], Ok("ERROR 410".to_owned()));
    assert!(events[5].as_ref().is_err_and(|e| e.contains("SURPRISE")), "{:?}", events[5]);
}

#[test]
fn a_frame_of_4_gib_ends_the_watch_and_a_cut_frame_ends_it_quietly() {
    let frame = encode::watch_frame("ADDED", encode::object(Kind::Service, &service_json()).unwrap());
    let huge = [frame.clone(), vec![0xff, 0xff, 0xff, 0xff, 1, 2, 3], frame.clone()].concat();
    let events = read_watch_body(Kind::Service, &huge);
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(events[1].as_ref().is_err_and(|e| e.contains("larger than")), "{:?}", events[1]);
    let cut = [frame.clone(), frame[..frame.len() - 5].to_vec()].concat();
    assert_eq!(read_watch_body(Kind::Service, &cut), [Ok("ADDED prod/web".to_owned())]);
}

#[test]
fn statuses_decode_with_their_details() {
    let body = encode::status(&json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 504,
        "message": "Too large resource version", "reason": "Timeout",
        "details": {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}}));
    let (type_meta, raw) = unwrap(Bytes::from(body)).unwrap();
    assert_eq!(type_meta.kind, "Status");
    let status = status(raw).unwrap();
    assert_eq!(status.code, 504);
    let details = status.details.unwrap();
    assert_eq!(details.causes[0].reason, "ResourceVersionTooLarge");
    assert_eq!(details.retry_after_seconds, 1);
    let _: Option<Service> = None;
}

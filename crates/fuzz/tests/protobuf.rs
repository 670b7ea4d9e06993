//! Fuzzing the protobuf decoders: API objects in kube-apiserver's protobuf encoding (magic,
//! `runtime.Unknown` envelope, the object's message), list bodies and watch bodies (length-
//! delimited frames), edited as bytes on the wire (flips, cuts, lengths and keys that lie: a
//! frame or item of 4 GiB, a varint of 2^40) or encoded from restructured objects. Nothing
//! panics or allocates what the bytes do not hold; a rejected object is named as far as its
//! metadata could be read and skipped; an accepted one goes through state, planner and renderer
//! next to a good Service, which stays served.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is a test failure

mod pipeline;

use kproxy_fuzz::{mutated_bytes, mutated_json};
use kproxy_kube_source::fake::objects::{self, Endpoint};
use kproxy_kube_source::protobuf::{encode, read_list_body, read_watch_body};
use kproxy_state::{Change, Kind};
use pipeline::{anchor, assert_anchor_served, render, state_of, synced};
use proptest::prelude::*;
use serde_json::{Value, json};

/// One valid object of each kind (as the JSON fuzz target's seeds).
fn seeds() -> Vec<(Kind, Value)> {
    let ip = |s: &str| s.parse().unwrap();
    let mut lb = objects::service("prod", "lb", ip("198.18.128.20"), 443, 8443);
    lb["spec"]["type"] = "LoadBalancer".into();
    lb["spec"]["externalTrafficPolicy"] = "Local".into();
    lb["spec"]["healthCheckNodePort"] = 32000.into();
    lb["spec"]["ports"][0]["nodePort"] = 30443.into();
    lb["spec"]["sessionAffinity"] = "ClientIP".into();
    lb["status"] = json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}});
    let endpoints =
        [Endpoint { ip: ip("198.18.17.2"), node: "node-a" }, Endpoint { ip: ip("198.18.18.2"), node: "node-b" }];
    vec![
        (Kind::Service, objects::service("prod", "web", ip("198.18.128.10"), 80, 8080)),
        (Kind::Service, lb),
        (Kind::EndpointSlice, objects::endpoint_slice("prod", "web", "web-1", &endpoints, 8080)),
        (
            Kind::Node,
            json!({"metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
                   "spec": {"podCIDR": "198.18.16.0/24", "podCIDRs": ["198.18.16.0/24", "fd00:10:16::/64"]},
                   "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.2"}]}}),
        ),
        (Kind::ServiceCidr, json!({"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["198.18.128.0/17"]}})),
    ]
}

/// Decodes `bytes` as a `kind` in protobuf and applies what decodes to a state holding the
/// anchor Service. Returns the state.
fn decode(kind: Kind, bytes: &[u8]) -> Option<kproxy_state::ClusterState> {
    let object = match kproxy_kube_source::decode_protobuf(kind, bytes) {
        Ok(object) => object,
        Err(malformed) => {
            assert_eq!(malformed.kind, kind);
            assert!(!malformed.reason.is_empty());
            return None;
        }
    };
    let key = object.key();
    let changes = anchor().into_iter().chain([object]).map(Change::Applied).chain(synced());
    let (state, rejected) = state_of(changes);
    for reason in &rejected {
        assert!(reason.contains(&*key.name), "a rejection does not name the object {key}: {reason}");
    }
    Some(state)
}

/// A fuzzed object in protobuf: a restructured object encoded, or an encoding edited as bytes.
fn fuzzed_object() -> impl Strategy<Value = (Kind, Vec<u8>)> {
    let seed = || proptest::sample::select(seeds());
    prop_oneof![
        seed().prop_flat_map(|(kind, value)| (Just(kind), mutated_json(value))).prop_filter_map(
            "not encodable as its kind",
            |(kind, value)| Some((kind, encode::object(kind, &value).ok()?))
        ),
        seed().prop_flat_map(|(kind, value)| (Just(kind), mutated_bytes(encode::object(kind, &value).unwrap())))
    ]
}

/// A body of frames (a watch) or a list of items of one kind, edited as bytes.
fn fuzzed_body(watch: bool) -> impl Strategy<Value = (Kind, Vec<u8>)> {
    proptest::sample::select(vec![Kind::Service, Kind::EndpointSlice]).prop_flat_map(move |kind| {
        let objects: Vec<Value> = seeds().into_iter().filter(|(k, _)| *k == kind).map(|(_, v)| v).collect();
        let body = if watch {
            let mut body = Vec::new();
            for (i, object) in objects.iter().enumerate() {
                let event = if i == 0 { "ADDED" } else { "MODIFIED" };
                body.extend(encode::watch_frame(event, encode::object(kind, object).unwrap()));
            }
            body.extend(encode::watch_frame("BOOKMARK", encode::bookmark(kind, 99, true)));
            body.extend(encode::watch_frame("DELETED", encode::object(kind, &objects[0]).unwrap()));
            body
        } else {
            let items: Vec<Vec<u8>> = objects.iter().map(|o| encode::message(kind, o).unwrap()).collect();
            encode::list(kind, &items, "99", None, None)
        };
        (Just(kind), mutated_bytes(body))
    })
}

proptest! {
    /// The fuzz target: the protobuf object decoder and the state's validation.
    #[test]
    fn decode_a_fuzzed_protobuf_object_is_accepted_or_named_and_skipped((kind, bytes) in fuzzed_object()) {
        decode(kind, &bytes);
    }

    /// What the decoder let through goes on as in the daemon, next to a good Service that stays
    /// served.
    #[test]
    fn pipeline_a_fuzzed_protobuf_object_is_planned_and_rendered_with_the_good_one((kind, bytes) in fuzzed_object()) {
        if let Some(state) = decode(kind, &bytes) {
            assert_anchor_served(&render(&state));
        }
    }

    /// The watch-frame reader: any body yields events or errors, never a panic; a frame that
    /// could not be read ends the watch or is reported alone.
    #[test]
    fn read_a_fuzzed_protobuf_watch_body_event_by_event((kind, body) in fuzzed_body(true)) {
        let events = read_watch_body(kind, &body);
        // Each event needs at least its 4-byte length.
        prop_assert!(events.len() <= body.len() / 4 + 1);
    }

    /// The list reader: any body yields items and an end or an error, never a panic.
    #[test]
    fn read_a_fuzzed_protobuf_list_body_item_by_item((kind, body) in fuzzed_body(false)) {
        let (items, _meta) = read_list_body(kind, &body);
        // Each item needs at least its key and length.
        prop_assert!(items.len() <= body.len() / 2);
    }
}

#[test]
fn every_seed_decodes_and_is_served_and_the_bodies_read_whole() {
    for (kind, seed) in seeds() {
        let state = decode(kind, &encode::object(kind, &seed).unwrap()).expect("the seed decodes");
        assert_anchor_served(&render(&state));
    }
    let frames: Vec<u8> = [
        encode::watch_frame("ADDED", encode::object(Kind::Service, &seeds()[0].1).unwrap()),
        encode::watch_frame("BOOKMARK", encode::bookmark(Kind::Service, 99, true)),
    ]
    .concat();
    assert_eq!(
        read_watch_body(Kind::Service, &frames),
        [Ok("ADDED prod/web".to_owned()), Ok("BOOKMARK 99 initial-events-end".to_owned())]
    );
    let list = encode::list(Kind::Service, &[encode::message(Kind::Service, &seeds()[0].1).unwrap()], "99", None, None);
    let (items, meta) = read_list_body(Kind::Service, &list);
    assert_eq!((items.len(), meta), (1, Ok(Some("99".to_owned()))));
}

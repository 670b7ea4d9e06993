//! Fuzzing the decoding of API objects: objects shaped like a real cluster's (managedFields,
//! annotations, owner references), restructured at random or edited as raw bytes, decoded as a
//! list page or watch event is. Nothing panics; a rejected object is named (kind, and its key
//! when its metadata still says it); an accepted one goes through state, planner and renderer
//! next to a good Service, which stays served.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is a test failure

mod pipeline;

use kproxy_fuzz::{mutated_json, mutated_text};
use kproxy_kube_source::fake::objects::{self, Endpoint};
use kproxy_state::{Change, Kind};
use pipeline::{anchor, assert_anchor_served, render, state_of, synced};
use proptest::prelude::*;
use serde_json::{Value, json};

/// One valid object of each kind.
fn seeds() -> Vec<(Kind, Value)> {
    let ip = |s: &str| s.parse().unwrap();
    let mut lb = objects::service("prod", "lb", ip("198.18.128.20"), 443, 8443);
    lb["spec"]["type"] = "LoadBalancer".into();
    lb["spec"]["externalTrafficPolicy"] = "Local".into();
    lb["spec"]["healthCheckNodePort"] = 32000.into();
    lb["spec"]["ports"][0]["nodePort"] = 30443.into();
    lb["spec"]["sessionAffinity"] = "ClientIP".into();
    lb["spec"]["loadBalancerSourceRanges"] = json!(["203.0.113.0/24"]);
    lb["status"] = json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}});
    let endpoints =
        [Endpoint { ip: ip("198.18.17.2"), node: "node-a" }, Endpoint { ip: ip("198.18.18.2"), node: "node-b" }];
    vec![
        (Kind::Service, objects::service("prod", "web", ip("198.18.128.10"), 80, 8080)),
        (Kind::Service, lb),
        (Kind::EndpointSlice, objects::endpoint_slice("prod", "web", "web-1", &endpoints, 8080)),
        (Kind::EndpointSlice, objects::endpoint_slice("prod", "lb", "lb-1", &endpoints, 8443)),
        (
            Kind::Node,
            json!({"metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
                   "spec": {"podCIDR": "198.18.16.0/24", "podCIDRs": ["198.18.16.0/24", "fd00:10:16::/64"]},
                   "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.2"},
                                            {"type": "InternalIP", "address": "fd00:18::2"}]}}),
        ),
        (Kind::ServiceCidr, json!({"metadata": {"name": "kubernetes"}, "spec": {"cidrs": ["198.18.128.0/17"]}})),
    ]
}

/// Decodes `bytes` as a `kind` and applies what decodes to a state holding the anchor Service:
/// a rejected object is named (by the decoder or by the state). Returns the state.
fn decode(kind: Kind, bytes: &[u8]) -> Option<kproxy_state::ClusterState> {
    let name = serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|v| v.pointer("/metadata/name").and_then(Value::as_str).map(str::to_owned));
    let object = match kproxy_kube_source::decode(kind, bytes) {
        Ok(object) => object,
        Err(malformed) => {
            assert_eq!(malformed.kind, kind);
            if let Some(name) = name {
                assert_eq!(&*malformed.key.name, name, "the error does not name the object: {malformed}");
            }
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

/// A fuzzed API object: restructured, or edited as the bytes on the wire.
fn fuzzed_object() -> impl Strategy<Value = (Kind, Vec<u8>)> {
    let seed = || proptest::sample::select(seeds());
    prop_oneof![
        seed()
            .prop_flat_map(|(kind, value)| (Just(kind), mutated_json(value)))
            .prop_map(|(kind, value)| (kind, value.to_string().into_bytes())),
        seed()
            .prop_flat_map(|(kind, value)| (Just(kind), mutated_text(serde_json::to_string_pretty(&value).unwrap())))
            .prop_map(|(kind, text)| (kind, text.into_bytes())),
    ]
}

proptest! {
    /// The fuzz target: the API object decoder and the state's validation (the long run gives
    /// it a million cases).
    #[test]
    fn decode_a_fuzzed_api_object_is_accepted_or_named_and_skipped((kind, bytes) in fuzzed_object()) {
        decode(kind, &bytes);
    }

    /// What the decoder let through goes on as in the daemon: planner and renderer, next to a
    /// good Service that stays served.
    #[test]
    fn pipeline_a_fuzzed_api_object_is_planned_and_rendered_with_the_good_one((kind, bytes) in fuzzed_object()) {
        if let Some(state) = decode(kind, &bytes) {
            assert_anchor_served(&render(&state));
        }
    }
}

#[test]
fn every_seed_decodes_and_is_served() {
    // The seeds are valid: what the targets find comes from the mutations.
    for (kind, seed) in seeds() {
        let object = kproxy_kube_source::decode(kind, seed.to_string().as_bytes()).unwrap();
        let (state, rejected) = state_of(anchor().into_iter().chain([object]).map(Change::Applied).chain(synced()));
        assert_eq!(rejected, Vec::<String>::new());
        assert_anchor_served(&render(&state));
    }
}

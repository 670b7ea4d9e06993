use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

fn meta(ns: &str, name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(ns.into()),
        name: Some(name.into()),
        labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..Default::default()
    }
}

fn service(name: &str, ip: &str, labels: &[(&str, &str)]) -> Object {
    Object::Service(Box::new(
        Service {
            metadata: meta("ns", name, labels),
            spec: Some(ServiceSpec {
                cluster_ip: Some(ip.into()),
                ports: Some(vec![ServicePort { port: 80, ..Default::default() }]),
                ..Default::default()
            }),
            ..Default::default()
        }
        .into(),
    ))
}

fn slice(name: &str, svc: &str, ips: &[&str]) -> Object {
    Object::EndpointSlice(Box::new(EndpointSlice {
        metadata: meta("ns", name, &[("kubernetes.io/service-name", svc)]),
        address_type: "IPv4".into(),
        endpoints: ips.iter().map(|ip| Endpoint { addresses: vec![ip.to_string()], ..Default::default() }).collect(),
        ports: Some(vec![EndpointPort { port: Some(8080), ..Default::default() }]),
    }))
}

#[test]
fn service_proxy_name_and_headless_labels_are_ignored() {
    let mut state = ClusterState::new();
    state.apply(Change::Applied(service("a", "198.18.0.1", &[("service.kubernetes.io/service-proxy-name", "other")])));
    state.apply(Change::Applied(service("b", "198.18.0.2", &[("service.kubernetes.io/headless", "")])));
    state.apply(Change::Applied(service("c", "None", &[])));
    state.apply(Change::Applied(service("d", "198.18.0.4", &[])));
    let names: Vec<&str> = state.services().map(|s| &*s.key.name).collect();
    assert_eq!(names, ["d"]);
}

#[test]
fn malformed_update_keeps_last_good_version() {
    let mut state = ClusterState::new();
    state.apply(Change::Applied(service("a", "198.18.0.1", &[])));
    let outcome = state.apply(Change::Applied(service("a", "not-an-ip", &[])));
    assert_eq!(outcome.rejected.len(), 1);
    assert_eq!(outcome.rejected[0].field, "spec.clusterIPs[0]");
    let svc = state.service(&ObjectKey::new("ns", "a")).map(|s| s.cluster_ips.clone());
    assert_eq!(svc, Some(vec!["198.18.0.1".parse().unwrap()]));
}

#[test]
fn replace_removes_objects_missing_from_the_listing_and_marks_dirty() {
    let mut state = ClusterState::new();
    state.apply(Change::Applied(slice("s1", "a", &["198.18.1.1"])));
    state.apply(Change::Applied(slice("s2", "b", &["198.18.1.2"])));
    state.take_dirty();
    assert!(!state.is_synced(Kind::EndpointSlice));
    state.apply(Change::Replaced(Kind::EndpointSlice, vec![slice("s1", "a", &["198.18.1.1"])]));
    assert!(state.is_synced(Kind::EndpointSlice));
    assert_eq!(state.slices_of(&ObjectKey::new("ns", "b")).count(), 0);
    assert_eq!(state.take_dirty().services.into_iter().collect::<Vec<_>>(), [ObjectKey::new("ns", "b")]);
}

#[test]
fn slice_relabelled_to_another_service_moves() {
    let mut state = ClusterState::new();
    state.apply(Change::Applied(slice("s1", "a", &["198.18.1.1"])));
    state.apply(Change::Applied(slice("s1", "b", &["198.18.1.1"])));
    assert_eq!(state.slices_of(&ObjectKey::new("ns", "a")).count(), 0);
    assert_eq!(state.slices_of(&ObjectKey::new("ns", "b")).count(), 1);
    state.apply(Change::Deleted(Kind::EndpointSlice, ObjectKey::new("ns", "s1")));
    assert_eq!(state.slices_of(&ObjectKey::new("ns", "b")).count(), 0);
}

#[test]
fn unchanged_reapply_is_not_dirty() {
    let mut state = ClusterState::new();
    state.apply(Change::Applied(service("a", "198.18.0.1", &[])));
    state.take_dirty();
    state.apply(Change::Applied(service("a", "198.18.0.1", &[])));
    assert!(state.take_dirty().services.is_empty());
}

#[test]
fn synced_marks_only_its_kind_and_keeps_the_streamed_objects() {
    let mut state = ClusterState::new();
    state.apply(Change::Applied(service("a", "198.18.0.1", &[])));
    assert!(!state.is_synced(Kind::Service));
    let outcome = state.apply(Change::Synced(Kind::Service));
    assert_eq!(outcome, ApplyOutcome::default());
    assert!(state.is_synced(Kind::Service));
    assert!(!state.is_synced(Kind::EndpointSlice));
    let names: Vec<&str> = state.services().map(|s| &*s.key.name).collect();
    assert_eq!(names, ["a"], "Synced removes nothing: the source sends what is gone as Deleted");
}

#[test]
fn endpoints_on_one_node_share_its_name_and_a_rewrite_keeps_slices_in_name_order() {
    let mut state = ClusterState::new();
    let on_node = |name: &str, svc: &str| {
        let Object::EndpointSlice(mut slice) = slice(name, svc, &["198.18.1.1", "198.18.1.2"]) else { unreachable!() };
        for ep in &mut slice.endpoints {
            ep.node_name = Some("node-a".into());
        }
        Object::EndpointSlice(slice)
    };
    state.apply(Change::Applied(on_node("s2", "a")));
    state.apply(Change::Applied(on_node("s1", "a")));
    let names: Vec<&str> = state.slices_of(&ObjectKey::new("ns", "a")).map(|s| &*s.key.name).collect();
    assert_eq!(names, ["s1", "s2"]);
    let nodes: Vec<Arc<str>> = state
        .slices_of(&ObjectKey::new("ns", "a"))
        .flat_map(|s| s.endpoints.iter())
        .map(|e| e.node_name.clone().unwrap())
        .collect();
    assert_eq!(nodes.len(), 4);
    assert!(nodes.iter().all(|n| Arc::ptr_eq(n, &nodes[0]) && &**n == "node-a"), "one shared copy");
    assert_eq!(state.slices_of(&ObjectKey::new("ns", "a")).next().unwrap().endpoints[0].hints, None);

    // Replacing one slice in place and deleting the other.
    state.take_dirty();
    state.apply(Change::Applied(slice("s1", "a", &["198.18.1.9"])));
    assert!(state.take_dirty().services.contains(&ObjectKey::new("ns", "a")));
    state.apply(Change::Deleted(Kind::EndpointSlice, ObjectKey::new("ns", "s2")));
    let ips: Vec<_> =
        state.slices_of(&ObjectKey::new("ns", "a")).flat_map(|s| s.endpoints.iter().map(|e| e.ip)).collect();
    assert_eq!(ips, ["198.18.1.9".parse::<std::net::IpAddr>().unwrap()]);
}

fn names(state: &ClusterState) -> Vec<String> {
    state.services().map(|s| s.key.name.to_string()).collect()
}

#[test]
fn a_relist_removes_what_it_did_not_name_and_keeps_what_it_could_not_read() {
    let mut state = ClusterState::new();
    for (name, ip) in [("a", "198.18.0.1"), ("b", "198.18.0.2"), ("c", "198.18.0.3")] {
        state.apply(Change::Applied(service(name, ip, &[])));
    }
    state.apply(Change::Applied(slice("c-1", "c", &["198.19.0.3"])));
    state.take_dirty();

    state.apply(Change::ListStarted(Kind::Service));
    state.apply(Change::Applied(service("a", "198.18.0.1", &[])));
    state.apply(Change::Unreadable(Kind::Service, ObjectKey::new("ns", "b")));
    assert_eq!(names(&state), ["a", "b", "c"], "nothing goes before the listing ends");
    let outcome = state.apply(Change::ListEnded(Kind::Service));
    assert_eq!(outcome.gone, [ObjectKey::new("ns", "c")]);
    assert_eq!(names(&state), ["a", "b"], "b was named, unreadable: its last good version stays");
    assert!(state.is_synced(Kind::Service));
    assert_eq!(state.take_dirty().services, BTreeSet::from([ObjectKey::new("ns", "c")]));
    assert_eq!(state.slices_of(&ObjectKey::new("ns", "c")).count(), 1, "slices are a listing of their own");

    // Slices too, and nothing is left over for the next listing.
    state.apply(Change::ListStarted(Kind::EndpointSlice));
    let outcome = state.apply(Change::ListEnded(Kind::EndpointSlice));
    assert_eq!(outcome.gone, [ObjectKey::new("ns", "c-1")]);
    let outcome = state.apply(Change::ListEnded(Kind::Service));
    assert!(outcome.gone.is_empty(), "a listing's end without its start removes nothing: {outcome:?}");
}

#[test]
fn a_listing_that_starts_over_forgets_what_the_broken_one_named() {
    let mut state = ClusterState::new();
    state.apply(Change::Applied(service("a", "198.18.0.1", &[])));
    state.apply(Change::Applied(service("b", "198.18.0.2", &[])));
    state.apply(Change::ListStarted(Kind::Service));
    state.apply(Change::Applied(service("a", "198.18.0.1", &[])));
    // The connection dropped; the listing starts over and no longer holds a.
    state.apply(Change::ListStarted(Kind::Service));
    state.apply(Change::Applied(service("b", "198.18.0.2", &[])));
    let outcome = state.apply(Change::ListEnded(Kind::Service));
    assert_eq!(outcome.gone, [ObjectKey::new("ns", "a")]);
    assert_eq!(names(&state), ["b"]);
}

#[test]
fn a_first_listing_keeps_everything_it_brings() {
    let mut state = ClusterState::new();
    state.apply(Change::ListStarted(Kind::Service));
    state.apply(Change::Applied(service("a", "198.18.0.1", &[])));
    state.apply(Change::Applied(service("b", "198.18.0.2", &[])));
    assert!(!state.is_synced(Kind::Service));
    let outcome = state.apply(Change::ListEnded(Kind::Service));
    assert!(outcome.gone.is_empty());
    assert_eq!(names(&state), ["a", "b"]);
    assert!(state.is_synced(Kind::Service));
}

#[test]
fn a_relist_reports_gone_the_objects_it_ignored_or_rejected_as_well_as_those_it_held() {
    let mut state = ClusterState::new();
    state.apply(Change::Applied(service("a", "198.18.0.1", &[])));
    state.apply(Change::Applied(service("b", "198.18.0.2", &[])));
    state.apply(Change::Applied(service("headless", "None", &[])));
    let outcome = state.apply(Change::Applied(service("bad", "not-an-ip", &[])));
    assert_eq!(outcome.rejected.len(), 1, "rejected from its first version");
    state.apply(Change::Applied(service("deleted", "None", &[])));
    state.apply(Change::Deleted(Kind::Service, ObjectKey::new("ns", "deleted")));
    state.take_dirty();

    state.apply(Change::ListStarted(Kind::Service));
    state.apply(Change::Applied(service("a", "198.18.0.1", &[])));
    let outcome = state.apply(Change::ListEnded(Kind::Service));
    // Held ones first, then the others.
    let gone = ["b", "bad", "headless"].map(|name| ObjectKey::new("ns", name));
    assert_eq!(outcome.gone, gone);
    assert_eq!(names(&state), ["a"]);
    assert_eq!(state.take_dirty().services, BTreeSet::from([ObjectKey::new("ns", "b")]), "only b was programmed");

    // Nothing of theirs is left behind for the next relist.
    state.apply(Change::ListStarted(Kind::Service));
    state.apply(Change::Applied(service("a", "198.18.0.1", &[])));
    assert!(state.apply(Change::ListEnded(Kind::Service)).gone.is_empty());
}

#[test]
fn a_service_that_becomes_headless_is_reported_gone_by_a_relist_that_no_longer_names_it() {
    let mut state = ClusterState::new();
    state.apply(Change::Applied(service("a", "198.18.0.1", &[])));
    state.apply(Change::Applied(service("a", "None", &[])));
    assert!(names(&state).is_empty());
    state.apply(Change::ListStarted(Kind::Service));
    assert_eq!(state.apply(Change::ListEnded(Kind::Service)).gone, [ObjectKey::new("ns", "a")]);
    // And one that stops being headless is held, not also unheld.
    state.apply(Change::Applied(service("b", "None", &[])));
    state.apply(Change::Applied(service("b", "198.18.0.2", &[])));
    state.apply(Change::ListStarted(Kind::Service));
    assert_eq!(state.apply(Change::ListEnded(Kind::Service)).gone, [ObjectKey::new("ns", "b")]);
}

#[test]
fn names_the_api_server_would_refuse_are_rejected_by_field_and_the_rest_is_kept() {
    let mut state = ClusterState::new();
    state.apply(Change::Applied(service("web", "198.18.0.1", &[])));
    let cases: Vec<(Object, &str)> = vec![
        (service("web\nX", "198.18.0.2", &[]), "metadata.name"),
        (service("Web", "198.18.0.3", &[]), "metadata.name"),
        (service("1web", "198.18.0.4", &[]), "metadata.name"),
        (slice("web-\"1", "web", &["198.18.1.1"]), "metadata.name"),
        (slice("web-2", "web x", &["198.18.1.1"]), "metadata.labels[kubernetes.io/service-name]"),
    ];
    for (object, field) in cases {
        let outcome = state.apply(Change::Applied(object));
        assert_eq!(outcome.rejected.len(), 1, "{field}");
        assert_eq!(outcome.rejected[0].field, field);
    }
    let mut bad_namespace = service("ok", "198.18.0.5", &[]);
    if let Object::Service(s) = &mut bad_namespace {
        s.service.metadata.namespace = Some("ns;drop".into());
    }
    assert_eq!(state.apply(Change::Applied(bad_namespace)).rejected[0].field, "metadata.namespace");
    let mut bad_port = slice("web-3", "web", &["198.18.1.1"]);
    if let Object::EndpointSlice(s) = &mut bad_port {
        s.ports =
            Some(vec![EndpointPort { port: Some(8080), name: Some("http\" -j ACCEPT".into()), ..Default::default() }]);
        s.endpoints[0].node_name = Some("node-a".into());
    }
    assert_eq!(state.apply(Change::Applied(bad_port)).rejected[0].field, "ports[0].name");
    let mut bad_node = slice("web-4", "web", &["198.18.1.1"]);
    if let Object::EndpointSlice(s) = &mut bad_node {
        s.endpoints[0].node_name = Some("node a".into());
    }
    assert_eq!(state.apply(Change::Applied(bad_node)).rejected[0].field, "endpoints[0].nodeName");
    let names: Vec<&str> = state.services().map(|s| &*s.key.name).collect();
    assert_eq!(names, ["web"], "only the valid Service is kept");
}

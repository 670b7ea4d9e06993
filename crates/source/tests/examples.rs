//! The shipped example cluster (`examples/` at the repository root) loads cleanly, and means what
//! its README says: other crates' packet tests rely on this inventory.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::net::IpAddr;
use std::path::PathBuf;

use kproxy_source::load;
use kproxy_state::{ClusterState, Kind, ObjectKey, TrafficHint};

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn state() -> ClusterState {
    let snapshot = load(&examples_dir()).unwrap();
    assert!(snapshot.errors().is_empty(), "{:#?}", snapshot.errors());
    let mut state = ClusterState::new();
    for change in snapshot.initial_changes() {
        let outcome = state.apply(change);
        assert!(outcome.rejected.is_empty() && outcome.warnings.is_empty(), "{outcome:?}");
    }
    state
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("demo", name)
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|ip| ip.parse().unwrap()).collect()
}

#[test]
fn the_examples_load_with_no_errors_and_the_expected_counts() {
    let snapshot = load(&examples_dir()).unwrap();
    assert!(snapshot.errors().is_empty(), "{:#?}", snapshot.errors());
    let counts: Vec<(Kind, usize)> = Kind::ALL.iter().map(|&k| (k, snapshot.objects_of(k).count())).collect();
    assert_eq!(counts, vec![(Kind::Node, 3), (Kind::ServiceCidr, 1), (Kind::Service, 21), (Kind::EndpointSlice, 21)]);
}

#[test]
fn the_examples_validate_and_mean_what_the_readme_says() {
    let state = state();
    // Headless, ExternalName and another proxy's service are valid but produce nothing.
    let proxied: Vec<String> = state.services().map(|s| s.key.name.to_string()).collect();
    assert_eq!(proxied.len(), 18, "{proxied:?}");
    for ignored in ["headless", "external-name", "other-proxy"] {
        assert!(state.service(&key(ignored)).is_none(), "{ignored} must be ignored");
    }

    let node_a = state.node("node-a").unwrap();
    assert_eq!(node_a.zone(), Some("zone-a"));
    assert_eq!(node_a.internal_ips, ips(&["198.18.0.2", "fd00:18::2"]));
    assert_eq!(state.node("node-c").unwrap().zone(), Some("zone-b"));
    assert_eq!(state.service_cidrs().count(), 2);

    let dual = state.service(&key("dual-stack")).unwrap();
    assert_eq!(dual.cluster_ips, ips(&["198.18.128.26", "fd00:96::26"]));
    assert_eq!(state.slices_of(&key("dual-stack")).count(), 2);

    let public = state.service(&key("lb-public")).unwrap();
    assert_eq!(public.load_balancer_ips, ips(&["203.0.113.10"]));
    assert_eq!(public.load_balancer_source_ranges.len(), 2);
    assert!(state.service(&key("lb-proxy-mode")).unwrap().load_balancer_ips.is_empty(), "ipMode Proxy");

    let local = state.service(&key("lb-local")).unwrap();
    assert!(local.external_policy_local);
    assert_eq!(local.health_check_node_port, Some(32000));
    let on_node_a = |name: &str| {
        state.slices_of(&key(name)).flat_map(|s| s.endpoints.iter()).any(|e| e.node_name.as_deref() == Some("node-a"))
    };
    assert!(on_node_a("lb-local"), "eTP Local service with a local endpoint");
    assert!(!on_node_a("lb-local-remote"), "eTP Local service without a local endpoint");
    assert!(!on_node_a("dns") && !on_node_a("prefer-zone"), "remote-only services");

    assert_eq!(state.service(&key("external-ips")).unwrap().external_ips, ips(&["203.0.113.20"]));
    assert!(state.service(&key("metrics-local")).unwrap().internal_policy_local);
    assert_eq!(state.service(&key("sticky")).unwrap().session_affinity_timeout, Some(600));
    assert_eq!(state.service(&key("long-lived")).unwrap().traffic_hint, Some(TrafficHint::LongLived));
    assert!(state.slices_of(&key("no-endpoints")).all(|s| s.endpoints.is_empty()));
    let rolling: Vec<(bool, bool, bool)> = state
        .slices_of(&key("rolling"))
        .flat_map(|s| s.endpoints.iter())
        .map(|e| (e.ready, e.serving, e.terminating))
        .collect();
    assert_eq!(rolling, vec![(false, true, true), (false, false, true), (false, true, true)]);
}

#[test]
fn every_address_is_in_the_documented_ranges() {
    let state = state();
    let in_range = |ip: &IpAddr, nets: &[&str]| nets.iter().any(|n| n.parse::<ipnet::IpNet>().unwrap().contains(ip));
    for svc in state.services() {
        for ip in &svc.cluster_ips {
            assert!(in_range(ip, &["198.18.128.0/20", "fd00:96::/112"]), "{} {ip}", svc.key);
        }
        for ip in svc.load_balancer_ips.iter().chain(&svc.external_ips) {
            assert!(in_range(ip, &["203.0.113.0/24", "fd00:203::/64"]), "{} {ip}", svc.key);
        }
        for port in &svc.ports {
            assert!(port.node_port.is_none_or(|p| (30000..=32767).contains(&p)), "{} {port:?}", svc.key);
        }
        for slice in state.slices_of(&svc.key) {
            for ep in &slice.endpoints {
                let node = ep.node_name.as_deref().expect("every endpoint names its node");
                let cidrs = &state.node(node).unwrap().pod_cidrs;
                assert!(cidrs.iter().any(|c| c.contains(&ep.ip)), "{} {} not in {node}'s pod CIDRs", svc.key, ep.ip);
            }
        }
    }
}

//! What happens to a decoded object next, as in the daemon: into the cluster state, through the
//! planner, rendered by the nftables dataplane. A fuzzed object that decodes must not panic any
//! of these either.
#![allow(dead_code)] // each target uses part of it

use kproxy_nftables::{Config, NftablesDataplane, Recording};
use kproxy_plan::{DetectLocal, NodeContext, Planner, ProxyPolicy};
use kproxy_state::{Change, ClusterState, Kind, Object, ObjectKey};

/// The node every target plans for (the examples' node).
pub const NODE: &str = "node-a";

/// Applies `changes` to a fresh state; returns it with every object it rejected.
pub fn state_of(changes: impl IntoIterator<Item = Change>) -> (ClusterState, Vec<String>) {
    let mut state = ClusterState::new();
    let mut rejected = Vec::new();
    for change in changes {
        let outcome = state.apply(change);
        rejected.extend(outcome.rejected.iter().map(ToString::to_string));
    }
    (state, rejected)
}

/// Marks every kind synced (a source does this once its initial listing is complete).
pub fn synced() -> impl Iterator<Item = Change> {
    Kind::ALL.into_iter().map(Change::Synced)
}

/// The nftables ruleset the daemon would load for `state`, as nft text.
pub fn render(state: &ClusterState) -> String {
    let policy = ProxyPolicy { detect_local: DetectLocal::NodeCidr, ..Default::default() };
    let node = NodeContext { name: NODE.into(), ..Default::default() };
    let plan = Planner::new(policy, node).build(state);
    NftablesDataplane::new(Recording::default(), Config::default()).render_initial(&plan).render()
}

/// True when `state` holds `key` of `kind`.
pub fn has(state: &ClusterState, kind: Kind, key: &ObjectKey) -> bool {
    match kind {
        Kind::Service => state.service(key).is_some(),
        Kind::Node => state.node(&key.name).is_some(),
        Kind::EndpointSlice => state.slices_of(&ObjectKey::new(key.namespace.clone(), "anchor")).next().is_some(),
        Kind::ServiceCidr => state.service_cidrs().next().is_some(),
    }
}

/// The objects every target keeps next to the fuzzed one: a Service with one endpoint, which
/// must be served whatever the fuzzed object is.
pub fn anchor() -> Vec<Object> {
    let service = serde_json::json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "fuzz-anchor", "name": "anchor"},
        "spec": {"clusterIP": "198.19.255.1", "clusterIPs": ["198.19.255.1"], "ipFamilies": ["IPv4"],
                 "ports": [{"name": "p", "port": 4321, "protocol": "TCP", "targetPort": 4321}]}});
    let slice = serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "fuzz-anchor", "name": "anchor-1",
                     "labels": {"kubernetes.io/service-name": "anchor"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["198.19.254.1"], "conditions": {"ready": true}}],
        "ports": [{"name": "p", "port": 4321, "protocol": "TCP"}]});
    let decode = |kind, value: serde_json::Value| {
        kproxy_kube_source::decode(kind, value.to_string().as_bytes()).expect("the anchor objects are valid")
    };
    vec![decode(Kind::Service, service), decode(Kind::EndpointSlice, slice)]
}

/// The anchor Service in YAML, as a manifest file.
pub const ANCHOR_YAML: &str = "\
apiVersion: v1
kind: Service
metadata: {namespace: fuzz-anchor, name: anchor}
spec:
  clusterIP: 198.19.255.1
  clusterIPs: [198.19.255.1]
  ipFamilies: [IPv4]
  ports: [{name: p, port: 4321, protocol: TCP, targetPort: 4321}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  namespace: fuzz-anchor
  name: anchor-1
  labels: {kubernetes.io/service-name: anchor}
addressType: IPv4
endpoints: [{addresses: [198.19.254.1], conditions: {ready: true}}]
ports: [{name: p, port: 4321, protocol: TCP}]
";

/// Asserts the anchor Service is still served: its ClusterIP and its endpoint are in the ruleset.
pub fn assert_anchor_served(ruleset: &str) {
    assert!(ruleset.contains("198.19.255.1"), "the anchor Service's ClusterIP is missing:\n{ruleset}");
    assert!(ruleset.contains("198.19.254.1"), "the anchor Service's endpoint is missing:\n{ruleset}");
}

//! A small cluster built in code for rendering tests (until `examples/` lands).

#![allow(dead_code, clippy::unwrap_used)]

pub mod generated;

use kproxy_plan::{DetectLocal, NodeContext, Plan, Planner, ProxyPolicy};
use kproxy_state::{Change, ClusterState, Object, ServiceObject};
use serde_json::{Value, json};

pub fn service(ns: &str, name: &str, spec: Value, status: Value) -> Object {
    let svc = json!({"metadata": {"namespace": ns, "name": name}, "spec": spec, "status": status});
    Object::Service(Box::new(ServiceObject::from(
        serde_json::from_value::<k8s_openapi::api::core::v1::Service>(svc).unwrap(),
    )))
}

pub fn slice(ns: &str, svc: &str, suffix: &str, family: &str, ports: Value, endpoints: Value) -> Object {
    let s = json!({
        "metadata": {"namespace": ns, "name": format!("{svc}-{suffix}"), "labels": {"kubernetes.io/service-name": svc}},
        "addressType": family, "ports": ports, "endpoints": endpoints,
    });
    Object::EndpointSlice(Box::new(serde_json::from_value(s).unwrap()))
}

pub fn node() -> Object {
    let n = json!({
        "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
        "spec": {"podCIDRs": ["198.18.16.0/24", "fd00:16::/64"]},
        "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.2"}, {"type": "InternalIP", "address": "fd00:18::2"}]},
    });
    Object::Node(Box::new(serde_json::from_value(n).unwrap()))
}

pub fn ep(ip: &str, node: &str) -> Value {
    json!({"addresses": [ip], "nodeName": node, "conditions": {"ready": true}})
}

/// The example cluster: ClusterIP, NodePort, LoadBalancer eTP Local with source ranges and
/// affinity, ExternalIP, a service without endpoints, a dual-stack service.
pub fn example_objects() -> Vec<Object> {
    vec![
        node(),
        service(
            "default",
            "web",
            json!({"type": "ClusterIP", "clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"name": "dns", "port": 53, "protocol": "UDP"}]}),
            json!({}),
        ),
        slice(
            "default",
            "web",
            "1",
            "IPv4",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "dns", "port": 5353, "protocol": "UDP"}]),
            json!([ep("198.18.16.2", "node-a"), ep("198.18.17.2", "node-b")]),
        ),
        service(
            "default",
            "np",
            json!({"type": "NodePort", "clusterIP": "198.18.128.11", "ports": [{"name": "p", "port": 80, "nodePort": 30080}]}),
            json!({}),
        ),
        slice("default", "np", "1", "IPv4", json!([{"name": "p", "port": 8080}]), json!([ep("198.18.17.3", "node-b")])),
        service(
            "default",
            "lb",
            json!({"type": "LoadBalancer", "clusterIP": "198.18.128.12", "externalTrafficPolicy": "Local",
            "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 30}},
            "loadBalancerSourceRanges": ["198.18.0.0/24"], "healthCheckNodePort": 31000,
            "ports": [{"name": "https", "port": 443, "nodePort": 30443}]}),
            json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.5"}]}}),
        ),
        slice(
            "default",
            "lb",
            "1",
            "IPv4",
            json!([{"name": "https", "port": 8443}]),
            json!([ep("198.18.16.3", "node-a"), ep("198.18.17.3", "node-b")]),
        ),
        service(
            "default",
            "ext",
            json!({"clusterIP": "198.18.128.13", "externalIPs": ["203.0.113.6"], "ports": [{"name": "p", "port": 80}]}),
            json!({}),
        ),
        slice(
            "default",
            "ext",
            "1",
            "IPv4",
            json!([{"name": "p", "port": 8080}]),
            json!([ep("198.18.16.2", "node-a")]),
        ),
        service(
            "default",
            "empty",
            json!({"clusterIP": "198.18.128.14", "ports": [{"name": "p", "port": 80}]}),
            json!({}),
        ),
        service(
            "default",
            "dual",
            json!({"clusterIP": "198.18.128.15", "clusterIPs": ["198.18.128.15", "fd00:96::15"],
            "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack", "ports": [{"name": "p", "port": 80}]}),
            json!({}),
        ),
        slice(
            "default",
            "dual",
            "4",
            "IPv4",
            json!([{"name": "p", "port": 8080}]),
            json!([ep("198.18.16.2", "node-a")]),
        ),
        slice(
            "default",
            "dual",
            "6",
            "IPv6",
            json!([{"name": "p", "port": 8080}]),
            json!([ep("fd00:16::2", "node-a")]),
        ),
    ]
}

pub fn state(objects: Vec<Object>) -> ClusterState {
    let mut st = ClusterState::new();
    for o in objects {
        st.apply(Change::Applied(o));
    }
    st
}

pub fn planner() -> Planner {
    let policy = ProxyPolicy {
        detect_local: DetectLocal::ClusterCidr(vec![
            "198.18.16.0/20".parse().unwrap(),
            "fd00:16::/48".parse().unwrap(),
        ]),
        ..ProxyPolicy::default()
    };
    Planner::new(policy, NodeContext { name: "node-a".into(), ..NodeContext::default() })
}

pub fn example_plan() -> Plan {
    planner().build(&state(example_objects()))
}

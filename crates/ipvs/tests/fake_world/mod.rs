//! A small cluster for the tests that run the dataplane on the in-memory kernel
//! ([`kproxy_ipvs::FakeHost`]): Services built as the API serves them, planned as the daemon
//! plans them.

#![allow(clippy::unwrap_used, dead_code)]

use kproxy_ipvs::{DestKey, ServiceKey};
use kproxy_packet_suite::{NODE_A, NODE_B, node_objects, service, slice};
use kproxy_plan::{DetectLocal, NodeContext, Plan, PlanDelta, Planner, ProxyPolicy};
use kproxy_state::{Change, ClusterState, Object, Protocol};
use serde_json::json;

/// Service `name` (ClusterIP `ip`, port 80 → 8080, `extra` merged into its spec) and its slice
/// of `eps` (address, node).
pub fn svc(name: &str, ip: &str, eps: &[(&str, &str)], extra: serde_json::Value) -> Vec<Object> {
    svc_with_status(name, ip, eps, extra, json!({}))
}

/// [`svc`] with a status (`{"loadBalancer": {"ingress": [...]}}`).
pub fn svc_with_status(
    name: &str,
    ip: &str,
    eps: &[(&str, &str)],
    extra: serde_json::Value,
    status: serde_json::Value,
) -> Vec<Object> {
    let mut spec = json!({"clusterIP": ip, "clusterIPs": [ip],
        "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]});
    if let (Some(s), serde_json::Value::Object(e)) = (spec.as_object_mut(), extra) {
        s.extend(e);
    }
    let endpoints = eps
        .iter()
        .map(|(ip, node)| json!({"addresses": [ip], "nodeName": node, "conditions": {"ready": true}}))
        .collect();
    vec![
        service("default", name, spec, status),
        slice("default", name, "v4", "IPv4", json!([{"name": "http", "protocol": "TCP", "port": 8080}]), endpoints),
    ]
}

pub struct World {
    planner: Planner,
    state: ClusterState,
    pub plan: Plan,
}

impl World {
    /// An IPv4-only cluster (pods in 198.18.16.0/20) holding `objects`.
    pub fn new(objects: Vec<Object>) -> Self {
        let policy = ProxyPolicy {
            families: vec![kproxy_state::IpFamily::V4],
            detect_local: DetectLocal::ClusterCidr(vec!["198.18.16.0/20".parse().unwrap()]),
            ..ProxyPolicy::default()
        };
        Self::with_policy(policy, objects)
    }

    /// A cluster planned with `policy` on node A (198.18.0.2), holding `objects`.
    pub fn with_policy(policy: ProxyPolicy, objects: Vec<Object>) -> Self {
        let node = NodeContext {
            name: NODE_A.into(),
            node_ip_override: Vec::new(),
            local_addresses: vec!["198.18.0.2".parse().unwrap()],
        };
        let planner = Planner::new(policy, node);
        let mut state = ClusterState::new();
        for o in node_objects().into_iter().chain(objects) {
            state.apply(Change::Applied(o));
        }
        let _ = state.take_dirty();
        let plan = planner.build(&state);
        Self { planner, state, plan }
    }

    pub fn full(&self) -> PlanDelta {
        PlanDelta::between(&Plan::default(), &self.plan)
    }

    pub fn apply(&mut self, objects: Vec<Object>) -> PlanDelta {
        for o in objects {
            self.state.apply(Change::Applied(o));
        }
        let dirty = self.state.take_dirty();
        self.planner.update(&mut self.plan, &self.state, &dirty)
    }
}

pub fn cip(ip: &str) -> ServiceKey {
    ServiceKey::Addr { addr: ip.parse().unwrap(), protocol: Protocol::Tcp, port: 80 }
}

pub fn dest(ip: &str) -> DestKey {
    DestKey { addr: ip.parse().unwrap(), port: 8080 }
}

pub fn two_services() -> Vec<Object> {
    let mut o = svc("web", "198.18.128.10", &[("198.18.16.10", NODE_A), ("198.18.17.10", NODE_B)], json!({}));
    o.extend(svc("db", "198.18.128.11", &[("198.18.16.11", NODE_A)], json!({})));
    o
}

//! Building cluster objects for cases, from the testbed's addresses.

use std::net::IpAddr;
use std::sync::Arc;

use kproxy_state::{Object, ServiceObject};
use kproxy_testbed::topology::{NODE_IP_V4, NODE_IP_V6, NODE_POD_CIDR_V4, NODE_POD_CIDR_V6, NODE2_IP_V4, NODE2_IP_V6};
use kproxy_testbed::topology::{NODE2_POD_CIDR_V4, NODE2_POD_CIDR_V6};
use kproxy_testbed::{Pod, Testbed};
use serde_json::{Value, json};

/// The proxy's node.
pub const NODE_A: &str = "node-a";
/// The other node.
pub const NODE_B: &str = "node-b";

/// What a case's builders can look at: the testbed and its pods.
#[derive(Debug)]
pub struct Env<'a> {
    /// The testbed.
    pub testbed: &'a Testbed,
}

impl Env<'_> {
    /// The pod called `name`; panics when the case did not declare it (a broken case).
    pub fn pod(&self, name: &str) -> Arc<Pod> {
        match self.testbed.pod(name) {
            Some(p) => p,
            None => panic!("case uses undeclared pod {name}"),
        }
    }

    /// IPv4 address of a pod, as a string.
    pub fn v4(&self, name: &str) -> String {
        self.pod(name).ipv4().to_string()
    }

    /// IPv6 address of a pod, as a string.
    pub fn v6(&self, name: &str) -> String {
        self.pod(name).ipv6().to_string()
    }

    /// Node name of a pod.
    pub fn node_of(&self, name: &str) -> &'static str {
        match self.pod(name).location() {
            kproxy_testbed::Where::Node => NODE_A,
            kproxy_testbed::Where::Node2 => NODE_B,
        }
    }

    /// A ready endpoint entry for a pod (IPv4 or IPv6).
    pub fn ep(&self, name: &str, v6: bool) -> Value {
        let ip = if v6 { self.v6(name) } else { self.v4(name) };
        endpoint(&ip, self.node_of(name), json!({"ready": true}))
    }
}

/// An endpoint entry with explicit conditions.
pub fn endpoint(ip: &str, node: &str, conditions: Value) -> Value {
    json!({"addresses": [ip], "nodeName": node, "conditions": conditions})
}

/// A Service object (`spec` and `status` as in the API).
pub fn service(ns: &str, name: &str, spec: Value, status: Value) -> Object {
    let value = json!({"metadata": {"namespace": ns, "name": name}, "spec": spec, "status": status});
    match serde_json::from_value::<k8s_openapi::api::core::v1::Service>(value) {
        Ok(svc) => Object::Service(Box::new(ServiceObject::from(svc))),
        Err(e) => panic!("case builds an invalid Service {ns}/{name}: {e}"),
    }
}

/// An EndpointSlice object of `svc`.
pub fn slice(ns: &str, svc: &str, suffix: &str, family: &str, ports: Value, endpoints: Vec<Value>) -> Object {
    let value = json!({
        "metadata": {"namespace": ns, "name": format!("{svc}-{suffix}"), "labels": {"kubernetes.io/service-name": svc}},
        "addressType": family, "ports": ports, "endpoints": endpoints,
    });
    match serde_json::from_value(value) {
        Ok(s) => Object::EndpointSlice(Box::new(s)),
        Err(e) => panic!("case builds an invalid EndpointSlice {ns}/{svc}-{suffix}: {e}"),
    }
}

fn node(name: &str, zone: &str, ips: [IpAddr; 2], cidrs: [String; 2]) -> Object {
    node_with(name, zone, &ips, cidrs)
}

fn node_with(name: &str, zone: &str, ips: &[IpAddr], cidrs: [String; 2]) -> Object {
    let addresses: Vec<Value> = ips.iter().map(|ip| json!({"type": "InternalIP", "address": ip.to_string()})).collect();
    let value = json!({
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
        "spec": {"podCIDRs": cidrs},
        "status": {"addresses": addresses},
    });
    match serde_json::from_value(value) {
        Ok(n) => Object::Node(Box::new(n)),
        Err(e) => panic!("invalid Node {name}: {e}"),
    }
}

/// The proxy's Node with other InternalIPs (none of a family: its node IP is unknown), e.g. to
/// show that SNAT to the node IP follows the Node and falls back per family.
pub fn node_a_with_ips(ips: &[IpAddr]) -> Object {
    node_with(NODE_A, "zone-a", ips, [NODE_POD_CIDR_V4.to_string(), NODE_POD_CIDR_V6.to_string()])
}

/// The two Nodes of the testbed.
pub fn node_objects() -> Vec<Object> {
    vec![
        node(
            NODE_A,
            "zone-a",
            [NODE_IP_V4.into(), NODE_IP_V6.into()],
            [NODE_POD_CIDR_V4.to_string(), NODE_POD_CIDR_V6.to_string()],
        ),
        node(
            NODE_B,
            "zone-b",
            [NODE2_IP_V4.into(), NODE2_IP_V6.into()],
            [NODE2_POD_CIDR_V4.to_string(), NODE2_POD_CIDR_V6.to_string()],
        ),
    ]
}

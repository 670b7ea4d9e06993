//! The cluster the daemon benchmark serves: `n` Services with one TCP port and an EndpointSlice
//! of 5 endpoints each, as a real API server would return them — labels, annotations
//! (`kubectl.kubernetes.io/last-applied-configuration`, `last-change-trigger-time`), owner
//! references, `managedFields`, pod `targetRef`s, zones — so kproxy parses as much as it would
//! in a cluster.
//!
//! Mix (as the dataplane benchmark's): 10% NodePort, 2% LoadBalancer (half of them
//! `externalTrafficPolicy: Local` with source ranges and a health-check node port), 1% ClientIP
//! affinity, and 10% dual-stack (`PreferDualStack`, with an IPv6 slice), so both of kproxy's
//! tables carry Services. Service 0 is `bench/web`: its one endpoint is a real pod.
//!
//! Addresses stay in the test ranges: ClusterIPs in 198.19.0.0/16, then 198.18.128.0/17 and
//! 198.18.64.0/18 (unique up to 114,684 Services) and fd00:96::/96; endpoints in 198.18.32.0/20
//! (shared by many Services past 4,096 endpoints) and fd00:10:20::/64; addresses brought in by
//! changes in 198.18.48.0/20; load balancer IPs in 203.0.113.0/24.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::{Value, json};

/// Endpoints per Service.
pub const ENDPOINTS: usize = 5;
/// The port every endpoint listens on.
pub const TARGET_PORT: u16 = 8080;
/// The namespace and name of the Service backed by a real pod.
pub const WEB: (&str, &str) = ("bench", "web");

/// ClusterIP ranges, in order: (first address, size). The first stops before 198.19.255.255,
/// the broadcast address of the real API server's 198.18.0.0/15, which it refuses to allocate
/// (its dry-run validation found Service 65534 there).
const CLUSTER_IP_RANGES: [([u8; 4], u32); 3] =
    [([198, 19, 0, 0], (1 << 16) - 1), ([198, 18, 128, 0], 1 << 15), ([198, 18, 64, 0], 1 << 14)];

/// The largest cluster with unique IPv4 ClusterIPs.
pub const MAX_SERVICES: usize = (1 << 16) - 1 + (1 << 15) + (1 << 14) - 3;

/// What Service `i` is like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub node_port: bool,
    pub load_balancer: bool,
    pub etp_local: bool,
    pub affinity: bool,
    pub dual_stack: bool,
}

impl Shape {
    pub fn of(i: usize) -> Shape {
        let load_balancer = i > 0 && i.is_multiple_of(50);
        Shape {
            node_port: i > 0 && i.is_multiple_of(10),
            load_balancer,
            etp_local: load_balancer && i.is_multiple_of(100),
            affinity: i % 100 == 7,
            dual_stack: i % 10 == 3,
        }
    }
}

/// The iptables-mode chain of Service `i`'s port (`KUBE-SVC-…`, upstream's name).
pub fn svc_chain(i: usize) -> String {
    let (namespace, service) = name(i);
    kproxy_iptables::naming::svc_chain(&kproxy_plan::ServicePortName {
        namespace: namespace.into(),
        service: service.into(),
        port: "http".into(),
        protocol: kproxy_state::Protocol::Tcp,
    })
}

/// The `i`-th address of the concatenated ClusterIP ranges (skipping each range's first).
pub fn cluster_ip_v4(i: usize) -> Ipv4Addr {
    let mut rest = i as u32 + 1;
    for (base, size) in CLUSTER_IP_RANGES {
        if rest < size {
            return Ipv4Addr::from(u32::from(Ipv4Addr::from(base)) + rest);
        }
        rest -= size - 1;
    }
    Ipv4Addr::new(198, 19, 255, 255)
}

pub fn cluster_ip_v6(i: usize) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0)) + i as u128 + 1)
}

/// The Service port of Service `i` (load balancers share 250 ingress addresses across ports).
pub fn service_port(i: usize) -> u16 {
    if Shape::of(i).load_balancer { 80 + (i / 50 / 250) as u16 } else { 80 }
}

/// Endpoint `j` of Service `i`, IPv4 (a pool of 4,096 pod addresses).
pub fn endpoint_v4(i: usize, j: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 32, 0)) + ((i * ENDPOINTS + j) % 4096) as u32)
}

pub fn endpoint_v6(i: usize, j: usize) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(Ipv6Addr::new(0xfd00, 0x10, 0x20, 0, 0, 0, 0, 0)) + (i * ENDPOINTS + j) as u128 + 1)
}

/// The address change number `k` brings in (never one of the initial endpoints).
pub fn fresh_endpoint(k: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 48, 0)) + (k % 4096) as u32)
}

/// The namespace and name of Service `i`.
pub fn name(i: usize) -> (String, String) {
    if i == 0 { (WEB.0.to_owned(), WEB.1.to_owned()) } else { (format!("ns-{}", i / 1000), format!("svc-{i}")) }
}

/// A UID-looking string, deterministic.
fn uid(kind: u8, i: usize) -> String {
    format!("{kind:02x}{:06x}-1f2e-4d3c-8b7a-{:012x}", i & 0xff_ffff, i.wrapping_mul(2_654_435_761))
}

const CREATED: &str = "2026-11-02T09:14:07Z";

/// Service `i` as the API server returns it.
pub fn service(i: usize) -> Value {
    let (namespace, name) = name(i);
    let shape = Shape::of(i);
    let port = service_port(i);
    let v4 = cluster_ip_v4(i).to_string();
    let (families, cluster_ips, policy) = if shape.dual_stack {
        (json!(["IPv4", "IPv6"]), json!([v4, cluster_ip_v6(i).to_string()]), "PreferDualStack")
    } else {
        (json!(["IPv4"]), json!([v4]), "SingleStack")
    };
    let kind = match (shape.load_balancer, shape.node_port) {
        (true, _) => "LoadBalancer",
        (false, true) => "NodePort",
        _ => "ClusterIP",
    };
    let mut port_spec = json!({"name": "http", "port": port, "protocol": "TCP", "targetPort": TARGET_PORT});
    if shape.node_port || shape.load_balancer {
        port_spec["nodePort"] = json!(20000 + i / 10);
    }
    let mut spec = json!({
        "type": kind,
        "clusterIP": v4,
        "clusterIPs": cluster_ips,
        "ipFamilies": families,
        "ipFamilyPolicy": policy,
        "internalTrafficPolicy": "Cluster",
        "ports": [port_spec],
        "selector": {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": format!("{name}-prod")},
        "sessionAffinity": if shape.affinity { "ClientIP" } else { "None" },
    });
    if shape.affinity {
        spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 10800}});
    }
    if shape.node_port || shape.load_balancer {
        spec["externalTrafficPolicy"] = json!(if shape.etp_local { "Local" } else { "Cluster" });
    }
    if shape.etp_local {
        spec["healthCheckNodePort"] = json!(12000 + i / 100);
        spec["loadBalancerSourceRanges"] = json!(["192.0.2.0/24"]);
    }
    let status = if shape.load_balancer {
        json!({"loadBalancer": {"ingress": [{"ip": format!("203.0.113.{}", i / 50 % 250 + 3), "ipMode": "VIP"}]}})
    } else {
        json!({"loadBalancer": {}})
    };
    let labels = json!({
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/instance": format!("{name}-prod"),
        "app.kubernetes.io/part-of": namespace,
        "app.kubernetes.io/managed-by": "Helm",
        "helm.sh/chart": format!("{name}-1.4.2"),
    });
    let applied = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"type": kind, "ports": spec["ports"], "selector": spec["selector"]}});
    json!({
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid(1, i),
            "creationTimestamp": CREATED,
            "labels": labels,
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": applied.to_string(),
                "meta.helm.sh/release-name": format!("{name}-prod"),
                "meta.helm.sh/release-namespace": namespace,
            },
            "managedFields": [
                {"manager": "helm", "operation": "Update", "apiVersion": "v1", "time": CREATED,
                 "fieldsType": "FieldsV1", "fieldsV1": {
                    "f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {},
                        "f:meta.helm.sh/release-name": {}, "f:meta.helm.sh/release-namespace": {}},
                        "f:labels": {".": {}, "f:app.kubernetes.io/instance": {}, "f:app.kubernetes.io/managed-by": {},
                        "f:app.kubernetes.io/name": {}, "f:app.kubernetes.io/part-of": {}, "f:helm.sh/chart": {}}},
                    "f:spec": {"f:internalTrafficPolicy": {}, "f:ports": {".": {},
                        "k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}}},
                        "f:selector": {}, "f:sessionAffinity": {}, "f:type": {}}}},
            ],
        },
        "spec": spec,
        "status": status,
    })
}

/// One endpoint of a slice.
fn endpoint(address: IpAddr, node: &str, pod: &str, namespace: &str, i: usize, j: usize) -> Value {
    json!({
        "addresses": [address.to_string()],
        "conditions": {"ready": true, "serving": true, "terminating": false},
        "nodeName": node,
        "zone": format!("zone-{}", (i + j) % 3),
        "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod, "uid": uid(3, i * ENDPOINTS + j)},
    })
}

/// The endpoints of a slice: `(address, node)` pairs.
pub type Endpoints = Vec<(IpAddr, String)>;

/// The initial endpoints of Service `i` in one family (`web_pod`: the real pod backing service 0).
pub fn initial_endpoints(i: usize, v6: bool, web_pod: (IpAddr, &str)) -> Endpoints {
    if i == 0 {
        return vec![(web_pod.0, web_pod.1.to_owned())];
    }
    (0..ENDPOINTS)
        .map(|j| {
            let ip: IpAddr = if v6 { endpoint_v6(i, j).into() } else { endpoint_v4(i, j).into() };
            (ip, format!("node-{}", (i * ENDPOINTS + j) % 100 + 1))
        })
        .collect()
}

/// The name of Service `i`'s EndpointSlice of one family.
pub fn slice_name(i: usize, v6: bool) -> String {
    format!("{}-{}", name(i).1, if v6 { "x7k2q" } else { "b4m9z" })
}

/// The EndpointSlice of Service `i` in one family, as the endpointslice controller writes it.
pub fn slice(i: usize, v6: bool, endpoints: &Endpoints, trigger: &str) -> Value {
    let (namespace, service) = name(i);
    let family = if v6 { "IPv6" } else { "IPv4" };
    let slice_name = slice_name(i, v6);
    let eps: Vec<Value> = endpoints
        .iter()
        .enumerate()
        .map(|(j, (ip, node))| endpoint(*ip, node, &format!("{service}-7d9f8c6b5-{j:05}"), &namespace, i, j))
        .collect();
    json!({
        "metadata": {
            "name": slice_name,
            "namespace": namespace,
            "generateName": format!("{service}-"),
            "uid": uid(if v6 { 4 } else { 2 }, i),
            "creationTimestamp": CREATED,
            "generation": 1,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                "app.kubernetes.io/name": service,
                "app.kubernetes.io/instance": format!("{service}-prod"),
                "app.kubernetes.io/managed-by": "Helm",
            },
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": trigger},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service, "uid": uid(1, i),
                                 "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "discovery.k8s.io/v1",
                 "time": trigger, "fieldsType": "FieldsV1", "fieldsV1": {
                    "f:addressType": {}, "f:endpoints": {},
                    "f:metadata": {"f:annotations": {".": {}, "f:endpoints.kubernetes.io/last-change-trigger-time": {}},
                        "f:generateName": {}, "f:labels": {".": {}, "f:app.kubernetes.io/instance": {},
                        "f:app.kubernetes.io/managed-by": {}, "f:app.kubernetes.io/name": {},
                        "f:endpointslice.kubernetes.io/managed-by": {}, "f:kubernetes.io/service-name": {}},
                        "f:ownerReferences": {".": {}, "k:{\"uid\":\"...\"}": {}}},
                    "f:ports": {}}},
            ],
        },
        "addressType": family,
        "endpoints": eps,
        "ports": [{"name": "http", "port": TARGET_PORT, "protocol": "TCP"}],
    })
}

/// The node kproxy runs as.
pub fn node(name: &str, ip: Ipv4Addr, ip6: Ipv6Addr, pod_cidrs: [&str; 2]) -> Value {
    json!({
        "metadata": {"name": name, "uid": uid(5, 0), "creationTimestamp": CREATED,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "topology.kubernetes.io/zone": "zone-0", "node.kubernetes.io/instance-type": "bench"}},
        "spec": {"podCIDR": pod_cidrs[0], "podCIDRs": pod_cidrs},
        "status": {"addresses": [{"type": "InternalIP", "address": ip.to_string()},
                                 {"type": "InternalIP", "address": ip6.to_string()},
                                 {"type": "Hostname", "address": name}]},
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn cluster_ips_are_unique_and_in_the_test_ranges() {
        let mut seen = HashSet::new();
        for i in 0..MAX_SERVICES {
            let ip = cluster_ip_v4(i);
            let [a, b, ..] = ip.octets();
            assert!(a == 198 && (b == 18 || b == 19), "{ip}");
            assert!(seen.insert(ip), "service {i}: {ip} twice");
        }
        assert_eq!(cluster_ip_v4(0), Ipv4Addr::new(198, 19, 0, 1));
        assert_eq!(cluster_ip_v4(65533), Ipv4Addr::new(198, 19, 255, 254));
        assert_eq!(cluster_ip_v4(65534), Ipv4Addr::new(198, 18, 128, 1));
        assert!((0..MAX_SERVICES).all(|i| cluster_ip_v4(i) != Ipv4Addr::new(198, 19, 255, 255)));
    }

    #[test]
    fn change_addresses_are_never_initial_endpoints() {
        let initial: HashSet<Ipv4Addr> =
            (0..5000).flat_map(|i| (0..ENDPOINTS).map(move |j| endpoint_v4(i, j))).collect();
        assert!((0..4096).all(|k| !initial.contains(&fresh_endpoint(k))));
    }
}

//! The cluster the daemon benchmark serves: `n` Services with one TCP port and an EndpointSlice
//! of 5 endpoints each (`--endpoints`), as a real API server would return them — labels, annotations
//! (`kubectl.kubernetes.io/last-applied-configuration`, `last-change-trigger-time`), owner
//! references, `managedFields`, pod `targetRef`s, zones — so kproxy parses as much as it would
//! in a cluster.
//!
//! Mix (as the dataplane benchmark's): 10% NodePort, 2% LoadBalancer (half of them
//! `externalTrafficPolicy: Local` with source ranges and a health-check node port), 1% ClientIP
//! affinity, and 10% dual-stack (`PreferDualStack`, with an IPv6 slice), so both of kproxy's
//! tables carry Services. Service 0 is `bench/web`: its one endpoint is a real pod.
//!
//! With `--big-service M`, one more Service (number `n`, `bench/big`) has `M` endpoints, in
//! slices of 100 as the EndpointSlice controller writes them: a Deployment of thousands of pods
//! behind one ClusterIP.
//!
//! Addresses stay in the test ranges: ClusterIPs in 198.19.0.0/16, then 198.18.128.0/17 and
//! 198.18.64.0/18 (unique up to 114,684 Services) and fd00:96::/96; endpoints in 198.18.32.0/20
//! (shared by many Services past 4,096 endpoints) and fd00:10:20::/64; addresses brought in by
//! changes in 198.18.48.0/20; load balancer IPs in 203.0.113.0/24. The big Service's endpoints,
//! every one distinct (those its changes bring in too), take 198.18.128.0/17, which ClusterIPs
//! use only past 65,534 Services.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::{Value, json};

/// Endpoints per Service by default (`--endpoints`).
pub const DEFAULT_ENDPOINTS: usize = 5;
/// The stride of the endpoints' pod UIDs, per Service (UIDs only need to look real).
const UID_STRIDE: usize = 5;
/// Endpoints per slice of the big Service (the EndpointSlice controller's default).
pub const BIG_SLICE: usize = 100;
/// The port every endpoint listens on.
pub const TARGET_PORT: u16 = 8080;
/// What a cluster of `n` Services holds besides them: the endpoints of each (`--endpoints`), and
/// the big Service's (`--big-service`, 0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Layout {
    /// Endpoints per Service (Service 0 has one, the real pod).
    pub endpoints: usize,
    /// Endpoints of the big Service (number `n`); 0: there is none.
    pub big: usize,
}

impl Default for Layout {
    fn default() -> Self {
        Layout { endpoints: DEFAULT_ENDPOINTS, big: 0 }
    }
}

impl Layout {
    /// Whether the cluster has the default shape (the one every earlier figure was taken at).
    pub fn is_default(&self) -> bool {
        *self == Layout::default()
    }

    /// Endpoints in all slices (both families) of a cluster of `n` Services.
    pub fn endpoint_count(&self, n: usize) -> usize {
        let dual = (1..n).filter(|i| Shape::of(*i).dual_stack).count();
        1 + (n - 1) * self.endpoints + dual * self.endpoints + self.big
    }

    /// Services in all, the big one included.
    pub fn services(&self, n: usize) -> usize {
        n + usize::from(self.big > 0)
    }
}

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
    svc_chain_of(&namespace, &service)
}

/// The iptables-mode chain of Service `namespace/service`'s port `http`.
pub fn svc_chain_of(namespace: &str, service: &str) -> String {
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

/// Endpoint `j` of Service `i` of a cluster of `per` endpoints per Service, IPv4 (a pool of
/// 4,096 pod addresses).
pub fn endpoint_v4(i: usize, j: usize, per: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 32, 0)) + ((i * per + j) % 4096) as u32)
}

pub fn endpoint_v6(i: usize, j: usize, per: usize) -> Ipv6Addr {
    Ipv6Addr::from(u128::from(Ipv6Addr::new(0xfd00, 0x10, 0x20, 0, 0, 0, 0, 0)) + (i * per + j) as u128 + 1)
}

/// The `g`-th address of the big Service's pool (198.18.128.0/17): its initial endpoints are
/// `0..M`, every change brings in the next unused one.
pub fn big_endpoint(g: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 128, 1)) + (g % BIG_POOL) as u32)
}

/// Addresses in the big Service's pool.
pub const BIG_POOL: usize = (1 << 15) - 2;

/// The largest cluster that can have a big Service: its ClusterIP and every other in
/// 198.19.0.0/16, clear of the big Service's pool.
pub const MAX_SERVICES_WITH_BIG: usize = (1 << 16) - 2;

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
        "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod, "uid": uid(3, i * UID_STRIDE + j)},
    })
}

/// The endpoints of a slice: `(address, node)` pairs.
pub type Endpoints = Vec<(IpAddr, String)>;

/// How many endpoints Service `i` starts with when the others have `per`: the web Service
/// (`i == 0`) has one, its web pod.
pub fn initial_endpoint_count(i: usize, per: usize) -> usize {
    if i == 0 { 1 } else { per }
}

/// The initial endpoints of Service `i` in one family, `per` of them (`web_pod`: the real pod
/// backing service 0, its only one).
pub fn initial_endpoints(i: usize, v6: bool, web_pod: (IpAddr, &str), per: usize) -> Endpoints {
    if i == 0 {
        return vec![(web_pod.0, web_pod.1.to_owned())];
    }
    (0..per)
        .map(|j| {
            let ip: IpAddr = if v6 { endpoint_v6(i, j, per).into() } else { endpoint_v4(i, j, per).into() };
            (ip, format!("node-{}", (i * per + j) % 100 + 1))
        })
        .collect()
}

/// The big Service (`bench/big`, number `i`, after the others): ClusterIP only, one TCP port.
pub fn big_service(i: usize) -> Value {
    let mut svc = service(i);
    let name = BIG.1;
    svc["metadata"]["namespace"] = json!(BIG.0);
    svc["metadata"]["name"] = json!(name);
    let spec = &mut svc["spec"];
    spec["type"] = json!("ClusterIP");
    spec["ipFamilies"] = json!(["IPv4"]);
    spec["ipFamilyPolicy"] = json!("SingleStack");
    spec["clusterIPs"] = json!([cluster_ip_v4(i).to_string()]);
    spec["sessionAffinity"] = json!("None");
    spec["ports"] = json!([{"name": "http", "port": 80, "protocol": "TCP", "targetPort": TARGET_PORT}]);
    spec["selector"] = json!({"app.kubernetes.io/name": name});
    for field in ["externalTrafficPolicy", "healthCheckNodePort", "loadBalancerSourceRanges", "sessionAffinityConfig"] {
        if let Some(o) = spec.as_object_mut() {
            o.remove(field);
        }
    }
    svc["status"] = json!({"loadBalancer": {}});
    svc
}

/// The namespace and name of the big Service.
pub const BIG: (&str, &str) = ("bench", "big");

/// The initial endpoints of the big Service: `m` distinct addresses on 100 nodes.
pub fn big_initial_endpoints(m: usize) -> Endpoints {
    (0..m).map(|j| (big_endpoint(j).into(), format!("node-{}", j % 100 + 1))).collect()
}

/// The name of the big Service's slice `s` (endpoints `100·s .. 100·(s+1)`).
pub fn big_slice_name(s: usize) -> String {
    format!("{}-{s:04}", BIG.1)
}

/// The big Service's slice `s` (number `i`), holding `endpoints`.
pub fn big_slice(i: usize, s: usize, endpoints: &[(IpAddr, String)], trigger: &str) -> Value {
    let mut slice = slice(i, false, &endpoints.to_vec(), trigger);
    slice["metadata"]["namespace"] = json!(BIG.0);
    slice["metadata"]["name"] = json!(big_slice_name(s));
    slice["metadata"]["generateName"] = json!(format!("{}-", BIG.1));
    slice["metadata"]["uid"] = json!(uid(6, s));
    let labels = &mut slice["metadata"]["labels"];
    labels["kubernetes.io/service-name"] = json!(BIG.1);
    labels["app.kubernetes.io/name"] = json!(BIG.1);
    labels["app.kubernetes.io/instance"] = json!(format!("{}-prod", BIG.1));
    slice["metadata"]["ownerReferences"][0]["name"] = json!(BIG.1);
    for ep in slice["endpoints"].as_array_mut().into_iter().flatten() {
        ep["targetRef"]["namespace"] = json!(BIG.0);
    }
    slice
}

/// The big Service's slices, numbered, for `endpoints` (the first 100, the next 100, …).
pub fn big_slices(i: usize, endpoints: &[(IpAddr, String)], trigger: &str) -> Vec<(String, Value)> {
    endpoints
        .chunks(BIG_SLICE)
        .enumerate()
        .map(|(s, chunk)| (big_slice_name(s), big_slice(i, s, chunk, trigger)))
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
        let initial: HashSet<Ipv4Addr> = (0..5000).flat_map(|i| (0..50).map(move |j| endpoint_v4(i, j, 50))).collect();
        assert!((0..4096).all(|k| !initial.contains(&fresh_endpoint(k))));
    }

    #[test]
    fn the_big_services_addresses_are_distinct_and_clear_of_every_cluster_ip_it_can_meet() {
        let pool: HashSet<Ipv4Addr> = (0..BIG_POOL).map(big_endpoint).collect();
        assert_eq!(pool.len(), BIG_POOL);
        assert!((0..MAX_SERVICES_WITH_BIG).all(|i| !pool.contains(&cluster_ip_v4(i))));
        assert!(pool.iter().all(|ip| ip.octets()[..2] == [198, 18] && ip.octets()[2] >= 128));
        let big = big_service(7);
        assert_eq!(big["metadata"]["name"], "big");
        assert_eq!(big["spec"]["type"], "ClusterIP");
        assert_eq!(big["spec"]["sessionAffinity"], "None");
        let eps = big_initial_endpoints(250);
        let slices = big_slices(7, &eps, "");
        assert_eq!(slices.len(), 3);
        assert_eq!(slices[2].1["endpoints"].as_array().map(Vec::len), Some(50));
        assert_eq!(slices[0].1["metadata"]["labels"]["kubernetes.io/service-name"], "big");
    }
}

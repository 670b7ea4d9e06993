//! Objects shaped like a real cluster's, for tests and benchmarks that care about size and
//! parsing cost: a Service as `kubectl apply` leaves it (last-applied annotation, managedFields
//! of the client and of the API server's allocators) and an EndpointSlice as the EndpointSlice
//! controller writes it (owner reference, managed-by label, trigger-time annotation, managedFields,
//! zone and node per endpoint).
//!
//! The server adds `kind`, `apiVersion` and `resourceVersion` when the object is applied.

use std::net::IpAddr;

use serde_json::{Value, json};

/// A fixed timestamp: realistic shape, reproducible bytes.
const CREATED: &str = "2026-11-30T09:14:07Z";

/// A ClusterIP Service `namespace/name` with one TCP port `port` → target port `target_port`,
/// selecting `app: <name>`, as `kubectl apply` of a plain manifest leaves it in the API.
pub fn service(namespace: &str, name: &str, cluster_ip: IpAddr, port: u16, target_port: u16) -> Value {
    let family = if cluster_ip.is_ipv4() { "IPv4" } else { "IPv6" };
    let applied = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"annotations": {}, "labels": {"app": name, "tier": "backend"}, "name": name, "namespace": namespace},
        "spec": {"ports": [{"name": "http", "port": port, "protocol": "TCP", "targetPort": target_port}],
                 "selector": {"app": name}}});
    json!({
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid(&format!("svc/{namespace}/{name}")),
            "creationTimestamp": CREATED,
            "labels": {"app": name, "tier": "backend"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": format!("{applied}\n")},
            "managedFields": [
                {"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "v1", "time": CREATED,
                 "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}},
                                             "f:labels": {".": {}, "f:app": {}, "f:tier": {}}},
                              "f:spec": {"f:internalTrafficPolicy": {}, "f:ports": {".": {}, "k:{\"port\":80,\"protocol\":\"TCP\"}":
                                            {".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}, "f:targetPort": {}}},
                                         "f:selector": {}, "f:sessionAffinity": {}, "f:type": {}}}}
            ]
        },
        "spec": {
            "clusterIP": cluster_ip.to_string(),
            "clusterIPs": [cluster_ip.to_string()],
            "internalTrafficPolicy": "Cluster",
            "ipFamilies": [family],
            "ipFamilyPolicy": "SingleStack",
            "ports": [{"name": "http", "port": port, "protocol": "TCP", "targetPort": target_port}],
            "selector": {"app": name},
            "sessionAffinity": "None",
            "type": "ClusterIP"
        },
        "status": {"loadBalancer": {}}
    })
}

/// One endpoint of [`endpoint_slice`]: its address and the node it runs on.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint<'a> {
    /// The pod IP.
    pub ip: IpAddr,
    /// The pod's node.
    pub node: &'a str,
}

/// The EndpointSlice `name` of Service `namespace/service`: every endpoint ready, port `http`
/// `port`/TCP, as the EndpointSlice controller writes it.
pub fn endpoint_slice(namespace: &str, service: &str, name: &str, endpoints: &[Endpoint<'_>], port: u16) -> Value {
    let family = match endpoints.first() {
        Some(ep) if ep.ip.is_ipv6() => "IPv6",
        _ => "IPv4",
    };
    let endpoints: Vec<Value> = endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| {
            json!({"addresses": [ep.ip.to_string()],
                   "conditions": {"ready": true, "serving": true, "terminating": false},
                   "nodeName": ep.node,
                   "targetRef": {"kind": "Pod", "namespace": namespace, "name": format!("{service}-7d9f8b6c5-{i:05}"),
                                 "uid": uid(&format!("pod/{namespace}/{service}/{i}"))},
                   "zone": "zone-a"})
        })
        .collect();
    json!({
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid(&format!("eps/{namespace}/{name}")),
            "generation": 1,
            "generateName": format!("{service}-"),
            "creationTimestamp": CREATED,
            "labels": {"app": service, "tier": "backend",
                       "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                       "kubernetes.io/service-name": service},
            "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": CREATED},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service,
                                 "uid": uid(&format!("svc/{namespace}/{service}")),
                                 "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "discovery.k8s.io/v1",
                 "time": CREATED, "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:addressType": {}, "f:endpoints": {},
                              "f:metadata": {"f:annotations": {".": {}, "f:endpoints.kubernetes.io/last-change-trigger-time": {}},
                                             "f:generateName": {},
                                             "f:labels": {".": {}, "f:app": {}, "f:endpointslice.kubernetes.io/managed-by": {},
                                                          "f:kubernetes.io/service-name": {}, "f:tier": {}},
                                             "f:ownerReferences": {".": {}, "k:{\"uid\":\"0\"}": {}}},
                              "f:ports": {}}}
            ]
        },
        "addressType": family,
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": port, "protocol": "TCP"}]
    })
}

/// A stable, UUID-shaped id derived from `seed`.
fn uid(seed: &str) -> String {
    // FNV-1a, twice with different offsets: enough spread for distinct-looking ids.
    let hash = |offset: u64| seed.bytes().fold(offset, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let (a, b) = (hash(0xcbf2_9ce4_8422_2325), hash(0x8422_2325_cbf2_9ce4));
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;

    use super::*;

    #[test]
    fn objects_are_valid_kubernetes_objects() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let svc: Service = serde_json::from_value(service("prod", "web", ip("198.18.0.10"), 80, 8080)).unwrap();
        assert_eq!(svc.spec.unwrap().cluster_ip.as_deref(), Some("198.18.0.10"));
        assert_eq!(svc.metadata.managed_fields.map(|m| m.len()), Some(1));
        let eps =
            [Endpoint { ip: ip("198.19.0.1"), node: "node-a" }, Endpoint { ip: ip("198.19.0.2"), node: "node-b" }];
        let slice: EndpointSlice =
            serde_json::from_value(endpoint_slice("prod", "web", "web-abcde", &eps, 8080)).unwrap();
        assert_eq!(slice.endpoints.len(), 2);
        assert_eq!(slice.endpoints[1].node_name.as_deref(), Some("node-b"));
        assert_eq!(slice.metadata.labels.unwrap()["kubernetes.io/service-name"], "web");
        assert_ne!(uid("a"), uid("b"));
    }
}

//! The benchmark's cluster written through a real kube-apiserver: the same Services and
//! EndpointSlices the fake server holds (`objects.rs`), created as a user and the EndpointSlice
//! controller would (server-set fields dropped, status written through the status
//! subresource), many requests in flight at once.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kproxy_testbed::topology;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::super::api::NODE_NAME;
use super::super::objects::{self, Shape};

/// What creating the cluster took.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Created {
    pub services: usize,
    pub slices: usize,
    /// Wall time of the whole creation (namespaces, the node, Services, statuses, slices).
    pub seconds: f64,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// JSON bytes sent for the Services and slices (as the benchmark wrote them).
    pub bytes: usize,
    /// Set when this run did not write the cluster but started from one an earlier run wrote
    /// and saved (`--cluster-cache`): that directory. The figures above are that run's.
    #[serde(default)]
    pub reused_from: Option<String>,
    /// Set when the Services (but the first) and slices were not created through the API server
    /// but validated and defaulted by it (a dry-run create each) and put into etcd directly
    /// (`bulk.rs`, for sizes the API server cannot write in a run).
    #[serde(default)]
    pub stored_directly: bool,
}

/// Drops what the API server sets itself.
pub(crate) fn for_create(mut object: Value) -> Value {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in ["uid", "creationTimestamp", "managedFields", "generation", "resourceVersion"] {
            meta.remove(field);
        }
    }
    if let Some(o) = object.as_object_mut() {
        o.remove("status");
    }
    object
}

/// Creates the node, the namespaces and `n` Services with their slices of `per` endpoints;
/// `web_pod` backs Service 0.
pub async fn cluster(
    client: &kube::Client,
    n: usize,
    (web_pod, per): (IpAddr, usize),
    concurrency: usize,
) -> anyhow::Result<Created> {
    let started = Instant::now();
    node_and_namespaces(client, n, concurrency).await?;
    let trigger = kproxy_servers::rfc3339_nano(Some(std::time::SystemTime::now()));
    let results: Vec<(usize, usize)> = futures::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            let trigger = trigger.clone();
            async move { create_one(&client, i, (web_pod, per), &trigger).await }
        })
        .buffer_unordered(concurrency)
        .try_collect()
        .await?;
    Ok(Created {
        services: n,
        slices: results.iter().map(|(s, _)| s).sum(),
        seconds: started.elapsed().as_secs_f64(),
        concurrency,
        bytes: results.iter().map(|(_, b)| b).sum(),
        reused_from: None,
        stored_directly: false,
    })
}

/// The node (with its addresses) and the namespaces of `n` Services.
pub(super) async fn node_and_namespaces(client: &kube::Client, n: usize, concurrency: usize) -> anyhow::Result<()> {
    let pod_cidrs = [topology::NODE_POD_CIDR_V4.to_string(), topology::NODE_POD_CIDR_V6.to_string()];
    let node_json =
        objects::node(NODE_NAME, topology::NODE_IP_V4, topology::NODE_IP_V6, [&pod_cidrs[0], &pod_cidrs[1]]);
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(for_create(node_json.clone()))?;
    nodes.create(&PostParams::default(), &node).await.context("creating the node")?;
    nodes
        .patch_status(NODE_NAME, &PatchParams::default(), &Patch::Merge(json!({"status": node_json["status"]})))
        .await
        .context("writing the node's addresses")?;

    let mut namespaces: Vec<String> = (0..n).map(|i| objects::name(i).0).collect();
    namespaces.dedup();
    let ns_api: Api<Namespace> = Api::all(client.clone());
    futures::stream::iter(namespaces)
        .map(|name| {
            let ns_api = ns_api.clone();
            async move {
                let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
                ns_api.create(&PostParams::default(), &ns).await.with_context(|| format!("namespace {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Service `i`, its load balancer status, and its slices of `per` endpoints (`web_pod` backs
/// Service 0): (slices, bytes sent).
pub(super) async fn create_one(
    client: &kube::Client,
    i: usize,
    (web_pod, per): (IpAddr, usize),
    trigger: &str,
) -> anyhow::Result<(usize, usize)> {
    let (namespace, name) = objects::name(i);
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let service_json = objects::service(i);
    let mut bytes = service_json.to_string().len();
    let service: Service = serde_json::from_value(for_create(service_json.clone()))?;
    let (post, patch_params) = (PostParams::default(), PatchParams::default());
    create_once(&services, &post, &service, &name).await.with_context(|| format!("Service {name}"))?;
    if Shape::of(i).load_balancer {
        let status = Patch::Merge(json!({"status": service_json["status"]}));
        retry(|| services.patch_status(&name, &patch_params, &status))
            .await
            .with_context(|| format!("Service {name} status"))?;
    }
    let families = families(i);
    for v6 in &families {
        let eps = objects::initial_endpoints(i, *v6, (web_pod, NODE_NAME), per);
        let slice_json = objects::slice(i, *v6, &eps, trigger);
        bytes += slice_json.to_string().len();
        let slice: EndpointSlice = serde_json::from_value(for_create(slice_json))?;
        let slice_name = slice.metadata.name.clone().unwrap_or_default();
        create_once(&slices, &post, &slice, &slice_name).await.with_context(|| format!("EndpointSlice of {name}"))?;
    }
    Ok((families.len(), bytes))
}

/// The families of Service `i`'s slices (IPv6: true).
pub(super) fn families(i: usize) -> Vec<bool> {
    if Shape::of(i).dual_stack && i > 0 { vec![false, true] } else { vec![false] }
}

/// A create tried again as [`retry`] does. A create answered `5xx` or cut off may have been
/// carried out all the same (kube-apiserver's 60 s request timeout under load: seen at load 23
/// on 2 cores), so after one, a retry's "already exists" (`409`) or, for a Service, "IP already
/// allocated" (`422`: its own ClusterIP) means done when the object is there.
async fn create_once<K>(api: &Api<K>, post: &PostParams, object: &K, name: &str) -> kube::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let mut uncertain = false;
    let mut attempt = 0;
    loop {
        match api.create(post, object).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e))
                if uncertain && (e.code == 409 || (e.code == 422 && e.message.contains("already allocated"))) =>
            {
                return api.get(name).await.map(drop);
            }
            Err(kube::Error::Api(e)) if attempt < 20 && (e.code == 429 || e.code == 409 || e.code >= 500) => {
                uncertain |= e.code >= 500;
            }
            Err(kube::Error::HyperError(_) | kube::Error::Service(_)) if attempt < 20 => uncertain = true,
            Err(e) => return Err(e),
        }
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
    }
}

/// A request tried again on a conflict or a server that is briefly too busy (429, 5xx, a
/// connection reset): creating at full speed meets them; anything else is an error.
pub(crate) async fn retry<T, F, Fut>(mut request: F) -> kube::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    let mut attempt = 0;
    loop {
        match request().await {
            Err(kube::Error::Api(e)) if attempt < 20 && (e.code == 429 || e.code == 409 || e.code >= 500) => {}
            Err(kube::Error::HyperError(_) | kube::Error::Service(_)) if attempt < 20 => {}
            other => return other,
        }
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(50 * attempt)).await;
    }
}

/// Creates the big Service (number `i`) and its slices of `m` endpoints; (slices, bytes sent).
pub(super) async fn create_big(
    client: &kube::Client,
    i: usize,
    m: usize,
    trigger: &str,
) -> anyhow::Result<(usize, usize)> {
    let (namespace, name) = objects::BIG;
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), namespace);
    let service_json = objects::big_service(i);
    let mut bytes = service_json.to_string().len();
    let service: Service = serde_json::from_value(for_create(service_json))?;
    let post = PostParams::default();
    retry(|| services.create(&post, &service)).await.with_context(|| format!("Service {name}"))?;
    let all = objects::big_slices(i, &objects::big_initial_endpoints(m), trigger);
    let count = all.len();
    for (slice_name, slice_json) in all {
        bytes += slice_json.to_string().len();
        let slice: EndpointSlice = serde_json::from_value(for_create(slice_json))?;
        retry(|| slices.create(&post, &slice)).await.with_context(|| format!("EndpointSlice {slice_name}"))?;
    }
    Ok((count, bytes))
}

/// Replaces the endpoints of the big Service's (number `i`) slice `s` with `endpoints` (a merge
/// patch, as in [`set_endpoints`]).
pub async fn set_big_slice(
    client: &kube::Client,
    i: usize,
    s: usize,
    endpoints: &[(IpAddr, String)],
) -> anyhow::Result<()> {
    let trigger = kproxy_servers::rfc3339_nano(Some(std::time::SystemTime::now()));
    let slice = objects::big_slice(i, s, endpoints, &trigger);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), objects::BIG.0);
    let patch = json!({
        "metadata": {"annotations": slice["metadata"]["annotations"]},
        "endpoints": slice["endpoints"],
    });
    slices
        .patch(&objects::big_slice_name(s), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("changing the big Service's slice {s}"))?;
    Ok(())
}

/// Replaces Service `i`'s IPv4 slice's endpoints with `endpoints` (a merge patch: the list is
/// replaced whole, as the EndpointSlice controller's update does).
pub async fn set_endpoints(client: &kube::Client, i: usize, endpoints: &objects::Endpoints) -> anyhow::Result<()> {
    let (namespace, _) = objects::name(i);
    let trigger = kproxy_servers::rfc3339_nano(Some(std::time::SystemTime::now()));
    let slice = objects::slice(i, false, endpoints, &trigger);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let patch = json!({
        "metadata": {"annotations": slice["metadata"]["annotations"]},
        "endpoints": slice["endpoints"],
    });
    slices
        .patch(&objects::slice_name(i, false), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("changing the slice of Service {i}"))?;
    Ok(())
}

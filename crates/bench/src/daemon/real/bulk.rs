//! The benchmark's cluster at sizes the API server cannot write in a run: every object is
//! validated, defaulted and given its uid, timestamps and managed fields by the API server (a
//! dry-run create, which runs admission and validation but allocates nothing), and the result is
//! put into etcd directly, as the API server would have stored it; the IPAddress object of each
//! ClusterIP is copied from the one the API server made for Service 0, which is created for real,
//! as is every Service with node ports.
//!
//! Why: kube-apiserver v1.36.2's ClusterIP allocator lists every IPAddress twice per allocation
//! for its metrics (`Used()`, `Free()`), so each real create costs O(Services already there):
//! ~110 Services/s at the start, ~25/s at 20k here, hours for 100k (`cache.rs`). A dry-run
//! create returns before the allocation, so it costs the same at any size. NodePorts need no
//! copy: the API server's repair loop rebuilds its port bitmap from the Services when it starts.
//! The API server runs throughout: NodePort Services (10%) are created for real, so its port
//! bitmap is its own; each round's IPAddresses are put before its Services (see
//! [`ADDRESSES_FIRST`]); at the end it must serve every object.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use base64::Engine as _;
use futures::{StreamExt as _, TryStreamExt as _};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::super::api::NODE_NAME;
use super::super::objects::{self, Shape};
use super::create::{self, Created, families, for_create, retry};

/// etcd's default `--max-txn-ops`.
const TXN_OPS: usize = 128;
/// Below etcd's default `--max-request-bytes` (1.5 MiB) once base64-encoded.
const TXN_BYTES: usize = 900 << 10;

/// Services written per round: their IPAddresses first, then the Services and slices.
const CHUNK: usize = 2000;
/// Between a round's IPAddresses and its Services: the API server's informers follow etcd
/// separately, and its repair loop must see an address before the Service that holds it (else
/// it "repairs" the address, and a start-up check that meets that conflict fails).
const ADDRESSES_FIRST: Duration = Duration::from_millis(300);

/// Writes `n` Services and their slices: Service 0 and every NodePort Service (10%) through the
/// API server — so its NodePort bitmap is its own, no repair needed — the rest as above, while
/// the API server runs; returns once it serves them all.
pub async fn cluster(
    client: &kube::Client,
    etcd_url: &str,
    n: usize,
    (web_pod, per): (IpAddr, usize),
    concurrency: usize,
) -> anyhow::Result<Created> {
    let started = Instant::now();
    create::node_and_namespaces(client, n, concurrency).await?;
    let trigger = kproxy_servers::rfc3339_nano(Some(std::time::SystemTime::now()));
    let (mut slices, mut bytes) = create::create_one(client, 0, (web_pod, per), &trigger).await?;
    let template = ip_address_template(client).await?;
    let etcd = Etcd::new(etcd_url);
    for first in (1..n).step_by(CHUNK) {
        let round: Vec<Written> = futures::stream::iter(first..(first + CHUNK).min(n))
            .map(|i| {
                let (client, trigger, template) = (client.clone(), trigger.clone(), &template);
                async move { write_one(&client, i, (web_pod, per), &trigger, template).await }
            })
            .buffer_unordered(concurrency)
            .try_collect()
            .await?;
        let mut addresses = Vec::new();
        let mut objects = Vec::new();
        for written in round {
            bytes += written.sent;
            slices += written.slices;
            addresses.extend(written.addresses);
            objects.extend(written.objects);
        }
        etcd.put_all(addresses).await?;
        tokio::time::sleep(ADDRESSES_FIRST).await;
        etcd.put_all(objects).await?;
    }
    wait_served(client, n, slices).await?;
    Ok(Created {
        services: n,
        slices,
        seconds: started.elapsed().as_secs_f64(),
        concurrency,
        bytes,
        reused_from: None,
        stored_directly: true,
    })
}

/// One Service, written or made ready to be put.
struct Written {
    /// Its IPAddress objects to put (key, JSON).
    addresses: Vec<(String, Vec<u8>)>,
    /// The Service and its slices to put.
    objects: Vec<(String, Vec<u8>)>,
    sent: usize,
    slices: usize,
}

/// Service `i`: created through the API server when it has node ports, else dry-run for putting.
async fn write_one(
    client: &kube::Client,
    i: usize,
    endpoints: (IpAddr, usize),
    trigger: &str,
    template: &Value,
) -> anyhow::Result<Written> {
    if Shape::of(i).node_port {
        let (slices, sent) = create::create_one(client, i, endpoints, trigger).await?;
        return Ok(Written { addresses: Vec::new(), objects: Vec::new(), sent, slices });
    }
    stored_objects(client, i, endpoints, trigger, template).await
}

/// Service `i`'s objects as the API server would store them: its key and JSON each (the Service,
/// its IPAddresses, its slices); the bytes sent; the slices.
async fn stored_objects(
    client: &kube::Client,
    i: usize,
    (web_pod, per): (IpAddr, usize),
    trigger: &str,
    template: &Value,
) -> anyhow::Result<Written> {
    let (namespace, name) = objects::name(i);
    let service_json = objects::service(i);
    let mut sent = service_json.to_string().len();
    let mut service =
        dry_run(client, &format!("/api/v1/namespaces/{namespace}/services"), for_create(service_json.clone()))
            .await
            .with_context(|| format!("Service {namespace}/{name}"))?;
    if Shape::of(i).load_balancer {
        // What the status subresource's PATCH would have written.
        service["status"] = service_json["status"].clone();
    }
    let mut addresses = Vec::new();
    for ip in service["spec"]["clusterIPs"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        let address = ip_address(template, ip, &service)?;
        addresses.push((format!("/registry/ipaddresses/{ip}"), serde_json::to_vec(&address)?));
    }
    let mut out = Vec::new();
    out.push((format!("/registry/services/specs/{namespace}/{name}"), serde_json::to_vec(&service)?));
    let families = families(i);
    for v6 in &families {
        let endpoints = objects::initial_endpoints(i, *v6, (web_pod, NODE_NAME), per);
        let slice_json = objects::slice(i, *v6, &endpoints, trigger);
        sent += slice_json.to_string().len();
        let path = format!("/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices");
        let slice =
            dry_run(client, &path, for_create(slice_json)).await.with_context(|| format!("a slice of {name}"))?;
        let slice_name = objects::slice_name(i, *v6);
        out.push((format!("/registry/endpointslices/{namespace}/{slice_name}"), serde_json::to_vec(&slice)?));
    }
    Ok(Written { addresses, objects: out, sent, slices: families.len() })
}

/// POSTs `object` to `collection` with `dryRun=All`; the object the API server would store
/// (its resourceVersion dropped: etcd's revision is the version of what is stored).
async fn dry_run(client: &kube::Client, collection: &str, object: Value) -> anyhow::Result<Value> {
    let body = serde_json::to_vec(&object)?;
    let mut stored: Value = retry(|| async {
        let request = http::Request::post(format!("{collection}?dryRun=All"))
            .header("content-type", "application/json")
            .body(body.clone())
            .map_err(kube::Error::HttpError)?;
        client.request::<Value>(request).await
    })
    .await?;
    if let Some(meta) = stored.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    Ok(stored)
}

/// The IPAddress the API server made for Service 0's ClusterIP.
async fn ip_address_template(client: &kube::Client) -> anyhow::Result<Value> {
    let ip = objects::cluster_ip_v4(0);
    let request = http::Request::get(format!("/apis/networking.k8s.io/v1/ipaddresses/{ip}")).body(Vec::new())?;
    let mut template: Value =
        client.request(request).await.with_context(|| format!("the IPAddress of Service 0's ClusterIP {ip}"))?;
    anyhow::ensure!(
        template["spec"]["parentRef"]["resource"] == "services",
        "the IPAddress of {ip} is not a Service's: {template}"
    );
    if let Some(meta) = template.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
    }
    Ok(template)
}

/// The template made `ip`'s, owned by `service`.
fn ip_address(template: &Value, ip: &str, service: &Value) -> anyhow::Result<Value> {
    let mut address = template.clone();
    let family = if ip.parse::<IpAddr>()?.is_ipv6() { "IPv6" } else { "IPv4" };
    address["metadata"]["name"] = ip.into();
    address["metadata"]["uid"] = uid(ip).into();
    address["metadata"]["creationTimestamp"] = service["metadata"]["creationTimestamp"].clone();
    for (_, value) in address["metadata"]["labels"].as_object_mut().into_iter().flatten() {
        if value == "IPv4" || value == "IPv6" {
            *value = family.into();
        }
    }
    address["spec"]["parentRef"]["namespace"] = service["metadata"]["namespace"].clone();
    address["spec"]["parentRef"]["name"] = service["metadata"]["name"].clone();
    Ok(address)
}

/// A UUID-shaped uid unique to `name` (the API server's are random; only uniqueness matters).
fn uid(name: &str) -> String {
    let h: String = Sha256::digest(format!("ipaddress/{name}")).iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// Puts waiting for one etcd transaction.
#[derive(Default)]
struct Batch {
    ops: Vec<Value>,
    bytes: usize,
}

impl Batch {
    fn would_overflow(&self, value: &[u8]) -> bool {
        !self.ops.is_empty() && (self.ops.len() == TXN_OPS || self.bytes + value.len() > TXN_BYTES)
    }

    fn push(&mut self, key: String, value: Vec<u8>) {
        let b64 = base64::engine::general_purpose::STANDARD;
        self.bytes += key.len() + value.len();
        self.ops.push(serde_json::json!({"requestPut": {"key": b64.encode(key), "value": b64.encode(value)}}));
    }
}

/// etcd's JSON gateway (`/v3/kv/txn`).
struct Etcd {
    url: String,
    agent: ureq::Agent,
}

impl Etcd {
    fn new(url: &str) -> Etcd {
        let agent = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(60))).build().into();
        Etcd { url: format!("{url}/v3/kv/txn"), agent }
    }

    /// Puts `objects` in as few transactions as etcd's limits allow.
    async fn put_all(&self, objects: Vec<(String, Vec<u8>)>) -> anyhow::Result<()> {
        let mut batch = Batch::default();
        for (key, value) in objects {
            if batch.would_overflow(&value) {
                self.put(std::mem::take(&mut batch)).await?;
            }
            batch.push(key, value);
        }
        self.put(batch).await
    }

    /// One transaction of `batch`'s puts (on a blocking thread: born in the node namespace like
    /// every thread of the runtime, so etcd's 127.0.0.1 is the node's).
    async fn put(&self, batch: Batch) -> anyhow::Result<()> {
        if batch.ops.is_empty() {
            return Ok(());
        }
        let body = serde_json::to_string(&serde_json::json!({"success": batch.ops}))?;
        let (agent, url) = (self.agent.clone(), self.url.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let mut response =
                agent.post(&url).header("content-type", "application/json").send(body).context("an etcd txn")?;
            let answer: Value = serde_json::from_str(&response.body_mut().read_to_string()?)?;
            anyhow::ensure!(answer["succeeded"] == true, "etcd refused a txn: {answer}");
            Ok(())
        })
        .await?
    }
}

/// Waits until the API server serves every Service and slice put (the `kubernetes` Service too).
async fn wait_served(client: &kube::Client, n: usize, slices: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(600);
    let count = |path: &'static str| async move {
        let request = http::Request::get(format!("{path}?limit=1")).body(Vec::new())?;
        let list: Value = client.request(request).await?;
        let rest = list["metadata"]["remainingItemCount"].as_u64().unwrap_or(0) as usize;
        anyhow::Ok(rest + list["items"].as_array().map_or(0, Vec::len))
    };
    loop {
        let services = count("/api/v1/services").await?;
        let served_slices = count("/apis/discovery.k8s.io/v1/endpointslices").await?;
        if services > n && served_slices >= slices {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the API server serves {services} Services and {served_slices} slices of {n} and {slices} put"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

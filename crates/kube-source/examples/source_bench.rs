//! What the API source costs: bytes per object in kproxy's state and plan, and time and peak
//! memory of an initial list through the fake API server.
//!
//! ```sh
//! cargo run --release -p kproxy-kube-source --example source_bench -- bytes
//! cargo run --release -p kproxy-kube-source --example source_bench -- list --services 100000
//! cargo run --release -p kproxy-kube-source --example source_bench -- decode --services 10000
//! cargo run --release -p kproxy-kube-source --example source_bench -- wire --kubeconfig FILE
//! cargo run --release -p kproxy-kube-source --example source_bench -- load --kubeconfig FILE --encoding json
//! ```
//!
//! `wire` measures, against the API server a kubeconfig names, what each encoding costs: for
//! Services and EndpointSlices, a watch-cache list (`resourceVersion=0`) asked for in JSON and in
//! protobuf, alternately, three rounds: the bytes of the body, the time from the request to its
//! last byte (the API server encoding it, on the same cores), and then, on one thread, the time to
//! decode that body as the source does (JSON: each item's text into its typed object, `raw.rs`;
//! protobuf: the list's framing and each item's message, `protobuf/list.rs`).
//!
//! `decode` times, on one thread, kproxy's decode of each object's JSON as the API server sends
//! it, and of the same object in protobuf (encoded by the fake's encoder beforehand: the fields
//! kproxy reads, every annotation, the managed fields) (`kproxy_kube_source::decode`: the typed object straight from the object's text, a bad
//! one kept aside with its name and the field at fault), against a plain `serde_json` decode
//! straight into the typed objects (which would fail a whole list page on one bad object), and
//! reading the bytes as a JSON tree alone. The objects are serialized beforehand and not timed.
//!
//! `bytes` builds Services (one TCP port) with one 5-endpoint EndpointSlice each, shaped like a
//! real cluster's (`fake::objects`), applies them to a `ClusterState`, builds the plan, and
//! reports the heap bytes each holds per Service (a counting allocator: live bytes after minus
//! before, divided by the count; allocator-internal overhead is not included). Then the nftables
//! dataplane (default settings) makes its first sync from that plan through an executor that
//! applies nothing: what it keeps between syncs, and its peak during the sync, per Service.
//!
//! `list` starts the fake API server in a child process (so its memory is not ours) holding the
//! same objects, then runs the real source (`kproxy_kube_source::run`, kube-proxy's default
//! client rate limit 5 qps / burst 10) into a `ClusterState`, as the daemon does, and reports the
//! time from start until Services and EndpointSlices are both synced and the peak RSS (VmHWM)
//! and peak heap of this process. It times the client side of the list: the server's
//! serialization runs in the other process, on the same 2 cores; no dataplane, no plan. Then the
//! server expires every watch with its history compacted, and the relist that follows is timed
//! and its peak heap above the settled state reported. (`serve` and `load --server URL` run the
//! two halves separately.)

#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{BufRead, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kproxy_kube_source::fake::FakeApiServer;
use kproxy_kube_source::fake::objects::{self, Endpoint};
use kproxy_kube_source::{ContentTypes, KubeSourceOptions, ListMode, SourceStats, client_from_config};
use kproxy_plan::{NodeContext, Planner, ProxyPolicy};
use kproxy_state::{Change, ClusterState, Kind, Object, ServiceObject};
use serde_json::Value;

/// The system allocator, counting live and peak heap bytes.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to `System`; only counters are updated around it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            grew(new_size - layout.size());
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Peak resident set size of this process, MiB.
fn vm_hwm_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

const NODES: usize = 100;
const NAMESPACES: usize = 50;
const ENDPOINTS: usize = 5;

/// Service `i`: namespace, name, ClusterIP and port. Addresses stay in 198.18.0.0/15: ClusterIPs
/// in 198.19.0.0/16 (the port changes once they are used up), pods in 198.18.0.0/16 (reused).
fn service_of(i: usize) -> (String, String, IpAddr, u16) {
    let ip_index = i % 65_534 + 1;
    let ip = IpAddr::V4(Ipv4Addr::new(198, 19, (ip_index >> 8) as u8, (ip_index & 0xff) as u8));
    (format!("ns-{}", i % NAMESPACES), format!("svc-{i}"), ip, 80 + (i / 65_534) as u16)
}

fn cluster(i: usize) -> (Value, Value) {
    let (namespace, name, ip, port) = service_of(i);
    let nodes: Vec<String> = (0..ENDPOINTS).map(|j| format!("node-{}", (i + j) % NODES)).collect();
    let endpoints: Vec<Endpoint<'_>> = (0..ENDPOINTS)
        .map(|j| {
            let k = (i * ENDPOINTS + j) % 65_534 + 1;
            Endpoint { ip: IpAddr::V4(Ipv4Addr::new(198, 18, (k >> 8) as u8, (k & 0xff) as u8)), node: &nodes[j] }
        })
        .collect();
    let service = objects::service(&namespace, &name, ip, port, 8080);
    let slice = objects::endpoint_slice(&namespace, &name, &format!("{name}-x7k2p"), &endpoints, 8080);
    (service, slice)
}

fn typed(i: usize) -> (Object, Object) {
    let (service, slice) = cluster(i);
    let service: Service = serde_json::from_value(service).unwrap();
    let slice: EndpointSlice = serde_json::from_value(slice).unwrap();
    (Object::Service(Box::new(ServiceObject::from(service))), Object::EndpointSlice(Box::new(slice)))
}

fn decode(n: usize) {
    let (mut services, mut slices) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let (service, slice) = cluster(i);
        services.push(serde_json::to_vec(&service).unwrap());
        slices.push(serde_json::to_vec(&slice).unwrap());
    }
    let megabytes = services.iter().chain(&slices).map(Vec::len).sum::<usize>() as f64 / 1e6;
    // The same objects as kube-apiserver's protobuf (the fake's encoder: what kproxy reads, every
    // annotation and the managed fields).
    let encode = |kind, json: &Vec<u8>| {
        kproxy_kube_source::protobuf::encode::object(kind, &serde_json::from_slice(json).unwrap()).unwrap()
    };
    let proto_services: Vec<Vec<u8>> = services.iter().map(|s| encode(Kind::Service, s)).collect();
    let proto_slices: Vec<Vec<u8>> = slices.iter().map(|s| encode(Kind::EndpointSlice, s)).collect();
    let proto_megabytes = proto_services.iter().chain(&proto_slices).map(Vec::len).sum::<usize>() as f64 / 1e6;
    let time = |decode: &dyn Fn()| {
        let start = Instant::now();
        decode();
        start.elapsed().as_secs_f64()
    };
    println!(
        "{n} Services and {n} EndpointSlices, {megabytes:.1} MB of JSON, {proto_megabytes:.1} MB of protobuf, one thread; seconds per round:"
    );
    for round in 1..=3 {
        let kproxy = time(&|| {
            for bytes in &services {
                std::hint::black_box(kproxy_kube_source::decode(Kind::Service, bytes).unwrap());
            }
            for bytes in &slices {
                std::hint::black_box(kproxy_kube_source::decode(Kind::EndpointSlice, bytes).unwrap());
            }
        });
        let direct = time(&|| {
            for bytes in &services {
                std::hint::black_box(serde_json::from_slice::<Service>(bytes).unwrap());
            }
            for bytes in &slices {
                std::hint::black_box(serde_json::from_slice::<EndpointSlice>(bytes).unwrap());
            }
        });
        let tree = time(&|| {
            for bytes in services.iter().chain(&slices) {
                std::hint::black_box(serde_json::from_slice::<Value>(bytes).unwrap());
            }
        });
        let protobuf = time(&|| {
            for bytes in &proto_services {
                std::hint::black_box(kproxy_kube_source::decode_protobuf(Kind::Service, bytes).unwrap());
            }
            for bytes in &proto_slices {
                std::hint::black_box(kproxy_kube_source::decode_protobuf(Kind::EndpointSlice, bytes).unwrap());
            }
        });
        println!(
            "  round {round}: kproxy's decode {kproxy:.3} s | straight into typed objects {direct:.3} s ({:.2}×) | JSON tree only {tree:.3} s | kproxy's protobuf decode {protobuf:.3} s ({:.1}× faster than its JSON)",
            kproxy / direct,
            kproxy / protobuf
        );
    }
}

fn bytes(n: usize) {
    let json_bytes: usize = (0..100).map(|i| cluster(i).0.to_string().len() + cluster(i).1.to_string().len()).sum();

    // Typed objects, as a source that kept them would hold them (what a whole list cost before).
    let before = live();
    let held: Vec<(Object, Object)> = (0..n).map(typed).collect();
    let typed_bytes = live() - before;
    drop(held);

    let mut state = ClusterState::new();
    let start = live();
    for i in 0..n {
        let (service, _) = typed(i);
        state.apply(Change::Applied(service));
    }
    let services = live() - start;
    for i in 0..n {
        let (_, slice) = typed(i);
        state.apply(Change::Applied(slice));
    }
    let slices = live() - start - services;
    state.take_dirty();

    let planner = Planner::new(ProxyPolicy::default(), NodeContext { name: "node-0".into(), ..Default::default() });
    let before_plan = live();
    let plan = planner.build(&state);
    let plan_bytes = live() - before_plan;

    // The nftables dataplane's own state after its first (cold-start) sync, the plan kept alive
    // as the daemon keeps it (the dataplane shares each service port's plan with it).
    let mut dataplane = kproxy_nftables::NftablesDataplane::new(Discard, kproxy_nftables::Config::default());
    let before_sync = live();
    PEAK.store(before_sync, Ordering::Relaxed);
    dataplane.full_sync(&plan).unwrap();
    let dataplane_bytes = live() - before_sync;
    let sync_peak = PEAK.load(Ordering::Relaxed) - before_sync;
    drop(dataplane);
    drop(plan);

    let per = |bytes: usize| bytes as f64 / n as f64;
    println!(
        "{n} Services, each one TCP port and one EndpointSlice of {ENDPOINTS} endpoints (heap bytes per Service):"
    );
    println!("  JSON as the API server sends it (with managedFields)   {:>8.0}", json_bytes as f64 / 100.0);
    println!("  typed objects (k8s-openapi Service + EndpointSlice)     {:>8.0}", per(typed_bytes));
    println!("  state: Service record                                  {:>8.0}", per(services));
    println!("  state: EndpointSlice record ({ENDPOINTS} endpoints)              {:>8.0}", per(slices));
    println!("  state: total                                           {:>8.0}", per(services + slices));
    println!("  plan (both families, as the daemon plans)              {:>8.0}", per(plan_bytes));
    println!("  nftables dataplane: kept after its first sync          {:>8.0}", per(dataplane_bytes));
    println!("  nftables dataplane: peak above that during the sync    {:>8.0}", per(sync_peak - dataplane_bytes));
    println!(
        "  sizes: ServiceInfo {} B, SliceInfo {} B, EndpointInfo {} B, ObjectKey {} B",
        size_of::<kproxy_state::ServiceInfo>(),
        size_of::<kproxy_state::SliceInfo>(),
        size_of::<kproxy_state::EndpointInfo>(),
        size_of::<kproxy_state::ObjectKey>()
    );
}

/// Applies nothing: the dataplane's state is measured without a kernel.
struct Discard;

impl kproxy_nftables::Executor for Discard {
    fn apply(&mut self, _tx: &kproxy_nftables::Transaction) -> Result<(), kproxy_nftables::ExecError> {
        Ok(())
    }
}

/// Serves `n` Services with their slices until stdin closes; prints the URL first.
async fn serve(n: usize) {
    let server = FakeApiServer::start().await.unwrap();
    for i in 0..n {
        let (service, slice) = cluster(i);
        server.apply(Kind::Service, service);
        server.apply(Kind::EndpointSlice, slice);
    }
    let mut node = serde_json::json!({"metadata": {"name": "node-0"}, "spec": {"podCIDR": "198.18.0.0/24"}});
    node["status"] = serde_json::json!({"addresses": [{"type": "InternalIP", "address": "203.0.113.2"}]});
    server.apply(Kind::Node, node);
    // The history of the load is not needed: lists and watches start from the current version.
    server.compact();
    println!("{}", server.url());
    std::io::stdout().flush().unwrap();
    // "expire" on stdin forces every client to relist (history compacted, watches expired).
    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = lines.recv().await {
        if line.trim() == "expire" {
            server.compact();
            server.expire_watches();
        }
    }
}

fn parse_mode(mode: &str) -> ListMode {
    match mode {
        "streaming" => ListMode::Streaming,
        "watch-cache" => ListMode::WatchCache,
        "paginated" => ListMode::Paginated(500),
        other => panic!("unknown mode {other:?} (streaming, watch-cache, paginated)"),
    }
}

fn content_types(encoding: &str) -> ContentTypes {
    match encoding {
        "json" => ContentTypes::json(),
        "protobuf" => ContentTypes::protobuf(),
        other => panic!("unknown encoding {other:?} (json, protobuf)"),
    }
}

/// Where `load` and `wire` connect: the fake at `--server URL`, or the server of `--kubeconfig`.
async fn connect(url: Option<&str>, kubeconfig: Option<&str>) -> kube::Client {
    match (url, kubeconfig) {
        (_, Some(path)) => kproxy_kube_source::client(Some(std::path::Path::new(path)), 5.0, 10).await.unwrap(),
        (Some(url), None) => client_from_config(kube::Config::new(url.parse().unwrap()), 5.0, 10).unwrap(),
        (None, None) => panic!("--server URL or --kubeconfig FILE"),
    }
}

/// Lists from the server into a state; prints one result row. With `relist`, then asks the
/// server (through it) to expire every watch and measures the relist too.
async fn load(
    client: kube::Client,
    mode: &str,
    encoding: &str,
    n: Option<usize>,
    relist: Option<&mut std::process::ChildStdin>,
) {
    let mut options = KubeSourceOptions::new("node-0");
    options.list_mode = parse_mode(mode);
    options.content_types = content_types(encoding);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Change>(1024);
    PEAK.store(live(), Ordering::Relaxed);
    let heap_before = live();
    let start = Instant::now();
    let stats = Arc::new(SourceStats::new());
    let source = tokio::spawn(kproxy_kube_source::run(client, options, tx, stats.clone()));
    let mut state = ClusterState::new();
    while !(state.is_synced(Kind::Service) && state.is_synced(Kind::EndpointSlice)) {
        let change = tokio::time::timeout(Duration::from_secs(600), rx.recv()).await.unwrap().unwrap();
        state.apply(change);
    }
    let took = start.elapsed();
    let services = state.services().count();
    let heap_after = live() - heap_before;
    let peak = PEAK.load(Ordering::Relaxed) - heap_before;
    if let Some(n) = n {
        assert_eq!(services, n, "every Service listed");
    }
    let n = services;
    println!(
        "{n:>7} services  {mode:<12} {encoding:<8} start→synced {:>7.2} s  peak RSS {:>7.0} MiB  peak heap {:>7.0} MiB  heap after {:>6.0} MiB",
        took.as_secs_f64(),
        vm_hwm_mib(),
        mib(peak),
        mib(heap_after)
    );
    if let Some(server) = relist {
        // The relist after 410 Gone: its peak heap above what the synced state held.
        let settled = live();
        PEAK.store(settled, Ordering::Relaxed);
        let start = Instant::now();
        writeln!(server, "expire").unwrap();
        server.flush().unwrap();
        let relisted = |stats: &SourceStats| stats.lists(Kind::Service) >= 2 && stats.lists(Kind::EndpointSlice) >= 2;
        while !relisted(&stats) {
            if let Ok(Some(change)) = tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {
                state.apply(change);
            }
        }
        while let Ok(change) = rx.try_recv() {
            state.apply(change);
        }
        println!(
            "{n:>7} services  {mode:<12} relist       {:>7.2} s  peak heap above the settled state {:>5.0} MiB (settled {:.0} MiB)",
            start.elapsed().as_secs_f64(),
            mib(PEAK.load(Ordering::Relaxed) - settled),
            mib(settled - heap_before)
        );
        assert_eq!(state.services().count(), n, "every Service still there");
    }
    source.abort();
}

/// A watch-cache list of `path` asked for with `accept`: the body and the seconds to its last byte.
async fn fetch(client: &kube::Client, path: &str, accept: &str) -> (Vec<u8>, f64) {
    use http_body_util::BodyExt as _;
    let request = http::Request::get(format!("{path}?resourceVersion=0"))
        .header(http::header::ACCEPT, accept)
        .body(kube::client::Body::empty())
        .unwrap();
    let start = Instant::now();
    let response = client.send(request).await.unwrap();
    assert!(response.status().is_success(), "{path}: {}", response.status());
    let body = response.into_body().collect().await.unwrap().to_bytes().to_vec();
    (body, start.elapsed().as_secs_f64())
}

/// Decodes a JSON list body as the source decodes each item; the number of items.
fn decode_json_list(kind: Kind, body: &[u8]) -> usize {
    #[derive(serde::Deserialize)]
    struct List<'a> {
        #[serde(borrow)]
        items: Vec<&'a serde_json::value::RawValue>,
    }
    let list: List<'_> = serde_json::from_slice(body).unwrap();
    for item in &list.items {
        std::hint::black_box(kproxy_kube_source::decode(kind, item.get().as_bytes()).unwrap());
    }
    list.items.len()
}

/// JSON against protobuf on the wire (see the module documentation).
async fn wire(client: kube::Client) {
    let kinds =
        [(Kind::Service, "/api/v1/services"), (Kind::EndpointSlice, "/apis/discovery.k8s.io/v1/endpointslices")];
    println!(
        "watch-cache lists, JSON and protobuf alternately; per round: MB of body, s to its last byte, s to decode it (one thread)"
    );
    for (kind, path) in kinds {
        for round in 1..=3 {
            let mut row = format!("{kind:<13} round {round}:");
            for (name, accept) in
                [("JSON", "application/json"), ("protobuf", "application/vnd.kubernetes.protobuf, */*")]
            {
                let (body, received) = fetch(&client, path, accept).await;
                let start = Instant::now();
                let items = if name == "JSON" {
                    decode_json_list(kind, &body)
                } else {
                    let (items, meta) = kproxy_kube_source::protobuf::read_list_body(kind, &body);
                    assert!(meta.is_ok() && items.iter().all(Result::is_ok));
                    items.len()
                };
                let decoded = start.elapsed().as_secs_f64();
                row += &format!(
                    "  {name} {items} objects {:.1} MB, received {received:.2} s, decoded {decoded:.2} s |",
                    body.len() as f64 / 1e6
                );
            }
            println!("{row}");
        }
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = arg(&args, "--services").map_or(10_000, |s| s.parse().unwrap());
    let mode = arg(&args, "--mode").unwrap_or_else(|| "streaming".into());
    let encoding = arg(&args, "--encoding").unwrap_or_else(|| "protobuf".into());
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    match args.first().map(String::as_str) {
        Some("bytes") => bytes(n),
        Some("decode") => decode(n),
        Some("serve") => runtime.block_on(serve(n)),
        Some("load") => runtime.block_on(async {
            let client = connect(arg(&args, "--server").as_deref(), arg(&args, "--kubeconfig").as_deref()).await;
            load(client, &mode, &encoding, arg(&args, "--services").map(|_| n), None).await;
        }),
        Some("wire") => runtime.block_on(async {
            let client = connect(arg(&args, "--server").as_deref(), arg(&args, "--kubeconfig").as_deref()).await;
            wire(client).await;
        }),
        Some("list") => {
            // The server in a child process, so its memory and allocations are not counted here.
            let exe = std::env::current_exe().unwrap();
            let mut child = std::process::Command::new(exe)
                .args(["serve", "--services", &n.to_string()])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut url = String::new();
            std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut url).unwrap();
            let mut stdin = child.stdin.take();
            runtime.block_on(async {
                let client = connect(Some(url.trim()), None).await;
                load(client, &mode, &encoding, Some(n), stdin.as_mut()).await;
            });
            drop(stdin);
            child.wait().unwrap();
        }
        _ => eprintln!(
            "usage: source_bench bytes|decode|list|serve|load|wire [--services N] [--mode streaming|watch-cache|paginated] \
             [--encoding protobuf|json] [--server URL | --kubeconfig FILE]"
        ),
    }
}

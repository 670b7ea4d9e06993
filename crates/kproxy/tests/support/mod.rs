//! A `kproxy --dry-run` daemon against an in-process fake API server: the real binary, no kernel
//! programming, so these tests need no root. Helpers to scrape its HTTP endpoints.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kproxy_kube_source::fake::FakeApiServer;
use kproxy_state::Kind;
use serde_json::json;

/// The fake API server and the runtime it runs on.
pub struct Api {
    pub server: FakeApiServer,
    _runtime: tokio::runtime::Runtime,
}

impl Api {
    pub fn start() -> Api {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let server = runtime.block_on(FakeApiServer::start()).unwrap();
        Api { server, _runtime: runtime }
    }
}

/// A running `kproxy --dry-run`, killed on drop, with its scratch directory.
pub struct DryRun {
    pub child: Child,
    pub metrics: SocketAddr,
    pub healthz: SocketAddr,
    dir: PathBuf,
}

impl Drop for DryRun {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl DryRun {
    /// Starts `kproxy --dry-run --hostname-override=node-a` against `api` with `args`.
    pub fn start(api: &Api, tag: &str, args: &[String]) -> DryRun {
        Self::start_with_server(&api.server.url(), tag, args)
    }

    /// The same with a kubeconfig naming `server` as the API server.
    pub fn start_with_server(server: &str, tag: &str, args: &[String]) -> DryRun {
        let dir = std::env::temp_dir().join(format!("kproxy-dry-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = write_kubeconfig(&dir, server);
        let (metrics, healthz) = (free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_kproxy"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--dry-run", "--hostname-override=node-a", "--iptables-min-sync-period=50ms"])
            .arg(format!("--metrics-bind-address={metrics}"))
            .arg(format!("--healthz-bind-address={healthz}"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        DryRun { child, metrics, healthz, dir }
    }

    /// Scrapes `/metrics` until `done` holds or `within` passed; returns the last scrape.
    pub fn scrape_until(&self, within: Duration, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let text = http_get(self.metrics, "/metrics").map(|(_, body)| body).unwrap_or_default();
            if done(&text) || start.elapsed() > within {
                return text;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the first IPv4 sync; panics if it does not come.
    pub fn wait_synced(&self) -> String {
        let synced = "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}";
        let text = self.scrape_until(START, |text| value(text, synced).is_some());
        assert!(value(&text, synced).is_some(), "kproxy never synced:\n{text}");
        text
    }
}

/// Writes a kubeconfig for an API server at `url` (no auth) into `dir`; returns its path.
pub fn write_kubeconfig(dir: &std::path::Path, url: &str) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {url}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
        ),
    )
    .unwrap();
    path
}

/// The fake API server started inside `ns` (so a kproxy there reaches it on 127.0.0.1).
pub fn api_in(ns: &kproxy_testbed::Netns) -> Api {
    ns.run_in(Api::start).unwrap()
}

/// How long kproxy may take from start to its first sync. Generous: a waiting test returns at
/// the first success, and in the guest kernel (a debug build under TCG) 16 s were measured.
pub const START: Duration = Duration::from_secs(60);
/// How long a change may take to reach the kernel (a full sync took 9 s in the guest).
pub const CHANGE: Duration = Duration::from_secs(30);

/// A loopback address with a port that was free a moment ago.
pub fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// `GET path` over HTTP/1.1: (status, body), or `None` when nothing answers.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Some((status, body))
}

/// The value of the one series named exactly `series` (name plus labels, as exposed).
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// TCP probes from `from` to `dest` until `want` answers (or `within` passes); the last result.
pub fn probe_until(
    from: &kproxy_testbed::Netns,
    dest: SocketAddr,
    want: &kproxy_testbed::ProbeResult,
    within: Duration,
) -> kproxy_testbed::ProbeResult {
    let start = Instant::now();
    loop {
        let got = kproxy_testbed::probe(from, kproxy_testbed::Proto::Tcp, dest, Duration::from_millis(300)).unwrap();
        if &got == want || start.elapsed() > within {
            return got;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A child process killed (and reaped) on drop.
pub struct KillOnDrop(pub Child);

/// The real `kproxy` in namespace `ns`, against the API server at `url` (a kubeconfig written to
/// a directory of its own, named by `tag` and unique to this call, returned for the caller to
/// remove), with `args`; killed when dropped. Unique: two tests running side by side with one
/// tag once shared a kubeconfig, and one kproxy dialled the other's API server.
pub fn kproxy_in(ns: &str, url: &str, tag: &str, args: &[String]) -> (KillOnDrop, PathBuf) {
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("kproxy-{tag}-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = write_kubeconfig(&dir, url);
    let child = KillOnDrop(
        std::process::Command::new("ip")
            .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_kproxy")])
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    (child, dir)
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Probes TCP `dest` from `from` until `backend` answers or `within` passed; returns the last
/// result.
pub fn answered_by(
    from: &kproxy_testbed::Netns,
    dest: SocketAddr,
    backend: &str,
    within: Duration,
) -> kproxy_testbed::ProbeResult {
    use kproxy_testbed::{ProbeResult, Proto, probe};
    let start = Instant::now();
    loop {
        let got = probe(from, Proto::Tcp, dest, Duration::from_millis(300)).unwrap();
        let done = matches!(&got, ProbeResult::Answered { backend: b, .. } if b == backend);
        if done || start.elapsed() > within {
            return got;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Node `node-a` (InternalIP 198.18.0.2, pod CIDR 198.18.16.0/24), the node kproxy runs as.
pub fn apply_node_a(server: &FakeApiServer) {
    server.apply(
        Kind::Node,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
               "spec": {"podCIDRs": ["198.18.16.0/24"]},
               "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.2"}]}}),
    );
}

/// The flags of a kproxy on node-a that exports metrics on `metrics` and leaves the node's
/// conntrack settings alone; `extra` follow.
pub fn node_a_args(metrics: SocketAddr, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--hostname-override=node-a".to_owned(),
        format!("--metrics-bind-address={metrics}"),
        "--conntrack-max-per-core=0".to_owned(),
        "--conntrack-tcp-timeout-established=0".to_owned(),
        "--conntrack-tcp-timeout-close-wait=0".to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

/// A big cluster: node-a, `demo/web` on `web_pod` (node-b), and `services` bulk Services with
/// their slices.
pub fn apply_bulk_cluster(server: &FakeApiServer, web_pod: &str, services: usize) {
    apply_node_a(server);
    apply_web_service(server, "p");
    apply_one_endpoint_slice(server, "web", "p", web_pod, "node-b");
    for i in 0..services {
        server.apply(Kind::Service, bulk_service(i));
        server.apply(Kind::EndpointSlice, bulk_slice(i, 0));
    }
}

/// A sandbox for kproxy against a big cluster: the testbed, pod `web-b` on node-b serving TCP
/// 8080 (the endpoint of `demo/web`), a client pod on the node, and a fake API server in the
/// node's namespace holding [`apply_bulk_cluster`] with `services` bulk Services.
pub struct BulkSandbox {
    pub tb: kproxy_testbed::Testbed,
    pub web: std::sync::Arc<kproxy_testbed::Pod>,
    pub client: std::sync::Arc<kproxy_testbed::Pod>,
    pub api: Api,
    /// How long writing the cluster into the fake API server took: this machine's pace, right
    /// now, for the work a cold start of the same cluster does (building and serializing the same
    /// objects in a debug build), for deadlines that follow the load and the guest's emulation.
    pub applied_in: Duration,
}

pub fn bulk_sandbox(services: usize) -> BulkSandbox {
    use kproxy_testbed::{Proto, Testbed, Where};
    let tb = Testbed::new().unwrap();
    let web = tb.add_pod("web-b", Where::Node2).unwrap();
    web.serve(&[(Proto::Tcp, 8080)]).unwrap();
    let client = tb.add_pod("client", Where::Node).unwrap();
    let api = api_in(tb.node());
    let applying = Instant::now();
    apply_bulk_cluster(&api.server, &web.ipv4().to_string(), services);
    let applied_in = applying.elapsed();
    BulkSandbox { tb, web, client, api, applied_in }
}

/// Service `demo/web`: ClusterIP 198.18.128.10, TCP port `port_name` 80 → 8080.
pub fn apply_web_service(server: &FakeApiServer, port_name: &str) {
    server.apply(
        Kind::Service,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "demo", "name": "web"},
               "spec": {"clusterIP": "198.18.128.10", "clusterIPs": ["198.18.128.10"],
                        "ports": [{"name": port_name, "port": 80, "protocol": "TCP", "targetPort": 8080}]}}),
    );
}

/// Service `bulk/svc-<i>`: ClusterIP 198.19.x.y, TCP port `p` 80 → 8080 (thousands of them
/// stand for a big cluster).
pub fn bulk_service(i: usize) -> serde_json::Value {
    let ip = format!("198.19.{}.{}", i / 250, 1 + i % 250);
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "bulk", "name": format!("svc-{i}")},
           "spec": {"clusterIP": ip, "clusterIPs": [ip],
                    "ports": [{"name": "p", "port": 80, "protocol": "TCP", "targetPort": 8080}]}})
}

/// EndpointSlice of `bulk/svc-<i>`: three ready endpoints on node-b (198.18.32.1 to
/// 198.18.255.250, which nothing serves: 56,000 addresses, reused beyond 18,666 Services), moved
/// by `generation`.
pub fn bulk_slice(i: usize, generation: usize) -> serde_json::Value {
    let endpoints: Vec<serde_json::Value> = (0..3)
        .map(|j| {
            let n = (i * 3 + j + generation * 7) % 56_000;
            json!({"addresses": [format!("198.18.{}.{}", 32 + n / 250, 1 + n % 250)], "nodeName": "node-b",
                   "conditions": {"ready": true}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"namespace": "bulk", "name": format!("svc-{i}-1"),
                        "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
           "addressType": "IPv4", "endpoints": endpoints,
           "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}]})
}

/// EndpointSlice `<service>-1` in `demo`: one ready IPv4 endpoint `ip` on `node`, TCP port
/// `port_name` = 8080.
pub fn apply_one_endpoint_slice(server: &FakeApiServer, service: &str, port_name: &str, ip: &str, node: &str) {
    server.apply(
        Kind::EndpointSlice,
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"namespace": "demo", "name": format!("{service}-1"),
                            "labels": {"kubernetes.io/service-name": service}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": [ip], "nodeName": node, "conditions": {"ready": true}}],
               "ports": [{"name": port_name, "port": 8080, "protocol": "TCP"}]}),
    );
}

//! `/metrics` of the real `kproxy` binary after a scripted sequence of API changes: every
//! family an operator's dashboards read is fed, with upstream's meaning, and each value is what
//! the sequence implies. Runs `--dry-run` (nothing touches the kernel), so it needs no root.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kproxy_kube_source::fake::FakeApiServer;
use kproxy_state::Kind;
use serde_json::{Value, json};

fn service(name: &str, cluster_ip: &str, port: u16, protocol: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "demo", "name": name},
        "spec": {"type": "ClusterIP", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                 "ports": [{"name": "p", "port": port, "protocol": protocol, "targetPort": 8080}]},
    })
}

fn slice(service: &str, ip: &str, protocol: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "demo", "name": format!("{service}-1"),
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "nodeName": "node-b", "conditions": {"ready": true}}],
        "ports": [{"name": "p", "port": 8080, "protocol": protocol}],
    })
}

fn node() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": "198.18.0.2"}]},
    })
}

struct Kproxy(Child);

impl Drop for Kproxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
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
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

fn scrape_until(metrics: SocketAddr, within: Duration, done: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let text = http_get(metrics, "/metrics").map(|(_, body)| body).unwrap_or_default();
        if done(&text) || start.elapsed() > within {
            return text;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn nftables_mode_metrics_follow_a_scripted_sequence_of_api_changes() {
    let text = scripted_sequence("nftables");
    assert!(!text.contains("iptables_total"), "no iptables rule counts in nftables mode");
}

#[test]
fn iptables_mode_metrics_follow_a_scripted_sequence_and_count_rules() {
    let text = scripted_sequence("iptables");
    let rules = |what: &str, table: &str| {
        let series = format!("kubeproxy_sync_proxy_rules_iptables_{what}{{ip_family=\"IPv4\",table=\"{table}\"}}");
        value(&text, &series).unwrap_or_else(|| panic!("no {series}:\n{text}"))
    };
    // Two Services with an endpoint each: at least their SVC and SEP chains, the dispatch and
    // the masquerading rules in nat; the forwarding rules in filter.
    assert!(rules("total", "nat") >= 8.0, "{text}");
    assert!(rules("total", "filter") >= 2.0, "{text}");
    // The last sync wrote some of them (how many a partial sync writes: kproxy-iptables' unit
    // tests; under --dry-run no canary exists, so every sync here is a full one).
    let (last, total) = (rules("last", "nat"), rules("total", "nat"));
    assert!(last > 0.0 && last <= total, "last {last} of {total}");
}

/// Runs the script against `kproxy --dry-run --proxy-mode=<mode>`; checks what every mode
/// exports and returns the final scrape.
fn scripted_sequence(mode: &str) -> String {
    let started = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let api = runtime.block_on(FakeApiServer::start()).unwrap();
    api.apply(Kind::Node, node());
    api.apply(Kind::Service, service("web", "198.18.128.10", 80, "TCP"));
    api.apply(Kind::Service, service("dns", "198.18.128.11", 53, "UDP"));
    api.apply(Kind::EndpointSlice, slice("web", "198.18.17.5", "TCP"));
    api.apply(Kind::EndpointSlice, slice("dns", "198.18.17.6", "UDP"));

    let dir = std::env::temp_dir().join(format!("kproxy-metrics-{mode}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n",
            api.url()
        ),
    )
    .unwrap();
    let (metrics, healthz) = (free_port(), free_port());
    let _kproxy = Kproxy(
        Command::new(env!("CARGO_BIN_EXE_kproxy"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--dry-run", "--hostname-override=node-a", "--iptables-min-sync-period=50ms"])
            .arg(format!("--proxy-mode={mode}"))
            .arg(format!("--metrics-bind-address={metrics}"))
            .arg(format!("--healthz-bind-address={healthz}"))
            .arg("--feature-gates=KubeProxyDrainingTerminatingNodes=true")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let synced = "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"}";
    let first = scrape_until(metrics, Duration::from_secs(15), |text| value(text, synced).is_some());
    assert!(value(&first, synced).is_some(), "kproxy never synced:\n{first}");

    // The script: 3 updates of one EndpointSlice, one deleted; one Service updated, one added,
    // one malformed (skipped, but still a Service event).
    for ip in ["198.18.17.7", "198.18.17.8", "198.18.17.9"] {
        api.apply(Kind::EndpointSlice, slice("web", ip, "TCP"));
    }
    api.delete(Kind::EndpointSlice, "demo", "dns-1").unwrap();
    api.apply(Kind::Service, service("web", "198.18.128.10", 81, "TCP"));
    api.apply(Kind::Service, service("extra", "198.18.128.12", 80, "TCP"));
    api.apply(Kind::Service, service("broken", "not-an-ip", 80, "TCP"));

    // Initial lists: 2 slices, 2 Services (and the Node, which counts for neither).
    let (endpoint_total, service_total) = (2.0 + 3.0 + 1.0, 2.0 + 3.0);
    let text = scrape_until(metrics, Duration::from_secs(10), |text| {
        value(text, "kubeproxy_sync_proxy_rules_endpoint_changes_total") == Some(endpoint_total)
            && value(text, "kubeproxy_sync_proxy_rules_service_changes_total") == Some(service_total)
            && value(text, "kubeproxy_sync_proxy_rules_service_changes_pending") == Some(0.0)
            && value(text, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == Some(0.0)
    });
    for _ in 0..2 {
        assert_eq!(http_get(healthz, "/healthz").unwrap().0, 200);
    }
    let text = format!("{text}\n{}", http_get(metrics, "/metrics").unwrap().1);
    let expect = |series: &str, want: f64| {
        assert_eq!(value(&text, series), Some(want), "{series}:\n{text}");
    };
    expect("kubeproxy_sync_proxy_rules_endpoint_changes_total", endpoint_total);
    expect("kubeproxy_sync_proxy_rules_service_changes_total", service_total);
    expect("kubeproxy_sync_proxy_rules_endpoint_changes_pending", 0.0);
    expect("kubeproxy_sync_proxy_rules_service_changes_pending", 0.0);
    expect("kubeproxy_proxy_healthz_total{code=\"200\"}", 2.0);
    expect("kproxy_invalid_objects_total{kind=\"Service\"}", 1.0);
    expect("kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"internal\"}", 0.0);
    expect("kubernetes_feature_enabled{name=\"KubeProxyDrainingTerminatingNodes\",stage=\"\"}", 1.0);
    expect("kubernetes_feature_enabled{name=\"KubeProxyNFTablesLocalhostNodePorts\",stage=\"ALPHA\"}", 0.0);
    let syncs = value(&text, "kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family=\"IPv4\"}").unwrap();
    assert!(syncs >= 2.0, "the initial sync and at least one for the script: {syncs}");

    let build = text.lines().find(|line| line.starts_with("kubernetes_build_info{")).expect("kubernetes_build_info");
    let version = format!("git_version=\"v{}\"", env!("CARGO_PKG_VERSION"));
    assert!(build.contains(&version) && build.ends_with(" 1"), "{build}");
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let start_time = value(&text, "process_start_time_seconds").unwrap();
    assert!(start_time >= started - 2.0 && start_time <= now, "kproxy started at {start_time}, test at {started}");
    assert!(value(&text, "process_resident_memory_bytes").unwrap() > 1e6, "{text}");
    assert!(value(&text, "process_open_fds").unwrap() >= 3.0, "{text}");
    assert!(value(&text, "process_cpu_seconds_total").unwrap() > 0.0, "{text}");

    let _ = std::fs::remove_dir_all(&dir);
    text
}

//! `/metrics` of the real `kproxy` binary after a scripted sequence of API changes: every
//! family an operator's dashboards read is fed, with upstream's meaning, and each value is what
//! the sequence implies. Runs `--dry-run` (nothing touches the kernel), so it needs no root.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::time::{SystemTime, UNIX_EPOCH};

use kproxy_state::Kind;
use serde_json::{Value, json};
use support::{Api, DryRun, http_get, value};

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

#[test]
fn nftables_mode_metrics_follow_a_scripted_sequence_of_api_changes() {
    let text = scripted_sequence("nftables");
    assert!(!text.contains("iptables_total"), "no iptables rule counts in nftables mode");
    assert!(!text.contains("kubeproxy_iptables_"), "no nfacct packet counters in nftables mode (as upstream)");
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
    // --dry-run creates no nfacct counter in the kernel, so there is none to export
    // (packet_counters.rs has them for real).
    assert!(!text.contains("kubeproxy_iptables_"), "{text}");
}

/// Runs the script against `kproxy --dry-run --proxy-mode=<mode>`; checks what every mode
/// exports and returns the final scrape.
fn scripted_sequence(mode: &str) -> String {
    let started = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64();
    let api = Api::start();
    api.server.apply(Kind::Node, node());
    api.server.apply(Kind::Service, service("web", "198.18.128.10", 80, "TCP"));
    api.server.apply(Kind::Service, service("dns", "198.18.128.11", 53, "UDP"));
    api.server.apply(Kind::EndpointSlice, slice("web", "198.18.17.5", "TCP"));
    api.server.apply(Kind::EndpointSlice, slice("dns", "198.18.17.6", "UDP"));
    let args = [format!("--proxy-mode={mode}"), "--feature-gates=KubeProxyDrainingTerminatingNodes=true".to_owned()];
    let kproxy = DryRun::start(&api, mode, &args);
    kproxy.wait_synced();

    // The script: one Service unreadable (skipped by the source, counted there), then one
    // readable but invalid (skipped by the state), both in the Services' watch, in this order;
    // 3 updates of one EndpointSlice, one deleted; one Service updated, one added. The valid
    // changes come last, so the last sync writes rules (a sync of the invalid ones alone writes
    // none, which a slow machine, the guest, shows when they are last).
    let garbled = serde_json::json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "demo", "name": "garbled"}, "spec": {"ports": "eighty"}});
    api.server.apply(Kind::Service, garbled);
    api.server.apply(Kind::Service, service("broken", "not-an-ip", 80, "TCP"));
    for ip in ["198.18.17.7", "198.18.17.8", "198.18.17.9"] {
        api.server.apply(Kind::EndpointSlice, slice("web", ip, "TCP"));
    }
    api.server.delete(Kind::EndpointSlice, "demo", "dns-1").unwrap();
    api.server.apply(Kind::Service, service("web", "198.18.128.10", 81, "TCP"));
    api.server.apply(Kind::Service, service("extra", "198.18.128.12", 80, "TCP"));

    // Initial lists: 2 slices, 2 Services (and the Node, which counts for neither).
    let (endpoint_total, service_total) = (2.0 + 3.0 + 1.0, 2.0 + 3.0);
    let text = kproxy.scrape_until(support::CHANGE, |text| {
        value(text, "kubeproxy_sync_proxy_rules_endpoint_changes_total") == Some(endpoint_total)
            && value(text, "kubeproxy_sync_proxy_rules_service_changes_total") == Some(service_total)
            && value(text, "kubeproxy_sync_proxy_rules_service_changes_pending") == Some(0.0)
            && value(text, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == Some(0.0)
    });
    for _ in 0..2 {
        assert_eq!(http_get(kproxy.healthz, "/healthz").unwrap().0, 200);
    }
    let text = format!("{text}\n{}", http_get(kproxy.metrics, "/metrics").unwrap().1);
    let expect = |series: &str, want: f64| {
        assert_eq!(value(&text, series), Some(want), "{series}:\n{text}");
    };
    expect("kubeproxy_sync_proxy_rules_endpoint_changes_total", endpoint_total);
    expect("kubeproxy_sync_proxy_rules_service_changes_total", service_total);
    expect("kubeproxy_sync_proxy_rules_endpoint_changes_pending", 0.0);
    expect("kubeproxy_sync_proxy_rules_service_changes_pending", 0.0);
    expect("kubeproxy_proxy_healthz_total{code=\"200\"}", 2.0);
    expect("kproxy_invalid_objects_total{kind=\"Service\"}", 1.0);
    expect("kproxy_source_malformed_objects_total{kind=\"Service\"}", 1.0);
    expect("kproxy_source_malformed_objects_total{kind=\"EndpointSlice\"}", 0.0);
    expect("kproxy_source_streaming_list_fallbacks_total{kind=\"Service\"}", 0.0);
    assert!(value(&text, "kproxy_source_lists_total{kind=\"EndpointSlice\"}").unwrap_or(0.0) >= 1.0, "{text}");
    assert!(value(&text, "kproxy_source_events_total{kind=\"Service\"}").unwrap_or(0.0) >= 3.0, "{text}");
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
    text
}

//! `/metrics` scraped over real HTTP and parsed by real exposition parsers (Prometheus text 0.0.4
//! and OpenMetrics 1.0), plus a strict check of our own on the histogram layouts.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, UNIX_EPOCH};

use common::{get, get_with};
use kproxy_servers::{
    DataplaneMode, Metrics, MetricsServerInfo, TrafficPolicyKind, network_programming_buckets, serve_metrics,
    sync_duration_buckets,
};
use kproxy_state::IpFamily;
use openmetrics_parser::{OpenMetricsType, OpenMetricsValue, PrometheusType, PrometheusValue};

const OPENMETRICS_ACCEPT: &str =
    "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1";

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn populated(mode: DataplaneMode) -> Metrics {
    let m = Metrics::new(mode);
    let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    for family in IpFamily::BOTH {
        m.observe_sync(family, true, Duration::from_millis(3));
        m.observe_sync(family, false, Duration::from_micros(700));
        m.observe_sync(family, false, Duration::from_secs(40));
        m.observe_network_programming(family, 0.3);
        m.observe_network_programming_since(family, t, t + Duration::from_secs(75));
        m.set_last_sync_timestamp(family, t);
        m.set_last_queued_timestamp(family, t + Duration::from_millis(250));
        m.set_no_local_endpoints(family, TrafficPolicyKind::Internal, 2);
        m.set_no_local_endpoints(family, TrafficPolicyKind::External, 1);
        m.observe_conntrack_reconcile(family, Duration::from_millis(12), 5);
        m.inc_conntrack_cleanup_failure(family);
        m.set_masquerade_policy(family, "clusterCIDR", &[]);
    }
    m.set_endpoint_changes_pending(4);
    m.add_endpoint_changes(10);
    m.set_service_changes_pending(1);
    m.add_service_changes(3);
    m.record_healthz(200);
    m.record_healthz(503);
    m.record_livez(200);
    m.inc_invalid_object("Service");
    m.inc_healthcheck_bind_failure();
    m.set_feature_gates([("KubeProxyIPVS", "", true), ("KubeProxyNFTablesLocalhostNodePorts", "ALPHA", false)]);
    match mode {
        DataplaneMode::Nftables => {
            m.inc_nftables_sync_failure(IpFamily::V4);
            m.inc_nftables_cleanup_failure(IpFamily::V6);
        }
        DataplaneMode::Iptables => {
            m.inc_iptables_restore_failure(IpFamily::V4);
            m.inc_iptables_partial_restore_failure(IpFamily::V4);
            m.set_iptables_rules(IpFamily::V4, "nat", 120, 7);
        }
        DataplaneMode::Ipvs => m.inc_iptables_restore_failure(IpFamily::V6),
    }
    m
}

/// (series family name as Prometheus text names it, type, label names) for every metric common to
/// all modes: upstream's names, types and labels.
const COMMON: &[(&str, &str, &[&str])] = &[
    ("kubeproxy_sync_proxy_rules_duration_seconds", "histogram", &["ip_family"]),
    ("kubeproxy_sync_full_proxy_rules_duration_seconds", "histogram", &["ip_family"]),
    ("kubeproxy_sync_partial_proxy_rules_duration_seconds", "histogram", &["ip_family"]),
    ("kubeproxy_network_programming_duration_seconds", "histogram", &["ip_family"]),
    ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "gauge", &["ip_family"]),
    ("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", "gauge", &["ip_family"]),
    ("kubeproxy_sync_proxy_rules_endpoint_changes_pending", "gauge", &[]),
    ("kubeproxy_sync_proxy_rules_endpoint_changes_total", "counter", &[]),
    ("kubeproxy_sync_proxy_rules_service_changes_pending", "gauge", &[]),
    ("kubeproxy_sync_proxy_rules_service_changes_total", "counter", &[]),
    ("kubeproxy_sync_proxy_rules_no_local_endpoints_total", "gauge", &["ip_family", "traffic_policy"]),
    ("kubeproxy_proxy_healthz_total", "counter", &["code"]),
    ("kubeproxy_proxy_livez_total", "counter", &["code"]),
    ("kubeproxy_conntrack_reconciler_sync_duration_seconds", "histogram", &["ip_family"]),
    ("kubeproxy_conntrack_reconciler_deleted_entries_total", "counter", &["ip_family"]),
    ("kproxy_conntrack_cleanup_failures_total", "counter", &["ip_family"]),
    ("kproxy_invalid_objects_total", "counter", &["kind"]),
    ("kproxy_masquerade_policy_info", "gauge", &["ip_family", "no_masquerade_cidrs", "source"]),
    ("kproxy_service_healthcheck_bind_failures_total", "counter", &[]),
    ("kproxy_sync_proxy_rules_drift_repairs_total", "counter", &[]),
    ("kubeproxy_accelerated_connections_count_total", "counter", &[]),
    // What every Kubernetes component exports.
    ("process_cpu_seconds_total", "counter", &[]),
    ("process_resident_memory_bytes", "gauge", &[]),
    ("process_virtual_memory_bytes", "gauge", &[]),
    ("process_start_time_seconds", "gauge", &[]),
    ("process_open_fds", "gauge", &[]),
    ("process_max_fds", "gauge", &[]),
    (
        "kubernetes_build_info",
        "gauge",
        &[
            "build_date",
            "compiler",
            "git_commit",
            "git_tree_state",
            "git_version",
            "go_version",
            "major",
            "minor",
            "platform",
        ],
    ),
    ("kubernetes_feature_enabled", "gauge", &["name", "stage"]),
    ("kproxy_acceleration_supported", "gauge", &[]),
];

const NFTABLES_ONLY: &[(&str, &str, &[&str])] = &[
    ("kubeproxy_sync_proxy_rules_nftables_sync_failures_total", "counter", &["ip_family"]),
    ("kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total", "counter", &["ip_family"]),
];

const IPTABLES_ONLY: &[(&str, &str, &[&str])] = &[
    ("kubeproxy_sync_proxy_rules_iptables_restore_failures_total", "counter", &["ip_family"]),
    ("kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", "counter", &["ip_family"]),
    ("kubeproxy_sync_proxy_rules_iptables_total", "gauge", &["ip_family", "table"]),
    ("kubeproxy_sync_proxy_rules_iptables_last", "gauge", &["ip_family", "table"]),
];

fn prometheus_type(t: &PrometheusType) -> &'static str {
    match t {
        PrometheusType::Counter => "counter",
        PrometheusType::Gauge => "gauge",
        PrometheusType::Histogram => "histogram",
        PrometheusType::Summary => "summary",
        PrometheusType::Unknown => "unknown",
    }
}

fn sorted(names: &[String]) -> Vec<String> {
    let mut names = names.to_vec();
    names.sort();
    names
}

/// Parses Prometheus text with the real parser and checks every expected family and nothing else.
fn assert_prometheus_families(text: &str, expected: &[(&str, &str, &[&str])]) {
    let exposition = openmetrics_parser::prometheus::parse_prometheus(text)
        .unwrap_or_else(|e| panic!("not valid Prometheus text: {e:?}\n{text}"));
    let found: BTreeMap<&str, (&'static str, Vec<String>)> = exposition
        .families
        .iter()
        .map(|(name, f)| (name.as_str(), (prometheus_type(&f.family_type), sorted(f.get_label_names()))))
        .collect();
    let wanted: BTreeMap<&str, (&'static str, Vec<String>)> = expected
        .iter()
        .map(|(name, t, labels)| {
            let t: &'static str = match *t {
                "counter" => "counter",
                "gauge" => "gauge",
                _ => "histogram",
            };
            (*name, (t, labels.iter().map(|l| l.to_string()).collect()))
        })
        .collect();
    assert_eq!(found, wanted);

    // Values made it through.
    let family = &exposition.families["kubeproxy_sync_proxy_rules_endpoint_changes_total"];
    let sample = family.iter_samples().next().unwrap();
    match &sample.value {
        PrometheusValue::Counter(c) => assert_eq!(c.value.as_f64(), 10.0),
        other => panic!("{other:?}"),
    }
    let sync = &exposition.families["kubeproxy_sync_proxy_rules_duration_seconds"];
    assert_eq!(sync.iter_samples().count(), 2, "one series per IP family");
    for sample in sync.iter_samples() {
        let PrometheusValue::Histogram(h) = &sample.value else { panic!("{:?}", sample.value) };
        assert_eq!(h.count, Some(3));
        let bounds: Vec<f64> = h.buckets.iter().map(|b| b.upper_bound).collect();
        let mut want = sync_duration_buckets();
        want.push(f64::INFINITY);
        assert_eq!(bounds, want);
        let counts: Vec<f64> = h.buckets.iter().map(|b| b.count.as_f64()).collect();
        // 0.7 ms ≤ 1 ms, 3 ms ≤ 4 ms, 40 s only in +Inf.
        assert_eq!(counts[0], 1.0);
        assert_eq!(counts[1], 1.0);
        assert_eq!(counts[2], 2.0);
        assert_eq!(counts[14], 2.0);
        assert_eq!(counts[15], 3.0);
    }
}

/// Our own strict reading of the text formats: every sample belongs to the family declared by the
/// closest `# TYPE` line, no family is declared twice, histogram bucket bounds strictly increase and
/// end in `+Inf`, cumulative counts never decrease, and `_count` equals the `+Inf` bucket.
fn strict_check(text: &str, openmetrics: bool) -> BTreeMap<String, Vec<Vec<(String, f64)>>> {
    let mut current: Option<(String, String)> = None;
    let mut buckets: BTreeMap<String, Vec<Vec<(String, f64)>>> = BTreeMap::new();
    #[allow(clippy::type_complexity)]
    let mut open: BTreeMap<String, (String, Vec<(String, f64)>, Option<f64>)> = BTreeMap::new();
    let mut seen_types = std::collections::BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(seen_types.insert(name.to_string()), "family {name} declared twice");
            current = Some((name.to_string(), kind.to_string()));
            continue;
        }
        if line.starts_with("# HELP ") || line == "# EOF" {
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment {line:?}");
        let (family, kind) = current.clone().expect("sample before any # TYPE");
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').unwrap()),
            None => (series, ""),
        };
        let allowed: Vec<String> = match kind.as_str() {
            "histogram" => ["_bucket", "_sum", "_count"].iter().map(|s| format!("{family}{s}")).collect(),
            "counter" if openmetrics => vec![format!("{family}_total")],
            _ => vec![family.clone()],
        };
        assert!(allowed.iter().any(|a| a == name), "sample {name} does not belong to {kind} {family}");
        if kind == "histogram" {
            let other_labels: Vec<&str> = labels.split(',').filter(|l| !l.starts_with("le=")).collect();
            let key = format!("{family}{{{}}}", other_labels.join(","));
            let entry = open.entry(key).or_insert_with(|| (family.clone(), Vec::new(), None));
            if name.ends_with("_bucket") {
                let le = labels.split(',').find_map(|l| l.strip_prefix("le=")).unwrap().trim_matches('"');
                entry.1.push((le.to_string(), value));
            } else if name.ends_with("_count") {
                assert!(entry.2.replace(value).is_none(), "two _count samples");
            }
        }
    }
    // Sample order within a series differs between the formats (OpenMetrics as encoded here puts
    // _sum and _count first), so the series are judged once complete.
    for (key, (family, series, count)) in open {
        let count = count.unwrap_or_else(|| panic!("{key} has no _count"));
        let bounds: Vec<f64> = series.iter().map(|(le, _)| le.parse::<f64>().unwrap()).collect();
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "le not increasing in {key}: {bounds:?}");
        assert_eq!(series.last().map(|(le, _)| le.as_str()), Some("+Inf"), "{key} does not end in +Inf");
        assert!(series.windows(2).all(|w| w[0].1 <= w[1].1), "counts decrease in {key}");
        assert_eq!(series.last().map(|(_, c)| *c), Some(count), "{key}: _count differs from the +Inf bucket");
        buckets.entry(family).or_default().push(series);
    }
    buckets
}

#[tokio::test]
async fn scraped_prometheus_text_has_upstreams_families_types_labels_and_buckets() {
    let metrics = populated(DataplaneMode::Nftables);
    let info = MetricsServerInfo {
        proxy_mode: "nftables".into(),
        config: serde_json::json!({"mode": "nftables", "metricsBindAddress": "127.0.0.1:10249"}),
        explainer: None,
    };
    let server = serve_metrics(loopback(), metrics, info).await.unwrap();
    let r = get(server.local_addr(), "/metrics").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/plain; version=0.0.4; charset=utf-8"));
    assert!(!r.body.contains("# EOF"), "Prometheus text has no EOF marker");

    let expected: Vec<_> = COMMON.iter().chain(NFTABLES_ONLY).copied().collect();
    assert_prometheus_families(&r.body, &expected);

    let histograms = strict_check(&r.body, false);
    let np = &histograms["kubeproxy_network_programming_duration_seconds"];
    assert_eq!(np.len(), 2);
    let bounds: Vec<f64> = np[0].iter().take_while(|(le, _)| le != "+Inf").map(|(le, _)| le.parse().unwrap()).collect();
    assert_eq!(bounds, network_programming_buckets());
    // 0.3 s lands in le=0.5 (not 0.25); 75 s in le=75.
    let count_at = |le: f64| np[0].iter().find(|(b, _)| b.parse::<f64>().ok() == Some(le)).unwrap().1;
    assert_eq!((count_at(0.25), count_at(0.5), count_at(70.0), count_at(75.0)), (0.0, 1.0, 1.0, 2.0));

    // Integral bounds are spelled as Go spells them, so `{le="1"}` in existing queries matches.
    assert!(r.body.contains("kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv4\",le=\"1\"} 1\n"));
    assert!(r.body.contains("kubeproxy_network_programming_duration_seconds_bucket{ip_family=\"IPv4\",le=\"0\"} 0\n"));
    assert!(!r.body.contains(".0\"}"), "no bound written as N.0");

    // Labels carry upstream's values.
    assert!(r.body.contains("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv6\"} 1700000000"));
    assert!(r.body.contains(
        "kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family=\"IPv4\",traffic_policy=\"internal\"} 2"
    ));
    assert!(r.body.contains("kubeproxy_proxy_healthz_total{code=\"503\"} 1"));
    assert!(r.body.contains("kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family=\"IPv4\"} 5"));
    assert!(r.body.contains("kproxy_invalid_objects_total{kind=\"Service\"} 1"));
}

#[tokio::test]
async fn openmetrics_is_served_when_asked_for_and_parses() {
    let server = serve_metrics(
        loopback(),
        populated(DataplaneMode::Nftables),
        MetricsServerInfo { proxy_mode: "nftables".into(), config: serde_json::Value::Null, explainer: None },
    )
    .await
    .unwrap();
    let r = get_with(server.local_addr(), "/metrics", &[("Accept", OPENMETRICS_ACCEPT)]).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/openmetrics-text; version=1.0.0; charset=utf-8"));
    assert!(r.body.ends_with("# EOF\n"), "OpenMetrics must end with # EOF");

    let exposition = openmetrics_parser::openmetrics::parse_openmetrics(&r.body)
        .unwrap_or_else(|e| panic!("not valid OpenMetrics: {e:?}\n{}", r.body));
    // OpenMetrics names counter families without `_total`; the samples keep it.
    let counters = &exposition.families["kubeproxy_sync_proxy_rules_service_changes"];
    assert_eq!(counters.family_type, OpenMetricsType::Counter);
    match &counters.iter_samples().next().unwrap().value {
        OpenMetricsValue::Counter(c) => assert_eq!(c.value.as_f64(), 3.0),
        other => panic!("{other:?}"),
    }
    assert!(r.body.contains("\nkubeproxy_sync_proxy_rules_service_changes_total 3\n"));
    let gauge = &exposition.families["kubeproxy_sync_proxy_rules_no_local_endpoints_total"];
    assert_eq!(gauge.family_type, OpenMetricsType::Gauge);
    let hist = &exposition.families["kubeproxy_network_programming_duration_seconds"];
    assert_eq!(hist.family_type, OpenMetricsType::Histogram);
    assert_eq!(sorted(hist.get_label_names()), vec!["ip_family".to_string()]);
    strict_check(&r.body, true);
}

#[tokio::test]
async fn mode_specific_families_follow_the_dataplane() {
    let iptables = populated(DataplaneMode::Iptables).encode(kproxy_servers::Exposition::PrometheusText).unwrap();
    let expected: Vec<_> = COMMON.iter().chain(IPTABLES_ONLY).copied().collect();
    assert_prometheus_families(&iptables, &expected);
    strict_check(&iptables, false);
    assert!(iptables.contains("kubeproxy_sync_proxy_rules_iptables_total{ip_family=\"IPv4\",table=\"nat\"} 120"));

    let ipvs = populated(DataplaneMode::Ipvs).encode(kproxy_servers::Exposition::PrometheusText).unwrap();
    let expected: Vec<_> = COMMON.iter().chain(&IPTABLES_ONLY[..1]).copied().collect();
    assert_prometheus_families(&ipvs, &expected);
}

/// The kernel's packet counters of iptables mode, as a test sets them.
#[derive(Debug)]
struct FakePackets(std::sync::Mutex<Result<kproxy_servers::PacketCounts, String>>);

impl kproxy_servers::PacketCounters for FakePackets {
    fn read(&self) -> Result<kproxy_servers::PacketCounts, String> {
        self.0.lock().unwrap().clone()
    }
}

const NFACCT: &[(&str, &str, &[&str])] = &[
    ("kubeproxy_iptables_ct_state_invalid_dropped_packets_total", "counter", &[]),
    ("kubeproxy_iptables_localhost_nodeports_accepted_packets_total", "counter", &[]),
];

/// Upstream's nfacct counters: label-less counters with upstream's HELP (as written: collected
/// families get no full stop appended), read at each scrape,
/// exported only while the dataplane has a count for them.
#[tokio::test]
async fn nfacct_packet_counters_are_read_at_each_scrape_and_absent_without_a_count() {
    use kproxy_servers::PacketCounts;
    let metrics = populated(DataplaneMode::Iptables);
    let text = || metrics.encode(kproxy_servers::Exposition::PrometheusText).unwrap();
    let iptables: Vec<_> = COMMON.iter().chain(IPTABLES_ONLY).copied().collect();
    assert_prometheus_families(&text(), &iptables);

    let fake = std::sync::Arc::new(FakePackets(std::sync::Mutex::new(Ok(PacketCounts {
        ct_state_invalid_dropped: Some(7),
        localhost_nodeports_accepted: Some(0),
    }))));
    metrics.set_packet_counters(fake.clone());
    let scraped = text();
    assert_prometheus_families(&scraped, &iptables.iter().chain(NFACCT).copied().collect::<Vec<_>>());
    strict_check(&scraped, false);
    for line in [
        "# HELP kubeproxy_iptables_ct_state_invalid_dropped_packets_total packets dropped by iptables to work around conntrack problems",
        "# TYPE kubeproxy_iptables_ct_state_invalid_dropped_packets_total counter",
        "kubeproxy_iptables_ct_state_invalid_dropped_packets_total 7",
        "# HELP kubeproxy_iptables_localhost_nodeports_accepted_packets_total Number of packets accepted on nodeports of loopback interface",
        "kubeproxy_iptables_localhost_nodeports_accepted_packets_total 0",
    ] {
        assert!(scraped.lines().any(|l| l == line), "no {line:?} in\n{scraped}");
    }
    let openmetrics = metrics.encode(kproxy_servers::Exposition::OpenMetrics).unwrap();
    assert!(openmetrics.contains("\nkubeproxy_iptables_ct_state_invalid_dropped_packets_total 7\n"), "{openmetrics}");
    strict_check(&openmetrics, true);

    // Each scrape reads the kernel again.
    *fake.0.lock().unwrap() =
        Ok(PacketCounts { ct_state_invalid_dropped: Some(9), localhost_nodeports_accepted: Some(3) });
    let scraped = text();
    assert!(scraped.contains("\nkubeproxy_iptables_ct_state_invalid_dropped_packets_total 9\n"), "{scraped}");
    assert!(scraped.contains("\nkubeproxy_iptables_localhost_nodeports_accepted_packets_total 3\n"), "{scraped}");
    // A counter the dataplane does not keep, or a failed read, is no family at all.
    *fake.0.lock().unwrap() =
        Ok(PacketCounts { ct_state_invalid_dropped: Some(9), localhost_nodeports_accepted: None });
    assert_prometheus_families(&text(), &iptables.iter().chain(&NFACCT[..1]).copied().collect::<Vec<_>>());
    *fake.0.lock().unwrap() = Err("netlink: no such subsystem".into());
    assert_prometheus_families(&text(), &iptables);
}

#[tokio::test]
async fn the_metrics_port_also_serves_ping_proxy_mode_and_configz() {
    let config = serde_json::json!({"mode": "nftables", "nftables": {"syncPeriod": "30s"}});
    let server = serve_metrics(
        loopback(),
        Metrics::new(DataplaneMode::Nftables),
        MetricsServerInfo { proxy_mode: "nftables".into(), config: config.clone(), explainer: None },
    )
    .await
    .unwrap();
    let addr = server.local_addr();

    let r = get(addr, "/healthz").await.unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "ok"));
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    let r = get(addr, "/proxyMode").await.unwrap();
    assert_eq!((r.status, r.body.as_str()), (200, "nftables"));
    let r = get(addr, "/configz").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body, serde_json::json!({"kubeproxy.config.k8s.io": config}));
    assert_eq!(get(addr, "/nothing").await.unwrap().status, 404);
}

#[tokio::test]
async fn debug_explain_hands_the_parsed_query_to_the_explainer_and_maps_its_failures() {
    use kproxy_servers::{ExplainUnavailable, Explainer};
    // Echoes the query; answers "not synced" for one source, to check the status mapping.
    let explainer = Explainer::new(|q| async move {
        if q.from.to_string() == "192.0.2.99" {
            return Err(ExplainUnavailable::NotSynced);
        }
        Ok(serde_json::json!({"from": q.from.to_string(), "to": q.to.to_string(), "protocol": q.protocol.as_str()}))
    });
    let info = MetricsServerInfo {
        proxy_mode: "nftables".into(),
        config: serde_json::Value::Null,
        explainer: Some(explainer),
    };
    let server = serve_metrics(loopback(), populated(DataplaneMode::Nftables), info).await.unwrap();
    let r = get(server.local_addr(), "/debug/explain?from=203.0.113.7&to=198.18.128.10:80&protocol=udp").await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body, serde_json::json!({"from": "203.0.113.7", "to": "198.18.128.10:80", "protocol": "udp"}));
    let bad = get(server.local_addr(), "/debug/explain?from=203.0.113.7").await.unwrap();
    assert_eq!(bad.status, 400, "{}", bad.body);
    let unsynced = get(server.local_addr(), "/debug/explain?from=192.0.2.99&to=198.18.128.10:80").await.unwrap();
    assert_eq!(unsynced.status, 503, "{}", unsynced.body);

    let without = serve_metrics(
        loopback(),
        populated(DataplaneMode::Nftables),
        MetricsServerInfo { proxy_mode: "nftables".into(), config: serde_json::Value::Null, explainer: None },
    )
    .await
    .unwrap();
    let r = get(without.local_addr(), "/debug/explain?from=203.0.113.7&to=198.18.128.10:80").await.unwrap();
    assert_eq!(r.status, 404);
}

#[test]
fn service_connections_follow_the_kernel_counts_across_a_counter_restart() {
    use kproxy_servers::{Exposition, ServiceConnections};
    let metrics = Metrics::new(DataplaneMode::Nftables);
    let count = |total| ServiceConnections {
        family: IpFamily::V4,
        namespace: "demo".into(),
        service: "web".into(),
        port: "http".into(),
        protocol: "tcp".into(),
        verdict: "served",
        total,
    };
    let series = "kproxy_service_new_connections_total{ip_family=\"IPv4\",namespace=\"demo\",service=\"web\",port=\"http\",protocol=\"tcp\",verdict=\"served\"}";
    let value = |m: &Metrics| {
        let text = m.encode(Exposition::PrometheusText).unwrap();
        text.lines().find_map(|l| l.strip_prefix(series)?.trim().parse::<u64>().ok())
    };
    metrics.set_service_connections([count(0)]);
    assert_eq!(value(&metrics), Some(0), "a counted port is exported from zero");
    metrics.set_service_connections([count(7)]);
    metrics.set_service_connections([count(10)]);
    assert_eq!(value(&metrics), Some(10));
    // The element was recreated: its counter restarted at 0 and has counted 3 since.
    metrics.set_service_connections([count(3)]);
    assert_eq!(value(&metrics), Some(13));
}

#[test]
fn service_packets_and_bytes_are_series_of_their_own_with_the_same_labels() {
    use kproxy_servers::{Exposition, ServiceConnections};
    let metrics = Metrics::new(DataplaneMode::Nftables);
    let count = |verdict, total| ServiceConnections {
        family: IpFamily::V6,
        namespace: "demo".into(),
        service: "web".into(),
        port: "".into(),
        protocol: "udp".into(),
        verdict,
        total,
    };
    let labels = |verdict: &str| {
        format!(
            "{{ip_family=\"IPv6\",namespace=\"demo\",service=\"web\",port=\"\",protocol=\"udp\",verdict=\"{verdict}\"}}"
        )
    };
    let value = |m: &Metrics, name: &str, verdict: &str| {
        let text = m.encode(Exposition::PrometheusText).unwrap();
        let series = format!("{name}{}", labels(verdict));
        text.lines().find_map(|l| l.strip_prefix(series.as_str())?.trim().parse::<u64>().ok())
    };
    metrics.set_service_packets([count("served", 40), count("rejected_no_endpoints", 2)]);
    metrics.set_service_bytes([count("served", 9000), count("rejected_no_endpoints", 120)]);
    assert_eq!(value(&metrics, "kproxy_service_packets_total", "served"), Some(40));
    assert_eq!(value(&metrics, "kproxy_service_packets_total", "rejected_no_endpoints"), Some(2));
    assert_eq!(value(&metrics, "kproxy_service_bytes_total", "served"), Some(9000));
    assert_eq!(value(&metrics, "kproxy_service_bytes_total", "rejected_no_endpoints"), Some(120));
    // Each kind follows its own kernel counts: bytes going back to a restarted element's count
    // do not move packets, and neither feeds the connection counts.
    metrics.set_service_bytes([count("served", 500)]);
    assert_eq!(value(&metrics, "kproxy_service_bytes_total", "served"), Some(9500));
    assert_eq!(value(&metrics, "kproxy_service_packets_total", "served"), Some(40));
    assert_eq!(value(&metrics, "kproxy_service_new_connections_total", "served"), None);
}

/// An explainer that answers every query with 200.
fn always_explains() -> kproxy_servers::Explainer {
    kproxy_servers::Explainer::new(|_| async { Ok(serde_json::json!({"ok": true})) })
}

async fn explain_server(explainer: kproxy_servers::Explainer) -> kproxy_servers::RunningServer {
    let info = MetricsServerInfo {
        proxy_mode: "nftables".into(),
        config: serde_json::Value::Null,
        explainer: Some(explainer),
    };
    serve_metrics(loopback(), populated(DataplaneMode::Nftables), info).await.unwrap()
}

#[tokio::test]
async fn debug_explain_answers_at_most_its_rate_and_then_429_until_the_bucket_refills() {
    let server = explain_server(always_explains().with_access(kproxy_servers::ExplainAccess::Any)).await;
    let addr = server.local_addr();
    let query = "/debug/explain?from=203.0.113.7&to=198.18.128.10:80";
    let rate = kproxy_servers::EXPLAIN_RATE as usize;
    let started = std::time::Instant::now();
    let asked: Vec<_> = (0..5 * rate).map(|_| tokio::spawn(get(addr, query))).collect();
    let mut statuses = Vec::new();
    for a in asked {
        statuses.push(a.await.unwrap().unwrap().status);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let answered = statuses.iter().filter(|s| **s == 200).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(answered + limited, statuses.len(), "{statuses:?}");
    // The burst, plus what refilled while the questions came (however slow the machine).
    let allowed = rate + (elapsed * rate as f64).ceil() as usize;
    assert!(answered >= rate && answered <= allowed, "{answered} answered in {elapsed:.2} s: {statuses:?}");
    assert!(limited > 0 || allowed >= statuses.len(), "{statuses:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(get(addr, query).await.unwrap().status, 200, "refilled");
    // Metrics are never limited.
    for _ in 0..30 {
        assert_eq!(get(addr, "/metrics").await.unwrap().status, 200);
    }
}

#[tokio::test]
async fn debug_explain_for_the_node_only_answers_loopback_and_refuses_long_queries() {
    let server = explain_server(always_explains()).await;
    let ok = get(server.local_addr(), "/debug/explain?from=203.0.113.7&to=198.18.128.10:80").await.unwrap();
    assert_eq!(ok.status, 200, "a loopback client is the node itself: {}", ok.body);
    let long = format!("/debug/explain?from=203.0.113.7&to=198.18.128.10:80&{}", "x".repeat(600));
    assert_eq!(get(server.local_addr(), &long).await.unwrap().status, 400);
}

#[test]
fn a_client_is_the_node_itself_when_loopback_or_connected_from_the_address_it_reached() {
    use kproxy_servers::ConnInfo;
    let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
    let node = |peer: &str, local: &str| ConnInfo { peer: sa(peer), local: sa(local) }.from_this_node();
    assert!(node("127.0.0.1:5000", "127.0.0.1:10249"));
    assert!(node("[::1]:5000", "[::1]:10249"));
    assert!(node("198.18.0.2:5000", "198.18.0.2:10249"), "a process on the node using the node's address");
    assert!(node("[::ffff:198.18.0.2]:5000", "198.18.0.2:10249"), "dual-stack sockets see IPv4 as mapped");
    assert!(!node("198.18.16.5:5000", "198.18.0.2:10249"), "a pod");
    assert!(!node("198.18.0.10:5000", "198.18.0.2:10249"), "another host");
}

#[tokio::test]
async fn a_request_with_a_body_is_refused_and_its_connection_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = explain_server(always_explains()).await;
    let mut stream = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    stream
        .write_all(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nxxxxxxxxxxxxxxxx")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    // The same server still answers a plain GET.
    assert_eq!(get(server.local_addr(), "/metrics").await.unwrap().status, 200);
}

#[tokio::test]
async fn a_request_head_larger_than_the_limit_is_not_read() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = explain_server(always_explains()).await;
    let mut stream = tokio::net::TcpStream::connect(server.local_addr()).await.unwrap();
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(4 * kproxy_servers::MAX_HEAD_BYTES)
    );
    let _ = stream.write_all(huge.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await.unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.is_empty() || text.starts_with("HTTP/1.1 431"), "no 200 for an oversized head: {text}");
    assert_eq!(get(server.local_addr(), "/metrics").await.unwrap().status, 200, "and the server goes on");
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_until_one_closes() {
    let server = explain_server(always_explains()).await;
    let addr = server.local_addr();
    let mut idle = Vec::new();
    for _ in 0..kproxy_servers::MAX_CONNECTIONS {
        idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // Give the server time to take them all in (accepting is what the cap stops).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiting = tokio::spawn(get(addr, "/metrics"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "a connection beyond the cap was served");
    idle.pop();
    let answered = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap().unwrap();
    assert_eq!(answered.status, 200, "served once a slot freed");
}

//! The KubeProxyConfiguration file: real upstream-style documents parse to the expected values, and
//! every malformed one fails with an error naming the field at fault.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{fixture, with_config};
use kproxy_config::{ConfigError, DetectLocal, IpvsScheduler, LogFormat, NodePortAddress, ProxyMode};

fn net(s: &str) -> ipnet::IpNet {
    s.parse().unwrap()
}

#[test]
fn kubeadm_configmap_parses_with_upstream_defaults() {
    let c = with_config("kubeadm.yaml", &[]).unwrap();
    // Mode unset: kube-proxy would run iptables, serving NodePorts on every local address and on
    // 127.0.0.1 (localhostNodePorts defaults to true). kproxy's nftables mode cannot serve the
    // latter, so kproxy runs iptables too, and says why.
    assert_eq!(c.mode, ProxyMode::Iptables);
    assert_eq!(c.node_port_addresses, vec![NodePortAddress::All]);
    assert!(
        c.warnings.iter().any(|w| w.contains("mode is unset: kproxy runs iptables") && w.contains("127.0.0.1")),
        "{:?}",
        c.warnings
    );
    // Zero values were defaulted exactly as upstream's SetDefaults_KubeProxyConfiguration.
    assert_eq!(c.sync_period, Duration::from_secs(30));
    assert_eq!(c.min_sync_period, Duration::from_secs(1));
    assert_eq!(c.config_sync_period, Duration::from_secs(900));
    assert_eq!(c.healthz_bind_address, Some("0.0.0.0:10256".parse::<SocketAddr>().unwrap()));
    assert_eq!(c.metrics_bind_address, Some("127.0.0.1:10249".parse::<SocketAddr>().unwrap()));
    assert_eq!(c.masquerade_bit, 14);
    assert_eq!(c.masquerade_mark(), 0x4000);
    assert!(c.localhost_node_ports);
    assert_eq!(c.oom_score_adj, -999);
    assert_eq!(c.conntrack.max_per_core, 32768);
    assert_eq!(c.conntrack.min, 131072);
    assert_eq!(c.conntrack.tcp_established_timeout, Duration::from_secs(86400));
    assert_eq!(c.conntrack.tcp_close_wait_timeout, Duration::from_secs(3600));
    assert_eq!(c.client_connection.qps, 5.0);
    assert_eq!(c.client_connection.burst, 10);
    // kubeadm leaves contentType empty: upstream's default, protobuf.
    assert_eq!(c.client_connection.content_type, "application/vnd.kubernetes.protobuf");
    assert_eq!(
        c.client_connection.kubeconfig.as_deref(),
        Some(std::path::Path::new("/var/lib/kube-proxy/kubeconfig.conf"))
    );
    assert_eq!(c.logging.flush_frequency, Duration::from_secs(5));
    assert_eq!(c.detect_local, DetectLocal::ClusterCidr(vec![net("10.244.0.0/16"), net("fd00:10:244::/56")]));
    assert_eq!(c.ipvs, None, "the ipvs section is only used in ipvs mode");
    assert!(c.acceleration.active());
    assert_eq!(c.acceleration.packet_threshold, 20);
    assert_eq!(c.config_file, Some(fixture("kubeadm.yaml")));
}

#[test]
fn json_document_with_every_section_tuned() {
    let c = with_config("tuned.json", &[]).unwrap();
    assert_eq!(c.mode, ProxyMode::Nftables);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    // Explicit nftables mode reads the nftables section, not the iptables one.
    assert_eq!(c.sync_period, Duration::from_secs(60));
    assert_eq!(c.min_sync_period, Duration::from_millis(500));
    assert!(c.masquerade_all);
    assert_eq!(c.masquerade_bit, 12);
    assert_eq!(c.client_connection.qps, 50.0);
    assert_eq!(c.client_connection.burst, 100);
    assert_eq!(c.hostname_override.as_deref(), Some("node-a"));
    assert_eq!(c.bind_address, "fd00::10".parse::<std::net::IpAddr>().unwrap());
    // IPv6 bindAddress moves the defaulted healthz server to [::].
    assert_eq!(c.healthz_bind_address, Some("[::]:10256".parse().unwrap()));
    assert_eq!(c.metrics_bind_address, Some("0.0.0.0:10249".parse().unwrap()));
    assert_eq!(c.detect_local, DetectLocal::InterfaceNamePrefix("veth".into()));
    assert_eq!(c.node_port_addresses, vec![NodePortAddress::Cidr(net("198.51.100.0/24")), NodePortAddress::Primary]);
    assert_eq!(c.conntrack.max_per_core, 0);
    assert_eq!(
        c.conntrack.tcp_established_timeout,
        Duration::ZERO,
        "explicit 0s for a pointer field means leave as-is"
    );
    assert!(c.conntrack.tcp_be_liberal);
    assert_eq!(c.conntrack.udp_timeout, Duration::from_secs(30));
    assert_eq!(c.feature_gates.get("NFTablesNetlink"), Some(&true));
    assert_eq!(c.logging.format, LogFormat::Json);
    assert_eq!(c.logging.verbosity, 2);
    assert_eq!(c.logging.flush_frequency, Duration::from_secs(10));
    assert_eq!(c.no_masquerade_cidrs, vec![net("198.18.0.0/15"), net("fd00:10:244::/56")]);
    assert!(c.snat_to_node_ip);
    assert!(!c.acceleration.enabled);
    assert_eq!(c.acceleration.packet_threshold, 50);
}

#[test]
fn ipvs_document_uses_ipvs_section_and_iptables_masquerade_settings() {
    let c = with_config("ipvs.yaml", &[]).unwrap();
    assert_eq!(c.mode, ProxyMode::Ipvs);
    assert_eq!(c.sync_period, Duration::from_secs(45));
    assert_eq!(c.min_sync_period, Duration::from_secs(2));
    assert_eq!(c.masquerade_bit, 15);
    assert!(c.masquerade_all);
    assert_eq!(c.node_port_addresses, vec![NodePortAddress::All], "unset nodePortAddresses means all outside nftables");
    let ipvs = c.ipvs.expect("ipvs settings in ipvs mode");
    assert_eq!(ipvs.scheduler, IpvsScheduler::Wlc);
    assert_eq!(ipvs.exclude_cidrs, vec![net("203.0.113.0/24")]);
    assert!(ipvs.strict_arp);
    assert_eq!(ipvs.tcp_timeout, Duration::from_secs(900));
}

/// (fixture, field the error must name, a fragment of the message)
const MALFORMED: &[(&str, &str, &str)] = &[
    ("bad-duration.yaml", "iptables.syncPeriod", "invalid duration \"3x\""),
    ("bad-duration.json", "ipvs.tcpFinTimeout", "invalid duration \"1 minute\""),
    (
        "unknown-top-level-field.yaml",
        "clusterCidr",
        "unknown field (kproxy rejects fields it does not know); did you mean `clusterCIDR`?",
    ),
    ("unknown-nested-field.yaml", "conntrack.maxPerCPU", "unknown field"),
    ("masquerade-bit-out-of-range.yaml", "iptables.masqueradeBit", "[0, 31]"),
    ("bad-mode.yaml", "mode", "\"userspace\""),
    ("bad-detect-local-mode.yaml", "detectLocalMode", "\"PodCIDR\""),
    ("bridge-interface-missing.yaml", "detectLocal.bridgeInterface", "must not be empty"),
    ("bad-cluster-cidr.yaml", "clusterCIDR", "\"not-a-cidr\" is not a valid CIDR"),
    ("cluster-cidr-same-family.yaml", "clusterCIDR", "dual-stack pair"),
    ("bad-nodeport-address.yaml", "nodePortAddresses[1]", "\"192.0.2.7\""),
    ("bad-bind-address.yaml", "bindAddress", "\"192.0.2.300\""),
    ("healthz-without-ip.yaml", "healthzBindAddress", "valid IP"),
    ("metrics-bad-port.yaml", "metricsBindAddress", "port in 1..65535"),
    ("negative-conntrack.yaml", "conntrack.min", "greater than or equal to 0"),
    ("negative-udp-timeout.yaml", "conntrack.udpTimeout", "\"-5s\""),
    ("min-sync-above-sync.yaml", "nftables.syncPeriod", "greater than or equal to nftables.minSyncPeriod"),
    ("bad-ipvs-scheduler.yaml", "ipvs.scheduler", "\"fastest\""),
    ("bad-ipvs-exclude-cidr.yaml", "ipvs.excludeCIDRs[1]", "\"203.0.113.9\""),
    ("oom-score-out-of-range.yaml", "oomScoreAdj", "[-1000, 1000]"),
    ("bad-no-masquerade-cidr.yaml", "noMasqueradeCIDRs[1]", "\"fd00::/129\""),
    ("negative-packet-threshold.yaml", "acceleration.packetThreshold", "\"-1\""),
    ("wrong-type.yaml", "iptables.masqueradeAll", "invalid type"),
    ("duration-as-number.yaml", "configSyncPeriod", "duration string"),
    ("bad-logging-format.yaml", "logging.format", "\"xml\""),
    ("wrong-api-version.yaml", "apiVersion", "kubeproxy.config.k8s.io/v1alpha2"),
    ("wrong-kind.yaml", "kind", "KubeletConfiguration"),
    ("missing-api-version.yaml", "apiVersion", "missing"),
];

#[test]
fn each_malformed_config_names_its_field() {
    let mut failures = Vec::new();
    for (file, field, fragment) in MALFORMED {
        match with_config(&format!("invalid/{file}"), &[]) {
            Ok(_) => failures.push(format!("{file}: accepted")),
            Err(err) => {
                let message = err.to_string();
                if err.fields() != vec![*field] {
                    failures.push(format!("{file}: fields {:?}, want [{field}] ({message})", err.fields()));
                }
                if !message.contains(field) || !message.contains(fragment) {
                    failures.push(format!("{file}: message {message:?} lacks {field:?} or {fragment:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_invalid_fixture_is_covered() {
    let dir = fixture("invalid");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "yaml-syntax.yaml")
        .collect();
    names.sort();
    let mut covered: Vec<String> = MALFORMED.iter().map(|(f, _, _)| f.to_string()).collect();
    covered.sort();
    assert_eq!(names, covered);
}

#[test]
fn yaml_syntax_error_is_reported_with_the_file() {
    let err = with_config("invalid/yaml-syntax.yaml", &[]).unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("yaml-syntax.yaml") && message.contains("invalid YAML"), "{message}");
}

#[test]
fn missing_file_is_a_read_error() {
    let err = with_config("does-not-exist.yaml", &[]).unwrap_err();
    assert!(matches!(err, ConfigError::Read { .. }), "{err:?}");
}

#[test]
fn all_problems_are_reported_at_once() {
    let dir = std::env::temp_dir().join(format!("kproxy-config-multi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("multi.yaml");
    std::fs::write(
        &path,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         mode: iptables\noomScoreAdj: 5000\niptables:\n  masqueradeBit: -1\n  minSyncPeriod: -1s\n",
    )
    .unwrap();
    let err = kproxy_config::resolve(&common::flags(&["--config", path.to_str().unwrap()])).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    let mut fields = err.fields();
    fields.sort();
    assert_eq!(fields, vec!["iptables.masqueradeBit", "iptables.minSyncPeriod", "oomScoreAdj"]);
}

#[test]
fn unset_mode_runs_nftables_only_where_it_serves_what_iptables_would() {
    // Without localhost NodePorts, nftables serves what kube-proxy's iptables default serves:
    // NodePorts on every local address (not nftables' own `primary` default).
    let c = with_config("kubeadm.yaml", &["--iptables-localhost-nodeports=false"]).unwrap();
    assert_eq!((c.mode, c.localhost_node_ports), (ProxyMode::Iptables, true), "flags are ignored with --config");
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(fixture("kubeadm.yaml")).unwrap();
    let cases = [
        ("localhostNodePorts: null", "localhostNodePorts: false", ProxyMode::Nftables, vec![NodePortAddress::All]),
        (
            "nodePortAddresses: null",
            "nodePortAddresses: [\"198.51.100.0/24\"]",
            ProxyMode::Nftables,
            vec![NodePortAddress::Cidr(net("198.51.100.0/24"))],
        ),
        (
            "nodePortAddresses: null",
            "nodePortAddresses: [\"127.0.0.0/8\"]",
            ProxyMode::Iptables,
            vec![NodePortAddress::Cidr(net("127.0.0.0/8"))],
        ),
    ];
    for (from, to, mode, addresses) in cases {
        assert!(text.contains(from), "the kubeadm fixture has {from}");
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, text.replace(from, to)).unwrap();
        let c = kproxy_config::resolve(&common::flags(&[&format!("--config={}", path.display())])).unwrap();
        assert_eq!((c.mode, &c.node_port_addresses), (mode, &addresses), "{to}");
        assert!(c.warnings.iter().any(|w| w.starts_with("mode is unset")), "{to}: {:?}", c.warnings);
    }
}

#[test]
fn nftables_mode_refuses_localhost_node_ports_instead_of_ignoring_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    for entry in ["localhost", "127.0.0.0/8", "::1/128"] {
        let text = format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n\
             nodePortAddresses: [primary, \"{entry}\"]\n"
        );
        std::fs::write(&path, text).unwrap();
        let err = kproxy_config::resolve(&common::flags(&[&format!("--config={}", path.display())])).unwrap_err();
        let message = err.to_string();
        assert!(message.contains("nodePortAddresses[1]") && message.contains("nftables mode"), "{entry}: {message}");
    }
    // The same entries are served in iptables mode.
    std::fs::write(
        &path,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\n\
         nodePortAddresses: [primary, localhost]\n",
    )
    .unwrap();
    let c = kproxy_config::resolve(&common::flags(&[&format!("--config={}", path.display())])).unwrap();
    assert_eq!(c.node_port_addresses, vec![NodePortAddress::Primary, NodePortAddress::Localhost]);
}

#[test]
fn take_over_and_explain_access_are_read_from_the_file_and_their_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kproxy.yaml");
    std::fs::write(
        &path,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n\
         takeOverKubeProxy: false\nexplainAccess: \"off\"\n",
    )
    .unwrap();
    let file = path.to_str().unwrap();
    let c = kproxy_config::resolve(&common::flags(&["--config", file])).unwrap();
    assert!(!c.take_over_kube_proxy);
    assert_eq!(c.explain_access, kproxy_config::ExplainAccess::Off);
    let c =
        kproxy_config::resolve(&common::flags(&["--config", file, "--take-over-kube-proxy", "--explain-access=any"]))
            .unwrap();
    assert!(c.take_over_kube_proxy);
    assert_eq!(c.explain_access, kproxy_config::ExplainAccess::Any);
}

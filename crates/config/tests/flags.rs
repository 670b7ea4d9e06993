//! Flags alone, the file alone, and both: upstream's precedence, plus kproxy's own flags.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use common::{flags, resolve, resolve_ok, try_flags, with_config};
use kproxy_config::{Action, DetectLocal, NodePortAddress, ProxyConfig, ProxyMode, SourceSelection, VersionRequest};

fn net(s: &str) -> ipnet::IpNet {
    s.parse().unwrap()
}

#[test]
fn no_flags_is_the_default_config() {
    let c = resolve_ok(&[]);
    assert_eq!(c, ProxyConfig::default());
    assert_eq!(c.mode, ProxyMode::Nftables);
    assert_eq!(c.node_port_addresses, vec![NodePortAddress::Primary]);
    assert_eq!(c.healthz_bind_address, Some("0.0.0.0:10256".parse().unwrap()));
    assert_eq!(c.metrics_bind_address, Some("127.0.0.1:10249".parse().unwrap()));
    assert_eq!(c.action, Action::Run);
    assert_eq!(c.source, SourceSelection::KubernetesApi);
    assert!(c.warnings.is_empty());
}

#[test]
fn standalone_demo_needs_no_config_file() {
    let c = resolve_ok(&["--manifests", "examples/"]);
    assert_eq!(c.source, SourceSelection::Manifests(PathBuf::from("examples/")));
    assert_eq!(c.mode, ProxyMode::Nftables);
    assert!(!c.dry_run);
    let c = resolve_ok(&["--manifests=examples/", "--dry-run"]);
    assert!(c.dry_run);
}

#[test]
fn flags_only_set_every_kind_of_value() {
    let c = resolve_ok(&[
        "--proxy-mode=iptables",
        "--iptables-sync-period=10s",
        "--iptables-min-sync-period",
        "0",
        "--iptables-masquerade-bit=13",
        "--masquerade-all",
        "--iptables-localhost-nodeports=false",
        "--cluster-cidr=198.18.0.0/16,fd00:10::/64",
        "--nodeport-addresses=192.0.2.0/24",
        "--nodeport-addresses",
        "localhost,primary",
        "--bind-address=192.0.2.10",
        "--healthz-bind-address=192.0.2.10",
        "--metrics-bind-address=0.0.0.0:9999",
        "--conntrack-max-per-core=0",
        "--conntrack-tcp-timeout-established=2h",
        "--conntrack-tcp-be-liberal=true",
        "--oom-score-adj=-500",
        "--config-sync-period=1m0s",
        "--kubeconfig=/etc/kubernetes/proxy.conf",
        "--master=https://192.0.2.1:6443",
        "--kube-api-qps=20",
        "--kube-api-burst=40",
        "--feature-gates=NFTablesNetlink=true,KubeProxyIPVS=false",
        "--feature-gates=KubeProxyAcceleration=false",
    ]);
    assert_eq!(c.mode, ProxyMode::Iptables);
    assert_eq!(c.sync_period, Duration::from_secs(10));
    assert_eq!(c.min_sync_period, Duration::ZERO);
    assert_eq!(c.masquerade_bit, 13);
    assert!(c.masquerade_all);
    assert!(!c.localhost_node_ports);
    assert_eq!(c.detect_local, DetectLocal::ClusterCidr(vec![net("198.18.0.0/16"), net("fd00:10::/64")]));
    assert_eq!(
        c.node_port_addresses,
        vec![NodePortAddress::Cidr(net("192.0.2.0/24")), NodePortAddress::Localhost, NodePortAddress::Primary]
    );
    assert_eq!(c.bind_address, "192.0.2.10".parse::<std::net::IpAddr>().unwrap());
    assert_eq!(
        c.healthz_bind_address,
        Some("192.0.2.10:10256".parse::<SocketAddr>().unwrap()),
        "bare IP gets the port"
    );
    assert_eq!(c.metrics_bind_address, Some("0.0.0.0:9999".parse::<SocketAddr>().unwrap()));
    assert_eq!(c.conntrack.max_per_core, 0);
    assert_eq!(c.conntrack.tcp_established_timeout, Duration::from_secs(7200));
    assert!(c.conntrack.tcp_be_liberal);
    assert_eq!(c.oom_score_adj, -500);
    assert_eq!(c.config_sync_period, Duration::from_secs(60));
    assert_eq!(c.client_connection.kubeconfig, Some(PathBuf::from("/etc/kubernetes/proxy.conf")));
    assert_eq!(c.client_connection.master.as_deref(), Some("https://192.0.2.1:6443"));
    assert_eq!((c.client_connection.qps, c.client_connection.burst), (20.0, 40));
    assert_eq!(c.feature_gates.get("NFTablesNetlink"), Some(&true));
    assert_eq!(c.feature_gates.get("KubeProxyIPVS"), Some(&false));
    assert_eq!(c.feature_gates.get("KubeProxyAcceleration"), Some(&false), "repeated --feature-gates merge");
}

#[test]
fn sync_period_flags_follow_the_mode_like_upstream() {
    // iptables-* flags apply in every mode but ipvs (nftables included) ...
    let c = resolve_ok(&["--iptables-sync-period=7s", "--ipvs-sync-period=9s"]);
    assert_eq!(c.sync_period, Duration::from_secs(7));
    let c = resolve_ok(&["--proxy-mode=nftables", "--iptables-min-sync-period=3s", "--ipvs-min-sync-period=4s"]);
    assert_eq!(c.min_sync_period, Duration::from_secs(3));
    // ... and ipvs-* flags only in ipvs mode.
    let c = resolve_ok(&["--proxy-mode=ipvs", "--iptables-sync-period=7s", "--ipvs-sync-period=9s"]);
    assert_eq!(c.sync_period, Duration::from_secs(9));
}

#[test]
fn default_node_port_addresses_depend_on_mode() {
    assert_eq!(resolve_ok(&["--proxy-mode=nftables"]).node_port_addresses, vec![NodePortAddress::Primary]);
    assert_eq!(resolve_ok(&["--proxy-mode=iptables"]).node_port_addresses, vec![NodePortAddress::All]);
    assert_eq!(resolve_ok(&["--proxy-mode=ipvs"]).node_port_addresses, vec![NodePortAddress::All]);
}

#[test]
fn deprecated_port_flags_behave_as_upstream() {
    let c = resolve_ok(&["--healthz-port=0", "--metrics-port=0"]);
    assert_eq!((c.healthz_bind_address, c.metrics_bind_address), (None, None));
    assert!(c.warnings.iter().any(|w| w.contains("deprecated")));
    // The port only fills in an address that has none.
    let c = resolve_ok(&["--healthz-bind-address=192.0.2.5", "--healthz-port=12000"]);
    assert_eq!(c.healthz_bind_address, Some("192.0.2.5:12000".parse().unwrap()));
    let c = resolve_ok(&["--healthz-bind-address=192.0.2.5:1", "--healthz-port=12000"]);
    assert_eq!(c.healthz_bind_address, Some("192.0.2.5:1".parse().unwrap()));
    // An empty bind address disables the server.
    assert_eq!(resolve_ok(&["--metrics-bind-address="]).metrics_bind_address, None);
}

#[test]
fn invalid_flag_values_name_field_and_flag() {
    let cases: &[(&[&str], &str, &str)] = &[
        (&["--iptables-masquerade-bit=40"], "iptables.masqueradeBit", "--iptables-masquerade-bit"),
        (&["--iptables-sync-period=0"], "iptables.syncPeriod", "--iptables-sync-period"),
        (&["--proxy-mode=ipvs", "--ipvs-scheduler=best"], "ipvs.scheduler", "--ipvs-scheduler"),
        (&["--proxy-mode=kernelspace"], "mode", "--proxy-mode"),
        (&["--nodeport-addresses=primary,bogus"], "nodePortAddresses[1]", "--nodeport-addresses"),
        (&["--bind-address=node-a"], "bindAddress", "--bind-address"),
        (&["--detect-local-mode=InterfaceNamePrefix"], "detectLocal.interfaceNamePrefix", ""),
        (&["--no-masquerade-cidrs=198.18.0.0/15,fd00::"], "noMasqueradeCIDRs[1]", "--no-masquerade-cidrs"),
        (&["--offload-packet-threshold=-3"], "acceleration.packetThreshold", "--offload-packet-threshold"),
        (&["--feature-gates=NFTablesNetlink=maybe"], "featureGates", "--feature-gates"),
        (&["--vmodule=proxier"], "logging.vmodule", "--vmodule"),
        (&["--hostname-override=   "], "hostnameOverride", "--hostname-override"),
        (&["--healthz-port=70000"], "healthzBindAddress", "--healthz-port"),
    ];
    for (args, field, flag) in cases {
        let err = resolve(args).expect_err(&format!("{args:?} must be rejected"));
        assert_eq!(err.field(), Some(*field), "{args:?}: {err}");
        assert!(err.to_string().contains(flag), "{args:?}: {err} should name {flag}");
    }
}

#[test]
fn malformed_flag_syntax_is_rejected_by_the_parser() {
    for args in [
        &["--iptables-sync-period=3x"][..],
        &["--masquerade-all=yes"],
        &["--oom-score-adj=low"],
        &["--iptables-masquerade-bit"],
    ] {
        let err = try_flags(args).expect_err(&format!("{args:?} must not parse"));
        assert!(err.to_string().contains(args[0].split('=').next().unwrap()), "{args:?}: {err}");
    }
}

#[test]
fn verbosity_accepts_klog_spellings() {
    for args in [&["-v=4"][..], &["-v", "4"], &["--v=4"], &["-v4"]] {
        assert_eq!(resolve_ok(args).logging.verbosity, 4, "{args:?}");
    }
}

#[test]
fn boolean_flags_accept_go_forms() {
    assert!(resolve_ok(&["--masquerade-all"]).masquerade_all);
    assert!(resolve_ok(&["--masquerade-all=T"]).masquerade_all);
    assert!(!resolve_ok(&["--masquerade-all=0"]).masquerade_all);
    // pflag booleans never take a separate value: "false" here is a stray argument.
    assert!(try_flags(&["--masquerade-all", "false"]).is_err());
}

#[test]
fn file_only_ignores_config_flags_and_says_so() {
    let c = with_config(
        "tuned.json",
        &["--proxy-mode=iptables", "--iptables-sync-period=3s", "--masquerade-all=false", "--cluster-cidr=10.0.0.0/8"],
    )
    .unwrap();
    assert_eq!(c.mode, ProxyMode::Nftables);
    assert_eq!(c.sync_period, Duration::from_secs(60));
    assert!(c.masquerade_all);
    assert_eq!(c.detect_local, DetectLocal::InterfaceNamePrefix("veth".into()));
    let warning = c.warnings.iter().find(|w| w.contains("ignored")).expect("a warning about ignored flags");
    for flag in ["--proxy-mode", "--iptables-sync-period", "--masquerade-all", "--cluster-cidr"] {
        assert!(warning.contains(flag), "{warning} should list {flag}");
    }
}

#[test]
fn file_and_flags_that_override_it() {
    let c = with_config(
        "tuned.json",
        &[
            "--hostname-override= Node-B ",
            "-v=6",
            "--vmodule=proxier=9",
            "--logging-format=text",
            "--master=https://192.0.2.1:6443",
            "--no-masquerade-cidrs=203.0.113.0/24",
            "--snat-to-node-ip=false",
            "--acceleration",
            "--offload-packet-threshold=0",
        ],
    )
    .unwrap();
    assert_eq!(c.hostname_override.as_deref(), Some("node-b"), "trimmed and lower-cased");
    assert_eq!(c.logging.verbosity, 6);
    assert_eq!(c.logging.vmodule, vec![("proxier".to_string(), 9)]);
    assert_eq!(c.logging.format, kproxy_config::LogFormat::Text);
    assert_eq!(c.client_connection.master.as_deref(), Some("https://192.0.2.1:6443"));
    assert_eq!(c.no_masquerade_cidrs, vec![net("203.0.113.0/24")]);
    assert!(!c.snat_to_node_ip);
    assert!(c.acceleration.enabled);
    assert_eq!(c.acceleration.packet_threshold, 0);
    assert!(!c.acceleration.active(), "threshold 0 disables offload");
    // Values not overridden still come from the file.
    assert_eq!(c.sync_period, Duration::from_secs(60));
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn extension_flags_without_a_file() {
    let c =
        resolve_ok(&["--no-masquerade-cidrs=198.18.0.0/15,fd00:10::/64", "--snat-to-node-ip", "--acceleration=false"]);
    assert_eq!(c.no_masquerade_cidrs, vec![net("198.18.0.0/15"), net("fd00:10::/64")]);
    assert!(c.snat_to_node_ip);
    assert!(!c.acceleration.enabled);
    assert_eq!(c.acceleration.packet_threshold, 20);
}

#[test]
fn service_counters_are_opt_in_and_only_for_nftables() {
    assert!(!resolve_ok(&[]).service_counters);
    assert!(resolve_ok(&["--service-counters"]).service_counters);
    let refused = resolve(&["--service-counters", "--proxy-mode=iptables"]);
    let error = refused.expect_err("counters are read from nftables maps").to_string();
    assert!(error.contains("serviceCounters") && error.contains("--service-counters"), "{error}");
}

#[test]
fn kernel_changes_are_watched_by_default_in_nftables_mode_only_and_can_be_turned_off() {
    assert!(resolve_ok(&[]).watch_kernel_changes);
    assert!(!resolve_ok(&["--watch-kernel-changes=false"]).watch_kernel_changes);
    assert!(!resolve_ok(&["--proxy-mode=iptables"]).watch_kernel_changes);
    assert!(!resolve_ok(&["--proxy-mode=ipvs"]).watch_kernel_changes);
    let refused = resolve(&["--watch-kernel-changes", "--proxy-mode=iptables"]);
    let error = refused.expect_err("only kproxy's nftables tables are watched").to_string();
    assert!(error.contains("watchKernelChanges") && error.contains("--watch-kernel-changes"), "{error}");
}

#[test]
fn actions_follow_upstream_order() {
    assert_eq!(resolve_ok(&["--cleanup"]).action, Action::Cleanup);
    assert_eq!(resolve_ok(&["--init-only"]).action, Action::InitOnly);
    assert_eq!(resolve_ok(&["--cleanup", "--init-only"]).action, Action::Cleanup);
    assert_eq!(
        resolve_ok(&["--cleanup", "--write-config-to=/tmp/out.yaml"]).action,
        Action::WriteConfigTo(PathBuf::from("/tmp/out.yaml"))
    );
    assert_eq!(resolve_ok(&["--cleanup=false"]).action, Action::Run);
}

#[test]
fn version_flag() {
    assert_eq!(flags(&[]).version_request().unwrap(), VersionRequest::None);
    assert_eq!(flags(&["--version"]).version_request().unwrap(), VersionRequest::Short);
    assert_eq!(flags(&["--version=raw"]).version_request().unwrap(), VersionRequest::Raw);
    assert_eq!(flags(&["--version=false"]).version_request().unwrap(), VersionRequest::None);
    assert_eq!(flags(&["--version=maybe"]).version_request().unwrap_err().field(), Some("version"));
}

#[test]
fn feature_gate_syntax() {
    let gates = kproxy_config::parse_feature_gates("A=true, B=false,C=1").unwrap();
    assert_eq!(gates, vec![("A".into(), true), ("B".into(), false), ("C".into(), true)]);
    assert!(kproxy_config::parse_feature_gates("A").is_err());
    assert!(kproxy_config::parse_feature_gates("=true").is_err());
    let c = resolve_ok(&["--feature-gates=SomeOtherComponentGate=true"]);
    assert!(c.warnings.iter().any(|w| w.contains("SomeOtherComponentGate")), "unknown gates warn: {:?}", c.warnings);
}

#[test]
fn feature_gates_act_or_are_refused() {
    // Acting: IPVS mode forbidden, acceleration switched off.
    let err = resolve(&["--proxy-mode=ipvs", "--feature-gates=KubeProxyIPVS=false"]).unwrap_err().to_string();
    assert!(err.contains("KubeProxyIPVS=false"), "{err}");
    assert!(!resolve_ok(&["--feature-gates=KubeProxyAcceleration=false"]).acceleration.active());
    assert!(resolve_ok(&[]).acceleration.active(), "acceleration.enabled decides when the gate is unset");
    let err = resolve(&["--no-masquerade-cidrs=198.18.0.0/15", "--feature-gates=KubeProxyNoMasqueradeCIDRs=false"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("noMasqueradeCIDRs"), "{err}");
    // Refused: a locked GA gate off, an always-on behaviour off, an unimplemented feature on.
    for gate in ["TopologyAwareHints=false", "NFTablesNetlink=false", "KubeProxyNFTablesLocalhostNodePorts=true"] {
        let err = resolve(&[&format!("--feature-gates={gate}")]).unwrap_err().to_string();
        assert!(err.contains("featureGates"), "{gate}: {err}");
    }
}

#[test]
fn all_alpha_acts_on_implemented_gates_and_names_the_others_once() {
    let c = resolve_ok(&["--feature-gates=AllAlpha=true", "--acceleration=false"]);
    assert!(c.acceleration.active(), "AllAlpha=true turns KubeProxyAcceleration on, over acceleration.enabled");
    let named: Vec<&String> = c.warnings.iter().filter(|w| w.contains("KubeProxyNFTablesLocalhostNodePorts")).collect();
    assert_eq!(named.len(), 1, "{:?}", c.warnings);
    assert!(
        named[0].contains("PreserveUDPFlowsTerminatingEndpoints") && named[0].contains("AllAlpha=true"),
        "{named:?}"
    );
    let c = resolve_ok(&["--feature-gates=AllAlpha=true,KubeProxyAcceleration=false"]);
    assert!(!c.acceleration.active(), "an explicit value wins over AllAlpha");
    assert!(resolve_ok(&["--feature-gates=AllAlpha=false"]).warnings.is_empty());
    let err = resolve(&["--feature-gates=AllBeta=false"]).unwrap_err().to_string();
    assert!(err.contains("NFTablesNetlink") && err.contains("AllBeta=false"), "{err}");
}

#[test]
fn settings_kproxy_does_not_use_are_warned_about() {
    let c = resolve_ok(&["--config-sync-period=5m"]);
    assert!(c.warnings.iter().any(|w| w.starts_with("configSyncPeriod is not used")), "{:?}", c.warnings);
    assert!(resolve_ok(&["--config-sync-period=15m", "--kube-api-content-type=application/json"]).warnings.is_empty());
    let c = resolve_ok(&["--kube-api-content-type=application/vnd.kubernetes.protobuf"]);
    assert!(c.warnings.is_empty(), "protobuf is spoken: {:?}", c.warnings);
    assert_eq!(c.client_connection.content_type, "application/vnd.kubernetes.protobuf");
    assert_eq!(
        resolve_ok(&[]).client_connection.content_type,
        "application/vnd.kubernetes.protobuf",
        "upstream's default"
    );
}

#[test]
fn taking_over_from_kube_proxy_is_on_by_default_and_can_be_turned_off() {
    assert!(resolve_ok(&[]).take_over_kube_proxy);
    assert!(!resolve_ok(&["--take-over-kube-proxy=false"]).take_over_kube_proxy);
    assert!(resolve_ok(&["--take-over-kube-proxy"]).take_over_kube_proxy);
}

#[test]
fn explain_is_for_the_node_itself_by_default_and_an_unknown_access_is_refused_by_name() {
    use kproxy_config::ExplainAccess;
    assert_eq!(resolve_ok(&[]).explain_access, ExplainAccess::Local);
    assert_eq!(resolve_ok(&["--explain-access=any"]).explain_access, ExplainAccess::Any);
    assert_eq!(resolve_ok(&["--explain-access=off"]).explain_access, ExplainAccess::Off);
    let error = resolve(&["--explain-access=everyone"]).expect_err("not a keyword").to_string();
    assert!(
        error.contains("explainAccess") && error.contains("--explain-access") && error.contains("everyone"),
        "{error}"
    );
}

//! Flags + optional file → [`ProxyConfig`], with upstream's precedence (see the crate docs).

use crate::document::{self, Document};
use crate::error::{ConfigError, FieldError};
use crate::flags::{Flags, parse_go_bool};
use crate::model::{Action, ProxyConfig, SourceSelection};
use crate::settings::{self, HEALTHZ_PORT, METRICS_PORT, Settings, append_port_if_needed};
use crate::validate;

fn flag_error(field: &str, flag: &str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(vec![FieldError {
        field: field.to_string(),
        flag: Some(flag.to_string()),
        value: value.to_string(),
        reason: reason.into(),
    }])
}

/// Resolves the effective configuration from the command line (and the `--config` file it names).
///
/// * Without `--config`: upstream defaults, then every flag given.
/// * With `--config`: the file (defaulted as upstream defaults it); of the KubeProxyConfiguration
///   flags only the logging flags (`-v`, `--vmodule`, `--logging-format`, `--log-*`) and
///   `--hostname-override` still apply, exactly as upstream; the other ones are ignored and listed in
///   [`ProxyConfig::warnings`]. kproxy's own flags (`--no-masquerade-cidrs`, `--snat-to-node-ip`,
///   `--acceleration`, `--offload-packet-threshold`) override the file when given, so an unchanged
///   upstream ConfigMap can be combined with them.
///
/// Errors name the field (and the flag, when a flag supplied the value).
pub fn resolve(flags: &Flags) -> Result<ProxyConfig, ConfigError> {
    let mut warnings = Vec::new();
    let config_file = flags.config.clone().filter(|p| !p.as_os_str().is_empty());
    let mut settings = match &config_file {
        Some(path) => settings::from_document(document::load(path)?),
        None => settings::from_document(Document::default()),
    };

    if config_file.is_some() {
        settings.from_file = true;
        let ignored = flags.config_backed_flags_given();
        if !ignored.is_empty() {
            warnings.push(format!(
                "--config is set, so these flags are ignored (as in kube-proxy): {}",
                ignored.join(", ")
            ));
        }
    } else {
        apply_config_flags(&mut settings, flags)?;
        apply_deprecated_port_flags(&mut settings, flags);
    }
    if flags.healthz_port.is_some() || flags.metrics_port.is_some() {
        warnings.push(
            "--healthz-port and --metrics-port are deprecated; use --healthz-bind-address and --metrics-bind-address"
                .to_string(),
        );
    }
    if flags.proxy_port_range.is_some() {
        warnings.push("--proxy-port-range is deprecated and has no effect".to_string());
    }
    apply_logging_flags(&mut settings, flags)?;
    apply_hostname_override(&mut settings, flags)?;
    apply_extension_flags(&mut settings, flags);

    let mut config = validate::validate(&settings, &mut warnings)?;
    config.client_connection.master = flags.master.clone().filter(|m| !m.is_empty());
    config.source = match &flags.manifests {
        Some(dir) => SourceSelection::Manifests(dir.clone()),
        None => SourceSelection::KubernetesApi,
    };
    config.dry_run = flags.dry_run.unwrap_or(false);
    // Upstream's order of precedence in Run(): write the config, else clean up, else init only.
    config.action = if let Some(path) = flags.write_config_to.clone().filter(|p| !p.as_os_str().is_empty()) {
        Action::WriteConfigTo(path)
    } else if flags.cleanup.unwrap_or(false) {
        Action::Cleanup
    } else if flags.init_only.unwrap_or(false) {
        Action::InitOnly
    } else {
        Action::Run
    };
    config.config_file = config_file;
    config.warnings = warnings;
    Ok(config)
}

fn set<T: Clone>(
    target: &mut T,
    value: &Option<T>,
    settings_origin: &mut Vec<(String, &'static str)>,
    field: &str,
    flag: &'static str,
) {
    if let Some(v) = value {
        *target = v.clone();
        settings_origin.push((field.to_string(), flag));
    }
}

/// Applies every KubeProxyConfiguration-backed flag (flags-only mode).
fn apply_config_flags(s: &mut Settings, f: &Flags) -> Result<(), ConfigError> {
    let mut o: Vec<(String, &'static str)> = Vec::new();
    for text in &f.feature_gates {
        for (name, enabled) in parse_feature_gates(text)? {
            s.feature_gates.insert(name, enabled);
        }
    }
    if !f.feature_gates.is_empty() {
        o.push(("featureGates".into(), "--feature-gates"));
    }
    set(&mut s.kubeconfig, &f.kubeconfig, &mut o, "clientConnection.kubeconfig", "--kubeconfig");
    set(
        &mut s.content_type,
        &f.kube_api_content_type,
        &mut o,
        "clientConnection.contentType",
        "--kube-api-content-type",
    );
    set(&mut s.burst, &f.kube_api_burst, &mut o, "clientConnection.burst", "--kube-api-burst");
    set(&mut s.qps, &f.kube_api_qps, &mut o, "clientConnection.qps", "--kube-api-qps");
    set(&mut s.bind_address, &f.bind_address, &mut o, "bindAddress", "--bind-address");
    set(&mut s.healthz_bind_address, &f.healthz_bind_address, &mut o, "healthzBindAddress", "--healthz-bind-address");
    set(&mut s.metrics_bind_address, &f.metrics_bind_address, &mut o, "metricsBindAddress", "--metrics-bind-address");
    set(
        &mut s.bind_address_hard_fail,
        &f.bind_address_hard_fail,
        &mut o,
        "bindAddressHardFail",
        "--bind-address-hard-fail",
    );
    set(&mut s.enable_profiling, &f.profiling, &mut o, "enableProfiling", "--profiling");
    set(
        &mut s.show_hidden_metrics_for_version,
        &f.show_hidden_metrics_for_version,
        &mut o,
        "showHiddenMetricsForVersion",
        "--show-hidden-metrics-for-version",
    );
    set(&mut s.port_range, &f.proxy_port_range, &mut o, "portRange", "--proxy-port-range");
    // The mode decides which section the sync-period flags land in, so it goes first.
    set(&mut s.raw_mode, &f.proxy_mode, &mut o, "mode", "--proxy-mode");
    let section = s.mode_section();
    set(
        &mut s.iptables_masquerade_bit,
        &f.iptables_masquerade_bit,
        &mut o,
        "iptables.masqueradeBit",
        "--iptables-masquerade-bit",
    );
    let masq_all_field = if section == "nftables" { "nftables.masqueradeAll" } else { "iptables.masqueradeAll" };
    set(&mut s.masquerade_all, &f.masquerade_all, &mut o, masq_all_field, "--masquerade-all");
    set(
        &mut s.localhost_node_ports,
        &f.iptables_localhost_nodeports,
        &mut o,
        "iptables.localhostNodePorts",
        "--iptables-localhost-nodeports",
    );
    // Upstream processV1Alpha1Flags: the iptables-* period flags apply in every mode but ipvs, the
    // ipvs-* ones only in ipvs mode.
    let (sync_flag, min_sync_flag, sync, min_sync) = if section == "ipvs" {
        ("--ipvs-sync-period", "--ipvs-min-sync-period", f.ipvs_sync_period, f.ipvs_min_sync_period)
    } else {
        ("--iptables-sync-period", "--iptables-min-sync-period", f.iptables_sync_period, f.iptables_min_sync_period)
    };
    set(&mut s.sync_period, &sync, &mut o, &format!("{section}.syncPeriod"), sync_flag);
    set(&mut s.min_sync_period, &min_sync, &mut o, &format!("{section}.minSyncPeriod"), min_sync_flag);
    set(&mut s.ipvs_scheduler, &f.ipvs_scheduler, &mut o, "ipvs.scheduler", "--ipvs-scheduler");
    let exclude = f.ipvs_exclude_cidrs.as_ref().map(|v| non_empty(v));
    set(&mut s.ipvs_exclude_cidrs, &exclude, &mut o, "ipvs.excludeCIDRs", "--ipvs-exclude-cidrs");
    set(&mut s.ipvs_strict_arp, &f.ipvs_strict_arp, &mut o, "ipvs.strictARP", "--ipvs-strict-arp");
    set(&mut s.ipvs_tcp_timeout, &f.ipvs_tcp_timeout, &mut o, "ipvs.tcpTimeout", "--ipvs-tcp-timeout");
    set(&mut s.ipvs_tcp_fin_timeout, &f.ipvs_tcp_fin_timeout, &mut o, "ipvs.tcpFinTimeout", "--ipvs-tcpfin-timeout");
    set(&mut s.ipvs_udp_timeout, &f.ipvs_udp_timeout, &mut o, "ipvs.udpTimeout", "--ipvs-udp-timeout");
    set(&mut s.detect_local_mode, &f.detect_local_mode, &mut o, "detectLocalMode", "--detect-local-mode");
    set(
        &mut s.bridge_interface,
        &f.pod_bridge_interface,
        &mut o,
        "detectLocal.bridgeInterface",
        "--pod-bridge-interface",
    );
    set(
        &mut s.interface_name_prefix,
        &f.pod_interface_name_prefix,
        &mut o,
        "detectLocal.interfaceNamePrefix",
        "--pod-interface-name-prefix",
    );
    let cluster = f
        .cluster_cidr
        .as_ref()
        .map(|c| if c.is_empty() { Vec::new() } else { c.split(',').map(str::to_string).collect() });
    set(&mut s.cluster_cidrs, &cluster, &mut o, "clusterCIDR", "--cluster-cidr");
    let npa = f.node_port_addresses.as_ref().map(|v| non_empty(v));
    set(&mut s.node_port_addresses, &npa, &mut o, "nodePortAddresses", "--nodeport-addresses");
    if let Some(list) = &npa {
        for i in 0..list.len() {
            o.push((format!("nodePortAddresses[{i}]"), "--nodeport-addresses"));
        }
    }
    if let Some(list) = &exclude {
        for i in 0..list.len() {
            o.push((format!("ipvs.excludeCIDRs[{i}]"), "--ipvs-exclude-cidrs"));
        }
    }
    set(&mut s.oom_score_adj, &f.oom_score_adj, &mut o, "oomScoreAdj", "--oom-score-adj");
    set(
        &mut s.conntrack_max_per_core,
        &f.conntrack_max_per_core,
        &mut o,
        "conntrack.maxPerCore",
        "--conntrack-max-per-core",
    );
    set(&mut s.conntrack_min, &f.conntrack_min, &mut o, "conntrack.min", "--conntrack-min");
    set(
        &mut s.conntrack_tcp_established_timeout,
        &f.conntrack_tcp_timeout_established,
        &mut o,
        "conntrack.tcpEstablishedTimeout",
        "--conntrack-tcp-timeout-established",
    );
    set(
        &mut s.conntrack_tcp_close_wait_timeout,
        &f.conntrack_tcp_timeout_close_wait,
        &mut o,
        "conntrack.tcpCloseWaitTimeout",
        "--conntrack-tcp-timeout-close-wait",
    );
    set(
        &mut s.conntrack_tcp_be_liberal,
        &f.conntrack_tcp_be_liberal,
        &mut o,
        "conntrack.tcpBeLiberal",
        "--conntrack-tcp-be-liberal",
    );
    set(
        &mut s.conntrack_udp_timeout,
        &f.conntrack_udp_timeout,
        &mut o,
        "conntrack.udpTimeout",
        "--conntrack-udp-timeout",
    );
    set(
        &mut s.conntrack_udp_stream_timeout,
        &f.conntrack_udp_timeout_stream,
        &mut o,
        "conntrack.udpStreamTimeout",
        "--conntrack-udp-timeout-stream",
    );
    set(&mut s.config_sync_period, &f.config_sync_period, &mut o, "configSyncPeriod", "--config-sync-period");
    for (field, flag) in o {
        s.set_by(field, flag);
    }
    Ok(())
}

/// Upstream `addressFromDeprecatedFlags` (flags-only mode): port 0 disables the server, otherwise a
/// bind address given without a port gets this one (default 10256 / 10249). Skipped with
/// `--write-config-to`, as upstream; a bare IP still gets the default port there.
fn apply_deprecated_port_flags(s: &mut Settings, f: &Flags) {
    let writing = f.write_config_to.is_some();
    for (addr, port_flag, default_port, field, flag) in [
        (&mut s.healthz_bind_address, f.healthz_port, HEALTHZ_PORT, "healthzBindAddress", "--healthz-port"),
        (&mut s.metrics_bind_address, f.metrics_port, METRICS_PORT, "metricsBindAddress", "--metrics-port"),
    ] {
        let port = if writing { None } else { port_flag };
        match port {
            Some(0) => *addr = String::new(),
            Some(p) => match u16::try_from(p) {
                Ok(p) => {
                    *addr = append_port_if_needed(addr, p);
                    s.origins.entry(field.to_string()).or_insert_with(|| flag.to_string());
                }
                Err(_) => {
                    // Leave an address validation will reject, naming the flag.
                    *addr = format!("{addr}:{p}");
                    s.origins.insert(field.to_string(), flag.to_string());
                }
            },
            None => *addr = append_port_if_needed(addr, default_port),
        }
    }
}

/// Logging flags override the file (upstream `copyLogsFromFlags`); `--vmodule` entries are appended
/// after the file's, so the flag wins for a pattern given in both.
fn apply_logging_flags(s: &mut Settings, f: &Flags) -> Result<(), ConfigError> {
    let mut o: Vec<(String, &'static str)> = Vec::new();
    set(&mut s.logging.verbosity, &f.verbosity, &mut o, "logging.verbosity", "-v");
    set(&mut s.logging.format, &f.logging_format, &mut o, "logging.format", "--logging-format");
    set(
        &mut s.logging.flush_frequency,
        &f.log_flush_frequency,
        &mut o,
        "logging.flushFrequency",
        "--log-flush-frequency",
    );
    set(
        &mut s.logging.text_split_stream,
        &f.log_text_split_stream,
        &mut o,
        "logging.options.text.splitStream",
        "--log-text-split-stream",
    );
    set(
        &mut s.logging.text_info_buffer_size,
        &f.log_text_info_buffer_size,
        &mut o,
        "logging.options.text.infoBufferSize",
        "--log-text-info-buffer-size",
    );
    set(
        &mut s.logging.json_split_stream,
        &f.log_json_split_stream,
        &mut o,
        "logging.options.json.splitStream",
        "--log-json-split-stream",
    );
    set(
        &mut s.logging.json_info_buffer_size,
        &f.log_json_info_buffer_size,
        &mut o,
        "logging.options.json.infoBufferSize",
        "--log-json-info-buffer-size",
    );
    if let Some(text) = &f.vmodule {
        for item in text.split(',').filter(|i| !i.trim().is_empty()) {
            let parsed = item.split_once('=').and_then(|(p, n)| Some((p.trim(), n.trim().parse::<u32>().ok()?)));
            match parsed {
                Some((pattern, level)) if !pattern.is_empty() => s.logging.vmodule.push((pattern.to_string(), level)),
                _ => return Err(flag_error("logging.vmodule", "--vmodule", item, "expected pattern=N")),
            }
        }
    }
    for (field, flag) in o {
        s.set_by(field, flag);
    }
    Ok(())
}

/// `--hostname-override` wins over the file (upstream `processHostnameOverrideFlag`): trimmed and
/// lower-cased; a value of only whitespace is an error.
fn apply_hostname_override(s: &mut Settings, f: &Flags) -> Result<(), ConfigError> {
    if let Some(raw) = f.hostname_override.as_deref().filter(|h| !h.is_empty()) {
        let name = raw.trim();
        if name.is_empty() {
            return Err(flag_error(
                "hostnameOverride",
                "--hostname-override",
                raw,
                "empty hostname-override is invalid",
            ));
        }
        s.hostname_override = name.to_lowercase();
        s.set_by("hostnameOverride", "--hostname-override");
    }
    Ok(())
}

/// kproxy's extension flags override the file in both modes.
fn apply_extension_flags(s: &mut Settings, f: &Flags) {
    if let Some(list) = &f.no_masquerade_cidrs {
        s.no_masquerade_cidrs = non_empty(list);
        for i in 0..s.no_masquerade_cidrs.len() {
            s.set_by(format!("noMasqueradeCIDRs[{i}]"), "--no-masquerade-cidrs");
        }
    }
    if let Some(v) = f.snat_to_node_ip {
        s.snat_to_node_ip = v;
    }
    if let Some(v) = f.service_counters {
        s.service_counters = v;
        s.set_by("serviceCounters", "--service-counters");
    }
    if let Some(v) = f.watch_kernel_changes {
        s.watch_kernel_changes = Some(v);
        s.set_by("watchKernelChanges", "--watch-kernel-changes");
    }
    if let Some(v) = f.acceleration {
        s.acceleration_enabled = v;
    }
    if let Some(n) = f.offload_packet_threshold {
        s.acceleration_packet_threshold = n;
        s.set_by("acceleration.packetThreshold", "--offload-packet-threshold");
    }
    if let Some(v) = f.take_over_kube_proxy {
        s.take_over_kube_proxy = v;
    }
    if let Some(access) = &f.explain_access {
        s.explain_access = access.clone();
        s.set_by("explainAccess", "--explain-access");
    }
}

fn non_empty(list: &[String]) -> Vec<String> {
    list.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

/// Parses `--feature-gates` syntax: `A=true,B=false` (Go booleans).
pub fn parse_feature_gates(text: &str) -> Result<Vec<(String, bool)>, ConfigError> {
    let mut gates = Vec::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((name, value)) = item.split_once('=') else {
            return Err(flag_error("featureGates", "--feature-gates", item, "expected NAME=true|false"));
        };
        let name = name.trim();
        if name.is_empty() {
            return Err(flag_error("featureGates", "--feature-gates", item, "feature gate name must not be empty"));
        }
        let enabled = parse_go_bool(value.trim())
            .map_err(|reason| flag_error("featureGates", "--feature-gates", item, reason))?;
        gates.push((name.to_string(), enabled));
    }
    Ok(gates)
}

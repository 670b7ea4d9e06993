//! Validation: [`Settings`] (text, defaulted) → [`ProxyConfig`] (typed), following upstream's
//! `pkg/proxy/apis/config/validation/validation.go` and naming fields the way its v1alpha1 paths do
//! (`iptables.syncPeriod`, `nodePortAddresses[1]`, `detectLocal.bridgeInterface`).
//!
//! Every problem is collected, not just the first, so one run shows everything to fix. Like upstream,
//! the `ipvs` section is only checked (and only used) in IPVS mode, and the `nftables` masquerade bit
//! only when the mode is explicitly nftables.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use ipnet::IpNet;

use crate::duration::GoDuration;
use crate::error::{ConfigError, FieldError};
use crate::model::{
    AccelerationConfig, ClientConnection, ConntrackConfig, DetectLocal, ExplainAccess, IpvsConfig, IpvsScheduler,
    LogFormat, LoggingConfig, NodePortAddress, ProxyConfig, ProxyMode,
};
use crate::settings::{Settings, split_host_port};

struct Checker<'a> {
    origins: &'a std::collections::BTreeMap<String, String>,
    errors: Vec<FieldError>,
}

impl Checker<'_> {
    fn fail(&mut self, field: impl Into<String>, value: impl std::fmt::Display, reason: impl Into<String>) {
        let field = field.into();
        let flag = self.origins.get(&field).cloned();
        self.errors.push(FieldError { field, flag, value: value.to_string(), reason: reason.into() });
    }

    fn positive(&mut self, field: &str, d: GoDuration) -> std::time::Duration {
        match d.to_std() {
            Some(std) if !std.is_zero() => std,
            _ => {
                self.fail(field, d, "must be greater than 0");
                std::time::Duration::ZERO
            }
        }
    }

    fn non_negative(&mut self, field: &str, d: GoDuration) -> std::time::Duration {
        d.to_std().unwrap_or_else(|| {
            self.fail(field, d, "must be greater than or equal to 0");
            std::time::Duration::ZERO
        })
    }

    fn non_negative_int(&mut self, field: &str, n: i32) -> u32 {
        u32::try_from(n).unwrap_or_else(|_| {
            self.fail(field, n, "must be greater than or equal to 0");
            0
        })
    }

    fn masquerade_bit(&mut self, field: &str, bit: i32) -> u8 {
        u8::try_from(bit).ok().filter(|b| *b <= 31).unwrap_or_else(|| {
            self.fail(field, bit, "must be within the range [0, 31]");
            14
        })
    }

    fn cidr(&mut self, field: &str, text: &str) -> Option<IpNet> {
        match parse_cidr(text) {
            Some(net) => Some(net),
            None => {
                self.fail(field, text, "must be a valid CIDR (e.g. 10.100.0.0/16 or fd00:10::/48)");
                None
            }
        }
    }

    fn host_port(&mut self, field: &str, text: &str) -> Option<SocketAddr> {
        if text.is_empty() {
            return None;
        }
        let Some((host, port)) = split_host_port(text) else {
            self.fail(field, text, "must be IP:port");
            return None;
        };
        let ip = host.parse::<IpAddr>();
        let port = port.parse::<u16>().ok().filter(|p| *p != 0);
        match (ip, port) {
            (Ok(ip), Some(port)) => Some(SocketAddr::new(ip, port)),
            (Err(_), _) => {
                self.fail(field, text, "must be IP:port with a valid IP");
                None
            }
            (_, None) => {
                self.fail(field, text, "must be IP:port with a port in 1..65535");
                None
            }
        }
    }
}

/// Parses a CIDR the way Go's `net.ParseCIDR` reads it (prefix required) and masks host bits.
pub(crate) fn parse_cidr(text: &str) -> Option<IpNet> {
    let text = text.trim();
    if !text.contains('/') {
        return None;
    }
    text.parse::<IpNet>().ok().map(|net| net.trunc())
}

/// A Kubernetes quantity as a byte count: `0`, `65536`, `64Ki`, `1M`.
fn parse_quantity(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let number: u64 = digits.parse().ok()?;
    let multiplier: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    number.checked_mul(multiplier)
}

fn is_major_minor(text: &str) -> bool {
    let mut parts = text.split('.');
    let ok = |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
}

fn valid_port_range(text: &str) -> bool {
    let text = text.trim();
    if text.is_empty() {
        return true;
    }
    let (base, rest, plus) = match text.split_once('-') {
        Some((b, r)) => (b, r, false),
        None => match text.split_once('+') {
            Some((b, r)) => (b, r, true),
            None => return false,
        },
    };
    let (Ok(base), Ok(rest)) = (base.parse::<u32>(), rest.parse::<u32>()) else {
        return false;
    };
    let max = if plus { base + rest.saturating_sub(1) } else { rest };
    base <= max && max <= 65535
}

/// Validates and types the settings. `warnings` receives non-fatal findings.
pub(crate) fn validate(s: &Settings, warnings: &mut Vec<String>) -> Result<ProxyConfig, ConfigError> {
    let mut c = Checker { origins: &s.origins, errors: Vec::new() };
    let section = s.mode_section();

    for gate in s.feature_gates.keys() {
        if gate.trim().is_empty() {
            c.fail("featureGates", gate, "feature gate names must not be empty");
        } else if !crate::feature_gates::is_known(gate) {
            warnings.push(format!("featureGates: unknown feature gate {gate:?} is ignored by kproxy"));
        }
    }

    let left_off = crate::feature_gates::left_off_by_switches(&s.feature_gates);
    if !left_off.is_empty() {
        let names: Vec<String> = left_off.iter().map(|(switch, gate)| format!("{gate} ({switch}=true)")).collect();
        warnings.push(format!(
            "featureGates: kproxy does not implement these gates' features, so they stay off: {}",
            names.join(", ")
        ));
    }
    let (gates, gate_errors) = crate::feature_gates::check(&s.feature_gates);
    for (gate, reason) in gate_errors {
        c.fail("featureGates", gate, reason);
    }

    let mode = match s.raw_mode.as_str() {
        // Decided below, once nodePortAddresses are known (see `unset_mode`).
        "" | "nftables" => ProxyMode::Nftables,
        "iptables" => ProxyMode::Iptables,
        "ipvs" => ProxyMode::Ipvs,
        other => {
            c.fail("mode", other, "must be iptables, ipvs or nftables, or blank (blank means nftables in kproxy)");
            ProxyMode::Nftables
        }
    };

    if s.config_sync_period != crate::duration::GoDuration::from_secs(15 * 60) {
        warnings.push(
            "configSyncPeriod is not used: kproxy's watches keep the state current and relist when the \
             API server asks, so there is no informer resync to pace"
                .to_owned(),
        );
    }
    if s.burst < 0 {
        c.fail("clientConnection.burst", s.burst, "must be greater than or equal to 0");
    }
    let client_connection = ClientConnection {
        kubeconfig: (!s.kubeconfig.is_empty()).then(|| PathBuf::from(&s.kubeconfig)),
        master: None,
        accept_content_types: s.accept_content_types.clone(),
        content_type: s.content_type.clone(),
        qps: s.qps,
        burst: u32::try_from(s.burst).unwrap_or(0),
    };

    let logging = validate_logging(&mut c, s);

    let bind_address = match s.bind_address.trim().parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => {
            c.fail("bindAddress", &s.bind_address, "not a valid textual representation of an IP address");
            IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
        }
    };
    let healthz_bind_address = c.host_port("healthzBindAddress", &s.healthz_bind_address);
    let metrics_bind_address = c.host_port("metricsBindAddress", &s.metrics_bind_address);
    if !s.show_hidden_metrics_for_version.is_empty() && !is_major_minor(&s.show_hidden_metrics_for_version) {
        c.fail("showHiddenMetricsForVersion", &s.show_hidden_metrics_for_version, "must be <major>.<minor>, e.g. 1.16");
    }

    let sync_field = format!("{section}.syncPeriod");
    let min_sync_field = format!("{section}.minSyncPeriod");
    let sync_period = c.positive(&sync_field, s.sync_period);
    let min_sync_period = c.non_negative(&min_sync_field, s.min_sync_period);
    if !s.min_sync_period.is_negative() && s.sync_period > GoDuration::ZERO && s.min_sync_period > s.sync_period {
        c.fail(&sync_field, s.sync_period, format!("must be greater than or equal to {min_sync_field}"));
    }

    let iptables_bit = c.masquerade_bit("iptables.masqueradeBit", s.iptables_masquerade_bit);
    let masquerade_bit = if s.raw_mode == "nftables" {
        c.masquerade_bit("nftables.masqueradeBit", s.nftables_masquerade_bit)
    } else {
        iptables_bit
    };

    if mode == ProxyMode::Ipvs && !gates.ipvs {
        c.fail("mode", "ipvs", "IPVS mode is turned off by the feature gate KubeProxyIPVS=false");
    }
    let ipvs = (mode == ProxyMode::Ipvs).then(|| validate_ipvs(&mut c, s));
    let detect_local = validate_detect_local(&mut c, s);

    let mut node_port_addresses = Vec::new();
    for (i, entry) in s.node_port_addresses.iter().enumerate() {
        let field = format!("nodePortAddresses[{i}]");
        match entry.trim() {
            "primary" => node_port_addresses.push(NodePortAddress::Primary),
            "all" => node_port_addresses.push(NodePortAddress::All),
            "localhost" => node_port_addresses.push(NodePortAddress::Localhost),
            text => match parse_cidr(text) {
                Some(net) => node_port_addresses.push(NodePortAddress::Cidr(net)),
                None => c.fail(field, entry, "must be a valid CIDR or one of the keywords primary, all, localhost"),
            },
        }
    }
    // A cluster's KubeProxyConfiguration with mode unset keeps kube-proxy's meaning; without a
    // file, an unset mode is kproxy's own default (nftables, NodePorts on primary addresses).
    let follow_upstream_default = s.raw_mode.is_empty() && s.from_file;
    let mode = if follow_upstream_default {
        let (mode, why) = unset_mode(s.localhost_node_ports, &node_port_addresses);
        warnings.push(why);
        mode
    } else {
        mode
    };
    let explain_access = ExplainAccess::parse(&s.explain_access).unwrap_or_else(|| {
        c.fail("explainAccess", &s.explain_access, "must be local, any or off");
        ExplainAccess::Local
    });
    if s.service_counters && mode != ProxyMode::Nftables {
        c.fail("serviceCounters", true, "per-Service counters are read from nftables maps: they need mode nftables");
    }
    if s.watch_kernel_changes == Some(true) && mode != ProxyMode::Nftables {
        c.fail(
            "watchKernelChanges",
            true,
            "follows nf_tables notifications about kproxy's own nftables tables: it needs mode nftables",
        );
    }
    if mode == ProxyMode::Nftables {
        for (i, entry) in node_port_addresses.iter().enumerate() {
            if is_loopback_only(entry) {
                c.fail(
                    format!("nodePortAddresses[{i}]"),
                    entry,
                    "NodePorts on loopback addresses are not served in nftables mode (upstream serves them \
                     only through the alpha KubeProxyNFTablesLocalhostNodePorts userspace proxy); use \
                     mode: iptables, or remove the entry",
                );
            }
        }
    }
    if s.node_port_addresses.is_empty() {
        node_port_addresses.push(match mode {
            // A file with mode unset: what kube-proxy's default (iptables) serves, whichever
            // dataplane runs.
            ProxyMode::Nftables if !follow_upstream_default => NodePortAddress::Primary,
            _ => NodePortAddress::All,
        });
    }

    if !(-1000..=1000).contains(&s.oom_score_adj) {
        c.fail("oomScoreAdj", s.oom_score_adj, "must be within the range [-1000, 1000]");
    }
    let conntrack = ConntrackConfig {
        max_per_core: c.non_negative_int("conntrack.maxPerCore", s.conntrack_max_per_core),
        min: c.non_negative_int("conntrack.min", s.conntrack_min),
        tcp_established_timeout: c.non_negative("conntrack.tcpEstablishedTimeout", s.conntrack_tcp_established_timeout),
        tcp_close_wait_timeout: c.non_negative("conntrack.tcpCloseWaitTimeout", s.conntrack_tcp_close_wait_timeout),
        tcp_be_liberal: s.conntrack_tcp_be_liberal,
        udp_timeout: c.non_negative("conntrack.udpTimeout", s.conntrack_udp_timeout),
        udp_stream_timeout: c.non_negative("conntrack.udpStreamTimeout", s.conntrack_udp_stream_timeout),
    };
    let config_sync_period = c.positive("configSyncPeriod", s.config_sync_period);
    if !valid_port_range(&s.port_range) {
        c.fail("portRange", &s.port_range, "must be a valid port range (e.g. 300-2000)");
    }

    if gates.no_masquerade_cidrs_off && !s.no_masquerade_cidrs.is_empty() {
        c.fail(
            "noMasqueradeCIDRs",
            s.no_masquerade_cidrs.join(","),
            "set while the feature gate KubeProxyNoMasqueradeCIDRs=false turns the feature off",
        );
    }
    let mut no_masquerade_cidrs = Vec::new();
    for (i, text) in s.no_masquerade_cidrs.iter().enumerate() {
        if let Some(net) = c.cidr(&format!("noMasqueradeCIDRs[{i}]"), text) {
            no_masquerade_cidrs.push(net);
        }
    }
    let packet_threshold = u32::try_from(s.acceleration_packet_threshold).unwrap_or_else(|_| {
        c.fail("acceleration.packetThreshold", s.acceleration_packet_threshold, "must be within [0, 4294967295]");
        0
    });

    if !c.errors.is_empty() {
        return Err(ConfigError::Invalid(c.errors));
    }
    Ok(ProxyConfig {
        mode,
        feature_gates: s.feature_gates.clone(),
        client_connection,
        logging,
        hostname_override: (!s.hostname_override.is_empty()).then(|| s.hostname_override.clone()),
        bind_address,
        healthz_bind_address,
        metrics_bind_address,
        bind_address_hard_fail: s.bind_address_hard_fail,
        enable_profiling: s.enable_profiling,
        show_hidden_metrics_for_version: (!s.show_hidden_metrics_for_version.is_empty())
            .then(|| s.show_hidden_metrics_for_version.clone()),
        sync_period,
        min_sync_period,
        masquerade_bit,
        masquerade_all: s.masquerade_all,
        localhost_node_ports: s.localhost_node_ports,
        ipvs,
        detect_local,
        node_port_addresses,
        oom_score_adj: s.oom_score_adj,
        conntrack,
        config_sync_period,
        no_masquerade_cidrs,
        snat_to_node_ip: s.snat_to_node_ip,
        service_counters: s.service_counters,
        watch_kernel_changes: s.watch_kernel_changes.unwrap_or(mode == ProxyMode::Nftables),
        take_over_kube_proxy: s.take_over_kube_proxy,
        explain_access,
        acceleration: AccelerationConfig {
            enabled: gates.acceleration.unwrap_or(s.acceleration_enabled),
            packet_threshold,
        },
        ..ProxyConfig::default()
    })
}

/// The dataplane for an unset `mode`. kube-proxy runs iptables then, so a cluster that swaps it for
/// kproxy with its ConfigMap unchanged (kubeadm writes `mode: ""`) must keep serving exactly what
/// iptables mode served. kproxy prefers nftables, and runs it when it serves the same: NodePorts on
/// every local address (unset nodePortAddresses then mean `all`, not nftables' `primary`). It
/// cannot serve NodePorts on 127.0.0.1, which iptables mode does by default
/// (`iptables.localhostNodePorts`), so when those are in play the answer is iptables. Returns the
/// mode and the sentence that says why, for the log.
fn unset_mode(localhost_node_ports: bool, node_port_addresses: &[NodePortAddress]) -> (ProxyMode, String) {
    let covers_loopback = node_port_addresses.is_empty()
        || node_port_addresses.iter().any(|entry| match entry {
            NodePortAddress::All | NodePortAddress::Localhost => true,
            NodePortAddress::Primary => false,
            NodePortAddress::Cidr(net) => net.contains(&IpAddr::from([127, 0, 0, 1])),
        });
    if localhost_node_ports && covers_loopback {
        let why = "mode is unset: kproxy runs iptables, as kube-proxy does, because this configuration \
                   serves NodePorts on 127.0.0.1 (iptables.localhostNodePorts, default true), which \
                   kproxy's nftables mode does not; set iptables.localhostNodePorts: false (or mode: \
                   nftables) to run nftables. The iptables section's settings apply";
        (ProxyMode::Iptables, why.to_owned())
    } else {
        let why = "mode is unset: kproxy runs nftables, serving NodePorts where kube-proxy's iptables \
                   default would (unset nodePortAddresses mean every local address, not nftables' \
                   primary); the iptables section's syncPeriod, minSyncPeriod, masqueradeAll and \
                   masqueradeBit apply";
        (ProxyMode::Nftables, why.to_owned())
    }
}

/// A `nodePortAddresses` entry that only names loopback addresses.
fn is_loopback_only(entry: &NodePortAddress) -> bool {
    match entry {
        NodePortAddress::Localhost => true,
        NodePortAddress::Cidr(net) => net.addr().is_loopback() && net.network().is_loopback(),
        NodePortAddress::Primary | NodePortAddress::All => false,
    }
}

fn validate_logging(c: &mut Checker<'_>, s: &Settings) -> LoggingConfig {
    let l = &s.logging;
    let format = match l.format.as_str() {
        "text" => LogFormat::Text,
        "json" => LogFormat::Json,
        other => {
            c.fail("logging.format", other, "must be text or json");
            LogFormat::Text
        }
    };
    let flush_frequency = c.positive("logging.flushFrequency", l.flush_frequency);
    for (i, (pattern, _)) in l.vmodule.iter().enumerate() {
        if pattern.is_empty() {
            c.fail(format!("logging.vmodule[{i}].filePattern"), pattern, "must not be empty");
        }
    }
    let mut quantity = |field: &str, text: &str| {
        parse_quantity(text).unwrap_or_else(|| {
            c.fail(field, text, "must be a non-negative quantity such as 0, 65536 or 64Ki");
            0
        })
    };
    let text_info_buffer_size = quantity("logging.options.text.infoBufferSize", &l.text_info_buffer_size);
    let json_info_buffer_size = quantity("logging.options.json.infoBufferSize", &l.json_info_buffer_size);
    LoggingConfig {
        format,
        verbosity: l.verbosity,
        vmodule: l.vmodule.clone(),
        flush_frequency,
        text_split_stream: l.text_split_stream,
        text_info_buffer_size,
        json_split_stream: l.json_split_stream,
        json_info_buffer_size,
    }
}

fn validate_ipvs(c: &mut Checker<'_>, s: &Settings) -> IpvsConfig {
    let scheduler = if s.ipvs_scheduler.is_empty() {
        IpvsScheduler::Rr
    } else {
        match IpvsScheduler::ALL.iter().find(|(name, _)| *name == s.ipvs_scheduler) {
            Some((_, sched)) => *sched,
            None => {
                c.fail(
                    "ipvs.scheduler",
                    &s.ipvs_scheduler,
                    "must be one of rr, wrr, lc, wlc, lblc, lblcr, sh, dh, sed, nq, mh, or blank (rr)",
                );
                IpvsScheduler::Rr
            }
        }
    };
    let mut exclude_cidrs = Vec::new();
    for (i, text) in s.ipvs_exclude_cidrs.iter().enumerate() {
        if let Some(net) = c.cidr(&format!("ipvs.excludeCIDRs[{i}]"), text) {
            exclude_cidrs.push(net);
        }
    }
    IpvsConfig {
        scheduler,
        exclude_cidrs,
        strict_arp: s.ipvs_strict_arp,
        tcp_timeout: c.non_negative("ipvs.tcpTimeout", s.ipvs_tcp_timeout),
        tcp_fin_timeout: c.non_negative("ipvs.tcpFinTimeout", s.ipvs_tcp_fin_timeout),
        udp_timeout: c.non_negative("ipvs.udpTimeout", s.ipvs_udp_timeout),
    }
}

fn validate_detect_local(c: &mut Checker<'_>, s: &Settings) -> DetectLocal {
    match s.detect_local_mode.as_str() {
        "" | "ClusterCIDR" => {
            let cidrs: Vec<&str> = s.cluster_cidrs.iter().map(|t| t.trim()).collect();
            let joined = s.cluster_cidrs.join(",");
            if cidrs.len() > 2 {
                c.fail("clusterCIDR", &joined, "must be a single CIDR or a dual-stack pair of CIDRs");
                return DetectLocal::ClusterCidr(Vec::new());
            }
            let mut nets = Vec::new();
            for text in &cidrs {
                match parse_cidr(text) {
                    Some(net) => nets.push(net),
                    None => {
                        c.fail("clusterCIDR", &joined, format!("{text:?} is not a valid CIDR (e.g. 10.100.0.0/16)"));
                        return DetectLocal::ClusterCidr(Vec::new());
                    }
                }
            }
            let same_family = matches!(nets.as_slice(), [IpNet::V4(_), IpNet::V4(_)] | [IpNet::V6(_), IpNet::V6(_)]);
            if same_family {
                c.fail("clusterCIDR", &joined, "two CIDRs must be a dual-stack pair (one IPv4, one IPv6)");
            }
            DetectLocal::ClusterCidr(nets)
        }
        "NodeCIDR" => DetectLocal::NodeCidr,
        "BridgeInterface" => {
            if s.bridge_interface.trim().is_empty() {
                c.fail("detectLocal.bridgeInterface", "", "must not be empty when detectLocalMode is BridgeInterface");
            }
            DetectLocal::BridgeInterface(s.bridge_interface.clone())
        }
        "InterfaceNamePrefix" => {
            if s.interface_name_prefix.trim().is_empty() {
                c.fail(
                    "detectLocal.interfaceNamePrefix",
                    "",
                    "must not be empty when detectLocalMode is InterfaceNamePrefix",
                );
            }
            DetectLocal::InterfaceNamePrefix(s.interface_name_prefix.clone())
        }
        other => {
            c.fail(
                "detectLocalMode",
                other,
                "supported values: ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix, or blank (ClusterCIDR)",
            );
            DetectLocal::ClusterCidr(Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs_need_a_prefix_and_are_masked() {
        assert_eq!(parse_cidr("10.1.2.3/16"), Some("10.1.0.0/16".parse().unwrap()));
        assert_eq!(parse_cidr("fd00::1/64"), Some("fd00::/64".parse().unwrap()));
        assert_eq!(parse_cidr("10.1.2.3"), None);
        assert_eq!(parse_cidr("10.1.2.3/33"), None);
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("0"), Some(0));
        assert_eq!(parse_quantity("64Ki"), Some(65536));
        assert_eq!(parse_quantity("1M"), Some(1_000_000));
        assert_eq!(parse_quantity("1Q"), None);
        assert_eq!(parse_quantity("-1"), None);
    }

    #[test]
    fn port_ranges() {
        assert!(valid_port_range(""));
        assert!(valid_port_range("300-2000"));
        assert!(valid_port_range("300+10"));
        assert!(!valid_port_range("2000-300"));
        assert!(!valid_port_range("1-70000"));
        assert!(!valid_port_range("abc"));
    }
}

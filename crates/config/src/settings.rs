//! The defaulted, mode-folded configuration that flags are applied to, before validation.
//!
//! This is kproxy's counterpart of upstream's *internal* config: a v1alpha1 document after
//! `SetDefaults_KubeProxyConfiguration` and the v1alpha1→internal conversion. Two upstream rules live
//! here and are easy to get wrong:
//!
//! * Defaulting treats zero as unset: `syncPeriod: 0s` in a file becomes 30s, `null` pointers get
//!   their defaults, while an explicit `0s` for a pointer duration (`conntrack.tcpEstablishedTimeout`)
//!   means "leave the kernel value". Flags are applied *after* defaulting, so `--iptables-sync-period=0`
//!   reaches validation and is rejected, as upstream.
//! * The per-mode sections (`iptables`, `ipvs`, `nftables`) fold into one sync period, min sync period,
//!   masqueradeAll and masquerade bit, chosen by the mode *as written*. An unset mode reads the
//!   `iptables` section — what upstream does — even though kproxy then runs nftables, so a kubeadm
//!   ConfigMap tuned for upstream's default keeps its meaning.
//!
//! Values stay as text here; [`crate::validate`] turns them into typed values and names the field
//! (and the flag, recorded in `origins`) of anything wrong.

use std::collections::BTreeMap;

use crate::document::{Document, QuantityDoc};
use crate::duration::GoDuration;

pub(crate) const HEALTHZ_PORT: u16 = 10256;
pub(crate) const METRICS_PORT: u16 = 10249;
/// Upstream's default: lists and watches ask for protobuf first.
pub(crate) const DEFAULT_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
pub(crate) const DEFAULT_FLUSH_FREQUENCY: GoDuration = GoDuration::from_secs(5);
pub(crate) const DEFAULT_PACKET_THRESHOLD: i64 = 20;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LoggingSettings {
    pub format: String,
    pub flush_frequency: GoDuration,
    pub verbosity: u32,
    pub vmodule: Vec<(String, u32)>,
    pub text_split_stream: bool,
    pub text_info_buffer_size: String,
    pub json_split_stream: bool,
    pub json_info_buffer_size: String,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settings {
    /// The mode as written (`""` when unset); decides which section's fields apply.
    pub raw_mode: String,
    pub feature_gates: BTreeMap<String, bool>,
    pub kubeconfig: String,
    pub accept_content_types: String,
    pub content_type: String,
    pub qps: f32,
    pub burst: i32,
    pub logging: LoggingSettings,
    pub hostname_override: String,
    pub bind_address: String,
    pub healthz_bind_address: String,
    pub metrics_bind_address: String,
    pub bind_address_hard_fail: bool,
    pub enable_profiling: bool,
    pub show_hidden_metrics_for_version: String,
    pub sync_period: GoDuration,
    pub min_sync_period: GoDuration,
    pub masquerade_all: bool,
    pub iptables_masquerade_bit: i32,
    pub nftables_masquerade_bit: i32,
    pub localhost_node_ports: bool,
    pub ipvs_scheduler: String,
    pub ipvs_exclude_cidrs: Vec<String>,
    pub ipvs_strict_arp: bool,
    pub ipvs_tcp_timeout: GoDuration,
    pub ipvs_tcp_fin_timeout: GoDuration,
    pub ipvs_udp_timeout: GoDuration,
    pub detect_local_mode: String,
    pub bridge_interface: String,
    pub interface_name_prefix: String,
    pub cluster_cidrs: Vec<String>,
    pub node_port_addresses: Vec<String>,
    pub oom_score_adj: i32,
    pub conntrack_max_per_core: i32,
    pub conntrack_min: i32,
    pub conntrack_tcp_established_timeout: GoDuration,
    pub conntrack_tcp_close_wait_timeout: GoDuration,
    pub conntrack_tcp_be_liberal: bool,
    pub conntrack_udp_timeout: GoDuration,
    pub conntrack_udp_stream_timeout: GoDuration,
    pub config_sync_period: GoDuration,
    pub port_range: String,
    pub no_masquerade_cidrs: Vec<String>,
    pub snat_to_node_ip: bool,
    pub service_counters: bool,
    /// `None`: the mode's default (on in nftables mode).
    pub watch_kernel_changes: Option<bool>,
    pub acceleration_enabled: bool,
    pub acceleration_packet_threshold: i64,
    pub take_over_kube_proxy: bool,
    pub explain_access: String,
    /// Field path → the flag that set it, for error messages.
    pub origins: BTreeMap<String, String>,
    /// The settings come from a `--config` file (a cluster's KubeProxyConfiguration).
    pub from_file: bool,
}

impl Settings {
    /// The section whose sync periods and masquerade settings apply for the mode as written.
    pub fn mode_section(&self) -> &'static str {
        section_for(&self.raw_mode)
    }

    /// Records that `field` was set by `flag`.
    pub fn set_by(&mut self, field: impl Into<String>, flag: &str) {
        self.origins.insert(field.into(), flag.to_string());
    }
}

fn section_for(mode: &str) -> &'static str {
    match mode {
        "ipvs" => "ipvs",
        "nftables" => "nftables",
        _ => "iptables",
    }
}

fn nonzero(d: Option<GoDuration>, default: GoDuration) -> GoDuration {
    match d {
        Some(d) if d != GoDuration::ZERO => d,
        _ => default,
    }
}

fn nonempty(s: Option<String>, default: &str) -> String {
    match s {
        Some(s) if !s.is_empty() => s,
        _ => default.to_string(),
    }
}

fn quantity_text(q: Option<QuantityDoc>) -> String {
    match q {
        Some(QuantityDoc::Number(n)) => n.to_string(),
        Some(QuantityDoc::Text(t)) => t,
        None => "0".to_string(),
    }
}

/// Appends `port` to an IP address without one, as upstream's `AppendPortIfNeeded`; anything else
/// is returned unchanged for validation to judge.
pub(crate) fn append_port_if_needed(addr: &str, port: u16) -> String {
    if addr.parse::<std::net::SocketAddr>().is_ok() || split_host_port(addr).is_some() {
        return addr.to_string();
    }
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => format!("{addr}:{port}"),
        Ok(std::net::IpAddr::V6(_)) => format!("[{addr}]:{port}"),
        Err(_) => addr.to_string(),
    }
}

/// Go's `net.SplitHostPort` for the `host:port` / `[v6]:port` shapes.
pub(crate) fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':')?;
        return Some((host, port));
    }
    let (host, port) = s.rsplit_once(':')?;
    if host.contains(':') {
        return None;
    }
    Some((host, port))
}

/// Upstream's defaulting plus v1alpha1→internal conversion of a document (an empty one for flags only).
pub(crate) fn from_document(doc: Document) -> Settings {
    let raw_mode = doc.mode.unwrap_or_default();
    let section = section_for(&raw_mode);
    let bind_address = nonempty(doc.bind_address, "0.0.0.0");
    let bind_is_v4 = bind_address.parse::<std::net::Ipv4Addr>().is_ok();
    let (healthz_host, metrics_host) = if bind_is_v4 { ("0.0.0.0", "127.0.0.1") } else { ("[::]", "[::1]") };
    let healthz_bind_address = match doc.healthz_bind_address.unwrap_or_default() {
        a if a.is_empty() => format!("{healthz_host}:{HEALTHZ_PORT}"),
        a => append_port_if_needed(&a, HEALTHZ_PORT),
    };
    let metrics_bind_address = match doc.metrics_bind_address.unwrap_or_default() {
        a if a.is_empty() => format!("{metrics_host}:{METRICS_PORT}"),
        a => append_port_if_needed(&a, METRICS_PORT),
    };

    let cc = doc.client_connection.unwrap_or_default();
    let log = doc.logging.unwrap_or_default();
    let log_options = log.options.unwrap_or_default();
    let text = log_options.text.unwrap_or_default();
    let json = log_options.json.unwrap_or_default();
    let ipt = doc.iptables.unwrap_or_default();
    let ipvs = doc.ipvs.unwrap_or_default();
    let nft = doc.nftables.unwrap_or_default();
    let dl = doc.detect_local.unwrap_or_default();
    let ct = doc.conntrack.unwrap_or_default();
    let accel = doc.acceleration.unwrap_or_default();

    let thirty = GoDuration::from_secs(30);
    let one = GoDuration::from_secs(1);
    let iptables_sync = nonzero(ipt.sync_period, thirty);
    let iptables_min_sync = nonzero(ipt.min_sync_period, one);
    let ipvs_sync = nonzero(ipvs.sync_period, thirty);
    let ipvs_min_sync = nonzero(ipvs.min_sync_period, one);
    let nft_sync = nonzero(nft.sync_period, thirty);
    let nft_min_sync = nonzero(nft.min_sync_period, one);
    let (sync_period, min_sync_period) = match section {
        "ipvs" => (ipvs_sync, ipvs_min_sync),
        "nftables" => (nft_sync, nft_min_sync),
        _ => (iptables_sync, iptables_min_sync),
    };
    let masquerade_all = match section {
        "nftables" => nft.masquerade_all.unwrap_or(false),
        _ => ipt.masquerade_all.unwrap_or(false),
    };

    Settings {
        feature_gates: doc.feature_gates.unwrap_or_default(),
        kubeconfig: cc.kubeconfig.unwrap_or_default(),
        accept_content_types: cc.accept_content_types.unwrap_or_default(),
        content_type: nonempty(cc.content_type, DEFAULT_CONTENT_TYPE),
        qps: match cc.qps {
            Some(q) if q != 0.0 => q,
            _ => 5.0,
        },
        burst: match cc.burst {
            Some(b) if b != 0 => b,
            _ => 10,
        },
        logging: LoggingSettings {
            format: nonempty(log.format, "text"),
            flush_frequency: nonzero(log.flush_frequency.map(|f| f.duration()), DEFAULT_FLUSH_FREQUENCY),
            verbosity: log.verbosity.unwrap_or(0),
            vmodule: log.vmodule.unwrap_or_default().into_iter().map(|v| (v.file_pattern, v.verbosity)).collect(),
            text_split_stream: text.split_stream.unwrap_or(false),
            text_info_buffer_size: quantity_text(text.info_buffer_size),
            json_split_stream: json.split_stream.unwrap_or(false),
            json_info_buffer_size: quantity_text(json.info_buffer_size),
        },
        hostname_override: doc.hostname_override.unwrap_or_default(),
        bind_address,
        healthz_bind_address,
        metrics_bind_address,
        bind_address_hard_fail: doc.bind_address_hard_fail.unwrap_or(false),
        enable_profiling: doc.enable_profiling.unwrap_or(false),
        show_hidden_metrics_for_version: doc.show_hidden_metrics_for_version.unwrap_or_default(),
        sync_period,
        min_sync_period,
        masquerade_all,
        iptables_masquerade_bit: ipt.masquerade_bit.unwrap_or(14),
        nftables_masquerade_bit: nft.masquerade_bit.unwrap_or(14),
        localhost_node_ports: ipt.localhost_node_ports.unwrap_or(true),
        ipvs_scheduler: ipvs.scheduler.unwrap_or_default(),
        ipvs_exclude_cidrs: ipvs.exclude_cidrs.unwrap_or_default(),
        ipvs_strict_arp: ipvs.strict_arp.unwrap_or(false),
        ipvs_tcp_timeout: ipvs.tcp_timeout.unwrap_or_default(),
        ipvs_tcp_fin_timeout: ipvs.tcp_fin_timeout.unwrap_or_default(),
        ipvs_udp_timeout: ipvs.udp_timeout.unwrap_or_default(),
        detect_local_mode: doc.detect_local_mode.unwrap_or_default(),
        bridge_interface: dl.bridge_interface.unwrap_or_default(),
        interface_name_prefix: dl.interface_name_prefix.unwrap_or_default(),
        cluster_cidrs: match doc.cluster_cidr {
            Some(c) if !c.is_empty() => c.split(',').map(str::to_string).collect(),
            _ => Vec::new(),
        },
        node_port_addresses: doc.node_port_addresses.unwrap_or_default(),
        oom_score_adj: doc.oom_score_adj.unwrap_or(-999),
        conntrack_max_per_core: ct.max_per_core.unwrap_or(32 * 1024),
        conntrack_min: ct.min.unwrap_or(128 * 1024),
        conntrack_tcp_established_timeout: ct.tcp_established_timeout.unwrap_or(GoDuration::from_secs(24 * 3600)),
        conntrack_tcp_close_wait_timeout: ct.tcp_close_wait_timeout.unwrap_or(GoDuration::from_secs(3600)),
        conntrack_tcp_be_liberal: ct.tcp_be_liberal.unwrap_or(false),
        conntrack_udp_timeout: ct.udp_timeout.unwrap_or_default(),
        conntrack_udp_stream_timeout: ct.udp_stream_timeout.unwrap_or_default(),
        config_sync_period: nonzero(doc.config_sync_period, GoDuration::from_secs(15 * 60)),
        port_range: doc.port_range.unwrap_or_default(),
        no_masquerade_cidrs: doc.no_masquerade_cidrs.unwrap_or_default(),
        snat_to_node_ip: doc.snat_to_node_ip.unwrap_or(false),
        service_counters: doc.service_counters.unwrap_or(false),
        watch_kernel_changes: doc.watch_kernel_changes,
        acceleration_enabled: accel.enabled.unwrap_or(true),
        acceleration_packet_threshold: accel.packet_threshold.unwrap_or(DEFAULT_PACKET_THRESHOLD),
        take_over_kube_proxy: doc.take_over_kube_proxy.unwrap_or(true),
        explain_access: doc.explain_access.unwrap_or_else(|| "local".to_owned()),
        raw_mode,
        origins: BTreeMap::new(),
        from_file: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_document_gets_upstream_defaults() {
        let s = from_document(Document::default());
        assert_eq!(s.healthz_bind_address, "0.0.0.0:10256");
        assert_eq!(s.metrics_bind_address, "127.0.0.1:10249");
        assert_eq!(s.sync_period, GoDuration::from_secs(30));
        assert_eq!(s.min_sync_period, GoDuration::from_secs(1));
        assert_eq!(s.config_sync_period, GoDuration::from_secs(900));
        assert_eq!((s.qps, s.burst), (5.0, 10));
        assert_eq!(s.conntrack_max_per_core, 32768);
        assert_eq!(s.conntrack_min, 131072);
        assert_eq!(s.oom_score_adj, -999);
    }

    #[test]
    fn ipv6_bind_address_moves_server_defaults_to_ipv6() {
        let s = from_document(Document { bind_address: Some("fd00::1".into()), ..Document::default() });
        assert_eq!(s.healthz_bind_address, "[::]:10256");
        assert_eq!(s.metrics_bind_address, "[::1]:10249");
    }

    #[test]
    fn port_is_appended_only_to_bare_ips() {
        assert_eq!(append_port_if_needed("192.0.2.1", 10256), "192.0.2.1:10256");
        assert_eq!(append_port_if_needed("fd00::1", 10256), "[fd00::1]:10256");
        assert_eq!(append_port_if_needed("192.0.2.1:99", 10256), "192.0.2.1:99");
        assert_eq!(append_port_if_needed("nonsense", 10256), "nonsense");
    }

    #[test]
    fn mode_selects_the_section_that_applies() {
        let mut doc = Document {
            iptables: Some(crate::document::IptablesDoc {
                sync_period: Some(GoDuration::from_secs(10)),
                masquerade_all: Some(true),
                ..Default::default()
            }),
            nftables: Some(crate::document::NftablesDoc {
                sync_period: Some(GoDuration::from_secs(20)),
                ..Default::default()
            }),
            ..Document::default()
        };
        let unset = from_document(doc.clone());
        assert_eq!((unset.sync_period, unset.masquerade_all), (GoDuration::from_secs(10), true));
        doc.mode = Some("nftables".into());
        let nft = from_document(doc);
        assert_eq!((nft.sync_period, nft.masquerade_all), (GoDuration::from_secs(20), false));
    }
}

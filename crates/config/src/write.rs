//! `--write-config-to`: the effective configuration as a `KubeProxyConfiguration` document.
//!
//! Like upstream's encoder, every field is written (keys sorted, durations in Go syntax) and the
//! sync periods and masqueradeAll go into the section of the resolved mode, which is written out
//! explicitly, so reading the file back gives the same configuration. kproxy's extension fields are
//! included; kube-proxy itself would accept such a file only through its lenient decoding fallback.

use std::path::Path;

use crate::document::{
    API_VERSION, AccelerationDoc, ClientConnectionDoc, ConntrackDoc, DetectLocalDoc, Document, FlushFrequency,
    FormatOptionsDoc, IptablesDoc, IpvsDoc, KIND, LoggingDoc, LoggingOptionsDoc, NftablesDoc, QuantityDoc, VModuleDoc,
    WinkernelDoc,
};
use crate::duration::GoDuration;
use crate::error::ConfigError;
use crate::model::{DetectLocal, IpvsScheduler, LogFormat, ProxyConfig, ProxyMode};

fn d(duration: std::time::Duration) -> Option<GoDuration> {
    Some(GoDuration::from_std(duration))
}

impl ProxyConfig {
    /// The configuration as a `kubeproxy.config.k8s.io/v1alpha1` `KubeProxyConfiguration` YAML document.
    pub fn to_kube_proxy_configuration_yaml(&self) -> Result<String, ConfigError> {
        let value = serde_json::to_value(self.to_document()).map_err(|e| ConfigError::Serialize(e.to_string()))?;
        serde_saphyr::to_string(&sorted(value)).map_err(|e| ConfigError::Serialize(e.to_string()))
    }

    /// Writes [`Self::to_kube_proxy_configuration_yaml`] to `path` (for `--write-config-to`).
    pub fn write_config_file(&self, path: &Path) -> Result<(), ConfigError> {
        let yaml = self.to_kube_proxy_configuration_yaml()?;
        std::fs::write(path, yaml).map_err(|source| ConfigError::Write { path: path.to_path_buf(), source })
    }

    fn to_document(&self) -> Document {
        let mode_is = |m: ProxyMode| self.mode == m;
        let period = |m: ProxyMode, value: std::time::Duration, default: u64| {
            d(if mode_is(m) { value } else { std::time::Duration::from_secs(default) })
        };
        let ipvs = self.ipvs.clone();
        let logging = &self.logging;
        let (detect_local_doc, cluster_cidr) = match &self.detect_local {
            DetectLocal::ClusterCidr(nets) => {
                (DetectLocalDoc::default(), nets.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))
            }
            DetectLocal::BridgeInterface(name) => {
                (DetectLocalDoc { bridge_interface: Some(name.clone()), ..Default::default() }, String::new())
            }
            DetectLocal::InterfaceNamePrefix(prefix) => {
                (DetectLocalDoc { interface_name_prefix: Some(prefix.clone()), ..Default::default() }, String::new())
            }
            DetectLocal::NodeCidr => (DetectLocalDoc::default(), String::new()),
        };
        let format_options = |split: bool, size: u64| FormatOptionsDoc {
            split_stream: Some(split),
            info_buffer_size: Some(QuantityDoc::Text(size.to_string())),
        };
        Document {
            api_version: Some(API_VERSION.to_string()),
            kind: Some(KIND.to_string()),
            feature_gates: Some(self.feature_gates.clone()),
            client_connection: Some(ClientConnectionDoc {
                kubeconfig: Some(
                    self.client_connection.kubeconfig.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                ),
                accept_content_types: Some(self.client_connection.accept_content_types.clone()),
                content_type: Some(self.client_connection.content_type.clone()),
                qps: Some(self.client_connection.qps),
                burst: Some(i32::try_from(self.client_connection.burst).unwrap_or(i32::MAX)),
            }),
            logging: Some(LoggingDoc {
                format: Some(match logging.format {
                    LogFormat::Text => "text".to_string(),
                    LogFormat::Json => "json".to_string(),
                }),
                flush_frequency: Some(FlushFrequency::Text(GoDuration::from_std(logging.flush_frequency))),
                verbosity: Some(logging.verbosity),
                vmodule: (!logging.vmodule.is_empty()).then(|| {
                    logging.vmodule.iter().map(|(p, v)| VModuleDoc { file_pattern: p.clone(), verbosity: *v }).collect()
                }),
                options: Some(LoggingOptionsDoc {
                    text: Some(format_options(logging.text_split_stream, logging.text_info_buffer_size)),
                    json: Some(format_options(logging.json_split_stream, logging.json_info_buffer_size)),
                }),
            }),
            hostname_override: Some(self.hostname_override.clone().unwrap_or_default()),
            bind_address: Some(self.bind_address.to_string()),
            healthz_bind_address: Some(self.healthz_bind_address.map(|a| a.to_string()).unwrap_or_default()),
            metrics_bind_address: Some(self.metrics_bind_address.map(|a| a.to_string()).unwrap_or_default()),
            bind_address_hard_fail: Some(self.bind_address_hard_fail),
            enable_profiling: Some(self.enable_profiling),
            show_hidden_metrics_for_version: Some(self.show_hidden_metrics_for_version.clone().unwrap_or_default()),
            mode: Some(self.mode.as_str().to_string()),
            iptables: Some(IptablesDoc {
                masquerade_bit: Some(i32::from(self.masquerade_bit)),
                masquerade_all: Some(!mode_is(ProxyMode::Nftables) && self.masquerade_all),
                localhost_node_ports: Some(self.localhost_node_ports),
                sync_period: period(ProxyMode::Iptables, self.sync_period, 30),
                min_sync_period: period(ProxyMode::Iptables, self.min_sync_period, 1),
            }),
            ipvs: Some(IpvsDoc {
                sync_period: period(ProxyMode::Ipvs, self.sync_period, 30),
                min_sync_period: period(ProxyMode::Ipvs, self.min_sync_period, 1),
                scheduler: Some(ipvs.as_ref().map(|i| i.scheduler).unwrap_or(IpvsScheduler::Rr).as_str().to_string()),
                exclude_cidrs: Some(
                    ipvs.as_ref()
                        .map(|i| i.exclude_cidrs.iter().map(ToString::to_string).collect())
                        .unwrap_or_default(),
                ),
                strict_arp: Some(ipvs.as_ref().is_some_and(|i| i.strict_arp)),
                tcp_timeout: d(ipvs.as_ref().map(|i| i.tcp_timeout).unwrap_or_default()),
                tcp_fin_timeout: d(ipvs.as_ref().map(|i| i.tcp_fin_timeout).unwrap_or_default()),
                udp_timeout: d(ipvs.as_ref().map(|i| i.udp_timeout).unwrap_or_default()),
            }),
            nftables: Some(NftablesDoc {
                masquerade_bit: Some(i32::from(self.masquerade_bit)),
                masquerade_all: Some(mode_is(ProxyMode::Nftables) && self.masquerade_all),
                sync_period: period(ProxyMode::Nftables, self.sync_period, 30),
                min_sync_period: period(ProxyMode::Nftables, self.min_sync_period, 1),
            }),
            winkernel: Some(WinkernelDoc {
                network_name: Some(String::new()),
                source_vip: Some(String::new()),
                enable_dsr: Some(false),
                root_hns_endpoint_name: Some("cbr0".to_string()),
                forward_health_check_vip: Some(false),
            }),
            detect_local_mode: Some(self.detect_local.mode_name().to_string()),
            detect_local: Some(DetectLocalDoc {
                bridge_interface: Some(detect_local_doc.bridge_interface.unwrap_or_default()),
                interface_name_prefix: Some(detect_local_doc.interface_name_prefix.unwrap_or_default()),
            }),
            cluster_cidr: Some(cluster_cidr),
            node_port_addresses: Some(self.node_port_addresses.iter().map(ToString::to_string).collect()),
            oom_score_adj: Some(self.oom_score_adj),
            conntrack: Some(ConntrackDoc {
                max_per_core: Some(i32::try_from(self.conntrack.max_per_core).unwrap_or(i32::MAX)),
                min: Some(i32::try_from(self.conntrack.min).unwrap_or(i32::MAX)),
                tcp_established_timeout: d(self.conntrack.tcp_established_timeout),
                tcp_close_wait_timeout: d(self.conntrack.tcp_close_wait_timeout),
                tcp_be_liberal: Some(self.conntrack.tcp_be_liberal),
                udp_timeout: d(self.conntrack.udp_timeout),
                udp_stream_timeout: d(self.conntrack.udp_stream_timeout),
            }),
            config_sync_period: d(self.config_sync_period),
            port_range: Some(String::new()),
            windows_run_as_service: None,
            no_masquerade_cidrs: Some(self.no_masquerade_cidrs.iter().map(ToString::to_string).collect()),
            snat_to_node_ip: Some(self.snat_to_node_ip),
            service_counters: Some(self.service_counters),
            watch_kernel_changes: Some(self.watch_kernel_changes),
            acceleration: Some(AccelerationDoc {
                enabled: Some(self.acceleration.enabled),
                packet_threshold: Some(i64::from(self.acceleration.packet_threshold)),
            }),
            take_over_kube_proxy: Some(self.take_over_kube_proxy),
            explain_access: Some(self.explain_access.as_str().to_owned()),
        }
    }
}

/// Rebuilds objects with keys in sorted order (as Go's YAML encoder writes them), whatever
/// `serde_json`'s map ordering feature is.
fn sorted(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        serde_json::Value::Array(items) => serde_json::Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

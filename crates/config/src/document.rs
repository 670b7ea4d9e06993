//! The `kubeproxy.config.k8s.io/v1alpha1` `KubeProxyConfiguration` document, field for field.
//!
//! These types mirror the wire format (kubernetes/kube-proxy `config/v1alpha1/types.go`) and nothing
//! more: every field is optional so that "absent", `null` and a value can be told apart by the
//! defaulting step, exactly as upstream's pointer fields and zero values are. Unknown fields are
//! rejected (`deny_unknown_fields`) so a typo never silently falls back to a default.
//!
//! Parsing goes YAML/JSON → `serde_json::Value` → these types through `serde_path_to_error`, so a
//! type error names its path (`iptables.syncPeriod: invalid duration "3x"`) whichever syntax the
//! file used. kproxy's own extensions (`noMasqueradeCIDRs`, `snatToNodeIP`, `serviceCounters`,
//! `acceleration`) are fields of the same document.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::duration::GoDuration;
use crate::error::ConfigError;

/// The only apiVersion kproxy reads and writes.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
/// The only kind kproxy reads and writes.
pub const KIND: &str = "KubeProxyConfiguration";

#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Document {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub feature_gates: Option<BTreeMap<String, bool>>,
    pub client_connection: Option<ClientConnectionDoc>,
    pub logging: Option<LoggingDoc>,
    pub hostname_override: Option<String>,
    pub bind_address: Option<String>,
    pub healthz_bind_address: Option<String>,
    pub metrics_bind_address: Option<String>,
    pub bind_address_hard_fail: Option<bool>,
    pub enable_profiling: Option<bool>,
    pub show_hidden_metrics_for_version: Option<String>,
    pub mode: Option<String>,
    pub iptables: Option<IptablesDoc>,
    pub ipvs: Option<IpvsDoc>,
    pub nftables: Option<NftablesDoc>,
    pub winkernel: Option<WinkernelDoc>,
    pub detect_local_mode: Option<String>,
    pub detect_local: Option<DetectLocalDoc>,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    pub node_port_addresses: Option<Vec<String>>,
    pub oom_score_adj: Option<i32>,
    pub conntrack: Option<ConntrackDoc>,
    pub config_sync_period: Option<GoDuration>,
    pub port_range: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub windows_run_as_service: Option<bool>,
    // kproxy extensions.
    #[serde(rename = "noMasqueradeCIDRs")]
    pub no_masquerade_cidrs: Option<Vec<String>>,
    #[serde(rename = "snatToNodeIP")]
    pub snat_to_node_ip: Option<bool>,
    pub service_counters: Option<bool>,
    pub watch_kernel_changes: Option<bool>,
    pub acceleration: Option<AccelerationDoc>,
    pub take_over_kube_proxy: Option<bool>,
    pub explain_access: Option<String>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ClientConnectionDoc {
    pub kubeconfig: Option<String>,
    pub accept_content_types: Option<String>,
    pub content_type: Option<String>,
    pub qps: Option<f32>,
    pub burst: Option<i32>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct LoggingDoc {
    pub format: Option<String>,
    pub flush_frequency: Option<FlushFrequency>,
    pub verbosity: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vmodule: Option<Vec<VModuleDoc>>,
    pub options: Option<LoggingOptionsDoc>,
}

/// component-base accepts the flush frequency as a duration string or as integer nanoseconds
/// (kubeadm writes `flushFrequency: 0`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub(crate) enum FlushFrequency {
    Nanoseconds(i64),
    Text(GoDuration),
}

impl FlushFrequency {
    pub fn duration(&self) -> GoDuration {
        match self {
            FlushFrequency::Nanoseconds(n) => GoDuration(*n),
            FlushFrequency::Text(d) => *d,
        }
    }
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct VModuleDoc {
    pub file_pattern: String,
    pub verbosity: u32,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct LoggingOptionsDoc {
    pub text: Option<FormatOptionsDoc>,
    pub json: Option<FormatOptionsDoc>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct FormatOptionsDoc {
    pub split_stream: Option<bool>,
    pub info_buffer_size: Option<QuantityDoc>,
}

/// A Kubernetes `resource.Quantity`: `"0"`, `"64Ki"`, or a bare number.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(untagged)]
pub(crate) enum QuantityDoc {
    Number(u64),
    Text(String),
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct IptablesDoc {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    pub localhost_node_ports: Option<bool>,
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct IpvsDoc {
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
    pub scheduler: Option<String>,
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP")]
    pub strict_arp: Option<bool>,
    pub tcp_timeout: Option<GoDuration>,
    pub tcp_fin_timeout: Option<GoDuration>,
    pub udp_timeout: Option<GoDuration>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct NftablesDoc {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
}

/// Windows-only settings: accepted so a shared ConfigMap parses, otherwise ignored.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct WinkernelDoc {
    pub network_name: Option<String>,
    pub source_vip: Option<String>,
    #[serde(rename = "enableDSR")]
    pub enable_dsr: Option<bool>,
    pub root_hns_endpoint_name: Option<String>,
    pub forward_health_check_vip: Option<bool>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct DetectLocalDoc {
    pub bridge_interface: Option<String>,
    pub interface_name_prefix: Option<String>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ConntrackDoc {
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_established_timeout: Option<GoDuration>,
    pub tcp_close_wait_timeout: Option<GoDuration>,
    pub tcp_be_liberal: Option<bool>,
    pub udp_timeout: Option<GoDuration>,
    pub udp_stream_timeout: Option<GoDuration>,
}

#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct AccelerationDoc {
    pub enabled: Option<bool>,
    pub packet_threshold: Option<i64>,
}

/// Reads and parses a KubeProxyConfiguration file (YAML or JSON).
pub(crate) fn load(path: &Path) -> Result<Document, ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
    parse(path, &bytes)
}

/// Parses a KubeProxyConfiguration from bytes; `path` is only used in messages.
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<Document, ConfigError> {
    let fail = |field: Option<String>, message: String| ConfigError::Parse { path: path.to_path_buf(), field, message };
    let text = std::str::from_utf8(bytes).map_err(|e| fail(None, format!("not UTF-8: {e}")))?;
    if text.trim().is_empty() {
        return Err(fail(None, "the file is empty".to_string()));
    }
    // JSON is tried first when the text looks like it, for JSON's sharper messages; a YAML flow
    // mapping (`{apiVersion: ...}`) also starts with `{`, so YAML gets its turn before giving up.
    let value: serde_json::Value = if text.trim_start().starts_with('{') {
        match serde_json::from_str(text) {
            Ok(value) => value,
            Err(json_error) => {
                serde_saphyr::from_str(text).map_err(|_| fail(None, format!("invalid JSON: {json_error}")))?
            }
        }
    } else {
        serde_saphyr::from_str(text).map_err(|e| fail(None, format!("invalid YAML: {e}")))?
    };
    let serde_json::Value::Object(map) = &value else {
        return Err(fail(None, "expected a KubeProxyConfiguration object at the top level".to_string()));
    };
    check_type_meta(map).map_err(|(field, message)| fail(Some(field.to_string()), message))?;
    serde_path_to_error::deserialize(&value).map_err(|e| {
        let (field, message) = describe(&e);
        fail(field, message)
    })
}

fn check_type_meta(map: &serde_json::Map<String, serde_json::Value>) -> Result<(), (&'static str, String)> {
    for (field, want) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        match map.get(field) {
            None | Some(serde_json::Value::Null) => return Err((field, format!("missing; must be {want:?}"))),
            Some(serde_json::Value::String(s)) if s == want => {}
            Some(other) => return Err((field, format!("unsupported value {other}; kproxy reads {want:?}"))),
        }
    }
    Ok(())
}

/// Turns a path-tracked serde error into (field path, message). An unknown field is reported at its
/// own path (`iptables.syncPeriodd`), not at its parent's.
fn describe(error: &serde_path_to_error::Error<serde_json::Error>) -> (Option<String>, String) {
    let parent = error.path().to_string();
    let message = error.inner().to_string();
    let parent = if parent == "." || parent.is_empty() { None } else { Some(parent) };
    if let Some(name) = message.strip_prefix("unknown field `").and_then(|rest| rest.split('`').next()) {
        let field = match parent {
            Some(p) if !p.ends_with(name) => format!("{p}.{name}"),
            Some(p) => p,
            None => name.to_string(),
        };
        let expected: Vec<&str> = message.split('`').skip(3).step_by(2).collect();
        let hint = match expected.iter().find(|e| e.eq_ignore_ascii_case(name)) {
            Some(close) => format!("; did you mean `{close}`?"),
            None => String::new(),
        };
        return (Some(field), format!("unknown field (kproxy rejects fields it does not know){hint}"));
    }
    (parent, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str) -> Result<Document, ConfigError> {
        parse(Path::new("test.yaml"), text.as_bytes())
    }

    #[test]
    fn yaml_flow_mapping_is_not_mistaken_for_json() {
        let doc =
            parse_text("{apiVersion: kubeproxy.config.k8s.io/v1alpha1, kind: KubeProxyConfiguration, mode: ipvs}")
                .unwrap();
        assert_eq!(doc.mode.as_deref(), Some("ipvs"));
    }

    #[test]
    fn broken_json_reports_the_json_error() {
        let err = parse_text("{\"apiVersion\": \"kubeproxy.config.k8s.io/v1alpha1\",, }").unwrap_err();
        assert!(err.to_string().contains("invalid JSON"), "{err}");
    }

    #[test]
    fn duplicate_yaml_keys_are_rejected() {
        let err = parse_text(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\nmode: iptables\n",
        )
        .unwrap_err();
        let message = err.to_string();
        assert!(message.contains("invalid YAML") && message.to_lowercase().contains("duplicate"), "{message}");
    }

    #[test]
    fn empty_and_non_object_documents_are_rejected() {
        assert!(parse_text("  \n").unwrap_err().to_string().contains("empty"));
        assert!(parse_text("- a\n- b\n").unwrap_err().to_string().contains("top level"));
    }
}

//! kube-proxy's command line, flag for flag (Linux), plus kproxy's own flags.
//!
//! Every flag is an `Option`: `None` means "not on the command line", which is all upstream's
//! precedence needs (pflag's `Changed`), so no `ArgMatches` has to travel with the values. Defaults
//! are applied by [`crate::resolve`], not by clap; the help text states them.
//!
//! Syntax follows pflag where it matters to existing manifests: `--flag=value` and `--flag value`,
//! booleans as `--flag`, `--flag=true|false` (also `1`, `t`, `T`, `TRUE`, `True`, `0`, `f`, …), list
//! flags comma-separated and repeatable, `-v=4` / `-v 4` / `--v=4` for verbosity.

use std::path::PathBuf;

use crate::duration::GoDuration;
use crate::error::ConfigError;

/// Go's `strconv.ParseBool`.
pub(crate) fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("invalid boolean {s:?} (use true or false)")),
    }
}

fn parse_duration(s: &str) -> Result<GoDuration, String> {
    GoDuration::parse(s).map_err(|e| e.to_string())
}

/// All command-line flags. Flatten into the binary's parser:
/// `#[command(flatten)] flags: kproxy_config::Flags`. Every flag is global: accepted before or
/// after a subcommand (`kproxy explain --cluster-cidr …` as `kproxy --cluster-cidr … explain`),
/// so a subcommand reads the daemon's own flags and `--config`.
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
#[command(next_help_heading = "kube-proxy flags")]
pub struct Flags {
    // ---- process control -------------------------------------------------------------------------
    /// The path to the configuration file (KubeProxyConfiguration, YAML or JSON).
    #[arg(global = true, long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// If set, write the effective configuration to this file and exit.
    #[arg(global = true, long, value_name = "FILE")]
    pub write_config_to: Option<PathBuf>,
    /// If true cleanup iptables, ipvs and nftables rules and exit.
    #[arg(global = true, long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub cleanup: Option<bool>,
    /// If true, perform any initialization steps that must be done with full root privileges, and then
    /// exit. After doing this, you can run kproxy again with only the CAP_NET_ADMIN capability.
    #[arg(global = true, long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub init_only: Option<bool>,
    /// Print version information and quit (true, false or raw).
    #[arg(global = true, long, value_name = "true|false|raw", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub version: Option<String>,
    /// A set of key=value pairs that describe feature gates for alpha/experimental features.
    /// This parameter is ignored if a config file is specified by --config.
    #[arg(global = true, long, value_name = "A=true,B=false")]
    pub feature_gates: Vec<String>,

    // ---- API server ------------------------------------------------------------------------------
    /// Path to kubeconfig file with authorization information (the master location can be overridden
    /// by the master flag).
    #[arg(global = true, long, value_name = "FILE")]
    pub kubeconfig: Option<String>,
    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(global = true, long, value_name = "URL")]
    pub master: Option<String>,
    /// Content type of requests sent to apiserver; lists and watches ask for it first.
    /// [default: application/vnd.kubernetes.protobuf]
    #[arg(global = true, long, value_name = "TYPE")]
    pub kube_api_content_type: Option<String>,
    /// Burst to use while talking with kubernetes apiserver. [default: 10]
    #[arg(global = true, long, value_name = "N", allow_negative_numbers = true)]
    pub kube_api_burst: Option<i32>,
    /// QPS to use while talking with kubernetes apiserver. [default: 5]
    #[arg(global = true, long, value_name = "QPS")]
    pub kube_api_qps: Option<f32>,

    // ---- node identity and servers ---------------------------------------------------------------
    /// If non-empty, will be used as the name of the Node that kproxy is running on. If unset, the node
    /// name is assumed to be the same as the node's hostname. (Overrides the config file.)
    #[arg(global = true, long, value_name = "NAME")]
    pub hostname_override: Option<String>,
    /// Overrides kproxy's idea of what its node's primary IP is. Binds nothing. [default: 0.0.0.0]
    /// This parameter is ignored if a config file is specified by --config.
    #[arg(global = true, long, value_name = "IP")]
    pub bind_address: Option<String>,
    /// The IP address and port for the health check server to serve on; empty disables it.
    /// [default: 0.0.0.0:10256] This parameter is ignored if a config file is specified by --config.
    #[arg(global = true, long, value_name = "IP[:PORT]")]
    pub healthz_bind_address: Option<String>,
    /// The IP address and port for the metrics server to serve on; empty disables it.
    /// [default: 127.0.0.1:10249] This parameter is ignored if a config file is specified by --config.
    #[arg(global = true, long, value_name = "IP[:PORT]")]
    pub metrics_bind_address: Option<String>,
    /// If true kproxy will treat failure to bind to a port as fatal and exit.
    #[arg(global = true, long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub bind_address_hard_fail: Option<bool>,
    /// If true enables profiling via web interface on /debug/pprof handler.
    #[arg(global = true, long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub profiling: Option<bool>,
    /// The previous version for which you want to show hidden metrics (<major>.<minor>, e.g. 1.16).
    #[arg(global = true, long, value_name = "VERSION")]
    pub show_hidden_metrics_for_version: Option<String>,
    /// DEPRECATED: the port to bind the health check server. Use 0 to disable. [default: 10256]
    #[arg(global = true, long, value_name = "PORT", allow_negative_numbers = true)]
    pub healthz_port: Option<i32>,
    /// DEPRECATED: the port to bind the metrics server. Use 0 to disable. [default: 10249]
    #[arg(global = true, long, value_name = "PORT", allow_negative_numbers = true)]
    pub metrics_port: Option<i32>,
    /// DEPRECATED: no effect (was the userspace proxy's port range).
    #[arg(global = true, long, value_name = "RANGE")]
    pub proxy_port_range: Option<String>,

    // ---- mode and dataplane ----------------------------------------------------------------------
    /// Which proxy mode to use: 'nftables' (kproxy's default), 'iptables' or 'ipvs'.
    /// This parameter is ignored if a config file is specified by --config.
    #[arg(global = true, long, value_name = "MODE")]
    pub proxy_mode: Option<String>,
    /// If using the iptables or ipvs proxy mode, the bit of the fwmark space to mark packets requiring
    /// SNAT with. Must be within the range [0, 31]. [default: 14]
    #[arg(global = true, long, value_name = "BIT", allow_negative_numbers = true)]
    pub iptables_masquerade_bit: Option<i32>,
    /// SNAT all traffic sent via Service cluster IPs.
    #[arg(global = true, long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub masquerade_all: Option<bool>,
    /// If false, disable the legacy behavior of allowing NodePort services to be accessed via
    /// localhost (iptables mode, IPv4 only). [default: true]
    #[arg(global = true, long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub iptables_localhost_nodeports: Option<bool>,
    /// How often rules are fully re-synchronized (e.g. '5s', '1m', '2h22m'); applies in every mode but
    /// ipvs. Must be greater than 0. [default: 30s]
    #[arg(global = true, long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub iptables_sync_period: Option<GoDuration>,
    /// The minimum period between rule resyncs; applies in every mode but ipvs. 0 means every change
    /// is synced immediately. [default: 1s]
    #[arg(global = true, long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub iptables_min_sync_period: Option<GoDuration>,
    /// Full resync interval in ipvs mode. [default: 30s]
    #[arg(global = true, long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub ipvs_sync_period: Option<GoDuration>,
    /// Minimum period between resyncs in ipvs mode. [default: 1s]
    #[arg(global = true, long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub ipvs_min_sync_period: Option<GoDuration>,
    /// The ipvs scheduler type when proxy mode is ipvs (rr, wrr, lc, wlc, lblc, lblcr, sh, dh, sed, nq,
    /// mh). [default: rr]
    #[arg(global = true, long, value_name = "SCHEDULER")]
    pub ipvs_scheduler: Option<String>,
    /// A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up.
    #[arg(global = true, long, value_name = "CIDRS", value_delimiter = ',')]
    pub ipvs_exclude_cidrs: Option<Vec<String>>,
    /// Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2.
    #[arg(global = true, long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub ipvs_strict_arp: Option<bool>,
    /// The timeout for idle IPVS TCP connections, 0 to leave as-is.
    #[arg(global = true, long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub ipvs_tcp_timeout: Option<GoDuration>,
    /// The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is.
    #[arg(global = true, long = "ipvs-tcpfin-timeout", value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub ipvs_tcp_fin_timeout: Option<GoDuration>,
    /// The timeout for IPVS UDP packets, 0 to leave as-is.
    #[arg(global = true, long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub ipvs_udp_timeout: Option<GoDuration>,

    // ---- local traffic detection -----------------------------------------------------------------
    /// Mode to use to detect local traffic: ClusterCIDR, NodeCIDR, BridgeInterface or
    /// InterfaceNamePrefix. [default: ClusterCIDR]
    #[arg(global = true, long, value_name = "MODE")]
    pub detect_local_mode: Option<String>,
    /// A bridge interface name (with --detect-local-mode=BridgeInterface).
    #[arg(global = true, long, value_name = "IFNAME")]
    pub pod_bridge_interface: Option<String>,
    /// An interface name prefix (with --detect-local-mode=InterfaceNamePrefix).
    #[arg(global = true, long, value_name = "PREFIX")]
    pub pod_interface_name_prefix: Option<String>,
    /// The CIDR range of the pods in the cluster (a comma-separated dual-stack pair for dual-stack).
    #[arg(global = true, long, value_name = "CIDR[,CIDR]")]
    pub cluster_cidr: Option<String>,
    /// CIDRs and/or keywords 'primary', 'all', 'localhost' naming the node IPs NodePorts are served
    /// on. [default: primary in nftables mode, all in iptables and ipvs modes]
    #[arg(global = true, long = "nodeport-addresses", value_name = "LIST", value_delimiter = ',')]
    pub node_port_addresses: Option<Vec<String>>,

    // ---- process and conntrack -------------------------------------------------------------------
    /// The oom-score-adj value for the process, within [-1000, 1000]. [default: -999]
    #[arg(global = true, long, value_name = "N", allow_negative_numbers = true)]
    pub oom_score_adj: Option<i32>,
    /// Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore
    /// conntrack-min). [default: 32768]
    #[arg(global = true, long, value_name = "N", allow_negative_numbers = true)]
    pub conntrack_max_per_core: Option<i32>,
    /// Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core.
    /// [default: 131072]
    #[arg(global = true, long, value_name = "N", allow_negative_numbers = true)]
    pub conntrack_min: Option<i32>,
    /// Idle timeout for established TCP connections (0 to leave as-is). [default: 24h0m0s]
    #[arg(global = true, long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub conntrack_tcp_timeout_established: Option<GoDuration>,
    /// NAT timeout for TCP connections in the CLOSE_WAIT state. [default: 1h0m0s]
    #[arg(global = true, long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub conntrack_tcp_timeout_close_wait: Option<GoDuration>,
    /// Enable liberal mode for tracking TCP packets (nf_conntrack_tcp_be_liberal=1).
    #[arg(global = true, long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub conntrack_tcp_be_liberal: Option<bool>,
    /// Idle timeout for UNREPLIED UDP connections (0 to leave as-is).
    #[arg(global = true, long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub conntrack_udp_timeout: Option<GoDuration>,
    /// Idle timeout for ASSURED UDP connections (0 to leave as-is).
    #[arg(global = true, long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub conntrack_udp_timeout_stream: Option<GoDuration>,
    /// How often configuration from the apiserver is refreshed. Must be greater than 0. Accepted
    /// for compatibility; kproxy's watches need no resync (a warning says so). [default: 15m0s]
    #[arg(global = true, long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub config_sync_period: Option<GoDuration>,

    // ---- logging (these override the config file, as upstream) ------------------------------------
    /// Number for the log level verbosity.
    #[arg(global = true, short = 'v', long = "v", value_name = "LEVEL")]
    pub verbosity: Option<u32>,
    /// Comma-separated list of pattern=N settings for file-filtered logging.
    #[arg(global = true, long, value_name = "PATTERN=N,...")]
    pub vmodule: Option<String>,
    /// Sets the log format: text or json. [default: text]
    #[arg(global = true, long, value_name = "FORMAT")]
    pub logging_format: Option<String>,
    /// Maximum number of seconds between log flushes. [default: 5s]
    #[arg(global = true, long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub log_flush_frequency: Option<GoDuration>,
    /// [Alpha] In text format, write error messages to stderr and info messages to stdout.
    #[arg(global = true, long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub log_text_split_stream: Option<bool>,
    /// [Alpha] In text format with split streams, the info buffer size (a quantity, e.g. 64Ki).
    #[arg(global = true, long, value_name = "QUANTITY")]
    pub log_text_info_buffer_size: Option<String>,
    /// [Alpha] In JSON format, write error messages to stderr and info messages to stdout.
    #[arg(global = true, long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool)]
    pub log_json_split_stream: Option<bool>,
    /// [Alpha] In JSON format with split streams, the info buffer size (a quantity, e.g. 64Ki).
    #[arg(global = true, long, value_name = "QUANTITY")]
    pub log_json_info_buffer_size: Option<String>,

    // ---- kproxy extensions -----------------------------------------------------------------------
    /// kproxy: read Services/EndpointSlices/Nodes from YAML manifests in DIR instead of the Kubernetes
    /// API.
    #[arg(global = true, long, value_name = "DIR", help_heading = "kproxy flags")]
    pub manifests: Option<PathBuf>,
    /// kproxy: print what would be applied to the kernel and apply nothing.
    #[arg(global = true, long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool, help_heading = "kproxy flags")]
    pub dry_run: Option<bool>,
    /// kproxy (KEP-6246): comma-separated IPv4/IPv6 CIDRs; traffic DNATed to a destination inside them
    /// is never masqueraded. Overrides noMasqueradeCIDRs from the config file.
    #[arg(global = true, long, value_name = "CIDRS", value_delimiter = ',', help_heading = "kproxy flags")]
    pub no_masquerade_cidrs: Option<Vec<String>>,
    /// kproxy (KEP-6246): SNAT to the node's InternalIP instead of MASQUERADE. Overrides snatToNodeIP.
    #[arg(global = true, long = "snat-to-node-ip", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool, help_heading = "kproxy flags")]
    pub snat_to_node_ip: Option<bool>,
    /// kproxy: count new connections, packets and bytes per Service port and verdict in the
    /// kernel (nftables mode), exported as metrics and shown by `kproxy explain`. Overrides
    /// serviceCounters.
    #[arg(global = true, long = "service-counters", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool, help_heading = "kproxy flags")]
    pub service_counters: Option<bool>,
    /// kproxy: follow nf_tables' notifications and check kproxy's tables as soon as another
    /// program commits to them, instead of at the next periodic check (nftables mode).
    /// [default: true in nftables mode] Overrides watchKernelChanges.
    #[arg(global = true, long = "watch-kernel-changes", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool, help_heading = "kproxy flags")]
    pub watch_kernel_changes: Option<bool>,
    /// kproxy: once kproxy's rules are in the kernel and kube-proxy no longer runs on the node,
    /// remove what kube-proxy left (any of its modes); on SIGTERM while kube-proxy runs again,
    /// hand the node back to it (docs/migration.md). [default: true] Overrides takeOverKubeProxy.
    #[arg(global = true, long = "take-over-kube-proxy", value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool, help_heading = "kproxy flags")]
    pub take_over_kube_proxy: Option<bool>,
    /// kproxy: who may ask `/debug/explain` on the metrics listener: `local` (connections from
    /// the node itself), `any`, or `off`. [default: local] Overrides explainAccess.
    #[arg(global = true, long = "explain-access", value_name = "local|any|off", help_heading = "kproxy flags")]
    pub explain_access: Option<String>,
    /// kproxy (KEP-4963): offload established Service connections to a flowtable. [default: true]
    /// Overrides acceleration.enabled.
    #[arg(global = true, long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = parse_go_bool, help_heading = "kproxy flags")]
    pub acceleration: Option<bool>,
    /// kproxy (KEP-4963): packets a connection must exchange before it is offloaded; 0 disables.
    /// [default: 20] Overrides acceleration.packetThreshold.
    #[arg(global = true, long, value_name = "N", allow_negative_numbers = true, help_heading = "kproxy flags")]
    pub offload_packet_threshold: Option<i64>,
}

/// What `--version` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionRequest {
    /// Not asked: continue.
    None,
    /// `--version` / `--version=true`: print the version and exit.
    Short,
    /// `--version=raw`: print detailed build information and exit.
    Raw,
}

impl Flags {
    /// What `--version` asked for. Check this before [`crate::resolve`]: printing the version must
    /// not depend on a valid configuration.
    pub fn version_request(&self) -> Result<VersionRequest, ConfigError> {
        match self.version.as_deref() {
            None => Ok(VersionRequest::None),
            Some("raw") => Ok(VersionRequest::Raw),
            Some(other) => match parse_go_bool(other) {
                Ok(true) => Ok(VersionRequest::Short),
                Ok(false) => Ok(VersionRequest::None),
                Err(reason) => Err(ConfigError::Invalid(vec![crate::error::FieldError {
                    field: "version".into(),
                    flag: Some("--version".into()),
                    value: other.to_string(),
                    reason,
                }])),
            },
        }
    }

    /// The names of the KubeProxyConfiguration-backed flags given on the command line, which upstream
    /// (and kproxy) ignore when `--config` is given.
    pub(crate) fn config_backed_flags_given(&self) -> Vec<&'static str> {
        let mut given = Vec::new();
        let mut note = |set: bool, name: &'static str| {
            if set {
                given.push(name);
            }
        };
        note(!self.feature_gates.is_empty(), "--feature-gates");
        note(self.kubeconfig.is_some(), "--kubeconfig");
        note(self.kube_api_content_type.is_some(), "--kube-api-content-type");
        note(self.kube_api_burst.is_some(), "--kube-api-burst");
        note(self.kube_api_qps.is_some(), "--kube-api-qps");
        note(self.bind_address.is_some(), "--bind-address");
        note(self.healthz_bind_address.is_some(), "--healthz-bind-address");
        note(self.metrics_bind_address.is_some(), "--metrics-bind-address");
        note(self.bind_address_hard_fail.is_some(), "--bind-address-hard-fail");
        note(self.profiling.is_some(), "--profiling");
        note(self.show_hidden_metrics_for_version.is_some(), "--show-hidden-metrics-for-version");
        note(self.healthz_port.is_some(), "--healthz-port");
        note(self.metrics_port.is_some(), "--metrics-port");
        note(self.proxy_mode.is_some(), "--proxy-mode");
        note(self.iptables_masquerade_bit.is_some(), "--iptables-masquerade-bit");
        note(self.masquerade_all.is_some(), "--masquerade-all");
        note(self.iptables_localhost_nodeports.is_some(), "--iptables-localhost-nodeports");
        note(self.iptables_sync_period.is_some(), "--iptables-sync-period");
        note(self.iptables_min_sync_period.is_some(), "--iptables-min-sync-period");
        note(self.ipvs_sync_period.is_some(), "--ipvs-sync-period");
        note(self.ipvs_min_sync_period.is_some(), "--ipvs-min-sync-period");
        note(self.ipvs_scheduler.is_some(), "--ipvs-scheduler");
        note(self.ipvs_exclude_cidrs.is_some(), "--ipvs-exclude-cidrs");
        note(self.ipvs_strict_arp.is_some(), "--ipvs-strict-arp");
        note(self.ipvs_tcp_timeout.is_some(), "--ipvs-tcp-timeout");
        note(self.ipvs_tcp_fin_timeout.is_some(), "--ipvs-tcpfin-timeout");
        note(self.ipvs_udp_timeout.is_some(), "--ipvs-udp-timeout");
        note(self.detect_local_mode.is_some(), "--detect-local-mode");
        note(self.pod_bridge_interface.is_some(), "--pod-bridge-interface");
        note(self.pod_interface_name_prefix.is_some(), "--pod-interface-name-prefix");
        note(self.cluster_cidr.is_some(), "--cluster-cidr");
        note(self.node_port_addresses.is_some(), "--nodeport-addresses");
        note(self.oom_score_adj.is_some(), "--oom-score-adj");
        note(self.conntrack_max_per_core.is_some(), "--conntrack-max-per-core");
        note(self.conntrack_min.is_some(), "--conntrack-min");
        note(self.conntrack_tcp_timeout_established.is_some(), "--conntrack-tcp-timeout-established");
        note(self.conntrack_tcp_timeout_close_wait.is_some(), "--conntrack-tcp-timeout-close-wait");
        note(self.conntrack_tcp_be_liberal.is_some(), "--conntrack-tcp-be-liberal");
        note(self.conntrack_udp_timeout.is_some(), "--conntrack-udp-timeout");
        note(self.conntrack_udp_timeout_stream.is_some(), "--conntrack-udp-timeout-stream");
        note(self.config_sync_period.is_some(), "--config-sync-period");
        given
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_booleans() {
        for t in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_go_bool(t), Ok(true));
        }
        for f in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_go_bool(f), Ok(false));
        }
        assert!(parse_go_bool("yes").is_err());
    }
}

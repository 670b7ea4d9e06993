//! The resolved, typed configuration the daemon runs with.
//!
//! Everything here has been defaulted and validated: CIDRs are [`IpNet`]s, durations are
//! [`Duration`]s, modes are enums. The daemon never sees a string it has to re-parse.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

use crate::settings::{DEFAULT_CONTENT_TYPE, DEFAULT_PACKET_THRESHOLD, HEALTHZ_PORT, METRICS_PORT};

/// The dataplane. kproxy's default (mode unset) is [`ProxyMode::Nftables`]; upstream's is iptables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProxyMode {
    /// nftables (kproxy's default).
    Nftables,
    /// iptables.
    Iptables,
    /// IPVS (deprecated upstream since 1.35).
    Ipvs,
}

impl ProxyMode {
    /// The spelling used by `mode:` and `--proxy-mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Nftables => "nftables",
            ProxyMode::Iptables => "iptables",
            ProxyMode::Ipvs => "ipvs",
        }
    }
}

/// How "traffic from a local pod" is recognized (`detectLocalMode`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DetectLocal {
    /// Source address inside the cluster's pod CIDR(s); an empty list means local detection is off
    /// (no `clusterCIDR` given), as upstream.
    ClusterCidr(Vec<IpNet>),
    /// Source address inside this Node's `spec.podCIDRs` (read from the Node at runtime).
    NodeCidr,
    /// Packets arriving on this bridge interface.
    BridgeInterface(String),
    /// Packets arriving on interfaces whose name starts with this prefix.
    InterfaceNamePrefix(String),
}

impl DetectLocal {
    /// The `detectLocalMode` spelling.
    pub fn mode_name(&self) -> &'static str {
        match self {
            DetectLocal::ClusterCidr(_) => "ClusterCIDR",
            DetectLocal::NodeCidr => "NodeCIDR",
            DetectLocal::BridgeInterface(_) => "BridgeInterface",
            DetectLocal::InterfaceNamePrefix(_) => "InterfaceNamePrefix",
        }
    }
}

/// One `nodePortAddresses` entry: a CIDR or a keyword.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodePortAddress {
    /// `primary`: the Node object's primary IPv4 and/or IPv6 address.
    Primary,
    /// `all`: 0.0.0.0/0 and ::/0.
    All,
    /// `localhost`: 127.0.0.0/8 and ::1/128.
    Localhost,
    /// Node IPs inside this range.
    Cidr(IpNet),
}

impl std::fmt::Display for NodePortAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodePortAddress::Primary => f.write_str("primary"),
            NodePortAddress::All => f.write_str("all"),
            NodePortAddress::Localhost => f.write_str("localhost"),
            NodePortAddress::Cidr(net) => write!(f, "{net}"),
        }
    }
}

/// IPVS scheduler (`ipvs.scheduler`, `--ipvs-scheduler`); unset means round robin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum IpvsScheduler {
    Rr,
    Wrr,
    Lc,
    Wlc,
    Lblc,
    Lblcr,
    Sh,
    Dh,
    Sed,
    Nq,
    Mh,
}

impl IpvsScheduler {
    pub(crate) const ALL: [(&'static str, IpvsScheduler); 11] = [
        ("rr", IpvsScheduler::Rr),
        ("wrr", IpvsScheduler::Wrr),
        ("lc", IpvsScheduler::Lc),
        ("wlc", IpvsScheduler::Wlc),
        ("lblc", IpvsScheduler::Lblc),
        ("lblcr", IpvsScheduler::Lblcr),
        ("sh", IpvsScheduler::Sh),
        ("dh", IpvsScheduler::Dh),
        ("sed", IpvsScheduler::Sed),
        ("nq", IpvsScheduler::Nq),
        ("mh", IpvsScheduler::Mh),
    ];

    /// The kernel's scheduler name (`rr`, `wlc`, …).
    pub fn as_str(self) -> &'static str {
        Self::ALL.iter().find(|(_, s)| *s == self).map(|(n, _)| *n).unwrap_or("rr")
    }
}

/// IPVS settings; only present when the mode is IPVS (upstream ignores the section otherwise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsConfig {
    /// Scheduler for virtual servers.
    pub scheduler: IpvsScheduler,
    /// Virtual server addresses cleanup must not touch.
    pub exclude_cidrs: Vec<IpNet>,
    /// Set arp_ignore=1 / arp_announce=2.
    pub strict_arp: bool,
    /// Idle TCP session timeout; zero leaves the system value.
    pub tcp_timeout: Duration,
    /// TCP-after-FIN timeout; zero leaves the system value.
    pub tcp_fin_timeout: Duration,
    /// UDP timeout; zero leaves the system value.
    pub udp_timeout: Duration,
}

/// Conntrack sysctls kube-proxy manages. Zero means "leave the kernel value" for every field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConntrackConfig {
    /// Entries per CPU; `nf_conntrack_max = max(max_per_core × CPUs, min)`. 0 leaves the limit alone.
    pub max_per_core: u32,
    /// Lower bound for `nf_conntrack_max`.
    pub min: u32,
    /// `nf_conntrack_tcp_timeout_established`.
    pub tcp_established_timeout: Duration,
    /// `nf_conntrack_tcp_timeout_close_wait`.
    pub tcp_close_wait_timeout: Duration,
    /// `nf_conntrack_tcp_be_liberal=1`.
    pub tcp_be_liberal: bool,
    /// `nf_conntrack_udp_timeout` (unreplied).
    pub udp_timeout: Duration,
    /// `nf_conntrack_udp_timeout_stream` (assured).
    pub udp_stream_timeout: Duration,
}

impl Default for ConntrackConfig {
    fn default() -> Self {
        ConntrackConfig {
            max_per_core: 32 * 1024,
            min: 128 * 1024,
            tcp_established_timeout: Duration::from_secs(24 * 3600),
            tcp_close_wait_timeout: Duration::from_secs(3600),
            tcp_be_liberal: false,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::ZERO,
        }
    }
}

/// How to reach the API server (`clientConnection`, `--kubeconfig`, `--master`).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientConnection {
    /// Path of the kubeconfig; `None` means in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// `--master`: overrides the kubeconfig's server URL.
    pub master: Option<String>,
    /// Accept header.
    pub accept_content_types: String,
    /// Content type of requests.
    pub content_type: String,
    /// Client-side rate limit.
    pub qps: f32,
    /// Client-side burst.
    pub burst: u32,
}

impl Default for ClientConnection {
    fn default() -> Self {
        ClientConnection {
            kubeconfig: None,
            master: None,
            accept_content_types: String::new(),
            content_type: DEFAULT_CONTENT_TYPE.to_string(),
            qps: 5.0,
            burst: 10,
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// klog-style text.
    Text,
    /// JSON lines.
    Json,
}

/// Logging (`logging`, `-v`, `--vmodule`, `--logging-format`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggingConfig {
    /// Output format.
    pub format: LogFormat,
    /// klog verbosity (`-v`).
    pub verbosity: u32,
    /// Per-file verbosity (`--vmodule=pattern=N,...`).
    pub vmodule: Vec<(String, u32)>,
    /// How often buffered logs are flushed.
    pub flush_frequency: Duration,
    /// Text format: info to stdout, errors to stderr.
    pub text_split_stream: bool,
    /// Text format: info buffer size in bytes when split.
    pub text_info_buffer_size: u64,
    /// JSON format: info to stdout, errors to stderr.
    pub json_split_stream: bool,
    /// JSON format: info buffer size in bytes when split.
    pub json_info_buffer_size: u64,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            format: LogFormat::Text,
            verbosity: 0,
            vmodule: Vec::new(),
            flush_frequency: Duration::from_secs(5),
            text_split_stream: false,
            text_info_buffer_size: 0,
            json_split_stream: false,
            json_info_buffer_size: 0,
        }
    }
}

/// KEP-4963 flowtable fast path (kproxy extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccelerationConfig {
    /// `acceleration.enabled` / `--acceleration`.
    pub enabled: bool,
    /// Packets a connection must exchange before it is offloaded; 0 disables offload, as in the KEP.
    pub packet_threshold: u32,
}

impl AccelerationConfig {
    /// Whether the dataplane should install the fast path at all.
    pub fn active(&self) -> bool {
        self.enabled && self.packet_threshold > 0
    }
}

impl Default for AccelerationConfig {
    fn default() -> Self {
        AccelerationConfig { enabled: true, packet_threshold: DEFAULT_PACKET_THRESHOLD as u32 }
    }
}

/// Where Services and EndpointSlices come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSelection {
    /// Watch the Kubernetes API (production).
    KubernetesApi,
    /// Read a directory of YAML manifests (`--manifests DIR`): standalone use, demos, tests.
    Manifests(PathBuf),
}

/// What the process should do once the configuration is resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Run the proxy.
    Run,
    /// `--write-config-to FILE`: write [`ProxyConfig::to_kube_proxy_configuration_yaml`] there and exit.
    WriteConfigTo(PathBuf),
    /// `--cleanup`: remove every rule kproxy/kube-proxy may have installed (all modes) and exit.
    Cleanup,
    /// `--init-only`: do the privileged host setup (sysctls, conntrack) and exit.
    InitOnly,
}

/// The resolved configuration. `Default` is what kproxy runs with given no flags and no file.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyConfig {
    /// Dataplane (mode unset ⇒ nftables).
    pub mode: ProxyMode,
    /// Feature gates as given (`featureGates`, `--feature-gates`).
    pub feature_gates: BTreeMap<String, bool>,
    /// API server connection.
    pub client_connection: ClientConnection,
    /// Logging.
    pub logging: LoggingConfig,
    /// Node name to use instead of the hostname (lower-cased when it comes from the flag).
    pub hostname_override: Option<String>,
    /// Override for the node's primary IP; unspecified (0.0.0.0 / ::) means "ask the Node object".
    pub bind_address: IpAddr,
    /// `/healthz` and `/livez` server; `None` disables it.
    pub healthz_bind_address: Option<SocketAddr>,
    /// `/metrics` server; `None` disables it.
    pub metrics_bind_address: Option<SocketAddr>,
    /// Exit when a server port cannot be bound.
    pub bind_address_hard_fail: bool,
    /// Serve /debug/pprof-like profiling on the metrics server.
    pub enable_profiling: bool,
    /// Show metrics hidden since this `<major>.<minor>` version.
    pub show_hidden_metrics_for_version: Option<String>,
    /// Periodic full resync interval (> 0).
    pub sync_period: Duration,
    /// Minimum interval between syncs (0 = sync on every change).
    pub min_sync_period: Duration,
    /// fwmark bit (0..=31) marking packets for masquerade.
    pub masquerade_bit: u8,
    /// SNAT all traffic to ClusterIPs.
    pub masquerade_all: bool,
    /// iptables mode, IPv4: allow NodePorts on localhost via route_localnet.
    pub localhost_node_ports: bool,
    /// IPVS settings, present only in IPVS mode.
    pub ipvs: Option<IpvsConfig>,
    /// Local traffic detection.
    pub detect_local: DetectLocal,
    /// Addresses NodePorts are served on (never empty once resolved).
    pub node_port_addresses: Vec<NodePortAddress>,
    /// OOM score adjustment of the process.
    pub oom_score_adj: i32,
    /// Conntrack sysctls.
    pub conntrack: ConntrackConfig,
    /// Informer resync period.
    pub config_sync_period: Duration,
    /// KEP-6246: destinations (after DNAT) that are never masqueraded.
    pub no_masquerade_cidrs: Vec<IpNet>,
    /// KEP-6246 part 2: SNAT to the node's InternalIP instead of MASQUERADE.
    pub snat_to_node_ip: bool,
    /// Per-Service counters of new connections, packets and bytes by verdict (nftables mode only).
    pub service_counters: bool,
    /// Check kproxy's nftables tables as soon as another program commits to them (nftables
    /// mode only).
    pub watch_kernel_changes: bool,
    /// KEP-4963 flowtable fast path.
    pub acceleration: AccelerationConfig,
    /// Take the node over from kube-proxy (remove its leftovers once kproxy's rules are in and it
    /// no longer runs), and hand it back on SIGTERM when kube-proxy runs again.
    pub take_over_kube_proxy: bool,
    /// Who may ask `/debug/explain`.
    pub explain_access: ExplainAccess,
    /// Where cluster objects come from.
    pub source: SourceSelection,
    /// `--dry-run`: compute and print what would be applied, apply nothing.
    pub dry_run: bool,
    /// What to do.
    pub action: Action,
    /// The `--config` file the settings came from, if any.
    pub config_file: Option<PathBuf>,
    /// Things the user should know (ignored flags, deprecated flags, unknown feature gates, mode
    /// defaulting). Resolution happens before logging is set up, so the caller logs these.
    pub warnings: Vec<String>,
}

/// Who may ask the daemon's `/debug/explain` (which endpoints sit behind any address of the
/// node, and the plan's reasons).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExplainAccess {
    /// Connections from the node itself: a loopback peer, or a peer whose address is the
    /// address it connected to. Never a pod or another host.
    #[default]
    Local,
    /// Anyone who can reach the metrics listener.
    Any,
    /// Nobody: `/debug/explain` answers 404.
    Off,
}

impl ExplainAccess {
    /// The keyword (`local`, `any`, `off`).
    pub fn as_str(self) -> &'static str {
        match self {
            ExplainAccess::Local => "local",
            ExplainAccess::Any => "any",
            ExplainAccess::Off => "off",
        }
    }

    /// The setting of a keyword.
    pub fn parse(keyword: &str) -> Option<Self> {
        [ExplainAccess::Local, ExplainAccess::Any, ExplainAccess::Off].into_iter().find(|a| a.as_str() == keyword)
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            mode: ProxyMode::Nftables,
            feature_gates: BTreeMap::new(),
            client_connection: ClientConnection::default(),
            logging: LoggingConfig::default(),
            hostname_override: None,
            bind_address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            healthz_bind_address: Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), HEALTHZ_PORT)),
            metrics_bind_address: Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), METRICS_PORT)),
            bind_address_hard_fail: false,
            enable_profiling: false,
            show_hidden_metrics_for_version: None,
            sync_period: Duration::from_secs(30),
            min_sync_period: Duration::from_secs(1),
            masquerade_bit: 14,
            masquerade_all: false,
            localhost_node_ports: true,
            ipvs: None,
            detect_local: DetectLocal::ClusterCidr(Vec::new()),
            node_port_addresses: vec![NodePortAddress::Primary],
            oom_score_adj: -999,
            conntrack: ConntrackConfig::default(),
            config_sync_period: Duration::from_secs(15 * 60),
            no_masquerade_cidrs: Vec::new(),
            snat_to_node_ip: false,
            service_counters: false,
            watch_kernel_changes: true,
            acceleration: AccelerationConfig::default(),
            take_over_kube_proxy: true,
            explain_access: ExplainAccess::Local,
            source: SourceSelection::KubernetesApi,
            dry_run: false,
            action: Action::Run,
            config_file: None,
            warnings: Vec::new(),
        }
    }
}

impl ProxyConfig {
    /// The masquerade mark value (`1 << masquerade_bit`), e.g. 0x4000 for the default bit 14.
    pub fn masquerade_mark(&self) -> u32 {
        1u32 << self.masquerade_bit
    }
}

//! kube-proxy compatible configuration: the command line and the `KubeProxyConfiguration` file.
//!
//! kproxy is a drop-in for kube-proxy, so a cluster must be able to swap the image and keep its
//! DaemonSet arguments and its ConfigMap. This crate therefore accepts kube-proxy's Linux flags with
//! the same names and defaults, and `--config FILE` holding a `kubeproxy.config.k8s.io/v1alpha1`
//! `KubeProxyConfiguration` in YAML or JSON, and resolves them into one typed [`ProxyConfig`].
//!
//! # Wiring
//!
//! ```no_run
//! use clap::Parser;
//!
//! #[derive(clap::Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     flags: kproxy_config::Flags,
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cli = Cli::parse();
//! if cli.flags.version_request()? != kproxy_config::VersionRequest::None {
//!     println!("kproxy ...");
//!     return Ok(());
//! }
//! let config = kproxy_config::resolve(&cli.flags)?; // ConfigError names the field
//! for warning in &config.warnings {
//!     eprintln!("warning: {warning}"); // or tracing::warn! once logging is set up
//! }
//! if let kproxy_config::Action::WriteConfigTo(path) = &config.action {
//!     config.write_config_file(path)?;
//! }
//! # Ok(()) }
//! ```
//!
//! Every [`Flags`] field is an `Option` that is `None` unless the flag was on the command line, which
//! is the "was it explicitly set" information upstream's precedence needs; no `ArgMatches` is
//! required. The binary must not enable clap's own `--version` (kube-proxy's `--version[=raw]` is in
//! [`Flags`]).
//!
//! # Precedence (as upstream `cmd/kube-proxy/app/options.go`)
//!
//! * **No `--config`**: upstream defaults, then every flag given. The per-mode flags follow
//!   `processV1Alpha1Flags`: `--iptables-sync-period`/`--iptables-min-sync-period` set the sync
//!   periods in every mode except ipvs, `--ipvs-sync-period`/`--ipvs-min-sync-period` only in ipvs
//!   mode. The deprecated `--healthz-port`/`--metrics-port` are applied (0 disables the server; a bind
//!   address without a port gets that port) unless `--write-config-to` is given.
//! * **With `--config`**: the file replaces every KubeProxyConfiguration-backed flag. Only the logging
//!   flags (`-v`, `--vmodule`, `--logging-format`, `--log-flush-frequency`, `--log-*-split-stream`,
//!   `--log-*-info-buffer-size`) and `--hostname-override` (trimmed, lower-cased) still override the
//!   file. Ignored flags are listed in [`ProxyConfig::warnings`] (upstream ignores them silently).
//! * Always: `--master`, `--cleanup`, `--init-only`, `--write-config-to`, `--version`, and kproxy's
//!   own flags.
//!
//! Defaulting follows upstream's `SetDefaults_KubeProxyConfiguration`: in the file, a zero value
//! means "unset" (`syncPeriod: 0s` ⇒ 30s, `healthzBindAddress: ""` ⇒ `0.0.0.0:10256`, or `[::]:10256`
//! if `bindAddress` is IPv6), `null` pointers get their defaults. Flags are applied after defaulting,
//! so `--iptables-sync-period=0` is rejected by validation, as upstream. The `iptables`, `ipvs` and
//! `nftables` sections fold into one sync period / min sync period / masqueradeAll / masquerade bit,
//! chosen by the mode as written (unset ⇒ the `iptables` section, as upstream's conversion does).
//!
//! # Deliberate differences from kube-proxy
//!
//! * **Mode unset**: in a `--config` file (kubeadm writes `mode: ""`), kproxy serves exactly what
//!   kube-proxy's default (iptables) served: nftables with NodePorts on every local address when
//!   that is the same, else (NodePorts on 127.0.0.1 in play: `iptables.localhostNodePorts`, true by
//!   default) iptables; the choice and its reason are logged. Settings are read from the
//!   `iptables` section either way, so an upstream ConfigMap keeps its meaning. Without a file,
//!   an unset `--proxy-mode` means nftables (kproxy's default dataplane; kube-proxy picks iptables
//!   until 1.40) and unset `nodePortAddresses` mean `primary`, as in upstream's nftables mode.
//!   Explicit nftables mode refuses loopback `nodePortAddresses` (`localhost`, `127.0.0.0/8`,
//!   `::1/128`): it does not serve them, and says so instead of ignoring them.
//! * **Unknown fields are an error** naming the field (`iptables.syncPeriodd: unknown field`).
//!   kube-proxy falls back to lenient decoding with a log line; kproxy refuses to guess.
//! * Unknown feature gates are a warning, not an error (upstream's registry is shared with every
//!   Kubernetes component; kproxy only knows the proxy's). Known gates act or are refused
//!   ([`feature_gates::check`]): GA gates are locked on as upstream, `KubeProxyIPVS=false` forbids
//!   IPVS mode, `KubeProxyAcceleration` switches acceleration, gates of features kproxy lacks
//!   (`KubeProxyNFTablesLocalhostNodePorts`, `PreserveUDPFlowsTerminatingEndpoints`) cannot be
//!   turned on, and behaviours kproxy always has (`NFTablesNetlink`, `AllowServiceExternalIPs`)
//!   cannot be turned off. `AllAlpha` / `AllBeta` set the unset gates of their stage as upstream,
//!   except that they leave the gates of features kproxy lacks off (a warning names them), so
//!   `kubernetes_feature_enabled` never reports those on.
//! * `clientConnection.contentType` and `acceptContentTypes` are upstream's (protobuf first by
//!   default), but a media type kproxy cannot read (anything but JSON, protobuf and, in
//!   `acceptContentTypes`, `*/*`) is refused when the API source starts, not sent
//!   (`kproxy_kube_source::ContentTypes`).
//! * `configSyncPeriod` is validated but not used (no informer resync exists to pace); a
//!   non-default value draws a warning.
//! * `metricsBindAddress` may be empty to disable the metrics server (the flag help says so upstream).
//! * `nodePortAddresses` accepts CIDRs and the keywords `primary`, `all`, `localhost` in any
//!   combination (upstream since July 2026).
//! * Windows-only fields (`winkernel`, `windowsRunAsService`) are accepted and ignored; their flags
//!   do not exist.
//!
//! # kproxy extensions
//!
//! Fields of the same document, plus flags. Extension flags override the file even with `--config`
//! (they have no upstream precedence to follow, and this lets an unchanged upstream ConfigMap be
//! combined with them).
//!
//! | field | flag | default | meaning |
//! |---|---|---|---|
//! | `noMasqueradeCIDRs: []string` | `--no-masquerade-cidrs=A,B` | empty | KEP-6246: traffic whose destination after DNAT is in these IPv4/IPv6 CIDRs is never masqueraded |
//! | `snatToNodeIP: bool` | `--snat-to-node-ip[=BOOL]` | false | KEP-6246 part 2: SNAT to the node's InternalIP instead of MASQUERADE |
//! | `serviceCounters: bool` | `--service-counters[=BOOL]` | false | count new connections, packets and bytes per Service port and verdict (nftables mode; `docs/explain.md`) |
//! | `watchKernelChanges: bool` | `--watch-kernel-changes[=BOOL]` | true (nftables mode) | check kproxy's tables as soon as another program commits to them (nf_tables notifications) instead of at the next periodic check |
//! | `acceleration.enabled: bool` | `--acceleration[=BOOL]` | true | KEP-4963: flowtable fast path for established Service connections |
//! | `acceleration.packetThreshold: int` | `--offload-packet-threshold=N` | 20 | packets before offload; 0 disables |
//! | `takeOverKubeProxy: bool` | `--take-over-kube-proxy[=BOOL]` | true | once kproxy's rules are in the kernel and kube-proxy no longer holds the healthz/metrics ports, remove what kube-proxy left; on SIGTERM while kube-proxy runs again, hand the node back (`docs/migration.md`) |
//! | `explainAccess: string` | `--explain-access=local\|any\|off` | `local` | who may ask `/debug/explain` on the metrics listener: connections from the node itself, anyone, or nobody |
//! | — | `--manifests DIR` | — | read Services/EndpointSlices/Nodes from YAML files instead of the API |
//! | — | `--dry-run[=BOOL]` | false | print what would be applied; apply nothing |

mod document;
mod duration;
mod error;
pub mod feature_gates;
mod flags;
mod model;
mod resolve;
mod settings;
mod validate;
mod write;

pub use document::{API_VERSION, KIND};
pub use duration::{DurationError, GoDuration};
pub use error::{ConfigError, FieldError};
pub use flags::{Flags, VersionRequest};
pub use model::{
    AccelerationConfig, Action, ClientConnection, ConntrackConfig, DetectLocal, ExplainAccess, IpvsConfig,
    IpvsScheduler, LogFormat, LoggingConfig, NodePortAddress, ProxyConfig, ProxyMode, SourceSelection,
};
pub use resolve::{parse_feature_gates, resolve};

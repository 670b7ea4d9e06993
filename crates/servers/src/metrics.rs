//! kube-proxy's metrics, under kube-proxy's names, plus a few of kproxy's own.
//!
//! Dashboards and alerts written for kube-proxy must keep working, so every `kubeproxy_*` series
//! has upstream's name, type, labels (`ip_family` is `IPv4`/`IPv6`) and histogram buckets
//! (`pkg/proxy/metrics/metrics.go`). prometheus-client appends `_total` to counters itself, so
//! counters are registered without it; gauges that upstream happens to name `*_total` (the
//! no-local-endpoints gauge) are registered verbatim. prometheus-client adds a full stop to every
//! HELP text; nothing reads HELP text programmatically, so that difference is accepted.
//!
//! As upstream, the set of families depends on the dataplane mode: nftables failure counters only
//! in nftables mode, iptables rule counts only in iptables mode, and so on. The nfacct packet
//! counters of iptables mode exist only when the kernel has nfnetlink_acct (`packet_metrics`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use kproxy_state::IpFamily;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets, linear_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The exposition formats `/metrics` can answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    /// Prometheus text format 0.0.4, what kube-proxy serves.
    PrometheusText,
    /// OpenMetrics 1.0 text (ends with `# EOF`), when the scraper asks for it.
    OpenMetrics,
}

impl Exposition {
    /// The `Content-Type` of this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::PrometheusText => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Exposition::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The dataplane kproxy drives; decides which mode-specific metrics exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataplaneMode {
    /// nftables (the default).
    Nftables,
    /// iptables.
    Iptables,
    /// IPVS.
    Ipvs,
}

/// Which traffic policy a no-local-endpoints count is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrafficPolicyKind {
    /// `internalTrafficPolicy: Local`.
    Internal,
    /// `externalTrafficPolicy: Local`.
    External,
}

impl TrafficPolicyKind {
    fn label(self) -> &'static str {
        match self {
            TrafficPolicyKind::Internal => "internal",
            TrafficPolicyKind::External => "external",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FamilyLabels {
    ip_family: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NoLocalLabels {
    ip_family: String,
    traffic_policy: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct KindLabels {
    pub(crate) kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    ip_family: String,
    table: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceConnectionLabels {
    ip_family: String,
    namespace: String,
    service: String,
    port: String,
    protocol: String,
    verdict: String,
}

/// One service port's new connections, packets or bytes with one verdict, as the kernel has
/// counted them so far (per-Service counters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceConnections {
    /// The family.
    pub family: IpFamily,
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub service: String,
    /// The port's name.
    pub port: String,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    /// `served`, `rejected_no_endpoints`, `dropped_no_local_endpoints` or
    /// `dropped_by_source_ranges`.
    pub verdict: &'static str,
    /// The kernel's count.
    pub total: u64,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FeatureLabels {
    name: String,
    stage: String,
}

/// `kubernetes_build_info`'s labels, as component-base spells them.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildInfoLabels {
    major: String,
    minor: String,
    git_version: String,
    git_commit: String,
    git_tree_state: String,
    build_date: String,
    go_version: String,
    compiler: String,
    platform: String,
}

impl BuildInfoLabels {
    fn of_this_build() -> Self {
        let version = env!("CARGO_PKG_VERSION");
        let mut parts = version.split('.');
        BuildInfoLabels {
            major: parts.next().unwrap_or_default().to_owned(),
            minor: parts.next().unwrap_or_default().to_owned(),
            git_version: format!("v{version}"),
            git_commit: option_env!("KPROXY_GIT_COMMIT").unwrap_or_default().to_owned(),
            git_tree_state: String::new(),
            build_date: String::new(),
            // Not a Go program; the label stays for dashboards that group by it.
            go_version: String::new(),
            compiler: "rustc".to_owned(),
            platform: format!("{}/{}", std::env::consts::OS, go_arch(std::env::consts::ARCH)),
        }
    }
}

/// Go's name for an architecture (what `platform` carries upstream: `linux/amd64`).
fn go_arch(arch: &str) -> &str {
    match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MasqueradeLabels {
    ip_family: String,
    source: String,
    no_masquerade_cidrs: String,
}

type HistogramFamily = Family<FamilyLabels, Histogram, fn() -> Histogram>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// Upstream's sync-duration buckets: 1 ms doubling to 16.384 s.
pub fn sync_duration_buckets() -> Vec<f64> {
    exponential_buckets(0.001, 2.0, 15).collect()
}

/// Upstream's network-programming buckets: 0, 0.25 s, 0.5 s, 1–59 s by 1 s, 60–115 s by 5 s,
/// 120–300 s by 30 s (the leading 0 comes from upstream's bucket-merging helper).
pub fn network_programming_buckets() -> Vec<f64> {
    let mut buckets = vec![0.0];
    buckets.extend(linear_buckets(0.25, 0.25, 2));
    buckets.extend(linear_buckets(1.0, 1.0, 59));
    buckets.extend(linear_buckets(60.0, 5.0, 12));
    buckets.extend(linear_buckets(120.0, 30.0, 7));
    buckets
}

fn sync_histogram() -> Histogram {
    Histogram::new(sync_duration_buckets())
}

fn network_programming_histogram() -> Histogram {
    Histogram::new(network_programming_buckets())
}

/// All of kproxy's metrics; cloning shares them.
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    sync_duration: HistogramFamily,
    sync_full_duration: HistogramFamily,
    sync_partial_duration: HistogramFamily,
    network_programming: HistogramFamily,
    last_sync: Family<FamilyLabels, FloatGauge>,
    last_queued: Family<FamilyLabels, FloatGauge>,
    endpoint_changes_pending: Gauge,
    endpoint_changes: Counter,
    service_changes_pending: Gauge,
    service_changes: Counter,
    no_local_endpoints: Family<NoLocalLabels, Gauge>,
    healthz: Family<CodeLabels, Counter>,
    livez: Family<CodeLabels, Counter>,
    nftables_sync_failures: Family<FamilyLabels, Counter>,
    nftables_cleanup_failures: Family<FamilyLabels, Counter>,
    iptables_restore_failures: Family<FamilyLabels, Counter>,
    iptables_partial_restore_failures: Family<FamilyLabels, Counter>,
    iptables_rules_total: Family<TableLabels, Gauge>,
    iptables_rules_last: Family<TableLabels, Gauge>,
    conntrack_duration: HistogramFamily,
    conntrack_deleted: Family<FamilyLabels, Counter>,
    conntrack_cleanup_failures: Family<FamilyLabels, Counter>,
    invalid_objects: Family<KindLabels, Counter>,
    masquerade_policy: Family<MasqueradeLabels, Gauge>,
    masquerade_current: Mutex<Vec<MasqueradeLabels>>,
    healthcheck_bind_failures: Counter,
    accelerated_connections: Counter,
    service_connections: ServiceCounter,
    service_packets: ServiceCounter,
    service_bytes: ServiceCounter,
    drift_repairs: Counter,
    feature_enabled: Family<FeatureLabels, Gauge>,
    acceleration_supported: Gauge,
    source: crate::source_metrics::SourceSlot,
    packets: crate::packet_metrics::PacketSlot,
}

/// A per-Service counter family raised to the kernel's counts.
#[derive(Debug)]
struct ServiceCounter {
    family: Family<ServiceConnectionLabels, Counter>,
    /// The kernel's last count of each series: a count below it means the element was
    /// recreated (its counter restarted), and everything it has counted since is new.
    seen: Mutex<std::collections::HashMap<ServiceConnectionLabels, u64>>,
}

impl ServiceCounter {
    fn register(registry: &mut Registry, name: &str, help: &str) -> Self {
        let family = Family::<ServiceConnectionLabels, Counter>::default();
        registry.register(name, help, family.clone());
        Self { family, seen: Mutex::new(std::collections::HashMap::new()) }
    }

    /// Raises each series to the kernel's count. A series whose Service port is gone stays at
    /// its last value (a counter does not go away).
    fn raise(&self, counts: impl IntoIterator<Item = ServiceConnections>) {
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for c in counts {
            let labels = ServiceConnectionLabels {
                ip_family: c.family.to_string(),
                namespace: c.namespace,
                service: c.service,
                port: c.port,
                protocol: c.protocol,
                verdict: c.verdict.to_owned(),
            };
            let last = seen.insert(labels.clone(), c.total).unwrap_or(0);
            let new = if c.total >= last { c.total - last } else { c.total };
            if new > 0 || last == 0 {
                self.family.get_or_create(&labels).inc_by(new);
            }
        }
    }
}

fn family_labels(family: IpFamily) -> FamilyLabels {
    FamilyLabels { ip_family: family.to_string() }
}

fn unix_seconds(time: SystemTime) -> f64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    }
}

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Metrics {
    /// Registers every metric that kube-proxy registers in `mode`, plus kproxy's own.
    pub fn new(mode: DataplaneMode) -> Self {
        let mut registry = Registry::default();
        let histograms = || -> HistogramFamily { Family::new_with_constructor(sync_histogram as fn() -> Histogram) };

        let sync_duration = histograms();
        registry.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            sync_duration.clone(),
        );
        let sync_full_duration = histograms();
        registry.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            sync_full_duration.clone(),
        );
        let sync_partial_duration = histograms();
        registry.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            sync_partial_duration.clone(),
        );
        let network_programming: HistogramFamily =
            Family::new_with_constructor(network_programming_histogram as fn() -> Histogram);
        registry.register(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            network_programming.clone(),
        );
        let last_sync = Family::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            Family::clone(&last_sync),
        );
        let last_queued = Family::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            Family::clone(&last_queued),
        );
        let endpoint_changes_pending = Gauge::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            endpoint_changes_pending.clone(),
        );
        let endpoint_changes = Counter::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            endpoint_changes.clone(),
        );
        let service_changes_pending = Gauge::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            service_changes_pending.clone(),
        );
        let service_changes = Counter::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            service_changes.clone(),
        );
        let no_local_endpoints = Family::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            Family::clone(&no_local_endpoints),
        );
        let healthz = Family::default();
        registry.register("kubeproxy_proxy_healthz", "Cumulative proxy healthz HTTP status", Family::clone(&healthz));
        let livez = Family::default();
        registry.register("kubeproxy_proxy_livez", "Cumulative proxy livez HTTP status", Family::clone(&livez));

        let nftables_sync_failures = Family::default();
        let nftables_cleanup_failures = Family::default();
        let iptables_restore_failures = Family::default();
        let iptables_partial_restore_failures = Family::default();
        let iptables_rules_total = Family::default();
        let iptables_rules_last = Family::default();
        match mode {
            DataplaneMode::Nftables => {
                registry.register(
                    "kubeproxy_sync_proxy_rules_nftables_sync_failures",
                    "Cumulative proxy nftables sync failures",
                    Family::clone(&nftables_sync_failures),
                );
                registry.register(
                    "kubeproxy_sync_proxy_rules_nftables_cleanup_failures",
                    "Cumulative proxy nftables cleanup failures",
                    Family::clone(&nftables_cleanup_failures),
                );
            }
            DataplaneMode::Iptables => {
                registry.register(
                    "kubeproxy_sync_proxy_rules_iptables_restore_failures",
                    "Cumulative proxy iptables restore failures",
                    Family::clone(&iptables_restore_failures),
                );
                registry.register(
                    "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures",
                    "Cumulative proxy iptables partial restore failures",
                    Family::clone(&iptables_partial_restore_failures),
                );
                registry.register(
                    "kubeproxy_sync_proxy_rules_iptables_total",
                    "Total number of iptables rules owned by kube-proxy",
                    Family::clone(&iptables_rules_total),
                );
                registry.register(
                    "kubeproxy_sync_proxy_rules_iptables_last",
                    "Number of iptables rules written by kube-proxy in last sync",
                    Family::clone(&iptables_rules_last),
                );
            }
            DataplaneMode::Ipvs => {
                registry.register(
                    "kubeproxy_sync_proxy_rules_iptables_restore_failures",
                    "Cumulative proxy iptables restore failures",
                    Family::clone(&iptables_restore_failures),
                );
            }
        }

        let conntrack_duration = histograms();
        registry.register(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            "ReconcileConntrackFlowsLatency latency in seconds",
            conntrack_duration.clone(),
        );
        let conntrack_deleted = Family::default();
        registry.register(
            "kubeproxy_conntrack_reconciler_deleted_entries",
            "Cumulative conntrack flows deleted by conntrack reconciler",
            Family::clone(&conntrack_deleted),
        );
        let conntrack_cleanup_failures = Family::default();
        registry.register(
            "kproxy_conntrack_cleanup_failures",
            "Conntrack cleanup passes that left stale entries behind (the dump failed, or the kernel refused a delete); the next sync's pass retries them",
            Family::clone(&conntrack_cleanup_failures),
        );

        let invalid_objects = Family::default();
        registry.register(
            "kproxy_invalid_objects",
            "Cluster objects kproxy skipped because they failed validation, by kind",
            Family::clone(&invalid_objects),
        );
        let masquerade_policy = Family::default();
        registry.register(
            "kproxy_masquerade_policy_info",
            "The effective masquerade policy per IP family: the SNAT source (masquerade, node-ip, masquerade-fallback) and the CIDRs exempt from masquerading",
            Family::clone(&masquerade_policy),
        );
        let healthcheck_bind_failures = Counter::default();
        registry.register(
            "kproxy_service_healthcheck_bind_failures",
            "Health-check node ports that could not be opened",
            healthcheck_bind_failures.clone(),
        );
        let drift_repairs = Counter::default();
        registry.register(
            "kproxy_sync_proxy_rules_drift_repairs",
            "Periodic checks and full syncs that found kproxy's rules changed by someone else and repaired them",
            drift_repairs.clone(),
        );
        let accelerated_connections = Counter::default();
        registry.register(
            // KEP-4963's name; the `_total` suffix is added by the exposition.
            "kubeproxy_accelerated_connections_count",
            "Connections of opted-in Services offloaded to the flowtable",
            accelerated_connections.clone(),
        );
        let service_connections = ServiceCounter::register(
            &mut registry,
            "kproxy_service_new_connections",
            "New connections per Service port and verdict, counted by the kernel (--service-counters)",
        );
        let service_packets = ServiceCounter::register(
            &mut registry,
            "kproxy_service_packets",
            "Packets per Service port and verdict, counted by the kernel (--service-counters): served counts every packet of the connections sent to an endpoint, both directions; the other verdicts the packets refused",
        );
        let service_bytes = ServiceCounter::register(
            &mut registry,
            "kproxy_service_bytes",
            "Bytes (IP packets, headers included) per Service port and verdict, of the packets kproxy_service_packets_total counts (--service-counters)",
        );
        let acceleration_supported = Gauge::default();
        registry.register(
            "kproxy_acceleration_supported",
            "1 when the kernel has flowtables for Services acceleration; 0 when it has none or has not been probed yet",
            acceleration_supported.clone(),
        );

        let source = crate::source_metrics::SourceSlot::default();
        registry.register_collector(Box::new(crate::source_metrics::SourceCollector(source.clone())));
        // iptables mode's nfacct counters, once the dataplane plugs them in.
        let packets = crate::packet_metrics::PacketSlot::default();
        registry.register_collector(Box::new(crate::packet_metrics::PacketCollector::new(packets.clone())));

        // What every Kubernetes component exports.
        registry.register_collector(Box::new(crate::process_metrics::ProcessCollector));
        let build_info = Family::<BuildInfoLabels, Gauge>::default();
        build_info.get_or_create(&BuildInfoLabels::of_this_build()).set(1);
        registry.register(
            "kubernetes_build_info",
            "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running",
            build_info,
        );
        let feature_enabled = Family::default();
        registry.register(
            "kubernetes_feature_enabled",
            "This metric records the data about the stage and enablement of a k8s feature",
            Family::clone(&feature_enabled),
        );

        Self {
            inner: Arc::new(Inner {
                registry,
                sync_duration,
                sync_full_duration,
                sync_partial_duration,
                network_programming,
                last_sync,
                last_queued,
                endpoint_changes_pending,
                endpoint_changes,
                service_changes_pending,
                service_changes,
                no_local_endpoints,
                healthz,
                livez,
                nftables_sync_failures,
                nftables_cleanup_failures,
                iptables_restore_failures,
                iptables_partial_restore_failures,
                iptables_rules_total,
                iptables_rules_last,
                conntrack_duration,
                conntrack_deleted,
                conntrack_cleanup_failures,
                invalid_objects,
                masquerade_policy,
                masquerade_current: Mutex::new(Vec::new()),
                healthcheck_bind_failures,
                accelerated_connections,
                service_connections,
                service_packets,
                service_bytes,
                drift_repairs,
                feature_enabled,
                acceleration_supported,
                source,
                packets,
            }),
        }
    }

    /// One sync of `family` took `duration`; `full` tells a full resync from a partial one.
    /// Feeds `kubeproxy_sync_proxy_rules_duration_seconds` and the full or partial histogram.
    pub fn observe_sync(&self, family: IpFamily, full: bool, duration: Duration) {
        let labels = family_labels(family);
        let seconds = duration.as_secs_f64();
        self.inner.sync_duration.get_or_create(&labels).observe(seconds);
        let split = if full { &self.inner.sync_full_duration } else { &self.inner.sync_partial_duration };
        split.get_or_create(&labels).observe(seconds);
    }

    /// Time from an endpoint change (`endpoints.kubernetes.io/last-change-trigger-time`) to its
    /// programming, in seconds.
    pub fn observe_network_programming(&self, family: IpFamily, seconds: f64) {
        self.inner.network_programming.get_or_create(&family_labels(family)).observe(seconds);
    }

    /// As [`Metrics::observe_network_programming`], from the trigger time to `programmed_at`.
    /// A trigger time in the future (clock skew with the control plane) is recorded as 0.
    pub fn observe_network_programming_since(&self, family: IpFamily, trigger: SystemTime, programmed_at: SystemTime) {
        let seconds = programmed_at.duration_since(trigger).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        self.observe_network_programming(family, seconds);
    }

    /// `family` finished a successful sync at `at`.
    pub fn set_last_sync_timestamp(&self, family: IpFamily, at: SystemTime) {
        self.inner.last_sync.get_or_create(&family_labels(family)).set(unix_seconds(at));
    }

    /// A sync of `family` was queued at `at`.
    pub fn set_last_queued_timestamp(&self, family: IpFamily, at: SystemTime) {
        self.inner.last_queued.get_or_create(&family_labels(family)).set(unix_seconds(at));
    }

    /// EndpointSlice changes not yet synced.
    pub fn set_endpoint_changes_pending(&self, pending: u64) {
        self.inner.endpoint_changes_pending.set(saturating_i64(pending));
    }

    /// EndpointSlice changes seen (cumulative).
    pub fn add_endpoint_changes(&self, changes: u64) {
        self.inner.endpoint_changes.inc_by(changes);
    }

    /// Service changes not yet synced.
    pub fn set_service_changes_pending(&self, pending: u64) {
        self.inner.service_changes_pending.set(saturating_i64(pending));
    }

    /// Service changes seen (cumulative).
    pub fn add_service_changes(&self, changes: u64) {
        self.inner.service_changes.inc_by(changes);
    }

    /// Services of `family` with a Local `policy` and no local endpoints, as of the last sync.
    pub fn set_no_local_endpoints(&self, family: IpFamily, policy: TrafficPolicyKind, services: u64) {
        let labels = NoLocalLabels { ip_family: family.to_string(), traffic_policy: policy.label().to_string() };
        self.inner.no_local_endpoints.get_or_create(&labels).set(saturating_i64(services));
    }

    /// An nftables transaction for `family` failed.
    pub fn inc_nftables_sync_failure(&self, family: IpFamily) {
        self.inner.nftables_sync_failures.get_or_create(&family_labels(family)).inc();
    }

    /// Plugs in the source of cluster state, whose counts are exported from then on as
    /// `kproxy_source_*_total{kind}`.
    pub fn set_source(&self, source: std::sync::Arc<dyn crate::SourceCounters>) {
        *self.inner.source.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(source);
    }

    /// Plugs in the kernel's packet counters of the dataplane (iptables mode's nfacct counters),
    /// read at each scrape and exported as `kubeproxy_iptables_ct_state_invalid_dropped_packets_total`
    /// and `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`, each while it has a
    /// count. Nothing is exported before, or in modes that never plug them in.
    pub fn set_packet_counters(&self, counters: std::sync::Arc<dyn crate::PacketCounters>) {
        *self.inner.packets.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(counters);
    }

    /// Creates the per-family failure counters of `families` at zero, so that they are exported
    /// (and `rate()` works) before the first failure.
    pub fn declare_families(&self, families: &[IpFamily]) {
        for &family in families {
            let labels = family_labels(family);
            let _ = self.inner.nftables_sync_failures.get_or_create(&labels);
            let _ = self.inner.nftables_cleanup_failures.get_or_create(&labels);
            let _ = self.inner.iptables_restore_failures.get_or_create(&labels);
            let _ = self.inner.iptables_partial_restore_failures.get_or_create(&labels);
            let _ = self.inner.conntrack_cleanup_failures.get_or_create(&labels);
        }
    }

    /// Removing stale nftables chains for `family` failed.
    pub fn inc_nftables_cleanup_failure(&self, family: IpFamily) {
        self.inner.nftables_cleanup_failures.get_or_create(&family_labels(family)).inc();
    }

    /// An `iptables-restore` for `family` failed (iptables and IPVS modes).
    pub fn inc_iptables_restore_failure(&self, family: IpFamily) {
        self.inner.iptables_restore_failures.get_or_create(&family_labels(family)).inc();
    }

    /// A partial `iptables-restore` for `family` failed and fell back to a full one.
    pub fn inc_iptables_partial_restore_failure(&self, family: IpFamily) {
        self.inner.iptables_partial_restore_failures.get_or_create(&family_labels(family)).inc();
    }

    /// iptables rules kproxy owns in `table` (`total`) and wrote in the last sync (`last`).
    pub fn set_iptables_rules(&self, family: IpFamily, table: &str, total: u64, last: u64) {
        let labels = TableLabels { ip_family: family.to_string(), table: table.to_string() };
        self.inner.iptables_rules_total.get_or_create(&labels).set(saturating_i64(total));
        self.inner.iptables_rules_last.get_or_create(&labels).set(saturating_i64(last));
    }

    /// One conntrack reconcile of `family` took `duration` and deleted `deleted` flows.
    pub fn observe_conntrack_reconcile(&self, family: IpFamily, duration: Duration, deleted: u64) {
        let labels = family_labels(family);
        self.inner.conntrack_duration.get_or_create(&labels).observe(duration.as_secs_f64());
        self.inner.conntrack_deleted.get_or_create(&labels).inc_by(deleted);
    }

    /// A conntrack cleanup pass of `family` left stale entries behind.
    pub fn inc_conntrack_cleanup_failure(&self, family: IpFamily) {
        self.inner.conntrack_cleanup_failures.get_or_create(&family_labels(family)).inc();
    }

    /// A cluster object of `kind` (`Service`, `EndpointSlice`, ...) was skipped as invalid.
    pub fn inc_invalid_object(&self, kind: &str) {
        self.inner.invalid_objects.get_or_create(&KindLabels { kind: kind.to_string() }).inc();
    }

    /// States the effective masquerade policy of `family`: the SNAT source (`source`: `masquerade`,
    /// `node-ip` or `masquerade-fallback`, see `kproxy_plan::SnatPolicy::source_label`) and the
    /// CIDRs exempt from masquerading. Replaces the
    /// previous statement for that family, so exactly one series per family has value 1.
    pub fn set_masquerade_policy(&self, family: IpFamily, source: &str, no_masquerade_cidrs: &[IpNet]) {
        let labels = MasqueradeLabels {
            ip_family: family.to_string(),
            source: source.to_string(),
            no_masquerade_cidrs: no_masquerade_cidrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
        };
        let mut current = self.inner.masquerade_current.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        current.retain(|old| {
            let replaced = old.ip_family == labels.ip_family && *old != labels;
            if replaced {
                self.inner.masquerade_policy.remove(old);
            }
            !replaced
        });
        self.inner.masquerade_policy.get_or_create(&labels).set(1);
        if !current.contains(&labels) {
            current.push(labels);
        }
    }

    /// A `/healthz` answer with this HTTP status was sent.
    pub fn record_healthz(&self, status: u16) {
        self.inner.healthz.get_or_create(&CodeLabels { code: status.to_string() }).inc();
    }

    /// A `/livez` answer with this HTTP status was sent.
    pub fn record_livez(&self, status: u16) {
        self.inner.livez.get_or_create(&CodeLabels { code: status.to_string() }).inc();
    }

    /// Raises `kubeproxy_accelerated_connections_count_total` to the kernel's count of offloaded
    /// connections (a counter on the flowtable's first `flow add`); never goes down.
    pub fn set_accelerated_connections(&self, total: u64) {
        let current = self.inner.accelerated_connections.get();
        if total > current {
            self.inner.accelerated_connections.inc_by(total - current);
        }
    }

    /// Raises `kproxy_service_new_connections_total` to the kernel's counts. A series whose
    /// Service port is gone stays at its last value (a counter does not go away).
    pub fn set_service_connections(&self, counts: impl IntoIterator<Item = ServiceConnections>) {
        self.inner.service_connections.raise(counts);
    }

    /// Raises `kproxy_service_packets_total` to the kernel's counts, like
    /// [`Metrics::set_service_connections`].
    pub fn set_service_packets(&self, counts: impl IntoIterator<Item = ServiceConnections>) {
        self.inner.service_packets.raise(counts);
    }

    /// Raises `kproxy_service_bytes_total` to the kernel's counts, like
    /// [`Metrics::set_service_connections`].
    pub fn set_service_bytes(&self, counts: impl IntoIterator<Item = ServiceConnections>) {
        self.inner.service_bytes.raise(counts);
    }

    /// A periodic check or a full sync repaired kproxy's rules.
    pub fn inc_drift_repair(&self) {
        self.inner.drift_repairs.inc();
    }

    /// States every feature gate: `(name, stage label, enabled)` (see `kproxy_config::feature_gates`).
    pub fn set_feature_gates<'a>(&self, gates: impl IntoIterator<Item = (&'a str, &'a str, bool)>) {
        for (name, stage, enabled) in gates {
            let labels = FeatureLabels { name: name.to_owned(), stage: stage.to_owned() };
            self.inner.feature_enabled.get_or_create(&labels).set(i64::from(enabled));
        }
    }

    /// Sets `kproxy_acceleration_supported`: whether the kernel has flowtables.
    pub fn set_acceleration_supported(&self, supported: bool) {
        self.inner.acceleration_supported.set(i64::from(supported));
    }

    /// A health-check node port could not be opened.
    pub fn inc_healthcheck_bind_failure(&self) {
        self.inner.healthcheck_bind_failures.inc();
    }

    /// The exposition of every metric in `format`.
    pub fn encode(&self, format: Exposition) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        match format {
            Exposition::PrometheusText => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.inner.registry)?;
                out = go_style_bucket_bounds(&out);
            }
            Exposition::OpenMetrics => prometheus_client::encoding::text::encode(&mut out, &self.inner.registry)?,
        }
        Ok(out)
    }
}

/// Writes whole-number bucket bounds as Go does (`le="1"`, not `le="1.0"`).
///
/// In the Prometheus text format `le` is a label, compared as a string by Prometheus 2.x and by
/// every dashboard or recording rule that names a bucket (`{le="1"}`); kube-proxy's Go client
/// prints integral bounds without a fraction, so we do too. OpenMetrics keeps its canonical `1.0`.
fn go_style_bucket_bounds(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let bucket = !line.starts_with('#') && line.split(['{', ' ']).next().is_some_and(|n| n.ends_with("_bucket"));
        match line.find("le=\"").filter(|_| bucket) {
            Some(at) => {
                let value_start = at + 4;
                let value_len = line[value_start..].find('"').unwrap_or(0);
                let value = &line[value_start..value_start + value_len];
                let trimmed =
                    value.strip_suffix(".0").filter(|int| int.bytes().all(|b| b.is_ascii_digit() || b == b'-'));
                out.push_str(&line[..value_start]);
                out.push_str(trimmed.unwrap_or(value));
                out.push_str(&line[value_start + value_len..]);
            }
            None => out.push_str(line),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_layouts_match_upstream() {
        let sync = sync_duration_buckets();
        assert_eq!(sync.len(), 15);
        assert_eq!(sync[0], 0.001);
        assert!((sync[14] - 16.384).abs() < 1e-9);
        let np = network_programming_buckets();
        assert_eq!(np.len(), 1 + 2 + 59 + 12 + 7);
        assert_eq!(&np[..4], &[0.0, 0.25, 0.5, 1.0]);
        assert_eq!(np[61], 59.0);
        assert_eq!(np[62], 60.0);
        assert_eq!(np[73], 115.0);
        assert_eq!(np[74], 120.0);
        assert_eq!(np[80], 300.0);
    }

    #[test]
    fn integral_bucket_bounds_are_written_as_go_writes_them() {
        let text = "# HELP x_bucket le=\"1.0\" stays\nx_bucket{ip_family=\"IPv4\",le=\"1.0\"} 3\nx_bucket{le=\"0.25\"} 1\nx_bucket{le=\"300.0\"} 4\nx_bucket{le=\"+Inf\"} 4\ny{le=\"1.0\"} 1.0\n";
        assert_eq!(
            go_style_bucket_bounds(text),
            "# HELP x_bucket le=\"1.0\" stays\nx_bucket{ip_family=\"IPv4\",le=\"1\"} 3\nx_bucket{le=\"0.25\"} 1\nx_bucket{le=\"300\"} 4\nx_bucket{le=\"+Inf\"} 4\ny{le=\"1.0\"} 1.0\n"
        );
    }

    #[test]
    fn masquerade_policy_keeps_one_series_per_family() {
        let metrics = Metrics::new(DataplaneMode::Nftables);
        let cidr: IpNet = "198.18.0.0/15".parse().unwrap();
        metrics.set_masquerade_policy(IpFamily::V4, "masquerade", &[cidr]);
        metrics.set_masquerade_policy(IpFamily::V6, "masquerade-fallback", &[]);
        metrics.set_masquerade_policy(IpFamily::V4, "node-ip", &[cidr]);
        let text = metrics.encode(Exposition::PrometheusText).unwrap();
        let series: Vec<&str> = text.lines().filter(|l| l.starts_with("kproxy_masquerade_policy_info{")).collect();
        assert_eq!(series.len(), 2, "{series:?}");
        assert!(series.iter().any(|l| l.contains("source=\"node-ip\"") && l.contains("198.18.0.0/15")));
        assert!(
            series.iter().any(|l| l.contains("ip_family=\"IPv6\"") && l.contains("source=\"masquerade-fallback\""))
        );
    }
}

//! What happens around each sync in the daemon: health, metrics, health-check node ports.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;

use kproxy_plan::{ExternalPolicy, NoEndpointsVerdict, NodePortAddresses};
use kproxy_servers::{HealthCheckBind, Metrics, ProxyHealth, ServiceHealthServer, TrafficPolicyKind};
use kproxy_state::{IpFamily, ObjectError, ObjectKey};
use tokio::sync::mpsc;
use tracing::warn;

use crate::change_metrics::ChangeCounts;
use crate::proxier::{SyncObserver, Synced};

/// Where health-check node ports listen, the ports and their local endpoint counts, as of one
/// sync.
type HealthCheckUpdate = (HealthCheckBind, HashMap<ObjectKey, u16>, HashMap<ObjectKey, usize>);

/// Health-check node ports listen where NodePorts are served, as upstream: every address when
/// some family serves them on all local addresses, else the addresses `nodePortAddresses` match.
fn health_check_bind(plan: &kproxy_plan::Plan) -> HealthCheckBind {
    let mut addresses = Vec::new();
    for family in plan.families.values() {
        match &family.node.nodeport_addresses {
            NodePortAddresses::AllLocal => return HealthCheckBind::AllAddresses,
            NodePortAddresses::Only(only) => addresses.extend(only.iter().copied()),
        }
    }
    addresses.sort();
    addresses.dedup();
    HealthCheckBind::Addresses(addresses)
}

/// Feeds health, metrics and the health-check node port server from the sync loop.
pub struct DaemonObserver {
    node_name: String,
    families: Vec<IpFamily>,
    health: Arc<ProxyHealth>,
    metrics: Metrics,
    health_checks: mpsc::UnboundedSender<HealthCheckUpdate>,
    last_health_checks: Option<HealthCheckUpdate>,
    /// Deletes stale UDP/SCTP conntrack entries after each sync (absent in `--dry-run`).
    conntrack: Option<kproxy_conntrack::Reconciler>,
    started: SystemTime,
    mode: kproxy_servers::DataplaneMode,
    /// Services acceleration (KEP-4963), synced after each dataplane sync (absent in `--dry-run`).
    accel: Option<SharedAccelerator>,
    accel_synced: bool,
    accel_failing: bool,
    changes: ChangeCounts,
    /// The iptables dataplane's rule counts (iptables mode only).
    iptables_rules: Option<kproxy_iptables::RuleCounter>,
    /// The node's interface addresses (`crate::node_addresses`).
    node_addresses: Option<tokio::sync::watch::Receiver<Vec<std::net::IpAddr>>>,
}

/// The accelerator, shared with the link watcher that refreshes its flowtable devices.
pub type SharedAccelerator = Arc<std::sync::Mutex<kproxy_accel::Accelerator<kproxy_accel::NetlinkExecutor>>>;

/// What the daemon observer feeds.
pub struct Sinks {
    /// This node's name (for its draining state).
    pub node_name: String,
    /// The families planned.
    pub families: Vec<IpFamily>,
    /// `/healthz` and `/livez` state.
    pub health: Arc<ProxyHealth>,
    /// The metrics registry.
    pub metrics: Metrics,
    /// Health-check node ports (absent in `--dry-run`, which opens none).
    pub health_check_server: Option<Arc<ServiceHealthServer>>,
    /// Stale conntrack cleanup.
    pub conntrack: Option<kproxy_conntrack::Reconciler>,
    /// The dataplane, for mode-specific metrics.
    pub mode: kproxy_servers::DataplaneMode,
    /// Services acceleration.
    pub accel: Option<SharedAccelerator>,
}

impl DaemonObserver {
    /// An observer; health-check updates are applied in order by a task it spawns.
    pub fn new(sinks: Sinks) -> Self {
        let Sinks { node_name, families, health, metrics, health_check_server: server, conntrack, mode, accel } = sinks;
        let (tx, mut rx) = mpsc::unbounded_channel::<HealthCheckUpdate>();
        tokio::spawn(async move {
            while let Some((bind, ports, endpoints)) = rx.recv().await {
                let Some(server) = &server else {
                    tracing::info!(?ports, ?bind, "--dry-run: health-check node ports not opened");
                    continue;
                };
                server.set_bind(bind).await;
                for failure in server.sync_services(&ports).await {
                    warn!(service = %failure.service, port = failure.port, error = %failure.error, "cannot open health-check node port");
                }
                server.sync_endpoints(&endpoints).await;
            }
        });
        Self {
            node_name,
            families,
            health,
            metrics,
            health_checks: tx,
            last_health_checks: None,
            conntrack,
            started: SystemTime::now(),
            mode,
            accel,
            accel_synced: false,
            accel_failing: false,
            changes: ChangeCounts::default(),
            iptables_rules: None,
            node_addresses: None,
        }
    }
}

impl DaemonObserver {
    /// Follows the node's addresses: the conntrack reconciler gets them at each sync, and
    /// [`DaemonObserver::node_addresses`] hands them to the sync loop.
    pub fn follow_node_addresses(&mut self, addresses: tokio::sync::watch::Receiver<Vec<std::net::IpAddr>>) {
        self.node_addresses = Some(addresses);
    }

    /// A receiver of the node's addresses, when followed.
    pub fn node_addresses(&self) -> Option<tokio::sync::watch::Receiver<Vec<std::net::IpAddr>>> {
        self.node_addresses.clone()
    }

    /// Exports the iptables dataplane's rule counts after each sync.
    pub fn count_iptables_rules(&mut self, counter: kproxy_iptables::RuleCounter) {
        self.iptables_rules = Some(counter);
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The accelerator, for the link watcher.
    pub fn accelerator(&self) -> Option<SharedAccelerator> {
        self.accel.clone()
    }
}

impl SyncObserver for DaemonObserver {
    fn received(&mut self, change: &kproxy_state::Change) {
        self.changes.record(change, &self.metrics);
    }

    fn queued(&mut self, _at: Instant) {
        for &family in &self.families {
            self.health.queued_update(family);
            self.metrics.set_last_queued_timestamp(family, SystemTime::now());
        }
    }

    fn synced(&mut self, sync: &Synced<'_>) {
        let Synced { state, plan, delta, full, took, .. } = *sync;
        let now = SystemTime::now();
        let triggers: Vec<(IpFamily, SystemTime)> = sync
            .change_triggers
            .iter()
            .filter_map(|(family, t)| Some((*family, kproxy_servers::parse_rfc3339(t)?)))
            // As upstream: changes from before kproxy started are not its programming latency.
            .filter(|(_, t)| *t >= self.started)
            .collect();
        for (family, trigger) in triggers {
            self.metrics.observe_network_programming_since(family, trigger, now);
        }
        for (family, fd) in &delta.families {
            let Some(node) = &fd.node else { continue };
            let snat = &node.snat;
            self.metrics.set_masquerade_policy(*family, snat.source_label(), &snat.no_masquerade_cidrs);
            if snat.fell_back_to_masquerade {
                warn!(%family, "snatToNodeIP is on but the node has no {family} InternalIP: masquerading instead");
            } else {
                tracing::info!(%family, source = snat.source_label(), no_masquerade_cidrs = ?snat.no_masquerade_cidrs,
                    exempt = ?node.no_masquerade_sources(), "effective masquerade policy");
            }
        }
        self.health.set_node_eligible(state.node(&self.node_name).is_none_or(|n| !n.draining));
        self.changes.taken(&self.metrics);
        for (family, table, rules) in self.iptables_rules.iter().flat_map(|counter| counter.snapshot()) {
            self.metrics.set_iptables_rules(family, table.as_str(), rules.total, rules.last);
        }

        let mut ports = HashMap::new();
        let mut endpoints: HashMap<ObjectKey, usize> = HashMap::new();
        for (family, fam) in &plan.families {
            let (mut internal_drop, mut external_drop) = (0, 0);
            for port in fam.services.values() {
                internal_drop += u64::from(port.internal.no_endpoints == Some(NoEndpointsVerdict::Drop));
                let Some(ext) = &port.external else { continue };
                external_drop += u64::from(ext.no_endpoints == Some(NoEndpointsVerdict::Drop));
                if let (Some(hc), ExternalPolicy::Local { .. }) = (port.health_check_node_port, ext.policy) {
                    let key = ObjectKey::new(port.name.namespace.clone(), port.name.service.clone());
                    ports.insert(key.clone(), hc);
                    let local_ready = port.local_endpoints.iter().filter(|e| e.ready).count();
                    let count = endpoints.entry(key).or_default();
                    *count = (*count).max(local_ready);
                }
            }
            self.metrics.set_no_local_endpoints(*family, TrafficPolicyKind::Internal, internal_drop);
            self.metrics.set_no_local_endpoints(*family, TrafficPolicyKind::External, external_drop);
        }
        if let Some(reconciler) = self.conntrack.as_mut() {
            if let Some(addresses) = self.node_addresses.as_mut() {
                // Recognises UDP NodePort entries on every local address, not just the node IP.
                reconciler.set_local_addresses(addresses.borrow_and_update().clone());
            }
            for (family, fam) in &plan.families {
                // A dump and a few deletes over netlink (the sync loop has its own thread).
                match reconciler.reconcile(fam) {
                    Ok(stats) => {
                        self.metrics.observe_conntrack_reconcile(*family, stats.duration, stats.deleted as u64);
                        if stats.failed > 0 {
                            // Each refused delete was logged by the reconciler.
                            self.metrics.inc_conntrack_cleanup_failure(*family);
                        }
                    }
                    Err(e) => {
                        warn!(%family, error = %e, "conntrack cleanup failed; retrying after the next sync");
                        self.metrics.inc_conntrack_cleanup_failure(*family);
                    }
                }
            }
        }

        if let Some(accel) = &self.accel {
            let mut accel = accel.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // The first sync also removes whatever a previous run left when acceleration is now off.
            let result = if self.accel_synced { accel.sync(plan, delta) } else { accel.full_sync(plan) };
            if let Some(supported) = accel.supported() {
                self.metrics.set_acceleration_supported(supported);
            }
            match result {
                // Skipped: a kernel without flowtables (said once at the probe), or a failed
                // batch waiting out its backoff (the failure streak goes on).
                Ok(report) if report.skipped => self.accel_synced = true,
                Ok(_) => {
                    self.accel_synced = true;
                    self.accel_failing = false;
                    if accel.is_active() {
                        self.metrics.set_accelerated_connections(accel.accelerated_connections_total());
                    }
                }
                // Once per failure streak.
                Err(e) if !self.accel_failing => {
                    self.accel_failing = true;
                    warn!(error = %e, "services acceleration sync failed; retrying with backoff")
                }
                Err(e) => tracing::debug!(error = %e, "services acceleration sync failed again"),
            }
        }

        let update = (health_check_bind(plan), ports, endpoints);
        if self.last_health_checks.as_ref() != Some(&update) {
            self.last_health_checks = Some(update.clone());
            let _ = self.health_checks.send(update);
        }
        // Last, so that a scrape which sees this sync's timestamp also sees everything the
        // sync published above (readers such as tests and dashboards key on it).
        for &family in &self.families {
            self.health.updated(family);
            self.metrics.set_last_sync_timestamp(family, now);
            self.metrics.observe_sync(family, full, took);
        }
    }

    fn cleanup_failed(&mut self, family: IpFamily) {
        self.metrics.inc_nftables_cleanup_failure(family);
    }

    fn failed(&mut self, full: bool) {
        // The failed sync took the changes; the full resync that follows programs them.
        self.changes.taken(&self.metrics);
        for &family in &self.families {
            match self.mode {
                kproxy_servers::DataplaneMode::Nftables => self.metrics.inc_nftables_sync_failure(family),
                kproxy_servers::DataplaneMode::Iptables if !full => {
                    self.metrics.inc_iptables_partial_restore_failure(family)
                }
                kproxy_servers::DataplaneMode::Iptables | kproxy_servers::DataplaneMode::Ipvs => {
                    self.metrics.inc_iptables_restore_failure(family)
                }
            }
        }
    }

    fn drift_repaired(&mut self, _drift: &[String]) {
        self.metrics.inc_drift_repair();
    }

    fn counted(&mut self, counts: &[kproxy_nftables::counters::ServicePortCounts]) {
        use kproxy_nftables::counters::ServicePortCounts;
        use kproxy_plan::explain::ConnectionCounts;
        // Each service port's counts of one kind, one series per verdict.
        fn series(
            counts: &[ServicePortCounts],
            of: impl Fn(&ServicePortCounts) -> &ConnectionCounts,
        ) -> impl Iterator<Item = kproxy_servers::ServiceConnections> {
            counts.iter().flat_map(move |c| {
                let n = of(c);
                [
                    ("served", n.served),
                    ("rejected_no_endpoints", n.rejected_no_endpoints),
                    ("dropped_no_local_endpoints", n.dropped_no_local_endpoints),
                    ("dropped_by_source_ranges", n.dropped_by_source_ranges),
                ]
                .map(|(verdict, total)| kproxy_servers::ServiceConnections {
                    family: c.family,
                    namespace: c.name.namespace.to_string(),
                    service: c.name.service.to_string(),
                    port: c.name.port.to_string(),
                    protocol: c.name.protocol.as_str().to_owned(),
                    verdict,
                    total,
                })
            })
        }
        self.metrics.set_service_connections(series(counts, |c| &c.counts));
        self.metrics.set_service_packets(series(counts, |c| &c.packets));
        self.metrics.set_service_bytes(series(counts, |c| &c.bytes));
    }

    fn rejected(&mut self, errors: &[ObjectError]) {
        for e in errors {
            self.metrics.inc_invalid_object(&e.kind.to_string());
        }
    }
}

//! What happens around each sync in the daemon: health, metrics, health-check node ports.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::Instant;

use kproxy_plan::{
    ExternalPolicy, FamilyDelta, NoEndpointsVerdict, NodePortAddresses, Plan, PlanDelta, ServicePortName,
    ServicePortPlan,
};
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
            NodePortAddresses::AllLocal(_) => return HealthCheckBind::AllAddresses,
            NodePortAddresses::Only(only) => addresses.extend(only.iter().copied()),
        }
    }
    addresses.sort();
    addresses.dedup();
    HealthCheckBind::Addresses(addresses)
}

/// What the observer publishes about the plan's service ports, kept from sync to sync: built
/// from the whole plan after a full sync ([`PlanTally::of_plan`]), patched with a partial sync's
/// changes ([`PlanTally::apply`]) at the cost of the service ports they touch, so a change in a
/// cluster of thousands of Services does not walk them all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PlanTally {
    /// Per family, the service ports whose ClusterIP / external traffic is dropped for want of
    /// a local endpoint (`kubeproxy_sync_proxy_rules_no_local_endpoints_total`).
    dropped: BTreeMap<IpFamily, Dropped>,
    /// The health-check node port of each service port with one (`externalTrafficPolicy:
    /// Local`), per family.
    health_checks: BTreeMap<(IpFamily, ServicePortName), HealthCheck>,
}

/// Service ports whose traffic of each kind is dropped for want of a local endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Dropped {
    internal: u64,
    external: u64,
}

/// One service port's health-check node port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HealthCheck {
    service: ObjectKey,
    node_port: u16,
    /// Its ready endpoints on this node.
    local_ready: usize,
}

impl PlanTally {
    /// The tally of a whole plan.
    fn of_plan(plan: &Plan) -> Self {
        let mut tally = PlanTally::default();
        for (family, fam) in &plan.families {
            tally.dropped.entry(*family).or_default();
            for port in fam.services.values() {
                tally.count(*family, port, true);
            }
        }
        tally
    }

    /// Takes in a partial sync's changes; returns whether the health-check node ports changed.
    fn apply(&mut self, delta: &PlanDelta) -> bool {
        let mut health_checks = false;
        for (family, changes) in &delta.families {
            let FamilyDelta { added, changed, removed, .. } = changes;
            self.dropped.entry(*family).or_default();
            for port in removed.iter().chain(changed.iter().map(|c| &c.old)) {
                health_checks |= self.count(*family, port, false);
            }
            for port in added.iter().chain(changed.iter().map(|c| &c.new)) {
                health_checks |= self.count(*family, port, true);
            }
        }
        health_checks
    }

    /// Adds (or takes away) what one service port contributes; returns whether it has a
    /// health-check node port.
    fn count(&mut self, family: IpFamily, port: &ServicePortPlan, add: bool) -> bool {
        let dropped = self.dropped.entry(family).or_default();
        let tally = |count: &mut u64, dropped: bool| {
            if dropped {
                *count = if add { *count + 1 } else { count.saturating_sub(1) };
            }
        };
        tally(&mut dropped.internal, port.internal.no_endpoints == Some(NoEndpointsVerdict::Drop));
        let Some(ext) = &port.external else { return false };
        tally(&mut dropped.external, ext.no_endpoints == Some(NoEndpointsVerdict::Drop));
        let (Some(node_port), ExternalPolicy::Local { .. }) = (port.health_check_node_port, ext.policy) else {
            return false;
        };
        let key = (family, port.name.clone());
        if add {
            let service = ObjectKey::new(port.name.namespace.clone(), port.name.service.clone());
            let local_ready = port.local_endpoints.iter().filter(|e| e.ready).count();
            self.health_checks.insert(key, HealthCheck { service, node_port, local_ready });
        } else {
            self.health_checks.remove(&key);
        }
        true
    }

    /// The health-check node port of each Service and its local ready endpoints (the most any
    /// of its service ports has).
    fn health_check_ports(&self) -> (HashMap<ObjectKey, u16>, HashMap<ObjectKey, usize>) {
        let mut ports = HashMap::new();
        let mut endpoints: HashMap<ObjectKey, usize> = HashMap::new();
        for check in self.health_checks.values() {
            ports.insert(check.service.clone(), check.node_port);
            let count = endpoints.entry(check.service.clone()).or_default();
            *count = (*count).max(check.local_ready);
        }
        (ports, endpoints)
    }
}

/// Feeds health, metrics and the health-check node port server from the sync loop.
pub struct DaemonObserver {
    node_name: String,
    families: Vec<IpFamily>,
    health: Arc<ProxyHealth>,
    metrics: Metrics,
    health_checks: mpsc::UnboundedSender<HealthCheckUpdate>,
    last_health_checks: Option<HealthCheckUpdate>,
    /// What the last sync's plan publishes (see [`PlanTally`]).
    tally: PlanTally,
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
            tally: PlanTally::default(),
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

        // A full sync's delta may not lead from the plan the observer saw last (a failed sync
        // in between changed the plan unobserved): what the plan publishes is taken from the
        // whole plan then, and patched with the changes of a partial sync.
        let health_checks_changed = if full {
            self.tally = PlanTally::of_plan(plan);
            true
        } else {
            self.tally.apply(delta)
        };
        for family in plan.families.keys() {
            let dropped = self.tally.dropped.get(family).copied().unwrap_or_default();
            self.metrics.set_no_local_endpoints(*family, TrafficPolicyKind::Internal, dropped.internal);
            self.metrics.set_no_local_endpoints(*family, TrafficPolicyKind::External, dropped.external);
        }
        if let Some(reconciler) = self.conntrack.as_mut() {
            if let Some(addresses) = self.node_addresses.as_mut() {
                // Recognises UDP NodePort entries on every local address, not just the node IP.
                reconciler.set_local_addresses(addresses.borrow_and_update().clone());
            }
            let unchanged = FamilyDelta::default();
            for (family, fam) in &plan.families {
                // A dump and a few deletes over netlink (the sync loop has its own thread).
                let result = if full {
                    reconciler.reconcile(fam)
                } else {
                    reconciler.reconcile_changes(fam, delta.families.get(family).unwrap_or(&unchanged))
                };
                match result {
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
            // The first sync also removes whatever a previous run left when acceleration is now
            // off; a full sync's delta may miss a failed sync's changes (see above).
            let result = if self.accel_synced && !full { accel.sync(plan, delta) } else { accel.full_sync(plan) };
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

        let bind = health_check_bind(plan);
        if health_checks_changed || self.last_health_checks.as_ref().is_none_or(|(last, ..)| *last != bind) {
            let (ports, endpoints) = self.tally.health_check_ports();
            let update = (bind, ports, endpoints);
            if self.last_health_checks.as_ref() != Some(&update) {
                self.last_health_checks = Some(update.clone());
                let _ = self.health_checks.send(update);
            }
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

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use kproxy_plan::{
        Endpoint, ExternalTraffic, FamilyPlan, InternalTraffic, LocalTraffic, MasqueradeWhen, NodePlan, SnatPolicy,
    };
    use kproxy_state::Protocol;
    use proptest::prelude::*;

    use super::*;

    fn node() -> NodePlan {
        NodePlan {
            node_ip: None,
            local_traffic: LocalTraffic::Undetectable,
            nodeport_addresses: NodePortAddresses::AllLocal(Vec::new()),
            snat: SnatPolicy::masquerade(),
            service_cidrs: Vec::new(),
            acceleration: false,
        }
    }

    /// A service port from small pools: names repeat across plans, and every field the tally
    /// reads varies.
    fn arbitrary_port() -> impl Strategy<Value = ServicePortPlan> {
        let verdict =
            proptest::option::of(prop::sample::select(vec![NoEndpointsVerdict::Drop, NoEndpointsVerdict::Reject]));
        let external = proptest::option::of((any::<bool>(), verdict.clone()));
        (
            (0u8..3, 0u8..2, verdict),
            (external, proptest::option::of(prop::sample::select(vec![30001u16, 30002]))),
            prop::collection::vec(any::<bool>(), 0..4),
        )
            .prop_map(|((service, port, internal_verdict), (external, health_check), ready)| {
                let name = ServicePortName {
                    namespace: "ns".into(),
                    service: format!("svc-{service}").into(),
                    port: format!("p{port}").into(),
                    protocol: Protocol::Tcp,
                };
                let local_endpoints: Vec<Endpoint> = ready
                    .iter()
                    .enumerate()
                    .map(|(i, ready)| Endpoint {
                        ip: IpAddr::from([198, 18, 0, i as u8 + 1]),
                        port: 8080,
                        is_local: true,
                        ready: *ready,
                    })
                    .collect();
                let external = external.map(|(local, no_endpoints)| ExternalTraffic {
                    policy: if local {
                        ExternalPolicy::Local { short_circuit_pods: false }
                    } else {
                        ExternalPolicy::Cluster
                    },
                    no_endpoints,
                });
                ServicePortPlan {
                    name,
                    cluster_ip: IpAddr::from([198, 18, 128, 1 + service]),
                    port: 80 + u16::from(port),
                    protocol: Protocol::Tcp,
                    node_port: None,
                    external_ips: Vec::new(),
                    load_balancer_ips: Vec::new(),
                    source_ranges: Vec::new(),
                    affinity_timeout: None,
                    cluster_endpoints: Vec::new(),
                    local_endpoints,
                    internal: InternalTraffic {
                        local: false,
                        masquerade: MasqueradeWhen::Never,
                        no_endpoints: internal_verdict,
                    },
                    external,
                    health_check_node_port: health_check,
                    accelerate: false,
                    serving_endpoints: Vec::new(),
                }
            })
    }

    fn arbitrary_plan() -> impl Strategy<Value = Plan> {
        let family = |family: IpFamily| {
            prop::collection::vec(arbitrary_port(), 0..6).prop_map(move |ports| FamilyPlan {
                family,
                node: node(),
                services: ports.into_iter().map(|p| (p.name.clone(), Arc::new(p))).collect(),
            })
        };
        (family(IpFamily::V4), proptest::option::of(family(IpFamily::V6))).prop_map(|(v4, v6)| {
            let mut families = BTreeMap::from([(IpFamily::V4, v4)]);
            families.extend(v6.map(|v6| (IpFamily::V6, v6)));
            Plan { families }
        })
    }

    proptest! {
        /// The tally patched with each change of a sequence of plans publishes what the tally
        /// of the last plan, built whole, does; and a patch says the health-check node ports
        /// changed whenever they did.
        #[test]
        fn the_tally_patched_change_by_change_publishes_what_one_built_from_the_whole_plan_does(
            plans in prop::collection::vec(arbitrary_plan(), 1..8),
        ) {
            let mut before = Plan::default();
            let mut patched = PlanTally::default();
            for after in plans {
                let whole = PlanTally::of_plan(&after);
                let health_checks_changed = patched.apply(&PlanDelta::between(&before, &after));
                for family in after.families.keys() {
                    prop_assert_eq!(patched.dropped.get(family).copied().unwrap_or_default(), whole.dropped[family]);
                }
                prop_assert_eq!(&patched.health_checks, &whole.health_checks);
                prop_assert_eq!(patched.health_check_ports(), whole.health_check_ports());
                let previous = PlanTally::of_plan(&before).health_check_ports();
                if previous != whole.health_check_ports() {
                    prop_assert!(health_checks_changed, "the health-check node ports changed unsaid");
                }
                before = after;
            }
        }
    }
}

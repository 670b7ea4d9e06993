//! The fast path's in-memory state and how it is brought in line with the plan.
//!
//! The table exists only while acceleration is on and at least one service port opted in, so
//! a cluster that ignores the feature has no extra hook on any packet. While it exists, each
//! sync emits only the set elements that flipped (O(change)); after a failed batch the next
//! sync recreates the table from the desired state, which also repairs anything done to the
//! table behind kproxy's back. Flowtable devices follow the node's links
//! ([`Accelerator::refresh_devices`], driven by [`crate::LinkWatcher`]).

use std::collections::BTreeSet;
use std::time::Instant;

use kproxy_plan::{Plan, PlanDelta};

use crate::config::AccelConfig;
use crate::elements::{ElementChanges, ElementIndex, PortKey, elements_of};
use crate::error::AccelError;
use crate::exec::AccelKernel;
use crate::links;
use crate::ruleset::{self, CHAIN_OFFLOAD};
use crate::support::Backoff;
use crate::view::{OffloadedConnection, ServiceAcceleration};

/// What one sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyncReport {
    /// The table was (re)created.
    pub recreated: bool,
    /// The table was removed (acceleration off, or nothing opted in).
    pub removed: bool,
    /// Set elements added.
    pub added: usize,
    /// Set elements deleted.
    pub deleted: usize,
    /// Nothing was tried: the kernel has no flowtables, or a failed batch waits out its backoff.
    pub skipped: bool,
}

/// The fast-path controller for one network namespace. What the kernel holds is known from
/// what was applied (kept here), never read back on a sync.
#[derive(Debug)]
pub struct Accelerator<K: AccelKernel> {
    kernel: K,
    config: AccelConfig,
    /// Acceleration is on in the plan (`NodePlan::acceleration`).
    enabled: bool,
    /// The opted-in elements of the current plan, with owners.
    desired: ElementIndex,
    /// The elements in the kernel's sets (meaningful while `table_present`).
    applied: BTreeSet<crate::Element>,
    /// Changes since the last successful batch.
    pending: ElementChanges,
    table_present: bool,
    /// The kernel may differ from `applied`: recreate on the next sync.
    needs_recreate: bool,
    devices: BTreeSet<String>,
    /// Connections counted by tables that have since been deleted (the metric is monotonic).
    counted_before: u64,
    /// Whether the kernel has flowtables; probed at the first sync.
    supported: Option<bool>,
    /// When a failed batch is tried again.
    backoff: Backoff,
}

impl<K: AccelKernel> Accelerator<K> {
    /// A controller that has not touched the kernel yet; the first sync creates the table (and
    /// replaces any copy a previous run left behind).
    pub fn new(kernel: K, config: AccelConfig) -> Self {
        Accelerator {
            kernel,
            config,
            enabled: false,
            desired: ElementIndex::default(),
            applied: BTreeSet::new(),
            pending: ElementChanges::default(),
            table_present: false,
            needs_recreate: true,
            devices: BTreeSet::new(),
            counted_before: 0,
            supported: None,
            backoff: Backoff::default(),
        }
    }

    /// Whether the kernel has flowtables (`None` before the first sync probed it): the gauge
    /// `kproxy_acceleration_supported`.
    pub fn supported(&self) -> Option<bool> {
        self.supported
    }

    /// Probes the kernel once, saying what it found in one log line. The daemon calls it before
    /// its first sync, so the probe's scratch commit comes before the nftables dataplane's
    /// first commit and does not make its first periodic check list the tables.
    pub fn probe_once(&mut self) -> Result<bool, AccelError> {
        if let Some(supported) = self.supported {
            return Ok(supported);
        }
        let supported = self.kernel.probe_flowtables()?;
        if supported {
            tracing::info!("services acceleration available: the kernel has flowtables");
        } else {
            tracing::warn!(
                "services acceleration unavailable: the kernel has no flowtables (nf_flow_table, \
                 nft_flow_offload); Services that opt in stay on the regular path"
            );
        }
        self.supported = Some(supported);
        Ok(supported)
    }

    /// The executor (tests inspect what was applied).
    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    /// The executor, mutably.
    pub fn kernel_mut(&mut self) -> &mut K {
        &mut self.kernel
    }

    /// The configuration.
    pub fn config(&self) -> &AccelConfig {
        &self.config
    }

    /// Whether the fast-path table is in the kernel.
    pub fn is_active(&self) -> bool {
        self.table_present
    }

    /// The devices the flowtable holds.
    pub fn devices(&self) -> &BTreeSet<String> {
        &self.devices
    }

    /// The accelerated service ports of the current plan.
    pub fn accelerated_ports(&self) -> impl Iterator<Item = &PortKey> {
        self.desired.ports()
    }

    /// Brings the kernel in line after a sync of the dataplane: `delta` is what changed since
    /// the last call (everything, the first time). O(change) unless a recreate is due.
    pub fn sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<SyncReport, AccelError> {
        self.enabled = plan_enabled(plan);
        for (family, family_delta) in &delta.families {
            for port in &family_delta.removed {
                let changes = self.desired.set_port((*family, port.name.clone()), BTreeSet::new());
                self.merge_pending(changes);
            }
            let current = family_delta.added.iter().chain(family_delta.changed.iter().map(|c| &c.new));
            for port in current {
                let changes = self.desired.set_port((*family, port.name.clone()), elements_of(port));
                self.merge_pending(changes);
            }
        }
        self.reconcile()
    }

    /// Recomputes the desired state from the whole plan (startup, periodic full syncs) and
    /// applies the difference to what the kernel holds.
    pub fn full_sync(&mut self, plan: &Plan) -> Result<SyncReport, AccelError> {
        self.enabled = plan_enabled(plan);
        self.desired = ElementIndex::from_plan(plan);
        let desired: BTreeSet<crate::Element> = self.desired.elements().copied().collect();
        self.pending = ElementChanges {
            added: desired.difference(&self.applied).copied().collect(),
            removed: self.applied.difference(&desired).copied().collect(),
        };
        self.reconcile()
    }

    fn merge_pending(&mut self, changes: ElementChanges) {
        for element in changes.removed {
            if !self.pending.added.remove(&element) {
                self.pending.removed.insert(element);
            }
        }
        for element in changes.added {
            if !self.pending.removed.remove(&element) {
                self.pending.added.insert(element);
            }
        }
    }

    fn reconcile(&mut self) -> Result<SyncReport, AccelError> {
        if !self.probe_once()? {
            // Nothing can be installed, so nothing was: there is no table to maintain.
            self.pending = ElementChanges::default();
            return Ok(SyncReport { skipped: true, ..SyncReport::default() });
        }
        if (self.needs_recreate || !self.table_present) && !self.backoff.ready(Instant::now()) {
            return Ok(SyncReport { skipped: true, ..SyncReport::default() });
        }
        let result = self.reconcile_now();
        match &result {
            Ok(_) => self.backoff.succeeded(),
            Err(error) => {
                let wait = self.backoff.failed(Instant::now());
                tracing::debug!(%error, failures = self.backoff.failures(), ?wait, "fast-path batch failed");
            }
        }
        result
    }

    fn reconcile_now(&mut self) -> Result<SyncReport, AccelError> {
        let want_table = self.enabled && !self.desired.is_empty();
        if !want_table {
            if !self.table_present && !self.needs_recreate {
                self.pending = ElementChanges::default();
                return Ok(SyncReport::default());
            }
            self.remove_table()?;
            return Ok(SyncReport { removed: true, ..SyncReport::default() });
        }
        if !self.table_present || self.needs_recreate {
            return self.recreate();
        }
        let tx = ruleset::element_updates(&self.pending.added, &self.pending.removed);
        if let Err(error) = self.kernel.apply(&tx) {
            self.needs_recreate = true;
            return Err(error);
        }
        let pending = std::mem::take(&mut self.pending);
        let report = SyncReport { added: pending.added.len(), deleted: pending.removed.len(), ..SyncReport::default() };
        self.applied.extend(pending.added);
        for element in &pending.removed {
            self.applied.remove(element);
        }
        if report.added + report.deleted > 0 {
            tracing::debug!(added = report.added, deleted = report.deleted, "fast-path elements updated");
        }
        Ok(report)
    }

    /// Deletes any existing copy and creates the table with every desired element and the
    /// current links as flowtable devices, in one batch.
    fn recreate(&mut self) -> Result<SyncReport, AccelError> {
        self.bank_counter();
        let devices = links::eligible_links()?;
        let tx = ruleset::create_table(&self.config, &devices, self.desired.elements());
        if let Err(error) = self.kernel.apply(&tx) {
            self.needs_recreate = true;
            return Err(error);
        }
        self.applied = self.desired.elements().copied().collect();
        self.pending = ElementChanges::default();
        self.table_present = true;
        self.needs_recreate = false;
        tracing::info!(
            elements = self.applied.len(),
            devices = ?devices,
            threshold = self.config.packet_threshold,
            "fast-path table created"
        );
        self.devices = devices;
        Ok(SyncReport { recreated: true, added: self.applied.len(), ..SyncReport::default() })
    }

    fn remove_table(&mut self) -> Result<(), AccelError> {
        self.bank_counter();
        if let Err(error) = self.kernel.apply(&ruleset::delete_table()) {
            self.needs_recreate = true;
            return Err(error);
        }
        if self.table_present {
            tracing::info!("fast-path table removed");
        }
        self.table_present = false;
        self.needs_recreate = false;
        self.applied.clear();
        self.pending = ElementChanges::default();
        self.devices.clear();
        Ok(())
    }

    /// Re-reads the node's links and registers new ones with the flowtable, unregistering the
    /// ones that went down (deleted links leave the flowtable by themselves). Returns whether
    /// the device list changed. Nothing to do while the table is absent.
    pub fn refresh_devices(&mut self) -> Result<bool, AccelError> {
        if !self.table_present || self.needs_recreate {
            return Ok(false);
        }
        let (eligible, existing) = links::links()?;
        let added: BTreeSet<String> = eligible.difference(&self.devices).cloned().collect();
        let gone: BTreeSet<String> = self.devices.difference(&eligible).cloned().collect();
        let removed: BTreeSet<String> = gone.intersection(&existing).cloned().collect();
        if added.is_empty() && gone.is_empty() {
            return Ok(false);
        }
        if let Err(error) = self.kernel.apply(&ruleset::device_updates(&added, &removed)) {
            // The kernel's device list is not what we think (or a link vanished meanwhile):
            // start over from the links as they are on the next sync.
            self.needs_recreate = true;
            return Err(error);
        }
        tracing::info!(?added, ?gone, "flowtable devices updated");
        self.devices = eligible;
        Ok(true)
    }

    /// Removes the table (acceleration turned off at runtime, shutdown with `--cleanup`).
    pub fn cleanup(&mut self) -> Result<(), AccelError> {
        self.enabled = false;
        self.remove_table()
    }

    /// Connections handed to the flowtable since this controller started (the metric
    /// `kubeproxy_accelerated_connections_count_total`): the counter of the rule that marks a
    /// connection offloaded, plus the counts of tables deleted since. An unreadable counter
    /// counts as 0 for this scrape (logged).
    pub fn accelerated_connections_total(&mut self) -> u64 {
        self.counted_before + if self.table_present { self.read_counter() } else { 0 }
    }

    /// Opted-in service ports with their currently offloaded connections (`offloaded` from
    /// [`crate::offloaded_connections`]), matched by the connection's original destination.
    /// Every accelerated service port is listed, also with 0 connections.
    pub fn accelerated_view(&self, offloaded: &[OffloadedConnection]) -> Vec<ServiceAcceleration> {
        crate::view::group_by_service(&self.desired, offloaded)
    }

    fn bank_counter(&mut self) {
        if self.table_present {
            self.counted_before += self.read_counter();
        }
    }

    fn read_counter(&mut self) -> u64 {
        match self.kernel.counted_packets(&ruleset::table(), CHAIN_OFFLOAD) {
            Ok(Some(packets)) => packets,
            Ok(None) => {
                tracing::warn!("no counter in the fast-path chain");
                0
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read the fast-path counter");
                0
            }
        }
    }
}

/// `--cleanup`: removes the fast-path table if present, without any state.
pub fn cleanup(kernel: &mut impl AccelKernel) -> Result<(), AccelError> {
    kernel.apply(&ruleset::delete_table())
}

/// Acceleration is on when the plan says so for any family (the switch is node-wide).
fn plan_enabled(plan: &Plan) -> bool {
    plan.families.values().any(|family| family.node.acceleration)
}

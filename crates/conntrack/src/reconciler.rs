//! The reconciler: after each sync, make the kernel's UDP/SCTP conntrack entries agree with the plan.
//!
//! One pass dumps the entries of the protocols the plan's frontends use (none at all when it has
//! no UDP or SCTP service), decides which are stale (see [`crate::stale_flows`]) and deletes them.
//!
//! The frontends are kept between passes: a pass after a partial sync patches them with that
//! sync's changes ([`Reconciler::reconcile_changes`], O(change)), one after a full sync builds
//! them from the whole plan ([`Reconciler::reconcile`]).
//!
//! Frontends of services that are deleted vanish from the plan, so the plan alone cannot say that
//! flows to them are stale (upstream PR #141371). The reconciler therefore remembers the frontends
//! that disappeared; such a frontend is treated as having no endpoints until a pass completed
//! without error after its disappearance (the dataplane already stopped DNATing to it, so one
//! complete pass removes all its entries). A frontend that comes back before that is simply
//! current again.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use kproxy_plan::{FamilyDelta, FamilyPlan};
use kproxy_state::IpFamily;
use tracing::{debug, info, warn};

use crate::cleanup::{Frontend, Frontends, MANAGED_PROTOCOLS, NodePortScope, stale_flows};
use crate::error::Error;
use crate::netlink::ConntrackSocket;

/// What one reconcile pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconcileStats {
    /// The family reconciled.
    pub family: IpFamily,
    /// Entries dumped and examined.
    pub examined: usize,
    /// Entries found stale.
    pub stale: usize,
    /// Stale entries deleted (for `kubeproxy_conntrack_reconciler_deleted_entries_total`).
    pub deleted: usize,
    /// Stale entries that were gone by the time they were deleted.
    pub already_gone: usize,
    /// Stale entries the kernel refused to delete (each logged as a warning).
    pub failed: usize,
    /// Wall time of the pass (for `kubeproxy_conntrack_reconciler_sync_duration_seconds`).
    pub duration: Duration,
}

#[derive(Debug, Default)]
struct Memory {
    /// The frontends of the plan of the last pass (none before the first).
    frontends: Option<Frontends>,
    /// Frontends that disappeared and whose entries were not yet all removed.
    retired: BTreeSet<Frontend>,
}

/// Removes stale UDP and SCTP conntrack entries of one network namespace (the one of the thread
/// that created it), for both families.
#[derive(Debug)]
pub struct Reconciler {
    socket: ConntrackSocket,
    local_addresses: Vec<IpAddr>,
    memory: BTreeMap<IpFamily, Memory>,
}

impl Reconciler {
    /// Opens a ctnetlink socket in the calling thread's network namespace.
    pub fn new() -> Result<Self, Error> {
        Ok(Self { socket: ConntrackSocket::open()?, local_addresses: Vec::new(), memory: BTreeMap::new() })
    }

    /// The node's local addresses. Only used when node ports are served on every local address,
    /// to recognise node-port entries that were never DNATed (sent before the service existed).
    pub fn set_local_addresses(&mut self, addresses: Vec<IpAddr>) {
        self.local_addresses = addresses;
    }

    /// One pass for the plan's family: dump, decide, delete. Takes the frontends from the whole
    /// plan: after a full sync, or when the last passes' plans are not known to lead to this one.
    ///
    /// Fails only when the table cannot be dumped or the socket fails; entries the kernel refuses
    /// to delete are counted in [`ReconcileStats::failed`] and retried by the next pass.
    pub fn reconcile(&mut self, plan: &FamilyPlan) -> Result<ReconcileStats, Error> {
        self.pass(plan, None)
    }

    /// One pass after a partial sync: `changes` took the plan of the last pass to `plan`, and
    /// patch its frontends (O(change)); the first pass takes them from the whole plan.
    pub fn reconcile_changes(&mut self, plan: &FamilyPlan, changes: &FamilyDelta) -> Result<ReconcileStats, Error> {
        self.pass(plan, Some(changes))
    }

    fn pass(&mut self, plan: &FamilyPlan, changes: Option<&FamilyDelta>) -> Result<ReconcileStats, Error> {
        let start = Instant::now();
        let family = plan.family;
        let memory = self.memory.entry(family).or_default();
        let (frontends, disappeared) = match (memory.frontends.take(), changes) {
            (Some(mut frontends), Some(changes)) => {
                let gone = frontends.apply(changes);
                frontends.set_node_ports(NodePortScope::of(&plan.node, &self.local_addresses));
                (frontends, gone)
            }
            (previous, _) => {
                let frontends = Frontends::from_plan(plan, &self.local_addresses);
                let gone = previous.iter().flat_map(Frontends::frontends).filter(|f| !frontends.contains(f)).copied();
                let gone = gone.collect();
                (frontends, gone)
            }
        };
        let frontends = memory.frontends.insert(frontends);
        memory.retired.extend(disappeared);
        memory.retired.retain(|frontend| !frontends.contains(frontend));
        frontends.clear_without_endpoints();
        for frontend in &memory.retired {
            frontends.insert_without_endpoints(*frontend);
        }
        let frontends = &*frontends;

        let mut flows = Vec::new();
        let mut complete = true;
        for protocol in MANAGED_PROTOCOLS {
            if !frontends.uses(protocol) {
                continue;
            }
            let dump = self.socket.dump(family, protocol)?;
            if dump.interrupted || dump.undecodable > 0 {
                debug!(?family, ?protocol, dump.interrupted, dump.undecodable, "conntrack dump incomplete");
                complete = false;
            }
            flows.extend(dump.flows);
        }

        let stale = stale_flows(frontends, &flows);
        for flow in &stale {
            debug!(%flow, "deleting stale conntrack entry");
        }
        let outcome = if stale.is_empty() { Default::default() } else { self.socket.delete(&stale)? };
        for (flow, error) in &outcome.failed {
            warn!(%flow, %error, "failed to delete a stale conntrack entry");
        }
        if complete && outcome.failed.is_empty() {
            memory.retired.clear();
        }
        let stats = ReconcileStats {
            family,
            examined: flows.len(),
            stale: stale.len(),
            deleted: outcome.deleted,
            already_gone: outcome.not_found,
            failed: outcome.failed.len(),
            duration: start.elapsed(),
        };
        if stats.deleted > 0 {
            info!(?family, deleted = stats.deleted, took = ?stats.duration, "deleted stale conntrack entries");
        } else {
            debug!(?family, examined = stats.examined, took = ?stats.duration, "conntrack entries reconciled");
        }
        Ok(stats)
    }
}

/// The daemon moves the reconciler to a blocking thread; keep it `Send`.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Reconciler>();
};

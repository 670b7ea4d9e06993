//! What every dataplane offers the sync loop and the packet suite: bring the kernel in line with
//! a plan. The plan decides; a dataplane only renders.

use crate::delta::PlanDelta;
use crate::model::Plan;

/// A dataplane's error, whatever its backend.
pub type DataplaneError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A dataplane backend (nftables, iptables, IPVS).
pub trait Dataplane: Send {
    /// Makes the kernel match `plan` exactly, whatever it held before (start, after a failure,
    /// every `syncPeriod`).
    fn full_sync(&mut self, plan: &Plan) -> Result<(), DataplaneError>;
    /// Applies `delta`, computed against the plan of the previous sync; `plan` is the result. A
    /// backend may do a full sync instead when it must (first sync, after a failure).
    fn partial_sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<(), DataplaneError>;
    /// Removes everything this dataplane put in the kernel.
    fn cleanup(&mut self) -> Result<(), DataplaneError>;
    /// The periodic check (every `syncPeriod`): makes sure the kernel still holds `plan`, the
    /// plan of the last sync, repairing what someone else changed. A backend that cannot check
    /// more cheaply rewrites everything.
    fn verify(&mut self, plan: &Plan) -> Result<Verified, DataplaneError> {
        self.full_sync(plan)?;
        Ok(Verified::Rewritten)
    }
    /// The families whose leftover cleanup failed since the last call, once per failure: a
    /// backend that removes leftovers apart from its syncs (nftables' stale chains) reports
    /// them here rather than failing a sync.
    fn take_cleanup_failures(&mut self) -> Vec<kproxy_state::IpFamily> {
        Vec::new()
    }
    /// What the syncs since the last call found changed by someone else in the kernel and
    /// repaired, one line each: a backend whose full syncs compare with what is live (iptables)
    /// reports here what they repaired. The periodic check reports its own in [`Verified`].
    fn take_drift_repairs(&mut self) -> Vec<String> {
        Vec::new()
    }
}

/// What a periodic check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// The kernel held the plan.
    Clean,
    /// Someone else changed kproxy's rules; each line says what. They were repaired.
    Repaired(Vec<String>),
    /// The backend rewrote everything (it cannot check more cheaply).
    Rewritten,
    /// The tables kept changing while they were read (another program committing in a tight
    /// loop, to tables of its own): nothing was compared. Not a failure; the caller checks
    /// again a little later.
    Busy,
}

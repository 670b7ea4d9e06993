//! The dataplanes the sync loop can drive.

use std::io::Write as _;

use kproxy_nftables::{ExecError, Executor, NftablesDataplane, Transaction};
use kproxy_plan::{Plan, PlanDelta};

use crate::proxier::Dataplane;

impl<E: Executor + Send> Dataplane for NftablesDataplane<E> {
    fn full_sync(&mut self, plan: &Plan) -> anyhow::Result<()> {
        NftablesDataplane::full_sync(self, plan)?;
        Ok(())
    }

    fn partial_sync(&mut self, plan: &Plan, delta: &PlanDelta) -> anyhow::Result<()> {
        NftablesDataplane::partial_sync(self, plan, delta)?;
        Ok(())
    }
}

/// `--dry-run`: prints each transaction as nft text instead of applying it.
#[derive(Debug, Default)]
pub struct PrintTransactions;

impl Executor for PrintTransactions {
    fn apply(&mut self, tx: &Transaction) -> Result<(), ExecError> {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "# --- transaction ({} operations) ---\n{}", tx.len(), tx.render());
        Ok(())
    }
}

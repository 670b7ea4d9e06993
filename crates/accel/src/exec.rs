//! How the fast path reaches the kernel: transactions of the typed nf_tables model, applied by
//! the netlink executor the nftables dataplane uses (no `nft` process), and the one value read
//! back, the packets the offload rule counted.

use kproxy_nft_model::{Executor, TableRef, Transaction};
use kproxy_nft_netlink::NetlinkExecutor;

use crate::error::AccelError;

/// Applies the fast path's transactions and reads its counter, in the network namespace of the
/// calling thread.
pub trait AccelKernel: Send {
    /// Applies `tx` as one atomic batch.
    fn apply(&mut self, tx: &Transaction) -> Result<(), AccelError>;
    /// The packets counted by the `counter` statements of `chain`'s rules; `None` when the
    /// chain has no counter.
    fn counted_packets(&mut self, table: &TableRef, chain: &str) -> Result<Option<u64>, AccelError>;
    /// Whether the kernel has flowtables ([`crate::support::probe`]).
    fn probe_flowtables(&mut self) -> Result<bool, AccelError> {
        crate::support::probe(self)
    }
}

impl AccelKernel for NetlinkExecutor {
    fn apply(&mut self, tx: &Transaction) -> Result<(), AccelError> {
        Executor::apply(self, tx).map_err(AccelError::from)
    }

    fn counted_packets(&mut self, table: &TableRef, chain: &str) -> Result<Option<u64>, AccelError> {
        kproxy_nft_netlink::counters::chain_packets(self, table, chain).map_err(AccelError::Netlink)
    }
}

/// Records transactions instead of applying them (unit tests, dry runs).
#[derive(Debug, Clone, Default)]
pub struct RecordingKernel {
    /// Every non-empty transaction applied, in order.
    pub applied: Vec<Transaction>,
    /// Fail the next `apply` (then reset).
    pub fail_next: bool,
    /// Fail every `apply` while set.
    pub failing: bool,
    /// Answer the flowtable probe with "not supported" (probes are not recorded).
    pub no_flowtables: bool,
    /// What `counted_packets` answers.
    pub packets: u64,
}

impl AccelKernel for RecordingKernel {
    fn apply(&mut self, tx: &Transaction) -> Result<(), AccelError> {
        if std::mem::take(&mut self.fail_next) || self.failing {
            return Err(AccelError::Apply(kproxy_nft_model::ExecError::Injected));
        }
        if !tx.is_empty() {
            self.applied.push(tx.clone());
        }
        Ok(())
    }

    fn counted_packets(&mut self, _table: &TableRef, _chain: &str) -> Result<Option<u64>, AccelError> {
        Ok(Some(self.packets))
    }

    fn probe_flowtables(&mut self) -> Result<bool, AccelError> {
        Ok(!self.no_flowtables)
    }
}

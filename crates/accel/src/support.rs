//! Whether the kernel can offload at all, asked once, and how long a failing fast path waits
//! before its batch is tried again.

use std::time::{Duration, Instant};

use kproxy_nft_model::{Chain, ExecError, Flowtable, Op, Rule, Stmt, TableFamily, TableRef, Transaction};

use crate::error::AccelError;
use crate::exec::AccelKernel;

/// The scratch table of the probe; it never outlives the probe's batch.
pub const PROBE_TABLE: &str = "kproxy-accel-probe";

/// One batch that creates, in a scratch table, a flowtable and a rule handing flows to it, then
/// deletes the table. The kernel accepts it only with nf_flow_table and nft_flow_offload, and
/// either way nothing is left behind (a batch is atomic, and on success its last operation
/// deletes what it created).
pub fn probe_transaction() -> Transaction {
    let t = TableRef { family: TableFamily::Inet, name: PROBE_TABLE.to_owned() };
    let mut tx = Transaction::new();
    tx.push(Op::AddTable { table: t.clone(), comment: None });
    tx.push(Op::AddFlowtable(
        t.clone(),
        Flowtable { name: "probe".to_owned(), priority: 0, devices: vec![], counter: true },
    ));
    tx.push(Op::AddChain(t.clone(), Chain::regular("probe")));
    tx.add_rules(&t, "probe", [Rule::from(Stmt::FlowAdd("probe".to_owned()))]);
    tx.push(Op::DeleteTable(t));
    tx
}

/// Applies [`probe_transaction`]: `Ok(false)` when the kernel refuses it, an error only when
/// the kernel could not be asked.
pub fn probe(kernel: &mut (impl AccelKernel + ?Sized)) -> Result<bool, AccelError> {
    match kernel.apply(&probe_transaction()) {
        Ok(()) => Ok(true),
        Err(AccelError::Apply(ExecError::Kernel { source, .. })) => {
            tracing::debug!(error = %source, "the kernel refused the flowtable probe");
            Ok(false)
        }
        Err(error) => Err(error),
    }
}

/// When a failed batch may be tried again: at once after the first failure (a transient error
/// is repaired by the next sync), then after 1 s, 2 s, 4 s … up to [`Backoff::MAX`], never at
/// every sync.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backoff {
    failures: u32,
    next_try: Option<Instant>,
}

impl Backoff {
    /// The longest wait between two attempts.
    pub const MAX: Duration = Duration::from_secs(300);

    /// Whether a batch may be tried at `now`.
    pub fn ready(&self, now: Instant) -> bool {
        self.next_try.is_none_or(|at| now >= at)
    }

    /// Records a failure at `now`; returns how long until the next attempt.
    pub fn failed(&mut self, now: Instant) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let wait = match self.failures {
            1 => Duration::ZERO,
            n => Duration::from_secs(1u64 << (n - 2).min(16)).min(Self::MAX),
        };
        self.next_try = Some(now + wait);
        wait
    }

    /// Records a success.
    pub fn succeeded(&mut self) {
        *self = Backoff::default();
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_retry_is_immediate_then_waits_double_up_to_the_cap() {
        let now = Instant::now();
        let mut b = Backoff::default();
        assert!(b.ready(now));
        let waits: Vec<u64> = (0..12).map(|_| b.failed(now).as_secs()).collect();
        assert_eq!(waits, vec![0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert!(!b.ready(now + Duration::from_secs(299)));
        assert!(b.ready(now + Duration::from_secs(300)));
        b.succeeded();
        assert!(b.ready(now) && b.failures() == 0);
    }

    #[test]
    fn the_probe_leaves_nothing_behind() {
        let tx = probe_transaction();
        let text = tx.render();
        assert!(
            text.contains("add flowtable inet kproxy-accel-probe probe") && text.contains("flow add @probe"),
            "{text}"
        );
        assert!(matches!(tx.ops().last(), Some(Op::DeleteTable(t)) if t.name == PROBE_TABLE), "{text}");
    }
}

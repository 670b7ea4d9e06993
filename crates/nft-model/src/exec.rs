//! Executors apply a transaction to the kernel: the netlink-native one lives in
//! `kproxy-nft-netlink` (what the daemon uses); [`NftCommand`] runs `nft -f -` for tests and
//! debugging only; [`Recording`] keeps transactions for tests.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use crate::listing::{Listings, TableListing};
use crate::set::{Element, SetDef};
use crate::table::TableRef;
use crate::transaction::Transaction;

/// Why a transaction was not applied. Transactions are atomic: on error nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The executor could not be started.
    #[error("running {program}: {source}")]
    Spawn {
        /// Program.
        program: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The kernel or `nft` rejected the transaction.
    #[error("{program} rejected the transaction: {stderr}")]
    Rejected {
        /// Program.
        program: String,
        /// What it said.
        stderr: String,
    },
    /// A test executor was told to fail.
    #[error("injected failure")]
    Injected,
    /// The kernel rejected an operation of the transaction (netlink executor); nothing changed.
    #[error("the kernel rejected operation {index} `{op}`: {source}")]
    Kernel {
        /// Index of the operation in the transaction.
        index: usize,
        /// The operation, as nft text.
        op: String,
        /// The kernel's errno.
        source: std::io::Error,
    },
    /// An operation uses nft syntax the executor cannot encode; nothing was sent.
    #[error("cannot encode operation {index} `{op}`: {reason}")]
    Unsupported {
        /// Index of the operation in the transaction.
        index: usize,
        /// The operation, as nft text.
        op: String,
        /// What is not supported.
        reason: String,
    },
    /// Talking to the kernel failed; whether the transaction was applied is unknown.
    #[error("netlink: {0}")]
    Netlink(#[source] std::io::Error),
}

/// A transaction made ready to apply by [`Executor::prepare`], on any thread.
pub struct Prepared {
    /// The transaction.
    pub tx: Transaction,
    /// What the executor made of it ahead of time (the netlink executor: its encoded batch).
    pub ready: Option<Box<dyn std::any::Any + Send>>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").field("ops", &self.tx.len()).field("ready", &self.ready.is_some()).finish()
    }
}

/// Applies transactions atomically, and tells what the kernel holds where it can.
pub trait Executor {
    /// Applies `tx` as one atomic batch.
    fn apply(&mut self, tx: &Transaction) -> Result<(), ExecError>;

    /// Does ahead of time, without the executor and on any thread, what applying `tx` needs
    /// before the kernel is asked: a cold start prepares the next transaction while the kernel
    /// applies the current one. The default prepares nothing.
    fn prepare(tx: Transaction) -> Prepared
    where
        Self: Sized,
    {
        Prepared { tx, ready: None }
    }

    /// Applies a transaction [`Executor::prepare`] made ready, as [`Executor::apply`].
    fn apply_prepared(&mut self, prepared: &mut Prepared) -> Result<(), ExecError> {
        self.apply(&prepared.tx)
    }

    /// The nf_tables generation of the network namespace: every commit, by anyone, bumps it, so
    /// an unchanged generation proves nobody touched the tables. `None`: the executor cannot tell.
    fn generation(&mut self) -> Result<Option<u32>, ExecError> {
        Ok(None)
    }

    /// What `table` holds now (an absent table lists as empty). `None`: the executor cannot list.
    fn list(&mut self, _table: &TableRef) -> Result<Option<TableListing>, ExecError> {
        Ok(None)
    }

    /// Like [`Executor::list`], but without counting the elements of sets (their counts are
    /// `None`): a restart needs only which chains and sets are there, and reads the elements it
    /// keeps on its own ([`Executor::element_identities`]). Dumping a large hash set costs the
    /// kernel time quadratic in its size (each dump part walks the set from its start).
    fn list_without_elements(&mut self, table: &TableRef) -> Result<Option<TableListing>, ExecError> {
        self.list(table)
    }

    /// The elements set `set` of `table` holds now, as identities comparable with
    /// [`Executor::element_identity`]. `None`: the executor cannot tell (or the set holds ranges).
    fn element_identities(&mut self, _table: &TableRef, _set: &str) -> Result<Option<BTreeSet<Vec<u8>>>, ExecError> {
        Ok(None)
    }

    /// The identity of `element` as [`Executor::element_identities`] reports it.
    fn element_identity(&self, _element: &Element) -> Option<Vec<u8>> {
        None
    }

    /// The elements set `set` (as declared) of `table` holds now, read back into the model: key
    /// and value data. `None`: the executor cannot tell, or the set holds an element it does not
    /// read back (a range, a verdict). A missing set reads as `Some` of nothing.
    fn elements(&mut self, _table: &TableRef, _set: &SetDef) -> Result<Option<Vec<Element>>, ExecError> {
        Ok(None)
    }
}

/// Runs `nft -f -` (in the network namespace of the calling thread).
#[derive(Debug, Clone)]
pub struct NftCommand {
    program: String,
    check_only: bool,
}

impl Default for NftCommand {
    fn default() -> Self {
        Self { program: "nft".to_owned(), check_only: false }
    }
}

impl NftCommand {
    /// `nft` from `PATH`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only checks the transaction (`nft -c`), applying nothing.
    pub fn check_only(mut self) -> Self {
        self.check_only = true;
        self
    }
}

impl Executor for NftCommand {
    fn apply(&mut self, tx: &Transaction) -> Result<(), ExecError> {
        if tx.is_empty() {
            return Ok(());
        }
        let mut cmd = Command::new(&self.program);
        if self.check_only {
            cmd.arg("-c");
        }
        let spawn_err = |source| ExecError::Spawn { program: self.program.clone(), source };
        let mut child = cmd
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_err)?;
        let text = tx.render();
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(text.as_bytes()).map_err(spawn_err)?;
        }
        let out = child.wait_with_output().map_err(spawn_err)?;
        if out.status.success() {
            Ok(())
        } else {
            Err(ExecError::Rejected {
                program: self.program.clone(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            })
        }
    }
}

/// Records transactions instead of applying them, and keeps a summary of what a kernel would
/// hold (tests change it to stand for someone else's changes).
#[derive(Debug, Clone, Default)]
pub struct Recording {
    /// Every transaction applied, in order.
    pub applied: Vec<Transaction>,
    /// Fail the next `apply` (then reset).
    pub fail_next: bool,
    /// Apply this many more transactions, then fail the next `apply` (then reset).
    pub fail_after: Option<usize>,
    /// What each table holds after the applied transactions.
    pub tables: Listings,
    /// Commits so far (the kernel's generation); tests bump it when they change `tables`.
    pub generation: u32,
    /// How many times a table was listed.
    pub lists: usize,
    /// The next this many listings fail as a netlink dump does when another program keeps
    /// committing while it runs (`Interrupted`).
    pub busy_lists: usize,
}

impl Recording {
    /// The last applied transaction.
    pub fn last(&self) -> Option<&Transaction> {
        self.applied.last()
    }
}

impl Executor for Recording {
    fn apply(&mut self, tx: &Transaction) -> Result<(), ExecError> {
        if let Some(left) = self.fail_after {
            self.fail_after = left.checked_sub(1);
            self.fail_next |= left == 0;
        }
        if std::mem::take(&mut self.fail_next) {
            return Err(ExecError::Injected);
        }
        if !tx.is_empty() {
            self.tables.apply(tx);
            self.generation = self.generation.wrapping_add(1);
        }
        self.applied.push(tx.clone());
        Ok(())
    }

    fn generation(&mut self) -> Result<Option<u32>, ExecError> {
        Ok(Some(self.generation))
    }

    fn list(&mut self, table: &TableRef) -> Result<Option<TableListing>, ExecError> {
        self.lists += 1;
        if self.busy_lists > 0 {
            self.busy_lists -= 1;
            let busy = std::io::Error::new(std::io::ErrorKind::Interrupted, "the dump met a concurrent change");
            return Err(ExecError::Netlink(busy));
        }
        Ok(Some(self.tables.get(table)))
    }
}

impl<E: Executor + ?Sized> Executor for &mut E {
    fn apply(&mut self, tx: &Transaction) -> Result<(), ExecError> {
        (**self).apply(tx)
    }
    fn apply_prepared(&mut self, prepared: &mut Prepared) -> Result<(), ExecError> {
        (**self).apply_prepared(prepared)
    }
    fn generation(&mut self) -> Result<Option<u32>, ExecError> {
        (**self).generation()
    }
    fn list(&mut self, table: &TableRef) -> Result<Option<TableListing>, ExecError> {
        (**self).list(table)
    }
    fn list_without_elements(&mut self, table: &TableRef) -> Result<Option<TableListing>, ExecError> {
        (**self).list_without_elements(table)
    }
    fn element_identities(&mut self, table: &TableRef, set: &str) -> Result<Option<BTreeSet<Vec<u8>>>, ExecError> {
        (**self).element_identities(table, set)
    }
    fn element_identity(&self, element: &Element) -> Option<Vec<u8>> {
        (**self).element_identity(element)
    }
    fn elements(&mut self, table: &TableRef, set: &SetDef) -> Result<Option<Vec<Element>>, ExecError> {
        (**self).elements(table, set)
    }
}

impl<E: Executor + ?Sized> Executor for Box<E> {
    fn apply(&mut self, tx: &Transaction) -> Result<(), ExecError> {
        (**self).apply(tx)
    }
    fn apply_prepared(&mut self, prepared: &mut Prepared) -> Result<(), ExecError> {
        (**self).apply_prepared(prepared)
    }
    fn generation(&mut self) -> Result<Option<u32>, ExecError> {
        (**self).generation()
    }
    fn list(&mut self, table: &TableRef) -> Result<Option<TableListing>, ExecError> {
        (**self).list(table)
    }
    fn list_without_elements(&mut self, table: &TableRef) -> Result<Option<TableListing>, ExecError> {
        (**self).list_without_elements(table)
    }
    fn element_identities(&mut self, table: &TableRef, set: &str) -> Result<Option<BTreeSet<Vec<u8>>>, ExecError> {
        (**self).element_identities(table, set)
    }
    fn element_identity(&self, element: &Element) -> Option<Vec<u8>> {
        (**self).element_identity(element)
    }
    fn elements(&mut self, table: &TableRef, set: &SetDef) -> Result<Option<Vec<Element>>, ExecError> {
        (**self).elements(table, set)
    }
}

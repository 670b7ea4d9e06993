//! [`NetlinkExecutor`]: applies a [`Transaction`] as one nfnetlink batch.

use std::io;

use kproxy_nft_model::{ExecError, Executor, Prepared, TableListing, TableRef, Transaction};

use crate::batch::{Batch, op_text};
use crate::socket::NfSocket;

/// Applies transactions over an `NETLINK_NETFILTER` socket, no `nft` process involved.
///
/// The socket is opened on first use, in the network namespace of the thread that applies.
/// A transaction is one batch, hence atomic: on any error the kernel aborts all of it, and the
/// error names the first operation it refused.
#[derive(Debug, Default)]
pub struct NetlinkExecutor {
    sock: Option<NfSocket>,
    seq: u32,
}

impl NetlinkExecutor {
    /// An executor; nothing is opened yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The socket, opened on first use.
    pub fn socket(&mut self) -> io::Result<&mut NfSocket> {
        match &mut self.sock {
            Some(s) => Ok(s),
            slot => Ok(slot.insert(NfSocket::open()?)),
        }
    }

    /// Runs `op` on the socket. After an error the socket is dropped and the next use opens a
    /// new one: an overrun socket (`ENOBUFS`) has lost messages (the kernel drops replies to it
    /// silently until it is read empty, so a request on it could wait forever), and one that
    /// failed mid-reply may still hold the rest of that reply. Kept only after the errors that
    /// come with the kernel's whole answer read: `ENOENT` (no such table, chain or set) and a
    /// dump read to its end that met a commit (`Interrupted`).
    pub fn on_socket<T>(&mut self, op: impl FnOnce(&mut NfSocket) -> io::Result<T>) -> io::Result<T> {
        let result = op(self.socket()?);
        if let Err(e) = &result
            && !(e.kind() == io::ErrorKind::Interrupted || e.raw_os_error() == Some(nix::libc::ENOENT))
        {
            self.sock = None;
        }
        result
    }
}

/// `tx` encoded as one batch numbered from `first_seq`.
fn encode(tx: &Transaction, first_seq: u32) -> Result<Batch, ExecError> {
    Batch::encode(tx, first_seq).map_err(|e| ExecError::Unsupported {
        index: e.index,
        op: e.op,
        reason: e.source.to_string(),
    })
}

impl NetlinkExecutor {
    /// Sends `batch` (the encoding of `tx`), numbered from the socket's next sequence number.
    fn send(&mut self, tx: &Transaction, mut batch: Batch) -> Result<(), ExecError> {
        if batch.first_seq() != self.seq.wrapping_add(1) {
            batch.resequence(self.seq.wrapping_add(1));
        }
        // An operation may take several messages (interval elements, anonymous sets).
        self.seq = batch.end_seq();
        let replies = self.on_socket(|sock| sock.send_batch(&batch)).map_err(ExecError::Netlink)?;
        let Some(first_err) = replies.first() else {
            tracing::debug!(ops = tx.len(), bytes = batch.bytes().len(), "applied nftables batch over netlink");
            return Ok(());
        };
        let source = io::Error::from_raw_os_error(-first_err.error);
        Err(match batch.ops_for_seq(first_err.seq) {
            Some(ops) if ops.len() == 1 => {
                ExecError::Kernel { index: ops.start, op: op_text(&tx.ops()[ops.start]), source }
            }
            Some(ops) => {
                let (first, last) = (op_text(&tx.ops()[ops.start]), op_text(&tx.ops()[ops.end - 1]));
                let op = format!("one of the {} element operations of one message, from {first} to {last}", ops.len());
                ExecError::Kernel { index: ops.start, op, source }
            }
            None => ExecError::Netlink(io::Error::other(format!("the kernel refused the batch: {source}"))),
        })
    }
}

impl Executor for NetlinkExecutor {
    fn apply(&mut self, tx: &Transaction) -> Result<(), ExecError> {
        if tx.is_empty() {
            return Ok(());
        }
        let batch = encode(tx, self.seq.wrapping_add(1))?;
        self.send(tx, batch)
    }

    /// Encodes the batch (numbered from 0; [`Batch::resequence`] numbers it when it is sent).
    fn prepare(tx: Transaction) -> Prepared {
        let ready = (!tx.is_empty()).then(|| encode(&tx, 0)).and_then(Result::ok);
        Prepared { tx, ready: ready.map(|batch| Box::new(batch) as Box<dyn std::any::Any + Send>) }
    }

    fn apply_prepared(&mut self, prepared: &mut Prepared) -> Result<(), ExecError> {
        match prepared.ready.take().map(|ready| ready.downcast::<Batch>()) {
            Some(Ok(batch)) => self.send(&prepared.tx, *batch),
            // Not encoded ahead (empty, or an encoding error that applying reports).
            _ => self.apply(&prepared.tx),
        }
    }

    fn generation(&mut self) -> Result<Option<u32>, ExecError> {
        self.on_socket(NfSocket::generation).map(Some).map_err(ExecError::Netlink)
    }

    fn list(&mut self, table: &TableRef) -> Result<Option<TableListing>, ExecError> {
        crate::listing::list_table(self, table, true).map(Some).map_err(ExecError::Netlink)
    }

    fn list_without_elements(&mut self, table: &TableRef) -> Result<Option<TableListing>, ExecError> {
        crate::listing::list_table(self, table, false).map(Some).map_err(ExecError::Netlink)
    }

    fn element_identities(
        &mut self,
        table: &TableRef,
        set: &str,
    ) -> Result<Option<std::collections::BTreeSet<Vec<u8>>>, ExecError> {
        crate::identity::set_identities(self, table, set).map_err(ExecError::Netlink)
    }

    fn element_identity(&self, element: &kproxy_nft_model::Element) -> Option<Vec<u8>> {
        crate::identity::element_identity(element)
    }

    fn elements(
        &mut self,
        table: &TableRef,
        set: &kproxy_nft_model::SetDef,
    ) -> Result<Option<Vec<kproxy_nft_model::Element>>, ExecError> {
        crate::raise::set_elements(self, table, set).map_err(ExecError::Netlink)
    }
}

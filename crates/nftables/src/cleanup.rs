//! `kproxy --cleanup`: remove kproxy's tables and nothing else.

use kproxy_nft_model::{ExecError, Executor, Op, TableFamily, TableRef, Transaction};

/// The transaction that removes table `name` in both families, whether or not they exist
/// (`add` then `delete` makes the delete idempotent on every nft version).
pub fn cleanup_transaction(name: &str) -> Transaction {
    let mut tx = Transaction::new();
    for family in [TableFamily::Ip, TableFamily::Ip6] {
        let table = TableRef { family, name: name.to_owned() };
        tx.push(Op::AddTable { table: table.clone(), comment: None });
        tx.push(Op::DeleteTable(table));
    }
    tx
}

/// Removes the `ip kproxy` and `ip6 kproxy` tables.
pub fn cleanup(exec: &mut dyn Executor) -> Result<(), ExecError> {
    exec.apply(&cleanup_transaction(crate::ruleset::TABLE_NAME))
}

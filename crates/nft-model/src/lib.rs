//! The one typed model of what kproxy puts in nf_tables.
//!
//! Every table kproxy owns — the nftables dataplane's `ip`/`ip6 kproxy`, the acceleration table,
//! the IPVS auxiliary table — is described with these types: [`table`] (tables, chains, hooks),
//! [`set`] (sets and maps with typed keys and data, and their elements), [`expr`] (rules as
//! sequences of typed statements) and [`transaction`] (the operations one sync applies
//! atomically).
//!
//! The model is what executors encode: `kproxy-nft-netlink` turns it into nfnetlink messages
//! directly, with no text in between. Text is only a rendering for people and tools
//! (`--dry-run`, golden snapshots, error messages, and the `nft -f` executor in [`exec`] kept
//! for tests and debugging): every type implements `Display` as the nft syntax that loads the
//! same thing.

pub mod exec;
pub mod expr;
pub mod listing;
#[cfg(feature = "parse")]
pub mod parse;
pub mod set;
pub mod table;
pub mod transaction;

pub use exec::{ExecError, Executor, NftCommand, Prepared, Recording};
pub use expr::{CmpOp, CtState, CtStatus, Field, NatKind, Reject, Rule, Stmt, Value, Verdict};
pub use listing::{Listings, TableListing};
pub use set::{DataType, Element, ElementData, Key, MapData, SetDef, SetFlag, SetType};
pub use table::{Chain, ChainType, Flowtable, Hook, HookPoint, TableFamily, TableRef};
pub use transaction::{Op, OpCounts, Transaction};

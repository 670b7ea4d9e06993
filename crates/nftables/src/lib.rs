//! The nftables dataplane: renders the plan into nf_tables transactions.
//!
//! - [`transaction`]: typed operations, applied as one atomic batch per sync, renderable as
//!   `nft -f` text (tests, `--dry-run`, debugging).
//! - [`ruleset`]: what the `ip kproxy` / `ip6 kproxy` tables contain, with a cost linear in
//!   services and endpoints.
//! - [`NftablesDataplane`]: the in-memory applied state and the full/partial sync logic.
//! - [`exec`]: how a transaction reaches the kernel (`nft -f -` today).
//! - [`cleanup()`]: `kproxy --cleanup`.

pub mod cleanup;
pub mod exec;
pub mod naming;
pub mod ruleset;
mod sync;
pub mod transaction;

pub use cleanup::cleanup;
pub use exec::{ExecError, Executor, NftCommand, Recording};
pub use sync::{Config, DEFAULT_COLD_START_CHUNK_OPS, NftablesDataplane, SyncError, SyncReport};
pub use transaction::{OpCounts, Transaction};

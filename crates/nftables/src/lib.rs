//! The nftables dataplane: renders the plan into nf_tables transactions.
//!
//! - What it puts in the kernel is described with the typed model of `kproxy-nft-model`
//!   (rules as typed statements, typed set keys and elements), which the netlink executor of
//!   `kproxy-nft-netlink` encodes directly; nft text is only a rendering for people and tests.
//! - [`ruleset`]: what the `ip kproxy` / `ip6 kproxy` tables contain, with a cost linear in
//!   services and endpoints.
//! - [`NftablesDataplane`]: the in-memory applied state and the full/partial sync logic.
//! - [`cleanup()`]: `kproxy --cleanup`.
//! - [`counters`]: per-Service counters (opt-in), read from the elements of the dispatch maps.

pub mod cleanup;
pub mod counters;
pub mod digest;
pub mod kernel;
pub mod naming;
pub mod ruleset;
mod sync;

pub use cleanup::cleanup;
pub use kernel::Verification;
pub use kproxy_nft_model::TableRef;
pub use kproxy_nft_model::{ExecError, Executor, NftCommand, OpCounts, Recording, Transaction};
pub use sync::{Config, DEFAULT_COLD_START_CHUNK_OPS, NftablesDataplane, SyncError, SyncReport, tables};

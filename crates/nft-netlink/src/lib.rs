//! nf_tables over raw netlink: kproxy's typed nftables model
//! ([`kproxy_nft_model::Transaction`]) encoded as nfnetlink batches and sent on a
//! `NETLINK_NETFILTER` socket, with no `nft` process and no ruleset dump on the sync path.
//!
//! Why: `nft -f` first lists the kernel's whole ruleset into its cache, which at 10k+ services
//! costs far more than the change itself (upstream #139513). Here the applied state lives in
//! the dataplane's memory and a sync costs the encoding of its operations plus the kernel's work.
//!
//! Building blocks, and why: the socket is `netlink-sys` (safe, already used by kproxy's
//! conntrack code); the nf_tables messages are encoded here, because no maintained Rust crate
//! covers nf_tables rule expressions, and libnftnl through FFI would need `unsafe` (denied in
//! this workspace) plus a C build dependency, for a subset that fits in a few hundred lines.
//!
//! - [`lower`]: the typed model → the kernel's [`expr::Expr`]s, key types and data bytes; no
//!   text is formatted or parsed on the way.
//! - [`expr`], [`wire`]: expressions and netlink attributes to bytes, in nft's attribute order,
//!   so `tests/encoding.rs` compares them byte for byte with what `nft --debug=mnl` sends.
//! - [`batch`]: a transaction → one `BATCH_BEGIN … END` batch, sequence numbers mapped back to
//!   operations so a kernel error names the operation it refused.
//! - [`NetlinkExecutor`]: the [`kproxy_nft_model::Executor`] on top.
//! - [`listing`]: one netlink dump of a table (chains, rule and element counts), for drift
//!   detection on full resyncs.
//! - [`raise`]: elements read back into the model (a restart's endpoint slots).
//! - [`monitor`]: nf_tables' notifications, to notice at once a commit that touched kproxy's
//!   tables.
//! - [`acct`]: nfnetlink_acct counters (iptables' `-m nfacct`), created and read on the same
//!   socket.
//! - [`ipset`]: the names of the ip sets and their removal (kube-proxy's IPVS mode leaves them).

pub mod acct;
pub mod batch;
pub mod counters;
pub mod executor;
pub mod expr;
pub mod identity;
pub mod ipset;
pub mod listing;
pub mod lower;
pub mod monitor;
pub mod raise;
pub mod socket;
pub mod sys;
pub mod wire;

pub use executor::NetlinkExecutor;
pub use kproxy_nft_model::TableListing;
pub use listing::list_table;

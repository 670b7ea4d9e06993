//! The iptables dataplane (`--proxy-mode=iptables`): renders the same plan as the nftables
//! dataplane into upstream kube-proxy's iptables chains, so tools and CNIs that look for
//! `KUBE-SERVICES`, `KUBE-SVC-*`, `KUBE-MARK-MASQ`, ... keep working.
//!
//! - [`naming`]: upstream's chain names (`KUBE-SVC-<hash16>`, ...).
//! - [`rules`]: the plan rendered into `iptables-restore` lines, per table.
//! - [`layout`]: the order and sections a restore is written in, so `iptables-restore` stays linear.
//! - [`IptablesDataplane`]: the applied state in memory, full and partial restores.
//! - [`live`]: what `iptables-save` shows, compared with what kproxy would write (full syncs
//!   over live rules restore only the chains that differ).
//! - [`restore`]: running `iptables-restore --noflush -w` of one [`Backend`]; a recorder for tests.
//! - [`backend`]: detecting the host's backend like upstream.
//! - [`canary`]: noticing that someone flushed kproxy's rules.
//! - [`cleanup()`]: `kproxy --cleanup`.
//! - [`nfacct`]: the nfacct counters of INVALID drops and localhost NodePort connections.

pub mod backend;
pub mod canary;
pub mod cleanup;
mod fake;
pub mod layout;
pub mod live;
pub mod naming;
pub mod nfacct;
pub mod restore;
mod rule_counts;
pub mod rules;
mod sync;

pub use cleanup::cleanup;
pub use nfacct::{Nfacct, NfacctCounters, NfacctCounts};
pub use restore::{Backend, ExecError, Executor, IptablesRestore, KernelTables, Output, Recording};
pub use rule_counts::{RuleCounter, TableRules};
pub use sync::{Config, IptablesDataplane, SyncError, SyncReport};

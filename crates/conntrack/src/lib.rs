//! Conntrack for kproxy: what the connection tracker needs from a Service proxy.
//!
//! - [`ConntrackTuning`] sets the table size, hash size and timeouts once at startup, from the
//!   `conntrack` section of the configuration, like kube-proxy.
//! - [`Reconciler`] runs after every successful sync and deletes the UDP and SCTP conntrack
//!   entries that would keep steering packets to endpoints that are gone (or past rules that now
//!   exist). It compares the kernel's table with the plan each time rather than reacting to
//!   events, so it also repairs what an earlier failure or a restart left behind; it covers
//!   services that scaled to zero and services that were deleted, the two cases upstream
//!   kube-proxy missed (kubernetes#139628, PR #141371).
//!
//! The decision ([`stale_flows`], [`Frontends`]) is pure; the kernel I/O ([`netlink`]) is a small
//! ctnetlink client that works in the network namespace of the calling thread.

mod cleanup;
mod error;
mod flow;
pub mod netlink;
mod reconciler;
mod tuning;

pub use cleanup::{Frontend, Frontends, MANAGED_PROTOCOLS, NodePortScope, stale_entries, stale_flows};
pub use error::Error;
pub use flow::{Flow, Tuple};
pub use reconciler::{ReconcileStats, Reconciler};
pub use tuning::{ConntrackTuning, SettingOutcome, SettingResult, TuningReport};

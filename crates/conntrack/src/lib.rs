//! Conntrack for kproxy.

mod cleanup;
mod error;
mod flow;
pub mod netlink;

pub use cleanup::{Frontend, Frontends, MANAGED_PROTOCOLS, NodePortScope, stale_entries, stale_flows};
pub use error::Error;
pub use flow::{Flow, Tuple};

//! The packet suite: table-driven cases that send real packets through a dataplane and check
//! which backends answer and which source address they see.
//!
//! Every dataplane (nftables now, iptables and IPVS later) runs the very same [`all_cases`]
//! through [`run_case`], so the backends cannot drift apart. A case is data: the pods it needs,
//! the cluster objects (built from the testbed's addresses), proxy policy tweaks, and steps —
//! probes with their expectations, and in-place updates for the cases about change.
//!
//! Every probe also checks what `kproxy explain` predicts for it against what the packets did
//! (see `prediction`), so explain can not drift from the dataplanes either.
//!
//! The proxy's node is the testbed's `node`, named `node-a` in the cluster (`node2` is
//! `node-b`); both carry zone labels `zone-a` / `zone-b`.

mod cases;
mod cluster;
pub mod kep6246;
mod prediction;
mod runner;
mod tests_macro;

pub use cases::all_cases;
pub use cluster::{Env, NODE_A, NODE_B, endpoint, node_a_with_ips, node_objects, service, slice};
pub use kproxy_plan::Dataplane;
pub use runner::{Case, Check, Client, Dest, Expect, PodSpec, Setup, Source, Step, run_case};
pub use tests_macro::{run_named, run_named_in_mode};

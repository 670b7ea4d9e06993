//! Services acceleration (KEP-4963): established connections of opted-in Services bypass the
//! slow path through a netfilter flowtable.
//!
//! The fast path is its own `inet kproxy-accel` table (operations of the typed model of
//! `kproxy-nft-model`, applied over netlink like the nftables dataplane's table), independent of the dataplane, so it
//! works the same under the nftables, iptables and IPVS dataplanes: sets of opted-in frontends
//! (`protocol . VIP . port`, `protocol . node port`) kept in sync from the plan in O(change);
//! classification in prerouting *before* DNAT (priority dstnat - 10), recorded in a conntrack
//! mark bit ([`CtMarkBits`]) so it is still known in forward after DNAT; `flow add` in forward
//! once the connection is established and has exchanged more than
//! [`AccelConfig::packet_threshold`] packets; the flowtable on every up, non-loopback link,
//! with the `counter` flag so conntrack's counters keep moving for offloaded flows.
//!
//! Only forwarded traffic can be offloaded: connections that the node itself originates
//! (host → ClusterIP) or terminates (a NodePort served by a host-network pod) never reach the
//! forward hook and stay on the slow path. Offloaded packets skip every later netfilter hook
//! (forward filter rules, postrouting), which is why this is opt-in per Service.
//!
//! - [`Accelerator`]: the controller — [`Accelerator::sync`] after each dataplane sync,
//!   [`Accelerator::refresh_devices`], [`Accelerator::cleanup`], the metric and the view.
//! - [`LinkWatcher`]: the link-event task.
//! - [`cleanup()`]: `--cleanup` without state.

mod accelerator;
mod config;
mod elements;
mod error;
mod exec;
#[cfg(feature = "harness")]
pub mod harness;
mod links;
mod ruleset;
mod support;
mod view;
mod watcher;

pub use accelerator::{Accelerator, SyncReport, cleanup};
pub use config::{AccelConfig, CtMarkBits, FLOWTABLE, TABLE};
pub use elements::{Element, ElementChanges, ElementIndex, PortKey, elements_of};
pub use error::AccelError;
pub use exec::{AccelKernel, RecordingKernel};
/// The executor the daemon applies the fast path with.
pub use kproxy_nft_netlink::NetlinkExecutor;
pub use links::{LinkEvents, eligible_links};
pub use ruleset::{
    CHAIN_CLASSIFY, CHAIN_OFFLOAD, SET_NODEPORTS, SET_VIPS_V4, SET_VIPS_V6, create_table, device_updates,
    element_updates, table,
};
pub use support::{Backoff, PROBE_TABLE, probe, probe_transaction};
pub use view::{OffloadedConnection, ServiceAcceleration, offloaded_connections, parse_offloaded};
pub use watcher::{LinkWatcher, WatchOptions};

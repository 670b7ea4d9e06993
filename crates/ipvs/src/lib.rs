//! The IPVS dataplane (`--proxy-mode=ipvs`): renders the same plan as the nftables dataplane
//! into IPVS virtual services, the `kube-ipvs0` dummy interface and an auxiliary nftables table.
//!
//! Upstream deprecated its IPVS mode because the IPVS API is "a bad match for the Kubernetes
//! Services API" (one real-server set per virtual service, no reject, no source filtering) and
//! its edge cases were never finished. Here every class of traffic gets its own virtual service
//! (address services for NodePorts on each node address, as upstream's; firewall-mark services
//! for the `externalTrafficPolicy: Local` short-circuit, see [`render`]), and what IPVS can not
//! do lives in the auxiliary table ([`aux_table`]):
//! masquerading, no-endpoint verdicts, source ranges, and the guard that keeps host services off
//! the VIPs.
//!
//! - [`IpvsDataplane`]: `new(host, config)`, `sync(plan, delta)`, `cleanup()`.
//! - [`KernelHost`] talks netlink: [`genl`] for IPVS, [`rtnl`] for the interface, nf_tables
//!   (`kproxy-nft-netlink`) for the auxiliary table; [`proc_table`] reads every real server in
//!   one go for the periodic check;
//!   [`FakeHost`] is an in-memory kernel for tests and dry runs.
//! - [`cleanup()`]: `kproxy --cleanup` without a dataplane.

pub mod aux_table;
mod config;
mod dataplane;
mod error;
mod fake;
mod fwmark;
pub mod genl;
mod host;
pub mod netlink;
pub mod proc_table;
pub mod render;
pub mod rtnl;

pub use config::{Config, DUMMY_INTERFACE, Scheduler, UnknownScheduler};
pub use dataplane::{
    IpvsDataplane, SyncReport, cleanup, cleanup_kproxy_only, ensure_node_sysctls, is_proxy_service, node_sysctls,
};
pub use error::Error;
pub use fake::{FakeHost, FakeLink, FakeService};
pub use genl::{DestKey, DestSpec, DestState, IpvsOp, ServiceKey, ServiceSpec};
pub use host::{ENOENT, ESRCH};
pub use host::{Host, KernelHost};

//! The plan: everything a dataplane needs to program one node, computed from the cluster state.
//!
//! This crate is the single owner of Kubernetes Service semantics: traffic policies, topology
//! and trafficDistribution, terminating-endpoint fallback, masquerade decisions, no-masquerade
//! CIDRs, reject/drop when there are no endpoints. It is pure: no I/O, no clock. Every dataplane
//! (nftables, iptables, IPVS) renders the same [`Plan`] and never re-derives policy.
//!
//! [`Planner::build`] computes a plan from scratch; [`Planner::update`] recomputes only the
//! services the state marked dirty and returns the [`PlanDelta`] a backend applies in O(change).

mod categorize;
mod dataplane;
mod delta;
pub mod explain;
mod model;
mod planner;
mod policy;

pub use categorize::{Categorized, categorize_endpoints};
pub use dataplane::{Dataplane, DataplaneError, Verified};
pub use delta::{FamilyDelta, PlanDelta, ServicePortChange};
pub use model::{
    Endpoint, ExternalPolicy, ExternalTraffic, FamilyPlan, InternalTraffic, MasqueradeWhen, NoEndpointsVerdict,
    NodePlan, Plan, ServicePortName, ServicePortPlan,
};
pub use planner::Planner;
pub use policy::{
    DetectLocal, LocalTraffic, NoMasqueradeSource, NodeContext, NodePortAddress, NodePortAddresses, ProxyPolicy,
    SnatPolicy, SnatSource,
};

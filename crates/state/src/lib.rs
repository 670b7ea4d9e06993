//! The cluster state kproxy proxies for.
//!
//! Sources (the Kubernetes API watch, or a directory of manifests) emit [`Change`]s carrying
//! k8s-openapi objects. [`ClusterState::apply`] validates each object once, at this boundary,
//! into the small normalized types of this crate ([`ServiceInfo`], [`SliceInfo`], [`NodeInfo`]),
//! which is all the plan ever sees. A malformed object is rejected with an [`ObjectError`] and the
//! last good version of it (if any) stays in place, so bad input never takes down what works.

mod change;
mod endpoints;
mod error;
mod labels;
pub mod names;
mod node;
mod service;
mod store;

pub use change::{Change, Kind, Object, ObjectKey, ServiceObject};
pub use endpoints::{EndpointInfo, SliceInfo, SlicePort, TopologyHints};
pub use error::ObjectError;
pub use labels::{
    HEADLESS_LABEL, LAST_CHANGE_TRIGGER_TIME_ANNOTATION, SERVICE_NAME_LABEL, SERVICE_PROXY_NAME_LABEL,
    TRAFFIC_HINT_ANNOTATION,
};
pub use node::NodeInfo;
pub use service::{IpFamily, Protocol, ServiceInfo, ServicePortSpec, TrafficHint};
pub use store::{ApplyOutcome, ClusterState, Dirty};

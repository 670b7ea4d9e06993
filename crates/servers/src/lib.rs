//! kproxy's HTTP side, kept apart from the packet path so a slow scraper or a stuck probe can never
//! delay rule programming:
//!
//! - [`ProxyHealth`]: the proxy's health by kube-proxy's rule (a queued change older than
//!   2 × syncPeriod makes it unhealthy), plus Node eligibility for load-balancer draining;
//! - [`serve_healthz`]: `/healthz` and `/livez` with kube-proxy's JSON bodies;
//! - [`Metrics`] and [`serve_metrics`]: kube-proxy's metric names, types, labels and buckets,
//!   `/metrics`, `/healthz`, `/proxyMode`, `/configz`;
//! - [`Explainer`]: `/debug/explain` on the metrics listener, answered by the daemon;
//! - [`ServiceHealthServer`]: the health-check node ports of `externalTrafficPolicy: Local` Services.
//!
//! Every server is a [`RunningServer`] in the background: binding errors come back at once, and
//! dropping or shutting it down closes its socket.

mod clock;
mod error;
pub mod explain;
mod health;
mod healthz;
mod metrics;
mod metrics_server;
mod packet_metrics;
mod process_metrics;
mod server;
mod service_health;
mod source_metrics;
mod timefmt;

pub use clock::{Clock, FakeClock, SystemClock};
pub use error::ServeError;
pub use explain::{EXPLAIN_RATE, ExplainAccess, ExplainQuery, ExplainResult, ExplainUnavailable, Explainer};
pub use health::{FamilyHealth, HealthStatus, Probe, ProbeResponse, ProxyHealth};
pub use healthz::{healthz_router, serve_healthz};
pub use metrics::{
    DataplaneMode, Exposition, Metrics, ServiceConnections, TrafficPolicyKind, network_programming_buckets,
    sync_duration_buckets,
};
pub use metrics_server::{CONFIGZ_GROUP, MetricsServerInfo, metrics_router, serve_metrics};
pub use packet_metrics::{PacketCounters, PacketCounts};
pub use process_metrics::{ProcessCollector, ProcessSample};
pub use server::{ConnInfo, MAX_CONNECTIONS, MAX_HEAD_BYTES, RunningServer};
pub use service_health::{
    BindFailure, ENDPOINT_WEIGHT_HEADER, HealthCheckBind, ServiceHealthServer, service_health_body,
};
pub use source_metrics::{SourceCount, SourceCounters};
pub use timefmt::{parse_rfc3339, rfc3339_nano};

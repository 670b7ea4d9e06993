//! The Kubernetes API source: kube-rs watchers for Services, EndpointSlices, the own Node and
//! ServiceCIDRs, turned into [`kproxy_state::Change`]s.
//!
//! It emits exactly the events the manifest-directory source emits, so the daemon does not care
//! where its state comes from. Recovery (reconnects, `410 Gone` relists, bookmarks) is left to
//! `kube::runtime::watcher`; this crate adds what kube-proxy needs on top:
//!
//! - one bad object never breaks a list or a watch: objects are read as raw JSON first and turned
//!   into k8s-openapi types one at a time; the bad ones are logged and counted in
//!   [`SourceStats`];
//! - no partial view: Service and EndpointSlice changes are held back until both kinds have been
//!   listed once, so the consumer never syncs Services without their endpoints;
//! - `clientConnection` settings: qps/burst (a token bucket, as client-go has) and content type
//!   ([`client()`]).
//!
//! With the `fake` feature, [`fake::FakeApiServer`] is an in-process API server speaking the real
//! HTTP list/watch protocol, for tests that drive the unmodified kube-rs client.

mod client;
mod error;
#[cfg(feature = "fake")]
pub mod fake;
mod rate_limit;
mod raw;
mod stats;
mod watch;

pub use client::{DEFAULT_BURST, DEFAULT_QPS, client, client_from_config};
pub use error::Error;
pub use rate_limit::{RateLimit, RateLimitLayer};
pub use stats::SourceStats;
pub use watch::{DEFAULT_LABEL_SELECTOR, KubeSourceOptions, RetryBackoff, run};

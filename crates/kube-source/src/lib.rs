//! The Kubernetes API source: kube-rs watchers for Services, EndpointSlices, the own Node and
//! ServiceCIDRs, turned into [`kproxy_state::Change`]s.
//!
//! It emits exactly the events the manifest-directory source emits, so the daemon does not care
//! where its state comes from. Recovery (reconnects, `410 Gone` relists, bookmarks) is left to
//! `kube::runtime::watcher`, except after watch-cache lists, which kube-rs would decode whole
//! (`list_stream.rs` does the same steps); this crate adds what kube-proxy needs on top:
//!
//! - one bad object never breaks a list or a watch: each object is decoded into its k8s-openapi
//!   type straight from its own JSON text, and one that does not fit is kept aside with its
//!   name and the reason; the bad ones are logged and counted in [`SourceStats`];
//! - start bounded by the API server, not by the client: lists are streamed (`sendInitialEvents`,
//!   one request per kind, whatever the cluster size) and fall back to watch-cache lists for a
//!   kind whose streaming list fails in any way before its end bookmark ([`ListMode`]);
//! - memory bounded by kproxy's own records: each listed object is converted and handed over as
//!   it arrives ([`kproxy_state::Change::ListStarted`], [`kproxy_state::Change::Applied`] per
//!   object, then [`kproxy_state::Change::ListEnded`]), never collected into a whole list, at
//!   start or on a relist, and the source keeps no key of what it sent: the consumer works out
//!   what a relist no longer names. It knows it has a complete view once Services and
//!   EndpointSlices are both synced;
//! - `clientConnection` settings: qps/burst (a token bucket shared by every request, as
//!   client-go's clientset has) and content type ([`client()`]).
//!
//! With the `fake` feature, `fake::FakeApiServer` is an in-process API server speaking the real
//! HTTP list/watch protocol, for tests that drive the unmodified kube-rs client.

mod client;
mod error;
#[cfg(feature = "fake")]
pub mod fake;
mod list_stream;
pub mod protobuf;
mod rate_limit;
mod raw;
mod relist;
mod request;
mod retry;
mod stats;
mod streaming;
mod watch;
mod watcher;

pub use client::{DEFAULT_BURST, DEFAULT_QPS, client, client_from_config};
pub use error::Error;
pub use rate_limit::{RateLimit, RateLimitLayer};
pub use raw::{Malformed, decode, decode_protobuf};
pub use request::ContentTypes;
pub use stats::SourceStats;
pub use streaming::{INITIAL_EVENTS_TIMEOUT, STREAMING_RETRY_AFTER};
pub use watch::{DEFAULT_LABEL_SELECTOR, KubeSourceOptions, ListMode, RetryBackoff, run};

//! The Kubernetes API source: Services, EndpointSlices, the own Node and ServiceCIDRs, listed and
//! watched, turned into [`kproxy_state::Change`]s.
//!
//! It emits exactly the events the manifest-directory source emits, so the daemon does not care
//! where its state comes from. Lists, watches and their recovery (reconnects, `410 Gone`
//! relists, bookmarks) are kube-runtime's `watcher`, step for step, in kproxy's own
//! `watcher.rs`: kube-runtime's reads JSON only and whole lists at once. On top of that, what
//! kube-proxy needs:
//!
//! - protobuf on the wire, as kube-proxy: lists and watches ask for
//!   `application/vnd.kubernetes.protobuf` first (`clientConnection.contentType`,
//!   `acceptContentTypes`: [`ContentTypes`]) and read each answer in the encoding it came in
//!   ([`protobuf`] decodes straight into the objects the state takes);
//! - one bad object never breaks a list or a watch: each object is decoded from its own bytes
//!   (JSON text or protobuf message), and one that does not fit is kept aside with its name and
//!   the reason; the bad ones are logged and counted in [`SourceStats`];
//! - start bounded by the API server, not by the client: lists are streamed (`sendInitialEvents`,
//!   one request per kind, whatever the cluster size) and fall back to watch-cache lists for a
//!   kind whose streaming list fails in any way before its end bookmark ([`ListMode`]);
//! - memory bounded by kproxy's own records: each listed object is converted and handed over as
//!   it arrives ([`kproxy_state::Change::ListStarted`], [`kproxy_state::Change::Applied`] per
//!   object, then [`kproxy_state::Change::ListEnded`]), never collected into a whole list, at
//!   start or on a relist, and the source keeps no key of what it sent: the consumer works out
//!   what a relist no longer names. It knows it has a complete view once Services and
//!   EndpointSlices are both synced;
//! - `clientConnection` qps/burst: a token bucket shared by every request, as client-go's
//!   clientset has ([`client()`]).
//!
//! With the `fake` feature, `fake::FakeApiServer` is an in-process API server speaking the real
//! HTTP list/watch protocol in JSON and protobuf, for tests.

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

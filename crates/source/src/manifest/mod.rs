//! The manifest-directory source: a directory of YAML/JSON files stands in for the cluster.
//!
//! Files hold any number of documents (`---`), each a `v1 Service`, `v1 Node`,
//! `discovery.k8s.io/v1 EndpointSlice`, `networking.k8s.io/v1` (or `v1beta1`) `ServiceCIDR`, or a
//! `List` of them (`kubectl get -o yaml` output works as is). Other kinds are skipped. A malformed
//! file, document or object is reported with its file and line and skipped; the rest keeps
//! working. [`load`] reads the directory once; [`ManifestSource`] / [`watch`] keep following it
//! and emit the same [`kproxy_state::Change`] events as the Kubernetes source.

mod decode;
mod documents;
mod error;
mod locate;
mod snapshot;
mod watch;

pub use error::{ManifestError, SourceError};
pub use snapshot::{Origin, Snapshot, initial_changes, load};
pub use watch::{ManifestSource, WatchOptions, watch};

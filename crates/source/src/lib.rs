//! Sources of cluster state: a directory of manifests (and the Kubernetes API).
//!
//! Every source emits the same [`kproxy_state::Change`] events, so the rest of kproxy cannot tell
//! whether it is fed by the API server or by files on disk. The manifest source exists for
//! standalone use, demos and tests: a directory of YAML/JSON files stands in for the cluster.

pub mod manifest;

pub use manifest::{
    ManifestError, ManifestSource, Origin, Snapshot, SourceError, WatchOptions, initial_changes, load, watch,
};

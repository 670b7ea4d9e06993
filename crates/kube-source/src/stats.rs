//! Counters the daemon exports as metrics: what the source skipped, how often it had to recover.

use std::sync::atomic::{AtomicU64, Ordering};

use kproxy_state::Kind;

/// Counters of one source, per kind. Shared with the metrics exporter through an `Arc`.
#[derive(Debug, Default)]
pub struct SourceStats {
    malformed: [AtomicU64; 4],
    watch_errors: [AtomicU64; 4],
    lists: [AtomicU64; 4],
    events: [AtomicU64; 4],
    streaming_fallbacks: [AtomicU64; 4],
}

fn index(kind: Kind) -> usize {
    match kind {
        Kind::Service => 0,
        Kind::EndpointSlice => 1,
        Kind::Node => 2,
        Kind::ServiceCidr => 3,
    }
}

impl SourceStats {
    /// Fresh counters, all zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Objects of `kind` that could not be read and were skipped.
    pub fn malformed_objects(&self, kind: Kind) -> u64 {
        self.malformed[index(kind)].load(Ordering::Relaxed)
    }

    /// Errors the watcher of `kind` reported and recovered from (failed lists and watches,
    /// `410 Gone`, dropped connections).
    pub fn watch_errors(&self, kind: Kind) -> u64 {
        self.watch_errors[index(kind)].load(Ordering::Relaxed)
    }

    /// Complete listings of `kind` handed over (initial list and relists).
    pub fn lists(&self, kind: Kind) -> u64 {
        self.lists[index(kind)].load(Ordering::Relaxed)
    }

    /// Single-object watch events of `kind` sent (applied or deleted).
    pub fn events(&self, kind: Kind) -> u64 {
        self.events[index(kind)].load(Ordering::Relaxed)
    }

    /// Streaming lists of `kind` that failed before their end bookmark, after which the kind
    /// listed and watched instead ([`ListMode::Streaming`](crate::ListMode::Streaming)).
    pub fn streaming_fallbacks(&self, kind: Kind) -> u64 {
        self.streaming_fallbacks[index(kind)].load(Ordering::Relaxed)
    }

    pub(crate) fn count_malformed(&self, kind: Kind) {
        self.malformed[index(kind)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_watch_error(&self, kind: Kind) {
        self.watch_errors[index(kind)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_list(&self, kind: Kind) {
        self.lists[index(kind)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_event(&self, kind: Kind) {
        self.events[index(kind)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_streaming_fallback(&self, kind: Kind) {
        self.streaming_fallbacks[index(kind)].fetch_add(1, Ordering::Relaxed);
    }
}

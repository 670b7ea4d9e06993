//! What the source of cluster state counts — objects it skipped as unreadable, watch errors it
//! recovered from, listings, events, streaming lists it fell back from — exported per kind,
//! read from the source at each scrape. The source lives in another crate; it is reached
//! through [`SourceCounters`], plugged in once the source has started
//! ([`crate::Metrics::set_source`]).

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;

use crate::metrics::KindLabels;

/// One kind's counts, as a source reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceCount {
    /// The kind (`Service`, `EndpointSlice`, …).
    pub kind: String,
    /// Objects that could not be read and were skipped.
    pub malformed: u64,
    /// Errors the watcher recovered from (failed lists and watches, `410 Gone`, dropped
    /// connections).
    pub watch_errors: u64,
    /// Complete listings handed over (the initial one and relists).
    pub lists: u64,
    /// Single-object events handed over.
    pub events: u64,
    /// Streaming lists that failed before their end bookmark, after which the kind listed and
    /// watched instead.
    pub streaming_fallbacks: u64,
}

/// A source of cluster state that counts what it does.
pub trait SourceCounters: Send + Sync + std::fmt::Debug {
    /// The counts of every kind, now.
    fn counts(&self) -> Vec<SourceCount>;
}

/// Where the source is plugged in; empty until then (and with the manifest source, which
/// reports its skipped objects in its log).
pub(crate) type SourceSlot = Arc<Mutex<Option<Arc<dyn SourceCounters>>>>;

/// Reads one count of a [`SourceCount`].
type CountOf = fn(&SourceCount) -> u64;

/// Encodes the plugged-in source's counts at each scrape.
#[derive(Debug)]
pub(crate) struct SourceCollector(pub(crate) SourceSlot);

impl Collector for SourceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let source = self.0.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(source) = source else { return Ok(()) };
        let counts = source.counts();
        let families: [(&str, &str, CountOf); 5] = [
            ("kproxy_source_malformed_objects", "API objects that could not be read and were skipped, by kind", |c| {
                c.malformed
            }),
            ("kproxy_source_watch_errors", "Watch and list errors the source recovered from, by kind", |c| {
                c.watch_errors
            }),
            ("kproxy_source_lists", "Complete listings handed over (initial list and relists), by kind", |c| c.lists),
            ("kproxy_source_events", "Single-object watch events handed over, by kind", |c| c.events),
            (
                "kproxy_source_streaming_list_fallbacks",
                "Streaming lists that failed before their end bookmark, after which the kind listed and watched instead, by kind",
                |c| c.streaming_fallbacks,
            ),
        ];
        for (name, help, value) in families {
            // The encoder appends `_total` to counters.
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for count in &counts {
                let labels = KindLabels { kind: count.kind.clone() };
                ConstCounter::new(value(count)).encode(metric.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

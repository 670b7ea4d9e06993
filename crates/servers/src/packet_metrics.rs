//! Upstream's two packet counters of iptables mode, read from the kernel at each scrape:
//!
//! - `kubeproxy_iptables_ct_state_invalid_dropped_packets_total`: forwarded packets dropped
//!   because conntrack deemed them INVALID;
//! - `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`: connections accepted on
//!   localhost NodePorts.
//!
//! Upstream keeps them in nfacct objects and exports them through a custom collector: counters
//! without labels, and no family at all when there is nothing to read (a kernel without
//! nfnetlink_acct, another mode, a failed read). The same here: a family is encoded only when
//! the plugged-in [`PacketCounters`] has a count for it, so nftables and IPVS modes, which have
//! no such rules (as upstream's), never show them. The kernel side lives in the dataplane; it is
//! reached through [`PacketCounters`], plugged in once the counters exist
//! ([`crate::Metrics::set_packet_counters`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;

/// What the kernel has counted so far; `None` for a counter the dataplane does not keep.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketCounts {
    /// Forwarded packets dropped as conntrack state INVALID.
    pub ct_state_invalid_dropped: Option<u64>,
    /// Packets accepted on localhost NodePorts (the first of each connection).
    pub localhost_nodeports_accepted: Option<u64>,
}

/// A dataplane that keeps these counts in the kernel.
pub trait PacketCounters: Send + Sync + std::fmt::Debug {
    /// The counts now (a netlink round trip).
    fn read(&self) -> Result<PacketCounts, String>;
}

/// Where the dataplane's counters are plugged in; empty until then.
pub(crate) type PacketSlot = Arc<Mutex<Option<Arc<dyn PacketCounters>>>>;

/// Encodes the plugged-in counters at each scrape.
#[derive(Debug)]
pub(crate) struct PacketCollector {
    pub(crate) slot: PacketSlot,
    /// A read failed and was logged; the next failures are only logged at debug level until
    /// a read succeeds.
    failing: AtomicBool,
}

impl PacketCollector {
    pub(crate) fn new(slot: PacketSlot) -> Self {
        Self { slot, failing: AtomicBool::new(false) }
    }
}

/// Upstream's names (without the `_total` the encoder appends to counters) and HELP texts.
const CT_STATE_INVALID_DROPPED: (&str, &str) = (
    "kubeproxy_iptables_ct_state_invalid_dropped_packets",
    "packets dropped by iptables to work around conntrack problems",
);
const LOCALHOST_NODEPORTS_ACCEPTED: (&str, &str) = (
    "kubeproxy_iptables_localhost_nodeports_accepted_packets",
    "Number of packets accepted on nodeports of loopback interface",
);

impl Collector for PacketCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counters = self.slot.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(counters) = counters else { return Ok(()) };
        let counts = match counters.read() {
            Ok(counts) => {
                self.failing.store(false, Ordering::Relaxed);
                counts
            }
            Err(error) => {
                if self.failing.swap(true, Ordering::Relaxed) {
                    tracing::debug!(%error, "reading the kernel's packet counters failed again");
                } else {
                    tracing::warn!(%error, "reading the kernel's packet counters failed; not exported until it works");
                }
                return Ok(());
            }
        };
        for ((name, help), count) in [
            (CT_STATE_INVALID_DROPPED, counts.ct_state_invalid_dropped),
            (LOCALHOST_NODEPORTS_ACCEPTED, counts.localhost_nodeports_accepted),
        ] {
            if let Some(count) = count {
                let metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
                ConstCounter::new(count).encode(metric)?;
            }
        }
        Ok(())
    }
}

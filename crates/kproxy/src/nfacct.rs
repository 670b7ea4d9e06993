//! iptables mode's nfacct counters (`kproxy_iptables::nfacct`): set up once at start in the
//! node's network namespace, named by the rules, read at each scrape of `/metrics`.

use std::sync::Arc;

use kproxy_iptables::{Nfacct, NfacctCounters};
use kproxy_servers::{Metrics, PacketCounters, PacketCounts};
use tracing::{info, warn};

/// The counters, as `/metrics` reads them.
#[derive(Debug)]
struct Reader(Nfacct);

impl PacketCounters for Reader {
    fn read(&self) -> Result<PacketCounts, String> {
        let counts = self.0.read().map_err(|e| format!("listing the nfacct counters: {e}"))?;
        Ok(PacketCounts {
            ct_state_invalid_dropped: counts.ct_state_invalid_dropped,
            localhost_nodeports_accepted: counts.localhost_nodeports_accepted,
        })
    }
}

/// Probes the kernel for nfnetlink_acct, creates the counters and exports them through
/// `metrics`; returns the counters that exist, for the rules to name. A kernel without
/// nfnetlink_acct gets neither the rules' `-m nfacct` nor the two metrics, and the log says
/// so once.
pub fn setup(metrics: &Metrics) -> NfacctCounters {
    match Nfacct::setup() {
        Ok(nfacct) => {
            let counters = nfacct.counters();
            info!(?counters, "nfacct counters of INVALID drops and localhost NodePorts ready");
            metrics.set_packet_counters(Arc::new(Reader(nfacct)));
            counters
        }
        Err(error) => {
            warn!(
                %error,
                "no nfacct (the kernel lacks nfnetlink_acct?): kubeproxy_iptables_ct_state_invalid_dropped_packets_total \
                 and kubeproxy_iptables_localhost_nodeports_accepted_packets_total are not exported"
            );
            NfacctCounters::default()
        }
    }
}

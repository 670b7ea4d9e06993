//! The two packet counters of iptables mode, kept where upstream kube-proxy keeps them: in
//! nfnetlink_acct objects of the node's network namespace, named as upstream names them, that
//! two rules feed with `-m nfacct --nfacct-name NAME`:
//!
//! - [`CT_STATE_INVALID_DROPPED`]: the `KUBE-FORWARD` rule that drops forwarded packets
//!   conntrack deems INVALID (off with `conntrack.tcpBeLiberal`);
//! - [`LOCALHOST_NODEPORTS_ACCEPTED`]: a rule ahead of each NodePort's rule in nat
//!   `KUBE-NODEPORTS`, for destinations in 127.0.0.0/8 (IPv4, when localhost NodePorts are on);
//!   the nat table sees the first packet of each connection, so it counts connections.
//!
//! They are exported as `kubeproxy_iptables_ct_state_invalid_dropped_packets_total` and
//! `kubeproxy_iptables_localhost_nodeports_accepted_packets_total`, read at each scrape. As
//! upstream, the counters are created once at start ([`Nfacct::setup`]: existing ones, say
//! kube-proxy's, keep their counts) and a rule names only a counter that exists; a kernel
//! without nfnetlink_acct gets neither the `-m nfacct` matches nor the metrics.

use std::io;
use std::sync::{Mutex, PoisonError};

use kproxy_nft_netlink::acct::AcctClient;

/// The counter of the INVALID drops (upstream's `IPTablesCTStateInvalidDroppedNFAcctCounter`).
pub const CT_STATE_INVALID_DROPPED: &str = "ct_state_invalid_dropped_pkts";
/// The counter of connections to localhost NodePorts (upstream's
/// `LocalhostNodePortAcceptedNFAcctCounter`).
pub const LOCALHOST_NODEPORTS_ACCEPTED: &str = "localhost_nps_accepted_pkts";

/// Which counters exist, so the rules may name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NfacctCounters {
    /// [`CT_STATE_INVALID_DROPPED`] exists.
    pub ct_state_invalid_dropped: bool,
    /// [`LOCALHOST_NODEPORTS_ACCEPTED`] exists.
    pub localhost_nodeports_accepted: bool,
}

/// The packets each counter has counted (`None`: the counter is not there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NfacctCounts {
    /// Forwarded packets dropped as INVALID.
    pub ct_state_invalid_dropped: Option<u64>,
    /// Connections (first packets) accepted on localhost NodePorts.
    pub localhost_nodeports_accepted: Option<u64>,
}

/// The counters of the node's network namespace (the one of the thread that set them up).
#[derive(Debug)]
pub struct Nfacct {
    client: Mutex<AcctClient>,
    counters: NfacctCounters,
}

impl Nfacct {
    /// Probes the kernel for nfnetlink_acct and creates both counters (an existing one keeps its
    /// counts). An error means the kernel has no nfnetlink_acct (or the socket could not be
    /// opened); a counter that could not be created is only left out, with a warning.
    pub fn setup() -> io::Result<Nfacct> {
        let mut client = AcctClient::open()?;
        client.list()?;
        let mut ensure = |name: &str| match client.ensure(name) {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(counter = name, %error, "cannot create the nfacct counter; its metric is not exported");
                false
            }
        };
        let counters = NfacctCounters {
            ct_state_invalid_dropped: ensure(CT_STATE_INVALID_DROPPED),
            localhost_nodeports_accepted: ensure(LOCALHOST_NODEPORTS_ACCEPTED),
        };
        Ok(Nfacct { client: Mutex::new(client), counters })
    }

    /// The counters that exist.
    pub fn counters(&self) -> NfacctCounters {
        self.counters
    }

    /// What the counters have counted, in one dump.
    pub fn read(&self) -> io::Result<NfacctCounts> {
        let listed = self.client.lock().unwrap_or_else(PoisonError::into_inner).list()?;
        let packets = |exists: bool, name: &str| listed.iter().find(|c| exists && c.name == name).map(|c| c.packets);
        Ok(NfacctCounts {
            ct_state_invalid_dropped: packets(self.counters.ct_state_invalid_dropped, CT_STATE_INVALID_DROPPED),
            localhost_nodeports_accepted: packets(
                self.counters.localhost_nodeports_accepted,
                LOCALHOST_NODEPORTS_ACCEPTED,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_names_fit_the_kernels_limit() {
        for name in [CT_STATE_INVALID_DROPPED, LOCALHOST_NODEPORTS_ACCEPTED] {
            assert!(name.len() <= kproxy_nft_netlink::acct::NAME_MAX, "{name}");
        }
    }
}

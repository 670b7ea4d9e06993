//! The shared SCTP packet case through the netlink executor. The host kernel has no SCTP
//! sockets, so `cargo xtask guest-test` runs this binary in the guest kernel (the rest of the
//! suite runs on the host, `tests/packets.rs`).

use kproxy_nft_netlink::NetlinkExecutor;
use kproxy_nftables::{Config, NftablesDataplane};
use kproxy_packet_suite::run_named;

#[test]
fn clusterip_sctp() {
    run_named("clusterip_sctp", || NftablesDataplane::new(NetlinkExecutor::new(), Config::default()));
}

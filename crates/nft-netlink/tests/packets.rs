//! The shared packet suite against the nftables dataplane as the daemon runs it: applied through
//! the netlink executor (`crates/nftables/tests/packets.rs` runs it through `nft -f`). The two
//! paths can differ: nft adds implicit matches of its own in some contexts, the encoder follows
//! what nft sends, and only packets show that both translate every protocol. The SCTP case runs
//! in the guest kernel, as `tests/sctp.rs`.

use kproxy_nft_netlink::NetlinkExecutor;
use kproxy_nftables::{Config, NftablesDataplane};
use kproxy_packet_suite::run_named;

fn run(name: &str) {
    run_named(name, || NftablesDataplane::new(NetlinkExecutor::new(), Config::default()));
}

kproxy_packet_suite::packet_tests!(run);

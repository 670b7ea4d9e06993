//! The shared packet suite against the nftables dataplane, one test per case, each in its own
//! testbed (namespaces are uniquely named, so the tests run in parallel).

use kproxy_nftables::{Config, NftCommand, NftablesDataplane};
use kproxy_packet_suite::run_named;

fn run(name: &str) {
    run_named(name, || NftablesDataplane::new(NftCommand::new(), Config::default()));
}

kproxy_packet_suite::packet_tests!(run);

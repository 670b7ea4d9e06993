//! The shared SCTP packet case against the iptables dataplane on both backends. The host kernel
//! has no SCTP sockets, so `cargo xtask guest-test` runs this binary in the guest kernel (the rest
//! of the iptables suite runs on the host, `tests/packets.rs`).

use kproxy_iptables::{Backend, Config, IptablesDataplane, IptablesRestore};
use kproxy_packet_suite::run_named;

fn run(backend: Backend) {
    run_named("clusterip_sctp", || IptablesDataplane::new(IptablesRestore::new(backend), Config::default()));
}

#[test]
fn clusterip_sctp_nft_backend() {
    run(Backend::Nft);
}

#[test]
fn clusterip_sctp_legacy_backend() {
    run(Backend::Legacy);
}

//! The shared SCTP packet case against the iptables dataplane on both backends. The host kernel
//! has no SCTP sockets, so `cargo xtask guest-test` runs this binary in the guest kernel (the rest
//! of the iptables suite runs on the host, `tests/packets.rs`). The tests carry the names the
//! same case has in `tests/packets.rs`, so the guest runs by name what the host skipped there.

use kproxy_iptables::{Backend, Config, IptablesDataplane, IptablesRestore};
use kproxy_packet_suite::run_named;

fn run(backend: Backend) {
    run_named("clusterip_sctp", || IptablesDataplane::new(IptablesRestore::new(backend), Config::default()));
}

mod nft {
    #[test]
    fn clusterip_sctp() {
        super::run(kproxy_iptables::Backend::Nft);
    }
}

mod legacy {
    #[test]
    fn clusterip_sctp() {
        super::run(kproxy_iptables::Backend::Legacy);
    }
}

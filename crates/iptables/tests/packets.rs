//! The shared packet suite against the iptables dataplane, once per iptables backend: every
//! case is two tests, `nft::<case>` and `legacy::<case>`, each in its own testbed.

use kproxy_iptables::{Backend, Config, IptablesDataplane, IptablesRestore};
use kproxy_packet_suite::run_named;

fn run(backend: Backend, name: &str) {
    run_named(name, || IptablesDataplane::new(IptablesRestore::new(backend), Config::default()));
}

mod nft {
    kproxy_packet_suite::packet_tests!(|name| super::run(kproxy_iptables::Backend::Nft, name));
}

mod legacy {
    kproxy_packet_suite::packet_tests!(|name| super::run(kproxy_iptables::Backend::Legacy, name));
}

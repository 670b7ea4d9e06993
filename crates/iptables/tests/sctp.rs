//! The shared SCTP packet case against the iptables dataplane on both backends. The host kernel
//! has no SCTP sockets, so `cargo xtask guest-test` runs this binary in the guest kernel (the rest
//! of the iptables suite runs on the host, `tests/packets.rs`).

use kproxy_iptables::{Backend, Config, IptablesDataplane, IptablesRestore};
use kproxy_packet_suite::{Dataplane, run_named};
use kproxy_plan::{Plan, PlanDelta};

struct Ipt(IptablesDataplane<IptablesRestore>);

impl Dataplane for Ipt {
    fn sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<(), String> {
        self.0.sync(plan, delta).map(|_| ()).map_err(|e| e.to_string())
    }

    fn cleanup(&mut self) -> Result<(), String> {
        self.0.cleanup().map_err(|e| e.to_string())
    }
}

fn run(backend: Backend) {
    run_named("clusterip_sctp", || Ipt(IptablesDataplane::new(IptablesRestore::new(backend), Config::default())));
}

#[test]
fn clusterip_sctp_nft_backend() {
    run(Backend::Nft);
}

#[test]
fn clusterip_sctp_legacy_backend() {
    run(Backend::Legacy);
}

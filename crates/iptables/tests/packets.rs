//! The shared packet suite against the iptables dataplane, once per iptables backend: every
//! case is two tests, `nft::<case>` and `legacy::<case>`, each in its own testbed.

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

fn run(backend: Backend, name: &str) {
    run_named(name, || Ipt(IptablesDataplane::new(IptablesRestore::new(backend), Config::default())));
}

mod nft {
    kproxy_packet_suite::packet_tests!(|name| super::run(kproxy_iptables::Backend::Nft, name));
}

mod legacy {
    kproxy_packet_suite::packet_tests!(|name| super::run(kproxy_iptables::Backend::Legacy, name));
}

//! The shared packet suite against the nftables dataplane, one test per case, each in its own
//! testbed (namespaces are uniquely named, so the tests run in parallel).

use kproxy_nftables::{Config, NftCommand, NftablesDataplane};
use kproxy_packet_suite::{Dataplane, run_named};
use kproxy_plan::{Plan, PlanDelta};

struct Nft(NftablesDataplane<NftCommand>);

impl Dataplane for Nft {
    fn sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<(), String> {
        self.0.partial_sync(plan, delta).map(|_| ()).map_err(|e| e.to_string())
    }

    fn cleanup(&mut self) -> Result<(), String> {
        self.0.cleanup().map_err(|e| e.to_string())
    }
}

fn run(name: &str) {
    run_named(name, || Nft(NftablesDataplane::new(NftCommand::new(), Config::default())));
}

kproxy_packet_suite::packet_tests!(run);

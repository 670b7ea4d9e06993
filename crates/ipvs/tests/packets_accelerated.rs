//! The shared packet suite against the IPVS dataplane with every service port opted in to
//! Services acceleration (KEP-4963): their connections are DNATed by the auxiliary table's
//! nftables pick ahead of IPVS (docs/acceleration.md, "Under the IPVS dataplane"), and every case
//! must still see the same backends and the same source addresses as on IPVS itself — traffic
//! policies, terminating fallback, no-endpoint verdicts, source ranges, masquerading, hairpin,
//! KEP-6246. Ports with ClientIP affinity stay on IPVS (the pick keeps no affinity), and SCTP
//! is never accelerated. Needs IPVS and dummy devices: runs in the guest kernel.

use kproxy_ipvs::{Config, IpvsDataplane, KernelHost};
use kproxy_packet_suite::run_named_in_mode;
use kproxy_plan::{Dataplane, DataplaneError, Plan, PlanDelta, ServicePortPlan};
use kproxy_state::Protocol;
use kproxy_testbed::kernel::{self, KernelFeature};
use std::sync::Arc;

/// The IPVS dataplane, fed plans in which acceleration is on and every TCP/UDP port opted in.
struct Accelerated(IpvsDataplane<KernelHost>);

fn opt_in(p: &Arc<ServicePortPlan>) -> Arc<ServicePortPlan> {
    let mut p = (**p).clone();
    p.accelerate = p.protocol != Protocol::Sctp;
    Arc::new(p)
}

fn plan(plan: &Plan) -> Plan {
    let mut plan = plan.clone();
    for family in plan.families.values_mut() {
        family.node.acceleration = true;
        for p in family.services.values_mut() {
            *p = opt_in(p);
        }
    }
    plan
}

fn delta(delta: &PlanDelta) -> PlanDelta {
    let mut delta = delta.clone();
    for family in delta.families.values_mut() {
        if let Some(node) = &mut family.node {
            node.acceleration = true;
        }
        for p in family.added.iter_mut().chain(family.removed.iter_mut()) {
            *p = opt_in(p);
        }
        for c in &mut family.changed {
            c.old = opt_in(&c.old);
            c.new = opt_in(&c.new);
        }
    }
    delta
}

impl Dataplane for Accelerated {
    fn full_sync(&mut self, p: &Plan) -> Result<(), DataplaneError> {
        self.0.full_sync(&plan(p)).map(|_| ()).map_err(Into::into)
    }

    fn partial_sync(&mut self, p: &Plan, d: &PlanDelta) -> Result<(), DataplaneError> {
        self.0.sync(&plan(p), &delta(d)).map(|_| ()).map_err(Into::into)
    }

    fn cleanup(&mut self) -> Result<(), DataplaneError> {
        self.0.cleanup().map_err(Into::into)
    }
}

fn run(name: &str) {
    // As on IPVS itself (tests/packets.rs): an affinity service stays on IPVS, whose persistence
    // templates can not expire between TCP probes.
    if name == "client_ip_affinity_sticks_and_expires" {
        return;
    }
    if !kernel::require_root() || !kernel::require(&[KernelFeature::Ipvs, KernelFeature::Dummy]) {
        return;
    }
    // IPVS mode lists the node's addresses: its NodePorts are address services on each.
    let ipvs_mode = |p: &mut kproxy_plan::ProxyPolicy| p.list_local_addresses = true;
    run_named_in_mode(name, ipvs_mode, || Accelerated(IpvsDataplane::new(KernelHost::new(), Config::default())));
}

kproxy_packet_suite::packet_tests!(run);

#![allow(clippy::unwrap_used, clippy::panic)]
//! Partial syncs land the kernel exactly where a cold start of the final plan would, but for
//! which slot of its destination each endpoint sits in (an endpoint keeps the slot it was given;
//! a cold start numbers the endpoints in sorted order), and with every destination's slots dense.
//! The kernel is modelled strictly: adding an element that exists, deleting one that does not,
//! or touching a missing chain or set is an error, as nf_tables would make it.

mod common;

use common::generated::{Kernel, Svc, plan, same_but_slots, svc};
use kproxy_nftables::{Config, NftablesDataplane, Recording};
use kproxy_plan::{Plan, PlanDelta};
use proptest::prelude::*;

fn kernel_after(dp: &NftablesDataplane<Recording>, from: usize) -> Kernel {
    let mut k = Kernel::default();
    for tx in &dp.executor().applied[from..] {
        k.apply(tx);
    }
    k
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn partial_syncs_reach_what_a_cold_start_builds(
        steps in prop::collection::vec(prop::collection::vec(proptest::option::of(svc()), 5), 2..6),
        service_counters in any::<bool>(),
    ) {
        let plans: Vec<Plan> = steps.iter().map(|c| plan(c)).collect();
        // With counters on, the traffic sets' elements follow the same element diffs.
        let config = || Config { service_counters, ..Config::default() };
        let mut dp = NftablesDataplane::new(Recording::default(), config());
        dp.full_sync(&plans[0]).unwrap();
        for pair in plans.windows(2) {
            dp.partial_sync(&pair[1], &PlanDelta::between(&pair[0], &pair[1])).unwrap();
        }
        let last = plans.last().unwrap();
        // Stale chains are deleted by the sync after the one that flushed them.
        dp.partial_sync(last, &PlanDelta::default()).unwrap();
        let incremental = kernel_after(&dp, 0);

        let mut fresh = NftablesDataplane::new(Recording::default(), config());
        fresh.full_sync(last).unwrap();
        let cold = kernel_after(&fresh, 0);
        prop_assert_eq!(same_but_slots(&incremental, &cold), Ok(()));

        // A reconciling full sync, and the sync that deletes what it left stale, change nothing.
        dp.full_sync(last).unwrap();
        dp.partial_sync(last, &PlanDelta::default()).unwrap();
        prop_assert_eq!(&kernel_after(&dp, 0), &incremental);
    }
}

/// With counters on, every destination of a service port has its traffic counter from the
/// first sync, and endpoint changes (to none and back included) leave those elements alone:
/// their counts survive, and the sync stays O(change).
#[test]
fn endpoint_changes_leave_the_traffic_counters_alone() {
    let svc = |endpoints: Vec<u8>| Svc {
        external_ip: Some(0),
        node_port: true,
        local: false,
        affinity: false,
        udp: false,
        endpoints,
        internal_local: false,
        load_balancer: Some(false),
    };
    let plans: Vec<Plan> =
        [vec![1, 2], vec![3], vec![], vec![4, 5]].into_iter().map(|e| plan(&[Some(svc(e))])).collect();
    let config = Config { service_counters: true, ..Config::default() };
    let mut dp = NftablesDataplane::new(Recording::default(), config);
    dp.full_sync(&plans[0]).unwrap();
    let traffic = |dp: &NftablesDataplane<Recording>, from: usize| -> Vec<String> {
        let applied = &dp.executor().applied[from..];
        let text: Vec<String> = applied.iter().map(|tx| tx.render()).collect();
        text.iter()
            .flat_map(|t| t.lines())
            .filter(|l| l.contains("element") && l.contains("-traffic"))
            .map(str::to_owned)
            .collect()
    };
    let first = traffic(&dp, 0);
    // ClusterIP, ExternalIP, LoadBalancer IP, NodePort.
    assert_eq!(first.len(), 4, "{first:#?}");
    assert_eq!(first.iter().filter(|l| l.contains("nodeport-traffic")).count(), 1, "{first:#?}");
    let from = dp.executor().applied.len();
    for pair in plans.windows(2) {
        dp.partial_sync(&pair[1], &PlanDelta::between(&pair[0], &pair[1])).unwrap();
    }
    assert!(dp.executor().applied.len() > from, "the endpoint changes were synced");
    assert_eq!(traffic(&dp, from), Vec::<String>::new());
}

/// An address that `nodePortAddresses` selects came, then went: each is one `nodeport-ips`
/// element added or deleted, not every chain rewritten, and the kernel ends where a cold start
/// of the new plan would.
#[test]
fn a_node_port_address_change_costs_its_element_alone() {
    use kproxy_plan::NodePortAddresses;
    use kproxy_state::IpFamily;
    let with = |ips: &[&str]| {
        let mut plan = common::example_plan();
        let v4 = plan.families.get_mut(&IpFamily::V4).unwrap();
        v4.node.nodeport_addresses = NodePortAddresses::Only(ips.iter().map(|ip| ip.parse().unwrap()).collect());
        plan
    };
    let (one, two) = (with(&["198.18.0.2"]), with(&["198.18.0.2", "198.18.0.4"]));
    let mut dp = NftablesDataplane::new(Recording::default(), config_default());
    dp.full_sync(&one).unwrap();
    let cold_ops = dp.executor().applied.iter().map(|tx| tx.len()).sum::<usize>();

    for (from, to) in [(&one, &two), (&two, &one)] {
        let before = dp.executor().applied.len();
        dp.partial_sync(to, &PlanDelta::between(from, to)).unwrap();
        let ops: Vec<String> =
            dp.executor().applied[before..].iter().flat_map(|tx| tx.ops()).map(|op| format!("{op:?}")).collect();
        assert_eq!(ops.len(), 1, "one element, not a rewrite of {cold_ops} ops: {ops:#?}");
        assert!(ops[0].contains("nodeport-ips") && ops[0].contains("198.18.0.4"), "{ops:#?}");

        let mut fresh = NftablesDataplane::new(Recording::default(), config_default());
        fresh.full_sync(to).unwrap();
        assert_eq!(kernel_after(&dp, 0), kernel_after(&fresh, 0), "where a cold start lands");
    }
}

fn config_default() -> Config {
    Config::default()
}

//! Every kind of sync applied by `nft` to a real kernel, in a namespace of its own: the first
//! (recreating) sync, a reconciling full sync, partial syncs that remove a service (its chains
//! are flushed, then deleted next time) and change affinity, and cleanup.

#![allow(clippy::unwrap_used)]

mod common;

use kproxy_nftables::{Config, NftCommand, NftablesDataplane};
use kproxy_plan::PlanDelta;
use kproxy_state::{Change, Kind, ObjectKey};
use kproxy_testbed::Netns;

#[test]
fn full_reconcile_partial_and_cleanup_apply_to_the_kernel() {
    kproxy_testbed::require_kernel!();
    let ns = Netns::new("nft-sync").unwrap();
    let planner = common::planner();
    let mut state = common::state(common::example_objects());
    let _ = state.take_dirty();
    let mut plan = planner.build(&state);
    let mut dp = NftablesDataplane::new(NftCommand::new(), Config::default());
    let list = || ns.exec_ok("nft", &["list", "ruleset"]).unwrap();

    ns.run_in(|| dp.full_sync(&plan)).unwrap().unwrap();
    let first = list();
    assert!(first.contains("198.18.128.10 . tcp . 80 : goto service-cluster-masquerade-remote"), "{first}");
    assert!(first.contains("chain service-BPKTVXJ3-default/lb/tcp/https"), "{first}");
    ns.run_in(|| dp.full_sync(&plan)).unwrap().unwrap();
    assert_eq!(list(), first, "a reconciling full sync of the same plan changes nothing");

    state.apply(Change::Deleted(Kind::Service, ObjectKey::new("default", "lb")));
    let dirty = state.take_dirty();
    let delta = planner.update(&mut plan, &state, &dirty);
    ns.run_in(|| dp.partial_sync(&plan, &delta)).unwrap().unwrap();
    let after_remove = list();
    assert!(after_remove.contains("chain service-BPKTVXJ3-default/lb/tcp/https {\n\t}"), "{after_remove}");
    // No rule reads the affinity set any more; the set stays, the table's, not the Service's.
    assert!(!after_remove.contains("@client-affinity"), "{after_remove}");
    assert!(first.contains("@client-affinity") && after_remove.contains("set client-affinity {"), "{after_remove}");
    ns.run_in(|| dp.partial_sync(&plan, &PlanDelta::default())).unwrap().unwrap();
    assert!(!list().contains("default/lb/"), "stale chains are deleted on the next sync");

    ns.run_in(|| dp.full_sync(&plan)).unwrap().unwrap();
    ns.run_in(|| dp.cleanup()).unwrap().unwrap();
    assert_eq!(list(), "", "cleanup removes both tables");
    // Cleanup is idempotent.
    ns.run_in(|| dp.cleanup()).unwrap().unwrap();
}

//! A restart over unchanged state leaves every rule and element where it is: the adoption (the
//! first sync of a new kproxy over the tables the last one left) adds no rule, flushes no chain,
//! adds no element and flushes no static set, over netlink into a real kernel (each chain's rule
//! digest read back from its first rule's comment); a chain that differs is rewritten whole, an
//! element kproxy no longer wants is deleted by the identity the kernel listed, and either way
//! the kernel ends as a fresh start of the new plan.

#![allow(clippy::unwrap_used)]

mod common;

use kproxy_nft_model::{Op, SetFlag};
use kproxy_nft_netlink::NetlinkExecutor;
use kproxy_nftables::{Config, NftablesDataplane};
use kproxy_state::{Change, Kind, ObjectKey};
use kproxy_testbed::Netns;

/// How many elements of `plan`'s tables belong to sets of ranges.
fn range_elements(plan: &kproxy_plan::Plan) -> usize {
    let initial =
        NftablesDataplane::new(kproxy_nft_model::Recording::default(), Config::default()).render_initial(plan);
    let ranges: std::collections::BTreeSet<(String, String)> = initial
        .ops()
        .iter()
        .filter_map(|op| match op {
            Op::AddSet(t, s) if s.has(SetFlag::Interval) => Some((t.to_string(), s.name.clone())),
            _ => None,
        })
        .collect();
    let of_ranges = |op: &&Op| matches!(op, Op::AddElement(t, e) if ranges.contains(&(t.to_string(), e.set.clone())));
    let n = initial.ops().iter().filter(of_ranges).count();
    assert!(n > 0, "the example has sets of ranges");
    n
}

fn ruleset(ns: &Netns) -> String {
    ns.exec_ok("nft", &["list", "ruleset"]).unwrap()
}

/// A namespace named `name` where kproxy started on the example cluster; its plan and ruleset.
fn example_started(name: &str) -> (Netns, kproxy_plan::Plan, String) {
    let ns = Netns::new(name).unwrap();
    let plan = common::example_plan();
    start(&ns, &plan);
    let before = ruleset(&ns);
    (ns, plan, before)
}

fn start(ns: &Netns, plan: &kproxy_plan::Plan) -> kproxy_nftables::SyncReport {
    let mut dp = NftablesDataplane::new(NetlinkExecutor::new(), Config::default());
    ns.run_in(|| dp.full_sync(plan)).unwrap().unwrap()
}

#[test]
fn a_restart_over_unchanged_state_adds_no_rule_nor_element_and_one_over_changes_ends_as_a_fresh_start() {
    kproxy_testbed::require_kernel!();
    let ns = Netns::new("nft-adopt").unwrap();
    let list = || ruleset(&ns);
    let plan = common::example_plan();

    let cold = start(&ns, &plan);
    assert!(cold.counts.elements > 0, "the cold start adds elements: {cold:?}");
    let before = list();
    let adopted = start(&ns, &plan);
    // Only sets of ranges (interval sets, concatenated ranges) are refilled: their elements have
    // no identity to compare.
    assert_eq!(adopted.counts.elements, range_elements(&plan), "an unchanged restart touches no other element");
    assert!(cold.counts.rules > 0, "{cold:?}");
    assert_eq!(adopted.counts.rules, 0, "an unchanged restart rewrites no chain: {adopted:?}");
    assert_eq!(list(), before, "the restart changed nothing");

    // A Service went while kproxy was down: its elements are deleted one by one (with the
    // chains they jump to), every other element stays.
    let planner = common::planner();
    let mut state = common::state(common::example_objects());
    state.apply(Change::Deleted(Kind::Service, ObjectKey::new("default", "lb")));
    let _ = state.take_dirty();
    let fewer = planner.build(&state);
    let changed = start(&ns, &fewer);
    assert!(changed.counts.elements > 0, "its elements were deleted: {changed:?}");
    assert!(changed.counts.elements < cold.counts.elements, "the others kept theirs: {changed:?}");
    assert!(changed.counts.chains > 0, "its chains were removed: {changed:?}");
    assert!(changed.counts.rules < cold.counts.rules / 2, "the other chains kept their rules: {changed:?}");
    let after_restart = list();
    ns.nft("flush ruleset").unwrap();
    start(&ns, &fewer);
    assert_eq!(after_restart, list(), "the restart over a change ends as a fresh start");
}

/// The digest is what tells a chain someone rewrote from one kproxy wrote: the same number of
/// rules, other rules, and the restart rewrites that chain and nothing else.
#[test]
fn a_restart_rewrites_exactly_the_chain_whose_rules_someone_replaced() {
    kproxy_testbed::require_kernel!();
    let (ns, plan, before) = example_started("nft-adopt-chain");
    let list = || ruleset(&ns);
    let chain = "mark-for-masquerade";
    let rules_of = |text: &str| {
        let from = text.find(&format!("chain {chain} {{")).unwrap();
        text[from..].lines().skip(1).take_while(|l| l.trim() != "}").count()
    };
    assert_eq!(rules_of(&before), 1, "{before}");
    ns.nft(&format!("flush chain ip kproxy {chain}; add rule ip kproxy {chain} counter")).unwrap();
    assert_ne!(list(), before, "the chain holds another rule");

    let adopted = start(&ns, &plan);
    assert_eq!(adopted.counts.rules, 1, "only that chain's one rule is written again: {adopted:?}");
    assert_eq!(list(), before, "the restart restored it");
}

/// A table an older kproxy left, with an affinity set per service port (now one set per table):
/// the restart rewrites the service port's chain, deletes the old set and ends as a fresh start.
#[test]
fn a_restart_over_per_service_affinity_sets_of_an_older_kproxy_ends_as_a_fresh_start() {
    kproxy_testbed::require_kernel!();
    let (ns, plan, before) = example_started("nft-adopt-affinity");
    let list = || ruleset(&ns);
    let chain = "service-BPKTVXJ3-default/lb/tcp/https";
    assert!(before.contains(&format!("chain {chain} {{")), "the example has an affinity service: {before}");
    let old_set = "affinity-BPKTVXJ3-default/lb/tcp/https";
    ns.nft(&format!(
        "add set ip kproxy {old_set} {{ typeof ip saddr . numgen random mod 2; flags dynamic,timeout; timeout 30s; }}
         flush chain ip kproxy {chain}
         add rule ip kproxy {chain} update @{old_set} {{ ip saddr . numgen random mod 1 offset 7 }} meta l4proto tcp dnat to 198.18.16.3:8443"
    ))
    .unwrap();
    assert!(list().contains(&format!("set {old_set} {{")));

    let adopted = start(&ns, &plan);
    assert!(adopted.counts.rules > 0, "the chain is written again: {adopted:?}");
    assert_eq!(list(), before, "the old set is gone and the chain holds the new rules");
}

#![allow(clippy::unwrap_used, clippy::panic)]
//! Partial syncs land the kernel exactly where a cold start of the final plan would. The kernel
//! is modelled strictly: adding an element that exists, deleting one that does not, or touching
//! a missing chain or set is an error, as nf_tables would make it.

mod common;

use common::generated::{Kernel, plan, svc};
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
    ) {
        let plans: Vec<Plan> = steps.iter().map(|c| plan(c)).collect();
        let mut dp = NftablesDataplane::new(Recording::default(), Config::default());
        dp.full_sync(&plans[0]).unwrap();
        for pair in plans.windows(2) {
            dp.partial_sync(&pair[1], &PlanDelta::between(&pair[0], &pair[1])).unwrap();
        }
        let last = plans.last().unwrap();
        // Stale chains are deleted by the sync after the one that flushed them.
        dp.partial_sync(last, &PlanDelta::default()).unwrap();
        let incremental = kernel_after(&dp, 0);

        let mut fresh = NftablesDataplane::new(Recording::default(), Config::default());
        fresh.full_sync(last).unwrap();
        let cold = kernel_after(&fresh, 0);
        prop_assert_eq!(&incremental, &cold);

        // A reconciling full sync, and the sync that deletes what it left stale, change nothing.
        dp.full_sync(last).unwrap();
        dp.partial_sync(last, &PlanDelta::default()).unwrap();
        prop_assert_eq!(&kernel_after(&dp, 0), &cold);
    }
}

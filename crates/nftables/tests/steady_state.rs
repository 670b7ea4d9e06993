#![allow(clippy::unwrap_used)]
//! The periodic check costs nothing while nobody else touched kproxy's tables, and repairs only
//! what someone else changed (through the Recording executor, which keeps a summary of what a
//! kernel would hold; `crates/nft-netlink/tests/kernel.rs` does the same on a real kernel, `crates/kproxy/tests/kernel_faults.rs` with the daemon).

mod common;

use kproxy_nft_model::{Op, TableFamily, TableRef, Transaction};
use kproxy_nftables::{Config, NftablesDataplane, Recording, Verification};

fn table() -> TableRef {
    TableRef { family: TableFamily::Ip, name: "kproxy".into() }
}

/// The chains a transaction flushes, in order.
fn flushed_chains(tx: &Transaction) -> Vec<&str> {
    tx.ops()
        .iter()
        .filter_map(|op| match op {
            Op::FlushChain(_, c) => Some(c.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_periodic_check_lists_nothing_while_nobody_else_commits() {
    let plan = common::example_plan();
    let mut dp = NftablesDataplane::new(Recording::default(), Config::default());
    dp.full_sync(&plan).unwrap();
    // The cold start decided everything its table holds, and every commit since was ours.
    let lists = dp.executor().lists;
    let applied = dp.executor().applied.len();
    for _ in 0..3 {
        assert_eq!(dp.verify(&plan).unwrap(), Verification::Untouched);
    }
    assert_eq!((dp.executor().lists, dp.executor().applied.len()), (lists, applied));
    // Someone else commits, to any table: the next check lists, finds nothing wrong.
    dp.executor_mut().generation += 1;
    assert_eq!(dp.verify(&plan).unwrap(), Verification::Clean);
    assert!(dp.executor().lists > lists);
    assert_eq!(dp.executor().applied.len(), applied);
}

/// A cold start in many transactions (as at scale: 50,000 operations each) leaves the same
/// summary of what it applied as one in a single transaction: a check after someone else's
/// commit finds every chain and set where it expects them.
#[test]
fn a_cold_start_in_many_transactions_is_followed_whole_by_the_periodic_check() {
    let plan = common::example_plan();
    let config = Config { cold_start_chunk_ops: 7, ..Config::default() };
    let mut dp = NftablesDataplane::new(Recording::default(), config);
    dp.full_sync(&plan).unwrap();
    assert!(dp.executor().applied.len() > 10, "{} transactions", dp.executor().applied.len());
    dp.executor_mut().generation += 1;
    assert_eq!(dp.verify(&plan).unwrap(), Verification::Clean);
}

#[test]
fn the_periodic_check_rewrites_only_the_chain_and_map_that_someone_else_changed() {
    let plan = common::example_plan();
    let mut dp = NftablesDataplane::new(Recording::default(), Config::default());
    dp.full_sync(&plan).unwrap();
    assert_eq!(dp.verify(&plan).unwrap(), Verification::Untouched);
    // Another tool flushes the `services` chain and deletes a ClusterIP's dispatch element.
    {
        let rec = dp.executor_mut();
        let listing = rec.tables.0.get_mut(&table()).unwrap();
        listing.chains.insert("services".into(), 0);
        *listing.sets.get_mut("service-ips").unwrap().as_mut().unwrap() -= 1;
        rec.generation += 1;
    }
    let Verification::Repaired(drift) = dp.verify(&plan).unwrap() else { panic!("no repair") };
    assert_eq!(drift.len(), 2, "{drift:?}");
    let repair = dp.executor().last().unwrap().clone();
    assert_eq!(flushed_chains(&repair), ["services"], "{}", repair.render());
    assert!(repair.ops().iter().all(|op| match op {
        Op::AddElement(t, e) => *t == table() && e.set == "service-ips",
        Op::AddRule { chain, .. } => chain == "services",
        Op::DeleteTable(_) | Op::DeleteChain(..) | Op::DeleteSet { .. } => false,
        _ => true,
    }));
    assert!(repair.render().contains("flush map ip kproxy service-ips"), "{}", repair.render());
    // The kernel holds what was applied again, and the next check says so.
    assert_eq!(dp.verify(&plan).unwrap(), Verification::Clean);
}

/// Someone replaced the rules of a chain with as many others: the count is the same, the
/// digest on its first rule is not, and the check rewrites that chain alone.
#[test]
fn the_periodic_check_rewrites_a_chain_someone_refilled_with_as_many_other_rules() {
    let plan = common::example_plan();
    let mut dp = NftablesDataplane::new(Recording::default(), Config::default());
    dp.full_sync(&plan).unwrap();
    {
        let rec = dp.executor_mut();
        let listing = rec.tables.0.get_mut(&table()).unwrap();
        assert!(listing.first_comments.contains_key("services"), "kproxy's chains carry their digest");
        listing.first_comments.remove("services");
        rec.generation += 1;
    }
    let Verification::Repaired(drift) = dp.verify(&plan).unwrap() else { panic!("no repair") };
    assert_eq!(drift.len(), 1, "{drift:?}");
    let repair = dp.executor().last().unwrap().clone();
    assert_eq!(flushed_chains(&repair), ["services"], "{}", repair.render());
    assert_eq!(dp.verify(&plan).unwrap(), Verification::Clean);
}

#[test]
fn a_deleted_table_is_rebuilt_by_the_periodic_check() {
    let plan = common::example_plan();
    let mut dp = NftablesDataplane::new(Recording::default(), Config::default());
    dp.full_sync(&plan).unwrap();
    let whole = dp.executor().tables.get(&table());
    {
        let rec = dp.executor_mut();
        rec.tables.0.remove(&table());
        rec.generation += 1;
    }
    assert!(matches!(dp.verify(&plan).unwrap(), Verification::Repaired(_)));
    assert_eq!(dp.executor().tables.get(&table()), whole);
}

/// Another program committing in a tight loop can make every listing attempt meet a commit:
/// the check then reports that it could not read the tables, which is not drift and not a
/// failure, and writes nothing; the next check reads them.
#[test]
fn a_check_that_cannot_read_the_busy_tables_says_so_and_writes_nothing() {
    let plan = common::example_plan();
    let mut dp = NftablesDataplane::new(Recording::default(), Config::default());
    dp.full_sync(&plan).unwrap();
    let applied = dp.executor().applied.len();
    dp.executor_mut().generation += 1;
    dp.executor_mut().busy_lists = 1;
    assert_eq!(dp.verify(&plan).unwrap(), Verification::Busy);
    assert_eq!(dp.executor().applied.len(), applied, "nothing written");
    assert_eq!(dp.verify(&plan).unwrap(), Verification::Clean, "the next check reads them");
    assert_eq!(dp.executor().applied.len(), applied);
}

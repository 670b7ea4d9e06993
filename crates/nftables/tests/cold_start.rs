#![allow(clippy::unwrap_used)]
//! A cold start is streamed as bounded transactions whose concatenation is exactly the
//! single-transaction cold start, in an order where nothing is referenced before it exists and
//! the hooked base chains come last.

mod common;

use std::collections::BTreeSet;

use kproxy_nft_model::{Element, Executor, MapData, Op};
use kproxy_nftables::{Config, NftablesDataplane, Recording};

/// The chains and sets an operation refers to (`goto`/`jump` targets, `@set` lookups).
fn references(op: &Op) -> Vec<String> {
    match op {
        Op::AddRule { rule, .. } => rule.references().map(str::to_owned).collect(),
        Op::AddElement(_, Element { value: Some(MapData::Verdict(v)), .. }) => {
            v.chain().into_iter().map(str::to_owned).collect()
        }
        _ => Vec::new(),
    }
}

#[test]
fn a_cold_start_is_streamed_in_bounded_parts_that_never_dangle() {
    let plan = common::example_plan();
    let whole = NftablesDataplane::new(Recording::default(), Config::default()).render_initial(&plan);
    let config = Config { cold_start_chunk_ops: 10, ..Config::default() };
    let mut dp = NftablesDataplane::new(Recording::default(), config);
    let report = dp.full_sync(&plan).unwrap();
    assert_eq!(report.ops, whole.len());
    let parts = dp.executor().applied.clone();
    assert!(parts.len() > 2, "{} parts", parts.len());
    assert!(parts.iter().all(|p| !p.is_empty() && p.len() <= 10));
    let ops: Vec<&Op> = parts.iter().flat_map(|p| p.ops()).collect();
    // The parts are the whole cold start: every operation once, all but the element additions
    // in the same order; each part adds its elements last, one set's together (the executor
    // sends them as one message).
    let debug = |ops: &[&Op]| -> Vec<String> { ops.iter().map(|op| format!("{op:?}")).collect() };
    let whole_ops: Vec<&Op> = whole.ops().iter().collect();
    let (mut ours, mut wanted) = (debug(&ops), debug(&whole_ops));
    ours.sort();
    wanted.sort();
    assert_eq!(ours, wanted, "every operation of the cold start once");
    let not_elements = |ops: &[&Op]| -> Vec<String> {
        debug(&ops.iter().copied().filter(|op| !matches!(op, Op::AddElement(..))).collect::<Vec<_>>())
    };
    assert_eq!(not_elements(&ops), not_elements(&whole_ops), "the rest in order");
    for part in &parts {
        let first_element = part.ops().iter().position(|op| matches!(op, Op::AddElement(..))).unwrap_or(part.len());
        // A set is one per table: a part that spans both families has each family's own.
        let sets: Vec<(String, &str)> = part.ops()[first_element..]
            .iter()
            .map(|op| match op {
                Op::AddElement(t, e) => (t.to_string(), e.set.as_str()),
                other => panic!("{other:?} after the part's elements"),
            })
            .collect();
        let mut runs = sets.clone();
        runs.dedup();
        let distinct: BTreeSet<&(String, &str)> = runs.iter().collect();
        assert_eq!(runs.len(), distinct.len(), "one run per set: {sets:?}");
    }

    // Nothing is referenced before it exists (per table).
    let mut defined: BTreeSet<(String, String)> = BTreeSet::new();
    for op in &ops {
        match op {
            Op::AddTable { .. } | Op::DeleteTable(_) => {
                let t = match op {
                    Op::AddTable { table, .. } | Op::DeleteTable(table) => table.to_string(),
                    _ => unreachable!(),
                };
                if matches!(op, Op::DeleteTable(_)) {
                    defined.retain(|(tt, _)| *tt != t);
                }
            }
            Op::AddChain(t, c) => {
                defined.insert((t.to_string(), c.name.clone()));
            }
            Op::AddSet(t, s) => {
                defined.insert((t.to_string(), s.name.clone()));
            }
            Op::AddRule { table, chain, .. } => {
                assert!(defined.contains(&(table.to_string(), chain.clone())), "rule before its chain: {op:?}");
            }
            Op::AddElement(t, e) => {
                assert!(defined.contains(&(t.to_string(), e.set.clone())), "element before its set: {op:?}");
            }
            _ => {}
        }
        let table = match op {
            Op::AddRule { table, .. } | Op::AddElement(table, _) => table.to_string(),
            _ => continue,
        };
        for r in references(op) {
            assert!(defined.contains(&(table.clone(), r.clone())), "{op:?} refers to {r} before it exists");
        }
    }

    // Base chains are hooked last: no packet sees a half-built table.
    let base: BTreeSet<String> = ops
        .iter()
        .filter_map(|op| match op {
            Op::AddChain(t, c) if c.hook.is_some() => Some(format!("{t} {}", c.name)),
            _ => None,
        })
        .collect();
    let is_base_op = |op: &Op| match op {
        Op::AddChain(_, c) => c.hook.is_some(),
        Op::AddRule { table, chain, .. } => base.contains(&format!("{table} {chain}")),
        _ => false,
    };
    // Only they follow the first, but for the elements of its own part (one transaction with
    // it).
    let hooked = parts.iter().position(|p| p.ops().iter().any(is_base_op)).unwrap();
    let first_base = parts[hooked].ops().iter().position(is_base_op).unwrap();
    assert!(
        parts[hooked].ops()[first_base..].iter().all(|op| is_base_op(op) || matches!(op, Op::AddElement(..))),
        "only base chains and their part's elements after the first one"
    );
    assert!(parts[hooked + 1..].iter().flat_map(|p| p.ops()).all(is_base_op), "only base chains in the parts after");

    // A later full sync of the same plan has nothing to change: it applies nothing.
    dp.full_sync(&plan).unwrap();
    assert_eq!(dp.executor().applied.len(), parts.len());
    // A node-wide change reconciles in one atomic transaction.
    let mut changed = plan.clone();
    for fam in changed.families.values_mut() {
        let cidr =
            if fam.node.service_cidrs.iter().any(|c| c.addr().is_ipv6()) { "fd00:ff::/64" } else { "203.0.113.0/24" };
        fam.node.service_cidrs.push(cidr.parse().unwrap());
    }
    dp.full_sync(&changed).unwrap();
    assert_eq!(dp.executor().applied.len(), parts.len() + 1);
}

#[test]
fn a_cold_start_stops_at_the_part_the_kernel_refuses_and_the_next_sync_builds_the_whole_tables() {
    let plan = common::example_plan();
    let whole = NftablesDataplane::new(Recording::default(), Config::default()).render_initial(&plan);
    let mut reference = Recording::default();
    reference.apply(&whole).unwrap();

    let config = Config { cold_start_chunk_ops: 10, ..Config::default() };
    let refuses_the_third = Recording { fail_after: Some(2), ..Recording::default() };
    let mut dp = NftablesDataplane::new(refuses_the_third, config);
    assert!(dp.full_sync(&plan).is_err(), "the refused part fails the sync");
    let kernel = dp.executor();
    assert_eq!(kernel.applied.len(), 2, "nothing after the refused part reaches the kernel");
    assert!(
        kernel.applied.iter().flat_map(|tx| tx.ops()).all(|op| !matches!(op, Op::AddChain(_, c) if c.hook.is_some())),
        "no base chain is hooked by a cold start that stopped"
    );
    assert_ne!(kernel.tables, reference.tables);

    dp.full_sync(&plan).unwrap();
    assert_eq!(dp.executor().tables, reference.tables, "the next sync leaves what a whole cold start leaves");
}

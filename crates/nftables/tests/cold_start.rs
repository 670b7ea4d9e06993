#![allow(clippy::unwrap_used)]
//! A large cold start is applied as bounded transactions whose concatenation is exactly the
//! single-transaction cold start, reordered so base chains come last.

mod common;

use kproxy_nftables::transaction::Op;
use kproxy_nftables::{Config, NftablesDataplane, Recording};

#[test]
fn a_cold_start_over_the_bound_is_split_and_loses_nothing() {
    let plan = common::example_plan();
    let whole = NftablesDataplane::new(Recording::default(), Config::default()).render_initial(&plan);
    let config = Config { cold_start_chunk_ops: 10, ..Config::default() };
    let mut dp = NftablesDataplane::new(Recording::default(), config);
    let report = dp.full_sync(&plan).unwrap();
    assert_eq!(report.ops, whole.len());
    let parts = dp.executor().applied.clone();
    assert!(parts.len() > 2, "{} parts", parts.len());
    assert!(parts.iter().all(|p| !p.is_empty() && p.len() <= 10));
    let mut got: Vec<String> =
        parts.iter().flat_map(|p| p.render().lines().map(str::to_owned).collect::<Vec<_>>()).collect();
    let mut want: Vec<String> = whole.render().lines().map(str::to_owned).collect();
    // Base chains are hooked last: no packet sees a half-built table.
    let hooked = |p: &kproxy_nftables::Transaction| {
        p.ops().iter().any(|op| matches!(op, Op::AddChain(_, c) if c.hook.is_some()))
    };
    let first_hooked = parts.iter().position(hooked).unwrap();
    let last_element = parts.iter().rposition(|p| p.ops().iter().any(|op| matches!(op, Op::AddElement(..)))).unwrap();
    let last_chain = parts
        .iter()
        .rposition(|p| p.ops().iter().any(|op| matches!(op, Op::AddChain(_, c) if c.hook.is_none())))
        .unwrap();
    assert!(last_chain < last_element && last_element < first_hooked, "{last_chain} {last_element} {first_hooked}");
    got.sort();
    want.sort();
    assert_eq!(got, want);
    // A later full sync (reconcile) stays one atomic transaction.
    dp.full_sync(&plan).unwrap();
    assert_eq!(dp.executor().applied.len(), parts.len() + 1);
}

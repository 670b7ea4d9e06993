#![allow(clippy::unwrap_used, clippy::panic)]
//! Endpoint slots under random sequences of endpoint changes, on the strict kernel model: after
//! every change the kernel holds what a fresh start of the same plan holds, but for which slot
//! each endpoint sits in, with every destination's slots dense (`0..N`, as the pick needs); a
//! change costs element operations bounded by what changed, whatever the Service's size; and a
//! restart reads the slots back from the kernel, so it rewrites none of them.

mod common;

use std::collections::BTreeSet;

use common::generated::{Kernel, ModelKernel, same_but_slots};
use kproxy_nft_model::Op;
use kproxy_nftables::{Config, NftablesDataplane, Recording};
use kproxy_plan::{Plan, PlanDelta};
use proptest::prelude::*;
use serde_json::json;

/// The Service's traffic policies and destinations.
#[derive(Debug, Clone, Copy)]
struct Shape {
    node_port: bool,
    external_ip: bool,
    /// `externalTrafficPolicy: Local` (a second class of endpoints: this node's).
    external_local: bool,
    internal_local: bool,
}

fn shape() -> impl Strategy<Value = Shape> {
    (any::<bool>(), any::<bool>(), any::<bool>(), prop::bool::weighted(0.2)).prop_map(
        |(node_port, external_ip, external_local, internal_local)| Shape {
            node_port,
            external_ip,
            external_local,
            internal_local,
        },
    )
}

/// Endpoint `e`: its address, and whether it runs on this node (node-a).
fn endpoint(e: u16) -> (String, bool) {
    (format!("198.18.{}.{}", 64 + e / 250, e % 250 + 1), e.is_multiple_of(3))
}

/// One Service of `shape` with `endpoints`, in slices of 100.
fn plan(shape: Shape, endpoints: &BTreeSet<u16>) -> Plan {
    let mut spec = json!({"clusterIP": "198.18.128.10", "ports": [{"name": "p", "port": 80, "protocol": "TCP"}]});
    if shape.node_port || shape.external_local {
        spec["type"] = json!("NodePort");
        spec["ports"][0]["nodePort"] = json!(30080);
    }
    if shape.external_ip {
        spec["externalIPs"] = json!(["203.0.113.50"]);
    }
    if shape.external_local {
        spec["externalTrafficPolicy"] = json!("Local");
    }
    if shape.internal_local {
        spec["internalTrafficPolicy"] = json!("Local");
    }
    let mut objects = vec![common::node(), common::service("default", "big", spec, json!({}))];
    let all: Vec<u16> = endpoints.iter().copied().collect();
    for (s, chunk) in all.chunks(100).enumerate() {
        let eps: Vec<_> = chunk
            .iter()
            .map(|e| {
                let (ip, local) = endpoint(*e);
                common::ep(&ip, if local { "node-a" } else { "node-b" })
            })
            .collect();
        let ports = json!([{"name": "p", "port": 8080, "protocol": "TCP"}]);
        objects.push(common::slice("default", "big", &s.to_string(), "IPv4", ports, json!(eps)));
    }
    common::planner().build(&common::state(objects))
}

/// What a fresh start of `plan` puts in the kernel.
fn fresh(plan: &Plan) -> Kernel {
    let mut dp = NftablesDataplane::new(Recording::default(), Config::default());
    dp.full_sync(plan).unwrap();
    let mut kernel = Kernel::default();
    for tx in &dp.executor().applied {
        kernel.apply(tx);
    }
    kernel
}

fn element_ops<'a>(txs: impl IntoIterator<Item = &'a kproxy_nftables::Transaction>) -> usize {
    txs.into_iter()
        .flat_map(|tx| tx.ops())
        .filter(|op| matches!(op, Op::AddElement(..) | Op::DeleteElement(..) | Op::DeleteElementByIdentity { .. }))
        .count()
}

/// The pick destinations in `kernel` (one per class of endpoints and destination that has
/// endpoints): its cap elements, one each.
fn pick_destinations(kernel: &Kernel) -> usize {
    let tables = kernel.0.values();
    tables.flat_map(|t| &t.sets).filter(|(name, _)| name.contains("-cap-")).map(|(_, elements)| elements.len()).sum()
}

/// Applies `toggles` to `endpoints`: each adds an endpoint that is not there or removes one
/// that is.
fn toggle(endpoints: &BTreeSet<u16>, toggles: &[u16]) -> BTreeSet<u16> {
    let mut next = endpoints.clone();
    for e in toggles {
        if !next.remove(e) {
            next.insert(*e);
        }
    }
    next
}

/// What a change moves between caps' endpoints maps: when the count of a class of endpoints
/// (all of them; this node's) crosses a power of two, each destination's endpoints of that class
/// leave the old cap's map and enter the new one's.
fn cap_moves(before: &BTreeSet<u16>, after: &BTreeSet<u16>) -> usize {
    let local = |s: &BTreeSet<u16>| s.iter().filter(|e| endpoint(**e).1).count();
    let cap = |n: usize| n.max(1).next_power_of_two();
    let moved = |a: usize, b: usize| if cap(a) == cap(b) { 0 } else { a + b };
    moved(before.len(), after.len()) + moved(local(before), local(after))
}

/// Endpoints, and a sequence of changes to them: a few endpoints come or go each time.
fn history() -> impl Strategy<Value = (Shape, BTreeSet<u16>, Vec<Vec<u16>>)> {
    (
        shape(),
        prop::collection::btree_set(0u16..400, 0..200),
        prop::collection::vec(prop::collection::vec(0u16..400, 1..5), 1..8),
    )
}

/// Syncs every step of a history after the first plan; checks each against a fresh start and
/// its cost; returns the dataplane and the last plan.
fn run(
    shape: Shape,
    initial: &BTreeSet<u16>,
    steps: &[Vec<u16>],
) -> Result<(NftablesDataplane<ModelKernel>, Plan), TestCaseError> {
    let mut endpoints = initial.clone();
    let mut last = plan(shape, &endpoints);
    let mut dp = NftablesDataplane::new(ModelKernel::default(), Config::default());
    dp.full_sync(&last).unwrap();
    let mut last_destinations = pick_destinations(&dp.executor().kernel);
    for toggles in steps {
        let next_endpoints = toggle(&endpoints, toggles);
        let changed = endpoints.symmetric_difference(&next_endpoints).count();
        let next = plan(shape, &next_endpoints);
        let from = dp.executor().applied.len();
        dp.partial_sync(&next, &PlanDelta::between(&last, &next)).unwrap();
        let cold = fresh(&next);
        prop_assert_eq!(same_but_slots(&dp.executor().kernel, &cold), Ok(()));
        // Per destination with endpoints: a replaced endpoint is 2 operations, a removed one at
        // most 3 (its slot's element, the last slot's, the last endpoint in its new slot), an
        // added one 1; a change of cap 2, and the move of its endpoints to that cap's map. Each
        // endpoint of this node also has a hairpin pair.
        let next_destinations = pick_destinations(&cold);
        let destinations = last_destinations.max(next_destinations);
        let bound = destinations * (3 * changed + 2 + cap_moves(&endpoints, &next_endpoints)) + changed;
        let ops = element_ops(&dp.executor().applied[from..]);
        prop_assert!(
            ops <= bound,
            "{} endpoints changed of {}: {} element operations, more than {}",
            changed,
            next_endpoints.len(),
            ops,
            bound
        );
        endpoints = next_endpoints;
        last = next;
        last_destinations = next_destinations;
    }
    Ok((dp, last))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn changes_keep_every_destinations_slots_dense_at_a_cost_bounded_by_what_changed(
        (shape, initial, steps) in history(),
    ) {
        run(shape, &initial, &steps)?;
    }

    /// A restart over the tables the last kproxy left: with the same plan, not one element is
    /// written and the kernel stays exactly as it was (slots included); with changes made while
    /// it was down, it writes what those changes cost as partial syncs would, and every endpoint
    /// that stayed keeps its slot.
    #[test]
    fn a_restart_reads_the_slots_back_and_rewrites_none(
        (shape, initial, steps) in history(),
        down in prop::collection::vec(0u16..400, 1..5),
    ) {
        let (mut dp, last) = run(shape, &initial, &steps)?;
        let left = std::mem::take(dp.executor_mut());
        // A new kproxy over what the last one left (the kernel, and what a listing of it says).
        let restart = |plan: &Plan| {
            let exec = ModelKernel { kernel: left.kernel.clone(), listings: left.listings.clone(), ..ModelKernel::default() };
            let mut restarted = NftablesDataplane::new(exec, Config::default());
            restarted.full_sync(plan).unwrap();
            let exec = std::mem::take(restarted.executor_mut());
            let ops = element_ops(&exec.applied);
            (exec.kernel, ops)
        };
        let kernel = &left.kernel;
        let (same, ops) = restart(&last);
        prop_assert_eq!(ops, 0, "an unchanged restart writes no element");
        prop_assert_eq!(&same, kernel);

        let endpoints = steps.iter().fold(initial.clone(), |e, t| toggle(&e, t));
        let after = toggle(&endpoints, &down);
        let changed = endpoints.symmetric_difference(&after).count();
        let next = plan(shape, &after);
        let (restarted, ops) = restart(&next);
        let cold = fresh(&next);
        prop_assert_eq!(same_but_slots(&restarted, &cold), Ok(()));
        let destinations = pick_destinations(kernel).max(pick_destinations(&cold));
        let bound = destinations * (3 * changed + 2 + cap_moves(&endpoints, &after)) + changed;
        prop_assert!(ops <= bound, "{} changed: {} element operations", changed, ops);
    }
}

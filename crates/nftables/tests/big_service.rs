#![allow(clippy::unwrap_used, clippy::panic)]
//! One endpoint change in a Service of 5,000 endpoints costs a few element operations, whatever
//! the Service's size: a replaced endpoint takes the slot its predecessor left, a removed one's
//! slot is taken by the last, an added one takes the next slot (see `ruleset::pick`). Counted on
//! the transactions the dataplane applies (the kernel test `big_service_kernel.rs` counts the
//! kernel's own commit notices).

mod common;

use kproxy_nft_model::Op;
use kproxy_nftables::{Config, NftablesDataplane, Recording};
use kproxy_plan::{Plan, PlanDelta};
use serde_json::json;

/// Endpoints of the big Service.
const BIG: usize = 5_000;
/// Endpoints per EndpointSlice, as the EndpointSlice controller writes them by default.
const PER_SLICE: usize = 100;

/// Endpoint `j` of the initial set, in 198.18.64.0/19.
fn initial(j: usize) -> String {
    format!("198.18.{}.{}", 64 + j / 250, j % 250 + 1)
}

/// A replacement address, in 198.18.96.0/19: it sorts after every initial one (as a rollout's
/// new pods did in the cluster).
fn fresh(k: usize) -> String {
    format!("198.18.{}.{}", 96 + k / 250, k % 250 + 1)
}

/// The big Service (ClusterIP and, with `node_port`, a NodePort) with `endpoints`, in slices of
/// [`PER_SLICE`].
fn plan(endpoints: &[String], node_port: bool) -> Plan {
    let mut spec = json!({"clusterIP": "198.18.128.10", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]});
    if node_port {
        spec["type"] = json!("NodePort");
        spec["ports"][0]["nodePort"] = json!(30080);
    }
    let mut objects = vec![common::node(), common::service("default", "big", spec, json!({}))];
    for (s, chunk) in endpoints.chunks(PER_SLICE).enumerate() {
        let eps: Vec<_> = chunk.iter().map(|ip| common::ep(ip, "node-b")).collect();
        objects.push(common::slice(
            "default",
            "big",
            &s.to_string(),
            "IPv4",
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
            json!(eps),
        ));
    }
    common::planner().build(&common::state(objects))
}

/// The element operations of the transactions applied since `from`.
fn element_ops(dp: &NftablesDataplane<Recording>, from: usize) -> Vec<String> {
    let applied = &dp.executor().applied[from..];
    let ops = applied.iter().flat_map(|tx| tx.ops());
    ops.filter(|op| matches!(op, Op::AddElement(..) | Op::DeleteElement(..))).map(|op| format!("{op:?}")).collect()
}

/// Syncs `to` after `from` and returns the element operations it applied.
fn change(dp: &mut NftablesDataplane<Recording>, from: &Plan, to: &Plan) -> Vec<String> {
    let before = dp.executor().applied.len();
    dp.partial_sync(to, &PlanDelta::between(from, to)).unwrap();
    element_ops(dp, before)
}

#[test]
fn one_endpoint_replaced_in_a_service_of_5000_is_two_element_operations_per_destination() {
    for node_port in [false, true] {
        let destinations = if node_port { 2 } else { 1 };
        let mut endpoints: Vec<String> = (0..BIG).map(initial).collect();
        let first = plan(&endpoints, node_port);
        let mut dp = NftablesDataplane::new(Recording::default(), Config::default());
        dp.full_sync(&first).unwrap();
        let mut last = first;
        // The first, a middle and the last endpoint, each replaced by an address that sorts
        // after every other.
        for (k, j) in [0, BIG / 2, BIG - 1].into_iter().enumerate() {
            endpoints[j] = fresh(k);
            let next = plan(&endpoints, node_port);
            let ops = change(&mut dp, &last, &next);
            eprintln!("replace endpoint {j} of {BIG} (node port: {node_port}): {} element operations", ops.len());
            assert_eq!(ops.len(), 2 * destinations, "{ops:#?}");
            last = next;
        }
    }
}

#[test]
fn one_endpoint_added_or_removed_in_a_service_of_5000_is_at_most_three_element_operations() {
    let mut endpoints: Vec<String> = (0..BIG).map(initial).collect();
    let mut last = plan(&endpoints, false);
    let mut dp = NftablesDataplane::new(Recording::default(), Config::default());
    dp.full_sync(&last).unwrap();
    // Removed: the first (the last slot's endpoint moves into its slot), the last.
    for j in [0, BIG - 2] {
        endpoints.remove(j);
        let next = plan(&endpoints, false);
        let ops = change(&mut dp, &last, &next);
        eprintln!("remove one of {}: {} element operations", endpoints.len() + 1, ops.len());
        assert!((1..=3).contains(&ops.len()), "{ops:#?}");
        last = next;
    }
    // Added, at either end of the sorted order.
    for ip in ["198.18.0.200".to_owned(), fresh(0)] {
        endpoints.push(ip);
        endpoints.sort();
        let next = plan(&endpoints, false);
        let ops = change(&mut dp, &last, &next);
        eprintln!("add one to {}: {} element operations", endpoints.len() - 1, ops.len());
        assert_eq!(ops.len(), 1, "{ops:#?}");
        last = next;
    }
}


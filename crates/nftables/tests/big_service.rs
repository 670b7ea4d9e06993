#![allow(clippy::unwrap_used, clippy::panic)]
//! One endpoint change in a Service of 5,000 endpoints costs a few element operations, whatever
//! the Service's size: a replaced endpoint takes the slot its predecessor left, a removed one's
//! slot is taken by the last, an added one takes the next slot (see `ruleset::pick`). Counted on
//! the transactions the dataplane applies, and in a real kernel (in a namespace of its own) on
//! the kernel's own commit notices; a restart over the tables reads the slots back and writes
//! none of their elements.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use kproxy_nft_model::{Executor as _, Key, MapData, Op, SetFlag, Value};
use kproxy_nft_netlink::NetlinkExecutor;
use kproxy_nft_netlink::monitor::{Commit, Monitor, Notice};
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

/// The endpoint in each slot of the big Service's ClusterIP in the kernel's cluster TCP
/// endpoints maps, after checking the slots are `0..N`, hold `N` endpoints, and are all in the
/// map of `N`'s cap.
fn cluster_ip_slots(exec: &mut NetlinkExecutor) -> Vec<String> {
    let ctx = kproxy_nftables::ruleset::Ctx::new(kproxy_state::IpFamily::V4, "kproxy", 0x4000);
    let cluster_ip: std::net::IpAddr = "198.18.128.10".parse().unwrap();
    let mut elements = Vec::new();
    let mut maps = BTreeSet::new();
    for (_, def) in kproxy_nftables::ruleset::pick::endpoints_maps(&ctx) {
        if !def.name.starts_with("cluster-tcp-endpoints-") {
            continue;
        }
        for e in exec.elements(&ctx.table, &def).unwrap().unwrap() {
            if matches!(e.key.0.first(), Some(Value::Addr(a)) if *a == cluster_ip) {
                maps.insert(def.name.clone());
                elements.push(e);
            }
        }
    }
    let cap = elements.len().next_power_of_two();
    assert_eq!(maps, BTreeSet::from([format!("cluster-tcp-endpoints-{cap}")]), "the map of the endpoint count's cap");
    let mut slots = Vec::new();
    for e in elements {
        let [Value::Addr(a), _, _, Value::Int(slot)] = e.key.0.as_slice() else { continue };
        if *a != cluster_ip {
            continue;
        }
        let Some(MapData::Value(Key(v))) = &e.value else { panic!("{e:?}") };
        let [Value::Addr(ip), _] = v.as_slice() else { panic!("{e:?}") };
        slots.push((*slot, ip.to_string()));
    }
    slots.sort();
    let numbers: Vec<u32> = slots.iter().map(|(n, _)| *n).collect();
    assert_eq!(numbers, (0..slots.len() as u32).collect::<Vec<_>>(), "dense slots");
    let endpoints: Vec<String> = slots.into_iter().map(|(_, ip)| ip).collect();
    assert_eq!(endpoints.iter().collect::<BTreeSet<_>>().len(), endpoints.len(), "one endpoint per slot");
    endpoints
}

/// In a real kernel: the commit notices of one endpoint replaced in the big Service (ClusterIP
/// and NodePort) show 4 element operations, and none for anything else; removed and added
/// ones 1–3 per destination; the kernel holds exactly the plan's endpoints, densely; and a
/// restart over those tables writes no element but those of the sets of ranges (which have no
/// identity to compare), leaving every slot as it was.
#[test]
fn in_the_kernel_one_endpoint_replaced_in_a_service_of_5000_commits_four_element_operations() {
    kproxy_testbed::require_kernel!();
    let ns = kproxy_testbed::Netns::new("nft-big").unwrap();
    let mut endpoints: Vec<String> = (0..BIG).map(initial).collect();
    let first = plan(&endpoints, true);
    let tables = kproxy_nftables::tables(&Config::default());
    ns.run_in(|| {
        let mut dp = NftablesDataplane::new(NetlinkExecutor::new(), Config::default());
        dp.full_sync(&first).unwrap();
        // Opened after the cold start, whose notices would overflow it.
        let mut monitor =
            Monitor::open(&tables).unwrap().with_own_commits().with_timeout(Duration::from_secs(10)).unwrap();
        let mut last = first;
        let mut sync = |dp: &mut NftablesDataplane<NetlinkExecutor>, next: Plan, last: &mut Plan| -> Commit {
            dp.partial_sync(&next, &PlanDelta::between(last, &next)).unwrap();
            *last = next;
            match monitor.wait().unwrap() {
                Notice::Touched(commit) => commit,
                Notice::Overrun => panic!("notices lost"),
            }
        };
        for (k, j) in [0, BIG / 2].into_iter().enumerate() {
            endpoints[j] = fresh(k);
            let commit = sync(&mut dp, plan(&endpoints, true), &mut last);
            eprintln!("kernel: replace endpoint {j} of {BIG}: {commit:?}");
            assert_eq!((commit.elements_added, commit.elements_deleted, commit.objects), (2, 2, 0), "{commit:?}");
        }
        endpoints.remove(7);
        let commit = sync(&mut dp, plan(&endpoints, true), &mut last);
        eprintln!("kernel: remove one of {BIG}: {commit:?}");
        assert!(commit.elements() <= 6 && commit.objects == 0, "{commit:?}");
        endpoints.push(fresh(BIG));
        let commit = sync(&mut dp, plan(&endpoints, true), &mut last);
        eprintln!("kernel: add one to {}: {commit:?}", BIG - 1);
        assert_eq!((commit.elements_added, commit.elements_deleted, commit.objects), (2, 0, 0), "{commit:?}");

        let before = cluster_ip_slots(dp.executor_mut());
        let want: BTreeSet<&String> = endpoints.iter().collect();
        assert_eq!(before.iter().collect::<BTreeSet<_>>(), want);
        assert_ne!(
            before,
            {
                let mut s = before.clone();
                s.sort();
                s
            },
            "the slots are no longer in sorted order"
        );

        let ranges = range_elements(&last);
        let mut restarted = NftablesDataplane::new(NetlinkExecutor::new(), Config::default());
        let report = restarted.full_sync(&last).unwrap();
        assert_eq!(report.counts.elements, ranges, "a restart writes no element but those of range sets: {report:?}");
        assert_eq!(cluster_ip_slots(restarted.executor_mut()), before, "every endpoint kept its slot");
    })
    .unwrap();
}

/// How many elements of `plan`'s tables belong to sets of ranges.
fn range_elements(plan: &Plan) -> usize {
    let initial = NftablesDataplane::new(Recording::default(), Config::default()).render_initial(plan);
    let ranges: BTreeSet<(String, String)> = initial
        .ops()
        .iter()
        .filter_map(|op| match op {
            Op::AddSet(t, s) if s.has(SetFlag::Interval) => Some((t.to_string(), s.name.clone())),
            _ => None,
        })
        .collect();
    let of_ranges = |op: &&Op| matches!(op, Op::AddElement(t, e) if ranges.contains(&(t.to_string(), e.set.clone())));
    initial.ops().iter().filter(of_ranges).count()
}

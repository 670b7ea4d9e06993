//! The periodic check compares the kernel's listing of the auxiliary table with the summary
//! kproxy keeps of what it applied: the two must agree on an untouched table, or every check
//! would "repair" it; and its repairs must apply. Runs on the host kernel (nftables only, no
//! IPVS): the table the in-memory dataplane would apply is applied over netlink in a namespace
//! this test creates, then listed, damaged and repaired.

#![allow(clippy::unwrap_used)]

mod fake_world;

use fake_world::{World, svc_with_status, two_services};
use kproxy_ipvs::{Config, FakeHost, IpvsDataplane};
use kproxy_nft_model::{Executor as _, TableFamily, TableRef, Transaction};
use kproxy_nft_netlink::NetlinkExecutor;
use kproxy_nftables::kernel::{Desired, Drift, repair_ops};
use kproxy_packet_suite::NODE_A;
use kproxy_testbed::Netns;
use kproxy_testbed::kernel;
use serde_json::json;

#[test]
fn the_kernels_listing_of_the_aux_table_is_the_summary_kproxy_keeps() {
    if !kernel::require_root() {
        return;
    }
    // ClusterIPs, a NodePort (marks), a LoadBalancer with source ranges under the Local
    // policy (firewall sets, short-circuit maps), and the guard's `l4proto { tcp, udp, sctp }`
    // (an anonymous set in the kernel, which belongs to its rule and is not listed).
    let mut objects = two_services();
    objects.extend(svc_with_status(
        "lb",
        "198.18.128.12",
        &[("198.18.16.12", NODE_A)],
        json!({"type": "LoadBalancer", "externalTrafficPolicy": "Local",
            "loadBalancerSourceRanges": ["192.0.2.0/24"],
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080}]}),
        json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.12"}]}}),
    ));
    let world = World::new(objects);
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&world.plan, &world.full()).unwrap();
    let table = TableRef { family: TableFamily::Ip, name: "kproxy-ipvs".into() };
    let kept = dp.host().nft_tables.get(&table);
    assert!(kept.sets.values().any(|n| n.is_some_and(|n| n > 0)), "a table with elements: {kept:?}");

    let ns = Netns::new("ipvs-aux-listing").unwrap();
    let listed = ns
        .run_in(|| {
            let mut exec = NetlinkExecutor::new();
            for tx in &dp.host().nft {
                exec.apply(tx).unwrap();
            }
            exec.list(&table).unwrap().unwrap()
        })
        .unwrap();
    assert_eq!(listed.chains, kept.chains, "every chain with its rules, and no other");
    let drift = Drift::between(&listed, &kept);
    assert!(drift.is_empty(), "{drift:?}: {:?}", listed.drift(&kept));
    // The one set not counted: single-field ranges, whose kernel elements depend on how the
    // ranges were added.
    let uncounted: Vec<&String> = kept.sets.iter().filter(|(_, n)| n.is_none()).map(|(s, _)| s).collect();
    assert_eq!(uncounted, ["pod-cidrs"]);
}

/// The check's repair of a flushed chain, on a real kernel: `service-checks` ends with the
/// guard, whose `l4proto { tcp, udp, sctp }` is an anonymous set, so the repair's transaction
/// ends with a rule that takes three messages (this hung the netlink executor once).
#[test]
fn the_repair_of_a_flushed_guard_chain_applies_and_lists_as_kept() {
    if !kernel::require_root() {
        return;
    }
    let world = World::new(two_services());
    let mut dp = IpvsDataplane::new(FakeHost::new(), Config::default());
    dp.sync(&world.plan, &world.full()).unwrap();
    let table = TableRef { family: TableFamily::Ip, name: "kproxy-ipvs".into() };
    let kept = dp.host().nft_tables.get(&table);
    let whole = dp.host().nft[0].clone();
    let ns = Netns::new("ipvs-aux-repair").unwrap();
    ns.run_in(|| NetlinkExecutor::new().apply(&whole).unwrap()).unwrap();
    ns.nft("flush chain ip kproxy-ipvs service-checks").unwrap();
    let (drift, after) = ns
        .run_in(|| {
            let mut exec = NetlinkExecutor::new();
            let drift = Drift::between(&exec.list(&table).unwrap().unwrap(), &kept);
            let mut desired = Desired::default();
            for op in whole.into_ops() {
                desired.collect(&table, op);
            }
            let mut repair = Transaction::new();
            repair_ops(&table, desired, &drift, &mut repair);
            exec.apply(&repair).unwrap();
            (drift, exec.list(&table).unwrap().unwrap())
        })
        .unwrap();
    assert_eq!(drift.chains.iter().collect::<Vec<_>>(), ["service-checks"], "{drift:?}");
    assert!(Drift::between(&after, &kept).is_empty(), "{:?}", after.drift(&kept));
}

#![allow(clippy::unwrap_used)]
//! Rendering through the Recording executor: golden snapshot, syntax check by `nft -c`,
//! incremental syncs that cost O(change), stale chains, failure recovery.

mod common;

use kproxy_nftables::{Config, NftablesDataplane, Recording};
use kproxy_plan::{Plan, PlanDelta};
use serde_json::json;

fn dataplane() -> NftablesDataplane<Recording> {
    NftablesDataplane::new(Recording::default(), Config::default())
}

#[test]
fn golden_initial_ruleset_for_the_example_cluster() {
    let plan = common::example_plan();
    let tx = dataplane().render_initial(&plan);
    insta::assert_snapshot!(tx.render());
}

#[test]
fn a_full_sync_of_an_unchanged_plan_applies_nothing_and_a_node_change_reconciles_in_place() {
    let plan = common::example_plan();
    let mut dp = dataplane();
    assert!(dp.full_sync(&plan).unwrap().full);
    // The cold start, in as many transactions as it took.
    let first: String = dp.executor().applied.iter().map(|tx| tx.render()).collect();
    assert!(first.starts_with("add table ip kproxy { comment \"rules for kproxy\"; }\ndelete table ip kproxy\n"));
    let applied = dp.executor().applied.len();
    let report = dp.full_sync(&plan).unwrap();
    assert_eq!((report.ops, dp.executor().applied.len()), (0, applied), "steady state costs nothing");
    // A node-wide change rewrites the chains in one transaction, in place.
    let mut changed = plan.clone();
    for fam in changed.families.values_mut() {
        let cidr = if fam.family == kproxy_state::IpFamily::V6 { "fd00:ff::/64" } else { "203.0.113.0/24" };
        fam.node.service_cidrs.push(cidr.parse().unwrap());
    }
    dp.full_sync(&changed).unwrap();
    assert_eq!(dp.executor().applied.len(), applied + 1);
    let second = dp.executor().last().unwrap().render();
    assert!(!second.contains("delete table"), "{second}");
    assert!(second.contains("ip daddr 203.0.113.0/24 drop"), "{second}");
    // The affinity set keeps its entries across a reconciling full sync: declared again (a
    // no-op), never flushed nor deleted, while the static sets are flushed and refilled.
    assert!(first.contains("add set ip kproxy client-affinity "), "{first}");
    assert!(second.contains("flush set ip kproxy cluster-ips"), "{second}");
    assert!(!second.contains("flush set ip kproxy client-affinity") && !second.contains("delete set"), "{second}");
}

/// A restart while another program commits without a pause: the first listings meet its
/// commits, and the start waits for one that does not rather than rebuilding the tables (which
/// would delete them, their affinity sets and counters with them).
#[test]
fn a_restart_whose_first_listings_meet_commits_adopts_the_tables_rather_than_rebuilding_them() {
    let plan = common::example_plan();
    let mut before = dataplane();
    before.full_sync(&plan).unwrap();
    let tables = before.executor().tables.clone();
    let busy = Recording { tables, busy_lists: 3, ..Recording::default() };
    let mut restarted = NftablesDataplane::new(busy, Config::default());
    restarted.full_sync(&plan).unwrap();
    assert_eq!(restarted.executor().busy_lists, 0, "the busy listings were tried again");
    let tx = restarted.executor().last().unwrap().render();
    assert!(!tx.contains("delete table"), "adopted, not rebuilt: {tx}");
}

#[test]
fn after_a_failed_sync_the_next_adopts_the_tables_in_one_transaction_without_deleting_them() {
    let plan = common::example_plan();
    let fewer = services(1, &["198.18.17.2"], false);
    let mut dp = dataplane();
    dp.full_sync(&plan).unwrap();
    dp.executor_mut().fail_next = true;
    assert!(dp.partial_sync(&fewer, &PlanDelta::between(&plan, &fewer)).is_err());
    let applied = dp.executor().applied.len();
    let report = dp.partial_sync(&fewer, &PlanDelta::between(&plan, &fewer)).unwrap();
    assert!(report.full);
    assert_eq!(dp.executor().applied.len(), applied + 1, "one transaction");
    let tx = dp.executor().last().unwrap().render();
    assert!(!tx.contains("delete table ip kproxy"), "{tx}");
    assert!(tx.contains("flush map ip kproxy service-ips"), "{tx}");
    // What the example plan had and `fewer` has not is gone.
    assert!(tx.contains("delete chain ip kproxy service-"), "{tx}");
    // The kernel ends where a fresh start of `fewer` ends.
    let mut fresh = dataplane();
    fresh.full_sync(&fewer).unwrap();
    let table = kproxy_nft_model::TableRef { family: kproxy_nft_model::TableFamily::Ip, name: "kproxy".into() };
    assert_eq!(dp.executor().tables.get(&table), fresh.executor().tables.get(&table));
}

fn many_services(n: usize, web_endpoints: &[&str]) -> Plan {
    services(n, web_endpoints, false)
}

/// `n` services (with ClientIP affinity: chains of their own) and `web`.
fn services(n: usize, web_endpoints: &[&str], affinity: bool) -> Plan {
    let mut objects = vec![common::node()];
    for i in 0..n {
        let name = format!("s{i}");
        let ip = format!("198.19.{}.{}", i / 250, i % 250 + 1);
        let mut spec = json!({"clusterIP": ip, "ports": [{"name": "p", "port": 80}]});
        if affinity {
            spec["sessionAffinity"] = json!("ClientIP");
        }
        objects.push(common::service("bulk", &name, spec, json!({})));
        let ep1 = format!("198.18.{}.{}", 20 + i / 250, i % 250 + 1);
        objects.push(common::slice(
            "bulk",
            &name,
            "1",
            "IPv4",
            json!([{"name": "p", "port": 8080}]),
            json!([common::ep(&ep1, "node-b")]),
        ));
    }
    objects.push(common::service(
        "default",
        "web",
        json!({"clusterIP": "198.18.128.10", "ports": [{"name": "p", "port": 80}]}),
        json!({}),
    ));
    let eps: Vec<_> = web_endpoints.iter().map(|ip| common::ep(ip, "node-b")).collect();
    objects.push(common::slice("default", "web", "1", "IPv4", json!([{"name": "p", "port": 8080}]), json!(eps)));
    common::planner().build(&common::state(objects))
}

fn one_endpoint_change_ops(n: usize) -> (usize, String) {
    let before = many_services(n, &["198.18.17.2", "198.18.17.3"]);
    let after = many_services(n, &["198.18.17.2", "198.18.17.4"]);
    let mut dp = dataplane();
    dp.full_sync(&before).unwrap();
    let delta = PlanDelta::between(&before, &after);
    let report = dp.partial_sync(&after, &delta).unwrap();
    assert!(!report.full);
    (report.ops, dp.executor().last().unwrap().render())
}

#[test]
fn one_endpoint_change_costs_the_same_at_100_and_5000_services() {
    let (small, small_tx) = one_endpoint_change_ops(100);
    let (large, large_tx) = one_endpoint_change_ops(5000);
    assert_eq!(small, large, "small:\n{small_tx}\nlarge:\n{large_tx}");
    assert_eq!(small_tx, large_tx);
    // Only the slot's map element (the endpoints run on another node: no hairpin pair). No
    // rule, and no verdict element, so the kernel does not re-validate the table.
    assert_eq!(
        small_tx.lines().collect::<Vec<_>>(),
        [
            "delete element ip kproxy cluster-tcp-endpoints-2 { 198.18.128.10 . tcp . 80 . 0x1 }",
            "add element ip kproxy cluster-tcp-endpoints-2 { 198.18.128.10 . tcp . 80 . 0x1 : 198.18.17.4 . 8080 }",
        ]
    );
}

/// `web` with endpoints on this node and elsewhere, as `(address, node)`.
fn web_on_nodes(endpoints: &[(&str, &str)]) -> Plan {
    let objects = vec![
        common::node(),
        common::service(
            "default",
            "web",
            json!({"clusterIP": "198.18.128.10", "ports": [{"name": "p", "port": 80}]}),
            json!({}),
        ),
        common::slice(
            "default",
            "web",
            "1",
            "IPv4",
            json!([{"name": "p", "port": 8080}]),
            json!(endpoints.iter().map(|(ip, node)| common::ep(ip, node)).collect::<Vec<_>>()),
        ),
    ];
    common::planner().build(&common::state(objects))
}

#[test]
fn hairpin_pairs_are_written_for_endpoints_on_this_node_only() {
    let before = web_on_nodes(&[("198.18.16.2", "node-a"), ("198.18.17.2", "node-b")]);
    let mut dp = dataplane();
    dp.full_sync(&before).unwrap();
    let full = dp.executor().last().unwrap().render();
    let hairpin: Vec<&str> = full.lines().filter(|l| l.contains("element ip kproxy hairpin-endpoints")).collect();
    assert_eq!(hairpin, ["add element ip kproxy hairpin-endpoints { 198.18.16.2 . 198.18.16.2 }"], "{full}");
    // Both endpoints are picked from all the same.
    assert!(full.contains(": 198.18.16.2 . 8080 }") && full.contains(": 198.18.17.2 . 8080 }"), "{full}");

    // A local endpoint replaced: its pair goes with it, the new one's comes.
    let after = web_on_nodes(&[("198.18.16.3", "node-a"), ("198.18.17.2", "node-b")]);
    dp.partial_sync(&after, &PlanDelta::between(&before, &after)).unwrap();
    let tx = dp.executor().last().unwrap().render();
    let hairpin: Vec<&str> = tx.lines().filter(|l| l.contains("hairpin-endpoints")).collect();
    assert_eq!(
        hairpin,
        [
            "delete element ip kproxy hairpin-endpoints { 198.18.16.2 . 198.18.16.2 }",
            "add element ip kproxy hairpin-endpoints { 198.18.16.3 . 198.18.16.3 }",
        ],
        "{tx}"
    );
}

#[test]
fn scaling_a_service_changes_only_elements_and_moves_it_between_caps() {
    let before = many_services(3, &["198.18.17.2", "198.18.17.3"]);
    let after = many_services(3, &["198.18.17.2", "198.18.17.3", "198.18.17.4"]);
    let mut dp = dataplane();
    dp.full_sync(&before).unwrap();
    dp.partial_sync(&after, &PlanDelta::between(&before, &after)).unwrap();
    let tx = dp.executor().last().unwrap().render();
    assert_eq!(
        tx.lines().collect::<Vec<_>>(),
        [
            // The count crosses a power of two: every endpoint moves to cap 4's map.
            "delete element ip kproxy cluster-cap-2 { 198.18.128.10 . tcp . 80 }",
            "delete element ip kproxy cluster-tcp-endpoints-2 { 198.18.128.10 . tcp . 80 . 0x0 }",
            "delete element ip kproxy cluster-tcp-endpoints-2 { 198.18.128.10 . tcp . 80 . 0x1 }",
            "add element ip kproxy cluster-cap-4 { 198.18.128.10 . tcp . 80 }",
            "add element ip kproxy cluster-tcp-endpoints-4 { 198.18.128.10 . tcp . 80 . 0x0 : 198.18.17.2 . 8080 }",
            "add element ip kproxy cluster-tcp-endpoints-4 { 198.18.128.10 . tcp . 80 . 0x1 : 198.18.17.3 . 8080 }",
            "add element ip kproxy cluster-tcp-endpoints-4 { 198.18.128.10 . tcp . 80 . 0x2 : 198.18.17.4 . 8080 }",
        ]
    );
    // And back down.
    dp.partial_sync(&before, &PlanDelta::between(&after, &before)).unwrap();
    let tx = dp.executor().last().unwrap().render();
    assert!(tx.lines().all(|l| l.contains(" element ")), "{tx}");
    assert!(tx.contains("add element ip kproxy cluster-cap-2 { 198.18.128.10 . tcp . 80 }"), "{tx}");
}

#[test]
fn removed_service_chains_are_flushed_now_and_deleted_next_sync() {
    let before = services(2, &["198.18.17.2"], true);
    let after = services(1, &["198.18.17.2"], true);
    let mut dp = dataplane();
    dp.full_sync(&before).unwrap();
    dp.partial_sync(&after, &PlanDelta::between(&before, &after)).unwrap();
    let tx = dp.executor().last().unwrap().render();
    let chain = "service-";
    assert!(
        tx.lines().any(|l| l.starts_with("flush chain ip kproxy service-") && l.ends_with("bulk/s1/tcp/p")),
        "{tx}"
    );
    assert!(tx.contains("delete element ip kproxy service-ips { 198.19.0.2 . tcp . 80 }"), "{tx}");
    // Its sticky clients stay in the shared affinity set until they expire: nothing looks
    // them up again.
    assert!(!tx.contains("set ip kproxy client-affinity"), "{tx}");
    assert!(!tx.contains("delete chain"), "{tx}");
    dp.partial_sync(&after, &PlanDelta::default()).unwrap();
    let tx = dp.executor().last().unwrap().render();
    assert!(tx.lines().all(|l| l.starts_with("delete chain ip kproxy ") && l.contains(chain)), "{tx}");
    assert_eq!(tx.lines().count(), 1, "{tx}");
    let applied = dp.executor().applied.len();
    dp.partial_sync(&after, &PlanDelta::default()).unwrap();
    assert_eq!(dp.executor().applied.len(), applied, "nothing left to apply");
}

#[test]
fn a_stale_chain_that_cannot_be_deleted_is_a_cleanup_failure_retried_by_the_next_sync() {
    // With affinity, a service port has chains of its own.
    let before = services(2, &["198.18.17.2"], true);
    let after = services(1, &["198.18.17.2"], true);
    let mut dp = dataplane();
    dp.full_sync(&before).unwrap();
    dp.partial_sync(&after, &PlanDelta::between(&before, &after)).unwrap();
    assert!(dp.take_cleanup_failures().is_empty());
    // The deletion is a transaction of its own: its failure leaves the sync itself standing.
    dp.executor_mut().fail_next = true;
    let scaled = services(1, &["198.18.17.2", "198.18.17.3"], true);
    dp.partial_sync(&scaled, &PlanDelta::between(&after, &scaled)).unwrap();
    assert_eq!(dp.take_cleanup_failures(), vec![kproxy_state::IpFamily::V4]);
    assert!(dp.take_cleanup_failures().is_empty(), "each failure is reported once");
    let tx = dp.executor().last().unwrap().render();
    assert!(tx.contains("198.18.17.3") && !tx.contains("delete chain"), "the sync went on: {tx}");
    // The next sync deletes the chain and reports nothing.
    dp.partial_sync(&scaled, &PlanDelta::default()).unwrap();
    let tx = dp.executor().last().unwrap().render();
    assert!(tx.lines().any(|l| l.starts_with("delete chain ip kproxy service-")), "{tx}");
    assert!(dp.take_cleanup_failures().is_empty());
    let mut fresh = dataplane();
    fresh.full_sync(&scaled).unwrap();
    let table = kproxy_nft_model::TableRef { family: kproxy_nft_model::TableFamily::Ip, name: "kproxy".into() };
    assert_eq!(dp.executor().tables.get(&table), fresh.executor().tables.get(&table));
}

/// Two services claiming one external IP and port (a conflict in the cluster), each with one
/// endpoint shared with the other, on this node (so it has a hairpin pair, which both want).
fn rivals(with_a: bool) -> Plan {
    let mut objects = vec![common::node()];
    let mut add = |name: &str, cluster_ip: &str, ep: &str, port: u16| {
        objects.push(common::service(
            "default",
            name,
            json!({"clusterIP": cluster_ip, "externalIPs": ["203.0.113.50"], "ports": [{"name": "p", "port": 80}]}),
            json!({}),
        ));
        objects.push(common::slice(
            "default",
            name,
            "1",
            "IPv4",
            json!([{"name": "p", "port": port}]),
            json!([common::ep(ep, "node-a")]),
        ));
    };
    if with_a {
        add("a", "198.18.128.60", "198.18.17.60", 8080);
    }
    add("b", "198.18.128.61", "198.18.17.60", 9090);
    common::planner().build(&common::state(objects))
}

#[test]
fn a_contested_destination_belongs_to_the_first_claimant_and_passes_on_when_it_goes() {
    let (both, only_b) = (rivals(true), rivals(false));
    let mut dp = dataplane();
    dp.full_sync(&both).unwrap();
    let first: String = dp.executor().applied.iter().map(|tx| tx.render()).collect();
    let slot = "cluster-tcp-endpoints-1 { 203.0.113.50 . tcp . 80 . 0x0 : 198.18.17.60";
    let claimed: Vec<&str> = first.lines().filter(|l| l.contains(slot)).collect();
    assert_eq!(
        claimed,
        ["add element ip kproxy cluster-tcp-endpoints-1 { 203.0.113.50 . tcp . 80 . 0x0 : 198.18.17.60 . 8080 }"]
    );
    assert_eq!(first.matches("hairpin-endpoints { 198.18.17.60 . 198.18.17.60 }").count(), 1);

    dp.partial_sync(&only_b, &PlanDelta::between(&both, &only_b)).unwrap();
    let tx = dp.executor().last().unwrap().render();
    assert!(tx.contains("delete element ip kproxy cluster-tcp-endpoints-1 { 203.0.113.50 . tcp . 80 . 0x0 }"), "{tx}");
    assert!(
        tx.contains(
            "add element ip kproxy cluster-tcp-endpoints-1 { 203.0.113.50 . tcp . 80 . 0x0 : 198.18.17.60 . 9090 }"
        ),
        "{tx}"
    );
    // Both send the external IP to the same shared chain: that element stays.
    assert!(!tx.contains("service-ips { 203.0.113.50"), "{tx}");
    // The endpoint is still wanted by b: its hairpin pair stays; a's ClusterIP goes.
    assert!(!tx.contains("hairpin-endpoints"), "{tx}");
    assert!(tx.contains("delete element ip kproxy cluster-ips { 198.18.128.60 }"), "{tx}");

    // And back: a wins again.
    dp.partial_sync(&both, &PlanDelta::between(&only_b, &both)).unwrap();
    let tx = dp.executor().last().unwrap().render();
    assert!(
        tx.contains(
            "add element ip kproxy cluster-tcp-endpoints-1 { 203.0.113.50 . tcp . 80 . 0x0 : 198.18.17.60 . 8080 }"
        ),
        "{tx}"
    );
}

#[test]
fn source_ranges_go_in_as_disjoint_ranges_of_the_shared_firewall_set() {
    let objects = vec![
        common::node(),
        common::service(
            "default",
            "lb",
            json!({"type": "LoadBalancer", "clusterIP": "198.18.128.70", "ports": [{"name": "p", "port": 80, "nodePort": 30070}],
                   "loadBalancerSourceRanges": ["198.51.100.0/24", "198.51.100.128/25", "198.18.0.0/16"]}),
            json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.70"}]}}),
        ),
        common::slice(
            "default",
            "lb",
            "1",
            "IPv4",
            json!([{"name": "p", "port": 8080}]),
            json!([common::ep("198.18.17.70", "node-b")]),
        ),
    ];
    let plan = common::planner().build(&common::state(objects));
    let tx = dataplane().render_initial(&plan).render();
    let allowed: Vec<&str> = tx.lines().filter(|l| l.starts_with("add element ip kproxy firewall-allow")).collect();
    // The /25 lies inside the /24 (the kernel would ignore it, and then refuse to delete it); the
    // node's own address is in a range, so the LB IP is allowed as a source too.
    assert_eq!(
        allowed,
        [
            "add element ip kproxy firewall-allow { 203.0.113.70 . tcp . 80 . 198.18.0.0/16 }",
            "add element ip kproxy firewall-allow { 203.0.113.70 . tcp . 80 . 198.51.100.0/24 }",
            "add element ip kproxy firewall-allow { 203.0.113.70 . tcp . 80 . 203.0.113.70/32 }",
        ]
    );
    assert!(tx.contains("add element ip kproxy firewall-dests { 203.0.113.70 . tcp . 80 }"), "{tx}");
    assert!(!tx.lines().any(|l| l.starts_with("add chain") && l.contains("default/lb/")), "no chain of its own: {tx}");
}

/// A full affinity set fails the update, and with it the rule: after the cascade that records
/// the pick comes the same cascade without recording it, so a new client still reaches an
/// endpoint (unstuck) rather than falling off the chain without DNAT.
#[test]
fn an_affinity_chain_ends_in_a_cascade_that_needs_no_room_in_the_affinity_set() {
    let mut dp = dataplane();
    dp.full_sync(&common::example_plan()).unwrap();
    let text: String = dp.executor().applied.iter().map(|tx| tx.render()).collect();
    let prefix = "add rule ip kproxy service-BPKTVXJ3-default/lb/tcp/https ";
    let rules: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix(prefix)).collect();
    let target = |r: &str| r.split(" dnat to ").nth(1).map(|t| t.split(' ').next().unwrap_or_default().to_owned());
    let hits: Vec<&&str> = rules.iter().filter(|r| r.contains("@client-affinity update @client-affinity")).collect();
    let recorded: Vec<&&str> = rules
        .iter()
        .filter(|r| r.contains("update @client-affinity") && !r.contains("@client-affinity update"))
        .collect();
    let unrecorded: Vec<&&str> = rules.iter().filter(|r| r.contains(" dnat to ") && !r.contains("affinity")).collect();
    assert_eq!((hits.len(), recorded.len(), unrecorded.len()), (2, 2, 2), "{rules:#?}");
    let last = rules.len() - 2;
    assert_eq!(&rules[last..], unrecorded.iter().map(|r| **r).collect::<Vec<_>>(), "the unrecorded cascade is last");
    assert!(unrecorded[0].starts_with("numgen random mod 2 == 0 ") && !unrecorded[1].contains("numgen"), "{rules:#?}");
    let targets = |rs: &[&&str]| rs.iter().map(|r| target(r)).collect::<Vec<_>>();
    assert_eq!(targets(&recorded), targets(&unrecorded), "both cascades draw from the same endpoints");
}

//! The periodic check on the in-memory kernel ([`FakeHost`]): an untouched kernel is read, not
//! written; each kind of drift is repaired where it is, reported, and nothing else is written.

#![allow(clippy::unwrap_used)]

mod fake_world;

use fake_world::{World, cip, dest, two_services};
use kproxy_ipvs::{Config, DestSpec, FakeHost, Host as _, IpvsDataplane, IpvsOp, ServiceKey, ServiceSpec};
use kproxy_nft_model::{Op, TableFamily, TableRef};
use kproxy_plan::Verified;
use kproxy_state::Protocol;

fn table() -> TableRef {
    TableRef { family: TableFamily::Ip, name: "kproxy-ipvs".into() }
}

/// Two services synced, the log cleared: what a periodic check starts from.
fn synced(config: Config) -> (World, IpvsDataplane<FakeHost>) {
    let world = World::new(two_services());
    let mut dp = IpvsDataplane::new(FakeHost::new(), config);
    dp.sync(&world.plan, &world.full()).unwrap();
    dp.host_mut().clear_log();
    (world, dp)
}

fn repaired(v: Verified) -> Vec<String> {
    match v {
        Verified::Repaired(lines) => lines,
        other => panic!("expected a repair, got {other:?}"),
    }
}

/// The set or chain an auxiliary-table operation is about.
fn object(op: &Op) -> Option<&str> {
    match op {
        Op::AddSet(_, s) => Some(&s.name),
        Op::FlushSet { name, .. } => Some(name),
        Op::AddElement(_, e) => Some(&e.set),
        Op::AddChain(_, c) => Some(&c.name),
        Op::FlushChain(_, c) => Some(c),
        Op::AddRule { chain, .. } => Some(chain),
        _ => None,
    }
}

fn nft_ops(dp: &IpvsDataplane<FakeHost>) -> Vec<Op> {
    dp.host().nft.iter().flat_map(|tx| tx.ops().to_vec()).collect()
}

#[test]
fn an_untouched_kernel_is_clean_read_in_one_table_dump_and_not_written() {
    let (world, mut dp) = synced(Config::default());
    assert_eq!(dp.verify(&world.plan).unwrap(), Verified::Clean);
    let host = dp.host();
    assert!(host.log.is_empty(), "nothing written: {:?}", host.log);
    assert_eq!(host.dumps, 1, "one read of the whole IPVS table, not one per virtual service");
    // Nobody committed to nf_tables since kproxy's sync: the auxiliary table is not listed.
    assert_eq!(host.nft_listings, 0);
    // The old periodic check, a full sync, for contrast: it writes the auxiliary table anew
    // (it too reads IPVS in one dump of the whole table).
    dp.full_sync(&world.plan).unwrap();
    assert_eq!(dp.host().dumps, 2, "one read of the whole table by the full sync");
    assert_eq!(dp.host().nft.len(), 1);
}

#[test]
fn a_commit_elsewhere_costs_one_listing_and_no_repair() {
    let (world, mut dp) = synced(Config::default());
    dp.verify(&world.plan).unwrap();
    dp.host_mut().clear_log();
    // Someone commits to another table: the generation moves, kproxy's tables do not.
    dp.host_mut().tamper_nft(|_| {});
    assert_eq!(dp.verify(&world.plan).unwrap(), Verified::Clean);
    assert_eq!(dp.host().nft_listings, 1);
    assert!(dp.host().log.is_empty(), "{:?}", dp.host().log);
}

#[test]
fn a_deleted_virtual_service_is_created_again_with_its_real_servers_and_nothing_else() {
    let (world, mut dp) = synced(Config::default());
    dp.host_mut().ipvs(&IpvsOp::DeleteService(cip("198.18.128.10"))).unwrap();
    dp.host_mut().clear_log();
    let lines = repaired(dp.verify(&world.plan).unwrap());
    assert_eq!(lines, ["IPVS virtual service tcp 198.18.128.10:80 is missing"]);
    let ops = &dp.host().ipvs_ops;
    assert!(matches!(&ops[0], IpvsOp::AddService(s) if s.key == cip("198.18.128.10")), "{ops:?}");
    let dests: Vec<IpvsOp> = ["198.18.16.10", "198.18.17.10"]
        .iter()
        .map(|ip| IpvsOp::AddDest(cip("198.18.128.10"), DestSpec { key: dest(ip), weight: 1 }))
        .collect();
    assert_eq!(ops[1..], dests[..]);
    assert_eq!(dp.host().log.len(), 3, "IPVS only: {:?}", dp.host().log);
    assert_eq!(dp.verify(&world.plan).unwrap(), Verified::Clean, "repaired for good");
}

#[test]
fn a_removed_real_server_is_added_back_and_a_reweighted_one_is_reset() {
    let (world, mut dp) = synced(Config::default());
    let web = cip("198.18.128.10");
    dp.host_mut().ipvs(&IpvsOp::DeleteDest(web, dest("198.18.16.10"))).unwrap();
    dp.host_mut().ipvs(&IpvsOp::UpdateDest(web, DestSpec { key: dest("198.18.17.10"), weight: 5 })).unwrap();
    dp.host_mut().clear_log();
    let lines = repaired(dp.verify(&world.plan).unwrap());
    assert_eq!(
        lines,
        [
            "real server 198.18.16.10:8080 of IPVS virtual service tcp 198.18.128.10:80 is missing",
            "real server 198.18.17.10:8080 of IPVS virtual service tcp 198.18.128.10:80 has weight 5, expected 1",
        ]
    );
    assert_eq!(
        dp.host().ipvs_ops,
        [
            IpvsOp::AddDest(web, DestSpec { key: dest("198.18.16.10"), weight: 1 }),
            IpvsOp::UpdateDest(web, DestSpec { key: dest("198.18.17.10"), weight: 1 }),
        ]
    );
    assert_eq!(dp.host().log.len(), 2, "{:?}", dp.host().log);
}

#[test]
fn unexpected_virtual_services_in_kproxys_range_are_deleted_and_foreign_ones_kept() {
    let config = Config { exclude_cidrs: vec!["192.0.2.0/24".parse().unwrap()], ..Config::default() };
    let (world, mut dp) = synced(config);
    let stray = cip("198.18.128.99");
    let foreign = ServiceKey::Addr { addr: "192.0.2.1".parse().unwrap(), protocol: Protocol::Tcp, port: 80 };
    let foreign_mark = ServiceKey::Fwmark { family: kproxy_state::IpFamily::V4, mark: 7 };
    for key in [stray, foreign, foreign_mark] {
        let spec = ServiceSpec { key, scheduler: "rr".into(), flags: 0, timeout: 0 };
        dp.host_mut().ipvs(&IpvsOp::AddService(spec)).unwrap();
    }
    dp.host_mut().clear_log();
    let lines = repaired(dp.verify(&world.plan).unwrap());
    assert_eq!(lines, ["unexpected IPVS virtual service tcp 198.18.128.99:80"]);
    assert_eq!(dp.host().ipvs_ops, [IpvsOp::DeleteService(stray)]);
    assert!(dp.host().services.contains_key(&foreign) && dp.host().services.contains_key(&foreign_mark));
}

#[test]
fn a_removed_vip_address_is_added_back_and_a_stray_one_removed() {
    let (world, mut dp) = synced(Config::default());
    let index = dp.host().links["kube-ipvs0"].index;
    dp.host_mut().set_address(index, "198.18.128.11".parse().unwrap(), false).unwrap();
    dp.host_mut().set_address(index, "198.18.128.77".parse().unwrap(), true).unwrap();
    dp.host_mut().clear_log();
    let lines = repaired(dp.verify(&world.plan).unwrap());
    assert_eq!(
        lines,
        ["address 198.18.128.11 is missing from kube-ipvs0", "unexpected address 198.18.128.77 on kube-ipvs0"]
    );
    assert_eq!(dp.host().log, ["addr add 198.18.128.11", "addr del 198.18.128.77"]);
}

#[test]
fn a_flushed_aux_set_is_refilled_and_nothing_else_is_written() {
    let (world, mut dp) = synced(Config::default());
    dp.host_mut().tamper_nft(|t| {
        t.0.get_mut(&table()).unwrap().sets.insert("vips".into(), Some(0));
    });
    let lines = repaired(dp.verify(&world.plan).unwrap());
    assert_eq!(lines, ["ip kproxy-ipvs: set vips has 0 elements, expected 2"]);
    let ops = nft_ops(&dp);
    assert!(ops.iter().any(|op| matches!(op, Op::FlushSet { name, .. } if name == "vips")), "{ops:?}");
    assert_eq!(ops.iter().filter(|op| matches!(op, Op::AddElement(..))).count(), 2, "{ops:?}");
    assert!(ops.iter().all(|op| object(op) == Some("vips")), "only the set: {ops:?}");
    assert_eq!(dp.host().log.len(), 1, "one transaction, no IPVS or address change: {:?}", dp.host().log);
    dp.host_mut().clear_log();
    assert_eq!(dp.verify(&world.plan).unwrap(), Verified::Clean);
}

#[test]
fn a_flushed_aux_chain_is_rewritten_and_nothing_else_is_written() {
    let (world, mut dp) = synced(Config::default());
    let rules = dp.host().nft_tables.get(&table()).chains["service-checks"];
    dp.host_mut().tamper_nft(|t| {
        t.0.get_mut(&table()).unwrap().chains.insert("service-checks".into(), 0);
    });
    let lines = repaired(dp.verify(&world.plan).unwrap());
    assert_eq!(lines, [format!("ip kproxy-ipvs: chain service-checks has 0 rules, expected {rules}")]);
    let ops = nft_ops(&dp);
    assert_eq!(ops.iter().filter(|op| matches!(op, Op::AddRule { .. })).count(), rules, "{ops:?}");
    assert!(ops.iter().all(|op| object(op) == Some("service-checks")), "only the chain: {ops:?}");
    assert!(dp.host().ipvs_ops.is_empty());
}

#[test]
fn a_deleted_aux_table_is_built_again_and_ipvs_is_left_alone() {
    let (world, mut dp) = synced(Config::default());
    let before = dp.host().nft_tables.get(&table());
    dp.host_mut().tamper_nft(|t| {
        t.0.remove(&table());
    });
    let lines = repaired(dp.verify(&world.plan).unwrap());
    assert_eq!(lines, ["ip kproxy-ipvs: the table is gone"]);
    assert_eq!(dp.host().nft_tables.get(&table()), before, "the whole table is back");
    assert_eq!(dp.host().log.len(), 1, "one transaction, nothing else: {:?}", dp.host().log);
}

#[test]
fn a_changed_sysctl_is_set_again() {
    let (world, mut dp) = synced(Config::default());
    dp.host_mut().sysctls.insert("net/ipv4/vs/conntrack".into(), "0".into());
    let lines = repaired(dp.verify(&world.plan).unwrap());
    assert_eq!(lines, ["sysctl net/ipv4/vs/conntrack was 0, set to 1"]);
    assert_eq!(dp.host().log, ["sysctl net/ipv4/vs/conntrack=1"]);
}

#[test]
fn a_deleted_dummy_interface_falls_back_to_a_full_sync() {
    let (world, mut dp) = synced(Config::default());
    let index = dp.host().links["kube-ipvs0"].index;
    dp.host_mut().delete_link(index).unwrap();
    let lines = repaired(dp.verify(&world.plan).unwrap());
    assert_eq!(lines, ["interface kube-ipvs0 is gone or was replaced"]);
    let link = &dp.host().links["kube-ipvs0"];
    assert_eq!(link.addresses.len(), 2, "{link:?}");
    assert_eq!(dp.verify(&world.plan).unwrap(), Verified::Clean);
}

#[test]
fn a_draining_real_server_someone_deleted_is_not_drift() {
    let (mut world, mut dp) = synced(Config::default());
    let web = cip("198.18.128.10");
    dp.host_mut().set_active(&web, &dest("198.18.17.10"), 1);
    let delta = world.apply(fake_world::svc(
        "web",
        "198.18.128.10",
        &[("198.18.16.10", kproxy_packet_suite::NODE_A)],
        serde_json::json!({}),
    ));
    dp.sync(&world.plan, &delta).unwrap();
    assert_eq!(dp.draining().count(), 1);
    dp.host_mut().ipvs(&IpvsOp::DeleteDest(web, dest("198.18.17.10"))).unwrap();
    dp.host_mut().clear_log();
    assert_eq!(dp.verify(&world.plan).unwrap(), Verified::Clean);
    assert_eq!(dp.draining().count(), 0, "forgotten");
    assert!(dp.host().log.is_empty(), "{:?}", dp.host().log);
}

#[test]
fn a_check_after_a_failed_sync_is_a_full_sync() {
    let (mut world, mut dp) = synced(Config::default());
    let delta = world.apply(fake_world::svc(
        "db",
        "198.18.128.11",
        &[("198.18.16.12", kproxy_packet_suite::NODE_A)],
        serde_json::json!({}),
    ));
    dp.host_mut().fail_next_ipvs = true;
    assert!(dp.sync(&world.plan, &delta).is_err());
    assert_eq!(dp.verify(&world.plan).unwrap(), Verified::Rewritten);
    let db = &dp.host().services[&cip("198.18.128.11")];
    assert_eq!(db.dests.keys().copied().collect::<Vec<_>>(), [dest("198.18.16.12")]);
}

#[test]
fn a_check_that_cannot_list_the_busy_aux_table_says_so_writes_nothing_and_lists_it_next_time() {
    let (world, mut dp) = synced(Config::default());
    dp.verify(&world.plan).unwrap();
    // Another program commits, and keeps committing while kproxy lists.
    dp.host_mut().tamper_nft(|_| {});
    dp.host_mut().nft_busy = true;
    dp.host_mut().clear_log();
    assert_eq!(dp.verify(&world.plan).unwrap(), Verified::Busy);
    assert!(dp.host().log.is_empty(), "nothing written: {:?}", dp.host().log);
    // Still in sync: the next check is a check (one more listing), not a full sync.
    dp.host_mut().nft_busy = false;
    let listings = dp.host().nft_listings;
    assert_eq!(dp.verify(&world.plan).unwrap(), Verified::Clean);
    assert_eq!(dp.host().nft_listings, listings + 1, "listed at the next check");
    assert!(dp.host().log.is_empty(), "no full sync: {:?}", dp.host().log);
}

#![allow(clippy::unwrap_used)]
//! The counter read-back against the real kernel, in a namespace the test creates: packets
//! counted by a rule's `counter` statement are what `nft` lists for it.

use kproxy_nft_model::{Chain, ChainType, Executor, HookPoint, Op, Rule, Stmt, TableFamily, TableRef, Transaction};
use kproxy_nft_netlink::NetlinkExecutor;
use kproxy_nft_netlink::counters::chain_packets;
use kproxy_testbed::Netns;
use kproxy_testbed::kernel::require_root;
use serde_json::Value;

#[test]
fn counted_packets_are_read_over_netlink() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("counters").unwrap();
    let t = TableRef { family: TableFamily::Inet, name: "kproxy-counters".into() };
    let mut tx = Transaction::new();
    tx.push(Op::AddTable { table: t.clone(), comment: None });
    tx.push(Op::AddChain(t.clone(), Chain::base("out", ChainType::Filter, HookPoint::Output, 0)));
    tx.add_rules(&t, "out", [Rule::from(Stmt::Counter), Rule::from(Stmt::Counter)]);
    let (before, after) = ns
        .run_in(|| {
            let mut exec = NetlinkExecutor::new();
            exec.apply(&tx).unwrap();
            let before = chain_packets(&mut exec, &t, "out").unwrap();
            // Five datagrams over the namespace's loopback, each through the output hook once.
            let receiver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let sender = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            for _ in 0..5 {
                sender.send_to(b"counted", receiver.local_addr().unwrap()).unwrap();
            }
            (before, chain_packets(&mut exec, &t, "out").unwrap())
        })
        .unwrap();
    let listing: Value =
        serde_json::from_str(&ns.exec_ok("nft", &["-j", "list", "chain", "inet", "kproxy-counters", "out"]).unwrap())
            .unwrap();
    let listed: u64 = listing["nftables"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|item| item["rule"]["expr"][0]["counter"]["packets"].as_u64())
        .sum();
    assert_eq!(before, Some(0));
    let after = after.unwrap();
    // Both rules counted every datagram.
    assert!(after >= 2 * 5, "{after}");
    assert_eq!(after, listed, "{listing}");
    // A chain that does not exist has no counter (not a count of zero).
    ns.run_in(|| assert_eq!(chain_packets(&mut NetlinkExecutor::new(), &t, "missing").unwrap(), None)).unwrap();
}

//! The ctnetlink client against the kernel, on entries inserted with `conntrack -I` in a
//! namespace of the test's own.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may unwrap

mod common;

use std::net::IpAddr;

use common::*;
use kproxy_conntrack::netlink::ConntrackSocket;
use kproxy_conntrack::{Flow, Tuple};
use kproxy_state::{IpFamily, Protocol};

fn insert(netns: &Netns, args: &str) {
    let mut all = vec!["-I"];
    all.extend(args.split_whitespace());
    all.extend(["-t", "120"]);
    netns.exec("conntrack", &all);
}

fn tuple(src: &str, src_port: u16, dst: &str, dst_port: u16) -> Tuple {
    let ip = |text: &str| -> IpAddr { text.parse().unwrap() };
    Tuple { src: ip(src), dst: ip(dst), src_port, dst_port }
}

/// A namespace with a few inserted entries (no rules are needed to hold or list them).
fn populated() -> Netns {
    let netns = Netns::new("nl");
    insert(
        &netns,
        "-p udp -s 198.18.1.2 -d 198.18.128.10 --sport 40000 --dport 53 -r 198.18.2.2 -q 198.18.1.2 --reply-port-src 8053 --reply-port-dst 40000",
    );
    insert(
        &netns,
        "-p tcp -s 198.18.1.2 -d 198.18.128.12 --sport 40003 --dport 80 -r 198.18.4.2 -q 198.18.1.2 --reply-port-src 8080 --reply-port-dst 40003 --state ESTABLISHED",
    );
    insert(
        &netns,
        "-p sctp -s 198.18.1.2 -d 198.18.128.11 --sport 40002 --dport 9000 -r 198.18.3.2 -q 198.18.1.2 --reply-port-src 9001 --reply-port-dst 40002 --state ESTABLISHED --orig-vtag 1 --reply-vtag 2",
    );
    insert(
        &netns,
        "-p udp -s fd00::1:2 -d fd00::80:a --sport 40001 --dport 53 -r fd00::2:2 -q fd00::1:2 --reply-port-src 8053 --reply-port-dst 40001 -w 7",
    );
    netns
}

fn without_id(flows: &[Flow]) -> Vec<Flow> {
    flows.iter().map(|flow| Flow { id: None, ..*flow }).collect()
}

#[test]
fn dumps_each_family_and_protocol_separately() {
    if !kernel_tests_enabled("dumps_each_family_and_protocol_separately") {
        return;
    }
    let netns = populated();
    let mut socket = netns.enter(ConntrackSocket::open).unwrap();
    let udp = socket.dump(IpFamily::V4, Protocol::Udp).unwrap();
    assert_eq!(
        without_id(&udp.flows),
        vec![Flow {
            protocol: Protocol::Udp,
            original: tuple("198.18.1.2", 40000, "198.18.128.10", 53),
            reply: tuple("198.18.2.2", 8053, "198.18.1.2", 40000),
            zone: 0,
            id: None,
        }]
    );
    assert!(udp.flows[0].id.is_some(), "the kernel reports ids");
    assert!(!udp.interrupted && udp.undecodable == 0);
    assert_eq!(udp.ignored_by_kernel_filter, 0, "the kernel filtered the dump to UDP");

    let sctp = socket.dump(IpFamily::V4, Protocol::Sctp).unwrap();
    assert_eq!(sctp.flows.len(), 1);
    assert_eq!(sctp.flows[0].reply, tuple("198.18.3.2", 9001, "198.18.1.2", 40002));
    let tcp = socket.dump(IpFamily::V4, Protocol::Tcp).unwrap();
    assert_eq!(tcp.flows.len(), 1);
    assert_eq!(tcp.flows[0].original.dst_port, 80);

    let v6 = socket.dump(IpFamily::V6, Protocol::Udp).unwrap();
    assert_eq!(v6.flows.len(), 1);
    assert_eq!(v6.flows[0].zone, 7);
    assert_eq!(v6.flows[0].original, tuple("fd00::1:2", 40001, "fd00::80:a", 53));
    assert!(socket.dump(IpFamily::V6, Protocol::Sctp).unwrap().flows.is_empty());
}

#[test]
fn deletes_only_the_entry_with_the_dumped_id() {
    if !kernel_tests_enabled("deletes_only_the_entry_with_the_dumped_id") {
        return;
    }
    let netns = populated();
    let mut socket = netns.enter(ConntrackSocket::open).unwrap();
    let flow = socket.dump(IpFamily::V4, Protocol::Udp).unwrap().flows[0];

    let wrong_id = Flow { id: flow.id.map(|id| id ^ 1), ..flow };
    let outcome = socket.delete(&[wrong_id]).unwrap();
    assert_eq!((outcome.deleted, outcome.not_found), (0, 1), "another id is another entry");
    assert_eq!(socket.dump(IpFamily::V4, Protocol::Udp).unwrap().flows, vec![flow]);

    let outcome = socket.delete(&[flow]).unwrap();
    assert_eq!((outcome.deleted, outcome.not_found, outcome.failed.len()), (1, 0, 0));
    assert!(socket.dump(IpFamily::V4, Protocol::Udp).unwrap().flows.is_empty());
    assert_eq!(socket.dump(IpFamily::V4, Protocol::Tcp).unwrap().flows.len(), 1, "other entries stay");

    let outcome = socket.delete(&[flow]).unwrap();
    assert_eq!((outcome.deleted, outcome.not_found), (0, 1), "already gone");
}

#[test]
fn deletes_an_entry_in_a_zone() {
    if !kernel_tests_enabled("deletes_an_entry_in_a_zone") {
        return;
    }
    let netns = populated();
    let mut socket = netns.enter(ConntrackSocket::open).unwrap();
    let flow = socket.dump(IpFamily::V6, Protocol::Udp).unwrap().flows[0];
    assert_eq!(socket.delete(&[Flow { zone: 0, ..flow }]).unwrap().not_found, 1, "zone 0 has no such entry");
    assert_eq!(socket.delete(&[flow]).unwrap().deleted, 1);
    assert!(socket.dump(IpFamily::V6, Protocol::Udp).unwrap().flows.is_empty());
}

#[test]
fn dumps_and_deletes_more_entries_than_fit_one_datagram_or_batch() {
    if !kernel_tests_enabled("dumps_and_deletes_more_entries_than_fit_one_datagram_or_batch") {
        return;
    }
    let netns = Netns::new("many");
    let count: u16 = 400;
    let mut script = String::new();
    for port in 0..count {
        script.push_str(&format!(
            "-I -p udp -s 198.18.1.2 -d 198.18.128.10 --sport {} --dport 53 -r 198.18.2.2 -q 198.18.1.2 \
             --reply-port-src 8053 --reply-port-dst {} -t 120\n",
            20000 + port,
            20000 + port
        ));
    }
    let file = std::env::temp_dir().join(format!("{}.conntrack", netns.name()));
    std::fs::write(&file, script).unwrap();
    let loaded = std::process::Command::new("ip")
        .args(["netns", "exec", netns.name(), "conntrack", "-R"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    if !loaded.status.success() {
        // conntrack -R is not in every conntrack-tools build: insert one by one.
        for port in 0..count {
            insert(
                &netns,
                &format!(
                    "-p udp -s 198.18.1.2 -d 198.18.128.10 --sport {} --dport 53 -r 198.18.2.2 -q 198.18.1.2 \
                     --reply-port-src 8053 --reply-port-dst {}",
                    20000 + port,
                    20000 + port
                ),
            );
        }
    }
    let mut socket = netns.enter(ConntrackSocket::open).unwrap();
    let dump = socket.dump(IpFamily::V4, Protocol::Udp).unwrap();
    assert_eq!(dump.flows.len(), usize::from(count));
    let outcome = socket.delete(&dump.flows).unwrap();
    assert_eq!((outcome.deleted, outcome.not_found, outcome.failed.len()), (usize::from(count), 0, 0));
    assert!(socket.dump(IpFamily::V4, Protocol::Udp).unwrap().flows.is_empty());
}

//! Nothing a test creates outlives it: not after a normal drop, not after a panic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

use kproxy_testbed::{Netns, Proto, Testbed, Where, require_kernel};

fn listed_namespaces() -> Vec<String> {
    let out = std::process::Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

fn assert_gone(names: &[String]) {
    assert!(!names.is_empty());
    let listed = listed_namespaces();
    for name in names {
        assert!(name.starts_with(kproxy_testbed::NETNS_PREFIX), "{name}");
        assert!(!listed.contains(name), "{name} survived: {listed:?}");
        assert!(!std::path::Path::new("/run/netns").join(name).exists(), "{name}");
    }
}

#[test]
fn dropping_a_testbed_removes_every_namespace() {
    require_kernel!();
    let tb = Testbed::new().unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    a.serve(&[(Proto::Tcp, 8080)]).unwrap();
    tb.add_pod("b", Where::Node2).unwrap();
    let names = tb.netns_names();
    assert_eq!(names.len(), 6);
    let listed = listed_namespaces();
    for name in &names {
        assert!(listed.contains(name), "{name} not listed");
    }
    drop(a);
    drop(tb);
    assert_gone(&names);
}

#[test]
fn a_panicking_test_leaves_nothing_behind() {
    require_kernel!();
    let names = Mutex::new(Vec::new());
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let tb = Testbed::new().unwrap();
        let pod = tb.add_pod("doomed", Where::Node).unwrap();
        pod.serve(&[(Proto::Udp, 5353)]).unwrap();
        *names.lock().unwrap() = tb.netns_names();
        panic!("the test under test fails");
    }));
    assert!(outcome.is_err());
    assert_gone(&names.into_inner().unwrap());
}

#[test]
fn a_lone_namespace_is_removed_and_isolated() {
    require_kernel!();
    let first = Netns::new("solo").unwrap();
    let second = Netns::new("solo").unwrap();
    assert_ne!(first.name(), second.name());
    let lo = first.ip(["-o", "link", "show", "lo"]).unwrap();
    assert!(lo.contains("UP"), "{lo}");
    // The same port binds in both: sockets created by run_in live in the namespace.
    let bind = || std::net::TcpListener::bind("127.0.0.1:45678").map(|l| l.local_addr().unwrap());
    let (a, b) = (first.run_in(bind).unwrap().unwrap(), second.run_in(bind).unwrap().unwrap());
    assert_eq!(a, b);
    first.sysctl("net.ipv4.ip_forward", "1").unwrap();
    assert_eq!(first.read_sysctl("net.ipv4.ip_forward").unwrap(), "1");
    assert_eq!(second.read_sysctl("net.ipv4.ip_forward").unwrap(), "0");
    let out = first.exec("sysctl", &["-n", "net.ipv4.ip_forward"]).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1");
    // A panic inside run_in reaches the caller, and the namespace is still removed.
    let names = vec![first.name().to_owned(), second.name().to_owned()];
    let panicked = catch_unwind(AssertUnwindSafe(|| first.run_in(|| panic!("inside"))));
    assert!(panicked.is_err());
    drop((first, second));
    assert_gone(&names);
}

//! Startup tuning applied with root "/" from inside a network namespace of the test's own: the
//! per-namespace timeouts change there and only there; the table size, read-only outside the
//! initial namespace, is reported as a failure without stopping the rest.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers may unwrap

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use kproxy_conntrack::{ConntrackTuning, SettingOutcome};

const UDP_TIMEOUT: &str = "/proc/sys/net/netfilter/nf_conntrack_udp_timeout";
const UDP_STREAM_TIMEOUT: &str = "/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream";
const BE_LIBERAL: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal";

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

#[test]
fn tunes_the_namespace_it_runs_in() {
    if !kernel_tests_enabled("tunes_the_namespace_it_runs_in") {
        return;
    }
    let netns = Netns::new("tune");
    // Conntrack sysctls of a namespace appear once something in it uses conntrack.
    netns.nft("table ip t {\n\tchain c { type filter hook prerouting priority 0; ct state invalid drop; }\n}\n");
    let root_before = (read(UDP_TIMEOUT), read(UDP_STREAM_TIMEOUT), read(BE_LIBERAL));
    let tuning = ConntrackTuning {
        // max = max(1 × CPUs, 1): never above a quarter of any real hash size, so the global hash
        // size is never a candidate for a write.
        max_per_core: 1,
        min: 1,
        tcp_established_timeout: Duration::ZERO,
        tcp_close_wait_timeout: Duration::ZERO,
        tcp_be_liberal: true,
        udp_timeout: Duration::from_secs(47),
        udp_stream_timeout: Duration::from_secs(301),
    };
    let (report, inside) = netns.enter(|| {
        let report = tuning.apply(Path::new("/"));
        (report, (read(UDP_TIMEOUT), read(UDP_STREAM_TIMEOUT), read(BE_LIBERAL)))
    });
    assert_eq!(inside, ("47".to_string(), "301".to_string(), "1".to_string()));
    assert_eq!(
        (read(UDP_TIMEOUT), read(UDP_STREAM_TIMEOUT), read(BE_LIBERAL)),
        root_before,
        "root namespace untouched"
    );
    assert!(
        matches!(report.outcome("proc/sys/net/netfilter/nf_conntrack_max"), Some(SettingOutcome::Failed(_))),
        "nf_conntrack_max is read-only in a namespace: {report:?}"
    );
    assert!(matches!(
        report.outcome("sys/module/nf_conntrack/parameters/hashsize"),
        Some(SettingOutcome::Unchanged(_))
    ));
    assert_eq!(report.failures().count(), 1, "{report:?}");
}

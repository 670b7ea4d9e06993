//! The long-lived UDP client and the conntrack helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use kproxy_testbed::topology::EXTERNAL_IP_V4;
use kproxy_testbed::{ProbeResult, Proto, Testbed, UdpSession, Where, conntrack_flush, conntrack_list, require_kernel};

#[test]
fn a_session_keeps_its_source_port_and_shows_in_conntrack() {
    require_kernel!();
    let tb = Testbed::new().unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    a.serve(&[(Proto::Udp, 5353)]).unwrap();
    // Make the node track connections (conntrack only runs in a namespace whose rules use it).
    tb.node()
        .nft("table inet track { chain forward { type filter hook forward priority 0; ct state new counter; }; }")
        .unwrap();

    let dest = SocketAddr::new(a.ipv4().into(), 5353);
    let session = UdpSession::start(tb.external(), None, 40404, dest, Duration::from_millis(50)).unwrap();
    assert_eq!(session.local_addr().port(), 40404);
    let first = session.wait_for(Duration::from_secs(2), |r| r.backend().is_some()).unwrap();
    assert_eq!(first, ProbeResult::Answered { backend: "a".into(), seen_source: EXTERNAL_IP_V4.into() });

    let entries = conntrack_list(tb.node()).unwrap();
    assert!(entries.iter().any(|e| e.contains("sport=40404") && e.contains("dport=5353")), "{entries:?}");

    // The backend goes away: the session sees refusals.
    a.stop_serving();
    assert_eq!(session.wait_for(Duration::from_secs(2), |r| *r == ProbeResult::Refused), Some(ProbeResult::Refused));
    drop(session);

    conntrack_flush(tb.node()).unwrap();
    let entries = conntrack_list(tb.node()).unwrap();
    assert!(!entries.iter().any(|e| e.contains("sport=40404")), "{entries:?}");
}

//! The testbed topology carries real traffic without any proxy: the ground truth every
//! dataplane case builds on. Needs root (skips outside CI otherwise, fails in CI).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use kproxy_testbed::topology::*;
use kproxy_testbed::{DEFAULT_PROBE_TIMEOUT, PodNetworking, ProbeResult, Proto, Testbed, Where, probe, require_kernel};

const TCP: u16 = 8080;
const UDP: u16 = 5353;

fn answered(backend: &str, seen: impl Into<IpAddr>) -> ProbeResult {
    ProbeResult::Answered { backend: backend.into(), seen_source: seen.into() }
}

fn sa(ip: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

/// External → pod on node, pod ↔ pod across nodes, both families, TCP and UDP.
fn check_reachability(networking: PodNetworking) {
    let tb = Testbed::builder().pod_networking(networking).build().unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    let b = tb.add_pod("b", Where::Node2).unwrap();
    let c = tb.add_pod("c", Where::Node).unwrap();
    for pod in [&a, &b, &c] {
        pod.serve(&[(Proto::Tcp, TCP), (Proto::Udp, UDP)]).unwrap();
    }
    assert_eq!(a.ipv4(), "198.18.16.10".parse::<std::net::Ipv4Addr>().unwrap());
    assert_eq!(c.ipv6().to_string(), "fd00:10:16::b");
    assert_eq!(b.ipv4().to_string(), "198.18.17.10");

    for proto in [Proto::Tcp, Proto::Udp] {
        let port = if proto == Proto::Tcp { TCP } else { UDP };
        for (ext, pod_a, pod_b, pod_c) in [
            (IpAddr::from(EXTERNAL_IP_V4), a.ipv4().into(), b.ipv4().into(), c.ipv4().into()),
            (EXTERNAL_IP_V6.into(), a.ipv6().into(), b.ipv6().into(), c.ipv6().into()),
        ] {
            let cases: [(&kproxy_testbed::Netns, IpAddr, &str, IpAddr); 6] = [
                (tb.external(), pod_a, "a", ext),
                (tb.external(), pod_b, "b", ext),
                (a.netns(), pod_b, "b", pod_a),
                (b.netns(), pod_a, "a", pod_b),
                (a.netns(), pod_c, "c", pod_a),
                (a.netns(), pod_a, "a", pod_a),
            ];
            for (from, dest, backend, seen) in cases {
                let got = probe(from, proto, sa(dest, port), DEFAULT_PROBE_TIMEOUT).unwrap();
                assert_eq!(got, answered(backend, seen), "{proto} {} -> {dest}", from.role());
            }
        }
    }
}

#[test]
fn routed_pods_are_reachable_from_outside_and_across_nodes() {
    require_kernel!();
    check_reachability(PodNetworking::default());
}

#[test]
fn bridged_pods_are_reachable_from_outside_and_across_nodes() {
    require_kernel!();
    check_reachability(PodNetworking::Bridge { name: "cbr0".into() });
}

#[test]
fn pod_interfaces_follow_the_networking_style() {
    require_kernel!();
    let routed = Testbed::builder().pod_networking(PodNetworking::Routed { iface_prefix: "cali".into() }).build();
    let routed = routed.unwrap();
    let pod = routed.add_pod("r", Where::Node).unwrap();
    assert_eq!(pod.host_iface(), "cali10");
    let link = routed.node().ip(["-o", "link", "show", "cali10"]).unwrap();
    assert!(!link.contains("master"), "{link}");
    let route = routed.node().ip(["route", "get", "198.18.16.10"]).unwrap();
    assert!(route.contains("dev cali10"), "{route}");

    let bridged = Testbed::builder().pod_networking(PodNetworking::Bridge { name: "cbr0".into() }).build().unwrap();
    let pod = bridged.add_pod("b", Where::Node).unwrap();
    let link = bridged.node().ip(["-o", "link", "show", pod.host_iface()]).unwrap();
    assert!(link.contains("master cbr0"), "{link}");
    let route = bridged.node().ip(["route", "get", "198.18.16.10"]).unwrap();
    assert!(route.contains("dev cbr0"), "{route}");
}

#[test]
fn node_forwards_and_ipv6_needs_no_dad() {
    require_kernel!();
    let tb = Testbed::new().unwrap();
    for host in [tb.node(), tb.node2()] {
        assert_eq!(host.read_sysctl("net.ipv4.ip_forward").unwrap(), "1");
        assert_eq!(host.read_sysctl("net.ipv6.conf.all.forwarding").unwrap(), "1");
        assert_eq!(host.read_sysctl("net.ipv4.conf.all.rp_filter").unwrap(), "0");
    }
    assert_eq!(tb.external().read_sysctl("net.ipv4.ip_forward").unwrap(), "0");
    // No address is left tentative.
    let addrs = tb.node().ip(["-6", "addr", "show", "dev", "eth0"]).unwrap();
    assert!(addrs.contains("fd00:18::2/64") && !addrs.contains("tentative"), "{addrs}");
}

#[test]
fn host_network_backend_on_the_node() {
    require_kernel!();
    let tb = Testbed::new().unwrap();
    let _server =
        kproxy_testbed::EchoServer::start(tb.node(), "node-host", &[(Proto::Tcp, TCP), (Proto::Udp, UDP)]).unwrap();
    for (dest, seen) in
        [(IpAddr::from(NODE_IP_V4), IpAddr::from(EXTERNAL_IP_V4)), (NODE_IP_V6.into(), EXTERNAL_IP_V6.into())]
    {
        for (proto, port) in [(Proto::Tcp, TCP), (Proto::Udp, UDP)] {
            let got = probe(tb.external(), proto, sa(dest, port), DEFAULT_PROBE_TIMEOUT).unwrap();
            assert_eq!(got, answered("node-host", seen), "{proto} {dest}");
        }
    }
}

#[test]
fn closed_ports_are_refused() {
    require_kernel!();
    let tb = Testbed::new().unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    a.serve(&[(Proto::Tcp, TCP)]).unwrap();
    for ip in a.ips() {
        for proto in [Proto::Tcp, Proto::Udp] {
            let got = probe(tb.external(), proto, sa(ip, 9), DEFAULT_PROBE_TIMEOUT).unwrap();
            assert_eq!(got, ProbeResult::Refused, "{proto} {ip}:9");
        }
    }
    // A burst of rejects is answered every time (no ICMP rate limiting turns it into a drop).
    let tally =
        kproxy_testbed::probe_many(tb.external(), Proto::Udp, sa(a.ipv4(), 9), 50, &Default::default()).unwrap();
    assert_eq!(tally.refused, 50, "{tally:?}");
    // Stopping the backend closes its port.
    assert_eq!(
        probe(tb.external(), Proto::Tcp, sa(a.ipv4(), TCP), DEFAULT_PROBE_TIMEOUT).unwrap(),
        answered("a", EXTERNAL_IP_V4)
    );
    a.stop_serving();
    assert_eq!(
        probe(tb.external(), Proto::Tcp, sa(a.ipv4(), TCP), DEFAULT_PROBE_TIMEOUT).unwrap(),
        ProbeResult::Refused
    );
}

#[test]
fn dropped_traffic_times_out_quickly() {
    require_kernel!();
    let tb = Testbed::new().unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    a.serve(&[(Proto::Tcp, TCP), (Proto::Udp, UDP)]).unwrap();
    tb.node()
        .nft(&format!(
            "table inet blackhole {{ chain forward {{ type filter hook forward priority 0; \
             ip daddr {} drop; ip6 daddr {} drop; }}; }}",
            a.ipv4(),
            a.ipv6()
        ))
        .unwrap();
    // Two probes side by side to each dropped address, one giving up after 300 ms and one after
    // a second: both time out, the short one after its timeout (not before) and before the long
    // one. So a probe gives up at its own timeout, whatever the machine's load (an absolute bound
    // failed here at a load of 27: a 300 ms probe took 462 ms).
    let (short, long) = (Duration::from_millis(300), Duration::from_secs(1));
    for ip in a.ips() {
        for (proto, port) in [(Proto::Tcp, TCP), (Proto::Udp, UDP)] {
            let timed = |timeout: Duration| {
                let started = Instant::now();
                let got = probe(tb.external(), proto, sa(ip, port), timeout).unwrap();
                (got, started.elapsed(), Instant::now())
            };
            let ((quick, quick_took, quick_done), (slow, slow_took, slow_done)) = std::thread::scope(|scope| {
                let quick = scope.spawn(|| timed(short));
                let slow = scope.spawn(|| timed(long));
                (quick.join().unwrap(), slow.join().unwrap())
            });
            assert_eq!((&quick, &slow), (&ProbeResult::TimedOut, &ProbeResult::TimedOut), "{proto} {ip}");
            let early = Duration::from_millis(10);
            assert!(quick_took + early >= short, "{proto} {ip}: the {short:?} probe gave up after {quick_took:?}");
            assert!(slow_took + early >= long, "{proto} {ip}: the {long:?} probe gave up after {slow_took:?}");
            assert!(
                quick_done < slow_done,
                "{proto} {ip}: the {short:?} probe ({quick_took:?}) ended after the {long:?} one ({slow_took:?})"
            );
        }
    }
    // The pod itself still answers from its own namespace: only the node drops.
    for ip in a.ips() {
        for (proto, port) in [(Proto::Tcp, TCP), (Proto::Udp, UDP)] {
            let got = probe(a.netns(), proto, sa(ip, port), DEFAULT_PROBE_TIMEOUT).unwrap();
            assert_eq!(got.backend(), Some("a"), "{proto} {ip} from the pod itself: {got:?}");
        }
    }
}

#[test]
fn reject_flavours_are_told_apart() {
    require_kernel!();
    let tb = Testbed::new().unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    let b = tb.add_pod("b", Where::Node).unwrap();
    let c = tb.add_pod("c", Where::Node).unwrap();
    for pod in [&a, &b, &c] {
        pod.serve(&[(Proto::Tcp, TCP), (Proto::Udp, UDP)]).unwrap();
    }
    tb.node()
        .nft(&format!(
            "table inet rejects {{ chain forward {{ type filter hook forward priority 0; \
             ip daddr {a4} reject with icmpx admin-prohibited; ip6 daddr {a6} reject with icmpx admin-prohibited; \
             ip daddr {b4} reject with icmpx host-unreachable; ip6 daddr {b6} reject with icmpx host-unreachable; \
             ip daddr {c4} meta l4proto tcp reject with tcp reset; ip6 daddr {c6} meta l4proto tcp reject with tcp reset; \
             }}; }}",
            a4 = a.ipv4(),
            a6 = a.ipv6(),
            b4 = b.ipv4(),
            b6 = b.ipv6(),
            c4 = c.ipv4(),
            c6 = c.ipv6(),
        ))
        .unwrap();
    for (proto, port) in [(Proto::Tcp, TCP), (Proto::Udp, UDP)] {
        for family in 0..2 {
            let got = probe(tb.external(), proto, sa(a.ips()[family], port), DEFAULT_PROBE_TIMEOUT).unwrap();
            assert_eq!(got, ProbeResult::Refused, "admin-prohibited {proto}");
            let got = probe(tb.external(), proto, sa(b.ips()[family], port), DEFAULT_PROBE_TIMEOUT).unwrap();
            assert_eq!(got, ProbeResult::Unreachable, "host-unreachable {proto}");
        }
    }
    for ip in c.ips() {
        assert_eq!(probe(tb.external(), Proto::Tcp, sa(ip, TCP), DEFAULT_PROBE_TIMEOUT).unwrap(), ProbeResult::Refused);
        // UDP to c is not rejected.
        assert_eq!(
            probe(tb.external(), Proto::Udp, sa(ip, UDP), DEFAULT_PROBE_TIMEOUT).unwrap(),
            answered("c", if ip.is_ipv4() { IpAddr::from(EXTERNAL_IP_V4) } else { EXTERNAL_IP_V6.into() })
        );
    }
}

#[test]
fn probes_can_bind_their_source() {
    require_kernel!();
    let tb = Testbed::new().unwrap();
    tb.add_node_interface("eth1", &["192.0.2.2/24".parse().unwrap(), "fd00:192::2/64".parse().unwrap()]).unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    a.serve(&[(Proto::Tcp, TCP), (Proto::Udp, UDP)]).unwrap();
    for (bind, dest) in [("192.0.2.2:0", a.ipv4().into()), ("[fd00:192::2]:40001", IpAddr::from(a.ipv6()))] {
        let bind: SocketAddr = bind.parse().unwrap();
        for (proto, port) in [(Proto::Tcp, TCP), (Proto::Udp, UDP)] {
            let options = kproxy_testbed::ProbeOptions { bind: Some(bind), ..Default::default() };
            let got = kproxy_testbed::probe_with(tb.node(), proto, sa(dest, port), &options).unwrap();
            assert_eq!(got, answered("a", bind.ip()), "{proto} from {bind}");
        }
    }
    // Without binding, the node picks its own source: the uplink address for a routed pod.
    let got = probe(tb.node(), Proto::Tcp, sa(a.ipv4(), TCP), DEFAULT_PROBE_TIMEOUT).unwrap();
    assert_eq!(got, answered("a", NODE_IP_V4));
    // The secondary interface can become the preferred source for pod traffic.
    tb.node().ip(["route", "replace", &format!("{}/32", a.ipv4()), "dev", a.host_iface(), "src", "192.0.2.2"]).unwrap();
    let got = probe(tb.node(), Proto::Tcp, sa(a.ipv4(), TCP), DEFAULT_PROBE_TIMEOUT).unwrap();
    assert_eq!(got, answered("a", "192.0.2.2".parse::<IpAddr>().unwrap()));
}

#[test]
fn many_probes_are_tallied() {
    require_kernel!();
    let tb = Testbed::new().unwrap();
    let a = tb.add_pod("a", Where::Node2).unwrap();
    a.serve(&[(Proto::Tcp, TCP), (Proto::Udp, UDP)]).unwrap();
    // Every probe answered by `a` (none timed out, none refused): what counts here, not how long
    // 600 probes take.
    for proto in [Proto::Tcp, Proto::Udp] {
        let port = if proto == Proto::Tcp { TCP } else { UDP };
        let tally = kproxy_testbed::probe_many(tb.external(), proto, sa(a.ipv6(), port), 300, &Default::default());
        let tally = tally.unwrap();
        assert_eq!(tally.counts_for(&["a", "b"]), vec![300, 0], "{proto}");
        assert_eq!(tally.seen_sources.get(&IpAddr::from(EXTERNAL_IP_V6)), Some(&300));
        assert_eq!(tally.total(), 300);
    }
}

#[test]
fn sctp_needs_a_kernel_with_sctp() {
    require_kernel!();
    let tb = Testbed::new().unwrap();
    let a = tb.add_pod("a", Where::Node).unwrap();
    let serving = a.serve(&[(Proto::Sctp, 7777)]);
    let probed = probe(tb.external(), Proto::Sctp, sa(a.ipv4(), 7777), DEFAULT_PROBE_TIMEOUT);
    if kproxy_testbed::kernel::KernelFeature::Sctp.is_available() {
        serving.unwrap();
        assert_eq!(probed.unwrap(), answered("a", EXTERNAL_IP_V4));
    } else {
        assert!(matches!(serving, Err(kproxy_testbed::TestbedError::SctpUnsupported(_))), "{serving:?}");
        assert!(matches!(probed, Err(kproxy_testbed::TestbedError::SctpUnsupported(_))), "{probed:?}");
    }
}

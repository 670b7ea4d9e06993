//! The fast path against a real kernel with flowtables (the guest kernel:
//! `cargo xtask guest-test accel`), under each dataplane: long transfers to the opted-in Service
//! are offloaded (`[OFFLOAD]` in conntrack) and keep flowing through the flowtable, the same to
//! a Service without the hint are not, UDP likewise, removing the hint stops offloading new
//! connections; links join and leave the flowtable; cleanup leaves nothing.

#![allow(clippy::unwrap_used)]

use std::net::IpAddr;
use std::time::{Duration, Instant};

use kproxy_accel::harness::{
    Cluster, FAST_NODE_PORT, FAST_VIP, Hint, ProxyMode, SERVICE_PORT, SLOW_VIP, endpoint_slice, finish, finish_at,
    reset, send_bytes, service_object, udp_backend,
};
use kproxy_accel::{AccelConfig, TABLE, WatchOptions, offloaded_connections};
use kproxy_testbed::kernel;
use kproxy_testbed::topology::NODE_IP_V4;

const CHUNK: usize = 4 * 1024 * 1024;
const OFFLOAD_WAIT: Duration = Duration::from_secs(10);

fn ready(mode: ProxyMode) -> bool {
    kernel::require_root() && kernel::require(&mode.features())
}

/// A long TCP upload to `address:port`: offloaded or not after the first chunk, and every byte
/// arrives (through the flowtable when offloaded, which proves its NAT is right).
fn tcp_transfer(cluster: &Cluster, address: IpAddr, port: u16, expect_offload: bool) {
    let mut stream = cluster.connect_tcp(address, port).unwrap();
    let client_port = stream.local_addr().unwrap().port();
    send_bytes(&mut stream, CHUNK).unwrap();
    let offloaded =
        cluster.wait_offloaded("tcp", client_port, if expect_offload { OFFLOAD_WAIT } else { Duration::ZERO });
    let entry = cluster.conntrack_entry("tcp", client_port);
    assert!(entry.is_some(), "no conntrack entry for {address}:{port} from port {client_port}");
    assert_eq!(
        offloaded,
        expect_offload,
        "{address}:{port}: offload expected {expect_offload}: {entry:?}\n{}",
        cluster.ruleset()
    );
    send_bytes(&mut stream, CHUNK).unwrap();
    assert_eq!(finish(stream).unwrap(), 2 * CHUNK as u64, "bytes lost through {address}:{port}");
}

/// A UDP exchange of 60 datagrams (each echoed) on one socket.
fn udp_exchange(cluster: &Cluster, address: IpAddr, expect_offload: bool) {
    let socket = cluster.connect_udp(address, SERVICE_PORT).unwrap();
    let client_port = socket.local_addr().unwrap().port();
    let mut buffer = [0u8; 64];
    for round in 0..60u32 {
        socket.send(&round.to_be_bytes()).unwrap();
        let n = socket.recv(&mut buffer).unwrap_or_else(|e| panic!("no echo for datagram {round} to {address}: {e}"));
        assert_eq!(&buffer[..n], &round.to_be_bytes());
    }
    let offloaded =
        cluster.wait_offloaded("udp", client_port, if expect_offload { OFFLOAD_WAIT } else { Duration::ZERO });
    let entry = cluster.conntrack_entry("udp", client_port);
    assert_eq!(offloaded, expect_offload, "udp {address}: offload expected {expect_offload}: {entry:?}");
    // Still answered after offload.
    socket.send(b"after").unwrap();
    let n = socket.recv(&mut buffer).unwrap();
    assert_eq!(&buffer[..n], b"after");
}

/// The acceptance scenario of the issue, for one dataplane.
fn opted_in_services_are_offloaded(mode: ProxyMode) {
    if !ready(mode) {
        return;
    }
    // Under IPVS the opted-in Service's connections are DNATed by the auxiliary nftables table
    // instead (conntrack's NAT, which the flowtable reproduces); `slow` stays on IPVS.
    let offloads = true;
    let mut cluster = Cluster::start(mode, AccelConfig::default(), Hint::Field).unwrap();
    // UDP first, so its entry is still in the flowtable when the view is taken below.
    udp_exchange(&cluster, FAST_VIP.into(), offloads);
    udp_exchange(&cluster, SLOW_VIP.into(), false);
    tcp_transfer(&cluster, FAST_VIP.into(), SERVICE_PORT, offloads);
    tcp_transfer(&cluster, SLOW_VIP.into(), SERVICE_PORT, false);
    if mode == ProxyMode::Ipvs {
        // IPVS scheduled the connections to `slow` and never saw those to `fast`, whose virtual
        // services it still lists.
        assert_eq!(ipvs_connections(&cluster, "TCP", SLOW_VIP.into()), 1, "{}", ipvs_state(&cluster));
        assert_eq!(ipvs_connections(&cluster, "UDP", SLOW_VIP.into()), 1, "{}", ipvs_state(&cluster));
        assert_eq!(ipvs_connections(&cluster, "TCP", FAST_VIP.into()), 0, "{}", ipvs_state(&cluster));
        assert_eq!(ipvs_connections(&cluster, "UDP", FAST_VIP.into()), 0, "{}", ipvs_state(&cluster));
    }

    // The metric counted the two offloaded connections; the view attributes them.
    let accel = cluster.accel.clone();
    let total = cluster.node().run_in(move || accel.lock().unwrap().accelerated_connections_total()).unwrap();
    assert_eq!(total >= 2, offloads, "accelerated_connections_total = {total}");
    let offloaded = cluster.node().run_in(offloaded_connections).unwrap().unwrap();
    let view = cluster.accel.lock().unwrap().accelerated_view(&offloaded);
    let names: Vec<String> = view.iter().map(|v| v.service.to_string()).collect();
    assert_eq!(names, ["default/fast:tcp/tcp", "default/fast:udp/udp"], "{view:?}");
    let udp_view = view.iter().find(|v| &*v.service.port == "udp").map(|v| v.offloaded_connections);
    assert_eq!(udp_view.is_some_and(|n| n >= 1), offloads, "{view:?} from {offloaded:?}");

    // Removing the hint: new connections stay on the slow path.
    cluster.apply(vec![service_object("fast", FAST_VIP, Some(FAST_NODE_PORT), Hint::None)]).unwrap();
    assert!(!cluster.ruleset().contains(&format!("table inet {TABLE}")), "table kept without opted-in services");
    tcp_transfer(&cluster, FAST_VIP.into(), SERVICE_PORT, false);
    udp_exchange(&cluster, FAST_VIP.into(), false);

    if mode == ProxyMode::Ipvs {
        // Without the hint, IPVS carries them.
        assert_eq!(ipvs_connections(&cluster, "TCP", FAST_VIP.into()), 1, "{}", ipvs_state(&cluster));
    }

    // And opting in again works.
    cluster.apply(vec![service_object("fast", FAST_VIP, Some(FAST_NODE_PORT), Hint::Annotation)]).unwrap();
    tcp_transfer(&cluster, FAST_VIP.into(), SERVICE_PORT, offloads);
    if mode == ProxyMode::Ipvs {
        assert_eq!(
            ipvs_connections(&cluster, "TCP", FAST_VIP.into()),
            1,
            "the opted-in Service's new connection went to IPVS: {}",
            ipvs_state(&cluster)
        );
    }

    cluster.cleanup().unwrap();
    assert!(!cluster.ruleset().contains(TABLE), "cleanup left the table:\n{}", cluster.ruleset());
}

#[test]
fn nftables_mode_offloads_opted_in_services_only() {
    opted_in_services_are_offloaded(ProxyMode::Nftables);
}

#[test]
fn iptables_mode_offloads_opted_in_services_only() {
    opted_in_services_are_offloaded(ProxyMode::Iptables);
}

#[test]
fn iptables_legacy_mode_offloads_opted_in_services_only() {
    opted_in_services_are_offloaded(ProxyMode::IptablesLegacy);
}

#[test]
fn ipvs_mode_offloads_opted_in_services_only() {
    opted_in_services_are_offloaded(ProxyMode::Ipvs);
}

/// The connections IPVS carries (or carried within the last minutes: closed TCP ones stay in
/// TIME_WAIT for 120 s) for the virtual service `protocol address:80`, from its connection
/// table (`ipvsadm -Lnc`; the `--stats` counters lag behind, updated by the estimator).
fn ipvs_connections(cluster: &Cluster, protocol: &str, address: IpAddr) -> usize {
    let table = cluster.node().exec_ok("ipvsadm", &["-Lnc"]).unwrap();
    let service = format!("{address}:{SERVICE_PORT}");
    table
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|fields| fields.len() == 6 && fields[0] == protocol && fields[4] == service)
        .count()
}

/// What IPVS and conntrack hold, and the ruleset, for assertion messages.
fn ipvs_state(cluster: &Cluster) -> String {
    let run = |cmd: &str, args: &[&str]| cluster.node().exec_ok(cmd, args).unwrap_or_else(|e| e.to_string());
    format!(
        "ipvsadm -Ln:\n{}\nipvsadm -Lnc:\n{}\nconntrack -L:\n{}\n{}",
        run("ipvsadm", &["-Ln"]),
        run("ipvsadm", &["-Lnc"]),
        run("conntrack", &["-L"]),
        cluster.ruleset()
    )
}

fn node_port_connections_are_offloaded_under(mode: ProxyMode) {
    if !ready(mode) {
        return;
    }
    let cluster = Cluster::start(mode, AccelConfig::default(), Hint::Annotation).unwrap();
    tcp_transfer(&cluster, NODE_IP_V4.into(), FAST_NODE_PORT, true);
}

#[test]
fn node_port_connections_are_offloaded() {
    node_port_connections_are_offloaded_under(ProxyMode::Nftables);
}

#[test]
fn ipvs_mode_node_port_connections_are_offloaded() {
    node_port_connections_are_offloaded_under(ProxyMode::Ipvs);
}

#[test]
fn short_exchanges_below_the_threshold_are_not_offloaded() {
    if !ready(ProxyMode::Nftables) {
        return;
    }
    let config = AccelConfig { packet_threshold: 1000, ..AccelConfig::default() };
    let cluster = Cluster::start(ProxyMode::Nftables, config, Hint::Field).unwrap();
    udp_exchange(&cluster, FAST_VIP.into(), false);
}

fn flowtable_devices(cluster: &Cluster) -> String {
    cluster.node().exec_ok("nft", &["list", "flowtable", "inet", TABLE, kproxy_accel::FLOWTABLE]).unwrap()
}

fn wait_until(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    check()
}

#[test]
fn links_join_and_leave_the_flowtable() {
    if !ready(ProxyMode::Nftables) {
        return;
    }
    let mut cluster = Cluster::start(ProxyMode::Nftables, AccelConfig::default(), Hint::Field).unwrap();
    let before = flowtable_devices(&cluster);
    assert!(before.contains("eth0") && !before.contains("\"lo\"") && !before.contains(" lo,"), "{before}");
    cluster
        .watch_links(WatchOptions { min_interval: Duration::from_millis(300), resync_every: Duration::from_secs(60) })
        .unwrap();

    cluster.node().ip(["link", "add", "accj0", "type", "veth", "peer", "name", "accj1"]).unwrap();
    cluster.node().ip(["link", "set", "accj0", "up"]).unwrap();
    cluster.node().ip(["link", "set", "accj1", "up"]).unwrap();
    let joined = wait_until(Duration::from_secs(10), || {
        let devices = flowtable_devices(&cluster);
        devices.contains("accj0") && devices.contains("accj1")
    });
    assert!(joined, "new links did not join:\n{}", flowtable_devices(&cluster));

    // Down: unregistered explicitly. Deleted: leaves by itself, without errors.
    cluster.node().ip(["link", "set", "accj1", "down"]).unwrap();
    let left = wait_until(Duration::from_secs(10), || !flowtable_devices(&cluster).contains("accj1"));
    assert!(left, "a link that went down stayed:\n{}", flowtable_devices(&cluster));
    cluster.node().ip(["link", "del", "accj0"]).unwrap();
    let gone = wait_until(Duration::from_secs(10), || {
        !flowtable_devices(&cluster).contains("accj0") && !cluster.accel.lock().unwrap().devices().contains("accj0")
    });
    assert!(gone, "deleted link still listed:\n{}", flowtable_devices(&cluster));
    let accel = cluster.accel.clone();
    let refreshed = cluster.node().run_in(move || accel.lock().unwrap().refresh_devices()).unwrap();
    assert!(refreshed.is_ok(), "refresh after deletion failed: {refreshed:?}");
    assert!(cluster.accel.lock().unwrap().is_active());
    // Traffic still offloads with the new device list.
    tcp_transfer(&cluster, FAST_VIP.into(), SERVICE_PORT, true);
}

#[test]
fn turning_acceleration_off_removes_the_table_and_on_restores_it() {
    if !ready(ProxyMode::Nftables) {
        return;
    }
    let cluster = Cluster::start(ProxyMode::Nftables, AccelConfig::default(), Hint::Field).unwrap();
    cluster.set_acceleration(false).unwrap();
    assert!(!cluster.ruleset().contains(TABLE));
    tcp_transfer(&cluster, FAST_VIP.into(), SERVICE_PORT, false);
    cluster.set_acceleration(true).unwrap();
    assert!(cluster.ruleset().contains(TABLE));
    tcp_transfer(&cluster, FAST_VIP.into(), SERVICE_PORT, true);
}

/// `nft -j list ruleset` without handles, element lists sorted.
fn listing(ns: &kproxy_testbed::Netns) -> serde_json::Value {
    fn normalize(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.remove("handle");
                m.remove("metainfo");
                m.values_mut().for_each(normalize);
                if let Some(serde_json::Value::Array(elems)) = m.get_mut("elem") {
                    elems.sort_by_key(|e| e.to_string());
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(normalize),
            _ => {}
        }
    }
    let mut v = serde_json::from_str(&ns.exec_ok("nft", &["-j", "list", "ruleset"]).unwrap()).unwrap();
    normalize(&mut v);
    v
}

/// The table's transactions mean the same over netlink (the daemon's path) and as their nft
/// text: created, its devices changed and elements removed both ways, each in a namespace of
/// its own, the listings are identical.
#[test]
fn the_table_lists_the_same_over_netlink_and_as_nft_text() {
    use kproxy_accel::{Element, NetlinkExecutor, create_table, device_updates, element_updates};
    use kproxy_nft_model::{Executor, NftCommand, Transaction};
    use kproxy_state::Protocol;

    if !ready(ProxyMode::Nftables) {
        return;
    }
    let elements = [
        Element::Vip { protocol: Protocol::Tcp, address: FAST_VIP.into(), port: SERVICE_PORT },
        Element::Vip { protocol: Protocol::Udp, address: "fd00:96::10".parse().unwrap(), port: 53 },
        Element::NodePort { protocol: Protocol::Tcp, port: FAST_NODE_PORT },
    ];
    let names = |n: &[&str]| n.iter().map(|s| (*s).to_owned()).collect::<std::collections::BTreeSet<_>>();
    let txs: Vec<Transaction> = vec![
        create_table(&AccelConfig::default(), &names(&["acc-a", "acc-b"]), &elements),
        device_updates(&names(&["acc-c"]), &names(&["acc-a"])),
        element_updates(&[], &elements[..1]),
    ];
    let run = |role: &str, exec: &mut (dyn Executor + Send)| {
        let ns = kproxy_testbed::Netns::new(role).unwrap();
        ns.ip(["link", "add", "acc-a", "type", "veth", "peer", "name", "acc-b"]).unwrap();
        ns.ip(["link", "add", "acc-c", "type", "veth", "peer", "name", "acc-d"]).unwrap();
        for link in ["acc-a", "acc-b", "acc-c", "acc-d"] {
            ns.ip(["link", "set", link, "up"]).unwrap();
        }
        ns.run_in(|| {
            for tx in &txs {
                exec.apply(tx).unwrap_or_else(|e| panic!("{e}\n{tx}"));
            }
        })
        .unwrap();
        listing(&ns)
    };
    let over_netlink = run("accnl", &mut NetlinkExecutor::new());
    let as_text = run("acctext", &mut NftCommand::new());
    let listed = over_netlink.to_string();
    for needle in ["fastpath", "acc-b", "acc-c", "flow", "fd00:96::10", "counter"] {
        assert!(listed.contains(needle), "{needle} not listed: {listed}");
    }
    assert!(!listed.contains("acc-a"), "acc-a left the flowtable: {listed}");
    assert_eq!(serde_json::to_string_pretty(&over_netlink).unwrap(), serde_json::to_string_pretty(&as_text).unwrap());
}

/// The flowtable probe answers what the kernel has (on the host: no flowtables; in the guest:
/// flowtables) and leaves nothing behind either way.
#[test]
fn the_probe_answers_whether_the_kernel_has_flowtables_and_leaves_nothing() {
    if !kernel::require_root() {
        return;
    }
    let ns = kproxy_testbed::Netns::new("accprobe").unwrap();
    let supported = ns.run_in(|| kproxy_accel::probe(&mut kproxy_accel::NetlinkExecutor::new())).unwrap().unwrap();
    assert_eq!(supported, kernel::KernelFeature::Flowtable.is_available());
    assert_eq!(ns.exec_ok("nft", &["list", "ruleset"]).unwrap().trim(), "");
}

/// The TCP state and whether it is offloaded, of the node's conntrack entry of the connection
/// from `client_port` (`None` when there is no entry). The state is empty while the entry is
/// offloaded: conntrack lists offloaded entries without timeout and state
/// (`tcp      6 src=… [OFFLOAD] …`, not `tcp      6 119 TIME_WAIT src=… …`).
fn tcp_entry_state(cluster: &Cluster, client_port: u16) -> Option<(String, bool)> {
    let line = cluster.conntrack_entry("tcp", client_port)?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    let timed = fields.get(2).is_some_and(|timeout| timeout.parse::<u64>().is_ok());
    let state = if timed { fields.get(3).copied().unwrap_or_default() } else { "" };
    Some((state.to_owned(), line.contains("[OFFLOAD]")))
}

/// A UDP socket in `external` whose flow to `address` has exchanged 30 datagrams (more than the
/// threshold) with `backend`, offloaded or not as `expect_offload` says.
fn udp_flow(cluster: &Cluster, address: IpAddr, backend: &str, expect_offload: bool) -> std::net::UdpSocket {
    let socket = cluster.connect_udp(address, SERVICE_PORT).unwrap();
    for _ in 0..30 {
        assert_eq!(udp_backend(&socket).as_deref(), Some(backend), "udp {address}");
    }
    let client_port = socket.local_addr().unwrap().port();
    let offloaded =
        cluster.wait_offloaded("udp", client_port, if expect_offload { OFFLOAD_WAIT } else { Duration::ZERO });
    assert_eq!(offloaded, expect_offload, "udp {address}: {:?}", cluster.conntrack_entry("udp", client_port));
    socket
}

/// What happened to one Service's connections when its only endpoint was replaced.
#[derive(Debug, PartialEq, Eq)]
struct AfterRemoval {
    /// The established TCP connection's conntrack entry is still there after the sync
    /// (kube-proxy leaves TCP flows alone).
    tcp_entry_kept: bool,
    /// Where the rest of the established TCP upload went, and how many bytes arrived in all.
    tcp_backend: String,
    tcp_bytes: u64,
    /// The established UDP flow's conntrack entry right after the sync's cleanup (gone: the
    /// cleanup deleted it).
    udp_entry_after_cleanup: Option<String>,
    /// Who answers the next datagram of that UDP flow.
    udp_backend: Option<String>,
    /// Where a new TCP connection goes.
    new_tcp_backend: String,
}

/// Both Services' only endpoint is replaced while each has an established TCP connection and
/// UDP flow to it, `fast`'s offloaded, `slow`'s (no hint) on the regular path. The same sync
/// runs the daemon's stale-UDP cleanup, which must delete both UDP entries, the offloaded one
/// included. What happens next must be the same for both Services: the TCP connections keep
/// going to the removed endpoint (still a running pod here) with every byte delivered, the UDP
/// flows' next datagrams reach the new endpoint, new connections go to the new endpoint.
fn endpoint_removal_matches_the_regular_path(mode: ProxyMode) {
    if !ready(mode) {
        return;
    }
    let mut cluster = Cluster::start(mode, AccelConfig::default(), Hint::Field).unwrap();
    let replacement = cluster.add_backend("replacement").unwrap();
    let removed = cluster.backend.name().to_owned();

    let mut tcp = Vec::new();
    for (address, offload) in [(FAST_VIP, true), (SLOW_VIP, false)] {
        let mut stream = cluster.connect_tcp(address.into(), SERVICE_PORT).unwrap();
        let port = stream.local_addr().unwrap().port();
        send_bytes(&mut stream, CHUNK).unwrap();
        let offloaded = cluster.wait_offloaded("tcp", port, if offload { OFFLOAD_WAIT } else { Duration::ZERO });
        assert_eq!(offloaded, offload, "tcp {address}: {:?}", cluster.conntrack_entry("tcp", port));
        tcp.push((stream, port));
    }
    let udp: Vec<_> = [(FAST_VIP, true), (SLOW_VIP, false)]
        .map(|(address, offload)| udp_flow(&cluster, address.into(), &removed, offload))
        .into();

    let cleanup =
        cluster.apply(vec![endpoint_slice("fast", &[&replacement]), endpoint_slice("slow", &[&replacement])]).unwrap();
    let deleted: usize = cleanup.iter().map(|stats| stats.deleted).sum();
    let failed: usize = cleanup.iter().map(|stats| stats.failed).sum();
    let udp_entries: Vec<Option<String>> =
        udp.iter().map(|socket| cluster.conntrack_entry("udp", socket.local_addr().unwrap().port())).collect();
    // The endpoint change did not touch the TCP connections: `fast`'s is still offloaded,
    // `slow`'s still ESTABLISHED.
    assert_eq!(tcp_entry_state(&cluster, tcp[0].1), Some((String::new(), true)));
    assert_eq!(tcp_entry_state(&cluster, tcp[1].1), Some(("ESTABLISHED".to_owned(), false)));

    let mut outcomes = Vec::new();
    for (((mut stream, port), socket), udp_entry) in tcp.into_iter().zip(&udp).zip(udp_entries) {
        let tcp_entry_kept = tcp_entry_state(&cluster, port).is_some();
        send_bytes(&mut stream, CHUNK).unwrap();
        let (tcp_bytes, tcp_backend) = finish_at(stream).unwrap();
        let address = socket.peer_addr().unwrap().ip();
        let new_stream = cluster.connect_tcp(address, SERVICE_PORT).unwrap();
        let (_, new_tcp_backend) = finish_at(new_stream).unwrap();
        outcomes.push(AfterRemoval {
            tcp_entry_kept,
            tcp_backend,
            tcp_bytes,
            udp_entry_after_cleanup: udp_entry,
            udp_backend: udp_backend(socket),
            new_tcp_backend,
        });
    }
    let expected = AfterRemoval {
        tcp_entry_kept: true,
        tcp_backend: removed,
        tcp_bytes: 2 * CHUNK as u64,
        udp_entry_after_cleanup: None,
        udp_backend: Some(replacement.name().to_owned()),
        new_tcp_backend: replacement.name().to_owned(),
    };
    assert_eq!(
        (deleted, failed),
        (2, 0),
        "the cleanup must delete both stale UDP entries, the offloaded one too: {cleanup:?}\n{}",
        cluster.node().exec_ok("conntrack", &["-L"]).unwrap_or_default()
    );
    assert_eq!(outcomes[0], outcomes[1], "offloaded (fast) vs regular path (slow)");
    assert_eq!(outcomes[0], expected);
}

#[test]
fn nftables_mode_endpoint_removal_keeps_offloaded_tcp_and_cleans_offloaded_udp_like_the_regular_path() {
    endpoint_removal_matches_the_regular_path(ProxyMode::Nftables);
}

#[test]
fn iptables_legacy_mode_endpoint_removal_keeps_offloaded_tcp_and_cleans_offloaded_udp_like_the_regular_path() {
    endpoint_removal_matches_the_regular_path(ProxyMode::IptablesLegacy);
}

/// How a test ends a connection.
#[derive(Debug, Clone, Copy)]
enum Close {
    /// `shutdown(SHUT_WR)`, the sink answers and closes: FINs both ways.
    Fin,
    /// `SO_LINGER` 0: the client's close sends a RST.
    Rst,
}

/// An offloaded connection that ends with FINs or a RST leaves the flowtable: its conntrack
/// entry is no longer `[OFFLOAD]`. After FINs it reaches TIME_WAIT, like the same close of a
/// connection on the regular path (`slow`, no hint). After a RST the regular connection's entry
/// waits in CLOSE (10 s); the offloaded one's is in CLOSE or already gone (seen in the guest
/// kernel: already gone, likely because the teardown shortens the entry's timeout by the
/// flowtable's own offload timeout, more than CLOSE's 10 s). Either way nothing of it is left
/// in the flowtable. A new connection afterwards is served and offloaded.
#[test]
fn offloaded_connections_leave_the_flowtable_on_fin_and_rst_like_regular_ones() {
    let mode = ProxyMode::Nftables;
    if !ready(mode) {
        return;
    }
    let cluster = Cluster::start(mode, AccelConfig::default(), Hint::Field).unwrap();
    for close in [Close::Fin, Close::Rst] {
        let mut ports = Vec::new();
        for (address, offload) in [(FAST_VIP, true), (SLOW_VIP, false)] {
            let mut stream = cluster.connect_tcp(address.into(), SERVICE_PORT).unwrap();
            let port = stream.local_addr().unwrap().port();
            send_bytes(&mut stream, CHUNK).unwrap();
            let offloaded = cluster.wait_offloaded("tcp", port, if offload { OFFLOAD_WAIT } else { Duration::ZERO });
            assert_eq!(offloaded, offload, "{close:?} tcp {address}: {:?}", cluster.conntrack_entry("tcp", port));
            match close {
                Close::Fin => assert_eq!(finish(stream).unwrap(), CHUNK as u64, "{close:?} {address}"),
                Close::Rst => reset(stream).unwrap(),
            }
            ports.push(port);
        }
        let expected = match close {
            Close::Fin => "TIME_WAIT",
            Close::Rst => "CLOSE",
        };
        let regular = ports[1];
        assert!(
            wait_until(OFFLOAD_WAIT, || tcp_entry_state(&cluster, regular) == Some((expected.into(), false))),
            "{close:?}: regular connection: {:?}",
            cluster.conntrack_entry("tcp", regular)
        );
        // The flowtable's garbage collection (every second) takes the entry out.
        let offloaded = ports[0];
        let left = wait_until(OFFLOAD_WAIT, || match (close, tcp_entry_state(&cluster, offloaded)) {
            (_, Some((state, false))) => state == expected,
            (Close::Rst, None) => true,
            _ => false,
        });
        assert!(left, "{close:?}: offloaded connection: {:?}", cluster.conntrack_entry("tcp", offloaded));
    }
    tcp_transfer(&cluster, FAST_VIP.into(), SERVICE_PORT, true);
}

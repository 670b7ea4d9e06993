//! The fast path against a real kernel with flowtables (the guest kernel:
//! `cargo xtask guest-test accel`), under each dataplane: long transfers to the opted-in Service
//! are offloaded (`[OFFLOAD]` in conntrack) and keep flowing through the flowtable, the same to
//! a Service without the hint are not, UDP likewise, removing the hint stops offloading new
//! connections; links join and leave the flowtable; cleanup leaves nothing.

#![allow(clippy::unwrap_used)]

use std::net::IpAddr;
use std::time::{Duration, Instant};

use kproxy_accel::harness::{
    Cluster, FAST_NODE_PORT, FAST_VIP, Hint, ProxyMode, SERVICE_PORT, SLOW_VIP, finish, send_bytes, service_object,
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
    let udp_view = view.iter().find(|v| v.service.port == "udp").map(|v| v.offloaded_connections);
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

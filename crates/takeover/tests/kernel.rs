#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Finding and removing kube-proxy's leftovers in a network namespace of the test's own, next to
//! the kubelet's chains, a CNI's chains, another tool's table and ip set, and (in iptables mode)
//! kproxy's own chains: only kube-proxy's go. The shapes are those upstream kube-proxy v1.36.2
//! writes (its table names, chain names, jump comments and ip sets); the real binary's leftovers
//! are taken over end to end in `crates/kproxy/tests/takeover.rs`.

use kproxy_iptables::Backend;
use kproxy_iptables::rules::Table;
use kproxy_ipvs::ServiceKey;
use kproxy_nft_model::{TableFamily, TableRef};
use kproxy_state::{IpFamily, Protocol};
use kproxy_takeover::{IptablesLeftovers, Own, find, remove};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use kproxy_testbed::kernel::{KernelFeature, require, require_root};
use kproxy_testbed::{Netns, Proto, Testbed, Where};

/// kube-proxy's nftables tables, as its nftables mode leaves them (a chain and a map each).
const KUBE_PROXY_NFT: &str = "table ip kube-proxy {\n map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }\n \
    chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; }\n}\n\
    table ip6 kube-proxy {\n chain nat-prerouting { type nat hook prerouting priority dstnat; policy accept; }\n}\n\
    table inet other-tool {\n chain c {\n }\n}\n";

/// kube-proxy's iptables mode in one backend, with the kubelet's and a CNI's chains beside it.
const KUBE_PROXY_NAT: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n\
    :KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-NODEPORTS - [0:0]\n\
    :KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]\n:KUBE-SEP-ABCDEFGHIJKLMNOP - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n:CNI-HOSTPORT-DNAT - [0:0]\n\
    -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
    -A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n\
    -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
    -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
    -A KUBE-SERVICES -d 198.18.128.1/32 -p tcp -m comment --comment \"default/kubernetes:https cluster IP\" -m tcp --dport 443 -j KUBE-SVC-XPGD46QRK7WJZT7O\n\
    -A KUBE-SVC-XPGD46QRK7WJZT7O -j KUBE-SEP-ABCDEFGHIJKLMNOP\n\
    -A KUBE-SEP-ABCDEFGHIJKLMNOP -p tcp -j DNAT --to-destination 198.18.0.1:6443\n\
    -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\nCOMMIT\n";

const KUBE_PROXY_FILTER: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
    :KUBE-FIREWALL - [0:0]\n:KUBE-FORWARD - [0:0]\n:KUBE-PROXY-FIREWALL - [0:0]\n:KUBE-PROXY-CANARY - [0:0]\n\
    -A INPUT -j KUBE-FIREWALL\n\
    -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
    -A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kube-proxy firewall rules\" -j KUBE-PROXY-FIREWALL\n\
    -A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\nCOMMIT\n";

fn program(backend: Backend, family: IpFamily, tool: &str) -> String {
    backend.program(family, tool)
}

/// Loads kube-proxy's iptables leftovers into `backend` (IPv4) of `ns`.
fn load_iptables(ns: &Netns, backend: Backend) {
    for table in [KUBE_PROXY_NAT, KUBE_PROXY_FILTER] {
        ns.exec_with_stdin(&program(backend, IpFamily::V4, "-restore"), &["--noflush"], table).unwrap();
    }
}

/// The chains `backend` (IPv4) has in `table` of `ns`, sorted (the backends list them in
/// different orders).
fn chains(ns: &Netns, backend: Backend, table: &str) -> Vec<String> {
    let save = ns.exec_ok(&program(backend, IpFamily::V4, "-save"), &["-t", table]).unwrap();
    let mut chains: Vec<String> = save
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    chains.sort();
    chains
}

fn rules(ns: &Netns, backend: Backend, table: &str) -> Vec<String> {
    let save = ns.exec_ok(&program(backend, IpFamily::V4, "-save"), &["-t", table]).unwrap();
    save.lines().filter(|l| l.starts_with("-A ")).map(String::from).collect()
}

fn nft_tables(ns: &Netns) -> String {
    ns.exec_ok("nft", &["list", "tables"]).unwrap()
}

/// kube-proxy's leftovers in every kind, in one namespace.
fn node_with_leftovers(role: &str) -> Netns {
    let ns = Netns::new(role).unwrap();
    ns.nft(KUBE_PROXY_NFT).unwrap();
    load_iptables(&ns, Backend::Nft);
    load_iptables(&ns, Backend::Legacy);
    ns.exec_ok("ipset", &["create", "KUBE-CLUSTER-IP", "hash:ip,port"]).unwrap();
    ns.exec_ok("ipset", &["create", "KUBE-6-CLUSTER-IP", "hash:ip,port", "family", "inet6"]).unwrap();
    ns.exec_ok("ipset", &["create", "cni-other", "hash:ip"]).unwrap();
    // An IPVS-mode rule of kube-proxy refers to its set: the set can go only after the rule.
    ns.exec_ok(
        "iptables-legacy",
        &["-t", "nat", "-A", "KUBE-SERVICES", "-m", "set", "--match-set", "KUBE-CLUSTER-IP", "dst,dst", "-j", "ACCEPT"],
    )
    .unwrap();
    ns
}

#[test]
fn in_nftables_mode_every_kube_proxy_leftover_goes_and_the_kubelets_the_cnis_and_other_tools_stay() {
    if !require_root() {
        return;
    }
    let ns = node_with_leftovers("tkover");
    let ipvs = kproxy_ipvs::Config::default();
    let (found, removal, after) = ns
        .run_in(|| {
            let found = find(Own::Nftables, &ipvs).unwrap();
            let removal = remove(Own::Nftables, &ipvs, &found);
            (found, removal, find(Own::Nftables, &ipvs).unwrap())
        })
        .unwrap();
    let t = |family, name: &str| TableRef { family, name: name.to_owned() };
    assert_eq!(found.nft_tables, [t(TableFamily::Ip, "kube-proxy"), t(TableFamily::Ip6, "kube-proxy")]);
    let backends: Vec<_> = found.iptables.iter().map(|i| (i.backend, i.family, i.chains)).collect();
    // nat: SERVICES, POSTROUTING, MARK-MASQ, NODEPORTS, SVC, SEP; filter: FORWARD, PROXY-FIREWALL, PROXY-CANARY.
    assert_eq!(backends, [(Backend::Nft, IpFamily::V4, 9), (Backend::Legacy, IpFamily::V4, 9)]);
    assert_eq!(found.ipsets, ["KUBE-CLUSTER-IP", "KUBE-6-CLUSTER-IP"]);
    assert!(removal.is_complete(), "{removal:?}");
    assert!(after.is_empty(), "left: {after}");

    let tables = nft_tables(&ns);
    assert!(!tables.contains("kube-proxy") && tables.contains("table inet other-tool"), "{tables}");
    for backend in [Backend::Nft, Backend::Legacy] {
        assert_eq!(
            chains(&ns, backend, "nat"),
            ["CNI-HOSTPORT-DNAT", "INPUT", "KUBE-KUBELET-CANARY", "OUTPUT", "POSTROUTING", "PREROUTING"]
        );
        assert_eq!(rules(&ns, backend, "nat"), ["-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT"]);
        assert_eq!(chains(&ns, backend, "filter"), ["FORWARD", "INPUT", "KUBE-FIREWALL", "OUTPUT"]);
        assert_eq!(rules(&ns, backend, "filter"), ["-A INPUT -j KUBE-FIREWALL"]);
    }
    assert_eq!(ns.exec_ok("ipset", &["list", "-n"]).unwrap().trim(), "cni-other");
}

#[test]
fn in_iptables_mode_kproxys_chains_of_its_backend_stay_and_the_other_backends_go() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("tkipt").unwrap();
    load_iptables(&ns, Backend::Nft);
    load_iptables(&ns, Backend::Legacy);
    // kube-proxy's IPVS mode left a chain kproxy's iptables mode never writes.
    ns.exec_ok("iptables-nft", &["-t", "nat", "-N", "KUBE-LOAD-BALANCER"]).unwrap();
    let own = Own::Iptables(Backend::Nft);
    let ipvs = kproxy_ipvs::Config::default();
    let (found, removal) = ns
        .run_in(|| {
            let found = find(own, &ipvs).unwrap();
            (found.clone(), remove(own, &ipvs, &found))
        })
        .unwrap();
    let mut legacy_tables = vec![Table::Nat, Table::Filter];
    legacy_tables.sort_by_key(|t| found.iptables[1].tables.iter().position(|x| x == t));
    assert_eq!(
        found.iptables,
        [
            IptablesLeftovers { backend: Backend::Nft, family: IpFamily::V4, tables: vec![Table::Nat], chains: 1 },
            IptablesLeftovers { backend: Backend::Legacy, family: IpFamily::V4, tables: legacy_tables, chains: 9 }
        ]
    );
    assert!(removal.is_complete(), "{removal:?}");
    let nft_nat = chains(&ns, Backend::Nft, "nat");
    assert!(
        nft_nat.contains(&"KUBE-SERVICES".to_owned()) && !nft_nat.contains(&"KUBE-LOAD-BALANCER".to_owned()),
        "{nft_nat:?}"
    );
    assert!(!chains(&ns, Backend::Legacy, "nat").contains(&"KUBE-SERVICES".to_owned()));
}

#[test]
fn finding_nothing_creates_nothing_in_a_namespace_without_iptables_tables() {
    if !require_root() {
        return;
    }
    let ns = Netns::new("tkempty").unwrap();
    let found = ns.run_in(|| find(Own::Nftables, &kproxy_ipvs::Config::default()).unwrap()).unwrap();
    assert!(found.is_empty(), "{found}");
    // Reading a legacy table would have created it; the nft backend's tables likewise.
    assert_eq!(ns.exec_ok("cat", &["/proc/net/ip_tables_names"]).unwrap().trim(), "");
    assert_eq!(nft_tables(&ns).trim(), "");
}

/// A TCP connection held open from `ns` to `to` (conversation servers answer every line with
/// their greeting, `NAME CLIENT-IP CLIENT-PORT`).
struct Conn(BufReader<TcpStream>);

impl Conn {
    fn open(ns: &Netns, to: SocketAddr) -> Self {
        let s = ns.run_in(move || TcpStream::connect_timeout(&to, Duration::from_secs(5))).unwrap().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Conn(BufReader::new(s))
    }

    fn ask(&mut self) -> std::io::Result<String> {
        self.0.get_mut().write_all(b"who\n")?;
        let mut line = String::new();
        self.0.read_line(&mut line)?;
        Ok(line.split_whitespace().next().unwrap_or_default().to_owned())
    }
}

/// kube-proxy's IPVS mode on a node now served by kproxy in nftables mode: a virtual service
/// that still carries a connection stays (and the connection keeps working) until the
/// connection has ended; one without goes at once; `kube-ipvs0` goes with the last one. A
/// virtual service in `ipvs.excludeCIDRs` is never kube-proxy's.
#[test]
fn kube_proxys_ipvs_services_go_once_drained_and_kube_ipvs0_with_the_last() {
    if !require_root() || !require(&[KernelFeature::Ipvs, KernelFeature::Dummy]) {
        return;
    }
    let tb = Testbed::new().unwrap();
    let pod = tb.add_pod("web", Where::Node).unwrap();
    pod.serve_conversations(&[(Proto::Tcp, 8080)]).unwrap();
    let node = tb.node();
    node.ip_batch(&[
        "link add kube-ipvs0 type dummy",
        "addr add 198.18.128.5/32 dev kube-ipvs0",
        "addr add 198.18.128.6/32 dev kube-ipvs0",
    ])
    .unwrap();
    node.sysctls(&[("net.ipv4.vs.conntrack", "1")]).unwrap();
    let real = format!("{}:8080", pod.ipv4());
    for vs in ["198.18.128.5:80", "198.18.128.6:80", "203.0.113.9:80"] {
        node.exec_ok("ipvsadm", &["-A", "-t", vs, "-s", "rr"]).unwrap();
        node.exec_ok("ipvsadm", &["-a", "-t", vs, "-r", &real, "-m"]).unwrap();
    }
    // FIN_WAIT and TIME_WAIT entries count as inactive connections: let them expire in 1 s.
    node.exec_ok("ipvsadm", &["--set", "900", "1", "300"]).unwrap();
    let mut conn = Conn::open(tb.external(), "198.18.128.5:80".parse().unwrap());
    assert_eq!(conn.ask().unwrap(), "web");

    let config = kproxy_ipvs::Config { exclude_cidrs: vec!["203.0.113.0/24".parse().unwrap()], ..Default::default() };
    let key = |a: &str| ServiceKey::Addr { addr: a.parse().unwrap(), port: 80, protocol: Protocol::Tcp };
    let pass = || {
        node.run_in(|| {
            let found = find(Own::Nftables, &config).unwrap();
            (found.clone(), remove(Own::Nftables, &config, &found))
        })
        .unwrap()
    };
    let (found, removal) = pass();
    // The kernel lists virtual services in its hash table's order.
    let mut services: Vec<_> = found.ipvs.as_ref().unwrap().services.iter().map(|(k, _)| *k).collect();
    services.sort();
    assert_eq!(services, [key("198.18.128.5"), key("198.18.128.6")], "the excluded one is not kube-proxy's");
    assert_eq!(removal.draining, [(key("198.18.128.5"), 1)], "{removal:?}");
    assert_eq!(conn.ask().unwrap(), "web", "the open connection still works");
    let listed = node.exec_ok("ipvsadm", &["-Ln"]).unwrap();
    assert!(!listed.contains("198.18.128.6:80") && listed.contains("198.18.128.5:80"), "{listed}");
    assert!(node.ip(["link", "show", "kube-ipvs0"]).is_ok(), "kube-ipvs0 stays while a service drains");

    drop(conn);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, removal) = pass();
        if removal.is_complete() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never drained: {removal:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let listed = node.exec_ok("ipvsadm", &["-Ln"]).unwrap();
    assert!(!listed.contains("198.18.128.5:80") && listed.contains("203.0.113.9:80"), "{listed}");
    assert!(node.ip(["link", "show", "kube-ipvs0"]).is_err(), "kube-ipvs0 goes with the last service");
}

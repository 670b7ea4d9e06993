//! Smoke tests of the kernels the packet suite runs on: an IPVS virtual service balancing real TCP
//! connections, an nftables flowtable offloading one, every IPVS scheduler, and the building
//! blocks (veth, bridge, IPv6, nftables, both iptables backends, conntrack; dummy devices, which
//! the development kernel also lacks).
//!
//! Written once for both kernels: on the development host IPVS and flowtables are missing, so
//! those tests report that they need the guest kernel and `cargo xtask guest-test` runs them in
//! Debian's kernel, where the kernel's own view is asserted (`ipvsadm -Ln`, `[OFFLOAD]` in
//! `conntrack -L`). Everything happens in namespaces the test creates and removes; the TCP
//! servers and clients are busybox `nc` started inside them.

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use kproxy_testbed::require_kernel;

/// A network namespace named uniquely for this process and test; removed (with every process
/// still running in it) on drop, also when the test panics.
struct Netns {
    name: String,
}

impl Netns {
    fn new(role: &str) -> Netns {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!("kpsmoke-{}-{}-{role}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        run(Command::new("ip").args(["netns", "add", &name]));
        let netns = Netns { name };
        netns.ip(&["link", "set", "lo", "up"]);
        netns
    }

    /// `ip -n <ns> ARGS`, asserting success.
    fn ip(&self, args: &[&str]) -> String {
        run(Command::new("ip").args(["-n", &self.name]).args(args))
    }

    /// A command to run inside the namespace.
    fn exec(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.name, program]);
        command
    }

    fn sysctl(&self, key: &str, value: &str) {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        run(self.exec("sh").args(["-c", &format!("echo {value} > {path}")]));
    }

    /// A veth pair between `self` (named `name`) and `peer` (named `peer_name`), created directly
    /// inside the two namespaces so nothing ever appears in the root namespace.
    fn veth(&self, name: &str, peer: &Netns, peer_name: &str) {
        run(Command::new("ip")
            .args(["link", "add", name, "netns", &self.name, "type", "veth", "peer", "name"])
            .args([peer_name, "netns", &peer.name]));
        self.ip(&["link", "set", name, "up"]);
        peer.ip(&["link", "set", peer_name, "up"]);
    }

    /// Starts a long-running process in the namespace; it is killed on drop.
    fn spawn(&self, program: &str, args: &[&str], stdin: Stdio) -> Background {
        let child = self
            .exec(program)
            .args(args)
            .stdin(stdin)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {program} in {}: {error}", self.name));
        Background(child)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Ok(pids) = Command::new("ip").args(["netns", "pids", &self.name]).output() {
            for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// A process started in a namespace, killed and reaped on drop.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `command`, asserts it succeeded and returns its stdout.
fn run(command: &mut Command) -> String {
    let output = command.stdin(Stdio::null()).output().unwrap_or_else(|error| panic!("{command:?}: {error}"));
    assert_success(command, &output);
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn assert_success(command: &Command, output: &Output) {
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Polls `check` every 200 ms until it returns `Some` or `timeout` passes.
fn wait_for<T>(timeout: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// A TCP server answering each connection with `name` (busybox `nc -ll -e echo NAME`).
fn name_server(netns: &Netns, port: &str, name: &str) -> Background {
    netns.spawn("busybox", &["nc", "-ll", "-p", port, "-e", "echo", name], Stdio::null())
}

/// Whether a TCP socket listens on `port` in `netns`.
fn listening(netns: &Netns, port: &str) -> bool {
    !run(netns.exec("ss").args(["-H", "-l", "-t", "-n", "sport", "=", &format!(":{port}")])).trim().is_empty()
}

/// One TCP connection from `client` to `address:port`; returns what the server sent.
fn fetch(client: &Netns, address: &str, port: &str) -> String {
    let output = client
        .exec("busybox")
        .args(["nc", "-w", "5", address, port])
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|error| panic!("busybox nc: {error}"));
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

#[test]
fn ipvs_virtual_service_balances_tcp_between_backends() {
    require_kernel!(Ipvs, Dummy);
    // client ── director (VIP 198.19.0.10 on a dummy, IPVS NAT) ── backend-1, backend-2
    let director = Netns::new("lb");
    let client = Netns::new("client");
    let backends = [Netns::new("b1"), Netns::new("b2")];
    director.sysctl("net.ipv4.ip_forward", "1");
    director.veth("vclient", &client, "eth0");
    director.ip(&["addr", "add", "198.18.1.1/24", "dev", "vclient"]);
    client.ip(&["addr", "add", "198.18.1.2/24", "dev", "eth0"]);
    client.ip(&["route", "add", "default", "via", "198.18.1.1"]);
    let mut servers = Vec::new();
    for (index, backend) in backends.iter().enumerate() {
        let (link, subnet) = (format!("vb{index}"), 2 + index);
        director.veth(&link, backend, "eth0");
        director.ip(&["addr", "add", &format!("198.18.{subnet}.1/24"), "dev", &link]);
        backend.ip(&["addr", "add", &format!("198.18.{subnet}.2/24"), "dev", "eth0"]);
        backend.ip(&["route", "add", "default", "via", &format!("198.18.{subnet}.1")]);
        servers.push(name_server(backend, "8080", &format!("backend-{}", index + 1)));
    }
    director.ip(&["link", "add", "kube-ipvs0", "type", "dummy"]);
    director.ip(&["addr", "add", "198.19.0.10/32", "dev", "kube-ipvs0"]);
    director.ip(&["link", "set", "kube-ipvs0", "up"]);
    run(director.exec("ipvsadm").args(["-A", "-t", "198.19.0.10:80", "-s", "rr"]));
    for real in ["198.18.2.2:8080", "198.18.3.2:8080"] {
        run(director.exec("ipvsadm").args(["-a", "-t", "198.19.0.10:80", "-r", real, "-m"]));
    }

    let table = run(director.exec("ipvsadm").arg("-Ln"));
    let rows: Vec<Vec<&str>> = table.lines().map(|line| line.split_whitespace().collect()).collect();
    assert!(rows.contains(&vec!["TCP", "198.19.0.10:80", "rr"]), "no virtual service in:\n{table}");
    for real in ["198.18.2.2:8080", "198.18.3.2:8080"] {
        assert!(
            rows.iter().any(|row| row.len() >= 4 && row[..4] == ["->", real, "Masq", "1"]),
            "no NAT real server {real} in:\n{table}"
        );
    }

    // The servers need a moment to listen; then round robin alternates between them.
    let first =
        wait_for(Duration::from_secs(10), || Some(fetch(&client, "198.19.0.10", "80")).filter(|r| !r.is_empty()));
    let mut answers = vec![first.unwrap_or_else(|| panic!("no answer through the virtual service:\n{table}"))];
    answers.extend((0..3).map(|_| fetch(&client, "198.19.0.10", "80")));
    for backend in ["backend-1", "backend-2"] {
        assert_eq!(answers.iter().filter(|answer| *answer == backend).count(), 2, "answers: {answers:?}");
    }
    let connections = run(director.exec("ipvsadm").arg("-Lnc"));
    assert!(connections.contains("198.19.0.10:80"), "IPVS lists no connection:\n{connections}");
}

#[test]
fn flowtable_offloads_an_established_tcp_flow() {
    require_kernel!(Flowtable);
    // sender ── router (flowtable on both links) ── receiver
    let router = Netns::new("rt");
    let sender = Netns::new("tx");
    let receiver = Netns::new("rx");
    router.sysctl("net.ipv4.ip_forward", "1");
    router.veth("ra", &sender, "eth0");
    router.veth("rb", &receiver, "eth0");
    router.ip(&["addr", "add", "198.18.4.1/24", "dev", "ra"]);
    router.ip(&["addr", "add", "198.18.5.1/24", "dev", "rb"]);
    sender.ip(&["addr", "add", "198.18.4.2/24", "dev", "eth0"]);
    sender.ip(&["route", "add", "default", "via", "198.18.4.1"]);
    receiver.ip(&["addr", "add", "198.18.5.2/24", "dev", "eth0"]);
    receiver.ip(&["route", "add", "default", "via", "198.18.5.1"]);
    let ruleset = "table inet smoke {
        flowtable ft { hook ingress priority 0; devices = { ra, rb }; counter; }
        chain forward {
            type filter hook forward priority 0; policy accept;
            meta l4proto tcp flow add @ft
        }
    }";
    let mut nft = router.exec("nft").args(["-f", "-"]).stdin(Stdio::piped()).spawn().expect("nft");
    nft.stdin.take().expect("stdin").write_all(ruleset.as_bytes()).expect("write ruleset");
    assert!(nft.wait().expect("nft").success(), "nft rejected the flowtable ruleset");

    // A long-lived connection: both ends keep their stdin open until the test ends.
    let _server = receiver.spawn("busybox", &["nc", "-l", "-p", "9000"], Stdio::piped());
    assert!(wait_for(Duration::from_secs(10), || listening(&receiver, "9000").then_some(())).is_some());
    let mut client = sender.spawn("busybox", &["nc", "198.18.5.2", "9000"], Stdio::piped());
    let mut stream = client.0.stdin.take().expect("client stdin");
    let entry = wait_for(Duration::from_secs(30), || {
        if let Ok(Some(status)) = client.0.try_wait() {
            panic!("the client exited ({status}) instead of keeping the connection open");
        }
        // Established traffic through the forward chain is what `flow add` offloads.
        let _ = stream.write_all(&[b'x'; 16 * 1024]);
        let table = run(router.exec("conntrack").arg("-L"));
        table.lines().find(|line| line.contains("dport=9000") && line.contains("[OFFLOAD]")).map(str::to_owned)
    });
    let table = run(router.exec("conntrack").arg("-L"));
    let entry = entry.unwrap_or_else(|| panic!("no [OFFLOAD] conntrack entry for the flow:\n{table}"));
    assert!(entry.starts_with("tcp") && entry.contains("src=198.18.4.2 dst=198.18.5.2"), "{entry}");
    let flowtables = run(router.exec("nft").args(["list", "flowtables"]));
    assert!(flowtables.contains("flowtable ft"), "{flowtables}");
}

#[test]
fn every_ipvs_scheduler_is_available() {
    require_kernel!(Ipvs);
    let netns = Netns::new("sched");
    let schedulers = ["rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh"];
    for (index, scheduler) in schedulers.iter().enumerate() {
        let service = format!("198.19.1.{}:80", index + 1);
        run(netns.exec("ipvsadm").args(["-A", "-t", &service, "-s", scheduler]));
    }
    let table = run(netns.exec("ipvsadm").arg("-Ln"));
    for (index, scheduler) in schedulers.iter().enumerate() {
        let row = ["TCP".to_owned(), format!("198.19.1.{}:80", index + 1), (*scheduler).to_owned()];
        assert!(
            table.lines().any(|line| line.split_whitespace().take(3).eq(row.iter().map(String::as_str))),
            "scheduler {scheduler} missing from:\n{table}"
        );
    }
}

#[test]
fn packet_suite_building_blocks_work() {
    require_kernel!();
    let host = Netns::new("blk");
    let peer = Netns::new("blkpeer");
    host.ip(&["link", "add", "br0", "type", "bridge"]);
    host.veth("veth0", &peer, "eth0");
    host.ip(&["link", "set", "veth0", "master", "br0"]);
    host.ip(&["link", "set", "br0", "up"]);
    host.ip(&["addr", "add", "198.18.6.1/24", "dev", "br0"]);
    host.ip(&["addr", "add", "fd00:6::1/64", "dev", "br0", "nodad"]);
    peer.ip(&["addr", "add", "198.18.6.2/24", "dev", "eth0"]);
    peer.ip(&["addr", "add", "fd00:6::2/64", "dev", "eth0", "nodad"]);
    let links = host.ip(&["-br", "link"]);
    for name in ["br0", "veth0@"] {
        assert!(links.contains(name), "{name} missing:\n{links}");
    }

    // nftables and both iptables backends accept NAT rules; conntrack sees TCP over v4 and v6.
    run(host.exec("nft").args(["add", "table", "inet", "blocks"]));
    run(host.exec("nft").args([
        "add",
        "chain",
        "inet",
        "blocks",
        "post",
        "{ type nat hook postrouting priority 100; }",
    ]));
    run(host.exec("nft").args(["add", "rule", "inet", "blocks", "post", "ct state new counter masquerade"]));
    for tool in ["iptables-legacy", "iptables-nft", "ip6tables-legacy", "ip6tables-nft"] {
        run(host.exec(tool).args(["-t", "nat", "-A", "POSTROUTING", "-j", "MASQUERADE"]));
        let rules = run(host.exec(tool).args(["-t", "nat", "-S", "POSTROUTING"]));
        assert!(rules.contains("-A POSTROUTING -j MASQUERADE"), "{tool}:\n{rules}");
    }
    let _v4 = name_server(&peer, "7000", "peer-v4");
    let _v6 = name_server(&peer, "7001", "peer-v6");
    let v4 = wait_for(Duration::from_secs(10), || Some(fetch(&host, "198.18.6.2", "7000")).filter(|r| !r.is_empty()));
    assert_eq!(v4.as_deref(), Some("peer-v4"));
    let v6 = wait_for(Duration::from_secs(10), || Some(fetch(&host, "fd00:6::2", "7001")).filter(|r| !r.is_empty()));
    assert_eq!(v6.as_deref(), Some("peer-v6"));
    let table = run(host.exec("conntrack").args(["-L", "-p", "tcp"]));
    assert!(table.contains("dst=198.18.6.2") && table.contains("dport=7000"), "{table}");
    assert!(table.contains("dst=fd00:6::2") && table.contains("dport=7001"), "{table}");
}

#[test]
fn dummy_devices_hold_addresses() {
    require_kernel!(Dummy);
    let netns = Netns::new("dummy");
    netns.ip(&["link", "add", "kube-ipvs0", "type", "dummy"]);
    netns.ip(&["addr", "add", "198.19.2.1/32", "dev", "kube-ipvs0"]);
    netns.ip(&["addr", "add", "fd00:2::1/128", "dev", "kube-ipvs0", "nodad"]);
    let addresses = netns.ip(&["-br", "addr", "show", "kube-ipvs0"]);
    assert!(addresses.contains("198.19.2.1/32") && addresses.contains("fd00:2::1/128"), "{addresses}");
}

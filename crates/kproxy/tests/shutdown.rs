//! SIGTERM stops kproxy promptly even while a sync is in progress. The sync is made to hang
//! for as long as the test wants: `--dry-run` prints its transaction to stdout, a pipe this test
//! never drains, so the print blocks once the pipe is full. No root needed.
//!
//! The kernel side (root, network namespaces): SIGTERM in the middle of a real nftables cold
//! start of 30,000 Services, against a fake API server.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

mod support;

use std::fmt::Write as _;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Services enough for the first transaction's text to overflow a 64 KiB pipe many times.
const SERVICES: usize = 600;

fn manifests(dir: &std::path::Path) {
    let mut text = String::new();
    for i in 0..SERVICES {
        let (hi, lo) = (i / 250, i % 250 + 1);
        write!(
            text,
            "---\napiVersion: v1\nkind: Service\nmetadata: {{namespace: big, name: s{i}}}\n\
             spec: {{clusterIP: 198.19.{hi}.{lo}, ports: [{{name: p, port: 80, protocol: TCP, targetPort: 8080}}]}}\n\
             ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
             metadata: {{namespace: big, name: s{i}-1, labels: {{kubernetes.io/service-name: s{i}}}}}\n\
             addressType: IPv4\nendpoints: [{{addresses: [198.18.{}.{lo}], conditions: {{ready: true}}}}]\n\
             ports: [{{name: p, port: 8080, protocol: TCP}}]\n",
            16 + hi
        )
        .unwrap();
    }
    std::fs::write(dir.join("big.yaml"), text).unwrap();
}

#[test]
fn sigterm_during_a_sync_that_does_not_end_exits_within_a_second() {
    let dir = std::env::temp_dir().join(format!("kproxy-shutdown-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    manifests(&dir);
    let mut child = Command::new(env!("CARGO_BIN_EXE_kproxy"))
        .arg(format!("--manifests={}", dir.display()))
        .args(["--dry-run", "--hostname-override=node-a", "--metrics-bind-address=", "--healthz-bind-address="])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    // The first byte of the first transaction: the sync is running, and about to fill the pipe.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    stdout.read_exact(&mut first).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "kproxy is still running, its sync blocked");

    let asked = Instant::now();
    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(killed.success());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if asked.elapsed() > Duration::from_secs(5) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = asked.elapsed();
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    drop(stdout);
    let log = log.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let status = status.unwrap_or_else(|| panic!("kproxy did not exit within 5 s of SIGTERM:\n{log}"));
    assert!(took < Duration::from_secs(1), "SIGTERM took {took:?}:\n{log}");
    assert!(status.success(), "a stop on SIGTERM is a clean exit: {status:?}\n{log}");
    assert!(!log.contains("full sync done"), "the sync was still in progress when SIGTERM came:\n{log}");
    assert!(log.contains("stopping"), "{log}");
}

/// Bulk Services enough for kproxy's cold start to take seconds (several nf_tables
/// transactions; the base chains come in the last one).
const COLD_START_SERVICES: usize = 30_000;

/// The two cold-start tests run one at a time: each sends SIGTERM inside a window of a few
/// seconds that its own cold start opens. Side by side on two cores, the other's cold start
/// (30,000 Services listed and written) delayed the `nft list tables` poll that watches for the
/// window past its end: the table was seen 6 s after kproxy's log says it was committed.
static COLD_STARTS: Mutex<()> = Mutex::new(());

fn one_cold_start_at_a_time() -> MutexGuard<'static, ()> {
    COLD_STARTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `kproxy` in namespace `ns` against the API server at `url`, its stderr in `dir/kproxy.log`.
fn kproxy_logged(ns: &str, url: &str, dir: &std::path::Path, args: &[String]) -> support::KillOnDrop {
    let kubeconfig = support::write_kubeconfig(dir, url);
    let log = std::fs::File::create(dir.join("kproxy.log")).unwrap();
    support::KillOnDrop(
        Command::new("ip")
            .args(["netns", "exec", ns, env!("CARGO_BIN_EXE_kproxy")])
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args)
            // The cold start's progress, transaction by transaction, for the failure messages.
            .env("KPROXY_LOG", "info,kproxy_nftables=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// Sends SIGTERM; returns how long the process took to exit, and its status (`None`: not
/// within 5 s, then it is killed).
fn terminate(child: &mut std::process::Child) -> (Duration, Option<std::process::ExitStatus>) {
    let asked = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap().success());
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (asked.elapsed(), Some(status));
        }
        if asked.elapsed() > Duration::from_secs(5) {
            return (asked.elapsed(), None);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A kproxy cold-starting the big cluster in `mode`, its log in a directory of its own.
struct ColdStart {
    dir: std::path::PathBuf,
    args: Vec<String>,
    daemon: support::KillOnDrop,
    started: Instant,
}

impl ColdStart {
    fn spawn(sandbox: &support::BulkSandbox, mode: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kproxy-sigterm-{mode}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let args = support::node_a_args(support::free_port(), &[&format!("--proxy-mode={mode}")]);
        let started = Instant::now();
        let daemon = kproxy_logged(sandbox.tb.node().name(), &sandbox.api.server.url(), &dir, &args);
        ColdStart { dir, args, daemon, started }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("kproxy.log")).unwrap_or_default()
    }

    /// SIGTERM: kproxy must exit within a second, cleanly, saying it stops. Returns how long it
    /// took and its log.
    fn stop_promptly(&mut self) -> (Duration, String) {
        let (took, status) = terminate(&mut self.daemon.0);
        let log = self.log();
        assert!(status.is_some(), "kproxy did not exit within 5 s of SIGTERM:\n{log}");
        assert!(took < Duration::from_secs(1), "SIGTERM took {took:?}:\n{log}");
        assert!(status.unwrap().success(), "a stop on SIGTERM is a clean exit: {status:?}\n{log}");
        assert!(log.contains("stopping"), "{log}");
        (took, log)
    }
}

/// kproxy's nftables tables in `ns` (`ip kproxy`, `ip6 kproxy`) and, for each, its base chains
/// (those with a hook).
fn kproxy_tables(ns: &kproxy_testbed::Netns) -> Vec<(String, Vec<String>)> {
    let text = ns.exec_ok("nft", &["-j", "list", "chains"]).unwrap();
    let listing: serde_json::Value = serde_json::from_str(&text).unwrap();
    let tables = ns.exec_ok("nft", &["list", "tables"]).unwrap();
    let mut out = Vec::new();
    for family in ["ip", "ip6"] {
        if !tables.lines().any(|l| l.trim() == format!("table {family} kproxy")) {
            continue;
        }
        let hooked = listing["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|o| o.get("chain"))
            .filter(|c| c["family"] == family && c["table"] == "kproxy" && c.get("hook").is_some())
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect();
        out.push((format!("{family} kproxy"), hooked));
    }
    out
}

/// What "the kernel consistent" means after a cold start cut short: the cold start writes
/// kproxy's tables in bounded transactions, every Service's chains before the base chains, and
/// the base chains (the only ones hooked into netfilter) in the last. So a table without base
/// chains is inert: packets never enter it. A cut cold start leaves the tables created so far and
/// no base chain, the node's traffic as it was without kproxy; a restart replaces the tables.
#[test]
fn sigterm_during_a_cold_start_exits_within_a_second_with_no_base_chain_hooked_and_a_restart_serves() {
    use kproxy_testbed::{ProbeResult, Proto, probe};
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let _alone = one_cold_start_at_a_time();
    let sandbox = support::bulk_sandbox(COLD_START_SERVICES);
    let mut run = ColdStart::spawn(&sandbox, "nftables");
    let support::BulkSandbox { tb, web, client, api } = &sandbox;
    // The cold start's first transaction (it creates the table) is in the kernel.
    while !tb.node().exec_ok("nft", &["list", "tables"]).unwrap().contains("table ip kproxy") {
        assert!(run.started.elapsed() < support::START, "kproxy never created its table:\n{}", run.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let table_after = run.started.elapsed();
    let (took, log) = run.stop_promptly();
    assert!(
        !log.contains("nftables cold start applied"),
        "the cold start ended before SIGTERM ({table_after:?} after start): the test needs more Services:\n{log}"
    );

    let tables = kproxy_tables(tb.node());
    assert!(tables.iter().any(|(t, _)| t == "ip kproxy"), "{tables:?}");
    for (table, hooked) in &tables {
        assert!(hooked.is_empty(), "a cut cold start left base chains hooked in {table}: {hooked:?}\n{log}");
    }
    let web_ip: std::net::SocketAddr = format!("{}:8080", web.ipv4()).parse().unwrap();
    let got = probe(client.netns(), Proto::Tcp, web_ip, Duration::from_millis(500)).unwrap();
    assert!(matches!(&got, ProbeResult::Answered { backend, .. } if backend == "web-b"), "pod to pod: {got:?}");
    let service: std::net::SocketAddr = "198.18.128.10:80".parse().unwrap();
    let got = probe(client.netns(), Proto::Tcp, service, Duration::from_millis(500)).unwrap();
    assert!(got.backend().is_none(), "nothing of kproxy's is hooked, nothing DNATs the ClusterIP: {got:?}");

    // A restart over what was left converges.
    drop(run.daemon);
    let (_daemon, restart_dir) =
        support::kproxy_in(tb.node().name(), &api.server.url(), "sigterm-cold-restart", &run.args);
    let got = support::answered_by(client.netns(), service, "web-b", support::START);
    assert!(matches!(&got, ProbeResult::Answered { .. }), "a restart serves the Service: {got:?}");
    let tables = kproxy_tables(tb.node());
    assert!(tables.iter().all(|(_, hooked)| !hooked.is_empty()), "{tables:?}");
    let parts = log.matches("nftables cold start progress").count();
    eprintln!(
        "table after {table_after:?}, SIGTERM took {took:?} ({parts} cold start transactions in), restart served \
         after {:?}",
        run.started.elapsed()
    );
    let _ = std::fs::remove_dir_all(&run.dir);
    let _ = std::fs::remove_dir_all(&restart_dir);
}

/// The pid of a child of `parent` whose command line names an `iptables-restore`, if one runs.
fn restore_child(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let ppid: u32 = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        (ppid == parent && String::from_utf8_lossy(&cmdline).contains("restore")).then_some(pid)
    })
}

/// The rules of `family` (`iptables`, `ip6tables`) in `ns` that jump from a built-in chain into
/// one of kproxy's, read through both backends (kproxy picks one).
fn jumps_into_kproxy(ns: &kproxy_testbed::Netns, family: &str) -> Vec<String> {
    let mut jumps = Vec::new();
    for backend in ["nft", "legacy"] {
        let save = ns.exec_ok(&format!("{family}-{backend}-save"), &[] as &[&str]).unwrap_or_default();
        jumps.extend(
            save.lines()
                .filter(|l| {
                    let chain = l.strip_prefix("-A ").and_then(|r| r.split_whitespace().next()).unwrap_or("");
                    chain.chars().all(|c| c.is_ascii_uppercase()) && l.contains(" -j KUBE-")
                })
                .map(|l| format!("{backend}: {l}")),
        );
    }
    jumps
}

/// What "the kernel consistent" means in iptables mode: each `iptables-restore` section is one
/// atomic commit, a restore's sections are ordered so that nothing jumps to a chain not yet
/// written, and the jumps from the built-in chains into kproxy's are added after the restore. A
/// restore cut short (kproxy gone: the tool reads end of input before `COMMIT`) or completed by
/// the orphaned tool leaves kproxy's chains unreachable unless every jump into them was added, in
/// which case they are complete: the Service either answers as after a fresh start, or nothing of
/// kproxy's sees the node's packets.
#[test]
fn sigterm_during_an_iptables_cold_start_restore_exits_within_a_second_leaving_the_kernel_consistent() {
    use kproxy_testbed::{ProbeResult, Proto, probe};
    if !kproxy_testbed::kernel::require_root() {
        return;
    }
    let _alone = one_cold_start_at_a_time();
    let sandbox = support::bulk_sandbox(COLD_START_SERVICES);
    let mut run = ColdStart::spawn(&sandbox, "iptables");
    let support::BulkSandbox { tb, web, client, api } = &sandbox;
    let restore = loop {
        if let Some(pid) = restore_child(run.daemon.0.id()) {
            break pid;
        }
        assert!(run.started.elapsed() < support::START, "kproxy never ran iptables-restore:\n{}", run.log());
        assert!(run.daemon.0.try_wait().unwrap().is_none(), "kproxy exited:\n{}", run.log());
        std::thread::sleep(Duration::from_millis(5));
    };
    let restore_after = run.started.elapsed();
    let (took, log) = run.stop_promptly();
    assert!(!log.contains("full sync done"), "the sync ended before SIGTERM ({restore_after:?} after start):\n{log}");
    // The orphaned tool finishes (or gives up on its cut input) on its own.
    let orphan = Instant::now();
    while std::path::Path::new(&format!("/proc/{restore}")).exists() && orphan.elapsed() < support::START {
        std::thread::sleep(Duration::from_millis(20));
    }
    let orphan_took = orphan.elapsed();

    let service: std::net::SocketAddr = "198.18.128.10:80".parse().unwrap();
    let got = probe(client.netns(), Proto::Tcp, service, Duration::from_millis(500)).unwrap();
    let jumps = jumps_into_kproxy(tb.node(), "iptables");
    if jumps.is_empty() {
        assert!(got.backend().is_none(), "no jump into kproxy's chains, yet the ClusterIP is DNATed: {got:?}");
    } else {
        assert_eq!(got.backend(), Some("web-b"), "kproxy's chains are reachable, so complete: {jumps:#?}\n{log}");
    }
    let web_ip: std::net::SocketAddr = format!("{}:8080", web.ipv4()).parse().unwrap();
    let direct = probe(client.netns(), Proto::Tcp, web_ip, Duration::from_millis(500)).unwrap();
    assert_eq!(direct.backend(), Some("web-b"), "pod to pod: {direct:?}");
    let jumps6 = jumps_into_kproxy(tb.node(), "ip6tables");

    // A restart over what was left converges.
    drop(run.daemon);
    let (_daemon, restart_dir) =
        support::kproxy_in(tb.node().name(), &api.server.url(), "sigterm-iptables-restart", &run.args);
    let got = support::answered_by(client.netns(), service, "web-b", support::START);
    assert!(matches!(&got, ProbeResult::Answered { .. }), "a restart serves the Service: {got:?}");
    eprintln!(
        "restore after {restore_after:?}, SIGTERM took {took:?}, the orphaned restore ended {orphan_took:?} later; \
         jumps left: {} IPv4, {} IPv6; restart served after {:?}",
        jumps.len(),
        jumps6.len(),
        run.started.elapsed()
    );
    let _ = std::fs::remove_dir_all(&run.dir);
    let _ = std::fs::remove_dir_all(&restart_dir);
}

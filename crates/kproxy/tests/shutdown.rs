//! SIGTERM stops kproxy promptly even while a sync is in progress. The sync is made to hang
//! for as long as the test wants: `--dry-run` prints its transaction to stdout, a pipe this test
//! never drains, so the print blocks once the pipe is full. No root needed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers: a panic is a test failure

use std::fmt::Write as _;
use std::io::Read;
use std::process::{Command, Stdio};
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

//! `cargo xtask cluster accel` (#36): Services acceleration (docs/acceleration.md) between real
//! pods on a real node, in whichever proxy mode the cluster runs. Flowtables need a kernel that
//! has them: run it with `--guest` here.
//!
//! Two nodes. A server pod on the second (busybox httpd serving a random blob whose sha256 it
//! computed), a client pod on the first, two Services in front of the server: `fast`, opted in
//! (annotation `service.kproxy.io/traffic-hint: LongLived`), and `slow`, not. The ClusterIP is
//! translated on the client's node, so that is where the connection's conntrack entry is
//! offloaded (`[OFFLOAD]`). Checked, each step a line of the report:
//! 1. a throttled transfer through `fast` is offloaded while it runs, and its bytes arrive intact;
//! 2. the same through `slow`: seen in conntrack for its whole length, never offloaded, intact;
//! 3. unthrottled transfers, `fast` and `slow` alternately: throughput of each (median of three)
//!    and their ratio — under TCG the ratio, not the figure, is the result;
//! 4. the endpoint goes away (server pod deleted) during an offloaded transfer: the connection's
//!    entry leaves the flowtable (no `[OFFLOAD]` entry for `fast` is left).

use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kproxy_k8s_harness::cluster::{ClusterInfo, Kubectl, NodeInfo};
use kproxy_k8s_harness::startup_patience;
use kproxy_k8s_harness::wire::{self, Family};

use crate::cluster::{AGNHOST, kubectl_timeout};

const NS: &str = "kproxy-accel";
const BLOB_BYTES: u64 = 32 << 20;
/// The throttled transfers' rate (bytes/s): 32 MiB take 16 s, long enough to watch the entry.
const THROTTLE: &str = "2M";
/// The annotation that opts a Service in (docs/acceleration.md "Opting in").
const OPT_IN: (&str, &str) = ("service.kproxy.io/traffic-hint", "LongLived");
/// How long an offloaded connection may take to leave the flowtable once its endpoint is gone:
/// the pod's deletion (grace period 1 s), the FIN or RST, the flowtable's garbage collection
/// (every second); a hang guard.
const LEAVE_WAIT: Duration = Duration::from_secs(60);

/// Runs the checks on a cluster of at least two nodes running kproxy; returns the report lines
/// (`ok  …` or `FAIL …`).
pub fn run(info: &ClusterInfo) -> anyhow::Result<Vec<String>> {
    if info.nodes.len() < 2 {
        bail!("accel needs two nodes (the transfer crosses from one node to the other)");
    }
    let kubectl = Kubectl::from_info(info);
    let (client_node, server_node) = (&info.nodes[0], &info.nodes[1]);
    kubectl.apply(&manifest(client_node, server_node).to_string())?;
    kubectl.run(&["-n", NS, "wait", "--for=condition=Ready", "pod", "--all", &kubectl_timeout(120)])?;
    let blob_sum = kubectl.run(&["-n", NS, "exec", "server", "--", "cat", "/www/blob.sha256"])?.trim().to_owned();
    let fast = cluster_ip(&kubectl, "fast")?;
    let slow = cluster_ip(&kubectl, "slow")?;
    let conntrack = Conntrack { netns: &client_node.netns };
    let mut lines = Vec::new();

    // 1 and 2: throttled, watched.
    for (service, vip, opted_in) in [("fast", fast, true), ("slow", slow, false)] {
        let mut transfer = Transfer::start(&kubectl, vip, Some(THROTTLE), true)?;
        let watched = conntrack.watch(vip, || transfer.running());
        let done = transfer.finish()?;
        let intact = done.sum.as_deref() == Some(blob_sum.as_str()) && done.bytes == BLOB_BYTES;
        let as_expected = watched.seen && watched.offloaded == opted_in && intact;
        lines.push(format!(
            "{} {service} ({}): {} bytes at {THROTTLE}/s, sha256 {}; its conntrack entry on {} {}",
            verdict(as_expected),
            if opted_in { "opted in" } else { "not opted in" },
            done.bytes,
            if intact { "intact" } else { "WRONG" },
            client_node.name,
            match (watched.seen, watched.offloaded) {
                (false, _) => "was never seen".to_owned(),
                (true, true) => format!("was offloaded ([OFFLOAD]) {:.1} s after the start", watched.offloaded_after),
                (true, false) => "stayed on the regular path (never [OFFLOAD])".to_owned(),
            }
        ));
    }

    // 3: throughput, alternating so that both see the same machine.
    let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..3 {
        for (rate, vip) in rates.iter_mut().zip([fast, slow]) {
            let done = Transfer::start(&kubectl, vip, None, false)?.finish()?;
            if done.bytes != BLOB_BYTES {
                bail!("an unthrottled transfer from {vip} got {} of {BLOB_BYTES} bytes", done.bytes);
            }
            rate.push(done.bytes as f64 / done.secs / 1e6);
        }
    }
    let [fast_rate, slow_rate] = rates.map(|mut r| median(&mut r));
    lines.push(format!(
        "ok   throughput client pod ({}) -> ClusterIP -> server pod ({}), 32 MiB to /dev/null, median of 3: fast (offloaded) {fast_rate:.1} MB/s, slow {slow_rate:.1} MB/s, ratio {:.2}",
        client_node.name,
        server_node.name,
        fast_rate / slow_rate
    ));

    // 4: the endpoint goes away during an offloaded transfer.
    let transfer = Transfer::start(&kubectl, fast, Some(THROTTLE), true)?;
    let offloaded = kubectl
        .wait_for(startup_patience(Duration::from_secs(10)), "the transfer offloaded", || {
            conntrack.offloaded(fast).then_some(())
        })
        .is_ok();
    let deleted = Instant::now();
    kubectl.run(&["-n", NS, "delete", "pod", "server", "--grace-period=1", "--wait=false"])?;
    let left = kubectl
        .wait_for(startup_patience(LEAVE_WAIT), "the entry out of the flowtable", || {
            (!conntrack.offloaded(fast)).then_some(())
        })
        .is_ok();
    let left_after = deleted.elapsed().as_secs_f64();
    let done = transfer.finish()?;
    lines.push(format!(
        "{} endpoint gone mid-transfer: the connection was offloaded {}, the server pod deleted, {} ({} of {BLOB_BYTES} bytes had arrived); entries left for fast: {}",
        verdict(offloaded && left),
        if offloaded { "(seen)" } else { "NEVER (not seen)" },
        if left {
            format!("its entry left the flowtable {left_after:.1} s later")
        } else {
            format!("its entry was still [OFFLOAD] {left_after:.0} s later")
        },
        done.bytes,
        conntrack.entries(fast).join(" | ")
    ));
    Ok(lines)
}

fn verdict(ok: bool) -> &'static str {
    if ok { "ok  " } else { "FAIL" }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn cluster_ip(kubectl: &Kubectl, service: &str) -> anyhow::Result<IpAddr> {
    let ip = kubectl.run(&["-n", NS, "get", "svc", service, "-o", "jsonpath={.spec.clusterIP}"])?;
    ip.trim().parse().with_context(|| format!("{service}'s ClusterIP {ip:?}"))
}

fn manifest(client_node: &NodeInfo, server_node: &NodeInfo) -> serde_json::Value {
    let serve = format!(
        "mkdir -p /www && head -c {BLOB_BYTES} /dev/urandom > /www/blob && sha256sum /www/blob | cut -d' ' -f1 > /www/blob.sha256 && exec httpd -f -p 8080 -h /www"
    );
    let service = |name: &str, opted_in: bool| {
        let mut metadata = serde_json::json!({"name": name, "namespace": NS});
        if opted_in {
            metadata["annotations"] = serde_json::json!({OPT_IN.0: OPT_IN.1});
        }
        serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": metadata,
            "spec": {"selector": {"app": "server"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    };
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "server", "namespace": NS, "labels": {"app": "server"}},
         "spec": {"nodeName": server_node.name, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "httpd", "image": AGNHOST, "command": ["sh", "-c", serve],
                "ports": [{"containerPort": 8080}],
                "readinessProbe": {"httpGet": {"path": "/blob.sha256", "port": 8080}, "periodSeconds": 1}}]}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": NS},
         "spec": {"nodeName": client_node.name, "containers": [{"name": "client", "image": AGNHOST, "args": ["pause"]}]}},
        service("fast", true),
        service("slow", false),
    ]})
}

/// One download of the blob by the client pod, through a ClusterIP.
struct Transfer {
    child: Child,
    what: String,
}

/// What a finished transfer printed: the sha256 of what arrived (when asked), bytes, seconds.
struct Done {
    sum: Option<String>,
    bytes: u64,
    secs: f64,
}

impl Transfer {
    /// `limit`: curl's `--limit-rate`; `checksum`: hash what arrives (else it goes to /dev/null,
    /// so the client's CPU does not bound the throughput).
    fn start(kubectl: &Kubectl, vip: IpAddr, limit: Option<&str>, checksum: bool) -> anyhow::Result<Transfer> {
        let url = format!("http://{}/blob", wire::host_port(vip, 80));
        let limit = limit.map(|rate| format!("--limit-rate {rate}")).unwrap_or_default();
        // curl's -w goes to stderr (%{stderr}) so that stdout is the body alone. A connection
        // that stalls (its endpoint gone without a RST reaching the client) ends after 60 s.
        let fetch = format!(
            "curl -sS --max-time 900 --speed-limit 1 --speed-time 60 {limit} -w '%{{stderr}}%{{size_download}} %{{time_total}}' {url}"
        );
        let script = if checksum {
            format!("sum=$({fetch} 2>/tmp/w | sha256sum | cut -d' ' -f1); echo \"$sum $(cat /tmp/w)\"")
        } else {
            format!("{fetch} -o /dev/null 2>/tmp/w; echo \"- $(cat /tmp/w)\"")
        };
        let child = kubectl
            .command(&["-n", NS, "exec", "client", "--", "bash", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting a transfer in the client pod")?;
        Ok(Transfer { child, what: format!("{url} {limit}") })
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    fn finish(self) -> anyhow::Result<Done> {
        let out = self.child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        Done::parse(&text).with_context(|| {
            format!("transfer {}: printed {text:?} ({})", self.what, String::from_utf8_lossy(&out.stderr).trim())
        })
    }
}

impl Done {
    /// `SUM|- [curl's errors…] BYTES SECONDS`, as [`Transfer::start`]'s script prints it.
    fn parse(text: &str) -> Option<Done> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let [first, .., bytes, secs] = words[..] else { return None };
        Some(Done {
            sum: (first != "-").then(|| first.to_owned()),
            bytes: bytes.parse().ok()?,
            secs: secs.parse().ok()?,
        })
    }
}

/// The conntrack table of the node where the client's connections are translated.
struct Conntrack<'a> {
    netns: &'a str,
}

/// What watching a transfer's entries showed.
struct Watched {
    seen: bool,
    offloaded: bool,
    offloaded_after: f64,
}

impl Conntrack<'_> {
    /// The TCP entries whose original destination is `vip`:80.
    fn entries(&self, vip: IpAddr) -> Vec<String> {
        let family = match Family::of(vip) {
            Family::V4 => "ipv4",
            Family::V6 => "ipv6",
        };
        let vip = vip.to_string();
        let out = Command::new("ip")
            .args(["netns", "exec", self.netns, "conntrack", "-L", "-f", family, "-p", "tcp"])
            .args(["--orig-dst", &vip, "--orig-port-dst", "80"])
            .stderr(Stdio::null())
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).lines().map(str::to_owned).collect()).unwrap_or_default()
    }

    fn offloaded(&self, vip: IpAddr) -> bool {
        self.entries(vip).iter().any(|entry| entry.contains("[OFFLOAD]"))
    }

    /// Polls `vip`'s entries while `running` says the transfer runs.
    fn watch(&self, vip: IpAddr, mut running: impl FnMut() -> bool) -> Watched {
        let started = Instant::now();
        let mut watched = Watched { seen: false, offloaded: false, offloaded_after: 0.0 };
        while running() {
            let entries = self.entries(vip);
            watched.seen |= entries.iter().any(|e| e.contains("ESTABLISHED") || e.contains("[OFFLOAD]"));
            if !watched.offloaded && entries.iter().any(|e| e.contains("[OFFLOAD]")) {
                watched.offloaded = true;
                watched.offloaded_after = started.elapsed().as_secs_f64();
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        watched
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transfer_reads_sum_bytes_and_seconds_also_after_curl_errors() {
        let done = Done::parse("ab12 33554432 16.004\n").unwrap();
        assert_eq!((done.sum.as_deref(), done.bytes, done.secs), (Some("ab12"), 33554432, 16.004));
        let discarded = Done::parse("- 1000 0.5").unwrap();
        assert_eq!((discarded.sum, discarded.bytes), (None, 1000));
        let cut = Done::parse("e3b0 curl: (18) transfer closed with 5 bytes remaining to read 4096 2.1").unwrap();
        assert_eq!((cut.sum.as_deref(), cut.bytes), (Some("e3b0"), 4096));
        assert!(Done::parse("").is_none());
        assert!(Done::parse("ab12 notanumber 1.0").is_none());
    }
}

//! `kproxy demo`: the whole packet path, live, with no cluster.
//!
//! Builds a sandbox of network namespaces (the testbed: a node, a second node, an external
//! client, pods running TCP/UDP echo servers at the addresses the manifests name), runs the real
//! `kproxy` binary with the nftables dataplane inside the node namespace on the manifests, sends
//! traffic to every ClusterIP, NodePort, LoadBalancer IP and ExternalIP, and prints, for each,
//! what the running kproxy's `/debug/explain` predicted next to who answered and which source
//! address the pod saw, with ✔ when they agree ([`kproxy_plan::explain::Explanation::agrees_with`]);
//! then removes kproxy's tables and the sandbox.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kproxy_plan::explain::{Explanation, Observed, Packet, Strictness, Verdict};
use kproxy_plan::{Plan, Planner, ProxyPolicy, ServicePortPlan};
use kproxy_state::{IpFamily, Protocol};
use kproxy_testbed::{Netns, ProbeOptions, ProbeResult, Proto, Testbed, Where};

/// The node the sandbox plays (the examples describe node-a, node-b and node-c).
const NODE: &str = "node-a";
const PROBES_PER_DESTINATION: usize = 6;
/// Where the sandboxed kproxy serves its metrics and `/debug/explain` (the node namespace's
/// own loopback).
const METRICS_ADDRESS: &str = "127.0.0.1:10249";
/// Flags that keep kproxy's conntrack tuning off, for runs inside a sandbox namespace.
pub const SANDBOX_CONNTRACK_FLAGS: [&str; 3] =
    ["--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0"];

/// Runs the demo on `manifests`.
pub fn run(manifests: &Path, mode: &str) -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the demo creates network namespaces: run it as root");
    }
    let manifests = manifests.canonicalize().with_context(|| format!("{}", manifests.display()))?;
    let state = crate::load_manifests(&manifests)?;
    let policy = ProxyPolicy { detect_local: kproxy_plan::DetectLocal::NodeCidr, ..Default::default() };
    let node_ctx = kproxy_plan::NodeContext { name: NODE.into(), ..Default::default() };
    let plan = Planner::new(policy, node_ctx).build(&state);

    println!(
        "building the sandbox: node {NODE} (198.18.0.2), node-b (198.18.0.3), an external client (198.18.0.10), pods ..."
    );
    let testbed = Testbed::new().context("building the network namespaces")?;
    let names = start_pods(&testbed, &plan)?;
    let client = testbed.add_pod("client", Where::Node).context("adding the client pod")?;

    println!("starting kproxy ({mode}) in the node namespace on {} ...", manifests.display());
    let mut kproxy = KproxyProcess::start(testbed.node(), &manifests, mode)?;
    kproxy.wait_for_rules(testbed.node(), mode, Duration::from_secs(15))?;
    if !kproxy_testbed::kernel::KernelFeature::Flowtable.is_available() {
        println!("this kernel has no flowtables: Services that opt in to acceleration stay on the regular path");
    }

    let mut rows = Vec::new();
    for fam in plan.families.values() {
        for port in fam.services.values() {
            for dest in destinations(&testbed, &client, port) {
                let prediction = ask_kproxy(testbed.node(), &dest, port.protocol)?;
                rows.push(probe_row(port, &dest, &prediction, &names));
            }
        }
    }
    print_table(&rows);
    let disagreements: Vec<&Row> = rows.iter().filter(|r| r.disagreement.is_some()).collect();
    for row in &disagreements {
        println!("✖ {} from {} to {}: {}", row.service, row.from, row.dest, row.disagreement.as_deref().unwrap_or(""));
    }
    let probed = rows.iter().filter(|r| r.checked).count();
    println!(
        "\n{} of {probed} probed rows as explain predicted{}. Only node-a and node-b have pods in the sandbox: \
         endpoints on node-c are predicted but can not answer, so connections sent there get no answer, as \
         with a dead node.",
        probed - disagreements.len(),
        if probed < rows.len() {
            format!(" ({} not probed: no SCTP in this kernel)", rows.len() - probed)
        } else {
            String::new()
        },
    );

    kproxy.stop();
    let cleaned = testbed.node().exec(&std::env::current_exe()?.to_string_lossy(), &["--cleanup"])?;
    let tables = testbed.node().exec("nft", &["list", "tables"])?;
    let saved = testbed.node().exec("iptables-save", &[] as &[&str])?;
    let kube_chains = String::from_utf8_lossy(&saved.stdout).lines().filter(|l| l.starts_with(":KUBE-")).count();
    println!(
        "\nkproxy --cleanup: exit {}; nftables tables left in the node namespace: {:?}; KUBE- iptables chains left: {kube_chains}",
        cleaned.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&tables.stdout).trim()
    );
    drop(testbed);
    println!("sandbox removed.");
    Ok(())
}

/// A pod to start: its name, the ports it serves and its addresses.
type PodSpec = (String, BTreeSet<(Proto, u16)>, Vec<IpAddr>);

/// Starts one pod per endpoint address on node-a and node-b, serving every target port it has.
/// Endpoints on node-c have no pod: traffic sent to them times out, as it would to a dead node.
fn start_pods(testbed: &Testbed, plan: &Plan) -> anyhow::Result<BTreeMap<IpAddr, String>> {
    let mut pods: BTreeMap<(Where, u8), PodSpec> = BTreeMap::new();
    for fam in plan.families.values() {
        for port in fam.services.values() {
            for ep in port.reachable_endpoints() {
                let Some((location, host)) = pod_slot(ep.ip) else { continue };
                let entry = pods.entry((location, host)).or_insert_with(|| {
                    let node = if location == Where::Node { "a" } else { "b" };
                    (format!("{}-{node}{host}", port.name.service), BTreeSet::new(), Vec::new())
                });
                entry.1.insert((proto(port.protocol), ep.port));
                if !entry.2.contains(&ep.ip) {
                    entry.2.push(ep.ip);
                }
            }
        }
    }
    let sctp_ok = kproxy_testbed::kernel::KernelFeature::Sctp.is_available();
    let mut names = BTreeMap::new();
    for ((location, host), (name, ports, ips)) in pods {
        let pod = testbed.add_pod_at(&name, location, host)?;
        for ip in ips.iter().filter(|ip| !pod.ips().contains(ip)) {
            // The examples spell IPv6 pod addresses with the IPv4 host number's digits.
            pod.netns().ip(["addr", "add", &format!("{ip}/128"), "dev", "eth0", "nodad"])?;
            testbed.host(location).ip(["route", "add", &format!("{ip}/128"), "dev", pod.host_iface()])?;
        }
        let ports: Vec<(Proto, u16)> = ports.into_iter().filter(|(p, _)| *p != Proto::Sctp || sctp_ok).collect();
        pod.serve(&ports)?;
        for ip in ips {
            names.insert(ip, name.clone());
        }
        names.insert(IpAddr::V4(pod.ipv4()), name.clone());
    }
    Ok(names)
}

fn pod_slot(ip: IpAddr) -> Option<(Where, u8)> {
    let IpAddr::V4(v4) = ip else {
        // fd00:10:16::26 belongs to the pod with host number 26 on node-a.
        let s = ip.to_string();
        let (location, rest) = if let Some(r) = s.strip_prefix("fd00:10:16::") {
            (Where::Node, r)
        } else {
            (Where::Node2, s.strip_prefix("fd00:10:17::")?)
        };
        return rest.parse().ok().map(|h| (location, h));
    };
    match v4.octets() {
        [198, 18, 16, h] => Some((Where::Node, h)),
        [198, 18, 17, h] => Some((Where::Node2, h)),
        _ => None,
    }
}

fn proto(p: Protocol) -> Proto {
    match p {
        Protocol::Tcp => Proto::Tcp,
        Protocol::Udp => Proto::Udp,
        Protocol::Sctp => Proto::Sctp,
    }
}

/// One probed destination: where from (a name for the table, the namespace, the source
/// address) and where to.
struct Destination<'a> {
    from_name: &'static str,
    from: &'a Netns,
    client: IpAddr,
    dest: SocketAddr,
}

/// Where to send traffic for one service port, and from where.
fn destinations<'a>(
    testbed: &'a Testbed,
    client_pod: &'a kproxy_testbed::Pod,
    port: &ServicePortPlan,
) -> Vec<Destination<'a>> {
    use kproxy_testbed::topology::{EXTERNAL_IP_V4, EXTERNAL_IP_V6, NODE_IP_V4, NODE_IP_V6};
    let v4 = IpFamily::of(&port.cluster_ip) == IpFamily::V4;
    let pick = |a: std::net::Ipv4Addr, b: std::net::Ipv6Addr| if v4 { IpAddr::V4(a) } else { IpAddr::V6(b) };
    let (pod_ip, node_ip, external_ip) = (
        pick(client_pod.ipv4(), client_pod.ipv6()),
        pick(NODE_IP_V4, NODE_IP_V6),
        pick(EXTERNAL_IP_V4, EXTERNAL_IP_V6),
    );
    let cluster_ip = SocketAddr::new(port.cluster_ip, port.port);
    let mut out = vec![
        Destination { from_name: "pod on node-a", from: client_pod.netns(), client: pod_ip, dest: cluster_ip },
        Destination { from_name: "node-a itself", from: testbed.node(), client: node_ip, dest: cluster_ip },
    ];
    let external =
        |dest| Destination { from_name: "external client", from: testbed.external(), client: external_ip, dest };
    if let Some(np) = port.node_port {
        out.push(external(SocketAddr::new(node_ip, np)));
    }
    out.extend(port.external_vips().map(|vip| external(SocketAddr::new(*vip, port.port))));
    out
}

/// Asks the kproxy running in the node namespace what it does with the destination's packet
/// (`/debug/explain`, retried while its first sync is still being published).
fn ask_kproxy(node: &Netns, d: &Destination<'_>, protocol: Protocol) -> anyhow::Result<Explanation> {
    let packet = Packet { from: d.client, to: d.dest, protocol };
    let start = Instant::now();
    loop {
        let answer = node.run_in(|| crate::explain::ask_server(METRICS_ADDRESS, &packet))?;
        match answer {
            Ok(explanation) => return Ok(explanation),
            Err(e) if start.elapsed() > Duration::from_secs(10) => return Err(e.context("asking kproxy to explain")),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

struct Row {
    service: String,
    from: &'static str,
    dest: SocketAddr,
    predicted: String,
    answered: String,
    seen: String,
    /// Why the probes did not do what explain predicted, if they did not; `None` also for rows
    /// that could not be probed (SCTP without kernel support).
    disagreement: Option<String>,
    checked: bool,
}

/// A name for an endpoint address: its pod's, or where it would run when the sandbox has no pod.
fn endpoint_name(ip: IpAddr, names: &BTreeMap<IpAddr, String>) -> String {
    names.get(&ip).cloned().unwrap_or_else(|| format!("{ip} (node-c: not in the sandbox)"))
}

fn prediction_text(e: &Explanation, names: &BTreeMap<IpAddr, String>) -> String {
    if e.verdict != Verdict::Dnat {
        return e.verdict.to_string();
    }
    let endpoints: Vec<String> = e.endpoints.iter().map(|ep| endpoint_name(ep.address.ip(), names)).collect();
    let source = match (e.masquerade, e.source_seen) {
        (false, _) => "source kept".to_owned(),
        (true, Some(ip)) if e.endpoints.iter().all(|ep| ep.source_seen_certain) => format!("SNAT to {ip}"),
        (true, Some(_)) => "masqueraded".to_owned(),
        (true, None) => "masqueraded (hairpin)".to_owned(),
    };
    format!("dnat to {}; {source}", endpoints.join(", "))
}

fn probe_row(
    port: &ServicePortPlan,
    d: &Destination<'_>,
    prediction: &Explanation,
    names: &BTreeMap<IpAddr, String>,
) -> Row {
    let options = ProbeOptions::with_timeout(Duration::from_millis(300));
    let mut backends = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut other = BTreeMap::<&str, usize>::new();
    let mut observed = Observed { probes: PROBES_PER_DESTINATION, ..Observed::default() };
    let mut unprobed = false;
    for _ in 0..PROBES_PER_DESTINATION {
        match kproxy_testbed::probe_with(d.from, proto(port.protocol), d.dest, &options) {
            Ok(ProbeResult::Answered { backend, seen_source }) => {
                observed.answered += 1;
                observed.seen_sources.insert(seen_source);
                // The answering pod's address among those predicted (else any of its family).
                let family = IpFamily::of(&d.dest.ip());
                let ips = names.iter().filter(|(ip, n)| **n == backend && IpFamily::of(ip) == family);
                let ips: Vec<IpAddr> = ips.map(|(ip, _)| *ip).collect();
                let predicted = ips.iter().find(|ip| prediction.endpoints.iter().any(|e| e.address.ip() == **ip));
                observed.answered_by.extend(predicted.or(ips.first()).copied());
                backends.insert(backend);
                seen.insert(
                    names.get(&seen_source).map_or(seen_source.to_string(), |n| format!("{seen_source} ({n})")),
                );
            }
            Ok(ProbeResult::Refused) => {
                observed.refused += 1;
                *other.entry("rejected").or_default() += 1
            }
            Ok(ProbeResult::Unreachable) => {
                observed.refused += 1;
                *other.entry("unreachable").or_default() += 1
            }
            Ok(ProbeResult::TimedOut) => {
                observed.timed_out += 1;
                *other.entry("no answer").or_default() += 1
            }
            Err(kproxy_testbed::TestbedError::SctpUnsupported(_)) => {
                unprobed = true;
                *other.entry("not probed: no SCTP in this kernel").or_default() += 1
            }
            Err(_) => *other.entry("probe error").or_default() += 1,
        }
    }
    // Endpoints without a pod in the sandbox can not answer: probes sent there time out.
    let silent = prediction.endpoints.iter().map(|e| e.address.ip()).filter(|ip| !names.contains_key(ip)).collect();
    let strictness = Strictness { silent, expect_coverage: false };
    let disagreement = if unprobed { None } else { prediction.agrees_with(d.client, &observed, &strictness).err() };
    let mut answered: Vec<String> = backends.into_iter().collect();
    answered.extend(other.iter().map(|(what, n)| format!("{what} x{n}")));
    Row {
        service: port.name.to_string(),
        from: d.from_name,
        dest: d.dest,
        predicted: prediction_text(prediction, names),
        answered: answered.join(", "),
        seen: if seen.is_empty() { "-".into() } else { seen.into_iter().collect::<Vec<_>>().join(", ") },
        disagreement,
        checked: !unprobed,
    }
}

fn print_table(rows: &[Row]) {
    let header = ["", "SERVICE PORT", "FROM", "DESTINATION", "EXPLAIN PREDICTED", "ANSWERED BY", "SOURCE THE POD SAW"]
        .map(String::from);
    let mark = |r: &Row| match (r.checked, &r.disagreement) {
        (false, _) => "-",
        (true, None) => "✔",
        (true, Some(_)) => "✖",
    };
    let cells = std::iter::once(header).chain(rows.iter().map(|r| {
        [
            mark(r).to_owned(),
            r.service.clone(),
            r.from.to_string(),
            r.dest.to_string(),
            r.predicted.clone(),
            r.answered.clone(),
            r.seen.clone(),
        ]
    }));
    print!("\n{}", crate::columns::render(&cells.collect::<Vec<_>>()));
}

/// The kproxy process running inside the node namespace.
struct KproxyProcess {
    child: Child,
}

impl KproxyProcess {
    fn start(node: &Netns, manifests: &Path, mode: &str) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let child = Command::new("ip")
            .args(["netns", "exec", node.name()])
            .arg(exe)
            .arg(format!("--manifests={}", manifests.display()))
            .arg(format!("--hostname-override={NODE}"))
            .arg(format!("--proxy-mode={mode}"))
            .arg("--detect-local-mode=NodeCIDR")
            .arg("--healthz-bind-address=")
            .arg(format!("--metrics-bind-address={METRICS_ADDRESS}"))
            // Errors only: the demo says itself what the sandbox lacks (e.g. flowtables).
            .env("KPROXY_LOG", "error")
            // nf_conntrack_max and the hash size are global to the host: leave them alone in a sandbox.
            .args(SANDBOX_CONNTRACK_FLAGS)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting kproxy in the node namespace")?;
        Ok(Self { child })
    }

    fn wait_for_rules(&mut self, node: &Netns, mode: &str, timeout: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(status) = self.child.try_wait()? {
                bail!("kproxy exited early: {status}");
            }
            let (out, programmed) = if mode == "iptables" {
                (node.exec("iptables-save", &["-t", "nat"])?, "KUBE-SVC-")
            } else {
                (node.exec("nft", &["list", "table", "ip", "kproxy"])?, "service-ips")
            };
            if out.status.success() && String::from_utf8_lossy(&out.stdout).contains(programmed) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("kproxy did not program its rules within {timeout:?}")
    }

    fn stop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

impl Drop for KproxyProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop();
        }
    }
}

//! `kproxy demo`: the whole packet path, live, with no cluster.
//!
//! Builds a sandbox of network namespaces (the testbed: a node, a second node, an external
//! client, pods running TCP/UDP echo servers at the addresses the manifests name), runs the real
//! `kproxy` binary with the nftables dataplane inside the node namespace on the manifests, sends
//! traffic to every ClusterIP, NodePort, LoadBalancer IP and ExternalIP, prints who answered and
//! which source address the pod saw, then removes kproxy's tables and the sandbox.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kproxy_plan::{Plan, Planner, ProxyPolicy, ServicePortPlan};
use kproxy_state::{IpFamily, Protocol};
use kproxy_testbed::{Netns, ProbeOptions, ProbeResult, Proto, Testbed, Where};

/// The node the sandbox plays (the examples describe node-a, node-b and node-c).
const NODE: &str = "node-a";
const PROBES_PER_DESTINATION: usize = 6;
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

    let mut rows = Vec::new();
    for fam in plan.families.values() {
        for port in fam.services.values() {
            for (from_name, from, dest) in destinations(&testbed, client.netns(), port) {
                rows.push(probe_row(port, from_name, from, dest, &names));
            }
        }
    }
    print_table(&rows);
    println!(
        "\nOnly node-a and node-b have pods in the sandbox: connections kproxy sends to endpoints on other \
         nodes get no answer, as with a dead node. \"rejected\" is the no-endpoints reject; a \
         loadBalancerSourceRanges or Local-policy drop shows as no answer."
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

/// Where to send traffic for one service port, and from where.
fn destinations<'a>(
    testbed: &'a Testbed,
    client_pod: &'a Netns,
    port: &ServicePortPlan,
) -> Vec<(&'static str, &'a Netns, SocketAddr)> {
    let mut out = vec![
        ("pod on node-a", client_pod, SocketAddr::new(port.cluster_ip, port.port)),
        ("node-a itself", testbed.node(), SocketAddr::new(port.cluster_ip, port.port)),
    ];
    if let Some(np) = port.node_port {
        let node_ip: IpAddr = match IpFamily::of(&port.cluster_ip) {
            IpFamily::V4 => kproxy_testbed::topology::NODE_IP_V4.into(),
            IpFamily::V6 => kproxy_testbed::topology::NODE_IP_V6.into(),
        };
        out.push(("external client", testbed.external(), SocketAddr::new(node_ip, np)));
    }
    for vip in port.external_vips() {
        out.push(("external client", testbed.external(), SocketAddr::new(*vip, port.port)));
    }
    out
}

struct Row {
    service: String,
    from: &'static str,
    dest: SocketAddr,
    answered: String,
    seen: String,
}

fn probe_row(
    port: &ServicePortPlan,
    from_name: &'static str,
    from: &Netns,
    dest: SocketAddr,
    names: &BTreeMap<IpAddr, String>,
) -> Row {
    let options = ProbeOptions::with_timeout(Duration::from_millis(300));
    let mut backends = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut other = BTreeMap::<&str, usize>::new();
    for _ in 0..PROBES_PER_DESTINATION {
        match kproxy_testbed::probe_with(from, proto(port.protocol), dest, &options) {
            Ok(ProbeResult::Answered { backend, seen_source }) => {
                backends.insert(backend);
                seen.insert(
                    names.get(&seen_source).map_or(seen_source.to_string(), |n| format!("{seen_source} ({n})")),
                );
            }
            Ok(ProbeResult::Refused) => *other.entry("rejected").or_default() += 1,
            Ok(ProbeResult::Unreachable) => *other.entry("unreachable").or_default() += 1,
            Ok(ProbeResult::TimedOut) => *other.entry("no answer").or_default() += 1,
            Err(kproxy_testbed::TestbedError::SctpUnsupported(_)) => {
                *other.entry("sctp: not in this kernel").or_default() += 1
            }
            Err(_) => *other.entry("probe error").or_default() += 1,
        }
    }
    let mut answered: Vec<String> = backends.into_iter().collect();
    answered.extend(other.iter().map(|(what, n)| format!("{what} x{n}")));
    Row {
        service: port.name.to_string(),
        from: from_name,
        dest,
        answered: answered.join(", "),
        seen: if seen.is_empty() { "-".into() } else { seen.into_iter().collect::<Vec<_>>().join(", ") },
    }
}

fn print_table(rows: &[Row]) {
    let header = ["SERVICE PORT", "FROM", "DESTINATION", "ANSWERED BY", "SOURCE THE POD SAW"].map(String::from);
    let cells = std::iter::once(header).chain(
        rows.iter()
            .map(|r| [r.service.clone(), r.from.to_string(), r.dest.to_string(), r.answered.clone(), r.seen.clone()]),
    );
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
            .args(["--healthz-bind-address=", "--metrics-bind-address="])
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

//! `cargo xtask cluster migrate`: a cluster's nodes moved from upstream kube-proxy's DaemonSet to
//! kproxy's and back, node by node, with the kubectl steps docs/migration.md gives an operator,
//! under traffic the whole time — and what it cost.
//!
//! The cluster comes up with kube-proxy (`--from` mode) as kubeadm's DaemonSet on every node.
//! Both DaemonSets read one node label, `kproxy.io/proxy` (`kube-proxy`, `both`, `kproxy`):
//! deploy/kproxy.yaml's affinity keeps kproxy off `kube-proxy` nodes, and kube-proxy's DaemonSet
//! is patched to keep off `kproxy` nodes. Then:
//!
//! - **preparing**: every node labelled `kube-proxy`, kube-proxy's DaemonSet patched (its pods
//!   roll), deploy/kproxy.yaml applied as it is (mode, image, API server substituted): it
//!   schedules nowhere yet;
//! - **onto kproxy**, node by node: `both` — kproxy starts beside kube-proxy and programs its
//!   rules (its ports are taken, so it leaves kube-proxy's alone); once its first sync is in the
//!   kernel, `kproxy` — kube-proxy's pod leaves, kproxy takes its ports and removes its leftovers;
//! - **back to kube-proxy**, node by node: `both` — kube-proxy starts beside kproxy; once its
//!   first sync is in, `kube-proxy` — kproxy's pod stops, and on SIGTERM hands the node back
//!   (releases the ports, waits for kube-proxy's /healthz, removes its own rules). From kproxy
//!   in iptables mode to kube-proxy in nftables mode, kproxy is first switched to nftables mode
//!   on every node (docs/migration.md's known limit; `--direct-handback` skips that and shows
//!   the limit).
//!
//! After every per-node step a Deployment is rolled (every endpoint changes). Throughout, a client
//! pod on the first node sends requests without pause to a ClusterIP and to the second node's
//! NodePort (one try each, 2 s limit), and holds two TCP connections open (one through a
//! ClusterIP, one through the second node's NodePort) to a Deployment that is never rolled,
//! exchanging a request on each every second. The report: failed requests, broken connections,
//! each node's time between proxies, and what of the old proxy is left on each node (nothing, or
//! the run fails).
//!
//! From kube-proxy's IPVS mode (`--from ipvs`), "what is left" includes its virtual services,
//! `kube-ipvs0`, its `KUBE-` ip sets and chains ([`left`] says per mode pair what must go and what
//! the new proxy owns). kproxy removes kube-proxy's virtual services only once IPVS tracks no
//! connection through them, and the long-lived connections hold theirs: once every node is on
//! kproxy, the client closes them and opens them again (through kproxy, counted apart from broken
//! ones), and kproxy must then remove the rest once IPVS forgets the closed connections.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use kproxy_k8s_harness::cluster::{self, ClusterInfo, KPROXY_APP, Kubectl, NodeInfo, PROXY_APP};
use kproxy_k8s_harness::migration::{
    self, IPVS_DUMMY, IPVS_ONLY_CHAINS, KUBE_PROXY_IPVS_CHAINS, NODE_LABEL, ON_BOTH, ON_KPROXY, ON_KUBE_PROXY,
    ProxyRules, kube_proxy_affinity_patch, proxy_rules,
};
use kproxy_k8s_harness::startup_patience;

use crate::image;
use crate::layout::Layout;

const NS: &str = "kproxy-migration";

/// How long any one step may take (a pod starting, a proxy syncing, a rollout, kube-proxy's IPVS
/// connections draining) on a loaded 2-core machine: a hang guard, eight times longer in the
/// guest kernel ([`startup_patience`]).
fn step() -> Duration {
    startup_patience(Duration::from_secs(240))
}

/// The harness's view of a migration run.
pub struct Migration<'a> {
    pub layout: &'a Layout,
    pub work: &'a Path,
    /// kube-proxy's mode.
    pub from: &'a str,
    /// kproxy's mode.
    pub to: &'a str,
    /// From kproxy in iptables mode back to kube-proxy in nftables mode without switching kproxy
    /// to nftables mode first: shows docs/migration.md's known limit.
    pub direct_handback: bool,
}

/// The two proxies' modes at a step.
#[derive(Debug, Clone, Copy)]
struct Modes<'a> {
    kube_proxy: &'a str,
    kproxy: &'a str,
}

impl Modes<'_> {
    /// Both proxies in iptables mode of one backend write the same chains: there is nothing of
    /// the other's to remove, only rules to rewrite. (Both in IPVS mode share the virtual
    /// services and `kube-ipvs0`, but not the rest: kproxy removes kube-proxy's ip sets and
    /// chains when it takes over, and its firewall-mark services (short-circuits) and
    /// auxiliary table when it hands back, and says so.)
    fn shared_chains(&self) -> bool {
        self.kube_proxy == "iptables" && self.kproxy == "iptables"
    }

    /// Whether kube-proxy starting in this mode removes kproxy's rules before its own are in:
    /// kube-proxy's nftables mode deletes every iptables `KUBE-` chain at start (upstream's
    /// `platformCleanup`), kproxy's iptables mode's too. kube-proxy's iptables and IPVS modes
    /// delete only nftables tables named `kube-proxy` at start (`platformCleanup`: IPVS mode is
    /// "iptables-based"), never kproxy's tables; the IPVS proxier's start
    /// (`CanUseIPVSProxier`, `NewProxier`) flushes nothing, and its syncs delete only address
    /// virtual services of its own family that its Services do not want (`cleanLegacyService`):
    /// kproxy's address services are the same Services' addresses and NodePorts, and its
    /// firewall-mark services are listed to kube-proxy as `0.0.0.0:0` (upstream's
    /// `toVirtualServer`), whose delete finds no such address service.
    fn handback_has_a_window(&self) -> bool {
        self.kube_proxy == "nftables" && self.kproxy == "iptables"
    }
}

/// The two Service proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proxy {
    KubeProxy,
    Kproxy,
}

/// Whether `proxy`'s rules in `mode` are in a node's kernel (`rules`), as far as they can be
/// told apart from the other proxy's.
fn serves(proxy: Proxy, mode: &str, rules: &ProxyRules) -> bool {
    match (proxy, mode) {
        (Proxy::KubeProxy, "nftables") => rules.kube_proxy_tables > 0,
        (Proxy::Kproxy, "nftables") => rules.kproxy_tables > 0,
        // Both iptables modes write upstream's chains.
        (_, "iptables") => rules.kube_services(),
        // kube-proxy's IPVS mode: its dummy interface with the ClusterIPs' virtual services, its
        // ip sets, and rules in `KUBE-IPVS-FILTER`, a chain only its IPVS mode has, whose rules
        // its sync writes last (upstream's `syncProxyRules`: the chains are created first, their
        // rules go in one iptables-restore after every virtual service and ip set): they say a
        // sync reached the kernel.
        (Proxy::KubeProxy, "ipvs") => {
            rules.ipvs_dummy.is_some()
                && rules.kube_ipsets.iter().any(|s| s == "KUBE-CLUSTER-IP" || s == "KUBE-6-CLUSTER-IP")
                && rules.ipvs_filter_rules > 0
                && rules.address_services().next().is_some()
        }
        // kproxy's IPVS mode: its auxiliary table (which its sync writes after the virtual
        // services and the dummy interface's addresses), beside them. The virtual services
        // alone can not tell: kube-proxy's IPVS mode makes the same ones.
        (Proxy::Kproxy, "ipvs") => {
            rules.kproxy_ipvs_tables > 0 && rules.ipvs_dummy.is_some() && rules.address_services().next().is_some()
        }
        _ => false,
    }
}

/// One thing of the proxy a node left that is still in its kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Leftover {
    what: String,
    /// kube-proxy's IPVS virtual services that still carry connections (and `kube-ipvs0` while
    /// one does): kproxy's takeover removes them once drained, not before (docs/migration.md).
    drains: bool,
}

/// What of the proxy the node left in `direction` is still in its kernel (`rules`), by what each
/// proxy's mode removes or leaves (crates/takeover, crates/kproxy/src/takeover.rs):
///
/// - onto kproxy: every nftables table `kube-proxy`; kube-proxy's iptables chains where kproxy
///   does not write the same names (its iptables mode shares upstream's iptables-mode names);
///   from kube-proxy's IPVS mode also its `KUBE-` ip sets and, unless kproxy is in IPVS mode,
///   every virtual service and `kube-ipvs0` (those that carry connections drain first). kproxy's
///   IPVS mode adopts the virtual services and the dummy interface (the takeover leaves them,
///   `Own::Ipvs`): they are the same Services' ClusterIPs and NodePorts on the node's addresses.
/// - back to kube-proxy: kproxy's nftables tables (`kproxy`, `kproxy-accel`, `kproxy-ipvs`),
///   whatever its mode; from its iptables mode its chains, except where kube-proxy's mode writes
///   the same names (iptables mode: all; IPVS mode: `KUBE_PROXY_IPVS_CHAINS`, which kproxy's
///   handback leaves, `IptablesChainsNotIpvs`); from its IPVS mode every virtual service and
///   `kube-ipvs0`, unless kube-proxy is in IPVS mode: then they are kube-proxy's, and only
///   kproxy's firewall-mark services must be gone (`cleanup_kproxy_only`).
fn left(modes: Modes, direction: Direction, rules: &ProxyRules) -> Vec<Leftover> {
    let mut out = Vec::new();
    let mut add = |what: String, drains: bool| out.push(Leftover { what, drains });
    let chains = |chains: Vec<String>| format!("iptables chains [{}]", chains.join(", "));
    match direction {
        Direction::OntoKproxy => {
            let (old, new) = (modes.kube_proxy, modes.kproxy);
            if rules.kube_proxy_tables > 0 {
                add(format!("{} nftables table(s) kube-proxy", rules.kube_proxy_tables), false);
            }
            let old_chains = match (old, new) {
                ("iptables", "iptables") => Vec::new(),
                ("ipvs", "iptables") => rules.chains_where(|t, c| IPVS_ONLY_CHAINS.contains(&(t, c))),
                ("iptables" | "ipvs", _) => rules.kube_chains.clone(),
                _ => Vec::new(),
            };
            if !old_chains.is_empty() {
                add(chains(old_chains), false);
            }
            if old == "ipvs" {
                if !rules.kube_ipsets.is_empty() {
                    add(format!("ip sets [{}]", rules.kube_ipsets.join(", ")), false);
                }
                if new != "ipvs" {
                    let mut draining = false;
                    for service in &rules.ipvs {
                        let carries = service.connections > 0;
                        draining |= carries;
                        let what = format!("virtual service {} ({} connections)", service.key, service.connections);
                        add(what, carries);
                    }
                    if rules.ipvs_dummy.is_some() {
                        add(IPVS_DUMMY.to_owned(), draining);
                    }
                }
            }
        }
        Direction::BackToKubeProxy => {
            let (old, new) = (modes.kproxy, modes.kube_proxy);
            let tables = rules.kproxy_tables + rules.kproxy_ipvs_tables;
            if tables > 0 {
                add(format!("{tables} nftables table(s) of kproxy's"), false);
            }
            let old_chains = match (old, new) {
                ("iptables", "iptables") => Vec::new(),
                ("iptables", "ipvs") => rules.chains_where(|t, c| !KUBE_PROXY_IPVS_CHAINS.contains(&(t, c))),
                ("iptables", _) => rules.kube_chains.clone(),
                _ => Vec::new(),
            };
            if !old_chains.is_empty() {
                add(chains(old_chains), false);
            }
            if old == "ipvs" {
                let kproxys: Vec<String> = if new == "ipvs" {
                    rules.fwmark_services().map(|s| s.key.to_string()).collect()
                } else {
                    rules.ipvs.iter().map(|s| s.key.to_string()).collect()
                };
                if !kproxys.is_empty() {
                    add(format!("virtual services [{}]", kproxys.join(", ")), false);
                }
                if new != "ipvs" && rules.ipvs_dummy.is_some() {
                    add(IPVS_DUMMY.to_owned(), false);
                }
            }
        }
    }
    out
}

/// One node's trip between the proxies (each from the label change that started it).
#[derive(Debug, Default)]
struct NodeReport {
    name: String,
    /// `both` → kproxy's first sync in the kernel beside kube-proxy.
    kproxy_synced: Duration,
    /// `kproxy` → kproxy holds :10256 (kube-proxy's pod stopped and its port freed meanwhile):
    /// the most the node was without a proxy serving it; its rules were in all along.
    kproxy_serving: Duration,
    /// `both` → kube-proxy's first sync in the kernel beside kproxy.
    kube_proxy_synced: Duration,
    /// kproxy released the ports → kube-proxy answered /healthz there and kproxy removed its
    /// rules (kproxy's log); `None` where kproxy leaves the shared chains in place.
    handback: Option<Duration>,
    /// `kube-proxy` → kproxy's pod gone.
    kproxy_gone: Duration,
}

pub fn run(m: &Migration, cluster: &cluster::Cluster) -> anyhow::Result<bool> {
    let info = &cluster.info;
    if info.nodes.len() < 2 {
        bail!("migrate needs two nodes (the client on one, the NodePort of the other)");
    }
    let kubectl = Kubectl::from_info(info);
    let archive = m.layout.target.join(image::ARCHIVE);
    migration::import_image(m.work, info, &archive)?;
    let services = deploy_workload(&kubectl, info)?;
    let load = Load::start(&kubectl, &info.nodes[1].ips[0].to_string(), &services)?;
    let started = Instant::now();
    let mut steps = Steps { started, lines: Vec::new() };
    let mut timeline = Timeline::default();
    let mut reports: Vec<NodeReport> =
        info.nodes.iter().map(|n| NodeReport { name: n.name.clone(), ..Default::default() }).collect();
    let result = (|| -> anyhow::Result<()> {
        load.wait_flowing(&kubectl)?;
        steps.note("traffic flowing");
        prepare(m, &kubectl, info)?;
        steps.note("prepared: nodes labelled kube-proxy, kube-proxy's DaemonSet patched, kproxy's applied");
        let mut modes = Modes { kube_proxy: m.from, kproxy: m.to };
        for (i, (node, report)) in info.nodes.iter().zip(&mut reports).enumerate() {
            onto_kproxy(m, modes, &kubectl, node, report, &mut |serving| timeline.set(i, serving))?;
            timeline.set(i, Serving::Kproxy);
            steps.note(&format!("{} on kproxy", node.name));
            roll(&kubectl)?;
            steps.note("web rolled");
        }
        // kube-proxy's IPVS services drain before kproxy removes them (an IPVS connection whose
        // virtual service is gone is dropped): the client's long-lived connections, opened
        // through them, keep them for as long as they last. Once every node is on kproxy they
        // are closed and opened again (through kproxy; not counted as broken), and kproxy must
        // then remove what is left once IPVS forgets the closed connections (TIME_WAIT).
        let draining = info.nodes.iter().any(|node| {
            proxy_rules(&node.netns)
                .is_ok_and(|rules| left(modes, Direction::OntoKproxy, &rules).iter().any(|l| l.drains))
        });
        if draining {
            steps.note("kube-proxy's IPVS services still carry the long-lived connections");
            load.reconnect(&kubectl)?;
            steps.note("the client's long-lived connections closed and opened again, through kproxy");
        }
        for node in &info.nodes {
            check_left(modes, node, Direction::OntoKproxy, Drains::NotAllowed)?;
        }
        expect_no_pods(&kubectl, PROXY_APP)?;
        steps.note("every node on kproxy; nothing of kube-proxy's left on any node");
        if modes.handback_has_a_window() && !m.direct_handback {
            // docs/migration.md's known limit: kproxy goes to nftables mode first.
            kproxy_to_nftables(m, &kubectl, info)?;
            modes.kproxy = "nftables";
            steps.note("kproxy switched to nftables mode on every node (ConfigMap, rollout restart)");
            roll(&kubectl)?;
            steps.note("web rolled");
        }
        for (i, (node, report)) in info.nodes.iter().zip(&mut reports).enumerate() {
            back_to_kube_proxy(m, modes, &mut steps, &kubectl, node, report, &mut |serving| timeline.set(i, serving))?;
            timeline.set(i, Serving::KubeProxy);
            steps.note(&format!("{} back on kube-proxy", node.name));
            roll(&kubectl)?;
            steps.note("web rolled");
        }
        for node in &info.nodes {
            check_left(modes, node, Direction::BackToKubeProxy, Drains::NotAllowed)?;
        }
        expect_no_pods(&kubectl, KPROXY_APP)?;
        steps.note("every node back on kube-proxy; nothing of kproxy's left on any node");
        Ok(())
    })();
    let counts = load.finish(&kubectl);
    println!(
        "migrate: kube-proxy ({from}) -> kproxy ({to}) -> kube-proxy ({from}), {} nodes, {:.0} s",
        info.nodes.len(),
        started.elapsed().as_secs_f64(),
        from = m.from,
        to = m.to,
    );
    for line in &steps.lines {
        println!("migrate:   {line}");
    }
    if let Err(e) = &result {
        println!("migrate:   stopped: {e:#}");
    }
    for r in &reports {
        let handback = r.handback.map_or("no handback (shared chains stay)".to_owned(), |d| {
            format!("ports released -> kube-proxy healthy, kproxy's rules removed {:.1} s", d.as_secs_f64())
        });
        println!(
            "migrate:   {}: onto kproxy: synced beside kube-proxy {:.1} s, kube-proxy told to leave -> kproxy serving {:.1} s; back: kube-proxy synced beside kproxy {:.1} s, {handback}, kproxy's pod gone {:.1} s",
            r.name,
            r.kproxy_synced.as_secs_f64(),
            r.kproxy_serving.as_secs_f64(),
            r.kube_proxy_synced.as_secs_f64(),
            r.kproxy_gone.as_secs_f64(),
        );
    }
    let counts = counts?;
    println!("migrate:   {counts}");
    for failure in &counts.failures {
        println!("migrate:   {failure}");
    }
    if !counts.failures.is_empty() {
        println!("migrate:   {}", timeline.attribute(&counts.failures));
    }
    result?;
    if let Some(why) = &counts.unfinished {
        bail!("the client's loop did not stop: {why}");
    }
    Ok(counts.failed() == 0)
}

/// The run's timeline: seconds since the load started, and the time of day (UTC) to match the
/// client's failure lines and the proxies' logs.
struct Steps {
    started: Instant,
    lines: Vec<String>,
}

impl Steps {
    fn note(&mut self, what: &str) {
        let line = format!("+{:.0}s ({} UTC) {what}", self.started.elapsed().as_secs_f64(), time_of_day());
        tracing::info!("migrate: {line}");
        self.lines.push(line);
    }
}

/// Which proxy served a node: kube-proxy alone, both (from the other proxy's first sync beside
/// it until that node's step ended: the old proxy gone and what it left checked), kproxy alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Serving {
    KubeProxy,
    Both,
    Kproxy,
}

/// When each node changed proxy (seconds of the UTC day, as the client's lines are stamped):
/// whose stretch each failed request or broken connection fell in. ClusterIP requests are
/// served by the client's node (node 1), NodePort requests by node 2.
#[derive(Debug, Default)]
struct Timeline {
    changes: Vec<(usize, f64, Serving)>,
}

impl Timeline {
    fn set(&mut self, node: usize, serving: Serving) {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        self.changes.push((node, now % 86_400.0, serving));
    }

    fn at(&self, node: usize, seconds: f64) -> Serving {
        let mut changes = self.changes.iter().filter(|(n, at, _)| *n == node && *at <= seconds);
        changes.next_back().map_or(Serving::KubeProxy, |(_, _, serving)| *serving)
    }

    /// One line: the client's `FAIL`/`BROKEN` lines counted by what served them.
    fn attribute(&self, lines: &[String]) -> String {
        let mut counts: std::collections::BTreeMap<Serving, usize> = std::collections::BTreeMap::new();
        let mut unknown = 0;
        for line in lines {
            let mut words = line.split_whitespace().skip(1);
            let (Some(time), Some(_utc), Some(kind)) = (words.next(), words.next(), words.next()) else {
                unknown += 1;
                continue;
            };
            let node = usize::from(kind == "NodePort");
            match seconds_of_day(time) {
                Some(t) => *counts.entry(self.at(node, t)).or_default() += 1,
                None => unknown += 1,
            }
        }
        let n = |s: Serving| counts.get(&s).copied().unwrap_or(0);
        let mut out = format!(
            "failed or broken by what served them (ClusterIP: node 1's proxy, NodePort: node 2's): kube-proxy alone {}, both {}, kproxy alone {}",
            n(Serving::KubeProxy),
            n(Serving::Both),
            n(Serving::Kproxy)
        );
        if unknown > 0 {
            out.push_str(&format!(", unreadable {unknown}"));
        }
        out
    }
}

/// `HH:MM:SS[.frac]` as seconds of the day.
fn seconds_of_day(time: &str) -> Option<f64> {
    let mut parts = time.splitn(3, ':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// HH:MM:SS (UTC) now.
fn time_of_day() -> String {
    let secs = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs()) % 86_400;
    format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// docs/migration.md's preparation: every node labelled `kube-proxy`, kube-proxy's DaemonSet
/// patched to keep off `kproxy` nodes (its pods roll: the patch changes their template), kproxy's
/// DaemonSet applied from deploy/kproxy.yaml (as `up` substitutes it, its own label kept): on no
/// node yet.
fn prepare(m: &Migration, kubectl: &Kubectl, info: &ClusterInfo) -> anyhow::Result<()> {
    kubectl.run(&["label", "nodes", "--all", &format!("{NODE_LABEL}={ON_KUBE_PROXY}"), "--overwrite"])?;
    kubectl.run(&["-n", "kube-system", "patch", "ds", "kube-proxy", "-p", &kube_proxy_affinity_patch()])?;
    rollout_status(kubectl, "kube-system", "ds/kube-proxy")?;
    let manifest = fs::read_to_string(m.layout.workspace.join("deploy/kproxy.yaml"))?;
    let manifest = cluster::substitute_manifest_beside_kube_proxy(
        &manifest,
        image::IMAGE_NAME,
        &info.server,
        m.to,
        info.families,
    )?;
    let applied = m.work.join("kproxy.applied.yaml");
    fs::write(&applied, &manifest)?;
    kubectl.run(&["apply", "-f", &applied.display().to_string()])?;
    kubectl.wait_for(startup_patience(Duration::from_secs(60)), "kproxy's DaemonSet observed", || {
        let out = kubectl
            .run(&[
                "-n",
                "kube-system",
                "get",
                "ds",
                "kproxy",
                "-o",
                "jsonpath={.status.observedGeneration} {.status.desiredNumberScheduled}",
            ])
            .ok()?;
        (out.trim() == "1 0").then_some(())
    })?;
    expect_no_pods(kubectl, KPROXY_APP)
}

fn timeout_flag() -> String {
    format!("--timeout={}s", step().as_secs())
}

/// Fails unless no pod of `app` (a `k8s-app` label in kube-system) exists.
fn expect_no_pods(kubectl: &Kubectl, app: &str) -> anyhow::Result<()> {
    kubectl.wait_for(step(), &format!("no {app} pod left"), || {
        let out =
            kubectl.run(&["-n", "kube-system", "get", "pods", "-l", &format!("k8s-app={app}"), "-o", "name"]).ok()?;
        out.trim().is_empty().then_some(())
    })
}

/// Web's and steady's ClusterIP and NodePort.
struct Services {
    web_ip: String,
    web_port: String,
    steady_ip: String,
    steady_port: String,
}

/// Deployment `web` (4 pods, rolled after every step) behind a NodePort Service, Deployment
/// `steady` (2 pods, never rolled) behind another, and the client pod on the first node.
fn deploy_workload(kubectl: &Kubectl, info: &ClusterInfo) -> anyhow::Result<Services> {
    let deployment = |name: &str, replicas: u32| crate::cluster::netexec_deployment(name, NS, replicas);
    let service = |name: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"type": "NodePort", "selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    };
    let manifest = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        deployment("web", 4), deployment("steady", 2), service("web"), service("steady"),
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": NS},
         "spec": {"nodeName": info.nodes[0].name, "containers": [{"name": "client", "image": crate::cluster::AGNHOST, "args": ["pause"]}]}}
    ]});
    kubectl.apply(&manifest.to_string())?;
    for deployment in ["web", "steady"] {
        rollout_status(kubectl, NS, &format!("deployment/{deployment}"))?;
    }
    kubectl.run(&["-n", NS, "wait", "--for=condition=Ready", "pod/client", &timeout_flag()])?;
    let get = |svc: &str, path: &str| {
        kubectl.run(&["-n", NS, "get", "svc", svc, "-o", &format!("jsonpath={{{path}}}")]).map(|s| s.trim().to_owned())
    };
    Ok(Services {
        web_ip: get("web", ".spec.clusterIP")?,
        web_port: get("web", ".spec.ports[0].nodePort")?,
        steady_ip: get("steady", ".spec.clusterIP")?,
        steady_port: get("steady", ".spec.ports[0].nodePort")?,
    })
}

/// docs/migration.md's way around kube-proxy's nftables mode removing kproxy's iptables rules
/// at its start: kproxy's ConfigMap set to `mode: nftables` and its DaemonSet restarted; each
/// new pod programs its nftables rules and then removes the iptables chains its predecessor
/// left (its takeover). Waits until every node has kproxy's tables and no `KUBE-` chain.
fn kproxy_to_nftables(m: &Migration, kubectl: &Kubectl, info: &ClusterInfo) -> anyhow::Result<()> {
    let manifest = fs::read_to_string(m.layout.workspace.join("deploy/kproxy.yaml"))?;
    let manifest = cluster::substitute_manifest_beside_kube_proxy(
        &manifest,
        image::IMAGE_NAME,
        &info.server,
        "nftables",
        info.families,
    )?;
    let applied = m.work.join("kproxy.applied-nftables.yaml");
    fs::write(&applied, &manifest)?;
    kubectl.run(&["apply", "-f", &applied.display().to_string()])?;
    kubectl.run(&["-n", "kube-system", "rollout", "restart", "ds/kproxy"])?;
    rollout_status(kubectl, "kube-system", "ds/kproxy")?;
    for node in &info.nodes {
        kubectl.wait_for(
            step(),
            &format!("kproxy's iptables chains replaced by its tables on {}", node.name),
            || {
                let rules = proxy_rules(&node.netns).ok()?;
                (rules.kproxy_tables > 0 && rules.kube_chains.is_empty()).then_some(())
            },
        )?;
        // The new pod's takeover removed them, not something else.
        let (pod, _) = daemon_pod(kubectl, KPROXY_APP, &node.name).context("no kproxy pod")?;
        let log = kubectl.run(&["-n", "kube-system", "logs", &pod, "-c", "kproxy"])?;
        if !log.contains("took the node over from kube-proxy") {
            bail!("kproxy on {} in nftables mode did not remove its iptables chains itself:\n{log}", node.name);
        }
    }
    Ok(())
}

/// `kubectl rollout restart` of `web`, waited for.
fn roll(kubectl: &Kubectl) -> anyhow::Result<()> {
    kubectl.run(&["-n", NS, "rollout", "restart", "deployment/web"])?;
    rollout_status(kubectl, NS, "deployment/web")
}

/// `kubectl rollout status` of `what` in `namespace`, for up to [`step`]. A rollout still going
/// after an eighth of that prints, once, the pods and recent events of both namespaces it
/// involves: in the guest the cluster cannot be reached from the host while the run lasts, and a
/// hang guard that strikes half an hour later is too late to see why a rollout stalled.
fn rollout_status(kubectl: &Kubectl, namespace: &str, what: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut reported = false;
    loop {
        let waited = started.elapsed();
        let left = step().saturating_sub(waited);
        let slice = left.min(step() / 8).max(Duration::from_secs(1));
        let timeout = format!("--timeout={}s", slice.as_secs());
        match kubectl.run(&["-n", namespace, "rollout", "status", what, &timeout]) {
            Ok(_) => return Ok(()),
            Err(e) if started.elapsed() >= step() => {
                print_cluster_context(kubectl, namespace);
                return Err(e).with_context(|| format!("{what} in {namespace} did not roll out in {:?}", step()));
            }
            Err(_) if !reported => {
                println!("{what} in {namespace} still rolling out after {:.0} s:", started.elapsed().as_secs_f64());
                print_cluster_context(kubectl, namespace);
                reported = true;
            }
            Err(_) => {}
        }
    }
}

/// The pods (with their nodes) and the latest events of `namespace` and of kube-system.
fn print_cluster_context(kubectl: &Kubectl, namespace: &str) {
    let mut namespaces = vec![namespace];
    if namespace != "kube-system" {
        namespaces.push("kube-system");
    }
    for ns in namespaces {
        for args in
            [&["-n", ns, "get", "pods", "-o", "wide"][..], &["-n", ns, "get", "events", "--sort-by=.lastTimestamp"][..]]
        {
            println!("== kubectl {}", args.join(" "));
            let text = kubectl.run(args).unwrap_or_else(|e| format!("{e:#}"));
            let lines: Vec<&str> = text.lines().collect();
            // Events pile up over a run: the latest say what is happening now.
            for line in &lines[lines.len().saturating_sub(30)..] {
                println!("{line}");
            }
        }
    }
}

/// `kubectl label node NODE kproxy.io/proxy=VALUE --overwrite`; returns when it was done.
fn label(kubectl: &Kubectl, node: &NodeInfo, value: &str) -> anyhow::Result<Instant> {
    kubectl.run(&["label", "node", &node.name, &format!("{NODE_LABEL}={value}"), "--overwrite"])?;
    Ok(Instant::now())
}

/// `kubectl get pods` of DaemonSet app `app` on `node`, printed as `output` (`-o`).
fn pods_on(kubectl: &Kubectl, app: &str, node: &str, output: &str) -> Option<String> {
    let (selector, on_node) = (format!("k8s-app={app}"), format!("spec.nodeName={node}"));
    kubectl.run(&["-n", "kube-system", "get", "pods", "-l", &selector, "--field-selector", &on_node, "-o", output]).ok()
}

/// The pod of DaemonSet app `app` on `node` and its phase, if there is one (not terminating).
fn daemon_pod(kubectl: &Kubectl, app: &str, node: &str) -> Option<(String, String)> {
    let out = pods_on(
        kubectl,
        app,
        node,
        "jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
    )?;
    out.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        let (name, phase) = (words.next()?, words.next()?);
        words.next().is_none().then(|| (name.to_owned(), phase.to_owned()))
    })
}

/// Waits for a running pod of `app` on `node`; its name.
fn wait_running(kubectl: &Kubectl, app: &str, node: &str) -> anyhow::Result<String> {
    kubectl.wait_for(step(), &format!("a running {app} pod on {node}"), || {
        daemon_pod(kubectl, app, node).and_then(|(name, phase)| (phase == "Running").then_some(name))
    })
}

/// Waits until no pod of `app` is on `node` any more (not even terminating).
fn wait_gone(kubectl: &Kubectl, app: &str, node: &str) -> anyhow::Result<Instant> {
    kubectl.wait_for(step(), &format!("{app}'s pod on {node} gone"), || {
        let out = pods_on(kubectl, app, node, "name")?;
        out.trim().is_empty().then(Instant::now)
    })
}

/// A pod's log followed into a file (`kubectl logs -f`) until the pod ends or it is dropped.
struct FollowedLog {
    child: Child,
    path: PathBuf,
}

impl FollowedLog {
    fn start(kubectl: &Kubectl, pod: &str, container: &str, path: PathBuf) -> anyhow::Result<FollowedLog> {
        let out = fs::File::create(&path)?;
        let child = kubectl
            .command(&["-n", "kube-system", "logs", "-f", pod, "-c", container])
            .stdout(out)
            .stderr(Stdio::null())
            .spawn()?;
        Ok(FollowedLog { child, path })
    }

    fn wait_for(&self, needle: &str) -> anyhow::Result<Instant> {
        migration::wait_for_log(&self.path, needle, step())
    }

    fn text(&self) -> String {
        fs::read_to_string(&self.path).unwrap_or_default()
    }
}

impl Drop for FollowedLog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One node onto kproxy: `both`, kproxy's first sync beside kube-proxy, `kproxy`, kproxy
/// serving and kube-proxy's leftovers gone.
fn onto_kproxy(
    m: &Migration,
    modes: Modes,
    kubectl: &Kubectl,
    node: &NodeInfo,
    report: &mut NodeReport,
    serving: &mut dyn FnMut(Serving),
) -> anyhow::Result<()> {
    let both = label(kubectl, node, ON_BOTH)?;
    let pod = wait_running(kubectl, KPROXY_APP, &node.name)?;
    let log = FollowedLog::start(kubectl, &pod, "kproxy", m.work.join(format!("migrate-{}-{pod}.log", node.name)))?;
    report.kproxy_synced = log.wait_for("full sync done").context("kproxy's first sync beside kube-proxy")? - both;
    serving(Serving::Both);
    let rules = proxy_rules(&node.netns)?;
    if !serves(Proxy::Kproxy, modes.kproxy, &rules) {
        bail!("kproxy synced but its rules are not in {}'s kernel: {}", node.name, describe(&rules));
    }
    if !log.text().contains("port is taken") {
        bail!("kproxy on {} did not find kube-proxy's ports taken:\n{}", node.name, log.text());
    }
    // What must be gone once kproxy took over is there now: the check afterwards can see it.
    if !serves(Proxy::KubeProxy, modes.kube_proxy, &rules) {
        bail!("kube-proxy's rules are not in {}'s kernel before it leaves: {}", node.name, describe(&rules));
    }
    let leave = label(kubectl, node, ON_KPROXY)?;
    report.kproxy_serving = log.wait_for("the healthz server port is free now")? - leave;
    wait_gone(kubectl, PROXY_APP, &node.name)?;
    kubectl.run(&["-n", "kube-system", "wait", "--for=condition=Ready", &format!("pod/{pod}"), &timeout_flag()])?;
    // Both in iptables mode of one backend, kube-proxy's chains are kproxy's own.
    let took_over: &[&str] = if modes.shared_chains() {
        &["took the node over from kube-proxy", "kube-proxy left nothing"]
    } else {
        &["took the node over from kube-proxy"]
    };
    kubectl
        .wait_for(step(), &format!("kproxy on {} saying one of {took_over:?}", node.name), || {
            let text = log.text();
            took_over.iter().any(|needle| text.contains(needle)).then_some(())
        })
        .with_context(|| format!("kproxy's log:\n{}", log.text()))?;
    // kube-proxy's IPVS services that carry the client's long-lived connections drain only
    // once those end: `run` ends them on purpose once every node is on kproxy.
    check_left(modes, node, Direction::OntoKproxy, Drains::Allowed)
}

/// One node back to kube-proxy: `both`, kube-proxy's first sync beside kproxy, `kube-proxy`,
/// kproxy's handback and its rules gone.
fn back_to_kube_proxy(
    m: &Migration,
    modes: Modes,
    steps: &mut Steps,
    kubectl: &Kubectl,
    node: &NodeInfo,
    report: &mut NodeReport,
    serving: &mut dyn FnMut(Serving),
) -> anyhow::Result<()> {
    let (pod, _) = daemon_pod(kubectl, KPROXY_APP, &node.name).context("no kproxy pod")?;
    let log =
        FollowedLog::start(kubectl, &pod, "kproxy", m.work.join(format!("migrate-{}-{pod}-handback.log", node.name)))?;
    let both = label(kubectl, node, ON_BOTH)?;
    let upstream = wait_running(kubectl, PROXY_APP, &node.name)?;
    let upstream_log = FollowedLog::start(
        kubectl,
        &upstream,
        "kube-proxy",
        m.work.join(format!("migrate-{}-{upstream}.log", node.name)),
    )?;
    report.kube_proxy_synced = if modes.kube_proxy == "ipvs" {
        // Upstream's IPVS proxier says "syncProxyRules complete" only at --v=4 (the harness runs
        // kube-proxy at --v=2), and its /metrics port is kproxy's until the handback: the
        // node's kernel says it instead ([`serves`]).
        wait_serving(Proxy::KubeProxy, modes.kube_proxy, node).context("kube-proxy's first sync beside kproxy")?
    } else {
        upstream_log.wait_for("SyncProxyRules complete").context("kube-proxy's first sync beside kproxy")?
    } - both;
    serving(Serving::Both);
    let rules = proxy_rules(&node.netns)?;
    if !serves(Proxy::KubeProxy, modes.kube_proxy, &rules) {
        bail!("kube-proxy synced but its rules are not in {}'s kernel: {}", node.name, describe(&rules));
    }
    // What must be gone once kproxy handed back is there now: the check afterwards can see it.
    let kproxys_in = serves(Proxy::Kproxy, modes.kproxy, &rules);
    if !kproxys_in && modes.handback_has_a_window() {
        steps.note(&format!(
            "{}: kube-proxy (nftables) removed kproxy's iptables rules at its start: {}",
            node.name,
            describe(&rules)
        ));
    } else if !kproxys_in {
        bail!("kproxy's rules are not in {}'s kernel before it leaves: {}", node.name, describe(&rules));
    }
    let leave = label(kubectl, node, ON_KUBE_PROXY)?;
    if modes.shared_chains() {
        log.wait_for("the rules stay in place")
            .with_context(|| format!("kproxy on {} did not stop:\n{}", node.name, log.text()))?;
    } else {
        let released = log.wait_for("handing the node back to kube-proxy")?;
        let done = log
            .wait_for("handed the node back to kube-proxy")
            .with_context(|| format!("kproxy on {} did not hand back:\n{}", node.name, log.text()))?;
        report.handback = Some(done - released);
    }
    report.kproxy_gone = wait_gone(kubectl, KPROXY_APP, &node.name)? - leave;
    cluster::wait_http_ok(&node.netns, "http://127.0.0.1:10256/healthz", step())
        .with_context(|| format!("kube-proxy's /healthz on {}", node.name))?;
    check_left(modes, node, Direction::BackToKubeProxy, Drains::NotAllowed)
}

/// Waits until `proxy`'s rules in `mode` are in `node`'s kernel ([`serves`]); returns when they
/// were seen (to within a listing of the node's rules).
fn wait_serving(proxy: Proxy, mode: &str, node: &NodeInfo) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + step();
    loop {
        let rules = proxy_rules(&node.netns)?;
        if serves(proxy, mode, &rules) {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            bail!("{proxy:?}'s rules ({mode}) not in {}'s kernel after {:?}: {}", node.name, step(), describe(&rules));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    OntoKproxy,
    BackToKubeProxy,
}

/// Fails unless nothing of the proxy the node left is in its kernel ([`left`]), or, with
/// `drains`, nothing but kube-proxy's IPVS services that still carry connections. Onto kproxy it
/// waits for that (a hang guard: the running kproxy removes what it found at once, kube-proxy's
/// drained IPVS services within 5 s, the NodePorts its IPVS sync does not want within a sync
/// period); back to kube-proxy it looks once (kproxy removed its rules before it exited).
fn check_left(modes: Modes, node: &NodeInfo, direction: Direction, drains: Drains) -> anyhow::Result<()> {
    let who = match direction {
        Direction::OntoKproxy => format!("kube-proxy's ({})", modes.kube_proxy),
        Direction::BackToKubeProxy => format!("kproxy's ({})", modes.kproxy),
    };
    let patience = if direction == Direction::OntoKproxy { step() } else { Duration::ZERO };
    let deadline = Instant::now() + patience;
    loop {
        let last = match proxy_rules(&node.netns) {
            Ok(rules) => {
                let blocking: Vec<String> = left(modes, direction, &rules)
                    .into_iter()
                    .filter(|l| !(l.drains && drains == Drains::Allowed))
                    .map(|l| l.what)
                    .collect();
                if blocking.is_empty() {
                    return Ok(());
                }
                format!("[{}]; the node has {}", blocking.join("; "), describe(&rules))
            }
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > deadline {
            bail!("{who} rules are still in {}'s kernel (waited {patience:?}): {last}", node.name);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether kube-proxy's IPVS services that still carry connections may stay (they go once
/// drained).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drains {
    Allowed,
    NotAllowed,
}

fn describe(rules: &ProxyRules) -> String {
    let services: Vec<String> = rules.ipvs.iter().map(|s| format!("{} ({} conns)", s.key, s.connections)).collect();
    format!(
        "{} kube-proxy table(s), {} kproxy table(s), {} kproxy-ipvs table(s), iptables chains [{}], IPVS virtual services [{}], {}, ip sets [{}]",
        rules.kube_proxy_tables,
        rules.kproxy_tables,
        rules.kproxy_ipvs_tables,
        rules.kube_chains.join(", "),
        services.join(", "),
        match &rules.ipvs_dummy {
            Some(addrs) => format!("{IPVS_DUMMY} with {} address(es)", addrs.len()),
            None => format!("no {IPVS_DUMMY}"),
        },
        rules.kube_ipsets.join(", "),
    )
}

/// The client pod's traffic, run in the pod's background for the whole migration; it writes its
/// counts to `/tmp/load.counts` every second and a line per failure to `/tmp/load.err`.
struct Load;

/// What the client saw.
#[derive(Debug, Default)]
struct Counts {
    cluster_ip: (u64, u64),
    node_port: (u64, u64),
    exchanges: u64,
    broken: u64,
    /// Times the long-lived connections were closed and opened again on purpose
    /// ([`Load::reconnect`]); not broken.
    reopened: u64,
    failures: Vec<String>,
    /// When the loop wrote these counts (time of day, UTC), if it said.
    written_at: Option<String>,
    /// The client's loop did not stop when told to (why, and what it last did): these are its
    /// last counts.
    unfinished: Option<String>,
}

impl Counts {
    fn failed(&self) -> u64 {
        self.cluster_ip.1 + self.node_port.1 + self.broken
    }

    fn parse(text: &str) -> Option<Counts> {
        let numbers: Vec<u64> = text
            .lines()
            .find_map(|l| l.strip_prefix("COUNTS "))?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let [ok1, f1, ok2, f2, exchanges, broken, reopened] = numbers[..] else { return None };
        Some(Counts {
            cluster_ip: (ok1, f1),
            node_port: (ok2, f2),
            exchanges,
            broken,
            reopened,
            failures: Vec::new(),
            written_at: text.lines().find_map(|l| l.strip_prefix("AT ")).map(str::to_owned),
            unfinished: None,
        })
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "requests: ClusterIP {} ok / {} failed, NodePort (other node) {} ok / {} failed; long-lived connections: {} exchanges, {} broken",
            self.cluster_ip.0, self.cluster_ip.1, self.node_port.0, self.node_port.1, self.exchanges, self.broken
        )?;
        if self.reopened > 0 {
            write!(f, ", closed and opened again on purpose {} time(s)", self.reopened)?;
        }
        Ok(())
    }
}

impl Load {
    /// Starts the client's loop (until `/tmp/stop` exists in the pod). Requests are `curl`s of
    /// `/hostname` with a 2 s limit, one try each (a failure's line says curl's exit status: 28
    /// timed out, 7 refused, 52 empty reply, 56 reset); the long-lived connections are bash's
    /// `/dev/tcp` with one HTTP/1.1 keep-alive request a second, its answer read with a 5 s
    /// limit (a failed exchange counts as a broken connection, which is then opened anew). While
    /// `/tmp/reconnect` exists in the pod, both are closed and opened again, counted apart.
    /// SIGPIPE is ignored, so a write to a connection the peer reset fails (and is counted)
    /// instead of killing the loop; each opening is stamped (a connect has the kernel's SYN
    /// limit, not ours), and the loop's end is written with its status (`EXITED`).
    fn start(kubectl: &Kubectl, node2: &str, s: &Services) -> anyhow::Result<Load> {
        let Services { web_ip, web_port, steady_ip, steady_port } = s;
        let script = format!(
            r#"rm -f /tmp/stop /tmp/load.done /tmp/reconnect; ok1=0; f1=0; ok2=0; f2=0; ex=0; br=0; re=0; last=0
trap '' PIPE
open() {{ stamp OPEN "$2:$3"; eval "exec $1<>/dev/tcp/$2/$3" 2>/dev/null || stamp UNOPENED "$2:$3"; }}
ask() {{ printf 'GET /hostname HTTP/1.1\r\nHost: x\r\n\r\n' >&$1 2>/dev/null || return 1
  IFS= read -r -t 5 -u $1 status || return 1
  case "$status" in *" 200 "*) ;; *) return 1;; esac
  len=0; while IFS= read -r -t 5 -u $1 line; do line=${{line%$'\r'}}; [ -z "$line" ] && break
    case "${{line,,}}" in content-length:*) len=${{line#*: }};; esac; done
  [ "$len" -gt 0 ] && read -r -t 5 -u $1 -N "$len" body; }}
stamp() {{ t=$EPOCHREALTIME; printf '%s %(%T)T.%s UTC %s\n' "$1" "${{t%.*}}" "${{t#*.}}" "${{*:2}}" >&2; }}
counts() {{ printf 'COUNTS %s\nAT %(%T)T UTC\n' "$ok1 $f1 $ok2 $f2 $ex $br $re" -1 > /tmp/load.counts.new && mv /tmp/load.counts.new /tmp/load.counts; }}
open 3 {steady_ip} 80; open 4 {node2} {steady_port}
while [ ! -e /tmp/stop ]; do
  code=$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 2 http://{web_ip}/hostname); rc=$?
  if [ "$code" = 200 ]; then ok1=$((ok1+1)); else f1=$((f1+1)); stamp FAIL ClusterIP "(curl exit $rc, HTTP $code)"; fi
  code=$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 2 http://{node2}:{web_port}/hostname); rc=$?
  if [ "$code" = 200 ]; then ok2=$((ok2+1)); else f2=$((f2+1)); stamp FAIL NodePort "(curl exit $rc, HTTP $code)"; fi
  if [ $SECONDS -ne $last ]; then last=$SECONDS
    if [ -e /tmp/reconnect ]; then exec 3>&- 4>&-; open 3 {steady_ip} 80; open 4 {node2} {steady_port}; re=$((re+1)); rm -f /tmp/reconnect; fi
    if ask 3; then ex=$((ex+1)); else br=$((br+1)); stamp BROKEN ClusterIP connection; exec 3>&-; open 3 {steady_ip} 80; fi
    if ask 4; then ex=$((ex+1)); else br=$((br+1)); stamp BROKEN NodePort connection; exec 4>&-; open 4 {node2} {steady_port}; fi
    counts
  fi
done
counts; touch /tmp/load.done"#
        );
        kubectl
            .run(&[
                "-n",
                NS,
                "exec",
                "client",
                "--",
                "bash",
                "-c",
                r#"printf '%s\n' "$1" > /tmp/load.sh && { setsid bash -c 'bash /tmp/load.sh; echo "EXITED status $?" >&2' </dev/null >/tmp/load.out 2>/tmp/load.err & }"#,
                "load",
                &script,
            ])
            .context("starting the client's load")?;
        Ok(Load)
    }

    fn read(kubectl: &Kubectl) -> Option<Counts> {
        Counts::parse(&kubectl.run(&["-n", NS, "exec", "client", "--", "cat", "/tmp/load.counts"]).ok()?)
    }

    /// Waits until both kinds of request and both connections have answered, none failed.
    fn wait_flowing(&self, kubectl: &Kubectl) -> anyhow::Result<()> {
        let counts = kubectl.wait_for(startup_patience(Duration::from_secs(60)), "the client's traffic", || {
            Load::read(kubectl).filter(|c| c.cluster_ip.0 > 0 && c.node_port.0 > 0 && c.exchanges >= 4)
        })?;
        if counts.failed() > 0 {
            bail!("the traffic failed before anything changed: {counts}");
        }
        Ok(())
    }

    /// Has the client close its long-lived connections and open them again (through whichever
    /// proxy serves now); returns once it did.
    fn reconnect(&self, kubectl: &Kubectl) -> anyhow::Result<()> {
        kubectl.run(&["-n", NS, "exec", "client", "--", "touch", "/tmp/reconnect"])?;
        kubectl.wait_for(
            startup_patience(Duration::from_secs(30)),
            "the client to open its connections again",
            || kubectl.run(&["-n", NS, "exec", "client", "--", "test", "!", "-e", "/tmp/reconnect"]).ok(),
        )?;
        Ok(())
    }

    /// What runs in the client pod, from /proc: where a loop that does not stop waits.
    fn processes(kubectl: &Kubectl) -> String {
        const LIST: &str = r#"for d in /proc/[0-9]*; do read -r _ _ state _ < "$d/stat" 2>/dev/null || continue
  printf '%s %s %s %s\n' "${d#/proc/}" "$state" "$(cat "$d/wchan" 2>/dev/null)" "$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null)"; done"#;
        kubectl
            .run(&["-n", NS, "exec", "client", "--", "bash", "-c", LIST])
            .unwrap_or_else(|e| format!("(not read: {e:#})"))
    }

    /// Stops the loop and reads what it counted and each failure's line. A loop that does not
    /// stop still has its counts read (it writes them once a second, with the time): the run then
    /// fails with them, and says when the loop last wrote and how its error output ends.
    fn finish(self, kubectl: &Kubectl) -> anyhow::Result<Counts> {
        kubectl.run(&["-n", NS, "exec", "client", "--", "touch", "/tmp/stop"])?;
        let stopped = kubectl.wait_for(startup_patience(Duration::from_secs(30)), "the client's load to stop", || {
            kubectl.run(&["-n", NS, "exec", "client", "--", "test", "-e", "/tmp/load.done"]).ok()
        });
        let mut counts = Load::read(kubectl).context("the client's counts")?;
        let errors = kubectl.run(&["-n", NS, "exec", "client", "--", "cat", "/tmp/load.err"])?;
        counts.failures =
            errors.lines().filter(|l| l.starts_with("FAIL") || l.starts_with("BROKEN")).map(str::to_owned).collect();
        if let Err(e) = stopped {
            let written = counts.written_at.as_deref().unwrap_or("an unknown time");
            let lines: Vec<&str> = errors.lines().collect();
            let tail = &lines[lines.len().saturating_sub(3)..];
            counts.unfinished = Some(format!(
                "{e:#}; its counts were last written at {written}; its error output ends {tail:?}; \
                 the pod's processes (pid, state, kernel wait, command):\n{}",
                Load::processes(kubectl)
            ));
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kproxy_k8s_harness::migration::{VirtualKey, VirtualService};

    fn addr_service(addr: &str, port: u16, connections: u64) -> VirtualService {
        VirtualService {
            key: VirtualKey::Addr { protocol: "TCP", addr: addr.parse().unwrap(), port },
            real_servers: Vec::new(),
            connections,
        }
    }

    /// A firewall-mark service of kproxy's IPVS mode (a Local-policy port's short-circuit),
    /// without connections.
    fn fwmark_service() -> VirtualService {
        VirtualService { key: VirtualKey::Fwmark(0x1000_0001), real_servers: Vec::new(), connections: 0 }
    }

    fn chains(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| format!("nft ipv4 {n}")).collect()
    }

    /// A node as kube-proxy's IPVS mode keeps it: a ClusterIP (carrying a connection) and a
    /// NodePort on the node's address, the dummy interface, ip sets and iptables chains.
    fn kube_proxy_ipvs() -> ProxyRules {
        ProxyRules {
            kube_chains: chains(&["nat KUBE-SERVICES", "nat KUBE-NODE-PORT", "filter KUBE-IPVS-FILTER"]),
            ipvs_filter_rules: 6,
            ipvs: vec![addr_service("10.96.0.10", 80, 2), addr_service("198.18.0.2", 31000, 0)],
            ipvs_dummy: Some(vec!["10.96.0.10".parse().unwrap()]),
            kube_ipsets: vec!["KUBE-CLUSTER-IP".into(), "KUBE-NODE-PORT-TCP".into()],
            ..Default::default()
        }
    }

    /// A node as kproxy's IPVS mode keeps it: the ClusterIP and the NodePort on the node's
    /// address (the virtual services kube-proxy's IPVS mode makes), the dummy interface and the
    /// auxiliary table.
    fn kproxy_ipvs() -> ProxyRules {
        ProxyRules {
            kproxy_ipvs_tables: 1,
            ipvs: vec![addr_service("10.96.0.10", 80, 2), addr_service("198.18.0.2", 31000, 0)],
            ipvs_dummy: Some(vec!["10.96.0.10".parse().unwrap()]),
            ..Default::default()
        }
    }

    fn kproxy_nftables() -> ProxyRules {
        ProxyRules { kproxy_tables: 1, ..Default::default() }
    }

    fn modes<'a>(kube_proxy: &'a str, kproxy: &'a str) -> Modes<'a> {
        Modes { kube_proxy, kproxy }
    }

    fn what(left: &[Leftover]) -> Vec<(&str, bool)> {
        left.iter().map(|l| (l.what.as_str(), l.drains)).collect()
    }

    #[test]
    fn each_proxys_ipvs_mode_is_told_by_what_only_it_has() {
        assert!(serves(Proxy::KubeProxy, "ipvs", &kube_proxy_ipvs()));
        assert!(!serves(Proxy::Kproxy, "ipvs", &kube_proxy_ipvs()), "kube-proxy has no auxiliary table");
        assert!(serves(Proxy::Kproxy, "ipvs", &kproxy_ipvs()));
        assert!(!serves(Proxy::KubeProxy, "ipvs", &kproxy_ipvs()), "kproxy makes no ip sets nor chains");
        let without_sets = ProxyRules { kube_ipsets: Vec::new(), ..kube_proxy_ipvs() };
        assert!(!serves(Proxy::KubeProxy, "ipvs", &without_sets));
        assert!(serves(Proxy::Kproxy, "nftables", &kproxy_nftables()));
        assert!(!serves(Proxy::Kproxy, "nftables", &kube_proxy_ipvs()));
        assert!(serves(Proxy::KubeProxy, "iptables", &kube_proxy_ipvs()), "the same entry chain's name");
        // Its chains are created at the start of its sync, their rules written at its end.
        let mid_sync = ProxyRules { ipvs_filter_rules: 0, ..kube_proxy_ipvs() };
        assert!(!serves(Proxy::KubeProxy, "ipvs", &mid_sync));
    }

    #[test]
    fn onto_kproxys_nftables_mode_everything_of_kube_proxys_ipvs_mode_must_go_and_what_carries_connections_drains_first()
     {
        let m = modes("ipvs", "nftables");
        let both = ProxyRules { kproxy_tables: 1, ..kube_proxy_ipvs() };
        assert_eq!(
            what(&left(m, Direction::OntoKproxy, &both)),
            [
                (
                    "iptables chains [nft ipv4 nat KUBE-SERVICES, nft ipv4 nat KUBE-NODE-PORT, nft ipv4 filter KUBE-IPVS-FILTER]",
                    false
                ),
                ("ip sets [KUBE-CLUSTER-IP, KUBE-NODE-PORT-TCP]", false),
                ("virtual service TCP 10.96.0.10:80 (2 connections)", true),
                ("virtual service TCP 198.18.0.2:31000 (0 connections)", false),
                ("kube-ipvs0", true),
            ]
        );
        // Taken over: only the service that carries a connection, and the dummy interface for it.
        let draining = ProxyRules {
            ipvs: vec![addr_service("10.96.0.10", 80, 2)],
            ipvs_dummy: Some(vec!["10.96.0.10".parse().unwrap()]),
            ..kproxy_nftables()
        };
        assert!(left(m, Direction::OntoKproxy, &draining).iter().all(|l| l.drains));
        assert_eq!(left(m, Direction::OntoKproxy, &draining).len(), 2);
        // Drained: kube-ipvs0 alone is kube-proxy's too.
        let dummy_only = ProxyRules { ipvs_dummy: Some(Vec::new()), ..kproxy_nftables() };
        assert_eq!(what(&left(m, Direction::OntoKproxy, &dummy_only)), [("kube-ipvs0", false)]);
        assert_eq!(left(m, Direction::OntoKproxy, &kproxy_nftables()), []);
    }

    #[test]
    fn onto_kproxys_ipvs_mode_the_virtual_services_and_dummy_are_shared_but_kube_proxys_sets_and_chains_go() {
        let m = modes("ipvs", "ipvs");
        assert_eq!(left(m, Direction::OntoKproxy, &kproxy_ipvs()), [], "adopted: nothing of kube-proxy's");
        let mut both = kube_proxy_ipvs();
        both.kproxy_ipvs_tables = 1;
        both.ipvs.push(addr_service("198.18.0.2", 31001, 3));
        assert_eq!(
            what(&left(m, Direction::OntoKproxy, &both)),
            [
                (
                    "iptables chains [nft ipv4 nat KUBE-SERVICES, nft ipv4 nat KUBE-NODE-PORT, nft ipv4 filter KUBE-IPVS-FILTER]",
                    false
                ),
                ("ip sets [KUBE-CLUSTER-IP, KUBE-NODE-PORT-TCP]", false),
            ]
        );
    }

    #[test]
    fn failures_are_counted_by_the_proxy_that_served_them() {
        let timeline = Timeline {
            changes: vec![
                (0, 100.0, Serving::Both),
                (0, 130.0, Serving::Kproxy),
                (1, 200.0, Serving::Both),
                (1, 230.0, Serving::Kproxy),
            ],
        };
        let lines: Vec<String> = [
            "FAIL 00:01:39.5 UTC ClusterIP (curl exit 28, HTTP 000)", // node 1 on kube-proxy
            "FAIL 00:01:45.0 UTC NodePort (curl exit 7, HTTP 000)",   // node 2 on kube-proxy
            "BROKEN 00:03:30.0 UTC NodePort connection",              // node 2: both
            "FAIL 00:03:00.0 UTC ClusterIP (curl exit 7, HTTP 000)",  // node 1 on kproxy
            "FAIL garbage",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(
            timeline.attribute(&lines),
            "failed or broken by what served them (ClusterIP: node 1's proxy, NodePort: node 2's): kube-proxy alone 2, both 1, kproxy alone 1, unreadable 1"
        );
    }

    #[test]
    fn onto_kproxys_iptables_mode_only_the_chains_of_kube_proxys_ipvs_mode_alone_go() {
        let rules =
            ProxyRules { kube_chains: chains(&["nat KUBE-SERVICES", "nat KUBE-NODE-PORT"]), ..Default::default() };
        assert_eq!(
            what(&left(modes("ipvs", "iptables"), Direction::OntoKproxy, &rules)),
            [("iptables chains [nft ipv4 nat KUBE-NODE-PORT]", false)]
        );
        assert_eq!(left(modes("iptables", "iptables"), Direction::OntoKproxy, &rules), [], "shared chains");
        assert_eq!(left(modes("iptables", "nftables"), Direction::OntoKproxy, &rules).len(), 1);
    }

    #[test]
    fn back_to_kube_proxys_ipvs_mode_its_state_stays_and_only_kproxys_own_must_be_gone() {
        let m = modes("ipvs", "ipvs");
        assert_eq!(left(m, Direction::BackToKubeProxy, &kube_proxy_ipvs()), []);
        let mut both = kube_proxy_ipvs();
        both.kproxy_ipvs_tables = 2;
        both.ipvs.push(fwmark_service());
        assert_eq!(
            what(&left(m, Direction::BackToKubeProxy, &both)),
            [("2 nftables table(s) of kproxy's", false), ("virtual services [FWM 0x10000001]", false)]
        );
        let from_nftables = ProxyRules { kproxy_tables: 1, ..kube_proxy_ipvs() };
        assert_eq!(
            what(&left(modes("ipvs", "nftables"), Direction::BackToKubeProxy, &from_nftables)),
            [("1 nftables table(s) of kproxy's", false)]
        );
        assert_eq!(left(modes("ipvs", "nftables"), Direction::BackToKubeProxy, &kube_proxy_ipvs()), []);
        // kproxy in iptables mode leaves the chains kube-proxy's IPVS mode writes too.
        let from_iptables = ProxyRules {
            kube_chains: chains(&["nat KUBE-SERVICES", "nat KUBE-SVC-ABCDEF", "filter KUBE-IPVS-FILTER"]),
            ..kube_proxy_ipvs()
        };
        assert_eq!(
            what(&left(modes("ipvs", "iptables"), Direction::BackToKubeProxy, &from_iptables)),
            [("iptables chains [nft ipv4 nat KUBE-SVC-ABCDEF]", false)]
        );
    }

    #[test]
    fn back_to_a_kube_proxy_not_in_ipvs_mode_everything_of_kproxys_ipvs_mode_goes() {
        let rules = ProxyRules { kube_proxy_tables: 1, ..kproxy_ipvs() };
        assert_eq!(
            what(&left(modes("nftables", "ipvs"), Direction::BackToKubeProxy, &rules)),
            [
                ("1 nftables table(s) of kproxy's", false),
                ("virtual services [TCP 10.96.0.10:80, TCP 198.18.0.2:31000]", false),
                ("kube-ipvs0", false),
            ]
        );
        assert_eq!(left(modes("nftables", "ipvs"), Direction::BackToKubeProxy, &ProxyRules::default()), []);
    }

    #[test]
    fn only_kube_proxys_nftables_start_under_kproxys_iptables_mode_leaves_a_window() {
        assert!(modes("nftables", "iptables").handback_has_a_window());
        for (kube_proxy, kproxy) in [("ipvs", "nftables"), ("ipvs", "ipvs"), ("ipvs", "iptables"), ("nftables", "ipvs")]
        {
            assert!(!modes(kube_proxy, kproxy).handback_has_a_window(), "{kube_proxy} <- {kproxy}");
        }
    }

    #[test]
    fn the_clients_counts_are_read_with_the_reconnections_apart() {
        let counts = Counts::parse("COUNTS 10 1 9 2 30 0 1\n").unwrap();
        assert_eq!((counts.cluster_ip, counts.node_port, counts.exchanges, counts.broken), ((10, 1), (9, 2), 30, 0));
        assert_eq!((counts.reopened, counts.failed()), (1, 3));
        assert!(counts.to_string().ends_with("closed and opened again on purpose 1 time(s)"));
        assert!(Counts::parse("COUNTS 10 1 9 2 30 0\n").is_none());
        let written = Counts::parse("COUNTS 10 1 9 2 30 0 1\nAT 07:55:55 UTC\n").unwrap().written_at;
        assert_eq!(written.as_deref(), Some("07:55:55 UTC"));
    }
}

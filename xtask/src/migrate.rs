//! `cargo xtask cluster migrate`: a cluster's nodes moved from upstream kube-proxy to kproxy and
//! back, node by node, the way docs/migration.md tells an operator to, with traffic the whole
//! time — and what it cost.
//!
//! The cluster comes up with kube-proxy (`--from` mode) on every node, as a process (no image of
//! it exists offline; deploy/README.md's kubeadm DaemonSet would run the same binary). Then:
//!
//! - **onto kproxy**, node by node: kproxy's DaemonSet (deploy/kproxy.yaml, with a node selector
//!   so it goes where the operator labels) is let onto the node; once kproxy has synced, beside
//!   the running kube-proxy, kube-proxy is stopped; kproxy takes its ports and its leftovers.
//! - **back to kube-proxy**, node by node: kube-proxy is started beside kproxy; once it has
//!   synced, the node's label is removed and the DaemonSet's pod stops: it hands the node back.
//!
//! After every step a Deployment is rolled (every endpoint changes). Throughout, a client pod on
//! the first node sends requests without pause to a ClusterIP and to the second node's NodePort,
//! and holds two TCP connections open (one through a ClusterIP, one through the second node's
//! NodePort) to a Deployment that is never rolled, exchanging a request on each every second.
//! The report: failed requests, broken connections, and for each node how long it was between
//! proxies (one proxy stopped, the other not yet holding the node's ports).

use std::fs;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kproxy_k8s_harness::cluster::{ClusterInfo, Kubectl};
use kproxy_k8s_harness::migration::{self, proxy_rules};
use kproxy_k8s_harness::{Binaries, cluster};

use crate::image;
use crate::layout::Layout;

const NS: &str = "kproxy-migration";
const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.63.0";
/// The label that lets kproxy's DaemonSet onto a node.
const NODE_LABEL: &str = "kproxy.io/node";
/// How long any one step may take (a node's proxy syncing, a pod starting, a rollout).
const STEP: Duration = Duration::from_secs(180);

/// The harness's view of a migration run.
pub struct Migration<'a> {
    pub layout: &'a Layout,
    pub work: &'a Path,
    /// kube-proxy's mode.
    pub from: &'a str,
    /// kproxy's mode.
    pub to: &'a str,
}

/// One node's trip between the proxies.
#[derive(Debug, Default)]
struct NodeReport {
    name: String,
    /// kube-proxy stopped → kproxy serving `/readyz` (its ports held, its rules in).
    onto_kproxy_gap: Duration,
    /// kproxy's SIGTERM → its pod gone (kube-proxy running and synced all along).
    handback: Duration,
}

pub fn run(m: &Migration, cluster: &cluster::Cluster, binaries: &Binaries) -> anyhow::Result<bool> {
    let info = &cluster.info;
    if info.nodes.len() < 2 {
        bail!("migrate needs two nodes (the client on one, the NodePort of the other)");
    }
    let kubectl = Kubectl::from_info(info);
    let archive = m.layout.target.join(image::ARCHIVE);
    migration::import_image(m.work, info, &archive)?;
    deploy_kproxy(m, &kubectl, info)?;
    let (cluster_ip, node_port, steady_ip, steady_port) = deploy_workload(&kubectl, info)?;
    let load =
        Load::start(&kubectl, &info.nodes[1].ips[0].to_string(), &cluster_ip, &node_port, &steady_ip, &steady_port)?;
    let started = Instant::now();
    let mut reports = Vec::new();
    let mut steps = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        for index in 1..=info.nodes.len() as u8 {
            let mut report = NodeReport { name: info.nodes[usize::from(index) - 1].name.clone(), ..Default::default() };
            report.onto_kproxy_gap = onto_kproxy(m, &kubectl, info, index)?;
            steps.push(format!("+{:.0}s {} on kproxy", started.elapsed().as_secs_f64(), report.name));
            roll(&kubectl)?;
            reports.push(report);
        }
        for index in 1..=info.nodes.len() as u8 {
            reports[usize::from(index) - 1].handback = back_to_kube_proxy(m, binaries, &kubectl, info, index)?;
            steps.push(format!(
                "+{:.0}s {} back on kube-proxy",
                started.elapsed().as_secs_f64(),
                info.nodes[usize::from(index) - 1].name
            ));
            roll(&kubectl)?;
        }
        Ok(())
    })();
    let counts = load.finish(&kubectl);
    result?;
    let counts = counts?;
    println!(
        "migrate: kube-proxy ({}) -> kproxy ({}) -> kube-proxy ({}), {} nodes, {:.0} s",
        m.from,
        m.to,
        m.from,
        info.nodes.len(),
        started.elapsed().as_secs_f64()
    );
    for step in &steps {
        println!("migrate:   {step}");
    }
    for r in &reports {
        println!(
            "migrate:   {}: kube-proxy stopped -> kproxy serving in {:.2} s; kproxy stopped -> gone in {:.2} s (kube-proxy serving throughout)",
            r.name,
            r.onto_kproxy_gap.as_secs_f64(),
            r.handback.as_secs_f64()
        );
    }
    println!("migrate:   {counts}");
    for failure in &counts.failures {
        println!("migrate:   failure: {failure}");
    }
    Ok(counts.failed() == 0)
}

/// kproxy's DaemonSet as deploy/kproxy.yaml has it (mode, image and API server substituted as
/// `up` does), onto nodes labelled [`NODE_LABEL`] only: none yet.
fn deploy_kproxy(m: &Migration, kubectl: &Kubectl, info: &ClusterInfo) -> anyhow::Result<()> {
    let manifest = fs::read_to_string(m.layout.workspace.join("deploy/kproxy.yaml"))?;
    let manifest = cluster::substitute_manifest(&manifest, image::IMAGE_NAME, &info.server, m.to, info.families)?;
    // The node selector the operator adds for a node-by-node move (docs/migration.md).
    let selector = "        kubernetes.io/os: linux\n";
    if !manifest.contains(selector) {
        bail!("deploy/kproxy.yaml has no `kubernetes.io/os: linux` node selector to extend");
    }
    let manifest = manifest.replacen(selector, &format!("{selector}        {NODE_LABEL}: \"true\"\n"), 1);
    kubectl.apply(&manifest)?;
    Ok(())
}

/// Deployment `web` (4 pods, rolled after every step) behind a NodePort Service, Deployment
/// `steady` (2 pods, never rolled) behind another, and the client pod on the first node.
/// Returns web's ClusterIP and NodePort, steady's ClusterIP and NodePort.
fn deploy_workload(kubectl: &Kubectl, info: &ClusterInfo) -> anyhow::Result<(String, String, String, String)> {
    let deployment = |name: &str, replicas: u32| {
        serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {
                "terminationGracePeriodSeconds": 30,
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": name}}}],
                "containers": [{"name": "netexec", "image": AGNHOST, "args": ["netexec", "--http-port=8080"],
                    "ports": [{"containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 1},
                    "lifecycle": {"preStop": {"sleep": {"seconds": 5}}}}]}}}})
    };
    let service = |name: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"type": "NodePort", "selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    };
    let manifest = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        deployment("web", 4), deployment("steady", 2), service("web"), service("steady"),
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client", "namespace": NS},
         "spec": {"nodeName": info.nodes[0].name, "containers": [{"name": "client", "image": AGNHOST, "args": ["pause"]}]}}
    ]});
    kubectl.apply(&manifest.to_string())?;
    for deployment in ["web", "steady"] {
        kubectl.run(&["-n", NS, "rollout", "status", &format!("deployment/{deployment}"), "--timeout=180s"])?;
    }
    kubectl.run(&["-n", NS, "wait", "--for=condition=Ready", "pod/client", "--timeout=120s"])?;
    let get = |svc: &str, path: &str| {
        kubectl.run(&["-n", NS, "get", "svc", svc, "-o", &format!("jsonpath={{{path}}}")]).map(|s| s.trim().to_owned())
    };
    Ok((
        get("web", ".spec.clusterIP")?,
        get("web", ".spec.ports[0].nodePort")?,
        get("steady", ".spec.clusterIP")?,
        get("steady", ".spec.ports[0].nodePort")?,
    ))
}

/// `kubectl rollout restart` of `web`, waited for.
fn roll(kubectl: &Kubectl) -> anyhow::Result<()> {
    kubectl.run(&["-n", NS, "rollout", "restart", "deployment/web"])?;
    kubectl.run(&["-n", NS, "rollout", "status", "deployment/web", "--timeout=180s"])?;
    Ok(())
}

/// The kproxy pod on `node`, once there is one.
fn kproxy_pod(kubectl: &Kubectl, node: &str) -> Option<String> {
    let out = kubectl
        .run(&[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            "k8s-app=kproxy",
            "--field-selector",
            &format!("spec.nodeName={node}"),
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .ok()?;
    out.split_whitespace().next().map(str::to_owned)
}

/// Follows a pod's log into a file until the pod ends (`kubectl logs -f`).
fn follow_log(kubectl: &Kubectl, pod: &str, file: &Path) -> anyhow::Result<Child> {
    let out = fs::File::create(file)?;
    Ok(kubectl
        .command(&["-n", "kube-system", "logs", "-f", pod, "-c", "kproxy"])
        .stdout(out)
        .stderr(Stdio::null())
        .spawn()?)
}

/// Node `index` onto kproxy; returns how long it was between proxies.
fn onto_kproxy(m: &Migration, kubectl: &Kubectl, info: &ClusterInfo, index: u8) -> anyhow::Result<Duration> {
    let node = &info.nodes[usize::from(index) - 1];
    kubectl.run(&["label", "node", &node.name, &format!("{NODE_LABEL}=true")])?;
    let pod = kubectl.wait_for(STEP, &format!("kproxy's pod on {}", node.name), || kproxy_pod(kubectl, &node.name))?;
    kubectl.wait_for(STEP, &format!("{pod} running"), || {
        let phase = kubectl.run(&["-n", "kube-system", "get", "pod", &pod, "-o", "jsonpath={.status.phase}"]).ok()?;
        (phase.trim() == "Running").then_some(())
    })?;
    let log = m.work.join(format!("migrate-{}-{pod}.log", node.name));
    let mut follower = follow_log(kubectl, &pod, &log)?;
    migration::wait_for_log(&log, "full sync done", STEP).context("kproxy's first sync beside kube-proxy")?;
    let rules = proxy_rules(&node.netns)?;
    if m.to == "nftables" && rules.kproxy_tables == 0 {
        bail!("kproxy synced but its tables are not in {}'s kernel: {rules:?}", node.name);
    }
    let stopped = Instant::now();
    if !migration::stop_recorded(m.work, &migration::kube_proxy_process(info, index), Duration::from_secs(10))? {
        bail!("no kube-proxy was running on {}", node.name);
    }
    kubectl.wait_for(STEP, &format!("{pod} ready"), || {
        let ready = kubectl
            .run(&[
                "-n",
                "kube-system",
                "get",
                "pod",
                &pod,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ])
            .ok()?;
        (ready.trim() == "True").then_some(())
    })?;
    let gap = stopped.elapsed();
    // What kube-proxy left is gone (in iptables mode on both sides, the chains were shared).
    if !(m.from == "iptables" && m.to == "iptables") {
        migration::wait_for_log(&log, "took the node over from kube-proxy", STEP)?;
        let rules = proxy_rules(&node.netns)?;
        let left = if m.from == "nftables" {
            rules.kube_proxy_tables > 0
        } else {
            rules.kube_services_chain && m.to != "iptables"
        };
        if left {
            bail!("kube-proxy's rules are still in {}'s kernel after the takeover: {rules:?}", node.name);
        }
    }
    let _ = follower.kill();
    let _ = follower.wait();
    Ok(gap)
}

/// Node `index` back to kube-proxy; returns how long kproxy took to stop.
fn back_to_kube_proxy(
    m: &Migration,
    binaries: &Binaries,
    kubectl: &Kubectl,
    info: &ClusterInfo,
    index: u8,
) -> anyhow::Result<Duration> {
    let node = &info.nodes[usize::from(index) - 1];
    let pod = kproxy_pod(kubectl, &node.name).context("no kproxy pod")?;
    let log = m.work.join(format!("migrate-{}-{pod}-handback.log", node.name));
    let mut follower = follow_log(kubectl, &pod, &log)?;
    let upstream_log = info.logs.join(format!("{}-kube-proxy.log", node.name));
    let before = fs::read_to_string(&upstream_log).map(|t| t.len()).unwrap_or(0);
    migration::start_kube_proxy(binaries, m.work, info, index, &["--v=2".to_owned()])?;
    // Synced: its log says so after this start (the log is appended to).
    let start = Instant::now();
    loop {
        let text = fs::read_to_string(&upstream_log).unwrap_or_default();
        if text.get(before..).is_some_and(|t| t.contains("SyncProxyRules complete")) {
            break;
        }
        if start.elapsed() > STEP {
            bail!("kube-proxy on {} never synced:\n{}", node.name, text.get(before..).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let stopping = Instant::now();
    kubectl.run(&["label", "node", &node.name, &format!("{NODE_LABEL}-")])?;
    kubectl.wait_for(STEP, &format!("{pod} gone"), || {
        kubectl.run(&["-n", "kube-system", "get", "pod", &pod]).is_err().then_some(())
    })?;
    let handback = stopping.elapsed();
    let _ = follower.wait();
    let text = fs::read_to_string(&log).unwrap_or_default();
    let shared = m.from == "iptables" && m.to == "iptables";
    let said = if shared { "the rules stay in place" } else { "handed the node back to kube-proxy" };
    if !text.contains(said) {
        bail!("kproxy on {} did not say {said:?}:\n{text}", node.name);
    }
    let rules = proxy_rules(&node.netns)?;
    if rules.kproxy_tables > 0 {
        bail!("kproxy's tables stayed in {}'s kernel: {rules:?}", node.name);
    }
    Ok(handback)
}

/// The client pod's traffic, for the whole run.
struct Load {
    child: Child,
}

/// What the client saw.
#[derive(Debug, Default)]
struct Counts {
    cluster_ip: (u64, u64),
    node_port: (u64, u64),
    exchanges: u64,
    broken: u64,
    failures: Vec<String>,
}

impl Counts {
    fn failed(&self) -> u64 {
        self.cluster_ip.1 + self.node_port.1 + self.broken
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "requests: ClusterIP {} ok / {} failed, NodePort (other node) {} ok / {} failed; long-lived connections: {} exchanges, {} broken",
            self.cluster_ip.0, self.cluster_ip.1, self.node_port.0, self.node_port.1, self.exchanges, self.broken
        )
    }
}

impl Load {
    /// Starts the client's loop (until `/tmp/stop` exists in the pod). Requests are `curl`s of
    /// `/hostname` with a 2 s limit; the long-lived connections are bash's `/dev/tcp` with one
    /// HTTP/1.1 keep-alive request a second, its answer read with a 5 s limit.
    fn start(
        kubectl: &Kubectl,
        node2: &str,
        cluster_ip: &str,
        node_port: &str,
        steady_ip: &str,
        steady_port: &str,
    ) -> anyhow::Result<Load> {
        let script = format!(
            r#"rm -f /tmp/stop; ok1=0; f1=0; ok2=0; f2=0; ex=0; br=0; last=0
open() {{ eval "exec $1<>/dev/tcp/$2/$3" 2>/dev/null; }}
ask() {{ printf 'GET /hostname HTTP/1.1\r\nHost: x\r\n\r\n' >&$1 2>/dev/null || return 1
  IFS= read -r -t 5 -u $1 status || return 1
  case "$status" in *" 200 "*) ;; *) return 1;; esac
  len=0; while IFS= read -r -t 5 -u $1 line; do line=${{line%$'\r'}}; [ -z "$line" ] && break
    case "${{line,,}}" in content-length:*) len=${{line#*: }};; esac; done
  [ "$len" -gt 0 ] && read -r -t 5 -u $1 -N "$len" body; }}
open 3 {steady_ip} 80; open 4 {node2} {steady_port}
while [ ! -e /tmp/stop ]; do
  if [ "$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 2 http://{cluster_ip}/hostname)" = 200 ]; then ok1=$((ok1+1)); else f1=$((f1+1)); echo "FAIL $(date +%T.%N) ClusterIP" >&2; fi
  if [ "$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 2 http://{node2}:{node_port}/hostname)" = 200 ]; then ok2=$((ok2+1)); else f2=$((f2+1)); echo "FAIL $(date +%T.%N) NodePort" >&2; fi
  if [ $SECONDS -ne $last ]; then last=$SECONDS
    if ask 3; then ex=$((ex+1)); else br=$((br+1)); echo "BROKEN $(date +%T.%N) ClusterIP connection" >&2; exec 3>&-; open 3 {steady_ip} 80; fi
    if ask 4; then ex=$((ex+1)); else br=$((br+1)); echo "BROKEN $(date +%T.%N) NodePort connection" >&2; exec 4>&-; open 4 {node2} {steady_port}; fi
  fi
done
echo "COUNTS $ok1 $f1 $ok2 $f2 $ex $br""#
        );
        let child = kubectl
            .command(&["-n", NS, "exec", "client", "--", "bash", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting the client's load")?;
        Ok(Load { child })
    }

    /// Stops the loop and reads what it counted.
    fn finish(mut self, kubectl: &Kubectl) -> anyhow::Result<Counts> {
        let _ = kubectl.run(&["-n", NS, "exec", "client", "--", "touch", "/tmp/stop"]);
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                bail!("the client's load did not stop");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let out = self.child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let numbers: Vec<u64> = stdout
            .lines()
            .find_map(|l| l.strip_prefix("COUNTS "))
            .map(|l| l.split_whitespace().filter_map(|w| w.parse().ok()).collect())
            .unwrap_or_default();
        let [ok1, f1, ok2, f2, ex, br] = numbers[..] else {
            bail!("the client printed {stdout:?} ({})", String::from_utf8_lossy(&out.stderr));
        };
        let failures = String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.starts_with("FAIL") || l.starts_with("BROKEN"))
            .map(str::to_owned)
            .collect();
        Ok(Counts { cluster_ip: (ok1, f1), node_port: (ok2, f2), exchanges: ex, broken: br, failures })
    }
}

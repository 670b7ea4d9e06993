//! What moving a running cluster's nodes between kube-proxy's DaemonSet and kproxy's takes of
//! the harness: the node label both DaemonSets' node affinities read, the patch that keeps
//! kube-proxy's DaemonSet off the nodes kproxy has, kproxy's image in every node's containerd,
//! and what each proxy has in a node's kernel. `cargo xtask cluster migrate` drives them, the
//! way docs/migration.md tells an operator to.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::cluster::ClusterInfo;
use crate::node::Node;

/// The node label the two DaemonSets' node affinities read (docs/migration.md). Its values are
/// [`ON_KUBE_PROXY`], [`ON_BOTH`] and [`ON_KPROXY`]; a node without it runs both.
pub const NODE_LABEL: &str = "kproxy.io/proxy";
/// kube-proxy only: kproxy's DaemonSet (deploy/kproxy.yaml) stays off the node.
pub const ON_KUBE_PROXY: &str = "kube-proxy";
/// Both proxies, while one hands the node to the other.
pub const ON_BOTH: &str = "both";
/// kproxy only: kube-proxy's DaemonSet, once patched ([`kube_proxy_affinity_patch`]), leaves.
pub const ON_KPROXY: &str = "kproxy";

/// The strategic-merge patch of kube-proxy's DaemonSet that keeps its pods off nodes labelled
/// [`NODE_LABEL`]`=`[`ON_KPROXY`] (the mirror of deploy/kproxy.yaml's affinity).
pub fn kube_proxy_affinity_patch() -> String {
    serde_json::json!({"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": NODE_LABEL, "operator": "NotIn", "values": [ON_KPROXY]}]}]}}}}}}})
    .to_string()
}

/// The cluster name behind `info` (its wire namespace is `NAME-wire`).
fn cluster_name(info: &ClusterInfo) -> Result<&str> {
    info.wire_netns.strip_suffix("-wire").context("the cluster's wire namespace is not NAME-wire")
}

/// Node `index` (1-based) of the cluster in `work`.
fn node(work: &Path, info: &ClusterInfo, index: u8) -> Result<Node> {
    let zone = info.nodes.get(usize::from(index) - 1).and_then(|n| n.zone.clone());
    Ok(Node::new(cluster_name(info)?, index, info.families, zone, &work.join("run")))
}

/// Imports kproxy's image archive into every node's containerd (a cluster brought up for
/// upstream kube-proxy has it nowhere).
pub fn import_image(work: &Path, info: &ClusterInfo, archive: &Path) -> Result<()> {
    for index in 1..=u8::try_from(info.nodes.len())? {
        node(work, info, index)?.containerd().import(archive)?;
    }
    Ok(())
}

/// The `KUBE-` chains the kubelet owns (`KUBE-FIREWALL`, the canary and the hint), and
/// `KUBE-MARK-DROP`, which upstream's own `kube-proxy --cleanup` leaves as well: none of them is
/// a proxy's.
const NOT_A_PROXYS: [&str; 4] = ["KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-MARK-DROP"];

/// What of each proxy is in one node's kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyRules {
    /// nftables tables named `kube-proxy` (kube-proxy's nftables mode), any family.
    pub kube_proxy_tables: usize,
    /// nftables tables named `kproxy` or `kproxy-accel` (kproxy's).
    pub kproxy_tables: usize,
    /// Service proxy `KUBE-…` chains in iptables, as `backend family table chain` (either
    /// proxy's iptables mode: both use upstream's names), the kubelet's left out.
    pub kube_chains: Vec<String>,
}

impl ProxyRules {
    /// Whether the node's iptables has the Service proxy's entry chain (`KUBE-SERVICES`).
    pub fn kube_services(&self) -> bool {
        self.kube_chains.iter().any(|c| c.ends_with(" KUBE-SERVICES"))
    }
}

/// Reads [`ProxyRules`] in namespace `netns`: `nft list tables` and the four `*tables-save` of
/// both backends and families.
pub fn proxy_rules(netns: &str) -> Result<ProxyRules> {
    let run = |args: &[&str]| -> Result<String> {
        let out = Command::new("ip")
            .args(["netns", "exec", netns])
            .args(args)
            .output()
            .with_context(|| format!("running {}", args.join(" ")))?;
        // An empty listing must mean "nothing there", never "could not look".
        if !out.status.success() {
            anyhow::bail!("{} in {netns}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let tables = run(&["nft", "list", "tables"])?;
    let named = |name: &str| tables.lines().filter(|l| l.split_whitespace().nth(2) == Some(name)).count();
    let mut kube_chains = Vec::new();
    for (backend, family, save) in [
        ("nft", "ipv4", "iptables-nft-save"),
        ("nft", "ipv6", "ip6tables-nft-save"),
        ("legacy", "ipv4", "iptables-legacy-save"),
        ("legacy", "ipv6", "ip6tables-legacy-save"),
    ] {
        let mut table = "";
        for line in run(&[save])?.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = name;
            } else if let Some(chain) = line.strip_prefix(':').and_then(|l| l.split_whitespace().next())
                && chain.starts_with("KUBE-")
                && !NOT_A_PROXYS.contains(&chain)
            {
                kube_chains.push(format!("{backend} {family} {table} {chain}"));
            }
        }
    }
    Ok(ProxyRules {
        kube_proxy_tables: named("kube-proxy"),
        kproxy_tables: named("kproxy") + named("kproxy-accel"),
        kube_chains,
    })
}

/// Waits until `log` (a file) contains `needle`; returns when it was seen.
pub fn wait_for_log(log: &Path, needle: &str, timeout: Duration) -> Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        if fs::read_to_string(log).is_ok_and(|text| text.contains(needle)) {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            anyhow::bail!("{} never said {needle:?} within {timeout:?}", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifests_affinity_keeps_kproxy_off_nodes_labelled_kube_proxy_only() {
        let manifest = include_str!("../../../deploy/kproxy.yaml");
        let expected = format!(
            "                  - key: {NODE_LABEL}\n                    operator: NotIn\n                    values: [\"{ON_KUBE_PROXY}\"]\n"
        );
        assert!(manifest.contains(&expected), "deploy/kproxy.yaml's DaemonSet lacks {expected}");
        let patch: serde_json::Value = serde_json::from_str(&kube_proxy_affinity_patch()).unwrap();
        let term = &patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0];
        assert_eq!((term["key"].as_str(), term["operator"].as_str()), (Some(NODE_LABEL), Some("NotIn")));
        assert_eq!(term["values"], serde_json::json!([ON_KPROXY]));
    }
}

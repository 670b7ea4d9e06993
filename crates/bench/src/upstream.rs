//! The same cluster in upstream kube-proxy's nftables shape (reference/UPSTREAM.md §C.2): a
//! chain per service and per endpoint, endpoint choice by an anonymous `numgen random mod N
//! vmap { … }` map per service, per-endpoint affinity sets — as `nft -f` text. Loading it shows
//! what the kernel charges for that shape (one anonymous set per service: quadratic).

use std::fmt::Write as _;

use kproxy_nftables::naming;
use kproxy_plan::{ExternalPolicy, Plan};

const T: &str = "ip kube-proxy";

/// The whole ruleset as one `nft -f` script.
pub fn ruleset(plan: &Plan) -> String {
    let mut s = String::with_capacity(1 << 20);
    // Writing to a String cannot fail.
    let _ = write_ruleset(&mut s, plan);
    s
}

fn write_ruleset(s: &mut String, plan: &Plan) -> std::fmt::Result {
    writeln!(s, "add table {T} {{ comment \"rules for kube-proxy\"; }}")?;
    for (name, hook) in [
        ("filter-prerouting-pre-dnat", "type filter hook prerouting priority -110"),
        ("filter-output-pre-dnat", "type filter hook output priority -110"),
        ("nat-prerouting", "type nat hook prerouting priority -100"),
        ("nat-output", "type nat hook output priority -100"),
        ("filter-forward", "type filter hook forward priority 0"),
        ("filter-input", "type filter hook input priority 0"),
        ("filter-output", "type filter hook output priority 0"),
        ("nat-postrouting", "type nat hook postrouting priority 100"),
    ] {
        writeln!(s, "add chain {T} {name} {{ {hook}; }}")?;
    }
    for c in [
        "cluster-ips-check",
        "firewall-check",
        "mark-for-masquerade",
        "masquerading",
        "nodeport-endpoints-check",
        "reject-chain",
        "services",
        "service-endpoints-check",
    ] {
        writeln!(s, "add chain {T} {c}")?;
    }
    let key = "ipv4_addr . inet_proto . inet_service";
    writeln!(s, "add set {T} cluster-ips {{ type ipv4_addr; comment \"Active ClusterIPs\"; }}")?;
    writeln!(s, "add set {T} nodeport-ips {{ type ipv4_addr; }}")?;
    for m in ["service-ips", "no-endpoint-services", "firewall-ips"] {
        writeln!(s, "add map {T} {m} {{ type {key} : verdict; }}")?;
    }
    for m in ["service-nodeports", "no-endpoint-nodeports"] {
        writeln!(s, "add map {T} {m} {{ type inet_proto . inet_service : verdict; }}")?;
    }
    let base = [
        ("cluster-ips-check", "ip daddr @cluster-ips reject"),
        ("filter-prerouting-pre-dnat", "ct state new jump firewall-check"),
        ("filter-output-pre-dnat", "ct state new jump firewall-check"),
        ("filter-forward", "ct state new jump service-endpoints-check"),
        ("filter-forward", "ct state new jump cluster-ips-check"),
        ("filter-input", "ct state new jump nodeport-endpoints-check"),
        ("filter-input", "ct state new jump service-endpoints-check"),
        ("filter-output", "ct state new jump service-endpoints-check"),
        ("filter-output", "ct state new jump cluster-ips-check"),
        ("firewall-check", "ip daddr . meta l4proto . th dport vmap @firewall-ips"),
        ("mark-for-masquerade", "mark set mark or 0x4000"),
        ("masquerading", "mark and 0x4000 == 0 return"),
        ("masquerading", "mark set mark xor 0x4000"),
        ("masquerading", "masquerade fully-random"),
        ("nat-output", "jump services"),
        ("nat-prerouting", "jump services"),
        ("nat-postrouting", "jump masquerading"),
        ("nodeport-endpoints-check", "ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports"),
        ("reject-chain", "reject"),
        ("services", "ip daddr . meta l4proto . th dport vmap @service-ips"),
        ("services", "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports"),
        ("service-endpoints-check", "ip daddr . meta l4proto . th dport vmap @no-endpoint-services"),
    ];
    for (chain, rule) in base {
        writeln!(s, "add rule {T} {chain} {rule}")?;
    }
    writeln!(s, "add element {T} nodeport-ips {{ 203.0.113.2 }}")?;
    for fam in plan.families.values() {
        for p in fam.services.values() {
            let svc = naming::chain("service", &p.name);
            let base = naming::base(&p.name);
            let proto = p.protocol.as_str();
            let mut targets = Vec::new();
            for ep in &p.cluster_endpoints {
                let suffix = format!("{base}__{}/{}", ep.ip, ep.port);
                let chain = format!("endpoint-{}-{suffix}", naming::hash8(&suffix));
                writeln!(s, "add chain {T} {chain}")?;
                writeln!(s, "add rule {T} {chain} ip saddr {} jump mark-for-masquerade", ep.ip)?;
                if let Some(timeout) = p.affinity_timeout {
                    let set = format!("affinity-{}-{suffix}", naming::hash8(&suffix));
                    writeln!(s, "add set {T} {set} {{ type ipv4_addr; flags dynamic,timeout; timeout {timeout}s; }}")?;
                    writeln!(s, "add rule {T} {chain} update @{set} {{ ip saddr }}")?;
                    targets.push((chain.clone(), Some(set)));
                } else {
                    targets.push((chain.clone(), None));
                }
                writeln!(s, "add rule {T} {chain} meta l4proto {proto} dnat to {}:{}", ep.ip, ep.port)?;
            }
            writeln!(s, "add chain {T} {svc}")?;
            writeln!(
                s,
                "add rule {T} {svc} ip daddr {} ip saddr != 198.18.0.0/16 jump mark-for-masquerade",
                p.cluster_ip
            )?;
            for (chain, set) in &targets {
                if let Some(set) = set {
                    writeln!(s, "add rule {T} {svc} ip saddr @{set} goto {chain}")?;
                }
            }
            if !targets.is_empty() {
                let arms: Vec<String> =
                    targets.iter().enumerate().map(|(i, (c, _))| format!("{i} : goto {c}")).collect();
                writeln!(s, "add rule {T} {svc} numgen random mod {} vmap {{ {} }}", targets.len(), arms.join(", "))?;
            }
            writeln!(s, "add element {T} cluster-ips {{ {} }}", p.cluster_ip)?;
            writeln!(s, "add element {T} service-ips {{ {} . {proto} . {} : goto {svc} }}", p.cluster_ip, p.port)?;
            if let Some(ext) = &p.external {
                let chain = naming::chain("external", &p.name);
                writeln!(s, "add chain {T} {chain}")?;
                if matches!(ext.policy, ExternalPolicy::Local { .. }) {
                    writeln!(s, "add rule {T} {chain} ip saddr 198.18.0.0/16 goto {svc}")?;
                    writeln!(s, "add rule {T} {chain} fib saddr type local jump mark-for-masquerade")?;
                    writeln!(s, "add rule {T} {chain} fib saddr type local goto {svc}")?;
                } else {
                    writeln!(s, "add rule {T} {chain} jump mark-for-masquerade")?;
                }
                writeln!(s, "add rule {T} {chain} goto {svc}")?;
                if let Some(np) = p.node_port {
                    writeln!(s, "add element {T} service-nodeports {{ {proto} . {np} : goto {chain} }}")?;
                }
                for lb in &p.load_balancer_ips {
                    writeln!(s, "add element {T} service-ips {{ {lb} . {proto} . {} : goto {chain} }}", p.port)?;
                }
            }
        }
    }
    Ok(())
}

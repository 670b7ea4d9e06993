//! Rendering the plan into iptables rules, in upstream kube-proxy's chain layout.
//!
//! Every rule is a full `iptables-restore` line (`-A CHAIN ...`). A service port renders to
//! [`ServiceRules`]: the nat chains it owns (`KUBE-SVC/SVL/EXT/FW/SEP-*`) and the lines it adds
//! to the shared dispatch chains (nat `KUBE-SERVICES`/`KUBE-NODEPORTS`, filter `KUBE-SERVICES`,
//! `KUBE-EXTERNAL-SERVICES`, `KUBE-NODEPORTS`, `KUBE-PROXY-FIREWALL`). The dispatch chains are
//! rebuilt from those lines on every sync (as upstream does), the owned chains only when their
//! content changed. Policy is never decided here: the plan says what to do, this says it in
//! iptables.

use std::collections::BTreeMap;
use std::net::IpAddr;

use kproxy_plan::{
    Endpoint, ExternalPolicy, LocalTraffic, MasqueradeWhen, NoEndpointsVerdict, NoMasqueradeSource, NodePlan,
    NodePortAddresses, ServicePortPlan, SnatSource,
};
use kproxy_state::IpFamily;

use crate::naming;
use crate::nfacct::{self, NfacctCounters};

/// nat: entry from PREROUTING and OUTPUT; filter: no-endpoint rejects for ClusterIPs.
pub const KUBE_SERVICES: &str = "KUBE-SERVICES";
/// nat: NodePort dispatch; filter: health check node ports.
pub const KUBE_NODEPORTS: &str = "KUBE-NODEPORTS";
/// filter: no-endpoint verdicts for external destinations.
pub const KUBE_EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
/// filter: forwarding of marked and established traffic, INVALID drop.
pub const KUBE_FORWARD: &str = "KUBE-FORWARD";
/// filter: loadBalancerSourceRanges drops.
pub const KUBE_PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
/// filter: the CVE-2020-8558 mitigation for localhost NodePorts (kubelet keeps a copy).
pub const KUBE_FIREWALL: &str = "KUBE-FIREWALL";
/// nat: marks packets for masquerading.
pub const KUBE_MARK_MASQ: &str = "KUBE-MARK-MASQ";
/// nat: masquerades marked packets.
pub const KUBE_POSTROUTING: &str = "KUBE-POSTROUTING";
/// nat: masquerades ClusterIP traffic from outside several pod CIDRs (one `! -s` can't say it).
pub const KUBE_MARK_MASQ_NOT_LOCAL: &str = "KUBE-MARK-MASQ-NOT-LOCAL";
/// mangle, nat, filter: the canary whose disappearance means someone flushed the tables.
pub const CANARY: &str = "KUBE-PROXY-CANARY";
/// The one rule of each canary chain (a flush of the table removes it).
pub const CANARY_RULE: &str = "-A KUBE-PROXY-CANARY -m comment --comment \"kproxy canary\" -j RETURN";

/// An iptables table kproxy writes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    /// `filter`
    Filter,
    /// `nat`
    Nat,
    /// `mangle` (canary only)
    Mangle,
}

impl Table {
    /// The table's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Table::Filter => "filter",
            Table::Nat => "nat",
            Table::Mangle => "mangle",
        }
    }

    /// The table of this name (`filter`, `nat`, `mangle`).
    pub fn named(name: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// Every table, in the order they are restored.
    pub const ALL: [Table; 3] = [Table::Filter, Table::Nat, Table::Mangle];
}

/// Rendering settings (from the dataplane's configuration) for one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ctx {
    /// The family.
    pub family: IpFamily,
    /// `1 << masqueradeBit`.
    pub masquerade_mark: u32,
    /// Marks hairpin traffic: it tells the endpoint rules which endpoint a hairpin packet drew,
    /// and keeps it masqueraded despite `noMasqueradeCIDRs`. Cleared in `KUBE-POSTROUTING`.
    pub hairpin_mark: u32,
    /// `iptables.localhostNodePorts` (IPv4 only, as upstream).
    pub localhost_nodeports: bool,
    /// Drop INVALID conntrack state in forwarding (off with `conntrack.tcpBeLiberal`).
    pub drop_invalid: bool,
    /// The nfacct counters that exist, which the rules count packets in.
    pub nfacct: NfacctCounters,
}

impl Ctx {
    fn v6(&self) -> bool {
        self.family == IpFamily::V6
    }

    fn loopback(&self) -> &'static str {
        if self.v6() { "::1/128" } else { "127.0.0.0/8" }
    }

    /// Whether NodePorts answer on localhost: IPv4, enabled, and localhost among the addresses.
    pub fn localhost_nodeports_active(&self, node: &NodePlan) -> bool {
        !self.v6()
            && self.localhost_nodeports
            && match &node.nodeport_addresses {
                NodePortAddresses::AllLocal(_) => true,
                NodePortAddresses::Only(ips) => ips.iter().any(IpAddr::is_loopback),
            }
    }
}

/// The lines one service port adds to the shared dispatch chains.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dispatch {
    /// nat `KUBE-SERVICES`.
    pub nat_services: Vec<String>,
    /// nat `KUBE-NODEPORTS`.
    pub nat_nodeports: Vec<String>,
    /// filter `KUBE-SERVICES`.
    pub filter_services: Vec<String>,
    /// filter `KUBE-EXTERNAL-SERVICES`.
    pub filter_external: Vec<String>,
    /// filter `KUBE-NODEPORTS`.
    pub filter_nodeports: Vec<String>,
    /// filter `KUBE-PROXY-FIREWALL`.
    pub filter_firewall: Vec<String>,
}

/// Everything one service port puts in the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceRules {
    /// The nat chains it owns, with their rules.
    pub chains: BTreeMap<String, Vec<String>>,
    /// Its lines in the dispatch chains.
    pub dispatch: Dispatch,
}

/// Quotes a comment for iptables-restore.
fn comment(text: &str) -> String {
    format!("-m comment --comment \"{}\"", text.replace('"', ""))
}

fn proto_match(p: &ServicePortPlan) -> String {
    let proto = p.protocol.as_str();
    format!("-m {proto} -p {proto}")
}

fn verdict(v: NoEndpointsVerdict) -> &'static str {
    match v {
        NoEndpointsVerdict::Reject => "REJECT",
        NoEndpointsVerdict::Drop => "DROP",
    }
}

fn verdict_comment(name: &str, v: NoEndpointsVerdict) -> String {
    match v {
        NoEndpointsVerdict::Reject => format!("{name} has no endpoints"),
        NoEndpointsVerdict::Drop => format!("{name} has no local endpoints"),
    }
}

/// Matches for "comes from a local pod": one alternative per line (several pod CIDRs need
/// several rules). Empty when pod traffic can't be told apart.
fn if_local(local: &LocalTraffic) -> Vec<String> {
    match local {
        LocalTraffic::Undetectable => Vec::new(),
        LocalTraffic::SourceCidrs(nets) => nets.iter().map(|n| format!("-s {n}")).collect(),
        LocalTraffic::Interface(name) => vec![format!("-i {name}")],
        LocalTraffic::InterfacePrefix(prefix) => vec![format!("-i {prefix}+")],
    }
}

/// The rule suffix that masquerades traffic not from a local pod, when detectable.
fn masq_if_not_local(local: &LocalTraffic) -> Option<String> {
    match local {
        LocalTraffic::Undetectable => None,
        LocalTraffic::SourceCidrs(nets) if nets.is_empty() => None,
        LocalTraffic::SourceCidrs(nets) if nets.len() == 1 => Some(format!("! -s {} -j {KUBE_MARK_MASQ}", nets[0])),
        LocalTraffic::SourceCidrs(_) => Some(format!("-j {KUBE_MARK_MASQ_NOT_LOCAL}")),
        LocalTraffic::Interface(name) => Some(format!("! -i {name} -j {KUBE_MARK_MASQ}")),
        LocalTraffic::InterfacePrefix(prefix) => Some(format!("! -i {prefix}+ -j {KUBE_MARK_MASQ}")),
    }
}

/// Renders one service port.
pub fn render_service(ctx: &Ctx, node: &NodePlan, p: &ServicePortPlan) -> ServiceRules {
    let name = naming::port_name(&p.name);
    let pm = proto_match(p);
    let svc = naming::svc_chain(&p.name);
    let svl = naming::svl_chain(&p.name);
    let ext = naming::ext_chain(&p.name);
    let fw = naming::fw_chain(&p.name);
    let mut out = ServiceRules::default();
    let d = &mut out.dispatch;
    let cluster_dest = format!("{pm} -d {} --dport {}", p.cluster_ip, p.port);

    // ClusterIP masquerading, first in the chain ClusterIP traffic enters (guarded by the
    // destination: external traffic reaches the same chains).
    let masq = match p.internal.masquerade {
        MasqueradeWhen::Always => {
            Some(format!("{} {cluster_dest} -j {KUBE_MARK_MASQ}", comment(&format!("{name} cluster IP"))))
        }
        MasqueradeWhen::SourceNotLocal => masq_if_not_local(&node.local_traffic)
            .map(|m| format!("{} {cluster_dest} {m}", comment(&format!("{name} cluster IP")))),
        MasqueradeWhen::Never => None,
    };
    let internal_chain = if p.internal.local { &svl } else { &svc };
    if p.uses_cluster_endpoints() {
        let mut rules: Vec<String> =
            masq.iter().filter(|_| !p.internal.local).map(|m| format!("-A {svc} {m}")).collect();
        rules.extend(dispatch_rules(ctx, p, &svc, &name, &p.cluster_endpoints));
        out.chains.insert(svc.clone(), rules);
    }
    if p.uses_local_endpoints() {
        let mut rules: Vec<String> =
            masq.iter().filter(|_| p.internal.local).map(|m| format!("-A {svl} {m}")).collect();
        rules.extend(dispatch_rules(ctx, p, &svl, &name, &p.local_endpoints));
        out.chains.insert(svl.clone(), rules);
    }
    match p.internal.no_endpoints {
        None => d.nat_services.push(format!(
            "-A {KUBE_SERVICES} {} {cluster_dest} -j {internal_chain}",
            comment(&format!("{name} cluster IP"))
        )),
        Some(v) => d.filter_services.push(format!(
            "-A {KUBE_SERVICES} {} {cluster_dest} -j {}",
            comment(&verdict_comment(&name, v)),
            verdict(v)
        )),
    }

    if let Some(x) = &p.external {
        let has_endpoints = x.no_endpoints != Some(NoEndpointsVerdict::Reject);
        let uses_fw = has_endpoints && !p.source_ranges.is_empty() && !p.load_balancer_ips.is_empty();
        if has_endpoints {
            let mut rules = Vec::new();
            match x.policy {
                ExternalPolicy::Cluster => rules.push(format!(
                    "-A {ext} {} -j {KUBE_MARK_MASQ}",
                    comment(&format!("masquerade traffic for {name} external destinations"))
                )),
                ExternalPolicy::Local { short_circuit_pods } => {
                    if short_circuit_pods {
                        for m in if_local(&node.local_traffic) {
                            rules.push(format!(
                                "-A {ext} {} {m} -j {svc}",
                                comment(&format!("pod traffic for {name} external destinations"))
                            ));
                        }
                    }
                    rules.push(format!(
                        "-A {ext} {} -m addrtype --src-type LOCAL -j {KUBE_MARK_MASQ}",
                        comment(&format!("masquerade LOCAL traffic for {name} external destinations"))
                    ));
                    rules.push(format!(
                        "-A {ext} {} -m addrtype --src-type LOCAL -j {svc}",
                        comment(&format!("route LOCAL traffic for {name} external destinations"))
                    ));
                }
            }
            if x.no_endpoints.is_none() {
                let policy_chain = match x.policy {
                    ExternalPolicy::Cluster => &svc,
                    ExternalPolicy::Local { .. } => &svl,
                };
                rules.push(format!("-A {ext} -j {policy_chain}"));
            }
            out.chains.insert(ext.clone(), rules);
        }
        let dest = |ip: &IpAddr| format!("{pm} -d {ip} --dport {}", p.port);
        for ip in &p.external_ips {
            if has_endpoints {
                d.nat_services.push(format!(
                    "-A {KUBE_SERVICES} {} {} -j {ext}",
                    comment(&format!("{name} external IP")),
                    dest(ip)
                ));
            }
        }
        for ip in &p.load_balancer_ips {
            if has_endpoints {
                let target = if uses_fw { &fw } else { &ext };
                d.nat_services.push(format!(
                    "-A {KUBE_SERVICES} {} {} -j {target}",
                    comment(&format!("{name} loadbalancer IP")),
                    dest(ip)
                ));
            }
            if uses_fw {
                d.filter_firewall.push(format!(
                    "-A {KUBE_PROXY_FIREWALL} {} {} -j DROP",
                    comment(&format!("{name} traffic not accepted by {fw}")),
                    dest(ip)
                ));
            }
        }
        if let Some(v) = x.no_endpoints {
            for ip in p.external_vips() {
                d.filter_external.push(format!(
                    "-A {KUBE_EXTERNAL_SERVICES} {} {} -j {}",
                    comment(&verdict_comment(&name, v)),
                    dest(ip),
                    verdict(v)
                ));
            }
        }
        if let Some(np) = p.node_port {
            if has_endpoints {
                if ctx.nfacct.localhost_nodeports_accepted && ctx.localhost_nodeports_active(node) {
                    // Counts the connections to localhost NodePorts, then takes them where the
                    // next rule would (upstream's rule; a stable sort keeps it first).
                    d.nat_nodeports.push(format!(
                        "-A {KUBE_NODEPORTS} {} {pm} -d 127.0.0.0/8 --dport {np} -m nfacct --nfacct-name {} -j {ext}",
                        comment(&name),
                        nfacct::LOCALHOST_NODEPORTS_ACCEPTED
                    ));
                }
                d.nat_nodeports.push(format!("-A {KUBE_NODEPORTS} {} {pm} --dport {np} -j {ext}", comment(&name)));
            }
            if let Some(v) = x.no_endpoints {
                for m in nodeport_destinations(ctx, node) {
                    d.filter_external.push(format!(
                        "-A {KUBE_EXTERNAL_SERVICES} {} {m} {pm} --dport {np} -j {}",
                        comment(&verdict_comment(&name, v)),
                        verdict(v)
                    ));
                }
            }
        }
        if uses_fw {
            let c = comment(&format!("{name} loadbalancer IP"));
            let mut rules: Vec<String> =
                p.source_ranges.iter().map(|r| format!("-A {fw} {c} -s {r} -j {ext}")).collect();
            // A node reaching its own LB IP may carry the LB IP as source.
            if node.node_ip.is_some_and(|n| p.source_ranges.iter().any(|r| r.contains(&n))) {
                rules.extend(p.load_balancer_ips.iter().map(|lb| format!("-A {fw} {c} -s {lb} -j {ext}")));
            }
            rules.push(format!(
                "-A {fw} {}",
                comment(&format!("other traffic to {name} will be dropped by {KUBE_PROXY_FIREWALL}"))
            ));
            out.chains.insert(fw, rules);
        }
    }
    if let Some(hc) = p.health_check_node_port {
        d.filter_nodeports.push(format!(
            "-A {KUBE_NODEPORTS} {} -m tcp -p tcp --dport {hc} -j ACCEPT",
            comment(&format!("{name} health check node port"))
        ));
    }

    if p.affinity_timeout.is_some() {
        // `-m recent` remembers the endpoint by name: affinity keeps upstream's endpoint chains.
        let hairpin_target = if node.no_masquerade_sources().is_empty() {
            format!("-j {KUBE_MARK_MASQ}")
        } else {
            format!("-j MARK --or-mark {:#x}", ctx.masquerade_mark | ctx.hairpin_mark)
        };
        let proto = p.protocol.as_str();
        for ep in p.reachable_endpoints() {
            let sep = naming::sep_chain(&p.name, ep);
            let c = comment(&name);
            let rules = vec![
                format!("-A {sep} {c} -s {} {hairpin_target}", ep.ip),
                format!(
                    "-A {sep} {c} -m recent --name {sep} --set -m {proto} -p {proto} -j DNAT --to-destination {}",
                    naming::endpoint_string(ep)
                ),
            ];
            out.chains.insert(sep, rules);
        }
    }
    out
}

/// Picks among `endpoints` in `chain`: affinity hits first (to upstream's endpoint chains),
/// then a uniform random cascade (`statistic --probability 1/(n-i)`).
fn dispatch_rules(ctx: &Ctx, p: &ServicePortPlan, chain: &str, name: &str, endpoints: &[Endpoint]) -> Vec<String> {
    if p.affinity_timeout.is_some() {
        return affinity_rules(p, chain, name, endpoints);
    }
    // Without affinity, each endpoint is rules in `chain` rather than a chain of its own (a
    // chain per endpoint is what makes restores slow at scale). A packet from endpoint i itself
    // (hairpin) and any other packet take separate rules with the same probability; only one
    // of the two can match a given source, so the choice stays uniform. The hairpin rule marks
    // the packet for masquerading plus the hairpin bit, and the DNAT that follows it matches
    // that bit: it was set by this endpoint's draw, as the bit is kproxy's own and KUBE-POSTROUTING
    // clears it.
    let h = ctx.hairpin_mark;
    let mark = ctx.masquerade_mark | h;
    // `-p` alone (DNAT to a port needs it): a bare `-m tcp` would add a match the kernel
    // revalidates on every commit, for nothing.
    let proto = p.protocol.as_str();
    let n = endpoints.len();
    let mut rules = Vec::with_capacity(3 * n);
    for (i, ep) in endpoints.iter().enumerate() {
        let c = comment(&format!("{name} -> {}", naming::endpoint_string(ep)));
        let dnat = format!("-p {proto} -j DNAT --to-destination {}", naming::endpoint_string(ep));
        if i + 1 < n {
            let statistic = format!("-m statistic --mode random --probability {:.10}", 1.0 / (n - i) as f64);
            rules.push(format!("-A {chain} {c} -s {} {statistic} -j MARK --or-mark {mark:#x}", ep.ip));
            rules.push(format!("-A {chain} {c} -s {} -m mark --mark {h:#x}/{h:#x} {dnat}", ep.ip));
            rules.push(format!("-A {chain} {c} ! -s {} {statistic} {dnat}", ep.ip));
        } else {
            rules.push(format!("-A {chain} {c} -s {} -j MARK --or-mark {mark:#x}", ep.ip));
            rules.push(format!("-A {chain} {c} {dnat}"));
        }
    }
    rules
}

/// Upstream's affinity dispatch: recent hits first, then a random cascade, to endpoint chains.
fn affinity_rules(p: &ServicePortPlan, chain: &str, name: &str, endpoints: &[Endpoint]) -> Vec<String> {
    let mut rules = Vec::new();
    let target = |ep: &Endpoint| naming::sep_chain(&p.name, ep);
    let c = |ep: &Endpoint| comment(&format!("{name} -> {}", naming::endpoint_string(ep)));
    if let Some(timeout) = p.affinity_timeout {
        for ep in endpoints {
            let sep = target(ep);
            rules.push(format!(
                "-A {chain} {} -m recent --name {sep} --rcheck --seconds {timeout} --reap -j {sep}",
                c(ep)
            ));
        }
    }
    let n = endpoints.len();
    for (i, ep) in endpoints.iter().enumerate() {
        let statistic = if i + 1 < n {
            format!(" -m statistic --mode random --probability {:.10}", 1.0 / (n - i) as f64)
        } else {
            String::new()
        };
        rules.push(format!("-A {chain} {}{statistic} -j {}", c(ep), target(ep)));
    }
    rules
}

/// The destination matches NodePorts answer on (one rule each).
fn nodeport_destinations(ctx: &Ctx, node: &NodePlan) -> Vec<String> {
    match &node.nodeport_addresses {
        NodePortAddresses::AllLocal(_) => {
            if ctx.localhost_nodeports_active(node) {
                vec!["-m addrtype --dst-type LOCAL".to_owned()]
            } else {
                vec![format!("-m addrtype --dst-type LOCAL ! -d {}", ctx.loopback())]
            }
        }
        NodePortAddresses::Only(ips) => ips
            .iter()
            .filter(|ip| !ip.is_loopback() || ctx.localhost_nodeports_active(node))
            .map(|ip| format!("-d {ip}"))
            .collect(),
    }
}

/// One table's part of a restore: chains to declare (created, or flushed if present), rules,
/// and chains to delete (declared too, so they are empty when deleted).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TableInput {
    /// Chains to declare.
    pub chains: Vec<String>,
    /// Rules, in order.
    pub rules: Vec<String>,
    /// Chains to delete.
    pub delete: Vec<String>,
    /// Rules to delete (`-D ...` lines), used by cleanup.
    pub delete_rules: Vec<String>,
}

impl TableInput {
    /// Appends a chain with its rules.
    pub fn chain(&mut self, name: &str, rules: impl IntoIterator<Item = String>) {
        self.chains.push(name.to_owned());
        self.rules.extend(rules);
    }

    /// Each declared chain with its rules, in declaration order.
    pub fn chain_rules(&self) -> Vec<(&str, Vec<&str>)> {
        let mut at: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        let mut out: Vec<(&str, Vec<&str>)> = Vec::new();
        for c in &self.chains {
            at.entry(c).or_insert_with(|| {
                out.push((c, Vec::new()));
                out.len() - 1
            });
        }
        for rule in &self.rules {
            if let Some(&i) = crate::layout::appended_chain(rule).and_then(|c| at.get(c)) {
                out[i].1.push(rule);
            }
        }
        out
    }

    /// True when the table section would change nothing.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.rules.is_empty() && self.delete.is_empty() && self.delete_rules.is_empty()
    }
}

/// The node-wide chains that are not dispatch chains: forwarding, masquerading, the localhost
/// NodePort mitigation and the canaries. Written on full syncs only.
pub fn fixed(ctx: &Ctx, node: &NodePlan) -> BTreeMap<Table, TableInput> {
    let m = ctx.masquerade_mark;
    let mut tables: BTreeMap<Table, TableInput> = BTreeMap::new();

    let filter = tables.entry(Table::Filter).or_default();
    let mut forward = Vec::new();
    if ctx.drop_invalid {
        let count = if ctx.nfacct.ct_state_invalid_dropped {
            format!(" -m nfacct --nfacct-name {}", nfacct::CT_STATE_INVALID_DROPPED)
        } else {
            String::new()
        };
        forward.push(format!("-A {KUBE_FORWARD} -m conntrack --ctstate INVALID{count} -j DROP"));
    }
    forward.push(format!(
        "-A {KUBE_FORWARD} {} -m mark --mark {m:#x}/{m:#x} -j ACCEPT",
        comment("kubernetes forwarding rules")
    ));
    forward.push(format!(
        "-A {KUBE_FORWARD} {} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        comment("kubernetes forwarding conntrack rule")
    ));
    filter.chain(KUBE_FORWARD, forward);
    if ctx.localhost_nodeports_active(node) {
        filter.chain(
            KUBE_FIREWALL,
            [format!(
                "-A {KUBE_FIREWALL} {} -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP",
                comment("block incoming localnet connections")
            )],
        );
    }
    filter.chain(CANARY, [CANARY_RULE.to_owned()]);

    let nat = tables.entry(Table::Nat).or_default();
    let mut post = vec![
        format!("-A {KUBE_POSTROUTING} -m mark ! --mark {m:#x}/{m:#x} -j RETURN"),
        format!("-A {KUBE_POSTROUTING} -j MARK --xor-mark {m:#x}"),
    ];
    let sources = node.no_masquerade_sources();
    if !sources.is_empty() {
        // KEP-6246 (the plan's SnatPolicy contract): marked traffic from the node or its local
        // pods to a no-masquerade destination is routed natively. Hairpin carries its own mark
        // bit (set in the endpoint chains) and is masqueraded whatever the destination.
        let h = ctx.hairpin_mark;
        let from: Vec<String> = sources
            .iter()
            .flat_map(|s| match s {
                NoMasqueradeSource::Node => vec![format!("-m addrtype --src-type LOCAL ! -s {}", ctx.loopback())],
                NoMasqueradeSource::LocalPods => if_local(&node.local_traffic),
            })
            .collect();
        for f in &from {
            for cidr in &node.snat.no_masquerade_cidrs {
                post.push(format!(
                    "-A {KUBE_POSTROUTING} {} -m mark ! --mark {h:#x}/{h:#x} {f} -d {cidr} -j RETURN",
                    comment("no masquerade to noMasqueradeCIDRs")
                ));
            }
        }
    }
    // The hairpin bit (set with the masquerade mark by the endpoint rules) is kproxy's own:
    // cleared here like the masquerade mark.
    post.push(format!("-A {KUBE_POSTROUTING} -j MARK --and-mark {:#x}", !ctx.hairpin_mark));
    let snat = match node.snat.source {
        SnatSource::Masquerade => "-j MASQUERADE --random-fully".to_owned(),
        SnatSource::NodeIp(ip) => format!("-j SNAT --to-source {ip} --random-fully"),
    };
    post.push(format!("-A {KUBE_POSTROUTING} {} {snat}", comment("kubernetes service traffic requiring SNAT")));
    nat.chain(KUBE_POSTROUTING, post);
    nat.chain(KUBE_MARK_MASQ, [format!("-A {KUBE_MARK_MASQ} -j MARK --or-mark {m:#x}")]);
    if let LocalTraffic::SourceCidrs(nets) = &node.local_traffic
        && nets.len() > 1
    {
        let mut rules: Vec<String> =
            nets.iter().map(|n| format!("-A {KUBE_MARK_MASQ_NOT_LOCAL} -s {n} -j RETURN")).collect();
        rules.push(format!("-A {KUBE_MARK_MASQ_NOT_LOCAL} -j {KUBE_MARK_MASQ}"));
        nat.chain(KUBE_MARK_MASQ_NOT_LOCAL, rules);
    }
    nat.chain(CANARY, [CANARY_RULE.to_owned()]);

    tables.entry(Table::Mangle).or_default().chain(CANARY, [CANARY_RULE.to_owned()]);
    tables
}

/// The dispatch chains, rebuilt from every service's lines (in service order).
pub fn dispatch<'a>(
    ctx: &Ctx,
    node: &NodePlan,
    services: impl Iterator<Item = (&'a Dispatch, IpAddr)> + Clone,
) -> BTreeMap<Table, TableInput> {
    let mut tables: BTreeMap<Table, TableInput> = BTreeMap::new();
    let all = |f: fn(&Dispatch) -> &Vec<String>| services.clone().flat_map(move |(d, _)| f(d).iter().cloned());

    let nat = tables.entry(Table::Nat).or_default();
    let mut svc: Vec<String> = all(|d| &d.nat_services).collect();
    by_target_descending(&mut svc);
    if ctx.localhost_nodeports_active(node) {
        // route_localnet lets packets to 127.0.0.0/8 in from the wire; only the node itself
        // may use localhost NodePorts (its own connections to 127.0.0.1 come from 127.0.0.1).
        svc.push(format!(
            "-A {KUBE_SERVICES} {} -d 127.0.0.0/8 ! -s 127.0.0.0/8 -j RETURN",
            comment("localhost NodePorts are for the node itself")
        ));
    }
    let tail = comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain");
    for m in nodeport_destinations(ctx, node) {
        svc.push(format!("-A {KUBE_SERVICES} {tail} {m} -j {KUBE_NODEPORTS}"));
    }
    nat.chain(KUBE_SERVICES, svc);
    let mut nodeports: Vec<String> = all(|d| &d.nat_nodeports).collect();
    by_target_descending(&mut nodeports);
    nat.chain(KUBE_NODEPORTS, nodeports);

    let filter = tables.entry(Table::Filter).or_default();
    let mut fsvc: Vec<String> = all(|d| &d.filter_services).collect();
    // Unknown ports of a ClusterIP are refused, unallocated service addresses dropped (the
    // plan's semantics, shared with the nftables dataplane).
    let mut ips: Vec<IpAddr> = services.clone().map(|(_, ip)| ip).collect();
    ips.sort();
    ips.dedup();
    fsvc.extend(ips.iter().map(|ip| {
        format!("-A {KUBE_SERVICES} {} -d {ip} -j REJECT", comment("cluster IP without a service on this port"))
    }));
    fsvc.extend(
        node.service_cidrs
            .iter()
            .map(|c| format!("-A {KUBE_SERVICES} {} -d {c} -j DROP", comment("unallocated service address"))),
    );
    filter.chain(KUBE_SERVICES, fsvc);
    filter.chain(KUBE_EXTERNAL_SERVICES, all(|d| &d.filter_external));
    filter.chain(KUBE_NODEPORTS, all(|d| &d.filter_nodeports));
    filter.chain(KUBE_PROXY_FIREWALL, all(|d| &d.filter_firewall));
    tables
}

/// Orders a dispatch chain's per-service lines by the chain they jump to, descending: the order
/// iptables-nft looks chain names up cheaply in (see [`crate::layout`]). Their matches (a
/// destination address, protocol and port each, or a node port) never overlap, so the order
/// changes nothing for packets.
fn by_target_descending(lines: &mut [String]) {
    lines.sort_by(|a, b| target(b).cmp(target(a)));
}

fn target(rule: &str) -> &str {
    rule.rfind(" -j ").map_or("", |at| &rule[at + 4..])
}

/// A jump from a built-in chain into kproxy's, ensured with `-C` then `-I` (upstream's
/// `EnsureRule(Prepend, ...)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jump {
    /// Table.
    pub table: Table,
    /// Built-in chain.
    pub from: &'static str,
    /// Rule arguments after the chain, as argv.
    pub args: Vec<String>,
}

impl Jump {
    fn new(table: Table, from: &'static str, to: &str, text: &str, new_only: bool) -> Self {
        let mut args: Vec<String> = Vec::new();
        if new_only {
            args.extend(["-m", "conntrack", "--ctstate", "NEW"].map(str::to_owned));
        }
        if !text.is_empty() {
            args.extend(["-m".to_owned(), "comment".to_owned(), "--comment".to_owned(), text.to_owned()]);
        }
        args.extend(["-j".to_owned(), to.to_owned()]);
        Jump { table, from, args }
    }

    /// The jump target.
    pub fn target(&self) -> &str {
        self.args.last().map_or("", String::as_str)
    }

    /// The jump as a restore line (`-A <from> …`).
    pub fn line(&self) -> String {
        restore_line(self.from, &self.args)
    }
}

/// Upstream's jumps from the built-in chains, for `node`.
pub fn jumps(ctx: &Ctx, node: &NodePlan) -> Vec<Jump> {
    use Table::{Filter, Nat};
    let mut j = vec![
        Jump::new(Filter, "INPUT", KUBE_EXTERNAL_SERVICES, "kubernetes externally-visible service portals", true),
        Jump::new(Filter, "FORWARD", KUBE_EXTERNAL_SERVICES, "kubernetes externally-visible service portals", true),
        Jump::new(Filter, "INPUT", KUBE_NODEPORTS, "kubernetes health check service ports", false),
        Jump::new(Filter, "FORWARD", KUBE_SERVICES, "kubernetes service portals", true),
        Jump::new(Filter, "OUTPUT", KUBE_SERVICES, "kubernetes service portals", true),
        Jump::new(Filter, "FORWARD", KUBE_FORWARD, "kubernetes forwarding rules", false),
        Jump::new(Filter, "INPUT", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall", true),
        Jump::new(Filter, "OUTPUT", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall", true),
        Jump::new(Filter, "FORWARD", KUBE_PROXY_FIREWALL, "kubernetes load balancer firewall", true),
        Jump::new(Nat, "OUTPUT", KUBE_SERVICES, "kubernetes service portals", false),
        Jump::new(Nat, "PREROUTING", KUBE_SERVICES, "kubernetes service portals", false),
        Jump::new(Nat, "POSTROUTING", KUBE_POSTROUTING, "kubernetes postrouting rules", false),
    ];
    if ctx.localhost_nodeports_active(node) {
        j.push(Jump::new(Filter, "INPUT", KUBE_FIREWALL, "", false));
        j.push(Jump::new(Filter, "OUTPUT", KUBE_FIREWALL, "", false));
    }
    j
}

/// Names of the node-wide chains kproxy creates in `table` (whatever the node plan).
pub fn fixed_chain_names(table: Table) -> &'static [&'static str] {
    match table {
        Table::Filter => &[
            KUBE_SERVICES,
            KUBE_EXTERNAL_SERVICES,
            KUBE_NODEPORTS,
            KUBE_FORWARD,
            KUBE_PROXY_FIREWALL,
            KUBE_FIREWALL,
            CANARY,
        ],
        Table::Nat => {
            &[KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ, KUBE_MARK_MASQ_NOT_LOCAL, CANARY]
        }
        Table::Mangle => &[CANARY],
    }
}

/// The rule `args` appended to `chain`, as a restore line (`-A <chain> …`), quoting the words
/// that are empty or hold whitespace.
pub(crate) fn restore_line(chain: &str, args: &[String]) -> String {
    let mut line = format!("-A {chain}");
    for arg in args {
        if arg.is_empty() || arg.contains(char::is_whitespace) {
            line.push_str(&format!(" \"{arg}\""));
        } else {
            line.push(' ');
            line.push_str(arg);
        }
    }
    line
}

//! `kproxy plan`: the plan as a table a person can read.

use std::fmt::Write as _;

use kproxy_plan::{Endpoint, ExternalPolicy, MasqueradeWhen, NoEndpointsVerdict, Plan, ServicePortPlan, SnatSource};

/// Renders every family's node settings and service ports.
pub fn render(plan: &Plan) -> String {
    let mut out = String::new();
    for (family, fam) in &plan.families {
        let node = &fam.node;
        let _ = writeln!(out, "== {family} ==");
        let _ = writeln!(
            out,
            "node ip: {}   nodePort addresses: {}   pod traffic: {}   snat: {}{}",
            node.node_ip.map_or("unknown".into(), |ip| ip.to_string()),
            match &node.nodeport_addresses {
                kproxy_plan::NodePortAddresses::AllLocal(_) => "all local".to_string(),
                kproxy_plan::NodePortAddresses::Only(ips) => join(ips.iter()),
            },
            match &node.local_traffic {
                kproxy_plan::LocalTraffic::Undetectable => "undetectable".to_string(),
                kproxy_plan::LocalTraffic::SourceCidrs(c) => format!("from {}", join(c.iter())),
                kproxy_plan::LocalTraffic::Interface(i) => format!("via {i}"),
                kproxy_plan::LocalTraffic::InterfacePrefix(p) => format!("via {p}*"),
            },
            match &node.snat.source {
                SnatSource::Masquerade => "masquerade".to_string(),
                SnatSource::NodeIp(ip) => format!("to node IP {ip}"),
            },
            if node.snat.no_masquerade_cidrs.is_empty() {
                String::new()
            } else {
                format!(", never to {}", join(node.snat.no_masquerade_cidrs.iter()))
            },
        );
        let mut rows = vec![[
            "SERVICE PORT".to_string(),
            "CLUSTER IP".into(),
            "EXTERNAL".into(),
            "POLICY".into(),
            "ENDPOINTS".into(),
            "NOTES".into(),
        ]];
        rows.extend(fam.services.values().map(|p| row(p)));
        out.push_str(&crate::columns::render(&rows));
        out.push('\n');
    }
    out
}

fn row(p: &ServicePortPlan) -> [String; 6] {
    let mut external = Vec::new();
    if let Some(np) = p.node_port {
        external.push(format!("nodePort {np}"));
    }
    external.extend(p.external_ips.iter().map(|ip| format!("ext {ip}")));
    external.extend(p.load_balancer_ips.iter().map(|ip| format!("lb {ip}")));

    let mut policy = vec![format!("iTP {}", if p.internal.local { "Local" } else { "Cluster" })];
    if let Some(ext) = &p.external {
        policy.push(match ext.policy {
            ExternalPolicy::Cluster => "eTP Cluster".into(),
            ExternalPolicy::Local { .. } => "eTP Local".into(),
        });
    }
    policy.push(
        match p.internal.masquerade {
            MasqueradeWhen::Always => "masq all",
            MasqueradeWhen::SourceNotLocal => "masq non-pod",
            MasqueradeWhen::Never => "no masq",
        }
        .into(),
    );

    let endpoints = if p.uses_local_endpoints() && !p.uses_cluster_endpoints() {
        format!("local: {}", endpoints(&p.local_endpoints))
    } else if p.uses_local_endpoints() {
        format!("{} | local: {}", endpoints(&p.cluster_endpoints), endpoints(&p.local_endpoints))
    } else {
        endpoints(&p.cluster_endpoints)
    };

    let mut notes = Vec::new();
    if let Some(t) = p.affinity_timeout {
        notes.push(format!("affinity {t}s"));
    }
    if !p.source_ranges.is_empty() {
        notes.push(format!("from {}", join(p.source_ranges.iter())));
    }
    let verdict = |v: Option<NoEndpointsVerdict>, class: &str| match v {
        Some(NoEndpointsVerdict::Reject) => Some(format!("{class}: reject")),
        Some(NoEndpointsVerdict::Drop) => Some(format!("{class}: drop")),
        None => None,
    };
    notes.extend(verdict(p.internal.no_endpoints, "internal"));
    notes.extend(verdict(p.external.as_ref().and_then(|e| e.no_endpoints), "external"));
    if let Some(hc) = p.health_check_node_port {
        notes.push(format!("healthcheck :{hc}"));
    }
    if p.accelerate {
        notes.push("accelerated".into());
    }

    [
        p.name.to_string(),
        format!("{}", std::net::SocketAddr::new(p.cluster_ip, p.port)),
        if external.is_empty() { "-".into() } else { external.join(", ") },
        policy.join(", "),
        endpoints,
        notes.join(", "),
    ]
}

fn endpoints(list: &[Endpoint]) -> String {
    if list.is_empty() {
        return "none".into();
    }
    list.iter()
        .map(|e| {
            let addr = std::net::SocketAddr::new(e.ip, e.port).to_string();
            match (e.is_local, e.ready) {
                (true, true) => format!("{addr}*"),
                (true, false) => format!("{addr}*(terminating)"),
                (false, true) => addr,
                (false, false) => format!("{addr}(terminating)"),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn join<T: std::fmt::Display>(items: impl Iterator<Item = T>) -> String {
    let parts: Vec<String> = items.map(|i| i.to_string()).collect();
    if parts.is_empty() { "none".into() } else { parts.join(",") }
}

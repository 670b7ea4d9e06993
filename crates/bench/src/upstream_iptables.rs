//! The ClusterIP part of the same cluster in upstream kube-proxy's iptables shape, written the
//! way upstream (and kproxy before #20) feeds `iptables-restore --noflush`: a `KUBE-SVC-*` chain
//! per service and a `KUBE-SEP-*` chain per endpoint, every chain declared first, then the rules
//! in service order, one `COMMIT`. Loading it into an empty namespace shows what the tool charges
//! for that layout. NodePorts, load balancers, the filter table and the jumps from the built-in
//! chains are left out: it is a lower bound of upstream's restore.

use std::fmt::Write as _;

use kproxy_iptables::naming;
use kproxy_plan::Plan;

/// The restore input.
pub fn restore(plan: &Plan) -> String {
    let mut s = String::with_capacity(1 << 20);
    // Writing to a String cannot fail.
    let _ = write_restore(&mut s, plan);
    s
}

fn write_restore(s: &mut String, plan: &Plan) -> std::fmt::Result {
    let mut chains = vec!["KUBE-SERVICES".to_owned(), "KUBE-MARK-MASQ".to_owned()];
    let mut rules = vec!["-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000".to_owned()];
    let mut endpoint_rules = Vec::new();
    for fam in plan.families.values() {
        for p in fam.services.values() {
            let name = naming::port_name(&p.name);
            let svc = naming::svc_chain(&p.name);
            let proto = p.protocol.as_str();
            let dest = format!("-m {proto} -p {proto} -d {} --dport {}", p.cluster_ip, p.port);
            chains.push(svc.clone());
            rules.push(format!("-A KUBE-SERVICES -m comment --comment \"{name} cluster IP\" {dest} -j {svc}"));
            rules.push(format!(
                "-A {svc} -m comment --comment \"{name} cluster IP\" {dest} ! -s 198.18.0.0/16 -j KUBE-MARK-MASQ"
            ));
            let n = p.cluster_endpoints.len();
            for (i, ep) in p.cluster_endpoints.iter().enumerate() {
                let sep = naming::sep_chain(&p.name, ep);
                let to = naming::endpoint_string(ep);
                let statistic = if i + 1 < n {
                    format!(" -m statistic --mode random --probability {:.10}", 1.0 / (n - i) as f64)
                } else {
                    String::new()
                };
                chains.push(sep.clone());
                rules.push(format!("-A {svc} -m comment --comment \"{name} -> {to}\"{statistic} -j {sep}"));
                endpoint_rules.push(format!("-A {sep} -m comment --comment \"{name}\" -s {} -j KUBE-MARK-MASQ", ep.ip));
                endpoint_rules.push(format!(
                    "-A {sep} -m comment --comment \"{name}\" -m {proto} -p {proto} -j DNAT --to-destination {to}"
                ));
            }
        }
    }
    writeln!(s, "*nat")?;
    for c in &chains {
        writeln!(s, ":{c} - [0:0]")?;
    }
    for r in rules.iter().chain(&endpoint_rules) {
        writeln!(s, "{r}")?;
    }
    writeln!(s, "COMMIT")
}

//! `kproxy --cleanup`: removes every kproxy chain and every jump into one, and nothing else.
//!
//! What exists is read from `iptables-save`, so cleanup also works in a fresh process (and
//! removes kube-proxy's chains of the same names, as upstream's cleanup does). Each table is
//! one restore: the jump rules are deleted (`-D`), the chains flushed and deleted. With the nft
//! backend, a table left with nothing but empty built-in chains is removed too, so the host's
//! nftables ruleset is as it was before kproxy; any table holding another tool's rule stays.

use kproxy_state::IpFamily;

use crate::restore::{ExecError, Executor};
use crate::rules::{self, Table, TableInput};
use crate::{live, naming};

/// Whether `chain` in `table` is one kproxy creates.
pub fn is_kproxy_chain(table: Table, chain: &str) -> bool {
    rules::fixed_chain_names(table).contains(&chain) || (table == Table::Nat && naming::is_service_chain(chain))
}

/// Whether `chain` in `table` is one upstream kube-proxy creates in any of its modes: its
/// iptables mode's (the chains kproxy's iptables mode shares), and its IPVS mode's
/// (`KUBE-NODE-PORT`, `KUBE-LOAD-BALANCER`, the `KUBE-IPVS-*FILTER` chains, ...), as upstream's
/// own cleanups of both modes list them. Never the kubelet's chains (`KUBE-FIREWALL`,
/// `KUBE-KUBELET-CANARY`, `KUBE-IPTABLES-HINT`) nor `KUBE-MARK-DROP`, which upstream's cleanups
/// leave too.
pub fn is_kube_proxy_chain(table: Table, chain: &str) -> bool {
    const NAT: [&str; 8] = [
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
        "KUBE-PROXY-CANARY",
        // IPVS mode.
        "KUBE-NODE-PORT",
        "KUBE-LOAD-BALANCER",
        // Before v1.24, IPVS mode's own.
        "KUBE-FIREWALL",
    ];
    const FILTER: [&str; 10] = [
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-FORWARD",
        "KUBE-NODEPORTS",
        "KUBE-PROXY-FIREWALL",
        "KUBE-PROXY-CANARY",
        // IPVS mode.
        "KUBE-NODE-PORT",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "KUBE-IPVS-FILTER",
        "KUBE-IPVS-OUT-FILTER",
    ];
    match table {
        Table::Nat => NAT.contains(&chain) || naming::is_service_chain(chain) || chain.starts_with("KUBE-XLB-"),
        Table::Filter => FILTER.contains(&chain),
        Table::Mangle => chain == "KUBE-PROXY-CANARY",
    }
}

/// Whether `chain` in `table` is one upstream kube-proxy's IPVS mode writes: a kube-proxy in
/// IPVS mode on the same backend owns these even where kproxy's iptables mode uses the same name.
pub fn is_kube_proxy_ipvs_chain(table: Table, chain: &str) -> bool {
    const NAT: [&str; 5] =
        ["KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER", "KUBE-MARK-MASQ"];
    const FILTER: [&str; 6] = [
        "KUBE-FORWARD",
        "KUBE-NODE-PORT",
        "KUBE-PROXY-FIREWALL",
        "KUBE-SOURCE-RANGES-FIREWALL",
        "KUBE-IPVS-FILTER",
        "KUBE-IPVS-OUT-FILTER",
    ];
    match table {
        Table::Nat => NAT.contains(&chain),
        Table::Filter => FILTER.contains(&chain),
        Table::Mangle => false,
    }
}

/// The restore input that removes kproxy from one table, given its `iptables-save` output.
pub fn cleanup_input(table: Table, save: &str) -> TableInput {
    removal_input(save, |chain| is_kproxy_chain(table, chain))
}

/// The restore input that removes, from one table given its `iptables-save` output, every
/// chain `doomed` selects and every rule elsewhere that jumps (or goes) to one of them.
pub fn removal_input(save: &str, doomed: impl Fn(&str) -> bool) -> TableInput {
    let mut t = TableInput::default();
    for line in save.lines() {
        if let Some(decl) = line.strip_prefix(':') {
            if let Some(chain) = decl.split_whitespace().next().filter(|c| doomed(c)) {
                t.delete.push(chain.to_owned());
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let w = live::words(rule);
            let Some(chain) = w.first() else { continue };
            if doomed(chain.text) {
                continue;
            }
            let target =
                w.windows(2).find(|p| !p[0].quoted && (p[0].text == "-j" || p[0].text == "-g")).map(|p| p[1].text);
            if target.is_some_and(&doomed) {
                t.delete_rules.push(format!("-D {rule}"));
            }
        }
    }
    t
}

/// Whether a table's save output shows nothing but empty built-in chains with policy ACCEPT.
pub fn is_empty_table(save: &str) -> bool {
    save.lines().all(|l| {
        if let Some(decl) = l.strip_prefix(':') {
            decl.split_whitespace().nth(1) == Some("ACCEPT")
        } else {
            !l.starts_with("-A ")
        }
    })
}

/// Removes kproxy from every table of `family`.
pub fn cleanup_family(exec: &mut dyn Executor, family: IpFamily) -> Result<(), ExecError> {
    remove_chains(exec, family, &Table::ALL, is_kproxy_chain).map(|_| ())
}

/// What [`remove_chains`] removed from one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    /// The table.
    pub table: Table,
    /// The chains flushed and deleted.
    pub chains: Vec<String>,
    /// The rules of other chains that jumped into them, as `-D` lines.
    pub jumps: Vec<String>,
}

/// Removes from `tables` of `family` the chains `doomed` selects and the jumps into them (one
/// restore per table that has any), then drops a table left empty where the backend can.
/// Only `tables` are read: with the legacy backend, reading a table that does not exist yet
/// would create it.
pub fn remove_chains(
    exec: &mut dyn Executor,
    family: IpFamily,
    tables: &[Table],
    doomed: impl Fn(Table, &str) -> bool,
) -> Result<Vec<Removed>, ExecError> {
    let mut removed = Vec::new();
    for &table in tables {
        let save = exec.save(family, table)?;
        let input = removal_input(&save, |chain| doomed(table, chain));
        if !input.is_empty() {
            let (chains, jumps) = (input.delete.clone(), input.delete_rules.clone());
            let text = crate::layout::restore_text(&std::collections::BTreeMap::from([(table, input)]), None);
            exec.restore(family, &text)?;
            if is_empty_table(&exec.save(family, table)?) {
                exec.drop_empty_table(family, table)?;
            }
            removed.push(Removed { table, chains, jumps });
        }
    }
    Ok(removed)
}

/// Removes kproxy from each of `families`: those the node has (on an IPv4-only node,
/// `ip6tables-save` fails and there is nothing of kproxy's to remove).
pub fn cleanup(exec: &mut dyn Executor, families: &[IpFamily]) -> Result<(), ExecError> {
    for &family in families {
        cleanup_family(exec, family)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVE: &str = "# Generated by iptables-save\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        :KUBE-SERVICES - [0:0]\n:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]\n:OTHER - [0:0]\n\
        -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
        -A PREROUTING -m comment --comment \"mentions -j KUBE-SERVICES\" -j OTHER\n\
        -A OUTPUT -d 192.0.2.1/32 -j ACCEPT\n\
        -A KUBE-SERVICES -j KUBE-SVC-XPGD46QRK7WJZT7O\nCOMMIT\n";

    #[test]
    fn removes_kproxy_chains_and_jumps_only() {
        let t = cleanup_input(Table::Nat, SAVE);
        assert_eq!(t.delete, vec!["KUBE-SERVICES", "KUBE-SVC-XPGD46QRK7WJZT7O"]);
        assert_eq!(
            t.delete_rules,
            vec!["-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"]
        );
        let text = crate::layout::restore_text(&std::collections::BTreeMap::from([(Table::Nat, t)]), None);
        assert!(!text.contains("OTHER") && !text.contains("192.0.2.1"), "{text}");
        assert!(text.contains("-X KUBE-SVC-XPGD46QRK7WJZT7O\n"), "{text}");
    }

    /// A node without ip6tables: every IPv6 tool run fails.
    struct Ipv4Only(crate::Recording);

    impl Executor for Ipv4Only {
        fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), ExecError> {
            if family == IpFamily::V6 { Err(ExecError::Injected) } else { self.0.restore(family, input) }
        }
        fn save(&mut self, family: IpFamily, table: Table) -> Result<String, ExecError> {
            if family == IpFamily::V6 { Err(ExecError::Injected) } else { self.0.save(family, table) }
        }
        fn run(&mut self, family: IpFamily, args: &[String]) -> Result<crate::Output, ExecError> {
            if family == IpFamily::V6 { Err(ExecError::Injected) } else { self.0.run(family, args) }
        }
        fn sysctl(&mut self, key: &str, value: &str) -> Result<(), ExecError> {
            self.0.sysctl(key, value)
        }
        fn drop_empty_table(&mut self, family: IpFamily, table: Table) -> Result<(), ExecError> {
            self.0.drop_empty_table(family, table)
        }
    }

    #[test]
    fn cleanup_walks_only_the_families_given() {
        let mut recording = crate::Recording::default();
        recording.saved.insert((IpFamily::V4, Table::Nat), SAVE.to_owned());
        let mut exec = Ipv4Only(recording);
        cleanup(&mut exec, &[IpFamily::V4]).unwrap();
        assert_eq!(exec.0.restores.len(), 1);
        assert!(exec.0.last(IpFamily::V4).is_some_and(|text| text.contains("-X KUBE-SERVICES")));
        assert!(matches!(cleanup(&mut exec, &IpFamily::BOTH), Err(ExecError::Injected)), "IPv6 is walked when given");
    }

    /// kube-proxy's IPVS mode on a node: its own chains, the kubelet's, and a CNI's.
    const IPVS_FILTER: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
        :KUBE-FIREWALL - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\n:KUBE-FORWARD - [0:0]\n:KUBE-IPVS-FILTER - [0:0]\n\
        :KUBE-NODE-PORT - [0:0]\n:CNI-FORWARD - [0:0]\n\
        -A INPUT -j KUBE-FIREWALL\n\
        -A INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER\n\
        -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
        -A FORWARD -j CNI-FORWARD\n\
        -A KUBE-FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\nCOMMIT\n";

    #[test]
    fn kube_proxys_chains_of_every_mode_go_and_the_kubelets_and_others_stay() {
        let t = removal_input(IPVS_FILTER, |c| is_kube_proxy_chain(Table::Filter, c));
        assert_eq!(t.delete, vec!["KUBE-FORWARD", "KUBE-IPVS-FILTER", "KUBE-NODE-PORT"]);
        assert_eq!(
            t.delete_rules,
            vec![
                "-D INPUT -m comment --comment \"kubernetes ipvs access filter\" -j KUBE-IPVS-FILTER",
                "-D FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD",
            ]
        );
        for kubelets in ["KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT", "KUBE-MARK-DROP"] {
            assert!(!is_kube_proxy_chain(Table::Filter, kubelets) && !is_kube_proxy_chain(Table::Mangle, kubelets));
        }
        assert!(
            is_kube_proxy_chain(Table::Nat, "KUBE-SVC-XPGD46QRK7WJZT7O")
                && is_kube_proxy_chain(Table::Nat, "KUBE-LOAD-BALANCER")
        );
        assert!(is_kube_proxy_chain(Table::Mangle, "KUBE-PROXY-CANARY"));
    }

    #[test]
    fn a_jump_inside_a_quoted_comment_with_escaped_quotes_is_no_jump() {
        // Found by fuzzing (crates/fuzz/tests/iptables_save.rs): the words of a rule ended a
        // quoted string at an escaped quote, so this comment's words read as a jump to
        // KUBE-SERVICES and another tool's ACCEPT rule was deleted with kube-proxy's chains.
        let save = "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n\
            -A INPUT -m comment --comment \"not \\\" -j KUBE-SERVICES \\\" but ours\" -j ACCEPT\n\
            -A INPUT -m comment --comment \"it\\'s \\\\\" -j KUBE-SERVICES\nCOMMIT\n";
        let t = removal_input(save, |c| is_kube_proxy_chain(Table::Filter, c));
        assert_eq!(t.delete, vec!["KUBE-SERVICES"]);
        assert_eq!(t.delete_rules, vec!["-D INPUT -m comment --comment \"it\\'s \\\\\" -j KUBE-SERVICES"]);
    }

    #[test]
    fn only_untouched_tables_count_as_empty() {
        assert!(is_empty_table("*nat\n:PREROUTING ACCEPT [3:180]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"));
        assert!(!is_empty_table(SAVE));
        assert!(!is_empty_table("*filter\n:INPUT DROP [0:0]\nCOMMIT\n"));
        assert!(!is_empty_table("*filter\n:INPUT ACCEPT [0:0]\n:MINE - [0:0]\nCOMMIT\n"));
    }
}

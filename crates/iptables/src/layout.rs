//! How a restore is written for `iptables-restore --noflush`: the same chains and rules cost
//! very different amounts depending on their order and on how many `COMMIT`s they are split
//! into (measured in `docs/benchmarks.md`).
//!
//! - iptables-nft (1.8.9) keeps every chain a table section mentions — declared, appended to
//!   or jumped to — in a sorted linked list, walked from the smallest name at each mention
//!   (`cache_chain_list_insert`). Mentions in random order cost O(chains²) string compares:
//!   most of upstream's first sync. The walk stops at the first name not smaller than the one
//!   looked up, and the list is per section. So each chain is declared right before its own
//!   rules, in descending name order (the chain being written is always near the front), and
//!   chains are written in dependency levels, after the chains they jump to, one level per
//!   section (a level's jump targets are then mostly the only smaller names). Big levels are
//!   split every [`NFT_SECTION_CHAINS`] chains; small restores stay one section, one atomic
//!   transaction.
//! - Each section is a kernel transaction, and nf_tables revalidates the whole table on each
//!   commit (O(chains in the table)): sections stay few and big.
//! - iptables-legacy downloads and uploads the whole table on each `COMMIT`: one section per
//!   table, in the same order (which also lets it find every jump target already declared).
//!
//! Split restores are ordered so nothing dangles: chains exist before anything jumps to them,
//! and chains to delete are flushed, then deleted, after everything that jumped to them was
//! rewritten.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use crate::rules::{Table, TableInput};

/// Chains per section with iptables-nft: bounds a section's quadratic cache-list walks while
/// keeping the number of kernel commits (each O(table)) small.
pub const NFT_SECTION_CHAINS: usize = 10_000;

/// The chain a `-A CHAIN …` line appends to.
pub fn appended_chain(rule: &str) -> Option<&str> {
    rule.strip_prefix("-A ")?.split_whitespace().next()
}

/// The chain a rule jumps or goes to (the word after its last `-j`/`-g`), if any.
pub(crate) fn jump_target(rule: &str) -> Option<&str> {
    let at = rule.rfind(" -j ").max(rule.rfind(" -g "))?;
    rule[at + 4..].split_whitespace().next()
}

/// One chain of a table input with its rules.
struct Unit<'a> {
    name: &'a str,
    declared: bool,
    rules: Vec<&'a str>,
}

/// The chains of `input` with their rules, in dependency levels (a chain comes after the
/// chains it jumps to), descending names within a level.
fn leveled(input: &TableInput) -> Vec<(usize, Unit<'_>)> {
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut units: Vec<Unit<'_>> = Vec::new();
    for name in &input.chains {
        index.entry(name).or_insert_with(|| {
            units.push(Unit { name, declared: true, rules: Vec::new() });
            units.len() - 1
        });
    }
    for rule in &input.rules {
        let chain = appended_chain(rule).unwrap_or("");
        let i = *index.entry(chain).or_insert_with(|| {
            units.push(Unit { name: chain, declared: false, rules: Vec::new() });
            units.len() - 1
        });
        units[i].rules.push(rule);
    }
    let mut levels: Vec<Option<usize>> = vec![None; units.len()];
    for i in 0..units.len() {
        level_of(i, &units, &index, &mut levels, 0);
    }
    let mut out: Vec<(usize, Unit<'_>)> = levels.into_iter().map(|l| l.unwrap_or(0)).zip(units).collect();
    out.sort_by_key(|(level, u)| (*level, Reverse(u.name)));
    out
}

/// 0 for a chain that jumps to no chain of the input, else one more than its deepest target.
fn level_of(
    i: usize,
    units: &[Unit<'_>],
    index: &HashMap<&str, usize>,
    levels: &mut [Option<usize>],
    depth: usize,
) -> usize {
    if let Some(l) = levels[i] {
        return l;
    }
    // kproxy's chains are at most a handful deep; a cycle (never rendered) stops here.
    if depth > 16 {
        return 0;
    }
    let mut level = 0;
    for rule in &units[i].rules {
        if let Some(&t) = jump_target(rule).and_then(|t| index.get(t))
            && t != i
        {
            level = level.max(1 + level_of(t, units, index, levels, depth + 1));
        }
    }
    levels[i] = Some(level);
    level
}

fn declare(out: &mut String, chain: &str) {
    let _ = writeln!(out, ":{chain} - [0:0]");
}

fn write_chain(out: &mut String, unit: &Unit<'_>) {
    if unit.declared {
        declare(out, unit.name);
    }
    for rule in &unit.rules {
        out.push_str(rule);
        out.push('\n');
    }
}

/// Renders the restore input for `tables`; `limit`: split sections of at most that many chains
/// (iptables-nft), `None`: one section per table (iptables-legacy).
pub fn restore_text(tables: &BTreeMap<Table, TableInput>, limit: Option<usize>) -> String {
    let mut out = String::new();
    for (table, input) in tables.iter().filter(|(_, t)| !t.is_empty()) {
        let size = input.chains.len() + input.delete.len();
        match limit {
            Some(limit) if size > limit => split(&mut out, table.as_str(), input, limit),
            _ => whole(&mut out, table.as_str(), input),
        }
    }
    out
}

/// One section: every chain declared and filled in level order, then the chains to delete
/// flushed and deleted.
fn whole(out: &mut String, table: &str, input: &TableInput) {
    let _ = writeln!(out, "*{table}");
    for (_, unit) in leveled(input) {
        write_chain(out, &unit);
    }
    let mut delete: Vec<&String> = input.delete.iter().collect();
    delete.sort_by(|a, b| b.cmp(a));
    for chain in &delete {
        declare(out, chain);
    }
    for rule in &input.delete_rules {
        out.push_str(rule);
        out.push('\n');
    }
    for chain in &delete {
        let _ = writeln!(out, "-X {chain}");
    }
    out.push_str("COMMIT\n");
}

/// Several sections: one per level (split every `limit` chains), then the chains to delete
/// flushed, then deleted, `limit` at a time.
fn split(out: &mut String, table: &str, input: &TableInput, limit: usize) {
    let mut open: Option<usize> = None;
    let mut in_section = 0;
    for (level, unit) in leveled(input) {
        if open != Some(level) || in_section == limit {
            if open.is_some() {
                out.push_str("COMMIT\n");
            }
            let _ = writeln!(out, "*{table}");
            open = Some(level);
            in_section = 0;
        }
        write_chain(out, &unit);
        in_section += 1;
    }
    if open.is_some() {
        out.push_str("COMMIT\n");
    }
    let mut delete: Vec<&String> = input.delete.iter().collect();
    delete.sort_by(|a, b| b.cmp(a));
    for (i, chunk) in delete.chunks(limit).enumerate() {
        let _ = writeln!(out, "*{table}");
        for chain in chunk {
            declare(out, chain);
        }
        if i == 0 {
            for rule in &input.delete_rules {
                out.push_str(rule);
                out.push('\n');
            }
        }
        out.push_str("COMMIT\n");
    }
    for chunk in delete.chunks(limit) {
        let _ = writeln!(out, "*{table}");
        for chain in chunk {
            let _ = writeln!(out, "-X {chain}");
        }
        out.push_str("COMMIT\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> TableInput {
        let mut t = TableInput::default();
        t.chain(
            "KUBE-SERVICES",
            ["-A KUBE-SERVICES -m comment --comment \"a -j b\" -d 198.18.0.1 -j KUBE-SVC-A".into()],
        );
        t.chain("KUBE-SVC-A", ["-A KUBE-SVC-A -j KUBE-SEP-B".into(), "-A KUBE-SVC-A -j KUBE-SEP-A".into()]);
        t.chain("KUBE-SEP-A", ["-A KUBE-SEP-A -j KUBE-MARK-MASQ".into()]);
        t.chain("KUBE-SEP-B", ["-A KUBE-SEP-B -j DNAT --to-destination 198.18.1.1:80".into()]);
        t.chain("KUBE-MARK-MASQ", ["-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000".into()]);
        t.chain("KUBE-SVC-Z", ["-A KUBE-SVC-Z -j KUBE-MARK-MASQ".into()]);
        t.delete = vec!["KUBE-SEP-OLD".into(), "KUBE-SVC-OLD".into()];
        t
    }

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn chains_come_after_their_jump_targets_each_declared_before_its_rules() {
        let text = restore_text(&BTreeMap::from([(Table::Nat, input())]), None);
        assert_eq!(
            lines(&text),
            [
                "*nat",
                // level 0, descending
                ":KUBE-SEP-B - [0:0]",
                "-A KUBE-SEP-B -j DNAT --to-destination 198.18.1.1:80",
                ":KUBE-MARK-MASQ - [0:0]",
                "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
                // level 1
                ":KUBE-SVC-Z - [0:0]",
                "-A KUBE-SVC-Z -j KUBE-MARK-MASQ",
                ":KUBE-SEP-A - [0:0]",
                "-A KUBE-SEP-A -j KUBE-MARK-MASQ",
                // level 2, rules in their order
                ":KUBE-SVC-A - [0:0]",
                "-A KUBE-SVC-A -j KUBE-SEP-B",
                "-A KUBE-SVC-A -j KUBE-SEP-A",
                // level 3: a "-j" inside a comment is not the target
                ":KUBE-SERVICES - [0:0]",
                "-A KUBE-SERVICES -m comment --comment \"a -j b\" -d 198.18.0.1 -j KUBE-SVC-A",
                ":KUBE-SVC-OLD - [0:0]",
                ":KUBE-SEP-OLD - [0:0]",
                "-X KUBE-SVC-OLD",
                "-X KUBE-SEP-OLD",
                "COMMIT",
            ]
        );
    }

    #[test]
    fn split_restores_commit_per_level_and_delete_after_everything_else() {
        let text = restore_text(&BTreeMap::from([(Table::Nat, input())]), Some(2));
        let sections: Vec<Vec<&str>> = text
            .split("COMMIT\n")
            .filter(|s| !s.is_empty())
            .map(|s| s.lines().filter(|l| !l.starts_with("-A")).collect())
            .collect();
        assert_eq!(
            sections,
            [
                vec!["*nat", ":KUBE-SEP-B - [0:0]", ":KUBE-MARK-MASQ - [0:0]"],
                vec!["*nat", ":KUBE-SVC-Z - [0:0]", ":KUBE-SEP-A - [0:0]"],
                vec!["*nat", ":KUBE-SVC-A - [0:0]"],
                vec!["*nat", ":KUBE-SERVICES - [0:0]"],
                vec!["*nat", ":KUBE-SVC-OLD - [0:0]", ":KUBE-SEP-OLD - [0:0]"],
                vec!["*nat", "-X KUBE-SVC-OLD", "-X KUBE-SEP-OLD"],
            ]
        );
        // Same rules, same chains, as the single section.
        let mut split: Vec<&str> = text.lines().filter(|l| l.starts_with("-A")).collect();
        let whole = restore_text(&BTreeMap::from([(Table::Nat, input())]), None);
        let mut one: Vec<&str> = whole.lines().filter(|l| l.starts_with("-A")).collect();
        split.sort_unstable();
        one.sort_unstable();
        assert_eq!(split, one);
    }

    #[test]
    fn small_restores_stay_one_atomic_section() {
        let text = restore_text(&BTreeMap::from([(Table::Nat, input())]), Some(100));
        assert_eq!(text.matches("COMMIT").count(), 1, "{text}");
    }
}

//! An imitation of the kernel's iptables tables for tests without root ([`crate::Recording`]
//! with `kernel` set): restores are applied section by section (a section all or nothing, a
//! rule jumping to a missing chain or a `-X` of a chain still jumped to refusing it), `-C`,
//! `-I` and `-S` answer from it, and `iptables-save` prints it, rules in save form
//! ([`crate::live::save_form`]).

use std::collections::BTreeMap;

use kproxy_state::IpFamily;

use crate::live::save_form;
use crate::rules::Table;

/// One table: each chain with its rules, in save form.
type Chains = BTreeMap<String, Vec<String>>;

/// The imitated tables of both families.
#[derive(Debug, Clone, Default)]
pub struct KernelTables {
    tables: BTreeMap<(IpFamily, Table), Chains>,
}

fn builtin(table: Table) -> &'static [&'static str] {
    match table {
        Table::Filter => &["INPUT", "FORWARD", "OUTPUT"],
        Table::Nat => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
        Table::Mangle => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
    }
}

fn table_named(name: &str) -> Option<Table> {
    Table::ALL.into_iter().find(|t| t.as_str() == name)
}

/// The chain a save-form rule jumps or goes to, if it is a user chain name (`KUBE-…`).
fn jumps_to(rule: &str) -> Option<&str> {
    let mut words = rule.split_whitespace();
    while let Some(w) = words.next() {
        if w == "-j" || w == "-g" {
            return words.next().filter(|t| t.starts_with("KUBE-"));
        }
    }
    None
}

/// Joins argv into a restore line, quoting words with spaces.
fn line_of(chain: &str, args: &[String]) -> String {
    let mut line = format!("-A {chain}");
    for a in args {
        if a.is_empty() || a.contains(char::is_whitespace) {
            line.push_str(&format!(" \"{a}\""));
        } else {
            line.push(' ');
            line.push_str(a);
        }
    }
    line
}

impl KernelTables {
    fn table(&self, family: IpFamily, table: Table) -> Chains {
        self.tables
            .get(&(family, table))
            .cloned()
            .unwrap_or_else(|| builtin(table).iter().map(|c| ((*c).to_owned(), Vec::new())).collect())
    }

    /// The rules of `chain`, in save form, if it exists.
    pub fn chain(&self, family: IpFamily, table: Table, chain: &str) -> Option<Vec<String>> {
        self.table(family, table).get(chain).cloned()
    }

    /// Applies `iptables-restore --noflush` input; a section that fails leaves its table as it
    /// was (earlier sections stay, as with the real tools).
    pub fn restore(&mut self, family: IpFamily, input: &str) -> Result<(), String> {
        let mut open: Option<(Table, Chains)> = None;
        for line in input.lines() {
            let line = line.trim_end();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('*') {
                let table = table_named(name).ok_or_else(|| format!("no table {name}"))?;
                open = Some((table, self.table(family, table)));
                continue;
            }
            if line == "COMMIT" {
                let Some((table, chains)) = open.take() else { return Err("COMMIT outside a table".to_owned()) };
                for rule in chains.values().flatten() {
                    if let Some(target) = jumps_to(rule).filter(|t| !chains.contains_key(*t)) {
                        return Err(format!("{rule}: chain {target} does not exist"));
                    }
                }
                self.tables.insert((family, table), chains);
                continue;
            }
            let Some((_, chains)) = open.as_mut() else { return Err(format!("outside a table: {line}")) };
            if let Some(decl) = line.strip_prefix(':') {
                let chain = decl.split_whitespace().next().unwrap_or("");
                chains.entry(chain.to_owned()).or_default().clear();
            } else if let Some(rest) = line.strip_prefix("-A ") {
                let chain = rest.split_whitespace().next().unwrap_or("");
                let rule = save_form(line, family);
                chains.get_mut(chain).ok_or_else(|| format!("{line}: no chain {chain}"))?.push(rule);
            } else if let Some(rest) = line.strip_prefix("-D ") {
                let chain = rest.split_whitespace().next().unwrap_or("");
                let rule = save_form(&format!("-A {rest}"), family);
                let rules = chains.get_mut(chain).ok_or_else(|| format!("{line}: no chain {chain}"))?;
                let at = rules.iter().position(|r| *r == rule).ok_or_else(|| format!("{line}: no such rule"))?;
                rules.remove(at);
            } else if let Some(chain) = line.strip_prefix("-X ") {
                if let Some(rule) = chains.values().flatten().find(|r| jumps_to(r) == Some(chain)) {
                    return Err(format!("-X {chain}: still jumped to by {rule}"));
                }
                chains.remove(chain).ok_or_else(|| format!("-X {chain}: no such chain"))?;
            } else {
                return Err(format!("not understood: {line}"));
            }
        }
        if open.is_some() { Err("no COMMIT at the end".to_owned()) } else { Ok(()) }
    }

    /// What `iptables-save -t <table>` prints.
    pub fn save(&self, family: IpFamily, table: Table) -> String {
        let chains = self.table(family, table);
        let mut out = format!("# Generated by the fake kernel\n*{}\n", table.as_str());
        let builtins = builtin(table);
        for name in builtins {
            out.push_str(&format!(":{name} ACCEPT [0:0]\n"));
        }
        for name in chains.keys().filter(|c| !builtins.contains(&c.as_str())) {
            out.push_str(&format!(":{name} - [0:0]\n"));
        }
        let users = chains.keys().map(String::as_str).filter(|c| !builtins.contains(c));
        for name in builtins.iter().copied().chain(users) {
            for rule in chains.get(name).into_iter().flatten() {
                out.push_str(rule);
                out.push('\n');
            }
        }
        out.push_str("COMMIT\n");
        out
    }

    /// `iptables -t <table> -C|-I|-S <chain> …`: whether it succeeded, and what it printed.
    pub fn run(&mut self, family: IpFamily, args: &[String]) -> (bool, String) {
        let (table, rest) = match args {
            [t, name, rest @ ..] if t == "-t" => (table_named(name), rest),
            rest => (Some(Table::Filter), rest),
        };
        let Some(table) = table else { return (false, String::new()) };
        let [op, chain, spec @ ..] = rest else { return (false, String::new()) };
        let mut chains = self.table(family, table);
        let Some(rules) = chains.get_mut(chain.as_str()) else { return (false, String::new()) };
        match op.as_str() {
            "-C" => (rules.contains(&save_form(&line_of(chain, spec), family)), String::new()),
            "-I" => {
                rules.insert(0, save_form(&line_of(chain, spec), family));
                self.tables.insert((family, table), chains);
                (true, String::new())
            }
            "-S" => {
                let mut out = format!("-N {chain}\n");
                for r in rules.iter() {
                    out.push_str(r);
                    out.push('\n');
                }
                (true, out)
            }
            _ => (false, String::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restores_apply_per_section_and_refuse_dangling_jumps() {
        let mut k = KernelTables::default();
        let v4 = IpFamily::V4;
        k.restore(v4, "*nat\n:KUBE-A - [0:0]\n-A KUBE-A -d 198.18.0.1 -j RETURN\n-A PREROUTING -j KUBE-A\nCOMMIT\n")
            .unwrap();
        assert_eq!(k.chain(v4, Table::Nat, "KUBE-A").unwrap(), ["-A KUBE-A -d 198.18.0.1/32 -j RETURN"]);
        let save = k.save(v4, Table::Nat);
        assert!(save.contains(":KUBE-A - [0:0]\n") && save.contains("-A PREROUTING -j KUBE-A\n"), "{save}");
        // A jump to a chain that does not exist refuses the section, and only that one.
        let e = k.restore(v4, "*nat\n:KUBE-A - [0:0]\nCOMMIT\n*nat\n-A KUBE-A -j KUBE-B\nCOMMIT\n");
        assert!(e.is_err());
        assert_eq!(k.chain(v4, Table::Nat, "KUBE-A").unwrap(), Vec::<String>::new(), "the first section stays");
        // A chain still jumped to cannot be deleted.
        assert!(k.restore(v4, "*nat\n-X KUBE-A\nCOMMIT\n").is_err());
        k.restore(v4, "*nat\n-D PREROUTING -j KUBE-A\n-X KUBE-A\nCOMMIT\n").unwrap();
        assert!(k.chain(v4, Table::Nat, "KUBE-A").is_none());
        let jump =
            ["-t", "nat", "-C", "OUTPUT", "-m", "comment", "--comment", "a b", "-j", "ACCEPT"].map(str::to_owned);
        assert!(!k.run(v4, &jump).0);
        let mut insert = jump.clone();
        insert[2] = "-I".to_owned();
        assert!(k.run(v4, &insert).0);
        assert!(k.run(v4, &jump).0);
        assert!(k.save(v4, Table::Nat).contains("-A OUTPUT -m comment --comment \"a b\" -j ACCEPT\n"));
    }
}

//! How many rules kproxy owns in each table, and how many the last restore wrote, per family:
//! `kubeproxy_sync_proxy_rules_iptables_total` and `…_iptables_last`. Kept from the restore
//! inputs themselves (a chain that is declared is flushed and gets exactly the rules that
//! follow it; a deleted chain has none), so no `iptables-save` is needed to know them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use kproxy_state::IpFamily;

use crate::layout::appended_chain;
use crate::rules::{Table, TableInput};

/// Rules owned and last written, per family and table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TableRules {
    /// Rules in kproxy's chains of the table.
    pub total: u64,
    /// Rules the last restore of the family wrote in the table.
    pub last: u64,
}

#[derive(Debug, Default)]
struct Counts {
    /// Rules per chain, per family and table.
    chains: BTreeMap<(IpFamily, Table), BTreeMap<String, u64>>,
    last: BTreeMap<(IpFamily, Table), u64>,
}

/// A shared view of the counts: the dataplane updates it after each successful restore, the
/// daemon reads it after each sync (cloning shares it).
#[derive(Debug, Clone, Default)]
pub struct RuleCounter {
    inner: Arc<Mutex<Counts>>,
}

impl RuleCounter {
    /// A restore of `tables` for `family` succeeded. `full`: it rewrote everything kproxy owns,
    /// so chains it did not mention are gone.
    pub fn restored(&self, family: IpFamily, tables: &BTreeMap<Table, TableInput>, full: bool) {
        let mut counts = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for table in Table::ALL {
            let key = (family, table);
            let input = tables.get(&table);
            if full {
                counts.chains.remove(&key);
            }
            let chains = counts.chains.entry(key).or_default();
            let mut written = 0;
            if let Some(input) = input {
                for chain in &input.chains {
                    chains.insert(chain.clone(), 0);
                }
                for chain in input.rules.iter().filter_map(|rule| appended_chain(rule)) {
                    *chains.entry(chain.to_owned()).or_default() += 1;
                    written += 1;
                }
                for chain in &input.delete {
                    chains.remove(chain);
                }
            }
            counts.last.insert(key, written);
        }
    }

    /// A full sync over live rules: kproxy owns every chain of `owned`, and its restore (if
    /// any) wrote `written`, the chains that differed.
    pub fn adopted(
        &self,
        family: IpFamily,
        owned: &BTreeMap<Table, TableInput>,
        written: &BTreeMap<Table, TableInput>,
    ) {
        self.restored(family, owned, true);
        let mut counts = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for table in Table::ALL {
            let rules = written.get(&table).map_or(0, |t| t.rules.iter().filter_map(|r| appended_chain(r)).count());
            counts.last.insert((family, table), rules as u64);
        }
    }

    /// Every family and table with its counts.
    pub fn snapshot(&self) -> Vec<(IpFamily, Table, TableRules)> {
        let counts = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        counts
            .chains
            .iter()
            .map(|(&(family, table), chains)| {
                let total = chains.values().sum();
                let last = counts.last.get(&(family, table)).copied().unwrap_or(0);
                (family, table, TableRules { total, last })
            })
            .collect()
    }

    /// Forgets everything (after a cleanup).
    pub fn clear(&self) {
        let mut counts = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        *counts = Counts::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(chains: &[(&str, usize)], delete: &[&str]) -> TableInput {
        let mut t = TableInput::default();
        for (chain, rules) in chains {
            t.chain(chain, (0..*rules).map(|i| format!("-A {chain} -m comment --comment \"-A x{i}\" -j RETURN")));
        }
        t.delete = delete.iter().map(|c| c.to_string()).collect();
        t
    }

    fn counts(counter: &RuleCounter, table: Table) -> TableRules {
        let snapshot = counter.snapshot();
        snapshot.iter().find(|(f, t, _)| *f == IpFamily::V4 && *t == table).map(|(_, _, r)| *r).unwrap()
    }

    #[test]
    fn partial_restores_replace_rewritten_chains_and_drop_deleted_ones() {
        let counter = RuleCounter::default();
        let full = BTreeMap::from([
            (Table::Nat, input(&[("KUBE-SERVICES", 3), ("KUBE-SVC-A", 2), ("KUBE-SEP-A", 1)], &[])),
            (Table::Filter, input(&[("KUBE-FORWARD", 3)], &[])),
        ]);
        counter.restored(IpFamily::V4, &full, true);
        assert_eq!(counts(&counter, Table::Nat), TableRules { total: 6, last: 6 });
        assert_eq!(counts(&counter, Table::Filter), TableRules { total: 3, last: 3 });

        // KUBE-SERVICES rewritten with 4 rules, KUBE-SVC-A/KUBE-SEP-A deleted, KUBE-SVC-B new.
        let partial = BTreeMap::from([(
            Table::Nat,
            input(&[("KUBE-SERVICES", 4), ("KUBE-SVC-B", 1)], &["KUBE-SVC-A", "KUBE-SEP-A"]),
        )]);
        counter.restored(IpFamily::V4, &partial, false);
        assert_eq!(counts(&counter, Table::Nat), TableRules { total: 5, last: 5 });
        assert_eq!(counts(&counter, Table::Filter), TableRules { total: 3, last: 0 }, "not rewritten, still there");

        counter.restored(IpFamily::V4, &BTreeMap::from([(Table::Nat, input(&[("KUBE-SERVICES", 1)], &[]))]), true);
        assert_eq!(counts(&counter, Table::Nat), TableRules { total: 1, last: 1 }, "a full restore owns all");
        assert_eq!(counts(&counter, Table::Filter), TableRules { total: 0, last: 0 });
    }

    #[test]
    fn a_full_sync_over_live_rules_owns_all_and_wrote_what_differed() {
        let counter = RuleCounter::default();
        let owned = BTreeMap::from([
            (Table::Nat, input(&[("KUBE-SERVICES", 3), ("KUBE-SVC-A", 2)], &[])),
            (Table::Filter, input(&[("KUBE-FORWARD", 3)], &[])),
        ]);
        let written = BTreeMap::from([(Table::Nat, input(&[("KUBE-SVC-A", 2)], &["KUBE-SVC-OLD"]))]);
        counter.adopted(IpFamily::V4, &owned, &written);
        assert_eq!(counts(&counter, Table::Nat), TableRules { total: 5, last: 2 });
        assert_eq!(counts(&counter, Table::Filter), TableRules { total: 3, last: 0 });
        counter.adopted(IpFamily::V4, &owned, &BTreeMap::new());
        assert_eq!(counts(&counter, Table::Nat), TableRules { total: 5, last: 0 }, "nothing written");
    }
}

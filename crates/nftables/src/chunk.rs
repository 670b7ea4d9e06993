//! Splits a cold-start transaction into bounded transactions that never reference what is not
//! there yet.
//!
//! One giant transaction at 100k services means one netlink message of hundreds of megabytes and
//! the kernel's nf_tables mutex held for its whole duration (upstream #139328). Splitting it
//! keeps each commit bounded. The order makes every intermediate state consistent: first tables,
//! sets and (empty) regular chains; then the rules of regular chains, which only reference
//! chains and sets that exist; then map and set elements, whose verdicts point at chains that
//! already have their rules; last the base chains and their rules, so no packet enters the new
//! table before everything it can reach is in place.

use crate::transaction::{Op, TableRef, Transaction};

/// Splits `tx` into transactions of at most `max_ops` operations (at least 1), in the order
/// above. Applying them in sequence yields the same ruleset as applying `tx`.
/// Operations are moved, not copied: at 100k services the cold start is a million of them.
pub fn split_cold_start(tx: Transaction, max_ops: usize) -> Vec<Transaction> {
    let max_ops = max_ops.max(1);
    let base: Vec<(TableRef, String)> = tx
        .ops()
        .iter()
        .filter_map(|op| match op {
            Op::AddChain(t, c) if c.hook.is_some() => Some((t.clone(), c.name.clone())),
            _ => None,
        })
        .collect();
    let mut phases: [Vec<Op>; 4] = Default::default();
    for op in tx.into_ops() {
        let phase = match &op {
            Op::AddChain(_, c) if c.hook.is_some() => 3,
            Op::AddRule { table, chain, .. } if base.iter().any(|(t, c)| t == table && c == chain) => 3,
            Op::AddRule { .. } => 1,
            Op::AddElement(..) => 2,
            _ => 0,
        };
        phases[phase].push(op);
    }
    let mut out = Vec::new();
    for phase in phases {
        let mut t = Transaction::new();
        for op in phase {
            if t.len() == max_ops {
                out.push(std::mem::take(&mut t));
            }
            t.push(op);
        }
        if !t.is_empty() {
            out.push(t);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transaction::{Chain, Element, Hook, TableFamily};

    fn t() -> TableRef {
        TableRef { family: TableFamily::Ip, name: "kproxy".into() }
    }

    #[test]
    fn base_chains_come_last_and_rules_before_the_elements_that_point_at_them() {
        let mut tx = Transaction::new();
        tx.push(Op::AddTable { table: t(), comment: None });
        let hook = Some(Hook { kind: "nat", hook: "output", priority: "-100" });
        tx.push(Op::AddChain(t(), Chain { name: "nat-output".into(), hook }));
        tx.push(Op::AddChain(t(), Chain { name: "svc".into(), hook: None }));
        tx.add_rules(&t(), "nat-output", ["jump svc".to_owned()]);
        tx.add_rules(&t(), "svc", ["drop".to_owned(), "accept".to_owned()]);
        let e = Element { set: "m".into(), key: "10.0.0.1 . tcp . 80".into(), value: Some("goto svc".into()) };
        tx.push(Op::AddElement(t(), e));
        let parts = split_cold_start(tx.clone(), 2);
        let texts: Vec<String> = parts.iter().map(|p| p.render()).collect();
        assert_eq!(
            texts,
            vec![
                "add table ip kproxy\nadd chain ip kproxy svc\n",
                "add rule ip kproxy svc drop\nadd rule ip kproxy svc accept\n",
                "add element ip kproxy m { 10.0.0.1 . tcp . 80 : goto svc }\n",
                "add chain ip kproxy nat-output { type nat hook output priority -100; policy accept; }\n\
                 add rule ip kproxy nat-output jump svc\n",
            ]
        );
        assert_eq!(parts.iter().map(Transaction::len).sum::<usize>(), tx.len());
    }
}

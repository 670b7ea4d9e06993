//! What a table holds, summarised: its chains with their rule counts and its sets with their
//! element counts. The dataplane follows the summary of what it applied; a netlink dump of the
//! kernel gives the same summary, so drift (someone else changed kproxy's table) is found
//! without `nft` and without decoding every rule.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use crate::expr::Value;
use crate::set::{Key, SetFlag, SetType};
use crate::table::TableRef;
use crate::transaction::{Op, Transaction};

/// What a table holds, summarised.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableListing {
    /// Chain name → number of rules.
    pub chains: BTreeMap<String, usize>,
    /// Set name → number of kernel elements, `None` where not counted (see [`TableListing::apply`]).
    pub sets: BTreeMap<String, Option<usize>>,
    /// Chain name → the comment of its first rule, for chains whose first rule has one.
    pub first_comments: BTreeMap<String, String>,
}

/// How many kernel elements an element is: a single-field range is two (its start and the
/// interval end after it), unless it reaches the end of the address space.
fn interval_elements(key: &Key) -> usize {
    let all_ones = |ip: IpAddr| match ip {
        IpAddr::V4(a) => a == Ipv4Addr::BROADCAST,
        IpAddr::V6(a) => a.segments().iter().all(|s| *s == u16::MAX),
    };
    match key.values() {
        [Value::Prefix(n)] if !all_ones(n.broadcast()) => 2,
        _ => 1,
    }
}

impl TableListing {
    /// What `table` holds after applying `tx` to a table that did not exist.
    pub fn expected(tx: &Transaction, table: &TableRef) -> TableListing {
        let mut l = TableListing::default();
        for op in tx.ops() {
            l.apply(op, table);
        }
        l
    }

    /// Follows one applied operation on `table` (operations on other tables are ignored).
    pub fn apply(&mut self, op: &Op, table: &TableRef) {
        let l = self;
        let count = |l: &mut TableListing, set: &str, delta: isize| {
            if let Some(Some(n)) = l.sets.get_mut(set) {
                *n = n.saturating_add_signed(delta);
            }
        };
        match op {
            Op::DeleteTable(t) if t == table => *l = TableListing::default(),
            Op::AddChain(t, c) if t == table => {
                l.chains.entry(c.name.clone()).or_insert(0);
            }
            Op::FlushChain(t, c) if t == table => {
                l.chains.insert(c.clone(), 0);
                l.first_comments.remove(c);
            }
            Op::DeleteChain(t, c) if t == table => {
                l.chains.remove(c);
                l.first_comments.remove(c);
            }
            Op::AddRule { table: t, chain, comment, .. } if t == table => {
                let rules = l.chains.entry(chain.clone()).or_insert(0);
                if *rules == 0
                    && let Some(c) = comment
                {
                    l.first_comments.insert(chain.clone(), c.clone());
                }
                *rules += 1;
            }
            Op::AddSet(t, s) if t == table => {
                // Not counted: dynamic sets, whose content the packet path changes, and sets of
                // single-field ranges, whose kernel elements depend on how the ranges were added
                // (nft's encoding adds an interval end at the lowest key when it creates one).
                // A set of concatenated ranges keeps each range as one element.
                let concat = match &s.ty {
                    SetType::Named { key, .. } => key.len() > 1,
                    SetType::Typeof { key, .. } => key.len() > 1,
                };
                let uncounted = s.has(SetFlag::Dynamic) || (s.has(SetFlag::Interval) && !concat);
                l.sets.entry(s.name.clone()).or_insert(if uncounted { None } else { Some(0) });
            }
            Op::FlushSet { table: t, name, .. } if t == table => {
                if let Some(Some(n)) = l.sets.get_mut(name) {
                    *n = 0;
                }
            }
            Op::DeleteSet { table: t, name, .. } if t == table => {
                l.sets.remove(name);
            }
            Op::AddElement(t, e) if t == table => count(l, &e.set, interval_elements(&e.key) as isize),
            Op::DeleteElement(t, e) if t == table => count(l, &e.set, -(interval_elements(&e.key) as isize)),
            // Identities exist only for plain elements: one kernel element each.
            Op::DeleteElementByIdentity { table: t, set, .. } if t == table => count(l, set, -1),
            _ => {}
        }
    }

    /// Human-readable differences from `expected` (empty: no drift).
    pub fn drift(&self, expected: &TableListing) -> Vec<String> {
        let mut out = Vec::new();
        for (name, want) in &expected.chains {
            match self.chains.get(name) {
                None => out.push(format!("chain {name} is missing")),
                Some(got) if got != want => out.push(format!("chain {name} has {got} rules, expected {want}")),
                _ if self.first_comments.get(name) != expected.first_comments.get(name) => {
                    out.push(format!("chain {name} holds other rules (its first rule's comment differs)"))
                }
                _ => {}
            }
        }
        out.extend(
            self.chains.keys().filter(|c| !expected.chains.contains_key(*c)).map(|c| format!("unexpected chain {c}")),
        );
        for (name, want) in &expected.sets {
            match (self.sets.get(name), want) {
                (None, _) => out.push(format!("set {name} is missing")),
                (Some(Some(got)), Some(want)) if got != want => {
                    out.push(format!("set {name} has {got} elements, expected {want}"))
                }
                _ => {}
            }
        }
        out.extend(self.sets.keys().filter(|s| !expected.sets.contains_key(*s)).map(|s| format!("unexpected set {s}")));
        out
    }
}

/// The summaries of several tables, followed through applied transactions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listings(pub BTreeMap<TableRef, TableListing>);

impl Listings {
    /// Follows an applied transaction: tables it adds appear, tables it deletes go.
    pub fn apply(&mut self, tx: &Transaction) {
        for op in tx.ops() {
            self.apply_op(op);
        }
    }

    /// Follows one applied operation.
    pub fn apply_op(&mut self, op: &Op) {
        if let Op::AddTable { table, .. } = op {
            self.0.entry(table.clone()).or_default();
        }
        for (table, listing) in &mut self.0 {
            listing.apply(op, table);
        }
        if let Op::DeleteTable(t) = op {
            self.0.remove(t);
        }
    }

    /// The summary of `table` (empty when it is not there).
    pub fn get(&self, table: &TableRef) -> TableListing {
        self.0.get(table).cloned().unwrap_or_default()
    }
}

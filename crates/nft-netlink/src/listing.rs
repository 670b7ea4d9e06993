//! One netlink listing of a table — its chains with their rule counts and its sets with their
//! element counts — and the same summary computed from a transaction, to detect drift (someone
//! else changed kproxy's table) on full resyncs without `nft` and without decoding every rule.

use std::collections::BTreeMap;
use std::io;

use kproxy_nft_model::{Key, Op, SetFlag, SetType, TableRef, Transaction};

use crate::NetlinkExecutor;
use crate::batch::nfproto;
use crate::sys::*;
use crate::wire::Attrs;

/// What a table holds, summarised.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableListing {
    /// Chain name → number of rules.
    pub chains: BTreeMap<String, usize>,
    /// Set name → number of kernel elements (an interval is two), `None` for dynamic sets whose
    /// content the packet path changes.
    pub sets: BTreeMap<String, Option<usize>>,
}

/// How many kernel elements an element is: a single-field range is two (its start and the
/// interval end after it), unless it reaches the end of the address space.
fn interval_elements(key: &Key) -> usize {
    match crate::lower::element_key(key).map(|k| k.interval_end) {
        Ok(Some(Some(_))) => 2,
        _ => 1,
    }
}

impl TableListing {
    /// What `table` holds after applying `tx` to a table that did not exist.
    pub fn expected(tx: &Transaction, table: &TableRef) -> TableListing {
        let mut l = TableListing::default();
        let count = |l: &mut TableListing, set: &str, delta: isize| {
            if let Some(Some(n)) = l.sets.get_mut(set) {
                *n = n.saturating_add_signed(delta);
            }
        };
        for op in tx.ops() {
            match op {
                Op::DeleteTable(t) if t == table => l = TableListing::default(),
                Op::AddChain(t, c) if t == table => {
                    l.chains.entry(c.name.clone()).or_insert(0);
                }
                Op::FlushChain(t, c) if t == table => {
                    l.chains.insert(c.clone(), 0);
                }
                Op::DeleteChain(t, c) if t == table => {
                    l.chains.remove(c);
                }
                Op::AddRule { table: t, chain, .. } if t == table => *l.chains.entry(chain.clone()).or_insert(0) += 1,
                Op::AddSet(t, s) if t == table => {
                    let dynamic = s.has(SetFlag::Dynamic);
                    // A single-field interval set starts with the interval end at its lowest key;
                    // a set of concatenated ranges keeps each range as one element.
                    let concat = matches!(&s.ty, SetType::Named { key, .. } if key.len() > 1)
                        || matches!(&s.ty, SetType::Typeof { key, .. } if key.len() > 1);
                    let interval = s.has(SetFlag::Interval) && !concat;
                    l.sets.entry(s.name.clone()).or_insert(if dynamic { None } else { Some(usize::from(interval)) });
                }
                Op::FlushSet { table: t, name, .. } if t == table => {
                    if let Some(Some(n)) = l.sets.get_mut(name) {
                        *n = 0;
                    }
                }
                Op::DeleteSet { table: t, name, .. } if t == table => {
                    l.sets.remove(name);
                }
                Op::AddElement(t, e) if t == table => count(&mut l, &e.set, interval_elements(&e.key) as isize),
                Op::DeleteElement(t, e) if t == table => count(&mut l, &e.set, -(interval_elements(&e.key) as isize)),
                _ => {}
            }
        }
        l
    }

    /// Human-readable differences from `expected` (empty: no drift).
    pub fn drift(&self, expected: &TableListing) -> Vec<String> {
        let mut out = Vec::new();
        for (name, want) in &expected.chains {
            match self.chains.get(name) {
                None => out.push(format!("chain {name} is missing")),
                Some(got) if got != want => out.push(format!("chain {name} has {got} rules, expected {want}")),
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

fn attr_str(payload: &[u8], kind: u16) -> Option<String> {
    Attrs(payload).find(|a| a.kind == kind).map(|a| a.str())
}

/// Lists `table` with four dumps (chains, rules, sets, then the elements of each static set).
/// A missing table lists as empty.
pub fn list_table(exec: &mut NetlinkExecutor, table: &TableRef) -> io::Result<TableListing> {
    let family = nfproto(table.family);
    let sock = exec.socket()?;
    let mut l = TableListing::default();
    let name = table.name.as_str();
    let put_table = |kind: u16| move |m: &mut crate::wire::MsgBuf| m.put_str(kind, name);
    let ours = |p: &[u8], kind: u16| attr_str(p, kind).as_deref() == Some(name);
    sock.dump(NFT_MSG_GETCHAIN, family, put_table(NFTA_CHAIN_TABLE), |p| {
        if ours(p, NFTA_CHAIN_TABLE)
            && let Some(c) = attr_str(p, NFTA_CHAIN_NAME)
        {
            l.chains.entry(c).or_insert(0);
        }
    })?;
    sock.dump(NFT_MSG_GETRULE, family, put_table(NFTA_RULE_TABLE), |p| {
        if ours(p, NFTA_RULE_TABLE)
            && let Some(c) = attr_str(p, NFTA_RULE_CHAIN)
        {
            *l.chains.entry(c).or_insert(0) += 1;
        }
    })?;
    let mut sets = Vec::new();
    sock.dump(NFT_MSG_GETSET, family, put_table(NFTA_SET_TABLE), |p| {
        if ours(p, NFTA_SET_TABLE)
            && let Some(s) = attr_str(p, NFTA_SET_NAME)
        {
            let flags = Attrs(p).find(|a| a.kind == NFTA_SET_FLAGS).and_then(|a| a.be32()).unwrap_or(0);
            sets.push((s, flags & NFT_SET_EVAL != 0));
        }
    })?;
    for (set, dynamic) in sets {
        if dynamic {
            l.sets.insert(set, None);
            continue;
        }
        let mut n = 0;
        let table_name = name.to_owned();
        let set_name = set.clone();
        sock.dump(
            NFT_MSG_GETSETELEM,
            family,
            move |m| {
                m.put_str(NFTA_SET_ELEM_LIST_TABLE, &table_name);
                m.put_str(NFTA_SET_ELEM_LIST_SET, &set_name);
            },
            |p| {
                if let Some(list) = Attrs(p).find(|a| a.kind == NFTA_SET_ELEM_LIST_ELEMENTS) {
                    n += list.nested().count();
                }
            },
        )?;
        l.sets.insert(set, Some(n));
    }
    Ok(l)
}

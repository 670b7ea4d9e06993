//! What kproxy knows of the kernel between syncs, and how it checks and repairs it.
//!
//! - [`Applied`] follows every transaction kproxy applies: a summary of each table (chains with
//!   rule counts, sets with element counts) and the nf_tables generation its last commit left.
//!   The kernel bumps the generation on every commit in the namespace, by anyone, so while it is
//!   unchanged nobody touched the tables and a periodic check costs one netlink round trip.
//! - When it changed, one dump of kproxy's tables is compared with the summary; [`repair_ops`]
//!   rewrites only the chains and sets that differ, in one transaction.
//! - [`adopt_ops`] takes over the tables a previous kproxy left (a restart, an upgrade): one
//!   transaction that rewrites them in place, so no packet ever sees them missing or half-built.
//!   A set whose elements the executor can read ([`keep_present_elements`]) is not flushed and
//!   refilled: the elements kproxy no longer wants are deleted and the missing ones added. A
//!   restart over unchanged state then leaves every element where it is (and their per-Service
//!   counters). Likewise a chain whose rule count and digest ([`crate::digest`]) are what kproxy
//!   would write is neither flushed nor refilled, so a restart over unchanged state commits
//!   almost nothing, and one over a few changes commits about as much as those changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kproxy_nft_model::{
    Chain, Element, ExecError, Executor, Listings, Op, Prepared, SetDef, SetFlag, TableListing, TableRef, Transaction,
};

/// What the last applied transactions left in the kernel, as far as kproxy knows.
#[derive(Debug, Default)]
pub struct Applied {
    /// The summary of every table kproxy applied to.
    pub listings: Listings,
    /// The generation kproxy's last commit left, while nobody else committed since it
    /// (`None`: unknown, or someone else committed).
    pub generation: Option<u32>,
}

impl Applied {
    /// Applies `tx` through `exec`, following what it does to the tables and the generation.
    pub fn apply<E: Executor + ?Sized>(&mut self, exec: &mut E, tx: &Transaction) -> Result<(), ExecError> {
        if tx.is_empty() {
            return Ok(());
        }
        self.commit(exec, |exec| exec.apply(tx))?;
        self.listings.apply(tx);
        Ok(())
    }

    /// [`Applied::apply`] of a transaction [`Executor::prepare`] made ready.
    pub fn apply_prepared<E: Executor + ?Sized>(
        &mut self,
        exec: &mut E,
        prepared: &mut Prepared,
    ) -> Result<(), ExecError> {
        if prepared.tx.is_empty() {
            return Ok(());
        }
        self.commit(exec, |exec| exec.apply_prepared(prepared))?;
        self.listings.apply(&prepared.tx);
        Ok(())
    }

    /// Commits through `apply`, following the generation.
    fn commit<E: Executor + ?Sized>(
        &mut self,
        exec: &mut E,
        apply: impl FnOnce(&mut E) -> Result<(), ExecError>,
    ) -> Result<(), ExecError> {
        let before = exec.generation().ok().flatten();
        let result = apply(exec);
        let after = exec.generation().ok().flatten();
        // Ours was the only commit in between only if the generation moved by exactly one
        // from where our previous commit left it.
        self.generation = match (before, after) {
            (Some(b), Some(a)) if result.is_ok() && a == b.wrapping_add(1) && self.generation == Some(b) => Some(a),
            _ => None,
        };
        result
    }
}

/// What a periodic check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification {
    /// Nobody committed anything since kproxy's last commit: nothing was listed.
    Untouched,
    /// The tables were listed and hold what kproxy applied.
    Clean,
    /// The tables differed (each line says how) and were repaired.
    Repaired(Vec<String>),
    /// The executor cannot read the kernel (tests, `--dry-run`).
    Unverifiable,
    /// Every listing attempt met another program's commit: nothing was compared.
    Busy,
}

/// The differences of one table from what kproxy applied.
#[derive(Debug, Clone, Default)]
pub struct Drift {
    /// Chains missing or with other rules.
    pub chains: BTreeSet<String>,
    /// Chains kproxy does not have.
    pub unexpected_chains: BTreeSet<String>,
    /// Sets missing or with other elements.
    pub sets: BTreeSet<String>,
    /// Sets kproxy does not have.
    pub unexpected_sets: BTreeSet<String>,
}

impl Drift {
    /// Compares what the kernel holds with what was applied.
    pub fn between(actual: &TableListing, expected: &TableListing) -> Drift {
        let mut d = Drift::default();
        for (name, want) in &expected.chains {
            // The digest on a chain's first rule tells one rewritten with as many other rules.
            if actual.chains.get(name) != Some(want)
                || actual.first_comments.get(name) != expected.first_comments.get(name)
            {
                d.chains.insert(name.clone());
            }
        }
        d.unexpected_chains.extend(actual.chains.keys().filter(|c| !expected.chains.contains_key(*c)).cloned());
        for (name, want) in &expected.sets {
            match (actual.sets.get(name), want) {
                (None, _) => {
                    d.sets.insert(name.clone());
                }
                (Some(Some(got)), Some(want)) if got != want => {
                    d.sets.insert(name.clone());
                }
                _ => {}
            }
        }
        d.unexpected_sets.extend(actual.sets.keys().filter(|s| !expected.sets.contains_key(*s)).cloned());
        d
    }

    /// Nothing differs.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
            && self.unexpected_chains.is_empty()
            && self.sets.is_empty()
            && self.unexpected_sets.is_empty()
    }
}

/// The desired content of one table, gathered from a cold start's operations.
#[derive(Debug, Default)]
pub struct Desired {
    chains: Vec<Chain>,
    sets: Vec<SetDef>,
    rules: Vec<Op>,
    elements: Vec<Op>,
    /// Elements the kernel holds and kproxy no longer wants, deleted one by one (see
    /// [`keep_present_elements`]).
    unwanted: Vec<Op>,
}

impl Desired {
    /// Takes the operations of `table` from a cold start's stream.
    pub fn collect(&mut self, table: &TableRef, op: Op) {
        match op {
            Op::AddChain(t, c) if &t == table => self.chains.push(c),
            Op::AddSet(t, s) if &t == table => self.sets.push(s),
            op @ Op::AddRule { .. } if op_table(&op) == Some(table) => self.rules.push(op),
            op @ Op::AddElement(..) if op_table(&op) == Some(table) => self.elements.push(op),
            _ => {}
        }
    }
}

fn op_table(op: &Op) -> Option<&TableRef> {
    match op {
        Op::AddRule { table, .. } | Op::AddElement(table, _) => Some(table),
        _ => None,
    }
}

fn chain_of(op: &Op) -> Option<&str> {
    match op {
        Op::AddRule { chain, .. } => Some(chain),
        _ => None,
    }
}

fn set_of(op: &Op) -> Option<&str> {
    match op {
        Op::AddElement(_, e) => Some(&e.set),
        _ => None,
    }
}

/// For the static sets of `existing` the executor can read (see
/// [`Executor::element_identities`]), takes out of `desired` the elements they already hold and
/// queues the deletion of those kproxy no longer wants; returns their names: an adoption neither
/// flushes those sets nor adds those elements again, so a restart after a few changes rewrites a
/// few elements, not every element of every set they touched. A set the executor cannot read
/// (or one holding ranges) is left in `desired` whole (it is rewritten). `read` holds the
/// identities of the sets the caller has read already, by name. The second value counts the
/// elements taken out.
pub fn keep_present_elements<E: Executor + ?Sized>(
    exec: &mut E,
    table: &TableRef,
    desired: &mut Desired,
    existing: &TableListing,
    mut read: BTreeMap<String, BTreeSet<Vec<u8>>>,
) -> (BTreeSet<String>, usize) {
    let mut keep = BTreeSet::new();
    let mut present_ops = BTreeSet::new();
    let mut unwanted = Vec::new();
    // The desired elements of each set, found in one pass: a table has hundreds of sets.
    let mut by_set: HashMap<&str, Vec<(usize, &Element)>> = HashMap::new();
    for (i, op) in desired.elements.iter().enumerate() {
        if let Op::AddElement(_, e) = op {
            by_set.entry(e.set.as_str()).or_default().push((i, e));
        }
    }
    for def in desired.sets.iter().filter(|s| !s.has(SetFlag::Dynamic) && existing.sets.contains_key(&s.name)) {
        let present = match read.remove(&def.name) {
            Some(present) => present,
            None => match exec.element_identities(table, &def.name) {
                Ok(Some(present)) => present,
                _ => continue,
            },
        };
        let wanted: Option<Vec<(usize, Vec<u8>)>> = by_set
            .get(def.name.as_str())
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .map(|&(i, e)| exec.element_identity(e).map(|id| (i, id)))
            .collect();
        let Some(wanted) = wanted else { continue };
        let wanted_ids: BTreeSet<&Vec<u8>> = wanted.iter().map(|(_, id)| id).collect();
        present_ops.extend(wanted.iter().filter(|(_, id)| present.contains(id)).map(|(i, _)| *i));
        unwanted.extend(
            present.into_iter().filter(|id| !wanted_ids.contains(id)).map(|identity| Op::DeleteElementByIdentity {
                table: table.clone(),
                set: def.name.clone(),
                identity,
            }),
        );
        keep.insert(def.name.clone());
    }
    let mut index = 0;
    desired.elements.retain(|_| {
        index += 1;
        !present_ops.contains(&(index - 1))
    });
    desired.unwanted = unwanted;
    (keep, present_ops.len())
}

/// Rewrites, in one transaction, what `table` must hold where `only` selects it: the chains and
/// sets it names are declared (declaring an existing one is a no-op), flushed and refilled;
/// `remove` names chains and sets to delete. Dynamic sets keep their elements (live state), and
/// so do the sets named in `unflushed`.
#[allow(clippy::too_many_arguments)] // one private helper, two callers that differ in each
fn rewrite(
    table: &TableRef,
    desired: Desired,
    chains: impl Fn(&str) -> bool,
    sets: impl Fn(&str) -> bool,
    remove_chains: &BTreeSet<String>,
    remove_sets: &BTreeSet<String>,
    unflushed: &BTreeSet<String>,
    tx: &mut Transaction,
) {
    let t = || table.clone();
    let chain_defs: Vec<Chain> = desired.chains.into_iter().filter(|c| chains(&c.name)).collect();
    let set_defs: Vec<SetDef> = desired.sets.into_iter().filter(|s| sets(&s.name)).collect();
    for c in &chain_defs {
        tx.push(Op::AddChain(t(), c.clone()));
    }
    for s in &set_defs {
        tx.push(Op::AddSet(t(), s.clone()));
    }
    for c in chain_defs.iter().map(|c| &c.name).chain(remove_chains) {
        tx.push(Op::FlushChain(t(), c.clone()));
    }
    for s in set_defs.iter().filter(|s| !s.has(SetFlag::Dynamic) && !unflushed.contains(&s.name)) {
        tx.push(Op::FlushSet { table: t(), name: s.name.clone(), is_map: s.is_map() });
    }
    // Before the chains they may jump to are deleted (a chain still referenced cannot be), and
    // before the additions (a map element whose data changed is deleted, then added anew).
    for op in desired.unwanted {
        tx.push(op);
    }
    for c in remove_chains {
        tx.push(Op::DeleteChain(t(), c.clone()));
    }
    for s in remove_sets {
        tx.push(Op::DeleteSet { table: t(), name: s.clone(), is_map: false });
    }
    let dynamic: BTreeSet<&str> =
        set_defs.iter().filter(|s| s.has(SetFlag::Dynamic)).map(|s| s.name.as_str()).collect();
    for op in desired.rules {
        if chain_of(&op).is_some_and(&chains) {
            tx.push(op);
        }
    }
    for op in desired.elements {
        if set_of(&op).is_some_and(|s| sets(s) && !dynamic.contains(s)) {
            tx.push(op);
        }
    }
}

/// The transaction that repairs `drift` in `table`.
pub fn repair_ops(table: &TableRef, desired: Desired, drift: &Drift, tx: &mut Transaction) {
    rewrite(
        table,
        desired,
        |c| drift.chains.contains(c),
        |s| drift.sets.contains(s),
        &drift.unexpected_chains,
        &drift.unexpected_sets,
        &BTreeSet::new(),
        tx,
    );
}

/// The transaction that takes over `table` as a previous kproxy left it (`existing`): every
/// chain that does not already hold its rules and every static set rewritten in place, what
/// kproxy no longer has removed; the sets in `unflushed` (see [`keep_present_elements`]) are
/// not flushed. Returns how many chains were kept as they were.
pub fn adopt_ops(
    table: &TableRef,
    comment: Option<String>,
    desired: Desired,
    existing: &TableListing,
    unflushed: &BTreeSet<String>,
    tx: &mut Transaction,
) -> usize {
    let wanted_chains: BTreeSet<&str> = desired.chains.iter().map(|c| c.name.as_str()).collect();
    let wanted_sets: BTreeSet<&str> = desired.sets.iter().map(|s| s.name.as_str()).collect();
    let remove_chains: BTreeSet<String> =
        existing.chains.keys().filter(|c| !wanted_chains.contains(c.as_str())).cloned().collect();
    let remove_sets: BTreeSet<String> =
        existing.sets.keys().filter(|s| !wanted_sets.contains(s.as_str())).cloned().collect();
    let kept = chains_holding_their_rules(&desired, existing);
    tx.push(Op::AddTable { table: table.clone(), comment });
    // A base chain is declared again even when its rules are kept: declaring one whose hook
    // differs fails the adoption (and the caller rebuilds), rather than keeping the old hook.
    for c in desired.chains.iter().filter(|c| c.hook.is_some() && kept.contains(&c.name)) {
        tx.push(Op::AddChain(table.clone(), c.clone()));
    }
    rewrite(table, desired, |c| !kept.contains(c), |_| true, &remove_chains, &remove_sets, unflushed, tx);
    kept.len()
}

/// The chains of `desired` that `existing` already holds rule for rule, as far as its summary
/// tells: the same number of rules, and the same digest on the first (see [`crate::digest`]).
fn chains_holding_their_rules(desired: &Desired, existing: &TableListing) -> BTreeSet<String> {
    let mut counts: BTreeMap<&str, usize> = desired.chains.iter().map(|c| (c.name.as_str(), 0)).collect();
    let mut first_comments: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    for op in &desired.rules {
        if let Op::AddRule { chain, comment, .. } = op {
            *counts.entry(chain).or_insert(0) += 1;
            first_comments.entry(chain).or_insert(comment.as_deref());
        }
    }
    counts
        .into_iter()
        .filter(|(chain, n)| {
            let digest = first_comments.get(chain).copied().flatten();
            existing.chains.get(*chain) == Some(n)
                && existing.first_comments.get(*chain).map(String::as_str) == digest
                // An empty chain needs no digest; a non-empty one is trusted only with one.
                && (*n == 0 || digest.is_some_and(|d| d.starts_with(crate::digest::PREFIX)))
        })
        .map(|(chain, _)| chain.to_owned())
        .collect()
}

/// Lists each of `tables`; `None` when the executor cannot list.
pub fn list_all<E: Executor + ?Sized>(
    exec: &mut E,
    tables: impl IntoIterator<Item = TableRef>,
) -> Result<Option<BTreeMap<TableRef, TableListing>>, ExecError> {
    list_each(tables, |t| exec.list(t))
}

/// [`list_all`] without counting the elements of sets (see
/// [`Executor::list_without_elements`]).
pub fn list_all_without_elements<E: Executor + ?Sized>(
    exec: &mut E,
    tables: impl IntoIterator<Item = TableRef>,
) -> Result<Option<BTreeMap<TableRef, TableListing>>, ExecError> {
    list_each(tables, |t| exec.list_without_elements(t))
}

fn list_each(
    tables: impl IntoIterator<Item = TableRef>,
    mut list: impl FnMut(&TableRef) -> Result<Option<TableListing>, ExecError>,
) -> Result<Option<BTreeMap<TableRef, TableListing>>, ExecError> {
    let mut out = BTreeMap::new();
    for t in tables {
        match list(&t)? {
            Some(l) => out.insert(t, l),
            None => return Ok(None),
        };
    }
    Ok(Some(out))
}

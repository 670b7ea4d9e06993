//! The nftables dataplane: keeps kproxy's tables exactly in line with the plan.
//!
//! The applied state (every service port's applied plan, whose objects are rendered again on
//! demand, and who owns each shared element) lives in memory, so a partial sync diffs the plan
//! delta against it and emits only what changed — O(change), no listing of the kernel. Every sync is one atomic
//! transaction. The first sync, and the first after a failure, deletes and recreates the tables
//! inside that same transaction, so there is never a moment without rules. Later full syncs
//! reconcile: they rewrite every chain and static map in place but keep the affinity sets.
//! Chains that go away are flushed in one sync and deleted in the next: older kernels refuse to
//! delete a chain in the transaction that drops the last reference to it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kproxy_plan::{FamilyPlan, NodePlan, Plan, PlanDelta, ServicePortName, ServicePortPlan};
use kproxy_state::IpFamily;

use crate::exec::{ExecError, Executor};
use crate::ruleset::service::{self, ServiceObjects};
use crate::ruleset::{Ctx, DEFAULT_MASQUERADE_MARK, TABLE_NAME, skeleton};
use crate::transaction::{Chain, Element, Op, OpCounts, SetDef, TableRef, Transaction};

/// Dataplane settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Table name in both families.
    pub table: String,
    /// The masquerade mark (`1 << masqueradeBit`).
    pub masquerade_mark: u32,
    /// A cold start (first sync, or the first after a failure) larger than this many operations
    /// is applied as several transactions of at most this size (see [`crate::chunk`]).
    pub cold_start_chunk_ops: usize,
}

/// Default bound on the operations of one cold-start transaction.
pub const DEFAULT_COLD_START_CHUNK_OPS: usize = 50_000;

impl Default for Config {
    fn default() -> Self {
        Self {
            table: TABLE_NAME.to_owned(),
            masquerade_mark: DEFAULT_MASQUERADE_MARK,
            cold_start_chunk_ops: DEFAULT_COLD_START_CHUNK_OPS,
        }
    }
}

/// A sync failed; the kernel is unchanged and the next sync is a full one.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The transaction was rejected.
    #[error("applying the nftables transaction: {0}")]
    Exec(#[from] ExecError),
}

/// What a sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncReport {
    /// It was a full sync.
    pub full: bool,
    /// Number of operations in the transaction.
    pub ops: usize,
    /// Operations by kind.
    pub counts: OpCounts,
}

type ElementKey = (String, String);

/// The service ports that want one shared element, with the value each wants, ordered by name:
/// the first wins. Almost always one owner, so a vector (a map per element cost a kilobyte).
type Owners = Vec<(Arc<str>, Option<String>)>;

/// What is in one family's table, as far as kproxy knows.
#[derive(Debug, Clone)]
struct FamilyState {
    ctx: Ctx,
    node: NodePlan,
    /// The applied plan of every service port (shared with the planner's plan). Its objects
    /// are rendered again when needed instead of being kept as text.
    services: BTreeMap<ServicePortName, Arc<ServicePortPlan>>,
    /// Every shared element, with its owners.
    owners: BTreeMap<ElementKey, Owners>,
    /// Chains flushed by the last sync, to delete in the next one.
    stale_chains: BTreeSet<String>,
}

fn effective(owners: Option<&Owners>) -> Option<Option<String>> {
    owners.and_then(|o| o.first()).map(|(_, value)| value.clone())
}

fn owner_id(name: &ServicePortName) -> Arc<str> {
    name.to_string().into()
}

fn add_owner(owners: &mut Owners, owner: &Arc<str>, value: Option<String>) {
    match owners.binary_search_by(|(o, _)| o.as_ref().cmp(owner)) {
        Ok(i) => owners[i].1 = value,
        Err(i) => owners.insert(i, (owner.clone(), value)),
    }
}

fn remove_owner(owners: &mut Owners, owner: &Arc<str>) {
    if let Ok(i) = owners.binary_search_by(|(o, _)| o.as_ref().cmp(owner)) {
        owners.remove(i);
    }
}

impl FamilyState {
    /// The state after a full sync of `fam`, and the rendered objects of every service port.
    fn desired(ctx: Ctx, fam: &FamilyPlan) -> (Self, BTreeMap<ServicePortName, ServiceObjects>) {
        let mut state = FamilyState {
            ctx,
            node: fam.node.clone(),
            services: fam.services.clone(),
            owners: BTreeMap::new(),
            stale_chains: BTreeSet::new(),
        };
        let mut objects = BTreeMap::new();
        for (name, plan) in &fam.services {
            let rendered = service::render(&state.ctx, &fam.node, plan);
            let owner = owner_id(name);
            for e in &rendered.elements {
                add_owner(state.owners.entry((e.set.clone(), e.key.clone())).or_default(), &owner, e.value.clone());
            }
            objects.insert(name.clone(), rendered);
        }
        (state, objects)
    }

    /// The objects of the applied service port `name` (empty when there is none).
    fn objects(&self, name: &ServicePortName) -> ServiceObjects {
        self.services.get(name).map(|p| service::render(&self.ctx, &self.node, p)).unwrap_or_default()
    }

    fn elements(&self) -> impl Iterator<Item = Element> + '_ {
        self.owners.iter().filter_map(|((set, key), owners)| {
            effective(Some(owners)).map(|value| Element { set: set.clone(), key: key.clone(), value })
        })
    }
}

/// The operations of one family, in buckets emitted in an order where nothing dangles.
#[derive(Debug, Default)]
struct Batch {
    pre: Vec<Op>,
    delete_chains: Vec<String>,
    add_chains: Vec<Chain>,
    flush_chains: Vec<String>,
    delete_elements: Vec<Element>,
    flush_sets: Vec<(String, bool)>,
    delete_sets: Vec<(String, bool)>,
    add_sets: Vec<SetDef>,
    rules: Vec<(String, Vec<String>)>,
    add_elements: Vec<Element>,
}

impl Batch {
    fn into_transaction(self, table: &TableRef, tx: &mut Transaction) {
        let t = || table.clone();
        self.pre.into_iter().for_each(|op| tx.push(op));
        self.delete_chains.into_iter().for_each(|c| tx.push(Op::DeleteChain(t(), c)));
        self.add_chains.into_iter().for_each(|c| tx.push(Op::AddChain(t(), c)));
        self.flush_chains.into_iter().for_each(|c| tx.push(Op::FlushChain(t(), c)));
        self.delete_elements.into_iter().for_each(|e| tx.push(Op::DeleteElement(t(), e)));
        for (name, is_map) in self.flush_sets {
            tx.push(Op::FlushSet { table: t(), name, is_map });
        }
        for (name, is_map) in self.delete_sets {
            tx.push(Op::DeleteSet { table: t(), name, is_map });
        }
        self.add_sets.into_iter().for_each(|s| tx.push(Op::AddSet(t(), s)));
        for (chain, rules) in self.rules {
            tx.add_rules(table, &chain, rules);
        }
        self.add_elements.into_iter().for_each(|e| tx.push(Op::AddElement(t(), e)));
    }
}

fn plain(name: &str) -> Chain {
    Chain { name: name.to_owned(), hook: None }
}

/// The nftables dataplane.
#[derive(Debug)]
pub struct NftablesDataplane<E> {
    exec: E,
    config: Config,
    families: BTreeMap<IpFamily, FamilyState>,
    /// The tables are known to match `families` (false at start and after a failure).
    in_sync: bool,
}

impl<E: Executor> NftablesDataplane<E> {
    /// A dataplane that applies through `exec`. Nothing is applied until the first sync.
    pub fn new(exec: E, config: Config) -> Self {
        Self { exec, config, families: BTreeMap::new(), in_sync: false }
    }

    /// The executor (tests look at recorded transactions).
    pub fn executor(&self) -> &E {
        &self.exec
    }

    /// The executor, mutably (tests inject failures).
    pub fn executor_mut(&mut self) -> &mut E {
        &mut self.exec
    }

    /// The transaction a first full sync of `plan` applies: what `--dry-run` prints.
    pub fn render_initial(&self, plan: &Plan) -> Transaction {
        self.full_transaction(plan, true).0
    }

    /// Rewrites everything from `plan`: recreates the tables on the first sync and after a
    /// failure, reconciles in place otherwise (every `syncPeriod`).
    pub fn full_sync(&mut self, plan: &Plan) -> Result<SyncReport, SyncError> {
        let recreate = !self.in_sync;
        let (tx, families) = self.full_transaction(plan, recreate);
        let report = if recreate && tx.len() > self.config.cold_start_chunk_ops {
            self.apply_cold_start(tx)?
        } else {
            self.apply(tx, true)?
        };
        self.families = families;
        Ok(report)
    }

    /// Applies a large cold start as bounded transactions, in an order where nothing dangles.
    fn apply_cold_start(&mut self, tx: Transaction) -> Result<SyncReport, SyncError> {
        let report = SyncReport { full: true, ops: tx.len(), counts: tx.counts() };
        let parts = crate::chunk::split_cold_start(tx, self.config.cold_start_chunk_ops);
        let total = parts.len();
        let mut done = 0;
        // Each part is dropped once applied.
        for (i, part) in parts.into_iter().enumerate() {
            if let Err(e) = self.exec.apply(&part) {
                tracing::warn!(error = %e, part = i + 1, of = total, "nftables cold start failed; the next sync is a full resync");
                self.in_sync = false;
                return Err(e.into());
            }
            done += part.len();
            tracing::info!(
                part = i + 1,
                of = total,
                ops = done,
                total_ops = report.ops,
                "nftables cold start progress"
            );
        }
        self.in_sync = true;
        Ok(report)
    }

    /// Applies only what `delta` changed; `plan` is the new plan (used when something node-wide
    /// changed, or when a full sync is due because the last one failed).
    pub fn partial_sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<SyncReport, SyncError> {
        let node_changed = delta.families.values().any(|f| f.node.is_some());
        let families_changed = !plan.families.keys().eq(self.families.keys());
        if !self.in_sync || node_changed || families_changed {
            return self.full_sync(plan);
        }
        let mut tx = Transaction::new();
        let mut commits = Vec::new();
        for (family, state) in &self.families {
            let mut changes: Vec<(ServicePortName, Option<Arc<ServicePortPlan>>)> = Vec::new();
            if let Some(fd) = delta.families.get(family) {
                for p in fd.added.iter().chain(fd.changed.iter().map(|c| &c.new)) {
                    changes.push((p.name.clone(), Some(p.clone())));
                }
                changes.extend(fd.removed.iter().map(|p| (p.name.clone(), None)));
            }
            let (batch, commit) = diff_services(state, changes);
            batch.into_transaction(&state.ctx.table, &mut tx);
            commits.push((*family, commit));
        }
        let report = self.apply(tx, false)?;
        for (family, commit) in commits {
            if let Some(state) = self.families.get_mut(&family) {
                commit.apply_to(state);
            }
        }
        Ok(report)
    }

    /// Removes kproxy's tables (both families) and forgets the applied state.
    pub fn cleanup(&mut self) -> Result<(), ExecError> {
        self.exec.apply(&crate::cleanup::cleanup_transaction(&self.config.table))?;
        self.families.clear();
        self.in_sync = false;
        Ok(())
    }

    fn apply(&mut self, tx: Transaction, full: bool) -> Result<SyncReport, SyncError> {
        let report = SyncReport { full, ops: tx.len(), counts: tx.counts() };
        match self.exec.apply(&tx) {
            Ok(()) => {
                self.in_sync = true;
                Ok(report)
            }
            Err(e) => {
                tracing::warn!(error = %e, full, "nftables sync failed; the next sync is a full resync");
                self.in_sync = false;
                Err(e.into())
            }
        }
    }

    fn full_transaction(&self, plan: &Plan, recreate: bool) -> (Transaction, BTreeMap<IpFamily, FamilyState>) {
        let mut tx = Transaction::new();
        let mut families = BTreeMap::new();
        for (&family, fam) in &plan.families {
            let ctx = Ctx::new(family, &self.config.table, self.config.masquerade_mark);
            let (mut desired, objects) = FamilyState::desired(ctx, fam);
            let old = if recreate { None } else { self.families.get(&family) };
            let batch = full_batch(&mut desired, objects, old);
            batch.into_transaction(&desired.ctx.table, &mut tx);
            families.insert(family, desired);
        }
        // Families no longer planned lose their table.
        for family in IpFamily::BOTH.iter().filter(|f| !plan.families.contains_key(f)) {
            let ctx = Ctx::new(*family, &self.config.table, self.config.masquerade_mark);
            if recreate || self.families.contains_key(family) {
                tx.push(Op::AddTable { table: ctx.table.clone(), comment: None });
                tx.push(Op::DeleteTable(ctx.table));
            }
        }
        (tx, families)
    }
}

/// Everything for one family: recreate when `old` is `None`, else reconcile against it.
/// Records in `desired` the chains that become stale.
fn full_batch(
    desired: &mut FamilyState,
    objects: BTreeMap<ServicePortName, ServiceObjects>,
    old: Option<&FamilyState>,
) -> Batch {
    let ctx = desired.ctx.clone();
    let skel = skeleton::render(&ctx, &desired.node);
    let mut b = Batch::default();
    let comment = Some("rules for kproxy".to_owned());
    b.pre.push(Op::AddTable { table: ctx.table.clone(), comment: comment.clone() });
    if old.is_none() {
        b.pre.push(Op::DeleteTable(ctx.table.clone()));
        b.pre.push(Op::AddTable { table: ctx.table.clone(), comment });
    }
    let desired_chains: BTreeSet<String> = objects.values().flat_map(|s| s.chains.keys().cloned()).collect();
    let desired_sets: BTreeMap<String, SetDef> =
        objects.values().flat_map(|s| s.sets.iter().map(|(n, d)| (n.clone(), d.clone()))).collect();
    let old_objects: Vec<ServiceObjects> =
        old.iter().flat_map(|o| o.services.keys().map(|name| o.objects(name))).collect();
    let mut new_stale = BTreeSet::new();
    if let Some(old) = old {
        b.delete_chains.extend(old.stale_chains.iter().filter(|c| !desired_chains.contains(*c)).cloned());
        for (name, _) in &skel.chains {
            b.flush_chains.push(name.name.clone());
        }
        for s in &old_objects {
            for c in s.chains.keys() {
                b.flush_chains.push(c.clone());
                if !desired_chains.contains(c) {
                    new_stale.insert(c.clone());
                }
            }
            for (name, def) in &s.sets {
                if desired_sets.get(name).is_none_or(|d| d != def) {
                    b.delete_sets.push((name.clone(), false));
                }
            }
        }
        b.flush_chains.extend(old.stale_chains.iter().filter(|c| desired_chains.contains(*c)).cloned());
        b.flush_chains.sort();
        b.flush_chains.dedup();
        b.flush_sets.extend(skel.sets.iter().map(|s| (s.name.clone(), s.is_map())));
    }
    for (chain, rules) in &skel.chains {
        b.add_chains.push(chain.clone());
        b.rules.push((chain.name.clone(), rules.clone()));
    }
    b.add_sets.extend(skel.sets);
    b.add_elements.extend(skel.elements);
    for s in objects.into_values() {
        for (name, rules) in s.chains {
            b.add_chains.push(plain(&name));
            b.rules.push((name, rules));
        }
    }
    let old_sets: BTreeMap<&String, &SetDef> = old_objects.iter().flat_map(|s| s.sets.iter()).collect();
    for (name, def) in desired_sets {
        // An unchanged set is left alone: it holds live affinity entries.
        if old_sets.get(&name) != Some(&&def) {
            b.add_sets.push(def);
        }
    }
    b.add_elements.extend(desired.elements());
    desired.stale_chains = new_stale;
    b
}

/// State changes to make once a partial sync's transaction is applied.
#[derive(Debug, Default)]
struct Commit {
    services: Vec<(ServicePortName, Option<Arc<ServicePortPlan>>)>,
    owners: BTreeMap<ElementKey, Owners>,
    stale_chains: BTreeSet<String>,
}

impl Commit {
    fn apply_to(self, state: &mut FamilyState) {
        for (name, objects) in self.services {
            match objects {
                Some(o) => state.services.insert(name, o),
                None => state.services.remove(&name),
            };
        }
        for (key, owners) in self.owners {
            if owners.is_empty() {
                state.owners.remove(&key);
            } else {
                state.owners.insert(key, owners);
            }
        }
        state.stale_chains = self.stale_chains;
    }
}

/// The minimal batch that takes the named service ports from their applied objects to `changes`
/// (`None`: removed), plus deleting the chains the previous sync left stale.
fn diff_services(
    state: &FamilyState,
    changes: Vec<(ServicePortName, Option<Arc<ServicePortPlan>>)>,
) -> (Batch, Commit) {
    let mut b = Batch::default();
    let mut commit = Commit::default();
    let mut revived = BTreeSet::new();
    let mut before: BTreeMap<ElementKey, Option<Option<String>>> = BTreeMap::new();
    for (name, new) in &changes {
        let old = &state.objects(name);
        let new_ref = &new.as_ref().map(|p| service::render(&state.ctx, &state.node, p)).unwrap_or_default();
        let owner = owner_id(name);
        for (chain, rules) in &new_ref.chains {
            match old.chains.get(chain) {
                Some(r) if r == rules => continue,
                Some(_) => b.flush_chains.push(chain.clone()),
                None if state.stale_chains.contains(chain) => {
                    revived.insert(chain.clone());
                }
                None => b.add_chains.push(plain(chain)),
            }
            b.rules.push((chain.clone(), rules.clone()));
        }
        for chain in old.chains.keys().filter(|c| !new_ref.chains.contains_key(*c)) {
            b.flush_chains.push(chain.clone());
            commit.stale_chains.insert(chain.clone());
        }
        for (set, def) in &new_ref.sets {
            match old.sets.get(set) {
                Some(d) if d == def => {}
                Some(_) => {
                    b.delete_sets.push((set.clone(), false));
                    b.add_sets.push(def.clone());
                }
                None => b.add_sets.push(def.clone()),
            }
        }
        for set in old.sets.keys().filter(|s| !new_ref.sets.contains_key(*s)) {
            b.delete_sets.push((set.clone(), false));
        }
        let old_elems: BTreeSet<&Element> = old.elements.iter().collect();
        let new_elems: BTreeSet<&Element> = new_ref.elements.iter().collect();
        for (e, add) in old_elems
            .difference(&new_elems)
            .map(|e| (e, false))
            .chain(new_elems.difference(&old_elems).map(|e| (e, true)))
        {
            let key = (e.set.clone(), e.key.clone());
            before.entry(key.clone()).or_insert_with(|| effective(state.owners.get(&key)));
            let owners =
                commit.owners.entry(key.clone()).or_insert_with(|| state.owners.get(&key).cloned().unwrap_or_default());
            if add {
                add_owner(owners, &owner, e.value.clone());
            } else {
                remove_owner(owners, &owner);
            }
        }
    }
    for (key, was) in before {
        let now = effective(commit.owners.get(&key));
        if was == now {
            continue;
        }
        let (set, k) = key;
        if let Some(value) = was {
            b.delete_elements.push(Element { set: set.clone(), key: k.clone(), value });
        }
        if let Some(value) = now {
            b.add_elements.push(Element { set, key: k, value });
        }
    }
    b.delete_chains.extend(state.stale_chains.iter().filter(|c| !revived.contains(*c)).cloned());
    commit.services = changes;
    (b, commit)
}

impl<E: Executor + Send> kproxy_plan::Dataplane for NftablesDataplane<E> {
    fn full_sync(&mut self, plan: &Plan) -> Result<(), kproxy_plan::DataplaneError> {
        NftablesDataplane::full_sync(self, plan)?;
        Ok(())
    }

    fn partial_sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<(), kproxy_plan::DataplaneError> {
        NftablesDataplane::partial_sync(self, plan, delta)?;
        Ok(())
    }

    fn cleanup(&mut self) -> Result<(), kproxy_plan::DataplaneError> {
        NftablesDataplane::cleanup(self)?;
        Ok(())
    }
}

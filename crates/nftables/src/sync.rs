//! The nftables dataplane: keeps kproxy's tables exactly in line with the plan.
//!
//! The applied state lives in memory and is small: every service port's applied plan (shared
//! with the planner; its objects are rendered again when needed, never kept as text), the slot
//! each of its endpoints sits in where that is not the sorted order (see [`pick::Slots`]: an
//! endpoint keeps its slot while it stays, so a change in a Service of thousands of endpoints
//! is a few elements), who claims each destination, and how many service ports want each shared
//! element. A partial sync diffs the plan delta against it and emits only what changed, as one
//! atomic transaction — O(change), no listing of the kernel.
//!
//! The first sync builds the tables as a stream of bounded transactions rendered service by
//! service (so the whole cold start is never in memory), with the hooked base chains last: no
//! packet sees a half-built table. When kproxy's tables are already there (a restart, an
//! upgrade, the first sync after a failure), they are adopted instead, in one transaction, never
//! deleted first, so Services that did not change never stop answering: chains whose rules are
//! already what kproxy would write (rule count and the digest on their first rule, see
//! [`crate::digest`]) and sets that hold only wanted elements are left in place; the rest is
//! rewritten. The endpoint slots are read back from the endpoints maps first, so every endpoint
//! still there keeps its slot and a restart costs the changes made meanwhile, not every slot.
//!
//! Steady state costs O(change): the periodic check ([`NftablesDataplane::verify`]) asks the
//! kernel whether anyone committed since kproxy's last commit, lists kproxy's tables only if so,
//! and repairs only the chains and sets that differ (see [`crate::kernel`]). A full sync of an
//! in-sync dataplane applies the difference between the applied plan and the new one, and a
//! change of node-wide settings reconciles in one transaction that rewrites every chain and
//! static map in place but keeps the affinity set. Chains that go away are flushed in one sync
//! and deleted at the start of the next, in a transaction of their own (as upstream): older
//! kernels refuse to delete a chain in the transaction that drops the last reference to it, and
//! a failed deletion is a cleanup failure ([`NftablesDataplane::take_cleanup_failures`]) that the
//! next sync retries, not a failed sync.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use kproxy_plan::{NodePlan, Plan, PlanDelta, ServicePortName, ServicePortPlan};
use kproxy_state::IpFamily;

use kproxy_nft_model::{
    Chain, Element, ExecError, Executor, Op, OpCounts, Prepared, Rule, SetDef, SetFlag, TableRef, Transaction,
};

use crate::kernel::{Applied, Desired, Drift, Verification};
use crate::ruleset::pick::{self, Slots};
use crate::ruleset::service::{self, ServiceObjects, Shared};
use crate::ruleset::{Ctx, DEFAULT_MASQUERADE_MARK, Destination, TABLE_NAME, skeleton};

/// Dataplane settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Table name in both families.
    pub table: String,
    /// The masquerade mark (`1 << masqueradeBit`).
    pub masquerade_mark: u32,
    /// A cold start (first sync, or the first after a failure) is applied as transactions of at
    /// most this many operations.
    pub cold_start_chunk_ops: usize,
    /// Per-Service counters: the dispatch, no-endpoint and firewall maps count the new
    /// connections of each destination (see [`crate::counters`]).
    pub service_counters: bool,
}

/// Default bound on the operations of one cold-start transaction.
pub const DEFAULT_COLD_START_CHUNK_OPS: usize = 50_000;

impl Default for Config {
    fn default() -> Self {
        Self {
            table: TABLE_NAME.to_owned(),
            masquerade_mark: DEFAULT_MASQUERADE_MARK,
            cold_start_chunk_ops: DEFAULT_COLD_START_CHUNK_OPS,
            service_counters: false,
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

/// Who claims a destination, sorted by name: the first one's elements are in the table.
type Claimants = Vec<ServicePortName>;

/// What is in one family's table, as far as kproxy knows.
#[derive(Debug, Clone)]
struct FamilyState {
    ctx: Ctx,
    node: NodePlan,
    /// The applied plan of every service port (shared with the planner's plan).
    services: BTreeMap<ServicePortName, Arc<ServicePortPlan>>,
    /// The slots of the endpoints of every service port whose endpoints are not in their sorted
    /// order, numbering the endpoints of its plan in `services`.
    slots: HashMap<ServicePortName, Slots>,
    /// Every claimed destination.
    claims: HashMap<Destination, Claimants>,
    /// How many service ports want each shared element.
    shared: HashMap<Shared, u32>,
    /// Chains flushed by an earlier sync, to delete at the start of the next one.
    stale_chains: BTreeSet<String>,
}

fn claim(claimants: &mut Claimants, name: &ServicePortName) -> bool {
    match claimants.binary_search(name) {
        Ok(_) => false,
        Err(i) => {
            // Almost every destination has one claimant: room for exactly that many (a `Vec`
            // grows to four at its first push, 168 bytes per Service at 20k Services).
            claimants.reserve_exact(1);
            claimants.insert(i, name.clone());
            true
        }
    }
}

fn unclaim(claimants: &mut Claimants, name: &ServicePortName) {
    if let Ok(i) = claimants.binary_search(name) {
        claimants.remove(i);
    }
}

impl FamilyState {
    fn empty(ctx: Ctx, node: NodePlan) -> Self {
        FamilyState {
            ctx,
            node,
            services: BTreeMap::new(),
            slots: HashMap::new(),
            claims: HashMap::new(),
            shared: HashMap::new(),
            stale_chains: BTreeSet::new(),
        }
    }

    /// Renders the applied service port `name` (empty when there is none).
    fn objects(&self, name: &ServicePortName) -> ServiceObjects {
        self.services.get(name).map(|p| self.render(p, self.slots_of(name))).unwrap_or_default()
    }

    fn render(&self, p: &ServicePortPlan, slots: &Slots) -> ServiceObjects {
        service::render(&self.ctx, &self.node, p, slots)
    }

    /// [`FamilyState::objects`] without the endpoints-map elements (see
    /// [`service::render_without_endpoints`]).
    fn objects_without_endpoints(&self, name: &ServicePortName) -> ServiceObjects {
        self.services.get(name).map(|p| self.render_without_endpoints(p, self.slots_of(name))).unwrap_or_default()
    }

    fn render_without_endpoints(&self, p: &ServicePortPlan, slots: &Slots) -> ServiceObjects {
        service::render_without_endpoints(&self.ctx, &self.node, p, slots)
    }

    /// The applied plan of service port `name` with its endpoints' slots, if it is applied.
    fn picking(&self, name: &ServicePortName) -> Option<(&ServicePortPlan, &Slots)> {
        self.services.get(name).map(|p| (&**p, self.slots_of(name)))
    }

    /// The slots of the applied service port `name`'s endpoints.
    fn slots_of(&self, name: &ServicePortName) -> &Slots {
        static SORTED: Slots = Slots::sorted();
        self.slots.get(name).unwrap_or(&SORTED)
    }

    /// The slots `p`'s endpoints take when service port `name` goes to `p` from what is applied:
    /// those of its endpoints that stay are where they are.
    fn slots_following(&self, name: &ServicePortName, p: &ServicePortPlan) -> Slots {
        match self.services.get(name) {
            Some(applied) if **applied == *p => self.slots_of(name).clone(),
            Some(applied) => self.slots_of(name).follow(applied, p),
            None => Slots::sorted(),
        }
    }

    /// Records a service port, rendered as `objects` with its endpoints in `slots`, that is
    /// added in name order (a full sync) and moves what it puts in the table into `b`: its
    /// chains, the elements of the destinations it is first to claim, and the shared
    /// elements nobody wanted before.
    fn add_in_order(
        &mut self,
        name: &ServicePortName,
        plan: &Arc<ServicePortPlan>,
        slots: Slots,
        objects: ServiceObjects,
        b: &mut Batch,
    ) {
        self.services.insert(name.clone(), plan.clone());
        if !slots.is_sorted() {
            self.slots.insert(name.clone(), slots);
        }
        for (chain, rules) in objects.chains {
            b.add_chains.push(plain(&chain));
            b.rules.push((chain, rules));
        }
        for (dest, elements) in objects.destinations {
            let claimants = self.claims.entry(dest).or_default();
            claim(claimants, name);
            if claimants.len() == 1 {
                b.add_elements.extend(elements);
            }
        }
        for s in objects.shared {
            let count = self.shared.entry(s).or_default();
            *count += 1;
            if *count == 1 {
                b.add_elements.push(s.element());
            }
        }
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
    add_sets: Vec<SetDef>,
    rules: Vec<(String, Vec<Rule>)>,
    add_elements: Vec<Element>,
}

impl Batch {
    fn into_ops(self, table: &TableRef, out: &mut impl FnMut(Op)) {
        let t = || table.clone();
        self.pre.into_iter().for_each(&mut *out);
        self.delete_chains.into_iter().for_each(|c| out(Op::DeleteChain(t(), c)));
        self.add_chains.into_iter().for_each(|c| out(Op::AddChain(t(), c)));
        self.flush_chains.into_iter().for_each(|c| out(Op::FlushChain(t(), c)));
        self.delete_elements.into_iter().for_each(|e| out(Op::DeleteElement(t(), e)));
        for (name, is_map) in self.flush_sets {
            out(Op::FlushSet { table: t(), name, is_map });
        }
        self.add_sets.into_iter().for_each(|s| out(Op::AddSet(t(), s)));
        for (chain, rules) in self.rules {
            let mut comment = crate::digest::chain_comment(&rules);
            for rule in rules {
                out(Op::AddRule { table: t(), chain: chain.clone(), rule, comment: comment.take() });
            }
        }
        self.add_elements.into_iter().for_each(|e| out(Op::AddElement(t(), e)));
    }

    fn into_transaction(self, table: &TableRef, tx: &mut Transaction) {
        self.into_ops(table, &mut |op| tx.push(op));
    }
}

fn plain(name: &str) -> Chain {
    Chain { name: name.to_owned(), hook: None }
}

/// Collects operations into transactions of at most `max` operations and hands each full one
/// to the thread that applies them: a cold start never exists in memory as a whole. The first
/// is a tenth of that, so the kernel starts on it while the next is built. Once that thread has
/// stopped (a transaction failed), the rest is dropped unbuilt into transactions.
struct Chunks<E> {
    tx: Transaction,
    /// The bound of the transaction being collected.
    max: usize,
    /// The bound of those after the first.
    next_max: usize,
    ready: std::sync::mpsc::SyncSender<Prepared>,
    /// Transactions the applier is done with, dropped here: the thread that built them frees
    /// them, off the applier's path.
    applied: std::sync::mpsc::Receiver<Prepared>,
    applier_stopped: bool,
    executor: std::marker::PhantomData<fn() -> E>,
}

impl<E: Executor> Chunks<E> {
    fn new(
        max: usize,
        ready: std::sync::mpsc::SyncSender<Prepared>,
        applied: std::sync::mpsc::Receiver<Prepared>,
    ) -> Self {
        let next_max = max.max(1);
        Chunks {
            tx: Transaction::new(),
            max: (next_max / 10).max(1),
            next_max,
            ready,
            applied,
            applier_stopped: false,
            executor: std::marker::PhantomData,
        }
    }

    fn push(&mut self, op: Op) {
        if self.applier_stopped {
            return;
        }
        self.tx.push(op);
        if self.tx.len() >= self.max {
            self.flush();
        } else if self.tx.len().is_multiple_of(1024) {
            // Frees what the applier is done with soon, not after a whole transaction more.
            self.applied.try_iter().for_each(drop);
        }
    }

    fn flush(&mut self) {
        if self.tx.is_empty() || self.applier_stopped {
            return;
        }
        self.max = self.next_max;
        self.applied.try_iter().for_each(drop);
        // Encoded here (for the netlink executor) while the kernel applies the one before.
        let prepared = E::prepare(elements_last_by_set(std::mem::take(&mut self.tx)));
        self.applier_stopped = self.ready.send(prepared).is_err();
    }
}

/// `tx` with its element additions last, those of each set together (sets in the order they
/// first appear there): the executor sends a run of one set's elements as one message, and the
/// kernel looks the set up once per message. In a cold start's transaction nothing depends on
/// an element being added before another operation, and the whole is applied at once.
fn elements_last_by_set(tx: Transaction) -> Transaction {
    let mut out = Transaction::new();
    let mut sets: HashMap<(TableRef, String), usize> = HashMap::new();
    let mut elements: Vec<Vec<Op>> = Vec::new();
    for op in tx.into_ops() {
        match &op {
            Op::AddElement(table, e) => {
                let at = *sets.entry((table.clone(), e.set.clone())).or_insert_with(|| {
                    elements.push(Vec::new());
                    elements.len() - 1
                });
                elements[at].push(op);
            }
            _ => out.push(op),
        }
    }
    for op in elements.into_iter().flatten() {
        out.push(op);
    }
    out
}

/// The nftables dataplane.
#[derive(Debug)]
pub struct NftablesDataplane<E> {
    exec: E,
    config: Config,
    families: BTreeMap<IpFamily, FamilyState>,
    /// The tables are known to match `families` (false at start and after a failure).
    in_sync: bool,
    /// What the applied transactions left in the kernel.
    applied: Applied,
    /// Families whose stale chains could not be deleted since the last
    /// [`NftablesDataplane::take_cleanup_failures`].
    cleanup_failures: Vec<IpFamily>,
}

impl<E: Executor> NftablesDataplane<E> {
    /// A dataplane that applies through `exec`. Nothing is applied until the first sync.
    pub fn new(exec: E, config: Config) -> Self {
        Self {
            exec,
            config,
            families: BTreeMap::new(),
            in_sync: false,
            applied: Applied::default(),
            cleanup_failures: Vec::new(),
        }
    }

    /// The executor (tests look at recorded transactions).
    pub fn executor(&self) -> &E {
        &self.exec
    }

    /// The executor, mutably (tests inject failures).
    pub fn executor_mut(&mut self) -> &mut E {
        &mut self.exec
    }

    /// Everything a first full sync of `plan` applies, as one transaction: what `--dry-run`
    /// prints.
    pub fn render_initial(&self, plan: &Plan) -> Transaction {
        let mut whole = Transaction::new();
        cold_start(&self.config, plan, sorted_slots, &mut |op| whole.push(op));
        whole
    }

    /// Makes the kernel match `plan`: builds or adopts the tables on the first sync and after a
    /// failure; otherwise applies what differs from the applied plan (a node-wide change
    /// reconciles every chain in place) and checks the kernel.
    pub fn full_sync(&mut self, plan: &Plan) -> Result<SyncReport, SyncError> {
        if !self.in_sync {
            return self.start(plan);
        }
        let node_changed = plan.families.iter().any(|(f, fam)| self.families.get(f).is_none_or(|s| s.node != fam.node));
        if node_changed || !plan.families.keys().eq(self.families.keys()) {
            let mut tx = Transaction::new();
            let families = reconcile(&self.config, plan, &self.families, &mut |op| tx.push(op));
            let report = self.apply(tx, true)?;
            self.families = families;
            return Ok(report);
        }
        let changes = self.families.iter().map(|(family, state)| {
            let services = plan.families.get(family).map(|f| &f.services);
            (*family, changed_services(&state.services, services))
        });
        let changes: Vec<_> = changes.collect();
        let mut report = self.apply_changes(changes, &BTreeMap::new(), true)?;
        // The applied plan was right; check the kernel still holds it.
        if let Verification::Repaired(_) = self.verify(plan)? {
            report.full = true;
        }
        Ok(report)
    }

    /// The first sync, or the first after a failure: adopts kproxy's tables if they are there,
    /// else builds them.
    fn start(&mut self, plan: &Plan) -> Result<SyncReport, SyncError> {
        let tables: Vec<TableRef> = plan.families.keys().map(|f| ctx(&self.config, *f).table).collect();
        // Adoption reads the elements it keeps set by set; counting them here would dump every
        // set twice.
        let mut listed = crate::kernel::list_all_without_elements(&mut self.exec, tables.iter().cloned());
        // Another program committing without a pause can keep every listing from being one
        // ruleset. Wait a little for a quiet moment rather than build afresh: a cold start
        // deletes the tables, and with them the affinity sets and counters adoption keeps.
        for _ in 0..START_LISTING_RETRIES {
            match &listed {
                Err(ExecError::Netlink(e)) if e.kind() == std::io::ErrorKind::Interrupted => {
                    std::thread::sleep(START_LISTING_PAUSE);
                    listed = crate::kernel::list_all_without_elements(&mut self.exec, tables.iter().cloned());
                }
                _ => break,
            }
        }
        let existing = match listed {
            Ok(Some(listings)) => listings.into_iter().filter(|(_, l)| !l.chains.is_empty()).collect(),
            Ok(None) => BTreeMap::new(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot list kproxy's tables; building them afresh");
                BTreeMap::new()
            }
        };
        if existing.is_empty() {
            return self.cold_start(plan);
        }
        match self.adopt(plan, &existing) {
            Ok(report) => Ok(report),
            Err(e) => {
                tracing::warn!(error = %e, "adopting kproxy's tables failed; rebuilding them");
                self.cold_start(plan)
            }
        }
    }

    /// Takes over the tables a previous kproxy (or a failed sync) left, in one transaction.
    fn adopt(
        &mut self,
        plan: &Plan,
        existing: &BTreeMap<TableRef, kproxy_nft_model::TableListing>,
    ) -> Result<SyncReport, SyncError> {
        let mut desired: BTreeMap<TableRef, Desired> = BTreeMap::new();
        let mut tx = Transaction::new();
        let mut passthrough = Vec::new();
        // Every endpoint the kernel holds keeps its slot.
        let mut held = BTreeMap::new();
        let mut read = BTreeMap::new();
        for &family in plan.families.keys() {
            let ctx = ctx(&self.config, family);
            if let Some(listing) = existing.get(&ctx.table) {
                let (slots, identities) = read_slots(&mut self.exec, &ctx, listing);
                held.insert(family, slots);
                read.insert(ctx.table, identities);
            }
        }
        let slots_of = |family: IpFamily, _: &ServicePortName, p: &ServicePortPlan| {
            held.get(&family).map_or_else(Slots::sorted, |held| Slots::adopt(p, held))
        };
        // The summary of an adopted table is what a cold start leaves (the rewrite's flushes
        // and re-adds do not add up to it): followed in the same pass.
        let mut after = kproxy_nft_model::Listings::default();
        let families = cold_start(&self.config, plan, slots_of, &mut |op| {
            after.apply_op(&op);
            let table = match &op {
                Op::AddChain(t, _) | Op::AddSet(t, _) | Op::AddElement(t, _) | Op::AddRule { table: t, .. } => {
                    t.clone()
                }
                // The cold start's own table creation and deletion: adoption declares the tables itself.
                Op::AddTable { .. } | Op::DeleteTable(_) => {
                    passthrough.push(op);
                    return;
                }
                _ => return,
            };
            desired.entry(table.clone()).or_default().collect(&table, op);
        });
        // Tables of families no longer planned are deleted as the cold start would.
        let planned: BTreeSet<TableRef> = desired.keys().cloned().collect();
        let mut dropped = BTreeSet::new();
        for op in passthrough {
            if let Op::DeleteTable(t) = &op
                && !planned.contains(t)
                && dropped.insert(t.clone())
            {
                tx.push(Op::AddTable { table: t.clone(), comment: None });
                tx.push(op);
            }
        }
        let empty = kproxy_nft_model::TableListing::default();
        let (mut kept_elements, mut kept_chains) = (0, 0);
        for (table, mut d) in desired {
            let current = existing.get(&table).unwrap_or(&empty);
            let read = read.remove(&table).unwrap_or_default();
            let (unflushed, kept) = crate::kernel::keep_present_elements(&mut self.exec, &table, &mut d, current, read);
            kept_elements += kept;
            kept_chains +=
                crate::kernel::adopt_ops(&table, Some(TABLE_COMMENT.to_owned()), d, current, &unflushed, &mut tx);
        }
        let report = SyncReport { full: true, ops: tx.len(), counts: tx.counts() };
        // What kproxy's own commits leave is known from here on (see `Applied`).
        self.applied.generation = self.exec.generation().ok().flatten();
        match self.applied.apply(&mut self.exec, &tx) {
            Ok(()) => {
                tracing::info!(
                    ops = report.ops,
                    kept_chains,
                    kept_elements,
                    tables = existing.len(),
                    "nftables tables adopted in one transaction"
                );
                self.applied.listings = after;
                self.families = families;
                self.in_sync = true;
                Ok(report)
            }
            Err(e) => {
                self.in_sync = false;
                Err(e.into())
            }
        }
    }

    /// Builds the tables as a stream of bounded transactions, base chains last. The next
    /// transaction is built and encoded on a thread of its own while the kernel applies the
    /// current one (at 100k Services, the builder was busy 1.1 s of the applier's 2.0 s:
    /// docs/benchmarks.md).
    fn cold_start(&mut self, plan: &Plan) -> Result<SyncReport, SyncError> {
        // The cold start decides everything its tables hold: the generation before it is as
        // good a starting point as one a check established.
        self.applied.generation = self.exec.generation().ok().flatten();
        let (config, exec, applied) = (&self.config, &mut self.exec, &mut self.applied);
        let outcome = std::thread::scope(|scope| {
            // A rendezvous: at most one transaction waits while another is being applied.
            let (ready, built) = std::sync::mpsc::sync_channel::<Prepared>(0);
            let (done, applied_txs) = std::sync::mpsc::channel::<Prepared>();
            let builder = std::thread::Builder::new().name("kproxy-nft-build".into()).spawn_scoped(scope, move || {
                let mut chunks = Chunks::<E>::new(config.cold_start_chunk_ops, ready, applied_txs);
                let families = cold_start(config, plan, sorted_slots, &mut |op| chunks.push(op));
                chunks.flush();
                families
            });
            let builder = match builder {
                Ok(builder) => builder,
                Err(source) => {
                    let program = "the cold start's builder thread".to_owned();
                    return Err(ExecError::Spawn { program, source });
                }
            };
            let mut report = SyncReport { full: true, ops: 0, counts: OpCounts::default() };
            let mut parts = 0;
            let mut outcome = Ok(());
            for mut prepared in built.iter() {
                parts += 1;
                let started = std::time::Instant::now();
                if let Err(e) = applied.apply_prepared(exec, &mut prepared) {
                    outcome = Err(e);
                    break;
                }
                let apply_ms = started.elapsed().as_secs_f64() * 1e3;
                tracing::debug!(part = parts, ops = prepared.tx.len(), apply_ms, "nftables cold start progress");
                report.ops += prepared.tx.len();
                report.counts += prepared.tx.counts();
                // Dropped by the builder; here once it has finished.
                let _ = done.send(prepared);
            }
            // Stops the builder at its next transaction if one failed.
            drop(built);
            let families = builder.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            outcome.map(|()| (report, parts, families))
        });
        match outcome {
            Ok((report, parts, families)) => {
                tracing::info!(transactions = parts, ops = report.ops, "nftables cold start applied");
                self.families = families;
                self.in_sync = true;
                Ok(report)
            }
            Err(e) => {
                tracing::warn!(error = %e, "nftables cold start failed; the next sync is a full resync");
                self.in_sync = false;
                Err(e.into())
            }
        }
    }

    /// Deletes the chains earlier syncs flushed, in a transaction of their own. A failure is
    /// recorded for [`Self::take_cleanup_failures`] and the chains stay stale: the next sync
    /// tries again, and they do no harm meanwhile (they are empty and nothing jumps to them).
    fn delete_stale_chains(&mut self) {
        let mut tx = Transaction::new();
        for state in self.families.values() {
            for chain in &state.stale_chains {
                tx.push(Op::DeleteChain(state.ctx.table.clone(), chain.clone()));
            }
        }
        if tx.is_empty() {
            return;
        }
        match self.applied.apply(&mut self.exec, &tx) {
            Ok(()) => self.families.values_mut().for_each(|s| s.stale_chains.clear()),
            Err(e) => {
                tracing::warn!(error = %e, "deleting stale nftables chains failed; the next sync retries");
                let failed = self.families.iter().filter(|(_, s)| !s.stale_chains.is_empty()).map(|(f, _)| *f);
                self.cleanup_failures.extend(failed);
            }
        }
    }

    /// The families whose stale chains could not be deleted since the last call, once per
    /// failed attempt (`kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total`).
    pub fn take_cleanup_failures(&mut self) -> Vec<IpFamily> {
        std::mem::take(&mut self.cleanup_failures)
    }

    /// Checks that the kernel still holds what kproxy applied (see [`crate::kernel`]) and
    /// repairs the chains and sets that differ.
    pub fn verify(&mut self, plan: &Plan) -> Result<Verification, SyncError> {
        if !self.in_sync {
            self.full_sync(plan)?;
            return Ok(Verification::Repaired(vec!["the tables were out of sync".to_owned()]));
        }
        let generation = self.exec.generation().ok().flatten();
        if generation.is_some() && generation == self.applied.generation {
            return Ok(Verification::Untouched);
        }
        let tables: Vec<TableRef> = self.families.values().map(|s| s.ctx.table.clone()).collect();
        let actual = match crate::kernel::list_all(&mut self.exec, tables) {
            Ok(Some(actual)) => actual,
            Ok(None) => return Ok(Verification::Unverifiable),
            // The listing retried as often as it does; the kernel never held still.
            Err(ExecError::Netlink(e)) if e.kind() == std::io::ErrorKind::Interrupted => {
                return Ok(Verification::Busy);
            }
            Err(e) => return Err(e.into()),
        };
        let mut drifted = Vec::new();
        let mut lines = Vec::new();
        for (table, listing) in &actual {
            let expected = self.applied.listings.get(table);
            let drift = Drift::between(listing, &expected);
            if !drift.is_empty() {
                let gone = listing.chains.is_empty();
                if gone {
                    // One line, not one per chain and set it held.
                    lines.push(format!("{table}: the table is gone"));
                } else {
                    lines.extend(listing.drift(&expected).into_iter().map(|l| format!("{table}: {l}")));
                }
                drifted.push((table.clone(), gone, drift));
            }
        }
        if drifted.is_empty() {
            self.applied.generation = generation;
            return Ok(Verification::Clean);
        }
        // The caller reports the repair (with the drift it is handed back).
        tracing::debug!(drift = ?lines, "kproxy's nftables tables were changed by someone else; repairing");
        if drifted.iter().any(|(_, gone, _)| *gone) {
            // A table is gone: nothing to repair piecemeal.
            self.in_sync = false;
            self.full_sync(plan)?;
            return Ok(Verification::Repaired(lines));
        }
        let mut desired: BTreeMap<TableRef, Desired> = BTreeMap::new();
        // The endpoints stay in the slots the applied state says they are in.
        let families = &self.families;
        let slots_of = |family: IpFamily, name: &ServicePortName, p: &ServicePortPlan| {
            families.get(&family).map_or_else(Slots::sorted, |state| state.slots_following(name, p))
        };
        cold_start(&self.config, plan, slots_of, &mut |op| {
            if let Op::AddChain(t, _) | Op::AddSet(t, _) | Op::AddElement(t, _) | Op::AddRule { table: t, .. } = &op {
                let t = t.clone();
                if drifted.iter().any(|(d, _, _)| *d == t) {
                    desired.entry(t.clone()).or_default().collect(&t, op);
                }
            }
        });
        let mut tx = Transaction::new();
        for (table, _, drift) in &drifted {
            crate::kernel::repair_ops(table, desired.remove(table).unwrap_or_default(), drift, &mut tx);
        }
        let expected = self.applied.listings.clone();
        if let Err(e) = self.applied.apply(&mut self.exec, &tx) {
            tracing::warn!(error = %e, "repairing kproxy's nftables tables failed; the next sync rebuilds them");
            self.in_sync = false;
            return Err(e.into());
        }
        // The repair restores what was applied: the summary stays what it was.
        self.applied.listings = expected;
        Ok(Verification::Repaired(lines))
    }

    /// Applies only what `delta` changed; `plan` is the new plan (used when something node-wide
    /// changed, or when a full sync is due because the last one failed).
    pub fn partial_sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<SyncReport, SyncError> {
        let nodes: Vec<(IpFamily, &NodePlan)> =
            delta.families.iter().filter_map(|(f, fd)| Some((*f, fd.node.as_ref()?))).collect();
        // A node address that `nodePortAddresses` selects came or went: the `nodeport-ips`
        // elements, not every chain rewritten.
        let addresses_only = nodes.iter().all(|(family, node)| {
            self.families.get(family).is_some_and(|state| state.node.nodeport_addresses_change(node).is_some())
        });
        let families_changed = !plan.families.keys().eq(self.families.keys());
        if !self.in_sync || !addresses_only || families_changed {
            return self.full_sync(plan);
        }
        let changes = self.families.keys().map(|family| {
            let mut changes: Vec<(ServicePortName, Option<Arc<ServicePortPlan>>)> = Vec::new();
            if let Some(fd) = delta.families.get(family) {
                for p in fd.added.iter().chain(fd.changed.iter().map(|c| &c.new)) {
                    changes.push((p.name.clone(), Some(p.clone())));
                }
                changes.extend(fd.removed.iter().map(|p| (p.name.clone(), None)));
            }
            (*family, changes)
        });
        let changes: Vec<_> = changes.collect();
        let nodes: BTreeMap<IpFamily, NodePlan> = nodes.into_iter().map(|(f, n)| (f, n.clone())).collect();
        self.apply_changes(changes, &nodes, false)
    }

    /// Applies the changed service ports of each family as one transaction, after deleting the
    /// chains earlier syncs left stale; with each family's `nodeport-ips` taken to its entry in
    /// `nodes` (which differs from the applied node-wide settings in those addresses alone).
    fn apply_changes(
        &mut self,
        changes: Vec<(IpFamily, Changes)>,
        nodes: &BTreeMap<IpFamily, NodePlan>,
        full: bool,
    ) -> Result<SyncReport, SyncError> {
        self.delete_stale_chains();
        let mut tx = Transaction::new();
        let mut commits = Vec::new();
        for (family, changes) in changes {
            let Some(state) = self.families.get(&family) else { continue };
            let (mut batch, commit) = diff_services(state, changes);
            if let Some((gone, added)) = nodes.get(&family).and_then(|node| state.node.nodeport_addresses_change(node))
            {
                let element = |ip: IpAddr| Element::new(skeleton::NODEPORT_IPS, kproxy_nft_model::Value::Addr(ip));
                batch.delete_elements.extend(gone.into_iter().map(element));
                batch.add_elements.extend(added.into_iter().map(element));
            }
            batch.into_transaction(&state.ctx.table, &mut tx);
            commits.push((family, commit));
        }
        let report = self.apply(tx, full)?;
        for (family, commit) in commits {
            if let Some(state) = self.families.get_mut(&family) {
                commit.apply_to(state);
                if let Some(node) = nodes.get(&family) {
                    state.node = node.clone();
                }
            }
        }
        Ok(report)
    }

    /// Removes kproxy's tables (both families) and forgets the applied state.
    pub fn cleanup(&mut self) -> Result<(), ExecError> {
        self.applied.apply(&mut self.exec, &crate::cleanup::cleanup_transaction(&self.config.table))?;
        self.families.clear();
        self.in_sync = false;
        Ok(())
    }

    fn apply(&mut self, tx: Transaction, full: bool) -> Result<SyncReport, SyncError> {
        let report = SyncReport { full, ops: tx.len(), counts: tx.counts() };
        match self.applied.apply(&mut self.exec, &tx) {
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
}

/// The tables the dataplane configured by `config` owns, one per family.
pub fn tables(config: &Config) -> Vec<TableRef> {
    IpFamily::BOTH.iter().map(|f| ctx(config, *f).table).collect()
}

pub(crate) fn ctx(config: &Config, family: IpFamily) -> Ctx {
    Ctx { service_counters: config.service_counters, ..Ctx::new(family, &config.table, config.masquerade_mark) }
}

/// A family's skeleton split into what goes first (sets, regular chains and their rules, node
/// elements) and what goes last (the hooked base chains and their rules).
fn skeleton_batches(ctx: &Ctx, node: &NodePlan) -> (Batch, Batch) {
    let skel = skeleton::render(ctx, node);
    let mut first = Batch::default();
    let mut last = Batch::default();
    for (chain, rules) in skel.chains {
        let b = if chain.hook.is_some() { &mut last } else { &mut first };
        b.rules.push((chain.name.clone(), rules));
        b.add_chains.push(chain);
    }
    first.add_sets = skel.sets;
    first.add_elements = skel.elements;
    (first, last)
}

fn drop_unplanned_families(config: &Config, plan: &Plan, out: &mut impl FnMut(Op), was: impl Fn(IpFamily) -> bool) {
    for family in IpFamily::BOTH.into_iter().filter(|f| !plan.families.contains_key(f) && was(*f)) {
        let table = ctx(config, family).table;
        out(Op::AddTable { table: table.clone(), comment: None });
        out(Op::DeleteTable(table));
    }
}

const TABLE_COMMENT: &str = "rules for kproxy";

/// How many more times the start lists kproxy's tables when another program kept committing
/// through every attempt of a listing, and the pause before each.
const START_LISTING_RETRIES: usize = 10;
const START_LISTING_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// For a cold start: every service port's endpoints in their sorted order.
fn sorted_slots(_: IpFamily, _: &ServicePortName, _: &ServicePortPlan) -> Slots {
    Slots::sorted()
}

/// What the endpoints maps of `listing` (a table kproxy's dataplane in `ctx` left) hold: the
/// endpoint in each slot, and the identities of those maps' elements for
/// [`crate::kernel::keep_present_elements`] (each map is dumped once). A map that cannot be
/// read holds no slot (its endpoints are numbered afresh) and is dumped again there.
fn read_slots<E: Executor>(
    exec: &mut E,
    ctx: &Ctx,
    listing: &kproxy_nft_model::TableListing,
) -> (pick::HeldSlots, BTreeMap<String, BTreeSet<Vec<u8>>>) {
    let mut held = pick::HeldSlots::default();
    let mut identities = BTreeMap::new();
    let mut unread = 0;
    for (class, def) in pick::endpoints_maps(ctx).into_iter().filter(|(_, d)| listing.sets.contains_key(&d.name)) {
        let elements = match exec.elements(&ctx.table, &def) {
            Ok(Some(elements)) => elements,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(error = %e, map = def.name, "cannot read an endpoints map; its endpoints take new slots");
                continue;
            }
        };
        unread += held.add(class, &elements);
        if let Some(ids) = elements.iter().map(|e| exec.element_identity(e)).collect::<Option<BTreeSet<_>>>() {
            identities.insert(def.name, ids);
        }
    }
    tracing::debug!(table = %ctx.table, slots = held.len(), unread, "endpoint slots read back");
    (held, identities)
}

/// Emits the operations that recreate the tables for `plan`, service by service, with the base
/// chains last; returns the resulting state. `slots` says which slot each service port's
/// endpoints take.
fn cold_start(
    config: &Config,
    plan: &Plan,
    slots: impl Fn(IpFamily, &ServicePortName, &ServicePortPlan) -> Slots,
    out: &mut impl FnMut(Op),
) -> BTreeMap<IpFamily, FamilyState> {
    let mut states = BTreeMap::new();
    let mut hooks = Vec::new();
    drop_unplanned_families(config, plan, out, |_| true);
    for (&family, fam) in &plan.families {
        let ctx = ctx(config, family);
        let table = ctx.table.clone();
        let comment = Some(TABLE_COMMENT.to_owned());
        out(Op::AddTable { table: table.clone(), comment: comment.clone() });
        out(Op::DeleteTable(table.clone()));
        out(Op::AddTable { table: table.clone(), comment });
        let (first, last) = skeleton_batches(&ctx, &fam.node);
        first.into_ops(&table, out);
        hooks.push((table, last));
        states.insert(family, FamilyState::empty(ctx, fam.node.clone()));
    }
    for (family, fam) in &plan.families {
        let Some(state) = states.get_mut(family) else { continue };
        let table = state.ctx.table.clone();
        for (name, p) in &fam.services {
            let mut b = Batch::default();
            let slots = slots(*family, name, p);
            let objects = state.render(p, &slots);
            state.add_in_order(name, p, slots, objects, &mut b);
            b.into_ops(&table, out);
        }
    }
    for (table, last) in hooks {
        last.into_ops(&table, out);
    }
    states
}

/// Emits one transaction's operations that take the tables from `old` to `plan` in place: every
/// chain and static set is rewritten, the affinity set is kept (it holds live entries). Returns
/// the resulting state.
fn reconcile(
    config: &Config,
    plan: &Plan,
    old: &BTreeMap<IpFamily, FamilyState>,
    out: &mut impl FnMut(Op),
) -> BTreeMap<IpFamily, FamilyState> {
    let mut states = BTreeMap::new();
    drop_unplanned_families(config, plan, out, |f| old.contains_key(&f));
    for (&family, fam) in &plan.families {
        let ctx = ctx(config, family);
        let table = ctx.table.clone();
        // Every static set is flushed and refilled: the endpoints take their sorted slots.
        let mut state = FamilyState::empty(ctx.clone(), fam.node.clone());
        let objects: Vec<(&ServicePortName, &Arc<ServicePortPlan>, ServiceObjects)> =
            fam.services.iter().map(|(name, p)| (name, p, state.render(p, &Slots::sorted()))).collect();
        let desired_chains: BTreeSet<&String> = objects.iter().flat_map(|(_, _, o)| o.chains.keys()).collect();
        let old_state = old.get(&family);
        let mut old_chains: BTreeSet<String> = BTreeSet::new();
        if let Some(o) = old_state {
            for name in o.services.keys() {
                old_chains.extend(o.objects(name).chains.into_keys());
            }
        }

        let mut pre = Batch::default();
        pre.pre.push(Op::AddTable { table: table.clone(), comment: Some(TABLE_COMMENT.to_owned()) });
        let skel = skeleton::render(&ctx, &fam.node);
        pre.flush_chains.extend(skel.chains.iter().map(|(c, _)| c.name.clone()));
        // The affinity set is left alone: it holds live entries.
        pre.flush_sets
            .extend(skel.sets.iter().filter(|s| !s.has(SetFlag::Dynamic)).map(|s| (s.name.clone(), s.is_map())));
        let mut new_stale = BTreeSet::new();
        if let Some(o) = old_state {
            pre.delete_chains.extend(o.stale_chains.iter().filter(|c| !desired_chains.contains(c)).cloned());
            pre.flush_chains.extend(o.stale_chains.iter().filter(|c| desired_chains.contains(c)).cloned());
            for chain in old_chains {
                if !desired_chains.contains(&chain) {
                    new_stale.insert(chain.clone());
                }
                pre.flush_chains.push(chain);
            }
        }
        pre.flush_chains.sort();
        pre.flush_chains.dedup();
        pre.into_ops(&table, out);

        let (first, last) = skeleton_batches(&ctx, &fam.node);
        first.into_ops(&table, out);
        for (name, p, o) in objects {
            let mut b = Batch::default();
            state.add_in_order(name, p, Slots::sorted(), o, &mut b);
            b.into_ops(&table, out);
        }
        last.into_ops(&table, out);
        state.stale_chains = new_stale;
        states.insert(family, state);
    }
    states
}

/// Service ports to bring to a new plan (`None`: removed).
type Changes = Vec<(ServicePortName, Option<Arc<ServicePortPlan>>)>;

/// The service ports whose plan differs between `applied` and `planned`.
fn changed_services(
    applied: &BTreeMap<ServicePortName, Arc<ServicePortPlan>>,
    planned: Option<&BTreeMap<ServicePortName, Arc<ServicePortPlan>>>,
) -> Changes {
    let empty = BTreeMap::new();
    let planned = planned.unwrap_or(&empty);
    let mut out: Changes = planned
        .iter()
        .filter(|(name, p)| applied.get(*name).is_none_or(|a| !Arc::ptr_eq(a, p) && a != *p))
        .map(|(name, p)| (name.clone(), Some(p.clone())))
        .collect();
    out.extend(applied.keys().filter(|n| !planned.contains_key(*n)).map(|n| (n.clone(), None)));
    out
}

/// State changes to make once a partial sync's transaction is applied.
#[derive(Debug, Default)]
struct Commit {
    services: Vec<(ServicePortName, Option<Arc<ServicePortPlan>>)>,
    /// The slots of each changed service port's endpoints (removed ones have none).
    slots: Vec<(ServicePortName, Slots)>,
    claims: BTreeMap<Destination, Claimants>,
    shared: BTreeMap<Shared, u32>,
    stale_chains: BTreeSet<String>,
}

impl Commit {
    fn apply_to(self, state: &mut FamilyState) {
        for (name, plan) in self.services {
            match plan {
                Some(p) => state.services.insert(name.clone(), p),
                None => state.services.remove(&name),
            };
            state.slots.remove(&name);
        }
        for (name, slots) in self.slots {
            if !slots.is_sorted() {
                state.slots.insert(name, slots);
            }
        }
        for (dest, claimants) in self.claims {
            if claimants.is_empty() {
                state.claims.remove(&dest);
            } else {
                state.claims.insert(dest, claimants);
            }
        }
        for (s, count) in self.shared {
            if count == 0 {
                state.shared.remove(&s);
            } else {
                state.shared.insert(s, count);
            }
        }
        state.stale_chains = self.stale_chains;
    }
}

/// One changed service port in [`diff_services`]: its objects before and after (without the
/// endpoints-map elements, compared slot by slot instead), and its new plan and slots.
struct Rendered {
    old: ServiceObjects,
    new: ServiceObjects,
    plan: Option<Arc<ServicePortPlan>>,
    slots: Slots,
}

/// The minimal batch that takes the named service ports from their applied plans to `changes`
/// (`None`: removed). Chains left stale by earlier syncs stay stale unless a service port takes
/// them back. O(the changed service ports' objects), plus a comparison slot by slot of their
/// endpoints: one endpoint replaced in a Service of thousands builds two elements.
fn diff_services(
    state: &FamilyState,
    changes: Vec<(ServicePortName, Option<Arc<ServicePortPlan>>)>,
) -> (Batch, Commit) {
    let mut b = Batch::default();
    let mut commit = Commit::default();
    let mut revived = BTreeSet::new();
    // Both renderings of every changed service port: the elements of a destination are those
    // of its first claimant, before and after.
    let mut rendered: BTreeMap<ServicePortName, Rendered> = BTreeMap::new();
    for (name, new) in &changes {
        let old = state.objects_without_endpoints(name);
        let (objects, slots) = match new {
            Some(p) => {
                // The endpoints that stay keep their slots.
                let slots = state.slots_following(name, p);
                (state.render_without_endpoints(p, &slots), slots)
            }
            None => (ServiceObjects::default(), Slots::sorted()),
        };
        rendered.insert(name.clone(), Rendered { old, new: objects, plan: new.clone(), slots });
    }

    for (name, Rendered { old, new, .. }) in &rendered {
        for (chain, rules) in &new.chains {
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
        for chain in old.chains.keys().filter(|c| !new.chains.contains_key(*c)) {
            b.flush_chains.push(chain.clone());
            commit.stale_chains.insert(chain.clone());
        }
        for dest in old.destinations.keys().chain(new.destinations.keys()) {
            let claimants =
                commit.claims.entry(*dest).or_insert_with(|| state.claims.get(dest).cloned().unwrap_or_default());
            if new.destinations.contains_key(dest) {
                claim(claimants, name);
            } else {
                unclaim(claimants, name);
            }
        }
        for s in old.shared.symmetric_difference(&new.shared) {
            let count = commit.shared.entry(*s).or_insert_with(|| state.shared.get(s).copied().unwrap_or(0));
            if new.shared.contains(s) {
                *count += 1;
            } else {
                *count = count.saturating_sub(1);
            }
        }
    }

    // The first claimants of the destinations whose claims changed that did not change
    // themselves, rendered once.
    let mut unchanged: BTreeMap<&ServicePortName, ServiceObjects> = BTreeMap::new();
    for (dest, claimants) in &commit.claims {
        for name in state.claims.get(dest).and_then(|c| c.first()).into_iter().chain(claimants.first()) {
            if !rendered.contains_key(name) && !unchanged.contains_key(name) {
                unchanged.insert(name, state.objects_without_endpoints(name));
            }
        }
    }
    // The elements a destination has in the table, given its first claimant (sorted), but for
    // the endpoints-map elements.
    let elements_of = |dest: &Destination, claimant: Option<&ServicePortName>, after: bool| -> &[Element] {
        let Some(name) = claimant else { return &[] };
        let objects = match rendered.get(name) {
            Some(r) => Some(if after { &r.new } else { &r.old }),
            None => unchanged.get(name),
        };
        objects.and_then(|o| o.destinations.get(dest)).map_or(&[], Vec::as_slice)
    };
    // A claimant's endpoints in their slots, before or after.
    let picking = |claimant: Option<&ServicePortName>, after: bool| -> Option<(&ServicePortPlan, &Slots)> {
        let name = claimant?;
        match rendered.get(name) {
            Some(r) if after => r.plan.as_deref().map(|p| (p, &r.slots)),
            _ => state.picking(name),
        }
    };
    for (dest, claimants) in &commit.claims {
        let (gone, new) = (b.delete_elements.len(), b.add_elements.len());
        let (first_before, first_after) = (state.claims.get(dest).and_then(|c| c.first()), claimants.first());
        let before = elements_of(dest, first_before, false);
        let after = elements_of(dest, first_after, true);
        difference(before, after, &mut b.delete_elements, &mut b.add_elements);
        pick::endpoint_elements_difference(
            *dest,
            picking(first_before, false),
            picking(first_after, true),
            &mut b.delete_elements,
            &mut b.add_elements,
        );
        // Each destination's elements in order, as a whole rendering's difference has them.
        b.delete_elements[gone..].sort();
        b.add_elements[new..].sort();
    }
    for (s, count) in &commit.shared {
        let was = state.shared.get(s).copied().unwrap_or(0);
        if was > 0 && *count == 0 {
            b.delete_elements.push(s.element());
        } else if was == 0 && *count > 0 {
            b.add_elements.push(s.element());
        }
    }
    commit.stale_chains.extend(state.stale_chains.iter().filter(|c| !revived.contains(*c)).cloned());
    commit.slots = rendered.into_iter().filter(|(_, r)| r.plan.is_some()).map(|(name, r)| (name, r.slots)).collect();
    commit.services = changes;
    (b, commit)
}

/// Moves what differs between two sorted lists of elements: those only in `before` into `gone`,
/// those only in `after` into `new`. Linear: a destination of a big Service has thousands.
fn difference(before: &[Element], after: &[Element], gone: &mut Vec<Element>, new: &mut Vec<Element>) {
    let (mut b, mut a) = (before.iter().peekable(), after.iter().peekable());
    loop {
        match (b.peek(), a.peek()) {
            (Some(x), Some(y)) => match x.cmp(y) {
                std::cmp::Ordering::Less => gone.extend(b.next().cloned()),
                std::cmp::Ordering::Greater => new.extend(a.next().cloned()),
                std::cmp::Ordering::Equal => {
                    b.next();
                    a.next();
                }
            },
            (Some(_), None) => gone.extend(b.next().cloned()),
            (None, Some(_)) => new.extend(a.next().cloned()),
            (None, None) => return,
        }
    }
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

    fn take_cleanup_failures(&mut self) -> Vec<IpFamily> {
        NftablesDataplane::take_cleanup_failures(self)
    }

    fn cleanup(&mut self) -> Result<(), kproxy_plan::DataplaneError> {
        NftablesDataplane::cleanup(self)?;
        Ok(())
    }

    fn verify(&mut self, plan: &Plan) -> Result<kproxy_plan::Verified, kproxy_plan::DataplaneError> {
        Ok(match NftablesDataplane::verify(self, plan)? {
            Verification::Untouched | Verification::Clean | Verification::Unverifiable => kproxy_plan::Verified::Clean,
            Verification::Repaired(drift) => kproxy_plan::Verified::Repaired(drift),
            Verification::Busy => kproxy_plan::Verified::Busy,
        })
    }
}

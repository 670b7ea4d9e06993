//! The iptables dataplane: keeps upstream's chains in line with the plan through
//! `iptables-restore --noflush`.
//!
//! The applied state — for every service port a hash of each chain it owns and its lines in
//! the dispatch chains, and a hash of each dispatch chain — lives in memory, so a partial sync
//! (upstream's MinimizeIPTablesRestore) writes only the chains whose content changed, deletes
//! the ones that went away, and rewrites a dispatch chain only when its content changed (an
//! endpoint change never does). Full syncs rewrite everything and delete any stale service
//! chain they find with `iptables-save`; they happen on start, after any failure, when
//! node-wide settings change, when the canary is gone, and when the daemon asks (hourly). Each
//! sync is one `iptables-restore` per family, laid out by [`crate::layout`]: small ones are one
//! atomic section per table, big ones on iptables-nft several, ordered so nothing dangles.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;

use kproxy_plan::{NodePlan, Plan, PlanDelta, ServicePortName};
use kproxy_state::IpFamily;

use crate::canary;
use crate::layout;
use crate::naming;
use crate::nfacct::NfacctCounters;
use crate::restore::{ExecError, Executor};
use crate::rule_counts::RuleCounter;
use crate::rules::{self, Ctx, Dispatch, ServiceRules, Table, TableInput};

/// Dataplane settings (kube-proxy's `iptables.*` and `conntrack.tcpBeLiberal`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `1 << iptables.masqueradeBit` (default bit 14).
    pub masquerade_mark: u32,
    /// A second mark bit, kproxy's own, set on hairpin traffic: the endpoint rules of a service
    /// chain DNAT on it, and it keeps hairpin masqueraded when `noMasqueradeCIDRs` would skip
    /// it (KEP-6246). Default bit 13.
    pub hairpin_mark: u32,
    /// `iptables.localhostNodePorts` (default true; IPv4 only).
    pub localhost_nodeports: bool,
    /// Drop forwarded packets in conntrack state INVALID (default true; false with
    /// `conntrack.tcpBeLiberal`).
    pub drop_invalid: bool,
    /// The nfacct counters that exist ([`crate::Nfacct::setup`]); the rules count in them.
    /// Default none.
    pub nfacct: NfacctCounters,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            masquerade_mark: 0x4000,
            hairpin_mark: 0x2000,
            localhost_nodeports: true,
            drop_invalid: true,
            nfacct: NfacctCounters::default(),
        }
    }
}

impl Config {
    fn ctx(&self, family: IpFamily) -> Ctx {
        Ctx {
            family,
            masquerade_mark: self.masquerade_mark,
            hairpin_mark: self.hairpin_mark,
            localhost_nodeports: self.localhost_nodeports,
            drop_invalid: self.drop_invalid,
            nfacct: self.nfacct,
        }
    }
}

/// A sync failed; the next sync is a full one.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A command failed.
    #[error("iptables ({family:?}): {source}")]
    Exec {
        /// The family being synced.
        family: IpFamily,
        /// Cause.
        source: ExecError,
    },
}

/// What a sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyncReport {
    /// It was a full sync.
    pub full: bool,
    /// `iptables-restore` runs.
    pub restores: usize,
    /// Per-service chains written.
    pub chains_written: usize,
    /// Per-service chains deleted.
    pub chains_deleted: usize,
}

#[derive(Debug, Clone)]
struct AppliedService {
    chains: BTreeMap<String, u64>,
    dispatch: Dispatch,
    cluster_ip: IpAddr,
}

#[derive(Debug, Clone)]
struct FamilyState {
    ctx: Ctx,
    node: NodePlan,
    services: BTreeMap<ServicePortName, AppliedService>,
    /// A hash of each dispatch chain as last written.
    dispatch: BTreeMap<(Table, String), u64>,
    /// Chains a failed restore was to delete: the next full sync deletes them.
    maybe_stale: BTreeSet<String>,
}

impl FamilyState {
    fn new(ctx: Ctx, node: NodePlan) -> Self {
        Self { ctx, node, services: BTreeMap::new(), dispatch: BTreeMap::new(), maybe_stale: BTreeSet::new() }
    }

    /// The dispatch chains for the current services; records what they hash to.
    fn dispatch(&mut self) -> BTreeMap<Table, TableInput> {
        let tables =
            rules::dispatch(&self.ctx, &self.node, self.services.values().map(|s| (&s.dispatch, s.cluster_ip)));
        self.dispatch = tables
            .iter()
            .flat_map(|(&table, t)| t.chain_rules().into_iter().map(move |(c, r)| ((table, c.to_owned()), hash(&r))))
            .collect();
        tables
    }

    /// The dispatch chains whose content differs from what `before` last wrote (an endpoint
    /// change leaves them as they are; adding or removing a service rewrites them).
    fn changed_dispatch(&mut self, before: &BTreeMap<(Table, String), u64>) -> BTreeMap<Table, TableInput> {
        let tables = self.dispatch();
        tables
            .into_iter()
            .map(|(table, t)| {
                let mut changed = TableInput::default();
                for (chain, rules) in t.chain_rules() {
                    if before.get(&(table, chain.to_owned())) != self.dispatch.get(&(table, chain.to_owned())) {
                        changed.chain(chain, rules.into_iter().map(str::to_owned));
                    }
                }
                (table, changed)
            })
            .collect()
    }
}

fn hash<S: Hash>(rules: &[S]) -> u64 {
    let mut h = DefaultHasher::new();
    rules.hash(&mut h);
    h.finish()
}

fn applied(rendered: &ServiceRules, cluster_ip: IpAddr) -> AppliedService {
    AppliedService {
        chains: rendered.chains.iter().map(|(c, r)| (c.clone(), hash(r))).collect(),
        dispatch: rendered.dispatch.clone(),
        cluster_ip,
    }
}

fn merge(into: &mut BTreeMap<Table, TableInput>, from: BTreeMap<Table, TableInput>) {
    for (table, t) in from {
        let e = into.entry(table).or_default();
        e.chains.extend(t.chains);
        e.rules.extend(t.rules);
        e.delete.extend(t.delete);
        e.delete_rules.extend(t.delete_rules);
    }
}

/// The iptables dataplane over an [`Executor`].
#[derive(Debug)]
pub struct IptablesDataplane<E> {
    exec: E,
    config: Config,
    families: BTreeMap<IpFamily, FamilyState>,
    needs_full: bool,
    rule_counts: RuleCounter,
}

impl<E: Executor> IptablesDataplane<E> {
    /// A dataplane that applies through `exec`; nothing is applied until the first sync.
    pub fn new(exec: E, config: Config) -> Self {
        Self { exec, config, families: BTreeMap::new(), needs_full: true, rule_counts: RuleCounter::default() }
    }

    /// The rule counts of the `kubeproxy_sync_proxy_rules_iptables_{total,last}` metrics, shared.
    pub fn rule_counter(&self) -> RuleCounter {
        self.rule_counts.clone()
    }

    /// The executor (tests look at recorded restores).
    pub fn executor(&self) -> &E {
        &self.exec
    }

    /// The executor, mutably (tests inject failures).
    pub fn executor_mut(&mut self) -> &mut E {
        &mut self.exec
    }

    /// Makes the next sync a full one (the caller's `syncPeriod` timer).
    pub fn request_full_sync(&mut self) {
        self.needs_full = true;
    }

    /// Whether the next sync will be a full one.
    pub fn full_sync_pending(&self) -> bool {
        self.needs_full
    }

    /// Checks the canary chains of every synced family; when one is gone (someone flushed or
    /// deleted kproxy's chains) the next sync is a full one. Returns whether all were intact.
    pub fn check_canary(&mut self) -> Result<bool, SyncError> {
        for &family in self.families.keys() {
            let ok = canary::intact(&mut self.exec, family).map_err(|source| SyncError::Exec { family, source })?;
            if !ok {
                tracing::warn!(?family, "kproxy's iptables canary is gone; a full resync follows");
                self.needs_full = true;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Brings the kernel in line with `plan`: a partial restore of what `delta` changed, or a
    /// full one when due (start, failure, canary, node-wide change, [`Self::request_full_sync`]).
    pub fn sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<SyncReport, SyncError> {
        let node_changed = delta.families.values().any(|f| f.node.is_some());
        let families_changed = !plan.families.keys().eq(self.families.keys());
        if self.needs_full || node_changed || families_changed {
            return self.full_sync(plan);
        }
        self.partial_sync(delta)
    }

    /// Rewrites everything from `plan`, deleting stale chains.
    pub fn full_sync(&mut self, plan: &Plan) -> Result<SyncReport, SyncError> {
        self.needs_full = true;
        let mut report = SyncReport { full: true, ..SyncReport::default() };
        let gone: Vec<IpFamily> = self.families.keys().filter(|f| !plan.families.contains_key(f)).copied().collect();
        for family in gone {
            crate::cleanup::cleanup_family(&mut self.exec, family)
                .map_err(|source| SyncError::Exec { family, source })?;
            self.families.remove(&family);
        }
        for (&family, fam) in &plan.families {
            let err = |source| SyncError::Exec { family, source };
            let ctx = self.config.ctx(family);
            let mut state = FamilyState::new(ctx.clone(), fam.node.clone());
            let mut tables = rules::fixed(&ctx, &fam.node);
            let mut nat = TableInput::default();
            for (name, p) in &fam.services {
                let rendered = rules::render_service(&ctx, &fam.node, p);
                for (chain, rules) in &rendered.chains {
                    nat.chain(chain, rules.iter().cloned());
                }
                state.services.insert(name.clone(), applied(&rendered, p.cluster_ip));
            }
            report.chains_written += nat.chains.len();
            let desired: BTreeSet<&String> = nat.chains.iter().collect();
            let mut existing: BTreeSet<String> =
                existing_service_chains(&self.exec.save(family, Table::Nat).map_err(err)?);
            if let Some(old) = self.families.get(&family) {
                existing.extend(old.services.values().flat_map(|s| s.chains.keys().cloned()));
                existing.extend(old.maybe_stale.iter().cloned());
            }
            nat.delete = existing.into_iter().filter(|c| !desired.contains(c)).collect();
            report.chains_deleted += nat.delete.len();
            merge(&mut tables, state.dispatch());
            merge(&mut tables, BTreeMap::from([(Table::Nat, nat)]));
            let text = layout::restore_text(&tables, self.exec.section_limit());
            self.exec.restore(family, &text).map_err(|e| {
                tracing::warn!(error = %e, ?family, "iptables full restore failed");
                err(e)
            })?;
            report.restores += 1;
            self.rule_counts.restored(family, &tables, true);
            for jump in rules::jumps(&ctx, &fam.node) {
                ensure_jump(&mut self.exec, family, &jump).map_err(err)?;
            }
            if ctx.localhost_nodeports_active(&fam.node) {
                self.exec.sysctl("net/ipv4/conf/all/route_localnet", "1").map_err(err)?;
            }
            self.families.insert(family, state);
        }
        self.needs_full = false;
        Ok(report)
    }

    /// Writes only the changed services' chains plus the dispatch chains.
    fn partial_sync(&mut self, delta: &PlanDelta) -> Result<SyncReport, SyncError> {
        let mut report = SyncReport::default();
        for (&family, fd) in &delta.families {
            if fd.is_empty() {
                continue;
            }
            // The state is updated in place (a clone would cost O(cluster) per change); if the
            // restore fails, the next sync is a full one, which rebuilds it.
            let Some(state) = self.families.get_mut(&family) else { continue };
            let mut nat = TableInput::default();
            let mut dispatch_changed = !fd.removed.is_empty();
            for p in fd.added.iter().chain(fd.changed.iter().map(|c| &c.new)) {
                let rendered = rules::render_service(&state.ctx, &state.node, p);
                let old = state.services.get(&p.name);
                for (chain, rules) in &rendered.chains {
                    if old.and_then(|o| o.chains.get(chain)) != Some(&hash(rules)) {
                        nat.chain(chain, rules.iter().cloned());
                    }
                }
                if let Some(old) = old {
                    nat.delete.extend(old.chains.keys().filter(|c| !rendered.chains.contains_key(*c)).cloned());
                }
                dispatch_changed |= old.is_none_or(|o| o.dispatch != rendered.dispatch || o.cluster_ip != p.cluster_ip);
                state.services.insert(p.name.clone(), applied(&rendered, p.cluster_ip));
            }
            for p in &fd.removed {
                if let Some(old) = state.services.remove(&p.name) {
                    nat.delete.extend(old.chains.into_keys());
                }
            }
            report.chains_written += nat.chains.len();
            report.chains_deleted += nat.delete.len();
            // The dispatch chains are rebuilt (O(cluster)) only when a service's lines in them
            // changed, and written only where their content did.
            let mut tables = if dispatch_changed {
                let before = state.dispatch.clone();
                state.changed_dispatch(&before)
            } else {
                BTreeMap::new()
            };
            merge(&mut tables, BTreeMap::from([(Table::Nat, nat)]));
            if tables.values().all(TableInput::is_empty) {
                // Nothing the kernel holds changed (say, only a port's name did).
                continue;
            }
            let text = layout::restore_text(&tables, self.exec.section_limit());
            if let Err(e) = self.exec.restore(family, &text) {
                tracing::warn!(error = %e, ?family, "iptables partial restore failed; the next sync is a full one");
                // The chains this restore would have deleted may still be in the kernel.
                state.maybe_stale.extend(tables.get(&Table::Nat).into_iter().flat_map(|t| t.delete.iter().cloned()));
                self.needs_full = true;
                return Err(SyncError::Exec { family, source: e });
            }
            report.restores += 1;
            self.rule_counts.restored(family, &tables, false);
        }
        Ok(report)
    }

    /// The restore input a full sync of `plan` would apply, per family, without applying it
    /// (`--dry-run`; stale chains and jumps are not included).
    pub fn render_full(&self, plan: &Plan) -> BTreeMap<IpFamily, String> {
        plan.families
            .iter()
            .map(|(&family, fam)| {
                let ctx = self.config.ctx(family);
                let mut state = FamilyState::new(ctx.clone(), fam.node.clone());
                let mut tables = rules::fixed(&ctx, &fam.node);
                let mut nat = TableInput::default();
                for (name, p) in &fam.services {
                    let rendered = rules::render_service(&ctx, &fam.node, p);
                    for (chain, rules) in &rendered.chains {
                        nat.chain(chain, rules.iter().cloned());
                    }
                    state.services.insert(name.clone(), applied(&rendered, p.cluster_ip));
                }
                merge(&mut tables, state.dispatch());
                merge(&mut tables, BTreeMap::from([(Table::Nat, nat)]));
                (family, layout::restore_text(&tables, self.exec.section_limit()))
            })
            .collect()
    }

    /// Removes every kproxy chain and jump (both families) and forgets the applied state.
    pub fn cleanup(&mut self) -> Result<(), SyncError> {
        for family in IpFamily::BOTH {
            crate::cleanup::cleanup_family(&mut self.exec, family)
                .map_err(|source| SyncError::Exec { family, source })?;
        }
        self.families.clear();
        self.rule_counts.clear();
        self.needs_full = true;
        Ok(())
    }
}

/// Per-service chains present in `iptables-save -t nat` output.
fn existing_service_chains(save: &str) -> BTreeSet<String> {
    save.lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| naming::is_service_chain(c))
        .map(str::to_owned)
        .collect()
}

/// `-C` then `-I`: the jump exists exactly once, first in the built-in chain.
fn ensure_jump(exec: &mut dyn Executor, family: IpFamily, jump: &rules::Jump) -> Result<(), ExecError> {
    let spec = |op: &str| {
        let mut a = vec!["-t".to_owned(), jump.table.as_str().to_owned(), op.to_owned(), jump.from.to_owned()];
        a.extend(jump.args.iter().cloned());
        a
    };
    if !exec.run(family, &spec("-C"))?.success {
        let out = exec.run(family, &spec("-I"))?;
        if !out.success {
            return Err(ExecError::Failed {
                program: format!("iptables -I {} -j {}", jump.from, jump.target()),
                stderr: "rule not inserted".to_owned(),
            });
        }
    }
    Ok(())
}

impl<E: Executor + Send> kproxy_plan::Dataplane for IptablesDataplane<E> {
    fn full_sync(&mut self, plan: &Plan) -> Result<(), kproxy_plan::DataplaneError> {
        IptablesDataplane::full_sync(self, plan)?;
        Ok(())
    }

    fn partial_sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<(), kproxy_plan::DataplaneError> {
        self.sync(plan, delta)?;
        Ok(())
    }

    /// The periodic check is the canary (a few single-chain listings, whatever the cluster's
    /// size), not a full restore: someone flushing or deleting kproxy's chains makes it a full
    /// restore. The daemon still restores everything hourly.
    fn verify(&mut self, plan: &Plan) -> Result<kproxy_plan::Verified, kproxy_plan::DataplaneError> {
        if !self.needs_full && self.check_canary()? {
            return Ok(kproxy_plan::Verified::Clean);
        }
        IptablesDataplane::full_sync(self, plan)?;
        Ok(kproxy_plan::Verified::Repaired(vec![
            "kproxy's iptables canary was gone (a table was flushed or its chains deleted)".to_owned(),
        ]))
    }

    fn cleanup(&mut self) -> Result<(), kproxy_plan::DataplaneError> {
        IptablesDataplane::cleanup(self)?;
        Ok(())
    }
}

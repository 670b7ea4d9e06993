//! The iptables dataplane: keeps upstream's chains in line with the plan through
//! `iptables-restore --noflush`.
//!
//! The applied state — for every service port a hash of each chain it owns and its lines in
//! the dispatch chains, and a hash of each dispatch chain — lives in memory, so a partial sync
//! (upstream's MinimizeIPTablesRestore) writes only the chains whose content changed, deletes
//! the ones that went away, and rewrites a dispatch chain only when its content changed (an
//! endpoint change never does). Full syncs happen on start, after any failure, when node-wide
//! settings change, when the canary is gone, and when the daemon asks (hourly). On a node
//! without kproxy's chains (the first start) a full sync writes everything. Over live chains (a
//! restart, the hourly resync, the recovery after a failure) it reads them with
//! `iptables-save`, one per table, compares each chain with what it would write
//! ([`crate::live`]) and restores only the chains that differ, deleting stale service chains in
//! the same restore: nothing at all when the kernel already holds the plan. A chain that differs
//! although kproxy had written exactly that content is someone else's doing: it is repaired the
//! same way and reported as drift ([`IptablesDataplane::take_drift`]). Each sync is one
//! `iptables-restore` per family, laid out by [`crate::layout`]: small ones are one atomic
//! section per table, big ones on iptables-nft several, ordered so nothing dangles.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use kproxy_plan::{NodePlan, Plan, PlanDelta, ServicePortName, ServicePortPlan};
use kproxy_state::IpFamily;

use crate::canary;
use crate::layout;
use crate::live::{self, LiveTable};
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
    /// Node-wide chains (dispatch, forwarding, masquerading, canaries) written.
    pub node_chains_written: usize,
    /// A full sync found kproxy's chains live and compared them with what it would write.
    pub adopted: bool,
    /// Of those, chains already as wanted, left as they were.
    pub chains_kept: usize,
    /// Jumps from the built-in chains inserted.
    pub jumps_inserted: usize,
    /// Chains and jumps that differed from what kproxy had written (someone else changed
    /// them), repaired.
    pub drift: usize,
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
}

impl FamilyState {
    fn new(ctx: Ctx, node: NodePlan) -> Self {
        Self { ctx, node, services: BTreeMap::new(), dispatch: BTreeMap::new() }
    }

    /// Whether `chain` of `table`, with `rules` as this state would write it, is exactly what
    /// `self` last wrote (so a live chain differing from it was changed by someone else).
    fn wrote(
        &self,
        now: &FamilyState,
        table: Table,
        chain: &str,
        rules: &[&str],
        services: &HashMap<&str, u64>,
    ) -> bool {
        let key = (table, chain.to_owned());
        if table == Table::Nat && naming::is_service_chain(chain) {
            services.get(chain) == Some(&hash(rules))
        } else if let Some(h) = now.dispatch.get(&key) {
            self.dispatch.get(&key) == Some(h)
        } else {
            self.ctx == now.ctx && self.node == now.node
        }
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

/// At most this many lines describe the drift a sync repaired (a flushed table is one line
/// per chain), then one that says how many more.
const DRIFT_LINES: usize = 20;

/// The iptables dataplane over an [`Executor`].
#[derive(Debug)]
pub struct IptablesDataplane<E> {
    exec: E,
    config: Config,
    families: BTreeMap<IpFamily, FamilyState>,
    needs_full: bool,
    /// The applied state is what the kernel held after the last sync (it succeeded): a full
    /// sync finding a chain it had written changed is drift.
    trusted: bool,
    /// Drift repaired since [`Self::take_drift`] was last called.
    drift: Vec<String>,
    rule_counts: RuleCounter,
}

impl<E: Executor> IptablesDataplane<E> {
    /// A dataplane that applies through `exec`; nothing is applied until the first sync.
    pub fn new(exec: E, config: Config) -> Self {
        Self {
            exec,
            config,
            families: BTreeMap::new(),
            needs_full: true,
            trusted: false,
            drift: Vec::new(),
            rule_counts: RuleCounter::default(),
        }
    }

    /// What the syncs since the last call found changed by someone else and repaired, one
    /// line each (at most a few per sync).
    pub fn take_drift(&mut self) -> Vec<String> {
        std::mem::take(&mut self.drift)
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
        // A node address that `nodePortAddresses` selects came or went (localhost NodePorts as
        // they were): the rules that name the node-port addresses, not a full restore.
        let addresses_only = delta.families.iter().all(|(family, fd)| {
            fd.node.as_ref().is_none_or(|node| {
                self.families.get(family).is_some_and(|s| {
                    s.node.nodeport_addresses_change(node).is_some()
                        && s.ctx.localhost_nodeports_active(&s.node) == s.ctx.localhost_nodeports_active(node)
                })
            })
        });
        let families_changed = !plan.families.keys().eq(self.families.keys());
        if self.needs_full || !addresses_only || families_changed {
            return self.full_sync(plan);
        }
        self.partial_sync(plan, delta)
    }

    /// Brings the kernel in line with `plan` whatever it held: writes everything on a node
    /// without kproxy's chains; over live chains, restores only those that differ and deletes
    /// stale service chains.
    pub fn full_sync(&mut self, plan: &Plan) -> Result<SyncReport, SyncError> {
        self.needs_full = true;
        let trusted = std::mem::take(&mut self.trusted);
        let mut report = SyncReport { full: true, ..SyncReport::default() };
        let gone: Vec<IpFamily> = self.families.keys().filter(|f| !plan.families.contains_key(f)).copied().collect();
        for family in gone {
            crate::cleanup::cleanup_family(&mut self.exec, family)
                .map_err(|source| SyncError::Exec { family, source })?;
            self.families.remove(&family);
        }
        let mut drift = Vec::new();
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
            let service_chains = nat.chains.len();
            merge(&mut tables, state.dispatch());
            merge(&mut tables, BTreeMap::from([(Table::Nat, nat)]));
            // One read of every table (what one table costs with iptables-nft).
            let live = LiveTable::parse_all(&self.exec.save_all(family).map_err(err)?);
            let old = if trusted { self.families.get(&family) } else { None };
            let live = if live.get(&Table::Nat).is_some_and(LiveTable::has_kproxy_chains) {
                let exec = &mut self.exec;
                drift.extend(
                    adopt(exec, &self.rule_counts, family, &tables, (&state, old), &live, &mut report).map_err(err)?,
                );
                Some(live)
            } else {
                // The first start: nothing of kproxy's to compare with or delete.
                report.chains_written += service_chains;
                report.node_chains_written += tables.values().map(|t| t.chains.len()).sum::<usize>() - service_chains;
                let text = layout::restore_text(&tables, self.exec.section_limit());
                self.exec.restore(family, &text).map_err(|e| {
                    tracing::warn!(error = %e, ?family, "iptables full restore failed");
                    err(e)
                })?;
                report.restores += 1;
                self.rule_counts.restored(family, &tables, true);
                None
            };
            for jump in rules::jumps(&ctx, &fam.node) {
                // Over live rules the save shows the jumps that are there; `-C` asks otherwise.
                if live.as_ref().is_some_and(|l| {
                    l.get(&jump.table).is_some_and(|t| t.builtin_has(jump.from, &live::save_form(&jump.line(), family)))
                }) {
                    continue;
                }
                if ensure_jump(&mut self.exec, family, &jump).map_err(err)? {
                    report.jumps_inserted += 1;
                    if old.is_some() {
                        drift.push(format!(
                            "{family:?} {}: the jump from {} to {} was missing",
                            jump.table.as_str(),
                            jump.from,
                            jump.target()
                        ));
                    }
                }
            }
            if ctx.localhost_nodeports_active(&fam.node) {
                self.exec.sysctl("net/ipv4/conf/all/route_localnet", "1").map_err(err)?;
            }
            self.families.insert(family, state);
        }
        report.drift = drift.len();
        if drift.len() > DRIFT_LINES {
            let more = drift.len() - DRIFT_LINES;
            drift.truncate(DRIFT_LINES);
            drift.push(format!("and {more} more"));
        }
        if !drift.is_empty() {
            tracing::warn!(?drift, "kproxy's iptables rules were changed by someone else; repaired");
        }
        self.drift.extend(drift);
        self.needs_full = false;
        self.trusted = true;
        Ok(report)
    }

    /// Writes only the changed services' chains plus the dispatch chains.
    fn partial_sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<SyncReport, SyncError> {
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
            let mut touched: Vec<&Arc<ServicePortPlan>> =
                fd.added.iter().chain(fd.changed.iter().map(|c| &c.new)).collect();
            if let Some(node) = &fd.node {
                // Only the node-port addresses changed (see `sync`): KUBE-SERVICES' jumps to
                // KUBE-NODEPORTS name them, and so do the REJECT/DROP rules of the NodePorts
                // without endpoints, re-rendered here; no service chain does.
                state.node = node.clone();
                dispatch_changed = true;
                let names_addresses = |p: &&Arc<ServicePortPlan>| {
                    p.node_port.is_some() && p.external.as_ref().is_some_and(|x| x.no_endpoints.is_some())
                };
                touched.extend(
                    plan.families.get(&family).into_iter().flat_map(|f| f.services.values()).filter(names_addresses),
                );
            }
            for p in touched {
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
                // The full sync reads what the kernel holds (the chains this restore would
                // have deleted among them).
                self.needs_full = true;
                self.trusted = false;
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
        self.trusted = false;
        Ok(())
    }
}

/// The full sync of `family` over its live chains: one restore of the chains that differ
/// from `tables` (everything kproxy wants there) and of the deletion of stale service
/// chains; none when nothing differs. `old`: the state the last sync left, when the kernel
/// held it then. Returns the drift: chains that differed from what `old` had written.
fn adopt(
    exec: &mut dyn Executor,
    rule_counts: &RuleCounter,
    family: IpFamily,
    tables: &BTreeMap<Table, TableInput>,
    (state, old): (&FamilyState, Option<&FamilyState>),
    live: &BTreeMap<Table, LiveTable>,
    report: &mut SyncReport,
) -> Result<Vec<String>, ExecError> {
    report.adopted = true;
    let old_services: HashMap<&str, u64> = old
        .map(|o| o.services.values().flat_map(|s| s.chains.iter().map(|(c, h)| (c.as_str(), *h))).collect())
        .unwrap_or_default();
    let empty = LiveTable::default();
    let mut write: BTreeMap<Table, TableInput> = BTreeMap::new();
    // (table, chain, its digest as written, how it differed)
    let mut drifted: Vec<(Table, &str, live::ChainDigest, &str)> = Vec::new();
    for (&table, input) in tables {
        let live = live.get(&table).unwrap_or(&empty);
        let mut wanted: HashSet<&str> = HashSet::new();
        for (chain, rules) in input.chain_rules() {
            wanted.insert(chain);
            let is = live.digest(chain);
            let want = live::digest_of(&rules, family);
            if is == Some(want) {
                report.chains_kept += 1;
                continue;
            }
            if table == Table::Nat && naming::is_service_chain(chain) {
                report.chains_written += 1;
            } else {
                report.node_chains_written += 1;
            }
            if old.is_some_and(|o| o.wrote(state, table, chain, &rules, &old_services)) {
                drifted.push((
                    table,
                    chain,
                    want,
                    if is.is_some() { "its rules were changed" } else { "it was deleted" },
                ));
            }
            write.entry(table).or_default().chain(chain, rules.into_iter().map(str::to_owned));
        }
        if table == Table::Nat {
            let mut stale: Vec<String> = live
                .kproxy_chains()
                .filter(|c| naming::is_service_chain(c) && !wanted.contains(c))
                .map(str::to_owned)
                .collect();
            stale.sort_unstable();
            report.chains_deleted += stale.len();
            if !stale.is_empty() {
                write.entry(table).or_default().delete = stale;
            }
        }
    }
    if write.values().any(|t| !t.is_empty()) {
        let text = layout::restore_text(&write, exec.section_limit());
        exec.restore(family, &text).inspect_err(|e| {
            tracing::warn!(error = %e, ?family, "iptables restore over the live rules failed");
        })?;
        report.restores += 1;
    }
    if !drifted.is_empty() {
        // A chain that still differs right after kproxy wrote it is one whose save form
        // `live::save_form` does not know (other versions of the tools may print rules
        // otherwise): not drift, only rewritten at each full sync.
        let reread = LiveTable::parse_all(&exec.save_all(family)?);
        drifted.retain(|(table, chain, want, _)| {
            let comparable = reread.get(table).and_then(|t| t.digest(chain)) == Some(*want);
            if !comparable {
                tracing::warn!(
                    ?family,
                    table = table.as_str(),
                    chain,
                    "iptables-save shows this chain otherwise than kproxy writes it; it is rewritten at each full sync"
                );
            }
            comparable
        });
    }
    tracing::debug!(
        ?family,
        kept = report.chains_kept,
        written = report.chains_written + report.node_chains_written,
        deleted = report.chains_deleted,
        "iptables full sync over live rules"
    );
    rule_counts.adopted(family, tables, &write);
    Ok(drifted
        .into_iter()
        .map(|(table, chain, _, how)| format!("{family:?} {} chain {chain}: {how}", table.as_str()))
        .collect())
}

/// `-C` then `-I`: the jump exists exactly once, first in the built-in chain. Whether it was
/// inserted.
fn ensure_jump(exec: &mut dyn Executor, family: IpFamily, jump: &rules::Jump) -> Result<bool, ExecError> {
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
        return Ok(true);
    }
    Ok(false)
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
        let mut drift = self.take_drift();
        if drift.is_empty() {
            drift.push("kproxy's iptables canary was gone (a table was flushed or its chains deleted)".to_owned());
        }
        Ok(kproxy_plan::Verified::Repaired(drift))
    }

    fn take_drift_repairs(&mut self) -> Vec<String> {
        self.take_drift()
    }

    fn cleanup(&mut self) -> Result<(), kproxy_plan::DataplaneError> {
        IptablesDataplane::cleanup(self)?;
        Ok(())
    }
}

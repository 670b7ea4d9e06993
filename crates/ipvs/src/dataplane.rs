//! The IPVS dataplane: keeps the kernel's IPVS table, the dummy interface and the auxiliary
//! table in line with the plan.
//!
//! The first sync (and the first after a failure) is a full reconcile: it lists the kernel's
//! virtual services and real servers and the dummy interface's addresses, and changes only what
//! differs — a restarted kproxy adopts what its predecessor left without touching a single
//! established connection, and nothing ever fails with "file exists". Later syncs apply the plan
//! delta against the state kept in memory: an endpoint change is a real-server add or delete on
//! that service port's virtual services and nothing else.
//!
//! The periodic check ([`IpvsDataplane::verify`], in [`verify`]) reads the kernel in a few
//! dumps and repairs only what someone else changed; it rewrites nothing while nothing differs.
//!
//! Graceful termination: a real server that leaves the plan keeps serving its connections at
//! weight 0 (no new ones) until it has none or [`Config::graceful_period`] passed; UDP ones go at
//! once (IPVS would otherwise keep sending a flow's datagrams to a dead pod). The kernel's
//! `expire_quiescent_template` stops persistence templates from pinning new connections to it.
//! A virtual service kproxy does not want on an address off the dummy interface (a NodePort's
//! on a node address: of a deleted Service, of an address `nodePortAddresses` no longer selects,
//! or kube-proxy's on a node taken over from its IPVS mode) takes no new connection and is
//! deleted only once it carries none or that period passed: deleting it would break the
//! connections IPVS scheduled through it.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use kproxy_nft_model::{Element, Key, Listings, MapData, Op, TableFamily, TableRef, Transaction};
use kproxy_nftables::kernel::Applied;
use kproxy_nftables::ruleset::Ctx;
use kproxy_plan::{NodePlan, Plan, PlanDelta, ServicePortName, ServicePortPlan};
use kproxy_state::{IpFamily, Protocol};

use crate::aux_table;
use crate::config::Config;
use crate::error::Error;
use crate::fwmark::Fwmarks;
use crate::genl::{DestKey, DestSpec, DestState, IpvsOp, ServiceKey, ServiceSpec};
use crate::host::{EEXIST, ENOENT, ESRCH, Host, HostNft};
use crate::render::{DesiredVs, PortObjects, render_port, slots_following};

mod verify;

/// What a sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyncReport {
    /// It was a full reconcile.
    pub full: bool,
    /// IPVS changes sent.
    pub ipvs_ops: usize,
    /// Addresses added to or removed from the dummy interface.
    pub address_ops: usize,
    /// nftables operations in the auxiliary table's transaction.
    pub nft_ops: usize,
    /// Real servers (and unwanted virtual services) deleted after draining.
    pub drained: usize,
}

/// A virtual service as applied.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AppliedVs {
    spec: ServiceSpec,
    protocol: Protocol,
    dests: BTreeMap<DestKey, u32>,
}

type ElementKey = (String, Key);

#[derive(Debug, Clone)]
struct FamilyState {
    ctx: Ctx,
    node: NodePlan,
    ports: BTreeMap<ServicePortName, PortObjects>,
    /// Every element with the value each owning service port wants (first owner wins).
    elements: BTreeMap<ElementKey, BTreeMap<ServicePortName, Option<MapData>>>,
}

fn effective(owners: Option<&BTreeMap<ServicePortName, Option<MapData>>>) -> Option<Option<MapData>> {
    owners.and_then(|o| o.values().next().cloned())
}

/// The IPVS dataplane over a [`Host`] (the kernel, or [`crate::FakeHost`]).
#[derive(Debug)]
pub struct IpvsDataplane<H> {
    host: H,
    config: Config,
    families: BTreeMap<IpFamily, FamilyState>,
    in_sync: bool,
    vs_owners: BTreeMap<ServiceKey, BTreeMap<ServicePortName, DesiredVs>>,
    applied: BTreeMap<ServiceKey, AppliedVs>,
    draining: BTreeMap<(ServiceKey, DestKey), Instant>,
    /// Unwanted address services off the dummy interface kept while they carry connections.
    draining_services: BTreeMap<ServiceKey, Instant>,
    addr_owners: BTreeMap<IpAddr, BTreeSet<ServicePortName>>,
    applied_addrs: BTreeSet<IpAddr>,
    link: Option<u32>,
    fwmarks: Fwmarks,
    /// What the auxiliary tables hold as far as kproxy knows (a summary, and the nf_tables
    /// generation of kproxy's last commit): what the periodic check compares with.
    aux: Applied,
}

impl<H: Host> IpvsDataplane<H> {
    /// A dataplane that changes nothing until the first sync.
    pub fn new(host: H, config: Config) -> Self {
        let fwmarks = Fwmarks::new(config.fwmark_base, config.fwmark_mask);
        Self {
            host,
            config,
            families: BTreeMap::new(),
            in_sync: false,
            vs_owners: BTreeMap::new(),
            applied: BTreeMap::new(),
            draining: BTreeMap::new(),
            draining_services: BTreeMap::new(),
            addr_owners: BTreeMap::new(),
            applied_addrs: BTreeSet::new(),
            link: None,
            fwmarks,
            aux: Applied::default(),
        }
    }

    /// The host (tests look at what was sent).
    pub fn host(&self) -> &H {
        &self.host
    }

    /// The host, mutably (tests inject failures and connections).
    pub fn host_mut(&mut self) -> &mut H {
        &mut self.host
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Real servers kept at weight 0 until they drain.
    pub fn draining(&self) -> impl Iterator<Item = (&ServiceKey, &DestKey)> {
        self.draining.keys().map(|(s, d)| (s, d))
    }

    /// Virtual services kproxy does not want, kept until their connections end.
    pub fn draining_services(&self) -> impl Iterator<Item = &ServiceKey> {
        self.draining_services.keys()
    }

    /// Brings the kernel in line with `plan`; `delta` is what changed since the last sync.
    /// Falls back to a full reconcile on the first sync, after a failure, or when node-wide
    /// settings or the set of families changed.
    pub fn sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<SyncReport, Error> {
        // A node address that `nodePortAddresses` selects came or went: the auxiliary table's
        // `nodeport-ips` elements and the NodePorts' address services on it, not a full
        // reconcile.
        let addresses_only = delta.families.iter().all(|(family, fd)| {
            fd.node.as_ref().is_none_or(|node| {
                self.families.get(family).is_some_and(|s| s.node.nodeport_addresses_change(node).is_some())
            })
        });
        let families_changed = !plan.families.keys().eq(self.families.keys());
        let result = if !self.in_sync || !addresses_only || families_changed {
            self.full_sync(plan)
        } else {
            self.partial_sync(plan, delta)
        };
        match result {
            Ok(report) => Ok(report),
            Err(e) => {
                tracing::warn!(error = %e, "IPVS sync failed; the next sync is a full reconcile");
                self.in_sync = false;
                Err(e)
            }
        }
    }

    /// A full reconcile against what the kernel has.
    pub fn full_sync(&mut self, plan: &Plan) -> Result<SyncReport, Error> {
        self.in_sync = false;
        let mut report = SyncReport { full: true, ..Default::default() };
        self.prepare_node(plan)?;

        // Desired state, from scratch.
        self.vs_owners.clear();
        self.addr_owners.clear();
        let mut families = BTreeMap::new();
        let mut fwmarks = Fwmarks::new(self.config.fwmark_base, self.config.fwmark_mask);
        for (&family, fam) in &plan.families {
            let ctx = Ctx::new(family, &self.config.table, 0);
            let mut state =
                FamilyState { ctx, node: fam.node.clone(), ports: BTreeMap::new(), elements: BTreeMap::new() };
            for (name, p) in &fam.services {
                let old = self.families.get(&family).and_then(|s| s.ports.get(name));
                let slots = slots_following(p, old);
                let objects =
                    render_port(&self.config, &state.ctx, &fam.node, p, &slots, &mut || fwmarks.get(family, name));
                own(&mut self.vs_owners, &mut self.addr_owners, &mut state.elements, name, &objects, true);
                state.ports.insert(name.clone(), objects);
            }
            families.insert(family, state);
        }
        self.fwmarks = fwmarks;

        // IPVS: what the kernel has, ours only, in one read of the whole table (as the periodic
        // check reads it), not one dump per virtual service.
        self.applied.clear();
        for (spec, dests) in self.host.ipvs_table()? {
            if !self.is_ours(&spec.key) {
                continue;
            }
            let protocol = self.protocol_of(&spec.key);
            let dests = dests.into_iter().map(|d| (d.spec.key, d.spec.weight)).collect();
            self.applied.insert(spec.key, AppliedVs { spec, protocol, dests });
        }
        self.draining.retain(|(s, _), _| self.applied.contains_key(s));
        self.draining_services.retain(|s, _| self.applied.contains_key(s));
        // The interface's addresses before the services: which unwanted services are on a VIP.
        let link = self.link.ok_or(Error::NotDummy(self.config.interface.clone()))?;
        // IPv6 link-local addresses are the kernel's own (the interface is up), not VIPs.
        self.applied_addrs = self.host.addresses(link)?.into_iter().filter(|a| !is_link_local(a)).collect();
        let keys: BTreeSet<ServiceKey> = self.vs_owners.keys().chain(self.applied.keys()).copied().collect();
        for key in keys {
            report.ipvs_ops += self.reconcile_service(key)?;
        }

        // Addresses.
        let addrs: BTreeSet<IpAddr> = self.addr_owners.keys().chain(self.applied_addrs.iter()).copied().collect();
        for addr in addrs {
            report.address_ops += self.reconcile_address(addr)?;
        }

        // The auxiliary table, recreated atomically.
        let mut tx = Transaction::new();
        for state in families.values() {
            full_table(&self.config, state, &mut tx);
        }
        for family in IpFamily::BOTH.iter().filter(|f| !plan.families.contains_key(f)) {
            let table = table_ref(*family, &self.config.table);
            tx.push(Op::AddTable { table: table.clone(), comment: None });
            tx.push(Op::DeleteTable(table));
        }
        report.nft_ops = tx.len();
        // The transaction decides everything the auxiliary tables hold.
        self.aux.listings = Listings::default();
        self.aux.generation = self.host.nft_generation().ok().flatten();
        self.aux.apply(&mut HostNft(&mut self.host), &tx)?;
        self.families = families;
        report.drained = self.reap_drained()?;
        self.in_sync = true;
        Ok(report)
    }

    fn partial_sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<SyncReport, Error> {
        let mut report = SyncReport::default();
        let mut touched_vs = BTreeSet::new();
        let mut touched_addrs = BTreeSet::new();
        let mut tx = Transaction::new();
        // A node address added to `nodePortAddresses`: its element goes in before the address's
        // NodePort services, so that no connection reaches one unmarked for masquerading.
        let mut nodeport_ips_first = Transaction::new();
        for (family, fd) in &delta.families {
            let Some(state) = self.families.get_mut(family) else { continue };
            let mut before: BTreeMap<ElementKey, Option<Option<MapData>>> = BTreeMap::new();
            let mut changes: Vec<(ServicePortName, Option<PortObjects>)> = Vec::new();
            // Ports are rendered with the node settings this delta brings, if any: a port added
            // or changed together with a change of the node's addresses gets its NodePort
            // services on the new addresses, and so does every other port that has them.
            let node = fd.node.as_ref().unwrap_or(&state.node);
            let moved: Vec<&Arc<ServicePortPlan>> = match plan.families.get(family) {
                Some(fam) if node.nodeport_addresses.addresses() != state.node.nodeport_addresses.addresses() => {
                    let in_delta: BTreeSet<&ServicePortName> =
                        fd.added.iter().chain(fd.changed.iter().map(|c| &c.new)).map(|p| &p.name).collect();
                    let on_addresses =
                        state.ports.iter().filter(|(name, o)| o.on_node_addresses && !in_delta.contains(name));
                    on_addresses.filter_map(|(name, _)| fam.services.get(name)).collect()
                }
                _ => Vec::new(),
            };
            for p in fd.added.iter().chain(fd.changed.iter().map(|c| &c.new)).chain(moved) {
                let fwmarks = &mut self.fwmarks;
                let slots = slots_following(p, state.ports.get(&p.name));
                let objects =
                    render_port(&self.config, &state.ctx, node, p, &slots, &mut || fwmarks.get(*family, &p.name));
                changes.push((p.name.clone(), Some(objects)));
            }
            for p in &fd.removed {
                changes.push((p.name.clone(), None));
            }
            for (name, new) in changes {
                if let Some(old) = state.ports.remove(&name) {
                    note(&old, &state.elements, &mut before, &mut touched_vs, &mut touched_addrs);
                    own(&mut self.vs_owners, &mut self.addr_owners, &mut state.elements, &name, &old, false);
                }
                match new {
                    Some(objects) => {
                        note(&objects, &state.elements, &mut before, &mut touched_vs, &mut touched_addrs);
                        own(&mut self.vs_owners, &mut self.addr_owners, &mut state.elements, &name, &objects, true);
                        state.ports.insert(name, objects);
                    }
                    None => self.fwmarks.release(*family, &name),
                }
            }
            let table = state.ctx.table.clone();
            let mut adds = Vec::new();
            for ((set, key), was) in before {
                let now = effective(state.elements.get(&(set.clone(), key.clone())));
                if was == now {
                    continue;
                }
                if let Some(value) = was {
                    tx.push(Op::DeleteElement(table.clone(), Element { set: set.clone(), key: key.clone(), value }));
                }
                if let Some(value) = now {
                    adds.push(Op::AddElement(table.clone(), Element { set, key, value }));
                }
            }
            if let Some(node) = &fd.node
                && let Some((gone, added)) = state.node.nodeport_addresses_change(node)
            {
                let element = |ip: IpAddr| Element::new(aux_table::NODEPORT_IPS, kproxy_nft_model::Value::Addr(ip));
                gone.into_iter().for_each(|ip| tx.push(Op::DeleteElement(table.clone(), element(ip))));
                added.into_iter().for_each(|ip| nodeport_ips_first.push(Op::AddElement(table.clone(), element(ip))));
                // A failure below makes the next sync a full reconcile, from the plan.
                state.node = node.clone();
            }
            adds.into_iter().for_each(|op| tx.push(op));
        }
        // New VIPs first (and services before their real servers), then the filter elements:
        // the order in which nothing is briefly unreachable.
        let (new_addrs, old_addrs): (Vec<IpAddr>, Vec<IpAddr>) =
            touched_addrs.into_iter().partition(|a| self.addr_owners.contains_key(a));
        report.nft_ops = nodeport_ips_first.len() + tx.len();
        if !nodeport_ips_first.is_empty() {
            self.aux.apply(&mut HostNft(&mut self.host), &nodeport_ips_first)?;
        }
        for addr in new_addrs {
            report.address_ops += self.reconcile_address(addr)?;
        }
        for key in touched_vs {
            report.ipvs_ops += self.reconcile_service(key)?;
        }
        self.aux.apply(&mut HostNft(&mut self.host), &tx)?;
        for addr in old_addrs {
            report.address_ops += self.reconcile_address(addr)?;
        }
        report.drained = self.reap_drained()?;
        Ok(report)
    }

    /// The protocol of a virtual service as the kernel lists it (a firewall-mark service has
    /// none there: the one its owner wants, else TCP).
    fn protocol_of(&self, key: &ServiceKey) -> Protocol {
        match key {
            ServiceKey::Addr { protocol, .. } => *protocol,
            ServiceKey::Fwmark { .. } => {
                self.vs_owners.get(key).and_then(|o| o.values().next()).map_or(Protocol::Tcp, |d| d.protocol)
            }
        }
    }

    /// Sysctls, IPVS timeouts and the dummy interface.
    fn prepare_node(&mut self, plan: &Plan) -> Result<(), Error> {
        self.ensure_sysctls(plan)?;
        let secs = |d: std::time::Duration| u32::try_from(d.as_secs()).unwrap_or(u32::MAX);
        let (tcp, tcp_fin, udp) =
            (secs(self.config.tcp_timeout), secs(self.config.tcp_fin_timeout), secs(self.config.udp_timeout));
        if tcp != 0 || tcp_fin != 0 || udp != 0 {
            self.host.ipvs(&IpvsOp::SetTimeouts { tcp, tcp_fin, udp })?;
        }
        let name = self.config.interface.clone();
        let index = match self.host.link(&name)? {
            None => self.host.create_dummy(&name)?,
            Some((index, Some(kind))) if kind == "dummy" => {
                self.host.set_up(index)?;
                index
            }
            Some(_) => return Err(Error::NotDummy(name)),
        };
        self.link = Some(index);
        Ok(())
    }

    /// Sets the sysctls IPVS mode needs where they differ; returns one line per sysctl set.
    fn ensure_sysctls(&mut self, plan: &Plan) -> Result<Vec<String>, Error> {
        let families: Vec<IpFamily> = plan.families.keys().copied().collect();
        ensure_node_sysctls(&mut self.host, &self.config, &families)
    }

    /// Takes one virtual service from what is applied to what is wanted; returns the number of
    /// IPVS changes.
    fn reconcile_service(&mut self, key: ServiceKey) -> Result<usize, Error> {
        let desired = self.vs_owners.get(&key).and_then(|o| o.values().next()).cloned();
        let now = Instant::now();
        let mut ops = Vec::new();
        let kept = desired.is_none() && self.applied.contains_key(&key) && self.keeps_while_connected(&key, now)?;
        match (desired, self.applied.get_mut(&key)) {
            (None, None) => {}
            (None, Some(a)) if kept => {
                // Its connections go on; new ones are refused, as by a deleted service.
                for (dest, weight) in a.dests.iter_mut().filter(|(_, w)| **w != 0) {
                    ops.push(IpvsOp::UpdateDest(key, DestSpec { key: *dest, weight: 0 }));
                    *weight = 0;
                }
            }
            (None, Some(_)) => {
                ops.push(IpvsOp::DeleteService(key));
                self.applied.remove(&key);
                self.draining.retain(|(s, _), _| *s != key);
                self.draining_services.remove(&key);
            }
            (Some(d), None) => {
                ops.push(IpvsOp::AddService(d.spec.clone()));
                ops.extend(d.dests.iter().map(|k| IpvsOp::AddDest(key, DestSpec { key: *k, weight: 1 })));
                let dests = d.dests.iter().map(|k| (*k, 1)).collect();
                self.applied.insert(key, AppliedVs { spec: d.spec, protocol: d.protocol, dests });
            }
            (Some(d), Some(a)) => {
                self.draining_services.remove(&key);
                if a.spec != d.spec {
                    ops.push(IpvsOp::UpdateService(d.spec.clone()));
                    a.spec = d.spec.clone();
                }
                a.protocol = d.protocol;
                for dest in &d.dests {
                    match a.dests.get(dest) {
                        None => ops.push(IpvsOp::AddDest(key, DestSpec { key: *dest, weight: 1 })),
                        Some(1) => {}
                        Some(_) => ops.push(IpvsOp::UpdateDest(key, DestSpec { key: *dest, weight: 1 })),
                    }
                    a.dests.insert(*dest, 1);
                    self.draining.remove(&(key, *dest));
                }
                let gone: Vec<(DestKey, u32)> =
                    a.dests.iter().filter(|(k, _)| !d.dests.contains(k)).map(|(k, w)| (*k, *w)).collect();
                for (dest, weight) in gone {
                    if d.protocol == Protocol::Udp {
                        ops.push(IpvsOp::DeleteDest(key, dest));
                        a.dests.remove(&dest);
                        self.draining.remove(&(key, dest));
                        continue;
                    }
                    if weight != 0 {
                        ops.push(IpvsOp::UpdateDest(key, DestSpec { key: dest, weight: 0 }));
                        a.dests.insert(dest, 0);
                    }
                    self.draining.entry((key, dest)).or_insert(now);
                }
            }
        }
        for op in &ops {
            apply(&mut self.host, op)?;
        }
        Ok(ops.len())
    }

    /// Whether an unwanted virtual service stays for now, while it carries connections within
    /// the graceful period, its real servers at weight 0 meanwhile (no new connection): a TCP or
    /// SCTP address service off the dummy interface (no VIP of kproxy's: a node address), and a
    /// firewall-mark service in kproxy's range (an earlier kproxy's NodePort: until 2026-12-07
    /// NodePorts were firewall-mark services; no rule marks packets for it any more). A VIP's
    /// service goes at once, as upstream's does (its address leaves the interface with it).
    /// Whether a kernel virtual service is kproxy's to keep in line: one it wants (a NodePort on
    /// a node address inside `excludeCIDRs` too: the exclusion spares services kproxy does not
    /// want, as upstream's), or one in its ranges ([`owned`]).
    fn is_ours(&self, key: &ServiceKey) -> bool {
        self.vs_owners.contains_key(key) || owned(&self.config, key)
    }

    fn keeps_while_connected(&mut self, key: &ServiceKey, now: Instant) -> Result<bool, Error> {
        if let ServiceKey::Addr { addr, protocol, .. } = key
            && (*protocol == Protocol::Udp || self.addr_owners.contains_key(addr) || self.applied_addrs.contains(addr))
        {
            return Ok(false);
        }
        let since = *self.draining_services.get(key).unwrap_or(&now);
        if since.elapsed() >= self.config.graceful_period {
            return Ok(false);
        }
        let connections: u64 = self.host.ipvs_dests(key)?.iter().map(DestState::connections).sum();
        if connections == 0 {
            return Ok(false);
        }
        if !self.draining_services.contains_key(key) {
            tracing::info!(service = %key, connections, "an unwanted IPVS virtual service stays until its connections end");
            self.draining_services.insert(*key, now);
        }
        Ok(true)
    }

    fn reconcile_address(&mut self, addr: IpAddr) -> Result<usize, Error> {
        let Some(link) = self.link else { return Ok(0) };
        let wanted = self.addr_owners.contains_key(&addr);
        if wanted == self.applied_addrs.contains(&addr) {
            return Ok(0);
        }
        match self.host.set_address(link, addr, wanted) {
            Ok(()) => {}
            Err(e) if wanted && e.errno() == Some(EEXIST) => {}
            Err(e) if !wanted && matches!(e.errno(), Some(99) | Some(ENOENT)) => {}
            Err(e) => return Err(e),
        }
        if wanted {
            self.applied_addrs.insert(addr);
        } else {
            self.applied_addrs.remove(&addr);
        }
        Ok(1)
    }

    /// Deletes draining real servers, and unwanted virtual services kept for their connections,
    /// that have no connections left or whose grace period is over; returns how many. Runs with
    /// every sync; call it between syncs to reap sooner.
    pub fn reap_drained(&mut self) -> Result<usize, Error> {
        let mut deleted = 0;
        let unwanted: Vec<ServiceKey> = self.draining_services.keys().copied().collect();
        for key in unwanted {
            if self.vs_owners.contains_key(&key) {
                // Wanted again: the sync that wants it reconciles it.
                self.draining_services.remove(&key);
            } else {
                deleted += self.reconcile_service(key)?;
            }
        }
        let services: BTreeSet<ServiceKey> = self.draining.keys().map(|(s, _)| *s).collect();
        for key in services {
            let current = self.host.ipvs_dests(&key)?;
            let candidates: Vec<(DestKey, Instant)> =
                self.draining.iter().filter(|((s, _), _)| *s == key).map(|((_, d), t)| (*d, *t)).collect();
            for (dest, since) in candidates {
                let conns = current.iter().find(|d| d.spec.key == dest).map(DestState::connections);
                let expired = since.elapsed() >= self.config.graceful_period;
                if conns.is_some_and(|c| c > 0) && !expired {
                    continue;
                }
                if conns.is_some() {
                    apply(&mut self.host, &IpvsOp::DeleteDest(key, dest))?;
                    deleted += 1;
                }
                self.draining.remove(&(key, dest));
                if let Some(a) = self.applied.get_mut(&key) {
                    a.dests.remove(&dest);
                }
            }
        }
        Ok(deleted)
    }

    /// Removes the IPVS services, the dummy interface and the auxiliary tables, and forgets the
    /// applied state (`kproxy --cleanup`).
    pub fn cleanup(&mut self) -> Result<(), Error> {
        cleanup(&mut self.host, &self.config)?;
        self.families.clear();
        self.vs_owners.clear();
        self.applied.clear();
        self.draining.clear();
        self.draining_services.clear();
        self.addr_owners.clear();
        self.applied_addrs.clear();
        self.link = None;
        self.aux = Applied::default();
        self.in_sync = false;
        Ok(())
    }
}

/// Records which kernel objects the service port `name` wants (`add`) or no longer wants.
fn own(
    vs_owners: &mut BTreeMap<ServiceKey, BTreeMap<ServicePortName, DesiredVs>>,
    addr_owners: &mut BTreeMap<IpAddr, BTreeSet<ServicePortName>>,
    elements: &mut BTreeMap<ElementKey, BTreeMap<ServicePortName, Option<MapData>>>,
    name: &ServicePortName,
    objects: &PortObjects,
    add: bool,
) {
    for vs in &objects.services {
        let owners = vs_owners.entry(vs.spec.key).or_default();
        if add {
            owners.insert(name.clone(), vs.clone());
        } else {
            owners.remove(name);
            if owners.is_empty() {
                vs_owners.remove(&vs.spec.key);
            }
        }
    }
    for addr in &objects.vips {
        let owners = addr_owners.entry(*addr).or_default();
        if add {
            owners.insert(name.clone());
        } else {
            owners.remove(name);
            if owners.is_empty() {
                addr_owners.remove(addr);
            }
        }
    }
    for e in &objects.elements {
        let key = (e.set.clone(), e.key.clone());
        let owners = elements.entry(key.clone()).or_default();
        if add {
            owners.insert(name.clone(), e.value.clone());
        } else {
            owners.remove(name);
            if owners.is_empty() {
                elements.remove(&key);
            }
        }
    }
}

/// Notes what `objects` touches, with each element's effective value before the change.
fn note(
    objects: &PortObjects,
    elements: &BTreeMap<ElementKey, BTreeMap<ServicePortName, Option<MapData>>>,
    before: &mut BTreeMap<ElementKey, Option<Option<MapData>>>,
    vs: &mut BTreeSet<ServiceKey>,
    addrs: &mut BTreeSet<IpAddr>,
) {
    vs.extend(objects.services.iter().map(|s| s.spec.key));
    addrs.extend(objects.vips.iter().copied());
    for e in &objects.elements {
        let key = (e.set.clone(), e.key.clone());
        before.entry(key.clone()).or_insert_with(|| effective(elements.get(&key)));
    }
}

fn is_link_local(addr: &IpAddr) -> bool {
    match addr {
        IpAddr::V4(_) => false,
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

fn table_ref(family: IpFamily, name: &str) -> TableRef {
    let family = match family {
        IpFamily::V4 => TableFamily::Ip,
        IpFamily::V6 => TableFamily::Ip6,
    };
    TableRef { family, name: name.to_owned() }
}

fn full_table(cfg: &Config, state: &FamilyState, tx: &mut Transaction) {
    let table = state.ctx.table.clone();
    let skel = aux_table::skeleton(cfg, &state.ctx, &state.node);
    let comment = Some("IPVS dataplane rules for kproxy".to_owned());
    tx.push(Op::AddTable { table: table.clone(), comment: comment.clone() });
    tx.push(Op::DeleteTable(table.clone()));
    tx.push(Op::AddTable { table: table.clone(), comment });
    for (chain, _) in &skel.chains {
        tx.push(Op::AddChain(table.clone(), chain.clone()));
    }
    for def in skel.sets {
        tx.push(Op::AddSet(table.clone(), def));
    }
    for (chain, rules) in skel.chains {
        tx.add_rules(&table, &chain.name, rules);
    }
    for e in skel.elements {
        tx.push(Op::AddElement(table.clone(), e));
    }
    for ((set, key), owners) in &state.elements {
        if let Some(value) = effective(Some(owners)) {
            tx.push(Op::AddElement(table.clone(), Element { set: set.clone(), key: key.clone(), value }));
        }
    }
}

/// The sysctls IPVS mode needs for `families`, with their values.
pub fn node_sysctls(config: &Config, families: &[IpFamily]) -> Vec<(&'static str, &'static str)> {
    let mut wanted = vec![
        // IPVS keeps conntrack entries: the auxiliary table's marks and masquerading need them.
        ("net/ipv4/vs/conntrack", "1"),
        // Drop a connection's packets once its real server is deleted, so clients reconnect.
        ("net/ipv4/vs/expire_nodest_conn", "1"),
        // Persistence templates of a weight-0 (draining) real server expire.
        ("net/ipv4/vs/expire_quiescent_template", "1"),
    ];
    if families.contains(&IpFamily::V4) {
        wanted.push(("net/ipv4/ip_forward", "1"));
    }
    if families.contains(&IpFamily::V6) {
        wanted.push(("net/ipv6/conf/all/forwarding", "1"));
    }
    if config.strict_arp {
        wanted.push(("net/ipv4/conf/all/arp_ignore", "1"));
        wanted.push(("net/ipv4/conf/all/arp_announce", "2"));
    }
    wanted
}

/// Sets [`node_sysctls`] where they differ (nothing is written where they are right, so an
/// unprivileged container whose `/proc/sys` is read-only runs once `kproxy --init-only` set
/// them); returns one line per sysctl set. The IPVS ones exist once `ip_vs` is loaded: asking
/// for its generic netlink family makes the kernel load it.
pub fn ensure_node_sysctls<H: Host>(
    host: &mut H,
    config: &Config,
    families: &[IpFamily],
) -> Result<Vec<String>, Error> {
    let mut set = Vec::new();
    for (path, value) in node_sysctls(config, families) {
        match host.sysctl(path)? {
            Some(v) if v == value => {}
            Some(was) => {
                tracing::info!(sysctl = path, value, "setting sysctl");
                host.set_sysctl(path, value)?;
                set.push(format!("sysctl {path} was {was}, set to {value}"));
            }
            None => tracing::warn!(sysctl = path, "sysctl missing; not set"),
        }
    }
    Ok(set)
}

/// Whether a kernel virtual service is kproxy's: address services outside `excludeCIDRs`, and
/// firewall-mark services in kproxy's mark range.
fn owned(cfg: &Config, key: &ServiceKey) -> bool {
    match key {
        ServiceKey::Addr { .. } => is_proxy_service(cfg, key),
        ServiceKey::Fwmark { mark, .. } => cfg.owns_fwmark(*mark),
    }
}

/// Whether a kernel virtual service is a Service proxy's by upstream kube-proxy's convention
/// (which kproxy's IPVS mode shares): an address service outside `ipvs.excludeCIDRs`. Taking a
/// node over from kube-proxy's IPVS mode removes exactly these.
pub fn is_proxy_service(cfg: &Config, key: &ServiceKey) -> bool {
    match key {
        ServiceKey::Addr { addr, .. } => !cfg.exclude_cidrs.iter().any(|c| c.contains(addr)),
        ServiceKey::Fwmark { .. } => false,
    }
}

/// Sends one IPVS change, idempotently: an add of something that exists becomes an edit, an
/// edit of something missing an add, a delete of something missing is done.
fn apply<H: Host>(host: &mut H, op: &IpvsOp) -> Result<(), Error> {
    let Err(e) = host.ipvs(op) else { return Ok(()) };
    match (op, e.errno()) {
        (IpvsOp::AddService(s), Some(EEXIST)) => host.ipvs(&IpvsOp::UpdateService(s.clone())),
        (IpvsOp::UpdateService(s), Some(ESRCH | ENOENT)) => host.ipvs(&IpvsOp::AddService(s.clone())),
        (IpvsOp::AddDest(k, d), Some(EEXIST)) => host.ipvs(&IpvsOp::UpdateDest(*k, *d)),
        (IpvsOp::UpdateDest(k, d), Some(ENOENT)) => host.ipvs(&IpvsOp::AddDest(*k, *d)),
        (IpvsOp::DeleteService(_) | IpvsOp::DeleteDest(..), Some(ESRCH | ENOENT)) => Ok(()),
        _ => Err(e),
    }
}

/// `kproxy --cleanup` for IPVS mode: deletes kproxy's virtual services (address services outside
/// `excludeCIDRs`, firewall-mark services in kproxy's range), the dummy interface and the
/// auxiliary tables; nothing else. Works without a prior sync and when IPVS is not loaded.
pub fn cleanup<H: Host>(host: &mut H, config: &Config) -> Result<(), Error> {
    delete_services(host, |key| owned(config, key))?;
    if let Some((index, Some(kind))) = host.link(&config.interface)?
        && kind == "dummy"
    {
        host.delete_link(index)?;
    }
    delete_aux_tables(host, config)
}

/// What only kproxy's IPVS mode has, when kube-proxy's IPVS mode runs on the node again and owns
/// the address services and the dummy interface (handing the node back): kproxy's
/// firewall-mark services and its auxiliary tables.
pub fn cleanup_kproxy_only<H: Host>(host: &mut H, config: &Config) -> Result<(), Error> {
    delete_services(host, |key| matches!(key, ServiceKey::Fwmark { mark, .. } if config.owns_fwmark(*mark)))?;
    delete_aux_tables(host, config)
}

fn delete_services<H: Host>(host: &mut H, doomed: impl Fn(&ServiceKey) -> bool) -> Result<(), Error> {
    match host.ipvs_services() {
        Ok(services) => {
            for s in services.iter().filter(|s| doomed(&s.key)) {
                apply(host, &IpvsOp::DeleteService(s.key))?;
            }
            Ok(())
        }
        Err(Error::NoIpvs(_)) => Ok(()),
        Err(e) => Err(e),
    }
}

fn delete_aux_tables<H: Host>(host: &mut H, config: &Config) -> Result<(), Error> {
    let mut tx = Transaction::new();
    for family in IpFamily::BOTH {
        let table = table_ref(family, &config.table);
        tx.push(Op::AddTable { table: table.clone(), comment: None });
        tx.push(Op::DeleteTable(table));
    }
    host.nft(&tx)
}

impl<H: Host + Send> kproxy_plan::Dataplane for IpvsDataplane<H> {
    fn full_sync(&mut self, plan: &Plan) -> Result<(), kproxy_plan::DataplaneError> {
        IpvsDataplane::full_sync(self, plan)?;
        Ok(())
    }

    fn partial_sync(&mut self, plan: &Plan, delta: &PlanDelta) -> Result<(), kproxy_plan::DataplaneError> {
        self.sync(plan, delta)?;
        Ok(())
    }

    fn cleanup(&mut self) -> Result<(), kproxy_plan::DataplaneError> {
        IpvsDataplane::cleanup(self)?;
        Ok(())
    }

    fn verify(&mut self, plan: &Plan) -> Result<kproxy_plan::Verified, kproxy_plan::DataplaneError> {
        Ok(IpvsDataplane::verify(self, plan)?)
    }
}

//! The periodic check (every `syncPeriod`): does the kernel still hold what kproxy applied?
//!
//! It reads, and writes only where something differs:
//! - the sysctls IPVS mode sets (a few small files);
//! - the dummy interface (one request) and its addresses (one dump);
//! - every virtual service with its real servers ([`Host::ipvs_table`]: one dump of the
//!   services and one read of `/proc/net/ip_vs` on the kernel, not a dump per service);
//! - the auxiliary tables: the nf_tables generation first (one request; unchanged since kproxy's
//!   last commit means nobody touched them), and only when it moved, one listing per table,
//!   compared with the summary kept of what kproxy applied (the nftables dataplane's check).
//!
//! What differs is compared with what kproxy applied and repaired where it is: a missing or
//! changed virtual service or real server, an unexpected one (kproxy's range only), an address,
//! a chain or set of the auxiliary table, or a whole table. Each repair is one line of the
//! report. Only a replaced or deleted dummy interface falls back to a full sync. Real servers
//! that finished draining are deleted, as after every sync; that is not drift.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use kproxy_nft_model::Transaction;
use kproxy_nftables::ExecError;
use kproxy_nftables::kernel::{Desired, Drift, list_all, repair_ops};
use kproxy_plan::{Plan, Verified};

use super::{AppliedVs, IpvsDataplane, full_table, is_link_local};
use crate::error::Error;
use crate::genl::{DestKey, ServiceKey, ServiceSpec};
use crate::host::{Host, HostNft};

/// A virtual service as the kernel holds it: its settings and each real server's weight.
type LiveVs = (ServiceSpec, BTreeMap<DestKey, u32>);

impl<H: Host> IpvsDataplane<H> {
    /// Checks that the kernel still holds `plan` (the plan of the last sync) as kproxy applied
    /// it, and repairs what someone else changed (see [`self`]). A dataplane that is not in
    /// sync (a failed sync, or another plan) gets a full sync instead.
    pub fn verify(&mut self, plan: &Plan) -> Result<Verified, Error> {
        let same_plan = plan.families.len() == self.families.len()
            && plan.families.iter().all(|(f, fam)| self.families.get(f).is_some_and(|s| s.node == fam.node));
        if !self.in_sync || !same_plan {
            self.full_sync(plan)?;
            return Ok(Verified::Rewritten);
        }
        match self.check_and_repair(plan) {
            Ok((drift, AuxCheck::Busy)) if drift.is_empty() => Ok(Verified::Busy),
            Ok((drift, _)) if drift.is_empty() => Ok(Verified::Clean),
            Ok((drift, _)) => {
                tracing::debug!(?drift, "kproxy's IPVS state was changed by someone else; repaired");
                Ok(Verified::Repaired(drift))
            }
            Err(e) => {
                tracing::warn!(error = %e, "the periodic IPVS check failed; the next sync is a full reconcile");
                self.in_sync = false;
                Err(e)
            }
        }
    }

    /// Reads everything, then repairs in the order of a partial sync (new addresses first,
    /// then IPVS, then the auxiliary tables, then addresses that go); returns what differed,
    /// and how the auxiliary tables' check went.
    fn check_and_repair(&mut self, plan: &Plan) -> Result<(Vec<String>, AuxCheck), Error> {
        let mut drift = self.ensure_sysctls(plan)?;
        let name = self.config.interface.clone();
        let link = self.host.link(&name)?;
        if link.as_ref().map(|(index, kind)| (Some(*index), kind.as_deref())) != Some((self.link, Some("dummy"))) {
            drift.push(format!("interface {name} is gone or was replaced"));
            self.full_sync(plan)?;
            return Ok((drift, AuxCheck::Same));
        }
        let (missing, unexpected) = self.address_drift(&mut drift)?;
        let services = self.ipvs_drift(&mut drift)?;
        let aux = self.aux_drift(&mut drift)?;
        for addr in missing {
            self.reconcile_address(addr)?;
        }
        for key in services {
            self.reconcile_service(key)?;
        }
        if let AuxCheck::Repair(tx) = &aux {
            // The repair restores what was applied: the summary stays what it was.
            let expected = self.aux.listings.clone();
            self.aux.apply(&mut HostNft(&mut self.host), tx)?;
            self.aux.listings = expected;
        }
        for addr in unexpected {
            self.reconcile_address(addr)?;
        }
        self.reap_drained()?;
        Ok((drift, aux))
    }

    /// Compares the dummy interface's addresses with the VIPs; returns those to add and those
    /// to remove, with `applied_addrs` set to what the kernel has so that
    /// [`Self::reconcile_address`] repairs them.
    fn address_drift(&mut self, drift: &mut Vec<String>) -> Result<(Vec<IpAddr>, Vec<IpAddr>), Error> {
        let Some(link) = self.link else { return Ok((Vec::new(), Vec::new())) };
        let live: BTreeSet<IpAddr> = self.host.addresses(link)?.into_iter().filter(|a| !is_link_local(a)).collect();
        let interface = &self.config.interface;
        let missing: Vec<IpAddr> = self.addr_owners.keys().filter(|a| !live.contains(a)).copied().collect();
        let unexpected: Vec<IpAddr> = live.iter().filter(|a| !self.addr_owners.contains_key(a)).copied().collect();
        drift.extend(missing.iter().map(|a| format!("address {a} is missing from {interface}")));
        drift.extend(unexpected.iter().map(|a| format!("unexpected address {a} on {interface}")));
        self.applied_addrs = live;
        Ok((missing, unexpected))
    }

    /// Compares kproxy's virtual services in the kernel with what was applied; returns the
    /// services that differ, with their applied state set to what the kernel has so that
    /// [`Self::reconcile_service`] repairs them.
    fn ipvs_drift(&mut self, drift: &mut Vec<String>) -> Result<Vec<ServiceKey>, Error> {
        let mut live: BTreeMap<ServiceKey, LiveVs> = BTreeMap::new();
        for (spec, dests) in self.host.ipvs_table()? {
            if self.is_ours(&spec.key) {
                let weights = dests.into_iter().map(|d| (d.spec.key, d.spec.weight)).collect();
                live.insert(spec.key, (spec, weights));
            }
        }
        let keys: BTreeSet<ServiceKey> = self.applied.keys().chain(live.keys()).copied().collect();
        let mut differing = Vec::new();
        for key in keys {
            if self.draining_services.contains_key(&key) {
                // Not kproxy's to keep in line (kube-proxy may still write it): only followed,
                // and deleted once its connections end.
                self.follow_kernel(key, live.remove(&key));
                continue;
            }
            let lines = match (self.applied.get(&key), live.get(&key)) {
                (Some(applied), Some(live)) => service_drift(&key, applied, live),
                (Some(_), None) => vec![format!("IPVS virtual service {key} is missing")],
                (None, _) => vec![format!("unexpected IPVS virtual service {key}")],
            };
            if lines.is_empty() {
                continue;
            }
            drift.extend(lines);
            self.follow_kernel(key, live.remove(&key));
            differing.push(key);
        }
        Ok(differing)
    }

    /// Sets the applied state of `key` to what the kernel has (`None`: no such service).
    fn follow_kernel(&mut self, key: ServiceKey, live: Option<LiveVs>) {
        match live {
            Some((spec, dests)) => {
                // Draining real servers the kernel no longer has need no more draining.
                self.draining.retain(|(s, d), _| *s != key || dests.contains_key(d));
                let protocol = self.applied.get(&key).map_or_else(|| self.protocol_of(&key), |a| a.protocol);
                self.applied.insert(key, AppliedVs { spec, protocol, dests });
            }
            None => {
                self.applied.remove(&key);
                self.draining.retain(|(s, _), _| *s != key);
                self.draining_services.remove(&key);
            }
        }
    }

    /// Lists the auxiliary tables if anyone committed to nf_tables since kproxy's last commit;
    /// returns the transaction that repairs those that differ from what kproxy applied.
    fn aux_drift(&mut self, drift: &mut Vec<String>) -> Result<AuxCheck, Error> {
        let generation = self.host.nft_generation()?;
        if generation.is_some() && generation == self.aux.generation {
            return Ok(AuxCheck::Same);
        }
        let tables = self.families.values().map(|s| s.ctx.table.clone());
        let live = match list_all(&mut HostNft(&mut self.host), tables) {
            Ok(Some(live)) => live,
            Ok(None) => return Ok(AuxCheck::Same),
            // Another program kept committing while the tables were listed: no listing was one
            // ruleset. The generation still differs, so the next check lists them again.
            Err(ExecError::Netlink(e)) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(AuxCheck::Busy),
            Err(e) => return Err(e.into()),
        };
        let mut tx = Transaction::new();
        for state in self.families.values() {
            let table = &state.ctx.table;
            let listing = live.get(table).cloned().unwrap_or_default();
            let expected = self.aux.listings.get(table);
            let differences = Drift::between(&listing, &expected);
            if differences.is_empty() {
                continue;
            }
            if listing.chains.is_empty() {
                // One line, not one per chain and set it held; the table is built again.
                drift.push(format!("{table}: the table is gone"));
                full_table(&self.config, state, &mut tx);
                continue;
            }
            drift.extend(listing.drift(&expected).into_iter().map(|l| format!("{table}: {l}")));
            let mut whole = Transaction::new();
            full_table(&self.config, state, &mut whole);
            let mut desired = Desired::default();
            for op in whole.into_ops() {
                desired.collect(table, op);
            }
            repair_ops(table, desired, &differences, &mut tx);
        }
        if tx.is_empty() {
            self.aux.generation = generation;
            return Ok(AuxCheck::Same);
        }
        Ok(AuxCheck::Repair(tx))
    }
}

/// How the check of the auxiliary tables went.
enum AuxCheck {
    /// They hold what kproxy applied.
    Same,
    /// They differ; the transaction repairs them.
    Repair(Transaction),
    /// Another program kept committing while they were listed: not checked this time.
    Busy,
}

fn dest_name(d: &DestKey) -> SocketAddr {
    SocketAddr::new(d.addr, d.port)
}

/// How a virtual service in the kernel differs from what was applied, one line each. A
/// draining real server (weight 0) that is gone is not drift: it was on its way out.
fn service_drift(key: &ServiceKey, applied: &AppliedVs, (spec, dests): &LiveVs) -> Vec<String> {
    let mut lines = Vec::new();
    if &applied.spec != spec {
        let (a, s) = (&applied.spec, spec);
        lines.push(format!(
            "IPVS virtual service {key} has scheduler {} flags {:#x} timeout {}, expected {} {:#x} {}",
            s.scheduler, s.flags, s.timeout, a.scheduler, a.flags, a.timeout
        ));
    }
    for (dest, weight) in &applied.dests {
        match dests.get(dest) {
            None if *weight == 0 => {}
            None => lines.push(format!("real server {} of IPVS virtual service {key} is missing", dest_name(dest))),
            Some(w) if w != weight => lines.push(format!(
                "real server {} of IPVS virtual service {key} has weight {w}, expected {weight}",
                dest_name(dest)
            )),
            Some(_) => {}
        }
    }
    for dest in dests.keys().filter(|d| !applied.dests.contains_key(d)) {
        lines.push(format!("unexpected real server {} of IPVS virtual service {key}", dest_name(dest)));
    }
    lines
}

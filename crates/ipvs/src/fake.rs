//! An in-memory kernel for tests and `--dry-run`: it keeps an IPVS table, interfaces, sysctls
//! and the nftables transactions, answers like the kernel (`EEXIST`, `ESRCH`, `ENOENT`), and
//! records every change in order.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kproxy_nft_model::{Listings, TableListing, TableRef};
use kproxy_nftables::Transaction;

use crate::error::Error;
use crate::genl::{DestKey, DestState, IpvsOp, ServiceKey, ServiceSpec};
use crate::host::{EEXIST, ENODEV, ENOENT, ESRCH, Host};
use crate::netlink::NetlinkError;

/// One virtual service in the fake IPVS table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeService {
    /// The service.
    pub spec: ServiceSpec,
    /// Its real servers.
    pub dests: BTreeMap<DestKey, DestState>,
}

/// One interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeLink {
    /// Index.
    pub index: u32,
    /// Link kind (`dummy`), `None` for physical ones.
    pub kind: Option<String>,
    /// Up.
    pub up: bool,
    /// Addresses.
    pub addresses: BTreeSet<IpAddr>,
}

/// The in-memory kernel.
#[derive(Debug, Clone, Default)]
pub struct FakeHost {
    /// IPVS table.
    pub services: BTreeMap<ServiceKey, FakeService>,
    /// Interfaces by name.
    pub links: BTreeMap<String, FakeLink>,
    /// Sysctls by path (`net/ipv4/vs/conntrack`).
    pub sysctls: BTreeMap<String, String>,
    /// Every nftables transaction applied.
    pub nft: Vec<Transaction>,
    /// What the nftables tables hold, summarised as the kernel lists them (tests change it to
    /// play someone else; see [`FakeHost::tamper_nft`]).
    pub nft_tables: Listings,
    /// The nf_tables generation: bumped by every transaction, kproxy's or a tamperer's.
    pub nft_generation: u32,
    /// Number of nftables table listings answered.
    pub nft_listings: usize,
    /// Every IPVS change accepted, in order.
    pub ipvs_ops: Vec<IpvsOp>,
    /// Every change of any kind, in order, as text.
    pub log: Vec<String>,
    /// Number of dumps (services, real servers, or the whole table) answered.
    pub dumps: usize,
    /// Fail the next IPVS change.
    pub fail_next_ipvs: bool,
    /// Answer every nftables listing as the netlink executor does when another program keeps
    /// committing: `Interrupted`, no listing.
    pub nft_busy: bool,
}

impl FakeHost {
    /// A kernel with IPVS loaded and its sysctls at their defaults.
    pub fn new() -> Self {
        let mut h = Self::default();
        for (k, v) in [
            ("net/ipv4/vs/conntrack", "0"),
            ("net/ipv4/vs/expire_nodest_conn", "0"),
            ("net/ipv4/vs/expire_quiescent_template", "0"),
            ("net/ipv4/ip_forward", "0"),
            ("net/ipv6/conf/all/forwarding", "0"),
            ("net/ipv4/conf/all/arp_ignore", "0"),
            ("net/ipv4/conf/all/arp_announce", "0"),
        ] {
            h.sysctls.insert(k.to_owned(), v.to_owned());
        }
        h.links.insert(
            "eth0".into(),
            FakeLink {
                index: 2,
                kind: None,
                up: true,
                addresses: BTreeSet::from(["198.18.0.2".parse().unwrap_or(IpAddr::from([0, 0, 0, 0]))]),
            },
        );
        h
    }

    /// Forgets the recorded changes (keeps the state).
    pub fn clear_log(&mut self) {
        self.ipvs_ops.clear();
        self.log.clear();
        self.nft.clear();
        self.dumps = 0;
        self.nft_listings = 0;
    }

    /// Someone else changes the nftables tables: `change` edits their summary, and the
    /// generation moves as a commit moves it.
    pub fn tamper_nft(&mut self, change: impl FnOnce(&mut Listings)) {
        change(&mut self.nft_tables);
        self.nft_generation = self.nft_generation.wrapping_add(1);
    }

    /// Pretends `conns` connections are active on a real server.
    pub fn set_active(&mut self, key: &ServiceKey, dest: &DestKey, conns: u32) {
        if let Some(d) = self.services.get_mut(key).and_then(|s| s.dests.get_mut(dest)) {
            d.active_conns = conns;
        }
    }

    fn err(errno: i32, op: &IpvsOp) -> Error {
        Error::Ipvs { op: format!("{op:?}"), source: NetlinkError::Kernel(errno) }
    }
}

impl Host for FakeHost {
    fn ipvs_services(&mut self) -> Result<Vec<ServiceSpec>, Error> {
        self.dumps += 1;
        Ok(self.services.values().map(|s| s.spec.clone()).collect())
    }

    fn ipvs_dests(&mut self, key: &ServiceKey) -> Result<Vec<DestState>, Error> {
        self.dumps += 1;
        match self.services.get(key) {
            Some(s) => Ok(s.dests.values().copied().collect()),
            None => Err(Error::Ipvs { op: "list".into(), source: NetlinkError::Kernel(ESRCH) }),
        }
    }

    /// The whole table in one dump, as the kernel host reads it.
    fn ipvs_table(&mut self) -> Result<Vec<(ServiceSpec, Vec<DestState>)>, Error> {
        self.dumps += 1;
        Ok(self.services.values().map(|s| (s.spec.clone(), s.dests.values().copied().collect())).collect())
    }

    fn ipvs(&mut self, op: &IpvsOp) -> Result<(), Error> {
        if std::mem::take(&mut self.fail_next_ipvs) {
            return Err(Error::Injected);
        }
        match op {
            IpvsOp::AddService(spec) => {
                if self.services.contains_key(&spec.key) {
                    return Err(Self::err(EEXIST, op));
                }
                self.services.insert(spec.key, FakeService { spec: spec.clone(), dests: BTreeMap::new() });
            }
            IpvsOp::UpdateService(spec) => match self.services.get_mut(&spec.key) {
                Some(s) => s.spec = spec.clone(),
                None => return Err(Self::err(ESRCH, op)),
            },
            IpvsOp::DeleteService(key) => {
                if self.services.remove(key).is_none() {
                    return Err(Self::err(ESRCH, op));
                }
            }
            IpvsOp::AddDest(key, d) | IpvsOp::UpdateDest(key, d) => {
                let Some(s) = self.services.get_mut(key) else { return Err(Self::err(ESRCH, op)) };
                let exists = s.dests.contains_key(&d.key);
                match (op, exists) {
                    (IpvsOp::AddDest(..), true) => return Err(Self::err(EEXIST, op)),
                    (IpvsOp::UpdateDest(..), false) => return Err(Self::err(ENOENT, op)),
                    _ => {}
                }
                let entry = s.dests.entry(d.key).or_insert(DestState { spec: *d, active_conns: 0, inactive_conns: 0 });
                entry.spec = *d;
            }
            IpvsOp::DeleteDest(key, d) => {
                let Some(s) = self.services.get_mut(key) else { return Err(Self::err(ESRCH, op)) };
                if s.dests.remove(d).is_none() {
                    return Err(Self::err(ENOENT, op));
                }
            }
            IpvsOp::SetTimeouts { .. } => {}
        }
        self.ipvs_ops.push(op.clone());
        self.log.push(format!("ipvs {op:?}"));
        Ok(())
    }

    fn link(&mut self, name: &str) -> Result<Option<(u32, Option<String>)>, Error> {
        Ok(self.links.get(name).map(|l| (l.index, l.kind.clone())))
    }

    fn create_dummy(&mut self, name: &str) -> Result<u32, Error> {
        if self.links.contains_key(name) {
            return Err(Error::Link { op: format!("create {name}"), source: NetlinkError::Kernel(EEXIST) });
        }
        let index = self.links.values().map(|l| l.index).max().unwrap_or(1) + 1;
        self.links.insert(
            name.to_owned(),
            FakeLink { index, kind: Some("dummy".into()), up: true, addresses: BTreeSet::new() },
        );
        self.log.push(format!("link add {name}"));
        Ok(index)
    }

    fn set_up(&mut self, index: u32) -> Result<(), Error> {
        match self.links.values_mut().find(|l| l.index == index) {
            Some(l) => {
                l.up = true;
                Ok(())
            }
            None => Err(Error::Link { op: "up".into(), source: NetlinkError::Kernel(ENODEV) }),
        }
    }

    fn delete_link(&mut self, index: u32) -> Result<(), Error> {
        let name = self.links.iter().find(|(_, l)| l.index == index).map(|(n, _)| n.clone());
        match name {
            Some(n) => {
                self.links.remove(&n);
                self.log.push(format!("link del {n}"));
                Ok(())
            }
            None => Err(Error::Link { op: "delete".into(), source: NetlinkError::Kernel(ENODEV) }),
        }
    }

    fn addresses(&mut self, index: u32) -> Result<Vec<IpAddr>, Error> {
        Ok(self.links.values().filter(|l| l.index == index).flat_map(|l| l.addresses.iter().copied()).collect())
    }

    fn set_address(&mut self, index: u32, addr: IpAddr, add: bool) -> Result<(), Error> {
        let Some(l) = self.links.values_mut().find(|l| l.index == index) else {
            return Err(Error::Link { op: "address".into(), source: NetlinkError::Kernel(ENODEV) });
        };
        let changed = if add { l.addresses.insert(addr) } else { l.addresses.remove(&addr) };
        if !changed {
            let errno = if add { EEXIST } else { 99 };
            return Err(Error::Link { op: "address".into(), source: NetlinkError::Kernel(errno) });
        }
        self.log.push(format!("addr {} {addr}", if add { "add" } else { "del" }));
        Ok(())
    }

    fn sysctl(&mut self, path: &str) -> Result<Option<String>, Error> {
        Ok(self.sysctls.get(path).cloned())
    }

    fn set_sysctl(&mut self, path: &str, value: &str) -> Result<(), Error> {
        self.sysctls.insert(path.to_owned(), value.to_owned());
        self.log.push(format!("sysctl {path}={value}"));
        Ok(())
    }

    fn nft(&mut self, tx: &Transaction) -> Result<(), Error> {
        if !tx.is_empty() {
            self.log.push(format!("nft {} ops", tx.len()));
            self.nft.push(tx.clone());
            self.nft_tables.apply(tx);
            self.nft_generation = self.nft_generation.wrapping_add(1);
        }
        Ok(())
    }

    fn nft_generation(&mut self) -> Result<Option<u32>, Error> {
        Ok(Some(self.nft_generation))
    }

    fn nft_list(&mut self, table: &TableRef) -> Result<Option<TableListing>, Error> {
        self.nft_listings += 1;
        if self.nft_busy {
            let busy = std::io::Error::new(std::io::ErrorKind::Interrupted, "another process kept committing");
            return Err(Error::Nft(kproxy_nftables::ExecError::Netlink(busy)));
        }
        Ok(Some(self.nft_tables.get(table)))
    }
}

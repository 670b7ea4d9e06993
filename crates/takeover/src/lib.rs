//! Taking a node over from kube-proxy: what upstream kube-proxy left in the kernel, in any of its
//! modes, found without changing anything ([`find`]) and removed ([`remove`]) — by the daemon
//! once kproxy's own rules are in the kernel and kube-proxy no longer runs on the node (the
//! daemon's `takeover` module decides when).
//!
//! What kube-proxy leaves, by mode (upstream's own cleanups, `pkg/proxy/*/cleanup.go`, list the
//! same):
//! - nftables: the tables `ip kube-proxy` and `ip6 kube-proxy`;
//! - iptables: its `KUBE-…` chains in `nat`, `filter` and `mangle` and the jumps to them from the
//!   built-in chains, in whichever backend it used (legacy or nft) and in both families;
//! - IPVS: its virtual services, the `kube-ipvs0` dummy interface holding the Service addresses,
//!   its ip sets (`KUBE-…`) and its iptables chains (`KUBE-NODE-PORT`, `KUBE-LOAD-BALANCER`, ...).
//!
//! What kproxy's own mode shares with kube-proxy is never removed: in iptables mode, the chains
//! of kproxy's backend that kproxy writes itself (the same names as upstream's; kproxy's sync
//! replaces their content); in IPVS mode, the virtual services and `kube-ipvs0`, which kproxy's
//! IPVS dataplane adopts as its own.
//!
//! Established connections survive: NAT rules are consulted only for a connection's first
//! packet, so removing kube-proxy's rules leaves every tracked connection as it is. IPVS is
//! different: a packet of an IPVS connection whose virtual service is gone is dropped (and
//! `expire_nodest_conn` ends the connection). So kube-proxy's virtual services are removed only
//! once they have no connections left; new connections no longer reach them (kproxy's DNAT in
//! prerouting comes first), and [`remove`] is called again until none is left, then
//! `kube-ipvs0` goes.
//!
//! Reading never creates anything: the legacy backend is read only for the tables the kernel
//! already has (`/proc/net/ip_tables_names`; reading another would create it), the nft backend
//! only for the tables nf_tables lists, and ip sets and IPVS only by listing.

use std::fmt;
use std::io;

use kproxy_iptables::cleanup::{is_kproxy_chain, is_kube_proxy_chain, remove_chains};
use kproxy_iptables::rules::Table;
use kproxy_iptables::{Backend, IptablesRestore};
use kproxy_ipvs::{Host, IpvsOp, KernelHost, ServiceKey};
use kproxy_nft_model::{Op, TableFamily, TableRef, Transaction};
use kproxy_nft_netlink::NetlinkExecutor;
use kproxy_nft_netlink::ipset::IpsetClient;
use kproxy_state::IpFamily;

/// kube-proxy's nftables table name (both families).
pub const KUBE_PROXY_TABLE: &str = "kube-proxy";

/// The prefix of kube-proxy's ip sets (IPVS mode): `KUBE-CLUSTER-IP`, `KUBE-6-LOOP-BACK`, ...
pub const KUBE_PROXY_IPSET_PREFIX: &str = "KUBE-";

/// What kproxy's running mode owns of what kube-proxy also uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Own {
    /// nftables mode: kproxy's tables have names of their own; nothing is shared.
    Nftables,
    /// iptables mode in this backend: the chains kproxy writes there are kproxy's.
    Iptables(Backend),
    /// IPVS mode: the virtual services and `kube-ipvs0` are kproxy's.
    Ipvs,
}

/// One iptables backend and family holding kube-proxy's chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesLeftovers {
    /// The backend.
    pub backend: Backend,
    /// The family.
    pub family: IpFamily,
    /// The tables that hold them (those the kernel has).
    pub tables: Vec<Table>,
    /// How many of kube-proxy's chains, over those tables.
    pub chains: usize,
}

/// kube-proxy's IPVS state, when its `kube-ipvs0` is on the node and kproxy is not in IPVS mode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsLeftovers {
    /// Its virtual services, each with the connections IPVS still tracks through it.
    pub services: Vec<(ServiceKey, u64)>,
}

/// What kube-proxy left on the node that kproxy's mode does not own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// `ip kube-proxy`, `ip6 kube-proxy`.
    pub nft_tables: Vec<TableRef>,
    /// Its iptables chains, per backend and family.
    pub iptables: Vec<IptablesLeftovers>,
    /// Its IPVS virtual services and `kube-ipvs0`.
    pub ipvs: Option<IpvsLeftovers>,
    /// Its ip sets.
    pub ipsets: Vec<String>,
}

impl Leftovers {
    /// Nothing of kube-proxy's is there.
    pub fn is_empty(&self) -> bool {
        self.nft_tables.is_empty() && self.iptables.is_empty() && self.ipvs.is_none() && self.ipsets.is_empty()
    }
}

impl fmt::Display for Leftovers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for t in &self.nft_tables {
            parts.push(format!("nftables table {t}"));
        }
        for i in &self.iptables {
            let tables: Vec<_> = i.tables.iter().map(|t| t.as_str()).collect();
            parts.push(format!(
                "{} iptables-{} chains in {} ({:?})",
                i.chains,
                i.backend.as_str(),
                tables.join(", "),
                i.family
            ));
        }
        if let Some(ipvs) = &self.ipvs {
            parts.push(format!("{} IPVS virtual services and kube-ipvs0", ipvs.services.len()));
        }
        if !self.ipsets.is_empty() {
            parts.push(format!("{} ip sets", self.ipsets.len()));
        }
        if parts.is_empty() { f.write_str("nothing") } else { f.write_str(&parts.join("; ")) }
    }
}

/// Why looking at or removing leftovers failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// nf_tables or ip set netlink.
    #[error("{what}: {source}")]
    Netlink {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// An iptables tool.
    #[error("iptables-{backend} ({family:?}): {source}")]
    Iptables {
        /// The backend.
        backend: &'static str,
        /// The family.
        family: IpFamily,
        /// The error.
        source: kproxy_iptables::ExecError,
    },
    /// IPVS or the dummy interface.
    #[error("IPVS: {0}")]
    Ipvs(#[from] kproxy_ipvs::Error),
}

fn netlink(what: &str) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Netlink { what: what.to_owned(), source }
}

/// Where the legacy backend's table names are, for the calling thread's network namespace
/// (kproxy's tests enter namespaces per thread).
fn legacy_names_path(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "/proc/thread-self/net/ip_tables_names",
        IpFamily::V6 => "/proc/thread-self/net/ip6_tables_names",
    }
}

/// The iptables tables a backend has in `family`, without creating any.
fn iptables_tables(backend: Backend, family: IpFamily, nft: &[TableRef]) -> Vec<Table> {
    match backend {
        Backend::Legacy => std::fs::read_to_string(legacy_names_path(family))
            .map(|names| names.lines().filter_map(|n| Table::named(n.trim())).collect())
            .unwrap_or_default(),
        Backend::Nft => {
            let family = TableFamily::from(family);
            nft.iter().filter(|t| t.family == family).filter_map(|t| Table::named(&t.name)).collect()
        }
    }
}

/// The chains of one iptables table. The nft backend's are read over netlink:
/// `iptables-nft-save` reads the node's whole nf_tables ruleset whatever table it is asked for
/// (seconds next to kproxy's own tables at 100k Services), and a SIGTERM looks here too.
fn chain_names(backend: Backend, family: IpFamily, table: Table) -> Result<Vec<String>, Error> {
    match backend {
        Backend::Nft => {
            let table = TableRef { family: family.into(), name: table.as_str().to_owned() };
            kproxy_nft_netlink::listing::chain_names(&mut NetlinkExecutor::new(), &table)
                .map_err(netlink("listing iptables-nft chains"))
        }
        Backend::Legacy => {
            let save = kproxy_iptables::Executor::save(&mut IptablesRestore::new(backend), family, table)
                .map_err(|source| Error::Iptables { backend: backend.as_str(), family, source })?;
            Ok(save
                .lines()
                .filter_map(|l| l.strip_prefix(':'))
                .filter_map(|l| l.split_whitespace().next())
                .map(str::to_owned)
                .collect())
        }
    }
}

/// Whether `chain` in `table` of `backend` is kube-proxy's and not kproxy's own.
fn doomed(own: Own, backend: Backend) -> impl Fn(Table, &str) -> bool {
    move |table, chain| {
        is_kube_proxy_chain(table, chain) && !(own == Own::Iptables(backend) && is_kproxy_chain(table, chain))
    }
}

/// Finds what kube-proxy left in the calling thread's network namespace that `own` does not
/// own. Changes nothing. `ipvs` says which virtual services count as a proxy's
/// (`ipvs.excludeCIDRs` are someone else's).
pub fn find(own: Own, ipvs: &kproxy_ipvs::Config) -> Result<Leftovers, Error> {
    find_in(own, ipvs, true)
}

/// [`find`] without reading the chains of kproxy's own iptables backend (in iptables mode): what
/// tells whether a kube-proxy runs on the node again, quickly enough for a SIGTERM. That backend
/// holds kproxy's own chains (listing them is seconds at 100k Services), and what it could add
/// — kube-proxy's IPVS-mode chains — comes with that mode's ip sets, which are found anyway.
pub fn find_running(own: Own, ipvs: &kproxy_ipvs::Config) -> Result<Leftovers, Error> {
    find_in(own, ipvs, false)
}

fn find_in(own: Own, ipvs: &kproxy_ipvs::Config, own_backend: bool) -> Result<Leftovers, Error> {
    let mut found = Leftovers::default();
    let tables =
        kproxy_nft_netlink::listing::tables(&mut NetlinkExecutor::new()).map_err(netlink("listing nftables tables"))?;
    found.nft_tables = tables
        .iter()
        .filter(|t| t.name == KUBE_PROXY_TABLE && matches!(t.family, TableFamily::Ip | TableFamily::Ip6))
        .cloned()
        .collect();
    for backend in [Backend::Nft, Backend::Legacy] {
        if !own_backend && own == Own::Iptables(backend) {
            continue;
        }
        for family in IpFamily::BOTH {
            let present = iptables_tables(backend, family, &tables);
            if present.is_empty() {
                continue;
            }
            let mut chains = 0;
            let mut holding = Vec::new();
            for table in present {
                let n = chain_names(backend, family, table)?.iter().filter(|c| doomed(own, backend)(table, c)).count();
                if n > 0 {
                    chains += n;
                    holding.push(table);
                }
            }
            if !holding.is_empty() {
                found.iptables.push(IptablesLeftovers { backend, family, tables: holding, chains });
            }
        }
    }
    if own != Own::Ipvs {
        found.ipvs = find_ipvs(ipvs)?;
    }
    found.ipsets = IpsetClient::open()
        .and_then(|mut c| c.names())
        .map_err(netlink("listing ip sets"))?
        .into_iter()
        .filter(|n| n.starts_with(KUBE_PROXY_IPSET_PREFIX))
        .collect();
    Ok(found)
}

/// kube-proxy's virtual services, when its `kube-ipvs0` is there; `None` without it (then any
/// virtual service belongs to someone else) or without IPVS in the kernel.
fn find_ipvs(config: &kproxy_ipvs::Config) -> Result<Option<IpvsLeftovers>, Error> {
    let mut host = KernelHost::new();
    match host.link(&config.interface)? {
        Some((_, Some(kind))) if kind == "dummy" => {}
        _ => return Ok(None),
    }
    let table = match host.ipvs_table() {
        Ok(table) => table,
        Err(kproxy_ipvs::Error::NoIpvs(_)) => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let services = table
        .into_iter()
        .filter(|(spec, _)| kproxy_ipvs::is_proxy_service(config, &spec.key))
        .map(|(spec, dests)| (spec.key, dests.iter().map(|d| d.connections()).sum()))
        .collect();
    Ok(Some(IpvsLeftovers { services }))
}

/// What one [`remove`] did.
#[derive(Debug, Default)]
pub struct Removal {
    /// What went, one line each (for the log).
    pub removed: Vec<String>,
    /// kube-proxy's virtual services kept because IPVS still tracks connections through them:
    /// call [`remove`] again later.
    pub draining: Vec<(ServiceKey, u64)>,
    /// What could not be removed, and why.
    pub failed: Vec<String>,
}

impl Removal {
    /// Whether everything found is gone.
    pub fn is_complete(&self) -> bool {
        self.draining.is_empty() && self.failed.is_empty()
    }
}

/// Removes `found` (as [`find`] gave it, in the same network namespace) except kube-proxy's
/// virtual services that still carry connections; each kind of object is tried even when
/// another failed. The order keeps every reference valid: nftables tables, iptables chains,
/// then ip sets (an iptables rule may refer to one), then drained virtual services and, once
/// none is left, `kube-ipvs0`.
pub fn remove(own: Own, ipvs: &kproxy_ipvs::Config, found: &Leftovers) -> Removal {
    let mut out = Removal::default();
    if !found.nft_tables.is_empty() {
        let mut tx = Transaction::new();
        for table in &found.nft_tables {
            // Adding first makes the delete succeed whether or not the table is still there.
            tx.push(Op::AddTable { table: table.clone(), comment: None });
            tx.push(Op::DeleteTable(table.clone()));
        }
        match kproxy_nft_model::Executor::apply(&mut NetlinkExecutor::new(), &tx) {
            Ok(()) => out.removed.extend(found.nft_tables.iter().map(|t| format!("nftables table {t}"))),
            Err(e) => out.failed.push(format!("nftables tables {:?}: {e}", found.nft_tables)),
        }
    }
    for i in &found.iptables {
        let mut exec = IptablesRestore::new(i.backend);
        match remove_chains(&mut exec, i.family, &i.tables, doomed(own, i.backend)) {
            Ok(removed) => {
                for r in removed {
                    out.removed.push(format!(
                        "iptables-{} {:?} {}: chains {} and {} jump(s) to them",
                        i.backend.as_str(),
                        i.family,
                        r.table.as_str(),
                        r.chains.join(" "),
                        r.jumps.len()
                    ));
                }
            }
            Err(e) => out.failed.push(format!("iptables-{} {:?}: {e}", i.backend.as_str(), i.family)),
        }
    }
    if !found.ipsets.is_empty() {
        match IpsetClient::open() {
            Ok(mut client) => {
                for set in &found.ipsets {
                    match client.destroy(set) {
                        Ok(()) => out.removed.push(format!("ip set {set}")),
                        Err(e) => out.failed.push(format!("ip set {set}: {e}")),
                    }
                }
            }
            Err(e) => out.failed.push(format!("ip sets: {e}")),
        }
    }
    if let Some(leftovers) = &found.ipvs
        && let Err(e) = remove_ipvs(ipvs, leftovers, &mut out)
    {
        out.failed.push(format!("IPVS: {e}"));
    }
    out
}

fn remove_ipvs(config: &kproxy_ipvs::Config, found: &IpvsLeftovers, out: &mut Removal) -> Result<(), Error> {
    let mut host = KernelHost::new();
    for &(key, connections) in &found.services {
        if connections > 0 {
            out.draining.push((key, connections));
            continue;
        }
        match host.ipvs(&IpvsOp::DeleteService(key)) {
            Ok(()) => out.removed.push(format!("IPVS virtual service {key}")),
            Err(e) if e.errno().is_some_and(|n| n == kproxy_ipvs::ESRCH || n == kproxy_ipvs::ENOENT) => {}
            Err(e) => out.failed.push(format!("IPVS virtual service {key}: {e}")),
        }
    }
    if out.draining.is_empty()
        && let Some((index, Some(kind))) = host.link(&config.interface)?
        && kind == "dummy"
    {
        host.delete_link(index)?;
        out.removed.push(format!("the {} interface", config.interface));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_iptables_mode_kproxys_own_chains_of_its_backend_stay_and_the_other_backends_go() {
        let own = Own::Iptables(Backend::Nft);
        // Shared names (KUBE-SERVICES) are kproxy's in its own backend, kube-proxy's elsewhere.
        assert!(!doomed(own, Backend::Nft)(Table::Nat, "KUBE-SERVICES"));
        assert!(doomed(own, Backend::Legacy)(Table::Nat, "KUBE-SERVICES"));
        // IPVS mode's chains are never kproxy's.
        assert!(doomed(own, Backend::Nft)(Table::Nat, "KUBE-LOAD-BALANCER"));
        for mode in [Own::Nftables, Own::Ipvs] {
            assert!(doomed(mode, Backend::Nft)(Table::Nat, "KUBE-SERVICES"));
            assert!(doomed(mode, Backend::Legacy)(Table::Filter, "KUBE-FORWARD"));
        }
        // The kubelet's are nobody's to remove.
        assert!(!doomed(Own::Nftables, Backend::Nft)(Table::Filter, "KUBE-FIREWALL"));
    }

    #[test]
    fn leftovers_say_what_they_hold() {
        let found = Leftovers {
            nft_tables: vec![TableRef { family: TableFamily::Ip, name: KUBE_PROXY_TABLE.into() }],
            iptables: vec![IptablesLeftovers {
                backend: Backend::Legacy,
                family: IpFamily::V4,
                tables: vec![Table::Nat, Table::Filter],
                chains: 7,
            }],
            ipvs: None,
            ipsets: vec!["KUBE-CLUSTER-IP".into()],
        };
        assert_eq!(
            found.to_string(),
            "nftables table ip kube-proxy; 7 iptables-legacy chains in nat, filter (V4); 1 ip sets"
        );
        assert!(!found.is_empty() && Leftovers::default().is_empty());
        assert_eq!(Leftovers::default().to_string(), "nothing");
    }
}

//! The edge between the dataplane's logic and the kernel: IPVS, the dummy interface, sysctls
//! and the auxiliary nftables table (over nf_tables netlink, the executor of the nftables
//! dataplane; no `nft` process). [`KernelHost`] talks to the kernel of the network
//! namespace of the thread that first uses it; [`crate::FakeHost`] is an in-memory kernel that
//! records what would be sent.

use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};

use kproxy_nft_model::{ExecError, Executor, TableListing, TableRef, Transaction};
use kproxy_nft_netlink::NetlinkExecutor;
use netlink_sys::protocols::{NETLINK_GENERIC, NETLINK_ROUTE};

use crate::error::Error;
use crate::genl::{self, DestState, IpvsOp, ServiceKey, ServiceSpec};
use crate::netlink::{Client, NetlinkError};
use crate::{proc_table, rtnl};

/// `EEXIST`.
pub const EEXIST: i32 = 17;
/// `ENOENT`.
pub const ENOENT: i32 = 2;
/// `ESRCH` (IPVS: no such service).
pub const ESRCH: i32 = 3;
/// `ENODEV` (no such interface).
pub const ENODEV: i32 = 19;

/// What the dataplane needs from the kernel.
pub trait Host: Send {
    /// Every IPVS virtual service.
    fn ipvs_services(&mut self) -> Result<Vec<ServiceSpec>, Error>;
    /// The real servers of one virtual service.
    fn ipvs_dests(&mut self, key: &ServiceKey) -> Result<Vec<DestState>, Error>;
    /// Every virtual service with its real servers. This default asks for each service's real
    /// servers in turn (one dump per service).
    fn ipvs_table(&mut self) -> Result<Vec<(ServiceSpec, Vec<DestState>)>, Error> {
        let services = self.ipvs_services()?;
        dests_one_by_one(self, services)
    }
    /// One IPVS change, as is (errors such as `EEXIST` are the caller's to interpret).
    fn ipvs(&mut self, op: &IpvsOp) -> Result<(), Error>;
    /// The index and link kind of interface `name`, if it exists.
    fn link(&mut self, name: &str) -> Result<Option<(u32, Option<String>)>, Error>;
    /// Creates dummy interface `name`, up; returns its index.
    fn create_dummy(&mut self, name: &str) -> Result<u32, Error>;
    /// Brings interface `index` up.
    fn set_up(&mut self, index: u32) -> Result<(), Error>;
    /// Deletes interface `index`.
    fn delete_link(&mut self, index: u32) -> Result<(), Error>;
    /// The addresses of interface `index`.
    fn addresses(&mut self, index: u32) -> Result<Vec<IpAddr>, Error>;
    /// Adds (`add`) or removes a host address on interface `index`.
    fn set_address(&mut self, index: u32, addr: IpAddr, add: bool) -> Result<(), Error>;
    /// A sysctl (`net/ipv4/vs/conntrack`), `None` when it does not exist.
    fn sysctl(&mut self, path: &str) -> Result<Option<String>, Error>;
    /// Writes a sysctl.
    fn set_sysctl(&mut self, path: &str, value: &str) -> Result<(), Error>;
    /// Applies an nftables transaction atomically.
    fn nft(&mut self, tx: &Transaction) -> Result<(), Error>;
    /// The nf_tables generation: every commit in the namespace, by anyone, bumps it. `None`:
    /// the host cannot tell.
    fn nft_generation(&mut self) -> Result<Option<u32>, Error> {
        Ok(None)
    }
    /// What nftables table `table` holds now, summarised (an absent table lists as empty).
    /// `None`: the host cannot list.
    fn nft_list(&mut self, _table: &TableRef) -> Result<Option<TableListing>, Error> {
        Ok(None)
    }
}

/// The real servers of each of `services`, one dump each; a service deleted meanwhile is left
/// out.
pub fn dests_one_by_one<H: Host + ?Sized>(
    host: &mut H,
    services: Vec<ServiceSpec>,
) -> Result<Vec<(ServiceSpec, Vec<DestState>)>, Error> {
    let mut out = Vec::with_capacity(services.len());
    for spec in services {
        match host.ipvs_dests(&spec.key) {
            Ok(dests) => out.push((spec, dests)),
            Err(e) if matches!(e.errno(), Some(ESRCH | ENOENT)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The auxiliary table's side of a [`Host`] as an nftables [`Executor`], so the nftables
/// dataplane's follow-and-check machinery (`kproxy_nftables::kernel`) serves it too.
#[derive(Debug)]
pub struct HostNft<'a, H: ?Sized>(pub &'a mut H);

fn exec_error(e: Error) -> ExecError {
    match e {
        Error::Nft(e) => e,
        Error::Injected => ExecError::Injected,
        other => ExecError::Netlink(std::io::Error::other(other.to_string())),
    }
}

impl<H: Host + ?Sized> Executor for HostNft<'_, H> {
    fn apply(&mut self, tx: &Transaction) -> Result<(), ExecError> {
        self.0.nft(tx).map_err(exec_error)
    }

    fn generation(&mut self) -> Result<Option<u32>, ExecError> {
        self.0.nft_generation().map_err(exec_error)
    }

    fn list(&mut self, table: &TableRef) -> Result<Option<TableListing>, ExecError> {
        self.0.nft_list(table).map_err(exec_error)
    }
}

/// The real kernel, through netlink sockets opened on first use (in the calling thread's
/// network namespace) and `/proc/sys`.
#[derive(Debug, Default)]
pub struct KernelHost {
    genl: Option<(Client, u16)>,
    route: Option<Client>,
    nft: NetlinkExecutor,
}

impl KernelHost {
    /// A host that opens its sockets on first use.
    pub fn new() -> Self {
        Self::default()
    }

    fn genl(&mut self) -> Result<(&mut Client, u16), Error> {
        if self.genl.is_none() {
            let open = || -> Result<(Client, u16), Error> {
                let link = |source: NetlinkError| Error::Ipvs { op: "resolve family".into(), source };
                let mut client = Client::open(NETLINK_GENERIC).map_err(link)?;
                let answer = client.request(&genl::resolve_family_request());
                let answer = match answer {
                    Err(NetlinkError::Kernel(ENOENT)) => return Err(Error::NoIpvs(genl::FAMILY_NAME)),
                    other => other.map_err(link)?,
                };
                let id =
                    answer.iter().find_map(|p| genl::parse_family_id(p)).ok_or(Error::NoIpvs(genl::FAMILY_NAME))?;
                Ok((client, id))
            };
            let opened = match open() {
                Err(Error::NoIpvs(_)) => {
                    load_ip_vs();
                    open()?
                }
                other => other?,
            };
            self.genl = Some(opened);
        }
        match self.genl.as_mut() {
            Some((client, id)) => Ok((client, *id)),
            None => Err(Error::NoIpvs(genl::FAMILY_NAME)),
        }
    }

    fn route(&mut self) -> Result<&mut Client, Error> {
        if self.route.is_none() {
            let client =
                Client::open(NETLINK_ROUTE).map_err(|source| Error::Link { op: "open rtnetlink".into(), source })?;
            self.route = Some(client);
        }
        match self.route.as_mut() {
            Some(c) => Ok(c),
            None => Err(Error::Injected),
        }
    }
}

fn load_ip_vs() {
    for program in ["modprobe", "/usr/sbin/modprobe", "/sbin/modprobe"] {
        let status = Command::new(program).args(["-q", "ip_vs"]).stdout(Stdio::null()).stderr(Stdio::null()).status();
        if status.is_ok() {
            return;
        }
    }
}

fn sysctl_path(path: &str) -> String {
    format!("/proc/sys/{path}")
}

impl Host for KernelHost {
    fn ipvs_services(&mut self) -> Result<Vec<ServiceSpec>, Error> {
        let (client, id) = self.genl()?;
        let answers = client
            .dump(&genl::dump_services_request(id))
            .map_err(|source| Error::Ipvs { op: "list services".into(), source })?;
        Ok(answers.iter().filter_map(|p| genl::parse_service(p)).collect())
    }

    fn ipvs_dests(&mut self, key: &ServiceKey) -> Result<Vec<DestState>, Error> {
        let (client, id) = self.genl()?;
        let answers = client
            .dump(&genl::dump_dests_request(id, key))
            .map_err(|source| Error::Ipvs { op: format!("list real servers of {key}"), source })?;
        Ok(answers.iter().filter_map(|p| genl::parse_dest(p, key.family())).collect())
    }

    /// One dump of the services and one read of [`proc_table::PATH`] for every real server;
    /// service by service only where the text is missing or not understood.
    fn ipvs_table(&mut self) -> Result<Vec<(ServiceSpec, Vec<DestState>)>, Error> {
        let services = self.ipvs_services()?;
        let listed = std::fs::read_to_string(proc_table::PATH).ok().and_then(|text| proc_table::parse(&text));
        let Some(listed) = listed else {
            tracing::debug!(
                path = proc_table::PATH,
                "IPVS table text unreadable; listing real servers service by service"
            );
            return dests_one_by_one(self, services);
        };
        let (mut table, unmatched) = proc_table::join(services, listed);
        table.extend(dests_one_by_one(self, unmatched)?);
        Ok(table)
    }

    fn ipvs(&mut self, op: &IpvsOp) -> Result<(), Error> {
        let (client, id) = self.genl()?;
        client
            .request(&genl::request(id, op))
            .map(|_| ())
            .map_err(|source| Error::Ipvs { op: format!("{op:?}"), source })
    }

    fn link(&mut self, name: &str) -> Result<Option<(u32, Option<String>)>, Error> {
        match self.route()?.request(&rtnl::get_link_request(name)) {
            Ok(answers) => Ok(answers.iter().find_map(|p| rtnl::parse_link(p))),
            Err(NetlinkError::Kernel(ENODEV)) => Ok(None),
            Err(source) => Err(Error::Link { op: format!("get {name}"), source }),
        }
    }

    fn create_dummy(&mut self, name: &str) -> Result<u32, Error> {
        self.route()?
            .request(&rtnl::create_dummy_request(name))
            .map_err(|source| Error::Link { op: format!("create {name}"), source })?;
        match self.link(name)? {
            Some((index, _)) => Ok(index),
            None => Err(Error::Link { op: format!("create {name}"), source: NetlinkError::Kernel(ENODEV) }),
        }
    }

    fn set_up(&mut self, index: u32) -> Result<(), Error> {
        self.route()?
            .request(&rtnl::set_up_request(index))
            .map(|_| ())
            .map_err(|source| Error::Link { op: format!("set {index} up"), source })
    }

    fn delete_link(&mut self, index: u32) -> Result<(), Error> {
        self.route()?
            .request(&rtnl::delete_link_request(index))
            .map(|_| ())
            .map_err(|source| Error::Link { op: format!("delete {index}"), source })
    }

    fn addresses(&mut self, index: u32) -> Result<Vec<IpAddr>, Error> {
        let answers = self
            .route()?
            .dump(&rtnl::dump_addresses_request())
            .map_err(|source| Error::Link { op: "list addresses".into(), source })?;
        Ok(answers.iter().filter_map(|p| rtnl::parse_address(p, index)).collect())
    }

    fn set_address(&mut self, index: u32, addr: IpAddr, add: bool) -> Result<(), Error> {
        self.route()?.request(&rtnl::address_request(add, index, addr)).map(|_| ()).map_err(|source| Error::Link {
            op: format!("{} address {addr}", if add { "add" } else { "delete" }),
            source,
        })
    }

    fn sysctl(&mut self, path: &str) -> Result<Option<String>, Error> {
        let full = sysctl_path(path);
        if !Path::new(&full).exists() {
            return Ok(None);
        }
        std::fs::read_to_string(&full)
            .map(|v| Some(v.trim().to_owned()))
            .map_err(|source| Error::Sysctl { path: full, source })
    }

    fn set_sysctl(&mut self, path: &str, value: &str) -> Result<(), Error> {
        let full = sysctl_path(path);
        std::fs::write(&full, value).map_err(|source| Error::Sysctl { path: full, source })
    }

    fn nft(&mut self, tx: &Transaction) -> Result<(), Error> {
        self.nft.apply(tx).map_err(Error::from)
    }

    fn nft_generation(&mut self) -> Result<Option<u32>, Error> {
        self.nft.generation().map_err(Error::from)
    }

    fn nft_list(&mut self, table: &TableRef) -> Result<Option<TableListing>, Error> {
        self.nft.list(table).map_err(Error::from)
    }
}

//! What kproxy's tables contain, rendered from the plan.
//!
//! The shape keeps the kernel's cost linear: a handful of big verdict maps dispatch on
//! destination (service IPs, node ports, firewall, no-endpoint verdicts), there is a chain per
//! service port and traffic class, endpoints are picked from shared data maps keyed by
//! destination and slot (see [`pick`]: an endpoint change is map elements only, never a rule),
//! and hairpin traffic is recognised by one shared set of `endpoint . endpoint` pairs in
//! postrouting — so there is no set or map per service or per endpoint (the kernel makes many
//! sets quadratic). The only exception is ClientIP affinity, see [`service`].

pub mod pick;
pub mod service;
pub mod skeleton;

use std::net::IpAddr;

use kproxy_plan::LocalTraffic;
use kproxy_state::{IpFamily, Protocol};

use crate::transaction::{TableFamily, TableRef};

/// Default table name, in both families.
pub const TABLE_NAME: &str = "kproxy";

/// Default masquerade mark (`masqueradeBit` 14).
pub const DEFAULT_MASQUERADE_MARK: u32 = 0x4000;

/// Per-family rendering context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ctx {
    /// IP family.
    pub family: IpFamily,
    /// The table.
    pub table: TableRef,
    /// The masquerade mark bit(s).
    pub mark: u32,
}

impl Ctx {
    /// The context for `family`, table `name`.
    pub fn new(family: IpFamily, name: &str, mark: u32) -> Self {
        let tf = match family {
            IpFamily::V4 => TableFamily::Ip,
            IpFamily::V6 => TableFamily::Ip6,
        };
        Self { family, table: TableRef { family: tf, name: name.to_owned() }, mark }
    }

    /// The payload keyword: `ip` or `ip6`.
    pub fn ip(&self) -> &'static str {
        self.table.family.as_str()
    }

    /// The address datatype.
    pub fn addr_type(&self) -> &'static str {
        match self.family {
            IpFamily::V4 => "ipv4_addr",
            IpFamily::V6 => "ipv6_addr",
        }
    }

    /// The loopback network NodePorts never listen on unless asked.
    pub fn loopback(&self) -> &'static str {
        match self.family {
            IpFamily::V4 => "127.0.0.0/8",
            IpFamily::V6 => "::1",
        }
    }

    /// `mark set mark or M`.
    pub fn mark_rule(&self) -> String {
        format!("mark set mark or {:#x}", self.mark)
    }
}

/// A destination a service port claims. Its elements in the dispatch, verdict and endpoint maps
/// are keyed by it, and when two service ports claim one (a conflict in the cluster), only the
/// first by name has them in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Destination {
    /// A ClusterIP, ExternalIP or LoadBalancer IP, with protocol and port.
    Address(IpAddr, Protocol, u16),
    /// A NodePort, on any node port address.
    NodePort(Protocol, u16),
}

impl Destination {
    /// The element key: `addr . proto . port` or `proto . port`.
    pub fn key(&self) -> String {
        match self {
            Destination::Address(a, p, port) => format!("{a} . {} . {port}", p.as_str()),
            Destination::NodePort(p, port) => format!("{} . {port}", p.as_str()),
        }
    }
}

/// `dnat to` target: IPv6 addresses need brackets before a port.
pub fn addr_port(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

/// The match for "comes from a local pod" (`negate`: does not), when detectable.
pub fn local_match(ctx: &Ctx, local: &LocalTraffic, negate: bool) -> Option<String> {
    let op = if negate { "!= " } else { "" };
    match local {
        LocalTraffic::Undetectable => None,
        LocalTraffic::SourceCidrs(_) => Some(format!("{} saddr {op}@{}", ctx.ip(), skeleton::POD_CIDRS)),
        LocalTraffic::Interface(name) => Some(format!("iifname {op}\"{}\"", name.replace('"', ""))),
        LocalTraffic::InterfacePrefix(prefix) => Some(format!("iifname {op}\"{}*\"", prefix.replace('"', ""))),
    }
}

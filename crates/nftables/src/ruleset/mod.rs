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

use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};
use kproxy_nft_model::{CmpOp, DataType, Field, Key, Stmt, TableRef, Value};
use kproxy_plan::LocalTraffic;
use kproxy_state::{IpFamily, Protocol};

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
    /// The maps that per-Service counters read are declared with `counter`.
    pub service_counters: bool,
}

impl Ctx {
    /// The context for `family`, table `name`.
    pub fn new(family: IpFamily, name: &str, mark: u32) -> Self {
        Self { family, table: TableRef { family: family.into(), name: name.to_owned() }, mark, service_counters: false }
    }

    /// `ip saddr` / `ip6 saddr`.
    pub fn saddr(&self) -> Field {
        Field::Saddr(self.family)
    }

    /// `ip daddr` / `ip6 daddr`.
    pub fn daddr(&self) -> Field {
        Field::Daddr(self.family)
    }

    /// `daddr . meta l4proto . th dport`: what a service destination is keyed by.
    pub fn destination(&self) -> Vec<Field> {
        vec![self.daddr(), Field::L4Proto, Field::ThDport]
    }

    /// The address datatype.
    pub fn addr_type(&self) -> DataType {
        DataType::addr(self.family)
    }

    /// The loopback network NodePorts never listen on unless asked.
    pub fn loopback(&self) -> Value {
        match self.family {
            IpFamily::V4 => Value::Prefix(IpNet::V4(Ipv4Net::new_assert(Ipv4Addr::new(127, 0, 0, 0), 8))),
            IpFamily::V6 => Value::Addr(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)),
        }
    }

    /// `mark set mark or M`.
    pub fn mark_rule(&self) -> Stmt {
        Stmt::MarkOr(self.mark)
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
    pub fn key(&self) -> Key {
        Key(self.values())
    }

    /// The key's values, to extend.
    pub fn values(&self) -> Vec<Value> {
        match *self {
            Destination::Address(a, p, port) => vec![Value::Addr(a), Value::Proto(p), Value::Port(port)],
            Destination::NodePort(p, port) => vec![Value::Proto(p), Value::Port(port)],
        }
    }
}

/// The match for "comes from a local pod" (`negate`: does not), when detectable.
pub fn local_match(ctx: &Ctx, local: &LocalTraffic, negate: bool) -> Option<Stmt> {
    let op = if negate { CmpOp::Neq } else { CmpOp::Eq };
    match local {
        LocalTraffic::Undetectable => None,
        LocalTraffic::SourceCidrs(_) => {
            Some(Stmt::Lookup { key: vec![ctx.saddr()], negate, set: skeleton::POD_CIDRS.to_owned() })
        }
        LocalTraffic::Interface(name) => Some(Stmt::IifName { op, name: name.replace(['"', '*'], "") }),
        LocalTraffic::InterfacePrefix(prefix) => {
            Some(Stmt::IifName { op, name: format!("{}*", prefix.replace(['"', '*'], "")) })
        }
    }
}

//! Tables, chains and the hooks base chains attach to.

use std::fmt;

/// An nf_tables address family kproxy uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TableFamily {
    /// `ip`
    Ip,
    /// `ip6`
    Ip6,
    /// `inet`: IPv4 and IPv6 in one table (the acceleration table).
    Inet,
}

impl TableFamily {
    /// The family keyword.
    pub fn as_str(self) -> &'static str {
        match self {
            TableFamily::Ip => "ip",
            TableFamily::Ip6 => "ip6",
            TableFamily::Inet => "inet",
        }
    }

    /// The IP family of the table's packets; `None` for `inet`, which sees both.
    pub fn ip_family(self) -> Option<kproxy_state::IpFamily> {
        match self {
            TableFamily::Ip => Some(kproxy_state::IpFamily::V4),
            TableFamily::Ip6 => Some(kproxy_state::IpFamily::V6),
            TableFamily::Inet => None,
        }
    }
}

impl From<kproxy_state::IpFamily> for TableFamily {
    fn from(f: kproxy_state::IpFamily) -> Self {
        match f {
            kproxy_state::IpFamily::V4 => TableFamily::Ip,
            kproxy_state::IpFamily::V6 => TableFamily::Ip6,
        }
    }
}

impl fmt::Display for TableFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A table, addressed by family and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableRef {
    /// Family.
    pub family: TableFamily,
    /// Name.
    pub name: String,
}

impl fmt::Display for TableRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.family, self.name)
    }
}

/// A base chain's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainType {
    /// `filter`
    Filter,
    /// `nat`
    Nat,
}

impl ChainType {
    /// The type keyword (also the name the kernel knows the type by).
    pub fn as_str(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
        }
    }
}

/// A netfilter hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HookPoint {
    /// `prerouting`
    Prerouting,
    /// `input`
    Input,
    /// `forward`
    Forward,
    /// `output`
    Output,
    /// `postrouting`
    Postrouting,
}

impl HookPoint {
    /// The hook keyword.
    pub fn as_str(self) -> &'static str {
        match self {
            HookPoint::Prerouting => "prerouting",
            HookPoint::Input => "input",
            HookPoint::Forward => "forward",
            HookPoint::Output => "output",
            HookPoint::Postrouting => "postrouting",
        }
    }

    /// The kernel's hook number (`NF_INET_*`).
    pub fn number(self) -> u32 {
        match self {
            HookPoint::Prerouting => 0,
            HookPoint::Input => 1,
            HookPoint::Forward => 2,
            HookPoint::Output => 3,
            HookPoint::Postrouting => 4,
        }
    }
}

/// Where a base chain hooks in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Hook {
    /// Chain type.
    pub kind: ChainType,
    /// Hook.
    pub hook: HookPoint,
    /// Priority (`-100` is `dstnat`, `100` is `srcnat`).
    pub priority: i32,
}

/// A chain definition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    /// Name.
    pub name: String,
    /// Set for base chains.
    pub hook: Option<Hook>,
}

impl Chain {
    /// A regular chain (no hook).
    pub fn regular(name: impl Into<String>) -> Self {
        Chain { name: name.into(), hook: None }
    }

    /// A base chain.
    pub fn base(name: impl Into<String>, kind: ChainType, hook: HookPoint, priority: i32) -> Self {
        Chain { name: name.into(), hook: Some(Hook { kind, hook, priority }) }
    }
}

/// A flowtable: established connections that a rule hands to it (`flow add @NAME`) are
/// forwarded between its devices at the ingress hook, past the rest of netfilter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Flowtable {
    /// Name.
    pub name: String,
    /// Priority at the ingress hook (`0` is `filter`).
    pub priority: i32,
    /// The devices whose ingress it hooks.
    pub devices: Vec<String>,
    /// `counter`: conntrack's packet and byte counters keep counting offloaded packets.
    pub counter: bool,
}

/// The devices of a flowtable as nft writes them: `"eth0", "eth1"`, quoted (names may hold
/// characters nft would otherwise parse; quotes and backslashes, which nft cannot escape, are
/// dropped).
pub fn device_list(devices: &[String]) -> String {
    devices.iter().map(|d| format!("\"{}\"", d.replace(['"', '\\'], ""))).collect::<Vec<_>>().join(", ")
}

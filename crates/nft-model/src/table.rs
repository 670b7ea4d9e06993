//! Tables, chains and the hooks base chains attach to.

use std::fmt;

/// An nf_tables address family kproxy uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TableFamily {
    /// `ip`
    Ip,
    /// `ip6`
    Ip6,
}

impl TableFamily {
    /// The family keyword.
    pub fn as_str(self) -> &'static str {
        match self {
            TableFamily::Ip => "ip",
            TableFamily::Ip6 => "ip6",
        }
    }

    /// The IP family of the table's packets.
    pub fn ip_family(self) -> kproxy_state::IpFamily {
        match self {
            TableFamily::Ip => kproxy_state::IpFamily::V4,
            TableFamily::Ip6 => kproxy_state::IpFamily::V6,
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

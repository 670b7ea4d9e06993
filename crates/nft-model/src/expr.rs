//! Rules as sequences of typed statements.
//!
//! The statements are exactly the ones kproxy's tables use; each renders as the nft syntax for
//! it, and `kproxy-nft-netlink` encodes each as the expressions `nft` generates for that syntax.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use kproxy_state::{IpFamily, Protocol};

/// The keyword of an address family's header: `ip` or `ip6`.
pub fn ip_keyword(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// A value a rule loads from the packet (or draws): one field of a match, a lookup key or a
/// `typeof` declaration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    /// `ip saddr` / `ip6 saddr`.
    Saddr(IpFamily),
    /// `ip daddr` / `ip6 daddr`.
    Daddr(IpFamily),
    /// `meta l4proto`.
    L4Proto,
    /// `th dport`: the destination port of any transport header.
    ThDport,
    /// `tcp dport`, `udp dport`, `sctp dport`: only in `typeof` declarations (in a rule it
    /// implies a protocol match).
    Dport(Protocol),
    /// `numgen random mod M`: a draw in `0..M`.
    Numgen(u32),
    /// `numgen random mod 1 offset C`: the constant C, the one way nft 1.0.6 takes a constant
    /// inside a concatenation.
    Constant(u32),
    /// `ct original ip daddr` / `ct original ip6 daddr`: the destination the connection was
    /// opened to, in either direction and before or after NAT.
    CtOriginalDaddr(IpFamily),
    /// `ct original proto-dst`: the destination port the connection was opened to. nft 1.0.6
    /// types it (and so accepts it in a concatenation) only after a `meta l4proto P` match.
    CtOriginalProtoDst,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Saddr(family) => write!(f, "{} saddr", ip_keyword(*family)),
            Field::Daddr(family) => write!(f, "{} daddr", ip_keyword(*family)),
            Field::L4Proto => f.write_str("meta l4proto"),
            Field::ThDport => f.write_str("th dport"),
            Field::Dport(p) => write!(f, "{} dport", p.as_str()),
            Field::Numgen(modulus) => write!(f, "numgen random mod {modulus}"),
            Field::Constant(c) => write!(f, "numgen random mod 1 offset {c}"),
            Field::CtOriginalDaddr(family) => write!(f, "ct original {} daddr", ip_keyword(*family)),
            Field::CtOriginalProtoDst => f.write_str("ct original proto-dst"),
        }
    }
}

/// A concatenation of fields, rendered `a . b . c`.
#[derive(Debug, Clone, Copy)]
pub struct Concat<'a, T>(pub &'a [T]);

impl<T: fmt::Display> fmt::Display for Concat<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, item) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" . ")?;
            }
            write!(f, "{item}")?;
        }
        Ok(())
    }
}

/// A constant: one field of a set key or map value, or the right side of a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    /// An address.
    Addr(IpAddr),
    /// An address range as a prefix (interval sets, prefix matches).
    Prefix(IpNet),
    /// A transport protocol.
    Proto(Protocol),
    /// A port (network byte order).
    Port(u16),
    /// A host-order 32-bit integer, as a `numgen` leaves it (an endpoint slot): written in hex.
    Int(u32),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Addr(a) => write!(f, "{a}"),
            Value::Prefix(n) => write!(f, "{n}"),
            Value::Proto(p) => f.write_str(p.as_str()),
            Value::Port(p) => write!(f, "{p}"),
            Value::Int(i) => write!(f, "{i:#x}"),
        }
    }
}

/// `==` or `!=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmpOp {
    /// Equal (written as nothing).
    Eq,
    /// Not equal.
    Neq,
}

impl CmpOp {
    fn prefix(self) -> &'static str {
        match self {
            CmpOp::Eq => "",
            CmpOp::Neq => "!= ",
        }
    }
}

/// A verdict, as a statement or as map data.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// `accept`
    Accept,
    /// `drop`
    Drop,
    /// `return`
    Return,
    /// `jump CHAIN`
    Jump(String),
    /// `goto CHAIN`
    Goto(String),
}

impl Verdict {
    /// `jump chain`.
    pub fn jump(chain: impl Into<String>) -> Self {
        Verdict::Jump(chain.into())
    }

    /// `goto chain`.
    pub fn goto(chain: impl Into<String>) -> Self {
        Verdict::Goto(chain.into())
    }
}

impl Verdict {
    /// The chain a `jump` or `goto` continues in.
    pub fn chain(&self) -> Option<&str> {
        match self {
            Verdict::Jump(c) | Verdict::Goto(c) => Some(c),
            _ => None,
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Return => f.write_str("return"),
            Verdict::Jump(c) => write!(f, "jump {c}"),
            Verdict::Goto(c) => write!(f, "goto {c}"),
        }
    }
}

/// A conntrack state bit (`ct state S`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtState {
    /// `new`
    New,
    /// `established`
    Established,
    /// `related`
    Related,
}

impl CtState {
    /// The state's bit in `NFT_CT_STATE`.
    pub fn bit(self) -> u32 {
        match self {
            CtState::Established => 0x02,
            CtState::Related => 0x04,
            CtState::New => 0x08,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            CtState::New => "new",
            CtState::Established => "established",
            CtState::Related => "related",
        }
    }
}

/// A conntrack status bit (`ct status S`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CtStatus {
    /// `snat`: the connection is source-NATed.
    Snat,
    /// `dnat`: the connection is destination-NATed.
    Dnat,
}

impl CtStatus {
    /// The status bit (`IPS_SRC_NAT` / `IPS_DST_NAT`).
    pub fn bit(self) -> u32 {
        match self {
            CtStatus::Snat => 0x10,
            CtStatus::Dnat => 0x20,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            CtStatus::Snat => "snat",
            CtStatus::Dnat => "dnat",
        }
    }
}

/// Source or destination NAT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NatKind {
    /// `snat`
    Snat,
    /// `dnat`
    Dnat,
}

impl NatKind {
    fn as_str(self) -> &'static str {
        match self {
            NatKind::Snat => "snat",
            NatKind::Dnat => "dnat",
        }
    }
}

/// How a packet is rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reject {
    /// `reject`: ICMP / ICMPv6 port unreachable.
    PortUnreachable,
    /// `reject with tcp reset`.
    TcpReset,
}

/// One statement of a rule. Matches end the rule when false; the rest act on the packet.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Stmt {
    /// `FIELD [!=] VALUE`: an address (or prefix), protocol or port match.
    Cmp {
        /// What is compared.
        field: Field,
        /// `==` or `!=`.
        op: CmpOp,
        /// With what.
        value: Value,
    },
    /// `iifname [!=] "NAME"`; a name ending in `*` matches by prefix.
    IifName {
        /// `==` or `!=`.
        op: CmpOp,
        /// The name or prefix pattern.
        name: String,
    },
    /// `fib saddr|daddr type local`: the address is one of the node's.
    FibLocal {
        /// The source address (else the destination).
        saddr: bool,
    },
    /// `ct state S`.
    CtState(CtState),
    /// `ct status S`.
    CtStatus(CtStatus),
    /// `mark and MASK == VALUE`.
    MarkAndEq {
        /// Mask.
        mask: u32,
        /// Value after masking.
        value: u32,
    },
    /// `mark set mark or BITS`.
    MarkOr(u32),
    /// `mark set mark and MASK`.
    MarkAnd(u32),
    /// `meta l4proto { P, Q }`: one of these protocols.
    L4ProtoIn(Vec<Protocol>),
    /// `ct mark and MASK ==|!= VALUE`.
    CtMarkAnd {
        /// Mask.
        mask: u32,
        /// `==` or `!=`.
        op: CmpOp,
        /// Value after masking.
        value: u32,
    },
    /// `ct mark set ct mark or BITS`.
    CtMarkOr(u32),
    /// `meta mark set KEY map @MAP`: the packet mark the map holds for the key.
    MarkSetMap {
        /// The key's fields.
        key: Vec<Field>,
        /// A map whose data is `mark`.
        map: String,
    },
    /// `numgen random mod M == V`: true with probability 1/M.
    NumgenEq {
        /// Modulus.
        modulus: u32,
        /// Compared value.
        value: u32,
    },
    /// `KEY [!=] @SET`: set membership.
    Lookup {
        /// The key's fields.
        key: Vec<Field>,
        /// Not a member.
        negate: bool,
        /// The set.
        set: String,
    },
    /// `KEY vmap @MAP`: the verdict the map holds for the key.
    Vmap {
        /// The key's fields.
        key: Vec<Field>,
        /// The verdict map.
        map: String,
    },
    /// `update @SET { KEY [timeout Ns] }`: adds the key to a dynamic set or refreshes its
    /// timeout.
    Update {
        /// The set.
        set: String,
        /// The key's fields.
        key: Vec<Field>,
        /// The element's timeout in seconds (`None`: the set's).
        timeout: Option<u32>,
    },
    /// `dnat|snat to ADDR[:PORT] [fully-random]`.
    Nat {
        /// Kind.
        kind: NatKind,
        /// Address.
        addr: IpAddr,
        /// Port, if translated.
        port: Option<u16>,
        /// `fully-random` port allocation.
        fully_random: bool,
    },
    /// `dnat ip to KEY map @MAP`: address and port from a map whose data is `addr . port`.
    NatMap {
        /// Kind.
        kind: NatKind,
        /// The family of the translated address.
        family: IpFamily,
        /// The key's fields.
        key: Vec<Field>,
        /// The map.
        map: String,
    },
    /// `masquerade [fully-random]`.
    Masquerade {
        /// `fully-random` port allocation.
        fully_random: bool,
    },
    /// `ct packets > N`: the connection has exchanged more than N packets (both directions).
    CtPacketsGt(u64),
    /// `counter`: counts the packets and bytes that reach it.
    Counter,
    /// `flow add @FLOWTABLE`: hands the connection to a flowtable.
    FlowAdd(String),
    /// `reject ...`.
    Reject(Reject),
    /// A verdict.
    Verdict(Verdict),
}

impl Stmt {
    /// `FIELD VALUE`.
    pub fn eq(field: Field, value: Value) -> Self {
        Stmt::Cmp { field, op: CmpOp::Eq, value }
    }

    /// `FIELD != VALUE`.
    pub fn neq(field: Field, value: Value) -> Self {
        Stmt::Cmp { field, op: CmpOp::Neq, value }
    }

    /// `meta l4proto P`.
    pub fn l4proto(p: Protocol) -> Self {
        Stmt::eq(Field::L4Proto, Value::Proto(p))
    }

    /// `KEY @SET`.
    pub fn member(key: Vec<Field>, set: impl Into<String>) -> Self {
        Stmt::Lookup { key, negate: false, set: set.into() }
    }

    /// `KEY != @SET`.
    pub fn not_member(key: Vec<Field>, set: impl Into<String>) -> Self {
        Stmt::Lookup { key, negate: true, set: set.into() }
    }

    /// `KEY vmap @MAP`.
    pub fn vmap(key: Vec<Field>, map: impl Into<String>) -> Self {
        Stmt::Vmap { key, map: map.into() }
    }

    /// `jump CHAIN`.
    pub fn jump(chain: impl Into<String>) -> Self {
        Stmt::Verdict(Verdict::jump(chain))
    }

    /// `goto CHAIN`.
    pub fn goto(chain: impl Into<String>) -> Self {
        Stmt::Verdict(Verdict::goto(chain))
    }

    /// The chain the statement's verdict continues in, if any.
    pub fn chain(&self) -> Option<&str> {
        match self {
            Stmt::Verdict(v) => v.chain(),
            _ => None,
        }
    }

    /// The set or map the statement reads or writes, if any.
    pub fn set(&self) -> Option<&str> {
        match self {
            Stmt::Lookup { set, .. } | Stmt::Update { set, .. } => Some(set),
            Stmt::Vmap { map, .. } | Stmt::NatMap { map, .. } | Stmt::MarkSetMap { map, .. } => Some(map),
            _ => None,
        }
    }
}

impl fmt::Display for Stmt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stmt::Cmp { field, op, value } => write!(f, "{field} {}{value}", op.prefix()),
            Stmt::IifName { op, name } => write!(f, "iifname {}\"{}\"", op.prefix(), name.replace('"', "")),
            Stmt::FibLocal { saddr } => write!(f, "fib {} type local", if *saddr { "saddr" } else { "daddr" }),
            Stmt::CtState(s) => write!(f, "ct state {}", s.as_str()),
            Stmt::CtStatus(s) => write!(f, "ct status {}", s.as_str()),
            Stmt::MarkAndEq { mask, value } => write!(f, "mark and {mask:#x} == {value}"),
            Stmt::MarkOr(bits) => write!(f, "mark set mark or {bits:#x}"),
            Stmt::MarkAnd(mask) => write!(f, "mark set mark and {mask:#x}"),
            Stmt::NumgenEq { modulus, value } => write!(f, "numgen random mod {modulus} == {value}"),
            Stmt::L4ProtoIn(protos) => {
                let names: Vec<&str> = protos.iter().map(|p| p.as_str()).collect();
                write!(f, "meta l4proto {{ {} }}", names.join(", "))
            }
            Stmt::CtMarkAnd { mask, op, value } => {
                let op = if *op == CmpOp::Eq { "==" } else { "!=" };
                write!(f, "ct mark and {mask:#x} {op} {value}")
            }
            Stmt::CtMarkOr(bits) => write!(f, "ct mark set ct mark or {bits:#x}"),
            Stmt::MarkSetMap { key, map } => write!(f, "meta mark set {} map @{map}", Concat(key)),
            Stmt::Lookup { key, negate, set } => {
                write!(f, "{} {}@{set}", Concat(key), if *negate { "!= " } else { "" })
            }
            Stmt::Vmap { key, map } => write!(f, "{} vmap @{map}", Concat(key)),
            Stmt::Update { set, key, timeout: None } => write!(f, "update @{set} {{ {} }}", Concat(key)),
            Stmt::Update { set, key, timeout: Some(t) } => {
                write!(f, "update @{set} {{ {} timeout {t}s }}", Concat(key))
            }
            Stmt::Nat { kind, addr, port, fully_random } => {
                write!(f, "{} to ", kind.as_str())?;
                match (addr, port) {
                    (IpAddr::V6(a), Some(p)) => write!(f, "[{a}]:{p}")?,
                    (a, Some(p)) => write!(f, "{a}:{p}")?,
                    (a, None) => write!(f, "{a}")?,
                }
                if *fully_random {
                    f.write_str(" fully-random")?;
                }
                Ok(())
            }
            Stmt::NatMap { kind, family, key, map } => {
                write!(f, "{} {} to {} map @{map}", kind.as_str(), ip_keyword(*family), Concat(key))
            }
            Stmt::Masquerade { fully_random: true } => f.write_str("masquerade fully-random"),
            Stmt::Masquerade { fully_random: false } => f.write_str("masquerade"),
            Stmt::CtPacketsGt(n) => write!(f, "ct packets > {n}"),
            Stmt::Counter => f.write_str("counter"),
            Stmt::FlowAdd(ft) => write!(f, "flow add @{ft}"),
            Stmt::Reject(Reject::PortUnreachable) => f.write_str("reject"),
            Stmt::Reject(Reject::TcpReset) => f.write_str("reject with tcp reset"),
            Stmt::Verdict(v) => write!(f, "{v}"),
        }
    }
}

/// A rule: statements evaluated in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Rule(pub Vec<Stmt>);

impl Rule {
    /// A rule of these statements.
    pub fn new(stmts: impl IntoIterator<Item = Stmt>) -> Self {
        Rule(stmts.into_iter().collect())
    }

    /// The statements.
    pub fn stmts(&self) -> &[Stmt] {
        &self.0
    }

    /// The chains and sets the rule refers to, in order.
    pub fn references(&self) -> impl Iterator<Item = &str> {
        self.0.iter().flat_map(|s| s.chain().into_iter().chain(s.set()))
    }

    /// The rule with `stmt` appended.
    pub fn then(mut self, stmt: Stmt) -> Self {
        self.0.push(stmt);
        self
    }
}

impl From<Stmt> for Rule {
    fn from(s: Stmt) -> Self {
        Rule(vec![s])
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{s}")?;
        }
        Ok(())
    }
}

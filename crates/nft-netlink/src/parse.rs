//! Turns the nft text kproxy's ruleset is written in into typed expressions and data.
//!
//! This is a parser of exactly the subset of the nft language the nftables dataplane renders
//! (rule bodies, set element keys and values, set types), not of nft: anything else is an error,
//! so a new construct in the renderer fails loudly in the encoding tests instead of being
//! mis-encoded. Register allocation and the shape of each match (e.g. a byte-aligned prefix is a
//! shorter payload load, not a bitwise mask) follow what `nft` 1.0.x generates, so the kernel
//! holds the same ruleset whichever way it was loaded.

use std::net::IpAddr;

use kproxy_nftables::transaction::TableFamily;

use crate::expr::{Expr, NatKind, PayloadBase, Verdict};
use crate::sys::*;

/// A rule, key or type that is outside the supported subset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported nft syntax {what:?} in {text:?}")]
pub struct ParseError {
    /// The offending token or construct.
    pub what: String,
    /// The whole text.
    pub text: String,
}

/// The nft datatypes kproxy's sets use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    /// `ipv4_addr`
    Ipv4,
    /// `ipv6_addr`
    Ipv6,
    /// `inet_proto`
    Proto,
    /// `inet_service`
    Service,
    /// `integer` of 32 bits: only as the type of a `numgen` in a `typeof` declaration.
    Integer,
}

impl DataType {
    /// nft's datatype id (`enum datatypes`).
    pub fn id(self) -> u32 {
        match self {
            DataType::Ipv4 => 7,
            DataType::Ipv6 => 8,
            DataType::Proto => 12,
            DataType::Service => 13,
            DataType::Integer => 4,
        }
    }

    /// Length in bytes.
    pub fn byte_len(self) -> u32 {
        match self {
            DataType::Ipv4 => 4,
            DataType::Ipv6 => 16,
            DataType::Proto => 1,
            DataType::Service => 2,
            DataType::Integer => 4,
        }
    }
}

/// A set key type: one datatype or a concatenation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyType(pub Vec<DataType>);

impl KeyType {
    /// Parses `ipv4_addr . inet_proto . inet_service`.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let err = |w: &str| ParseError { what: w.to_owned(), text: text.to_owned() };
        let types = text
            .split(" . ")
            .map(|t| match t.trim() {
                "ipv4_addr" => Ok(DataType::Ipv4),
                "ipv6_addr" => Ok(DataType::Ipv6),
                "inet_proto" => Ok(DataType::Proto),
                "inet_service" => Ok(DataType::Service),
                other => Err(err(other)),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(KeyType(types))
    }

    /// `NFTA_SET_KEY_TYPE`: concatenations pack each datatype id in 6 bits, first one highest.
    pub fn id(&self) -> u32 {
        match self.0.as_slice() {
            [one] => one.id(),
            many => many.iter().fold(0, |acc, t| (acc << 6) | t.id()),
        }
    }

    /// The length of each field, unpadded (`NFTA_SET_DESC_CONCAT`).
    pub fn field_lens(&self) -> Vec<u32> {
        self.0.iter().map(|t| t.byte_len()).collect()
    }

    /// `NFTA_SET_KEY_LEN`: each field of a concatenation takes whole 32-bit registers.
    pub fn byte_len(&self) -> u32 {
        match self.0.as_slice() {
            [one] => one.byte_len(),
            many => many.iter().map(|t| t.byte_len().div_ceil(4) * 4).sum(),
        }
    }

    /// True for a concatenation.
    pub fn is_concat(&self) -> bool {
        self.0.len() > 1
    }
}

/// An expression a set type is declared by (`typeof`), with what nft records about it in the
/// set's user data (its `expr_types` id and its own attributes), so that `nft list` prints the
/// declaration back and netlink- and text-created sets are indistinguishable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeofExpr {
    /// `ip daddr`, `ip6 saddr`, `th dport`: nft's protocol description and header field ids.
    Payload {
        /// `enum proto_desc_id`.
        desc: u32,
        /// Index of the field in the description's templates.
        field: u32,
        /// The field's datatype.
        dtype: DataType,
    },
    /// `meta l4proto`.
    Meta {
        /// `NFT_META_*`.
        key: u32,
    },
    /// `numgen random mod N`.
    Numgen {
        /// Modulus.
        modulus: u32,
    },
}

/// nft's `enum proto_desc_id` values for the headers kproxy matches.
const PROTO_DESC_UDP: u32 = 6;
const PROTO_DESC_TCP: u32 = 8;
const PROTO_DESC_SCTP: u32 = 10;
const PROTO_DESC_TH: u32 = 11;
const PROTO_DESC_IP: u32 = 12;
const PROTO_DESC_IP6: u32 = 13;

impl TypeofExpr {
    /// The datatype of the value the expression produces.
    pub fn datatype(self) -> DataType {
        match self {
            TypeofExpr::Payload { dtype, .. } => dtype,
            TypeofExpr::Meta { .. } => DataType::Proto,
            TypeofExpr::Numgen { .. } => DataType::Integer,
        }
    }

    /// nft's `enum expr_types` id (`EXPR_PAYLOAD`, `EXPR_META`, `EXPR_NUMGEN`).
    fn etype(self) -> u32 {
        match self {
            TypeofExpr::Payload { .. } => 7,
            TypeofExpr::Meta { .. } => 9,
            TypeofExpr::Numgen { .. } => 23,
        }
    }

    /// The expression's own user data attributes (`*_expr_build_udata` in nft).
    fn udata(self) -> Vec<(u8, u32)> {
        match self {
            TypeofExpr::Payload { desc, field, .. } => vec![(0, desc), (1, field)],
            TypeofExpr::Meta { key } => vec![(0, key)],
            TypeofExpr::Numgen { modulus } => vec![(0, NFT_NG_RANDOM), (1, modulus), (2, 0)],
        }
    }
}

/// A `typeof` declaration of a set key or map data: a concatenation of expressions (a single
/// expression is outside the supported subset; nft records it differently).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Typeof(pub Vec<TypeofExpr>);

impl Typeof {
    /// Parses `ip daddr . meta l4proto . th dport . numgen random mod 2` for a table of `family`.
    pub fn parse(family: TableFamily, text: &str) -> Result<Self, ParseError> {
        let mut p = Parser::new(family, text, &|_| None, &|_| false);
        let mut exprs = Vec::new();
        for item in p.concat()? {
            exprs.push(match item {
                Item::Numgen(modulus, 0) => TypeofExpr::Numgen { modulus },
                Item::Numgen(..) => return Err(p.err("offset")),
                Item::ProtoDport { desc } => TypeofExpr::Payload { desc, field: 2, dtype: DataType::Service },
                Item::Sel(sel) => p.typeof_expr(sel)?,
            });
        }
        if let Some(t) = p.peek() {
            return Err(p.err(t));
        }
        let t = Typeof(exprs);
        if t.0.len() < 2 || concat_udata(&t.0).len() > usize::from(u8::MAX) {
            return Err(p.err("typeof"));
        }
        Ok(t)
    }

    /// The key (or data) type the expressions' values make up.
    pub fn key_type(&self) -> KeyType {
        KeyType(self.0.iter().map(|e| e.datatype()).collect())
    }

    /// The protocol match nft 1.0.6 puts before a `dnat ... map` statement reading a map whose
    /// data is declared by this (unless the rule already matches it): `tcp dport` /
    /// `udp dport` / `sctp dport` depend on the protocol (so such a statement only ever
    /// translates that protocol), `th dport` does not.
    pub fn l4_dependency(&self) -> Option<u8> {
        self.0.iter().find_map(|e| match *e {
            TypeofExpr::Payload { desc: PROTO_DESC_TCP, .. } => Some(6),
            TypeofExpr::Payload { desc: PROTO_DESC_UDP, .. } => Some(17),
            TypeofExpr::Payload { desc: PROTO_DESC_SCTP, .. } => Some(132),
            _ => None,
        })
    }

    /// The value of nft's `NFTNL_UDATA_SET_KEY_TYPEOF` / `DATA_TYPEOF` attribute.
    pub fn udata(&self) -> Vec<u8> {
        concat_udata(&self.0)
    }
}

/// nft's user data for a concatenation: `TYPEOF_EXPR = EXPR_CONCAT` and, in `TYPEOF_DATA`, one
/// nest per field (`SUB_TYPE` = its `expr_types` id, `SUB_DATA` = its own attributes). A
/// concatenation declared by type names has no fields here.
pub fn concat_udata(exprs: &[TypeofExpr]) -> Vec<u8> {
    fn put(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
        out.push(kind);
        out.push(value.len() as u8);
        out.extend_from_slice(value);
    }
    let mut fields = Vec::new();
    for (i, e) in exprs.iter().enumerate() {
        let mut own = Vec::new();
        for (kind, v) in e.udata() {
            put(&mut own, kind, &v.to_ne_bytes());
        }
        let mut field = Vec::new();
        put(&mut field, 0, &e.etype().to_ne_bytes());
        put(&mut field, 1, &own);
        put(&mut fields, i as u8, &field);
    }
    let mut out = Vec::new();
    // EXPR_CONCAT
    put(&mut out, 0, &13u32.to_ne_bytes());
    put(&mut out, 1, &fields);
    out
}

/// An element key: its bytes, and the exclusive end of the range for prefix keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElementKey {
    /// Key bytes (concatenation fields padded to 4 bytes).
    pub start: Vec<u8>,
    /// For `addr/len` keys of interval sets: the first address after the range, `None` when the
    /// range reaches the end of the address space.
    pub interval_end: Option<Option<Vec<u8>>>,
    /// For concatenations ending in `addr/len` (sets of concatenated ranges): the key with the
    /// last field at the range's last address (inclusive, as nft sends it).
    pub key_end: Option<Vec<u8>>,
}

/// Parses an element key (`10.0.0.1 . tcp . 80`, `198.18.0.0/16`, `fd00::1 . fd00::1`).
pub fn element_key(text: &str) -> Result<ElementKey, ParseError> {
    let err = |w: &str| ParseError { what: w.to_owned(), text: text.to_owned() };
    let fields: Vec<&str> = text.split(" . ").map(str::trim).collect();
    // `addr/len`: the range's first address and the prefix length.
    let prefix = |f: &str, addr: &str, len: &str| -> Result<(Vec<u8>, u32), ParseError> {
        let addr: IpAddr = addr.parse().map_err(|_| err(addr))?;
        let len: u32 = len.parse().map_err(|_| err(len))?;
        let bytes = addr_bytes(addr);
        if len > bytes.len() as u32 * 8 {
            return Err(err(f));
        }
        Ok((masked(&bytes, len), len))
    };
    if let [one] = fields.as_slice()
        && let Some((addr, len)) = one.split_once('/')
    {
        let (start, len) = prefix(one, addr, len)?;
        return Ok(ElementKey { interval_end: Some(range_end(&start, len)), start, key_end: None });
    }
    let concat = fields.len() > 1;
    let mut key = Vec::new();
    let mut key_end = None;
    for (i, f) in fields.iter().enumerate() {
        if let Some((addr, len)) = f.split_once('/').filter(|_| concat && i + 1 == fields.len()) {
            let (first, len) = prefix(f, addr, len)?;
            let last: Vec<u8> = first.iter().zip(prefix_mask(first.len(), len)).map(|(a, m)| a | !m).collect();
            let mut end = key.clone();
            end.extend_from_slice(&last);
            end.resize(end.len().div_ceil(4) * 4, 0);
            key.extend_from_slice(&first);
            key.resize(key.len().div_ceil(4) * 4, 0);
            key_end = Some(end);
            continue;
        }
        let bytes = if let Ok(ip) = f.parse::<IpAddr>() {
            addr_bytes(ip)
        } else if let Some(p) = proto_number(f) {
            vec![p]
        } else if let Some(hex) = f.strip_prefix("0x") {
            // The only hex field kproxy writes is a numgen slot: the 32-bit host-endian value
            // numgen leaves in its register.
            u32::from_str_radix(hex, 16).map_err(|_| err(f))?.to_ne_bytes().to_vec()
        } else if let Ok(port) = f.parse::<u16>() {
            port.to_be_bytes().to_vec()
        } else {
            return Err(err(f));
        };
        key.extend_from_slice(&bytes);
        if concat {
            key.resize(key.len().div_ceil(4) * 4, 0);
        }
    }
    Ok(ElementKey { start: key, interval_end: None, key_end })
}

/// The data of a map element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapData {
    /// A verdict (`goto service-...`).
    Verdict(Verdict),
    /// A value (`198.18.16.10 . 8080`), concatenation fields padded to 4 bytes like keys.
    Value(Vec<u8>),
}

/// Parses map data: a verdict, or a value for maps declared by `typeof` (`addr . port`).
pub fn map_data(text: &str) -> Result<MapData, ParseError> {
    match text.split_whitespace().next() {
        Some("accept" | "drop" | "return" | "jump" | "goto") => verdict(text).map(MapData::Verdict),
        _ => match element_key(text)? {
            ElementKey { start, interval_end: None, key_end: None } => Ok(MapData::Value(start)),
            _ => Err(ParseError { what: "/".to_owned(), text: text.to_owned() }),
        },
    }
}

/// Parses map data: a verdict.
pub fn verdict(text: &str) -> Result<Verdict, ParseError> {
    let err = || ParseError { what: text.to_owned(), text: text.to_owned() };
    let mut words = text.split_whitespace();
    let v = match (words.next(), words.next()) {
        (Some("accept"), None) => Verdict::Accept,
        (Some("drop"), None) => Verdict::Drop,
        (Some("return"), None) => Verdict::Return,
        (Some("jump"), Some(c)) => Verdict::Jump(c.to_owned()),
        (Some("goto"), Some(c)) => Verdict::Goto(c.to_owned()),
        _ => return Err(err()),
    };
    if words.next().is_some() {
        return Err(err());
    }
    Ok(v)
}

fn addr_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

fn prefix_mask(len_bytes: usize, prefix: u32) -> Vec<u8> {
    (0..len_bytes)
        .map(|i| {
            let bits = prefix.saturating_sub(i as u32 * 8).min(8);
            if bits == 0 { 0 } else { 0xffu8 << (8 - bits) }
        })
        .collect()
}

fn masked(addr: &[u8], prefix: u32) -> Vec<u8> {
    addr.iter().zip(prefix_mask(addr.len(), prefix)).map(|(a, m)| a & m).collect()
}

/// The first address after `start/prefix`, or `None` on overflow.
fn range_end(start: &[u8], prefix: u32) -> Option<Vec<u8>> {
    let mut end: Vec<u8> = start.iter().zip(prefix_mask(start.len(), prefix)).map(|(a, m)| a | !m).collect();
    for b in end.iter_mut().rev() {
        let (v, carry) = b.overflowing_add(1);
        *b = v;
        if !carry {
            return Some(end);
        }
    }
    None
}

fn proto_number(s: &str) -> Option<u8> {
    match s {
        "tcp" => Some(6),
        "udp" => Some(17),
        "sctp" => Some(132),
        _ => None,
    }
}

/// What a selector loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sel {
    Addr { offset: u32, len: u32 },
    L4Proto,
    Dport,
    IifName,
    Fib { saddr: bool },
    Mark,
}

impl Sel {
    fn len(self) -> u32 {
        match self {
            Sel::Addr { len, .. } => len,
            Sel::L4Proto => 1,
            Sel::Dport => 2,
            Sel::IifName => 16,
            Sel::Fib { .. } | Sel::Mark => 4,
        }
    }

    fn load(self, dreg: u32, len: u32) -> Expr {
        match self {
            Sel::Addr { offset, .. } => Expr::Payload { base: PayloadBase::Network, offset, len, dreg },
            Sel::L4Proto => Expr::Meta { key: NFT_META_L4PROTO, dreg },
            Sel::Dport => Expr::Payload { base: PayloadBase::Transport, offset: 2, len: 2, dreg },
            Sel::IifName => Expr::Meta { key: NFT_META_IIFNAME, dreg },
            Sel::Fib { saddr } => Expr::FibType { saddr, dreg },
            Sel::Mark => Expr::Meta { key: NFT_META_MARK, dreg },
        }
    }
}

/// One field of a concatenation: a selector or a `numgen` (a draw, or with `mod 1 offset O` the
/// constant O, as in affinity set keys), or
/// in a `typeof` declaration `tcp|udp|sctp dport` (`th dport` by another protocol
/// description; in a rule it would need a protocol match, outside the subset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    Sel(Sel),
    /// `numgen random mod N offset O`.
    Numgen(u32, u32),
    ProtoDport {
        desc: u32,
    },
}

/// nft numbers registers in 32-bit units; a field starting on a 128-bit boundary is named by
/// its 128-bit register (`NFT_REG_1`...), the others by `NFT_REG32_xx`.
fn register(unit: u32) -> u32 {
    if unit.is_multiple_of(4) { NFT_REG_1 + unit / 4 } else { NFT_REG32_00 + unit }
}

/// What a rule's encoding needs to know of a data map it reads (`dnat ... map @m`): `None` when
/// the map is unknown, else the protocol match its data type implies
/// ([`Typeof::l4_dependency`]).
pub type MapDependency<'m> = &'m dyn Fn(&str) -> Option<Option<u8>>;

struct Parser<'a> {
    toks: Vec<&'a str>,
    pos: usize,
    text: &'a str,
    family: TableFamily,
    out: Vec<Expr>,
    maps: MapDependency<'a>,
    /// The protocols of the rule's `meta l4proto P` matches so far: they satisfy (or, if they
    /// differ, contradict) the protocol dependency of a later `dnat ... map`.
    l4protos: Vec<u8>,
    /// Whether a set holds concatenated ranges (its keys' host-order fields are converted).
    ranges: &'a dyn Fn(&str) -> bool,
}

/// Parses one rule body into expressions; a rule that reads a data map without matching the
/// protocol first is refused, since its encoding depends on the map's declaration (see
/// [`rule_with_maps`]).
pub fn rule(family: TableFamily, text: &str) -> Result<Vec<Expr>, ParseError> {
    rule_with_maps(family, text, &|_| None, &|_| false)
}

/// Parses one rule body into expressions, `maps` telling what the data maps it reads imply and
/// `ranges` which sets hold concatenated ranges.
pub fn rule_with_maps<'a>(
    family: TableFamily,
    text: &'a str,
    maps: MapDependency<'a>,
    ranges: &'a dyn Fn(&str) -> bool,
) -> Result<Vec<Expr>, ParseError> {
    let mut p = Parser::new(family, text, maps, ranges);
    while p.pos < p.toks.len() {
        p.statement()?;
    }
    Ok(p.out)
}

impl<'a> Parser<'a> {
    fn new(family: TableFamily, text: &'a str, maps: MapDependency<'a>, ranges: &'a dyn Fn(&str) -> bool) -> Self {
        Parser {
            toks: text.split_whitespace().collect(),
            pos: 0,
            text,
            family,
            out: Vec::new(),
            maps,
            l4protos: vec![],
            ranges,
        }
    }

    fn err(&self, what: &str) -> ParseError {
        ParseError { what: what.to_owned(), text: self.text.to_owned() }
    }

    fn peek(&self) -> Option<&'a str> {
        self.toks.get(self.pos).copied()
    }

    fn next(&mut self) -> Result<&'a str, ParseError> {
        let t = self.peek().ok_or_else(|| self.err("<end of rule>"))?;
        self.pos += 1;
        Ok(t)
    }

    fn expect(&mut self, want: &str) -> Result<(), ParseError> {
        let t = self.next()?;
        if t == want { Ok(()) } else { Err(self.err(t)) }
    }

    fn number(&mut self) -> Result<u32, ParseError> {
        let t = self.next()?;
        let v = match t.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => t.parse(),
        };
        v.map_err(|_| self.err(t))
    }

    fn addr(&self, text: &str) -> Result<IpAddr, ParseError> {
        let ip: IpAddr = text.parse().map_err(|_| self.err(text))?;
        match (self.family, ip) {
            (TableFamily::Ip, IpAddr::V4(_)) | (TableFamily::Ip6, IpAddr::V6(_)) => Ok(ip),
            _ => Err(self.err(text)),
        }
    }

    fn statement(&mut self) -> Result<(), ParseError> {
        let t = self.next()?;
        match t {
            "accept" => self.out.push(Expr::Verdict(Verdict::Accept)),
            "drop" => self.out.push(Expr::Verdict(Verdict::Drop)),
            "return" => self.out.push(Expr::Verdict(Verdict::Return)),
            "jump" => {
                let c = self.next()?;
                self.out.push(Expr::Verdict(Verdict::Jump(c.to_owned())))
            }
            "goto" => {
                let c = self.next()?;
                self.out.push(Expr::Verdict(Verdict::Goto(c.to_owned())))
            }
            "ct" => self.ct()?,
            "reject" => self.reject()?,
            "masquerade" => {
                let flags = self.nat_flags();
                self.out.push(Expr::Masq { flags });
            }
            "snat" | "dnat" => self.nat(if t == "snat" { NatKind::Snat } else { NatKind::Dnat })?,
            "numgen" => {
                self.expect("random")?;
                self.expect("mod")?;
                let modulus = self.number()?;
                self.out.push(Expr::Numgen { dreg: NFT_REG_1, modulus, offset: 0 });
                self.optional("==");
                let v = self.number()?;
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_EQ, data: v.to_ne_bytes().to_vec() });
            }
            "update" => self.update()?,
            "mark" if self.peek() == Some("set") => self.mark_set()?,
            "mark" if self.peek() == Some("and") => {
                self.pos += 1;
                let mask = self.number()?;
                self.expect("==")?;
                let v = self.number()?;
                self.out.push(Sel::Mark.load(NFT_REG_1, 4));
                self.out.push(Expr::Bitwise {
                    reg: NFT_REG_1,
                    mask: mask.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                    explicit_op: true,
                });
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_EQ, data: v.to_ne_bytes().to_vec() });
            }
            _ => {
                self.pos -= 1;
                self.relation()?;
            }
        }
        Ok(())
    }

    fn optional(&mut self, want: &str) -> bool {
        if self.peek() == Some(want) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn ct(&mut self) -> Result<(), ParseError> {
        let (key, bit) = match (self.next()?, self.next()?) {
            ("state", "new") => (NFT_CT_STATE, 0x08u32),
            ("state", "established") => (NFT_CT_STATE, 0x02),
            ("state", "related") => (NFT_CT_STATE, 0x04),
            ("status", "dnat") => (NFT_CT_STATUS, 0x20),
            ("status", "snat") => (NFT_CT_STATUS, 0x10),
            (_, v) => return Err(self.err(v)),
        };
        self.out.push(Expr::Ct { key, dreg: NFT_REG_1 });
        self.out.push(Expr::Bitwise {
            reg: NFT_REG_1,
            mask: bit.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
            explicit_op: false,
        });
        self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_NEQ, data: vec![0; 4] });
        Ok(())
    }

    fn reject(&mut self) -> Result<(), ParseError> {
        if self.optional("with") {
            self.expect("tcp")?;
            self.expect("reset")?;
            self.out.push(Expr::Reject { kind: 1, code: 0 });
        } else {
            // ICMP port unreachable / ICMPv6 port unreachable.
            let code = if self.family == TableFamily::Ip { 3 } else { 4 };
            self.out.push(Expr::Reject { kind: 0, code });
        }
        Ok(())
    }

    fn nat_flags(&mut self) -> u32 {
        if self.optional("fully-random") { NF_NAT_RANGE_PROTO_RANDOM_FULLY } else { 0 }
    }

    fn nat(&mut self, kind: NatKind) -> Result<(), ParseError> {
        let family_word = if self.family == TableFamily::Ip { "ip" } else { "ip6" };
        if self.peek() == Some(family_word) {
            self.pos += 1;
            return self.nat_map(kind);
        }
        self.expect("to")?;
        let target = self.next()?;
        let (addr, port) = match target.strip_prefix('[') {
            Some(rest) => {
                let (a, p) = rest.split_once("]:").ok_or_else(|| self.err(target))?;
                (a, Some(p))
            }
            None if self.family == TableFamily::Ip => match target.split_once(':') {
                Some((a, p)) => (a, Some(p)),
                None => (target, None),
            },
            None => (target, None),
        };
        let addr = self.addr(addr)?;
        self.out.push(Expr::Immediate { dreg: NFT_REG_1, data: addr_bytes(addr) });
        let mut flags = 0;
        let proto_reg = match port {
            Some(p) => {
                let port: u16 = p.parse().map_err(|_| self.err(p))?;
                self.out.push(Expr::Immediate { dreg: 2, data: port.to_be_bytes().to_vec() });
                flags |= NF_NAT_RANGE_PROTO_SPECIFIED;
                Some(2)
            }
            None => None,
        };
        flags |= self.nat_flags();
        let family = if self.family == TableFamily::Ip { NFPROTO_IPV4 } else { NFPROTO_IPV6 };
        self.out.push(Expr::Nat { kind, family, addr_reg: NFT_REG_1, proto_reg, flags });
        Ok(())
    }

    /// `dnat ip to KEY . numgen random mod N map @m`: the concatenated key looked up in a map
    /// whose data is `addr . port`, so the address lands in register 1 and the port in the
    /// 32-bit register after it. nft sends no nat flags for this form (the kernel derives them).
    fn nat_map(&mut self, kind: NatKind) -> Result<(), ParseError> {
        self.expect("to")?;
        let items = self.concat()?;
        self.expect("map")?;
        let set = self.set_ref()?;
        // An earlier `meta l4proto P` match of the rule is the dependency the map's data
        // implies: nft 1.0.6 adds nothing then (and refuses a different P). So with an explicit
        // match the encoding is the same whatever the map's declaration, and such a rule needs
        // no declaration in the batch (a contradicting one in the kernel then goes unnoticed
        // here; the renderer always matches the map's protocol). Without one, nft adds the
        // match itself, but only regularly as the rule's first statement: after a prefix match
        // such as `ip daddr 198.18.128.0/17` it adds none at all, so that is refused.
        match ((self.maps)(&set), self.l4protos.as_slice()) {
            (Some(Some(proto)), explicit) if explicit.iter().any(|&p| p != proto) => {
                return Err(self.err(&format!("meta l4proto contradicts the data of @{set}")));
            }
            (Some(Some(_)), []) if !self.out.is_empty() => {
                return Err(self.err("dnat map with an implicit protocol dependency after other statements"));
            }
            (Some(Some(proto)), []) => {
                self.out.push(Expr::Meta { key: NFT_META_L4PROTO, dreg: NFT_REG_1 });
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_EQ, data: vec![proto] });
            }
            (None, []) => return Err(self.err(&format!("@{set}: map not declared in the batch"))),
            _ => {}
        }
        self.load_concat(&items)?;
        self.out.push(Expr::Lookup { sreg: NFT_REG_1, set, set_id: None, dreg: Some(NFT_REG_1), invert: false });
        let (family, addr_units) = if self.family == TableFamily::Ip { (NFPROTO_IPV4, 1) } else { (NFPROTO_IPV6, 4) };
        self.out.push(Expr::Nat { kind, family, addr_reg: NFT_REG_1, proto_reg: Some(register(addr_units)), flags: 0 });
        Ok(())
    }

    /// `item [. item]*` where an item is a selector or `numgen random mod N`.
    fn concat(&mut self) -> Result<Vec<Item>, ParseError> {
        let mut items = Vec::new();
        loop {
            if self.optional("numgen") {
                items.push(self.numgen()?);
            } else if let Some(desc) = self.peek().and_then(|t| match t {
                "tcp" => Some(PROTO_DESC_TCP),
                "udp" => Some(PROTO_DESC_UDP),
                "sctp" => Some(PROTO_DESC_SCTP),
                _ => None,
            }) {
                self.pos += 1;
                self.expect("dport")?;
                items.push(Item::ProtoDport { desc });
            } else {
                items.push(Item::Sel(self.selector()?));
            }
            if !self.optional(".") {
                return Ok(items);
            }
        }
    }

    /// `random mod N [offset O]`, after `numgen`.
    fn numgen(&mut self) -> Result<Item, ParseError> {
        self.expect("random")?;
        self.expect("mod")?;
        let modulus = self.number()?;
        let offset = if self.optional("offset") { self.number()? } else { 0 };
        Ok(Item::Numgen(modulus, offset))
    }

    /// Loads a concatenation into consecutive registers from register 1 on, as nft does.
    fn load_concat(&mut self, items: &[Item]) -> Result<(), ParseError> {
        self.load_key(items, false)
    }

    /// Loads a lookup key; for a set of concatenated ranges (`ranges`) nft converts the
    /// host-order fields (`meta l4proto`) to network order after loading them.
    fn load_key(&mut self, items: &[Item], ranges: bool) -> Result<(), ParseError> {
        let mut unit = 0;
        for item in items {
            match *item {
                Item::Sel(s) => {
                    self.out.push(s.load(register(unit), s.len()));
                    if ranges && s == Sel::L4Proto {
                        self.out.push(Expr::ByteorderHton { reg: register(unit), len: 1, size: 2 });
                    }
                    unit += s.len().div_ceil(4);
                }
                Item::Numgen(modulus, offset) => {
                    self.out.push(Expr::Numgen { dreg: register(unit), modulus, offset });
                    unit += 1;
                }
                Item::ProtoDport { .. } => return Err(self.err("dport")),
            }
        }
        Ok(())
    }

    /// What a selector is as a `typeof` expression.
    fn typeof_expr(&self, sel: Sel) -> Result<TypeofExpr, ParseError> {
        let v4 = self.family == TableFamily::Ip;
        Ok(match sel {
            Sel::Addr { offset, .. } => {
                // Template indexes of saddr / daddr in nft's ip and ip6 header descriptions.
                let field = match (v4, offset) {
                    (true, 12) => 11,
                    (true, 16) => 12,
                    (false, 8) => 8,
                    (false, 24) => 9,
                    _ => return Err(self.err("address")),
                };
                let (desc, dtype) = if v4 { (PROTO_DESC_IP, DataType::Ipv4) } else { (PROTO_DESC_IP6, DataType::Ipv6) };
                TypeofExpr::Payload { desc, field, dtype }
            }
            Sel::L4Proto => TypeofExpr::Meta { key: NFT_META_L4PROTO },
            Sel::Dport => TypeofExpr::Payload { desc: PROTO_DESC_TH, field: 2, dtype: DataType::Service },
            Sel::IifName => return Err(self.err("iifname")),
            Sel::Fib { .. } => return Err(self.err("fib")),
            Sel::Mark => return Err(self.err("mark")),
        })
    }

    /// `update @set { item [. item]* }`.
    fn update(&mut self) -> Result<(), ParseError> {
        let set = self.set_ref()?;
        self.expect("{")?;
        let items = self.concat()?;
        self.expect("}")?;
        self.load_concat(&items)?;
        self.out.push(Expr::DynsetUpdate { set, set_id: None, sreg: NFT_REG_1 });
        Ok(())
    }

    fn mark_set(&mut self) -> Result<(), ParseError> {
        self.expect("set")?;
        self.expect("mark")?;
        let op = self.next()?;
        let v = self.number()?;
        let (mask, xor) = match op {
            "or" => (!v, v),
            "and" => (v, 0),
            _ => return Err(self.err(op)),
        };
        self.out.push(Sel::Mark.load(NFT_REG_1, 4));
        self.out.push(Expr::Bitwise {
            reg: NFT_REG_1,
            mask: mask.to_ne_bytes().to_vec(),
            xor: xor.to_ne_bytes().to_vec(),
            explicit_op: true,
        });
        self.out.push(Expr::MetaSet { key: NFT_META_MARK, sreg: NFT_REG_1 });
        Ok(())
    }

    fn set_ref(&mut self) -> Result<String, ParseError> {
        let t = self.next()?;
        t.strip_prefix('@').map(str::to_owned).ok_or_else(|| self.err(t))
    }

    fn selector(&mut self) -> Result<Sel, ParseError> {
        let t = self.next()?;
        let sel = match t {
            "ip" | "ip6" => {
                let want = if self.family == TableFamily::Ip { "ip" } else { "ip6" };
                if t != want {
                    return Err(self.err(t));
                }
                let v4 = self.family == TableFamily::Ip;
                match self.next()? {
                    "saddr" => Sel::Addr { offset: if v4 { 12 } else { 8 }, len: if v4 { 4 } else { 16 } },
                    "daddr" => Sel::Addr { offset: if v4 { 16 } else { 24 }, len: if v4 { 4 } else { 16 } },
                    other => return Err(self.err(other)),
                }
            }
            "meta" => {
                self.expect("l4proto")?;
                Sel::L4Proto
            }
            "th" => {
                self.expect("dport")?;
                Sel::Dport
            }
            "iifname" => Sel::IifName,
            "fib" => {
                let saddr = match self.next()? {
                    "saddr" => true,
                    "daddr" => false,
                    other => return Err(self.err(other)),
                };
                self.expect("type")?;
                Sel::Fib { saddr }
            }
            other => return Err(self.err(other)),
        };
        Ok(sel)
    }

    /// `sel [. sel]* (vmap @m | [!=] @s | [!=|==] value)`.
    fn relation(&mut self) -> Result<(), ParseError> {
        let mut items = vec![Item::Sel(self.selector()?)];
        while self.optional(".") {
            items.push(if self.optional("numgen") { self.numgen()? } else { Item::Sel(self.selector()?) });
        }
        // A constant-valued `numgen` (the only way nft takes a constant in a concatenation)
        // only makes sense as part of a set lookup key.
        let sels: Vec<Sel> = items.iter().filter_map(|i| if let Item::Sel(s) = i { Some(*s) } else { None }).collect();
        let negate = self.optional("!=");
        if !negate {
            self.optional("==");
        }
        let t = self.peek().ok_or_else(|| self.err("<end of rule>"))?;
        if t == "vmap" || t.starts_with('@') {
            let dreg = if t == "vmap" {
                self.pos += 1;
                Some(NFT_REG_VERDICT)
            } else {
                None
            };
            if negate && dreg.is_some() {
                return Err(self.err("!= vmap"));
            }
            let set = self.set_ref()?;
            let ranges = items.len() > 1 && (self.ranges)(&set);
            self.load_key(&items, ranges)?;
            self.out.push(Expr::Lookup { sreg: NFT_REG_1, set, set_id: None, dreg, invert: negate });
            return Ok(());
        }
        let ([sel], 1) = (sels.as_slice(), items.len()) else { return Err(self.err(".")) };
        let op = if negate { NFT_CMP_NEQ } else { NFT_CMP_EQ };
        let value = self.next()?;
        match *sel {
            Sel::Addr { len, .. } => {
                let (addr, prefix) = match value.split_once('/') {
                    Some((a, p)) => (a, Some(p.parse::<u32>().map_err(|_| self.err(p))?)),
                    None => (value, None),
                };
                let bytes = addr_bytes(self.addr(addr)?);
                let full = len * 8;
                let prefix = prefix.unwrap_or(full);
                if prefix > full {
                    return Err(self.err(value));
                }
                if prefix == full {
                    self.out.push(sel.load(NFT_REG_1, len));
                    self.out.push(Expr::Cmp { sreg: NFT_REG_1, op, data: bytes });
                } else if prefix % 8 == 0 && prefix > 0 {
                    let n = (prefix / 8) as usize;
                    self.out.push(sel.load(NFT_REG_1, n as u32));
                    self.out.push(Expr::Cmp { sreg: NFT_REG_1, op, data: bytes[..n].to_vec() });
                } else {
                    let mask = prefix_mask(bytes.len(), prefix);
                    self.out.push(sel.load(NFT_REG_1, len));
                    self.out.push(Expr::Bitwise {
                        reg: NFT_REG_1,
                        mask,
                        xor: vec![0; bytes.len()],
                        explicit_op: false,
                    });
                    self.out.push(Expr::Cmp { sreg: NFT_REG_1, op, data: masked(&bytes, prefix) });
                }
            }
            Sel::L4Proto => {
                let p = proto_number(value).ok_or_else(|| self.err(value))?;
                if !negate {
                    self.l4protos.push(p);
                }
                self.out.push(sel.load(NFT_REG_1, 1));
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op, data: vec![p] });
            }
            Sel::Dport => {
                let p: u16 = value.parse().map_err(|_| self.err(value))?;
                self.out.push(sel.load(NFT_REG_1, 2));
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op, data: p.to_be_bytes().to_vec() });
            }
            Sel::IifName => {
                let name = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).ok_or_else(|| self.err(value))?;
                let data = match name.strip_suffix('*') {
                    Some(prefix) => prefix.as_bytes().to_vec(),
                    None => {
                        let mut d = name.as_bytes().to_vec();
                        d.resize(16, 0);
                        d
                    }
                };
                if data.len() > 16 {
                    return Err(self.err(value));
                }
                self.out.push(sel.load(NFT_REG_1, 16));
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op, data });
            }
            Sel::Fib { .. } => {
                let rtn: u32 = match value {
                    "unicast" => 1,
                    "local" => 2,
                    "broadcast" => 3,
                    "multicast" => 5,
                    other => return Err(self.err(other)),
                };
                self.out.push(sel.load(NFT_REG_1, 4));
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op, data: rtn.to_ne_bytes().to_vec() });
            }
            Sel::Mark => return Err(self.err("mark")),
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn concat_key_types_pack_six_bits_per_field() {
        let k = KeyType::parse("ipv4_addr . inet_proto . inet_service").unwrap();
        assert_eq!((k.id(), k.byte_len()), (0x730d, 12));
        let k = KeyType::parse("ipv6_addr . ipv6_addr").unwrap();
        assert_eq!((k.id(), k.byte_len()), ((8 << 6) | 8, 32));
        assert_eq!(KeyType::parse("ipv4_addr").unwrap().byte_len(), 4);
        assert!(KeyType::parse("ether_addr").is_err());
    }

    #[test]
    fn element_keys_pad_concat_fields_and_compute_range_ends() {
        let k = element_key("10.0.0.1 . tcp . 80").unwrap();
        assert_eq!(k.start, vec![10, 0, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0]);
        let k = element_key("198.18.16.0/20").unwrap();
        assert_eq!(k.start, vec![198, 18, 16, 0]);
        assert_eq!(k.interval_end, Some(Some(vec![198, 18, 32, 0])));
        assert_eq!(element_key("255.0.0.0/8").unwrap().interval_end, Some(None));
        assert!(element_key("10.0.0.1 . bogus").is_err());
    }

    #[test]
    fn typeof_concats_have_the_types_of_their_expressions() {
        let k = Typeof::parse(TableFamily::Ip, "ip daddr . meta l4proto . th dport . numgen random mod 2").unwrap();
        assert_eq!((k.key_type().id(), k.key_type().byte_len()), (0x1c_c344, 16));
        let k = Typeof::parse(TableFamily::Ip, "meta l4proto . th dport . numgen random mod 2").unwrap();
        assert_eq!((k.key_type().id(), k.key_type().byte_len()), (0xc344, 12));
        let d = Typeof::parse(TableFamily::Ip6, "ip6 daddr . tcp dport").unwrap();
        assert_eq!((d.key_type().id(), d.key_type().byte_len()), ((8 << 6) | 13, 20));
        assert_eq!(d.key_type(), Typeof::parse(TableFamily::Ip6, "ip6 daddr . th dport").unwrap().key_type());
        assert_ne!(d.udata(), Typeof::parse(TableFamily::Ip6, "ip6 daddr . th dport").unwrap().udata());
        let sctp = Typeof::parse(TableFamily::Ip, "ip daddr . sctp dport").unwrap();
        assert_eq!((sctp.key_type().id(), sctp.l4_dependency()), ((7 << 6) | 13, Some(132)));
        assert_eq!(Typeof::parse(TableFamily::Ip, "ip daddr . th dport").unwrap().l4_dependency(), None);
        // Outside the subset: a single expression, other expressions, the other family.
        assert!(Typeof::parse(TableFamily::Ip, "ip daddr").is_err());
        assert!(Typeof::parse(TableFamily::Ip, "iifname . ip daddr").is_err());
        assert!(Typeof::parse(TableFamily::Ip, "ip6 daddr . th dport").is_err());
        assert!(Typeof::parse(TableFamily::Ip, "ip daddr . th dport extra").is_err());
    }

    #[test]
    fn map_data_is_a_verdict_or_a_padded_value() {
        assert_eq!(map_data("goto c").unwrap(), MapData::Verdict(Verdict::Goto("c".into())));
        assert_eq!(map_data("198.18.16.10 . 8080").unwrap(), MapData::Value(vec![198, 18, 16, 10, 0x1f, 0x90, 0, 0]));
        assert!(map_data("198.18.16.0/24").is_err());
        let k = element_key("tcp . 30080 . 0x1").unwrap();
        let mut want = vec![6, 0, 0, 0, 0x75, 0x80, 0, 0];
        want.extend_from_slice(&1u32.to_ne_bytes());
        assert_eq!(k.start, want);
        assert!(element_key("tcp . 30080 . 0x100000000").is_err());
    }

    #[test]
    fn dnat_through_a_map_loads_the_concatenation_and_the_data_registers() {
        let th: MapDependency = &|m| (m == "m").then_some(None);
        let text = "dnat ip6 to ip6 daddr . meta l4proto . th dport . numgen random mod 4 map @m";
        let e = rule_with_maps(TableFamily::Ip6, text, th, &|_| false).unwrap();
        let dregs: Vec<u32> = e
            .iter()
            .filter_map(|e| match e {
                Expr::Payload { dreg, .. } | Expr::Meta { dreg, .. } | Expr::Numgen { dreg, .. } => Some(*dreg),
                _ => None,
            })
            .collect();
        assert_eq!(dregs, vec![1, 2, 13, 14]);
        assert!(matches!(e.last(), Some(Expr::Nat { addr_reg: 1, proto_reg: Some(2), flags: 0, .. })));
        let text = "dnat ip to meta l4proto . th dport . numgen random mod 4 map @m";
        let e = rule_with_maps(TableFamily::Ip, text, th, &|_| false).unwrap();
        assert!(matches!(e.last(), Some(Expr::Nat { addr_reg: 1, proto_reg: Some(9), flags: 0, .. })));
        // Data declared as `tcp dport`: nft matches the protocol first.
        let e = rule_with_maps(TableFamily::Ip, text, &|_| Some(Some(6)), &|_| false).unwrap();
        assert_eq!(e[1], Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_EQ, data: vec![6] });
        // An unknown map is refused, not guessed.
        assert!(rule(TableFamily::Ip, text).is_err());
        // After other statements nft is irregular (none after a prefix match): refused.
        assert!(
            rule_with_maps(TableFamily::Ip, &format!("ip daddr 10.0.0.0/9 {text}"), &|_| Some(Some(6)), &|_| false)
                .is_err()
        );
        assert!(
            rule_with_maps(TableFamily::Ip, &format!("ip daddr 10.0.0.0/9 {text}"), &|_| Some(None), &|_| false)
                .is_ok()
        );
    }

    #[test]
    fn an_explicit_protocol_match_is_the_dependency() {
        let text = "meta l4proto udp dnat ip to meta l4proto . th dport . numgen random mod 4 map @m";
        let udp = rule_with_maps(TableFamily::Ip, text, &|_| Some(Some(17)), &|_| false).unwrap();
        let l4proto_loads = udp.iter().filter(|e| matches!(e, Expr::Meta { key: NFT_META_L4PROTO, .. })).count();
        assert_eq!(l4proto_loads, 2, "{udp:?}");
        // The same whatever the map's data, so a map declared elsewhere (unknown) is fine.
        assert_eq!(rule_with_maps(TableFamily::Ip, text, &|_| Some(None), &|_| false).unwrap(), udp);
        assert_eq!(rule(TableFamily::Ip, text).unwrap(), udp);
        // Later matches count too; a protocol other than the data's is refused, as by nft.
        let later = "ip daddr 10.0.0.1 meta l4proto udp dnat ip to th dport . numgen random mod 4 map @m";
        assert_eq!(rule(TableFamily::Ip, later).unwrap()[3], Expr::Cmp { sreg: 1, op: NFT_CMP_EQ, data: vec![17] });
        assert!(rule_with_maps(TableFamily::Ip, text, &|_| Some(Some(6)), &|_| false).is_err());
        let both = format!("meta l4proto tcp {text}");
        assert!(rule_with_maps(TableFamily::Ip, &both, &|_| Some(Some(17)), &|_| false).is_err());
        // `!=` is no dependency (nft adds its own match after it; refused as above).
        let neq = "meta l4proto != udp dnat ip to meta l4proto . th dport . numgen random mod 4 map @m";
        assert!(rule_with_maps(TableFamily::Ip, neq, &|_| Some(Some(6)), &|_| false).is_err());
        assert!(rule(TableFamily::Ip, neq).is_err());
    }

    #[test]
    fn unsupported_rules_are_errors_not_guesses() {
        assert!(rule(TableFamily::Ip, "dnat ip6 to ip6 daddr . th dport map @m").is_err());
        assert!(rule(TableFamily::Ip, "dnat ip to ip daddr . tcp dport map @m").is_err());
        assert!(rule(TableFamily::Ip, "dnat ip to ip daddr . th dport map @m fully-random").is_err());
        assert!(rule(TableFamily::Ip, "dnat ip to ip daddr . th dport vmap @m").is_err());
        assert!(rule(TableFamily::Ip, "tcp flags syn drop").is_err());
        assert!(rule(TableFamily::Ip, "ip6 daddr ::1 drop").is_err());
        assert!(rule(TableFamily::Ip, "ip daddr . ip saddr 1.2.3.4 drop").is_err());
    }
}

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
}

impl DataType {
    /// nft's datatype id (`enum datatypes`).
    pub fn id(self) -> u32 {
        match self {
            DataType::Ipv4 => 7,
            DataType::Ipv6 => 8,
            DataType::Proto => 12,
            DataType::Service => 13,
        }
    }

    /// Length in bytes.
    pub fn byte_len(self) -> u32 {
        match self {
            DataType::Ipv4 => 4,
            DataType::Ipv6 => 16,
            DataType::Proto => 1,
            DataType::Service => 2,
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

/// An element key: its bytes, and the exclusive end of the range for prefix keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElementKey {
    /// Key bytes (concatenation fields padded to 4 bytes).
    pub start: Vec<u8>,
    /// For `addr/len` keys of interval sets: the first address after the range, `None` when the
    /// range reaches the end of the address space.
    pub interval_end: Option<Option<Vec<u8>>>,
}

/// Parses an element key (`10.0.0.1 . tcp . 80`, `198.18.0.0/16`, `fd00::1 . fd00::1`).
pub fn element_key(text: &str) -> Result<ElementKey, ParseError> {
    let err = |w: &str| ParseError { what: w.to_owned(), text: text.to_owned() };
    let fields: Vec<&str> = text.split(" . ").map(str::trim).collect();
    if let [one] = fields.as_slice()
        && let Some((addr, len)) = one.split_once('/')
    {
        let addr: IpAddr = addr.parse().map_err(|_| err(addr))?;
        let len: u32 = len.parse().map_err(|_| err(len))?;
        let start = addr_bytes(addr);
        if len > start.len() as u32 * 8 {
            return Err(err(one));
        }
        let start = masked(&start, len);
        return Ok(ElementKey { interval_end: Some(range_end(&start, len)), start });
    }
    let concat = fields.len() > 1;
    let mut key = Vec::new();
    for f in &fields {
        let bytes = if let Ok(ip) = f.parse::<IpAddr>() {
            addr_bytes(ip)
        } else if let Some(p) = proto_number(f) {
            vec![p]
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
    Ok(ElementKey { start: key, interval_end: None })
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

/// nft numbers registers in 32-bit units; a field starting on a 128-bit boundary is named by
/// its 128-bit register (`NFT_REG_1`...), the others by `NFT_REG32_xx`.
fn register(unit: u32) -> u32 {
    if unit.is_multiple_of(4) { NFT_REG_1 + unit / 4 } else { NFT_REG32_00 + unit }
}

struct Parser<'a> {
    toks: Vec<&'a str>,
    pos: usize,
    text: &'a str,
    family: TableFamily,
    out: Vec<Expr>,
}

/// Parses one rule body into expressions.
pub fn rule(family: TableFamily, text: &str) -> Result<Vec<Expr>, ParseError> {
    let mut p = Parser { toks: text.split_whitespace().collect(), pos: 0, text, family, out: Vec::new() };
    while p.pos < p.toks.len() {
        p.statement()?;
    }
    Ok(p.out)
}

impl<'a> Parser<'a> {
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
                self.out.push(Expr::Numgen { dreg: NFT_REG_1, modulus });
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

    fn update(&mut self) -> Result<(), ParseError> {
        let set = self.set_ref()?;
        self.expect("{")?;
        let sel = self.selector()?;
        self.expect("}")?;
        self.out.push(sel.load(NFT_REG_1, sel.len()));
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
        let mut sels = vec![self.selector()?];
        while self.optional(".") {
            sels.push(self.selector()?);
        }
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
            let mut unit = 0;
            for s in &sels {
                self.out.push(s.load(register(unit), s.len()));
                unit += s.len().div_ceil(4);
            }
            self.out.push(Expr::Lookup { sreg: NFT_REG_1, set, set_id: None, dreg, invert: negate });
            return Ok(());
        }
        let [sel] = sels.as_slice() else { return Err(self.err(".")) };
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
    fn unsupported_rules_are_errors_not_guesses() {
        assert!(rule(TableFamily::Ip, "tcp flags syn drop").is_err());
        assert!(rule(TableFamily::Ip, "ip6 daddr ::1 drop").is_err());
        assert!(rule(TableFamily::Ip, "ip daddr . ip saddr 1.2.3.4 drop").is_err());
    }
}

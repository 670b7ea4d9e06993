//! Reads back the nft text the model renders: the inverse of the `Display` implementations, for
//! tests only (the encoding fixtures are nft text that `nft --debug=mnl` was run on, and a
//! round-trip test checks that rendering loses nothing). Nothing on a sync path uses it; it
//! exists only with the `parse` feature.

use std::net::IpAddr;

use ipnet::IpNet;
use kproxy_state::{IpFamily, Protocol};

use crate::expr::{CmpOp, CtState, CtStatus, Field, NatKind, Reject, Rule, Stmt, Value, Verdict};
use crate::set::{DataType, Element, Key, MapData, SetDef, SetFlag, SetType};
use crate::table::{Chain, ChainType, Flowtable, Hook, HookPoint, TableFamily, TableRef};
use crate::transaction::Op;

/// Text the parser does not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read {what:?} in {text:?}")]
pub struct ParseError {
    /// The offending token.
    pub what: String,
    /// The whole text.
    pub text: String,
}

struct Tokens<'a> {
    toks: Vec<&'a str>,
    pos: usize,
    text: &'a str,
}

impl<'a> Tokens<'a> {
    fn new(text: &'a str) -> Self {
        Tokens { toks: text.split_whitespace().collect(), pos: 0, text }
    }

    fn err(&self, what: &str) -> ParseError {
        ParseError { what: what.to_owned(), text: self.text.to_owned() }
    }

    fn peek(&self) -> Option<&'a str> {
        self.toks.get(self.pos).copied()
    }

    fn next(&mut self) -> Result<&'a str, ParseError> {
        let t = self.peek().ok_or_else(|| self.err("<end>"))?;
        self.pos += 1;
        Ok(t)
    }

    fn expect(&mut self, want: &str) -> Result<(), ParseError> {
        let t = self.next()?;
        if t == want { Ok(()) } else { Err(self.err(t)) }
    }

    fn optional(&mut self, want: &str) -> bool {
        let hit = self.peek() == Some(want);
        self.pos += usize::from(hit);
        hit
    }

    fn number(&mut self) -> Result<u32, ParseError> {
        let t = self.next()?;
        let v = match t.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => t.parse(),
        };
        v.map_err(|_| self.err(t))
    }

    /// A duration in whole seconds, `Ns` (as kproxy writes them).
    fn seconds(&mut self) -> Result<u32, ParseError> {
        let t = self.next()?;
        t.strip_suffix('s').and_then(|n| n.parse().ok()).ok_or_else(|| self.err(t))
    }

    fn set_ref(&mut self) -> Result<String, ParseError> {
        let t = self.next()?;
        t.strip_prefix('@').map(str::to_owned).ok_or_else(|| self.err(t))
    }

    fn field(&mut self) -> Result<Field, ParseError> {
        let t = self.next()?;
        Ok(match t {
            "ip" | "ip6" => {
                let family = if t == "ip" { IpFamily::V4 } else { IpFamily::V6 };
                match self.next()? {
                    "saddr" => Field::Saddr(family),
                    "daddr" => Field::Daddr(family),
                    other => return Err(self.err(other)),
                }
            }
            "meta" => {
                self.expect("l4proto")?;
                Field::L4Proto
            }
            "ct" => {
                self.expect("original")?;
                let family = match self.next()? {
                    "proto-dst" => return Ok(Field::CtOriginalProtoDst),
                    "ip" => IpFamily::V4,
                    "ip6" => IpFamily::V6,
                    other => return Err(self.err(other)),
                };
                self.expect("daddr")?;
                Field::CtOriginalDaddr(family)
            }
            "th" => {
                self.expect("dport")?;
                Field::ThDport
            }
            "tcp" | "udp" | "sctp" => {
                self.expect("dport")?;
                Field::Dport(protocol(t).ok_or_else(|| self.err(t))?)
            }
            "numgen" => {
                self.expect("random")?;
                self.expect("mod")?;
                let modulus = self.number()?;
                match (modulus, self.optional("offset")) {
                    (1, true) => Field::Constant(self.number()?),
                    (_, true) => return Err(self.err("offset")),
                    (_, false) => Field::Numgen(modulus),
                }
            }
            other => return Err(self.err(other)),
        })
    }

    fn concat(&mut self) -> Result<Vec<Field>, ParseError> {
        let mut fields = vec![self.field()?];
        while self.optional(".") {
            fields.push(self.field()?);
        }
        Ok(fields)
    }
}

fn protocol(s: &str) -> Option<Protocol> {
    match s {
        "tcp" => Some(Protocol::Tcp),
        "udp" => Some(Protocol::Udp),
        "sctp" => Some(Protocol::Sctp),
        _ => None,
    }
}

/// One key or value field.
fn value(text: &str) -> Option<Value> {
    if let Some(hex) = text.strip_prefix("0x") {
        return u32::from_str_radix(hex, 16).ok().map(Value::Int);
    }
    if let Some(p) = protocol(text) {
        return Some(Value::Proto(p));
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(Value::Addr(ip));
    }
    if let Ok(net) = text.parse::<IpNet>() {
        return Some(Value::Prefix(net));
    }
    text.parse::<u16>().ok().map(Value::Port)
}

/// A key: `10.0.0.1 . tcp . 80`.
pub fn key(text: &str) -> Result<Key, ParseError> {
    let err = |w: &str| ParseError { what: w.to_owned(), text: text.to_owned() };
    text.split(" . ").map(|f| value(f.trim()).ok_or_else(|| err(f))).collect::<Result<_, _>>().map(Key)
}

/// A verdict: `goto chain`.
pub fn verdict(text: &str) -> Result<Verdict, ParseError> {
    let mut t = Tokens::new(text);
    let v = verdict_tokens(&mut t)?.ok_or_else(|| t.err(text))?;
    match t.peek() {
        Some(extra) => Err(t.err(extra)),
        None => Ok(v),
    }
}

fn verdict_tokens(t: &mut Tokens<'_>) -> Result<Option<Verdict>, ParseError> {
    let v = match t.peek() {
        Some("accept") => Verdict::Accept,
        Some("drop") => Verdict::Drop,
        Some("return") => Verdict::Return,
        Some(jump @ ("jump" | "goto")) => {
            t.pos += 1;
            let chain = t.peek().ok_or_else(|| t.err("<end>"))?.to_owned();
            if jump == "jump" { Verdict::Jump(chain) } else { Verdict::Goto(chain) }
        }
        _ => return Ok(None),
    };
    t.pos += 1;
    Ok(Some(v))
}

/// A rule body.
pub fn rule(text: &str) -> Result<Rule, ParseError> {
    let mut t = Tokens::new(text);
    let mut stmts = Vec::new();
    while t.peek().is_some() {
        stmts.push(stmt(&mut t)?);
    }
    Ok(Rule(stmts))
}

fn stmt(t: &mut Tokens<'_>) -> Result<Stmt, ParseError> {
    if let Some(v) = verdict_tokens(t)? {
        return Ok(Stmt::Verdict(v));
    }
    let word = t.next()?;
    Ok(match word {
        "ct" if t.peek() == Some("mark") => {
            t.pos += 1;
            if t.optional("set") {
                for want in ["ct", "mark", "or"] {
                    t.expect(want)?;
                }
                return Ok(Stmt::CtMarkOr(t.number()?));
            }
            t.expect("and")?;
            let mask = t.number()?;
            let op = match t.next()? {
                "==" => CmpOp::Eq,
                "!=" => CmpOp::Neq,
                other => return Err(t.err(other)),
            };
            Stmt::CtMarkAnd { mask, op, value: t.number()? }
        }
        "meta" if t.peek() == Some("mark") => {
            t.pos += 1;
            t.expect("set")?;
            let key = t.concat()?;
            t.expect("map")?;
            Stmt::MarkSetMap { key, map: t.set_ref()? }
        }
        "meta" if t.peek() == Some("l4proto") && t.toks.get(t.pos + 1) == Some(&"{") => {
            t.pos += 2;
            let mut protos = Vec::new();
            loop {
                let w = t.next()?;
                let (name, more) = match w.strip_suffix(',') {
                    Some(name) => (name, true),
                    None => (w, false),
                };
                protos.push(protocol(name).ok_or_else(|| t.err(name))?);
                if !more {
                    break;
                }
            }
            t.expect("}")?;
            Stmt::L4ProtoIn(protos)
        }
        "ct" if t.peek() == Some("original") => {
            t.pos -= 1;
            relation(t)?
        }
        "ct" if t.peek() == Some("packets") => {
            t.pos += 1;
            t.expect(">")?;
            let n = t.next()?;
            Stmt::CtPacketsGt(n.parse().map_err(|_| t.err(n))?)
        }
        "counter" => Stmt::Counter,
        "flow" => {
            t.expect("add")?;
            Stmt::FlowAdd(t.set_ref()?)
        }
        "ct" => match (t.next()?, t.next()?) {
            ("state", "new") => Stmt::CtState(CtState::New),
            ("state", "established") => Stmt::CtState(CtState::Established),
            ("state", "related") => Stmt::CtState(CtState::Related),
            ("status", "dnat") => Stmt::CtStatus(CtStatus::Dnat),
            ("status", "snat") => Stmt::CtStatus(CtStatus::Snat),
            (_, other) => return Err(t.err(other)),
        },
        "reject" => {
            if t.optional("with") {
                t.expect("tcp")?;
                t.expect("reset")?;
                Stmt::Reject(Reject::TcpReset)
            } else {
                Stmt::Reject(Reject::PortUnreachable)
            }
        }
        "masquerade" => Stmt::Masquerade { fully_random: t.optional("fully-random") },
        "snat" | "dnat" => {
            let kind = if word == "snat" { NatKind::Snat } else { NatKind::Dnat };
            if let Some(family) = t.peek().and_then(|f| match f {
                "ip" => Some(IpFamily::V4),
                "ip6" => Some(IpFamily::V6),
                _ => None,
            }) {
                t.pos += 1;
                t.expect("to")?;
                let key = t.concat()?;
                t.expect("map")?;
                let map = t.set_ref()?;
                return Ok(Stmt::NatMap { kind, family, key, map });
            }
            t.expect("to")?;
            let target = t.next()?;
            let (addr, port) = match target.strip_prefix('[') {
                Some(rest) => {
                    let (a, p) = rest.split_once("]:").ok_or_else(|| t.err(target))?;
                    (a, Some(p))
                }
                None if target.matches(':').count() == 1 => {
                    let (a, p) = target.split_once(':').ok_or_else(|| t.err(target))?;
                    (a, Some(p))
                }
                None => (target, None),
            };
            let addr: IpAddr = addr.parse().map_err(|_| t.err(addr))?;
            let port = port.map(|p| p.parse::<u16>().map_err(|_| t.err(p))).transpose()?;
            Stmt::Nat { kind, addr, port, fully_random: t.optional("fully-random") }
        }
        "numgen" => {
            t.pos -= 1;
            let Field::Numgen(modulus) = t.field()? else { return Err(t.err("numgen offset")) };
            t.expect("==")?;
            Stmt::NumgenEq { modulus, value: t.number()? }
        }
        "update" => {
            let set = t.set_ref()?;
            t.expect("{")?;
            let key = t.concat()?;
            let timeout = if t.optional("timeout") { Some(t.seconds()?) } else { None };
            t.expect("}")?;
            Stmt::Update { set, key, timeout }
        }
        "mark" if t.optional("set") => {
            t.expect("mark")?;
            let op = t.next()?;
            let v = t.number()?;
            match op {
                "or" => Stmt::MarkOr(v),
                "and" => Stmt::MarkAnd(v),
                other => return Err(t.err(other)),
            }
        }
        "mark" => {
            t.expect("and")?;
            let mask = t.number()?;
            t.expect("==")?;
            Stmt::MarkAndEq { mask, value: t.number()? }
        }
        "iifname" => {
            let op = if t.optional("!=") { CmpOp::Neq } else { CmpOp::Eq };
            let quoted = t.next()?;
            let name = quoted.strip_prefix('"').and_then(|v| v.strip_suffix('"')).ok_or_else(|| t.err(quoted))?;
            Stmt::IifName { op, name: name.to_owned() }
        }
        "fib" => {
            let saddr = match t.next()? {
                "saddr" => true,
                "daddr" => false,
                other => return Err(t.err(other)),
            };
            t.expect("type")?;
            t.expect("local")?;
            Stmt::FibLocal { saddr }
        }
        _ => {
            t.pos -= 1;
            relation(t)?
        }
    })
}

fn relation(t: &mut Tokens<'_>) -> Result<Stmt, ParseError> {
    let key = t.concat()?;
    if t.optional("vmap") {
        return Ok(Stmt::Vmap { key, map: t.set_ref()? });
    }
    let negate = t.optional("!=");
    let next = t.peek().ok_or_else(|| t.err("<end>"))?;
    if next.starts_with('@') {
        return Ok(Stmt::Lookup { key, negate, set: t.set_ref()? });
    }
    let [field] = key.as_slice() else { return Err(t.err(".")) };
    let v = t.next()?;
    let value = value(v).ok_or_else(|| t.err(v))?;
    Ok(Stmt::Cmp { field: *field, op: if negate { CmpOp::Neq } else { CmpOp::Eq }, value })
}

fn table(family: &str, name: &str, line: &str) -> Result<TableRef, ParseError> {
    let family = match family {
        "ip" => TableFamily::Ip,
        "ip6" => TableFamily::Ip6,
        "inet" => TableFamily::Inet,
        other => return Err(ParseError { what: other.to_owned(), text: line.to_owned() }),
    };
    Ok(TableRef { family, name: name.to_owned() })
}

/// The `{ ... }` block of a command, split at `;`.
fn block(line: &str) -> Vec<String> {
    let (Some(start), Some(end)) = (line.find('{'), line.rfind('}')) else { return Vec::new() };
    line[start + 1..end].split(';').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect()
}

fn unquote(s: &str) -> String {
    s.trim().trim_matches('"').to_owned()
}

fn data_types(text: &str, line: &str) -> Result<Vec<DataType>, ParseError> {
    let err = |w: &str| ParseError { what: w.to_owned(), text: line.to_owned() };
    text.split(" . ")
        .map(|t| match t.trim() {
            "ipv4_addr" => Ok(DataType::Ipv4Addr),
            "ipv6_addr" => Ok(DataType::Ipv6Addr),
            "inet_proto" => Ok(DataType::InetProto),
            "inet_service" => Ok(DataType::InetService),
            "mark" => Ok(DataType::Mark),
            "verdict" => Ok(DataType::Verdict),
            other => Err(err(other)),
        })
        .collect()
}

fn fields(text: &str) -> Result<Vec<Field>, ParseError> {
    let mut t = Tokens::new(text);
    let f = t.concat()?;
    match t.peek() {
        Some(extra) => Err(t.err(extra)),
        None => Ok(f),
    }
}

/// One command as [`crate::Transaction::render`] writes it.
pub fn op(line: &str) -> Result<Op, ParseError> {
    let err = |w: &str| ParseError { what: w.to_owned(), text: line.to_owned() };
    let w: Vec<&str> = line.split_whitespace().collect();
    if w.len() < 4 {
        return Err(err(line));
    }
    let t = table(w[2], w[3], line)?;
    let name = || w.get(4).map(|n| (*n).to_owned()).ok_or_else(|| err("<name>"));
    Ok(match (w[0], w[1]) {
        ("add", "table") => {
            let comment = block(line).first().map(|c| unquote(c.trim_start_matches("comment")));
            Op::AddTable { table: t, comment }
        }
        ("delete", "table") => Op::DeleteTable(t),
        ("flush", "table") => Op::FlushTable(t),
        ("add", "chain") => {
            let hook = match block(line).first() {
                None => None,
                Some(h) => {
                    let h: Vec<&str> = h.split_whitespace().collect();
                    let kind = match h.get(1) {
                        Some(&"filter") => ChainType::Filter,
                        Some(&"nat") => ChainType::Nat,
                        _ => return Err(err("chain type")),
                    };
                    let hook = match h.get(3) {
                        Some(&"prerouting") => HookPoint::Prerouting,
                        Some(&"input") => HookPoint::Input,
                        Some(&"forward") => HookPoint::Forward,
                        Some(&"output") => HookPoint::Output,
                        Some(&"postrouting") => HookPoint::Postrouting,
                        _ => return Err(err("hook")),
                    };
                    let priority = h.get(5).and_then(|p| p.parse().ok()).ok_or_else(|| err("priority"))?;
                    Some(Hook { kind, hook, priority })
                }
            };
            Op::AddChain(t, Chain { name: name()?, hook })
        }
        ("flush", "chain") => Op::FlushChain(t, name()?),
        ("delete", "chain") => Op::DeleteChain(t, name()?),
        ("add", "rule") => {
            let prefix = format!("add rule {} {} {} ", w[2], w[3], name()?);
            let text = line.get(prefix.len()..).unwrap_or_default();
            let (text, comment) = match text.rsplit_once(" comment \"") {
                Some((r, c)) if c.ends_with('"') => (r, Some(c.trim_end_matches('"').to_owned())),
                _ => (text, None),
            };
            Op::AddRule { table: t, chain: name()?, rule: rule(text)?, comment }
        }
        ("add", "set" | "map") => {
            let mut def = SetDef::of(name()?, Vec::new());
            for item in block(line) {
                if item == "counter" {
                    def.counter = true;
                    continue;
                }
                let (k, v) = item.split_once(' ').ok_or_else(|| err(&item))?;
                match k {
                    "type" => {
                        def.ty = match v.split_once(" : ") {
                            Some((key, data)) => {
                                let data = data_types(data, line)?.pop();
                                SetType::Named { key: data_types(key, line)?, data }
                            }
                            None => SetType::Named { key: data_types(v, line)?, data: None },
                        }
                    }
                    "typeof" => {
                        def.ty = match v.split_once(" : ") {
                            Some((key, data)) => SetType::Typeof { key: fields(key)?, data: Some(fields(data)?) },
                            None => SetType::Typeof { key: fields(v)?, data: None },
                        }
                    }
                    "flags" => {
                        def.flags = v
                            .split(',')
                            .map(|f| match f.trim() {
                                "interval" => Ok(SetFlag::Interval),
                                "dynamic" => Ok(SetFlag::Dynamic),
                                "timeout" => Ok(SetFlag::Timeout),
                                other => Err(err(other)),
                            })
                            .collect::<Result<_, _>>()?
                    }
                    "timeout" => def.timeout = Some(v.trim_end_matches('s').parse().map_err(|_| err(v))?),
                    "size" => def.size = Some(v.parse().map_err(|_| err(v))?),
                    "comment" => def.comment = Some(unquote(v)),
                    other => return Err(err(other)),
                }
            }
            Op::AddSet(t, def)
        }
        ("flush" | "delete", kw @ ("set" | "map")) => {
            let (table, name, is_map) = (t, name()?, kw == "map");
            if w[0] == "flush" { Op::FlushSet { table, name, is_map } } else { Op::DeleteSet { table, name, is_map } }
        }
        (verb @ ("add" | "delete"), "element") => {
            let (start, end) = (line.find('{').ok_or_else(|| err("{"))?, line.rfind('}').ok_or_else(|| err("}"))?);
            let inner = line[start + 1..end].trim();
            let (k, v) = match inner.split_once(" : ") {
                Some((k, v)) => (k, Some(v)),
                None => (inner, None),
            };
            let value = match v {
                None => None,
                Some(v) if v.starts_with("0x") => Some(MapData::Value(key(v)?)),
                Some(v) if v.starts_with("goto") || v.starts_with("jump") || !v.contains(['.', ':']) => {
                    Some(MapData::Verdict(verdict(v)?))
                }
                Some(v) => Some(MapData::Value(key(v)?)),
            };
            let e = Element { set: name()?, key: key(k)?, value };
            if verb == "add" { Op::AddElement(t, e) } else { Op::DeleteElement(t, e) }
        }
        ("add", "flowtable") => {
            let mut ft = Flowtable { name: name()?, priority: 0, devices: vec![], counter: false };
            for item in block(line) {
                let words: Vec<&str> = item.split_whitespace().collect();
                match words.as_slice() {
                    ["hook", "ingress", "priority", p] => ft.priority = p.parse().map_err(|_| err(p))?,
                    ["devices", "=", ..] => ft.devices = devices(&item),
                    ["counter"] => ft.counter = true,
                    _ => return Err(err(&item)),
                }
            }
            Op::AddFlowtable(t, ft)
        }
        ("delete", "flowtable") => {
            let item = block(line).into_iter().next().ok_or_else(|| err("devices"))?;
            Op::DeleteFlowtableDevices { table: t, name: name()?, devices: devices(&item) }
        }
        _ => return Err(err(line)),
    })
}

/// `devices = { "a", "b" }`.
fn devices(item: &str) -> Vec<String> {
    let inner = item.split_once('{').map_or("", |(_, rest)| rest.trim_end_matches('}'));
    inner.split(',').map(unquote).filter(|d| !d.is_empty()).collect()
}

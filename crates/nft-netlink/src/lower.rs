//! Lowers the typed nf_tables model (`kproxy-nft-model`) to what the kernel takes: rules to
//! expressions with registers allocated, set declarations to key types and `typeof` user data,
//! element keys and map data to bytes.
//!
//! Register allocation and the shape of each match (e.g. a byte-aligned prefix is a shorter
//! payload load, not a bitwise mask) follow what `nft` 1.0.x generates for the same statement's
//! text, so the kernel holds the same ruleset whichever way it was loaded (`tests/encoding.rs`
//! compares the bytes with `nft --debug=mnl`). A statement outside what is lowered here is an
//! error naming it, never a guess.

use std::net::IpAddr;

use kproxy_nft_model::{
    CmpOp, Field, Key, MapData as ModelData, NatKind as ModelNat, Reject, Rule, Stmt, TableFamily, Value,
    Verdict as ModelVerdict,
};
use kproxy_state::{IpFamily, Protocol};

use crate::expr::{Expr, NatKind, PayloadBase, Verdict};
use crate::sys::*;

/// A statement, key or declaration that is outside what kproxy lowers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot encode {what}")]
pub struct LowerError {
    /// What.
    pub what: String,
}

impl LowerError {
    pub(crate) fn new(what: impl Into<String>) -> Self {
        LowerError { what: what.into() }
    }
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

impl DataType {
    /// The datatype of a model's named type.
    pub fn of(t: kproxy_nft_model::DataType) -> Result<Self, LowerError> {
        use kproxy_nft_model::DataType as Model;
        Ok(match t {
            Model::Ipv4Addr => DataType::Ipv4,
            Model::Ipv6Addr => DataType::Ipv6,
            Model::InetProto => DataType::Proto,
            Model::InetService => DataType::Service,
            Model::Mark | Model::Verdict => return Err(LowerError::new(format!("a key of type {t}"))),
        })
    }
}

/// A set key type: one datatype or a concatenation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyType(pub Vec<DataType>);

impl KeyType {
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

/// What a field is as a `typeof` expression.
fn typeof_expr(field: Field) -> Result<TypeofExpr, LowerError> {
    Ok(match field {
        // Template indexes of saddr / daddr in nft's ip and ip6 header descriptions.
        Field::Saddr(IpFamily::V4) => TypeofExpr::Payload { desc: PROTO_DESC_IP, field: 11, dtype: DataType::Ipv4 },
        Field::Daddr(IpFamily::V4) => TypeofExpr::Payload { desc: PROTO_DESC_IP, field: 12, dtype: DataType::Ipv4 },
        Field::Saddr(IpFamily::V6) => TypeofExpr::Payload { desc: PROTO_DESC_IP6, field: 8, dtype: DataType::Ipv6 },
        Field::Daddr(IpFamily::V6) => TypeofExpr::Payload { desc: PROTO_DESC_IP6, field: 9, dtype: DataType::Ipv6 },
        Field::L4Proto => TypeofExpr::Meta { key: NFT_META_L4PROTO },
        Field::ThDport => TypeofExpr::Payload { desc: PROTO_DESC_TH, field: 2, dtype: DataType::Service },
        Field::Dport(p) => {
            let desc = match p {
                Protocol::Tcp => PROTO_DESC_TCP,
                Protocol::Udp => PROTO_DESC_UDP,
                Protocol::Sctp => PROTO_DESC_SCTP,
            };
            TypeofExpr::Payload { desc, field: 2, dtype: DataType::Service }
        }
        Field::Numgen(modulus) => TypeofExpr::Numgen { modulus },
        Field::Constant(_) => return Err(LowerError::new("a constant in a typeof declaration")),
        Field::CtOriginalDaddr(_) | Field::CtOriginalProtoDst => {
            return Err(LowerError::new(format!("`{field}` in a typeof declaration")));
        }
    })
}

/// A `typeof` declaration of a set key or map data: a concatenation of expressions (a single
/// expression is outside the supported subset; nft records it differently).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Typeof(pub Vec<TypeofExpr>);

impl Typeof {
    /// The declaration of `fields` in a table of `family`; `None` for a field outside the
    /// supported subset, or a single field (nft records that differently).
    pub fn new(fields: &[Field]) -> Result<Self, LowerError> {
        let exprs = fields.iter().map(|f| typeof_expr(*f)).collect::<Result<Vec<_>, _>>()?;
        let t = Typeof(exprs);
        if t.0.len() < 2 || concat_udata(&t.0).len() > usize::from(u8::MAX) {
            return Err(LowerError::new("a typeof declaration of fewer than two fields"));
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
    let put = put_tlv;
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

/// One user data attribute: kind, length, value.
pub fn put_tlv(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    out.push(kind);
    out.push(value.len() as u8);
    out.extend_from_slice(value);
}

/// nft's user data for a single expression: `TYPEOF_EXPR` = its `expr_types` id and
/// `TYPEOF_DATA` = its own attributes.
pub fn single_udata(e: TypeofExpr) -> Vec<u8> {
    let mut own = Vec::new();
    for (kind, v) in e.udata() {
        put_tlv(&mut own, kind, &v.to_ne_bytes());
    }
    let mut out = Vec::new();
    put_tlv(&mut out, 0, &e.etype().to_ne_bytes());
    put_tlv(&mut out, 1, &own);
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

fn value_bytes(v: &Value) -> Result<Vec<u8>, LowerError> {
    Ok(match *v {
        Value::Addr(ip) => addr_bytes(ip),
        Value::Proto(p) => vec![proto_number(p)],
        Value::Port(p) => p.to_be_bytes().to_vec(),
        // The 32-bit host-endian value numgen leaves in its register.
        Value::Int(i) => i.to_ne_bytes().to_vec(),
        Value::Prefix(n) => return Err(LowerError::new(format!("the range {n} inside a key"))),
    })
}

/// The bytes of an element key; a prefix as the whole key is a range of an interval set, as the
/// last field of a concatenation a range of a set of concatenated ranges.
pub fn element_key(key: &Key) -> Result<ElementKey, LowerError> {
    let values = key.values();
    if let [Value::Prefix(n)] = values {
        let start = masked(&addr_bytes(n.network()), u32::from(n.prefix_len()));
        let len = u32::from(n.prefix_len());
        return Ok(ElementKey { interval_end: Some(range_end(&start, len)), start, key_end: None });
    }
    let concat = values.len() > 1;
    let mut bytes = Vec::new();
    let mut key_end = None;
    for (i, v) in values.iter().enumerate() {
        if let (Value::Prefix(n), true) = (v, concat && i + 1 == values.len()) {
            let len = u32::from(n.prefix_len());
            let first = masked(&addr_bytes(n.network()), len);
            let last: Vec<u8> = first.iter().zip(prefix_mask(first.len(), len)).map(|(a, m)| a | !m).collect();
            let mut end = bytes.clone();
            end.extend_from_slice(&last);
            end.resize(end.len().div_ceil(4) * 4, 0);
            bytes.extend_from_slice(&first);
            bytes.resize(bytes.len().div_ceil(4) * 4, 0);
            key_end = Some(end);
            continue;
        }
        bytes.extend_from_slice(&value_bytes(v)?);
        if concat {
            bytes.resize(bytes.len().div_ceil(4) * 4, 0);
        }
    }
    Ok(ElementKey { start: bytes, interval_end: None, key_end })
}

/// The data of a map element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapData {
    /// A verdict (`goto service-...`).
    Verdict(Verdict),
    /// A value (`198.18.16.10 . 8080`), concatenation fields padded to 4 bytes like keys.
    Value(Vec<u8>),
}

/// Lowers map data.
pub fn map_data(data: &ModelData) -> Result<MapData, LowerError> {
    match data {
        ModelData::Verdict(v) => Ok(MapData::Verdict(verdict(v))),
        ModelData::Value(key) => match element_key(key)? {
            ElementKey { start, interval_end: None, key_end: None } => Ok(MapData::Value(start)),
            _ => Err(LowerError::new(format!("the range in map data {key}"))),
        },
    }
}

/// A verdict.
pub fn verdict(v: &ModelVerdict) -> Verdict {
    match v {
        ModelVerdict::Accept => Verdict::Accept,
        ModelVerdict::Drop => Verdict::Drop,
        ModelVerdict::Return => Verdict::Return,
        ModelVerdict::Jump(c) => Verdict::Jump(c.clone()),
        ModelVerdict::Goto(c) => Verdict::Goto(c.clone()),
    }
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

fn proto_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

/// What a selector loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sel {
    Addr {
        offset: u32,
        len: u32,
    },
    L4Proto,
    Dport,
    IifName,
    Fib {
        saddr: bool,
    },
    Mark,
    /// A key of the conntrack entry's original tuple.
    CtOriginal {
        key: u32,
        len: u32,
    },
}

impl Sel {
    fn len(self) -> u32 {
        match self {
            Sel::Addr { len, .. } => len,
            Sel::L4Proto => 1,
            Sel::Dport => 2,
            Sel::IifName => 16,
            Sel::Fib { .. } | Sel::Mark => 4,
            Sel::CtOriginal { len, .. } => len,
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
            Sel::CtOriginal { key, .. } => Expr::CtDir { key, dir: IP_CT_DIR_ORIGINAL, dreg },
        }
    }
}

impl Sel {
    fn of(field: Field) -> Result<Self, LowerError> {
        Ok(match field {
            Field::Saddr(IpFamily::V4) => Sel::Addr { offset: 12, len: 4 },
            Field::Daddr(IpFamily::V4) => Sel::Addr { offset: 16, len: 4 },
            Field::Saddr(IpFamily::V6) => Sel::Addr { offset: 8, len: 16 },
            Field::Daddr(IpFamily::V6) => Sel::Addr { offset: 24, len: 16 },
            Field::L4Proto => Sel::L4Proto,
            Field::ThDport => Sel::Dport,
            Field::CtOriginalDaddr(IpFamily::V4) => Sel::CtOriginal { key: NFT_CT_DST_IP, len: 4 },
            Field::CtOriginalDaddr(IpFamily::V6) => Sel::CtOriginal { key: NFT_CT_DST_IP6, len: 16 },
            Field::CtOriginalProtoDst => Sel::CtOriginal { key: NFT_CT_PROTO_DST, len: 2 },
            Field::Dport(_) | Field::Numgen(_) | Field::Constant(_) => {
                return Err(LowerError::new(format!("`{field}` as a match")));
            }
        })
    }
}

/// nft numbers registers in 32-bit units; a field starting on a 128-bit boundary is named by
/// its 128-bit register (`NFT_REG_1`...), the others by `NFT_REG32_xx`.
fn register(unit: u32) -> u32 {
    if unit.is_multiple_of(4) { NFT_REG_1 + unit / 4 } else { NFT_REG32_00 + unit }
}

/// What lowering a rule needs to know of the sets it uses: the protocol match a data map's
/// declaration implies (`None`: the map is not declared in the batch), and whether a set holds
/// concatenated ranges (its keys' host-order fields are converted).
pub trait SetInfo {
    /// For a data map read by `dnat ... map`: `None` when unknown, else the protocol match its
    /// data type implies ([`Typeof::l4_dependency`]).
    fn map_dependency(&self, map: &str) -> Option<Option<u8>>;
    /// Whether `set` holds concatenated ranges.
    fn holds_ranges(&self, set: &str) -> bool;
}

/// Sets nothing is known of.
#[derive(Debug, Clone, Copy)]
pub struct NoSets;

impl SetInfo for NoSets {
    fn map_dependency(&self, _: &str) -> Option<Option<u8>> {
        None
    }
    fn holds_ranges(&self, _: &str) -> bool {
        false
    }
}

/// The name every anonymous set is created with: the kernel fills in a number, and rules find
/// the set by the id it had in the batch.
pub const ANON_SET_NAME: &str = "__set%d";

/// An anonymous constant set a rule looks constants up in (`meta l4proto { tcp, udp }`), as nft
/// creates it in the same batch just before the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnonSet {
    /// What the looked-up value is, as recorded in the set's user data.
    pub key: TypeofExpr,
    /// Byte order of the key (`BYTEORDER_HOST_ENDIAN` = 1 for `meta` keys).
    pub byteorder: u32,
    /// Each element's key bytes, in the order written.
    pub elements: Vec<Vec<u8>>,
}

impl AnonSet {
    /// The set's user data: key byte order, and the key's `typeof` expression.
    pub fn udata(&self) -> Vec<u8> {
        let mut u = Vec::new();
        put_tlv(&mut u, NFTNL_UDATA_SET_KEYBYTEORDER, &self.byteorder.to_ne_bytes());
        put_tlv(&mut u, NFTNL_UDATA_SET_KEY_TYPEOF, &single_udata(self.key));
        u
    }
}

/// A rule lowered: its expressions, and the anonymous sets its lookups of [`ANON_SET_NAME`]
/// refer to, in the order of those lookups.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Lowered {
    /// The expressions.
    pub exprs: Vec<Expr>,
    /// Anonymous sets to create before the rule.
    pub anon_sets: Vec<AnonSet>,
}

/// Lowers a rule of a table of `family` to expressions.
pub fn rule(family: TableFamily, rule: &Rule, sets: &dyn SetInfo) -> Result<Lowered, LowerError> {
    let mut l = Lowering {
        table: family,
        nfproto_match: None,
        out: Vec::new(),
        sets,
        l4protos: Vec::new(),
        anon_sets: Vec::new(),
    };
    for stmt in rule.stmts() {
        l.stmt(stmt)?;
    }
    Ok(Lowered { exprs: l.out, anon_sets: l.anon_sets })
}

struct Lowering<'a> {
    table: TableFamily,
    /// In an `inet` table, the address family a `meta nfproto` match of the rule established
    /// (nft adds one before the first statement that reads an address).
    nfproto_match: Option<IpFamily>,
    out: Vec<Expr>,
    anon_sets: Vec<AnonSet>,
    sets: &'a dyn SetInfo,
    /// The protocols of the rule's `meta l4proto P` matches so far: they satisfy (or, if they
    /// differ, contradict) the protocol dependency of a later `dnat ... map`.
    l4protos: Vec<u8>,
}

fn cmp_op(op: CmpOp) -> u32 {
    match op {
        CmpOp::Eq => NFT_CMP_EQ,
        CmpOp::Neq => NFT_CMP_NEQ,
    }
}

impl Lowering<'_> {
    /// The address family of the rule's packets: the table's, or in an `inet` table the one
    /// the rule matched.
    fn family(&self) -> Result<IpFamily, LowerError> {
        self.table.ip_family().or(self.nfproto_match).ok_or_else(|| {
            LowerError::new("a statement of one address family in an inet table, before any address match")
        })
    }

    fn nfproto(&self) -> Result<u8, LowerError> {
        Ok(nfproto_of(self.family()?))
    }

    /// In an `inet` table, the `meta nfproto` match nft puts before the first statement that
    /// reads an address of a family.
    fn nfproto_dependency(&mut self, stmt: &Stmt) {
        if self.table != TableFamily::Inet || self.nfproto_match.is_some() {
            return;
        }
        if let Some(family) = address_family(stmt) {
            self.out.push(Expr::Meta { key: NFT_META_NFPROTO, dreg: NFT_REG_1 });
            self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_EQ, data: vec![nfproto_of(family)] });
            self.nfproto_match = Some(family);
        }
    }

    fn check_family(&self, ip: IpAddr) -> Result<(), LowerError> {
        match (self.family()?, ip) {
            (IpFamily::V4, IpAddr::V4(_)) | (IpFamily::V6, IpAddr::V6(_)) => Ok(()),
            _ => Err(LowerError::new(format!("the address {ip} in a table of the other family"))),
        }
    }

    fn field(&self, field: Field) -> Result<Sel, LowerError> {
        if let Field::Saddr(f) | Field::Daddr(f) | Field::CtOriginalDaddr(f) = field
            && f != self.family()?
        {
            return Err(LowerError::new(format!("`{field}` in a table of the other family")));
        }
        Sel::of(field)
    }

    /// `ct KEY BIT`: the bit is set.
    fn ct_bit(&mut self, key: u32, bit: u32) {
        self.out.push(Expr::Ct { key, dreg: NFT_REG_1 });
        self.out.push(Expr::Bitwise {
            reg: NFT_REG_1,
            mask: bit.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
            explicit_op: false,
        });
        self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_NEQ, data: vec![0; 4] });
    }

    fn stmt(&mut self, stmt: &Stmt) -> Result<(), LowerError> {
        self.nfproto_dependency(stmt);
        match stmt {
            Stmt::Cmp { field, op, value } => self.cmp(*field, *op, value)?,
            Stmt::IifName { op, name } => {
                let data = match name.strip_suffix('*') {
                    Some(prefix) => prefix.as_bytes().to_vec(),
                    None => {
                        let mut d = name.as_bytes().to_vec();
                        d.resize(16, 0);
                        d
                    }
                };
                if data.len() > 16 {
                    return Err(LowerError::new(format!("the interface name {name:?}")));
                }
                self.out.push(Sel::IifName.load(NFT_REG_1, 16));
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: cmp_op(*op), data });
            }
            Stmt::FibLocal { saddr } => {
                // RTN_LOCAL.
                self.out.push(Sel::Fib { saddr: *saddr }.load(NFT_REG_1, 4));
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_EQ, data: 2u32.to_ne_bytes().to_vec() });
            }
            Stmt::CtState(s) => self.ct_bit(NFT_CT_STATE, s.bit()),
            Stmt::CtStatus(s) => self.ct_bit(NFT_CT_STATUS, s.bit()),
            Stmt::MarkAndEq { mask, value } => {
                self.out.push(Sel::Mark.load(NFT_REG_1, 4));
                self.out.push(Expr::Bitwise {
                    reg: NFT_REG_1,
                    mask: mask.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                    explicit_op: true,
                });
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_EQ, data: value.to_ne_bytes().to_vec() });
            }
            Stmt::MarkOr(bits) => self.mark_set(!bits, *bits),
            Stmt::MarkAnd(mask) => self.mark_set(*mask, 0),
            Stmt::NumgenEq { modulus, value } => {
                self.out.push(Expr::Numgen { dreg: NFT_REG_1, modulus: *modulus, offset: 0 });
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_EQ, data: value.to_ne_bytes().to_vec() });
            }
            Stmt::Lookup { key, negate, set } => {
                let ranges = key.len() > 1 && self.sets.holds_ranges(set);
                self.load_key(key, ranges)?;
                self.out.push(Expr::Lookup {
                    sreg: NFT_REG_1,
                    set: set.clone(),
                    set_id: None,
                    dreg: None,
                    invert: *negate,
                });
            }
            Stmt::Vmap { key, map } => {
                self.load_key(key, false)?;
                self.out.push(Expr::Lookup {
                    sreg: NFT_REG_1,
                    set: map.clone(),
                    set_id: None,
                    dreg: Some(NFT_REG_VERDICT),
                    invert: false,
                });
            }
            Stmt::Update { set, key, timeout } => {
                self.load_key(key, false)?;
                let timeout_ms = timeout.map(|t| u64::from(t) * 1000);
                self.out.push(Expr::DynsetUpdate { set: set.clone(), set_id: None, sreg: NFT_REG_1, timeout_ms });
            }
            Stmt::Nat { kind, addr, port, fully_random } => {
                self.check_family(*addr)?;
                self.out.push(Expr::Immediate { dreg: NFT_REG_1, data: addr_bytes(*addr) });
                let mut flags = 0;
                let proto_reg = port.map(|p| {
                    self.out.push(Expr::Immediate { dreg: 2, data: p.to_be_bytes().to_vec() });
                    flags |= NF_NAT_RANGE_PROTO_SPECIFIED;
                    2
                });
                if *fully_random {
                    flags |= NF_NAT_RANGE_PROTO_RANDOM_FULLY;
                }
                let family = self.nfproto()?;
                self.out.push(Expr::Nat { kind: nat_kind(*kind), family, addr_reg: NFT_REG_1, proto_reg, flags });
            }
            Stmt::NatMap { kind, family, key, map } => {
                if *family != self.family()? {
                    return Err(LowerError::new("a nat map of the other family"));
                }
                self.nat_map(*kind, key, map)?;
            }
            Stmt::Masquerade { fully_random } => {
                let flags = if *fully_random { NF_NAT_RANGE_PROTO_RANDOM_FULLY } else { 0 };
                self.out.push(Expr::Masq { flags });
            }
            Stmt::Reject(Reject::TcpReset) => self.out.push(Expr::Reject { kind: 1, code: 0 }),
            Stmt::Reject(Reject::PortUnreachable) => {
                // ICMP port unreachable / ICMPv6 port unreachable.
                let code = if self.family()? == IpFamily::V4 { 3 } else { 4 };
                self.out.push(Expr::Reject { kind: 0, code });
            }
            Stmt::Verdict(v) => self.out.push(Expr::Verdict(verdict(v))),
            Stmt::CtPacketsGt(n) => {
                // The host-order counter is compared in network order, as nft does for `>`.
                self.out.push(Expr::Ct { key: NFT_CT_PKTS, dreg: NFT_REG_1 });
                self.out.push(Expr::ByteorderHton { reg: NFT_REG_1, len: 8, size: 8 });
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_GT, data: n.to_be_bytes().to_vec() });
            }
            Stmt::Counter => self.out.push(Expr::Counter),
            Stmt::FlowAdd(flowtable) => self.out.push(Expr::FlowOffload { flowtable: flowtable.clone() }),
            Stmt::L4ProtoIn(protos) => {
                self.out.push(Sel::L4Proto.load(NFT_REG_1, 1));
                self.out.push(Expr::Lookup {
                    sreg: NFT_REG_1,
                    set: ANON_SET_NAME.to_owned(),
                    set_id: None,
                    dreg: None,
                    invert: false,
                });
                self.anon_sets.push(AnonSet {
                    key: TypeofExpr::Meta { key: NFT_META_L4PROTO },
                    byteorder: 1,
                    elements: protos.iter().map(|p| vec![proto_number(*p)]).collect(),
                });
            }
            Stmt::CtMarkAnd { mask, op, value } => {
                self.out.push(Expr::Ct { key: NFT_CT_MARK, dreg: NFT_REG_1 });
                self.out.push(Expr::Bitwise {
                    reg: NFT_REG_1,
                    mask: mask.to_ne_bytes().to_vec(),
                    xor: vec![0; 4],
                    explicit_op: true,
                });
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: cmp_op(*op), data: value.to_ne_bytes().to_vec() });
            }
            Stmt::CtMarkOr(bits) => {
                self.out.push(Expr::Ct { key: NFT_CT_MARK, dreg: NFT_REG_1 });
                self.out.push(Expr::Bitwise {
                    reg: NFT_REG_1,
                    mask: (!bits).to_ne_bytes().to_vec(),
                    xor: bits.to_ne_bytes().to_vec(),
                    explicit_op: true,
                });
                self.out.push(Expr::CtSet { key: NFT_CT_MARK, sreg: NFT_REG_1 });
            }
            Stmt::MarkSetMap { key, map } => {
                self.load_key(key, false)?;
                self.out.push(Expr::Lookup {
                    sreg: NFT_REG_1,
                    set: map.clone(),
                    set_id: None,
                    dreg: Some(NFT_REG_1),
                    invert: false,
                });
                self.out.push(Expr::MetaSet { key: NFT_META_MARK, sreg: NFT_REG_1 });
            }
        }
        Ok(())
    }

    fn mark_set(&mut self, mask: u32, xor: u32) {
        self.out.push(Sel::Mark.load(NFT_REG_1, 4));
        self.out.push(Expr::Bitwise {
            reg: NFT_REG_1,
            mask: mask.to_ne_bytes().to_vec(),
            xor: xor.to_ne_bytes().to_vec(),
            explicit_op: true,
        });
        self.out.push(Expr::MetaSet { key: NFT_META_MARK, sreg: NFT_REG_1 });
    }

    /// `dnat ip to KEY map @m`: the concatenated key looked up in a map whose data is
    /// `addr . port`, so the address lands in register 1 and the port in the 32-bit register
    /// after it. nft sends no nat flags for this form (the kernel derives them).
    fn nat_map(&mut self, kind: ModelNat, key: &[Field], map: &str) -> Result<(), LowerError> {
        // An earlier `meta l4proto P` match of the rule is the dependency the map's data
        // implies: nft 1.0.6 adds nothing then (and refuses a different P). So with an explicit
        // match the encoding is the same whatever the map's declaration, and such a rule needs
        // no declaration in the batch. Without one, nft adds the match itself, but only
        // regularly as the rule's first statement: after a prefix match such as
        // `ip daddr 198.18.128.0/17` it adds none at all, so that is refused.
        match (self.sets.map_dependency(map), self.l4protos.as_slice()) {
            (Some(Some(proto)), explicit) if explicit.iter().any(|&p| p != proto) => {
                return Err(LowerError::new(format!("a meta l4proto match that contradicts the data of @{map}")));
            }
            (Some(Some(_)), []) if !self.out.is_empty() => {
                return Err(LowerError::new("a dnat map with an implicit protocol dependency after other statements"));
            }
            (Some(Some(proto)), []) => {
                self.out.push(Expr::Meta { key: NFT_META_L4PROTO, dreg: NFT_REG_1 });
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_EQ, data: vec![proto] });
            }
            (None, []) => return Err(LowerError::new(format!("@{map}: a map not declared in the batch"))),
            _ => {}
        }
        self.load_key(key, false)?;
        self.out.push(Expr::Lookup {
            sreg: NFT_REG_1,
            set: map.to_owned(),
            set_id: None,
            dreg: Some(NFT_REG_1),
            invert: false,
        });
        let addr_units = if self.family()? == IpFamily::V4 { 1 } else { 4 };
        let family = self.nfproto()?;
        self.out.push(Expr::Nat {
            kind: nat_kind(kind),
            family,
            addr_reg: NFT_REG_1,
            proto_reg: Some(register(addr_units)),
            flags: 0,
        });
        Ok(())
    }

    /// Loads a key into consecutive registers from register 1 on, as nft does; for a set of
    /// concatenated ranges (`ranges`) nft converts the host-order fields (`meta l4proto`) to
    /// network order after loading them.
    fn load_key(&mut self, key: &[Field], ranges: bool) -> Result<(), LowerError> {
        let mut unit = 0;
        for field in key {
            let numgen = match *field {
                Field::Numgen(modulus) => Some((modulus, 0)),
                Field::Constant(c) => Some((1, c)),
                _ => None,
            };
            if let Some((modulus, offset)) = numgen {
                self.out.push(Expr::Numgen { dreg: register(unit), modulus, offset });
                unit += 1;
                continue;
            }
            let s = self.field(*field)?;
            self.out.push(s.load(register(unit), s.len()));
            if ranges && s == Sel::L4Proto {
                self.out.push(Expr::ByteorderHton { reg: register(unit), len: 1, size: 2 });
            }
            unit += s.len().div_ceil(4);
        }
        Ok(())
    }

    fn cmp(&mut self, field: Field, op: CmpOp, value: &Value) -> Result<(), LowerError> {
        let sel = self.field(field)?;
        let op_code = cmp_op(op);
        match (sel, value) {
            (Sel::Addr { len, .. }, Value::Addr(ip)) => {
                self.check_family(*ip)?;
                self.out.push(sel.load(NFT_REG_1, len));
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: op_code, data: addr_bytes(*ip) });
            }
            (Sel::Addr { len, .. }, Value::Prefix(net)) => {
                self.check_family(net.addr())?;
                let bytes = addr_bytes(net.addr());
                let prefix = u32::from(net.prefix_len());
                if prefix == len * 8 {
                    self.out.push(sel.load(NFT_REG_1, len));
                    self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: op_code, data: bytes });
                } else if prefix % 8 == 0 && prefix > 0 {
                    let n = (prefix / 8) as usize;
                    self.out.push(sel.load(NFT_REG_1, n as u32));
                    self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: op_code, data: bytes[..n].to_vec() });
                } else {
                    let mask = prefix_mask(bytes.len(), prefix);
                    self.out.push(sel.load(NFT_REG_1, len));
                    self.out.push(Expr::Bitwise {
                        reg: NFT_REG_1,
                        mask,
                        xor: vec![0; bytes.len()],
                        explicit_op: false,
                    });
                    self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: op_code, data: masked(&bytes, prefix) });
                }
            }
            (Sel::L4Proto, Value::Proto(p)) => {
                let p = proto_number(*p);
                if op == CmpOp::Eq {
                    self.l4protos.push(p);
                }
                self.out.push(sel.load(NFT_REG_1, 1));
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: op_code, data: vec![p] });
            }
            (Sel::Dport, Value::Port(p)) => {
                self.out.push(sel.load(NFT_REG_1, 2));
                self.out.push(Expr::Cmp { sreg: NFT_REG_1, op: op_code, data: p.to_be_bytes().to_vec() });
            }
            _ => return Err(LowerError::new(format!("the match `{field} {value}`"))),
        }
        Ok(())
    }
}

fn nfproto_of(family: IpFamily) -> u8 {
    match family {
        IpFamily::V4 => NFPROTO_IPV4,
        IpFamily::V6 => NFPROTO_IPV6,
    }
}

/// The address family whose header a statement reads, if any.
fn address_family(stmt: &Stmt) -> Option<IpFamily> {
    let fields: &[Field] = match stmt {
        Stmt::Cmp { field, .. } => std::slice::from_ref(field),
        Stmt::Lookup { key, .. }
        | Stmt::Vmap { key, .. }
        | Stmt::Update { key, .. }
        | Stmt::NatMap { key, .. }
        | Stmt::MarkSetMap { key, .. } => key,
        _ => &[],
    };
    fields.iter().find_map(|f| match f {
        Field::Saddr(family) | Field::Daddr(family) | Field::CtOriginalDaddr(family) => Some(*family),
        _ => None,
    })
}

fn nat_kind(k: ModelNat) -> NatKind {
    match k {
        ModelNat::Snat => NatKind::Snat,
        ModelNat::Dnat => NatKind::Dnat,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kproxy_nft_model::parse;

    use super::*;

    fn fields(text: &str) -> Vec<Field> {
        match parse::rule(&format!("{text} @s")).unwrap().0.pop() {
            Some(Stmt::Lookup { key, .. }) => key,
            other => panic!("{other:?}"),
        }
    }

    fn key(text: &str) -> Key {
        parse::key(text).unwrap()
    }

    /// Maps known to the batch: `dep(map)` as [`SetInfo::map_dependency`].
    struct Maps<F>(F);

    impl<F: Fn(&str) -> Option<Option<u8>>> SetInfo for Maps<F> {
        fn map_dependency(&self, map: &str) -> Option<Option<u8>> {
            (self.0)(map)
        }
        fn holds_ranges(&self, _: &str) -> bool {
            false
        }
    }

    fn lower(family: IpFamily, text: &str, maps: impl Fn(&str) -> Option<Option<u8>>) -> Result<Vec<Expr>, LowerError> {
        rule(family.into(), &parse::rule(text).unwrap(), &Maps(maps)).map(|l| l.exprs)
    }

    #[test]
    fn concat_key_types_pack_six_bits_per_field() {
        let k = KeyType(vec![DataType::Ipv4, DataType::Proto, DataType::Service]);
        assert_eq!((k.id(), k.byte_len()), (0x730d, 12));
        let k = KeyType(vec![DataType::Ipv6, DataType::Ipv6]);
        assert_eq!((k.id(), k.byte_len()), ((8 << 6) | 8, 32));
        assert_eq!(KeyType(vec![DataType::Ipv4]).byte_len(), 4);
    }

    #[test]
    fn element_keys_pad_concat_fields_and_compute_range_ends() {
        let k = element_key(&key("10.0.0.1 . tcp . 80")).unwrap();
        assert_eq!(k.start, vec![10, 0, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0]);
        let k = element_key(&key("198.18.16.0/20")).unwrap();
        assert_eq!(k.start, vec![198, 18, 16, 0]);
        assert_eq!(k.interval_end, Some(Some(vec![198, 18, 32, 0])));
        assert_eq!(element_key(&key("255.0.0.0/8")).unwrap().interval_end, Some(None));
        // A range is only a whole key or the last field of a concatenation.
        assert!(element_key(&key("10.0.0.0/8 . tcp")).is_err());
    }

    #[test]
    fn typeof_concats_have_the_types_of_their_expressions() {
        let k = Typeof::new(&fields("ip daddr . meta l4proto . th dport . numgen random mod 2")).unwrap();
        assert_eq!((k.key_type().id(), k.key_type().byte_len()), (0x1c_c344, 16));
        let k = Typeof::new(&fields("meta l4proto . th dport . numgen random mod 2")).unwrap();
        assert_eq!((k.key_type().id(), k.key_type().byte_len()), (0xc344, 12));
        let d = Typeof::new(&[Field::Daddr(IpFamily::V6), Field::Dport(Protocol::Tcp)]).unwrap();
        let th = Typeof::new(&fields("ip6 daddr . th dport")).unwrap();
        assert_eq!((d.key_type().id(), d.key_type().byte_len()), ((8 << 6) | 13, 20));
        assert_eq!(d.key_type(), th.key_type());
        assert_ne!(d.udata(), th.udata());
        let sctp = Typeof::new(&[Field::Daddr(IpFamily::V4), Field::Dport(Protocol::Sctp)]).unwrap();
        assert_eq!((sctp.key_type().id(), sctp.l4_dependency()), ((7 << 6) | 13, Some(132)));
        assert_eq!(Typeof::new(&fields("ip daddr . th dport")).unwrap().l4_dependency(), None);
        // Outside the subset: a single expression, a constant.
        assert!(Typeof::new(&fields("ip daddr")).is_err());
        assert!(Typeof::new(&fields("ip daddr . numgen random mod 1 offset 3")).is_err());
    }

    #[test]
    fn map_data_is_a_verdict_or_a_padded_value() {
        let goto = ModelData::Verdict(ModelVerdict::Goto("c".into()));
        assert_eq!(map_data(&goto).unwrap(), MapData::Verdict(Verdict::Goto("c".into())));
        let value = ModelData::Value(key("198.18.16.10 . 8080"));
        assert_eq!(map_data(&value).unwrap(), MapData::Value(vec![198, 18, 16, 10, 0x1f, 0x90, 0, 0]));
        assert!(map_data(&ModelData::Value(key("198.18.16.0/24"))).is_err());
        let k = element_key(&key("tcp . 30080 . 0x1")).unwrap();
        let mut want = vec![6, 0, 0, 0, 0x75, 0x80, 0, 0];
        want.extend_from_slice(&1u32.to_ne_bytes());
        assert_eq!(k.start, want);
    }

    #[test]
    fn dnat_through_a_map_loads_the_concatenation_and_the_data_registers() {
        let th = |m: &str| (m == "m").then_some(None);
        let text = "dnat ip6 to ip6 daddr . meta l4proto . th dport . numgen random mod 4 map @m";
        let e = lower(IpFamily::V6, text, th).unwrap();
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
        let e = lower(IpFamily::V4, text, th).unwrap();
        assert!(matches!(e.last(), Some(Expr::Nat { addr_reg: 1, proto_reg: Some(9), flags: 0, .. })));
        // Data declared as `tcp dport`: nft matches the protocol first.
        let e = lower(IpFamily::V4, text, |_| Some(Some(6))).unwrap();
        assert_eq!(e[1], Expr::Cmp { sreg: NFT_REG_1, op: NFT_CMP_EQ, data: vec![6] });
        // An unknown map is refused, not guessed.
        assert!(lower(IpFamily::V4, text, |_| None).is_err());
        // After other statements nft is irregular (none after a prefix match): refused.
        assert!(lower(IpFamily::V4, &format!("ip daddr 10.0.0.0/9 {text}"), |_| Some(Some(6))).is_err());
        assert!(lower(IpFamily::V4, &format!("ip daddr 10.0.0.0/9 {text}"), |_| Some(None)).is_ok());
    }

    #[test]
    fn an_explicit_protocol_match_is_the_dependency() {
        let text = "meta l4proto udp dnat ip to meta l4proto . th dport . numgen random mod 4 map @m";
        let udp = lower(IpFamily::V4, text, |_| Some(Some(17))).unwrap();
        let l4proto_loads = udp.iter().filter(|e| matches!(e, Expr::Meta { key: NFT_META_L4PROTO, .. })).count();
        assert_eq!(l4proto_loads, 2, "{udp:?}");
        // The same whatever the map's data, so a map declared elsewhere (unknown) is fine.
        assert_eq!(lower(IpFamily::V4, text, |_| Some(None)).unwrap(), udp);
        assert_eq!(lower(IpFamily::V4, text, |_| None).unwrap(), udp);
        // Later matches count too; a protocol other than the data's is refused, as by nft.
        let later = "ip daddr 10.0.0.1 meta l4proto udp dnat ip to th dport . numgen random mod 4 map @m";
        assert_eq!(
            lower(IpFamily::V4, later, |_| None).unwrap()[3],
            Expr::Cmp { sreg: 1, op: NFT_CMP_EQ, data: vec![17] }
        );
        assert!(lower(IpFamily::V4, text, |_| Some(Some(6))).is_err());
        let both = format!("meta l4proto tcp {text}");
        assert!(lower(IpFamily::V4, &both, |_| Some(Some(17))).is_err());
        // `!=` is no dependency (nft adds its own match after it; refused as above).
        let neq = "meta l4proto != udp dnat ip to meta l4proto . th dport . numgen random mod 4 map @m";
        assert!(lower(IpFamily::V4, neq, |_| Some(Some(6))).is_err());
        assert!(lower(IpFamily::V4, neq, |_| None).is_err());
    }

    #[test]
    fn statements_outside_the_lowered_forms_are_errors_not_guesses() {
        // The other family's addresses and maps, ports as plain matches of a concatenation.
        assert!(lower(IpFamily::V4, "dnat ip6 to ip6 daddr . th dport map @m", |_| Some(None)).is_err());
        assert!(lower(IpFamily::V4, "ip6 daddr ::1 drop", |_| None).is_err());
        assert!(lower(IpFamily::V4, "ip daddr ::1 drop", |_| None).is_err());
        assert!(lower(IpFamily::V4, "dnat to fd00::1", |_| None).is_err());
        assert!(lower(IpFamily::V4, "meta l4proto 80 drop", |_| None).is_err());
        assert!(lower(IpFamily::V4, "meta l4proto . tcp dport @s", |_| None).is_err());
    }
}

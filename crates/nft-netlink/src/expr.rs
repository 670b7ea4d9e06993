//! Typed nf_tables rule expressions: exactly the ones kproxy's ruleset uses, encoded as the
//! kernel expects them (the attribute order follows `nft`, so the bytes compare equal to what
//! `nft --debug=mnl` sends for the same rule).

use crate::sys::*;
use crate::wire::MsgBuf;

/// A verdict, as an immediate or as map data.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub(crate) fn code(&self) -> u32 {
        match self {
            Verdict::Accept => NF_ACCEPT,
            Verdict::Drop => NF_DROP,
            Verdict::Return => NFT_RETURN,
            Verdict::Jump(_) => NFT_JUMP,
            Verdict::Goto(_) => NFT_GOTO,
        }
    }

    /// Encodes `NFTA_DATA_VERDICT` (inside an `NFTA_*_DATA` nest).
    pub fn encode(&self, m: &mut MsgBuf) {
        let n = m.begin_nest(NFTA_DATA_VERDICT);
        m.put_be32(NFTA_VERDICT_CODE, self.code());
        if let Verdict::Jump(c) | Verdict::Goto(c) = self {
            m.put_str(NFTA_VERDICT_CHAIN, c);
        }
        m.end_nest(n);
    }
}

/// Where a payload load reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadBase {
    /// Network header.
    Network,
    /// Transport header.
    Transport,
}

/// `nat` statement kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NatKind {
    /// `snat`
    Snat,
    /// `dnat`
    Dnat,
}

/// One expression of a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    /// Load packet bytes into a register.
    Payload {
        /// Header.
        base: PayloadBase,
        /// Offset in bytes.
        offset: u32,
        /// Length in bytes.
        len: u32,
        /// Destination register.
        dreg: u32,
    },
    /// Load a meta key.
    Meta {
        /// `NFT_META_*`.
        key: u32,
        /// Destination register.
        dreg: u32,
    },
    /// Set a meta key from a register.
    MetaSet {
        /// `NFT_META_*`.
        key: u32,
        /// Source register.
        sreg: u32,
    },
    /// Load a conntrack key.
    Ct {
        /// `NFT_CT_*`.
        key: u32,
        /// Destination register.
        dreg: u32,
    },
    /// Load a conntrack key of one direction's tuple.
    CtDir {
        /// `NFT_CT_*`.
        key: u32,
        /// `IP_CT_DIR_ORIGINAL` / `IP_CT_DIR_REPLY`.
        dir: u8,
        /// Destination register.
        dreg: u32,
    },
    /// Set a conntrack key from a register.
    CtSet {
        /// `NFT_CT_*`.
        key: u32,
        /// Source register.
        sreg: u32,
    },
    /// `reg = (reg & mask) ^ xor`.
    Bitwise {
        /// Register (source and destination).
        reg: u32,
        /// Mask.
        mask: Vec<u8>,
        /// Xor.
        xor: Vec<u8>,
        /// Send `NFTA_BITWISE_OP` (nft does for statements, not for matches).
        explicit_op: bool,
    },
    /// Compare a register with data; breaks the rule when false.
    Cmp {
        /// Register.
        sreg: u32,
        /// `NFT_CMP_EQ` / `NFT_CMP_NEQ`.
        op: u32,
        /// Data.
        data: Vec<u8>,
    },
    /// Set membership (`dreg: None`) or map lookup into `dreg`.
    Lookup {
        /// Key register.
        sreg: u32,
        /// Set name.
        set: String,
        /// Set id, when the set is created in the same batch.
        set_id: Option<u32>,
        /// Data register (0 for verdict maps).
        dreg: Option<u32>,
        /// Negated membership.
        invert: bool,
    },
    /// Load a constant value into a register.
    Immediate {
        /// Register.
        dreg: u32,
        /// Value.
        data: Vec<u8>,
    },
    /// The rule's verdict.
    Verdict(Verdict),
    /// Host to network byte order, in place: what nft puts after a host-order field (`meta
    /// l4proto`) of a key looked up in a set of concatenated ranges.
    ByteorderHton {
        /// Register.
        reg: u32,
        /// Field length in bytes.
        len: u32,
        /// Element size.
        size: u32,
    },
    /// `numgen random mod N [offset O]`.
    Numgen {
        /// Register.
        dreg: u32,
        /// Modulus.
        modulus: u32,
        /// Added to the result (`mod 1 offset O` is the constant O).
        offset: u32,
    },
    /// `fib saddr|daddr type`.
    FibType {
        /// Use the source address (else the destination).
        saddr: bool,
        /// Register.
        dreg: u32,
    },
    /// `reject`.
    Reject {
        /// `NFT_REJECT_*`.
        kind: u32,
        /// ICMP code.
        code: u8,
    },
    /// `masquerade`.
    Masq {
        /// `NF_NAT_RANGE_*` flags.
        flags: u32,
    },
    /// `snat`/`dnat` from registers.
    Nat {
        /// Kind.
        kind: NatKind,
        /// `NFPROTO_IPV4` / `NFPROTO_IPV6`.
        family: u8,
        /// Address register.
        addr_reg: u32,
        /// Port register.
        proto_reg: Option<u32>,
        /// `NF_NAT_RANGE_*` flags.
        flags: u32,
    },
    /// `counter` (the kernel starts it at zero).
    Counter,
    /// `flow add @flowtable`.
    FlowOffload {
        /// Flowtable name.
        flowtable: String,
    },
    /// `update @set { key [timeout T] }`.
    DynsetUpdate {
        /// Set name.
        set: String,
        /// Set id, when the set is created in the same batch.
        set_id: Option<u32>,
        /// Key register.
        sreg: u32,
        /// The element's timeout in milliseconds (`None`: the set's).
        timeout_ms: Option<u64>,
    },
}

impl Expr {
    fn name(&self) -> &'static str {
        match self {
            Expr::Payload { .. } => "payload",
            Expr::Meta { .. } | Expr::MetaSet { .. } => "meta",
            Expr::Ct { .. } | Expr::CtDir { .. } | Expr::CtSet { .. } => "ct",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Cmp { .. } => "cmp",
            Expr::Lookup { .. } => "lookup",
            Expr::Immediate { .. } | Expr::Verdict(_) => "immediate",
            Expr::Numgen { .. } => "numgen",
            Expr::ByteorderHton { .. } => "byteorder",
            Expr::FibType { .. } => "fib",
            Expr::Reject { .. } => "reject",
            Expr::Masq { .. } => "masq",
            Expr::Nat { .. } => "nat",
            Expr::DynsetUpdate { .. } => "dynset",
            Expr::Counter => "counter",
            Expr::FlowOffload { .. } => "flow_offload",
        }
    }

    /// Encodes one `NFTA_LIST_ELEM` of `NFTA_RULE_EXPRESSIONS`.
    pub fn encode(&self, m: &mut MsgBuf) {
        let elem = m.begin_nest(NFTA_LIST_ELEM);
        m.put_str(NFTA_EXPR_NAME, self.name());
        let data = m.begin_nest(NFTA_EXPR_DATA);
        self.encode_data(m);
        m.end_nest(data);
        m.end_nest(elem);
    }

    fn encode_data(&self, m: &mut MsgBuf) {
        let value = |m: &mut MsgBuf, kind: u16, bytes: &[u8]| {
            let n = m.begin_nest(kind);
            m.put(NFTA_DATA_VALUE, bytes);
            m.end_nest(n);
        };
        match self {
            Expr::Payload { base, offset, len, dreg } => {
                m.put_be32(NFTA_PAYLOAD_DREG, *dreg);
                let base = match base {
                    PayloadBase::Network => NFT_PAYLOAD_NETWORK_HEADER,
                    PayloadBase::Transport => NFT_PAYLOAD_TRANSPORT_HEADER,
                };
                m.put_be32(NFTA_PAYLOAD_BASE, base);
                m.put_be32(NFTA_PAYLOAD_OFFSET, *offset);
                m.put_be32(NFTA_PAYLOAD_LEN, *len);
            }
            Expr::Meta { key, dreg } => {
                m.put_be32(NFTA_META_KEY, *key);
                m.put_be32(NFTA_META_DREG, *dreg);
            }
            Expr::MetaSet { key, sreg } => {
                m.put_be32(NFTA_META_KEY, *key);
                m.put_be32(NFTA_META_SREG, *sreg);
            }
            Expr::Ct { key, dreg } => {
                m.put_be32(NFTA_CT_KEY, *key);
                m.put_be32(NFTA_CT_DREG, *dreg);
            }
            Expr::CtDir { key, dir, dreg } => {
                m.put_be32(NFTA_CT_KEY, *key);
                m.put_be32(NFTA_CT_DREG, *dreg);
                m.put(NFTA_CT_DIRECTION, &[*dir]);
            }
            Expr::CtSet { key, sreg } => {
                m.put_be32(NFTA_CT_KEY, *key);
                m.put_be32(NFTA_CT_SREG, *sreg);
            }
            Expr::Bitwise { reg, mask, xor, explicit_op } => {
                m.put_be32(NFTA_BITWISE_SREG, *reg);
                m.put_be32(NFTA_BITWISE_DREG, *reg);
                if *explicit_op {
                    m.put_be32(NFTA_BITWISE_OP, NFT_BITWISE_BOOL);
                }
                m.put_be32(NFTA_BITWISE_LEN, mask.len() as u32);
                value(m, NFTA_BITWISE_MASK, mask);
                value(m, NFTA_BITWISE_XOR, xor);
            }
            Expr::Cmp { sreg, op, data } => {
                m.put_be32(NFTA_CMP_SREG, *sreg);
                m.put_be32(NFTA_CMP_OP, *op);
                value(m, NFTA_CMP_DATA, data);
            }
            Expr::Lookup { sreg, set, set_id, dreg, invert } => {
                m.put_be32(NFTA_LOOKUP_SREG, *sreg);
                if let Some(d) = dreg {
                    m.put_be32(NFTA_LOOKUP_DREG, *d);
                }
                m.put_str(NFTA_LOOKUP_SET, set);
                if let Some(id) = set_id {
                    m.put_be32(NFTA_LOOKUP_SET_ID, *id);
                }
                if *invert {
                    m.put_be32(NFTA_LOOKUP_FLAGS, NFT_LOOKUP_F_INV);
                }
            }
            Expr::Immediate { dreg, data } => {
                m.put_be32(NFTA_IMMEDIATE_DREG, *dreg);
                value(m, NFTA_IMMEDIATE_DATA, data);
            }
            Expr::Verdict(v) => {
                m.put_be32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
                let n = m.begin_nest(NFTA_IMMEDIATE_DATA);
                v.encode(m);
                m.end_nest(n);
            }
            Expr::ByteorderHton { reg, len, size } => {
                m.put_be32(NFTA_BYTEORDER_SREG, *reg);
                m.put_be32(NFTA_BYTEORDER_DREG, *reg);
                m.put_be32(NFTA_BYTEORDER_OP, NFT_BYTEORDER_HTON);
                m.put_be32(NFTA_BYTEORDER_LEN, *len);
                m.put_be32(NFTA_BYTEORDER_SIZE, *size);
            }
            Expr::Numgen { dreg, modulus, offset } => {
                m.put_be32(NFTA_NG_DREG, *dreg);
                m.put_be32(NFTA_NG_MODULUS, *modulus);
                m.put_be32(NFTA_NG_TYPE, NFT_NG_RANDOM);
                m.put_be32(NFTA_NG_OFFSET, *offset);
            }
            Expr::FibType { saddr, dreg } => {
                m.put_be32(NFTA_FIB_FLAGS, if *saddr { NFTA_FIB_F_SADDR } else { NFTA_FIB_F_DADDR });
                m.put_be32(NFTA_FIB_RESULT, NFT_FIB_RESULT_ADDRTYPE);
                m.put_be32(NFTA_FIB_DREG, *dreg);
            }
            Expr::Reject { kind, code } => {
                m.put_be32(NFTA_REJECT_TYPE, *kind);
                m.put(NFTA_REJECT_ICMP_CODE, &[*code]);
            }
            Expr::Masq { flags } => m.put_be32(NFTA_MASQ_FLAGS, *flags),
            Expr::Nat { kind, family, addr_reg, proto_reg, flags } => {
                m.put_be32(NFTA_NAT_TYPE, if *kind == NatKind::Snat { NFT_NAT_SNAT } else { NFT_NAT_DNAT });
                m.put_be32(NFTA_NAT_FAMILY, u32::from(*family));
                m.put_be32(NFTA_NAT_REG_ADDR_MIN, *addr_reg);
                if let Some(p) = proto_reg {
                    m.put_be32(NFTA_NAT_REG_PROTO_MIN, *p);
                }
                if *flags != 0 {
                    m.put_be32(NFTA_NAT_FLAGS, *flags);
                }
            }
            Expr::Counter => {}
            Expr::FlowOffload { flowtable } => m.put_str(NFTA_FLOW_TABLE_NAME, flowtable),
            Expr::DynsetUpdate { set, set_id, sreg, timeout_ms } => {
                m.put_be32(NFTA_DYNSET_SREG_KEY, *sreg);
                m.put_be32(NFTA_DYNSET_OP, NFT_DYNSET_OP_UPDATE);
                if let Some(t) = timeout_ms {
                    m.put_be64(NFTA_DYNSET_TIMEOUT, *t);
                }
                m.put_str(NFTA_DYNSET_SET_NAME, set);
                if let Some(id) = set_id {
                    m.put_be32(NFTA_DYNSET_SET_ID, *id);
                }
            }
        }
    }
}

//! The constants of the kernel UAPI this crate speaks (`linux/netfilter/nfnetlink.h`,
//! `linux/netfilter/nf_tables.h`, `linux/netlink.h`), named as there.

#![allow(missing_docs)]

pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_MULTI: u16 = 0x2;
pub const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;
/// On a dump reply: the dump met a concurrent change and may be inconsistent.
pub const NLM_F_DUMP_INTR: u16 = 0x10;
/// `NFNLGRP_NFTABLES`: nf_tables' multicast group, told of every commit.
pub const NFNLGRP_NFTABLES: u32 = 7;
pub const NLA_F_NESTED: u16 = 0x8000;

pub const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub const NFNL_MSG_BATCH_END: u16 = 0x11;
pub const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub const NFPROTO_UNSPEC: u8 = 0;
/// `NFPROTO_INET`: the `inet` table family.
pub const NFPROTO_INET: u8 = 1;
pub const NFPROTO_IPV4: u8 = 2;
pub const NFPROTO_IPV6: u8 = 10;

pub const NFT_MSG_NEWTABLE: u16 = 0;
/// `NFT_MSG_GETTABLE`: one table, or every table with `NLM_F_DUMP`.
pub const NFT_MSG_GETTABLE: u16 = 1;
pub const NFT_MSG_DELTABLE: u16 = 2;
pub const NFT_MSG_NEWCHAIN: u16 = 3;
pub const NFT_MSG_GETCHAIN: u16 = 4;
pub const NFT_MSG_DELCHAIN: u16 = 5;
pub const NFT_MSG_NEWRULE: u16 = 6;
pub const NFT_MSG_GETRULE: u16 = 7;
pub const NFT_MSG_DELRULE: u16 = 8;
pub const NFT_MSG_NEWSET: u16 = 9;
pub const NFT_MSG_GETSET: u16 = 10;
pub const NFT_MSG_DELSET: u16 = 11;
pub const NFT_MSG_NEWSETELEM: u16 = 12;
pub const NFT_MSG_GETSETELEM: u16 = 13;
pub const NFT_MSG_DELSETELEM: u16 = 14;
pub const NFT_MSG_NEWGEN: u16 = 15;
pub const NFT_MSG_GETGEN: u16 = 16;
/// `NFTA_GEN_ID`: the generation, big endian.
pub const NFTA_GEN_ID: u16 = 1;
pub const NFT_MSG_NEWFLOWTABLE: u16 = 22;
pub const NFT_MSG_DELFLOWTABLE: u16 = 24;
pub const NFTA_FLOWTABLE_TABLE: u16 = 1;
pub const NFTA_FLOWTABLE_NAME: u16 = 2;
pub const NFTA_FLOWTABLE_HOOK: u16 = 3;
pub const NFTA_FLOWTABLE_FLAGS: u16 = 7;
pub const NFTA_FLOWTABLE_HOOK_NUM: u16 = 1;
pub const NFTA_FLOWTABLE_HOOK_PRIORITY: u16 = 2;
pub const NFTA_FLOWTABLE_HOOK_DEVS: u16 = 3;
pub const NFTA_DEVICE_NAME: u16 = 1;
/// `NFT_FLOWTABLE_COUNTER`: offloaded packets keep conntrack's counters moving.
pub const NFT_FLOWTABLE_COUNTER: u32 = 0x2;
/// `NF_NETDEV_INGRESS`: the one hook flowtables attach to.
pub const NF_NETDEV_INGRESS: u32 = 0;
pub const NFTA_FLOW_TABLE_NAME: u16 = 1;

pub const NFTA_TABLE_NAME: u16 = 1;
pub const NFTA_TABLE_FLAGS: u16 = 2;
pub const NFTA_TABLE_USERDATA: u16 = 6;

pub const NFTA_CHAIN_TABLE: u16 = 1;
pub const NFTA_CHAIN_NAME: u16 = 3;
pub const NFTA_CHAIN_HOOK: u16 = 4;
pub const NFTA_CHAIN_POLICY: u16 = 5;
pub const NFTA_CHAIN_TYPE: u16 = 7;
pub const NFTA_HOOK_HOOKNUM: u16 = 1;
pub const NFTA_HOOK_PRIORITY: u16 = 2;

pub const NFTA_RULE_TABLE: u16 = 1;
pub const NFTA_RULE_CHAIN: u16 = 2;
pub const NFTA_RULE_EXPRESSIONS: u16 = 4;
pub const NFTA_RULE_USERDATA: u16 = 7;
pub const NFTA_LIST_ELEM: u16 = 1;
pub const NFTA_EXPR_NAME: u16 = 1;
pub const NFTA_EXPR_DATA: u16 = 2;

pub const NFTA_SET_TABLE: u16 = 1;
pub const NFTA_SET_NAME: u16 = 2;
pub const NFTA_SET_FLAGS: u16 = 3;
pub const NFTA_SET_KEY_TYPE: u16 = 4;
pub const NFTA_SET_KEY_LEN: u16 = 5;
pub const NFTA_SET_DATA_TYPE: u16 = 6;
pub const NFTA_SET_DATA_LEN: u16 = 7;
pub const NFTA_SET_DESC: u16 = 9;
pub const NFTA_SET_ID: u16 = 10;
pub const NFTA_SET_TIMEOUT: u16 = 11;
pub const NFTA_SET_USERDATA: u16 = 13;
pub const NFTA_SET_DESC_SIZE: u16 = 1;
/// `NFTA_SET_DESC_CONCAT`: the field lengths of a concatenation with ranges.
pub const NFTA_SET_DESC_CONCAT: u16 = 2;
/// `NFTA_SET_FIELD_LEN`.
pub const NFTA_SET_FIELD_LEN: u16 = 1;
/// `NFTA_SET_ELEM_KEY_END`: the inclusive end of a concatenated range.
pub const NFTA_SET_ELEM_KEY_END: u16 = 10;

// libnftnl's `enum nftnl_udata_set_types` (set user data, read back by `nft list`).
pub const NFTNL_UDATA_SET_KEYBYTEORDER: u8 = 0;
pub const NFTNL_UDATA_SET_DATABYTEORDER: u8 = 1;
pub const NFTNL_UDATA_SET_KEY_TYPEOF: u8 = 3;
pub const NFTNL_UDATA_SET_DATA_TYPEOF: u8 = 4;
pub const NFTNL_UDATA_SET_DATA_INTERVAL: u8 = 6;
pub const NFTNL_UDATA_SET_COMMENT: u8 = 7;

/// `NFT_SET_ANONYMOUS`: a set bound to the one rule that uses it.
pub const NFT_SET_ANONYMOUS: u32 = 0x1;
/// `NFT_SET_CONSTANT`: elements never change after creation.
pub const NFT_SET_CONSTANT: u32 = 0x2;
pub const NFT_SET_INTERVAL: u32 = 0x4;
/// `NFT_SET_CONCAT`: ranges in a concatenation (the pipapo backend).
pub const NFT_SET_CONCAT: u32 = 0x80;
pub const NFT_SET_MAP: u32 = 0x8;
pub const NFT_SET_TIMEOUT: u32 = 0x10;
pub const NFT_SET_EVAL: u32 = 0x20;

/// `NFTA_SET_EXPR`: an expression every element of the set gets (here: a counter).
pub const NFTA_SET_EXPR: u16 = 17;
/// `NFTA_SET_ELEM_EXPR`: an element's own expression (its counter).
pub const NFTA_SET_ELEM_EXPR: u16 = 7;
/// `NFTA_SET_ELEM_EXPRESSIONS`: an element's expressions, as a list.
pub const NFTA_SET_ELEM_EXPRESSIONS: u16 = 11;
pub const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
pub const NFTA_SET_ELEM_LIST_SET: u16 = 2;
pub const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
pub const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
pub const NFTA_SET_ELEM_KEY: u16 = 1;
pub const NFTA_SET_ELEM_DATA: u16 = 2;
pub const NFTA_SET_ELEM_FLAGS: u16 = 3;
pub const NFT_SET_ELEM_INTERVAL_END: u32 = 0x1;

pub const NFTA_DATA_VALUE: u16 = 1;
pub const NFTA_DATA_VERDICT: u16 = 2;
pub const NFTA_VERDICT_CODE: u16 = 1;
pub const NFTA_VERDICT_CHAIN: u16 = 2;
pub const NFT_DATA_VERDICT: u32 = 0xffff_ff00;

pub const NF_DROP: u32 = 0;
pub const NF_ACCEPT: u32 = 1;
pub const NFT_CONTINUE: u32 = -1i32 as u32;
pub const NFT_RETURN: u32 = -5i32 as u32;
pub const NFT_JUMP: u32 = -3i32 as u32;
pub const NFT_GOTO: u32 = -4i32 as u32;

pub const NFT_REG_VERDICT: u32 = 0;
pub const NFT_REG_1: u32 = 1;
pub const NFT_REG32_00: u32 = 8;

// Expression attributes.
pub const NFTA_PAYLOAD_DREG: u16 = 1;
pub const NFTA_PAYLOAD_BASE: u16 = 2;
pub const NFTA_PAYLOAD_OFFSET: u16 = 3;
pub const NFTA_PAYLOAD_LEN: u16 = 4;
pub const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
pub const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;

pub const NFTA_META_DREG: u16 = 1;
pub const NFTA_META_KEY: u16 = 2;
pub const NFTA_META_SREG: u16 = 3;
pub const NFT_META_MARK: u32 = 3;
pub const NFT_META_IIFNAME: u32 = 6;
pub const NFT_META_L4PROTO: u32 = 16;
pub const NFT_META_NFPROTO: u32 = 15;

pub const NFTA_CT_DREG: u16 = 1;
pub const NFTA_CT_KEY: u16 = 2;
pub const NFTA_CT_SREG: u16 = 4;
pub const NFTA_CT_DIRECTION: u16 = 3;
pub const NFT_CT_PROTO_DST: u32 = 12;
pub const NFT_CT_DST_IP: u32 = 20;
pub const NFT_CT_DST_IP6: u32 = 22;
/// `IP_CT_DIR_ORIGINAL`.
pub const IP_CT_DIR_ORIGINAL: u8 = 0;
pub const NFT_CT_MARK: u32 = 3;
pub const NFT_CT_PKTS: u32 = 14;
pub const NFT_CT_STATE: u32 = 0;
pub const NFT_CT_STATUS: u32 = 2;

pub const NFTA_BITWISE_SREG: u16 = 1;
pub const NFTA_BITWISE_DREG: u16 = 2;
pub const NFTA_BITWISE_LEN: u16 = 3;
pub const NFTA_BITWISE_MASK: u16 = 4;
pub const NFTA_BITWISE_XOR: u16 = 5;
pub const NFTA_BITWISE_OP: u16 = 6;
pub const NFT_BITWISE_BOOL: u32 = 0;

pub const NFTA_CMP_SREG: u16 = 1;
pub const NFTA_CMP_OP: u16 = 2;
pub const NFTA_CMP_DATA: u16 = 3;
pub const NFT_CMP_EQ: u32 = 0;
pub const NFT_CMP_NEQ: u32 = 1;
pub const NFT_CMP_GT: u32 = 4;

pub const NFTA_LOOKUP_SET: u16 = 1;
pub const NFTA_LOOKUP_SREG: u16 = 2;
pub const NFTA_LOOKUP_DREG: u16 = 3;
pub const NFTA_LOOKUP_SET_ID: u16 = 4;
pub const NFTA_LOOKUP_FLAGS: u16 = 5;
pub const NFT_LOOKUP_F_INV: u32 = 1;

pub const NFTA_IMMEDIATE_DREG: u16 = 1;
pub const NFTA_IMMEDIATE_DATA: u16 = 2;

pub const NFTA_NG_DREG: u16 = 1;
pub const NFTA_NG_MODULUS: u16 = 2;
pub const NFTA_NG_TYPE: u16 = 3;
pub const NFTA_NG_OFFSET: u16 = 4;
pub const NFT_NG_RANDOM: u32 = 1;

pub const NFTA_FIB_DREG: u16 = 1;
pub const NFTA_FIB_RESULT: u16 = 2;
pub const NFTA_FIB_FLAGS: u16 = 3;
pub const NFTA_FIB_F_SADDR: u32 = 1;
pub const NFTA_FIB_F_DADDR: u32 = 2;
pub const NFT_FIB_RESULT_ADDRTYPE: u32 = 3;

pub const NFTA_REJECT_TYPE: u16 = 1;
pub const NFTA_REJECT_ICMP_CODE: u16 = 2;

pub const NFTA_MASQ_FLAGS: u16 = 1;

pub const NFTA_NAT_TYPE: u16 = 1;
pub const NFTA_NAT_FAMILY: u16 = 2;
pub const NFTA_NAT_REG_ADDR_MIN: u16 = 3;
pub const NFTA_NAT_REG_PROTO_MIN: u16 = 5;
pub const NFTA_NAT_FLAGS: u16 = 7;
pub const NFT_NAT_SNAT: u32 = 0;
pub const NFT_NAT_DNAT: u32 = 1;
pub const NF_NAT_RANGE_PROTO_SPECIFIED: u32 = 0x2;
pub const NF_NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 0x10;

pub const NFTA_DYNSET_SET_NAME: u16 = 1;
pub const NFTA_DYNSET_SET_ID: u16 = 2;
pub const NFTA_DYNSET_OP: u16 = 3;
pub const NFTA_DYNSET_SREG_KEY: u16 = 4;
pub const NFTA_DYNSET_TIMEOUT: u16 = 6;
pub const NFT_DYNSET_OP_UPDATE: u32 = 1;

/// `NFTA_BYTEORDER_SREG`.
pub const NFTA_BYTEORDER_SREG: u16 = 1;
/// `NFTA_BYTEORDER_DREG`.
pub const NFTA_BYTEORDER_DREG: u16 = 2;
/// `NFTA_BYTEORDER_OP`.
pub const NFTA_BYTEORDER_OP: u16 = 3;
/// `NFTA_BYTEORDER_LEN`.
pub const NFTA_BYTEORDER_LEN: u16 = 4;
/// `NFTA_BYTEORDER_SIZE`.
pub const NFTA_BYTEORDER_SIZE: u16 = 5;
/// `NFT_BYTEORDER_HTON`.
pub const NFT_BYTEORDER_HTON: u32 = 1;

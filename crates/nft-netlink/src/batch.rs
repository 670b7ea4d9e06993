//! Encodes a [`Transaction`] as one nfnetlink batch (`NFNL_MSG_BATCH_BEGIN` … `END`).
//!
//! Every operation becomes one message (an element of an interval set carries its range end in
//! the same message), numbered by a sequence number from which [`Batch::ops_for_seq`] recovers
//! the operations the kernel complained about. A run of element operations on one set shares
//! a message (up to [`ELEMENTS_PER_MESSAGE_BYTES`]), as nft sends them: the kernel looks a set
//! up by name, walking the table's list of sets, once per message, and at a cold start of 100k
//! Services one message per element made that walk a tenth of the kernel's work.
//!
//! Sets created in the batch get an id that later references in the same batch carry, as `nft`
//! does.

use std::collections::{HashMap, HashSet};

use kproxy_nft_model::{Chain, Element, Key, Op, SetDef, SetFlag, SetType, TableFamily, TableRef, Transaction, Value};

use crate::expr::Expr;
use crate::lower::{self, DataType, KeyType, LowerError, MapData, SetInfo, Typeof};
use crate::sys::*;
use crate::wire::MsgBuf;

/// The most bytes of elements one message's element list carries (its length is 16 bits).
pub const ELEMENTS_PER_MESSAGE_BYTES: usize = 32 * 1024;

/// An encoded batch.
#[derive(Debug)]
pub struct Batch {
    buf: MsgBuf,
    first_seq: u32,
    /// For message `first_seq + 1 + i`, the index of its (first) operation.
    msg_ops: Vec<u32>,
    /// Operations in the batch.
    ops: usize,
}

/// The element message being written, which later elements of the same set and kind join.
struct OpenElements {
    table: TableRef,
    set: String,
    add: bool,
    /// Where its element list begins.
    list_at: usize,
    /// Elements in it.
    count: u16,
}

/// An operation that could not be encoded.
#[derive(Debug, thiserror::Error)]
#[error("operation {index} ({op}): {source}")]
pub struct EncodeError {
    /// Index of the operation in the transaction.
    pub index: usize,
    /// The operation as nft text.
    pub op: String,
    /// Why.
    pub source: LowerError,
}

/// The nfproto of a table family.
pub fn nfproto(f: TableFamily) -> u8 {
    match f {
        TableFamily::Ip => NFPROTO_IPV4,
        TableFamily::Ip6 => NFPROTO_IPV6,
        TableFamily::Inet => NFPROTO_INET,
    }
}

/// What a map's elements map to.
enum SetData {
    Verdict,
    /// A packet mark (host byte order).
    Mark,
    /// Data declared by `typeof` expressions (`ip daddr . th dport`).
    Typeof(Typeof),
}

/// `nft`'s set user data: key (and data) byte order, the `typeof` expressions of concatenations
/// (none for keys declared by type names), the comment.
fn set_userdata(key: &KeyType, key_typeof: Option<&Typeof>, data: Option<&SetData>, def: &SetDef) -> Vec<u8> {
    let mut u = Vec::new();
    let mut tlv = |kind: u8, value: &[u8]| {
        u.push(kind);
        u.push(value.len() as u8);
        u.extend_from_slice(value);
    };
    // BYTEORDER_BIG_ENDIAN for addresses, BYTEORDER_INVALID for concatenations (and for the
    // data of kproxy's maps: verdicts or concatenations).
    let key_order: u32 = if key.is_concat() { 0 } else { 2 };
    tlv(NFTNL_UDATA_SET_KEYBYTEORDER, &key_order.to_ne_bytes());
    if let Some(d) = data {
        // BYTEORDER_HOST_ENDIAN for marks.
        let order: u32 = if matches!(d, SetData::Mark) { 1 } else { 0 };
        tlv(NFTNL_UDATA_SET_DATABYTEORDER, &order.to_ne_bytes());
    }
    if key.is_concat() {
        let exprs = key_typeof.map(|t| t.0.as_slice()).unwrap_or_default();
        tlv(NFTNL_UDATA_SET_KEY_TYPEOF, &lower::concat_udata(exprs));
    }
    if let Some(SetData::Typeof(t)) = data {
        tlv(NFTNL_UDATA_SET_DATA_TYPEOF, &t.udata());
    }
    if data.is_some() {
        tlv(NFTNL_UDATA_SET_DATA_INTERVAL, &0u32.to_ne_bytes());
    }
    if let Some(c) = &def.comment {
        let mut s = c.replace('"', "").into_bytes();
        s.truncate(254);
        s.push(0);
        tlv(NFTNL_UDATA_SET_COMMENT, &s);
    }
    u
}

struct Encoder {
    buf: MsgBuf,
    seq: u32,
    msg_ops: Vec<u32>,
    set_ids: HashMap<(TableRef, String), u32>,
    next_set_id: u32,
    /// The id of the next anonymous set: nft numbers them after every named set of the batch.
    next_anon_id: u32,
    index: u32,
    /// Where the last message begins (an operation may take several: a rule's anonymous sets
    /// come before the rule).
    last_msg_start: usize,
    /// Data maps declared by `typeof` in this batch, with the protocol match their data implies
    /// for the rules that read them.
    map_deps: HashMap<(TableRef, String), Option<u8>>,
    /// Interval elements each set gets in this batch.
    intervals: HashMap<(TableRef, String), Vec<Key>>,
    /// Sets of concatenated ranges created in this batch.
    range_sets: HashSet<(TableRef, String)>,
    /// The last message, when it is a list of elements that the next may join.
    open_elements: Option<OpenElements>,
}

/// What a rule's lowering needs to know of the sets declared earlier in the batch.
struct BatchSets<'a> {
    enc: &'a Encoder,
    table: &'a TableRef,
}

impl SetInfo for BatchSets<'_> {
    fn map_dependency(&self, map: &str) -> Option<Option<u8>> {
        self.enc.map_deps.get(&(self.table.clone(), map.to_owned())).copied()
    }

    fn holds_ranges(&self, set: &str) -> bool {
        self.enc.range_sets.contains(&(self.table.clone(), set.to_owned()))
    }
}

impl Encoder {
    fn begin(&mut self, msg: u16, flags: u16, family: u8) {
        self.open_elements = None;
        self.seq = self.seq.wrapping_add(1);
        self.msg_ops.push(self.index);
        self.last_msg_start = self.buf.len();
        self.buf.begin_nft(msg, NLM_F_REQUEST | flags, self.seq, family);
    }

    fn set_id(&self, t: &TableRef, set: &str) -> Option<u32> {
        self.set_ids.get(&(t.clone(), set.to_owned())).copied()
    }

    fn op(&mut self, op: &Op) -> Result<(), LowerError> {
        match op {
            Op::AddTable { table, comment } => {
                self.begin(NFT_MSG_NEWTABLE, NLM_F_CREATE, nfproto(table.family));
                self.buf.put_str(NFTA_TABLE_NAME, &table.name);
                self.buf.put_be32(NFTA_TABLE_FLAGS, 0);
                if let Some(c) = comment {
                    self.buf.put(NFTA_TABLE_USERDATA, &comment_udata(c));
                }
            }
            Op::DeleteTable(t) => {
                self.begin(NFT_MSG_DELTABLE, 0, nfproto(t.family));
                self.buf.put_str(NFTA_TABLE_NAME, &t.name);
                self.set_ids.retain(|(table, _), _| table != t);
                self.map_deps.retain(|(table, _), _| table != t);
            }
            Op::FlushTable(t) => {
                self.begin(NFT_MSG_DELRULE, 0, nfproto(t.family));
                self.buf.put_str(NFTA_RULE_TABLE, &t.name);
            }
            Op::AddChain(t, chain) => self.add_chain(t, chain)?,
            Op::FlushChain(t, name) => {
                self.begin(NFT_MSG_DELRULE, 0, nfproto(t.family));
                self.buf.put_str(NFTA_RULE_TABLE, &t.name);
                self.buf.put_str(NFTA_RULE_CHAIN, name);
            }
            Op::DeleteChain(t, name) => {
                self.begin(NFT_MSG_DELCHAIN, 0, nfproto(t.family));
                self.buf.put_str(NFTA_CHAIN_TABLE, &t.name);
                self.buf.put_str(NFTA_CHAIN_NAME, name);
            }
            Op::AddRule { table, chain, rule, comment } => {
                let sets = BatchSets { enc: self, table };
                let lowered = lower::rule(table.family, rule, &sets)?;
                let mut exprs = lowered.exprs;
                let mut anon_ids = Vec::new();
                for anon in &lowered.anon_sets {
                    anon_ids.push(self.anon_set(table, anon));
                }
                let mut anon_ids = anon_ids.into_iter();
                for e in &mut exprs {
                    if let Expr::Lookup { set, set_id, .. } | Expr::DynsetUpdate { set, set_id, .. } = e {
                        *set_id = if set == lower::ANON_SET_NAME { anon_ids.next() } else { self.set_id(table, set) };
                    }
                }
                self.begin(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, nfproto(table.family));
                self.buf.put_str(NFTA_RULE_TABLE, &table.name);
                self.buf.put_str(NFTA_RULE_CHAIN, chain);
                let n = self.buf.begin_nest(NFTA_RULE_EXPRESSIONS);
                for e in &exprs {
                    e.encode(&mut self.buf);
                }
                self.buf.end_nest(n);
                if let Some(c) = comment {
                    self.buf.put(NFTA_RULE_USERDATA, &comment_udata(c));
                }
            }
            Op::AddSet(t, def) => self.add_set(t, def)?,
            Op::FlushSet { table, name, .. } => {
                self.begin(NFT_MSG_DELSETELEM, 0, nfproto(table.family));
                self.buf.put_str(NFTA_SET_ELEM_LIST_TABLE, &table.name);
                self.buf.put_str(NFTA_SET_ELEM_LIST_SET, name);
            }
            Op::DeleteSet { table, name, .. } => {
                self.begin(NFT_MSG_DELSET, 0, nfproto(table.family));
                self.buf.put_str(NFTA_SET_TABLE, &table.name);
                self.buf.put_str(NFTA_SET_NAME, name);
                self.set_ids.remove(&(table.clone(), name.clone()));
                self.map_deps.remove(&(table.clone(), name.clone()));
            }
            Op::AddElement(t, e) => self.element(t, e, true)?,
            Op::DeleteElement(t, e) => self.element(t, e, false)?,
            Op::DeleteElementByIdentity { table, set, identity } => {
                let key = crate::identity::identity_key(identity)
                    .ok_or_else(|| LowerError::new(format!("{} is not an element identity", op_text(op))))?;
                self.begin(NFT_MSG_DELSETELEM, 0, nfproto(table.family));
                self.elem_header(table, set, false);
                let list = self.buf.begin_nest(NFTA_SET_ELEM_LIST_ELEMENTS);
                self.elem_range(1, key, None, None, false);
                self.buf.end_nest(list);
            }
            Op::AddFlowtable(t, ft) => {
                self.begin(NFT_MSG_NEWFLOWTABLE, NLM_F_CREATE, nfproto(t.family));
                self.flowtable_hook(t, &ft.name, ft.priority, &ft.devices);
                self.buf.put_be32(NFTA_FLOWTABLE_FLAGS, if ft.counter { NFT_FLOWTABLE_COUNTER } else { 0 });
            }
            Op::DeleteFlowtableDevices { table, name, devices } => {
                self.begin(NFT_MSG_DELFLOWTABLE, 0, nfproto(table.family));
                self.flowtable_hook(table, name, 0, devices);
            }
        }
        self.buf.end();
        Ok(())
    }

    /// A flowtable's table, name and ingress hook with its devices, which nft sends in the
    /// reverse of the order they are written in.
    fn flowtable_hook(&mut self, t: &TableRef, name: &str, priority: i32, devices: &[String]) {
        self.buf.put_str(NFTA_FLOWTABLE_TABLE, &t.name);
        self.buf.put_str(NFTA_FLOWTABLE_NAME, name);
        let hook = self.buf.begin_nest(NFTA_FLOWTABLE_HOOK);
        self.buf.put_be32(NFTA_FLOWTABLE_HOOK_NUM, NF_NETDEV_INGRESS);
        self.buf.put_be32(NFTA_FLOWTABLE_HOOK_PRIORITY, priority as u32);
        if !devices.is_empty() {
            let devs = self.buf.begin_nest(NFTA_FLOWTABLE_HOOK_DEVS);
            for d in devices.iter().rev() {
                self.buf.put_str(NFTA_DEVICE_NAME, &d.replace(['"', '\\'], ""));
            }
            self.buf.end_nest(devs);
        }
        self.buf.end_nest(hook);
    }

    fn add_chain(&mut self, t: &TableRef, chain: &Chain) -> Result<(), LowerError> {
        self.begin(NFT_MSG_NEWCHAIN, NLM_F_CREATE, nfproto(t.family));
        self.buf.put_str(NFTA_CHAIN_TABLE, &t.name);
        self.buf.put_str(NFTA_CHAIN_NAME, &chain.name);
        if let Some(h) = &chain.hook {
            self.buf.put_str(NFTA_CHAIN_TYPE, h.kind.as_str());
            self.buf.put_be32(NFTA_CHAIN_POLICY, NF_ACCEPT);
            let n = self.buf.begin_nest(NFTA_CHAIN_HOOK);
            self.buf.put_be32(NFTA_HOOK_HOOKNUM, h.hook.number());
            self.buf.put_be32(NFTA_HOOK_PRIORITY, h.priority as u32);
            self.buf.end_nest(n);
        }
        Ok(())
    }

    fn add_set(&mut self, t: &TableRef, def: &SetDef) -> Result<(), LowerError> {
        let (key, key_typeof, data) = match &def.ty {
            SetType::Named { key, data } => {
                let key = key.iter().map(|d| DataType::of(*d)).collect::<Result<_, _>>()?;
                let data = match data {
                    None => None,
                    Some(kproxy_nft_model::DataType::Verdict) => Some(SetData::Verdict),
                    Some(kproxy_nft_model::DataType::Mark) => Some(SetData::Mark),
                    Some(other) => return Err(LowerError { what: format!("map data of type {other}") }),
                };
                (KeyType(key), None, data)
            }
            SetType::Typeof { key, data } => {
                let key = Typeof::new(key)?;
                let data = data.as_deref().map(Typeof::new).transpose()?.map(SetData::Typeof);
                (key.key_type(), Some(key), data)
            }
        };
        let mut flags = 0;
        for f in &def.flags {
            flags |= match *f {
                SetFlag::Interval => NFT_SET_INTERVAL,
                SetFlag::Dynamic => NFT_SET_EVAL,
                SetFlag::Timeout => NFT_SET_TIMEOUT,
            };
        }
        if data.is_some() {
            flags |= NFT_SET_MAP;
        }
        // Ranges in a concatenation: the pipapo backend, elements carry their own end.
        let concat_ranges = flags & NFT_SET_INTERVAL != 0 && key.is_concat();
        if concat_ranges {
            flags |= NFT_SET_CONCAT;
            self.range_sets.insert((t.clone(), def.name.clone()));
        }
        if let Some(SetData::Typeof(d)) = &data {
            self.map_deps.insert((t.clone(), def.name.clone()), d.l4_dependency());
        }
        self.next_set_id += 1;
        let id = self.next_set_id;
        self.set_ids.insert((t.clone(), def.name.clone()), id);
        self.begin(NFT_MSG_NEWSET, NLM_F_CREATE, nfproto(t.family));
        self.buf.put_str(NFTA_SET_TABLE, &t.name);
        self.buf.put_str(NFTA_SET_NAME, &def.name);
        self.buf.put_be32(NFTA_SET_FLAGS, flags);
        self.buf.put_be32(NFTA_SET_KEY_TYPE, key.id());
        self.buf.put_be32(NFTA_SET_KEY_LEN, key.byte_len());
        match &data {
            None => {}
            Some(SetData::Verdict) => {
                self.buf.put_be32(NFTA_SET_DATA_TYPE, NFT_DATA_VERDICT);
                self.buf.put_be32(NFTA_SET_DATA_LEN, 0);
            }
            Some(SetData::Mark) => {
                // nft's TYPE_MARK, a 32-bit host-order integer.
                self.buf.put_be32(NFTA_SET_DATA_TYPE, 19);
                self.buf.put_be32(NFTA_SET_DATA_LEN, 4);
            }
            Some(SetData::Typeof(t)) => {
                let d = t.key_type();
                self.buf.put_be32(NFTA_SET_DATA_TYPE, d.id());
                self.buf.put_be32(NFTA_SET_DATA_LEN, d.byte_len());
            }
        }
        // In libnftnl's order: the id, one description (size, concatenated fields), the timeout.
        self.buf.put_be32(NFTA_SET_ID, id);
        if def.size.is_some() || concat_ranges {
            let desc = self.buf.begin_nest(NFTA_SET_DESC);
            if let Some(size) = def.size {
                self.buf.put_be32(NFTA_SET_DESC_SIZE, size);
            }
            if concat_ranges {
                let fields = self.buf.begin_nest(NFTA_SET_DESC_CONCAT);
                for len in key.field_lens() {
                    let f = self.buf.begin_nest(NFTA_LIST_ELEM);
                    self.buf.put_be32(NFTA_SET_FIELD_LEN, len);
                    self.buf.end_nest(f);
                }
                self.buf.end_nest(fields);
            }
            self.buf.end_nest(desc);
        }
        if let Some(timeout) = def.timeout {
            self.buf.put_be64(NFTA_SET_TIMEOUT, u64::from(timeout) * 1000);
        }
        self.buf.put(NFTA_SET_USERDATA, &set_userdata(&key, key_typeof.as_ref(), data.as_ref(), def));
        if def.counter {
            // The set's expression template: the kernel gives each new element its own counter
            // (after the user data, where nft puts it).
            let expr = self.buf.begin_nest(NFTA_SET_EXPR);
            self.buf.put_str(NFTA_EXPR_NAME, "counter");
            let data = self.buf.begin_nest(NFTA_EXPR_DATA);
            self.buf.end_nest(data);
            self.buf.end_nest(expr);
        }
        let initial = self.intervals.get(&(t.clone(), def.name.clone())).cloned().unwrap_or_default();
        if flags & NFT_SET_INTERVAL != 0 && !concat_ranges && !initial.is_empty() {
            // Like nft for a new interval set filled in the same batch: the set's initial
            // content is an interval end at the lowest key (the range below the first element
            // is explicitly outside the set) and the batch's intervals.
            self.buf.end();
            self.begin(NFT_MSG_NEWSETELEM, NLM_F_CREATE, nfproto(t.family));
            self.elem_header(t, &def.name, true);
            let list = self.buf.begin_nest(NFTA_SET_ELEM_LIST_ELEMENTS);
            self.elem(1, &vec![0; key.byte_len() as usize], None, true);
            let mut n = 1;
            for key in &initial {
                let k = lower::element_key(key)?;
                n += 1;
                self.elem(n, &k.start, None, false);
                if let Some(Some(end)) = &k.interval_end {
                    n += 1;
                    self.elem(n, end, None, true);
                }
            }
            self.buf.end_nest(list);
        }
        Ok(())
    }

    /// Creates an anonymous constant set with its elements, as nft does just before the rule
    /// that uses it (two messages); returns its id.
    fn anon_set(&mut self, t: &TableRef, anon: &lower::AnonSet) -> u32 {
        self.next_anon_id += 1;
        let id = self.next_anon_id;
        let key = anon.key.datatype();
        self.begin(NFT_MSG_NEWSET, NLM_F_CREATE, nfproto(t.family));
        self.buf.put_str(NFTA_SET_TABLE, &t.name);
        self.buf.put_str(NFTA_SET_NAME, lower::ANON_SET_NAME);
        self.buf.put_be32(NFTA_SET_FLAGS, NFT_SET_ANONYMOUS | NFT_SET_CONSTANT);
        self.buf.put_be32(NFTA_SET_KEY_TYPE, key.id());
        self.buf.put_be32(NFTA_SET_KEY_LEN, key.byte_len());
        self.buf.put_be32(NFTA_SET_ID, id);
        let n = self.buf.begin_nest(NFTA_SET_DESC);
        self.buf.put_be32(NFTA_SET_DESC_SIZE, anon.elements.len() as u32);
        self.buf.end_nest(n);
        self.buf.put(NFTA_SET_USERDATA, &anon.udata());
        self.buf.end();
        self.begin(NFT_MSG_NEWSETELEM, NLM_F_CREATE, nfproto(t.family));
        self.buf.put_str(NFTA_SET_ELEM_LIST_TABLE, &t.name);
        self.buf.put_str(NFTA_SET_ELEM_LIST_SET, lower::ANON_SET_NAME);
        self.buf.put_be32(NFTA_SET_ELEM_LIST_SET_ID, id);
        let list = self.buf.begin_nest(NFTA_SET_ELEM_LIST_ELEMENTS);
        for (i, key) in anon.elements.iter().enumerate() {
            self.elem(i as u16 + 1, key, None, false);
        }
        self.buf.end_nest(list);
        self.buf.end();
        id
    }

    /// The element list's table and set; additions to a set created in the same batch also
    /// carry its id, deletions only the name (as nft).
    fn elem_header(&mut self, t: &TableRef, set: &str, add: bool) {
        self.buf.put_str(NFTA_SET_ELEM_LIST_TABLE, &t.name);
        self.buf.put_str(NFTA_SET_ELEM_LIST_SET, set);
        if let Some(id) = self.set_id(t, set).filter(|_| add) {
            self.buf.put_be32(NFTA_SET_ELEM_LIST_SET_ID, id);
        }
    }

    /// One element of a list; libnftnl numbers them from 1 (the kernel ignores the number).
    fn elem(&mut self, n: u16, key: &[u8], data: Option<&MapData>, end: bool) {
        self.elem_range(n, key, None, data, end);
    }

    /// An element; `key_end` closes a concatenated range.
    fn elem_range(&mut self, n: u16, key: &[u8], key_end: Option<&[u8]>, data: Option<&MapData>, end: bool) {
        let e = self.buf.begin_nest(n);
        if end {
            self.buf.put_be32(NFTA_SET_ELEM_FLAGS, NFT_SET_ELEM_INTERVAL_END);
        }
        let k = self.buf.begin_nest(NFTA_SET_ELEM_KEY);
        self.buf.put(NFTA_DATA_VALUE, key);
        self.buf.end_nest(k);
        if let Some(key_end) = key_end {
            let k = self.buf.begin_nest(NFTA_SET_ELEM_KEY_END);
            self.buf.put(NFTA_DATA_VALUE, key_end);
            self.buf.end_nest(k);
        }
        if let Some(data) = data {
            let d = self.buf.begin_nest(NFTA_SET_ELEM_DATA);
            match data {
                MapData::Verdict(v) => v.encode(&mut self.buf),
                MapData::Value(bytes) => self.buf.put(NFTA_DATA_VALUE, bytes),
            }
            self.buf.end_nest(d);
        }
        self.buf.end_nest(e);
    }

    fn element(&mut self, t: &TableRef, e: &Element, add: bool) -> Result<(), LowerError> {
        let key = lower::element_key(&e.key)?;
        let data = match (&e.value, add) {
            (Some(v), true) => Some(lower::map_data(v)?),
            _ => None,
        };
        // Ranges keep a message of their own.
        let single = key.key_end.is_none() && key.interval_end.is_none();
        if single && let Some(open) = self.open_elements.as_mut().filter(|o| o.joins(t, &e.set, add, self.buf.len())) {
            open.count += 1;
            let (n, list) = (open.count, self.buf.reopen_nest(open.list_at));
            self.elem_range(n, &key.start, None, data.as_ref(), false);
            self.buf.end_nest(list);
            return Ok(());
        }
        if add {
            self.begin(NFT_MSG_NEWSETELEM, NLM_F_CREATE, nfproto(t.family));
        } else {
            self.begin(NFT_MSG_DELSETELEM, 0, nfproto(t.family));
        }
        self.elem_header(t, &e.set, add);
        let list_at = self.buf.len();
        let list = self.buf.begin_nest(NFTA_SET_ELEM_LIST_ELEMENTS);
        self.elem_range(1, &key.start, key.key_end.as_deref(), data.as_ref(), false);
        if let Some(Some(end)) = &key.interval_end {
            self.elem(2, end, None, true);
        }
        self.buf.end_nest(list);
        if single {
            self.open_elements = Some(OpenElements { table: t.clone(), set: e.set.clone(), add, list_at, count: 1 });
        }
        Ok(())
    }
}

impl OpenElements {
    /// Whether an element of `set` in `table` (`add`: an addition) joins this message, whose
    /// buffer is `len` bytes long so far.
    fn joins(&self, table: &TableRef, set: &str, add: bool, len: usize) -> bool {
        self.add == add
            && self.set == set
            && self.table == *table
            && len - self.list_at < ELEMENTS_PER_MESSAGE_BYTES
            && self.count < u16::MAX
    }
}

/// One operation as nft text, for error messages.
pub fn op_text(op: &Op) -> String {
    let mut t = Transaction::new();
    t.push(op.clone());
    t.render().trim().to_owned()
}

impl Batch {
    /// Encodes `tx`, numbering messages from `first_seq` (the `BATCH_BEGIN`) on. The last
    /// operation's message asks for an acknowledgement, so the sender knows when the kernel is
    /// done; errors are reported for any message regardless.
    pub fn encode(tx: &Transaction, first_seq: u32) -> Result<Batch, EncodeError> {
        let mut enc = Encoder {
            buf: MsgBuf::new(),
            seq: first_seq,
            msg_ops: Vec::with_capacity(tx.len()),
            set_ids: HashMap::new(),
            next_set_id: 0,
            next_anon_id: tx.ops().iter().filter(|op| matches!(op, Op::AddSet(..))).count() as u32,
            index: 0,
            last_msg_start: 0,
            intervals: HashMap::new(),
            range_sets: HashSet::new(),
            map_deps: HashMap::new(),
            open_elements: None,
        };
        for op in tx.ops() {
            // Single-field ranges of a set created in this batch go into its creation (as nft);
            // concatenated ranges are elements of their own.
            if let Op::AddElement(t, e) = op
                && let [Value::Prefix(_)] = e.key.values()
            {
                enc.intervals.entry((t.clone(), e.set.clone())).or_default().push(e.key.clone());
            }
        }
        enc.buf.begin(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, first_seq, NFPROTO_UNSPEC, NFNL_SUBSYS_NFTABLES);
        enc.buf.end();
        for (index, op) in tx.ops().iter().enumerate() {
            enc.index = index as u32;
            enc.op(op).map_err(|source| EncodeError { index, op: op_text(op), source })?;
        }
        if !tx.is_empty() {
            // NLM_F_ACK on the last message (not the first of the last operation's: the sender
            // waits for the acknowledgement of `last_seq`): flags live at bytes 6..8 of its header.
            let start = enc.last_msg_start;
            enc.buf.set_flag(start, NLM_F_ACK);
        }
        enc.seq = enc.seq.wrapping_add(1);
        enc.buf.begin(NFNL_MSG_BATCH_END, NLM_F_REQUEST, enc.seq, NFPROTO_UNSPEC, NFNL_SUBSYS_NFTABLES);
        enc.buf.end();
        Ok(Batch { buf: enc.buf, first_seq, msg_ops: enc.msg_ops, ops: tx.len() })
    }

    /// Renumbers the batch's messages from `first_seq` on (one encoded ahead of time, before
    /// the socket's next sequence number was known).
    pub fn resequence(&mut self, first_seq: u32) {
        let shift = first_seq.wrapping_sub(self.first_seq);
        self.buf.shift_seqs(shift);
        self.first_seq = first_seq;
    }

    /// The bytes to send.
    pub fn bytes(&self) -> &[u8] {
        self.buf.bytes()
    }

    /// Sequence number of `BATCH_BEGIN`.
    pub fn first_seq(&self) -> u32 {
        self.first_seq
    }

    /// Sequence number of the last operation's message (the one that is acknowledged).
    pub fn last_seq(&self) -> u32 {
        self.first_seq.wrapping_add(self.msg_ops.len() as u32)
    }

    /// Sequence number of `BATCH_END`.
    pub fn end_seq(&self) -> u32 {
        self.last_seq().wrapping_add(1)
    }

    /// Number of messages between `BEGIN` and `END`.
    pub fn messages(&self) -> usize {
        self.msg_ops.len()
    }

    /// The indexes of the operations that message `seq` encodes: one, or a run of elements of
    /// one set.
    pub fn ops_for_seq(&self, seq: u32) -> Option<std::ops::Range<usize>> {
        let i = seq.wrapping_sub(self.first_seq).checked_sub(1)? as usize;
        let first = *self.msg_ops.get(i)? as usize;
        // An operation may also take several messages (a rule's anonymous sets).
        let end = self.msg_ops.get(i + 1).map_or(self.ops, |&next| next as usize);
        Some(first..end.max(first + 1))
    }
}

/// A comment as nft stores it in a table's or rule's userdata: one TLV of type 0 (the comment)
/// holding the NUL-terminated text, so `nft list` shows it as `comment "…"`.
pub(crate) fn comment_udata(comment: &str) -> Vec<u8> {
    let mut text = comment.replace('"', "").into_bytes();
    text.truncate(254);
    text.push(0);
    let mut u = vec![UDATA_COMMENT, text.len() as u8];
    u.extend_from_slice(&text);
    u
}

/// The comment in userdata written by [`comment_udata`] (or by nft).
pub(crate) fn udata_comment(udata: &[u8]) -> Option<String> {
    let mut rest = udata;
    while let [kind, len, tail @ ..] = rest {
        let value = tail.get(..usize::from(*len))?;
        if *kind == UDATA_COMMENT {
            return Some(String::from_utf8_lossy(value.strip_suffix(&[0]).unwrap_or(value)).into_owned());
        }
        rest = &tail[usize::from(*len)..];
    }
    None
}

/// `NFTNL_UDATA_{TABLE,RULE}_COMMENT`.
const UDATA_COMMENT: u8 = 0;

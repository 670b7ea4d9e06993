//! Reads back the counters kproxy asks the kernel for besides drift checks, with one dump and no
//! `nft`: the packets that the `counter` statements of a chain's rules have counted (the
//! acceleration table counts offloaded connections so), and the counters of the elements of a
//! set declared with `counter` (per-Service counters).

use std::io;

use kproxy_nft_model::{Key, TableRef};

use crate::NetlinkExecutor;
use crate::batch::nfproto;
use crate::sys::*;
use crate::wire::Attrs;

/// `NFTA_COUNTER_BYTES` (a big-endian u64).
const NFTA_COUNTER_BYTES: u16 = 1;
/// `NFTA_COUNTER_PACKETS` (a big-endian u64).
const NFTA_COUNTER_PACKETS: u16 = 2;

/// What one counter counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counted {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// The counters of the elements of `set` with these `keys`, in order: `None` for a key the set
/// does not hold (or holds without a counter). One dump of the set's elements.
pub fn element_counters(
    exec: &mut NetlinkExecutor,
    table: &TableRef,
    set: &str,
    keys: &[Key],
) -> io::Result<Vec<Option<Counted>>> {
    let mut counted: std::collections::HashMap<Vec<u8>, Counted> = std::collections::HashMap::new();
    exec.on_socket(|sock| {
        crate::listing::dump_set_elements(sock, nfproto(table.family), &table.name, set, |msg| {
            counted.extend(element_counts(msg))
        })
    })?;
    Ok(keys
        .iter()
        .map(|k| crate::lower::element_key(k).ok().and_then(|bytes| counted.get(&bytes.start).copied()))
        .collect())
}

/// The key bytes and counter of each element of one set-element message.
pub fn element_counts(msg: &[u8]) -> Vec<(Vec<u8>, Counted)> {
    let elements = Attrs(msg).filter(|a| a.kind == NFTA_SET_ELEM_LIST_ELEMENTS).flat_map(|a| a.nested());
    elements
        .filter_map(|elem| {
            let key = elem.nested().find(|a| a.kind == NFTA_SET_ELEM_KEY)?;
            let key = key.nested().find(|a| a.kind == NFTA_DATA_VALUE)?.data.to_vec();
            // One expression comes as NFTA_SET_ELEM_EXPR, several as a list.
            let single = elem.nested().filter(|a| a.kind == NFTA_SET_ELEM_EXPR);
            let listed = elem.nested().filter(|a| a.kind == NFTA_SET_ELEM_EXPRESSIONS).flat_map(|a| a.nested());
            let counter = single.chain(listed).find_map(|expr| {
                let name = expr.nested().find(|a| a.kind == NFTA_EXPR_NAME)?.str();
                let data = expr.nested().find(|a| a.kind == NFTA_EXPR_DATA)?;
                let field = |kind| data.nested().find(|a| a.kind == kind).and_then(|a| a.be64());
                (name == "counter").then(|| Counted {
                    packets: field(NFTA_COUNTER_PACKETS).unwrap_or(0),
                    bytes: field(NFTA_COUNTER_BYTES).unwrap_or(0),
                })
            })?;
            Some((key, counter))
        })
        .collect()
}

/// The packets counted by every `counter` statement of the rules of `chain`, added up; `None`
/// when the chain has no counter (a missing table or chain dumps as no rules).
pub fn chain_packets(exec: &mut NetlinkExecutor, table: &TableRef, chain: &str) -> io::Result<Option<u64>> {
    let mut total: Option<u64> = None;
    let (table_name, chain_name) = (table.name.clone(), chain.to_owned());
    exec.on_socket(|sock| {
        sock.dump(
            NFT_MSG_GETRULE,
            nfproto(table.family),
            move |m| {
                m.put_str(NFTA_RULE_TABLE, &table_name);
                m.put_str(NFTA_RULE_CHAIN, &chain_name);
            },
            |rule| {
                for packets in rule_packets(rule) {
                    total = Some(total.unwrap_or(0).saturating_add(packets));
                }
            },
        )
    })?;
    Ok(total)
}

/// The packets of each counter among one rule message's expressions.
pub fn rule_packets(rule: &[u8]) -> Vec<u64> {
    let exprs = Attrs(rule).filter(|a| a.kind == NFTA_RULE_EXPRESSIONS).flat_map(|a| a.nested());
    exprs
        .filter_map(|elem| {
            let name = elem.nested().find(|a| a.kind == NFTA_EXPR_NAME)?.str();
            let data = elem.nested().find(|a| a.kind == NFTA_EXPR_DATA)?;
            (name == "counter").then(|| data.nested().find(|a| a.kind == NFTA_COUNTER_PACKETS)?.be64())?
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::wire::MsgBuf;

    /// A rule message as the kernel dumps it: a counter that saw 42 packets, then a verdict.
    #[test]
    fn counters_are_read_from_the_rule_expressions() {
        let mut m = MsgBuf::new();
        m.begin_nft(NFT_MSG_NEWRULE, 0, 1, NFPROTO_INET);
        m.put_str(NFTA_RULE_TABLE, "t");
        m.put_str(NFTA_RULE_CHAIN, "c");
        let exprs = m.begin_nest(NFTA_RULE_EXPRESSIONS);
        for (name, packets) in [("counter", Some(42u64)), ("immediate", None)] {
            let elem = m.begin_nest(NFTA_LIST_ELEM);
            m.put_str(NFTA_EXPR_NAME, name);
            let data = m.begin_nest(NFTA_EXPR_DATA);
            if let Some(p) = packets {
                m.put_be64(1, 9000);
                m.put_be64(NFTA_COUNTER_PACKETS, p);
            }
            m.end_nest(data);
            m.end_nest(elem);
        }
        m.end_nest(exprs);
        m.end();
        let payload = crate::socket::messages(m.bytes()).next().unwrap().payload[4..].to_vec();
        assert_eq!(rule_packets(&payload), vec![42]);
        assert_eq!(rule_packets(&[]), Vec::<u64>::new());
    }

    /// A set-element message as the kernel dumps it: one element with its counter, one without.
    #[test]
    fn element_counters_are_read_with_their_keys() {
        let mut m = MsgBuf::new();
        m.begin_nft(NFT_MSG_NEWSETELEM, 0, 1, NFPROTO_INET);
        m.put_str(NFTA_SET_ELEM_LIST_TABLE, "t");
        let list = m.begin_nest(NFTA_SET_ELEM_LIST_ELEMENTS);
        for (key, counted) in [([1u8, 2, 3, 4], Some((7u64, 420u64))), ([5, 6, 7, 8], None)] {
            let elem = m.begin_nest(NFTA_LIST_ELEM);
            let k = m.begin_nest(NFTA_SET_ELEM_KEY);
            m.put(NFTA_DATA_VALUE, &key);
            m.end_nest(k);
            if let Some((packets, bytes)) = counted {
                let expr = m.begin_nest(NFTA_SET_ELEM_EXPR);
                m.put_str(NFTA_EXPR_NAME, "counter");
                let data = m.begin_nest(NFTA_EXPR_DATA);
                m.put_be64(NFTA_COUNTER_BYTES, bytes);
                m.put_be64(NFTA_COUNTER_PACKETS, packets);
                m.end_nest(data);
                m.end_nest(expr);
            }
            m.end_nest(elem);
        }
        m.end_nest(list);
        m.end();
        let payload = crate::socket::messages(m.bytes()).next().unwrap().payload[4..].to_vec();
        assert_eq!(element_counts(&payload), vec![(vec![1, 2, 3, 4], Counted { packets: 7, bytes: 420 })]);
    }
}

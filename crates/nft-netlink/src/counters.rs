//! Reads back the one kind of state kproxy asks the kernel for besides drift checks: the
//! packets that the `counter` statements of a chain's rules have counted (the acceleration
//! table counts offloaded connections so), with one rule dump and no `nft`.

use std::io;

use kproxy_nft_model::TableRef;

use crate::NetlinkExecutor;
use crate::batch::nfproto;
use crate::sys::*;
use crate::wire::{Attr, Attrs};

/// `NFTA_COUNTER_PACKETS` (a big-endian u64).
const NFTA_COUNTER_PACKETS: u16 = 2;

/// The packets counted by every `counter` statement of the rules of `chain`, added up; `None`
/// when the chain has no counter (a missing table or chain dumps as no rules).
pub fn chain_packets(exec: &mut NetlinkExecutor, table: &TableRef, chain: &str) -> io::Result<Option<u64>> {
    let sock = exec.socket()?;
    let mut total: Option<u64> = None;
    let (table_name, chain_name) = (table.name.clone(), chain.to_owned());
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
    )?;
    Ok(total)
}

/// The packets of each counter among one rule message's expressions.
fn rule_packets(rule: &[u8]) -> Vec<u64> {
    let exprs = Attrs(rule).filter(|a| a.kind == NFTA_RULE_EXPRESSIONS).flat_map(|a| a.nested());
    exprs
        .filter_map(|elem| {
            let name = elem.nested().find(|a| a.kind == NFTA_EXPR_NAME)?.str();
            let data = elem.nested().find(|a| a.kind == NFTA_EXPR_DATA)?;
            (name == "counter").then(|| be64(data.nested().find(|a| a.kind == NFTA_COUNTER_PACKETS)?))?
        })
        .collect()
}

fn be64(a: Attr<'_>) -> Option<u64> {
    a.data.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes)
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
}

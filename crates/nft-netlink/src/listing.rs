//! One netlink listing of a table: the [`TableListing`] summary (chains with their rule counts,
//! named sets with their element counts) read from the kernel.

use std::io;

use kproxy_nft_model::{TableFamily, TableListing, TableRef};

use crate::NetlinkExecutor;
use crate::batch::nfproto;
use crate::socket::NfSocket;
use crate::sys::*;
use crate::wire::Attrs;

fn attr_str(payload: &[u8], kind: u16) -> Option<String> {
    Attrs(payload).find(|a| a.kind == kind).map(|a| a.str())
}

/// How many times a listing is tried when another process commits while it is read.
const LISTING_ATTEMPTS: usize = 5;

/// Lists `table` with four dumps (chains, rules, sets, then, if `count_elements`, the elements
/// of each static set; else their counts are `None`).
/// A missing table lists as empty (the kernel answers dumps filtered by it with `ENOENT`).
///
/// The dumps are separate requests, so a commit by another process between them (or during one:
/// the kernel flags the dump `NLM_F_DUMP_INTR`) would give a summary of no single ruleset, and
/// the periodic check would "repair" drift that is not there. So the ruleset generation is read
/// before and after, and a listing that straddles a commit, or an interrupted or overrun dump
/// (`ENOBUFS`), is read again. When the last attempt still met a commit, the error is
/// [`io::ErrorKind::Interrupted`]: the kernel never held still, and no listing is given.
pub fn list_table(exec: &mut NetlinkExecutor, table: &TableRef, count_elements: bool) -> io::Result<TableListing> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match list_once(exec, table, count_elements) {
            // An overrun socket was dropped (`NetlinkExecutor::on_socket`): the next is fresh.
            Err(e) if is_transient(&e) && attempt < LISTING_ATTEMPTS => {}
            other => return other,
        }
    }
}

/// One listing between two reads of the ruleset generation; `Interrupted` when they differ.
fn list_once(exec: &mut NetlinkExecutor, table: &TableRef, count_elements: bool) -> io::Result<TableListing> {
    let before = exec.on_socket(NfSocket::generation)?;
    let listing = match exec.on_socket(|sock| dump_table(sock, table, count_elements)) {
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => TableListing::default(),
        other => other?,
    };
    if exec.on_socket(NfSocket::generation)? != before {
        return Err(io::Error::new(io::ErrorKind::Interrupted, "another process committed while the table was listed"));
    }
    Ok(listing)
}

/// A listing worth taking again: it met a commit, or its socket was overrun (`ENOBUFS`).
fn is_transient(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Interrupted || e.raw_os_error() == Some(nix::libc::ENOBUFS)
}

fn dump_table(sock: &mut NfSocket, table: &TableRef, count_elements: bool) -> io::Result<TableListing> {
    let family = nfproto(table.family);
    let mut l = TableListing::default();
    let name = table.name.as_str();
    let put_table = |kind: u16| move |m: &mut crate::wire::MsgBuf| m.put_str(kind, name);
    sock.dump(NFT_MSG_GETCHAIN, family, put_table(NFTA_CHAIN_TABLE), |p| {
        if let Some(c) = chain_of(p, name) {
            l.chains.entry(c).or_insert(0);
        }
    })?;
    sock.dump(NFT_MSG_GETRULE, family, put_table(NFTA_RULE_TABLE), |p| {
        if let Some(c) = rule_chain_of(p, name) {
            let rules = l.chains.entry(c.clone()).or_insert(0);
            // The dump lists each chain's rules in order: the first one seen is the first.
            if *rules == 0
                && let Some(comment) = rule_comment(p)
            {
                l.first_comments.insert(c, comment);
            }
            *rules += 1;
        }
    })?;
    let mut sets = Vec::new();
    sock.dump(NFT_MSG_GETSET, family, put_table(NFTA_SET_TABLE), |p| sets.extend(set_of(p, name)))?;
    for (set, dynamic) in sets {
        if dynamic || !count_elements {
            l.sets.insert(set, None);
            continue;
        }
        let mut n = 0;
        dump_set_elements(sock, family, name, &set, |p| n += element_count(p))?;
        l.sets.insert(set, Some(n));
    }
    Ok(l)
}

/// The chain one message of a chain dump names, when it is of table `table`.
pub fn chain_of(payload: &[u8], table: &str) -> Option<String> {
    (attr_str(payload, NFTA_CHAIN_TABLE).as_deref() == Some(table)).then(|| attr_str(payload, NFTA_CHAIN_NAME))?
}

/// The chain of the rule one message of a rule dump holds, when it is of table `table`.
pub fn rule_chain_of(payload: &[u8], table: &str) -> Option<String> {
    (attr_str(payload, NFTA_RULE_TABLE).as_deref() == Some(table)).then(|| attr_str(payload, NFTA_RULE_CHAIN))?
}

/// The comment of the rule one message of a rule dump holds.
pub fn rule_comment(payload: &[u8]) -> Option<String> {
    Attrs(payload).find(|a| a.kind == NFTA_RULE_USERDATA).and_then(|a| crate::batch::udata_comment(a.data))
}

/// The named set one message of a set dump holds, when it is of table `table`, and whether it
/// is dynamic (its elements are the packet path's, not counted). A rule's anonymous set
/// (`meta l4proto { tcp, udp }`) is part of that rule, which the rule count covers; it is not
/// one of the table's sets.
pub fn set_of(payload: &[u8], table: &str) -> Option<(String, bool)> {
    if attr_str(payload, NFTA_SET_TABLE).as_deref() != Some(table) {
        return None;
    }
    let name = attr_str(payload, NFTA_SET_NAME)?;
    let flags = Attrs(payload).find(|a| a.kind == NFTA_SET_FLAGS).and_then(|a| a.be32()).unwrap_or(0);
    (flags & NFT_SET_ANONYMOUS == 0).then_some((name, flags & NFT_SET_EVAL != 0))
}

/// How many elements one message of a set element dump holds.
pub fn element_count(payload: &[u8]) -> usize {
    Attrs(payload).find(|a| a.kind == NFTA_SET_ELEM_LIST_ELEMENTS).map_or(0, |list| list.nested().count())
}

/// Every `ip`, `ip6` and `inet` table of the network namespace, whoever made it (one
/// `NFT_MSG_GETTABLE` dump of every family): how kproxy finds another program's tables
/// (kube-proxy's `kube-proxy`, iptables-nft's `nat`/`filter`/`mangle`) without changing anything.
pub fn tables(exec: &mut NetlinkExecutor) -> io::Result<Vec<TableRef>> {
    let mut out = Vec::new();
    exec.on_socket(|sock| {
        sock.dump_families(
            NFNL_SUBSYS_NFTABLES,
            NFT_MSG_GETTABLE,
            NFPROTO_UNSPEC,
            |_| {},
            |family, p| {
                let family = match family {
                    NFPROTO_IPV4 => TableFamily::Ip,
                    NFPROTO_IPV6 => TableFamily::Ip6,
                    NFPROTO_INET => TableFamily::Inet,
                    _ => return,
                };
                if let Some(name) = attr_str(p, NFTA_TABLE_NAME) {
                    out.push(TableRef { family, name });
                }
            },
        )
    })?;
    out.sort();
    out.dedup();
    Ok(out)
}

/// The names of `table`'s chains (one `NFT_MSG_GETCHAIN` dump, no rules): enough to tell whose
/// chains an iptables-nft table holds without `iptables-nft-save`, which reads the whole ruleset.
/// A missing table has none.
pub fn chain_names(exec: &mut NetlinkExecutor, table: &TableRef) -> io::Result<Vec<String>> {
    let family = nfproto(table.family);
    let name = table.name.clone();
    let mut out = Vec::new();
    let dumped = exec.on_socket(|sock| {
        sock.dump(
            NFT_MSG_GETCHAIN,
            family,
            |m| m.put_str(NFTA_CHAIN_TABLE, &name),
            |p| {
                if attr_str(p, NFTA_CHAIN_TABLE).as_deref() == Some(name.as_str())
                    && let Some(c) = attr_str(p, NFTA_CHAIN_NAME)
                {
                    out.push(c);
                }
            },
        )
    });
    match dumped {
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => Ok(Vec::new()),
        other => other.map(|()| out),
    }
}

/// Dumps the elements of set `set` of table `table` (family `family`): `each` gets every reply
/// message's payload.
pub(crate) fn dump_set_elements(
    sock: &mut NfSocket,
    family: u8,
    table: &str,
    set: &str,
    each: impl FnMut(&[u8]),
) -> io::Result<()> {
    let (table, set) = (table.to_owned(), set.to_owned());
    let request = move |m: &mut crate::wire::MsgBuf| {
        m.put_str(NFTA_SET_ELEM_LIST_TABLE, &table);
        m.put_str(NFTA_SET_ELEM_LIST_SET, &set);
    };
    sock.dump(NFT_MSG_GETSETELEM, family, request, each)
}

//! Elements as comparable identities: the key and data bytes the kernel stores, read back from a
//! dump or computed from the model, so a restart can tell which elements a set already holds and
//! add only the missing ones instead of flushing and refilling it (see `kproxy_nftables::kernel`).
//!
//! Only plain elements have an identity: a set holding interval ends or concatenated ranges has
//! none, and the caller rewrites it whole.

use std::collections::BTreeSet;
use std::io;

use kproxy_nft_model::{Element, TableRef};

use crate::executor::NetlinkExecutor;
use crate::listing::dump_set_elements;
use crate::lower::{ElementKey, MapData, element_key, map_data};
use crate::sys::*;
use crate::wire::{Attr, Attrs};

const DATA_MARK: u8 = 0xfe;
const VERDICT_MARK: u8 = 0xff;

/// `[key length] key [DATA_MARK value | VERDICT_MARK code chain]`: the key comes first, with its
/// length, so [`identity_key`] can take it back out for a deletion.
fn identity(key: &[u8], value: Option<&[u8]>, verdict: Option<(u32, &str)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + key.len());
    out.push(key.len() as u8);
    out.extend_from_slice(key);
    if let Some(v) = value {
        out.push(DATA_MARK);
        out.extend_from_slice(v);
    }
    if let Some((code, chain)) = verdict {
        out.push(VERDICT_MARK);
        out.extend_from_slice(&code.to_be_bytes());
        out.extend_from_slice(chain.as_bytes());
    }
    out
}

/// The key bytes of an identity made by this module (`None` for anything else).
pub fn identity_key(identity: &[u8]) -> Option<&[u8]> {
    let (len, rest) = identity.split_first()?;
    rest.get(..usize::from(*len))
}

/// The identity of a model element; `None` for a range (interval or concatenated range).
pub fn element_identity(e: &Element) -> Option<Vec<u8>> {
    let ElementKey { start, interval_end: None, key_end: None } = element_key(&e.key).ok()? else {
        return None;
    };
    Some(match e.value.as_ref().map(map_data).transpose().ok()? {
        None => identity(&start, None, None),
        Some(MapData::Value(v)) => identity(&start, Some(&v), None),
        Some(MapData::Verdict(v)) => {
            let chain = match &v {
                crate::expr::Verdict::Jump(c) | crate::expr::Verdict::Goto(c) => c.as_str(),
                _ => "",
            };
            identity(&start, None, Some((v.code(), chain)))
        }
    })
}

fn value_of(a: Attr<'_>) -> Option<&[u8]> {
    a.nested().find(|d| d.kind == NFTA_DATA_VALUE).map(|d| d.data)
}

/// The identity of one dumped `NFTA_LIST_ELEM`; `None` for an interval end or a range.
fn dumped_identity(elem: Attr<'_>) -> Option<Vec<u8>> {
    let attrs = || elem.nested();
    if attrs().any(|a| a.kind == NFTA_SET_ELEM_KEY_END)
        || attrs().any(|a| a.kind == NFTA_SET_ELEM_FLAGS && a.be32().is_some_and(|f| f != 0))
    {
        return None;
    }
    let key = value_of(attrs().find(|a| a.kind == NFTA_SET_ELEM_KEY)?)?;
    let Some(data) = attrs().find(|a| a.kind == NFTA_SET_ELEM_DATA) else {
        return Some(identity(key, None, None));
    };
    if let Some(v) = value_of(data) {
        return Some(identity(key, Some(v), None));
    }
    let verdict = data.nested().find(|d| d.kind == NFTA_DATA_VERDICT)?;
    let code = verdict.nested().find(|a| a.kind == NFTA_VERDICT_CODE)?.be32()?;
    let chain = verdict.nested().find(|a| a.kind == NFTA_VERDICT_CHAIN).map(|a| a.str()).unwrap_or_default();
    Some(identity(key, None, Some((code, &chain))))
}

/// The identities of every element of `set`; `None` when one of them has none (a set of ranges).
pub fn set_identities(
    exec: &mut NetlinkExecutor,
    table: &TableRef,
    set: &str,
) -> io::Result<Option<BTreeSet<Vec<u8>>>> {
    let family = crate::batch::nfproto(table.family);
    let mut out = Some(BTreeSet::new());
    exec.on_socket(|sock| {
        dump_set_elements(sock, family, &table.name, set, |p| {
            let Some(list) = Attrs(p).find(|a| a.kind == NFTA_SET_ELEM_LIST_ELEMENTS) else { return };
            for elem in list.nested().filter(|a| a.kind == NFTA_LIST_ELEM) {
                match (dumped_identity(elem), out.as_mut()) {
                    (Some(id), Some(ids)) => {
                        ids.insert(id);
                    }
                    _ => out = None,
                }
            }
        })
    })?;
    Ok(out)
}

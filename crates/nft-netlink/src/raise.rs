//! Elements read back from the kernel into the typed model: the inverse of [`crate::lower`]'s
//! [`element_key`](crate::lower::element_key) and [`map_data`](crate::lower::map_data) for
//! plain elements (no ranges, no verdicts) of sets declared with the datatypes kproxy uses.
//!
//! Why: a restarted kproxy reads which endpoint each slot of its endpoints maps holds
//! (`kproxy_nftables::ruleset::pick::Slots`), so that it keeps them where they are instead of
//! numbering the endpoints afresh and rewriting every slot of every Service that changed since.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kproxy_nft_model::{Element, Key, MapData as ModelData, SetDef, SetType, TableRef, Value};
use kproxy_state::Protocol;

use crate::executor::NetlinkExecutor;
use crate::listing::dump_set_elements;
use crate::lower::{DataType, Typeof};
use crate::sys::*;
use crate::wire::{Attr, Attrs};

/// The datatypes of a set's key and, for a map, of its value data; `None` for a type this
/// module does not read (a verdict map, a mark).
pub fn field_types(set: &SetDef) -> Option<(Vec<DataType>, Option<Vec<DataType>>)> {
    let of_fields = |fields: &[kproxy_nft_model::Field]| -> Option<Vec<DataType>> {
        Some(Typeof::new(fields).ok()?.0.iter().map(|e| e.datatype()).collect())
    };
    match &set.ty {
        SetType::Typeof { key, data } => {
            let data = match data {
                Some(d) => Some(of_fields(d)?),
                None => None,
            };
            Some((of_fields(key)?, data))
        }
        SetType::Named { key, data } => {
            let key = key.iter().map(|t| DataType::of(*t).ok()).collect::<Option<Vec<_>>>()?;
            let data = match data {
                Some(d) => Some(vec![DataType::of(*d).ok()?]),
                None => None,
            };
            Some((key, data))
        }
    }
}

fn protocol(number: u8) -> Option<Protocol> {
    match number {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

/// The values `bytes` hold as fields of `types`: each field of a concatenation takes whole
/// 32-bit registers, a single one its own length. `None` when the bytes do not fit the types.
pub fn values(types: &[DataType], bytes: &[u8]) -> Option<Vec<Value>> {
    let concat = types.len() > 1;
    let mut at = 0;
    let mut out = Vec::with_capacity(types.len());
    for t in types {
        let len = t.byte_len() as usize;
        let field = bytes.get(at..at + len)?;
        out.push(match t {
            DataType::Ipv4 => Value::Addr(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(field).ok()?))),
            DataType::Ipv6 => Value::Addr(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(field).ok()?))),
            DataType::Proto => Value::Proto(protocol(field[0])?),
            DataType::Service => Value::Port(u16::from_be_bytes(field.try_into().ok()?)),
            // The host-order register a numgen leaves.
            DataType::Integer => Value::Int(u32::from_ne_bytes(field.try_into().ok()?)),
        });
        at += if concat { len.div_ceil(4) * 4 } else { len };
    }
    (at == bytes.len()).then_some(out)
}

fn value_of(a: Attr<'_>) -> Option<&[u8]> {
    a.nested().find(|d| d.kind == NFTA_DATA_VALUE).map(|d| d.data)
}

/// One dumped `NFTA_LIST_ELEM` of set `name` as a model element; `None` for a range, a
/// verdict, or bytes that do not fit the types.
fn element(elem: Attr<'_>, name: &str, key: &[DataType], data: Option<&[DataType]>) -> Option<Element> {
    let attrs = || elem.nested();
    if attrs().any(|a| a.kind == NFTA_SET_ELEM_KEY_END)
        || attrs().any(|a| a.kind == NFTA_SET_ELEM_FLAGS && a.be32().is_some_and(|f| f != 0))
    {
        return None;
    }
    let key = Key(values(key, value_of(attrs().find(|a| a.kind == NFTA_SET_ELEM_KEY)?)?)?);
    let value = match (data, attrs().find(|a| a.kind == NFTA_SET_ELEM_DATA)) {
        (None, None) => None,
        (Some(types), Some(d)) => Some(ModelData::Value(Key(values(types, value_of(d)?)?))),
        _ => return None,
    };
    Some(Element { set: name.to_owned(), key, value })
}

/// Every element of `set` in `table`; `None` when one of them does not read back (see
/// [`element`]) or the set's type is not one this module reads. A missing set has no element.
pub fn set_elements(exec: &mut NetlinkExecutor, table: &TableRef, set: &SetDef) -> io::Result<Option<Vec<Element>>> {
    let Some((key, data)) = field_types(set) else { return Ok(None) };
    let family = crate::batch::nfproto(table.family);
    let mut out = Some(Vec::new());
    let dumped = exec.on_socket(|sock| {
        dump_set_elements(sock, family, &table.name, &set.name, |p| {
            let Some(list) = Attrs(p).find(|a| a.kind == NFTA_SET_ELEM_LIST_ELEMENTS) else { return };
            for elem in list.nested().filter(|a| a.kind == NFTA_LIST_ELEM) {
                match (element(elem, &set.name, &key, data.as_deref()), out.as_mut()) {
                    (Some(e), Some(elements)) => elements.push(e),
                    _ => out = None,
                }
            }
        })
    });
    match dumped {
        Ok(()) => Ok(out),
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOENT) => Ok(Some(Vec::new())),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::{MapData, element_key, map_data};
    use kproxy_nft_model::Field;
    use kproxy_state::IpFamily;

    fn endpoints_map(family: IpFamily) -> SetDef {
        let key = vec![Field::Daddr(family), Field::L4Proto, Field::ThDport, Field::Numgen(2)];
        let data = Some(vec![Field::Daddr(family), Field::Dport(Protocol::Tcp)]);
        SetDef::new("cluster-tcp-endpoints", SetType::Typeof { key, data })
    }

    #[test]
    fn an_endpoints_map_element_reads_back_as_it_was_lowered() {
        for (family, dest, ep) in [
            (IpFamily::V4, "198.18.128.10".parse::<IpAddr>().unwrap(), "198.18.16.2".parse::<IpAddr>().unwrap()),
            (IpFamily::V6, "fd00:96::10".parse().unwrap(), "fd00:16::2".parse().unwrap()),
        ] {
            let set = endpoints_map(family);
            let (key_types, data_types) = field_types(&set).unwrap();
            let key = Key(vec![Value::Addr(dest), Value::Proto(Protocol::Udp), Value::Port(53), Value::Int(4097)]);
            let data = Key(vec![Value::Addr(ep), Value::Port(5353)]);
            let key_bytes = element_key(&key).unwrap().start;
            let Ok(MapData::Value(data_bytes)) = map_data(&ModelData::Value(data.clone())) else { panic!() };
            assert_eq!(values(&key_types, &key_bytes), Some(key.0));
            assert_eq!(values(data_types.as_deref().unwrap(), &data_bytes), Some(data.0));
            // Bytes that do not fit: too short, too long, an unknown protocol.
            assert_eq!(values(&key_types, &key_bytes[1..]), None);
            assert_eq!(values(data_types.as_deref().unwrap(), &[data_bytes.clone(), vec![0; 4]].concat()), None);
            let mut bad = key_bytes.clone();
            bad[if family == IpFamily::V4 { 4 } else { 16 }] = 99;
            assert_eq!(values(&key_types, &bad), None);
        }
    }

    #[test]
    fn a_set_of_one_named_type_reads_without_padding() {
        let set = SetDef::of("cluster-cap-8", vec![kproxy_nft_model::DataType::InetProto]);
        let (key, data) = field_types(&set).unwrap();
        assert_eq!(data, None);
        assert_eq!(values(&key, &[17]), Some(vec![Value::Proto(Protocol::Udp)]));
        // A verdict map is not read.
        let vmap = SetDef::new(
            "service-ips",
            SetType::Named {
                key: vec![kproxy_nft_model::DataType::Ipv4Addr],
                data: Some(kproxy_nft_model::DataType::Verdict),
            },
        );
        assert_eq!(field_types(&vmap), None);
    }
}

//! What the kernel holds, asked over nf_tables netlink from the node namespace: the benchmark's
//! only witness of what kproxy programmed (never kproxy's log or metrics).
//!
//! A poll must cost microseconds at any scale, so the hot probes are point lookups: one chain by
//! name (`NFT_MSG_GETCHAIN`), one map element by key (`NFT_MSG_GETSETELEM` without a dump,
//! what `nft get element` sends). Only the completeness check after the first sync dumps a
//! whole map.

use std::collections::{HashMap, HashSet, hash_map};
use std::io;
use std::net::IpAddr;

use kproxy_nft_model::{Key, MapData as ModelData, Value};
use kproxy_nft_netlink::lower::{MapData, element_key, map_data};
use kproxy_nft_netlink::socket::{NfSocket, messages};
use kproxy_nft_netlink::sys::*;
use kproxy_nft_netlink::wire::{Attrs, MsgBuf};
use kproxy_nftables::ruleset::pick;
use kproxy_state::Protocol;
use netlink_sys::protocols::NETLINK_NETFILTER;
use netlink_sys::{Socket, SocketAddr};

/// kproxy's table name (both families).
pub const TABLE: &str = "kproxy";
/// A hooked base chain of kproxy's tables: it exists only once the ruleset is live.
pub const HOOKED_CHAIN: &str = "nat-prerouting";
/// The map holding the endpoints of a TCP ClusterIP of the cluster traffic policy with
/// `endpoints` endpoints, keyed by `address . proto . port . slot`: each cap (the count rounded
/// up to a power of two) has its own (`kproxy_nftables::ruleset::pick`).
pub fn cluster_tcp_endpoints(endpoints: usize) -> String {
    pick::endpoints_map_of(pick::Class::Cluster, false, Protocol::Tcp, endpoints)
}

/// Every cap's cluster TCP endpoints map, smallest cap first.
pub fn all_cluster_tcp_endpoints() -> impl Iterator<Item = String> {
    (0..=pick::MAX_CAP_LOG2).map(|k| cluster_tcp_endpoints(1 << k))
}

/// Whether `set` is one of the maps of [`cluster_tcp_endpoints`].
pub fn is_cluster_tcp_endpoints(set: &str) -> bool {
    all_cluster_tcp_endpoints().any(|map| map == set)
}

/// A key of a named map in the probe's table of `ip`'s family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapKey {
    pub ip: IpAddr,
    pub map: String,
    pub key: Vec<u8>,
}

impl MapKey {
    /// Slot `slot` of the TCP ClusterIP `ip:port` of a Service with `endpoints` endpoints.
    pub fn endpoint(ip: IpAddr, port: u16, slot: u32, endpoints: usize) -> MapKey {
        MapKey { ip, map: cluster_tcp_endpoints(endpoints), key: endpoint_key(ip, port, slot) }
    }
}

/// Whether some rule (a netlink payload) holds `needle`.
pub fn mention(rules: &[Vec<u8>], needle: &[u8]) -> bool {
    rules.iter().any(|r| r.windows(needle.len()).any(|w| w == needle))
}

/// The bytes of an address as rules hold them.
pub fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// nf_tables family of an address.
fn nfproto_of(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { NFPROTO_IPV4 } else { NFPROTO_IPV6 }
}

/// The key of slot `slot` of the TCP destination `ip:port` in an endpoints map.
pub fn endpoint_key(ip: IpAddr, port: u16, slot: u32) -> Vec<u8> {
    // The renderer's key, lowered by the executor: the same bytes kproxy sends.
    let key = Key(vec![Value::Addr(ip), Value::Proto(Protocol::Tcp), Value::Port(port), Value::Int(slot)]);
    element_key(&key).map(|k| k.start).unwrap_or_default()
}

/// The data of an endpoints-map element pointing at `ip:port`.
pub fn endpoint_data(ip: IpAddr, port: u16) -> Vec<u8> {
    match map_data(&ModelData::Value(Key(vec![Value::Addr(ip), Value::Port(port)]))) {
        Ok(MapData::Value(v)) => v,
        _ => Vec::new(),
    }
}

/// Point lookups and map dumps on one netlink socket, in the namespace of the thread that opened it.
#[derive(Debug)]
pub struct KernelProbe {
    sock: Socket,
    dumper: NfSocket,
    buf: Vec<u8>,
    seq: u32,
    /// The nf_tables table looked into (both families): kproxy's, or upstream's `kube-proxy`.
    table: &'static str,
}

impl KernelProbe {
    /// Opens the sockets in the calling thread's network namespace.
    pub fn open() -> io::Result<Self> {
        let mut sock = Socket::new(NETLINK_NETFILTER)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        sock.set_ext_ack(true)?;
        Ok(Self { sock, dumper: NfSocket::open()?, buf: Vec::with_capacity(1 << 16), seq: 0, table: TABLE })
    }

    /// As [`KernelProbe::open`], looking into the tables named `table` instead of kproxy's.
    pub fn open_table(table: &'static str) -> io::Result<Self> {
        Ok(Self { table, ..Self::open()? })
    }

    /// Sends one request and returns the payload (after `nfgenmsg`) of its answer, or `None`
    /// when the kernel answered `ENOENT` (no such table, chain, set or element).
    fn get(&mut self, msg: u16, family: u8, attrs: impl FnOnce(&mut MsgBuf)) -> io::Result<Option<Vec<u8>>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut m = MsgBuf::new();
        m.begin_nft(msg, NLM_F_REQUEST | NLM_F_ACK, seq, family);
        attrs(&mut m);
        m.end();
        self.sock.send(m.bytes(), 0)?;
        let mut answer = None;
        loop {
            self.buf.clear();
            self.sock.recv(&mut self.buf, 0)?;
            for reply in messages(&self.buf) {
                if reply.seq != seq {
                    continue;
                }
                if reply.kind == NLMSG_ERROR {
                    let code = reply.payload.get(..4).and_then(|b| b.try_into().ok()).map(i32::from_ne_bytes);
                    return match code {
                        Some(0) => Ok(answer),
                        Some(e) if -e == libc_enoent() => Ok(None),
                        Some(e) => Err(io::Error::from_raw_os_error(-e)),
                        None => Err(io::Error::other("truncated netlink error")),
                    };
                }
                answer = Some(reply.payload.get(4..).unwrap_or(&[]).to_vec());
            }
        }
    }

    /// Whether `chain` exists in the probe's table of `family_of`'s family.
    pub fn chain_exists(&mut self, family_of: IpAddr, chain: &str) -> io::Result<bool> {
        let answer = self.get(NFT_MSG_GETCHAIN, nfproto_of(family_of), |m| {
            m.put_str(NFTA_CHAIN_TABLE, self.table);
            m.put_str(NFTA_CHAIN_NAME, chain);
        })?;
        Ok(answer.is_some())
    }

    /// The element `key` of set or map `set` in the probe's table of `family_of`'s family, as
    /// the kernel answers it (`None`: no such element).
    fn element(&mut self, family_of: IpAddr, set: &str, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        let table = self.table;
        let answer = self.get(NFT_MSG_GETSETELEM, nfproto_of(family_of), |m| {
            m.put_str(NFTA_SET_ELEM_LIST_TABLE, table);
            m.put_str(NFTA_SET_ELEM_LIST_SET, set);
            let list = m.begin_nest(NFTA_SET_ELEM_LIST_ELEMENTS);
            let elem = m.begin_nest(NFTA_LIST_ELEM);
            let k = m.begin_nest(NFTA_SET_ELEM_KEY);
            m.put(NFTA_DATA_VALUE, key);
            m.end_nest(k);
            m.end_nest(elem);
            m.end_nest(list);
        })?;
        Ok(answer)
    }

    /// The data of the element `key` of map `set` in the probe's table of `family_of`'s family
    /// (`None` also for a verdict, which is not a value).
    pub fn element_data(&mut self, family_of: IpAddr, set: &str, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        let answer = self.element(family_of, set, key)?;
        Ok(answer.and_then(|payload| element_of(&payload).and_then(|(_, data)| data)))
    }

    /// Whether the element `key` of set or map `set` exists, whatever its data (a verdict map's
    /// too).
    pub fn has_element(&mut self, family_of: IpAddr, set: &str, key: &[u8]) -> io::Result<bool> {
        Ok(self.element(family_of, set, key)?.is_some_and(|payload| element_of(&payload).is_some()))
    }

    /// Whether some slot `0..slots` of `ip:port` in the cluster TCP endpoints maps points at
    /// `want`, for any endpoint count up to `slots` (the map of each cap up to `slots`').
    pub fn endpoint_in_slots(&mut self, ip: IpAddr, port: u16, slots: u32, want: &[u8]) -> io::Result<bool> {
        for cap in (0..=slots.max(1).next_power_of_two().trailing_zeros()).map(|k| 1u32 << k) {
            let map = cluster_tcp_endpoints(cap as usize);
            for slot in 0..slots.min(cap) {
                if self.element_data(ip, &map, &endpoint_key(ip, port, slot))?.as_deref() == Some(want) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// The data of the element `k` (`None`: no such element, or a verdict).
    pub fn key_data(&mut self, k: &MapKey) -> io::Result<Option<Vec<u8>>> {
        self.element_data(k.ip, &k.map, &k.key)
    }

    /// Whether the element `k` exists, whatever its data.
    pub fn has_key(&mut self, k: &MapKey) -> io::Result<bool> {
        self.has_element(k.ip, &k.map, &k.key)
    }

    /// Whether every key of `keys` is in the kernel: one dump of each map they name, per family.
    pub fn has_all_keys(&mut self, keys: &[MapKey]) -> io::Result<bool> {
        let mut dumped: HashMap<(bool, &str), HashSet<Vec<u8>>> = HashMap::new();
        for k in keys {
            let held = match dumped.entry((k.ip.is_ipv4(), k.map.as_str())) {
                hash_map::Entry::Occupied(e) => e.into_mut(),
                hash_map::Entry::Vacant(e) => e.insert(self.map_keys(k.ip, &k.map)?),
            };
            if !held.contains(&k.key) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The rules of `chain` in the iptables-nft table `table` of `family_of`'s family, each as
    /// its netlink payload (one dump of that chain); `None`: no such chain. iptables mode's
    /// witness: an endpoint's address is in its rules (the `-s` match and the DNAT), a jump's
    /// target chain name in the jump.
    /// A dump that met a concurrent commit (`iptables-restore` writing meanwhile) is taken again.
    pub fn iptables_rules(&mut self, family_of: IpAddr, table: &str, chain: &str) -> io::Result<Option<Vec<Vec<u8>>>> {
        loop {
            let mut rules = Vec::new();
            let (table, chain) = (table.to_owned(), chain.to_owned());
            let result = self.dumper.dump(
                NFT_MSG_GETRULE,
                nfproto_of(family_of),
                move |m| {
                    m.put_str(NFTA_RULE_TABLE, &table);
                    m.put_str(NFTA_RULE_CHAIN, &chain);
                },
                |payload| rules.push(payload.to_vec()),
            );
            return match result {
                Ok(()) => Ok(Some(rules)),
                Err(e) if e.raw_os_error() == Some(libc_enoent()) => Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
        }
    }

    /// Every key of map `set` in the probe's table of `family_of`'s family (one dump).
    pub fn map_keys(&mut self, family_of: IpAddr, set: &str) -> io::Result<HashSet<Vec<u8>>> {
        let mut keys = HashSet::new();
        self.for_each_element(family_of, set, |elem| keys.extend(elem_key(elem)))?;
        Ok(keys)
    }

    /// The data of every element of map `set` (an anonymous one too, by its `__mapN` name) in
    /// the probe's table of `family_of`'s family, one dump; empty when there is no such map.
    pub fn map_data(&mut self, family_of: IpAddr, set: &str) -> io::Result<Vec<Vec<u8>>> {
        let mut data = Vec::new();
        self.for_each_element(family_of, set, |elem| data.extend(value_of(elem, NFTA_SET_ELEM_DATA)))?;
        Ok(data)
    }

    /// Calls `each` with every element of map `set` in the probe's table (one dump); no table or
    /// map yet is no element.
    fn for_each_element(&mut self, family_of: IpAddr, set: &str, mut each: impl FnMut(&[u8])) -> io::Result<()> {
        let set_name = set.to_owned();
        let table = self.table;
        let result = self.dumper.dump(
            NFT_MSG_GETSETELEM,
            nfproto_of(family_of),
            move |m| {
                m.put_str(NFTA_SET_ELEM_LIST_TABLE, table);
                m.put_str(NFTA_SET_ELEM_LIST_SET, &set_name);
            },
            |payload| {
                if let Some(list) = Attrs(payload).find(|a| a.kind == NFTA_SET_ELEM_LIST_ELEMENTS) {
                    for elem in list.nested().filter(|a| a.kind == NFTA_LIST_ELEM) {
                        each(elem.data);
                    }
                }
            },
        );
        match result {
            Err(e) if e.raw_os_error() == Some(libc_enoent()) => Ok(()),
            other => other,
        }
    }

    /// Whether a rule of `chain` (the probe's table) picks `want` from the anonymous map it looks
    /// up, as upstream's nftables mode writes a Service's endpoints
    /// (`dnat to numgen random mod N map { 0 : addr . port, … }`): one dump of the chain's rules,
    /// one of each map they name. A rule replaced between the two reads as not yet there.
    pub fn rule_map_holds(&mut self, family_of: IpAddr, chain: &str, want: &[u8]) -> io::Result<bool> {
        Ok(self.rule_map_data(family_of, chain)?.iter().any(|d| d == want))
    }

    /// The data of every element of the anonymous maps the rules of `chain` (the probe's table)
    /// look up (see [`KernelProbe::rule_map_holds`]).
    pub fn rule_map_data(&mut self, family_of: IpAddr, chain: &str) -> io::Result<Vec<Vec<u8>>> {
        let Some(rules) = self.iptables_rules(family_of, self.table, chain)? else { return Ok(Vec::new()) };
        let mut data = Vec::new();
        for name in rules.iter().flat_map(|rule| anonymous_sets(rule)) {
            data.extend(self.map_data(family_of, &name)?);
        }
        Ok(data)
    }
}

/// The names of the anonymous sets and maps (`__mapN`, `__setN`) a rule's payload names.
fn anonymous_sets(rule: &[u8]) -> Vec<String> {
    let mut names = Vec::new();
    for prefix in [&b"__map"[..], &b"__set"[..]] {
        let mut at = 0;
        while let Some(found) = rule[at..].windows(prefix.len()).position(|w| w == prefix) {
            let start = at + found;
            let end = rule[start..].iter().position(|b| *b == 0).map_or(rule.len(), |e| start + e);
            names.push(String::from_utf8_lossy(&rule[start..end]).into_owned());
            at = end;
        }
    }
    names
}

const fn libc_enoent() -> i32 {
    2
}

/// The value bytes of attribute `kind` (a nest holding `NFTA_DATA_VALUE`) of an element.
fn value_of(elem: &[u8], kind: u16) -> Option<Vec<u8>> {
    let nest = Attrs(elem).find(|a| a.kind == kind)?;
    nest.nested().find(|a| a.kind == NFTA_DATA_VALUE).map(|a| a.data.to_vec())
}

fn elem_key(elem: &[u8]) -> Option<Vec<u8>> {
    value_of(elem, NFTA_SET_ELEM_KEY)
}

/// The first element of a `NEWSETELEM` answer: its key and data.
fn element_of(payload: &[u8]) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let list = Attrs(payload).find(|a| a.kind == NFTA_SET_ELEM_LIST_ELEMENTS)?;
    let elem = list.nested().find(|a| a.kind == NFTA_LIST_ELEM)?;
    Some((elem_key(elem.data)?, value_of(elem.data, NFTA_SET_ELEM_DATA)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_data_are_padded_concatenations() {
        let key = endpoint_key("198.19.0.1".parse().unwrap_or(IpAddr::from([0; 4])), 80, 3);
        // address, protocol (6, padded), port (big-endian, padded), slot (host order).
        let mut want = vec![198, 19, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0];
        want.extend_from_slice(&3u32.to_ne_bytes());
        assert_eq!(key, want);
        let data = endpoint_data("198.18.32.7".parse().unwrap_or(IpAddr::from([0; 4])), 8080);
        assert_eq!(data, vec![198, 18, 32, 7, 0x1f, 0x90, 0, 0]);
        assert_eq!(endpoint_key("fd00:96::1".parse().unwrap_or(IpAddr::from([0; 4])), 80, 0).len(), 28);
    }
}

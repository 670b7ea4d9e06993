//! The `inet kproxy-accel` table, as operations of the typed nf_tables model.
//!
//! ```text
//! table inet kproxy-accel {
//!   set vips-v4   { type inet_proto . ipv4_addr . inet_service; }   # ClusterIPs, external IPs, LB IPs
//!   set vips-v6   { type inet_proto . ipv6_addr . inet_service; }
//!   set nodeports { type inet_proto . inet_service; }
//!   flowtable fastpath { hook ingress priority 0; devices = { <every up, non-loopback link> }; counter; }
//!   chain classify {            # before DNAT, on the first packet of a connection only
//!     type filter hook prerouting priority -110; policy accept;      # dstnat - 10
//!     ct state new meta l4proto . ip daddr . th dport @vips-v4 ct mark set ct mark or ACCEL return
//!     ct state new meta l4proto . ip6 daddr . th dport @vips-v6 ct mark set ct mark or ACCEL return
//!     ct state new fib daddr type local meta l4proto . th dport @nodeports ct mark set ct mark or ACCEL
//!   }
//!   chain fastpath-offload {    # after DNAT: only forwarded traffic can be offloaded
//!     type filter hook forward priority 0; policy accept;
//!     ct mark and ACCEL == 0 return
//!     ct state established ct status dnat ct packets > N ct mark and OFFLOADED == 0 ct mark set ct mark or OFFLOADED counter flow add @fastpath
//!     ct state established ct status dnat ct packets > N flow add @fastpath
//!   }
//! }
//! ```
//!
//! `ct status dnat` keeps connections that conntrack did not translate out of the flowtable:
//! the flowtable rewrites packets only as conntrack's NAT says, so a connection translated by
//! someone else — IPVS, which DNATs in its own hooks and only alters the conntrack reply tuple —
//! would be forwarded untranslated once offloaded (observed in the guest kernel: the transfer
//! stalls). Service traffic of the nftables and iptables dataplanes is always DNATed by
//! conntrack, so the condition costs them nothing; the IPVS dataplane DNATs the opted-in
//! Services' connections in its auxiliary nftables table for this reason (`kproxy-ipvs`,
//! `aux_table`), and everything IPVS itself translates stays on the slow path.
//!
//! The second `flow add` re-offloads a connection whose flowtable entry expired (idle) and fell
//! back to the slow path; only the first one counts, so its counter is "connections offloaded".
//! The `counter` flag of the flowtable keeps conntrack's packet and byte counters moving for
//! offloaded flows. The node-port rule may match node ports on addresses where the dataplane
//! does not serve them: harmless, that traffic is host-terminated and never forwarded.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kproxy_nft_model::{
    Chain, ChainType, CmpOp, CtState, CtStatus, DataType, Element as NftElement, Field, Flowtable, HookPoint, Key, Op,
    Rule, SetDef, Stmt, TableFamily, TableRef, Transaction, Value, Verdict,
};
use kproxy_state::IpFamily;

use crate::config::{AccelConfig, FLOWTABLE, TABLE};
use crate::elements::Element;

/// Set of IPv4 frontends.
pub const SET_VIPS_V4: &str = "vips-v4";
/// Set of IPv6 frontends.
pub const SET_VIPS_V6: &str = "vips-v6";
/// Set of node ports.
pub const SET_NODEPORTS: &str = "nodeports";
/// The prerouting chain.
pub const CHAIN_CLASSIFY: &str = "classify";
/// The forward chain. (`offload` alone is an nft keyword.)
pub const CHAIN_OFFLOAD: &str = "fastpath-offload";

/// `dstnat - 10`: classification sees the frontend the client addressed, before DNAT.
const CLASSIFY_PRIORITY: i32 = -110;

/// The fast path's table.
pub fn table() -> TableRef {
    TableRef { family: TableFamily::Inet, name: TABLE.to_owned() }
}

/// The whole table in one transaction: any previous copy (a restart, a resync after an error)
/// is deleted and the table created again, so the kernel ends in a known state.
pub fn create_table<'a>(
    config: &AccelConfig,
    devices: &BTreeSet<String>,
    elements: impl IntoIterator<Item = &'a Element>,
) -> Transaction {
    let t = table();
    let mut tx = delete_table();
    tx.push(Op::AddTable { table: t.clone(), comment: None });
    use DataType::{InetProto, InetService, Ipv4Addr, Ipv6Addr};
    tx.push(Op::AddSet(t.clone(), SetDef::of(SET_VIPS_V4, vec![InetProto, Ipv4Addr, InetService])));
    tx.push(Op::AddSet(t.clone(), SetDef::of(SET_VIPS_V6, vec![InetProto, Ipv6Addr, InetService])));
    tx.push(Op::AddSet(t.clone(), SetDef::of(SET_NODEPORTS, vec![InetProto, InetService])));
    tx.push(Op::AddFlowtable(t.clone(), flowtable(devices.iter().cloned().collect())));
    tx.push(Op::AddChain(
        t.clone(),
        Chain::base(CHAIN_CLASSIFY, ChainType::Filter, HookPoint::Prerouting, CLASSIFY_PRIORITY),
    ));
    tx.push(Op::AddChain(t.clone(), Chain::base(CHAIN_OFFLOAD, ChainType::Filter, HookPoint::Forward, 0)));
    tx.add_rules(&t, CHAIN_CLASSIFY, classify_rules(config));
    tx.add_rules(&t, CHAIN_OFFLOAD, offload_rules(config));
    tx.extend(element_updates(elements, std::iter::empty()));
    tx
}

/// The flowtable on `devices`, with conntrack counting its packets.
fn flowtable(devices: Vec<String>) -> Flowtable {
    Flowtable { name: FLOWTABLE.to_owned(), priority: 0, devices, counter: true }
}

fn classify_rules(config: &AccelConfig) -> Vec<Rule> {
    let accelerate = || Stmt::CtMarkOr(config.marks.accelerate);
    let new = || Stmt::CtState(CtState::New);
    let vips = |family, set: &str| Stmt::member(vec![Field::L4Proto, Field::Daddr(family), Field::ThDport], set);
    vec![
        Rule::new([new(), vips(IpFamily::V4, SET_VIPS_V4), accelerate(), Stmt::Verdict(Verdict::Return)]),
        Rule::new([new(), vips(IpFamily::V6, SET_VIPS_V6), accelerate(), Stmt::Verdict(Verdict::Return)]),
        Rule::new([
            new(),
            Stmt::FibLocal { saddr: false },
            Stmt::member(vec![Field::L4Proto, Field::ThDport], SET_NODEPORTS),
            accelerate(),
        ]),
    ]
}

fn offload_rules(config: &AccelConfig) -> Vec<Rule> {
    let (accelerate, offloaded) = (config.marks.accelerate, config.marks.offloaded);
    let ready = || {
        [
            Stmt::CtState(CtState::Established),
            Stmt::CtStatus(CtStatus::Dnat),
            Stmt::CtPacketsGt(u64::from(config.packet_threshold)),
        ]
    };
    let flow_add = || Stmt::FlowAdd(FLOWTABLE.to_owned());
    let mut first = Rule::new(ready());
    first.0.extend([
        Stmt::CtMarkAnd { mask: offloaded, op: CmpOp::Eq, value: 0 },
        Stmt::CtMarkOr(offloaded),
        Stmt::Counter,
        flow_add(),
    ]);
    vec![
        Rule::new([Stmt::CtMarkAnd { mask: accelerate, op: CmpOp::Eq, value: 0 }, Stmt::Verdict(Verdict::Return)]),
        first,
        Rule::new(ready()).then(flow_add()),
    ]
}

/// Deletes the table if it exists (adding it first makes the deletion never fail).
pub fn delete_table() -> Transaction {
    let mut tx = Transaction::new();
    tx.push(Op::AddTable { table: table(), comment: None });
    tx.push(Op::DeleteTable(table()));
    tx
}

/// Deletes `removed` and adds `added` elements, deletions first.
pub fn element_updates<'a>(
    added: impl IntoIterator<Item = &'a Element>,
    removed: impl IntoIterator<Item = &'a Element>,
) -> Transaction {
    let mut tx = Transaction::new();
    for e in removed {
        tx.push(Op::DeleteElement(table(), element(e)));
    }
    for e in added {
        tx.push(Op::AddElement(table(), element(e)));
    }
    tx
}

/// The set element of a frontend.
fn element(e: &Element) -> NftElement {
    match *e {
        Element::Vip { protocol, address, port } => {
            let set = if matches!(address, IpAddr::V4(_)) { SET_VIPS_V4 } else { SET_VIPS_V6 };
            NftElement::new(set, Key::new([Value::Proto(protocol), Value::Addr(address), Value::Port(port)]))
        }
        Element::NodePort { protocol, port } => {
            NftElement::new(SET_NODEPORTS, Key::new([Value::Proto(protocol), Value::Port(port)]))
        }
    }
}

/// Registers `added` devices and unregisters `removed` ones. Adding a flowtable that exists
/// registers the devices it lacks (Linux 5.13+); it also sets the flowtable's flags, so the
/// `counter` flag is repeated. Removing leaves the flowtable and its other devices in place. A
/// device that disappears from the system leaves the flowtable by itself, so it is never named
/// here.
pub fn device_updates(added: &BTreeSet<String>, removed: &BTreeSet<String>) -> Transaction {
    let mut tx = Transaction::new();
    if !removed.is_empty() {
        tx.push(Op::DeleteFlowtableDevices {
            table: table(),
            name: FLOWTABLE.to_owned(),
            devices: removed.iter().cloned().collect(),
        });
    }
    if !added.is_empty() {
        tx.push(Op::AddFlowtable(table(), flowtable(added.iter().cloned().collect())));
    }
    tx
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kproxy_state::Protocol;

    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn elements_go_to_their_family_set_and_deletes_come_first() {
        let added = [
            Element::Vip { protocol: Protocol::Tcp, address: "198.18.128.10".parse().unwrap(), port: 80 },
            Element::Vip { protocol: Protocol::Udp, address: "fd00:96::10".parse().unwrap(), port: 53 },
            Element::NodePort { protocol: Protocol::Tcp, port: 30080 },
        ];
        let removed = [Element::Vip { protocol: Protocol::Tcp, address: "198.18.128.11".parse().unwrap(), port: 80 }];
        assert_eq!(
            element_updates(&added, &removed).render(),
            "delete element inet kproxy-accel vips-v4 { tcp . 198.18.128.11 . 80 }\n\
             add element inet kproxy-accel vips-v4 { tcp . 198.18.128.10 . 80 }\n\
             add element inet kproxy-accel vips-v6 { udp . fd00:96::10 . 53 }\n\
             add element inet kproxy-accel nodeports { tcp . 30080 }\n"
        );
        assert!(element_updates(&[], &[]).is_empty());
    }

    #[test]
    fn table_classifies_before_dnat_and_offloads_after_the_threshold() {
        let config = AccelConfig { packet_threshold: 7, ..AccelConfig::default() };
        let text = create_table(&config, &set(&["eth0", "veth1"]), &[]).render();
        assert!(text.starts_with("add table inet kproxy-accel\ndelete table inet kproxy-accel\n"), "{text}");
        assert!(text.contains("devices = { \"eth0\", \"veth1\" }; counter; }"), "{text}");
        assert!(text.contains("classify { type filter hook prerouting priority -110;"), "{text}");
        assert!(text.contains("@vips-v4 ct mark set ct mark or 0x100000 return"), "{text}");
        assert!(
            text.contains(
                "ct status dnat ct packets > 7 ct mark and 0x200000 == 0 ct mark set ct mark or 0x200000 counter flow add @fastpath"
            ),
            "{text}"
        );
        assert!(!create_table(&config, &set(&[]), &[]).render().contains("devices"));
    }

    #[test]
    fn devices_are_removed_with_delete_flowtable_and_added_with_add_flowtable() {
        assert_eq!(
            device_updates(&set(&["new0"]), &set(&["old0", "old1"])).render(),
            "delete flowtable inet kproxy-accel fastpath { devices = { \"old0\", \"old1\" }; }\n\
             add flowtable inet kproxy-accel fastpath { hook ingress priority 0; devices = { \"new0\" }; counter; }\n"
        );
        assert!(device_updates(&set(&[]), &set(&[])).is_empty());
    }

    /// Every operation of the table can be encoded for netlink (the encoding itself is checked
    /// byte by byte against nft in `kproxy-nft-netlink`'s fixtures).
    #[test]
    fn the_table_encodes_for_netlink() {
        let elements = [
            Element::Vip { protocol: Protocol::Tcp, address: "198.18.128.10".parse().unwrap(), port: 80 },
            Element::Vip { protocol: Protocol::Udp, address: "fd00:96::10".parse().unwrap(), port: 53 },
            Element::NodePort { protocol: Protocol::Tcp, port: 30080 },
        ];
        let mut tx = create_table(&AccelConfig::default(), &set(&["eth0"]), &elements);
        tx.extend(device_updates(&set(&["eth1"]), &set(&["eth0"])));
        tx.extend(element_updates(&[], &elements));
        kproxy_nft_netlink::batch::Batch::encode(&tx, 1).unwrap();
    }
}

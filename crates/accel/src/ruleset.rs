//! The `inet kproxy-accel` table as `nft -f` text.
//!
//! ```text
//! table inet kproxy-accel {
//!   set vips-v4   { type inet_proto . ipv4_addr . inet_service; }   # ClusterIPs, external IPs, LB IPs
//!   set vips-v6   { type inet_proto . ipv6_addr . inet_service; }
//!   set nodeports { type inet_proto . inet_service; }
//!   flowtable fastpath { hook ingress priority filter; devices = { <every up, non-loopback link> }; counter; }
//!   chain classify {            # before DNAT, on the first packet of a connection only
//!     type filter hook prerouting priority dstnat - 10; policy accept;
//!     ct state != new return
//!     meta l4proto . ip daddr . th dport @vips-v4 ct mark set ct mark | ACCEL return
//!     meta l4proto . ip6 daddr . th dport @vips-v6 ct mark set ct mark | ACCEL return
//!     fib daddr type local meta l4proto . th dport @nodeports ct mark set ct mark | ACCEL
//!   }
//!   chain offload {             # after DNAT: only forwarded traffic can be offloaded
//!     type filter hook forward priority filter; policy accept;
//!     ct mark & ACCEL == 0 return
//!     ct state established ct status dnat ct packets > N ct mark & OFFLOADED == 0 ct mark set ct mark | OFFLOADED counter flow add @fastpath
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
//! conntrack, so the condition costs them nothing; under IPVS nothing is offloaded.
//!
//! The second `flow add` re-offloads a connection whose flowtable entry expired (idle) and fell
//! back to the slow path; only the first one counts, so its counter is "connections offloaded".
//! The `counter` flag of the flowtable keeps conntrack's packet and byte counters moving for
//! offloaded flows. The node-port rule may match node ports on addresses where the dataplane
//! does not serve them: harmless, that traffic is host-terminated and never forwarded.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use kproxy_state::Protocol;

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

/// The whole table, created in one batch (after deleting any previous copy, so a restart or a
/// resync after an error starts from a known state).
pub fn create_table<'a>(
    config: &AccelConfig,
    devices: &BTreeSet<String>,
    elements: impl IntoIterator<Item = &'a Element>,
    existing: bool,
) -> String {
    let mut out = String::new();
    if existing {
        let _ = writeln!(out, "delete table inet {TABLE}");
    }
    let accel = config.marks.accelerate;
    let offloaded = config.marks.offloaded;
    let n = config.packet_threshold;
    let _ = writeln!(out, "table inet {TABLE} {{");
    let _ = writeln!(out, "  set {SET_VIPS_V4} {{ type inet_proto . ipv4_addr . inet_service; }}");
    let _ = writeln!(out, "  set {SET_VIPS_V6} {{ type inet_proto . ipv6_addr . inet_service; }}");
    let _ = writeln!(out, "  set {SET_NODEPORTS} {{ type inet_proto . inet_service; }}");
    let _ = write!(out, "  flowtable {FLOWTABLE} {{ hook ingress priority filter; ");
    if !devices.is_empty() {
        let _ = write!(out, "devices = {{ {} }}; ", device_list(devices));
    }
    let _ = writeln!(out, "counter; }}");
    let _ = writeln!(out, "  chain {CHAIN_CLASSIFY} {{");
    let _ = writeln!(out, "    type filter hook prerouting priority dstnat - 10; policy accept;");
    let _ = writeln!(out, "    ct state != new return");
    let _ = writeln!(
        out,
        "    meta l4proto . ip daddr . th dport @{SET_VIPS_V4} ct mark set ct mark | {accel:#010x} return"
    );
    let _ = writeln!(
        out,
        "    meta l4proto . ip6 daddr . th dport @{SET_VIPS_V6} ct mark set ct mark | {accel:#010x} return"
    );
    let _ = writeln!(
        out,
        "    fib daddr type local meta l4proto . th dport @{SET_NODEPORTS} ct mark set ct mark | {accel:#010x}"
    );
    let _ = writeln!(out, "  }}");
    let _ = writeln!(out, "  chain {CHAIN_OFFLOAD} {{");
    let _ = writeln!(out, "    type filter hook forward priority filter; policy accept;");
    let _ = writeln!(out, "    ct mark & {accel:#010x} == 0 return");
    let _ = writeln!(
        out,
        "    ct state established ct status dnat ct packets > {n} ct mark & {offloaded:#010x} == 0 \
         ct mark set ct mark | {offloaded:#010x} counter flow add @{FLOWTABLE}"
    );
    let _ = writeln!(out, "    ct state established ct status dnat ct packets > {n} flow add @{FLOWTABLE}");
    let _ = writeln!(out, "  }}");
    let _ = writeln!(out, "}}");
    out.push_str(&element_updates(elements, std::iter::empty()));
    out
}

/// `delete table`.
pub fn delete_table() -> String {
    format!("delete table inet {TABLE}\n")
}

/// Adds and deletes set elements (one `add element` / `delete element` line per set).
pub fn element_updates<'a>(
    added: impl IntoIterator<Item = &'a Element>,
    removed: impl IntoIterator<Item = &'a Element>,
) -> String {
    let mut out = String::new();
    for (verb, elements) in [("delete", group(removed)), ("add", group(added))] {
        for (set, items) in [(SET_VIPS_V4, &elements.0), (SET_VIPS_V6, &elements.1), (SET_NODEPORTS, &elements.2)] {
            if !items.is_empty() {
                let _ = writeln!(out, "{verb} element inet {TABLE} {set} {{ {} }}", items.join(", "));
            }
        }
    }
    out
}

/// Registers `added` devices and unregisters `removed` ones. Adding a flowtable that exists
/// registers the devices it lacks (Linux 5.13+); removing needs `delete flowtable … { devices }`,
/// which leaves the flowtable and its other devices in place. A device that disappears from
/// the system leaves the flowtable by itself, so it is never named here.
pub fn device_updates(added: &BTreeSet<String>, removed: &BTreeSet<String>) -> String {
    let mut out = String::new();
    if !removed.is_empty() {
        let _ =
            writeln!(out, "delete flowtable inet {TABLE} {FLOWTABLE} {{ devices = {{ {} }}; }}", device_list(removed));
    }
    if !added.is_empty() {
        let _ = writeln!(
            out,
            "add flowtable inet {TABLE} {FLOWTABLE} {{ hook ingress priority filter; devices = {{ {} }}; }}",
            device_list(added)
        );
    }
    out
}

/// Device names quoted for nft (names may contain characters nft would otherwise parse).
fn device_list(devices: &BTreeSet<String>) -> String {
    devices.iter().map(|d| format!("\"{}\"", d.replace(['"', '\\'], ""))).collect::<Vec<_>>().join(", ")
}

type Grouped = (Vec<String>, Vec<String>, Vec<String>);

fn group<'a>(elements: impl IntoIterator<Item = &'a Element>) -> Grouped {
    let mut out: Grouped = Default::default();
    for element in elements {
        match *element {
            Element::Vip { protocol, address: std::net::IpAddr::V4(a), port } => {
                out.0.push(format!("{} . {a} . {port}", proto(protocol)));
            }
            Element::Vip { protocol, address: std::net::IpAddr::V6(a), port } => {
                out.1.push(format!("{} . {a} . {port}", proto(protocol)));
            }
            Element::NodePort { protocol, port } => out.2.push(format!("{} . {port}", proto(protocol))),
        }
    }
    out
}

fn proto(protocol: Protocol) -> &'static str {
    protocol.as_str()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn elements_are_grouped_by_set_and_deletes_come_first() {
        let added = [
            Element::Vip { protocol: Protocol::Tcp, address: "198.18.128.10".parse().unwrap(), port: 80 },
            Element::Vip { protocol: Protocol::Udp, address: "fd00:96::10".parse().unwrap(), port: 53 },
            Element::NodePort { protocol: Protocol::Tcp, port: 30080 },
        ];
        let removed = [Element::Vip { protocol: Protocol::Tcp, address: "198.18.128.11".parse().unwrap(), port: 80 }];
        assert_eq!(
            element_updates(&added, &removed),
            "delete element inet kproxy-accel vips-v4 { tcp . 198.18.128.11 . 80 }\n\
             add element inet kproxy-accel vips-v4 { tcp . 198.18.128.10 . 80 }\n\
             add element inet kproxy-accel vips-v6 { udp . fd00:96::10 . 53 }\n\
             add element inet kproxy-accel nodeports { tcp . 30080 }\n"
        );
        assert_eq!(element_updates(&[], &[]), "");
    }

    #[test]
    fn table_classifies_before_dnat_and_offloads_after_the_threshold() {
        let config = AccelConfig { packet_threshold: 7, ..AccelConfig::default() };
        let text = create_table(&config, &set(&["eth0", "veth1"]), &[], true);
        assert!(text.starts_with("delete table inet kproxy-accel\n"), "{text}");
        assert!(text.contains("devices = { \"eth0\", \"veth1\" }; counter; }"), "{text}");
        assert!(text.contains("type filter hook prerouting priority dstnat - 10;"), "{text}");
        assert!(text.contains("ct mark set ct mark | 0x00100000 return"), "{text}");
        assert!(text.contains("ct status dnat ct packets > 7 ct mark & 0x00200000 == 0 ct mark set ct mark | 0x00200000 counter flow add @fastpath"), "{text}");
        assert!(!create_table(&config, &set(&[]), &[], false).contains("devices"));
    }

    #[test]
    fn devices_are_removed_with_delete_flowtable_and_added_with_add_flowtable() {
        assert_eq!(
            device_updates(&set(&["new0"]), &set(&["old0", "old1"])),
            "delete flowtable inet kproxy-accel fastpath { devices = { \"old0\", \"old1\" }; }\n\
             add flowtable inet kproxy-accel fastpath { hook ingress priority filter; devices = { \"new0\" }; }\n"
        );
        assert_eq!(device_updates(&set(&[]), &set(&[])), "");
    }
}

//! Fuzzing what kproxy reads back from IPVS: the generic netlink replies (the datagram walk of
//! `kproxy_ipvs::netlink::read_replies`, the attribute walk, and `genl::parse_service`,
//! `parse_dest`, `parse_family_id`) and the `/proc/net/ip_vs` table (`proc_table::parse` and
//! `join`). Seeds are the messages kproxy's encoder writes, which match `ipvsadm`'s byte for byte
//! (crates/ipvs/src/genl/tests.rs), and the table as Linux prints it. Nothing panics or
//! allocates by what a length claims; what decodes from valid input is what was encoded; the
//! table is read whole or not at all, and joining it with the services loses none.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is a test failure

mod binary;
mod bounds;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use binary::{mutated_bytes, mutated_seed};
use kproxy_fuzz::mutated_text;
use kproxy_ipvs::genl::{self, F_HASHED, F_PERSISTENT, F_SCHED1, F_SCHED2};
use kproxy_ipvs::netlink::{self, Message, NetlinkError, Replies, read_replies};
use kproxy_ipvs::proc_table::{self, Listed};
use kproxy_ipvs::{DestKey, DestSpec, DestState, IpvsOp, ServiceKey, ServiceSpec};
use kproxy_state::{IpFamily, Protocol};
use proptest::prelude::*;

/// The IPVS family id the replies carry.
const FAMILY: u16 = 0x20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// `IPVS_SVC_ATTR_STATS`: what a dump answer carries besides a request's attributes.
const SVC_ATTR_STATS: u16 = 10;

fn tcp(addr: &str, port: u16) -> ServiceKey {
    ServiceKey::Addr { addr: addr.parse().unwrap(), protocol: Protocol::Tcp, port }
}

fn seed_ops() -> Vec<IpvsOp> {
    let udp = ServiceKey::Addr { addr: "198.18.128.10".parse().unwrap(), protocol: Protocol::Udp, port: 53 };
    let fwmark = ServiceKey::Fwmark { family: IpFamily::V6, mark: 0x1000_0001 };
    let dest = |addr: &str, port| DestSpec { key: DestKey { addr: addr.parse().unwrap(), port }, weight: 1 };
    vec![
        IpvsOp::AddService(ServiceSpec { key: tcp("198.18.128.10", 80), scheduler: "rr".into(), flags: 0, timeout: 0 }),
        IpvsOp::UpdateService(ServiceSpec { key: udp, scheduler: "wrr".into(), flags: F_PERSISTENT, timeout: 30 }),
        IpvsOp::AddService(ServiceSpec { key: tcp("fd00:96::10", 80), scheduler: "sh".into(), flags: 0, timeout: 0 }),
        IpvsOp::AddService(ServiceSpec { key: fwmark, scheduler: "mh".into(), flags: F_SCHED2, timeout: 0 }),
        IpvsOp::AddDest(udp, dest("198.18.16.10", 8080)),
        IpvsOp::AddDest(fwmark, dest("fd00:10::a", 8080)),
        IpvsOp::DeleteDest(udp, DestKey { addr: "198.18.16.10".parse().unwrap(), port: 8080 }),
    ]
}

/// Generic netlink payloads shaped as the kernel's dump answers: kproxy's requests (the same
/// attributes), some with a statistics nest as a dump adds.
fn seed_payloads() -> Vec<Vec<u8>> {
    let mut payloads: Vec<Vec<u8>> =
        seed_ops().iter().map(|op| genl::request(FAMILY, op).finish(1)[16..].to_vec()).collect();
    let mut with_stats = payloads[0].clone();
    // Inside the service nest: a nest of two u32 counters.
    let stats = [12u8, 0, 1, 0, 7, 0, 0, 0, 8, 0, 2, 0, 9, 0, 0, 0];
    let mut nest = vec![0, 0, 0, 0];
    nest[..2].copy_from_slice(&((4 + stats.len()) as u16).to_ne_bytes());
    nest[2..].copy_from_slice(&(SVC_ATTR_STATS | 0x8000).to_ne_bytes());
    nest.extend_from_slice(&stats);
    with_stats.extend_from_slice(&nest);
    let outer = u16::from_ne_bytes([with_stats[4], with_stats[5]]) + nest.len() as u16;
    with_stats[4..6].copy_from_slice(&outer.to_ne_bytes());
    payloads.push(with_stats);
    // The controller's answer with the family id.
    payloads.push(vec![1, 2, 0, 0, 6, 0, 1, 0, 0x20, 0, 0, 0, 9, 0, 2, 0, b'I', b'P', b'V', b'S', 0, 0, 0, 0]);
    payloads
}

/// A message of the kernel's answer: type `ty`, sequence `seq`, `payload`.
fn message(ty: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Message::new(ty, 0);
    m.raw(payload);
    m.finish(seq)
}

/// Whole datagrams: a dump page ending in `NLMSG_DONE`, acknowledgements, a refusal, a message
/// of another request in between.
fn seed_datagrams() -> Vec<Vec<u8>> {
    let payloads = seed_payloads();
    let mut dump: Vec<u8> = payloads.iter().take(4).flat_map(|p| message(FAMILY, 7, p)).collect();
    dump.extend(message(FAMILY, 6, &payloads[4]));
    dump.extend(message(NLMSG_DONE, 7, &0i32.to_ne_bytes()));
    let mut answered = message(FAMILY, 7, &payloads[8]);
    answered.extend(message(NLMSG_ERROR, 7, &[0; 20]));
    let mut refused = (-17i32).to_ne_bytes().to_vec();
    refused.extend_from_slice(&message(FAMILY, 7, &[])[..16]);
    vec![dump, answered, message(NLMSG_ERROR, 7, &refused), message(FAMILY, 7, &payloads[5])]
}

/// Reads the payload with every parser, checking what each returns.
fn parse_payload(payload: &[u8]) {
    if let Some(spec) = genl::parse_service(payload) {
        assert_eq!(spec.flags & F_HASHED, 0, "the kernel's own flag is masked: {spec:?}");
        assert!(!spec.scheduler.contains('\0'), "{spec:?}");
        if let ServiceKey::Fwmark { mark, .. } = spec.key {
            assert_ne!(mark, 0, "mark 0 is no firewall-mark service");
        }
    }
    for family in [IpFamily::V4, IpFamily::V6] {
        if let Some(dest) = genl::parse_dest(payload, family) {
            let _ = dest.spec.key.addr;
        }
    }
    let _ = genl::parse_family_id(payload);
    // The attribute walk stays inside its buffer and stops at a malformed attribute.
    let body = payload.get(4..).unwrap_or_default();
    let walked: usize = netlink::attrs(body).map(|(_, p)| 4 + p.len()).sum();
    assert!(walked <= body.len(), "{walked} bytes of attributes in {} bytes", body.len());
}

fn read(datagram: &[u8], dump: bool) -> (Result<Replies, String>, Vec<Vec<u8>>) {
    let mut out = Vec::new();
    let result = read_replies(datagram, 7, dump, &mut out).map_err(|e| match e {
        NetlinkError::Kernel(errno) => format!("kernel {errno}"),
        other => other.to_string(),
    });
    (result, out)
}

proptest! {
    #![proptest_config(bounds::cases(1024))]

    /// The fuzz target: whole reply datagrams, edited anywhere, read as a dump and as the
    /// answer to a request; every payload they hand over goes through the parsers.
    #[test]
    fn decode_an_edited_ipvs_reply_datagram_is_read_or_refused(datagram in mutated_seed(seed_datagrams()), dump in any::<bool>()) {
        let ((result, payloads), largest) = bounds::largest_allocation(|| {
            let read = read(&datagram, dump);
            for payload in &read.1 {
                parse_payload(payload);
            }
            read
        });
        prop_assert!(largest <= bounds::allowance(datagram.len(), 4096), "{} bytes at once", largest);
        prop_assert_eq!(read(&datagram, dump), (result, payloads.clone()), "deterministic");
        let handed: usize = payloads.iter().map(|p| p.len() + 16).sum();
        prop_assert!(handed <= datagram.len(), "{} bytes handed over from {}", handed, datagram.len());
    }

    /// Payloads (services, real servers, the controller's answer) edited and parsed.
    #[test]
    fn decode_an_edited_ipvs_payload_is_parsed_or_passed_over(payload in mutated_seed(seed_payloads())) {
        let ((), largest) = bounds::largest_allocation(|| parse_payload(&payload));
        prop_assert!(largest <= bounds::allowance(payload.len(), 4096), "{} bytes at once", largest);
        prop_assert_eq!(genl::parse_service(&payload), genl::parse_service(&payload));
    }

    /// Any service and real server kproxy encodes reads back as itself (a dump answer has the
    /// request's layout).
    #[test]
    fn decode_any_encoded_service_and_real_server_reads_back(spec in service_spec(), dest in dest_spec()) {
        let payload = |op: &IpvsOp| genl::request(FAMILY, op).finish(1)[16..].to_vec();
        prop_assert_eq!(genl::parse_service(&payload(&IpvsOp::AddService(spec.clone()))), Some(spec.clone()));
        let read = genl::parse_dest(&payload(&IpvsOp::AddDest(spec.key, dest)), spec.key.family());
        prop_assert_eq!(read, Some(DestState { spec: dest, active_conns: 0, inactive_conns: 0 }));
    }
}

fn address() -> impl Strategy<Value = IpAddr> {
    prop_oneof![any::<Ipv4Addr>().prop_map(IpAddr::V4), any::<Ipv6Addr>().prop_map(IpAddr::V6)]
}

fn protocol() -> impl Strategy<Value = Protocol> {
    proptest::sample::select(vec![Protocol::Tcp, Protocol::Udp, Protocol::Sctp])
}

fn service_key() -> impl Strategy<Value = ServiceKey> {
    prop_oneof![
        (address(), protocol(), any::<u16>()).prop_map(|(addr, protocol, port)| ServiceKey::Addr {
            addr,
            protocol,
            port
        }),
        (any::<bool>(), 1u32..)
            .prop_map(|(v6, mark)| ServiceKey::Fwmark { family: if v6 { IpFamily::V6 } else { IpFamily::V4 }, mark }),
    ]
}

fn service_spec() -> impl Strategy<Value = ServiceSpec> {
    let flags = proptest::sample::subsequence(vec![F_PERSISTENT, F_SCHED1, F_SCHED2], 0..=3)
        .prop_map(|f| f.into_iter().fold(0, |a, b| a | b));
    (service_key(), "[a-z]{1,15}", flags, any::<u32>()).prop_map(|(key, scheduler, flags, timeout)| ServiceSpec {
        key,
        scheduler,
        flags,
        timeout,
    })
}

fn dest_spec() -> impl Strategy<Value = DestSpec> {
    (address(), any::<u16>(), any::<u32>())
        .prop_map(|(addr, port, weight)| DestSpec { key: DestKey { addr, port }, weight })
}

/// `/proc/net/ip_vs` as Linux 6.1 prints it (`ip_vs_info_seq_show`).
const TABLE: &str = "IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  C612800A:0050 rr 
  -> C6121010:1F90      Masq    1      0          0         
  -> C6121110:1F90      Masq    0      3          1         
UDP  C612800B:0035 rr persistent 10800 FFFFFFFF
TCP  [fd00:0096:0000:0000:0000:0000:0000:0010]:0050 rr 
  -> [fd00:0010:0000:0000:0000:0000:0000:000a]:1F90      Masq    1      0          0         
FWM  10000001 rr 
  -> [fd00:0010:0000:0000:0000:0000:0000:000a]:1F90      Masq    1      0          0         
FWM  10000001 rr 
FWM  10000002 rr 
  -> C6121010:1F90      Masq    1      0          0         
";

/// An address and port as the table prints them.
fn addr_port(addr: IpAddr, port: u16) -> String {
    match addr {
        IpAddr::V4(v4) => format!("{:08X}:{port:04X}", u32::from(v4)),
        IpAddr::V6(v6) => {
            let groups: Vec<String> = v6.segments().iter().map(|s| format!("{s:04x}")).collect();
            format!("[{}]:{port:04X}", groups.join(":"))
        }
    }
}

/// The table text for `services`, as the kernel prints it.
fn table_text(services: &[(ServiceKey, Vec<DestState>)]) -> String {
    let mut text = TABLE.lines().take(3).map(|l| format!("{l}\n")).collect::<String>();
    for (key, dests) in services {
        match key {
            ServiceKey::Addr { addr, protocol, port } => {
                text.push_str(&format!(
                    "{}  {} rr \n",
                    protocol.as_str().to_ascii_uppercase(),
                    addr_port(*addr, *port)
                ));
            }
            ServiceKey::Fwmark { mark, .. } => text.push_str(&format!("FWM  {mark:08X} rr \n")),
        }
        for d in dests {
            text.push_str(&format!(
                "  -> {}      Masq    {}      {}          {}         \n",
                addr_port(d.spec.key.addr, d.spec.key.port),
                d.spec.weight,
                d.active_conns,
                d.inactive_conns
            ));
        }
    }
    text
}

fn dest_state() -> impl Strategy<Value = DestState> {
    (dest_spec(), any::<u32>(), any::<u32>()).prop_map(|(spec, active_conns, inactive_conns)| DestState {
        spec,
        active_conns,
        inactive_conns,
    })
}

/// Checks what `join` makes of `listed`: every service comes back once, joined or unmatched,
/// and each listed entry's real servers go to one service at most.
fn check_join(services: Vec<ServiceSpec>, listed: Vec<(Listed, Vec<DestState>)>) {
    let entries = listed.len();
    let (joined, unmatched) = proc_table::join(services.clone(), listed);
    prop_assert_eq_services(&services, &joined, &unmatched);
    assert!(joined.len() <= entries.max(services.len()));
}

fn prop_assert_eq_services(
    services: &[ServiceSpec],
    joined: &[(ServiceSpec, Vec<DestState>)],
    unmatched: &[ServiceSpec],
) {
    let mut back: Vec<&ServiceSpec> = joined.iter().map(|(s, _)| s).chain(unmatched).collect();
    let mut given: Vec<&ServiceSpec> = services.iter().collect();
    back.sort_by_key(|s| format!("{s:?}"));
    given.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(back, given, "join lost or made up a service");
}

proptest! {
    #![proptest_config(bounds::cases(512))]

    /// The fuzz target: the table edited as text, read, and joined with the services of the
    /// seed's table.
    #[test]
    fn decode_an_edited_proc_ip_vs_table_is_read_whole_or_not_at_all(text in mutated_text(TABLE.to_owned())) {
        let (parsed, largest) = bounds::largest_allocation(|| proc_table::parse(&text));
        prop_assert!(largest <= bounds::allowance(text.len(), 4096), "{} bytes at once", largest);
        prop_assert_eq!(&proc_table::parse(&text), &parsed, "deterministic");
        if let Some(listed) = parsed {
            let services = proc_table::parse(TABLE).unwrap().into_iter().filter_map(|(l, _)| match l {
                Listed::Addr(key) => Some(ServiceSpec { key, scheduler: "rr".into(), flags: 0, timeout: 0 }),
                _ => None,
            });
            let fwmarks = [IpFamily::V4, IpFamily::V6].map(|family| ServiceSpec {
                key: ServiceKey::Fwmark { family, mark: 0x1000_0001 },
                scheduler: "rr".into(),
                flags: 0,
                timeout: 0,
            });
            check_join(services.chain(fwmarks).collect(), listed);
        }
    }

    /// Any table of services and real servers reads back as itself.
    #[test]
    fn decode_any_printed_table_reads_back(
        entries in proptest::collection::vec((service_key(), proptest::collection::vec(dest_state(), 0..4)), 0..6)
    ) {
        let text = table_text(&entries);
        let listed = proc_table::parse(&text).unwrap();
        let expected: Vec<(Listed, Vec<DestState>)> = entries
            .iter()
            .map(|(key, dests)| {
                let listed = match key {
                    ServiceKey::Fwmark { mark, .. } => Listed::Fwmark(*mark),
                    addr => Listed::Addr(*addr),
                };
                (listed, dests.clone())
            })
            .collect();
        prop_assert_eq!(&listed, &expected);
        let services = entries.iter().map(|(key, _)| ServiceSpec { key: *key, scheduler: "rr".into(), flags: 0, timeout: 0 });
        check_join(services.collect(), listed);
    }
}

#[test]
fn every_seed_reads() {
    for payload in &seed_payloads()[..7] {
        let service = genl::parse_service(payload);
        let dest = genl::parse_dest(payload, IpFamily::V4);
        assert!(service.is_some() || dest.is_some(), "{payload:?}");
    }
    assert_eq!(genl::parse_family_id(seed_payloads().last().unwrap()), Some(0x20));
    assert_eq!(
        genl::parse_service(&seed_payloads()[7]),
        genl::parse_service(&seed_payloads()[0]),
        "stats are passed over"
    );
    for datagram in seed_datagrams() {
        let (result, _) = read(&datagram, true);
        assert!(result.is_ok() || result == Err("kernel 17".into()), "{result:?}");
    }
    assert_eq!(read(&seed_datagrams()[0], true).1.len(), 4, "the other request's message is skipped");
    assert_eq!(proc_table::parse(TABLE).map(|t| t.len()), Some(6));
    let _ = mutated_bytes(vec![1]);
}

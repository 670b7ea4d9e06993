//! Byte-level tests: kproxy's requests against `ipvsadm` 1.31's, captured with
//! `strace -e sendmsg -xx ipvsadm ...` in the guest kernel (6.1; the IPVS family id was 0x20).
//! Only the generic netlink payload is compared (the header carries pid and sequence).
//!
//! Where ipvsadm sends more than needed (a full service description when only its identity is
//! asked for), the identity part and the destination attributes are compared instead.

use super::*;
use crate::netlink;

/// `NEW_SERVICE_TCP_RR`
const NEW_SERVICE_TCP_RR: &str = r"\x01\x01\x00\x00\x54\x00\x01\x80\x06\x00\x01\x00\x02\x00\x00\x00\x06\x00\x02\x00\x06\x00\x00\x00\x14\x00\x03\x00\xc6\x12\x80\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x06\x00\x04\x00\x00\x50\x00\x00\x07\x00\x06\x00\x72\x72\x00\x00\x0c\x00\x07\x00\x00\x00\x00\x00\xff\xff\xff\xff\x08\x00\x08\x00\x00\x00\x00\x00\x08\x00\x09\x00\xff\xff\xff\xff";
/// `SET_SERVICE_UDP_WRR_PERSISTENT_30`
const SET_SERVICE_UDP_WRR_PERSISTENT_30: &str = r"\x02\x01\x00\x00\x54\x00\x01\x80\x06\x00\x01\x00\x02\x00\x00\x00\x06\x00\x02\x00\x11\x00\x00\x00\x14\x00\x03\x00\xc6\x12\x80\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x06\x00\x04\x00\x00\x35\x00\x00\x08\x00\x06\x00\x77\x72\x72\x00\x0c\x00\x07\x00\x01\x00\x00\x00\xff\xff\xff\xff\x08\x00\x08\x00\x1e\x00\x00\x00\x08\x00\x09\x00\xff\xff\xff\xff";
/// `NEW_DEST_UDP_MASQ_WEIGHT_1`
const NEW_DEST_UDP_MASQ_WEIGHT_1: &str = r"\x05\x01\x00\x00\x54\x00\x01\x80\x06\x00\x01\x00\x02\x00\x00\x00\x06\x00\x02\x00\x11\x00\x00\x00\x14\x00\x03\x00\xc6\x12\x80\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x06\x00\x04\x00\x00\x35\x00\x00\x05\x00\x06\x00\x00\x00\x00\x00\x0c\x00\x07\x00\x00\x00\x00\x00\xff\xff\xff\xff\x08\x00\x08\x00\x00\x00\x00\x00\x08\x00\x09\x00\xff\xff\xff\xff\x60\x00\x02\x80\x06\x00\x0b\x00\x02\x00\x00\x00\x14\x00\x01\x00\xc6\x12\x10\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x06\x00\x02\x00\x1f\x90\x00\x00\x08\x00\x03\x00\x00\x00\x00\x00\x08\x00\x04\x00\x01\x00\x00\x00\x05\x00\x0d\x00\x00\x00\x00\x00\x06\x00\x0e\x00\x00\x00\x00\x00\x06\x00\x0f\x00\x00\x00\x00\x00\x08\x00\x05\x00\x00\x00\x00\x00\x08\x00\x06\x00\x00\x00\x00\x00";
/// `DEL_DEST`
const DEL_DEST: &str = r"\x07\x01\x00\x00\x54\x00\x01\x80\x06\x00\x01\x00\x02\x00\x00\x00\x06\x00\x02\x00\x11\x00\x00\x00\x14\x00\x03\x00\xc6\x12\x80\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x06\x00\x04\x00\x00\x35\x00\x00\x05\x00\x06\x00\x00\x00\x00\x00\x0c\x00\x07\x00\x00\x00\x00\x00\xff\xff\xff\xff\x08\x00\x08\x00\x00\x00\x00\x00\x08\x00\x09\x00\xff\xff\xff\xff\x60\x00\x02\x80\x06\x00\x0b\x00\x02\x00\x00\x00\x14\x00\x01\x00\xc6\x12\x10\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x06\x00\x02\x00\x1f\x90\x00\x00\x08\x00\x03\x00\x03\x00\x00\x00\x08\x00\x04\x00\x01\x00\x00\x00\x05\x00\x0d\x00\x00\x00\x00\x00\x06\x00\x0e\x00\x00\x00\x00\x00\x06\x00\x0f\x00\x00\x00\x00\x00\x08\x00\x05\x00\x00\x00\x00\x00\x08\x00\x06\x00\x00\x00\x00\x00";
/// `NEW_SERVICE_FWMARK_V6_MH_PORT`
const NEW_SERVICE_FWMARK_V6_MH_PORT: &str = r"\x01\x01\x00\x00\x38\x00\x01\x80\x06\x00\x01\x00\x0a\x00\x00\x00\x08\x00\x05\x00\x01\x00\x00\x10\x07\x00\x06\x00\x6d\x68\x00\x00\x0c\x00\x07\x00\x10\x00\x00\x00\xff\xff\xff\xff\x08\x00\x08\x00\x00\x00\x00\x00\x08\x00\x09\x00\x80\x00\x00\x00";
/// `NEW_SERVICE_TCP_V6_SH`
const NEW_SERVICE_TCP_V6_SH: &str = r"\x01\x01\x00\x00\x54\x00\x01\x80\x06\x00\x01\x00\x0a\x00\x00\x00\x06\x00\x02\x00\x06\x00\x00\x00\x14\x00\x03\x00\xfd\x00\x00\x96\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10\x06\x00\x04\x00\x00\x50\x00\x00\x07\x00\x06\x00\x73\x68\x00\x00\x0c\x00\x07\x00\x00\x00\x00\x00\xff\xff\xff\xff\x08\x00\x08\x00\x00\x00\x00\x00\x08\x00\x09\x00\x80\x00\x00\x00";
/// `DEL_SERVICE_TCP`
const DEL_SERVICE_TCP: &str = r"\x03\x01\x00\x00\x54\x00\x01\x80\x06\x00\x01\x00\x02\x00\x00\x00\x06\x00\x02\x00\x06\x00\x00\x00\x14\x00\x03\x00\xc6\x12\x80\x0a\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x06\x00\x04\x00\x00\x50\x00\x00\x05\x00\x06\x00\x00\x00\x00\x00\x0c\x00\x07\x00\x00\x00\x00\x00\xff\xff\xff\xff\x08\x00\x08\x00\x00\x00\x00\x00\x08\x00\x09\x00\xff\xff\xff\xff";
/// `SET_CONFIG_900_120_300`
const SET_CONFIG_900_120_300: &str =
    r"\x0c\x01\x00\x00\x08\x00\x04\x00\x84\x03\x00\x00\x08\x00\x05\x00\x78\x00\x00\x00\x08\x00\x06\x00\x2c\x01\x00\x00";

const FAMILY: u16 = 0x20;

fn bytes(escaped: &str) -> Vec<u8> {
    escaped.split("\\x").filter(|s| !s.is_empty()).map(|h| u8::from_str_radix(h, 16).unwrap()).collect()
}

fn payload(op: &IpvsOp) -> Vec<u8> {
    let b = request(FAMILY, op).finish(1);
    assert_eq!(u16::from_ne_bytes([b[4], b[5]]), FAMILY);
    assert_eq!(u16::from_ne_bytes([b[6], b[7]]), NLM_F_REQUEST | NLM_F_ACK);
    b[16..].to_vec()
}

fn tcp(addr: &str, port: u16) -> ServiceKey {
    ServiceKey::Addr { addr: addr.parse().unwrap(), protocol: Protocol::Tcp, port }
}

fn udp(addr: &str, port: u16) -> ServiceKey {
    ServiceKey::Addr { addr: addr.parse().unwrap(), protocol: Protocol::Udp, port }
}

fn spec(key: ServiceKey, scheduler: &str, flags: u32, timeout: u32) -> ServiceSpec {
    ServiceSpec { key, scheduler: scheduler.into(), flags, timeout }
}

#[test]
fn new_service_matches_ipvsadm() {
    let p = payload(&IpvsOp::AddService(spec(tcp("198.18.128.10", 80), "rr", 0, 0)));
    assert_eq!(p, bytes(NEW_SERVICE_TCP_RR));
}

#[test]
fn edit_persistent_service_matches_ipvsadm() {
    let p = payload(&IpvsOp::UpdateService(spec(udp("198.18.128.10", 53), "wrr", F_PERSISTENT, 30)));
    assert_eq!(p, bytes(SET_SERVICE_UDP_WRR_PERSISTENT_30));
}

#[test]
fn ipv6_and_fwmark_services_match_ipvsadm() {
    let p = payload(&IpvsOp::AddService(spec(tcp("fd00:96::10", 80), "sh", 0, 0)));
    assert_eq!(p, bytes(NEW_SERVICE_TCP_V6_SH));
    let fw = ServiceKey::Fwmark { family: IpFamily::V6, mark: 268_435_457 };
    let p = payload(&IpvsOp::AddService(spec(fw, "mh", F_SCHED2, 0)));
    assert_eq!(p, bytes(NEW_SERVICE_FWMARK_V6_MH_PORT));
}

#[test]
fn set_timeouts_matches_ipvsadm() {
    let p = payload(&IpvsOp::SetTimeouts { tcp: 900, tcp_fin: 120, udp: 300 });
    assert_eq!(p, bytes(SET_CONFIG_900_120_300));
}

/// The attributes of nest `ty` in a genl payload.
fn nest(p: &[u8], ty: u16) -> Vec<u8> {
    netlink::find(&p[4..], ty).unwrap().to_vec()
}

#[test]
fn new_dest_matches_ipvsadm_masquerading_dest() {
    let key = udp("198.18.128.10", 53);
    let dest = DestSpec { key: DestKey { addr: "198.18.16.10".parse().unwrap(), port: 8080 }, weight: 1 };
    let ours = payload(&IpvsOp::AddDest(key, dest));
    let theirs = bytes(NEW_DEST_UDP_MASQ_WEIGHT_1);
    assert_eq!(ours[..4], theirs[..4], "command and version");
    assert_eq!(nest(&ours, CMD_ATTR_DEST), nest(&theirs, CMD_ATTR_DEST));
    // ipvsadm describes the whole service; the identity attributes are the same.
    let (o, t) = (nest(&ours, CMD_ATTR_SERVICE), nest(&theirs, CMD_ATTR_SERVICE));
    for attr in [SVC_ATTR_AF, SVC_ATTR_PROTOCOL, SVC_ATTR_ADDR, SVC_ATTR_PORT] {
        assert_eq!(netlink::find(&o, attr), netlink::find(&t, attr), "attribute {attr}");
    }
}

#[test]
fn delete_requests_carry_the_identities_ipvsadm_sends() {
    let key = udp("198.18.128.10", 53);
    let ours = payload(&IpvsOp::DeleteDest(key, DestKey { addr: "198.18.16.10".parse().unwrap(), port: 8080 }));
    let theirs = bytes(DEL_DEST);
    assert_eq!(ours[..4], theirs[..4]);
    let (o, t) = (nest(&ours, CMD_ATTR_DEST), nest(&theirs, CMD_ATTR_DEST));
    for attr in [DEST_ATTR_ADDR_FAMILY, DEST_ATTR_ADDR, DEST_ATTR_PORT] {
        assert_eq!(netlink::find(&o, attr), netlink::find(&t, attr), "attribute {attr}");
    }
    let ours = payload(&IpvsOp::DeleteService(tcp("198.18.128.10", 80)));
    let theirs = bytes(DEL_SERVICE_TCP);
    assert_eq!(ours[..4], theirs[..4]);
    let (o, t) = (nest(&ours, CMD_ATTR_SERVICE), nest(&theirs, CMD_ATTR_SERVICE));
    let identity: Vec<_> = netlink::attrs(&o).collect();
    assert_eq!(identity.len(), 4);
    for (ty, value) in identity {
        assert_eq!(netlink::find(&t, ty), Some(value), "attribute {ty}");
    }
}

#[test]
fn dumped_services_and_dests_decode() {
    // A dump answer has the same layout as a NEW_SERVICE request (plus stats, ignored).
    let s = parse_service(&bytes(SET_SERVICE_UDP_WRR_PERSISTENT_30)).unwrap();
    assert_eq!(s, spec(udp("198.18.128.10", 53), "wrr", F_PERSISTENT, 30));
    let fw = parse_service(&bytes(NEW_SERVICE_FWMARK_V6_MH_PORT)).unwrap();
    assert_eq!(fw.key, ServiceKey::Fwmark { family: IpFamily::V6, mark: 0x1000_0001 });
    assert_eq!(fw.flags, F_SCHED2);
    let d = parse_dest(&bytes(NEW_DEST_UDP_MASQ_WEIGHT_1), IpFamily::V4).unwrap();
    assert_eq!(d.spec, DestSpec { key: DestKey { addr: "198.18.16.10".parse().unwrap(), port: 8080 }, weight: 1 });
    assert_eq!((d.active_conns, d.inactive_conns), (0, 0));
}

#[test]
fn family_resolution_asks_the_controller_for_ipvs() {
    let b = resolve_family_request().finish(1);
    assert_eq!(u16::from_ne_bytes([b[4], b[5]]), 0x10);
    // captured: "\x03\x01\x00\x00\x09\x00\x02\x00IPVS\x00\x00\x00\x00"
    assert_eq!(
        &b[16..],
        &bytes("\\x03\\x01\\x00\\x00\\x09\\x00\\x02\\x00\\x49\\x50\\x56\\x53\\x00\\x00\\x00\\x00")[..]
    );
    let mut answer = vec![1, 2, 0, 0];
    answer.extend_from_slice(&[6, 0, 1, 0, 0x20, 0, 0, 0]);
    assert_eq!(parse_family_id(&answer), Some(0x20));
}

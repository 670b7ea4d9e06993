//! Byte-exact tests against messages captured from the kernel and from `conntrack(8)`
//! (see `tests/fixtures/README.md`).

use std::net::IpAddr;

use kproxy_state::{IpFamily, Protocol};

use super::*;

fn hex(text: &str) -> Vec<u8> {
    let text = text.trim();
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap()).collect()
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn tuple(src: &str, src_port: u16, dst: &str, dst_port: u16) -> Tuple {
    Tuple { src: ip(src), dst: ip(dst), src_port, dst_port }
}

const DUMP_V4: &str = include_str!("../../tests/fixtures/dump_v4_sctp_tcp_udp.hex");
const DUMP_V6: &str = include_str!("../../tests/fixtures/dump_v6_udp_zone7.hex");
const TOOL_DELETE: &str = include_str!("../../tests/fixtures/conntrack_tool_delete_v4_udp.hex");

fn udp_v4_flow() -> Flow {
    Flow {
        protocol: Protocol::Udp,
        original: tuple("198.18.1.2", 40000, "198.18.128.10", 53),
        reply: tuple("198.18.2.2", 8053, "198.18.1.2", 40000),
        zone: 0,
        id: Some(0xf609_7c99),
    }
}

fn udp_v6_zone_flow() -> Flow {
    Flow {
        protocol: Protocol::Udp,
        original: tuple("fd00::1:2", 40001, "fd00::80:a", 53),
        reply: tuple("fd00::2:2", 8053, "fd00::1:2", 40001),
        zone: 7,
        id: Some(0x7350_0a5f),
    }
}

#[test]
fn decodes_a_captured_ipv4_dump_of_three_protocols() {
    let replies = decode_replies(&hex(DUMP_V4)).unwrap();
    let seq = 0x6b0d_0815;
    assert_eq!(
        replies,
        vec![
            Reply::Flow {
                seq,
                flow: Flow {
                    protocol: Protocol::Sctp,
                    original: tuple("198.18.1.2", 40002, "198.18.128.11", 9000),
                    reply: tuple("198.18.3.2", 9001, "198.18.1.2", 40002),
                    zone: 0,
                    id: Some(0xec70_ae3a),
                },
                interrupted: false,
            },
            Reply::Flow {
                seq,
                flow: Flow {
                    protocol: Protocol::Tcp,
                    original: tuple("198.18.1.2", 40003, "198.18.128.12", 80),
                    reply: tuple("198.18.4.2", 8080, "198.18.1.2", 40003),
                    zone: 0,
                    id: Some(0xaf44_8f04),
                },
                interrupted: false,
            },
            Reply::Flow { seq, flow: udp_v4_flow(), interrupted: false },
        ]
    );
}

#[test]
fn decodes_a_captured_ipv6_entry_with_its_zone() {
    let replies = decode_replies(&hex(DUMP_V6)).unwrap();
    assert_eq!(replies, vec![Reply::Flow { seq: 0x6b0d_0810, flow: udp_v6_zone_flow(), interrupted: false }]);
    assert!(udp_v6_zone_flow().is_dnat());
    assert_eq!(udp_v6_zone_flow().family(), IpFamily::V6);
}

/// The netlink and nfgenmsg headers of a delete request for `seq`, with `length` in total.
fn delete_header(length: u32, family: u8, seq: u32) -> Vec<u8> {
    let mut bytes = length.to_le_bytes().to_vec();
    bytes.extend_from_slice(&[0x02, 0x01]); // (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE
    bytes.extend_from_slice(&[0x05, 0x00]); // NLM_F_REQUEST | NLM_F_ACK
    bytes.extend_from_slice(&seq.to_le_bytes());
    bytes.extend_from_slice(&[0, 0, 0, 0]); // port id: the kernel fills it in
    bytes.extend_from_slice(&[family, 0, 0, 0]); // nfgenmsg: family, NFNETLINK_V0, res_id 0
    bytes
}

#[test]
fn encodes_an_ipv4_delete_with_the_tuple_conntrack_tool_sends() {
    let tool = hex(TOOL_DELETE);
    let seq = 0x6b0d_0806;
    // The tool's request starts with the same headers (it sends more attributes, hence the length).
    assert_eq!(tool[4..20], delete_header(0, 2, seq)[4..20]);
    let tool_original_tuple = &tool[20..72];
    let mut expected = delete_header(20 + 52 + 8, 2, seq);
    expected.extend_from_slice(tool_original_tuple);
    expected.extend_from_slice(&[0x08, 0x00, 0x0c, 0x00, 0xf6, 0x09, 0x7c, 0x99]); // CTA_ID, big-endian
    assert_eq!(encode_delete_request(&udp_v4_flow(), seq), expected);
}

#[test]
fn encodes_an_ipv6_delete_with_zone_and_id_as_the_kernel_reports_them() {
    let dump = hex(DUMP_V6);
    let seq = 7;
    // In the dump: CTA_TUPLE_ORIG is bytes 20..96; CTA_ZONE (type 18) is at 0xac; CTA_ID at 0xc4.
    let kernel_original_tuple = &dump[20..96];
    let kernel_zone = &dump[0xac..0xb4];
    let kernel_id = &dump[0xc4..0xcc];
    assert_eq!(kernel_zone[2..4], [18, 0]);
    assert_eq!(kernel_id[2..4], [12, 0]);
    let mut expected = delete_header(20 + 76 + 8 + 8, 10, seq);
    expected.extend_from_slice(kernel_original_tuple);
    expected.extend_from_slice(kernel_zone);
    expected.extend_from_slice(kernel_id);
    assert_eq!(encode_delete_request(&udp_v6_zone_flow(), seq), expected);
}

#[test]
fn a_delete_without_id_or_zone_carries_only_the_tuple() {
    let flow = Flow { id: None, ..udp_v4_flow() };
    let encoded = encode_delete_request(&flow, 1);
    assert_eq!(encoded.len(), 20 + 52);
    assert_eq!(encoded[20..], hex(TOOL_DELETE)[20..72]);
}

#[test]
fn encodes_a_dump_request_filtered_to_one_protocol() {
    let expected: Vec<u8> = [
        &[0x30, 0, 0, 0][..],             // length 48
        &[0x01, 0x01],                    // (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET
        &[0x01, 0x03],                    // NLM_F_REQUEST | NLM_F_DUMP
        &[9, 0, 0, 0],                    // sequence number
        &[0, 0, 0, 0],                    // port id
        &[10, 0, 0, 0],                   // nfgenmsg: AF_INET6
        &[0x10, 0, 0x01, 0x80],           // CTA_TUPLE_ORIG, nested, 16 bytes
        &[0x0c, 0, 0x02, 0x80],           // CTA_TUPLE_PROTO, nested, 12 bytes
        &[0x05, 0, 0x01, 0, 17, 0, 0, 0], // CTA_PROTO_NUM = 17 (UDP), padded
        &[0x0c, 0, 0x19, 0x80],           // CTA_FILTER, nested, 12 bytes
        &[0x08, 0, 0x01, 0],              // CTA_FILTER_ORIG_FLAGS (host-endian u32) =
        &8u32.to_ne_bytes(),              // CTA_FILTER_FLAG(CTA_PROTO_NUM)
    ]
    .concat();
    assert_eq!(encode_dump_request(IpFamily::V6, Protocol::Udp, 9), expected);
    let sctp = encode_dump_request(IpFamily::V4, Protocol::Sctp, 9);
    assert_eq!(sctp[16], 2, "AF_INET");
    assert_eq!(sctp[32], 132, "IPPROTO_SCTP");
}

#[test]
fn decodes_acks_errors_and_the_end_of_a_dump() {
    // The acknowledgement the kernel sent for the captured delete.
    let ack =
        hex("240000000200000106080d6baf03f8ba00000000b000000002010500 06080d6b00000000".replace(' ', "").as_str());
    assert_eq!(decode_replies(&ack).unwrap(), vec![Reply::Ack { seq: 0x6b0d_0806, errno: 0 }]);
    // The same with error -ENOENT, followed by the end of a dump, in one datagram.
    let mut datagram = ack.clone();
    datagram[16..20].copy_from_slice(&(-2i32).to_le_bytes());
    datagram.extend_from_slice(&hex("14000000030002000e080d6b0d56000000000000"));
    assert_eq!(
        decode_replies(&datagram).unwrap(),
        vec![Reply::Ack { seq: 0x6b0d_0806, errno: 2 }, Reply::Done { seq: 0x6b0d_080e }]
    );
}

#[test]
fn an_errno_without_a_positive_counterpart_is_read_not_a_panic() {
    // Found by fuzzing (crates/fuzz/tests/conntrack_netlink.rs): `abs` overflowed.
    let mut ack =
        hex("240000000200000106080d6baf03f8ba00000000b000000002010500 06080d6b00000000".replace(' ', "").as_str());
    ack[16..20].copy_from_slice(&i32::MIN.to_le_bytes());
    assert_eq!(decode_replies(&ack).unwrap(), vec![Reply::Ack { seq: 0x6b0d_0806, errno: i32::MAX }]);
}

#[test]
fn a_truncated_datagram_is_an_error_not_a_panic() {
    let dump = hex(DUMP_V4);
    assert!(matches!(decode_replies(&dump[..100]), Err(Error::Decode(_))));
}

#[test]
fn a_garbled_entry_is_reported_and_the_rest_still_decodes() {
    let mut dump = hex(DUMP_V4);
    // Make the first entry's CTA_TUPLE_ORIG claim more bytes than the message has.
    dump[20] = 0xf0;
    let replies = decode_replies(&dump).unwrap();
    assert!(matches!(replies[0], Reply::Undecodable { seq: 0x6b0d_0815, .. }), "{replies:?}");
    assert_eq!(replies[2], Reply::Flow { seq: 0x6b0d_0815, flow: udp_v4_flow(), interrupted: false });
}

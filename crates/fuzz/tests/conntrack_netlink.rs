//! Fuzzing the ctnetlink reply decoder (`kproxy_conntrack::netlink::decode_replies`): datagrams
//! the kernel sent (captured dumps, acknowledgements, errors, the end of a dump) with their
//! bytes edited. Nothing panics or allocates by what a length field claims; a datagram is either
//! refused as a whole (a message length that does not fit, named in the error) or read message
//! by message, a garbled entry reported as undecodable while the entries around it still
//! decode; every flow decoded can be deleted again (its delete request encodes).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is a test failure

mod binary;
mod bounds;

use binary::{from_hex, mutated_bytes, mutated_seed};
use kproxy_conntrack::Error;
use kproxy_conntrack::netlink::{Reply, decode_replies, encode_delete_request, encode_dump_request};
use kproxy_state::{IpFamily, Protocol};
use proptest::prelude::*;

const DUMP_V4: &str = include_str!("../../conntrack/tests/fixtures/dump_v4_sctp_tcp_udp.hex");
const DUMP_V6: &str = include_str!("../../conntrack/tests/fixtures/dump_v6_udp_zone7.hex");
const TOOL_DELETE: &str = include_str!("../../conntrack/tests/fixtures/conntrack_tool_delete_v4_udp.hex");
/// The kernel's acknowledgement of the captured delete (`NLMSG_ERROR` with errno 0).
const ACK: &str = "240000000200000106080d6baf03f8ba00000000b000000002010500 06080d6b00000000";
/// The end of a dump (`NLMSG_DONE`).
const DONE: &str = "14000000030002000e080d6b0d56000000000000";

/// Datagrams as the kernel sends them, and messages kproxy sends (which decode as skipped).
fn seeds() -> Vec<Vec<u8>> {
    let mut enoent = from_hex(ACK);
    enoent[16..20].copy_from_slice(&(-2i32).to_ne_bytes());
    let mut ack_then_done = from_hex(ACK);
    ack_then_done.extend(from_hex(DONE));
    let mut v6_then_done = from_hex(DUMP_V6);
    v6_then_done.extend(from_hex(DONE));
    vec![
        from_hex(DUMP_V4),
        from_hex(DUMP_V6),
        v6_then_done,
        from_hex(ACK),
        enoent,
        ack_then_done,
        from_hex(TOOL_DELETE),
        encode_dump_request(IpFamily::V6, Protocol::Sctp, 9),
    ]
}

/// The messages of a well-formed datagram (each padded to 4 bytes).
fn split(datagram: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = datagram;
    while rest.len() >= 16 {
        let len = u32::from_ne_bytes(rest[..4].try_into().unwrap()) as usize;
        let padded = ((len + 3) & !3).min(rest.len());
        out.push(rest[..padded].to_vec());
        rest = &rest[padded..];
    }
    out
}

/// `payload` behind the 16-byte header of `message`, with the header's length set to fit.
fn with_payload(message: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut out = message[..16].to_vec();
    out.extend_from_slice(payload);
    let len = out.len() as u32;
    out[..4].copy_from_slice(&len.to_ne_bytes());
    out.resize((out.len() + 3) & !3, 0);
    out
}

/// Decodes `bytes` within the allocation bound, twice (the same both times).
fn decode(bytes: &[u8]) -> Result<Vec<Reply>, Error> {
    let (decoded, largest) = bounds::largest_allocation(|| decode_replies(bytes));
    assert!(largest <= bounds::allowance(bytes.len(), 64 * 1024), "{largest} bytes at once for {} bytes", bytes.len());
    let again = decode_replies(bytes);
    assert_eq!(format!("{decoded:?}"), format!("{again:?}"), "decoding is deterministic");
    decoded
}

fn check_replies(bytes: &[u8], replies: &[Reply]) {
    assert!(replies.len() <= bytes.len() / 16, "{} replies from {} bytes", replies.len(), bytes.len());
    for reply in replies {
        match reply {
            Reply::Flow { flow, seq, .. } => {
                let families =
                    [flow.original.src, flow.original.dst, flow.reply.src, flow.reply.dst].map(|a| a.is_ipv4());
                assert!(families.iter().all(|v4| *v4 == families[0]), "a flow of two families: {flow:?}");
                // The reconciler deletes what it decoded: the request must encode.
                let request = encode_delete_request(flow, *seq);
                assert!(request.len() >= 20, "{flow}: {request:?}");
            }
            Reply::Undecodable { reason, .. } => assert!(!reason.is_empty()),
            Reply::Ack { errno, .. } => assert!(*errno >= 0, "an errno is positive: {errno}"),
            Reply::Skipped { .. } | Reply::Done { .. } => {}
        }
    }
}

proptest! {
    #![proptest_config(bounds::cases(1024))]

    /// The fuzz target: whole datagrams, edited anywhere (headers included).
    #[test]
    fn decode_an_edited_ctnetlink_datagram_is_read_or_refused_by_length(bytes in mutated_seed(seeds())) {
        match decode(&bytes) {
            Ok(replies) => check_replies(&bytes, &replies),
            Err(Error::Decode(reason)) => prop_assert!(reason.contains("length"), "{}", reason),
            Err(other) => prop_assert!(false, "not a decoding error: {}", other),
        }
    }

    /// One entry of a captured dump garbled inside its message: it is reported (or skipped),
    /// and the other entries decode as they did.
    #[test]
    fn decode_a_garbled_entry_leaves_the_others_as_they_were(
        (which, payload) in (0usize..3).prop_flat_map(|which| {
            let message = split(&from_hex(DUMP_V4))[which].clone();
            let len = u32::from_ne_bytes(message[..4].try_into().unwrap()) as usize;
            (Just(which), mutated_bytes(message[16..len].to_vec()))
        })
    ) {
        let messages = split(&from_hex(DUMP_V4));
        let original = decode_replies(&from_hex(DUMP_V4)).unwrap();
        let mut datagram = Vec::new();
        for (i, message) in messages.iter().enumerate() {
            if i == which {
                datagram.extend(with_payload(message, &payload));
            } else {
                datagram.extend_from_slice(message);
            }
        }
        let replies = decode(&datagram).unwrap();
        check_replies(&datagram, &replies);
        prop_assert_eq!(replies.len(), 3);
        for (i, (now, before)) in replies.iter().zip(&original).enumerate() {
            if i == which {
                let seq_kept = match now {
                    Reply::Flow { seq, .. } | Reply::Skipped { seq } | Reply::Undecodable { seq, .. } => *seq == 0x6b0d_0815,
                    other => panic!("an entry decoded as {other:?}"),
                };
                prop_assert!(seq_kept, "{:?}", now);
            } else {
                prop_assert_eq!(now, before);
            }
        }
    }
}

#[test]
fn every_seed_decodes() {
    for seed in seeds() {
        let replies = decode_replies(&seed).unwrap();
        assert!(!replies.is_empty());
        assert!(!replies.iter().any(|r| matches!(r, Reply::Undecodable { .. })), "{replies:?}");
    }
}

//! Fuzzing what kproxy reads back from nf_tables and its neighbours over netlink: the datagram
//! walk (`socket::messages`) and the kernel's acknowledgements (`socket::acknowledgement`), the
//! attribute walk (`wire::Attrs`), the listing's per-message readers (`listing::chain_of`,
//! `rule_chain_of`, `rule_comment`, `set_of`, `element_count`), the counter readers
//! (`counters::rule_packets`, `element_counts`), ip set names (`ipset::decode_name`) and
//! nfacct counters (`acct::decode`).
//!
//! Seeds are the messages the crate's own encoder writes for the fixture commands, which match
//! what `nft` sends byte for byte (crates/nft-netlink/tests/encoding.rs); a dump answer carries
//! the same attributes. Nothing panics or allocates by what a length claims; the attribute walk
//! stays inside its buffer; a listing read back from the encoder's messages is the listing the
//! transaction was expected to make.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is a test failure

mod binary;
mod bounds;

use binary::mutated_seed;
use kproxy_nft_model::{Op, TableListing, TableRef, Transaction, parse};
use kproxy_nft_netlink::batch::Batch;
use kproxy_nft_netlink::socket::{acknowledgement, messages};
use kproxy_nft_netlink::sys::*;
use kproxy_nft_netlink::wire::{Attrs, MsgBuf};
use kproxy_nft_netlink::{acct, counters, ipset, listing};
use proptest::prelude::*;

const COMMANDS: &str = include_str!("../../nft-netlink/tests/fixtures/nft-commands.nft");
const COMMENTS: &str = include_str!("../../nft-netlink/tests/fixtures/nft-commands-comments.nft");
const COUNTERS: &str = include_str!("../../nft-netlink/tests/fixtures/nft-commands-counters.nft");
const IPVS: &str = include_str!("../../nft-netlink/tests/fixtures/nft-commands-ipvs.nft");

fn transaction(commands: &str) -> Transaction {
    let mut tx = Transaction::new();
    for line in commands.lines().filter(|l| !l.trim().is_empty()) {
        tx.push(parse::op(line).unwrap());
    }
    tx
}

/// The encoded batch of each fixture.
fn batches() -> Vec<(Transaction, Vec<u8>)> {
    [COMMANDS, COMMENTS, COUNTERS, IPVS]
        .into_iter()
        .map(|commands| {
            let tx = transaction(commands);
            let bytes = Batch::encode(&tx, 0).unwrap().bytes().to_vec();
            (tx, bytes)
        })
        .collect()
}

/// A few messages of every kind the fixtures hold (their attributes, after `nfgenmsg`), and
/// the other subsystems' answers.
fn seed_payloads() -> Vec<Vec<u8>> {
    let mut by_kind: std::collections::BTreeMap<u16, Vec<Vec<u8>>> = Default::default();
    for (_, bytes) in batches() {
        for m in messages(&bytes) {
            let kept = by_kind.entry(m.kind).or_default();
            if kept.len() < 6 && m.payload.len() > 4 {
                kept.push(m.payload[4..].to_vec());
            }
        }
    }
    let mut seeds: Vec<Vec<u8>> = by_kind.into_values().flatten().collect();
    seeds.push(ipset::destroy_request("KUBE-CLUSTER-IP").bytes()[20..].to_vec());
    let mut counter = MsgBuf::new();
    counter.put_str(1, "ct_state_invalid_dropped_pkts");
    counter.put_be64(2, 42);
    counter.put_be64(3, 4200);
    seeds.push(counter.bytes().to_vec());
    seeds
}

/// Datagrams: the fixtures' batches cut to a few messages, and acknowledgements and errors as
/// the kernel sends them (code, then the header of the message answered).
fn seed_datagrams() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = batches()
        .into_iter()
        .map(|(_, bytes)| {
            let end: usize = messages(&bytes).take(6).map(|m| (16 + m.payload.len() + 3) & !3).sum();
            bytes[..end].to_vec()
        })
        .collect();
    for code in [0i32, -2, -16] {
        let mut m = MsgBuf::new();
        m.begin(NLMSG_ERROR, 0, 7, 0, 0);
        let mut bytes = m.bytes()[..16].to_vec();
        bytes.extend_from_slice(&code.to_ne_bytes());
        bytes.extend_from_slice(&m.bytes()[..16]);
        let len = bytes.len() as u32;
        bytes[..4].copy_from_slice(&len.to_ne_bytes());
        seeds.push(bytes);
    }
    seeds
}

/// Walks every attribute, nested ones too (to a depth of 8): each stays inside its buffer.
fn walk(buffer: &[u8], depth: usize) -> usize {
    let mut attributes = 0;
    let mut used = 0;
    for attr in Attrs(buffer) {
        attributes += 1;
        used += 4 + attr.data.len();
        assert!(used <= buffer.len() + 3, "{used} bytes of attributes in {}", buffer.len());
        let _ = (attr.str(), attr.be32(), attr.be64());
        if depth < 8 {
            attributes += walk(attr.data, depth + 1);
        }
    }
    assert!(attributes <= buffer.len(), "{attributes} attributes in {} bytes", buffer.len());
    attributes
}

/// Every reader on one message's attributes.
fn read_payload(payload: &[u8]) {
    walk(payload, 0);
    let count = listing::element_count(payload);
    assert!(count <= payload.len() / 4, "{count} elements in {} bytes", payload.len());
    for table in ["kproxy", ""] {
        let _ = (listing::chain_of(payload, table), listing::rule_chain_of(payload, table));
        if let Some((set, _)) = listing::set_of(payload, table) {
            assert!(!set.contains('\0'));
        }
    }
    let _ = listing::rule_comment(payload);
    let packets = counters::rule_packets(payload);
    assert!(packets.len() <= payload.len() / 4);
    let counted = counters::element_counts(payload);
    assert!(counted.len() <= payload.len() / 4);
    let _ = ipset::decode_name(payload);
    if let Some(counter) = acct::decode(payload) {
        assert!(!counter.name.contains('\0'));
    }
}

proptest! {
    #![proptest_config(bounds::cases(1024))]

    /// The fuzz target: one message's attributes, edited, through every reader.
    #[test]
    fn decode_an_edited_nf_tables_message_is_read_within_its_bytes(payload in mutated_seed(seed_payloads())) {
        let ((), largest) = bounds::largest_allocation(|| read_payload(&payload));
        prop_assert!(largest <= bounds::allowance(payload.len(), 4096), "{} bytes at once", largest);
        prop_assert_eq!(listing::rule_comment(&payload), listing::rule_comment(&payload));
    }

    /// Whole datagrams, edited: split into messages within the datagram, an `NLMSG_ERROR`
    /// read as an acknowledgement or the kernel's error.
    #[test]
    fn decode_an_edited_netlink_datagram_is_split_within_its_bytes(datagram in mutated_seed(seed_datagrams())) {
        let (walked, largest) = bounds::largest_allocation(|| {
            let mut walked = 0;
            for m in messages(&datagram) {
                walked += 16 + m.payload.len();
                if m.kind == NLMSG_ERROR {
                    if let Err(error) = acknowledgement(m.payload) {
                        assert!(!error.to_string().is_empty());
                    }
                } else if m.payload.len() > 4 {
                    read_payload(&m.payload[4..]);
                }
            }
            walked
        });
        prop_assert!(largest <= bounds::allowance(datagram.len(), 4096), "{} bytes at once", largest);
        prop_assert!(walked <= datagram.len(), "{} bytes of messages in {}", walked, datagram.len());
    }
}

/// The listing of `table` read with the listing's readers from the messages of `bytes`, in
/// order (deleted tables and elements too), as the kernel's dumps would show it afterwards.
fn listing_of(bytes: &[u8], table: &str) -> TableListing {
    let mut l = TableListing::default();
    for m in messages(bytes) {
        let p = m.payload.get(4..).unwrap_or_default();
        let set_of_elements =
            || Attrs(p).find(|a| a.kind == NFTA_SET_ELEM_LIST_SET).map(|a| a.str()).unwrap_or_default();
        match m.kind.checked_sub(NFNL_SUBSYS_NFTABLES << 8) {
            Some(NFT_MSG_DELTABLE)
                if Attrs(p).find(|a| a.kind == NFTA_TABLE_NAME).map(|a| a.str()).as_deref() == Some(table) =>
            {
                l = TableListing::default();
            }
            Some(NFT_MSG_NEWCHAIN) => {
                if let Some(chain) = listing::chain_of(p, table) {
                    l.chains.entry(chain).or_insert(0);
                }
            }
            Some(NFT_MSG_NEWRULE) => {
                if let Some(chain) = listing::rule_chain_of(p, table) {
                    let rules = l.chains.entry(chain.clone()).or_insert(0);
                    if *rules == 0
                        && let Some(comment) = listing::rule_comment(p)
                    {
                        l.first_comments.insert(chain, comment);
                    }
                    *rules += 1;
                }
            }
            Some(NFT_MSG_NEWSET) => {
                if let Some((set, dynamic)) = listing::set_of(p, table) {
                    l.sets.insert(set, if dynamic { None } else { Some(0) });
                }
            }
            Some(NFT_MSG_NEWSETELEM) => {
                if let Some(Some(n)) = l.sets.get_mut(&set_of_elements()) {
                    *n += listing::element_count(p);
                }
            }
            Some(NFT_MSG_DELSETELEM) => {
                if let Some(Some(n)) = l.sets.get_mut(&set_of_elements()) {
                    *n -= listing::element_count(p);
                }
            }
            _ => {}
        }
    }
    l
}

#[test]
fn decode_the_listing_of_every_fixture_reads_back_what_it_holds() {
    for (tx, bytes) in batches() {
        let tables: std::collections::BTreeSet<TableRef> = tx
            .ops()
            .iter()
            .filter_map(|op| match op {
                Op::AddTable { table, .. } => Some(table.clone()),
                _ => None,
            })
            .collect();
        assert!(!tables.is_empty());
        for table in tables {
            let expected = TableListing::expected(&tx, &table);
            assert!(!expected.chains.is_empty(), "{table:?}");
            // Messages of every family share the bytes: only this table's family is read.
            let family = kproxy_nft_netlink::batch::nfproto(table.family);
            let ours: Vec<u8> = messages(&bytes)
                .filter(|m| m.payload.first() == Some(&family))
                .flat_map(|m| {
                    let mut b = MsgBuf::new();
                    b.begin(m.kind, m.flags, m.seq, family, 0);
                    let mut out = b.bytes().to_vec();
                    out.extend_from_slice(&m.payload[4..]);
                    let len = out.len() as u32;
                    out[..4].copy_from_slice(&len.to_ne_bytes());
                    out.resize((out.len() + 3) & !3, 0);
                    out
                })
                .collect();
            let mut read = listing_of(&ours, &table.name);
            // The expected listing does not count the elements of sets of single-field ranges
            // (the kernel's depend on how the ranges were added).
            for (set, count) in &expected.sets {
                if count.is_none()
                    && let Some(read) = read.sets.get_mut(set)
                {
                    *read = None;
                }
            }
            assert_eq!(read, expected, "{table:?}");
        }
    }
}

#[test]
fn every_seed_is_read() {
    assert!(seed_payloads().len() > 20);
    for seed in seed_payloads() {
        read_payload(&seed);
    }
    assert_eq!(ipset::decode_name(&seed_payloads()[seed_payloads().len() - 2]), Some("KUBE-CLUSTER-IP".into()));
    assert!(acct::decode(seed_payloads().last().unwrap()).is_some());
    for datagram in seed_datagrams() {
        assert!(messages(&datagram).count() > 0);
    }
}

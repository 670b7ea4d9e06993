#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Byte-level check of the encoder against `nft` itself: every command of the fixture is
//! encoded and compared, message by message, with what `nft --debug=mnl` sent for it (see
//! `fixtures/README.md`). Covers the whole initial ruleset of the example cluster in both
//! families plus every other rule form the renderer emits.

use kproxy_nft_model::{Op, Transaction, parse};
use kproxy_nft_netlink::batch::Batch;
use kproxy_nft_netlink::socket::messages;

const COMMANDS: &str = include_str!("fixtures/nft-commands.nft");
const MNL: &str = include_str!("fixtures/nft-commands.mnl.hex");
const LATER: &str = include_str!("fixtures/nft-commands-later.nft");
const LATER_MNL: &str = include_str!("fixtures/nft-commands-later.mnl.hex");
const IPVS: &str = include_str!("fixtures/nft-commands-ipvs.nft");
const IPVS_MNL: &str = include_str!("fixtures/nft-commands-ipvs.mnl.hex");
const ACCEL: &str = include_str!("fixtures/nft-commands-accel.nft");
const ACCEL_MNL: &str = include_str!("fixtures/nft-commands-accel.mnl.hex");
const COUNTERS: &str = include_str!("fixtures/nft-commands-counters.nft");
const COUNTERS_MNL: &str = include_str!("fixtures/nft-commands-counters.mnl.hex");
const AFFINITY: &str = include_str!("fixtures/nft-commands-affinity.nft");
const AFFINITY_MNL: &str = include_str!("fixtures/nft-commands-affinity.mnl.hex");
const COMMENTS: &str = include_str!("fixtures/nft-commands-comments.nft");
const COMMENTS_MNL: &str = include_str!("fixtures/nft-commands-comments.mnl.hex");

/// A fixture command as a typed operation; it must render back to the same text, so the bytes
/// `nft` sent for the text are the bytes expected for the operation.
fn op(line: &str) -> Op {
    let op = parse::op(line).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(kproxy_nft_netlink::batch::op_text(&op), line.trim(), "the model renders the fixture back");
    op
}

#[test]
fn every_message_matches_what_nft_sends() {
    let (compared, elems) = compare(COMMANDS, MNL);
    assert!(compared > 150 && elems > 30, "{compared} {elems}");
}

/// The statements only the IPVS auxiliary table uses: packet marks from maps whose data is
/// `mark`, conntrack mark tests and updates, and `meta l4proto { ... }`, which nft sends as an
/// anonymous constant set created just before its rule (numbered after every named set).
#[test]
fn the_ipvs_auxiliary_table_statements_match_what_nft_sends() {
    let (compared, elems) = compare(IPVS, IPVS_MNL);
    assert_eq!((compared, elems), (30, 9));
}

/// The acceleration table: an `inet` table (an address match first matches `meta nfproto`),
/// a flowtable created without and with devices, device removal, `ct packets >`, `counter`,
/// `flow add`. Captured on a kernel without nf_flow_table: nft prints the batch before the
/// kernel refuses it.
#[test]
fn the_acceleration_table_matches_what_nft_sends() {
    let (compared, elems) = compare(ACCEL, ACCEL_MNL);
    assert_eq!((compared, elems), (19, 3));
}

/// Per-Service counters: counted sets and maps, and the rules that count the packets of
/// served connections by their original destination (`ct original ip daddr`, `ct original
/// proto-dst`, which nft 1.0.6 concatenates only after a `meta l4proto` match), in both
/// families.
#[test]
fn the_service_counter_statements_match_what_nft_sends() {
    let (compared, elems) = compare(COUNTERS, COUNTERS_MNL);
    assert_eq!((compared, elems), (20, 3));
}

/// ClientIP affinity: the table's one dynamic set with a size and no timeout of its own, keyed
/// by the client and two constant halves of an id, and updates that give each entry its
/// service's timeout (`NFTA_DYNSET_TIMEOUT`, in milliseconds), in both families.
#[test]
fn the_shared_affinity_set_and_its_timed_updates_match_what_nft_sends() {
    let (compared, elems) = compare(AFFINITY, AFFINITY_MNL);
    assert_eq!((compared, elems), (11, 0));
}

/// Rule comments (the digest kproxy puts on each chain's first rule), which nft sends as the
/// rule's userdata after its expressions.
#[test]
fn rule_comments_match_what_nft_sends() {
    let (compared, elems) = compare(COMMENTS, COMMENTS_MNL);
    assert_eq!((compared, elems), (6, 0));
}

/// A batch after the first: its rules read maps the encoder has not seen declared, which the
/// explicit protocol match before each `dnat ... map` makes possible. One difference is
/// expected and removed from nft's side: nft gives every set it loads from the kernel into its
/// cache a set id from a per-process counter (`set_alloc`) and sends it in each lookup and
/// element addition; the kernel finds an existing set by name and ignores the id, and the
/// encoder sends ids only for sets created in the batch.
#[test]
fn a_later_batch_matches_what_nft_sends_but_the_cache_set_ids() {
    let mut stripped = 0;
    let theirs: String = LATER_MNL
        .lines()
        .map(|l| {
            let mut p: Vec<String> = l.split_whitespace().map(str::to_owned).collect();
            let kind: u16 = p[0].parse().unwrap();
            if kind == (10 << 8 | 6) || kind == (10 << 8 | 12) {
                let before = p[2].len();
                p[2] = hex(&without_set_ids(&unhex(&p[2]), 0));
                stripped += usize::from(p[2].len() < before);
            }
            p.join(" ") + "\n"
        })
        .collect();
    let (compared, elems) = compare(LATER, &theirs);
    assert!(compared >= 6 && elems >= 3, "{compared} {elems}");
    // Every rule reads a map, every addition is to a set of the earlier batch.
    assert_eq!(stripped, 5 + 3);
}

/// nft's set ids removed from a rule or element message's attributes (`depth` 0): an element
/// list's `NFTA_SET_ELEM_LIST_SET_ID`, the `NFTA_LOOKUP_SET_ID` of lookup expressions; the
/// nests' lengths adjusted.
fn without_set_ids(attrs: &[u8], depth: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = attrs;
    let is_lookup = depth == 2 && {
        let name = b"lookup\0";
        rest.len() >= 4 + name.len() && &rest[4..4 + name.len()] == name
    };
    while rest.len() >= 4 {
        let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
        let kind = u16::from_ne_bytes([rest[2], rest[3]]);
        let data = &rest[4..len];
        rest = &rest[(len.div_ceil(4) * 4).min(rest.len())..];
        // NFTA_SET_ELEM_LIST_SET_ID, and in a lookup's data NFTA_LOOKUP_SET_ID: both 4, plain.
        if (depth == 0 || depth == 3) && kind == 4 {
            continue;
        }
        // Rule expressions (4, nested) > list element (1) > a lookup's data (2).
        let descend = kind & 0x8000 != 0 && matches!((depth, kind & 0x3fff), (0, 4) | (1, 1) | (2, 2));
        let data = if descend && (depth < 2 || is_lookup) { without_set_ids(data, depth + 1) } else { data.to_vec() };
        out.extend_from_slice(&((data.len() + 4) as u16).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&data);
        out.resize(out.len().div_ceil(4) * 4, 0);
    }
    out
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// Encodes `commands` as one batch and compares it with nft's messages; returns how many
/// messages were compared in order and how many elements as a multiset.
fn compare(commands: &str, mnl: &str) -> (usize, usize) {
    let mut tx = Transaction::new();
    for line in commands.lines().filter(|l| !l.trim().is_empty()) {
        tx.push(op(line));
    }
    let batch = Batch::encode(&tx, 0).unwrap();
    let ours: Vec<(u16, u8, String)> =
        messages(batch.bytes()).map(|m| (m.kind, m.payload[0], hex(&m.payload[4..]))).collect();
    let theirs: Vec<(u16, u8, String)> = mnl
        .lines()
        .map(|l| {
            let mut p = l.split_whitespace();
            let kind = p.next().unwrap().parse().unwrap();
            let family = u8::from_str_radix(p.next().unwrap(), 16).unwrap();
            (kind, family, p.next().unwrap_or("").to_owned())
        })
        .collect();
    // BATCH_BEGIN and END carry no payload to compare. nft sends the elements of one set in
    // an order of its own, and a message per command where kproxy sends a run of elements of
    // one set in one message: elements are compared one by one, as a multiset, with the
    // table and set their message names; the rest in order.
    let is_elem = |m: &(u16, u8, String)| m.0 == (10 << 8 | 12);
    let split = |msgs: &[(u16, u8, String)]| {
        let inner = &msgs[1..msgs.len() - 1];
        let rest: Vec<(u16, u8, String)> = inner.iter().filter(|m| !is_elem(m)).cloned().collect();
        let mut elems: Vec<String> = inner.iter().filter(|m| is_elem(m)).flat_map(elements_of).collect();
        elems.sort();
        (rest, elems)
    };
    let ((our_rest, our_elems), (their_rest, their_elems)) = (split(&ours), split(&theirs));
    assert_eq!(our_rest.len(), their_rest.len(), "message count besides elements");
    let first_ops: Vec<usize> = (1..=batch.last_seq())
        .filter(|&seq| !is_elem(&ours[seq as usize]))
        .filter_map(|seq| batch.ops_for_seq(seq).map(|ops| ops.start))
        .collect();
    for (i, (o, t)) in our_rest.iter().zip(&their_rest).enumerate() {
        let op = first_ops.get(i).map(|&i| kproxy_nft_netlink::batch::op_text(&tx.ops()[i]));
        assert_eq!(o, t, "message {i} besides elements: {}", op.unwrap_or_default());
    }
    assert_eq!(our_elems, their_elems);
    (our_rest.len(), our_elems.len())
}

/// The elements of an element message, each with the message's family and other attributes
/// (table, set), its list number made 1 (libnftnl numbers a message's elements from 1).
fn elements_of((_, family, payload): &(u16, u8, String)) -> Vec<String> {
    let attrs = unhex(payload);
    let (mut header, mut elements) = (format!("{family:02x} "), Vec::new());
    let mut rest = attrs.as_slice();
    while rest.len() >= 4 {
        let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
        let kind = u16::from_ne_bytes([rest[2], rest[3]]);
        let (attr, data) = (&rest[..len], &rest[4..len]);
        rest = &rest[(len.div_ceil(4) * 4).min(rest.len())..];
        // NFTA_SET_ELEM_LIST_ELEMENTS (3, nested): one list element after another.
        if kind & 0x3fff != 3 {
            header.push_str(&hex(attr));
            continue;
        }
        let mut list = data;
        while list.len() >= 4 {
            let len = u16::from_ne_bytes([list[0], list[1]]) as usize;
            let mut element = list[..len].to_vec();
            let numbered = u16::from_ne_bytes([element[2], element[3]]);
            element[2..4].copy_from_slice(&((numbered & !0x3fff) | 1).to_ne_bytes());
            elements.push(hex(&element));
            list = &list[(len.div_ceil(4) * 4).min(list.len())..];
        }
    }
    elements.into_iter().map(|e| format!("{header} {e}")).collect()
}

/// A run of one set's elements shares messages up to the bound, and a message names the run of
/// operations it holds; another set, or a deletion, starts a message of its own.
#[test]
fn runs_of_one_sets_elements_share_bounded_messages_that_name_their_operations() {
    let element = |set: &str, i: u32| op(&format!("add element ip kproxy {set} {{ 198.18.{}.{} }}", i / 250, i % 250));
    let mut tx = Transaction::new();
    for i in 0..3_000 {
        tx.push(element("cluster-ips", i));
    }
    tx.push(element("nodeport-ips", 0));
    tx.push(element("cluster-ips", 3_000));
    tx.push(op("delete element ip kproxy cluster-ips { 198.18.0.1 }"));
    let batch = Batch::encode(&tx, 0).unwrap();
    let runs: Vec<std::ops::Range<usize>> = (1..=batch.last_seq()).map(|seq| batch.ops_for_seq(seq).unwrap()).collect();
    // The 3,000 first elements take more than one bounded message, each run after the last.
    let first_set: Vec<&std::ops::Range<usize>> = runs.iter().filter(|r| r.end <= 3_000).collect();
    assert!(first_set.len() > 1 && first_set.iter().all(|r| r.len() > 1), "{runs:?}");
    assert_eq!(runs.iter().flat_map(|r| r.clone()).collect::<Vec<_>>(), (0..tx.len()).collect::<Vec<_>>());
    assert_eq!(runs[runs.len() - 3..], [3_000..3_001, 3_001..3_002, 3_002..3_003]);
    for m in messages(batch.bytes()) {
        // The element list's 16-bit length holds.
        assert!(m.payload.len() < 64 * 1024, "{}", m.payload.len());
    }
}

#[test]
fn a_batch_encoded_ahead_and_renumbered_is_the_batch_encoded_with_those_numbers() {
    let mut tx = Transaction::new();
    for line in COMMANDS.lines().filter(|l| !l.trim().is_empty()) {
        tx.push(op(line));
    }
    let mut ahead = Batch::encode(&tx, 0).unwrap();
    ahead.resequence(u32::MAX - 10);
    let direct = Batch::encode(&tx, u32::MAX - 10).unwrap();
    assert_eq!(ahead.bytes(), direct.bytes());
    assert_eq!((ahead.first_seq(), ahead.last_seq()), (direct.first_seq(), direct.last_seq()));
    assert!(ahead.last_seq() < ahead.first_seq(), "the numbers wrapped");
    assert_eq!(ahead.ops_for_seq(direct.last_seq()), direct.ops_for_seq(direct.last_seq()));
}

#[test]
fn kernel_errors_map_back_to_operations() {
    let mut tx = Transaction::new();
    for line in COMMANDS.lines().take(40) {
        tx.push(op(line));
    }
    let batch = Batch::encode(&tx, 100).unwrap();
    assert_eq!(batch.first_seq(), 100);
    // Every operation is found from its message's sequence number, in order.
    let mut seen: Vec<usize> = (101..=batch.last_seq()).filter_map(|s| batch.ops_for_seq(s)).flatten().collect();
    seen.dedup();
    assert_eq!(seen, (0..tx.len()).collect::<Vec<_>>());
    assert_eq!(batch.ops_for_seq(100), None);
    assert_eq!(batch.ops_for_seq(batch.end_seq()), None);
    // Only the last operation's message asks for an acknowledgement.
    let acked: Vec<u32> = messages(batch.bytes()).filter(|m| m.flags & 0x4 != 0).map(|m| m.seq).collect();
    assert_eq!(acked, vec![batch.last_seq()]);
}

#[test]
fn a_batch_ending_in_a_rule_with_an_anonymous_set_acknowledges_the_rule() {
    // The rule's anonymous set is two messages before it: the acknowledged message must still
    // be the last one, or the sender waits for an acknowledgement that never comes.
    let mut tx = Transaction::new();
    for line in ["add table ip t", "add chain ip t c", "add rule ip t c meta l4proto { tcp, udp, sctp } accept"] {
        tx.push(op(line));
    }
    let batch = Batch::encode(&tx, 100).unwrap();
    let seqs: Vec<u32> = messages(batch.bytes()).map(|m| m.seq).collect();
    assert_eq!(seqs.len(), 7, "begin, table, chain, set, its elements, rule, end: {seqs:?}");
    let acked: Vec<u32> = messages(batch.bytes()).filter(|m| m.flags & 0x4 != 0).map(|m| m.seq).collect();
    assert_eq!(acked, vec![batch.last_seq()]);
    assert_eq!(batch.last_seq(), seqs[5], "the rule's message");
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

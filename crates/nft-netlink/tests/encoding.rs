#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Byte-level check of the encoder against `nft` itself: every command of the fixture is
//! encoded and compared, message by message, with what `nft --debug=mnl` sent for it (see
//! `fixtures/README.md`). Covers the whole initial ruleset of the example cluster in both
//! families plus every other rule form the renderer emits.

use kproxy_nft_netlink::batch::Batch;
use kproxy_nft_netlink::socket::messages;
use kproxy_nftables::transaction::{Chain, Element, Hook, Op, SetDef, TableFamily, TableRef, Transaction};

const COMMANDS: &str = include_str!("fixtures/nft-commands.nft");
const MNL: &str = include_str!("fixtures/nft-commands.mnl.hex");

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_owned().into_boxed_str())
}

fn table(f: &str, name: &str) -> TableRef {
    let family = if f == "ip" { TableFamily::Ip } else { TableFamily::Ip6 };
    TableRef { family, name: name.to_owned() }
}

/// The `{ ... }` block of a command, split at `;`.
fn block(line: &str) -> Vec<String> {
    let Some(start) = line.find('{') else { return Vec::new() };
    let inner = line[start + 1..line.rfind('}').unwrap()].trim();
    inner.split(';').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect()
}

fn unquote(s: &str) -> String {
    s.trim().trim_matches('"').to_owned()
}

/// Parses the fixture's nft commands back into operations (the forms `Transaction::render` emits).
fn op(line: &str) -> Op {
    let w: Vec<&str> = line.split_whitespace().collect();
    let t = table(w[2], w[3]);
    match (w[0], w[1]) {
        ("add", "table") => {
            let comment = block(line).first().map(|c| unquote(c.trim_start_matches("comment")));
            Op::AddTable { table: t, comment }
        }
        ("delete", "table") => Op::DeleteTable(t),
        ("add", "chain") => {
            let b = block(line);
            let hook = b.first().map(|h| {
                let h: Vec<&str> = h.split_whitespace().collect();
                Hook { kind: leak(h[1]), hook: leak(h[3]), priority: leak(h[5]) }
            });
            Op::AddChain(t, Chain { name: w[4].to_owned(), hook })
        }
        ("add", "rule") => {
            let prefix = format!("add rule {} {} {} ", w[2], w[3], w[4]);
            Op::AddRule { table: t, chain: w[4].to_owned(), rule: line[prefix.len()..].to_owned() }
        }
        ("add", "set" | "map") => {
            let mut def = SetDef {
                name: w[4].to_owned(),
                key_type: String::new(),
                data_type: None,
                by_typeof: false,
                flags: vec![],
                timeout: None,
                size: None,
                comment: None,
            };
            for item in block(line) {
                let (k, v) = item.split_once(' ').unwrap();
                def.by_typeof |= k == "typeof";
                match k {
                    "type" | "typeof" => match v.split_once(" : ") {
                        Some((key, data)) => {
                            def.key_type = key.to_owned();
                            def.data_type = Some(data.to_owned());
                        }
                        None => def.key_type = v.to_owned(),
                    },
                    "flags" => def.flags = v.split(',').map(leak).collect(),
                    "timeout" => def.timeout = Some(v.trim_end_matches('s').parse().unwrap()),
                    "comment" => def.comment = Some(unquote(v)),
                    other => panic!("set attribute {other}"),
                }
            }
            Op::AddSet(t, def)
        }
        (verb @ ("add" | "delete"), "element") => {
            let inner = line[line.find('{').unwrap() + 1..line.rfind('}').unwrap()].trim();
            let (key, value) = match inner.split_once(" : ") {
                Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
                None => (inner.to_owned(), None),
            };
            let e = Element { set: w[4].to_owned(), key, value };
            if verb == "add" { Op::AddElement(t, e) } else { Op::DeleteElement(t, e) }
        }
        other => panic!("command {other:?}"),
    }
}

#[test]
fn every_message_matches_what_nft_sends() {
    let mut tx = Transaction::new();
    for line in COMMANDS.lines().filter(|l| !l.trim().is_empty()) {
        tx.push(op(line));
    }
    let batch = Batch::encode(&tx, 0).unwrap();
    let ours: Vec<(u16, u8, String)> =
        messages(batch.bytes()).map(|m| (m.kind, m.payload[0], hex(&m.payload[4..]))).collect();
    let theirs: Vec<(u16, u8, String)> = MNL
        .lines()
        .map(|l| {
            let mut p = l.split_whitespace();
            let kind = p.next().unwrap().parse().unwrap();
            let family = u8::from_str_radix(p.next().unwrap(), 16).unwrap();
            (kind, family, p.next().unwrap_or("").to_owned())
        })
        .collect();
    assert_eq!(ours.len(), theirs.len(), "message count");
    // BATCH_BEGIN and END carry no payload to compare. nft sends the elements of one set in
    // an order of its own, so element messages are compared as a multiset, the rest in order.
    let is_elem = |m: &&(u16, u8, String)| m.0 == (10 << 8 | 12);
    let (mut our_elems, mut their_elems) = (Vec::new(), Vec::new());
    let mut compared = 0;
    for (i, (o, t)) in ours.iter().zip(&theirs).enumerate().skip(1).take(ours.len() - 2) {
        if is_elem(&o) || is_elem(&t) {
            our_elems.push(o.clone());
            their_elems.push(t.clone());
            continue;
        }
        let op = batch.op_for_seq(i as u32).map(|i| kproxy_nft_netlink::batch::op_text(&tx.ops()[i]));
        assert_eq!(o, t, "message {i}: {}", op.unwrap_or_default());
        compared += 1;
    }
    our_elems.sort();
    their_elems.sort();
    assert_eq!(our_elems, their_elems);
    assert!(compared > 150 && our_elems.len() > 30, "{compared} {}", our_elems.len());
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
    let mut seen: Vec<usize> = (101..=batch.last_seq()).filter_map(|s| batch.op_for_seq(s)).collect();
    seen.dedup();
    assert_eq!(seen, (0..tx.len()).collect::<Vec<_>>());
    assert_eq!(batch.op_for_seq(100), None);
    assert_eq!(batch.op_for_seq(batch.end_seq()), None);
    // Only the last operation's message asks for an acknowledgement.
    let acked: Vec<u32> = messages(batch.bytes()).filter(|m| m.flags & 0x4 != 0).map(|m| m.seq).collect();
    assert_eq!(acked, vec![batch.last_seq()]);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

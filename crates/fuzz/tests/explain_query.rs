//! Fuzzing the `/debug/explain` query parser (`kproxy_servers::explain::parse_query`, with its
//! percent-decoding): queries as a person, a script or a browser writes them, edited. Nothing
//! panics; a query is read the same whatever the encoding of its values; one that is refused
//! is refused with a message that names the part at fault; one that is accepted was well
//! formed (known parameters, strict `%XX` escapes).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is a test failure

mod bounds;

use std::net::{IpAddr, SocketAddr};

use kproxy_fuzz::mutated_text;
use kproxy_servers::ExplainQuery;
use kproxy_servers::explain::parse_query;
use kproxy_state::Protocol;
use proptest::prelude::*;

const SEEDS: &[&str] = &[
    "from=203.0.113.7&to=198.18.128.10:80",
    "from=203.0.113.7&to=198.18.128.10:53&protocol=udp",
    "protocol=SCTP&to=198.18.128.11:9000&from=198.51.100.3",
    "from=fd00%3A%3A7&to=%5Bfd00%3A96%3A%3A10%5D%3A53&protocol=UDP",
    "from=fd00::7&to=[fd00:96::10]:443&protocol=Tcp",
    "from=%32%30%33.0.113.7&to=198.18.128.10%3a8080&&protocol=tcp",
];

/// Characters a query is made of besides the seeds' own, for the edits.
const QUERY_CHARS: &[char] = &['%', '&', '=', '+', ':', '[', ']', '.', '0', 'f', 'G', ' ', '\u{e9}', '/'];

/// What may follow a `%`: hex digits, and what a sloppy parser of hex numbers takes for one.
const ESCAPE_CHARS: &[char] = &['0', '3', '9', 'a', 'F', '+', '-', 'g', ' ', '%', '\u{e9}'];

fn fuzzed_query() -> impl Strategy<Value = String> {
    let seed = proptest::sample::select(SEEDS).prop_map(str::to_owned);
    let escape = (proptest::sample::select(ESCAPE_CHARS), proptest::sample::select(ESCAPE_CHARS))
        .prop_map(|(a, b)| vec!['%', a, b]);
    prop_oneof![
        3 => seed.clone().prop_flat_map(mutated_text),
        // Escapes, well formed or not, anywhere.
        2 => (seed.clone(), proptest::collection::vec((any::<proptest::sample::Index>(), escape), 1..4))
            .prop_map(|(seed, escapes)| {
                let mut chars: Vec<char> = seed.chars().collect();
                for (at, escape) in escapes {
                    let i = at.index(chars.len() + 1);
                    chars.splice(i..i, escape);
                }
                chars.into_iter().collect()
            }),
        // Edits with the query's own characters.
        2 => (seed, proptest::collection::vec((any::<proptest::sample::Index>(), proptest::sample::select(QUERY_CHARS)), 1..6))
            .prop_map(|(seed, edits)| {
                let mut chars: Vec<char> = seed.chars().collect();
                for (at, c) in edits {
                    let i = at.index(chars.len() + 1);
                    chars.insert(i, c);
                }
                chars.into_iter().collect()
            }),
    ]
}

/// Percent-encodes every byte of `s` that is not unreserved, as a strict client does.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => char::from(b).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Whether every `%` of `raw` starts an escape of two hex digits.
fn escapes_are_strict(raw: &str) -> bool {
    let bytes = raw.as_bytes();
    bytes
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'%')
        .all(|(i, _)| bytes.get(i + 1..i + 3).is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)))
}

/// The same question written as a strict client writes it, parameters in another order.
fn reencoded(q: &ExplainQuery) -> String {
    format!(
        "protocol={}&to={}&from={}",
        encode(&q.protocol.as_str().to_ascii_lowercase()),
        encode(&q.to.to_string()),
        encode(&q.from.to_string())
    )
}

fn check(raw: &str) {
    let (parsed, largest) = bounds::largest_allocation(|| parse_query(raw));
    assert!(largest <= bounds::allowance(raw.len(), 4096), "{largest} bytes at once for a query of {}", raw.len());
    assert_eq!(parse_query(raw), parsed, "parsing is deterministic");
    match parsed {
        Ok(query) => {
            assert!(escapes_are_strict(raw), "{raw:?} has a malformed %-escape, yet was accepted as {query:?}");
            assert_eq!(parse_query(&reencoded(&query)), Ok(query), "{raw:?} reads as another question once re-encoded");
        }
        Err(message) => {
            assert!(!message.is_empty(), "{raw:?}: an empty message");
            // The message names what was wrong: a parameter of the query (its name, or its
            // value as given or decoded), or the missing ones.
            let named = message.contains("from=IP and to=IP:PORT are required")
                || raw.split('&').filter(|p| !p.is_empty()).any(|pair| {
                    let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
                    message.contains(&format!("{key:?}"))
                        || message.contains(&format!("{value:?}"))
                        || (matches!(key, "from" | "to") && message.starts_with(&format!("{key}=")))
                        || (key == "protocol" && message.starts_with("unsupported protocol"))
                });
            assert!(named, "{raw:?} was refused with {message:?}, which names no part of it");
        }
    }
}

proptest! {
    #![proptest_config(bounds::cases(2048))]

    /// The fuzz target: edited queries.
    #[test]
    fn decode_an_edited_explain_query_is_answered_or_refused_by_name(raw in fuzzed_query()) {
        check(&raw);
    }

    /// Any question, however its values are encoded, reads back as itself.
    #[test]
    fn decode_any_question_reads_back_whatever_its_encoding(
        from in any::<IpAddr>(),
        to_ip in any::<IpAddr>(),
        port in any::<u16>(),
        protocol in proptest::sample::select(vec![Protocol::Tcp, Protocol::Udp, Protocol::Sctp]),
        shout in any::<bool>(),
    ) {
        let to = SocketAddr::new(to_ip, port);
        let query = ExplainQuery { from, to, protocol };
        let name = if shout { protocol.as_str().to_owned() } else { protocol.as_str().to_ascii_lowercase() };
        let plain = format!("from={from}&to={to}&protocol={name}");
        prop_assert_eq!(parse_query(&plain), Ok(query));
        prop_assert_eq!(parse_query(&reencoded(&query)), Ok(query));
        check(&plain);
    }
}

#[test]
fn every_seed_parses() {
    for seed in SEEDS {
        assert!(parse_query(seed).is_ok(), "{seed}");
    }
}

//! Mutation strategies for fuzzing kproxy's decoders of outside input with proptest.
//!
//! The targets live in `tests/`, one per decoder: manifest files, API objects (JSON), the
//! `KubeProxyConfiguration` file and the command line. Each starts from valid input (the
//! repository's examples and fixtures, or objects shaped like a real cluster's) and mutates it,
//! so most cases get past the first syntax check and reach the code behind it; purely random
//! bytes would almost all stop at the parser's first character.
//!
//! Why proptest and not cargo-fuzz: cargo-fuzz needs a nightly toolchain and libFuzzer, which CI
//! does not have; proptest runs on stable inside `cargo test`, shrinks a failure to a minimal
//! input and records it in `proptest-regressions/`.
//!
//! Each target has a `decode_*` property (the decoder alone, with the checks on what it reports)
//! and, where the decoder feeds the planner, a `pipeline_*` property (the same inputs carried on
//! through cluster state, planner and nftables renderer). CI runs proptest's default case count;
//! the long run sets `PROPTEST_CASES` and filters by prefix (docs/reliability.md).

use proptest::prelude::*;
use serde_json::{Map, Value};

/// Words that mean something to the decoders: Kubernetes field names and enum values, YAML
/// syntax, and values at the edges of what a field accepts.
const DICTIONARY: &[&str] = &[
    "metadata",
    "name",
    "namespace",
    "spec",
    "status",
    "ports",
    "port",
    "targetPort",
    "nodePort",
    "protocol",
    "clusterIP",
    "clusterIPs",
    "type",
    "LoadBalancer",
    "NodePort",
    "ExternalName",
    "ClusterIP",
    "None",
    "externalIPs",
    "externalTrafficPolicy",
    "internalTrafficPolicy",
    "Local",
    "Cluster",
    "sessionAffinity",
    "ClientIP",
    "sessionAffinityConfig",
    "timeoutSeconds",
    "ipFamilies",
    "IPv4",
    "IPv6",
    "ipFamilyPolicy",
    "loadBalancerSourceRanges",
    "healthCheckNodePort",
    "trafficDistribution",
    "PreferClose",
    "endpoints",
    "addresses",
    "conditions",
    "ready",
    "serving",
    "terminating",
    "nodeName",
    "zone",
    "hints",
    "forZones",
    "forNodes",
    "addressType",
    "FQDN",
    "labels",
    "kubernetes.io/service-name",
    "endpointslice.kubernetes.io/managed-by",
    "TCP",
    "UDP",
    "SCTP",
    "ICMP",
    "mode",
    "nftables",
    "iptables",
    "ipvs",
    "syncPeriod",
    "minSyncPeriod",
    "nodePortAddresses",
    "localhost",
    "primary",
    "all",
    "detectLocalMode",
    "clusterCIDR",
    "masqueradeAll",
    "conntrack",
    "maxPerCore",
    "featureGates",
    "apiVersion",
    "kind",
    "kubeproxy.config.k8s.io/v1alpha1",
    "KubeProxyConfiguration",
    "v1",
    "discovery.k8s.io/v1",
    "Service",
    "EndpointSlice",
    "Node",
    "ServiceCIDR",
    "0",
    "-1",
    "65535",
    "65536",
    "4294967296",
    "99999999999999999999",
    "1e309",
    "0.5",
    "true",
    "false",
    "null",
    "~",
    "",
    " ",
    "0s",
    "-5s",
    "1h",
    "9999999h",
    "198.18.0.1",
    "198.18.0.0/15",
    "0.0.0.0/0",
    "::",
    "::/0",
    "fd00::1",
    "fd00::/8",
    "256.1.1.1",
    "198.18.0.1/33",
    "1.2.3",
    "::ffff:198.18.0.1",
    "fe80::1%eth0",
    "ééé",
    "\u{0}",
    "\u{202e}",
    "a/b/c",
    "-",
    "---",
    "- ",
    ": ",
    "{",
    "}",
    "[",
    "]",
    "&a",
    "*a",
    "<<: *a",
    "!!binary",
    "!!str",
    "? ",
    "|",
    ">",
    "#",
    "\"",
    "'",
    "\t",
    "\n",
    "\\",
];

/// A JSON value built from the dictionary: scalars, and small arrays and objects of them.
pub fn json_value() -> impl Strategy<Value = Value> {
    let word = proptest::sample::select(DICTIONARY).prop_map(|w| Value::String(w.to_owned()));
    let leaf = prop_oneof![
        4 => word,
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        2 => any::<i64>().prop_map(Value::from),
        1 => (0u64..=70_000).prop_map(Value::from),
        1 => any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        1 => ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::vec((proptest::sample::select(DICTIONARY), inner), 0..4).prop_map(|fields| {
                Value::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect::<Map<_, _>>())
            }),
        ]
    })
}

/// One structural change to a JSON document. Positions are picked as indexes into the document's
/// nodes (in a fixed walk order), so the same case always mutates the same place.
#[derive(Debug, Clone)]
pub enum JsonMutation {
    /// Replace the value at a node.
    Replace(proptest::sample::Index, Value),
    /// Remove a node from its parent object or array.
    Remove(proptest::sample::Index),
    /// Add a field to an object node (or push onto an array node).
    Insert(proptest::sample::Index, String, Value),
}

fn json_mutation() -> impl Strategy<Value = JsonMutation> {
    prop_oneof![
        3 => (any::<proptest::sample::Index>(), json_value()).prop_map(|(i, v)| JsonMutation::Replace(i, v)),
        2 => any::<proptest::sample::Index>().prop_map(JsonMutation::Remove),
        2 => (any::<proptest::sample::Index>(), proptest::sample::select(DICTIONARY), json_value())
            .prop_map(|(i, k, v)| JsonMutation::Insert(i, k.to_owned(), v)),
    ]
}

/// Between one and four structural mutations of `seed`.
pub fn mutated_json(seed: Value) -> impl Strategy<Value = Value> {
    proptest::collection::vec(json_mutation(), 1..5).prop_map(move |mutations| {
        let mut value = seed.clone();
        for mutation in mutations {
            apply(&mut value, mutation);
        }
        value
    })
}

/// JSON pointers of every node of `value`, the root first.
fn pointers(value: &Value) -> Vec<String> {
    fn walk(value: &Value, at: String, out: &mut Vec<String>) {
        out.push(at.clone());
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    walk(v, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, String::new(), &mut out);
    out
}

fn apply(value: &mut Value, mutation: JsonMutation) {
    let nodes = pointers(value);
    let at = |index: &proptest::sample::Index| nodes[index.index(nodes.len())].clone();
    match mutation {
        JsonMutation::Replace(index, new) => {
            if let Some(node) = value.pointer_mut(&at(&index)) {
                *node = new;
            }
        }
        JsonMutation::Remove(index) => {
            let pointer = at(&index);
            let Some((parent, last)) = pointer.rsplit_once('/') else { return };
            let last = last.replace("~1", "/").replace("~0", "~");
            match value.pointer_mut(parent) {
                Some(Value::Object(map)) => {
                    map.remove(&last);
                }
                Some(Value::Array(items)) => {
                    if let Ok(i) = last.parse::<usize>()
                        && i < items.len()
                    {
                        items.remove(i);
                    }
                }
                _ => {}
            }
        }
        JsonMutation::Insert(index, key, new) => match value.pointer_mut(&at(&index)) {
            Some(Value::Object(map)) => {
                map.insert(key, new);
            }
            Some(Value::Array(items)) => items.push(new),
            _ => {}
        },
    }
}

/// One change to a text, at a position given as an index into its characters.
#[derive(Debug, Clone)]
pub enum TextMutation {
    /// Insert a dictionary word.
    Insert(proptest::sample::Index, &'static str),
    /// Delete up to `len` characters.
    Delete(proptest::sample::Index, usize),
    /// Cut the text off.
    Truncate(proptest::sample::Index),
    /// Repeat one line.
    DuplicateLine(proptest::sample::Index),
    /// Replace one character with any character.
    Replace(proptest::sample::Index, char),
}

fn text_mutation() -> impl Strategy<Value = TextMutation> {
    use proptest::sample::{Index, select};
    prop_oneof![
        4 => (any::<Index>(), select(DICTIONARY)).prop_map(|(i, w)| TextMutation::Insert(i, w)),
        2 => (any::<Index>(), 1usize..20).prop_map(|(i, n)| TextMutation::Delete(i, n)),
        1 => any::<Index>().prop_map(TextMutation::Truncate),
        1 => any::<Index>().prop_map(TextMutation::DuplicateLine),
        2 => (any::<Index>(), any::<char>()).prop_map(|(i, c)| TextMutation::Replace(i, c)),
    ]
}

/// Between one and six edits of `seed`, as a person or a broken tool would make them.
pub fn mutated_text(seed: String) -> impl Strategy<Value = String> {
    proptest::collection::vec(text_mutation(), 1..7).prop_map(move |mutations| {
        let mut chars: Vec<char> = seed.chars().collect();
        for mutation in mutations {
            edit(&mut chars, mutation);
        }
        chars.into_iter().collect()
    })
}

fn edit(chars: &mut Vec<char>, mutation: TextMutation) {
    let at = |index: &proptest::sample::Index, len: usize| if len == 0 { 0 } else { index.index(len + 1) };
    match mutation {
        TextMutation::Insert(index, word) => {
            let i = at(&index, chars.len());
            chars.splice(i..i, word.chars());
        }
        TextMutation::Delete(index, n) => {
            let i = at(&index, chars.len()).min(chars.len());
            let end = (i + n).min(chars.len());
            chars.drain(i..end);
        }
        TextMutation::Truncate(index) => {
            let i = at(&index, chars.len()).min(chars.len());
            chars.truncate(i);
        }
        TextMutation::DuplicateLine(index) => {
            let text: String = chars.iter().collect();
            let mut lines: Vec<&str> = text.split('\n').collect();
            let i = index.index(lines.len());
            lines.insert(i, lines[i]);
            *chars = lines.join("\n").chars().collect();
        }
        TextMutation::Replace(index, c) => {
            if !chars.is_empty() {
                let i = index.index(chars.len());
                chars[i] = c;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a panic is a test failure
mod tests {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    use serde_json::json;

    use super::*;

    #[test]
    fn pointers_name_every_node_and_escape_slashes() {
        let value = json!({"a": [1, {"b/c": 2}]});
        assert_eq!(pointers(&value), ["", "/a", "/a/0", "/a/1", "/a/1/b~1c"]);
    }

    #[test]
    fn json_mutations_change_the_seed_and_text_mutations_keep_most_of_it() {
        let seed = json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}});
        let mut runner = TestRunner::deterministic();
        let (mut changed, mut tries) = (0, 0);
        while tries < 200 {
            tries += 1;
            let value = mutated_json(seed.clone()).new_tree(&mut runner).unwrap().current();
            changed += usize::from(value != seed);
        }
        // Some mutations are no-ops (removing the root, replacing a value with itself).
        assert!(changed > 150, "only {changed} of {tries} mutations changed the seed");

        let text = "kind: Service\nmetadata:\n  name: web\n".to_owned();
        let edited = mutated_text(text.clone()).new_tree(&mut runner).unwrap().current();
        assert_ne!(edited, text);
    }
}

/// One edit of a byte string.
#[derive(Debug, Clone)]
enum ByteMutation {
    Flip(proptest::sample::Index, u8),
    Insert(proptest::sample::Index, Vec<u8>),
    Delete(proptest::sample::Index, usize),
    Truncate(proptest::sample::Index),
    /// A varint of this value written over the bytes at the index (a length or a key that lies).
    Varint(proptest::sample::Index, u64),
}

fn byte_mutation() -> impl Strategy<Value = ByteMutation> {
    use proptest::sample::Index;
    prop_oneof![
        3 => (any::<Index>(), 1u8..=255).prop_map(|(i, x)| ByteMutation::Flip(i, x)),
        2 => (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..8)).prop_map(|(i, b)| ByteMutation::Insert(i, b)),
        2 => (any::<Index>(), 1usize..16).prop_map(|(i, n)| ByteMutation::Delete(i, n)),
        1 => any::<Index>().prop_map(ByteMutation::Truncate),
        2 => (any::<Index>(), prop_oneof![Just(u64::from(u32::MAX)), Just(1u64 << 40), 0u64..4096, any::<u64>()])
            .prop_map(|(i, v)| ByteMutation::Varint(i, v)),
    ]
}

/// Between one and six edits of a binary `seed` (protobuf): flipped, inserted and deleted bytes,
/// a cut, lengths and keys that lie.
pub fn mutated_bytes(seed: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(byte_mutation(), 1..7).prop_map(move |mutations| {
        let mut bytes = seed.clone();
        for mutation in mutations {
            let at = |index: &proptest::sample::Index, len: usize| index.index(len + 1).min(len);
            match mutation {
                ByteMutation::Flip(index, x) => {
                    if !bytes.is_empty() {
                        let i = index.index(bytes.len());
                        bytes[i] ^= x;
                    }
                }
                ByteMutation::Insert(index, inserted) => {
                    let i = at(&index, bytes.len());
                    bytes.splice(i..i, inserted);
                }
                ByteMutation::Delete(index, n) => {
                    let i = at(&index, bytes.len());
                    let end = (i + n).min(bytes.len());
                    bytes.drain(i..end);
                }
                ByteMutation::Truncate(index) => {
                    let i = at(&index, bytes.len());
                    bytes.truncate(i);
                }
                ByteMutation::Varint(index, mut value) => {
                    let mut varint = Vec::new();
                    loop {
                        let byte = (value & 0x7f) as u8;
                        value >>= 7;
                        if value == 0 {
                            varint.push(byte);
                            break;
                        }
                        varint.push(byte | 0x80);
                    }
                    let i = at(&index, bytes.len());
                    let end = (i + varint.len()).min(bytes.len());
                    bytes.splice(i..end, varint);
                }
            }
        }
        bytes
    })
}

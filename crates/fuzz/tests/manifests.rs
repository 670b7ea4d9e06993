//! Fuzzing the manifest directory source: a file of the repository's examples, edited at random
//! (text) or restructured (JSON), sits next to a good file. Loading never fails or panics, every
//! error names the fuzzed file (never the good one), the good file's Service is still served, and
//! whatever the fuzzed file yields goes through state, planner and renderer without a panic.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is a test failure

mod pipeline;

use std::path::{Path, PathBuf};

use kproxy_fuzz::{mutated_json, mutated_text};
use kproxy_kube_source::fake::objects;
use kproxy_state::{Kind, ObjectKey};
use pipeline::{ANCHOR_YAML, assert_anchor_served, render, state_of, synced};
use proptest::prelude::*;

fn example_files() -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files.into_iter().map(|p| std::fs::read_to_string(p).unwrap()).collect()
}

/// Loads a directory holding the anchor file and `fuzzed` as `name`, and checks every property.
fn check(name: &str, fuzzed: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("anchor.yaml"), ANCHOR_YAML).unwrap();
    let fuzzed_path = dir.path().join(name);
    std::fs::write(&fuzzed_path, fuzzed).unwrap();

    let snapshot = kproxy_source::manifest::load(dir.path()).expect("a readable directory always loads");
    for error in snapshot.errors() {
        assert_eq!(error.file, fuzzed_path, "an error blamed the wrong file: {error}");
        assert!(!error.message.is_empty(), "an error without a message: {error:?}");
    }
    let anchor = ObjectKey::new("fuzz-anchor", "anchor");
    assert!(snapshot.get(Kind::Service, &anchor).is_some(), "the good file's Service was lost");

    let (state, _) = state_of(snapshot.initial_changes().chain(synced()));
    assert!(state.service(&anchor).is_some());
    assert_anchor_served(&render(&state));
}

proptest! {
    #[test]
    fn an_edited_example_file_never_breaks_the_good_one(
        fuzzed in proptest::sample::select(example_files()).prop_flat_map(mutated_text)
    ) {
        check("fuzzed.yaml", fuzzed.as_bytes());
    }

    #[test]
    fn a_restructured_json_manifest_never_breaks_the_good_one(
        fuzzed in prop_oneof![
            mutated_json(objects::service("prod", "web", "198.18.128.10".parse().unwrap(), 80, 8080)
                .as_object().cloned().map(|mut o| { o.insert("apiVersion".into(), "v1".into());
                                                    o.insert("kind".into(), "Service".into()); o.into() }).unwrap()),
            mutated_json(with_kind(objects::endpoint_slice("prod", "web", "web-1",
                &[objects::Endpoint { ip: "198.18.17.2".parse().unwrap(), node: "node-a" }], 8080),
                "discovery.k8s.io/v1", "EndpointSlice")),
        ]
    ) {
        check("fuzzed.json", fuzzed.to_string().as_bytes());
    }

    #[test]
    fn arbitrary_bytes_in_a_manifest_never_break_the_good_one(fuzzed in proptest::collection::vec(any::<u8>(), 0..512)) {
        check("fuzzed.yaml", &fuzzed);
    }
}

fn with_kind(mut value: serde_json::Value, api_version: &str, kind: &str) -> serde_json::Value {
    let object = value.as_object_mut().unwrap();
    object.insert("apiVersion".into(), api_version.into());
    object.insert("kind".into(), kind.into());
    value
}

#[test]
fn the_example_files_load_cleanly_before_they_are_fuzzed() {
    // The seeds are valid: what the targets find comes from the mutations.
    for text in example_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("example.yaml"), &text).unwrap();
        let snapshot = kproxy_source::manifest::load(dir.path()).unwrap();
        assert_eq!(snapshot.errors(), [], "{text}");
    }
}

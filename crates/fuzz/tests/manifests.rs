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

/// A scratch directory in memory where there is one: the long run writes a million of them.
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() { tempfile::tempdir_in(shm).unwrap() } else { tempfile::tempdir().unwrap() }
}

/// Loads a directory holding the anchor file and `fuzzed` as `name`: loading never fails, every
/// error names the fuzzed file, the anchor Service is there. Returns the snapshot.
fn load(name: &str, fuzzed: &[u8]) -> kproxy_source::manifest::Snapshot {
    let dir = scratch();
    std::fs::write(dir.path().join("anchor.yaml"), ANCHOR_YAML).unwrap();
    let fuzzed_path = dir.path().join(name);
    std::fs::write(&fuzzed_path, fuzzed).unwrap();

    let snapshot = kproxy_source::manifest::load(dir.path()).expect("a readable directory always loads");
    for error in snapshot.errors() {
        assert_eq!(error.file, fuzzed_path, "an error blamed the wrong file: {error}");
        assert!(!error.message.is_empty(), "an error without a message: {error:?}");
    }
    assert!(snapshot.get(Kind::Service, &anchor()).is_some(), "the good file's Service was lost");
    snapshot
}

fn anchor() -> ObjectKey {
    ObjectKey::new("fuzz-anchor", "anchor")
}

/// A fuzzed manifest file: an example edited as text, a restructured JSON object, or bytes.
fn fuzzed_file() -> impl Strategy<Value = (&'static str, Vec<u8>)> {
    let service =
        with_kind(objects::service("prod", "web", "198.18.128.10".parse().unwrap(), 80, 8080), "v1", "Service");
    let slice = with_kind(
        objects::endpoint_slice(
            "prod",
            "web",
            "web-1",
            &[objects::Endpoint { ip: "198.18.17.2".parse().unwrap(), node: "node-a" }],
            8080,
        ),
        "discovery.k8s.io/v1",
        "EndpointSlice",
    );
    prop_oneof![
        4 => proptest::sample::select(example_files())
            .prop_flat_map(mutated_text)
            .prop_map(|text| ("fuzzed.yaml", text.into_bytes())),
        2 => prop_oneof![mutated_json(service), mutated_json(slice)]
            .prop_map(|value| ("fuzzed.json", value.to_string().into_bytes())),
        1 => proptest::collection::vec(any::<u8>(), 0..512).prop_map(|bytes| ("fuzzed.yaml", bytes)),
    ]
}

proptest! {
    /// The fuzz target: the manifest decoder alone (the long run gives it a million cases).
    #[test]
    fn decode_a_fuzzed_manifest_file_never_breaks_the_good_one((name, bytes) in fuzzed_file()) {
        load(name, &bytes);
    }

    /// What the decoder let through goes on as in the daemon: state, planner, renderer.
    #[test]
    fn pipeline_what_a_fuzzed_manifest_yields_is_planned_and_rendered_with_the_good_one((name, bytes) in fuzzed_file()) {
        let snapshot = load(name, &bytes);
        let (state, _) = state_of(snapshot.initial_changes().chain(synced()));
        assert!(state.service(&anchor()).is_some());
        assert_anchor_served(&render(&state));
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

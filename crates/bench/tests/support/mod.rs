//! Shared by the benchmark smoke tests: the kproxy binary they run, built first.
#![allow(clippy::expect_used, clippy::unwrap_used)] // a panic is a test failure

use std::path::PathBuf;
use std::process::Command;

/// `cargo build -p kproxy` in the profile this test was built in; the binary's path.
pub fn build_kproxy() -> PathBuf {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_kproxy-bench"));
    let profile_dir = bench.parent().expect("target profile directory");
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo.args(["build", "--quiet", "-p", "kproxy"]);
    // The variables cargo sets for a test would make this build differ from one run from a
    // shell (and relink kproxy each time): keep only what locates the toolchain and target.
    cargo.env_clear();
    for (key, value) in std::env::vars_os() {
        let keep = key.to_str().is_some_and(|k| {
            matches!(k, "PATH" | "HOME" | "CARGO_HOME" | "RUSTUP_HOME" | "RUSTUP_TOOLCHAIN" | "CARGO_TARGET_DIR")
        });
        if keep {
            cargo.env(key, value);
        }
    }
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") => {
            cargo.arg("--release");
        }
        Some(other) => {
            cargo.args(["--profile", other]);
        }
        None => panic!("unexpected target directory {}", profile_dir.display()),
    }
    let status = cargo.status().expect("running cargo build -p kproxy");
    assert!(status.success(), "cargo build -p kproxy failed");
    let kproxy = profile_dir.join("kproxy");
    assert!(kproxy.is_file(), "no {}", kproxy.display());
    kproxy
}

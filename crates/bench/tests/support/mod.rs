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
            matches!(
                k,
                "PATH"
                    | "HOME"
                    | "CARGO_HOME"
                    | "RUSTUP_HOME"
                    | "RUSTUP_TOOLCHAIN"
                    | "CARGO_TARGET_DIR"
                    | "CARGO_INCREMENTAL"
            )
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

/// What one benchmark run printed and wrote.
#[derive(Debug)]
pub struct BenchRun {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The results it wrote with `--json`.
    pub json: serde_json::Value,
}

/// Runs `kproxy-bench <subcommand> <args>` against the freshly built kproxy, with its JSON
/// results and kproxy's log in a directory of its own (removed afterwards).
pub fn run_bench(subcommand: &str, args: &[&str]) -> BenchRun {
    // One directory per run: the tests of a binary run in parallel, and one run's removal of its
    // directory must not take another's results and log with it.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let kproxy = build_kproxy();
    let dir = std::env::temp_dir().join(format!("kproxy-bench-{subcommand}-smoke-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("results.json");
    let out = Command::new(env!("CARGO_BIN_EXE_kproxy-bench"))
        .arg(subcommand)
        .args(args)
        .arg("--kproxy")
        .arg(&kproxy)
        .arg("--json")
        .arg(&json)
        .arg("--log-dir")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| panic!("running kproxy-bench {subcommand}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let written = std::fs::read_to_string(&json).unwrap_or_else(|e| panic!("{e}: no results\n{stdout}\n{stderr}"));
    let json = serde_json::from_str(&written).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    BenchRun { code: out.status.code(), stdout, stderr, json }
}

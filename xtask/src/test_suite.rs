//! `guest-test`: builds the workspace's kernel test binaries on the host and runs them all in one
//! guest boot.
//!
//! The binaries are ordinary (dynamically linked) test builds in the normal target directory:
//! the guest sees the host's root filesystem, so the host's glibc and libgcc are there, the build
//! is shared with the host test run (CI compiles once), and no second `crt-static` build of the
//! whole dependency tree is needed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::guest::GUEST_RUN_DIR;
use crate::process;
use crate::shell;

/// The crates whose test binaries hold kernel tests.
pub const PACKAGES: &[&str] = &["kproxy-testbed", "kproxy-nftables", "kproxy", "kproxy-ipvs", "kproxy-accel"];

/// Single test targets of other crates that need the guest kernel (their crates' other kernel
/// tests run on the host): `(package, test target)`.
pub const GUEST_ONLY_TARGETS: &[(&str, &str)] = &[
    // SCTP sockets exist only in the guest kernel; the rest of the iptables suite runs on the host.
    ("kproxy-iptables", "sctp"),
    // Likewise the SCTP case of the packet suite through the netlink executor.
    ("kproxy-nft-netlink", "sctp"),
    // Removing kube-proxy's IPVS leftovers needs IPVS and dummy devices.
    ("kproxy-takeover", "kernel"),
];

const BUILD_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// One test executable cargo built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestBinary {
    /// `package: target (kind)`, for the report.
    pub label: String,
    pub executable: PathBuf,
    /// The package directory: cargo runs tests from there, and so does the guest.
    pub package_dir: PathBuf,
}

/// `cargo test --no-run` with the host phase's own arguments (`--workspace --all-targets`, see
/// `scripts/test`), so that after it nothing is compiled again: built per package, cargo unifies
/// features differently and rebuilt much of the tree (140-160 s of CI). Returns the test
/// executables of [`PACKAGES`] and [`GUEST_ONLY_TARGETS`] (libraries, binaries and integration
/// tests; never benches or examples, which hold no kernel tests).
pub fn build(workspace: &Path) -> Result<Vec<TestBinary>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut command = Command::new(cargo);
    command.current_dir(workspace).args([
        "test",
        "--workspace",
        "--all-targets",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    tracing::info!("building the workspace's test binaries (those of {} run in the guest)", PACKAGES.join(", "));
    let stdout = process::output(command.stderr(Stdio::inherit()), BUILD_TIMEOUT)?;
    let mut binaries: Vec<TestBinary> = parse_artifacts(&String::from_utf8_lossy(&stdout))
        .into_iter()
        .filter(runs_in_the_guest)
        .map(|a| a.binary)
        .collect();
    binaries.sort_by(|a, b| a.label.cmp(&b.label));
    binaries.dedup();
    if binaries.is_empty() {
        return Err(Error::Setup("cargo built no test binaries".into()));
    }
    Ok(binaries)
}

/// One test executable and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Artifact {
    package: String,
    target: String,
    kind: String,
    binary: TestBinary,
}

/// Whether the guest suite runs `artifact`: any test target of [`PACKAGES`] but benches and
/// examples, and the targets [`GUEST_ONLY_TARGETS`] names.
fn runs_in_the_guest(artifact: &Artifact) -> bool {
    let Artifact { package, target, kind, .. } = artifact;
    (PACKAGES.contains(&package.as_str()) && !matches!(kind.as_str(), "bench" | "example"))
        || GUEST_ONLY_TARGETS.iter().any(|(p, t)| p == package && t == target && kind == "test")
}

/// The package name in a cargo package id: `path+file:///w/crates/iptables#kproxy-iptables@0.1.0`,
/// or `path+file:///w/crates/kproxy#0.1.0` when the name is the directory's.
fn package_name(package_id: &str) -> Option<String> {
    let (url, fragment) = package_id.rsplit_once('#')?;
    match fragment.split_once('@') {
        Some((name, _)) => Some(name.to_owned()),
        None => url.rsplit('/').next().map(str::to_owned),
    }
}

/// Test executables from cargo's JSON messages.
fn parse_artifacts(messages: &str) -> Vec<Artifact> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact" && message["profile"]["test"] == true)
        .filter_map(|message| {
            let executable = PathBuf::from(message["executable"].as_str()?);
            let package_dir = Path::new(message["manifest_path"].as_str()?).parent()?.to_path_buf();
            let dir_name = package_dir.file_name()?.to_string_lossy().into_owned();
            let package = package_name(message["package_id"].as_str()?)?;
            let target = message["target"]["name"].as_str()?.to_owned();
            let kind = message["target"]["kind"][0].as_str().unwrap_or("test").to_owned();
            let label = format!("{dir_name}: {target} ({kind})");
            Some(Artifact { package, target, kind, binary: TestBinary { label, executable, package_dir } })
        })
        .collect()
}

/// Reads, reports and clears the host's skip ledger (`kproxy_testbed::kernel::skip_ledger`):
/// the kernel tests the host run (under `CI=true`, or `./scripts/test`, which starts it empty)
/// skipped because its kernel lacks what they need. `None` when there is no ledger: no host run
/// recorded its skips. The guest run that follows runs them, and fails on any skip of its own.
pub fn take_host_skips(target: &Path) -> Option<Vec<String>> {
    let ledger = target.join(kproxy_testbed::kernel::SKIP_LEDGER_FILE);
    let text = std::fs::read_to_string(&ledger).ok()?;
    let skips = ledger_lines(&text);
    tracing::info!("{} kernel tests were skipped by the host run ({}):", skips.len(), ledger.display());
    for line in &skips {
        tracing::info!("  {line}");
    }
    if let Err(error) = std::fs::remove_file(&ledger) {
        tracing::warn!("cannot clear {}: {error}", ledger.display());
    }
    Some(skips)
}

/// Which kernel tests the guest runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Every kernel test, with these libtest arguments (a FILTER, `--all`, or no host ledger).
    Everything(Vec<OsString>),
    /// Exactly the tests the host skipped (`tests`): `args` holds their names as exact libtest
    /// filters.
    HostSkips { tests: Vec<OsString>, args: Vec<OsString> },
    /// The host skipped none: nothing for the guest to run.
    Nothing,
}

/// What the guest runs: with a FILTER or `all`, what the arguments select; else the tests the
/// host run recorded as skipped (`host_skips`, `None` without a ledger: then every kernel test).
/// `libtest_args` (after `--`) go along in every case.
pub fn select(
    filter: Option<&OsString>,
    all: bool,
    host_skips: Option<&[String]>,
    libtest_args: &[OsString],
) -> Selection {
    let everything =
        |filter: Option<&OsString>| Selection::Everything(filter.into_iter().chain(libtest_args).cloned().collect());
    if filter.is_some() || all {
        return everything(filter);
    }
    match host_skips {
        None => everything(None),
        Some([]) => Selection::Nothing,
        Some(skips) => match exact_filters(skips) {
            Some(filters) => Selection::HostSkips {
                tests: filters.iter().filter(|arg| *arg != "--exact").cloned().collect(),
                args: filters.into_iter().chain(libtest_args.iter().cloned()).collect(),
            },
            // A skip recorded outside a named test: run them all rather than miss it.
            None => everything(None),
        },
    }
}

/// libtest arguments that select exactly the tests of ledger lines (`SKIPPED <test>: <reason>`),
/// or `None` when a line names no test: a skip recorded outside a named test thread names the
/// executable instead (`kernel-0f3a…`, never a Rust test name, which has no `-` or space).
pub fn exact_filters(skips: &[String]) -> Option<Vec<OsString>> {
    let mut args: Vec<OsString> = Vec::new();
    for line in skips {
        let (test, _) = line.strip_prefix("SKIPPED ")?.split_once(": ")?;
        if test.contains(['-', ' ']) {
            return None;
        }
        args.push(test.into());
    }
    args.dedup();
    args.push("--exact".into());
    Some(args)
}

/// The distinct non-empty lines of a skip ledger, in order.
fn ledger_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
        if !lines.iter().any(|seen| seen == line) {
            lines.push(line.to_owned());
        }
    }
    lines
}

/// The shell script that runs every binary with the libtest arguments and sums up.
///
/// With `expected` (the tests the host skipped), it first lists what the arguments select in
/// every binary and fails, naming them, if any expected test is in none of them: a test the
/// host skipped in a binary the guest does not build would otherwise pass unseen.
pub fn suite_script(binaries: &[TestBinary], libtest_args: &[OsString], expected: &[OsString]) -> Vec<u8> {
    let mut script = b"# generated by `cargo xtask guest-test`\nfailed=''\n".to_vec();
    if !expected.is_empty() {
        script.extend_from_slice(
            b"listed=$(mktemp)\n\
              list_one() {\n  dir=$1; shift\n  (cd \"$dir\" && CARGO_MANIFEST_DIR=\"$dir\" \"$@\" --list --format=terse) \
              | sed -n 's/: test$//p' >> \"$listed\"\n}\n",
        );
        for binary in binaries {
            script.extend_from_slice(b"list_one ");
            script.extend(shell::quote(&binary.package_dir));
            script.push(b' ');
            script.extend(shell::quote(&binary.executable));
            for arg in libtest_args {
                script.push(b' ');
                script.extend(shell::quote(arg));
            }
            script.push(b'\n');
        }
        script.extend_from_slice(b"missing=''\nfor name in");
        for test in expected {
            script.push(b' ');
            script.extend(shell::quote(test));
        }
        script.extend_from_slice(
            b"; do\n  grep -qxF -- \"$name\" \"$listed\" || missing=\"$missing\n  $name\"\ndone\n\
              if [ -n \"$missing\" ]; then\n  \
              echo \"guest-test: FAILED: the host skipped tests that no test binary built for the guest holds \
              (xtask/src/test_suite.rs, PACKAGES and GUEST_ONLY_TARGETS):$missing\"\n  exit 1\nfi\n",
        );
    }
    script.extend_from_slice(
        b"run_one() {\n  label=$1 dir=$2; shift 2\n  echo; echo \"=== guest-test: $label\"\n  \
          (cd \"$dir\" && CARGO_MANIFEST_DIR=\"$dir\" exec \"$@\") || failed=\"$failed\n  $label\"\n}\n",
    );
    for binary in binaries {
        script.extend_from_slice(b"run_one ");
        script.extend(shell::quote(&binary.label));
        script.push(b' ');
        script.extend(shell::quote(&binary.package_dir));
        script.push(b' ');
        script.extend(shell::quote(&binary.executable));
        for arg in libtest_args {
            script.push(b' ');
            script.extend(shell::quote(arg));
        }
        script.push(b'\n');
    }
    let summary = format!(
        "echo\nif [ -n \"$failed\" ]; then echo \"guest-test: FAILED in kernel $(uname -r):$failed\"; exit 1; fi\n\
         echo \"guest-test: {} test binaries passed in kernel $(uname -r)\"\n",
        binaries.len()
    );
    script.extend_from_slice(summary.as_bytes());
    script
}

/// The guest command that runs the suite script written into the run directory.
pub fn suite_command() -> Vec<OsString> {
    vec!["/bin/sh".into(), format!("{GUEST_RUN_DIR}/suite.sh").into()]
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStringExt;

    use super::*;

    #[test]
    fn ledger_lines_become_exact_test_filters() {
        let skips =
            ["SKIPPED tests::a: needs IPVS".to_owned(), "SKIPPED b: needs SCTP: the kernel lacks it".to_owned()];
        assert_eq!(exact_filters(&skips).unwrap(), ["tests::a", "b", "--exact"]);
        let unnamed = ["SKIPPED tests::a: needs IPVS".to_owned(), "SKIPPED kernel-0f3a9c: needs IPVS".to_owned()];
        assert_eq!(exact_filters(&unnamed), None, "an executable's name selects no test: run them all");
        assert_eq!(exact_filters(&["garbage".to_owned()]), None);
    }

    #[test]
    fn the_host_skips_are_what_the_guest_runs_unless_a_filter_or_all_says_otherwise() {
        let skips = ["SKIPPED tests::a: needs IPVS".to_owned()];
        let extra = [OsString::from("--nocapture")];
        assert_eq!(
            select(None, false, Some(&skips), &extra),
            Selection::HostSkips {
                tests: vec!["tests::a".into()],
                args: vec!["tests::a".into(), "--exact".into(), "--nocapture".into()]
            }
        );
        assert_eq!(select(None, false, Some(&[]), &extra), Selection::Nothing, "the host skipped none");
        assert_eq!(select(None, false, None, &extra), Selection::Everything(vec!["--nocapture".into()]), "no ledger");
        assert_eq!(select(None, true, Some(&skips), &[]), Selection::Everything(vec![]), "--all");
        let filter = OsString::from("ipvs");
        assert_eq!(select(Some(&filter), false, Some(&skips), &[]), Selection::Everything(vec!["ipvs".into()]));
        let unnamed = ["SKIPPED kernel-0f3a9c: needs IPVS".to_owned()];
        assert_eq!(select(None, false, Some(&unnamed), &[]), Selection::Everything(vec![]), "a skip without a name");
    }

    #[test]
    fn ledger_lines_are_distinct_and_ordered() {
        let text = "SKIPPED a: needs IPVS\n\nSKIPPED b: needs SCTP\nSKIPPED a: needs IPVS\n";
        assert_eq!(ledger_lines(text), ["SKIPPED a: needs IPVS", "SKIPPED b: needs SCTP"]);
    }

    #[test]
    fn keeps_only_test_executables() {
        let messages = r#"{"reason":"compiler-artifact","package_id":"path+file:///w/crates/testbed#kproxy-testbed@0.1.0","manifest_path":"/w/crates/testbed/Cargo.toml","target":{"name":"guest_smoke","kind":["test"]},"profile":{"test":true},"executable":"/w/target/debug/deps/guest_smoke-1"}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/testbed#kproxy-testbed@0.1.0","manifest_path":"/w/crates/testbed/Cargo.toml","target":{"name":"kproxy_testbed","kind":["lib"]},"profile":{"test":false},"executable":null}
{"reason":"build-finished","success":true}
not json"#;
        let binaries: Vec<TestBinary> = parse_artifacts(messages).into_iter().map(|a| a.binary).collect();
        assert_eq!(
            binaries,
            vec![TestBinary {
                label: "testbed: guest_smoke (test)".into(),
                executable: "/w/target/debug/deps/guest_smoke-1".into(),
                package_dir: "/w/crates/testbed".into(),
            }]
        );
    }

    #[test]
    fn the_guest_runs_its_packages_tests_and_the_guest_only_targets_of_others() {
        let artifact = |package_id: &str, target: &str, kind: &str| {
            let message = serde_json::json!({"reason": "compiler-artifact", "package_id": package_id,
                "manifest_path": "/w/crates/x/Cargo.toml", "target": {"name": target, "kind": [kind]},
                "profile": {"test": true}, "executable": format!("/w/target/debug/deps/{target}-1")});
            parse_artifacts(&message.to_string()).pop().unwrap()
        };
        let runs = |id: &str, target: &str, kind: &str| runs_in_the_guest(&artifact(id, target, kind));
        assert!(runs("path+file:///w/crates/kproxy#0.1.0", "node_addresses", "test"), "name from the directory");
        assert!(runs("path+file:///w/crates/ipvs#kproxy-ipvs@0.1.0", "kproxy_ipvs", "lib"));
        assert!(runs("path+file:///w/crates/iptables#kproxy-iptables@0.1.0", "sctp", "test"));
        assert!(!runs("path+file:///w/crates/iptables#kproxy-iptables@0.1.0", "packets", "test"), "runs on the host");
        assert!(!runs("path+file:///w/crates/kproxy#0.1.0", "sync", "bench"));
        assert!(!runs("path+file:///w/xtask#0.1.0", "xtask", "bin"));
    }

    #[test]
    fn suite_passes_libtest_arguments_and_fails_when_one_binary_fails() {
        let binaries = [TestBinary { label: "a".into(), executable: "/t/a".into(), package_dir: "/p".into() }];
        let script = String::from_utf8(suite_script(&binaries, &["ipvs".into()], &[])).unwrap();
        assert!(script.contains("run_one 'a' '/p' '/t/a' 'ipvs'\n"), "{script}");
        assert!(script.contains("exit 1"), "{script}");
        assert!(!script.contains("list_one"), "{script}");
    }

    #[test]
    fn a_host_skip_no_guest_binary_holds_fails_the_suite_before_it_runs() {
        let dir = std::env::temp_dir().join(format!("xtask-suite-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("fake-test");
        // A libtest stand-in: `--list --format=terse` lists `tests::a` whatever the filters.
        std::fs::write(
            &exe,
            "#!/bin/sh\nfor arg; do [ \"$arg\" = --list ] && { echo 'tests::a: test'; exit 0; }; done\necho ran\n",
        )
        .unwrap();
        std::process::Command::new("chmod").arg("+x").arg(&exe).status().unwrap();
        let binaries = [TestBinary { label: "fake".into(), executable: exe.clone(), package_dir: dir.clone() }];
        let run = |expected: &[OsString]| {
            let script = suite_script(&binaries, &["tests::a".into(), "--exact".into()], expected);
            let out = std::process::Command::new("sh").arg("-c").arg(OsString::from_vec(script)).output().unwrap();
            (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let (passed, out) = run(&["tests::a".into()]);
        assert!(passed && out.contains("ran"), "every expected test is held: {out}");
        let (passed, out) = run(&["tests::a".into(), "tests::gone".into()]);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!passed && out.contains("tests::gone") && !out.contains("ran"), "{out}");
    }
}

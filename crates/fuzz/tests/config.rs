//! Fuzzing the configuration: the `KubeProxyConfiguration` file (YAML and JSON, edited as text or
//! restructured) and the command line (every flag kproxy takes, with values at the edges).
//! Resolving never panics; a bad file is refused with an error that names the file; a bad
//! flag is refused by the parser or by validation with a message.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is a test failure

use std::path::Path;

use clap::{CommandFactory, Parser};
use kproxy_config::{ConfigError, Flags};
use kproxy_fuzz::{mutated_json, mutated_text};
use proptest::prelude::*;

#[derive(Debug, Parser)]
#[command(name = "kproxy")]
struct Cli {
    #[command(flatten)]
    flags: Flags,
}

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/tests/fixtures").join(name);
    std::fs::read_to_string(path).unwrap()
}

fn resolve_file(content: &[u8], name: &str) {
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm).unwrap() } else { tempfile::tempdir().unwrap() };
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    let cli = Cli::try_parse_from(["kproxy", "--config", path.to_str().unwrap()]).unwrap();
    match kproxy_config::resolve(&cli.flags) {
        Ok(_) => {}
        Err(ConfigError::Parse { path: blamed, message, .. }) => {
            assert_eq!(blamed, path);
            assert!(!message.is_empty());
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// Every long flag kproxy accepts, from the parser itself (so a new flag is fuzzed too).
fn flag_names() -> Vec<String> {
    Cli::command().get_arguments().filter_map(|a| a.get_long().map(|l| format!("--{l}"))).collect()
}

/// Values worth trying for any flag.
const FLAG_VALUES: &[&str] = &[
    "",
    "0",
    "1",
    "-1",
    "true",
    "false",
    "yes",
    "30s",
    "0s",
    "-1s",
    "1h",
    "99999999999h",
    "500ms",
    "1.5",
    "65536",
    "nftables",
    "iptables",
    "ipvs",
    "kernelspace",
    "0.0.0.0",
    "0.0.0.0:10249",
    "[::]:10256",
    "127.0.0.1:0",
    "198.18.0.0/15",
    "198.18.0.0/15,fd00::/8",
    "fd00::/129",
    "primary",
    "localhost",
    "all,primary",
    "rr",
    "wrr",
    "ClusterCIDR",
    "NodeCIDR",
    "BridgeInterface",
    "InterfaceNamePrefix",
    "veth",
    "AllAlpha=true",
    "KubeProxyAcceleration=false",
    "KubeProxyIPVS=false,Foo=true",
    "=",
    "a=b=c",
    "node-A",
    "application/json",
    "application/vnd.kubernetes.protobuf",
    "/nonexistent",
    "/",
    "text",
    "json",
    "4294967296",
    "ééé",
];

proptest! {
    #[test]
    fn decode_an_edited_config_file_resolves_or_is_refused_naming_the_file(
        (name, text) in proptest::sample::select(vec!["kubeadm.yaml", "ipvs.yaml", "tuned.json"])
            .prop_flat_map(|name| (Just(name), mutated_text(fixture(name))))
    ) {
        resolve_file(text.as_bytes(), name);
    }

    #[test]
    fn decode_a_restructured_config_file_resolves_or_is_refused_naming_the_file(
        value in mutated_json(serde_json::from_str(&fixture("tuned.json")).unwrap())
    ) {
        resolve_file(value.to_string().as_bytes(), "tuned.json");
    }

    #[test]
    fn decode_any_command_line_resolves_or_is_refused(
        args in proptest::collection::vec(
            (proptest::sample::select(flag_names()), proptest::sample::select(FLAG_VALUES), any::<bool>()),
            0..6,
        )
    ) {
        let mut argv = vec!["kproxy".to_owned()];
        for (flag, value, separate) in args {
            // A random --config names a random path: keep the file flag out of the command
            // line target (the file targets cover it).
            if flag == "--config" || flag == "--write-config-to" {
                continue;
            }
            if separate {
                argv.extend([flag, value.to_owned()]);
            } else {
                argv.push(format!("{flag}={value}"));
            }
        }
        if let Ok(cli) = Cli::try_parse_from(&argv)
            && let Err(e) = kproxy_config::resolve(&cli.flags)
        {
            prop_assert!(!e.to_string().is_empty());
        }
    }
}

#[test]
fn the_fixtures_resolve_before_they_are_fuzzed() {
    for name in ["kubeadm.yaml", "ipvs.yaml", "tuned.json"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, fixture(name)).unwrap();
        let cli = Cli::try_parse_from(["kproxy", "--config", path.to_str().unwrap()]).unwrap();
        if let Err(e) = kproxy_config::resolve(&cli.flags) {
            panic!("{name}: {e}");
        }
    }
    assert!(flag_names().len() > 50, "the parser lists kproxy's flags: {:?}", flag_names());
}

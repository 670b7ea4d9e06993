//! Shared helpers: parse a command line the way the binary will (Flags flattened into a Parser).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test helpers may panic

use std::path::PathBuf;

use clap::Parser;
use kproxy_config::{ConfigError, Flags, ProxyConfig};

#[derive(Debug, Parser)]
#[command(name = "kproxy")]
struct Cli {
    #[command(flatten)]
    flags: Flags,
}

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

pub fn flags(args: &[&str]) -> Flags {
    let argv = std::iter::once("kproxy").chain(args.iter().copied());
    match Cli::try_parse_from(argv) {
        Ok(cli) => cli.flags,
        Err(e) => panic!("parsing {args:?}: {e}"),
    }
}

pub fn try_flags(args: &[&str]) -> Result<Flags, clap::Error> {
    Cli::try_parse_from(std::iter::once("kproxy").chain(args.iter().copied())).map(|c| c.flags)
}

pub fn resolve(args: &[&str]) -> Result<ProxyConfig, ConfigError> {
    kproxy_config::resolve(&flags(args))
}

pub fn resolve_ok(args: &[&str]) -> ProxyConfig {
    match resolve(args) {
        Ok(c) => c,
        Err(e) => panic!("resolving {args:?}: {e}"),
    }
}

pub fn with_config(name: &str, extra: &[&str]) -> Result<ProxyConfig, ConfigError> {
    let path = fixture(name);
    let path = path.to_str().unwrap().to_string();
    let mut args = vec!["--config", path.as_str()];
    args.extend_from_slice(extra);
    resolve(&args)
}

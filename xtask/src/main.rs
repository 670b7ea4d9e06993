//! Project tasks, run as `cargo xtask <task>`. Today: the guest-kernel test harness.
//!
//! The development and CI kernels lack IPVS and nf_flow_table, so kernel tests that need them run
//! in Debian's stock kernel booted under qemu. See docs/guest-kernel.md.
//!
//! ```text
//! cargo xtask guest-test [--all] [FILTER] [-- LIBTEST_ARGS...]   run the kernel test binaries in the guest
//! cargo xtask guest-run [--timeout SECS] -- CMD [ARGS]   run one command as root in the guest
//! cargo xtask guest-prepare                              install, fetch and build caches only
//! cargo xtask cluster up|down|show|smoke|e2e             a real cluster with kproxy (see cluster.rs)
//! cargo xtask image [--rebuild-base] [--no-verify]       kproxy's image as an OCI archive (image.rs)
//! ```

mod accel;
mod cluster;
mod cpio;
mod error;
mod guest;
mod image;
mod initramfs;
mod kernel_image;
mod layout;
mod migrate;
mod packages;
mod process;
mod qemu;
mod shell;
mod test_images;
mod test_suite;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use error::{Error, Result};
use guest::Guest;
use layout::Layout;

const USAGE: &str = "cargo xtask guest-test [--all] [FILTER] [-- LIBTEST_ARGS...]
       cargo xtask guest-run [--timeout SECS] -- CMD [ARGS...]
       cargo xtask guest-prepare
       cargo xtask cluster up|down|show|smoke|e2e [--help]
       cargo xtask image [--rebuild-base] [--no-verify] [--binary PATH]   (target/image/kproxy.oci.tar, localhost/kproxy:dev)
environment: KPROXY_GUEST_TIMEOUT (s), KPROXY_GUEST_ACCEL=kvm|tcg, KPROXY_GUEST_MEM (MiB),
             KPROXY_GUEST_CPUS, KPROXY_GUEST_BOOT_TIMEOUT (s), KPROXY_GUEST_SKIP_APT=1";

/// Exit status when the harness itself failed (not the guest command).
const HARNESS_FAILURE: u8 = 125;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .without_time()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("XTASK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match dispatch(&args) {
        Ok(status) => ExitCode::from(u8::try_from(status).unwrap_or(1)),
        Err(error @ Error::Usage(_)) => {
            eprintln!("{error}");
            ExitCode::from(2)
        }
        Err(error) => {
            tracing::error!("{error}");
            ExitCode::from(HARNESS_FAILURE)
        }
    }
}

fn dispatch(args: &[OsString]) -> Result<i32> {
    let layout = Layout::discover();
    match args.first().and_then(|task| task.to_str()) {
        Some("guest-test") => guest_test(&layout, &args[1..]),
        Some("guest-run") => guest_run(&layout, &args[1..]),
        Some("cluster") => cluster::run(&layout, &args[1..]),
        Some("image") => image::run(&layout, &args[1..]),
        Some("guest-prepare") => {
            let guest = Guest::prepare(&layout)?;
            tracing::info!("guest kernel {} is ready", guest.release());
            Ok(0)
        }
        _ => Err(Error::Usage(USAGE.into())),
    }
}

/// `guest-test [--all] [FILTER] [-- LIBTEST_ARGS...]`: FILTER and the rest go to every libtest
/// binary. Without FILTER or `--all`, after a host run that recorded its skips (CI, `./scripts/test`),
/// only the kernel tests the host skipped run: the host ran every other one on its own kernel
/// minutes before, and running them all again under TCG takes half an hour.
fn guest_test(layout: &Layout, args: &[OsString]) -> Result<i32> {
    let started = Instant::now();
    let (before, after) = split_at_dashes(args);
    let all = before.iter().any(|arg| arg == "--all");
    let filters: Vec<&OsString> = before.iter().filter(|arg| *arg != "--all").collect();
    if filters.len() > 1 || filters.iter().any(|arg| arg.to_string_lossy().starts_with('-')) {
        return Err(Error::Usage(USAGE.into()));
    }
    let host_skips = test_suite::take_host_skips(&layout.target);
    let selection = test_suite::select(filters.first().copied(), all, host_skips.as_deref(), after);
    let (libtest_args, expected) = match selection {
        test_suite::Selection::Nothing => {
            tracing::info!(
                "guest-test: the host run skipped no kernel test; nothing for the guest to run (`--all` runs every one)"
            );
            return Ok(0);
        }
        test_suite::Selection::HostSkips { tests, args } => {
            tracing::info!(
                "guest-test: running the {} tests the host skipped (`cargo xtask guest-test --all` runs every kernel test)",
                tests.len()
            );
            (args, tests)
        }
        test_suite::Selection::Everything(args) => {
            if filters.is_empty() {
                let why = if all { "--all" } else { "no skip ledger from a host run" };
                tracing::info!("guest-test: running every kernel test ({why})");
            }
            (args, Vec::new())
        }
    };
    let binaries = test_suite::build(&layout.workspace)?;
    let built = started.elapsed();
    let guest = Guest::prepare(layout)?;
    let prepared = started.elapsed();
    let script = test_suite::suite_script(&binaries, &libtest_args, &expected);
    // Every kernel test again under TCG takes most of an hour (docs/testing.md).
    let default_timeout = if all { Duration::from_secs(90 * 60) } else { Duration::from_secs(45 * 60) };
    let timeout = timeout_from_env(default_timeout);
    let status = guest.run(&test_suite::suite_command(), &[("suite.sh", script)], timeout)?;
    if !expected.is_empty() {
        let verdict = if status == 0 { "ran and passed" } else { "ran (the suite failed)" };
        tracing::info!("guest-test: the {} kernel tests the host skipped {verdict} in the guest", expected.len());
    }
    tracing::info!(
        "guest-test: exit status {status}, {:.1} s in all (build {:.1} s, guest setup {:.1} s, guest run {:.1} s)",
        started.elapsed().as_secs_f64(),
        built.as_secs_f64(),
        (prepared - built).as_secs_f64(),
        (started.elapsed() - prepared).as_secs_f64(),
    );
    Ok(status)
}

/// `guest-run [--timeout SECS] -- CMD [ARGS...]`.
fn guest_run(layout: &Layout, args: &[OsString]) -> Result<i32> {
    let (options, command) = split_at_dashes(args);
    let mut timeout = timeout_from_env(Duration::from_secs(30 * 60));
    let mut options = options.iter();
    while let Some(option) = options.next() {
        match option.to_str() {
            Some("--timeout") => {
                let secs = options.next().and_then(|value| value.to_str()?.parse().ok());
                timeout = Duration::from_secs(secs.ok_or_else(|| Error::Usage(USAGE.into()))?);
            }
            _ => return Err(Error::Usage(USAGE.into())),
        }
    }
    if command.is_empty() {
        return Err(Error::Usage(USAGE.into()));
    }
    let guest = Guest::prepare(layout)?;
    guest.run(command, &[], timeout)
}

/// Splits at the first `--`: (before, after). Without `--`, everything is "before".
fn split_at_dashes(args: &[OsString]) -> (&[OsString], &[OsString]) {
    match args.iter().position(|arg| arg == "--") {
        Some(index) => (&args[..index], &args[index + 1..]),
        None => (args, &[]),
    }
}

fn timeout_from_env(default: Duration) -> Duration {
    std::env::var("KPROXY_GUEST_TIMEOUT")
        .ok()
        .and_then(|secs| secs.trim().parse().ok())
        .map_or(default, Duration::from_secs)
}

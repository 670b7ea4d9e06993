//! What the running kernel can do, so a kernel test declares what it needs and is written once
//! for two places: the host kernel (`cargo test`) and the guest kernel (`cargo xtask guest-test`,
//! Debian's stock kernel under qemu, which has IPVS and flowtables as modules).
//!
//! The rule: on the host a missing feature skips the test with a message naming the command that
//! runs it; inside the guest (`KPROXY_GUEST=1`) any skip fails the test, because the guest exists
//! to provide what the host lacks. A skip is never silent: its message goes straight to the
//! terminal (libtest's output capture would hide it in a passing test), and under `CI=true` (or
//! wherever [`records_skips`] says so: `./scripts/test` asks for it) it is also appended to the
//! skip ledger ([`skip_ledger`]), which `cargo xtask guest-test` reports and whose tests it then
//! runs in the guest. So under CI, and in `./scripts/test`, a kernel test never passes unseen
//! without running.
//!
//! ```no_run
//! use kproxy_testbed::kernel::{self, KernelFeature};
//!
//! #[test]
//! fn ipvs_round_robin() {
//!     if !kernel::require_root() || !kernel::require(&[KernelFeature::Ipvs]) {
//!         return;
//!     }
//!     // ... or simply: kproxy_testbed::require_kernel!(Ipvs);
//! }
//! ```

use std::fmt;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// A kernel capability some tests need and the development kernel may lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelFeature {
    /// IP Virtual Server (`ip_vs`): the IPVS dataplane.
    Ipvs,
    /// nftables flowtables (`nf_flow_table`, `nf_flow_table_inet`, `nft_flow_offload`).
    Flowtable,
    /// SCTP sockets (`sctp`), for SCTP Services end to end.
    Sctp,
    /// `dummy` network devices (the IPVS dataplane's `kube-ipvs0`); the development kernel has none.
    Dummy,
    /// nfacct counters: nfnetlink_acct and iptables' `-m nfacct` (`xt_nfacct`), which iptables
    /// mode counts INVALID drops and localhost NodePort connections with.
    NfAcct,
}

impl KernelFeature {
    /// Every feature, for reports.
    pub const ALL: [KernelFeature; 5] = [
        KernelFeature::Ipvs,
        KernelFeature::Flowtable,
        KernelFeature::Sctp,
        KernelFeature::Dummy,
        KernelFeature::NfAcct,
    ];

    /// The modules that provide the feature when it is not built in.
    pub fn modules(self) -> &'static [&'static str] {
        match self {
            KernelFeature::Ipvs => &["ip_vs"],
            KernelFeature::Flowtable => &["nf_flow_table", "nf_flow_table_inet", "nft_flow_offload"],
            KernelFeature::Sctp => &["sctp"],
            KernelFeature::Dummy => &["dummy"],
            // Needs nfnetlink_acct, which modprobe loads with it.
            KernelFeature::NfAcct => &["xt_nfacct"],
        }
    }

    /// Whether the running kernel has the feature; loads its modules first if they are missing.
    /// The answer is computed once per process.
    pub fn is_available(self) -> bool {
        static CACHE: [OnceLock<bool>; KernelFeature::ALL.len()] =
            [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
        let index = KernelFeature::ALL.iter().position(|feature| *feature == self).unwrap_or(0);
        *CACHE[index].get_or_init(|| {
            self.is_present() || {
                load_modules(self.modules());
                self.is_present()
            }
        })
    }

    fn is_present(self) -> bool {
        match self {
            // Exists in every network namespace once IPVS is loaded (or built in).
            KernelFeature::Ipvs => Path::new("/proc/net/ip_vs").exists(),
            KernelFeature::Flowtable => self.modules().iter().all(|module| module_present(module)),
            KernelFeature::Sctp => {
                fs::read_to_string("/proc/net/protocols").is_ok_and(|text| protocols_include(&text, "SCTP"))
            }
            // dummy has a module parameter, so it is listed in /sys/module even when built in.
            KernelFeature::Dummy => Path::new("/sys/module/dummy").exists(),
            // A loaded module is in /sys/module; built in, the match and the counters' code are in
            // kallsyms (nfnetlink_acct lists nothing under /proc/net/netfilter, and a built-in
            // module without parameters has no /sys/module entry).
            KernelFeature::NfAcct => {
                Path::new("/sys/module/xt_nfacct").exists()
                    || fs::read_to_string("/proc/kallsyms")
                        .is_ok_and(|symbols| kallsyms_has(&symbols, &["nfacct_mt", "nfnl_acct_update"]))
            }
        }
    }
}

impl fmt::Display for KernelFeature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelFeature::Ipvs => "IPVS",
            KernelFeature::Flowtable => "nftables flowtables",
            KernelFeature::Sctp => "SCTP",
            KernelFeature::Dummy => "dummy network devices",
            KernelFeature::NfAcct => "nfacct (nfnetlink_acct, xt_nfacct)",
        })
    }
}

/// Whether this process runs inside the guest kernel started by `cargo xtask guest-test` or
/// `cargo xtask guest-run` (they set `KPROXY_GUEST=1`).
pub fn in_guest() -> bool {
    std::env::var("KPROXY_GUEST").is_ok_and(|value| value == "1")
}

/// Whether this is a CI run (`CI=true`, as GitHub Actions and most CI systems set it).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value.eq_ignore_ascii_case("true") || value == "1")
}

/// The variable that asks for skips to be recorded outside CI: `./scripts/test` sets it, so that
/// its guest phase runs exactly the kernel tests the host skipped, as CI's does.
pub const RECORD_SKIPS_VAR: &str = "KPROXY_RECORD_SKIPS";

/// Whether a skip is appended to the [`skip_ledger`]: under `CI=true`, and with
/// `KPROXY_RECORD_SKIPS=1` ([`RECORD_SKIPS_VAR`]).
pub fn records_skips() -> bool {
    in_ci() || std::env::var(RECORD_SKIPS_VAR).is_ok_and(|value| value == "1")
}

/// True when the running kernel has every feature in `features`.
///
/// Otherwise: inside the guest kernel it panics (the guest must provide them); on the host it
/// [`skip`]s visibly (recorded when [`records_skips`]), naming the command that runs it, and
/// returns false.
pub fn require(features: &[KernelFeature]) -> bool {
    let missing: Vec<String> =
        features.iter().filter(|feature| !feature.is_available()).map(ToString::to_string).collect();
    if missing.is_empty() {
        return true;
    }
    let missing = missing.join(", ");
    if in_guest() {
        panic!(
            "the guest kernel lacks {missing}; its initramfs must provide the modules \
             (xtask/src/initramfs.rs)"
        );
    }
    skip(&format!("needs {missing}; runs under `cargo xtask guest-test`"));
    false
}

/// True inside the guest kernel. Elsewhere it [`skip`]s visibly (recorded when [`records_skips`],
/// so `cargo xtask guest-test` runs the test) and returns false: for a test that changes what is
/// global to the kernel (`why`), which only the throwaway guest may change.
pub fn require_guest(why: &str) -> bool {
    if in_guest() {
        return true;
    }
    skip(&format!("{why}: runs only under `cargo xtask guest-test`"));
    false
}

/// The file where skipped kernel tests are recorded when [`records_skips`]: `KPROXY_SKIP_LEDGER`
/// when set, else `kernel-test-skips.log` in the target directory of the running test executable
/// (`target/debug/deps/<test>` → `target/`).
pub fn skip_ledger() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("KPROXY_SKIP_LEDGER") {
        return Some(path.into());
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.ancestors().nth(3)?.join(SKIP_LEDGER_FILE))
}

/// The name of the skip ledger in the target directory (`cargo xtask guest-test` reads it).
pub const SKIP_LEDGER_FILE: &str = "kernel-test-skips.log";

/// Skips the calling kernel test, visibly: fails it in the guest (which must run everything);
/// elsewhere writes `SKIPPED <test>: <reason>` to the terminal past libtest's capture and, when
/// [`records_skips`] (under `CI=true`, in `./scripts/test`), appends the same line to the
/// [`skip_ledger`].
pub fn skip(reason: &str) {
    let test = current_test_name();
    let line = format!("SKIPPED {test}: {reason}");
    if in_guest() {
        panic!("{line}: nothing may be skipped in the guest kernel");
    }
    // `eprintln!` output of a passing test is captured and thrown away; the handle is not.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
    if records_skips() {
        record_skip(&line);
    }
}

fn record_skip(line: &str) {
    let Some(path) = skip_ledger() else {
        panic!("{line}: every skip is to be recorded, but the skip ledger has no location");
    };
    let written = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(format!("{line}\n").as_bytes()));
    if let Err(error) = written {
        panic!("{line}: every skip is to be recorded, but {} is not writable: {error}", path.display());
    }
}

/// The running test's name: libtest names each test's thread after it; with one test thread
/// the tests run on `main`, and the executable's name is the best left.
fn current_test_name() -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_owned(),
        _ => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.file_name().map(|name| name.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "unknown test".to_owned()),
    }
}

/// True when running as root (kernel tests create namespaces and program netfilter).
///
/// Otherwise: in CI or in the guest it panics (kernel tests must run there); elsewhere it prints
/// that the test is skipped and returns false.
pub fn require_root() -> bool {
    if is_root() {
        return true;
    }
    if in_ci() || in_guest() {
        panic!("kernel tests must run as root in CI and in the guest kernel");
    }
    skip("kernel test needs root (run as root, or `cargo xtask guest-test`)");
    false
}

/// Whether the effective user is root.
pub fn is_root() -> bool {
    fs::read_to_string("/proc/self/status").is_ok_and(|status| effective_uid(&status) == Some(0))
}

/// Returns from the calling test unless it runs as root in a kernel with the named features.
///
/// `require_kernel!()` checks root only; `require_kernel!(Ipvs, Flowtable)` also the features.
#[macro_export]
macro_rules! require_kernel {
    () => {
        if !$crate::kernel::require_root() {
            return;
        }
    };
    ($($feature:ident),+ $(,)?) => {
        if !$crate::kernel::require_root()
            || !$crate::kernel::require(&[$($crate::kernel::KernelFeature::$feature),+])
        {
            return;
        }
    };
}

/// The effective uid from the text of `/proc/self/status`.
fn effective_uid(status: &str) -> Option<u32> {
    let line = status.lines().find(|line| line.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Whether `/proc/net/protocols` lists `protocol` (first column).
fn protocols_include(protocols: &str, protocol: &str) -> bool {
    protocols.lines().skip(1).any(|line| line.split_whitespace().next() == Some(protocol))
}

/// A module is present when loaded, or built into the kernel (`modules.builtin`, else
/// `/proc/kallsyms` for kernels shipped without a module tree).
fn module_present(module: &str) -> bool {
    if Path::new("/sys/module").join(module).exists() {
        return true;
    }
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let builtin = Path::new("/lib/modules").join(release.trim()).join("modules.builtin");
    if let Ok(list) = fs::read_to_string(builtin) {
        return builtin_includes(&list, module);
    }
    kallsyms_module_symbol(module)
}

/// Whether a `modules.builtin` listing names `module`.
fn builtin_includes(list: &str, module: &str) -> bool {
    list.lines().any(|path| {
        let file = path.rsplit('/').next().unwrap_or(path);
        file.split(".ko").next().is_some_and(|stem| stem.replace('-', "_") == module)
    })
}

/// Built-in modules leave their init symbols' neighbours in kallsyms; `<module>_init` style names
/// are not reliable, so look for the module's own name as a symbol prefix (e.g. `nf_flow_table_`).
fn kallsyms_module_symbol(module: &str) -> bool {
    let prefix = format!("{module}_");
    fs::read_to_string("/proc/kallsyms").is_ok_and(|symbols| {
        symbols.lines().any(|line| {
            let mut fields = line.split_whitespace().skip(2);
            fields.next().is_some_and(|name| name.starts_with(&prefix)) && fields.next().is_none()
        })
    })
}

/// Whether a `/proc/kallsyms` listing has every one of `names` (built-in or in a loaded module).
fn kallsyms_has(symbols: &str, names: &[&str]) -> bool {
    let mut missing: Vec<&str> = names.to_vec();
    for line in symbols.lines() {
        if let Some(name) = line.split_whitespace().nth(2) {
            missing.retain(|wanted| *wanted != name);
            if missing.is_empty() {
                return true;
            }
        }
    }
    false
}

/// `modprobe -q` each module; failures are expected on kernels without a module tree.
fn load_modules(modules: &[&str]) {
    for program in ["modprobe", "/usr/sbin/modprobe", "/sbin/modprobe"] {
        let status = Command::new(program)
            .arg("-q")
            .arg("-a")
            .args(modules)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if status.is_ok() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_uid_is_the_second_uid_field() {
        let status = "Name:\tcat\nUid:\t1000\t0\t1000\t1000\nGid:\t0\t0\t0\t0\n";
        assert_eq!(effective_uid(status), Some(0));
        assert_eq!(effective_uid("Name:\tcat\n"), None);
    }

    #[test]
    fn protocols_are_matched_by_first_column() {
        let protocols = "protocol  size sockets  memory press maxhdr  slab module     cl co di ac io in de sh ss gs se re sp bi br ha uh gp em\n\
                         SCTPv6    1272      0       0   no       0   yes  sctp        y  y  y  y  y  y  y  y  y  y  y  y  n  y  y  y  y  y  n  y\n\
                         TCP       2432      7       1   no     320   yes  kernel      y  y  y  y  y  y  y  y  y  y  y  y  y  n  y  y  y  y  y  y\n";
        assert!(protocols_include(protocols, "TCP"));
        assert!(!protocols_include(protocols, "SCTP"));
        assert!(protocols_include(protocols, "SCTPv6"));
    }

    #[test]
    fn builtin_list_matches_module_names() {
        let list = "kernel/net/netfilter/nf_flow_table.ko\nkernel/arch/x86/crypto/crc32c-intel.ko\n";
        assert!(builtin_includes(list, "nf_flow_table"));
        assert!(builtin_includes(list, "crc32c_intel"));
        assert!(!builtin_includes(list, "nf_flow_table_inet"));
    }

    #[test]
    fn kallsyms_names_are_matched_whole_in_the_third_column() {
        let symbols = "ffffffff81f85770 T nfnl_acct_update\n0000000000000000 t nfacct_mt\t[xt_nfacct]\n";
        assert!(kallsyms_has(symbols, &["nfacct_mt", "nfnl_acct_update"]));
        assert!(!kallsyms_has(symbols, &["nfacct_mt_checkentry"]));
        assert!(!kallsyms_has("ffffffff81f85770 T nfnl_acct_update_x\n", &["nfnl_acct_update"]));
    }

    #[test]
    fn every_feature_names_its_modules() {
        for feature in KernelFeature::ALL {
            assert!(!feature.modules().is_empty(), "{feature}");
        }
    }
}

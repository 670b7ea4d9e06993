//! Host packages the harness needs, installed from Debian on first use (`--no-install-recommends`).
//!
//! qemu boots the guest; busybox-static is the guest's init userland and its `modprobe`; kmod
//! builds `modules.dep` for the guest kernel and gives the guest a real `modprobe`; the netfilter
//! CLIs are what kernel tests call, and the guest runs the host's copies over 9p.

use std::process::Command;
use std::time::Duration;

use crate::error::Result;
use crate::process;

/// Debian packages the harness and the guest tests use.
pub const REQUIRED: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "kmod",
    "xz-utils",
    "iproute2",
    "nftables",
    "iptables",
    "ipvsadm",
    "ipset",
    "conntrack",
];

const APT_TIMEOUT: Duration = Duration::from_secs(600);
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// Installs whichever of [`REQUIRED`] is missing. `KPROXY_GUEST_SKIP_APT=1` turns this off.
pub fn ensure_installed() -> Result<()> {
    if std::env::var_os("KPROXY_GUEST_SKIP_APT").is_some() {
        return Ok(());
    }
    let missing: Vec<&str> = REQUIRED.iter().copied().filter(|name| !is_installed(name)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    tracing::info!("installing Debian packages: {}", missing.join(" "));
    process::run(apt_get().args(["update", "-qq"]), APT_TIMEOUT)?;
    process::run(
        apt_get()
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .stdout(std::process::Stdio::null()),
        APT_TIMEOUT,
    )
}

/// `apt-get` with network and lock timeouts, non-interactive, and no sandbox-user warning.
pub fn apt_get() -> Command {
    let mut command = Command::new("apt-get");
    command
        .env("DEBIAN_FRONTEND", "noninteractive")
        .args(["-o", "Acquire::http::Timeout=60", "-o", "Acquire::Retries=2"])
        .args(["-o", "DPkg::Lock::Timeout=120", "-o", "APT::Sandbox::User=root"]);
    command
}

fn is_installed(package: &str) -> bool {
    let output = process::output(
        Command::new("dpkg-query").args(["-W", "-f=${Status}", package]).stderr(std::process::Stdio::null()),
        QUERY_TIMEOUT,
    );
    matches!(output, Ok(bytes) if String::from_utf8_lossy(&bytes).contains("install ok installed"))
}

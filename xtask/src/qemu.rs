//! Booting the guest under qemu and collecting the guest command's exit status.
//!
//! The guest's serial ports: ttyS0 carries the kernel console and init's status lines into a log
//! file; ttyS1 carries the command's stdout and stderr straight to this process's stdout. The
//! host's root filesystem is shared read-only (virtio-9p, tag `hostroot`), the run directory
//! read-write (tag `kproxyrun`), and any directory a command asks for read-write (`rwN`).
//!
//! Acceleration: KVM only where a probe boot proves it works. On the development machines
//! `/dev/kvm` is Ant Group's PVM backend (`kvm_pvm`), which cannot run a stock kernel, so TCG is
//! used there; the probe result is cached per host boot.

use std::fs;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::process;

/// Marker lines init.sh prints on the console.
const BOOTED: &str = "KPROXY-GUEST-BOOTED";
const READY: &str = "KPROXY-GUEST-READY";
const SETUP_FAILED: &str = "KPROXY-GUEST-SETUP-FAILED";
const EXIT: &str = "KPROXY-GUEST-EXIT=";

const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// How the guest is run; every field has an environment override (see [`Machine::from_env`]).
#[derive(Debug, Clone)]
pub struct Machine {
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    pub memory_mib: u32,
    pub cpus: u32,
    /// Time allowed from qemu's start until the guest is ready to run the command.
    pub boot_timeout: Duration,
}

impl Machine {
    /// `KPROXY_GUEST_MEM` (MiB, default 2048), `KPROXY_GUEST_CPUS` (default: host CPUs, at most 4),
    /// `KPROXY_GUEST_BOOT_TIMEOUT` (seconds, default 180).
    pub fn from_env(kernel: PathBuf, initramfs: PathBuf) -> Machine {
        let host_cpus = thread::available_parallelism().map_or(2, |n| u32::try_from(n.get()).unwrap_or(2));
        Machine {
            kernel,
            initramfs,
            memory_mib: env_number("KPROXY_GUEST_MEM").unwrap_or(2048),
            cpus: env_number("KPROXY_GUEST_CPUS").unwrap_or(host_cpus.min(4)),
            boot_timeout: Duration::from_secs(env_number("KPROXY_GUEST_BOOT_TIMEOUT").unwrap_or(180).into()),
        }
    }
}

/// A qemu accelerator choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    fn args(self) -> &'static [&'static str] {
        match self {
            // IA32_ARCH_CAPABILITIES cannot be set on some hosts ("failed to set MSR 0x10a").
            Accel::Kvm => &["-accel", "kvm", "-cpu", "host,-arch-capabilities"],
            Accel::Tcg => &["-accel", "tcg,thread=multi", "-cpu", "max"],
        }
    }
}

/// `KPROXY_GUEST_ACCEL=kvm|tcg` forces a choice; otherwise KVM is used only if a probe boot works.
pub fn choose_accel(machine: &Machine, cache_dir: &Path) -> Accel {
    match std::env::var("KPROXY_GUEST_ACCEL").as_deref() {
        Ok("kvm") => return Accel::Kvm,
        Ok("tcg") => return Accel::Tcg,
        _ => {}
    }
    if !kvm_device_usable() || Path::new("/sys/module/kvm_pvm").exists() {
        return Accel::Tcg;
    }
    let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let cache = cache_dir.join("kvm-probe");
    if let Ok(cached) = fs::read_to_string(&cache) {
        if let Some(answer) = cached.strip_prefix(boot_id.trim()) {
            return if answer.trim() == "kvm" { Accel::Kvm } else { Accel::Tcg };
        }
    }
    let accel = if probe_kvm(machine, cache_dir) { Accel::Kvm } else { Accel::Tcg };
    let answer = if accel == Accel::Kvm { "kvm" } else { "tcg" };
    let _ = fs::write(&cache, format!("{} {answer}\n", boot_id.trim()));
    accel
}

fn kvm_device_usable() -> bool {
    fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok()
}

/// Boots with `kproxy.probe` (init powers off right after printing its first line).
fn probe_kvm(machine: &Machine, cache_dir: &Path) -> bool {
    let console = cache_dir.join("kvm-probe.log");
    let _ = fs::remove_file(&console);
    let mut command = base_command(machine, Accel::Kvm, &console, "kproxy.probe");
    command.args(["-serial", "null"]).stdout(Stdio::null()).stderr(Stdio::null());
    let ok = process::run(&mut command, KVM_PROBE_TIMEOUT).is_ok()
        && fs::read_to_string(&console).is_ok_and(|text| text.contains(BOOTED));
    tracing::info!("KVM probe: {}", if ok { "works, using KVM" } else { "does not boot, using TCG" });
    ok
}

fn base_command(machine: &Machine, accel: Accel, console: &Path, extra_cmdline: &str) -> Command {
    let mut command = Command::new("qemu-system-x86_64");
    command
        .args(["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"])
        .args(["-m", &machine.memory_mib.to_string(), "-smp", &machine.cpus.to_string()])
        .args(accel.args())
        .arg("-kernel")
        .arg(&machine.kernel)
        .arg("-initrd")
        .arg(&machine.initramfs)
        .arg("-append")
        .arg(format!("console=ttyS0 panic=-1 quiet loglevel=4 random.trust_cpu=on {extra_cmdline}"))
        .args(["-device", "virtio-rng-pci"])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .stdin(Stdio::null());
    command
}

/// Boots the guest, which runs `<run_dir>/run.sh`; streams its output; returns its exit status.
/// Kills the guest when it is not ready within the boot timeout or not done within `timeout`.
/// `rw_shares` are exported read-write under [`rw_share_tag`] of their index.
pub fn run(machine: &Machine, accel: Accel, run_dir: &Path, rw_shares: &[PathBuf], timeout: Duration) -> Result<i32> {
    let console = run_dir.join("console.log");
    let tty = if std::io::stdout().is_terminal() { "" } else { "kproxy.notty" };
    let mut command = base_command(machine, accel, &console, tty);
    command
        .args(["-chardev", "stdio,id=output,signal=off", "-serial", "chardev:output"])
        .arg("-virtfs")
        .arg("local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap")
        .arg("-virtfs")
        .arg(format!("local,path={},mount_tag=kproxyrun,security_model=none", run_dir.display()));
    for (index, dir) in rw_shares.iter().enumerate() {
        command.arg("-virtfs").arg(format!(
            "local,path={},mount_tag={},security_model=none,multidevs=remap",
            dir.display(),
            rw_share_tag(index)
        ));
    }
    let name = process::describe(&command);
    let started = Instant::now();
    let mut child = process::spawn(&mut command)?;
    let mut ready = false;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|source| Error::Spawn { command: name.clone(), source })? {
            break status;
        }
        if !ready {
            let text = fs::read_to_string(&console).unwrap_or_default();
            ready = text.contains(READY);
            if text.contains(SETUP_FAILED) {
                process::kill(&mut child);
                return Err(Error::Guest(format!("setup failed; console:\n{}", tail(&text))));
            }
            if !ready && started.elapsed() > machine.boot_timeout {
                process::kill(&mut child);
                return Err(Error::Guest(format!(
                    "was not ready within {} s; console:\n{}",
                    machine.boot_timeout.as_secs(),
                    tail(&text)
                )));
            }
        }
        if started.elapsed() > timeout {
            process::kill(&mut child);
            return Err(Error::Timeout { command: "the guest command".into(), secs: timeout.as_secs() });
        }
        thread::sleep(Duration::from_millis(50));
    };
    let text = fs::read_to_string(&console).map_err(Error::io("read", &console))?;
    tracing::debug!("qemu exited with {status} after {:.1} s", started.elapsed().as_secs_f64());
    exit_status(&text).ok_or_else(|| {
        Error::Guest(format!("stopped without reporting an exit status (qemu: {status}); console:\n{}", tail(&text)))
    })
}

/// The 9p mount tag of the read-write share at `index`.
pub fn rw_share_tag(index: usize) -> String {
    format!("rw{index}")
}

/// The status init.sh reported, if it did.
fn exit_status(console: &str) -> Option<i32> {
    console.lines().rev().find_map(|line| line.trim().strip_prefix(EXIT)?.split_whitespace().next()?.parse().ok())
}

/// The last lines of a console log, for error messages.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn env_number(name: &str) -> Option<u32> {
    std::env::var(name).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_is_read_from_the_last_marker() {
        let console = "KPROXY-GUEST-BOOTED uptime=1.0\n[ 3.1] some kernel line\r\nKPROXY-GUEST-EXIT=3 uptime=9.5\r\n";
        assert_eq!(exit_status(console), Some(3));
        assert_eq!(exit_status("KPROXY-GUEST-BOOTED\n"), None);
    }
}

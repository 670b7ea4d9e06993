//! `guest-run`: one command, run as root in the guest kernel, in the current directory, with the
//! host's environment and filesystem.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::qemu::{self, Machine};
use crate::shell;
use crate::{initramfs, kernel_image, packages};

/// Where the run directory is mounted inside the guest.
pub const GUEST_RUN_DIR: &str = "/run/kproxy";

/// What a command needs from the guest beyond the defaults (the host's files read-only, a
/// throwaway overlay on top): what the real-cluster harness needs to run a node there.
#[derive(Debug, Clone, Default)]
pub struct Setup {
    /// Host directories the guest mounts read-write at the same path (9p): results that must
    /// outlive the guest.
    pub rw_shares: Vec<PathBuf>,
    /// Paths that get a fresh tmpfs: containerd's overlay snapshots cannot sit on the guest's
    /// overlay root (an overlayfs is refused as an upper directory) nor on 9p.
    pub tmpfs: Vec<PathBuf>,
    /// Mount the cgroup v1 hierarchies this host has (cpu, cpuacct, cpuset, memory, devices,
    /// freezer, blkio, pids, name=systemd; cgroup2 at `unified`), so the kubelet's cgroupfs driver
    /// and the harness's cgroup ledger work as on the host.
    pub cgroups_v1: bool,
    /// Guest memory (MiB) when `KPROXY_GUEST_MEM` does not say.
    pub memory_mib: Option<u32>,
    /// A soft lockup panics the guest, every CPU's backtrace on the console, so the run ends
    /// with the reason rather than hanging (seen under TCG: both vCPUs stuck in `runc` while a
    /// pod started, nothing progressing for the 24 h guard). The watchdog's threshold is raised
    /// to [`LOCKUP_THRESHOLD_S`] (a lockup is reported at twice it): under TCG a CPU can be held
    /// in the kernel for tens of seconds and recover (2026-12-07: an e2e run panicked 20 s into
    /// a kubelet thread's signal delivery), which must not end a run.
    pub panic_on_soft_lockup: bool,
}

/// `kernel.watchdog_thresh` in a guest that panics on a soft lockup: one is reported after
/// 2 × 60 s = 2 minutes stuck (the kernel's default is 2 × 10 s).
pub const LOCKUP_THRESHOLD_S: u32 = 60;

/// The cgroup v1 controllers [`Setup::cgroups_v1`] mounts, one hierarchy each.
const CGROUP_V1_CONTROLLERS: [&str; 8] = ["cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids"];

/// Everything needed to boot: packages present, kernel and initramfs cached, accelerator chosen.
#[derive(Debug)]
pub struct Guest {
    layout: Layout,
    machine: Machine,
    accel: qemu::Accel,
    release: String,
}

impl Guest {
    /// Installs missing packages, fetches the kernel and builds the initramfs when not cached.
    pub fn prepare(layout: &Layout) -> Result<Guest> {
        packages::ensure_installed()?;
        let kernel = kernel_image::ensure(layout)?;
        let initramfs = initramfs::ensure(&kernel)?;
        let machine = Machine::from_env(kernel.boot_image(), initramfs);
        let accel = qemu::choose_accel(&machine, &kernel.cache);
        tracing::debug!("guest kernel {}={} ({accel:?})", kernel.package, kernel.version);
        Ok(Guest { layout: layout.clone(), machine, accel, release: kernel.release })
    }

    /// The guest kernel release (`uname -r` inside).
    pub fn release(&self) -> &str {
        &self.release
    }

    /// Runs `command` in the guest and returns its exit status. `files` are written into the run
    /// directory first (visible in the guest under [`GUEST_RUN_DIR`]).
    pub fn run(&self, command: &[OsString], files: &[(&str, Vec<u8>)], timeout: Duration) -> Result<i32> {
        self.run_with(command, files, timeout, &Setup::default())
    }

    /// [`Guest::run`] with what `setup` asks for mounted before the command starts.
    pub fn run_with(
        &self,
        command: &[OsString],
        files: &[(&str, Vec<u8>)],
        timeout: Duration,
        setup: &Setup,
    ) -> Result<i32> {
        let run_dir = self.new_run_dir()?;
        let result = self.run_in(&run_dir, command, files, timeout, setup);
        self.keep_console(&run_dir);
        let _ = fs::remove_dir_all(&run_dir);
        result
    }

    fn run_in(
        &self,
        run_dir: &Path,
        command: &[OsString],
        files: &[(&str, Vec<u8>)],
        timeout: Duration,
        setup: &Setup,
    ) -> Result<i32> {
        for (name, contents) in files {
            let path = run_dir.join(name);
            fs::write(&path, contents).map_err(Error::io("write", &path))?;
        }
        let cwd = std::env::current_dir().map_err(Error::io("read the current directory", "."))?;
        let script = run_script(&cwd, std::env::vars_os(), setup, command);
        let path = run_dir.join("run.sh");
        fs::write(&path, script).map_err(Error::io("write", &path))?;
        let mut machine = self.machine.clone();
        if let (Some(memory_mib), None) = (setup.memory_mib, std::env::var_os("KPROXY_GUEST_MEM")) {
            machine.memory_mib = memory_mib;
        }
        tracing::debug!("booting {} ({:?}, {} MiB)", self.release, self.accel, machine.memory_mib);
        qemu::run(&machine, self.accel, run_dir, &setup.rw_shares, timeout)
    }

    fn new_run_dir(&self) -> Result<PathBuf> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos());
        let dir = self.layout.runs().join(format!("{}-{nanos}", std::process::id()));
        fs::create_dir_all(&dir).map_err(Error::io("create", &dir))?;
        Ok(dir)
    }

    /// Keeps the last console log at `target/guest-kernel/console.log` for post-mortems.
    fn keep_console(&self, run_dir: &Path) {
        let last = self.layout.runs().with_file_name("console.log");
        let _ = fs::copy(run_dir.join("console.log"), last);
    }
}

/// The script the guest runs: the mounts `setup` asks for, cd to the host's cwd, export the
/// host's environment plus `KPROXY_GUEST=1`, exec the command. A mount that fails ends it with 125.
fn run_script(
    cwd: &Path,
    env: impl Iterator<Item = (OsString, OsString)>,
    setup: &Setup,
    command: &[OsString],
) -> Vec<u8> {
    let mut script = b"# generated by `cargo xtask`\n".to_vec();
    let mut mount = |dir: &Path, how: &str| {
        let dir = shell::quote(dir);
        script.extend_from_slice(b"mkdir -p ");
        script.extend(dir.iter().copied());
        script.extend_from_slice(format!(" && mount {how} ").as_bytes());
        script.extend(dir);
        script.extend_from_slice(b" || exit 125\n");
    };
    for (index, dir) in setup.rw_shares.iter().enumerate() {
        mount(dir, &format!("-t 9p -o trans=virtio,version=9p2000.L,msize=262144 {}", qemu::rw_share_tag(index)));
    }
    for dir in &setup.tmpfs {
        mount(dir, "-t tmpfs -o mode=0755 tmpfs");
    }
    if setup.cgroups_v1 {
        let root = Path::new("/sys/fs/cgroup");
        mount(root, "-t tmpfs -o mode=0755 cgroup");
        for controller in CGROUP_V1_CONTROLLERS {
            mount(&root.join(controller), &format!("-t cgroup -o {controller} cgroup"));
        }
        mount(&root.join("systemd"), "-t cgroup -o none,name=systemd cgroup");
        mount(&root.join("unified"), "-t cgroup2 cgroup2");
    }
    if setup.panic_on_soft_lockup {
        script.extend_from_slice(
            format!(
                "echo {LOCKUP_THRESHOLD_S} > /proc/sys/kernel/watchdog_thresh && echo 1 > /proc/sys/kernel/softlockup_all_cpu_backtrace && echo 1 > /proc/sys/kernel/softlockup_panic || exit 125\n"
            )
            .as_bytes(),
        );
    }
    script.extend_from_slice(b"cd -- ");
    script.extend(shell::quote(cwd));
    script.extend_from_slice(b" || exit 126\n");
    for (name, value) in env {
        if shell::is_variable_name(&name) && name != "KPROXY_GUEST" && !set_by_cargo_run(&name) {
            script.extend_from_slice(b"export ");
            script.extend(shell::quote(&name));
            script.push(b'=');
            script.extend(shell::quote(&value));
            script.push(b'\n');
        }
    }
    script.extend_from_slice(b"export KPROXY_GUEST=1\nexec");
    for word in command {
        script.push(b' ');
        script.extend(shell::quote(word));
    }
    script.push(b'\n');
    script
}

/// Variables `cargo run` sets for xtask itself; they describe xtask, not the guest command.
fn set_by_cargo_run(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || ["CARGO_CRATE_NAME", "CARGO_BIN_NAME", "CARGO_PRIMARY_PACKAGE"].contains(&name.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_script_changes_directory_exports_and_execs() {
        let env = vec![
            (OsString::from("CI"), OsString::from("true")),
            (OsString::from("BAD-NAME"), OsString::from("x")),
            (OsString::from("KPROXY_GUEST"), OsString::from("0")),
            (OsString::from("CARGO_PKG_NAME"), OsString::from("xtask")),
        ];
        let command = [OsString::from("sh"), OsString::from("-c"), OsString::from("echo 'hi'")];
        let script =
            String::from_utf8(run_script(Path::new("/work/a b"), env.into_iter(), &Setup::default(), &command))
                .unwrap();
        assert!(script.contains("cd -- '/work/a b' || exit 126\n"), "{script}");
        assert!(script.contains("export 'CI'='true'\n"), "{script}");
        assert!(!script.contains("BAD-NAME"), "{script}");
        assert!(!script.contains("CARGO_PKG_NAME"), "{script}");
        assert!(!script.contains("'KPROXY_GUEST'='0'"), "{script}");
        assert!(script.ends_with("export KPROXY_GUEST=1\nexec 'sh' '-c' 'echo '\\''hi'\\'''\n"), "{script}");
    }

    #[test]
    fn run_script_mounts_what_the_setup_asks_for_before_the_command() {
        let setup = Setup {
            rw_shares: vec![PathBuf::from("/work/target/kproxy-e2e")],
            tmpfs: vec![PathBuf::from("/work/target/kproxy-cluster-g")],
            cgroups_v1: true,
            memory_mib: None,
            panic_on_soft_lockup: true,
        };
        let command = [OsString::from("true")];
        let script = String::from_utf8(run_script(Path::new("/"), std::iter::empty(), &setup, &command)).unwrap();
        let share = "mkdir -p '/work/target/kproxy-e2e' && mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 rw0 '/work/target/kproxy-e2e' || exit 125\n";
        let tmpfs = "mkdir -p '/work/target/kproxy-cluster-g' && mount -t tmpfs -o mode=0755 tmpfs '/work/target/kproxy-cluster-g' || exit 125\n";
        let memory = "mkdir -p '/sys/fs/cgroup/memory' && mount -t cgroup -o memory cgroup '/sys/fs/cgroup/memory' || exit 125\n";
        let unified = "mount -t cgroup2 cgroup2 '/sys/fs/cgroup/unified' || exit 125\n";
        let lockup = "echo 60 > /proc/sys/kernel/watchdog_thresh && echo 1 > /proc/sys/kernel/softlockup_all_cpu_backtrace && echo 1 > /proc/sys/kernel/softlockup_panic || exit 125\n";
        for line in [share, tmpfs, memory, unified, lockup] {
            assert!(script.contains(line), "{line} missing from:\n{script}");
        }
        let exec = script.find("\nexec").unwrap();
        assert!(script.find(unified).unwrap() < exec, "{script}");
        assert!(script.find("'/sys/fs/cgroup' ||").unwrap() < script.find(memory).unwrap(), "{script}");
    }
}

//! A supervised child: its own process group, stdout and stderr appended to a log file, killed
//! with its whole group on [`Process::stop`] or drop (also during a panic's unwind), and
//! optionally killed by the kernel when the thread that started it dies (`PR_SET_PDEATHSIG`),
//! so a test killed outright leaves no server behind.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};
use nix::sys::prctl::set_pdeathsig;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::{Error, Result};

/// How a child is started: where, and tied to what.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// Run in this network namespace (a path such as `/run/netns/NAME`).
    pub netns: Option<PathBuf>,
    /// Have the kernel kill the child when the thread that spawned it exits (`PR_SET_PDEATHSIG`).
    pub die_with_parent: bool,
}

/// A running child process and its log.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Process {
    /// Starts `program args` as `name`, appending its output to `log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], log: &Path, launch: &Launch) -> Result<Process> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
        let err = out.try_clone().map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
        let mut command = Command::new(program);
        command.args(args).stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        // The namespace and the death signal are set in the child itself, not by `nsenter` or
        // `setpriv` in front of the program: the program is then exec'd by this spawn, so an exec
        // failure (ETXTBSY below) comes back here as an error that can be retried.
        let netns = match &launch.netns {
            Some(path) => Some(File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?),
            None => None,
        };
        let die_with_parent = launch.die_with_parent;
        // SAFETY: the closure runs between fork and exec and makes only async-signal-safe
        // syscalls (setns, prctl) on a descriptor opened before the fork; it allocates nothing.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || {
                if let Some(netns) = &netns {
                    setns(netns, CloneFlags::CLONE_NEWNET)?;
                }
                if die_with_parent {
                    set_pdeathsig(Signal::SIGKILL)?;
                }
                Ok(())
            });
        }
        // A binary just unpacked may still be open for writing in a child another thread is
        // forking (ETXTBSY): that passes within moments.
        let deadline = Instant::now() + Duration::from_secs(5);
        let child = loop {
            match command.spawn() {
                Ok(child) => break child,
                Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(Error::io(format!("starting {name} ({})", program.display()), e)),
            }
        };
        tracing::debug!(name, pid = child.id(), log = %log.display(), "started");
        Ok(Process { name: name.to_owned(), child: Some(child), log: log.to_path_buf() })
    }

    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The child's pid (also its process group), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Some(status text)` once the child has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.as_mut().map(Child::try_wait) {
            None => Some("stopped".into()),
            Some(Ok(Some(status))) => Some(status.to_string()),
            Some(Ok(None)) => None,
            Some(Err(e)) => Some(format!("unknown ({e})")),
        }
    }

    /// The last `bytes` of the log, for error messages.
    pub fn log_tail(&self, bytes: u64) -> String {
        log_tail(&self.log, bytes)
    }

    /// SIGTERM to the whole group, SIGKILL after `grace`; waits for the child.
    ///
    /// The group is signalled only while the child is not yet reaped: until `wait`, even as a
    /// zombie, it holds its pid and so the group id, which no other process can then take.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else { return };
        if matches!(child.try_wait(), Ok(Some(_))) {
            // Exited and reaped already ([`Process::exited`]): its group id may be anyone's now.
            return;
        }
        let pid = child.id();
        let group = Pid::from_raw(pid as i32);
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while !has_exited(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Whatever is left of the group (the child itself, or anything it forked).
        let _ = killpg(group, Signal::SIGKILL);
        let _ = child.wait();
        tracing::debug!(name = %self.name, "stopped");
    }
}

/// Whether our unreaped child `pid` has exited (a zombie), without reaping it.
fn has_exited(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold spaces.
        Ok(stat) => stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next()) == Some("Z"),
        Err(_) => true,
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// The last `bytes` of a file, lossily decoded.
pub fn log_tail(path: &Path, bytes: u64) -> String {
    let Ok(mut file) = File::open(path) else { return String::new() };
    let len = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(bytes)));
    let mut buf = Vec::new();
    let _ = file.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests: a panic is a failure
mod tests {
    use super::*;

    /// `/proc/self/ns/net` is the test's own namespace: entering it changes nothing on the host.
    fn own_netns() -> Launch {
        Launch { netns: Some(PathBuf::from("/proc/self/ns/net")), die_with_parent: true }
    }

    fn wait_exit(process: &mut Process) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = process.exited() {
                return status;
            }
            assert!(Instant::now() < deadline, "{} did not exit", process.name());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_program_still_open_for_writing_starts_once_the_writer_closes_it_inside_a_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("prog");
        let log = dir.path().join("prog.log");
        let writer = File::create(&program).unwrap();
        fs::write(&program, "#!/bin/sh\necho started\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&program, fs::Permissions::from_mode(0o755)).unwrap();
        // The exec is refused (ETXTBSY) while `writer` is open; it is closed a moment later.
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(writer);
        });
        let started = Instant::now();
        let mut process = Process::spawn("prog", &program, &[], &log, &own_netns()).unwrap();
        closer.join().unwrap();
        assert!(started.elapsed() >= Duration::from_millis(250), "exec'd while the file was open for writing");
        assert_eq!(wait_exit(&mut process), "exit status: 0");
        assert_eq!(fs::read_to_string(&log).unwrap(), "started\n");
    }

    #[test]
    fn a_missing_program_is_an_error_at_spawn_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-program");
        let err = Process::spawn("missing", &missing, &[], &dir.path().join("log"), &own_netns()).unwrap_err();
        assert!(err.to_string().contains("no-such-program"), "{err}");
    }
}

//! A supervised child: its own process group, stdout and stderr appended to a log file, killed
//! with its whole group on [`Process::stop`] or drop (also during a panic's unwind), and
//! optionally killed by the kernel when the thread that started it dies (`setpriv --pdeathsig`),
//! so a test killed outright leaves no server behind.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::{Error, Result};

/// How a child is started: where, and tied to what.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// Enter this network namespace first (`nsenter --net=PATH`).
    pub netns: Option<PathBuf>,
    /// Have the kernel kill the child when the thread that spawned it exits (`setpriv --pdeathsig KILL`).
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
        let mut argv: Vec<String> = Vec::new();
        if launch.die_with_parent {
            argv.extend(["setpriv".into(), "--pdeathsig".into(), "KILL".into(), "--".into()]);
        }
        if let Some(netns) = &launch.netns {
            argv.extend(["nsenter".into(), format!("--net={}", netns.display()), "--".into()]);
        }
        argv.push(program.display().to_string());
        argv.extend(args.iter().cloned());
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
        let err = out.try_clone().map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]).stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
        // A binary just unpacked may still be open for writing in a child another thread is
        // forking (ETXTBSY): that passes within moments.
        let deadline = Instant::now() + Duration::from_secs(5);
        let child = loop {
            match command.spawn() {
                Ok(child) => break child,
                Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(Error::io(format!("starting {name} ({})", argv.join(" ")), e)),
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

//! Running host commands with a deadline: the harness must never hang, whatever a tool does.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How often a running child is polled for exit.
const POLL: Duration = Duration::from_millis(50);

/// A short human-readable rendering of a command line for messages.
pub fn describe(command: &Command) -> String {
    let mut text = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    if text.len() > 200 {
        text.truncate(200);
        text.push_str(" …");
    }
    text
}

/// Spawns `command`, naming it in the error when it cannot start.
pub fn spawn(command: &mut Command) -> Result<Child> {
    command.spawn().map_err(|source| Error::Spawn { command: describe(command), source })
}

/// Waits for `child` until `timeout`; kills it (and reports a timeout) when the deadline passes.
pub fn wait_with_deadline(child: &mut Child, timeout: Duration, command: &str) -> Result<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() >= deadline => {
                kill(child);
                return Err(Error::Timeout { command: command.to_owned(), secs: timeout.as_secs() });
            }
            Ok(None) => thread::sleep(POLL),
            Err(source) => return Err(Error::Spawn { command: command.to_owned(), source }),
        }
    }
}

/// Kills and reaps a child; errors are ignored because the child may already be gone.
pub fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `command` with inherited stdio; fails on a non-zero status or after `timeout`.
pub fn run(command: &mut Command, timeout: Duration) -> Result<()> {
    let name = describe(command);
    let mut child = spawn(command.stdin(Stdio::null()))?;
    let status = wait_with_deadline(&mut child, timeout, &name)?;
    check(status, name)
}

/// Runs `command` and returns its stdout (stderr is inherited); fails like [`run`].
pub fn output(command: &mut Command, timeout: Duration) -> Result<Vec<u8>> {
    let name = describe(command);
    let mut child = spawn(command.stdin(Stdio::null()).stdout(Stdio::piped()))?;
    let reader = child.stdout.take().map(|mut stdout| {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = stdout.read_to_end(&mut bytes);
            bytes
        })
    });
    let status = wait_with_deadline(&mut child, timeout, &name)?;
    let bytes = reader.and_then(|handle| handle.join().ok()).unwrap_or_default();
    check(status, name)?;
    Ok(bytes)
}

fn check(status: ExitStatus, command: String) -> Result<()> {
    if status.success() { Ok(()) } else { Err(Error::Failed { command, status: status.to_string() }) }
}

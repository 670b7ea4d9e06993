//! Running helper binaries (`ip`, `nft`, `conntrack`) with their failures turned into errors
//! that carry the command line and stderr, so a broken topology step is easy to diagnose.

use std::ffi::OsStr;
use std::io::Write;
use std::process::{Command, Output, Stdio};

use crate::error::{Result, TestbedError};

/// Renders a command line for error messages.
pub(crate) fn describe(program: &str, args: &[&OsStr]) -> String {
    let mut line = program.to_owned();
    for arg in args {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Runs `program args…`, feeding `stdin` if given, and returns its output whatever the exit
/// status.
pub(crate) fn output<S: AsRef<OsStr>>(program: &str, args: &[S], stdin: Option<&str>) -> Result<Output> {
    let arg_refs: Vec<&OsStr> = args.iter().map(AsRef::as_ref).collect();
    let command = describe(program, &arg_refs);
    let mut cmd = Command::new(program);
    cmd.args(&arg_refs).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let mut child = cmd.spawn().map_err(|source| TestbedError::Spawn { command: command.clone(), source })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).map_err(|e| TestbedError::io(format!("writing stdin of `{command}`"), e))?;
    }
    child.wait_with_output().map_err(|source| TestbedError::Spawn { command, source })
}

/// Like [`output`] but fails unless the command exits successfully; returns stdout.
pub(crate) fn checked<S: AsRef<OsStr>>(program: &str, args: &[S], stdin: Option<&str>) -> Result<String> {
    let out = output(program, args, stdin)?;
    ensure_success(program, args, &out)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Turns an unsuccessful [`Output`] into [`TestbedError::Command`].
pub(crate) fn ensure_success<S: AsRef<OsStr>>(program: &str, args: &[S], out: &Output) -> Result<()> {
    if out.status.success() {
        return Ok(());
    }
    let arg_refs: Vec<&OsStr> = args.iter().map(AsRef::as_ref).collect();
    Err(TestbedError::Command {
        command: describe(program, &arg_refs),
        status: out.status.to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    })
}

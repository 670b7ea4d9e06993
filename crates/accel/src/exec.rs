//! How the fast path's batches reach the kernel: `nft -f -` today, behind a small trait so the
//! netlink executor can replace it. The nftables dataplane's `Transaction` model has no `inet`
//! tables or flowtables, hence this separate, text-based one.

use std::io::Write as _;
use std::process::{Command, Stdio};

use crate::error::AccelError;

/// Runs nft batches and listings in the network namespace of the calling thread.
pub trait NftRunner: Send {
    /// Applies `script` (nft -f syntax) as one atomic batch.
    fn apply(&mut self, script: &str) -> Result<(), AccelError>;
    /// `nft -j list <what>`: the JSON listing (`what` e.g. `["chain", "inet", "t", "c"]`).
    fn list_json(&mut self, what: &[&str]) -> Result<String, AccelError>;
}

/// The `nft` binary.
#[derive(Debug, Clone)]
pub struct NftBinary {
    program: String,
}

impl Default for NftBinary {
    fn default() -> Self {
        NftBinary { program: "nft".to_owned() }
    }
}

impl NftRunner for NftBinary {
    fn apply(&mut self, script: &str) -> Result<(), AccelError> {
        if script.is_empty() {
            return Ok(());
        }
        let spawn = |source| AccelError::Spawn { program: self.program.clone(), source };
        let mut child = Command::new(&self.program)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn)?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes()).map_err(spawn)?;
        }
        let output = child.wait_with_output().map_err(spawn)?;
        if output.status.success() {
            return Ok(());
        }
        Err(AccelError::Rejected {
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            script: script.to_owned(),
        })
    }

    fn list_json(&mut self, what: &[&str]) -> Result<String, AccelError> {
        let output = Command::new(&self.program)
            .arg("-j")
            .arg("list")
            .args(what)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| AccelError::Spawn { program: self.program.clone(), source })?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(AccelError::Rejected {
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
                script: format!("list {}", what.join(" ")),
            })
        }
    }
}

/// Records batches instead of applying them (unit tests, dry runs).
#[derive(Debug, Clone, Default)]
pub struct RecordingRunner {
    /// Every batch applied, in order.
    pub applied: Vec<String>,
    /// Fail the next `apply` (then reset).
    pub fail_next: bool,
    /// What `list_json` answers.
    pub listing: String,
}

impl NftRunner for RecordingRunner {
    fn apply(&mut self, script: &str) -> Result<(), AccelError> {
        if std::mem::take(&mut self.fail_next) {
            return Err(AccelError::Rejected { stderr: "injected failure".into(), script: script.to_owned() });
        }
        if !script.is_empty() {
            self.applied.push(script.to_owned());
        }
        Ok(())
    }

    fn list_json(&mut self, _what: &[&str]) -> Result<String, AccelError> {
        Ok(self.listing.clone())
    }
}
